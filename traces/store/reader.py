"""Reading a trace directory: the one door is :func:`open_trace` -> :class:`Trace` (``traces.open`` is
:func:`open_trace`), and :func:`read_manifest` for the manifest alone.

:func:`open_trace` never fails because of one bad part: a torn or unreadable part is skipped with a
warning naming the file (``Trace.warnings``) and the rest is read. A write-ahead log left by a writer
that died is first turned into parts (:func:`traces.store.wal.recover`). Which files are read: the
manifest's ``parts`` listing when present, else the ``part-NNNNN.parquet`` files in index order
(:mod:`traces.store.layout`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from mtpscope.errors import TraceFormatError
from mtpscope.traces.store import schema as S
from mtpscope.traces.store.checks import (
    CHECKED_ROUNDS_COLUMNS,
    CHECKED_STEPS_COLUMNS,
    accepted_drafts_warning,
    check_rounds,
    check_steps,
)
from mtpscope.traces.store.layout import (
    MANIFEST,
    TABLES,
    TRACE_FILE_RE,
    WAL_DIR,
    merged_files,
    plain_parts,
    wal_segments,
)
from mtpscope.traces.store.manifest import read_manifest
from mtpscope.traces.store.parts import conform
from mtpscope.traces.store.protocols import TraceLike
from mtpscope.traces.store.wal import Recovery, recover

__all__ = ["Trace", "TraceLike", "open_trace", "read_manifest", "sql_file_list", "sql_str"]

_NULLABLE_PANDAS = {pa.int32(): pd.Int32Dtype(), pa.bool_(): pd.BooleanDtype()}


def sql_str(s: str) -> str:
    """``s`` as a DuckDB string literal (single quotes, inner quotes doubled)."""
    return "'" + str(s).replace("'", "''") + "'"


def sql_file_list(files: Sequence[Path]) -> str:
    """``files`` as a DuckDB list of path literals, e.g. for ``read_parquet([...])``."""
    return "[" + ", ".join(sql_str(os.fspath(p)) for p in files) + "]"


def _hidden_rows(path: Path, name: str, dim: int, rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Hidden column ``name`` of one steps part as float32 ``(n, dim)`` (null rows NaN), read only from the row
    groups that hold ``rows`` (all of them for None): ``(block, rows within the block)``. A merged part's row
    groups are at most 64 MiB (:func:`traces.store.parts.row_group_full`), so one round's hidden states of a
    long trace at real widths cost one row group's column chunk, not the whole file."""
    pf = pq.ParquetFile(path, page_checksum_verification=True)
    md = pf.metadata
    if rows is not None and md.num_row_groups > 1:
        starts = np.concatenate([[0], np.cumsum([md.row_group(i).num_rows for i in range(md.num_row_groups)])])
        groups = np.unique(np.searchsorted(starts, rows, side="right") - 1)
        table = pf.read_row_groups([int(g) for g in groups], columns=[name])
        # the selected groups' rows, renumbered from 0 in the order read
        base = np.concatenate([[0], np.cumsum([starts[g + 1] - starts[g] for g in groups])])
        where = np.searchsorted(groups, np.searchsorted(starts, rows, side="right") - 1)
        rows = base[where] + (rows - starts[groups[where]])
    else:
        table = pf.read(columns=[name])
    col = table.column(name)
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    vals = arr.values.to_numpy(zero_copy_only=False)
    start = arr.offset * dim
    block = np.asarray(vals[start:start + len(arr) * dim], dtype=np.float32).reshape(-1, dim)
    if arr.null_count:
        block = block.copy()
        block[arr.is_null().to_numpy(zero_copy_only=False)] = np.nan
    return block, rows


