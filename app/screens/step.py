"""Step: one verify round's draft steps (opened by a click on the Acceptance timeline)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from mtpscope.app import charts, links, loaders, round_views, url_state, views
from mtpscope.app import selection as sel
from mtpscope.app.guard import guard, internal_error_line, status_line
from mtpscope.errors import LinkError, MtpscopeError
from mtpscope.traces.analysis import wording
from mtpscope.traces.analysis.explain_report import drafting_head

#: Hidden states are read without asking when the whole hidden data of the trace is at most this big.
HIDDEN_AUTO_BYTES = 256 * 2**20
#: Tokens of the prompt's generated text shown around the round.
STRIP_TOKENS = 600


def _dim(dims: dict, key: str) -> int:
    """``dims[key]`` as a non-negative int (0 when missing or not an integer)."""
    v = dims.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def _go(target: tuple[int, int] | None) -> None:
    if target is not None:
        sel.select_round(target)


def _round_typed(pid: int) -> None:
    sel.select_round((pid, int(st.session_state[sel.STEP_ROUND])))


st.title("Step view")
path = sel.selected_or_stop(sel.TRACE, "Choose a trace on the Files page, then click a round on the Acceptance "
                              "timeline.", hint=False)
view = url_state.requested("step")

with guard("trace store"):
    tr = loaders.trace(path)
    rounds = tr.rounds
    if len(rounds) == 0:
        st.info("This trace has no rounds.")
        st.stop()
    dec = loaders.trace_decoder(tr)
    prompts = views.manifest_prompts(tr.manifest)
    head = drafting_head(tr.manifest)
    pids = [int(p) for p in sorted(rounds["prompt_id"].unique())]
    labels = views.prompt_labels(pids, prompts, width=80)
    spans = round_views.prompt_round_spans(rounds)
    url_state.take_prompt_round(view, spans, sel.page_prompt(pids, allow_all=False))
    c1, c2 = st.columns([3, 1])
    pid = int(sel.prompt_picker(c1, sel.STEP_PROMPT, pids, labels))
    lo, hi = spans[pid]
    picked = sel.selected_round()
    st.session_state[sel.STEP_ROUND] = picked[1] if picked and picked[0] == pid else lo
    # no max_value: a round typed past the last is refused below in one line that the next click clears
    rnd = int(c2.number_input("round", min_value=0, step=1, key=sel.STEP_ROUND, on_change=_round_typed, args=(pid,)))
    cur = (pid, rnd)
    sel.select_round(cur)
    stops = round_views.rejected_rounds(rounds)
    prev_r, next_r = round_views.neighbour(stops, cur, -1), round_views.neighbour(stops, cur, +1)
    worst = round_views.worst_round(rounds, pid)
    b1, b2, b3, b4 = st.columns([5, 4, 3, 5])
    b1.button("◀ previous rejected round", key=sel.STEP_PREV, disabled=prev_r is None, on_click=_go, args=(prev_r,),
              help="the closest earlier round in which the target rejected a draft")
    b2.button("next rejected round ▶", key=sel.STEP_NEXT, disabled=next_r is None, on_click=_go, args=(next_r,),
              help="the closest later round in which the target rejected a draft")
    b3.button("worst round", key=sel.STEP_WORST, disabled=worst is None or worst == cur, on_click=_go,
              args=(worst,), help="this prompt's round that lost the most drafts; among those, the one opening the "
                                  "longest run of rounds that accepted nothing")
    b4.caption(f"{wording.plural(len(stops), 'round')} of {len(rounds):,} had a rejected draft.")
    if not lo <= rnd <= hi:
        st.error(f"round {rnd}: prompt {pid} has rounds {lo}–{hi}", icon=":material/error:")
        st.stop()
    if view is not None and view.step is not None:  # the draft step a link points at, while its round is shown
        st.session_state[sel.SEL_STEP] = (*cur, view.step)
    focus = st.session_state.get(sel.SEL_STEP)
    k_focus = focus[2] if focus and tuple(focus[:2]) == cur else None

    r = rounds[(rounds["prompt_id"] == pid) & (rounds["round"] == rnd)]
    if len(r) == 0:
        st.info(f"prompt {pid} has no round {rnd}")
        st.stop()
    row = r.iloc[0]
    nd, na = int(row["n_draft"]), int(row["n_accepted"])
    if k_focus is not None:
        try:
            links.check_step(links.View("step", step=k_focus), nd, f"prompt {pid}, round {rnd}")
        except LinkError as e:
            st.session_state.pop(sel.SEL_STEP, None)
            url_state.refuse(e)
    url_state.publish(links.View("step", trace=path, prompt=pid, round=rnd, step=k_focus))
    text = views.prompt_texts(prompts).get(int(pid))
    st.markdown(f"**prompt {pid} · round {rnd}**" + (f" · “{wording.shorten(text, 60)}”" if text else "")
                + f" · position {int(row['pos'])} · pending token {dec.label(int(row['pending_token']))} · "
                f"accepted **{na} of {nd}** · draft {row['t_draft_ms']:.2f} ms · verify {row['t_verify_ms']:.2f} ms")
    st.markdown("emitted: " + (dec.join(views.as_list(row["emitted"])) or "—"))
    with st.expander("generated text of this prompt (this round outlined; click a token to open its round)",
                     expanded=True):
        pos = loaders.positions(path)
        g0 = round_views.round_position(pos, int(pid), int(rnd))
        layout = round_views.generated_text(pos, int(pid), dec.text, width=100, max_tokens=STRIP_TOKENS,
                                      start=max(0, (g0 or 0) - STRIP_TOKENS // 2))
        ev = st.plotly_chart(charts.text_figure(layout, highlight_round=int(rnd)), key=sel.STEP_TEXT,
                             on_select="rerun", selection_mode="points", width="stretch")
        st.caption("Green: accepted drafts · red: the target's correction of a rejected draft · blue: the target's "
                   "bonus token · yellow: decoded by the target alone · grey: the prefill's token.")
        hit = sel.clicked_round(ev, sel.STEP_TEXT_HANDLED, prompt_id=int(pid))
        if hit is not None and hit != cur:
            _go(hit)
            st.rerun()

    if nd == 0:
        st.info(f"This round {round_views.ZERO_DRAFT_WORDS}, so there are no draft steps to show.",
                icon=":material/info:")
        st.stop()
    steps = round_views.round_steps(tr.steps, int(pid), int(rnd))
    fm = None
    if na < nd:       # (an explanation that cannot be made, e.g. a malformed cost probe, is said and the round shown)
        with guard("explanation"):
            fm = loaders.explanation(path).first_mismatches
    verdict = round_views.round_verdict_line(row, steps, dec.label, fm, tr.manifest)
    (st.success if na == nd else st.warning)(verdict, icon=":material/check:" if na == nd else ":material/close:")
    if len(steps) == 0:
        st.info(round_views.no_steps_words(tr.manifest, lost_steps=any(p.parent.name == "steps" for p in tr.skipped)),
                icon=":material/info:")
        st.stop()
    table = round_views.step_table(steps, dec.label, n_draft=nd, n_accepted=na, head=head, n_top=3)
    if k_focus is not None:
        st.markdown(f"The link points at draft step **k={k_focus}** (highlighted).")
    shown = table.style.apply(lambda r: ["background-color: #fff3c4" if int(r["k"]) == k_focus else ""] * len(r),
                              axis=1) if k_focus is not None else table
    # every cell readable at ~940 px: widths that sum to less, long text wrapping (WRAPPED_ROW_PX)
    st.dataframe(shown, hide_index=True, width="stretch", key=sel.STEP_TABLE, row_height=views.WRAPPED_ROW_PX,
                 placeholder="—",
                 column_config={
                     "k": st.column_config.NumberColumn("k", width=36),
                     "verdict": st.column_config.TextColumn("verdict", width=100),
                     "drafted": st.column_config.TextColumn("drafted", width=100),
                     "target": st.column_config.TextColumn("target", width=100),
                     "target_rank": st.column_config.NumberColumn(
                         "rank", width=60, help="rank of the target's token among the drafter's logits "
                                                "(0 = the drafter's choice)"),
                     "top_candidates": st.column_config.TextColumn("drafter's top 3", width=170),
                     "target_centroid": st.column_config.TextColumn(
                         "centroid", width=90, help="the centroid holding the target's token, and its rank among all "
                                                    "centroids"),
                     "centroid_head": st.column_config.TextColumn(
                         "reach (what-if)" if head == "dense" else "reach", width=100,
                         help="whether the centroid head's candidates held the target's token"
                              + (" (this run drafted with the dense head: a what-if)" if head == "dense" else "")),
                     "drafted_id": st.column_config.NumberColumn("drafted id", width=80),
                     "target_id": st.column_config.NumberColumn("target id", width=80)})
    st.caption("One row per draft step: the drafted token against the target's; a step after the first rejection "
               "was never checked by the target.")

    st.subheader("Drafter's top candidates")
    cols = st.columns(min(3, len(steps)))
    for i, s in enumerate(steps.to_dict("records")):
        k = int(s["k"])
        v = round_views.step_verdict(k, nd, na)
        with cols[i % len(cols)]:
            top = round_views.top_candidates(s, dec.label)
            if v == round_views.VERDICT_NOT_CHECKED:
                top = top[top["stored"]].assign(is_target=False)
            st.plotly_chart(charts.top_candidates_figure(top, k, title=f"k={k} · {v}"),
                            key=sel.step_top_key(i), width="stretch")
    st.caption("The drafter's highest-scoring tokens at each step: green is the target's token, blue the drafted one; "
               "a hatched bar is the target's token when it ranked below the stored candidates (its logit is then "
               "not in the trace, at most the last bar's).")

    if "centroid_ids" in steps.columns and steps["centroid_ids"].notna().any():
        st.subheader("Centroid head" + (" (what-if: this run drafted with the dense head)" if head == "dense" else ""))
        for s in steps.to_dict("records"):
            cids = views.as_list(s.get("centroid_ids"))
            k = int(s["k"])
            if not cids or round_views.step_verdict(k, nd, na) == round_views.VERDICT_NOT_CHECKED:
                continue
            reach = s.get("target_in_candidates")
            reach = None if reach is None or reach is pd.NA else bool(reach)
            tc = views.opt_int(s.get("target_centroid"))
            st.markdown(f"k={k}: the target's {dec.label(views.opt_int(s.get('target_token')))} lives in centroid "
                        f"{tc} (rank {views.opt_int(s.get('target_centroid_rank'))} among all centroids) → "
                        f"**{round_views.reachability_words(reach, head)}** · chose centroids "
                        f"{', '.join(map(str, cids[:16]))}{' …' if len(cids) > 16 else ''}")

    rp = sel.get(sel.REPLAY)
    if rp:
        st.subheader("Replay")
        with guard("replay"):
            summary, rsteps = loaders.replay(rp)
            if not sel.same_trace(summary.trace, path, rp):
                st.caption(f"The replay results chosen on the Files page are for another trace "
                           f"(`{sel.short(summary.trace)}`).")
            else:
                names = list(summary.variants)
                rt = round_views.replay_for_round(rsteps, int(pid), int(rnd), names, dec.label)
                if len(rt):
                    st.dataframe(rt, hide_index=True, width="stretch", key=sel.STEP_REPLAY, placeholder="—")
                    st.caption("Each replayed variant's draft at this round (✓ = the target's token); the last "
                               "column lists the variants that would have drafted it.")
                else:
                    st.caption("The replay did not cover this round.")

    st.subheader("Hidden states")
    for line in charts.HIDDEN_MEANING.values():
        st.caption(line)
    dims = tr.manifest.get("dims")
    dims = dims if isinstance(dims, dict) else {}
    if not dims.get("hidden_dtype"):
        st.caption("This trace stores no hidden states (recorded without --hidden).")
        st.stop()
    mask = ((tr.steps["prompt_id"] == pid) & (tr.steps["round"] == rnd)).to_numpy()
    ks = tr.steps.loc[mask, "k"].to_numpy()
    # Trace.hidden reads the whole hidden column of every part holding these rows; on a long trace
    # with wide hidden states that is a lot of bytes, so it waits for a click.
    width = 2 * _dim(dims, "n_embd_backbone") + _dim(dims, "n_embd")
    est = len(tr.steps) * width * (2 if dims.get("hidden_dtype") == "f16" else 4)
    go_read = est <= HIDDEN_AUTO_BYTES or st.button(
        f"read hidden-state norms (scans about {charts.human_bytes(est)} of Parquet)", key=sel.STEP_HIDDEN)
    if go_read:
        from mtpscope.traces.analysis.drift import drift, has_hidden_target

        norms = pd.DataFrame({"k": ks})
        notes = []
        errors = []
        read: dict[str, np.ndarray] = {}
        hidden_names = ("h", "h_next", "h_inner") + (("h_target",) if has_hidden_target(tr.manifest) else ())
        for name in hidden_names:
            try:
                h = tr.hidden(name, where=mask)
            except MtpscopeError as e:  # a trace without that hidden column: say so, keep going
                notes.append(f"{name}: {status_line(e)}")
                continue
            except Exception as e:  # noqa: BLE001 - e.g. a part whose h width disagrees with the manifest
                errors.append(f"{name}: {internal_error_line(e, f'reading hidden states {name!r}')}")
                continue
            read[name] = h
            if name != "h_target":
                norms[name] = np.linalg.norm(h.astype(np.float64), axis=1) if len(h) == len(ks) else np.nan
        if "h_target" in read and "h_next" in read and len(read["h_next"]) == len(ks):
            acc = tr.steps.loc[mask, "accepted"].to_numpy(dtype=bool, na_value=False)
            dr = drift(ks, read["h_next"], read["h_target"], acc)
            st.plotly_chart(charts.drift_figure(dr, title="This round: the drafter's state against the target's"),
                            key=sel.STEP_DRIFT, width="stretch")
            st.caption("How close each step's h_next stays to the target's own hidden state at the position it "
                       "stands in for: cosine 1 and relative error 0 mean the same state.")
        else:
            st.caption("The drift view needs the target's hidden states (record with `--hidden-target`); the "
                       "lengths of the drafter's own states are below.")
        norms = norms.sort_values("k")
        st.plotly_chart(charts.hidden_norms_figure(norms), key=sel.STEP_NORMS, width="stretch")
        st.caption("The length (L2 norm) of each stored hidden state at each draft step of this round.")
        for n_ in notes:
            st.caption(n_)
        for e_ in errors:
            st.error(e_, icon=":material/bug_report:")
