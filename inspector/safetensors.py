"""The safetensors format: the one parser of mtpscope, memmapped tensor data, and a small writer.

A safetensors file starts with an 8-byte little-endian header length ``N`` followed by ``N`` bytes of JSON
``{name: {"dtype", "shape", "data_offsets"}, ..., "__metadata__": {...}}`` then the raw little-endian data
(the safetensors format spec). :func:`read_safetensors_header` reads only the header (:class:`HFTensor`
records); :func:`tensor_array` / :func:`read_tensors` / :func:`read_safetensors` return a tensor's data as
a numpy view over a memory map of the file, using that parsed header (BF16, which numpy lacks, widened to
float32: a copy); :func:`lazy_tensors` gives :class:`LazyTensor` records that read (and widen) a block of rows
at a time. :func:`write_safetensors` writes numpy arrays as one file (tiny test checkpoints, no torch).

Shapes: safetensors shapes are numpy order; the GGUF ``ne`` of a converted tensor is the reverse
(:attr:`HFTensor.ne`; a 0-d scalar becomes ``ne = (1,)``).

May import: numpy (lazily), mtpscope.errors, inspector.paths.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtpscope.errors import HFCheckpointError
from mtpscope.inspector.paths import require_regular_file

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors reference implementation's limit


@dataclass(frozen=True)
class HFTensor:
    """One tensor entry of a safetensors header.

    Attributes:
        name: checkpoint name (``model.layers.0.self_attn.q_proj.weight``).
        dtype: safetensors dtype string (``BF16``, ``F32``, ``I64``).
        shape: numpy order (outermost first).
        file: the ``.safetensors`` file holding it.
        data_offsets: (begin, end) byte offsets relative to the end of the header.
        data_start: absolute byte offset of the data section in ``file`` (8 + header length).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str
    data_offsets: tuple[int, int]
    data_start: int = 0

    @property
    def offset(self) -> int:
        """Absolute byte offset of this tensor's data in ``file``."""
        return self.data_start + self.data_offsets[0]

    @property
    def ne(self) -> tuple[int, ...]:
        """The GGUF ``ne`` a converter writes for this tensor (reversed shape; scalar -> (1,))."""
        return tuple(reversed(self.shape)) if self.shape else (1,)



#: safetensors dtypes of floating-point data a converter reads (weights, norms: F8_* it cannot read) and of integers
#: (token ids: the centroid head's ordering)
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
INTEGER_DTYPES = ("I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8")

_DTYPE_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "BOOL": 1, "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}


