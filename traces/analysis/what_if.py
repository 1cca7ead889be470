"""Which n_draft? An estimate, from one trace, of acceptance and speed at n_draft = 1..8.

One job: the what-if model below, fitted to one trace's ``rounds`` (pure) and, through
:func:`what_if_trace`, to an opened trace and its manifest's ``baseline`` (plain greedy decoding timed by
``mtpscope record --baseline``). The formula is printed in ``docs/EXPLAIN.md``.

**Acceptance.** With greedy verification a draft's fate does not depend on how many drafts follow it,
but it does depend on where the round starts: after a rejection the pending token is the target's
correction of a draft the drafter got wrong, after a fully accepted round it is a bonus token. Which
positions start rounds changes with n_draft (shorter drafts start rounds everywhere), so the trace's
rounds are split by their **start type** ``T``: ``B`` (the prompt's first round, or the previous round
accepted every draft) or ``M`` (the previous round had a mismatch). Per type, the survival
``q^T_k = P(drafts 1..k all accepted) = #(T, n_accepted >= k) / #(T, n_draft >= k)`` (k = 1..K, K = the
recorded n_draft; a type without such rounds uses the pooled ``q_k``). Beyond K the conditional
acceptance ``c_k = q_k / q_{k-1}`` of each type is extrapolated geometrically: ``c_k = c_K * b^(k-K)``
with ``b`` the ratio of a count-weighted least-squares fit of ``log c_k`` on ``k`` (k = 1..K), clipped to
``[0, 1]`` (``b = 1`` when K = 1). At n_draft ``N`` a round ends fully accepted with probability
``q^T_N``, so the start type is a two-state Markov chain whose stationary share of ``B`` starts is

    pi_B(N) = q^M_N / (1 - q^B_N + q^M_N)

shifted by the trace's own offset ``s_B - pi_B(K)`` (``s_B``: the share of B starts among the trace's
rounds; the shift carries the prompts' first rounds and makes N = K exact) and clipped to [0, 1]. A round
``r`` of the trace drafts ``L_r(N) = N`` tokens, or ``min(n_draft_r, N)`` when it was capped (it drafted
fewer than K: the end of ``max_tokens``). With ``Q^T(L) = q^T_1 + ... + q^T_L``:

    E[accepted](N)          = sum_r ( pi_B Q^B(L_r) + (1 - pi_B) Q^M(L_r) )
    acceptance rate(N)      = E[accepted](N) / sum_r L_r(N)
    mean acceptance length  = 1 + E[accepted](N) / #rounds

plus ``residual * sum_r L_r(N)``, where ``residual`` is the model's acceptance-rate error at N = K (left by
capped rounds whose start types are not spread like the others'): the estimate reproduces the trace's own
acceptance rate and mean acceptance length exactly at N = K. With one start type only (``pi_B``
constant) this is the plain per-position model.

**Cost.** Drafting is sequential: ``t_draft(L) = L * t_step`` with ``t_step = sum t_draft_ms / sum
n_draft`` (ms per draft step). Verifying ``n = L + 1`` tokens in one target batch: ``t_verify(n) = v0 +
v1 * n``, a least-squares line through the median ``t_verify_ms`` of each recorded verify size and, when
the manifest has a baseline, the point ``(1, t_plain)`` (plain decoding's ms per token: one target
decode of one token). With a single point the line is flat (``v1 = 0``: verify cost independent of the
batch size, the memory-bound case; ``cost.basis`` says so). ``v1`` is clipped at 0; a negative ``v0``
(noise) refits the line through the origin.

    tokens/s(N) = 1000 * (#rounds + E[accepted](N)) / sum_r (t_draft(L_r(N)) + t_verify(L_r(N) + 1))
    speedup(N)  = tokens/s(N) / (1000 / t_plain)

``t_plain`` is the baseline's measured ms per token, else the fitted ``t_verify(1)`` (``baseline:
"estimated"``). The recommended n_draft maximises tokens/s (ties: the smaller n_draft).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from mtpscope.errors import TraceFormatError
from mtpscope.traces.store.protocols import TraceLike

N_MAX = 8
WHAT_IF_ROUNDS_COLUMNS = ["prompt_id", "round", "n_draft", "n_accepted", "t_draft_ms", "t_verify_ms"]


@dataclass(frozen=True)
class CostModel:
    """Fitted cost per round (milliseconds).

    Attributes:
        t_step_ms: drafter cost per draft step.
        v0_ms, v1_ms: ``t_verify(n) = v0_ms + v1_ms * n`` for a verify batch of ``n`` tokens.
        t_plain_ms: plain decoding's cost per token (measured baseline, or ``t_verify(1)``).
        baseline: ``"measured"`` or ``"estimated"``.
        basis: how the verify line was fitted, in words.
        verify_sizes: ``{n: median t_verify_ms}`` of the recorded verify sizes.
    """

    t_step_ms: float | None
    v0_ms: float | None
    v1_ms: float | None
    t_plain_ms: float | None
    baseline: str
    basis: str
    verify_sizes: dict[int, float]

    def t_round_ms(self, n_draft: np.ndarray) -> np.ndarray:
        """Cost of rounds drafting ``n_draft`` tokens each (``shape`` of ``n_draft``)."""
        n = np.asarray(n_draft, dtype=np.float64)
        return n * (self.t_step_ms or 0.0) + (self.v0_ms or 0.0) + (self.v1_ms or 0.0) * (n + 1)


@dataclass(frozen=True)
class WhatIfRow:
    """The estimate at one n_draft.

    Attributes:
        n_draft: drafts per round.
        acceptance_rate: accepted / drafted.
        mean_acceptance_length: 1 + accepted / verify rounds (tokens per target verify).
        tokens_per_s: generated tokens per second (None without timings).
        speedup: tokens_per_s over plain decoding's (None without timings).
        recorded: n_draft is the trace's own.
        extrapolated: uses per-position acceptance beyond the recorded n_draft.
    """

    n_draft: int
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    tokens_per_s: float | None
    speedup: float | None
    recorded: bool
    extrapolated: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return asdict(self)


@dataclass(frozen=True)
class WhatIf:
    """The what-if estimate of one trace (or one category of it).

    Attributes:
        rows: :class:`WhatIfRow` for n_draft = 1..n_max.
        best_n_draft: the n_draft with the highest tokens/s (None without timings).
        recorded_n_draft: K, the largest n_draft of the trace.
        q: ``P(drafts 1..k accepted)`` for k = 1..n_max over all rounds (measured up to K, then
            extrapolated).
        tail_ratio: ``b`` of the extrapolation (all rounds).
        q_b / q_m: the same for rounds of start type B / M.
        share_b: the share of B starts among the trace's rounds.
        cost: the :class:`CostModel` (None without timings).
        n_rounds: rounds the estimate is fitted on.
    """

    rows: tuple[WhatIfRow, ...]
    best_n_draft: int | None
    recorded_n_draft: int
    q: tuple[float, ...]
    tail_ratio: float
    cost: CostModel | None
    n_rounds: int
    q_b: tuple[float, ...] = ()
    q_m: tuple[float, ...] = ()
    share_b: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (``rows`` as dicts)."""
        return {"rows": [r.to_dict() for r in self.rows], "best_n_draft": self.best_n_draft,
                "recorded_n_draft": self.recorded_n_draft, "q": list(self.q), "tail_ratio": self.tail_ratio,
                "cost": None if self.cost is None else asdict(self.cost), "n_rounds": self.n_rounds,
                "q_b": list(self.q_b), "q_m": list(self.q_m), "share_b": self.share_b}


