"""Output positions, acceptance by label, the aligned diff of two runs and drift, on hand-built rounds."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from mtpscope.errors import TraceFormatError
from mtpscope.traces.analysis import breakdown as B
from mtpscope.traces.analysis.align import OneSided, aligned_diff, bootstrap_delta, pair_prompts
from mtpscope.traces.analysis.drift import drift
from mtpscope.traces.analysis.positions import positions


def _rounds(rows):
    """rows: (prompt_id, round, pending, n_draft, n_accepted, emitted)."""
    return pd.DataFrame({"prompt_id": [r[0] for r in rows], "round": [r[1] for r in rows],
                         "pending_token": [r[2] for r in rows], "n_draft": [r[3] for r in rows],
                         "n_accepted": [r[4] for r in rows], "emitted": [r[5] for r in rows]})


# prompt 0 generates 100 101 102 103 104 105 106: run A accepts more than run B
A = _rounds([(0, 0, 100, 3, 3, [101, 102, 103, 104]),   # g1..g3 accepted, g4 bonus
             (0, 1, 104, 2, 1, [105, 106])])            # g5 accepted, g6 rejected (correction)
B_ = _rounds([(0, 0, 100, 3, 1, [101, 102]),             # g1 accepted, g2 rejected
              (0, 1, 102, 3, 0, [103]),                  # g3 rejected
              (0, 2, 103, 3, 2, [104, 105, 106])])       # g4, g5 accepted, g6 rejected


def test_positions_by_hand() -> None:
    p = positions(A)
    assert p.sequences[0].tolist() == [100, 101, 102, 103, 104, 105, 106]
    assert p.drafts[["round", "k", "g", "accepted"]].values.tolist() == \
        [[0, 1, 1, True], [0, 2, 2, True], [0, 3, 3, True], [1, 1, 5, True], [1, 2, 6, False]]
    assert p.emitted[["g", "token", "status", "k"]].values.tolist() == \
        [[1, 101, "accepted", 1], [2, 102, "accepted", 2], [3, 103, "accepted", 3], [4, 104, "bonus", 0],
         [5, 105, "accepted", 1], [6, 106, "rejected", 2]]
    # a gap in the rounds or an unknown emitted list: positions unknown for that prompt
    gap = positions(A.iloc[[1]])
    assert gap.sequences == {} and gap.drafts["g"].tolist() == [-1, -1]
    with pytest.raises(TraceFormatError):
        positions(A.drop(columns=["emitted"]))


def test_breakdown_counts_add_up() -> None:
    p = positions(B_)
    cls = {0: np.array([0, 0, 3, 3, 4, 0, 0], dtype=np.int8)}   # prose prose number number punct prose prose
    from mtpscope.traces.analysis.token_classes import TokenClasses
    tc = {0: TokenClasses(cls[0], np.zeros(7, dtype=np.int8))}
    c, ch = B.draft_labels(p, tc)
    # drafts: r0 g1 g2 g3, r1 g3 g4 g5, r2 g4 g5 g6
    assert c.tolist() == ["prose", "number", "number", "number", "punctuation", "prose", "punctuation", "prose", "prose"]
    by = B.by_label(p, c)
    assert by["number"].to_dict() == {"n_drafted": 3, "n_accepted": 0, "acceptance_rate": 0.0}
    assert by["prose"].n_drafted == 4 and by["prose"].n_accepted == 2      # g1 (r0) and g5 (r2)
    assert sum(v.n_drafted for v in by.values()) == int(B_["n_draft"].sum())
    bp = B.by_label_and_position(p, c, ["punctuation"])
    assert {k: [r.to_dict() for r in v] for k, v in bp.items()} == \
        {"punctuation": [{"k": 1, "n_drafted": 1, "n_accepted": 1, "acceptance_rate": 1.0},
                         {"k": 2, "n_drafted": 1, "n_accepted": 0, "acceptance_rate": 0.0}]}
    cats = B.prompt_categories({"prompts": [{"prompt_id": 0, "category": "story"}, {"prompt_id": 1}]})
    assert cats == {0: "story", 1: "(none)"}
    assert B.prompt_categories({"prompts": [{"prompt_id": 0}]}) is None
    assert {k: v.to_dict() for k, v in B.by_category(B_, cats).items()} == \
        {"story": {"n_prompts": 1, "n_drafted": 9, "n_accepted": 3, "acceptance_rate": 3 / 9}}


def test_aligned_diff_by_hand() -> None:
    pair = pair_prompts({"prompts": [{"prompt_id": 0, "text": "x"}]}, {"prompts": [{"prompt_id": 0, "text": "x"}]})
    assert pair.by == "text" and pair.pairs == ((0, 0),)
    d = aligned_diff(A, positions(A), B_, positions(B_), pair,
                     classes_a={0: np.array(["prose", "prose", "json", "json", "prose", "prose", "code"], dtype=object)})
    # A: g1 acc, g2 acc, g3 acc, g4 bonus, g5 acc, g6 rej ; B: g1 acc, g2 rej, g3 rej, g4 acc, g5 acc, g6 rej
    assert d.outputs_identical
    assert d.status_counts == {"accepted/accepted": 2, "accepted/rejected": 2, "bonus/accepted": 1,
                               "rejected/rejected": 1}
    # a_only: g2 (B rejected it as its draft 2) and g3 (B's draft 1); classes_a[2] = classes_a[3] = json
    assert d.a_only == OneSided(n=2, by_class={"json": 2}, by_position={"1": 1, "2": 1})
    assert d.b_only.n == 0
    assert d.prompts[0].first_difference == 2 and d.prompts[0].diverged_at is None
    # acceptance: A 4/5, B 3/9
    assert d.delta["all"].rate_a == pytest.approx(0.8) and d.delta["all"].rate_b == pytest.approx(1 / 3)
    assert d.delta["all"].ci_low is None           # one prompt: no interval
    # the JSON: the records' fields, in this order
    j = d.to_dict()
    assert list(j) == ["paired_by", "n_pairs", "unpaired_a", "unpaired_b", "outputs_identical", "status_counts",
                       "a_only", "b_only", "prompts", "not_comparable", "delta"]
    assert j["not_comparable"] is None
    assert j["a_only"] == {"n": 2, "by_class": {"json": 2}, "by_position": {"1": 1, "2": 1}, "n_eog_confirmed": 0}
    assert j["prompts"] == [{"prompt_id_a": 0, "prompt_id_b": 0, "n_compared": 6, "identical_output": True,
                             "diverged_at": None, "first_difference": 2}]
    assert list(j["delta"]["all"]) == ["n_prompts", "rate_a", "rate_b", "delta", "ci_low", "ci_high", "level", "n_boot"]


def test_a_confirmed_end_of_generation_draft_is_counted_apart() -> None:
    """B's round 1 rejected its draft 1 at g3 because it was an end-of-generation token the target chose too
    (``eog_confirmed``): still 'accepted in A, rejected in B' as llama.cpp counts, and counted apart (explain calls
    it no miss of the drafter): 1 of the 2."""
    pair = pair_prompts({"prompts": [{"prompt_id": 0, "text": "x"}]}, {"prompts": [{"prompt_id": 0, "text": "x"}]})
    b = B_.assign(eog_confirmed=[False, True, None])
    p = positions(b)
    assert p.emitted["eog_confirmed"].tolist() == [False, False, True, False, False, False]     # g3 only
    d = aligned_diff(A, positions(A), b, p, pair)
    assert (d.a_only.n, d.a_only.n_eog_confirmed, d.b_only.n_eog_confirmed) == (2, 1, 0)


def test_diverging_outputs_stop_the_comparison() -> None:
    b2 = _rounds([(0, 0, 100, 3, 1, [101, 102]), (0, 1, 102, 3, 0, [999])])
    pair = pair_prompts({}, {}, [0], [0])
    assert pair.by == "prompt_id"
    d = aligned_diff(A, positions(A), b2, positions(b2), pair)
    assert not d.outputs_identical
    assert d.prompts[0].diverged_at == 3 and d.prompts[0].n_compared == 2   # g1, g2 only


def test_runs_of_other_targets_or_other_text_are_not_compared_position_by_position() -> None:
    """Two targets (or outputs that differ from their first token on) generate different text: the diff compared
    zero positions yet printed a +0.708 delta and blamed "a near tie or numerics". Now: the reason, no position,
    each run's own rate and no delta."""
    from mtpscope.traces.analysis.align import target_difference

    m64 = {"dims": {"n_embd_backbone": 64}, "models": {"target": {"architecture": "gemma4"}}}
    m128 = {"dims": {"n_embd_backbone": 128}, "models": {"target": {"architecture": "gemma4"}}}
    assert target_difference(m64, m128) == "different targets: hidden width (dims.n_embd_backbone) A 64, B 128"
    assert target_difference(m64, {"dims": {"n_embd_backbone": 64}, "models": {"target": {"architecture": "x"}}}) == \
        "different targets: architecture (models.target.architecture) A gemma4, B x"
    # the same target in another file (a quantization, an HF checkpoint), or one side unknown (an import): compared
    assert target_difference(m64, m64) is None and target_difference(m64, {"dims": None}) is None
    pair = pair_prompts({}, {}, [0], [0])
    d = aligned_diff(A, positions(A), B_, positions(B_), pair, targets_differ=target_difference(m64, m128))
    assert d.not_comparable == "different targets: hidden width (dims.n_embd_backbone) A 64, B 128"
    assert len(d.positions) == 0 and d.a_only.n == d.b_only.n == 0 and d.status_counts == {}
    assert d.prompts[0].n_compared == 0 and d.prompts[0].first_difference is None
    r = d.delta["all"]
    assert list(d.delta) == ["all"] and r.rate_a == pytest.approx(0.8) and r.rate_b == pytest.approx(1 / 3)
    assert r.delta is None and r.ci_low is None and r.ci_high is None
    assert d.to_dict()["not_comparable"] == d.not_comparable
    # one target, but every output differs from its first token: nothing in common either
    b0 = _rounds([(0, 0, 555, 3, 1, [101, 102]), (0, 1, 102, 3, 0, [103])])   # its first token is not A's
    d0 = aligned_diff(A, positions(A), b0, positions(b0), pair)
    assert d0.prompts[0].diverged_at == 0
    assert d0.not_comparable == "every paired prompt's output differs from its first token on (different text)"
    assert d0.delta["all"].delta is None and d0.delta["all"].rate_b == pytest.approx(1 / 6)
    # one prompt of two diverging at 0 leaves the other compared: the usual diff
    a2 = pd.concat([A, _rounds([(1, 0, 7, 2, 2, [8, 9, 10])])], ignore_index=True)
    b2 = pd.concat([b0, _rounds([(1, 0, 7, 2, 1, [8, 9])])], ignore_index=True)
    d2 = aligned_diff(a2, positions(a2), b2, positions(b2), pair_prompts({}, {}, [0, 1], [0, 1]))
    assert d2.not_comparable is None and d2.delta["all"].delta is not None


