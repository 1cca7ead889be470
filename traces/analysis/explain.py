"""Why drafts were rejected: a cause per draft step and per round's first mismatch, from the trace alone.

Pure functions over the ``rounds`` / ``steps`` DataFrames of :class:`traces.store.reader.Trace` (no I/O, no
Streamlit); the API and the rules are listed in ``docs/EXPLAIN.md``.

Vocabulary: a round drafts ``d1..dK``; the target verifies them; draft ``k`` is *accepted* when it and
every earlier draft equal the target's tokens. The **first mismatch** of a round is draft
``n_accepted + 1`` when ``n_accepted < n_draft``. The **target token** of step ``k`` is the target's
token at verify row ``k - 1`` (the step's ``target_token``, or ``rounds.target[k - 1]``). Its **rank**
under the drafter is the number of the drafter's logits strictly greater than its logit (0 = the
drafter's choice, 1 = the runner-up; the recorder counts it over all ``n_vocab`` logits). The **gap** is
the drafted token's logit minus the target token's logit (logits, >= 0 for greedy drafts); it is known
when the target token is in the stored top list (``top_logits[target_rank]``), else only a lower bound
(``logit - top_logits[-1]``, column ``gap_at_least``).

Causes (:data:`CAUSES`), the first rule that applies:

1. ``accepted`` -- not a rejection.
2. ``after_eog`` -- the round ended at an end-of-generation draft before this one, or this draft is
   that token: accepted as the round's last draft (the round emitted no correction token: ``len(emitted)
   == n_accepted``) or confirmed by the target but counted as its own token (``eog_confirmed``: llama.cpp
   accepts a drafted end-of-generation token only as a round's last draft); not a miss of the drafter.
3. ``after_mismatch`` -- an earlier draft of the round was rejected, so this one was never compared
   (steps only; never a round's first mismatch).
4. ``unknown`` -- the target's token is unknown, or the trace lacks the drafter's scores (no
   ``target_rank`` and no top list: imports).
5. ``unreachable`` -- the drafts came from the centroid (sparse) head (``head="centroid"``) and the
   target token was in none of the chosen centroids (``target_in_candidates`` false).
6. ``near_tie`` -- rank 0 (an exact tie with the drafted token) or a gap of at most ``near_tie_gap``
   logits (:data:`NEAR_TIE_GAP`, 0.5: the drafted token was at most e^0.5 = 1.65 times likelier than
   the target's under the drafter).
7. ``runner_up`` -- the target token was the drafter's second choice (rank 1).
8. ``in_top_k`` -- rank 2 .. (stored top-list length - 1).
9. ``far_miss`` -- rank at least the stored top-list length (and at least 2).

For dense-head traces that carry centroid columns (the recorder's ``--centroids``), the column
``sparse_unreachable`` says whether the centroid head could not have drafted the target token either;
it is not a cause of the dense head's rejection.

The target's side (when the trace has ``target_entropy``, always recorded since this column exists):
``target_side`` of a compared, rejected step is ``hard`` when the target's entropy at that position is at
least :data:`HARD_ENTROPY_NATS` (1.0 nat: the target itself spread its probability, e.g. over three or
more tokens), else ``wrong`` (the target was sure; the drafter missed); ``unknown`` without the data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from mtpscope.errors import TraceFormatError
from mtpscope.traces.analysis.wording import beside
from mtpscope.traces.store.list_columns import flat_list

CAUSES = ("accepted", "after_eog", "after_mismatch", "unknown", "unreachable", "near_tie", "runner_up",
          "in_top_k", "far_miss")
#: causes that are rejections of a compared draft (the first-mismatch table holds these and after_eog)
REJECTION_CAUSES = ("near_tie", "runner_up", "in_top_k", "far_miss", "unreachable", "after_eog", "unknown")
NEAR_TIE_GAP = 0.5
HARD_ENTROPY_NATS = 1.0
RANK_BINS = tuple(str(i) for i in range(10)) + ("10+",)
TARGET_SIDES = ("hard", "wrong", "unknown")
HEADS = ("dense", "centroid")

STEP_COLUMNS = ["prompt_id", "round", "k", "token", "logit", "top_ids", "top_logits", "target_token",
                "target_rank", "accepted", "target_in_candidates", "target_centroid", "target_centroid_rank"]
OPTIONAL_STEP_COLUMNS = ["target_p_drafted", "target_entropy"]
ROUND_COLUMNS = ["prompt_id", "round", "n_draft", "n_accepted", "drafted", "target", "emitted", "eog_confirmed"]

_CAUSE_CODE = {c: i for i, c in enumerate(CAUSES)}


def _need(df: pd.DataFrame, cols: list[str], what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise TraceFormatError(f"{what} lacks columns", key=", ".join(missing), expected=", ".join(cols),
                               actual=", ".join(map(str, df.columns)))


def _nullable(values: pd.Series | np.ndarray, dtype: Literal["Int64", "Float64", "boolean"]
              ) -> pd.api.extensions.ExtensionArray:
    """``pd.array(values, dtype=dtype)``: a column or array as a pandas nullable array."""
    return pd.array(values, dtype=dtype)  # type: ignore[arg-type]  # pandas-stubs has no overload for a Series / any ndarray with a nullable dtype; pandas takes both


def _int(s: pd.Series | None, n: int, fill: int = -1) -> np.ndarray:
    """A nullable integer column as int64 (``fill`` for NA); all ``fill`` when the column is absent."""
    if s is None:
        return np.full(n, fill, dtype=np.int64)
    return np.asarray(_nullable(s, "Int64").to_numpy(dtype=np.int64, na_value=fill))


def _na_int(a: np.ndarray) -> pd.api.extensions.ExtensionArray:
    """int64 with negative = unknown -> pandas Int64 with NA."""
    return pd.arrays.IntegerArray(np.where(a >= 0, a, 0).astype(np.int64), a < 0)


def _float(s: pd.Series | None, n: int) -> np.ndarray:
    if s is None:
        return np.full(n, np.nan)
    return np.asarray(_nullable(s, "Float64").to_numpy(dtype=np.float64, na_value=np.nan))


def _bool(s: pd.Series | None, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(value, known) of a nullable bool column."""
    if s is None:
        return np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    b = _nullable(s, "boolean")
    return b.to_numpy(dtype=bool, na_value=False), ~b.isna()


