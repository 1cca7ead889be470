"""CLI commands: explain and compare (see docs/EXPLAIN.md).

``mtpscope explain TRACE [--json] [--prompt ID] [--vocab GGUF]``: why drafts were rejected, acceptance by
token class / channel / category, drift, which n_draft; worst first.
``mtpscope compare A B [--json] [--vocab GGUF]``: the aligned diff of two traces of the same prompts.

Exit codes: 0 ok; 1 the trace had unreadable parts that were skipped (explain) or the two runs' outputs
differ so only their common prefix was compared, or they cannot be compared: no prompt in common, or one has no
rounds (compare); 2 unreadable input (one line on stderr).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import typer

from mtpscope.cli.advice import format_advice
from mtpscope.cli.common import EXIT_FINDINGS, MISSING, one_line_errors, trace_head
from mtpscope.cli.common import fmt as _f
from mtpscope.traces.analysis.records import finite as _finite
from mtpscope.traces.analysis.wording import plural, visible
from mtpscope.traces.store.protocols import TraceLike

if TYPE_CHECKING:
    from mtpscope.traces.analysis.align import AlignedDiff
    from mtpscope.traces.analysis.breakdown import Acceptance, CategoryAcceptance
    from mtpscope.traces.analysis.costs import CostModel
    from mtpscope.traces.analysis.explain import TokenCount
    from mtpscope.traces.analysis.explain_report import Explanation
    from mtpscope.traces.analysis.report_records import Totals
    from mtpscope.traces.analysis.run_diff import DifferenceRow
    from mtpscope.traces.analysis.runtime_diff import Convention, RoundDifference, RuntimeDiff
    from mtpscope.traces.analysis.vocab import Vocab

MAX_STEP_LINES = 60


def _pct(n: int, total: int) -> str:
    return f"{100.0 * n / total:5.1f} %" if total else "    - "


@dataclass(frozen=True)
class ExplainHead:
    """What ``explain`` prints above the sections: the trace's folder, its ``source``, whether it is complete,
    the selected prompt_id (None: all) and the totals (:func:`traces.analysis.metrics.totals`)."""

    trace: str
    source: Any
    complete: bool
    prompt: int | None
    totals: Totals
    #: (rounds read, rounds the manifest counts) when a rounds part was missing or unreadable
    #: (:meth:`traces.store.reader.Trace.rounds_not_read`), else None
    rounds_read: tuple[int, int] | None = None


def _totals_json(t: Totals) -> dict[str, Any]:
    """The totals' JSON keys, NaN as None."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in t.to_dict().items()}


def _cost_lines(c: CostModel) -> list[str]:
    """The round costs as the what-if prices them (``*``: the trace's own median)."""
    verify, draft = c.priced_verify(), c.priced_draft()

    def sizes(priced: dict[int, float], own: list[int]) -> str:
        return ", ".join(f"{n}: {_f(v, '.2f')}{'*' if n in own else ''}" for n, v in priced.items())

    if c.probe is not None:
        ds = c.draft_scale
        how = (f"other sizes from the recorder's probe scaled to this trace, x{_f(c.verify_scale, '.2f')} "
               "(verify) / " + (f"x{_f(ds, '.2f')} (drafts)" if ds is not None else "drafts on a line (the probe has none)")
               + ("; sizes the probe lacks on lines through the trace's means"
                  if set(verify) - set(c.probe.verify_ms) or set(draft) - set(c.probe.draft_ms) else ""))
    else:
        how = "other sizes on lines through the trace's means (no probe in this trace)"
    return [f"  costs (ms, * the trace's own median; {how}):",
            f"    verify of n tokens  {sizes(verify, c.own('verify'))}",
            f"    k drafter steps     {sizes(draft, c.own('draft'))}",
            f"    plain decoding {_f(c.t_plain_ms, '.2f')} ms per token ({c.baseline})"]


def format_run_differences(rows: list[DifferenceRow], limit: int = 12) -> list[str]:
    """The runs' differences (:func:`traces.analysis.run_diff.difference_rows`) as text lines for ``compare``:
    one per parameter, metadata key, tensor or file note, at most ``limit`` (then how many more)."""
    if not rows:
        return ["runs: same parameters and models"]
    out = [f"runs differ in {plural(len(rows), 'item')} (`mtpscope diff A.gguf B.gguf` compares two models "
           "in full):"]
    out += [f"  {r.what} {r.name}: A {r.a}, B {r.b}" for r in rows[:limit]]
    if len(rows) > limit:
        out.append(f"  ... {len(rows) - limit} more (--json)")
    return out


