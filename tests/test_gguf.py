"""Our GGUF reader against gguf-py's GGUFReader (the oracle) and against hand-computed values."""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFEndian, GGUFReader, quants
from gguf import GGUFValueType as V

from mtpscope.errors import InspectorError, LayoutError, TensorDataError, UnsupportedFileError
from mtpscope.inspector import ArrayValue, KeyValue, TensorInfo, open_gguf
from mtpscope.inspector.ggml_types import GGML_TYPES, type_info
from tests.gguf_oracle import assert_parity

# ------------------------------------------------------------------------------------ oracle helpers


# ----------------------------------------------------------------------------------- the real file


@pytest.fixture(scope="module")
def vocab_oracle(vocab_gguf: Path) -> GGUFReader:
    """GGUFReader on the real tokenizer (~20-30 s: computed once per module)."""
    return GGUFReader(vocab_gguf)


@pytest.mark.slow
def test_parity_real_tokenizer(vocab_gguf: Path, vocab_oracle: GGUFReader) -> None:
    f = open_gguf(vocab_gguf)
    n = assert_parity(f, vocab_oracle)
    assert n > 1_000_000  # 262144 tokens + scores + types + 514906 merges


def test_real_tokenizer_known_values(vocab_gguf: Path) -> None:
    # numbers from the facts file (section 1, 6): 262144 tokens, 514906 merges, model "gemma4",
    # the 26B-A4B target's hparams (n_embd 2816, 30 layers), 15,776,467 bytes, no tensors
    f = open_gguf(vocab_gguf)
    assert f.file_size == 15_776_467
    assert f.version == 3 and f.alignment == 32
    assert f.architecture == "gemma4"
    assert f.get("gemma4.embedding_length") == 2816
    assert f.get("gemma4.block_count") == 30
    assert f.get("tokenizer.ggml.model") == "gemma4"
    tokens = f.get("tokenizer.ggml.tokens")
    assert isinstance(tokens, ArrayValue) and tokens.element_type_name == "STRING"
    assert len(tokens) == 262144
    assert len(f.get("tokenizer.ggml.merges")) == 514906
    assert f.tensors == ()
    # special ids point at the special tokens
    assert tokens[f.get("tokenizer.ggml.bos_token_id")] == "<bos>"
    assert tokens[f.get("tokenizer.ggml.eos_token_id")] == "<eos>"
    assert tokens[f.get("tokenizer.ggml.padding_token_id")] == "<pad>"
    assert tokens[-1] == tokens[262143]
    scores = f.get("tokenizer.ggml.scores").to_numpy()
    assert scores.dtype == np.dtype("<f4") and scores.shape == (262144,)
    assert not scores.flags.writeable  # a view of the read-only map, not a copy
    swa = f.get("gemma4.attention.sliding_window_pattern")
    assert swa.element_type_name == "BOOL" and len(swa) == 30
    assert swa.to_numpy().dtype == np.bool_


# ---------------------------------------------------------------------------- generated: every type

