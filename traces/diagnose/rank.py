"""Merging the findings that are about one thing, and the ranking (docs/DIAGNOSE.md, "Ranking").

One job. Several steps can find the same defect (``verify``'s ``E_PAIR_ROPE`` and the published configurations
both name ``rope.freq_base_swa``; a reference file's keys name it a third time): :func:`merge` joins findings of
one cause and one subject into one, its evidence from every step, its confidence ``high`` when two steps agree.
:func:`rank` orders them: severity (error, warning, info), then the cause's place in
:data:`~mtpscope.traces.diagnose.records.CAUSES` (a refused file before a wrong key, a wrong key before the replay
that it explains), then confidence, then the order the steps found them in.

Imports: this area's records.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from mtpscope.traces.diagnose.records import CAUSES, CONFIDENCES, HIGH, SEVERITIES, Finding


def _key(f: Finding) -> tuple[str, str]:
    return f.cause, f.subject


def merge(findings: Iterable[Finding]) -> list[Finding]:
    """One finding per (cause, subject), in first-found order: the worst severity, the first title of that
    severity, every step's evidence (duplicates dropped), the first fix that names a value, the first link and
    expected value; confidence ``high`` when the evidence comes from two steps or more, else the best given."""
    groups: dict[tuple[str, str], list[Finding]] = {}
    for f in findings:
        groups.setdefault(_key(f), []).append(f)
    out = []
    for fs in groups.values():
        if len(fs) == 1:
            out.append(fs[0])
            continue
        worst = min(fs, key=lambda f: SEVERITIES.index(f.severity))
        evidence, seen = [], set()
        for f in [worst, *[g for g in fs if g is not worst]]:
            for e in f.evidence:
                if (e.step, e.text) not in seen:
                    seen.add((e.step, e.text))
                    evidence.append(e)
        steps = {e.step for e in evidence}
        conf = HIGH if len(steps) >= 2 else min((f.confidence for f in fs), key=CONFIDENCES.index)
        fix = next((f.fix for f in fs if f.fix is not None and f.fix.value is not None), None) or \
            next((f.fix for f in fs if f.fix is not None), None)
        expected = next((f.expected for f in fs if f.expected is not None), None)
        out.append(replace(worst, confidence=conf, evidence=tuple(evidence), fix=fix,
                           link=next((f.link for f in fs if f.link is not None), None), expected=expected))
    return out


def rank_key(f: Finding) -> tuple[int, int, int]:
    """``(severity, cause, confidence)`` positions: smaller ranks first."""
    cause = list(CAUSES).index(f.cause) if f.cause in CAUSES else len(CAUSES)
    return SEVERITIES.index(f.severity), cause, CONFIDENCES.index(f.confidence)


def rank(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """:func:`merge`, then sorted by :func:`rank_key` (stable: the steps' order breaks ties)."""
    return tuple(sorted(merge(findings), key=rank_key))


__all__ = ["merge", "rank", "rank_key"]