def _fv(v: float | None, iv: tuple[float, float] | None, spec: str) -> str:
    """A value and its interval: ``0.534 [0.501, 0.570]``."""
    if v is None:
        return MISSING
    return f"{format(v, spec)} [{format(iv[0], spec)}, {format(iv[1], spec)}]" if iv else format(v, spec)


def _tok(t: TokenCount) -> str:
    return f"“{visible(t.text)}”" if t.text is not None else f"#{t.token}"


def _rate_table(title: str, groups: Mapping[str, Acceptance | CategoryAcceptance] | None) -> list[str]:
    if not groups:
        return []
    from mtpscope.traces.analysis.ordering import worst_first_key

    rows = sorted(groups.items(), key=lambda kv: (worst_first_key(_finite(kv[1].acceptance_rate)), kv[0]))
    out = ["", f"{title} (worst first)",      # (the column names over the columns, whatever the title's length)
           f"  {'':<22} {'drafted':>9} {'accepted':>9}  {'acceptance rate':>15}"]
    for name, g in rows:
        out.append(f"  {name:<22} {g.n_drafted:9d} {g.n_accepted:9d}  {_f(_finite(g.acceptance_rate)):>15}")
    return out


def format_explanation(head: ExplainHead, x: Explanation, sentences: list[str] | None = None) -> str:
    """An :class:`traces.analysis.explain_report.Explanation` and its ``head`` (trace, totals) as terminal text."""
    t = head.totals
    read, recorded = head.rounds_read if head.rounds_read is not None else (None, None)
    lines = [trace_head(head.trace, head.source, head.complete, n_read=read, n_recorded=recorded, upper=True)
             + (f", prompt {head.prompt}" if head.prompt is not None else ""),
             f"acceptance rate {_f(t.acceptance_rate, '.4f')} ({t.n_accepted} / {t.n_drafted} drafted), "
             f"mean acceptance length {_f(t.mean_acceptance_length)}; drafts from the {x.head} head"]
    rej = x.rejections
    n = rej.n_first_mismatch
    lines += ["", f"Why drafts were rejected: {plural(rej.n_rounds_rejected, 'round')} had a first mismatch "
                  f"({n} with a known target token)"]
    # a first mismatch whose target token the trace lacks (an import) is cause `unknown` (docs/EXPLAIN.md §1): the
    # causes count the known ones, so those rounds join `unknown` here and every share is of all rejected rounds
    counts = dict(rej.causes)
    if rej.n_rounds_rejected > n:
        counts["unknown"] = int(counts.get("unknown") or 0) + rej.n_rounds_rejected - n
    causes = sorted(((c, v) for c, v in counts.items() if v), key=lambda cv: (-cv[1], cv[0]))
    for c, v in causes:
        lines.append(f"  {c:<14} {v:7d}  {_pct(v, rej.n_rounds_rejected)}")
    hist = rej.rank_histogram
    if any(hist.values()):
        lines.append("  target token's rank under the drafter at the first mismatch: "
                     + ", ".join(f"{b}: {v}" for b, v in hist.items() if v))
    for p in rej.by_position:
        if p.n:
            cs = ", ".join(f"{c} {v}" for c, v in sorted(p.causes.items(), key=lambda cv: -cv[1]) if v)
            lines.append(f"  k={p.k}: {p.n} ({cs})")
    ts = rej.target_side
    if ts.hard or ts.wrong:
        eog = int(rej.causes.get("after_eog") or 0)   # past the end of generation: the target judged nothing
        lines.append(f"  target side: hard (target unsure, entropy >= 1 nat) {ts.hard}, wrong (target sure) "
                     f"{ts.wrong}, unknown {ts.unknown}" + (f", none after the end of generation {eog}" if eog else "")
                     + f"; mean p(drafted) hard {_f(_finite(ts.p_drafted_mean_hard))}, "
                       f"wrong {_f(_finite(ts.p_drafted_mean_wrong))}")
    if rej.sparse_unreachable is not None:
        lines.append(f"  the centroid head could not have drafted {rej.sparse_unreachable} of these target "
                     "tokens either (not among its candidates)")
    if rej.top_target_tokens:
        lines.append("  most-rejected target tokens: " + ", ".join(f"{_tok(r)} {r.count}×"
                                                                   for r in rej.top_target_tokens))
        lines.append("  most-rejected drafts:        " + ", ".join(f"{_tok(r)} {r.count}×"
                                                                   for r in rej.top_drafted_tokens))
    lines += _rate_table("Acceptance by token class", x.by_class)
    lines += _rate_table("Acceptance by channel", x.by_channel)
    lines += _rate_table("Acceptance by category", x.by_category)
    dr = x.drift
    if dr is not None:
        lines += ["", f"Drafter drift (h_next vs the target's hidden state): mean cosine {_f(_finite(dr.cos_mean))}, "
                      f"mean relative error {_f(_finite(dr.rel_err_mean))} over {dr.n_steps} steps"]
        for dp in dr.per_position:
            lines.append(f"  k={dp.k}: cosine {_f(_finite(dp.cos_mean))}, relative error {_f(_finite(dp.rel_err_mean))} "
                         f"({dp.n_steps} steps)")
        if dr.by_quantile:
            lines.append("  acceptance by cosine quarter (checked steps): " + ", ".join(
                f"{q.cos_low:.2f}..{q.cos_high:.2f}: {q.acceptance_rate:.0%}" for q in dr.by_quantile))
        if dr.words:
            lines.append(f"  {dr.words}")
    wi = x.what_if
    if wi is not None and wi.rows:
        lines += ["", f"Which n_draft? (estimate from this trace, {wi.interval_words()}; model in docs/EXPLAIN.md §4)",
                  "  n_draft  acceptance rate       mean acc. length      tokens/s              speedup"]
        for r in wi.rows:
            mark = " (recorded)" if r.recorded else (" (extrapolated)" if r.extrapolated else "")
            if r.recorded and _finite(wi.measured_tokens_per_s) is not None:
                mark = f" (recorded: measured {_f(wi.measured_tokens_per_s, '.1f')} tokens/s at each round's own time)"
            lines.append(f"  {r.n_draft:7d}  "
                         f"{_fv(_finite(r.acceptance_rate), r.acceptance_rate_interval, '.3f'):<20}  "
                         f"{_fv(_finite(r.mean_acceptance_length), r.mean_acceptance_length_interval, '.2f'):<20}  "
                         f"{_fv(_finite(r.tokens_per_s), r.tokens_per_s_interval, '.1f'):<20}  "
                         f"{_fv(_finite(r.speedup), r.speedup_interval, '.2f'):<18}{mark}")
        if wi.cost is not None:
            lines += _cost_lines(wi.cost)
    lines += format_advice(x.advice)
    if sentences:
        lines += ["", "First mismatches of this prompt:"]
        lines += [f"  {s}" for s in sentences[:MAX_STEP_LINES]]
        if len(sentences) > MAX_STEP_LINES:
            lines.append(f"  ... {len(sentences) - MAX_STEP_LINES} more (use --json)")
    if x.notes:
        lines += [""] + [f"note: {n}" for n in x.notes]
    return "\n".join(lines)


