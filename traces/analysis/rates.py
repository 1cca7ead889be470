"""The two acceptance figures, their one home: every count of accepted drafts turned into an acceptance rate or a
mean acceptance length goes through these functions (a trace's totals and per-prompt rows, a request's, a recording's
summary, a sweep's cells and advice, the app's verdicts, the demo's training figures).

* **acceptance rate** = accepted draft tokens / drafted tokens (llama.cpp: ``n_accept / n_drafted``; llama-server's
  "draft acceptance rate", ``timings.draft_n_accepted / timings.draft_n``), 0..1;
* **mean acceptance length** = 1 + accepted draft tokens / verify rounds (vLLM's "mean acceptance length": tokens
  emitted per target verify, the bonus or correction token counting 1; llama-server's "mean len"), in tokens. A
  verify round is a round that drafted at least one token; a request's figure divides by its drafts (each draft of
  llama-server is one verify).

Both are undefined when nothing was drafted: None for the scalar functions, NaN in the arrays of the array ones.
No imports beyond numpy: every layer that counts acceptance may call them (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike


def acceptance_rate(n_accepted: Any, n_drafted: Any) -> float | None:
    """``n_accepted / n_drafted`` (numbers of tokens, any int or float type), None when ``n_drafted`` is 0."""
    return float(n_accepted) / float(n_drafted) if n_drafted else None


def mean_acceptance_length(n_accepted: Any, n_verify: Any) -> float | None:
    """``1 + n_accepted / n_verify`` in tokens (``n_verify``: the verify rounds, or a request's drafts), None when
    ``n_verify`` is 0."""
    return 1.0 + float(n_accepted) / float(n_verify) if n_verify else None


def acceptance_rates(n_accepted: ArrayLike, n_drafted: ArrayLike) -> np.ndarray:
    """:func:`acceptance_rate` element by element (float64 array; NaN where ``n_drafted`` is 0), no numpy warning."""
    a, d = np.asarray(n_accepted, dtype=np.float64), np.asarray(n_drafted, dtype=np.float64)
    out: np.ndarray = np.divide(a, d, out=np.full(np.broadcast(a, d).shape, np.nan), where=d != 0)
    return out


def mean_acceptance_lengths(n_accepted: ArrayLike, n_verify: ArrayLike) -> np.ndarray:
    """:func:`mean_acceptance_length` element by element (float64 array; NaN where ``n_verify`` is 0)."""
    a, v = np.asarray(n_accepted, dtype=np.float64), np.asarray(n_verify, dtype=np.float64)
    out: np.ndarray = 1.0 + np.divide(a, v, out=np.full(np.broadcast(a, v).shape, np.nan), where=v != 0)
    return out


def nan_if_none(x: float | None) -> float:
    """``x``, or NaN for None (the DataFrame and record fields that hold NaN where a figure is undefined)."""
    return float("nan") if x is None else x


__all__ = ["acceptance_rate", "acceptance_rates", "mean_acceptance_length", "mean_acceptance_lengths", "nan_if_none"]
