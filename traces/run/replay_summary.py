"""The summary of a replay (:meth:`traces.run.replay.ReplayResult.summary`) as records: :class:`ReplaySummary`
(its ``to_dict()`` is ``summary.json`` and ``mtpscope replay --json``), the recorded run's :class:`ReplayRates`
and each variant's :class:`VariantSummary`; :meth:`ReplaySummary.from_dict` reads a ``summary.json`` back
(:func:`traces.run.replay_folder.read_replay`). One job; no llama.cpp, no numpy.

Imports: traces.analysis.records (the records' JSON).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mtpscope.traces.analysis.records import JsonRecord


@dataclass(frozen=True)
class ReplayRates(JsonRecord):
    """The recorded run's rates (:func:`traces.analysis.metrics.totals`' definitions).

    Attributes:
        acceptance_rate: accepted / drafted (0..1); None only in a summary read back without it.
        mean_acceptance_length: 1 + accepted / rounds that drafted (tokens); None as above.
    """

    acceptance_rate: float | None
    mean_acceptance_length: float | None


@dataclass(frozen=True)
class VariantSummary(JsonRecord):
    """One replayed variant.

    Attributes:
        options: its options that differ from the baseline's (``"-"``: none), as text.
        acceptance_rate: the would-be accepted / drafted (0..1); None only in a summary read back without it.
        mean_acceptance_length: the would-be 1 + accepted / rounds that drafted (tokens); None as above.
        agreement: share of the recorded draft steps whose recomputed draft equals the recorded one (0..1; NaN
            with no steps).
    """

    options: str
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    agreement: float | None


@dataclass(frozen=True)
class ReplaySummary(JsonRecord):
    """:meth:`traces.run.replay.ReplayResult.summary`; its ``to_dict()`` is ``summary.json`` and ``mtpscope replay --json``.

    Attributes:
        trace: the trace directory.
        n_rounds / n_steps: rounds and draft steps replayed.
        recorded: the recorded run's :class:`ReplayRates`.
        baseline: the baseline's options against the default :class:`inspector.reference.StepOptions`, as text.
        variants: ``{name: VariantSummary}`` in order (``"baseline"`` first).
        out: where the output folder went, if anywhere.
        notes: diagnostics (:attr:`traces.run.replay.ReplayResult.notes`).
        baseline_h_next_rel_err_max: the largest ``|h_next - recorded| / |recorded|`` of the baseline, or None.
        variant_traces: ``{name: trace folder}`` of the variants' traces.
        drafter_weights: the replayed drafter's quantization (:attr:`traces.run.replay.ReplayResult.drafter_weights`).
        indistinguishable: pairs of variants that draft the same token at every replayed step
            (:func:`traces.run.replay.indistinguishable`); None in a summary written before the key existed.
        numerics: :func:`traces.run.numerics.numerics_check` of the steps.
        model_mismatch: one line per model given to the replay that is not the file the trace was recorded with
            (its header's sha256 differs from the manifest's): every figure then describes another model (empty in a
            summary written before the key existed).
    """

    trace: str
    n_rounds: int
    n_steps: int
    recorded: ReplayRates
    baseline: str
    variants: dict[str, VariantSummary]
    out: str | None
    notes: tuple[str, ...]
    baseline_h_next_rel_err_max: float | None
    variant_traces: dict[str, str]
    drafter_weights: dict[str, Any]
    indistinguishable: tuple[tuple[str, str], ...] | None
    numerics: dict[str, Any]
    model_mismatch: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReplaySummary:
        """The summary of a ``summary.json`` (keys an older file lacks: empty, or None where that is the field's
        "unknown")."""
        rec = d.get("recorded") or {}
        ind = d.get("indistinguishable")
        return cls(trace=str(d.get("trace") or ""), n_rounds=int(d.get("n_rounds") or 0),
                   n_steps=int(d.get("n_steps") or 0),
                   recorded=ReplayRates(rec.get("acceptance_rate"), rec.get("mean_acceptance_length")),
                   baseline=str(d.get("baseline") or "-"),
                   variants={str(n): VariantSummary(str(v.get("options") or "-"), v.get("acceptance_rate"),
                                                    v.get("mean_acceptance_length"), v.get("agreement"))
                             for n, v in (d.get("variants") or {}).items()},
                   out=d.get("out"), notes=tuple(d.get("notes") or ()),
                   baseline_h_next_rel_err_max=d.get("baseline_h_next_rel_err_max"),
                   variant_traces=dict(d.get("variant_traces") or {}),
                   drafter_weights=dict(d.get("drafter_weights") or {}),
                   indistinguishable=None if ind is None else tuple((str(p[0]), str(p[1])) for p in ind),
                   numerics=dict(d.get("numerics") or {}),
                   model_mismatch=tuple(str(x) for x in d.get("model_mismatch") or ()))


__all__ = ["ReplayRates", "ReplaySummary", "VariantSummary"]
