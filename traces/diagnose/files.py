"""Step 1 of ``diagnose``: the drafter's and the pair's ``verify``, with the runtime verdicts, as findings.

One job: :func:`file_findings` turns a :class:`mtpscope.inspector.findings.Report` (``verify(assistant,
target=target, hf_dir=...)``: the file checks, the pairing, the HF audit and the loadability verdicts) into
diagnose :class:`~mtpscope.traces.diagnose.records.Finding` records, each inspector finding code mapped to one
cause of :data:`~mtpscope.traces.diagnose.records.CAUSES` (:func:`cause_of`: the code table, then the code's
family for a code added later). Errors stay errors, warnings warnings; info findings are not findings here.

Imports: inspector.validate (the loadability runtime names), inspector.findings (``RUNTIME_CRASH_CODES``),
and this area's records.
"""

from __future__ import annotations

import re
from typing import Any

from mtpscope.inspector.findings import RUNTIME_CRASH_CODES
from mtpscope.inspector.validate import RUNTIME_FORK, RUNTIME_UPSTREAM
from mtpscope.traces.diagnose.records import ERROR, HIGH, WARNING, Evidence, Finding, Fix, ViewRef

#: Inspector finding codes -> diagnose cause (docs/DIAGNOSE.md "How each cause is detected").
CODE_CAUSES: dict[str, str] = {
    **{c: "pair_mismatch" for c in ("E_PAIR_TARGET_ARCH", "E_PAIR_BACKBONE", "E_PAIR_VOCAB", "E_PAIR_KV_HEADS",
                                    "E_PAIR_HEAD_DIM", "E_PAIR_KV_DONOR", "E_SHARED_KV_LAYOUT", "W_PAIR_WINDOW")},
    **{c: "rope" for c in ("E_PAIR_ROPE", "E_ROPE_FREQS_VALUES")},
    **{c: "metadata" for c in ("E_ARCH_MISSING", "W_ARCH_NOT_ASSISTANT", "W_ARCH_FOREIGN_DRAFTER", "E_KEY_MISSING",
                               "W_KEY_MISSING", "E_KEY_VALUE", "W_KEY_VALUE", "E_HEAD_DIM_KV", "E_BACKBONE_EQUALS_NEMBD",
                               "E_NEXTN_LAYERS", "E_SWA_PATTERN", "E_TOP_K", "H_CONFIG_MISMATCH",
                               "H_CONFIG_INCOMPLETE")},
}
#: Key names (suffixes after the architecture) whose findings are RoPE findings whatever their code.
ROPE_KEYS = ("rope.freq_base", "rope.freq_base_swa", "rope.dimension_count", "rope.dimension_count_swa",
             "rope_freqs.weight")


def cause_of(code: str, subject: str = "") -> str:
    """The diagnose cause of an inspector finding: :data:`CODE_CAUSES`, a RoPE key or tensor (:data:`ROPE_KEYS`),
    else by the code's family (``E_PAIR_*`` / ``W_PAIR_*`` a pair mismatch, ``*_KEY_*`` / ``*_ARCH_*`` / ``*CONFIG*``
    metadata, everything else about tensors, tokenizer and centroid head the file's layout)."""
    if subject.endswith(ROPE_KEYS) or "ROPE" in code:
        return "rope"
    if code in CODE_CAUSES:
        return CODE_CAUSES[code]
    if "_PAIR_" in code:
        return "pair_mismatch"
    if "_KEY_" in code or "_ARCH_" in code or "CONFIG" in code:
        return "metadata"
    return "file_layout"


def _is_key(subject: str) -> bool:
    return bool(subject) and not subject.endswith(".weight") and not subject.startswith(("blk.", "tokenizer."))


def _fix(cause: str, code: str, subject: str, expected: Any) -> Fix:
    if cause in ("rope", "metadata") and _is_key(subject) and expected is not None and not isinstance(expected, dict):
        return Fix("metadata", f"set {subject} to {expected!r} (rewrite the key, or reconvert with the right value)",
                   key=subject, value=expected)
    if cause == "pair_mismatch":
        if code in ("E_PAIR_KV_DONOR", "E_SHARED_KV_LAYOUT"):
            return Fix("replace_file", "the target's last layers must be a sliding then a full layer (llama.cpp takes "
                       "the drafter's K/V from layers n_layer-2 and n_layer-1): use the target this drafter was made for "
                       "or a converter that keeps its layer pattern", key=subject, value=expected)
        return Fix("replace_file", f"the drafter was made for another target: pair it with its own target, or use "
                   f"this target's drafter ({subject} should be {expected!r})", key=subject, value=expected)
    return Fix("reconvert", "reconvert the drafter from its checkpoint with a converter that writes this tensor / "
               "key as the layout requires (`mtpscope convert`, `mtpscope verify` before use)", key=subject or None,
               value=expected)


