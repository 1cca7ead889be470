"""Mutant drafter / target files and the findings ``verify`` must report for each.

Files are the demo's tiny pair (mtpscope/demo/build.py: drafter n_embd 128, backbone 64, 4 layers [s,s,s,f],
n_head 2, n_head_kv 1, head dims 32 / 64, n_ff 128) with the first 4096 real Gemma 4 tokens, written
by the builders of tests/builders.py (``parts``, ``write``, ``MUTANTS``), then mutated one defect at a time.
Expected values in the assertions are computed by hand from those dimensions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.builders import (
    FK,
    GGUF_ARRAY,
    GGUF_BOOL,
    MUTANTS,
    N_C,
    N_VOCAB,
    U32,
    UP,
    VSC,
    MetaValue,
    add_tensor,
    chain,
    drop_keys,
    drop_tensors,
    map_tensor,
    one,
    parts,
    rename,
    set_arch,
    set_key,
    verify_kind,
    write,
)

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
    r = verify_kind(tmp_path, "upstream", drop_tensors("blk.1.layer_output_scale.weight"))
    assert one(r, "E_TENSOR_MISSING").subject == "blk.1.layer_output_scale.weight"
    r = verify_kind(tmp_path, "fork", drop_tensors("blk.1.layer_output_scale.weight"), name="f.gguf")
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
    r = verify_kind(tmp_path, "upstream", add_tensor("blk.4.attn_norm.weight", np.ones(128, np.float32)))
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

def test_vector_not_f32_is_an_error(tmp_path: Path) -> None:
    # llama.cpp loads such a drafter and aborts at its first draft (tests/test_runtime_verdicts.py)
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_norm_f16"][1])
    f = one(r, "E_DTYPE_VECTOR")
    assert (f.subject, f.expected, f.actual) == ("blk.0.attn_norm.weight", "F32", "F16")
    assert not r.ok
    up = r.loadability[0]
    assert up.loads is True and up.outcome == "aborts at first draft"
    assert up.message == "binary_op: unsupported types: dst: f32, src0: f32, src1: f16"


def test_quantized_matrices_are_fine(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_q8_0_matrices"][1])
    assert r.ok and not r.warnings


def test_integer_matrix_is_an_error(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", map_tensor("blk.0.attn_q.weight", lambda a: a.astype(np.int32)))
    f = one(r, "E_DTYPE")
    assert f.subject == "blk.0.attn_q.weight" and f.actual == "I32"


def test_nonfinite_value(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_nonfinite_norm"][1])
    f = one(r, "E_NONFINITE")
    assert f.subject == "blk.1.ffn_norm.weight" and f.actual == 1 and "index 3" in f.message


def test_rope_freqs_values(tmp_path: Path) -> None:
    # head_dim_full 64 -> 32 entries; partial factor 0.25 -> 64 * 0.25 / 2 = 8 rotated pairs
    # all 1.0: the first differing pair is 8 (the first of the 24 that must stay unrotated)
    r = verify_kind(tmp_path, "upstream", add_tensor("rope_freqs.weight", np.ones(32, np.float32)))
    f = one(r, "E_ROPE_FREQS_VALUES")
    unrot = float(np.float32(1e30))  # the float32 value the file stores
    assert (f.expected, f.actual) == ({"pair": 8, "value": unrot}, {"pair": 8, "value": 1.0})
    assert "24 pairs differ" in f.message and not r.ok
    bad = np.array([1.0] * 8 + [1e30] * 24, np.float32)
    bad[20] = 1.0
    r = verify_kind(tmp_path, "upstream", add_tensor("rope_freqs.weight", bad), name="b.gguf")
    f = one(r, "E_ROPE_FREQS_VALUES")
    assert f.subject == "rope_freqs.weight" and f.actual == {"pair": 20, "value": 1.0}
    few = np.array([1.0] * 4 + [1e30] * 28, np.float32)  # rotates 4 pairs, 8 implied
    f = one(verify_kind(tmp_path, "upstream", add_tensor("rope_freqs.weight", few), name="d.gguf"),
            "E_ROPE_FREQS_VALUES")
    assert (f.expected, f.actual) == ({"pair": 4, "value": 1.0}, {"pair": 4, "value": unrot})
    r = verify_kind(tmp_path, "upstream", add_tensor("rope_freqs.weight", np.ones(16, np.float32)), name="c.gguf")
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
    r = verify_kind(tmp_path, "upstream", set_key(UP + ".nextn_predict_layers", U32(3)))
    f = one(r, "E_NEXTN_LAYERS")
    assert (f.expected, f.actual) == (4, 3)


def test_head_dims_k_v_differ(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_value_length_swa_16"][1])
    f = one(r, "E_HEAD_DIM_KV")
    assert (f.expected, f.actual) == (32, 16)


def test_sliding_window_pattern(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", set_key(UP + ".attention.sliding_window_pattern",
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
    r = verify_kind(tmp_path, "fork", map_tensor("mtp.centroids.weight", lambda a: a.T.copy()))
    f = one(r, "E_CENTROID_TRANSPOSED")
    assert (f.expected, f.actual) == ([128, N_C], [N_C, 128])


def test_ordering_not_i32(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "fork", map_tensor("mtp.token_ordering.weight", lambda a: a.astype(np.float32)))
    f = one(r, "E_ORDERING_TYPE")
    assert (f.expected, f.actual) == ("I32", "F32")


def test_ordering_all_zero(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "fork", map_tensor("mtp.token_ordering.weight", lambda a: np.zeros_like(a)))
    assert one(r, "E_ORDERING_ZERO").subject == "mtp.token_ordering.weight"


def test_ordering_not_a_permutation(tmp_path: Path) -> None:
    def dup(a: np.ndarray) -> np.ndarray:
        a = a.copy()
        a[6] = a[5]          # both in row 0 (ids 0..127 of the ordering)
        return a
    r = verify_kind(tmp_path, "fork", map_tensor("mtp.token_ordering.weight", dup))
    f = one(r, "E_ORDERING_NOT_PERMUTATION")
    assert f.actual == {"ids_missing": 1, "ids_repeated": 1}
    g = one(r, "E_CLUSTER_SIZE")
    assert g.expected == VSC and g.actual["centroids_wrong_size"] == 1 and g.actual["first"] == [0]


def test_ordering_out_of_range(tmp_path: Path) -> None:
    def oob(a: np.ndarray) -> np.ndarray:
        a = a.copy()
        a[200] = N_VOCAB + 5
        return a
    r = verify_kind(tmp_path, "fork", map_tensor("mtp.token_ordering.weight", oob))
    assert one(r, "E_ORDERING_RANGE").actual == 1
    assert one(r, "E_CLUSTER_SIZE").actual["first"] == [1]   # index 200 is in row 200 // 128 = 1


def test_ordering_length(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "fork", map_tensor("mtp.token_ordering.weight", lambda a: a[:4000].copy()))
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
    r = verify_kind(tmp_path, "fork", set_key(FK + ".use_ordered_embeddings", MetaValue(GGUF_BOOL, False)))
    hits = {f.subject for f in r.findings if f.code == "W_CENTROIDS_UNUSED"}
    assert hits == {"mtp.centroids.weight", "mtp.token_ordering.weight"}
    assert r.ok


def test_top_k_above_n_centroids(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "fork", set_key(FK + ".centroid_top_k", U32(64)))
    assert one(r, "E_TOP_K").actual == 64


def test_masked_embd_in_upstream_file(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_masked_embd"][1])
    subj = {f.subject for f in r.findings if f.code == "E_MASKED_EMBD_UPSTREAM"}
    assert subj == {"masked_embd_centroids.weight", "masked_embd_ordering"}


# --- architecture --------------------------------------------------------------------------------------

def test_foreign_drafter_arch(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", set_arch("gemma4_mtp"))
    assert r.dialect == "other"
    assert one(r, "W_ARCH_FOREIGN_DRAFTER").actual == "gemma4_mtp"
    assert [v.loads for v in r.loadability] == [False, False]


def test_no_arch(tmp_path: Path) -> None:
    from mtpscope.inspector.validate import verify

    arch, kv, t = parts("upstream")
    r = verify(write(tmp_path / "n.gguf", None, kv, t))
    assert one(r, "E_ARCH_MISSING") and r.dialect == "unknown" and not r.ok


def test_missing_n_centroids_key(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "fork", drop_keys(FK + ".n_centroids"))
    assert any(f.code == "E_KEY_MISSING" and f.subject == FK + ".n_centroids" for f in r.findings)
    assert "E_CENTROID_SHAPE" not in r.codes()      # the width falls back to the matrix's ne[1] = 32


def test_unrelated_arch(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "upstream", set_arch("llama"))
    assert one(r, "W_ARCH_FOREIGN_DRAFTER").actual == "llama"     # nextn.* tensors: still drafter-like
    r = verify_kind(tmp_path, "upstream", chain(set_arch("llama"), drop_tensors(
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
    assert f.subject == UP + ".embedding_length" and f.actual == "str"     # its GGUF type, as llama.cpp names it
    assert r.loadability[0].loads is False and "wrong type str but expected type u32" in r.loadability[0].reasons[0]


def test_names_from_other_converters_are_explained(tmp_path: Path) -> None:
    r = verify_kind(tmp_path, "fork", rename("mtp.pre_projection.weight", "mtp_pre_proj.weight"))
    f = one(r, "E_TENSOR_UNEXPECTED")
    assert f.subject == "mtp_pre_proj.weight" and "mtp.pre_projection" in f.message
    assert one(r, "E_TENSOR_MISSING").subject == "mtp.pre_projection.weight"


def test_per_layer_array_of_the_wrong_length(tmp_path: Path) -> None:
    """llama.cpp's get_key_or_arr refuses an array whose length is not block_count; so do we, by key."""
    r = verify_kind(tmp_path, "upstream", MUTANTS["up_head_count_array_short"][1])
    f = next(x for x in r.findings if x.subject.endswith(".attention.head_count"))
    assert (f.severity, f.code, f.actual) == ("error", "E_KEY_VALUE", 3)
    assert not r.ok


