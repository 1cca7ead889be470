"""Acceptance metrics over trace DataFrames: pure functions (no I/O), plus :func:`report`.

Definitions (the ones llama.cpp's speculative decoding and vLLM's spec-decode metrics use):

* **acceptance rate** = accepted draft tokens / drafted tokens, summed over rounds
  (llama.cpp: ``n_accept / n_drafted``; llama-server prints it as "draft acceptance rate").
* **mean acceptance length** = 1 + accepted draft tokens / verify rounds (vLLM's
  "mean acceptance length": tokens emitted per target verify, the bonus/correction token counting 1).
  Only rounds that drafted at least one token count as verify rounds here; a round with
  ``n_draft == 0`` is a plain decode step.
* **acceptance at draft position k** = P(draft k accepted) = (rounds with ``n_accepted >= k``) /
  (rounds with ``n_draft >= k``), for k = 1..K. The denominator is the rounds that *drafted* a k-th
  token, whether or not the earlier drafts were accepted (so it is the unconditional probability the
  k-th draft survives, as in vLLM's per-position acceptance). ``conditional`` is
  P(draft k accepted | draft k-1 accepted) = (``n_accepted >= k``) / (``n_draft >= k`` and
  ``n_accepted >= k-1``). ``per_verify_round`` is the same numerator over *all* verify rounds
  (``n_draft > 0``): that is what llama-server prints as "acc per pos"; the two agree whenever every
  round drafts K tokens.
* **first-mismatch position** of a round = ``n_accepted + 1`` when ``n_accepted < n_draft`` (the first
  draft the target rejected); rounds that accepted every draft have none.
* **zero-acceptance streak** = a maximal run of consecutive rounds of one prompt (ordered by ``round``)
  that drafted tokens and accepted none. Rounds with ``n_draft == 0`` neither extend nor break a streak.
* **centroid coverage** = share of draft steps whose target token was among the sparse (centroid)
  head's candidate tokens (``target_in_candidates``), over the steps the target checked (accepted, or
  the first rejection of their round: :func:`checked_mask`) where that is known. A draft after its
  round's first rejection was compared with a target token that followed a wrong draft: never checked.
* **measured tokens/s** = emitted tokens / (``t_draft_ms`` + ``t_verify_ms``) over the rounds
  (generation after each prompt's first token; prompt processing excluded), with the costs the
  what-if uses: a draft step = sum ``t_draft_ms`` / sum ``n_draft``, a verify of ``n`` tokens = mean
  ``t_verify_ms`` of the rounds of that size (:func:`timing`).

All functions take the ``rounds`` / ``steps`` DataFrames of :class:`traces.store.reader.Trace` (only the
columns named in each docstring are used) and return floats, dicts or DataFrames; NaN where a
denominator is zero. What leaves for the app and the CLI is typed (the records of
:mod:`mtpscope.traces.analysis.report_records`): :func:`totals` -> ``Totals``, :func:`report` -> ``TraceReport``;
each record's ``to_dict()`` is its JSON (``report --json``).
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np
import pandas as pd

from mtpscope.errors import TraceFormatError
from mtpscope.traces.analysis import rates
from mtpscope.traces.analysis.report_records import (
    CategoryRequests,
    CentroidCoverage,
    CoverageRow,
    MismatchRow,
    PositionRow,
    PromptRow,
    RequestTotals,
    RollingPoint,
    RollingSummary,
    ServerPositionRow,
    StreakRow,
    Streaks,
    Timing,
    Totals,
    TraceReport,
)
from mtpscope.traces.analysis.wording import prompt_texts
from mtpscope.traces.store.list_columns import flat_list
from mtpscope.traces.store.protocols import TraceLike

#: what a trace's mean acceptance length divides by (``mean_acceptance_length_formula`` of :func:`summarize`): its
#: verify rounds, or for a trace of llama-server requests without rounds their drafts (verification steps:
#: :mod:`mtpscope.traces.analysis.requests`)
MAL_OVER_VERIFY_ROUNDS = "1 + accepted / verify rounds"
MAL_OVER_DRAFTS = "1 + accepted / drafts"

REPORT_ROUNDS_COLUMNS = ["prompt_id", "round", "n_draft", "n_accepted", "emitted", "t_draft_ms", "t_verify_ms"]
#: The rolling acceptance window (rounds) of ``report`` and of the app's rolling chart: one default.
DEFAULT_ROLLING_WINDOW = 32


def _need(df: pd.DataFrame, cols: list[str], what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise TraceFormatError(f"{what} lacks columns", key=", ".join(missing),
                               expected=", ".join(cols), actual=", ".join(map(str, df.columns)))


def _ints(s: pd.Series) -> np.ndarray:
    return np.asarray(s.to_numpy(dtype=np.int64, na_value=0) if hasattr(s, "to_numpy") else s, np.int64)


def _div(a: float, b: float) -> float:
    return float(a) / float(b) if b else math.nan


def totals(rounds: pd.DataFrame) -> Totals:
    """Totals over ``rounds`` (columns ``n_draft``, ``n_accepted``).

    Returns:
        :class:`Totals`: ``n_rounds`` (all rows), ``n_verify_rounds`` (rows with ``n_draft > 0``),
        ``n_drafted``, ``n_accepted``, ``acceptance_rate``, ``mean_acceptance_length`` (NaN where undefined).

    Raises:
        TraceFormatError: ``rounds`` lacks a column.
    """
    _need(rounds, ["n_draft", "n_accepted"], "rounds")
    nd, na = _ints(rounds["n_draft"]), _ints(rounds["n_accepted"])
    n_verify = int((nd > 0).sum())
    rate, mal = rates.acceptance_rate(na.sum(), nd.sum()), rates.mean_acceptance_length(na[nd > 0].sum(), n_verify)
    return Totals(n_rounds=int(len(rounds)), n_verify_rounds=n_verify, n_drafted=int(nd.sum()),
                  n_accepted=int(na.sum()), acceptance_rate=rates.nan_if_none(rate),
                  mean_acceptance_length=rates.nan_if_none(mal))


def acceptance_rate(rounds: pd.DataFrame) -> float:
    """Accepted draft tokens / drafted tokens (llama.cpp's definition). NaN when nothing was drafted."""
    return totals(rounds).acceptance_rate


def mean_acceptance_length(rounds: pd.DataFrame) -> float:
    """1 + accepted / verify rounds (vLLM's definition; verify rounds = rounds with ``n_draft > 0``)."""
    return totals(rounds).mean_acceptance_length


def per_position_acceptance(rounds: pd.DataFrame, max_k: int | None = None) -> pd.DataFrame:
    """Acceptance per draft position k = 1..K (K = ``max_k`` or the largest ``n_draft``).

    Columns: ``k``, ``n_rounds`` (rounds with ``n_draft >= k``, the denominator), ``n_accepted``
    (rounds with ``n_accepted >= k``), ``acceptance`` (= n_accepted / n_rounds), ``conditional``
    (P(k accepted | k-1 accepted)), ``per_verify_round`` (n_accepted / rounds with ``n_draft > 0``,
    llama-server's "acc per pos").
    """
    _need(rounds, ["n_draft", "n_accepted"], "rounds")
    nd, na = _ints(rounds["n_draft"]), _ints(rounds["n_accepted"])
    kmax = int(max_k) if max_k is not None else (int(nd.max()) if len(nd) else 0)
    n_verify = int((nd > 0).sum())
    rows = []
    for k in range(1, kmax + 1):
        drafted = nd >= k
        n_r = int(drafted.sum())
        n_a = int((na >= k).sum())
        n_prev = int((drafted & (na >= k - 1)).sum())
        rows.append({"k": k, "n_rounds": n_r, "n_accepted": n_a, "acceptance": _div(n_a, n_r),
                     "conditional": _div(n_a, n_prev), "per_verify_round": _div(n_a, n_verify)})
    return pd.DataFrame(rows, columns=["k", "n_rounds", "n_accepted", "acceptance", "conditional",
                                       "per_verify_round"])


def per_prompt(rounds: pd.DataFrame) -> pd.DataFrame:
    """One row per ``prompt_id``: ``n_rounds``, ``n_drafted``, ``n_accepted``, ``acceptance_rate``,
    ``mean_acceptance_length`` (same definitions as :func:`totals`), ordered by prompt_id."""
    _need(rounds, ["prompt_id", "n_draft", "n_accepted"], "rounds")
    df = pd.DataFrame({"prompt_id": _ints(rounds["prompt_id"]), "nd": _ints(rounds["n_draft"]),
                       "na": _ints(rounds["n_accepted"])})
    df["verify"] = (df["nd"] > 0).astype(np.int64)
    df["na_v"] = np.where(df["nd"] > 0, df["na"], 0)
    g = df.groupby("prompt_id", sort=True).agg(n_rounds=("nd", "size"), n_drafted=("nd", "sum"),
                                               n_accepted=("na", "sum"), n_verify=("verify", "sum"),
                                               na_v=("na_v", "sum"))
    out = pd.DataFrame({
        "prompt_id": g.index.to_numpy(),
        "n_rounds": g["n_rounds"].to_numpy(),
        "n_drafted": g["n_drafted"].to_numpy(),
        "n_accepted": g["n_accepted"].to_numpy(),
    })
    out["acceptance_rate"] = rates.acceptance_rates(g["n_accepted"], g["n_drafted"])
    out["mean_acceptance_length"] = rates.mean_acceptance_lengths(g["na_v"], g["n_verify"])
    return out


def _ordered(rounds: pd.DataFrame) -> pd.DataFrame:
    return rounds.sort_values(["prompt_id", "round"], kind="stable")


def rolling_acceptance(rounds: pd.DataFrame, window: int = DEFAULT_ROLLING_WINDOW,
                       by_prompt: bool = True) -> pd.DataFrame:
    """Acceptance rate over the last ``window`` rounds (sum accepted / sum drafted in the window).

    Rounds are ordered by (``prompt_id``, ``round``); with ``by_prompt`` the window restarts at each
    prompt. Fewer than ``window`` rounds at the start use what there is.

    Returns:
        DataFrame with ``prompt_id``, ``round``, ``acceptance_rate`` (rolling), one row per round.

    Raises:
        TraceFormatError: ``window < 1``.
    """
    if window < 1:
        raise TraceFormatError("rolling window must be >= 1", key="window", expected=">= 1", actual=window)
    _need(rounds, ["prompt_id", "round", "n_draft", "n_accepted"], "rounds")
    r = _ordered(rounds)
    df = pd.DataFrame({"prompt_id": _ints(r["prompt_id"]), "round": _ints(r["round"]),
                       "nd": _ints(r["n_draft"]).astype(float), "na": _ints(r["n_accepted"]).astype(float)})
    if by_prompt:
        g = df.groupby("prompt_id", sort=False)
        sa = g["na"].rolling(window, min_periods=1).sum().to_numpy()
        sd = g["nd"].rolling(window, min_periods=1).sum().to_numpy()
    else:
        sa = df["na"].rolling(window, min_periods=1).sum().to_numpy()
        sd = df["nd"].rolling(window, min_periods=1).sum().to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(sd > 0, sa / np.where(sd > 0, sd, 1), np.nan)
    return pd.DataFrame({"prompt_id": df["prompt_id"].to_numpy(), "round": df["round"].to_numpy(),
                         "acceptance_rate": rate})


def zero_acceptance_streaks(rounds: pd.DataFrame, min_length: int = 1) -> pd.DataFrame:
    """Maximal runs of consecutive drafting rounds with no accepted draft, per prompt.

    Returns:
        DataFrame ``prompt_id``, ``start_round``, ``end_round`` (inclusive), ``length`` (rounds),
        longest first (ties by prompt_id, start_round); only streaks of at least ``min_length``.
    """
    _need(rounds, ["prompt_id", "round", "n_draft", "n_accepted"], "rounds")
    r = _ordered(rounds)
    nd = _ints(r["n_draft"])
    keep = nd > 0
    pid = _ints(r["prompt_id"])[keep]
    rnd = _ints(r["round"])[keep]
    zero = (_ints(r["n_accepted"])[keep] == 0)
    cols = ["prompt_id", "start_round", "end_round", "length"]
    if not zero.any():
        return pd.DataFrame({c: np.array([], dtype=np.int64) for c in cols})
    # a new run starts where zero-ness or the prompt changes
    change = np.ones(len(zero), dtype=bool)
    change[1:] = (zero[1:] != zero[:-1]) | (pid[1:] != pid[:-1])
    run_id = np.cumsum(change) - 1
    starts = np.flatnonzero(change)
    ends = np.concatenate([starts[1:], [len(zero)]]) - 1
    lengths = np.bincount(run_id)
    is_zero = zero[starts]
    out = pd.DataFrame({"prompt_id": pid[starts][is_zero], "start_round": rnd[starts][is_zero],
                        "end_round": rnd[ends][is_zero], "length": lengths[is_zero]})
    out = out[out["length"] >= min_length]
    out = out.sort_values(["length", "prompt_id", "start_round"], ascending=[False, True, True],
                          kind="stable").reset_index(drop=True)
    return out


def first_mismatch_histogram(rounds: pd.DataFrame, max_k: int | None = None) -> pd.DataFrame:
    """How often the first rejected draft was at position k (= ``n_accepted + 1``), k = 1..K.

    Only rounds with ``n_accepted < n_draft`` have a first mismatch; the others (every draft
    accepted) are counted by :func:`n_all_accepted`.

    Returns:
        DataFrame ``k``, ``n_rounds``, ``share`` (of rounds that had a mismatch).
    """
    _need(rounds, ["n_draft", "n_accepted"], "rounds")
    nd, na = _ints(rounds["n_draft"]), _ints(rounds["n_accepted"])
    mism = na < nd
    kmax = int(max_k) if max_k is not None else (int(nd.max()) if len(nd) else 0)
    counts = np.bincount(na[mism] + 1, minlength=kmax + 1)[1:kmax + 1]
    total = int(mism.sum())
    return pd.DataFrame({"k": np.arange(1, kmax + 1), "n_rounds": counts.astype(np.int64),
                         "share": counts / total if total else np.full(kmax, np.nan)})


def n_all_accepted(rounds: pd.DataFrame) -> int:
    """Rounds that drafted tokens and had every one accepted."""
    _need(rounds, ["n_draft", "n_accepted"], "rounds")
    nd, na = _ints(rounds["n_draft"]), _ints(rounds["n_accepted"])
    return int(((nd > 0) & (na == nd)).sum())


def checked_mask(steps: pd.DataFrame) -> np.ndarray:
    """Per step (columns ``prompt_id``, ``round``, ``k``, ``accepted``): True when the target judged it --
    accepted, or the first rejected step of its round; False for the steps after the first rejection."""
    acc = steps["accepted"].fillna(False).to_numpy(dtype=bool) if hasattr(steps["accepted"], "fillna") \
        else np.asarray(steps["accepted"], dtype=bool)
    k = _ints(steps["k"])
    big = np.iinfo(np.int64).max
    key = pd.DataFrame({"p": _ints(steps["prompt_id"]), "r": _ints(steps["round"]), "rejk": np.where(acc, big, k)})
    first = key.groupby(["p", "r"], sort=False)["rejk"].transform("min").to_numpy(dtype=np.int64)
    return k <= first


def centroid_coverage(steps: pd.DataFrame) -> dict[str, Any]:
    """Share of checked steps whose target token was reachable by the sparse head (``target_in_candidates``).

    Uses columns ``k`` and ``target_in_candidates``, and with ``prompt_id``, ``round``, ``accepted``
    only the steps the target checked (:func:`checked_mask`); steps where it is null are not counted.

    Returns:
        ``{"n_steps": known steps, "n_covered": ..., "coverage": share or NaN,
        "per_position": [{"k", "n_steps", "n_covered", "coverage"}, ...]}``.
    """
    _need(steps, ["k", "target_in_candidates"], "steps")
    known = steps["target_in_candidates"].notna().to_numpy()
    if {"prompt_id", "round", "accepted"} <= set(steps.columns):
        known = known & checked_mask(steps)
    cov = steps["target_in_candidates"].to_numpy(dtype=bool, na_value=False)
    k = _ints(steps["k"])
    per = []
    for kk in sorted(set(k[known].tolist())):
        m = known & (k == kk)
        per.append({"k": int(kk), "n_steps": int(m.sum()), "n_covered": int(cov[m].sum()),
                    "coverage": _div(cov[m].sum(), m.sum())})
    return {"n_steps": int(known.sum()), "n_covered": int(cov[known].sum()),
            "coverage": _div(cov[known].sum(), known.sum()), "per_position": per}


def emitted_counts(rounds: pd.DataFrame) -> np.ndarray:
    """``int64[n]`` tokens each round emitted: ``len(emitted)`` where known, else ``n_accepted + 1``
    (the measured tokens/s counts these)."""
    na = rounds["n_accepted"].to_numpy(dtype=np.int64) if "n_accepted" in rounds.columns else np.zeros(len(rounds),
                                                                                                         np.int64)
    if "emitted" in rounds.columns:
        fl = flat_list(rounds["emitted"])
        return np.where(fl.valid, fl.lengths, na + 1).astype(np.int64)
    return na + 1


def timing(rounds: pd.DataFrame) -> dict[str, Any] | None:
    """The measured speed and costs of the rounds (columns ``n_draft``, ``n_accepted``, ``t_draft_ms``,
    ``t_verify_ms``; ``emitted`` when present): ``tokens_per_s`` (emitted tokens / (draft + verify) s, the
    definition the what-if shares), ``t_step_ms_mean`` (sum ``t_draft_ms`` / sum ``n_draft`` over rounds that
    drafted), ``t_verify_ms_mean_by_size`` (``{n: mean}`` per verify size ``n = n_draft + 1``), ``t_draft_ms_mean``
    / ``t_verify_ms_mean`` (per round). All means, which slow rounds move: the what-if's costs
    (:class:`traces.analysis.costs.CostModel`, ``t_step_ms``, ``verify_ms``) price each size at its median.
    None without timings."""
    if "t_verify_ms" not in rounds.columns or not rounds["t_verify_ms"].notna().any():
        return None
    nd = _ints(rounds["n_draft"])
    td = pd.to_numeric(rounds["t_draft_ms"], errors="coerce").fillna(0.0).to_numpy(dtype=np.float64)
    tv = pd.to_numeric(rounds["t_verify_ms"], errors="coerce").fillna(0.0).to_numpy(dtype=np.float64)
    t = float(td.sum() + tv.sum())
    ne = int(emitted_counts(rounds).sum())
    return {"tokens_per_s": 1000.0 * ne / t if t > 0 else None,
            "t_step_ms_mean": float(td[nd > 0].sum() / nd[nd > 0].sum()) if nd.sum() > 0 else None,
            "t_verify_ms_mean_by_size": {str(int(n) + 1): float(tv[nd == n].mean()) for n in np.unique(nd)},
            "t_draft_ms_mean": float(td.mean()), "t_verify_ms_mean": float(tv.mean())}


def speed_by_prompt(rounds: pd.DataFrame) -> dict[int, tuple[float | None, float | None]]:
    """Each prompt's measured speed and the time it was measured over, :func:`timing`'s definitions over its
    own rounds (columns ``prompt_id`` and :func:`timing`'s): ``{prompt_id: (tokens/s, draft + verify ms)}``,
    ``(None, None)`` where a prompt has no timed rounds; ``{}`` without timings."""
    if "t_verify_ms" not in rounds.columns or not len(rounds):
        return {}
    tv = pd.to_numeric(rounds["t_verify_ms"], errors="coerce")
    td = pd.to_numeric(rounds["t_draft_ms"], errors="coerce").fillna(0.0)
    g = pd.DataFrame({"p": rounds["prompt_id"].to_numpy(dtype=np.int64), "ne": emitted_counts(rounds),
                      "t": td.to_numpy() + tv.fillna(0.0).to_numpy(), "timed": tv.notna().to_numpy()}
                     ).groupby("p", sort=True).sum()          # one pass, the sums timing() takes per prompt
    return {int(p): (1000.0 * float(ne) / float(t), float(t)) if timed and t > 0 else (None, None)
            for p, ne, t, timed in zip(g.index, g["ne"], g["t"], g["timed"], strict=True)}


def request_totals(requests: pd.DataFrame) -> dict[str, Any]:
    """Totals over llama-server request rows (``requests`` table: at least ``kind``, ``n_drafted``,
    ``n_accepted``; the other columns where present).

    One kind of row counts (:func:`mtpscope.traces.analysis.requests.request_rows`: probe rows, else the
    per-response ``timings`` rows, else the log lines); kinds describing the same requests are never added
    together. Keys: ``kind``, ``by_kind``, and from :func:`mtpscope.traces.analysis.requests.totals` (the request
    metrics' one home): ``n_requests``, ``n_drafted``, ``n_accepted``, ``acceptance_rate``, ``n_drafts``,
    ``mean_acceptance_length``, ``tokens_per_s_mean``, ``tokens_per_s_pooled``; ``alarm`` (the not-drafting alarm
    or None), ``by_category`` and ``per_position`` (records).
    """
    from mtpscope.traces.analysis import requests as R

    _need(requests, ["kind", "n_drafted", "n_accepted"], "requests")
    kinds = set(requests["kind"].tolist())
    sub = R.request_rows(requests)
    kind = str(sub["kind"].iloc[0]) if len(sub) else "log"
    tot = R.totals(requests)            # the one home of the request metrics
    return {"kind": kind, "n_requests": tot.n_requests, "n_drafted": tot.n_drafted, "n_accepted": tot.n_accepted,
            "acceptance_rate": tot.acceptance_rate,
            "by_kind": {k: int((requests["kind"] == k).sum()) for k in sorted(kinds)},
            "n_drafts": tot.n_drafts, "mean_acceptance_length": tot.mean_acceptance_length,
            "tokens_per_s_mean": tot.tokens_per_s_mean, "tokens_per_s_pooled": tot.tokens_per_s_pooled,
            "alarm": R.not_drafting_alarm(requests),
            "by_category": _records(R.by_category(requests)), "per_position": _records(R.per_position(requests))}


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    rows = cast("list[dict[str, Any]]", df.to_dict(orient="records"))   # the frames' column names are str
    return [{k: _scalar(v) for k, v in row.items()} for row in rows]


def _scalar(v: Any) -> Any:
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, float)):
        return None if math.isnan(v) else float(v)
    if v is pd.NA:
        return None
    return v


