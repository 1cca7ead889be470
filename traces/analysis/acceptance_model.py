"""Which output positions the drafter gets right: a hidden-Markov model of draft acceptance along the
generated text, fitted to one trace and run at any n_draft. Pure (numpy, pandas); one job. The what-if
(:mod:`traces.analysis.what_if`) is built on it; docs/EXPLAIN.md §4 prints the model.

**Why positions.** With greedy verification the generated text does not depend on n_draft: every n_draft
emits the same tokens, only cut into rounds differently. Output position ``g`` (0 = the prefill's token)
is produced by exactly one event of its round: an accepted draft at depth ``d`` (the round's d-th draft,
chained through ``d - 1`` drafter steps), the target's correction of a draft rejected at depth ``d``,
or a token the drafter did not draft (the bonus token after a fully accepted round, or a plain decode
step). What changes with n_draft is the depth at which each position is drafted. So a trace is read
as one sequence of observations per prompt, ``o_g = (d_g, accepted_g)`` for drafted positions and
nothing for the others.

**The model.** Each position has a hidden state ``s_g`` in ``1..S`` (S = 2: "easy" and "hard" stretches
of text) that follows a Markov chain along the text: ``P(s_1) = pi``, ``P(s_{g+1} | s_g) = A``. A draft
at depth ``d`` of a position in state ``s`` is accepted with probability ``p[s, d]``. Runs of easy
text make a first draft after a fully accepted round (which follows ``n_draft`` accepted positions)
likelier to be accepted the longer the round was, and a category of prompts that stays hard stays
hard: both effects the per-position survival model missed. Fitting is Baum–Welch (expectation
maximisation, scaled forward–backward over all prompts at once) with small pseudo-counts (a Beta /
Dirichlet prior: ``PRIOR``), or with a given prior (a category's fit shrunk to the pooled fit).

**Running it at n_draft N** (:func:`predict`) is exact for the model: a forward pass over positions of
the joint chain (hidden state, depth of the position under N): an accepted draft at depth ``d`` moves
to depth ``d + 1``, or to the bonus position when ``d`` is the round's last draft; a rejection or a
bonus position starts a new round whose first draft is depth 1. A round drafts ``min(N, max_tokens -
n_out - 1)`` tokens (the recorder's cap, ``n_out`` the tokens out so far), so the last rounds of a
``max_tokens``-capped prompt draft fewer. The pass accumulates the expected accepted drafts, drafted
tokens, rounds per draft count and plain steps, for each prompt length at once, and for a batch of
parameter sets (the bootstrap) in one go.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from mtpscope.errors import TraceFormatError
from mtpscope.traces.store.list_columns import flat_list

#: hidden states of the model
N_STATES = 2
#: pseudo-counts of the default prior: each p[s, d] as if PRIOR more drafts had been seen at the
#: prior's mean, each row of A and pi with PRIOR / S more of each transition
PRIOR = 1.0
#: expectation maximisation stops when the log-likelihood gains less than this per observation
TOL = 1e-7
MAX_ITER = 200


@dataclass(frozen=True)
class Observations:
    """One group of prompts read as per-position observations (numpy ``shape`` given).

    Attributes:
        depth: ``int16[P, G]`` depth at which output position ``g + 1`` was drafted (0: not drafted, or
            past the prompt's end); ``G`` = the longest prompt's positions after the first.
        accepted: ``bool[P, G]`` that draft was accepted.
        mask: ``bool[P, G]`` a real position (``g + 1 <= ends[p]``).
        ends: ``int64[P]`` each prompt's last output position (its generated tokens minus one).
        prompt_ids: ``int64[P]``.
        max_depth: the largest depth observed (the trace's n_draft K).
        unit: ``int64[P, G]`` the bootstrap unit of each position (the unit of its round; -1 past the
            end), or None.
    """

    depth: np.ndarray
    accepted: np.ndarray
    mask: np.ndarray
    ends: np.ndarray
    prompt_ids: np.ndarray
    max_depth: int
    unit: np.ndarray | None = None

    @property
    def n_prompts(self) -> int:
        return int(len(self.ends))

    def subset(self, rows: np.ndarray) -> Observations:
        """The prompts at ``rows`` (indices into the prompt axis)."""
        rows = np.asarray(rows, dtype=np.int64)
        g = int(self.ends[rows].max()) if len(rows) else 0
        return Observations(self.depth[rows, :g], self.accepted[rows, :g], self.mask[rows, :g], self.ends[rows],
                            self.prompt_ids[rows], self.max_depth,
                            None if self.unit is None else self.unit[rows, :g])


def observations(rounds: pd.DataFrame, units: np.ndarray | None = None) -> Observations:
    """The per-position observations of ``rounds`` (columns ``prompt_id``, ``round``, ``n_draft``,
    ``n_accepted``; ``emitted`` when present: its length is the round's positions, else ``n_accepted +
    1``). A round with ``n_accepted`` accepted drafts covers positions: depths ``1..n_accepted``
    accepted, then (when it emitted one more token) the correction of the draft rejected at depth
    ``n_accepted + 1``, or the bonus / plain token (depth 0) when nothing was rejected.

    ``units``: ``int[n_rounds]`` (aligned with ``rounds``) a bootstrap unit per round, carried to its
    positions (:attr:`Observations.unit`).

    Raises:
        TraceFormatError: a missing column.
    """
    for c in ("prompt_id", "round", "n_draft", "n_accepted"):
        if c not in rounds.columns:
            raise TraceFormatError("rounds lacks a column", key=c, expected="present", actual="missing")
    if not len(rounds):
        z = np.zeros((0, 0))
        return Observations(z.astype(np.int16), z.astype(bool), z.astype(bool), np.zeros(0, np.int64),
                            np.zeros(0, np.int64), 0)
    order = np.lexsort((rounds["round"].to_numpy(), rounds["prompt_id"].to_numpy()))
    r = rounds.iloc[order]
    pid = r["prompt_id"].to_numpy(dtype=np.int64)
    nd = r["n_draft"].to_numpy(dtype=np.int64)
    na = np.minimum(r["n_accepted"].to_numpy(dtype=np.int64), nd)
    ne = na + 1
    if "emitted" in r.columns:
        fl = flat_list(r["emitted"])
        ne = np.where(fl.valid, fl.lengths, ne)
    ne = np.clip(ne, 0, na + 1)
    starts = np.concatenate([[0], np.cumsum(ne)[:-1]])
    n_pos = int(ne.sum())
    j = np.arange(n_pos) - np.repeat(starts, ne)            # the position's index inside its round
    na_r, nd_r = np.repeat(na, ne), np.repeat(nd, ne)
    depth = np.where(j < na_r, j + 1, np.where(na_r < nd_r, na_r + 1, 0)).astype(np.int16)
    acc = j < na_r
    ppos = np.repeat(pid, ne)
    uniq, first = np.unique(ppos, return_index=True)
    counts = np.bincount(np.searchsorted(uniq, ppos), minlength=len(uniq))
    # prompts whose rounds emitted nothing still exist (their one token came from the prefill)
    allp = np.unique(pid)
    ends = np.zeros(len(allp), np.int64)
    ends[np.searchsorted(allp, uniq)] = counts
    G = int(ends.max()) if len(ends) else 0
    D = np.zeros((len(allp), G), np.int16)
    Acc = np.zeros((len(allp), G), bool)
    row = np.searchsorted(allp, ppos)
    col = np.arange(n_pos) - np.repeat(first, counts)
    D[row, col] = depth
    Acc[row, col] = acc
    mask = np.arange(G)[None, :] < ends[:, None]
    U = None
    if units is not None:
        U = np.full((len(allp), G), -1, np.int64)
        U[row, col] = np.repeat(np.asarray(units, dtype=np.int64)[order], ne)
    return Observations(D, Acc, mask, ends, allp, int(depth.max()) if n_pos else 0, U)


@dataclass(frozen=True)
class Params:
    """Model parameters, one set or a batch of ``B`` (leading axis).

    Attributes:
        pi: ``float[(B,) S]`` the state of output position 1.
        A: ``float[(B,) S, S]`` state transitions between consecutive positions (rows sum to 1).
        p: ``float[(B,) S, D]`` P(draft accepted | state, depth d = 1..D); states ordered by ``p[:, 0]``,
            highest first.
    """

    pi: np.ndarray
    A: np.ndarray
    p: np.ndarray

    def to_dict(self) -> dict[str, list]:
        """JSON-ready lists (one set)."""
        return {"pi": self.pi.tolist(), "A": self.A.tolist(), "p": self.p.tolist()}


@dataclass(frozen=True)
class Stats:
    """Expected sufficient statistics of :func:`expected_stats`, per prompt (for a weighted M-step).

    Attributes:
        init: ``float[P, S]``; trans: ``float[P, S, S]``; n: ``float[P, S, D]`` drafts at depth d in
        state s; a: ``float[P, S, D]`` of them accepted.
    """

    init: np.ndarray
    trans: np.ndarray
    n: np.ndarray
    a: np.ndarray


def _emission(obs: Observations, p: np.ndarray) -> np.ndarray:
    """``float[P, G, S]`` likelihood of each position's observation under each state."""
    P, G = obs.depth.shape
    S = p.shape[0]
    e = np.ones((P, G, S))
    m = obs.mask & (obs.depth > 0)
    if m.any():
        d = obs.depth[m].astype(np.int64) - 1
        pd_ = p[:, d].T                                   # [n_obs, S]
        e[m] = np.where(obs.accepted[m][:, None], pd_, 1.0 - pd_)
    return e


def expected_stats(obs: Observations, params: Params, n_units: int | None = None) -> tuple[Stats, float]:
    """E-step: the expected counts under ``params`` (one set) and the log-likelihood (scaled
    forward–backward, vectorised over prompts; positions past a prompt's end carry no observation and
    no transition). Counts per prompt, or with ``n_units`` per bootstrap unit (:attr:`Observations.unit`:
    a position's emission and the transition into it count in its unit)."""
    P, G = obs.depth.shape
    S = params.pi.shape[0]
    D = params.p.shape[1]
    if P == 0 or G == 0:
        z = np.zeros((P, S))
        return Stats(z + params.pi, np.zeros((P, S, S)), np.zeros((P, S, D)), np.zeros((P, S, D))), 0.0
    e = _emission(obs, params.p)
    A = params.A
    alpha = np.empty((P, G, S))
    c = np.empty((P, G))
    a = params.pi[None, :] * e[:, 0]
    c[:, 0] = a.sum(1)
    alpha[:, 0] = a / c[:, :1]
    for g in range(1, G):
        a = (alpha[:, g - 1] @ A) * e[:, g]
        c[:, g] = a.sum(1)
        alpha[:, g] = a / c[:, g:g + 1]
    beta = np.empty((P, G, S))
    beta[:, -1] = 1.0
    for g in range(G - 2, -1, -1):
        beta[:, g] = ((e[:, g + 1] * beta[:, g + 1]) @ A.T) / c[:, g + 1:g + 2]
    gamma = alpha * beta
    gamma /= gamma.sum(2, keepdims=True)
    # transitions between real positions only
    nxt = e[:, 1:] * beta[:, 1:] / c[:, 1:, None]             # [P, G-1, S]
    w = obs.mask[:, 1:].astype(np.float64)
    trans = np.einsum("pgs,pgt,pg->pst", alpha[:, :-1], nxt, w) * A[None]
    dm = obs.depth.astype(np.int64)
    real = obs.mask & (dm > 0)
    n = np.zeros((P, S, D))
    acc = np.zeros((P, S, D))
    for d in range(1, min(D, obs.max_depth) + 1):
        md = (real & (dm == d)).astype(np.float64)
        n[:, :, d - 1] = np.einsum("pgs,pg->ps", gamma, md)
        acc[:, :, d - 1] = np.einsum("pgs,pg->ps", gamma, md * obs.accepted)
    ll = float(np.log(c[obs.mask]).sum())
    if n_units is None or obs.unit is None:
        return Stats(gamma[:, 0], trans, n, acc), ll
    U = int(n_units)
    real_u = obs.mask & (obs.unit >= 0)
    u = obs.unit[real_u]
    init = np.zeros((U, S))
    np.add.at(init, obs.unit[:, 0][obs.mask[:, 0]], gamma[:, 0][obs.mask[:, 0]])
    xi = alpha[:, :-1, :, None] * A[None, None] * nxt[:, :, None, :]          # [P, G-1, S, S]
    tm = obs.mask[:, 1:] & (obs.unit[:, 1:] >= 0)
    trans_u = np.zeros((U, S, S))
    np.add.at(trans_u, obs.unit[:, 1:][tm], xi[tm])
    n_u = np.zeros((U, S, D))
    a_u = np.zeros((U, S, D))
    dd = dm[real_u]
    obs_ok = dd > 0
    idx_u, idx_d = u[obs_ok], dd[obs_ok] - 1
    keep = idx_d < D
    gam = gamma[real_u][obs_ok][keep]
    np.add.at(n_u, (idx_u[keep], slice(None), idx_d[keep]), gam)
    np.add.at(a_u, (idx_u[keep], slice(None), idx_d[keep]), gam * obs.accepted[real_u][obs_ok][keep][:, None])
    return Stats(init, trans_u, n_u, a_u), ll


def m_step(stats: Stats, weights: np.ndarray | None = None, prior: Params | None = None,
           strength: float = PRIOR) -> Params:
    """M-step from per-prompt statistics, each prompt counted ``weights[.., p]`` times (``weights``:
    ``float[P]`` or ``float[B, P]`` for a batch), plus the prior's pseudo-counts (``strength`` drafts /
    transitions at the prior's values; default prior: every probability 1/2, uniform transitions).
    States are re-ordered by ``p[:, 0]`` (highest first)."""
    P, S, D = stats.n.shape
    w = np.ones(P) if weights is None else np.asarray(weights, dtype=np.float64)
    batch = w.ndim == 2
    W = w if batch else w[None]
    if prior is None:
        prior = Params(np.full(S, 1.0 / S), np.full((S, S), 1.0 / S), np.full((S, D), 0.5))
    init = W @ stats.init + strength * prior.pi
    trans = np.einsum("bp,pst->bst", W, stats.trans) + strength * prior.A
    n = np.einsum("bp,psd->bsd", W, stats.n) + strength
    a = np.einsum("bp,psd->bsd", W, stats.a) + strength * prior.p
    pi = init / init.sum(-1, keepdims=True)
    A = trans / trans.sum(-1, keepdims=True)
    p = np.clip(a / n, 1e-6, 1 - 1e-6)
    order = np.argsort(-p[:, :, 0], axis=1, kind="stable")
    bi = np.arange(len(order))[:, None]
    pi, p = pi[bi, order], p[bi, order]
    A = A[bi[:, :, None], order[:, :, None], order[:, None, :]]
    out = Params(pi, A, p)
    return out if batch else Params(out.pi[0], out.A[0], out.p[0])


def _initial(obs: Observations, S: int, D: int) -> Params:
    """A starting point: states spread around the observed per-depth acceptance, persistent chain."""
    m = obs.mask & (obs.depth > 0)
    dm = obs.depth[m].astype(np.int64)
    rate = np.full(D, 0.5)
    for d in range(1, D + 1):
        sel = dm == d
        if sel.any():
            rate[d - 1] = float(obs.accepted[m][sel].mean())
    spread = np.linspace(1.6, 0.3, S)
    p = np.clip(rate[None, :] * spread[:, None], 0.02, 0.98)
    A = np.full((S, S), 0.1 / max(S - 1, 1))
    np.fill_diagonal(A, 0.9)
    return Params(np.full(S, 1.0 / S), A, p)


def fit(obs: Observations, *, n_states: int = N_STATES, prior: Params | None = None, strength: float = PRIOR,
        start: Params | None = None, max_iter: int = MAX_ITER, tol: float = TOL) -> tuple[Params, Stats, float]:
    """Fit the model to ``obs`` by expectation maximisation.

    Args:
        n_states: hidden states S (ignored with ``start`` / ``prior``: theirs).
        prior / strength: the prior of :func:`m_step` (e.g. the pooled fit, to shrink a category's).
        start: the starting parameters (default: the prior, else :func:`_initial`).

    Returns:
        ``(params, stats, log_likelihood)``: ``stats`` are the E-step's under the returned parameters
        (what a bootstrap reweights).
    """
    D = max(int(obs.max_depth), 1)
    if start is None:
        start = prior if prior is not None else _initial(obs, n_states, D)
    params = Params(start.pi, start.A, _depths(start.p, D))
    if prior is not None:
        prior = Params(prior.pi, prior.A, _depths(prior.p, D))
    n_obs = max(int((obs.mask & (obs.depth > 0)).sum()), 1)
    prev = -np.inf
    stats, ll = expected_stats(obs, params)
    for _ in range(max_iter):
        params = m_step(stats, prior=prior, strength=strength)
        stats, ll = expected_stats(obs, params)
        if ll - prev < tol * n_obs:
            break
        prev = ll
    return params, stats, ll


def _depths(p: np.ndarray, D: int) -> np.ndarray:
    """``p`` cut or padded (with its last column) to ``D`` depths."""
    if p.shape[-1] >= D:
        return p[..., :D]
    pad = np.repeat(p[..., -1:], D - p.shape[-1], axis=-1)
    return np.concatenate([p, pad], axis=-1)


@dataclass(frozen=True)
class Prediction:
    """Expected counts at one n_draft, per parameter set of the batch (``float[B]`` each).

    Attributes:
        n_draft: N.
        accepted / drafted: accepted drafts, drafted tokens.
        rounds: rounds that drafted (verify rounds); plain: rounds that drafted nothing (the cap).
        by_size: ``float[B, N + 1]`` rounds per draft count L = 0..N (column 0 = ``plain``).
        emitted: tokens emitted by the rounds (the prompts' lengths after the prefill token).
    """

    n_draft: int
    accepted: np.ndarray
    drafted: np.ndarray
    rounds: np.ndarray
    plain: np.ndarray
    by_size: np.ndarray
    emitted: np.ndarray


def predict(params: Params, n_draft: int, ends: np.ndarray, *, max_tokens: int | None = None,
            weights: np.ndarray | None = None) -> Prediction:
    """Expected counts at ``n_draft`` for prompts whose last output position is ``ends`` (module
    docstring: the exact forward pass of the joint chain).

    Args:
        params: one set or a batch (``p`` needs at least ``n_draft`` depths: extend it first).
        ends: ``int[P]`` last output position per prompt (its generated tokens - 1).
        max_tokens: the recording's cap (a round drafts ``min(N, max_tokens - n_out - 1)``); None: the
            longest prompt's length (the cap binds only where a prompt stopped at it).
        weights: ``float[P]`` or ``float[B, P]``: how many times each prompt counts (the bootstrap).

    Raises:
        TraceFormatError: ``n_draft < 1`` or ``p`` shorter than ``n_draft``.
    """
    N = int(n_draft)
    pi, A, p = (np.asarray(x, dtype=np.float64) for x in (params.pi, params.A, params.p))
    if pi.ndim == 1:
        pi, A, p = pi[None], A[None], p[None]
    if N < 1 or p.shape[-1] < N:
        raise TraceFormatError("the model has fewer depths than n_draft", key="n_draft",
                               expected=f"1..{p.shape[-1]}", actual=N)
    B, S = pi.shape
    ends = np.asarray(ends, dtype=np.int64)
    Gmax = int(ends.max()) if len(ends) else 0
    M = int(max_tokens) if max_tokens is not None else Gmax + 1
    w = np.ones(len(ends)) if weights is None else np.asarray(weights, dtype=np.float64)
    W = np.broadcast_to(w if w.ndim == 2 else w[None], (B, len(ends)))
    # per position: cumulative expected accepted (by position g) and rounds created (pending g)
    cum_acc = np.zeros((B, Gmax + 1))
    cum_sz = np.zeros((B, Gmax + 1, N + 1))
    if Gmax == 0:
        z = np.zeros(B)
        return Prediction(N, z, z, z, z, np.zeros((B, N + 1)), W @ ends.astype(np.float64))
    pd_ = p[:, :, :N]
    alpha = np.zeros((B, S, N + 1))

    def new_round(mass: np.ndarray, g: int) -> None:      # rounds with pending position g
        k = min(N, M - g - 2)
        k = max(k, 0)
        alpha[:, :, 1 if k >= 1 else 0] += mass
        cum_sz[:, g, k] += mass.sum(1)

    new_round(pi, 0)                                        # position 1 (state distribution pi)
    acc_run = 0.0
    for g in range(1, Gmax + 1):
        a = alpha[:, :, 1:] * pd_                           # accepted mass at depth d of position g
        acc_run = acc_run + a.sum((1, 2))
        cum_acc[:, g] = acc_run
        if g == Gmax:
            break
        r = alpha[:, :, 1:] - a
        d = np.arange(1, N + 1)
        kmax = np.clip(np.minimum(N, M - g + d - 2), d, None)   # the round's draft count (>= d)
        last = d == kmax
        nxt = np.zeros((B, S, N + 1))
        nxt[:, :, 2:] = np.where(last[:-1], 0.0, a[:, :, :-1])
        nxt[:, :, 0] = (a * last).sum(2)                    # bonus position after a full round
        pending = r.sum(2) + alpha[:, :, 0]                 # corrections and bonus / plain positions
        alpha = nxt
        new_round(pending, g)
        alpha = np.einsum("bsd,bst->btd", alpha, A)
    cum_sz = np.cumsum(cum_sz, axis=1)
    # a prompt ending at E: accepted through E, rounds with pending 0..E-1
    acc = np.einsum("bp,bp->b", W, cum_acc[:, ends])
    sz = np.einsum("bp,bpk->bk", W, cum_sz[:, np.maximum(ends - 1, 0)] * (ends > 0)[None, :, None])
    L = np.arange(N + 1, dtype=np.float64)
    return Prediction(N, acc, sz @ L, sz[:, 1:].sum(1), sz[:, 0], sz, W @ ends.astype(np.float64))
