"""llama.cpp's log, kept in memory: the callback :func:`mtpscope.traces.run.llama.binding.llama` installs,
the last lines (:func:`recent_log`, quoted in errors), blocks that collect everything logged
(:func:`capture_log`), and the exception a Ctrl-C raised inside the callback (:func:`raise_pending_log`).

The lines are printed to stderr only with ``MTPSCOPE_LLAMA_LOG=1``.

Imports: nothing of mtpscope (the binding imports this module; it is handed the ``llama_cpp`` module).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

_log_lines: collections.deque[str] = collections.deque(maxlen=200)
_log_sinks: list[list[str]] = []  # capture_log() blocks in progress
#: "log_error": an exception raised inside the callback; "log_cb": the callback, kept alive
_state: dict[str, Any] = {}


def install(llama_cpp: ModuleType) -> None:
    """Route llama.cpp's log into this module (``llama_log_set``); once per process, before
    ``llama_backend_init`` (called by :func:`mtpscope.traces.run.llama.binding.llama`)."""
    echo = os.environ.get("MTPSCOPE_LLAMA_LOG", "") not in ("", "0")

    def _log_line(level: int, text: bytes, user_data: Any) -> None:
        # never raise (ctypes would drop the exception, e.g. a Ctrl-C): keep it for raise_pending_log()
        try:
            s = text.decode("utf-8", "replace") if text else ""
            _log_lines.append(s)
            for sink in _log_sinks:
                sink.append(s)
            if echo:
                sys.stderr.write(s)
        except BaseException as e:  # noqa: BLE001 - KeyboardInterrupt included, on purpose
            _state.setdefault("log_error", e)

    _log = llama_cpp.llama_log_callback(_log_line)     # the ctypes callback (llama_cpp is untyped: Any)
    _state["log_cb"] = _log  # keep the callback alive for the life of the process
    llama_cpp.llama_log_set(_log, ctypes.c_void_p(0))


def clear_recent() -> None:
    """Forget the lines logged so far (before a load or a context creation whose failure quotes them)."""
    _log_lines.clear()


def take_pending() -> BaseException | None:
    """The exception (e.g. ``KeyboardInterrupt``) that arrived inside the log callback since the last call,
    or None; forgotten here (the caller raises it, after freeing what it made)."""
    err: BaseException | None = _state.pop("log_error", None)
    return err


def raise_pending_log() -> None:
    """Re-raise (once) an exception (e.g. ``KeyboardInterrupt``) that arrived inside the llama.cpp log
    callback, where ctypes would otherwise drop it. Called after each decode and load."""
    e = take_pending()
    if e is not None:
        raise e


def recent_log(n: int = 12) -> str:
    """The last ``n`` lines llama.cpp logged (kept in memory; printed only if MTPSCOPE_LLAMA_LOG=1)."""
    return "".join(list(_log_lines)[-n:]).strip()


@contextlib.contextmanager
def capture_log() -> Iterator[list[str]]:
    """Every piece of text llama.cpp logs inside the block (all levels, in order, as logged: a line may
    come in several pieces; ``"".join(pieces).splitlines()`` gives the lines). For tests and checks that
    compare with what llama.cpp reports (e.g. buffer sizes, inspector/estimate.py). The callback is in
    place from the first :func:`~mtpscope.traces.run.llama.binding.llama` call on, which every model
    load makes before llama.cpp logs anything."""
    sink: list[str] = []
    _log_sinks.append(sink)
    try:
        yield sink
    finally:
        _log_sinks.remove(sink)
