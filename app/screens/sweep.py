"""Sweep: configuration × category heatmap of a sweep (``mtpscope sweep``); a cell opens its trace in
Acceptance / Step / Explain; a sweep over drafter quantizations (``--assistant-quant``) also gets a type ×
category table. Aggregates come from DuckDB (traces.sweep.reader), never all rounds."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from mtpscope.app import charts, formats, loaders, safety, views
from mtpscope.app import selection as sel
from mtpscope.app.guard import guard
from mtpscope.traces.sweep.quant import quant_table
from mtpscope.traces.sweep.spec import SWEEP_FILE

st.title("Sweep")


def _open(page: str, trace_dir: Path) -> None:
    sel.set_(sel.TRACE, str(trace_dir))
    st.switch_page(f"screens/{page}.py")


if sel.SWEEP_PATH not in st.session_state:
    st.session_state[sel.SWEEP_PATH] = st.session_state.get(sel.SEL_SWEEP) or ""
path = st.text_input(f"sweep directory (holds {SWEEP_FILE})", key=sel.SWEEP_PATH,
                     help="The --out folder of `mtpscope sweep`; it must lie under an allowed root (MTPSCOPE_ROOTS).")
if not path.strip():
    st.info("Record a sweep with `mtpscope sweep --target T.gguf --assistant A.gguf --prompts P.jsonl "
            "--n-draft 1,2,3 --baseline --out DIR`, then enter DIR here.")
    st.stop()

with guard("sweep"):
    p = safety.check_path(path.strip(), sel.roots(), kind="dir")
    if not (p / SWEEP_FILE).is_file():
        st.error(f"{p}: not a sweep directory (no {SWEEP_FILE})")
        st.stop()
    sw, cells, advice = loaders.sweep(p)
    st.session_state[sel.SEL_SWEEP] = str(p)
    m = sw.matrix
    c = st.columns(5)
    c[0].metric("tasks", f"{len(m)}")
    c[1].metric("done", f"{int((m['state'] == 'done').sum())}")
    c[2].metric("failed", f"{int((m['state'] == 'failed').sum())}")
    c[3].metric("prompts", f"{len(sw.spec.prompts)}")
    c[4].metric("categories", f"{len(sw.categories)}")
    for w in sw.warnings[:10]:
        st.warning(w)
    if sw.failed:
        st.error(f"{len(sw.failed)} task(s) failed")
        st.dataframe([{"task": f.task, "attempts": f.attempts, "error": f.error} for f in sw.failed],
                     hide_index=True, width="stretch")

    rec = advice.advice.recommendation
    if rec is not None:
        (st.success if rec.choice not in (None, "plain") and not rec.tie else st.warning)(
            f"**{views.recommendation_label(rec)}** — {rec.reason}")
        if advice.advice.by_category:
            with st.expander("per category", expanded=False):
                st.dataframe(views.recommendation_table(advice.advice.by_category), hide_index=True, width="stretch",
                             key=sel.SWEEP_RECOMMENDATION_BY_CATEGORY,
                             row_height=views.WRAPPED_ROW_PX,  # the reason wraps
                             column_config={"why": st.column_config.TextColumn("why", width=520)})
    be = advice.advice.break_even
    if be is not None:
        st.caption(f"Break-even: {be.words}.")
        if advice.advice.break_even_by_category:
            with st.expander("break-even per category", expanded=False):
                st.dataframe(views.break_even_table(advice.advice.break_even_by_category), hide_index=True,
                             width="stretch",
                             key=sel.SWEEP_BREAK_EVEN_BY_CATEGORY)

    # --- drafter quantizations (sweep --assistant-quant): one row per llama.cpp type, one column per category
    quant = quant_table(cells, sw.spec)
    if len(quant):
        st.subheader("Drafter quantizations")
        qv = st.radio("value per type × category", list(views.QUANT_VALUES), horizontal=True,
                      key=sel.SWEEP_QUANT_VALUE)
        st.dataframe(views.quant_matrix(quant, qv), width="stretch", key=sel.SWEEP_QUANT_TABLE)
        st.caption(f"Each type is the drafter {', '.join(sorted(set(quant['source'])))} quantized by llama.cpp's "
                   "own quantizer (`mtpscope quantize`), recorded as its own assistant.")

    value = st.radio("colour", list(charts.SWEEP_VALUES), horizontal=True, key=sel.SWEEP_VALUE)
    fig = charts.sweep_heatmap(cells, value)
    ev = st.plotly_chart(fig, key=sel.SWEEP_HEAT, on_select="rerun", selection_mode="points", width="stretch")
    if len(cells) == 0:
        st.stop()

    configs = [tuple(r) for r in fig.layout.meta["rows"]]
    labels = {charts.sweep_config_label(a, k): (a, k) for a, k in configs}
    cats = list(fig.layout.meta["columns"])
    pts = list(getattr(getattr(ev, "selection", None), "points", None) or []) if ev else []
    if pts and pts[0].get("y") in labels and pts[0].get("x") in cats:
        pick = (pts[0]["y"], pts[0]["x"])
        if st.session_state.get(sel.SWEEP_HANDLED) != pick:
            st.session_state[sel.SWEEP_HANDLED] = pick
            st.session_state[sel.SWEEP_CONFIG] = pick[0]
            st.session_state[sel.SWEEP_CATEGORY] = pick[1]
    if st.session_state.get(sel.SWEEP_CONFIG) not in labels:
        st.session_state[sel.SWEEP_CONFIG] = next(iter(labels))
    if st.session_state.get(sel.SWEEP_CATEGORY) not in cats:
        st.session_state[sel.SWEEP_CATEGORY] = cats[0]
    c1, c2 = st.columns(2)
    label = c1.selectbox("configuration (or click the heatmap)", list(labels), key=sel.SWEEP_CONFIG)
    cat = c2.selectbox("category", cats, key=sel.SWEEP_CATEGORY)
    assistant, n_draft = labels[label]
    row = cells[(cells["assistant"] == assistant) & (cells["n_draft"] == n_draft) & (cells["category"] == cat)]
    if len(row):
        r = row.iloc[0]
        k = st.columns(4)
        k[0].metric("acceptance rate", formats.percent(r["acceptance_rate"]))
        k[1].metric("mean acceptance length", formats.number(r["mean_acceptance_length"], 3))
        k[2].metric("tokens/s", "-" if r["tokens_per_s"] != r["tokens_per_s"] else f"{r['tokens_per_s']:.1f}")
        k[3].metric("speedup", formats.number(r["speedup"], 3),
                    help="measured tokens/s over the baseline's (plain decoding), same category")

    # the traces of this cell: its finished shards that hold prompts of the category
    pr = sw.prompts
    want = set(pr["shard"]) if cat == "all" else set(pr.loc[pr["category"] == cat, "shard"])
    tasks = m[(m["assistant"] == assistant) & (m["n_draft"] == n_draft) & (m["state"] == "done")
              & m["shard"].isin(want)]
    if len(tasks) == 0:
        st.info("No finished trace for this cell.")
    else:
        n_in = {int(s): int(((pr["shard"] == s) & ((pr["category"] == cat) | (cat == "all"))).sum())
                for s in tasks["shard"]}
        shard = st.selectbox("trace (shard)", [int(s) for s in tasks["shard"]], key=sel.SWEEP_SHARD,
                             format_func=lambda s: f"shard {s} ({n_in.get(s, 0)} prompt{'s' if n_in.get(s, 0) != 1 else ''} "
                                                   f"of this category)")
        tdir = p / str(tasks[tasks["shard"] == shard]["dir"].iloc[0])
        st.caption(f"trace: {sel.short(tdir)}")
        b = st.columns(3)
        if b[0].button("open in Acceptance", key=sel.sweep_open_key("acceptance")):
            _open("acceptance", tdir)
        if b[1].button("open in Step", key=sel.sweep_open_key("step"), disabled=n_draft == 0,
                       help="plain decoding has no draft steps" if n_draft == 0 else None):
            _open("step", tdir)
        explain = Path(__file__).with_name("explain.py").exists()
        if b[2].button("open in Explain", key=sel.sweep_open_key("explain"), disabled=not explain,
                       help=None if explain else "the Explain page is not in this build"):
            _open("explain", tdir)

    with st.expander(f"tasks ({SWEEP_FILE})"):
        st.dataframe(m.drop(columns=["dir"]), hide_index=True, width="stretch")
