"""The real llama.cpp runtime, through llama-cpp-python (imported lazily).

Nothing in mtpscope imports ``llama_cpp`` at module import time: :func:`llama` does it on first use and
raises :class:`~mtpscope.errors.RuntimeUnavailableError` with an install hint when the package or a
symbol the recorder needs is missing. This module wraps the low-level C API that the MTP loop needs:

* :class:`LlamaModel` / :class:`LlamaContext`: load a GGUF, create a context (target or MTP drafter),
  decode a batch, read logits and the "nextn" hidden rows as numpy views.
* :class:`TokenBatch` (tokens only) and :class:`DraftBatch` (token + one hidden row per token, the
  input of a ``gemma4-assistant`` drafter step).
* :class:`GgmlTensor`: a ctypes mirror of ``struct ggml_tensor`` (``ggml/include/ggml.h`` of the
  llama.cpp that llama-cpp-python 0.3.36 vendors), checked against ``ggml_tensor_overhead()`` at run time.
* :class:`NodeCapture`: a ``cb_eval`` callback that copies the output of named graph nodes (e.g.
  ``result_norm``, the drafter's h_inner) after they are computed, keyed by name and order.
  :func:`node_capture` gives the drafter's one-node capture in C (:mod:`traces.native_capture`) where
  that builds, this Python one otherwise.

Shapes: GGUF / ggml ``ne`` order is innermost first; arrays returned here are in numpy ``shape`` order
(outermost first), e.g. a ggml node with ``ne = [n_embd, n_tokens]`` comes back as ``(n_tokens, n_embd)``.
"""

from __future__ import annotations

import collections
import ctypes
import contextlib
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from mtpscope.errors import RuntimeUnavailableError, TraceError
from mtpscope.traces.run import native_capture

#: llama-cpp-python version the recorder was written against (vendors llama.cpp with gemma4-assistant).
SUPPORTED_VERSION = "0.3.36"

_REQUIRED_SYMBOLS = (
    "LLAMA_CONTEXT_TYPE_MTP",
    "llama_model_n_layer_nextn",
    "llama_model_n_embd_out",
    "llama_model_n_embd_inp",
    "llama_get_memory",
    "llama_memory_seq_rm",
    "llama_batch_init",
    "llama_get_logits_ith",
    "ggml_backend_sched_eval_callback",
)
_REQUIRED_EXT_SYMBOLS = (
    "llama_set_embeddings_nextn",
    "llama_get_embeddings_nextn_ith",
    "llama_get_ctx_other",
)

_state: dict[str, Any] = {}
_log_lines: collections.deque[str] = collections.deque(maxlen=200)
_log_sinks: list[list[str]] = []  # capture_log() blocks in progress


def llama() -> ModuleType:
    """The ``llama_cpp`` module, imported on first call, with the backend initialised.

    Raises:
        RuntimeUnavailableError: llama-cpp-python is not installed, or it lacks a symbol the MTP loop
            needs (context type MTP, nextn embeddings), i.e. it is older than 0.3.36.
    """
    mod = _state.get("llama_cpp")
    if mod is not None:
        return mod
    try:
        import llama_cpp  # noqa: PLC0415 - lazy on purpose
    except ImportError as e:  # pragma: no cover - exercised by monkeypatching sys.modules
        raise RuntimeUnavailableError(
            "llama-cpp-python is not installed; install it with "
            f"`pip install 'llama-cpp-python=={SUPPORTED_VERSION}'` (or `pip install -e '.[runtime]'`)",
            key="llama_cpp", expected=f"llama-cpp-python {SUPPORTED_VERSION}", actual=f"ImportError: {e}",
        ) from e
    version = getattr(llama_cpp, "__version__", "unknown")
    for sym in _REQUIRED_SYMBOLS:
        if not hasattr(llama_cpp, sym):
            raise RuntimeUnavailableError(
                "llama-cpp-python lacks a symbol the MTP recorder needs", key=sym,
                expected=f"llama-cpp-python {SUPPORTED_VERSION}", actual=f"llama-cpp-python {version}")
    try:
        from llama_cpp import llama_cpp_ext  # noqa: PLC0415
    except (ImportError, AttributeError) as e:
        raise RuntimeUnavailableError(
            "llama-cpp-python lacks llama_cpp_ext (nextn embeddings for MTP drafters)",
            key="llama_cpp.llama_cpp_ext", expected=f"llama-cpp-python {SUPPORTED_VERSION}",
            actual=f"llama-cpp-python {version}: {e}") from e
    for sym in _REQUIRED_EXT_SYMBOLS:
        if not hasattr(llama_cpp_ext, sym):
            raise RuntimeUnavailableError(
                "llama-cpp-python lacks an MTP extension symbol", key=f"llama_cpp_ext.{sym}",
                expected=f"llama-cpp-python {SUPPORTED_VERSION}", actual=f"llama-cpp-python {version}")
    _install_log_callback(llama_cpp)
    llama_cpp.llama_backend_init()
    _state["ext"] = llama_cpp_ext
    _state["llama_cpp"] = llama_cpp
    return llama_cpp


