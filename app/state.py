"""App-wide selection, allowed roots and cached loaders (the only stateful app module).

Selection lives in ``st.session_state`` under non-widget keys (``sel.drafter``, ``sel.target``,
``sel.trace``, ``sel.trace_b``, ``sel.checkpoint``, ``sel.round``) so it survives page switches; the
demo is preselected when the demo files exist.

Readers, inventories, traces and reports are cached with ``st.cache_resource`` keyed by the resolved
path, the file size and mtime (for a trace: the manifest's and every part's size and mtime), so an
edited or rebuilt file is re-read and an unchanged one is not. Every path goes through
:func:`mtpscope.app.safety.check_path` first.

Errors: :func:`guard` turns an mtpscope error (or an OS error) into the inspector's one-line message
in the page; anything else is a bug: it is shown as one ``internal error (Type: message) while
<what> — please report`` line instead of a traceback (set ``MTPSCOPE_DEBUG=1`` to let it propagate).

Imports: streamlit, the pure app helpers, mtpscope.inspector, mtpscope.traces (inside the trace
loaders), mtpscope.demo.spec, mtpscope.cache, mtpscope.errors.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import streamlit as st

from mtpscope.app import safety
from mtpscope.app.tokens import TokenText
from mtpscope.demo.spec import RECORD_CONFIG, DemoPaths
from mtpscope.errors import MtpscopeError
from mtpscope.inspector.centroids import CentroidHead, find_centroid_tensors
from mtpscope.inspector.gguf import open_gguf
from mtpscope.inspector.inventory import build_inventory
from mtpscope.inspector.validate import verify
from mtpscope.traces.analysis.wording import plural

# mtpscope.traces.store.store / .metrics / .replay are imported inside the trace loaders: they pull in pyarrow
# and duckdb, which the model pages never need.

SEL_KEYS = ("drafter", "target", "trace", "trace_b", "checkpoint", "replay")


@contextlib.contextmanager
def guard(what: str = "") -> Iterator[None]:
    """Show mtpscope / OS errors as one line (``st.error``) and anything else as one ``internal error``
    line (:func:`internal_error_line`); the rest of the ``with`` block is skipped."""
    try:
        yield
    except MtpscopeError as e:
        st.error(e.one_line(), icon=":material/error:")
    except OSError as e:
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        st.error(f"{where}{e.strerror or e}", icon=":material/error:")
    except Exception as e:  # noqa: BLE001 - last line of defence: one line, never a traceback
        if os.environ.get("MTPSCOPE_DEBUG"):
            raise
        st.error(internal_error_line(e, what), icon=":material/bug_report:")


def internal_error_line(e: BaseException, what: str = "") -> str:
    """One line for an unexpected exception: ``internal error (Type: message) while <what> — please
    report`` (the message collapsed to one line and cut at 300 characters)."""
    msg = " ".join(str(e).split())
    if len(msg) > 300:
        msg = msg[:297] + "..."
    body = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
    return f"internal error ({body}) while {what or 'rendering this page'} — please report"


# --------------------------------------------------------------------- manifest fields, defensively

def manifest_models(tr: Any) -> dict[str, dict]:
    """The trace manifest's ``models`` entries that are objects (role -> dict); entries of any other
    type (a malformed manifest) are left out. ``{}`` when there is no trace or no ``models`` object."""
    m = getattr(tr, "manifest", None) if tr is not None else None
    models = m.get("models") if isinstance(m, dict) else None
    if not isinstance(models, dict):
        return {}
    return {str(k): v for k, v in models.items() if isinstance(v, dict)}


def model_path(tr: Any, role: str) -> str | None:
    """``manifest.models[role].path`` when it is a non-empty string, else None."""
    v = manifest_models(tr).get(role, {}).get("path")
    return v if isinstance(v, str) and v.strip() and "\x00" not in v else None


def manifest_prompts(tr: Any) -> list[dict]:
    """The trace manifest's ``prompts`` entries that are objects with an integer ``prompt_id``
    (an int, or a string of digits); malformed entries are left out. Each returned dict has an
    ``int`` prompt_id and a ``str`` text."""
    from mtpscope.app import views

    m = getattr(tr, "manifest", None) if tr is not None else None
    prompts = m.get("prompts") if isinstance(m, dict) else None
    return views.clean_prompts(prompts)


# ------------------------------------------------------------------------------ roots and selection

def roots() -> tuple[Path, ...]:
    """The allowed folders: working directory and demo cache, plus ``MTPSCOPE_ROOTS`` (see
    :func:`app.safety.allowed_roots`)."""
    return safety.allowed_roots()


def demo_paths() -> DemoPaths:
    """Where the demo's files are (:class:`mtpscope.demo.spec.DemoPaths` under the cache's demo folder;
    they may not exist yet)."""
    from mtpscope.cache import demo_dir

    return DemoPaths.under(demo_dir(), RECORD_CONFIG)


def init_selection() -> None:
    """Preselect the demo (once per session) for every selection slot that is still unset: the trained
    pair's F32 trace with its buggy trace as trace B (``demo.json``'s default view; without it the
    constructed clean and noisy traces), the models that recorded trace A (from its manifest, when
    readable and allowed) — never trace B = trace A."""
    if st.session_state.get("sel._init"):
        return
    st.session_state["sel._init"] = True
    demo = demo_paths()
    defaults = {"drafter": demo.drafter_fork, "target": demo.target, "trace": demo.traces_clean,
                "trace_b": demo.traces_noisy, "checkpoint": None, "replay": None}
    defaults.update(_trained_defaults(demo.root))   # the trained pair's view, when it is built

    def ok(v) -> bool:
        return v is not None and Path(v).exists() and safety.is_allowed(v, roots())

    trace_now = st.session_state.get("sel.trace", str(defaults["trace"]) if ok(defaults["trace"]) else None)
    if trace_now:
        defaults.update({k: Path(v) for k, v in recorded_models(trace_now).items()})
    default_b = "sel.trace_b" not in st.session_state
    for k, v in defaults.items():
        key = f"sel.{k}"
        if key not in st.session_state:
            st.session_state[key] = str(v) if ok(v) else None
    a, b = st.session_state.get("sel.trace"), st.session_state.get("sel.trace_b")
    if default_b and a and b and _same(a, b):  # a default B is never A (a B the user chose is theirs)
        other = next((str(t) for t in (demo.traces_noisy, demo.traces_clean) if ok(t) and not _same(t, a)), None)
        st.session_state["sel.trace_b"] = other


def _same(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return str(a) == str(b)


def recorded_models(trace_path: str | os.PathLike[str]) -> dict[str, str]:
    """``{"drafter": path, "target": path}`` of the models a trace's manifest names (its ``assistant``
    and ``target`` entries) that exist and are allowed; read from ``manifest.json`` only (nothing else
    of the trace), so an unreadable trace gives ``{}``."""
    import json

    out: dict[str, str] = {}
    try:
        m = json.loads((Path(trace_path) / "manifest.json").read_text())
    except (OSError, ValueError):
        return out
    models = m.get("models") if isinstance(m, dict) else None
    if not isinstance(models, dict):
        return out
    for role, slot in (("assistant", "drafter"), ("target", "target")):
        e = models.get(role)
        p = e.get("path") if isinstance(e, dict) else None
        if isinstance(p, str) and p and "\x00" not in p and Path(p).is_file() and safety.is_allowed(p, roots()):
            out[slot] = str(Path(p))
    return out


def select_trace(path: str | None) -> dict[str, str]:
    """Select a trace and, when its manifest names models that are readable and allowed, the drafter
    and target that recorded it; when trace B was this trace, B becomes the previous trace A. Returns
    the models it selected (slot -> path)."""
    previous = get("trace")
    set_("trace", path)
    if not path:
        return {}
    found = recorded_models(path)
    for slot, p in found.items():
        set_(slot, p)
    if get("trace_b") and _same(get("trace_b"), path):  # never B = A: B becomes the trace A was
        set_("trace_b", previous if previous and not _same(previous, path) else None)
    return found


def _trained_defaults(root: Path) -> dict[str, Any]:
    """The trained demo's default view from ``<demo>/demo.json`` (trace, trace B, drafter, target), and
    the Acceptance page's prompt preset to the worst category's worst prompt; {} when absent."""
    import json

    try:
        doc = json.loads((root / "demo.json").read_text())
        d = doc.get("default") if isinstance(doc, dict) else None
    except (OSError, ValueError):
        return {}
    if not isinstance(d, dict):
        return {}
    out: dict[str, Any] = {}
    for k in ("trace", "trace_b", "drafter", "target"):
        v = d.get(k)
        if isinstance(v, str) and v and (root / v).exists():
            out[k] = root / v
    pid = d.get("prompt_id")
    if "trace" in out and isinstance(pid, int) and not isinstance(pid, bool) and "w.acc.prompt" not in st.session_state:
        st.session_state["w.acc.prompt"] = pid
    return out


def get(name: str) -> str | None:
    """The selected path for ``name`` (one of :data:`SEL_KEYS`), or None."""
    init_selection()
    v = st.session_state.get(f"sel.{name}")
    return v or None


def set_(name: str, value: str | None) -> None:
    """Select a path (no check here; loaders check)."""
    st.session_state[f"sel.{name}"] = value or None


def demo_missing_hint() -> None:
    """An info box when the demo has not been built."""
    if not demo_paths().target.exists():
        st.info("The built-in demo is not built yet: run `mtpscope demo build` (or `make run`).", icon=":material/info:")


def selected_or_stop(name: str, message: str, hint: bool = True) -> str:
    """The selected path for ``name`` (see :func:`get`); without one, ``message`` as an info box (and,
    with ``hint``, :func:`demo_missing_hint`) and the page stops there (``st.stop``)."""
    path = get(name)
    if not path:
        st.info(message)
        if hint:
            demo_missing_hint()
        st.stop()
    return path


# -------------------------------------------------------------------------------------- loaders

def _stat_key(p: Path) -> tuple[int, int]:
    s = p.stat()
    return s.st_size, s.st_mtime_ns


@st.cache_resource(max_entries=16, show_spinner=False)
def _open_gguf(path: str, size: int, mtime_ns: int):
    return open_gguf(path)


def gguf(path: str | os.PathLike[str]):
    """The reader (``GGUFFile``) for an allowed path, cached by (path, size, mtime).

    Raises:
        PathNotAllowedError, InspectorError (missing / unreadable / malformed).
    """
    p = safety.check_path(path, roots(), kind="file")
    return _open_gguf(str(p), *_stat_key(p))


@st.cache_resource(max_entries=16, show_spinner=False)
def _inventory(path: str, size: int, mtime_ns: int):
    return build_inventory(_open_gguf(path, size, mtime_ns))


def inventory(path: str | os.PathLike[str]):
    """``build_inventory`` of an allowed GGUF, cached by (path, size, mtime)."""
    p = safety.check_path(path, roots(), kind="file")
    return _inventory(str(p), *_stat_key(p))


def _trace_key(p: Path) -> tuple:
    items: list[tuple] = []
    man = p / "manifest.json"
    if man.exists():
        items.append(("manifest.json", *_stat_key(man)))
    for sub in ("rounds", "steps", "requests"):
        d = p / sub
        if d.is_dir():
            for f in sorted(d.iterdir()):
                with contextlib.suppress(OSError):
                    items.append((f"{sub}/{f.name}", *_stat_key(f)))
    return tuple(items)


@st.cache_resource(max_entries=8, show_spinner=False)
def _open_trace(path: str, key: tuple):
    from mtpscope.traces.store.store import open_trace

    return open_trace(path)


def trace(path: str | os.PathLike[str]):
    """The opened trace (``mtpscope.traces.store.store.Trace``) for an allowed directory, cached by the manifest's
    and every part's (name, size, mtime)."""
    p = safety.check_path(path, roots(), kind="dir")
    return _open_trace(str(p), _trace_key(p))


