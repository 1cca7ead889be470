"""The demo pair without the runtime: files read back with gguf-py's GGUFReader (not our code), the
graph maths of llama.cpp's gemma4 / gemma4-assistant re-implemented here in numpy, determinism, the
fork dialect's centroid head, the stamp, the CLI and the sample configs."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from mtpscope.demo import build as demo

REPO = Path(__file__).resolve().parents[1]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@functools.lru_cache(maxsize=8)
def _read(path: Path) -> tuple[dict[str, object], dict[str, np.ndarray]]:
    """Keys (scalars decoded; arrays as lists) and tensors (numpy order) via gguf-py's GGUFReader."""
    import gguf

    r = gguf.GGUFReader(str(path))
    kv: dict[str, object] = {}
    for f in r.fields.values():
        if f.name.startswith("tokenizer.ggml.merges") or f.name.startswith("tokenizer.ggml.tokens"):
            continue
        if f.types and f.types[0] == gguf.GGUFValueType.ARRAY:
            kv[f.name] = [f.parts[i].tolist()[0] for i in f.data]
        elif f.types and f.types[0] == gguf.GGUFValueType.STRING:
            kv[f.name] = bytes(f.parts[f.data[0]]).decode()
        else:
            kv[f.name] = f.parts[f.data[0]].tolist()[0]
    tensors = {t.name: np.array(t.data) for t in r.tensors}
    return kv, tensors


# ---- graph maths, from llama.cpp src/models/gemma4.cpp and gemma4-assistant.cpp -----------------


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float32)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _ffn_block(x: np.ndarray, t: dict[str, np.ndarray], il: int, eps: float) -> np.ndarray:
    """One layer when attn_output is zero: attention adds RMSNorm(0) = 0, then FFN, residual, scale."""
    p = f"blk.{il}."
    assert not t[p + "attn_output.weight"].any(), "the shortcut below needs a zero attn_output"
    n = _rms(x, t[p + "ffn_norm.weight"], eps)
    f = (_gelu_tanh(n @ t[p + "ffn_gate.weight"].T) * (n @ t[p + "ffn_up.weight"].T)) @ t[p + "ffn_down.weight"].T
    return (_rms(f, t[p + "post_ffw_norm.weight"], eps) + x) * t[p + "layer_output_scale.weight"]


