"""One model from many files: ``NAME-00001-of-0000N.gguf`` shards (llama.cpp's gguf-split / gguf-py's
``split_max_size``), local or remote, and the one opener the CLI and the app use.

A split model's first shard carries all the metadata plus ``split.no`` (u16, 0-based), ``split.count``
(u16) and ``split.tensors.count`` (i32, all shards together); the others carry the ``split.*`` keys and
their own tensors (llama.cpp ``src/llama-model-loader.cpp``; file names ``%s-%05d-of-%05d.gguf``,
``llama_split_path``). :class:`ShardedGGUF` reads them as one model: the first shard's metadata, every
shard's tensors in shard order, each tensor's data read from its own shard.

:func:`open_model` opens a path, an ``https://`` / ``hf://`` URL, or any shard of either.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mtpscope.errors import GGUFFormatError, LayoutError

if TYPE_CHECKING:
    from mtpscope.inspector.gguf import ByteReader, GGUFFile, GGUFLike, KeyValue, TensorInfo
    from mtpscope.inspector.remote import RemoteOptions

SHARD_RE = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"


def shard_name(prefix: str, no: int, count: int) -> str:
    """llama.cpp's shard name: ``PREFIX-{no:05d}-of-{count:05d}.gguf`` (``no`` 1-based)."""
    return f"{prefix}-{no:05d}-of-{count:05d}.gguf"


def shard_locations(location: str) -> list[str] | None:
    """All shard locations of the model ``location`` belongs to, by its name, or None when the name is
    not a shard's (``x-00002-of-00003.gguf`` -> ``[x-00001-of-00003.gguf, ..., x-00003-of-00003.gguf]``).
    Works on paths and URLs alike (a URL's query string is kept on every shard)."""
    base, q = (location.split("?", 1) + [""])[:2] if "://" in location else (location, "")
    m = SHARD_RE.match(base)
    if not m:
        return None
    count = int(m.group("count"))
    if count < 1 or int(m.group("no")) < 1 or int(m.group("no")) > count:
        return None
    return [shard_name(m.group("prefix"), i, count) + (f"?{q}" if q else "") for i in range(1, count + 1)]


@dataclass(frozen=True, eq=False)
class ShardedGGUF:
    """A split model read as one (a :class:`mtpscope.inspector.gguf.GGUFLike`, as a single file is).

    Attributes:
        path: the first shard's path or URL.
        shards: the open shards in order.
        file_size: the shards' sizes added up.
        version / alignment / data_offset / header_end: the first shard's.
        kv: the first shard's metadata (``split.*`` keys included).
        tensors: every shard's tensor-info records in shard order (``offset`` is within its shard).
    """

    path: str
    shards: tuple[GGUFFile, ...]
    file_size: int
    version: int
    alignment: int
    data_offset: int
    header_end: int
    kv: Mapping[str, KeyValue]
    tensors: tuple[TensorInfo, ...]
    _owner: Mapping[str, int] = field(repr=False)

    def __repr__(self) -> str:
        return (f"ShardedGGUF(path={self.path!r}, shards={len(self.shards)}, architecture={self.architecture!r}, "
                f"n_kv={len(self.kv)}, n_tensors={len(self.tensors)})")

    def get(self, key: str, default: Any = None) -> Any:
        """The decoded value of ``key`` in the first shard, else ``default``."""
        kv = self.kv.get(key)
        return default if kv is None else kv.value

    @property
    def architecture(self) -> str | None:
        """``general.architecture`` of the first shard if it is a string, else None."""
        v = self.get("general.architecture")
        return v if isinstance(v, str) else None

    @property
    def reader(self) -> ByteReader | None:
        """The first shard's byte reader (None when local)."""
        return self.shards[0].reader

    def shard_of(self, name: str) -> int:
        """0-based index of the shard holding tensor ``name``.

        Raises:
            LayoutError: no such tensor.
        """
        i = self._owner.get(name)
        if i is None:
            raise LayoutError("no such tensor", path=self.path, key=name)
        return i

    def tensor(self, name: str) -> TensorInfo:
        """The record of tensor ``name`` (its ``offset`` is within its shard); unknown name -> LayoutError."""
        return self.shards[self.shard_of(name)].tensor(name)

    def tensor_data(self, name: str, rows: slice | int | None = None, dequantize: bool = True) -> np.ndarray:
        """As :meth:`inspector.gguf.GGUFFile.tensor_data`, read from the shard that holds ``name``."""
        return self.shards[self.shard_of(name)].tensor_data(name, rows=rows, dequantize=dequantize)

    def close(self) -> None:
        for s in self.shards:
            s.close()

    def __enter__(self) -> ShardedGGUF:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _split_int(f: GGUFLike, key: str) -> int | None:
    v = f.get(key)
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def combine(shards: list[GGUFFile]) -> ShardedGGUF:
    """Check open shards against each other and combine them (see the module docstring).

    Raises:
        GGUFFormatError: a shard whose ``split.no`` / ``split.count`` does not fit its place, a tensor in
            two shards, or a tensor total other than ``split.tensors.count``.
    """
    first = shards[0]
    count = len(shards)
    for i, s in enumerate(shards):
        no, cnt = _split_int(s, SPLIT_NO), _split_int(s, SPLIT_COUNT)
        if cnt != count:
            raise GGUFFormatError("shard count differs from the file names", path=s.path, key=SPLIT_COUNT,
                                  expected=count, actual=cnt)
        if no != i:
            raise GGUFFormatError("shard in the wrong place", path=s.path, key=SPLIT_NO, expected=i, actual=no)
    owner: dict[str, int] = {}
    tensors = []
    for i, s in enumerate(shards):
        for t in s.tensors:
            if t.name in owner:
                raise GGUFFormatError("tensor in two shards", path=s.path, offset=t.info_offset, key=t.name,
                                      expected="each tensor in one shard", actual=f"also in {shards[owner[t.name]].path}")
            owner[t.name] = i
            tensors.append(t)
    total = _split_int(first, SPLIT_TENSORS)
    if total is not None and total != len(tensors):
        raise GGUFFormatError("the shards do not hold split.tensors.count tensors", path=first.path,
                              key=SPLIT_TENSORS, expected=total, actual=len(tensors))
    return ShardedGGUF(first.path, tuple(shards), sum(s.file_size for s in shards), first.version,
                       first.alignment, first.data_offset, first.header_end, first.kv, tuple(tensors), owner)


