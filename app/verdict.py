"""The start page's answer, pure (no Streamlit): for the open trace(s), whether a defect was found and
which, the acceptance rate against what it is compared with, the worst prompt category and prompt, and
the advice, each in one sentence.

Only cheap facts go in (:class:`TraceFacts`: the trace report's counts, per-prompt counts, ``verify`` of
the drafter that recorded the trace, the explanation's recommendation, a diagnosis already saved for the
trace); the 20-second ``diagnose`` is never run here: without a saved diagnosis the verdict says what the
file checks found and points to Diagnose.

Rules (:func:`start_verdict`):

- a defect: a saved diagnosis with a defect (its headline), else a drafter that fails ``verify`` (its
  first error); the trace named is the one to diagnose (``suspect``);
- acceptance: trace A against trace B in percentage points when both are open (``B − A``), else the
  recommendation's speed of MTP against plain decoding;
- worst category: the lowest pooled acceptance rate (accepted / drafted over its prompts), ties by name;
  worst prompt: the lowest rate among that category's prompts (every prompt when the trace has no
  categories), ties by prompt id; prompts that drafted nothing are left out;
- advice: the recommendation's label (:func:`mtpscope.app.views.recommendation_label`, which names what a
  tie is with) and its headline, for trace A.

Imports: ``app.formats``, ``app.views``, ``traces.analysis.advice`` (types).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from mtpscope.app.formats import percent, points
from mtpscope.app.views import recommendation_label
from mtpscope.traces.analysis import rates
from mtpscope.traces.analysis.advice import Recommendation
from mtpscope.traces.analysis.ordering import worst_first_key


@dataclass(frozen=True)
class PromptCounts:
    """One prompt's drafted / accepted tokens.

    Attributes:
        prompt_id: the trace's prompt id.
        category: the prompts file's category, or None.
        n_drafted / n_accepted: drafted tokens and those accepted (``metrics.per_prompt``).
    """

    prompt_id: int
    category: str | None
    n_drafted: int
    n_accepted: int

    @property
    def acceptance_rate(self) -> float | None:
        """``n_accepted / n_drafted`` (:func:`traces.analysis.rates.acceptance_rate`); None when nothing was drafted."""
        return rates.acceptance_rate(self.n_accepted, self.n_drafted)

    def to_dict(self) -> dict[str, Any]:
        """``{prompt_id, category, n_drafted, n_accepted, acceptance_rate}``."""
        return {**asdict(self), "acceptance_rate": self.acceptance_rate}


@dataclass(frozen=True)
class TraceFacts:
    """The cheap facts of one open trace.

    Attributes:
        role: ``trace A`` or ``trace B`` (as the sidebar names them).
        path: the trace folder; name: how the page shows it (a short path).
        drafter: how the page shows the drafter that recorded it, or None (the manifest names none).
        acceptance_rate: the trace report's accepted / drafted, or None (nothing drafted).
        prompts: per-prompt counts.
        verify_ok: ``verify`` of the recording drafter (paired with its target) passed; None: not checked.
        verify_error: its first error in one line (``E_PAIR_ROPE rope.freq_base_swa: …``), or None.
        recommendation: the explanation's recommendation (trace A), or None.
        diagnosis_defect / diagnosis_headline: a diagnosis saved for this trace (defect found or not, its
            headline), or None when there is none.
    """

    role: str
    path: str
    name: str
    drafter: str | None = None
    acceptance_rate: float | None = None
    prompts: tuple[PromptCounts, ...] = ()
    verify_ok: bool | None = None
    verify_error: str | None = None
    recommendation: Recommendation | None = None
    diagnosis_defect: bool | None = None
    diagnosis_headline: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The facts as JSON (the recommendation by its ``to_dict``)."""
        d = {k: v for k, v in asdict(self).items() if k not in ("prompts", "recommendation")}
        d["prompts"] = [p.to_dict() for p in self.prompts]
        d["recommendation"] = None if self.recommendation is None else self.recommendation.to_dict()
        return d


