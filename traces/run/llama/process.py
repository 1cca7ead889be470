"""The process around llama.cpp: a Ctrl-C (SIGINT) that arrives during a decode, stop signals held while a
stopped recording cleans up, ggml's abort hook, and what llama.cpp printed before it died (for the isolated
recording worker, docs/RECORDING.md).

Imports: ctypes, mtpscope.errors, :mod:`.binding` (the ggml functions; no ``llama_cpp`` at import time),
:mod:`traces.run.worker_spawn` (``ABORT_ENV``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from mtpscope.errors import RuntimeUnavailableError
from mtpscope.traces.run.llama import binding
from mtpscope.traces.run.worker_spawn import ABORT_ENV as _ABORT_ENV

# --------------------------------------------------------------------------------------------------
# Ctrl-C during a decode
# --------------------------------------------------------------------------------------------------

#: SIGINT bookkeeping for :func:`deferred_sigint`: "native" is set while llama_decode runs
#: (:meth:`mtpscope.traces.run.llama.model.LlamaContext.decode`), "pending" when a Ctrl-C arrived then
#: (read by the ``cb_eval`` capture, which then stops the graph early)
sigint_state: dict[str, bool] = {"native": False, "pending": False}


def _on_sigint(signum: int, frame: Any) -> None:
    if sigint_state["native"]:  # inside llama_decode (this runs in a ctypes callback): raising would be lost
        sigint_state["pending"] = True
        return
    raise KeyboardInterrupt


@contextlib.contextmanager
def deferred_sigint() -> Iterator[None]:
    """Within the block, a Ctrl-C (SIGINT) that arrives while llama.cpp decodes is raised as
    ``KeyboardInterrupt`` right after the decode returns (the ``cb_eval`` capture stops the graph
    early), instead of being raised inside a ctypes callback, where ctypes prints "Exception ignored"
    and drops it. Outside a decode SIGINT raises at once, as usual. No-op off the main thread or when
    SIGINT has a handler other than Python's default."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    old = signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        sigint_state["pending"] = False


#: what :func:`interrupts_held` holds: a Ctrl-C and the stop signals the command line turns into one
#: (``cli.common.STOP_SIGNALS``: ``timeout`` or a service manager, a closed terminal)
HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Within the block, :data:`HELD_SIGNALS` are ignored, not raised: the cleanup after a first
    Ctrl-C or stop signal (the worker stopped, the trace closed and its manifest written) runs to its end when
    another one comes. ``timeout`` sends its SIGTERM to the command and then to the command's process group, so
    the recorder gets it twice. No-op off the main thread (where Python cannot install handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, lambda signum, frame: None) for s in HELD_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            if h is not None:      # (None: a handler not installed from Python, which cannot be put back)
                signal.signal(s, h)


# --------------------------------------------------------------------------------------------------
# aborts: what llama.cpp / ggml print when they give up (for the isolated recording worker)
# --------------------------------------------------------------------------------------------------

#: Environment for a process that runs llama.cpp under the recorder. ggml's abort handler
#: (``ggml_abort`` -> ``ggml_print_backtrace`` in ``ggml/src/ggml.c``; also ``std::terminate`` via
#: ``ggml.cpp``) forks and execs ``gdb --batch -ex "attach PID" -ex bt`` (or lldb) unless
#: ``GGML_NO_BACKTRACE`` is set, which prints ~200 lines of debugger output into the user's terminal
#: and can take seconds; the message before it (``file:line: text``) is all we need.
#: (defined in :mod:`traces.run.worker_spawn`, which starts the worker process without importing numpy)
ABORT_ENV = _ABORT_ENV

#: ``ggml_abort`` writes ``"<file>:<line>: <message>"`` to stderr before ``abort()``
#: (``GGML_ABORT(...)``, ``GGML_ASSERT(x)`` -> ``GGML_ASSERT(x) failed``)
_ABORT_LINE = re.compile(r"^(?P<file>\S+\.(?:c|cc|cpp|cu|h|hpp|m|metal)):(?P<line>\d+): (?P<msg>.+)$")
#: Python's faulthandler block that follows a fatal signal in the worker (not llama.cpp's words)
_FAULTHANDLER_START = ("Fatal Python error:", "Current thread ", "Thread 0x", "Extension modules:",
                       "Stack (most recent call first)")

