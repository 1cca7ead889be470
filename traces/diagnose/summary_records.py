"""The numbers of a diagnosis as records: the trace's (:class:`DiagnosisSummary`), the replay's
(:class:`VariantsSummary`, one :class:`VariantRow` per variant) and the reference's (:class:`ReferenceSummary`),
and :func:`jsonable`, the one rule that makes a value JSON-able (docs/DIAGNOSE.md, "JSON").

One job: these records and their JSON: ``to_dict()`` writes the keys in the order the steps write them (a
diagnosis' JSON is the same bytes as when they were plain mappings); ``from_dict`` rebuilds a record from such a
mapping, unchecked (:meth:`traces.diagnose.records.Diagnosis.from_dict` checks a document's keys first). Each value
is stored as its JSON has it, so that a fresh diagnosis and one read back from ``diagnosis.json`` hold the same
values.

Imports: mtpscope.errors; the records of the explain side a summary holds (traces.analysis.advice, .breakdown,
.explain, .records (``as_json``), .report_records, .what_if).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from mtpscope.errors import MtpscopeError
from mtpscope.traces.analysis.advice import Recommendation
from mtpscope.traces.analysis.breakdown import Acceptance, CategoryAcceptance
from mtpscope.traces.analysis.explain import TargetSide
from mtpscope.traces.analysis.records import as_json
from mtpscope.traces.analysis.report_records import PositionRow
from mtpscope.traces.analysis.what_if import WhatIfRow


def _rows(make: Callable[[Mapping[str, Any]], Any]) -> Callable[[Any], tuple[Any, ...]]:
    return lambda v: tuple(make(r) for r in v)


def _groups(make: Callable[[Mapping[str, Any]], Any]) -> Callable[[Any], dict[str, Any]]:
    return lambda v: {str(k): make(x) for k, x in v.items()}


#: How each nested summary key's JSON becomes its record (the records' own ``from_dict``); the other keys are
#: numbers (or, ``causes``, a mapping of counts) kept as they are.
NESTED: dict[str, Callable[[Any], Any]] = {
    "per_position": _rows(PositionRow.from_dict), "by_category": _groups(CategoryAcceptance.from_dict),
    "by_class": _groups(Acceptance.from_dict), "causes": lambda v: {str(k): x for k, x in v.items()},
    "target_side": TargetSide.from_dict, "what_if": _rows(WhatIfRow.from_dict),
    "recommendation": Recommendation.from_dict}


@dataclass(frozen=True)
class DiagnosisSummary:
    """The trace's numbers of a diagnosis (``summary`` in its JSON): the keys
    :func:`traces.diagnose.behaviour.summary` writes, in its order, and the trace's ``n_draft``, the nested ones as
    the explain side's records (``report_records.PositionRow`` per draft position, ``breakdown.CategoryAcceptance``
    per category, ``breakdown.Acceptance`` per token class, the first misses' causes, ``explain.TargetSide``,
    ``what_if.WhatIfRow`` per n_draft, ``advice.Recommendation``), each None when the trace lacks it. Built from a
    summary's mapping (:meth:`from_dict`), the values are those its JSON has (:func:`jsonable` first). A diagnosis
    without a trace has the empty summary (every field None: ``{}`` in JSON)."""

    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    n_prompts: int | None = None
    n_rounds: int | None = None
    n_drafted: int | None = None
    n_accepted: int | None = None
    per_position: tuple[PositionRow, ...] | None = None
    by_category: Mapping[str, CategoryAcceptance] | None = None
    by_class: Mapping[str, Acceptance] | None = None
    causes: Mapping[str, int] | None = None
    target_side: TargetSide | None = None
    what_if: tuple[WhatIfRow, ...] | None = None
    best_n_draft: int | None = None
    recommendation: Recommendation | None = None
    n_draft: int | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name not in NESTED:
                object.__setattr__(self, f.name, jsonable(getattr(self, f.name)))

    @property
    def empty(self) -> bool:
        """No trace's numbers (``{}`` in JSON)."""
        return all(getattr(self, f.name) is None for f in fields(self))

    def to_dict(self) -> dict[str, Any]:
        """``{}`` when :attr:`empty`, else every key in field order (the records as their ``to_dict()``)."""
        if self.empty:
            return {}
        return {f.name: jsonable(as_json(getattr(self, f.name))) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DiagnosisSummary:
        """The summary of ``d`` (:func:`traces.diagnose.behaviour.summary`'s dict, or :meth:`to_dict`'s), made
        JSON-able first, the nested keys as their records (:data:`NESTED`); keys it lacks are None. Unchecked:
        :meth:`Diagnosis.from_dict` checks a document's keys."""
        names = {f.name for f in fields(cls)}
        extra = sorted(set(d) - names)
        if extra:
            raise MtpscopeError("not a diagnosis summary", key=extra[0], expected=" | ".join(sorted(names)),
                                actual="an unknown key")
        j = jsonable(dict(d))
        return cls(**{k: NESTED[k](v) if k in NESTED and v is not None else v for k, v in j.items()})


@dataclass(frozen=True)
class VariantRow:
    """One replay variant's numbers (``variants.variants[name]`` in JSON): its options as text, the replayed
    acceptance rate, the agreement with the recorded drafts, its trace; against the baseline (every variant but
    ``baseline``, None there and left out of the JSON) the change in acceptance, its 95 % interval and whether it
    recovers acceptance."""

    options: str | None = None
    acceptance_rate: float | None = None
    agreement: float | None = None
    trace: str | None = None
    delta: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    recovers: bool | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, jsonable(getattr(self, f.name)))

    def to_dict(self) -> dict[str, Any]:
        """``{options, acceptance_rate, agreement, trace}``, with ``delta, ci_low, ci_high, recovers`` when compared
        with the baseline (``recovers`` not None)."""
        d = {"options": self.options, "acceptance_rate": self.acceptance_rate, "agreement": self.agreement,
             "trace": self.trace}
        if self.recovers is not None:
            d.update({"delta": self.delta, "ci_low": self.ci_low, "ci_high": self.ci_high, "recovers": self.recovers})
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> VariantRow:
        """The row of ``d``; keys it lacks are None."""
        return cls(**{f.name: d.get(f.name) for f in fields(cls)})


