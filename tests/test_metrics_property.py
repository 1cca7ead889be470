"""Vectorised metrics against a plain per-round loop written from the definitions (hypothesis)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from mtpscope.traces.analysis import metrics as M

K = 4


@st.composite
def round_tables(draw):
    n_prompts = draw(st.integers(1, 3))
    rows = []
    for p in range(n_prompts):
        for r in range(draw(st.integers(0, 12))):
            nd = draw(st.integers(0, K))
            rows.append((p, r, nd, draw(st.integers(0, nd))))
    perm = draw(st.permutations(range(len(rows))))
    rows = [rows[i] for i in perm]
    a = np.array(rows, dtype=np.int32).reshape(-1, 4)
    return pd.DataFrame({"prompt_id": a[:, 0], "round": a[:, 1], "n_draft": a[:, 2], "n_accepted": a[:, 3]})


def _naive_streaks(df):
    out = []
    for p in sorted(set(df["prompt_id"])):
        g = sorted((r, nd, na) for pid, r, nd, na in df.itertuples(index=False) if pid == p)
        run = None
        for r, nd, na in g:
            if nd == 0:
                continue
            if na == 0:
                run = [r, r, 1] if run is None else [run[0], r, run[2] + 1]
            else:
                if run:
                    out.append((p, *run))
                run = None
        if run:
            out.append((p, *run))
    return sorted(out, key=lambda s: (-s[3], s[0], s[1]))


@settings(max_examples=60, deadline=None)
@given(round_tables())
def test_against_naive(df: pd.DataFrame) -> None:
    rows = list(df.itertuples(index=False))
    drafted = sum(r.n_draft for r in rows)
    accepted = sum(r.n_accepted for r in rows)
    verify = sum(1 for r in rows if r.n_draft > 0)
    t = M.totals(df)
    assert t.n_drafted == drafted and t.n_accepted == accepted
    if drafted:
        assert t.acceptance_rate == accepted / drafted
    else:
        assert math.isnan(t.acceptance_rate)
    if verify:
        assert t.mean_acceptance_length == 1 + accepted / verify
    pp = M.per_position_acceptance(df, max_k=K)
    for k in range(1, K + 1):
        den = sum(1 for r in rows if r.n_draft >= k)
        num = sum(1 for r in rows if r.n_accepted >= k)
        row = pp[pp["k"] == k].iloc[0]
        assert (row["n_rounds"], row["n_accepted"]) == (den, num)
    fm = M.first_mismatch_histogram(df, max_k=K)
    for k in range(1, K + 1):
        assert fm["n_rounds"][k - 1] == sum(1 for r in rows if r.n_accepted < r.n_draft and r.n_accepted + 1 == k)
    got = [tuple(int(x) for x in s) for s in M.zero_acceptance_streaks(df).values.tolist()]
    assert got == _naive_streaks(df)
    pr = M.per_prompt(df)
    for p, g in df.groupby("prompt_id"):
        row = pr[pr["prompt_id"] == p].iloc[0]
        assert row["n_drafted"] == g["n_draft"].sum() and row["n_accepted"] == g["n_accepted"].sum()
