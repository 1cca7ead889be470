"""The HF -> GGUF converter: names, shapes, types and values checked with our reader against the
safetensors arrays (written independently with numpy), verify, sidecar, errors, and loading in llama.cpp."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mtpscope.errors import HFCheckpointError, LayoutError
from mtpscope.inspector.convert import convert, read_checkpoint, write_tiny_pair
from mtpscope.inspector.gguf import open_gguf
from mtpscope.inspector.safetensors import read_safetensors, write_safetensors


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_tiny_pair(tmp_path_factory.mktemp("hf"), seed=3, centroids=True, vocab_size=4096)


@pytest.fixture(scope="module")
def converted(hf_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gguf")
    tdir, ddir = hf_pair
    out = {"target": d / "t.gguf", "upstream": d / "d-up.gguf", "fork": d / "d-fork.gguf", "side": d / "side.gguf"}
    convert(tdir, out["target"])
    convert(ddir, out["upstream"], dialect="upstream", centroids_out=out["side"])
    convert(ddir, out["fork"], dialect="fork")
    return out


def test_safetensors_roundtrip(tmp_path: Path) -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.array([5, -1, 7], np.int64)
    write_safetensors(tmp_path / "m.safetensors", {"a": a, "b": b})
    got = read_safetensors(tmp_path / "m.safetensors")
    assert np.array_equal(got["a"], a) and np.array_equal(got["b"], b)
    # BF16: 1.0 is 0x3F80, -2.0 is 0xC000; header written by hand
    raw = np.array([0x3F80, 0xC000], np.uint16).tobytes()
    hdr = json.dumps({"x": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    (tmp_path / "bf.safetensors").write_bytes(len(hdr).to_bytes(8, "little") + hdr + raw)
    assert read_safetensors(tmp_path / "bf.safetensors")["x"].tolist() == [1.0, -2.0]


def test_safetensors_errors(tmp_path: Path) -> None:
    (tmp_path / "short.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(HFCheckpointError, match="too short"):
        read_safetensors(tmp_path / "short.safetensors")
    hdr = json.dumps({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    (tmp_path / "trunc.safetensors").write_bytes(len(hdr).to_bytes(8, "little") + hdr + b"\0" * 8)
    with pytest.raises(HFCheckpointError, match="out of range") as e:
        read_safetensors(tmp_path / "trunc.safetensors")
    assert "'x'" in str(e.value)
    with pytest.raises(HFCheckpointError, match="no config.json"):
        read_checkpoint(tmp_path)


def test_target_tensors_and_keys(hf_pair: tuple[Path, Path], converted: dict[str, Path]) -> None:
    _, st = read_checkpoint(hf_pair[0])
    f = open_gguf(converted["target"])
    assert f.architecture == "gemma4"
    assert f.get("gemma4.block_count") == 6 and f.get("gemma4.embedding_length") == 64
    assert f.get("gemma4.attention.sliding_window_pattern").to_list() == [True, True, False, True, True, False]
    assert f.get("gemma4.final_logit_softcapping") == pytest.approx(30.0)
    # HF Linear (out, in) == GGUF ne [in, out]; values bit-identical at f32
    q = f.tensor("blk.2.attn_q.weight")
    assert q.ne == (64, 2 * 64) and q.type_name == "F32"
    assert np.array_equal(f.tensor_data("blk.2.attn_q.weight"), st["model.layers.2.self_attn.q_proj.weight"])
    assert np.array_equal(f.tensor_data("blk.4.attn_v.weight"), st["model.layers.4.self_attn.v_proj.weight"])
    assert np.array_equal(f.tensor_data("token_embd.weight"), st["model.embed_tokens.weight"])
    assert float(f.tensor_data("blk.1.layer_output_scale.weight")[0]) == float(st["model.layers.1.layer_scalar"][0])
    # proportional RoPE factors: full head dim 64 -> 32 pairs, 25 % rotate
    rf = f.tensor_data("rope_freqs.weight")
    assert rf.shape == (32,) and rf[:8].tolist() == [1.0] * 8 and np.all(rf[8:] == np.float32(1e30))
    # tokenizer: the first 4096 real Gemma 4 tokens
    assert len(f.get("tokenizer.ggml.tokens")) == 4096


def test_drafter_dialects(hf_pair: tuple[Path, Path], converted: dict[str, Path]) -> None:
    _, st = read_checkpoint(hf_pair[1])
    up, fork = open_gguf(converted["upstream"]), open_gguf(converted["fork"])
    assert up.architecture == "gemma4-assistant" and fork.architecture == "gemma4_assistant"
    assert up.get("gemma4-assistant.embedding_length_out") == 64
    assert up.get("gemma4-assistant.nextn_predict_layers") == 4
    assert fork.get("gemma4_assistant.n_embd_backbone") == 64
    assert fork.get("gemma4_assistant.n_centroids") == 64 and fork.get("gemma4_assistant.centroid_top_k") == 4
    up_names = {t.name for t in up.tensors}
    fork_names = {t.name for t in fork.tensors}
    # 4 layers x 11 + token_embd, output_norm, rope_freqs, two projections = 49; the fork adds the pair
    assert len(up_names) == 49 and len(fork_names) == 51
    assert not any("attn_k" in n or "attn_v" in n or "centroid" in n for n in up_names)
    assert up.tensor("nextn.pre_projection.weight").ne == (128, 48)
    assert np.array_equal(up.tensor_data("nextn.pre_projection.weight"), st["pre_projection.weight"])
    assert np.array_equal(fork.tensor_data("mtp.post_projection.weight"), st["post_projection.weight"])
    assert fork.tensor("mtp.centroids.weight").ne == (48, 64)
    o = fork.tensor("mtp.token_ordering.weight")
    assert o.type_name == "I32"
    assert np.array_equal(fork.tensor_data("mtp.token_ordering.weight", dequantize=False),
                          st["masked_embedding.token_ordering"])


def test_sidecar_loads_as_centroid_head(hf_pair: tuple[Path, Path], converted: dict[str, Path]) -> None:
    from mtpscope.traces.run.centroid_head import load_centroid_head

    _, st = read_checkpoint(hf_pair[1])
    head = load_centroid_head(converted["side"])
    assert head.top_k == 4 and head.n_centroids == 64
    assert np.array_equal(head.centroids, st["masked_embedding.centroids.weight"])
    assert np.array_equal(head.ordering, st["masked_embedding.token_ordering"])


@pytest.mark.parametrize("outtype,type_name,tol", [("f16", "F16", 1e-3), ("bf16", "BF16", 1e-2),
                                                   ("q8_0", "Q8_0", 1e-2)])
def test_outtypes(hf_pair: tuple[Path, Path], tmp_path: Path, outtype: str, type_name: str, tol: float) -> None:
    _, st = read_checkpoint(hf_pair[1])
    p = convert(hf_pair[1], tmp_path / "d.gguf", outtype=outtype).out
    f = open_gguf(p)
    t = f.tensor("blk.0.ffn_down.weight")         # rows of n_ff = 96 = 3 Q8_0 blocks
    assert t.type_name == type_name
    if outtype == "q8_0":                         # rows of 48 are not whole Q8_0 blocks: F16 instead
        assert f.tensor("blk.0.ffn_up.weight").type_name == "F16"
    assert f.tensor("blk.0.attn_norm.weight").type_name == "F32"  # 1-D stays F32
    want = st["model.layers.0.mlp.down_proj.weight"]
    got = f.tensor_data("blk.0.ffn_down.weight")
    assert np.max(np.abs(got - want)) <= tol * np.max(np.abs(want))
    assert not np.array_equal(got, want)  # really converted


def test_convert_errors(hf_pair: tuple[Path, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "llama"}))
    write_safetensors(bad / "model.safetensors", {"x": np.zeros(2, np.float32)})
    with pytest.raises(HFCheckpointError, match="unsupported model_type"):
        convert(bad, tmp_path / "x.gguf")
    with pytest.raises(ValueError):
        convert(hf_pair[1], tmp_path / "x.gguf", dialect="both")
    nocen = write_tiny_pair(tmp_path / "nc", centroids=False)[1]
    with pytest.raises(LayoutError, match="no centroid head"):
        convert(nocen, tmp_path / "y.gguf", centroids_out=tmp_path / "side.gguf")


def test_an_output_over_an_input_is_refused_and_nothing_is_touched(hf_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """``--out`` (or ``--centroids-out``) naming the checkpoint's own safetensors or config.json, or the sidecar
    naming ``--out``: refused before anything is written (before: the checkpoint was replaced by the GGUF, or the
    drafter by its sidecar, and 'wrote' said)."""
    import shutil

    d = tmp_path / "ckpt"
    shutil.copytree(hf_pair[1], d)
    before = {f.name: f.read_bytes() for f in d.iterdir()}
    shard = next(d.glob("*.safetensors"))
    for kw in ({"out": shard}, {"out": d / "config.json"}, {"out": tmp_path / "o.gguf", "centroids_out": shard}):
        with pytest.raises(HFCheckpointError, match="the output would replace a file the conversion reads") as e:
            convert(d, **kw)
        assert "got the input " in e.value.one_line()
    with pytest.raises(HFCheckpointError, match="the centroid sidecar would replace the drafter"):
        convert(d, tmp_path / "o.gguf", centroids_out=tmp_path / "o.gguf")
    assert {f.name: f.read_bytes() for f in d.iterdir()} == before and not (tmp_path / "o.gguf").exists()


def test_cli_convert_and_verify(hf_pair: tuple[Path, Path], converted: dict[str, Path], tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    r = CliRunner().invoke(app, ["convert", str(hf_pair[1]), "--out", str(tmp_path / "d.gguf"),
                                 "--dialect", "fork", "--outtype", "f16"])
    assert r.exit_code == 0, r.output
    assert "gemma4_assistant" in r.output and "51 tensors" in r.output
    for name in ("upstream", "fork"):
        v = CliRunner().invoke(app, ["verify", str(converted[name]), "--target", str(converted["target"]),
                                     "--json"])
        assert v.exit_code == 0, v.output
    r = CliRunner().invoke(app, ["convert", str(tmp_path / "missing"), "--out", str(tmp_path / "z.gguf")])
    assert r.exit_code == 2
    # an existing --out is kept without --overwrite (as quantize and import keep theirs), replaced with it
    before = (tmp_path / "d.gguf").read_bytes()
    r = CliRunner().invoke(app, ["convert", str(hf_pair[1]), "--out", str(tmp_path / "d.gguf")])
    assert r.exit_code == 2 and r.output.strip() == (f"mtpscope: {tmp_path / 'd.gguf'}: '--out': the output exists "
                                                     "(pass --overwrite to replace it) (expected a new file, got an "
                                                     "existing file)"), r.output
    assert (tmp_path / "d.gguf").read_bytes() == before
    r = CliRunner().invoke(app, ["convert", str(hf_pair[1]), "--out", str(tmp_path / "d.gguf"), "--overwrite"])
    assert r.exit_code == 0 and (tmp_path / "d.gguf").read_bytes() != before   # the upstream dialect now, f32


@pytest.mark.llama
def test_converted_pair_loads_in_llama_cpp(converted: dict[str, Path]) -> None:
    pytest.importorskip("llama_cpp")
    from mtpscope.traces.run.llama import model as lm

    tm = lm.LlamaModel(converted["target"])
    dm = lm.LlamaModel(converted["upstream"])
    try:
        assert tm.n_layer == 6 and tm.n_embd == 64 and tm.n_vocab == 4096
        assert dm.n_layer_nextn == 4 and dm.n_embd == 48 and dm.n_embd_inp == 64
        tctx = lm.LlamaContext(tm, n_ctx=256, n_batch=32)
        dctx = lm.LlamaContext(dm, n_ctx=256, n_batch=8, mtp_of=tctx, masked=True)
        dctx.close()
        tctx.close()
    finally:
        dm.close()
        tm.close()


def _bf16_copy(src: Path, dst: Path) -> dict[str, np.ndarray]:
    """``src`` (an F32 checkpoint folder) copied to ``dst`` with every float tensor stored as BF16 (each value's top 16
    bits), written by hand; returns the BF16 values widened back to float32 by numpy bit shifts (the reference)."""
    import shutil
    import struct

    shutil.copytree(src, dst)
    raw = (src / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n])
    body, hdr, want, off = [], {}, {}, 0
    for name, e in h.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        data = raw[8 + n + b:8 + n + end]
        if e["dtype"] == "F32":
            bits = (np.frombuffer(data, "<u4") >> 16).astype("<u2")
            want[name] = (bits.astype(np.uint32) << 16).view(np.float32).reshape(e["shape"])
            data, e = bits.tobytes(), {**e, "dtype": "BF16"}
        hdr[name] = {**e, "data_offsets": [off, off + len(data)]}
        body.append(data)
        off += len(data)
    js = json.dumps(hdr).encode()
    js += b" " * (-len(js) % 8)
    (dst / "model.safetensors").write_bytes(struct.pack("<Q", len(js)) + js + b"".join(body))
    return want


@pytest.mark.parametrize("outtype", ["q8_0", "bf16", "f16", "f32"])
def test_a_bf16_target_converts_block_by_block_to_gguf_pys_bytes(hf_pair: tuple[Path, Path], tmp_path: Path,
                                                                   outtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A BF16 checkpoint converted in blocks of 1000 values (many blocks per tensor, rows cut at block edges) writes
    each tensor with exactly the bytes gguf-py's own ``quants.quantize`` gives the whole tensor widened to float32:
    blocks of whole rows change nothing."""
    import gguf

    import mtpscope.inspector.convert_common as cc
    from mtpscope.inspector.hf_names import target_gguf_name

    monkeypatch.setattr(cc, "WRITE_BLOCK_ELEMENTS", 1000)
    want = _bf16_copy(hf_pair[0], tmp_path / "bf16")
    out = convert(tmp_path / "bf16", tmp_path / "t.gguf", outtype=outtype)
    got = {t.name: t for t in gguf.GGUFReader(out.out).tensors}
    q = gguf.GGMLQuantizationType
    checked = 0
    for name, a in want.items():
        g = target_gguf_name(name)
        if g is None or g.endswith("layer_output_scale.weight"):
            continue
        t = {"q8_0": q.Q8_0, "bf16": q.BF16, "f16": q.F16, "f32": q.F32}[outtype] if a.ndim >= 2 else q.F32
        if t == q.Q8_0 and a.shape[-1] % 32:
            t = q.F16
        assert got[g].tensor_type == t, g
        ref = gguf.quants.quantize(a, t) if t not in (q.F32, q.F16) else a.astype(np.float16 if t == q.F16 else np.float32)
        assert np.asarray(got[g].data).tobytes() == np.ascontiguousarray(ref).tobytes(), g
        checked += 1
    assert checked >= 40