@pytest.mark.parametrize("eps", [float("nan"), float("inf"), float("-inf"), 0.0, -0.5])
@pytest.mark.parametrize("kind", ["upstream", "target"])
def test_rms_epsilon_not_a_finite_positive_number(tmp_path: Path, kind: str, eps: float) -> None:
    """``<arch>.attention.layer_norm_rms_epsilon`` NaN, infinite or <= 0 (every RMS norm adds it under a square
    root): an E_KEY_VALUE error naming the key (was: no finding at all, the file passed)."""
    from mtpscope.inspector.gguf_write import f32

    arch = UP if kind == "upstream" else "gemma4"
    key = f"{arch}.attention.layer_norm_rms_epsilon"
    r = verify_kind(tmp_path, kind, set_key(key, f32(eps)))
    f = next((x for x in r.findings if x.subject == key), None)
    assert f is not None, [(x.code, x.subject) for x in r.findings]
    assert (f.severity, f.code) == ("error", "E_KEY_VALUE")
    assert f.actual == (str(eps) if eps != eps or abs(eps) == float("inf") else eps)  # findings store nan/inf as text
    assert not r.ok


def test_rms_epsilon_of_the_valid_files_passes(tmp_path: Path) -> None:
    for kind, arch in (("upstream", UP), ("target", "gemma4"), ("fork", FK)):
        r = verify_kind(tmp_path, kind, name=f"{kind}.gguf")
        assert not [x for x in r.findings if x.subject == f"{arch}.attention.layer_norm_rms_epsilon"], kind


