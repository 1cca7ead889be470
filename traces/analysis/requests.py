"""llama-server requests: the per-request table every request trace shares (probe, server-log import, and a
recording seen request by request), its groupings, the not-drafting alarm and a request-by-request diff.
Pure functions over DataFrames (no I/O).

Definitions (llama-server's own, tools/server/server-context.cpp of the vendored llama.cpp):

* **acceptance rate** of a request = ``draft_n_accepted / draft_n`` (null when nothing was drafted);
* **mean acceptance length** = ``1 + accepted / drafts``, drafts being verification steps (the server's
  ``spec_decode_num_drafts_total``; its log's ``mean len``). A log line has no drafts count, only ``mean len``
  printed to two decimals: its drafts are the one whole number that ``mean len`` allows
  (:func:`drafts_from_mean_len`), unknown when several do;
* **acceptance at draft position i** (1-based here; the server's ``position`` label is 0-based) = accepted at
  position i / drafts: what the server's log prints as ``acc per pos``, and
  :func:`mtpscope.traces.analysis.metrics.per_position_acceptance`'s ``per_verify_round``;
* **tokens/s** = the server's ``timings.predicted_per_second`` (generated tokens over generation time, prompt
  processing excluded).

Which rows count: a trace may hold several kinds of rows for the same requests (an imported log with both
acceptance lines and response JSON); :func:`request_rows` keeps one kind, preferring ``probe``, then
``response``, then ``log`` (:data:`KIND_PREFERENCE`).

Typed results (what reaches the app and the CLI): :func:`totals` -> :class:`ServerTotals`, :func:`requests_view` ->
:class:`RequestsView`, :func:`request_pairs` -> :class:`RequestPair` rows; each record's ``to_dict()`` is its JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard, cast

import numpy as np
import pandas as pd

from mtpscope.traces.analysis import rates
from mtpscope.traces.analysis.ordering import worst_first
from mtpscope.traces.analysis.records import JsonRecord
from mtpscope.traces.analysis.wording import plural

#: the row kinds of ``requests``, preferred first
KIND_PREFERENCE = ("probe", "response", "log")

#: columns of :func:`request_table`, in display order
TABLE_COLUMNS = ("request", "prompt", "category", "repeat", "n_prompt_tokens", "n_output_tokens", "n_drafted",
                 "n_accepted", "acceptance_rate", "n_drafts", "mean_acceptance_length", "accepted_per_pos",
                 "tokens_per_s", "generation_ms", "wall_ms", "started_unix_s", "ended_unix_s")

ALARM = ("the server is not running MTP: no draft tokens in {n} — check `--spec-type draft-mtp` and the draft "
         "model")


@dataclass(frozen=True)
class ServerTotals(JsonRecord):
    """:func:`totals` of request rows (the module docstring's definitions).

    Attributes:
        n_requests: requests; n_drafted / n_accepted: draft tokens; acceptance_rate: accepted / drafted (0..1, NaN
        when nothing was drafted); n_drafts: verification steps (None when unknown); mean_acceptance_length:
        1 + accepted / drafts over the requests whose drafts are known (tokens, NaN when unknown);
        tokens_per_s_mean: the mean of the requests' tokens/s (NaN when none is known);
        tokens_per_s_pooled: all generated tokens over all generation time, ``sum(tokens/s * generation_ms) /
        sum(generation_ms)`` over the requests where both are known (NaN when none): what ``report`` gives a
        recording, and the rate a mean of short and long requests is not.
    """

    n_requests: int
    n_drafted: int
    n_accepted: int
    acceptance_rate: float
    n_drafts: int | None
    mean_acceptance_length: float
    tokens_per_s_mean: float
    tokens_per_s_pooled: float = math.nan


@dataclass(frozen=True)
class RequestsView:
    """The request tables of a trace as the Server page and ``explain --by request`` show them
    (:func:`requests_view`): ``table`` (:func:`request_table`), ``totals``, ``by_category``, ``per_position``
    (DataFrames of :func:`by_category` / :func:`per_position`) and ``alarm`` (:func:`not_drafting_alarm`)."""

    table: pd.DataFrame
    totals: ServerTotals
    by_category: pd.DataFrame
    per_position: pd.DataFrame
    alarm: str | None


@dataclass(frozen=True)
class RequestPair(JsonRecord):
    """One row of :func:`compare_requests` as its JSON has it (:func:`request_pairs`): the prompt, its occurrence,
    the request numbers, drafted and accepted tokens on sides A and B, ``same_counts``, ``same_output`` (None
    when a side lacks the token ids)."""

    prompt: Any
    occurrence: int
    request_a: Any
    request_b: Any
    drafted_a: Any
    drafted_b: Any
    accepted_a: Any
    accepted_b: Any
    same_counts: bool
    same_output: bool | None

    @property
    def differs(self) -> bool:
        """The counts differ, or the outputs are known to differ."""
        return not self.same_counts or self.same_output is False


def request_rows(requests: pd.DataFrame) -> pd.DataFrame:
    """The rows of one kind (see the module docstring), in ``request`` order; empty stays empty."""
    if not len(requests) or "kind" not in requests.columns:
        return requests
    kinds = set(requests["kind"].tolist())
    kind = next((k for k in KIND_PREFERENCE if k in kinds), sorted(kinds)[0])
    sub = requests[requests["kind"] == kind]
    return sub.sort_values("request", kind="stable") if "request" in sub.columns else sub


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    return df[name] if name in df.columns else pd.Series([None] * len(df), index=df.index, dtype=object)


def _num(s: pd.Series) -> np.ndarray:
    """A writable float64 copy (pandas' copy-on-write hands out read-only views; :func:`_drafts` writes)."""
    return np.array(pd.to_numeric(s, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan), dtype=np.float64)


def request_table(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per request (:func:`request_rows`) with :data:`TABLE_COLUMNS`: the prompt's id (the request
    number where none is known), tokens in / out (``n_output_tokens`` = ``predicted_n``), drafted, accepted,
    acceptance rate, drafts (a log line's: :func:`drafts_from_mean_len`), mean acceptance length (1 + accepted /
    drafts, else the log's own ``mean len``),
    accepted per position (list, 1-based order), tokens/s (``timings.predicted_per_second``, else
    ``predicted_n / predicted_ms``), generation time (``predicted_ms``; for a recording its draft + verify time),
    wall time. Missing values are NaN / None.
    """
    r = request_rows(requests)
    out = pd.DataFrame(index=r.index)
    req = pd.to_numeric(_col(r, "request"), errors="coerce").to_numpy(np.float64)
    req = np.where(np.isnan(req), np.arange(len(r)), req).astype(np.int64)    # no request number: the row's place
    out["request"] = req
    out["prompt"] = [p if isinstance(p, str) else f"#{q}" for p, q in zip(_col(r, "prompt"), req, strict=True)]
    out["category"] = _col(r, "category").astype(object)
    out["repeat"] = _col(r, "repeat")
    out["n_prompt_tokens"] = _col(r, "n_prompt_tokens")
    out["n_output_tokens"] = _col(r, "predicted_n")
    nd, na = _num(_col(r, "n_drafted")), _num(_col(r, "n_accepted"))
    out["n_drafted"], out["n_accepted"] = _col(r, "n_drafted"), _col(r, "n_accepted")
    out["acceptance_rate"] = rates.acceptance_rates(na, nd)
    drafts = _drafts(r)
    mal = rates.mean_acceptance_lengths(na, np.where(drafts > 0, drafts, 0))      # (unknown drafts: NaN)
    stored = _num(_col(r, "mean_acceptance_length"))
    given = _col(r, "n_drafts")
    out["n_drafts"] = given if np.array_equal(np.isnan(drafts), np.isnan(_num(given))) else \
        [None if np.isnan(d) else int(d) for d in drafts]          # counts, a log line's derived among them
    out["mean_acceptance_length"] = np.where(np.isnan(mal), stored, mal)
    per_pos: list[Any] = [list(v) if isinstance(v, (list, tuple, np.ndarray)) else None   # lists: one cell each
                          for v in _col(r, "accepted_per_pos")]
    out["accepted_per_pos"] = per_pos
    tps = _num(_col(r, "tokens_per_s"))
    pn, pms = _num(_col(r, "predicted_n")), _num(_col(r, "predicted_ms"))
    with np.errstate(invalid="ignore", divide="ignore"):
        derived = np.where(pms > 0, pn / np.where(pms > 0, pms, 1) * 1e3, np.nan)
    out["tokens_per_s"] = np.where(np.isnan(tps), derived, tps)
    out["generation_ms"] = pms
    out["wall_ms"] = _num(_col(r, "wall_ms"))
    out["started_unix_s"] = _num(_col(r, "started_unix_s"))
    out["ended_unix_s"] = _num(_col(r, "ended_unix_s"))
    return out.reset_index(drop=True)


#: half the last printed digit of the log's ``mean len`` (llama-server prints it with ``%5.2f``)
MEAN_LEN_HALF_STEP = 0.005


def drafts_from_mean_len(accepted: Any, generated: Any, mean_len: Any) -> int | None:
    """A request's drafts (verification steps) from what its log line prints: ``accepted``, ``generated`` draft
    tokens and ``mean len`` = 1 + accepted / drafts rounded to two decimals. The one whole number ``d`` in
    1..``generated`` (each draft holds at least one token) with ``|1 + accepted / d - mean len| <= 0.005``; None
    when a value is missing or no ``d`` or more than one fits (never guessed: nothing accepted fits every ``d``)."""
    try:
        a, g, m = float(accepted), float(generated), float(mean_len)
    except (TypeError, ValueError):
        return None
    if not all(math.isfinite(v) for v in (a, g, m)) or a < 0 or g < 1:
        return None
    x, h = m - 1.0, MEAN_LEN_HALF_STEP
    if x + h <= 0:
        return None
    lo = a / (x + h)
    hi = a / (x - h) if x - h > 0 else math.inf
    first, last = max(1, math.floor(lo) - 1), min(int(g), math.ceil(hi) + 1 if math.isfinite(hi) else int(g))
    if last - first > 4:                       # a window this wide holds several whole numbers
        return None
    fits = [d for d in range(first, last + 1) if abs(rates.nan_if_none(rates.mean_acceptance_length(a, d)) - m) <= h + 1e-9]
    return fits[0] if len(fits) == 1 else None


def _drafts(r: pd.DataFrame) -> np.ndarray:
    """Each row's drafts: its ``n_drafts`` (the counters' delta, a recording's rounds), else for a row with the log's
    ``mean len`` the count it allows (:func:`drafts_from_mean_len`); NaN when unknown."""
    drafts = _num(_col(r, "n_drafts"))
    stored = _num(_col(r, "mean_acceptance_length"))
    na, nd = _num(_col(r, "n_accepted")), _num(_col(r, "n_drafted"))
    for i in np.flatnonzero(np.isnan(drafts) & ~np.isnan(stored)):
        d = drafts_from_mean_len(na[i], nd[i], stored[i])
        drafts[i] = math.nan if d is None else d
    return drafts


def _totals(t: pd.DataFrame) -> ServerTotals:
    nd = float(np.nansum(_num(t["n_drafted"]))) if len(t) else 0.0
    na = float(np.nansum(_num(t["n_accepted"]))) if len(t) else 0.0
    drafts = _num(t["n_drafts"]) if len(t) else np.array([])
    drafts = np.where(_num(t["n_drafted"]) == 0, 0.0, drafts) if len(t) else drafts   # nothing drafted: no drafts
    # the drafts (and so 1 + accepted / drafts) only when every request's are known: a sum over the requests whose
    # are (a log line whose 'mean len' allows several counts: nothing accepted, or a long request) is no total
    n_drafts = float(drafts.sum()) if len(drafts) and not np.isnan(drafts).any() else None
    tps = _num(t["tokens_per_s"]) if len(t) else np.array([])
    return ServerTotals(
        n_requests=int(len(t)), n_drafted=int(nd), n_accepted=int(na),
        acceptance_rate=rates.nan_if_none(rates.acceptance_rate(na, nd)),
        n_drafts=None if n_drafts is None else int(n_drafts),
        mean_acceptance_length=rates.nan_if_none(rates.mean_acceptance_length(na, n_drafts or 0)),
        tokens_per_s_mean=float(np.nanmean(tps)) if len(tps) and not np.isnan(tps).all() else math.nan,
        tokens_per_s_pooled=_pooled(tps, _num(t["generation_ms"]) if len(t) else np.array([])))


def _pooled(tps: np.ndarray, ms: np.ndarray) -> float:
    """``sum(tps * ms) / sum(ms)`` over the rows where both are known and ``ms > 0`` (NaN when none)."""
    ok = ~np.isnan(tps) & ~np.isnan(ms) & (ms > 0)
    return float((tps[ok] * ms[ok]).sum() / ms[ok].sum()) if ok.any() else math.nan


def totals(requests: pd.DataFrame) -> ServerTotals:
    """Totals over :func:`request_table`'s rows (:class:`ServerTotals`): ``n_requests``, ``n_drafted``,
    ``n_accepted``, ``acceptance_rate``, ``n_drafts`` and ``mean_acceptance_length`` = 1 + accepted / drafts (None
    / NaN unless every request's drafts are known: a request that drafted nothing has none), ``tokens_per_s_mean``
    (mean over requests)."""
    return _totals(request_table(requests))


def requests_view(requests: pd.DataFrame) -> RequestsView:
    """:class:`RequestsView` of a ``requests`` table: :func:`request_table`, :func:`totals`,
    :func:`by_category`, :func:`per_position` and :func:`not_drafting_alarm` of it."""
    return RequestsView(table=request_table(requests), totals=totals(requests), by_category=by_category(requests),
                        per_position=per_position(requests), alarm=not_drafting_alarm(requests))


def by_category(requests: pd.DataFrame) -> pd.DataFrame:
    """Per category (``"(none)"`` for requests without one): the :func:`totals` fields, worst acceptance rate
    first."""
    t = request_table(requests)
    if not len(t):
        return pd.DataFrame(columns=["category", "n_requests", "n_drafted", "n_accepted", "acceptance_rate",
                                     "n_drafts", "mean_acceptance_length", "tokens_per_s_mean", "tokens_per_s_pooled"])
    cat = t["category"].where(t["category"].notna(), "(none)")
    rows = [{"category": c, **_totals(t[cat == c]).to_dict()} for c in sorted(set(cat))]
    return worst_first(pd.DataFrame(rows))


def per_position(requests: pd.DataFrame) -> pd.DataFrame:
    """Accepted per draft position over the requests whose per-position counts are known: columns ``k``
    (1-based), ``n_accepted``, ``n_drafts`` (their drafts), ``rate`` (``n_accepted / n_drafts``: the server's
    ``acc per pos``). Empty when no request has them."""
    t = request_table(requests)
    known = [(v, d) for v, d in zip(t["accepted_per_pos"], _num(t["n_drafts"]), strict=True)
             if v is not None and not math.isnan(d)] if len(t) else []
    if not known:
        return pd.DataFrame(columns=["k", "n_accepted", "n_drafts", "rate"])
    n = max(len(v) for v, _ in known)
    acc = np.zeros(n, dtype=np.int64)
    for v, _ in known:
        acc[:len(v)] += np.asarray(v, dtype=np.int64)
    drafts = float(sum(d for _, d in known))
    return pd.DataFrame({"k": np.arange(1, n + 1), "n_accepted": acc, "n_drafts": int(drafts),
                         "rate": acc / drafts if drafts else np.nan})


def not_drafting_alarm(requests: pd.DataFrame) -> str | None:
    """The alarm when the server is not drafting: every request drafted nothing (its ``timings`` had
    ``draft_n`` 0, or no ``draft_n`` at all, which is how llama-server answers when it drafted nothing); None
    otherwise, and with no requests at all (nothing is known yet)."""
    r = request_rows(requests)
    if not len(r):
        return None
    if float(np.nansum(_num(_col(r, "n_drafted")))) == 0:
        return ALARM.format(n=plural(len(r), "request"))
    return None


def requests_from_rounds(rounds: pd.DataFrame, prompts: Sequence[Mapping[str, Any]] | None = None) -> pd.DataFrame:
    """A recorded trace seen request by request (one prompt = one request): the ``requests`` columns that a
    recording knows, so that its prompts compare with a server's requests. ``n_drafts`` = rounds that drafted;
    ``accepted_per_pos[i]`` = rounds with ``n_accepted > i``; ``predicted_n`` = emitted tokens + the prefill's
    one; ``output_tokens`` = the pending token of round 0 then every round's emitted tokens (null without
    ``emitted``). Prompt ids and categories come from the manifest's ``prompts``.

    Uses columns ``prompt_id``, ``round``, ``n_draft``, ``n_accepted``, ``pending_token``, ``emitted``.
    """
    meta = {int(p["prompt_id"]): p for p in (prompts or []) if isinstance(p, Mapping) and "prompt_id" in p}
    r = rounds.sort_values(["prompt_id", "round"], kind="stable") if len(rounds) else rounds
    # cast: the group keys of the integer column prompt_id are ints (pandas-stubs types them as any scalar)
    groups = {int(cast(int, k)): g for k, g in r.groupby("prompt_id", sort=True)} if len(r) else {}
    rows: list[dict[str, Any]] = []
    for pid in sorted(set(meta) | set(groups)):
        p = meta.get(pid, {})
        g = groups.get(pid)
        # no round: the prefill's token ended the prompt (EOG, or max_tokens 1); nothing was drafted
        nd = g["n_draft"].to_numpy(np.int64) if g is not None else np.zeros(0, np.int64)
        na = g["n_accepted"].to_numpy(np.int64) if g is not None else np.zeros(0, np.int64)
        out = None
        if g is not None and "emitted" in g.columns and "pending_token" in g.columns and g["emitted"].notna().all():
            first: Any = g["pending_token"].iloc[0]      # an integer (pandas-stubs: any scalar)
            out = [int(first)] + [int(t) for e in g["emitted"] for t in e]
        drafts = int((nd > 0).sum())
        rows.append({"request": len(rows), "line": len(rows) + 1, "kind": "record", "prompt_id": pid,
                     "prompt": p.get("prompt") or p.get("id") or str(pid), "category": p.get("category"),
                     "n_prompt_tokens": p.get("n_prompt_tokens"), "n_drafted": int(nd.sum()),
                     "n_accepted": int(na.sum()),
                     "acceptance_rate": rates.nan_if_none(rates.acceptance_rate(na.sum(), nd.sum())), "n_drafts": drafts,
                     "mean_acceptance_length": rates.nan_if_none(rates.mean_acceptance_length(na.sum(), drafts)),
                     "accepted_per_pos": [int((na > i).sum()) for i in range(int(nd.max()) if len(nd) else 0)],
                     "predicted_n": None if out is None else len(out), "output_tokens": out})
    return pd.DataFrame(rows)


def compare_requests(a: pd.DataFrame, b: pd.DataFrame, *, reuse_b: bool = False) -> pd.DataFrame:
    """Request-by-request diff of two request tables (:func:`request_rows` of each, or
    :func:`requests_from_rounds`): requests are paired by prompt id and occurrence (the k-th request of prompt
    ``p`` in A with the k-th in B) when both know prompt ids, else by order; ``reuse_b``: every request of
    prompt ``p`` in A is paired with B's first one (a probe's repeats against one recording of each prompt).
    Columns: ``prompt``, ``occurrence``,
    ``request_a`` / ``request_b``, ``drafted_a`` / ``drafted_b``, ``accepted_a`` / ``accepted_b``,
    ``same_counts``, ``same_output`` (token ids equal; None when a side lacks them), in A's order; unpaired
    requests are left out."""
    ra, rb = request_rows(a), request_rows(b)

    def keyed(r: pd.DataFrame) -> list[tuple[Any, int, dict[str, Any]]]:
        seen: dict[Any, int] = {}
        out = []
        use_prompt = "prompt" in r.columns and r["prompt"].notna().all()
        records = cast("list[dict[str, Any]]", r.to_dict(orient="records"))   # the column names are str
        for i, row in enumerate(records):
            key = row["prompt"] if use_prompt else i
            occ = seen.get(key, 0)
            seen[key] = occ + 1
            out.append((key, occ, row))
        return out

    ka, kb = keyed(ra), keyed(rb)
    by_prompt = bool(len(ra)) and bool(len(rb)) and all(isinstance(k, str) for k, _, _ in ka + kb)
    if not by_prompt:
        ka = [(i, 0, row) for i, (_, _, row) in enumerate(ka)]
        kb = [(i, 0, row) for i, (_, _, row) in enumerate(kb)]
    index_b = {(k, o): row for k, o, row in kb}
    rows = []
    for k, o, x in ka:
        y = index_b.get((k, 0 if reuse_b and by_prompt else o))
        if y is None:
            continue
        ta, tb = x.get("output_tokens"), y.get("output_tokens")
        same_out = None
        if _is_list(ta) and _is_list(tb):
            same_out = [int(t) for t in ta] == [int(t) for t in tb]
        rows.append({"prompt": k if by_prompt else x.get("prompt"), "occurrence": o, "request_a": x.get("request"),
                     "request_b": y.get("request"), "drafted_a": x.get("n_drafted"), "drafted_b": y.get("n_drafted"),
                     "accepted_a": x.get("n_accepted"), "accepted_b": y.get("n_accepted"),
                     "same_counts": x.get("n_drafted") == y.get("n_drafted")
                     and x.get("n_accepted") == y.get("n_accepted"), "same_output": same_out})
    return pd.DataFrame(rows, columns=["prompt", "occurrence", "request_a", "request_b", "drafted_a", "drafted_b",
                                       "accepted_a", "accepted_b", "same_counts", "same_output"])


def request_pairs(table: pd.DataFrame) -> tuple[RequestPair, ...]:
    """:func:`compare_requests`' rows as :class:`RequestPair` records, their values as the table's JSON
    (``to_json(orient="records")``) has them: so ``[p.to_dict() for p in request_pairs(t)]`` is that JSON."""
    return tuple(RequestPair(**r) for r in json.loads(table.to_json(orient="records")))


def _is_list(v: Any) -> TypeGuard[list[Any] | tuple[Any, ...] | np.ndarray]:
    return isinstance(v, (list, tuple, np.ndarray))


__all__ = ["ALARM", "KIND_PREFERENCE", "MEAN_LEN_HALF_STEP", "TABLE_COLUMNS", "RequestPair", "RequestsView",
           "ServerTotals", "by_category", "compare_requests", "drafts_from_mean_len", "not_drafting_alarm",
           "per_position", "request_pairs", "request_rows", "request_table", "requests_from_rounds", "requests_view",
           "totals"]
