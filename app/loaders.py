"""Cached, typed loaders: every file or folder a page reads, read once per version of it.

Readers, inventories, traces, reports, explanations and the rest are cached with ``st.cache_resource``
keyed by the resolved path, the file size and mtime (for a trace: the manifest's and every part's size and
mtime), so an edited or rebuilt file is re-read and an unchanged one is not. Every path goes through
:func:`mtpscope.app.safety.check_path` against :func:`mtpscope.app.selection.roots` first; a path outside
them raises ``PathNotAllowedError``.

Imports: streamlit, ``safety``, ``selection``, ``tokens``, ``model_views``, mtpscope.inspector,
mtpscope.traces (inside the loaders: pyarrow and duckdb stay out of the model pages), mtpscope.errors.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import streamlit as st

from mtpscope.app import safety
from mtpscope.app.selection import DRAFTER, TARGET, TRACE, TRACE_B, get, roots, short
from mtpscope.app.tokens import TokenText
from mtpscope.errors import InspectorError, MtpscopeError
from mtpscope.inspector.centroids import CentroidHead, find_centroid_tensors
from mtpscope.inspector.gguf import GGUF_MAGIC, GGUFFile, GGUFLike, open_gguf
from mtpscope.inspector.inventory import DRAFTER_KINDS, Inventory, build_inventory
from mtpscope.inspector.layouts import ARCH_TARGET
from mtpscope.inspector.validate import verify

if TYPE_CHECKING:
    import pandas as pd

    from mtpscope.app.model_views import Coverage
    from mtpscope.inspector.estimate import MemoryEstimate
    from mtpscope.inspector.findings import Report
    from mtpscope.traces import Trace
    from mtpscope.traces.analysis.align import AlignedDiff
    from mtpscope.traces.analysis.explain_report import Explanation
    from mtpscope.traces.analysis.positions import Positions
    from mtpscope.traces.analysis.report_records import TraceReport
    from mtpscope.traces.analysis.requests import RequestsView
    from mtpscope.traces.analysis.run_diff import DifferenceRow
    from mtpscope.traces.analysis.token_classes import TokenClasses
    from mtpscope.traces.analysis.vocab import Vocab
    from mtpscope.traces.diagnose.records import Diagnosis
    from mtpscope.traces.run.replay import ReplaySummary
    from mtpscope.traces.sweep.reader import Sweep


# ------------------------------------------------------------------------------------------ cache keys

def _stat_key(p: Path) -> tuple[int, int]:
    s = p.stat()
    return s.st_size, s.st_mtime_ns


def _trace_key(p: Path) -> tuple:
    from mtpscope.traces.store.layout import trace_files

    items: list[tuple] = []
    for f in trace_files(p):
        with contextlib.suppress(OSError):
            items.append((f.relative_to(p).as_posix(), *_stat_key(f)))
    return tuple(items)


def _dir_key(p: Path) -> tuple:
    items = []
    with contextlib.suppress(OSError):
        for f in sorted(p.iterdir())[:200]:
            with contextlib.suppress(OSError):
                items.append((f.name, *_stat_key(f)))
    return tuple(items)


# ------------------------------------------------------------------------------------------ GGUF files

#: One open GGUF whose string arrays later files probably repeat (a drafter carries its target's 262144-token
#: vocabulary): the first file with a token list that :func:`_open_gguf` opened (kept open, as its cache keeps
#: it). A file opened after it compares those bytes instead of walking them (``open_gguf``'s ``like``; any
#: difference is walked as before): the pickers, verify and the vocabulary read each file of the demo.
_LIKE: list[GGUFFile] = []
_T = TypeVar("_T")


def _sharing(read: Callable[..., _T], path: str) -> _T:
    """``read(path)`` (``open_gguf``, ``load_vocab``) with :data:`_LIKE`'s string arrays to compare against (the
    same result, read faster)."""
    like = _LIKE[0] if _LIKE else None
    if like is None:
        return read(path)
    try:
        return read(path, like=like)
    except ValueError:   # the kept file's map was closed after all: read on its own from now on
        _LIKE.clear()
        return read(path)


def _keep_like(f: GGUFFile) -> bool:
    """Keep ``f`` as :data:`_LIKE` when none is kept and it has a token list; True when kept (never close it)."""
    if not _LIKE and "tokenizer.ggml.tokens" in f.kv:
        _LIKE.append(f)
        return True
    return False


@st.cache_resource(max_entries=16, show_spinner=False)
def _open_gguf(path: str, size: int, mtime_ns: int) -> GGUFFile:
    f = _sharing(open_gguf, path)
    _keep_like(f)
    return f


def gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """The reader (``GGUFFile``) for an allowed path, cached by (path, size, mtime).

    Raises:
        PathNotAllowedError, InspectorError (missing / unreadable / malformed).
    """
    p = safety.check_path(path, roots(), kind="file")
    return _open_gguf(str(p), *_stat_key(p))


@st.cache_resource(max_entries=16, show_spinner=False)
def _inventory(path: str, size: int, mtime_ns: int) -> Inventory:
    return build_inventory(_open_gguf(path, size, mtime_ns))


def inventory(path: str | os.PathLike[str]) -> Inventory:
    """``build_inventory`` of an allowed GGUF, cached by (path, size, mtime)."""
    p = safety.check_path(path, roots(), kind="file")
    return _inventory(str(p), *_stat_key(p))


@st.cache_data(max_entries=512, show_spinner=False)
def _gguf_role(path: str, size: int, mtime_ns: int) -> tuple[str, str | None]:
    from mtpscope.inspector.inventory import detect_dialect

    try:
        f = _sharing(open_gguf, path)
    except (MtpscopeError, OSError):
        return "unreadable", None
    try:
        return detect_dialect(f).kind, f.architecture
    finally:
        if not _keep_like(f):
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


def is_drafter(path: str | os.PathLike[str]) -> bool:
    """True when the allowed GGUF at ``path`` is a drafter (its dialect kind is one of
    :data:`mtpscope.inspector.inventory.DRAFTER_KINDS`)."""
    return gguf_role(path)[0] in DRAFTER_KINDS


def is_target(path: str | os.PathLike[str]) -> bool:
    """True when the allowed GGUF at ``path`` is a target model."""
    return gguf_role(path)[0] == "target"


def check_gguf_upload(data: bytes, name: str) -> None:
    """Refuse uploaded bytes that are not a GGUF file before they are stored or selected: a GGUF begins with
    the magic ``GGUF`` (:data:`mtpscope.inspector.gguf.GGUF_MAGIC`).

    Raises:
        InspectorError: the first four bytes are not the magic (naming the upload, expected vs actual).
    """
    if data[:len(GGUF_MAGIC)] != GGUF_MAGIC:
        raise InspectorError(f"{name} is not a GGUF file", key="magic", expected=repr(GGUF_MAGIC),
                             actual=repr(bytes(data[:len(GGUF_MAGIC)])))


def drafter_refusal(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be the drafter (it is a target model), in one line; None when it may be
    (a drafter, or a file whose own check will say what is wrong)."""
    kind, arch = gguf_role(path)
    if kind == "target":
        return (f"{short(path)} is a target model (general.architecture {arch!r}), not a drafter: choose it as "
                "the target, and a gemma4-assistant / gemma4_assistant file as the drafter")
    return None