def ext() -> ModuleType:
    """``llama_cpp.llama_cpp_ext`` (nextn embeddings, ctx_other); see :func:`llama` for errors."""
    llama()
    return _state["ext"]


def available() -> bool:
    """True when :func:`llama` would succeed (llama-cpp-python importable with the MTP symbols)."""
    try:
        llama()
    except RuntimeUnavailableError:
        return False
    return True


#: SIGINT bookkeeping for :func:`deferred_sigint`: "native" while llama_decode runs, "pending" when a
#: Ctrl-C arrived then
_sigint: dict[str, bool] = {"native": False, "pending": False}


def _on_sigint(signum: int, frame: Any) -> None:  # noqa: ARG001
    if _sigint["native"]:  # inside llama_decode (this runs in a ctypes callback): raising would be lost
        _sigint["pending"] = True
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
        _sigint["pending"] = False


def raise_pending_log() -> None:
    """Re-raise (once) an exception (e.g. ``KeyboardInterrupt``) that arrived inside the llama.cpp log
    callback, where ctypes would otherwise drop it. Called after each decode and load."""
    e = _state.pop("log_error", None)
    if e is not None:
        raise e


def recent_log(n: int = 12) -> str:
    """The last ``n`` lines llama.cpp logged (kept in memory; printed only if MTPSCOPE_LLAMA_LOG=1)."""
    return "".join(list(_log_lines)[-n:]).strip()


@contextlib.contextmanager
def capture_log() -> Iterator[list[str]]:
    """Every piece of text llama.cpp logs inside the block (all levels, in order, as logged: a line may
    come in several pieces; ``"".join(pieces).splitlines()`` gives the lines). For tests and checks that
    compare with what llama.cpp reports (e.g. buffer sizes, inspector/estimate.py)."""
    llama()  # installs the log callback
    sink: list[str] = []
    _log_sinks.append(sink)
    try:
        yield sink
    finally:
        _log_sinks.remove(sink)


def _install_log_callback(llama_cpp: ModuleType) -> None:
    echo = os.environ.get("MTPSCOPE_LLAMA_LOG", "") not in ("", "0")

    @llama_cpp.llama_log_callback
    def _log(level: int, text: bytes, user_data: Any) -> None:  # noqa: ARG001
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

    _state["log_cb"] = _log  # keep the callback alive for the life of the process
    llama_cpp.llama_log_set(_log, ctypes.c_void_p(0))


# --------------------------------------------------------------------------------------------------
# ggml bits llama-cpp-python does not bind: struct ggml_tensor, ggml_nbytes, ggml_backend_tensor_get
# --------------------------------------------------------------------------------------------------

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


