"""`probe --replay` says identical or why (traces.server.replay.why_differs) on hand-built requests and rounds,
and the concurrency sentinel's pairing (traces.server.concurrency.compare_runs): each reason, the first differing
round from the output tokens, the overlap count. The real server's side is in tests/test_server_concurrency.py."""

from __future__ import annotations

import pandas as pd

from mtpscope.traces.server.concurrency import compare_runs
from mtpscope.traces.server.replay import REASONS, eog_rounds, round_of_token, why_differs

EOG = 1
# prompt of 4 tokens; output = prefill token 50, round 0 emits [51, 52, 53], round 1 emits [54, EOG] (two accepted
# drafts, the second the end of generation: no target token after it)
ROUNDS = pd.DataFrame({"prompt_id": [0, 0], "round": [0, 1], "n_draft": [3, 3], "n_accepted": [2, 2],
                       "emitted": [[51, 52, 53], [54, EOG]]})
OUT = [50, 51, 52, 53, 54, EOG]
IDS = [2, 10, 11, 12]


def _verdict(**kw):
    base = dict(request=3, prompt="p", server={"n_drafted": 6, "n_accepted": 3, "output_tokens": OUT},
                recording={"n_drafted": 6, "n_accepted": 4, "output_tokens": OUT}, server_ids=IDS, recording_ids=IDS,
                recording_n_prompt=4, rounds=ROUNDS, temperature=0.0, seed=0, n_overlapping=0)
    base.update(kw)
    return why_differs(**base)


def test_round_of_token_and_eog_rounds() -> None:
    # token 0: the prefill's; tokens 1..3: round 0; tokens 4..5: round 1; past the end: none
    assert [round_of_token(ROUNDS, j) for j in range(7)] == [None, 0, 0, 0, 1, 1, None]
    assert eog_rounds(ROUNDS) == [1]                       # round 0 emitted 3 tokens for 2 accepted: a target token


def test_eog_rule_same_output_counts_differ() -> None:
    v = _verdict()
    assert (v.reason, v.round, v.token) == ("EOG rule", 1, None)
    assert "round 1" in v.line() and v.line().startswith("request 3 (prompt p) differs from round 1: EOG rule")


def test_tokenization_first() -> None:
    v = _verdict(recording_ids=[2, 10, 99, 12], recording={"n_drafted": 6, "n_accepted": 4,
                                                          "output_tokens": [50, 51, 60]})
    assert v.reason == "tokenization" and "prompt token 2" in v.detail and v.token == 2
    v = _verdict(recording_ids=None, recording_n_prompt=7)
    assert v.reason == "tokenization" and "4 prompt tokens" in v.detail and "recording 7" in v.detail


def test_sampler_slot_unexplained() -> None:
    other = {"n_drafted": 6, "n_accepted": 2, "output_tokens": [50, 51, 52, 70]}
    v = _verdict(recording=other, temperature=0.8, seed=-1)
    # output token 3 differs: round 0 emitted tokens 1..3
    assert (v.reason, v.round, v.token) == ("sampler", 0, 3) and "random seed" in v.detail
    v = _verdict(recording=other, temperature=0.8, seed=5, settings_differ=["temperature"])
    assert v.reason == "sampler" and "temperature" in v.detail
    # a setting that is not the sampler's is not named as the sampler's difference
    v = _verdict(recording=other, temperature=0.8, seed=5, settings_differ=["parallel slots (--parallel)"])
    assert v.reason == "sampler" and "--parallel" not in v.detail and "top-k / top-p / min-p" in v.detail
    v = _verdict(recording=other, n_overlapping=2)
    assert v.reason == "slot" and "2 other requests" in v.detail and "--check-concurrency" in v.detail
    v = _verdict(recording=other, settings_differ=["draft max (--spec-draft-n-max)"])
    assert v.reason == "unexplained" and "draft max" in v.detail
    assert {"tokenization", "EOG rule", "sampler", "slot", "unexplained"} == set(REASONS)


def _row(request, drafted, accepted, out, slot, t0, t1):
    return {"request": request, "prompt": f"q{request}", "n_drafted": drafted, "n_accepted": accepted,
            "output_tokens": out, "id_slot": slot, "started_unix_s": t0, "ended_unix_s": t1}


def test_compare_runs_names_what_differs_and_counts_overlaps() -> None:
    solo = {(0, 0): _row(0, 6, 3, [1, 2], 0, 0.0, 1.0), (0, 1): _row(1, 6, 3, [3, 4], 0, 1.0, 2.0),
            (0, 2): _row(2, 3, 3, [5], 0, 2.0, 3.0)}
    # concurrent: 0 and 1 overlap (0..2 and 1..3), 2 runs alone afterwards; 1's accepted and 2's output differ
    conc = {(0, 0): _row(0, 6, 3, [1, 2], 0, 0.0, 2.0), (0, 1): _row(1, 6, 2, [3, 4], 1, 1.0, 3.0),
            (0, 2): _row(2, 3, 3, [6], 0, 3.5, 4.0)}
    rows = compare_runs(solo, conc)
    assert [r.request for r in rows] == [0, 1, 2]
    assert [r.differs for r in rows] == [False, True, True]
    assert [r.n_overlapping for r in rows] == [1, 1, 0]
    assert [r.same_output for r in rows] == [True, True, False]
    assert [r.slot for r in rows] == [0, 1, 0] and rows[1].accepted == 2 and rows[1].solo_accepted == 3


def test_replay_probe_refuses_n_draft_0_before_reading_or_recording(tmp_path) -> None:
    """`replay_probe(n_draft=0)` (what `probe --replay --n-draft 0` reaches past the parser): one ServerError naming
    `--n-draft`, before the probe trace is read (there is none here) or anything is recorded."""
    import pytest

    from mtpscope.errors import ServerError
    from mtpscope.traces.server.replay import replay_probe

    for bad in (0, -1):
        with pytest.raises(ServerError) as e:
            replay_probe(tmp_path / "no-probe", assistant=tmp_path / "a.gguf", n_draft=bad)
        assert e.value.key == "--n-draft" and "1..64" in e.value.one_line()
    assert not (tmp_path / "no-probe").exists()
