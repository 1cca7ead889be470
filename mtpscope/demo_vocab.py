"""The real Gemma 4 tokenizer, read once from ``ggml-vocab-gemma-4.gguf``, for the demo writers.

The demo models carry the **real** tokenizer: every ``tokenizer.*`` key of the real tokenizer GGUF,
copied verbatim (``vocab="full"``: 262144 tokens, 514906 merges), or a consistent subset for fast
tests (``vocab="subset"``: the first ``n`` real tokens with their scores and types, and only the
merges whose two parts and whose result all lie inside that set; llama.cpp loads and runs such a
file, see ``docs/reference/gemma4-assistant-facts.md`` section 5).

Only the key/value section of the tokenizer file is parsed (the file holds no tensors). This is a
small private reader for one known file, not the project's GGUF reader (``inspector/gguf.py``);
it takes about 0.3 s on the real file.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.errors import LayoutError

# GGUF metadata value types (GGUF specification, gguf.md "gguf_metadata_value_type").
GGUF_UINT8, GGUF_INT8, GGUF_UINT16, GGUF_INT16 = 0, 1, 2, 3
GGUF_UINT32, GGUF_INT32, GGUF_FLOAT32, GGUF_BOOL = 4, 5, 6, 7
GGUF_STRING, GGUF_ARRAY, GGUF_UINT64, GGUF_INT64, GGUF_FLOAT64 = 8, 9, 10, 11, 12

_SCALAR_FMT = {GGUF_UINT8: "<B", GGUF_INT8: "<b", GGUF_UINT16: "<H", GGUF_INT16: "<h",
               GGUF_UINT32: "<I", GGUF_INT32: "<i", GGUF_FLOAT32: "<f", GGUF_BOOL: "<?",
               GGUF_UINT64: "<Q", GGUF_INT64: "<q", GGUF_FLOAT64: "<d"}
_NUMPY = {GGUF_UINT8: np.uint8, GGUF_INT8: np.int8, GGUF_UINT16: np.uint16, GGUF_INT16: np.int16,
          GGUF_UINT32: np.uint32, GGUF_INT32: np.int32, GGUF_FLOAT32: np.float32, GGUF_BOOL: np.bool_,
          GGUF_UINT64: np.uint64, GGUF_INT64: np.int64, GGUF_FLOAT64: np.float64}

N_VOCAB_FULL = 262144
N_VOCAB_SUBSET = 4096


@dataclass(frozen=True)
class MetaValue:
    """One GGUF metadata value as the writers need it.

    ``type`` is the GGUF value type; for arrays ``sub_type`` is the element type and ``value`` a
    ``list`` (strings as ``bytes``) or a 1-D numpy array (numbers).
    """

    type: int
    value: Any
    sub_type: int | None = None


@dataclass(frozen=True, eq=False)
class DemoVocab:
    """A tokenizer to embed in demo models.

    Attributes:
        kind: ``"full"`` or ``"subset"``.
        n_vocab: number of tokens (262144 for the full vocabulary).
        tokens: token texts as raw bytes (SentencePiece style, ``"▁"`` marks a space), index = id.
        kv: ``tokenizer.*`` keys in the real file's order, each a :class:`MetaValue`.
        source: the tokenizer GGUF they were read from.
    """

    kind: str
    n_vocab: int
    tokens: tuple[bytes, ...]
    kv: tuple[tuple[str, MetaValue], ...]
    source: Path
    _ids: dict[bytes, int] = field(default_factory=dict, compare=False, repr=False, hash=False)

    def token_id(self, text: str) -> int | None:
        """Id of the token whose text is exactly ``text`` (e.g. ``"▁the"``), or None."""
        if not self._ids:
            self._ids.update({t: i for i, t in enumerate(self.tokens)})
        return self._ids.get(text.encode("utf-8"))


def read_kv(path: str | Path) -> list[tuple[str, MetaValue]]:
    """Read every metadata key/value of a little-endian GGUF v2/v3 file (no tensor data).

    Returns:
        ``[(key, MetaValue), ...]`` in file order. String values are ``str``; string arrays are lists
        of ``bytes``; numeric arrays are numpy arrays.

    Raises:
        LayoutError: not a GGUF file, or a value type this reader does not know (naming key and offset).
    """
    path = Path(path)
    data = path.read_bytes()
    if data[:4] != b"GGUF":
        raise LayoutError("not a GGUF file", path=path, offset=0, expected=b"GGUF", actual=data[:4])
    version, _n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    if version not in (2, 3):
        raise LayoutError("unsupported GGUF version", path=path, offset=4, expected="2 or 3", actual=version)
    off = 24
    out: list[tuple[str, MetaValue]] = []
    for _ in range(n_kv):
        start = off
        (klen,) = struct.unpack_from("<Q", data, off)
        off += 8
        key = data[off:off + klen].decode("utf-8")
        off += klen
        (vtype,) = struct.unpack_from("<I", data, off)
        off += 4
        if vtype == GGUF_STRING:
            (slen,) = struct.unpack_from("<Q", data, off)
            off += 8
            out.append((key, MetaValue(vtype, data[off:off + slen].decode("utf-8"))))
            off += slen
        elif vtype == GGUF_ARRAY:
            etype, n = struct.unpack_from("<IQ", data, off)
            off += 12
            if etype == GGUF_STRING:
                items: list[bytes] = []
                append = items.append
                unpack = struct.unpack_from
                for _i in range(n):
                    (slen,) = unpack("<Q", data, off)
                    off += 8
                    append(data[off:off + slen])
                    off += slen
                out.append((key, MetaValue(vtype, items, etype)))
            elif etype in _NUMPY:
                dt = np.dtype(_NUMPY[etype]).newbyteorder("<")
                arr = np.frombuffer(data, dtype=dt, count=n, offset=off).copy()
                off += n * dt.itemsize
                out.append((key, MetaValue(vtype, arr, etype)))
            else:
                raise LayoutError("unsupported array element type", path=path, offset=start, key=key,
                                  actual=etype)
        elif vtype in _SCALAR_FMT:
            fmt = _SCALAR_FMT[vtype]
            (val,) = struct.unpack_from(fmt, data, off)
            off += struct.calcsize(fmt)
            out.append((key, MetaValue(vtype, val)))
        else:
            raise LayoutError("unsupported metadata value type", path=path, offset=start, key=key, actual=vtype)
    return out


@functools.lru_cache(maxsize=4)
def load_vocab(kind: str = "full", n_subset: int = N_VOCAB_SUBSET, path: str | None = None) -> DemoVocab:
    """The real Gemma 4 tokenizer (``kind="full"``) or its first-``n_subset``-tokens subset.

    Args:
        kind: ``"full"`` (262144 tokens) or ``"subset"``.
        n_subset: size of the subset (only for ``kind="subset"``).
        path: tokenizer GGUF; default :func:`mtpscope.cache.vocab_path` (fetched once, sha256-pinned).

    Raises:
        ValueError: unknown ``kind`` or ``n_subset`` outside 16..262144.
        LayoutError: the tokenizer file lacks ``tokenizer.ggml.tokens``.
    """
    if kind not in ("full", "subset"):
        raise ValueError(f"vocab kind must be 'full' or 'subset', got {kind!r}")
    if path is None:
        from mtpscope.cache import vocab_path
        src = vocab_path()
    else:
        src = Path(path)
    kv = [(k, v) for k, v in read_kv(src) if k.startswith("tokenizer.")]
    kvd = dict(kv)
    if "tokenizer.ggml.tokens" not in kvd:
        raise LayoutError("tokenizer GGUF has no token list", path=src, key="tokenizer.ggml.tokens")
    tokens: list[bytes] = kvd["tokenizer.ggml.tokens"].value
    if kind == "subset":
        if not 16 <= n_subset <= len(tokens):
            raise ValueError(f"n_subset must be in 16..{len(tokens)}, got {n_subset}")
        keep = tokens[:n_subset]
        inside = set(keep)
        merges = []
        for m in kvd["tokenizer.ggml.merges"].value:
            left, sep, right = m.partition(b" ")
            if sep and left in inside and right in inside and left + right in inside:
                merges.append(m)
        new_kv: list[tuple[str, MetaValue]] = []
        for k, v in kv:
            if k == "tokenizer.ggml.tokens":
                v = MetaValue(v.type, list(keep), v.sub_type)
            elif k in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
                v = MetaValue(v.type, v.value[:n_subset].copy(), v.sub_type)
            elif k == "tokenizer.ggml.merges":
                v = MetaValue(v.type, merges, v.sub_type)
            new_kv.append((k, v))
        kv, tokens = new_kv, keep
    return DemoVocab(kind=kind, n_vocab=len(tokens), tokens=tuple(tokens), kv=tuple(kv), source=Path(src))
