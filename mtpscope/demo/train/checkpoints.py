"""The compact checkpoints and the stage cache.

:func:`save_compact` writes ``target.safetensors`` / ``drafter.safetensors`` (HF names, F16, compact rows),
``ids.safetensors`` (``ids`` I32: compact row -> real token id; ``rare`` I32; ``ordering`` I32, the centroid
head's permutation), ``target.json`` / ``drafter.json`` (HF configs for the full 262,144 vocabulary),
``prompts.json`` (the categorised demo prompts, text and ids) and ``recipe.json`` (everything the run used,
file hashes, wall times and the measured numbers); :func:`load_compact` reads them back for torch
(:class:`CompactPair`). :func:`staged` keeps a trained model under a hash of everything it depends on
(:func:`target_stage_key`, :func:`drafter_stage_key`), so a run that changes only later stages reuses it.

Imports: numpy, torch, safetensors (lazily), mtpscope.cache (``sha256_file``), mtpscope.errors,
mtpscope.demo.spec (``TRAINED_DATA``), mtpscope.demo.trained (``read_recipe``, lazily), :mod:`.recipe`,
:mod:`.compact`, :mod:`.models`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mtpscope.cache import sha256_file
from mtpscope.demo.spec import TRAINED_DATA
from mtpscope.demo.train.compact import CompactVocab
from mtpscope.demo.train.models import drafter_config, make_drafter, make_target, target_config
from mtpscope.demo.train.recipe import N_VOCAB, Recipe
from mtpscope.errors import MtpscopeError

DATA_DIR = TRAINED_DATA  # the one home of the compact checkpoints: mtpscope.demo.spec


def round_f16(model: Any) -> None:
    """Round every weight of ``model`` to F16 and back, in place (the values the checkpoints keep)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())


def _state(model: Any, skip: tuple[str, ...] = ("lm_head.weight",)) -> dict[str, torch.Tensor]:
    sd = model.state_dict()
    return {k: v.detach().to(torch.float16).contiguous() for k, v in sd.items()
            if k not in skip and not k.startswith("masked_embedding.")}


