"""A numpy reference implementation of one Gemma 4 assistant (MTP drafter) step.

This is an *independent* implementation of the drafter's forward pass, written from the math in
``docs/reference/gemma4-assistant-facts.md`` section 3, and cross-checked against the graph that
llama.cpp builds (``src/models/gemma4-assistant.cpp``, ``llama_model_gemma4_assistant::graph``) and
the target graph that fills the K/V cache the drafter reads (``src/models/gemma4.cpp``), plus the ggml
CPU kernels it uses (``ggml/src/ggml-cpu/ops.cpp`` RoPE, ``vec.h`` GELU). It runs from a GGUF's
weights in either dialect (fork ``gemma4_assistant`` / upstream ``gemma4-assistant``), dequantized to
float32 through ``gguf.quants`` (via :func:`inspector.gguf.open_gguf`).

Shapes: everything in this module is in **numpy order** (``shape``, outermost first). A GGUF
tensor with ``ne = [n_embd, n_vocab]`` is the numpy array of shape ``(n_vocab, n_embd)``; a weight
matrix ``W`` with ``ne = [n_in, n_out]`` has shape ``(n_out, n_in)`` and is applied as ``W @ x``.

One step (facts §3, llama.cpp ``gemma4-assistant.cpp``)::

    e      = target.token_embd[tok] * sqrt(n_embd_backbone)                 (n_embd_backbone,)
    x      = pre_projection @ concat(e, h)                                   (n_embd,)
    for il in 0..n_layer-1 (type sliding or full):
        q    = rope(rms_norm_heads(attn_q @ rms_norm(x, attn_norm), attn_q_norm), pos)
        att  = softmax(q . K_donor^T * 1.0, masked) @ V_donor   (GQA)          (n_head, head_dim)
        a    = rms_norm(attn_output @ att, post_attention_norm) + x
        f    = ffn_down @ (gelu_tanh(ffn_gate @ rms_norm(a, ffn_norm)) * (ffn_up @ ...))
        x    = (rms_norm(f, post_ffw_norm) + a) * layer_output_scale
    h_inner = rms_norm(x, output_norm)                                       (n_embd,)
    h_next  = post_projection @ h_inner                                      (n_embd_backbone,)
    logits  = token_embd(drafter) @ h_inner          (dense head)            (n_vocab,)
            | centroid head: c = centroids @ h_inner; top = top_k(c); ids = ordering rows[top];
              logits[ids] = token_embd[ids] @ h_inner; other logits = fill (-1e30 or min(sel) - 1)

The K/V handed in are the target's cache entries of its last sliding and last full layer
(llama.cpp: layers ``n_layer - 2`` and ``n_layer - 1``, ``llama-model.cpp`` ``share``): keys after
``attn_k_norm`` and RoPE, values after the weightless RMS norm (``gemma4.cpp``). Visibility follows
llama.cpp's mask (``llama-hparams.h`` ``is_masked_swa``, standard type): a cell at position ``p0``
is seen by a query at ``p1`` when ``p0 <= p1`` and, on sliding layers, ``p1 - p0 < sliding_window``.

Conventions that differ between runtimes are :class:`StepOptions`. :meth:`ReferenceDrafter.step` is
:meth:`ReferenceDrafter.step_batch` of one row (one implementation of the step).

May import: numpy, mtpscope.errors, inspector.layouts (a drafter GGUF's keys: ``read_hparams``, ``rope_dims``),
inspector.hf_config (``number_fault``: the one rule of the number keys ``verify`` checks), inspector.centroids (the
centroid tensor names, a sidecar head), inspector.gguf.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np

from mtpscope.errors import LayoutError, ReferenceDrafterError
from mtpscope.inspector.centroids import CENTROID_NAMES, ORDERING_NAMES
from mtpscope.inspector.ggml_types import GGML_TYPES_BY_NAME, VEC_DOT_TYPES
from mtpscope.inspector.hf_config import number_fault
from mtpscope.inspector.layouts import (
    FORK_CENTROIDS,
    POST_PROJECTION,
    PRE_PROJECTION,
    read_hparams,
    rope_dim_fault,
    rope_dims,
)

# --------------------------------------------------------------------------------------------------
# constants and options

SQRT_2_OVER_PI = 0.79788456080286535587989211986876  # ggml vec.h, GELU (tanh approximation)
GELU_COEF_A = 0.044715
FILL_FORK = -1e30  # fork / llama.cpp-style fill of unselected logits (seed inventory, step 5)

POSITIONS = ("p", "p-1")
FILLS = ("-1e30", "min-1")
HEADS = ("auto", "dense", "centroid")
HIDDENS = ("postnorm", "prenorm")
GELUS = ("tanh", "ggml-f16")


@dataclass(frozen=True)
class StepOptions:
    """Conventions of one draft step that differ between runtimes.

    Attributes:
        position: ``"p"`` (HF, upstream llama.cpp: the position of the token being fed) or
            ``"p-1"`` (MLX since its PR #1166: one less). Applies to RoPE and to the mask.
        fill: value of logits outside the centroid head's candidates: ``"-1e30"`` (fork) or
            ``"min-1"`` (HF: ``min(selected) - 1``). Ignored by the dense head.
        head: ``"auto"`` (centroid when the drafter has one, else dense), ``"dense"`` or ``"centroid"``.
        hidden: which target hidden the caller feeds: ``"postnorm"`` (after the target's final norm,
            the correct one) or ``"prenorm"``; :meth:`ReferenceDrafter.step` picks ``h`` or
            ``h_prenorm`` accordingly.
        top_k: number of centroids kept (None: the file's ``centroid_top_k``, else 32).
        gelu: ``"tanh"`` (exact tanh approximation, HF ``gelu_pytorch_tanh``) or ``"ggml-f16"``
            (ggml CPU: input rounded to F16, looked up in an F16 table; ``vec.h`` ``GGML_GELU_FP16``).
        kv_f16: emulate llama.cpp's non-flash attention over an F16 KV cache: K, V, the query and the
            softmax probabilities are rounded to F16 before their dot products (ggml's F16 mul_mat
            converts the F32 operand to F16).
        act_quant: emulate ggml-cpu's conversion of the activations before each matrix product with a
            weight: to the weight type's ``vec_dot_type`` (:data:`VEC_DOT_TYPES`: Q8_0 blocks for Q8_0 /
            Q4_0 / Q5_0, Q8_1 for Q4_1 / Q5_1, Q8_K for the k-quants, F16 for F16, BF16 for BF16;
            :func:`round_activations`), as every x86 kernel path of ggml-cpu does (vec_dot, llamafile's
            tinyBLAS, the AVX2 repack, AMX). Only the dense head and the layers; the centroid head is not
            emulated. No effect on F32 weights or on a drafter built without weight types.
    """

    position: str = "p"
    fill: str = "-1e30"
    head: str = "auto"
    hidden: str = "postnorm"
    top_k: int | None = None
    gelu: str = "tanh"
    kv_f16: bool = False
    act_quant: bool = False

    def __post_init__(self) -> None:
        for name, allowed in (("position", POSITIONS), ("fill", FILLS), ("head", HEADS),
                              ("hidden", HIDDENS), ("gelu", GELUS)):
            value = getattr(self, name)
            if value not in allowed:
                raise ReferenceDrafterError("unknown step option value", key=name,
                                     expected=" or ".join(allowed), actual=value)
        if self.top_k is not None and self.top_k < 1:
            raise ReferenceDrafterError("top_k must be positive", key="top_k", expected=">= 1", actual=self.top_k)

    def with_variant(self, spec: str) -> StepOptions:
        """A copy with one ``name=value`` variant applied (e.g. ``position=p-1``, ``top_k=8``).

        Raises:
            ReferenceDrafterError: malformed spec or unknown name / value.
        """
        name, sep, value = spec.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or name not in {f.name for f in self.__dataclass_fields__.values()}:
            raise ReferenceDrafterError("malformed variant" if not sep else f"unknown variant name {name!r}", key=spec,
                                        expected="NAME=VALUE with NAME in " + ", ".join(self.__dataclass_fields__),
                                        actual=spec)
        if name == "top_k":
            if value in ("", "none", "None"):
                return replace(self, top_k=None)
            if not value.lstrip("-").isdigit():
                raise ReferenceDrafterError("top_k is not an integer", key=spec, expected="an integer >= 1",
                                            actual=value)
            return replace(self, top_k=int(value))
        if name in ("kv_f16", "act_quant"):
            truth = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False,
                     "off": False}.get(value.lower())
            if truth is None:
                raise ReferenceDrafterError(f"{name} is not a boolean", key=spec,
                                            expected="true / false (1 / 0, yes / no, on / off)", actual=value)
            flag: dict[str, Any] = {name: truth}
            return replace(self, **flag)
        other: dict[str, Any] = {name: value}
        return replace(self, **other)


@dataclass(frozen=True)
class DrafterHParams:
    """Hyperparameters of a Gemma 4 assistant drafter (per-layer values are tuples over il).

    ``head_dim`` / ``n_rot`` / ``rope_base`` are per layer, resolved from the sliding / full keys.
    """

    arch: str
    dialect: str  # "fork" | "upstream" | "arrays"
    n_embd: int
    n_embd_backbone: int
    n_vocab: int
    n_layer: int
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    n_ff: tuple[int, ...]
    is_swa: tuple[bool, ...]
    head_dim: tuple[int, ...]
    n_rot: tuple[int, ...]
    rope_base: tuple[float, ...]
    sliding_window: int
    eps: float = 1e-6
    n_centroids: int | None = None
    centroid_top_k: int | None = None


@dataclass(frozen=True)
class DonorKV:
    """The target's K/V cache of one donor layer, as the drafter sees it.

    Attributes:
        k: keys, shape ``(n_kv, n_head_kv, head_dim)`` float32, after ``attn_k_norm`` and RoPE.
        v: values, shape ``(n_kv, n_head_kv, head_dim)`` float32, after the weightless RMS norm
            (with K = V, the same projection as ``k`` before its norm and RoPE).
        pos: positions of the cells, shape ``(n_kv,)`` int.
        mask: optional ``(n_kv,)`` bool: which cells the query sees, overriding the position rule
            (a runtime's own visibility, e.g. Hugging Face's, facts §3).
    """

    k: np.ndarray
    v: np.ndarray
    pos: np.ndarray
    mask: np.ndarray | None = None
    f16: bool = False

    def upto(self, n: int) -> DonorKV:
        """The cells whose position is below ``n`` (what a target that decoded ``0..n-1`` holds)."""
        keep = self.pos < n
        if keep.all():
            return self
        if self.pos.size and np.all(np.diff(self.pos) > 0):  # sorted: a prefix, a view not a copy
            m = int(np.count_nonzero(keep))
            return DonorKV(self.k[:m], self.v[:m], self.pos[:m], None if self.mask is None else self.mask[:m],
                           self.f16)
        return DonorKV(self.k[keep], self.v[keep], self.pos[keep],
                       None if self.mask is None else self.mask[keep], self.f16)

    def rounded_f16(self) -> DonorKV:
        """K and V rounded to F16 once (``f16=True`` marks it), as llama.cpp's default F16 cache holds them."""
        if self.f16:
            return self
        return DonorKV(self.k.astype(np.float16).astype(np.float32), self.v.astype(np.float16).astype(np.float32),
                       self.pos, self.mask, True)


@dataclass(frozen=True)
class StepResult:
    """Outputs of one draft step (numpy shapes).

    Attributes:
        token: the draft (argmax of ``logits``; ties go to the lowest id, as ``np.argmax``).
        logits: ``(n_vocab,)`` float32.
        h_inner: ``(n_embd,)`` float32, after the drafter's final norm.
        h_next: ``(n_embd_backbone,)`` float32, the hidden fed to the next step.
        centroid_ids: ``(top_k,)`` int, best first (centroid head only, else None).
        centroid_logits: ``(top_k,)`` float32 for ``centroid_ids`` (centroid head only).
        candidate_ids: ``(top_k * vsc,)`` int, token ids scored by the sparse head (centroid head only).
    """

    token: int
    logits: np.ndarray
    h_inner: np.ndarray
    h_next: np.ndarray
    centroid_ids: np.ndarray | None = None
    centroid_logits: np.ndarray | None = None
    candidate_ids: np.ndarray | None = None



def _mv(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``w @ x`` for a matrix ``(n_out, n_in)`` and a vector ``(n_in,)``, float32.

    ``np.einsum`` (no BLAS): BLAS threading costs 10-100x on small matrix-vector products on a busy
    machine, and einsum is as fast as BLAS on large ones (memory bound).
    """
    res: np.ndarray = np.einsum("ij,j->i", w, x.astype(w.dtype, copy=False)).astype(np.float32, copy=False)
    return res


# --------------------------------------------------------------------------------------------------
# the pieces (each unit-tested against hand-computed values)


def rms_norm(x: np.ndarray, w: np.ndarray | None, eps: float = 1e-6) -> np.ndarray:
    """RMS norm over the last axis: ``x / sqrt(mean(x**2) + eps) * w`` (no ``+1`` on ``w``).

    Shapes: ``x`` ``(..., n)``, ``w`` ``(n,)`` or None (weightless, as the target's V norm).
    Source: facts §3; ggml ``rms_norm`` (sum in double, ``1/sqrtf(mean + eps)``).
    """
    x64 = x.astype(np.float64)
    scale = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)
    y = (x64 * scale).astype(np.float32)
    res: np.ndarray = y if w is None else y * w.astype(np.float32)
    return res


def gelu_tanh(x: np.ndarray, mode: str = "tanh") -> np.ndarray:
    """GELU, tanh approximation: ``0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2)))``.

    ``mode="ggml-f16"`` reproduces ggml's CPU kernel (``vec.h``, ``GGML_GELU_FP16``): inputs in
    (-10, 10) are rounded to F16 and the F16-rounded GELU of that value is returned; ``x <= -10``
    gives 0 and ``x >= 10`` gives ``x``.
    """
    x = np.asarray(x, dtype=np.float32)
    if mode == "tanh":
        x64 = x.astype(np.float64)
        return (0.5 * x64 * (1.0 + np.tanh(SQRT_2_OVER_PI * x64 * (1.0 + GELU_COEF_A * x64 * x64)))
                ).astype(np.float32)
    if mode != "ggml-f16":
        raise ReferenceDrafterError("unknown gelu mode", key="gelu", expected=" or ".join(GELUS), actual=mode)
    xh = x.astype(np.float16).astype(np.float32)
    y = gelu_tanh(xh, "tanh").astype(np.float16).astype(np.float32)
    y = np.where(x <= -10.0, np.float32(0.0), y)
    return np.where(x >= 10.0, x, y).astype(np.float32)


def rope_neox(x: np.ndarray, pos: int, base: float, n_rot: int,
              freq_factors: np.ndarray | None = None) -> np.ndarray:
    """NEOX ("rotate half") RoPE of one token's heads.

    Shapes: ``x`` ``(n_head, head_dim)``; returns the same shape. Pair ``i`` (``0 <= i < n_rot/2``)
    couples dims ``i`` and ``i + n_rot/2`` and turns by ``pos * base**(-2i/n_rot) / ff[i]``; dims at
    or beyond ``n_rot`` are unchanged. ``freq_factors`` (``(n_rot/2,)``, GGUF ``rope_freqs.weight``)
    give proportional RoPE: 1.0 for the rotated pairs, 1e30 (no turn) for the rest.
    Source: ggml ``ggml_rope_cache_init`` / ``rotate_pairs`` (ops.cpp), HF ``rotate_half``.
    """
    half = n_rot // 2
    i = np.arange(half, dtype=np.float64)
    theta = pos * np.power(float(base), -2.0 * i / n_rot)
    if freq_factors is not None:
        theta = theta / freq_factors[:half].astype(np.float64)
    cos = np.cos(theta).astype(np.float32)
    sin = np.sin(theta).astype(np.float32)
    out = x.astype(np.float32, copy=True)
    a = x[..., :half].astype(np.float32)
    b = x[..., half:n_rot].astype(np.float32)
    out[..., :half] = a * cos - b * sin
    out[..., half:n_rot] = b * cos + a * sin
    return out


def visible(kv_pos: np.ndarray, q_pos: int, sliding_window: int | None) -> np.ndarray:
    """Boolean mask ``(n_kv,)``: which cells a query at ``q_pos`` attends to.

    Causal (``p0 <= q_pos``) and, for a sliding layer (``sliding_window`` not None), inside the
    window: ``q_pos - p0 < sliding_window``. Source: llama.cpp ``is_masked_swa`` (standard type).
    """
    m = kv_pos <= q_pos
    if sliding_window is not None:
        m &= (q_pos - kv_pos) < sliding_window
    return m


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float = 1.0,
              f16: bool = False, kv_rounded: bool = False) -> np.ndarray:
    """Grouped-query attention of one query token.

    Shapes: ``q`` ``(n_head, d)``, ``k`` / ``v`` ``(n_kv, n_head_kv, d)``, ``mask`` ``(n_kv,)`` bool;
    returns ``(n_head, d)``. Query head ``h`` reads KV head ``h // (n_head / n_head_kv)``.
    ``scale`` multiplies the scores (Gemma 4: 1.0). With no visible cell the output is zero.
    ``f16`` rounds q, K, V and the probabilities to F16 first (llama.cpp, non-FA, F16 cache);
    ``kv_rounded`` says K and V already are (see :meth:`DonorKV.rounded_f16`).
    """
    res: np.ndarray = _attend(np.asarray(q)[None], k, v, np.asarray(mask, dtype=bool)[None], f16, kv_rounded, scale)[0]
    return res


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, f16: bool = False,
            kv_rounded: bool = False, scale: float = 1.0) -> np.ndarray:
    """:func:`attention` of R query rows at once: ``q`` ``(R, n_head, d)``, ``mask`` ``(R, n_kv)``; returns
    ``(R, n_head, d)`` float32 (a row that sees no cell gets zeros). One row runs without BLAS (see :func:`_mv`).
    """
    R, n_head, d = q.shape
    n_head_kv = k.shape[1]
    if n_head % n_head_kv:
        raise ReferenceDrafterError("n_head is not a multiple of n_head_kv", key="n_head_kv",
                             expected=f"a divisor of {n_head}", actual=n_head_kv)
    seen = np.asarray(mask.any(axis=0))   # (an array: mask is 2-D)
    if not seen.any():
        return np.zeros((R, n_head, d), dtype=np.float32)
    lo = int(np.argmax(seen))                  # the visible run (usually all of it): views, no copies
    hi = int(seen.size - np.argmax(seen[::-1]))
    ks = k[lo:hi].astype(np.float32, copy=False)
    vs = v[lo:hi].astype(np.float32, copy=False)
    m = mask[:, lo:hi]
    qq = q.astype(np.float32)
    if f16:
        qq = qq.astype(np.float16).astype(np.float32)
        if not kv_rounded:
            ks, vs = (a.astype(np.float16).astype(np.float32) for a in (ks, vs))
    group = n_head // n_head_kv
    qg = qq.reshape(R, n_head_kv, group, d)
    batched = R > 1                            # einsum's BLAS path only pays for several rows
    sc = np.einsum("rhgd,nhd->rhgn", qg, ks, optimize=batched) * np.float32(scale)   # (R, nkv, group, n)
    sc = np.where(m[:, None, None, :], sc, -np.inf)
    mx = sc.max(axis=-1, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0.0)
    pr = np.exp((sc - mx).astype(np.float64))
    den = pr.sum(axis=-1, keepdims=True)
    pr = (pr / np.where(den > 0, den, 1.0)).astype(np.float32)
    if f16:
        pr = pr.astype(np.float16).astype(np.float32)
    out = np.einsum("rhgn,nhd->rhgd", pr, vs, optimize=batched)
    res: np.ndarray = out.reshape(R, n_head, d).astype(np.float32)
    return res


def _mm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x @ w.T`` for rows ``x`` ``(R, n_in)`` and a matrix ``w`` ``(n_out, n_in)``: ``(R, n_out)`` float32.
    Several rows: one BLAS product; one row: :func:`_mv` (no BLAS)."""
    if x.shape[0] == 1:
        return _mv(w, x[0])[None, :]
    res: np.ndarray = (x @ w.T).astype(np.float32, copy=False)
    return res


