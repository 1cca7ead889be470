"""Drafter drift: how far the drafter's state ``h_next`` at draft position k is from the target's own
hidden state at the position it stands in for. One job.

Draft step k of a round (pending position ``p``) outputs ``h_next``, which step k + 1 feeds in place of
the target's hidden state at position ``p + k - 1``: the target's ``nextn`` row (post-final-norm hidden,
width n_embd_backbone) of verify row ``k - 1``. The recorder stores that row per step as ``h_target``
with ``record --hidden-target`` (docs/RECORDING.md). Per step:

    cos_k = <h_next, h_target> / (||h_next|| ||h_target||)
    rel_k = ||h_next - h_target|| / ||h_target||

averaged per k (steps with both vectors finite and ``||h_target|| > 0``) and over all steps. Both
inputs are stored as float16 by default; the relative error that storage adds is at most about 2^-11
per element, far below the drift this measures.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mtpscope.errors import TraceFormatError
from mtpscope.traces.store.protocols import TraceLike

DRIFT_STEP_COLUMNS = ["k", "accepted"]


def drift(k: np.ndarray, h_next: np.ndarray, h_target: np.ndarray, accepted: np.ndarray | None = None) -> dict[str, Any]:
    """Cosine and relative error of ``h_next`` against ``h_target`` per draft position.

    Args:
        k: ``int[n]`` draft positions (1-based).
        h_next / h_target: ``float[n, n_embd_backbone]`` (numpy ``shape``); NaN rows are skipped.
        accepted: ``bool[n]`` optional: also split by accepted / rejected.

    Returns:
        ``{"n_steps", "cos_mean", "rel_err_mean", "per_position": [{"k", "n_steps", "cos_mean",
        "rel_err_mean", "cos_mean_accepted", "cos_mean_rejected"}]}``.

    Raises:
        TraceFormatError: arrays of different lengths or widths.
    """
    a = np.asarray(h_next, dtype=np.float64)
    b = np.asarray(h_target, dtype=np.float64)
    k = np.asarray(k, dtype=np.int64).reshape(-1)
    if a.shape != b.shape or a.ndim != 2 or len(k) != a.shape[0]:
        raise TraceFormatError("h_next and h_target must have the same shape (n, n_embd_backbone) and one k per row",
                               key="h_target", expected=f"shape {a.shape}, {a.shape[0] if a.ndim else 0} k",
                               actual=f"shape {b.shape}, {len(k)} k")
    nb = np.linalg.norm(b, axis=1)
    na = np.linalg.norm(a, axis=1)
    ok = np.isfinite(nb) & np.isfinite(na) & (nb > 0) & (na > 0)
    cos = np.full(len(k), np.nan)
    rel = np.full(len(k), np.nan)
    cos[ok] = np.einsum("ij,ij->i", a[ok], b[ok]) / (na[ok] * nb[ok])
    rel[ok] = np.linalg.norm(a[ok] - b[ok], axis=1) / nb[ok]
    acc = None if accepted is None else np.asarray(accepted, dtype=bool).reshape(-1)
    per = []
    for kk in sorted(set(k[ok].tolist())):
        m = ok & (k == kk)
        row: dict[str, Any] = {"k": int(kk), "n_steps": int(m.sum()), "cos_mean": float(cos[m].mean()),
                               "rel_err_mean": float(rel[m].mean())}
        if acc is not None:
            for name, mm in (("accepted", m & acc), ("rejected", m & ~acc)):
                row[f"cos_mean_{name}"] = float(cos[mm].mean()) if mm.any() else None
        per.append(row)
    return {"n_steps": int(ok.sum()), "cos_mean": float(cos[ok].mean()) if ok.any() else None,
            "rel_err_mean": float(rel[ok].mean()) if ok.any() else None, "per_position": per}


def has_hidden_target(manifest: dict[str, Any]) -> bool:
    """Whether the trace stores ``h_target`` (``manifest["dims"]["h_target"]``) and ``h_next``."""
    dims = manifest.get("dims") or {}
    return bool(dims.get("h_target")) and dims.get("hidden_dtype") is not None


def trace_drift(trace: TraceLike) -> dict[str, Any] | None:
    """:func:`drift` of an opened trace, or None when it stores no ``h_target`` (reads ``k``,
    ``accepted`` and the two hidden columns)."""
    if not has_hidden_target(trace.manifest):
        return None
    steps = trace.columns("steps", DRIFT_STEP_COLUMNS)
    acc = steps["accepted"].to_numpy(dtype=bool, na_value=False)
    return drift(steps["k"].to_numpy(), trace.hidden("h_next"), trace.hidden("h_target"), acc)