def _open_one(location: str, remote: RemoteOptions | None) -> GGUFFile:
    from mtpscope.inspector.gguf import open_gguf
    from mtpscope.inspector.remote import is_remote, open_remote

    if is_remote(location):
        return open_remote(location, remote)
    return open_gguf(location)


def open_model(location: str | os.PathLike[str], remote: RemoteOptions | None = None) -> GGUFLike:
    """Open a GGUF model: a local path, an ``https://`` / ``hf://`` URL, or any shard of a split model.

    A file named like a shard whose ``split.count`` is more than 1 is opened with all its siblings (same
    folder or URL prefix) and returned as one :class:`ShardedGGUF`; anything else as the
    :class:`inspector.gguf.GGUFFile` of that file. Only headers are read.

    Args:
        location: path or URL.
        remote: :class:`inspector.remote.RemoteOptions` for URLs (None: the defaults).

    Returns:
        a :class:`mtpscope.inspector.gguf.GGUFLike`: the ``GGUFFile`` or the ``ShardedGGUF``
        (``.shards``: the files, one for a single file).

    Raises:
        GGUFFormatError: a shard is missing (naming it) or does not fit (see :func:`combine`), or the
            file says it is split but is not named like a shard.
        RemoteFileError, UnsupportedFileError, TensorDataError, OSError: as the readers raise them.
    """
    loc = os.fspath(location)
    names = shard_locations(loc)
    if names is None:
        f = _open_one(loc, remote)
        cnt = _split_int(f, SPLIT_COUNT)
        if cnt is not None and cnt > 1:
            f.close()
            raise GGUFFormatError("a shard of a split model whose name does not say which (llama.cpp finds the "
                                  "others by name)", path=f.path, key=SPLIT_COUNT,
                                  expected=f"a name like NAME-00001-of-{cnt:05d}.gguf", actual=Path(loc).name)
        return f
    opened: list[GGUFFile] = []
    try:
        first = _open_one(names[0], remote)
        opened.append(first)
        if (_split_int(first, SPLIT_COUNT) or 1) == 1 and len(names) == 1:
            return first
        for n in names[1:]:
            if "://" not in n and not os.path.exists(n):
                raise GGUFFormatError("a shard of the split model is missing", path=n,
                                      expected=f"{len(names)} shards next to {Path(names[0]).name}", actual="absent")
            opened.append(_open_one(n, remote))
        return combine(opened)
    except BaseException:
        for s in opened:
            s.close()
        raise