def _survival(nd: np.ndarray, na: np.ndarray, K: int, n_all: int) -> tuple[np.ndarray, float, np.ndarray]:
    """``(q[0..n_all-1], b, den)`` for rounds with draft counts ``nd`` / accepted ``na`` (module docstring);
    ``q`` NaN where no round drafted that far (k <= K)."""
    kk = np.arange(1, K + 1)
    den = np.array([(nd >= k).sum() for k in kk], dtype=np.float64)
    num = np.array([(na >= k).sum() for k in kk], dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)
    prev = np.concatenate([[1.0], q[:-1]])
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.where(prev > 0, q / prev, 0.0)
    b = 1.0
    ok = (c > 0) & (den > 0)
    if K >= 2 and ok.sum() >= 2:
        w = den[ok]
        x, y = kk[ok].astype(np.float64), np.log(c[ok])
        xm, ym = np.average(x, weights=w), np.average(y, weights=w)
        var = np.average((x - xm) ** 2, weights=w)
        slope = np.average((x - xm) * (y - ym), weights=w) / var if var > 0 else 0.0
        b = float(min(max(math.exp(slope), 0.0), 1.0))
    out = np.empty(n_all, dtype=np.float64)
    out[:K] = q
    cK = float(c[-1]) if np.isfinite(c[-1]) else 0.0
    for k in range(K + 1, n_all + 1):
        out[k - 1] = out[k - 2] * min(max(cK * b ** (k - K), 0.0), 1.0)
    return out, b, den


