"""Replay recorded draft steps with the numpy reference drafter (issue 7), plus the llama.cpp side
of the parity checks.

* :func:`prefill` runs the **target** once in llama.cpp over a token sequence and captures, with
  ``cb_eval`` (:class:`traces.llama_runtime.NodeCapture`), what the drafter reads from it: the K/V of
  the two donor layers (llama.cpp's rule, ``llama-model.cpp``: layer ``n_layer - 2`` for sliding
  attention, ``n_layer - 1`` for full attention; nodes ``Kcur_pos-{il}`` after ``attn_k_norm`` + RoPE
  and ``Vcur_normed-{il}``, ``src/models/gemma4.cpp``), the post-final-norm hidden per token
  (``llama_get_embeddings_nextn_ith``) and the pre-norm hidden (node ``l_out-{n_layer-1}``).
  K/V of positions ``< p`` depend only on the tokens before ``p`` (causal), so one prefill over the
  accepted tokens of a run gives what the target's cache held at every round.
* :func:`live_mtp_run` runs a real greedy MTP loop in llama.cpp (target + ``LLAMA_CONTEXT_TYPE_MTP``
  drafter context; every draft step of a round at the pending position, as llama.cpp's
  ``common/speculative.cpp`` does for shared-memory Gemma 4 assistants) and returns each step's
  inputs and llama.cpp outputs (``h_nextn``, logits argmax) for parity tests.
* :func:`replay` recomputes every recorded draft step of a trace under option variants.

Shapes are numpy order throughout.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inspector.errors import LayoutError, TraceError
from inspector.reference import DonorKV, ReferenceDrafter, StepOptions


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

    def kv_before(self, p: int) -> dict[str, DonorKV]:
        """Donor K/V of positions ``< p``: what the target's cache holds when the pending token is at ``p``."""
        return {k: v.upto(p) for k, v in self.kv.items()}


def donor_layers(target_gguf: str | os.PathLike[str]) -> dict[str, int]:
    """``{"sliding": n_layer - 2, "full": n_layer - 1}`` as llama.cpp shares them (``llama-model.cpp``).

    Raises:
        LayoutError: the target lacks ``{arch}.block_count`` or the two layers are not of the types
            llama.cpp assumes (its rule would then pair the drafter with the wrong cache).
    """
    from inspector.gguf import open_gguf

    f = open_gguf(target_gguf)
    arch = f.architecture or "gemma4"
    n = f.get(arch + ".block_count")
    if n is None:
        raise LayoutError("missing key", path=os.fspath(target_gguf), key=arch + ".block_count")
    n = int(n)
    pat = f.get(arch + ".attention.sliding_window_pattern")
    if pat is not None:
        swa = [bool(v) for v in pat.to_list()]
        if len(swa) == n and not (swa[n - 2] and not swa[n - 1]):
            raise LayoutError("llama.cpp's donor rule needs layer n_layer-2 sliding and n_layer-1 full",
                              path=os.fspath(target_gguf), key=arch + ".attention.sliding_window_pattern",
                              expected="[..., true, false]", actual=swa[-2:])
    return {"sliding": n - 2, "full": n - 1}