@st.cache_resource(max_entries=8, show_spinner=False)
def _report(path: str, key: tuple):
    from mtpscope.traces.analysis.metrics import report

    return report(_open_trace(path, key))


def report(path: str | os.PathLike[str]):
    """``mtpscope.traces.analysis.metrics.report`` of an allowed trace, cached like :func:`trace`."""
    p = safety.check_path(path, roots(), kind="dir")
    return _report(str(p), _trace_key(p))


@st.cache_resource(max_entries=8, show_spinner=False)
def _decoder(path: str, size: int, mtime_ns: int) -> TokenText:
    f = _open_gguf(path, size, mtime_ns)
    toks = f.get("tokenizer.ggml.tokens")
    if toks is None:
        return TokenText(None, source=f"{path} (no tokenizer.ggml.tokens)")
    return TokenText(toks, source=path)


def decoder(*candidates: str | os.PathLike[str] | None) -> TokenText:
    """A token decoder from the first candidate GGUF that is allowed, readable and has a vocabulary
    (the selected drafter, then the target, then the models named in the trace); without one,
    ids are shown as ``#id``."""
    seen: list[str] = []
    for c in candidates:
        if not c or str(c) in seen:
            continue
        seen.append(str(c))
        try:
            p = safety.check_path(c, roots(), kind="file")
            dec = _decoder(str(p), *_stat_key(p))
        except (MtpscopeError, OSError):
            continue
        if dec.n_vocab:
            return dec
    return TokenText(None, source="no vocabulary available: ids shown as #id")


