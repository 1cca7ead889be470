"""Tensor inventory and dialect detection on files shaped like the real drafters and targets.

Layouts from the facts file (section 1): a 4-layer drafter has 49 tensors, 51 with the centroid pair;
shapes below are written in GGUF ``ne`` order and turned into numpy arrays of ``reversed(ne)``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType as V, quants

from mtpscope.inspector import Dialect, Inventory, TensorEntry, build_inventory, open_gguf
from mtpscope.inspector.inventory import COMPONENTS, classify
from tests.test_gguf import assert_parity

N_EMBD, N_BB, N_FF, N_HEAD, HD_SWA, HD_FULL, N_VOCAB, N_CENTROIDS = 32, 64, 64, 2, 32, 64, 256, 8
SWA = [True, True, True, False]  # three sliding layers then one full


def _t(name: str, ne: tuple[int, ...], qtype: Q, rng: np.random.Generator) -> tuple[Any, ...]:
    """A tensor of GGUF shape ``ne`` (numpy shape reversed) stored as ``qtype``."""
    shape = tuple(reversed(ne))
    if qtype == Q.I32:
        return (name, rng.integers(0, N_VOCAB, size=shape, dtype=np.int32))
    x = rng.standard_normal(shape).astype(np.float32)
    if qtype == Q.F32:
        return (name, x)
    if qtype == Q.F16:
        return (name, x.astype(np.float16))
    return (name, quants.quantize(x, qtype), qtype)


def drafter_spec(dialect: str, centroids: bool = True, seed: int = 0) -> tuple[str, list, list]:
    """(arch, kv, tensors) of a tiny 4-layer Gemma 4 assistant in the ``fork`` or ``upstream`` dialect."""
    rng = np.random.default_rng(seed)
    arch = "gemma4_assistant" if dialect == "fork" else "gemma4-assistant"
    pre = "mtp." if dialect == "fork" else "nextn."
    kv: list[tuple[Any, ...]] = [
        (f"{arch}.block_count", 4, V.UINT32), (f"{arch}.embedding_length", N_EMBD, V.UINT32),
        (f"{arch}.feed_forward_length", N_FF, V.UINT32), (f"{arch}.attention.head_count", N_HEAD, V.UINT32),
        (f"{arch}.attention.head_count_kv", 1, V.UINT32), (f"{arch}.attention.key_length", HD_FULL, V.UINT32),
        (f"{arch}.attention.key_length_swa", HD_SWA, V.UINT32),
        (f"{arch}.attention.sliding_window_pattern", SWA, V.ARRAY, V.BOOL),
        ("tokenizer.ggml.tokens", [f"t{i}" for i in range(N_VOCAB)], V.ARRAY, V.STRING),
    ]
    if dialect == "fork":
        kv += [(f"{arch}.n_embd_backbone", N_BB, V.UINT32), (f"{arch}.n_centroids", N_CENTROIDS, V.UINT32),
               (f"{arch}.use_ordered_embeddings", centroids, V.BOOL),
               (f"{arch}.requires_target_arch", "gemma4", V.STRING)]
    else:
        kv += [(f"{arch}.embedding_length_out", N_BB, V.UINT32), (f"{arch}.nextn_predict_layers", 4, V.UINT32)]
    tensors = [
        _t("token_embd.weight", (N_EMBD, N_VOCAB), Q.Q8_0, rng),
        _t("output_norm.weight", (N_EMBD,), Q.F32, rng),
        _t("rope_freqs.weight", (HD_FULL // 2,), Q.F32, rng),
        _t(pre + "pre_projection.weight", (2 * N_BB, N_EMBD), Q.Q8_0, rng),
        _t(pre + "post_projection.weight", (N_EMBD, N_BB), Q.BF16, rng),
    ]
    if dialect == "fork" and centroids:
        tensors += [_t("mtp.centroids.weight", (N_EMBD, N_CENTROIDS), Q.F16, rng),
                    _t("mtp.token_ordering.weight", (N_VOCAB,), Q.I32, rng)]
    for il in range(4):
        hd = HD_SWA if SWA[il] else HD_FULL
        b = f"blk.{il}."
        tensors += [
            _t(b + "attn_norm.weight", (N_EMBD,), Q.F32, rng),
            _t(b + "attn_q.weight", (N_EMBD, N_HEAD * hd), Q.Q8_0, rng),
            _t(b + "attn_q_norm.weight", (hd,), Q.F32, rng),
            _t(b + "attn_output.weight", (N_HEAD * hd, N_EMBD), Q.Q4_0, rng),
            _t(b + "post_attention_norm.weight", (N_EMBD,), Q.F32, rng),
            _t(b + "layer_output_scale.weight", (1,), Q.F32, rng),
            _t(b + "ffn_norm.weight", (N_EMBD,), Q.F32, rng),
            _t(b + "ffn_gate.weight", (N_EMBD, N_FF), Q.Q8_0, rng),
            _t(b + "ffn_up.weight", (N_EMBD, N_FF), Q.Q8_0, rng),
            _t(b + "ffn_down.weight", (N_FF, N_EMBD), Q.F16, rng),
            _t(b + "post_ffw_norm.weight", (N_EMBD,), Q.F32, rng),
        ]
    return arch, kv, tensors


def target_spec(seed: int = 1) -> tuple[str, list, list]:
    """(arch, kv, tensors) of a tiny 2-layer ``gemma4`` target with a MoE layer and per-layer embeddings."""
    rng = np.random.default_rng(seed)
    kv = [("gemma4.block_count", 2, V.UINT32), ("gemma4.embedding_length", N_BB, V.UINT32)]
    tensors = [_t("token_embd.weight", (N_BB, N_VOCAB), Q.Q8_0, rng),
               _t("per_layer_token_embd.weight", (64, N_VOCAB), Q.Q8_0, rng),
               _t("output_norm.weight", (N_BB,), Q.F32, rng)]
    for il in range(2):
        b = f"blk.{il}."
        tensors += [_t(b + n, ne, q, rng) for n, ne, q in (
            ("attn_norm.weight", (N_BB,), Q.F32), ("attn_q.weight", (N_BB, 64), Q.Q8_0),
            ("attn_k.weight", (N_BB, 32), Q.Q8_0), ("attn_v.weight", (N_BB, 32), Q.Q8_0),
            ("attn_q_norm.weight", (32,), Q.F32), ("attn_k_norm.weight", (32,), Q.F32),
            ("attn_output.weight", (64, N_BB), Q.Q8_0), ("post_attention_norm.weight", (N_BB,), Q.F32),
            ("ffn_norm.weight", (N_BB,), Q.F32), ("ffn_gate.weight", (N_BB, 64), Q.Q8_0),
            ("ffn_up.weight", (N_BB, 64), Q.Q8_0), ("ffn_down.weight", (64, N_BB), Q.Q8_0),
            ("post_ffw_norm.weight", (N_BB,), Q.F32), ("layer_output_scale.weight", (1,), Q.F32))]
    tensors += [_t("blk.1." + n, ne, q, rng) for n, ne, q in (
        ("ffn_gate_inp.weight", (N_BB, 4), Q.F32), ("ffn_gate_up_exps.weight", (N_BB, 64, 4), Q.Q8_0),
        ("ffn_down_exps.weight", (32, N_BB, 4), Q.Q8_0), ("pre_ffw_norm_2.weight", (N_BB,), Q.F32),
        ("inp_gate.weight", (N_BB, 32), Q.F32))]
    return "gemma4", kv, tensors


def _nbytes(item: tuple[Any, ...]) -> int:
    return int(item[1].nbytes)


def _qname(item: tuple[Any, ...]) -> str:
    if len(item) > 2:
        return item[2].name
    return {np.float32: "F32", np.float16: "F16", np.int32: "I32"}[item[1].dtype.type]


@pytest.fixture
def fork_file(write_gguf: Any) -> tuple[Path, list]:
    arch, kv, tensors = drafter_spec("fork")
    return write_gguf("fork.gguf", arch, kv, tensors), tensors


@pytest.fixture
def upstream_file(write_gguf: Any) -> tuple[Path, list]:
    arch, kv, tensors = drafter_spec("upstream")
    return write_gguf("upstream.gguf", arch, kv, tensors), tensors


@pytest.mark.parametrize("which", ["fork_file", "upstream_file"])
def test_parity_drafter_dialects(which: str, request: pytest.FixtureRequest) -> None:
    path, _ = request.getfixturevalue(which)
    assert_parity(open_gguf(path), GGUFReader(path))


def test_fork_inventory(fork_file: tuple[Path, list]) -> None:
    path, tensors = fork_file
    inv = build_inventory(open_gguf(path))
    assert isinstance(inv, Inventory) and inv.n_tensors == 51  # facts: 49 + the centroid pair
    assert inv.architecture == "gemma4_assistant"
    d = inv.dialect
    assert isinstance(d, Dialect) and d.kind == "fork" and d.arch == "gemma4_assistant" and d.pattern is None
    assert any("n_embd_backbone" in e for e in d.evidence) and any("mtp.*" in e for e in d.evidence)
    assert d.is_drafter
    comp = {c: t.n_tensors for c, t in inv.by_component.items()}
    assert comp == {"token_embd": 1, "projection": 2, "centroid_head": 1, "token_ordering": 1,
                    "output_norm": 1, "rope_freqs": 1, "attention": 12, "feed_forward": 12, "norm": 16,
                    "layer_scale": 4}
    assert list(inv.by_component) == [c for c in COMPONENTS if c in comp]
    # byte totals from the arrays we wrote, by type and overall
    want_by_type: Counter[str] = Counter()
    for item in tensors:
        want_by_type[_qname(item)] += _nbytes(item)
    assert {k: v.n_bytes for k, v in inv.by_type.items()} == dict(want_by_type)
    assert inv.n_bytes == sum(_nbytes(i) for i in tensors)
    assert sum(t.n_bytes for t in inv.by_component.values()) == inv.n_bytes
    assert inv.layers == (0, 1, 2, 3)
    groups = inv.by_layer()
    assert list(groups) == [0, 1, 2, 3, None] and all(len(groups[il]) == 11 for il in range(4))
    e = {x.name: x for x in inv.entries}
    assert isinstance(e["blk.3.attn_q.weight"], TensorEntry)
    assert (e["blk.3.attn_q.weight"].component, e["blk.3.attn_q.weight"].layer) == ("attention", 3)
    assert e["blk.3.attn_q.weight"].tensor.ne == (N_EMBD, N_HEAD * HD_FULL)  # the full layer's head dim
    assert e["mtp.token_ordering.weight"].tensor.type_name == "I32"
    assert [x.name for x in inv.filter("mtp.*")] == [
        "mtp.pre_projection.weight", "mtp.post_projection.weight", "mtp.centroids.weight",
        "mtp.token_ordering.weight"]
    assert len(inv.filter("blk.2.*")) == 11 and inv.filter("nope*") == ()


def test_upstream_inventory(upstream_file: tuple[Path, list]) -> None:
    path, tensors = upstream_file
    inv = build_inventory(open_gguf(path))
    assert inv.n_tensors == 49  # facts: a 4-layer drafter without the centroid head
    assert inv.dialect.kind == "upstream" and inv.dialect.arch == "gemma4-assistant"
    assert any("embedding_length_out" in e for e in inv.dialect.evidence)
    assert any("nextn.*" in e for e in inv.dialect.evidence)
    assert "centroid_head" not in inv.by_component
    assert inv.by_component["projection"].n_tensors == 2
    assert {x.name for x in inv.filter("nextn.*")} == {"nextn.pre_projection.weight",
                                                        "nextn.post_projection.weight"}


def test_target_inventory(write_gguf: Any) -> None:
    arch, kv, tensors = target_spec()
    inv = build_inventory(open_gguf(write_gguf("target.gguf", arch, kv, tensors)))
    assert inv.dialect.kind == "target" and not inv.dialect.is_drafter
    comp = {c: t.n_tensors for c, t in inv.by_component.items()}
    assert comp == {"token_embd": 1, "output_norm": 1, "attention": 2 * 6, "feed_forward": 2 * 3,
                    "norm": 2 * 4 + 1, "layer_scale": 2, "moe_experts": 3, "per_layer_embd": 2}
    assert inv.by_component["moe_experts"].n_elements == N_BB * 4 + N_BB * 64 * 4 + 32 * N_BB * 4


def test_real_tokenizer_is_a_target(vocab_gguf: Path) -> None:
    inv = build_inventory(open_gguf(vocab_gguf))
    assert inv.dialect.kind == "target" and inv.n_tensors == 0 and inv.n_bytes == 0
    assert dict(inv.by_component) == {} and dict(inv.by_type) == {}


@pytest.mark.parametrize(("arch", "names", "kind", "pattern"), [
    ("gemma4_mtp", ["token_embd.weight"], "other", "gemma4_mtp"),
    ("llama", ["mtp_pre_proj.weight"], "other", "mtp_pre_proj"),
    ("llama", ["mtp_centroids.weight"], "other", "mtp_centroids"),
    ("llama", ["x.mtp_token_ordering"], "other", "mtp_token_ordering"),
    ("llama", ["assistant.pre_projection.weight"], "other", "assistant.pre_projection"),
    ("gemma-4-assistant-v2", ["token_embd.weight"], "other", "*assistant*"),
    ("llama", ["token_embd.weight"], "unknown", None),
    (None, ["token_embd.weight"], "unknown", None),
])
def test_other_dialects(write_gguf: Any, arch: str | None, names: list[str], kind: str,
                        pattern: str | None) -> None:
    tensors = [(n, np.zeros(4, np.float32)) for n in names]
    f = open_gguf(write_gguf("o.gguf", arch, [], tensors))
    d = build_inventory(f).dialect
    assert (d.kind, d.pattern, d.arch) == (kind, pattern, arch)
    if kind == "other":
        assert any(pattern in e for e in d.evidence)


@pytest.mark.parametrize(("name", "want"), [
    ("token_embd.weight", ("token_embd", None)),
    ("mtp.pre_projection.weight", ("projection", None)),
    ("nextn.post_projection.weight", ("projection", None)),
    ("mtp_pre_proj.weight", ("projection", None)),
    ("assistant.pre_projection.weight", ("projection", None)),
    ("blk.5.nextn.eh_proj.weight", ("projection", 5)),
    ("mtp.centroids.weight", ("centroid_head", None)),
    ("masked_embd_centroids.weight", ("centroid_head", None)),
    ("mtp.token_ordering.weight", ("token_ordering", None)),
    ("masked_embd_ordering", ("token_ordering", None)),
    ("output_norm.weight", ("output_norm", None)),
    ("output.weight", ("output", None)),
    ("rope_freqs.weight", ("rope_freqs", None)),
    ("blk.12.attn_k_norm.weight", ("attention", 12)),
    ("blk.12.attn_qkv.weight", ("attention", 12)),
    ("blk.0.attn_norm.weight", ("norm", 0)),
    ("blk.0.post_ffw_norm_1.weight", ("norm", 0)),
    ("blk.7.ffn_up.weight", ("feed_forward", 7)),
    ("blk.7.ffn_up_exps.weight", ("moe_experts", 7)),
    ("blk.7.ffn_gate_inp.scale", ("moe_experts", 7)),
    ("blk.7.ffn_down_shexp.weight", ("moe_experts", 7)),
    ("blk.1.layer_output_scale.weight", ("layer_scale", 1)),
    ("per_layer_model_proj.weight", ("per_layer_embd", None)),
    ("blk.3.proj.weight", ("per_layer_embd", 3)),
    ("blk.3.post_norm.weight", ("per_layer_embd", 3)),
    ("blk.3.rope_freqs.weight", ("rope_freqs", 3)),
    ("something.else", ("other", None)),
])
def test_classify_names(name: str, want: tuple[str, int | None]) -> None:
    assert classify(name) == want