def start_types(rounds: pd.DataFrame) -> np.ndarray:
    """Start type of each round (``True`` = B: the prompt's first round or the previous round of the same
    prompt accepted all its drafts; ``False`` = M), aligned with ``rounds`` rows (columns ``prompt_id``,
    ``round``, ``n_draft``, ``n_accepted``)."""
    n = len(rounds)
    if not n:
        return np.zeros(0, dtype=bool)
    order = np.lexsort((rounds["round"].to_numpy(), rounds["prompt_id"].to_numpy()))
    pid = rounds["prompt_id"].to_numpy()[order]
    nd = rounds["n_draft"].to_numpy(dtype=np.int64)[order]
    na = rounds["n_accepted"].to_numpy(dtype=np.int64)[order]
    b = np.ones(n, dtype=bool)
    b[1:] = (pid[1:] != pid[:-1]) | (na[:-1] == nd[:-1])
    out = np.empty(n, dtype=bool)
    out[order] = b
    return out


def survival(rounds: pd.DataFrame, n_max: int = N_MAX) -> tuple[np.ndarray, float, int]:
    """``(q, b, K)`` over all rounds (one start type): ``q[k-1] = P(drafts 1..k accepted)`` for k = 1..max(n_max,
    K) (measured up to the recorded K, extrapolated after), the tail ratio ``b`` and K.

    Raises:
        TraceFormatError: no round drafted anything.
    """
    nd = rounds["n_draft"].to_numpy(dtype=np.int64)
    na = rounds["n_accepted"].to_numpy(dtype=np.int64)
    K = int(nd.max()) if len(nd) else 0
    if K < 1:
        raise TraceFormatError("no round drafted a token: nothing to estimate from", key="n_draft",
                               expected="> 0", actual=0)
    q, b, _ = _survival(nd, na, K, max(n_max, K))
    return q, b, K