POSITIVE_KEYS = ["attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.freq_base_swa"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 0.0, -0.5])
@pytest.mark.parametrize("suffix", POSITIVE_KEYS[1:])
@pytest.mark.parametrize("kind", ["upstream", "fork", "target"])
def test_rope_base_not_a_finite_positive_number(tmp_path: Path, kind: str, suffix: str, value: float) -> None:
    """``<arch>.rope.freq_base`` / ``rope.freq_base_swa`` NaN, infinite or <= 0 (ggml's rope takes powers of the
    base: 0 gives infinite angles, a negative or NaN base NaN ones): an E_KEY_VALUE error naming the key, as for the
    RMS epsilon (was: no finding, the file passed)."""
    from mtpscope.inspector.gguf_write import f32

    arch = {"upstream": UP, "fork": FK, "target": "gemma4"}[kind]
    key = f"{arch}.{suffix}"
    r = verify_kind(tmp_path, kind, set_key(key, f32(value)))
    f = next((x for x in r.findings if x.subject == key and x.code == "E_KEY_VALUE"), None)
    assert f is not None, [(x.code, x.subject) for x in r.findings]
    assert (f.severity, f.expected) == ("error", "a finite number > 0")
    assert f.actual == (str(value) if value != value or abs(value) == float("inf") else value)
    assert suffix in f.message and not r.ok


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_target_softcapping_not_finite(tmp_path: Path, value: float) -> None:
    """A target's ``gemma4.final_logit_softcapping`` NaN or infinite (llama.cpp computes s * tanh(logits / s): every
    logit NaN): an E_KEY_VALUE error naming the key (was: no finding)."""
    from mtpscope.inspector.gguf_write import f32

    key = "gemma4.final_logit_softcapping"
    r = verify_kind(tmp_path, "target", set_key(key, f32(value)))
    f = next((x for x in r.findings if x.subject == key), None)
    assert f is not None, [(x.code, x.subject) for x in r.findings]
    assert (f.severity, f.code, f.expected, f.actual) == ("error", "E_KEY_VALUE", "a finite number", str(value))
    assert not r.ok