class Trace(TraceLike):
    """An opened trace directory (see :func:`open_trace`).

    Attributes:
        path: the directory.
        manifest: the parsed ``manifest.json`` (dict).
        warnings: human-readable warnings (skipped parts, incomplete trace, ...), each naming the file.
        schemas: table name -> its pyarrow schema (the steps schema from the manifest's ``dims``).

    DataFrames: ``rounds`` / ``steps`` / ``requests`` (from :class:`TraceLike`: ``columns(table)``) are
    read once and cached. Non-null int32 columns
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
        #: part files whose rows this reader could not give: listed in the manifest but missing, or found
        #: unreadable while reading (each also has its line in ``warnings``)
        self.skipped: list[Path] = []
        self.schemas = {"rounds": S.ROUNDS_SCHEMA, "steps": S.steps_schema_from_manifest(manifest),
                        "requests": S.REQUESTS_SCHEMA}
        self._files: dict[str, list[Path]] = {t: self._list_parts(t) for t in TABLES}
        self._cache: dict[tuple[str, tuple[str, ...]], pd.DataFrame] = {}
        self._con: Any = None   # a duckdb connection, made on the first sql() (duckdb has no type information)
        #: the rounds' :data:`~traces.store.checks.CHECKED_ROUNDS_COLUMNS` once they passed
        #: :func:`~traces.store.checks.check_rounds` (whatever the first read asked for); the steps' check reads them
        self._checked_rounds: pa.Table | None = None
        self._steps_checked = False
        self._lock = threading.RLock()      # the app shares one Trace between script threads

    def __repr__(self) -> str:
        return f"Trace({str(self.path)!r}, source={self.manifest.get('source')!r}, parts={self.n_parts})"

    # ------------------------------------------------------------------ parts
    def _list_parts(self, table: str) -> list[Path]:
        d = self.path / table
        listed = self.manifest.get("parts")
        counted = (self.manifest.get("counts") or {}).get(f"n_{table}")
        if (isinstance(listed, dict) and not listed.get(table) and d.is_dir() and isinstance(counted, int)
                and counted > 0):
            # a manifest listing no file of a table while its counts say it has rows (its list lost or emptied):
            # the folder's files are read, said below for merged files and here for parts, rather than 0 rows
            # reported without a word (a list emptied with a count of 0 is a trace with no such rows: kept so)
            if plain_parts(self.path, table):
                self.warnings.append(f"{self.path / MANIFEST}: 'parts' lists no {table} file but {d} holds parts: "
                                     "read as they are")
            listed = None
        if isinstance(listed, dict):
            out = []
            for name in listed.get(table) or []:
                p = d / str(name)
                if not TRACE_FILE_RE.match(str(name)) or str(name).endswith(".tmp"):
                    self.warnings.append(f"{self.path / MANIFEST}: part name {name!r} in 'parts' ignored")
                elif not p.is_file():
                    self.warnings.append(f"{p}: listed in the manifest but " + ("a folder, not a file" if p.is_dir()
                                                                                 else "missing") + ", skipped")
                    self.skipped.append(p)
                else:
                    out.append(p)
            return out
        if not d.is_dir():
            return []
        parts = plain_parts(self.path, table)
        tmps = [p for p in d.iterdir() if p.name.endswith(".parquet.tmp")]
        for p in tmps:
            self.warnings.append(f"{p}: unfinished part (.tmp) ignored")
        merged = [p for p in merged_files(self.path, table, tmp_only=False) if not p.name.endswith(".tmp")]
        if merged and not parts:     # only a clean close merges, and it lists them: the manifest lost its list
            self.warnings.append(f"{self.path / MANIFEST}: 'parts' lists no files; the {len(merged)} merged {table} "
                                 f"file{'s' if len(merged) != 1 else ''} in {d} read as they are")
            return merged
        for p in merged:             # (a close cut short: its parts hold every row already)
            self.warnings.append(f"{p}: merged file the manifest does not list, ignored (the parts hold its rows)")
        return parts

    def part_files(self, table: str) -> list[Path]:
        """The readable part files of ``table`` (``rounds``, ``steps`` or ``requests``), in order."""
        return list(self._files[table])

    @property
    def n_parts(self) -> int:
        return max(len(self._files["rounds"]), len(self._files["requests"]))

    def rounds_not_read(self, n_read: int) -> int | None:
        """The rounds the manifest counts (``counts.n_rounds``) when a rounds part was skipped (missing or unreadable)
        and fewer than that count were read (``n_read``: the rounds a command read), else None: the header of
        ``report`` and ``explain`` then says "16 of its 20 rounds read", not just "complete"."""
        counted = (self.manifest.get("counts") or {}).get("n_rounds")
        rounds_dir = self.path / "rounds"
        if (not isinstance(counted, int) or isinstance(counted, bool) or counted <= n_read
                or not any(p.parent == rounds_dir for p in self.skipped)):
            return None
        return counted

    def _mark_bad(self, table: str, path: Path, err: BaseException) -> None:
        if path in self._files[table]:
            self._files[table].remove(path)
            msg = str(err).splitlines()[0] if str(err) else type(err).__name__
            self.warnings.append(f"{path}: unreadable {table} part skipped ({msg})")
            self.skipped.append(path)
            self._cache = {k: v for k, v in self._cache.items() if k[0] != table}
            if table == "rounds":           # checked again over the parts left (the steps against them too)
                self._checked_rounds, self._steps_checked = None, False
            elif table == "steps":
                self._steps_checked = False
            if self._con is not None:
                self._con.close()
                self._con = None

    def check_parts(self, table: str | None = None, *, full: bool = False) -> None:
        """Read every part's footer now and skip (with a warning) those that fail; with ``full`` (``trace repair``)
        every page too, a row group at a time, its checksum verified (a part whose footer reads may hold a damaged
        page that only the command reading that column would meet)."""
        for t in [table] if table else TABLES:
            for p in list(self._files[t]):
                try:
                    if not full:
                        pq.read_metadata(p)
                        continue
                    pf = pq.ParquetFile(p, page_checksum_verification=True)
                    for i in range(pf.num_row_groups):
                        pf.read_row_group(i)
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
            got = dset.to_table(columns=list(columns))
            # a part lacking a required column reads as nulls there (the dataset fills what a file lacks): the
            # slow path below names that part (a steps file copied over a rounds part, say)
            if not any(got.column(f.name).null_count for f in schema if f.name in columns and not f.nullable):
                return got
        except (OSError, pa.ArrowException):
            pass
        # Slow path: find the bad parts one by one, keep the rest.
        pieces = []
        for p in list(files):
            try:        # (columns the file lacks: conform fills a nullable one, names a required one)
                present = set(pq.read_schema(p).names)
                t = pq.read_table(p, columns=[c for c in columns if c in present], page_checksum_verification=True)
                sub = _subschema(schema, columns)
                if table == "rounds":   # nulls in a required column the part has: check_rounds names them (the
                    # column, the first row), the same refusal whichever columns a command reads; not a skipped part
                    sub = pa.schema([f.with_nullable(True) if f.name in present else f for f in sub])
                pieces.append(conform(t, sub, table))
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
                                   expected=" | ".join(TABLES), actual=table)
        if names is None:
            names = [n for n in self.schemas[table].names if n not in S.HIDDEN_COLUMNS]
        key = (table, tuple(names))
        with self._lock:
            if key not in self._cache:
                if table == "rounds" and self._checked_rounds is None:
                    # every rule on every checked column, whichever columns this read asks for: report, explain,
                    # compare and the app refuse the same rounds (was: only the rules on the projected columns)
                    wide = self._read_arrow(table, list(dict.fromkeys([*names, *CHECKED_ROUNDS_COLUMNS])))
                    arrow = wide.select(list(names))
                    self._rounds_arrow(wide)
                elif table == "rounds" and set(names) <= set(CHECKED_ROUNDS_COLUMNS):
                    arrow = self._rounds_arrow().select(list(names))    # (read and checked already: from memory)
                elif table == "steps" and not self._steps_checked:
                    # the steps' rules too, against the rounds (a repeated k, a k past its round's n_draft, a
                    # token that is not the round's draft): the step page, diagnose and explain read the same steps
                    have = self.schemas[table].names
                    wide = self._read_arrow(table, list(dict.fromkeys(
                        [*names, *(c for c in CHECKED_STEPS_COLUMNS if c in have)])))
                    check_steps(wide, self._rounds_arrow(), self.path, self.manifest)
                    self._steps_checked = True
                    arrow = wide.select(list(names))
                else:
                    arrow = self._read_arrow(table, names)
                self._cache[key] = _to_pandas(arrow, self.schemas[table])
            return self._cache[key]

    def _rounds_arrow(self, wide: pa.Table | None = None) -> pa.Table:
        """The rounds' checked columns (:data:`~traces.store.checks.CHECKED_ROUNDS_COLUMNS`), read (or ``wide``, read
        by the caller with them) and checked once: :func:`~traces.store.checks.check_rounds` refuses, and
        :func:`~traces.store.checks.accepted_drafts_warning` adds its line to :attr:`warnings`.

        Raises:
            TraceFormatError: as :func:`~traces.store.checks.check_rounds`.
        """
        if self._checked_rounds is None:
            if wide is None:
                wide = self._read_arrow("rounds", list(CHECKED_ROUNDS_COLUMNS))
            check_rounds(wide, self.path, self.manifest)
            warn = accepted_drafts_warning(wide, self.path)
            if warn is not None and warn not in self.warnings:     # (checked again after a part was lost: once)
                self.warnings.append(warn)
            self._checked_rounds = wide.select(list(CHECKED_ROUNDS_COLUMNS))
        return self._checked_rounds

    # ------------------------------------------------------------------ hidden states
    def hidden(self, name: str, where: Any = None) -> np.ndarray:
        """One hidden-state column as a float32 array of shape ``(n, dim)`` (numpy order).

        Only that column is read from each steps part (pyarrow column projection), and with ``where`` only
        from the row groups holding the selected rows.

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
                block, rows = _hidden_rows(p, name, dim, rows)
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
            for t in TABLES:
                files = self._files[t]
                if files:
                    # hive_partitioning off: a trace under ``key=value`` folders (every sweep cell) reads its own
                    # columns, never values from its path (DuckDB would otherwise replace ``n_draft``)
                    con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet({sql_file_list(files)}, "
                                "hive_partitioning = false)")
                else:   # (no readable part: an empty view of the table's columns; DuckDB takes no float16)
                    con.register(f"_empty_{t}", _widen_half(self.schemas[t]).empty_table())
                    con.execute(f"CREATE VIEW {t} AS SELECT * FROM _empty_{t}")
            self._con = con
        try:
            df: pd.DataFrame = self._con.execute(query).df()
            return df
        except duckdb.Error as e:
            raise TraceFormatError(f"query failed: {e}", path=self.path, key="sql",
                                   expected="a valid DuckDB query over rounds/steps/requests",
                                   actual=query) from None




