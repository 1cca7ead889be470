"""Warm the app's server process at start, so that the first visit after a server start is no slower than a later
one (issue 36: first load of every page <= 2 s). :func:`start`: first import the libraries the pages import, in
the calling thread before the server starts (two threads importing the same modules can see each other's
half-made modules: plotly peeks at ``sys.modules['pandas']``); then, on a thread of its own, import the app's
modules and fill the process-wide caches of :mod:`mtpscope.app.loaders` for the view a fresh session opens
(:func:`mtpscope.app.selection.default_selection`: the demo's traces A and B and their models), in the order a
user meets them: the start page (its verdict, then the advice), the Files page (the pickers' GGUF roles, the
selected models' summaries and the memory estimate), the Tensors page (the drafter's check on its own), then the
trace pages. Before those, what Streamlit does once per process on a page's first run (:func:`prepare_streamlit`:
its first element's check of how it was started, plotly's default template loaded), so the first page's run does
not do it. (Not the page scripts' compilation: Streamlit clears its script cache whenever no session is left.)

The same cached loaders the pages call, with the same arguments, so a page finds the value computed (or waits
for the computation under way: Streamlit computes a cached value once). Best effort: a step that fails is
skipped (the page that needs it says why, as it would have); nothing is written, nothing runs that a page
would not run. ``MTPSCOPE_NO_WARMUP=1`` turns it off.

Imports (all lazily, on the thread): ``loaders``, ``selection``, ``trace_checks``, ``safety``, the estimate's
defaults, streamlit's runtime (to wait for it) and its ``delta_generator``, ``plotly.graph_objects``;
:data:`LIBRARIES` and :data:`MODULES` by name.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

#: Set to 1 to start the server without warming it.
NO_WARMUP_ENV = "MTPSCOPE_NO_WARMUP"

#: What the pages import from other libraries, imported before the server starts (the start page's first).
LIBRARIES = ("pandas", "pyarrow.parquet", "plotly.graph_objects",
             # Streamlit's own modules that its elements import on first use (alerts' icons, data frames)
             "streamlit.emojis", "streamlit.material_icon_names", "streamlit.dataframe_util")

#: The app's modules the pages import beyond the router's own, imported on the warm-up thread once Streamlit's
#: runtime exists (the loaders' ``st.cache_data`` checks it when they are defined).
MODULES = ("mtpscope.app.loaders", "mtpscope.app.trace_checks", "mtpscope.app.verdict", "mtpscope.app.views",
           "mtpscope.traces.analysis.explain_report", "mtpscope.traces.diagnose.run", "mtpscope.app.charts",
           "mtpscope.app.model_views", "mtpscope.app.round_views", "mtpscope.app.diagnose_report",
           "mtpscope.inspector.estimate", "mtpscope.traces.analysis.coverage")

#: The warm-up thread's name (its log records are told apart by it).
THREAD = "mtpscope-warmup"

_LOG = logging.getLogger(__name__)
_started: threading.Thread | None = None


class _QuietOffSession(logging.Filter):
    """Drops Streamlit's "missing ScriptRunContext" warnings of the warm-up thread (it runs outside any
    session on purpose); every other thread's records pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.threadName == THREAD and "missing ScriptRunContext" in record.getMessage())


def _runtime_ready(timeout: float) -> bool:
    """Wait (at most ``timeout`` s) until Streamlit's runtime exists: the loaders' data caches live in it."""
    from streamlit import runtime

    deadline = time.monotonic() + timeout
    while not runtime.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def steps() -> list[tuple[str, Callable[[], Any]]]:
    """The warm-up's steps, in order, each ``(what, call)``: the loaders each page calls first for the default
    selection. Reads the selection's defaults (the demo's files); calls nothing."""
    from mtpscope.app import loaders, safety, trace_checks
    from mtpscope.app import selection as sel

    s = sel.default_selection()
    a, b, drafter, target = s[sel.TRACE], s[sel.TRACE_B], s[sel.DRAFTER], s[sel.TARGET]
    out: list[tuple[str, Callable[[], Any]]] = []
    for t in (a, b):   # the start page's facts (trace_checks.trace_facts) and the trace pages' verify banner
        if t:
            models = sel.recorded_models(t)
            out += [(f"report {t}", partial(loaders.report, t)), (f"verify {t}", partial(trace_checks.recorded_check, t)),
                    (f"prompts {t}", partial(loaders.prompt_counts, t)),
                    (f"saved diagnosis {t}", partial(loaders.existing_diagnosis, t, models.get(sel.DRAFTER),
                                                     models.get(sel.TARGET)))]
    if a:   # the start page's advice: the explanation's what-if (the Explain page's, the same cache)
        out.append((f"explanation {a}", partial(loaders.explanation, a)))
    # the Files page: the pickers' roles of every GGUF found, then the selected models' summaries
    roots = tuple(str(r) for r in sel.roots())
    out += [(f"role {p}", partial(loaders.gguf_role, p)) for p in safety.discover(roots, suffix=".gguf")]
    for m in (drafter, target):
        if m:
            out += [(f"gguf {m}", partial(loaders.gguf, m)), (f"inventory {m}", partial(loaders.inventory, m)),
                    (f"validation {m}", partial(loaders.validation, m, target if m == drafter else None))]
    if drafter and target:   # the Tensors page's layer grid: the drafter checked on its own (the Files page pairs it)
        out.append((f"validation {drafter} alone", partial(loaders.validation, drafter)))
    if target:   # at the Files page's first n_ctx: llama-server's default, EstimateParams'
        from mtpscope.inspector.estimate import EstimateParams

        out.append(("memory estimate", partial(loaders.estimate, target, drafter, EstimateParams().n_ctx)))
    if a:   # the trace pages' first reads
        out.append((f"positions {a}", partial(loaders.positions, a)))
    return out


