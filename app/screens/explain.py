"""Explain: why drafts were rejected, on which tokens, and which n_draft to use — the explanation layer's
sections (``mtpscope explain``) as figures."""

from __future__ import annotations

import math
from typing import Any, cast

import pandas as pd
import streamlit as st

from mtpscope.app import charts, formats, links, loaders, round_views, url_state, views
from mtpscope.app import selection as sel
from mtpscope.app.guard import guard
from mtpscope.traces.analysis import wording

st.title("Explain")
path = sel.selected_or_stop(sel.TRACE, "Choose a trace on the Files page (the demo trace is preselected once built).")
view = url_state.requested("explain")

#: First mismatches listed at most.
MAX_ROWS = 500


def _f(v, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def _fin(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else v


with guard("explanation"):
    tr = loaders.trace(path)
    rounds = tr.rounds
    if len(rounds) == 0:
        st.info("This trace has no rounds to explain.")
        st.stop()
    dec = loaders.trace_decoder(tr)
    prompts = views.manifest_prompts(tr.manifest)
    pids = [int(p) for p in sorted(rounds["prompt_id"].unique())]
    labels = views.prompt_labels(pids, prompts, width=80)
    ALL = sel.ALL
    url_state.take_prompt_round(view, round_views.prompt_round_spans(rounds))
    c1, c2 = st.columns([3, 1])
    choice = sel.prompt_picker(c1, sel.EXP_PROMPT, pids, labels, allow_all=True)
    cat_field = c2.text_input("category field", key=sel.EXP_CATEGORY_FIELD, placeholder="category",
                              help="The prompts file's field that holds each prompt's category (as `mtpscope "
                                   "explain --category-field`); empty: 'category'.")
    url_state.publish(links.View("explain", trace=path, prompt=choice))
    x = loaders.explanation(path, choice if isinstance(choice, int) else None,  # prompt_picker: an id, or ALL
                            cat_field.strip() or None)
    rej, adv, wif = x.rejections, x.advice, x.what_if
    rec = None if adv is None else adv.recommendation

    shown = labels.get(choice, f"prompt {choice}") if isinstance(choice, int) else "all prompts"
    st.caption(f"Every figure below is of **{shown}** of trace A (`{sel.short(path)}`); choose a prompt above "
               "to see one.")
    c = st.columns(4)
    c[0].metric("acceptance rate", formats.percent(x.totals.acceptance_rate),   # (as every page shows a rate)
                help="accepted drafts / drafted tokens (as `mtpscope explain` and `mtpscope report`)")
    c[1].metric("rounds with a rejection", f"{rej.n_rounds_rejected:,}",
                help="rounds whose drafts were not all accepted")
    c[2].metric("of them, target known", f"{rej.n_first_mismatch:,}",
                help="of those rounds, the ones where the trace knows the target's token at the first rejection "
                     "(the causes below count these)")
    best = None if wif is None else wif.best_n_draft
    c[3].metric("recommendation", views.recommendation_label(rec),
                help="plain decoding or the n_draft with the most tokens per second, plain decoding always a "
                     "candidate; 'a tie with …' names the runner-up when their speed intervals overlap (as "
                     "`mtpscope explain`)")
    st.caption(f"Drafts came from the {x.head} head.")

    st.subheader("Why drafts were rejected")
    if not rej.n_rounds_rejected:
        st.success("No draft was rejected in this selection: every round accepted all it drafted.")
    else:
        c1, c2 = st.columns(2)
        with c1:
            st.plotly_chart(charts.causes_figure(rej.causes), key=sel.EXP_CAUSES, width="stretch")
            st.caption("For each round's first rejected draft, the reason: a near tie (the target's token scored within "
                       "0.5 logits of the draft), the drafter's runner-up, in its top list, or a far miss.")
        with c2:
            st.plotly_chart(charts.rank_histogram_figure(rej.rank_histogram), key=sel.EXP_RANKS, width="stretch")
            st.caption("Where the target's token stood in the drafter's ranking at the first rejection "
                       "(0 = the drafter's own pick, 10+ = below the stored candidates).")
        st.plotly_chart(charts.causes_by_position_figure(rej.by_position), key=sel.EXP_BY_POSITION, width="stretch")
        st.caption("The same reasons split by the draft position k where the round's first rejection happened.")
    ts = rej.target_side
    if ts.hard or ts.wrong:
        tc = st.columns(3)
        tc[0].metric("hard (target unsure too)", ts.hard,
                     help="the target's entropy at that position was at least 1 nat")
        tc[1].metric("wrong (target was sure)", ts.wrong, help="the target's entropy there was below 1 nat")
        tc[2].metric("mean p(drafted) hard / wrong", f"{_f(_fin(ts.p_drafted_mean_hard), '.3g')} / "
                                                      f"{_f(_fin(ts.p_drafted_mean_wrong), '.3g')}",
                     help="the target's own probability of the drafted token, averaged")
        st.caption("A hard token is one the target itself was unsure about; a wrong draft is a miss where the target "
                   "was sure.")
    if rej.sparse_unreachable is not None:
        st.caption(f"The centroid head could not have drafted {wording.plural(rej.sparse_unreachable, 'target token')} "
                   "of these either (not among its candidates).")
    t1, t2 = st.columns(2)
    for col, key, title, rows in ((t1, "top_target_tokens", "Most-rejected target tokens", rej.top_target_tokens),
                                  (t2, "top_drafted_tokens", "Most-rejected drafts", rej.top_drafted_tokens)):
        with col:
            st.markdown(f"**{title}**")
            if rows:
                st.dataframe(pd.DataFrame({"token": [dec.label(int(r.token)) for r in rows],
                                           "times": [int(r.count) for r in rows],
                                           "id": [int(r.token) for r in rows]}),
                             hide_index=True, width="stretch", key=sel.exp_tokens_key(key))
            else:
                st.caption("none")

    st.subheader("Acceptance by token class")
    if x.by_class:
        c1, c2 = st.columns(2)
        with c1:
            st.plotly_chart(charts.rate_bars_figure(x.by_class, "Acceptance rate by token class"),
                            key=sel.EXP_CLASS, width="stretch")
            st.caption("Each draft counts in the class of the target's token at its position (prose, code, JSON, "
                       "numbers, punctuation, …); labels are accepted / drafted.")
        with c2:
            st.plotly_chart(charts.class_position_figure(x.by_class_position), key=sel.EXP_CLASS_POSITION,
                            width="stretch")
            st.caption("The same split by draft position k: which kinds of tokens the drafter loses, and how early.")
    else:
        st.caption("Token classes need the trace's vocabulary (the recorded target or drafter GGUF under an "
                   "allowed folder).")
    if x.by_channel:
        st.plotly_chart(charts.rate_bars_figure(x.by_channel, "Acceptance rate by chat channel", "channel"),
                        key=sel.EXP_CHANNEL, width="stretch")
        st.caption("Thinking, answer and tool-call parts of a chat, as the Gemma 4 template marks them.")
    if x.by_category:
        st.plotly_chart(charts.rate_bars_figure(x.by_category, "Acceptance rate by prompt category", "category"),
                        key=sel.EXP_CATEGORY, width="stretch")
        st.caption("The prompts file's categories, worst first.")

    st.subheader("Drafter drift")
    if x.drift is not None:
        dr = x.drift
        if dr.related is False:
            st.info(dr.words[:1].upper() + dr.words[1:] + ".")
        st.plotly_chart(charts.drift_figure(dr), key=sel.EXP_DRIFT, width="stretch")
        st.caption(f"How close the drafter's state stays to the target's own hidden state at each draft position "
                   f"(mean cosine {_f(_fin(dr.cos_mean), '.3f')} over {wording.plural(dr.n_steps, 'step')}), and "
                   f"whether it tells accepted from rejected drafts: {dr.words}.")
    else:
        st.caption("Not captured: record with `--hidden-target` to compare the drafter's state with the target's.")

    st.subheader("Which n_draft? Or plain decoding?")
    wi = None if wif is None else wif.rows
    if rec is not None:
        (st.success if rec.choice not in (None, "plain") and not rec.tie else st.warning)(
            f"**{views.recommendation_label(rec)}** — {rec.reason}")
    tq = None if adv is None else adv.timing_quality
    if tq is not None:
        st.caption(f"Timing quality: {'**disturbed**, ' if tq.disturbed else ''}{tq.words} "
                   "(docs/EXPLAIN.md §4).")
    if wi and wif is not None:
        plain = _fin(adv.candidates[0].tokens_per_s) if adv is not None and adv.candidates else None
        st.plotly_chart(charts.what_if_figure(wi, best, plain=plain), key=sel.EXP_WHAT_IF, width="stretch")
        st.caption("Acceptance and speed this trace predicts at other n_draft (star = recorded, hollow = "
                   f"extrapolated past it; bars: {wif.interval_words()}); model in docs/EXPLAIN.md §4.")
        st.dataframe(views.what_if_table(wi), hide_index=True, width="stretch", key=sel.EXP_WHAT_IF_TABLE)
    if adv is not None and adv.by_category:
        st.markdown("**Per category**")
        st.dataframe(views.recommendation_table(adv.by_category), hide_index=True, width="stretch",
                     key=sel.EXP_RECOMMENDATION_BY_CATEGORY, row_height=views.WRAPPED_ROW_PX,  # the reason wraps
                     column_config={"why": st.column_config.TextColumn("why", width=520)})
    be = None if adv is None else adv.break_even
    if adv is not None and be is not None:
        st.markdown("**Break-even**")
        st.caption(be.words + ".")
        if adv.break_even_by_category:
            st.dataframe(views.break_even_table(adv.break_even_by_category), hide_index=True, width="stretch",
                         key=sel.EXP_BREAK_EVEN_BY_CATEGORY)
    for note in x.notes:
        st.caption(f"note: {note}")

    st.subheader("First rejections, round by round")
    fm = x.first_mismatches
    if len(fm):
        from mtpscope.traces.analysis.explain import step_sentence

        centroids = tr.manifest.get("centroids")
        cen = centroids if isinstance(centroids, dict) else {}
        sub = fm.head(MAX_ROWS)
        short_labels = views.prompt_labels(pids, prompts, width=24)
        table = pd.DataFrame({
            "prompt": [short_labels.get(int(p), str(p)) for p in sub["prompt_id"]],
            "round": sub["round"].astype(int).to_numpy(), "k": sub["k"].astype(int).to_numpy(),
            "why": [step_sentence(r, dec.label, n_centroids=cen.get("n_centroids"), centroid_top_k=cen.get("top_k"))
                    # a row's labels are the frame's column names, all str (pandas-stubs: dict[Hashable, Any])
                    for r in cast("list[dict[str, Any]]", sub.to_dict(orient="records"))]})
        ev = st.dataframe(table, hide_index=True, width="stretch", key=sel.EXP_FIRST_MISMATCHES, on_select="rerun",
                          selection_mode="single-row", row_height=views.WRAPPED_ROW_PX,  # the sentence wraps
                          column_config={"prompt": st.column_config.TextColumn("prompt", width=150),
                                         "round": st.column_config.NumberColumn("round", width=60),
                                         "k": st.column_config.NumberColumn("k", width=40),
                                         "why": st.column_config.TextColumn("why", width=620)})
        st.caption("Select a row to open that round in the Step view"
                   + (f" (first {MAX_ROWS} of {len(fm):,})." if len(fm) > MAX_ROWS else "."))
        picked = list(getattr(getattr(ev, "selection", None), "rows", None) or []) if ev else []
        if picked:
            r = sub.iloc[int(picked[0])]
            sel.open_round((int(r["prompt_id"]), int(r["round"])))
    else:
        st.caption("No rejected drafts.")