ALL_TYPES_KV = [
    ("t.u8", 255, V.UINT8), ("t.i8", -128, V.INT8), ("t.u16", 65535, V.UINT16), ("t.i16", -32768, V.INT16),
    ("t.u32", 2**32 - 1, V.UINT32), ("t.i32", -(2**31), V.INT32), ("t.f32", 0.1, V.FLOAT32),
    ("t.bool_t", True, V.BOOL), ("t.bool_f", False, V.BOOL), ("t.str", "héllo ▁ 🙂", V.STRING),
    ("t.str_empty", "", V.STRING), ("t.u64", 2**64 - 1, V.UINT64), ("t.i64", -(2**63), V.INT64),
    ("t.f64", -1.5e300, V.FLOAT64), ("t.f32_nan", float("nan"), V.FLOAT32),
    ("t.f32_inf", float("-inf"), V.FLOAT32),
    ("a.u8", [0, 1, 255], V.ARRAY, V.UINT8), ("a.i8", [-1, 2], V.ARRAY, V.INT8),
    ("a.u16", [1, 65535], V.ARRAY, V.UINT16), ("a.i16", [-5, 5], V.ARRAY, V.INT16),
    ("a.u32", [7, 2**32 - 1], V.ARRAY, V.UINT32), ("a.i32", [-7, 8, 9], V.ARRAY, V.INT32),
    ("a.f32", [0.5, -2.25, 1e-7], V.ARRAY, V.FLOAT32), ("a.bool", [True, False, True], V.ARRAY, V.BOOL),
    ("a.str", ["a", "", "ünï", "x" * 300], V.ARRAY, V.STRING), ("a.u64", [2**64 - 1, 0], V.ARRAY, V.UINT64),
    ("a.i64", [-(2**63), 2**63 - 1], V.ARRAY, V.INT64), ("a.f64", [1.0 / 3, 2.5], V.ARRAY, V.FLOAT64),
    ("a.nested", [[1, 2], [3], [4, 5, 6]], V.ARRAY, V.ARRAY),
    ("a.nested_str", [["ab", "c"], ["d"]], V.ARRAY, V.ARRAY),
]


@pytest.fixture
def all_types_file(write_gguf: Any) -> Path:
    return write_gguf("all.gguf", "gemma4", ALL_TYPES_KV)


def test_parity_every_value_type(all_types_file: Path) -> None:
    f = open_gguf(all_types_file)
    assert_parity(f, GGUFReader(all_types_file))
    assert len(f.kv) == len(ALL_TYPES_KV) + 1  # + general.architecture


def test_values_by_hand(all_types_file: Path) -> None:
    f = open_gguf(all_types_file)
    assert f.get("t.u64") == 2**64 - 1 and f.get("t.i64") == -(2**63)
    assert f.get("t.f32") == struct.unpack("<f", struct.pack("<f", 0.1))[0]  # float32 rounding
    assert f.get("t.bool_t") is True and f.get("t.bool_f") is False
    assert f.get("t.str") == "héllo ▁ 🙂" and f.get("t.str_empty") == ""
    assert math.isnan(f.get("t.f32_nan")) and f.get("t.f32_inf") == float("-inf")
    assert f.get("missing", 7) == 7
    kv = f.kv["t.u16"]
    assert isinstance(kv, KeyValue) and kv.type_name == "UINT16" and kv.value_type == 2
    a = f.get("a.str")
    assert a.to_list() == ["a", "", "ünï", "x" * 300]
    assert a[1:] == ["", "ünï", "x" * 300] and a[-1] == "x" * 300 and a[::2] == ["a", "ünï"]
    assert list(a) == a.to_list()
    with pytest.raises(IndexError):
        a[4]
    with pytest.raises(LayoutError):
        a.to_numpy()
    n = f.get("a.nested")
    assert n.element_type_name == "ARRAY" and len(n) == 3
    assert n.to_list() == [[1, 2], [3], [4, 5, 6]] and n[2][1] == 5
    assert f.get("a.nested_str").to_list() == [["ab", "c"], ["d"]]
    i64 = f.get("a.i64").to_numpy()
    assert i64.dtype == np.dtype("<i8") and i64.tolist() == [-(2**63), 2**63 - 1]
    assert f.get("a.bool").to_numpy().tolist() == [True, False, True]
    # the array's offset is its element-type field: the u32 there is the element type
    raw = all_types_file.read_bytes()
    arr = f.get("a.u16")
    assert struct.unpack_from("<IQ", raw, arr.offset) == (V.UINT16, 2)
    assert struct.unpack_from("<2H", raw, arr.data_offset) == (1, 65535)


def test_version_2_reads_like_3(all_types_file: Path, tmp_path: Path) -> None:
    data = bytearray(all_types_file.read_bytes())
    struct.pack_into("<I", data, 4, 2)
    p = tmp_path / "v2.gguf"
    p.write_bytes(bytes(data))
    f = open_gguf(p)
    assert f.version == 2
    assert_parity(f, GGUFReader(p))


