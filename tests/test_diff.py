"""GGUF diff: keys, tensors (incl. dialect renames), types / shapes, and sampled relative errors recomputed
with numpy from the arrays the files were written from."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mtpscope.inspector.diff import KeyChange, TensorChange, diff
from mtpscope.demo import build as demo
from mtpscope.cli.main import app
from tests.builders import DIMS, MetaValue, parts, q8_0, write


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("diff")
    return {k: write(d / f"{k}.gguf", *parts(k)) for k in ("upstream", "fork")}


def test_upstream_vs_fork(files: dict[str, Path]) -> None:
    r = diff(files["upstream"], files["fork"])
    fk = "gemma4_assistant."
    assert set(r.keys_added) == {fk + "n_embd_backbone", fk + "n_centroids", fk + "centroid_top_k",
                                 fk + "use_ordered_embeddings", fk + "requires_target_arch"}
    assert set(r.keys_removed) == {"gemma4-assistant.embedding_length_out", "gemma4-assistant.nextn_predict_layers"}
    assert r.keys_changed == (KeyChange("general.architecture", "gemma4-assistant", "gemma4_assistant"),)
    assert set(r.tensors_added) == {"mtp.centroids.weight", "mtp.token_ordering.weight"}
    assert r.tensors_removed == ()
    assert set(r.tensors_renamed) == {("nextn.pre_projection.weight", "mtp.pre_projection.weight"),
                                      ("nextn.post_projection.weight", "mtp.post_projection.weight")}
    assert r.tensors_changed == () and not r.identical
    plain = diff(files["upstream"], files["fork"], match_dialects=False)
    assert "nextn.pre_projection.weight" in plain.tensors_removed and plain.tensors_renamed == ()
    assert "gemma4-assistant.block_count" in plain.keys_removed


def test_identical(files: dict[str, Path]) -> None:
    r = diff(files["upstream"], files["upstream"], values=True)
    assert r.identical and all(v.identical and v.rel_err_max == 0.0 for v in r.values)
    assert len(r.values) == 49


def test_values_relative_error_on_sampled_rows(tmp_path: Path) -> None:
    voc = demo.load_vocab("subset")
    tw = demo.target_weights(voc, DIMS, 0)
    clean = demo.drafter_weights(tw, DIMS)
    noisy = demo.drafter_weights(tw, DIMS, noise=0.5, seed=3)
    arch, kv, _ = parts("upstream")
    a = write(tmp_path / "a.gguf", arch, kv, clean)
    b = write(tmp_path / "b.gguf", arch, kv, noisy)
    r = diff(a, b, values=True, n_rows=16)
    vals = {v.name: v for v in r.values}
    for name in ("token_embd.weight", "nextn.pre_projection.weight", "blk.2.ffn_gate.weight"):
        x, y = clean[name].astype(np.float64), noisy[name].astype(np.float64)
        idx = np.unique(np.linspace(0, x.shape[0] - 1, num=min(16, x.shape[0])).round().astype(int))
        den = np.maximum(np.linalg.norm(x[idx], axis=1), np.linalg.norm(y[idx], axis=1))
        rel = np.array([0.0 if dd == 0 else nn / dd
                        for nn, dd in zip(np.linalg.norm(x[idx] - y[idx], axis=1), den, strict=True)])
        v = vals[name]
        assert v.rows_sampled == len(idx) and v.rows_total == x.shape[0]
        assert v.rel_err_max == pytest.approx(rel.max(), rel=1e-9)
        assert v.rel_err_mean == pytest.approx(rel.mean(), rel=1e-9)
        assert not v.identical
    assert vals["blk.0.attn_norm.weight"].identical and vals["rope_freqs.weight"].identical


def test_type_shape_and_token_changes(tmp_path: Path, files: dict[str, Path]) -> None:
    arch, kv, t = parts("upstream")
    t["blk.0.attn_q.weight"] = q8_0(t["blk.0.attn_q.weight"])
    t["blk.1.ffn_up.weight"] = np.zeros((64, 128), np.float32)
    toks = list(kv["tokenizer.ggml.tokens"].value)
    toks[100] = b"changed"
    kv["tokenizer.ggml.tokens"] = MetaValue(kv["tokenizer.ggml.tokens"].type, toks, kv["tokenizer.ggml.tokens"].sub_type)
    r = diff(files["upstream"], write(tmp_path / "m.gguf", arch, kv, t), values=True)
    assert set(r.tensors_changed) == {
        TensorChange("blk.0.attn_q.weight", "F32", "Q8_0", (128, 64), (128, 64)),
        TensorChange("blk.1.ffn_up.weight", "F32", "F32", (128, 128), (128, 64)),
    }
    assert [c.key for c in r.keys_changed] == ["tokenizer.ggml.tokens"]
    q = next(v for v in r.values if v.name == "blk.0.attn_q.weight")
    assert 0 < q.rel_err_max < 0.02                      # Q8_0 rounding only
    assert all(v.name != "blk.1.ffn_up.weight" for v in r.values)


def test_cli_diff(files: dict[str, Path], tmp_path: Path) -> None:
    run = CliRunner().invoke
    res = run(app, ["diff", str(files["upstream"]), str(files["upstream"])])
    assert res.exit_code == 0 and "identical" in res.stdout
    res = run(app, ["diff", str(files["upstream"]), str(files["fork"]), "--json"])
    assert res.exit_code == 1
    d = json.loads(res.stdout)
    assert ["nextn.pre_projection.weight", "mtp.pre_projection.weight"] in d["tensors_renamed"]
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00")
    res = run(app, ["diff", str(files["upstream"]), str(bad)])
    assert res.exit_code == 2
