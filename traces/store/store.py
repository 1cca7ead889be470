"""Trace directories: crash-safe writing (:class:`TraceWriter`) and reading (:func:`open_trace`).

Layout (schema version 1, see ``docs/TRACE_FORMAT.md``)::

    DIR/manifest.json
    DIR/rounds/part-00000.parquet ...
    DIR/steps/part-00000.parquet ...
    DIR/requests/part-00000.parquet ...   (server-log imports only)

Crash safety: the manifest is written first (``complete: false``) by write-to-temp + ``os.replace``;
each part is written to ``part-NNNNN.parquet.tmp`` and ``os.replace``d, steps part before rounds part,
so a ``kill -9`` leaves only finished parts plus at most one ``.tmp`` (ignored by the reader). A clean
close rewrites the manifest with ``complete: true`` and the counts. Parts carry Parquet page checksums,
verified on read.

Durable to one round (write-ahead log): every :meth:`TraceWriter.add_round` also appends the round's
records to ``DIR/wal/part-NNNNN.{steps,rounds}.arrows`` (Arrow IPC stream messages, one ``write`` per
message, steps first) before it returns, so a ``kill -9`` loses at most the round being appended. When
the part ``NNNNN`` has been written the segment is deleted. While a writer is open it holds an
exclusive ``flock`` on ``DIR/wal/lock`` (released by the kernel when the process dies). A reader that
finds WAL segments and can take the lock (the writer is gone) turns them into the parts they would
have become (:func:`recover`): complete messages are kept, a torn last message is dropped, steps
whose round record is missing are dropped. The WAL protects against the death of the process, not of
the machine (no ``fsync``).

Reading: :func:`open_trace` never fails because of one bad part; a torn or unreadable part is skipped
with a warning naming the file (``Trace.warnings``) and the rest is read.

Replacing a trace (``record --overwrite``): :func:`holds_trace`, :func:`partial_dir` (where the new
one is written) and :func:`swap_in` (moved in only once complete, so a failed run keeps the old one).
"""

from __future__ import annotations

import datetime as _dt
import errno
import json
import os
import queue
import re
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from mtpscope.errors import TraceError, TraceFormatError
from mtpscope.traces.store import schema as S
from mtpscope.traces.store.records import RoundRecord, StepRecord