def test_big_endian_refused(write_gguf: Any) -> None:
    p = write_gguf("be.gguf", "gemma4", [("k", 1, V.UINT32)], endianess=GGUFEndian.BIG)
    assert p.read_bytes()[4:8] == b"\x00\x00\x00\x03"
    with pytest.raises(UnsupportedFileError, match="big-endian") as e:
        open_gguf(p)
    assert e.value.offset == 4 and str(p) in str(e.value)


# ------------------------------------------------------------------------- generated: tensors


def _tensor_file(write_gguf: Any) -> tuple[Path, dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 64)).astype(np.float32)
    x3 = rng.standard_normal((3, 4, 32)).astype(np.float32)
    src = {"w.f32": x, "w.f16": x, "w.bf16": x, "w.q8_0": x, "w.q4_0": x, "w3.q8_0": x3,
           "v.q8_0": x[0], "i.i32": np.arange(-3, 9, dtype=np.int32), "d.f64": x[:2].astype(np.float64)}
    tensors = [
        ("w.f32", x), ("w.f16", x.astype(np.float16)),
        ("w.bf16", quants.quantize(x, Q.BF16), Q.BF16),
        ("w.q8_0", quants.quantize(x, Q.Q8_0), Q.Q8_0),
        ("w.q4_0", quants.quantize(x, Q.Q4_0), Q.Q4_0),
        ("w3.q8_0", quants.quantize(x3, Q.Q8_0), Q.Q8_0),
        ("v.q8_0", quants.quantize(x[0], Q.Q8_0), Q.Q8_0),
        ("i.i32", src["i.i32"]), ("d.f64", src["d.f64"]),
    ]
    return write_gguf("tensors.gguf", "gemma4", [("general.alignment", 64, V.UINT32)], tensors), src


def test_parity_quantized_tensors(write_gguf: Any) -> None:
    p, _ = _tensor_file(write_gguf)
    f = open_gguf(p)
    assert f.alignment == 64
    assert_parity(f, GGUFReader(p))


def test_tensor_records_by_hand(write_gguf: Any) -> None:
    p, _ = _tensor_file(write_gguf)
    f = open_gguf(p)
    t = f.tensor("w.q8_0")
    assert isinstance(t, TensorInfo)
    assert t.type_name == "Q8_0" and t.ggml_type == 8
    assert t.ne == (64, 6) and t.shape == (6, 64) and t.n_elements == 384
    assert t.n_bytes == 384 // 32 * 34 and t.bits_per_weight == 8.5  # 34-byte blocks of 32
    assert f.tensor("w.q4_0").n_bytes == 384 // 32 * 18 and f.tensor("w.q4_0").bits_per_weight == 4.5
    assert f.tensor("w.bf16").n_bytes == 768 and f.tensor("w.bf16").bits_per_weight == 16.0
    assert f.tensor("w3.q8_0").ne == (32, 4, 3) and f.tensor("w3.q8_0").shape == (3, 4, 32)
    for t in f.tensors:
        assert t.offset % 64 == 0 and t.offset >= f.data_offset and f.data_offset % 64 == 0
    with pytest.raises(LayoutError):
        f.tensor("nope")


