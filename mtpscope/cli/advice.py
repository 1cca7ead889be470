"""Terminal text of the recommendation and the break-even (:meth:`traces.analysis.advice.Advice.to_dict`):
what ``mtpscope explain`` prints for a trace and ``explain`` / ``report`` print for a sweep."""

from __future__ import annotations

from typing import Any


def _choice(rec: dict[str, Any]) -> str:
    c = rec.get("choice")
    if c is None:
        return "cannot tell from these timings" if rec.get("cannot_tell") else "no recommendation"
    who = f"{rec['assistant']} " if rec.get("assistant") else ""
    return "plain decoding" if c == "plain" else f"{who}n_draft {c}"


def format_advice(d: dict[str, Any]) -> list[str]:
    """The ``recommendation``, ``timing_quality``, ``load_warnings`` (a sweep's) and ``break_even`` keys
    (:meth:`traces.analysis.advice.Advice.to_dict`) as terminal lines, overall and per category: what
    ``explain`` and the sweep report print."""
    rec = d.get("recommendation")
    if not rec:
        return []
    out = ["", f"Recommendation: {_choice(rec)}{' (a tie)' if rec.get('tie') else ''}"]
    tq = d.get("timing_quality")
    words = tq.get("words", "") if tq else ""
    if rec.get("cannot_tell") and words and words in rec["reason"]:
        # the reason quotes the timing-quality evidence: print it once, as the timing quality line
        out.append(f"  {rec['reason'].replace(words, 'the timings are disturbed (below)')}")
    else:
        out.append(f"  {rec['reason']}")
    if tq:
        out.append(f"  timing quality: {'DISTURBED, ' if tq.get('disturbed') else ''}{words}")
    for w in d.get("load_warnings") or []:
        out.append(f"  load warning: {w['words'] if isinstance(w, dict) else w}")
    for cat, r in (rec.get("by_category") or {}).items():
        out.append(f"  {cat}: {r.get('headline') or r['reason']}")
    be = d.get("break_even")
    if be:
        out += ["", f"Break-even: {be['words']}"]
        for cat, b in (be.get("by_category") or {}).items():
            need = b["draft_cost_ratio_needed"]
            if need > 0:
                head = (f"{'pays' if b['pays'] else 'would pay'} at n_draft {b['n_draft']} with a draft step under "
                        f"{need:.2f} of a plain decode (now {b['draft_cost_ratio']:.2f})")
            else:
                head = (f"cannot pay at n_draft {b['n_draft']} at this verify cost ({b['verify_cost_ratio']:.2f} "
                        "decodes) whatever a draft step costs")
            out.append(f"  {cat}: {head}; mean acceptance length needed {b['mean_acceptance_length_needed']:.2f} "
                       f"(now {b['mean_acceptance_length']:.2f})")
    return out
