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
from gguf import GGUFReader

from mtpscope.inspector import Dialect, Inventory, TensorEntry, build_inventory, open_gguf
from mtpscope.inspector.inventory import COMPONENTS, classify
from tests.gguf_oracle import assert_parity
from tests.specs import HD_FULL, N_BB, N_EMBD, N_HEAD, drafter_spec, target_spec


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
    assert any("n_embd_backbone" in e for e in d.evidence)
    # the count and the names agree: three named, the rest counted (the spec's mtp.* tensors, counted here)
    n_mtp = sum(1 for t in tensors if t[0].startswith("mtp."))
    assert n_mtp > 3 and f"{n_mtp} mtp.* tensors (" in " ".join(d.evidence)
    assert next(e for e in d.evidence if "mtp.* tensors" in e).endswith(f" and {n_mtp - 3} more)")
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


def test_an_architecture_key_of_another_type_is_said_as_such(write_gguf: Any) -> None:
    """general.architecture present as a UINT32 (gguf-py's writer, our reader): the dialect's evidence says it is not a
    string, not that the key is missing (verify reports the same key's type)."""
    import gguf

    path = write_gguf("a.gguf", None, [("general.architecture", 5, gguf.GGUFValueType.UINT32)],
                      [("x.weight", np.zeros((4, 4), np.float32))])
    d = build_inventory(open_gguf(path)).dialect
    assert d.kind == "unknown" and d.evidence == ("general.architecture is a UINT32, not a STRING",)
    bare = write_gguf("b.gguf", None, [], [("x.weight", np.zeros((4, 4), np.float32))])
    assert build_inventory(open_gguf(bare)).dialect.evidence == ("no general.architecture",)
