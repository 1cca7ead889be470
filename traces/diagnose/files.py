"""Step 1 of ``diagnose``: the drafter's and the pair's ``verify``, with the runtime verdicts, as findings.

One job: :func:`file_findings` turns a :class:`mtpscope.inspector.findings.Report` (``verify(assistant,
target=target, hf_dir=...)``: the file checks, the pairing, the HF audit and the loadability verdicts) into
diagnose :class:`~mtpscope.traces.diagnose.records.Finding` records, each inspector finding code mapped to one
cause of :data:`~mtpscope.traces.diagnose.records.CAUSES` (:func:`cause_of`: the code table, then the code's
family for a code added later). Errors stay errors, warnings warnings; info findings are not findings here. A key
whose value differs from the target's while llama.cpp still runs the pair (:data:`MEASURED_PAIR_CODES`: the sliding
window) says exactly that, with both values, and asks to set the key; one key is no evidence of "another target".
What setting it costs is measured later: ``run.diagnose`` replays the sample with a copy of the drafter holding the
target's value (:func:`with_key_value`) and :func:`key_cost` says in the finding what that did (:func:`effect`).

Imports: numpy, errors, inspector.validate (the loadability runtime names), inspector.findings
(``RUNTIME_CRASH_CODES``), inspector.gguf (lazily), this area's records and ``variants`` (``MIN_RISE``).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.errors import MtpscopeError
from mtpscope.inspector.findings import RUNTIME_CRASH_CODES
from mtpscope.inspector.validate import RUNTIME_FORK, RUNTIME_UPSTREAM
from mtpscope.traces.diagnose.records import ERROR, HIGH, WARNING, Evidence, Finding, Fix, ViewRef
from mtpscope.traces.diagnose.variants import MIN_RISE

#: Inspector finding codes -> diagnose cause (docs/DIAGNOSE.md "How each cause is detected").
CODE_CAUSES: dict[str, str] = {
    **dict.fromkeys(("E_PAIR_TARGET_ARCH", "E_PAIR_BACKBONE", "E_PAIR_VOCAB", "E_PAIR_KV_HEADS", "E_PAIR_HEAD_DIM", "E_PAIR_KV_DONOR", "E_SHARED_KV_LAYOUT", "W_PAIR_WINDOW"), "pair_mismatch"),
    **dict.fromkeys(("E_PAIR_ROPE", "E_ROPE_FREQS_VALUES"), "rope"),
    **dict.fromkeys(("E_ARCH_MISSING", "W_ARCH_NOT_ASSISTANT", "W_ARCH_FOREIGN_DRAFTER", "E_KEY_MISSING", "W_KEY_MISSING", "E_KEY_VALUE", "W_KEY_VALUE", "E_HEAD_DIM_KV", "E_BACKBONE_EQUALS_NEMBD", "E_NEXTN_LAYERS", "E_SWA_PATTERN", "E_TOP_K", "H_CONFIG_MISMATCH", "H_CONFIG_INCOMPLETE"), "metadata"),
}
#: Pair codes of one key whose value differs from the target's while llama.cpp still runs the pair (it masks the
#: drafter's sliding layers with the drafter's own window): a warning, its cost measured by replaying the sample with
#: the key set to the target's value (``run.diagnose``, :func:`key_cost`).
MEASURED_PAIR_CODES = ("W_PAIR_WINDOW",)
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
        if code in MEASURED_PAIR_CODES:
            # one key that differs is not evidence of another target: the key is set, its cost measured (run.py)
            return Fix("metadata", f"set {subject} to {expected!r}, the target's (rewrite the key, or reconvert with "
                       "it)", key=subject, value=expected)
        return Fix("replace_file", f"{subject} does not fit this target ({expected!r} expected): use the drafter made "
                   "for this target, or pair this drafter with the target it was made for", key=subject,
                   value=expected)
    return Fix("reconvert", "reconvert the drafter from its checkpoint with a converter that writes this tensor / "
               "key as the layout requires (`mtpscope convert`, `mtpscope verify` before use)", key=subject or None,
               value=expected)


def _title(cause: str, f: Any) -> str:
    if f.code in MEASURED_PAIR_CODES and f.expected is not None and f.actual is not None:
        return f"{f.subject}: the drafter has {f.actual!r}, its target {f.expected!r} ({f.code})"
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


def effect(m: Mapping[str, Any]) -> str:
    """What a paired replay measured (``delta`` = ``rate_b - rate_a`` and its 95 % interval ``ci_low`` / ``ci_high``),
    by :data:`MIN_RISE` (0.03, the rise a convention variant needs to count):

    * ``"raises"`` / ``"lowers"``: the interval excludes 0 and ``|delta|`` is at least 0.03 (the variants' rule);
    * ``"small"``: the interval excludes 0, ``|delta|`` is under 0.03;
    * ``"none"``: the whole interval lies within (-0.03, +0.03): no effect of 0.03 or more;
    * ``"unclear"``: the interval includes 0 and reaches past +-0.03: the sample cannot tell;
    * ``"unknown"``: no delta or no interval (fewer than two prompts).
    """
    d, lo, hi = m.get("delta"), m.get("ci_low"), m.get("ci_high")
    if d is None or lo is None or hi is None:
        return "unknown"
    if lo > 0 or hi < 0:
        return ("raises" if d > 0 else "lowers") if abs(d) >= MIN_RISE else "small"
    return "none" if lo > -MIN_RISE and hi < MIN_RISE else "unclear"


#: :func:`effect` in words, of setting a key to another value (``rate_b``: with that value).
EFFECT_WORDS = {"raises": "it costs acceptance", "lowers": "the drafter drafts better with its own value here",
                "small": f"a small effect, under {MIN_RISE}", "none": f"no measurable effect on acceptance (the "
                f"interval lies within +-{MIN_RISE})", "unclear": "not clearly different from no effect: the interval "
                f"includes 0 and reaches past +-{MIN_RISE}, a larger sample would tell",
                "unknown": "too few prompts for an interval"}


def _iv(m: Mapping[str, Any]) -> str:
    return "" if m.get("ci_low") is None else f" [{m['ci_low']:+.3f}, {m['ci_high']:+.3f}]"


def key_cost(f: Finding, m: Mapping[str, Any] | None, *, value: Any, smaller: int | None = None,
             max_pos: int | None = None, why: str | None = None, recorded_rate: float | None = None,
             link: ViewRef | None = None) -> Finding:
    """A key finding (the drafter's value of ``f.subject`` differs from its target's, ``value``) with what setting the
    key to ``value`` was measured to do, in its title and evidence.

    Args:
        f: the finding (``f.actual`` the drafter's value).
        m: :func:`mtpscope.traces.diagnose.reference.replay_delta` of the sample replayed with the file (a) and
            with a copy of it whose key holds ``value`` (b), or None when nothing was replayed.
        smaller / max_pos: for a window, the smaller of the two windows and the largest position of the sample
            (default ``m["max_pos"]``): when no position reaches the smaller window the two masks are the same, so
            neither the sample nor the recording can show an effect; said so (no replay is needed).
        why: why nothing was replayed (with ``m`` None).
        recorded_rate: the recording's acceptance rate (with the drafter's value), quoted in the evidence.
        link: the view of the two replays (Compare), replacing ``f.link``.

    Returns:
        ``f`` with its title ("KEY: the drafter has A, its target B; <what was measured>"), a ``replay`` evidence when
        measured, and the fix "set KEY to B". Severity and confidence stay ``f``'s: a key that contradicts the
        target is a warning at most (docs/DIAGNOSE.md, "A key that differs from the target's").
    """
    key, have = f.subject, f.actual
    head = f"{key}: the drafter has {have!r}, its target {value!r}"
    fix = Fix("metadata", f"set {key} to {value!r}, the target's (rewrite the key, or reconvert with it)", key=key,
              value=value)
    top = max_pos if max_pos is not None else (m or {}).get("max_pos")
    if smaller is not None and top is not None and top < smaller:
        ev = Evidence("replay", f"the sample's positions (up to {top}) never reach past the smaller window ({smaller}): "
                      "with either value the drafter sees the same cached tokens there",
                      {"measured": False, "max_pos": top, "smaller_window": smaller, "recorded_rate": recorded_rate})
        return replace(f, title=f"{head}; no effect here: the replayed positions (up to {top}) never reach past the "
                       f"smaller window ({smaller}), longer contexts would", evidence=(*f.evidence, ev), fix=fix,
                       expected=value)
    if m is None or m.get("delta") is None:
        rate = "" if recorded_rate is None else f"; the recording's acceptance with {have!r} is {recorded_rate:.3f}"
        ev = Evidence("replay", f"not replayed with {value!r}: {why or 'no replay'}{rate}",
                      {"measured": False, "why": why, "recorded_rate": recorded_rate})
        return replace(f, title=f"{head}; its effect on acceptance is not measured ({why or 'no replay'})",
                       evidence=(*f.evidence, ev), fix=fix, expected=value)
    n = f"{m['n_rounds']} rounds of {m['n_prompts']} prompts"
    what = effect(m)
    changed = "" if m.get("agreement") is None else f", drafts changed at {1 - m['agreement']:.0%} of steps"
    said = (f"replaying {n} with {value!r}: acceptance {m['rate_a']:.3f} -> {m['rate_b']:.3f} ({m['delta']:+.3f}"
            f"{_iv(m)}, 95 % interval over prompts{changed}): {EFFECT_WORDS[what]}")
    agree = "" if m.get("agreement") is None else f"; the two files' drafts are equal at {m['agreement']:.1%} of the replayed steps"
    rec = "" if recorded_rate is None else f"; the recording's acceptance (with {have!r}) is {recorded_rate:.3f}"
    ev = Evidence("replay", f"the sample ({n}) replayed with the file and with a copy whose {key} is {value!r}: "
                  f"acceptance {m['rate_a']:.3f} vs {m['rate_b']:.3f}, delta {m['delta']:+.3f}{_iv(m)}{agree}"
                  + ("" if m.get("max_pos") is None else f"; positions up to {m['max_pos']}") + rec,
                  {"measured": True, **{k: m.get(k) for k in ("rate_a", "rate_b", "delta", "ci_low", "ci_high",
                                                              "agreement", "n_rounds", "n_prompts", "max_pos")},
                   "effect": what})
    return replace(f, title=f"{head}; {said}", evidence=(*f.evidence, ev), fix=fix, expected=value,
                   link=link or f.link)


#: numpy little-endian types of the integer GGUF value types :func:`with_key_value` rewrites in place.
_INT_TYPES = {"UINT8": "<u1", "INT8": "<i1", "UINT16": "<u2", "INT16": "<i2", "UINT32": "<u4", "INT32": "<i4",
              "UINT64": "<u8", "INT64": "<i8"}


def with_key_value(src: str | os.PathLike[str], dst: str | os.PathLike[str], key: str, value: int) -> Path:
    """A copy of the GGUF ``src`` at ``dst`` whose integer key ``key`` holds ``value`` (its bytes rewritten in place:
    same type, same size, every other byte equal), for replaying the sample with one key changed.

    Raises:
        MtpscopeError: the key is missing or not an integer scalar (naming it), or ``value`` does not fit its type.
        OSError: the copy cannot be written.
    """
    from mtpscope.inspector.gguf import open_gguf

    with open_gguf(src) as f:
        kv = f.kv.get(key)
        if kv is None or kv.type_name not in _INT_TYPES:
            raise MtpscopeError("not an integer key", path=os.fspath(src), key=key, expected="an integer scalar",
                                actual=None if kv is None else kv.type_name)
        dtype = np.dtype(_INT_TYPES[kv.type_name])
        at = kv.offset + 8 + len(key.encode("utf-8")) + 4       # key string (u64 length + bytes), value type u32
    info = np.iinfo(dtype)
    if not info.min <= int(value) <= info.max:
        raise MtpscopeError("value does not fit the key's type", key=key, expected=f"{info.min}..{info.max}",
                            actual=value)
    out = Path(dst)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, out)
    with open(out, "r+b") as fh:
        fh.seek(at)
        fh.write(np.array([int(value)], dtype=dtype).tobytes())
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


__all__ = ["CODE_CAUSES", "EFFECT_WORDS", "MEASURED_PAIR_CODES", "ROPE_KEYS", "can_record", "cause_of", "effect",
           "file_findings", "key_cost", "with_key_value"]