def trace_decoder(tr) -> TokenText:
    """Decoder for a trace's tokens: selected drafter, selected target, then the trace's models."""
    named = [model_path(tr, k) for k in ("assistant", "target")]
    return decoder(get("drafter"), get("target"), *named)


def status_line(e: BaseException) -> str:
    """One line for an error (mtpscope errors give their own)."""
    if isinstance(e, MtpscopeError):
        return e.one_line()
    return f"{type(e).__name__}: {e}"


def sidebar() -> None:
    """Current selection in the sidebar (short names; the full paths are on the Files page)."""
    init_selection()
    with st.sidebar:
        st.caption("Selection")
        for k, label in (("drafter", "drafter"), ("target", "target"), ("trace", "trace"), ("trace_b", "trace B")):
            v = get(k)
            st.caption(f"**{label}**: `{short(v)}`" if v else f"**{label}**: —")


def short(path: str | os.PathLike[str] | None) -> str:
    """A path shown relative to the demo folder or the working directory when it lies below one."""
    if not path:
        return "—"
    p = Path(path)
    for base, tag in ((demo_paths().root, "demo/"), (safety.uploads_dir(), "uploads/"), (Path.cwd(), "")):
        try:
            return tag + str(p.resolve().relative_to(base.resolve()))
        except ValueError:
            continue
    return str(p)