@pytest.mark.parametrize("value", [0.0, -30.0, 30.0])
def test_target_softcapping_zero_or_negative_is_not_flagged(tmp_path: Path, value: float) -> None:
    """0 is llama.cpp's "no soft-capping" (``if (hparams.f_final_logit_softcapping)``) and a negative s soft-caps as
    |s| does (s * tanh(x / s) = |s| * tanh(x / |s|)): llama.cpp loads both as meant, so no key finding."""
    from mtpscope.inspector.gguf_write import f32

    key = "gemma4.final_logit_softcapping"
    r = verify_kind(tmp_path, "target", set_key(key, f32(value)))
    assert not [x for x in r.findings if x.subject == key], [(x.code, x.message) for x in r.findings]


@pytest.mark.parametrize("kind, arch", [("upstream", UP), ("fork", FK)])
def test_drafter_softcapping_is_not_checked(tmp_path: Path, kind: str, arch: str) -> None:
    """A drafter's final_logit_softcapping, even NaN: llama.cpp's gemma4-assistant neither reads it nor soft-caps,
    so verify says nothing of it (the published-config comparison of ``diagnose`` notes the key's presence)."""
    from mtpscope.inspector.gguf_write import f32

    key = f"{arch}.final_logit_softcapping"
    r = verify_kind(tmp_path, kind, set_key(key, f32(float("nan"))))
    assert not [x for x in r.findings if x.subject == key and x.code == "E_KEY_VALUE"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 0.0, 1e-6, 5e5])
def test_config_field_and_the_key_it_becomes_meet_one_rule(tmp_path: Path, value: float) -> None:
    """``rms_norm_eps`` and ``rope_theta`` in config.json are refused exactly when verify flags the GGUF key they
    become (one rule, finite and > 0, :func:`inspector.hf_config.number_fault`)."""
    import math

    from mtpscope.errors import HFCheckpointError
    from mtpscope.inspector.convert import tiny_text_config
    from mtpscope.inspector.gguf_write import f32
    from mtpscope.inspector.hf_config import text_hparams

    bad = not (math.isfinite(value) and value > 0)
    for field, suffix in (("rms_norm_eps", "attention.layer_norm_rms_epsilon"), ("rope_theta", "rope.freq_base")):
        tc = tiny_text_config()
        if field == "rope_theta":
            tc["rope_parameters"]["full_attention"]["rope_theta"] = value
        else:
            tc[field] = value
        try:
            text_hparams(tc)
            refused = False
        except HFCheckpointError:
            refused = True
        key = f"gemma4.{suffix}"
        r = verify_kind(tmp_path, "target", set_key(key, f32(value)), name=f"{field}.gguf")
        flagged = any(x.subject == key and x.code == "E_KEY_VALUE" for x in r.findings)
        assert refused is flagged is bad, (field, value, refused, flagged)


def test_number_keys_of_the_valid_files_pass(tmp_path: Path) -> None:
    for kind in ("upstream", "target", "fork"):
        r = verify_kind(tmp_path, kind, name=f"{kind}.gguf")
        assert not [x for x in r.findings if x.code == "E_KEY_VALUE"], kind


