"""Output positions of a trace: the generated sequence of each prompt, the output position every draft
stood in for, and what produced each output token. One job; pure (numpy / pandas over ``rounds``).

A prompt's generated sequence is ``gen = [rounds[0].pending_token] + emitted(round 0) + emitted(round 1)
+ ...`` (the recorder's rule, docs/RECORDING.md); output position ``g`` indexes ``gen`` (0 = the prefill's
token). Round ``r``'s pending token sits at ``G_r`` (``G_0 = 0``, ``G_{r+1} = G_r + len(emitted_r)``),
its draft ``k`` stands in for position ``G_r + k``, and its ``j``-th emitted token lands at
``G_r + 1 + j``. An emitted token is an ``accepted`` draft (``j < n_accepted``), the target's correction
of a ``rejected`` draft (``j == n_accepted < n_draft``), or a ``bonus`` token (``j == n_accepted ==
n_draft``: every draft was accepted; also a round that drafted nothing).

A prompt's positions are only known when its rounds are ``0..n-1`` without gaps and every round has
``emitted`` (recorded traces; not imports that lack it): other prompts get position -1 / no sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from mtpscope.errors import TraceFormatError
from mtpscope.traces.store.list_columns import flat_list

STATUSES = ("accepted", "rejected", "bonus")


@dataclass(frozen=True)
class Positions:
    """Output positions of every draft and every emitted token.

    Attributes:
        sequences: ``{prompt_id: int64[len(gen)]}`` generated ids of each prompt whose positions are
            known (module docstring).
        drafts: DataFrame, one row per draft, in ``rounds`` order (sorted by prompt_id, round) and k:
            ``prompt_id``, ``round``, ``k`` (1-based), ``g`` (output position, -1 unknown),
            ``accepted`` (bool).
        emitted: DataFrame, one row per emitted token of the known prompts: ``prompt_id``, ``g``,
            ``token``, ``round``, ``k`` (the draft position it answered, 0 for a bonus token),
            ``status`` (one of :data:`STATUSES`), ``eog_confirmed`` (a ``rejected`` draft that was an
            end-of-generation token the target chose too: llama.cpp does not count it accepted, yet the drafter did
            not miss; the rounds' ``eog_confirmed``, False where the rounds do not carry it).
    """

    sequences: dict[int, np.ndarray]
    drafts: pd.DataFrame
    emitted: pd.DataFrame


def positions(rounds: pd.DataFrame) -> Positions:
    """Output positions of a trace's rounds (columns ``prompt_id``, ``round``, ``pending_token``,
    ``n_draft``, ``n_accepted``, ``emitted``; ``eog_confirmed`` when present).

    Raises:
        TraceFormatError: a required column is missing.
    """
    need = ["prompt_id", "round", "pending_token", "n_draft", "n_accepted", "emitted"]
    missing = [c for c in need if c not in rounds.columns]
    if missing:
        raise TraceFormatError("rounds lacks columns", key=", ".join(missing), expected=", ".join(need),
                               actual=", ".join(map(str, rounds.columns)))
    r = rounds.sort_values(["prompt_id", "round"], kind="stable")
    pid = r["prompt_id"].to_numpy(dtype=np.int64)
    rnd = r["round"].to_numpy(dtype=np.int64)
    nd = r["n_draft"].to_numpy(dtype=np.int64)
    na = r["n_accepted"].to_numpy(dtype=np.int64)
    pend = r["pending_token"].to_numpy(dtype=np.int64)
    em = flat_list(r["emitted"])
    n = len(r)
    new_prompt = np.ones(n, dtype=bool)
    new_prompt[1:] = pid[1:] != pid[:-1]
    first_idx = np.maximum.accumulate(np.where(new_prompt, np.arange(n), 0)) if n else np.zeros(0, np.int64)
    expect_round = np.arange(n) - first_idx
    ok_row = (rnd == expect_round) & em.valid
    # a prompt is known when all its rows are ok
    bad_prompts = set(pid[~ok_row].tolist())
    known = ~np.isin(pid, np.fromiter(bad_prompts, dtype=np.int64, count=len(bad_prompts))) \
        if bad_prompts else np.ones(n, dtype=bool)
    L = np.where(em.valid, em.lengths, 0)
    csum = np.cumsum(L) - L                          # emitted before this row, over all rows
    G = csum - csum[first_idx] if n else csum        # within the prompt
    # drafts
    reps = np.repeat(np.arange(n), nd)
    k = (np.arange(int(nd.sum())) - np.repeat(np.cumsum(nd) - nd, nd) + 1).astype(np.int64)
    g = np.where(known[reps], G[reps] + k, -1)
    drafts = pd.DataFrame({"prompt_id": pid[reps], "round": rnd[reps], "k": k, "g": g,
                           "accepted": k <= na[reps]})
    # emitted tokens of known prompts
    rows = np.flatnonzero(known)
    Lk = L[rows]
    er = np.repeat(rows, Lk)
    j = (np.arange(int(Lk.sum())) - np.repeat(np.cumsum(Lk) - Lk, Lk)).astype(np.int64)
    tok = em.values[em.starts[er] + j] if len(er) else np.zeros(0, dtype=np.int64)
    status = np.where(j < na[er], 0, np.where(j < nd[er], 1, 2))
    eog = (r["eog_confirmed"].fillna(False).to_numpy(dtype=bool) if "eog_confirmed" in r.columns
           else np.zeros(n, dtype=bool))
    emitted = pd.DataFrame({"prompt_id": pid[er], "g": G[er] + 1 + j, "token": tok.astype(np.int64),
                            "round": rnd[er], "k": np.where(status == 2, 0, j + 1),
                            "status": np.asarray(STATUSES, dtype=object)[status],
                            "eog_confirmed": (status == 1) & eog[er]})
    seqs: dict[int, np.ndarray] = {}
    ep, etok = pid[er], emitted["token"].to_numpy()
    for p in np.unique(pid[known]).tolist():
        first = int(np.searchsorted(pid, p, side="left"))
        a, b = np.searchsorted(ep, p, side="left"), np.searchsorted(ep, p, side="right")
        seqs[int(p)] = np.concatenate([[pend[first]], etok[a:b]]).astype(np.int64)
    return Positions(seqs, drafts, emitted)
