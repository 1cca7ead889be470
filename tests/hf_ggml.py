"""A Hugging Face Gemma 4 model with llama.cpp's CPU roundings: what the target's logits look like when the F16
steps of ggml's CPU backend are applied to HF's own computation.

:func:`emulate` makes a transformers model (torch, fp32) round where llama.cpp's CPU graph rounds
(tests/numerics.py lists the facts, llama-cpp-python 0.3.36's vendored ggml):

* the KV cache is F16: every K (after ``k_norm`` and RoPE) and V (after the weightless ``v_norm``) is rounded;
* ``KQ = mul_mat(K_f16, Q)`` converts Q to F16 (the F16 weight's ``vec_dot_type``); the softmax probabilities
  meet V in ``mul_mat(V_f16, P)`` and are rounded to F16 too; products and sums stay F32;
* every GELU (the dense MLP's and the experts' ``geglu``, the per-layer embeddings' ``gelu``) is looked up in
  ggml's F16 table: input rounded to F16, output the F16 rounding of the exact value
  (:func:`mtpscope.inspector.reference.gelu_tanh` ``mode="ggml-f16"``, the one home of that rule).

F32 weights stay F32 on both sides. What remains between the emulated model and llama.cpp is F32 evaluation
order, and the rare F16 rounding that those F32 differences push across a rounding midpoint ("flips"): see
:func:`tests.numerics.f16_effect_bound` for how the tests turn that into a tolerance.
"""

from __future__ import annotations

from typing import Any

import torch

from mtpscope.inspector.reference import gelu_tanh

NAME = "ggml_f16"


def _f16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float16).to(torch.float32)


def ggml_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                   **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention interface with llama.cpp's roundings (shapes: query ``(b, n_head, s, d)``, key /
    value ``(b, n_head_kv, n_kv, d)``; returns ``(b, s, n_head, d)``)."""
    q, k, v = (_f16(x).double() for x in (query, key, value))
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    sc = (q @ k.transpose(-1, -2)) * (1.0 if scaling is None else scaling)
    if attention_mask is not None:
        m = attention_mask[:, :, :, : k.shape[-2]]
        sc = sc.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else sc + m.double()
    p = _f16(torch.softmax(sc, dim=-1).float()).double()
    return (p @ v).float().transpose(1, 2).contiguous(), None


class GeluF16(torch.nn.Module):
    """ggml's CPU GELU (F16 lookup table) as a torch module."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(gelu_tanh(x.detach().numpy(), "ggml-f16")).to(x.dtype)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(NAME, ggml_attention)
    AttentionMaskInterface.register(NAME, eager_mask)  # the eager (additive, explicit) masks


def emulate(model: Any) -> Any:
    """``model`` (a transformers Gemma 4 model, fp32, eager) changed in place to round as llama.cpp's CPU backend
    does with an F16 KV cache and flash attention off; returns it."""
    _register()
    for m in model.modules():
        if hasattr(m, "act_fn"):
            m.act_fn = GeluF16()
    model.set_attn_implementation(NAME)
    return model


__all__ = ["GeluF16", "emulate", "ggml_attention"]
