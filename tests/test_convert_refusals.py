"""``convert`` (and ``estimate`` on an HF folder) refuse a bad checkpoint in one line, before anything is written.

Each case is the tiny random drafter of :func:`inspector.convert.write_tiny_pair` (4 layers [s, s, s, f], hidden 48,
2 heads, head dims 32 / 64, backbone 64, 4096 tokens, 64 centroids, top-k 4; tensors F32, the ordering I64), or its
target (6 layers [s, s, f, s, s, f], hidden 64), with one defect: config.json edited, or the safetensors header rewritten with the data bytes kept (the same defects as the
break31 report's ``hfmut.py``). Before these checks every one of them was converted (exit 0) into a GGUF ``verify``
rejects, converted with a value silently replaced by a default, or stopped with an internal error (exit 3).
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from mtpscope.cli.main import app
from mtpscope.errors import HFCheckpointError
from mtpscope.inspector.convert import convert, write_tiny_pair
from mtpscope.inspector.hf_checkpoint import INDEX_NAME

Q = "model.layers.0.self_attn.q_proj.weight"
EMBED = "model.embed_tokens.weight"
ORDER = "masked_embedding.token_ordering"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_tiny_pair(tmp_path_factory.mktemp("hf"), seed=5, centroids=True, vocab_size=4096)


@pytest.fixture(scope="module")
def good(pair: tuple[Path, Path]) -> Path:
    return pair[1]


def _header(p: Path) -> tuple[dict[str, Any], bytes]:
    raw = p.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write_header(p: Path, h: dict[str, Any], data: bytes) -> None:
    b = json.dumps(h).encode()
    b += b" " * ((8 - len(b) % 8) % 8)
    p.write_bytes(struct.pack("<Q", len(b)) + b + data)


def mutant(good: Path, tmp: Path, cfg: Callable[[dict[str, Any]], Any] | None = None,
           hdr: Callable[[dict[str, Any]], Any] | None = None,
           data: Callable[[dict[str, Any], bytearray], Any] | None = None) -> Path:
    """A copy of the good drafter with ``cfg(config)`` / ``hdr(header)`` / ``data(header, bytes)`` applied."""
    d = tmp / "hf"
    shutil.copytree(good, d)
    if cfg is not None:
        c = json.loads((d / "config.json").read_text())
        cfg(c)
        (d / "config.json").write_text(json.dumps(c))
    if hdr is not None or data is not None:
        h, body = _header(d / "model.safetensors")
        buf = bytearray(body)
        if hdr is not None:
            hdr(h)
        if data is not None:
            data(h, buf)
        _write_header(d / "model.safetensors", h, bytes(buf))
    return d


def tc(k: str, v: Any) -> Callable[[dict[str, Any]], None]:
    return lambda c: c["text_config"].__setitem__(k, v)


def top(k: str, v: Any) -> Callable[[dict[str, Any]], None]:
    return lambda c: c.__setitem__(k, v)


def rope(layer_type: str, k: str, v: Any) -> Callable[[dict[str, Any]], None]:
    return lambda c: c["text_config"]["rope_parameters"][layer_type].__setitem__(k, v)


def set_entry(name: str, **kw: Any) -> Callable[[dict[str, Any]], None]:
    return lambda h: h[name].update(kw)


def _drop(name: str) -> Callable[[dict[str, Any]], None]:
    return lambda h: h.pop(name)


def _transpose(name: str) -> Callable[[dict[str, Any]], None]:
    return lambda h: h[name].update(shape=list(reversed(h[name]["shape"])))


def _extra_layer(h: dict[str, Any]) -> None:
    h["model.layers.9.self_attn.q_proj.weight"] = dict(h[Q])


def _embed_same_bytes(h: dict[str, Any]) -> None:
    rows, cols = h[EMBED]["shape"]
    h[EMBED]["shape"] = [rows // 2, cols * 2]


def _ordering_repeats(h: dict[str, Any], buf: bytearray) -> None:
    b = h[ORDER]["data_offsets"][0]
    buf[b:b + 8] = buf[b + 8:b + 16]          # ordering[0] = ordering[1]: one id twice, one never


def _nan_in_norm(h: dict[str, Any], buf: bytearray) -> None:
    b = h["model.norm.weight"]["data_offsets"][0]
    buf[b:b + 4] = np.array([np.nan], np.float32).tobytes()


# (case id, config edit, header edit, data edit, dialect, key named, words of the message)
TENSOR_CASES = [
    ("missing", None, _drop(Q), None, "upstream", Q, "required tensor missing"),
    ("transposed_same_bytes", None, _transpose(Q), None, "upstream", Q, "stored transposed"),
    ("embed_shape", None, _embed_same_bytes, None, "upstream", EMBED, "shape disagrees"),
    ("int_weight", None, set_entry(Q, dtype="I32"), None, "upstream", Q, "not a floating-point type"),
    ("extra_layer", None, _extra_layer, None, "fork", "model.layers.9.self_attn.q_proj.weight",
     "past num_hidden_layers"),
    ("ordering_float", None, set_entry(ORDER, dtype="F64"), None, "fork", ORDER, "not an integer type"),
    ("layer_scale_missing_upstream", None, _drop("model.layers.2.layer_scalar"), None, "upstream",
     "model.layers.2.layer_scalar", "required tensor missing"),
    ("ordering_not_permutation", None, None, _ordering_repeats, "fork", ORDER, "not a permutation"),
    ("nan", None, None, _nan_in_norm, "upstream", "model.norm.weight", "NaN or Inf"),
    ("vocab_vs_embedding", tc("vocab_size", 2048), None, None, "upstream", EMBED, "shape disagrees"),
    ("backbone_vs_projections", top("backbone_hidden_size", 100), None, None, "upstream",
     ("pre_projection.weight", "post_projection.weight"), "shape disagrees"),
]

CONFIG_CASES = [
    ("head_dim0", tc("head_dim", 0), "head_dim", "out of range", "got 0"),
    ("eps_nan", tc("rms_norm_eps", float("nan")), "rms_norm_eps", "out of range", "got nan"),
    ("centroids0", top("num_centroids", 0), "num_centroids", "out of range", "got 0"),
    ("centroids_not_divisor", top("num_centroids", 100), "num_centroids", "not a multiple", "got 100"),
    ("top_k_big", top("centroid_intermediate_top_k", 100), "centroid_intermediate_top_k", "out of range",
     "num_centroids"),
    ("window0", tc("sliding_window", 0), "sliding_window", "out of range", "got 0"),
    ("window_neg", tc("sliding_window", -5), "sliding_window", "out of range", "got -5"),
    ("theta_swa_neg", rope("sliding_attention", "rope_theta", -1.0), "rope_parameters.sliding_attention.rope_theta",
     "out of range", "got -1.0"),
    ("theta_full0", rope("full_attention", "rope_theta", 0), "rope_parameters.full_attention.rope_theta",
     "out of range", "got 0"),
    ("theta_str", rope("full_attention", "rope_theta", "1e6"), "rope_parameters.full_attention.rope_theta",
     "not a number", "got str '1e6'"),
    ("rotary_factor_big", rope("full_attention", "partial_rotary_factor", 2.0),
     "rope_parameters.full_attention.partial_rotary_factor", "out of range", "got 2.0"),
    ("rope_str", tc("rope_parameters", "fast"), "rope_parameters", "not an object", "got str 'fast'"),
    ("rope_flat", tc("rope_parameters", {"rope_type": "default", "rope_theta": 1e4}), "rope_parameters.rope_type",
     "not a layer type", "got 'rope_type'"),
    ("layer_type_unknown", tc("layer_types", ["sliding_attention"] * 3 + ["banana"]), "layer_types[3]",
     "unknown layer type", "got str 'banana'"),
    ("backbone_str", top("backbone_hidden_size", "x"), "backbone_hidden_size", "not an integer",
     "expected int, got str 'x'"),
    ("backbone_missing", lambda c: c.pop("backbone_hidden_size"), "backbone_hidden_size", "missing", "got nothing"),
    ("hidden_str", tc("hidden_size", "48"), "hidden_size", "not an integer", "expected int, got str '48'"),
    ("layers_neg", tc("num_hidden_layers", -1), "num_hidden_layers", "out of range", "got -1"),
    ("layers_past_llama_max", tc("num_hidden_layers", 513), "num_hidden_layers", "out of range", "LLAMA_MAX_LAYERS"),
    ("context_past_u32", tc("max_position_embeddings", 2**32), "max_position_embeddings", "out of range", "uint32"),
    ("text_config_list", top("text_config", [1]), "text_config", "not an object", "got list [1]"),
    ("k_eq_v_str", tc("attention_k_eq_v", "false"), "attention_k_eq_v", "not a boolean", "got str 'false'"),
    ("ordered_str", top("use_ordered_embeddings", "yes"), "use_ordered_embeddings", "not a boolean", "got str 'yes'"),
    ("softcap_str", tc("final_logit_softcapping", "x"), "final_logit_softcapping", "not a finite number",
     "got str 'x'"),
]


@pytest.mark.parametrize("case", TENSOR_CASES, ids=[c[0] for c in TENSOR_CASES])
def test_tensor_defects_refused_before_writing(good: Path, tmp_path: Path, case: tuple[Any, ...]) -> None:
    _, cfg, hdr, data, dialect, key, words = case
    d = mutant(good, tmp_path, cfg, hdr, data)
    out = tmp_path / "out.gguf"
    with pytest.raises(HFCheckpointError) as ei:
        convert(d, out, dialect=dialect)
    e = ei.value
    assert e.key in (key if isinstance(key, tuple) else (key,)), e.one_line()
    assert words in e.message, e.one_line()
    assert e.path is not None and Path(e.path).parent == d and "\n" not in e.one_line()
    assert not out.exists() and not list(tmp_path.glob("out.gguf*"))


def test_tensor_messages_say_expected_and_actual(good: Path, tmp_path: Path) -> None:
    e = _refusal(mutant(good, tmp_path, hdr=_transpose(Q)), tmp_path)
    assert e.expected == "[64, 48] = (num_attention_heads·head_dim, hidden_size)" and e.actual == [48, 64]
    assert e.path == str(tmp_path / "hf" / "model.safetensors")
    e = _refusal(mutant(good, tmp_path / "2", cfg=tc("vocab_size", 2048)), tmp_path / "2")
    assert e.expected == "[2048, 48] = (vocab_size, hidden_size)" and e.actual == [4096, 48]


def _refusal(d: Path, tmp: Path, dialect: str = "upstream") -> HFCheckpointError:
    with pytest.raises(HFCheckpointError) as ei:
        convert(d, tmp / "out.gguf", dialect=dialect)
    return ei.value


def test_layer_scale_is_optional_in_the_fork_and_a_head_left_out_is_still_checked(good: Path, tmp_path: Path) -> None:
    """The fork loads a drafter without ``layer_output_scale`` (upstream requires it); the upstream dialect does not
    write the centroid head, yet a broken one is still refused (the checkpoint is not the model its config says)."""
    from mtpscope.inspector import layouts as L
    from mtpscope.inspector.gguf import open_gguf
    from mtpscope.inspector.hf_config import hparams_from_config

    d = mutant(good, tmp_path, hdr=_drop("model.layers.2.layer_scalar"))
    r = convert(d, tmp_path / "fork.gguf", dialect="fork")
    layout = {e.name: e for e in L.expected_drafter_layout(hparams_from_config(json.loads(
        (d / "config.json").read_text()), "fork"), "fork")}
    assert not layout["blk.2.layer_output_scale.weight"].required
    with open_gguf(tmp_path / "fork.gguf") as f:
        names = {t.name for t in f.tensors}
    assert names == set(layout) - {"blk.2.layer_output_scale.weight"} and r.n_tensors == len(layout) - 1
    d2 = mutant(good, tmp_path / "2", hdr=set_entry(ORDER, dtype="F64"))
    assert "not an integer type" in _refusal(d2, tmp_path / "2").message


@pytest.mark.parametrize("case", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_config_defects_refused_naming_the_field(good: Path, tmp_path: Path, case: tuple[Any, ...]) -> None:
    _, cfg, key, words, tail = case
    d = mutant(good, tmp_path, cfg=cfg)
    for dialect in ("upstream", "fork"):
        with pytest.raises(HFCheckpointError) as ei:
            convert(d, tmp_path / "out.gguf", dialect=dialect)
        e = ei.value
        assert e.key == key and words in e.message and tail in e.one_line(), e.one_line()
        assert e.path == str(d / "config.json")
    assert not list(tmp_path.glob("out.gguf*"))


def test_cli_one_line_exit_2_and_an_existing_out_kept(good: Path, tmp_path: Path) -> None:
    """The cases that were internal errors (exit 3) or wrote a broken file: one stderr line, exit 2, the previous
    ``--out`` byte for byte."""
    out = tmp_path / "keep.gguf"
    out.write_bytes(b"previous conversion")
    for i, (cfg, hdr) in enumerate([(top("backbone_hidden_size", "x"), None), (tc("sliding_window", -5), None),
                                    (None, _transpose(Q)), (None, _extra_layer)]):
        d = mutant(good, tmp_path / str(i), cfg=cfg, hdr=hdr)
        r = CliRunner().invoke(app, ["convert", str(d), "--out", str(out), "--dialect", "fork", "--overwrite"])
        assert r.exit_code == 2, r.output
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"mtpscope: {d}/") and "internal error" not in r.output
        assert out.read_bytes() == b"previous conversion"
        assert not list(tmp_path.glob("keep.gguf.*"))


def test_index_weight_map_not_an_object(good: Path, tmp_path: Path) -> None:
    d = mutant(good, tmp_path)
    (d / INDEX_NAME).write_text('{"weight_map": 5}')
    e = _refusal(d, tmp_path)
    assert e.key == "weight_map" and e.expected.startswith("object") and e.actual == "int 5"
    assert "TypeError" not in e.one_line()


def _sharded(good: Path, tmp: Path) -> Path:
    """The good drafter as a two-shard checkpoint whose second shard is missing."""
    d = mutant(good, tmp)
    h, _ = _header(d / "model.safetensors")
    (d / "model.safetensors").rename(d / "model-00001-of-00002.safetensors")
    wm = {k: f"model-0000{1 + i % 2}-of-00002.safetensors" for i, k in enumerate(h) if k != "__metadata__"}
    (d / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return d


def test_estimate_plans_a_folder_whose_index_names_absent_shards(good: Path, tmp_path: Path) -> None:
    """A planning folder (``hf download --include "*.json"``: config.json and the index, no shard) is what
    ``estimate`` plans from before any download: its plan is the one of config.json alone. The shards the index
    names are required where they are read (``convert``); a malformed index is still refused."""
    target = Path(__file__).resolve().parent.parent / "sample_configs" / "gemma-4-E2B-it"
    d = _sharded(good, tmp_path)
    for p in d.glob("*.safetensors"):
        p.unlink()                                    # config.json + model.safetensors.index.json only
    alone = tmp_path / "config_only"
    alone.mkdir()
    shutil.copy(d / "config.json", alone / "config.json")
    plan = CliRunner().invoke(app, ["estimate", "--target", str(target), "--assistant", str(d)])
    ref = CliRunner().invoke(app, ["estimate", "--target", str(target), "--assistant", str(alone)])
    assert plan.exit_code == ref.exit_code == 0, plan.output + ref.output
    assert plan.output.replace(str(d), "DIR") == ref.output.replace(str(alone), "DIR")
    conv = CliRunner().invoke(app, ["convert", str(d), "--out", str(tmp_path / "o.gguf")])
    assert conv.exit_code == 2, conv.output
    assert conv.output.strip() == (f"mtpscope: {d / 'model-00001-of-00002.safetensors'}: shard named by "
                                   f"{INDEX_NAME} is missing")
    (d / INDEX_NAME).write_text('{"weight_map": 5}')
    r = CliRunner().invoke(app, ["estimate", "--target", str(target), "--assistant", str(d)])
    assert r.exit_code == 2 and "'weight_map'" in r.output and "got int 5" in r.output, r.output


def test_estimate_and_convert_say_the_same_of_a_text_config_list(good: Path, tmp_path: Path) -> None:
    d = mutant(good, tmp_path, cfg=top("text_config", [1]))
    target = Path(__file__).resolve().parent.parent / "sample_configs" / "gemma-4-E2B-it"
    est = CliRunner().invoke(app, ["estimate", "--target", str(target), "--assistant", str(d)])
    conv = CliRunner().invoke(app, ["convert", str(d), "--out", str(tmp_path / "o.gguf")])
    assert est.exit_code == conv.exit_code == 2
    assert est.output == conv.output == (f"mtpscope: {d / 'config.json'}: 'text_config': text_config is not an "
                                         "object (expected object, got list [1])\n")


TQ = "model.layers.2.self_attn.q_proj.weight"          # a full-attention layer of the target: [2 * 64, 64]


def _target_extra(name: str, shape: list[int]) -> Callable[[dict[str, Any]], None]:
    def f(h: dict[str, Any]) -> None:
        src = h["model.norm.weight"]
        n = 1
        for x in shape:
            n *= x
        b = src["data_offsets"][0]
        h[name] = {"dtype": "F32", "shape": shape, "data_offsets": [b, b + 4 * n]}
    return f


TARGET_CASES = [
    ("missing", None, _drop(TQ), None, TQ, "required tensor missing"),
    ("transposed_same_bytes", None, _transpose(TQ), None, TQ, "stored transposed"),
    ("int_weight", None, set_entry(TQ, dtype="I32"), None, TQ, "not a floating-point type"),
    ("extra_layer", None, lambda h: h.__setitem__("model.layers.9.self_attn.q_proj.weight", dict(h[TQ])), None,
     "model.layers.9.self_attn.q_proj.weight", "past num_hidden_layers"),
    ("moe_not_enabled", None, _target_extra("model.layers.0.router.scale", [64]), None, "model.layers.0.router.scale",
     "does not have"),
    ("vocab_vs_embedding", lambda c: c.__setitem__("vocab_size", 2048), None, None, EMBED, "shape disagrees"),
    ("nan", None, None, _nan_in_norm, "model.norm.weight", "NaN or Inf"),
]


@pytest.mark.parametrize("case", TARGET_CASES, ids=[c[0] for c in TARGET_CASES])
def test_target_tensor_defects_refused_before_writing(pair: tuple[Path, Path], tmp_path: Path,
                                                      case: tuple[Any, ...]) -> None:
    _, cfg, hdr, data, key, words = case
    d = mutant(pair[0], tmp_path, cfg, hdr, data)
    out = tmp_path / "out.gguf"
    with pytest.raises(HFCheckpointError) as ei:
        convert(d, out)
    e = ei.value
    assert e.key == key and words in e.message, e.one_line()
    assert e.path == str(d / "model.safetensors") and "\n" not in e.one_line()
    assert not list(tmp_path.glob("out.gguf*"))


def test_target_shape_message_in_config_terms(pair: tuple[Path, Path], tmp_path: Path) -> None:
    e = _refusal(mutant(pair[0], tmp_path, hdr=_transpose(TQ)), tmp_path)
    assert e.expected == "[128, 64] = (num_attention_heads·global_head_dim, hidden_size)" and e.actual == [64, 128]
    e = _refusal(mutant(pair[0], tmp_path / "2", cfg=lambda c: c.__setitem__("sliding_window", 0)), tmp_path / "2")
    assert e.key == "sliding_window" and "out of range" in e.message


def test_target_headers_are_checked_before_any_tensor_data_is_read(pair: tuple[Path, Path], tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A target whose defect the headers show (a tensor stored transposed) is refused without mapping a byte of
    tensor data; a good one maps each tensor it writes once (and reads it a block at a time)."""
    import mtpscope.inspector.safetensors as st

    reads: list[str] = []
    real = st._view

    def counting(t: Any, mm: Any) -> Any:
        reads.append(t.name)
        return real(t, mm)

    monkeypatch.setattr(st, "_view", counting)
    d = mutant(pair[0], tmp_path, hdr=_transpose(TQ))
    assert "stored transposed" in _refusal(d, tmp_path).message
    assert reads == []
    r = convert(pair[0], tmp_path / "good.gguf")
    h, _ = _header(pair[0] / "model.safetensors")
    written = sorted(k for k in h if k != "__metadata__" and k != "lm_head.weight")
    assert sorted(reads) == written and r.n_tensors == len(written) + 1     # + rope_freqs, generated


