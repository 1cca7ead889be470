"""A Hugging Face checkpoint folder: config.json plus the safetensors headers of every shard.

One job: :func:`read_checkpoint` -> :class:`HFCheckpoint` (headers only; data through
:func:`safetensors.read_tensors`). Sharded checkpoints are followed through ``model.safetensors.index.json``
(``{"weight_map": {name: file}}``); a shard is always a plain file name in the same folder.

May import: mtpscope.errors, inspector.paths, inspector.safetensors, inspector.hf_config.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtpscope.errors import HFCheckpointError
from mtpscope.inspector.hf_config import read_config, text_config
from mtpscope.inspector.paths import require_regular_file
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
        """``config["text_config"]`` when present (assistant configs nest it), else the config itself."""
        return text_config(self.config)


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
    index = d / INDEX_NAME
    tensors: dict[str, HFTensor] = {}
    if index.exists():
        require_regular_file(index, HFCheckpointError)
        try:
            obj = json.loads(index.read_text(encoding="utf-8"))
            wm = obj["weight_map"]
            if not isinstance(wm, dict):
                raise TypeError("weight_map is not an object")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, RecursionError) as e:
            raise HFCheckpointError(f"bad sharded index: {e!r}", path=index, key="weight_map") from e
        for name, fn in wm.items():
            # a shard is a plain file name in this folder: no other folder is ever read through an index
            if not isinstance(fn, str) or not fn or Path(fn).name != fn or fn in (".", ".."):
                raise HFCheckpointError("bad shard file name in the sharded index", path=index,
                                        key=f"weight_map.{name}", expected="a file name in the same folder",
                                        actual=repr(fn))
        files = sorted(set(wm.values()))
        headers = {}
        for fn in files:
            fp = d / fn
            if not fp.exists():
                raise HFCheckpointError("shard named by the index is missing", path=fp, key=fn)
            headers[fn] = read_safetensors_header(fp)
        for name, fn in wm.items():
            t = headers[fn].get(name)
            if t is None:
                raise HFCheckpointError("index names a tensor its shard does not contain", path=d / fn, key=name)
            tensors[name] = t
        paths = tuple(str(d / fn) for fn in files)
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


__all__ = ["INDEX_NAME", "HFCheckpoint", "read_checkpoint"]
