"""Hugging Face config.json of a Gemma 4 checkpoint: the one reading of a Gemma 4 text config.

One job: what a ``config.json`` says. :func:`read_config` reads the file; :func:`text_hparams` reads a
Gemma 4 text config the way transformers 5.24 does (``per_layer_config`` overrides,
``num_global_key_value_heads`` only with ``attention_k_eq_v``, absent fields = ``Gemma4TextConfig``
defaults, ``stated`` = what the file says) into :class:`TextHParams`; the converter, :func:`hparams_from_config`
(a drafter's :class:`layouts.HParams` from its config, no GGUF) and the HF audit all use it;
:func:`assistant_fields` reads an assistant config's own fields (backbone width, centroid head).
:func:`text_config` picks the nested ``text_config``; :func:`partial_rotary_factor_full` the full layers'
proportional-RoPE factor.

A field that is present is used as it is or refused with an :class:`~mtpscope.errors.HFCheckpointError` naming it
(:func:`config_int`, :func:`config_flag`; ``got`` says a string is a string: ``expected int, got str '64'``),
never replaced by a default: what is legal comes from transformers (the layer types, the per-layer-type
``rope_parameters``) and llama.cpp (sizes of at least 1 written as GGUF uint32 keys, at most ``LLAMA_MAX_LAYERS``
layers, a finite positive norm epsilon and RoPE base, a finite softcap: what ``verify`` asks of the keys they
become, by the one rule :func:`number_fault`, which :mod:`inspector.checks` imports).

May import: mtpscope.errors, inspector.paths, inspector.layouts (``hparams_from_config``), numpy (lazily).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtpscope.errors import HFCheckpointError
from mtpscope.inspector.layouts import GEMMA4_N_VOCAB, LLAMA_MAX_LAYERS
from mtpscope.inspector.paths import require_regular_file


def read_config(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """``config.json`` of a checkpoint folder ({} when absent).

    Raises:
        HFCheckpointError: the file exists but is not a JSON object.
    """
    p = Path(folder) / "config.json"
    if not p.exists():
        return {}
    return read_json_object(p, "config.json")


def read_json_object(p: Path, what: str) -> dict[str, Any]:
    """The JSON object in the regular file ``p`` (a checkpoint's config.json, its sharded index; ``what`` names it
    in the errors).

    Raises:
        HFCheckpointError: not a regular file, unreadable, not UTF-8 JSON, or not an object.
    """
    require_regular_file(p, HFCheckpointError)
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise HFCheckpointError(f"{what} unreadable: {e}", path=p) from e
    if not isinstance(obj, dict):
        raise HFCheckpointError(f"{what} is not a JSON object", path=p, expected="object", actual=type(obj).__name__)
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
#: the layer types of a Gemma 4 text config (transformers ``Gemma4TextConfig.layer_types``; llama.cpp knows a layer
#: only as sliding or not, ``attention.sliding_window_pattern``): any other name has no meaning to either
LAYER_TYPES = ("sliding_attention", "full_attention")
#: the largest value the converter can write: its integer fields become GGUF UINT32 keys
U32_MAX = 2**32 - 1
#: integer fields for which 0 is a value (0 = none); every other integer field is a size or a count, at least 1
ZERO_ALLOWED = frozenset({"hidden_size_per_layer_input", "vocab_size_per_layer_input", "num_kv_shared_layers"})
#: ``Gemma4AssistantConfig`` defaults (transformers 5.24) for the centroid head's absent fields
ASSISTANT_DEFAULTS: Mapping[str, Any] = {"num_centroids": 2048, "centroid_intermediate_top_k": 32}


def got(v: Any) -> str:
    """A config value as an error message's "got": its JSON-side type and value (``str '64'``, ``list [1]``), so
    that a string is never mistaken for the number it spells."""
    if v is None:
        return "nothing (null or absent)"
    r = repr(v)
    return f"{type(v).__name__} {r if len(r) <= 60 else r[:57] + '...'}"


def config_int(v: Any, key: str, where: str | os.PathLike[str] | None, *, lo: int = 1, hi: int = U32_MAX,
               hi_why: str = "a GGUF uint32") -> int:
    """``v`` as an integer field of config.json: a JSON integer (not a bool, a float or a string) in ``lo..hi``.

    Raises:
        HFCheckpointError: naming ``key``, with what was expected and what the file holds.
    """
    if not isinstance(v, int) or isinstance(v, bool):
        raise HFCheckpointError("config.json field not an integer", path=where, key=key, expected="int",
                                actual=got(v))
    if v < lo:
        raise HFCheckpointError("config.json field out of range", path=where, key=key,
                                expected=f"int >= {lo}" if lo != 1 else "int > 0", actual=v)
    if v > hi:
        raise HFCheckpointError("config.json field out of range", path=where, key=key,
                                expected=f"int <= {hi} ({hi_why})", actual=v)
    return v


def config_flag(config: Mapping[str, Any], key: str, where: str | os.PathLike[str] | None) -> bool:
    """A boolean field of config.json (absent or null: False).

    Raises:
        HFCheckpointError: a value that is not a JSON boolean (a string ``"false"`` would read as true).
    """
    v = config.get(key)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise HFCheckpointError("config.json field not a boolean", path=where, key=key, expected="true or false",
                                actual=got(v))
    return v


def number_fault(v: Any, *, zero_and_sign_ok: bool = False) -> str | None:
    """THE rule of a number llama.cpp uses as it is (a norm epsilon, a RoPE base: ``verify``'s number keys,
    :mod:`inspector.checks`; the config fields they are written from, here): a real number (not a bool, not a
    string), finite, and > 0 (``zero_and_sign_ok``: any finite number, as the target's logit softcap).

    Returns:
        None when ``v`` keeps the rule; else what is wrong: ``"not a number"`` or ``"out of range"``.
    """
    if not isinstance(v, int | float) or isinstance(v, bool):
        return "not a number"
    if not math.isfinite(v) or (v <= 0 and not zero_and_sign_ok):
        return "out of range"
    return None


def _positive_number(v: Any, key: str, where: str | os.PathLike[str] | None) -> float:
    fault = number_fault(v)
    if fault == "not a number":
        raise HFCheckpointError("config.json field not a number", path=where, key=key, expected="float",
                                actual=got(v))
    if fault is not None:
        raise HFCheckpointError("config.json field out of range", path=where, key=key,
                                expected="a finite number > 0", actual=v)
    return float(v)


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


def text_config(config: Mapping[str, Any], where: str | os.PathLike[str] | None = None) -> Mapping[str, Any]:
    """``config["text_config"]`` when present (assistant / multimodal configs nest it), else ``config``.

    Raises:
        HFCheckpointError: a ``text_config`` that is not an object (a list, a string, a number).
    """
    tc = config.get("text_config")
    if tc is None:
        return config
    if not isinstance(tc, Mapping):
        raise HFCheckpointError("text_config is not an object", path=where, key="text_config", expected="object",
                                actual=got(tc))
    return tc


def assistant_text_config(config: Mapping[str, Any], where: str | os.PathLike[str] | None = None) -> Mapping[str, Any]:
    """The ``text_config`` of a ``gemma4_assistant`` config, which must nest one.

    Raises:
        HFCheckpointError: no ``text_config``, or one that is not an object.
    """
    if config.get("text_config") is None:
        raise HFCheckpointError("missing text_config", path=where, key="text_config", expected="object",
                                actual="nothing")
    return text_config(config, where)


def _rope_parameters(tc: Mapping[str, Any], where: str | os.PathLike[str] | None = None
                     ) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """``(sliding_attention, full_attention)`` sub-dicts of ``rope_parameters`` ({} where absent).

    Gemma 4 keeps one RoPE per layer type (transformers 5.24 ``Gemma4TextConfig``: ``rope_parameters`` keyed by
    layer type); a flat ``{rope_theta, ...}`` says nothing about which layers it is for.

    Raises:
        HFCheckpointError: ``rope_parameters`` or one of its entries not an object, or a key that is not a layer
            type.
    """
    rp = tc.get("rope_parameters")
    if rp is None:
        return {}, {}
    if not isinstance(rp, Mapping):
        raise HFCheckpointError("rope_parameters is not an object", path=where, key="rope_parameters",
                                expected="object {sliding_attention: {...}, full_attention: {...}}", actual=got(rp))
    for k, sub in rp.items():
        if k not in LAYER_TYPES:
            raise HFCheckpointError("rope_parameters holds a key that is not a layer type", path=where,
                                    key=f"rope_parameters.{k}", expected=" or ".join(LAYER_TYPES), actual=repr(k))
        if sub is not None and not isinstance(sub, Mapping):
            raise HFCheckpointError("rope_parameters entry is not an object", path=where, key=f"rope_parameters.{k}",
                                    expected="object {rope_type, rope_theta, ...}", actual=got(sub))
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

    A field that is present is used as it is or refused, never replaced by a default: integers are JSON
    integers (:func:`config_int`: sizes and counts at least 1, :data:`ZERO_ALLOWED` at least 0, every one a GGUF
    uint32, ``num_hidden_layers`` at most llama.cpp's ``LLAMA_MAX_LAYERS``); ``rms_norm_eps`` and each
    ``rope_theta`` finite and > 0; ``partial_rotary_factor`` in 0..1 (the share of the full layers' pairs that
    rotate); ``final_logit_softcapping`` a finite number or null; the flags JSON booleans; ``layer_types`` the
    names of :data:`LAYER_TYPES`.

    Args:
        tc: the text config (use :func:`text_config` on a nested config).
        where: the file named in errors.
        require: config fields that must be present (:data:`CONVERT_REQUIRED`, :data:`LAYOUT_REQUIRED`, ()).

    Raises:
        HFCheckpointError: a required field is missing, a field of the wrong type or out of range,
            ``layer_types`` not ``num_hidden_layers`` known layer types, a bad ``rope_parameters`` or
            ``per_layer_config`` entry.
    """
    stated: set[str] = set()

    def num(k: str, attr: str | None, kind: type = int) -> Any:
        v = tc.get(k)
        if v is None:
            if k in require:
                raise HFCheckpointError("config.json field missing", path=where, key=k, expected=kind.__name__,
                                        actual="nothing")
            return TEXT_DEFAULTS[k]
        if kind is int:
            if k == "num_hidden_layers":
                v = config_int(v, k, where, hi=LLAMA_MAX_LAYERS, hi_why="llama.cpp's LLAMA_MAX_LAYERS")
            else:
                v = config_int(v, k, where, lo=0 if k in ZERO_ALLOWED else 1)
        else:
            v = _positive_number(v, k, where)
        if attr:
            stated.add(attr)
        return kind(v)

    n_layer = num("num_hidden_layers", "n_layer")
    types = tc.get("layer_types")
    if types is None and "layer_types" not in require:
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n_layer)]
    elif not isinstance(types, list):
        raise HFCheckpointError("config.json layer_types missing or not a list", path=where, key="layer_types",
                                expected=f"a list of {n_layer} layer types (num_hidden_layers)", actual=got(types))
    elif len(types) != n_layer:
        raise HFCheckpointError("layer_types has not one entry per layer", path=where, key="layer_types",
                                expected=f"{n_layer} entries (num_hidden_layers)", actual=f"{len(types)} entries")
    else:
        stated.add("is_swa")
    for i, t in enumerate(types):
        if t not in LAYER_TYPES:
            raise HFCheckpointError("unknown layer type", path=where, key=f"layer_types[{i}]",
                                    expected=" or ".join(LAYER_TYPES), actual=got(t))
    is_swa = tuple(t == "sliding_attention" for t in types)
    k_eq_v = config_flag(tc, "attention_k_eq_v", where)
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
                                expected="{layer index: {head_dim, num_key_value_heads}}", actual=got(plc))
    for key, over in plc.items():
        try:
            il = int(key)
        except (TypeError, ValueError):
            il = -1
        if not 0 <= il < n_layer or not isinstance(over, Mapping):
            raise HFCheckpointError("bad per_layer_config entry", path=where, key=f"per_layer_config.{key}",
                                    expected=f"a layer index 0..{n_layer - 1} -> object", actual=got(over))
        for fld in ("num_key_value_heads", "head_dim"):
            if fld in over:
                config_int(over[fld], f"per_layer_config.{key}.{fld}", where)
        if "num_key_value_heads" in over:
            kv_per_layer[il] = int(over["num_key_value_heads"])
        if "head_dim" in over and not is_swa[il]:
            head_dim_full = int(over["head_dim"])
            stated.add("head_dim_full")
    swa_rp, full_rp = _rope_parameters(tc, where)

    def rope(sub: Mapping[str, Any], lt: str, k: str, default: float, attr: str) -> float:
        v = sub.get(k)
        if v is None:
            return default
        key = f"rope_parameters.{lt}.{k}"
        if k == "rope_theta":
            v = _positive_number(v, key, where)
        elif not isinstance(v, int | float) or isinstance(v, bool):
            raise HFCheckpointError("config.json field not a number", path=where, key=key, expected="float",
                                    actual=got(v))
        elif not (math.isfinite(v) and 0 <= v <= 1):
            raise HFCheckpointError("config.json field out of range: the share of rotated pairs", path=where,
                                    key=key, expected="a number in 0..1", actual=v)
        stated.add(attr)
        return float(v)

    sc = tc.get("final_logit_softcapping")
    if sc is not None and number_fault(sc, zero_and_sign_ok=True) is not None:
        raise HFCheckpointError("config.json field not a finite number", path=where, key="final_logit_softcapping",
                                expected="a finite number or null", actual=got(sc))
    moe = config_flag(tc, "enable_moe_block", where)
    n_expert = n_used = n_ff_exp = 0
    if moe:
        for k in ("num_experts", "top_k_experts", "moe_intermediate_size"):
            if not isinstance(v := tc.get(k), int) or isinstance(v, bool) or v <= 0:
                raise HFCheckpointError("enable_moe_block is true but a MoE field is missing or not a positive "
                                        "integer", path=where, key=k, expected="int > 0", actual=got(tc.get(k)))
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
        rope_base_swa=rope(swa_rp, "sliding_attention", "rope_theta", 1e4, "rope_base_swa"),
        rope_base_full=rope(full_rp, "full_attention", "rope_theta", 1e6, "rope_base_full"),
        partial_rotary_factor=rope(full_rp, "full_attention", "partial_rotary_factor", 0.25, "partial_rotary_factor"),
        k_eq_v=k_eq_v, context_length=num("max_position_embeddings", "context_length"),
        softcap=float(sc) if sc is not None else None,
        n_embd_per_layer=num("hidden_size_per_layer_input", "n_embd_per_layer"),
        n_vocab_per_layer=num("vocab_size_per_layer_input", "n_vocab_per_layer"), shared_kv_layers=n_shared,
        n_expert=n_expert, n_expert_used=n_used, n_ff_exp=n_ff_exp,
        double_wide_mlp=config_flag(tc, "use_double_wide_mlp", where), stated=frozenset(stated))