#: ``ggml_abort_callback_t``: ``void (*)(const char * error_message)``
_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
#: the installed abort callback, kept alive (ggml holds only the C pointer)
_abort: dict[str, Any] = {}


def set_abort_hook(hook: Callable[[str], None]) -> bool:
    """Run ``hook(message)`` inside ``ggml_abort`` (``GGML_ABORT`` / ``GGML_ASSERT``, CUDA errors), just
    before the process aborts: the recording worker sends the rounds it still holds. The message is
    first written to stderr as ggml writes it (``"<file>:<line>: <message>"``, what :func:`abort_message`
    reads); ggml's own backtrace is not printed. ``hook`` must not raise (what it raises is dropped).
    Returns False when this ggml has no ``ggml_set_abort_callback`` (nothing changes then).

    The callback stays installed for the life of the process (ggml keeps one, process-wide)."""
    g = binding.ggml_lib()
    setter = g.get("set_abort_callback")
    if setter is None:
        return False

    def _on_abort(raw: bytes | None) -> None:
        msg = (raw or b"").decode("utf-8", "replace")
        try:
            os.write(2, (msg + "\n").encode())
        except OSError:
            pass
        try:
            hook(msg)
        except BaseException:  # noqa: BLE001 - the process aborts next whatever happens
            pass

    cb = _ABORT_CALLBACK(_on_abort)
    _abort["callback"] = cb     # kept alive: ggml holds only the C pointer
    setter(ctypes.cast(cb, ctypes.c_void_p))
    return True


def ggml_abort(message: str) -> None:
    """Abort the process through ggml's own ``ggml_abort`` (what ``GGML_ABORT(message)`` does, the hook
    of :func:`set_abort_hook` included); for the recording worker's test fault. Does not return.

    Raises:
        RuntimeUnavailableError: this ggml exports no ``ggml_abort``.
    """
    for lib in binding.ggml_libraries():
        fn = getattr(lib, "ggml_abort", None)
        if fn is not None:
            fn(b"mtpscope-fault.c", 1, b"%s", message.encode())   # variadic: (file, line, fmt, ...)
    raise RuntimeUnavailableError("ggml_abort not found in the loaded libraries", key="ggml_abort")


def before_faulthandler(lines: Sequence[str]) -> list[str]:
    """``lines`` up to Python's faulthandler report (``Fatal Python error: ...`` and the stacks after
    it: the worker's Python, not llama.cpp's words), all of them when there is none."""
    out = list(lines)
    for i, ln in enumerate(out):
        if ln.startswith(_FAULTHANDLER_START[0]):
            return out[:i]
    return out


def abort_message(lines: Sequence[str], *, last_line: bool = True) -> str | None:
    """llama.cpp's own last words among the last ``lines`` of its stderr, or None.

    The last ``ggml_abort`` line (``"ggml-cpu/binary-ops.cpp:135: binary_op: unsupported types: ..."``)
    gives its message without the source path (``"binary_op: unsupported types: ..."``); for
    ggml-cuda's generic ``CUDA error`` abort the preceding ``CUDA error: <reason>`` line is used.
    Without an abort line: with ``last_line``, the last non-empty line before Python's faulthandler report,
    if any (a crash's last words); without (a process stopped from outside, whose log just ends), None.
    """
    clean = [ln.rstrip("\r\n") for ln in lines]
    for i in range(len(clean) - 1, -1, -1):
        m = _ABORT_LINE.match(clean[i].strip())
        if m:
            msg = m["msg"].strip()
            if msg == "CUDA error":
                for j in range(i - 1, max(i - 8, -1), -1):
                    if clean[j].strip().startswith("CUDA error:"):
                        return clean[j].strip()
            return msg
    if not last_line:
        return None
    for ln in reversed(before_faulthandler(clean)):
        t = ln.strip()
        if t and not t.startswith(_FAULTHANDLER_START) and not t.startswith("File \""):
            return t
    return None
