"""What ``mtpscope diagnose`` reports: the documented causes, and the records of a finding and of a diagnosis.

One job: the records and their JSON form (docs/DIAGNOSE.md, "JSON"): ``to_dict()`` writes it, and
:meth:`Diagnosis.from_dict` rebuilds the records from it, every key checked (a file that is not this version's
diagnosis is one :class:`~mtpscope.errors.MtpscopeError` naming the file and the key). The steps (:mod:`files`, :mod:`published`,
:mod:`behaviour`, :mod:`variants`, :mod:`reference`) build :class:`Finding` records; :mod:`rank` orders them;
:mod:`run` assembles the :class:`Diagnosis`.

A finding's ``link`` is data (:class:`ViewRef`: an app page and its parameters), never a URL: the library does
not know the app; the CLI and the app turn it into a link (``mtpscope.app.links.view_url``).

The trace's, the replay's and the reference's numbers of a diagnosis are records of their own
(:mod:`summary_records`: ``DiagnosisSummary``, ``VariantsSummary``, ``ReferenceSummary``), re-exported here.

Imports: the standard library, mtpscope.errors and traces.diagnose.summary_records.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from mtpscope.errors import MtpscopeError
from mtpscope.traces.diagnose.summary_records import (
    NESTED,
    DiagnosisSummary,
    ReferenceSummary,
    VariantRow,
    VariantsSummary,
    jsonable,
)

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
#: How a step went (:class:`StepRun`).
STEP_STATUSES = ("ran", "skipped", "failed")


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
    """How one step went: ``status`` ``ran`` / ``skipped`` / ``failed`` (:data:`STEP_STATUSES`), its wall time in
    seconds (stored to the millisecond, as the JSON has it) and a note."""

    name: str
    status: str
    seconds: float = 0.0
    note: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "seconds", round(float(self.seconds), 3))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "seconds": round(float(self.seconds), 3), "note": self.note}



@dataclass(frozen=True)
class Diagnosis:
    """Everything ``diagnose`` found.

    Attributes:
        target / assistant: the model files; trace: the trace diagnosed (recorded or given), or None.
        reference: the reference compared with (:class:`ReferenceSummary`), or None.
        findings: ranked, worst first (:func:`rank.rank`).
        limits: sentences saying what limits acceptance (also when there is a defect).
        steps: :class:`StepRun` per step, in order.
        summary: the trace's numbers (:class:`DiagnosisSummary`; empty without a trace).
        variants: the replay's per-variant numbers (:class:`VariantsSummary`), or None.
        published: the published-configuration comparison (variant picked, whether the geometry matched, the
            values checked), JSON-able, or None.
        (The records' numbers and ``published`` are stored as their JSON has them (:func:`jsonable`: Python
        numbers, lists, non-finite floats as None), so that a fresh diagnosis and one read back from
        ``diagnosis.json`` hold the same values.)
        notes: what was not available and why.
        model_mismatch: a line per model given (target, assistant) that is not the file the trace was recorded with
            (:func:`traces.run.preflight.model_mismatch_notes`): the trace's numbers describe another model (empty
            without a trace, and in a ``diagnosis.json`` written before the key existed).
        explanation: the :class:`traces.analysis.explain_report.Explanation` (not in JSON: the figures' data).
        out: the output folder (trace, replay), or None.
    """

    target: str
    assistant: str
    trace: str | None
    findings: tuple[Finding, ...]
    limits: tuple[str, ...] = ()
    steps: tuple[StepRun, ...] = ()
    summary: DiagnosisSummary = field(default_factory=DiagnosisSummary)
    variants: VariantsSummary | None = None
    published: Mapping[str, Any] | None = None
    reference: ReferenceSummary | None = None
    notes: tuple[str, ...] = ()
    model_mismatch: tuple[str, ...] = ()
    explanation: Any = field(default=None, repr=False, compare=False)
    out: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "published", jsonable(self.published))

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
                "reference": None if self.reference is None else self.reference.to_dict(), "defect": bool(self.defects), "exit_code": self.exit_code,
                "headline": self.headline,
                "findings": [{"rank": i + 1, **f.to_dict()} for i, f in enumerate(self.findings)],
                "limits": list(self.limits), "summary": self.summary.to_dict(),
                "variants": None if self.variants is None else self.variants.to_dict(), "published": jsonable(self.published),
                "steps": [s.to_dict() for s in self.steps], "notes": list(self.notes),
                "model_mismatch": list(self.model_mismatch), "out": self.out}

    @classmethod
    def from_dict(cls, doc: Any, *, path: str | os.PathLike[str] | None = None) -> Diagnosis:
        """The records of a diagnosis document (:meth:`to_dict`'s JSON, read back), every key checked: its type,
        a documented value (causes, severities, confidences, steps, fix kinds, step statuses), and the keys
        :meth:`to_dict` derives (``defect``, ``exit_code``, ``headline``, each finding's ``rank``) agreeing with
        the findings. ``Diagnosis.from_dict(d.to_dict()).to_dict() == d.to_dict()``; the explanation is not in
        the JSON (None). A link's ``url`` (``mtpscope diagnose --json`` adds it) is ignored.

        Args:
            doc: the parsed JSON (``json.loads`` of ``diagnosis.json``).
            path: the file it came from, named by the error.

        Raises:
            MtpscopeError: not a schema-1 diagnosis document: ``path``, ``key`` the first key that is missing or
                wrong (``findings[2].severity``), expected vs actual.
        """
        r = _Reader(doc, "", path)
        r.get("schema", int, "1", choices=(1,))
        found = r.objects("findings")
        for i, f in enumerate(found):
            f.get("rank", int, "an integer", choices=(i + 1,))
        d = cls(target=r.get("target", str, "a string"), assistant=r.get("assistant", str, "a string"),
                trace=r.get("trace", str, "a string or null", optional=True),
                findings=tuple(_finding(f) for f in found), limits=r.strings("limits"),
                steps=tuple(_step(s) for s in r.objects("steps")), summary=_summary(_Reader(r.get("summary", dict, "an object"), "summary", path)),
                variants=_variants(r.child("variants")),
                published=r.get("published", dict, "an object or null", optional=True),
                reference=_reference(r.child("reference")),
                notes=r.strings("notes"), model_mismatch=r.strings("model_mismatch", absent_ok=True),
                out=r.get("out", str, "a string or null", optional=True))
        # the keys to_dict derives from the findings: a file edited by hand (or another version's) says otherwise
        for key, want in (("defect", bool(d.defects)), ("exit_code", d.exit_code), ("headline", d.headline)):
            r.get(key, type(want), type(want).__name__, choices=(want,))
        return d


_MISSING = object()
#: What a document that fails a check is said to be.
_NOT_A_DIAGNOSIS = "not a diagnosis document of this mtpscope (schema 1: `mtpscope diagnose --out` writes one)"


class _Reader:
    """One JSON object of a diagnosis document, read key by key; each error names the file and the key's path in
    the document (``findings[2].evidence[0].step``)."""

    def __init__(self, obj: Any, key: str, path: str | os.PathLike[str] | None) -> None:
        self.obj, self.key, self.path = obj, key, path
        if not isinstance(obj, dict):
            self._raise(key or None, "an object", obj)

    def _raise(self, key: str | None, expected: Any, actual: Any) -> NoReturn:
        shown = "no such key" if actual is _MISSING else repr(actual)[:60]
        raise MtpscopeError(_NOT_A_DIAGNOSIS, path=self.path, key=key, expected=expected, actual=shown)

    def name(self, key: str) -> str:
        return f"{self.key}.{key}" if self.key else key

    def fail(self, key: str, expected: Any, actual: Any) -> NoReturn:
        self._raise(self.name(key), expected, actual)

    def value(self, key: str) -> Any:
        """Any JSON value (null included), the key present."""
        v = self.obj.get(key, _MISSING)
        if v is _MISSING:
            self.fail(key, "a value or null", v)
        return v

    def get(self, key: str, kind: type | tuple[type, ...], what: str, *, optional: bool = False,
            choices: Sequence[Any] | None = None) -> Any:
        """The value of ``key``: of type ``kind`` (a bool is no int or float), None when ``optional``, one of
        ``choices`` when given."""
        v = self.obj.get(key, _MISSING)
        if v is None and optional:
            return None
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if v is _MISSING or not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
            self.fail(key, what, v)
        if choices is not None and v not in choices:
            self.fail(key, " | ".join(map(str, choices)) if len(choices) > 1 else repr(choices[0]), v)
        return v

    def strings(self, key: str, *, absent_ok: bool = False) -> tuple[str, ...]:
        """The list of strings at ``key`` (``absent_ok``: a key an older document lacks reads as empty)."""
        if absent_ok and key not in self.obj:
            return ()
        v = self.get(key, list, "a list of strings")
        for i, x in enumerate(v):
            if not isinstance(x, str):
                self._raise(f"{self.name(key)}[{i}]", "a string", x)
        return tuple(v)

    def objects(self, key: str) -> list[_Reader]:
        return [_Reader(x, f"{self.name(key)}[{i}]", self.path)
                for i, x in enumerate(self.get(key, list, "a list"))]

    def child(self, key: str) -> _Reader | None:
        """The object at ``key`` (or None for null)."""
        v = self.get(key, dict, "an object or null", optional=True)
        return None if v is None else _Reader(v, self.name(key), self.path)


def _finding(r: _Reader) -> Finding:
    fix, link = r.child("fix"), r.child("link")
    return Finding(cause=r.get("cause", str, "a cause", choices=tuple(CAUSES)),
                   severity=r.get("severity", str, "a severity", choices=SEVERITIES),
                   confidence=r.get("confidence", str, "a confidence", choices=CONFIDENCES),
                   title=r.get("title", str, "a string"),
                   evidence=tuple(_evidence(e) for e in r.objects("evidence")),
                   fix=None if fix is None else _fix(fix), link=None if link is None else _view(link),
                   subject=r.get("subject", str, "a string"), expected=r.value("expected"), actual=r.value("actual"))


def _evidence(r: _Reader) -> Evidence:
    return Evidence(r.get("step", str, "a step", choices=STEPS), r.get("text", str, "a string"),
                    r.get("numbers", dict, "an object"))


def _fix(r: _Reader) -> Fix:
    return Fix(r.get("kind", str, "a fix kind", choices=FIX_KINDS), r.get("text", str, "a string"),
               r.get("key", str, "a string or null", optional=True), r.value("value"))


def _view(r: _Reader) -> ViewRef:
    page = r.get("page", str, "a string")
    p = _Reader(r.get("params", dict, "an object"), r.name("params"), r.path)
    return ViewRef(page, tuple((k, p.get(k, (str, int), "a string or an integer")) for k in p.obj))


def _step(r: _Reader) -> StepRun:
    return StepRun(r.get("name", str, "a step", choices=STEPS), r.get("status", str, "a status", choices=STEP_STATUSES),
                   r.get("seconds", (int, float), "a number"), r.get("note", str, "a string"))


#: The type each summary key has in JSON (null allowed for all): :class:`DiagnosisSummary`'s fields.
_SUMMARY_KINDS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "acceptance_rate": ((int, float), "a number or null"), "mean_acceptance_length": ((int, float), "a number or null"),
    "n_prompts": (int, "an integer or null"), "n_rounds": (int, "an integer or null"),
    "n_drafted": (int, "an integer or null"), "n_accepted": (int, "an integer or null"),
    "per_position": (list, "a list or null"), "by_category": (dict, "an object or null"),
    "by_class": (dict, "an object or null"), "causes": (dict, "an object or null"),
    "target_side": (dict, "an object or null"), "what_if": (list, "a list or null"),
    "best_n_draft": (int, "an integer or null"), "recommendation": (dict, "an object or null"),
    "n_draft": (int, "an integer or null")}


def _summary(r: _Reader) -> DiagnosisSummary:
    """``{}`` (no trace) or every key of :class:`DiagnosisSummary`, each of its type or null."""
    if not r.obj:
        return DiagnosisSummary()
    for k in r.obj:
        if k not in _SUMMARY_KINDS:
            r.fail(k, "no such key (" + ", ".join(_SUMMARY_KINDS) + ")", r.obj[k])
    kw = {k: r.get(k, kind, what, optional=True) for k, (kind, what) in _SUMMARY_KINDS.items()}
    for k, make in NESTED.items():
        if kw[k] is not None:
            try:
                make(jsonable(kw[k]))
            except (KeyError, IndexError, TypeError, ValueError, AttributeError):
                r.fail(k, f"the {k} records' JSON (docs/DIAGNOSE.md)", kw[k])
    return DiagnosisSummary.from_dict(kw)


def _variant(r: _Reader) -> VariantRow:
    num, what = (int, float), "a number or null"
    rec = "recovers" in r.obj       # compared with the baseline: every variant but the baseline
    return VariantRow(r.get("options", str, "a string or null", optional=True),
                      r.get("acceptance_rate", num, what, optional=True), r.get("agreement", num, what, optional=True),
                      r.get("trace", str, "a string or null", optional=True),
                      r.get("delta", num, what, optional=True) if rec else None,
                      r.get("ci_low", num, what, optional=True) if rec else None,
                      r.get("ci_high", num, what, optional=True) if rec else None,
                      r.get("recovers", bool, "true | false") if rec else None)


#: The keys of a ``variants`` object besides ``variants`` (:class:`VariantsSummary`), each (its type, in words);
#: ``baseline_acceptance_rate`` may be left out.
_VARIANTS_KINDS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "n_rounds": (int, "an integer or null"), "n_steps": (int, "an integer or null"),
    "n_prompts": (int, "an integer or null"), "recorded": (dict, "an object or null"),
    "baseline_agreement": ((int, float), "a number or null"),
    "baseline_h_next_rel_err_max": ((int, float), "a number or null"),
    "baseline_numerics": (dict, "an object or null"), "baseline_acceptance_rate": ((int, float), "a number or null")}


def _variants(r: _Reader | None) -> VariantsSummary | None:
    if r is None:
        return None
    for k in r.obj:
        if k != "variants" and k not in _VARIANTS_KINDS:
            r.fail(k, "no such key (" + ", ".join(["variants", *_VARIANTS_KINDS]) + ")", r.obj[k])
    rows = _Reader(r.get("variants", dict, "an object"), r.name("variants"), r.path)
    kw = {k: r.get(k, kind, what, optional=True) for k, (kind, what) in _VARIANTS_KINDS.items()
          if k != "baseline_acceptance_rate" or k in r.obj}
    return VariantsSummary(**kw, variants={k: _variant(_Reader(v, rows.name(k), r.path)) for k, v in rows.obj.items()})


def _reference(r: _Reader | None) -> ReferenceSummary | None:
    if r is None:
        return None
    return ReferenceSummary(r.get("kind", str, "hf | gguf", optional=True),
                            r.get("path", str, "a string or null", optional=True),
                            {k: v for k, v in r.obj.items() if k not in ("kind", "path")})


__all__ = ["CAUSES", "CONFIDENCES", "DEFECT_SEVERITIES", "ERROR", "FIX_KINDS", "HIGH", "INFO", "LOW", "MEDIUM",
           "SEVERITIES", "STEPS", "STEP_STATUSES", "WARNING", "Cause", "Diagnosis", "DiagnosisSummary", "Evidence", "Finding",
           "Fix", "ReferenceSummary", "StepRun", "VariantRow", "VariantsSummary", "ViewRef", "jsonable"]
