"""What ``mtpscope diagnose`` reports: the documented causes, and the records of a finding and of a diagnosis.

One job: the records and their JSON form (docs/DIAGNOSE.md, "JSON"). The steps (:mod:`files`, :mod:`published`,
:mod:`behaviour`, :mod:`variants`, :mod:`reference`) build :class:`Finding` records; :mod:`rank` orders them;
:mod:`run` assembles the :class:`Diagnosis`.

A finding's ``link`` is data (:class:`ViewRef`: an app page and its parameters), never a URL: the library does
not know the app; the CLI and the app turn it into a link (``mtpscope.app.links.view_url``).

Imports: the standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Severities, worst first. ``error``: the drafter, the pair or the runtime is wrong (drafts change, or
#: nothing runs); ``warning``: a defect that costs speed or acceptance, or a value that contradicts the target whose
#: cost the sample does not show (docs/DIAGNOSE.md, "A key that differs from the target's"); ``info``: not a defect
#: (a note, what limits acceptance). A diagnosis with an error or a warning is a defect (exit code 1). A ``weights``
#: finding's severity follows one rule (:func:`mtpscope.traces.diagnose.reference.weights_severity`).
ERROR, WARNING, INFO = "error", "warning", "info"
SEVERITIES = (ERROR, WARNING, INFO)
DEFECT_SEVERITIES = (ERROR, WARNING)
#: Confidences, surest first: ``high`` (two independent steps agree, or one exact check), ``medium`` (one
#: measured step, its interval clear of no effect), ``low`` (a hint).
HIGH, MEDIUM, LOW = "high", "medium", "low"
CONFIDENCES = (HIGH, MEDIUM, LOW)
#: The steps that produce evidence, in the order ``diagnose`` runs them.
STEPS = ("verify", "published", "record", "explain", "replay", "reference", "advice")


@dataclass(frozen=True)
class Cause:
    """One documented cause (docs/DIAGNOSE.md, "Causes").

    Attributes:
        name: the stable id (``rope``).
        title: a few words (``RoPE``).
        what: one line: what is wrong when a finding has this cause.
    """

    name: str
    title: str
    what: str


#: Every cause a finding can have, in ranking order (a finding of an earlier cause ranks first among findings of
#: the same severity: a file the runtime refuses hides everything after it; a wrong key explains a replay that
#: disagrees; among notes, what limits acceptance comes before the quantization and n_draft notes). Stable ids:
#: tests, the app and the JSON key on them.
CAUSES: dict[str, Cause] = {c.name: c for c in (
    Cause("runtime_refuses", "runtime refuses",
          "llama.cpp refuses the drafter or the pair, or aborts running it"),
    Cause("file_layout", "file layout",
          "the drafter's tensors or tokenizer are wrong: missing, of the wrong shape or type, non-finite values, a "
          "broken centroid head"),
    Cause("pair_mismatch", "pair mismatch",
          "the drafter does not fit the target: backbone width, vocabulary, KV heads or head dims per layer type, "
          "the KV donor layers, the sliding window"),
    Cause("rope", "RoPE",
          "a RoPE base or the rotated dimensions differ from the target's or from every published Gemma 4 drafter"),
    Cause("metadata", "metadata",
          "another hyperparameter key is missing, impossible, or differs from every published Gemma 4 drafter"),
    Cause("convention", "runtime convention",
          "the drafter behaves as if a runtime convention differed (the hidden state fed before or after the "
          "target's final norm, the position, the LM head, the GELU): a replay variant recovers acceptance"),
    Cause("runtime_divergence", "runtime divergence",
          "llama.cpp drafts other tokens than the reference drafter reading the same file"),
    Cause("weights", "weights",
          "the drafter's weights differ from the reference's (the HF checkpoint, or a good GGUF): a tensor's known "
          "conversion mistake named, or the differences no pattern explains; without a reference, the behaviour "
          "pointing at the weights"),
    Cause("acceptance_limit", "what limits acceptance",
          "nothing points at the files or the runtime: what limits acceptance instead (hard tokens, token classes, "
          "categories)"),
    Cause("quantization", "quantization",
          "the drafter's matrices are quantized: what that costs in acceptance"),
    Cause("n_draft", "n_draft",
          "drafts past the decay of acceptance by position (a smaller n_draft is as good and cheaper), or MTP that "
          "does not pay on this machine"),
)}

#: Kinds of fix: a metadata key and its value, a runtime flag, a reconversion from the checkpoint, an n_draft,
#: another file, or nothing to change.
FIX_KINDS = ("metadata", "runtime_flag", "reconvert", "n_draft", "replace_file", "none")


@dataclass(frozen=True)
class ViewRef:
    """The app view that shows a finding's evidence, as data: a page (its URL path: ``validate``, ``explain``,
    ``step``, ``compare``, ``diagnose``, ...) and its parameters (``trace``, ``trace_b``, ``drafter``, ``target``,
    ``prompt``, ``round``, ``step``, ...), in the order given. The CLI and the app make it a URL."""

    page: str
    params: tuple[tuple[str, str | int], ...] = ()

    @classmethod
    def of(cls, page: str, **params: Any) -> ViewRef:
        """A view of ``page`` with the parameters that are not None (paths as strings)."""
        return cls(page, tuple((k, v if isinstance(v, int) and not isinstance(v, bool) else str(v))
                               for k, v in params.items() if v is not None))

    def get(self, name: str, default: Any = None) -> Any:
        """A parameter's value, or ``default``."""
        return next((v for k, v in self.params if k == name), default)

    def to_dict(self) -> dict[str, Any]:
        """``{"page": ..., "params": {name: value}}``."""
        return {"page": self.page, "params": dict(self.params)}


