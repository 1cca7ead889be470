"""Two numbers that say the same thing must say the same value: a label against the count it labels, a printed
value against the rule it is judged by, a doc's formula against the code's. Every expected value here is worked
out by hand from the rows the test writes, never read back from mtpscope's own output.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from mtpscope.traces.analysis.what_if import MIN_BOOT_UNITS, what_if

ROOT = Path(__file__).resolve().parent.parent


def _rounds(pid: list[int], na: list[int]) -> pd.DataFrame:
    """Rounds of 2 drafts each, 10 ms to draft, 30 ms to verify, numbered per prompt."""
    seen: dict[int, int] = {}
    rnd = []
    for p in pid:
        rnd.append(seen.get(p, 0))
        seen[p] = seen.get(p, 0) + 1
    n = len(pid)
    return pd.DataFrame({"prompt_id": pid, "round": rnd, "n_draft": [2] * n, "n_accepted": na,
                         "t_draft_ms": [10.0] * n, "t_verify_ms": [30.0] * n})


def test_block_intervals_of_a_categorised_trace_do_not_say_it_has_fewer_prompts() -> None:
    # 12 prompts (>= MIN_BOOT_UNITS = 8) in two categories of 6 (< 8 each): each category resamples blocks of
    # rounds, so the trace's intervals are over blocks; the words said "fewer than 8 prompts" beside `report`'s
    # "prompts: 12" (the demo: 36 prompts, 6 per category)
    assert MIN_BOOT_UNITS == 8
    pid = [p for p in range(12) for _ in range(20)]
    na = np.random.default_rng(5).integers(0, 3, len(pid)).tolist()
    cats = {p: "a" if p < 6 else "b" for p in range(12)}
    wi = what_if(_rounds(pid, na), categories=cats, n_boot=20)
    assert wi.n_prompts == 12 and wi.interval_units == "blocks"
    words = wi.interval_words()
    assert "blocks of 16 rounds" in words and "every category has fewer than 8 prompts" in words, words
    # a category's own table: it does have 6 prompts, fewer than 8
    assert wi.by_category["a"].n_prompts == 6
    assert wi.by_category["a"].interval_words().endswith(": fewer than 8 prompts")
    # without categories, 6 prompts of 20 rounds: fewer than 8 prompts, the trace's own count
    six = what_if(_rounds(pid[:120], na[:120]), n_boot=20)
    assert six.n_prompts == 6 and six.interval_words().endswith(": fewer than 8 prompts")


def test_centroid_coverage_counts_the_checked_steps_as_the_trace_format_says() -> None:
    # one round of 3 drafts: k=1 accepted (its target token among the candidates), k=2 the first rejection (not
    # among them), k=3 after it (among them, but compared with a token that followed a wrong draft). Over the
    # checked steps (k=1, k=2): 1 of 2 = 0.5; over every step where it is known it would be 2 of 3. `report` printed
    # 0.9783 (1530 of 1,564 checked steps) on the demo's F32 trace, TRACE_FORMAT.md defined 2419 of 2604 = 0.929.
    from mtpscope.traces.analysis.metrics import centroid_coverage

    steps = pd.DataFrame({"prompt_id": [0, 0, 0], "round": [0, 0, 0], "k": [1, 2, 3],
                          "accepted": [True, False, False], "target_in_candidates": [True, False, True]})
    cc = centroid_coverage(steps)
    assert (cc["n_steps"], cc["n_covered"], cc["coverage"]) == (2, 1, 0.5)
    doc = (ROOT / "docs" / "TRACE_FORMAT.md").read_text()
    line = next(ln for ln in doc.split("\n* ") if ln.startswith("centroid coverage ="))
    assert "the steps the target checked" in line and "first rejection" in line, line


def test_a_gap_just_past_the_near_tie_limit_is_not_printed_on_it(tmp_path: Path) -> None:
    # the drafter drafted #11 at logit 3.0, the target's #20 scored 2.4993: a gap of 0.5007 logits, past the near-tie
    # limit of 0.5, so the cause is runner_up; the sentence and the Step view's bar chart printed "0.50 logits
    # behind" beside other rows' "(near tie) ... 0.50". The target's entropy 0.9996 nats is under the 1-nat line
    # (sure: "wrong"), printed "1.00". (The demo's F32 trace: prompt 0 round 18, gap 13.2253 - 12.7246 = 0.5007.)
    from mtpscope.app import charts, round_views
    from mtpscope.traces import RoundRecord, StepRecord, TraceWriter
    from mtpscope.traces.analysis import explain as E
    from mtpscope.traces.store.reader import open_trace

    man = {"source": "synthetic", "prompts": [{"prompt_id": 0, "text": "a"}]}
    with TraceWriter(tmp_path / "t", man, n_embd_backbone=None, n_embd=None, hidden_dtype=None,
                     centroids=False) as w:
        w.add_round(RoundRecord(0, 0, 2, 10, 1, (11,), 0, (20, 21), (20,), 1.0, 2.0),
                    [StepRecord(k=1, token=11, logit=3.0, rank=0, top_ids=(11, 20), top_logits=(3.0, 2.4993),
                                target_token=20, target_rank=1, accepted=False, target_p_drafted=0.01,
                                target_entropy=0.9996)])
    t = open_trace(tmp_path / "t")
    c = E.step_causes(t.columns("rounds", E.ROUND_COLUMNS),
                      t.columns("steps", [*E.STEP_COLUMNS, *E.OPTIONAL_STEP_COLUMNS]))
    row = c.iloc[0].to_dict()
    assert row["cause"] == "runner_up" and row["target_side"] == "wrong"
    assert E.step_sentence(row) == ("rejected: the target's #20 was the drafter's runner-up, 0.501 logits behind; "
                                    "the target was sure (entropy 0.9996 nats, p(drafted) 0.01)")
    step = {"token": 11, "top_ids": [11, 20], "top_logits": [3.0, 2.4993], "target_token": 20, "target_rank": 1}
    fig = charts.top_candidates_figure(round_views.top_candidates(step, lambda i: f"t{i}"), 1)
    assert fig.layout.annotations[0].text == " 0.501 logits behind the draft"
    # away from the line two decimals stay: the chart test's 0.8 and a near tie of 0.4996 on its own side
    from mtpscope.traces.analysis.wording import beside
    assert (beside(0.8, 0.5), beside(0.5007, 0.5), beside(0.4996, 0.5), beside(0.9996, 1.0)) == \
        ("0.80", "0.501", "0.4996", "0.9996")
    # closer than six decimals: the exact shortest form, never the threshold itself
    assert (beside(0.5000001, 0.5), beside(0.4999999, 0.5), beside(0.5, 0.5)) == ("0.5000001", "0.4999999", "0.50")


def test_break_even_words_quote_the_cost_their_thresholds_are_worked_from() -> None:
    # n_draft 1, mean acceptance length 1.5, a draft step 5 ms, every verify 10 ms, plain decoding 10 ms, and a
    # what-if speedup of 1.5 / 1.6: a round costs r = 1.6 plain decodes, its draft c = 0.5, the rest 1.6 - 0.5 =
    # 1.1 (the verify alone 1.0); c* = 1.5 - 1.1 = 0.4, tau* = 1.6. The sentence quoted the verify's 1.00 beside
    # 0.40, which 1.5 - 1.00 does not give (the demo's F32 trace: 0.47 beside 1.08 with tau 1.53).
    from mtpscope.traces.analysis.advice import break_even

    b = break_even({1: 1.5}, 5.0, lambda n: 10.0, 10.0, speedup={1: 1.5 / 1.6})
    assert b is not None and not b.pays
    assert "less than 0.40 of a plain decode (it costs 0.50; the rest of a round, its verify of 2 tokens included, " \
           "1.10 decodes), or with a mean acceptance length of 1.60" in b.words, b.words
    # the rest of a round (1.2 - 0.1 = 1.1) above the 1.05 tokens a round emits, its verify alone (1.0) below:
    # "verifying 2 tokens costs 1.00 plain decodes, more than the 1.05 tokens" said a false thing
    no = break_even({1: 1.05}, 1.0, lambda n: 10.0, 10.0, speedup={1: 1.05 / 1.2})
    assert no is not None and no.draft_cost_ratio_needed < 0
    assert "costs 1.10 plain decodes, at least the 1.05 tokens a round emits at n_draft 1" in no.words, no.words


def test_diagnose_limits_count_the_same_first_misses_in_each_sentence() -> None:
    # 10 rounds with a first mismatch: 4 of them an end-of-generation draft the target confirmed (after_eog: the
    # drafter was right, llama.cpp counts the token as the target's), 6 real misses (3 far, 3 in the top list), of
    # which 5 hard and 1 sure. The hard sentence says 5 of the 6 judged (83 %); the far-miss one said 3 of 10 (30 %)
    # where 3 of the same 6 is 50 % (the demo's F32 trace: 599 of 657 judged beside far misses over 665).
    from types import SimpleNamespace

    from mtpscope.traces.diagnose.behaviour import limit_sentences

    side = SimpleNamespace(hard=5, wrong=1, p_drafted_mean_hard=0.04)
    x = SimpleNamespace(rejections=SimpleNamespace(target_side=side, causes={
        "near_tie": 0, "runner_up": 0, "in_top_k": 3, "far_miss": 3, "unreachable": 0, "after_eog": 4, "unknown": 0}),
        by_category={}, by_class={})
    report = SimpleNamespace(n_drafted=30, n_accepted=12, acceptance_rate=0.4, per_position=[])
    lines = limit_sentences(x, report)     # duck-typed records: only these fields are read
    assert lines[0].startswith("83 % of first misses are hard tokens (5 of the 6 the target judged)"), lines
    assert ("50 % of first misses are far misses (3 of the 6 of known target token, confirmed end-of-generation "
            "drafts left out:") in lines[-1], lines
