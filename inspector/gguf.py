"""Our GGUF reader: a fast, safe walk of the header on a memory map, with lazy arrays.

File layout (GGUF v2 / v3, little-endian; see ggml/docs/gguf.md and ggml/src/gguf.cpp of llama.cpp)::

    magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
    n_kv x  (key: string, value_type u32, value)
    n_tensors x (name: string, n_dims u32, ne[n_dims] u64, ggml_type u32, offset u64)
    padding to general.alignment (default 32)
    tensor data (each tensor's offset is relative to the start of this section)

    string = length u64 + UTF-8 bytes;  array = element_type u32 + length u64 + elements

The whole header is walked and every count and length is checked against the bytes that remain before
anything is allocated, so a hostile count (2**63) is a :class:`GGUFFormatError`, never a MemoryError or a
hang. Large arrays (the tokenizer's 262144 tokens and 514906 merges) are not decoded: numeric arrays are
kept as (offset, length) and read through numpy on request; string arrays keep one compact int64 table of
element offsets and decode a string only when asked. Tensor data is never read to open a file; it comes
through :meth:`GGUFFile.tensor_data`, a row slice at a time, as a numpy view of the memory map.

Big-endian files are recognised (byte-swapped version field) and refused with
:class:`UnsupportedFileError`. Unknown ggml type ids are kept (``"unknown type N"``, sizes None).

A file whose bytes do not come from a memory map is walked by :func:`parse_header` over the bytes read
so far (the byte-source seam, :class:`ByteReader`); how many bytes to read, and when, is the caller's
strategy (:func:`mtpscope.inspector.remote.open_gguf_reader`). :class:`GGUFLike` is what every model
reader answers (one file, or a split model read as one: :mod:`mtpscope.inspector.shards`).
"""

from __future__ import annotations

import array
import math
import mmap
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NoReturn, Protocol

import numpy as np

from mtpscope.errors import GGUFFormatError, LayoutError, TensorDataError, UnsupportedFileError
from mtpscope.inspector.ggml_types import type_info
from mtpscope.inspector.paths import require_regular_file

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4
MAX_ARRAY_DEPTH = 16  # nesting of arrays of arrays; deeper is refused (it is never used in practice)
# refusals of llama.cpp's GGUF parser (ggml/src/gguf.cpp, ggml.h) that make a file unreadable for us too
GGUF_MAX_STRING_LENGTH = 1024 * 1024 * 1024  # any string: key, value, array element, tensor name
GGML_MAX_NAME = 64  # tensor names must be shorter (bytes)
_INT64_MAX = (1 << 63) - 1

# GGUF value types (gguf.h enum gguf_type)
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)

VALUE_TYPE_NAMES: dict[int, str] = {
    UINT8: "UINT8", INT8: "INT8", UINT16: "UINT16", INT16: "INT16", UINT32: "UINT32", INT32: "INT32",
    FLOAT32: "FLOAT32", BOOL: "BOOL", STRING: "STRING", ARRAY: "ARRAY", UINT64: "UINT64", INT64: "INT64",
    FLOAT64: "FLOAT64",
}
"""GGUF value type id -> name (the names of gguf-py's ``GGUFValueType``)."""

# fixed-size value types: struct format, size in bytes, numpy dtype
_FIXED: dict[int, tuple[struct.Struct, int, str]] = {
    UINT8: (struct.Struct("<B"), 1, "<u1"),
    INT8: (struct.Struct("<b"), 1, "<i1"),
    UINT16: (struct.Struct("<H"), 2, "<u2"),
    INT16: (struct.Struct("<h"), 2, "<i2"),
    UINT32: (struct.Struct("<I"), 4, "<u4"),
    INT32: (struct.Struct("<i"), 4, "<i4"),
    FLOAT32: (struct.Struct("<f"), 4, "<f4"),
    BOOL: (struct.Struct("<B"), 1, "<u1"),
    UINT64: (struct.Struct("<Q"), 8, "<u8"),
    INT64: (struct.Struct("<q"), 8, "<i8"),
    FLOAT64: (struct.Struct("<d"), 8, "<f8"),
}

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HEAD = struct.Struct("<4sIQQ")
_ARR_HEAD = struct.Struct("<IQ")
# after a tensor's n_dims: ne[n_dims] u64, ggml_type u32, offset u64
_TENSOR_TAIL = tuple(struct.Struct("<" + "Q" * n + "IQ") for n in range(GGML_MAX_DIMS + 1))


class NeedMoreBytes(Exception):
    """Raised by the header walk over a partial buffer (a :class:`ByteReader` source): the header goes on.

    Not an error for users: :func:`parse_header` raises it and the read strategy
    (:func:`mtpscope.inspector.remote.open_gguf_reader`) catches it and reads more. ``needed_end`` is the
    absolute offset the walk must be able to read up to next (certain); ``estimated_end`` is its guess of
    where the header ends (the rest of a string array at the mean element size walked so far, each
    remaining metadata pair at 16 bytes, each remaining tensor-info record at the mean size walked so far
    or 80 bytes), always ``>= needed_end``.
    """

    def __init__(self, needed_end: int, estimated_end: int, key: str | None = None, key_offset: int = -1,
                 array_length: int | None = None, tensors_estimate: int = 0,
                 pairs: Mapping[str, KeyValue] | None = None) -> None:
        super().__init__(f"header continues to at least offset {needed_end} (estimated end {estimated_end})")
        self.needed_end = needed_end
        self.estimated_end = estimated_end
        #: the metadata key being read when the bytes ran out (None: in the tensor-info table), the
        #: offset of its pair, the length of the string array being walked, if any, and the estimated
        #: bytes of the tensor-info records not yet read
        self.key = key
        self.key_offset = key_offset
        self.array_length = array_length
        self.tensors_estimate = tensors_estimate
        self.pairs: Mapping[str, KeyValue] = pairs or {}  # the pairs read completely before it


def value_type_name(value_type: int) -> str:
    """Name of a GGUF value type id (``"UINT32"``), or ``"unknown value type N"``."""
    return VALUE_TYPE_NAMES.get(value_type, f"unknown value type {value_type}")


# --------------------------------------------------------------------------------------------- records


