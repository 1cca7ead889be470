"""The explanation of one trace, all sections together: rejections and their causes, acceptance by
token class / channel / category, drift, what-if n_draft. One job: compose the pure analyses
(:mod:`traces.analysis.explain`, :mod:`traces.analysis.breakdown`, :mod:`traces.analysis.what_if`, :mod:`traces.analysis.drift`) over a
trace's frames, and give the JSON that ``mtpscope explain --json`` and ``mtpscope report --json`` print
(keys in docs/EXPLAIN.md).

:func:`explain` is pure (frames and manifest in, :class:`Explanation` out); :func:`explain_trace` reads
the columns it needs from an opened :class:`traces.store.reader.Trace` first (and the hidden states for drift).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from mtpscope.errors import TraceError, TraceFormatError
from mtpscope.traces.analysis import breakdown as B
from mtpscope.traces.analysis import explain as E
from mtpscope.traces.analysis.advice import Advice, advise
from mtpscope.traces.analysis.costs import CostProbe, PlainBaseline, manifest_baseline
from mtpscope.traces.analysis.metrics import per_position_acceptance, totals
from mtpscope.traces.analysis.positions import positions
from mtpscope.traces.analysis.report_records import Totals
from mtpscope.traces.analysis.timing_quality import timing_quality
from mtpscope.traces.analysis.token_classes import CHANNELS, CLASSES, Classifier, piece_text
from mtpscope.traces.analysis.vocab import TYPE_NORMAL, Vocab
from mtpscope.traces.analysis.what_if import WhatIf, what_if
from mtpscope.traces.store.protocols import TraceLike

if TYPE_CHECKING:
    from mtpscope.traces.analysis.drift import Drift

ROUNDS_COLUMNS = ["prompt_id", "round", "pos", "pending_token", "n_draft", "n_accepted", "drafted", "target",
                  "emitted", "t_draft_ms", "t_verify_ms", "eog_confirmed"]


def token_label(vocab: Vocab | None) -> Callable[[int], str]:
    """id -> the token's text (``▁`` as a space, a byte token as its byte; special tokens as written),
    ``#id`` without a vocabulary or out of range."""
    if vocab is None:
        return lambda t: f"#{int(t)}"

    def lab(t: int) -> str:
        p = vocab.piece(int(t))
        if p is None:
            return f"#{int(t)}"
        ty = vocab.token_type(int(t))
        return piece_text(p, ty) if ty in (TYPE_NORMAL, 6) else p

    return lab


#: sources of llama-server request traces (one row per request, no rounds: docs/SERVER.md)
REQUEST_SOURCES = ("server-probe", "server-log")


def is_request_trace(manifest: Mapping[str, Any]) -> bool:
    """A llama-server request trace (a probe, an imported server log: docs/SERVER.md): its manifest counts no round,
    and counts requests or names a request source (:data:`REQUEST_SOURCES`). The one test: ``explain`` and
    :func:`request_trace_note` use it."""
    counts = manifest.get("counts") or {}
    return not counts.get("n_rounds") and bool(counts.get("n_requests") or manifest.get("source") in REQUEST_SOURCES)


def request_trace_note(manifest: Mapping[str, Any], trace: str = "TRACE") -> str | None:
    """What a llama-server request trace (``trace``: its folder, for the command lines) cannot explain and where to
    look instead, one line; None for a trace that is not one (:func:`is_request_trace`)."""
    if not is_request_trace(manifest):
        return None
    return ("a llama-server request trace: it holds each request's counts, not its rounds, so why drafts were "
            "rejected, acceptance by token class or category, drift and which n_draft need a recording (`mtpscope "
            f"record`, or `mtpscope probe --replay`); one row per request: `mtpscope explain {trace} --by request`")


