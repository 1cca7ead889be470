"""CLI commands: ``mtpscope trace ...`` (maintenance of trace directories).

``mtpscope trace repair DIR [--json]``: turn the write-ahead log of an interrupted recording
(``DIR/wal/``, see ``traces/store/wal.py``) into Parquet parts, recount the manifest and list any part
that does not read. Opening a trace (``traces.open``, ``report``, the app) does the same recovery; this
command does it on purpose and says what it did.

Exit codes: 0 done (also when there was nothing to do); 1 a writer is still running in DIR (nothing
touched); 2 unreadable trace or an OS error (one line on stderr).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from mtpscope.cli.common import EXIT_FINDINGS, EXIT_OK, EXIT_UNREADABLE, one_line_errors


def register(app: typer.Typer) -> None:
    """Add the ``trace`` command group to the root ``mtpscope`` app."""
    trace_app = typer.Typer(help="Maintenance of trace directories.", no_args_is_help=True)
    app.add_typer(trace_app, name="trace")

    @trace_app.command("repair")
    def repair_cmd(
        path: Path = typer.Argument(..., help="Trace directory."),
        as_json: bool = typer.Option(False, "--json", help="Print what was done as JSON."),
    ) -> None:
        """Recover an interrupted trace's write-ahead log into parts and recount its manifest."""
        from mtpscope.traces.store.reader import open_trace
        from mtpscope.traces.store.wal import recover

        with one_line_errors():
            if not path.is_dir():
                open_trace(path)  # raises the reader's one-line error
            rec = recover(path)
            if rec.status == "failed":
                print(f"mtpscope: {path}: write-ahead log not recovered: {rec.error}", file=sys.stderr)
                raise typer.Exit(EXIT_UNREADABLE)
            t = open_trace(path, recover_wal=False)
            t.check_parts()
            n_rounds, n_steps = len(t.columns("rounds", ["round"])), len(t.columns("steps", ["k"]))
        out = {"path": str(path), "status": rec.status, "recovered_rounds": rec.n_rounds,
               "recovered_steps": rec.n_steps, "parts_written": list(rec.parts), "torn_bytes": rec.torn_bytes,
               "steps_dropped": rec.n_steps_dropped, "n_rounds": n_rounds, "n_steps": n_steps,
               "complete": bool(t.manifest.get("complete")), "aborted": t.manifest.get("aborted"),
               "warnings": [w for w in t.warnings if "trace is incomplete" not in w]}
        if as_json:
            typer.echo(json.dumps(out, indent=2))
        else:
            if rec.status == "live":
                typer.echo(f"{path}: a recorder is still writing this trace (it holds wal/lock); nothing touched")
            elif rec.status == "recovered":
                torn = f", dropped a torn last round ({rec.torn_bytes} bytes)" if rec.torn_bytes else ""
                typer.echo(f"{path}: recovered {rec.n_rounds} rounds ({rec.n_steps} steps) from the write-ahead "
                           f"log into {', '.join(rec.parts) or 'no part'}{torn}")
            else:
                typer.echo(f"{path}: no write-ahead log to recover")
            state = "complete" if out["complete"] else "incomplete"
            typer.echo(f"trace: {n_rounds} rounds, {n_steps} draft steps, {state}")
            ab = out["aborted"]
            if isinstance(ab, dict):
                typer.echo(f"aborted: {ab.get('where') or ''}: {ab.get('message') or ab.get('signal') or ''}")
            for w in out["warnings"]:
                typer.echo(f"warning: {w}")
        raise typer.Exit(EXIT_FINDINGS if rec.status == "live" else EXIT_OK)
