"""Acceptance: the timeline (click a round → Step), per-position and rolling acceptance, prompts."""

from __future__ import annotations

import streamlit as st

from mtpscope.app import charts, state, views
from mtpscope.traces import metrics

st.title("Acceptance")
path = state.selected_or_stop("trace", "Choose a trace on the Files page (the demo trace is preselected once built).")

with state.guard("trace store"):
    tr = state.trace(path)
    rounds_all = tr.rounds
    prompts = state.manifest_prompts(tr)
    dec = state.trace_decoder(tr)
    for w in tr.warnings[:10]:
        st.warning(w)

    # ---- headline numbers: from traces.metrics.report (the library's definitions)
    with state.guard("metrics"):
        rep = state.report(path)
        c = st.columns(4)
        c[0].metric("acceptance rate", f"{state.acceptance_rate(rep):.1%}",
                    help="accepted drafts / drafted tokens (whole trace, traces.metrics.report)")
        c[1].metric("mean acceptance length", f"{state.mean_acceptance_length(rep):.3f}",
                    help="1 + accepted / verify rounds (whole trace)")
        c[2].metric("rounds", f"{len(rounds_all):,}")
        c[3].metric("drafted tokens", f"{int(rep.get('n_drafted') or 0):,}")

    if len(rounds_all) == 0:
        req = tr.requests
        if len(req):
            st.info(f"This trace holds per-request summaries only ({tr.manifest.get('source')}): no rounds to "
                    "draw. The numbers above come from its requests.")
            st.dataframe(req.head(1000), hide_index=True, width="stretch")
        else:
            st.info("This trace has no rounds.")
        st.stop()

    # ---- prompt selector
    table = views.per_prompt_table(rounds_all, prompts)
    pids = [int(p) for p in sorted(rounds_all["prompt_id"].unique())]
    texts = views.prompt_texts(prompts)
    ALL = -1
    choice = st.selectbox("prompt", [ALL] + pids, key="w.acc.prompt",
                          format_func=lambda p: "all prompts" if p == ALL else
                          f"prompt {p}: {texts.get(p, '')[:60]}")
    rounds = views.ordered_rounds(rounds_all, None if choice == ALL else [choice])
    if choice != ALL:
        row = table[table["prompt_id"] == choice].iloc[0]
        c = st.columns(3)
        c[0].metric(f"prompt {choice}: acceptance rate", f"{row['acceptance_rate']:.1%}")
        c[1].metric("mean acceptance length", f"{row['mean_acceptance_length']:.3f}")
        c[2].metric("longest zero-acceptance streak", f"{int(row['longest_zero_streak'])} rounds")

    # ---- timeline (window of individual marks; aggregated overview for long traces)
    n = len(rounds)
    window = rounds
    if n > charts.TIMELINE_MAX_MARKS:
        size = charts.TIMELINE_MAX_MARKS
        if st.session_state.get("w.acc.window", 0) > n - size:
            st.session_state["w.acc.window"] = n - size
        cur = int(st.session_state.get("w.acc.window", 0))
        ov = st.plotly_chart(charts.timeline_figure(rounds, dec, title=f"Overview: {n:,} rounds, binned "
                                                    "(click to move the window)",
                                                    highlight=(cur, cur + size - 1)),
                             key="acc.overview", on_select="rerun", selection_mode="points", width="stretch")
        opts = list(getattr(getattr(ov, "selection", None), "points", None) or []) if ov else []
        if not opts:
            st.session_state.pop("acc.ov_handled", None)
        elif opts[0].get("x") is not None and st.session_state.get("acc.ov_handled") != opts[0]["x"]:
            st.session_state["acc.ov_handled"] = opts[0]["x"]
            st.session_state["w.acc.window"] = int(min(max(0, int(opts[0]["x"]) - size // 2), n - size))
            st.rerun()
        start = st.slider("window start (round in prompt order)", 0, n - size, key="w.acc.window")
        window = rounds.iloc[start:start + size]
    st.caption(f"Vocabulary for token text: {dec.source}. Click a round to open it in the Step view.")
    fig = charts.timeline_figure(window, dec)
    event = st.plotly_chart(fig, key="acc.timeline", on_select="rerun", selection_mode="points",
                            width="stretch")
    pts = list(getattr(getattr(event, "selection", None), "points", None) or []) if event else []
    if not pts:
        st.session_state.pop("acc.handled", None)  # so the same round can be clicked again later
    else:
        p0 = pts[0]
        seq = p0.get("x")
        hit = window[window["seq"] == seq] if seq is not None else window.iloc[0:0]
        if len(hit) == 0 and p0.get("point_index") is not None and fig.layout.meta["mode"] == "marks":
            hit = window.iloc[[int(p0["point_index"])]]
        if len(hit):
            sel = (int(hit["prompt_id"].iloc[0]), int(hit["round"].iloc[0]))
            if st.session_state.get("acc.handled") != sel:
                st.session_state["acc.handled"] = sel
                st.session_state["sel.round"] = sel
                st.switch_page("screens/step.py")

    c1, c2 = st.columns(2)
    with c1:
        with state.guard("metrics"):
            pp = state.per_position(rep) if choice == ALL else metrics.per_position_acceptance(rounds)
            st.plotly_chart(charts.per_position_figure(pp), key="acc.perpos", width="stretch")
    with c2:
        st.plotly_chart(charts.accepted_length_histogram(rounds), key="acc.hist", width="stretch")
    win = st.select_slider("rolling window (rounds)", [8, 16, 32, 64, 128, 256, 1024], value=64, key="w.acc.roll")
    overall = metrics.acceptance_rate(rounds)  # NaN when nothing was drafted: no overall line
    st.plotly_chart(charts.rolling_figure(views.rolling_acceptance(rounds, window=win), overall, window=win),
                    key="acc.rolling", width="stretch")

    st.subheader("Zero-acceptance streaks")
    streaks = views.zero_streaks(rounds, min_length=2)
    if len(streaks):
        st.dataframe(streaks.head(200), hide_index=True, width="stretch")
    else:
        st.caption("no streak of two or more rounds with nothing accepted")

    st.subheader("Prompts, worst first")
    st.dataframe(table.head(500), hide_index=True, width="stretch",
                 column_config={"acceptance_rate": st.column_config.ProgressColumn(
                     "acceptance rate", min_value=0.0, max_value=1.0, format="percent")})