def test_tensor_data_values(write_gguf: Any) -> None:
    p, src = _tensor_file(write_gguf)
    f = open_gguf(p)
    x = src["w.f32"]
    assert np.array_equal(f.tensor_data("w.f32"), x)
    assert f.tensor_data("w.f16").dtype == np.float16
    assert np.array_equal(f.tensor_data("w.f16"), x.astype(np.float16))
    assert np.array_equal(f.tensor_data("i.i32"), src["i.i32"])
    assert np.array_equal(f.tensor_data("d.f64"), src["d.f64"])
    # BF16 keeps the top 16 bits (round to nearest even): within 2^-8 relative
    bf = f.tensor_data("w.bf16")
    assert bf.dtype == np.float32 and np.allclose(bf, x, rtol=2**-8, atol=0)
    q8 = f.tensor_data("w.q8_0")
    assert q8.shape == (6, 64) and np.abs(q8 - x).max() < np.abs(x).max() / 127 * 0.51 + 1e-6
    q4 = f.tensor_data("w.q4_0")
    assert np.abs(q4 - x).max() < np.abs(x).max() / 8 * 1.01
    # row slices equal the same rows of the whole tensor, for every type
    for name in ("w.f32", "w.f16", "w.bf16", "w.q8_0", "w.q4_0", "w3.q8_0", "v.q8_0", "i.i32"):
        whole = f.tensor_data(name)
        assert np.array_equal(f.tensor_data(name, rows=slice(1, 3)), whole[1:3]), name
        assert np.array_equal(f.tensor_data(name, rows=slice(None, None, 2)), whole[::2]), name
        assert np.array_equal(f.tensor_data(name, rows=-1), whole[-1]), name
    raw = f.tensor_data("w.q8_0", rows=slice(2, 4), dequantize=False)
    assert raw.dtype == np.uint8 and raw.shape == (2, 2 * 34)
    assert not f.tensor_data("w.f32").flags.writeable
    assert f.tensor_data("v.q8_0", dequantize=False).shape == (68,)  # 2 blocks of 34 bytes
    with pytest.raises(LayoutError):
        f.tensor_data("v.q8_0", rows=slice(0, 4), dequantize=False)


def test_unknown_ggml_type_kept(write_gguf: Any, tmp_path: Path) -> None:
    x = np.arange(64, dtype=np.float32).reshape(2, 32)
    p = write_gguf("u.gguf", "gemma4", [], [("a", x), ("b", x * 2)])
    data = bytearray(p.read_bytes())
    info_a = GGUFReader(p).tensors[0].field
    type_pos = info_a.offset + 8 + len("a") + 4 + 2 * 8  # name, n_dims, ne[2]
    assert struct.unpack_from("<I", data, type_pos)[0] == 0  # F32, found where we expected it
    struct.pack_into("<I", data, type_pos, 77)
    q = tmp_path / "unknown.gguf"
    q.write_bytes(bytes(data))
    f = open_gguf(q)
    a, b = f.tensors
    assert a.type_name == "unknown type 77" and a.ggml_type == 77
    assert a.n_bytes is None and a.bits_per_weight is None and a.ne == (32, 2)
    assert b.type_name == "F32" and np.array_equal(f.tensor_data("b"), x * 2)
    with pytest.raises(TensorDataError, match="unknown"):
        f.tensor_data("a")


def test_ggml_type_table_matches_gguf_py() -> None:
    from gguf.constants import GGML_QUANT_SIZES

    for qt, (block, size) in GGML_QUANT_SIZES.items():
        t = GGML_TYPES[int(qt)]
        if qt.name == "Q8_1":
            # PyPI gguf 0.19 still has the old float d/s layout (40 bytes); ggml-common.h has
            # static_assert(sizeof(block_q8_1) == 2*sizeof(ggml_half) + QK8_1) = 36. ggml wins.
            assert (t.block_size, t.type_size) == (32, 36)
            continue
        assert (t.name, t.block_size, t.type_size) == (qt.name, block, size)
    assert type_info(1000).name == "unknown type 1000" and type_info(1000).bits_per_weight is None


def test_open_missing_file_is_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        open_gguf(tmp_path / "none.gguf")


def test_errors_are_inspector_errors(tmp_path: Path) -> None:
    p = tmp_path / "e.gguf"
    p.write_bytes(b"")
    with pytest.raises(InspectorError) as e:
        open_gguf(p)
    assert str(p) in str(e.value) and "magic" in str(e.value)


def test_context_manager_closes(all_types_file: Path) -> None:
    with open_gguf(all_types_file) as f:
        assert f.get("t.u8") == 255
