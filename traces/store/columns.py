"""Typed records (:mod:`traces.store.records`) to Arrow tables of the trace schemas (:mod:`traces.store.schema`).

The one conversion of recorded rounds into columns: the writer uses it when it writes a part, WAL recovery
when it turns a write-ahead log back into parts. A round whose values do not fit the schema (a token id
past int32, a string where a number goes) is set aside with Arrow's reason instead of failing the rounds
converted with it (:func:`to_tables`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from mtpscope.traces.store import schema as S
from mtpscope.traces.store.records import RoundRecord, StepRecord

#: one round and its draft steps, as given to :meth:`TraceWriter.add_round <traces.store.writer.TraceWriter.add_round>`
Item = tuple[RoundRecord, Sequence[StepRecord]]
#: what Arrow raises for a value that does not fit a column's type
FIT_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError)


def hidden_dtype_of(steps_schema: pa.Schema, name: str) -> np.dtype[Any] | None:
    """The numpy dtype a hidden-state column ``name`` stores (float16 / float32), or ``None`` when the
    column is off (Arrow type ``null``)."""
    typ = steps_schema.field(name).type
    if pa.types.is_null(typ):
        return None
    dtype: np.dtype[Any] = np.dtype(typ.value_type.to_pandas_dtype())
    return dtype


def rounds_table(rounds: Sequence[RoundRecord]) -> pa.Table:
    """``rounds`` as a table of :data:`traces.store.schema.ROUNDS_SCHEMA`, one row per record, in order.

    Raises:
        pyarrow.ArrowInvalid, pyarrow.ArrowTypeError, OverflowError: a value does not fit its column.
    """
    # (list columns take the records' tuples as they are)
    return pa.table({name: [getattr(r, name) for r in rounds] for name in S.ROUNDS_COLUMNS},
                    schema=S.ROUNDS_SCHEMA)


def steps_table(pairs: Sequence[tuple[RoundRecord, StepRecord]], steps_schema: pa.Schema) -> pa.Table:
    """The steps ``pairs`` (each with its round, which gives ``prompt_id`` / ``round``) as a table of
    ``steps_schema`` (:func:`traces.store.schema.steps_schema`). Hidden states are cast to the column's
    dtype; a step without one is a null row; a column of type ``null`` (off) is all nulls.

    Raises:
        pyarrow.ArrowInvalid, pyarrow.ArrowTypeError, OverflowError: a value does not fit its column.
        ValueError: a hidden state whose width differs from the column's (the writer checks it first).
    """
    arrays: dict[str, pa.Array] = {}
    n = len(pairs)
    arrays["prompt_id"] = pa.array([r.prompt_id for r, _ in pairs], pa.int32())
    arrays["round"] = pa.array([r.round for r, _ in pairs], pa.int32())
    for f in steps_schema:
        if f.name in arrays or f.name in S.HIDDEN_COLUMNS:
            continue
        arrays[f.name] = pa.array([getattr(s, f.name) for _, s in pairs], f.type)   # lists: the tuples as they are
    for name in S.HIDDEN_COLUMNS:
        dtype = hidden_dtype_of(steps_schema, name)
        if dtype is None:
            arrays[name] = pa.nulls(n)
            continue
        dim = steps_schema.field(name).type.list_size
        mask = np.array([getattr(s, name) is None for _, s in pairs], dtype=bool)
        flat = np.zeros((n, dim), dtype=dtype)
        for i, (_, s) in enumerate(pairs):
            v = getattr(s, name)
            if v is not None:
                flat[i] = v
        arrays[name] = pa.FixedSizeListArray.from_arrays(
            pa.array(flat.reshape(-1)), dim, mask=pa.array(mask) if mask.any() else None)
    return pa.table([arrays[f.name] for f in steps_schema], schema=steps_schema)


@dataclass(frozen=True)
class Converted:
    """Rounds converted by :func:`to_tables`.

    Attributes:
        rounds: the rounds that fit, in order (:data:`traces.store.schema.ROUNDS_SCHEMA`).
        steps: their steps, in order (the given steps schema).
        bad: each round that did not fit (it and its steps are in neither table), with Arrow's reason.
    """

    rounds: pa.Table
    steps: pa.Table
    bad: tuple[tuple[RoundRecord, str], ...] = ()


def to_tables(items: Sequence[Item], steps_schema: pa.Schema) -> Converted:
    """Rounds and their steps as tables; a round that does not fit the schemas is set aside (``bad``).

    All at once first; only when that fails, round by round, so one bad value costs its own round and no
    other. Cost: one Arrow conversion per column for the whole batch (the writer calls it once per part).
    """
    try:
        return Converted(rounds_table([r for r, _ in items]),
                         steps_table([(r, s) for r, steps in items for s in steps], steps_schema))
    except FIT_ERRORS:
        pass
    good: list[Item] = []
    bad: list[tuple[RoundRecord, str]] = []
    for r, steps in items:
        try:
            rounds_table([r])
            steps_table([(r, s) for s in steps], steps_schema)
        except FIT_ERRORS as e:
            bad.append((r, str(e)))
            continue
        good.append((r, steps))
    return Converted(rounds_table([r for r, _ in good]),
                     steps_table([(r, s) for r, steps in good for s in steps], steps_schema), tuple(bad))
