"""Compare: two traces (or two prompts of one trace) side by side."""

from __future__ import annotations

import streamlit as st

from mtpscope.app import charts, state, views
from mtpscope.traces import metrics

st.title("Compare")
mode = st.radio("compare", ["two traces", "two prompts of one trace"], horizontal=True, key="w.cmp.mode")
a_path = state.get("trace")


def _use_as_b(path: str) -> None:
    state.set_("trace_b", path)
    st.session_state["w.cmp.mode"] = "two traces"


def _traces() -> None:
    """Two traces (or two prompts of one) side by side; returns early when a choice is missing."""
    if not a_path:
        st.info("Choose a trace on the Files page (and a second one under “Second trace”).")
        state.demo_missing_hint()
        return
    tr_a = state.trace(a_path)
    if mode == "two traces":
        b_path = state.get("trace_b")
        if not b_path:
            st.info("Choose a second trace on the Files page (“Second trace”).")
            return
        tr_b = state.trace(b_path)
        names = (state.short(a_path), state.short(b_path))
        ra, rb = tr_a.rounds, tr_b.rounds
        rep_a, rep_b = state.report(a_path), state.report(b_path)
        pa_, pb_ = state.per_position(rep_a), state.per_position(rep_b)
        rate_a, rate_b = state.acceptance_rate(rep_a), state.acceptance_rate(rep_b)
        len_a, len_b = state.mean_acceptance_length(rep_a), state.mean_acceptance_length(rep_b)
        prompts_a = state.manifest_prompts(tr_a)
        prompts_b = state.manifest_prompts(tr_b)
    else:
        pids = [int(p) for p in sorted(tr_a.rounds["prompt_id"].unique())]
        if len(pids) < 2:
            st.info("This trace has a single prompt.")
            return
        c1, c2 = st.columns(2)
        pa_id = c1.selectbox("prompt A", pids, index=0, key="w.cmp.pa")
        pb_id = c2.selectbox("prompt B", pids, index=1, key="w.cmp.pb")
        names = (f"prompt {pa_id}", f"prompt {pb_id}")
        ra = tr_a.rounds[tr_a.rounds["prompt_id"] == pa_id]
        rb = tr_a.rounds[tr_a.rounds["prompt_id"] == pb_id]
        pa_, pb_ = metrics.per_position_acceptance(ra), metrics.per_position_acceptance(rb)
        rate_a, rate_b = metrics.acceptance_rate(ra), metrics.acceptance_rate(rb)
        len_a, len_b = metrics.mean_acceptance_length(ra), metrics.mean_acceptance_length(rb)
        prompts_a = prompts_b = state.manifest_prompts(tr_a)

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
        div = views.first_divergence(ra, rb, decode=state.trace_decoder(tr_a))
        if len(div):
            st.dataframe(div, hide_index=True, width="stretch")
        else:
            st.success("the two traces draft, accept and emit the same tokens in every common round")


with state.guard("trace store"):
    _traces()

st.subheader("Replay results")
rpath = state.get("replay")
if not rpath:
    st.caption("Choose a replay output folder (`mtpscope replay TRACE --out DIR`) on the Files page to see "
               "how each variant would have drafted the same rounds.")
else:
    with state.guard("replay"):
        summary, rsteps = state.replay(rpath)
        dec = state.decoder(state.get("drafter"), state.get("target"))
        rec = summary.get("recorded") or {}
        variants = summary.get("variants") or {}
        rows = [{"variant": "recorded", "options": "-", "acceptance_rate": rec.get("acceptance_rate"),
                 "mean_acceptance_length": rec.get("mean_acceptance_length"), "agreement": None}]
        rows += [{"variant": n, **{k: v.get(k) for k in ("options", "acceptance_rate", "mean_acceptance_length",
                                                             "agreement")}} for n, v in variants.items()]
        import pandas as pd

        table = pd.DataFrame(rows)
        st.caption(f"replay of `{state.short(summary.get('trace'))}`: {summary.get('n_rounds')} rounds, "
                   f"{summary.get('n_steps')} steps")
        st.plotly_chart(charts.summary_bars([float(r or 0) for r in table["acceptance_rate"]], list(table["variant"]),
                                            "Acceptance rate: recorded vs replayed variants"),
                        key="cmp.replay", width="stretch")
        st.dataframe(table, hide_index=True, width="stretch")
        for note in summary.get("notes") or []:
            st.caption(note)
        dcols = [c for c in rsteps.columns if c.startswith("draft[")]
        if len(rsteps) and dcols and "recorded" in rsteps.columns:
            same = (rsteps[dcols].eq(rsteps["recorded"], axis=0)).all(axis=1)
            dis = rsteps.loc[~same, [c for c in ("prompt_id", "round", "k", "recorded", "truth") if c in rsteps.columns]
                             + dcols].head(200)
            st.markdown(f"**Steps where a variant drafts differently** ({int((~same).sum())})")
            for c in ["recorded", "truth", *dcols]:
                if c in dis.columns:
                    dis[c] = [dec.label(None if pd.isna(v) else int(v)) for v in dis[c]]
            st.dataframe(dis, hide_index=True, width="stretch")
        vt = summary.get("variant_traces") or {}
        if vt:
            st.markdown("**Variant traces**: compare one round by round as trace B")
            cols = st.columns(min(4, len(vt)))
            for i, (name, vp) in enumerate(vt.items()):
                found = state.resolve_near(vp, rpath)
                cols[i % len(cols)].button(f"trace B = {name}", key=f"w.cmp.vt.{i}", disabled=found is None,
                                           on_click=_use_as_b, args=(str(found),))
