"""What to do: plain decoding or which n_draft, how sure, and where MTP would start to pay. Pure; one job.

The one recommendation behind ``mtpscope explain`` / ``report`` (text and ``--json``), the app's Explain
and Sweep pages, and ``mtpscope diagnose``: :func:`advise` turns a trace's what-if
(:mod:`traces.analysis.what_if`) into an :class:`Advice`; :func:`advise_candidates` does it for
measured options (a sweep's cells, :mod:`traces.sweep.advice`). Rules (docs/EXPLAIN.md §4):

* **Plain decoding is always a candidate**, at speedup 1 (its interval, when plain decoding was
  measured per prompt, is folded into every speedup's interval: paired resamples).
* The question first: plain decoding or the best n_draft (the highest speedup). Answered only when the
  best n_draft's 95 % speedup interval excludes 1 (the speedup folds in the trace's, the probe's and the
  baseline's timing spread); otherwise it is **a tie between** the two, both named (the choice is the
  higher point value). When MTP wins clearly, a runner-up n_draft whose interval overlaps the best's is
  also a tie, both named.
* When ``timing_quality`` (:mod:`traces.analysis.timing_quality`) finds the load changed during the
  recording there is no choice: "cannot tell from these timings", with the evidence.
* Below ``MIN_FIRST_DRAFTS`` first drafts (= rounds that drafted) in a group, or without timings, there
  is no choice: "too few rounds to tell".
* The speedup is **estimated** when plain decoding was not measured (``PlainBaseline.source ==
  "estimated"``): the reason says so and how.

**Break-even** (:func:`break_even`), from the costs and the mean acceptance length ``tau(N)``
(estimated, or measured per n_draft): with ``c = t_step / t_plain`` (a draft step in plain decodes; from a
trace's what-if ``c(N) = t_draft(N) / (N t_plain)``, its price of a round's N drafter steps) and
``rho(N) = t_verify(N + 1) / t_plain``, a round of N drafts costs ``N c + rho(N)`` plain decodes and
emits ``tau(N)`` tokens, so MTP pays when ``tau(N) > N c + rho(N)``:

    draft cost ratio needed      c*(N)   = (tau(N) - rho(N)) / N
    mean acceptance length needed tau*(N) = N c + rho(N)
    acceptance rate needed        alpha*: (1 - alpha^(N+1)) / (1 - alpha) = tau*(N)   (i.i.d. positions)
    with a flat verify (rho = 1: verifying N + 1 tokens costs one decode, the memory-bound GPU case)
                                  c*_flat(N) = (tau(N) - 1) / N

reported at the n_draft with the largest ``c*`` (where MTP is closest to paying), and per n_draft.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from mtpscope.traces.analysis.costs import PlainBaseline
from mtpscope.traces.analysis.timing_quality import TimingQuality

#: fewer first drafts (rounds that drafted) than this in a group: "too few rounds to tell"
MIN_FIRST_DRAFTS = 30
PLAIN = "plain"


@dataclass(frozen=True)
class Candidate:
    """One option.

    Attributes:
        choice: ``"plain"`` or an n_draft. assistant: the drafter (sweeps with several), else None.
        tokens_per_s / speedup: point values (speedup over plain decoding; 1 for plain decoding).
        tokens_per_s_interval / speedup_interval: 95 % intervals or None.
        measured: recorded (a sweep cell, the trace's own n_draft) rather than estimated.
        extrapolated: a what-if's n_draft past the recorded one (its acceptance extrapolated): labelled so.
    """

    choice: str | int
    tokens_per_s: float | None
    speedup: float | None
    tokens_per_s_interval: tuple[float, float] | None = None
    speedup_interval: tuple[float, float] | None = None
    measured: bool = False
    assistant: str | None = None
    extrapolated: bool = False

    def label(self) -> str:
        """``plain decoding``, ``n_draft 3``, ``q8 n_draft 3`` or ``n_draft 6 (extrapolated)``."""
        if self.choice == PLAIN:
            return "plain decoding"
        name = f"{self.assistant} n_draft {self.choice}" if self.assistant else f"n_draft {self.choice}"
        return f"{name} (extrapolated)" if self.extrapolated else name

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("tokens_per_s_interval", "speedup_interval"):
            if d[k] is not None:
                d[k] = [float(x) for x in d[k]]
        return d


@dataclass(frozen=True)
class Recommendation:
    """What to run, for one group (all prompts or one category).

    Attributes:
        choice: ``"plain"``, an n_draft, or None ("too few rounds to tell").
        assistant: the drafter of the choice (sweeps with several assistants), else None.
        speedup / interval: the choice's speedup over plain decoding and its 95 % interval.
        tie: plain decoding vs the best n_draft is not settled (its interval reaches 1), or the runner-up
            n_draft's interval overlaps the best's.
        runner_up: the second-best candidate's choice (None without one).
        reason: one sentence, the numbers included (and how plain decoding was estimated).
        headline: the reason's short form (``n_draft 2 at 1.16× [0.82, 1.64], a tie between n_draft 2 and plain
            decoding``).
        estimated: plain decoding was not measured (the speedup is an estimate; the reason says how).
        cannot_tell: the timings were disturbed (``timing_quality``): no choice, the reason says why.
    """

    choice: str | int | None
    speedup: float | None
    interval: tuple[float, float] | None
    tie: bool
    reason: str
    runner_up: str | int | None = None
    assistant: str | None = None
    estimated: bool = False
    headline: str = ""
    cannot_tell: bool = False

    def to_dict(self) -> dict[str, Any]:
        """``{choice, speedup: {value, interval, estimated}, tie, reason, headline, runner_up, cannot_tell[,
        assistant]}``."""
        d: dict[str, Any] = {"choice": self.choice,
                             "speedup": {"value": self.speedup,
                                         "interval": None if self.interval is None else [float(x) for x in self.interval],
                                         "estimated": self.estimated},
                             "tie": self.tie, "reason": self.reason, "headline": self.headline or self.reason,
                             "runner_up": self.runner_up, "cannot_tell": self.cannot_tell}
        if self.assistant is not None:
            d["assistant"] = self.assistant
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Recommendation:
        """The recommendation back from :meth:`to_dict`'s JSON (``diagnosis.json``'s summary)."""
        sp, iv = d["speedup"], d["speedup"]["interval"]
        return cls(choice=d["choice"], speedup=sp["value"], interval=None if iv is None else (float(iv[0]), float(iv[1])),
                   tie=d["tie"], reason=d["reason"], runner_up=d["runner_up"], assistant=d.get("assistant"),
                   estimated=sp["estimated"], headline=d["headline"], cannot_tell=d["cannot_tell"])


@dataclass(frozen=True)
class BreakEvenRow:
    """The break-even at one n_draft (module docstring; every ratio in plain decodes).

    Attributes:
        n_draft: drafts per round. mean_acceptance_length: ``tau(N)``.
        verify_cost_ratio: ``rho(N) = t_verify(N + 1) / t_plain``.
        other_cost_ratio: a round's cost besides its drafts (``r(N) - N c`` from the what-if's speedup, else rho).
        draft_cost_ratio_needed: ``c*(N)``. mean_acceptance_length_needed: ``tau*(N)``.
        acceptance_rate_needed: ``alpha*`` (None: out of reach). flat_verify_draft_cost_ratio_needed: ``c*_flat(N)``.
        speedup: ``tau / tau*`` (None when ``tau*`` is not positive).
        extrapolated: neither recorded nor probed.
    """

    n_draft: int
    mean_acceptance_length: float
    verify_cost_ratio: float
    other_cost_ratio: float
    draft_cost_ratio_needed: float
    mean_acceptance_length_needed: float
    acceptance_rate_needed: float | None
    flat_verify_draft_cost_ratio_needed: float
    speedup: float | None
    extrapolated: bool

    def to_dict(self) -> dict[str, Any]:
        """The fields, in order (docs/EXPLAIN.md ``break_even.per_n_draft``)."""
        return asdict(self)


@dataclass(frozen=True)
class BreakEven:
    """Where MTP starts to pay, for one group (module docstring).

    Attributes:
        n_draft: the n_draft closest to paying (largest ``draft_cost_ratio_needed``).
        draft_cost_ratio: a draft step in plain decodes at that n_draft (``t_step / t_plain``, or ``t_draft(N)
            / (N t_plain)`` from a what-if).
        verify_cost_ratio: ``t_verify(n_draft + 1) / t_plain``.
        mean_acceptance_length: ``tau`` at that n_draft (estimated or measured).
        draft_cost_ratio_needed: ``c*``: a draft step must cost less than this many plain decodes.
        mean_acceptance_length_needed: ``tau*`` at the measured costs.
        acceptance_rate_needed: ``alpha*`` (None when ``tau*`` exceeds n_draft + 1: it cannot pay there).
        flat_verify_draft_cost_ratio_needed: ``c*`` if verifying cost one decode whatever its size.
        pays: MTP pays at that n_draft with these costs.
        estimated: plain decoding was not measured.
        per_n_draft: every n_draft's values (:class:`BreakEvenRow`).
        words: one sentence.
    """

    n_draft: int
    draft_cost_ratio: float
    verify_cost_ratio: float
    mean_acceptance_length: float
    draft_cost_ratio_needed: float
    mean_acceptance_length_needed: float
    acceptance_rate_needed: float | None
    flat_verify_draft_cost_ratio_needed: float
    pays: bool
    estimated: bool
    per_n_draft: tuple[BreakEvenRow, ...]
    words: str

    def to_dict(self) -> dict[str, Any]:
        """The fields, ``per_n_draft`` as a list of :meth:`BreakEvenRow.to_dict`."""
        d = asdict(self)
        d["per_n_draft"] = [x.to_dict() for x in self.per_n_draft]
        return d


@dataclass(frozen=True)
class Advice:
    """The recommendation and break-even of a trace or a sweep, overall and per category.

    Attributes:
        recommendation / by_category: :class:`Recommendation` overall and per prompt category.
        break_even / break_even_by_category: :class:`BreakEven` (None without timings).
        candidates / candidates_by_category: every option weighed (plain decoding first).
        baseline: how plain decoding was known (:class:`traces.analysis.costs.PlainBaseline`), or None.
        timing_quality: the trace's :class:`traces.analysis.timing_quality.TimingQuality`, or None (a sweep).
    """

    recommendation: Recommendation
    by_category: dict[str, Recommendation] = field(default_factory=dict)
    break_even: BreakEven | None = None
    break_even_by_category: dict[str, BreakEven] = field(default_factory=dict)
    candidates: tuple[Candidate, ...] = ()
    candidates_by_category: dict[str, tuple[Candidate, ...]] = field(default_factory=dict)
    baseline: PlainBaseline | None = None
    timing_quality: TimingQuality | None = None

    @staticmethod
    def null_dict() -> dict[str, Any]:
        """:meth:`to_dict`'s keys, each None: the JSON where there is no advice (nothing drafted)."""
        return {"recommendation": None, "break_even": None, "candidates": None, "baseline": None,
                "timing_quality": None}

    def to_dict(self) -> dict[str, Any]:
        """The JSON keys ``recommendation`` (overall, with ``by_category``), ``break_even`` (overall, with
        ``by_category``; null without timings), ``candidates`` (with ``by_category``), ``baseline`` and
        ``timing_quality`` (:class:`traces.analysis.timing_quality.TimingQuality`'s dict, or null)."""
        rec = self.recommendation.to_dict()
        rec["by_category"] = {c: r.to_dict() for c, r in self.by_category.items()}
        be = None
        if self.break_even is not None:
            be = self.break_even.to_dict()
            be["by_category"] = {c: b.to_dict() for c, b in self.break_even_by_category.items()}
        return {"recommendation": rec, "break_even": be,
                "candidates": {"all": [c.to_dict() for c in self.candidates],
                               "by_category": {k: [c.to_dict() for c in v]
                                               for k, v in self.candidates_by_category.items()}},
                "baseline": None if self.baseline is None else self.baseline.to_dict(),
                "timing_quality": None if self.timing_quality is None else self.timing_quality.to_dict()}


