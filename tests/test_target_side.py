"""The target's probability of the drafted token and its entropy, against torch's softmax / Categorical
entropy (an independent implementation) on random logits of the real vocabulary size."""

from __future__ import annotations

import numpy as np
import pytest

from mtpscope.errors import TraceError
from mtpscope.traces.run.target_side import target_stats


def test_against_torch() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    # soft-capped like Gemma's output (30 * tanh(x / 30)), 262144 logits per row
    x = (30 * np.tanh(rng.normal(0, 6, size=(3, 262144)) / 30)).astype(np.float32)
    x[2, 7] = 40.0                      # a near-certain row: entropy close to 0
    tok = [5, int(np.argmax(x[1])), 7]
    p, h = target_stats(x, tok)
    t = torch.tensor(x, dtype=torch.float64)
    ref_p = torch.softmax(t, dim=1)[torch.arange(3), torch.tensor(tok)].numpy()
    ref_h = torch.distributions.Categorical(logits=t).entropy().numpy()
    # float32 exponentials, float64 sums: relative error ~ a few float32 ulps
    assert p == pytest.approx(ref_p, rel=1e-5)
    assert h == pytest.approx(ref_h, rel=1e-5, abs=1e-6)
    assert p[2] > 0.99 and h[2] < 0.1


def test_by_hand_and_errors() -> None:
    # two equal logits and one masked: p = 1/2 each, entropy log 2
    p, h = target_stats(np.array([0.0, 0.0, -np.inf], dtype=np.float32), [1])
    assert p[0] == pytest.approx(0.5) and h[0] == pytest.approx(np.log(2))
    p, h = target_stats(np.full((1, 4), np.nan, dtype=np.float32), [0])
    assert np.isnan(p[0]) and np.isnan(h[0])
    with pytest.raises(TraceError):
        target_stats(np.zeros((2, 4)), [0])
    with pytest.raises(TraceError):
        target_stats(np.zeros((1, 4)), [4])


def test_finish_target_side_uses_the_kept_logits() -> None:
    # the worker defers the target's side to the recorder: the same numbers from the kept verify rows
    from mtpscope.traces.run.mtp_runtime import RoundResult, finish_target_side

    x = np.array([[0.0, 0.0, 0.0, 0.0], [np.log(3.0), 0.0, -np.inf, 0.0]], dtype=np.float32)
    res = RoundResult(round=0, pos=5, pending_token=1, drafted=(2, 0), target=(2, 1, 3), n_accepted=1,
                      emitted=(2, 1), t_draft_ms=0.0, t_verify_ms=0.0, target_logits=(x[0], x[1]))
    out = finish_target_side(res)
    # by hand: row 0 uniform over 4 -> p 1/4, H log 4; row 1 weights 3:1:0:1 -> p(0) = 3/5,
    # H = -(3/5 log 3/5 + 2/5 log 1/5)
    assert out.target_p_drafted == pytest.approx((0.25, 0.6))
    assert out.target_entropy == pytest.approx((np.log(4), -(0.6 * np.log(0.6) + 0.4 * np.log(0.2))))
    assert out.target_logits == ()
    assert finish_target_side(out) is out