@dataclass(frozen=True)
class Worst:
    """A trace's worst prompt category and prompt.

    Attributes:
        category: the category with the lowest pooled acceptance rate, or None (no categories).
        category_rate: its rate.
        prompt_id: the worst prompt (within ``category`` when there is one), or None (nothing drafted).
        prompt_rate: its rate.
    """

    category: str | None = None
    category_rate: float | None = None
    prompt_id: int | None = None
    prompt_rate: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """``{category, category_rate, prompt_id, prompt_rate}``."""
        return asdict(self)


@dataclass(frozen=True)
class StartVerdict:
    """The start page's answer.

    Attributes:
        defect: True (a defect was found), False (none by the checks that ran), None (nothing checked).
        sentence: the verdict in one sentence.
        suspect: the trace whose drafter has the defect, else the one to diagnose first (the lower
            acceptance), or None.
        acceptance: acceptance with what it is compared with, one sentence.
        advice: n_draft or plain decoding for trace A and against what, one sentence, or None.
        worst: per trace path, its :class:`Worst`.
        checked: what the verdict rests on, in words (``verify of both drafters; no saved diagnosis``).
    """

    defect: bool | None
    sentence: str
    suspect: str | None
    acceptance: str
    advice: str | None
    worst: dict[str, Worst] = field(default_factory=dict)
    checked: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The verdict as JSON."""
        return {"defect": self.defect, "sentence": self.sentence, "suspect": self.suspect,
                "acceptance": self.acceptance, "advice": self.advice, "checked": self.checked,
                "worst": {k: w.to_dict() for k, w in self.worst.items()}}


#: a rate as the app writes it (``34.8 %``; ``—`` for None): :func:`mtpscope.app.formats.percent`, the one rule
pct = percent


def worst(prompts: Sequence[PromptCounts]) -> Worst:
    """The worst category (lowest pooled rate; ties by name) and its worst prompt (lowest rate; ties by
    prompt id); prompts that drafted nothing left out. Without categories, the worst prompt of all."""
    drafted = [p for p in prompts if p.n_drafted > 0]
    if not drafted:
        return Worst()
    cats: dict[str, list[int]] = {}
    for p in drafted:
        if p.category is not None:
            c = cats.setdefault(p.category, [0, 0])
            c[0] += p.n_accepted
            c[1] += p.n_drafted
    cat: str | None = None
    cat_rate: float | None = None
    if cats:
        cat = min(cats, key=lambda c: (rates.nan_if_none(rates.acceptance_rate(*cats[c])), c))
        cat_rate = rates.acceptance_rate(*cats[cat])
    pool = [p for p in drafted if cat is None or p.category == cat]
    w = min(pool, key=lambda p: (rates.nan_if_none(p.acceptance_rate), p.prompt_id))
    return Worst(cat, cat_rate, w.prompt_id, w.acceptance_rate)


def first_error_line(report: Any) -> str | None:
    """A ``verify`` report's first error as one line, ``CODE message`` (``E_PAIR_ROPE rope.freq_base_swa: drafter
    1000000.0, target 10000.0; …``); None when it has no error. ``report``: an
    :class:`mtpscope.inspector.findings.Report` (read by attribute: ``errors``, each with ``code`` and
    ``message``)."""
    errs = tuple(getattr(report, "errors", ()) or ())
    return f"{errs[0].code} {errs[0].message}" if errs else None


def verify_banner(role: str, drafter: str | None, error: str | None) -> str:
    """The one line a trace page shows when the drafter that recorded its trace fails ``verify``:
    ``Trace A's drafter `x.gguf` fails verify: E_… — the rejections shown may come from this defect, not from
    hard tokens (Validate page).``"""
    who = f"{role[:1].upper()}{role[1:]}'s drafter" + (f" `{drafter}`" if drafter else "")
    return (f"{who} fails verify: {error or 'see the Validate page'} — the rejections shown may come from this "
            "defect, not from hard tokens (details on the Validate page).")


def no_worst_words(f: TraceFacts) -> str:
    """The start page's line for a trace with no worst prompt to name: a trace of llama-server requests (no
    per-prompt rounds; its acceptance rate comes from the request rows), or one where no prompt drafted a token."""
    if not f.prompts and f.acceptance_rate is not None:
        return (f"{f.role}: llama-server requests, no rounds per prompt: no worst prompt to name (its acceptance rate "
                "comes from the request rows; the Acceptance page shows them).")
    return f"{f.role}: no prompt drafted a token."


def lost_parts_line(role: str, skipped: Sequence[str]) -> str | None:
    """The one line every trace page shows above itself when the trace's reader skipped part files (missing, or
    unreadable: ``Trace.skipped``, their paths relative to the trace), None when it skipped none, e.g. ``Trace A
    lost 1 part file (rounds/part-00001.parquet: missing or unreadable): the numbers cover the rest; the Files
    page lists why.``"""
    if not skipped:
        return None
    who = f"{role[:1].upper()}{role[1:]}"
    n = len(skipped)
    names = ", ".join(skipped[:3]) + (f" and {n - 3} more" if n > 3 else "")
    return (f"{who} lost {n} part file{'' if n == 1 else 's'} ({names}: missing or unreadable): the numbers cover "
            "the rest; the Files page lists why.")


def trace_state_line(role: str, manifest: Mapping[str, Any]) -> str | None:
    """The one line a trace page shows above itself when its trace is not complete (None when it is): why, from
    the manifest (``aborted``: llama.cpp's death, where and its message; ``recovered``: rounds recovered from the
    write-ahead log of an interrupted run, and any log kept as damaged; else still being written or stopped
    early), e.g. ``Trace A is incomplete: llama.cpp died at prompt 0, round 3 (SIGABRT) — the numbers cover the
    rounds recorded before.``"""
    if manifest.get("complete") is not False:
        return None
    who = f"{role[:1].upper()}{role[1:]}"
    ab, rec = manifest.get("aborted"), manifest.get("recovered")
    if isinstance(ab, Mapping):
        if isinstance(ab.get("how"), str):      # the recorder's own words (`record`'s error line says the same)
            why = f"llama.cpp {ab['how']} {ab.get('where') or ''}".rstrip()
        else:                                   # (a recording from before the manifest kept them)
            how = ab.get("signal") or (f"exit code {ab['exit_code']}" if ab.get("exit_code") is not None else None)
            why = f"llama.cpp died {ab.get('where') or ''}".rstrip() + (f" ({how})" if how else "")
    elif isinstance(rec, Mapping):
        n = rec.get("n_rounds")
        why = (f"the run was interrupted; {n if isinstance(n, int) else 'its last'} round{'' if n == 1 else 's'} "
               "came back from its write-ahead log")
        probs = rec.get("problems")
        if isinstance(probs, list) and probs:
            why += f", {len(probs)} log{'' if len(probs) == 1 else 's'} could not be read to the end (Files page)"
    else:
        why = "still being written, or the run stopped early"
    return f"{who} is incomplete: {why} — the numbers cover the rounds recorded before."


def advice_line(rec: Recommendation | None, role: str = "trace A") -> str | None:
    """The advice in one sentence: the recommendation's label (which names what a tie is with) and its
    headline (the speed against plain decoding), ``Advice for trace A: n_draft 3 (a tie with n_draft 2) — …``;
    the headline alone when it starts with the choice already (``Advice for trace A: plain decoding (best MTP:
    …), a tie between plain decoding and n_draft 1.``: it names the tie too), as when there is no choice (``too few
    rounds to tell …``); None without a recommendation."""
    if rec is None:
        return None
    why = rec.headline or rec.reason
    choice = recommendation_label(replace(rec, tie=False))
    if why and (rec.choice is None or why == choice or why.startswith(choice + " ")):   # (no choice: why says why)
        line = f"Advice for {role}: {why}"
    else:
        line = f"Advice for {role}: {recommendation_label(rec)}" + (f" — {why}" if why else "")
    return line if line.endswith(".") else line + "."


def _who(t: TraceFacts) -> str:
    return f"{t.role}'s drafter" + (f" `{t.drafter}`" if t.drafter else "")


def start_verdict(traces: Sequence[TraceFacts]) -> StartVerdict:
    """The verdict for the open traces (trace A first, then trace B when one is open); rules in the module
    docstring.

    Raises:
        ValueError: no trace given.
    """
    if not traces:
        raise ValueError("start_verdict needs one trace at least (trace A)")
    a = traces[0]
    b = traces[1] if len(traces) > 1 else None
    diag = [t for t in traces if t.diagnosis_defect]
    failing = [t for t in traces if t.verify_ok is False]
    if diag:
        t = diag[0]
        defect: bool | None = True
        sentence = f"Defect found in {t.role} (`{t.name}`) by its saved diagnosis: {t.diagnosis_headline}"
        suspect: str | None = t.path
    elif failing:
        t = failing[0]
        defect = True
        sentence = f"Defect found: {_who(t)} fails verify — {t.verify_error or 'see the Validate page'}"
        suspect = t.path
    else:
        checked_any = any(t.verify_ok is not None or t.diagnosis_defect is not None for t in traces)
        defect = False if checked_any else None
        low = min(traces, key=lambda t: worst_first_key(t.acceptance_rate))
        suspect = low.path
        if checked_any:
            sentence = ("No defect found by the file checks (verify of the recording drafter"
                        + ("s" if len(traces) > 1 else "") + "); Diagnose replays the rounds to look further")
        else:
            sentence = "Not checked: the drafter that recorded the trace is not readable here; Diagnose can look"
    if not sentence.endswith("."):
        sentence += "."
    if b is not None:
        if a.acceptance_rate is not None and b.acceptance_rate is not None:
            acceptance = (f"Acceptance rate {pct(a.acceptance_rate)} on trace A (`{a.name}`) against "
                          f"{pct(b.acceptance_rate)} on trace B (`{b.name}`): B "
                          f"{points(b.acceptance_rate - a.acceptance_rate)}.")
        else:
            acceptance = (f"Acceptance rate {pct(a.acceptance_rate)} on trace A (`{a.name}`), "
                          f"{pct(b.acceptance_rate)} on trace B (`{b.name}`).")
    else:
        acceptance = f"Acceptance rate {pct(a.acceptance_rate)} on trace A (`{a.name}`)"
        rec = a.recommendation
        if rec is not None and rec.speedup is not None and rec.choice not in (None, "plain"):
            acceptance += f": MTP at n_draft {rec.choice} runs {rec.speedup:.2f}× the speed of plain decoding."
        else:
            acceptance += ("; no other trace is open to compare it with (choose trace B on the Files page); "
                           "against plain decoding: the advice.")
    advice = advice_line(a.recommendation)
    verified = " and ".join(t.role for t in traces if t.verify_ok is not None)
    diagnosed = " and ".join(t.role for t in traces if t.diagnosis_defect is not None)
    checked = "; ".join([f"verify of the drafter of {verified}" if verified else "no drafter could be verified",
                         f"the saved diagnosis of {diagnosed}" if diagnosed
                         else "no saved diagnosis (Diagnose runs one)"])
    return StartVerdict(defect, sentence, suspect, acceptance, advice,
                        {t.path: worst(t.prompts) for t in traces}, checked)


__all__ = ["PromptCounts", "StartVerdict", "TraceFacts", "Worst", "advice_line", "first_error_line", "pct", "start_verdict",
           "lost_parts_line", "no_worst_words", "trace_state_line", "verify_banner", "worst"]
