"""The target's side of a draft step: its probability of the drafted token and its entropy, from the
verify decode's logits. One job; pure numpy; called by the MTP runtime right after the verify decode
(the logits of every verify row are there anyway).

For verify row ``i`` with logits ``x`` (``n_vocab`` values, llama.cpp's output after Gemma's final soft-cap)
and the draft ``d`` that row judges, at temperature 1:

    m = max(x),  e = exp(x - m),  Z = sum(e)
    p(d) = e[d] / Z
    H    = -sum p log p = log Z - sum(e * (x - m)) / Z        (nats; a masked logit of -inf adds nothing)

The exponentials and the products ``e * (x - m)`` are float32 (like the logits); both sums accumulate in
float64, so ``H`` and ``p`` carry a relative error of a few float32 ulps (about 1e-6), far below what the
hard/wrong split reads.
Cost: two passes over n_vocab per row (the maximum, then the sums), the second in chunks of ``_CHUNK``
values whose float32 temporaries stay in the core's L2 cache: the recording process then reads each row
from memory twice and writes nothing back, which keeps it off the memory bandwidth llama.cpp, beside
it, needs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mtpscope.errors import TraceError

#: values per chunk of the sums (two float32 temporaries of 128 KiB each)
_CHUNK = 32768


def target_stats(logits: np.ndarray, tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(p, H)`` per row: the probability of ``tokens[i]`` under ``softmax(logits[i])`` and the entropy
    of that distribution in nats.

    Args:
        logits: ``float[n_rows, n_vocab]`` (numpy ``shape``), or one row ``(n_vocab,)``.
        tokens: ``n_rows`` token ids.

    Returns:
        two ``float64[n_rows]`` arrays (NaN for a row whose largest logit is not finite).

    Raises:
        TraceError: a token id outside ``[0, n_vocab)`` or a row count that differs from ``len(tokens)``.
    """
    x = np.asarray(logits, dtype=np.float32)
    if x.ndim == 1:
        x = x[None, :]
    tok = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if x.shape[0] != len(tok):
        raise TraceError("one token per logits row", key="tokens", expected=x.shape[0], actual=len(tok))
    n_vocab = x.shape[1]
    if len(tok) and (tok.min() < 0 or tok.max() >= n_vocab):
        raise TraceError("token id outside the vocabulary", key="tokens", expected=f"0..{n_vocab - 1}",
                         actual=int(tok.min() if tok.min() < 0 else tok.max()))
    p = np.full(len(tok), np.nan)
    h = np.full(len(tok), np.nan)
    width = min(n_vocab, _CHUNK)
    sh_buf = np.empty(width, dtype=np.float32)
    e_buf = np.empty(width, dtype=np.float32)
    for i in range(len(tok)):
        row = x[i]
        m = row.max()
        if not np.isfinite(m):
            continue
        z = s = 0.0
        for j in range(0, n_vocab, width):
            c = row[j:j + width]
            sh = np.subtract(c, m, out=sh_buf[:c.shape[0]])
            e = np.exp(sh, out=e_buf[:c.shape[0]])
            z += float(np.add.reduce(e, dtype=np.float64))
            # products in float32 (each exact to 2**-24 relative), their sum in float64; not np.dot: a BLAS
            # dot wakes OpenBLAS's thread pool, whose threads then spin on a core the runtime needs
            with np.errstate(invalid="ignore"):
                prod = np.multiply(e, sh, out=sh)
            part = float(np.add.reduce(prod, dtype=np.float64))
            if not np.isfinite(part):  # -inf logits (masked tokens): 0 * -inf is NaN there; count them as 0
                part = float(np.add.reduce(np.where(np.isfinite(prod), prod, 0.0), dtype=np.float64))
            s += part
        if not np.isfinite(z) or z <= 0:
            continue
        p[i] = float(np.exp(np.float32(row[tok[i]] - m))) / z
        h[i] = float(np.log(z) - s / z)
    return p, h
