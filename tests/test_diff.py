"""GGUF diff: keys, tensors (incl. dialect renames), types / shapes, and sampled relative errors recomputed
with numpy from the arrays the files were written from."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mtpscope.cli.main import app
from mtpscope.demo import build as demo
from mtpscope.inspector.diff import KeyChange, TensorChange, diff
from tests.builders import DIMS, MetaValue, parts, q8_0, write


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("diff")
    return {k: write(d / f"{k}.gguf", *parts(k)) for k in ("upstream", "fork")}


def test_the_same_value_in_another_type_is_a_change(tmp_path: Path) -> None:
    """A key whose value is the same in another GGUF type (block_count 4 as INT32: llama.cpp refuses the file, verify
    says E_KEY_VALUE) and an array whose elements' type changed are changes, said with both types (before:
    "identical")."""
    from tests.builders import UP, build

    a = write(tmp_path / "a.gguf", *parts("upstream"))
    r = diff(a, build(tmp_path, "up_block_count_i32"), data="none")
    assert r.keys_changed == (KeyChange(f"{UP}.block_count", 4, 4, "UINT32", "INT32"),) and not r.identical
    r2 = diff(build(tmp_path, "up_head_count_kv_array"), build(tmp_path, "up_head_count_kv_array_i32"), data="none")
    assert [(c.key, c.a_type, c.b_type) for c in r2.keys_changed] == [
        (f"{UP}.attention.head_count_kv", "ARRAY[UINT32]", "ARRAY[INT32]")]
    res = CliRunner().invoke(app, ["diff", str(a), str(tmp_path / "up_block_count_i32.gguf"), "--data", "none"])
    assert f"~ key {UP}.block_count: 4 -> 4 (UINT32 -> INT32)" in res.output, res.output


def test_upstream_vs_fork(files: dict[str, Path]) -> None:
    r = diff(files["upstream"], files["fork"])
    fk = "gemma4_assistant."
    assert set(r.keys_added) == {fk + "n_embd_backbone", fk + "n_centroids", fk + "centroid_top_k",
                                 fk + "use_ordered_embeddings", fk + "requires_target_arch"}
    assert set(r.keys_removed) == {"gemma4-assistant.embedding_length_out", "gemma4-assistant.nextn_predict_layers"}
    assert r.keys_changed == (KeyChange("general.architecture", "gemma4-assistant", "gemma4_assistant", "STRING",
                                        "STRING"),)
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
    # a vector is one row, compared whole (it read "1 of 32 rows", as if 31 were left out)
    norm = next(n for n, t in noisy.items() if t.ndim == 1 and not np.array_equal(t, clean[n]))
    assert (vals[norm].rows_sampled, vals[norm].rows_total) == (1, 1) and not vals[norm].identical
    x, y = clean[norm].astype(np.float64), noisy[norm].astype(np.float64)
    assert vals[norm].rel_err_max == pytest.approx(np.linalg.norm(x - y) / max(np.linalg.norm(x), np.linalg.norm(y)))


def test_rows_holding_nan_or_inf_are_not_a_zero_error(tmp_path: Path) -> None:
    """A NaN where the other file has a number made the row's norms NaN, which the division skipped: relative error
    0.0 for a tensor whose bytes differ. Such a row now counts 2 (the largest) and is counted; rows holding the same
    NaN / Inf in both files count 0, and such tensors are identical. No numpy warning (inf - inf)."""
    import warnings

    arch, kv, _ = parts("upstream")
    base = np.arange(32, dtype=np.float32).reshape(4, 8) + 1.0       # 4 rows, no zero row
    nan_a = base.copy()
    nan_a[0, 0] = np.nan
    inf_a = base.copy()
    inf_a[2, 3] = np.inf
    a = write(tmp_path / "a.gguf", arch, kv, {"x.weight": base, "same_nan.weight": nan_a, "inf.weight": inf_a})
    b = write(tmp_path / "b.gguf", arch, kv, {"x.weight": nan_a, "same_nan.weight": nan_a.copy(),
                                               "inf.weight": np.where(inf_a == np.inf, -np.inf, inf_a)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vals = {v.name: v for v in diff(a, b, values=True, n_rows=16).values}
    # x: row 0 differs by a NaN (2), rows 1..3 equal (0): max 2, mean 2 / 4; one row holds a NaN
    x = vals["x.weight"]
    assert (x.rel_err_max, x.rel_err_mean, x.rows_nonfinite, x.identical) == (2.0, 0.5, 1, False)
    same = vals["same_nan.weight"]
    assert (same.rel_err_max, same.rel_err_mean, same.rows_nonfinite, same.identical) == (0.0, 0.0, 1, True)
    inf = vals["inf.weight"]          # +inf against -inf in row 2
    assert (inf.rel_err_max, inf.rel_err_mean, inf.rows_nonfinite, inf.identical) == (2.0, 0.5, 1, False)
    out = CliRunner().invoke(app, ["diff", str(a), str(b), "--values"]).output
    assert "values x.weight: rel err max 2.000e+00 mean 5.000e-01 (every row; 1 with NaN or Inf, counted 2 where " \
           "the files differ)" in out, out


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


# ------------------------------------------------------------------ tensor bytes compared by default

def _raw(path: Path, name: str) -> bytes:
    """A tensor's bytes as stored, read with gguf-py's GGUFReader (not our reader)."""
    import gguf

    t = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == name)
    return np.asarray(t.data).tobytes()


def test_feed_forward_weights_that_differ_are_not_identical(tmp_path: Path) -> None:
    """Issue 27: two drafters whose feed-forward weights differ printed ``identical`` without --values."""
    import hashlib

    arch, kv, t = parts("upstream")
    a = write(tmp_path / "good.gguf", arch, kv, t)
    t2 = {k: v.copy() for k, v in t.items()}
    t2["blk.1.ffn_up.weight"][5:, :] += 0.25  # rows 5.. differ
    t2["blk.2.ffn_down.weight"] = q8_0(t2["blk.2.ffn_down.weight"])[0], q8_0(t2["blk.2.ffn_down.weight"])[1]
    b = write(tmp_path / "bad.gguf", arch, kv, t2)
    r = diff(a, b)
    assert not r.identical and r.keys_changed == () and r.tensors_changed != ()  # ffn_down's type changed
    assert [c.name for c in r.data_differ] == ["blk.1.ffn_up.weight"]
    c = r.data_differ[0]
    assert c.first_diff_row == 5 and c.whole and c.rows_total == t["blk.1.ffn_up.weight"].shape[0]
    assert c.digest_a == hashlib.blake2b(_raw(a, c.name), digest_size=16).hexdigest()
    assert c.digest_b == hashlib.blake2b(_raw(b, c.name), digest_size=16).hexdigest()
    comp = r.compared
    assert comp.data == "sampled" and comp.data_skipped == ("blk.2.ffn_down.weight",)
    assert comp.tensors == len(t) and comp.keys == len(kv) + 1  # + general.architecture
    same = [n for n in t if n != "blk.2.ffn_down.weight"]
    assert comp.data_whole + comp.data_sampled == len(same) == len(r.data)
    # --values measures how much (across types too: ffn_down's Q8_0 rounding)
    assert {v.name for v in diff(a, b, values=True, data="none").values if not v.identical} == \
        {"blk.1.ffn_up.weight", "blk.2.ffn_down.weight"}
    assert diff(a, b, data="none").compared.line().endswith("tensor bytes not compared")


def test_large_tensors_are_compared_on_sampled_rows_and_whole_on_request(tmp_path: Path) -> None:
    arch, kv, t = parts("upstream")
    a = write(tmp_path / "a.gguf", arch, kv, t)
    name = "token_embd.weight"
    n = t[name].shape[0]
    rows = np.unique(np.linspace(0, n - 1, num=4).round().astype(int))  # the 4 rows compared, by hand
    unsampled = int(next(i for i in range(n) if i not in set(rows)))
    t2 = {k: v.copy() for k, v in t.items()}
    t2[name][unsampled] += 1.0
    b = write(tmp_path / "b.gguf", arch, kv, t2)
    r = diff(a, b, sample_rows=4, whole_bytes=0)  # every tensor of more than 4 rows sampled
    emb = next(c for c in r.data if c.name == name)
    assert (emb.rows_compared, emb.rows_total) == (len(rows), n) and not emb.whole
    assert emb.same and r.identical  # the changed row is not among the sampled ones: said, not hidden
    per_row = len(_raw(a, name)) // n
    assert emb.bytes_compared == len(rows) * per_row
    assert "on 4 sampled rows each" in r.compared.line()
    r = diff(a, b, data="whole")
    emb = next(c for c in r.data if c.name == name)
    assert emb.whole and not emb.same and emb.first_diff_row == unsampled and not r.identical
    assert r.compared.bytes_read == 2 * sum(len(_raw(a, x)) for x in t)  # every byte of both files
    t3 = {k: v.copy() for k, v in t.items()}
    t3[name][int(rows[2])] += 1.0  # a sampled row
    r = diff(a, write(tmp_path / "c.gguf", arch, kv, t3), sample_rows=4, whole_bytes=0)
    assert [(c.name, c.first_diff_row) for c in r.data_differ] == [(name, int(rows[2]))]


def test_sampled_rows_come_in_evenly_spaced_runs() -> None:
    from mtpscope.inspector.diff import sample_rows_of

    # 32 rows in 4 runs of 8: starts at 0, 92/3, 2*92/3, 92 (rounded), the last run ending at row 99
    want = [*range(0, 8), *range(31, 39), *range(61, 69), *range(92, 100)]
    assert sample_rows_of(100, 32).tolist() == want
    assert sample_rows_of(20, 32).tolist() == list(range(20))  # fewer rows than the sample: all of them
    assert sample_rows_of(10, 4).tolist() == [0, 3, 6, 9]       # runs of one row


def test_cli_diff_says_what_was_compared(tmp_path: Path) -> None:
    arch, kv, t = parts("upstream")
    a = write(tmp_path / "good.gguf", arch, kv, t)
    t["blk.0.ffn_gate.weight"] = t["blk.0.ffn_gate.weight"] * 2
    b = write(tmp_path / "bad.gguf", arch, kv, t)
    run = CliRunner().invoke
    res = run(app, ["diff", str(a), str(b)])
    assert res.exit_code == 1, res.output
    assert "~ data blk.0.ffn_gate.weight: bytes differ (first at row 0; every row compared)" in res.stdout
    assert f"compared: {len(kv) + 1} metadata keys, {len(t)} tensors (names, types, shapes); tensor bytes:" in res.stdout
    assert "identical" not in res.stdout
    res = run(app, ["diff", str(a), str(a), "--sample-rows", "2"])
    assert res.exit_code == 0 and "identical" in res.stdout and "compared:" in res.stdout
    res = run(app, ["diff", str(a), str(b), "--data", "none"])
    assert res.exit_code == 0 and "tensor bytes not compared" in res.stdout  # what was not compared is said
    d = json.loads(run(app, ["diff", str(a), str(b), "--json"]).stdout)
    assert [x["name"] for x in d["data"] if not x["same"]] == ["blk.0.ffn_gate.weight"]
    assert d["compared"]["data"] == "sampled"
    res = run(app, ["diff", str(a), str(b), "--data", "all"])
    assert res.exit_code == 2 and "sampled | whole | none" in res.output


def test_a_large_tensor_s_bytes_and_values_lines_name_the_same_row_count(tmp_path: Path) -> None:
    """By default ``diff --values`` samples as many rows for the values as for the bytes (32): the two lines of one
    tensor say the same count (they said 32 and 16)."""
    arch, kv, t = parts("upstream")
    big = np.random.default_rng(0).standard_normal((4096, 96)).astype(np.float32)   # 1.5 MiB: bytes sampled
    a = write(tmp_path / "a.gguf", arch, kv, {**t, "extra.weight": big})
    b = write(tmp_path / "b.gguf", arch, kv, {**t, "extra.weight": big * 2})
    res = CliRunner().invoke(app, ["diff", str(a), str(b), "--values"])
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.stdout.splitlines() if "extra.weight" in ln]
    assert len(lines) == 2 and all("32 of 4096 rows" in ln for ln in lines), lines
    assert "rel err max 5.000e-01" in lines[1]       # |2x - x| / |2x| on every row, by hand


def test_values_read_the_row_whose_bytes_differ(tmp_path: Path) -> None:
    """A NaN in a row the evenly spaced values sample skips: the bytes said "differ (first at row 44)" and the values
    "identical, rel err 0" in one report. The values now read that row too: not identical, one non-finite row."""
    arch, kv, t = parts("upstream")
    name = "blk.0.ffn_down.weight"
    x = t[name]
    n = x.shape[0]
    even = set(np.linspace(0, n - 1, num=min(2, n)).round().astype(int).tolist())
    row = next(i for i in range(n) if i not in even)
    y = x.copy()
    y[row, 0] = np.nan
    a = write(tmp_path / "a.gguf", arch, kv, t)
    b = write(tmp_path / "b.gguf", arch, kv, {**t, name: y})
    r = diff(a, b, values=True, n_rows=2)
    d = next(c for c in r.data if c.name == name)
    v = next(v for v in r.values if v.name == name)
    assert d.first_diff_row == row and not d.same
    assert not v.identical and v.rows_nonfinite == 1 and v.rows_sampled == 3 and v.rel_err_max == 2.0