def _clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return _scalar(obj)


def rolling_summary(rounds: pd.DataFrame, window: int = DEFAULT_ROLLING_WINDOW,
                    n_points: int = 200) -> dict[str, Any] | None:
    """:func:`rolling_acceptance` over rounds across the whole trace (``by_prompt=False``: the window
    runs on over prompt boundaries, in (prompt_id, round) order) summarised: quantiles of the rolling
    rate and an evenly subsampled series of at most ``n_points`` rows (for plotting); None when
    nothing was drafted.

    Only full windows count (the first ``window - 1`` rounds, whose window is still filling, are left
    out) unless the trace has fewer than ``window`` rounds, then every round counts
    (``full_windows`` says which).

    Returns:
        ``{"window", "by_prompt": False, "full_windows", "min", "p10", "median", "p90", "max",
        "series": [{prompt_id, round, acceptance_rate}]}``.
    """
    if not len(rounds):
        return None
    r = rolling_acceptance(rounds, window=window, by_prompt=False)
    full = len(r) >= window
    if full:
        r = r.iloc[window - 1:]
    v = r["acceptance_rate"].to_numpy(dtype=float)
    ok = ~np.isnan(v)
    if not ok.any():
        return None
    q = np.quantile(v[ok], [0.0, 0.1, 0.5, 0.9, 1.0])
    idx = np.unique(np.linspace(0, len(r) - 1, num=min(n_points, len(r))).round().astype(np.int64))
    return {"window": int(window), "by_prompt": False, "full_windows": bool(full), "min": float(q[0]),
            "p10": float(q[1]), "median": float(q[2]), "p90": float(q[3]), "max": float(q[4]),
            "series": _records(r.iloc[idx])}


