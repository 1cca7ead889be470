"""Metrics on a hand-computed trace (every expected number below was worked out by hand)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from mtpscope.errors import TraceFormatError
from mtpscope.traces.analysis import metrics as M

# (prompt_id, round, n_draft, n_accepted); given out of order on purpose
ROWS = [
    (1, 2, 3, 0),
    (0, 0, 3, 3),
    (0, 1, 3, 0),
    (0, 2, 3, 0),
    (0, 3, 3, 1),
    (0, 4, 0, 0),     # a plain decode step: no drafts
    (0, 5, 3, 0),
    (1, 0, 3, 2),
    (1, 1, 2, 2),
]


def _rounds(rows=ROWS) -> pd.DataFrame:
    a = np.array(rows, dtype=np.int32)
    return pd.DataFrame({"prompt_id": a[:, 0], "round": a[:, 1], "n_draft": a[:, 2], "n_accepted": a[:, 3]})


def test_totals() -> None:
    t = M.totals(_rounds())
    assert t.n_rounds == 9
    assert t.n_verify_rounds == 8
    assert t.n_drafted == 23
    assert t.n_accepted == 8
    assert t.acceptance_rate == pytest.approx(8 / 23)
    assert t.mean_acceptance_length == pytest.approx(2.0)      # 1 + 8 / 8
    assert M.acceptance_rate(_rounds()) == pytest.approx(0.34782608695652173)
    assert M.mean_acceptance_length(_rounds()) == 2.0


def test_per_position() -> None:
    pp = M.per_position_acceptance(_rounds())
    assert list(pp["k"]) == [1, 2, 3]
    assert list(pp["n_rounds"]) == [8, 8, 7]
    assert list(pp["n_accepted"]) == [4, 3, 1]
    assert list(pp["acceptance"]) == pytest.approx([0.5, 3 / 8, 1 / 7])
    assert list(pp["conditional"]) == pytest.approx([0.5, 0.75, 0.5])
    # llama-server's "acc per pos": over all 8 verify rounds
    assert list(pp["per_verify_round"]) == pytest.approx([4 / 8, 3 / 8, 1 / 8])


def test_per_prompt() -> None:
    pp = M.per_prompt(_rounds())
    assert list(pp["prompt_id"]) == [0, 1]
    assert list(pp["n_rounds"]) == [6, 3]
    assert list(pp["n_drafted"]) == [15, 8]
    assert list(pp["n_accepted"]) == [4, 4]
    assert list(pp["acceptance_rate"]) == pytest.approx([4 / 15, 0.5])
    assert list(pp["mean_acceptance_length"]) == pytest.approx([1.8, 1 + 4 / 3])


def test_first_mismatch() -> None:
    fm = M.first_mismatch_histogram(_rounds())
    assert list(fm["k"]) == [1, 2, 3]
    assert list(fm["n_rounds"]) == [4, 1, 1]
    assert list(fm["share"]) == pytest.approx([4 / 6, 1 / 6, 1 / 6])
    assert M.n_all_accepted(_rounds()) == 2


def test_zero_acceptance_streaks() -> None:
    s = M.zero_acceptance_streaks(_rounds())
    assert s.values.tolist() == [[0, 1, 2, 2], [0, 5, 5, 1], [1, 2, 2, 1]]
    # a round with no drafts neither breaks nor extends a streak
    s2 = M.zero_acceptance_streaks(_rounds([(0, 0, 3, 0), (0, 1, 0, 0), (0, 2, 3, 0), (0, 3, 3, 2)]))
    assert s2.values.tolist() == [[0, 0, 2, 2]]
    assert len(M.zero_acceptance_streaks(_rounds([(0, 0, 3, 1)]))) == 0
    assert M.zero_acceptance_streaks(_rounds(), min_length=2).values.tolist() == [[0, 1, 2, 2]]


def test_rolling() -> None:
    r = M.rolling_acceptance(_rounds(), window=2)
    assert list(r["prompt_id"]) == [0] * 6 + [1] * 3
    assert list(r["round"]) == [0, 1, 2, 3, 4, 5, 0, 1, 2]
    assert list(r["acceptance_rate"]) == pytest.approx([1, 0.5, 0, 1 / 6, 1 / 3, 0, 2 / 3, 0.8, 0.4])
    glob = M.rolling_acceptance(_rounds(), window=2, by_prompt=False)
    # across the prompt boundary: p0 r5 (3, 0) then p1 r0 (3, 2) -> 2 / 6
    assert glob["acceptance_rate"][6] == pytest.approx(1 / 3)
    with pytest.raises(TraceFormatError):
        M.rolling_acceptance(_rounds(), window=0)


def test_centroid_coverage() -> None:
    steps = pd.DataFrame({"k": np.array([1, 2, 3, 1, 1, 2], dtype=np.int32),
                          "target_in_candidates": pd.array([True, False, None, True, True, True],
                                                           dtype="boolean")})
    c = M.centroid_coverage(steps)
    assert (c["n_steps"], c["n_covered"]) == (5, 4)
    assert c["coverage"] == pytest.approx(0.8)
    assert c["per_position"] == [{"k": 1, "n_steps": 3, "n_covered": 3, "coverage": 1.0},
                                 {"k": 2, "n_steps": 2, "n_covered": 1, "coverage": 0.5}]


def test_centroid_coverage_counts_checked_steps_only() -> None:
    # round (0, 0): k1 accepted, k2 rejected (checked), k3 after the rejection (never checked);
    # round (0, 1): k1 rejected (checked), k2 and k3 not checked
    steps = pd.DataFrame({"prompt_id": [0] * 6, "round": [0, 0, 0, 1, 1, 1], "k": [1, 2, 3, 1, 2, 3],
                          "accepted": [True, False, False, False, False, False],
                          "target_in_candidates": pd.array([True, True, False, False, False, False], dtype="boolean")})
    c = M.centroid_coverage(steps)
    # checked: (0,0,k1) covered, (0,0,k2) covered, (0,1,k1) not: 2 of 3
    assert (c["n_steps"], c["n_covered"]) == (3, 2) and c["coverage"] == pytest.approx(2 / 3)
    assert M.checked_mask(steps).tolist() == [True, True, False, True, False, False]


def test_timing_by_hand() -> None:
    r = pd.DataFrame({"n_draft": [3, 3, 1, 0], "n_accepted": [3, 0, 1, 0], "emitted": [[1, 2, 3, 4], [5], [6, 7], [8]],
                      "t_draft_ms": [6.0, 6.0, 2.0, 0.0], "t_verify_ms": [20.0, 20.0, 12.0, 9.0]})
    t = M.timing(r)
    # 8 tokens in 14 + 40 + 9 = 75 ms; 14 ms of drafting for 7 drafts; verify 4 tokens: 20 ms, 2: 12, 1: 9
    assert t["tokens_per_s"] == pytest.approx(8000 / 75) and t["t_step_ms_mean"] == pytest.approx(2.0)
    assert t["t_verify_ms_mean_by_size"] == {"4": 20.0, "2": 12.0, "1": 9.0}
    assert M.timing(r.drop(columns=["t_verify_ms"])) is None


def test_empty_and_missing_columns() -> None:
    empty = _rounds([(0, 0, 0, 0)]).iloc[:0]
    t = M.totals(empty)
    assert t.n_rounds == 0 and math.isnan(t.acceptance_rate) and math.isnan(t.mean_acceptance_length)
    assert len(M.per_position_acceptance(empty)) == 0
    with pytest.raises(TraceFormatError, match="n_accepted"):
        M.totals(pd.DataFrame({"n_draft": [1]}))


def test_request_totals_prefers_responses() -> None:
    req = pd.DataFrame({"kind": ["log", "response", "log", "response"],
                        "n_drafted": [7, 7, 10, 10], "n_accepted": [4, 4, 5, 5]})
    t = M.request_totals(req)
    assert (t["kind"], t["n_requests"], t["n_drafted"], t["n_accepted"]) == ("response", 2, 17, 9)
    assert t["acceptance_rate"] == pytest.approx(9 / 17)
    assert M.request_totals(req[req.kind == "log"])["kind"] == "log"


def test_summarize_is_json_ready() -> None:
    import json

    s = M.summarize(_rounds())
    text = json.dumps(s, allow_nan=False)
    back = json.loads(text)
    assert back["n_drafted"] == 23 and back["n_accepted"] == 8
    assert back["per_position"][2]["n_rounds"] == 7
    assert back["zero_acceptance_streaks"]["longest"] == 2
    assert back["zero_acceptance_streaks"]["n_rounds_in_streaks"] == 4
    assert back["centroid_coverage"] is None and back["timing_ms"] is None


def test_rolling_summary() -> None:
    ro = M.rolling_summary(_rounds(), window=2)
    # across the trace (p0 r0..r5, then p1 r0..r2), full windows only (rounds 2..9 in order):
    # (3+0)/(3+3)=.5, 0/6=0, 1/6, 1/3, 0/3=0, 2/6=1/3, 4/5=.8, 2/5=.4
    assert ro["by_prompt"] is False and ro["full_windows"] is True and ro["window"] == 2
    assert (ro["min"], ro["max"]) == (0.0, pytest.approx(0.8))
    assert ro["median"] == pytest.approx(1 / 3)
    assert len(ro["series"]) == 8 and ro["series"][5] == {"prompt_id": 1, "round": 0, "acceptance_rate": 1 / 3}
    assert len(M.rolling_summary(_rounds(), window=2, n_points=3)["series"]) == 3
    # fewer rounds than the window: every round counts (1, .5, 1/3 ... of the partial windows)
    short = M.rolling_summary(_rounds([(0, 0, 3, 3), (0, 1, 3, 0)]), window=8)
    assert short["full_windows"] is False and (short["min"], short["max"]) == (0.5, 1.0)
    assert M.rolling_summary(_rounds().iloc[:0]) is None
    assert M.summarize(_rounds())["rolling"]["window"] == M.DEFAULT_ROLLING_WINDOW


def test_report_is_a_frozen_record_whose_json_is_the_summary(tmp_path) -> None:
    """``report()`` is typed; its ``to_dict()`` is the summary (NaN -> None) with the head keys first, the prompts'
    text second in each prompt row, and the warnings last: the ``report --json`` document."""
    import dataclasses
    import json

    from mtpscope.traces.store.reader import open_trace
    from mtpscope.traces.synthetic import write_synthetic_trace

    d = write_synthetic_trace(tmp_path / "t", n_rounds=40, n_prompts=3, n_draft=3, seed=1)
    t = open_trace(d)
    rep = M.report(t)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rep.n_rounds = 0  # type: ignore[misc]  # assigning to a frozen dataclass on purpose
    doc = rep.to_dict()
    body = M.summarize(t.rounds, t.steps if t.manifest.get("centroids") is not None else None)
    assert list(doc) == ["trace", "source", "complete", "n_prompts", *body, "n_rounds_recorded", "warnings"]
    assert doc["n_rounds_recorded"] is None          # every round read
    assert {k: v for k, v in doc.items() if k in body and k != "prompts"} == \
        {k: v for k, v in body.items() if k != "prompts"}
    assert [{k: v for k, v in p.items() if k != "text"} for p in doc["prompts"]] == body["prompts"]
    assert [list(p)[:2] for p in doc["prompts"]] == [["prompt_id", "text"]] * len(body["prompts"])
    json.dumps(doc, allow_nan=False)
    assert rep.n_drafted == int(t.rounds["n_draft"].sum()) and rep.per_position[0].k == 1
    assert M.totals(t.rounds).to_dict()["n_drafted"] == rep.n_drafted