def partial_rotary_factor_full(config: Mapping[str, Any]) -> float | None:
    """``rope_parameters.full_attention.partial_rotary_factor`` of the (text) config, or None."""
    v = _rope_parameters(text_config(config))[1].get("partial_rotary_factor")
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class AssistantFields:
    """The top-level fields of a ``gemma4_assistant`` config.json (see :func:`assistant_fields`).

    Attributes:
        n_embd_backbone: ``backbone_hidden_size`` (the target's width the projections map from and to).
        use_ordered_embeddings: whether the drafter has a centroid head.
        n_centroids / centroid_top_k: ``num_centroids`` / ``centroid_intermediate_top_k`` (checked only with a
            centroid head; :data:`ASSISTANT_DEFAULTS` when absent).
    """

    n_embd_backbone: int
    use_ordered_embeddings: bool
    n_centroids: int
    centroid_top_k: int


def assistant_fields(config: Mapping[str, Any], n_vocab: int,
                     where: str | os.PathLike[str] | None = "config.json") -> AssistantFields:
    """The one reading of an assistant config's own fields (conversion/gemma.py reads the same):
    ``backbone_hidden_size`` (required, an int > 0), ``use_ordered_embeddings`` (a boolean) and, with a centroid
    head, ``num_centroids`` (> 0, a divisor of ``vocab_size``: the ordering is ``num_centroids`` rows of
    ``vocab_size / num_centroids`` ids, facts §3) and ``centroid_intermediate_top_k`` (``1..num_centroids``: the
    centroids the head keeps).

    Raises:
        HFCheckpointError: a field missing, of the wrong type or out of range, naming it.
    """
    bb = config.get("backbone_hidden_size")
    if bb is None:
        raise HFCheckpointError("config.json field missing", path=where, key="backbone_hidden_size", expected="int",
                                actual="nothing")
    n_bb = config_int(bb, "backbone_hidden_size", where)
    ordered = config_flag(config, "use_ordered_embeddings", where)
    n_c = int(ASSISTANT_DEFAULTS["num_centroids"])
    top_k = int(ASSISTANT_DEFAULTS["centroid_intermediate_top_k"])
    if ordered:
        if config.get("num_centroids") is not None:
            n_c = config_int(config["num_centroids"], "num_centroids", where)
        if n_vocab % n_c:
            raise HFCheckpointError("vocab_size is not a multiple of num_centroids", path=where, key="num_centroids",
                                    expected=f"a divisor of vocab_size {n_vocab}", actual=n_c)
        if config.get("centroid_intermediate_top_k") is not None:
            top_k = config_int(config["centroid_intermediate_top_k"], "centroid_intermediate_top_k", where,
                               hi=n_c, hi_why="num_centroids")
        elif top_k > n_c:
            raise HFCheckpointError("config.json field missing: its default exceeds num_centroids", path=where,
                                    key="centroid_intermediate_top_k", expected=f"an int in 1..{n_c}",
                                    actual="nothing")
    return AssistantFields(n_bb, ordered, n_c, top_k)