def test_pairing_by_id_and_unpaired() -> None:
    ma = {"prompts": [{"prompt_id": 0, "id": "q1", "text": "a"}, {"prompt_id": 1, "id": "q2", "text": "b"}]}
    mb = {"prompts": [{"prompt_id": 0, "id": "q2", "text": "zz"}, {"prompt_id": 1, "id": "q3", "text": "a"}]}
    p = pair_prompts(ma, mb)
    assert p.by == "id" and p.pairs == ((1, 0),) and p.unpaired_a == (0,) and p.unpaired_b == (1,)


def test_bootstrap_interval() -> None:
    # every prompt: A 5/10, B 8/10 -> every resample gives +0.3
    n = 6
    out = bootstrap_delta(np.full(n, 10), np.full(n, 5), np.full(n, 10), np.full(n, 8), n_boot=500)
    assert out["delta"] == pytest.approx(0.3)
    assert out["ci_low"] == pytest.approx(0.3) and out["ci_high"] == pytest.approx(0.3)
    # two prompts, opposite effects: the interval spans both single-prompt deltas' mixture
    out2 = bootstrap_delta(np.array([10, 10]), np.array([2, 8]), np.array([10, 10]), np.array([8, 2]), n_boot=4000)
    assert out2["delta"] == pytest.approx(0.0)
    assert out2["ci_low"] == pytest.approx(-0.6) and out2["ci_high"] == pytest.approx(0.6)
    assert bootstrap_delta(np.array([10, 10]), np.array([2, 8]), np.array([10, 10]), np.array([8, 2]),
                           n_boot=300, seed=7) == bootstrap_delta(np.array([10, 10]), np.array([2, 8]),
                                                                  np.array([10, 10]), np.array([8, 2]),
                                                                  n_boot=300, seed=7)