def read_safetensors_header(path: str | os.PathLike[str]) -> dict[str, HFTensor]:
    """Parse the JSON header of one ``.safetensors`` file (no tensor data is read).

    Returns:
        name -> :class:`HFTensor` in header order (``__metadata__`` skipped).

    Raises:
        HFCheckpointError: file too short, header length beyond the file or above 100 MiB, header not
            JSON / not an object, an entry without dtype / shape / data_offsets, or data offsets beyond the
            file or not matching dtype × shape. The error names the file, offset and tensor.
    """
    p = os.fspath(path)
    try:
        size = require_regular_file(p, HFCheckpointError)
        with open(p, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise HFCheckpointError("file too short: shorter than the 8-byte header length", path=p, offset=0,
                                        expected=">= 8 bytes", actual=size)
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > MAX_HEADER_BYTES:
                raise HFCheckpointError("header length beyond the file or too large", path=p, offset=0,
                                        expected=f"<= {min(size - 8, MAX_HEADER_BYTES)}", actual=n)
            raw = fh.read(n)
    except OSError as e:
        raise HFCheckpointError(f"cannot read: {e.strerror or e}", path=p) from e
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise HFCheckpointError(f"header is not valid JSON: {e}", path=p, offset=8) from e
    if not isinstance(obj, dict):
        raise HFCheckpointError("header is not a JSON object", path=p, offset=8, actual=type(obj).__name__)
    data_len = size - 8 - n
    out: dict[str, HFTensor] = {}
    for name, ent in obj.items():
        if name == "__metadata__":
            continue
        try:
            dtype = str(ent["dtype"])
            shape = tuple(int(x) for x in ent["shape"])
            b, end = (int(x) for x in ent["data_offsets"])
        except (KeyError, TypeError, ValueError) as ex:
            raise HFCheckpointError("tensor entry lacks dtype / shape / data_offsets", path=p, offset=8,
                                    key=name) from ex
        if not 0 <= b <= end <= data_len:
            raise HFCheckpointError("data offsets out of range (beyond the end of the file)", path=p,
                                    offset=8 + n + b, key=name,
                                    expected=f"0 <= begin <= end <= {data_len}", actual=[b, end])
        item = _DTYPE_SIZES.get(dtype)
        if item is not None:
            n_el = 1
            for d in shape:
                n_el *= d
            if n_el * item != end - b:
                raise HFCheckpointError("data length does not match dtype and shape", path=p, offset=8 + n + b,
                                        key=name, expected=n_el * item, actual=end - b)
        out[name] = HFTensor(name, dtype, shape, p, (b, end), 8 + n)
    return out


#: safetensors dtype -> numpy dtype of the stored bytes (BF16 read as raw little-endian uint16)
_NP_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
              "I8": "i1", "U8": "u1", "BOOL": "?", "U16": "<u2", "U32": "<u4", "U64": "<u8"}


def _file_map(path: str) -> Any:
    import numpy as np

    try:
        return np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise HFCheckpointError(f"cannot map the file: {e}", path=path) from e


def _view(t: HFTensor, mm: Any) -> Any:
    """``t``'s bytes in ``mm`` as a numpy view of shape ``t.shape`` in the stored dtype (BF16 as uint16), checked."""
    import numpy as np

    dt = _NP_DTYPES.get(t.dtype)
    if dt is None:
        raise HFCheckpointError("unsupported safetensors dtype", path=t.file, offset=t.offset, key=t.name,
                                expected="/".join(_NP_DTYPES), actual=t.dtype)
    b, e = t.data_offsets
    start, end = t.data_start + b, t.data_start + e
    n_bytes = int(np.prod(t.shape, dtype=np.int64)) * np.dtype(dt).itemsize
    if end > mm.shape[0] or end - start != n_bytes:
        raise HFCheckpointError("tensor data out of range or of the wrong size", path=t.file, offset=start,
                                key=t.name, expected=f"{n_bytes} bytes within {mm.shape[0]}",
                                actual=f"bytes {start}..{end}")
    return mm[start:end].view(dt).reshape(t.shape)


def _widen(t: HFTensor, a: Any) -> Any:
    """``a`` (values of ``t`` as stored) with BF16 widened to float32 (a copy), anything else as it is."""
    import numpy as np

    if t.dtype == "BF16":                      # bf16 is the top half of an IEEE float32: exact
        w = a.astype(np.uint32)
        w <<= 16                               # in place: one float32-sized copy, not two
        a = w.view(np.float32)
    return a


def _array(t: HFTensor, mm: Any) -> Any:
    return _widen(t, _view(t, mm))


def tensor_array(t: HFTensor) -> Any:
    """The data of one safetensors tensor, from its parsed header entry (:func:`read_safetensors_header`).

    Returns:
        np.ndarray of numpy shape ``t.shape``: a read-only view over a memory map of ``t.file``
        (little-endian F64/F32/F16/I64/I32/I16/I8/U8/U16/U32/U64/BOOL), or for BF16 a float32 copy
        (each value's 16 bits shifted up by 16, exact).

    Raises:
        HFCheckpointError: unsupported dtype (F8_*), data beyond the file or of the wrong length (names
            file, absolute offset, tensor, expected vs actual bytes), or the file cannot be mapped.
    """
    return _array(t, _file_map(t.file))


