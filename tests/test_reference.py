"""Unit tests of the numpy reference drafter's pieces against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mtpscope.inspector.reference import (
    DonorKV,
    DrafterHParams,
    DrafterWeights,
    LayerWeights,
    ReferenceDrafter,
    ReferenceDrafterError,
    StepOptions,
    attention,
    centroid_head,
    gelu_tanh,
    rms_norm,
    rope_neox,
    visible,
)


def test_rms_norm_hand_values():
    # [3, 4]: mean of squares 12.5, rms 3.5355339; weight [1, 2]
    y = rms_norm(np.array([3.0, 4.0], np.float32), np.array([1.0, 2.0], np.float32), eps=0.0)
    assert y == pytest.approx([3 / math.sqrt(12.5), 2 * 4 / math.sqrt(12.5)], rel=1e-6)
    # no "+1" on the weight: a zero weight gives zeros
    assert np.all(rms_norm(np.array([1.0, 2.0], np.float32), np.zeros(2, np.float32)) == 0)
    # weightless, per row over the last axis; eps enters under the root
    y = rms_norm(np.array([[1.0, 1.0], [2.0, 0.0]], np.float32), None, eps=1.0)
    assert y[0] == pytest.approx([1 / math.sqrt(2.0)] * 2, rel=1e-6)
    assert y[1] == pytest.approx([2 / math.sqrt(3.0), 0.0], rel=1e-6)


def test_gelu_tanh_hand_values():
    y = gelu_tanh(np.array([0.0, 1.0, -1.0, 3.0], np.float32))
    # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    want = [0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
            for x in (0.0, 1.0, -1.0, 3.0)]
    assert y == pytest.approx(want, abs=1e-7)
    assert want[1] == pytest.approx(0.8411920, abs=1e-7)  # the textbook value


def test_gelu_ggml_f16_table():
    y = gelu_tanh(np.array([1.0001, -11.0, 12.0, 10.0], np.float32), "ggml-f16")
    # 1.0001 rounds to F16 1.0; gelu(1) = 0.84119 rounds to the F16 grid (step 2^-11 in [0.5, 1))
    assert y[0] == pytest.approx(1723 * 2.0 ** -11, abs=0)
    assert y[1] == 0.0 and y[2] == 12.0 and y[3] == 10.0
    with pytest.raises(ReferenceDrafterError):
        gelu_tanh(np.zeros(1, np.float32), "erf")


def test_rope_neox_hand_values():
    x = np.zeros((1, 6), np.float32)
    x[0, 0] = 1.0
    # pos 0: identity
    assert np.array_equal(rope_neox(x, 0, 10000.0, 4), x)
    # pos 1, n_rot 4: pair 0 = dims (0, 2), angle 1 rad; pair 1 = dims (1, 3), angle 10000^-0.5
    y = rope_neox(x, 1, 10000.0, 4)
    assert y[0] == pytest.approx([math.cos(1), 0, math.sin(1), 0, 0, 0], abs=1e-7)
    x2 = np.array([[0, 1, 0, 0, 5, 6]], np.float32)
    y2 = rope_neox(x2, 1, 10000.0, 4)
    assert y2[0] == pytest.approx([0, math.cos(0.01), 0, math.sin(0.01), 5, 6], abs=1e-7)
    # pos 3 turns pair 1 by 0.03 rad; a (-sin, cos) check on the second half
    x3 = np.array([[0, 0, 0, 1, 0, 0]], np.float32)
    y3 = rope_neox(x3, 3, 10000.0, 4)
    assert y3[0] == pytest.approx([0, -math.sin(0.03), 0, math.cos(0.03), 0, 0], abs=1e-7)
    # proportional RoPE: a 1e30 freq factor freezes its pair
    y4 = rope_neox(x2, 7, 10000.0, 4, np.array([1.0, 1e30], np.float32))
    assert y4[0] == pytest.approx([0, 1, 0, 0, 5, 6], abs=1e-7)


def test_visible_mask_causal_and_window():
    pos = np.arange(10)
    assert visible(pos, 9, 4).tolist() == [False] * 6 + [True] * 4   # 9 - p0 < 4 -> p0 in 6..9
    assert visible(pos, 5, None).tolist() == [True] * 6 + [False] * 4
    assert visible(pos, 7, 1).tolist() == [p == 7 for p in range(10)]


def test_attention_hand_values():
    v = np.array([[[1.0, 2.0]], [[3.0, 4.0]]], np.float32)        # (n_kv 2, n_head_kv 1, d 2)
    k = np.array([[[0.0, 0.0]], [[math.log(3.0), 0.0]]], np.float32)
    q = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)             # 2 query heads share kv head 0
    out = attention(q, k, v, np.array([True, True]))
    # head 0: scores [0, ln 3] -> softmax [1/4, 3/4]; head 1: scores [0, 0] -> [1/2, 1/2]
    assert out[0] == pytest.approx([0.25 * 1 + 0.75 * 3, 0.25 * 2 + 0.75 * 4], rel=1e-6)
    assert out[1] == pytest.approx([2.0, 3.0], rel=1e-6)
    # one visible cell: the output is that cell's value, whatever q
    assert attention(q, k, v, np.array([False, True]))[0] == pytest.approx([3.0, 4.0])
    # GQA grouping: 4 query heads over 2 kv heads -> heads 0,1 read kv 0; heads 2,3 read kv 1
    k2 = np.zeros((1, 2, 2), np.float32)
    v2 = np.array([[[1.0, 1.0], [7.0, 9.0]]], np.float32)
    out2 = attention(np.ones((4, 2), np.float32), k2, v2, np.array([True]))
    assert out2.tolist() == [[1, 1], [1, 1], [7, 9], [7, 9]]
    # scale multiplies the scores: scale 0 -> plain mean
    assert attention(q, k, v, np.array([True, True]), scale=0.0)[0] == pytest.approx([2.0, 3.0])


def test_centroid_head_hand_values():
    n_vocab = 8                                             # 4 centroids, vsc = 2
    ordering = np.array([7, 0, 6, 1, 5, 2, 4, 3])           # rows: [7,0] [6,1] [5,2] [4,3]
    cen = np.array([[1, 0], [0, 1], [-1, 0], [2, 2]], np.float32)
    h = np.array([1.0, 0.5], np.float32)                    # centroid scores [1, 0.5, -1, 3]
    emb = np.arange(16, dtype=np.float32).reshape(8, 2)     # token t -> [2t, 2t+1]
    logits, top, clog, ids = centroid_head(h, cen, ordering, lambda i: emb[i], n_vocab, 2, "-1e30")
    assert top.tolist() == [3, 0] and clog.tolist() == [3.0, 1.0]
    assert ids.tolist() == [4, 3, 7, 0]
    # logit(t) = 2t + 0.5 (2t + 1)
    for t in (4, 3, 7, 0):
        assert logits[t] == pytest.approx(2 * t + 0.5 * (2 * t + 1))
    for t in (1, 2, 5, 6):
        assert logits[t] == np.float32(-1e30)
    logits2, *_ = centroid_head(h, cen, ordering, lambda i: emb[i], n_vocab, 2, "min-1")
    assert logits2[1] == pytest.approx(0.5 - 1.0)           # min(selected) is token 0's 0.5
    assert int(np.argmax(logits2)) == 7
    with pytest.raises(ReferenceDrafterError):
        centroid_head(h, cen[:3], ordering, lambda i: emb[i], n_vocab, 2)


def _tiny(ffn_gate_zero: bool = True, swa: bool = False):
    """A 1-layer drafter (n_embd 2, n_bb 2, one head of dim 2) whose step is computable by hand."""
    hp = DrafterHParams(arch="test", dialect="arrays", n_embd=2, n_embd_backbone=2, n_vocab=3, n_layer=1,
                        n_head=(1,), n_head_kv=(1,), n_ff=(2,), is_swa=(swa,), head_dim=(2,), n_rot=(2,),
                        rope_base=(10000.0,), sliding_window=2, eps=1e-12)
    eye = np.eye(2, dtype=np.float32)
    layer = LayerWeights(
        attn_norm=np.ones(2, np.float32), attn_q=eye, attn_q_norm=np.ones(2, np.float32),
        attn_output=np.array([[2, 0], [0, 1]], np.float32), post_attention_norm=np.ones(2, np.float32),
        ffn_norm=np.ones(2, np.float32),
        ffn_gate=np.zeros((2, 2), np.float32) if ffn_gate_zero else eye, ffn_up=eye, ffn_down=eye,
        post_ffw_norm=np.ones(2, np.float32), layer_output_scale=0.5)
    w = DrafterWeights(
        pre_projection=np.array([[1, 0, 0, 1], [0, 1, 1, 0]], np.float32),  # x = [e0 + h1, e1 + h0]
        post_projection=np.array([[1, 1], [1, -1]], np.float32),
        token_embd=np.array([[1, 0], [0, 1], [1, 1]], np.float32),
        output_norm=np.array([1.0, 3.0], np.float32), layers=(layer,), rope_freqs=None)
    target_embd = np.array([[0, 0], [1, 0], [0, 2]], np.float32)
    return ReferenceDrafter(hp, w, target_embd)


def test_step_hand_computed():
    d = _tiny()
    kv = {"full": DonorKV(k=np.zeros((1, 1, 2), np.float32), v=np.array([[[3.0, 4.0]]], np.float32),
                          pos=np.array([0]))}
    r = d.step(1, np.array([0.5, -1.0], np.float32), 1, kv)
    # e = [1, 0] * sqrt(2); x = [e0 + h1, e1 + h0] = [sqrt2 - 1, 0.5]
    x = np.array([math.sqrt(2) - 1, 0.5])
    # one visible cell -> attention output = v = [3, 4]; attn_output -> [6, 4]; rms -> [6,4]/sqrt(26)
    a = np.array([6, 4]) / math.sqrt(26) + x
    # gate 0 -> gelu 0 -> ffn out 0 -> rms_norm(0) = 0 (eps 1e-12 > 0)
    y = a * 0.5
    hi = y / math.sqrt(np.mean(y ** 2)) * np.array([1.0, 3.0])
    assert r.h_inner == pytest.approx(hi, rel=1e-5)
    assert r.h_next == pytest.approx([hi[0] + hi[1], hi[0] - hi[1]], rel=1e-5)
    assert r.logits == pytest.approx([hi[0], hi[1], hi[0] + hi[1]], rel=1e-5)
    assert r.token == 2
    assert r.centroid_ids is None


def test_step_ffn_branch_by_hand():
    d = _tiny(ffn_gate_zero=False)
    kv = {"full": DonorKV(k=np.zeros((1, 1, 2), np.float32), v=np.array([[[3.0, 4.0]]], np.float32),
                          pos=np.array([0]))}
    r = d.step(2, np.zeros(2, np.float32), 0, kv)
    # e = [0, 2 sqrt2]; x = [0, 2 sqrt2]; a = [6, 4]/sqrt26 + x
    a = np.array([6, 4]) / math.sqrt(26) + np.array([0, 2 * math.sqrt(2)])
    n = a / math.sqrt(np.mean(a ** 2))
    g = np.array([0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))) for v in n]) * n
    f = g / math.sqrt(np.mean(g ** 2))
    y = (f + a) * 0.5
    hi = y / math.sqrt(np.mean(y ** 2)) * np.array([1.0, 3.0])
    assert r.h_inner == pytest.approx(hi, rel=1e-5)


def test_step_options_position_and_window():
    d = _tiny(swa=True)   # sliding layer, window 2
    v = np.array([[[1.0, 0.0]], [[0.0, 1.0]], [[5.0, 5.0]]], np.float32)
    kv = {"sliding": DonorKV(k=np.zeros((3, 1, 2), np.float32), v=v, pos=np.array([0, 1, 2]))}
    tr_p, tr_m = {}, {}
    d.step(1, np.zeros(2, np.float32), 2, kv, trace=tr_p)
    d.step(1, np.zeros(2, np.float32), 2, kv, StepOptions(position="p-1"), trace=tr_m)
    # q at 2, window 2: cells 1, 2 -> mean of their v (all scores 0) = [2.5, 3]
    assert tr_p["kqv_out-0"][0] == pytest.approx([2.5, 3.0])
    # q at 1: cells 0, 1 -> [0.5, 0.5]
    assert tr_m["kqv_out-0"][0] == pytest.approx([0.5, 0.5])
    with pytest.raises(ReferenceDrafterError):
        d.step(1, np.zeros(2, np.float32), 2, kv, StepOptions(hidden="prenorm"))
    with pytest.raises(ReferenceDrafterError):
        d.step(1, np.zeros(2, np.float32), 2, {"full": kv["sliding"]})
    with pytest.raises(ReferenceDrafterError):
        d.step(1, np.zeros(3, np.float32), 2, kv)
    with pytest.raises(ReferenceDrafterError):
        d.step(1, np.zeros(2, np.float32), 2, kv, StepOptions(head="centroid"))


def test_step_options_parsing():
    o = StepOptions()
    assert o.with_variant("position=p-1").position == "p-1"
    assert o.with_variant("top_k=4").top_k == 4
    assert o.with_variant("kv_f16=on").kv_f16 is True
    with pytest.raises(ReferenceDrafterError):
        o.with_variant("position=p+1")
    with pytest.raises(ReferenceDrafterError, match="malformed variant"):
        o.with_variant("nonsense")
    with pytest.raises(ReferenceDrafterError, match="unknown variant name 'bogus'"):
        o.with_variant("bogus=1")
    # booleans: the words for true and false, anything else refused (was: quietly false)
    assert o.with_variant("kv_f16=off").kv_f16 is False and o.with_variant("act_quant=No").act_quant is False
    for bad in ("kv_f16=maybe", "act_quant=banana", "kv_f16="):
        with pytest.raises(ReferenceDrafterError, match="is not a boolean"):
            o.with_variant(bad)
    # one variant naming an option twice is refused, whatever the values
    from mtpscope.traces.run.replay import parse_variant

    with pytest.raises(ReferenceDrafterError, match="variant sets head twice"):
        parse_variant("head=centroid,head=dense", o)
    assert parse_variant("head=centroid,top_k=8", o) == o.with_variant("head=centroid").with_variant("top_k=8")


def test_step_batch_equals_step():
    rng = np.random.default_rng(0)
    hp = DrafterHParams(arch="test", dialect="arrays", n_embd=16, n_embd_backbone=8, n_vocab=64, n_layer=2,
                        n_head=(4, 4), n_head_kv=(2, 1), n_ff=(24, 24), is_swa=(True, False), head_dim=(4, 8),
                        n_rot=(4, 8), rope_base=(1e4, 1e6), sliding_window=3)

    def m(o, i):
        return rng.standard_normal((o, i)).astype(np.float32) / np.float32(np.sqrt(i))

    layers = tuple(LayerWeights(attn_norm=1 + 0.1 * rng.standard_normal(16).astype(np.float32), attn_q=m(4 * hd, 16),
                                attn_q_norm=np.ones(hd, np.float32), attn_output=m(16, 4 * hd),
                                post_attention_norm=np.ones(16, np.float32), ffn_norm=np.ones(16, np.float32),
                                ffn_gate=m(24, 16), ffn_up=m(24, 16), ffn_down=m(16, 24),
                                post_ffw_norm=np.ones(16, np.float32), layer_output_scale=0.7) for hd in (4, 8))
    w = DrafterWeights(pre_projection=m(16, 16), post_projection=m(8, 16),
                       token_embd=rng.standard_normal((64, 16)).astype(np.float32),
                       output_norm=np.ones(16, np.float32), layers=layers,
                       rope_freqs=np.array([1, 1, 1e30, 1e30], np.float32),
                       centroids=rng.standard_normal((8, 16)).astype(np.float32),
                       token_ordering=rng.permutation(64))
    d = ReferenceDrafter(hp, w, rng.standard_normal((64, 8)).astype(np.float32))
    n = 12
    kv = {"sliding": DonorKV(rng.standard_normal((n, 2, 4)).astype(np.float32),
                             rng.standard_normal((n, 2, 4)).astype(np.float32), np.arange(n)),
          "full": DonorKV(rng.standard_normal((n, 1, 8)).astype(np.float32),
                          rng.standard_normal((n, 1, 8)).astype(np.float32), np.arange(n))}
    toks, pos = np.array([3, 9, 17, 40, 2]), np.array([4, 7, 7, 11, 12])
    hs = rng.standard_normal((5, 8)).astype(np.float32)
    for o in (StepOptions(), StepOptions(position="p-1", kv_f16=True, gelu="ggml-f16"),
              StepOptions(head="centroid", fill="min-1", top_k=2)):
        batch = d.step_batch(toks, hs, pos, kv, o, kv_limit=pos)
        for r in range(5):
            one = d.step(int(toks[r]), hs[r], int(pos[r]), {k: v.upto(int(pos[r])) for k, v in kv.items()}, o)
            assert batch[r].token == one.token
            assert np.allclose(batch[r].logits, one.logits, rtol=1e-5, atol=1e-5)
            assert np.allclose(batch[r].h_next, one.h_next, rtol=1e-5, atol=1e-5)
