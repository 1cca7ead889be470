"""The n_draft what-if: the position model's observations and forward pass on hand-computed cases, the costs
by hand, the trace reproducing itself, intervals, and estimates at other n_draft against an independent
simulation of the MTP loop (a different code path: rounds drafted and verified position by position)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mtpscope.errors import TraceFormatError
from mtpscope.traces.analysis import acceptance_model as AM
from mtpscope.traces.analysis.costs import (
    MIN_SIZE_ROUNDS,
    CostProbe,
    PlainBaseline,
    fit_cost,
    manifest_baseline,
    rounds_baseline,
)
from mtpscope.traces.analysis.what_if import what_if, what_if_trace


def _rounds(na, nd=None, td=10.0, tv=30.0, pid=None, emitted=None):
    n = len(na)
    nd = [2] * n if nd is None else nd
    pid = pid or [0] * n
    rnd, seen = [], {}
    for p in pid:
        rnd.append(seen.get(p, 0))
        seen[p] = seen.get(p, 0) + 1
    df = pd.DataFrame({"prompt_id": pid, "round": rnd, "n_draft": nd, "n_accepted": na,
                       "t_draft_ms": [td] * n if np.isscalar(td) else td,
                       "t_verify_ms": [tv] * n if np.isscalar(tv) else tv})
    if emitted is not None:
        df["emitted"] = emitted
    return df


def test_observations_by_hand() -> None:
    # prompt 0: r0 drafts 3, accepts 1 -> position 1 accepted at depth 1, position 2 the correction of the
    # draft rejected at depth 2; r1 accepts all 3 -> positions 3, 4, 5 at depths 1..3, position 6 the bonus;
    # r2 drafts 1, accepts 0 -> position 7 rejected at depth 1. prompt 1: one plain step -> position 1.
    r = _rounds([1, 3, 0, 0], nd=[3, 3, 1, 0], pid=[0, 0, 0, 1])
    o = AM.observations(r.iloc[::-1])            # row order does not matter
    assert o.ends.tolist() == [7, 1] and o.prompt_ids.tolist() == [0, 1] and o.max_depth == 3
    assert o.depth[0].tolist() == [1, 2, 1, 2, 3, 0, 1]
    assert o.accepted[0].tolist() == [True, False, True, True, True, False, False]
    assert o.depth[1, :1].tolist() == [0] and o.mask[1].tolist() == [True] + [False] * 6
    # an end-of-generation draft cuts the round: emitted holds the drafts up to it, no correction
    e = AM.observations(_rounds([2], nd=[3], emitted=[[5, 6]]))
    assert e.ends.tolist() == [2] and e.depth[0].tolist() == [1, 2] and e.accepted[0].tolist() == [True, True]


def test_forward_pass_by_hand() -> None:
    a = 0.7
    one = AM.Params(np.array([1.0]), np.array([[1.0]]), np.array([[a]]))
    # two positions, no cap: round 1 drafts position 1; accepted (a): position 2 is its bonus; rejected:
    # position 1 is the correction and round 2 drafts position 2 (accepted with a)
    p = AM.predict(one, 1, np.array([2]), max_tokens=100)
    assert p.rounds[0] == pytest.approx(2 - a) and p.drafted[0] == pytest.approx(2 - a)
    assert p.accepted[0] == pytest.approx(a + (1 - a) * a) and p.emitted[0] == 2
    # capped at 3 tokens: round 2 (2 tokens out) may draft min(1, 3 - 2 - 1) = 0 -> a plain step
    c = AM.predict(one, 1, np.array([2]), max_tokens=3)
    assert (c.drafted[0], c.rounds[0], c.accepted[0]) == pytest.approx((1.0, 1.0, a))
    assert c.plain[0] == pytest.approx(1 - a)
    # two persistent states (A = identity), half the prompts always right, half never; N = 2, 6 positions:
    # easy: rounds at pending 0 and 3 draft 2 each, 4 accepted; hard: a rejection at every position,
    # rounds at pending 0..5 draft 2 each (the second draft never checked): 12 drafted, 0 accepted
    two = AM.Params(np.array([0.5, 0.5]), np.eye(2), np.array([[1.0, 1.0], [0.0, 0.0]]))
    q = AM.predict(two, 2, np.array([6]), max_tokens=100)
    assert (q.rounds[0], q.drafted[0], q.accepted[0]) == pytest.approx((4.0, 8.0, 2.0))
    with pytest.raises(TraceFormatError):
        AM.predict(two, 3, np.array([6]))


def _simulate(texts: list[np.ndarray], n_draft: int, max_tokens: int) -> pd.DataFrame:
    """The MTP loop over fixed texts: ``a[g - 1, d - 1]`` says whether output position g is drafted
    right at depth d; a round drafts ``min(N, max_tokens - n_out - 1)``, stops at the first miss."""
    rows = []
    for pid, a in enumerate(texts):
        n_out, pos, rnd = 1, 0, 0
        while n_out < max_tokens and pos < len(a):
            k = min(n_draft, max_tokens - n_out - 1)
            na = 0
            while na < k and a[pos + na, na]:
                na += 1
            rows.append({"prompt_id": pid, "round": rnd, "n_draft": k, "n_accepted": na,
                         "t_draft_ms": 2.0 * k, "t_verify_ms": 10.0 + 2.0 * (k + 1)})
            n_out, pos, rnd = n_out + na + 1, pos + na + 1, rnd + 1
    return pd.DataFrame(rows)


def _texts(n: int, length: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    A = np.array([[0.9, 0.1], [0.2, 0.8]])
    p = np.array([[0.9, 0.8, 0.75, 0.7, 0.65, 0.6], [0.2, 0.1, 0.05, 0.05, 0.05, 0.05]])
    out = []
    for _ in range(n):
        s = np.empty(length, int)
        s[0] = rng.integers(2)
        for g in range(1, length):
            s[g] = rng.choice(2, p=A[s[g - 1]])
        out.append(rng.random((length, 6)) < p[s])
    return out


def test_other_n_draft_against_a_simulation() -> None:
    # texts from a known two-state process; recorded at n_draft 3, estimated at 1, 2, 4, 5; the simulated
    # recordings at those n_draft are the truth. Tolerance 0.02: the estimate of 300 prompts' parameters
    # (the bootstrap interval here is about +-0.02) and depths > 3 extrapolated as p[s, 3]
    texts = _texts(300, 63)
    rec = _simulate(texts, 3, 64)
    est = what_if(rec, max_tokens=64, n_max=5, n_boot=0)
    for n in (1, 2, 4, 5):
        real = _simulate(texts, n, 64)
        assert est.row(n).acceptance_rate == pytest.approx(real.n_accepted.sum() / real.n_draft.sum(), abs=0.02)
        tps = 1000 * (real.n_accepted + 1).sum() / (real.t_draft_ms + real.t_verify_ms).sum()
        assert est.row(n).tokens_per_s == pytest.approx(tps, rel=0.03)
    # the hidden states: the fitted chain is persistent and its states far apart
    p = np.asarray(est.model.params.p)
    assert p[0, 0] > 0.8 and p[1, 0] < 0.3


def test_the_trace_reproduces_itself(tmp_path) -> None:
    from mtpscope import traces
    from mtpscope.traces.synthetic import write_synthetic_trace

    d = write_synthetic_trace(tmp_path / "t", n_rounds=600, n_prompts=12, n_draft=3, steps=False)
    tr = traces.open(d)
    tab = pa.concat_tables([pq.read_table(d / "rounds" / f) for f in tr.manifest["parts"]["rounds"]])
    nd = np.asarray(tab["n_draft"])
    na = np.asarray(tab["n_accepted"])
    ne = np.asarray([len(x) for x in tab["emitted"].to_pylist()])
    t = np.asarray(tab["t_draft_ms"]) + np.asarray(tab["t_verify_ms"])
    cats = {p: ("a" if p % 3 else "b") for p in range(12)}
    est = what_if_trace(tr, categories=cats, n_boot=40)
    row = est.row(3)
    assert row.recorded and not row.extrapolated and est.recorded_n_draft == 3
    assert row.acceptance_rate == pytest.approx(na.sum() / nd.sum(), rel=1e-9)
    assert row.mean_acceptance_length == pytest.approx(1 + na.sum() / (nd > 0).sum(), rel=1e-9)
    # tokens/s at K: the trace's rounds at their robust prices, each round size at the median of its rounds
    # (issue 34: a few spikes cannot move it), emitted / sum of (median draft + median verify) per round
    td, tv = np.asarray(tab["t_draft_ms"]), np.asarray(tab["t_verify_ms"])
    sizes = np.unique(nd)
    assert all((nd == k).sum() >= 5 for k in sizes)       # every size priced at its own median
    price = {int(k): (np.median(td[nd == k]) if k else 0.0) + np.median(tv[nd == k]) for k in sizes}
    robust_t = np.array([price[int(k)] for k in nd])
    assert row.tokens_per_s == pytest.approx(1000 * ne.sum() / robust_t.sum(), rel=1e-9)
    assert abs(robust_t.sum() / t.sum() - 1) < 0.1      # quiet synthetic timings: close to the measured sum
    # each category reproduces its own rounds too, and their counts add up to the totals
    pid = np.asarray(tab["prompt_id"])
    for name in ("a", "b"):
        m = np.array([cats[int(p)] == name for p in pid])
        c = est.by_category[name].row(3)
        assert c.acceptance_rate == pytest.approx(na[m].sum() / nd[m].sum(), rel=1e-9)
        assert c.tokens_per_s == pytest.approx(1000 * ne[m].sum() / robust_t[m].sum(), rel=1e-9)
    # every value has an interval, around the estimate
    for x in est.rows:
        lo, hi = x.acceptance_rate_interval
        assert lo <= x.acceptance_rate + 1e-9 and x.acceptance_rate - 1e-9 <= hi
        assert x.tokens_per_s_interval is not None and x.speedup_interval is not None
    # the same seed, the same intervals; no resamples, no intervals
    again = what_if_trace(tr, categories=cats, n_boot=40)
    assert [x.tokens_per_s_interval for x in again.rows] == [x.tokens_per_s_interval for x in est.rows]
    assert what_if_trace(tr, n_boot=0).row(1).acceptance_rate_interval is None


def test_costs_by_hand() -> None:
    # every round five times (MIN_SIZE_ROUNDS): draft steps (5 + 5 + 15 + 15) ms over 1 + 1 + 3 + 3 drafts
    # = 5 ms; verify of 2 tokens: mean 22 ms (20, 24); of 4 tokens: 40 ms; a plain step (1 token): 9 ms
    assert MIN_SIZE_ROUNDS == 5
    r = _rounds([1, 0, 0, 3, 0] * 5, nd=[1, 1, 3, 3, 0] * 5, td=[5, 5, 15, 15, 0] * 5, tv=[20, 24, 40, 40, 9] * 5)
    c = fit_cost(r)
    assert c.t_step_ms == pytest.approx(5.0)
    assert c.verify_ms == {1: 9.0, 2: 22.0, 4: 40.0} and c.verify_rounds == {1: 5, 2: 10, 4: 10}
    assert c.draft_ms == {1: 5.0, 3: 15.0} and c.draft_rounds == {1: 10, 3: 10}
    assert c.t_verify(2) == 22.0 and c.t_draft(3) == 15.0 and c.baseline == "estimated" and c.t_plain_ms == 9.0
    # the verify line through (1, 9) w 5, (2, 22) w 10, (4, 40) w 10: weighted means x = 13/5, y = 133/5;
    # v1 = sum w (x - xm)(y - ym) / sum w (x - xm)^2
    x, y, w = np.array([1, 2, 4.]), np.array([9, 22, 40.]), np.array([1, 2, 2.])
    xm, ym = (w * x).sum() / 5, (w * y).sum() / 5
    v1 = (w * (x - xm) * (y - ym)).sum() / (w * (x - xm) ** 2).sum()
    assert c.v1_ms == pytest.approx(v1) and c.v0_ms == pytest.approx(ym - v1 * xm)
    assert c.t_verify(3) == pytest.approx(ym - v1 * xm + 3 * v1)
    # the draft line through (1, 5) and (3, 15): 5 ms per step, no intercept
    assert c.t_draft(2) == pytest.approx(10.0) and c.t_draft(0) == 0.0
    m = fit_cost(r, PlainBaseline(8.0, "manifest", "test"))
    assert m.baseline == "measured" and m.t_plain_ms == 8.0
    assert fit_cost(r.drop(columns=["t_verify_ms"])) is None
    # fewer than five rounds of a size: priced by the line, not by its mean
    few = fit_cost(_rounds([0] * 5 + [0], nd=[2] * 5 + [4], td=[10] * 5 + [30], tv=[30] * 5 + [90]))
    assert few.verify_ms[5] == 90.0 and few.t_verify(5) == pytest.approx(few.v0_ms + 5 * few.v1_ms)


def test_the_probe_covers_the_what_if_range() -> None:
    from mtpscope.traces.analysis.costs import N_MAX
    from mtpscope.traces.run.mtp_runtime import PROBE_N_MAX

    assert PROBE_N_MAX == N_MAX == 8


@pytest.mark.parametrize("probe", [
    CostProbe({1: 10.0, 2: 12.5}, {1: 3.0, 2: 6.5}, 3, {1: (9.0, 10.0, 11.0)}, {2: (6.0, 6.5, 7.0)}),
    CostProbe({1: 10.0, 2: 12.5}, {}, 0),                                  # an older probe: no draft_ms, no reps
    CostProbe({1: 10.0}, {}, 2, {1: (9.0, 11.0)}, {}),
    # a sweep cell's: merged from shards whose probes lack draft_ms (to_dict wrote "draft_ms": {}, which the check
    # then refused)
    CostProbe.merged([CostProbe({1: 4.0, 2: 5.0}, {}, 2), CostProbe({1: 6.0}, {}, 1)]),
    CostProbe.merged([CostProbe({1: 4.0}, {2: 8.0}, 2, {1: (3.0, 5.0)}, {2: (8.0,)}), CostProbe({1: 6.0}, {}, 1)]),
])
def test_a_probe_round_trips_through_its_manifest_entry(probe: CostProbe) -> None:
    """``from_manifest({"cost_probe": p.to_dict()}) == p`` for every probe mtpscope builds, and the entry holds no
    empty map (the check refuses one: an entry present must hold at least one size)."""
    d = probe.to_dict()
    assert CostProbe.from_manifest({"cost_probe": d}) == probe
    assert all(v != {} for v in d.values()), d
    assert ("draft_ms" in d) == bool(probe.draft_ms)
    # a written empty draft_ms is still malformed (the one check keeps its rule)
    with pytest.raises(TraceFormatError, match="'cost_probe.draft_ms'"):
        CostProbe.from_manifest({"cost_probe": {**d, "draft_ms": {}}})


@pytest.mark.parametrize("ms", [5e-7, 1e-6, 5e-5, 1.0, 2e7, 86_399_999.0, 86_400_000.0, 1e9, 1e308])
def test_a_probe_time_and_a_round_time_follow_one_rule(tmp_path, ms: float) -> None:
    """One plausible-time rule (a nanosecond to below a day, traces.store.schema): a probe of 2e7 ms (5.5 h) was
    malformed while a round of 2e7 ms was a measurement, and a probe of 5e-5 ms refused where a round passed."""
    from mtpscope.traces.store.checks import check_rounds

    plausible = 1e-6 <= ms < 86_400_000.0
    try:
        CostProbe.from_manifest({"cost_probe": {"verify_ms": {"1": ms}}})
        probe_ok = True
    except TraceFormatError:
        probe_ok = False
    try:
        check_rounds(pa.table({"t_verify_ms": pa.array([ms], pa.float64())}), tmp_path, {})
        round_ok = True
    except TraceFormatError:
        round_ok = False
    assert (probe_ok, round_ok) == (plausible, plausible)


def test_costs_from_the_probe_by_hand() -> None:
    # the probe gives the shape, the trace the level: verify scale = (5 * 9 + 10 * 22 + 10 * 40) /
    # (5 * 10 + 10 * 20 + 10 * 50) = 665 / 750; draft scale = (10 * 5 + 10 * 15) / (10 * 6 + 10 * 16) = 200 / 220
    r = _rounds([1, 0, 0, 3, 0] * 5, nd=[1, 1, 3, 3, 0] * 5, td=[5, 5, 15, 15, 0] * 5, tv=[20, 24, 40, 40, 9] * 5)
    probe = CostProbe.from_manifest({"cost_probe": {"verify_ms": {"1": 10, "2": 20, "3": 30, "4": 50, "5": 80},
                                                    "draft_ms": {"1": 6, "2": 11, "3": 16, "4": 21}, "reps": 3}})
    c = fit_cost(r, probe=probe)
    assert c.verify_scale == pytest.approx(665 / 750) and c.draft_scale == pytest.approx(200 / 220)
    assert c.t_verify(2) == 22.0 and c.t_draft(1) == 5.0                     # recorded: their means
    assert c.t_verify(3) == pytest.approx(30 * 665 / 750) and c.t_verify(5) == pytest.approx(80 * 665 / 750)
    assert c.t_draft(2) == pytest.approx(11 * 200 / 220) and c.t_draft(4) == pytest.approx(21 * 200 / 220)
    assert c.t_verify(6) == pytest.approx(c.v0_ms + 6 * c.v1_ms)          # beyond the probe: the line
    # a sweep cell's shards: per size the median of the probes that timed it
    m = CostProbe.merged([CostProbe({1: 1.0, 2: 4.0}, {1: 2.0}, 3), None, CostProbe({1: 3.0, 2: 6.0}, {1: 4.0, 2: 9.0}, 2),
                          CostProbe({1: 2.5}, {}, 1)])
    assert m.verify_ms == {1: 2.5, 2: 5.0} and m.draft_ms == {1: 3.0, 2: 9.0} and m.reps == 6
    assert CostProbe.merged([None]) is None
    # no probe: None; a malformed entry is refused naming its key (never dropped: the advice would flip)
    good = {"1": 10.0, "2": 12.0}
    assert CostProbe.from_manifest({}) is None and CostProbe.from_manifest({"cost_probe": None}) is None
    bads = [({"verify_ms": {"1": -1}}, "cost_probe.verify_ms.1", "-1"),
            ({"verify_ms": {"1": 10, "2": "x"}}, "cost_probe.verify_ms.2", "'x'"),
            ({"verify_ms": {"1": 10, "²": 5.0}}, "cost_probe.verify_ms.²", "'²'"),
            ({"verify_ms": {"①": 5.0}}, "cost_probe.verify_ms.①", "'①'"),
            ({"verify_ms": {"\u0665": 5.0}}, "cost_probe.verify_ms.\u0665", "'\u0665'"),
            ({"verify_ms": {"0": 5.0}}, "cost_probe.verify_ms.0", "'0'"),
            ({"verify_ms": {"1": 1e308}}, "cost_probe.verify_ms.1", "1e+308"),
            ({"verify_ms": {"1": 1e-300}}, "cost_probe.verify_ms.1", "1e-300"),
            ({"verify_ms": {"1": math.inf}}, "cost_probe.verify_ms.1", "inf"),
            ({"verify_ms": {"1": math.nan}}, "cost_probe.verify_ms.1", "nan"),
            ({"verify_ms": {"1": True}}, "cost_probe.verify_ms.1", "True"),
            ({"verify_ms": {}}, "cost_probe.verify_ms", "{}"),
            ({"verify_ms": [1, 2]}, "cost_probe.verify_ms", "[1, 2]"),
            ({"draft_ms": good}, "cost_probe.verify_ms", "missing"),
            ({"verify_ms": good, "draft_ms": {"1": -3.0}}, "cost_probe.draft_ms.1", "-3.0"),
            ({"verify_ms": good, "draft_ms": {"8": "33.0"}}, "cost_probe.draft_ms.8", "'33.0'"),
            ({"verify_ms": good, "draft_ms": "x"}, "cost_probe.draft_ms", "'x'"),
            ({"verify_ms": good, "reps": True}, "cost_probe.reps", "True"),
            ({"verify_ms": good, "verify_reps_ms": {"1": "x"}}, "cost_probe.verify_reps_ms.1", "'x'"),
            ({"verify_ms": good, "draft_reps_ms": {"1": [4.0, None]}}, "cost_probe.draft_reps_ms.1[1]", "None"),
            ("x", "cost_probe", "'x'")]
    for bad, key, got in bads:
        with pytest.raises(TraceFormatError) as e:
            CostProbe.from_manifest({"cost_probe": bad}, "t/manifest.json")
        assert e.value.one_line().startswith(f"t/manifest.json: '{key}': malformed cost probe entry (expected ")
        assert e.value.one_line().endswith(f", got {got})"), (bad, e.value.one_line())
    only_verify = CostProbe.from_manifest({"cost_probe": {"verify_ms": good, "reps": None}})
    assert only_verify.verify_ms == {1: 10.0, 2: 12.0} and only_verify.draft_ms == {} and only_verify.reps == 0
    # the what-if prices the sizes it did not record with it, and still reproduces the trace at its n_draft
    rng = np.random.default_rng(3)
    n = 400
    na = rng.integers(0, 4, n)
    rr = _rounds(na.tolist(), nd=[3] * n, td=rng.normal(30, 1, n).tolist(), tv=rng.normal(40, 1, n).tolist(),
                 pid=(np.arange(n) // 20).tolist())
    flat = what_if(rr, n_boot=0)
    jump = what_if(rr, n_boot=0, probe=CostProbe({1: 10, 2: 12, 3: 14, 4: 16, 5: 160}, {1: 10, 2: 20, 3: 30, 4: 40}, 3))
    # at K: every round of size 3 at the medians of its draft and verify times (the one pricing rule)
    t, ne = n * (np.median(rr["t_draft_ms"]) + np.median(rr["t_verify_ms"])), (na + 1).sum()
    for est in (flat, jump):
        assert est.row(3).tokens_per_s == pytest.approx(1000 * ne / t, rel=1e-9)
    assert jump.cost.t_verify(5) == pytest.approx(160 * 40 / 16, rel=0.05)
    assert jump.row(4).tokens_per_s < 0.5 * flat.row(4).tokens_per_s


def test_baselines() -> None:
    m = {"prompts": [{"prompt_id": 0}, {"prompt_id": 1}],
         "baseline": {"t_per_token_ms": 12.5, "per_prompt": [{"n_decodes": 10, "decode_ms": 100.0},
                                                             {"n_decodes": 30, "decode_ms": 400.0}]}}
    b = manifest_baseline(m)
    assert b.t_per_token_ms == 12.5 and b.source == "manifest" and b.per_prompt == {0: (10, 100.0), 1: (30, 400.0)}
    assert b.for_prompts([1]) == pytest.approx(400 / 30)
    assert manifest_baseline({"baseline": {"t_per_token_ms": math.nan}}) is None and manifest_baseline({}) is None
    # a plain-decoding trace: one token per round; ms per token = time / tokens, per prompt too
    base = _rounds([0, 0, 0], nd=[0, 0, 0], td=0.0, tv=[10, 20, 30], pid=[0, 0, 1], emitted=[[1], [2], [3]])
    rb = rounds_baseline(base, "test")
    assert rb.t_per_token_ms == pytest.approx(20.0) and rb.per_prompt == {0: (2, 30.0), 1: (1, 30.0)}


def test_errors() -> None:
    with pytest.raises(TraceFormatError):
        what_if(_rounds([0, 0], nd=[0, 0]))
    with pytest.raises(TraceFormatError):
        what_if(_rounds([1]).drop(columns=["round"]))
    with pytest.raises(TraceFormatError):
        what_if(_rounds([1]), n_max=0)
    # no timings: acceptance only
    est = what_if(_rounds([0, 1, 2, 2]).drop(columns=["t_draft_ms", "t_verify_ms"]), n_boot=0)
    assert est.cost is None and est.best_n_draft is None
    assert all(x.tokens_per_s is None and x.speedup is None for x in est.rows)


def test_long_outputs_continue_at_the_stationary_rate(monkeypatch) -> None:
    # the pass beyond PREDICT_EXACT positions (stationary counts + the cap's exact end correction) against
    # the exact pass over every position: ends 300 (capped at max_tokens 301) and 250 (not capped)
    two = AM.Params(np.array([0.3, 0.7]), np.array([[0.9, 0.1], [0.2, 0.8]]),
                    np.array([[0.9, 0.8, 0.7, 0.7], [0.2, 0.1, 0.05, 0.05]]))
    ends = np.array([300, 250, 40])
    exact = AM.predict_all(two, [1, 2, 4], ends, max_tokens=301)
    monkeypatch.setattr(AM, "PREDICT_EXACT", 80)
    approx = AM.predict_all(two, [1, 2, 4], ends, max_tokens=301)
    for n in (1, 2, 4):
        for f in ("accepted", "drafted", "rounds", "plain"):
            assert getattr(approx[n], f)[0] == pytest.approx(getattr(exact[n], f)[0], rel=1e-6, abs=1e-6), (n, f)


def test_small_categories_on_the_pooled_fit_keep_their_estimate_inside_the_interval() -> None:
    # 12 prompts in 6 categories of 2 (each under CATEGORY_MIN_ROUNDS drafting rounds: the pooled fit), very
    # different acceptance per category: every resample uses the pooled fit too, so each interval holds its
    # own estimate (refitting a category's own rounds would centre its interval on another model)
    rng = np.random.default_rng(5)
    na, pid = [], []
    for p in range(12):
        rate = [0.9, 0.2, 0.6, 0.4, 0.8, 0.1][p // 2]
        for _ in range(12):
            k = 0
            while k < 3 and rng.random() < rate:
                k += 1
            na.append(k)
            pid.append(p)
    r = _rounds(na, nd=[3] * len(na), td=rng.normal(30, 1, len(na)).tolist(), tv=rng.normal(40, 1, len(na)).tolist(),
                pid=pid)
    est = what_if(r, categories={p: "abcdef"[p // 2] for p in range(12)}, n_boot=200)
    for w in (est, *est.by_category.values()):
        for x in w.rows:
            for v, iv in ((x.acceptance_rate, x.acceptance_rate_interval), (x.tokens_per_s, x.tokens_per_s_interval)):
                assert iv[0] - 1e-9 <= v <= iv[1] + 1e-9, (x.n_draft, v, iv)


def test_one_bootstrap_unit_gives_no_interval() -> None:
    # one prompt of 10 rounds is one block of BLOCK_ROUNDS (16): every resample is the trace itself, so no
    # interval (a zero-width one would claim certainty); 40 rounds are 3 blocks, which resample
    rng = np.random.default_rng(3)
    na = rng.integers(0, 3, 40).tolist()
    short = what_if(_rounds(na[:10], td=rng.normal(10, 1, 10).tolist()), n_boot=50)
    assert all(x.acceptance_rate_interval is None and x.mean_acceptance_length_interval is None
               and x.tokens_per_s_interval is None and x.speedup_interval is None for x in short.rows)
    assert short.rows[1].acceptance_rate == pytest.approx(sum(na[:10]) / 20)     # the estimate itself stays
    long = what_if(_rounds(na, td=rng.normal(10, 1, 40).tolist()), n_boot=50)
    lo, hi = long.rows[1].acceptance_rate_interval
    assert lo < sum(na) / 80 < hi
    # categories: one with a single short prompt gets no interval, the whole trace (the other's 3 blocks) does
    pid = [0] * 10 + [1] * 40
    both = what_if(_rounds(na[:10] + na, pid=pid), categories={0: "a", 1: "b"}, n_boot=50)
    assert both.by_category["a"].rows[1].acceptance_rate_interval is None
    assert both.by_category["b"].rows[1].acceptance_rate_interval is not None
    assert both.rows[1].acceptance_rate_interval is not None
    # the words of each case (what the CLI's header and the app's caption say)
    assert short.interval_units == "none" and "no intervals" in short.interval_words()
    assert long.interval_units == "blocks" and "blocks of 16 rounds" in long.interval_words()
    assert both.interval_units == "blocks" and both.by_category["a"].interval_units == "none"
    many = what_if(_rounds(na, pid=[i % 8 for i in range(40)]), n_boot=50)
    assert many.interval_units == "prompts" and many.interval_words() == "95 % intervals over prompts"
    assert what_if(_rounds(na), n_boot=0).interval_units == "off"
