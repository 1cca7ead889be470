"""Start (``/``): the answer first, for the open traces: the verdict (defect found or not, which), acceptance
against what it is compared with, the worst category and prompt with links into them, the advice, and the
way to Diagnose. The verdict is :func:`mtpscope.app.verdict.start_verdict` (pure); nothing slow runs here
(``diagnose`` only when asked, on the Diagnose page)."""

from __future__ import annotations

import streamlit as st

from mtpscope.app import links, loaders, trace_checks, url_state, verdict, views
from mtpscope.app import selection as sel
from mtpscope.app.guard import guard, status_line
from mtpscope.errors import MtpscopeError

st.title("Start")
url_state.requested("start")
path = sel.selected_or_stop(sel.TRACE, "Choose a trace on the Files page (the demo is opened by default once "
                                       "built: `mtpscope demo build`).")
b_path = sel.get(sel.TRACE_B)
url_state.publish(links.View("start", trace=path, trace_b=b_path))
st.caption(f"Open traces: trace A `{sel.short(path)}`" + (f", trace B `{sel.short(b_path)}`" if b_path else "")
           + " — change them on the Files page.")
st.page_link("screens/files.py", label="Files: choose other traces or models", icon=":material/folder_open:")

with guard("verdict"):
    # the advice (the explanation's what-if, the one slow part) is computed last: the verdict shows first
    facts = [f for f in (trace_checks.trace_facts(sel.TRACE, with_advice=False),) if f is not None]
    try:  # an unreadable trace B is said in one line; trace A's verdict stands without it
        fb = trace_checks.trace_facts(sel.TRACE_B, with_advice=False)
    except (MtpscopeError, OSError) as e:
        st.caption(f"trace B left out: {status_line(e)}")
    else:
        facts += [fb] if fb is not None else []
    v = verdict.start_verdict(facts)
    box = st.error if v.defect else st.success if v.defect is False else st.info
    box(v.sentence, icon=":material/error:" if v.defect else None)
    st.caption(f"Checked: {v.checked}.")

    st.subheader("Acceptance")
    st.markdown(v.acceptance)
    for f in facts:
        w = v.worst.get(f.path)
        if w is None or w.prompt_id is None:
            st.caption(verdict.no_worst_words(f))
            continue
        tr = loaders.trace(f.path)
        label = views.prompt_labels([w.prompt_id], views.manifest_prompts(tr.manifest), width=60)[w.prompt_id]
        where = (f"worst category **{w.category}** ({verdict.pct(w.category_rate)}), its worst prompt:"
                 if w.category is not None else "worst prompt:")
        st.markdown(f"**{f.role}** (`{f.name}`): {where} {label} ({verdict.pct(w.prompt_rate)})")
        c1, c2 = st.columns(2)
        q = {"trace": f.path, "prompt": str(w.prompt_id)}
        opens = "" if f.role == "trace A" else f" (opens {f.role} as trace A)"
        c1.page_link("screens/explain.py", label=f"why: Explain prompt {w.prompt_id}{opens}", query_params=q,
                     icon=":material/help:")
        c2.page_link("screens/acceptance.py", label=f"its rounds: Acceptance prompt {w.prompt_id}{opens}",
                     query_params=q, icon=":material/timeline:")

    st.subheader("Advice")
    advice = verdict.advice_line(trace_checks.recommendation(path))
    if advice:
        st.markdown(advice)
        st.caption("Against plain decoding, from this trace's timings (docs/EXPLAIN.md §4); the Explain page "
                   "shows the estimate per n_draft.")
    else:
        st.caption("No advice: the trace drafted nothing or has no timings.")

    st.subheader("Diagnose")
    target = v.suspect or path
    role = next((f.role for f in facts if f.path == target), "trace A")
    st.markdown(f"Diagnose runs every check on {role} (`{sel.short(target)}`): verify, the published "
                "configurations, a replay of its rounds under each convention variant, the advice — about 20 s.")
    st.page_link("screens/diagnose.py", label=f"Diagnose {role} (`{sel.short(target)}`)",
                  query_params={"trace": target}, icon=":material/troubleshoot:")
