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

**Long outputs.** The fit cuts outputs longer than ``FIT_BLOCK`` positions into blocks, each started
from ``pi`` (at most ``FIT_MAX_BLOCKS`` blocks, spread over the trace); the forward pass runs exactly over
``PREDICT_EXACT`` positions and continues longer outputs at the chain's stationary per-position counts,
plus the exact difference the ``max_tokens`` cap makes over a capped output's last ``2 N + 3``
positions (both chains run from the same state).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
TOL = 1e-5
MAX_ITER = 30
#: the fit cuts longer outputs into blocks of this many positions, each started from ``pi`` (the chain
#: forgets its start within a few dozen positions; the forward-backward loop runs over block positions)
FIT_BLOCK = 128
#: the fit uses at most this many blocks, spread evenly over the trace (then one E-step over every block
#: gives the statistics the bootstrap reweights)
FIT_MAX_BLOCKS = 256
#: the forward pass runs exactly over this many positions; a longer output continues at the per-position
#: counts of the chain's state there (stationary by then), plus what the cap changes at its end
PREDICT_EXACT = 160


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

    def to_dict(self) -> dict[str, list[Any]]:
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


def blocks(obs: Observations, length: int = FIT_BLOCK) -> Observations:
    """``obs`` with every prompt longer than ``length`` positions cut into blocks of ``length`` (each a row
    of its own, started from ``pi`` by the fit; bootstrap units kept per position)."""
    P, G = obs.depth.shape
    if length >= G:
        return obs
    nb = -(-G // length)
    pad = nb * length - G

    def cut(a: np.ndarray, fill: Any) -> np.ndarray:
        return np.pad(a, ((0, 0), (0, pad)), constant_values=fill).reshape(P * nb, length)

    ends = np.clip(obs.ends[:, None] - np.arange(nb)[None, :] * length, 0, length).reshape(-1)
    keep = ends > 0
    if not keep.any():
        keep[0] = True
    return Observations(cut(obs.depth, 0)[keep], cut(obs.accepted, False)[keep], cut(obs.mask, False)[keep],
                        ends[keep], np.repeat(obs.prompt_ids, nb)[keep], obs.max_depth,
                        None if obs.unit is None else cut(obs.unit, -1)[keep])


def _emission(obs: Observations, p: np.ndarray) -> np.ndarray:
    """``float[P, G, S]`` likelihood of each position's observation under each state."""
    P, G = obs.depth.shape
    S = p.shape[0]
    e = np.ones((P, G, S))
    m = obs.mask & (obs.depth > 0)
    if m.any():
        d = np.minimum(obs.depth[m].astype(np.int64), p.shape[1]) - 1
        pd_ = p[:, d].T                                   # [n_obs, S]
        e[m] = np.where(obs.accepted[m][:, None], pd_, 1.0 - pd_)
    return e


def _scatter(rows: np.ndarray, n_rows: int, values: np.ndarray) -> np.ndarray:
    """``float[n_rows, S]``: the sum of ``values[i]`` (``float[n, S]``) per ``rows[i]``."""
    out = np.zeros((n_rows, values.shape[1]))
    for s_ in range(values.shape[1]):
        out[:, s_] = np.bincount(rows, values[:, s_], minlength=n_rows)
    return out


def expected_stats(obs: Observations, params: Params, n_units: int | None = None) -> tuple[Stats, float]:
    """E-step: the expected counts under ``params`` (one set) and the log-likelihood (scaled
    forward–backward, vectorised over prompts; positions past a prompt's end carry no observation and
    no transition). Counts per row of ``obs`` (a prompt or a block), or with ``n_units`` per bootstrap
    unit (:attr:`Observations.unit`: a position's emission and the transition into it count in its unit)."""
    P, G = obs.depth.shape
    S = params.pi.shape[0]
    D = params.p.shape[1]
    if P == 0 or G == 0:
        R = P if n_units is None or obs.unit is None else int(n_units)
        return Stats(np.zeros((R, S)), np.zeros((R, S, S)), np.zeros((R, S, D)), np.zeros((R, S, D))), 0.0
    e = _emission(obs, params.p)
    A = params.A
    alpha = np.empty((P, G, S))
    c = np.empty((P, G))
    a = params.pi[None, :] * e[:, 0]
    c[:, 0] = a.sum(1)
    alpha[:, 0] = a / c[:, :1]
    for g in range(1, G):
        a = (alpha[:, g - 1] @ A) * e[:, g]
        cg = a.sum(1)
        c[:, g] = cg
        alpha[:, g] = a / cg[:, None]
    beta = np.empty((P, G, S))
    beta[:, -1] = 1.0
    eb = np.empty((P, S))
    for g in range(G - 2, -1, -1):
        np.multiply(e[:, g + 1], beta[:, g + 1], out=eb)
        beta[:, g] = (eb @ A.T) / c[:, g + 1, None]
    gamma = alpha * beta
    gamma /= gamma.sum(2, keepdims=True)
    # transitions into real positions only: xi_g(s, t) = alpha_g(s) A(s, t) e_{g+1}(t) beta_{g+1}(t) / c_{g+1}
    nxt = e[:, 1:] * beta[:, 1:] / c[:, 1:, None] * obs.mask[:, 1:, None]   # [P, G-1, S]
    ll = float(np.log(c[obs.mask]).sum())
    unit = obs.unit if n_units is not None else None     # rows by unit (else one row per prompt)
    R = P if n_units is None or unit is None else int(n_units)
    row_of = unit if unit is not None else np.broadcast_to(np.arange(P)[:, None], (P, G))
    if unit is not None:
        keep_t = obs.mask[:, 1:] & (unit[:, 1:] >= 0)
        rows_t = unit[:, 1:][keep_t]
        al, nx = alpha[:, :-1][keep_t], nxt[keep_t]                # [n, S] each
        trans = np.zeros((R, S, S))
        for s_ in range(S):
            trans[:, s_, :] = _scatter(rows_t, R, al[:, s_:s_ + 1] * nx)
        trans *= A[None]
        first = obs.mask[:, 0] & (unit[:, 0] >= 0)
        init = _scatter(unit[first, 0], R, gamma[first, 0])
    else:
        trans = np.matmul(alpha[:, :-1].transpose(0, 2, 1), nxt) * A[None]
        init = gamma[:, 0].copy()
    m = obs.mask & (obs.depth > 0) & (row_of >= 0)
    d = np.minimum(obs.depth[m].astype(np.int64), D) - 1
    rows = row_of[m].astype(np.int64)
    gm = gamma[m]
    accm = obs.accepted[m].astype(np.float64)
    n = np.zeros((R, S, D))
    acc = np.zeros((R, S, D))
    key = rows * D + d
    for s_ in range(S):
        n[:, s_, :] = np.bincount(key, gm[:, s_], minlength=R * D).reshape(R, D)
        acc[:, s_, :] = np.bincount(key, gm[:, s_] * accm, minlength=R * D).reshape(R, D)
    return Stats(init, trans, n, acc), ll


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
        ``(params, stats, log_likelihood)``: ``stats`` and the log-likelihood are the E-step's under the
        returned parameters, per row of the observations the fit used (prompts cut into blocks of
        ``FIT_BLOCK`` positions, :func:`blocks`; at most ``FIT_MAX_BLOCKS`` of them, spread evenly).
    """
    D = max(int(obs.max_depth), 1)
    obs = blocks(obs)
    if obs.n_prompts > FIT_MAX_BLOCKS:
        obs = obs.subset(np.unique(np.linspace(0, obs.n_prompts - 1, FIT_MAX_BLOCKS).round().astype(np.int64)))
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
    """Expected counts at ``n_draft`` for prompts whose last output position is ``ends``
    (:func:`predict_all` for one n_draft).

    Raises:
        TraceFormatError: ``n_draft < 1`` or ``p`` shorter than ``n_draft``.
    """
    return predict_all(params, [n_draft], ends, max_tokens=max_tokens, weights=weights)[int(n_draft)]


def predict_all(params: Params, n_values: Sequence[int], ends: np.ndarray, *, max_tokens: int | None = None,
                weights: np.ndarray | None = None) -> dict[int, Prediction]:
    """Expected counts at every n_draft of ``n_values`` (module docstring: the exact forward pass of the
    joint chain, all n_draft and all parameter sets of the batch in one pass).

    The chain on (hidden state s, depth d of the position, d = 0..N) is linear, ``alpha_{g+1} = alpha_g
    T_g``: from depth d >= 1 the draft is accepted with ``p[s, d]`` (to depth d + 1, or to the bonus
    position, depth 0, when d is the round's last draft) or rejected (the correction starts a new round:
    depth 1, or 0 when the cap leaves no draft); from depth 0 a new round starts; the hidden state then
    moves by ``A``. ``T_g`` is the same everywhere except within ``2 N + 3`` positions of the cap.

    Args:
        params: one set or a batch (``p`` needs at least ``max(n_values)`` depths: extend it first).
        n_values: the n_draft values.
        ends: ``int[P]`` last output position per prompt (its generated tokens - 1).
        max_tokens: the recording's cap (a round drafts ``min(N, max_tokens - n_out - 1)``); None: the
            longest prompt's length (the cap binds only where a prompt stopped at it).
        weights: ``float[P]`` or ``float[B, P]``: how many times each prompt counts (the bootstrap).

    Returns:
        ``{n_draft: Prediction}``.

    Raises:
        TraceFormatError: an n_draft < 1 or ``p`` shorter than the largest.
    """
    Ns = sorted({int(x) for x in n_values})
    pi, A, p = (np.asarray(x, dtype=np.float64) for x in (params.pi, params.A, params.p))
    if pi.ndim == 1:
        pi, A, p = pi[None], A[None], p[None]
    if not Ns or Ns[0] < 1 or p.shape[-1] < Ns[-1]:
        raise TraceFormatError("the model has fewer depths than n_draft", key="n_draft",
                               expected=f"1..{p.shape[-1]}", actual=Ns[-1] if Ns else None)
    B0, S = pi.shape
    J, Nm = len(Ns), Ns[-1]
    ends_all = np.asarray(ends, dtype=np.int64)
    M = int(max_tokens) if max_tokens is not None else int(ends_all.max(initial=0)) + 1
    capped = ends_all >= M - 1                               # stopped by max_tokens: the cap binds at its end
    G0 = min(int(ends_all.max(initial=0)), PREDICT_EXACT)
    w = np.ones(len(ends_all)) if weights is None else np.asarray(weights, dtype=np.float64)
    W = np.broadcast_to(w if w.ndim == 2 else w[None], (B0, len(ends_all)))
    emitted = W @ ends_all.astype(np.float64)
    if G0 == 0:
        z = np.zeros(B0)
        return {N: Prediction(N, z, z, z, z, np.zeros((B0, N + 1)), emitted) for N in Ns}
    # batch index = j * B0 + b (n_draft j, parameter set b); states s * (Nm + 1) + d
    B = J * B0
    n = S * (Nm + 1)
    pdj: np.ndarray = np.zeros((J, B0, S, Nm))
    for j, N in enumerate(Ns):
        pdj[j, :, :, :N] = p[:, :, :N]
    pdj = pdj.reshape(B, S, Nm)
    Aj = np.broadcast_to(A[None], (J, B0, S, S)).reshape(B, S, S)
    Nj = np.repeat(np.array(Ns), B0)

    def kernels(pos_cap: int | None) -> tuple[np.ndarray, np.ndarray]:
        """(T: [B, n, n], size of a round with pending position ``pos_cap`` per batch row); ``pos_cap``
        None: far from the cap (the bulk)."""
        K_ = np.zeros((B, S, Nm + 1, Nm + 1))
        k_new = Nj.copy() if pos_cap is None else np.clip(np.minimum(Nj, M - pos_cap - 2), 0, None)
        start = (k_new >= 1).astype(np.int64)
        rows = np.arange(B)
        for s_ in range(S):
            K_[rows, s_, 0, start] += 1.0
            for d in range(1, Nm + 1):
                live = d <= Nj
                acc = pdj[:, s_, d - 1]
                K_[rows[live], s_, d, start[live]] += 1.0 - acc[live]
                kmax = Nj if pos_cap is None else np.clip(np.minimum(Nj, M - pos_cap + d - 2), d, None)
                nxt = np.where(d < kmax, d + 1, 0)
                K_[rows[live], s_, d, nxt[live]] += acc[live]
        T = np.einsum("bsde,bst->bsdte", K_, Aj).reshape(B, n, n)
        return T, k_new

    v_acc = np.zeros((B, n))
    v_new = np.zeros((B, n))
    for s_ in range(S):
        base = s_ * (Nm + 1)
        v_acc[:, base + 1:base + Nm + 1] = pdj[:, s_, :]
        v_new[:, base] = 1.0
        v_new[:, base + 1:base + Nm + 1] = 1.0 - pdj[:, s_, :]
    T_bulk, _ = kernels(None)
    cap_from = M - 2 * Nm - 3                                # T_g may differ from the bulk from here on
    rowsB = np.arange(B)
    cum_acc = np.zeros((B, G0 + 1))
    cum_sz = np.zeros((B, G0 + 1, Nm + 1))
    alpha = np.zeros((B, n))
    k0 = np.clip(np.minimum(Nj, M - 2), 0, None)
    pij = np.broadcast_to(pi[None], (J, B0, S)).reshape(B, S)
    for s_ in range(S):
        alpha[rowsB, s_ * (Nm + 1) + (k0 >= 1)] = pij[:, s_]
    cum_sz[rowsB, 0, k0] += 1.0
    acc_run = np.zeros(B)
    cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def step_kernel(g: int) -> tuple[np.ndarray, np.ndarray]:
        if g < cap_from:
            return T_bulk, Nj
        if g not in cache:
            cache[g] = kernels(g)
        return cache[g]

    for g in range(1, G0 + 1):
        acc_run = acc_run + np.einsum("bi,bi->b", alpha, v_acc)
        cum_acc[:, g] = acc_run
        if g == G0:
            break
        T, k_new = step_kernel(g)
        cum_sz[rowsB, g, k_new] += np.einsum("bi,bi->b", alpha, v_new)
        alpha = np.matmul(alpha[:, None, :], T)[:, 0]
    cum_sz = np.cumsum(cum_sz, axis=1)
    e_in = np.minimum(ends_all, G0)
    accp = cum_acc[:, e_in]                                              # [B, P]
    szp = cum_sz[:, np.maximum(e_in - 1, 0)] * (e_in > 0)[None, :, None]  # [B, P, Nm + 1]
    long_ = ends_all > G0
    if long_.any():
        # beyond the exact positions the chain is stationary: alpha_G0's per-position counts, and at a
        # capped end the difference the cap's last 2 Nm + 3 positions make (run from alpha_G0 both ways)
        extra = (ends_all - G0).astype(np.float64)
        rate_acc = np.einsum("bi,bi->b", alpha, v_acc)
        rate_new = np.einsum("bi,bi->b", alpha, v_new)
        accp = accp + rate_acc[:, None] * extra[None, :] * long_
        szp[rowsB[:, None], np.arange(len(ends_all))[None, :], Nj[:, None]] += \
            (rate_new[:, None] * extra[None, :]) * long_
        L = min(2 * Nm + 3, M - 1)
        if (long_ & capped).any() and L > 0:
            d_acc = np.zeros(B)
            d_sz = np.zeros((B, Nm + 1))
            a_cap, a_bulk = alpha.copy(), alpha.copy()
            for g in range(M - 1 - L, M):                     # positions M-1-L .. M-1 (the last)
                d_acc += np.einsum("bi,bi->b", a_cap, v_acc) - np.einsum("bi,bi->b", a_bulk, v_acc)
                if g == M - 1:
                    break
                T, k_new = kernels(g)
                d_sz[rowsB, k_new] += np.einsum("bi,bi->b", a_cap, v_new)
                d_sz[rowsB, Nj] -= np.einsum("bi,bi->b", a_bulk, v_new)
                a_cap = np.matmul(a_cap[:, None, :], T)[:, 0]
                a_bulk = np.matmul(a_bulk[:, None, :], T_bulk)[:, 0]
            m = long_ & capped
            accp = accp + d_acc[:, None] * m
            szp = szp + d_sz[:, None, :] * m[None, :, None]
    Wj = np.broadcast_to(W[None], (J, B0, len(ends_all))).reshape(B, -1)
    acc = np.einsum("bp,bp->b", Wj, accp).reshape(J, B0)
    sz = np.einsum("bp,bpk->bk", Wj, szp).reshape(J, B0, Nm + 1)
    out = {}
    for j, N in enumerate(Ns):
        s_j = sz[j, :, :N + 1]
        Lv = np.arange(N + 1, dtype=np.float64)
        out[N] = Prediction(N, acc[j], s_j @ Lv, s_j[:, 1:].sum(1), s_j[:, 0], s_j, emitted)
    return out
