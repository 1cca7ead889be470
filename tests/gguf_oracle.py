"""gguf-py (the independent oracle) read beside our reader: parity of every key, value and tensor record,
and tensors as gguf-py decodes them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader
from gguf import GGUFValueType as V

from mtpscope.inspector import ArrayValue, GGUFFile


def _flatten(v: Any) -> list[Any]:
    if isinstance(v, list):
        return [x for item in v for x in _flatten(item)]
    return [v]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def assert_parity(ours: GGUFFile, oracle: GGUFReader) -> int:
    """Every key, value and tensor record of ``ours`` equals GGUFReader's; returns the values compared."""
    keys = [k for k in oracle.fields if not k.startswith("GGUF.")]
    assert list(ours.kv) == keys
    assert ours.version == int(oracle.fields["GGUF.version"].parts[0][0])
    assert ours.alignment == oracle.alignment
    assert ours.data_offset == oracle.data_offset
    n_values = 0
    for k in keys:
        field, kv = oracle.fields[k], ours.kv[k]
        assert kv.key == k
        assert kv.offset == field.offset, k
        assert kv.value_type == int(field.types[0]), k
        assert kv.type_name == field.types[0].name, k
        want = field.contents()
        if kv.value_type == V.ARRAY:
            arr = kv.value
            assert isinstance(arr, ArrayValue)
            assert arr.element_type == int(field.types[1]), k
            got = arr.to_list()
            if arr.element_type == V.ARRAY:
                got = _flatten(got)
            assert len(got) == len(want), k
            assert all(_same(a, b) for a, b in zip(got, want)), k
            n_values += len(got)
        else:
            assert _same(kv.value, want), (k, kv.value, want)
            n_values += 1
    assert len(ours.tensors) == len(oracle.tensors)
    for t, rt in zip(ours.tensors, oracle.tensors):
        assert t.name == rt.name
        assert t.ggml_type == int(rt.tensor_type)
        assert t.type_name == rt.tensor_type.name
        assert t.ne == tuple(int(d) for d in rt.shape)
        assert t.shape == tuple(reversed(t.ne))
        assert t.n_elements == rt.n_elements
        assert t.n_bytes == rt.n_bytes
        assert t.offset == rt.data_offset
        assert t.info_offset == rt.field.offset
        raw = ours.tensor_data(t.name, dequantize=False)
        assert raw.shape == rt.data.shape and raw.dtype == rt.data.dtype, t.name
        assert np.array_equal(raw, rt.data, equal_nan=raw.dtype.kind == "f"), t.name
    return n_values


def gguf_types(path: Path) -> dict[str, str]:
    """ggml type name of each tensor (gguf-py), e.g. ``{"token_embd.weight": "F16", ...}``."""
    from gguf import GGUFReader

    return {t.name: t.tensor_type.name for t in GGUFReader(str(path)).tensors}


def gguf_arrays(path: Path) -> dict[str, np.ndarray]:
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    return {t.name: np.asarray(t.data, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)])
            if t.name != "mtp.token_ordering.weight" else np.asarray(t.data) for t in r.tensors
            if t.name in ("token_embd.weight", "nextn.post_projection.weight", "mtp.centroids.weight",
                          "mtp.token_ordering.weight", "mtp.post_projection.weight")}

