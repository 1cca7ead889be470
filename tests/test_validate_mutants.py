"""Mutant drafter / target files and the findings ``verify`` must report for each.

Files are the demo's tiny pair (mtpscope/demo.py: drafter n_embd 128, backbone 64, 4 layers [s,s,s,f],
n_head 2, n_head_kv 1, head dims 32 / 64, n_ff 128) with the first 4096 real Gemma 4 tokens, written
with gguf-py's GGUFWriter (an independent writer), then mutated one defect at a time. Expected values in
the assertions are computed by hand from those dimensions.

The builder functions here (``parts``, ``write``, ``MUTANTS``) are also used by tests/test_loadability.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mtpscope import demo
from mtpscope.demo_vocab import (
    GGUF_ARRAY, GGUF_BOOL, GGUF_STRING, GGUF_UINT32, MetaValue,
)

DIMS = demo.DEFAULT_DIMS
N_VOCAB = 4096
N_C = 32          # demo default for a 4096-token vocabulary
VSC = N_VOCAB // N_C  # 128


def U32(v: int) -> MetaValue:
    return MetaValue(GGUF_UINT32, v)


@functools.lru_cache(maxsize=None)
def _base(kind: str) -> tuple[str, tuple[tuple[str, MetaValue], ...], tuple[tuple[str, np.ndarray], ...]]:
    voc = demo.load_vocab("subset")
    tw = demo.target_weights(voc, DIMS, 0)
    if kind == "target":
        kv = demo._hparam_kv(demo.TARGET_ARCH, DIMS, target=True, n_vocab=voc.n_vocab) + list(voc.kv)
        return demo.TARGET_ARCH, tuple(kv), tuple(tw.items())
    w = demo.drafter_weights(tw, DIMS)
    if kind == "upstream":
        arch = demo.UPSTREAM_ARCH
        kv = demo._hparam_kv(arch, DIMS, target=False, n_vocab=voc.n_vocab)
        kv += [(arch + ".embedding_length_out", U32(DIMS.n_embd_backbone)),
               (arch + ".nextn_predict_layers", U32(DIMS.n_layer_drafter))]
        return arch, tuple(kv + list(voc.kv)), tuple(w.items())
    arch = demo.FORK_ARCH
    cent, ordering, _ = demo.centroid_head(tw, voc, DIMS, n_centroids=N_C, seed=0)
    fw = demo.fork_weights(w)
    fw["mtp.centroids.weight"] = cent
    fw["mtp.token_ordering.weight"] = ordering
    kv = demo._hparam_kv(arch, DIMS, target=False, n_vocab=voc.n_vocab)
    kv += [(arch + ".n_embd_backbone", U32(DIMS.n_embd_backbone)), (arch + ".n_centroids", U32(N_C)),
           (arch + ".centroid_top_k", U32(8)), (arch + ".use_ordered_embeddings", MetaValue(GGUF_BOOL, True)),
           (arch + ".requires_target_arch", MetaValue(GGUF_STRING, "gemma4"))]
    return arch, tuple(kv + list(voc.kv)), tuple(fw.items())


def parts(kind: str) -> tuple[str, dict[str, MetaValue], dict[str, Any]]:
    """(arch, kv dict, tensors dict) of a valid ``target`` / ``upstream`` / ``fork`` file; fresh copies."""
    arch, kv, tensors = _base(kind)
    return arch, dict(kv), {k: v.copy() for k, v in tensors}


def write(path: Path, arch: str | None, kv: dict[str, MetaValue], tensors: dict[str, Any]) -> Path:
    """Write with gguf-py's GGUFWriter. A tensor value may be ``(raw_bytes_array, GGMLQuantizationType)``."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch or "x")
    if arch is None:
        w.kv_data[0].pop("general.architecture", None)
    for key, mv in kv.items():
        vtype = gguf.GGUFValueType(mv.type)
        if mv.type == GGUF_ARRAY:
            val = mv.value.tolist() if isinstance(mv.value, np.ndarray) else list(mv.value)
            w.add_key_value(key, val, vtype, sub_type=gguf.GGUFValueType(mv.sub_type))
        else:
            w.add_key_value(key, mv.value, vtype)
    for name, arr in tensors.items():
        if isinstance(arr, tuple):
            w.add_tensor(name, arr[0], raw_dtype=arr[1])
        else:
            w.add_tensor(name, np.ascontiguousarray(arr))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def q8_0(a: np.ndarray) -> tuple[np.ndarray, Any]:
    import gguf
    from gguf import quants

    t = gguf.GGMLQuantizationType.Q8_0
    return quants.quantize(a.astype(np.float32), t), t