def _title(cause: str, f: Any) -> str:
    if cause in ("rope", "metadata", "pair_mismatch") and f.expected is not None and f.actual is not None:
        return f"{f.subject or f.code}: {f.actual!r} where {f.expected!r} is expected ({f.code})"
    return f"{f.code}: {f.message}"


def file_findings(report: Any, *, assistant: str, target: str | None) -> list[Finding]:
    """Findings of a ``verify`` report (drafter, pairing, HF audit) and of the verdict of the runtime that runs
    the drafter's dialect (upstream llama.cpp for ``gemma4-assistant``, the fork for ``gemma4_assistant``).

    Args:
        report: :class:`mtpscope.inspector.findings.Report`.
        assistant / target: the paths (for the findings' links).

    Returns:
        One finding per inspector error or warning (info findings are context, not findings), and a
        ``runtime_refuses`` finding when that runtime refuses the drafter or aborts running it.
    """
    link = ViewRef.of("validate", drafter=assistant, target=target)
    out: list[Finding] = []
    runtime = RUNTIME_FORK if report.dialect == "fork" else RUNTIME_UPSTREAM
    for v in report.loadability:
        if v.runtime == runtime and v.loads is not None and not v.runs:
            why = "; ".join(v.reasons[:3])
            msg = f" (llama.cpp says: {v.message})" if v.message else ""
            out.append(Finding(
                "runtime_refuses", ERROR, HIGH, f"{v.runtime} {v.outcome}: {v.reasons[0] if v.reasons else 'refused'}",
                (Evidence("verify", f"loadability: {v.outcome}; {why}{msg} ({v.basis})",
                          {"runtime": v.runtime, "outcome": v.outcome, "reasons": list(v.reasons)}),),
                _fix("file_layout", "", "", None), link, subject=f"loadability:{v.runtime}", expected="loads",
                actual=v.outcome))
    for f in report.findings:
        if f.severity not in (ERROR, WARNING):
            continue
        cause = cause_of(f.code, f.subject)
        crash = " llama.cpp aborts on it." if f.code in RUNTIME_CRASH_CODES else ""
        ev = Evidence("verify", f"{f.code} [{f.subject or 'file'}]: {f.message}{crash}",
                      {"code": f.code, "expected": f.expected, "actual": f.actual})
        # one finding per key: per-layer subjects (head_count_kv[0], [1], ...) merge, each layer its own evidence
        subject = re.sub(r"\[\d+\]$", "", f.subject) or f.code
        out.append(Finding(cause, f.severity, HIGH, _title(cause, f), (ev,), _fix(cause, f.code, subject, f.expected),
                           link, subject=subject, expected=f.expected, actual=f.actual))
    return out


def can_record(report: Any) -> str | None:
    """Why llama.cpp's recorder cannot run this pair, in words, or None when it can: the drafter is not an
    upstream ``gemma4-assistant`` file, upstream llama.cpp refuses it or aborts on it, or it has a finding
    llama.cpp crashes on (:data:`RUNTIME_CRASH_CODES`)."""
    if report.dialect != "upstream":
        return (f"the drafter is a {report.dialect!r}-dialect file ({report.arch}); upstream llama.cpp records only "
                "gemma4-assistant drafters")
    for v in report.loadability:
        if v.runtime == RUNTIME_UPSTREAM and v.loads is not None and not v.runs:
            return f"llama.cpp {v.outcome}: {v.reasons[0] if v.reasons else ''}"
    crash = [f for f in report.findings if f.code in RUNTIME_CRASH_CODES]
    if crash:
        return f"llama.cpp would crash on it ({crash[0].code} {crash[0].subject})"
    if report.pairing is not None and any(f.code == "E_PAIR_TARGET_ARCH" for f in report.pairing.findings):
        return "the target is not a gemma4 model"
    return None


__all__ = ["CODE_CAUSES", "ROPE_KEYS", "can_record", "cause_of", "file_findings"]
