"""HF → GGUF tensor names of Gemma 4 checkpoints: the drafter (both GGUF dialects) and the ``gemma4`` target.

One job: the name mapping, in one place for the converter and the HF audit. :func:`gguf_name` maps a drafter
(``Gemma4AssistantForCausalLM``) tensor in a dialect (and :func:`drop_reason` says why the upstream converter
drops one), :func:`drafter_hf_name` back from a fork name; :func:`target_gguf_name` maps a target
(``Gemma4ForCausalLM`` / the language model of ``Gemma4ForConditionalGeneration``) tensor, :func:`target_hf_name`
back; :func:`layer_gguf_name` is the per-layer part both share.

Mapping (docs/reference/gemma4-assistant-facts.md §2; llama.cpp's gguf-py ``tensor_mapping.py`` and
``conversion/gemma.py`` ``Gemma4Model``, llama-cpp-python 0.3.36; names as ``src/llama-arch.cpp`` spells them):

* every layer: ``input_layernorm`` → ``attn_norm``, ``post_attention_layernorm`` → ``post_attention_norm``,
  ``pre_feedforward_layernorm`` → ``ffn_norm``, ``post_feedforward_layernorm`` → ``post_ffw_norm``,
  ``self_attn.{q_proj,q_norm,o_proj}`` → ``attn_q``, ``attn_q_norm``, ``attn_output``,
  ``mlp.{gate,up,down}_proj`` → ``ffn_{gate,up,down}``, ``layer_scalar`` → ``layer_output_scale``;
* target layers only: ``self_attn.{k_proj,v_proj,k_norm}`` → ``attn_k``, ``attn_v``, ``attn_k_norm``;
  per-layer embeddings (PLE) ``per_layer_input_gate`` → ``inp_gate``, ``per_layer_projection`` → ``proj``,
  ``post_per_layer_input_norm`` → ``post_norm``; the MoE block ``router.proj`` → ``ffn_gate_inp.weight``,
  ``router.scale`` → ``ffn_gate_inp.scale``, ``router.per_expert_scale`` → ``ffn_down_exps.scale``,
  ``experts.gate_up_proj`` → ``ffn_gate_up_exps.weight`` (numpy ``(n_expert, 2·n_ff_exp, n_embd)`` = GGUF
  ``ne [n_embd, 2·n_ff_exp, n_expert]``, gate rows first as llama.cpp's views read them),
  ``experts.down_proj`` → ``ffn_down_exps.weight``, ``pre_feedforward_layernorm_2`` → ``pre_ffw_norm_2``,
  ``post_feedforward_layernorm_{1,2}`` → ``post_ffw_norm_{1,2}``;
* globals: ``embed_tokens`` → ``token_embd``, ``norm`` → ``output_norm``; target PLE ``embed_tokens_per_layer``
  → ``per_layer_token_embd``, ``per_layer_model_projection`` → ``per_layer_model_proj``,
  ``per_layer_projection_norm`` → ``per_layer_proj_norm``; drafter ``pre_projection`` / ``post_projection``
  → ``mtp.*`` (fork) or ``nextn.*`` (upstream); ``masked_embedding.centroids.weight`` /
  ``masked_embedding.token_ordering`` → ``mtp.centroids.weight`` / ``mtp.token_ordering.weight`` (I32) in the
  fork and **dropped** by the upstream converter.

May import: inspector.layouts (the drafter tensor names).
"""

from __future__ import annotations

import re

from mtpscope.inspector.layouts import FORK_CENTROIDS, FORK_ORDERING, POST_PROJECTION, PRE_PROJECTION

#: per-layer tensors every Gemma 4 block has (drafter and target)
_LAYER_MAP = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "layer_scalar": "layer_output_scale.weight",
    "layer_scalar.weight": "layer_output_scale.weight",
}
#: per-layer tensors only a target block has: own K/V, per-layer embeddings, the MoE block
_TARGET_LAYER_MAP = {
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "per_layer_input_gate.weight": "inp_gate.weight",
    "per_layer_projection.weight": "proj.weight",
    "post_per_layer_input_norm.weight": "post_norm.weight",
    "router.proj.weight": "ffn_gate_inp.weight",
    "router.scale": "ffn_gate_inp.scale",
    "router.per_expert_scale": "ffn_down_exps.scale",
    "experts.gate_up_proj": "ffn_gate_up_exps.weight",
    "experts.down_proj": "ffn_down_exps.weight",
    "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
    "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
    "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
}
#: the target's global tensors (names after the ``model.`` / ``model.language_model.`` prefix)
_TARGET_GLOBAL_MAP = {
    "embed_tokens.weight": "token_embd.weight",
    "norm.weight": "output_norm.weight",
    "embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
}
#: per-layer tensors of a drafter checkpoint its converter leaves out (the drafter reads the target's K/V cache: it has
#: no K/V of its own), as the name's end
DRAFTER_KV = ("self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.k_norm.weight")
#: target tensors a text-only converter leaves out (``lm_head`` is tied to ``embed_tokens`` in Gemma 4)
TARGET_SKIPPED = ("lm_head.weight",)
#: parts of multimodal checkpoints (``Gemma4ForConditionalGeneration``) outside the language model
MULTIMODAL = ("vision_tower", "audio_tower", "embed_vision", "embed_audio", "multi_modal_projector")
#: GGUF per-layer name stems of the MoE block and of the per-layer embeddings (``blk.{il}.<stem>``)
MOE_STEMS = ("ffn_gate_inp", "ffn_gate_up_exps", "ffn_down_exps", "pre_ffw_norm_2", "post_ffw_norm_1",
             "post_ffw_norm_2")
