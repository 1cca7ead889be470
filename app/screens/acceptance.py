"""Acceptance: the timeline (click a round → Step), per-position and rolling acceptance, prompts."""

from __future__ import annotations

import streamlit as st

from mtpscope.app import charts, formats, links, loaders, round_views, url_state, views
from mtpscope.app import selection as sel
from mtpscope.app.guard import guard
from mtpscope.errors import LinkError
from mtpscope.traces.analysis import metrics, wording

#: Rolling windows offered (rounds); the default is the report's.
ROLL_WINDOWS = sorted({8, 16, 32, 64, 128, 256, 1024, metrics.DEFAULT_ROLLING_WINDOW})

st.title("Acceptance")
path = sel.selected_or_stop(sel.TRACE, "Choose a trace on the Files page (the demo trace is preselected once built).")
view = url_state.requested("acceptance")

with guard("trace store"):
    tr = loaders.trace(path)
    rounds_all = tr.rounds
    # a link's prompt / round / window checked first: a refused one is its one line, nothing of the page above it
    url_state.take_prompt_round(view, round_views.prompt_round_spans(rounds_all))
    if view is not None and view.window is not None:
        try:
            links.check_offered(view, "window", ROLL_WINDOWS)
        except LinkError as e:
            url_state.refuse(e)
        st.session_state[sel.ACC_ROLL] = view.window
    prompts = views.manifest_prompts(tr.manifest)
    dec = loaders.trace_decoder(tr)
    for w in [w for w in tr.warnings if "trace is incomplete" not in w][:10]:   # (incomplete: above every trace page)
        st.warning(w)

    # ---- headline numbers: from traces.analysis.metrics.report (the library's definitions)
    rep = None
    with guard("metrics"):
        rep = loaders.report(path)
        c = st.columns(4)
        c[0].metric("acceptance rate", formats.percent(views.acceptance_rate(rep)),
                    help="accepted drafts / drafted tokens, over the whole trace (as `mtpscope report`)")
        c[1].metric("mean acceptance length", formats.number(views.mean_acceptance_length(rep), 3),
                    help="tokens per target verify: 1 + accepted drafts / rounds that drafted (whole trace)")
        c[2].metric("rounds", f"{len(rounds_all):,}")
        c[3].metric("drafted tokens", f"{int(rep.n_drafted or 0):,}")

    if len(rounds_all) == 0:
        req = tr.requests
        if len(req):
            rq = rep.requests if rep is not None else None
            st.info(f"This trace holds per-request summaries only ({tr.manifest.get('source')}): no rounds to draw. "
                    + (views.request_rows_words(rq.kind, rq.by_kind) if rq is not None
                       else "The numbers above come from its requests."))
            st.dataframe(req.head(1000), hide_index=True, width="stretch")
        else:
            st.info("This trace has no rounds.")
        st.stop()

    # ---- prompt selector
    table = views.per_prompt_table(rounds_all, prompts)
    pids = [int(p) for p in sorted(rounds_all["prompt_id"].unique())]
    labels = views.prompt_labels(pids, prompts)
    long_labels = views.prompt_labels(pids, prompts, width=80)
    ALL = sel.ALL
    p1, p2 = st.columns([4, 1])
    choice = sel.prompt_picker(p1, sel.ACC_PROMPT, pids, long_labels, allow_all=True)
    one = choice if isinstance(choice, int) else None  # prompt_picker: a prompt id, or ALL
    worst = round_views.worst_round(rounds_all, one)
    if p2.button("worst round ▶", key=sel.ACC_WORST, disabled=worst is None, width="stretch",
                 help="open the Step view on the round that lost the most drafts"
                      + (" (of every prompt)" if choice == ALL else " of this prompt")
                      + "; among those, the one opening the longest run of rounds that accepted nothing") \
            and worst is not None:  # the button is disabled without a worst round
        sel.open_round(worst)
    rounds = views.ordered_rounds(rounds_all, None if one is None else [one])
    if choice != ALL:
        row = table[table["prompt_id"] == choice].iloc[0]
        pc = st.columns(3)
        pc[0].metric(f"prompt {choice}: acceptance rate", formats.percent(row["acceptance_rate"]))
        pc[1].metric("mean acceptance length", formats.number(row["mean_acceptance_length"], 3))
        pc[2].metric("longest zero-acceptance streak", wording.plural(int(row['longest_zero_streak']), "round"))

    # ---- timeline (window of individual marks; aggregated overview for long traces)
    n = len(rounds)
    window = rounds
    if n > charts.TIMELINE_MAX_MARKS:
        size = charts.TIMELINE_MAX_MARKS
        if st.session_state.get(sel.ACC_WINDOW, 0) > n - size:
            st.session_state[sel.ACC_WINDOW] = n - size
        cur = int(st.session_state.get(sel.ACC_WINDOW, 0))
        ov = st.plotly_chart(charts.timeline_figure(rounds, dec, title=f"Overview: {n:,} rounds, binned "
                                                    "(click to move the window)",
                                                    highlight=(cur, cur + size - 1), labels=labels),
                             key=sel.ACC_OVERVIEW, on_select="rerun", selection_mode="points", width="stretch")
        st.caption("The whole trace in bins of consecutive rounds (colour = the bin's acceptance rate); click to "
                   "move the detail window shown below.")
        opts = list(getattr(getattr(ov, "selection", None), "points", None) or []) if ov else []
        if not opts:
            st.session_state.pop(sel.ACC_OVERVIEW_HANDLED, None)
        elif opts[0].get("x") is not None and st.session_state.get(sel.ACC_OVERVIEW_HANDLED) != opts[0]["x"]:
            st.session_state[sel.ACC_OVERVIEW_HANDLED] = opts[0]["x"]
            st.session_state[sel.ACC_WINDOW] = int(min(max(0, int(opts[0]["x"]) - size // 2), n - size))
            st.rerun()
        start = st.slider("window start (round in prompt order)", 0, n - size, key=sel.ACC_WINDOW)
        window = rounds.iloc[start:start + size]
    fig = charts.timeline_figure(window, dec, labels=labels)
    event = st.plotly_chart(fig, key=sel.ACC_TIMELINE, on_select="rerun", selection_mode="points",
                            width="stretch")
    st.caption("Each dot is one verify round: its height is how many drafts the target accepted, its colour the "
               "share of that round's drafts accepted; grey rings drafted nothing; red bands are runs of rounds "
               f"that accepted nothing. Click a round to open it in the Step view. Token text: {dec.source}.")
    pts = list(getattr(getattr(event, "selection", None), "points", None) or []) if event else []
    if not pts:
        st.session_state.pop(sel.ACC_HANDLED, None)  # so the same round can be clicked again later
    else:
        p0 = pts[0]
        seq = p0.get("x")
        hit = window[window["seq"] == seq] if seq is not None else window.iloc[0:0]
        cd = p0.get("customdata")
        if len(hit) == 0 and cd is not None and len(cd) >= 2 and fig.layout.meta["mode"] == "marks":
            hit = window[(window["prompt_id"] == int(cd[0])) & (window["round"] == int(cd[1]))]
        if len(hit):
            picked = (int(hit["prompt_id"].iloc[0]), int(hit["round"].iloc[0]))
            if st.session_state.get(sel.ACC_HANDLED) != picked:
                st.session_state[sel.ACC_HANDLED] = picked
                sel.open_round(picked)

    c1, c2 = st.columns(2)
    with c1:
        with guard("metrics"):
            pp = views.per_position(rep) if choice == ALL else metrics.per_position_acceptance(rounds)
            st.plotly_chart(charts.per_position_figure(pp), key=sel.ACC_PER_POSITION, width="stretch")
            st.caption("How often the k-th draft of a round was accepted, over the rounds that drafted a k-th token.")
    with c2:
        drafting = rounds[rounds["n_draft"] > 0]
        st.plotly_chart(charts.accepted_length_histogram(drafting), key=sel.ACC_HIST, width="stretch")
        n0 = len(rounds) - len(drafting)
        st.caption("How many rounds accepted 0, 1, 2 … drafts"
                   + (f" (the {wording.plural(n0, 'round')} that drafted nothing left out)." if n0 else "."))
    r1, r2 = st.columns([3, 2])
    st.session_state.setdefault(sel.ACC_ROLL, metrics.DEFAULT_ROLLING_WINDOW)
    win = r1.select_slider("rolling window (rounds)", ROLL_WINDOWS, key=sel.ACC_ROLL)
    url_state.publish(links.View("acceptance", trace=path, prompt=choice, window=win))
    per = r2.radio("rolling over", ["the whole trace", "each prompt"], horizontal=True, key=sel.ACC_ROLL_MODE,
                   disabled=choice != ALL) == "each prompt" and choice == ALL
    overall = metrics.acceptance_rate(rounds)  # NaN when nothing was drafted: no overall line
    roll = views.rolling_acceptance(rounds, window=win, per_prompt=per)
    if per:  # worst prompts first, as the table below
        order = {int(p): i for i, p in enumerate(table["prompt_id"])}
        roll = roll.sort_values(["prompt_id"], key=lambda c: c.map(order), kind="stable")
    st.plotly_chart(charts.rolling_figure(roll, overall, window=win, labels=labels, per_prompt=per),
                    key=sel.ACC_ROLLING, width="stretch")
    st.caption(("Each prompt's acceptance rate over its last " if per else
                "Acceptance rate over the last ")
               + f"{wording.plural(win, 'round')}" + (" (worst prompts first)" if per else
                                                      ", the window running on across prompt boundaries")
               + "; dotted where the window still holds fewer rounds.")

    st.subheader("Zero-acceptance streaks")
    with guard("metrics"):
        z = rep.zero_acceptance_streaks if choice == ALL and rep is not None else None
        if z is not None:
            st.markdown(wording.streaks_line(z.n_streaks, z.n_rounds_in_streaks, z.longest))
        streaks = views.zero_streaks(rounds, min_length=1)
        if choice != ALL:
            n_rounds_in = int(streaks["length"].sum()) if len(streaks) else 0
            st.markdown(wording.streaks_line(len(streaks), n_rounds_in,
                                             int(streaks["length"].max()) if len(streaks) else 0))
        if len(streaks):
            st.dataframe(streaks.head(200).assign(prompt=lambda d: [labels.get(int(p), str(p)) for p in d["prompt_id"]])
                         [["prompt", "start_round", "end_round", "length"]],
                         hide_index=True, width="stretch",
                         column_config={"length": st.column_config.NumberColumn("length (rounds)")})
            st.caption("Runs of consecutive rounds of one prompt that drafted and accepted nothing, longest first.")

    st.subheader("Prompts, worst first")
    shown = table.head(500).assign(prompt=lambda d: [labels.get(int(p), str(p)) for p in d["prompt_id"]])
    st.dataframe(shown[["prompt", "acceptance_rate", "mean_acceptance_length", "n_rounds", "n_drafted",
                        "n_accepted", "longest_zero_streak"]], hide_index=True, width="stretch",
                 column_config={
                     "prompt": st.column_config.TextColumn("prompt", width=280,
                                                           help="prompt id and the start of its text"),
                     "acceptance_rate": st.column_config.ProgressColumn(
                         "acceptance rate", min_value=0.0, max_value=1.0, format="percent", width=125),
                     "mean_acceptance_length": st.column_config.NumberColumn(
                         "mean acc. length", format="%.3f", width=130, help="mean acceptance length"),
                     "n_rounds": st.column_config.NumberColumn("rounds", width=70),
                     "n_drafted": st.column_config.NumberColumn("drafted", width=75),
                     "n_accepted": st.column_config.NumberColumn("accepted", width=80),
                     "longest_zero_streak": st.column_config.NumberColumn(
                         "longest 0-streak", width=130, help="the most rounds in a row that accepted nothing")})
