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

**Does drift tell anything here?** Only steps the target checked count (accepted, or the first
rejection of their round; a draft after it was compared with a token that followed a wrong draft):

* ``by_quantile``: the checked steps cut into ``N_QUANTILES`` equal groups by cosine, with each group's
  cosine range and acceptance rate -- drift that predicts rejection shows acceptance rising with cosine;
* ``separation``: the probability that an accepted step's cosine exceeds a rejected one's (the area under
  the ROC curve, ties counting half: 0.5 = drift says nothing, 1 = it separates them perfectly);
* ``related``: whether the drafter's state resembles the target's at all: False when even the accepted
  steps' mean cosine is below ``RELATED_COSINE`` (a drafter trained without a loss on its hidden state has
  no reason to reproduce the target's: then the view does not apply, and ``words`` says so).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mtpscope.errors import TraceFormatError
from mtpscope.traces.store.protocols import TraceLike

DRIFT_STEP_COLUMNS = ["prompt_id", "round", "k", "accepted"]
N_QUANTILES = 4
#: below this mean cosine of the accepted steps, the drafter's state is taken as unrelated to the target's
RELATED_COSINE = 0.2
#: separation (ROC area) from which drift is said to predict rejection
PREDICTIVE_AUC = 0.6


def separation(score: np.ndarray, positive: np.ndarray) -> float | None:
    """P(score of a positive > score of a negative), ties counting half (the Mann–Whitney U over n_pos *
    n_neg, i.e. the area under the ROC curve); None without both kinds."""
    score = np.asarray(score, dtype=np.float64)
    positive = np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if not n_pos or not n_neg:
        return None
    order = np.argsort(score, kind="mergesort")
    ranks = np.empty(len(score), dtype=np.float64)
    s = score[order]
    i = 0
    while i < len(s):                                  # average ranks of ties
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    u = ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def _words(out: dict[str, Any]) -> str:
    if not out["n_steps"]:
        return "no step has both hidden states"
    if out.get("related") is False:
        return (f"the drafter's state is unrelated to the target's (mean cosine {out['cos_mean_accepted']:.2f} even on "
                f"accepted drafts, relative error {out['rel_err_mean']:.2f}): this drafter was not trained to reproduce "
                "the target's hidden state, so drift does not explain its rejections")
    auc = out.get("separation")
    if auc is None:
        return f"mean cosine {out['cos_mean']:.2f}; no accepted-and-rejected mix to tell whether drift predicts rejection"
    if auc >= PREDICTIVE_AUC:
        return (f"drift predicts rejection: an accepted draft's cosine exceeds a rejected one's with probability "
                f"{auc:.2f}")
    return (f"drift does not predict rejection here: an accepted draft's cosine exceeds a rejected one's with "
            f"probability {auc:.2f} (0.5 = chance)")


def drift(k: np.ndarray, h_next: np.ndarray, h_target: np.ndarray, accepted: np.ndarray | None = None,
          checked: np.ndarray | None = None) -> dict[str, Any]:
    """Cosine and relative error of ``h_next`` against ``h_target`` per draft position.

    Args:
        k: ``int[n]`` draft positions (1-based).
        h_next / h_target: ``float[n, n_embd_backbone]`` (numpy ``shape``); NaN rows are skipped.
        accepted: ``bool[n]`` optional: also split by accepted / rejected, and tell whether drift
            predicts rejection (module docstring).
        checked: ``bool[n]`` the steps the target checked (default: all); the split and the prediction
            use only those.

    Returns:
        ``{"n_steps", "cos_mean", "rel_err_mean", "cos_mean_accepted", "cos_mean_rejected",
        "separation", "related", "by_quantile": [{"cos_low", "cos_high", "n_steps", "acceptance_rate"}],
        "words", "per_position": [{"k", "n_steps", "cos_mean", "rel_err_mean", "cos_mean_accepted",
        "cos_mean_rejected", "separation"}]}``.

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
    chk = ok if checked is None else ok & np.asarray(checked, dtype=bool).reshape(-1)
    per = []
    for kk in sorted(set(k[ok].tolist())):
        m = ok & (k == kk)
        row: dict[str, Any] = {"k": int(kk), "n_steps": int(m.sum()), "cos_mean": float(cos[m].mean()),
                               "rel_err_mean": float(rel[m].mean())}
        if acc is not None:
            mc = chk & (k == kk)
            for name, mm in (("accepted", mc & acc), ("rejected", mc & ~acc)):
                row[f"cos_mean_{name}"] = float(cos[mm].mean()) if mm.any() else None
            row["separation"] = separation(cos[mc], acc[mc])
        per.append(row)
    out: dict[str, Any] = {"n_steps": int(ok.sum()), "cos_mean": float(cos[ok].mean()) if ok.any() else None,
                           "rel_err_mean": float(rel[ok].mean()) if ok.any() else None, "per_position": per,
                           "cos_mean_accepted": None, "cos_mean_rejected": None, "separation": None,
                           "related": None, "by_quantile": []}
    if acc is not None and chk.any():
        ca, cr = chk & acc, chk & ~acc
        out["cos_mean_accepted"] = float(cos[ca].mean()) if ca.any() else None
        out["cos_mean_rejected"] = float(cos[cr].mean()) if cr.any() else None
        out["separation"] = separation(cos[chk], acc[chk])
        ref = out["cos_mean_accepted"] if out["cos_mean_accepted"] is not None else out["cos_mean"]
        out["related"] = bool(ref is not None and ref >= RELATED_COSINE)
        c, a = cos[chk], acc[chk]
        order = np.argsort(c, kind="stable")
        for part in np.array_split(order, min(N_QUANTILES, len(order))):
            if len(part):
                out["by_quantile"].append({"cos_low": float(c[part].min()), "cos_high": float(c[part].max()),
                                           "n_steps": int(len(part)), "acceptance_rate": float(a[part].mean())})
    out["words"] = _words(out)
    return out


def has_hidden_target(manifest: dict[str, Any]) -> bool:
    """Whether the trace stores ``h_target`` (``manifest["dims"]["h_target"]``) and ``h_next``."""
    dims = manifest.get("dims") or {}
    return bool(dims.get("h_target")) and dims.get("hidden_dtype") is not None


def trace_drift(trace: TraceLike) -> dict[str, Any] | None:
    """:func:`drift` of an opened trace, or None when it stores no ``h_target`` (reads ``k``,
    ``accepted`` and the two hidden columns)."""
    if not has_hidden_target(trace.manifest):
        return None
    from mtpscope.traces.analysis.metrics import checked_mask  # noqa: PLC0415

    steps = trace.columns("steps", DRIFT_STEP_COLUMNS)
    acc = steps["accepted"].to_numpy(dtype=bool, na_value=False)
    return drift(steps["k"].to_numpy(), trace.hidden("h_next"), trace.hidden("h_target"), acc, checked_mask(steps))
