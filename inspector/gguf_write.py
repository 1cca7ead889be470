"""Writing GGUF files: metadata values with their GGUF value types, tensors, an atomic write.

One job: :func:`write_gguf` — the one place mtpscope writes a GGUF (the converter, the demo models and the
tests' file builders), through gguf-py's ``GGUFWriter`` (GGUF v3, little-endian, alignment 32). A metadata
value is a :class:`MetaValue` (GGUF value type id + value); :func:`u32`, :func:`f32`, :func:`boolean`,
:func:`string` and :func:`array` build the common ones, :func:`meta_value` copies one read by our reader
(:mod:`inspector.gguf`) verbatim. The file is written to ``PATH.tmp`` and renamed over ``PATH`` (a reader
never sees a half-written file).

Value type ids are :mod:`inspector.gguf`'s (``UINT32``, ``ARRAY``, ...; the GGUF specification's
``gguf_metadata_value_type``). Tensors are numpy arrays in numpy order (GGUF ``ne`` is the reverse).

May import: numpy, gguf (gguf-py, lazily: the writer and its type enums), inspector.gguf.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from mtpscope.inspector.gguf import ARRAY, BOOL, FLOAT32, STRING, UINT32, ArrayValue, KeyValue


@dataclass(frozen=True)
class MetaValue:
    """One GGUF metadata value as a writer needs it.

    Attributes:
        type: GGUF value type id (``inspector.gguf.UINT32``, ``ARRAY``, ...).
        value: a Python scalar / ``str``; for arrays a ``list`` (strings as ``str`` or raw ``bytes``) or a
            1-D numpy array (numbers).
        sub_type: for arrays, the element type id; else None.
    """

    type: int
    value: Any
    sub_type: int | None = None


def u32(v: int) -> MetaValue:
    """A UINT32 value."""
    return MetaValue(UINT32, int(v))


def f32(v: float) -> MetaValue:
    """A FLOAT32 value."""
    return MetaValue(FLOAT32, float(v))


def boolean(v: bool) -> MetaValue:
    """A BOOL value."""
    return MetaValue(BOOL, bool(v))


def string(v: str) -> MetaValue:
    """A STRING value."""
    return MetaValue(STRING, str(v))


def array(values: Iterable[Any] | np.ndarray, sub_type: int) -> MetaValue:
    """An ARRAY value of element type ``sub_type`` (a numpy array is kept as it is, anything else listed)."""
    return MetaValue(ARRAY, values if isinstance(values, np.ndarray) else list(values), sub_type)


def meta_value(kv: KeyValue) -> MetaValue:
    """A value read by :func:`inspector.gguf.open_gguf` as a :class:`MetaValue` that writes it back verbatim:
    scalars as they are, string arrays as lists of raw ``bytes`` (not decoded), numeric / bool arrays as
    numpy copies (the source file may be closed afterwards).

    Raises:
        ValueError: an array of arrays (gguf-py's writer cannot write nested arrays).
    """
    v = kv.value
    if not isinstance(v, ArrayValue):
        return MetaValue(kv.value_type, v)
    if v.element_type == STRING:
        return MetaValue(ARRAY, v.to_bytes_list(), STRING)
    if v.element_type == ARRAY:
        raise ValueError(f"{kv.key}: nested arrays cannot be copied")
    return MetaValue(ARRAY, np.array(v.to_numpy()), v.element_type)


def write_gguf(path: str | os.PathLike[str], arch: str | None,
               kv: Mapping[str, MetaValue] | Iterable[tuple[str, MetaValue]],
               tensors: Mapping[str, Any]) -> Path:
    """Write one GGUF atomically (``PATH.tmp`` then ``os.replace``); parent folders are created.

    Args:
        path: the file to write.
        arch: ``general.architecture`` (written first, as gguf-py does); None writes no architecture key
            (test files of a broken kind).
        kv: ``{key: MetaValue}`` or ``[(key, MetaValue), ...]``, written in that order after the
            architecture.
        tensors: ``{name: array}`` in file order: a numpy array (numpy order; written in its dtype:
            float32 / float16 / int32 / ...), or ``(raw_bytes_array, ggml_type)`` for pre-quantized data
            (``gguf.quants.quantize`` output and its ``GGMLQuantizationType``; BF16 likewise).

    Returns:
        ``path`` as a :class:`Path`.

    Raises:
        OSError: the file cannot be written (the ``.tmp`` file is removed).
        ValueError: a value gguf-py cannot write (e.g. a value type id it does not know).
    """
    import gguf  # gguf-py's writer; keys and tensor names are passed as plain strings

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    items = kv.items() if isinstance(kv, Mapping) else kv
    try:
        w = gguf.GGUFWriter(tmp, arch or "x")
        if arch is None:
            w.kv_data[0].pop("general.architecture", None)
        for key, mv in items:
            vtype = gguf.GGUFValueType(mv.type)
            if mv.type == ARRAY:
                val = mv.value.tolist() if isinstance(mv.value, np.ndarray) else list(mv.value)
                w.add_key_value(key, val, vtype, sub_type=gguf.GGUFValueType(cast(int, mv.sub_type)))
            else:
                w.add_key_value(key, mv.value, vtype)
        for name, arr in tensors.items():
            if isinstance(arr, tuple):
                w.add_tensor(name, arr[0], raw_dtype=arr[1])
            else:
                w.add_tensor(name, np.ascontiguousarray(arr))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


__all__ = ["MetaValue", "array", "boolean", "f32", "meta_value", "string", "u32", "write_gguf"]