@pytest.mark.parametrize("kind", ["upstream", "fork", "target"])
@pytest.mark.parametrize(("values", "key", "actual"), [
    ({"rope.dimension_count": 63}, "rope.dimension_count", 63),          # odd: GGML_ASSERT(n_dims % 2 == 0)
    ({"rope.dimension_count": 66}, "rope.dimension_count", 66),          # > the 64-dim full head: n_dims <= ne0
    ({"rope.dimension_count": 0}, "rope.dimension_count", 0),            # llama.cpp hangs
    ({"rope.dimension_count_swa": 34}, "rope.dimension_count_swa", 34),  # > the 32-dim sliding head
    # without its own key the sliding layers rotate by the full layers' 64 dims, more than their 32
    ({"rope.dimension_count_swa": None}, "rope.dimension_count", 64),
    # without either key both rotate by the full head dim, attention.key_length's 64 (it was named
    # rope.dimension_count_swa, a key the file lacks)
    ({"rope.dimension_count": None, "rope.dimension_count_swa": None}, "attention.key_length", 64),
    ({"rope.dimension_count": 32}, None, None),                          # partial rotation: legal
])
def test_rope_dims_llama_cpp_cannot_rotate_by_are_errors(tmp_path: Path, kind: str, values: dict[str, int | None],
                                                         key: str | None, actual: int | None) -> None:
    """``rope.dimension_count(_swa)`` odd, 0 or above its layers' head dim (64 full, 32 sliding) loaded in llama.cpp
    and then aborted it (GGML_ASSERT) or hung it, while ``verify`` said OK: one E_KEY_VALUE naming the key."""
    arch = {"upstream": UP, "fork": FK, "target": parts("target")[0]}[kind]

    def mutate(kv: dict[str, MetaValue], t: dict[str, Any]) -> None:
        for suffix, v in values.items():
            if v is None:
                kv.pop(f"{arch}.{suffix}")
            else:
                kv[f"{arch}.{suffix}"] = U32(v)

    r = verify_kind(tmp_path, kind, mutate)
    rope = [f for f in r.findings if f.code == "E_KEY_VALUE" and ("rope.dimension" in f.subject
                                                                  or "key_length" in f.subject)]
    if key is None:
        assert r.ok and not rope, [(f.code, f.message) for f in r.errors]
    else:
        assert not r.ok and [(f.subject, f.actual) for f in rope] == [(f"{arch}.{key}", actual)]


def test_an_integer_key_stored_as_another_type_is_an_error_as_llama_cpp_refuses_it(tmp_path: Path) -> None:
    """llama.cpp reads block_count as uint32_t and refuses an INT32 one (tests/test_loadability.py loads the file:
    "has wrong type"); verify said OK and its verdict "loads". An INT32 per-layer array loads: no finding."""
    from mtpscope.inspector.validate import verify
    from tests.builders import build

    r = verify(build(tmp_path, "up_block_count_i32"))
    assert [(f.code, f.subject, f.actual) for f in r.errors] == [("E_KEY_VALUE", f"{UP}.block_count", "i32")]
    assert not r.loadability[0].loads
    assert r.loadability[0].reasons[0] == f"key {UP}.block_count has wrong type i32 but expected type u32"
    ok = verify(build(tmp_path, "up_head_count_kv_array_i32"))
    assert not [f for f in ok.errors if f.code == "E_KEY_VALUE"] and ok.loadability[0].loads


def test_a_float_integer_key_is_named_by_its_type(tmp_path: Path) -> None:
    """block_count stored as FLOAT32 was "got 5.605193857299268e-45" (its bits read as a float of 4): now the type."""
    from mtpscope.inspector.gguf import FLOAT32
    from mtpscope.inspector.gguf_write import MetaValue

    def mutate(kv: dict[str, MetaValue], t: dict[str, Any]) -> None:
        kv[f"{UP}.block_count"] = MetaValue(FLOAT32, 4.0)

    r = verify_kind(tmp_path, "upstream", mutate)
    assert [(f.code, f.subject, f.actual) for f in r.errors] == [("E_KEY_VALUE", f"{UP}.block_count", "f32")]
    assert r.loadability[0].reasons[0] == f"key {UP}.block_count has wrong type f32 but expected type u32"
