"""Turning drafter outputs into trace records: per-step logit summaries (draft logit and rank, top-n
candidates, the target token's rank), centroid-head scoring, and the ``RoundRecord`` / ``StepRecord``
of a recorded round.

:func:`summarize_logits` is the analysis the recorder and the replay share (a replayed step is
summarized exactly like a recorded one; the recording worker summarizes its steps before it sends a round,
:func:`summarize_drafts`); :func:`step_records` / :func:`round_record` turn a
:class:`traces.run.mtp_runtime.RoundResult` into what :class:`traces.store.writer.TraceWriter` stores (hidden
states stay float32 here; the writer converts them to the trace's f16 / f32).

Imports: numpy, traces.store.records, traces.run.ranking, traces.run.centroid_head, traces.run.derived (and, for
types only, traces.run.mtp_runtime and inspector.centroids).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from mtpscope.errors import TraceError
from mtpscope.traces.run.centroid_head import centroid_steps
from mtpscope.traces.run.derived import logit_row_ids
from mtpscope.traces.run.ranking import rank, top_k_desc
from mtpscope.traces.store.records import RoundRecord, StepRecord

if TYPE_CHECKING:
    from mtpscope.inspector.centroids import CentroidHead
    from mtpscope.traces.run.derived import HInnerSolver
    from mtpscope.traces.run.mtp_runtime import RoundResult


@dataclass(frozen=True)
class LogitSummary:
    """What the trace keeps of one step's dense logits.

    Attributes:
        logit: the draft's logit.
        rank: the draft's rank (:func:`traces.run.ranking.rank`; 0 = best).
        top_ids: the ``n_top`` best token ids, best first, ties by lower id.
        top_logits: their logits, same order.
        target_rank: rank of the target's token, or None when no target token is known.
    """

    logit: float
    rank: int
    top_ids: tuple[int, ...]
    top_logits: tuple[float, ...]
    target_rank: int | None


def draft_logit(logits: np.ndarray, token: int, where: str = "") -> float:
    """The drafted ``token``'s logit in ``logits`` (``(n_vocab,)``), checked finite (``where``: the step, for the
    message).

    Raises:
        IndexError: ``token`` out of range.
        TraceError: it is NaN or infinite: the drafter computed non-finite logits (its weights or its input hold
            NaN / Inf; ``mtpscope verify`` names a tensor that holds them), so no rank, top list or agreement of that
            step means anything.
    """
    lt = float(logits[token])
    if not np.isfinite(lt):
        raise TraceError(f"the drafter's logits are not finite{' at ' + where if where else ''}: its weights or its "
                         "input hold NaN or Inf (`mtpscope verify` names a tensor that holds them)",
                         key=f"logits[{int(token)}]", expected="a finite logit for the drafted token", actual=lt)
    return lt


def summarize_logits(logits: np.ndarray, token: int, *, target: int | None = None,
                     n_top: int = 10, top: np.ndarray | None = None, where: str = "") -> LogitSummary:
    """Summarize one step's dense logits (``(n_vocab,)``) for the draft ``token`` and, when known, the
    target's token ``target``.

    ``top``: the ``n_top`` best ids (``top_k_desc(logits, n_top)``) when they are known already (the
    recording worker finds them while it copies the row: ``DraftStep.top_ids``); then the row is read only
    where a rank needs it (a token outside that list). ``where``: the step, for the error's message.

    Raises:
        IndexError: ``token`` or ``target`` out of range.
        TraceError: the drafted token's logit is not finite (:func:`draft_logit`).
    """
    lt = draft_logit(logits, token, where)
    if top is None or top.shape[0] != min(n_top, logits.shape[0]):
        top = top_k_desc(logits, n_top)
    ids: list[int] = top.tolist()
    vals: list[float] = logits[top].tolist()
    return LogitSummary(logit=lt, rank=rank(logits, token, top, listed=(ids, vals)),
                        top_ids=tuple(ids), top_logits=tuple(vals),
                        target_rank=None if target is None else rank(logits, target, top, listed=(ids, vals)))


def step_targets(res: RoundResult) -> list[int | None]:
    """The target's token at each draft step of ``res`` (verify row ``k`` judges draft ``k``; None past the rows
    sampled)."""
    return [res.target[k] if k < len(res.target) else None for k in range(len(res.steps))]


@functools.lru_cache(maxsize=8)
def _row_ids(n_vocab: int, n_embd: int) -> np.ndarray:
    ids = logit_row_ids(n_vocab, n_embd)
    ids.flags.writeable = False
    return ids


def summarize_drafts(res: RoundResult, *, n_top: int, n_embd: int) -> RoundResult:
    """``res`` with each step's dense logits replaced by what the trace keeps of them: the step's
    :class:`LogitSummary` (:func:`summarize_logits`, the target's token of its verify row known now) in
    ``DraftStep.summary``, and the logits a derived ``h_inner`` reads (:func:`traces.run.derived.logit_row_ids` of the
    drafter's ``n_vocab`` and ``n_embd``, a copy) in ``DraftStep.logit_rows``; ``logits`` and ``top_ids`` become None.

    The recording worker calls it before it sends a round, so the drafter rows (``float32[n_vocab]`` each: 1 MiB at
    Gemma 4's vocabulary) stay in its own buffers, reused every round, and never cross to the recorder. Steps without
    logits are kept as they are. :func:`step_records` and :func:`derive_h_inner_rounds` take either form and give the
    same records.

    Raises:
        IndexError: a draft or target token outside the vocabulary.
    """
    targets = step_targets(res)
    steps = []
    for k, s in enumerate(res.steps):
        lg = s.logits
        if lg is None:
            steps.append(s)
            continue
        sm = summarize_logits(lg, s.token, target=targets[k], n_top=n_top, top=s.top_ids,
                              where=f"round {res.round}, draft {k + 1}")
        steps.append(replace(s, logits=None, top_ids=None, summary=sm,
                             logit_rows=lg[_row_ids(int(lg.shape[0]), int(n_embd))]))
    return replace(res, steps=tuple(steps))


def derive_h_inner(res: RoundResult, solver: HInnerSolver) -> list[np.ndarray | None]:
    """Each step's ``h_inner``: the captured one, or derived by ``solver`` (:mod:`traces.run.derived`) from
    the step's logits and ``h_next`` where it was not captured (None where those are missing too)."""
    return derive_h_inner_rounds([res], solver)[0]


def derive_h_inner_rounds(rounds: Sequence[RoundResult], solver: HInnerSolver) -> list[list[np.ndarray | None]]:
    """:func:`derive_h_inner` of several rounds with one solve: one ``(n_steps, m) @ (m, n_embd)`` product for
    all their steps, so the solve's matrix (``m x n_embd`` float32: 11.5 MB for the 26B-A4B drafter, more than a
    core's cache) is read once, not once per round. Per round, its steps' ``h_inner`` in step order."""
    out: list[list[np.ndarray | None]] = []
    # the steps to solve, by the form of their logits: dense rows, or the solve's own ids only (summarize_drafts)
    todo: dict[bool, tuple[list[np.ndarray], list[np.ndarray], list[tuple[int, int]]]] = {}
    for r, res in enumerate(rounds):
        row: list[np.ndarray | None] = []
        for i, s in enumerate(res.steps):
            row.append(s.h_inner)
            lg, gathered = (s.logits, False) if s.logits is not None else (s.logit_rows, True)
            if s.h_inner is None and lg is not None and s.h_next is not None:
                logits, h_next, where = todo.setdefault(gathered, ([], [], []))
                logits.append(lg)
                h_next.append(s.h_next)
                where.append((r, i))
        out.append(row)
    for gathered, (logits, h_next, where) in todo.items():
        got = solver.solve(logits, h_next, gathered=gathered)
        for j, (r, i) in enumerate(where):
            out[r][i] = got[j]
    return out


def step_records(res: RoundResult, *, n_top: int = 10, hidden: str = "f16",
                 head: CentroidHead | None = None, solver: HInnerSolver | None = None,
                 inner: Sequence[np.ndarray | None] | None = None) -> list[StepRecord]:
    """Per-step trace records of one round (see :func:`traces.run.recorder.record` for the fields).

    Args:
        res: a round run with ``trace=True`` (its ``steps`` carry the raw data).
        n_top: drafter candidates kept per step.
        hidden: ``"off"`` drops the hidden states (``h_target`` too); any other value keeps them (float32 here).
        head: a centroid head checked by :meth:`~inspector.centroids.CentroidHead.ready`, or None; its
            columns are filled only when every step has ``h_inner``.
        solver: derives ``h_inner`` from the logits and ``h_next`` of steps that carry no captured one
            (:func:`derive_h_inner`); None keeps only captured values.
        inner: each step's ``h_inner`` already derived (:func:`derive_h_inner_rounds`, for several rounds at
            once); ``solver`` is then not used.
    """
    out: list[StepRecord] = []
    keep_h = hidden != "off"
    steps = res.steps
    targets = step_targets(res)
    if inner is None:
        inner = derive_h_inner(res, solver) if solver is not None else [s.h_inner for s in steps]
    summaries = [s.summary if s.summary is not None else
                 None if s.logits is None else summarize_logits(s.logits, s.token, target=targets[k], n_top=n_top,
                                                                top=s.top_ids)
                 for k, s in enumerate(steps)]
    cs_all = None
    known = [h for h in inner if h is not None]
    if head is not None and steps and len(known) == len(inner):
        lgs = [lg for s in steps if (lg := s.logits) is not None]
        logits = lgs if len(lgs) == len(steps) else None
        tops = ([np.asarray(sm.top_ids, dtype=np.int64) for sm in summaries if sm is not None]
                if logits is not None else None)
        cs_all = centroid_steps(head, np.stack(known), dense_logits=logits, target_tokens=targets, dense_top=tops)
    p_d, ent, h_t = res.target_p_drafted, res.target_entropy, res.h_target
    for k, s in enumerate(steps, start=1):
        tt = targets[k - 1]
        kw: dict[str, Any] = {}
        if cs_all is not None:
            cs = cs_all[k - 1]
            kw = {"centroid_ids": cs.centroid_ids.tolist(), "centroid_logits": cs.centroid_logits.tolist(),
                  "centroid_token": cs.centroid_token, "target_in_candidates": cs.target_in_candidates,
                  "target_centroid": cs.target_centroid, "target_centroid_rank": cs.target_centroid_rank}
        if k <= len(p_d):
            kw.update(target_p_drafted=p_d[k - 1], target_entropy=ent[k - 1])
        if keep_h and k <= len(h_t):
            kw["h_target"] = h_t[k - 1]
        ls = summaries[k - 1]
        if ls is not None:
            kw.update(logit=ls.logit, rank=ls.rank, top_ids=ls.top_ids, top_logits=ls.top_logits,
                      target_rank=ls.target_rank)
        out.append(StepRecord(
            k=k, token=s.token, target_token=tt, accepted=k <= res.n_accepted,
            h=s.h if keep_h else None, h_next=s.h_next if keep_h else None,
            h_inner=inner[k - 1] if keep_h else None, **kw))
    return out


def round_record(prompt_id: int, res: RoundResult) -> RoundRecord:
    """The trace record of one round."""
    return RoundRecord(prompt_id=prompt_id, round=res.round, pos=res.pos, pending_token=res.pending_token,
                       n_draft=len(res.drafted), drafted=res.drafted, n_accepted=res.n_accepted,
                       target=res.target, emitted=res.emitted, t_draft_ms=res.t_draft_ms,
                       t_verify_ms=res.t_verify_ms, eog_confirmed=res.eog_confirmed)


__all__ = ["LogitSummary", "derive_h_inner", "derive_h_inner_rounds", "round_record", "step_records", "step_targets",
           "summarize_drafts", "summarize_logits"]
