"""Writing a trace directory as the run goes (:class:`TraceWriter`), and replacing one
(:func:`partial_dir`, :func:`swap_in`).

Layout: :mod:`traces.store.layout` (docs/TRACE_FORMAT.md). Crash safety: the manifest is written first
(``complete: false``) by write-to-temp + ``os.replace``; each part is written to
``part-NNNNN.parquet.tmp`` and ``os.replace``d, steps part before rounds part, so a ``kill -9`` leaves
only finished parts plus ``.tmp`` files (a part being written, the merged files being built; ignored by the reader). Every round is also appended to
the write-ahead log (:mod:`traces.store.wal`) before :meth:`TraceWriter.add_round` returns, so a
``kill -9`` loses at most that round. A clean close compacts the parts (:mod:`traces.store.merge`) and
rewrites the manifest with ``complete: true``, the counts and the ``parts`` listing. Parts carry
Parquet page checksums, verified on read.

Replacing a trace (``record --overwrite``): :func:`~traces.store.layout.holds_trace`, :func:`partial_dir`
(where the new one is written) and :func:`swap_in` (moved in only once complete, so a failed run keeps the old
one; never over a folder that holds more than its trace: :func:`~traces.store.layout.foreign_entries`).
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa

from mtpscope.errors import TraceError, TraceFormatError
from mtpscope.traces.store import schema as S
from mtpscope.traces.store.centroid_counts import MANIFEST_KEY as COUNTS_KEY
from mtpscope.traces.store.centroid_counts import CentroidCounts
from mtpscope.traces.store.columns import Item, to_tables
from mtpscope.traces.store.layout import (
    LLAMA_LOG,
    MANIFEST,
    TABLES,
    WAL_DIR,
    WAL_LOCK,
    foreign_entries,
    foreign_message,
    merged_files,
    now,
    part_name,
    try_lock,
    wal_files,
    wal_segments,
    writer_files,
)
from mtpscope.traces.store.manifest import manifest_text, write_manifest
from mtpscope.traces.store.merge import COMPACT_ROUNDS, Merger, compact_parts, plain_listing
from mtpscope.traces.store.parts import conform, write_part
from mtpscope.traces.store.records import RoundRecord, StepRecord
from mtpscope.traces.store.wal import WalLog

#: one batch of background work: the part files to write, the WAL segment they replace, the part record to merge
_Batch = tuple[list[tuple[pa.Table, Path]], WalLog | None, dict[str, Any] | None]
# the sibling folders of a trace being replaced: the new one while written, the old one while swapped out
_PARTIAL, _OLD = ".partial-", ".old-"


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
            (:mod:`traces.store.wal`; a ``kill -9`` then loses at most the round being appended instead
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
        self._merger: Merger | None = None      # made at the first part, when compacting
        self.n_embd_backbone = None if n_embd_backbone is None else int(n_embd_backbone)
        self.n_embd = None if n_embd is None else int(n_embd)
        self.hidden_dtype = hidden_dtype
        self.centroids = bool(centroids)
        #: per-centroid counts of the steps written (manifest ``centroid_counts`` at a clean close)
        self._counts = CentroidCounts() if self.centroids else None
        self.h_target = bool(h_target) and hidden_dtype is not None and self.n_embd_backbone is not None
        self.steps_schema = S.steps_schema(self.n_embd_backbone, self.n_embd, hidden_dtype, self.h_target)
        self._widths = {"h": self.n_embd_backbone, "h_next": self.n_embd_backbone, "h_inner": self.n_embd,
                        "h_target": self.n_embd_backbone}
        self._stored = {n: not pa.types.is_null(self.steps_schema.field(n).type) for n in S.HIDDEN_COLUMNS}
        self.schemas = {"rounds": S.ROUNDS_SCHEMA, "steps": self.steps_schema, "requests": S.REQUESTS_SCHEMA}

        m = dict(manifest)
        m["schema_version"] = S.SCHEMA_VERSION
        m.setdefault("created", now())
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
        manifest_text(m, self.path / MANIFEST)     # fail before touching the directory
        self.manifest = m

        self.wal = bool(wal)
        self._lock_fd: int | None = None
        self._prepare_dir(overwrite)
        self._buf: list[Item] = []              # the rounds (with their steps) since the last part
        self._seg: WalLog | None = None
        self._next_part = 0
        self.background = bool(background)
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue[_Batch | None] | None = None   # None (the end) stops the writer thread
        self._error: BaseException | None = None
        self._written: list[dict[str, Any]] = []    # per part: idx and rows per table (None: absent)
        self._closed = False
        write_manifest(self.path, self.manifest)

    # ------------------------------------------------------------------ setup
    def _prepare_dir(self, overwrite: bool) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        existing = self.path / MANIFEST
        parts = writer_files(self.path)
        wal = self.path / WAL_DIR
        segs = wal_files(self.path)
        if (existing.exists() or parts or segs) and not overwrite:
            raise TraceError("directory already holds a trace (pass --overwrite, or overwrite=True in Python, to replace it)",
                             path=self.path)
        if self.wal or segs:
            wal.mkdir(exist_ok=True)
            fd = try_lock(wal / WAL_LOCK, create=True)
            if fd is None:
                raise TraceError("another process is writing a trace into this directory (it holds the "
                                 "write-ahead log's lock)", path=self.path, key=f"{WAL_DIR}/{WAL_LOCK}")
            if self.wal:
                self._lock_fd = fd
            else:
                os.close(fd)
        for p in parts + segs:
            p.unlink()
        if overwrite:       # the replaced trace's llama.cpp output is not the new one's (a recorder writes its own after)
            (self.path / LLAMA_LOG).unlink(missing_ok=True)
        for t in ("rounds", "steps"):
            (self.path / t).mkdir(exist_ok=True)

    # ------------------------------------------------------------------ API
    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
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
            if self._seg is None:
                self._seg = WalLog(self.path / WAL_DIR, self._next_part, self.steps_schema)
            try:
                self._seg.append(round, steps)
            except (TypeError, ValueError) as e:      # nothing written: JSON fails before the write
                raise TraceFormatError(f"rounds do not fit the trace schema: {e}", path=self.path,
                                       key=f"prompt {round.prompt_id} round {round.round}") from None
        self._buf.append((round, tuple(steps)))
        if len(self._buf) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """Write the buffered rounds (and their steps) as one part now (no-op when empty).

        The rounds are converted to Arrow here, once per part (:func:`traces.store.columns.to_tables`).

        Raises:
            TraceFormatError: a round's values do not fit the trace's schema (a token id past int32, ...);
                the other rounds are written, that round (and its steps) is not.
        """
        if not self._buf:
            return
        buf, self._buf = self._buf, []
        seg, self._seg = self._seg, None
        conv = to_tables(buf, self.steps_schema)
        if conv.rounds.num_rows:
            self._write_parts(conv.rounds, conv.steps, None, seg)
        elif seg is not None:        # nothing of it fits: no part, and nothing to recover
            seg.close()
            seg.remove()
        if conv.bad:
            r, why = conv.bad[0]
            more = f" (and {len(conv.bad) - 1} more rounds)" if len(conv.bad) > 1 else ""
            raise TraceFormatError(f"round does not fit the trace schema{more}, not written: {why}", path=self.path,
                                   key=f"prompt {r.prompt_id} round {r.round}")

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
        if self._buf:
            self.flush()
        return self._write_parts(rounds, steps, requests, None)

    def _write_parts(self, rounds: pa.Table | None, steps: pa.Table | None, requests: pa.Table | None,
                     seg: WalLog | None) -> int:
        """Submit one part (steps, requests, rounds); ``seg``: the WAL segment these rows came from,
        closed now and deleted once the part files are in place."""
        idx = self._next_part
        name = part_name(idx)
        counts = self.manifest["counts"]
        rec: dict[str, Any] = {"idx": idx, "rounds": None, "steps": None, "requests": None}
        # steps first, then rounds: a finished rounds part implies its steps part exists.
        jobs: list[tuple[pa.Table, Path]] = []
        if steps is not None:
            steps = conform(steps, self.steps_schema, "steps")
            if self._counts is not None:
                self._counts.add(steps)
            jobs.append((steps, self.path / "steps" / name))
            counts["n_steps"] += steps.num_rows
            rec["steps"] = steps.num_rows
        if requests is not None:
            requests = conform(requests, S.REQUESTS_SCHEMA, "requests")
            (self.path / "requests").mkdir(exist_ok=True)
            jobs.append((requests, self.path / "requests" / name))
            counts["n_requests"] = counts.get("n_requests", 0) + requests.num_rows
            rec["requests"] = requests.num_rows
        if rounds is not None:
            rounds = conform(rounds, S.ROUNDS_SCHEMA, "rounds")
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
    def _submit(self, jobs: list[tuple[pa.Table, Path]], seg: WalLog | None = None,
                rec: dict[str, Any] | None = None) -> None:
        """Write the part files (in order) now, or on the writer thread when ``background``; then
        delete the WAL segment ``seg`` they replace and (compacting) append the part ``rec`` to its
        merged file."""
        self._raise_background_error()
        if self.compact and rec is not None and self._merger is None:
            self._merger = Merger(self.path, self.schemas, self.compact_rounds)
        if not self.background:
            self._write_jobs(jobs, seg, rec)
            return
        if self._thread is None:
            self._queue = queue.Queue(maxsize=4)
            self._thread = threading.Thread(target=self._worker, args=(self._queue,), name="mtpscope-trace-writer",
                                            daemon=True)
            self._thread.start()
        if self._queue is None:
            raise RuntimeError("the writer thread runs without its queue")   # both are set together, above
        self._queue.put((jobs, seg, rec))

    def _worker(self, jobs_queue: queue.Queue[_Batch | None]) -> None:
        while True:
            item = jobs_queue.get()
            if item is None:
                return
            jobs, seg, rec = item
            if self._error is None:
                try:
                    self._write_jobs(jobs, seg, rec)
                except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                    self._error = e

    def _write_jobs(self, jobs: list[tuple[pa.Table, Path]], seg: WalLog | None,
                    rec: dict[str, Any] | None) -> None:
        for table, path in jobs:
            write_part(table, path)
        if seg is not None:
            seg.remove()
        if self._merger is not None and rec is not None:
            self._merger.add(rec, {path.parent.name: table for table, path in jobs})

    def _drain(self) -> None:
        if self._thread is not None:
            if self._queue is None:
                raise RuntimeError("the writer thread runs without its queue")   # both are set together (_submit)
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
        listing = plain_listing(self._written)
        merger, self._merger = self._merger, None
        if self.compact and complete and len(self._written) > 1:
            try:
                done = merger.finish(self._written) if merger is not None else None
                listing, old = done if done is not None else compact_parts(self.path, self._written, self.schemas,
                                                                          self.compact_rounds)
            except (OSError, pa.ArrowException) as e:
                for t in TABLES:
                    for p in merged_files(self.path, t, tmp_only=False):
                        p.unlink(missing_ok=True)
                self.manifest.setdefault("warnings", []).append(f"compaction failed, small parts kept: {e}")
                listing, old = plain_listing(self._written), []
        elif merger is not None:
            merger.discard()
        self.manifest["parts"] = listing
        self.manifest["complete"] = bool(complete)
        if self._counts is not None and complete:
            nc = (self.manifest.get("centroids") or {}).get("n_centroids")
            self.manifest[COUNTS_KEY] = self._counts.entry(nc if isinstance(nc, int) else None)
        self.manifest["counts"]["n_parts"] = max(len(v) for v in listing.values())
        write_manifest(self.path, self.manifest)
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
            if not wal_segments(self.path):
                (wal / WAL_LOCK).unlink(missing_ok=True)
                try:
                    wal.rmdir()
                except OSError:
                    pass
        finally:
            os.close(self._lock_fd)
            self._lock_fd = None


# ---------------------------------------------------------------------------- replacing a trace


def partial_dir(out: str | os.PathLike[str]) -> Path:
    """Where a replacement for the trace ``out`` is written until it is complete: the sibling folder
    ``<out>.partial-<pid>`` (then moved in with :func:`swap_in`); ``out`` made absolute first (``.`` has no
    name to put a sibling beside)."""
    out = Path(out).absolute()
    return out.with_name(f"{out.name}{_PARTIAL}{os.getpid()}")


def replacement_leftovers(out: str | os.PathLike[str]) -> list[Path]:
    """What interrupted replacements of the trace ``out`` (by any process) left beside it: the
    ``<out>.partial-*`` folders of :func:`partial_dir` and the ``<out>.old-*`` ones of :func:`swap_in`."""
    out = Path(out)
    return [p for tag in (_PARTIAL, _OLD) for p in sorted(out.parent.glob(f"{out.name}{tag}*"))]


def swap_in(new: str | os.PathLike[str], out: str | os.PathLike[str]) -> None:
    """Replace the trace directory ``out`` with the finished ``new`` one: rename ``out`` to
    ``<out>.old-<pid>``, ``new`` to ``out``, then delete the old one (on a failed second rename the
    old trace is put back). The whole ``out`` folder is replaced, so one that holds files besides its trace is
    refused.

    Raises:
        TraceError: ``out`` holds files that are not its trace's (:func:`~traces.store.layout.foreign_entries`:
            they would go with it; nothing is moved).
        OSError: a rename failed (``out`` is then as it was).
    """
    import shutil

    new, out = Path(new).absolute(), Path(out).absolute()
    others = foreign_entries(out)
    if others:
        raise TraceError(foreign_message(others), path=out, key="out")
    old = out.with_name(f"{out.name}{_OLD}{os.getpid()}")
    if old.exists():
        shutil.rmtree(old)
    os.rename(out, old)
    try:
        os.rename(new, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)

