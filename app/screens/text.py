"""Text: a prompt's generated text, every token coloured by what produced it; click a token to open its
round in the Step view."""

from __future__ import annotations

import streamlit as st

from mtpscope.app import charts, state, views
from mtpscope.traces.analysis import wording

st.title("Generated text")
path = state.selected_or_stop("trace", "Choose a trace on the Files page (the demo trace is preselected once built).")

#: Characters per line of the text view, and the most tokens drawn at once.
WIDTH, MAX_TOKENS = 100, 3000

with state.guard("trace store"):
    tr = state.trace(path)
    rounds = tr.rounds
    if len(rounds) == 0:
        st.info("This trace has no rounds, so no generated text.")
        st.stop()
    dec = state.trace_decoder(tr)
    prompts = state.manifest_prompts(tr)
    pids = [int(p) for p in sorted(rounds["prompt_id"].unique())]
    labels = views.prompt_labels(pids, prompts, width=80)
    sel = st.session_state.get("sel.round")
    if st.session_state.get("w.text.prompt") not in pids:
        st.session_state["w.text.prompt"] = sel[0] if sel and sel[0] in pids else pids[0]
    c1, c2 = st.columns([3, 1])
    pid = c1.selectbox("prompt", pids, key="w.text.prompt", format_func=labels.get)
    colour = c2.radio("colour by", ["what produced it", "token class"], horizontal=True, key="w.text.colour")
    text = views.prompt_texts(prompts).get(pid)
    if text:
        st.markdown(f"**Prompt:** {text}")
    pos = state.positions(path)
    classes = None
    if colour == "token class":
        with state.guard("token classes"):
            tc = state.token_classes(path)
            classes = tc.get(pid) if tc else None
            if tc is None:
                st.caption("No vocabulary available for this trace: token classes are unknown.")
    n_gen = len(pos.sequences.get(pid, ()))
    start = 0
    if n_gen > MAX_TOKENS:
        start = st.slider("first token shown (output position)", 0, n_gen - 1, 0, step=MAX_TOKENS // 2,
                          key=f"w.text.start.{pid}")
    cur = tuple(sel) if sel else None
    layout = views.generated_text(pos, pid, dec.text, classes=classes, width=WIDTH, max_tokens=MAX_TOKENS, start=start)
    fig = charts.text_figure(layout, colour_by="status" if colour == "what produced it" else "class", width=WIDTH,
                             highlight_round=cur[1] if cur and cur[0] == pid else None)
    event = st.plotly_chart(fig, key="text.view", on_select="rerun", selection_mode="points", width="stretch")
    if len(layout):
        counts = layout["status"].value_counts()
        st.caption(f"The target's output for this prompt, {wording.plural(n_gen, 'token')}: green tokens were "
                   f"accepted drafts ({counts.get('accepted', 0)}), red ones the target's correction where it "
                   f"rejected a draft ({counts.get('rejected', 0)}), blue its bonus token after a fully accepted "
                   f"round ({counts.get('bonus', 0)})"
                   + (f", yellow decoded by the target alone in a round that drafted nothing ({counts['decode']})"
                      if counts.get("decode") else "") + ". Hover a token for its round; click it to open the round.")
    hit = state.clicked_round(event, "text.handled", prompt_id=pid)
    if hit is not None:
        state.open_round(hit)

    stops = [s for s in views.rejected_rounds(rounds) if s[0] == pid]
    here = cur if cur and cur[0] == pid else (pid, -1)
    prev_r, next_r = views.neighbour(stops, here, -1), views.neighbour(stops, here, +1)
    b1, b2, b3 = st.columns([1, 1, 3])
    if b1.button("◀ previous rejected round", key="w.text.prev", disabled=prev_r is None):
        state.open_round(prev_r)
    if b2.button("next rejected round ▶", key="w.text.next", disabled=next_r is None):
        state.open_round(next_r)
    b3.caption(f"{wording.plural(len(stops), 'round')} of this prompt had a rejected draft.")
