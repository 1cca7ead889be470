"""A published Hugging Face ``config.json`` as the GGUF mtpscope's converter would write from it: keys and tensor
table, no data. It lets ``estimate`` (and anything reading a GGUF's keys and tensor table) plan a published
model's memory before downloading it: ``mtpscope estimate --target sample_configs/gemma-4-E2B-it``.

One job: :func:`model_from_config` -> :class:`ConfigModel`, which quacks like a GGUF header for the readers that
only need ``architecture``, ``get(key)`` and ``tensors`` (:func:`inspector.layouts.read_hparams`,
:func:`inspector.estimate.estimate`). Its keys are exactly what the converter writes (the target's
:func:`inspector.convert_target.target_kv`, the drafter's :func:`inspector.convert.drafter_kv`, upstream dialect);
its tensors are the converter's layout (:func:`inspector.layouts.expected_target_layout` /
``expected_drafter_layout``: every required tensor, plus the optional ones a converter writes: the layer scales,
the MoE block with fused ``gate_up`` experts), matrices in ``weight_type`` (Q8_0 rows that are not a multiple of
32 fall back to F16, as ``convert --outtype q8_0`` does), vectors F32.

What it cannot know is said in :attr:`ConfigModel.notes`: fields the file does not state (read as transformers'
``Gemma4TextConfig`` defaults), and the K/V weights of KV-shared layers, which published checkpoints may carry
although transformers ignores them (llama.cpp's converter would keep them).

May import: mtpscope.errors, inspector.convert (``drafter_kv``), inspector.convert_common (``ordered``),
inspector.convert_target (``target_kv``, ``target_layout``), inspector.hf_checkpoint (``read_index``),
inspector.ggml_types, inspector.gguf (``TensorInfo``), inspector.gguf_write (``MetaValue``),
inspector.hf_config, inspector.layouts, inspector.paths.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtpscope.errors import HFCheckpointError, LayoutError
from mtpscope.inspector import layouts as L
from mtpscope.inspector.convert_common import ordered
from mtpscope.inspector.ggml_types import GGML_TYPES_BY_NAME
from mtpscope.inspector.gguf import TensorInfo
from mtpscope.inspector.hf_checkpoint import read_index
from mtpscope.inspector.hf_config import got, read_config, text_config, text_hparams

#: weight types a config model can be laid out in: ``convert --outtype`` names -> ggml type name
WEIGHT_TYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0"}
#: the optional target tensors a converter writes (stems after ``blk.{il}.``)
_WRITTEN_OPTIONAL = ("layer_output_scale.weight", "ffn_gate_inp.weight", "ffn_gate_inp.scale", "pre_ffw_norm_2.weight",
                     "post_ffw_norm_1.weight", "post_ffw_norm_2.weight", "ffn_gate_up_exps.weight",
                     "ffn_down_exps.weight", "ffn_down_exps.scale")
#: what a target's config must state to be laid out at all (the rest reads as transformers' defaults, named in
#: the notes)
CONFIG_REQUIRED = ("hidden_size", "num_hidden_layers")
_FIELDS_THAT_MATTER = ("intermediate_size", "num_attention_heads", "layer_types", "hidden_size_per_layer_input",
                       "num_kv_shared_layers", "max_position_embeddings")


class _VocabSize:
    """Stands in for ``tokenizer.ggml.tokens``: only its length (n_vocab) is known from a config."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


@dataclass(frozen=True)
class ConfigModel:
    """The GGUF header a converter would write from a ``config.json`` (no tensor data).

    Attributes:
        path: the config folder. architecture: ``gemma4`` or ``gemma4-assistant``. kv: GGUF key -> value
            (plain Python: numbers, strings, lists). meta: the same keys as writer values
            (:class:`inspector.gguf_write.MetaValue`, with their GGUF types), for writing a header. tensors: :class:`inspector.gguf.TensorInfo` records
            (``offset`` / ``info_offset`` 0: there is no file). weight_type: ``convert --outtype`` name.
        notes: what the config leaves open, in words.
    """

    path: Path
    architecture: str
    kv: Mapping[str, Any]
    tensors: tuple[TensorInfo, ...]
    weight_type: str
    notes: tuple[str, ...] = field(default=())
    meta: Mapping[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        """A key's value (``tokenizer.ggml.tokens``: an object whose ``len`` is n_vocab), or ``default``."""
        return self.kv.get(key, default)

    def tensor(self, name: str) -> TensorInfo:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)


def _plain(mv: Any) -> Any:
    v = mv.value
    return v.tolist() if hasattr(v, "tolist") else v


def _info(name: str, ne: tuple[int, ...], type_name: str) -> TensorInfo:
    t = GGML_TYPES_BY_NAME[type_name]
    n = 1
    for d in ne:
        n *= int(d)
    return TensorInfo(name=name, ggml_type=t.type_id, type_name=t.name, ne=tuple(int(d) for d in ne),
                      shape=tuple(int(d) for d in reversed(ne)), n_elements=n, n_bytes=t.n_bytes(n),
                      bits_per_weight=t.bits_per_weight, offset=0, info_offset=0)


