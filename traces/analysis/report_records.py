"""The typed results of :mod:`mtpscope.traces.analysis.metrics` (what reaches the app and the CLI):
:class:`Totals` (``metrics.totals``) and :class:`TraceReport` (``metrics.report``) with its parts
(:class:`PositionRow`, :class:`PromptRow`, :class:`MismatchRow`, :class:`Streaks` / :class:`StreakRow`,
:class:`RollingSummary` / :class:`RollingPoint`, :class:`Timing`, :class:`CentroidCoverage` /
:class:`CoverageRow`, :class:`RequestTotals` / :class:`CategoryRequests` / :class:`ServerPositionRow`).

Frozen dataclasses; ``to_dict()`` (:class:`mtpscope.traces.analysis.records.JsonRecord`) is their JSON, the
fields in declaration order: ``TraceReport(...).to_dict()`` is ``mtpscope report --json``'s body. The metrics'
definitions are metrics' module docstring's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mtpscope.traces.analysis.records import JsonRecord


@dataclass(frozen=True)
class Totals(JsonRecord):
    """``metrics.totals`` of some rounds. Rates are NaN where their denominator is zero.

    Attributes:
        n_rounds: all rounds; n_verify_rounds: rounds with ``n_draft > 0``; n_drafted / n_accepted: draft tokens;
        acceptance_rate: accepted / drafted (0..1); mean_acceptance_length: 1 + accepted / verify rounds (tokens).
    """

    n_rounds: int
    n_verify_rounds: int
    n_drafted: int
    n_accepted: int
    acceptance_rate: float
    mean_acceptance_length: float


@dataclass(frozen=True)
class PositionRow(JsonRecord):
    """One draft position k of ``metrics.per_position_acceptance`` (rates 0..1, None where undefined)."""

    k: int
    n_rounds: int
    n_accepted: int
    acceptance: float | None
    conditional: float | None
    per_verify_round: float | None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PositionRow:
        """The row back from its :meth:`to_dict` JSON (``diagnosis.json``'s summary)."""
        return cls(d["k"], d["n_rounds"], d["n_accepted"], d["acceptance"], d["conditional"], d["per_verify_round"])


@dataclass(frozen=True)
class PromptRow(JsonRecord):
    """One prompt of ``metrics.per_prompt`` with its manifest ``text`` ("" when unknown); rates None where undefined."""

    prompt_id: int
    text: str
    n_rounds: int
    n_drafted: int
    n_accepted: int
    acceptance_rate: float | None
    mean_acceptance_length: float | None


@dataclass(frozen=True)
class MismatchRow(JsonRecord):
    """``metrics.first_mismatch_histogram`` at position k: rounds whose first rejection was k, their ``share``
    (0..1)."""

    k: int
    n_rounds: int
    share: float | None


@dataclass(frozen=True)
class StreakRow(JsonRecord):
    """One zero-acceptance streak (``metrics.zero_acceptance_streaks``): rounds ``start_round..end_round``."""

    prompt_id: int
    start_round: int
    end_round: int
    length: int


@dataclass(frozen=True)
class Streaks(JsonRecord):
    """The zero-acceptance streaks of a trace: how many, the rounds in them, the longest, the ``top`` few."""

    n_streaks: int
    n_rounds_in_streaks: int
    longest: int
    top: tuple[StreakRow, ...] = ()


@dataclass(frozen=True)
class RollingPoint(JsonRecord):
    """One point of :class:`RollingSummary`'s series: the rolling acceptance rate (0..1) at a round."""

    prompt_id: int
    round: int
    acceptance_rate: float | None


@dataclass(frozen=True)
class RollingSummary(JsonRecord):
    """``metrics.rolling_summary``: quantiles (0..1) of the rolling acceptance rate over ``window`` rounds."""

    window: int
    by_prompt: bool
    full_windows: bool
    min: float
    p10: float
    median: float
    p90: float
    max: float
    series: tuple[RollingPoint, ...] = ()


@dataclass(frozen=True)
class Timing(JsonRecord):
    """``metrics.timing``: ``tokens_per_s`` (tokens/s), ``t_step_ms_mean`` (mean ms per draft step),
    ``t_verify_ms_mean_by_size`` (``{"n": mean ms}`` per verify size n), per-round means in ms; None where unknown.
    (Means: the what-if's ``CostModel`` prices each size at its median instead.)"""

    tokens_per_s: float | None
    t_step_ms_mean: float | None
    t_verify_ms_mean_by_size: Mapping[str, float]
    t_draft_ms_mean: float | None
    t_verify_ms_mean: float | None


@dataclass(frozen=True)
class CoverageRow(JsonRecord):
    """:class:`CentroidCoverage` at one draft position k (coverage 0..1, None where no step was checked)."""

    k: int
    n_steps: int
    n_covered: int
    coverage: float | None


@dataclass(frozen=True)
class CentroidCoverage(JsonRecord):
    """``metrics.centroid_coverage``: checked steps, those whose target token was a candidate, their share (0..1)."""

    n_steps: int
    n_covered: int
    coverage: float | None
    per_position: tuple[CoverageRow, ...] = ()


@dataclass(frozen=True)
class CategoryRequests(JsonRecord):
    """One category of :func:`mtpscope.traces.analysis.requests.by_category` (rates 0..1, tokens/s)."""

    category: str
    n_requests: int
    n_drafted: int
    n_accepted: int
    acceptance_rate: float | None
    n_drafts: int | None
    mean_acceptance_length: float | None
    tokens_per_s_mean: float | None
    tokens_per_s_pooled: float | None = None


@dataclass(frozen=True)
class ServerPositionRow(JsonRecord):
    """One draft position of :func:`mtpscope.traces.analysis.requests.per_position` (``rate`` 0..1)."""

    k: int
    n_accepted: int
    n_drafts: int
    rate: float | None


@dataclass(frozen=True)
class RequestTotals(JsonRecord):
    """``metrics.request_totals`` of a trace's llama-server request rows (rates 0..1, tokens/s; None where unknown).
    ``by_kind``: rows per kind; ``alarm``: the not-drafting alarm or None."""

    kind: str
    n_requests: int
    n_drafted: int
    n_accepted: int
    acceptance_rate: float | None
    by_kind: Mapping[str, int]
    n_drafts: int | None
    mean_acceptance_length: float | None
    tokens_per_s_mean: float | None
    alarm: str | None
    by_category: tuple[CategoryRequests, ...] = ()
    per_position: tuple[ServerPositionRow, ...] = ()
    tokens_per_s_pooled: float | None = None


@dataclass(frozen=True)
class TraceReport(JsonRecord):
    """``metrics.report`` of a trace: every acceptance metric, typed. Rates are 0..1, lengths in tokens, None where a
    denominator is zero (as ``report --json`` prints them). ``to_dict()`` is ``mtpscope report --json``'s body.

    Attributes:
        trace: the trace's path; source / complete: from its manifest; n_prompts: prompts in the manifest or seen;
        n_rounds .. mean_acceptance_length: ``metrics.totals`` (from the request rows for a trace without rounds);
        mean_acceptance_length_formula: what the mean acceptance length divides by, in words
        (``metrics.MAL_OVER_VERIFY_ROUNDS``, or ``metrics.MAL_OVER_DRAFTS`` from the request rows);
        per_position, prompts, first_mismatch, n_all_accepted, zero_acceptance_streaks: see their records;
        rolling, timing_ms, centroid_coverage, requests: None when the trace has no such data;
        warnings: the reader's warnings (skipped parts);
        n_rounds_recorded: the rounds the manifest counts when a rounds part was skipped and fewer were read
        (:meth:`traces.store.reader.Trace.rounds_not_read`), else None.
    """

    trace: str
    source: str | None
    complete: bool
    n_prompts: int
    n_rounds: int
    n_verify_rounds: int
    n_drafted: int
    n_accepted: int
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    mean_acceptance_length_formula: str
    per_position: tuple[PositionRow, ...]
    prompts: tuple[PromptRow, ...]
    first_mismatch: tuple[MismatchRow, ...]
    n_all_accepted: int
    zero_acceptance_streaks: Streaks
    rolling: RollingSummary | None
    timing_ms: Timing | None
    centroid_coverage: CentroidCoverage | None
    requests: RequestTotals | None
    n_rounds_recorded: int | None = None
    warnings: tuple[str, ...] = ()


__all__ = ["CategoryRequests", "CentroidCoverage", "CoverageRow", "MismatchRow", "PositionRow", "PromptRow",
           "RequestTotals", "RollingPoint", "RollingSummary", "ServerPositionRow", "StreakRow", "Streaks", "Timing",
           "Totals", "TraceReport"]
