"""The native ``cb_eval`` capture: ``capture.c`` built on first use, and :class:`NativeCapture` over it.

Why: the scheduler calls ``cb_eval`` once per graph node to ask whether the node is wanted (about 140
times per drafter step); a Python callback pays a ctypes transition for each, which is the largest
cost tracing leaves inside the MTP loop. ``capture.c`` answers the asks with one ``strncmp`` and copies
the wanted node with ``ggml_backend_tensor_get``; Python reads the copy after the decode.

Build: :mod:`traces.run.native_build` (``$CC -O2 -shared -fPIC`` into ``<cache>/native/capture-<16 hex>.so``,
keyed by the source's and the flags' hash, written atomically: several workers may build at once). No compiler, a
failed build or ``MTPSCOPE_NATIVE_CAPTURE=0``: :func:`load` says why and the runtime keeps the Python
callback (:class:`mtpscope.traces.run.llama.capture.NodeCapture`); both copy the same bytes.

The library links against nothing: the ggml functions and the ``struct ggml_tensor`` field offsets it
uses are handed over in its ``mtps_capture`` struct (mirrored by :class:`_Capture`) by
:func:`mtpscope.traces.run.llama.capture.node_capture`, which checked them against ``ggml_tensor_overhead()``.

Imports: ctypes, numpy, mtpscope.errors, mtpscope.traces.run.native_build (no llama_cpp).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.errors import TraceError
from mtpscope.traces.run import native_build

SOURCE = Path(__file__).with_name("capture.c")
#: the compiler's flags (before ``-shared -fPIC``)
FLAGS = ("-O2",)
#: set to "0" to keep the Python ``cb_eval`` callback
ENV_SWITCH = "MTPSCOPE_NATIVE_CAPTURE"
#: ggml type ids of what a capture can hand back (ggml.h ``enum ggml_type``)
_GGML_F32, _GGML_F16 = 0, 1
_MAX_NAME = 64  # GGML_MAX_NAME; capture.c's MTPS_MAX_NAME
_state: dict[str, Any] = {}


class _Capture(ctypes.Structure):
    """ctypes mirror of capture.c's ``mtps_capture`` (same field order and types)."""

    _fields_ = [
        ("get", ctypes.c_void_p),
        ("nbytes", ctypes.c_void_p),
        ("name_offset", ctypes.c_int64),
        ("type_offset", ctypes.c_int64),
        ("ne_offset", ctypes.c_int64),
        ("enabled", ctypes.c_int64),
        ("name", ctypes.c_char * _MAX_NAME),
        ("buf", ctypes.c_void_p),
        ("cap", ctypes.c_int64),
        ("n_seen", ctypes.c_int64),
        ("n_asks", ctypes.c_int64),
        ("nbytes_got", ctypes.c_int64),
        ("type", ctypes.c_int64),
        ("ne", ctypes.c_int64 * 4),
    ]


def library_path() -> Path:
    """Where the built library lives: ``<cache>/native/capture-<16 hex>.so`` (:func:`traces.run.native_build.library_path`)."""
    return native_build.library_path(SOURCE, FLAGS)


def build(path: Path | None = None) -> Path:
    """Compile ``capture.c`` into ``path`` (default :func:`library_path`) unless it is there already.

    Raises:
        TraceError: no C compiler (``$CC`` or ``cc`` not on PATH), or the compiler failed (its first
            error line quoted).
    """
    return native_build.build(SOURCE, FLAGS, path, what="the native capture")


def load() -> ctypes.CDLL | None:
    """The built library (built first if needed), or None; :func:`unavailable_reason` then says why.
    Tried once per process (:func:`traces.run.native_build.load_once`)."""
    def open_built() -> ctypes.CDLL:
        lib = ctypes.CDLL(os.fspath(build()))
        lib.mtps_capture_reset.argtypes = [ctypes.POINTER(_Capture)]
        lib.mtps_capture_reset.restype = None
        lib.mtps_capture_free.argtypes = [ctypes.POINTER(_Capture)]
        lib.mtps_capture_free.restype = None
        return lib

    return native_build.load_once(_state, ENV_SWITCH, open_built)


def unavailable_reason() -> str | None:
    """Why :func:`load` gave None (None when it gave the library or was not tried)."""
    return _state.get("why")


def kind() -> str | None:
    """Which ``cb_eval`` capture this process uses: ``"native"``, ``"python (<why not native>)"``, or None
    before :func:`load` was tried (for the trace manifest's ``runtime.cb_eval``)."""
    if "lib" not in _state:
        return None
    why = _state.get("why")
    return "native" if why is None else f"python ({why})"