def _ggml_lib() -> Any:
    """The ggml functions we call, resolved from the libraries llama-cpp-python loaded."""
    lib = _state.get("ggml")
    if lib is not None:
        return lib
    llama_cpp = llama()
    candidates: list[Any] = []
    libggml = getattr(_import_ggml(), "libggml", None)
    if libggml is not None:
        candidates.append(libggml)
    candidates.append(_libllama(llama_cpp))
    for cand in candidates:
        try:
            nbytes = cand.ggml_nbytes
            get = cand.ggml_backend_tensor_get
            overhead = cand.ggml_tensor_overhead
        except AttributeError:
            continue
        nbytes.argtypes = [ctypes.c_void_p]
        nbytes.restype = ctypes.c_size_t
        get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
        get.restype = None
        overhead.argtypes = []
        overhead.restype = ctypes.c_size_t
        want = overhead() - GGML_OBJECT_SIZE
        if want != ctypes.sizeof(GgmlTensor):
            raise RuntimeUnavailableError(
                "struct ggml_tensor layout differs from mtpscope's ctypes mirror", key="ggml_tensor",
                expected=f"sizeof {ctypes.sizeof(GgmlTensor)}", actual=f"sizeof {want}")
        ns = {"nbytes": nbytes, "tensor_get": get}
        hook = getattr(cand, "ggml_set_abort_callback", None)
        if hook is not None:
            hook.argtypes = [ctypes.c_void_p]
            hook.restype = ctypes.c_void_p
            ns["set_abort_callback"] = hook
        for opt in ("ggml_commit", "ggml_version"):
            fn = getattr(cand, opt, None)
            if fn is not None:
                fn.argtypes = []
                fn.restype = ctypes.c_char_p
                ns[opt] = fn
        _state["ggml"] = ns
        return ns
    raise RuntimeUnavailableError("ggml_nbytes / ggml_backend_tensor_get not found in the loaded libraries",
                                  key="ggml_backend_tensor_get")


