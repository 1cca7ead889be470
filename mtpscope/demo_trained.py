"""The trained demo pair, expanded from the committed compact checkpoints (numpy only, no torch).

``mtpscope/demo_data/`` holds what :mod:`mtpscope.demo_train` wrote: F16 weights over a compact
vocabulary (the kept ids, one shared row for the rare ids) and the id map. :func:`expand` turns them
into full-vocabulary Hugging Face checkpoints (262,144 rows: kept rows at their ids, a copy of the
shared row at every rare id, zero rows for the unused ids; the drafter's centroid head with its
permutation of all ids), which the converter turns into GGUFs.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.errors import MtpscopeError

N_VOCAB = 262144
DATA_DIR = Path(__file__).with_name("demo_data")
DATA_FILES = ("target.safetensors", "drafter.safetensors", "ids.safetensors", "target.json", "drafter.json",
              "prompts.json", "recipe.json")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(1 << 20):
            h.update(b)
    return h.hexdigest()


def read_recipe(src: str | os.PathLike[str] = DATA_DIR) -> dict[str, Any]:
    """``recipe.json`` of the compact checkpoints, after checking every listed file's sha256.

    Raises:
        MtpscopeError: a file is missing, unreadable, or differs from the hash the recipe recorded.
    """
    src = Path(src)
    try:
        rec = json.loads((src / "recipe.json").read_text())
    except (OSError, ValueError) as e:
        raise MtpscopeError(f"cannot read the demo recipe: {e}", path=src / "recipe.json") from e
    for name, want in rec.get("files", {}).items():
        p = src / name
        if not p.is_file() or _sha256(p) != want:
            raise MtpscopeError("demo checkpoint file missing or changed", path=p, expected=want)
    return rec


def read_prompts(src: str | os.PathLike[str] = DATA_DIR) -> list[dict[str, Any]]:
    """The categorised demo prompts: ``[{"prompt_id", "category", "name", "text", "ids", ...}]``
    (``ids``: real token ids, BOS first; they are the prompt, the text is for people)."""
    return json.loads((Path(src) / "prompts.json").read_text())["prompts"]


def expand_rows(compact: np.ndarray, ids: np.ndarray, rare: np.ndarray, n_vocab: int = N_VOCAB) -> np.ndarray:
    """Full-vocabulary rows from compact rows [n_kept + 1, n_embd]: row ``ids[i]`` = compact row i, every
    rare id = compact row ``n_kept``, all else 0. Returns ``[n_vocab, n_embd]`` in the input's dtype.

    Raises:
        MtpscopeError: the compact table does not have ``len(ids) + 1`` rows.
    """
    if compact.shape[0] != len(ids) + 1:
        raise MtpscopeError("compact embedding rows do not match the id map", key="model.embed_tokens.weight",
                            expected=len(ids) + 1, actual=compact.shape[0])
    full = np.zeros((n_vocab, compact.shape[1]), dtype=compact.dtype)
    full[ids] = compact[: len(ids)]
    if len(rare):
        full[rare] = compact[len(ids)]
    return full


def expand(out: str | os.PathLike[str], src: str | os.PathLike[str] = DATA_DIR) -> tuple[Path, Path]:
    """Write the full-vocabulary HF checkpoints ``out/target`` (``Gemma4ForCausalLM``) and ``out/drafter``
    (``Gemma4AssistantForCausalLM`` with its centroid head), F16 safetensors + ``config.json``.

    Returns:
        (target folder, drafter folder).

    Raises:
        MtpscopeError: the compact files are missing or changed (:func:`read_recipe`).
    """
    from mtpscope.inspector.safetensors import read_safetensors, write_safetensors  # noqa: PLC0415

    src, out = Path(src), Path(out)
    read_recipe(src)
    idmap = read_safetensors(src / "ids.safetensors")
    ids, rare = idmap["ids"].astype(np.int64), idmap["rare"].astype(np.int64)
    ordering = np.asarray(idmap["ordering"], dtype=np.int64)
    dirs = []
    for name in ("target", "drafter"):
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        t = {k: np.asarray(v) for k, v in read_safetensors(src / f"{name}.safetensors").items()}
        t["model.embed_tokens.weight"] = expand_rows(t["model.embed_tokens.weight"], ids, rare)
        if name == "drafter":
            t["masked_embedding.token_ordering"] = ordering
        write_safetensors(d / "model.safetensors", t)
        (d / "config.json").write_text((src / f"{name}.json").read_text())
        dirs.append(d)
    return dirs[0], dirs[1]


__all__ = ["DATA_DIR", "DATA_FILES", "N_VOCAB", "expand", "expand_rows", "read_prompts", "read_recipe"]