# --- the mutants: name -> (kind, mutation returning a new arch or None) -----------------------------

Mut = Callable[[dict[str, MetaValue], dict[str, Any]], "str | None"]
UP = demo.UPSTREAM_ARCH
FK = demo.FORK_ARCH


def _set(key: str, value: MetaValue) -> Mut:
    def f(kv: dict[str, MetaValue], t: dict[str, Any]) -> None:
        kv[key] = value
    return f


def _drop_keys(*keys: str) -> Mut:
    def f(kv: dict[str, MetaValue], t: dict[str, Any]) -> None:
        for k in keys:
            del kv[k]
    return f


def _drop_tensors(*names: str) -> Mut:
    def f(kv: dict[str, MetaValue], t: dict[str, Any]) -> None:
        for n in names:
            del t[n]
    return f


def _add_tensor(name: str, arr: np.ndarray) -> Mut:
    def f(kv: dict[str, MetaValue], t: dict[str, Any]) -> None:
        t[name] = arr
    return f


def _map_tensor(name: str, fn: Callable[[Any], Any]) -> Mut:
    def f(kv: dict[str, MetaValue], t: dict[str, Any]) -> None:
        t[name] = fn(t[name])
    return f


def _rename(old: str, new: str) -> Mut:
    def f(kv: dict[str, MetaValue], t: dict[str, Any]) -> None:
        t[new] = t.pop(old)
    return f


def _arch(new: str) -> Mut:
    def f(kv: dict[str, MetaValue], t: dict[str, Any]) -> str:
        old = next(k.split(".")[0] for k in kv if k.endswith(".block_count"))
        for k in [k for k in kv if k.startswith(old + ".")]:
            kv[new + k[len(old):]] = kv.pop(k)
        return new
    return f


def _chain(*fs: Mut) -> Mut:
    def f(kv: dict[str, MetaValue], t: dict[str, Any]) -> str | None:
        arch = None
        for g in fs:
            arch = g(kv, t) or arch
        return arch
    return f


def _masked(kv: dict[str, MetaValue], t: dict[str, Any]) -> None:
    _, _, fork_t = parts("fork")
    t["masked_embd_centroids.weight"] = fork_t["mtp.centroids.weight"]
    t["masked_embd_ordering"] = fork_t["mtp.token_ordering.weight"]


def _quantize_matrices(kv: dict[str, MetaValue], t: dict[str, Any]) -> None:
    for n in list(t):
        if n.endswith(("attn_q.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight",
                       "ffn_down.weight")):
            t[n] = q8_0(t[n])


def _truncate_vocab_rows(kv: dict[str, MetaValue], t: dict[str, Any]) -> None:
    t["token_embd.weight"] = t["token_embd.weight"][:4000].copy()


def _drop_tokenizer_merges(kv: dict[str, MetaValue], t: dict[str, Any]) -> None:
    del kv["tokenizer.ggml.merges"]


def _ne(shape: tuple[int, ...]) -> list[int]:
    return list(reversed(shape))


