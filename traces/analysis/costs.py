"""The costs of a trace's drafting, and of plain decoding: what the what-if (:mod:`traces.analysis.what_if`) prices
counts with, defined as the measured tokens/s defines them (:func:`mtpscope.traces.analysis.metrics.timing`).

**Costs** (:class:`CostModel`, :func:`fit_cost`; :class:`SizeCosts` holds the rule, for the what-if's
bootstrap replicates too), on the definitions the measured tokens/s uses (:func:`mtpscope.traces.analysis.metrics.timing`):
a round that drafts ``k`` tokens costs ``t_draft(k) + t_verify(k + 1)`` (``k = 0``: a plain decode step).
A size the trace recorded (at least ``MIN_SIZE_ROUNDS`` rounds) costs the **median** of its rounds (a few load
spikes cannot move it; :class:`SizeCosts`, the one pricing rule). Other sizes
come from the recorder's **probe** (manifest ``cost_probe``: every size timed on the same machine after
the loop, :meth:`traces.run.mtp_runtime.MtpRuntime.probe_costs`) scaled to this trace by ``sum_m c_m
med_m / sum_m c_m probe(m)`` over the recorded sizes ``m`` (``c_m`` rounds): the probe gives the shape
(llama.cpp's verify time jumps where its kernels change with the batch size; a round's first draft step
costs more than the next), the trace the level. Without a probe (older traces, imports): lines, ``v0 +
v1 n`` through the recorded verify medians (weighted by their rounds) and, when plain decoding was
measured, the point ``(1, t_plain)``, ``v1 >= 0``, through the origin when the free intercept is
negative, flat with one size; ``d0 + d1 k`` the same way through the draft medians, proportional with one
count. ``t_step = sum_k c_k med_d(k) / sum_k c_k k`` is the draft step at the robust prices (a sweep's
measured break-even uses it; a trace's break-even prices a round's drafts as above). A probe must be
well formed (sizes positive integers, times finite within ``PROBE_MS_RANGE``): a malformed entry is
refused, naming its key (:meth:`CostProbe.from_manifest`), never silently dropped.

``t_plain`` (:class:`PlainBaseline`): plain decoding measured by the sweep's baseline task or ``record
--baseline`` (``source`` says which), else estimated as ``t_verify(1)`` (``source: "estimated"``).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pandas as pd

from mtpscope.errors import TraceFormatError
from mtpscope.traces.analysis.metrics import emitted_counts
from mtpscope.traces.store.layout import MANIFEST
from mtpscope.traces.store.schema import MAX_TIME_MS, MIN_TIME_MS


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
    if not isinstance(b, dict):
        return None
    v = b.get("t_per_token_ms")
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

#: a probe's times (ms), ``lo <= t < hi`` and in words: the plausible-time rule of rounds too (schema.MIN_TIME_MS)
PROBE_MS_RANGE = (MIN_TIME_MS, MAX_TIME_MS)
PROBE_MS_WORDS = f"a finite number of ms, {MIN_TIME_MS:g} <= t < {MAX_TIME_MS:.0f} (a nanosecond to a day)"
#: stands for a key that is not there (a refusal says "missing")
_ABSENT = object()
#: a probe's size key: a decimal positive integer of at most 4 digits (ASCII: ``str.isdigit`` takes '²')
PROBE_SIZE_RE = re.compile(r"[1-9][0-9]{0,3}")
#: the largest n_draft the what-if estimates and :meth:`CostModel.to_dict` prices
N_MAX = 8
#: a round size with fewer rounds than this in the trace is priced like one it did not record (its few
#: rounds still count towards the probe's scale)
MIN_SIZE_ROUNDS = 5


@runtime_checkable
class _CarriesProbe(Protocol):
    cost_probe: CostProbe | None       # a trace that carries its probe, checked already (CostProbe.of_trace)


@dataclass(frozen=True)
class CostProbe:
    """The recorder's timing of a round of every size (manifest ``cost_probe``,
    :meth:`traces.run.mtp_runtime.MtpRuntime.probe_costs`): medians in ms, at one position.

    Attributes:
        verify_ms: ``{n: ms}`` the target's verify of ``n`` tokens (``n = 1``: a plain decode step).
        draft_ms: ``{k: ms}`` a round's ``k`` drafter steps.
        reps: repetitions behind each median.
        verify_reps_ms / draft_reps_ms: ``{n: (ms, ...)}`` every repetition's time (manifest
            ``verify_reps_ms`` / ``draft_reps_ms``; empty for probes recorded before them): the probe's own
            spread, which :meth:`draws` carries into the what-if's intervals.
    """

    verify_ms: Mapping[int, float]
    draft_ms: Mapping[int, float]
    reps: int
    verify_reps_ms: Mapping[int, tuple[float, ...]] = field(default_factory=dict)
    draft_reps_ms: Mapping[int, tuple[float, ...]] = field(default_factory=dict)

    def draws(self, B: int, rng: np.random.Generator) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
        """``(verify {n: float[B]}, draft {k: float[B]})``: replicate 0 the probe's medians, the others the
        median of a resample (with replacement) of that size's repetitions; sizes without repetitions keep
        their median in every replicate."""
        out: list[dict[int, np.ndarray]] = []
        for med, reps in ((self.verify_ms, self.verify_reps_ms), (self.draft_ms, self.draft_reps_ms)):
            d = {}
            for n, t in sorted(med.items()):
                v = np.full(B, float(t))
                r = np.asarray(reps.get(n, ()), np.float64)
                if len(r) >= 2 and B > 1:
                    v[1:] = np.median(r[rng.integers(0, len(r), size=(B - 1, len(r)))], axis=1)
                d[n] = v
            out.append(d)
        return out[0], out[1]

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any], path: str | os.PathLike[str] | None = None) -> CostProbe | None:
        """The manifest's ``cost_probe``, None when absent (or null). mtpscope writes the probe itself, so an entry
        that breaks its form is bad input, refused (never dropped: the what-if would then price every size on
        lines and its advice could flip): ``verify_ms`` (required, at least one size) and ``draft_ms`` map sizes
        (decimal strings of positive integers, :data:`PROBE_SIZE_RE`) to times in ``PROBE_MS_RANGE`` ms;
        ``verify_reps_ms`` / ``draft_reps_ms`` (absent in older traces) map sizes to non-empty lists of such
        times; ``reps`` is an integer >= 0 (absent: 0). The one check of a probe: every reader calls this.

        Args:
            manifest: the trace's manifest.
            path: its file, named in the error (:meth:`of_trace` passes it).

        Raises:
            TraceFormatError: the first malformed entry, named by its key (``cost_probe.draft_ms.8``).
        """
        e = manifest.get("cost_probe")
        if e is None:
            return None

        def bad(key: str, expected: str, got: Any) -> TraceFormatError:
            return TraceFormatError("malformed cost probe entry", path=path, key=key, expected=expected,
                                    actual="missing" if got is _ABSENT else repr(got)[:40])

        if not isinstance(e, dict):
            raise bad("cost_probe", "an object (docs/TRACE_FORMAT.md) or null", e)

        def size(key: str, k: Any) -> int:
            if not (isinstance(k, str) and PROBE_SIZE_RE.fullmatch(k)):
                raise bad(f"{key}.{k}", "a size 1..9999 as a decimal string", k)
            return int(k)

        def ms(key: str, v: Any) -> float:
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and PROBE_MS_RANGE[0] <= v < PROBE_MS_RANGE[1]):
                raise bad(key, PROBE_MS_WORDS, v)
            return float(v)

        def sizes(name: str, required: bool) -> dict[int, float]:
            d, key = e.get(name), f"cost_probe.{name}"
            if d is None and not required:
                return {}
            if not isinstance(d, dict) or not d:
                raise bad(key, "an object of sizes to ms, at least one size", _ABSENT if name not in e else d)
            return {size(key, k): ms(f"{key}.{k}", v) for k, v in d.items()}

        def rep_lists(name: str) -> dict[int, tuple[float, ...]]:
            d, key = e.get(name), f"cost_probe.{name}"
            if d is None:
                return {}
            if not isinstance(d, dict):
                raise bad(key, "an object of sizes to lists of ms", d)
            out = {}
            for k, v in d.items():
                n = size(key, k)
                if not isinstance(v, list) or not v:
                    raise bad(f"{key}.{k}", "a non-empty list of ms", v)
                out[n] = tuple(ms(f"{key}.{k}[{i}]", x) for i, x in enumerate(v))
            return out

        v, d = sizes("verify_ms", True), sizes("draft_ms", False)
        reps = e.get("reps")
        if reps is not None and (not isinstance(reps, int) or isinstance(reps, bool) or reps < 0):
            raise bad("cost_probe.reps", "an integer >= 0", reps)
        return cls(v, d, reps or 0, rep_lists("verify_reps_ms"), rep_lists("draft_reps_ms"))

    @classmethod
    def of_trace(cls, trace: Any) -> CostProbe | None:
        """:meth:`from_manifest` of an opened trace (a :class:`traces.store.protocols.TraceLike`), its errors naming
        the trace's manifest file; a trace that carries its probe (``cost_probe``: a sweep cell's, merged from its
        shards' checked ones; its folder has no manifest file) gives that one, not checked again."""
        if isinstance(trace, _CarriesProbe):
            return trace.cost_probe
        return cls.from_manifest(trace.manifest, Path(trace.path) / MANIFEST)

    @classmethod
    def merged(cls, probes: Any) -> CostProbe | None:
        """One probe from several (a sweep cell's shards): per size the median of the probes that timed it;
        None when there is none."""
        ps = [p for p in probes if p is not None]
        if not ps:
            return None

        def med(key: str) -> dict[int, float]:
            sizes = sorted({n for p in ps for n in getattr(p, key)})
            return {n: float(np.median([getattr(p, key)[n] for p in ps if n in getattr(p, key)])) for n in sizes}

        def cat(key: str) -> dict[int, tuple[float, ...]]:
            sizes = sorted({n for p in ps for n in getattr(p, key)})
            return {n: tuple(x for p in ps for x in getattr(p, key).get(n, ())) for n in sizes}

        return cls(med("verify_ms"), med("draft_ms"), sum(p.reps for p in ps), cat("verify_reps_ms"),
                   cat("draft_reps_ms"))

    def to_dict(self) -> dict[str, Any]:
        """The manifest's ``cost_probe`` entry, read back equal by :meth:`from_manifest` (a map with no size left out)."""
        maps: dict[str, Mapping[int, Any]] = {"verify_ms": self.verify_ms, "draft_ms": self.draft_ms,
                                              "verify_reps_ms": self.verify_reps_ms, "draft_reps_ms": self.draft_reps_ms}
        d: dict[str, Any] = {k: {str(n): list(v) if isinstance(v, tuple) else v for n, v in m.items()}
                             for k, m in maps.items() if m or k == "verify_ms"}
        return {**d, "reps": self.reps}


