"""Expected layouts: pinned full name lists for a 4-layer drafter in each dialect (E2B dimensions, facts §2),
target layouts against the demo target that llama.cpp loads, rope_freqs values, hparams reading."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from mtpscope.inspector import layouts as L

# E2B assistant (facts §2): drafter hidden 256, backbone 1536, n_ff 2048, 4 heads, 1 kv head,
# head dims 256 (sliding) / 512 (full), layers [s, s, s, f], vocab 262144, 2048 centroids.
E2B_LAYERS = tuple(L.LayerSpec(il, il < 3, 4, 1, 256 if il < 3 else 512, 2048) for il in range(4))


def e2b(dialect: str, ordered: bool = True) -> L.HParams:
    arch = {"fork": L.ARCH_FORK, "upstream": L.ARCH_UPSTREAM}[dialect]
    return L.HParams(arch=arch, dialect=dialect, n_layer=4, n_embd=256, n_embd_backbone=1536, n_vocab=262144,
                     n_vocab_source="tokenizer", head_dim_full=512, head_dim_swa=256, layers=E2B_LAYERS,
                     use_ordered_embeddings=ordered, n_centroids=2048 if ordered else None,
                     centroid_top_k=32 if ordered else None)


PER_LAYER = ["attn_norm", "attn_q", "attn_output", "attn_q_norm", "post_attention_norm", "layer_output_scale",
             "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm"]

UPSTREAM_NAMES = [
    "token_embd.weight", "output_norm.weight", "rope_freqs.weight",
    "nextn.pre_projection.weight", "nextn.post_projection.weight",
] + [f"blk.{il}.{n}.weight" for il in range(4) for n in PER_LAYER]

FORK_NAMES = [
    "token_embd.weight", "output_norm.weight", "rope_freqs.weight",
    "mtp.pre_projection.weight", "mtp.post_projection.weight",
    "mtp.centroids.weight", "mtp.token_ordering.weight",
] + [f"blk.{il}.{n}.weight" for il in range(4) for n in PER_LAYER]


def test_upstream_drafter_names_pinned() -> None:
    lay = L.expected_drafter_layout(e2b("upstream"))
    assert [e.name for e in lay] == UPSTREAM_NAMES
    assert len(lay) == 49                                  # facts §1: 49 tensors
    assert all(e.required for e in lay)                     # layer_output_scale required upstream


def test_fork_drafter_names_pinned() -> None:
    lay = L.expected_drafter_layout(e2b("fork"))
    assert [e.name for e in lay] == FORK_NAMES
    assert len(lay) == 51                                  # 49 + the centroid pair
    optional = {e.name for e in lay if not e.required}
    assert optional == {f"blk.{il}.layer_output_scale.weight" for il in range(4)}
    assert [e.name for e in L.expected_drafter_layout(e2b("fork", ordered=False))] == \
        [n for n in FORK_NAMES if not n.startswith("mtp.c") and not n.startswith("mtp.t")]


def test_no_kv_tensors_in_a_drafter() -> None:
    for d in ("fork", "upstream"):
        names = [e.name for e in L.expected_drafter_layout(e2b(d))]
        assert not [n for n in names if ".attn_k" in n or ".attn_v" in n]


def test_drafter_shapes_by_hand() -> None:
    lay = {e.name: e for e in L.expected_drafter_layout(e2b("fork"))}
    # ne order: (innermost, outer)
    assert lay["mtp.pre_projection.weight"].ne == (2 * 1536, 256)
    assert lay["mtp.post_projection.weight"].ne == (256, 1536)
    assert lay["token_embd.weight"].ne == (256, 262144)
    assert lay["rope_freqs.weight"].ne == (256,)          # key_length 512 / 2
    assert lay["mtp.centroids.weight"].ne == (256, 2048)
    assert lay["mtp.token_ordering.weight"].ne == (262144,)
    assert lay["mtp.token_ordering.weight"].ggml_types == ("I32",)
    assert lay["blk.0.attn_q.weight"].ne == (256, 4 * 256)   # sliding head dim
    assert lay["blk.3.attn_q.weight"].ne == (256, 4 * 512)   # full head dim
    assert lay["blk.3.attn_output.weight"].ne == (4 * 512, 256)
    assert lay["blk.0.attn_q_norm.weight"].ne == (256,)
    assert lay["blk.3.attn_q_norm.weight"].ne == (512,)
    assert lay["blk.2.ffn_down.weight"].ne == (2048, 256)
    assert lay["blk.1.layer_output_scale.weight"].ne == (1,)
    assert lay["blk.1.ffn_norm.weight"].ggml_types == ("F32",)
    assert lay["blk.1.ffn_gate.weight"].type_ok("Q4_K") and not lay["blk.1.ffn_gate.weight"].type_ok("I32")


def test_no_full_layer_means_no_rope_freqs() -> None:
    hp = e2b("upstream")
    sliding_only = tuple(L.LayerSpec(il, True, 4, 1, 256, 2048) for il in range(4))
    names = [e.name for e in L.expected_drafter_layout(L.HParams(**{**hp.__dict__, "layers": sliding_only}))]
    assert "rope_freqs.weight" not in names and len(names) == 48


def test_drafter_layout_needs_backbone_and_vocab() -> None:
    from mtpscope.errors import LayoutError

    hp = e2b("upstream")
    with pytest.raises(LayoutError) as e:
        L.expected_drafter_layout(L.HParams(**{**hp.__dict__, "n_embd_backbone": None}))
    assert "embedding_length_out" in str(e.value)
    with pytest.raises(LayoutError):
        L.expected_drafter_layout(hp, "target")


def test_rope_freqs_values() -> None:
    # conversion/gemma.py: n_rot = int(512 * 0.25 / 2) = 64 ones, 256 - 64 = 192 values of 1e30
    v = L.expected_rope_freqs(512)
    assert v.shape == (256,) and v.dtype == np.float32
    assert (v[:64] == 1.0).all() and (v[64:] == np.float32(1e30)).all()
    assert (L.expected_rope_freqs(64) == np.array([1.0] * 8 + [1e30] * 24, np.float32)).all()


def _demo_file(tmp_path: Path, kind: str) -> Path:
    from tests.builders import parts, write

    arch, kv, t = parts(kind)
    return write(tmp_path / f"{kind}.gguf", arch, kv, t)


def test_read_hparams_of_demo_drafter(tmp_path: Path) -> None:
    from mtpscope.demo.build import DEFAULT_DIMS as D
    from mtpscope.inspector.gguf import open_gguf

    with open_gguf(_demo_file(tmp_path, "fork")) as f:
        hp = L.read_hparams(f)
    assert (hp.dialect, hp.n_layer, hp.n_embd, hp.n_embd_backbone) == ("fork", 4, D.n_embd, D.n_embd_backbone)
    assert (hp.n_vocab, hp.n_vocab_source) == (4096, "tokenizer")
    assert [ly.sliding for ly in hp.layers] == list(D.drafter_swa)
    assert [ly.head_dim for ly in hp.layers] == [D.head_dim_swa] * 3 + [D.head_dim]
    assert hp.use_ordered_embeddings and hp.n_centroids == 32 and hp.centroid_top_k == 8
    assert hp.missing_keys == ()


def test_target_layout_matches_demo_target_that_llama_cpp_loads(tmp_path: Path) -> None:
    """The demo target loads in llama.cpp (tests/test_loadability.py): every tensor it has is in the
    layout, and every required tensor of the layout is in it. Its full layers have K = V (no attn_v)."""
    from mtpscope.demo.build import DEFAULT_DIMS as D
    from mtpscope.inspector.gguf import open_gguf

    with open_gguf(_demo_file(tmp_path, "target")) as f:
        hp = L.read_hparams(f)
        have = {t.name: tuple(t.ne) for t in f.tensors}
    lay = {e.name: e for e in L.expected_target_layout(hp, k_eq_v=True)}
    assert set(have) <= set(lay)
    assert {n for n, e in lay.items() if e.required} <= set(have)
    for n, ne in have.items():
        assert lay[n].ne == ne, n
    assert "blk.2.attn_v.weight" not in have and not lay["blk.2.attn_v.weight"].required   # full layer
    assert lay["blk.0.attn_v.weight"].required                                               # sliding layer
    assert lay["blk.0.attn_k.weight"].ne == (D.n_embd_backbone, D.n_head_kv * D.head_dim_swa)
    assert hp.n_layer_kv_from_start == 6 and hp.last_layer_of(True) == 4 and hp.last_layer_of(False) == 5


def test_target_shared_kv_layers_make_k_optional() -> None:
    layers = tuple(L.LayerSpec(il, il % 2 == 0, 2, 1, 32, 64) for il in range(6))
    hp = L.HParams(arch="gemma4", dialect="target", n_layer=6, n_embd=64, n_embd_backbone=None, n_vocab=100,
                   n_vocab_source="tokenizer", head_dim_full=32, head_dim_swa=32, layers=layers, shared_kv_layers=2)
    lay = {e.name: e for e in L.expected_target_layout(hp)}
    assert lay["blk.3.attn_k.weight"].required and not lay["blk.4.attn_k.weight"].required
    assert not lay["blk.5.attn_k_norm.weight"].required


@pytest.mark.parametrize("n_layer", [0, 513, 2 ** 32 - 1])
def test_block_count_outside_llama_cpp_limits_is_a_layout_error(write_gguf, n_layer: int) -> None:
    """llama.cpp caps layers at LLAMA_MAX_LAYERS = 512; a larger (or zero) block_count is refused by
    name, without building per-layer lists of that length."""
    from gguf import GGUFValueType as VT

    from mtpscope.errors import LayoutError
    from mtpscope.inspector.gguf import open_gguf

    arch = "gemma4-assistant"
    p = write_gguf("bc.gguf", arch, kv=[(f"{arch}.block_count", n_layer, VT.UINT32),
                                        (f"{arch}.embedding_length", 32, VT.UINT32)])
    with open_gguf(p) as f, pytest.raises(LayoutError) as e:
        L.read_hparams(f)
    assert e.value.key == f"{arch}.block_count" and e.value.actual == n_layer


def test_drafter_tensor_names_have_one_home() -> None:
    """The projections' names per dialect (llama.cpp's ``src/llama-arch.cpp``: ``nextn.*`` upstream, the fork's
    ``mtp.*``), and every module that maps fork <-> upstream names takes layouts' table."""
    from mtpscope.inspector import centroids, checks, diff, hf_names, reference

    assert L.PRE_PROJECTION == {"fork": "mtp.pre_projection.weight", "upstream": "nextn.pre_projection.weight"}
    assert L.POST_PROJECTION == {"fork": "mtp.post_projection.weight", "upstream": "nextn.post_projection.weight"}
    assert L.FORK_TO_UPSTREAM == {"mtp.pre_projection.weight": "nextn.pre_projection.weight",
                                  "mtp.post_projection.weight": "nextn.post_projection.weight",
                                  "mtp.centroids.weight": "masked_embd_centroids.weight",
                                  "mtp.token_ordering.weight": "masked_embd_ordering"}
    assert diff.RENAMES is L.FORK_TO_UPSTREAM and checks.L.FORK_TO_UPSTREAM is L.FORK_TO_UPSTREAM
    assert centroids.CENTROID_NAMES[:2] == ("mtp.centroids.weight", "masked_embd_centroids.weight")
    assert reference.PRE_NAMES[:2] == ("nextn.pre_projection.weight", "mtp.pre_projection.weight")
    assert hf_names.gguf_name("post_projection.weight", "fork") == "mtp.post_projection.weight"