def _libllama(llama_cpp: ModuleType) -> Any:
    """The ``ctypes.CDLL`` of libllama (``llama_cpp.llama_cpp._lib``); ggml symbols resolve through it too."""
    inner = getattr(llama_cpp, "llama_cpp", None)
    lib = getattr(inner, "_lib", None) or getattr(llama_cpp, "_lib", None)
    if lib is None:
        raise RuntimeUnavailableError("cannot find libllama in llama-cpp-python", key="llama_cpp.llama_cpp._lib")
    return lib


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
        self._ggml = _ggml_lib()
        llama_cpp = llama()
        wanted = self._wanted
        string_at = ctypes.string_at
        off = _NAME_OFFSET
        memo: dict[int, bool] = {}
        self._memo = memo
        self._layout: dict[int, tuple[str, Any, tuple[int, ...], int]] = {}
        self._asks = [0, -1]           # nodes asked about in this decode, in the previous one
        asks = self._asks
        fixed = self.fixed_graph

        def _cb(t: int, ask: bool, user_data: Any) -> bool:  # noqa: ARG001
            # never raise: ctypes would print "Exception ignored" and drop the exception (a Ctrl-C
            # would be lost). Remember it, answer False (not needed / stop this graph split) so that
            # llama.cpp finishes the decode quickly, and let raise_pending() re-raise it in Python.
            try:
                if self.error is not None or _sigint["pending"]:
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

        :meth:`LlamaContext.decode` calls this right after ``llama_decode`` returns, so a Ctrl-C
        that arrived while llama.cpp ran the graph ends the run as a ``KeyboardInterrupt``.
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
    ``result_norm``): :class:`traces.native_capture.NativeCapture` where ``capture.c`` builds and loads
    (and ``native``), else :class:`NodeCapture` with ``fixed_graph``. Both copy the same bytes;
    :func:`traces.native_capture.kind` says which one this process uses."""
    lib = native_capture.load() if native else None
    if lib is None:
        return NodeCapture([name], fixed_graph=True)
    g = _ggml_lib()
    return native_capture.NativeCapture(
        lib, name, callback_type=llama().ggml_backend_sched_eval_callback,
        tensor_get=ctypes.cast(g["tensor_get"], ctypes.c_void_p).value,
        nbytes=ctypes.cast(g["nbytes"], ctypes.c_void_p).value, name_offset=_NAME_OFFSET,
        type_offset=GgmlTensor.type.offset, ne_offset=GgmlTensor.ne.offset)


# --------------------------------------------------------------------------------------------------
# models, contexts, batches
# --------------------------------------------------------------------------------------------------


class _ClosedOnDelete:
    """Calls ``close()`` when garbage-collected (best effort: errors at interpreter exit are ignored)."""

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


class LlamaModel(_ClosedOnDelete):
    """A GGUF loaded by llama.cpp (``llama_model_load_from_file``). Call :meth:`close` when done.

    Args:
        path: the GGUF file.
        n_gpu_layers: layers to offload (-1 = all, 0 = CPU only).

    Raises:
        TraceError: llama.cpp could not load the file (the message carries llama.cpp's last log lines).
        RuntimeUnavailableError: llama-cpp-python missing.
    """

    def __init__(self, path: str | os.PathLike[str], *, n_gpu_layers: int = 0) -> None:
        lc = llama()
        self.path = Path(path)
        params = lc.llama_model_default_params()
        params.n_gpu_layers = int(n_gpu_layers)
        params.use_mmap = True
        _log_lines.clear()
        ptr = lc.llama_model_load_from_file(os.fspath(self.path).encode(), params)
        pending = _state.pop("log_error", None)  # a Ctrl-C during the load
        if pending is not None:
            if ptr:
                lc.llama_model_free(ptr)
            raise pending
        if not ptr:
            raise TraceError(f"llama.cpp could not load the model: {recent_log(4) or 'no log'}", path=self.path)
        self.ptr = ptr
        self.vocab = lc.llama_model_get_vocab(ptr)
        self.n_vocab = int(lc.llama_vocab_n_tokens(self.vocab))
        self.n_embd = int(lc.llama_model_n_embd(ptr))
        self.n_embd_inp = int(lc.llama_model_n_embd_inp(ptr))
        self.n_embd_out = int(lc.llama_model_n_embd_out(ptr))
        self.n_layer = int(lc.llama_model_n_layer(ptr))
        self.n_layer_nextn = int(lc.llama_model_n_layer_nextn(ptr))
        self.architecture = self.meta("general.architecture")
        self.n_gpu_layers = int(n_gpu_layers)

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as llama.cpp renders it to a string, or None when absent."""
        lc = llama()
        buf = ctypes.create_string_buffer(1 << 16)
        n = lc.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            lc.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, end of turn, ...), as llama.cpp decides."""
        return bool(llama().llama_vocab_is_eog(self.vocab, int(token)))

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text`` (llama_tokenize; ``add_special`` adds BOS where the vocab wants it)."""
        lc = llama()
        data = text.encode("utf-8")
        cap = len(data) + 16
        while True:
            arr = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self.vocab, data, len(data), arr, cap, add_special, parse_special)
            if n >= 0:
                return list(arr[:n])
            cap = -n

    def token_to_piece(self, token: int) -> bytes:
        """The bytes of one token (special tokens rendered)."""
        lc = llama()
        buf = ctypes.create_string_buffer(64)
        n = lc.llama_token_to_piece(self.vocab, int(token), buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lc.llama_token_to_piece(self.vocab, int(token), buf, len(buf), 0, True)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int]) -> str:
        """Text of ``tokens`` (pieces joined, decoded as UTF-8 with replacement)."""
        return b"".join(self.token_to_piece(t) for t in tokens).decode("utf-8", "replace")

    def apply_chat_template(self, user_text: str) -> str:
        """``user_text`` as one user turn under the GGUF's own ``tokenizer.chat_template`` (Jinja).

        Rendered with llama-cpp-python's Jinja2 chat formatter, with the generation prompt added.

        Raises:
            TraceError: the GGUF has no chat template.
        """
        return self.render_chat([{"role": "user", "content": user_text}])

    def render_chat(self, messages: Sequence[dict[str, str]]) -> str:
        """A chat (``[{"role", "content"}, ...]``) under the GGUF's own ``tokenizer.chat_template``, with
        the generation prompt added (llama-cpp-python's Jinja2 chat formatter).

        Raises:
            TraceError: the GGUF has no chat template, or the template refuses the messages (its error
                message is kept).
        """
        tmpl = self.meta("tokenizer.chat_template")
        if not tmpl:
            raise TraceError("the model has no chat template (--chat and chat prompts need one)", path=self.path,
                             key="tokenizer.chat_template")
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter  # noqa: PLC0415

        lc = llama()
        bos = lc.llama_vocab_bos(self.vocab)
        eos = lc.llama_vocab_eos(self.vocab)
        bos_s = self.token_to_piece(bos).decode("utf-8", "replace") if bos >= 0 else ""
        eos_s = self.token_to_piece(eos).decode("utf-8", "replace") if eos >= 0 else ""
        fmt = Jinja2ChatFormatter(template=tmpl, eos_token=eos_s, bos_token=bos_s,
                                  add_generation_prompt=True)
        try:
            return fmt(messages=[dict(m) for m in messages]).prompt
        except Exception as e:  # noqa: BLE001 - jinja2's errors (TemplateError, TypeError) -> one line
            raise TraceError(f"the chat template refused the messages: {type(e).__name__}: {e}", path=self.path,
                             key="tokenizer.chat_template") from None

    def close(self) -> None:
        """Free the model (idempotent)."""
        if getattr(self, "ptr", None):
            llama().llama_model_free(self.ptr)
            self.ptr = None