def test_a_streamed_tensor_holds_one_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Converting a BF16 tensor of 4M values (16 MiB widened) to Q8_0 in blocks of 65536 values allocates at most a
    few blocks' worth (tracemalloc), not the widened tensor, and gives gguf-py's bytes for the whole tensor."""
    import tracemalloc

    import gguf

    import mtpscope.inspector.convert_common as cc
    from mtpscope.inspector.safetensors import lazy_tensors, read_safetensors_header

    monkeypatch.setattr(cc, "WRITE_BLOCK_ELEMENTS", 65536)
    rng = np.random.default_rng(0)
    bits = (rng.standard_normal((4096, 1024), dtype=np.float32).view(np.uint32) >> 16).astype("<u2")
    hdr = json.dumps({"w": {"dtype": "BF16", "shape": [4096, 1024], "data_offsets": [0, bits.nbytes]}}).encode()
    p = tmp_path / "w.safetensors"
    p.write_bytes(len(hdr).to_bytes(8, "little") + hdr + bits.tobytes())
    lazy = lazy_tensors(read_safetensors_header(p).values())
    st = cc.tensor_values(lazy, "q8_0")["w"]
    with open(tmp_path / "w.bin", "wb") as f:
        tracemalloc.start()
        try:
            st.tofile(f)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 4 * 65536 * 4, peak           # the widened tensor: 16 MiB; a block: 256 KiB of float32
    whole = (bits.astype(np.uint32) << 16).view(np.float32)
    assert (tmp_path / "w.bin").read_bytes() == gguf.quants.quantize(whole, gguf.GGMLQuantizationType.Q8_0).tobytes()
    assert st.nbytes == 4096 * 1024 // 32 * 34


def test_vocab_from_copies_a_tokenizer_of_the_right_size_and_refuses_the_rest(
        hf_pair: tuple[Path, Path], converted: dict[str, Path], tmp_path: Path) -> None:
    """``--vocab-from``: a GGUF whose tokenizer has the checkpoint's vocab_size gives its tokens (compared with
    gguf-py's reader); one with no tokenizer says so (before: "got None"); one of another size names both sizes."""
    from gguf import GGUFReader

    out = convert(hf_pair[1], tmp_path / "d.gguf", vocab_from=converted["target"])
    src, got = GGUFReader(converted["target"]), GGUFReader(out.out)
    toks = src.fields["tokenizer.ggml.tokens"]
    assert [bytes(toks.parts[i]) for i in toks.data] == [bytes(got.fields["tokenizer.ggml.tokens"].parts[i])
                                                          for i in got.fields["tokenizer.ggml.tokens"].data]
    bare = write_gguf_bare(tmp_path / "bare.gguf")
    with pytest.raises(LayoutError, match=r"the file has no tokenizer to copy \(expected 4096 tokens, got no such key\)"):
        convert(hf_pair[1], tmp_path / "e.gguf", vocab_from=bare)
    with pytest.raises(LayoutError, match=r"tokenizer size differs from the checkpoint's vocab_size \(expected 4096, "
                                          r"got 262144\)"):
        from mtpscope.cache import vocab_path

        convert(hf_pair[1], tmp_path / "f.gguf", vocab_from=vocab_path())
    assert not (tmp_path / "e.gguf").exists() and not (tmp_path / "f.gguf").exists()


def write_gguf_bare(path: Path) -> Path:
    """A GGUF with an architecture, one tensor and no tokenizer keys (gguf-py's writer)."""
    import gguf

    w = gguf.GGUFWriter(str(path), "gemma4")
    w.add_tensor("x.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