# name: (kind, mutation or None, upstream loads in llama-cpp-python 0.3.36 (checked by test_loadability))
MUTANTS: dict[str, tuple[str, Mut | None, bool]] = {
    "valid_upstream": ("upstream", None, True),
    "valid_fork": ("fork", None, False),
    "valid_target": ("target", None, True),
    "up_q8_0_matrices": ("upstream", _quantize_matrices, True),
    "up_extra_metadata_key": ("upstream", _set("mtpscope.test.extra", U32(7)), True),
    "up_norm_f16": ("upstream", _map_tensor("blk.0.attn_norm.weight", lambda a: a.astype(np.float16)), True),
    "up_masked_embd": ("upstream", _masked, False),
    "up_missing_layer_scale": ("upstream", _drop_tensors("blk.1.layer_output_scale.weight"), False),
    "up_missing_rope_freqs": ("upstream", _drop_tensors("rope_freqs.weight"), False),
    "up_missing_ffn_up": ("upstream", _drop_tensors("blk.2.ffn_up.weight"), False),
    "up_pre_proj_backbone_96": ("upstream", _add_tensor("nextn.pre_projection.weight",
                                                         np.zeros((128, 192), np.float32)), False),
    "up_post_proj_transposed": ("upstream", _map_tensor("nextn.post_projection.weight", lambda a: a.T.copy()), False),
    "up_out_equals_embd": ("upstream", _set(UP + ".embedding_length_out", U32(128)), False),
    "up_no_embedding_length_out": ("upstream", _drop_keys(UP + ".embedding_length_out"), False),
    "up_no_nextn": ("upstream", _drop_keys(UP + ".nextn_predict_layers"), False),
    "up_extra_attn_k": ("upstream", _add_tensor("blk.0.attn_k.weight", np.zeros((32, 128), np.float32)), False),
    "up_fork_projection_names": ("upstream", _chain(_rename("nextn.pre_projection.weight", "mtp.pre_projection.weight"),
                                                    _rename("nextn.post_projection.weight",
                                                            "mtp.post_projection.weight")), False),
    "up_value_length_swa_16": ("upstream", _set(UP + ".attention.value_length_swa", U32(16)), False),
    "up_n_ff_256": ("upstream", _set(UP + ".feed_forward_length", U32(256)), False),
    "up_vocab_rows_4000": ("upstream", _truncate_vocab_rows, False),
    "up_no_merges": ("upstream", _drop_tokenizer_merges, False),
    "up_no_swa_pattern": ("upstream", _drop_keys(UP + ".attention.sliding_window_pattern"), False),
    "up_nonfinite_norm": ("upstream", _map_tensor("blk.1.ffn_norm.weight",
                                                  lambda a: np.where(np.arange(a.size) == 3, np.nan, a)
                                                  .astype(np.float32)), True),
    "up_as_fork_arch": ("upstream", _arch(FK), False),
    "up_embedding_length_string": ("upstream", _set(UP + ".embedding_length", MetaValue(GGUF_STRING, "128")), False),
    "up_head_count_kv_array": ("upstream", _set(UP + ".attention.head_count_kv",
                                                MetaValue(GGUF_ARRAY, np.array([1, 1, 1, 2], np.uint32),
                                                          GGUF_UINT32)), True),
    "up_head_count_array_wrong": ("upstream", _set(UP + ".attention.head_count",
                                                   MetaValue(GGUF_ARRAY, np.array([2, 2, 2, 4], np.uint32),
                                                             GGUF_UINT32)), False),
    "up_head_count_array_short": ("upstream", _set(UP + ".attention.head_count",
                                                   MetaValue(GGUF_ARRAY, np.array([2, 2, 2], np.uint32),
                                                             GGUF_UINT32)), False),
    "target_no_per_layer_key": ("target", _drop_keys("gemma4.embedding_length_per_layer_input"), False),
    "target_missing_attn_k": ("target", _drop_tensors("blk.1.attn_k.weight"), False),
    "target_no_attn_v": ("target", _drop_tensors("blk.0.attn_v.weight", "blk.1.attn_v.weight"), True),
}


def build(tmp_path: Path, name: str) -> Path:
    """Write mutant ``name`` of :data:`MUTANTS` into ``tmp_path``."""
    kind, fn, _ = MUTANTS[name]
    arch, kv, t = parts(kind)
    if fn is not None:
        arch = fn(kv, t) or arch
    return write(tmp_path / f"{name}.gguf", arch, kv, t)


def verify_kind(tmp_path: Path, kind: str, fn: Mut | None = None, name: str = "m.gguf", **kw: Any):
    from mtpscope.inspector.validate import verify

    arch, kv, t = parts(kind)
    if fn is not None:
        arch = fn(kv, t) or arch
    return verify(write(tmp_path / name, arch, kv, t), **kw)