def _overlap(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


def _speedup(c: Candidate) -> float:
    """A scored candidate's speedup (``recommend`` scores only candidates that have one)."""
    if c.speedup is None:
        raise ValueError(f"{c.label()} has no speedup")
    return c.speedup


def _fmt_iv(iv: tuple[float, float] | None) -> str:
    return f" [{iv[0]:.2f}, {iv[1]:.2f}]" if iv is not None else ""


def recommend(candidates: Sequence[Candidate], *, n_first_drafts: int | None = None,
              estimated: bool = False, estimate_how: str = "", min_first_drafts: int = MIN_FIRST_DRAFTS) -> Recommendation:
    """The recommendation among ``candidates`` (plain decoding included; module docstring).

    Args:
        candidates: every option with its speedup (plain decoding's is 1).
        n_first_drafts: first drafts the numbers rest on (rounds that drafted); below ``min_first_drafts``:
            no choice. None: not checked.
        estimated / estimate_how: plain decoding was not measured, and how it was estimated (words).
    """
    if n_first_drafts is not None and n_first_drafts < min_first_drafts:
        why = (f"too few rounds to tell: {n_first_drafts} first drafts (at least {min_first_drafts} needed for a "
               "recommendation; record more or longer prompts)")
        return Recommendation(None, None, None, False, why, estimated=estimated,
                              headline=f"too few rounds to tell ({n_first_drafts} first drafts)")
    scored = [c for c in candidates if c.speedup is not None and math.isfinite(c.speedup)]
    mtp = [c for c in scored if c.choice != PLAIN]
    if not mtp:
        return Recommendation(None, None, None, False, "too few rounds to tell: no timed rounds to compare speeds",
                              estimated=estimated, headline="too few rounds to tell (no timings)")
    plain = next((c for c in scored if c.choice == PLAIN), Candidate(PLAIN, None, 1.0, None, (1.0, 1.0), True))
    est = (f" (speedup estimated: {estimate_how})" if estimate_how else " (speedup estimated)") if estimated else ""
    best_mtp = max(mtp, key=lambda c: (c.speedup, -(c.choice if isinstance(c.choice, int) else 0)))
    iv = best_mtp.speedup_interval
    # THE question: plain decoding or the best n_draft; answered only when the interval excludes 1
    plain_tie = iv is not None and iv[0] <= 1.0 <= iv[1]
    if _speedup(best_mtp) <= 1.0:
        n = len(mtp)
        every = f"at every n_draft ({n} tried)" if n > 1 else "at the one n_draft tried"
        reason = (f"plain decoding is faster here {every}: best {best_mtp.speedup:.2f}×{_fmt_iv(iv)} "
                  f"with {best_mtp.label()}")
        head = f"plain decoding (best MTP: {best_mtp.label()} at {best_mtp.speedup:.2f}×{_fmt_iv(iv)})"
        if plain_tie:
            reason += f"; a tie between plain decoding and {best_mtp.label()}: its interval reaches 1×"
            head += f", a tie between plain decoding and {best_mtp.label()}"
        return Recommendation(PLAIN, 1.0, (1.0, 1.0) if plain.speedup_interval is None else plain.speedup_interval,
                              plain_tie, reason + est, best_mtp.choice, None, estimated, head)
    others = sorted((c for c in mtp if c is not best_mtp), key=lambda c: -_speedup(c))
    second = others[0] if others else None
    reason = f"{best_mtp.label()}: {best_mtp.speedup:.2f}×{_fmt_iv(iv)} plain decoding's speed"
    head = f"{best_mtp.label()} at {best_mtp.speedup:.2f}×{_fmt_iv(iv)}"
    if plain_tie:
        reason += f"; a tie between {best_mtp.label()} and plain decoding: its interval reaches 1×"
        head += f", a tie between {best_mtp.label()} and plain decoding"
        return Recommendation(best_mtp.choice, best_mtp.speedup, iv, True, reason + est, PLAIN, best_mtp.assistant,
                              estimated, head)
    tie = second is not None and _overlap(iv, second.speedup_interval)
    if second is not None:
        if tie:
            reason += (f"; a tie between {best_mtp.label()} and {second.label()} "
                       f"({second.speedup:.2f}×{_fmt_iv(second.speedup_interval)}): the intervals overlap")
            head += f", a tie between {best_mtp.label()} and {second.label()}"
        else:
            reason += f"; next {second.label()} at {second.speedup:.2f}×"
    return Recommendation(best_mtp.choice, best_mtp.speedup, iv, tie, reason + est,
                          PLAIN if second is None else second.choice, best_mtp.assistant, estimated, head)


def _alpha_for(tau: float, n: int) -> float | None:
    """The per-position acceptance ``alpha`` with ``(1 - alpha^(n+1)) / (1 - alpha) = tau`` (bisection),
    None when ``tau > n + 1`` (more than every draft accepted)."""
    if tau > n + 1 + 1e-12:
        return None
    if tau <= 1.0:
        return 0.0

    def f(a: float) -> float:
        return sum(a ** i for i in range(n + 1)) - tau

    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


def break_even(tau: Mapping[int, float], t_step_ms: float, t_verify_ms: Callable[[int], float], t_plain_ms: float,
               *, estimated: bool = False, t_draft_ms: Callable[[int], float] | None = None,
               speedup: Mapping[int, float | None] | None = None, grounded: Collection[int] | None = None
               ) -> BreakEven | None:
    """:class:`BreakEven` from the mean acceptance length per n_draft (``tau``), the draft-step cost, the
    verify cost of ``n`` tokens and plain decoding's ms per token (module docstring). ``t_draft_ms``: a
    round's ``N`` drafter steps in ms (the what-if's pricing, :class:`traces.analysis.costs.CostModel`):
    then ``c(N) = t_draft(N) / (N t_plain)`` per n_draft, else ``t_step / t_plain`` at every N.

    ``speedup``: the what-if's speedup per n_draft (THE number the recommendation uses). Then a round's
    whole cost in plain decodes is the one that speedup implies, ``r(N) = tau(N) / speedup(N)`` (verify,
    plain tail steps and the calibration to the trace included), split into its drafts ``N c`` and the rest
    ``r(N) - N c``; ``c* = (tau - (r - N c)) / N``, ``tau* = r``, so the row's speedup ``tau / tau*`` is the
    what-if's exactly and "pays" is "speedup > 1" (issue 34: the two numbers could disagree).
    ``grounded``: the n_draft values recorded or probed; the break-even is reported at one of them (rows
    outside it are labelled ``extrapolated``; with none grounded, the words say extrapolated). None when
    nothing is known (no n_draft, no positive plain cost)."""
    if not tau or not (t_plain_ms and t_plain_ms > 0 and math.isfinite(t_plain_ms)):
        return None
    rows = []
    cs: dict[int, float] = {}
    for n, tn in sorted(tau.items()):
        if tn is None or not math.isfinite(tn):
            continue
        c = cs[n] = (t_draft_ms(n) / n if t_draft_ms is not None else t_step_ms) / t_plain_ms
        rho = t_verify_ms(n + 1) / t_plain_ms
        sp = None if speedup is None else speedup.get(n)
        rest = (tn / sp - n * c) if sp is not None and math.isfinite(sp) and sp > 0 else rho
        need_c = (tn - rest) / n
        need_tau = n * c + rest
        rows.append(BreakEvenRow(
            n_draft=int(n), mean_acceptance_length=float(tn), verify_cost_ratio=float(rho), other_cost_ratio=float(rest),
            draft_cost_ratio_needed=float(need_c), mean_acceptance_length_needed=float(need_tau),
            acceptance_rate_needed=_alpha_for(need_tau, n), flat_verify_draft_cost_ratio_needed=float((tn - 1.0) / n),
            speedup=float(tn / need_tau) if need_tau > 0 else None,
            extrapolated=grounded is not None and n not in grounded))
    if not rows:
        return None
    pool = [r for r in rows if not r.extrapolated] or rows
    best = max(pool, key=lambda r: (r.draft_cost_ratio_needed, -r.n_draft))
    n = best.n_draft
    c = cs[n]
    pays = c < best.draft_cost_ratio_needed
    alpha = best.acceptance_rate_needed
    need = (f"a mean acceptance length of {best.mean_acceptance_length_needed:.2f} "
            + (f"(acceptance rate {alpha:.2f} at every position)" if alpha is not None
               else f"(out of reach: a round of {n} drafts emits at most {n + 1} tokens)"))
    flat = best.flat_verify_draft_cost_ratio_needed
    if pays:
        words = (f"MTP pays here: at n_draft {n} a draft step costs {c:.2f} of a plain decode, under the "
                 f"{best.draft_cost_ratio_needed:.2f} at which it stops paying (mean acceptance length "
                 f"{best.mean_acceptance_length:.2f}, {best.mean_acceptance_length_needed:.2f} needed)")
    elif best.draft_cost_ratio_needed > 0:
        words = (f"MTP would pay here at n_draft {n} if a draft step cost less than "
                 f"{best.draft_cost_ratio_needed:.2f} of a plain decode (it costs {c:.2f}; the rest of a round, its "
                 f"verify of {n + 1} tokens included, {best.other_cost_ratio:.2f} decodes), or with {need} instead of "
                 f"{best.mean_acceptance_length:.2f}")
    else:   # (the rest of a round, r - N c, is what c* and tau* are worked from: verify alone may be cheaper)
        words = (f"MTP cannot pay here at these costs: the rest of a round besides its drafts (its verify of {n + 1} "
                 f"tokens included) costs {best.other_cost_ratio:.2f} plain decodes, at least the "
                 f"{best.mean_acceptance_length:.2f} tokens a round emits at n_draft {n}; it would need {need}")
    if flat > 0:
        words += (f"; where verifying costs one decode whatever the size (a GPU), a draft step under {flat:.2f} of a "
                  "decode pays")
    if best.extrapolated:
        words += f" (n_draft {n} was neither recorded nor probed: extrapolated)"
    if estimated:
        words += " (plain decoding estimated, not measured)"
    return BreakEven(n_draft=n, draft_cost_ratio=float(c), verify_cost_ratio=best.verify_cost_ratio,
                     mean_acceptance_length=best.mean_acceptance_length,
                     draft_cost_ratio_needed=best.draft_cost_ratio_needed,
                     mean_acceptance_length_needed=best.mean_acceptance_length_needed,
                     acceptance_rate_needed=alpha, flat_verify_draft_cost_ratio_needed=flat, pays=bool(pays),
                     estimated=estimated, per_n_draft=tuple(rows), words=words)


def _estimate_how(baseline: Any, t_plain_ms: float | None) -> str:
    if baseline is not None and getattr(baseline, "measured", False):
        return ""
    ms = f"{t_plain_ms:.2f} ms" if t_plain_ms is not None else "unknown"
    return (f"no plain decoding was measured (record --baseline, sweep --baseline); its time per token taken as the "
            f"cost of verifying one token as the what-if prices it (docs/EXPLAIN.md §4), {ms}")


def _what_if_candidates(w: Any) -> tuple[Candidate, ...]:
    plain_iv = None
    s = w.samples.get("plain_tokens_per_s") if w.samples else None
    plain_tps = None
    if s is not None and len(s):
        plain_tps = float(s[0])
        if len(s) > 2 and np.isfinite(s[1:]).all() and np.ptp(s[1:]) > 0:
            lo, hi = np.quantile(s[1:], (0.025, 0.975))
            plain_iv = (float(lo), float(hi))
    out = [Candidate(PLAIN, plain_tps, 1.0, plain_iv, (1.0, 1.0), measured=bool(w.baseline is not None
                                                                           and w.baseline.measured))]
    for r in w.rows:
        out.append(Candidate(r.n_draft, r.tokens_per_s, r.speedup, r.tokens_per_s_interval, r.speedup_interval,
                             measured=r.recorded, extrapolated=bool(r.extrapolated)))
    return tuple(out)


def grounded_n_drafts(w: Any) -> set[int]:
    """The n_draft values of a what-if that were recorded or probed: ``N <= K`` (acceptance not extrapolated)
    whose round (``N`` drafter steps, a verify of ``N + 1``) is priced from the trace's own rounds or the probe,
    not from a line (:meth:`traces.analysis.costs.SizeCosts.source`)."""
    cost = w.cost
    out = set()
    for r in w.rows:
        if r.extrapolated:
            continue
        sz = None if cost is None else cost.sizes
        if sz is None or (sz.source("verify", r.n_draft + 1) != "line" and sz.source("draft", r.n_draft) != "line"):
            out.add(r.n_draft)
    return out


def cannot_tell(quality: Any, estimated: bool = False) -> Recommendation:
    """The recommendation when ``quality`` (:class:`traces.analysis.timing_quality.TimingQuality`) says the
    timings were disturbed: no choice, "cannot tell from these timings", with the evidence."""
    return Recommendation(None, None, None, False, f"cannot tell from these timings: {quality.words}; re-record on a "
                          "quiet machine, or compare n_draft values by an interleaved sweep (docs/SWEEP.md)",
                          estimated=estimated, headline="cannot tell from these timings (the load changed)",
                          cannot_tell=True)


def advise(w: Any, quality: Any = None) -> Advice:
    """The :class:`Advice` of a trace's what-if (:class:`traces.analysis.what_if.WhatIf`): candidates plain
    decoding and n_draft 1..n_max, overall and per category; break-even from its cost model, estimated
    mean acceptance lengths and the what-if's own speedups (one number: ``break_even(speedup=...)``), at
    the n_draft values recorded or probed (:func:`grounded_n_drafts`). ``quality``: the trace's
    :class:`traces.analysis.timing_quality.TimingQuality`; when disturbed, every recommendation is
    :func:`cannot_tell` and there is no break-even."""
    cost = w.cost
    estimated = cost is None or cost.baseline != "measured"
    how = _estimate_how(w.baseline, None if cost is None else cost.t_plain_ms)
    disturbed = quality is not None and quality.disturbed
    grounded = grounded_n_drafts(w)

    def one(x: Any) -> tuple[Recommendation, BreakEven | None, tuple[Candidate, ...]]:
        cands = _what_if_candidates(x)
        rec = recommend(cands, n_first_drafts=x.n_verify_rounds, estimated=estimated, estimate_how=how)
        if disturbed and rec.choice is not None:
            rec = cannot_tell(quality, estimated)
        be = None
        if cost is not None and rec.choice is not None:   # too few rounds to tell: no break-even either
            tau = {r.n_draft: r.mean_acceptance_length for r in x.rows if r.mean_acceptance_length is not None}
            t_plain = x.baseline.t_per_token_ms if (x.baseline is not None and x.baseline.measured) else cost.t_plain_ms
            be = break_even(tau, cost.t_step_ms, cost.t_verify, t_plain, estimated=estimated, t_draft_ms=cost.t_draft,
                            speedup={r.n_draft: r.speedup for r in x.rows}, grounded=grounded)
        return rec, be, cands

    rec, be, cands = one(w)
    by, beby, cby = {}, {}, {}
    for name, x in w.by_category.items():
        by[name], b, cby[name] = one(x)
        if b is not None:
            beby[name] = b
    return Advice(rec, by, be, beby, cands, cby, w.baseline, quality)


def advise_candidates(candidates: Sequence[Candidate], by_category: Mapping[str, Sequence[Candidate]], *,
                      n_first_drafts: int | None, n_first_drafts_by_category: Mapping[str, int] | None = None,
                      tau: Mapping[int, float] | None = None, tau_by_category: Mapping[str, Mapping[int, float]] | None = None,
                      t_step_ms: float | None = None, t_verify_ms: Callable[[int], float] | None = None,
                      t_plain_ms: float | None = None, baseline: Any = None) -> Advice:
    """The :class:`Advice` of measured options (a sweep's cells): the same rules as :func:`advise`; the
    break-even from the measured costs and mean acceptance lengths."""
    estimated = baseline is None or not getattr(baseline, "measured", False)
    how = _estimate_how(baseline, t_plain_ms)
    rec = recommend(candidates, n_first_drafts=n_first_drafts, estimated=estimated, estimate_how=how)
    nfd = n_first_drafts_by_category or {}
    by = {c: recommend(v, n_first_drafts=nfd.get(c), estimated=estimated, estimate_how=how)
          for c, v in by_category.items()}
    be, beby = None, {}
    if tau and t_step_ms is not None and t_verify_ms is not None and t_plain_ms:
        # where there are too few rounds to tell (no choice), there is no break-even either
        be = break_even(tau, t_step_ms, t_verify_ms, t_plain_ms, estimated=estimated) if rec.choice is not None else None
        for c, tc in (tau_by_category or {}).items():
            if c in by and by[c].choice is None:
                continue
            b = break_even(tc, t_step_ms, t_verify_ms, t_plain_ms, estimated=estimated)
            if b is not None:
                beby[c] = b
    return Advice(rec, by, be, beby, tuple(candidates), {c: tuple(v) for c, v in by_category.items()}, baseline)
