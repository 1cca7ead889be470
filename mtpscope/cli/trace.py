"""CLI commands: ``mtpscope trace ...`` (maintenance of trace directories).

``mtpscope trace repair DIR [--json]``: turn the write-ahead log of an interrupted recording
(``DIR/wal/``, see ``traces/store/wal.py``) into Parquet parts, recount the manifest, delete the unfinished
``.tmp`` parts a writer that died left behind (also when there is no log to recover) and list any part
that does not read. Opening a trace (``traces.open``, ``report``, the app) does the same recovery but
leaves the ``.tmp`` files (it only reads); this command does it on purpose and says what it did.

Exit codes: 0 done (also when there was nothing to do); 1 a writer is still running in DIR (nothing
touched); 2 unreadable trace or an OS error (one line on stderr).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

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
        """Recover an interrupted trace's write-ahead log into parts, recount its manifest and delete the
        unfinished (.tmp) parts a writer left behind. Exit 1 while a recorder still writes it, when a log
        could not be read to its end (kept as wal/<name>.damaged, the rounds before the damage recovered), or when
        parts cannot be read (each named on stderr)."""
        from mtpscope.traces.store.manifest import correct_counts
        from mtpscope.traces.store.reader import open_trace, read_manifest
        from mtpscope.traces.store.wal import recover

        with one_line_errors():
            read_manifest(path)  # not a trace: the reader's one-line error, before anything is touched
            rec = recover(path)
            if rec.status == "failed":
                print(f"mtpscope: {path}: write-ahead log not recovered: {rec.error}", file=sys.stderr)
                raise typer.Exit(EXIT_UNREADABLE)
            # the .tmp parts of a writer that died (also with no log to recover); None: a writer runs
            got = None if rec.status == "live" else remove_unfinished(path)
            # (with the merged files the recovery deleted itself: it said it removed none)
            removed = None if got is None else tuple(sorted({*rec.tmp_removed, *got}))
            status = "live" if removed is None and rec.status == "none" else rec.status
            t = open_trace(path, recover_wal=False)
            t.check_parts(full=True)     # every page: a damaged one is named here, not by the next command to read it
            n_rounds, n_steps = len(t.columns("rounds", ["round"])), len(t.columns("steps", ["k"]))
            # the manifest recounted: its counts made the rows read where every part read (a lost part: its count
            # says what was recorded, and is kept)
            fixed = correct_counts(path, t.manifest, n_rounds, n_steps) if status != "live" and not t.skipped else {}
        out: dict[str, Any] = {"path": str(path), "status": status, "recovered_rounds": rec.n_rounds,
                               "recovered_steps": rec.n_steps, "parts_written": list(rec.parts),
                               "torn_bytes": rec.torn_bytes, "steps_dropped": rec.n_steps_dropped,
                               "rounds_invalid": rec.n_rounds_invalid, "problems": list(rec.problems),
                               "tmp_removed": list(removed or ()),
                               "n_rounds": n_rounds, "n_steps": n_steps,
                               "counts_corrected": {k: list(v) for k, v in fixed.items()},
                               "complete": bool(t.manifest.get("complete")), "aborted": t.manifest.get("aborted"),
                               # (while a recorder writes it: not "an interrupted run's log not read")
                               "warnings": [w for w in t.warnings if "trace is incomplete" not in w
                                            and not (status == "live" and "log of an interrupted run" in w)]}
        if as_json:
            typer.echo(json.dumps(out, indent=2))
        else:
            if status == "live":
                typer.echo(f"{path}: a recorder is still writing this trace (it holds wal/lock); nothing touched")
            elif status == "recovered":
                typer.echo(f"{path}: {rec.words()}")
            else:
                typer.echo(f"{path}: no write-ahead log to recover")
            if fixed:
                typer.echo(f"{path}: manifest counts corrected: "
                           + ", ".join(f"{k} {old!r} -> {new}" for k, (old, new) in fixed.items()))
            if removed:
                typer.echo(f"{path}: removed {len(removed)} unfinished part{'s' if len(removed) != 1 else ''} "
                           f"(.tmp) a writer left: {', '.join(removed)}")
            state = "complete" if out["complete"] else "incomplete"
            counted = (t.manifest.get("counts") or {}).get("n_rounds")
            skipped = f" readable (the manifest counts {counted}; parts skipped: see the warnings)" if (
                out["warnings"] and isinstance(counted, int) and counted != n_rounds) else ""
            typer.echo(f"trace: {n_rounds} rounds, {n_steps} draft steps{skipped}, {state}")
            ab = out["aborted"]
            if isinstance(ab, dict):
                typer.echo(f"aborted: {ab.get('where') or ''}: {ab.get('message') or ab.get('signal') or ''}")
        for w in out["warnings"]:       # (on stderr, as every command's warnings; --json has them too)
            print(f"warning: {w}", file=sys.stderr)
        for prob in rec.problems:       # a log not read to its end (exit 1): named on stderr too, as the help says
            print(f"mtpscope: {path}: {prob}", file=sys.stderr)
        # exit 1: a recorder still writes it, a log not read to its end, or parts that cannot be read
        raise typer.Exit(EXIT_FINDINGS if status == "live" or rec.problems or out["warnings"] else EXIT_OK)


def remove_unfinished(path: Path) -> tuple[str, ...] | None:
    """Delete the unfinished Parquet files (``<table>/part-NNNNN.parquet.tmp``, ``merged-NNNNN.parquet.tmp``) that a
    writer which died left in the trace ``path`` (readers skip them, with a warning). Nothing is touched while a
    writer holds ``wal/lock``.

    Returns:
        the deleted files relative to ``path`` (``rounds/part-00003.parquet.tmp``), sorted; ``()`` when there were
        none; None when a writer holds the lock (nothing deleted).

    Raises:
        OSError: the lock or a file could not be opened / deleted for another reason.
    """
    import os

    from mtpscope.traces.store.layout import WAL_DIR, WAL_LOCK, try_lock, writer_files

    lock = path / WAL_DIR / WAL_LOCK
    fd = None
    if lock.exists():
        fd = try_lock(lock, create=False)
        if fd is None and lock.exists():      # held: a writer runs (a lock gone meanwhile: its writer closed)
            return None
    try:
        tmps = sorted(f for f in writer_files(path) if f.name.endswith(".tmp"))
        for f in tmps:
            f.unlink(missing_ok=True)
    finally:
        if fd is not None:
            os.close(fd)
    return tuple(f.relative_to(path).as_posix() for f in tmps)