@dataclass(frozen=True)
class VariantsSummary:
    """The replay's numbers (``variants`` in JSON, :func:`traces.diagnose.variants.variant_findings`), in its
    order: rounds, steps and prompts replayed, the recorded drafts' numbers, each variant's :class:`VariantRow`
    (``baseline`` first), the baseline's agreement with the recorded drafts, its largest relative error of the next
    hidden state, its numerics (JSON-able), and its acceptance rate (left out of the JSON when None)."""

    n_rounds: int | None = None
    n_steps: int | None = None
    n_prompts: int | None = None
    recorded: dict[str, Any] | None = None
    variants: Mapping[str, VariantRow] = field(default_factory=dict)
    baseline_agreement: float | None = None
    baseline_h_next_rel_err_max: float | None = None
    baseline_numerics: dict[str, Any] | None = None
    baseline_acceptance_rate: float | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name != "variants":
                object.__setattr__(self, f.name, jsonable(getattr(self, f.name)))
        object.__setattr__(self, "variants", {str(k): v for k, v in self.variants.items()})

    def to_dict(self) -> dict[str, Any]:
        d = {"n_rounds": self.n_rounds, "n_steps": self.n_steps, "n_prompts": self.n_prompts,
             "recorded": jsonable(self.recorded), "variants": {k: v.to_dict() for k, v in self.variants.items()},
             "baseline_agreement": self.baseline_agreement,
             "baseline_h_next_rel_err_max": self.baseline_h_next_rel_err_max,
             "baseline_numerics": jsonable(self.baseline_numerics)}
        if self.baseline_acceptance_rate is not None:
            d["baseline_acceptance_rate"] = self.baseline_acceptance_rate
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> VariantsSummary:
        """The replay's numbers of ``d`` (``variant_findings``' dict, or :meth:`to_dict`'s); keys it lacks are
        None (no variants). Unchecked: :meth:`Diagnosis.from_dict` checks a document's keys."""
        kw = {f.name: d.get(f.name) for f in fields(cls) if f.name != "variants"}
        return cls(**kw, variants={str(k): VariantRow.from_dict(v) for k, v in (d.get("variants") or {}).items()})


@dataclass(frozen=True)
class ReferenceSummary:
    """The reference compared with (``reference`` in JSON): its ``kind`` (``hf`` / ``gguf``), its ``path``, and
    the comparison's other numbers (JSON-able, in their order: ``agreement``, ``first_difference``, ...)."""

    kind: str | None = None
    path: str | None = None
    numbers: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "numbers", jsonable(dict(self.numbers)))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, **jsonable(dict(self.numbers))}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReferenceSummary:
        """``{kind, path, ...}`` (``reference.py``'s numbers, or :meth:`to_dict`'s)."""
        return cls(d.get("kind"), d.get("path"), {k: v for k, v in d.items() if k not in ("kind", "path")})


def jsonable(v: Any) -> Any:
    """``v`` with numpy scalars and arrays as Python values and lists, tuples as lists, mapping keys as strings
    and non-finite floats as None."""
    if hasattr(v, "tolist") and not isinstance(v, (str, bytes)):
        v = v.tolist()
    if isinstance(v, Mapping):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


__all__ = ["DiagnosisSummary", "ReferenceSummary", "VariantRow", "VariantsSummary", "jsonable"]