def test_drift_by_hand() -> None:
    hn = np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 3.0], [np.nan, 1.0]])
    ht = np.array([[1.0, 1.0], [2.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    d = drift(np.array([1, 1, 2, 2]), hn, ht, accepted=np.array([True, False, True, True]))
    # k1: cos 1/sqrt2 and 1, rel 1/sqrt2 and 0; k2: cos 1, rel 2; the NaN row is skipped
    assert d.n_steps == 3
    assert d.per_position[0].cos_mean == pytest.approx((2 ** -0.5 + 1) / 2)
    assert d.per_position[0].rel_err_mean == pytest.approx(2 ** -0.5 / 2)
    assert d.per_position[0].cos_mean_rejected == pytest.approx(1.0)
    assert d.per_position[1].to_dict() == {"k": 2, "n_steps": 1, "cos_mean": pytest.approx(1.0),
                                    "rel_err_mean": pytest.approx(2.0), "cos_mean_accepted": pytest.approx(1.0),
                                    "cos_mean_rejected": None, "separation": None}
    # accepted cosines 1/sqrt2 and 1 against the rejected 1: pairs (0.707 < 1) 0, (1 = 1) 1/2 -> 0.25
    assert d.separation == pytest.approx(0.25) and d.related is True
    with pytest.raises(TraceFormatError):
        drift(np.array([1]), np.zeros((1, 2)), np.zeros((1, 3)))


def test_drift_tells_whether_it_predicts_rejection() -> None:
    rng = np.random.default_rng(0)
    ht = rng.normal(size=(400, 8))
    noise = rng.normal(size=(400, 8))
    acc = np.arange(400) % 2 == 0
    # accepted drafts near the target's state, rejected ones far: cosines separate them
    hn = np.where(acc[:, None], ht + 0.3 * noise, ht + 3.0 * noise)
    d = drift(np.ones(400, int), hn, ht, accepted=acc)
    cos = (hn * ht).sum(1) / np.linalg.norm(hn, axis=1) / np.linalg.norm(ht, axis=1)
    pairs = (cos[acc][:, None] > cos[~acc][None, :]).mean() + 0.5 * (cos[acc][:, None] == cos[~acc][None, :]).mean()
    assert d.separation == pytest.approx(pairs) and d.separation > 0.9
    assert d.words.startswith("drift predicts rejection")
    q = d.by_quantile
    assert [x.n_steps for x in q] == [100] * 4 and q[0].acceptance_rate < q[-1].acceptance_rate
    # a drafter whose state has nothing to do with the target's: the view does not apply
    u = drift(np.ones(400, int), rng.normal(size=(400, 8)), ht, accepted=acc)
    assert u.related is False and "unrelated" in u.words
    # steps after a round's first rejection were never checked: left out of the split
    chk = np.ones(400, bool)
    chk[1::4] = False
    c = drift(np.ones(400, int), hn, ht, accepted=acc, checked=chk)
    assert sum(x.n_steps for x in c.by_quantile) == 300


def test_a_name_given_twice_pairs_in_order_and_unrelated_sets_stay_unpaired() -> None:
    """A prompt given twice (the demo's prompts 9 and 11) made pairing fall back to prompt_id, which paired 36 demo
    prompts with 2 unrelated ones; now the k-th prompt of a name pairs with the k-th of that name in the other trace,
    and sets that share no name pair nothing."""
    ma = {"prompts": [{"prompt_id": 0, "id": "x"}, {"prompt_id": 1, "id": "y"}, {"prompt_id": 2, "id": "x"}]}
    mb = {"prompts": [{"prompt_id": 5, "id": "x"}, {"prompt_id": 6, "id": "x"}, {"prompt_id": 7, "id": "y"}]}
    p = pair_prompts(ma, mb)
    assert p.by == "id" and p.pairs == ((0, 5), (1, 7), (2, 6)) and p.unpaired_a == () and p.unpaired_b == ()
    other = {"prompts": [{"prompt_id": 0, "id": "u"}, {"prompt_id": 1, "id": "v"}]}
    q = pair_prompts(ma, other)
    assert q.by == "id" and q.pairs == () and q.unpaired_a == (0, 1, 2) and q.unpaired_b == (0, 1)


def test_prompts_given_as_the_same_token_ids_pair_by_them() -> None:
    """A recording of another runtime made from a trace's own token ids under labels of its own (the MLX / HF
    comparisons): the ids do not match, the token ids do, so the prompts pair by them, in order; token ids that
    match nothing pair nothing."""
    ma = {"prompts": [{"prompt_id": 0, "id": "x", "tokens": [1, 2]}, {"prompt_id": 1, "id": "y", "tokens": [3]},
                      {"prompt_id": 2, "id": "x", "tokens": [4]}]}
    mb = {"prompts": [{"prompt_id": 0, "id": "p1", "tokens": [3]}, {"prompt_id": 1, "id": "p0", "tokens": [1, 2]}]}
    p = pair_prompts(ma, mb)
    assert p.by == "tokens" and p.pairs == ((0, 1), (1, 0)) and p.unpaired_a == (2,) and p.unpaired_b == ()
    other = {"prompts": [{"prompt_id": 0, "id": "p0", "tokens": [9]}]}
    q = pair_prompts(ma, other)
    assert q.pairs == () and q.by == "id" and q.unpaired_b == (0,)


def test_different_prompt_sets_are_not_paired_by_prompt_id() -> None:
    ma = {"prompts": [{"prompt_id": 0, "text": "a"}, {"prompt_id": 1, "text": "b"}]}
    mb = {"prompts": [{"prompt_id": 0, "text": "c"}, {"prompt_id": 1, "text": "d"}]}
    p = pair_prompts(ma, mb, [0, 1], [0, 1])
    assert p.by == "text" and p.pairs == () and p.unpaired_a == (0, 1) and p.unpaired_b == (0, 1)
    # without texts on one side, prompt_id pairing stays (imported traces)
    p2 = pair_prompts(ma, {"prompts": [{"prompt_id": 0, "text": None}]}, [0, 1], [0])
    assert p2.by == "prompt_id" and p2.pairs == ((0, 0),)
    # ... and says it may pair different prompts (compare's note, the app's warning); no caveat otherwise
    from mtpscope.traces.analysis.align import pairing_caveat

    assert pairing_caveat(p2) == ("neither id, text nor tokens names every prompt in both traces (an imported log "
                                  "names none): the prompts are paired by their numbers only, which may pair "
                                  "different prompts")
    assert pairing_caveat(p) is None and pairing_caveat(pair_prompts(ma, ma, [0, 1], [0, 1])) is None
