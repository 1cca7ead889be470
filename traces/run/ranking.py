"""Top-k and rank over a score vector (logits, centroid logits): the one definition of both.

Rules (the trace format's, ``docs/TRACE_FORMAT.md``): a top-k list is best first, ties broken by the
lower index; a rank is the number of *strictly* greater scores (0 = best, tied scores share a rank).
Used by the recorder's step analysis (:mod:`traces.run.step_analysis`), the centroid head's scoring
(:mod:`traces.run.centroid_head`), the replay (:mod:`traces.run.replay`) and the live parity run.

Imports: numpy, mtpscope.traces.run.row_kernels (the C scans, numpy where they do not build).
"""

from __future__ import annotations

import numpy as np

from mtpscope.traces.run import row_kernels

#: block width of :func:`top_k_desc`'s fast path (vectors of at least 8 blocks, a multiple of it)
_BLOCK = 512


def top_k_desc(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest values of ``x``, best first; ties: lower index first. Exact.

    Args:
        x: scores, any shape (read flattened, so 1-D in practice: ``(n,)``).
        k: how many; more than ``n`` gives all ``n``, ``<= 0`` none. NaN scores rank below every number (after
            ``-inf``, by index).

    Returns:
        ``np.int64[min(k, n)]`` indices into the flattened ``x``.

    In C where it builds (:func:`traces.run.row_kernels.top_k`: one pass for the maximum of each block of 512,
    then a scan of the blocks whose maximum reaches the k-th largest block maximum, the same bound as numpy's
    below; about 0.1 ms for 262144 cold float32 here) for a contiguous float32 ``x``;
    else numpy (about 0.2 ms for 262144 float32, against 2 ms for a full ``argpartition``): a block of 512 whose maximum is below the k-th largest block maximum cannot
    hold a top-k value, so only the best k blocks are searched.
    """
    x = np.asarray(x).reshape(-1)
    n = x.shape[0]
    k = min(int(k), n)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    if not np.isnan(x[:k]).any():   # (the C list skips NaN values; a NaN among the first k: numpy's answer)
        got = row_kernels.top_k(x, k)
        if got is not None and got.shape[0] == k:
            return got
    return _numpy_top_k(x, k)


def _numpy_top_k(x: np.ndarray, k: int) -> np.ndarray:
    """:func:`top_k_desc` in numpy (the reference of the C one, and its fall-back): ``x`` 1-D, ``0 < k <= n``."""
    nan = np.isnan(x)
    if nan.any():          # (a NaN compares false with everything: the finite ones first, then the NaN by index)
        fin = np.flatnonzero(~nan)
        best = fin[_numpy_top_k(x[fin], min(k, fin.shape[0]))] if fin.shape[0] else fin
        return np.concatenate([best, np.flatnonzero(nan)[:k - best.shape[0]]]).astype(np.int64)
    n = x.shape[0]
    b = _BLOCK
    if n >= 8 * b and n % b == 0:
        # "blocks" are the columns of x viewed as (n // 512, 512): column j holds j, j + 512, ...
        grid = x.reshape(-1, b)
        bmax = grid.max(axis=0)
        kb = min(k, b)
        thr = np.partition(bmax, b - kb)[b - kb]
        sel = np.flatnonzero(bmax >= thr)
        vals = grid[:, sel].reshape(-1)            # row-major over (rows, len(sel))
        kk = min(k, vals.shape[0])
        kth = -np.partition(-vals, kk - 1)[kk - 1]
        hit = np.flatnonzero(vals >= kth)          # every value >= the k-th largest (ties included)
        gid = (hit // sel.shape[0]) * b + sel[hit % sel.shape[0]]
    else:
        kth = -np.partition(-x, k - 1)[k - 1]
        gid = np.flatnonzero(x >= kth)
    order = np.lexsort((gid, -x[gid]))
    return gid[order][:k]


def rank(x: np.ndarray, i: int, top: np.ndarray | None = None,
         listed: tuple[list[int], list[float]] | None = None) -> int:
    """Rank of index ``i`` among the scores ``x`` (``(n,)``): how many scores are strictly greater
    than ``x[i]`` (0 = best).

    ``top``: a :func:`top_k_desc` list of ``x``, when at hand; if ``i`` is in it the rank is read off
    the list (every strictly greater score is then in the list too), else the whole vector is counted.
    ``listed``: ``top``'s ids and their scores as Python lists (``top.tolist()``, ``x[top].tolist()``),
    when the caller has them: the list is then read without numpy calls (a recorded round reads it six times).

    Raises:
        IndexError: ``i`` out of range.
    """
    v = x[i]
    if listed is not None and top is not None:
        ids, vals = listed
        if i in ids:
            vi = vals[ids.index(i)]
            return sum(1 for u in vals if u > vi)
    elif top is not None and np.flatnonzero(top == i).size:
        return int(np.count_nonzero(x[top] > v))
    got = row_kernels.count_greater(x, v) if isinstance(x, np.ndarray) else None
    return int(np.count_nonzero(x > v)) if got is None else got


__all__ = ["rank", "top_k_desc"]