class LlamaContext(_ClosedOnDelete):
    """A llama.cpp context on a :class:`LlamaModel`.

    Args:
        model: the loaded model.
        n_ctx: context size in tokens.
        n_batch: largest batch handed to :meth:`decode`.
        mtp_of: for an MTP drafter context, the target's context (``ctx_type = MTP``, ``ctx_other``):
            the drafter then reads the target's KV cache.
        capture: a :class:`NodeCapture` (or :func:`node_capture`'s native one) installed as ``cb_eval``.
        flash_attn: flash attention on (True), off (False), or llama.cpp's auto (None).
        n_threads: CPU threads (None = llama.cpp default).
        nextn: turn on the nextn hidden-state output (``llama_set_embeddings_nextn``); ``masked``
            True keeps one row per output row (drafter), False one row per batch token (target).
        n_ubatch / n_seq_max / kv_unified / swa_full / type_k / type_v: the ``llama_context_params``
            fields of those names (``n_ubatch`` default ``n_batch``; None keeps llama.cpp's default;
            ``type_k`` / ``type_v`` are ggml type ids, e.g. 8 = Q8_0).

    Raises:
        TraceError: llama.cpp could not create the context.
    """

    def __init__(self, model: LlamaModel, *, n_ctx: int, n_batch: int, mtp_of: LlamaContext | None = None,
                 capture: NodeCapture | native_capture.NativeCapture | None = None, flash_attn: bool | None = False,
                 n_threads: int | None = None, nextn: bool = True, masked: bool = False,
                 n_ubatch: int | None = None, n_seq_max: int = 1, kv_unified: bool | None = None,
                 swa_full: bool | None = None, type_k: int | None = None, type_v: int | None = None) -> None:
        lc = llama()
        self.model = model
        params = lc.llama_context_default_params()
        params.n_ctx = int(n_ctx)
        params.n_batch = int(n_batch)
        params.n_ubatch = int(n_batch if n_ubatch is None else n_ubatch)
        params.n_seq_max = int(n_seq_max)
        # None keeps llama.cpp's default (llama_context_default_params)
        for name, value in (("kv_unified", kv_unified), ("swa_full", swa_full), ("type_k", type_k),
                            ("type_v", type_v)):
            if value is not None:
                setattr(params, name, value)
        params.no_perf = True
        if flash_attn is not None:
            params.flash_attn_type = (lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                                      else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        if n_threads:
            params.n_threads = int(n_threads)
            params.n_threads_batch = int(n_threads)
        if mtp_of is not None:
            params.ctx_type = lc.LLAMA_CONTEXT_TYPE_MTP
            params.ctx_other = mtp_of.ptr
        self.capture = capture
        if capture is not None:
            params.cb_eval = capture.callback
            params.cb_eval_user_data = getattr(capture, "user_data", None)
        _log_lines.clear()
        ptr = lc.llama_init_from_model(model.ptr, params)
        pending = _state.pop("log_error", None)  # a Ctrl-C while the context was made
        if pending is not None:
            if ptr:
                lc.llama_free(ptr)
            raise pending
        if not ptr:
            raise TraceError(f"llama.cpp could not create a context: {recent_log(4) or 'no log'}",
                             path=model.path)
        self.ptr = ptr
        self.n_ctx = int(lc.llama_n_ctx(ptr))
        self.n_batch = int(lc.llama_n_batch(ptr))  # llama.cpp clamps n_batch to n_ctx
        self.mem = lc.llama_get_memory(ptr)
        self.n_vocab = model.n_vocab
        self.n_embd_out = model.n_embd_out
        if nextn:
            ext().llama_set_embeddings_nextn(ptr, True, bool(masked))

    def decode(self, batch: Any) -> None:
        """``llama_decode``; raises :class:`TraceError` with the return code on failure, or the
        exception (e.g. ``KeyboardInterrupt``) the ``cb_eval`` capture caught during the decode."""
        _sigint["native"] = True
        try:
            rc = llama().llama_decode(self.ptr, batch.batch)
        finally:
            _sigint["native"] = False
        if _sigint["pending"]:
            _sigint["pending"] = False
            if self.capture is not None:
                self.capture.error = None
            raise KeyboardInterrupt
        if self.capture is not None:
            self.capture.raise_pending()
        raise_pending_log()
        if rc != 0:
            raise TraceError(f"llama_decode failed with rc {rc}: {recent_log(3) or 'no log'}",
                             path=self.model.path)

    def logits(self, i: int) -> np.ndarray:
        """Logits of output row ``i`` (batch index; -1 = last), a float32 view of shape (n_vocab,).

        The view is only valid until the next decode: copy it to keep it.
        """
        p = llama().llama_get_logits_ith(self.ptr, int(i))
        if not p:
            raise TraceError(f"no logits for batch row {i}", path=self.model.path)
        return np.ctypeslib.as_array(p, shape=(self.n_vocab,))

    def nextn(self, i: int) -> np.ndarray:
        """Hidden row ``i`` from ``llama_get_embeddings_nextn_ith``, a float32 view of shape (n_embd_out,).

        Target context (unmasked): row per batch token, the post-final-norm hidden state. Drafter
        context (masked): row per output, the post-projection state h_next. Valid until the next decode.
        """
        p = ext().llama_get_embeddings_nextn_ith(self.ptr, int(i))
        if not p:
            raise TraceError(f"no nextn hidden row {i}", path=self.model.path)
        return np.ctypeslib.as_array(p, shape=(self.n_embd_out,))

    def seq_rm(self, p0: int, p1: int = -1) -> None:
        """Remove the cells of sequence 0 at positions [p0, p1) (p1 = -1: to the end)."""
        if not llama().llama_memory_seq_rm(self.mem, 0, int(p0), int(p1)):
            raise TraceError(f"llama_memory_seq_rm({p0}, {p1}) failed", path=self.model.path)

    def clear(self) -> None:
        """Empty the memory (KV cache) of this context."""
        llama().llama_memory_clear(self.mem, True)

    def close(self) -> None:
        """Free the context (idempotent). Free a drafter context before its target's."""
        if getattr(self, "ptr", None):
            llama().llama_free(self.ptr)
            self.ptr = None


class TokenBatch:
    """A ``llama_batch`` of tokens for sequence 0 (``llama_batch_init(capacity, 0, 1)``)."""

    def __init__(self, capacity: int) -> None:
        lc = llama()
        self.capacity = int(capacity)
        self.batch = lc.llama_batch_init(self.capacity, 0, 1)

    def set(self, tokens: Sequence[int], pos0: int, logits: str = "last") -> None:
        """Fill with ``tokens`` at positions pos0, pos0+1, ...; ``logits`` "last" or "all" rows output.

        Raises:
            TraceError: more tokens than the capacity.
        """
        n = len(tokens)
        if n > self.capacity:
            raise TraceError("batch too small", expected=f"<= {self.capacity} tokens", actual=n)
        b = self.batch
        b.n_tokens = n
        for i, t in enumerate(tokens):
            b.token[i] = int(t)
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1 if (logits == "all" or i == n - 1) else 0

    def close(self) -> None:
        """Free the batch (idempotent)."""
        if getattr(self, "batch", None) is not None:
            llama().llama_batch_free(self.batch)
            self.batch = None


class DraftBatch:
    """A one-token ``llama_batch`` carrying both a token id and a hidden row (MTP drafter input).

    ``llama_batch_init(1, n_embd, 1)`` allocates only ``embd``; the token buffer is ours and is
    detached again before the batch is freed.
    """

    def __init__(self, n_embd: int) -> None:
        lc = llama()
        self.n_embd = int(n_embd)
        self.batch = lc.llama_batch_init(1, self.n_embd, 1)
        self._tok = (lc.llama_token * 1)()
        self.batch.token = ctypes.cast(self._tok, ctypes.POINTER(lc.llama_token))
        self.embd = np.ctypeslib.as_array(self.batch.embd, shape=(self.n_embd,))

    def set(self, token: int, pos: int, h: np.ndarray) -> None:
        """Token ``token`` at position ``pos`` with hidden row ``h`` (shape (n_embd,), copied)."""
        b = self.batch
        b.n_tokens = 1
        self._tok[0] = int(token)
        b.pos[0] = int(pos)
        b.n_seq_id[0] = 1
        b.seq_id[0][0] = 0
        b.logits[0] = 1
        self.embd[:] = h

    def close(self) -> None:
        """Free the batch (idempotent)."""
        if getattr(self, "batch", None) is not None:
            lc = llama()
            self.batch.token = ctypes.POINTER(lc.llama_token)()
            lc.llama_batch_free(self.batch)
            self.batch = None


# --------------------------------------------------------------------------------------------------
# aborts: what llama.cpp / ggml print when they give up (for the isolated recording worker)
# --------------------------------------------------------------------------------------------------

#: Environment for a process that runs llama.cpp under the recorder. ggml's abort handler
#: (``ggml_abort`` -> ``ggml_print_backtrace`` in ``ggml/src/ggml.c``; also ``std::terminate`` via
#: ``ggml.cpp``) forks and execs ``gdb --batch -ex "attach PID" -ex bt`` (or lldb) unless
#: ``GGML_NO_BACKTRACE`` is set, which prints ~200 lines of debugger output into the user's terminal
#: and can take seconds; the message before it (``file:line: text``) is all we need.
ABORT_ENV = {"GGML_NO_BACKTRACE": "1"}

#: ``ggml_abort`` writes ``"<file>:<line>: <message>"`` to stderr before ``abort()``
#: (``GGML_ABORT(...)``, ``GGML_ASSERT(x)`` -> ``GGML_ASSERT(x) failed``)
_ABORT_LINE = re.compile(r"^(?P<file>\S+\.(?:c|cc|cpp|cu|h|hpp|m|metal)):(?P<line>\d+): (?P<msg>.+)$")
#: Python's faulthandler block that follows a fatal signal in the worker (not llama.cpp's words)
_FAULTHANDLER_START = ("Fatal Python error:", "Current thread ", "Thread 0x", "Extension modules:",
                       "Stack (most recent call first)")


#: ``ggml_abort_callback_t``: ``void (*)(const char * error_message)``
_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)


