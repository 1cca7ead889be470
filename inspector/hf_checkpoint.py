"""A Hugging Face checkpoint folder: config.json plus the safetensors headers of every shard.

One job: :func:`read_checkpoint` -> :class:`HFCheckpoint` (headers only; data through
:func:`safetensors.read_tensors`). Sharded checkpoints are followed through ``model.safetensors.index.json``
(``{"weight_map": {name: file}}``, :func:`read_index`); a shard is always a plain file name in the same folder
and must exist when the shards are read (:func:`index_shards`); ``estimate``, which plans from config.json
before any download, checks only the index's form (:func:`read_index`).

May import: mtpscope.errors, inspector.paths, inspector.safetensors, inspector.hf_config.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtpscope.errors import HFCheckpointError
from mtpscope.inspector.hf_config import got, read_config, read_json_object, text_config
from mtpscope.inspector.safetensors import HFTensor, read_safetensors_header

INDEX_NAME = "model.safetensors.index.json"


@dataclass(frozen=True)
class HFCheckpoint:
    """A Hugging Face checkpoint folder, headers only.

    Attributes:
        path: the folder.
        config: parsed ``config.json`` ({} when absent).
        tensors: name -> :class:`HFTensor`, over all shards.
        files: the safetensors files read.
    """

    path: str
    config: Mapping[str, Any]
    tensors: Mapping[str, HFTensor]
    files: tuple[str, ...]

    @property
    def text_config(self) -> Mapping[str, Any]:
        """``config["text_config"]`` when present (assistant configs nest it), else the config itself.

        Raises:
            HFCheckpointError: a ``text_config`` that is not an object.
        """
        return text_config(self.config, Path(self.path) / "config.json")


def read_index(folder: str | os.PathLike[str]) -> dict[str, str] | None:
    """The ``weight_map`` of the folder's ``model.safetensors.index.json`` (tensor name -> shard file name), or None
    when the folder has no index.

    Raises:
        HFCheckpointError: an unreadable index, one that is not a JSON object, a ``weight_map`` missing or not an
            object, or a shard that is not a plain file name of the same folder (no other folder is ever read
            through an index).
    """
    index = Path(folder) / INDEX_NAME
    if not index.exists():
        return None
    obj = read_json_object(index, "sharded index")
    wm = obj.get("weight_map")
    if not isinstance(wm, dict):
        raise HFCheckpointError("sharded index without a weight_map object", path=index, key="weight_map",
                                expected="object {tensor name: shard file}", actual=got(wm))
    for name, fn in wm.items():
        if not isinstance(fn, str) or not fn or Path(fn).name != fn or fn in (".", ".."):
            raise HFCheckpointError("bad shard file name in the sharded index", path=index,
                                    key=f"weight_map.{name}", expected="a file name in the same folder",
                                    actual=repr(fn))
    return wm


def index_shards(folder: str | os.PathLike[str]) -> tuple[Path, ...]:
    """The shard files the folder's sharded index names, each checked to exist (() without an index).

    Raises:
        HFCheckpointError: as :func:`read_index`, or a shard the index names is missing (naming that file).
    """
    wm = read_index(folder)
    if wm is None:
        return ()
    out = []
    for fn in sorted(set(wm.values())):
        fp = Path(folder) / fn
        if not fp.exists():
            raise HFCheckpointError(f"shard named by {INDEX_NAME} is missing", path=fp)
        out.append(fp)
    return tuple(out)


def read_checkpoint(folder: str | os.PathLike[str]) -> HFCheckpoint:
    """Read config.json and every safetensors header of a checkpoint folder (sharded or not).

    With ``model.safetensors.index.json`` the shards it names are read and every name of its
    ``weight_map`` must be in the shard it points to; otherwise every ``*.safetensors`` in the folder.

    Raises:
        HFCheckpointError: not a folder, no safetensors, a bad index / header, a tensor in two files, or an
            index entry missing from its shard.
    """
    d = Path(folder)
    if not d.is_dir():
        raise HFCheckpointError("not a folder" if d.exists() else "no such folder", path=d,
                                expected="a Hugging Face checkpoint folder", actual="a file" if d.exists() else "missing")
    config = read_config(d)
    tensors: dict[str, HFTensor] = {}
    wm = read_index(d)
    if wm is not None:
        headers = {fp.name: read_safetensors_header(fp) for fp in index_shards(d)}
        for name, fn in wm.items():
            t = headers[fn].get(name)
            if t is None:
                raise HFCheckpointError("index names a tensor its shard does not contain", path=d / fn, key=name)
            tensors[name] = t
        paths = tuple(str(d / fn) for fn in sorted(headers))
    else:
        paths = tuple(str(p) for p in sorted(d.glob("*.safetensors")))
        if not paths:
            raise HFCheckpointError("no *.safetensors files and no index", path=d)
        for fp in paths:
            for name, t in read_safetensors_header(fp).items():
                if name in tensors:
                    raise HFCheckpointError("tensor present in two files", path=fp, key=name,
                                            actual=[tensors[name].file, fp])
                tensors[name] = t
    return HFCheckpoint(str(d), config, tensors, paths)


__all__ = ["INDEX_NAME", "HFCheckpoint", "index_shards", "read_checkpoint", "read_index"]
