"""Files: choose a drafter, an optional target, an optional trace (and an optional HF checkpoint)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from mtpscope.app import charts, formats, loaders, model_views, safety, views
from mtpscope.app import selection as sel
from mtpscope.app.guard import guard, status_line
from mtpscope.errors import MtpscopeError
from mtpscope.inspector.estimate import EstimateParams
from mtpscope.traces.store.layout import MANIFEST

st.title("Files")
sel.init_selection()
sel.demo_missing_hint()
roots = sel.roots()
st.caption("Allowed folders (add more with `MTPSCOPE_ROOTS`): " + " · ".join(f"`{r}`" for r in roots))

NONE = "—"


@st.cache_data(ttl=30, show_spinner=False)
def _candidates(roots_key: tuple[str, ...], kind: str) -> list[str]:
    if kind == "gguf":
        return [str(p) for p in safety.discover(roots_key, suffix=".gguf")]
    if kind == "trace":
        return [str(p) for p in safety.discover(roots_key, marker=MANIFEST)]
    if kind == "replay":
        return [str(p) for p in safety.discover(roots_key, marker="summary.json")]
    return [str(p) for p in safety.discover(roots_key, marker="config.json", max_depth=3)]


def _choose(slot: str, value: str | None) -> bool:
    """Put ``value`` into selection slot ``slot``: a trace also selects the models that recorded it; a path
    that cannot be selected (outside the allowed folders, missing, not a trace folder, a target model offered
    as the drafter: :func:`mtpscope.app.loaders.slot_refusal`) is refused, its reason kept for the page and
    the selection left as it was. True when chosen."""
    st.session_state.pop(sel.refused_key(slot), None)
    if value:
        why = loaders.slot_refusal(slot, value)
        if why:
            st.session_state[sel.refused_key(slot)] = (value, why)
            return False
    if slot == sel.TRACE:
        found = sel.select_trace(value)
        st.session_state[sel.FILES_MODELS_FROM_MANIFEST] = found
    else:
        sel.set_(slot, value)
    return True


def _unchanged(slot: str) -> bool:
    """True (and a line saying what is still selected) while a refusal is shown for ``slot``: the summary of
    the selection it did not replace is not shown under it."""
    if not st.session_state.get(sel.refused_key(slot)):
        return False
    cur = sel.get(slot)
    st.caption(f"The selection is unchanged: `{sel.short(cur)}`; choose another path (or clear the upload) to "
               "see its summary again." if cur else "Nothing is selected here.")
    return True


def _as_target(path: str) -> None:
    sel.set_(sel.TARGET, path)
    st.session_state.pop(sel.refused_key(sel.DRAFTER), None)


def _picker(slot: str, label: str, kind: str, optional: bool, upload: str | None) -> None:
    """Path completion (select from the allowed folders), a free path, and an optional upload."""
    cur = sel.get(slot) or ""
    found = _candidates(tuple(str(r) for r in roots), kind)
    if slot == sel.DRAFTER:  # drafters only; a target is refused with its reason when typed
        found = [p for p in found if loaders.is_drafter(p)]
    elif slot == sel.TARGET:
        found = [p for p in found if loaders.is_target(p)]
    options = [NONE] + found
    if cur and cur not in options:
        options.append(cur)
    pick_key, text_key, seen_key = sel.picker_keys(slot)
    # (re)sync both widgets whenever the selection changed elsewhere (upload, another page, first visit)
    if st.session_state.get(seen_key) != cur or pick_key not in st.session_state \
            or st.session_state.get(pick_key) not in options:
        st.session_state[pick_key] = cur if cur in options else NONE
    if st.session_state.get(seen_key) != cur or text_key not in st.session_state:
        st.session_state[text_key] = cur
    st.session_state[seen_key] = cur

    def on_pick() -> None:
        v = st.session_state[pick_key]
        _choose(slot, None if v == NONE else v)
        st.session_state[text_key] = sel.get(slot) or ""
        st.session_state[seen_key] = sel.get(slot) or ""

    def on_text() -> None:
        v = st.session_state[text_key].strip()
        if not _choose(slot, v or None):
            st.session_state[text_key] = sel.get(slot) or ""
        st.session_state[seen_key] = sel.get(slot) or ""

    c1, c2 = st.columns([3, 2])
    c1.selectbox(label + (" (optional)" if optional else ""), options, key=pick_key, on_change=on_pick,
                 format_func=lambda v: v if v == NONE else sel.short(v))
    c2.text_input("…or a path", key=text_key, on_change=on_text, placeholder="path under an allowed folder")
    if upload:
        up = st.file_uploader(f"…or upload a small {upload}", type=["gguf"] if upload == "GGUF" else ["zip"],
                              key=sel.upload_key(slot),
                              help=f"at most {safety.MAX_UPLOAD_BYTES // 2**20} MiB; stored under the uploads "
                                   "folder and read like any other file, never executed")
        # act once per uploaded file: the uploader keeps its file across reruns, and a later pick in
        # the select box must win over it; a refused upload stays refused until it is cleared
        if up is not None and st.session_state.get(sel.uploaded_key(slot)) != up.file_id:
            st.session_state[sel.uploaded_key(slot)] = up.file_id
            try:
                data = up.getvalue()
                if upload == "GGUF":   # not a GGUF: refused here, once, and nothing is stored or selected
                    loaders.check_gguf_upload(data, up.name)
                    p = safety.store_upload(data, up.name, safety.uploads_dir())
                else:
                    p = safety.extract_trace_zip(data, up.name, safety.uploads_dir())
            except (MtpscopeError, OSError) as e:
                st.session_state[sel.refused_key(slot)] = (up.name, f"upload refused: {status_line(e)}")
            else:
                if _choose(slot, str(p)):
                    st.rerun()
        elif up is None and st.session_state.pop(sel.uploaded_key(slot), None) is not None:
            refused = st.session_state.get(sel.refused_key(slot))
            if refused and refused[1].startswith("upload refused:"):  # the refused upload was cleared
                st.session_state.pop(sel.refused_key(slot), None)
    refused = st.session_state.get(sel.refused_key(slot))
    if refused:
        st.error(refused[1], icon=":material/block:")
        if slot == sel.DRAFTER and loaders.drafter_refusal(refused[0]):  # a target model: offer it as the target
            st.button("use it as the target instead", key=sel.FILES_AS_TARGET, on_click=_as_target,
                      args=(refused[0],))


def _gguf_summary(slot: str) -> None:
    path = sel.get(slot)
    if _unchanged(slot):
        return
    if not path:
        st.caption("none selected")
        return
    with guard("GGUF reader"):
        f = loaders.gguf(path)
        inv = loaders.inventory(path)
        cols = st.columns([3, 2, 2, 1, 1])
        cols[0].metric("architecture", f.architecture or "?")
        d = inv.dialect
        cols[1].metric("dialect", d.kind + (f" ({d.pattern})" if d.pattern else ""))
        cols[2].metric("size", charts.human_bytes(f.file_size))
        cols[3].metric("tensors", len(f.tensors))
        cols[4].metric("GGUF version", f.version)
        st.caption("dialect evidence: " + "; ".join(d.evidence))
        _verdict(slot, path)


def _verdict(slot: str, path: str) -> None:
    with guard("validation"):
        v = loaders.validation(path, sel.get(sel.TARGET) if slot == sel.DRAFTER else None)
        line = model_views.verdict_line(v)
        (st.success if v.ok else st.warning)(line)


def _recording(tr) -> None:
    """The recording's parameters from the manifest: models, n_draft, temperature, hidden dtype, runtime."""
    m = tr.manifest
    params = m.get("params") if isinstance(m.get("params"), dict) else {}
    dims = m.get("dims") if isinstance(m.get("dims"), dict) else {}
    rt = m.get("runtime") if isinstance(m.get("runtime"), dict) else {}
    rows = []
    for role, word in (("assistant", "drafter"), ("target", "target"), ("centroids", "centroid head")):
        p = views.model_path(m, role)
        if p:
            e = views.manifest_models(m).get(role, {})
            rows.append((word, f"`{sel.short(p)}` ({e.get('architecture', '?')}, {e.get('dialect', '?')})"))
    for key, word in (("n_draft", "n_draft"), ("temp", "temperature"), ("max_tokens", "max_tokens"),
                      ("top_k", "top_k"), ("top_p", "top_p"), ("seed", "seed")):
        if key in params:
            rows.append((word, f"{params[key]}"))
    if dims:
        rows.append(("hidden states", str(dims.get("hidden_dtype") or "not stored")))
    if rt:
        rows.append(("runtime", ", ".join(f"{k} {v}" for k, v in rt.items() if v is not None)))
    if rows:
        st.markdown("**Recorded with** — " + " · ".join(f"{w}: {v}" for w, v in rows))
    found = st.session_state.pop(sel.FILES_MODELS_FROM_MANIFEST, None)
    if found:
        st.caption("Selected the models that recorded this trace: "
                   + ", ".join(f"{slot} `{sel.short(p)}`" for slot, p in found.items()))


