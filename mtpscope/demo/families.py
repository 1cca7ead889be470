"""Tiny checkpoints of every published Gemma 4 family with an MTP drafter, built with transformers' own
``Gemma4TextConfig`` / ``Gemma4ForCausalLM`` / ``Gemma4AssistantForCausalLM`` and converted to GGUF.

One job: :func:`build_family` (``name`` in :data:`FAMILIES`) -> :class:`FamilyPaths` under
``<cache>/families/<name>/``: the HF target and drafter (``save_pretrained``, F32 safetensors) and what
``mtpscope convert`` makes of them (target ``target.gguf``, upstream drafter ``drafter.gguf``, the centroid head
as a sidecar ``centroids.gguf`` where the family has one). Nothing of this goes into git.

Each family keeps the structure of its published config (``sample_configs/gemma-4-*-it[-assistant]``), scaled
down (:data:`SPECS`):

* **E2B** — per-layer embeddings (PLE), 4 sliding : 1 full layers, the last half of the layers KV-shared
  (published 20 of 35; here 5 of 10: donors layer 3 sliding / 4 full, as llama.cpp's ``n_kv - 2`` /
  ``n_kv - 1`` rule and HF's "last non-shared layer of the type" agree), a double-wide MLP on the shared
  layers, one KV head; drafter with a centroid head (``vocab / n_centroids`` = 128 tokens per centroid, as
  published: 262144 / 2048).
* **E4B** — PLE, 5 : 1 layers, 6 of 12 layers KV-shared (published 18 of 42), two KV heads, no double-wide
  MLP; centroid-head drafter.
* **26B-A4B** — the MoE block beside the dense MLP on every layer (8 experts, top 2; published 128, top 8),
  K = V on the full layers with fewer KV heads there (2 / 1; published 8 / 2); dense-head drafter with K = V.
* **31B** — dense, K = V, KV heads 2 / 1 (published 16 / 4); dense-head drafter with K = V.

Vocabulary: the first 4096 tokens of the real Gemma 4 tokenizer (the converter copies that consistent subset).
Weights: seeded numpy draws written over the freshly built models (matrices ~ N(0, 1/fan_in), norm weights near
1, layer scalars and expert scales in [0.5, 1.5]), so that no tensor holds a constant and a mapping mistake
changes the output. transformers' own ``from_pretrained`` loads every checkpoint with no missing and no
unexpected key (checked when building).

Rebuilds only what changed: ``stamp.json`` holds the hash of the spec (HF checkpoints) and of the converter's
sources (GGUFs); a current family costs a stat and a JSON read (no torch import).

May import: numpy, torch / transformers (lazily, to build the checkpoints), inspector (``convert``), mtpscope.cache,
mtpscope.errors.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mtpscope.errors import MtpscopeError

FAMILIES = ("e2b", "e4b", "26b-a4b", "31b")
#: tokens of the tiny models' vocabulary (the real tokenizer's first ones)
N_VOCAB = 4096
_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}}
#: bump when the way checkpoints are drawn changes (part of the stamp)
BUILD_VERSION = 1
#: modules whose source decides the GGUFs (part of the stamp): the converter and what it reads with
_CONVERT_SOURCES = tuple(f"mtpscope.inspector.{m}" for m in ("convert", "convert_common", "convert_target", "hf_names",
                                                              "hf_config", "tokenizer", "gguf_write", "safetensors"))


def _types(pattern: str) -> list[str]:
    return ["sliding_attention" if c == "s" else "full_attention" for c in pattern]


@dataclass(frozen=True)
class FamilySpec:
    """One tiny family: the ``Gemma4TextConfig`` fields of its target and drafter, and the drafter's head.

    Attributes:
        name: ``e2b`` / ``e4b`` / ``26b-a4b`` / ``31b``. published: the published target's folder name in
            ``sample_configs/``. seed: for the weights.
        target: ``Gemma4TextConfig`` keyword arguments of the target.
        drafter: ``Gemma4TextConfig`` keyword arguments of the drafter's ``text_config``.
        centroids: ``(num_centroids, centroid_intermediate_top_k)`` of a centroid-head drafter, or None (dense head).
    """

    name: str
    published: str
    seed: int
    target: dict[str, Any]
    drafter: dict[str, Any]
    centroids: tuple[int, int] | None = None


def _text(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any]  # JSON values of several types
    base = {"vocab_size": N_VOCAB, "vocab_size_per_layer_input": N_VOCAB, "rms_norm_eps": 1e-6,
            "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072, "rope_parameters": _ROPE,
            "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0, "attention_k_eq_v": False,
            "enable_moe_block": False, "use_double_wide_mlp": False, "tie_word_embeddings": True,
            "head_dim": 32, "global_head_dim": 64, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
    base.update(kw)
    base["num_hidden_layers"] = len(base["layer_types"])
    return base


def _drafter(**kw: Any) -> dict[str, Any]:
    d = _text(layer_types=_types("sssF"), final_logit_softcapping=None, vocab_size_per_layer_input=0, **kw)
    d["num_kv_shared_layers"] = d["num_hidden_layers"]  # the drafter reads the target's cache only
    return d


SPECS: dict[str, FamilySpec] = {
    "e2b": FamilySpec(
        name="e2b", published="gemma-4-E2B-it", seed=201,
        target=_text(hidden_size=64, intermediate_size=128, layer_types=_types("ssssF" * 2), num_attention_heads=2,
                     num_key_value_heads=1, sliding_window=16, final_logit_softcapping=30.0,
                     hidden_size_per_layer_input=16, num_kv_shared_layers=5, use_double_wide_mlp=True),
        drafter=_drafter(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                         sliding_window=16),
        centroids=(32, 4)),
    "e4b": FamilySpec(
        name="e4b", published="gemma-4-E4B-it", seed=202,
        target=_text(hidden_size=96, intermediate_size=192, layer_types=_types("sssssF" * 2), num_attention_heads=4,
                     num_key_value_heads=2, sliding_window=16, final_logit_softcapping=30.0,
                     hidden_size_per_layer_input=16, num_kv_shared_layers=6),
        drafter=_drafter(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=2,
                         sliding_window=16),
        centroids=(32, 4)),
    "26b-a4b": FamilySpec(
        name="26b-a4b", published="gemma-4-26B-A4B-it", seed=203,
        target=_text(hidden_size=64, intermediate_size=48, layer_types=_types("sssssF"), num_attention_heads=4,
                     num_key_value_heads=2, num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=32,
                     final_logit_softcapping=30.0, enable_moe_block=True, num_experts=8, top_k_experts=2,
                     moe_intermediate_size=32),
        drafter=_drafter(hidden_size=48, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                         num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=32)),
    "31b": FamilySpec(
        name="31b", published="gemma-4-31B-it", seed=204,
        target=_text(hidden_size=96, intermediate_size=256, layer_types=_types("sssssF"), num_attention_heads=4,
                     num_key_value_heads=2, num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=32,
                     final_logit_softcapping=30.0),
        drafter=_drafter(hidden_size=48, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                         num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=32)),
}


@dataclass(frozen=True)
class FamilyPaths:
    """Where one family's files are.

    Attributes:
        name: the family. root: ``<cache>/families/<name>``. hf_target / hf_drafter: HF checkpoint folders.
        target / drafter: the converted GGUFs (``gemma4``; upstream ``gemma4-assistant``, F32).
        sidecar: the centroid head GGUF (``gemma4-assistant-centroids``), None for a dense-head drafter.
        stamp: ``stamp.json``.
    """

    name: str
    root: Path
    hf_target: Path
    hf_drafter: Path
    target: Path
    drafter: Path
    sidecar: Path | None
    stamp: Path

    @classmethod
    def under(cls, root: Path, spec: FamilySpec) -> FamilyPaths:
        return cls(spec.name, root, root / "hf-target", root / "hf-drafter", root / "target.gguf",
                   root / "drafter.gguf", root / "centroids.gguf" if spec.centroids else None, root / "stamp.json")


def spec(name: str) -> FamilySpec:
    """The :class:`FamilySpec` of ``name``.

    Raises:
        MtpscopeError: an unknown family (the known ones named).
    """
    if name not in SPECS:
        raise MtpscopeError("unknown Gemma 4 family", key="family", expected=" | ".join(FAMILIES), actual=name)
    return SPECS[name]


def _hf_hash(s: FamilySpec) -> str:
    return hashlib.sha256(json.dumps({"spec": asdict(s), "version": BUILD_VERSION, "n_vocab": N_VOCAB},
                                     sort_keys=True).encode()).hexdigest()


def _gguf_hash(hf: str) -> str:
    from mtpscope.cache import VOCAB_SHA256
    from mtpscope.demo.spec import _module_source

    h = hashlib.sha256(hf.encode())
    h.update(VOCAB_SHA256.encode())
    for name in _CONVERT_SOURCES:
        h.update(name.encode())
        h.update(_module_source(name))
    return h.hexdigest()


def family_root(name: str, root: str | os.PathLike[str] | None = None) -> Path:
    """``<root or cache>/families/<name>``."""
    if root is None:
        from mtpscope.cache import cache_dir

        return cache_dir() / "families" / name
    return Path(root) / name


def build_family(name: str, root: str | os.PathLike[str] | None = None, *, force: bool = False) -> FamilyPaths:
    """Build (or find current) the tiny checkpoints of family ``name`` and their GGUFs.

    Args:
        name: one of :data:`FAMILIES`.
        root: folder holding the families (default ``<cache>/families``).
        force: rebuild everything.

    Returns:
        :class:`FamilyPaths` (all files present).

    Raises:
        MtpscopeError: unknown family, or torch / transformers >= 5.24 missing when the checkpoints must be built.
        HFCheckpointError / LayoutError: the conversion refused the checkpoint.
    """
    from mtpscope.demo.spec import _read_stamp, _write_stamp

    s = spec(name)
    paths = FamilyPaths.under(family_root(name, root), s)
    paths.root.mkdir(parents=True, exist_ok=True)
    stamp = _read_stamp(paths.stamp)
    hf = _hf_hash(s)
    hf_ok = (not force and stamp.get("hf") == hf and (paths.hf_target / "config.json").is_file()
             and (paths.hf_drafter / "config.json").is_file())
    if not hf_ok:
        _build_hf(s, paths)
        stamp = {"hf": hf}
        _write_stamp(paths.stamp, stamp)
    gg = _gguf_hash(hf)
    ggufs = [paths.target, paths.drafter] + ([paths.sidecar] if paths.sidecar else [])
    if force or stamp.get("gguf") != gg or not all(p.is_file() for p in ggufs):
        from mtpscope.inspector.convert import convert

        convert(paths.hf_target, paths.target)
        convert(paths.hf_drafter, paths.drafter, dialect="upstream", centroids_out=paths.sidecar)
        _write_stamp(paths.stamp, {"hf": hf, "gguf": gg})
    return paths


def _draw(name: str, shape: tuple[int, ...], rng: Any) -> Any:
    """Seeded values for one parameter (numpy float32, numpy ``shape``), by what the name says it is."""
    import numpy as np

    if name.endswith("layer_scalar") or name.endswith("per_expert_scale"):
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    if len(shape) == 1:  # norm weights and the router's input scale: near 1
        return (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
    if "embed_tokens" in name:
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)
    # matrices (out, in) and the experts' (n_expert, out, in): N(0, 1 / fan_in)
    return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)


def _fill(model: Any, seed: int) -> None:
    """Overwrite every parameter and persistent float buffer of ``model`` with :func:`_draw` values (sorted by
    name, one generator), and the token ordering of a centroid head with a seeded permutation."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    state = model.state_dict()
    with torch.no_grad():
        for name in sorted(state):
            t = state[name]
            if name == "lm_head.weight":
                continue  # tied to embed_tokens
            if name.endswith("token_ordering"):
                t.copy_(torch.from_numpy(rng.permutation(t.numel()).astype(np.int64)).reshape(t.shape))
            elif t.is_floating_point():
                t.copy_(torch.from_numpy(_draw(name, tuple(t.shape), rng)))