@dataclass(frozen=True, eq=False)
class ArrayValue:
    """A GGUF array value, kept lazy: nothing is decoded until asked.

    Attributes:
        element_type: GGUF value type id of the elements (``STRING`` = 8, ``ARRAY`` = 9 for nested arrays).
        length: number of elements.
        offset: absolute byte offset of the array value (its element-type field); the elements start
            12 bytes later (:attr:`data_offset`).

    ``len(a)``, ``a[i]`` (a Python scalar, ``str`` or nested :class:`ArrayValue`), ``a[i:j]`` (a list),
    ``iter(a)``, :meth:`to_numpy` (numeric and bool arrays: a read-only view of the file, no copy),
    :meth:`to_list` (decodes everything) and :meth:`to_bytes_list` (a STRING array's raw bytes). Strings
    are decoded (UTF-8) on access only; an undecodable one raises :class:`GGUFFormatError` naming its offset.
    """

    element_type: int
    length: int
    offset: int
    _file: _Source = field(repr=False)
    _key: str = field(repr=False)
    # absolute start offset of each element (a string's length field, a nested array's header) for
    # STRING and ARRAY elements; None for fixed-size elements
    _elem_offsets: np.ndarray | None = field(default=None, repr=False)

    @property
    def data_offset(self) -> int:
        """Absolute offset of the first element (after the 4-byte type and 8-byte length)."""
        return self.offset + 12

    @property
    def element_type_name(self) -> str:
        """Name of the element type (``"STRING"``)."""
        return value_type_name(self.element_type)

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[Any]:
        for i in range(self.length):
            yield self[i]

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self._item(i) for i in range(*index.indices(self.length))]
        i = int(index)
        if i < 0:
            i += self.length
        if not 0 <= i < self.length:
            raise IndexError(f"array index {index} out of range for {self._key!r} of length {self.length}")
        return self._item(i)

    def _item(self, i: int) -> Any:
        et = self.element_type
        if et == STRING:
            assert self._elem_offsets is not None  # noqa: S101 - internal invariant, set by the parser
            return self._file.string_at(int(self._elem_offsets[i]), self._key)
        if et == ARRAY:
            assert self._elem_offsets is not None  # noqa: S101 - internal invariant, set by the parser
            return _Parser(self._file).read_array(int(self._elem_offsets[i]), self._key, 0)[0]
        st, size, _ = _FIXED[et]
        v = st.unpack_from(self._file.mm, self.data_offset + i * size)[0]
        return v != 0 if et == BOOL else v

    def _string_bytes(self) -> list[bytes]:
        """The raw bytes of every string of a STRING array: one copy of the region, then one slice each."""
        offs = self._elem_offsets
        assert offs is not None  # noqa: S101 - internal invariant, set by the parser
        if self.length == 0:
            return []
        src = self._file
        first = int(offs[0])
        last = int(offs[-1])
        end = last + 8 + _U64.unpack_from(src.mm, last)[0]
        region = src.mm[first:end]
        starts = (offs - (first - 8)).tolist()  # each string's bytes, relative to the region
        stops = [*(offs[1:] - first).tolist(), end - first]
        return [region[a:b] for a, b in zip(starts, stops)]

    def _strings(self) -> list[str]:
        """All strings of a STRING array, decoded (UTF-8)."""
        try:
            return [b.decode("utf-8") for b in self._string_bytes()]
        except UnicodeDecodeError:
            assert self._elem_offsets is not None  # noqa: S101 - internal invariant, set by the parser
            # raises, naming the bad string
            return [self._file.string_at(int(p), self._key) for p in self._elem_offsets]

    def to_bytes_list(self) -> list[bytes]:
        """The elements of a STRING array as raw bytes (no UTF-8 decoding; what a writer copies verbatim).

        Raises:
            LayoutError: the elements are not strings.
        """
        if self.element_type != STRING:
            raise LayoutError(f"array of {self.element_type_name} is not a string array; use to_list()",
                              path=self._file.path, offset=self.offset, key=self._key)
        return self._string_bytes()

    def to_numpy(self) -> np.ndarray:
        """The elements as a 1-D numpy array (numpy order = element order).

        Numeric types: a read-only view of the memory map (no copy) with the file's little-endian dtype.
        BOOL: a new ``bool`` array (byte != 0).

        Raises:
            LayoutError: the elements are strings or arrays.
        """
        et = self.element_type
        if et not in _FIXED:
            raise LayoutError(f"array of {self.element_type_name} has no numpy form; use to_list()",
                              path=self._file.path, offset=self.offset, key=self._key)
        dtype = _FIXED[et][2]
        arr = np.frombuffer(self._file.mm, dtype=dtype, count=self.length, offset=self.data_offset)
        return arr != 0 if et == BOOL else arr

    def to_list(self) -> list[Any]:
        """Every element decoded into Python objects (nested arrays become nested lists)."""
        et = self.element_type
        if et == STRING:
            assert self._elem_offsets is not None  # noqa: S101 - internal invariant, set by the parser
            return self._strings()
        if et == ARRAY:
            return [self._item(i).to_list() for i in range(self.length)]
        out: list[Any] = self.to_numpy().tolist()
        return out


