"""Text: a prompt's generated text, every token coloured by what produced it; click a token to open its
round in the Step view."""

from __future__ import annotations

import streamlit as st

from mtpscope.app import charts, links, loaders, round_views, url_state, views
from mtpscope.app import selection as sel
from mtpscope.app.guard import guard
from mtpscope.traces.analysis import wording

st.title("Generated text")
path = sel.selected_or_stop(sel.TRACE, "Choose a trace on the Files page (the demo trace is preselected once built).")
view = url_state.requested("text")
#: The "colour by" choices and their link values.
COLOURS = {"status": "what produced it", "class": "token class"}

#: Characters per line of the text view, and the most tokens drawn at once.
WIDTH, MAX_TOKENS = 100, 3000

with guard("trace store"):
    tr = loaders.trace(path)
    rounds = tr.rounds
    if len(rounds) == 0:
        st.info("This trace has no rounds, so no generated text.")
        st.stop()
    dec = loaders.trace_decoder(tr)
    prompts = views.manifest_prompts(tr.manifest)
    pids = [int(p) for p in sorted(rounds["prompt_id"].unique())]
    labels = views.prompt_labels(pids, prompts, width=80)
    url_state.take_prompt_round(view, round_views.prompt_round_spans(rounds), sel.page_prompt(pids, allow_all=False))
    if view is not None and view.colour is not None:
        st.session_state[sel.TEXT_COLOUR] = COLOURS[view.colour]
    c1, c2 = st.columns([3, 1])
    pid = int(sel.prompt_picker(c1, sel.TEXT_PROMPT, pids, labels))
    cur = sel.selected_round()
    colour = c2.radio("colour by", list(COLOURS.values()), horizontal=True, key=sel.TEXT_COLOUR)
    url_state.publish(links.View("text", trace=path, prompt=pid, round=cur[1] if cur and cur[0] == pid else None,
                                 colour=next(k for k, v in COLOURS.items() if v == colour)))
    text = views.prompt_texts(prompts).get(pid)
    if text:  # as written: its line breaks and indentation kept (markdown would join its lines)
        st.markdown("**Prompt:**")
        st.code(text, language=None, wrap_lines=True)
    pos = loaders.positions(path)
    classes = None
    if colour == "token class":
        with guard("token classes"):
            tc = loaders.token_classes(path)
            classes = tc.get(pid) if tc else None
            if tc is None:
                st.caption("No vocabulary available for this trace: token classes are unknown.")
    n_gen = len(pos.sequences.get(pid, ()))
    start = 0
    if n_gen > MAX_TOKENS:
        start = st.slider("first token shown (output position)", 0, n_gen - 1, 0, step=MAX_TOKENS // 2,
                          key=sel.text_start_key(pid))
    layout = round_views.generated_text(pos, pid, dec.text, classes=classes, width=WIDTH, max_tokens=MAX_TOKENS, start=start)
    fig = charts.text_figure(layout, colour_by="status" if colour == "what produced it" else "class", width=WIDTH,
                             highlight_round=cur[1] if cur and cur[0] == pid else None)
    event = st.plotly_chart(fig, key=sel.TEXT_VIEW, on_select="rerun", selection_mode="points", width="stretch")
    if len(layout):
        counts = layout["status"].value_counts()
        shown = (f" ({len(layout):,} shown, output positions {start:,} to {start + len(layout) - 1:,}; the counts are "
                 "theirs)" if len(layout) < n_gen else "")
        st.caption(f"The target's output for this prompt, {wording.plural(n_gen, 'token')}{shown}: green tokens were "
                   f"accepted drafts ({counts.get('accepted', 0)}), red ones the target's correction where it "
                   f"rejected a draft ({counts.get('rejected', 0)}), blue its bonus token after a fully accepted "
                   f"round ({counts.get('bonus', 0)})"
                   + (f", yellow decoded by the target alone in a round that drafted nothing ({counts['decode']})"
                      if counts.get("decode") else "")
                   + (f", grey the target's first token, from the prompt's prefill ({counts['prefill']})"
                      if counts.get("prefill") else "") + ". Hover a token for its round; click it to open the round.")
    hit = sel.clicked_round(event, sel.TEXT_HANDLED, prompt_id=pid)
    if hit is not None:
        sel.open_round(hit)

    stops = [s for s in round_views.rejected_rounds(rounds) if s[0] == pid]
    here = cur if cur and cur[0] == pid else (pid, -1)
    prev_r, next_r = round_views.neighbour(stops, here, -1), round_views.neighbour(stops, here, +1)
    b1, b2, b3 = st.columns([1, 1, 3])
    if b1.button("◀ previous rejected round", key=sel.TEXT_PREV, disabled=prev_r is None) and prev_r is not None:
        sel.open_round(prev_r)
    if b2.button("next rejected round ▶", key=sel.TEXT_NEXT, disabled=next_r is None) and next_r is not None:
        sel.open_round(next_r)
    b3.caption(f"{wording.plural(len(stops), 'round')} of this prompt had a rejected draft.")
