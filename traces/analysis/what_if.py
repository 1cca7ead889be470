"""Which n_draft? An estimate, from one trace, of acceptance and speed at n_draft = 1..8, with intervals.

One job: the what-if of docs/EXPLAIN.md §4, fitted to one trace's ``rounds`` (pure; :func:`what_if_trace`
reads an opened trace). Three parts:

**Costs**: :mod:`traces.analysis.costs` (the definitions the measured tokens/s uses too).

**Acceptance** (:mod:`traces.analysis.acceptance_model`): the hidden-Markov model of which output
positions the drafter gets right, fitted per prompt category (a category of fewer than
``CATEGORY_MIN_ROUNDS`` drafting rounds uses the fit over all prompts) and run at every n_draft over the
trace's own prompt lengths and ``max_tokens`` cap. Depths beyond the recorded ``K`` fall on from
``p[s, K]`` by the ratio of the last two recorded depths (``extend_depths``).

**Calibration, so the trace reproduces itself.** For each category and each count X (drafted tokens,
verify rounds, loop time) per emitted token, the model's value at ``K`` is scaled to the trace's own:
``X(N) = X_model(N) * (X_trace / emitted) / (X_model(K) / emitted)``; the acceptance rate the same way
on its odds (so it stays in [0, 1]): ``odds(N) = odds_model(N) * odds_trace / odds_model(K)``,
accepted(N) = rate(N) * drafted(N). At ``N = K`` the estimate therefore equals the trace's acceptance
rate, mean acceptance length and measured tokens/s (emitted tokens / (t_draft + t_verify)), whatever
the model's error there; the categories' counts add up to the totals. Then

    acceptance rate(N)        = accepted(N) / drafted(N)
    mean acceptance length(N) = 1 + accepted(N) / verify rounds(N)
    time(N)                   = sum_L rounds_L(N) * (t_draft(L) + t_verify(L + 1))   (L = 0: plain steps)
    tokens/s(N)               = 1000 * emitted / time(N)
    speedup(N)                = tokens/s(N) * t_plain / 1000

**Intervals.** ``n_boot`` bootstrap resamples of the prompts (within each category; with fewer than
``MIN_BOOT_UNITS`` prompts, of blocks of ``BLOCK_ROUNDS`` consecutive rounds): each resample reweights
the fit's per-prompt expected counts (one EM step from the fit), the costs and the trace's own
values, and, when plain decoding was measured per prompt, the baseline too (paired); the 2.5 / 97.5 %
quantiles are the interval (seeded: the same trace gives the same interval).

``t_plain``: :class:`traces.analysis.costs.PlainBaseline`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, cast

import numpy as np
import pandas as pd

from mtpscope.errors import TraceFormatError
from mtpscope.traces.analysis import acceptance_model as AM
from mtpscope.traces.analysis import rates
from mtpscope.traces.analysis.costs import (
    N_MAX,
    CostModel,
    CostProbe,
    PlainBaseline,
    SizeCosts,
    fit_cost,
    manifest_baseline,
    round_arrays,
    size_sums,
)
from mtpscope.traces.analysis.metrics import emitted_counts, timing
from mtpscope.traces.store.protocols import TraceLike

N_BOOT = 200
SEED = 0
#: a category with fewer rounds that drafted than this uses the pooled fit (calibrated to its own rounds)
CATEGORY_MIN_ROUNDS = 30
#: fewer prompts than this in a group: the bootstrap resamples blocks of rounds instead
MIN_BOOT_UNITS = 8
BLOCK_ROUNDS = 16
WHAT_IF_ROUNDS_COLUMNS = ["prompt_id", "round", "n_draft", "n_accepted", "emitted", "t_draft_ms", "t_verify_ms"]
QUANTILES = (0.025, 0.975)
#: :attr:`WhatIf.interval_units` -> its words
INTERVAL_UNITS = {
    "prompts": "95 % intervals over prompts",
    "blocks": f"95 % intervals over blocks of {BLOCK_ROUNDS} rounds: fewer than {MIN_BOOT_UNITS} prompts",
    "blocks_by_category": f"95 % intervals over blocks of {BLOCK_ROUNDS} rounds: every category has fewer than "
                          f"{MIN_BOOT_UNITS} prompts",
    "mixed": f"95 % intervals over prompts, or blocks of {BLOCK_ROUNDS} rounds in categories of fewer than "
             f"{MIN_BOOT_UNITS} prompts",
    "none": f"no intervals: one prompt of at most {BLOCK_ROUNDS} rounds leaves nothing to resample",
    "off": "no intervals (n_boot 0)"}
UNCATEGORIZED = "(none)"


# ------------------------------------------------------------------------------------------ records

@dataclass(frozen=True)
class WhatIfRow:
    """The estimate at one n_draft; each value with a 95 % bootstrap interval ``(low, high)`` (None
    when it cannot be resampled: one prompt of one block, or no timings).

    Attributes:
        n_draft: drafts per round. recorded: the trace's own n_draft. extrapolated: beyond it.
        acceptance_rate: accepted / drafted. mean_acceptance_length: 1 + accepted / verify rounds.
        tokens_per_s: emitted tokens per second of draft + verify time (None without timings).
        speedup: tokens/s over plain decoding's (None without timings).
    """

    n_draft: int
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    tokens_per_s: float | None
    speedup: float | None
    recorded: bool
    extrapolated: bool
    acceptance_rate_interval: tuple[float, float] | None = None
    mean_acceptance_length_interval: tuple[float, float] | None = None
    tokens_per_s_interval: tuple[float, float] | None = None
    speedup_interval: tuple[float, float] | None = None
    n_drafted: float | None = None
    n_verify_rounds: float | None = None
    rounds_by_size: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (intervals as ``[low, high]``; ``n_drafted``, ``n_verify_rounds``: expected counts
        over the trace's prompts; ``rounds_by_size[L]``: rounds drafting L tokens, L = 0 plain steps)."""
        d = asdict(self)
        for k, v in d.items():
            if k.endswith("_interval") and v is not None:
                d[k] = [float(v[0]), float(v[1])]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WhatIfRow:
        """The row back from its :meth:`to_dict` JSON (a document read back: ``diagnosis.json``'s summary);
        keys it lacks keep their defaults."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        for k, v in kw.items():
            if (k.endswith("_interval") or k == "rounds_by_size") and v is not None:
                kw[k] = tuple(float(x) for x in v)
        return cls(**kw)


@dataclass(frozen=True)
class ModelFit:
    """The fit of :mod:`traces.analysis.acceptance_model` a what-if runs: its parameters and, for a trace's
    pooled fit, how it was run (None for a category's own fit).

    Attributes:
        params: :class:`traces.analysis.acceptance_model.Params` (``pi``, ``A``, ``p``).
        max_tokens: the generation limit the prediction ends at. extrapolation: the rule past the recorded
            n_draft, in words. per_category: categories were fitted each on its own.
    """

    params: AM.Params
    max_tokens: int | None = None
    extrapolation: str | None = None
    per_category: bool | None = None

    @property
    def n_states(self) -> int:
        """Hidden states of the model."""
        return int(self.params.pi.shape[-1])

    def to_dict(self) -> dict[str, Any]:
        """``{n_states, pi, A, p[, max_tokens, extrapolation, per_category]}`` (the last three for the pooled fit)."""
        d: dict[str, Any] = {"n_states": self.n_states, **self.params.to_dict()}
        if self.max_tokens is not None:
            d.update(max_tokens=self.max_tokens, extrapolation=self.extrapolation, per_category=self.per_category)
        return d


@dataclass(frozen=True)
class WhatIf:
    """The what-if estimate of one trace, or of one category of it.

    Attributes:
        rows: :class:`WhatIfRow` for n_draft = 1..n_max.
        best_n_draft: the n_draft with the highest estimated tokens/s (None without timings; the
            recommendation, :mod:`traces.analysis.advice`, weighs it against plain decoding and the runner-up).
        recorded_n_draft: K, the trace's n_draft.
        n_rounds / n_verify_rounds / n_prompts: what the estimate is fitted on (verify rounds = first drafts).
        cost: :class:`CostModel` (None without timings); baseline: the :class:`PlainBaseline` used.
        model: the fit of :mod:`traces.analysis.acceptance_model` (:class:`ModelFit`: pooled, or the category's).
        calibration: ``{count: trace / model at K}`` (1 = the model reproduced the trace by itself).
        by_category: ``{category: WhatIf}`` (categories of the manifest), empty without categories.
        samples: ``{"tokens_per_s": float[B, n_max], "speedup": float[B, n_max], ...}``: the bootstrap
            values behind the intervals (not in JSON).
        measured_tokens_per_s: the trace's own tokens/s at the recorded n_draft as ``report`` measures it
            (:func:`traces.analysis.metrics.timing`: emitted tokens / draft + verify time, every round at its own
            time); the recorded row's ``tokens_per_s`` prices each round size at its median instead (docs/EXPLAIN.md
            §4), so the two differ by what slow rounds cost. None without timings, and per category.
        interval_units: what the intervals resample, a key of :data:`INTERVAL_UNITS` (prompts, blocks of rounds,
            mixed, none: one unit, off: n_boot 0); :meth:`interval_words` says it in words.
    """

    rows: tuple[WhatIfRow, ...]
    best_n_draft: int | None
    recorded_n_draft: int
    n_rounds: int
    n_verify_rounds: int
    n_prompts: int
    cost: CostModel | None
    baseline: PlainBaseline | None
    model: ModelFit
    calibration: dict[str, float]
    by_category: dict[str, WhatIf] = field(default_factory=dict)
    samples: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)
    measured_tokens_per_s: float | None = None
    interval_units: str = "prompts"

    def row(self, n_draft: int) -> WhatIfRow:
        return self.rows[int(n_draft) - 1]

    def interval_words(self) -> str:
        """The units in words (explain's header, the app's caption); blocks by category: the trace may have more prompts."""
        by_cat = self.interval_units == "blocks" and bool(self.by_category)
        return INTERVAL_UNITS["blocks_by_category" if by_cat else self.interval_units]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict: ``rows``, ``best_n_draft``, ``recorded_n_draft``, ``n_rounds``,
        ``n_verify_rounds``, ``n_prompts``, ``cost``, ``baseline``, ``model``, ``calibration``, ``by_category``."""
        return {"rows": [r.to_dict() for r in self.rows], "best_n_draft": self.best_n_draft,
                "recorded_n_draft": self.recorded_n_draft, "n_rounds": self.n_rounds,
                "n_verify_rounds": self.n_verify_rounds, "n_prompts": self.n_prompts,
                "cost": None if self.cost is None else self.cost.to_dict(),
                "baseline": None if self.baseline is None else self.baseline.to_dict(),
                "model": self.model.to_dict(), "calibration": self.calibration,
                "by_category": {c: w.to_dict() for c, w in self.by_category.items()},
                "measured_tokens_per_s": self.measured_tokens_per_s, "interval_units": self.interval_units}


# ------------------------------------------------------------------------------------------ the estimate

def extend_depths(p: np.ndarray, n: int) -> np.ndarray:
    """``p[..., S, D]`` extended to ``n`` depths: beyond the recorded ``D`` each state's acceptance keeps
    falling by the ratio of its last two recorded depths, ``p[s, d] = p[s, D] r_s^(d - D)`` with ``r_s =
    p[s, D] / p[s, D - 1]`` clipped to [0.5, 1] (the drafter's chained state goes on degrading as at its
    last recorded step; 1 when D = 1: held flat)."""
    p = np.asarray(p, dtype=np.float64)
    D = p.shape[-1]
    if n <= D:
        return p
    if D < 2:
        return AM._depths(p, n)
    r = np.clip(p[..., D - 1] / np.maximum(p[..., D - 2], 1e-12), 0.5, 1.0)
    return np.concatenate([p, p[..., -1:] * r[..., None] ** np.arange(1, n - D + 1)], axis=-1)


@dataclass
class _Group:
    """One category's rounds, observations, fit and per-unit sums (the bootstrap's units)."""

    name: str
    rounds: pd.DataFrame
    obs: AM.Observations
    params: AM.Params
    stats: AM.Stats
    unit_prompt: np.ndarray | None      # units are prompts: the prompt id of each unit, else None (blocks)
    sums: dict[str, np.ndarray]         # per unit: emitted, accepted, drafted, verify; costs.size_sums' keys
    units: np.ndarray | None = None     # the unit of each round
    own: bool = True                    # fitted on its own rounds (the bootstrap refits it), else the pooled fit

    @property
    def n_units(self) -> int:
        return len(self.sums["emitted"])


def _unit_sums(r: pd.DataFrame, units: np.ndarray, n_units: int) -> dict[str, np.ndarray]:
    nd = r["n_draft"].to_numpy(dtype=np.int64)
    na = r["n_accepted"].to_numpy(dtype=np.int64)
    ne = emitted_counts(r)
    out = {"emitted": np.bincount(units, ne, n_units), "accepted": np.bincount(units, na, n_units),
           "drafted": np.bincount(units, nd, n_units), "verify": np.bincount(units, (nd > 0).astype(float), n_units)}
    out.update(size_sums(r, units, n_units) or {})
    return out


def _units(r: pd.DataFrame) -> tuple[np.ndarray, int, np.ndarray | None]:
    """Bootstrap units of the rounds: prompts, or blocks of ``BLOCK_ROUNDS`` consecutive rounds of a
    prompt when there are fewer than ``MIN_BOOT_UNITS`` prompts. Returns ``(unit per round, number of
    units, prompt id per unit or None for blocks)``."""
    pid = r["prompt_id"].to_numpy(dtype=np.int64)
    uniq, inv = np.unique(pid, return_inverse=True)
    if len(uniq) >= MIN_BOOT_UNITS:
        return inv.astype(np.int64), len(uniq), uniq
    order = np.lexsort((r["round"].to_numpy(), pid))
    rank = np.empty(len(r), np.int64)
    first = np.searchsorted(pid[order], uniq)
    rank[order] = np.arange(len(r)) - np.repeat(first, np.bincount(inv, minlength=len(uniq)))
    _, blk = np.unique(inv.astype(np.int64) * (len(r) + 1) + rank // BLOCK_ROUNDS, return_inverse=True)
    return blk.astype(np.int64), int(blk.max()) + 1 if len(blk) else 0, None


def _group(name: str, r: pd.DataFrame, n_states: int, K: int,
           pooled: AM.Params | None = None, own: bool | None = None) -> _Group:
    """A group's fit (``pooled`` as it is, else its own), every parameter over K depths, and its E-step
    statistics per bootstrap unit. ``own``: the bootstrap refits the group (default: when not pooled; the
    one group of a trace without categories is fitted on its own rounds even as ``pooled``)."""
    own = pooled is None if own is None else own
    units, n_units, unit_prompt = _units(r)
    obs = AM.observations(r, units)
    params = pooled if pooled is not None else AM.fit(obs, n_states=n_states)[0]
    params = AM.Params(params.pi, params.A, AM._depths(params.p, K))
    stats, _ = AM.expected_stats(AM.blocks(obs), params, n_units)
    return _Group(name, r, obs, params, stats, unit_prompt, _unit_sums(r, units, n_units), units, own=own)


def _weights(n_units: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``float[1 + n_boot, n_units]``: row 0 all ones (the estimate), then multinomial resamples."""
    w = np.ones((1 + n_boot, n_units))
    if n_units and n_boot:
        w[1:] = rng.multinomial(n_units, np.full(n_units, 1.0 / n_units), size=n_boot)
    return w


def _model_time(costs: SizeCosts, pr: AM.Prediction) -> np.ndarray:
    """Per-replicate ms of the predicted rounds: ``sum_L rounds_L * (t_draft(L) + t_verify(L + 1))``."""
    t = np.zeros(pr.by_size.shape[0])
    for L in range(pr.by_size.shape[1]):
        t = t + pr.by_size[:, L] * costs.round(L)
    return t


COUNTS = ("accepted", "drafted", "verify", "time")


def _predict_group(g: _Group, W: np.ndarray, n_values: range, K: int, max_tokens: int,
                   costs: SizeCosts | None) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Calibrated counts per n_draft for every weight row (``{count: float[B, n]}``, ``"emitted":
    float[B]``) and the point estimate's calibration factors (trace / model at K)."""
    B = W.shape[0]
    D = max(max(n_values), K)
    if g.own:       # each resample refits its own rounds (one EM step from the fit); row 0 is the fit itself
        params = AM.m_step(g.stats, W)
        p = extend_depths(params.p, D)
        pi, A = params.pi.copy(), params.A.copy()
        pi[0], A[0], p[0] = g.params.pi, g.params.A, extend_depths(g.params.p, D)
    else:           # a small category on the pooled fit: so is every resample (refitting it on its own
        pi = np.broadcast_to(g.params.pi, (B, *g.params.pi.shape)).copy()   # rounds would centre the
        A = np.broadcast_to(g.params.A, (B, *g.params.A.shape)).copy()      # interval on another model)
        pe = extend_depths(g.params.p, D)
        p = np.broadcast_to(pe, (B, *pe.shape)).copy()
    params = AM.Params(pi, A, p)
    ends = g.obs.ends
    emitted = float(ends.sum())
    s = g.sums
    em_obs = np.maximum(W @ s["emitted"], 1e-12)
    preds = AM.predict_all(params, sorted(set(n_values) | {K}), ends, max_tokens=max_tokens)
    model_k = {"drafted": preds[K].drafted, "verify": preds[K].rounds}
    ratio = {k: ((W @ s[k]) / em_obs) / np.maximum(model_k[k] / max(emitted, 1e-12), 1e-12) for k in model_k}
    if costs is not None:     # the trace's own rounds at the robust prices (not their raw sum: spikes)
        own_t = costs.trace_time({int(k[3:]) - 1: W @ s[k] for k in s if k.startswith("cnt")})
        ratio["time"] = (own_t / em_obs) / np.maximum(_model_time(costs, preds[K]) / max(emitted, 1e-12), 1e-12)
    # the acceptance rate is calibrated on the odds (it stays in [0, 1]); accepted = rate x drafted
    rate_obs = _clip01((W @ s["accepted"]) / np.maximum(W @ s["drafted"], 1e-12))
    rate_k = _clip01(preds[K].accepted / np.maximum(preds[K].drafted, 1e-12))
    ratio["acceptance_odds"] = _odds(rate_obs) / _odds(rate_k)
    out: dict[str, np.ndarray] = {k: np.full((B, len(n_values)), np.nan) for k in COUNTS}
    out["by_size"] = np.zeros((B, len(n_values), max(n_values) + 1))
    for j, N in enumerate(n_values):
        pr = preds[N]
        out["by_size"][:, j, :N + 1] = pr.by_size
        out["by_size"][:, j, 1:N + 1] *= ratio["verify"][:, None]
        o = _odds(_clip01(pr.accepted / np.maximum(pr.drafted, 1e-12))) * ratio["acceptance_odds"]
        out["drafted"][:, j] = pr.drafted * ratio["drafted"]
        out["accepted"][:, j] = o / (1.0 + o) * out["drafted"][:, j]
        out["verify"][:, j] = pr.rounds * ratio["verify"]
        if costs is not None:
            out["time"][:, j] = _model_time(costs, pr) * ratio["time"]
    out["emitted"] = np.full(B, emitted)
    return out, {k: float(v[0]) for k, v in ratio.items()}


def _clip01(x: np.ndarray) -> np.ndarray:
    clipped: np.ndarray = np.clip(x, 1e-9, 1.0 - 1e-9)
    return clipped


def _odds(x: np.ndarray) -> np.ndarray:
    return x / (1.0 - x)


def _plain(baseline: PlainBaseline | None, groups: list[_Group], Ws: list[np.ndarray], B: int,
           only: _Group | None = None, rng: np.random.Generator | None = None) -> np.ndarray | None:
    """Plain decoding's ms per token per replicate: paired with the prompts' resample when it was measured
    per prompt and the units are prompts; else, measured per prompt, a resample of its own prompts (``rng``:
    its spread enters the intervals too); else fixed. None when not measured."""
    if baseline is None or not baseline.measured:
        return None
    sel = [(g, W) for g, W in zip(groups, Ws, strict=True) if only is None or g is only]
    if baseline.per_prompt and rng is not None and B > 1 and not all(g.unit_prompt is not None for g, _ in sel):
        ids = sorted(baseline.per_prompt) if only is None else \
            [int(p) for p in only.obs.prompt_ids if int(p) in baseline.per_prompt]
        if len(ids) >= 2:
            tok = np.array([baseline.per_prompt[p][0] for p in ids], float)
            ms = np.array([baseline.per_prompt[p][1] for p in ids], float)
            Wb = _weights(len(ids), B - 1, rng)
            out: np.ndarray = (Wb @ ms) / np.maximum(Wb @ tok, 1e-12)
            out[0] = baseline.t_per_token_ms if only is None else baseline.for_prompts(ids)
            return out
    by_prompt = [(g.unit_prompt, W) for g, W in sel if g.unit_prompt is not None]
    if baseline.per_prompt and len(by_prompt) == len(sel):
        # cast: sel holds a group at least (only, or every group), so each sum is an array
        tok = cast(np.ndarray, sum(W @ np.array([baseline.per_prompt.get(int(p), (0, 0.0))[0] for p in up], np.float64)
                                   for up, W in by_prompt))
        ms = cast(np.ndarray, sum(W @ np.array([baseline.per_prompt.get(int(p), (0, 0.0))[1] for p in up], np.float64)
                                  for up, W in by_prompt))
        fallback = baseline.for_prompts([p for up, _ in by_prompt for p in up])
        return np.where(tok > 0, ms / np.maximum(tok, 1e-12), fallback)
    own_ids = None if only is None else only.obs.prompt_ids
    return np.full(B, baseline.t_per_token_ms if own_ids is None else baseline.for_prompts(own_ids))


def _costs(groups: list[_Group], Ws: list[np.ndarray], probe: CostProbe | None,
           plain: np.ndarray | None, rng: np.random.Generator | None = None) -> SizeCosts | None:
    """Per-replicate round costs over all groups (the categories ran on one machine):
    :class:`traces.analysis.costs.SizeCosts` of every round weighted by its unit's weight in each replicate
    (the medians of the resampled rounds), the probe resampled over its repetitions (``rng``)."""
    found = [round_arrays(g.rounds) for g in groups]
    arrs = [a for a in found if a is not None]
    if len(arrs) < len(found):
        return None
    nd = np.concatenate([a[0] for a in arrs])
    td = np.concatenate([a[1] for a in arrs])
    tv = np.concatenate([a[2] for a in arrs])
    w = np.concatenate([W[:, g.units].astype(np.int64) for g, W in zip(groups, Ws, strict=True)], axis=1)
    B = w.shape[0]
    draws = probe.draws(B, rng) if probe is not None and rng is not None else None
    return SizeCosts.from_rounds(nd, td, tv, w, probe, plain, draws)


def _interval(v: np.ndarray) -> tuple[float, float] | None:
    """95 % percentile interval of the bootstrap values ``v[1:]`` (None with fewer than two finite ones),
    widened to hold the estimate ``v[0]`` (a median's resamples can all fall on one side of it)."""
    s = v[1:]
    s = s[np.isfinite(s)]
    if len(s) < 2:
        return None
    lo, hi = np.quantile(s, QUANTILES)
    if math.isfinite(float(v[0])):
        lo, hi = min(float(lo), float(v[0])), max(float(hi), float(v[0]))
    return float(lo), float(hi)


def _whatif(counts: Mapping[str, np.ndarray], plain: np.ndarray | None, n_values: range, K: int, *, timed: bool,
            n_rounds: int, n_verify: int, n_prompts: int, cost: CostModel | None, baseline: PlainBaseline | None,
            model: ModelFit, calibration: dict[str, float], resampled: bool,
            by_category: dict[str, WhatIf] | None = None) -> WhatIf:
    acc, dr, ver, tm = (counts[k] for k in COUNTS)
    em = counts["emitted"][:, None]
    rate, mal = rates.acceptance_rates(acc, dr), rates.mean_acceptance_lengths(acc, ver)
    with np.errstate(divide="ignore", invalid="ignore"):
        tps = np.where(tm > 0, 1000.0 * em / tm, np.nan) if timed else np.full_like(rate, np.nan)
        if not timed:
            plain_ms = None
        elif plain is not None:
            plain_ms = plain
        else:
            plain_ms = np.full(len(tps), cost.t_plain_ms if cost is not None else np.nan)
        sp = tps * plain_ms[:, None] / 1000.0 if plain_ms is not None else np.full_like(rate, np.nan)

    def val(x: np.ndarray, j: int) -> float | None:
        v = float(x[0, j])
        return v if math.isfinite(v) else None

    rows = []
    for j, N in enumerate(n_values):
        def iv(x: np.ndarray, j: int = j) -> tuple[float, float] | None:
            return _interval(x[:, j]) if resampled else None

        rows.append(WhatIfRow(n_draft=N, acceptance_rate=val(rate, j), mean_acceptance_length=val(mal, j),
                              n_drafted=val(dr, j), n_verify_rounds=val(ver, j),
                              rounds_by_size=tuple(float(x) for x in counts["by_size"][0, j, :N + 1]),
                              tokens_per_s=val(tps, j), speedup=val(sp, j), recorded=N == K, extrapolated=N > K,
                              acceptance_rate_interval=iv(rate), mean_acceptance_length_interval=iv(mal),
                              tokens_per_s_interval=iv(tps) if timed else None,
                              speedup_interval=iv(sp) if timed else None))
    best = None
    cands = [r for r in rows if r.tokens_per_s is not None]
    if cands:
        best = max(cands, key=lambda r: (r.tokens_per_s, -r.n_draft)).n_draft
    samples = {"acceptance_rate": rate, "mean_acceptance_length": mal, "tokens_per_s": tps, "speedup": sp}
    if plain_ms is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            samples["plain_tokens_per_s"] = np.where(plain_ms > 0, 1000.0 / np.where(plain_ms > 0, plain_ms, 1), np.nan)
    return WhatIf(rows=tuple(rows), best_n_draft=best, recorded_n_draft=K, n_rounds=n_rounds, n_verify_rounds=n_verify,
                  n_prompts=n_prompts, cost=cost, baseline=baseline, model=model, calibration=calibration,
                  by_category=by_category or {}, samples=samples)


def what_if(rounds: pd.DataFrame, *, categories: Mapping[int, str] | None = None,
            baseline: PlainBaseline | None = None, max_tokens: int | None = None, n_max: int = N_MAX,
            n_boot: int = N_BOOT, seed: int = SEED, n_states: int = AM.N_STATES,
            t_plain_ms: float | None = None, probe: CostProbe | None = None) -> WhatIf:
    """The estimate for n_draft = 1..``n_max`` (module docstring) from a trace's rounds.

    Args:
        rounds: columns ``prompt_id``, ``round``, ``n_draft``, ``n_accepted`` (``emitted`` when known);
            ``t_draft_ms``, ``t_verify_ms`` for speed.
        categories: ``{prompt_id: category}``: fitted per category (shrunk to the pooled fit) and
            combined by adding their counts; each category's estimate is in ``by_category``. None: one
            group (the pooled fit).
        baseline: plain decoding (:class:`PlainBaseline`), else estimated as ``t_verify(1)``;
            ``t_plain_ms``: a measured ms per token given as a number instead.
        max_tokens: the recording's cap (``params.max_tokens``); None: the longest prompt's length.
        n_max: the largest n_draft estimated (>= 1); n_boot: bootstrap resamples (0: no intervals);
        seed: their seed; n_states: hidden states of the model.
        probe: the recorder's timing of every round size (:class:`traces.analysis.costs.CostProbe`, manifest
            ``cost_probe``), which prices the sizes the trace did not record; None: lines through the recorded.

    Raises:
        TraceFormatError: missing columns, no drafting round, ``n_max < 1``.
    """
    for c in ("prompt_id", "round", "n_draft", "n_accepted"):
        if c not in rounds.columns:
            raise TraceFormatError("rounds lacks a column", key=c, expected="present", actual="missing")
    if n_max < 1:
        raise TraceFormatError("n_max must be >= 1", key="n_max", expected=">= 1", actual=n_max)
    nd_all = rounds["n_draft"].to_numpy(dtype=np.int64)
    if not len(nd_all) or nd_all.max() < 1:
        raise TraceFormatError("no round drafted a token: nothing to estimate from", key="n_draft",
                               expected="> 0", actual=0)
    if baseline is None and t_plain_ms is not None and math.isfinite(t_plain_ms) and t_plain_ms > 0:
        baseline = PlainBaseline(float(t_plain_ms), "manifest", "given as a number")
    rounds = rounds.reset_index(drop=True)
    K = int(nd_all.max())
    n_values = range(1, n_max + 1)
    pid = rounds["prompt_id"].to_numpy(dtype=np.int64)
    obs_all = AM.observations(rounds)
    if max_tokens is None:
        max_tokens = int(obs_all.ends.max()) + 1 if obs_all.n_prompts else 1
    pooled, _, _ = AM.fit(obs_all, n_states=n_states)
    if categories:
        lab = np.array([categories.get(int(p), UNCATEGORIZED) for p in pid], dtype=object)
        names = sorted(set(lab.tolist()))
        groups = []
        for n in names:
            sub = rounds[lab == n].reset_index(drop=True)
            few = int((sub["n_draft"].to_numpy() > 0).sum()) < CATEGORY_MIN_ROUNDS
            groups.append(_group(n, sub, n_states, K, pooled=pooled if few else None))
    else:
        groups = [_group("", rounds, n_states, K, pooled=pooled, own=True)]
    rng = np.random.default_rng(seed)
    Ws = [_weights(g.n_units, n_boot, rng) for g in groups]
    B = 1 + n_boot
    plain = _plain(baseline, groups, Ws, B, rng=rng)
    costs = _costs(groups, Ws, probe, plain, rng)
    timed = costs is not None
    cost = fit_cost(rounds, baseline, probe) if timed else None
    if costs is not None and plain is None:
        plain = costs.verify(1)
    per = {g.name: _predict_group(g, W, n_values, K, max_tokens, costs) for g, W in zip(groups, Ws, strict=True)}
    # cast: there is a group at least, so each sum is an array
    total = {k: cast(np.ndarray, sum(per[g.name][0][k] for g in groups)) for k in (*COUNTS, "emitted", "by_size")}
    calib = {k: float(np.average([per[g.name][1][k] for g in groups], weights=[g.obs.ends.sum() + 1e-9 for g in groups]))
             for k in per[groups[0].name][1]}
    resampled = n_boot > 0 and any(g.n_units >= 2 for g in groups)     # (one unit resamples to itself: no interval)

    def units_of(gs: list[_Group]) -> str:
        kinds = {"prompts" if g.unit_prompt is not None else "blocks" for g in gs if g.n_units >= 2}
        return "off" if n_boot <= 0 else "none" if not kinds else kinds.pop() if len(kinds) == 1 else "mixed"
    by_cat: dict[str, WhatIf] = {}
    if categories:
        for g, _W in zip(groups, Ws, strict=True):
            nd = g.rounds["n_draft"].to_numpy(dtype=np.int64)
            gp = _plain(baseline, groups, Ws, B, only=g, rng=rng) if timed else None
            if timed and gp is None:
                gp = plain
            gb = None if baseline is None else PlainBaseline(baseline.for_prompts(g.obs.prompt_ids), baseline.source,
                                                             baseline.how, baseline.per_prompt)
            by_cat[g.name] = _whatif(per[g.name][0], gp, n_values, K, timed=timed, n_rounds=len(g.rounds),
                                     n_verify=int((nd > 0).sum()), n_prompts=g.obs.n_prompts, cost=cost,
                                     baseline=gb, model=ModelFit(g.params), calibration=per[g.name][1],
                                     resampled=n_boot > 0 and g.n_units >= 2)
            by_cat[g.name] = replace(by_cat[g.name], interval_units=units_of([g]))
    model = ModelFit(pooled, max_tokens=int(max_tokens),
                     extrapolation="p[s, d] = p[s, K] r_s^(d - K), r_s = p[s, K] / p[s, K - 1] in [0.5, 1]",
                     per_category=bool(categories))
    est = _whatif(total, plain, n_values, K, timed=timed, n_rounds=len(rounds), n_verify=int((nd_all > 0).sum()),
                  n_prompts=obs_all.n_prompts, cost=cost, baseline=baseline, model=model, calibration=calib,
                  resampled=resampled, by_category=by_cat)
    measured = timing(rounds) if timed else None
    return replace(est, measured_tokens_per_s=None if measured is None else measured.get("tokens_per_s"),
                   interval_units=units_of(groups))


def baseline_ms(manifest: Mapping[str, Any]) -> float | None:
    """Plain decoding's ms per token from ``manifest["baseline"]["t_per_token_ms"]`` (``record
    --baseline``), None when absent or not a positive number."""
    b = manifest_baseline(manifest)
    return None if b is None else b.t_per_token_ms


def what_if_trace(trace: TraceLike, *, categories: Mapping[int, str] | None = None, baseline: PlainBaseline | None = None,
                  n_max: int = N_MAX, n_boot: int = N_BOOT) -> WhatIf:
    """:func:`what_if` of an opened trace (reads only the columns it needs; ``max_tokens`` from its
    manifest; the baseline from its manifest unless given).

    Raises:
        TraceFormatError: the trace has no drafting round, or a malformed ``cost_probe``.
    """
    names = set(trace.schemas["rounds"].names) if hasattr(trace, "schemas") else set(WHAT_IF_ROUNDS_COLUMNS)
    rounds = trace.columns("rounds", [c for c in WHAT_IF_ROUNDS_COLUMNS if c in names])
    mt = (trace.manifest.get("params") or {}).get("max_tokens")
    return what_if(rounds, categories=categories, baseline=baseline or manifest_baseline(trace.manifest),
                   max_tokens=int(mt) if isinstance(mt, int) and not isinstance(mt, bool) else None,
                   n_max=n_max, n_boot=n_boot, probe=CostProbe.of_trace(trace))