def no_vocab_note(manifest: Mapping[str, Any]) -> str:
    """Why a trace has no vocabulary (:func:`traces.analysis.vocab.trace_vocab` found none): its recorded GGUFs are
    not at their recorded paths, its models are Hugging Face checkpoints (``dialect: "hf"``: no GGUF token list;
    HF and MLX recordings), or it records none (imports, probes)."""
    models = manifest.get("models") or {}
    entries = [models[r] for r in ("target", "assistant") if isinstance(models.get(r), Mapping) and models[r].get("path")]
    if entries and all(e.get("dialect") == "hf" for e in entries):
        why = "the trace's models are Hugging Face checkpoints, which hold no GGUF token list"
    elif entries:
        why = "the recorded target GGUF is not at its recorded path"
    else:
        why = "the trace records no target GGUF"
    return f"no vocabulary ({why}; pass --vocab): acceptance by token class is not available"


def drafting_head(manifest: Mapping[str, Any]) -> str:
    """``"centroid"`` when the manifest says the drafts came from the sparse head (``params.head`` /
    ``params.draft_head`` == ``"centroid"``), else ``"dense"`` (llama.cpp's runtime drafts with the
    dense head; ``--centroids`` only scores the sparse head alongside)."""
    params = manifest.get("params") or {}
    for key in ("draft_head", "head"):
        if params.get(key) == "centroid":
            return "centroid"
    return "dense"


def select_prompt(manifest: Mapping[str, Any], prompt: str | int) -> int:
    """The prompt_id named by ``prompt``: a prompt ``id`` from the manifest (prompts files), else an
    integer prompt_id.

    Raises:
        TraceError: no such prompt (the message lists the ids and the prompt_id range there are), or an id that
            two prompts share (the message names their prompt_ids).
    """
    entries = [p for p in manifest.get("prompts") or [] if isinstance(p, dict)]
    pids = [int(p.get("prompt_id", i)) for i, p in enumerate(entries)]
    named = [pid for pid, p in zip(pids, entries, strict=True)
             if p.get("id") is not None and str(p.get("id")) == str(prompt)]
    if len(named) > 1:
        raise TraceError(f"the id {str(prompt)!r} names {len(named)} prompts: give a prompt_id instead", key="prompt",
                         expected="one of prompt_id " + ", ".join(map(str, named)), actual=prompt)
    if named:
        return named[0]
    try:
        pid = int(prompt)
    except (TypeError, ValueError):
        pid = None
    if pid is None or (pids and pid not in pids):
        raise TraceError("no such prompt in the trace", key="prompt", expected=_prompt_choices(entries, pids),
                         actual=prompt)
    return pid


def _prompt_choices(entries: list[dict[str, Any]], pids: list[int]) -> str:
    """What ``--prompt`` accepts in a trace, in words: its prompt ids (the first 10) and its prompt_ids."""
    ids = list(dict.fromkeys(str(p["id"]) for p in entries if p.get("id") is not None))
    parts = []
    if ids:
        more = f" and {len(ids) - 10} more" if len(ids) > 10 else ""
        parts.append(f"an id ({', '.join(ids[:10])}{more})")
    if pids:
        lo, hi = min(pids), max(pids)
        span = f"{lo}..{hi}" if sorted(pids) == list(range(lo, hi + 1)) else ", ".join(map(str, sorted(pids)))
        parts.append(f"a prompt_id ({span})")
    return " or ".join(parts) or "a prompt id"