MANIFEST = "manifest.json"
WAL_DIR = "wal"
_WAL_LOCK = "lock"
_WAL_RE = re.compile(r"^part-(\d{5,})\.(rounds|steps)\.arrows$")
_PART_RE = re.compile(r"^part-(\d{5,})\.parquet$")
_OURS_RE = re.compile(r"^(part|merged)-\d{5,}\.parquet(\.tmp)?$")
COMPACT_ROUNDS = 65536
_ROW_GROUP_ROUNDS = 8192
_ROW_GROUP_BYTES = 64 << 20
_NP_HIDDEN = {"f16": np.float16, "f32": np.float32}
_NULLABLE_PANDAS = {pa.int32(): pd.Int32Dtype(), pa.bool_(): pd.BooleanDtype()}


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, os.PathLike):
        return os.fspath(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        text = json.dumps(obj, indent=2, default=_json_default, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TraceFormatError(f"manifest is not JSON serialisable: {e}", path=path) from None
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text + "\n")
    os.replace(tmp, path)


def _writer_options(schema: pa.Schema) -> dict[str, Any]:
    """Parquet options: zstd + dictionary for ordinary columns; hidden states (incompressible floats)
    stored plain, uncompressed, without statistics, which is many times faster to write and read."""
    hidden = [f.name for f in schema if f.name in S.HIDDEN_COLUMNS and not pa.types.is_null(f.type)]
    if not hidden:
        return {"compression": "zstd", "write_page_checksum": True}
    leaves = {n: f"{n}.list.element" for n in hidden}
    others = [f.name for f in schema if f.name not in leaves]
    return {
        "compression": {**{n: "zstd" for n in others}, **{leaf: "none" for leaf in leaves.values()}},
        "use_dictionary": others,
        "write_statistics": others,
        "write_page_checksum": True,
    }


def _write_part(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, **_writer_options(table.schema))
    os.replace(tmp, path)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ---------------------------------------------------------------------- write-ahead log
def _try_lock(path: Path, create: bool) -> int | None:
    """An fd holding an exclusive, non-blocking ``flock`` on ``path``, or None when another open file
    holds it (a live writer) or the file is missing and ``create`` is false."""
    import fcntl  # noqa: PLC0415 - POSIX only, like the rest of the recorder

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


class _WalSegment:
    """The write-ahead segment of one future part: two Arrow IPC streams (steps, rounds) in ``wal/``.

    Each record batch is serialised first and written with one ``os.write`` (no user-space buffer),
    so when :meth:`append` returns the round is in the OS's page cache and survives a ``kill -9``.
    """

    def __init__(self, wal: Path, idx: int, steps_schema: pa.Schema) -> None:
        self.idx = idx
        self.paths = (wal / f"part-{idx:05d}.steps.arrows", wal / f"part-{idx:05d}.rounds.arrows")
        self._fds: list[int] = []
        for path, schema in zip(self.paths, (steps_schema, S.ROUNDS_SCHEMA)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            self._fds.append(fd)
            _write_all(fd, schema.serialize())

    def append(self, rounds: pa.RecordBatch, steps: pa.RecordBatch | None) -> None:
        if steps is not None and steps.num_rows:
            _write_all(self._fds[0], steps.serialize())
        _write_all(self._fds[1], rounds.serialize())

    def close(self) -> None:
        for fd in self._fds:
            try:
                _write_all(fd, b"\xff\xff\xff\xff\x00\x00\x00\x00")  # end-of-stream marker
            finally:
                os.close(fd)
        self._fds = []

    def remove(self) -> None:
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
            ``"live"`` (a writer holds the lock: nothing touched), ``"failed"`` (an OS error; see ``error``).
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


def _wal_segments(wal: Path) -> dict[int, set[str]]:
    segs: dict[int, set[str]] = {}
    if wal.is_dir():
        for p in wal.iterdir():
            m = _WAL_RE.match(p.name)
            if m:
                segs.setdefault(int(m.group(1)), set()).add(m.group(2))
    return segs


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
        TraceFormatError: the manifest is unreadable (as :func:`open_trace`).
    """
    p = Path(path)
    wal = p / WAL_DIR
    segs = _wal_segments(wal)
    if not segs:
        return Recovery(os.fspath(p), "none")
    try:
        fd = _try_lock(wal / _WAL_LOCK, create=True)
    except OSError as e:
        return Recovery(os.fspath(p), "failed", error=str(e))
    if fd is None:
        return Recovery(os.fspath(p), "live")
    try:
        return _recover_locked(p, wal, segs)
    except OSError as e:
        return Recovery(os.fspath(p), "failed", error=str(e))
    finally:
        os.close(fd)


def _recover_locked(p: Path, wal: Path, segs: dict[int, set[str]]) -> Recovery:
    import pyarrow.compute as pc  # noqa: PLC0415

    manifest = _read_manifest(p / MANIFEST)
    steps_schema = S.steps_schema_from_manifest(manifest)
    n_rounds = n_steps = torn = dropped = 0
    written: list[str] = []
    for idx in sorted(segs):
        name = f"part-{idx:05d}.parquet"
        seg_paths = {t: wal / f"part-{idx:05d}.{t}.arrows" for t in ("rounds", "steps")}
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
            _write_part(kept, p / "steps" / name)
            _write_part(rounds, p / "rounds" / name)
            n_rounds += rounds.num_rows
            n_steps += kept.num_rows
            written.append(name)
        else:
            dropped += sum(b.num_rows for b in sb)
        for sp in seg_paths.values():
            sp.unlink(missing_ok=True)
    for t in ("rounds", "steps"):     # merged files the writer was building when it died
        for f in (p / t).glob("merged-*.parquet.tmp") if (p / t).is_dir() else ():
            f.unlink(missing_ok=True)
    counts = {"n_rounds": 0, "n_steps": 0, "n_parts": 0}
    for t, key in (("rounds", "n_rounds"), ("steps", "n_steps")):
        d = p / t
        files = [f for f in d.iterdir() if _PART_RE.match(f.name)] if d.is_dir() else []
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
    manifest["recovered"] = {"at": _now(), "n_rounds": n_rounds, "n_steps": n_steps, "parts": written,
                             "torn_bytes": torn, "n_steps_dropped": dropped}
    _write_json_atomic(p / MANIFEST, manifest)
    return Recovery(os.fspath(p), "recovered", n_rounds, n_steps, tuple(written), torn, dropped)


class _Merger:
    """Builds the merged files of a compacting :class:`TraceWriter` while its parts are written: each
    part's tables (in memory then) are appended to the open ``merged-NNNNN.parquet.tmp`` of their group,
    so that :meth:`TraceWriter.close` only finishes the last group instead of reading every part back.
    Groups, row groups and file names are those :meth:`TraceWriter._compact_parts` makes (the fallback
    when anything here failed)."""

    def __init__(self, path: Path, schemas: dict[str, pa.Schema], compact_rounds: int) -> None:
        self.path, self.schemas, self.compact_rounds = path, schemas, compact_rounds
        self.groups: list[dict[str, Any]] = []      # {"parts": [rec], "streams": {table: stream}}
        self.n = 0                                   # rounds in the open group
        self.error: BaseException | None = None

    def add(self, rec: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        """Append one part (``rec`` as in ``TraceWriter._written``; ``tables`` by table name)."""
        if self.error is not None:
            return
        try:
            r = rec["rounds"] or rec["requests"] or 0
            if not self.groups or (self.groups[-1]["parts"] and self.n + r > self.compact_rounds):
                if self.groups:
                    self._finish_group(self.groups[-1])
                self.groups.append({"parts": [], "streams": {}})
                self.n = 0
            g = self.groups[-1]
            g["parts"].append(rec)
            self.n += r
            name = f"merged-{len(self.groups) - 1:05d}.parquet"
            for t, tb in tables.items():
                st = g["streams"].get(t)
                if st is None:
                    tmp = self.path / t / (name + ".tmp")
                    st = g["streams"][t] = {"tmp": tmp, "name": name, "writer": pq.ParquetWriter(
                        tmp, self.schemas[t], **_writer_options(self.schemas[t])), "buf": [], "rows": 0, "nbytes": 0}
                st["buf"].append(tb)
                st["rows"] += tb.num_rows
                st["nbytes"] += tb.nbytes
                if st["rows"] >= _ROW_GROUP_ROUNDS * (3 if t == "steps" else 1) or st["nbytes"] >= _ROW_GROUP_BYTES:
                    self._write_buf(st)
        except BaseException as e:  # noqa: BLE001 - close() falls back to reading the parts back
            self.error = e

    @staticmethod
    def _write_buf(st: dict[str, Any]) -> None:
        if st["buf"]:
            st["writer"].write_table(pa.concat_tables(st["buf"]), row_group_size=max(st["rows"], 1))
        st["buf"], st["rows"], st["nbytes"] = [], 0, 0

    def _finish_group(self, g: dict[str, Any]) -> None:
        for st in g["streams"].values():
            if st["writer"] is not None:
                self._write_buf(st)
                st["writer"].close()
                st["writer"] = None

    def finish(self, written: list[dict[str, Any]],
               plain: dict[str, Any]) -> tuple[dict[str, Any], list[Path]] | None:
        """The listing and the replaced part files, the merged files renamed into place (``plain``, the
        parts' own listing, when every group holds one part); None when the groups do not cover
        ``written`` exactly or something failed (the caller compacts the old way)."""
        if self.error is None:
            try:
                if self.groups:
                    self._finish_group(self.groups[-1])
            except BaseException as e:  # noqa: BLE001
                self.error = e
        if self.error is not None or [r for g in self.groups for r in g["parts"]] != written:
            self.discard()
            return None
        listing: dict[str, Any] = {t: [] for t in S.TABLES}
        old: list[Path] = []
        if len(self.groups) == len(written):                 # one part per group: nothing to merge
            self.discard()
            return plain, []
        for g in self.groups:
            for t in S.TABLES:
                st = g["streams"].get(t)
                if st is None:
                    continue
                os.replace(st["tmp"], self.path / t / st["name"])
                listing[t].append(st["name"])
                old.extend(self.path / t / f"part-{w['idx']:05d}.parquet" for w in g["parts"] if w[t] is not None)
        return listing, old

    def discard(self) -> None:
        """Close and delete every merged file this merger began."""
        for g in self.groups:
            for st in g["streams"].values():
                if st["writer"] is not None:
                    try:
                        st["writer"].close()
                    except Exception:  # noqa: BLE001, S110 - deleted next
                        pass
                    st["writer"] = None
                st["tmp"].unlink(missing_ok=True)
        self.groups = []


class TraceWriter:
    """Write a trace directory as the run goes; a context manager.

    Args:
        out_dir: the trace directory (created with parents).
        manifest: manifest fields known by the caller: ``source`` (default ``"record"``), ``command``
            (argv list; default ``sys.argv``), ``params``, ``models``, ``runtime``, ``prompts``,
            ``centroids`` ({n_centroids, top_k}). The writer sets ``schema_version``, ``created``,
            ``dims``, ``complete`` and ``counts``.
        n_embd_backbone: width of ``h`` / ``h_next`` (the target's hidden size), or ``None``.
        n_embd: width of ``h_inner`` (the drafter's inner width), or ``None``.
        h_target: also store ``h_target`` (width ``n_embd_backbone``; ``dims.h_target`` in the manifest).
        hidden_dtype: ``"f16"``, ``"f32"`` or ``None`` (no hidden states stored).
        centroids: whether the drafter has a centroid head (else ``manifest["centroids"]`` is null).
        flush_every: write a part every this many rounds (>= 1).
        compact: at a clean close, merge the small parts into ``merged-NNNNN.parquet`` files of up to
            ``compact_rounds`` rounds (fast reading of long runs). Crash-safe: the merged files are
            written first, then the manifest listing them (``parts``), then the small parts are deleted.
            With hidden states this rewrites them once (about 40 MB/s here, so ~100 s for a 4 GB
            trace); pass ``compact=False`` to skip it.
        compact_rounds: rounds per merged file.
        background: write part files on a writer thread (pyarrow releases the GIL), so that
            ``add_round`` only converts records; at most 4 parts wait in its queue. A write error is
            raised (as ``TraceError``) by the next ``add_round`` / ``flush`` / ``close``. A kill -9
            loses only the parts still queued; every part already renamed into place stays.
        overwrite: if ``out_dir`` already holds a trace, delete its manifest, parts and write-ahead
            log first (only those files); otherwise that raises.
        wal: append every round to the write-ahead log in ``DIR/wal/`` as :meth:`add_round` returns
            (see the module docstring; a ``kill -9`` then loses at most the round being appended instead
            of up to ``flush_every``). The writer holds ``DIR/wal/lock`` (an exclusive ``flock``) until
            :meth:`close`.

    Raises:
        TraceError: ``out_dir`` already holds a trace and ``overwrite`` is false, another process is
            writing it (holds ``wal/lock``), or ``flush_every < 1``.
        TraceFormatError: bad ``hidden_dtype`` / widths, unknown source, non-JSON manifest values.

    Example::

        with TraceWriter(d, {"source": "record", "prompts": [...]}, n_embd_backbone=2816, n_embd=1024,
                         hidden_dtype="f16", centroids=False) as w:
            w.add_round(RoundRecord(...), [StepRecord(...), ...])
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        manifest: dict[str, Any],
        *,
        n_embd_backbone: int | None,
        n_embd: int | None,
        hidden_dtype: str | None,
        centroids: bool,
        flush_every: int = 8,
        compact: bool = True,
        compact_rounds: int = COMPACT_ROUNDS,
        background: bool = True,
        overwrite: bool = False,
        h_target: bool = False,
        wal: bool = True,
    ) -> None:
        if int(flush_every) < 1:
            raise TraceError("flush_every must be >= 1", key="flush_every", expected=">= 1",
                             actual=flush_every)
        self.path = Path(out_dir)
        self.flush_every = int(flush_every)
        self.compact = bool(compact)
        self.compact_rounds = max(int(compact_rounds), 1)
        self._merger: _Merger | None = None     # made at the first part, when compacting
        self.n_embd_backbone = None if n_embd_backbone is None else int(n_embd_backbone)
        self.n_embd = None if n_embd is None else int(n_embd)
        self.hidden_dtype = hidden_dtype
        self.centroids = bool(centroids)
        self.h_target = bool(h_target) and hidden_dtype is not None and self.n_embd_backbone is not None
        self.steps_schema = S.steps_schema(self.n_embd_backbone, self.n_embd, hidden_dtype, self.h_target)
        self._widths = {"h": self.n_embd_backbone, "h_next": self.n_embd_backbone, "h_inner": self.n_embd,
                        "h_target": self.n_embd_backbone}
        self._stored = {n: not pa.types.is_null(self.steps_schema.field(n).type) for n in S.HIDDEN_COLUMNS}

        m = dict(manifest)
        m["schema_version"] = S.SCHEMA_VERSION
        m.setdefault("created", _now())
        m.setdefault("source", "record")
        m.setdefault("command", list(sys.argv))
        m.setdefault("params", {})
        m.setdefault("models", {"target": None, "assistant": None, "centroids": None})
        m.setdefault("runtime", {"llama_cpp_python": None, "llama_cpp": None, "device": None})
        m.setdefault("prompts", [])
        m["dims"] = {"n_embd_backbone": self.n_embd_backbone, "n_embd": self.n_embd,
                     "hidden_dtype": hidden_dtype}
        if self.h_target:
            m["dims"]["h_target"] = True
        if not self.centroids:
            m["centroids"] = None
        else:
            m.setdefault("centroids", {"n_centroids": None, "top_k": None})
        m["complete"] = False
        m["counts"] = {"n_rounds": 0, "n_steps": 0, "n_parts": 0}
        S.check_manifest(m, str(self.path / MANIFEST))
        try:                                   # fail before touching the directory
            json.dumps(m, default=_json_default, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise TraceFormatError(f"manifest is not JSON serialisable: {e}", path=self.path / MANIFEST) from None
        self.manifest = m

        self.wal = bool(wal)
        self._lock_fd: int | None = None
        self._prepare_dir(overwrite)
        self._rounds: list[RoundRecord] = []
        self._steps: list[tuple[RoundRecord, StepRecord]] = []
        self._batches: list[tuple[pa.RecordBatch, pa.RecordBatch | None]] = []  # WAL: per round, as appended
        self._seg: _WalSegment | None = None
        self._next_part = 0
        self.background = bool(background)
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue | None = None
        self._error: BaseException | None = None
        self._written: list[dict[str, Any]] = []    # per part: idx and rows per table (None: absent)
        self._closed = False
        _write_json_atomic(self.path / MANIFEST, self.manifest)

    # ------------------------------------------------------------------ setup
    def _prepare_dir(self, overwrite: bool) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        existing = self.path / MANIFEST
        parts = [p for t in S.TABLES if (self.path / t).is_dir() for p in (self.path / t).iterdir()
                 if _OURS_RE.match(p.name)]
        wal = self.path / WAL_DIR
        segs = [p for p in wal.iterdir() if _WAL_RE.match(p.name)] if wal.is_dir() else []
        if (existing.exists() or parts or segs) and not overwrite:
            raise TraceError("directory already holds a trace (pass --overwrite, or overwrite=True in Python, to replace it)",
                             path=self.path)
        if self.wal or segs:
            wal.mkdir(exist_ok=True)
            fd = _try_lock(wal / _WAL_LOCK, create=True)
            if fd is None:
                raise TraceError("another process is writing a trace into this directory (it holds the "
                                 "write-ahead log's lock)", path=self.path, key=f"{WAL_DIR}/{_WAL_LOCK}")
            if self.wal:
                self._lock_fd = fd
            else:
                os.close(fd)
        for p in parts + segs:
            p.unlink()
        for t in ("rounds", "steps"):
            (self.path / t).mkdir(exist_ok=True)

    # ------------------------------------------------------------------ API
    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # On an exception: keep the finished rounds but leave the trace marked incomplete.
        self.close(complete=exc_type is None)

    def add_round(self, round: RoundRecord, steps: Sequence[StepRecord] = ()) -> None:
        """Buffer one round and its draft steps; write a part every ``flush_every`` rounds.

        Raises:
            TraceError: the writer is closed.
            TraceFormatError: a step with ``k > round.n_draft`` or a repeated ``k``; a hidden state
                whose width differs from the configured one, or given while that column is off.
        """
        if self._closed:
            raise TraceError("trace writer is closed", path=self.path)
        seen: set[int] = set()
        for s in steps:
            if s.k > round.n_draft or s.k in seen:
                raise TraceFormatError("step k out of range or repeated", key="k",
                                       expected=f"distinct values in 1..{round.n_draft}", actual=s.k)
            seen.add(s.k)
            for name in S.HIDDEN_COLUMNS:
                v = getattr(s, name)
                if v is None:
                    continue
                if not self._stored[name]:
                    raise TraceFormatError("hidden state given but this trace stores none for it",
                                           key=name, expected="None", actual=f"shape {v.shape}")
                if v.shape[0] != self._widths[name]:
                    raise TraceFormatError("hidden state width differs from the trace's", key=name,
                                           expected=self._widths[name], actual=v.shape[0])
        if self.wal:
            self._append_wal(round, steps)
        self._rounds.append(round)
        if not self.wal:
            self._steps.extend((round, s) for s in steps)
        if len(self._rounds) >= self.flush_every:
            self.flush()

    def _append_wal(self, round: RoundRecord, steps: Sequence[StepRecord]) -> None:
        try:
            rb = self._rounds_table([round]).to_batches()[0]
            sb = self._steps_table([(round, s) for s in steps]).combine_chunks().to_batches() if steps else []
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
            raise TraceFormatError(f"rounds do not fit the trace schema: {e}", path=self.path,
                                   key=f"prompt {round.prompt_id} round {round.round}") from None
        sbatch = sb[0] if sb else None
        if self._seg is None:
            self._seg = _WalSegment(self.path / WAL_DIR, self._next_part, self.steps_schema)
        self._seg.append(rb, sbatch)
        self._batches.append((rb, sbatch))

    def flush(self) -> None:
        """Write the buffered rounds (and their steps) as one part now (no-op when empty)."""
        if not self._rounds:
            return
        if self.wal:   # the rows were converted once, when they were appended to the WAL
            rounds = pa.Table.from_batches([r for r, _ in self._batches], schema=S.ROUNDS_SCHEMA)
            steps = pa.Table.from_batches([b for _, b in self._batches if b is not None], schema=self.steps_schema)
            self._rounds, self._steps, self._batches = [], [], []
            seg, self._seg = self._seg, None
            self._write_parts(rounds, steps, None, seg)
            return
        try:
            rounds, steps = self._rounds_table(self._rounds), self._steps_table(self._steps)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
            first = self._rounds[0]
            self._rounds, self._steps = [], []
            raise TraceFormatError(f"rounds do not fit the trace schema: {e}", path=self.path,
                                   key=f"prompt {first.prompt_id} round {first.round}+") from None
        self._rounds, self._steps = [], []
        self.write_tables(rounds, steps)

    def write_tables(self, rounds: pa.Table | None, steps: pa.Table | None = None,
                     requests: pa.Table | None = None) -> int:
        """Write already-columnar data as one part (bulk path for importers and synthetic traces).

        Buffered rounds are flushed first. Tables are cast to the trace schemas (column order and
        types); a missing nullable column is filled with nulls.

        Returns:
            the part index written.

        Raises:
            TraceFormatError: a table lacks a non-nullable column or cannot be cast.
        """
        if self._closed:
            raise TraceError("trace writer is closed", path=self.path)
        if self._rounds:
            self.flush()
        return self._write_parts(rounds, steps, requests, None)

    def _write_parts(self, rounds: pa.Table | None, steps: pa.Table | None, requests: pa.Table | None,
                     seg: _WalSegment | None) -> int:
        """Submit one part (steps, requests, rounds); ``seg``: the WAL segment these rows came from,
        closed now and deleted once the part files are in place."""
        idx = self._next_part
        name = f"part-{idx:05d}.parquet"
        counts = self.manifest["counts"]
        rec: dict[str, Any] = {"idx": idx, "rounds": None, "steps": None, "requests": None}
        # steps first, then rounds: a finished rounds part implies its steps part exists.
        jobs: list[tuple[pa.Table, Path]] = []
        if steps is not None:
            steps = _conform(steps, self.steps_schema, "steps")
            jobs.append((steps, self.path / "steps" / name))
            counts["n_steps"] += steps.num_rows
            rec["steps"] = steps.num_rows
        if requests is not None:
            requests = _conform(requests, S.REQUESTS_SCHEMA, "requests")
            (self.path / "requests").mkdir(exist_ok=True)
            jobs.append((requests, self.path / "requests" / name))
            counts["n_requests"] = counts.get("n_requests", 0) + requests.num_rows
            rec["requests"] = requests.num_rows
        if rounds is not None:
            rounds = _conform(rounds, S.ROUNDS_SCHEMA, "rounds")
            jobs.append((rounds, self.path / "rounds" / name))
            counts["n_rounds"] += rounds.num_rows
            rec["rounds"] = rounds.num_rows
        counts["n_parts"] += 1
        self._next_part += 1
        self._written.append(rec)
        if seg is not None:
            seg.close()
        self._submit(jobs, seg, rec)
        return idx

    # ------------------------------------------------------------------ background part writing
    def _submit(self, jobs: list[tuple[pa.Table, Path]], seg: _WalSegment | None = None,
                rec: dict[str, Any] | None = None) -> None:
        """Write the part files (in order) now, or on the writer thread when ``background``; then
        delete the WAL segment ``seg`` they replace and (compacting) append the part ``rec`` to its
        merged file."""
        self._raise_background_error()
        if self.compact and rec is not None and self._merger is None:
            self._merger = _Merger(self.path, {"rounds": S.ROUNDS_SCHEMA, "steps": self.steps_schema,
                                               "requests": S.REQUESTS_SCHEMA}, self.compact_rounds)
        if not self.background:
            self._write_jobs(jobs, seg, rec)
            return
        if self._thread is None:
            self._queue = queue.Queue(maxsize=4)
            self._thread = threading.Thread(target=self._worker, name="mtpscope-trace-writer", daemon=True)
            self._thread.start()
        self._queue.put((jobs, seg, rec))

    def _worker(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            jobs, seg, rec = item
            if self._error is None:
                try:
                    self._write_jobs(jobs, seg, rec)
                except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                    self._error = e

    def _write_jobs(self, jobs: list[tuple[pa.Table, Path]], seg: _WalSegment | None,
                    rec: dict[str, Any] | None) -> None:
        for table, path in jobs:
            _write_part(table, path)
        if seg is not None:
            seg.remove()
        if self._merger is not None and rec is not None:
            self._merger.add(rec, {path.parent.name: table for table, path in jobs})

    def _drain(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        self._raise_background_error()

    def _raise_background_error(self) -> None:
        if self._error is not None:
            e, self._error = self._error, None
            raise TraceError(f"writing a trace part failed: {e}", path=self.path) from e

    def close(self, complete: bool = True, aborted: dict[str, Any] | None = None) -> None:
        """Write the remaining rounds, compact (see ``compact``) and rewrite the manifest with
        ``complete``, ``counts``, ``parts`` (the part file names per table) and, when given,
        ``aborted`` (why the run stopped: see docs/TRACE_FORMAT.md); then remove the write-ahead log
        and release its lock. Idempotent."""
        if self._closed:
            return
        if aborted is not None:
            self.manifest["aborted"] = aborted
        try:
            self.flush()
        finally:
            self._closed = True
            try:
                self._drain()
            finally:
                self._finish_wal()
        old: list[Path] = []
        listing = self._plain_listing()
        merger, self._merger = self._merger, None
        if self.compact and complete and len(self._written) > 1:
            try:
                done = merger.finish(self._written, listing) if merger is not None else None
                listing, old = done if done is not None else self._compact_parts()
            except (OSError, pa.ArrowException) as e:
                for t in S.TABLES:
                    d = self.path / t
                    for p in d.glob("merged-*") if d.is_dir() else ():
                        p.unlink(missing_ok=True)
                self.manifest.setdefault("warnings", []).append(f"compaction failed, small parts kept: {e}")
                listing, old = self._plain_listing(), []
        elif merger is not None:
            merger.discard()
        self.manifest["parts"] = listing
        self.manifest["complete"] = bool(complete)
        self.manifest["counts"]["n_parts"] = max(len(v) for v in listing.values())
        _write_json_atomic(self.path / MANIFEST, self.manifest)
        for p in old:                     # only now: the manifest no longer lists them
            p.unlink(missing_ok=True)

    def _finish_wal(self) -> None:
        """After the last part: keep segments whose part failed to write (a reader recovers them),
        delete the rest of ``wal/`` and release the lock."""
        if self._seg is not None:      # rounds appended after a failed flush
            self._seg.close()
            self._seg = None
        if self._lock_fd is None:
            return
        wal = self.path / WAL_DIR
        try:
            if not _wal_segments(wal):
                (wal / _WAL_LOCK).unlink(missing_ok=True)
                try:
                    wal.rmdir()
                except OSError:
                    pass
        finally:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _plain_listing(self) -> dict[str, Any]:
        return {t: [f"part-{w['idx']:05d}.parquet" for w in self._written if w[t] is not None]
                for t in S.TABLES}

    def _compact_parts(self) -> tuple[dict[str, Any], list[Path]]:
        groups: list[list[dict[str, Any]]] = []
        cur: list[dict[str, Any]] = []
        n = 0
        for w in self._written:
            r = w["rounds"] or w["requests"] or 0
            if cur and n + r > self.compact_rounds:
                groups.append(cur)
                cur, n = [], 0
            cur.append(w)
            n += r
        if cur:
            groups.append(cur)
        if len(groups) == len(self._written):
            return self._plain_listing(), []
        schemas = {"rounds": S.ROUNDS_SCHEMA, "steps": self.steps_schema, "requests": S.REQUESTS_SCHEMA}
        listing: dict[str, Any] = {t: [] for t in S.TABLES}
        old: list[Path] = []
        for gi, group in enumerate(groups):
            name = f"merged-{gi:05d}.parquet"
            for t in S.TABLES:
                srcs = [self.path / t / f"part-{w['idx']:05d}.parquet" for w in group if w[t] is not None]
                if not srcs:
                    continue
                tmp = self.path / t / (name + ".tmp")
                with pq.ParquetWriter(tmp, schemas[t], **_writer_options(schemas[t])) as pw:
                    buf: list[pa.Table] = []
                    rows = nbytes = 0
                    for src in srcs:
                        tb = pq.read_table(src, page_checksum_verification=True).cast(schemas[t])
                        buf.append(tb)
                        rows += tb.num_rows
                        nbytes += tb.nbytes
                        if rows >= _ROW_GROUP_ROUNDS * (3 if t == "steps" else 1) or nbytes >= _ROW_GROUP_BYTES:
                            pw.write_table(pa.concat_tables(buf), row_group_size=max(rows, 1))
                            buf, rows, nbytes = [], 0, 0
                    if buf:
                        pw.write_table(pa.concat_tables(buf), row_group_size=max(rows, 1))
                os.replace(tmp, self.path / t / name)
                listing[t].append(name)
                old.extend(srcs)
        return listing, old

    # ------------------------------------------------------------------ columnar conversion
    def _rounds_table(self, rounds: list[RoundRecord]) -> pa.Table:
        cols = {name: [getattr(r, name) for r in rounds] for name in S.ROUNDS_COLUMNS}
        for name in ("drafted", "target", "emitted"):
            cols[name] = [None if v is None else list(v) for v in cols[name]]
        return pa.table(cols, schema=S.ROUNDS_SCHEMA)

    def _steps_table(self, pairs: list[tuple[RoundRecord, StepRecord]]) -> pa.Table:
        arrays: dict[str, pa.Array] = {}
        n = len(pairs)
        arrays["prompt_id"] = pa.array([r.prompt_id for r, _ in pairs], pa.int32())
        arrays["round"] = pa.array([r.round for r, _ in pairs], pa.int32())
        for f in S.steps_schema(None, None, None):
            if f.name in arrays or f.name in S.HIDDEN_COLUMNS:
                continue
            vals = [getattr(s, f.name) for _, s in pairs]
            if pa.types.is_list(f.type):
                vals = [None if v is None else list(v) for v in vals]
            arrays[f.name] = pa.array(vals, f.type)
        for name in S.HIDDEN_COLUMNS:
            typ = self.steps_schema.field(name).type
            if pa.types.is_null(typ):
                arrays[name] = pa.nulls(n)
                continue
            dim = typ.list_size
            mask = np.array([getattr(s, name) is None for _, s in pairs], dtype=bool)
            flat = np.zeros((n, dim), dtype=_NP_HIDDEN[self.hidden_dtype])
            for i, (_, s) in enumerate(pairs):
                v = getattr(s, name)
                if v is not None:
                    flat[i] = v
            arrays[name] = pa.FixedSizeListArray.from_arrays(
                pa.array(flat.reshape(-1)), dim, mask=pa.array(mask) if mask.any() else None)
        return pa.table([arrays[f.name] for f in self.steps_schema], schema=self.steps_schema)


# ---------------------------------------------------------------------------- replacing a trace


def holds_trace(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a trace (a manifest or Parquet parts in ``rounds/`` / ``steps/``)."""
    path = Path(path)
    if (path / MANIFEST).exists():
        return True
    return any(any((path / t).glob("part-*.parquet")) for t in ("rounds", "steps") if (path / t).is_dir())


def partial_dir(out: str | os.PathLike[str]) -> Path:
    """Where a replacement for the trace ``out`` is written until it is complete: the sibling folder
    ``<out>.partial-<pid>`` (then moved in with :func:`swap_in`)."""
    out = Path(out)
    return out.with_name(f"{out.name}.partial-{os.getpid()}")


def swap_in(new: str | os.PathLike[str], out: str | os.PathLike[str]) -> None:
    """Replace the trace directory ``out`` with the finished ``new`` one: rename ``out`` to
    ``<out>.old-<pid>``, ``new`` to ``out``, then delete the old one (on a failed second rename the
    old trace is put back). The whole ``out`` folder is replaced, other files in it included.

    Raises:
        OSError: a rename failed (``out`` is then as it was).
    """
    import shutil  # noqa: PLC0415

    new, out = Path(new), Path(out)
    old = out.with_name(f"{out.name}.old-{os.getpid()}")
    if old.exists():
        shutil.rmtree(old)
    os.rename(out, old)
    try:
        os.rename(new, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _conform(table: pa.Table, schema: pa.Schema, what: str) -> pa.Table:
    if table.schema.equals(schema):
        for f in schema:
            if not f.nullable and table.column(f.name).null_count:
                raise TraceFormatError(f"{what} column holds nulls", key=f.name,
                                       expected="no nulls", actual=f"{table.column(f.name).null_count} nulls")
        return table
    cols = []
    n = table.num_rows
    for f in schema:
        if f.name in table.column_names:
            col = table.column(f.name)
            if not col.type.equals(f.type):
                try:
                    col = col.cast(f.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                    raise TraceFormatError(f"{what} column cannot be cast: {e}", key=f.name,
                                           expected=str(f.type), actual=str(col.type)) from None
            if not f.nullable and col.null_count:
                raise TraceFormatError(f"{what} column holds nulls", key=f.name,
                                       expected="no nulls", actual=f"{col.null_count} nulls")
            cols.append(col)
        elif f.nullable:
            cols.append(pa.nulls(n, f.type))
        else:
            raise TraceFormatError(f"{what} table lacks a required column", key=f.name,
                                   expected="present", actual="missing")
    return pa.Table.from_arrays(cols, schema=schema)


# ====================================================================== reading
class Trace:
    """An opened trace directory (see :func:`open_trace`).

    Attributes:
        path: the directory.
        manifest: the parsed ``manifest.json`` (dict).
        warnings: human-readable warnings (skipped parts, incomplete trace, ...), each naming the file.

    DataFrames: ``rounds`` / ``steps`` / ``requests`` are read once and cached. Non-null int32 columns
    are numpy ``int32``; nullable int32 and bool columns are pandas ``Int32`` / ``boolean`` (``<NA>``
    for null); floats are float32/float64 with NaN for null; list columns are pandas
    ``ArrowDtype`` list columns (zero-copy from Arrow): one element is a Python ``list`` (``None`` for
    a null list; ``.to_numpy()`` gives an object array of numpy arrays), and ``.list.len()`` /
    ``.list[i]`` work column-wide. Hidden-state columns are never
    in ``steps``: use :meth:`hidden`. Rows are in part order, i.e. the order of writing. A part found
    unreadable while reading is dropped (with a warning) from every later read of that table, and
    cached frames of that table are discarded. Thread-safe: one Trace may be shared between threads.
    """

    def __init__(self, path: Path, manifest: dict[str, Any], warnings: list[str]) -> None:
        self.path = path
        self.manifest = manifest
        self.warnings = warnings
        self.schemas = {"rounds": S.ROUNDS_SCHEMA, "steps": S.steps_schema_from_manifest(manifest),
                        "requests": S.REQUESTS_SCHEMA}
        self._files: dict[str, list[Path]] = {t: self._list_parts(t) for t in S.TABLES}
        self._cache: dict[tuple[str, tuple[str, ...]], pd.DataFrame] = {}
        self._con = None
        self._lock = threading.RLock()      # the app shares one Trace between script threads

    def __repr__(self) -> str:
        return f"Trace({str(self.path)!r}, source={self.manifest.get('source')!r}, parts={self.n_parts})"

    # ------------------------------------------------------------------ parts
    def _list_parts(self, table: str) -> list[Path]:
        d = self.path / table
        listed = self.manifest.get("parts")
        if isinstance(listed, dict):
            out = []
            for name in listed.get(table) or []:
                p = d / str(name)
                if not _OURS_RE.match(str(name)) or str(name).endswith(".tmp"):
                    self.warnings.append(f"{self.path / MANIFEST}: part name {name!r} in 'parts' ignored")
                elif not p.is_file():
                    self.warnings.append(f"{p}: listed in the manifest but missing, skipped")
                else:
                    out.append(p)
            return out
        if not d.is_dir():
            return []
        parts = sorted((p for p in d.iterdir() if _PART_RE.match(p.name)),
                       key=lambda p: int(_PART_RE.match(p.name).group(1)))
        tmps = [p for p in d.iterdir() if p.name.endswith(".parquet.tmp")]
        for p in tmps:
            self.warnings.append(f"{p}: unfinished part (.tmp) ignored")
        return parts

    def part_files(self, table: str) -> list[Path]:
        """The readable part files of ``table`` (``rounds``, ``steps`` or ``requests``), in order."""
        return list(self._files[table])

    @property
    def n_parts(self) -> int:
        return max(len(self._files["rounds"]), len(self._files["requests"]))

    def _mark_bad(self, table: str, path: Path, err: BaseException) -> None:
        if path in self._files[table]:
            self._files[table].remove(path)
            msg = str(err).splitlines()[0] if str(err) else type(err).__name__
            self.warnings.append(f"{path}: unreadable {table} part skipped ({msg})")
            self._cache = {k: v for k, v in self._cache.items() if k[0] != table}
            if self._con is not None:
                self._con.close()
                self._con = None

    def check_parts(self, table: str | None = None) -> None:
        """Read every part's footer now and skip (with a warning) those that fail."""
        for t in [table] if table else S.TABLES:
            for p in list(self._files[t]):
                try:
                    pq.read_metadata(p)
                except (OSError, pa.ArrowException) as e:
                    self._mark_bad(t, p, e)

    def _read_arrow(self, table: str, columns: Sequence[str]) -> pa.Table:
        schema = self.schemas[table]
        for c in columns:
            if c not in schema.names:
                raise TraceFormatError(f"no such column in {table}", path=self.path, key=c,
                                       expected=", ".join(schema.names), actual=c)
        files = self._files[table]
        if not files:
            return schema.empty_table().select(list(columns))
        opts = ds.ParquetFragmentScanOptions(page_checksum_verification=True)
        fmt = ds.ParquetFileFormat(default_fragment_scan_options=opts)
        try:
            dset = ds.dataset([str(p) for p in files], schema=schema, format=fmt)
            return dset.to_table(columns=list(columns))
        except (OSError, pa.ArrowException):
            pass
        # Slow path: find the bad parts one by one, keep the rest.
        pieces = []
        for p in list(files):
            try:
                t = pq.read_table(p, columns=list(columns), page_checksum_verification=True)
                pieces.append(_conform(t, _subschema(schema, columns), table))
            except (OSError, pa.ArrowException, TraceFormatError) as e:
                self._mark_bad(table, p, e)
        if not pieces:
            return schema.empty_table().select(list(columns))
        return pa.concat_tables(pieces)

    # ------------------------------------------------------------------ DataFrames
    def columns(self, table: str, names: Sequence[str] | None = None) -> pd.DataFrame:
        """Only ``names`` of ``table`` as a DataFrame (column projection: other columns are not read).

        ``names=None`` means every non-hidden column. Cached per (table, names).

        Raises:
            TraceFormatError: an unknown table or column name.
        """
        if table not in self.schemas:
            raise TraceFormatError("no such table", path=self.path, key=table,
                                   expected=" | ".join(S.TABLES), actual=table)
        if names is None:
            names = [n for n in self.schemas[table].names if n not in S.HIDDEN_COLUMNS]
        key = (table, tuple(names))
        with self._lock:
            if key not in self._cache:
                arrow = self._read_arrow(table, names)
                if table == "rounds":
                    _check_rounds(arrow, self.path)
                self._cache[key] = _to_pandas(arrow, self.schemas[table])
            return self._cache[key]

    @property
    def rounds(self) -> pd.DataFrame:
        """All rounds (one row per round), columns as in ``schema.ROUNDS_SCHEMA``."""
        return self.columns("rounds")

    @property
    def steps(self) -> pd.DataFrame:
        """All draft steps (one row per step), hidden-state columns excluded."""
        return self.columns("steps")

    @property
    def requests(self) -> pd.DataFrame:
        """Per-request summaries (server-log imports; empty otherwise)."""
        return self.columns("requests")

    # ------------------------------------------------------------------ hidden states
    def hidden(self, name: str, where: Any = None) -> np.ndarray:
        """One hidden-state column as a float32 array of shape ``(n, dim)`` (numpy order).

        Only that column is read from each steps part (pyarrow column projection).

        Args:
            name: ``"h"``, ``"h_next"``, ``"h_target"`` (dim ``n_embd_backbone``) or ``"h_inner"`` (dim ``n_embd``).
            where: which steps: ``None`` (all, in ``steps`` row order); a boolean mask aligned with
                :attr:`steps` rows (numpy array or pandas Series of length ``len(steps)``; ``<NA>``
                counts as false); or a string,
                a DuckDB SQL boolean expression over the steps columns, e.g. ``"k = 1 AND NOT accepted"``.
                Rows come back in ``steps`` order. Rows whose hidden state is null are NaN.

        Raises:
            TraceFormatError: unknown name, the trace stores no such hidden state, a mask of the wrong
                length, or an invalid SQL expression.
        """
        with self._lock:
            return self._hidden_locked(name, where)

    def _hidden_locked(self, name: str, where: Any) -> np.ndarray:
        if name not in S.HIDDEN_COLUMNS:
            raise TraceFormatError("no such hidden-state column", path=self.path, key=name,
                                   expected=" | ".join(S.HIDDEN_COLUMNS), actual=name)
        typ = self.schemas["steps"].field(name).type
        if pa.types.is_null(typ):
            raise TraceFormatError("this trace stores no hidden state for this column", path=self.path,
                                   key=name, expected="recorded hidden states",
                                   actual=f"dims {self.manifest.get('dims')}")
        dim = typ.list_size
        self.check_parts("steps")
        files = self.part_files("steps")
        sizes = [pq.read_metadata(p).num_rows for p in files]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        rows_per_file: list[np.ndarray | None]
        if where is None:
            rows_per_file = [None] * len(files)
        else:
            if isinstance(where, str):
                idx = self._where_rows(where)
            else:
                if isinstance(where, (pd.Series, pd.api.extensions.ExtensionArray)):
                    mask = where.to_numpy(dtype=bool, na_value=False)     # <NA> -> not selected
                else:
                    mask = np.asarray(where, dtype=bool)
                if mask.shape != (int(offsets[-1]),):
                    raise TraceFormatError("mask length differs from the number of steps",
                                           path=self.path, key="where", expected=int(offsets[-1]),
                                           actual=mask.shape)
                idx = np.flatnonzero(mask)
            rows_per_file = [idx[(idx >= offsets[i]) & (idx < offsets[i + 1])] - offsets[i]
                             for i in range(len(files))]
        out = []
        for p, rows, size in zip(files, rows_per_file, sizes):
            if rows is not None and len(rows) == 0:
                continue
            try:
                col = pq.read_table(p, columns=[name], page_checksum_verification=True).column(name)
                arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
                vals = arr.values.to_numpy(zero_copy_only=False)
                start = arr.offset * dim
                block = np.asarray(vals[start:start + len(arr) * dim], dtype=np.float32).reshape(-1, dim)
                if arr.null_count:
                    block = block.copy()
                    block[arr.is_null().to_numpy(zero_copy_only=False)] = np.nan
            except (OSError, pa.ArrowException) as e:
                self.warnings.append(f"{p}: hidden column {name!r} unreadable, rows set to NaN ({e})")
                block = np.full((size, dim), np.nan, dtype=np.float32)
            out.append(block if rows is None else block[rows])
        if not out:
            return np.empty((0, dim), dtype=np.float32)
        return np.ascontiguousarray(np.concatenate(out, axis=0), dtype=np.float32)

    def _where_rows(self, predicate: str) -> np.ndarray:
        import duckdb

        cols = [n for n in self.schemas["steps"].names if n not in S.HIDDEN_COLUMNS]
        df = self.columns("steps", [c for c in cols if not pa.types.is_list(self.schemas["steps"]
                                                                            .field(c).type)])
        con = duckdb.connect()
        try:
            con.register("steps", df)
            res = con.execute(f"SELECT i FROM (SELECT row_number() OVER () - 1 AS i, * FROM steps) "
                              f"WHERE ({predicate}) ORDER BY i").fetchnumpy()
        except duckdb.Error as e:
            raise TraceFormatError(f"invalid where expression: {e}", path=self.path, key="where",
                                   expected="a DuckDB boolean expression over steps columns",
                                   actual=predicate) from None
        finally:
            con.close()
        return np.asarray(res["i"], dtype=np.int64)

    # ------------------------------------------------------------------ SQL
    def sql(self, query: str) -> pd.DataFrame:
        """Run a DuckDB query over the parts; views ``rounds``, ``steps`` and ``requests``.

        Hidden-state columns are available in the ``steps`` view (as DuckDB arrays).

        Raises:
            TraceFormatError: the query fails (message from DuckDB).
        """
        import duckdb

        with self._lock:
            return self._sql_locked(query, duckdb)

    def _sql_locked(self, query: str, duckdb: Any) -> pd.DataFrame:
        if self._con is None:
            self.check_parts()
            con = duckdb.connect()
            for t in S.TABLES:
                files = self._files[t]
                if files:
                    lst = ", ".join("'" + str(p).replace("'", "''") + "'" for p in files)
                    con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet([{lst}])")
                else:
                    con.register(f"_empty_{t}", self.schemas[t].empty_table())
                    con.execute(f"CREATE VIEW {t} AS SELECT * FROM _empty_{t}")
            self._con = con
        try:
            return self._con.execute(query).df()
        except duckdb.Error as e:
            raise TraceFormatError(f"query failed: {e}", path=self.path, key="sql",
                                   expected="a valid DuckDB query over rounds/steps/requests",
                                   actual=query) from None


def _subschema(schema: pa.Schema, columns: Sequence[str]) -> pa.Schema:
    return pa.schema([schema.field(c) for c in columns])


def _to_pandas(table: pa.Table, schema: pa.Schema) -> pd.DataFrame:
    data = {}
    for name in table.column_names:
        col = table.column(name)
        f = schema.field(name)
        if f.nullable and (pa.types.is_int32(f.type) or pa.types.is_boolean(f.type)):
            data[name] = col.to_pandas(types_mapper=_NULLABLE_PANDAS.get)
        elif pa.types.is_list(f.type) or pa.types.is_fixed_size_list(f.type):
            data[name] = col.to_pandas(types_mapper=pd.ArrowDtype)
        else:
            data[name] = col.to_pandas()
    return pd.DataFrame(data, index=pd.RangeIndex(table.num_rows), columns=table.column_names)


def _read_manifest(mpath: Path) -> dict[str, Any]:
    """Read and check ``manifest.json``.

    Raises:
        TraceFormatError: missing, not UTF-8, not JSON, or failing :func:`schema.check_manifest`.
    """
    try:
        raw = mpath.read_bytes()
    except FileNotFoundError:
        raise TraceFormatError("trace directory has no manifest", path=mpath,
                               expected="manifest.json", actual="missing") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceFormatError("manifest is not UTF-8 text", path=mpath, offset=e.start,
                               expected="UTF-8 JSON", actual=f"byte 0x{raw[e.start]:02x}") from None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceFormatError(f"manifest is not valid JSON: {e.msg}", path=mpath, offset=e.pos) from None
    except RecursionError:
        raise TraceFormatError("manifest JSON is nested too deeply", path=mpath,
                               expected="a flat JSON object", actual="deep nesting") from None
    S.check_manifest(manifest, str(mpath))
    return manifest


def open_trace(path: str | os.PathLike[str], *, recover_wal: bool = True) -> Trace:
    """Open a trace directory for reading (``traces.open`` is this function).

    Reads and checks ``manifest.json`` now; parts are read lazily. Torn or unreadable parts are
    skipped with a warning in ``Trace.warnings``; a trace whose manifest says ``complete: false``
    (still running, or killed) gets a warning too. A write-ahead log left by a writer that died
    (``wal/``, see :func:`recover`) is first turned into parts (``recover_wal=False``: left alone,
    with a warning); while its writer still runs it is left alone and the parts written so far are read.

    Raises:
        TraceFormatError: ``path`` is not a directory, has no readable ``manifest.json``, or the
            manifest has another schema version / lacks required keys.
    """
    p = Path(path)
    if not p.is_dir():
        raise TraceFormatError("not a trace directory", path=p, expected="a directory with manifest.json",
                               actual="missing" if not p.exists() else "not a directory")
    mpath = p / MANIFEST
    manifest = _read_manifest(mpath)
    warnings: list[str] = []
    if _wal_segments(p / WAL_DIR):
        rec = recover(p) if recover_wal else Recovery(os.fspath(p), "skipped")
        if rec.status == "recovered":
            manifest = _read_manifest(mpath)
            torn = f"; {rec.torn_bytes} bytes of a torn last round dropped" if rec.torn_bytes else ""
            warnings.append(f"{p / WAL_DIR}: {rec.n_rounds} rounds ({rec.n_steps} steps) recovered from the "
                            f"write-ahead log of an interrupted run{torn}")
        elif rec.status == "failed":
            warnings.append(f"{p / WAL_DIR}: write-ahead log not recovered ({rec.error}); run "
                            f"`mtpscope trace repair {p}`")
        elif rec.status == "skipped":
            warnings.append(f"{p / WAL_DIR}: write-ahead log of an interrupted run not read; run "
                            f"`mtpscope trace repair {p}`")
    if not manifest.get("complete"):
        warnings.append(f"{mpath}: trace is incomplete (still being written, or the run stopped early)")
    return Trace(p, manifest, warnings)


def _check_rounds(t: pa.Table, path: Path) -> None:
    """Values every metric relies on, checked on whichever of these columns ``t`` holds.

    ``prompt_id`` / ``round`` / ``n_draft`` / ``n_accepted`` non-null; ``n_draft >= 0``;
    ``0 <= n_accepted <= n_draft``.

    Raises:
        TraceFormatError: naming the trace, the column, how many rows break the rule and the first one.
    """
    import pyarrow.compute as pc

    def fail(col: str, rule: str, bad: pa.Array) -> None:
        idx = pc.indices_nonzero(bad)
        raise TraceFormatError(f"rounds column breaks the trace format ({len(idx)} rows, first row "
                               f"{idx[0].as_py()})", path=path, key=col, expected=rule, actual="other values")

    names = set(t.column_names)
    for col in ("prompt_id", "round", "n_draft", "n_accepted"):
        if col in names and t[col].null_count:
            fail(col, "no nulls", pc.is_null(t[col]))
    if "n_draft" in names:
        bad = pc.less(t["n_draft"], 0)
        if pc.any(bad).as_py():
            fail("n_draft", ">= 0", bad)
    if "n_accepted" in names:
        bad = pc.less(t["n_accepted"], 0)
        if "n_draft" in names:
            bad = pc.or_(bad, pc.greater(t["n_accepted"], t["n_draft"]))
        if pc.any(bad).as_py():
            fail("n_accepted", "0 <= n_accepted <= n_draft", bad)