def _build_hf(s: FamilySpec, paths: FamilyPaths) -> None:
    try:
        import torch
        import transformers
        from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4ForCausalLM, Gemma4TextConfig
    except ImportError as e:
        raise MtpscopeError(f"building the tiny family checkpoints needs torch and transformers >= 5.24 "
                            f"(pip install -e '.[parity]'): {e}") from e
    if tuple(int(x) for x in transformers.__version__.split(".")[:2]) < (5, 24):
        raise MtpscopeError("transformers too old for Gemma4AssistantForCausalLM", key="transformers",
                            expected=">= 5.24", actual=transformers.__version__)
    torch.manual_seed(s.seed)
    tcfg = Gemma4TextConfig(**s.target)
    target = Gemma4ForCausalLM(tcfg).eval()
    _fill(target, s.seed)
    dcfg = Gemma4AssistantConfig(text_config=Gemma4TextConfig(**s.drafter), backbone_hidden_size=tcfg.hidden_size,
                                 use_ordered_embeddings=s.centroids is not None,
                                 num_centroids=s.centroids[0] if s.centroids else 2048,
                                 centroid_intermediate_top_k=s.centroids[1] if s.centroids else 32)
    drafter = Gemma4AssistantForCausalLM(dcfg).eval()
    _fill(drafter, s.seed + 1)
    saves: list[tuple[Any, Path, Any]] = [(target, paths.hf_target, Gemma4ForCausalLM),
                                          (drafter, paths.hf_drafter, Gemma4AssistantForCausalLM)]
    for model, dest, cls in saves:
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        _, info = cls.from_pretrained(tmp, dtype=torch.float32, output_loading_info=True)
        if info["missing_keys"] or info["unexpected_keys"]:
            raise MtpscopeError("transformers does not load the checkpoint it saved", path=tmp,
                                expected="no missing / unexpected keys", actual=info)
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)


__all__ = ["FAMILIES", "N_VOCAB", "SPECS", "FamilyPaths", "FamilySpec", "build_family", "family_root", "spec"]
