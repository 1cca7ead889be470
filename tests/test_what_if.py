"""The n_draft what-if estimate on hand-computed rounds (arithmetic in the comments)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from mtpscope.errors import TraceFormatError
from mtpscope.traces.analysis import metrics as M
from mtpscope.traces.analysis.what_if import baseline_ms, fit_cost, start_types, survival, what_if, what_if_by_category


def _rounds(na, nd=None, td=10.0, tv=30.0, pid=None):
    n = len(na)
    nd = [2] * n if nd is None else nd
    return pd.DataFrame({"prompt_id": pid or [0] * n, "round": list(range(n)), "n_draft": nd, "n_accepted": na,
                         "t_draft_ms": [td] * n if np.isscalar(td) else td,
                         "t_verify_ms": [tv] * n if np.isscalar(tv) else tv})


def test_survival_and_tail() -> None:
    q, b, K = survival(_rounds([0, 1, 2, 2]), n_max=4)
    # q1 = 3/4, q2 = 2/4; c1 = 3/4, c2 = (1/2)/(3/4) = 2/3; b = c2 / c1 = 8/9 (two points, equal weights)
    assert K == 2
    assert b == pytest.approx(8 / 9)
    c3 = (2 / 3) * (8 / 9)
    c4 = (2 / 3) * (8 / 9) ** 2
    assert list(q) == pytest.approx([0.75, 0.5, 0.5 * c3, 0.5 * c3 * c4])
    # K = 1: no decay can be fitted, the conditional stays flat
    q1, b1, _ = survival(_rounds([0, 1, 1, 1], nd=[1] * 4), n_max=3)
    assert b1 == 1.0 and list(q1) == pytest.approx([0.75, 0.75 ** 2, 0.75 ** 3])
    with pytest.raises(TraceFormatError):
        survival(_rounds([0, 0], nd=[0, 0]))


def test_reproduces_the_recorded_acceptance() -> None:
    # capped rounds (n_draft < K) included: rate and mean acceptance length equal the trace's at N = K
    r = _rounds([0, 1, 3, 3, 2, 1, 0], nd=[3, 3, 3, 3, 3, 1, 2])
    est = what_if(r)
    row = est.rows[2]
    assert row.recorded and not row.extrapolated and est.recorded_n_draft == 3
    tot = M.totals(r)
    assert row.acceptance_rate == pytest.approx(tot["acceptance_rate"], abs=1e-12)
    assert row.mean_acceptance_length == pytest.approx(tot["mean_acceptance_length"], abs=1e-12)
    assert [x.extrapolated for x in est.rows] == [False, False, False, True, True, True, True, True]


def test_start_types() -> None:
    r = _rounds([0, 1, 2, 2, 1], pid=[0, 0, 0, 0, 1])
    # B: a prompt's first round or after a fully accepted round; M: after a mismatch
    assert start_types(r).tolist() == [True, False, False, True, True]
    assert start_types(r.iloc[::-1]).tolist() == [True, True, False, False, True]   # row order kept


def test_other_n_draft_by_hand() -> None:
    r = _rounds([0, 1, 2, 2])
    est = what_if(r)
    # start types B M M B: B rounds accepted 0 and 2 -> q^B = (1/2, 1/2); M rounds 1 and 2 -> q^M = (1, 1/2)
    assert est.q_b == pytest.approx((0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5))
    assert est.q_m[:2] == pytest.approx((1.0, 0.5)) and est.share_b == 0.5
    # pi_B(N) = q^M_N / (1 - q^B_N + q^M_N): pi_B(2) = 0.5 (= the trace's share: no shift), pi_B(1) = 2/3
    # N = 1: per round 2/3 * 1/2 + 1/3 * 1 = 2/3 accepted of 1 drafted
    assert est.rows[0].acceptance_rate == pytest.approx(2 / 3)
    assert est.rows[0].mean_acceptance_length == pytest.approx(1 + 2 / 3)
    # N = 3: B: c = (1/2, 1) -> b = 1, q^B_3 = 1/2; M: c = (1, 1/2) -> b = 1/2, c3 = 1/4, q^M_3 = 1/8;
    # pi_B(3) = (1/8) / (1 - 1/2 + 1/8) = 1/5; per round 1/5 * 3/2 + 4/5 * 13/8 = 1.6 accepted of 3
    assert est.q_m[2] == pytest.approx(0.125)
    assert est.rows[2].acceptance_rate == pytest.approx(1.6 / 3)
    # speed: t_step = 40 ms / 8 drafts = 5 ms; one verify size (3 tokens, 30 ms): flat verify cost
    assert est.cost.t_step_ms == pytest.approx(5.0)
    assert est.cost.v1_ms == 0.0 and est.cost.v0_ms == pytest.approx(30.0)
    assert est.cost.baseline == "estimated" and est.cost.t_plain_ms == pytest.approx(30.0)
    # N = 2: 1000 * (4 rounds + 5 accepted) / (4 * (2 * 5 + 30)) = 56.25 tokens/s
    assert est.rows[1].tokens_per_s == pytest.approx(56.25)
    # N = 1: 1000 * (4 + 8/3) / (4 * (5 + 30))
    assert est.rows[0].tokens_per_s == pytest.approx(1000 * (4 + 8 / 3) / 140)
    assert est.best_n_draft == max(est.rows, key=lambda x: x.tokens_per_s).n_draft


def test_measured_baseline_gives_the_verify_slope() -> None:
    r = _rounds([0, 1, 2, 2])
    est = what_if(r, t_plain_ms=20.0)
    # points (3 tokens, 30 ms) and (1 token, 20 ms), equal weights: v1 = 5, v0 = 15
    assert est.cost.v1_ms == pytest.approx(5.0) and est.cost.v0_ms == pytest.approx(15.0)
    assert est.cost.baseline == "measured"
    # N = 2: t_round = 2 * 5 + 15 + 5 * 3 = 40; 56.25 tokens/s; speedup = 56.25 * 20 / 1000
    assert est.rows[1].tokens_per_s == pytest.approx(56.25)
    assert est.rows[1].speedup == pytest.approx(1.125)
    # N = 1: t_round = 5 + 15 + 10 = 30 -> 1000 * (4 + 8/3) / 120
    assert est.rows[0].tokens_per_s == pytest.approx(1000 * (4 + 8 / 3) / 120)


def test_verify_sizes_fit_a_line() -> None:
    # verify sizes 2 and 4 tokens at 20 and 40 ms (medians; one outlier ignored by the median)
    r = _rounds([1, 1, 1, 0, 0, 0, 0], nd=[1, 1, 1, 3, 3, 3, 3], tv=[20, 20, 500, 40, 40, 40, 41],
                td=[5, 5, 5, 15, 15, 15, 15])
    c = fit_cost(r)
    assert c.verify_sizes == {2: 20.0, 4: 40.0}
    assert c.v1_ms == pytest.approx(10.0) and c.v0_ms == pytest.approx(0.0, abs=1e-9)
    assert fit_cost(r.drop(columns=["t_verify_ms"])) is None


def test_no_timings_no_speed() -> None:
    r = _rounds([0, 1, 2, 2]).drop(columns=["t_draft_ms", "t_verify_ms"])
    est = what_if(r)
    assert est.cost is None and est.best_n_draft is None
    assert all(x.tokens_per_s is None and x.speedup is None for x in est.rows)
    assert est.rows[0].acceptance_rate == pytest.approx(2 / 3)     # as in test_other_n_draft_by_hand


def test_by_category_and_baseline_key() -> None:
    r = _rounds([2, 2, 0, 0], pid=[0, 0, 1, 1])
    w = what_if_by_category(r, {0: "code"})
    assert set(w) == {"code", "(none)"}
    assert w["code"].rows[1].acceptance_rate == pytest.approx(1.0)
    assert w["(none)"].rows[1].acceptance_rate == pytest.approx(0.0)
    assert baseline_ms({"baseline": {"t_per_token_ms": 12.5}}) == 12.5
    assert baseline_ms({"baseline": {"t_per_token_ms": math.nan}}) is None
    assert baseline_ms({}) is None


def test_negative_intercept_refits_through_the_origin() -> None:
    # verify medians 10 ms at 2 tokens and 40 ms at 4: the free line is -20 + 15 n; through the origin,
    # with weights 1 and 1: v1 = (2*10 + 4*40) / (2*2 + 4*4) = 180 / 20 = 9
    r = _rounds([1, 0], nd=[1, 3], tv=[10, 40], td=[5, 15])
    c = fit_cost(r)
    assert c.v0_ms == 0.0 and c.v1_ms == pytest.approx(9.0) and c.t_plain_ms == pytest.approx(9.0)
    assert "origin" in c.basis
