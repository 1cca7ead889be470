"""mtpscope app entry point: a router only (``mtpscope app``, or ``streamlit run app/main.py`` in a checkout).

Each page lives in app/screens/ (not app/pages/: a pages/ folder next to the entry script makes
Streamlit ignore st.navigation and run its legacy multipage mode) and is thin (widgets, library calls, figures from app/charts.py).
"""

from __future__ import annotations

import streamlit as st

from mtpscope.app import guard, links, selection, trace_checks, url_state

st.set_page_config(page_title="mtpscope", layout="wide")

#: The start page, served at "/" (the default page; its url_path is not a deep link of its own).
START = st.Page("screens/start.py", title="Start", default=True, url_path="start")

PAGES = [
    START,
    st.Page("screens/files.py", title="Files", url_path="files"),
    st.Page("screens/tensors.py", title="Tensors", url_path="tensors"),
    st.Page("screens/validate.py", title="Validate", url_path="validate"),
    st.Page("screens/centroids.py", title="Centroids", url_path="centroids"),
    st.Page("screens/values.py", title="Tensor values", url_path="values"),
    st.Page("screens/acceptance.py", title="Acceptance", url_path="acceptance"),
    st.Page("screens/text.py", title="Text", url_path="text"),
    st.Page("screens/step.py", title="Step", url_path="step"),
    st.Page("screens/explain.py", title="Explain", url_path="explain"),
    st.Page("screens/compare.py", title="Compare", url_path="compare"),
    st.Page("screens/sweep.py", title="Sweep", url_path="sweep"),
    st.Page("screens/server.py", title="Server", url_path="server"),
    st.Page("screens/diagnose.py", title="Diagnose", url_path="diagnose"),
]

page = st.navigation(PAGES, expanded=True)  # every page listed: none hidden under "View more"
name = links.START if page is START else page.url_path
url_state.arrive(name)  # a link's files are selected before the sidebar shows the selection
selection.sidebar()
refused = url_state.refusal() or url_state.unknown_page(name)
if refused:  # a refused link: its one line, nothing of the page under it
    st.title(page.title)
    url_state.refuse(refused)
url_state.publish_selection(name)  # pages whose view is the selection: it is their address (trace pages add theirs)
if name in links.TRACE_PAGES:  # a drafter that fails verify is named above every trace page
    with guard.guard("checking the trace's drafter"):
        trace_checks.verify_banner((selection.TRACE, selection.TRACE_B) if name == "compare" else (selection.TRACE,))
if name in links.TRACE_PAGES or name == links.START:  # and an incomplete trace (the start page: both it shows)
    with guard.guard("reading the trace's state"):
        trace_checks.state_banner((selection.TRACE, selection.TRACE_B) if name in ("compare", links.START)
                                  else (selection.TRACE,))
# last line of defence: an exception no block of the page caught is one line, not a traceback box
with guard.guard(f"showing the {page.title} page"):
    page.run()