@dataclass(frozen=True)
class Evidence:
    """One piece of evidence: which step produced it (:data:`STEPS`), in words with its numbers, and the
    numbers themselves (JSON-able)."""

    step: str
    text: str
    numbers: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "text": self.text, "numbers": jsonable(dict(self.numbers))}


@dataclass(frozen=True)
class Fix:
    """What to change (:data:`FIX_KINDS`), in words; ``key`` / ``value``: the metadata key and its expected
    value, the runtime flag, or the n_draft."""

    kind: str
    text: str
    key: str | None = None
    value: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "key": self.key, "value": jsonable(self.value)}


@dataclass(frozen=True)
class Finding:
    """One finding of ``diagnose``.

    Attributes:
        cause: a key of :data:`CAUSES`.
        severity: :data:`SEVERITIES`.
        confidence: :data:`CONFIDENCES`.
        title: one line (what is wrong, with the value that is wrong).
        evidence: the numbers and the steps that produced them, strongest first.
        fix: what to change, or None.
        link: the app view that shows the evidence, or None.
        subject: what it is about (a GGUF key, a tensor, a variant, ``n_draft``); findings of one cause and
            subject are merged (:func:`rank.merge`).
        expected / actual: the value a good drafter has there and this one's (JSON-able), when one applies.
    """

    cause: str
    severity: str
    confidence: str
    title: str
    evidence: tuple[Evidence, ...] = ()
    fix: Fix | None = None
    link: ViewRef | None = None
    subject: str = ""
    expected: Any = None
    actual: Any = None

    @property
    def is_defect(self) -> bool:
        """An error or a warning."""
        return self.severity in DEFECT_SEVERITIES

    def to_dict(self) -> dict[str, Any]:
        """The finding's JSON object (docs/DIAGNOSE.md)."""
        return {"cause": self.cause, "severity": self.severity, "confidence": self.confidence, "title": self.title,
                "subject": self.subject, "expected": jsonable(self.expected), "actual": jsonable(self.actual),
                "evidence": [e.to_dict() for e in self.evidence],
                "fix": None if self.fix is None else self.fix.to_dict(),
                "link": None if self.link is None else self.link.to_dict()}


@dataclass(frozen=True)
class StepRun:
    """How one step went: ``status`` ``ran`` / ``skipped`` / ``failed``, its wall time in seconds and a note."""

    name: str
    status: str
    seconds: float = 0.0
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "seconds": round(float(self.seconds), 3), "note": self.note}


@dataclass(frozen=True)
class Diagnosis:
    """Everything ``diagnose`` found.

    Attributes:
        target / assistant: the model files; trace: the trace diagnosed (recorded or given), or None.
        reference: ``{"kind": "hf" | "gguf", "path": ...}`` or None.
        findings: ranked, worst first (:func:`rank.rank`).
        limits: sentences saying what limits acceptance (also when there is a defect).
        steps: :class:`StepRun` per step, in order.
        summary: the trace's numbers (``acceptance_rate``, ``mean_acceptance_length``, ``n_draft``,
            ``per_position``, ``by_category``, ...), JSON-able.
        variants: the replay's per-variant numbers (JSON-able), or None.
        published: the published-configuration comparison (variant picked, whether the geometry matched, the
            values checked), or None.
        notes: what was not available and why.
        explanation: the :class:`traces.analysis.explain_report.Explanation` (not in JSON: the figures' data).
        out: the output folder (trace, replay), or None.
    """

    target: str
    assistant: str
    trace: str | None
    findings: tuple[Finding, ...]
    limits: tuple[str, ...] = ()
    steps: tuple[StepRun, ...] = ()
    summary: Mapping[str, Any] = field(default_factory=dict)
    variants: Mapping[str, Any] | None = None
    published: Mapping[str, Any] | None = None
    reference: Mapping[str, Any] | None = None
    notes: tuple[str, ...] = ()
    explanation: Any = field(default=None, repr=False, compare=False)
    out: str | None = None

    @property
    def defects(self) -> tuple[Finding, ...]:
        """The findings that are defects (errors and warnings), ranked."""
        return tuple(f for f in self.findings if f.is_defect)

    @property
    def exit_code(self) -> int:
        """1 when a defect was found, else 0 (``mtpscope diagnose``'s exit code)."""
        return 1 if self.defects else 0

    @property
    def headline(self) -> str:
        """One sentence: the worst defect's title, else what limits acceptance."""
        if self.defects:
            return self.defects[0].title
        return self.limits[0] if self.limits else "no defect found"

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of ``mtpscope diagnose --json`` (docs/DIAGNOSE.md), findings ranked with ``rank``
        (1 = worst)."""
        return {"schema": 1, "target": self.target, "assistant": self.assistant, "trace": self.trace,
                "reference": jsonable(self.reference), "defect": bool(self.defects), "exit_code": self.exit_code,
                "headline": self.headline,
                "findings": [{"rank": i + 1, **f.to_dict()} for i, f in enumerate(self.findings)],
                "limits": list(self.limits), "summary": jsonable(dict(self.summary)),
                "variants": jsonable(self.variants), "published": jsonable(self.published),
                "steps": [s.to_dict() for s in self.steps], "notes": list(self.notes), "out": self.out}


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


__all__ = ["CAUSES", "CONFIDENCES", "DEFECT_SEVERITIES", "ERROR", "FIX_KINDS", "HIGH", "INFO", "LOW", "MEDIUM",
           "SEVERITIES", "STEPS", "WARNING", "Cause", "Diagnosis", "Evidence", "Finding", "Fix", "StepRun", "ViewRef",
           "jsonable"]