def fit_cost(rounds: pd.DataFrame, t_plain_ms: float | None = None) -> CostModel | None:
    """The cost model (module docstring) from ``t_draft_ms`` / ``t_verify_ms`` / ``n_draft`` of the rounds
    that drafted; ``t_plain_ms``: the measured baseline (ms per token) or None. None when the rounds have
    no timings."""
    if "t_draft_ms" not in rounds.columns or "t_verify_ms" not in rounds.columns:
        return None
    nd = rounds["n_draft"].to_numpy(dtype=np.int64)
    td = pd.to_numeric(rounds["t_draft_ms"], errors="coerce").to_numpy(dtype=np.float64)
    tv = pd.to_numeric(rounds["t_verify_ms"], errors="coerce").to_numpy(dtype=np.float64)
    m = (nd > 0) & np.isfinite(td) & np.isfinite(tv)
    if not m.any():
        return None
    t_step = float(td[m].sum() / nd[m].sum())
    sizes = {int(n + 1): float(np.median(tv[m & (nd == n)])) for n in np.unique(nd[m])}
    counts = {int(n + 1): int((m & (nd == n)).sum()) for n in np.unique(nd[m])}
    xs = list(sizes)
    ys = [sizes[x] for x in xs]
    ws = [counts[x] for x in xs]
    if t_plain_ms is not None and math.isfinite(t_plain_ms) and t_plain_ms > 0:
        xs.append(1)
        ys.append(float(t_plain_ms))
        ws.append(max(ws))
        basis = "line through the median verify time per recorded verify size and the measured baseline"
    else:
        basis = "line through the median verify time per recorded verify size"
    x, y, w = np.asarray(xs, float), np.asarray(ys, float), np.asarray(ws, float)
    if len(np.unique(x)) >= 2:
        xm, ym = np.average(x, weights=w), np.average(y, weights=w)
        v1 = float(np.average((x - xm) * (y - ym), weights=w) / np.average((x - xm) ** 2, weights=w))
        v1 = max(v1, 0.0)
        v0 = float(ym - v1 * xm)
        if v0 < 0:  # a negative fixed cost is noise: refit through the origin
            v0, v1 = 0.0, float(np.sum(w * x * y) / np.sum(w * x * x))
            basis += " (through the origin: the free fit had a negative intercept)"
    else:
        v1, v0 = 0.0, float(y[0])
        basis = "one verify size measured: verify cost taken as independent of the batch size"
    measured = t_plain_ms is not None and math.isfinite(t_plain_ms) and t_plain_ms > 0
    t_plain = float(t_plain_ms) if measured else v0 + v1
    return CostModel(t_step_ms=t_step, v0_ms=v0, v1_ms=v1, t_plain_ms=t_plain,
                     baseline="measured" if measured else "estimated", basis=basis, verify_sizes=sizes)


