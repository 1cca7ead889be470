"""Tiny GGUF specs shaped like the real drafters and targets: ``(arch, kv, tensors)`` for the ``write_gguf``
fixture (tests/conftest.py). Shapes are written in GGUF ``ne`` order and turned into numpy arrays of
``reversed(ne)``; the layouts follow the facts file (a 4-layer drafter has 49 tensors, 51 with the centroid
pair)."""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V
from gguf import quants

N_EMBD, N_BB, N_FF, N_HEAD, HD_SWA, HD_FULL, N_VOCAB, N_CENTROIDS = 32, 64, 64, 2, 32, 64, 256, 8
SWA = [True, True, True, False]  # three sliding layers then one full


def _t(name: str, ne: tuple[int, ...], qtype: Q, rng: np.random.Generator) -> tuple[Any, ...]:
    """A tensor of GGUF shape ``ne`` (numpy shape reversed) stored as ``qtype``."""
    shape = tuple(reversed(ne))
    if qtype == Q.I32:
        return (name, rng.integers(0, N_VOCAB, size=shape, dtype=np.int32))
    x = rng.standard_normal(shape).astype(np.float32)
    if qtype == Q.F32:
        return (name, x)
    if qtype == Q.F16:
        return (name, x.astype(np.float16))
    return (name, quants.quantize(x, qtype), qtype)


def drafter_spec(dialect: str, centroids: bool = True, seed: int = 0) -> tuple[str, list, list]:
    """(arch, kv, tensors) of a tiny 4-layer Gemma 4 assistant in the ``fork`` or ``upstream`` dialect."""
    rng = np.random.default_rng(seed)
    arch = "gemma4_assistant" if dialect == "fork" else "gemma4-assistant"
    pre = "mtp." if dialect == "fork" else "nextn."
    kv: list[tuple[Any, ...]] = [
        (f"{arch}.block_count", 4, V.UINT32), (f"{arch}.embedding_length", N_EMBD, V.UINT32),
        (f"{arch}.feed_forward_length", N_FF, V.UINT32), (f"{arch}.attention.head_count", N_HEAD, V.UINT32),
        (f"{arch}.attention.head_count_kv", 1, V.UINT32), (f"{arch}.attention.key_length", HD_FULL, V.UINT32),
        (f"{arch}.attention.key_length_swa", HD_SWA, V.UINT32),
        (f"{arch}.attention.sliding_window_pattern", SWA, V.ARRAY, V.BOOL),
        ("tokenizer.ggml.tokens", [f"t{i}" for i in range(N_VOCAB)], V.ARRAY, V.STRING),
    ]
    if dialect == "fork":
        kv += [(f"{arch}.n_embd_backbone", N_BB, V.UINT32), (f"{arch}.n_centroids", N_CENTROIDS, V.UINT32),
               (f"{arch}.use_ordered_embeddings", centroids, V.BOOL),
               (f"{arch}.requires_target_arch", "gemma4", V.STRING)]
    else:
        kv += [(f"{arch}.embedding_length_out", N_BB, V.UINT32), (f"{arch}.nextn_predict_layers", 4, V.UINT32)]
    tensors = [
        _t("token_embd.weight", (N_EMBD, N_VOCAB), Q.Q8_0, rng),
        _t("output_norm.weight", (N_EMBD,), Q.F32, rng),
        _t("rope_freqs.weight", (HD_FULL // 2,), Q.F32, rng),
        _t(pre + "pre_projection.weight", (2 * N_BB, N_EMBD), Q.Q8_0, rng),
        _t(pre + "post_projection.weight", (N_EMBD, N_BB), Q.BF16, rng),
    ]
    if dialect == "fork" and centroids:
        tensors += [_t("mtp.centroids.weight", (N_EMBD, N_CENTROIDS), Q.F16, rng),
                    _t("mtp.token_ordering.weight", (N_VOCAB,), Q.I32, rng)]
    for il in range(4):
        hd = HD_SWA if SWA[il] else HD_FULL
        b = f"blk.{il}."
        tensors += [
            _t(b + "attn_norm.weight", (N_EMBD,), Q.F32, rng),
            _t(b + "attn_q.weight", (N_EMBD, N_HEAD * hd), Q.Q8_0, rng),
            _t(b + "attn_q_norm.weight", (hd,), Q.F32, rng),
            _t(b + "attn_output.weight", (N_HEAD * hd, N_EMBD), Q.Q4_0, rng),
            _t(b + "post_attention_norm.weight", (N_EMBD,), Q.F32, rng),
            _t(b + "layer_output_scale.weight", (1,), Q.F32, rng),
            _t(b + "ffn_norm.weight", (N_EMBD,), Q.F32, rng),
            _t(b + "ffn_gate.weight", (N_EMBD, N_FF), Q.Q8_0, rng),
            _t(b + "ffn_up.weight", (N_EMBD, N_FF), Q.Q8_0, rng),
            _t(b + "ffn_down.weight", (N_FF, N_EMBD), Q.F16, rng),
            _t(b + "post_ffw_norm.weight", (N_EMBD,), Q.F32, rng),
        ]
    return arch, kv, tensors


def target_spec(seed: int = 1) -> tuple[str, list, list]:
    """(arch, kv, tensors) of a tiny 2-layer ``gemma4`` target with a MoE layer and per-layer embeddings."""
    rng = np.random.default_rng(seed)
    kv = [("gemma4.block_count", 2, V.UINT32), ("gemma4.embedding_length", N_BB, V.UINT32)]
    tensors = [_t("token_embd.weight", (N_BB, N_VOCAB), Q.Q8_0, rng),
               _t("per_layer_token_embd.weight", (64, N_VOCAB), Q.Q8_0, rng),
               _t("output_norm.weight", (N_BB,), Q.F32, rng)]
    for il in range(2):
        b = f"blk.{il}."
        tensors += [_t(b + n, ne, q, rng) for n, ne, q in (
            ("attn_norm.weight", (N_BB,), Q.F32), ("attn_q.weight", (N_BB, 64), Q.Q8_0),
            ("attn_k.weight", (N_BB, 32), Q.Q8_0), ("attn_v.weight", (N_BB, 32), Q.Q8_0),
            ("attn_q_norm.weight", (32,), Q.F32), ("attn_k_norm.weight", (32,), Q.F32),
            ("attn_output.weight", (64, N_BB), Q.Q8_0), ("post_attention_norm.weight", (N_BB,), Q.F32),
            ("ffn_norm.weight", (N_BB,), Q.F32), ("ffn_gate.weight", (N_BB, 64), Q.Q8_0),
            ("ffn_up.weight", (N_BB, 64), Q.Q8_0), ("ffn_down.weight", (64, N_BB), Q.Q8_0),
            ("post_ffw_norm.weight", (N_BB,), Q.F32), ("layer_output_scale.weight", (1,), Q.F32))]
    tensors += [_t("blk.1." + n, ne, q, rng) for n, ne, q in (
        ("ffn_gate_inp.weight", (N_BB, 4), Q.F32), ("ffn_gate_up_exps.weight", (N_BB, 64, 4), Q.Q8_0),
        ("ffn_down_exps.weight", (32, N_BB, 4), Q.Q8_0), ("pre_ffw_norm_2.weight", (N_BB,), Q.F32),
        ("inp_gate.weight", (N_BB, 32), Q.F32))]
    return "gemma4", kv, tensors
