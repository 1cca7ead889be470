"""Parity of the numpy reference drafter with llama.cpp (llama-cpp-python 0.3.36, CPU, flash attention off).

A live greedy MTP loop runs in llama.cpp; the target's donor K/V come from one llama.cpp prefill over
the accepted tokens (captured with cb_eval); our step runs on the same (token, h, position, K/V) and
must give llama.cpp's h_next within the F16-emulation error model of ``tests/numerics.py`` (lower
quartile of the step errors at F32 level, none above one F16 ulp) and the same argmax on every step.

llama.cpp's CPU numerics that the reference emulates for this comparison (``StepOptions``): the KV
cache is F16 (so K, V, and the query / probabilities in the F16 matmuls are rounded) and GELU comes
from an F16 table (``kv_f16=True, gelu="ggml-f16"``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from mtpscope.inspector.reference import ReferenceDrafter, StepOptions
from mtpscope.traces.run.live_run import live_mtp_run
from mtpscope.traces.run.target_prefill import prefill, shape_kv
from tests.numerics import CHAIN_MAX, U32, check_emulated_chain

pytestmark = pytest.mark.llama

LLAMA_CPU = StepOptions(kv_f16=True, gelu="ggml-f16")


def _compare(ref: ReferenceDrafter, pre, run, opts: StepOptions) -> tuple[float, int, list[float]]:
    worst, agree, rels = 0.0, 0, []
    for s in run.steps:
        # the first hidden of each round is the target's post-norm row at p-1: the prefill must agree
        # (equal up to F32 order and F16 flips in the target's cache: the live run decoded other batches)
        if s.k == 1:
            want = pre.h_post[s.pos - 1]
            assert np.linalg.norm(want - s.h) <= CHAIN_MAX * np.linalg.norm(want)
        r = ref.step(s.token, s.h, s.pos, pre.kv_before(s.pos), opts)
        rel = float(np.linalg.norm(r.h_next - s.h_next) / np.linalg.norm(s.h_next))
        rels.append(rel)
        worst = max(worst, rel)
        agree += int(r.token == s.draft)
    return worst, agree, rels


@pytest.fixture(scope="module")
def demo_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[int]]:
    from mtpscope.demo import build as demo
    from mtpscope.demo.vocab import load_vocab

    voc = load_vocab("subset")
    d = tmp_path_factory.mktemp("demo")
    t = demo.write_target(d / "target.gguf", vocab=voc)
    dr = demo.write_drafter(d / "drafter-upstream-noisy.gguf", vocab=voc, noise=1.0)
    return t, dr, demo.passage_tokens(voc)[:8]


def test_demo_pair_parity(demo_pair: tuple[Path, Path, list[int]]) -> None:
    target, drafter, prompt = demo_pair
    run = live_mtp_run(target, drafter, prompt, n_rounds=12, n_draft=3)
    assert len(run.steps) == 36
    ref = ReferenceDrafter.from_gguf(drafter, target)
    pre = shape_kv(prefill(target, run.tokens), ref)
    worst, agree, rels = _compare(ref, pre, run, LLAMA_CPU)
    assert agree == len(run.steps)
    check_emulated_chain(rels, "demo pair h_next")


@pytest.fixture(scope="module", params=[False, True], ids=["k_ne_v", "k_eq_v"])
def converted_pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    from mtpscope.inspector.convert import convert, write_tiny_pair

    d = tmp_path_factory.mktemp("conv")
    tdir, ddir = write_tiny_pair(d / "hf", seed=11, k_eq_v=request.param, centroids=True)
    t = convert(tdir, d / "t.gguf").out
    dr = convert(ddir, d / "d.gguf", dialect="upstream").out
    return t, dr


def test_converted_hf_pair_parity(converted_pair: tuple[Path, Path]) -> None:
    target, drafter = converted_pair
    # random drafter (attention, FFN and projections all non-trivial); sliding window 16 < context
    run = live_mtp_run(target, drafter, [2, 100, 200, 300, 400, 500, 17, 33], n_rounds=10, n_draft=3)
    assert max(s.pos for s in run.steps) > 16
    ref = ReferenceDrafter.from_gguf(drafter, target)
    pre = shape_kv(prefill(target, run.tokens), ref)
    worst, agree, rels = _compare(ref, pre, run, LLAMA_CPU)
    assert agree == len(run.steps)
    check_emulated_chain(rels, "converted pair h_next")
    # the comparison is sensitive to F16 emulation: exact GELU (no F16 table) breaks it
    _, _, rels_tanh = _compare(ref, pre, run, StepOptions(kv_f16=True, gelu="tanh"))
    with pytest.raises(AssertionError, match="not emulated"):
        check_emulated_chain(rels_tanh, "exact GELU")
    # the comparison is sensitive: the position convention of MLX (p-1) is far off on these weights
    worst_p1, _, _ = _compare(ref, pre, run, StepOptions(kv_f16=True, gelu="ggml-f16", position="p-1"))
    assert worst_p1 > 1e-2


def test_prefill_prenorm_hidden_is_before_the_final_norm(converted_pair: tuple[Path, Path]) -> None:
    """``h_pre`` (node ``l_out`` of the last layer) normed with the target's ``output_norm`` gives ``h_post``."""
    from mtpscope.inspector.gguf import open_gguf
    from mtpscope.inspector.reference import rms_norm

    target, drafter = converted_pair
    pre = prefill(target, [2, 100, 200, 300, 400, 500, 17, 33, 9, 10])
    f = open_gguf(target)
    w = np.asarray(f.tensor_data("output_norm.weight"), np.float32)
    eps = float(f.get("gemma4.attention.layer_norm_rms_epsilon"))
    # ggml's rms_norm: sum of squares in double, then float scale and weight products (no sums), so
    # each element is within a few F32 roundings of numpy's; 16 U32 leaves room for sqrtf / division
    np.testing.assert_allclose(rms_norm(pre.h_pre, w, eps), pre.h_post, rtol=16 * U32, atol=0)
    assert not np.allclose(pre.h_pre, pre.h_post, rtol=1e-2)
    assert pre.donor_layers == {"sliding": 4, "full": 5}
    assert pre.kv["sliding"].k.shape[0] == 10 and pre.argmax.shape == (10,)