def prefill(target_gguf: str | os.PathLike[str], tokens: Sequence[int], *, n_batch: int = 256,
            n_threads: int | None = None) -> TargetPrefill:
    """Run the target over ``tokens`` (positions ``0..n-1``) in llama.cpp and capture the donor K/V.

    Flash attention off. Runs in chunks of ``n_batch`` tokens.

    Raises:
        RuntimeUnavailableError: llama-cpp-python missing.
        TraceError: llama.cpp could not load / decode, or a captured node is missing.
    """
    from traces import llama_runtime as rt

    layers = donor_layers(target_gguf)
    toks = np.asarray(list(tokens), dtype=np.int64)
    n = len(toks)
    if n == 0:
        raise TraceError("nothing to prefill", key="tokens", expected=">= 1 token", actual=0)
    model = rt.LlamaModel(target_gguf)
    n_last = model.n_layer - 1
    names = [f"Kcur_pos-{il}" for il in layers.values()] + [f"Vcur_normed-{il}" for il in layers.values()]
    names.append(f"l_out-{n_last}")
    cap = rt.NodeCapture(names)
    n_ctx = max(256, ((n + 255) // 256) * 256)
    ctx = rt.LlamaContext(model, n_ctx=n_ctx, n_batch=n_batch, capture=cap, flash_attn=False,
                          n_threads=n_threads, nextn=True, masked=False)
    batch = rt.TokenBatch(n_batch)
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


@dataclass(frozen=True)
class LiveStep:
    """One draft step of a live llama.cpp MTP run (inputs and llama.cpp's outputs)."""

    round: int
    k: int              # 1-based draft position
    pos: int            # position fed (the pending token's, for every k)
    token: int          # token fed
    h: np.ndarray       # (n_embd_backbone,) hidden fed
    draft: int          # llama.cpp's argmax
    h_next: np.ndarray  # (n_embd_backbone,) llama.cpp's h_nextn
    logits_top2: tuple[float, float]


@dataclass(frozen=True)
class LiveRun:
    """A live greedy MTP run: accepted tokens (prompt included) and every draft step."""

    tokens: list[int]
    n_prompt: int
    steps: list[LiveStep]
    rounds: list[dict[str, Any]]


def live_mtp_run(target_gguf: str | os.PathLike[str], drafter_gguf: str | os.PathLike[str],
                 prompt: Sequence[int], *, n_rounds: int = 20, n_draft: int = 3,
                 n_threads: int | None = None) -> LiveRun:
    """A greedy MTP loop in llama.cpp (flash attention off), returning every draft step.

    Round: the target's KV holds positions ``< p``; the pending token sits at ``p``. Each of the
    ``n_draft`` steps feeds (token, h) at position ``p`` (``common/speculative.cpp``, shared memory);
    the first h is the target's post-norm hidden at ``p - 1``, later ones the previous ``h_nextn``.
    The target verifies ``[pending, d1..dK]``; the longest matching prefix is kept and rejected cells
    are removed with ``llama_memory_seq_rm``.

    Raises:
        RuntimeUnavailableError / TraceError: as :mod:`traces.llama_runtime`.
    """
    from traces import llama_runtime as rt

    tm = rt.LlamaModel(target_gguf)
    dm = rt.LlamaModel(drafter_gguf)
    n_ctx = 512
    while n_ctx < len(prompt) + n_rounds * (n_draft + 1) + 8:
        n_ctx *= 2
    tctx = rt.LlamaContext(tm, n_ctx=n_ctx, n_batch=max(64, len(prompt)), flash_attn=False,
                           n_threads=n_threads, nextn=True, masked=False)
    dctx = rt.LlamaContext(dm, n_ctx=n_ctx, n_batch=8, mtp_of=tctx, flash_attn=False,
                           n_threads=n_threads, nextn=True, masked=True)
    tb = rt.TokenBatch(max(64, len(prompt)))
    db = rt.DraftBatch(dm.n_embd_inp)
    steps: list[LiveStep] = []
    rounds: list[dict[str, Any]] = []
    tokens = list(prompt)
    try:
        tb.set(list(prompt), 0, logits="all")
        tctx.decode(tb)
        h = np.array(tctx.nextn(len(prompt) - 1), dtype=np.float32)
        pending = int(np.argmax(tctx.logits(len(prompt) - 1)))
        for r in range(n_rounds):
            p = len(tokens)
            tok, hh, drafts = pending, h, []
            for k in range(1, n_draft + 1):
                db.set(tok, p, hh)
                dctx.decode(db)
                lg = np.array(dctx.logits(0), dtype=np.float32)
                top2 = np.sort(lg)[-2:]
                d = int(np.argmax(lg))
                hn = np.array(dctx.nextn(0), dtype=np.float32)
                steps.append(LiveStep(r, k, p, tok, hh.copy(), d, hn, (float(top2[1]), float(top2[0]))))
                drafts.append(d)
                tok, hh = d, hn
            verify = [pending] + drafts
            tb.set(verify, p, logits="all")
            tctx.decode(tb)
            tgt = [int(np.argmax(tctx.logits(i))) for i in range(len(verify))]
            n_acc = 0
            while n_acc < n_draft and drafts[n_acc] == tgt[n_acc]:
                n_acc += 1
            keep = [pending] + drafts[:n_acc]
            h = np.array(tctx.nextn(n_acc), dtype=np.float32)
            tokens += keep
            tctx.seq_rm(p + len(keep), -1)
            rounds.append({"round": r, "pos": p, "pending": pending, "drafted": drafts, "target": tgt,
                           "n_accepted": n_acc})
            pending = tgt[n_acc]
    finally:
        db.close()
        tb.close()
        dctx.close()
        tctx.close()
        dm.close()
        tm.close()
    return LiveRun(tokens=tokens, n_prompt=len(prompt), steps=steps, rounds=rounds)


__all__ = ["LiveRun", "LiveStep", "TargetPrefill", "donor_layers", "live_mtp_run", "prefill", "shape_kv",
           "StepOptions", "Path"]