def format_comparison(a: str, b: str, diff: AlignedDiff, runs: list[str] | None = None) -> str:
    """The aligned diff (:class:`mtpscope.traces.analysis.align.AlignedDiff`) as terminal text; ``runs``: what
    differs between the two runs (:func:`format_run_differences`), right after the two paths."""
    pairing = diff.pairing
    same = {True: "yes", False: "NO", None: "unknown (no emitted tokens)"}[diff.outputs_identical]
    lines = [f"A: {a}", f"B: {b}", *(runs or []),
             f"prompts paired by {pairing.by}: {len(pairing.pairs)} (unpaired: A {len(pairing.unpaired_a)}, "
             f"B {len(pairing.unpaired_b)}); outputs identical: {same}"]
    from mtpscope.traces.analysis.align import pairing_caveat

    caveat = pairing_caveat(pairing)
    if caveat:
        lines.append(f"note: {caveat}")
    if diff.not_comparable is not None:      # different text: nothing position by position, no delta
        r = diff.delta.get("all")
        lines.append(f"not comparable position by position: {diff.not_comparable}; no output position, "
                     "acceptance delta or first differing round is given")
        if r is not None:
            lines.append(f"acceptance rate of each run on its own (not a paired delta): A {_f(r.rate_a)}, "
                         f"B {_f(r.rate_b)} ({plural(r.n_prompts, 'prompt')})")
        return "\n".join(lines)
    for p in diff.prompts:
        if p.identical_output is False:
            lines.append(f"  prompt {p.prompt_id_a}/{p.prompt_id_b}: outputs differ from position "
                         f"{p.diverged_at} on; compared positions before it only")
        elif p.identical_output is None:
            lines.append(f"  prompt {p.prompt_id_a}/{p.prompt_id_b}: output unknown (no emitted tokens)")
    for name, x, k_of in (("accepted in A, rejected in B", diff.a_only, "B's"),
                          ("accepted in B, rejected in A", diff.b_only, "A's")):
        cls = ", ".join(f"{c} {v}" for c, v in sorted(x.by_class.items(), key=lambda cv: -cv[1]))
        ks = ", ".join(f"k={k}: {v}" for k, v in x.by_position.items())
        eog = (f"; {x.n_eog_confirmed} of them {k_of} end-of-generation drafts the target chose too: not accepted as "
               "llama.cpp counts, not a miss of the drafter" if x.n_eog_confirmed else "")
        lines.append(f"{name}: {x.n}" + (f" (by class: {cls}; by {k_of} draft position: {ks}{eog})" if x.n else ""))
    firsts = [f"{p.prompt_id_a}: {p.first_difference}" for p in diff.prompts if p.first_difference is not None]
    if firsts:
        lines.append("first differing position per prompt: " + ", ".join(firsts[:30])
                     + (" ..." if len(firsts) > 30 else ""))
    lines.append("acceptance rate delta (B - A), 95 % bootstrap interval over prompts:")
    for cat, r in diff.delta.items():
        ci = f"[{_f(r.ci_low, '+.3f')}, {_f(r.ci_high, '+.3f')}]" if r.ci_low is not None else "[-]"
        lines.append(f"  {cat:<20} {_f(r.delta, '+.3f')} {ci}  (A {_f(r.rate_a)}, B {_f(r.rate_b)}, "
                     f"{plural(r.n_prompts, 'prompt')})")
    if diff.runtimes is not None:
        lines.extend(format_runtime_diff(diff.runtimes))
    return "\n".join(lines)