def prepare_streamlit() -> list[str]:
    """Do what Streamlit does once per process on the first page run, so that run does not: its first element's
    check of how it was started (``delta_generator._maybe_print_use_warning``: ``inspect.stack()`` of the running
    thread, each frame's source file looked up among every module: 0.1-0.25 s on a page run's deep stack, little on
    this thread's; it warns nothing here, the runtime exists), and plotly's default template loaded (the first
    figure's layout). Streamlit's private name is looked up, never required: missing (another Streamlit version),
    it is skipped. Returns what failed, as ``"what: error"`` lines; never raises."""
    failed: list[str] = []
    try:
        from streamlit import delta_generator

        check = getattr(delta_generator, "_maybe_print_use_warning", None)
        if callable(check):
            check()
    except Exception as e:  # noqa: BLE001 - best effort: the first page run does it then
        failed.append(f"streamlit's first-element check: {e}")
    try:
        import plotly.graph_objects as go

        go.Figure().update_layout(title="")
    except Exception as e:  # noqa: BLE001 - best effort: the first figure loads it then
        failed.append(f"plotly's template: {e}")
    return failed


def import_all(names: tuple[str, ...]) -> list[str]:
    """Import ``names``; returns those that failed, as ``"import NAME: error"`` lines. Never raises."""
    failed: list[str] = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - best effort: the page that needs it says why
            failed.append(f"import {name}: {e}")
    return failed


def warm(runtime_timeout: float = 60.0) -> list[str]:
    """Wait for Streamlit's runtime, import :data:`MODULES`, then run :func:`steps`; returns the steps that failed, as ``"what: error"``
    lines (also logged at debug level). Never raises."""
    t0 = time.perf_counter()
    logging.getLogger("streamlit.runtime.scriptrunner_utils.script_run_context").addFilter(_QuietOffSession())
    failed: list[str] = []
    if not _runtime_ready(runtime_timeout):
        failed.append("streamlit's runtime did not start")
        todo: list[tuple[str, Callable[[], Any]]] = []
    else:
        failed += import_all(MODULES)
        failed += prepare_streamlit()
        try:
            todo = steps()
        except Exception as e:  # noqa: BLE001 - a warm-up never stops the server: the failure is logged and the pages compute it
            failed.append(f"default selection: {e}")
            todo = []
    for what, call in todo:
        t = time.perf_counter()
        try:
            call()
        except Exception as e:  # noqa: BLE001 - a file a page would refuse is refused there, in its words
            failed.append(f"{what}: {e}")
        _LOG.debug("warm-up: %s in %.3f s", what, time.perf_counter() - t)
    for line in failed:
        _LOG.debug("warm-up: %s", line)
    _LOG.debug("warm-up done in %.2f s", time.perf_counter() - t0)
    return failed


def start() -> threading.Thread | None:
    """Import :data:`LIBRARIES` here, then run :func:`warm` on a daemon thread (once per process; nothing when
    ``MTPSCOPE_NO_WARMUP=1``). Call it before the server starts."""
    global _started
    if os.environ.get(NO_WARMUP_ENV) == "1":
        return None
    if _started is None:
        for line in import_all(LIBRARIES):
            _LOG.debug("warm-up: %s", line)
        _started = threading.Thread(target=warm, name=THREAD, daemon=True)
        _started.start()
    return _started


__all__ = ["LIBRARIES", "MODULES", "NO_WARMUP_ENV", "THREAD", "import_all", "prepare_streamlit", "start", "steps",
           "warm"]
