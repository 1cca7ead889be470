"""The trace directory on disk: the names of its files and folders, listing them, and the write-ahead
log's lock. The one home of these facts (users' page: ``docs/TRACE_FORMAT.md``); standard library only,
so the app, the demo's stamp check and the CLI name a trace's files without importing pyarrow.

Layout (schema version 1)::

    DIR/manifest.json                                   MANIFEST
    DIR/rounds/part-00000.parquet ...                   TABLES (one folder per table), part_name(idx)
    DIR/steps/part-00000.parquet ...
    DIR/requests/part-00000.parquet ...                 (server-log imports only)
    DIR/<table>/merged-00000.parquet ...                merged_name(i): a clean close compacts the parts
    DIR/<table>/<name>.tmp                              tmp_path(p): being written, then ``os.replace``d
    DIR/wal/part-NNNNN.log, wal/lock                    WAL_DIR, wal_name(idx), WAL_LOCK
    DIR/wal/part-NNNNN.{steps,rounds}.arrows            legacy_wal_name(idx, table): logs of older writers
    DIR/llama.log                                       LLAMA_LOG: llama.cpp's output (recorded traces)

Which files a reader reads is the manifest's ``parts`` listing when present (written at a clean close),
else the ``part-NNNNN.parquet`` files in index order (:func:`plain_parts`).
"""

from __future__ import annotations

import datetime as _dt
import errno
import os
import re
from pathlib import Path

#: the manifest's file name (JSON; written first, rewritten at close)
MANIFEST = "manifest.json"
#: the tables, each stored as Parquet files in the folder of that name
TABLES = ("rounds", "steps", "requests")
#: the write-ahead log's folder, and its lock file (an exclusive ``flock`` while a writer runs)
WAL_DIR = "wal"
WAL_LOCK = "lock"

#: llama.cpp's own output, kept beside a recorded trace (``mtpscope record``)
LLAMA_LOG = "llama.log"
#: what a trace writer puts at the top of a trace folder (each may also be there as ``<name>.tmp``)
TRACE_ENTRIES = frozenset({MANIFEST, *TABLES, WAL_DIR, LLAMA_LOG})

#: a part file (written every ``flush_every`` rounds); group 1: its index
PART_RE = re.compile(r"^part-(\d{5,})\.parquet$")
#: every Parquet file a writer makes in a table folder: parts and merged files, finished or ``.tmp``
TRACE_FILE_RE = re.compile(r"^(part|merged)-\d{5,}\.parquet(\.tmp)?$")
#: a write-ahead log; group 1: the index of the part it becomes, group 2: ``log``, or ``rounds`` / ``steps``
#: (the two Arrow IPC segments of a log written before the ``.log`` format)
WAL_RE = re.compile(r"^part-(\d{5,})\.(log|(?:rounds|steps)\.arrows)$")


def part_name(idx: int) -> str:
    """The file name of part ``idx`` (the same in every table folder): ``part-NNNNN.parquet``."""
    return f"part-{idx:05d}.parquet"


def merged_name(idx: int) -> str:
    """The file name of merged file ``idx``: ``merged-NNNNN.parquet``."""
    return f"merged-{idx:05d}.parquet"


def wal_name(idx: int) -> str:
    """The file name (in ``wal/``) of the write-ahead log of part ``idx``: ``part-NNNNN.log``."""
    return f"part-{idx:05d}.log"


def legacy_wal_name(idx: int, table: str) -> str:
    """The file name (in ``wal/``) of a write-ahead segment of part ``idx`` as writers before the
    ``.log`` format wrote it, ``table`` being ``rounds`` or ``steps``: ``part-NNNNN.<table>.arrows``."""
    return f"part-{idx:05d}.{table}.arrows"


def tmp_path(path: Path) -> Path:
    """Where ``path`` is written before it is renamed into place: ``<name>.tmp`` beside it."""
    return path.with_name(path.name + ".tmp")


def foreign_entries(path: str | os.PathLike[str]) -> list[str]:
    """The names at the top of the folder ``path`` that no trace writer makes (not in :data:`TRACE_ENTRIES`,
    nor one of those with ``.tmp``), sorted; ``[]`` when ``path`` is not a folder. Replacing a trace replaces
    its whole folder, so these are what that would delete besides the trace."""
    try:
        names = os.listdir(path)
    except OSError:
        return []
    return sorted(n for n in names if n not in TRACE_ENTRIES and n.removesuffix(".tmp") not in TRACE_ENTRIES)