def slot_refusal(slot: str, path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be selected for selection slot ``slot``, in one line: outside the allowed
    folders, missing, a file where a folder is needed (or the reverse), a trace folder without its manifest,
    or a target model offered as the drafter (:func:`drafter_refusal`); None when it may be selected (its
    reader says what else is wrong with it). The Files page and links refuse with it, so a refused path
    is never the selection."""
    from mtpscope.traces.store.layout import MANIFEST

    kind = "file" if slot in (DRAFTER, TARGET) else "dir"
    try:
        p = safety.check_path(path, roots(), kind=kind)
    except MtpscopeError as e:
        return e.one_line()
    if slot in (TRACE, TRACE_B) and not (p / MANIFEST).is_file():
        return f"{p}: not a trace folder (no {MANIFEST} in it)"
    return drafter_refusal(p) if slot == DRAFTER else None


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


@st.cache_resource(max_entries=16, show_spinner=False)
def _validation(path: str, key: tuple, target: str | None, tkey: tuple | None, hf_dir: str | None,
                hkey: tuple | None) -> Report:
    f = _open_gguf(path, *key)
    t = _open_gguf(target, *tkey) if target and tkey is not None else None
    return verify(f, target=t, hf_dir=hf_dir)


def validation(path: str | os.PathLike[str], target: str | os.PathLike[str] | None = None,
               hf_dir: str | os.PathLike[str] | None = None) -> Report:
    """``mtpscope.inspector.validate.verify`` of an allowed GGUF (optionally paired with an allowed target and
    audited against an allowed HF checkpoint folder), cached by the files' (path, size, mtime)."""
    p = safety.check_path(path, roots(), kind="file")
    t = safety.check_path(target, roots(), kind="file") if target else None
    h = safety.check_hf_dir(safety.check_path(hf_dir, roots(), kind="dir")) if hf_dir else None
    if t is not None and t == p:
        t = None
    return _validation(str(p), _stat_key(p), str(t) if t else None, _stat_key(t) if t else None,
                       str(h) if h else None, _dir_key(h) if h else None)


@st.cache_resource(max_entries=8, show_spinner=False)
def _estimate(target: str, tkey: tuple, drafter: str | None, dkey: tuple | None, n_ctx: int) -> MemoryEstimate:
    from mtpscope.inspector.estimate import EstimateParams
    from mtpscope.inspector.estimate import estimate as run

    t = _open_gguf(target, *tkey)
    d = _open_gguf(drafter, *dkey) if drafter and dkey is not None else None
    return run(t, d, EstimateParams(n_ctx=n_ctx))


def estimate(target: str | os.PathLike[str], drafter: str | os.PathLike[str] | None, n_ctx: int) -> MemoryEstimate:
    """:func:`mtpscope.inspector.estimate.estimate` for the selected pair (llama-server's defaults: f16 KV,
    flash attention, one sequence, CPU), cached by path, size and mtime."""
    t = safety.check_path(target, roots())
    d = safety.check_path(drafter, roots()) if drafter else None
    return _estimate(str(t), _stat_key(t), str(d) if d else None, _stat_key(d) if d else None, int(n_ctx))


# ---------------------------------------------------------------------------------------- centroid head

@st.cache_resource(max_entries=8, show_spinner=False)
def _centroid_head(path: str, size: int, mtime_ns: int) -> CentroidHead:
    return CentroidHead.from_gguf(_open_gguf(path, size, mtime_ns))


def centroid_head(path: str | os.PathLike[str]) -> CentroidHead:
    """``mtpscope.inspector.centroids.CentroidHead`` of an allowed GGUF, cached by (path, size, mtime).

    Raises:
        LayoutError: the file has no centroid head.
    """
    p = safety.check_path(path, roots(), kind="file")
    return _centroid_head(str(p), *_stat_key(p))


def has_centroid_head(path: str | os.PathLike[str]) -> bool:
    """True when the allowed GGUF at ``path`` has a centroid matrix and a token ordering
    (``mtpscope.inspector.centroids.find_centroid_tensors``); False when not, or unreadable / not allowed."""
    try:
        c, o = find_centroid_tensors(gguf(path))
    except (MtpscopeError, OSError):
        return False
    return c is not None and o is not None


@st.cache_resource(max_entries=8, show_spinner=False)
def _coverage(tpath: str, tkey: tuple, gpath: str, size: int, mtime_ns: int) -> Coverage:
    from mtpscope.traces.analysis.coverage import centroid_coverage

    tr = _open_trace(tpath, tkey)
    head = _centroid_head(gpath, size, mtime_ns)
    return centroid_coverage(tr, head.n_centroids, head.token_to_centroid)


def coverage(trace_path: str | os.PathLike[str], drafter_path: str | os.PathLike[str]) -> Coverage:
    """Per-centroid chosen / target-home / covered counts of a trace against a drafter's head, aggregated in
    DuckDB (:func:`mtpscope.traces.analysis.coverage.centroid_coverage`), cached by both inputs' keys."""
    t = safety.check_path(trace_path, roots(), kind="dir")
    g = safety.check_path(drafter_path, roots(), kind="file")
    return _coverage(str(t), _trace_key(t), str(g), *_stat_key(g))


@st.cache_resource(max_entries=8, show_spinner=False)
def _has_centroid_columns(tpath: str, tkey: tuple) -> bool:
    tr = _open_trace(tpath, tkey)
    if "centroid_ids" not in tr.schemas["steps"].names:
        return False
    return len(tr.sql("SELECT 1 FROM steps WHERE centroid_ids IS NOT NULL LIMIT 1")) > 0


def has_centroid_columns(trace_path: str | os.PathLike[str]) -> bool:
    """Whether the trace's steps carry centroid-head columns (one DuckDB probe, no steps loaded)."""
    t = safety.check_path(trace_path, roots(), kind="dir")
    return _has_centroid_columns(str(t), _trace_key(t))


@st.cache_resource(max_entries=8, show_spinner=False)
def _unreachable(tpath: str, tkey: tuple, limit: int) -> pd.DataFrame:
    from mtpscope.traces.analysis.coverage import unreachable_steps

    return unreachable_steps(_open_trace(tpath, tkey), limit)


def unreachable_steps(trace_path: str | os.PathLike[str], limit: int = 500) -> pd.DataFrame:
    """The steps the centroid head would have missed, at most ``limit``, in trace order
    (:func:`mtpscope.traces.analysis.coverage.unreachable_steps`, DuckDB), cached by the trace's key."""
    t = safety.check_path(trace_path, roots(), kind="dir")
    return _unreachable(str(t), _trace_key(t), int(limit))


# ------------------------------------------------------------------------------------------ URLs (issue 16)

@dataclass(frozen=True)
class RemoteSummary:
    """What the Files page shows of a GGUF read over HTTP.

    Attributes:
        file: the model (header only; a split model's shards together).
        inventory: its tensor inventory.
        report: ``verify`` of it.
        estimate: memory as a target at the estimate's default n_ctx (``EstimateParams``: llama-server's 8192; a
            ``gemma4`` file), else None.
        n_requests / n_bytes: HTTP requests sent and bytes read for it (every shard together).
    """

    file: GGUFLike
    inventory: Inventory
    report: Report
    estimate: MemoryEstimate | None
    n_requests: int
    n_bytes: int


@st.cache_resource(max_entries=4, ttl=600, show_spinner="reading the GGUF header over HTTP…")
def _remote(url: str) -> GGUFLike:
    from mtpscope.cache import layout_hints
    from mtpscope.inspector.remote import RemoteOptions
    from mtpscope.inspector.shards import open_model

    return open_model(url, remote=RemoteOptions(timeout_s=20.0, retries=1, layout_hints=layout_hints()))


def remote_gguf(url: str) -> GGUFLike:
    """The GGUF at ``url`` (header only), after :func:`mtpscope.app.safety.check_url` (switch + host
    allow-list); cached ten minutes per URL."""
    return _remote(safety.check_url(url))


@st.cache_resource(max_entries=4, ttl=600, show_spinner=False)
def _remote_summary(url: str) -> RemoteSummary:
    from mtpscope.inspector.estimate import EstimateParams
    from mtpscope.inspector.estimate import estimate as run
    from mtpscope.inspector.remote import request_totals

    f = _remote(url)
    n_requests, n_bytes = request_totals(f) or (0, 0)
    return RemoteSummary(f, build_inventory(f), verify(f),
                         run(f, None, EstimateParams()) if f.architecture == ARCH_TARGET else None,
                         n_requests, n_bytes)


def remote_summary(url: str) -> RemoteSummary:
    """For the Files page's URL field: the file, its inventory, ``verify`` report, estimate and what was
    read (:class:`RemoteSummary`); after :func:`mtpscope.app.safety.check_url`."""
    return _remote_summary(safety.check_url(url))


# ---------------------------------------------------------------------------------------------- traces

@st.cache_resource(max_entries=8, show_spinner=False)
def _open_trace(path: str, key: tuple) -> Trace:
    from mtpscope.traces.store.reader import open_trace

    t = open_trace(path)
    t.check_parts()      # every part's footer, once per cached trace: a lost part is said on every trace page
    return t


def trace(path: str | os.PathLike[str]) -> Trace:
    """The opened trace (``mtpscope.traces.Trace``) for an allowed directory, cached by the manifest's
    and every part's (name, size, mtime)."""
    p = safety.check_path(path, roots(), kind="dir")
    return _open_trace(str(p), _trace_key(p))


@st.cache_resource(max_entries=8, show_spinner=False)
def _report(path: str, key: tuple) -> TraceReport:
    from mtpscope.traces.analysis.metrics import report

    return report(_open_trace(path, key))


def report(path: str | os.PathLike[str]) -> TraceReport:
    """``mtpscope.traces.analysis.metrics.report`` of an allowed trace (a
    :class:`~mtpscope.traces.analysis.report_records.TraceReport`), cached like :func:`trace`."""
    p = safety.check_path(path, roots(), kind="dir")
    return _report(str(p), _trace_key(p))


def trace_decoder(tr: Trace) -> TokenText:
    """Decoder for a trace's tokens: selected drafter, selected target, then the trace's models."""
    from mtpscope.app.views import model_path

    named = [model_path(tr.manifest, k) for k in ("assistant", "target")]
    return decoder(get(DRAFTER), get(TARGET), *named)


@st.cache_resource(max_entries=8, show_spinner=False)
def _vocab(path: str, size: int, mtime_ns: int) -> Vocab:
    from mtpscope.traces.analysis.vocab import load_vocab

    return _sharing(load_vocab, path)


def trace_vocab_path(tr: Trace) -> str | None:
    """The GGUF whose vocabulary a trace's tokens come from, as ``mtpscope explain`` picks it (the
    recorded target, then the recorded assistant), then the selected target and drafter: the first that
    is allowed, readable and has a token list; None without one."""
    from mtpscope.app.views import model_path

    for c in (model_path(tr.manifest, "target"), model_path(tr.manifest, "assistant"), get(TARGET), get(DRAFTER)):
        if not c:
            continue
        try:
            p = safety.check_path(c, roots(), kind="file")
            _vocab(str(p), *_stat_key(p))
        except (MtpscopeError, OSError, ValueError):
            continue
        return str(p)
    return None


def vocab(path: str | None) -> Vocab | None:
    """``mtpscope.traces.analysis.vocab.load_vocab`` of an allowed GGUF (cached by path, size, mtime); None for None."""
    if not path:
        return None
    p = safety.check_path(path, roots(), kind="file")
    return _vocab(str(p), *_stat_key(p))


@st.cache_resource(max_entries=8, show_spinner=False)
def _explanation(path: str, key: tuple, vpath: str | None, vkey: tuple | None, prompt_id: int | None,
                 category_field: str | None = None) -> Explanation:
    from mtpscope.traces.sweep.advice import explain_with_baseline

    v = _vocab(vpath, *vkey) if vpath and vkey else None
    return explain_with_baseline(_open_trace(path, key), vocab=v, prompt=prompt_id, category_field=category_field)


def explanation(path: str | os.PathLike[str], prompt_id: int | None = None,
                category_field: str | None = None) -> Explanation:
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
def _positions(path: str, key: tuple) -> Positions:
    from mtpscope.traces.analysis.positions import positions

    tr = _open_trace(path, key)
    return positions(tr.columns("rounds", ["prompt_id", "round", "pending_token", "n_draft", "n_accepted", "emitted"]))


def positions(path: str | os.PathLike[str]) -> Positions:
    """``mtpscope.traces.analysis.positions.positions`` of an allowed trace's rounds (every emitted token's
    output position and status), cached like :func:`trace`."""
    p = safety.check_path(path, roots(), kind="dir")
    return _positions(str(p), _trace_key(p))


@st.cache_resource(max_entries=8, show_spinner=False)
def _token_classes(path: str, key: tuple, vpath: str, vkey: tuple) -> dict[int, TokenClasses]:
    from mtpscope.traces.analysis.breakdown import classify_outputs
    from mtpscope.traces.analysis.token_classes import Classifier

    tr = _open_trace(path, key)
    clf = Classifier(_vocab(vpath, *vkey), chat=bool((tr.manifest.get("params") or {}).get("chat")))
    return classify_outputs(_positions(path, key), clf)


def token_classes(path: str | os.PathLike[str]) -> dict[int, TokenClasses] | None:
    """``{prompt_id: TokenClasses}`` of every generated token (``mtpscope.traces.analysis.breakdown.classify_outputs``
    with the trace's vocabulary, :func:`trace_vocab_path`), or None without a vocabulary."""
    p = safety.check_path(path, roots(), kind="dir")
    tr = _open_trace(str(p), _trace_key(p))
    vp = trace_vocab_path(tr)
    if not vp:
        return None
    return _token_classes(str(p), _trace_key(p), vp, _stat_key(Path(vp)))


@st.cache_resource(max_entries=4, show_spinner=False)
def _comparison(a: str, akey: tuple, b: str, bkey: tuple, vpath: str | None, vkey: tuple | None) -> AlignedDiff:
    from mtpscope.traces.analysis.compare_report import compare_traces

    v = _vocab(vpath, *vkey) if vpath and vkey else None
    ta, tb = _open_trace(a, akey), _open_trace(b, bkey)
    diff = compare_traces(ta, tb, vocab=v)
    if diff.runtimes is None:
        return diff
    import dataclasses

    from mtpscope.traces.run.runtime_replay import replay_first_differences

    return dataclasses.replace(diff, runtimes=replay_first_differences(diff.runtimes, ta, tb))


def comparison(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> AlignedDiff:
    """``mtpscope.traces.analysis.compare_report.compare_traces`` of two allowed traces (A's vocabulary from
    :func:`trace_vocab_path`): the aligned diff ``mtpscope compare A B`` prints, two runtimes' first differing
    steps replayed (``mtpscope.traces.run.runtime_replay``). Cached."""
    pa_ = safety.check_path(a, roots(), kind="dir")
    pb_ = safety.check_path(b, roots(), kind="dir")
    ta = _open_trace(str(pa_), _trace_key(pa_))
    vp = trace_vocab_path(ta)
    return _comparison(str(pa_), _trace_key(pa_), str(pb_), _trace_key(pb_), vp, _stat_key(Path(vp)) if vp else None)


@st.cache_data(max_entries=8, show_spinner=False)
def _run_differences(a: str, akey: tuple, b: str, bkey: tuple) -> list[DifferenceRow]:
    from mtpscope.traces.analysis.run_diff import difference_rows, run_differences

    ta, tb = _open_trace(a, akey), _open_trace(b, bkey)
    return difference_rows(run_differences(ta.manifest, tb.manifest,
                                           readable=lambda p: safety.is_allowed(p, roots())))


def run_differences(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> list[DifferenceRow]:
    """What differs between the runs of two allowed traces (``mtpscope.traces.analysis.run_diff``: parameters, and
    the models' GGUF metadata / tensor tables where both files are allowed and present), as table rows
    (:class:`mtpscope.traces.analysis.run_diff.DifferenceRow`). Cached per trace version."""
    pa_ = safety.check_path(a, roots(), kind="dir")
    pb_ = safety.check_path(b, roots(), kind="dir")
    return _run_differences(str(pa_), _trace_key(pa_), str(pb_), _trace_key(pb_))


def recorded_validation(tr: Trace) -> Report | None:
    """``verify`` of the drafter a trace was recorded with, paired with its recorded target when that is
    there too (:func:`validation`); None when the manifest names no drafter or it is not allowed / readable.
    What the Compare page joins with the differences between two runs."""
    from mtpscope.app.views import model_path

    d, t = model_path(tr.manifest, "assistant"), model_path(tr.manifest, "target")
    if not d or slot_refusal(DRAFTER, d):
        return None
    if t and slot_refusal(TARGET, t):
        t = None
    try:
        return validation(d, t)
    except (MtpscopeError, OSError):
        return None


# ----------------------------------------------------------------------------------- replays and sweeps

@st.cache_resource(max_entries=4, show_spinner=False)
def _replay(path: str, key: tuple) -> tuple[ReplaySummary, pd.DataFrame]:
    from mtpscope.traces.run.replay_folder import read_replay  # no llama.cpp, no reference drafter

    return read_replay(path)


def replay(path: str | os.PathLike[str]) -> tuple[ReplaySummary, pd.DataFrame]:
    """(summary :class:`mtpscope.traces.run.replay.ReplaySummary`, steps DataFrame) of an allowed replay output folder (``mtpscope replay --out``:
    ``summary.json`` + ``steps.parquet``), cached by the folder's file stats. JSON and Parquet only."""
    p = safety.check_path(path, roots(), kind="dir")
    return _replay(str(p), _dir_key(p))


@st.cache_resource(max_entries=4, show_spinner=False)
def _sweep(path: str, key: tuple[int, int]) -> tuple[Sweep, pd.DataFrame, Any]:
    from mtpscope.traces.sweep.advice import sweep_advice
    from mtpscope.traces.sweep.reader import open_sweep

    sw = open_sweep(path)
    return sw, sw.cells(), sweep_advice(sw)


def sweep(path: str | os.PathLike[str]) -> tuple[Sweep, pd.DataFrame, Any]:
    """(the sweep, its configuration × category cells, its advice: :class:`mtpscope.traces.sweep.advice.SweepAdvice`,
    the recommendation and break-even of ``mtpscope report DIR``) of an allowed sweep directory (``mtpscope sweep --out``:
    :func:`mtpscope.traces.sweep.reader.open_sweep`; DuckDB aggregates, never all rounds), cached by its state
    file's (size, mtime).

    Raises:
        PathNotAllowedError; OSError: no state file (``sweep.json``); TraceFormatError: a malformed sweep.
    """
    from mtpscope.traces.sweep.spec import SWEEP_FILE

    p = safety.check_path(path, roots(), kind="dir")
    return _sweep(str(p), _stat_key(p / SWEEP_FILE))


# ------------------------------------------------------------------------------------------ Server page (issue 24)

@st.cache_resource(max_entries=8, show_spinner=False)
def _server_view(path: str, key: tuple) -> tuple[Trace, RequestsView]:
    from mtpscope.traces.analysis.requests import requests_view

    t = _open_trace(path, key)
    return t, requests_view(t.requests)


def server_view(path: str | os.PathLike[str]) -> tuple[Trace, RequestsView]:
    """A request trace (probe or server-log import) read for the Server page: (the trace, for its manifest and
    warnings; its :class:`mtpscope.traces.analysis.requests.RequestsView`: ``table``, ``totals``,
    ``by_category``, ``per_position``, ``alarm``); cached like :func:`trace` (a probe that writes a row makes a
    new key).

    Raises:
        PathNotAllowedError: a path outside the allowed folders; TraceError & co: an unreadable trace.
    """
    p = safety.check_path(path, roots(), kind="dir")
    return _server_view(str(p), _trace_key(p))


# ------------------------------------------------------------------------------------------ Diagnose page (issue 27)

#: Beside ``diagnosis.json`` in the app's diagnosis folder: the inputs it was made from (paths, file stats, the
#: configuration), so that a later run of the app reads it back instead of diagnosing again.
DIAGNOSIS_INPUTS = "inputs.json"


def _inputs_text(args: tuple) -> str:
    """The inputs of a diagnosis as written to :data:`DIAGNOSIS_INPUTS` (paths, file stats, the configuration)."""
    import json

    from mtpscope.traces.diagnose.config import DiagnoseConfig

    return json.dumps([*args[:-1], repr(DiagnoseConfig())])


def _saved(args: tuple) -> bool:
    """Whether the diagnosis folder ``args[-1]`` holds a diagnosis of these very inputs."""
    from mtpscope.traces.diagnose.run import DIAGNOSIS_FILE

    out = Path(args[-1])
    try:
        return (out / DIAGNOSIS_FILE).is_file() and \
            (out / DIAGNOSIS_INPUTS).read_text(encoding="utf-8") == _inputs_text(args)
    except OSError:
        return False


@st.cache_resource(max_entries=4, show_spinner=False)
def _diagnosis(trace: str, tkey: tuple, drafter: str | None, dkey: tuple | None, target: str | None,
               gkey: tuple | None, reference: str | None, rkey: tuple | None, out: str) -> Diagnosis:
    from mtpscope.traces.diagnose.config import DiagnoseConfig
    from mtpscope.traces.diagnose.run import diagnose, read_diagnosis

    # a diagnosis of the same inputs (every file's stats) written before, by this app or an earlier one, is read
    # back instead of run again: the cache folder keeps it across restarts
    args = (trace, tkey, drafter, dkey, target, gkey, reference, rkey, out)
    stamp = Path(out) / DIAGNOSIS_INPUTS
    if _saved(args):
        with contextlib.suppress(MtpscopeError):
            return read_diagnosis(out)
    with contextlib.suppress(OSError):
        stamp.unlink(missing_ok=True)   # written again only once this run's diagnosis.json is
    ref = Path(reference) if reference else None
    d = diagnose(DiagnoseConfig(), trace=trace, assistant=drafter, target=target, out=out,
                 reference_hf=ref if ref is not None and ref.is_dir() else None,
                 reference_assistant=ref if ref is not None and ref.is_file() else None)
    with contextlib.suppress(OSError):
        stamp.write_text(_inputs_text(args), encoding="utf-8")
    return d


def _diagnosis_args(trace: str | os.PathLike[str], drafter: str | os.PathLike[str] | None,
                    target: str | os.PathLike[str] | None, reference: str | os.PathLike[str] | None) -> tuple:
    """:func:`_diagnosis`'s arguments (paths and their file stats, the output folder) of these inputs."""
    t, d, g, r = _diagnosis_inputs(trace, drafter, target, reference)
    out = diagnosis_folder(trace, drafter, target, reference)
    return (str(t), _trace_key(t), None if d is None else str(d), None if d is None else _stat_key(d),
            None if g is None else str(g), None if g is None else _stat_key(g),
            None if r is None else str(r), None if r is None else (_dir_key(r) if r.is_dir() else _stat_key(r)),
            str(out))


def diagnosis(trace: str | os.PathLike[str], drafter: str | os.PathLike[str] | None = None,
              target: str | os.PathLike[str] | None = None,
              reference: str | os.PathLike[str] | None = None) -> Diagnosis:
    """``mtpscope diagnose --trace`` of an allowed trace (its :class:`Diagnosis`, ``mtpscope diagnose``'s defaults:
    ``DiagnoseConfig()``), the models the selected ones (default: the trace's own), ``reference`` an HF checkpoint
    folder or a good drafter GGUF; its replays written under the uploads folder (``diagnose/<key>/``, allowed, so the
    findings' links open them). Cached by every input's file stats (the record is frozen: shared, never copied),
    and in that folder (``diagnosis.json`` with :data:`DIAGNOSIS_INPUTS`): read back while the inputs are unchanged.

    Raises:
        PathNotAllowedError; MtpscopeError & co: unreadable input.
    """
    return _diagnosis(*_diagnosis_args(trace, drafter, target, reference))


def has_saved_diagnosis(trace: str | os.PathLike[str], drafter: str | os.PathLike[str] | None = None,
                        target: str | os.PathLike[str] | None = None,
                        reference: str | os.PathLike[str] | None = None) -> bool:
    """Whether :func:`diagnosis` of these inputs would read a saved diagnosis back (no run): the Diagnose page
    shows it without waiting for its button. False for inputs it may not read."""
    try:
        return _saved(_diagnosis_args(trace, drafter, target, reference))
    except (MtpscopeError, OSError):
        return False


def _diagnosis_inputs(trace: str | os.PathLike[str], drafter: str | os.PathLike[str] | None,
                      target: str | os.PathLike[str] | None, reference: str | os.PathLike[str] | None,
                      ) -> tuple[Path, Path | None, Path | None, Path | None]:
    t = safety.check_path(trace, roots(), kind="dir")
    d = safety.check_path(drafter, roots(), kind="file") if drafter else None
    g = safety.check_path(target, roots(), kind="file") if target else None
    r = safety.check_path(reference, roots(), kind="dir" if Path(reference).is_dir() else "file") if reference else None
    return t, d, g, r


def diagnosis_folder(trace: str | os.PathLike[str], drafter: str | os.PathLike[str] | None = None,
                     target: str | os.PathLike[str] | None = None,
                     reference: str | os.PathLike[str] | None = None) -> Path:
    """Where the app's diagnosis of these inputs is written (``<uploads>/diagnose/<key>``, key: a hash of the
    resolved paths), whether it ran or not.

    Raises:
        PathNotAllowedError: an input outside the allowed folders.
    """
    import hashlib

    t, d, g, r = _diagnosis_inputs(trace, drafter, target, reference)
    key = hashlib.sha256(repr((str(t), str(d), str(g), str(r))).encode()).hexdigest()[:16]
    return safety.uploads_dir() / "diagnose" / key


def existing_diagnosis(trace: str | os.PathLike[str], drafter: str | os.PathLike[str] | None = None,
                       target: str | os.PathLike[str] | None = None) -> Diagnosis | None:
    """The diagnosis the app already ran on these inputs (no reference), read back from its folder
    (:func:`diagnosis_folder`) while its inputs are unchanged (the rule of :func:`has_saved_diagnosis`); None
    otherwise (never runs one). An unreadable one is None too (the Diagnose page says why when it is opened)."""
    from mtpscope.traces.diagnose.run import DIAGNOSIS_FILE

    try:
        args = _diagnosis_args(trace, drafter, target, None)
        if not _saved(args):
            return None
        folder = Path(args[-1])
        return _saved_diagnosis(str(folder), _stat_key(folder / DIAGNOSIS_FILE))
    except (MtpscopeError, OSError):
        return None


@st.cache_data(max_entries=8, show_spinner=False)
def _prompt_counts(path: str, key: tuple) -> list[tuple[int, str | None, int, int]]:
    from mtpscope.traces.analysis.breakdown import prompt_categories
    from mtpscope.traces.analysis.metrics import per_prompt

    tr = _open_trace(path, key)
    cats = prompt_categories(tr.manifest) or {}
    pp = per_prompt(tr.rounds)
    return [(int(p), cats.get(int(p)), int(nd), int(na)) for p, nd, na in
            zip(pp["prompt_id"], pp["n_drafted"], pp["n_accepted"], strict=True)]


def prompt_counts(path: str | os.PathLike[str]) -> list[tuple[int, str | None, int, int]]:
    """(prompt_id, category or None, n_drafted, n_accepted) per prompt of an allowed trace
    (``metrics.per_prompt``, the manifest's categories as ``explain`` reads them), cached like :func:`trace`."""
    p = safety.check_path(path, roots(), kind="dir")
    return _prompt_counts(str(p), _trace_key(p))


@st.cache_resource(max_entries=8, show_spinner=False)
def _saved_diagnosis(path: str, key: tuple[int, int]) -> Diagnosis:
    from mtpscope.traces.diagnose.run import read_diagnosis

    return read_diagnosis(path)


def saved_diagnosis(folder: str | os.PathLike[str]) -> Diagnosis:
    """The :class:`Diagnosis` that ``mtpscope diagnose --out FOLDER`` wrote (``diagnosis.json`` read back by
    ``read_diagnosis``), cached by the file's stats (the record is frozen: shared, never copied).

    Raises:
        PathNotAllowedError; MtpscopeError: missing, unreadable or not a diagnosis (naming the file and the key).
    """
    from mtpscope.traces.diagnose.run import DIAGNOSIS_FILE

    p = safety.check_path(folder, roots(), kind="dir")
    return _saved_diagnosis(str(p), _stat_key(p / DIAGNOSIS_FILE) if (p / DIAGNOSIS_FILE).is_file() else (0, 0))