PLE_STEMS = ("inp_gate", "proj", "post_norm")

_GLOBAL_MAP: dict[str, dict[str, str | None]] = {
    "model.embed_tokens.weight": {"fork": "token_embd.weight", "upstream": "token_embd.weight"},
    "model.norm.weight": {"fork": "output_norm.weight", "upstream": "output_norm.weight"},
    "pre_projection.weight": dict(PRE_PROJECTION),
    "post_projection.weight": dict(POST_PROJECTION),
    "masked_embedding.centroids.weight": {"fork": FORK_CENTROIDS, "upstream": None},
    "masked_embedding.token_ordering": {"fork": FORK_ORDERING, "upstream": None},
    "lm_head.weight": {"fork": "output.weight", "upstream": None},
}
_DROP_REASON = {
    "masked_embedding.centroids.weight": "the upstream converter drops masked_embedding.* (the centroid head)",
    "masked_embedding.token_ordering": "the upstream converter drops masked_embedding.* (the centroid head)",
    "lm_head.weight": "the upstream drafter ties its LM head to token_embd (no output tensor)",
}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# GGUF tensors converters generate without an HF source
GENERATED = {"rope_freqs.weight": "generated by the converter from rope_parameters (proportional RoPE)"}


def layer_gguf_name(il: int, rest: str, *, target: bool) -> str | None:
    """``blk.{il}.<name>`` of the per-layer HF tensor ``rest`` (the part after ``layers.{il}.``); ``target``
    admits the target-only tensors (K/V, PLE, MoE). None when the name is not a known layer tensor."""
    g = _LAYER_MAP.get(rest)
    if g is None and target:
        g = _TARGET_LAYER_MAP.get(rest)
    return None if g is None else f"blk.{il}.{g}"


def target_gguf_name(hf_name: str) -> str | None:
    """GGUF name of a ``gemma4`` target tensor (prefix ``model.`` or ``model.language_model.``).

    Returns:
        the GGUF name; None for a tensor the text converter leaves out (``lm_head``, tied; the vision / audio
        towers of a multimodal checkpoint).

    Raises:
        KeyError: a name mtpscope cannot map.
    """
    if hf_name in TARGET_SKIPPED or any(part in hf_name for part in MULTIMODAL):
        return None
    short = hf_name
    for pre in ("model.language_model.", "model."):
        if short.startswith(pre):
            short = short[len(pre):]
            break
    if short in _TARGET_GLOBAL_MAP:
        return _TARGET_GLOBAL_MAP[short]
    if short.startswith("layers."):
        parts = short.split(".", 2)
        if len(parts) == 3 and parts[1].isdigit():
            g = layer_gguf_name(int(parts[1]), parts[2], target=True)
            if g is not None:
                return g
    raise KeyError(hf_name)


def gguf_name(hf_name: str, dialect: str) -> str | None:
    """GGUF name of an HF drafter checkpoint tensor in ``dialect`` (``fork`` / ``upstream``).

    Returns:
        the GGUF name; None when that dialect's converter drops the tensor (see :func:`drop_reason`).

    Raises:
        KeyError: a name mtpscope cannot map.
    """
    if dialect not in ("fork", "upstream"):
        raise ValueError(f"dialect must be 'fork' or 'upstream', got {dialect!r}")
    if hf_name in _GLOBAL_MAP:
        return _GLOBAL_MAP[hf_name][dialect]
    m = _LAYER_RE.match(hf_name)
    if m:
        g = layer_gguf_name(int(m.group(1)), m.group(2), target=False)
        if g is not None:
            return g
    raise KeyError(hf_name)


def drafter_hf_name(fork_name: str) -> str | None:
    """The HF checkpoint name of a drafter tensor given by its fork-dialect GGUF name (the inverse of
    :func:`gguf_name` in the fork dialect; ``layer_scalar`` for the layer scale); None for a name with no HF
    source (``rope_freqs``, generated)."""
    for hf, names in _GLOBAL_MAP.items():
        if names["fork"] == fork_name and hf != "lm_head.weight":
            return hf
    parts = fork_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit():
        for rest, g in _LAYER_MAP.items():
            if g == parts[2]:
                return f"model.layers.{parts[1]}.{rest}"
    return None


def target_hf_name(gguf: str, prefix: str = "model.") -> str | None:
    """The HF checkpoint name of a target tensor given by its GGUF name (the inverse of :func:`target_gguf_name`,
    under ``prefix``: ``model.`` or, in a multimodal checkpoint, ``model.language_model.``); None for a name with no
    HF source (``rope_freqs``, generated; ``output``, tied)."""
    for short, g in _TARGET_GLOBAL_MAP.items():
        if g == gguf:
            return prefix + short
    parts = gguf.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit():
        for rest, g in (*_LAYER_MAP.items(), *_TARGET_LAYER_MAP.items()):
            if g == parts[2]:
                return f"{prefix}layers.{parts[1]}.{rest}"
    return None


def drop_reason(hf_name: str) -> str:
    """Why the upstream converter drops ``hf_name`` ("" if it does not)."""
    return _DROP_REASON.get(hf_name, "")


__all__ = ["DRAFTER_KV", "GENERATED", "MOE_STEMS", "MULTIMODAL", "PLE_STEMS", "TARGET_SKIPPED", "drafter_hf_name", "drop_reason",
           "gguf_name", "layer_gguf_name", "target_gguf_name", "target_hf_name"]
