"""HF audit: safetensors headers (our parser vs the safetensors library), sharded index, name mapping,
config vs GGUF keys, what the upstream converter drops. Checkpoints are tiny safetensors files written
with the ``safetensors`` numpy API from the same arrays as the demo drafter GGUFs."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from mtpscope.demo.build import DEFAULT_DIMS as D
from mtpscope.errors import HFCheckpointError
from mtpscope.inspector.gguf import open_gguf
from mtpscope.inspector.hf_audit import audit
from mtpscope.inspector.hf_checkpoint import INDEX_NAME, read_checkpoint
from mtpscope.inspector.hf_config import hparams_from_config, text_hparams
from mtpscope.inspector.hf_names import GENERATED, drop_reason, gguf_name
from mtpscope.inspector.safetensors import read_safetensors, read_safetensors_header, tensor_array
from tests.builders import N_C, hf_tensors, parts, write
from tests.builders import hf_config as config

st = pytest.importorskip("safetensors.numpy")

@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("hf")
    st.save_file(hf_tensors(), str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(config()))
    return d


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("g")
    return {k: write(d / f"{k}.gguf", *parts(k)) for k in ("fork", "upstream")}


def test_header_parser_agrees_with_safetensors(ckpt_dir: Path) -> None:
    from safetensors import safe_open

    ours = read_safetensors_header(ckpt_dir / "model.safetensors")
    with safe_open(str(ckpt_dir / "model.safetensors"), framework="numpy") as f:
        keys = set(f.keys())
        assert set(ours) == keys
        for k in keys:
            sl = f.get_slice(k)
            assert list(ours[k].shape) == list(sl.get_shape()), k
            assert ours[k].dtype == sl.get_dtype(), k
    assert ours["masked_embedding.token_ordering"].dtype == "I64"
    assert ours["pre_projection.weight"].shape == (D.n_embd, 2 * D.n_embd_backbone)     # numpy order
    assert ours["pre_projection.weight"].ne == (2 * D.n_embd_backbone, D.n_embd)         # GGUF ne


def test_bad_headers(tmp_path: Path) -> None:
    p = tmp_path / "x.safetensors"
    p.write_bytes(b"\x01\x02")
    with pytest.raises(HFCheckpointError, match="shorter"):
        read_safetensors_header(p)
    p.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(HFCheckpointError) as e:
        read_safetensors_header(p)
    assert str(p) in str(e.value) and "1000" in str(e.value)
    p.write_bytes(struct.pack("<Q", 5) + b"{nope")
    with pytest.raises(HFCheckpointError, match="JSON"):
        read_safetensors_header(p)
    hdr = json.dumps({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 20]}}).encode()
    p.write_bytes(struct.pack("<Q", len(hdr)) + hdr + b"\0" * 16)
    with pytest.raises(HFCheckpointError) as e:
        read_safetensors_header(p)
    assert e.value.key == "a"


def test_tensor_data_agrees_with_safetensors(ckpt_dir: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    want = load_file(str(ckpt_dir / "model.safetensors"))
    got = read_safetensors(ckpt_dir / "model.safetensors")
    assert list(got) == list(read_safetensors_header(ckpt_dir / "model.safetensors"))
    for k, a in want.items():
        assert got[k].dtype == a.dtype and np.array_equal(got[k], a), k
    assert isinstance(got["pre_projection.weight"].base, np.memmap)          # a view, not a copy
    # BF16 by hand: 1.5 is 0x3FC0, -0.25 is 0xBE80, 3.0 is 0x4040; F8 has no numpy type
    hdr = json.dumps({"b": {"dtype": "BF16", "shape": [1, 3], "data_offsets": [0, 6]},
                      "f8": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [6, 8]}}).encode()
    p = tmp_path / "bf.safetensors"
    p.write_bytes(struct.pack("<Q", len(hdr)) + hdr + np.array([0x3FC0, 0xBE80, 0x4040], "<u2").tobytes() + b"\0\0")
    t = read_safetensors_header(p)
    b = tensor_array(t["b"])
    assert b.dtype == np.float32 and b.tolist() == [[1.5, -0.25, 3.0]]
    with pytest.raises(HFCheckpointError) as e:
        tensor_array(t["f8"])
    assert (e.value.key, e.value.offset, e.value.actual) == ("f8", 8 + len(hdr) + 6, "F8_E4M3")
    assert str(p) in str(e.value)


def test_sharded_index(tmp_path: Path) -> None:
    t = hf_tensors()
    names = sorted(t)
    a, b = names[: len(names) // 2], names[len(names) // 2:]
    st.save_file({k: t[k] for k in a}, str(tmp_path / "model-00001-of-00002.safetensors"))
    st.save_file({k: t[k] for k in b}, str(tmp_path / "model-00002-of-00002.safetensors"))
    wm = dict.fromkeys(a, "model-00001-of-00002.safetensors") | dict.fromkeys(b, "model-00002-of-00002.safetensors")
    (tmp_path / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    ck = read_checkpoint(tmp_path)
    assert set(ck.tensors) == set(t) and len(ck.files) == 2
    assert ck.tensors[b[0]].file.endswith("00002-of-00002.safetensors")
    wm["not.there"] = "model-00001-of-00002.safetensors"
    (tmp_path / INDEX_NAME).write_text(json.dumps({"weight_map": wm}))
    with pytest.raises(HFCheckpointError) as e:
        read_checkpoint(tmp_path)
    assert e.value.key == "not.there"
    del wm["not.there"]
    # shard names must be plain file names of this folder (no other folder is read through an index)
    for bad in (None, 3, "", "../model-00001-of-00002.safetensors", "/etc/hostname", "sub/x.safetensors"):
        (tmp_path / INDEX_NAME).write_text(json.dumps({"weight_map": {**wm, a[0]: bad}}))
        with pytest.raises(HFCheckpointError) as e:
            read_checkpoint(tmp_path)
        assert e.value.key == f"weight_map.{a[0]}" and repr(bad) in str(e.value)


def test_name_mapping() -> None:
    assert gguf_name("pre_projection.weight", "fork") == "mtp.pre_projection.weight"
    assert gguf_name("pre_projection.weight", "upstream") == "nextn.pre_projection.weight"
    assert gguf_name("model.layers.3.mlp.down_proj.weight", "upstream") == "blk.3.ffn_down.weight"
    assert gguf_name("model.layers.0.layer_scalar", "fork") == "blk.0.layer_output_scale.weight"
    assert gguf_name("model.layers.2.pre_feedforward_layernorm.weight", "fork") == "blk.2.ffn_norm.weight"
    assert gguf_name("masked_embedding.centroids.weight", "upstream") is None
    assert "drops" in drop_reason("masked_embedding.token_ordering")
    with pytest.raises(KeyError):
        gguf_name("model.vision_tower.x", "fork")


def test_audit_fork_is_clean(ckpt_dir: Path, ggufs: dict[str, Path]) -> None:
    with open_gguf(ggufs["fork"]) as f:
        a = audit(ckpt_dir, f)
    assert a.dialect == "fork"
    assert {r.status for r in a.rows} == {"ok"}, [(r.hf_name, r.status, r.note) for r in a.rows if r.status != "ok"]
    assert len(a.rows) == 50                                   # 51 GGUF tensors minus generated rope_freqs
    assert dict(a.gguf_only) == {"rope_freqs.weight": GENERATED["rope_freqs.weight"]}
    assert all(v["ok"] for v in a.config.values()), a.config
    assert a.config["gemma4_assistant.n_embd_backbone"] == {"hf": 64, "gguf": 64, "ok": True}
    assert a.config["gemma4_assistant.rope.freq_base"]["ok"] and a.config["gemma4_assistant.rope.freq_base_swa"]["ok"]
    assert a.config["gemma4_assistant.attention.head_count_kv"] == {"hf": [1, 1, 1, 1], "gguf": 1, "ok": True}
    assert not [f for f in a.findings if f.severity != "info"]
    row = next(r for r in a.rows if r.hf_name == "masked_embedding.token_ordering")
    assert (row.hf_dtype, row.found_type, row.gguf_upstream) == ("I64", "I32", None)


def test_audit_upstream_reports_dropped_head(ckpt_dir: Path, ggufs: dict[str, Path]) -> None:
    with open_gguf(ggufs["upstream"]) as f:
        a = audit(ckpt_dir, f)
    dropped = {r.hf_name for r in a.dropped}
    assert dropped == {"masked_embedding.centroids.weight", "masked_embedding.token_ordering"}
    assert all("drops masked_embedding" in r.note for r in a.dropped)
    pre = next(r for r in a.rows if r.hf_name == "pre_projection.weight")
    assert (pre.gguf_name, pre.status, pre.found_ne) == ("nextn.pre_projection.weight", "ok", (128, 128))
    assert a.config["gemma4-assistant.nextn_predict_layers"]["ok"]


def test_audit_finds_transposed_and_config_mismatch(tmp_path: Path, ckpt_dir: Path) -> None:
    arch, kv, t = parts("fork")
    t["mtp.centroids.weight"] = t["mtp.centroids.weight"].T.copy()
    from tests.builders import U32
    kv["gemma4_assistant.n_embd_backbone"] = U32(96)
    with open_gguf(write(tmp_path / "bad.gguf", arch, kv, t)) as f:
        a = audit(ckpt_dir, f)
    row = next(r for r in a.rows if r.hf_name == "masked_embedding.centroids.weight")
    assert row.status == "shape" and "transposed" in row.note
    assert row.expected_ne == (128, N_C) and row.found_ne == (N_C, 128)
    m = [f for f in a.findings if f.code == "H_CONFIG_MISMATCH"]
    assert [(f.subject, f.expected, f.actual) for f in m] == [("gemma4_assistant.n_embd_backbone", 64, 96)]


def test_verify_with_hf_and_cli_json(ckpt_dir: Path, ggufs: dict[str, Path]) -> None:
    from typer.testing import CliRunner

    from mtpscope.cli.main import app
    from mtpscope.inspector.validate import verify

    r = verify(ggufs["upstream"], hf_dir=ckpt_dir)
    assert r.ok and r.hf_audit is not None and "H_DROPPED" in r.codes()
    res = CliRunner().invoke(app, ["verify", str(ggufs["fork"]), "--hf", str(ckpt_dir), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["hf_audit"]["dialect"] == "fork" and len(d["hf_audit"]["rows"]) == 50
    res = CliRunner().invoke(app, ["verify", str(ggufs["fork"]), "--hf", str(ckpt_dir / "nope")])
    assert res.exit_code == 2


def test_audit_dtype_rules(tmp_path: Path, ckpt_dir: Path) -> None:
    arch, kv, t = parts("fork")
    t["blk.0.ffn_norm.weight"] = t["blk.0.ffn_norm.weight"].astype(np.float16)
    t["mtp.token_ordering.weight"] = t["mtp.token_ordering.weight"].astype(np.int64)
    with open_gguf(write(tmp_path / "dt.gguf", arch, kv, t)) as f:
        a = audit(ckpt_dir, f)
    got = {(x.subject, x.severity, x.expected, x.actual) for x in a.findings if x.code == "H_DTYPE"}
    assert got == {("blk.0.ffn_norm.weight", "warning", "F32", "F16"),
                   ("mtp.token_ordering.weight", "error", "I32", "I64")}
    row = next(r for r in a.rows if r.hf_name == "model.layers.0.self_attn.q_proj.weight")
    assert row.expected_type is None and row.found_type == "F32"


def test_cli_human_audit(ckpt_dir: Path, ggufs: dict[str, Path]) -> None:
    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    res = CliRunner().invoke(app, ["verify", str(ggufs["upstream"]), "--hf", str(ckpt_dir)])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("dropped ")]
    assert len(lines) == 2 and all("drops masked_embedding" in ln for ln in lines)
    assert "gguf-only rope_freqs.weight" in res.stdout


def test_config_rope_and_kv_heads_mismatch(tmp_path: Path, ggufs: dict[str, Path]) -> None:
    cfg = config()
    cfg["text_config"]["rope_parameters"]["sliding_attention"]["rope_theta"] = 5e4
    cfg["text_config"]["num_global_key_value_heads"] = 2
    cfg["text_config"]["attention_k_eq_v"] = True          # transformers reads the global count only then
    st.save_file(hf_tensors(), str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with open_gguf(ggufs["fork"]) as f:
        a = audit(tmp_path, f)
    got = {(x.subject, json.dumps(x.expected), json.dumps(x.actual)) for x in a.findings if x.code == "H_CONFIG_MISMATCH"}
    assert got == {("gemma4_assistant.rope.freq_base_swa", "50000.0", "10000.0"),
                   ("gemma4_assistant.attention.head_count_kv", "[1, 1, 1, 2]", "1")}


def test_per_layer_config_spelling(tmp_path: Path, ggufs: dict[str, Path]) -> None:
    """transformers 5.24 saves the full-layer head dim / KV heads as per_layer_config (hand-written here)."""
    cfg = config()
    tc = cfg["text_config"]
    del tc["global_head_dim"], tc["num_global_key_value_heads"]
    tc["per_layer_config"] = {"3": {"head_dim": D.head_dim, "num_key_value_heads": D.n_head_kv}}
    hp = hparams_from_config(cfg, "fork")
    assert [(ly.head_dim, ly.n_head_kv) for ly in hp.layers] == [(32, 1)] * 3 + [(64, 1)]
    assert hp.head_dim_full == 64 and hp.head_dim_swa == 32
    st.save_file(hf_tensors(), str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with open_gguf(ggufs["fork"]) as f:
        a = audit(tmp_path, f)
    assert [x for x in a.findings if x.severity == "error"] == []
    assert a.config["gemma4_assistant.attention.key_length"] == {"hf": 64, "gguf": 64, "ok": True}
    assert a.config["gemma4_assistant.attention.head_count_kv"]["hf"] == [1, 1, 1, 1]
    # an override that disagrees with the GGUF is reported, per layer
    tc["per_layer_config"] = {"3": {"head_dim": 128, "num_key_value_heads": 2}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with open_gguf(ggufs["fork"]) as f:
        a = audit(tmp_path, f)
    got = {(x.code, x.subject, json.dumps(x.expected)) for x in a.findings if x.severity == "error"}
    assert ("H_CONFIG_MISMATCH", "gemma4_assistant.attention.key_length", "128") in got
    assert ("H_CONFIG_MISMATCH", "gemma4_assistant.attention.head_count_kv", "[1, 1, 1, 2]") in got
    assert ("H_HF_SHAPE", "model.layers.3.self_attn.q_norm.weight", "[128]") in got


def test_text_hparams_reads_like_transformers() -> None:
    """Gemma4TextConfig (transformers 5.24): num_global_key_value_heads only counts with attention_k_eq_v;
    per_layer_config wins; absent global_head_dim is 512."""
    base = {"vocab_size": 16, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 4, "head_dim": 8,
            "layer_types": ["sliding_attention", "full_attention"]}
    assert text_hparams({**base, "num_global_key_value_heads": 1}).n_head_kv == (4, 4)
    hp = text_hparams({**base, "num_global_key_value_heads": 1, "attention_k_eq_v": True})
    assert hp.n_head_kv == (4, 1) and hp.head_dim_full == 512 and "head_dim_full" not in hp.stated
    hp = text_hparams({**base, "per_layer_config": {"1": {"head_dim": 16, "num_key_value_heads": 2}}})
    assert hp.n_head_kv == (4, 2) and hp.head_dim_full == 16 and "head_dim_full" in hp.stated
    with pytest.raises(HFCheckpointError) as e:
        text_hparams({**base, "per_layer_config": {"5": {"head_dim": 16}}})
    assert e.value.key == "per_layer_config.5"
    with pytest.raises(HFCheckpointError) as e:
        text_hparams({k: v for k, v in base.items() if k != "hidden_size"})
    assert e.value.key == "hidden_size"


SAMPLES = Path(__file__).resolve().parents[1] / "sample_configs"


@pytest.mark.parametrize("variant,n_bb,n_embd,n_head,kv,n_ff,ordered", [
    # facts §2 table: n_bb, drafter hidden, heads, kv heads (sliding / full), n_ff, centroid head
    ("E2B", 1536, 256, 4, (1, 1), 2048, True),
    ("E4B", 2560, 256, 4, (2, 2), 2048, True),
    ("26B-A4B", 2816, 1024, 16, (8, 2), 8192, False),
    ("31B", 5376, 1024, 32, (16, 4), 8192, False),
])
def test_layout_from_published_configs(variant: str, n_bb: int, n_embd: int, n_head: int, kv: tuple[int, int],
                                       n_ff: int, ordered: bool) -> None:
    from mtpscope.inspector import layouts as L

    cfg = json.loads((SAMPLES / f"gemma-4-{variant}-it-assistant" / "config.json").read_text())
    hp = hparams_from_config(cfg, "fork")
    assert [ly.n_head_kv for ly in hp.layers] == [kv[0]] * 3 + [kv[1]]
    lay = {e.name: e.ne for e in L.expected_drafter_layout(hp)}
    assert len(lay) == (51 if ordered else 49)
    assert lay["mtp.pre_projection.weight"] == (2 * n_bb, n_embd)
    assert lay["mtp.post_projection.weight"] == (n_embd, n_bb)
    assert lay["blk.0.attn_q.weight"] == (n_embd, n_head * 256)
    assert lay["blk.3.attn_output.weight"] == (n_head * 512, n_embd)
    assert lay["blk.2.ffn_down.weight"] == (n_ff, n_embd)
    assert lay["token_embd.weight"] == (n_embd, 262144)
    assert lay["rope_freqs.weight"] == (256,)
    if ordered:
        assert lay["mtp.centroids.weight"] == (n_embd, 2048)


def test_hf_shapes_checked_against_config(tmp_path: Path, ggufs: dict[str, Path]) -> None:
    cfg = config()
    cfg["text_config"]["num_attention_heads"] = 4         # the tensors were made with 2 heads
    st.save_file(hf_tensors(), str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with open_gguf(ggufs["fork"]) as f:
        a = audit(tmp_path, f)
    bad = {x.subject: (x.expected, x.actual) for x in a.findings if x.code == "H_HF_SHAPE"}
    assert len(bad) == 8                                  # q_proj and o_proj of 4 layers
    assert bad["model.layers.0.self_attn.q_proj.weight"] == ([4 * 32, 128], [2 * 32, 128])
    assert bad["model.layers.3.self_attn.o_proj.weight"] == ([128, 4 * 64], [128, 2 * 64])
    del cfg["text_config"]["layer_types"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with open_gguf(ggufs["fork"]) as f:
        a = audit(tmp_path, f)
    assert any(x.code == "H_CONFIG_INCOMPLETE" and x.subject == "layer_types" for x in a.findings)


def test_audit_reads_the_assistant_fields_as_the_converter_does(tmp_path: Path, ggufs: dict[str, Path]) -> None:
    """The audit expects of the GGUF what the converter writes from the assistant's own fields: absent
    ``num_centroids`` / ``centroid_intermediate_top_k`` are transformers' Gemma4AssistantConfig defaults (2048, 32),
    which the converter writes; a field the converter refuses (``use_ordered_embeddings: "yes"``) is reported once,
    as the config's error, and expects nothing of the file (it was compared as "yes" against true)."""
    cfg = config()
    del cfg["num_centroids"], cfg["centroid_intermediate_top_k"]
    st.save_file(hf_tensors(), str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with open_gguf(ggufs["fork"]) as f:
        a = audit(tmp_path, f)
    assert a.config["gemma4_assistant.n_centroids"] == {"hf": 2048, "gguf": N_C, "ok": False}    # the file's: N_C
    assert a.config["gemma4_assistant.centroid_top_k"]["hf"] == 32
    cfg = config()
    cfg["use_ordered_embeddings"] = "yes"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with open_gguf(ggufs["fork"]) as f:
        a = audit(tmp_path, f)
    about = [(x.code, x.subject) for x in a.findings if "use_ordered_embeddings" in x.subject]
    assert about == [("H_CONFIG_INCOMPLETE", "use_ordered_embeddings")], about
    assert not any(k.endswith((".use_ordered_embeddings", ".n_centroids", ".centroid_top_k")) for k in a.config)
