"""mtpscope app entry point: a router only (``streamlit run app/main.py``).

Each page lives in app/pages/ and is thin (widgets, library calls, figures from app/charts.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import streamlit as st  # noqa: E402

from app import state  # noqa: E402

st.set_page_config(page_title="mtpscope", page_icon="🔭", layout="wide")

PAGES = [
    st.Page("pages/files.py", title="Files", icon="📂", default=True, url_path="files"),
    st.Page("pages/tensors.py", title="Tensors", icon="🧱", url_path="tensors"),
    st.Page("pages/validate.py", title="Validate", icon="✅", url_path="validate"),
    st.Page("pages/centroids.py", title="Centroids", icon="🎯", url_path="centroids"),
    st.Page("pages/values.py", title="Tensor values", icon="📊", url_path="values"),
    st.Page("pages/acceptance.py", title="Acceptance", icon="📈", url_path="acceptance"),
    st.Page("pages/step.py", title="Step", icon="🔍", url_path="step"),
    st.Page("pages/compare.py", title="Compare", icon="⚖️", url_path="compare"),
]

page = st.navigation(PAGES)
state.sidebar()
page.run()