st.subheader("Drafter")
_picker(sel.DRAFTER, "drafter GGUF", "gguf", optional=False, upload="GGUF")
_gguf_summary(sel.DRAFTER)

st.subheader("Target")
_picker(sel.TARGET, "target GGUF", "gguf", optional=True, upload="GGUF")
_gguf_summary(sel.TARGET)

def _estimate() -> None:
    """Memory llama.cpp needs for the selected target (and drafter): weights, KV cache, buffers."""
    target = sel.get(sel.TARGET)
    if not target:
        st.caption("select a target to see the memory estimate")
        return
    n_ctx = st.number_input("n_ctx", min_value=256, max_value=1 << 20, value=EstimateParams().n_ctx, step=1024,
                            key=sel.FILES_N_CTX,
                            help="context size; f16 KV cache, flash attention, one sequence, CPU (llama-server's "
                                 "defaults); `mtpscope estimate` has every setting")
    with guard("memory estimate"):
        e = loaders.estimate(target, sel.get(sel.DRAFTER), int(n_ctx))
        _estimate_table(e)


def _estimate_table(e) -> None:
    rows = [{"device": dev, **{k: charts.human_bytes(v) for k, v in b.items()}} for dev, b in e.by_device.items()]
    st.table(pd.DataFrame(rows).set_index("device"))   # a static table: no data grid to load on the page's first visit
    t = e.target
    own = [x for x in t.kv_layers if x.reuses is None]
    line = (f"target KV {charts.human_bytes(t.kv)}: {sum(1 for x in own if not x.sliding)} full layers × "
            f"{e.cells_full} cells, {sum(1 for x in own if x.sliding)} sliding × {e.cells_swa} cells"
            + (f", {len(t.kv_layers) - len(own)} shared-KV layers hold none" if len(own) < len(t.kv_layers) else ""))
    if e.drafter is not None:
        line += (f" · drafter: weights {charts.human_bytes(e.drafter.weights)}, KV none (reads target layers "
                 f"{e.drafter.kv_shared_from['sliding']} / {e.drafter.kv_shared_from['full']})")
    st.caption(line + f" · total {charts.human_bytes(e.total)} · " + "; ".join(e.notes))