@dataclass(frozen=True)
class Explanation:
    """Everything :func:`explain` found.

    Attributes:
        causes: :func:`traces.analysis.explain.step_causes` (one row per step; empty without steps).
        first_mismatches: :func:`traces.analysis.explain.first_mismatches`.
        rejections: :class:`traces.analysis.explain.Rejections` (:func:`traces.analysis.explain.rejection_summary`).
        by_class / by_channel: ``{name: breakdown.Acceptance}`` or None when not available (no vocabulary;
            not a chat trace).
        by_category: ``{category: breakdown.CategoryAcceptance}`` or None (no categories).
        by_class_position: ``{class: (breakdown.PositionAcceptance per k, ...)}`` or None.
        what_if: :class:`traces.analysis.what_if.WhatIf` or None (nothing drafted); its ``by_category`` holds
            each category's estimate.
        advice: :class:`traces.analysis.advice.Advice` (recommendation with plain decoding as a
            candidate, break-even; overall and per category) or None (nothing drafted).
        drift: :class:`traces.analysis.drift.Drift` or None (not captured).
        totals: :func:`traces.analysis.metrics.totals`.
        head: ``"dense"`` / ``"centroid"``.
        notes: what is missing and why, in words.
    """

    causes: pd.DataFrame
    first_mismatches: pd.DataFrame
    rejections: E.Rejections
    by_class: dict[str, B.Acceptance] | None
    by_class_position: dict[str, tuple[B.PositionAcceptance, ...]] | None
    by_channel: dict[str, B.Acceptance] | None
    by_category: dict[str, B.CategoryAcceptance] | None
    what_if: WhatIf | None
    advice: Advice | None
    drift: Drift | None
    totals: Totals
    head: str
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """The JSON sections (docs/EXPLAIN.md): ``rejections``, ``by_class``, ``by_class_position``,
        ``by_channel``, ``by_category``, ``drift``, ``what_if`` (list of rows), ``what_if_model``,
        ``what_if_by_category``, ``recommendation``, ``break_even``, ``candidates``, ``baseline``,
        ``timing_quality``, ``head``, ``notes``."""
        wi = self.what_if
        adv = self.advice.to_dict() if self.advice is not None else Advice.null_dict()

        def groups(g: Mapping[str, Any] | None) -> dict[str, Any] | None:
            return None if g is None else {name: a.to_dict() for name, a in g.items()}

        out: dict[str, Any] = _clean({
            "rejections": self.rejections.to_dict(),
            "by_class": groups(self.by_class),
            "by_class_position": None if self.by_class_position is None else {
                name: [r.to_dict() for r in rows] for name, rows in self.by_class_position.items()},
            "by_channel": groups(self.by_channel),
            "by_category": groups(self.by_category),
            "drift": None if self.drift is None else self.drift.to_dict(),
            "what_if": [r.to_dict() for r in wi.rows] if wi is not None else None,
            "what_if_model": None if wi is None else {k: v for k, v in wi.to_dict().items()
                                                      if k not in ("rows", "by_category")},
            "what_if_by_category": None if wi is None or not wi.by_category else {
                c: {"best_n_draft": w.best_n_draft, "n_rounds": w.n_rounds, "n_prompts": w.n_prompts,
                    "rows": [r.to_dict() for r in w.rows]} for c, w in wi.by_category.items()},
            **adv,
            "head": self.head,
            "notes": list(self.notes),
        })
        return out


def _clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return None if f != f or f in (float("inf"), float("-inf")) else f
    if isinstance(obj, np.bool_):
        return bool(obj)
    if obj is pd.NA:
        return None
    return obj