def _widen_half(schema: pa.Schema) -> pa.Schema:
    """``schema`` with float16 (the hidden states' f16 storage, alone or as list items) as float32: the types DuckDB
    reads from Arrow (it refuses float16, Arrow's ``e``)."""
    def widen(t: pa.DataType) -> pa.DataType:
        if pa.types.is_float16(t):
            return pa.float32()
        if pa.types.is_fixed_size_list(t):
            return pa.list_(widen(t.value_type), t.list_size)
        if pa.types.is_list(t):
            return pa.list_(widen(t.value_type))
        return t
    return pa.schema([f.with_type(widen(f.type)) for f in schema])


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
    manifest = read_manifest(p)
    mpath = p / MANIFEST
    warnings: list[str] = []
    if wal_segments(p):
        rec = recover(p) if recover_wal else Recovery(os.fspath(p), "skipped")
        if rec.status == "recovered":
            manifest = read_manifest(p)
            warnings.append(f"{p / WAL_DIR}: {rec.words()}")
        elif rec.status == "failed":
            warnings.append(f"{p / WAL_DIR}: write-ahead log not recovered ({rec.error}); run "
                            f"`mtpscope trace repair {p}`")
        elif rec.status == "skipped":
            warnings.append(f"{p / WAL_DIR}: write-ahead log of an interrupted run not read; run "
                            f"`mtpscope trace repair {p}`")
    if not manifest.get("complete"):
        warnings.append(f"{mpath}: trace is incomplete (still being written, or the run stopped early)")
    return Trace(p, manifest, warnings)
