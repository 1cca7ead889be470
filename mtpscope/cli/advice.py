"""Terminal text of the recommendation and the break-even (:class:`traces.analysis.advice.Advice`): what
``mtpscope explain`` prints for a trace and ``explain`` / ``report`` print for a sweep."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mtpscope.traces.analysis.advice import Advice, Recommendation
    from mtpscope.traces.sweep.advice import LoadWarning


def _choice(rec: Recommendation) -> str:
    c = rec.choice
    if c is None:
        return "cannot tell from these timings" if rec.cannot_tell else "no recommendation"
    who = f"{rec.assistant} " if rec.assistant else ""
    return "plain decoding" if c == "plain" else f"{who}n_draft {c}"


def format_advice(advice: Advice | None, load_warnings: Sequence[LoadWarning] = ()) -> list[str]:
    """The recommendation, its timing quality, a sweep's ``load_warnings`` and the break-even as terminal
    lines, overall and per category: what ``explain`` and the sweep report print (no lines without advice)."""
    if advice is None:
        return []
    rec = advice.recommendation
    out = ["", f"Recommendation: {_choice(rec)}{' (a tie)' if rec.tie else ''}"]
    tq = advice.timing_quality
    words = tq.words if tq is not None else ""
    if rec.cannot_tell and words and words in rec.reason:
        # the reason quotes the timing-quality evidence: print it once, as the timing quality line
        out.append(f"  {rec.reason.replace(words, 'the timings are disturbed (below)')}")
    else:
        out.append(f"  {rec.reason}")
    if tq is not None:
        out.append(f"  timing quality: {'DISTURBED, ' if tq.disturbed else ''}{words}")
    for w in load_warnings:
        out.append(f"  load warning: {w.words}")
    for cat, r in advice.by_category.items():
        out.append(f"  {cat}: {r.headline or r.reason}")
    be = advice.break_even
    if be is not None:
        out += ["", f"Break-even: {be.words}"]
        for cat, b in advice.break_even_by_category.items():
            need = b.draft_cost_ratio_needed
            if need > 0:
                head = (f"{'pays' if b.pays else 'would pay'} at n_draft {b.n_draft} with a draft step under "
                        f"{need:.2f} of a plain decode (now {b.draft_cost_ratio:.2f})")
            else:
                head = (f"cannot pay at n_draft {b.n_draft} at this verify cost ({b.verify_cost_ratio:.2f} "
                        "decodes) whatever a draft step costs")
            out.append(f"  {cat}: {head}; mean acceptance length needed {b.mean_acceptance_length_needed:.2f} "
                       f"(now {b.mean_acceptance_length:.2f})")
    return out
