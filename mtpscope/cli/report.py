"""CLI commands: traces (see mtpscope/cli/main.py).

``mtpscope report TRACE [--json]``: acceptance metrics of a trace directory.
``mtpscope import fork-ndjson FILE --out DIR``: the fork's ``LLAMA_MTP_ACC_TRACE`` NDJSON -> trace.
``mtpscope import server-log FILE --out DIR``: llama-server log / response timings -> trace.

Exit codes: 0 ok; 1 the import wrote a trace but left data out (bad lines, or events without their partner:
a warning on stderr names them); 2 unreadable input (one line on stderr).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from mtpscope.cli.common import EXIT_FINDINGS, EXIT_OK, MISSING, one_line_errors, out_folder, trace_head
from mtpscope.traces.analysis.wording import plural, rolling_words, shorten, streaks_line

if TYPE_CHECKING:
    from mtpscope.traces.analysis.report_records import TraceReport

MAX_PROMPT_ROWS = 20
#: Characters of each prompt's text in the per-prompt table (the whole text is in ``--json``).
PROMPT_TEXT_CHARS = 40
MAX_BAD_LINES_SHOWN = 20


def _fmt(v: Any, spec: str = ".4f") -> str:
    if v is None or (isinstance(v, float) and v != v):
        return MISSING
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def format_report(rep: TraceReport) -> str:
    """The report (:func:`traces.analysis.metrics.report`) as plain text for a terminal."""
    lines = [trace_head(rep.trace, rep.source, rep.complete, n_read=rep.n_rounds, n_recorded=rep.n_rounds_recorded)]
    r = rep.requests
    if not rep.n_rounds and r is not None:     # llama-server requests: their drafts, not rounds
        lines.append(f"prompts: {rep.n_prompts}   requests: {r.n_requests} ({r.kind} rows)   "
                     f"drafts: {_fmt(r.n_drafts)}   drafted: {rep.n_drafted}   accepted: {rep.n_accepted}")
    else:
        lines.append(f"prompts: {rep.n_prompts}   rounds: {rep.n_rounds} "
                     f"(verify rounds {rep.n_verify_rounds})   drafted: {rep.n_drafted}   "
                     f"accepted: {rep.n_accepted}")
    lines.append(f"acceptance rate:        {_fmt(rep.acceptance_rate)}   (accepted / drafted)")
    lines.append(f"mean acceptance length: {_fmt(rep.mean_acceptance_length)}   "
                 f"({rep.mean_acceptance_length_formula})")
    if rep.per_position:
        lines.append("")
        lines.append("per draft position   k   rounds  accepted  P(accepted)  P(accepted | k-1 accepted)  "
                     "per verify round (llama-server's acc per pos)")
        for p in rep.per_position:
            lines.append(f"{'':20} {p.k:2d} {p.n_rounds:8d} {p.n_accepted:9d}  "
                         f"{_fmt(p.acceptance):>11}  {_fmt(p.conditional):>26}  {_fmt(p.per_verify_round):>11}")
    if rep.first_mismatch:
        lines.append("")
        parts = ", ".join(f"k={f.k}: {f.n_rounds}" for f in rep.first_mismatch)
        lines.append(f"first mismatch: {parts}; all accepted: {rep.n_all_accepted}")
    z = rep.zero_acceptance_streaks
    if rep.n_rounds:
        lines.append(streaks_line(z.n_streaks, z.n_rounds_in_streaks, z.longest))
        for s in z.top[:3]:
            if s.length > 1:
                lines.append(f"  prompt {s.prompt_id} rounds {s.start_round}..{s.end_round} "
                             f"({plural(s.length, 'round')})")
    if rep.rolling:
        ro = rep.rolling
        lines.append(f"rolling acceptance rate ({rolling_words(ro.window, ro.full_windows)}): "
                     f"min {_fmt(ro.min, '.3f')}, "
                     f"p10 {_fmt(ro.p10, '.3f')}, median {_fmt(ro.median, '.3f')}, "
                     f"p90 {_fmt(ro.p90, '.3f')}, max {_fmt(ro.max, '.3f')}")
    if rep.timing_ms:
        t = rep.timing_ms
        lines.append(f"mean time per round: draft {_fmt(t.t_draft_ms_mean, '.2f')} ms, "
                     f"verify {_fmt(t.t_verify_ms_mean, '.2f')} ms; {_fmt(t.tokens_per_s, '.1f')} tokens/s "
                     "(emitted tokens / draft + verify time; `explain` prices each round size at its median, which "
                     "slow rounds do not move)")
    if rep.centroid_coverage:
        c = rep.centroid_coverage
        lines.append(f"centroid coverage: {_fmt(c.coverage)} ({c.n_covered} of the {plural(c.n_steps, 'step')} "
                     f"the target checked had its token among the sparse head's candidates)")
    if rep.prompts:
        lines.append("")
        lines.append("prompt  rounds  drafted  accepted  acceptance rate  mean acceptance length  text")
        for pr in rep.prompts[:MAX_PROMPT_ROWS]:
            lines.append(f"{pr.prompt_id:6d} {pr.n_rounds:7d} {pr.n_drafted:8d} {pr.n_accepted:9d}  "
                         f"{_fmt(pr.acceptance_rate):>15}  {_fmt(pr.mean_acceptance_length):>22}  "
                         f"{shorten(pr.text or '', PROMPT_TEXT_CHARS)}".rstrip())
        if len(rep.prompts) > MAX_PROMPT_ROWS:
            lines.append(f"... {len(rep.prompts) - MAX_PROMPT_ROWS} more prompts (use --json)")
    if r:
        lines.append("")
        lines.append(f"requests ({r.kind} rows): {r.n_requests}, drafted {r.n_drafted}, "
                     f"accepted {r.n_accepted}, acceptance rate {_fmt(r.acceptance_rate)}"
                     + (f", mean acceptance length {_fmt(r.mean_acceptance_length, '.2f')}"
                        if r.mean_acceptance_length is not None else "")
                     + (f", {_fmt(r.tokens_per_s_pooled, '.1f')} tokens/s (all tokens / all generation time)"
                        if r.tokens_per_s_pooled is not None else "")
                     + (f", {_fmt(r.tokens_per_s_mean, '.1f')} tokens/s (mean per request)"
                        if r.tokens_per_s_mean is not None else ""))
        if r.alarm:
            lines.append(f"ALARM: {r.alarm}")
        if r.per_position:
            lines.append("accepted per draft position (server counters): " + ", ".join(
                f"k={p.k} {_fmt(p.rate)}" for p in r.per_position))
        if len(r.by_category) > 1:
            lines.append("by category (worst first): " + ", ".join(
                f"{c.category} {_fmt(c.acceptance_rate)} ({plural(c.n_requests, 'request')})"
                for c in r.by_category))
    return "\n".join(lines)


def _print_import_result(res: Any) -> int:
    print(f"wrote {res.out_dir}: {plural(res.n_rounds, 'round')}, {plural(res.n_steps, 'step')}, "
          f"{plural(res.n_requests, 'request')} from {plural(res.n_lines, 'line')} ({res.n_used} used, "
          f"{res.n_ignored} ignored, {res.n_bad} bad)")
    for w in res.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if res.n_bad:
        print(f"mtpscope: {res.path}: {plural(res.n_bad, 'bad line')} skipped:", file=sys.stderr)
        for line_no, reason in res.bad_lines[:MAX_BAD_LINES_SHOWN]:
            print(f"  line {line_no}: {reason}", file=sys.stderr)
        if res.n_bad > MAX_BAD_LINES_SHOWN:
            print(f"  ... {res.n_bad - MAX_BAD_LINES_SHOWN} more", file=sys.stderr)
    return EXIT_FINDINGS if res.n_bad or res.n_dropped else EXIT_OK


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root mtpscope app."""

    @app.command("report")
    def report_cmd(
        trace: Path = typer.Argument(..., help="Trace directory (holds manifest.json)."),
        as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
        vocab: Path | None = typer.Option(
            None, "--vocab", help="GGUF vocabulary of the trace's tokens, for --json's by_class (default: the "
                                  "recorded target)."),
    ) -> None:
        """Acceptance metrics of a trace: acceptance rate, mean acceptance length, per position, per prompt.

        --json also carries the explanation sections of mtpscope explain --json (rejections,
        by_class, by_category, drift, what_if; docs/EXPLAIN.md). On a sweep directory (sweep.json): the
        configuration x category table (docs/SWEEP.md). Exit 1 with any warning (stderr): parts of the trace
        unreadable and skipped, a trace that is incomplete or was recovered (the report covers what was read).
        """
        from mtpscope.traces.sweep.spec import is_sweep

        if is_sweep(trace):
            from mtpscope.cli.sweep import sweep_report

            raise typer.Exit(sweep_report(trace, as_json))
        from mtpscope.cli.sweep import refuse_sweep_folder

        refuse_sweep_folder(trace, "mtpscope report")
        with one_line_errors():
            from mtpscope.traces.analysis.costs import CostProbe
            from mtpscope.traces.analysis.metrics import report
            from mtpscope.traces.store.reader import open_trace

            tr = open_trace(trace)
            CostProbe.of_trace(tr)  # a malformed cost probe is refused here as by explain and diagnose
            rep = report(tr)
            doc = rep.to_dict() if as_json else {}
            warnings = list(rep.warnings)
            if as_json and rep.n_rounds:
                from mtpscope.cli.explain import explain_json

                sections, _ = explain_json(tr, vocab_path=vocab)
                doc.update({k: v for k, v in sections.items() if k not in doc})
                warnings = doc["warnings"] = list(tr.warnings)
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)
        if as_json:
            print(json.dumps(doc, indent=2, allow_nan=False))
        else:
            print(format_report(rep))
        if warnings:
            raise typer.Exit(EXIT_FINDINGS)

    imp = typer.Typer(help="Import foreign logs (fork NDJSON, llama-server logs) as traces.",
                      no_args_is_help=True)

    @imp.command("fork-ndjson")
    def import_fork(
        file: Path = typer.Argument(..., help="NDJSON written by the fork with LLAMA_MTP_ACC_TRACE."),
        out: Path = typer.Option(..., "--out", callback=out_folder, help="Trace directory to write."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace a trace already in --out."),
    ) -> None:
        """Fork NDJSON (mtp_draft + mtp_accept events joined on iter) -> trace (source fork-ndjson).

        Exit 1 when data was left out (bad lines, a draft without its accept or an accept without its draft; each
        named on stderr), 2 when nothing could be imported.
        """
        with one_line_errors():
            from mtpscope.traces.importers import import_fork_ndjson

            res = import_fork_ndjson(file, out, overwrite=overwrite)
        raise typer.Exit(_print_import_result(res))

    @imp.command("server-log")
    def import_server(
        file: Path = typer.Argument(..., help="llama-server log and/or per-response JSON with timings."),
        out: Path = typer.Option(..., "--out", callback=out_folder, help="Trace directory to write."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace a trace already in --out."),
    ) -> None:
        """llama-server log (acceptance-rate lines, response timings) -> per-request rows (source server-log)."""
        with one_line_errors():
            from mtpscope.traces.importers import import_server_log

            res = import_server_log(file, out, overwrite=overwrite)
        raise typer.Exit(_print_import_result(res))

    app.add_typer(imp, name="import")