def _keys(pid: np.ndarray, rnd: np.ndarray) -> np.ndarray:
    return (pid.astype(np.int64) << 32) | (rnd.astype(np.int64) & 0xFFFFFFFF)


def _round_index(rounds: pd.DataFrame, pid: np.ndarray, rnd: np.ndarray) -> np.ndarray:
    """Row of ``rounds`` for each (prompt_id, round); -1 where the round is missing."""
    rk = _keys(rounds["prompt_id"].to_numpy(), rounds["round"].to_numpy())
    order = np.argsort(rk, kind="stable")
    sk = rk[order]
    q = _keys(pid, rnd)
    pos = np.searchsorted(sk, q)
    pos = np.minimum(pos, len(sk) - 1) if len(sk) else pos
    hit = (len(sk) > 0) & (sk[pos] == q) if len(sk) else np.zeros(len(q), dtype=bool)
    return np.where(hit, order[pos] if len(sk) else -1, -1)


def step_causes(rounds: pd.DataFrame, steps: pd.DataFrame, *, head: str = "dense",
                near_tie_gap: float = NEAR_TIE_GAP, hard_entropy: float = HARD_ENTROPY_NATS) -> pd.DataFrame:
    """A cause for every draft step (module docstring, rules 1-9).

    Args:
        rounds: columns ``prompt_id``, ``round``, ``n_draft``, ``n_accepted``; ``emitted`` when present
            (for ``after_eog``).
        steps: columns ``prompt_id``, ``round``, ``k``, ``token``, ``target_token``, ``accepted``; used
            when present: ``logit``, ``target_rank``, ``top_ids``, ``top_logits``, ``target_in_candidates``,
            ``target_centroid``, ``target_centroid_rank``, ``target_p_drafted``, ``target_entropy``.
        head: which head drafted the tokens, ``"dense"`` or ``"centroid"`` (enables ``unreachable``).
        near_tie_gap: logits; hard_entropy: nats.

    Returns:
        DataFrame aligned with ``steps`` (same row order, default index): ``prompt_id``, ``round``, ``k``,
        ``token``, ``target_token`` (Int64, NA unknown), ``accepted`` (bool), ``first_mismatch`` (bool:
        this step is its round's first mismatch), ``cause`` (str), ``target_rank`` (Int64),
        ``n_top`` (stored top-list length, 0 when none), ``gap`` (float, NaN when not known),
        ``gap_at_least`` (float lower bound when the target is below the top list, else NaN),
        ``sparse_unreachable`` (boolean, NA without centroid columns), ``target_centroid``,
        ``target_centroid_rank`` (Int64), ``target_p_drafted``, ``target_entropy`` (float, NaN unknown),
        ``target_side`` (``hard`` / ``wrong`` / ``unknown`` for compared rejected steps, else None).

    Raises:
        TraceFormatError: a required column is missing, or an unknown ``head``.
    """
    if head not in HEADS:
        raise TraceFormatError("unknown drafting head", key="head", expected=" | ".join(HEADS), actual=head)
    _need(rounds, ["prompt_id", "round", "n_draft", "n_accepted"], "rounds")
    _need(steps, ["prompt_id", "round", "k", "token"], "steps")
    n = len(steps)
    g = steps.get
    pid = steps["prompt_id"].to_numpy(dtype=np.int64)
    rnd = steps["round"].to_numpy(dtype=np.int64)
    k = steps["k"].to_numpy(dtype=np.int64)
    ri = _round_index(rounds, pid, rnd) if n else np.zeros(0, dtype=np.int64)
    have_round = ri >= 0
    n_acc_r = rounds["n_accepted"].to_numpy(dtype=np.int64)
    n_acc = np.where(have_round, n_acc_r[np.maximum(ri, 0)] if len(n_acc_r) else 0, -1)
    eog_round = _eog_rounds(rounds, n_acc_r)
    eog = have_round & (eog_round[np.maximum(ri, 0)] if len(eog_round) else False)

    acc_val, acc_known = _bool(g("accepted"), n)
    accepted = np.where(acc_known, acc_val, have_round & (k <= n_acc))
    tt = _int(g("target_token"), n)
    rank = _int(g("target_rank"), n)
    tops = flat_list(g("top_ids")) if g("top_ids") is not None else None
    topl = flat_list(g("top_logits"), dtype=np.float64, fill=np.nan) if g("top_logits") is not None else None
    n_top = tops.lengths if tops is not None else np.zeros(n, dtype=np.int64)
    if tops is not None:  # rank from the top list where the trace lacks target_rank (imports)
        rows = np.flatnonzero((rank < 0) & (tt >= 0) & tops.valid)
        if len(rows):
            found = np.full(len(rows), -1, dtype=np.int64)
            for j in range(int(n_top[rows].max())):
                hit = (found < 0) & (tops.item(np.full(n, j))[rows] == tt[rows])
                found[hit] = j
            # not in the list: at least its length (a far miss with rank = the list length)
            rank[rows] = np.where(found >= 0, found, np.where(n_top[rows] > 0, n_top[rows], -1))
    logit = _float(g("logit"), n)
    if topl is not None:
        first = topl.item(np.zeros(n, dtype=np.int64), fill=np.nan)
        logit = np.where(np.isnan(logit), first, logit)
        t_logit = topl.item(np.where((rank >= 0) & (rank < n_top), rank, -1), fill=np.nan)
        last = topl.item(n_top - 1, fill=np.nan)
    else:
        t_logit = last = np.full(n, np.nan)
    gap = np.where((rank >= 0) & (rank < n_top), logit - t_logit, np.nan)
    gap_at_least = np.where((rank >= 0) & (rank >= n_top) & (n_top > 0), logit - last, np.nan)
    in_cand, cand_known = _bool(g("target_in_candidates"), n)
    tcent = _int(g("target_centroid"), n)
    tcrank = _int(g("target_centroid_rank"), n)
    p_d = _float(g("target_p_drafted"), n)
    ent = _float(g("target_entropy"), n)

    first_mm = have_round & (k == n_acc + 1) & ~accepted
    cause = np.full(n, _CAUSE_CODE["unknown"], dtype=np.int8)
    scored = (rank >= 0) & (tt >= 0)
    gap = np.where(scored & (rank == 0) & np.isnan(gap), 0.0, gap)  # rank 0: no logit above the target's
    cause[scored & (rank >= np.maximum(n_top, 2))] = _CAUSE_CODE["far_miss"]
    cause[scored & (rank >= 2) & (rank < n_top)] = _CAUSE_CODE["in_top_k"]
    cause[scored & (rank == 1)] = _CAUSE_CODE["runner_up"]
    cause[scored & ((rank == 0) | (~np.isnan(gap) & (gap <= near_tie_gap)))] = _CAUSE_CODE["near_tie"]
    if head == "centroid":
        cause[cand_known & ~in_cand & (tt >= 0)] = _CAUSE_CODE["unreachable"]
    cause[tt < 0] = _CAUSE_CODE["unknown"]
    cause[have_round & (k > n_acc + 1)] = _CAUSE_CODE["after_mismatch"]
    cause[eog & (k > n_acc)] = _CAUSE_CODE["after_eog"]
    cause[accepted] = _CAUSE_CODE["accepted"]

    compared_rej = first_mm & ~eog
    side = np.full(n, -1, dtype=np.int8)            # codes into TARGET_SIDES, -1 = not a compared rejection
    side[compared_rej] = TARGET_SIDES.index("unknown")
    side[compared_rej & ~np.isnan(ent) & (ent >= hard_entropy)] = TARGET_SIDES.index("hard")
    side[compared_rej & ~np.isnan(ent) & (ent < hard_entropy)] = TARGET_SIDES.index("wrong")
    sparse = pd.array(np.where(cand_known, ~in_cand, False), dtype="boolean")
    sparse[~cand_known] = pd.NA
    return pd.DataFrame({
        "prompt_id": pid, "round": rnd, "k": k, "token": steps["token"].to_numpy(dtype=np.int64),
        "target_token": _na_int(tt), "accepted": accepted.astype(bool), "first_mismatch": first_mm,
        "cause": pd.Categorical.from_codes(cause, pd.Index(CAUSES)), "target_rank": _na_int(rank),
        "n_top": n_top.astype(np.int64), "gap": gap, "gap_at_least": gap_at_least,
        "sparse_unreachable": sparse, "target_centroid": _na_int(tcent), "target_centroid_rank": _na_int(tcrank),
        "target_p_drafted": p_d, "target_entropy": ent,
        "target_side": pd.Categorical.from_codes(side, pd.Index(TARGET_SIDES)),
    })


