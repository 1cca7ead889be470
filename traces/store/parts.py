"""How a trace's Parquet files are written: the Parquet options (:func:`writer_options`), the atomic part
write (:func:`write_part`), the row-group size rule of merged files (:func:`row_group_full`) and a table
made to fit its schema (:func:`conform`). Shared by the writer, the merger, WAL recovery and the reader.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from mtpscope.errors import TraceFormatError
from mtpscope.traces.store import schema as S
from mtpscope.traces.store.layout import tmp_path

#: a merged file's row group ends once it holds this many rounds (steps: 3x as many rows) ...
ROW_GROUP_ROUNDS = 8192
#: ... or this many bytes in memory
ROW_GROUP_BYTES = 64 << 20


def writer_options(schema: pa.Schema) -> dict[str, Any]:
    """Parquet options: zstd + dictionary for ordinary columns; hidden states (incompressible floats)
    stored plain, uncompressed, without statistics, which is many times faster to write and read.
    Page checksums on (verified on read)."""
    hidden = [f.name for f in schema if f.name in S.HIDDEN_COLUMNS and not pa.types.is_null(f.type)]
    if not hidden:
        return {"compression": "zstd", "write_page_checksum": True}
    leaves = {n: f"{n}.list.element" for n in hidden}
    others = [f.name for f in schema if f.name not in leaves]
    return {
        "compression": {**dict.fromkeys(others, "zstd"), **dict.fromkeys(leaves.values(), "none")},
        "use_dictionary": others,
        "write_statistics": others,
        "write_page_checksum": True,
    }


def write_part(table: pa.Table, path: Path) -> None:
    """Write ``table`` as the Parquet file ``path``: to ``<name>.tmp``, then renamed into place, so a
    ``kill -9`` leaves the finished file or none.

    Raises:
        OSError, pyarrow.ArrowException: writing failed (the ``.tmp`` may stay; readers ignore it).
    """
    tmp = tmp_path(path)
    pq.write_table(table, tmp, **writer_options(table.schema))
    os.replace(tmp, path)


def row_group_full(table: str, rows: int, nbytes: int) -> bool:
    """Whether ``rows`` buffered rows (``nbytes`` in memory) of ``table`` make a merged file's row group."""
    return rows >= ROW_GROUP_ROUNDS * (3 if table == "steps" else 1) or nbytes >= ROW_GROUP_BYTES


def conform(table: pa.Table, schema: pa.Schema, what: str) -> pa.Table:
    """``table`` with ``schema``'s column order and types: columns cast, a missing nullable column filled
    with nulls (``what``: the table's name, for messages).

    Raises:
        TraceFormatError: a column cannot be cast, a non-nullable column is missing or holds nulls.
    """
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
