"""Tensors: the inventory table, bytes treemap, and the layer × tensor grid from validation."""

from __future__ import annotations

import streamlit as st

from mtpscope.app import charts, state, views

st.title("Tensors")
which = st.radio("file", ["drafter", "target"], horizontal=True, key="w.tensors.which")
path = state.selected_or_stop(which, f"Choose a {which} on the Files page.")

with state.guard("GGUF reader / inventory"):
    inv = state.inventory(path)
    df = views.inventory_frame(inv.entries)
    c = st.columns(4)
    c[0].metric("tensors", inv.n_tensors)
    c[1].metric("tensor bytes", charts.human_bytes(inv.n_bytes))
    c[2].metric("dialect", inv.dialect.kind)
    c[3].metric("layers", len(inv.layers))

    f1, f2, f3, f4 = st.columns([3, 2, 2, 2])
    glob = f1.text_input("name glob", key="w.tensors.glob", placeholder="e.g. blk.3.* or attn_q")
    comps = f2.multiselect("component", sorted(df["component"].unique()), key="w.tensors.comp")
    layers = f3.multiselect("layer", list(inv.layers), key="w.tensors.layer")
    types = f4.multiselect("ggml type", sorted(df["type"].unique()), key="w.tensors.type")
    focus = st.toggle("only the drafter's own tensors (mtp.* / nextn.*)", key="w.tensors.focus",
                      help="only the drafter's own tensors (mtp.* in the fork's files, nextn.* in llama.cpp's)")
    shown = views.filter_inventory(df, glob, comps, layers, types, focus)
    st.caption(f"{len(shown)} of {len(df)} tensors · `ne` is GGUF order (innermost first), "
               "`shape` is numpy order (outermost first)")
    st.dataframe(shown, hide_index=True, width="stretch", height=min(600, 38 + 35 * max(1, len(shown))),
                 column_config={"n_bytes": st.column_config.NumberColumn("bytes", format="%d"),
                                "offset": st.column_config.NumberColumn("data offset", format="%d")})

    c1, c2 = st.columns(2)
    with c1:
        st.plotly_chart(charts.treemap_figure(df), key="tensors.treemap", width="stretch")
        st.caption("Where the file's bytes go: by component, then by ggml type.")
    with c2:
        present = [(e.tensor.name, e.tensor.shape) for e in inv.entries]
        missing: list[str] = []
        wrong: list[str] = []
        with state.guard("validation"):
            rep = state.validation(path)
            missing, wrong = state.grid_findings(rep)
        grid = views.layer_grid(present, missing, wrong)
        st.plotly_chart(charts.layer_grid_figure(grid), key="tensors.grid", width="stretch")
        st.caption("Each layer's tensors: present, missing or with a wrong shape against the expected layout.")
        if missing or wrong:
            st.caption(f"{len(missing)} missing, {len(wrong)} with a wrong shape (see Validate)")