def _eog_rounds(rounds: pd.DataFrame, n_acc: np.ndarray) -> np.ndarray:
    """``bool[n_rounds]``: the round ended at an end-of-generation draft: accepted as its last draft (it emitted
    no correction token, ``len(emitted) == n_accepted``) or confirmed by the target but, as llama.cpp counts
    it, not accepted (``eog_confirmed``)."""
    out = np.zeros(len(rounds), dtype=bool)
    if "emitted" in rounds.columns and len(rounds):
        em = flat_list(rounds["emitted"])
        out |= em.valid & (em.lengths == n_acc)
    if "eog_confirmed" in rounds.columns and len(rounds):
        out |= rounds["eog_confirmed"].astype("boolean").fillna(False).to_numpy(dtype=bool)
    return out


_FM_STEP_COLUMNS = ["cause", "target_token", "target_rank", "n_top", "gap", "gap_at_least", "sparse_unreachable",
                    "target_centroid", "target_centroid_rank", "target_p_drafted", "target_entropy", "target_side"]


def first_mismatches(rounds: pd.DataFrame, causes: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per round whose drafts were not all accepted: its first mismatch.

    Built from ``rounds`` alone (``drafted``, ``target`` list columns: the drafted token and the
    target's token at the first mismatch) and joined with the step's cause when ``causes``
    (:func:`step_causes`) has the step; otherwise the cause is ``after_eog`` (the round ended at an
    end-of-generation draft) or ``unknown``.

    Returns:
        DataFrame: ``prompt_id``, ``round``, ``k`` (= n_accepted + 1), ``n_draft``, ``drafted_token``,
        ``target_token`` (Int64, NA unknown), ``cause``, ``target_rank`` (Int64), ``n_top``, ``gap``,
        ``gap_at_least``, ``sparse_unreachable``, ``target_centroid``, ``target_centroid_rank``,
        ``target_p_drafted``, ``target_entropy``, ``target_side``; ordered by (prompt_id, round).
    """
    _need(rounds, ["prompt_id", "round", "n_draft", "n_accepted"], "rounds")
    nd = rounds["n_draft"].to_numpy(dtype=np.int64)
    na = rounds["n_accepted"].to_numpy(dtype=np.int64)
    rows = np.flatnonzero(na < nd)
    m = len(rows)
    out = pd.DataFrame({"prompt_id": rounds["prompt_id"].to_numpy(dtype=np.int64)[rows],
                        "round": rounds["round"].to_numpy(dtype=np.int64)[rows],
                        "k": na[rows] + 1, "n_draft": nd[rows]})
    out["drafted_token"] = flat_list(rounds["drafted"]).item(na)[rows] if "drafted" in rounds.columns \
        else np.full(m, -1, dtype=np.int64)
    target = flat_list(rounds["target"]).item(na)[rows] if "target" in rounds.columns \
        else np.full(m, -1, dtype=np.int64)
    eog = _eog_rounds(rounds, na)[rows]
    if causes is not None and len(causes):
        fm = causes.loc[causes["first_mismatch"].to_numpy(dtype=bool)
                        | (causes["cause"] == "after_eog").to_numpy(dtype=bool),
                        ["prompt_id", "round", "k", *_FM_STEP_COLUMNS]]
        fm = fm.drop_duplicates(["prompt_id", "round", "k"])
        out = out.merge(fm, on=["prompt_id", "round", "k"], how="left", sort=False)
    else:
        for c in _FM_STEP_COLUMNS:
            out[c] = np.nan
    # the target token: the step's when it has one, else the rounds' list
    t_step = np.asarray(_nullable(out["target_token"], "Int64").to_numpy(dtype=np.int64, na_value=-1))
    t = np.where(t_step >= 0, t_step, target)
    out["target_token"] = pd.array(np.where(t >= 0, t, 0), dtype="Int64")
    out.loc[t < 0, "target_token"] = pd.NA
    cause = out["cause"].to_numpy(dtype=object)
    missing = pd.isna(cause)
    cause = np.where(missing, np.where(eog, "after_eog", "unknown"), cause).astype(object)
    cause = np.where((t < 0) & (cause != "after_eog"), "unknown", cause).astype(object)
    out["cause"] = pd.Categorical(cause, categories=CAUSES)
    for c in ("target_rank", "target_centroid", "target_centroid_rank"):
        out[c] = _nullable(out[c], "Int64") if len(out) else pd.array([], dtype="Int64")
    out["sparse_unreachable"] = _nullable(out["sparse_unreachable"].astype(object).where(
        out["sparse_unreachable"].notna(), None), "boolean")
    out["n_top"] = pd.to_numeric(out["n_top"], errors="coerce").fillna(0).to_numpy(dtype=np.int64)
    for c in ("gap", "gap_at_least", "target_p_drafted", "target_entropy"):
        out[c] = pd.to_numeric(out[c], errors="coerce").to_numpy(dtype=np.float64)
    side = out["target_side"].to_numpy(dtype=object)
    side = np.where(pd.isna(side), "unknown", side).astype(object)
    side[eog] = None
    out["target_side"] = pd.Categorical(side, categories=TARGET_SIDES)
    return out.sort_values(["prompt_id", "round"], kind="stable").reset_index(drop=True)


def rank_histogram(ranks: pd.Series | np.ndarray) -> dict[str, int]:
    """Counts of ranks in :data:`RANK_BINS` (``"0"`` .. ``"9"``, ``"10+"``); unknown (NA / negative)
    ranks are not counted."""
    r = np.asarray(_nullable(ranks, "Int64").to_numpy(dtype=np.int64, na_value=-1))
    r = r[r >= 0]
    counts = np.bincount(np.minimum(r, 10), minlength=11)
    return {b: int(c) for b, c in zip(RANK_BINS, counts, strict=True)}


def _count(values: Any, keys: tuple[str, ...]) -> dict[str, int]:
    d = pd.Series(values).value_counts().to_dict()
    return {key: int(d.get(key, 0)) for key in keys}


@dataclass(frozen=True)
class TokenCount:
    """One token of :func:`top_tokens`: its id, how often it occurs, and its text (None without a label)."""

    token: int
    count: int
    text: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """``{token, count[, text]}`` (``text`` only when known)."""
        d: dict[str, Any] = {"token": self.token, "count": self.count}
        if self.text is not None:
            d["text"] = self.text
        return d


def top_tokens(tokens: np.ndarray | pd.Series, n: int = 10,
               label: Callable[[int], str] | None = None) -> tuple[TokenCount, ...]:
    """The ``n`` most frequent token ids (unknown = NA / negative left out), most frequent first, ties
    by lower id, as :class:`TokenCount` (``text`` = ``label(id)``, only with ``label``)."""
    t = np.asarray(_nullable(tokens, "Int64").to_numpy(dtype=np.int64, na_value=-1))
    t = t[t >= 0]
    if not len(t):
        return ()
    u, c = np.unique(t, return_counts=True)
    order = np.lexsort((u, -c))[:n]
    return tuple(TokenCount(int(u[i]), int(c[i]), label(int(u[i])) if label is not None else None) for i in order)


@dataclass(frozen=True)
class PositionRejections:
    """The first mismatches at one draft position ``k``: how many (``n``), their causes
    (``{cause: count}`` over :data:`REJECTION_CAUSES`) and the target token's rank (``{bin: count}``,
    :data:`RANK_BINS`)."""

    k: int
    n: int
    causes: dict[str, int]
    rank_histogram: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        """``{k, n, causes, rank_histogram}``."""
        return {"k": self.k, "n": self.n, "causes": dict(self.causes), "rank_histogram": dict(self.rank_histogram)}


@dataclass(frozen=True)
class TargetSide:
    """The target's side of the compared first mismatches (module docstring): counts ``hard`` / ``wrong`` /
    ``unknown`` and the mean ``target_p_drafted`` of the hard and the wrong ones (None when none is
    known)."""

    hard: int
    wrong: int
    unknown: int
    p_drafted_mean_hard: float | None
    p_drafted_mean_wrong: float | None

    def to_dict(self) -> dict[str, Any]:
        """``{hard, wrong, unknown, p_drafted_mean_hard, p_drafted_mean_wrong}``."""
        return {"hard": self.hard, "wrong": self.wrong, "unknown": self.unknown,
                "p_drafted_mean_hard": self.p_drafted_mean_hard, "p_drafted_mean_wrong": self.p_drafted_mean_wrong}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TargetSide:
        """The counts back from :meth:`to_dict`'s JSON (``diagnosis.json``'s summary)."""
        return cls(d["hard"], d["wrong"], d["unknown"], d["p_drafted_mean_hard"], d["p_drafted_mean_wrong"])


@dataclass(frozen=True)
class Rejections:
    """Aggregates of the first-mismatch table (:func:`rejection_summary`).

    Attributes:
        n_rounds_rejected: rounds with a first mismatch (rows of the table).
        n_first_mismatch: of them, those whose target token is known.
        causes: ``{cause: count}`` over :data:`REJECTION_CAUSES` (rows with a known target token).
        rank_histogram: ``{"0".."9", "10+": count}`` (the drafter's misses, rows whose cause is not ``after_eog``,
            with a known rank).
        by_position: :class:`PositionRejections` for k = 1..max k.
        target_side: :class:`TargetSide`.
        sparse_unreachable: rows the centroid head could not reach either (None without centroid columns).
        top_target_tokens / top_drafted_tokens: :func:`top_tokens` of the target's and the drafted tokens of the
            drafter's misses (not ``after_eog`` rows: a drafted end-of-generation token the target chose too is no
            miss, nor a draft after one).
    """

    n_rounds_rejected: int
    n_first_mismatch: int
    causes: dict[str, int]
    rank_histogram: dict[str, int]
    by_position: tuple[PositionRejections, ...]
    target_side: TargetSide
    sparse_unreachable: int | None
    top_target_tokens: tuple[TokenCount, ...]
    top_drafted_tokens: tuple[TokenCount, ...]

    def to_dict(self) -> dict[str, Any]:
        """The ``rejections`` section of docs/EXPLAIN.md: ``{n_rounds_rejected, n_first_mismatch, causes,
        rank_histogram, by_position: [...], target_side: {...}, sparse_unreachable, top_target_tokens: [...],
        top_drafted_tokens: [...]}``."""
        return {
            "n_rounds_rejected": self.n_rounds_rejected,
            "n_first_mismatch": self.n_first_mismatch,
            "causes": dict(self.causes),
            "rank_histogram": dict(self.rank_histogram),
            "by_position": [p.to_dict() for p in self.by_position],
            "target_side": self.target_side.to_dict(),
            "sparse_unreachable": self.sparse_unreachable,
            "top_target_tokens": [t.to_dict() for t in self.top_target_tokens],
            "top_drafted_tokens": [t.to_dict() for t in self.top_drafted_tokens],
        }


def rejection_summary(fm: pd.DataFrame, *, n_top_tokens: int = 10,
                      label: Callable[[int], str] | None = None) -> Rejections:
    """Aggregates of the first-mismatch table (:func:`first_mismatches`) as :class:`Rejections`: causes,
    the target token's rank, both per draft position; the target's side; the most frequent target and
    drafted tokens (``n_top_tokens`` each, their text from ``label``)."""
    known = fm["target_token"].notna().to_numpy() if len(fm) else np.zeros(0, dtype=bool)
    fk = fm[known]
    causes = _count(fk["cause"].array, REJECTION_CAUSES)
    # the drafter's misses: a round that ended at an end-of-generation draft (after_eog) is counted among the causes,
    # but its step is no miss (its draft may be the target's token, or was never compared): not in ranks or tokens
    miss = (fk["cause"] != "after_eog").to_numpy(dtype=bool)
    fmiss = fk[miss]
    by_pos = []
    kvals = fk["k"].to_numpy(dtype=np.int64)
    for kk in range(1, int(kvals.max()) + 1 if len(kvals) else 1):
        sub = fk[kvals == kk]
        by_pos.append(PositionRejections(kk, int(len(sub)), _count(sub["cause"].array, REJECTION_CAUSES),
                                         rank_histogram(fk[(kvals == kk) & miss]["target_rank"])))
    side = fk["target_side"].to_numpy(dtype=object)
    pd_ = fk["target_p_drafted"].to_numpy(dtype=np.float64)
    means: dict[str, float | None] = {}
    for s in ("hard", "wrong"):
        m = (side == s) & ~np.isnan(pd_)
        means[s] = float(pd_[m].mean()) if m.any() else None
    ts = TargetSide(int(np.sum(side == "hard")), int(np.sum(side == "wrong")), int(np.sum(side == "unknown")),
                    means["hard"], means["wrong"])   # TARGET_SIDES, in order
    su = fk["sparse_unreachable"]
    sparse = int(su.fillna(False).astype(bool).sum()) if su.notna().any() else None
    return Rejections(
        n_rounds_rejected=int(len(fm)),
        n_first_mismatch=int(known.sum()),
        causes=causes,
        rank_histogram=rank_histogram(fmiss["target_rank"]),
        by_position=tuple(by_pos),
        target_side=ts,
        sparse_unreachable=sparse,
        top_target_tokens=top_tokens(fmiss["target_token"], n_top_tokens, label),
        top_drafted_tokens=top_tokens(fmiss["drafted_token"], n_top_tokens, label),
    )


# ------------------------------------------------------------------------------------------ sentences

def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _num(v: Any) -> float | None:
    if v is None or v is pd.NA:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def step_sentence(row: Mapping[str, Any], label: Callable[[int], str] | None = None, *,
                  n_centroids: int | None = None, centroid_top_k: int | None = None) -> str:
    """One step's cause in words, e.g. ``rejected: the target's “ the” was the drafter's runner-up, 0.12
    logits behind`` or ``unreachable: “json” lives in centroid 913, rank 57 of 2048``.

    Args:
        row: a row of :func:`step_causes` or :func:`first_mismatches` (a dict or a pandas row).
        label: token id -> quoted text (e.g. the app's ``TokenText.label``); default ``#id``.
        n_centroids / centroid_top_k: the centroid head's size (manifest ``centroids``), for the
            unreachable sentence.
    """
    lab = label or (lambda t: f"#{t}")
    cause = row.get("cause")
    tt = row.get("target_token")
    tt = None if tt is None or tt is pd.NA or (isinstance(tt, float) and math.isnan(tt)) else int(tt)
    tok = row.get("token", row.get("drafted_token"))
    target = lab(tt) if tt is not None else "token"
    gap, gal, rank = _num(row.get("gap")), _num(row.get("gap_at_least")), _num(row.get("target_rank"))
    n_top = int(_num(row.get("n_top")) or 0)
    if cause == "accepted":
        text = f"accepted: the drafter's {lab(int(tok))} was the target's token" if tok is not None else "accepted"
    elif cause == "after_eog":
        text = "not verified: an earlier draft of this round ended the generation (end-of-generation token)"
    elif cause == "after_mismatch":
        text = "not compared: an earlier draft of this round was rejected"
    elif cause == "unreachable":
        c, cr = _num(row.get("target_centroid")), _num(row.get("target_centroid_rank"))
        where = f"centroid {int(c)}" if c is not None and c >= 0 else "no centroid's row"
        of = f" of {n_centroids}" if n_centroids else ""
        rk = f", rank {int(cr)}{of}" if cr is not None else ""
        top = f" (the head scores the top {centroid_top_k})" if centroid_top_k else ""
        text = f"unreachable: {target} lives in {where}{rk}{top}"
    elif cause == "unknown":
        text = ("rejected: the target's token is not in the trace" if tt is None
                else "rejected: the trace lacks the drafter's scores for this step")
    else:
        behind = f", {beside(gap, NEAR_TIE_GAP)} logits behind" if gap is not None else ""
        if cause == "near_tie":
            who = "runner-up" if rank == 1 else (f"{_ordinal(int(rank) + 1)} choice" if rank else "tied choice")
            text = f"rejected (near tie): the target's {target} was the drafter's {who}{behind}"
        elif cause == "runner_up":
            text = f"rejected: the target's {target} was the drafter's runner-up{behind}"
        elif cause == "in_top_k":
            if rank is None:        # explain_steps gives in_top_k only with a known target_rank
                raise TraceFormatError("an in_top_k step without a target_rank", key="target_rank")
            text = f"rejected: the target's {target} was the drafter's {_ordinal(int(rank) + 1)} choice{behind}"
        else:
            rk = f"rank {int(rank)}" if rank is not None else "rank unknown"
            more = f", more than {gal:.2f} logits behind" if gal is not None else ""
            text = f"rejected (far miss): the target's {target} was far down the drafter's list ({rk}, " \
                   f"not in the stored top {n_top}{more})"
    side = row.get("target_side")
    ent, pdr = _num(row.get("target_entropy")), _num(row.get("target_p_drafted"))
    if side in ("hard", "wrong"):       # (a side is judged on a known entropy)
        who = "unsure too" if side == "hard" else "sure"
        text += f"; the target was {who} (entropy {beside(ent or 0.0, HARD_ENTROPY_NATS)} nats" + \
            (f", p(drafted) {pdr:.3g})" if pdr is not None else ")")
    su = row.get("sparse_unreachable")
    if cause in ("near_tie", "runner_up", "in_top_k", "far_miss") and su is True:
        c, cr = _num(row.get("target_centroid")), _num(row.get("target_centroid_rank"))
        if c is not None:
            of = f" of {n_centroids}" if n_centroids else ""
            rk = f", rank {int(cr)}{of}" if cr is not None else ""
            text += f"; the centroid head could not have drafted it either (centroid {int(c)}{rk})"
    return text