def _tensors(layout: tuple[L.ExpectedTensor, ...], weight_type: str) -> tuple[TensorInfo, ...]:
    mat = WEIGHT_TYPES[weight_type]
    out = []
    for e in layout:
        if e.ggml_types is not None:  # vectors (F32) and the token ordering (I32)
            out.append(_info(e.name, e.ne, e.ggml_types[0]))
        else:
            out.append(_info(e.name, e.ne, "F16" if mat == "Q8_0" and e.ne[0] % 32 else mat))
    return tuple(out)


def model_from_config(folder: str | os.PathLike[str], *, weight_type: str = "bf16") -> ConfigModel:
    """The :class:`ConfigModel` of a Gemma 4 target (``gemma4`` / ``gemma4_text``) or assistant
    (``gemma4_assistant``, upstream dialect) ``config.json``.

    Args:
        folder: a folder with ``config.json`` (or the file itself).
        weight_type: the weights' type, a ``convert --outtype`` name (``bf16``: the published checkpoints'
            dtype, what ``convert_hf_to_gguf``'s ``auto`` keeps).

    Raises:
        HFCheckpointError: no / unreadable config.json, an unknown ``model_type``, a field missing, mistyped or out of
            range, or a malformed ``model.safetensors.index.json`` (its form only: the plan reads no shard, so a
            planning folder, ``hf download --include "*.json"``, need not hold them; ``convert`` and the audit,
            which read the shards, refuse one the index names and the folder lacks).
        LayoutError: an unknown weight type.
    """
    if weight_type not in WEIGHT_TYPES:
        raise LayoutError("unknown weight type for a model laid out from its config", key="weight type",
                          expected=" | ".join(WEIGHT_TYPES), actual=weight_type)
    p = Path(folder)
    d = p.parent if p.name == "config.json" else p
    cfg = read_config(d)
    where = d / "config.json"
    if not cfg:
        raise HFCheckpointError("no config.json", path=where)
    read_index(d)            # the index's form only: the shards it names are read (and required) by convert / audit
    mt = cfg.get("model_type")
    tc = text_config(cfg, where)
    notes = []
    absent = [k for k in _FIELDS_THAT_MATTER if k not in tc]
    if absent and mt != "gemma4_assistant":
        notes.append(f"{where}: not stated, read as transformers' Gemma4TextConfig defaults: {', '.join(absent)}")
    if mt == "gemma4_assistant":
        from mtpscope.inspector.convert import drafter_kv
        from mtpscope.inspector.hf_config import hparams_from_config

        hp = hparams_from_config(cfg, "upstream", where)
        hp_text = text_hparams(tc, where)
        arch = L.ARCH_UPSTREAM
        meta = dict(drafter_kv(cfg, hp_text, "upstream"))
        kv = {k: _plain(v) for k, v in meta.items()}
        layout = L.expected_drafter_layout(hp, "upstream")
        if cfg.get("use_ordered_embeddings"):
            notes.append(f"{where}: the centroid head is not in an upstream drafter (llama.cpp refuses it); "
                         "record --centroids reads it from a sidecar")
    elif mt in ("gemma4", "gemma4_text"):
        from mtpscope.inspector.convert_target import check_target_hparams, target_kv, target_layout

        hp_text = text_hparams(tc, where, require=CONFIG_REQUIRED)
        check_target_hparams(hp_text, os.fspath(where))
        arch = L.ARCH_TARGET
        meta = dict(target_kv(hp_text))
        kv = {k: _plain(v) for k, v in meta.items()}
        kv["tokenizer.ggml.tokens"] = _VocabSize(hp_text.n_vocab)
        hp, full_layout = target_layout(hp_text)
        layout = tuple(e for e in full_layout
                       if e.required or (e.layer is not None and e.name.split(".", 2)[2] in _WRITTEN_OPTIONAL
                                         and (hp.n_expert or e.component != "moe_experts")))
        if hp_text.shared_kv_layers:
            shared = [ly for ly in hp.layers if not hp.has_kv(ly.il)]
            extra = sum(2 * hp.n_embd * ly.n_head_kv * ly.head_dim * 2 + ly.head_dim * 4 for ly in shared)
            notes.append(f"{where}: published checkpoints may also carry K/V weights for the {len(shared)} KV-shared "
                         f"layers (transformers ignores them; llama.cpp's converter keeps them): about "
                         f"{extra / 2**20:,.0f} MiB more in bf16")
    else:
        raise HFCheckpointError("unsupported model_type", path=where, key="model_type",
                                expected="gemma4, gemma4_text or gemma4_assistant", actual=got(mt))
    kv["general.architecture"] = arch
    infos = {t.name: t for t in _tensors(layout, weight_type)}
    tensors = tuple(ordered(infos).values())  # the converter's order (llama.cpp's mapped ranges follow it)
    return ConfigModel(path=d, architecture=arch, kv=kv, tensors=tensors,
                       weight_type=weight_type, notes=tuple(notes), meta=meta)


def is_config_source(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` is a local folder with a ``config.json`` (or such a file): a model to lay out from its
    config rather than a GGUF."""
    p = Path(location)
    return (p.is_dir() and (p / "config.json").is_file()) or (p.name == "config.json" and p.is_file())


__all__ = ["WEIGHT_TYPES", "ConfigModel", "is_config_source", "model_from_config"]
