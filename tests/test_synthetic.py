"""Synthetic traces: valid, internally consistent, deterministic."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mtpscope import traces
from mtpscope.errors import TraceError
from mtpscope.traces.analysis import metrics as M
from mtpscope.traces.synthetic import write_synthetic_trace


@pytest.fixture(scope="module")
def syn(tmp_path_factory: pytest.TempPathFactory) -> traces.Trace:
    d = tmp_path_factory.mktemp("syn")
    write_synthetic_trace(d, n_rounds=3001, n_prompts=4, n_draft=3, n_vocab=5000, n_centroids=64,
                          top_k=8, seed=7, rounds_per_part=1000)
    return traces.open(d)


def test_manifest_and_parts(syn: traces.Trace) -> None:
    m = syn.manifest
    assert m["source"] == "synthetic" and m["complete"] is True
    assert m["counts"]["n_rounds"] == 3001 and m["counts"]["n_parts"] == 4
    assert m["centroids"] == {"n_centroids": 64, "top_k": 8}
    assert [p["prompt_id"] for p in m["prompts"]] == [0, 1, 2, 3]
    assert syn.warnings == []


def test_rounds_consistent(syn: traces.Trace) -> None:
    r = syn.rounds
    assert list(r.groupby("prompt_id").size()) == [751, 750, 750, 750]
    for _, g in r.groupby("prompt_id"):
        assert list(g["round"]) == list(range(len(g)))
        na = g["n_accepted"].to_numpy()
        pos = g["pos"].to_numpy()
        np.testing.assert_array_equal(pos[1:], pos[:-1] + na[:-1] + 1)
        em = list(g["emitted"])
        assert [e[-1] for e in em[:-1]] == list(g["pending_token"][1:])
    for d, t, e, nd, na in zip(r["drafted"], r["target"], r["emitted"], r["n_draft"], r["n_accepted"]):
        assert len(d) == nd and len(t) == nd + 1 and len(e) == na + 1
        assert d[:na] == t[:na] == e[:na] and e[na] == t[na]
        if na < nd:
            assert t[na] != d[na]
        assert all(0 <= x < 5000 for x in d)


def test_steps_consistent(syn: traces.Trace) -> None:
    s = syn.steps
    r = syn.rounds
    assert len(s) == int(r["n_draft"].sum())
    na = r.set_index(["prompt_id", "round"])["n_accepted"]
    acc = na.loc[list(zip(s["prompt_id"], s["round"]))].to_numpy()
    np.testing.assert_array_equal(s["accepted"].to_numpy(dtype=bool), s["k"].to_numpy() <= acc)
    assert (s["top_ids"].list[0].to_numpy() == s["token"].to_numpy()).all()
    covered = s["target_in_candidates"].to_numpy(dtype=bool)
    crank = s["target_centroid_rank"].to_numpy(dtype=int)
    np.testing.assert_array_equal(covered, crank < 8)
    ids = list(s["centroid_ids"])
    tc = s["target_centroid"].to_numpy(dtype=int)
    assert all(ids[i][crank[i]] == tc[i] for i in np.flatnonzero(covered))
    assert all(len(set(x)) == 8 for x in ids[:200])


def test_structure_is_realistic(syn: traces.Trace) -> None:
    pp = M.per_position_acceptance(syn.rounds)
    acc = list(pp["acceptance"])
    assert acc[0] > acc[1] > acc[2] > 0.05
    streaks = M.zero_acceptance_streaks(syn.rounds)
    assert streaks["length"].max() >= 3
    assert 0.3 < M.acceptance_rate(syn.rounds) < 0.8


def test_deterministic_and_hidden(tmp_path: Path) -> None:
    a = write_synthetic_trace(tmp_path / "a", n_rounds=50, n_prompts=2, hidden=(16, 8), seed=3,
                              n_vocab=1000, n_centroids=32, top_k=4, rounds_per_part=20)
    b = write_synthetic_trace(tmp_path / "b", n_rounds=50, n_prompts=2, hidden=(16, 8), seed=3,
                              n_vocab=1000, n_centroids=32, top_k=4, rounds_per_part=20)
    ta, tb = traces.open(a), traces.open(b)
    assert ta.rounds.equals(tb.rounds)
    np.testing.assert_array_equal(ta.hidden("h_inner"), tb.hidden("h_inner"))
    h, hn = ta.hidden("h"), ta.hidden("h_next")
    k = ta.steps["k"].to_numpy()
    assert h.shape == (len(k), 16) and ta.hidden("h_inner").shape == (len(k), 8)
    later = np.flatnonzero(k > 1)
    np.testing.assert_array_equal(h[later], hn[later - 1])
    assert ta.manifest["dims"] == {"n_embd_backbone": 16, "n_embd": 8, "hidden_dtype": "f16"}


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="n_rounds"):
        write_synthetic_trace(tmp_path, n_rounds=0)
    with pytest.raises(TraceError, match="top_k"):
        write_synthetic_trace(tmp_path, n_rounds=5, n_centroids=4, top_k=8)
