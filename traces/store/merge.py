"""Compaction: a trace's small parts merged into ``merged-NNNNN.parquet`` files of up to ``compact_rounds``
rounds each (fast reading of long runs), for :meth:`TraceWriter.close <traces.store.writer.TraceWriter.close>`.

:class:`Merger` builds the merged files while the parts are written (each part appended while its tables
are still in memory); :func:`compact_parts` makes the same files by reading the parts back (the fallback
when the merger failed). Both group the parts in order, a new group when the next part would take the
group over ``compact_rounds`` rounds (a part larger than that is a group of its own), and cut row groups
by :func:`traces.store.parts.row_group_full`.

A part is described by its record in the writer's list of written parts: ``{"idx": int, "rounds": rows,
"steps": rows, "requests": rows}`` (None for a table the part lacks).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from mtpscope.traces.store.layout import TABLES, merged_name, part_name, tmp_path
from mtpscope.traces.store.parts import row_group_full, writer_options

#: rounds per merged file (``TraceWriter(compact_rounds=...)``'s default)
COMPACT_ROUNDS = 65536


def plain_listing(written: list[dict[str, Any]]) -> dict[str, Any]:
    """The manifest's ``parts`` listing of the parts ``written`` as they are (nothing merged)."""
    return {t: [part_name(w["idx"]) for w in written if w[t] is not None] for t in TABLES}


class Merger:
    """Builds the merged files of a compacting writer while its parts are written: each part's tables
    (in memory then) are appended to the open ``merged-NNNNN.parquet.tmp`` of their group, so that the
    writer's close only finishes the last group instead of reading every part back. Groups, row groups
    and file names are those :func:`compact_parts` makes.

    Args:
        path: the trace directory.
        schemas: table name -> its schema (the steps schema of this trace).
        compact_rounds: rounds per merged file.
    """

    def __init__(self, path: Path, schemas: dict[str, pa.Schema], compact_rounds: int) -> None:
        self.path, self.schemas, self.compact_rounds = path, schemas, compact_rounds
        self.groups: list[dict[str, Any]] = []      # {"parts": [rec], "streams": {table: stream}}
        self.n = 0                                   # rounds in the open group
        self.error: BaseException | None = None

    def add(self, rec: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        """Append one part (``rec``: its record, see the module docstring; ``tables`` by table name).
        A failure is kept in :attr:`error` (then :meth:`finish` returns None), never raised."""
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
            name = merged_name(len(self.groups) - 1)
            for t, tb in tables.items():
                st = g["streams"].get(t)
                if st is None:
                    tmp = tmp_path(self.path / t / name)
                    st = g["streams"][t] = {"tmp": tmp, "name": name, "writer": pq.ParquetWriter(
                        tmp, self.schemas[t], **writer_options(self.schemas[t])), "buf": [], "rows": 0, "nbytes": 0}
                st["buf"].append(tb)
                st["rows"] += tb.num_rows
                st["nbytes"] += tb.nbytes
                if row_group_full(t, st["rows"], st["nbytes"]):
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

    def finish(self, written: list[dict[str, Any]]) -> tuple[dict[str, Any], list[Path]] | None:
        """The listing and the replaced part files, the merged files renamed into place (the parts' own
        listing, :func:`plain_listing`, when every group holds one part); None when the groups do not
        cover ``written`` exactly or something failed (the caller compacts with :func:`compact_parts`)."""
        if self.error is None:
            try:
                if self.groups:
                    self._finish_group(self.groups[-1])
            except BaseException as e:  # noqa: BLE001 - a failed merge is discarded; the caller compacts the parts
                self.error = e
        if self.error is not None or [r for g in self.groups for r in g["parts"]] != written:
            self.discard()
            return None
        listing: dict[str, Any] = {t: [] for t in TABLES}
        old: list[Path] = []
        if len(self.groups) == len(written):                 # one part per group: nothing to merge
            self.discard()
            return plain_listing(written), []
        for g in self.groups:
            for t in TABLES:
                st = g["streams"].get(t)
                if st is None:
                    continue
                os.replace(st["tmp"], self.path / t / st["name"])
                listing[t].append(st["name"])
                old.extend(self.path / t / part_name(w["idx"]) for w in g["parts"] if w[t] is not None)
        return listing, old

    def discard(self) -> None:
        """Close and delete every merged file this merger began."""
        for g in self.groups:
            for st in g["streams"].values():
                if st["writer"] is not None:
                    try:
                        st["writer"].close()
                    except Exception:  # noqa: BLE001 - deleted next
                        pass
                    st["writer"] = None
                st["tmp"].unlink(missing_ok=True)
        self.groups = []


def compact_parts(path: Path, written: list[dict[str, Any]], schemas: dict[str, pa.Schema],
                  compact_rounds: int) -> tuple[dict[str, Any], list[Path]]:
    """Merge the parts ``written`` of the trace ``path`` by reading them back: the manifest's new
    ``parts`` listing and the part files it replaces (deleted by the caller once the manifest lists the
    merged files). Each merged file is written to ``.tmp`` and renamed into place.

    Raises:
        OSError, pyarrow.ArrowException: reading a part or writing a merged file failed (the caller
            deletes the merged files and keeps the parts).
    """
    groups: list[list[dict[str, Any]]] = []
    cur: list[dict[str, Any]] = []
    n = 0
    for w in written:
        r = w["rounds"] or w["requests"] or 0
        if cur and n + r > compact_rounds:
            groups.append(cur)
            cur, n = [], 0
        cur.append(w)
        n += r
    if cur:
        groups.append(cur)
    if len(groups) == len(written):
        return plain_listing(written), []
    listing: dict[str, Any] = {t: [] for t in TABLES}
    old: list[Path] = []
    for gi, group in enumerate(groups):
        name = merged_name(gi)
        for t in TABLES:
            srcs = [path / t / part_name(w["idx"]) for w in group if w[t] is not None]
            if not srcs:
                continue
            tmp = tmp_path(path / t / name)
            with pq.ParquetWriter(tmp, schemas[t], **writer_options(schemas[t])) as pw:
                buf: list[pa.Table] = []
                rows = nbytes = 0
                for src in srcs:
                    tb = pq.read_table(src, page_checksum_verification=True).cast(schemas[t])
                    buf.append(tb)
                    rows += tb.num_rows
                    nbytes += tb.nbytes
                    if row_group_full(t, rows, nbytes):
                        pw.write_table(pa.concat_tables(buf), row_group_size=max(rows, 1))
                        buf, rows, nbytes = [], 0, 0
                if buf:
                    pw.write_table(pa.concat_tables(buf), row_group_size=max(rows, 1))
            os.replace(tmp, path / t / name)
            listing[t].append(name)
            old.extend(srcs)
    return listing, old