def one(report: Any, code: str) -> Any:
    hits = [f for f in report.findings if f.code == code]
    assert len(hits) == 1, (code, [(f.code, f.subject) for f in report.findings])
    return hits[0]


def errors(report: Any) -> set[str]:
    return {f.code for f in report.findings if f.severity == "error"}


# --- valid files ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["upstream", "fork", "target"])
def test_valid_files_have_no_errors_or_warnings(tmp_path: Path, kind: str) -> None:
    r = verify_kind(tmp_path, kind)
    assert r.ok, [(f.code, f.message) for f in r.errors]
    assert not r.warnings, [(f.code, f.message) for f in r.warnings]
    assert r.dialect == kind
    d = r.to_dict()
    assert {"dialect", "ok", "findings", "loadability"} <= d.keys()


# --- projections, layers, tensors ------------------------------------------------------------------------

def test_pre_projection_of_wrong_backbone_width(tmp_path: Path) -> None:
    # numpy (128, 192) = ne [192, 128]: a backbone of 96, while embedding_length_out says 64 -> ne [128, 128]
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_pre_proj_backbone_96"][1])
    f = one(r, "E_PROJ_SHAPE")
    assert f.subject == "nextn.pre_projection.weight"
    assert f.expected == [128, 128] and f.actual == [192, 128]
    assert "96" in f.message and not r.ok


