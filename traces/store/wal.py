"""The write-ahead log of a trace writer (``DIR/wal/``) and its recovery (:func:`recover`).

Durable to one round: every :meth:`TraceWriter.add_round <traces.store.writer.TraceWriter.add_round>`
appends the round and its steps to ``wal/part-NNNNN.log`` (:class:`WalLog`, one record per round, one
``write`` per record) before it returns, so a ``kill -9`` loses at most the round being appended. When the
part ``NNNNN`` has been written the log is deleted. While a writer is open it holds an exclusive ``flock``
on ``wal/lock`` (released by the kernel when the process dies). A reader that finds logs and can take the
lock (the writer is gone) turns them into the parts they would have become (:func:`recover`): complete
records are kept, a torn last record is dropped. The log protects against the death of the process, not
of the machine (no ``fsync``).

The log file (little-endian; docs/TRACE_FORMAT.md): a sequence of records, each a 16-byte frame
(``b"MTPW"``, the body's length, the CRC-32 of the body, the length of its JSON head) and the body: the
JSON head, then raw bytes. The first record's head describes the file (:data:`WAL_FORMAT`, the column
names, the hidden-state dtype and widths); each later record is one round: the head
``[round values, [values of each step], [for each step, which hidden states follow (0/1 per column)]]``
in the first record's column order, the bytes the hidden states in that order (the trace's dtype,
C order). Rounds become Arrow tables once per part (:mod:`traces.store.columns`), not once per round:
a record costs a JSON encoding and one ``write``.

Logs of writers before this format (``part-NNNNN.{steps,rounds}.arrows``, Arrow IPC streams, one record
batch per round) are still recovered.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, fields
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mtpscope.errors import TraceFormatError
from mtpscope.traces.store import schema as S
from mtpscope.traces.store.columns import Item, hidden_dtype_of, to_tables
from mtpscope.traces.store.layout import (
    WAL_DIR,
    WAL_LOCK,
    legacy_wal_name,
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
from mtpscope.traces.store.records import RoundRecord, StepRecord

#: the first record's ``format`` and ``version``
WAL_FORMAT = ("mtpscope-wal", 1)
#: a record's frame: magic, body length, CRC-32 (zlib) of the body, JSON head length
_FRAME = struct.Struct("<4sIII")
_MAGIC = b"MTPW"
_ROUND_FIELDS = tuple(f.name for f in fields(RoundRecord))
_STEP_FIELDS = tuple(f.name for f in fields(StepRecord))


def _plain(o: Any) -> Any:
    """JSON for the numpy scalars a record may hold (``np.float32`` logits, ``np.bool_``)."""
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


def _write_all(fd: int, data: Any) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _write_record(fd: int, head: bytes, blobs: list[bytes]) -> None:
    """One record (frame, head, blobs) with one ``writev`` (a short write finishes with ``write``)."""
    crc = zlib.crc32(head)
    size = len(head)
    for b in blobs:
        crc = zlib.crc32(b, crc)
        size += len(b)
    parts = [_FRAME.pack(_MAGIC, size, crc, len(head)), head, *blobs]
    n = os.writev(fd, parts)
    if n < size + _FRAME.size:
        _write_all(fd, memoryview(b"".join(parts))[n:])


class WalLog:
    """The write-ahead log of one future part: ``wal/part-NNNNN.log`` (see the module's docstring).

    Each record is written with one ``writev`` (no user-space buffer), so when :meth:`append` returns the
    round is in the OS's page cache and survives a ``kill -9``.

    Raises:
        OSError: the file cannot be created or written.
    """

    def __init__(self, wal: Path, idx: int, steps_schema: pa.Schema) -> None:
        self.idx = idx
        self.paths = (wal / wal_name(idx),)
        self._hidden = [(n, dt) for n in S.HIDDEN_COLUMNS if (dt := hidden_dtype_of(steps_schema, n)) is not None]
        steps = [f.name for f in steps_schema
                 if f.name not in ("prompt_id", "round") and f.name not in S.HIDDEN_COLUMNS]
        self._round_values = attrgetter(*S.ROUNDS_COLUMNS)
        self._step_values = attrgetter(*steps)
        head = {"format": WAL_FORMAT[0], "version": WAL_FORMAT[1], "rounds": list(S.ROUNDS_COLUMNS),
                "steps": steps, "hidden": [n for n, _ in self._hidden],
                "dtypes": [dt.name for _, dt in self._hidden],
                "widths": [steps_schema.field(n).type.list_size for n, _ in self._hidden]}
        self._fd: int | None = os.open(self.paths[0], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        _write_record(self._fd, json.dumps(head).encode(), [])

    def append(self, round: RoundRecord, steps: Sequence[StepRecord]) -> None:
        """Append one round and its steps as one record.

        Raises:
            TypeError / ValueError: a value JSON cannot hold (the writer reports it as bad input).
            OSError: the write failed.
        """
        if self._fd is None:
            raise OSError(f"{self.paths[0]}: write-ahead log already closed")
        blobs: list[bytes] = []
        present: list[list[int]] = []
        for s in steps:
            flags = []
            for name, dt in self._hidden:
                v = getattr(s, name)
                flags.append(0 if v is None else 1)
                if v is not None:
                    blobs.append(np.asarray(v, dtype=dt).tobytes())
            present.append(flags)
        head = json.dumps([self._round_values(round), [self._step_values(s) for s in steps], present],
                          separators=(",", ":"), default=_plain).encode()
        _write_record(self._fd, head, blobs)

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def remove(self) -> None:
        """Delete the log (its part is in place)."""
        for p in self.paths:
            p.unlink(missing_ok=True)


@dataclass(frozen=True)
class LogRead:
    """What :func:`read_log` found in one log.

    Attributes:
        items: the complete rounds, in order, each with its steps.
        torn_bytes: bytes after the last complete record that were not recovered (0 when none).
        n_steps_dropped: steps of a torn last record, when its head could be read (else 0).
        n_rounds_invalid: complete records that are not a valid round of this trace.
        problem: ``None`` when the log ended cleanly or with a torn last record (what a ``kill -9`` leaves);
            else one line saying what could not be read and where (``at offset N: ...``): a corrupt record
            (bad magic, lengths or CRC-32 with its bytes all there), or a first record that is not this
            format's (another version, garbage). The log is then to be kept, not deleted.
    """

    items: tuple[Item, ...]
    torn_bytes: int = 0
    n_steps_dropped: int = 0
    n_rounds_invalid: int = 0
    problem: str | None = None


def _records(data: memoryview) -> tuple[list[tuple[bytes, memoryview]], int, bytes | None, str | None]:
    """The complete records of a log: (head, blob) each; the offset after the last one; the head of a torn
    last record when its head is whole (else None); what is wrong past that offset when it is not a torn last
    record (``None`` for a clean end or a torn one)."""
    out: list[tuple[bytes, memoryview]] = []
    off, size = 0, len(data)
    while off + _FRAME.size <= size:
        magic, n, crc, nh = _FRAME.unpack_from(data, off)
        if magic != _MAGIC or nh > n:
            return out, off, None, f"at offset {off}: not a record (bad magic or lengths)"
        start = off + _FRAME.size
        if start + n > size:          # the body runs past the end: the last record, cut short
            return out, off, bytes(data[start: start + nh]) if start + nh <= size else None, None
        body = data[start: start + n]
        if zlib.crc32(body) != crc:
            return out, off, None, f"at offset {off}: record corrupt (CRC-32 mismatch)"
        out.append((bytes(body[:nh]), body[nh:]))
        off = start + n
    if off < size and data[off: off + 4] != _MAGIC[: size - off]:
        return out, off, None, f"at offset {off}: not a record (bad magic)"
    return out, off, None, None


def read_log(path: Path) -> LogRead:
    """The rounds of one write-ahead log (:class:`WalLog`'s format).

    The complete records before the first one that cannot be read are kept. A torn last record (what a
    ``kill -9`` mid-write leaves) is dropped; anything else that cannot be read is said in ``problem`` (the log
    is then kept by :func:`recover`). A complete record that does not make a valid round
    (:class:`RoundRecord` / :class:`StepRecord` invariants, a hidden state of the wrong size) is dropped and
    counted.

    Raises:
        OSError: the file cannot be read.
    """
    data = memoryview(path.read_bytes())
    records, good, torn_head, problem = _records(data)
    torn = len(data) - good
    torn_steps = 0
    if torn_head is not None:
        try:
            torn_steps = len(json.loads(torn_head)[1])
        except (ValueError, TypeError, IndexError, KeyError):
            torn_steps = 0
    if not records:
        return LogRead((), torn, torn_steps, 0, problem)
    try:
        desc = json.loads(records[0][0])
        if not isinstance(desc, dict) or (desc.get("format"), desc.get("version")) != WAL_FORMAT:
            got = (desc.get("format"), desc.get("version")) if isinstance(desc, dict) else type(desc).__name__
            raise ValueError(f"expected {WAL_FORMAT[0]} version {WAL_FORMAT[1]}, got {got}")
        rnames, snames = list(desc["rounds"]), list(desc["steps"])
        hidden = [(str(n), np.dtype(d), int(w)) for n, d, w in zip(desc["hidden"], desc["dtypes"], desc["widths"],
                                                                    strict=True)]
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        return LogRead((), len(data), 0, 0, f"at offset 0: not a log this version reads ({e})")
    items: list[Item] = []
    bad = 0
    for head, blob in records[1:]:
        try:
            rv, svs, present = json.loads(head)
            r = RoundRecord(**{k: v for k, v in zip(rnames, rv, strict=True) if k in _ROUND_FIELDS})
            steps, off = [], 0
            for sv, flags in zip(svs, present, strict=True):
                kw = {k: v for k, v in zip(snames, sv, strict=True) if k in _STEP_FIELDS}
                for (name, dt, width), on in zip(hidden, flags, strict=True):
                    if on:
                        nb = width * dt.itemsize
                        if off + nb > len(blob):
                            raise ValueError("hidden state past the record's end")
                        kw[name] = np.frombuffer(blob[off: off + nb], dtype=dt)
                        off += nb
                steps.append(StepRecord(**kw))
        except (ValueError, TypeError, KeyError, TraceFormatError):
            bad += 1
            continue
        items.append((r, steps))
    return LogRead(tuple(items), torn, torn_steps, bad, problem)


def _read_legacy_stream(path: Path) -> tuple[list[pa.RecordBatch], int]:
    """The complete record batches of one legacy Arrow IPC segment, and the number of bytes after the
    last one (a torn tail: 0 when the stream ended cleanly)."""
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
        status: ``"recovered"`` (logs turned into parts), ``"none"`` (no write-ahead log),
            ``"live"`` (a writer holds the lock: nothing touched), ``"failed"`` (an OS error; see ``error``),
            ``"skipped"`` (:func:`traces.store.reader.open_trace` with ``recover_wal=False``).
        n_rounds / n_steps: rows recovered into new parts.
        parts: the part files written (``part-NNNNN.parquet``).
        torn_bytes: bytes of torn (incomplete) records dropped.
        n_steps_dropped: steps of torn rounds (the steps of a torn round record in a legacy log).
        n_rounds_invalid: complete rounds dropped: invalid values, or values that do not fit the trace's schema.
        problems: one line per log that could not be read to its end, naming it, the offset and what was wrong
            there (a corrupt record, another format); such a log is kept beside the parts as
            ``wal/<name>.damaged`` (never read again, never deleted), the rounds before the damage recovered.
        error: the OS error's text for ``failed``.
        tmp_removed: the merged files the dead writer was building (``<table>/merged-NNNNN.parquet.tmp``), deleted.
    """

    path: str
    status: str
    n_rounds: int = 0
    n_steps: int = 0
    parts: tuple[str, ...] = ()
    torn_bytes: int = 0
    n_steps_dropped: int = 0
    n_rounds_invalid: int = 0
    problems: tuple[str, ...] = ()
    error: str | None = None
    tmp_removed: tuple[str, ...] = ()

    def words(self) -> str:
        """What a ``recovered`` recovery did, in one line (the reader's warning and ``trace repair`` print it):
        the rounds and steps recovered and into which parts, a torn last round, rounds that did not fit, and
        each log that could not be read to its end (:attr:`problems`)."""
        steps = f"{self.n_steps} step{'' if self.n_steps == 1 else 's'}"
        line = (f"{_rounds_words(self.n_rounds)} ({steps}) recovered from the write-ahead log of an interrupted run"
                + (f" into {', '.join(self.parts)}" if self.parts else ""))
        if self.torn_bytes:
            line += f"; a torn last round dropped ({self.torn_bytes} bytes)"
        if self.n_rounds_invalid:
            line += f"; {_rounds_words(self.n_rounds_invalid)} whose values do not fit the trace's schema dropped"
        return "; ".join([line, *self.problems])


#: what a write-ahead log that could not be read to its end is renamed to (``wal/<name>`` + this)
DAMAGED_SUFFIX = ".damaged"


def recover(path: str | os.PathLike[str]) -> Recovery:
    """Turn the write-ahead log of an interrupted writer into the parts it would have written.

    Per log ``NNNNN`` (in order): if ``rounds/part-NNNNN.parquet`` exists and reads, the log was already
    written and is deleted; otherwise its complete records become ``steps/`` and ``rounds/``
    ``part-NNNNN.parquet`` (steps first, each via ``.tmp`` + rename). Legacy Arrow segments keep only
    steps whose ``(prompt_id, round)`` has a round record. A log read to its end (or to a torn last record)
    is deleted; one that could not be read to its end is renamed ``<name>.damaged`` and said in ``problems``.
    Then the manifest's ``counts`` are recomputed from all parts and ``recovered`` records what was done
    (``complete`` stays false). Nothing is touched while a writer holds ``wal/lock``.

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


def _part_exists(done: Path) -> bool:
    if not done.is_file():
        return False
    try:
        pq.read_metadata(done)
    except (OSError, pa.ArrowException):
        return False
    return True


def _legacy_tables(seg_paths: dict[str, Path], steps_schema: pa.Schema) -> tuple[pa.Table | None, pa.Table, int, int]:
    """A legacy segment's rounds (None when it has none) and kept steps, bytes not read, steps dropped."""
    import pyarrow.compute as pc

    rb, t_r = _read_legacy_stream(seg_paths["rounds"]) if seg_paths["rounds"].is_file() else ([], 0)
    sb, t_s = _read_legacy_stream(seg_paths["steps"]) if seg_paths["steps"].is_file() else ([], 0)
    if not rb:
        return None, steps_schema.empty_table(), t_r + t_s, sum(b.num_rows for b in sb)
    rounds = pa.Table.from_batches(rb).cast(S.ROUNDS_SCHEMA)
    steps = pa.Table.from_batches(sb).cast(steps_schema) if sb else steps_schema.empty_table()
    keys = pc.add(pc.multiply(pc.cast(rounds["prompt_id"], pa.int64()), 1 << 32),
                  pc.cast(rounds["round"], pa.int64()))
    skeys = pc.add(pc.multiply(pc.cast(steps["prompt_id"], pa.int64()), 1 << 32),
                   pc.cast(steps["round"], pa.int64()))
    kept = steps.filter(pc.is_in(skeys, value_set=keys))
    return rounds, kept, t_r + t_s, steps.num_rows - kept.num_rows


def _recover_locked(p: Path, wal: Path, segs: dict[int, set[str]]) -> Recovery:
    manifest = read_manifest(p)
    steps_schema = S.steps_schema_from_manifest(manifest)
    n_rounds = n_steps = torn = dropped = rounds_invalid = 0
    written: list[str] = []
    problems: list[str] = []
    for idx in sorted(segs):
        name = part_name(idx)
        log = wal / wal_name(idx)
        legacy = {t: wal / legacy_wal_name(idx, t) for t in ("rounds", "steps")}
        damaged: list[Path] = []          # logs not read to their end: kept, renamed
        if not _part_exists(p / "rounds" / name):
            rounds: pa.Table | None
            if log.is_file():
                lr = read_log(log)
                conv = to_tables(lr.items, steps_schema)
                rounds, steps = (conv.rounds if conv.rounds.num_rows else None), conv.steps
                rounds_invalid += lr.n_rounds_invalid + len(conv.bad)
                if lr.problem is None:
                    torn += lr.torn_bytes
                    dropped += lr.n_steps_dropped
                else:
                    damaged.append(log)
                    problems.append(f"{WAL_DIR}/{log.name}: {lr.problem}: {_rounds_words(len(lr.items))} before it "
                                    f"recovered, the {lr.torn_bytes} bytes from there on not read; the log kept as "
                                    f"{WAL_DIR}/{log.name}{DAMAGED_SUFFIX}")
            else:
                rounds, steps, t_bytes, d = _legacy_tables(legacy, steps_schema)
                dropped += d
                if t_bytes:
                    kept = [sp for sp in legacy.values() if sp.is_file()]
                    damaged += kept
                    problems.append(f"{', '.join(f'{WAL_DIR}/{sp.name}' for sp in kept)} (an older writer's log): "
                                    f"{t_bytes} bytes could not be read (a torn or corrupt end): "
                                    f"{_rounds_words(0 if rounds is None else rounds.num_rows)} before them recovered, "
                                    f"the files kept as {DAMAGED_SUFFIX}")
            if rounds is not None:
                (p / "steps").mkdir(exist_ok=True)
                (p / "rounds").mkdir(exist_ok=True)
                write_part(steps, p / "steps" / name)
                write_part(rounds, p / "rounds" / name)
                n_rounds += rounds.num_rows
                n_steps += steps.num_rows
                written.append(name)
        for sp in damaged:
            os.replace(sp, sp.with_name(sp.name + DAMAGED_SUFFIX))
        for sp in (log, *legacy.values()):
            sp.unlink(missing_ok=True)
    tmp_removed: list[str] = []
    for t in ("rounds", "steps"):     # merged files the writer was building when it died
        for f in merged_files(p, t, tmp_only=True):
            f.unlink(missing_ok=True)
            tmp_removed.append(f"{t}/{f.name}")
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
                             "torn_bytes": torn, "n_steps_dropped": dropped, "n_rounds_invalid": rounds_invalid,
                             "problems": problems}
    write_manifest(p, manifest)
    return Recovery(os.fspath(p), "recovered", n_rounds, n_steps, tuple(written), torn, dropped, rounds_invalid,
                    tuple(problems), tmp_removed=tuple(tmp_removed))


def _rounds_words(n: int) -> str:
    return f"{n} round{'' if n == 1 else 's'}"