@pytest.mark.parametrize("shape", [(300_007,), (301, 1013), (5, 3, 40_000), (3, 70_000)])
def test_nonfinite_values_counted_in_bounded_chunks(shape: tuple[int, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    """``refuse_nonfinite`` counts every NaN / Inf, also at the chunk edges and in rows longer than a chunk, while
    the mask it holds at once stays one chunk's (a whole-tensor mask of the 31B embedding is 1.4 GB)."""
    import tracemalloc

    import mtpscope.inspector.convert_common as cc

    chunk = 4096
    monkeypatch.setattr(cc, "NONFINITE_CHUNK_ELEMENTS", chunk, raising=False)   # (absent before the chunks)
    a = np.ones(shape, np.float32)
    flat = a.reshape(-1)
    for i, v in zip((0, chunk - 1, chunk, 2 * chunk + 7, flat.size - 1), (np.nan, np.inf, -np.inf, np.nan, np.nan),
                    strict=True):
        flat[i] = v
    want = int(np.isnan(a).sum() + np.isinf(a).sum())
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        with pytest.raises(HFCheckpointError) as ei:
            cc.refuse_nonfinite("t", a, "f.safetensors")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ei.value.actual == f"{want} non-finite values" and ei.value.key == "t"
    assert peak < a.size // 8, peak        # a whole-tensor mask is a.size bytes
    cc.refuse_nonfinite("t", np.ones(shape, np.float32), "f.safetensors")   # all finite: nothing raised


def _add_copy(name: str, src: str) -> Callable[[dict[str, Any]], None]:
    return lambda h: h.__setitem__(name, dict(h[src]))


SCALE = "model.layers.2.layer_scalar"
#: (defect, drafter header edit, target header edit, the tensor named)
SHARED_DEFECTS = [
    ("transposed", _transpose(Q), _transpose(TQ), None),
    ("int_dtype", set_entry(Q, dtype="I32"), set_entry(TQ, dtype="I32"), None),
    ("past_layers", _add_copy("model.layers.9.input_layernorm.weight", "model.layers.0.input_layernorm.weight"),
     _add_copy("model.layers.9.input_layernorm.weight", "model.layers.0.input_layernorm.weight"),
     "model.layers.9.input_layernorm.weight"),
    ("missing", _drop(Q), _drop(TQ), None),
    ("unknown_name", _add_copy("model.layers.0.banana.weight", "model.layers.0.input_layernorm.weight"),
     _add_copy("model.layers.0.banana.weight", "model.layers.0.input_layernorm.weight"),
     "model.layers.0.banana.weight"),
    ("one_value_scale_as_matrix", set_entry(SCALE, shape=[1, 1]), set_entry(SCALE, shape=[1, 1]), SCALE),
]


@pytest.mark.parametrize("case", SHARED_DEFECTS, ids=[c[0] for c in SHARED_DEFECTS])
def test_drafter_and_target_refuse_a_tensor_defect_alike(pair: tuple[Path, Path], tmp_path: Path,
                                                         case: tuple[Any, ...]) -> None:
    """One check of a checkpoint's tensors against its config's layout: the same defect in a drafter and in a target
    is refused with the same words (a layer scale of one value stored as a [1, 1] matrix too: transformers' is a
    [1] buffer, and the layout's ne is (1,))."""
    _, d_edit, t_edit, named = case
    e_d = _refusal(mutant(pair[1], tmp_path / "d", hdr=d_edit), tmp_path / "d")
    e_t = _refusal(mutant(pair[0], tmp_path / "t", hdr=t_edit), tmp_path / "t")
    assert e_d.message == e_t.message, (e_d.one_line(), e_t.one_line())
    assert e_d.key == (named or Q) and e_t.key == (named or TQ)
    if case[0] == "one_value_scale_as_matrix":
        assert e_d.message == "tensor shape disagrees with config.json" and e_d.actual == e_t.actual == [1, 1]
