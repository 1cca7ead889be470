"""Tensors: the inventory table, bytes treemap, and the layer × tensor grid from validation."""

from __future__ import annotations

import streamlit as st

from mtpscope.app import charts, loaders, model_views
from mtpscope.app import selection as sel
from mtpscope.app.guard import guard

st.title("Tensors")
which = st.radio("file", [sel.DRAFTER, sel.TARGET], horizontal=True, key=sel.TENSORS_WHICH)
path = sel.selected_or_stop(which, f"Choose a {which} on the Files page.")

with guard("GGUF reader / inventory"):
    inv = loaders.inventory(path)
    df = model_views.inventory_frame(inv.entries)
    c = st.columns(4)
    c[0].metric("tensors", inv.n_tensors)
    c[1].metric("tensor bytes", charts.human_bytes(inv.n_bytes))
    c[2].metric("dialect", inv.dialect.kind)
    c[3].metric("layers", len(inv.layers))

    f1, f2, f3, f4 = st.columns([3, 2, 2, 2])
    glob = f1.text_input("name glob", key=sel.TENSORS_GLOB, placeholder="e.g. blk.3.* or attn_q")
    comps = f2.multiselect("component", sorted(df["component"].unique()), key=sel.TENSORS_COMPONENT)
    layers = f3.multiselect("layer", list(inv.layers), key=sel.TENSORS_LAYER)
    types = f4.multiselect("ggml type", sorted(df["type"].unique()), key=sel.TENSORS_TYPE)
    focus = st.toggle("only the drafter's own tensors (mtp.* / nextn.*)", key=sel.TENSORS_FOCUS,
                      help="only the drafter's own tensors (mtp.* in the fork's files, nextn.* in llama.cpp's)")
    shown = model_views.filter_inventory(df, glob, comps, layers, types, focus)
    st.caption(f"{len(shown)} of {len(df)} tensors · `ne` is GGUF order (innermost first), "
               "`shape` is numpy order (outermost first)")
    st.dataframe(shown, hide_index=True, width="stretch", height=min(600, 38 + 35 * max(1, len(shown))),
                 column_config={"n_bytes": st.column_config.NumberColumn("bytes", format="%d"),
                                "offset": st.column_config.NumberColumn("data offset", format="%d")})

    c1, c2 = st.columns(2)
    with c1:
        st.plotly_chart(charts.treemap_figure(df), key=sel.TENSORS_TREEMAP, width="stretch")
        st.caption("Where the file's bytes go: by component, then by ggml type.")
    with c2:
        present = [(e.tensor.name, e.tensor.shape) for e in inv.entries]
        missing: list[str] = []
        wrong: list[str] = []
        with guard("validation"):
            rep = loaders.validation(path)
            missing, wrong = model_views.grid_findings(rep)
        grid = model_views.layer_grid(present, missing, wrong)
        st.plotly_chart(charts.layer_grid_figure(grid), key=sel.TENSORS_GRID, width="stretch")
        st.caption("Each layer's tensors: present, missing or with a wrong shape against the expected layout.")
        if missing or wrong:
            st.caption(f"{len(missing)} missing, {len(wrong)} with a wrong shape (see Validate)")
