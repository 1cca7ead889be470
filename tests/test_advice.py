"""The recommendation and the break-even on hand-made numbers (arithmetic in the comments), and on a
synthetic sweep against sums computed here with pyarrow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mtpscope.traces.analysis.advice import MIN_FIRST_DRAFTS, Candidate, advise, break_even, recommend
from mtpscope.traces.analysis.what_if import what_if


def _c(n, sp, iv=None, tps=None):
    return Candidate(n, tps, sp, None, iv)


def test_plain_decoding_wins_when_every_n_draft_is_slower() -> None:
    r = recommend([_c("plain", 1.0, (1.0, 1.0)), _c(1, 0.52, (0.45, 0.6)), _c(2, 0.4, (0.35, 0.45))],
                  n_first_drafts=500)
    assert r.choice == "plain" and not r.tie and r.speedup == 1.0
    assert r.reason.startswith("plain decoding is faster here at every n_draft (2 tried): best 0.52× [0.45, 0.60] "
                               "with n_draft 1")
    # an n_draft whose interval reaches 1 ties with plain decoding
    t = recommend([_c("plain", 1.0, (1.0, 1.0)), _c(1, 0.9, (0.8, 1.05))], n_first_drafts=500)
    assert t.choice == "plain" and t.tie and t.runner_up == 1


def test_the_fastest_n_draft_and_ties() -> None:
    r = recommend([_c("plain", 1.0), _c(1, 1.2, (1.1, 1.3)), _c(2, 1.5, (1.4, 1.6)), _c(3, 1.35, (1.2, 1.45))],
                  n_first_drafts=500)
    # n_draft 2's [1.4, 1.6] overlaps n_draft 3's [1.2, 1.45]: a tie, n_draft 2 still the choice
    assert (r.choice, r.speedup, r.interval, r.tie, r.runner_up) == (2, 1.5, (1.4, 1.6), True, 3)
    assert "a tie between n_draft 2 and n_draft 3 (1.35× [1.20, 1.45])" in r.reason   # both named (issue 34)
    s = recommend([_c("plain", 1.0), _c(2, 1.5, (1.45, 1.6)), _c(3, 1.3, (1.2, 1.4))], n_first_drafts=500,
                  estimated=True, estimate_how="plain decoding taken as the 1-token verify time")
    assert not s.tie and s.estimated and "speedup estimated: plain decoding taken as" in s.reason
    assert s.to_dict()["speedup"] == {"value": 1.5, "interval": [1.45, 1.6], "estimated": True}


def test_too_few_rounds_to_tell() -> None:
    r = recommend([_c("plain", 1.0), _c(2, 1.47, (1.2, 1.8))], n_first_drafts=4)
    assert r.choice is None and r.speedup is None and not r.tie
    assert r.reason.startswith(f"too few rounds to tell: 4 first drafts (at least {MIN_FIRST_DRAFTS}")
    # a 4-round trace: the estimate exists, the recommendation does not
    rounds = pd.DataFrame({"prompt_id": [0] * 4, "round": range(4), "n_draft": [2] * 4, "n_accepted": [2, 2, 2, 2],
                           "t_draft_ms": [1.0] * 4, "t_verify_ms": [10.0] * 4})
    a = advise(what_if(rounds, n_boot=20))
    assert a.recommendation.choice is None and "too few rounds" in a.recommendation.reason
    assert a.break_even is None     # no "MTP pays here" beside "too few rounds to tell"


def test_break_even_by_hand() -> None:
    # t_plain 10 ms, a draft step 2 ms (c = 0.2), verify of n tokens 10 + 2 n ms: rho(N) = (10 + 2 (N+1)) / 10
    tau = {1: 1.5, 2: 1.8}
    b = break_even(tau, 2.0, lambda n: 10.0 + 2.0 * n, 10.0)
    # N = 1: rho 1.4, c* = (1.5 - 1.4) / 1 = 0.1; N = 2: rho 1.6, c* = (1.8 - 1.6) / 2 = 0.1: the smaller N
    assert b.n_draft == 1 and b.draft_cost_ratio == pytest.approx(0.2)
    assert b.draft_cost_ratio_needed == pytest.approx(0.1) and b.verify_cost_ratio == pytest.approx(1.4)
    # tau* = 1 * 0.2 + 1.4 = 1.6: with i.i.d. acceptance 1 + alpha = 1.6
    assert b.mean_acceptance_length_needed == pytest.approx(1.6) and b.acceptance_rate_needed == pytest.approx(0.6)
    assert b.flat_verify_draft_cost_ratio_needed == pytest.approx(0.5) and not b.pays
    assert "if a draft step cost less than 0.10 of a plain decode (it costs 0.20" in b.words
    # N = 2 at tau 1.8: alpha with 1 + a + a^2 = 0.4 + 1.6 = 2.0 -> a = (sqrt 5 - 1) / 2
    row2 = b.per_n_draft[1]
    assert row2.acceptance_rate_needed == pytest.approx((5 ** 0.5 - 1) / 2, abs=1e-9)
    cheap = break_even(tau, 0.5, lambda n: 10.0 + 2.0 * n, 10.0)
    assert cheap.pays and cheap.words.startswith("MTP pays here")
    # out of reach: tau* above N + 1
    far = break_even({1: 1.1}, 9.0, lambda n: 30.0, 10.0)
    assert far.acceptance_rate_needed is None and "cannot pay" in far.words
    assert break_even({}, 1.0, lambda n: 1.0, 1.0) is None
    # a round's drafts priced per N (the what-if's t_draft): N = 1 costs 3 ms (c 0.3), N = 2 costs 4 ms (c 0.2
    # per step); c* as above (0.1 at both): the first N wins the tie and reports its own c
    per = break_even(tau, 2.0, lambda n: 10.0 + 2.0 * n, 10.0, t_draft_ms=lambda n: {1: 3.0, 2: 4.0}[n])
    assert per.n_draft == 1 and per.draft_cost_ratio == pytest.approx(0.3)
    assert per.per_n_draft[1].mean_acceptance_length_needed == pytest.approx(2 * 0.2 + 1.6)


def test_sweep_advice_against_the_measured_cells(tmp_path: Path) -> None:
    from mtpscope.traces.sweep.advice import advise_sweep
    from mtpscope.traces.sweep.reader import open_sweep
    from mtpscope.traces.synthetic import write_synthetic_sweep

    d = write_synthetic_sweep(tmp_path / "s", n_rounds=6000, assistants=("q8",), n_drafts=(1, 2, 3), n_shards=2,
                              n_prompts=24, categories=("code", "chat"))
    sw = open_sweep(d)
    adv = advise_sweep(sw, n_boot=50)
    # tokens/s of each configuration and of plain decoding, straight from the Parquet parts
    import json

    state = json.loads((d / "sweep.json").read_text())

    def tps(assistant: str, k: int) -> float:
        ne = t = 0.0
        for task in state["tasks"]:
            if task["assistant"] == assistant and task["n_draft"] == k:
                man = json.loads((d / task["dir"] / "manifest.json").read_text())
                files = man["parts"]["rounds"] if man.get("parts") else \
                    sorted(p.name for p in (d / task["dir"] / "rounds").glob("part-*.parquet"))
                tab = pa.concat_tables([pq.read_table(d / task["dir"] / "rounds" / f) for f in files])
                ne += sum(len(x) for x in tab["emitted"].to_pylist())
                t += float(np.sum(tab["t_draft_ms"]) + np.sum(tab["t_verify_ms"]))
        return 1000 * ne / t

    plain = tps("baseline", 0)
    by = {c.choice: c for c in adv.candidates}
    assert by["plain"].tokens_per_s == pytest.approx(plain) and by["plain"].speedup == 1.0
    for k in (1, 2, 3):
        assert by[k].tokens_per_s == pytest.approx(tps("q8", k))
        assert by[k].speedup == pytest.approx(tps("q8", k) / plain)
        lo, hi = by[k].speedup_interval
        assert lo <= by[k].speedup <= hi
    best = max((c for c in adv.candidates), key=lambda c: c.speedup)
    assert adv.recommendation.choice == best.choice
    assert set(adv.by_category) == {"code", "chat"} and adv.baseline.source == "sweep"
    assert adv.break_even is not None and set(adv.break_even_by_category) == {"code", "chat"}
    out = adv.to_dict()
    assert set(out["recommendation"]) >= {"choice", "speedup", "tie", "reason", "by_category"}
    assert set(out["recommendation"]["speedup"]) == {"value", "interval", "estimated"}
