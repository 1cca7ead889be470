"""Validate: findings by severity (expected vs actual), pairing, loadability, Hugging Face audit."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from mtpscope.app import loaders, model_views
from mtpscope.app import selection as sel
from mtpscope.app.guard import guard

st.title("Validate")
path = sel.selected_or_stop(sel.DRAFTER, "Choose a drafter on the Files page.")

target = sel.get(sel.TARGET)
hf_dir = sel.get(sel.CHECKPOINT)
c1, c2 = st.columns(2)
pair = c1.toggle("pair with the selected target", value=bool(target), disabled=not target, key=sel.VAL_PAIR)
audit = c2.toggle("audit the Hugging Face checkpoint", value=bool(hf_dir), disabled=not hf_dir, key=sel.VAL_HF)
st.caption(f"drafter `{sel.short(path)}`" + (f" · target `{sel.short(target)}`" if pair and target else "")
           + (f" · checkpoint `{sel.short(hf_dir)}`" if audit and hf_dir else ""))

SEV_ICON = {"error": ":material/error:", "warning": ":material/warning:", "info": ":material/info:"}


def _findings_frame(findings) -> pd.DataFrame:
    return pd.DataFrame([{"code": x.code, "subject": x.subject, "expected": str(x.expected),
                          "actual": str(x.actual), "message": x.message} for x in findings],
                        columns=["code", "subject", "expected", "actual", "message"])


with guard("validation"):
    rep = loaders.validation(path, target if pair else None, hf_dir if audit else None)
    (st.success if rep.ok else st.error)(model_views.verdict_line(rep))

    st.subheader("Loadability per runtime")
    cols = st.columns(len(rep.loadability) or 1)
    for col, v in zip(cols, rep.loadability):
        with col:
            word = {"refuses": "does not load", "unknown": "no rules for this file"}.get(v.outcome, v.outcome)
            show = st.success if v.outcome == "loads" else st.info if v.outcome == "unknown" else st.error
            show(f"**{v.runtime}**: {word}" + (f" — `{v.message}`" if v.message else ""))
            for r in v.reasons[:8]:
                st.markdown(f"- {r}")
            st.caption(f"basis: {v.basis}")

    st.subheader("Findings")
    counts = {s: sum(1 for x in rep.findings if x.severity == s) for s in ("error", "warning", "info")}
    st.caption(" · ".join(f"{SEV_ICON[s]} {n} {s}{'s' if n != 1 else ''}" for s, n in counts.items()))
    for sev in ("error", "warning", "info"):
        fs = [x for x in rep.findings if x.severity == sev]
        if not fs:
            continue
        with st.expander(f"{SEV_ICON[sev]} {sev}s ({len(fs)})", expanded=sev != "info"):
            st.dataframe(_findings_frame(fs), hide_index=True, width="stretch")

    if rep.pairing is not None:
        st.subheader("Pairing with the target")
        p = rep.pairing
        (st.success if p.ok else st.error)(("pairs" if p.ok else "does NOT pair") + f" with `{sel.short(p.target)}`")
        c1, c2 = st.columns(2)
        c1.markdown("**KV donors (llama.cpp rule)**: " + ", ".join(f"{k} → target layer {v}" for k, v in p.kv_donors.items()))
        c2.markdown("**KV donors (HF rule)**: " + ", ".join(f"{k} → target layer {v}" for k, v in p.kv_donors_hf.items()))
        if p.findings:
            st.dataframe(_findings_frame(p.findings), hide_index=True, width="stretch")
    elif target:
        st.caption("Pairing: switch on “pair with the selected target” above.")
    else:
        st.caption("Pairing: choose a target on the Files page.")

    if rep.hf_audit is not None:
        st.subheader("Hugging Face audit")
        a = rep.hf_audit
        fs = list(a.findings)
        rows = list(a.rows)
        bad = [r for r in rows if r.status not in ("ok", "dropped")]
        st.caption(f"checkpoint `{sel.short(a.hf_dir)}` vs `{sel.short(path)}` "
                   f"({a.dialect} dialect): {len(rows)} checkpoint tensors, "
                   f"{sum(r.status == 'ok' for r in rows)} ok, {sum(r.status == 'dropped' for r in rows)} dropped "
                   f"by the converter, {len(bad)} other")
        if fs:
            st.dataframe(_findings_frame(fs), hide_index=True, width="stretch")
        else:
            st.success("the checkpoint and the GGUF agree")
        if rows:
            st.dataframe(pd.DataFrame([{
                "hf_name": r.hf_name, "dtype": r.hf_dtype, "shape (numpy)": "×".join(map(str, r.hf_shape)),
                "gguf_name": r.gguf_name, "expected ne": "×".join(map(str, r.expected_ne)),
                "found ne": "" if r.found_ne is None else "×".join(map(str, r.found_ne)),
                "found type": r.found_type or "", "status": r.status, "note": r.note} for r in rows]),
                hide_index=True, width="stretch", height=min(500, 38 + 35 * len(rows)), key=sel.VAL_HF_ROWS)
        cfg = dict(a.config)
        if cfg:
            st.markdown("**config.json vs GGUF keys**")
            st.dataframe(pd.DataFrame([{"GGUF key": k, "config.json": str(v.get("hf")), "GGUF": str(v.get("gguf")),
                                        "ok": bool(v.get("ok"))} for k, v in cfg.items()]),
                         hide_index=True, width="stretch", key=sel.VAL_HF_CONFIG)
        only = dict(a.gguf_only)
        if only:
            st.markdown("**GGUF tensors with no checkpoint source**")
            st.dataframe(pd.DataFrame({"tensor": list(only), "why": list(only.values())}), hide_index=True,
                         width="stretch", key=sel.VAL_HF_ONLY)
    elif not hf_dir:
        st.caption("Hugging Face audit: give a checkpoint folder (config.json + safetensors) on the Files page.")
