"""Diagnose: the ranked findings of ``mtpscope diagnose`` on the trace the user is looking at (the same function;
with traces A and B open, the page asks which), each with the buttons that open the views showing its evidence;
or a diagnosis saved by ``mtpscope diagnose --out``. The HTML report downloads from the page."""

from __future__ import annotations

from typing import Any

import streamlit as st

from mtpscope.app import diagnose_report, formats, links, loaders, url_state, views
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
trace = other = None
with guard("diagnosis"):
    if saved.strip():
        d = loaders.saved_diagnosis(saved.strip())
    else:
        view = url_state.requested("diagnose")
        a = sel.selected_or_stop(sel.TRACE, "Choose a recorded trace on the Files page (the demo trace is "
                                            "preselected once built), or open a saved diagnosis above.")
        b = sel.get(sel.TRACE_B)
        drafter_of = {}
        for t in (a, b):
            if t:
                with guard(f"reading trace {sel.short(t)}"):
                    drafter_of[t] = views.model_path(loaders.trace(t).manifest, "assistant")
        # a link naming one trace (it is trace A now) chooses it; one naming both (the selection) asks
        if b and view is not None and view.trace and not view.trace_b:
            st.session_state[sel.DIAG_WHICH] = "A"
        if b:   # two traces open: ask which (preset by a link)
            names = {"A": a, "B": b}
            which = st.radio("Two traces are open: which one to diagnose?", list(names), index=None,
                             horizontal=True, key=sel.DIAG_WHICH,
                             format_func=lambda k: f"trace {k}: {sel.short(names[k])} (drafter "
                                                   f"{sel.short(drafter_of.get(names[k]))})")
            if which is None:
                st.info("Choose the trace to diagnose above. To diagnose another one, open it on the Files page.",
                        icon=":material/help:")
                st.stop()
            trace, other = names[which], names["B" if which == "A" else "A"]
        else:
            trace = a
        # trace A with the drafter and target selected with it; trace B with the models that recorded it
        is_a = trace == a
        drafter, target = (sel.get(sel.DRAFTER), sel.get(sel.TARGET)) if is_a else (None, None)
        # the address names the trace diagnosed (and A's models): a reload or a pasted address diagnoses it again
        url_state.publish(links.View("diagnose", trace=trace, drafter=drafter, target=target))
        inputs = (trace, drafter, target, reference.strip() or None)
        st.caption(f"trace {'A' if is_a else 'B'} `{sel.short(trace)}` · drafter "
                   f"`{sel.short(drafter or drafter_of.get(trace))}` · target "
                   f"`{sel.short(target) if target else 'the one that recorded it'}`. Another trace: choose it on "
                   "the Files page.")
        if st.button("Diagnose this trace", type="primary", help="replays a sample of its rounds with llama.cpp "
                     "and the reference drafter: about 20 s on two cores"):
            st.session_state[sel.DIAG_RUN] = inputs
        if st.session_state.get(sel.DIAG_RUN) == inputs or loaders.has_saved_diagnosis(*inputs):   # saved: shown
            with st.spinner("diagnosing (verify, published configurations, explain, replay variants, advice)…"):
                d = loaders.diagnosis(*inputs)
if d is None:
    st.stop()

for other in d.model_mismatch:       # before any figure of the trace: they describe another model
    st.warning(other, icon=":material/warning:")
if d.defects:
    st.error(f"Defect found: {d.headline}", icon=":material/error:")
else:
    st.success(f"No defect found: {d.headline}", icon=":material/check_circle:")
sm = d.summary
if sm.acceptance_rate is not None:
    m = st.columns(4)
    m[0].metric("acceptance rate", formats.percent(sm.acceptance_rate))
    m[1].metric("mean acceptance length", formats.number(sm.mean_acceptance_length, 3))
    m[2].metric("n_draft", formats.cell(sm.n_draft))
    m[3].metric("findings that are defects", len(d.defects))

# the evidence against the other open trace: its acceptance gap (Compare) and the first step judged differently
compare_with = first_step = gap = None
if trace and other and d.defects:
    with guard("comparing with the other trace"):
        ta, tb = sel.get(sel.TRACE), sel.get(sel.TRACE_B)
        if ta and tb:
            diff = loaders.comparison(ta, tb)
            side = "a" if trace == ta else "b"
            first_step = diagnose_report.first_differing_step(diff.positions, loaders.positions(trace).emitted, side)
            rd = diff.delta.get("all")
            if rd is not None:
                this, that = (rd.rate_a, rd.rate_b) if side == "a" else (rd.rate_b, rd.rate_a)
                gap = diagnose_report.gap_words(this, that, f"trace {'B' if side == 'a' else 'A'} "
                                                            f"`{sel.short(other)}`")
            compare_with = (ta, tb)

st.subheader("Findings, worst first")
for i, f in enumerate(d.findings):
    box = {"error": st.error, "warning": st.warning}.get(f.severity, st.info)
    with st.container(border=True):
        box(f"**{i + 1}. {f.title}**  \n`{f.cause}` · {f.severity} · confidence {f.confidence}")
        for e in f.evidence:
            st.markdown(f"- **{e.step}**: {e.text}")
        if f.is_defect and gap:
            st.markdown(f"- **compare**: {gap}")
        if f.fix is not None and f.fix.text:
            st.markdown(f"**fix**: {f.fix.text}")
        shown = diagnose_report.evidence_views(f, trace=trace, compare_with=compare_with, first_step=first_step)
        if shown:
            cols = st.columns(len(shown))
            for j, (words, link) in enumerate(shown):
                url = diagnose_report.link_url(link, base="")
                key = sel.diag_open_key(i, j)
                if cols[j].button(words, key=key, help=url, icon=":material/open_in_new:"):
                    sel.open_view(link.page, dict(link.params))

if d.limits:
    st.subheader("What limits acceptance")
    st.markdown("\n".join(f"- {x}" for x in d.limits))
figs = diagnose_report.figures(d)
if figs:
    st.subheader("Figures")
    for name, fig in figs:
        st.plotly_chart(fig, key=sel.diag_figure_key(name), width="stretch")

st.subheader("The report")
base = diagnose_report.app_base(st.context.url)


def _report(d: Any = d, base: str = base) -> str:
    """The HTML report, made when the button is clicked (on a thread of its own: not on every run)."""
    return diagnose_report.html_report(d, base=base)


st.download_button("Download the HTML report", data=_report,
                   file_name="mtpscope-diagnose.html", mime="text/html", key=sel.DIAG_DOWNLOAD, on_click="ignore",
                   icon=":material/download:", help="one self-contained file: findings, figures, the JSON")
if d.out:
    st.caption(f"Saved in `{d.out}` (`diagnosis.json`, the replays); open it again with \"open a saved "
               "diagnosis\" above, or `mtpscope diagnose --trace … --html report.html` from the command line.")
with st.expander("steps and notes"):
    st.table(formats.cells({"name": r.name, "status": r.status, "seconds": formats.number(r.seconds, 1),
                            "note": r.note or None} for r in d.steps))
    for n in d.notes:
        st.caption(n)