# ------------------------------------------------------------------------ report field access

def _num(v: Any) -> float:
    return float("nan") if v is None else float(v)


def acceptance_rate(rep: dict) -> float:
    """``report()['acceptance_rate']`` as a float (NaN when the report says None)."""
    return _num(rep.get("acceptance_rate"))


def mean_acceptance_length(rep: dict) -> float:
    """``report()['mean_acceptance_length']`` as a float (NaN when None)."""
    return _num(rep.get("mean_acceptance_length"))


def per_position(rep: dict):
    """``report()['per_position']`` as a DataFrame (k, n_rounds, n_accepted, acceptance, conditional)."""
    import pandas as pd

    df = pd.DataFrame(rep.get("per_position") or [],
                      columns=["k", "n_rounds", "n_accepted", "acceptance", "conditional"])
    return df.astype({"acceptance": float, "conditional": float})


# --------------------------------------------------------------------------------- validation

@st.cache_resource(max_entries=16, show_spinner=False)
def _validation(path: str, key: tuple, target: str | None, tkey: tuple | None, hf_dir: str | None, hkey: tuple | None):
    f = _open_gguf(path, *key)
    t = _open_gguf(target, *tkey) if target else None
    return verify(f, target=t, hf_dir=hf_dir)


def _dir_key(p: Path) -> tuple:
    items = []
    with contextlib.suppress(OSError):
        for f in sorted(p.iterdir())[:200]:
            with contextlib.suppress(OSError):
                items.append((f.name, *_stat_key(f)))
    return tuple(items)


def validation(path: str | os.PathLike[str], target: str | os.PathLike[str] | None = None,
               hf_dir: str | os.PathLike[str] | None = None):
    """``mtpscope.inspector.validate.verify`` of an allowed GGUF (optionally paired with an allowed target and
    audited against an allowed HF checkpoint folder), cached by the files' (path, size, mtime)."""
    p = safety.check_path(path, roots(), kind="file")
    t = safety.check_path(target, roots(), kind="file") if target else None
    h = safety.check_hf_dir(safety.check_path(hf_dir, roots(), kind="dir")) if hf_dir else None
    if t is not None and t == p:
        t = None
    return _validation(str(p), _stat_key(p), str(t) if t else None, _stat_key(t) if t else None,
                       str(h) if h else None, _dir_key(h) if h else None)


def verdict_ok(rep: Any) -> bool:
    """True when the validation report has no error finding."""
    return bool(getattr(rep, "ok", False))


def verdict_line(rep: Any) -> str:
    """One line: dialect, error / warning counts, loadability per runtime, pairing."""
    errs = len(rep.errors)
    warns = len(rep.warnings)
    head = ("✓ valid" if rep.ok else "✗ invalid") + f" {rep.dialect} file: {plural(errs, 'error')}, " \
        f"{plural(warns, 'warning')}"
    loads = []
    for v in rep.loadability:
        word = {"refuses": "does not load", "unknown": "no rules"}.get(v.outcome, v.outcome)
        loads.append(f"{v.runtime.split(' (')[0]} {word}")
    parts = [head, "; ".join(loads)]
    if rep.pairing is not None:
        parts.append("pairs with the target" if rep.pairing.ok else "does NOT pair with the target")
    if errs:
        first = rep.errors[0]
        parts.append(f"first error: {first.code} {first.subject}: {first.message}")
    return " · ".join(parts)


