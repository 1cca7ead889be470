"""Hugging Face config.json of a Gemma 4 checkpoint: the one reading of a Gemma 4 text config.

One job: what a ``config.json`` says. :func:`read_config` reads the file; :func:`text_hparams` reads a
Gemma 4 text config the way transformers 5.24 does (``per_layer_config`` overrides,
``num_global_key_value_heads`` only with ``attention_k_eq_v``, absent fields = ``Gemma4TextConfig``
defaults, ``stated`` = what the file says) into :class:`TextHParams`; the converter, :func:`hparams_from_config`
(a drafter's :class:`layouts.HParams` from its config, no GGUF) and the HF audit all use it.
:func:`text_config` picks the nested ``text_config``; :func:`partial_rotary_factor_full` the full layers'
proportional-RoPE factor.

May import: mtpscope.errors, inspector.paths, inspector.layouts (``hparams_from_config``), numpy (lazily).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtpscope.errors import HFCheckpointError
from mtpscope.inspector.layouts import GEMMA4_N_VOCAB
from mtpscope.inspector.paths import require_regular_file


def read_config(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """``config.json`` of a checkpoint folder ({} when absent).

    Raises:
        HFCheckpointError: the file exists but is not a JSON object.
    """
    p = Path(folder) / "config.json"
    if not p.exists():
        return {}
    require_regular_file(p, HFCheckpointError)
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise HFCheckpointError(f"config.json unreadable: {e}", path=p) from e
    if not isinstance(obj, dict):
        raise HFCheckpointError("config.json is not a JSON object", path=p, expected="object",
                                actual=type(obj).__name__)
    return obj



# The one reading of a Gemma 4 text config (a ``gemma4_text`` config, or the ``text_config`` of an
# assistant / multimodal config). Defaults are transformers 5.24's ``Gemma4TextConfig`` ones.

#: Gemma4TextConfig defaults (transformers 5.24 configuration_gemma4.py) for absent fields
TEXT_DEFAULTS: Mapping[str, Any] = {
    "vocab_size": GEMMA4_N_VOCAB, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 30,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "global_head_dim": 512,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "sliding_window": 512,
    "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262144, "num_kv_shared_layers": 0,
}
#: fields the converter cannot do without
CONVERT_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
#: fields a drafter layout (:func:`hparams_from_config`) cannot do without
LAYOUT_REQUIRED = ("num_hidden_layers", "layer_types", "head_dim", "num_key_value_heads", "num_attention_heads",
                   "intermediate_size", "hidden_size", "vocab_size")


@dataclass(frozen=True)
class TextHParams:
    """What a Gemma 4 text config says, per layer where it varies (see :func:`text_hparams`).

    Attributes:
        n_vocab / n_embd / n_ff / n_layer / n_head: ``vocab_size`` / ``hidden_size`` /
            ``intermediate_size`` / ``num_hidden_layers`` / ``num_attention_heads``.
        n_head_kv: KV heads of each layer, length n_layer.
        is_swa: per layer, True for ``sliding_attention``, length n_layer.
        head_dim_swa / head_dim_full: head dims of sliding / full-attention layers.
        sliding_window: tokens; eps: RMSNorm epsilon.
        rope_base_swa / rope_base_full: RoPE theta of sliding / full layers.
        partial_rotary_factor: share of the full layers' rotary pairs that rotate (proportional RoPE).
        k_eq_v: ``attention_k_eq_v``; context_length: ``max_position_embeddings``;
        softcap: ``final_logit_softcapping`` or None.
        n_embd_per_layer: ``hidden_size_per_layer_input`` (per-layer embeddings, PLE; 0 = none; transformers'
            default when absent is 256); n_vocab_per_layer: ``vocab_size_per_layer_input``.
        shared_kv_layers: ``num_kv_shared_layers`` (the last that many layers reuse an earlier layer's K/V).
        n_expert / n_expert_used / n_ff_exp: ``num_experts`` / ``top_k_experts`` / ``moe_intermediate_size``
            when ``enable_moe_block`` is true, else 0.
        double_wide_mlp: ``use_double_wide_mlp`` (the KV-shared layers' MLP is ``2 * n_ff`` wide).
        stated: names of the attributes above that config.json states (directly, through
            ``per_layer_config`` or, for n_head_kv, through ``num_key_value_heads`` + ``layer_types``);
            the others hold transformers' defaults.
    """

    n_vocab: int
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_head_kv: tuple[int, ...]
    is_swa: tuple[bool, ...]
    head_dim_swa: int
    head_dim_full: int
    sliding_window: int
    eps: float
    rope_base_swa: float
    rope_base_full: float
    partial_rotary_factor: float
    k_eq_v: bool
    context_length: int
    softcap: float | None
    n_embd_per_layer: int = 0
    n_vocab_per_layer: int = 0
    shared_kv_layers: int = 0
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    double_wide_mlp: bool = False
    stated: frozenset[str] = frozenset()

    @property
    def n_ff_layers(self) -> tuple[int, ...]:
        """The dense MLP width of each layer: ``2 * n_ff`` on KV-shared layers with ``use_double_wide_mlp``
        (transformers ``Gemma4TextMLP``), else ``n_ff``."""
        first_shared = self.n_layer - self.shared_kv_layers
        return tuple(2 * self.n_ff if self.double_wide_mlp and il >= first_shared else self.n_ff
                     for il in range(self.n_layer))

    def has_kv(self, il: int) -> bool:
        """Whether layer ``il`` computes its own K/V (the first ``n_layer - shared_kv_layers`` layers)."""
        return il < self.n_layer - self.shared_kv_layers

    @property
    def rope_freqs(self) -> Any:
        """``(head_dim_full/2,)`` float32 numpy: 1.0 for the rotated pairs, 1e30 for the rest (what
        llama.cpp's converter writes as ``rope_freqs.weight`` for proportional RoPE)."""
        import numpy as np

        half = self.head_dim_full // 2
        n_rot = int(self.partial_rotary_factor * self.head_dim_full // 2)
        return np.array([1.0] * n_rot + [1e30] * (half - n_rot), np.float32)


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """``config["text_config"]`` when present (assistant / multimodal configs nest it), else ``config``."""
    tc = config.get("text_config")
    return tc if isinstance(tc, Mapping) else config


def _rope_parameters(tc: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """``(sliding_attention, full_attention)`` sub-dicts of ``rope_parameters`` ({} where absent)."""
    rp = tc.get("rope_parameters")
    rp = rp if isinstance(rp, Mapping) else {}
    swa, full = rp.get("sliding_attention"), rp.get("full_attention")
    return (swa if isinstance(swa, Mapping) else {}), (full if isinstance(full, Mapping) else {})


def text_hparams(tc: Mapping[str, Any], where: str | os.PathLike[str] = "config.json", *,
                 require: tuple[str, ...] = CONVERT_REQUIRED) -> TextHParams:
    """Read a Gemma 4 text config dict the way transformers 5.24 does (the one reading in mtpscope).

    Full-attention layers: head dim ``global_head_dim`` (default 512); KV heads
    ``num_global_key_value_heads`` when ``attention_k_eq_v`` is true, else ``num_key_value_heads``
    (transformers ``Gemma4TextConfig.__post_init__``). A config saved by transformers 5.24 spells these as
    ``per_layer_config {"il": {"head_dim", "num_key_value_heads"}}`` instead; those overrides win
    (``head_dim`` on full layers, ``num_key_value_heads`` on any layer). Absent ``layer_types`` default
    to 5 sliding : 1 full; other absent fields to :data:`TEXT_DEFAULTS`.

    Args:
        tc: the text config (use :func:`text_config` on a nested config).
        where: the file named in errors.
        require: config fields that must be present (:data:`CONVERT_REQUIRED`, :data:`LAYOUT_REQUIRED`, ()).

    Raises:
        HFCheckpointError: a required field is missing, an integer field is not an integer, ``layer_types``
            has not ``num_hidden_layers`` entries, or a bad ``per_layer_config`` entry.
    """
    stated: set[str] = set()

    def num(k: str, attr: str | None, kind: type = int) -> Any:
        v = tc.get(k)
        if v is None:
            if k in require:
                raise HFCheckpointError("config.json field missing or not an integer", path=where, key=k,
                                        expected=kind.__name__, actual=None)
            return TEXT_DEFAULTS[k]
        ok = isinstance(v, int) if kind is int else isinstance(v, int | float)
        if not ok or isinstance(v, bool):
            raise HFCheckpointError(f"config.json field not {'an integer' if kind is int else 'a number'}",
                                    path=where, key=k, expected=kind.__name__, actual=v)
        if attr:
            stated.add(attr)
        return kind(v)

    n_layer = num("num_hidden_layers", "n_layer")
    types = tc.get("layer_types")
    if types is None and "layer_types" not in require:
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n_layer)]
    elif not isinstance(types, list) or len(types) != n_layer:
        raise HFCheckpointError("config.json layer_types missing or of the wrong length", path=where,
                                key="layer_types", expected=f"{n_layer} entries", actual=types)
    else:
        stated.add("is_swa")
    is_swa = tuple(t == "sliding_attention" for t in types)
    k_eq_v = bool(tc.get("attention_k_eq_v", False))
    n_kv = num("num_key_value_heads", None)
    n_kv_full = n_kv
    if tc.get("num_global_key_value_heads") is not None and k_eq_v:
        n_kv_full = num("num_global_key_value_heads", None)
    if "num_key_value_heads" in tc and "is_swa" in stated:
        stated.add("n_head_kv")
    head_dim_full = num("global_head_dim", "head_dim_full")
    kv_per_layer = [n_kv if s else n_kv_full for s in is_swa]
    plc = tc.get("per_layer_config") or {}
    if not isinstance(plc, Mapping):
        raise HFCheckpointError("per_layer_config is not an object", path=where, key="per_layer_config",
                                expected="{layer index: {head_dim, num_key_value_heads}}", actual=plc)
    for key, over in plc.items():
        try:
            il = int(key)
        except (TypeError, ValueError):
            il = -1
        if not 0 <= il < n_layer or not isinstance(over, Mapping):
            raise HFCheckpointError("bad per_layer_config entry", path=where, key=f"per_layer_config.{key}",
                                    expected=f"a layer index 0..{n_layer - 1} -> object", actual=over)
        for fld in ("num_key_value_heads", "head_dim"):
            v = over.get(fld)
            if fld in over and (not isinstance(v, int) or isinstance(v, bool)):
                raise HFCheckpointError("config.json field not an integer", path=where,
                                        key=f"per_layer_config.{key}.{fld}", expected="int", actual=v)
        if "num_key_value_heads" in over:
            kv_per_layer[il] = int(over["num_key_value_heads"])
        if "head_dim" in over and not is_swa[il]:
            head_dim_full = int(over["head_dim"])
            stated.add("head_dim_full")
    swa_rp, full_rp = _rope_parameters(tc)

    def rope(sub: Mapping[str, Any], k: str, default: float, attr: str) -> float:
        v = sub.get(k)
        if isinstance(v, int | float) and not isinstance(v, bool):
            stated.add(attr)
            return float(v)
        return default

    sc = tc.get("final_logit_softcapping")
    moe = bool(tc.get("enable_moe_block", False))
    n_expert = n_used = n_ff_exp = 0
    if moe:
        for k in ("num_experts", "top_k_experts", "moe_intermediate_size"):
            if not isinstance(v := tc.get(k), int) or isinstance(v, bool) or v <= 0:
                raise HFCheckpointError("enable_moe_block is true but a MoE field is missing or not a positive "
                                        "integer", path=where, key=k, expected="int > 0", actual=tc.get(k))
        n_expert, n_used, n_ff_exp = int(tc["num_experts"]), int(tc["top_k_experts"]), int(tc["moe_intermediate_size"])
        stated.add("moe")
    n_shared = num("num_kv_shared_layers", "shared_kv_layers")
    if not 0 <= n_shared <= n_layer:
        raise HFCheckpointError("num_kv_shared_layers out of range", path=where, key="num_kv_shared_layers",
                                expected=f"0..{n_layer}", actual=n_shared)
    return TextHParams(
        n_vocab=num("vocab_size", "n_vocab"), n_embd=num("hidden_size", "n_embd"),
        n_ff=num("intermediate_size", "n_ff"), n_layer=n_layer, n_head=num("num_attention_heads", "n_head"),
        n_head_kv=tuple(kv_per_layer), is_swa=is_swa, head_dim_swa=num("head_dim", "head_dim_swa"),
        head_dim_full=head_dim_full, sliding_window=num("sliding_window", "sliding_window"),
        eps=num("rms_norm_eps", "eps", float),
        rope_base_swa=rope(swa_rp, "rope_theta", 1e4, "rope_base_swa"),
        rope_base_full=rope(full_rp, "rope_theta", 1e6, "rope_base_full"),
        partial_rotary_factor=rope(full_rp, "partial_rotary_factor", 0.25, "partial_rotary_factor"),
        k_eq_v=k_eq_v, context_length=num("max_position_embeddings", "context_length"),
        softcap=float(sc) if isinstance(sc, int | float) and not isinstance(sc, bool) else None,
        n_embd_per_layer=num("hidden_size_per_layer_input", "n_embd_per_layer"),
        n_vocab_per_layer=num("vocab_size_per_layer_input", "n_vocab_per_layer"), shared_kv_layers=n_shared,
        n_expert=n_expert, n_expert_used=n_used, n_ff_exp=n_ff_exp,
        double_wide_mlp=bool(tc.get("use_double_wide_mlp", False)), stated=frozenset(stated))


def partial_rotary_factor_full(config: Mapping[str, Any]) -> float | None:
    """``rope_parameters.full_attention.partial_rotary_factor`` of the (text) config, or None."""
    v = _rope_parameters(text_config(config))[1].get("partial_rotary_factor")
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def hparams_from_config(config: Mapping[str, Any], dialect: str = "upstream") -> Any:
    """A drafter's :class:`inspector.layouts.HParams` from its HF ``config.json`` (no GGUF needed).

    Text fields through :func:`text_hparams` (``require=LAYOUT_REQUIRED``; so ``per_layer_config`` and the
    ``attention_k_eq_v`` gating of ``num_global_key_value_heads`` are honoured); from the top level
    (conversion/gemma.py): ``backbone_hidden_size`` -> n_embd_backbone, ``use_ordered_embeddings`` /
    ``num_centroids`` / ``centroid_intermediate_top_k``.

    Raises:
        HFCheckpointError: a field the layout needs is missing or not an integer.
    """
    from mtpscope.inspector import layouts as L

    hp = text_hparams(text_config(config), require=LAYOUT_REQUIRED)
    bb = config.get("backbone_hidden_size")
    if not isinstance(bb, int) or isinstance(bb, bool):
        raise HFCheckpointError("config.json field missing or not an integer", key="backbone_hidden_size",
                                expected="int", actual=bb)
    layers = tuple(L.LayerSpec(il, s, hp.n_head, hp.n_head_kv[il], hp.head_dim_swa if s else hp.head_dim_full,
                               hp.n_ff) for il, s in enumerate(hp.is_swa))
    ordered = bool(config.get("use_ordered_embeddings", False))
    return L.HParams(
        arch=L.ARCH_FORK if dialect == "fork" else L.ARCH_UPSTREAM, dialect=dialect, n_layer=hp.n_layer,
        n_embd=hp.n_embd, n_embd_backbone=bb, n_vocab=hp.n_vocab, n_vocab_source="config.json",
        head_dim_full=hp.head_dim_full, head_dim_swa=hp.head_dim_swa, layers=layers, use_ordered_embeddings=ordered,
        n_centroids=config.get("num_centroids") if ordered else None,
        centroid_top_k=config.get("centroid_intermediate_top_k") if ordered else None,
        sliding_window=hp.sliding_window if "sliding_window" in hp.stated else None)


__all__ = ["CONVERT_REQUIRED", "LAYOUT_REQUIRED", "TEXT_DEFAULTS", "TextHParams", "hparams_from_config",
           "partial_rotary_factor_full", "read_config", "text_config", "text_hparams"]
