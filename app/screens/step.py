"""Step: one verify round's draft steps (opened by a click on the Acceptance timeline)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from mtpscope.app import charts, state, views
from mtpscope.errors import MtpscopeError

#: Hidden states are read without asking when the whole hidden data of the trace is at most this big.
HIDDEN_AUTO_BYTES = 256 * 2**20



def _dim(dims: dict, key: str) -> int:
    """``dims[key]`` as a non-negative int (0 when missing or not an integer)."""
    v = dims.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


st.title("Step view")
path = state.selected_or_stop("trace", "Choose a trace on the Files page, then click a round on the Acceptance "
                              "timeline.", hint=False)

with state.guard("trace store"):
    tr = state.trace(path)
    rounds = tr.rounds
    if len(rounds) == 0:
        st.info("This trace has no rounds.")
        st.stop()
    dec = state.trace_decoder(tr)
    pids = [int(p) for p in sorted(rounds["prompt_id"].unique())]
    sel = st.session_state.get("sel.round")
    if not sel or sel[0] not in pids:
        sel = (pids[0], int(rounds.loc[rounds["prompt_id"] == pids[0], "round"].min()))
    # widgets follow the selection made on the timeline
    if st.session_state.get("step.synced") != sel:
        st.session_state["step.synced"] = sel
        st.session_state["w.step.prompt"] = sel[0]
        st.session_state["w.step.round"] = sel[1]
    c1, c2 = st.columns(2)
    pid = c1.selectbox("prompt", pids, key="w.step.prompt")
    rmax = int(rounds.loc[rounds["prompt_id"] == pid, "round"].max())
    if st.session_state.get("w.step.round", 0) > rmax:
        st.session_state["w.step.round"] = 0
    rnd = c2.number_input("round", min_value=0, max_value=rmax, step=1, key="w.step.round")
    st.session_state["sel.round"] = (int(pid), int(rnd))
    st.session_state["step.synced"] = (int(pid), int(rnd))

    r = rounds[(rounds["prompt_id"] == pid) & (rounds["round"] == rnd)]
    if len(r) == 0:
        st.info(f"prompt {pid} has no round {rnd}")
        st.stop()
    row = r.iloc[0]
    st.markdown(f"**prompt {pid} · round {rnd}** · position {int(row['pos'])} · pending token "
                f"{dec.label(int(row['pending_token']))} · accepted **{int(row['n_accepted'])} / "
                f"{int(row['n_draft'])}** · draft {row['t_draft_ms']:.2f} ms · verify {row['t_verify_ms']:.2f} ms")
    st.markdown("emitted: " + (dec.join(views._as_list(row["emitted"])) or "—"))

    steps = views.round_steps(tr.steps, int(pid), int(rnd))
    if len(steps) == 0:
        st.info("No per-step records for this round (imported logs carry rounds only).")
        st.stop()
    table = views.step_table(steps, dec.label)
    st.dataframe(table, hide_index=True, width="stretch", key="step.table")

    st.subheader("Drafter's top candidates")
    cols = st.columns(min(3, len(steps)))
    for i, s in enumerate(steps.to_dict("records")):
        with cols[i % len(cols)]:
            top = views.top_candidates(s, dec.label)
            st.plotly_chart(charts.top_candidates_figure(top, int(s["k"])), key=f"step.top.{i}", width="stretch")

    if "centroid_ids" in steps.columns and steps["centroid_ids"].notna().any():
        st.subheader("Centroid head")
        for s in steps.to_dict("records"):
            cids = views._as_list(s.get("centroid_ids"))
            if not cids:
                continue
            reach = s.get("target_in_candidates")
            tc = views._opt_int(s.get("target_centroid"))
            verdict = ("reachable" if reach is True else "**unreachable**" if reach is False else "unknown")
            st.markdown(f"k={int(s['k'])}: chose centroids {', '.join(map(str, cids[:32]))} · target "
                        f"{dec.label(views._opt_int(s.get('target_token')))} lives in centroid {tc} "
                        f"(rank {views._opt_int(s.get('target_centroid_rank'))}) → {verdict}")

    st.subheader("Hidden-state norms")
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
        f"read hidden-state norms (scans about {charts.human_bytes(est)} of Parquet)", key="w.step.hidden")
    if go_read:
        norms = pd.DataFrame({"k": ks})
        notes = []
        errors = []
        for name in ("h", "h_next", "h_inner"):
            try:
                h = tr.hidden(name, where=mask)
            except MtpscopeError as e:  # a trace without that hidden column: say so, keep going
                notes.append(f"{name}: {state.status_line(e)}")
                continue
            except Exception as e:  # noqa: BLE001 - e.g. a part whose h width disagrees with the manifest
                errors.append(f"{name}: {state.internal_error_line(e, f'reading hidden states {name!r}')}")
                continue
            norms[name] = np.linalg.norm(h.astype(np.float64), axis=1) if len(h) == len(ks) else np.nan
        norms = norms.sort_values("k")
        st.plotly_chart(charts.hidden_norms_figure(norms), key="step.norms", width="stretch")
        for n_ in notes:
            st.caption(n_)
        for e_ in errors:
            st.error(e_, icon=":material/bug_report:")
