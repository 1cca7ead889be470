"""Per-step scoring with the sparse centroid LM head of a Gemma 4 assistant drafter, next to the dense head.

Upstream llama.cpp always drafts with the dense head (``logits = token_embd · h_inner``). Fork-dialect
GGUFs and Hugging Face checkpoints also carry a centroid head; this module computes, per draft step,
what that head would have chosen, from the drafter's ``h_inner`` (the ``result_norm`` node).

Math (gemma4-assistant facts §3.5; Hugging Face ``Gemma4AssistantForCausalLM`` masked embedding):
``c = centroids · h_inner`` (shape (n_centroids,)); ``top = top_k(c, k)``; the token ordering, viewed
as n_centroids rows of ``vsc = n_vocab / n_centroids`` token ids, gives the candidates (rows ``top``,
k·vsc ids); the candidates' logits are ``token_embd[ids] · h_inner`` - exactly the dense logits at
those ids, since both heads share the drafter's tied ``token_embd`` - and every other token is masked
out; the sparse draft is the argmax.

The head itself (data, loading from a fork / sidecar GGUF or a Hugging Face checkpoint, checks) is
:class:`inspector.centroids.CentroidHead`; ``CentroidHead``, ``DEFAULT_TOP_K``, ``head_from_arrays``,
``head_from_gguf`` and ``load_centroid_head`` are re-exported from there. Top-k and ranks follow
:mod:`traces.run.ranking` (best first, ties by lower id; rank = strictly greater logits).

Imports: numpy, mtpscope.errors, inspector.centroids, traces.run.ranking.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mtpscope.errors import LayoutError
from mtpscope.inspector.centroids import (
    DEFAULT_TOP_K,
    CentroidHead,
    head_from_arrays,
    head_from_gguf,
    load_centroid_head,
)
from mtpscope.traces.run.ranking import rank, top_k_desc


@dataclass(frozen=True)
class CentroidStep:
    """What the centroid head makes of one h_inner.

    Attributes:
        centroid_ids: int32 (top_k,), best first (ties: lower id first).
        centroid_logits: float32 (top_k,), ``centroids[id] · h_inner``.
        candidate_ids: int32 (top_k·vsc,), the ordering rows of ``centroid_ids`` in that order.
        centroid_token: argmax of the sparse head over the candidates (ties: lowest token id), or None
            when no dense logits were given.
        target_in_candidates: whether the target's token is a candidate (None without a target token).
        target_centroid: the centroid whose row holds the target's token (None if unknown / absent).
        target_centroid_rank: rank of that centroid among all centroids by logit (0 = best; ties count
            only strictly greater logits).
    """

    centroid_ids: np.ndarray
    centroid_logits: np.ndarray
    candidate_ids: np.ndarray
    centroid_token: int | None
    target_in_candidates: bool | None
    target_centroid: int | None
    target_centroid_rank: int | None


def centroid_step(head: CentroidHead, h_inner: np.ndarray, *, dense_logits: np.ndarray | None = None,
                  target_token: int | None = None) -> CentroidStep:
    """Score one h_inner with the centroid head (formula in the module docstring).

    Args:
        h_inner: shape (n_embd,), the drafter's ``result_norm`` output for this step.
        dense_logits: shape (n_vocab,), the drafter's dense logits for the same step (they equal
            ``token_embd · h_inner``); needed for ``centroid_token``.
        target_token: the target's token at this position, if known.
    """
    h = np.asarray(h_inner, dtype=np.float32).reshape(1, -1)
    lg = None if dense_logits is None else [dense_logits]
    return centroid_steps(head, h, dense_logits=lg, target_tokens=[target_token])[0]


def centroid_steps(head: CentroidHead, h_inner: np.ndarray, *,
                   dense_logits: np.ndarray | Sequence[np.ndarray] | None = None,
                   target_tokens: Sequence[int | None] | None = None,
                   dense_top: Sequence[np.ndarray] | None = None) -> list[CentroidStep]:
    """:func:`centroid_step` for several steps at once (one matrix product; used per round).

    Args:
        head: a head checked by :meth:`inspector.centroids.CentroidHead.ready` (what ``load_centroid_head``
            / ``head_from_gguf`` / ``head_from_arrays`` return); one without top_k uses min(32, n_centroids).
        h_inner: shape (n_steps, n_embd).
        dense_logits: shape (n_steps, n_vocab) (or a sequence of n_steps vectors), or None.
        target_tokens: one target token (or None) per step, or None.
        dense_top: per step, the best ids of ``dense_logits`` (:func:`traces.run.ranking.top_k_desc`: best
            first, ties by the lower id: a prefix of that order over the whole vocabulary), when at hand. The
            sparse head's token is then the first of them that is a candidate; only when none is are the
            candidates' logits gathered. Same result, without reading ``k * vsc`` scattered logits per step.
    """
    hs = np.asarray(h_inner, dtype=np.float32)
    if hs.ndim != 2 or hs.shape[1] != head.n_embd:
        raise LayoutError("h_inner must have shape (n_steps, n_embd)", key="h_inner",
                          expected=f"(n, {head.n_embd})", actual=f"shape {hs.shape}")
    n = hs.shape[0]
    k = head.top_k if head.top_k is not None else min(DEFAULT_TOP_K, head.n_centroids)
    # both operands C-contiguous: numpy 2.4 takes a ~50x slower path for a transposed (F-ordered) operand
    c = np.ascontiguousarray((head.centroids @ np.ascontiguousarray(hs.T)).T)   # (n, n_centroids)
    rows = head.ordering.reshape(head.n_centroids, head.vsc)
    lg = None if dense_logits is None else [np.asarray(x).reshape(-1) for x in dense_logits]
    tts = list(target_tokens) if target_tokens is not None else [None] * n
    out: list[CentroidStep] = []
    for i in range(n):
        ci = c[i]
        top = top_k_desc(ci, k).astype(np.int32)
        cand = rows[top].reshape(-1)
        token: int | None = None
        if lg is not None:
            token = _first_candidate(head, top, dense_top[i]) if dense_top is not None else None
            if token is None:
                vals = lg[i][cand]
                token = int(cand[vals == vals.max()].min())
        tin: bool | None = None
        tc: int | None = None
        tcr: int | None = None
        t = tts[i]
        if t is not None and 0 <= int(t) < head.n_vocab:
            cid = int(head.token_centroid[int(t)])
            if cid >= 0:
                tc = cid
                tcr = rank(ci, cid)
                tin = bool(cid in top)
            else:
                tin = False
        out.append(CentroidStep(centroid_ids=top, centroid_logits=ci[top].astype(np.float32), candidate_ids=cand,
                                centroid_token=token, target_in_candidates=tin, target_centroid=tc,
                                target_centroid_rank=tcr))
    return out


def _first_candidate(head: CentroidHead, top: np.ndarray, best: np.ndarray) -> int | None:
    """The first id of ``best`` whose centroid is in ``top``, or None when none is. ``best`` is a prefix of
    the order (logit descending, then id ascending) over the whole vocabulary, so its first candidate is
    the first candidate in that order: the sparse head's argmax, ties by the lowest id."""
    if best.shape[0] == 0:
        return None
    chosen = np.zeros(head.n_centroids + 1, dtype=bool)   # the last entry: -1, a token in no centroid's row
    chosen[top] = True
    hit = np.flatnonzero(chosen[head.token_centroid[best]])
    return int(best[hit[0]]) if hit.shape[0] else None


__all__ = ["DEFAULT_TOP_K", "CentroidHead", "CentroidStep", "centroid_step", "centroid_steps", "head_from_arrays",
           "head_from_gguf", "load_centroid_head"]
