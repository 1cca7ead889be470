"""The target's side of a draft step: its probability of the drafted token and its entropy, from the
verify decode's logits. One job; pure numpy; called by the MTP runtime right after the verify decode
(the logits of every verify row are there anyway).

For verify row ``i`` with logits ``x`` (``n_vocab`` values, llama.cpp's output after Gemma's final soft-cap)
and the draft ``d`` that row judges, at temperature 1:

    m = max(x),  e = exp(x - m),  Z = sum(e)
    p(d) = e[d] / Z
    H    = -sum p log p = log Z - sum(e * (x - m)) / Z        (nats; a masked logit of -inf adds nothing)

The exponentials and the products ``e * (x - m)`` are float32 (like the logits), and so are the sums:
numpy reduces a contiguous float32 run pairwise (blocks of 8 lanes, then halving), so each chunk's sum
carries a relative error of about ``log2(n) * 2**-24`` (under 1e-6 at n = 32768); the chunks' sums add in
float64. ``H`` and ``p`` are then good to about 1e-6 relative, far below what the hard/wrong split reads
(tests/test_target_side.py checks 1e-5 against torch's float64 softmax).
In C (:mod:`traces.run.row_kernels`, used where it builds): the same formulas with Cephes' ``expf``
(relative error about 1e-7, its multiply-adds fused) and float32 lane sums of 16 terms added in float64, also
within 1e-6 relative; a row read twice (its maximum, then one fused pass); 0.53 ms for three cold rows against
1.30 ms for the numpy path below on the development VM (AVX2 build: 0.91 ms). The numpy path (:func:`numpy_target_stats`) is the reference and the fall-back.

numpy's cost: per row one pass for the maximum over the row as llama.cpp left it, then per chunk of ``_CHUNK``
values (float32 temporaries of 128 KiB that stay in the core's L2 cache) a subtraction, an exponential,
a product and two sums: the recording process reads each row from memory twice and writes nothing back,
which keeps it off the memory bandwidth llama.cpp, beside it, needs. The rows are taken as they come (a
sequence of row views is not stacked: that would copy n_rows MiB).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mtpscope.errors import TraceError
from mtpscope.traces.run import row_kernels

#: values per chunk of the sums (two float32 temporaries of 128 KiB each)
_CHUNK = 32768


def target_stats(logits: np.ndarray | Sequence[np.ndarray], tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(p, H)`` per row: the probability of ``tokens[i]`` under ``softmax(logits[i])`` and the entropy
    of that distribution in nats.

    Args:
        logits: ``float[n_rows, n_vocab]`` (numpy ``shape``), one row ``(n_vocab,)``, or a sequence of
            ``n_rows`` rows ``(n_vocab,)`` (read in place, not stacked).
        tokens: ``n_rows`` token ids.

    Returns:
        two ``float64[n_rows]`` arrays (NaN for a row whose largest logit is not finite).

    Raises:
        TraceError: a token id outside ``[0, n_vocab)`` or a row count that differs from ``len(tokens)``.
    """
    rows = _rows(logits)
    tok = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if len(rows) != len(tok):
        raise TraceError("one token per logits row", key="tokens", expected=len(rows), actual=len(tok))
    n_vocab = rows[0].shape[0] if rows else 0
    if any(r.shape[0] != n_vocab for r in rows):
        raise TraceError("logits rows of one length", key="logits", expected=n_vocab,
                         actual=sorted({r.shape[0] for r in rows}))
    if len(tok) and (tok.min() < 0 or tok.max() >= n_vocab):
        raise TraceError("token id outside the vocabulary", key="tokens", expected=f"0..{n_vocab - 1}",
                         actual=int(tok.min() if tok.min() < 0 else tok.max()))
    got = row_kernels.target_stats(rows, tok)
    if got is not None:
        return got
    return numpy_target_stats(rows, tok)


def numpy_target_stats(rows: Sequence[np.ndarray], tok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`target_stats` in numpy (the reference of the C one, and its fall-back): ``rows`` float32
    ``(n_vocab,)`` rows and ``tok`` ``int64[n_rows]`` ids, both checked by the caller."""
    n_vocab = rows[0].shape[0] if len(rows) else 0
    p = np.full(len(tok), np.nan)
    h = np.full(len(tok), np.nan)
    width = min(n_vocab, _CHUNK)
    sh_buf = np.empty(width, dtype=np.float32)
    e_buf = np.empty(width, dtype=np.float32)
    for i in range(len(tok)):
        row = rows[i]
        m = row.max()
        if not np.isfinite(m):
            continue
        z = s = 0.0
        for j in range(0, n_vocab, width):
            c = row[j:j + width]
            sh = np.subtract(c, m, out=sh_buf[:c.shape[0]])
            e = np.exp(sh, out=e_buf[:c.shape[0]])
            z += float(np.add.reduce(e))
            # not np.dot: a BLAS dot wakes OpenBLAS's thread pool, whose threads then spin on a core the
            # runtime needs
            with np.errstate(invalid="ignore"):
                prod = np.multiply(e, sh, out=sh)
            part = float(np.add.reduce(prod))
            if not np.isfinite(part):  # -inf logits (masked tokens): 0 * -inf is NaN there; count them as 0
                part = float(np.add.reduce(np.where(np.isfinite(prod), prod, np.float32(0.0))))
            s += part
        if not np.isfinite(z) or z <= 0:
            continue
        p[i] = float(np.exp(np.float32(row[tok[i]] - m))) / z
        h[i] = float(np.log(z) - s / z)
    return p, h


def _rows(logits: np.ndarray | Sequence[np.ndarray]) -> list[np.ndarray]:
    """The float32 rows of ``logits`` (a 1-D row, a 2-D array or a sequence of rows), views where they
    already are float32 and contiguous."""
    if isinstance(logits, np.ndarray):
        x = np.ascontiguousarray(logits, dtype=np.float32)
        if x.ndim == 1:
            return [x]
        if x.ndim != 2:
            raise TraceError("logits must be one row or rows", key="logits", expected="1 or 2 dimensions",
                             actual=x.ndim)
        return list(x)
    rows = [np.ascontiguousarray(r, dtype=np.float32).reshape(-1) for r in logits]
    return rows
