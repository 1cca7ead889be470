"""Tensor values: histogram and a downsampled heatmap of a row slice of any tensor (dequantized)."""

from __future__ import annotations

import numpy as np
import streamlit as st

from mtpscope.app import charts, links, loaders, model_views, url_state
from mtpscope.app import selection as sel
from mtpscope.app.guard import guard
from mtpscope.errors import LinkError

st.title("Tensor values")
#: Most elements read for one view (a row slice of a big matrix, never the whole tensor).
MAX_ELEMENTS = 4_000_000

view = url_state.requested("values")
if view is not None and view.tensor is not None:  # a link's tensor is the drafter's
    st.session_state[sel.VALUES_WHICH] = sel.DRAFTER
which = st.radio("file", [sel.DRAFTER, sel.TARGET], horizontal=True, key=sel.VALUES_WHICH)
path = sel.selected_or_stop(which, f"Choose a {which} on the Files page.", hint=False)

with guard("GGUF reader"):
    f = loaders.gguf(path)
    names = [t.name for t in f.tensors]
    if not names:
        st.info("This file has no tensors.")
        st.stop()
    if view is not None and view.tensor is not None:
        if view.tensor not in names:
            url_state.refuse(LinkError(f"no such tensor in {sel.short(path)}", key="tensor",
                                       expected=f"one of its {len(names)} tensors", actual=repr(view.tensor)))
        st.session_state[sel.VALUES_TENSOR] = view.tensor
    default = next((n for n in names if n.startswith(("mtp.", "nextn."))), names[0])
    if st.session_state.get(sel.VALUES_TENSOR) not in names:
        st.session_state[sel.VALUES_TENSOR] = default
    name = st.selectbox("tensor", names, key=sel.VALUES_TENSOR)
    # the address: the selected models and, for the drafter, the tensor shown (a link's tensor is the drafter's)
    url_state.publish(links.View("values", drafter=sel.get(sel.DRAFTER), target=sel.get(sel.TARGET),
                                 tensor=name if which == sel.DRAFTER else None))
    t = f.tensor(name)
    shape = tuple(int(x) for x in t.shape)
    n_rows = shape[0] if shape else 1
    per_row = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    max_rows = max(1, min(n_rows, MAX_ELEMENTS // max(1, per_row)))
    st.caption(f"{t.type_name} · ne (GGUF order) {list(t.ne)} · numpy shape {list(shape)} · "
               f"{charts.human_bytes(t.n_bytes)} · data offset {t.offset}")
    c1, c2 = st.columns(2)
    count = int(c2.number_input("rows", 1, max_rows, min(max_rows, 256 if len(shape) > 1 else max_rows),
                                key=sel.values_count_key(name)))
    start = int(c1.number_input("first row (numpy dim 0)", 0, max(0, n_rows - 1), 0, key=sel.values_start_key(name)))
    stop = min(n_rows, start + count)
    a = f.tensor_data(name, rows=slice(start, stop))
    a = np.asarray(a)
    if a.dtype.kind not in "fiu":
        st.info(f"dtype {a.dtype} cannot be plotted")
        st.stop()
    stats = model_views.value_stats(a)
    for row in (("min", "max", "mean"), ("std", "zeros", "non_finite")):  # three wide boxes: no value is cut
        for col, key in zip(st.columns(3), row):
            v = stats.get(key)
            col.metric(key, "—" if v is None else f"{v:.1%}" if key == "zeros" else f"{int(v):,}"
                       if key == "non_finite" else model_views.compact_number(v),
                       help=None if v is None or key in ("zeros", "non_finite") else f"{v!r}")
    log_y = st.toggle("log counts", key=sel.VALUES_LOG)
    st.plotly_chart(charts.histogram_figure(a, title=f"{name} rows {start}–{stop - 1}", log_y=log_y),
                    key=sel.VALUES_HIST, width="stretch")
    st.caption("How the values of these rows are spread (quantized types dequantized to float32).")
    if a.ndim >= 2:
        st.plotly_chart(charts.heatmap_figure(a.reshape(a.shape[0], -1), row_offset=start, title=name),
                        key=sel.VALUES_HEAT, width="stretch")
    else:
        st.plotly_chart(charts.heatmap_figure(a[None, :], title=f"{name} (1-D)"), key=sel.VALUES_HEAT, width="stretch")
    st.caption("The same rows as colours (blue positive, red negative), block-averaged to fit when large.")
