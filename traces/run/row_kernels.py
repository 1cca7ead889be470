"""The recorder's reductions over rows of logits in C: ``rowstats.c`` built on first use, and its functions
over numpy arrays.

Why: a recorded round reduces six rows of ``n_vocab`` logits (262144 for Gemma 4): the target's probability
of each draft and its entropy at the verify rows (:mod:`traces.run.target_side`), and each draft step's
top-k and ranks (:mod:`traces.run.ranking`). numpy needs five passes and a temporary per row for the first
and a handful of calls for the second; ``rowstats.c`` reads each row twice (max, then one fused pass) and
once (the block maxima; then the few blocks that can hold a top-k value). On the development VM (AVX-512, quiet),
three cold rows of 262144 logits: 0.53 ms against numpy's 1.30 ms for the target's side, 0.39 ms against 0.77 ms
for top-10 and a rank; the AVX2 build 0.91 and 0.52 ms (``benchmarks/bench_row_kernels.py``). The recording worker
copies each drafter row out of llama.cpp's buffer with :func:`copy_top_k`, which finds the row's top-k in the
same read.

What differs from the numpy functions: top-k and ranks are the same (comparisons only, exact); ``p`` and ``H``
use Cephes' ``expf`` (relative error about 1e-7; its multiply-adds fused, as is the sum of ``e * (x - m)``) and
float32 lane sums of 16 terms before float64, against
numpy's ``exp`` and pairwise float32 sums: both are within 1e-6 relative of float64 (tests/test_row_kernels.py).
The trace manifest's ``runtime.row_kernels`` says which one a recording used (:func:`kind`).

Build: :mod:`traces.run.native_build` (``$CC -O3 -ffp-contract=off -shared -fPIC`` plus the instruction set of
the CPU it runs on, :func:`isa`: AVX-512, AVX2 + FMA, or the compiler's baseline; each a library of its own in the
cache, all computing the same bits: the fused multiply-adds are written out in ``rowstats.c`` and round once on
every build, FMA instructions or libm's ``fmaf``). No compiler, a failed build or
``MTPSCOPE_NATIVE_ROWS=0``: :func:`load` gives None, says why (:func:`unavailable_reason`) and the numpy
functions are used.

Imports: ctypes, numpy, mtpscope.traces.run.native_build.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.traces.run import native_build

SOURCE = Path(__file__).with_name("rowstats.c")
#: the compiler's flags (before ``-shared -fPIC``) of every build: the compiler fuses no multiply-add itself
#: (``rowstats.c`` writes out the ones it wants), so that every instruction set's build computes the same bits
FLAGS = ("-O3", "-ffp-contract=off", "-Wno-psabi")
#: the instruction-set flags of each build (rowstats.c's register width follows them: 16, 8, 4 float32 lanes)
ISA_FLAGS = {"avx512": ("-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx2", "-mfma"),
             "avx2": ("-mavx2", "-mfma"), "baseline": ()}
#: set to "0" to use the numpy functions
ENV_SWITCH = "MTPSCOPE_NATIVE_ROWS"
#: the most a top-k may ask for (rowstats.c's list lives on its stack)
MAX_K = 4096
_state: dict[str, Any] = {}
_P = ctypes.c_void_p
_I = ctypes.c_int64


def isa() -> str:
    """The build this CPU gets: ``"avx512"`` (AVX-512 F, BW, DQ and VL), ``"avx2"`` (AVX2 and FMA) or
    ``"baseline"`` (anything else, other architectures included), from numpy's own view of the CPU (what its
    dispatch uses: features the CPU has and the OS enables)."""
    import importlib

    try:     # (a private module of numpy's, without type stubs: read as a plain mapping)
        feats: dict[str, bool] = dict(importlib.import_module("numpy._core._multiarray_umath").__cpu_features__)
    except (ImportError, AttributeError):      # (numpy without that table: the safe build)
        return "baseline"
    if all(feats.get(f) for f in ("AVX512F", "AVX512BW", "AVX512DQ", "AVX512VL", "AVX2", "FMA3")):
        return "avx512"
    if feats.get("AVX2") and feats.get("FMA3"):
        return "avx2"
    return "baseline"


def flags(which: str | None = None) -> tuple[str, ...]:
    """The compiler flags of the build for ``which`` instruction set (default :func:`isa`)."""
    return (*FLAGS, *ISA_FLAGS[isa() if which is None else which])


def library_path() -> Path:
    """Where this CPU's library lives (:func:`traces.run.native_build.library_path` of ``rowstats.c`` with
    :func:`flags`)."""
    return native_build.library_path(SOURCE, flags())


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.mtps_target_stats.argtypes = [_P, _I, _I, _P, _P, _P]
    lib.mtps_target_stats.restype = None
    lib.mtps_top_k.argtypes = [_P, _I, _I, _P]
    lib.mtps_top_k.restype = _I
    lib.mtps_copy_top_k.argtypes = [_P, _P, _I, _I, _P]
    lib.mtps_copy_top_k.restype = _I
    lib.mtps_count_greater.argtypes = [_P, _I, ctypes.c_float]
    lib.mtps_count_greater.restype = _I
    lib.mtps_lanes.argtypes = []
    lib.mtps_lanes.restype = _I
    return lib


def open_library(path: Path) -> ctypes.CDLL:
    """A ``rowstats.c`` library at ``path`` (one built with other flags, for tests), its functions declared.

    Raises:
        OSError: not a loadable library.
    """
    return _declare(ctypes.CDLL(os.fspath(path)))


def load() -> ctypes.CDLL | None:
    """The built library (built first if needed), or None; :func:`unavailable_reason` then says why.
    Tried once per process (:func:`traces.run.native_build.load_once`)."""
    return native_build.load_once(
        _state, ENV_SWITCH,
        lambda: open_library(native_build.build(SOURCE, flags(), what=f"the native row kernels ({isa()})")))


def unavailable_reason() -> str | None:
    """Why :func:`load` gave None (None when it gave the library or was not tried)."""
    return _state.get("why")


def kind() -> str:
    """Which reductions this process uses: ``"native"`` or ``"numpy (<why not native>)"`` (tries :func:`load`)."""
    return "native" if load() is not None else f"numpy ({unavailable_reason()})"


def _f32_row(x: np.ndarray) -> bool:
    return x.dtype == np.float32 and x.ndim == 1 and x.flags.c_contiguous


def target_stats(rows: Sequence[np.ndarray], tokens: np.ndarray, lib: ctypes.CDLL | None = None
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """``(p, H)`` per row as :func:`traces.run.target_side.target_stats` defines them, in C; None when the
    library is not available or a row is not a contiguous ``float32[n_vocab]``.

    Args:
        rows: ``n_rows`` rows of one length ``n_vocab`` (checked by the caller, as are the token ids).
        tokens: ``int64[n_rows]`` ids in ``[0, n_vocab)``.
        lib: a library from :func:`open_library` (default :func:`load`'s).

    Returns:
        two ``float64[n_rows]`` arrays (NaN for a row that holds a NaN or whose largest value is not finite).
    """
    lib = load() if lib is None else lib
    if lib is None or not all(_f32_row(r) for r in rows):
        return None
    n = len(rows)
    tok = np.ascontiguousarray(tokens, dtype=np.int64)
    ptrs = (ctypes.c_void_p * max(n, 1))(*[r.ctypes.data for r in rows])
    p, h = np.empty(n), np.empty(n)
    if n:
        lib.mtps_target_stats(ptrs, n, rows[0].shape[0], tok.ctypes.data, p.ctypes.data, h.ctypes.data)
    return p, h


def top_k(x: np.ndarray, k: int, lib: ctypes.CDLL | None = None) -> np.ndarray | None:
    """The indices of the ``k`` largest values of ``x`` (``float32[n]``, contiguous), best first, ties by
    the lower index, NaN skipped: ``int64[min(k, n)]``; None when the library is not available, ``x`` is
    not such a vector or ``k > MAX_K``."""
    lib = load() if lib is None else lib
    if lib is None or not _f32_row(x) or k > MAX_K:
        return None
    ids = np.empty(max(k, 0), dtype=np.int64)
    got = lib.mtps_top_k(x.ctypes.data, x.shape[0], k, ids.ctypes.data) if k > 0 else 0
    return ids[:got]


def copy_top_k(x: np.ndarray, dst: np.ndarray, k: int, lib: ctypes.CDLL | None = None) -> np.ndarray | None:
    """Copy ``x`` into ``dst`` and, in the same read, :func:`top_k` of ``x``: the recording worker copies each
    drafter row out of llama.cpp's buffer while it is still in the core's cache, and the recorder then need not
    read the copy again for its top-k (``rowstats.c``'s ``mtps_copy_top_k``; 0.29 ms for three rows of 262144
    float32 on the development VM, against 0.24 ms for the copies alone and 0.39 ms for copies and top-k apart).

    Args:
        x: ``float32[n]``; dst: ``float32[n]``, written (always, also when None is returned).
        k: how many ids.

    Returns:
        ``int64[min(k, n)]`` as :func:`traces.run.ranking.top_k_desc` gives them, or None (``dst`` still
        copied) when the library is not available, a row is not a contiguous ``float32`` vector, ``k`` is out of
        ``1..MAX_K`` or ``x``'s first ``k`` values hold a NaN (where ``top_k_desc`` gives numpy's answer).
    """
    lib = load() if lib is None else lib
    if lib is None or not (_f32_row(x) and _f32_row(dst) and dst.shape == x.shape and dst.flags.writeable) \
            or not 0 < k <= MAX_K:
        np.copyto(dst, x)
        return None
    ids = np.empty(k, dtype=np.int64)
    got = lib.mtps_copy_top_k(x.ctypes.data, dst.ctypes.data, x.shape[0], k, ids.ctypes.data)
    return ids[:got] if got == min(k, x.shape[0]) else None     # (-2: a NaN among the first k values)


def count_greater(x: np.ndarray, v: float, lib: ctypes.CDLL | None = None) -> int | None:
    """How many values of ``x`` (``float32[n]``, contiguous) are strictly greater than ``v`` (a float32);
    None when the library is not available or ``x`` is not such a vector."""
    lib = load() if lib is None else lib
    if lib is None or not _f32_row(x):
        return None
    return int(lib.mtps_count_greater(x.ctypes.data, x.shape[0], float(v)))


__all__ = ["ENV_SWITCH", "FLAGS", "ISA_FLAGS", "MAX_K", "SOURCE", "copy_top_k", "count_greater", "flags", "isa", "kind",
           "library_path", "load",
           "open_library", "target_stats", "top_k"]
