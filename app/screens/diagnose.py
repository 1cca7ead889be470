"""Diagnose: the ranked findings of ``mtpscope diagnose`` on the selected trace (the same function), each with the
button that opens the page and state showing its evidence; or a diagnosis saved by ``mtpscope diagnose --out``."""

from __future__ import annotations

import streamlit as st

from mtpscope.app import diagnose_report, loaders
from mtpscope.app import selection as sel
from mtpscope.app.guard import guard

st.title("Diagnose")
st.caption("Every check of the drafter / target pair in order -- verify with the runtime verdicts, the metadata "
           "against the published Gemma 4 configurations, explain, a replay under each convention variant, a "
           "reference if given, the advice -- ranked worst first (`mtpscope diagnose`, docs/DIAGNOSE.md).")

c1, c2 = st.columns(2)
saved = c1.text_input("or open a saved diagnosis (a `mtpscope diagnose --out` folder)", key=sel.DIAG_SAVED,
                      placeholder="mtpscope-diagnose")
reference = c2.text_input("reference (an HF checkpoint folder or a known good drafter GGUF; optional)",
                          key=sel.DIAG_REFERENCE)
d = None
with guard("diagnosis"):
    if saved.strip():
        d = loaders.saved_diagnosis(saved.strip())
    else:
        trace = sel.selected_or_stop(sel.TRACE, "Choose a recorded trace on the Files page (the demo trace is "
                                                "preselected once built), or open a saved diagnosis above.")
        inputs = (trace, sel.get(sel.DRAFTER), sel.get(sel.TARGET), reference.strip() or None)
        st.caption(f"trace `{sel.short(trace)}`, drafter `{sel.short(inputs[1])}`, target `{sel.short(inputs[2])}`")
        if st.button("Diagnose this trace", type="primary", help="replays a sample of its rounds with llama.cpp "
                     "and the reference drafter: about 20 s on two cores"):
            st.session_state[sel.DIAG_RUN] = inputs
        if st.session_state.get(sel.DIAG_RUN) == inputs:
            with st.spinner("diagnosing (verify, published configurations, explain, replay variants, advice)…"):
                d = loaders.diagnosis(*inputs)
if d is None:
    st.stop()

if d.defects:
    st.error(f"Defect found: {d.headline}", icon=":material/error:")
else:
    st.success(f"No defect found: {d.headline}", icon=":material/check_circle:")
sm = d.summary
if sm.acceptance_rate is not None:
    m = st.columns(4)
    m[0].metric("acceptance rate", f"{sm.acceptance_rate:.1%}")
    m[1].metric("mean acceptance length", f"{sm.mean_acceptance_length or 0:.2f}")
    m[2].metric("n_draft", sm.n_draft)
    m[3].metric("findings that are defects", len(d.defects))

st.subheader("Findings, worst first")
for i, f in enumerate(d.findings):
    box = {"error": st.error, "warning": st.warning}.get(f.severity, st.info)
    with st.container(border=True):
        box(f"**{i + 1}. {f.title}**  \n`{f.cause}` · {f.severity} · confidence {f.confidence}")
        for e in f.evidence:
            st.markdown(f"- **{e.step}**: {e.text}")
        if f.fix is not None and f.fix.text:
            st.markdown(f"**fix**: {f.fix.text}")
        if f.link is not None:
            url = diagnose_report.link_url(f.link, base="")
            if st.button(f"open the evidence: {f.link.page}", key=sel.diag_open_key(i), help=url):
                sel.open_view(f.link.page, dict(f.link.params))

if d.limits:
    st.subheader("What limits acceptance")
    st.markdown("\n".join(f"- {x}" for x in d.limits))
figs = diagnose_report.figures(d)
if figs:
    st.subheader("Figures")
    for name, fig in figs:
        st.plotly_chart(fig, key=sel.diag_figure_key(name), width="stretch")
with st.expander("steps and notes"):
    st.table([{"name": r.name, "status": r.status, "seconds": r.seconds, "note": r.note} for r in d.steps])
    for n in d.notes:
        st.caption(n)