def set_abort_hook(hook: Callable[[str], None]) -> bool:
    """Run ``hook(message)`` inside ``ggml_abort`` (``GGML_ABORT`` / ``GGML_ASSERT``, CUDA errors), just
    before the process aborts: the recording worker sends the rounds it still holds. The message is
    first written to stderr as ggml writes it (``"<file>:<line>: <message>"``, what :func:`abort_message`
    reads); ggml's own backtrace is not printed. ``hook`` must not raise (what it raises is dropped).
    Returns False when this ggml has no ``ggml_set_abort_callback`` (nothing changes then).

    The callback stays installed for the life of the process (ggml keeps one, process-wide)."""
    g = _ggml_lib()
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
        except BaseException:  # noqa: BLE001, S110 - the process aborts next whatever happens
            pass

    cb = _ABORT_CALLBACK(_on_abort)
    _state["abort_callback"] = cb     # kept alive: ggml holds only the C pointer
    setter(ctypes.cast(cb, ctypes.c_void_p))
    return True


def ggml_abort(message: str) -> None:
    """Abort the process through ggml's own ``ggml_abort`` (what ``GGML_ABORT(message)`` does, the hook
    of :func:`set_abort_hook` included); for the recording worker's test fault. Does not return.

    Raises:
        RuntimeUnavailableError: this ggml exports no ``ggml_abort``.
    """
    for lib in (getattr(_import_ggml(), "libggml", None), _libllama(llama())):
        fn = getattr(lib, "ggml_abort", None) if lib is not None else None
        if fn is not None:
            fn(b"mtpscope-fault.c", 1, b"%s", message.encode())   # variadic: (file, line, fmt, ...)
    raise RuntimeUnavailableError("ggml_abort not found in the loaded libraries", key="ggml_abort")