def explain(rounds: pd.DataFrame, steps: pd.DataFrame | None, manifest: Mapping[str, Any], *,
            vocab: Vocab | None = None, prompt_id: int | None = None, head: str | None = None,
            near_tie_gap: float = E.NEAR_TIE_GAP, drift: Drift | None = None,
            n_top_tokens: int = 10, baseline: PlainBaseline | None = None,
            category_field: str | None = None, categories: Mapping[int, str] | None = None) -> Explanation:
    """Every section for one trace (pure).

    Args:
        rounds: rounds frame (columns :data:`ROUNDS_COLUMNS`; missing list columns reduce what is known).
        steps: steps frame (:data:`traces.analysis.explain.STEP_COLUMNS` and, when recorded,
            ``target_p_drafted`` / ``target_entropy``), or None.
        manifest: the trace's manifest (prompts with ``category`` / ``tokens``, ``params.chat``, baseline).
        vocab: the vocabulary (for token classes and token text), or None.
        prompt_id: only this prompt.
        head: ``"dense"`` / ``"centroid"``; default :func:`drafting_head`.
        drift: a precomputed :func:`traces.analysis.drift.drift` (:class:`traces.analysis.drift.Drift`) to include.
        baseline: plain decoding measured elsewhere (a sweep's baseline task,
            :func:`traces.sweep.advice.trace_baseline`); default the manifest's ``baseline``
            (``record --baseline``), else estimated.
        category_field: take each prompt's category from this ``extra`` field of the manifest's prompt
            entries (``explain --category-field``).
        categories: ``{prompt_id: category}`` known from elsewhere (a sweep's ``sweep.json``), used when
            the manifest names none.

    Raises:
        TraceFormatError: rounds without the basic columns.
    """
    notes: list[str] = []
    if prompt_id is not None:
        rounds = rounds[rounds["prompt_id"].to_numpy() == prompt_id]
        if steps is not None:
            steps = steps[steps["prompt_id"].to_numpy() == prompt_id]
    rounds = rounds.reset_index(drop=True)
    request_note = request_trace_note(manifest) if prompt_id is None else None
    if not len(rounds):
        notes.append(request_note or "the trace has no rounds" + (" for this prompt" if prompt_id is not None else "")
                     + " (nothing was recorded, or its rounds parts were unreadable): nothing to explain")
    head = head or drafting_head(manifest)
    label = token_label(vocab)
    if steps is not None and len(steps):
        causes = E.step_causes(rounds, steps.reset_index(drop=True), head=head, near_tie_gap=near_tie_gap)
    else:
        causes = E.step_causes(rounds, pd.DataFrame({c: pd.Series(dtype="int64") for c in
                                                     ("prompt_id", "round", "k", "token")}), head=head)
        if len(rounds):
            notes.append("the trace has no steps table: causes come from the rounds alone (unknown)")
    fm = E.first_mismatches(rounds, causes)
    rej = E.rejection_summary(fm, n_top_tokens=n_top_tokens, label=label if vocab is not None else None)
    if steps is not None and "target_entropy" in steps.columns and steps["target_entropy"].notna().any():
        pass
    elif len(fm):
        notes.append("no target_p_drafted / target_entropy in this trace (recorded before they existed, or "
                     "imported): the hard-vs-wrong split is unknown")
    by_class = by_cp = by_channel = None
    have_emitted = "emitted" in rounds.columns and "pending_token" in rounds.columns
    if vocab is not None and have_emitted and len(rounds):
        pos = positions(rounds)
        params = manifest.get("params") or {}
        clf = Classifier(vocab, chat=bool(params.get("chat")))
        prefixes: dict[int, list[int] | str] = {}
        chat_ids: set[int] = set()
        for i, p in enumerate(manifest.get("prompts") or []):
            if not isinstance(p, dict):
                continue
            if isinstance(p.get("tokens"), list):       # the prompt read for context: its ids, else its text
                prefixes[int(p.get("prompt_id", i))] = [int(t) for t in p["tokens"] if isinstance(t, int)]
            elif isinstance(p.get("text"), str) and p["text"] and not params.get("chat"):
                prefixes[int(p.get("prompt_id", i))] = p["text"]
            if p.get("source") == "messages":
                chat_ids.add(int(p.get("prompt_id", i)))
        classes = B.classify_outputs(pos, clf, prefixes, chat_ids)
        cls, chan = B.draft_labels(pos, classes)
        by_class = B.by_label(pos, cls, CLASSES)
        by_cp = B.by_label_and_position(pos, cls, CLASSES)
        chan_s = pd.Series(chan)
        if params.get("chat") or chat_ids or ((chan_s != "none") & (chan_s != "unknown")).any():
            by_channel = B.by_label(pos, chan, (*CHANNELS, "unknown"))
        if not pos.sequences:
            notes.append("no prompt's output could be rebuilt (emitted unknown or rounds missing): classes unknown")
    elif vocab is None and not (request_note and not len(rounds)):   # a request trace has no tokens to classify
        notes.append(no_vocab_note(manifest))
    cats = B.prompt_categories(manifest, category_field)
    if cats is None and categories and category_field in (None, "category"):
        cats = {int(k): str(v) for k, v in categories.items()}
    if cats is None and category_field not in (None, "category"):
        notes.append(f"{B.missing_field_words(manifest, category_field)}: no categories")
    elif cats is None:
        note = B.category_note(manifest)
        if note:
            notes.append(note.replace("--category-field", "explain --category-field"))
    by_cat = B.by_category(rounds, cats) if cats is not None and len(rounds) else None
    wi = adv = None
    base = baseline if baseline is not None else manifest_baseline(manifest)
    mt = (manifest.get("params") or {}).get("max_tokens")
    if len(rounds) and (rounds["n_draft"].to_numpy() > 0).any():
        wi = what_if(rounds, categories=cats, baseline=base,
                     max_tokens=int(mt) if isinstance(mt, int) and not isinstance(mt, bool) else None,
                     probe=CostProbe.from_manifest(manifest))
        tq = timing_quality(rounds, wi.cost, base, CostProbe.from_manifest(manifest))
        adv = advise(wi, tq)
        note_k1 = _n_draft_1_note(wi, rounds)
        if note_k1:
            notes.append(note_k1)
        if wi.cost is not None and (base is None or not base.measured):
            notes.append("no plain decoding was measured for these prompts (record --baseline, sweep --baseline): "
                         "speedups are estimated from the price of a one-token verify (the trace's own median, "
                         "or the recorder's probe scaled to the trace, or a line through its verify costs)")
    return Explanation(causes=causes, first_mismatches=fm, rejections=rej, by_class=by_class,
                       by_class_position=by_cp, by_channel=by_channel, by_category=by_cat, what_if=wi,
                       advice=adv, drift=drift, totals=totals(rounds), head=head, notes=tuple(notes))