def read_tensors(tensors: Iterable[HFTensor]) -> dict[str, Any]:
    """:func:`tensor_array` of several tensors, one memory map per file: ``{name: np.ndarray}``.

    Raises:
        HFCheckpointError: as :func:`tensor_array`.
    """
    maps: dict[str, Any] = {}
    out: dict[str, Any] = {}
    for t in tensors:
        if t.file not in maps:
            maps[t.file] = _file_map(t.file)
        out[t.name] = _array(t, maps[t.file])
    return out


@dataclass(frozen=True)
class LazyTensor:
    """One safetensors tensor whose data is read only when asked, a block of outermost rows at a time (a conversion
    of a checkpoint of any size holds one block, not the checkpoint: :func:`lazy_tensors`).

    Attributes:
        header: its parsed header entry (name, safetensors dtype, numpy shape, file).
        stored: a read-only numpy view of its bytes over a memory map of the file, in the stored dtype (BF16 as
            raw uint16), shape ``header.shape``; reading it reads the file.
    """

    header: HFTensor
    stored: Any = field(repr=False)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.header.shape

    @property
    def is_float(self) -> bool:
        """Float values (F64 / F32 / F16 / BF16)."""
        return self.header.dtype in FLOAT_DTYPES

    def rows(self, start: int, stop: int) -> Any:
        """Outermost rows ``start:stop`` as :func:`tensor_array` gives them (BF16 widened to float32: a copy of
        those rows only; other dtypes a view). A 0-d tensor: its value, whatever the range."""
        a = self.stored if not self.header.shape else self.stored[start:stop]
        return _widen(self.header, a)

    def load(self) -> Any:
        """The whole tensor, as :func:`tensor_array` (for small tensors: a scale, an ordering)."""
        return _widen(self.header, self.stored)


def lazy_tensors(tensors: Iterable[HFTensor]) -> dict[str, LazyTensor]:
    """:class:`LazyTensor` of each of ``tensors`` (one memory map per file; nothing is read yet), by name.

    Raises:
        HFCheckpointError: as :func:`tensor_array` (unsupported dtype, data out of range, an unmappable file).
    """
    maps: dict[str, Any] = {}
    out: dict[str, LazyTensor] = {}
    for t in tensors:
        if t.file not in maps:
            maps[t.file] = _file_map(t.file)
        out[t.name] = LazyTensor(t, _view(t, maps[t.file]))
    return out


def read_safetensors(path: str | os.PathLike[str]) -> dict[str, Any]:
    """All tensors of one ``.safetensors`` file, ``{name: np.ndarray}`` in header order (memmap views;
    BF16 widened to float32).

    Raises:
        HFCheckpointError: from :func:`read_safetensors_header` and :func:`tensor_array`.
    """
    return read_tensors(read_safetensors_header(path).values())


def write_safetensors(path: str | os.PathLike[str], tensors: Mapping[str, Any]) -> Path:
    """Write ``tensors`` (numpy arrays: float32 / float16 / int64 / int32, numpy shapes) as one ``.safetensors``
    file (header padded to 8 bytes, data in the given order); returns ``path``.

    Raises:
        KeyError: an array of another dtype.
    """
    import numpy as np

    names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int64): "I64",
             np.dtype(np.int32): "I32"}
    header: dict[str, Any] = {}
    off = 0
    blobs = []
    for name, arr in tensors.items():
        a = np.ascontiguousarray(arr)
        b = a.tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hb = json.dumps(header).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    path = Path(path)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(hb)))
        fh.write(hb)
        for b in blobs:
            fh.write(b)
    return path


__all__ = ["FLOAT_DTYPES", "INTEGER_DTYPES", "MAX_HEADER_BYTES", "HFTensor", "LazyTensor", "lazy_tensors",
           "read_safetensors", "read_safetensors_header", "read_tensors", "tensor_array", "write_safetensors"]