def hparams_from_config(config: Mapping[str, Any], dialect: str = "upstream",
                        where: str | os.PathLike[str] | None = "config.json") -> Any:
    """A drafter's :class:`inspector.layouts.HParams` from its HF ``config.json`` (no GGUF needed).

    Text fields through :func:`text_hparams` (``require=LAYOUT_REQUIRED``; so ``per_layer_config`` and the
    ``attention_k_eq_v`` gating of ``num_global_key_value_heads`` are honoured) of the nested ``text_config``
    (:func:`assistant_text_config`); from the top level (conversion/gemma.py) through :func:`assistant_fields`:
    ``backbone_hidden_size`` -> n_embd_backbone, ``use_ordered_embeddings`` / ``num_centroids`` /
    ``centroid_intermediate_top_k``.

    Raises:
        HFCheckpointError: no ``text_config``, or a field the layout needs missing, mistyped or out of range.
    """
    from mtpscope.inspector import layouts as L

    hp = text_hparams(assistant_text_config(config, where), where or "config.json", require=LAYOUT_REQUIRED)
    a = assistant_fields(config, hp.n_vocab, where)
    layers = tuple(L.LayerSpec(il, s, hp.n_head, hp.n_head_kv[il], hp.head_dim_swa if s else hp.head_dim_full,
                               hp.n_ff) for il, s in enumerate(hp.is_swa))
    ordered = a.use_ordered_embeddings
    return L.HParams(
        arch=L.ARCH_FORK if dialect == "fork" else L.ARCH_UPSTREAM, dialect=dialect, n_layer=hp.n_layer,
        n_embd=hp.n_embd, n_embd_backbone=a.n_embd_backbone, n_vocab=hp.n_vocab, n_vocab_source="config.json",
        head_dim_full=hp.head_dim_full, head_dim_swa=hp.head_dim_swa, layers=layers, use_ordered_embeddings=ordered,
        n_centroids=a.n_centroids if ordered else None, centroid_top_k=a.centroid_top_k if ordered else None,
        sliding_window=hp.sliding_window if "sliding_window" in hp.stated else None)


__all__ = ["ASSISTANT_DEFAULTS", "CONVERT_REQUIRED", "LAYER_TYPES", "LAYOUT_REQUIRED", "TEXT_DEFAULTS", "U32_MAX",
           "ZERO_ALLOWED", "AssistantFields", "TextHParams", "assistant_fields", "assistant_text_config",
           "config_flag", "config_int", "got", "hparams_from_config", "number_fault", "partial_rotary_factor_full",
           "read_config", "text_config", "text_hparams"]