def _n_draft_1_note(wi: WhatIf, rounds: pd.DataFrame) -> str | None:
    """Why the estimate at n_draft 1 differs from this trace's P(accepted) at k = 1 (``report``'s per-position
    table, :func:`traces.analysis.metrics.per_position_acceptance`) when the trace drafted more than one
    token a round; None when they are the same thing (recorded at n_draft 1), equal to the 3 decimals the note would
    print, or either is unknown."""
    rec = [r.n_draft for r in wi.rows if r.recorded]
    one = next((r for r in wi.rows if r.n_draft == 1), None)
    if not rec or rec[0] <= 1 or one is None or one.acceptance_rate is None or not np.isfinite(one.acceptance_rate):
        return None
    pos = per_position_acceptance(rounds, max_k=1)
    p1 = pos["acceptance"].iloc[0] if len(pos) else None
    if p1 is None or not np.isfinite(p1) or f"{one.acceptance_rate:.3f}" == f"{p1:.3f}":
        return None             # (equal as printed: nothing to explain; a note saying they differ would not be read)
    return (f"n_draft 1's estimated acceptance rate ({one.acceptance_rate:.3f}) is not this trace's P(accepted) "
            f"at k = 1 ({p1:.4f}, `report`): at n_draft 1 every position starts a round, while this trace "
            f"(n_draft {rec[0]}) drafts a first draft only where a round starts, after a rejection or a fully "
            "accepted round (the position model: docs/EXPLAIN.md §4)")


def step_columns(trace: TraceLike) -> list[str]:
    """The steps columns :func:`explain` uses that this trace's schema has."""
    names = set(trace.schemas["steps"].names)
    return [c for c in E.STEP_COLUMNS + E.OPTIONAL_STEP_COLUMNS if c in names]


def explain_trace(trace: TraceLike, *, vocab: Vocab | None = None, prompt: str | int | None = None,
                  head: str | None = None, with_drift: bool = True, baseline: PlainBaseline | None = None,
                  category_field: str | None = None, categories: Mapping[int, str] | None = None) -> Explanation:
    """:func:`explain` of an opened trace (reads only the columns it needs; drift from the hidden columns
    when ``with_drift`` and the trace stores ``h_target``; ``baseline`` / ``category_field`` /
    ``categories`` as :func:`explain`).

    Raises:
        TraceError: ``prompt`` names no prompt of the trace.
        TraceFormatError: unreadable columns; a malformed ``cost_probe`` (:meth:`CostProbe.from_manifest`,
            checked first so that the error names the manifest file).
    """
    from mtpscope.traces.analysis.drift import trace_drift

    CostProbe.of_trace(trace)
    rounds = trace.columns("rounds", ROUNDS_COLUMNS)
    steps = trace.columns("steps", step_columns(trace)) if trace.part_files("steps") else None
    pid = select_prompt(trace.manifest, prompt) if prompt is not None else None
    dr = None
    if with_drift:
        try:
            dr = trace_drift(trace)
        except TraceFormatError:
            dr = None
    return explain(rounds, steps, trace.manifest, vocab=vocab, prompt_id=pid, head=head, drift=dr,
                   baseline=baseline, category_field=category_field, categories=categories)
