"""Typed records of one speculative-decoding round and one draft step.

These are what the recorder (``traces/run/recorder.py``) hands to :class:`traces.store.writer.TraceWriter`; the
on-disk columns are defined in ``traces/store/schema.py`` and documented in ``docs/TRACE_FORMAT.md``.

Vocabulary (same as llama.cpp): a *round* drafts ``n_draft`` tokens ``d1..dK`` from the pending token,
then the target verifies ``[pending, d1..dK]`` in one decode (``n_draft + 1`` rows); ``n_accepted`` is
the length of the longest accepted prefix; the round emits the accepted drafts plus the target's own
token at the first mismatch (or a bonus token when every draft matched).

Construction checks the invariants that every consumer relies on and raises
:class:`mtpscope.errors.TraceFormatError` (with expected vs actual) when one fails; no ``assert``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mtpscope.errors import TraceFormatError


def _int_tuple(name: str, values: Sequence[Any] | None, *, allow_none_items: bool = False) -> tuple[int | None, ...] | None:
    if values is None:
        return None
    out: list[int | None] = []
    for v in values:
        if v is None:
            if not allow_none_items:
                raise TraceFormatError("list holds a null", key=name, expected="int", actual=None)
            out.append(None)
        else:
            out.append(int(v))
    return tuple(out)


@dataclass(frozen=True)
class RoundRecord:
    """One draft + verify round.

    Attributes:
        prompt_id: which prompt (index into ``manifest["prompts"]``).
        round: 0-based round index within the prompt.
        pos: position (0-based, in tokens) of the pending token in the target's sequence.
        pending_token: the last accepted token id, fed to the drafter's first step.
        n_draft: number of tokens drafted this round (``== len(drafted)``).
        drafted: draft token ids ``d1..dK``.
        n_accepted: accepted drafts, ``0 <= n_accepted <= n_draft``.
        target: the target's argmax token at each of the ``n_draft + 1`` verify rows (row ``i`` is the
            target's prediction after ``[pending, d1..di]``), or ``None`` when unknown (imports).
            Individual items may be ``None``.
        emitted: tokens the round appended to the sequence (accepted drafts + the target's correction or
            bonus token), or ``None`` when unknown.
        t_draft_ms: wall time of all draft steps of the round, milliseconds (``None`` if unknown).
        t_verify_ms: wall time of the target's verify decode, milliseconds (``None`` if unknown).
        draft_path: fork NDJSON ``path`` field (``sync``, ``lazy``, ``skip-streak``, ...), else ``None``.
        h_l2: fork NDJSON ``h_l2`` field (L2 norm of the hidden state fed to the drafter), else ``None``.
        eog_confirmed: draft ``n_accepted + 1`` is an end-of-generation token the target chose too; llama.cpp
            counts it as the target's token, not in ``n_accepted``, unless it is the round's last draft
            (``common_sampler_sample_and_accept_n``); ``None`` when unknown (older traces, imports).

    Raises:
        TraceFormatError: ``n_draft != len(drafted)``, ``n_accepted`` out of ``[0, n_draft]``,
            ``target`` not of length ``n_draft + 1``, negative ``prompt_id`` / ``round``.
    """

    prompt_id: int
    round: int
    pos: int
    pending_token: int
    n_draft: int
    drafted: tuple[int, ...]
    n_accepted: int
    target: tuple[int | None, ...] | None = None
    emitted: tuple[int, ...] | None = None
    t_draft_ms: float | None = None
    t_verify_ms: float | None = None
    draft_path: str | None = None
    h_l2: float | None = None
    eog_confirmed: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "drafted", _int_tuple("drafted", self.drafted) or ())
        object.__setattr__(self, "target", _int_tuple("target", self.target, allow_none_items=True))
        object.__setattr__(self, "emitted", _int_tuple("emitted", self.emitted))
        if self.prompt_id < 0 or self.round < 0:
            raise TraceFormatError("negative prompt_id or round", key="prompt_id/round",
                                   expected=">= 0", actual=(self.prompt_id, self.round))
        if self.n_draft != len(self.drafted):
            raise TraceFormatError("n_draft does not match len(drafted)", key="n_draft",
                                   expected=len(self.drafted), actual=self.n_draft)
        if not 0 <= self.n_accepted <= self.n_draft:
            raise TraceFormatError("n_accepted out of range", key="n_accepted",
                                   expected=f"0..{self.n_draft}", actual=self.n_accepted)
        if self.target is not None and len(self.target) != self.n_draft + 1:
            raise TraceFormatError("target must have one token per verify row", key="target",
                                   expected=self.n_draft + 1, actual=len(self.target))


def _as_f32_vector(name: str, value: Any) -> np.ndarray | None:
    if value is None:
        return None
    arr = np.asarray(value, dtype=np.float32)
    if arr.ndim != 1:
        raise TraceFormatError("hidden state must be a 1-D vector", key=name,
                               expected="shape (dim,)", actual=f"shape {arr.shape}")
    return arr


@dataclass(frozen=True, eq=False)
class StepRecord:
    """One draft step (draft position ``k`` of a round). ``prompt_id`` / ``round`` come from the round.

    Attributes:
        k: 1-based draft position within the round.
        token: the drafted token id (argmax of the drafter's head when greedy).
        logit: the drafter's logit of ``token``.
        rank: rank of ``token`` among the drafter's logits (0 = best; 0 for greedy drafts).
        top_ids: the drafter's top token ids, best first (length chosen by the recorder).
        top_logits: their logits, same order.
        target_token: the target's token at verify row ``k - 1`` (what ``token`` is compared with), or
            ``None`` if unknown.
        target_rank: rank of ``target_token`` among the drafter's logits (0 = best), or ``None``.
        accepted: whether this draft was accepted (``k <= n_accepted``), ``None`` if unknown.
        h: hidden state fed to this step, shape ``(n_embd_backbone,)``, float32, or ``None``.
        h_next: the step's post-projection output, shape ``(n_embd_backbone,)``, or ``None``.
        h_inner: the drafter's final-norm output, shape ``(n_embd,)``, or ``None``.
        centroid_ids: top-k centroid ids of the sparse head, best first (``None`` without centroid head).
        centroid_logits: their logits.
        centroid_token: argmax token of the sparse (centroid) head.
        target_in_candidates: whether ``target_token`` was among the sparse head's candidate tokens.
        target_centroid: the centroid whose ordering row holds ``target_token``.
        target_centroid_rank: rank of ``target_centroid`` among all centroids (0 = best).
        target_p_drafted: the target's probability of ``token`` at verify row ``k - 1`` (softmax of its
            logits at temperature 1), or ``None``.
        target_entropy: the target's entropy at that row, nats, or ``None``.
        h_target: the target's own hidden state at verify row ``k - 1`` (the ``nextn`` row ``h_next``
            stands in for), shape ``(n_embd_backbone,)``, or ``None``.

    Raises:
        TraceFormatError: ``k < 1``, a hidden state that is not 1-D, top lists of different lengths.
    """

    k: int
    token: int
    logit: float | None = None
    rank: int | None = None
    top_ids: tuple[int, ...] | None = None
    top_logits: tuple[float, ...] | None = None
    target_token: int | None = None
    target_rank: int | None = None
    accepted: bool | None = None
    h: np.ndarray | None = field(default=None, repr=False)
    h_next: np.ndarray | None = field(default=None, repr=False)
    h_inner: np.ndarray | None = field(default=None, repr=False)
    centroid_ids: tuple[int, ...] | None = None
    centroid_logits: tuple[float, ...] | None = None
    centroid_token: int | None = None
    target_in_candidates: bool | None = None
    target_centroid: int | None = None
    target_centroid_rank: int | None = None
    target_p_drafted: float | None = None
    target_entropy: float | None = None
    h_target: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.k < 1:
            raise TraceFormatError("draft position k is 1-based", key="k", expected=">= 1", actual=self.k)
        object.__setattr__(self, "top_ids", _int_tuple("top_ids", self.top_ids))
        object.__setattr__(self, "centroid_ids", _int_tuple("centroid_ids", self.centroid_ids))
        if self.top_logits is not None:
            object.__setattr__(self, "top_logits", tuple(float(x) for x in self.top_logits))
        if self.centroid_logits is not None:
            object.__setattr__(self, "centroid_logits", tuple(float(x) for x in self.centroid_logits))
        for a, b in (("top_ids", "top_logits"), ("centroid_ids", "centroid_logits")):
            va, vb = getattr(self, a), getattr(self, b)
            if va is not None and vb is not None and len(va) != len(vb):
                raise TraceFormatError(f"{a} and {b} differ in length", key=b,
                                       expected=len(va), actual=len(vb))
        for name in ("h", "h_next", "h_inner", "h_target"):
            object.__setattr__(self, name, _as_f32_vector(name, getattr(self, name)))
