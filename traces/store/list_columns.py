"""List columns of trace DataFrames (``drafted``, ``target``, ``emitted``, ``top_ids``, ``top_logits``) as
flat numpy arrays: one job, so the analysis never loops over rows in Python.

Pure; imports numpy, pandas, pyarrow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class FlatList:
    """A list column flattened.

    Attributes:
        values: every element of every non-null list, row after row (``shape (n_values,)``); null
            elements are ``fill``.
        starts: ``int64[n_rows]`` index into ``values`` of each row's first element.
        lengths: ``int64[n_rows]`` elements per row (0 for a null list).
        valid: ``bool[n_rows]`` the row's list is not null.
    """

    values: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    valid: np.ndarray

    def item(self, i: np.ndarray, fill: Any = -1) -> np.ndarray:
        """Element ``i[r]`` of each row ``r`` (``shape (n_rows,)``); ``fill`` where the row is null or
        shorter than ``i[r] + 1`` or ``i[r] < 0``."""
        i = np.asarray(i, dtype=np.int64)
        ok = self.valid & (i >= 0) & (i < self.lengths)
        out = np.full(len(i), fill, dtype=np.result_type(self.values.dtype, np.asarray(fill).dtype)
                      if len(self.values) else np.asarray(fill).dtype)
        if ok.any():
            out[ok] = self.values[self.starts[ok] + i[ok]]
        return out


def flat_list(col: Any, dtype: Any = np.int64, fill: Any = -1) -> FlatList:
    """Flatten a list column: a pandas Series (``ArrowDtype`` list, or object of lists / arrays / None),
    a pyarrow (Chunked)Array of lists, or a list of lists.

    Args:
        dtype: numpy dtype of ``values``; fill: what a null element becomes.
    """
    if isinstance(col, pa.ChunkedArray):
        arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    elif isinstance(col, pa.Array):
        arr = col
    else:
        try:
            arr = pa.array(col)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
            arr = pa.array([None if v is None else list(v) for v in col])
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
    n = len(arr)
    if n == 0 or pa.types.is_null(arr.type):
        z = np.zeros(n, dtype=np.int64)
        return FlatList(np.zeros(0, dtype=dtype), z, z.copy(), np.zeros(n, dtype=bool))
    if pa.types.is_large_list(arr.type):
        arr = arr.cast(pa.list_(arr.type.value_type))
    valid = arr.is_valid().to_numpy(zero_copy_only=False)
    lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    starts = np.zeros(n, dtype=np.int64)
    if n > 1:
        np.cumsum(lengths[:-1], out=starts[1:])
    flat = pc.list_flatten(arr)
    if flat.null_count:
        flat = pc.fill_null(flat, fill)
    values = flat.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return FlatList(values, starts, lengths, valid)
