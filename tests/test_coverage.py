"""Per-centroid coverage and the unreachable steps aggregated in DuckDB (traces/analysis/coverage.py) against
counts by hand and an independent pandas computation over the same small traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mtpscope import traces
from mtpscope.traces.analysis.coverage import centroid_coverage, unreachable_steps
from mtpscope.traces.store.records import RoundRecord, StepRecord
from mtpscope.traces.store.writer import TraceWriter


def _write(d: Path, rounds: list[tuple[int, int, list[int], int, list[dict]]], flush_every: int = 8) -> Path:
    """rounds: (prompt_id, round, drafted, n_accepted, per-step centroid fields)."""
    with TraceWriter(d, {"source": "record"}, n_embd_backbone=None, n_embd=None, hidden_dtype=None,
                     centroids=True, flush_every=flush_every) as w:
        for pid, rnd, drafted, n_acc, cols in rounds:
            target = drafted[:n_acc] + [7] * (len(drafted) + 1 - n_acc)
            rr = RoundRecord(prompt_id=pid, round=rnd, pos=10 + rnd, pending_token=1, n_draft=len(drafted),
                             drafted=drafted, n_accepted=n_acc, target=target, emitted=drafted[:n_acc] + [7],
                             t_draft_ms=1.0, t_verify_ms=1.0)
            steps = [StepRecord(k=k, token=drafted[k - 1], target_token=target[k - 1], accepted=k <= n_acc, **cols[k - 1])
                     for k in range(1, len(drafted) + 1)]
            w.add_round(rr, steps)
    return d


def _cols(ids: list[int], target_c: int, in_cand: bool) -> dict:
    return {"centroid_ids": ids, "centroid_logits": [0.0] * len(ids), "centroid_token": 0,
            "target_in_candidates": in_cand, "target_centroid": target_c, "target_centroid_rank": 0}


def test_counts_by_hand(tmp_path: Path) -> None:
    home = np.array([0, 0, 1, 1, 2, 2, 2, -1], dtype=np.int32)      # token -> centroid (7: no centroid)
    # round (0, 0): drafts 2, 0 with targets 2, 7 (n_accepted 1); round (0, 1): drafts 5 (target 7)
    d = _write(tmp_path / "t", [(0, 0, [2, 0], 1, [_cols([0, 1], 1, True), _cols([1, 2], 2, False)]),
                                (0, 1, [5], 0, [_cols([2, 0], 2, True)])])
    tr = traces.open(d)
    cov = centroid_coverage(tr, 3, home)
    # chosen: 0 in steps 1, 3; 1 in steps 1, 2; 2 in steps 2, 3
    assert cov.chosen.tolist() == [2, 2, 2]
    # targets: 2 (home 1), 7 (home -1: not counted), 7 -> only the first step has a target home
    assert cov.target_home.tolist() == [0, 1, 0] and cov.covered.tolist() == [0, 1, 0]
    # from the trace's own target_centroid column instead: homes 1, 2, 2; covered: 1 in [0,1] yes, 2 in [1,2] yes,
    # 2 in [2,0] yes
    by_col = centroid_coverage(tr, 3)
    assert by_col.target_home.tolist() == [0, 1, 2] and by_col.covered.tolist() == [0, 1, 2]
    assert by_col.table()["coverage"].tolist()[1:] == [1.0, 1.0] and np.isnan(by_col.table()["coverage"][0])
    un = unreachable_steps(tr)
    assert un[["prompt_id", "round", "k"]].values.tolist() == [[0, 0, 2]]   # the first rejection, checked
    assert list(un.columns) == ["prompt_id", "round", "k", "token", "target_token", "target_centroid",
                                "target_centroid_rank", "accepted"]


def _pandas_coverage(steps: pd.DataFrame, n: int, home: np.ndarray) -> tuple[list[int], list[int], list[int]]:
    """The counts written out with pandas, step by step (the oracle)."""
    chosen, target_home, covered = [0] * n, [0] * n, [0] * n
    for row in steps.itertuples():
        ids = [] if row.centroid_ids is None else list(row.centroid_ids)
        for c in ids:
            if 0 <= c < n:
                chosen[c] += 1
        t = row.target_token
        if pd.isna(t) or not 0 <= int(t) < home.size:
            continue
        c = int(home[int(t)])
        if 0 <= c < n:
            target_home[c] += 1
            covered[c] += c in ids
    return chosen, target_home, covered


def _pandas_unreachable(steps: pd.DataFrame, limit: int) -> list[list[int]]:
    out = []
    for (p, r), g in steps.groupby(["prompt_id", "round"], sort=True):
        rej = g.loc[~g["accepted"].fillna(False).astype(bool), "k"]
        first = rej.min() if len(rej) else np.inf
        for row in g.sort_values("k").itertuples():
            tic = row.target_in_candidates
            if not pd.isna(tic) and not bool(tic) and row.k <= first:
                out.append([int(p), int(r), int(row.k)])
    return out[:limit]


@pytest.mark.parametrize("seed", [0, 1])
def test_equals_pandas_on_a_random_trace(tmp_path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_c, n_vocab = 16, 64
    home = rng.integers(-1, n_c, n_vocab).astype(np.int32)
    rounds = []
    for pid in range(3):
        for rnd in range(40):
            k = int(rng.integers(1, 4))
            drafted = rng.integers(0, n_vocab, k).tolist()
            n_acc = int(rng.integers(0, k + 1))
            cols = [_cols(rng.choice(n_c + 2, 4, replace=False).astype(int).tolist(),   # some ids out of range
                          int(rng.integers(0, n_c)), bool(rng.random() < 0.5)) for _ in range(k)]
            rounds.append((pid, rnd, drafted, n_acc, cols))
    tr = traces.open(_write(tmp_path / "t", rounds, flush_every=7))
    assert len(tr.part_files("steps")) >= 1
    steps = tr.steps
    cov = centroid_coverage(tr, n_c, home)
    assert (cov.chosen.tolist(), cov.target_home.tolist(), cov.covered.tolist()) == _pandas_coverage(steps, n_c, home)
    un = unreachable_steps(tr, limit=25)
    assert un[["prompt_id", "round", "k"]].values.tolist() == _pandas_unreachable(steps, 25)


def test_the_writers_counts_answer_for_the_trace_own_head(tmp_path: Path) -> None:
    import json

    from mtpscope.traces.store.layout import MANIFEST

    rng = np.random.default_rng(5)
    n_c, n_vocab = 12, 48
    home = rng.integers(-1, n_c, n_vocab).astype(np.int32)
    rounds = []
    for rnd in range(60):
        k = int(rng.integers(1, 4))
        drafted = rng.integers(0, n_vocab, k).tolist()
        n_acc = int(rng.integers(0, k + 1))
        target = drafted[:n_acc] + [7] * (k + 1 - n_acc)      # what _write puts in the rounds
        cols = []
        for j in range(k):
            ids = rng.choice(n_c, 3, replace=False).astype(int).tolist()
            tc = int(home[target[j]])                          # scored with this head, as a recording is
            cols.append({**_cols(ids, tc, tc in ids), "target_centroid": tc if tc >= 0 else None})
        rounds.append((0, rnd, drafted, n_acc, cols))
    d = _write(tmp_path / "t", rounds, flush_every=9)
    tr = traces.open(d)
    want = _pandas_coverage(tr.steps, n_c, home)
    m = tr.manifest["centroid_counts"]
    assert (m["chosen"], m["target_home"], m["covered"]) == want and m["n_steps"] == len(tr.steps)
    cov = centroid_coverage(tr, n_c, home)
    assert (cov.chosen.tolist(), cov.target_home.tolist(), cov.covered.tolist()) == want
    # another head (one token moved): the counts no longer apply, the scan answers
    other = home.copy()
    other[int(tr.steps["target_token"].iloc[0])] = (int(home[int(tr.steps["target_token"].iloc[0])]) + 1) % n_c
    cov2 = centroid_coverage(tr, n_c, other)
    assert (cov2.chosen.tolist(), cov2.target_home.tolist(), cov2.covered.tolist()) == \
        _pandas_coverage(tr.steps, n_c, other) != want
    # a manifest whose counts are gone (an older trace): the scan gives the same numbers
    man = json.loads((d / MANIFEST).read_text())
    del man["centroid_counts"]
    (d / MANIFEST).write_text(json.dumps(man))
    cov3 = centroid_coverage(traces.open(d), n_c, home)
    assert (cov3.chosen.tolist(), cov3.target_home.tolist(), cov3.covered.tolist()) == want


def test_a_trace_without_centroid_columns(tmp_path: Path) -> None:
    with TraceWriter(tmp_path / "t", {"source": "record"}, n_embd_backbone=None, n_embd=None, hidden_dtype=None,
                     centroids=False) as w:
        w.add_round(RoundRecord(prompt_id=0, round=0, pos=1, pending_token=1, n_draft=1, drafted=[3], n_accepted=1,
                                target=[3, 4], emitted=[3, 4], t_draft_ms=1.0, t_verify_ms=1.0),
                    [StepRecord(k=1, token=3, target_token=3, accepted=True)])
    tr = traces.open(tmp_path / "t")
    cov = centroid_coverage(tr, 4, np.zeros(8, np.int32))
    assert cov.chosen.tolist() == [0, 0, 0, 0] and cov.covered.sum() == 0
    assert len(unreachable_steps(tr)) == 0


def test_a_trace_under_hive_style_folders_reads_its_own_columns(tmp_path: Path) -> None:
    import json

    from mtpscope.traces.store.layout import MANIFEST

    # a sweep cell lives under key=value folders; DuckDB must not read "target_centroid=1" / "k=9" from the path
    d = _write(tmp_path / "target_centroid=1" / "k=9" / "t", [(0, 0, [2], 0, [_cols([0, 2], 2, False)])])
    man = json.loads((d / MANIFEST).read_text())
    del man["centroid_counts"]                            # the DuckDB path
    (d / MANIFEST).write_text(json.dumps(man))
    tr = traces.open(d)
    cov = centroid_coverage(tr, 3)
    assert cov.target_home.tolist() == [0, 0, 1] and cov.covered.tolist() == [0, 0, 1]
    assert unreachable_steps(tr)["k"].tolist() == [1]
