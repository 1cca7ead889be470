"""mtpscope app entry point: a router only (``mtpscope app``, or ``streamlit run app/main.py`` in a checkout).

Each page lives in app/screens/ (not app/pages/: a pages/ folder next to the entry script makes
Streamlit ignore st.navigation and run its legacy multipage mode) and is thin (widgets, library calls, figures from app/charts.py).
"""

from __future__ import annotations

import streamlit as st

from mtpscope.app import guard, selection, url_state

st.set_page_config(page_title="mtpscope", layout="wide")

FILES = st.Page("screens/files.py", title="Files", url_path="files")


def _home() -> None:
    """The app's root: open the Files page (the default page is served at "/" whatever its url_path says,
    so the Files page itself is not the default: that keeps /files a working deep link)."""
    st.switch_page(FILES)


PAGES = [
    st.Page(_home, title="mtpscope", default=True, url_path="home", visibility="hidden"),
    FILES,
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

page = st.navigation(PAGES)
url_state.arrive(page.url_path)  # a link's files are selected before the sidebar shows the selection
selection.sidebar()
refused = url_state.refusal()
if refused:  # a refused link: its one line, nothing of the page under it
    st.title(page.title)
    url_state.refuse(refused)
# last line of defence: an exception no block of the page caught is one line, not a traceback box
with guard.guard(f"showing the {page.title} page"):
    page.run()
