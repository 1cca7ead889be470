"""Graph capture: a ``cb_eval`` callback that copies named ggml graph nodes (e.g. ``result_norm``, the
drafter's h_inner) after they are computed, keyed by name and order.

* :class:`GgmlTensor`: a ctypes mirror of ``struct ggml_tensor`` (``ggml/include/ggml.h`` of the
  llama.cpp that llama-cpp-python 0.3.36 vendors), checked against ``ggml_tensor_overhead()`` at run time
  (:func:`tensor_functions`).
* :class:`NodeCapture`: the callback in Python, any node names.
* :func:`node_capture`: the drafter's one-node capture in C (:mod:`.native_capture`, ``capture.c``) where
  that builds, this Python one otherwise.

Shapes: ggml ``ne`` order is innermost first; arrays returned here are in numpy ``shape`` order
(outermost first), e.g. a ggml node with ``ne = [n_embd, n_tokens]`` comes back as ``(n_tokens, n_embd)``.

Imports: ctypes, numpy, mtpscope.errors, :mod:`.binding`, :mod:`.process` (a pending Ctrl-C),
:mod:`.native_capture`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from typing import Any

import numpy as np

from mtpscope.errors import RuntimeUnavailableError
from mtpscope.traces.run.llama import binding, native_capture
from mtpscope.traces.run.llama.process import sigint_state

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_MAX_OP_PARAMS = 64
GGML_MAX_NAME = 64
#: sizeof(struct ggml_object) in ggml.c: size_t offs, size_t size, pointer next, enum type, char pad[4].
GGML_OBJECT_SIZE = 32
GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1


class GgmlTensor(ctypes.Structure):
    """ctypes mirror of ``struct ggml_tensor`` (ggml/include/ggml.h, llama.cpp vendored by 0.3.36).

    ``ne`` is in ggml order (innermost first), ``nb`` are byte strides. Only read, never written.
    """

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


_NAME_OFFSET = GgmlTensor.name.offset
_checked: list[bool] = []  # [True] once tensor_functions() compared the sizes


def _address(fn: Any) -> int:
    """A loaded ctypes function's address (never null: the library exported it)."""
    addr = ctypes.cast(fn, ctypes.c_void_p).value
    if addr is None:
        raise RuntimeUnavailableError("a ggml function has a null address", key="ggml")
    return addr


def tensor_functions() -> dict[str, Any]:
    """:func:`~mtpscope.traces.run.llama.binding.ggml_lib`'s functions (``"nbytes"``, ``"tensor_get"``)
    once this ggml's ``struct ggml_tensor`` is known to have :class:`GgmlTensor`'s size
    (``ggml_tensor_overhead() - GGML_OBJECT_SIZE``).

    Raises:
        RuntimeUnavailableError: the sizes differ (another ggml than the one the mirror was written
            for), or the ggml functions are missing.
    """
    g = binding.ggml_lib()
    if not _checked:
        want = g["tensor_overhead"]() - GGML_OBJECT_SIZE
        if want != ctypes.sizeof(GgmlTensor):
            raise RuntimeUnavailableError(
                "struct ggml_tensor layout differs from mtpscope's ctypes mirror", key="ggml_tensor",
                expected=f"sizeof {ctypes.sizeof(GgmlTensor)}", actual=f"sizeof {want}")
        _checked.append(True)
    return g