def _import_ggml() -> Any:
    """llama-cpp-python's ``_ggml`` module (``.libggml``: the ggml library it loaded), or None (older
    layouts: ggml's symbols then resolve through libllama's dependency tree)."""
    try:
        from llama_cpp import _ggml  # noqa: PLC0415

        return _ggml
    except Exception:  # noqa: BLE001
        return None


def before_faulthandler(lines: Sequence[str]) -> list[str]:
    """``lines`` up to Python's faulthandler report (``Fatal Python error: ...`` and the stacks after
    it: the worker's Python, not llama.cpp's words), all of them when there is none."""
    out = list(lines)
    for i, ln in enumerate(out):
        if ln.startswith(_FAULTHANDLER_START[0]):
            return out[:i]
    return out


def abort_message(lines: Sequence[str]) -> str | None:
    """llama.cpp's own last words among the last ``lines`` of its stderr, or None.

    The last ``ggml_abort`` line (``"ggml-cpu/binary-ops.cpp:135: binary_op: unsupported types: ..."``)
    gives its message without the source path (``"binary_op: unsupported types: ..."``); for
    ggml-cuda's generic ``CUDA error`` abort the preceding ``CUDA error: <reason>`` line is used.
    Without an abort line: the last non-empty line before Python's faulthandler report, if any.
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
    for ln in reversed(before_faulthandler(clean)):
        t = ln.strip()
        if t and not t.startswith(_FAULTHANDLER_START) and not t.startswith("File \""):
            return t
    return None


# --------------------------------------------------------------------------------------------------
# runtime facts for the manifest
# --------------------------------------------------------------------------------------------------


def runtime_info(n_gpu_layers: int = 0) -> dict[str, str]:
    """``{"llama_cpp_python", "llama_cpp", "device"}`` for the trace manifest, plus ``"cb_eval"``
    (:func:`traces.native_capture.kind`) when this process made a drafter capture.

    ``llama_cpp`` is ggml's build commit (``ggml_commit()``) when the build recorded one, else
    "unknown"; ``device`` is "cpu", or the first GPU's description when ``n_gpu_layers`` != 0 and
    llama.cpp sees a GPU.
    """
    lc = llama()
    g = _ggml_lib()
    commit = "unknown"
    if "ggml_commit" in g:
        raw = g["ggml_commit"]()
        if raw:
            c = raw.decode("utf-8", "replace").strip()
            if c and c.lower() != "unknown":
                commit = c
    device = "cpu"
    if n_gpu_layers != 0:
        gpu = gpu_name(lc)
        if gpu:
            device = gpu
    info = {"llama_cpp_python": str(getattr(lc, "__version__", "unknown")), "llama_cpp": commit,
            "device": device}
    kind = native_capture.kind()
    if kind is not None:
        info["cb_eval"] = kind
    return info


def gpu_name(lc: ModuleType | None = None) -> str | None:
    """Description of the first GPU device ggml knows, or None (CPU-only build or no GPU)."""
    lib = _libllama(lc or llama())
    try:
        count = lib.ggml_backend_dev_count
        get = lib.ggml_backend_dev_get
        dtype = lib.ggml_backend_dev_type
        desc = lib.ggml_backend_dev_description
    except AttributeError:
        return None
    count.argtypes, count.restype = [], ctypes.c_size_t
    get.argtypes, get.restype = [ctypes.c_size_t], ctypes.c_void_p
    dtype.argtypes, dtype.restype = [ctypes.c_void_p], ctypes.c_int
    desc.argtypes, desc.restype = [ctypes.c_void_p], ctypes.c_char_p
    for i in range(count()):
        dev = get(i)
        if dtype(dev) == 1:  # GGML_BACKEND_DEVICE_TYPE_GPU
            d = desc(dev)
            return d.decode("utf-8", "replace") if d else "gpu"
    return None


def gpu_offload_supported() -> bool:
    """True when this llama.cpp build can offload layers to a GPU."""
    lc = llama()
    fn = getattr(lc, "llama_supports_gpu_offload", None)
    return bool(fn()) if fn else False
