"""The costs of a trace's drafting, and of plain decoding: what the what-if (:mod:`traces.analysis.what_if`) prices
counts with, defined as the measured tokens/s defines them (:func:`mtpscope.traces.analysis.metrics.timing`).

**Costs** (:class:`CostModel`, :func:`fit_cost`), the definitions the measured tokens/s uses too
(:func:`mtpscope.traces.analysis.metrics.timing`): a draft step costs ``t_step = sum t_draft_ms /
sum n_draft`` (the mean, over rounds that drafted); a verify of ``n`` tokens (``n = n_draft + 1``;
``n = 1``: a plain decode step) costs the mean ``t_verify_ms`` of the rounds of that size. Sizes the
trace did not record come from a least-squares line ``v0 + v1 n`` through the recorded sizes' means
(weighted by their rounds) and, when plain decoding was measured, the point ``(1, t_plain)``; ``v1 >= 0``,
through the origin when the free intercept is negative, flat with one point.

``t_plain`` (:class:`PlainBaseline`): plain decoding measured by the sweep's baseline task or ``record
--baseline`` (``source`` says which), else estimated as ``t_verify(1)`` (``source: "estimated"``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from mtpscope.traces.analysis.metrics import emitted_counts


@dataclass(frozen=True)
class PlainBaseline:
    """Plain decoding's cost, the reference of every speedup.

    Attributes:
        t_per_token_ms: ms per generated token (after each prompt's first: prompt processing excluded).
        source: ``"sweep"`` (the sweep's baseline task over the same prompts), ``"manifest"`` (``record
            --baseline``) or ``"estimated"`` (no plain decoding was measured).
        how: where the number comes from, in words.
        per_prompt: ``{prompt_id: (tokens, ms)}`` when measured per prompt (paired bootstrap), else None.
    """

    t_per_token_ms: float
    source: str
    how: str
    per_prompt: Mapping[int, tuple[int, float]] | None = None

    @property
    def measured(self) -> bool:
        return self.source != "estimated"

    def for_prompts(self, prompt_ids: Any) -> float:
        """ms per token over ``prompt_ids`` (those measured), else :attr:`t_per_token_ms`."""
        if not self.per_prompt:
            return self.t_per_token_ms
        n = ms = 0.0
        for p in prompt_ids:
            v = self.per_prompt.get(int(p))
            if v is not None:
                n, ms = n + v[0], ms + v[1]
        return ms / n if n > 0 else self.t_per_token_ms

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``per_prompt`` left out)."""
        return {"t_per_token_ms": self.t_per_token_ms, "source": self.source, "how": self.how,
                "measured": self.measured}


def manifest_baseline(manifest: Mapping[str, Any]) -> PlainBaseline | None:
    """``record --baseline``'s plain decoding from ``manifest["baseline"]`` (``t_per_token_ms``, and per
    prompt ``decode_ms`` / ``n_decodes`` aligned with the manifest's prompts), None when absent or not a
    positive number."""
    b = manifest.get("baseline")
    v = b.get("t_per_token_ms") if isinstance(b, dict) else None
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
        return None
    per: dict[int, tuple[int, float]] = {}
    prompts = [p for p in manifest.get("prompts") or [] if isinstance(p, dict)]
    for i, pp in enumerate(b.get("per_prompt") or []):
        if not isinstance(pp, dict) or i >= len(prompts):
            continue
        n, ms = pp.get("n_decodes"), pp.get("decode_ms")
        if isinstance(n, (int, float)) and isinstance(ms, (int, float)) and n > 0 and ms >= 0:
            per[int(prompts[i].get("prompt_id", i))] = (int(n), float(ms))
    return PlainBaseline(float(v), "manifest", "plain decoding of the same prompts timed by `record --baseline` "
                         "(manifest baseline.t_per_token_ms)", per or None)


def rounds_baseline(rounds: pd.DataFrame, how: str, source: str = "sweep") -> PlainBaseline | None:
    """Plain decoding from a baseline trace's rounds (``source: "baseline"``: one round per token,
    ``t_verify_ms`` its decode): ms per token = sum time / emitted tokens, per prompt too. None without
    timed rounds. Columns ``prompt_id``, ``t_draft_ms``, ``t_verify_ms`` (``emitted`` optional)."""
    if not len(rounds) or "t_verify_ms" not in rounds.columns:
        return None
    t = pd.to_numeric(rounds["t_verify_ms"], errors="coerce").fillna(0.0).to_numpy(dtype=np.float64)
    if "t_draft_ms" in rounds.columns:
        t = t + pd.to_numeric(rounds["t_draft_ms"], errors="coerce").fillna(0.0).to_numpy(dtype=np.float64)
    ne = emitted_counts(rounds)
    pid = rounds["prompt_id"].to_numpy(dtype=np.int64)
    if ne.sum() <= 0 or t.sum() <= 0:
        return None
    per = {}
    for p in np.unique(pid):
        m = pid == p
        if ne[m].sum() > 0:
            per[int(p)] = (int(ne[m].sum()), float(t[m].sum()))
    return PlainBaseline(float(t.sum() / ne.sum()), source, how, per)


# ------------------------------------------------------------------------------------------ costs

@dataclass(frozen=True)
class CostModel:
    """Costs per round (milliseconds; module docstring).

    Attributes:
        t_step_ms: a draft step (mean over drafted tokens).
        verify_ms: ``{n: mean t_verify_ms}`` of the recorded verify sizes (n = draft count + 1).
        verify_rounds: ``{n: rounds}`` behind each mean.
        v0_ms, v1_ms: the line ``v0 + v1 n`` for sizes not recorded.
        t_plain_ms: plain decoding per token (measured baseline, else ``t_verify(1)``).
        baseline: ``"measured"`` or ``"estimated"``; basis: how the line was fitted, in words.
    """

    t_step_ms: float
    verify_ms: dict[int, float]
    verify_rounds: dict[int, int]
    v0_ms: float
    v1_ms: float
    t_plain_ms: float
    baseline: str
    basis: str

    def t_verify(self, n: int) -> float:
        """ms to verify ``n`` tokens: the recorded mean, else the line."""
        return self.verify_ms[n] if n in self.verify_ms else self.v0_ms + self.v1_ms * n

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["verify_ms"] = {str(k): v for k, v in self.verify_ms.items()}
        d["verify_rounds"] = {str(k): v for k, v in self.verify_rounds.items()}
        return d


def verify_line(xs: list[float], ys: list[float], ws: list[float]) -> tuple[float, float, str]:
    """``(v0, v1, how)``: the weighted least-squares line ``v0 + v1 n`` through verify sizes ``xs`` (ms
    ``ys``, weights ``ws``): ``v1 >= 0``; through the origin when the free intercept is negative; flat
    (``v1 = 0``) with one size."""
    x, y, w = (np.asarray(v, float) for v in (xs, ys, ws))
    if len(np.unique(x)) < 2:
        return float(np.average(y, weights=w)), 0.0, "one verify size: verify cost taken as independent of the size"
    xm, ym = np.average(x, weights=w), np.average(y, weights=w)
    v1 = max(float(np.average((x - xm) * (y - ym), weights=w) / np.average((x - xm) ** 2, weights=w)), 0.0)
    v0 = float(ym - v1 * xm)
    if v0 < 0:
        return 0.0, float(np.sum(w * x * y) / np.sum(w * x * x)), "through the origin (the free fit had a negative intercept)"
    return v0, v1, "weighted least squares"


def fit_cost(rounds: pd.DataFrame, baseline: PlainBaseline | None = None) -> CostModel | None:
    """The cost model from ``n_draft``, ``t_draft_ms``, ``t_verify_ms`` of the rounds (module docstring);
    None without timings or without a drafting round."""
    if "t_draft_ms" not in rounds.columns or "t_verify_ms" not in rounds.columns or not len(rounds):
        return None
    nd = rounds["n_draft"].to_numpy(dtype=np.int64)
    td = pd.to_numeric(rounds["t_draft_ms"], errors="coerce").to_numpy(dtype=np.float64)
    tv = pd.to_numeric(rounds["t_verify_ms"], errors="coerce").to_numpy(dtype=np.float64)
    ok = np.isfinite(td) & np.isfinite(tv)
    m = ok & (nd > 0)
    if not m.any() or nd[m].sum() <= 0:
        return None
    t_step = float(td[m].sum() / nd[m].sum())
    sizes = sorted(int(n) + 1 for n in np.unique(nd[ok]))
    verify = {n: float(tv[ok & (nd == n - 1)].mean()) for n in sizes}
    counts = {n: int((ok & (nd == n - 1)).sum()) for n in sizes}
    xs, ys, ws = [float(n) for n in sizes], [verify[n] for n in sizes], [float(counts[n]) for n in sizes]
    measured = baseline is not None and baseline.measured
    if measured:
        xs.append(1.0)
        ys.append(baseline.t_per_token_ms)
        ws.append(float(max(ws)))
    v0, v1, how = verify_line(xs, ys, ws)
    basis = ("mean verify time per recorded size; other sizes on a line (" + how + ") through those means"
             + (" and the measured plain decoding" if measured else ""))
    t_plain = baseline.t_per_token_ms if measured else (verify[1] if 1 in verify else v0 + v1)
    return CostModel(t_step_ms=t_step, verify_ms=verify, verify_rounds=counts, v0_ms=v0, v1_ms=v1,
                     t_plain_ms=float(t_plain), baseline="measured" if measured else "estimated", basis=basis)
