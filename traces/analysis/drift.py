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

from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class DriftPosition:
    """Drift at one draft position ``k``: steps with both states, mean cosine and relative error; with the
    accepted flags (``split``) also the mean cosine of the checked accepted / rejected steps and their
    :func:`separation` (None where a side has no step)."""

    k: int
    n_steps: int
    cos_mean: float
    rel_err_mean: float
    split: bool = False
    cos_mean_accepted: float | None = None
    cos_mean_rejected: float | None = None
    separation: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """``{k, n_steps, cos_mean, rel_err_mean[, cos_mean_accepted, cos_mean_rejected, separation]}`` (the
        last three only with ``split``)."""
        d: dict[str, Any] = {"k": self.k, "n_steps": self.n_steps, "cos_mean": self.cos_mean,
                             "rel_err_mean": self.rel_err_mean}
        if self.split:
            d.update(cos_mean_accepted=self.cos_mean_accepted, cos_mean_rejected=self.cos_mean_rejected,
                     separation=self.separation)
        return d


@dataclass(frozen=True)
class DriftQuantile:
    """One of the ``N_QUANTILES`` groups of checked steps by cosine: its cosine range, steps and acceptance."""

    cos_low: float
    cos_high: float
    n_steps: int
    acceptance_rate: float

    def to_dict(self) -> dict[str, Any]:
        """``{cos_low, cos_high, n_steps, acceptance_rate}``."""
        return {"cos_low": self.cos_low, "cos_high": self.cos_high, "n_steps": self.n_steps,
                "acceptance_rate": self.acceptance_rate}


@dataclass(frozen=True)
class Drift:
    """What :func:`drift` found (module docstring).

    Attributes:
        n_steps: steps with both hidden states finite and non-zero.
        cos_mean / rel_err_mean: over those steps (None without any).
        per_position: :class:`DriftPosition` per draft position k.
        cos_mean_accepted / cos_mean_rejected: over the checked steps (None without accepted flags or a side).
        separation: :func:`separation` of accepted from rejected by cosine (None: no mix).
        related: the drafter's state resembles the target's (None without accepted flags).
        by_quantile: :class:`DriftQuantile` groups of the checked steps (empty without accepted flags).
        words: the finding in one sentence.
    """

    n_steps: int
    cos_mean: float | None
    rel_err_mean: float | None
    per_position: tuple[DriftPosition, ...]
    cos_mean_accepted: float | None = None
    cos_mean_rejected: float | None = None
    separation: float | None = None
    related: bool | None = None
    by_quantile: tuple[DriftQuantile, ...] = ()
    words: str = field(default="")

    def to_dict(self) -> dict[str, Any]:
        """The ``drift`` section of docs/EXPLAIN.md: ``{n_steps, cos_mean, rel_err_mean, per_position: [...],
        cos_mean_accepted, cos_mean_rejected, separation, related, by_quantile: [...], words}``."""
        return {"n_steps": self.n_steps, "cos_mean": self.cos_mean, "rel_err_mean": self.rel_err_mean,
                "per_position": [p.to_dict() for p in self.per_position],
                "cos_mean_accepted": self.cos_mean_accepted, "cos_mean_rejected": self.cos_mean_rejected,
                "separation": self.separation, "related": self.related,
                "by_quantile": [q.to_dict() for q in self.by_quantile], "words": self.words}


def _words(n_steps: int, cos_mean: float | None, rel_err_mean: float | None, cos_mean_accepted: float | None,
           related: bool | None, auc: float | None) -> str:
    if not n_steps:
        return "no step has both hidden states"
    if related is False:
        return (f"the drafter's state is unrelated to the target's (mean cosine {cos_mean_accepted:.2f} even on "
                f"accepted drafts, relative error {rel_err_mean:.2f}): this drafter was not trained to reproduce "
                "the target's hidden state, so drift does not explain its rejections")
    if auc is None:
        return f"mean cosine {cos_mean:.2f}; no accepted-and-rejected mix to tell whether drift predicts rejection"
    if auc >= PREDICTIVE_AUC:
        return (f"drift predicts rejection: an accepted draft's cosine exceeds a rejected one's with probability "
                f"{auc:.2f}")
    return (f"drift does not predict rejection here: an accepted draft's cosine exceeds a rejected one's with "
            f"probability {auc:.2f} (0.5 = chance)")