def target_forward(kv: dict, t: dict[str, np.ndarray], tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(h after output_norm, logits after soft-capping) for each token, attention-free target."""
    n_embd = kv["gemma4.embedding_length"]
    eps = kv["gemma4.attention.layer_norm_rms_epsilon"]
    x = t["token_embd.weight"].astype(np.float32)[tokens] * math.sqrt(n_embd)
    for il in range(kv["gemma4.block_count"]):
        x = _ffn_block(x, t, il, eps)
    h = _rms(x, t["output_norm.weight"], eps)
    logits = h @ t["token_embd.weight"].astype(np.float32).T
    cap = kv["gemma4.final_logit_softcapping"]
    return h, cap * np.tanh(logits / cap)


def drafter_forward(kv: dict, d: dict[str, np.ndarray], target_embd: np.ndarray, tokens: np.ndarray,
                    h: np.ndarray) -> np.ndarray:
    """Dense-head logits of an upstream gemma4-assistant step (attention output zero)."""
    a = "gemma4-assistant."
    n_bb = kv[a + "embedding_length_out"]
    eps = kv[a + "attention.layer_norm_rms_epsilon"]
    e = target_embd.astype(np.float32)[tokens] * math.sqrt(n_bb)
    x = np.concatenate([e, h], axis=1) @ d["nextn.pre_projection.weight"].T
    for il in range(kv[a + "nextn_predict_layers"]):
        x = _ffn_block(x, d, il, eps)
    return _rms(x, d["output_norm.weight"], eps) @ d["token_embd.weight"].astype(np.float32).T


@pytest.fixture(scope="module")
def subset_files(tiny_pair) -> dict[str, Path]:
    target, clean = tiny_pair(vocab="subset")
    _, noisy = tiny_pair(vocab="subset", noise=1.2, noise_seed=1)
    _, very = tiny_pair(vocab="subset", noise=3.0, noise_seed=1)
    _, fork = tiny_pair(vocab="subset", dialect="fork", centroid_misplace=0.05)
    return {"target": target, "clean": clean, "noisy": noisy, "very": very, "fork": fork}


def test_target_is_attention_free_and_follows_the_passage(subset_files: dict[str, Path]) -> None:
    kv, t = _read(subset_files["target"])
    assert kv["general.architecture"] == "gemma4"
    assert kv["gemma4.embedding_length_per_layer_input"] == 0
    assert kv["gemma4.attention.sliding_window_pattern"] == [True, True, False, True, True, False]
    assert all(not t[f"blk.{i}.attn_output.weight"].any() for i in range(6))
    # K = V on full layers: no attn_v there
    assert "blk.2.attn_v.weight" not in t and "blk.0.attn_v.weight" in t
    # rope_freqs: 64-dim full heads, 25 % of 32 pairs rotate
    np.testing.assert_array_equal(t["rope_freqs.weight"], np.array([1.0] * 8 + [1e30] * 24, np.float32))
    # the passage's words that are among the first 4096 real tokens, by their text in the real tokenizer
    from mtpscope.cache import vocab_path
    from mtpscope.inspector.gguf import open_gguf
    with open_gguf(vocab_path()) as f:
        toks = f.get("tokenizer.ggml.tokens")
        words = [w for w in demo.DEMO_PASSAGE.split() if w.isalpha()]
        ids = []
        for w in words:
            for i in range(4096):
                if toks[i] == "\u2581" + w:
                    ids.append(i)
                    break
    assert ids[:3] == [669, 3823, 1024]   # "▁The", "▁quick", "▁over" (hand-checked in the vocab)
    _, logits = target_forward(kv, t, np.array(ids))
    nxt = logits.argmax(1)
    assert nxt.tolist() == ids[1:] + ids[:1]


def test_noise_free_drafter_reproduces_the_target_next_token(subset_files: dict[str, Path]) -> None:
    tkv, t = _read(subset_files["target"])
    dkv, d = _read(subset_files["clean"])
    assert dkv["general.architecture"] == "gemma4-assistant"
    assert dkv["gemma4-assistant.embedding_length"] != dkv["gemma4-assistant.embedding_length_out"] == 64
    tokens = np.arange(4096)
    h, tlog = target_forward(tkv, t, tokens)
    dlog = drafter_forward(dkv, d, t["token_embd.weight"], tokens, h)
    assert (dlog.argmax(1) == tlog.argmax(1)).all()
    # and the logits are the target's before soft-capping (the padded maths is exact up to rounding)
    cap = tkv["gemma4.final_logit_softcapping"]
    np.testing.assert_allclose(cap * np.tanh(dlog / cap), tlog, atol=2e-4)
    # the h half of concat(e, h) is ignored: a zero h gives the same drafts
    assert (drafter_forward(dkv, d, t["token_embd.weight"], tokens, 0 * h).argmax(1) == tlog.argmax(1)).all()


def test_noise_lowers_agreement_smoothly(subset_files: dict[str, Path]) -> None:
    tkv, t = _read(subset_files["target"])
    tokens = np.arange(4096)
    h, tlog = target_forward(tkv, t, tokens)
    agree = []
    for name in ("clean", "noisy", "very"):
        dkv, d = _read(subset_files[name])
        agree.append(float((drafter_forward(dkv, d, t["token_embd.weight"], tokens, h).argmax(1)
                            == tlog.argmax(1)).mean()))
    assert agree[0] == 1.0
    assert 0.0 < agree[1] < 1.0
    assert agree[2] < agree[1]


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    demo.write_drafter(a, vocab="subset", noise=0.5, seed=3)
    demo.write_drafter(b, vocab="subset", noise=0.5, seed=3)
    demo.write_drafter(c, vocab="subset", noise=0.5, seed=4)
    assert _sha(a) == _sha(b) != _sha(c)
    demo.write_target(a, vocab="subset", seed=7)
    demo.write_target(b, vocab="subset", seed=7)
    assert _sha(a) == _sha(b)


def test_subset_tokenizer_is_consistent_with_the_real_one(subset_files: dict[str, Path]) -> None:
    import gguf

    from mtpscope.cache import vocab_path
    from mtpscope.inspector.gguf import open_gguf

    r = gguf.GGUFReader(str(subset_files["target"]))
    tok_field = r.fields["tokenizer.ggml.tokens"]
    sub_tokens = [bytes(tok_field.parts[i]) for i in tok_field.data]
    mf = r.fields["tokenizer.ggml.merges"]
    merges = [bytes(mf.parts[i]) for i in mf.data]
    with open_gguf(vocab_path()) as f:
        real = f.get("tokenizer.ggml.tokens")
        assert [real[i].encode() for i in range(4096)] == sub_tokens
        scores = f.get("tokenizer.ggml.scores").to_numpy()[:4096]
    np.testing.assert_array_equal(np.array(r.fields["tokenizer.ggml.scores"].parts[-1]), scores[-1:])
    inside = set(sub_tokens)
    assert merges, "some merges stay inside the first 4096 tokens"
    for m in merges:
        left, right = m.split(b" ", 1)
        assert left in inside and right in inside and left + right in inside


def test_fork_dialect_names_keys_and_centroid_head(subset_files: dict[str, Path]) -> None:
    kv, t = _read(subset_files["fork"])
    _, up = _read(subset_files["clean"])
    a = "gemma4_assistant."
    assert kv["general.architecture"] == "gemma4_assistant"
    assert kv[a + "n_embd_backbone"] == 64 and kv[a + "use_ordered_embeddings"] is True
    assert kv[a + "requires_target_arch"] == "gemma4"
    n_c = kv[a + "n_centroids"]
    ordering = t["mtp.token_ordering.weight"]
    assert ordering.dtype == np.int32 and ordering.shape == (4096,)
    assert 4096 % n_c == 0
    np.testing.assert_array_equal(np.sort(ordering), np.arange(4096))
    assert t["mtp.centroids.weight"].shape == (n_c, kv[a + "embedding_length"])
    assert not any(k.startswith("nextn.") for k in t)
    # same weights as the upstream drafter, under the fork's names
    np.testing.assert_array_equal(t["mtp.pre_projection.weight"], up["nextn.pre_projection.weight"])
    for name in ("token_embd.weight", "blk.3.ffn_down.weight", "output_norm.weight"):
        np.testing.assert_array_equal(t[name], up[name])
    # 49 upstream tensors + centroids + ordering
    assert len(up) == 49 and len(t) == 51


@pytest.mark.slow
def test_centroid_head_of_the_full_vocabulary() -> None:
    voc = demo.load_vocab("full")
    tw = demo.target_weights(voc)
    cent, ordering, mis = demo.centroid_head(tw, voc, n_centroids=2048, misplace=0.05)
    assert 262144 % 2048 == 0 and cent.shape == (2048, demo.DEFAULT_DIMS.n_embd)
    np.testing.assert_array_equal(np.sort(ordering), np.arange(262144))
    # centroid j = mean of the embedding rows its intended members had; misplaced tokens sit elsewhere
    clean_c, clean_o, _ = demo.centroid_head(tw, voc, n_centroids=2048, misplace=0.0)
    np.testing.assert_array_equal(cent, clean_c)
    moved = np.flatnonzero(clean_o != ordering)
    assert set(ordering[moved].tolist()) == set(mis.tolist())
    assert abs(len(mis) / 262144 - 0.05) < 0.001
    emb = tw["token_embd.weight"].astype(np.float32)
    np.testing.assert_allclose(clean_c[5, :64], emb[clean_o[5 * 128:6 * 128]].mean(0), rtol=1e-5, atol=1e-6)
    assert not clean_c[:, 64:].any()


def test_centroid_head_refuses_bad_arguments() -> None:
    voc = demo.load_vocab("subset")
    tw = demo.target_weights(voc)
    with pytest.raises(ValueError, match="n_centroids"):
        demo.centroid_head(tw, voc, n_centroids=3000)
    with pytest.raises(ValueError, match="misplace"):
        demo.centroid_head(tw, voc, n_centroids=32, misplace=1.5)


def test_drafter_refuses_equal_widths_and_bad_dialect(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="differ"):
        demo.write_drafter(tmp_path / "x.gguf", vocab="subset", dims=demo.TinyDims(n_embd=64))
    with pytest.raises(ValueError, match="dialect"):
        demo.write_drafter(tmp_path / "x.gguf", vocab="subset", dialect="mlx")


def _subset_config(tmp_path: Path, **record: object) -> Path:
    cfg = json.loads((REPO / "sample_configs" / "demo-record.json").read_text())
    cfg["vocab"] = "subset"
    cfg["fork"]["n_centroids"] = 32
    cfg["record"].update(record)
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps(cfg))
    return p


def test_build_demo_is_idempotent_and_rebuilds_on_change(tmp_path: Path) -> None:
    cfg = _subset_config(tmp_path)
    out = tmp_path / "demo"
    paths = demo.build_demo(out, traces=False, config=cfg)
    assert all(p.exists() for p in paths.models)
    mtimes = [p.stat().st_mtime_ns for p in paths.models]
    stamp = json.loads(paths.stamp.read_text())
    t0 = time.perf_counter()
    demo.build_demo(out, traces=False, config=cfg)
    assert time.perf_counter() - t0 < 1.0
    assert [p.stat().st_mtime_ns for p in paths.models] == mtimes
    # a change of a model input (the noisy drafter's noise) rebuilds, and changes the stamp hash
    data = json.loads(cfg.read_text())
    data["drafters"]["noisy"]["noise"] = 0.7
    cfg.write_text(json.dumps(data))
    demo.build_demo(out, traces=False, config=cfg)
    assert json.loads(paths.stamp.read_text())["models"] != stamp["models"]
    # a change of the record section only does not touch the models
    mtimes = [p.stat().st_mtime_ns for p in paths.models]
    data["record"]["max_tokens"] = 7
    cfg.write_text(json.dumps(data))
    demo.build_demo(out, traces=False, config=cfg)
    assert [p.stat().st_mtime_ns for p in paths.models] == mtimes
    demo.build_demo(out, traces=False, config=cfg, force=True)
    assert [p.stat().st_mtime_ns for p in paths.models] != mtimes


def test_bad_record_config_names_the_key(tmp_path: Path) -> None:
    from mtpscope.errors import MtpscopeError

    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"seed": 0}))
    with pytest.raises(MtpscopeError, match="vocab"):
        demo.load_record_config(p)
    p.write_text("{nope")
    with pytest.raises(MtpscopeError, match="invalid JSON"):
        demo.load_record_config(p)


def test_cli_demo_path_and_clean(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    runner = CliRunner()
    res = runner.invoke(app, ["demo", "path", "--out", str(tmp_path / "d"), "--json"])
    assert res.exit_code == 0
    got = json.loads(res.stdout)
    assert got["drafter_fork"] == str(tmp_path / "d" / "drafter-fork.gguf")
    # the trained pair the app opens on is listed too
    assert got["trained"]["traces_f32"] == str(tmp_path / "d" / "trained" / "traces" / "f32")
    assert got["trained"]["drafter_buggy"] == str(tmp_path / "d" / "trained" / "drafter-buggy.gguf")
    other = tmp_path / "not-a-demo"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    res = runner.invoke(app, ["demo", "clean", "--out", str(other)])
    assert res.exit_code == 2 and (other / "keep.txt").exists()
    cfg = _subset_config(tmp_path)
    res = runner.invoke(app, ["demo", "build", "--out", str(tmp_path / "d"), "--no-traces", "-q",
                              "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "d" / "target.gguf").exists()
    res = runner.invoke(app, ["demo", "clean", "--out", str(tmp_path / "d")])
    assert res.exit_code == 0 and not (tmp_path / "d").exists()


def test_demo_record_config_matches_the_contract() -> None:
    cfg = demo.load_record_config()
    assert cfg["drafters"]["clean"]["noise"] == 0.0
    assert cfg["drafters"]["clean"]["expected_acceptance_rate"] == 1.0
    assert 262144 % cfg["fork"]["n_centroids"] == 0
    assert cfg["vocab"] == "full"


@pytest.mark.slow
def test_cached_demo_folder_files(demo_dir, tmp_path: Path) -> None:
    """The built demo: fork file read with the project's reader, and byte-identical rebuilds."""
    from mtpscope.inspector.gguf import open_gguf

    with open_gguf(demo_dir.drafter_fork) as f:
        assert f.architecture == "gemma4_assistant"
        n_c = f.get("gemma4_assistant.n_centroids")
        assert n_c == 2048 and 262144 % n_c == 0
        ordering = np.array(f.tensor_data("mtp.token_ordering.weight"))
        assert f.tensor("mtp.token_ordering.weight").type_name == "I32"
    np.testing.assert_array_equal(np.sort(ordering), np.arange(262144))
    with open_gguf(demo_dir.drafter_upstream) as f:
        assert f.architecture == "gemma4-assistant"
        assert len(f.tensors) == 49
        assert len(f.get("tokenizer.ggml.tokens")) == 262144
        assert len(f.get("tokenizer.ggml.merges")) == 514906
    cfg = demo.load_record_config()
    again = tmp_path / "target.gguf"
    demo.write_target(again, vocab=cfg["vocab"], seed=cfg["seed"])
    assert _sha(again) == _sha(demo_dir.target)
