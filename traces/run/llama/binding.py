"""The llama-cpp-python binding: the one ``import llama_cpp`` in mtpscope (lazily, in :func:`llama`), the
symbols the MTP loop needs, the ggml functions llama-cpp-python does not bind, and the runtime facts a
trace manifest records.

Nothing imports ``llama_cpp`` at module import time: :func:`llama` does it on first use and raises
:class:`~mtpscope.errors.RuntimeUnavailableError` with an install hint when the package or a symbol the
recorder needs is missing. On that first call it also installs llama.cpp's log callback
(:mod:`.logs`) and initialises the backend.

Imports: ctypes, mtpscope.errors, :mod:`.logs`, :mod:`.native_capture` (which capture this process uses,
for :func:`runtime_info`); llama_cpp lazily.
"""

from __future__ import annotations

import ctypes
from types import ModuleType
from typing import Any

from mtpscope.errors import RuntimeUnavailableError
from mtpscope.traces.run.llama import logs, native_capture

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

#: "llama_cpp", "ext": the modules once :func:`llama` succeeded; "ggml": :func:`ggml_lib`'s functions. Any: the
#: one door to llama-cpp-python, which ships no type information (its modules and ctypes functions are untyped)
_state: dict[str, Any] = {}


def llama() -> ModuleType:
    """The ``llama_cpp`` module, imported on first call, with the backend initialised.

    Raises:
        RuntimeUnavailableError: llama-cpp-python is not installed, or it lacks a symbol the MTP loop
            needs (context type MTP, nextn embeddings), i.e. it is older than 0.3.36.
    """
    mod: ModuleType | None = _state.get("llama_cpp")
    if mod is not None:
        return mod
    try:
        import llama_cpp  # lazy on purpose
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
        from llama_cpp import llama_cpp_ext
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
    logs.install(llama_cpp)
    llama_cpp.llama_backend_init()
    _state["ext"] = llama_cpp_ext
    _state["llama_cpp"] = llama_cpp
    return llama_cpp


def ext() -> ModuleType:
    """``llama_cpp.llama_cpp_ext`` (nextn embeddings, ctx_other); see :func:`llama` for errors."""
    llama()
    mod: ModuleType = _state["ext"]
    return mod


def available() -> bool:
    """True when :func:`llama` would succeed (llama-cpp-python importable with the MTP symbols)."""
    try:
        llama()
    except RuntimeUnavailableError:
        return False
    return True


def jinja2_chat_formatter() -> type:
    """llama-cpp-python's ``Jinja2ChatFormatter`` (renders a GGUF's ``tokenizer.chat_template``)."""
    llama()
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    return Jinja2ChatFormatter


# --------------------------------------------------------------------------------------------------
# ggml functions llama-cpp-python does not bind
# --------------------------------------------------------------------------------------------------


def ggml_libraries() -> list[Any]:
    """The ``ctypes.CDLL`` s that carry ggml's symbols, in lookup order: llama-cpp-python's ``libggml``
    where its layout has one, then libllama (ggml's symbols resolve through its dependency tree)."""
    libs: list[Any] = []
    libggml = getattr(_import_ggml(), "libggml", None)
    if libggml is not None:
        libs.append(libggml)
    libs.append(_libllama(llama()))
    return libs


def ggml_lib() -> dict[str, Any]:
    """The ggml functions mtpscope calls, typed, from the first of :func:`ggml_libraries` that has them:
    ``"nbytes"`` (``ggml_nbytes``), ``"tensor_get"`` (``ggml_backend_tensor_get``), ``"tensor_overhead"``
    (``ggml_tensor_overhead``), and where this ggml exports them ``"set_abort_callback"``,
    ``"ggml_commit"``, ``"ggml_version"``.

    Raises:
        RuntimeUnavailableError: no loaded library exports ``ggml_nbytes`` / ``ggml_backend_tensor_get``.
    """
    lib: dict[str, Any] | None = _state.get("ggml")
    if lib is not None:
        return lib
    for cand in ggml_libraries():
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
        ns = {"nbytes": nbytes, "tensor_get": get, "tensor_overhead": overhead}
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


def _import_ggml() -> Any:
    """llama-cpp-python's ``_ggml`` module (``.libggml``: the ggml library it loaded), or None (older
    layouts: ggml's symbols then resolve through libllama's dependency tree)."""
    try:
        from llama_cpp import _ggml

        return _ggml
    except Exception:  # noqa: BLE001 - any failure to import the private module: not there
        return None


# --------------------------------------------------------------------------------------------------
# runtime facts for the manifest
# --------------------------------------------------------------------------------------------------


def runtime_info(n_gpu_layers: int = 0) -> dict[str, str]:
    """``{"llama_cpp_python", "llama_cpp", "device"}`` for the trace manifest, plus ``"cb_eval"``
    (:func:`mtpscope.traces.run.llama.native_capture.kind`) when this process made a drafter capture.

    ``llama_cpp`` is ggml's build commit (``ggml_commit()``) when the build recorded one, else
    "unknown"; ``device`` is "cpu", or the first GPU's description when ``n_gpu_layers`` != 0 and
    llama.cpp sees a GPU.
    """
    lc = llama()
    g = ggml_lib()
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