MISSING_CODES = ("E_TENSOR_MISSING",)
SHAPE_CODES = ("E_TENSOR_SHAPE", "E_PROJ_SHAPE", "E_CENTROID_SHAPE", "E_CENTROID_TRANSPOSED", "E_TOKEN_EMBD_SHAPE")


def grid_findings(rep: Any) -> tuple[list[str], list[str]]:
    """(missing tensor names, wrong-shape tensor names) from a validation report's findings."""
    missing = [x.subject for x in rep.findings if x.code in MISSING_CODES and x.subject]
    wrong = [x.subject for x in rep.findings if x.code in SHAPE_CODES and x.subject]
    return missing, wrong


# ----------------------------------------------------------------------------------- centroids

@st.cache_resource(max_entries=8, show_spinner=False)
def _centroid_head(path: str, size: int, mtime_ns: int):
    return CentroidHead.from_gguf(_open_gguf(path, size, mtime_ns))


def centroid_head(path: str | os.PathLike[str]):
    """``mtpscope.inspector.centroids.CentroidHead`` of an allowed GGUF, cached by (path, size, mtime).

    Raises:
        LayoutError: the file has no centroid head.
    """
    p = safety.check_path(path, roots(), kind="file")
    return _centroid_head(str(p), *_stat_key(p))


@st.cache_resource(max_entries=8, show_spinner=False)
def _coverage(tpath: str, tkey: tuple, gpath: str, size: int, mtime_ns: int):
    from mtpscope.app import views

    tr = _open_trace(tpath, tkey)
    head = _centroid_head(gpath, size, mtime_ns)
    steps = tr.columns("steps", ["centroid_ids", "target_token"])
    return views.centroid_coverage(steps, head.n_centroids, head.token_to_centroid)


def coverage(trace_path: str | os.PathLike[str], drafter_path: str | os.PathLike[str]):
    """Per-centroid chosen / target-home / covered counts of a trace against a drafter's head
    (:func:`mtpscope.app.views.centroid_coverage`), cached by both inputs' keys."""
    t = safety.check_path(trace_path, roots(), kind="dir")
    g = safety.check_path(drafter_path, roots(), kind="file")
    return _coverage(str(t), _trace_key(t), str(g), *_stat_key(g))


def has_centroid_head(path: str | os.PathLike[str]) -> bool:
    """True when the allowed GGUF at ``path`` has a centroid matrix and a token ordering
    (``mtpscope.inspector.centroids.find_centroid_tensors``); False when not, or unreadable / not allowed."""
    try:
        c, o = find_centroid_tensors(gguf(path))
    except (MtpscopeError, OSError):
        return False
    return c is not None and o is not None


# -------------------------------------------------------------------------------------- replay

@st.cache_resource(max_entries=4, show_spinner=False)
def _replay(path: str, key: tuple):
    from mtpscope.traces.run.replay import read_replay  # its reader lives with its writer

    return read_replay(path)


def replay(path: str | os.PathLike[str]):
    """(summary dict, steps DataFrame) of an allowed replay output folder (``mtpscope replay --out``:
    ``summary.json`` + ``steps.parquet``), cached by the folder's file stats. JSON and Parquet only."""
    p = safety.check_path(path, roots(), kind="dir")
    return _replay(str(p), _dir_key(p))


