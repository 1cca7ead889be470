"""Rejection causes, first mismatches, aggregates and sentences on a hand-built trace.

The trace is written through the real TraceWriter and read back with open_trace; every expected value
below is worked out by hand from the records in ``_write`` (comments give the arithmetic).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from mtpscope.errors import TraceFormatError
from mtpscope.traces.analysis import explain as E
from mtpscope.traces.store.reader import open_trace
from mtpscope.traces.store.records import RoundRecord, StepRecord
from mtpscope.traces.store.writer import TraceWriter

EOG = 1


def _step(k, token, top_ids, top_logits, target, accepted, **kw):
    rank = None
    if target is not None:
        # rank by hand: strictly greater logits; only used where the target is in the list
        rank = kw.pop("rank", None)
        if rank is None and target not in top_ids:
            rank = 50
        elif rank is None:
            rank = sum(1 for v in top_logits if v > top_logits[top_ids.index(target)])
    return StepRecord(k=k, token=token, logit=top_logits[0], rank=0, top_ids=top_ids, top_logits=top_logits,
                      target_token=target, target_rank=rank, accepted=accepted, **kw)


def _write(path, centroids=False):
    rounds = [
        # r0: d = 11, 12, 13; target 11, 20, 30, 40 -> n_acc 1, emitted 11 20
        (RoundRecord(0, 0, 5, 10, 3, (11, 12, 13), 1, (11, 20, 30, 40), (11, 20), 9.0, 30.0),
         [_step(1, 11, [11, 4, 5], [3.0, 1.0, 0.5], 11, True),
          _step(2, 12, [12, 20, 5], [3.0, 2.9, 1.0], 20, False),              # gap 0.1 -> near_tie
          _step(3, 13, [13, 30, 6], [2.0, 1.0, 0.0], 30, False)]),            # after_mismatch
        # r1: target 50 at rank 3 with gap 5 - 2.5 = 2.5 -> in_top_k
        (RoundRecord(0, 1, 7, 20, 3, (21, 22, 23), 0, (50, 51, 52, 53), (50,), 9.0, 30.0),
         [_step(1, 21, [21, 7, 8, 50], [5.0, 4.0, 3.0, 2.5], 50, False),
          _step(2, 22, [22, 9, 3], [1.0, 0.5, 0.2], 51, False),
          _step(3, 23, [23, 9, 3], [1.0, 0.5, 0.2], 52, False)]),
        # r2: everything accepted, bonus 54
        (RoundRecord(0, 2, 8, 50, 3, (51, 52, 53), 3, (51, 52, 53, 54), (51, 52, 53, 54), 9.0, 30.0),
         [_step(1, 51, [51, 2], [4.0, 1.0], 51, True), _step(2, 52, [52, 2], [4.0, 1.0], 52, True),
          _step(3, 53, [53, 2], [4.0, 1.0], 53, True)]),
        # r3: target 70 is the runner-up, gap 4 - 2 = 2 -> runner_up
        (RoundRecord(0, 3, 12, 54, 3, (60, 61, 62), 0, (70, 71, 72, 73), (70,), 9.0, 30.0),
         [_step(1, 60, [60, 70, 3], [4.0, 2.0, 1.0], 70, False),
          _step(2, 61, [61, 3], [1.0, 0.0], 71, False), _step(3, 62, [62, 3], [1.0, 0.0], 72, False)]),
        # prompt 1, r0: target 99 at rank 15, below the 3-long list -> far_miss, gap >= 6 - 1 = 5
        (RoundRecord(1, 0, 3, 30, 2, (80, 81), 0, (99, 98, 97), (99,), 6.0, 25.0),
         [_step(1, 80, [80, 4, 5], [6.0, 3.0, 1.0], 99, False, rank=15),
          _step(2, 81, [81, 4], [1.0, 0.0], 98, False)]),
        # prompt 1, r1: the first draft is the end-of-generation token: round ends, k2 / k3 unverified
        (RoundRecord(1, 1, 4, 99, 3, (EOG, 5, 6), 1, (EOG, 7, 8, 9), (EOG,), 9.0, 30.0),
         [_step(1, EOG, [EOG, 2], [9.0, 1.0], EOG, True), _step(2, 5, [5, 7], [2.0, 1.0], 7, False),
          _step(3, 6, [6, 8], [2.0, 1.9], 8, False)]),
    ]
    man = {"source": "synthetic", "prompts": [{"prompt_id": 0, "text": "a"}, {"prompt_id": 1, "text": "b"}]}
    if centroids:
        man["centroids"] = {"n_centroids": 64, "top_k": 4}
    with TraceWriter(path, man, n_embd_backbone=None, n_embd=None, hidden_dtype=None, centroids=centroids) as w:
        for r, steps in rounds:
            if centroids:
                # prompt 0 round 1 k1: target 50 not among the sparse head's candidates (centroid 9, rank 30)
                steps = [replace(s, target_in_candidates=not (r.prompt_id == 0 and r.round == 1 and s.k == 1),
                                 target_centroid=9, target_centroid_rank=30) for s in steps]
            w.add_round(r, steps)
    return open_trace(path)


@pytest.fixture
def trace(tmp_path):
    return _write(tmp_path / "t")


def _frames(t):
    return t.columns("rounds", E.ROUND_COLUMNS), t.columns("steps", list(E.STEP_COLUMNS))


def test_step_causes_by_hand(trace) -> None:
    r, s = _frames(trace)
    c = E.step_causes(r, s)
    assert len(c) == len(s) == 17
    got = [(int(p), int(rr), int(k), cause) for p, rr, k, cause in c[["prompt_id", "round", "k", "cause"]].itertuples(index=False)]
    assert got == [
        (0, 0, 1, "accepted"), (0, 0, 2, "near_tie"), (0, 0, 3, "after_mismatch"),
        (0, 1, 1, "in_top_k"), (0, 1, 2, "after_mismatch"), (0, 1, 3, "after_mismatch"),
        (0, 2, 1, "accepted"), (0, 2, 2, "accepted"), (0, 2, 3, "accepted"),
        (0, 3, 1, "runner_up"), (0, 3, 2, "after_mismatch"), (0, 3, 3, "after_mismatch"),
        (1, 0, 1, "far_miss"), (1, 0, 2, "after_mismatch"),
        (1, 1, 1, "accepted"), (1, 1, 2, "after_eog"), (1, 1, 3, "after_eog"),
    ]
    fm = c[c["first_mismatch"]]
    assert fm[["prompt_id", "round", "k"]].values.tolist() == [[0, 0, 2], [0, 1, 1], [0, 3, 1], [1, 0, 1], [1, 1, 2]]
    assert c.loc[1, "gap"] == pytest.approx(3.0 - 2.9, abs=1e-6)
    assert c.loc[3, "gap"] == pytest.approx(2.5)
    assert c.loc[9, "gap"] == pytest.approx(2.0)
    assert math.isnan(c.loc[12, "gap"]) and c.loc[12, "gap_at_least"] == pytest.approx(5.0)
    assert int(c.loc[12, "target_rank"]) == 15 and int(c.loc[12, "n_top"]) == 3
    # no centroid columns and no target-side columns in this trace
    assert c["sparse_unreachable"].isna().all()
    assert set(c.loc[c["first_mismatch"] & (c["cause"] != "after_eog"), "target_side"]) == {"unknown"}


def test_near_tie_threshold_and_rank_zero(trace) -> None:
    r, s = _frames(trace)
    # with a 3-logit threshold the runner-up (gap 2) and the in-top-k (gap 2.5) become near ties
    c = E.step_causes(r, s, near_tie_gap=3.0)
    assert c.loc[[1, 3, 9], "cause"].tolist() == ["near_tie"] * 3
    assert c.loc[12, "cause"] == "far_miss"    # gap unknown (below the list): never a near tie
    # an exact tie: rank 0 but a different token -> near_tie with gap 0
    s2 = s.copy()
    s2.loc[9, "target_rank"] = 0
    s2.loc[9, "top_logits"] = None
    c2 = E.step_causes(r, s2)
    assert c2.loc[9, "cause"] == "near_tie" and c2.loc[9, "gap"] == 0.0


def test_unreachable_only_for_the_centroid_head(tmp_path) -> None:
    t = _write(tmp_path / "c", centroids=True)
    r = t.columns("rounds", E.ROUND_COLUMNS)
    s = t.columns("steps", E.STEP_COLUMNS)
    dense = E.step_causes(r, s)
    cent = E.step_causes(r, s, head="centroid")
    assert dense.loc[3, "cause"] == "in_top_k" and bool(dense.loc[3, "sparse_unreachable"]) is True
    assert cent.loc[3, "cause"] == "unreachable"
    assert (dense["cause"] != cent["cause"]).sum() == 1
    fm = E.first_mismatches(r, dense)
    assert E.rejection_summary(fm).sparse_unreachable == 1
    row = cent.loc[3].to_dict()
    assert E.step_sentence(row, lambda t: f"“t{t}”", n_centroids=64, centroid_top_k=4) == \
        "unreachable: “t50” lives in centroid 9, rank 30 of 64 (the head scores the top 4)"
    with pytest.raises(TraceFormatError):
        E.step_causes(r, s, head="sparse")


def test_first_mismatches_and_summary(trace) -> None:
    r, s = _frames(trace)
    fm = E.first_mismatches(r, E.step_causes(r, s))
    assert fm[["prompt_id", "round", "k", "drafted_token"]].values.tolist() == \
        [[0, 0, 2, 12], [0, 1, 1, 21], [0, 3, 1, 60], [1, 0, 1, 80], [1, 1, 2, 5]]
    assert fm["target_token"].tolist() == [20, 50, 70, 99, 7]
    assert fm["cause"].tolist() == ["near_tie", "in_top_k", "runner_up", "far_miss", "after_eog"]
    summ = E.rejection_summary(fm)
    assert summ.n_rounds_rejected == 5 and summ.n_first_mismatch == 5
    assert summ.causes == {"near_tie": 1, "runner_up": 1, "in_top_k": 1, "far_miss": 1, "unreachable": 0,
                              "after_eog": 1, "unknown": 0}
    # ranks at the drafter's misses: 1 (r0 k2), 3, 1, 15; not the eog step's (the round ended at its EOG draft)
    assert summ.rank_histogram == {**dict.fromkeys(E.RANK_BINS, 0), "1": 2, "3": 1, "10+": 1}
    assert [p.n for p in summ.by_position] == [3, 2]           # (rounds per position: the eog round counted)
    assert [sum(p.rank_histogram.values()) for p in summ.by_position] == [3, 1]
    assert summ.target_side.unknown == 4 and summ.target_side.hard == 0
    # the most-rejected lists hold the misses only (ties by lower id): never the eog step's draft 5 or target 7
    assert [t.token for t in summ.top_drafted_tokens] == [12, 21, 60, 80]
    assert [t.token for t in summ.top_target_tokens] == [20, 50, 70, 99]


def test_rounds_only_gives_unknown_causes(trace) -> None:
    r, _ = _frames(trace)
    fm = E.first_mismatches(r)
    assert fm["cause"].tolist() == ["unknown", "unknown", "unknown", "unknown", "after_eog"]
    assert fm["target_token"].tolist() == [20, 50, 70, 99, 7]
    r2 = r.drop(columns=["target"])
    fm2 = E.first_mismatches(r2)
    assert fm2["target_token"].isna().all()
    # target unknown: not counted in n_first_mismatch
    assert E.rejection_summary(fm2).n_first_mismatch == 0


def test_rank_from_the_top_list_when_target_rank_is_missing(trace) -> None:
    r, s = _frames(trace)
    s2 = s.copy()
    s2["target_rank"] = pd.array([pd.NA] * len(s2), dtype="Int32")
    c = E.step_causes(r, s2)
    assert int(c.loc[3, "target_rank"]) == 3 and c.loc[3, "cause"] == "in_top_k"
    assert int(c.loc[12, "target_rank"]) == 3 and c.loc[12, "cause"] == "far_miss"   # not in the 3-long list
    s3 = s2.drop(columns=["top_ids", "top_logits"])
    assert E.step_causes(r, s3).loc[3, "cause"] == "unknown"


def test_target_side_split() -> None:
    rounds = pd.DataFrame({"prompt_id": [0, 0], "round": [0, 1], "n_draft": [1, 1], "n_accepted": [0, 0]})
    steps = pd.DataFrame({"prompt_id": [0, 0], "round": [0, 1], "k": [1, 1], "token": [5, 6],
                          "target_token": [7, 8], "target_rank": [1, 1], "accepted": [False, False],
                          "top_ids": [[5, 7], [6, 8]], "top_logits": [[2.0, 1.0], [2.0, 1.0]],
                          "target_p_drafted": [0.3, 0.01], "target_entropy": [1.7, 0.2]})
    c = E.step_causes(rounds, steps)
    assert c["target_side"].tolist() == ["hard", "wrong"]
    ts = E.rejection_summary(E.first_mismatches(rounds, c)).target_side
    assert ts.hard == 1 and ts.wrong == 1 and ts.p_drafted_mean_hard == pytest.approx(0.3)
    s = E.step_sentence(c.loc[1].to_dict(), lambda t: f"“{t}”")
    assert s == "rejected: the target's “8” was the drafter's runner-up, 1.00 logits behind; the target was " \
                "sure (entropy 0.20 nats, p(drafted) 0.01)"


def test_sentences(trace) -> None:
    r, s = _frames(trace)
    c = E.step_causes(r, s)
    lab = {20: "“ the”", 50: "“json”", 70: "“x”", 99: "“y”", 11: "“a”"}.get
    text = [E.step_sentence(c.loc[i].to_dict(), lab) for i in (0, 1, 2, 3, 9, 12, 15)]
    assert text[0] == "accepted: the drafter's “a” was the target's token"
    assert text[1] == "rejected (near tie): the target's “ the” was the drafter's runner-up, 0.10 logits behind"
    assert text[2] == "not compared: an earlier draft of this round was rejected"
    assert text[3] == "rejected: the target's “json” was the drafter's 4th choice, 2.50 logits behind"
    assert text[4] == "rejected: the target's “x” was the drafter's runner-up, 2.00 logits behind"
    assert text[5] == "rejected (far miss): the target's “y” was far down the drafter's list (rank 15, not in " \
                      "the stored top 3, more than 5.00 logits behind)"
    assert text[6].startswith("not verified:")


def test_rank_histogram_and_top_tokens() -> None:
    h = E.rank_histogram(pd.array([0, 1, 1, 9, 10, 250, None, -1], dtype="Int64"))
    assert h == {"0": 1, "1": 2, "2": 0, "3": 0, "4": 0, "5": 0, "6": 0, "7": 0, "8": 0, "9": 1, "10+": 2}
    assert [t.to_dict() for t in E.top_tokens(np.array([5, 3, 5, 3, 9, -1]), 2)] == \
        [{"token": 3, "count": 2}, {"token": 5, "count": 2}]
    assert [t.to_dict() for t in E.top_tokens(np.array([4, 4]), 1, lambda t: f"t{t}")] == \
        [{"token": 4, "count": 2, "text": "t4"}]


def test_a_confirmed_end_of_generation_draft_is_not_a_miss(tmp_path) -> None:
    # llama.cpp's rule, as the recorder keeps it: draft 2 is the end-of-generation token and the target chose it
    # too, but it is not the round's last draft, so it is the target's token (n_accepted 1, eog_confirmed);
    # the round ended there: k2 and k3 are not the drafter's misses
    rec = RoundRecord(0, 0, 5, 10, 3, (5, EOG, 6), 1, (5, EOG, 9, 10), (5, EOG), 9.0, 30.0, eog_confirmed=True)
    steps = [_step(1, 5, [5, 2], [4.0, 1.0], 5, True), _step(2, EOG, [EOG, 2], [4.0, 1.0], EOG, False),
             _step(3, 6, [6, 9], [2.0, 1.0], 9, False)]
    man = {"source": "synthetic", "prompts": [{"prompt_id": 0, "text": "a"}]}
    with TraceWriter(tmp_path / "e", man, n_embd_backbone=None, n_embd=None, hidden_dtype=None, centroids=False) as w:
        w.add_round(rec, steps)
    r, s = _frames(open_trace(tmp_path / "e"))
    assert r["eog_confirmed"].tolist() == [True]
    c = E.step_causes(r, s)
    assert c["cause"].tolist() == ["accepted", "after_eog", "after_eog"]
    fm = E.first_mismatches(r, c)
    assert fm[["k", "cause"]].values.tolist() == [[2, "after_eog"]]
    summ = E.rejection_summary(fm)
    assert summ.causes["near_tie"] == 0 and summ.causes["after_eog"] == 1
    # the EOG token is both the draft and the target's token here: listed as neither a rejected draft nor a rejected
    # target token (a short recording listed <turn|> in both), and no rank at a "mismatch"
    assert summ.top_drafted_tokens == () and summ.top_target_tokens == ()
    assert sum(summ.rank_histogram.values()) == 0
