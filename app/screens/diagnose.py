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
doc = None
with guard("diagnosis"):
    if saved.strip():
        doc = loaders.saved_diagnosis(saved.strip())
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
                doc = loaders.diagnosis(*inputs)
if doc is None:
    st.stop()

if doc["defect"]:
    st.error(f"Defect found: {doc['headline']}", icon=":material/error:")
else:
    st.success(f"No defect found: {doc['headline']}", icon=":material/check_circle:")
s = doc.get("summary") or {}
if s.get("acceptance_rate") is not None:
    m = st.columns(4)
    m[0].metric("acceptance rate", f"{s['acceptance_rate']:.1%}")
    m[1].metric("mean acceptance length", f"{s.get('mean_acceptance_length') or 0:.2f}")
    m[2].metric("n_draft", s.get("n_draft"))
    m[3].metric("findings that are defects", sum(1 for f in doc["findings"] if f["severity"] != "info"))

st.subheader("Findings, worst first")
for i, f in enumerate(doc["findings"]):
    box = {"error": st.error, "warning": st.warning}.get(f["severity"], st.info)
    with st.container(border=True):
        box(f"**{i + 1}. {f['title']}**  \n`{f['cause']}` · {f['severity']} · confidence {f['confidence']}")
        for e in f.get("evidence") or []:
            st.markdown(f"- **{e['step']}**: {e['text']}")
        if (f.get("fix") or {}).get("text"):
            st.markdown(f"**fix**: {f['fix']['text']}")
        link = f.get("link")
        if link:
            url = diagnose_report.link_url(link, base="")
            if st.button(f"open the evidence: {link['page']}", key=sel.diag_open_key(i), help=url):
                sel.open_view(link["page"], dict(link.get("params") or {}))

if doc.get("limits"):
    st.subheader("What limits acceptance")
    st.markdown("\n".join(f"- {x}" for x in doc["limits"]))
figs = diagnose_report.figures(doc)
if figs:
    st.subheader("Figures")
    for name, fig in figs:
        st.plotly_chart(fig, key=sel.diag_figure_key(name), width="stretch")
with st.expander("steps and notes"):
    st.table([{k: row[k] for k in ("name", "status", "seconds", "note")} for row in doc.get("steps") or []])
    for n in doc.get("notes") or []:
        st.caption(n)