def resolve_near(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> Path | None:
    """A path written by another command (absolute, relative to the working directory, or relative to
    ``folder`` by its last parts), resolved to an existing allowed folder, else None."""
    p = Path(path)
    tries = [p] if p.is_absolute() else [Path.cwd() / p, Path(folder) / p,
                                         Path(folder) / p.parent.name / p.name, Path(folder) / p.name]
    for c in tries:
        if c.is_dir() and safety.is_allowed(c, roots()):
            return c.resolve()
    return None


# ------------------------------------------------------------------- URLs and the memory estimate (issue 16)


@st.cache_resource(max_entries=4, ttl=600, show_spinner="reading the GGUF header over HTTP…")
def _remote(url: str):
    from mtpscope.cache import layout_hints
    from mtpscope.inspector.remote import RemoteOptions
    from mtpscope.inspector.shards import open_model

    return open_model(url, remote=RemoteOptions(timeout_s=20.0, retries=1, layout_hints=layout_hints()))


def remote_gguf(url: str):
    """The GGUF at ``url`` (header only), after :func:`mtpscope.app.safety.check_url` (switch + host
    allow-list); cached ten minutes per URL."""
    return _remote(safety.check_url(url))


@st.cache_resource(max_entries=4, ttl=600, show_spinner=False)
def _remote_report(url: str) -> dict[str, Any]:
    from mtpscope.inspector.estimate import EstimateParams, estimate as run

    f = _remote(url)
    readers = [getattr(x, "reader", None) for x in (getattr(f, "shards", None) or (f,))]
    logs = [r.log for r in readers if r is not None and hasattr(r, "log")]
    return {"file": f, "inventory": build_inventory(f), "report": verify(f),
            "estimate": run(f, None, EstimateParams(n_ctx=8192)) if f.architecture == "gemma4" else None,
            "requests": sum(x.n_requests for x in logs), "bytes": sum(x.n_bytes for x in logs)}


def remote_report(url: str) -> dict[str, Any]:
    """For the Files page's URL field: ``file``, ``inventory``, ``report`` (verify), ``estimate`` (a target
    at n_ctx 8192, else None), ``requests`` / ``bytes`` read; after :func:`mtpscope.app.safety.check_url`."""
    return _remote_report(safety.check_url(url))


@st.cache_resource(max_entries=8, show_spinner=False)
def _estimate(target: str, tkey: tuple, drafter: str | None, dkey: tuple | None, n_ctx: int):
    from mtpscope.inspector.estimate import EstimateParams, estimate as run

    t = _open_gguf(target, *tkey)
    d = _open_gguf(drafter, *dkey) if drafter else None
    return run(t, d, EstimateParams(n_ctx=n_ctx))


def estimate(target: str | os.PathLike[str], drafter: str | os.PathLike[str] | None, n_ctx: int):
    """:func:`mtpscope.inspector.estimate.estimate` for the selected pair (llama-server's defaults: f16 KV,
    flash attention, one sequence, CPU), cached by path, size and mtime."""
    t = safety.check_path(target, roots())
    d = safety.check_path(drafter, roots()) if drafter else None
    return _estimate(str(t), _stat_key(t), str(d) if d else None, _stat_key(d) if d else None, int(n_ctx))


def same_trace(recorded: str | None, path: str | os.PathLike[str], near: str | os.PathLike[str]) -> bool:
    """True when ``recorded`` (a trace path another command wrote, e.g. a replay summary's ``trace``;
    resolved like :func:`resolve_near` from ``near``) is the trace folder ``path``."""
    if not recorded:
        return False
    found = resolve_near(recorded, near)
    try:
        return found is not None and found == Path(path).resolve()
    except OSError:
        return False


# --------------------------------------------------------------------------------- explanations

def drafting_head(tr: Any) -> str:
    """``"centroid"`` when the trace's drafts came from the sparse (centroid) head, else ``"dense"`` (the
    centroid columns of a dense recording are a what-if): ``mtpscope.traces.analysis.explain_report.drafting_head``."""
    from mtpscope.traces.analysis.explain_report import drafting_head as head_of

    m = getattr(tr, "manifest", None)
    return head_of(m if isinstance(m, dict) else {})


def round_verdict(tr: Any, path: str, row: Any, steps: Any, dec: TokenText, head: str = "dense") -> str:
    """The Step view's one-line verdict for a round (:func:`mtpscope.app.views.round_verdict`): the
    rejected step's record for the drafter's rank and logits, and the explanation layer's sentence
    for its cause and the target's side (``mtpscope.traces.analysis.explain.step_sentence`` of the round's
    first mismatch, as ``mtpscope explain --prompt`` prints it)."""
    from mtpscope.app import views
    from mtpscope.traces.analysis.explain import step_sentence

    nd, na = int(row["n_draft"]), int(row["n_accepted"])
    step = None
    cause = None
    if na < nd:
        if len(steps):
            hit = steps[steps["k"] == na + 1]
            step = hit.iloc[0].to_dict() if len(hit) else None
        x = explanation(path)
        fm = x.first_mismatches
        m = fm[(fm["prompt_id"] == int(row["prompt_id"])) & (fm["round"] == int(row["round"]))]
        if len(m):
            cen = tr.manifest.get("centroids") if isinstance(tr.manifest.get("centroids"), dict) else {}
            cause = step_sentence(m.iloc[0].to_dict(), dec.label, n_centroids=cen.get("n_centroids"),
                                  centroid_top_k=cen.get("top_k"))
    return views.round_verdict(nd, na, row.get("drafted"), row.get("target"), dec.label, step=step, cause=cause)


@st.cache_resource(max_entries=8, show_spinner=False)
def _vocab(path: str, size: int, mtime_ns: int):
    from mtpscope.traces.analysis.vocab import load_vocab

    return load_vocab(path)


def trace_vocab_path(tr: Any) -> str | None:
    """The GGUF whose vocabulary a trace's tokens come from, as ``mtpscope explain`` picks it (the
    recorded target, then the recorded assistant), then the selected target and drafter: the first that
    is allowed, readable and has a token list; None without one."""
    for c in (model_path(tr, "target"), model_path(tr, "assistant"), get("target"), get("drafter")):
        if not c:
            continue
        try:
            p = safety.check_path(c, roots(), kind="file")
            _vocab(str(p), *_stat_key(p))
        except (MtpscopeError, OSError, ValueError):
            continue
        return str(p)
    return None


def vocab(path: str | None):
    """``mtpscope.traces.analysis.vocab.load_vocab`` of an allowed GGUF (cached by path, size, mtime); None for None."""
    if not path:
        return None
    p = safety.check_path(path, roots(), kind="file")
    return _vocab(str(p), *_stat_key(p))


@st.cache_resource(max_entries=8, show_spinner=False)
def _explanation(path: str, key: tuple, vpath: str | None, vkey: tuple | None, prompt_id: int | None,
                 category_field: str | None = None):
    from mtpscope.traces.sweep.advice import explain_with_baseline

    v = _vocab(vpath, *vkey) if vpath else None
    return explain_with_baseline(_open_trace(path, key), vocab=v, prompt=prompt_id, category_field=category_field)


def explanation(path: str | os.PathLike[str], prompt_id: int | None = None, category_field: str | None = None):
    """``mtpscope.traces.sweep.advice.explain_with_baseline`` of an allowed trace (the whole trace, or one
    prompt; a sweep cell's speedups against the sweep's plain decoding; ``category_field``: as ``explain
    --category-field``), with the vocabulary of :func:`trace_vocab_path`: the same sections ``mtpscope
    explain`` prints. Cached by the trace's and the vocabulary's file stats."""
    p = safety.check_path(path, roots(), kind="dir")
    tr = _open_trace(str(p), _trace_key(p))
    vp = trace_vocab_path(tr)
    vk = _stat_key(Path(vp)) if vp else None
    return _explanation(str(p), _trace_key(p), vp, vk, None if prompt_id is None else int(prompt_id),
                        category_field or None)


@st.cache_resource(max_entries=8, show_spinner=False)
def _positions(path: str, key: tuple):
    from mtpscope.traces.analysis.positions import positions

    tr = _open_trace(path, key)
    return positions(tr.columns("rounds", ["prompt_id", "round", "pending_token", "n_draft", "n_accepted", "emitted"]))


def positions(path: str | os.PathLike[str]):
    """``mtpscope.traces.analysis.positions.positions`` of an allowed trace's rounds (every emitted token's
    output position and status), cached like :func:`trace`."""
    p = safety.check_path(path, roots(), kind="dir")
    return _positions(str(p), _trace_key(p))


@st.cache_resource(max_entries=8, show_spinner=False)
def _token_classes(path: str, key: tuple, vpath: str, vkey: tuple):
    from mtpscope.traces.analysis.breakdown import classify_outputs
    from mtpscope.traces.analysis.token_classes import Classifier

    tr = _open_trace(path, key)
    clf = Classifier(_vocab(vpath, *vkey), chat=bool((tr.manifest.get("params") or {}).get("chat")))
    return classify_outputs(_positions(path, key), clf)


def token_classes(path: str | os.PathLike[str]):
    """``{prompt_id: TokenClasses}`` of every generated token (``mtpscope.traces.analysis.breakdown.classify_outputs``
    with the trace's vocabulary, :func:`trace_vocab_path`), or None without a vocabulary."""
    p = safety.check_path(path, roots(), kind="dir")
    tr = _open_trace(str(p), _trace_key(p))
    vp = trace_vocab_path(tr)
    if not vp:
        return None
    return _token_classes(str(p), _trace_key(p), vp, _stat_key(Path(vp)))


@st.cache_resource(max_entries=4, show_spinner=False)
def _comparison(a: str, akey: tuple, b: str, bkey: tuple, vpath: str | None, vkey: tuple | None):
    from mtpscope.traces.analysis.compare_report import compare_traces

    v = _vocab(vpath, *vkey) if vpath else None
    return compare_traces(_open_trace(a, akey), _open_trace(b, bkey), vocab=v)


def comparison(a: str | os.PathLike[str], b: str | os.PathLike[str]):
    """``mtpscope.traces.analysis.compare_report.compare_traces`` of two allowed traces (A's vocabulary from
    :func:`trace_vocab_path`): the aligned diff ``mtpscope compare A B`` prints. Cached."""
    pa_ = safety.check_path(a, roots(), kind="dir")
    pb_ = safety.check_path(b, roots(), kind="dir")
    ta = _open_trace(str(pa_), _trace_key(pa_))
    vp = trace_vocab_path(ta)
    return _comparison(str(pa_), _trace_key(pa_), str(pb_), _trace_key(pb_), vp, _stat_key(Path(vp)) if vp else None)


def run_differences(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """What differs between the runs of two allowed traces (``mtpscope.traces.analysis.run_diff``: parameters, and
    the models' GGUF metadata / tensor tables where both files are allowed and present), as table rows
    ``{"what", "name", "A", "B"}``. Cached per trace version."""
    pa_ = safety.check_path(a, roots(), kind="dir")
    pb_ = safety.check_path(b, roots(), kind="dir")
    return _run_differences(str(pa_), _trace_key(pa_), str(pb_), _trace_key(pb_))


@st.cache_data(max_entries=8, show_spinner=False)
def _run_differences(a: str, akey: tuple, b: str, bkey: tuple) -> list[dict[str, Any]]:
    from mtpscope.traces.analysis.run_diff import difference_rows, run_differences

    ta, tb = _open_trace(a, akey), _open_trace(b, bkey)
    return difference_rows(run_differences(ta.manifest, tb.manifest,
                                           readable=lambda p: safety.is_allowed(p, roots())))


def clicked_round(event: Any, handled_key: str, prompt_id: int | None = None) -> tuple[int, int] | None:
    """The (prompt_id, round) a click on a chart chose, once per click: ``customdata`` [round, …] of the
    first selected point (with ``prompt_id``), or [prompt_id, round, …] without it. ``handled_key``
    remembers the last click so a rerun does not act on it twice; None when nothing new was clicked."""
    pts = list(getattr(getattr(event, "selection", None), "points", None) or []) if event else []
    if not pts:
        st.session_state.pop(handled_key, None)  # so the same point can be clicked again later
        return None
    cd = pts[0].get("customdata")
    if isinstance(cd, dict):  # bar points come back as {"0": …, "1": …}
        cd = [cd.get(str(i), cd.get(i)) for i in range(len(cd))]
    if cd is None or len(cd) < (1 if prompt_id is not None else 2):
        return None
    sel = (int(prompt_id), int(cd[0])) if prompt_id is not None else (int(cd[0]), int(cd[1]))
    if st.session_state.get(handled_key) == sel:
        return None
    st.session_state[handled_key] = sel
    return sel


def open_round(sel: tuple[int, int]) -> None:
    """Select a round and open the Step view on it."""
    st.session_state["sel.round"] = (int(sel[0]), int(sel[1]))
    st.switch_page("screens/step.py")


@st.cache_data(max_entries=512, show_spinner=False)
def _gguf_role(path: str, size: int, mtime_ns: int) -> tuple[str, str | None]:
    from mtpscope.inspector.inventory import detect_dialect

    try:
        f = open_gguf(path)
    except (MtpscopeError, OSError):
        return "unreadable", None
    try:
        return detect_dialect(f).kind, f.architecture
    finally:
        f.close()


def gguf_role(path: str | os.PathLike[str]) -> tuple[str, str | None]:
    """(dialect kind, general.architecture) of an allowed GGUF, read from its header and cached:
    kind ``fork`` / ``upstream`` / ``other`` (drafters), ``target``, ``unknown``, or ``unreadable``
    (also for a path that is not allowed or not a file)."""
    try:
        p = safety.check_path(path, roots(), kind="file")
        return _gguf_role(str(p), *_stat_key(p))
    except (MtpscopeError, OSError):
        return "unreadable", None


DRAFTER_KINDS = ("fork", "upstream", "other")


def drafter_refusal(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be the drafter (it is a target model), in one line; None when it may be
    (a drafter, or a file whose own check will say what is wrong)."""
    kind, arch = gguf_role(path)
    if kind == "target":
        return (f"{short(path)} is a target model (general.architecture {arch!r}), not a drafter: choose it as "
                "the target, and a gemma4-assistant / gemma4_assistant file as the drafter")
    return None