class NodeCapture:
    """A ``cb_eval`` callback that copies named graph nodes after they are computed.

    Pass :attr:`callback` as ``llama_context_params.cb_eval``. Before each decode call :meth:`reset`;
    after it, :meth:`get` returns a node's value as float32 numpy in ``shape`` order (``ne`` reversed,
    e.g. ``result_norm`` with ``ne = [n_embd, n_tokens]`` -> ``(n_tokens, n_embd)``). Node names can
    repeat in one graph; :meth:`get` takes the occurrence index (0 = first computed).

    Set :attr:`enabled` False to answer "not needed" for every node (the scheduler then runs the
    graph in one piece, but the Python callback is still invoked once per node).

    The callback runs once per graph node (~140 per drafter step), so its cost is the capture's cost
    in the loop. With ``fixed_graph`` (a context that always decodes the same batch shape, e.g. the
    MTP drafter's one-token steps) it remembers, per node address, whether the node is wanted and how
    to copy it: a dict lookup instead of reading the node's name (1.7 µs here) on every call. llama.cpp
    rebuilds such a graph in the same memory in the same order, so addresses stay meaningful; as a
    guard the remembered answers are dropped when a decode asks about a different number of nodes than
    the one before, or when a remembered node turns out to have another name.

    Args:
        names: exact ggml node names to capture, e.g. ``("result_norm", "h_nextn")``.
        fixed_graph: remember answers and copy layouts per node address (see above).
    """

    def __init__(self, names: Iterable[str], *, fixed_graph: bool = False) -> None:
        self.names = frozenset(names)
        self._wanted = frozenset(n.encode() for n in self.names)
        self.enabled = True
        self.fixed_graph = bool(fixed_graph)
        self.captured: list[tuple[str, np.ndarray]] = []
        #: an exception (e.g. KeyboardInterrupt) raised inside the callback, kept for :meth:`raise_pending`
        self.error: BaseException | None = None
        self._ggml = tensor_functions()
        llama_cpp = binding.llama()
        wanted = self._wanted
        string_at = ctypes.string_at
        off = _NAME_OFFSET
        memo: dict[int, bool] = {}
        self._memo = memo
        self._layout: dict[int, tuple[str, Any, tuple[int, ...], int]] = {}
        self._asks = [0, -1]           # nodes asked about in this decode, in the previous one
        asks = self._asks
        fixed = self.fixed_graph

        def _cb(t: int, ask: bool, user_data: Any) -> bool:
            # never raise: ctypes would print "Exception ignored" and drop the exception (a Ctrl-C
            # would be lost). Remember it, answer False (not needed / stop this graph split) so that
            # llama.cpp finishes the decode quickly, and let raise_pending() re-raise it in Python.
            try:
                if self.error is not None or sigint_state["pending"]:
                    return False
                if ask:
                    if not fixed:
                        return self.enabled and string_at(t + off) in wanted
                    asks[0] += 1
                    v = memo.get(t)
                    if v is None:
                        v = memo[t] = string_at(t + off) in wanted
                    return self.enabled and v
                self._copy(t)
                return True
            except BaseException as e:  # noqa: BLE001 - KeyboardInterrupt included, on purpose
                if self.error is None:
                    self.error = e
                return False

        self._cb = _cb

        self.callback = llama_cpp.ggml_backend_sched_eval_callback(_cb)

    def _copy(self, t: int) -> None:
        lay = self._layout.get(t) if self.fixed_graph else None
        if lay is not None:   # fixed graph: the node's name, dtype, numpy shape and size as last time
            name, dtype, shape, nbytes = lay
            buf = np.empty(shape, dtype=dtype)
            self._ggml["tensor_get"](t, buf.ctypes.data, 0, nbytes)
            self.captured.append((name, buf if dtype is np.float32 else buf.astype(np.float32)))
            return
        tensor = GgmlTensor.from_address(t)
        name = tensor.name.decode("utf-8", "replace")
        if self.fixed_graph and name not in self.names:   # a remembered address now holds another node
            self._memo.clear()
            self._layout.clear()
            return
        if tensor.type not in (GGML_TYPE_F32, GGML_TYPE_F16):
            return  # nothing the recorder asks for; skip rather than misread
        nbytes = self._ggml["nbytes"](t)
        dtype = np.float32 if tensor.type == GGML_TYPE_F32 else np.float16
        ne = [int(tensor.ne[i]) for i in range(GGML_MAX_DIMS)]
        while len(ne) > 1 and ne[-1] == 1:
            ne.pop()
        buf = np.empty(int(np.prod(ne)), dtype=dtype)
        if buf.nbytes != nbytes:  # non-contiguous view: copy the raw bytes, keep them flat
            raw = np.empty(nbytes, dtype=np.uint8)
            self._ggml["tensor_get"](t, raw.ctypes.data, 0, nbytes)
            self.captured.append((name, raw))
            return
        self._ggml["tensor_get"](t, buf.ctypes.data, 0, nbytes)
        if self.fixed_graph:
            self._layout[t] = (name, dtype, tuple(ne[::-1]), int(nbytes))
        self.captured.append((name, buf.reshape(ne[::-1]).astype(np.float32, copy=False)))

    def raise_pending(self) -> None:
        """Re-raise (once) the exception the callback caught during the last decode, if any.

        :meth:`mtpscope.traces.run.llama.model.LlamaContext.decode` calls this right after ``llama_decode``
        returns, so a Ctrl-C that arrived while llama.cpp ran the graph ends the run as a
        ``KeyboardInterrupt``.
        """
        e, self.error = self.error, None
        if e is not None:
            raise e

    def reset(self) -> None:
        """Forget what the previous decode captured (before each decode)."""
        self.captured.clear()
        if self.fixed_graph:
            n, prev = self._asks
            if n and prev >= 0 and n != prev:   # the graph changed: remembered addresses may be stale
                self._memo.clear()
                self._layout.clear()
            if n:
                self._asks[1] = n
            self._asks[0] = 0

    def get(self, name: str, occurrence: int = 0) -> np.ndarray | None:
        """The ``occurrence``-th captured value of node ``name`` (float32, numpy order), or None."""
        seen = 0
        for n, arr in self.captured:
            if n == name:
                if seen == occurrence:
                    return arr
                seen += 1
        return None


def node_capture(name: str, *, native: bool = True) -> NodeCapture | native_capture.NativeCapture:
    """The capture of one node in a context that decodes one shape over and over (the drafter's
    ``result_norm``): :class:`.native_capture.NativeCapture` where ``capture.c`` builds and loads
    (and ``native``), else :class:`NodeCapture` with ``fixed_graph``. Both copy the same bytes;
    :func:`.native_capture.kind` says which one this process uses."""
    lib = native_capture.load() if native else None
    if lib is None:
        return NodeCapture([name], fixed_graph=True)
    g = tensor_functions()
    return native_capture.NativeCapture(
        lib, name, callback_type=binding.llama().ggml_backend_sched_eval_callback,
        tensor_get=_address(g["tensor_get"]), nbytes=_address(g["nbytes"]), name_offset=_NAME_OFFSET,
        type_offset=GgmlTensor.type.offset, ne_offset=GgmlTensor.ne.offset)