def round_activations(x: np.ndarray, act_type: str | None) -> np.ndarray:
    """``x`` ``(R, n)`` as ggml-cpu hands it to the dot products of a matrix product whose weight has
    ``vec_dot_type`` ``act_type`` (:data:`VEC_DOT_TYPES`), dequantized back to float32.

    * ``F16`` / ``BF16``: rounded to that type (round to nearest even).
    * ``Q8_0`` / ``Q8_1`` (``quantize_row_q8_0_ref``): per block of 32, ``d = amax / 127`` stored as F16,
      ``q = roundf(x / d)``; the value is ``q * d``.
    * ``Q8_K`` (``quantize_row_q8_K_ref``): per block of 256, ``iscale = -127 / m`` with ``m`` the element of
      largest magnitude (sign kept), ``q = min(127, nearest_int(iscale * x))``, ``d = 1 / iscale`` in F32.

    The integer dot products ggml then sums are exact; only the summation order differs from a float
    product of these values. ``None``, ``F32``, an unknown type or a row length that is not a multiple of
    the block: ``x`` unchanged (ggml needs whole blocks; such a weight cannot have a quantized type).
    """
    x = np.asarray(x, dtype=np.float32)
    if act_type in ("F16",):
        return x.astype(np.float16).astype(np.float32)
    if act_type == "BF16":
        u: np.ndarray = x.view(np.uint32).astype(np.uint64)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        return u.astype(np.uint32).view(np.float32).reshape(x.shape)
    qk = GGML_TYPES_BY_NAME[act_type].block_size if act_type in ("Q8_0", "Q8_1", "Q8_K") else None
    if qk is None or x.shape[-1] % qk:
        return x
    b = x.reshape(*x.shape[:-1], x.shape[-1] // qk, qk)
    if act_type == "Q8_K":
        idx = np.argmax(np.abs(b), axis=-1)[..., None]
        m = np.take_along_axis(b, idx, axis=-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            iscale = np.where(m != 0, np.float32(-127.0) / m, np.float32(0.0)).astype(np.float32)
            q = np.minimum(127.0, np.rint(iscale * b))                   # nearest_int: round half to even
            d = np.where(m != 0, np.float32(1.0) / iscale, np.float32(0.0)).astype(np.float32)
        blocks: np.ndarray = (q * d).astype(np.float32).reshape(x.shape)
        return blocks
    amax = np.abs(b).max(axis=-1, keepdims=True)
    d = (amax / np.float32(127.0)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        idv = np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    v = b * idv
    q = np.trunc(v + np.copysign(np.float32(0.5), v))                  # roundf: half away from zero
    d16 = d.astype(np.float16).astype(np.float32)
    res: np.ndarray = (q * d16).astype(np.float32).reshape(x.shape)
    return res


def _mmq(x: np.ndarray, w: np.ndarray, act_type: str | None) -> np.ndarray:
    """:func:`_mm` after :func:`round_activations` of ``x`` to ``act_type`` (None: plain :func:`_mm`)."""
    return _mm(x if act_type is None else round_activations(x, act_type), w)


def centroid_head(h_inner: np.ndarray, centroids: np.ndarray, ordering: np.ndarray,
                  token_embd_rows: Callable[[np.ndarray], np.ndarray], n_vocab: int, top_k: int,
                  fill: str = "-1e30") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The sparse centroid ("masked embedding") LM head.

    Shapes: ``h_inner`` ``(n_embd,)``; ``centroids`` ``(n_centroids, n_embd)``; ``ordering``
    ``(n_vocab,)`` int, viewed as ``n_centroids`` rows of ``vsc = n_vocab / n_centroids`` ids;
    ``token_embd_rows(ids)`` returns ``(len(ids), n_embd)``. Returns ``(logits (n_vocab,),
    centroid_ids (top_k,) best first, centroid_logits (top_k,), candidate_ids (top_k*vsc,))``.
    Unselected logits are ``-1e30`` (``fill="-1e30"``, fork) or ``min(selected) - 1`` (HF).
    Ties among centroids go to the lower index. Source: facts §3 step 5; seed inventory.
    """
    n_centroids = centroids.shape[0]
    if n_vocab % n_centroids:
        raise ReferenceDrafterError("n_vocab is not a multiple of n_centroids", key="n_centroids",
                             expected=f"a divisor of {n_vocab}", actual=n_centroids)
    if ordering.shape != (n_vocab,):
        raise ReferenceDrafterError("token ordering has the wrong length", key="token_ordering",
                             expected=(n_vocab,), actual=ordering.shape)
    vsc = n_vocab // n_centroids
    c = _mv(centroids.astype(np.float32, copy=False), h_inner.astype(np.float32))
    k = min(top_k, n_centroids)
    top = np.argsort(-c, kind="stable")[:k]
    ids = ordering.reshape(n_centroids, vsc)[top].reshape(-1).astype(np.int64)
    sel = _mv(token_embd_rows(ids).astype(np.float32, copy=False), h_inner.astype(np.float32))
    fill_value = np.float32(FILL_FORK) if fill == "-1e30" else np.float32(sel.min() - np.float32(1.0))
    logits = np.full(n_vocab, fill_value, dtype=np.float32)
    logits[ids] = sel
    return logits, top, c[top], ids


# --------------------------------------------------------------------------------------------------
# the drafter


@dataclass(frozen=True)
class LayerWeights:
    """One drafter layer's weights (numpy shapes)."""

    attn_norm: np.ndarray            # (n_embd,)
    attn_q: np.ndarray               # (n_head*head_dim, n_embd)
    attn_q_norm: np.ndarray          # (head_dim,)
    attn_output: np.ndarray          # (n_embd, n_head*head_dim)
    post_attention_norm: np.ndarray  # (n_embd,)
    ffn_norm: np.ndarray             # (n_embd,)
    ffn_gate: np.ndarray             # (n_ff, n_embd)
    ffn_up: np.ndarray               # (n_ff, n_embd)
    ffn_down: np.ndarray             # (n_embd, n_ff)
    post_ffw_norm: np.ndarray        # (n_embd,)
    layer_output_scale: float = 1.0


@dataclass(frozen=True)
class DrafterWeights:
    """All drafter weights (numpy shapes); centroid pair optional."""

    pre_projection: np.ndarray       # (n_embd, 2*n_embd_backbone)
    post_projection: np.ndarray      # (n_embd_backbone, n_embd)
    token_embd: np.ndarray           # (n_vocab, n_embd), the drafter's (tied) LM head
    output_norm: np.ndarray          # (n_embd,)
    layers: tuple[LayerWeights, ...]
    rope_freqs: np.ndarray | None = None   # (head_dim_full/2,)
    centroids: np.ndarray | None = None    # (n_centroids, n_embd)
    token_ordering: np.ndarray | None = None  # (n_vocab,) int
    #: activation type of each matrix product (:data:`VEC_DOT_TYPES` of the file's ggml type), keyed by the
    #: GGUF tensor name without ``.weight`` and with ``blk.{il}.`` for layers (``blk.0.attn_q``, ``token_embd``,
    #: ``pre_projection``, ``post_projection``); empty: no emulation (``StepOptions.act_quant`` has no effect)
    act_types: Mapping[str, str] = field(default_factory=dict)


class ReferenceDrafter:
    """The numpy drafter: weights + hyperparameters + the target's embedding lookup.

    Args:
        hparams: :class:`DrafterHParams`.
        weights: :class:`DrafterWeights` (float32 arrays, numpy order).
        target_embd: the target's ``token_embd`` as an array ``(n_vocab, n_embd_backbone)`` or a
            callable ``ids -> (len(ids), n_embd_backbone)``.
        source: free text naming where the weights came from (error messages).
    """

    def __init__(self, hparams: DrafterHParams, weights: DrafterWeights,
                 target_embd: np.ndarray | Callable[[np.ndarray], np.ndarray], source: str = "") -> None:
        self.hp = hparams
        self.w = weights
        self.source = source
        if callable(target_embd):
            self._target_rows = target_embd
        else:
            arr = target_embd
            if arr.ndim != 2 or arr.shape[1] != hparams.n_embd_backbone:
                raise ReferenceDrafterError("target token_embd has the wrong shape", key="token_embd.weight",
                                     expected=f"(n_vocab, {hparams.n_embd_backbone})", actual=arr.shape)
            self._target_rows = lambda ids: arr[np.asarray(ids)]
        self._check()

    def _check(self) -> None:
        hp, w = self.hp, self.w
        want = {
            "pre_projection": (w.pre_projection, (hp.n_embd, 2 * hp.n_embd_backbone)),
            "post_projection": (w.post_projection, (hp.n_embd_backbone, hp.n_embd)),
            "token_embd": (w.token_embd, (hp.n_vocab, hp.n_embd)),
            "output_norm": (w.output_norm, (hp.n_embd,)),
        }
        for name, (arr, shape) in want.items():
            if arr.shape != shape:
                raise ReferenceDrafterError("weight has the wrong shape (numpy order)", path=self.source or None,
                                     key=name, expected=shape, actual=arr.shape)
        if len(w.layers) != hp.n_layer:
            raise ReferenceDrafterError("wrong number of layers", key="layers", expected=hp.n_layer,
                                 actual=len(w.layers))
        for il, lw in enumerate(w.layers):
            qd = hp.n_head[il] * hp.head_dim[il]
            for name, arr, shape in (("attn_q", lw.attn_q, (qd, hp.n_embd)),
                                     ("attn_output", lw.attn_output, (hp.n_embd, qd)),
                                     ("attn_q_norm", lw.attn_q_norm, (hp.head_dim[il],)),
                                     ("ffn_gate", lw.ffn_gate, (hp.n_ff[il], hp.n_embd)),
                                     ("ffn_up", lw.ffn_up, (hp.n_ff[il], hp.n_embd)),
                                     ("ffn_down", lw.ffn_down, (hp.n_embd, hp.n_ff[il]))):
                if arr.shape != shape:
                    raise ReferenceDrafterError("weight has the wrong shape (numpy order)",
                                         path=self.source or None, key=f"blk.{il}.{name}",
                                         expected=shape, actual=arr.shape)

    # -- loading ----------------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, drafter: str | os.PathLike[str], target: str | os.PathLike[str],
                  centroids: str | os.PathLike[str] | None = None) -> ReferenceDrafter:
        """Load a drafter GGUF (fork or upstream dialect) and its target's embedding table.

        ``centroids`` is an optional centroid-head source for an upstream drafter: a sidecar GGUF
        (the converter's ``--centroids-out``), a fork-dialect GGUF or an HF checkpoint directory
        (read by ``inspector.centroids.load_centroid_head``).
        Quantized tensors are dequantized to float32 (gguf.quants, via the reader); the target's
        ``token_embd`` is read row by row on demand (memmap).

        Raises:
            LayoutError: a needed key or tensor is missing (names the file and key), the file is not a fork /
                upstream drafter, or token_embd's rows differ from its tokenizer's n_vocab.
        """
        from mtpscope.inspector.gguf import open_gguf

        f = open_gguf(drafter)
        hp, names = _hparams_from_gguf(f, drafter)

        def data(n: str) -> np.ndarray:
            arr = np.asarray(f.tensor_data(n))
            if arr.dtype.kind != "f":       # an integer type (I8 .. I64): ggml multiplies no weight by it
                raise LayoutError("weight is not a float or quantized type", path=os.fspath(drafter), key=n,
                                  expected="F32, F16, BF16 or a quantized type", actual=f.tensor(n).type_name)
            return arr.astype(np.float32, copy=False)

        layers = []
        for il in range(hp.n_layer):
            b = f"blk.{il}."
            scale = 1.0
            if _has(f, b + "layer_output_scale.weight"):
                scale = float(data(b + "layer_output_scale.weight").reshape(-1)[0])
            layers.append(LayerWeights(
                attn_norm=data(b + "attn_norm.weight"), attn_q=data(b + "attn_q.weight"),
                attn_q_norm=data(b + "attn_q_norm.weight"), attn_output=data(b + "attn_output.weight"),
                post_attention_norm=data(b + "post_attention_norm.weight"),
                ffn_norm=data(b + "ffn_norm.weight"), ffn_gate=data(b + "ffn_gate.weight"),
                ffn_up=data(b + "ffn_up.weight"), ffn_down=data(b + "ffn_down.weight"),
                post_ffw_norm=data(b + "post_ffw_norm.weight"), layer_output_scale=scale))
        cen = order = None
        if names.get("centroids"):
            cen = data(names["centroids"])
            order = np.asarray(f.tensor_data(names["token_ordering"], dequantize=False)).astype(np.int64)
        if centroids is not None:
            from mtpscope.inspector.centroids import load_centroid_head

            head = load_centroid_head(centroids)
            cen = np.asarray(head.centroids, dtype=np.float32)
            order = np.asarray(head.ordering).astype(np.int64).reshape(-1)
            hp = replace(hp, n_centroids=int(cen.shape[0]), centroid_top_k=int(cast(int, head.top_k)))
        rope_freqs = data("rope_freqs.weight") if _has(f, "rope_freqs.weight") else None
        if rope_freqs is not None and not (np.isfinite(rope_freqs).all() and (rope_freqs > 0).all()):
            bad = rope_freqs[~(np.isfinite(rope_freqs) & (rope_freqs > 0))]
            raise LayoutError("rope_freqs must be finite and > 0 (ggml divides each angle by it)",
                              path=os.fspath(drafter), key="rope_freqs.weight", expected="finite values > 0",
                              actual=f"{bad.size} of {rope_freqs.size} values not, the first {float(bad[0])}")
        weights = DrafterWeights(
            pre_projection=data(names["pre_projection"]), post_projection=data(names["post_projection"]),
            token_embd=data("token_embd.weight"), output_norm=data("output_norm.weight"),
            layers=tuple(layers),
            rope_freqs=rope_freqs,
            centroids=cen, token_ordering=None if order is None else order.reshape(-1),
            act_types=_act_types(f, names, hp.n_layer))
        t = open_gguf(target)
        t_name = "token_embd.weight"
        if not _has(t, t_name):
            raise LayoutError("target has no token embedding", path=os.fspath(target), key=t_name)
        t_info = t.tensor(t_name)
        if t_info.shape[-1] != hp.n_embd_backbone:
            raise LayoutError("target width differs from the drafter's backbone width",
                              path=os.fspath(target), key=t_name,
                              expected=hp.n_embd_backbone, actual=t_info.shape[-1])

        def target_rows(ids: np.ndarray) -> np.ndarray:
            ids = np.asarray(ids).reshape(-1)
            return np.stack([np.asarray(t.tensor_data(t_name, rows=slice(int(i), int(i) + 1)),
                                        dtype=np.float32).reshape(-1) for i in ids])

        return cls(hp, weights, target_rows, source=os.fspath(drafter))

    # -- the step ---------------------------------------------------------------------------------

    def embed_target(self, token: int) -> np.ndarray:
        """``target.token_embd[token] * sqrt(n_embd_backbone)``, shape ``(n_embd_backbone,)``.

        The scale is applied in float32 (llama.cpp ``ggml_scale`` by ``sqrtf(n_embd_backbone)``).
        """
        if not 0 <= int(token) < self.hp.n_vocab:
            raise ReferenceDrafterError("token id out of range", key="token",
                                 expected=f"0 <= id < {self.hp.n_vocab}", actual=token)
        row = np.asarray(self._target_rows(np.array([int(token)])), dtype=np.float32).reshape(-1)
        return row * np.float32(math.sqrt(self.hp.n_embd_backbone))

    def step(self, token: int, h: np.ndarray, pos: int, kv: Mapping[str, DonorKV],
             options: StepOptions | None = None, h_prenorm: np.ndarray | None = None,
             trace: dict[str, Any] | None = None) -> StepResult:
        """One draft step: :meth:`step_batch` of one row.

        Args:
            token: the token fed (last accepted token, or the previous draft).
            h: ``(n_embd_backbone,)`` the target hidden after its final norm (first step of a
                round) or the previous step's ``h_next``.
            pos: position of ``token`` (``options.position="p-1"`` uses ``pos - 1``).
            kv: ``{"sliding": DonorKV, "full": DonorKV}`` (only the types the drafter has).
            options: :class:`StepOptions` (default: llama.cpp upstream conventions).
            h_prenorm: ``(n_embd_backbone,)`` used instead of ``h`` when ``options.hidden="prenorm"``.
            trace: if a dict, intermediate values are stored into it by llama.cpp node name
                (``inp_embd_target``, ``pre_proj``, ``attn_norm-{il}``, ``Qcur_pos-{il}``,
                ``kqv_out-{il}``, ``attn_out-{il}``, ``out_scaled-{il}``, ``result_norm``, ...).

        Returns:
            :class:`StepResult`.

        Raises:
            ReferenceDrafterError: wrong shapes, missing donor K/V, prenorm hidden not given, centroid head
                requested on a drafter without one, token id out of range.
        """
        return self._steps(np.array([int(token)]), np.asarray(h, dtype=np.float32).reshape(1, -1),
                           np.array([int(pos)]), kv, options, None,
                           None if h_prenorm is None else np.asarray(h_prenorm, dtype=np.float32).reshape(1, -1),
                           trace)[0]

    def step_batch(self, tokens: np.ndarray, h: np.ndarray, pos: np.ndarray, kv: Mapping[str, DonorKV],
                   options: StepOptions | None = None, kv_limit: np.ndarray | None = None,
                   h_prenorm: np.ndarray | None = None) -> list[StepResult]:
        """R independent draft steps at once (the math of the module docstring, row by row).

        Matrix products run over all rows together (one pass over each weight, BLAS), which makes
        replaying many rounds much faster than R calls of :meth:`step`; one row runs without BLAS (see
        ``_mv``). Results of different batch sizes agree to float32 rounding (summation order).

        Args:
            tokens: ``(R,)`` token ids fed.
            h: ``(R, n_embd_backbone)`` hiddens fed.
            pos: ``(R,)`` positions (``options.position`` applies).
            kv: donor K/V shared by all rows (e.g. one prefill of the whole sequence).
            options: as for :meth:`step`; ``hidden="prenorm"`` takes the rows of ``h_prenorm``.
            kv_limit: ``(R,)`` row r sees only cells with position ``< kv_limit[r]`` (what the target's
                cache held then); None: every cell (subject to the position rule / mask).
            h_prenorm: ``(R, n_embd_backbone)`` or None.

        Returns:
            one :class:`StepResult` per row.

        Raises:
            ReferenceDrafterError: as :meth:`step`.
        """
        return self._steps(tokens, h, pos, kv, options, kv_limit, h_prenorm, None)

    def _steps(self, tokens: np.ndarray, h: np.ndarray, pos: np.ndarray, kv: Mapping[str, DonorKV],
               options: StepOptions | None, kv_limit: np.ndarray | None, h_prenorm: np.ndarray | None,
               trace: dict[str, Any] | None) -> list[StepResult]:
        """The step of :meth:`step` / :meth:`step_batch`; ``trace`` receives row 0's intermediates."""
        o = options or StepOptions()
        hp, w = self.hp, self.w
        if o.hidden == "prenorm":
            if h_prenorm is None:
                raise ReferenceDrafterError("hidden=prenorm needs the target's pre-norm hidden", key="h_prenorm")
            h = h_prenorm
        toks = np.asarray(tokens, dtype=np.int64).reshape(-1)
        R = toks.size
        h = np.asarray(h, dtype=np.float32).reshape(R, -1)
        if h.shape[1] != hp.n_embd_backbone:
            raise ReferenceDrafterError("hidden has the wrong width", key="h", expected=(R, hp.n_embd_backbone),
                                 actual=h.shape)
        qpos = np.asarray(pos, dtype=np.int64).reshape(-1) - (1 if o.position == "p-1" else 0)
        if np.any((toks < 0) | (toks >= hp.n_vocab)):
            raise ReferenceDrafterError("token id out of range", key="tokens", expected=f"0 <= id < {hp.n_vocab}",
                                 actual=toks[(toks < 0) | (toks >= hp.n_vocab)][:4].tolist())
        t = trace
        e = np.asarray(self._target_rows(toks), dtype=np.float32).reshape(R, -1) * \
            np.float32(math.sqrt(hp.n_embd_backbone))
        vd = w.act_types if o.act_quant else {}
        x = _mmq(np.concatenate([e, h], axis=1), w.pre_projection, vd.get("pre_projection"))  # (R, n_embd)
        if t is not None:
            t["inp_embd_target"], t["pre_proj"] = e[0], x[0]
        for il, lw in enumerate(w.layers):
            kind = "sliding" if hp.is_swa[il] else "full"
            if kind not in kv:
                raise ReferenceDrafterError("no donor K/V for this layer type", key=kind,
                                     expected="sliding and full DonorKV", actual=sorted(kv))
            d = kv[kind]
            hd, nh = hp.head_dim[il], hp.n_head[il]
            if d.k.ndim != 3 or d.k.shape[2] != hd or d.k.shape != d.v.shape or d.pos.shape != d.k.shape[:1]:
                raise ReferenceDrafterError("donor K/V have the wrong shape", key=f"{kind} kv",
                                     expected=f"k, v (n_kv, n_head_kv, {hd}), pos (n_kv,)",
                                     actual=f"k {d.k.shape}, v {d.v.shape}, pos {d.pos.shape}")
            xn = rms_norm(x, lw.attn_norm, hp.eps)
            b = f"blk.{il}."
            q = rms_norm(_mmq(xn, lw.attn_q, vd.get(b + "attn_q")).reshape(R, nh, hd), lw.attn_q_norm, hp.eps)
            ff = None if hp.is_swa[il] else w.rope_freqs
            q = np.stack([rope_neox(q[r], int(qpos[r]), hp.rope_base[il], hp.n_rot[il], ff) for r in range(R)])
            win = hp.sliding_window if hp.is_swa[il] else None
            if d.mask is not None:
                m = np.broadcast_to(d.mask, (R, d.pos.size)).copy()
            else:
                m = (d.pos[None, :] <= qpos[:, None])
                if win is not None:
                    m &= (qpos[:, None] - d.pos[None, :]) < win
            if kv_limit is not None:
                m &= d.pos[None, :] < np.asarray(kv_limit).reshape(-1)[:, None]
            att = _attend(q, d.k, d.v, m, o.kv_f16, d.f16).reshape(R, nh * hd)
            a = rms_norm(_mmq(att, lw.attn_output, vd.get(b + "attn_output")), lw.post_attention_norm, hp.eps) + x
            fn = rms_norm(a, lw.ffn_norm, hp.eps)
            g = gelu_tanh(_mmq(fn, lw.ffn_gate, vd.get(b + "ffn_gate")), o.gelu) * _mmq(fn, lw.ffn_up, vd.get(b + "ffn_up"))
            f_out = _mmq(g, lw.ffn_down, vd.get(b + "ffn_down"))
            y = (rms_norm(f_out, lw.post_ffw_norm, hp.eps) + a) * np.float32(lw.layer_output_scale)
            if t is not None:
                t[f"attn_norm-{il}"], t[f"Qcur_pos-{il}"], t[f"kqv_out-{il}"] = xn[0], q[0], att[0].reshape(nh, hd)
                t[f"attn_out-{il}"], t[f"ffn_out-{il}"], t[f"out_scaled-{il}"] = a[0], f_out[0], y[0]
            x = y.astype(np.float32)
        h_inner = rms_norm(x, w.output_norm, hp.eps)
        h_next = _mmq(h_inner, w.post_projection, vd.get("post_projection"))
        head = o.head
        if head == "auto":
            head = "centroid" if w.centroids is not None else "dense"
        out: list[StepResult] = []
        if head == "centroid":
            if w.centroids is None or w.token_ordering is None:
                raise ReferenceDrafterError("centroid head requested but the drafter has none", path=self.source or None,
                                     key=FORK_CENTROIDS)
            k = o.top_k or hp.centroid_top_k or 32
            for r in range(R):
                lg, cids, clog, cand = centroid_head(h_inner[r], w.centroids, w.token_ordering,
                                                     lambda ids: w.token_embd[ids], hp.n_vocab, k, o.fill)
                out.append(StepResult(int(np.argmax(lg)), lg, h_inner[r], h_next[r], cids, clog, cand))
        else:
            logits = _mmq(h_inner, w.token_embd, vd.get("token_embd"))                # (R, n_vocab)
            for r in range(R):
                out.append(StepResult(int(np.argmax(logits[r])), logits[r], h_inner[r], h_next[r]))
        if t is not None:
            t["result_norm"], t["result_output"], t["h_nextn"] = h_inner[0], out[0].logits, h_next[0]
        return out


# --------------------------------------------------------------------------------------------------
# GGUF hyperparameters (both dialects): inspector.layouts.read_hparams, the one reading of a file's keys

PRE_NAMES = (PRE_PROJECTION["upstream"], PRE_PROJECTION["fork"], "blk.0.nextn.pre_projection.weight",
             "mtp_pre_proj.weight", "assistant.pre_projection.weight")
POST_NAMES = (POST_PROJECTION["upstream"], POST_PROJECTION["fork"], "mtp_post_proj.weight",
              "assistant.post_projection.weight")
#: keys (after ``{arch}.``) the reference needs the file to state; the others fall back to llama.cpp defaults
REQUIRED_KEYS = ("attention.sliding_window_pattern", "attention.key_length", "attention.sliding_window",
                 "attention.head_count", "attention.head_count_kv", "feed_forward_length")


def _act_types(f: Any, names: Mapping[str, str], n_layer: int) -> dict[str, str]:
    """:attr:`DrafterWeights.act_types` of an open drafter GGUF: each matrix's ggml type through
    :data:`VEC_DOT_TYPES` (F32 matrices and unknown types are left out: their activations stay F32)."""
    wanted = {"pre_projection": names["pre_projection"], "post_projection": names["post_projection"],
              "token_embd": "token_embd.weight"}
    for il in range(n_layer):
        for m in ("attn_q", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            wanted[f"blk.{il}.{m}"] = f"blk.{il}.{m}.weight"
    out = {}
    for key, name in wanted.items():
        act = VEC_DOT_TYPES.get(f.tensor(name).type_name)
        if act is not None:
            out[key] = act
    return out


def _has(f: Any, name: str) -> bool:
    return any(t.name == name for t in f.tensors)


def _first(f: Any, names: tuple[str, ...], path: Any) -> str:
    for n in names:
        if _has(f, n):
            return n
    raise LayoutError("tensor not found", path=os.fspath(path), key=names[0],
                      expected=" or ".join(names), actual="absent")


def _hparams_from_gguf(f: Any, path: Any) -> tuple[DrafterHParams, dict[str, str]]:
    """:class:`DrafterHParams` and the tensor names of the projections / centroid pair of a drafter GGUF.

    Keys are read by :func:`inspector.layouts.read_hparams` (dialect from the architecture; n_vocab from the
    tokenizer, else token_embd), which must match ``token_embd``'s rows (the drafter's LM head).

    Raises:
        LayoutError: not a fork / upstream drafter (no backbone width), a key of :data:`REQUIRED_KEYS` missing,
            a per-layer array of the wrong length, a projection tensor missing, or token_embd rows differing
            from the tokenizer.
    """
    hp = read_hparams(f)
    p = hp.arch + "."
    for suffix in REQUIRED_KEYS:
        if p + suffix not in hp.raw:
            raise LayoutError("missing key", path=os.fspath(path), key=p + suffix)
    if hp.n_embd_backbone is None:
        raise LayoutError("missing backbone width", path=os.fspath(path), key=p + "embedding_length_out",
                          expected=f"{p}embedding_length_out or {p}n_embd_backbone", actual="absent")
    pattern = hp.raw[p + "attention.sliding_window_pattern"]
    n_pattern = len(pattern) if isinstance(pattern, list) else None
    if n_pattern != hp.n_layer:
        raise LayoutError("per-layer array has the wrong length", path=os.fspath(path),
                          key=p + "attention.sliding_window_pattern", expected=hp.n_layer, actual=n_pattern)
    is_swa = tuple(ly.sliding for ly in hp.layers)
    # the values llama.cpp rotates by (layouts.rope_dims: its defaults); a value it aborts or hangs on, refused
    (full_key, rot_full, hd_full), (swa_key, rot_swa, hd_swa) = rope_dims(hp)
    for key, n_rot, hd, sliding in ((full_key, rot_full, hd_full, False), (swa_key, rot_swa, hd_swa, True)):
        why = rope_dim_fault(n_rot, hd) if sliding in is_swa else None
        if why is not None:
            raise LayoutError(f"RoPE dims llama.cpp cannot rotate by: {why}", path=os.fspath(path), key=key,
                              expected=f"an even number from 2 to {hd}", actual=n_rot)

    def number(suffix: str, default: float) -> float:
        """A number key as llama.cpp uses it (absent: its default; 0 is a value, never the default), refused where
        ``verify`` reports it (:func:`inspector.hf_config.number_fault`)."""
        v = hp.raw.get(p + suffix)
        if v is None:
            return default
        if number_fault(v) is not None:
            raise LayoutError("key is not a finite number > 0", path=os.fspath(path), key=p + suffix,
                              expected="a finite number > 0", actual=v)
        return float(v)

    base_full = number("rope.freq_base", 1e6)
    base_swa = number("rope.freq_base_swa", 1e4)
    names = {"pre_projection": _first(f, PRE_NAMES, path), "post_projection": _first(f, POST_NAMES, path)}
    n_cen = top_k = None
    if any(_has(f, n) for n in CENTROID_NAMES):
        names["centroids"] = _first(f, CENTROID_NAMES, path)
        names["token_ordering"] = _first(f, ORDERING_NAMES, path)
        n_cen = int(f.tensor(names["centroids"]).shape[0])
        top_k = int(hp.centroid_top_k or 32)
    rows = int(f.tensor("token_embd.weight").shape[0])
    if hp.n_vocab != rows:
        raise LayoutError("token_embd rows differ from the tokenizer's n_vocab", path=os.fspath(path),
                          key="token_embd.weight", expected=hp.n_vocab, actual=rows)
    dhp = DrafterHParams(
        arch=hp.arch, dialect=hp.dialect, n_embd=hp.n_embd, n_embd_backbone=hp.n_embd_backbone, n_vocab=rows,
        n_layer=hp.n_layer, n_head=tuple(ly.n_head for ly in hp.layers),
        n_head_kv=tuple(ly.n_head_kv for ly in hp.layers), n_ff=tuple(ly.n_ff for ly in hp.layers),
        is_swa=is_swa, head_dim=tuple(ly.head_dim for ly in hp.layers),
        n_rot=tuple(rot_swa if sw else rot_full for sw in is_swa),
        rope_base=tuple(base_swa if sw else base_full for sw in is_swa),
        sliding_window=int(cast(int, hp.sliding_window)),
        eps=number("attention.layer_norm_rms_epsilon", 1e-6),
        n_centroids=n_cen, centroid_top_k=top_k)
    return dhp, names


__all__ = [
    "DonorKV", "DrafterHParams", "DrafterWeights", "LayerWeights", "ReferenceDrafter", "ReferenceDrafterError",
    "StepOptions", "StepResult", "attention", "centroid_head", "gelu_tanh", "rms_norm",
    "rope_neox", "round_activations", "visible",
]
