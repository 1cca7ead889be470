"""The write-ahead log of a trace writer (``DIR/wal/``) and its recovery (:func:`recover`).

Durable to one round: every :meth:`TraceWriter.add_round <traces.store.writer.TraceWriter.add_round>`
appends the round's records to ``wal/part-NNNNN.{steps,rounds}.arrows`` (:class:`WalSegment`: Arrow
IPC stream messages, one ``write`` per message, steps first) before it returns, so a ``kill -9`` loses
at most the round being appended. When the part ``NNNNN`` has been written the segment is deleted.
While a writer is open it holds an exclusive ``flock`` on ``wal/lock`` (released by the kernel when the
process dies). A reader that finds segments and can take the lock (the writer is gone) turns them into
the parts they would have become (:func:`recover`): complete messages are kept, a torn last message is
dropped, steps whose round record is missing are dropped. The log protects against the death of the
process, not of the machine (no ``fsync``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from mtpscope.traces.store import schema as S
from mtpscope.traces.store.layout import (
    WAL_DIR,
    WAL_LOCK,
    merged_files,
    now,
    part_name,
    plain_parts,
    try_lock,
    wal_name,
    wal_segments,
)
from mtpscope.traces.store.manifest import read_manifest, write_manifest
from mtpscope.traces.store.parts import write_part


class WalSegment:
    """The write-ahead segment of one future part: two Arrow IPC streams (steps, rounds) in ``wal/``.

    Each record batch is serialised first and written with one ``os.write`` (no user-space buffer),
    so when :meth:`append` returns the round is in the OS's page cache and survives a ``kill -9``.
    """

    def __init__(self, wal: Path, idx: int, steps_schema: pa.Schema) -> None:
        self.idx = idx
        self.paths = (wal / wal_name(idx, "steps"), wal / wal_name(idx, "rounds"))
        self._fds: list[int] = []
        for path, schema in zip(self.paths, (steps_schema, S.ROUNDS_SCHEMA)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            self._fds.append(fd)
            _write_all(fd, schema.serialize())

    def append(self, rounds: pa.RecordBatch, steps: pa.RecordBatch | None) -> None:
        """Append one round's record batch (and its steps' batch, first)."""
        if steps is not None and steps.num_rows:
            _write_all(self._fds[0], steps.serialize())
        _write_all(self._fds[1], rounds.serialize())

    def close(self) -> None:
        """End both streams (end-of-stream marker) and close them."""
        for fd in self._fds:
            try:
                _write_all(fd, b"\xff\xff\xff\xff\x00\x00\x00\x00")  # end-of-stream marker
            finally:
                os.close(fd)
        self._fds = []

    def remove(self) -> None:
        """Delete both streams (their part is in place)."""
        for p in self.paths:
            p.unlink(missing_ok=True)


def _write_all(fd: int, data: Any) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_wal_stream(path: Path) -> tuple[list[pa.RecordBatch], int]:
    """The complete record batches of one WAL stream, and the number of bytes after the last one
    (a torn tail: 0 when the stream ended cleanly)."""
    size = path.stat().st_size
    batches: list[pa.RecordBatch] = []
    good = 0
    try:
        with pa.memory_map(str(path)) as src:
            reader = pa.ipc.open_stream(src)
            good = src.tell()
            while True:
                try:
                    b = reader.read_next_batch()
                except StopIteration:
                    good = size
                    break
                batches.append(b)
                good = src.tell()
    except (pa.ArrowInvalid, OSError, ValueError):
        pass
    return batches, size - good


@dataclass(frozen=True)
class Recovery:
    """What :func:`recover` did to a trace directory.

    Attributes:
        path: the trace directory.
        status: ``"recovered"`` (segments turned into parts), ``"none"`` (no write-ahead log),
            ``"live"`` (a writer holds the lock: nothing touched), ``"failed"`` (an OS error; see ``error``),
            ``"skipped"`` (:func:`traces.store.reader.open_trace` with ``recover_wal=False``).
        n_rounds / n_steps: rows recovered into new parts.
        parts: the part files written (``part-NNNNN.parquet``).
        torn_bytes: bytes of torn (incomplete) messages dropped.
        n_steps_dropped: steps whose round record was torn.
        error: the OS error's text for ``failed``.
    """

    path: str
    status: str
    n_rounds: int = 0
    n_steps: int = 0
    parts: tuple[str, ...] = ()
    torn_bytes: int = 0
    n_steps_dropped: int = 0
    error: str | None = None


def recover(path: str | os.PathLike[str]) -> Recovery:
    """Turn the write-ahead log of an interrupted writer into the parts it would have written.

    Per segment ``NNNNN`` (in order): if ``rounds/part-NNNNN.parquet`` exists and reads, the segment was
    already written and is deleted; otherwise its complete messages become ``steps/`` and ``rounds/``
    ``part-NNNNN.parquet`` (steps first, each via ``.tmp`` + rename), keeping only steps whose
    ``(prompt_id, round)`` has a round record. Then the manifest's ``counts`` are recomputed from all
    parts and ``recovered`` records what was done (``complete`` stays false). Nothing is touched while
    a writer holds ``wal/lock``.

    Returns:
        :class:`Recovery`.

    Raises:
        TraceFormatError: the manifest is unreadable (as :func:`traces.store.reader.open_trace`).
    """
    p = Path(path)
    segs = wal_segments(p)
    if not segs:
        return Recovery(os.fspath(p), "none")
    try:
        fd = try_lock(p / WAL_DIR / WAL_LOCK, create=True)
    except OSError as e:
        return Recovery(os.fspath(p), "failed", error=str(e))
    if fd is None:
        return Recovery(os.fspath(p), "live")
    try:
        return _recover_locked(p, p / WAL_DIR, segs)
    except OSError as e:
        return Recovery(os.fspath(p), "failed", error=str(e))
    finally:
        os.close(fd)


def _recover_locked(p: Path, wal: Path, segs: dict[int, set[str]]) -> Recovery:
    import pyarrow.compute as pc

    manifest = read_manifest(p)
    steps_schema = S.steps_schema_from_manifest(manifest)
    n_rounds = n_steps = torn = dropped = 0
    written: list[str] = []
    for idx in sorted(segs):
        name = part_name(idx)
        seg_paths = {t: wal / wal_name(idx, t) for t in ("rounds", "steps")}
        done = p / "rounds" / name
        if done.is_file():
            try:
                pq.read_metadata(done)
                ok = True
            except (OSError, pa.ArrowException):
                ok = False
            if ok:
                for sp in seg_paths.values():
                    sp.unlink(missing_ok=True)
                continue
        rb, t_r = _read_wal_stream(seg_paths["rounds"]) if seg_paths["rounds"].is_file() else ([], 0)
        sb, t_s = _read_wal_stream(seg_paths["steps"]) if seg_paths["steps"].is_file() else ([], 0)
        torn += t_r + t_s
        if rb:
            rounds = pa.Table.from_batches(rb).cast(S.ROUNDS_SCHEMA)
            steps = (pa.Table.from_batches(sb).cast(steps_schema) if sb else steps_schema.empty_table())
            keys = pc.add(pc.multiply(pc.cast(rounds["prompt_id"], pa.int64()), 1 << 32),
                          pc.cast(rounds["round"], pa.int64()))
            skeys = pc.add(pc.multiply(pc.cast(steps["prompt_id"], pa.int64()), 1 << 32),
                           pc.cast(steps["round"], pa.int64()))
            keep = pc.is_in(skeys, value_set=keys)
            kept = steps.filter(keep)
            dropped += steps.num_rows - kept.num_rows
            (p / "steps").mkdir(exist_ok=True)
            (p / "rounds").mkdir(exist_ok=True)
            write_part(kept, p / "steps" / name)
            write_part(rounds, p / "rounds" / name)
            n_rounds += rounds.num_rows
            n_steps += kept.num_rows
            written.append(name)
        else:
            dropped += sum(b.num_rows for b in sb)
        for sp in seg_paths.values():
            sp.unlink(missing_ok=True)
    for t in ("rounds", "steps"):     # merged files the writer was building when it died
        for f in merged_files(p, t, tmp_only=True):
            f.unlink(missing_ok=True)
    counts = {"n_rounds": 0, "n_steps": 0, "n_parts": 0}
    for t, key in (("rounds", "n_rounds"), ("steps", "n_steps")):
        files = plain_parts(p, t)
        for f in files:
            try:
                counts[key] += pq.read_metadata(f).num_rows
            except (OSError, pa.ArrowException):
                pass
        if t == "rounds":
            counts["n_parts"] = len(files)
    if "n_requests" in (manifest.get("counts") or {}):
        counts["n_requests"] = manifest["counts"]["n_requests"]
    manifest["counts"] = counts
    manifest["complete"] = False
    manifest["recovered"] = {"at": now(), "n_rounds": n_rounds, "n_steps": n_steps, "parts": written,
                             "torn_bytes": torn, "n_steps_dropped": dropped}
    write_manifest(p, manifest)
    return Recovery(os.fspath(p), "recovered", n_rounds, n_steps, tuple(written), torn, dropped)