def steps_of_rounds(steps: pd.DataFrame, rounds: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``steps`` whose ``(prompt_id, round)`` ``rounds`` holds (both frames need those columns): a trace
    whose rounds part was lost keeps that part's steps (docs/TRACE_FORMAT.md), and a figure over steps beside the
    rounds' figures must count the same rounds. ``steps`` itself when every step's round is there."""
    key = (_ints(rounds["prompt_id"]).astype(np.int64) << 32) | _ints(rounds["round"]).astype(np.int64)
    s_key = (_ints(steps["prompt_id"]).astype(np.int64) << 32) | _ints(steps["round"]).astype(np.int64)
    keep = np.isin(s_key, key)
    return steps if keep.all() else steps[keep].reset_index(drop=True)


def summarize(rounds: pd.DataFrame, steps: pd.DataFrame | None = None,
              requests: pd.DataFrame | None = None, *, streak_top: int = 5,
              max_k: int | None = None, window: int = DEFAULT_ROLLING_WINDOW) -> dict[str, Any]:
    """Every metric as one JSON-ready dict (NaN -> None). Pure: works on DataFrames only.

    Keys: ``n_rounds``, ``n_verify_rounds``, ``n_drafted``, ``n_accepted``, ``acceptance_rate``,
    ``mean_acceptance_length``, ``mean_acceptance_length_formula`` (:data:`MAL_OVER_VERIFY_ROUNDS` or
    :data:`MAL_OVER_DRAFTS`), ``per_position``, ``prompts``, ``first_mismatch``,
    ``n_all_accepted``, ``zero_acceptance_streaks`` ({n_streaks, n_rounds_in_streaks, longest, top}),
    ``rolling`` (:func:`rolling_summary` with ``window``, or None),
    ``timing_ms`` ({t_draft_ms_mean, t_verify_ms_mean} or None), ``centroid_coverage`` (or None when
    no step knows ``target_in_candidates``), ``requests`` (server-log totals or None).
    For a trace with no rounds but request rows, the totals come from :func:`request_totals` (the mean acceptance
    length over the requests' drafts: :data:`MAL_OVER_DRAFTS`).
    """
    out: dict[str, Any] = totals(rounds).to_dict()
    out["mean_acceptance_length_formula"] = MAL_OVER_VERIFY_ROUNDS
    out["per_position"] = _records(per_position_acceptance(rounds, max_k))
    out["prompts"] = _records(per_prompt(rounds))
    out["first_mismatch"] = _records(first_mismatch_histogram(rounds, max_k))
    out["n_all_accepted"] = n_all_accepted(rounds)
    streaks = zero_acceptance_streaks(rounds)
    out["zero_acceptance_streaks"] = {
        "n_streaks": int(len(streaks)),
        "n_rounds_in_streaks": int(streaks["length"].sum()) if len(streaks) else 0,
        "longest": int(streaks["length"].max()) if len(streaks) else 0,
        "top": _records(streaks.head(streak_top)),
    }
    out["rolling"] = rolling_summary(rounds, window) if {"prompt_id", "round"} <= set(rounds.columns) else None
    out["timing_ms"] = timing(rounds)
    cc = None
    if steps is not None and {"prompt_id", "round"} <= set(steps.columns) and \
            {"prompt_id", "round"} <= set(rounds.columns):
        steps = steps_of_rounds(steps, rounds)
    if steps is not None and "target_in_candidates" in steps.columns and \
            steps["target_in_candidates"].notna().any():
        cc = centroid_coverage(steps)
    out["centroid_coverage"] = cc
    req = None
    if requests is not None and len(requests):
        req = request_totals(requests)
        if not len(rounds):
            out["n_drafted"], out["n_accepted"] = req["n_drafted"], req["n_accepted"]
            out["acceptance_rate"] = req["acceptance_rate"]
            out["mean_acceptance_length"] = req["mean_acceptance_length"]
            out["mean_acceptance_length_formula"] = MAL_OVER_DRAFTS
    out["requests"] = req
    cleaned: dict[str, Any] = _clean(out)
    return cleaned


def report(trace: TraceLike) -> TraceReport:
    """:func:`summarize` for an opened trace as a :class:`TraceReport`, reading only the columns it needs, plus
    ``trace``, ``source``, ``complete``, ``n_prompts`` and ``warnings``; each ``prompts`` row also carries the
    prompt's ``text`` from the manifest ("" when the manifest has none). ``report(trace).to_dict()`` is
    ``mtpscope report --json``'s body.

    Args:
        trace: a :class:`traces.store.reader.Trace`.

    Raises:
        TraceFormatError: a table lacks a column the metrics need.
    """
    rounds = trace.columns("rounds", REPORT_ROUNDS_COLUMNS)
    steps = None
    if trace.manifest.get("centroids") is not None:
        steps = trace.columns("steps", ["prompt_id", "round", "k", "accepted", "target_in_candidates"])
    requests = trace.requests if trace.part_files("requests") else None
    b = summarize(rounds, steps, requests)
    prompt_ids = {int(p) for p in rounds["prompt_id"].unique()} if len(rounds) else set()
    texts = prompt_texts(trace.manifest.get("prompts"))
    z, ro, tm, cc, rq = (b["zero_acceptance_streaks"], b["rolling"], b["timing_ms"], b["centroid_coverage"],
                         b["requests"])
    return TraceReport(
        trace=str(trace.path), source=trace.manifest.get("source"), complete=bool(trace.manifest.get("complete")),
        n_prompts=max(len(trace.manifest.get("prompts") or []), len(prompt_ids)),
        n_rounds=b["n_rounds"], n_verify_rounds=b["n_verify_rounds"], n_drafted=b["n_drafted"],
        n_accepted=b["n_accepted"], acceptance_rate=b["acceptance_rate"],
        mean_acceptance_length=b["mean_acceptance_length"],
        mean_acceptance_length_formula=b["mean_acceptance_length_formula"],
        per_position=tuple(PositionRow(**p) for p in b["per_position"]),
        prompts=tuple(PromptRow(text=texts.get(p["prompt_id"], ""), **p) for p in b["prompts"]),
        first_mismatch=tuple(MismatchRow(**f) for f in b["first_mismatch"]),
        n_all_accepted=b["n_all_accepted"],
        zero_acceptance_streaks=Streaks(z["n_streaks"], z["n_rounds_in_streaks"], z["longest"],
                                        tuple(StreakRow(**t) for t in z["top"])),
        rolling=None if ro is None else RollingSummary(**{**ro, "series": tuple(RollingPoint(**p)
                                                                                 for p in ro["series"])}),
        timing_ms=None if tm is None else Timing(**tm),
        centroid_coverage=None if cc is None else CentroidCoverage(
            **{**cc, "per_position": tuple(CoverageRow(**p) for p in cc["per_position"])}),
        requests=None if rq is None else RequestTotals(**{
            **rq, "by_category": tuple(CategoryRequests(**c) for c in rq["by_category"]),
            "per_position": tuple(ServerPositionRow(**p) for p in rq["per_position"])}),
        warnings=tuple(trace.warnings), n_rounds_recorded=trace.rounds_not_read(b["n_rounds"]))
