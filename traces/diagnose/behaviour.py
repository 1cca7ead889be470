"""Steps 4 and 7 of ``diagnose``: the trace's explanation and advice read as findings.

One job: from an :class:`~mtpscope.traces.analysis.explain_report.Explanation` (``explain_with_baseline``: causes,
hard vs wrong, token classes, categories, what-if, the advice with its intervals and break-even) and the trace's
report (:func:`mtpscope.traces.analysis.metrics.report`: acceptance by position), say

* whether the recorded n_draft is **past the decay** of acceptance by position: the drafts at the last depth add
  fewer than :data:`MARGINAL_MIN` accepted tokens per round, 95 % interval over prompts included
  (:func:`depth_gain`, measured on the trace's rounds, at least ``advice.MIN_FIRST_DRAFTS`` of them drafting
  n_draft): a warning, with the n_draft to use;
* the advice (plain decoding or which n_draft, overall and per category, with intervals and break-even) as a
  note: what pays depends on the machine's costs, so it is never a defect by itself;
* a drafter that is almost never accepted (:func:`broken_finding`), or one that misses the tokens the target was sure
  of nearly as often as the hard ones (:func:`sure_miss_finding`): a ``weights`` warning of low confidence, the cause
  no other check pinned, with the check that would (a reference, ``mtpscope diff``);
* **what limits acceptance** (:func:`limit_sentences`): hard vs wrong first misses, the worst categories and token
  classes, the decay by position.

Imports: numpy, traces.analysis.advice (``MIN_FIRST_DRAFTS``), traces.analysis.explain (``HARD_ENTROPY_NATS``),
this area's records and ``reference`` (``weights_severity``, the one rule of a weights finding's severity); for types
only pandas,
explain_report and report_records. The explanation's and the report's records are read by attribute.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from mtpscope.traces.analysis.advice import MIN_FIRST_DRAFTS
from mtpscope.traces.analysis.explain import HARD_ENTROPY_NATS
from mtpscope.traces.diagnose.records import HIGH, INFO, MEDIUM, WARNING, Evidence, Finding, Fix, ViewRef
from mtpscope.traces.diagnose.reference import weights_severity

if TYPE_CHECKING:
    import pandas as pd

    from mtpscope.traces.analysis.advice import Advice
    from mtpscope.traces.analysis.explain_report import Explanation
    from mtpscope.traces.analysis.report_records import TraceReport

#: A draft position adding fewer accepted tokens per round than this (upper end of its 95 % interval) is past the
#: decay: a draft step costs more than that on any runtime (on a GPU about 0.05 - 0.1 of a target decode; here,
#: on CPU, 0.3 and more), so the drafts there never pay.
MARGINAL_MIN = 0.05
#: Groups (categories, token classes) with fewer drafts than this are not named in the limits.
MIN_GROUP_DRAFTS = 20
#: Acceptance under this is a drafter that does not work at all (:func:`broken_finding`).
BROKEN_RATE = 0.05
#: A drafter whose first misses are tokens the target was sure of (entropy under ``HARD_ENTROPY_NATS``) in at least
#: this share of the sure share of the steps the target judged points at its weights (:func:`sure_miss_finding`). A
#: drafter blind to what the target knows misses sure and hard tokens alike: its misses are sure as often as the
#: judged steps are (a ratio of 1). A drafter that reads the target's state misses sure tokens several times less
#: often than hard ones: the demo's trained F32 drafter misses 9 % of sure tokens and 65 % of hard ones, 9 % of its
#: first misses sure against 41 % of its judged steps (a ratio of 0.21; its Q8_0 copy the same). Half of the blind
#: ratio lies between the two, and means a sure token is missed at least a third as often as a hard one when the
#: judged steps are half sure.
SURE_MISS_RATIO = 0.5
#: Said where the behaviour points at the drafter and no check could pin it: the checks that would.
UNPINNED = ("the behaviour points at the drafter, which no check here could pin: compare it with a reference "
            "(--reference HF_DIR or --reference-assistant GOOD.gguf) or `mtpscope diff` it against a good conversion")
#: Token classes that say nothing about the text (not named in the limits).
_SKIP_CLASSES = ("unknown", "special")


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def _iv(iv: Sequence[float] | None, spec: str = ".2f") -> str:
    return "" if iv is None else f" [{format(iv[0], spec)}, {format(iv[1], spec)}]"


def depth_gain(rounds: Any, n: int, *, n_boot: int = 1000, seed: int = 0
               ) -> tuple[float, tuple[float, float] | None] | None:
    """Accepted tokens per round that the n-th draft adds, measured: among the rounds that drafted at least n, the
    share whose first n drafts were all accepted (= ``tau(n) - tau(n - 1)``, ``tau`` the mean acceptance length at
    n_draft n), with its 95 % percentile interval over ``n_boot`` resamples of the prompts (seeded). None when no
    round drafted n.

    Args:
        rounds: a trace's rounds (``prompt_id``, ``n_draft``, ``n_accepted``).
    """
    pid = np.asarray(rounds["prompt_id"], dtype=np.int64)
    nd = np.asarray(rounds["n_draft"], dtype=np.int64)
    na = np.asarray(rounds["n_accepted"], dtype=np.int64)
    m = nd >= n
    if not m.any():
        return None
    ids, inv = np.unique(pid[m], return_inverse=True)
    tot = np.bincount(inv, minlength=len(ids)).astype(np.float64)
    hit = np.bincount(inv, weights=(na[m] >= n).astype(np.float64), minlength=len(ids))
    gain = float(hit.sum() / tot.sum())
    if len(ids) < 2 or n_boot < 1:
        return gain, None
    w = np.random.default_rng(seed).multinomial(len(ids), np.full(len(ids), 1 / len(ids)), size=n_boot)
    den = w @ tot
    s = (w @ hit)[den > 0] / den[den > 0]
    return gain, (float(np.quantile(s, 0.025)), float(np.quantile(s, 0.975)))


def limit_sentences(x: Explanation, report: TraceReport) -> list[str]:
    """What limits acceptance, in sentences, most telling first: hard vs wrong first misses, the worst and best
    categories, the worst token classes, the acceptance by draft position (said to fall, rise or hold level as its
    first and last values printed do). A trace whose every draft was accepted gets one sentence saying so."""
    out: list[str] = []
    if report.n_drafted and report.n_accepted == report.n_drafted:
        return [f"every draft was accepted ({report.n_accepted} of {report.n_drafted}): nothing limited acceptance "
                "in this trace"]
    rej = x.rejections
    ts = rej.target_side
    hard, wrong = ts.hard, ts.wrong
    if hard + wrong:
        h = hard / (hard + wrong)
        if h >= 0.5:
            out.append(f"{_pct(h)} of first misses are hard tokens ({hard} of the {hard + wrong} the target judged): the "
                       "target itself was unsure (entropy >= 1 nat, "
                       f"mean p(drafted) {ts.p_drafted_mean_hard or 0:.2f})")
        else:
            out.append(f"{_pct(1 - h)} of first misses are tokens the target was sure of ({wrong} of the {hard + wrong} "
                       "it judged): the drafter predicts them wrongly (its quality, not the runtime)")
    cats = {k: v.acceptance_rate for k, v in (x.by_category or {}).items()
            if v.acceptance_rate is not None and v.n_drafted >= MIN_GROUP_DRAFTS}
    cat_drafted = {k: v.n_drafted for k, v in (x.by_category or {}).items()}
    if len(cats) >= 2:
        lo = min(cats, key=lambda c: cats[c])
        hi = max(cats, key=lambda c: cats[c])
        out.append(f"acceptance by category ranges from {cats[lo]:.2f} ({lo}, "
                   f"{cat_drafted[lo]} drafts) to {cats[hi]:.2f} ({hi})")
    cls = {k: v.acceptance_rate for k, v in (x.by_class or {}).items() if k not in _SKIP_CLASSES
           and v.acceptance_rate is not None and v.n_drafted >= MIN_GROUP_DRAFTS}
    cls_drafted = {k: v.n_drafted for k, v in (x.by_class or {}).items()}
    overall = report.acceptance_rate
    below = [c for c in sorted(cls, key=lambda c: cls[c]) if overall is not None and cls[c] < overall][:2]
    if below:       # (only classes below the overall rate are "hard": the easiest is never named among them)
        out.append(f"token classes below the overall acceptance {overall:.2f}: " + ", ".join(
            f"{c} {cls[c]:.2f} of {cls_drafted[c]} drafts" for c in below))
    pp = [(p.k, p.acceptance) for p in report.per_position if p.acceptance is not None]
    if len(pp) >= 2:
        # the word from the numbers as printed (two decimals): the first position's against the last's
        first, last = round(pp[0][1], 2), round(pp[-1][1], 2)
        trend = "falls" if last < first else "rises" if last > first else "holds level"
        out.append(f"acceptance {trend} with the draft position: " + ", ".join(
            f"k={k} {acc:.2f}" for k, acc in pp))
    causes = rej.causes
    # the drafter's real first misses: of known target token (one of unknown target token has no rank to be far),
    # not an end-of-generation draft the target confirmed (after_eog: no miss, its target token known all the same). The hard / wrong split above
    # counts the misses whose target entropy is known instead: the same ones where a trace knows both (every recording
    # of this tool), which is why each sentence names its own count
    n_fm = sum(int(v) for c, v in causes.items() if c not in ("after_eog", "unknown"))
    if n_fm and causes.get("far_miss"):
        far = int(causes["far_miss"])     # counts said: explain's cause table shares out every cause, after_eog too
        out.append(f"{_pct(far / n_fm)} of first misses are far misses ({far} of the {n_fm} of known target token, "
                   "confirmed end-of-generation drafts left out: the target's token outside the drafter's stored top "
                   "list)")
    return out


def _category_lines(advice: Advice) -> list[str]:
    return [f"{c}: {r.headline or r.reason}" for c, r in sorted((advice.by_category or {}).items())]


def n_draft_findings(x: Explanation, rounds: Any, *, trace: str, n_draft: int) -> list[Finding]:
    """The n_draft finding: a warning when the recorded n_draft is past the decay (module docstring; ``rounds``:
    the trace's ``prompt_id``, ``n_draft``, ``n_accepted``), else the advice as a note (plain decoding or which
    n_draft, per category, break-even)."""
    wi, adv = x.what_if, x.advice
    if wi is None or adv is None:
        return []
    link = ViewRef.of("explain", trace=trace, prompt="all")
    rec = adv.recommendation
    per_cat = _category_lines(adv)
    be = adv.break_even
    ev_advice = Evidence("advice", f"recommendation: {rec.headline or rec.reason}"
                         + (f"; break-even: {be.words}" if be is not None else ""),
                         {"choice": rec.choice, "speedup": rec.speedup, "interval": rec.interval, "tie": rec.tie})
    ev_cats = (Evidence("advice", "per category: " + "; ".join(per_cat),
                        {c: r.choice for c, r in (adv.by_category or {}).items()}),) if per_cat else ()
    # the decay is judged only on as many rounds as the advice needs to choose (fewer: an interval of a handful of
    # prompts that all happened to miss the last draft reads as certain)
    n_full = int((np.asarray(rounds["n_draft"], dtype=np.int64) >= n_draft).sum()) if n_draft >= 2 else 0
    mg = depth_gain(rounds, n_draft) if n_full >= MIN_FIRST_DRAFTS else None
    if mg is not None and mg[1] is not None and mg[1][1] < MARGINAL_MIN:
        keep = [n for n in range(1, n_draft) if (m := depth_gain(rounds, n, n_boot=0)) is not None
                and m[0] >= MARGINAL_MIN]
        best: int | str = max(keep) if keep else "plain"
        rows = {r.n_draft: r for r in wi.rows}
        r_rec, r_best = rows.get(n_draft), rows.get(best) if isinstance(best, int) else None
        speed = ""
        if r_rec is not None and r_best is not None and r_rec.speedup is not None and r_best.speedup is not None:
            speed = (f"; what-if: n_draft {best} at {r_best.speedup:.2f}x{_iv(r_best.speedup_interval)} plain "
                     f"decoding's speed, n_draft {n_draft} at {r_rec.speedup:.2f}x{_iv(r_rec.speedup_interval)}")
        ev = Evidence("explain", f"draft {n_draft} adds {mg[0]:.3f}{_iv(mg[1], '.3f')} accepted tokens per round "
                      f"(the share of rounds that drafted {n_draft} with all {n_draft} drafts accepted; 95 % interval "
                      f"over prompts); under {MARGINAL_MIN} a draft step never pays{speed}",
                      {"marginal": mg[0], "interval": mg[1], "n_draft": n_draft, "suggested": best})
        use = f"n_draft {best}" if isinstance(best, int) else "plain decoding: no draft position adds " \
            f"{MARGINAL_MIN} accepted tokens per round"
        here = "" if rec.choice is None else (f"; on this machine the advice is "
                                               f"{'plain decoding' if rec.choice == 'plain' else f'n_draft {rec.choice}'}"
                                               + (" (a tie)" if rec.tie else ""))
        fix = (Fix("n_draft", f"draft at most {best} tokens per round, the last position that adds {MARGINAL_MIN} "
                   f"accepted tokens (llama.cpp: --spec-draft-n-max {best}; mtpscope record --n-draft {best}){here}",
                   key="n_draft", value=best) if isinstance(best, int) else
               Fix("runtime_flag", "decode without the drafter until the findings above are fixed", key="n_draft",
                   value="plain"))
        return [Finding("n_draft", WARNING, HIGH,
                        f"n_draft {n_draft} is past the decay: draft {n_draft} adds {mg[0]:.3f} accepted tokens per "
                        f"round; use {use}", (ev, ev_advice, *ev_cats), fix, link, subject="n_draft", expected=best,
                        actual=n_draft)]
    if rec.choice is None:
        return [Finding("n_draft", INFO, MEDIUM, f"advice: {rec.headline or rec.reason}", (ev_advice,), None, link,
                        subject="n_draft", actual=n_draft)]
    what = "plain decoding" if rec.choice == "plain" else f"n_draft {rec.choice}"
    title = f"advice: {what}" + (" (a tie)" if rec.tie else "") + f" -- {rec.headline or rec.reason}"
    fix = Fix("n_draft", f"{what} on this machine" + (" (a tie: the intervals overlap)" if rec.tie else ""),
              key="n_draft", value=rec.choice)
    return [Finding("n_draft", INFO, MEDIUM if rec.tie else HIGH, title, (ev_advice, *ev_cats), fix, link,
                    subject="n_draft", expected=rec.choice, actual=n_draft)]


def broken_finding(report: TraceReport, x: Explanation, *, trace: str) -> Finding | None:
    """A low-confidence ``weights`` warning when drafts are almost never accepted (acceptance under
    :data:`BROKEN_RATE` over at least :data:`MIN_GROUP_DRAFTS` x 5 drafts): no trained drafter that loads and pairs
    drafts that badly, so something the checks above do not see (a tensor's values, a conversion) is wrong. None
    otherwise."""
    rate, n = report.acceptance_rate, report.n_drafted
    if rate is None or n < 5 * MIN_GROUP_DRAFTS or rate >= BROKEN_RATE:
        return None
    ts = x.rejections.target_side
    hard, wrong = ts.hard, ts.wrong
    side = f"; {_pct(wrong / (hard + wrong))} of first misses are tokens the target was sure of" if hard + wrong else ""
    sev, conf = weights_severity()
    return Finding("weights", sev, conf, f"drafts are almost never accepted ({rate:.3f} of {n}): the drafter's "
                   "values or their conversion, which no check above pins down",
                   (Evidence("explain", f"acceptance rate {rate:.3f} over {n} drafted tokens (a trained drafter that loads "
                             f"and pairs is accepted far more often){side}", {"acceptance_rate": rate, "n_drafted": n}),),
                   Fix("reconvert", "compare with a reference (--reference HF_DIR or --reference-assistant GOOD.gguf) "
                       "and `mtpscope diff` the two files; reconvert"),
                   ViewRef.of("explain", trace=trace, prompt="all"), subject="weights", expected=None, actual=rate)


def sure_shares(causes: pd.DataFrame | None, *, hard_entropy: float = HARD_ENTROPY_NATS) -> dict[str, Any] | None:
    """How the drafter's misses split between tokens the target was sure of and hard ones, over the steps the target
    judged: every accepted step and every round's first miss whose target token is known (not past an
    end-of-generation token), with a known target entropy. Sure: entropy under ``hard_entropy`` nats (explain's
    ``target_side`` ``wrong``), hard: at least that (``hard``).

    Args:
        causes: :func:`mtpscope.traces.analysis.explain.step_causes` (``accepted``, ``first_mismatch``,
            ``target_token``, ``target_entropy``, ``target_side``), one row per draft step.

    Returns:
        ``{"judged_sure", "judged_hard", "missed_sure", "missed_hard"}`` (counts of steps), ``share_missed_sure``
        (``missed_sure / (missed_sure + missed_hard)``), ``share_judged_sure`` (``judged_sure / (judged_sure +
        judged_hard)``), ``p_miss_sure`` / ``p_miss_hard`` (misses / judged, per side; None with none judged) and
        ``ratio`` (``share_missed_sure / share_judged_sure``); None when no step was judged or nothing was missed.
    """
    if causes is None or not len(causes) or "target_entropy" not in causes.columns:
        return None
    ent = np.asarray(causes["target_entropy"], dtype=np.float64)
    known = ~np.isnan(ent)
    acc = np.asarray(causes["accepted"], dtype=bool) & known
    side = np.asarray(causes["target_side"].astype(object).where(causes["target_side"].notna(), ""), dtype=object)
    tt = np.asarray(causes["target_token"].notna(), dtype=bool)
    miss = np.asarray(causes["first_mismatch"], dtype=bool) & tt & known & np.isin(side, ("hard", "wrong"))
    sure = ent < hard_entropy
    js, jh = int((acc & sure).sum() + (miss & sure).sum()), int((acc & ~sure).sum() + (miss & ~sure).sum())
    ms, mh = int((miss & sure).sum()), int((miss & ~sure).sum())
    if js + jh == 0 or ms + mh == 0:
        return None
    share_m, share_j = ms / (ms + mh), js / (js + jh)
    return {"judged_sure": js, "judged_hard": jh, "missed_sure": ms, "missed_hard": mh,
            "share_missed_sure": share_m, "share_judged_sure": share_j,
            "p_miss_sure": ms / js if js else None, "p_miss_hard": mh / jh if jh else None,
            "ratio": share_m / share_j if share_j else None}


def sure_miss_finding(x: Explanation, *, trace: str) -> Finding | None:
    """The behaviour pointing at the drafter: a ``weights`` warning of low confidence (:func:`weights_severity`
    without a reference) when the share of first misses on tokens the target was sure of is at least
    :data:`SURE_MISS_RATIO` of the sure share of the judged steps (:func:`sure_shares`: a healthy drafter misses
    mostly hard tokens), over at least :data:`MIN_GROUP_DRAFTS` first misses and as many sure steps. None otherwise."""
    sh = sure_shares(x.causes)
    if sh is None or sh["ratio"] is None or sh["missed_sure"] + sh["missed_hard"] < MIN_GROUP_DRAFTS \
            or sh["judged_sure"] < MIN_GROUP_DRAFTS or sh["ratio"] < SURE_MISS_RATIO:
        return None
    ms, n_m = sh["missed_sure"], sh["missed_sure"] + sh["missed_hard"]
    n_j = sh["judged_sure"] + sh["judged_hard"]
    p_h = "n/a" if sh["p_miss_hard"] is None else _pct(sh["p_miss_hard"])
    sev, conf = weights_severity()
    ev = Evidence("explain", f"{_pct(sh['share_missed_sure'])} of first misses ({ms} of {n_m}) are tokens the target "
                  f"was sure of (entropy < {HARD_ENTROPY_NATS:g} nat), against {_pct(sh['share_judged_sure'])} of the "
                  f"{n_j} steps it judged ({sh['judged_sure']} sure): the drafter misses {_pct(sh['p_miss_sure'])} of "
                  f"the sure tokens and {p_h} of the hard ones. A drafter that reads the target's state misses mostly "
                  "hard tokens; one blind to it would miss sure tokens in the share they are judged "
                  f"({_pct(sh['share_judged_sure'])}); at least {SURE_MISS_RATIO:g} of that share "
                  f"({_pct(SURE_MISS_RATIO * sh['share_judged_sure'])}) points at the drafter's weights",
                  {**sh, "threshold_ratio": SURE_MISS_RATIO})
    return Finding("weights", sev, conf, f"the drafter misses tokens the target was sure of: "
                   f"{_pct(sh['share_missed_sure'])} of first misses ({ms} of {n_m}) where "
                   f"{_pct(sh['share_judged_sure'])} of the judged steps are sure (it misses "
                   f"{_pct(sh['p_miss_sure'])} of sure tokens, {p_h} of hard ones): its weights or their conversion, "
                   "which no check here could pin", (ev,),
                   Fix("reconvert", "settle it with a reference: --reference HF_DIR (the checkpoint it was converted "
                       "from) or --reference-assistant GOOD.gguf, or `mtpscope diff THIS.gguf GOOD.gguf --values` "
                       "against a good conversion; reconvert where they differ"),
                   ViewRef.of("explain", trace=trace, prompt="all"), subject="weights", expected=None,
                   actual=sh["share_missed_sure"])


def limit_finding(x: Explanation, report: TraceReport, *, trace: str) -> tuple[Finding | None, list[str]]:
    """The ``acceptance_limit`` note (its title: the first of :func:`limit_sentences`) and every sentence."""
    lines = limit_sentences(x, report)
    if not lines:
        return None, []
    ev = [Evidence("explain", s) for s in lines]
    return Finding("acceptance_limit", INFO, MEDIUM, lines[0], tuple(ev), Fix("none", "nothing to change in the files "
                   "or the runtime for this: a better-trained drafter, or prompts the target is sure of"),
                   ViewRef.of("explain", trace=trace, prompt="all"), subject="acceptance"), lines


def summary(x: Explanation, report: TraceReport) -> dict[str, Any]:
    """The trace's numbers for the diagnosis' ``summary`` and the figures (JSON-able: the records' ``to_dict()``):
    acceptance, per position, by category and class, the first misses' causes and sides, the what-if rows and the
    recommendation."""
    wi, adv = x.what_if, x.advice
    return {"acceptance_rate": report.acceptance_rate, "mean_acceptance_length": report.mean_acceptance_length,
            "n_prompts": report.n_prompts, "n_rounds": report.n_rounds, "n_drafted": report.n_drafted,
            "n_accepted": report.n_accepted, "per_position": [p.to_dict() for p in report.per_position],
            "by_category": None if x.by_category is None else {k: v.to_dict() for k, v in x.by_category.items()},
            "by_class": None if x.by_class is None else {k: v.to_dict() for k, v in x.by_class.items()},
            "causes": dict(x.rejections.causes), "target_side": x.rejections.target_side.to_dict(),
            "what_if": None if wi is None else [r.to_dict() for r in wi.rows],
            "best_n_draft": None if wi is None else wi.best_n_draft,
            "recommendation": None if adv is None else adv.recommendation.to_dict()}


__all__ = ["BROKEN_RATE", "MARGINAL_MIN", "MIN_GROUP_DRAFTS", "SURE_MISS_RATIO", "UNPINNED", "broken_finding",
           "depth_gain", "limit_finding", "limit_sentences", "n_draft_findings", "summary", "sure_miss_finding",
           "sure_shares"]