def what_if(rounds: pd.DataFrame, *, t_plain_ms: float | None = None, n_max: int = N_MAX) -> WhatIf:
    """The estimate for n_draft = 1..``n_max`` (module docstring) from a trace's rounds.

    Args:
        rounds: columns ``n_draft``, ``n_accepted``; ``t_draft_ms``, ``t_verify_ms`` for speed.
        t_plain_ms: plain decoding's measured ms per token (``manifest["baseline"]["t_per_token_ms"]``).
        n_max: the largest n_draft estimated (>= 1).

    Raises:
        TraceFormatError: missing columns, no drafting round, ``n_max < 1``.
    """
    for c in ("n_draft", "n_accepted"):
        if c not in rounds.columns:
            raise TraceFormatError("rounds lacks a column", key=c, expected="present", actual="missing")
    if n_max < 1:
        raise TraceFormatError("n_max must be >= 1", key="n_max", expected=">= 1", actual=n_max)
    nd_all = rounds["n_draft"].to_numpy(dtype=np.int64)
    drafting = rounds[nd_all > 0]
    q, b, K = survival(drafting, n_max)
    n_all = len(q)
    nd = drafting["n_draft"].to_numpy(dtype=np.int64)
    na = drafting["n_accepted"].to_numpy(dtype=np.int64)
    is_b = start_types(drafting) if {"prompt_id", "round"} <= set(drafting.columns) else np.ones(len(nd), bool)
    per_type = {}
    for t, m in ((True, is_b), (False, ~is_b)):
        qt, _, _ = _survival(nd[m], na[m], K, n_all) if m.any() else (np.full(n_all, np.nan), 1.0, None)
        per_type[t] = np.where(np.isnan(qt), q, qt)          # a type that never drafted that far: pooled
    QB = np.concatenate([[0.0], np.cumsum(per_type[True])])
    QM = np.concatenate([[0.0], np.cumsum(per_type[False])])

    def pi_b(N: int) -> float:
        qb, qm = per_type[True][N - 1], per_type[False][N - 1]
        den = 1.0 - qb + qm
        return float(qm / den) if den > 0 else 1.0

    share_b = float(is_b.mean()) if len(is_b) else 1.0
    shift = share_b - pi_b(K)
    capped = nd < K

    def model(N: int) -> tuple[np.ndarray, float]:
        L = np.where(capped, np.minimum(nd, N), N)
        pb = min(max(pi_b(N) + shift, 0.0), 1.0)
        return L, float(pb * QB[L].sum() + (1.0 - pb) * QM[L].sum())

    L_K, acc_K = model(K)
    residual = (float(na.sum()) - acc_K) / float(L_K.sum())     # the model's rate error at N = K
    cost = fit_cost(drafting, t_plain_ms)
    rows = []
    for N in range(1, n_max + 1):
        L, acc = model(N)
        drafted = float(L.sum())
        acc = min(max(acc + residual * drafted, 0.0), drafted)
        n_r = len(L)
        tps = speed = None
        if cost is not None:
            t = float(cost.t_round_ms(L).sum())
            tps = 1000.0 * (n_r + acc) / t if t > 0 else None
            speed = tps * cost.t_plain_ms / 1000.0 if tps is not None and cost.t_plain_ms else None
        rows.append(WhatIfRow(n_draft=N, acceptance_rate=acc / drafted if drafted else None,
                              mean_acceptance_length=1.0 + acc / n_r if n_r else None, tokens_per_s=tps,
                              speedup=speed, recorded=N == K, extrapolated=N > K))
    best = None
    if cost is not None:
        cands = [r for r in rows if r.tokens_per_s is not None]
        if cands:
            best = max(cands, key=lambda r: (r.tokens_per_s, -r.n_draft)).n_draft
    return WhatIf(rows=tuple(rows), best_n_draft=best, recorded_n_draft=K, q=tuple(float(v) for v in q[:n_max]),
                  tail_ratio=b, cost=cost, n_rounds=int(len(drafting)),
                  q_b=tuple(float(v) for v in per_type[True][:n_max]),
                  q_m=tuple(float(v) for v in per_type[False][:n_max]), share_b=share_b)


def baseline_ms(manifest: Mapping[str, Any]) -> float | None:
    """Plain decoding's ms per token from ``manifest["baseline"]["t_per_token_ms"]`` (``record
    --baseline``), None when absent or not a positive number."""
    b = manifest.get("baseline")
    v = b.get("t_per_token_ms") if isinstance(b, dict) else None
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
        return float(v)
    return None


def what_if_by_category(rounds: pd.DataFrame, categories: Mapping[int, str], *, t_plain_ms: float | None = None,
                        n_max: int = N_MAX) -> dict[str, WhatIf]:
    """:func:`what_if` per prompt category (``{prompt_id: category}``; others ``(none)``); categories
    whose rounds drafted nothing are left out."""
    pid = rounds["prompt_id"].to_numpy(dtype=np.int64)
    lab = pd.Series(pid).map(lambda p: categories.get(int(p), "(none)")).to_numpy(dtype=object)
    out: dict[str, WhatIf] = {}
    for name in sorted(set(lab.tolist())):
        sub = rounds[lab == name]
        if (sub["n_draft"].to_numpy() > 0).any():
            out[name] = what_if(sub, t_plain_ms=t_plain_ms, n_max=n_max)
    return out


def what_if_trace(trace: TraceLike, *, n_max: int = N_MAX) -> WhatIf:
    """:func:`what_if` of an opened trace (:class:`traces.store.protocols.TraceLike`; reads only the columns it needs; the
    baseline from its manifest). For the sweep comparison: the n_draft 1..8 rows are ``.rows``.

    Raises:
        TraceFormatError: the trace has no drafting round.
    """
    rounds = trace.columns("rounds", WHAT_IF_ROUNDS_COLUMNS)
    return what_if(rounds, t_plain_ms=baseline_ms(trace.manifest), n_max=n_max)