def test_post_projection_transposed(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_post_proj_transposed"][1])
    f = one(r, "E_PROJ_SHAPE")
    assert (f.subject, f.expected, f.actual) == ("nextn.post_projection.weight", [128, 64], [64, 128])


def test_missing_tensor_and_incomplete_layer(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_missing_ffn_up"][1])
    f = one(r, "E_TENSOR_MISSING")
    assert f.subject == "blk.2.ffn_up.weight" and f.expected == [128, 128]
    g = one(r, "E_LAYER_INCOMPLETE")
    assert (g.subject, g.expected, g.actual) == ("blk.2", 11, 10)


def test_layer_output_scale_required_upstream_optional_in_fork(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", _drop_tensors("blk.1.layer_output_scale.weight"))
    assert one(r, "E_TENSOR_MISSING").subject == "blk.1.layer_output_scale.weight"
    r = verify_kind(tmp_path, "fork", _drop_tensors("blk.1.layer_output_scale.weight"), name="f.gguf")
    assert r.ok
    assert one(r, "I_TENSOR_OPTIONAL_ABSENT").subject == "blk.1.layer_output_scale.weight"


def test_unexpected_kv_tensor_in_drafter(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_extra_attn_k"][1])
    f = one(r, "E_TENSOR_UNEXPECTED")
    assert f.subject == "blk.0.attn_k.weight" and "no K/V" in f.message


def test_fork_names_in_upstream_file_are_explained(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_fork_projection_names"][1])
    missing = {f.subject for f in r.findings if f.code == "E_TENSOR_MISSING"}
    assert missing == {"nextn.pre_projection.weight", "nextn.post_projection.weight"}
    unexpected = [f for f in r.findings if f.code == "E_TENSOR_UNEXPECTED"]
    assert {f.subject for f in unexpected} == {"mtp.pre_projection.weight", "mtp.post_projection.weight"}
    assert all("fork's name" in f.message for f in unexpected)


def test_block_beyond_block_count(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", _add_tensor("blk.4.attn_norm.weight", np.ones(128, np.float32)))
    f = one(r, "E_TENSOR_UNEXPECTED")
    assert f.subject == "blk.4.attn_norm.weight" and "beyond block_count = 4" in f.message


def test_wrong_n_ff_shapes(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_n_ff_256"][1])
    shapes = {f.subject: (f.expected, f.actual) for f in r.findings if f.code == "E_TENSOR_SHAPE"}
    assert len(shapes) == 12  # gate, up, down in each of 4 layers
    assert shapes["blk.0.ffn_gate.weight"] == ([128, 256], [128, 128])
    assert shapes["blk.3.ffn_down.weight"] == ([256, 128], [128, 128])


def test_duplicate_tensor_name_is_unreadable(tmp_path: Path) -> None:
    from mtpscope.errors import GGUFFormatError
    from mtpscope.inspector.validate import verify

    arch, kv, t = parts("upstream")
    t["zzz.0.attn_norm.weight"] = t["blk.0.attn_norm.weight"].copy()   # same name length as blk.0.attn_norm
    p = write(tmp_path / "dup.gguf", arch, kv, t)
    data = bytearray(p.read_bytes())
    i = data.find(b"zzz.0.attn_norm.weight")
    data[i:i + 3] = b"blk"
    p.write_bytes(bytes(data))
    with pytest.raises(GGUFFormatError) as e:
        verify(p)
    assert "blk.0.attn_norm.weight" in str(e.value)


# --- dtypes and values ----------------------------------------------------------------------------------

def test_vector_not_f32_is_a_warning(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_norm_f16"][1])
    f = one(r, "W_DTYPE_VECTOR")
    assert (f.subject, f.expected, f.actual) == ("blk.0.attn_norm.weight", "F32", "F16")
    assert r.ok


def test_quantized_matrices_are_fine(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_q8_0_matrices"][1])
    assert r.ok and not r.warnings


def test_integer_matrix_is_an_error(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", _map_tensor("blk.0.attn_q.weight", lambda a: a.astype(np.int32)))
    f = one(r, "E_DTYPE")
    assert f.subject == "blk.0.attn_q.weight" and f.actual == "I32"


def test_nonfinite_value(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_nonfinite_norm"][1])
    f = one(r, "E_NONFINITE")
    assert f.subject == "blk.1.ffn_norm.weight" and f.actual == 1 and "index 3" in f.message


def test_rope_freqs_values(tmp_path: Path) -> None:
    # head_dim_full 64 -> 32 entries; partial factor 0.25 -> 64 * 0.25 / 2 = 8 rotated pairs
    r = verify_kind(tmp_path, "upstream", _add_tensor("rope_freqs.weight", np.ones(32, np.float32)))
    f = one(r, "W_ROPE_FREQS_ROTATED")
    assert (f.expected, f.actual) == (8, 32)
    bad = np.array([1.0] * 8 + [1e30] * 24, np.float32)
    bad[20] = 1.0
    r = verify_kind(tmp_path, "upstream", _add_tensor("rope_freqs.weight", bad), name="b.gguf")
    assert one(r, "E_ROPE_FREQS_VALUES").subject == "rope_freqs.weight"
    r = verify_kind(tmp_path, "upstream", _add_tensor("rope_freqs.weight", np.ones(16, np.float32)), name="c.gguf")
    assert (one(r, "E_TENSOR_SHAPE").expected, one(r, "E_TENSOR_SHAPE").actual) == ([32], [16])


# --- keys ---------------------------------------------------------------------------------------------

def test_backbone_equal_to_n_embd(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_out_equals_embd"][1])
    f = one(r, "E_BACKBONE_EQUALS_NEMBD")
    assert f.actual == 128
    # the projections are then wrong too: pre expects ne [256, 128]
    assert any(x.code == "E_PROJ_SHAPE" and x.expected == [256, 128] for x in r.findings)


def test_missing_backbone_key(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_no_embedding_length_out"][1])
    assert any(f.code == "E_KEY_MISSING" and f.subject == UP + ".embedding_length_out" for f in r.findings)
    assert not r.ok


def test_nextn_predict_layers(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", _set(UP + ".nextn_predict_layers", U32(3)))
    f = one(r, "E_NEXTN_LAYERS")
    assert (f.expected, f.actual) == (4, 3)


def test_head_dims_k_v_differ(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_value_length_swa_16"][1])
    f = one(r, "E_HEAD_DIM_KV")
    assert (f.expected, f.actual) == (32, 16)


def test_sliding_window_pattern(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", _set(UP + ".attention.sliding_window_pattern",
                                               MetaValue(GGUF_ARRAY, [True, True, True], GGUF_BOOL)))
    f = one(r, "E_SWA_PATTERN")
    assert f.expected == "4 bools" and f.actual == "3 values"
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_no_swa_pattern"][1], name="b.gguf")
    assert one(r, "E_SWA_PATTERN").actual is None


# --- tokenizer ------------------------------------------------------------------------------------------

def test_vocab_rows_differ_from_tokenizer(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_vocab_rows_4000"][1])
    f = one(r, "E_VOCAB_SIZE")
    assert (f.expected, f.actual) == (4096, 4000)
    assert one(r, "E_TOKEN_EMBD_SHAPE").expected == [128, 4096]


def test_no_tokenizer(tmp_path: Path) -> None:
    def drop(kv: dict[str, MetaValue], t: dict[str, Any]) -> None:
        for k in [k for k in kv if k.startswith("tokenizer.")]:
            del kv[k]
    r = verify_kind(tmp_path, "upstream", drop)
    assert one(r, "E_TOKENIZER_MISSING").subject == "tokenizer.ggml.tokens"
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_no_merges"][1], name="b.gguf")
    assert one(r, "E_TOKENIZER_MISSING").subject == "tokenizer.ggml.merges"


def test_tokenizer_array_lengths(tmp_path: Path) -> None:
    def cut(kv: dict[str, MetaValue], t: dict[str, Any]) -> None:
        mv = kv["tokenizer.ggml.scores"]
        kv["tokenizer.ggml.scores"] = MetaValue(mv.type, np.asarray(mv.value)[:4000], mv.sub_type)
    r = verify_kind(tmp_path, "upstream", cut)
    f = one(r, "E_TOKENIZER_LENGTHS")
    assert (f.subject, f.expected, f.actual) == ("tokenizer.ggml.scores", 4096, 4000)


# --- centroid head (fork) ------------------------------------------------------------------------------

def test_centroids_transposed(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "fork", _map_tensor("mtp.centroids.weight", lambda a: a.T.copy()))
    f = one(r, "E_CENTROID_TRANSPOSED")
    assert (f.expected, f.actual) == ([128, N_C], [N_C, 128])


def test_ordering_not_i32(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "fork", _map_tensor("mtp.token_ordering.weight", lambda a: a.astype(np.float32)))
    f = one(r, "E_ORDERING_TYPE")
    assert (f.expected, f.actual) == ("I32", "F32")


def test_ordering_all_zero(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "fork", _map_tensor("mtp.token_ordering.weight", lambda a: np.zeros_like(a)))
    assert one(r, "E_ORDERING_ZERO").subject == "mtp.token_ordering.weight"


def test_ordering_not_a_permutation(tmp_path: Path) -> None:
    def dup(a: np.ndarray) -> np.ndarray:
        a = a.copy()
        a[6] = a[5]          # both in row 0 (ids 0..127 of the ordering)
        return a
    r = verify_kind(tmp_path, "fork", _map_tensor("mtp.token_ordering.weight", dup))
    f = one(r, "E_ORDERING_NOT_PERMUTATION")
    assert f.actual == {"ids_missing": 1, "ids_repeated": 1}
    g = one(r, "E_CLUSTER_SIZE")
    assert g.expected == VSC and g.actual["centroids_wrong_size"] == 1 and g.actual["first"] == [0]


def test_ordering_out_of_range(tmp_path: Path) -> None:
    def oob(a: np.ndarray) -> np.ndarray:
        a = a.copy()
        a[200] = N_VOCAB + 5
        return a
    r = verify_kind(tmp_path, "fork", _map_tensor("mtp.token_ordering.weight", oob))
    assert one(r, "E_ORDERING_RANGE").actual == 1
    assert one(r, "E_CLUSTER_SIZE").actual["first"] == [1]   # index 200 is in row 200 // 128 = 1


def test_ordering_length(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "fork", _map_tensor("mtp.token_ordering.weight", lambda a: a[:4000].copy()))
    assert any(f.code == "E_TENSOR_SHAPE" and f.expected == [4096] and f.actual == [4000] for f in r.findings)
    assert one(r, "E_ORDERING_LENGTH").actual == 4000


def test_n_vocab_not_multiple_of_n_centroids(tmp_path: Path) -> None:
    def thirty(kv: dict[str, MetaValue], t: dict[str, Any]) -> None:
        kv[FK + ".n_centroids"] = U32(30)
        t["mtp.centroids.weight"] = t["mtp.centroids.weight"][:30].copy()
    r = verify_kind(tmp_path, "fork", thirty)
    f = one(r, "E_CENTROID_DIVISIBILITY")
    assert f.actual == 30


def test_centroids_present_but_unused(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "fork", _set(FK + ".use_ordered_embeddings", MetaValue(GGUF_BOOL, False)))
    hits = {f.subject for f in r.findings if f.code == "W_CENTROIDS_UNUSED"}
    assert hits == {"mtp.centroids.weight", "mtp.token_ordering.weight"}
    assert r.ok


def test_top_k_above_n_centroids(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "fork", _set(FK + ".centroid_top_k", U32(64)))
    assert one(r, "E_TOP_K").actual == 64


def test_masked_embd_in_upstream_file(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_masked_embd"][1])
    subj = {f.subject for f in r.findings if f.code == "E_MASKED_EMBD_UPSTREAM"}
    assert subj == {"masked_embd_centroids.weight", "masked_embd_ordering"}


# --- architecture --------------------------------------------------------------------------------------

def test_foreign_drafter_arch(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", _arch("gemma4_mtp"))
    assert r.dialect == "other"
    assert one(r, "W_ARCH_FOREIGN_DRAFTER").actual == "gemma4_mtp"
    assert [v.loads for v in r.loadability] == [False, False]


def test_no_arch(tmp_path: Path) -> None:
    from mtpscope.inspector.validate import verify

    arch, kv, t = parts("upstream")
    r = verify(write(tmp_path / "n.gguf", None, kv, t))
    assert one(r, "E_ARCH_MISSING") and r.dialect == "unknown" and not r.ok


def test_missing_n_centroids_key(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "fork", _drop_keys(FK + ".n_centroids"))
    assert any(f.code == "E_KEY_MISSING" and f.subject == FK + ".n_centroids" for f in r.findings)
    assert "E_CENTROID_SHAPE" not in r.codes()      # the width falls back to the matrix's ne[1] = 32


def test_unrelated_arch(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", _arch("llama"))
    assert one(r, "W_ARCH_FOREIGN_DRAFTER").actual == "llama"     # nextn.* tensors: still drafter-like
    r = verify_kind(tmp_path, "upstream", _chain(_arch("llama"), _drop_tensors(
        "nextn.pre_projection.weight", "nextn.post_projection.weight")), name="l.gguf")
    assert one(r, "W_ARCH_NOT_ASSISTANT").actual == "llama"
    assert r.dialect == "unknown"
    up = r.loadability[0]
    assert up.loads is None and "no load rules" in up.reasons[0]


def test_per_layer_head_count_array(tmp_path: Path) -> None:
    # head_count [2, 2, 2, 4]: layer 3 (full, head dim 64) expects attn_q ne [128, 4 * 64] = [128, 256]
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_head_count_array_wrong"][1])
    shapes = {f.subject: (f.expected, f.actual) for f in r.findings if f.code == "E_TENSOR_SHAPE"}
    assert shapes == {"blk.3.attn_q.weight": ([128, 256], [128, 128]),
                      "blk.3.attn_output.weight": ([256, 128], [128, 128])}


def test_key_of_wrong_type(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_embedding_length_string"][1])
    f = one(r, "E_KEY_VALUE")
    assert f.subject == UP + ".embedding_length" and f.actual == "'128'"
    assert r.loadability[0].loads is False and "wrong type" in r.loadability[0].reasons[0]


def test_names_from_other_converters_are_explained(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "fork", _rename("mtp.pre_projection.weight", "mtp_pre_proj.weight"))
    f = one(r, "E_TENSOR_UNEXPECTED")
    assert f.subject == "mtp_pre_proj.weight" and "mtp.pre_projection" in f.message
    assert one(r, "E_TENSOR_MISSING").subject == "mtp.pre_projection.weight"


def test_per_layer_array_of_the_wrong_length(tmp_path: Path) -> None:
    """llama.cpp's get_key_or_arr refuses an array whose length is not block_count; so do we, by key."""
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_head_count_array_short"][1])
    f = next(x for x in r.findings if x.subject.endswith(".attention.head_count"))
    assert (f.severity, f.code, f.actual) == ("error", "E_KEY_VALUE", 3)
    assert not r.ok