def format_runtime_diff(rt: RuntimeDiff) -> list[str]:
    """The round-by-round section of ``compare`` (:class:`mtpscope.traces.analysis.runtime_diff.RuntimeDiff`)."""
    from mtpscope.traces.analysis.runtime_diff import CAUSES, confirmed_counts

    def conv(c: Convention | None) -> str:
        if c is None:
            return "unknown"
        return (f"{c.runtime or '?'} (draft position {c.draft_position or '?'}, head {c.head or '?'}"
                + (f", {c.dtype}" if c.dtype else "") + ")")

    lines = [f"runtimes: A {conv(rt.convention_a)}, B {conv(rt.convention_b)}; conventions that differ: "
             + (", ".join(rt.differs) or "none"),
             f"rounds at a common position with the same pending token: {rt.n_rounds_compared}, "
             f"drafts differ in {rt.n_rounds_differing}"]
    shown = [d for d in rt.prompts if d.what != "none"]
    unexplained = [d for d in shown if d.what == "drafts" and not d.cause]
    if not rt.differs and unexplained:     # one runtime, one convention: listing each prompt says nothing more
        shown = [d for d in shown if d not in unexplained]
        lines.append(f"  {plural(len(unexplained), 'prompt')}: the drafts differ in the first differing round with no "
                     "convention between the runs to explain it (the same runtime: the drafters themselves draft "
                     "differently; what differs between the runs is above); --json lists each")
    if shown:
        lines.append("first differing round per prompt (A round / B round, pending token's position, draft step):")
    for d in shown:
        cause = CAUSES.get(d.cause or "", "no known convention explains it")
        if d.what == "output_length":
            seen = (" (checked: the shorter output's last token is not one the other runtime stops at)"
                    if d.cause == "eog" and d.confirmed else "")
            lines.append(f"  prompt {d.prompt_id_a}: no round differs, one output goes on where the other stopped: "
                         f"{cause}{seen}")
        elif d.what == "output":
            lines.append(f"  prompt {d.prompt_id_a}: no round differs; the generated token differs at output position "
                         f"{d.output_diverged_at} (the target's own choice: a near tie or numerics)")
        else:
            step = f"step {d.step}" if d.step is not None else "fewer drafts"
            lines.append(f"  prompt {d.prompt_id_a}: round {d.round_a}/{d.round_b} at {d.pos}, {step}: "
                         f"{list(d.drafted_a)} vs {list(d.drafted_b)}: {cause}{_check_words(d)}")
    if rt.causes:
        checked = confirmed_counts(rt)
        lines.append("first differences by cause: " + ", ".join(
            f"{k} {v}" + (f" ({checked[k][0]} confirmed, {checked[k][1]} not)" if k in checked else "")
            for k, v in rt.causes.items()))
    return lines


