"""The reference drafter loaded from GGUFs: both dialects and the centroid sidecar give the same step,
quantized files (dequantized through gguf.quants) stay close, and the centroid head agrees with the
recorder's independent implementation (traces.run.centroid_head)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mtpscope.errors import LayoutError
from mtpscope.inspector.convert import convert, read_checkpoint, write_tiny_pair
from mtpscope.inspector.gguf_write import f32 as F32
from mtpscope.inspector.reference import DonorKV, ReferenceDrafter, StepOptions
from tests.builders import U32, UP, parts, write


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("ref")
    tdir, ddir = write_tiny_pair(d / "hf", seed=9, centroids=True)
    out = {"tdir": tdir, "ddir": ddir, "target": convert(tdir, d / "t.gguf").out,
           "fork": convert(ddir, d / "fork.gguf", dialect="fork").out,
           "upstream": convert(ddir, d / "up.gguf", dialect="upstream", centroids_out=d / "side.gguf").out,
           "side": d / "side.gguf", "q8": convert(ddir, d / "q8.gguf", outtype="q8_0").out,
           "f16": convert(ddir, d / "f16.gguf", outtype="f16").out}
    return out


def _kv(seed: int = 0, n: int = 20) -> dict[str, DonorKV]:
    rng = np.random.default_rng(seed)
    pos = np.arange(n)
    return {"sliding": DonorKV(rng.standard_normal((n, 1, 32), dtype=np.float32),
                               rng.standard_normal((n, 1, 32), dtype=np.float32), pos),
            "full": DonorKV(rng.standard_normal((n, 1, 64), dtype=np.float32),
                            rng.standard_normal((n, 1, 64), dtype=np.float32), pos)}


def test_hparams_from_both_dialects(files: dict[str, Path]) -> None:
    fork = ReferenceDrafter.from_gguf(files["fork"], files["target"])
    up = ReferenceDrafter.from_gguf(files["upstream"], files["target"])
    assert fork.hp.dialect == "fork" and up.hp.dialect == "upstream"
    for hp in (fork.hp, up.hp):
        assert (hp.n_embd, hp.n_embd_backbone, hp.n_vocab, hp.n_layer) == (48, 64, 4096, 4)
        assert hp.is_swa == (True, True, True, False) and hp.head_dim == (32, 32, 32, 64)
        assert hp.rope_base == (1e4, 1e4, 1e4, 1e6) and hp.sliding_window == 16
    assert fork.hp.n_centroids == 64 and fork.hp.centroid_top_k == 4
    assert up.hp.n_centroids is None and up.w.centroids is None


def test_dialects_and_sidecar_give_the_same_step(files: dict[str, Path]) -> None:
    kv = _kv()
    h = np.random.default_rng(1).standard_normal(64).astype(np.float32)
    fork = ReferenceDrafter.from_gguf(files["fork"], files["target"])
    up = ReferenceDrafter.from_gguf(files["upstream"], files["target"], centroids=files["side"])
    for head in ("dense", "centroid"):
        a = fork.step(5, h, 20, kv, StepOptions(head=head))
        b = up.step(5, h, 20, kv, StepOptions(head=head))
        assert np.array_equal(a.logits, b.logits) and np.array_equal(a.h_next, b.h_next)
    # the centroid head scores exactly top_k * vsc = 4 * 64 candidates, the dense head all 4096
    c = fork.step(5, h, 20, kv, StepOptions(head="centroid"))
    assert c.candidate_ids.shape == (4 * 64,) and np.count_nonzero(c.logits > -1e29) == 256
    dense = fork.step(5, h, 20, kv, StepOptions(head="dense"))
    assert np.array_equal(c.logits[c.candidate_ids], dense.logits[c.candidate_ids])


def test_gguf_weights_equal_checkpoint(files: dict[str, Path]) -> None:
    _, st = read_checkpoint(files["ddir"])
    r = ReferenceDrafter.from_gguf(files["upstream"], files["target"])
    assert np.array_equal(r.w.pre_projection, st["pre_projection.weight"])
    assert np.array_equal(r.w.layers[3].attn_q, st["model.layers.3.self_attn.q_proj.weight"])
    assert r.w.layers[2].layer_output_scale == float(st["model.layers.2.layer_scalar"][0])
    _, tst = read_checkpoint(files["tdir"])
    assert np.array_equal(r.embed_target(7), tst["model.embed_tokens.weight"][7] * np.float32(8.0))


@pytest.mark.parametrize("name,tol", [("f16", 5e-3), ("q8", 5e-2)])
def test_quantized_drafter_stays_close(files: dict[str, Path], name: str, tol: float) -> None:
    kv = _kv(2)
    h = np.random.default_rng(3).standard_normal(64).astype(np.float32)
    ref = ReferenceDrafter.from_gguf(files["upstream"], files["target"]).step(9, h, 20, kv)
    q = ReferenceDrafter.from_gguf(files[name], files["target"]).step(9, h, 20, kv)
    rel = np.linalg.norm(q.h_next - ref.h_next) / np.linalg.norm(ref.h_next)
    assert 0 < rel <= tol


def test_centroid_head_agrees_with_recorder_implementation(files: dict[str, Path]) -> None:
    from mtpscope.traces.run.centroid_head import centroid_step, load_centroid_head

    fork = ReferenceDrafter.from_gguf(files["fork"], files["target"])
    head = load_centroid_head(files["fork"])
    rng = np.random.default_rng(4)
    for i in range(10):
        r = fork.step(int(rng.integers(4096)), rng.standard_normal(64).astype(np.float32), 20, _kv(i),
                      StepOptions(head="centroid"))
        cs = centroid_step(head, r.h_inner, dense_logits=fork.w.token_embd @ r.h_inner)
        assert cs.centroid_token == r.token
        assert list(cs.centroid_ids) == r.centroid_ids.tolist()


def test_missing_tensor_is_a_layout_error(files: dict[str, Path]) -> None:
    with pytest.raises(LayoutError):
        ReferenceDrafter.from_gguf(files["side"], files["target"])  # a sidecar is no drafter


@pytest.mark.parametrize(("mutate", "key", "actual"), [
    # a number key verify reports: 0 was replaced by the default (eps 1e-6, RoPE base 1e6) and replayed silently
    (lambda kv, t: kv.__setitem__(f"{UP}.attention.layer_norm_rms_epsilon", F32(0.0)),
     f"{UP}.attention.layer_norm_rms_epsilon", 0.0),
    (lambda kv, t: kv.__setitem__(f"{UP}.rope.freq_base", F32(0.0)), f"{UP}.rope.freq_base", 0.0),
    # RoPE dims llama.cpp aborts on: more than the 64-dim full head was an internal error (numpy broadcast)
    (lambda kv, t: kv.__setitem__(f"{UP}.rope.dimension_count", U32(4096)), f"{UP}.rope.dimension_count", 4096),
    # rope_freqs of 0 and an integer weight: numpy's divide-by-zero / overflow warnings leaked, and NaN drafts
    (lambda kv, t: t.__setitem__("rope_freqs.weight", np.zeros(32, np.float32)), "rope_freqs.weight", None),
    (lambda kv, t: t.__setitem__("blk.0.ffn_gate.weight", np.ones((128, 128), np.int32)), "blk.0.ffn_gate.weight",
     "I32"),
])
def test_a_drafter_llama_cpp_cannot_run_by_is_refused_at_load(tmp_path: Path, mutate: Any, key: str,
                                                              actual: Any) -> None:
    """The reference drafter refuses, naming the key or tensor, what ``verify`` reports and llama.cpp does not run
    as the reference would compute it; absent keys still take llama.cpp's defaults."""
    import warnings

    arch, kv, t = parts("upstream")
    target = write(tmp_path / "t.gguf", *parts("target"))
    mutate(kv, t)
    bad = write(tmp_path / "d.gguf", arch, kv, t)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(LayoutError) as e:
            ReferenceDrafter.from_gguf(bad, target)
    assert e.value.key == key and (actual is None or e.value.actual == actual), e.value
    arch, kv, t = parts("upstream")
    for suffix in ("attention.layer_norm_rms_epsilon", "rope.freq_base"):
        kv.pop(f"{UP}.{suffix}")
    hp = ReferenceDrafter.from_gguf(write(tmp_path / "defaults.gguf", arch, kv, t), target).hp
    assert hp.eps == 1e-6 and hp.rope_base == (1e4, 1e4, 1e4, 1e6)
