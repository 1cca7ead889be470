"""CLI commands: verify and diff (see mtpscope/cli/main.py).

``mtpscope verify PATH [--target T] [--hf DIR] [--json]``: exit 0 when no finding is an error, 1 when
some are, 2 when a file is unreadable (one line on stderr).
``mtpscope diff A B [--data sampled|whole|none] [--values] [--json]``: metadata keys, tensor table and tensor
bytes (by default small tensors whole and larger ones on sampled rows; ``--data whole`` every byte), and what
was compared; exit 0 when the files do not differ, 1 when they do, 2 unreadable.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mtpscope.cli.common import EXIT_FINDINGS, EXIT_OK, one_line_errors
from mtpscope.cli.sources import (
    DEFAULT_MAX_HEADER_MIB,
    DEFAULT_TIMEOUT_S,
    AllowFullDownload,
    MaxHeaderMiB,
    Timeout,
    open_source,
)

if TYPE_CHECKING:
    from mtpscope.inspector.diff import GGUFDiff
    from mtpscope.inspector.findings import Report

_WHERE = "a path, any shard of a split model, or an https:// / hf://ORG/REPO/[REVISION/]FILE.gguf URL"

_SEV_MARK = {"error": "E", "warning": "W", "info": "i"}


def _print_report(report: Report, verbose: bool) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from mtpscope.traces.analysis.wording import plural

    con = Console(highlight=False, soft_wrap=True)
    r = report
    n_err, n_warn = len(r.errors), len(r.warnings)
    con.print(f"[bold]{r.path}[/bold]  arch {r.arch!r}  dialect {r.dialect}")
    for f in r.findings:
        if f.severity == "info" and not verbose and f.code not in ("I_DIALECT", "I_PAIR_KV_DONORS"):
            continue
        style = {"error": "red", "warning": "yellow"}.get(f.severity, "dim")
        detail = f" [{f.subject}]" if f.subject else ""
        if f.expected is not None:
            detail += f" (expected {f.expected}, got {f.actual})"
        con.print(f"[{style}]{_SEV_MARK.get(f.severity, '?')} {f.code:<26}[/{style}] "
                  f"{escape(f.message + detail)}")
    t = Table(title="loadability", show_lines=False)
    t.add_column("runtime")
    t.add_column("verdict")
    t.add_column("because")
    for v in r.loadability:
        outcome = getattr(v, "outcome", None) or {True: "loads", False: "refuses", None: "unknown"}[v.loads]
        style = "green" if outcome == "loads" else "dim" if outcome == "unknown" else "red"
        t.add_row(v.runtime, f"[{style}]{outcome}[/{style}]", escape(v.reasons[0]) if v.reasons else "")
    con.print(t)
    if r.hf_audit is not None:
        a = r.hf_audit
        con.print(f"[bold]Hugging Face audit[/bold] {a.hf_dir} (HF numpy shape -> GGUF ne; names fork | upstream)")
        for row in a.rows:
            style = {"ok": "", "dropped": "cyan", "unmapped": "yellow"}.get(row.status, "red")
            found = (f"ne {list(row.found_ne)} {row.found_type}" if row.found_ne is not None else "absent")
            want = f" (want {row.expected_type})" if row.expected_type else ""
            line = (f"{row.status:<8} {row.hf_name} {list(row.hf_shape)} {row.hf_dtype} -> "
                    f"{row.gguf_fork} | {row.gguf_upstream}: {found}{want}" + (f"  {row.note}" if row.note else ""))
            con.print(f"[{style}]{line}[/{style}]" if style else line, markup=bool(style))
        for name, why in a.gguf_only.items():
            con.print(f"gguf-only {name}: {why}", markup=False)
    con.print(f"{'OK' if r.ok else 'NOT OK'}: {plural(n_err, 'error')}, {plural(n_warn, 'warning')}")


def register(app: typer.Typer) -> None:
    """Add ``verify`` and ``diff`` to the root mtpscope app."""

    @app.command()
    def verify(
        path: Annotated[str, typer.Argument(help=f"drafter (or target) GGUF to check: {_WHERE}")],
        target: Annotated[str | None, typer.Option("--target", help="target GGUF to pair the drafter with")] = None,
        hf: Annotated[Path | None, typer.Option("--hf", help="Hugging Face checkpoint folder it was converted from")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
        verbose: Annotated[bool, typer.Option("--verbose", "-v", help="also print the detailed info findings (the dialect and the K/V donor layers are always shown)")] = False,
        allow_full_download: AllowFullDownload = False,
        max_header_mib: MaxHeaderMiB = DEFAULT_MAX_HEADER_MIB,
        timeout: Timeout = DEFAULT_TIMEOUT_S,
    ) -> None:
        """Validate a Gemma 4 drafter GGUF: layout, dtypes, centroid head, pairing, loadability."""
        from mtpscope.inspector.validate import verify as run_verify

        with one_line_errors():
            f = open_source(path, allow_full_download, max_header_mib, timeout)
            t = open_source(target, allow_full_download, max_header_mib, timeout) if target else None
            report = run_verify(f, target=t, hf_dir=hf)
        if as_json:
            print(report.to_json())
        else:
            _print_report(report, verbose)
        raise typer.Exit(EXIT_OK if report.ok else EXIT_FINDINGS)

    @app.command()
    def diff(
        a: Annotated[str, typer.Argument(help=f"first GGUF: {_WHERE}")],
        b: Annotated[str, typer.Argument(help="second GGUF (same forms)")],
        data: Annotated[str, typer.Option(
            "--data", help="tensor bytes compared: 'sampled' (tensors up to 1 MiB whole, larger ones on "
                           "--sample-rows rows in 4 evenly spaced runs, first and last rows included; stays fast on "
                           "20 GB files), 'whole' (every byte) or 'none'")] = "sampled",
        sample_rows: Annotated[int, typer.Option("--sample-rows", help="rows compared per larger tensor with "
                                                                         "--data sampled")] = 32,
        values: Annotated[bool, typer.Option("--values", help="also the relative error (dequantized) on sampled "
                                                                "rows: how much the values differ")] = False,
        rows: Annotated[int, typer.Option("--rows", help="rows sampled per tensor with --values (as many as "
                                                          "--sample-rows's default)")] = 32,
        as_json: Annotated[bool, typer.Option("--json", help="print the diff as JSON")] = False,
        allow_full_download: AllowFullDownload = False,
        max_header_mib: MaxHeaderMiB = DEFAULT_MAX_HEADER_MIB,
        timeout: Timeout = DEFAULT_TIMEOUT_S,
    ) -> None:
        """Metadata keys, tensors and tensor bytes added / removed / changed between two GGUFs."""
        import json

        from mtpscope.inspector.diff import diff as run_diff

        with one_line_errors():
            fa = open_source(a, allow_full_download, max_header_mib, timeout)
            fb = open_source(b, allow_full_download, max_header_mib, timeout)
            d = run_diff(fa, fb, values=values, n_rows=rows, data=data, sample_rows=sample_rows)
        if as_json:
            print(json.dumps(d.to_dict(), indent=2))
        else:
            _print_diff(d)
        raise typer.Exit(EXIT_OK if d.identical else EXIT_FINDINGS)


def _print_diff(d: GGUFDiff) -> None:
    from rich.console import Console

    con = Console(highlight=False, soft_wrap=True)
    con.print(f"--- {d.a}\n+++ {d.b}")
    for k in d.keys_removed:
        con.print(f"[red]- key {k}[/red]")
    for k in d.keys_added:
        con.print(f"[green]+ key {k}[/green]")
    for kc in d.keys_changed:
        types = f" ({kc.a_type} -> {kc.b_type})" if kc.a_type != kc.b_type else ""
        con.print(f"[yellow]~ key {kc.key}: {kc.a!r} -> {kc.b!r}{types}[/yellow]")
    for n in d.tensors_removed:
        con.print(f"[red]- tensor {n}[/red]")
    for n in d.tensors_added:
        con.print(f"[green]+ tensor {n}[/green]")
    for x, y in d.tensors_renamed:
        con.print(f"[cyan]= tensor {x} -> {y} (same tensor, other dialect's name)[/cyan]")
    for tc in d.tensors_changed:
        con.print(f"[yellow]~ tensor {tc.name}: {tc.a_type} ne {list(tc.a_ne)} -> {tc.b_type} ne {list(tc.b_ne)}"
                  "[/yellow]")
    for dc in d.data_differ:
        how = "every row" if dc.whole else f"{dc.rows_compared} of {dc.rows_total} rows"
        con.print(f"[yellow]~ data {dc.name}: bytes differ (first at row {dc.first_diff_row}; {how} "
                  f"compared)[/yellow]")
    for v in d.values:
        if not v.identical:
            rows = "every row" if v.rows_sampled == v.rows_total else f"{v.rows_sampled} of {v.rows_total} rows"
            odd = f"; {v.rows_nonfinite} with NaN or Inf, counted 2 where the files differ" if v.rows_nonfinite else ""
            con.print(f"  values {v.name}: rel err max {v.rel_err_max:.3e} mean {v.rel_err_mean:.3e} ({rows}{odd})")
    comp = d.compared
    if comp is not None:
        con.print(comp.line(), markup=False)
    if d.identical:
        sampled = comp is not None and comp.data_sampled > 0
        con.print("identical" + (" (rows not sampled were not compared: --data whole compares every byte)"
                                 if sampled else ""))