def save_compact(out: str | os.PathLike[str], tm: Any, dm: Any, vocab: CompactVocab, head: dict[str, Any],
                 recipe: Recipe, prompts: Sequence[dict[str, Any]], info: dict[str, Any]) -> dict[str, str]:
    """Write the compact checkpoints (module docstring, "Outputs") and ``recipe.json``; returns
    ``{file name: sha256}``."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # one metadata key: safetensors writes several in a random order (the file's bytes, not its tensors)
    save_file(_state(tm), out / "target.safetensors", metadata={"format": "pt"})
    ds = _state(dm)
    ds["masked_embedding.centroids.weight"] = torch.as_tensor(head["centroids"]).to(torch.float16)
    save_file(ds, out / "drafter.safetensors", metadata={"format": "pt"})
    save_file({"ids": torch.as_tensor(vocab.ids.astype(np.int32)), "rare": torch.as_tensor(vocab.rare.astype(np.int32)),
               "ordering": torch.as_tensor(head["ordering"])},
              out / "ids.safetensors", metadata={"format": "pt"})
    (out / "target.json").write_text(json.dumps(target_config(recipe.target, N_VOCAB), indent=1) + "\n")
    (out / "drafter.json").write_text(json.dumps(drafter_config(recipe.drafter, recipe.target, N_VOCAB,
                                                                centroids=True), indent=1) + "\n")
    (out / "prompts.json").write_text(json.dumps({"prompts": list(prompts)}, indent=1, ensure_ascii=False) + "\n")
    for n in ("target.safetensors", "drafter.safetensors", "ids.safetensors"):
        os.chmod(out / n, 0o644)   # safetensors writes 0600; these are committed package data
    files = {n: sha256_file(out / n) for n in ("target.safetensors", "drafter.safetensors", "ids.safetensors",
                                           "target.json", "drafter.json", "prompts.json")}
    rec = {"recipe": recipe.to_dict(), **info, "files": files}
    (out / "recipe.json").write_text(json.dumps(rec, indent=1, ensure_ascii=False) + "\n")
    return files


@dataclass(frozen=True, eq=False)
class CompactPair:
    """The committed pair loaded for torch: ``target`` / ``drafter`` (compact rows, fp32 from F16),
    ``vocab`` (:class:`CompactVocab`), ``ordering`` (np.int32[N_VOCAB]), ``centroids``
    (np.float32[n_centroids, n_embd]), ``prompts``, ``recipe`` (the parsed ``recipe.json``)."""

    target: Any
    drafter: Any
    vocab: CompactVocab
    ordering: np.ndarray
    centroids: np.ndarray
    prompts: list[dict[str, Any]]
    recipe: dict[str, Any]

    def head(self) -> dict[str, Any]:
        """The centroid head in compact rows for :func:`.evaluation.simulate_mtp` (unused ids as -1)."""
        C = self.centroids.shape[0]
        rows = self.vocab.rows(self.ordering, unused=-1).reshape(C, -1)
        top_k = int(self.recipe["recipe"]["drafter"]["top_k"])
        return {"centroids": torch.as_tensor(self.centroids), "ordering_rows": torch.as_tensor(rows), "top_k": top_k}


def load_compact(src: str | os.PathLike[str] = DATA_DIR) -> CompactPair:
    """Load the compact checkpoints written by :func:`save_compact`.

    Raises:
        MtpscopeError: a file is missing or its sha256 differs from ``recipe.json``.
    """
    from safetensors.torch import load_file

    from mtpscope.demo.trained import read_recipe

    src = Path(src)
    rec = read_recipe(src)      # every listed file checked against its sha256
    recipe = Recipe.from_dict(rec["recipe"])
    idmap = load_file(src / "ids.safetensors")
    vocab = CompactVocab(idmap["ids"].numpy().astype(np.int32), idmap["rare"].numpy().astype(np.int32))
    tm = make_target(target_config(recipe.target, vocab.n_rows))
    sd = {k: v.float() for k, v in load_file(src / "target.safetensors").items()}
    missing, unexpected = tm.load_state_dict(sd, strict=False)
    dsd = {k: v.float() for k, v in load_file(src / "drafter.safetensors").items()}
    cent = dsd.pop("masked_embedding.centroids.weight").numpy()
    dm = make_drafter(drafter_config(recipe.drafter, recipe.target, vocab.n_rows))
    dmiss, dunexp = dm.load_state_dict(dsd, strict=False)
    bad = [k for k in list(missing) + list(dmiss) if k != "lm_head.weight"] + list(unexpected) + list(dunexp)
    if bad:
        raise MtpscopeError("demo checkpoint does not match the model", path=src, key=bad[0])
    tm.tie_weights()
    dm.tie_weights()
    prompts = json.loads((src / "prompts.json").read_text())["prompts"]
    return CompactPair(tm.eval(), dm.eval(), vocab, idmap["ordering"].numpy().astype(np.int32), cent, prompts, rec)


def target_stage_key(recipe: Recipe, win: torch.Tensor) -> str:
    """The target's stage-cache key (sha256 hex): the recipe's target part, the token windows ``win``
    (compact rows, int64 bytes) and the torch version."""
    h = hashlib.sha256()
    d = recipe.to_dict()
    part = {k: d[k] for k in ("seed", "target", "seq_len", "target_steps", "target_batch", "target_lr", "threads")}
    h.update(json.dumps(part, sort_keys=True).encode())
    h.update(win.numpy().astype(np.int64).tobytes())
    h.update(torch.__version__.encode())
    return h.hexdigest()


def staged(model: Any, cached: Path | None, name: str, train_fn: Callable[[], dict[str, Any]],
            log: Callable[[str], None]) -> dict[str, Any]:
    """Train ``model`` with ``train_fn`` (returning its stats), or load the identical earlier run kept in
    ``cached`` (``<name>.safetensors`` without the tied ``lm_head``, ``stats.json``); keep a new run there."""
    from safetensors.torch import load_file, save_file

    if cached is not None and (cached / "stats.json").exists():
        model.load_state_dict({k: v.float() for k, v in load_file(cached / f"{name}.safetensors").items()},
                              strict=False)
        model.tie_weights()
        model.eval()
        st = json.loads((cached / "stats.json").read_text())
        log(f"{name}: reusing the identical earlier run {cached} (trained in {st['wall_s']} s)")
        return st
    st = train_fn()
    if cached is not None:
        cached.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"},
                  cached / f"{name}.safetensors")
        (cached / "stats.json").write_text(json.dumps(st))
    return st


def drafter_stage_key(target_key: str, recipe: Recipe) -> str:
    """The drafter's stage-cache key (sha256 hex): the target's key (:func:`target_stage_key`) and the
    recipe's drafter part."""
    d = recipe.to_dict()
    part = {k: d[k] for k in ("drafter", "drafter_steps", "drafter_batch", "drafter_lr", "n_draft")}
    return hashlib.sha256((target_key + json.dumps(part, sort_keys=True)).encode()).hexdigest()