st.subheader("Memory estimate (llama.cpp)")
_estimate()

st.subheader("Trace")
_picker(sel.TRACE, "trace folder", "trace", optional=True, upload="trace .zip")
if _unchanged(sel.TRACE):
    pass
elif trace_path := sel.get(sel.TRACE):
    with guard("trace store"):
        tr = loaders.trace(trace_path)
        m = tr.manifest
        rep = None
        with guard("metrics"):
            rep = loaders.report(trace_path)
        cols = st.columns(5)
        cols[0].metric("source", str(m.get("source", "?")))
        cols[1].metric("prompts", len(views.manifest_prompts(m)))
        cols[2].metric("rounds", views.rounds_read(rep, m))     # (the rounds the metrics below read)
        cols[3].metric("complete", "yes" if m.get("complete") else "no")
        cols[4].metric("schema", m.get("schema_version", "?"))
        for w in tr.warnings[:20]:
            st.warning(w)
        _recording(tr)
        if rep is not None:
            st.success(f"acceptance rate {formats.percent(views.acceptance_rate(rep))} · mean acceptance length "
                       f"{formats.number(views.mean_acceptance_length(rep), 3)}")
else:
    st.caption("none selected")

with st.expander("Second trace and replay results (Compare page), Hugging Face checkpoint (Validate page)"):
    _picker(sel.TRACE_B, "trace B folder", "trace", optional=True, upload=None)
    _picker(sel.REPLAY, "replay output folder (mtpscope replay --out)", "replay", optional=True, upload=None)
    _picker(sel.CHECKPOINT, "Hugging Face checkpoint folder", "checkpoint", optional=True, upload=None)


with st.expander("Read a GGUF header from a URL (nothing else is downloaded)"):
    if not safety.urls_allowed():
        st.caption(f"off: start the app with `{safety.ALLOW_URLS_ENV}=1` to read `https://` / `hf://` URLs "
                   f"(hosts: {', '.join(safety.url_hosts())}; `{safety.URL_HOSTS_ENV}` changes the list)")
    else:
        url = st.text_input("URL", key=sel.FILES_URL, placeholder="hf://ORG/REPO/FILE.gguf or https://huggingface.co/…",
                            help="only the header is read, with HTTP range requests; hosts: "
                                 + ", ".join(safety.url_hosts())).strip()
        if url:
            with guard("remote GGUF"):
                r = loaders.remote_summary(url)
                f = r.file
                rcols = st.columns(4)
                rcols[0].metric("architecture", f.architecture or "?")
                rcols[1].metric("dialect", r.inventory.dialect.kind)
                rcols[2].metric("size", charts.human_bytes(f.file_size))
                rcols[3].metric("tensors", len(f.tensors))
                if r.n_requests:
                    st.caption(f"read {charts.human_bytes(r.n_bytes)} in {r.n_requests} requests")
                (st.success if r.report.ok else st.warning)(model_views.verdict_line(r.report))
                if r.estimate is not None:
                    _estimate_table(r.estimate)