def _check_words(d: RoundDifference) -> str:
    """`` (confirmed ...)`` / `` (NOT confirmed ...)`` / `` (not replayed: why)`` after a first difference's cause."""
    if d.replayed:
        by_held: dict[str, list[str]] = {}
        for r in d.replayed:
            who = f"{r.reproduces.upper()}'s" if r.reproduces else "neither's"
            by_held.setdefault(r.held, []).append(f"{r.key} {r.value} drafts {r.token} ({who})")
        got = "; ".join(f"with {h}, {', '.join(v)}" for h, v in by_held.items())
        word = {True: "confirmed by replay", False: "NOT confirmed by replay", None: "replayed"}[d.confirmed]
        return f" ({word}: {got})"
    if d.confirmed is not None:
        return {True: " (confirmed: the dense run's own centroid head drafts the other's token there)",
                False: " (NOT confirmed: the dense run's centroid head drafts another token there)"}[d.confirmed]
    return f" ({d.replay_note})" if d.replay_note else ""


def explain_request_trace(trace: TraceLike, as_json: bool) -> int:
    """``explain`` on a request trace (:func:`traces.analysis.explain_report.is_request_trace`): what it can tell, the requests' acceptance as
    ``report`` gives it (:func:`traces.analysis.metrics.report`), and one line on what needs rounds; the exit code
    (1 with the not-drafting alarm or a reader's warning)."""
    from mtpscope.traces.analysis.explain_report import request_trace_note
    from mtpscope.traces.analysis.metrics import report

    rep = report(trace)
    r = rep.requests
    notes = [n for n in (request_trace_note(trace.manifest, str(trace.path)),) if n]
    replay = Path(trace.path) / "replay"
    if (replay / "manifest.json").is_file():
        notes.append(f"its replay (`probe --replay`) recorded the same requests round by round: "
                     f"`mtpscope explain {replay}`")
    alarm = r.alarm if r is not None else None
    for w in trace.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if as_json:
        print(json.dumps({"trace": str(trace.path), "prompt": None, "source": rep.source,
                          **{k: v for k, v in rep.to_dict().items() if k in (
                              "n_rounds", "n_verify_rounds", "n_drafted", "n_accepted", "acceptance_rate",
                              "mean_acceptance_length", "mean_acceptance_length_formula", "requests")},
                          "notes": notes}, indent=2, allow_nan=False))
    else:
        drafts = f"; {r.n_drafts} drafts" if r is not None and r.n_drafts is not None else ""
        lines = [trace_head(trace.path, rep.source, rep.complete, upper=True),
                 f"{plural(r.n_requests if r is not None else 0, 'request')}"
                 + (f" ({r.kind} rows)" if r is not None else "")
                 + f": acceptance rate {_f(rep.acceptance_rate, '.4f')} ({rep.n_accepted} / {rep.n_drafted} "
                   f"drafted), mean acceptance length {_f(rep.mean_acceptance_length, '.4f')} "
                   f"({rep.mean_acceptance_length_formula}{drafts})"]
        if alarm:
            lines.append(f"ALARM: {alarm}")
        lines += [""] + [f"note: {n}" for n in notes]
        print("\n".join(lines))
    return EXIT_FINDINGS if alarm or trace.warnings else 0