def _facts_outside_layouts(root: Path) -> list[str]:
    """Where a module other than ``inspector/layouts.py`` spells an architecture name as a module-level constant
    (``X = "gemma4-assistant"``) or a drafter tensor name (``"mtp.pre_projection.weight"``, ``"nextn.*"``, the
    centroid head's names) as a string literal: each ``file:line``."""
    arch = {L.ARCH_FORK, L.ARCH_UPSTREAM, L.ARCH_TARGET}
    names = {*L.PRE_PROJECTION.values(), *L.POST_PROJECTION.values(), L.FORK_CENTROIDS, L.FORK_ORDERING}
    out = []
    for f in sorted(root.rglob("*.py")):
        if f.name == "layouts.py" and f.parent.name == "inspector":
            continue
        tree = ast.parse(f.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value in arch:
                out.append(f"{f.relative_to(root)}:{node.lineno}")
        out += [f"{f.relative_to(root)}:{n.lineno}" for n in ast.walk(tree)
                if isinstance(n, ast.Constant) and n.value in names]
    return out


def test_architecture_and_drafter_tensor_names_have_one_home(tmp_path) -> None:
    """The Gemma 4 architecture names and the drafter's tensor names are spelled only in ``inspector/layouts.py``
    (everyone else imports them); a planted copy is found."""
    repo = Path(__file__).resolve().parents[1]
    assert [p for d in ("inspector", "traces", "app", "mtpscope") for p in _facts_outside_layouts(repo / d)] == []
    (tmp_path / "m.py").write_text('ARCH = "gemma4-assistant"\nNAME = "mtp.centroids.weight"\n')
    assert _facts_outside_layouts(tmp_path) == ["m.py:1", "m.py:2"]