@dataclass(frozen=True)
class KeyValue:
    """One metadata key/value pair.

    Attributes:
        key: the GGUF key (``"general.architecture"``).
        value_type: GGUF value type id (``ARRAY`` = 9 for arrays).
        type_name: its name (``"UINT32"``, ``"ARRAY"``).
        offset: absolute byte offset of the pair (start of the key string's length field).
        value: a Python ``int`` / ``float`` / ``bool`` / ``str``, or an :class:`ArrayValue`.
    """

    key: str
    value_type: int
    type_name: str
    offset: int
    value: Any


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor-info table.

    Attributes:
        name: tensor name (``"blk.0.attn_q.weight"``).
        ggml_type: ggml type id.
        type_name: ``"Q8_0"``, ``"BF16"``, ... or ``"unknown type N"``.
        ne: shape in GGUF ``ne`` order (innermost first), as stored in the file.
        shape: the same shape in numpy order (outermost first) = ``tuple(reversed(ne))``.
        n_elements: product of ``ne``.
        n_bytes: bytes of data (``n_elements * type_size / block_size``); None for an unknown type.
        bits_per_weight: ``8 * type_size / block_size``; None for an unknown type.
        offset: absolute byte offset of the tensor data in the file (data section start + stored offset).
        info_offset: absolute byte offset of this tensor-info record (its name's length field).
    """

    name: str
    ggml_type: int
    type_name: str
    ne: tuple[int, ...]
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int | None
    bits_per_weight: float | None
    offset: int
    info_offset: int


# ------------------------------------------------------------------------------------------- the file


class ByteReader(Protocol):
    """Where the bytes of a file that is not memory-mapped come from (the byte-source seam).

    ``read(offset, n)`` returns exactly ``n`` bytes starting at absolute ``offset`` (fewer only at the end
    of the file) or raises an :class:`~mtpscope.errors.InspectorError` naming the source. A local file is
    never read through this: it is memory-mapped (:func:`open_gguf`). ``inspector/remote.py`` implements
    it with HTTP range requests.
    """

    def read(self, offset: int, n: int) -> bytes: ...  # pragma: no cover - protocol


class GGUFLike(Protocol):
    """What the readers of a model give (the Reader contract): one file (:class:`GGUFFile`) or a split
    model read as one (:class:`mtpscope.inspector.shards.ShardedGGUF`), local or remote.

    ``shards`` are the files the model is read from, in order (a single file answers ``(itself,)``);
    their ``reader`` is each file's :class:`ByteReader` (None when memory-mapped); ``shard_of(name)`` the
    0-based shard holding a tensor (0 for a single file). The other members
    are :class:`GGUFFile`'s: a split model answers with its first shard's header fields and metadata,
    every shard's tensors, ``file_size`` summed.
    """

    @property
    def path(self) -> str: ...  # pragma: no cover - protocol

    @property
    def file_size(self) -> int: ...  # pragma: no cover - protocol

    @property
    def version(self) -> int: ...  # pragma: no cover - protocol

    @property
    def alignment(self) -> int: ...  # pragma: no cover - protocol

    @property
    def data_offset(self) -> int: ...  # pragma: no cover - protocol

    @property
    def header_end(self) -> int: ...  # pragma: no cover - protocol

    @property
    def kv(self) -> Mapping[str, KeyValue]: ...  # pragma: no cover - protocol

    @property
    def tensors(self) -> tuple[TensorInfo, ...]: ...  # pragma: no cover - protocol

    @property
    def architecture(self) -> str | None: ...  # pragma: no cover - protocol

    @property
    def reader(self) -> ByteReader | None: ...  # pragma: no cover - protocol

    @property
    def shards(self) -> tuple[GGUFFile, ...]: ...  # pragma: no cover - protocol

    def get(self, key: str, default: Any = None) -> Any: ...  # pragma: no cover - protocol

    def shard_of(self, name: str) -> int: ...  # pragma: no cover - protocol

    def tensor(self, name: str) -> TensorInfo: ...  # pragma: no cover - protocol

    def tensor_data(self, name: str, rows: slice | int | None = None,
                    dequantize: bool = True) -> np.ndarray: ...  # pragma: no cover - protocol

    def close(self) -> None: ...  # pragma: no cover - protocol

    def __enter__(self) -> GGUFLike: ...  # pragma: no cover - protocol

    def __exit__(self, *exc: object) -> None: ...  # pragma: no cover - protocol


class _Source:
    """The bytes of a file, shared by a file and its lazy arrays.

    ``mm`` is the memory map of a local file (``avail == size``), or, for a file read through a
    :class:`ByteReader`, the header bytes ``[0, avail)`` (the tensor-info table and every metadata value
    lie inside them); tensor data then comes from ``reader``.
    """

    __slots__ = ("path", "mm", "size", "avail", "reader")

    def __init__(self, path: str, mm: mmap.mmap | bytes, size: int, avail: int | None = None,
                 reader: ByteReader | None = None) -> None:
        self.path = path
        self.mm = mm
        self.size = size
        self.avail = size if avail is None else avail
        self.reader = reader

    def string_at(self, pos: int, key: str) -> str:
        """Decode the GGUF string whose length field is at ``pos`` (bounds were checked by the walk)."""
        n = _U64.unpack_from(self.mm, pos)[0]
        try:
            return self.mm[pos + 8:pos + 8 + n].decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGUFFormatError("string is not valid UTF-8", path=self.path, offset=pos + 8 + e.start,
                                  key=key, expected="UTF-8", actual=f"byte 0x{e.object[e.start]:02x}") from None


@dataclass(frozen=True, eq=False)
class GGUFFile:
    """An opened GGUF file (see :func:`open_gguf`).

    Attributes:
        path: the file's path (as given, made a string).
        file_size: size in bytes.
        version: GGUF version (2 or 3).
        alignment: data alignment in bytes (``general.alignment``, default 32).
        data_offset: absolute offset of the tensor data section (header end padded to ``alignment``).
        header_end: absolute offset where the tensor-info table ends (before padding).
        kv: metadata pairs by key, in file order (read-only mapping of :class:`KeyValue`).
        tensors: tensor-info records in file order.
    """

    path: str
    file_size: int
    version: int
    alignment: int
    data_offset: int
    header_end: int
    kv: Mapping[str, KeyValue]
    tensors: tuple[TensorInfo, ...]
    _src: _Source = field(repr=False)
    _by_name: Mapping[str, TensorInfo] = field(repr=False)

    def __repr__(self) -> str:
        return (f"GGUFFile(path={self.path!r}, version={self.version}, file_size={self.file_size}, "
                f"architecture={self.architecture!r}, n_kv={len(self.kv)}, n_tensors={len(self.tensors)})")

    # -- metadata
    def get(self, key: str, default: Any = None) -> Any:
        """The decoded value of ``key`` (scalar, ``str`` or :class:`ArrayValue`), else ``default``."""
        kv = self.kv.get(key)
        return default if kv is None else kv.value

    @property
    def architecture(self) -> str | None:
        """``general.architecture`` if it is a string, else None."""
        v = self.get("general.architecture")
        return v if isinstance(v, str) else None

    @property
    def reader(self) -> ByteReader | None:
        """The :class:`ByteReader` tensor data comes from (a remote file), or None (memory-mapped)."""
        return self._src.reader

    @property
    def shards(self) -> tuple[GGUFFile, ...]:
        """The files this model is read from: ``(self,)`` (a split model's :class:`GGUFLike` answers
        with every shard)."""
        return (self,)

    def shard_of(self, name: str) -> int:
        """0-based index of the shard holding tensor ``name``: 0, a single file holds all its tensors.

        Raises:
            LayoutError: no such tensor.
        """
        self.tensor(name)
        return 0

    def header_bytes(self, offset: int, n: int) -> bytes:
        """Bytes ``[offset, offset + n)`` of the file's header (fewer at the end of the bytes held: a
        file read through a :class:`ByteReader` holds only its header)."""
        end = min(offset + max(0, n), self._src.avail)
        return bytes(self._src.mm[offset:end]) if 0 <= offset < end else b""

    # -- tensors
    def tensor(self, name: str) -> TensorInfo:
        """The :class:`TensorInfo` named ``name``.

        Raises:
            LayoutError: no tensor of that name.
        """
        t = self._by_name.get(name)
        if t is None:
            raise LayoutError("no such tensor", path=self.path, key=name)
        return t

    def tensor_data(self, name: str, rows: slice | int | None = None, dequantize: bool = True) -> np.ndarray:
        """Tensor values in numpy order (``shape``), read through the memory map.

        Args:
            name: tensor name.
            rows: a slice (or one index) over the outermost numpy dimension (``shape[0]`` = ``ne[-1]``);
                None = all rows. Only those rows' bytes are touched.
            dequantize: for BF16 and block-quantized types, return float32 values (via
                ``gguf.quants.dequantize``); if False return the raw bytes as uint8 with shape
                ``shape[:-1] + (bytes per innermost row,)``.

        Returns:
            F32 / F16 / F64 / I8 / I16 / I32 / I64: a read-only view in the file's dtype (no copy).
            BF16 and quantized types: a new float32 array (``dequantize=True``) or a uint8 view.
            With an integer ``rows`` the outermost dimension is dropped.

        Raises:
            LayoutError: no tensor of that name; ``rows`` with ``dequantize=False`` on a 1-D BF16 or
                block-quantized tensor (its bytes are not element rows).
            TensorDataError: unknown ggml type, or a type ``gguf.quants`` cannot dequantize.
        """
        t = self.tensor(name)
        info = type_info(t.ggml_type)
        if not info.known or t.n_bytes is None:
            raise TensorDataError("cannot read data of an unknown ggml type", path=self.path, offset=t.offset,
                                  key=name, expected="a known ggml type", actual=t.type_name)
        shape = t.shape if t.shape else (1,)
        if self._src.reader is not None:
            return self._read_through(t, info, shape, rows, dequantize)
        mm = self._src.mm
        if info.numpy_dtype is not None:
            arr = np.ndarray(shape=shape, dtype=info.numpy_dtype, buffer=mm, offset=t.offset)
            return arr if rows is None else arr[rows]
        if info.block_size is None or info.type_size is None:  # pragma: no cover - info.known above
            raise TensorDataError("unknown type sizes", path=self.path, offset=t.offset, key=name)
        row_bytes = shape[-1] // info.block_size * info.type_size
        raw = np.ndarray(shape=(*shape[:-1], row_bytes), dtype=np.uint8, buffer=mm, offset=t.offset)
        one_d = len(shape) == 1
        if rows is not None and not one_d:
            raw = raw[rows]
        if not dequantize:
            if one_d and rows is not None:
                raise LayoutError("the raw bytes of a 1-D quantized tensor have no element rows; read it "
                                  "whole or dequantize", path=self.path, offset=t.offset, key=name)
            return raw
        out = _dequantize(raw, t, self.path)
        return out[rows] if (one_d and rows is not None) else out

    def _read_through(self, t: TensorInfo, info: Any, shape: tuple[int, ...], rows: slice | int | None,
                      dequantize: bool) -> np.ndarray:
        """:meth:`tensor_data` for a file read through a :class:`ByteReader`: only the selected rows'
        bytes are read (one contiguous range covering them); same results as the memory-mapped path."""
        reader = self._src.reader
        assert reader is not None and t.n_bytes is not None  # noqa: S101 - checked by the caller
        one_d = len(shape) == 1
        n0 = shape[0]
        sel: Any = rows
        r0, r1 = 0, n0
        if not one_d and isinstance(rows, slice):
            idx = range(*rows.indices(n0))
            r0, r1 = (min(idx[0], idx[-1]), max(idx[0], idx[-1]) + 1) if len(idx) else (0, 0)
            sel = np.arange(idx.start, idx.stop, idx.step, dtype=np.int64) - r0
        elif not one_d and rows is not None and not isinstance(rows, slice):   # (a slice took the branch above)
            i = int(rows)
            if i < 0:
                i += n0
            if not 0 <= i < n0:
                raise IndexError(f"index {rows} is out of bounds for axis 0 with size {n0}")
            r0, r1, sel = i, i + 1, 0
        per_row = t.n_bytes // n0 if n0 else 0
        if one_d:
            if rows is not None and not dequantize and info.numpy_dtype is None:
                raise LayoutError("the raw bytes of a 1-D quantized tensor have no element rows; read it "
                                  "whole or dequantize", path=self.path, offset=t.offset, key=t.name)
            data = reader.read(t.offset, t.n_bytes)
        else:
            data = reader.read(t.offset + r0 * per_row, (r1 - r0) * per_row)
        sub = (r1 - r0, *shape[1:]) if not one_d else shape
        if info.numpy_dtype is not None:
            arr = np.frombuffer(data, dtype=info.numpy_dtype).reshape(sub)
            return arr if sel is None else arr[sel]
        row_bytes = shape[-1] // info.block_size * info.type_size
        raw = np.frombuffer(data, dtype=np.uint8).reshape(*sub[:-1], row_bytes)
        if not dequantize:
            return raw if sel is None else raw[sel]
        out = _dequantize(raw, t, self.path)
        return out if sel is None else out[sel]

    # -- lifetime
    def close(self) -> None:
        """Close the memory map (arrays still viewing it keep it alive until they are freed), or the
        connections of a file read through a :class:`ByteReader` that has a ``close()``."""
        closer = getattr(self._src.reader, "close", None)
        if closer is not None:
            closer()
        mm = self._src.mm
        if isinstance(mm, mmap.mmap):
            try:
                mm.close()
            except BufferError:
                pass  # numpy views are still alive; the map is released with them

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _dequantize(raw: np.ndarray, t: TensorInfo, path: str) -> np.ndarray:
    """float32 values of ``raw`` (uint8 rows of ``t``'s type) through gguf.quants."""
    try:
        from gguf import quants
        from gguf.constants import GGMLQuantizationType

        qtype = GGMLQuantizationType(t.ggml_type)
        out = quants.dequantize(np.ascontiguousarray(raw), qtype)
    except (ValueError, NotImplementedError, ImportError) as e:
        raise TensorDataError(f"gguf.quants cannot dequantize this type: {e}", path=path, offset=t.offset,
                              key=t.name, actual=t.type_name) from None
    return np.asarray(out, dtype=np.float32)


# ------------------------------------------------------------------------------------------- parsing


class _Parser:
    """Walks a GGUF header on a buffer; every read is bounds-checked first."""

    def __init__(self, src: _Source, like: GGUFFile | None = None) -> None:
        self.src = src
        self.like = like  # a GGUF parsed before whose string arrays this one may repeat byte for byte
        self.buf = src.mm
        self.size = src.size
        self.avail = src.avail  # bytes of the buffer present (== size for a memory-mapped file)
        self.path = src.path
        # progress, read only when the buffer ends before the header does (see _more)
        self.kv_left = 0
        self.n_tensors = 0
        self.ti_done = 0
        self.ti_bytes = 0
        self.strings: tuple[int, int, int, int] | None = None  # (start, n, i, pos) of a string array walk
        self.key: str | None = None  # the key being read and the offset of its pair
        self.key_at = -1
        self.pairs: dict[str, KeyValue] = {}
        # the walk of :meth:`counts_error`: the header's counts unchecked, a string cut by the end of the file
        # said to be cut; ``ran_out`` is set where a read found the file ended (the walk's error says so)
        self.probing = False
        self.ran_out = False

    # -- errors and primitive reads
    def fail(self, message: str, offset: int, key: str | None = None, expected: Any = None,
             actual: Any = None, cls: type[GGUFFormatError] | type[TensorDataError] = GGUFFormatError) -> NoReturn:
        raise cls(message, path=self.path, offset=offset, key=key, expected=expected, actual=actual)

    def need(self, pos: int, n: int, what: str, key: str | None = None) -> None:
        if pos + n > self.avail:
            if pos + n > self.size:
                self.ends_early(pos, n, what, key)
            self.more(pos + n)

    def ends_early(self, pos: int, n: int, what: str, key: str | None) -> NoReturn:
        """The file ends before the ``n`` bytes of ``what`` at ``pos`` do."""
        self.ran_out = True
        self.fail(f"file ends early, at byte {self.size}, inside {what}", pos, key,
                  expected=f"{n} bytes", actual=f"{max(0, self.size - pos)} bytes left")

    def more(self, end: int) -> NoReturn:
        """The header continues past the bytes present: say how far it certainly and probably goes."""
        est = end
        if self.strings is not None:  # inside a string array: the rest at the mean element size so far
            start, n, i, pos = self.strings
            est += int((n - i) * ((pos - start) / i if i else 16))
        est += 16 * self.kv_left  # each remaining pair: a short key and a small value (at least 13 bytes)
        left = self.n_tensors - self.ti_done
        t_est = int(left * (self.ti_bytes / self.ti_done if self.ti_done else 80))
        raise NeedMoreBytes(end, max(end, est + t_est), self.key, self.key_at,
                            None if self.strings is None else self.strings[1], t_est, self.pairs)

    def read_string(self, pos: int, what: str, key: str | None = None) -> tuple[str, int]:
        self.need(pos, 8, f"the length of {what}", key)
        n = _U64.unpack_from(self.buf, pos)[0]
        left = self.size - pos - 8
        if n > left:
            if self.probing and n <= GGUF_MAX_STRING_LENGTH:   # a length a string may have: the file was cut in it
                self.ends_early(pos, 8 + n, what, key)
            self.fail(f"length of {what} runs past the end of the file", pos, key,
                      expected=f"<= {left} bytes", actual=n)
        if n > GGUF_MAX_STRING_LENGTH:
            self.fail(f"string length {n} exceeds maximum {GGUF_MAX_STRING_LENGTH} ({what}; llama.cpp refuses it)",
                      pos, key, expected=f"<= {GGUF_MAX_STRING_LENGTH} bytes", actual=n)
        if pos + 8 + n > self.avail:
            self.more(pos + 8 + n)
        raw = self.buf[pos + 8:pos + 8 + n]
        try:
            s = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            self.fail(f"{what} is not valid UTF-8", pos + 8 + e.start, key, expected="UTF-8",
                      actual=f"byte 0x{raw[e.start]:02x}")
        return s, pos + 8 + n

    # -- values
    def read_value(self, pos: int, vtype: int, key: str, depth: int = 0) -> tuple[Any, int]:
        fixed = _FIXED.get(vtype)
        if fixed is not None:
            st, size, _ = fixed
            self.need(pos, size, f"a {VALUE_TYPE_NAMES[vtype]} value", key)
            v = st.unpack_from(self.buf, pos)[0]
            return (v != 0 if vtype == BOOL else v), pos + size
        if vtype == STRING:
            return self.read_string(pos, "a string value", key)
        if vtype == ARRAY:
            return self.read_array(pos, key, depth)
        self.fail("unknown value type", pos - 4, key, expected="0..12", actual=vtype)

    def read_array(self, pos: int, key: str, depth: int) -> tuple[ArrayValue, int]:
        if depth >= MAX_ARRAY_DEPTH:
            self.fail("arrays nested too deeply", pos, key, expected=f"<= {MAX_ARRAY_DEPTH} levels",
                      actual=f"{depth + 1} levels")
        self.need(pos, 12, "an array header", key)
        etype, n = _ARR_HEAD.unpack_from(self.buf, pos)
        start = pos + 12
        left = self.size - start
        fixed = _FIXED.get(etype)
        if fixed is not None:
            size = fixed[1]
            if n > left // size:
                self.fail(f"array of {n} {VALUE_TYPE_NAMES[etype]} runs past the end of the file", pos + 4,
                          key, expected=f"<= {left // size} elements ({left} bytes left)", actual=n)
            return ArrayValue(etype, n, pos, self.src, key), start + n * size
        if etype == STRING:
            if n > left // 8:
                self.fail(f"array of {n} strings runs past the end of the file", pos + 4, key,
                          expected=f"<= {left // 8} elements ({left} bytes left)", actual=n)
            reused = self.reuse_strings(start, n, key)
            offsets, end = reused if reused is not None else self.walk_strings(start, n, key)
            return ArrayValue(etype, n, pos, self.src, key, _elem_offsets=offsets), end
        if etype == ARRAY:
            if n > left // 12:
                self.fail(f"array of {n} arrays runs past the end of the file", pos + 4, key,
                          expected=f"<= {left // 12} elements ({left} bytes left)", actual=n)
            # children are walked (validated) but not kept: only their offsets, 8 bytes each (<= the
            # 12 bytes each takes in the file); a child is parsed again when it is accessed
            offs = array.array("q", [0]) * n
            p = start
            for i in range(n):
                offs[i] = p
                _, p = self.read_array(p, key, depth + 1)
            return ArrayValue(etype, n, pos, self.src, key, _elem_offsets=np.frombuffer(offs, np.int64)), p
        self.fail("unknown array element type", pos, key, expected="0..12", actual=etype)

    def reuse_strings(self, start: int, n: int, key: str) -> tuple[np.ndarray, int] | None:
        """The element offsets and end of the string array ``key`` at ``start`` taken from :attr:`like`'s
        array of that key when it has ``n`` elements and the same bytes (so the same strings, lengths and
        checks): no walk. None when there is no such array or any byte differs."""
        kv = self.like.kv.get(key) if self.like is not None else None
        v = kv.value if kv is not None else None
        if not isinstance(v, ArrayValue) or v.element_type != STRING or v.length != n or v._elem_offsets is None:
            return None
        if n == 0:
            return np.empty(0, dtype=np.int64), start
        other = v._file.mm
        s0, last = int(v._elem_offsets[0]), int(v._elem_offsets[-1])
        n_bytes = last + 8 + _U64.unpack_from(other, last)[0] - s0
        if start + n_bytes > self.avail or self.buf[start:start + n_bytes] != other[s0:s0 + n_bytes]:
            return None
        return v._elem_offsets - s0 + start, start + n_bytes

    def walk_strings(self, start: int, n: int, key: str) -> tuple[np.ndarray, int]:
        """Offsets of ``n`` consecutive GGUF strings starting at ``start``; checks each against the end.

        The caller checked ``8 * n <= bytes left``, so the table is never larger than the file.
        """
        offs = array.array("q", [0]) * n
        unpack = _U64.unpack_from
        buf = self.buf
        pos = start
        try:
            for i in range(n):
                offs[i] = pos
                pos += 8 + unpack(buf, pos)[0]
        except (struct.error, OverflowError):
            self.string_array_error(start, n, key)
        if pos > self.avail:
            self.string_array_error(start, n, key)
        table = np.frombuffer(offs, dtype=np.int64)
        if n and pos - start > GGUF_MAX_STRING_LENGTH:  # only then can an element be that long
            lengths = np.diff(np.append(table, pos)) - 8
            i = int(np.argmax(lengths))
            if lengths[i] > GGUF_MAX_STRING_LENGTH:
                self.fail(f"string length {int(lengths[i])} exceeds maximum {GGUF_MAX_STRING_LENGTH} (string {i} "
                          "of the array; llama.cpp refuses it)", int(table[i]), key,
                          expected=f"<= {GGUF_MAX_STRING_LENGTH} bytes", actual=int(lengths[i]))
        return table, pos

    def string_array_error(self, start: int, n: int, key: str) -> NoReturn:
        """Slow second walk of a bad string array that names the first bad element."""
        pos, end = start, self.size
        for i in range(n):
            self.strings = (start, n, i, pos)
            self.need(pos, 8, f"the length of string {i} of the array", key)
            ln = _U64.unpack_from(self.buf, pos)[0]
            if ln > end - pos - 8:
                self.fail(f"string {i} of the array runs past the end of the file", pos, key,
                          expected=f"<= {end - pos - 8} bytes", actual=ln)
            pos += 8 + ln
            if pos > self.avail:
                self.more(pos)
        raise AssertionError("string_array_error called on a valid array")  # pragma: no cover

    # -- the header
    def parse(self) -> GGUFFile:
        size = self.size
        if size < 4 or self.buf[0:4] != GGUF_MAGIC:
            self.fail("not a GGUF file (bad magic)", 0, expected="b'GGUF'", actual=bytes(self.buf[0:4]))
        self.need(4, 4, "the version field")
        version = _U32.unpack_from(self.buf, 4)[0]
        if version not in SUPPORTED_VERSIONS:
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            if version & 0xFFFF == 0 and swapped in (1, 2, 3):
                raise UnsupportedFileError("big-endian GGUF files are not supported", path=self.path,
                                           offset=4, expected="little-endian",
                                           actual=f"big-endian version {swapped}")
            raise UnsupportedFileError("unsupported GGUF version", path=self.path, offset=4,
                                       expected=" or ".join(map(str, SUPPORTED_VERSIONS)), actual=version)
        self.need(8, 8, "the tensor count")
        self.need(16, 8, "the key/value count")
        _, _, n_tensors, n_kv = _HEAD.unpack_from(self.buf, 0)
        pos = 24
        # each pair needs >= 13 bytes (key length 8, type 4, a u8 value 1); each tensor info >= 24
        if (n_kv > (size - pos) // 13 or n_tensors > (size - pos) // 24) and not self.probing:
            self.counts_error(n_kv, n_tensors)

        self.n_tensors = n_tensors
        kv: dict[str, KeyValue] = {}
        self.pairs = kv
        for i in range(n_kv):
            self.kv_left = n_kv - i - 1
            start = pos
            key, pos = self.read_string(pos, f"key {i}")
            self.key, self.key_at, self.strings = key, start, None
            if not key:
                self.fail(f"key {i} is empty", start, "", expected="a non-empty key (llama.cpp refuses an empty one)",
                          actual="''")
            self.need(pos, 4, "a value type", key)
            vtype = _U32.unpack_from(self.buf, pos)[0]
            pos += 4
            if vtype not in VALUE_TYPE_NAMES:
                self.fail("unknown value type", pos - 4, key, expected="0..12", actual=vtype)
            value, pos = self.read_value(pos, vtype, key)
            if key in kv:
                self.fail(f"duplicate key '{key}' for KV pair {i}", start, key, expected="each key once",
                          actual=f"also at offset {kv[key].offset}")
            kv[key] = KeyValue(key, vtype, VALUE_TYPE_NAMES[vtype], start, value)

        alignment = DEFAULT_ALIGNMENT
        a_kv = kv.get("general.alignment")
        if a_kv is not None:
            if a_kv.value_type != UINT32:
                self.fail("general.alignment must be UINT32", a_kv.offset, a_kv.key, expected="UINT32",
                          actual=a_kv.type_name)
            alignment = a_kv.value
            if alignment == 0 or alignment & (alignment - 1):
                self.fail("general.alignment must be a non-zero power of two", a_kv.offset, a_kv.key,
                          expected="a power of two", actual=alignment)

        self.kv_left, self.key, self.strings = 0, None, None
        raw_tensors: list[tuple[str, tuple[int, ...], int, int, int, int]] = []
        append = raw_tensors.append
        buf, u64, u32, tails = self.buf, _U64.unpack_from, _U32.unpack_from, _TENSOR_TAIL
        size = self.avail  # the fast path's bounds: the bytes present (the whole file when mapped)
        ti_start = pos
        for i in range(n_tensors):
            # fast path, every bound checked; anything odd goes to tensor_info_error, which re-reads
            # the record slowly and raises the precise error
            start = pos
            if pos + 8 <= size:
                end = pos + 8 + u64(buf, pos)[0]
                if end + 4 <= size and end - pos - 8 < GGML_MAX_NAME:
                    try:
                        name = buf[pos + 8:end].decode("utf-8")
                    except UnicodeDecodeError:
                        name = None
                    if name is not None:
                        n_dims = u32(buf, end)[0]
                        if n_dims <= GGML_MAX_DIMS:
                            tail = tails[n_dims]
                            if end + 4 + tail.size <= size:
                                vals = tail.unpack_from(buf, end + 4)
                                append((name, vals[:n_dims], vals[n_dims], vals[n_dims + 1], start, end + 4))
                                pos = end + 4 + tail.size
                                continue
            self.ti_done, self.ti_bytes = i, start - ti_start
            self.tensor_info_error(start, i)
        header_end = pos
        data_offset = -(-pos // alignment) * alignment

        tensors = self.build_tensors(raw_tensors, data_offset, alignment)
        by_name = {t.name: t for t in tensors}
        return GGUFFile(self.path, self.size, version, alignment, data_offset, header_end,
                        MappingProxyType(kv), tensors, self.src, MappingProxyType(by_name))

    def counts_error(self, n_kv: int, n_tensors: int) -> NoReturn:
        """The header declares more pairs or tensors than the bytes after its first 24 can hold: a file cut short
        (the header walked as far as its bytes go runs into the end of the file: that error, "file ends early,
        inside ...", at the offset of the field cut), else a wrong count (that count's error). A count no file could
        hold (its smallest encoding past 2**63 bytes, the largest file offset) is wrong without a walk."""
        # a count whose smallest encoding passes the largest offset a file can have (off_t: 2**63 - 1) is wrong
        # whatever the file's length: no cut file has it
        if n_kv * 13 < 2**63 and n_tensors * 24 < 2**63:
            probe = _Parser(self.src)
            probe.probing = True
            try:
                probe.parse()
            except GGUFFormatError as e:
                if probe.ran_out:
                    raise e from None
            except (TensorDataError, UnsupportedFileError, NeedMoreBytes):
                pass
        size, pos = self.size, 24
        if n_kv > (size - pos) // 13:
            self.fail("key/value count exceeds what the file can hold", 16, "GGUF.kv_count",
                      expected=f"<= {(size - pos) // 13}", actual=n_kv)
        self.fail("tensor count exceeds what the file can hold", 8, "GGUF.tensor_count",
                  expected=f"<= {(size - pos) // 24}", actual=n_tensors)

    def tensor_info_error(self, pos: int, i: int) -> NoReturn:
        """Re-read tensor info ``i`` at ``pos`` with every check spelled out; raises the first failure."""
        start = pos
        name, pos = self.read_string(pos, f"the name of tensor {i}")
        n = pos - start - 8
        if n >= GGML_MAX_NAME:
            self.fail(f"tensor name {i} is too long: {n} >= {GGML_MAX_NAME}", start, name,
                      expected=f"< {GGML_MAX_NAME} bytes (GGML_MAX_NAME; llama.cpp refuses longer names)",
                      actual=f"{n} bytes")
        self.need(pos, 4, "a tensor's n_dims", name)
        n_dims = _U32.unpack_from(self.buf, pos)[0]
        if n_dims > GGML_MAX_DIMS:
            self.fail("too many dimensions", pos, name, expected=f"<= {GGML_MAX_DIMS}", actual=n_dims)
        self.need(pos + 4, _TENSOR_TAIL[n_dims].size, "a tensor info record", name)
        raise AssertionError("tensor_info_error called on a valid record")  # pragma: no cover

    def build_tensors(self, raw: list[tuple[str, tuple[int, ...], int, int, int, int]], data_offset: int,
                      alignment: int) -> tuple[TensorInfo, ...]:
        size = self.size
        seen: dict[str, int] = {}
        out: list[TensorInfo] = []
        extents: list[tuple[int, int, str]] = []
        cache: dict[int, Any] = {}
        for name, ne, ggml_type, rel, start, ne_pos in raw:
            if name in seen:
                self.fail("duplicate tensor name", start, name, expected="each name once",
                          actual=f"also at offset {seen[name]}")
            seen[name] = start
            if 0 in ne or (ne and max(ne) > _INT64_MAX):
                for j, d in enumerate(ne):
                    if d == 0:
                        self.fail(f"zero-sized dimension ne[{j}]", ne_pos + 8 * j, name, expected=">= 1",
                                  actual=0)
                    if d > _INT64_MAX:
                        self.fail(f"dimension ne[{j}] too large", ne_pos + 8 * j, name,
                                  expected=f"<= {_INT64_MAX}", actual=d)
            n_el = math.prod(ne)
            if n_el > _INT64_MAX:
                self.fail("tensor has too many elements", ne_pos, name, expected=f"<= {_INT64_MAX}",
                          actual=n_el)
            info = cache.get(ggml_type)
            if info is None:
                info = cache[ggml_type] = type_info(ggml_type)
            offset = data_offset + rel
            n_bytes = None
            if info.block_size is not None and info.type_size is not None:   # both known, or both None
                if ne and ne[0] % info.block_size:
                    self.fail(f"row size ne[0] is not a multiple of the {info.name} block size", ne_pos,
                              name, expected=f"a multiple of {info.block_size}", actual=ne[0])
                n_bytes = n_el * info.type_size // info.block_size
            if rel % alignment:
                self.fail("tensor data offset is not aligned", offset, name,
                          expected=f"a multiple of {alignment} (general.alignment)", actual=rel,
                          cls=TensorDataError)
            if n_bytes is not None:
                if offset + n_bytes > size:
                    self.fail("tensor data lies outside the file", offset, name,
                              expected=f"end <= file size {size}", actual=f"end {offset + n_bytes}",
                              cls=TensorDataError)
                extents.append((offset, offset + n_bytes, name))
            elif offset > size:
                self.fail("tensor data starts outside the file", offset, name,
                          expected=f"<= file size {size}", actual=offset, cls=TensorDataError)
            out.append(TensorInfo(name, ggml_type, info.name, ne, ne[::-1], n_el, n_bytes,
                                  info.bits_per_weight, offset, start))
        extents.sort()
        for (a0, a1, an), (b0, _b1, bn) in zip(extents, extents[1:]):
            if b0 < a1:
                self.fail(f"tensor data overlaps tensor {an!r} [{a0}, {a1})", b0, bn,
                          expected=f"start >= {a1}", actual=b0, cls=TensorDataError)
        # llama.cpp's parser (ggml/src/gguf.cpp, gguf_init_from_file_impl) also wants the data packed in the
        # tensor table's order: each tensor right after the one before it, padded to general.alignment
        expected = 0
        for t in out:
            if t.offset - data_offset != expected:
                self.fail(f"tensor '{t.name}' has offset {t.offset - data_offset}, expected {expected}: llama.cpp "
                          "reads each tensor's data right after the previous one's, padded to general.alignment",
                          t.offset, t.name, cls=TensorDataError)
            if t.n_bytes is None:        # (an unknown type: its size, and so the next offset, is not known)
                break
            expected += -(-t.n_bytes // alignment) * alignment
        return tuple(out)


def open_gguf(path: str | os.PathLike[str], *, name: str | None = None, like: GGUFFile | None = None) -> GGUFFile:
    """Open a GGUF file: map it, walk and validate the whole header, read no tensor data.

    Args:
        path: the file.
        name: what errors and :attr:`GGUFFile.path` call the file (default ``path``; e.g. the URL a
            downloaded copy came from).
        like: an open GGUF whose string arrays this file probably repeats (a drafter carries its target's
            262144-token vocabulary): an array of the same key and length whose bytes equal ``like``'s is
            not walked again (a byte comparison instead of 780k length reads); any difference walks it.

    Returns:
        A :class:`GGUFFile`; its arrays and tensor data are read lazily from the memory map.

    Raises:
        GGUFFormatError: bad magic, truncation, impossible counts or lengths, unknown value types, bad
            ``general.alignment``, duplicate keys or tensor names, zero-sized or oversized dimensions,
            invalid UTF-8 in keys or tensor names; and what llama.cpp's GGUF parser refuses
            (ggml/src/gguf.cpp), worded as it words it: an empty key ("key 3 is empty"), a string longer
            than 1 GiB, a tensor name of 64 bytes or more ("tensor name 5 is too long: 70 >= 64").
        UnsupportedFileError: big-endian files, GGUF versions other than 2 and 3.
        TensorDataError: tensor data misaligned, outside the file, overlapping another tensor, or not packed in
            the tensor table's order (a gap, or tensors out of order: llama.cpp's "tensor 'X' has offset A,
            expected B").
        OSError: the file cannot be opened.
    """
    p = os.fspath(path)
    require_regular_file(p, GGUFFormatError)
    with open(p, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            mm: mmap.mmap | bytes = b""
        else:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    src = _Source(p if name is None else name, mm, size)
    try:
        return _Parser(src, like).parse()
    except Exception:
        if isinstance(mm, mmap.mmap):
            try:
                mm.close()
            except BufferError:
                pass
        raise


def parse_header(name: str, head: bytes, size: int, reader: ByteReader) -> GGUFFile:
    """Walk a GGUF header from its first ``len(head)`` bytes (the byte-source seam; the read strategy
    that calls it is :func:`mtpscope.inspector.remote.open_gguf_reader`).

    The walk is :func:`open_gguf`'s (same checks, same records), run on the bytes present; tensor data is
    read later through ``reader.read(offset, n)``, only for the rows :meth:`GGUFFile.tensor_data` is
    asked for.

    Args:
        name: what errors and ``.path`` call the file (a URL).
        head: bytes ``[0, len(head))`` of the file.
        size: the file's size in bytes.
        reader: where tensor rows come from.

    Returns:
        A :class:`GGUFFile` whose metadata and tensor-info records are in memory.

    Raises:
        NeedMoreBytes: ``head`` ends before the header does; it says where the header must end
            (``needed_end``) and probably ends (``estimated_end``), and what was read so far.
        GGUFFormatError / UnsupportedFileError / TensorDataError: as :func:`open_gguf`.
    """
    return _Parser(_Source(name, bytes(head), size, avail=len(head), reader=reader)).parse()