class NativeCapture:
    """A ``cb_eval`` capture of one node, in C: the interface of :class:`.capture.NodeCapture`
    (:meth:`reset` before each decode, :meth:`get` after it; :attr:`enabled`; :attr:`callback` for
    ``llama_context_params.cb_eval``, plus :attr:`user_data` for ``cb_eval_user_data``).

    Only the first occurrence of the node in a decode is kept. A Ctrl-C during a decode is raised after the
    decode returns (the graph is not cut short: a Python signal handler cannot run inside C).

    Args:
        lib: :func:`load`'s library.
        name: the ggml node name, e.g. ``"result_norm"`` (at most 63 bytes).
        callback_type: ``llama_cpp.ggml_backend_sched_eval_callback`` (the ``cb_eval`` field's type).
        tensor_get / nbytes: addresses of ``ggml_backend_tensor_get`` / ``ggml_nbytes``.
        name_offset / type_offset / ne_offset: byte offsets of those fields in ``struct ggml_tensor``.

    Raises:
        TraceError: a name longer than ggml allows.
    """

    kind = "native"

    def __init__(self, lib: ctypes.CDLL, name: str, *, callback_type: Any, tensor_get: int, nbytes: int,
                 name_offset: int, type_offset: int, ne_offset: int) -> None:
        raw = name.encode()
        if len(raw) >= _MAX_NAME:
            raise TraceError("ggml node name too long", key="name", expected=f"< {_MAX_NAME} bytes",
                             actual=len(raw))
        self.names = frozenset([name])
        self._lib = lib
        self._c = _Capture(get=tensor_get, nbytes=nbytes, name_offset=name_offset, type_offset=type_offset,
                           ne_offset=ne_offset, enabled=1, name=raw)
        self._ptr = ctypes.pointer(self._c)
        self.user_data = ctypes.cast(self._ptr, ctypes.c_void_p)
        self.callback = callback_type(ctypes.cast(lib.mtps_capture_cb, ctypes.c_void_p).value)
        #: never set (the interface of NodeCapture: C raises nothing)
        self.error: BaseException | None = None

    @property
    def enabled(self) -> bool:
        """False: every node is answered "not needed" (nothing is copied)."""
        return bool(self._c.enabled)

    @enabled.setter
    def enabled(self, on: bool) -> None:
        self._c.enabled = 1 if on else 0

    @property
    def n_asks(self) -> int:
        """Nodes the scheduler asked about in the last decode."""
        return int(self._c.n_asks)

    def reset(self) -> None:
        """Forget what the previous decode captured (before each decode)."""
        self._lib.mtps_capture_reset(self._ptr)

    def get(self, name: str, occurrence: int = 0) -> np.ndarray | None:
        """The node's value from the last decode as float32 in numpy order (``ne`` reversed, trailing 1s
        dropped; e.g. ``result_norm`` of one token -> ``(n_embd,)`` ... ``(1, n_embd)`` as ggml has it), a
        fresh copy; None when it was not computed, is another name, or ``occurrence`` > 0.

        Raises:
            TraceError: the copy ran out of memory, or the node's type is neither F32 nor F16.
        """
        c = self._c
        if name not in self.names or occurrence != 0 or c.n_seen == 0:
            return None
        if c.nbytes_got < 0:
            raise TraceError("out of memory copying a captured node", key=name)
        ne = [int(c.ne[i]) for i in range(4)]
        while len(ne) > 1 and ne[-1] == 1:
            ne.pop()
        if c.type == _GGML_F32:
            dtype: Any = np.float32
        elif c.type == _GGML_F16:
            dtype = np.float16
        else:
            raise TraceError("captured node of an unexpected ggml type", key=name, expected="F32 or F16",
                             actual=int(c.type))
        out = np.empty(int(c.nbytes_got) // np.dtype(dtype).itemsize, dtype=dtype)
        ctypes.memmove(out.ctypes.data, c.buf, out.nbytes)
        if out.size == int(np.prod(ne)):
            out = out.reshape(ne[::-1])
        return out if dtype is np.float32 else out.astype(np.float32)

    def raise_pending(self) -> None:
        """Nothing to raise (the interface of NodeCapture)."""

    def close(self) -> None:
        """Free the copy buffer (after the context using this capture is freed). Idempotent."""
        if self._lib is not None:
            self._lib.mtps_capture_free(self._ptr)
            self._lib = None  # type: ignore[assignment]  # None marks the buffer freed (close() is idempotent)


__all__ = ["ENV_SWITCH", "NativeCapture", "build", "kind", "library_path", "load", "unavailable_reason"]