def drift(k: np.ndarray, h_next: np.ndarray, h_target: np.ndarray, accepted: np.ndarray | None = None,
          checked: np.ndarray | None = None) -> Drift:
    """Cosine and relative error of ``h_next`` against ``h_target`` per draft position.

    Args:
        k: ``int[n]`` draft positions (1-based).
        h_next / h_target: ``float[n, n_embd_backbone]`` (numpy ``shape``); NaN rows are skipped.
        accepted: ``bool[n]`` optional: also split by accepted / rejected, and tell whether drift
            predicts rejection (module docstring).
        checked: ``bool[n]`` the steps the target checked (default: all); the split and the prediction
            use only those.

    Returns:
        :class:`Drift` (its ``to_dict()``: docs/EXPLAIN.md's ``drift`` section).

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
        cm, cr_, sep = None, None, None
        if acc is not None:
            mc = chk & (k == kk)
            ma, mr = mc & acc, mc & ~acc
            cm = float(cos[ma].mean()) if ma.any() else None
            cr_ = float(cos[mr].mean()) if mr.any() else None
            sep = separation(cos[mc], acc[mc])
        per.append(DriftPosition(int(kk), int(m.sum()), float(cos[m].mean()), float(rel[m].mean()),
                                 acc is not None, cm, cr_, sep))
    n_steps = int(ok.sum())
    cos_mean = float(cos[ok].mean()) if ok.any() else None
    rel_mean = float(rel[ok].mean()) if ok.any() else None
    cos_acc = cos_rej = auc = related = None
    quant: list[DriftQuantile] = []
    if acc is not None and chk.any():
        ca, cr = chk & acc, chk & ~acc
        cos_acc = float(cos[ca].mean()) if ca.any() else None
        cos_rej = float(cos[cr].mean()) if cr.any() else None
        auc = separation(cos[chk], acc[chk])
        ref = cos_acc if cos_acc is not None else cos_mean
        related = bool(ref is not None and ref >= RELATED_COSINE)
        c, a = cos[chk], acc[chk]
        order = np.argsort(c, kind="stable")
        for part in np.array_split(order, min(N_QUANTILES, len(order))):
            if len(part):
                quant.append(DriftQuantile(float(c[part].min()), float(c[part].max()), int(len(part)),
                                           float(a[part].mean())))
    return Drift(n_steps, cos_mean, rel_mean, tuple(per), cos_acc, cos_rej, auc, related, tuple(quant),
                 _words(n_steps, cos_mean, rel_mean, cos_acc, related, auc))


def has_hidden_target(manifest: dict[str, Any]) -> bool:
    """Whether the trace stores ``h_target`` (``manifest["dims"]["h_target"]``) and ``h_next``."""
    dims = manifest.get("dims") or {}
    return bool(dims.get("h_target")) and dims.get("hidden_dtype") is not None


def trace_drift(trace: TraceLike) -> Drift | None:
    """:func:`drift` of an opened trace, or None when it stores no ``h_target`` (reads ``k``,
    ``accepted`` and the two hidden columns)."""
    if not has_hidden_target(trace.manifest):
        return None
    from mtpscope.traces.analysis.metrics import checked_mask

    steps = trace.columns("steps", DRIFT_STEP_COLUMNS)
    acc = steps["accepted"].to_numpy(dtype=bool, na_value=False)
    return drift(steps["k"].to_numpy(), trace.hidden("h_next"), trace.hidden("h_target"), acc, checked_mask(steps))
