"""What the drafter reads from the target, captured from one llama.cpp prefill: :func:`prefill` ->
:class:`TargetPrefill` (used by the replay and the parity tests).

:func:`prefill` runs the **target** once in llama.cpp over a token sequence and captures, with
``cb_eval`` (:class:`traces.run.llama.capture.NodeCapture`), the K/V of the two donor layers
(:func:`donor_layers`, llama.cpp's rule, ``llama-model.cpp``: layer ``n_layer - 2`` for sliding
attention, ``n_layer - 1`` for full attention; nodes ``Kcur_pos-{il}`` after ``attn_k_norm`` + RoPE
and ``Vcur_normed-{il}``, ``src/models/gemma4.cpp``), the post-final-norm hidden per token
(``llama_get_embeddings_nextn_ith``) and the pre-norm hidden (node ``l_out-{n_layer-1}``).
K/V of positions ``< p`` depend only on the tokens before ``p`` (causal), so one prefill over the
accepted tokens of a run gives what the target's cache held at every round. :func:`shape_kv` reshapes
the K/V to the drafter's heads.

Shapes are numpy order throughout.

Imports: numpy, mtpscope.errors, inspector.gguf, inspector.reference (DonorKV, ReferenceDrafter),
traces.run.llama (capture, model; inside :func:`prefill`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mtpscope.errors import LayoutError, TraceError
from mtpscope.inspector.reference import DonorKV, ReferenceDrafter


@dataclass(frozen=True)
class TargetPrefill:
    """What one llama.cpp prefill of the target exposes to the drafter.

    Attributes:
        tokens: ``(n,)`` int token ids at positions ``0..n-1``.
        kv: ``{"sliding": DonorKV, "full": DonorKV}`` over all ``n`` positions (float32; llama.cpp's
            cache holds them as F16 by default: use ``StepOptions(kv_f16=True)`` to match).
        h_post: ``(n, n_embd_backbone)`` target hidden after the final norm, per position.
        h_pre: ``(n, n_embd_backbone)`` target hidden before the final norm (``l_out`` of the last layer).
        argmax: ``(n,)`` the target's greedy next token after each position.
        donor_layers: ``{"sliding": il, "full": il}`` target layers the K/V come from.
    """

    tokens: np.ndarray
    kv: dict[str, DonorKV]
    h_post: np.ndarray
    h_pre: np.ndarray
    argmax: np.ndarray
    donor_layers: dict[str, int] = field(default_factory=dict)

    def kv_before(self, p: int, f16: bool = False) -> dict[str, DonorKV]:
        """Donor K/V of positions ``< p``: what the target's cache holds when the pending token is at ``p``.

        ``f16``: rounded to F16 (llama.cpp's default cache type), computed once and cached.
        """
        src = self.kv
        if f16:
            cache = self.__dict__.setdefault("_kv16", {})
            if not cache:
                cache.update({k: v.rounded_f16() for k, v in self.kv.items()})
            src = cache
        return {k: v.upto(p) for k, v in src.items()}


def donor_layers(target_gguf: str | os.PathLike[str]) -> dict[str, int]:
    """``{"sliding": n_layer - 2, "full": n_layer - 1}`` as llama.cpp shares them (``llama-model.cpp``,
    the drafter's ``share`` rule), mapped through the target's own KV reuse when it has
    ``attention.shared_kv_layers``. Read once per file version (path, size, mtime): a replay prefills every
    prompt of a trace and the target's header (a 262144-token vocabulary) takes a third of a second to walk.

    Raises:
        LayoutError: the target lacks ``{arch}.block_count`` or the two layers are not of the types
            llama.cpp assumes (its rule would then pair the drafter with the wrong cache).
    """
    st = os.stat(target_gguf)
    return dict(_donor_layers(os.fspath(target_gguf), st.st_size, st.st_mtime_ns))


@functools.lru_cache(maxsize=8)
def _donor_layers(target_gguf: str, size: int, mtime_ns: int) -> tuple[tuple[str, int], ...]:
    from mtpscope.inspector.gguf import open_gguf
    from mtpscope.inspector.layouts import read_hparams

    with open_gguf(target_gguf) as f:
        hp = read_hparams(f)
    n = hp.n_layer
    if n < 2 or not (hp.layers[n - 2].sliding and not hp.layers[n - 1].sliding):
        raise LayoutError("llama.cpp's donor rule needs layer n_layer-2 sliding and n_layer-1 full",
                          path=os.fspath(target_gguf), key=hp.arch + ".attention.sliding_window_pattern",
                          expected="[..., true, false]", actual=[ly.sliding for ly in hp.layers[-2:]])
    # targets whose last layers reuse earlier caches (E2B / E4B): the drafter then reads that layer's cache,
    # and that layer's K/V nodes are the ones to capture (layouts.HParams.kv_owner, llama.cpp's ``reuse``)
    return (("sliding", hp.kv_owner(n - 2)), ("full", hp.kv_owner(n - 1)))


def prefill(target_gguf: str | os.PathLike[str], tokens: Sequence[int], *, n_batch: int = 256,
            n_threads: int | None = None, model: Any = None) -> TargetPrefill:
    """Run the target over ``tokens`` (positions ``0..n-1``) in llama.cpp and capture the donor K/V.

    Flash attention off. Runs in chunks of ``n_batch`` tokens. ``model``: an already loaded
    :class:`traces.run.llama.model.LlamaModel` of ``target_gguf`` (not closed here); else it is loaded.

    Raises:
        RuntimeUnavailableError: llama-cpp-python missing.
        TraceError: llama.cpp could not load / decode, or a captured node is missing.
    """
    from mtpscope.traces.run.llama.capture import NodeCapture
    from mtpscope.traces.run.llama.model import LlamaContext, LlamaModel, TokenBatch

    layers = donor_layers(target_gguf)
    toks = np.asarray(list(tokens), dtype=np.int64)
    n = len(toks)
    if n == 0:
        raise TraceError("nothing to prefill", key="tokens", expected=">= 1 token", actual=0)
    own_model = model is None
    if own_model:
        model = LlamaModel(target_gguf)
    n_last = model.n_layer - 1
    names = [f"Kcur_pos-{il}" for il in layers.values()] + [f"Vcur_normed-{il}" for il in layers.values()]
    names.append(f"l_out-{n_last}")
    cap = NodeCapture(names)
    n_ctx = max(256, ((n + 255) // 256) * 256)
    ctx = LlamaContext(model, n_ctx=n_ctx, n_batch=n_batch, capture=cap, flash_attn=False,
                       n_threads=n_threads, nextn=True, masked=False)
    batch = TokenBatch(n_batch)
    parts: dict[str, list[np.ndarray]] = {nm: [] for nm in names}
    h_post, argmax = [], []
    try:
        for s in range(0, n, n_batch):
            chunk = toks[s:s + n_batch]
            batch.set(chunk.tolist(), s, logits="all")
            cap.reset()
            ctx.decode(batch)
            for nm in names:
                arr = cap.get(nm)
                if arr is None:
                    raise TraceError("cb_eval did not capture a target node", path=target_gguf, key=nm)
                parts[nm].append(np.array(arr, dtype=np.float32).reshape(len(chunk), -1))
            for i in range(len(chunk)):
                h_post.append(np.array(ctx.nextn(i), dtype=np.float32))
                argmax.append(int(np.argmax(ctx.logits(i))))
    finally:
        batch.close()
        ctx.close()
        if own_model:
            model.close()
    kv = {}
    pos = np.arange(n)
    for kind, il in layers.items():
        k = np.concatenate(parts[f"Kcur_pos-{il}"])
        v = np.concatenate(parts[f"Vcur_normed-{il}"])
        kv[kind] = DonorKV(k=k, v=v, pos=pos)  # reshaped below once head dims are known
    return TargetPrefill(tokens=toks, kv=kv, h_post=np.stack(h_post), h_pre=np.concatenate(parts[f"l_out-{n_last}"]),
                         argmax=np.asarray(argmax), donor_layers=layers)


def shape_kv(pre: TargetPrefill, drafter: ReferenceDrafter) -> TargetPrefill:
    """``pre`` with its K/V reshaped to ``(n, n_head_kv, head_dim)`` per the drafter's hparams.

    Raises:
        LayoutError: the captured widths do not match the drafter's KV head dims.
    """
    hp = drafter.hp
    out = {}
    for kind, d in pre.kv.items():
        il = next((i for i, s in enumerate(hp.is_swa) if s == (kind == "sliding")), None)
        if il is None:
            continue
        hd = hp.head_dim[il]
        width = d.k.reshape(len(d.pos), -1).shape[1]
        if width % hd:
            raise LayoutError("target K width is not a multiple of the drafter's head dim", key=f"{kind} kv",
                              expected=f"multiple of {hd}", actual=width)
        out[kind] = DonorKV(k=d.k.reshape(len(d.pos), width // hd, hd), v=d.v.reshape(len(d.pos), width // hd, hd),
                            pos=d.pos)
    return TargetPrefill(tokens=pre.tokens, kv=out, h_post=pre.h_post, h_pre=pre.h_pre, argmax=pre.argmax,
                         donor_layers=pre.donor_layers)


__all__ = ["TargetPrefill", "donor_layers", "prefill", "shape_kv"]