def foreign_message(names: list[str]) -> str:
    """The one line that refuses to replace a trace folder holding ``names`` besides the trace
    (:func:`foreign_entries`)."""
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"replacing the trace replaces its whole folder, which also holds {shown}: move "
            f"{'it' if len(names) == 1 else 'them'} out, or write the trace to another folder")


def holds_trace(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a trace (a manifest or Parquet parts in ``rounds/`` / ``steps/``)."""
    path = Path(path)
    if (path / MANIFEST).exists():
        return True
    return any(plain_parts(path, t) for t in ("rounds", "steps"))


def plain_parts(path: str | os.PathLike[str], table: str) -> list[Path]:
    """The finished ``part-NNNNN.parquet`` files of ``table`` in the trace ``path``, by index (no merged
    files, no ``.tmp``); ``[]`` when the folder is missing."""
    d = Path(path) / table
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := PART_RE.match(p.name))]
    return [p for _, p in sorted(found, key=lambda t: t[0])]


def merged_files(path: str | os.PathLike[str], table: str, *, tmp_only: bool) -> list[Path]:
    """The merged files of ``table`` in the trace ``path``: only those being written
    (``merged-*.parquet.tmp``) with ``tmp_only``, else every ``merged-*`` file, finished or not."""
    d = Path(path) / table
    if not d.is_dir():
        return []
    return sorted(d.glob("merged-*.parquet.tmp" if tmp_only else "merged-*"))


def writer_files(path: str | os.PathLike[str]) -> list[Path]:
    """Every Parquet file a writer made in the trace ``path`` (:data:`TRACE_FILE_RE`, all tables, ``.tmp``
    included): what replacing a trace deletes besides the manifest and the write-ahead log."""
    p = Path(path)
    return [f for t in TABLES if (p / t).is_dir() for f in (p / t).iterdir() if TRACE_FILE_RE.match(f.name)]


def trace_files(path: str | os.PathLike[str]) -> list[Path]:
    """The files that make the trace ``path`` as it stands: the manifest (when present), then per table
    (:data:`TABLES` order) every finished part and merged file, by name. Not the write-ahead log, not
    ``.tmp`` files. For a cache key: any write that changes what a reader sees changes one of these
    (a new name, or a new size / mtime)."""
    p = Path(path)
    out = [p / MANIFEST] if (p / MANIFEST).is_file() else []
    for t in TABLES:
        d = p / t
        if d.is_dir():
            out += sorted(f for f in d.iterdir() if TRACE_FILE_RE.match(f.name) and not f.name.endswith(".tmp"))
    return out


def wal_segments(path: str | os.PathLike[str]) -> dict[int, set[str]]:
    """The write-ahead logs in the trace ``path``'s ``wal/``: part index -> what it has (``{"log"}``; a
    legacy log: ``{"rounds", "steps"}`` or one of them); ``{}`` when there is no log."""
    wal = Path(path) / WAL_DIR
    segs: dict[int, set[str]] = {}
    if wal.is_dir():
        for p in wal.iterdir():
            m = WAL_RE.match(p.name)
            if m:
                segs.setdefault(int(m.group(1)), set()).add(m.group(2).split(".")[0])
    return segs


def wal_files(path: str | os.PathLike[str]) -> list[Path]:
    """The write-ahead log files in the trace ``path``'s ``wal/``, legacy ones too (any order)."""
    wal = Path(path) / WAL_DIR
    return [p for p in wal.iterdir() if WAL_RE.match(p.name)] if wal.is_dir() else []


def now() -> str:
    """The current UTC time, ISO 8601 with seconds (the manifest's ``created``, ``recovered.at``)."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def try_lock(path: Path, create: bool) -> int | None:
    """An fd holding an exclusive, non-blocking ``flock`` on ``path``, or None when another open file
    holds it (a live writer) or the file is missing and ``create`` is false.

    Raises:
        OSError: opening or locking failed for another reason than the lock being held.
    """
    import fcntl  # POSIX only, like the rest of the recorder

    try:
        fd = os.open(path, (os.O_RDWR | os.O_CREAT) if create else os.O_RDONLY, 0o644)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return None
        raise
    return fd
