"""A live greedy MTP loop in llama.cpp that returns every draft step's inputs and outputs, for the
parity tests (reference drafter vs llama.cpp): :func:`live_mtp_run` -> :class:`LiveRun`.

Target + ``LLAMA_CONTEXT_TYPE_MTP`` drafter context; every draft step of a round at the pending
position, as llama.cpp's ``common/speculative.cpp`` does for shared-memory Gemma 4 assistants. Unlike
:class:`traces.run.mtp_runtime.MtpRuntime` (the recorder's loop) it runs a fixed number of rounds, never
stops at an end-of-generation token, and keeps each step's fed ``(token, h)`` and llama.cpp's
``h_nextn`` / logits argmax rather than trace records.

Shapes are numpy order throughout.

Imports: numpy, traces.run.llama.model (inside :func:`live_mtp_run`), traces.run.ranking, traces.run.record_config (``DEFAULT_N_DRAFT``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mtpscope.traces.run.ranking import top_k_desc
from mtpscope.traces.run.record_config import DEFAULT_N_DRAFT


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
                 prompt: Sequence[int], *, n_rounds: int = 20, n_draft: int = DEFAULT_N_DRAFT,
                 n_threads: int | None = None) -> LiveRun:
    """A greedy MTP loop in llama.cpp (flash attention off), returning every draft step.

    Round: the target's KV holds positions ``< p``; the pending token sits at ``p``. Each of the
    ``n_draft`` steps feeds (token, h) at position ``p`` (``common/speculative.cpp``, shared memory);
    the first h is the target's post-norm hidden at ``p - 1``, later ones the previous ``h_nextn``.
    The target verifies ``[pending, d1..dK]``; the longest matching prefix is kept and rejected cells
    are removed with ``llama_memory_seq_rm``.

    Raises:
        RuntimeUnavailableError / TraceError: as :mod:`traces.run.llama.model`.
    """
    from mtpscope.traces.run.llama.model import DraftBatch, LlamaContext, LlamaModel, TokenBatch

    tm = LlamaModel(target_gguf)
    dm = LlamaModel(drafter_gguf)
    n_ctx = 512
    while n_ctx < len(prompt) + n_rounds * (n_draft + 1) + 8:
        n_ctx *= 2
    tctx = LlamaContext(tm, n_ctx=n_ctx, n_batch=max(64, len(prompt)), flash_attn=False,
                        n_threads=n_threads, nextn=True, masked=False)
    dctx = LlamaContext(dm, n_ctx=n_ctx, n_batch=8, mtp_of=tctx, flash_attn=False,
                        n_threads=n_threads, nextn=True, masked=True)
    tb = TokenBatch(max(64, len(prompt)))
    db = DraftBatch(dm.n_embd_inp)
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
                top2 = lg[top_k_desc(lg, 2)]
                d = int(np.argmax(lg))
                hn = np.array(dctx.nextn(0), dtype=np.float32)
                steps.append(LiveStep(r, k, p, tok, hh.copy(), d, hn, (float(top2[0]), float(top2[1]))))
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


__all__ = ["LiveRun", "LiveStep", "live_mtp_run"]