def explain_json(trace: TraceLike, *, vocab_path: Path | None = None, prompt: str | None = None,
                 category_field: str | None = None) -> tuple[dict[str, Any], tuple[Explanation, Vocab | None]]:
    """(JSON sections, (Explanation, vocabulary)) of an opened trace
    (:func:`traces.sweep.advice.explain_with_baseline`: a sweep cell's speedups against the sweep's plain
    decoding); the vocabulary from ``vocab_path`` or the manifest. The sections are
    :meth:`traces.analysis.explain_report.Explanation.to_dict` (``report --json`` adds them)."""
    from mtpscope.traces.analysis.vocab import trace_vocab
    from mtpscope.traces.sweep.advice import explain_with_baseline

    vocab = trace_vocab(trace.manifest, vocab_path)
    x = explain_with_baseline(trace, vocab=vocab, prompt=prompt, category_field=category_field)
    return x.to_dict(), (x, vocab)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root mtpscope app."""

    @app.command("explain")
    def explain_cmd(
        trace: Path = typer.Argument(..., help="Trace directory (holds manifest.json)."),
        as_json: bool = typer.Option(False, "--json", help="Print the sections as JSON."),
        prompt: str | None = typer.Option(None, "--prompt", help="Only this prompt (its id or prompt_id)."),
        vocab: Path | None = typer.Option(
            None, "--vocab", help="GGUF whose vocabulary the trace's tokens come from (default: the recorded target)."),
        by: str = typer.Option("round", "--by", help="round: rejections and causes (default); request: one row "
                                                     "per llama-server request (probe, server log; a recording "
                                                     "prompt by prompt), worst first."),
        category_field: str | None = typer.Option(
            None, "--category-field", help="Take each prompt's category from this field of the prompts file "
                                           "(kept in the manifest's prompt entries) instead of 'category'."),
    ) -> None:
        """Why drafts were rejected, on which tokens, and which n_draft to use (worst first); plain decoding
        is always a candidate. On a sweep directory: the sweep's measured recommendation and break-even.

        Exit 1 when reading the trace gave warnings (an incomplete run, a part skipped), 2 on unreadable input.
        """
        if by not in ("round", "request"):
            print(f"mtpscope: '--by': expected round or request, got {by!r}", file=sys.stderr)
            raise typer.Exit(2)
        if by == "request":
            from mtpscope.cli.server import explain_requests

            raise typer.Exit(explain_requests(trace, as_json))
        from mtpscope.traces.sweep.spec import is_sweep

        if is_sweep(trace):
            from mtpscope.cli.sweep import sweep_report

            raise typer.Exit(sweep_report(trace, as_json, advice_only=True))
        from mtpscope.cli.sweep import refuse_sweep_folder

        refuse_sweep_folder(trace, "mtpscope explain")
        with one_line_errors():
            from mtpscope.traces.analysis.explain import step_sentence
            from mtpscope.traces.analysis.explain_report import is_request_trace, select_prompt, token_label
            from mtpscope.traces.store.reader import open_trace

            t = open_trace(trace)
            if is_request_trace(t.manifest):
                if prompt is not None:
                    print(f"mtpscope: {trace} is a llama-server request trace (no rounds): --prompt needs rounds; "
                          f"one row per request: `mtpscope explain {trace} --by request`", file=sys.stderr)
                    raise typer.Exit(2)
                raise typer.Exit(explain_request_trace(t, as_json))
            if category_field not in (None, "category"):
                from mtpscope.errors import TraceError
                from mtpscope.traces.analysis.breakdown import missing_field_words, prompt_categories

                if prompt_categories(t.manifest, category_field) is None:     # a typo: say which fields exist
                    raise TraceError(missing_field_words(t.manifest, category_field), path=t.path,
                                     key="--category-field", expected="a field the prompts carry",
                                     actual=category_field)
            d, (x, voc) = explain_json(t, vocab_path=vocab, prompt=prompt, category_field=category_field)
        for w in t.warnings:
            print(f"warning: {w}", file=sys.stderr)
        n_read, recorded = 0, None
        if t.skipped:       # (the whole trace's rounds read, a prompt chosen or not)
            n_read = len(t.columns("rounds", ["round"]))
            recorded = t.rounds_not_read(n_read)
        head = ExplainHead(str(t.path), t.manifest.get("source"), bool(t.manifest.get("complete")),
                           None if prompt is None else select_prompt(t.manifest, prompt), x.totals,
                           rounds_read=None if recorded is None else (n_read, recorded))
        if as_json:
            print(json.dumps({"trace": head.trace, "prompt": head.prompt, **_totals_json(x.totals), **d},
                             indent=2, allow_nan=False))
        else:
            sentences = None
            if prompt is not None:
                lab = token_label(voc)
                cen = t.manifest.get("centroids") or {}
                sentences = [f"round {int(r['round'])} k={int(r['k'])}: " + step_sentence(
                    r, lambda i: f"“{lab(i)}”", n_centroids=cen.get("n_centroids"), centroid_top_k=cen.get("top_k"))
                    # a row's labels are the frame's column names, all str (pandas-stubs: dict[Hashable, Any])
                    for r in cast("list[dict[str, Any]]", x.first_mismatches.to_dict(orient="records"))]
            print(format_explanation(head, x, sentences))
        if t.warnings:
            raise typer.Exit(EXIT_FINDINGS)

    @app.command("compare")
    def compare_cmd(
        a: Path = typer.Argument(..., help="Trace A (the reference)."),
        b: Path = typer.Argument(..., help="Trace B."),
        as_json: bool = typer.Option(False, "--json", help="Print the diff as JSON."),
        vocab: Path | None = typer.Option(None, "--vocab", help="GGUF vocabulary of A's tokens (token classes)."),
        no_replay: bool = typer.Option(False, "--no-replay", help="Name the runtime causes from the conventions "
                                       "only: do not replay the first differing step with the reference drafter."),
    ) -> None:
        """Aligned diff of two traces of the same prompts: positions accepted in one and rejected in the
        other, by token class and draft position; acceptance delta per category with a bootstrap interval.
        Two runtimes' traces: the first differing round per prompt, its cause checked by replaying the step
        under both conventions (docs/RUNTIMES.md; needs the llama.cpp trace's GGUFs and llama-cpp-python).

        Exit 1 when the two runs' outputs differ (then only the common prefix of each prompt is compared) or they
        share no prompt; 2 when a trace is unreadable, breaks the trace format or has no rounds.
        """
        from mtpscope.errors import TraceMismatchError

        with one_line_errors(refusals=(TraceMismatchError,)):
            from mtpscope.traces.analysis.compare_report import compare_traces
            from mtpscope.traces.analysis.vocab import trace_vocab
            from mtpscope.traces.store.reader import open_trace

            ta, tb = open_trace(a), open_trace(b)
            if any(t.part_files("requests") and not (t.manifest.get("counts") or {}).get("n_rounds")
                   for t in (ta, tb)):
                from mtpscope.cli.server import compare_request_traces

                raise typer.Exit(compare_request_traces(ta, tb, as_json))
            try:
                diff = compare_traces(ta, tb, vocab=trace_vocab(ta.manifest, vocab))
                if diff.runtimes is not None and not no_replay:
                    import dataclasses

                    from mtpscope.traces.run.runtime_replay import replay_first_differences

                    diff = dataclasses.replace(diff, runtimes=replay_first_differences(diff.runtimes, ta, tb))
            finally:  # a torn part explains an empty trace: say so before the error line
                for w in [*ta.warnings, *tb.warnings]:
                    print(f"warning: {w}", file=sys.stderr)
        from mtpscope.traces.analysis.run_diff import difference_rows, run_differences

        # what differs between the two runs themselves (parameters; models by their GGUF metadata and tensor table):
        # the likely "why" behind the numbers below, as the app's Compare page shows it
        runs = difference_rows(run_differences(ta.manifest, tb.manifest), missing=MISSING)
        if as_json:
            print(json.dumps({"a": str(ta.path), "b": str(tb.path), "run_differences": [r.to_dict() for r in runs],
                              **diff.to_dict()}, indent=2, allow_nan=False))
        else:
            print(format_comparison(str(ta.path), str(tb.path), diff, format_run_differences(runs)))
        if diff.not_comparable is not None:
            print(f"mtpscope: the two runs are not comparable position by position: {diff.not_comparable}",
                  file=sys.stderr)
            raise typer.Exit(EXIT_FINDINGS)
        if diff.outputs_identical is None:
            print("mtpscope: the two runs' outputs are unknown (no emitted tokens): no output position was compared",
                  file=sys.stderr)
            raise typer.Exit(EXIT_FINDINGS)
        if not diff.outputs_identical:
            print("mtpscope: the two runs' outputs are not identical: only the common prefix of each prompt was "
                  "compared", file=sys.stderr)
            raise typer.Exit(EXIT_FINDINGS)