def draft_line(xs: list[float], ys: list[float], ws: list[float]) -> tuple[float, float, str]:
    """``(d0, d1, how)``: a round's draft time ``d0 + d1 k`` through the recorded draft counts ``xs`` (mean
    ms ``ys``, weights ``ws``): :func:`verify_line`'s rule, except that with one count it is proportional
    (``d0 = 0``: each step costs the same)."""
    x, y, w = (np.asarray(v, float) for v in (xs, ys, ws))
    if len(np.unique(x)) < 2:
        return 0.0, float(np.average(y / x, weights=w)), "one draft count: every step costs the same"
    return verify_line(xs, ys, ws)


def weighted_median(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The median of ``x`` (``float[r]``) under each row of integer weights ``w`` (``int[B, r]``: a round
    counted ``w[b, i]`` times) as ``float[B]``: the median of the expanded sample (for an even total the mean
    of the two middle values, as :func:`numpy.median`); NaN for a row of total weight 0."""
    order = np.argsort(x, kind="stable")
    xs = np.asarray(x, np.float64)[order]
    cum = np.cumsum(np.asarray(w)[:, order], axis=1, dtype=np.int64)
    tot = cum[:, -1] if cum.shape[1] else np.zeros(cum.shape[0], np.int64)
    lo_j, hi_j = (tot + 1) // 2, tot // 2 + 1
    lo = np.minimum((cum < lo_j[:, None]).sum(axis=1), len(xs) - 1)
    hi = np.minimum((cum < hi_j[:, None]).sum(axis=1), len(xs) - 1)
    return np.where(tot > 0, (xs[lo] + xs[hi]) / 2.0, np.nan) if len(xs) else np.full(cum.shape[0], np.nan)


@dataclass(frozen=True)
class SizeCosts:
    """The price of a round of each size, for ``B`` replicates at once (the point estimate is replicate 0):
    ``verify(n)`` and ``draft(k)`` as ``float[B]`` ms. THE pricing rule: the what-if's point estimate,
    each of its bootstrap replicates, :func:`fit_cost` (the break-even) and so the recommendation all
    price through it. Per size, the source is fixed by the point estimate (a replicate never switches it):

    * ``own``: a size with at least ``MIN_SIZE_ROUNDS`` rounds in the trace: the **median** of its rounds
      (each replicate: the median of its resample of them, so the spread of the trace's own times enters
      the intervals; a replicate without such a round keeps the point value);
    * ``probe``: else, with a probe (:class:`CostProbe`) that timed it: the probe's median scaled to the
      trace, ``probe(n) * sum_m c_m med_m / sum_m c_m probe(m)`` over the trace's own sizes ``m`` (``c_m``
      rounds; every replicate with its own medians and its resample of the probe's repetitions);
    * ``line``: else the line (:func:`verify_line` for verify, through the measured plain decoding too;
      :func:`draft_line` for drafts) through the medians of every recorded size.

    Why medians: a load spike of a few rounds (the issue-34 traces: 475 and 565 ms among 7 ms verifies)
    moves a mean by any amount and a median not at all while fewer than half the rounds are hit.
    """

    med_v: Mapping[int, np.ndarray]
    count_v: Mapping[int, np.ndarray]
    med_d: Mapping[int, np.ndarray]
    count_d: Mapping[int, np.ndarray]
    own_v: frozenset[int]
    own_d: frozenset[int]
    v_line: tuple[np.ndarray, np.ndarray]
    d_line: tuple[np.ndarray, np.ndarray]
    v_scale: np.ndarray | None
    d_scale: np.ndarray | None
    probe_v: Mapping[int, np.ndarray]
    probe_d: Mapping[int, np.ndarray]
    probe: CostProbe | None

    @classmethod
    def from_rounds(cls, nd: np.ndarray, td: np.ndarray, tv: np.ndarray, w: np.ndarray | None = None,
                    probe: CostProbe | None = None, plain: np.ndarray | None = None,
                    probe_draws: tuple[Mapping[int, np.ndarray], Mapping[int, np.ndarray]] | None = None) -> SizeCosts:
        """From the rounds' draft counts ``nd`` (``int[R]``), draft and verify ms ``td`` / ``tv`` (``float[R]``,
        NaN when missing: such a round prices no size), replicate weights ``w`` (``int[B, R]``, None: one
        replicate of ones), a probe, plain decoding's ms per token (``float[B]``, None when not measured) and
        the probe per replicate (``(verify {n: float[B]}, draft {k: float[B]})``, :meth:`CostProbe.draws`;
        None: the probe's medians in every replicate)."""
        nd = np.asarray(nd, np.int64)
        td, tv = np.asarray(td, np.float64), np.asarray(tv, np.float64)
        w = np.ones((1, len(nd)), np.int64) if w is None else np.asarray(w)
        B = w.shape[0]
        ok = np.isfinite(td) & np.isfinite(tv)
        med_v, count_v, med_d, count_d = {}, {}, {}, {}
        for k in np.unique(nd[ok]):
            m = ok & (nd == k)
            wk = w[:, m]
            count_v[int(k) + 1] = wk.sum(axis=1).astype(np.float64)
            med_v[int(k) + 1] = weighted_median(tv[m], wk)
            if k > 0:
                count_d[int(k)] = count_v[int(k) + 1]
                med_d[int(k)] = weighted_median(td[m], wk)
        own_v = frozenset(n for n, c in count_v.items() if c[0] >= MIN_SIZE_ROUNDS)
        own_d = frozenset(k for k, c in count_d.items() if c[0] >= MIN_SIZE_ROUNDS)
        lines = []
        for meds, counts, fit, extra in ((med_v, count_v, verify_line, plain), (med_d, count_d, draft_line, None)):
            a, b = np.zeros(B), np.zeros(B)
            for i in range(B):
                pts = [(float(n), float(meds[n][i]), float(counts[n][i])) for n in meds
                       if counts[n][i] > 0 and np.isfinite(meds[n][i])]
                if extra is not None:
                    pts.append((1.0, float(extra[i]), max([p[2] for p in pts], default=1.0)))
                if pts:
                    a[i], b[i], _ = fit(*map(list, zip(*pts, strict=True)))
            lines.append((a, b))
        if probe is not None and probe_draws is None:
            probe_draws = ({n: np.full(B, t) for n, t in probe.verify_ms.items()},
                           {k: np.full(B, t) for k, t in probe.draft_ms.items()})
        pv, pd_ = probe_draws if probe is not None and probe_draws is not None else ({}, {})

        def scale(meds: Mapping[int, np.ndarray], counts: Mapping[int, np.ndarray], own: frozenset[int],
                  times: Mapping[int, np.ndarray]) -> np.ndarray | None:
            use = [n for n in own if n in times] or [n for n in meds if n in times and counts[n][0] > 0]
            if not use:
                return None
            num = sum((counts[n] * np.nan_to_num(meds[n]) for n in use), np.zeros(B))
            den = sum((counts[n] * times[n] for n in use), np.zeros(B))
            out = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
            return out if np.isfinite(out[0]) else None

        return cls(med_v, count_v, med_d, count_d, own_v, own_d, lines[0], lines[1],
                   scale(med_v, count_v, own_v, pv), scale(med_d, count_d, own_d, pd_), pv, pd_, probe)

    def source(self, kind: str, x: int) -> str:
        """Where size ``x`` is priced from (``kind``: ``"verify"`` / ``"draft"``): ``"own"``, ``"probe"`` or
        ``"line"`` (class docstring); the same for every replicate."""
        own, pt, sc = (self.own_v, self.probe_v, self.v_scale) if kind == "verify" else \
            (self.own_d, self.probe_d, self.d_scale)
        if x in own:
            return "own"
        if x in pt and sc is not None:
            return "probe"
        return "line"

    def _price(self, kind: str, x: int) -> np.ndarray:
        meds, pt, sc, line = (self.med_v, self.probe_v, self.v_scale, self.v_line) if kind == "verify" else \
            (self.med_d, self.probe_d, self.d_scale, self.d_line)
        src = self.source(kind, x)
        if src == "own":
            m = meds[x]
            return np.where(np.isfinite(m), m, m[0])
        if src == "probe":
            if sc is None:      # source() says "probe" only with a scale
                raise ValueError(f"no probe scale for {kind} size {x}")
            s = np.where(np.isfinite(sc), sc, sc[0])
            priced: np.ndarray = pt[x] * s
            return priced
        on_line: np.ndarray = line[0] + line[1] * x
        return on_line

    def verify(self, n: int) -> np.ndarray:
        """ms to verify ``n`` tokens (``float[B]``)."""
        return self._price("verify", n)

    def draft(self, k: int) -> np.ndarray:
        """ms of a round's ``k`` drafter steps (``float[B]``; 0 for ``k = 0``)."""
        if k <= 0:
            return np.zeros(len(self.v_line[0]))
        return self._price("draft", k)

    def round(self, k: int) -> np.ndarray:
        """ms of a round that drafts ``k`` tokens and verifies ``k + 1`` (``k = 0``: a plain step)."""
        ms: np.ndarray = self.draft(k) + self.verify(k + 1)
        return ms

    def trace_time(self, counts: Mapping[int, np.ndarray]) -> np.ndarray:
        """The robust time of rounds ``{k: float[B]}`` (rounds drafting ``k``): ``sum_k counts_k round(k)``,
        ``float[B]`` ms: what the trace's own rounds cost at these prices (the what-if's calibration)."""
        B = len(self.v_line[0])
        return sum((np.asarray(c, np.float64) * self.round(k) for k, c in counts.items()), np.zeros(B))


@dataclass(frozen=True)
class CostModel:
    """Costs per round (milliseconds; module docstring), the point values of :class:`SizeCosts`.

    Attributes:
        t_step_ms: a draft step (the draft medians weighted by their rounds, per drafted token).
        verify_ms / verify_rounds: ``{n: median t_verify_ms}`` of the verify sizes recorded (n = draft count
            + 1) and ``{n: rounds}`` behind each.
        draft_ms / draft_rounds: ``{k: median t_draft_ms}`` of the draft counts recorded, ``{k: rounds}``.
        v0_ms, v1_ms / d0_ms, d1_ms: the lines ``v0 + v1 n`` / ``d0 + d1 k`` for sizes neither recorded
            nor probed.
        probe: the recorder's timing of every size (:class:`CostProbe`) when the trace has one;
            verify_scale / draft_scale: trace / probe over the recorded sizes.
        t_plain_ms: plain decoding per token (measured baseline, else ``t_verify(1)``).
        baseline: ``"measured"`` or ``"estimated"``; basis: how sizes not recorded are priced, in words.
    """

    t_step_ms: float
    verify_ms: dict[int, float]
    verify_rounds: dict[int, int]
    v0_ms: float
    v1_ms: float
    t_plain_ms: float
    baseline: str
    basis: str
    draft_ms: dict[int, float] = field(default_factory=dict)
    draft_rounds: dict[int, int] = field(default_factory=dict)
    d0_ms: float = 0.0
    d1_ms: float = 0.0
    probe: CostProbe | None = None
    verify_scale: float | None = None
    draft_scale: float | None = None
    sizes: SizeCosts | None = field(default=None, repr=False, compare=False)

    def t_verify(self, n: int) -> float:
        """ms to verify ``n`` tokens (:class:`SizeCosts` rule)."""
        return float(self.sizes.verify(n)[0]) if self.sizes is not None else self.v0_ms + self.v1_ms * n

    def t_draft(self, k: int) -> float:
        """ms of a round's ``k`` drafter steps (:class:`SizeCosts` rule)."""
        return float(self.sizes.draft(k)[0]) if self.sizes is not None else self.d0_ms + self.d1_ms * k

    def priced_verify(self) -> dict[int, float]:
        """``{n: ms}`` the verify of ``n`` tokens as the what-if prices it, n = 1..N_MAX + 1."""
        return {n: self.t_verify(n) for n in range(1, N_MAX + 2)}

    def priced_draft(self) -> dict[int, float]:
        """``{k: ms}`` a round's ``k`` drafter steps as the what-if prices them, k = 1..N_MAX."""
        return {k: self.t_draft(k) for k in range(1, N_MAX + 1)}

    def own(self, kind: str) -> list[int]:
        """The sizes priced at the trace's own median (``kind``: ``"verify"`` or ``"draft"``)."""
        rounds = self.verify_rounds if kind == "verify" else self.draft_rounds
        return sorted(n for n, c in rounds.items() if c >= MIN_SIZE_ROUNDS)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: the fields (``verify_ms`` / ``draft_ms``: the trace's medians, also of sizes with too few
        rounds to be used) and ``priced``: what the what-if uses, ``verify_ms`` for n = 1..N_MAX + 1,
        ``draft_ms`` for k = 1..N_MAX, ``own_verify`` / ``own_draft`` the sizes priced at their own median, ``source_verify`` /
        ``source_draft`` each size's source (``own`` / ``probe`` / ``line``, :meth:`SizeCosts.source`)."""
        d = {k: v for k, v in asdict(self).items() if k not in ("sizes", "probe")}
        for k in ("verify_ms", "verify_rounds", "draft_ms", "draft_rounds"):
            d[k] = {str(n): v for n, v in getattr(self, k).items()}
        d["probe"] = None if self.probe is None else self.probe.to_dict()
        d["priced"] = {"verify_ms": {str(n): v for n, v in self.priced_verify().items()},
                       "draft_ms": {str(k): v for k, v in self.priced_draft().items()},
                       "own_verify": self.own("verify"), "own_draft": self.own("draft")}
        if self.sizes is not None:
            d["priced"]["source_verify"] = {str(n): self.sizes.source("verify", n) for n in range(1, N_MAX + 2)}
            d["priced"]["source_draft"] = {str(k): self.sizes.source("draft", k) for k in range(1, N_MAX + 1)}
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


def size_sums(rounds: pd.DataFrame, units: np.ndarray | None = None, n_units: int = 1
              ) -> dict[str, np.ndarray] | None:
    """Per-unit sums (the what-if's counts) (``float[n_units]`` each; ``units`` maps each round to its unit,
    None: one unit): ``tv<n>`` / ``cnt<n>`` (verify ms and rounds of size ``n = n_draft + 1``), ``td<k>`` (draft
    ms of rounds drafting ``k``, whose count is ``cnt<k+1>``), ``time`` (draft + verify ms).
    None without timings. Columns ``n_draft``, ``t_draft_ms``, ``t_verify_ms``; a round with either time
    missing counts towards no size."""
    if "t_draft_ms" not in rounds.columns or "t_verify_ms" not in rounds.columns:
        return None
    u = np.zeros(len(rounds), np.int64) if units is None else units
    nd = rounds["n_draft"].to_numpy(dtype=np.int64)
    td = pd.to_numeric(rounds["t_draft_ms"], errors="coerce").to_numpy(dtype=np.float64)
    tv = pd.to_numeric(rounds["t_verify_ms"], errors="coerce").to_numpy(dtype=np.float64)
    ok = np.isfinite(td) & np.isfinite(tv)
    td0, tv0 = np.where(np.isfinite(td), td, 0.0), np.where(np.isfinite(tv), tv, 0.0)
    out = {"time": np.bincount(u, td0 + tv0, n_units)}
    for k in np.unique(nd):
        m = ok & (nd == k)
        out[f"tv{k + 1}"] = np.bincount(u, np.where(m, tv0, 0.0), n_units)
        out[f"cnt{k + 1}"] = np.bincount(u, m.astype(float), n_units)
        if k > 0:
            out[f"td{k}"] = np.bincount(u, np.where(m, td0, 0.0), n_units)
    return out


def round_arrays(rounds: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(n_draft int[R], t_draft_ms float[R], t_verify_ms float[R])`` of the rounds (NaN where a time is
    missing), None without the timing columns."""
    if "t_draft_ms" not in rounds.columns or "t_verify_ms" not in rounds.columns:
        return None
    return (rounds["n_draft"].to_numpy(dtype=np.int64),
            pd.to_numeric(rounds["t_draft_ms"], errors="coerce").to_numpy(dtype=np.float64),
            pd.to_numeric(rounds["t_verify_ms"], errors="coerce").to_numpy(dtype=np.float64))


def fit_cost(rounds: pd.DataFrame, baseline: PlainBaseline | None = None, probe: CostProbe | None = None
             ) -> CostModel | None:
    """The cost model from ``n_draft``, ``t_draft_ms``, ``t_verify_ms`` of the rounds and the recorder's
    ``probe`` (module docstring; the point values of :class:`SizeCosts`, the one pricing rule); None without
    timings or without a drafting round."""
    if not len(rounds):
        return None
    arr = round_arrays(rounds)
    if arr is None:
        return None
    measured_ms = baseline.t_per_token_ms if baseline is not None and baseline.measured else None
    measured = measured_ms is not None
    sc = SizeCosts.from_rounds(*arr, probe=probe, plain=np.array([measured_ms]) if measured else None)
    sizes = sorted(n for n, c in sc.count_v.items() if c[0] > 0)
    drafted = sum(float(sc.count_v[n][0]) * (n - 1) for n in sizes)
    if drafted <= 0:
        return None
    verify = {n: float(sc.med_v[n][0]) for n in sizes}
    counts = {n: int(sc.count_v[n][0]) for n in sizes}
    draft = {n - 1: float(sc.med_d[n - 1][0]) for n in sizes if n > 1}
    dcounts = {n - 1: counts[n] for n in sizes if n > 1}
    t_step = sum(draft[k] * dcounts[k] for k in draft) / drafted
    how = (f"recorded sizes (at least {MIN_SIZE_ROUNDS} rounds) at their median; "
           + ("others from the recorder's probe of every size, scaled to this trace" if probe is not None
              else "others on lines through the recorded medians" + (" and the measured plain decoding" if measured else "")))
    t_plain = measured_ms if measured_ms is not None else float(sc.verify(1)[0])
    return CostModel(t_step_ms=float(t_step), verify_ms=verify, verify_rounds=counts, v0_ms=float(sc.v_line[0][0]),
                     v1_ms=float(sc.v_line[1][0]), t_plain_ms=float(t_plain),
                     baseline="measured" if measured else "estimated", basis=how, draft_ms=draft, draft_rounds=dcounts,
                     d0_ms=float(sc.d_line[0][0]), d1_ms=float(sc.d_line[1][0]), probe=probe,
                     verify_scale=None if sc.v_scale is None else float(sc.v_scale[0]),
                     draft_scale=None if sc.d_scale is None else float(sc.d_scale[0]), sizes=sc)
