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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

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


class StreamedTensor:
    """A tensor whose data is made while the file is written, block by block (:func:`write_gguf` holds one block
    of it at a time, not the tensor: a converted 20+ GB checkpoint is never in memory whole).

    Attributes:
        shape: the shape of its values, numpy order (GGUF ``ne`` reversed).
        ggml_type: its GGML type id (``gguf.GGMLQuantizationType``'s values: F32 0, F16 1, Q8_0 8, I32 26, BF16 30).
        nbytes: its data's size in ``ggml_type``: what the blocks add up to.
        blocks: called once, when its data is written: numpy arrays whose bytes, in order, are that data.
    """

    #: what gguf-py's ``add_tensor`` reads to describe the data: any dtype but uint8 keeps ``shape`` as given.
    #: gguf-py's writer keeps the object ``add_tensor`` is given and, in ``write_tensors_to_file``, checks its
    #: ``nbytes`` and calls its ``tofile`` (gguf 0.19.0; the streamed conversion tests, byte for byte against
    #: gguf-py's own whole-tensor output, fail should a later gguf-py stop doing so)
    dtype = np.dtype(np.float32)

    def __init__(self, shape: tuple[int, ...], ggml_type: int, nbytes: int,
                 blocks: Callable[[], Iterable[np.ndarray]]) -> None:
        self.shape, self.ggml_type, self.nbytes, self.blocks = tuple(shape), int(ggml_type), int(nbytes), blocks

    def tofile(self, fp: IO[bytes]) -> None:
        """Write the blocks' bytes to ``fp`` (gguf-py's writer calls this in the tensor's turn).

        Raises:
            ValueError: the blocks add up to another size than ``nbytes`` (the file would be corrupt).
        """
        n = 0
        for b in self.blocks():
            b = np.ascontiguousarray(b)
            b.tofile(fp)
            n += b.nbytes
        if n != self.nbytes:
            raise ValueError(f"a streamed tensor's blocks hold {n} bytes, its header says {self.nbytes}")


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
            (``gguf.quants.quantize`` output and its ``GGMLQuantizationType``; BF16 likewise), or a
            :class:`StreamedTensor` (its data made while it is written, a block at a time).

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
            if isinstance(arr, StreamedTensor):     # (gguf-py stores it and calls its tofile in its turn)
                w.add_tensor(name, cast(Any, arr), raw_shape=arr.shape,
                             raw_dtype=gguf.GGMLQuantizationType(arr.ggml_type))
            elif isinstance(arr, tuple):
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


__all__ = ["MetaValue", "StreamedTensor", "array", "boolean", "f32", "meta_value", "string", "u32", "write_gguf"]
