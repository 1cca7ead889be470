"""Compare: two traces (or two prompts of one trace) side by side."""

from __future__ import annotations

import streamlit as st

from app import charts, state, views

st.title("Compare")
mode = st.radio("compare", ["two traces", "two prompts of one trace"], horizontal=True, key="w.cmp.mode")
a_path = state.get("trace")
if not a_path:
    st.info("Choose a trace on the Files page (and a second one under “Second trace”).")
    state.demo_missing_hint()
    st.stop()

with state.guard("trace store"):
    tr_a = state.trace(a_path)
    dec = state.trace_decoder(tr_a)
    if mode == "two traces":
        b_path = state.get("trace_b")
        if not b_path:
            st.info("Choose a second trace on the Files page (“Second trace”).")
            st.stop()
        tr_b = state.trace(b_path)
        names = (state.short(a_path), state.short(b_path))
        ra, rb = tr_a.rounds, tr_b.rounds
        rep_a, rep_b = state.report(a_path), state.report(b_path)
        pa_, pb_ = state.per_position(rep_a), state.per_position(rep_b)
        rate_a, rate_b = state.acceptance_rate(rep_a), state.acceptance_rate(rep_b)
        len_a, len_b = state.mean_acceptance_length(rep_a), state.mean_acceptance_length(rep_b)
        prompts_a = tr_a.manifest.get("prompts") or []
        prompts_b = tr_b.manifest.get("prompts") or []
    else:
        pids = [int(p) for p in sorted(tr_a.rounds["prompt_id"].unique())]
        if len(pids) < 2:
            st.info("This trace has a single prompt.")
            st.stop()
        c1, c2 = st.columns(2)
        pa_id = c1.selectbox("prompt A", pids, index=0, key="w.cmp.pa")
        pb_id = c2.selectbox("prompt B", pids, index=1, key="w.cmp.pb")
        names = (f"prompt {pa_id}", f"prompt {pb_id}")
        ra = tr_a.rounds[tr_a.rounds["prompt_id"] == pa_id]
        rb = tr_a.rounds[tr_a.rounds["prompt_id"] == pb_id]
        pa_, pb_ = views.per_position_from_rounds(ra), views.per_position_from_rounds(rb)
        from traces import metrics

        rate_a, rate_b = metrics.acceptance_rate(ra), metrics.acceptance_rate(rb)
        len_a, len_b = metrics.mean_acceptance_length(ra), metrics.mean_acceptance_length(rb)
        prompts_a = prompts_b = tr_a.manifest.get("prompts") or []

    c = st.columns(4)
    c[0].metric(f"acceptance rate · {names[0]}", f"{rate_a:.1%}")
    c[1].metric(f"acceptance rate · {names[1]}", f"{rate_b:.1%}", delta=f"{(rate_b - rate_a) * 100:+.1f} pts")
    c[2].metric(f"mean acceptance length · {names[0]}", f"{len_a:.3f}")
    c[3].metric(f"mean acceptance length · {names[1]}", f"{len_b:.3f}", delta=f"{len_b - len_a:+.3f}")

    st.plotly_chart(charts.per_position_figure(pa_, pb_, names=names), key="cmp.perpos", width="stretch")
    oa, ob = views.ordered_rounds(ra), views.ordered_rounds(rb)
    st.plotly_chart(charts.rolling_figure(views.rolling_acceptance(oa), other=views.rolling_acceptance(ob),
                                          names=names, window=64), key="cmp.rolling", width="stretch")

    if mode == "two traces":
        st.subheader("Per-prompt deltas")
        deltas = views.prompt_deltas(views.per_prompt_table(ra, prompts_a), views.per_prompt_table(rb, prompts_b))
        st.plotly_chart(charts.prompt_delta_figure(deltas, names), key="cmp.deltas", width="stretch")
        st.dataframe(deltas.head(500), hide_index=True, width="stretch")
        st.subheader("First rounds where they diverge")
        div = views.first_divergence(ra, rb)
        if len(div):
            st.dataframe(div, hide_index=True, width="stretch")
        else:
            st.success("the two traces draft, accept and emit the same tokens in every common round")
    st.caption("Replay results (issue 7) appear here as a third trace once replay traces exist; "
               "pick a replay trace as trace B to compare it now.")
