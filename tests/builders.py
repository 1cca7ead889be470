"""Builders of test GGUF files: the demo's tiny pair as parts, written one defect at a time.

Files are the demo's tiny pair (mtpscope/demo/build.py: drafter n_embd 128, backbone 64, 4 layers [s,s,s,f],
n_head 2, n_head_kv 1, head dims 32 / 64, n_ff 128) with the first 4096 real Gemma 4 tokens, written with
mtpscope's one GGUF writer (:func:`mtpscope.inspector.gguf_write.write_gguf`, gguf-py's GGUFWriter underneath,
independent of the reader under test), then mutated one defect at a time.

* :func:`parts` — ``(arch, {key: MetaValue}, {name: array})`` of a valid ``target`` / ``upstream`` / ``fork``
  file (fresh copies); :func:`write` writes them (a tensor value may be ``(raw bytes, ggml type)``, see
  :func:`q8_0`);
* mutations: :func:`set_key`, :func:`drop_keys`, :func:`drop_tensors`, :func:`add_tensor`, :func:`map_tensor`,
  :func:`rename`, :func:`set_arch`, :func:`chain` — each returns ``f(kv, tensors) -> new arch or None``;
* :data:`MUTANTS` — named mutants with whether llama-cpp-python 0.3.36 loads them (tests/test_loadability.py
  checks that against the real runtime); :func:`build` writes one;
* :func:`verify_kind` (write + ``verify``), :func:`one` (the single finding of a code);
* :func:`hf_tensors` / :func:`hf_config` — the fork drafter as a Hugging Face checkpoint (HF audit tests).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.demo import build as demo
from mtpscope.inspector.gguf import ARRAY as GGUF_ARRAY
from mtpscope.inspector.gguf import BOOL as GGUF_BOOL
from mtpscope.inspector.gguf import INT32 as GGUF_INT32
from mtpscope.inspector.gguf import STRING as GGUF_STRING
from mtpscope.inspector.gguf import UINT32 as GGUF_UINT32
from mtpscope.inspector.gguf_write import MetaValue, write_gguf
from mtpscope.inspector.gguf_write import u32 as U32

DIMS = demo.DEFAULT_DIMS
N_VOCAB = 4096
#: prompts the recorder tests run on the tiny pair (conftest's ``pair``)
TINY_PROMPTS = ["The quick brown fox", "Every sailor sings about distant islands", "Hello world"]
N_C = 32          # demo default for a 4096-token vocabulary
VSC = N_VOCAB // N_C  # 128


@functools.cache
def _base(kind: str) -> tuple[str, tuple[tuple[str, MetaValue], ...], tuple[tuple[str, np.ndarray], ...]]:
    voc = demo.load_vocab("subset")
    tw = demo.target_weights(voc, DIMS, 0)
    if kind == "target":
        kv = demo._hparam_kv(demo.ARCH_TARGET, DIMS, target=True, n_vocab=voc.n_vocab) + list(voc.kv)
        return demo.ARCH_TARGET, tuple(kv), tuple(tw.items())
    w = demo.drafter_weights(tw, DIMS)
    if kind == "upstream":
        arch = demo.ARCH_UPSTREAM
        kv = demo._hparam_kv(arch, DIMS, target=False, n_vocab=voc.n_vocab)
        kv += [(arch + ".embedding_length_out", U32(DIMS.n_embd_backbone)),
               (arch + ".nextn_predict_layers", U32(DIMS.n_layer_drafter))]
        return arch, tuple(kv + list(voc.kv)), tuple(w.items())
    arch = demo.ARCH_FORK
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
    """Write with :func:`mtpscope.inspector.gguf_write.write_gguf` (arch None: no general.architecture).
    A tensor value may be ``(raw_bytes_array, GGMLQuantizationType)``."""
    return write_gguf(path, arch, kv, tensors)


def q8_0(a: np.ndarray) -> tuple[np.ndarray, Any]:
    """``a`` quantized to Q8_0 by gguf-py: ``(raw bytes, GGMLQuantizationType.Q8_0)`` for :func:`write`."""
    import gguf
    from gguf import quants

    t = gguf.GGMLQuantizationType.Q8_0
    return quants.quantize(a.astype(np.float32), t), t


# --- mutations: each returns f(kv, tensors) -> new arch or None ------------------------------------------

Mut = Callable[[dict[str, MetaValue], dict[str, Any]], "str | None"]
UP = demo.ARCH_UPSTREAM
FK = demo.ARCH_FORK


def set_key(key: str, value: MetaValue) -> Mut:
    """Set key ``key`` to ``value``."""
    def f(kv: dict[str, MetaValue], t: dict[str, Any]) -> None:
        kv[key] = value
    return f


def drop_keys(*keys: str) -> Mut:
    """Delete these keys."""
    def f(kv: dict[str, MetaValue], t: dict[str, Any]) -> None:
        for k in keys:
            del kv[k]
    return f


def drop_tensors(*names: str) -> Mut:
    """Delete these tensors."""
    def f(kv: dict[str, MetaValue], t: dict[str, Any]) -> None:
        for n in names:
            del t[n]
    return f


def add_tensor(name: str, arr: np.ndarray) -> Mut:
    """Add (or replace) tensor ``name``."""
    def f(kv: dict[str, MetaValue], t: dict[str, Any]) -> None:
        t[name] = arr
    return f


def map_tensor(name: str, fn: Callable[[Any], Any]) -> Mut:
    """Replace tensor ``name`` by ``fn(old)``."""
    def f(kv: dict[str, MetaValue], t: dict[str, Any]) -> None:
        t[name] = fn(t[name])
    return f


def rename(old: str, new: str) -> Mut:
    """Rename a tensor."""
    def f(kv: dict[str, MetaValue], t: dict[str, Any]) -> None:
        t[new] = t.pop(old)
    return f


def set_arch(new: str) -> Mut:
    """Rename the architecture (and every ``{arch}.*`` key)."""
    def f(kv: dict[str, MetaValue], t: dict[str, Any]) -> str:
        old = next(k.split(".")[0] for k in kv if k.endswith(".block_count"))
        for k in [k for k in kv if k.startswith(old + ".")]:
            kv[new + k[len(old):]] = kv.pop(k)
        return new
    return f


def chain(*fs: Mut) -> Mut:
    """Apply several mutations in order (the last new arch wins)."""
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


# name: (kind, mutation or None, upstream loads in llama-cpp-python 0.3.36 (checked by test_loadability))
MUTANTS: dict[str, tuple[str, Mut | None, bool]] = {
    "valid_upstream": ("upstream", None, True),
    "valid_fork": ("fork", None, False),
    "valid_target": ("target", None, True),
    "up_q8_0_matrices": ("upstream", _quantize_matrices, True),
    "up_extra_metadata_key": ("upstream", set_key("mtpscope.test.extra", U32(7)), True),
    "up_norm_f16": ("upstream", map_tensor("blk.0.attn_norm.weight", lambda a: a.astype(np.float16)), True),
    "up_masked_embd": ("upstream", _masked, False),
    "up_missing_layer_scale": ("upstream", drop_tensors("blk.1.layer_output_scale.weight"), False),
    "up_missing_rope_freqs": ("upstream", drop_tensors("rope_freqs.weight"), False),
    "up_missing_ffn_up": ("upstream", drop_tensors("blk.2.ffn_up.weight"), False),
    "up_pre_proj_backbone_96": ("upstream", add_tensor("nextn.pre_projection.weight",
                                                         np.zeros((128, 192), np.float32)), False),
    "up_post_proj_transposed": ("upstream", map_tensor("nextn.post_projection.weight", lambda a: a.T.copy()), False),
    "up_out_equals_embd": ("upstream", set_key(UP + ".embedding_length_out", U32(128)), False),
    "up_no_embedding_length_out": ("upstream", drop_keys(UP + ".embedding_length_out"), False),
    "up_no_nextn": ("upstream", drop_keys(UP + ".nextn_predict_layers"), False),
    "up_extra_attn_k": ("upstream", add_tensor("blk.0.attn_k.weight", np.zeros((32, 128), np.float32)), False),
    "up_fork_projection_names": ("upstream", chain(rename("nextn.pre_projection.weight", "mtp.pre_projection.weight"),
                                                   rename("nextn.post_projection.weight",
                                                          "mtp.post_projection.weight")), False),
    "up_value_length_swa_16": ("upstream", set_key(UP + ".attention.value_length_swa", U32(16)), False),
    "up_n_ff_256": ("upstream", set_key(UP + ".feed_forward_length", U32(256)), False),
    "up_vocab_rows_4000": ("upstream", _truncate_vocab_rows, False),
    "up_no_merges": ("upstream", _drop_tokenizer_merges, False),
    "up_no_swa_pattern": ("upstream", drop_keys(UP + ".attention.sliding_window_pattern"), False),
    "up_nonfinite_norm": ("upstream", map_tensor("blk.1.ffn_norm.weight",
                                                 lambda a: np.where(np.arange(a.size) == 3, np.nan, a)
                                                 .astype(np.float32)), True),
    "up_as_fork_arch": ("upstream", set_arch(FK), False),
    "up_embedding_length_string": ("upstream", set_key(UP + ".embedding_length", MetaValue(GGUF_STRING, "128")), False),
    "up_head_count_kv_array": ("upstream", set_key(UP + ".attention.head_count_kv",
                                                   MetaValue(GGUF_ARRAY, np.array([1, 1, 1, 2], np.uint32),
                                                             GGUF_UINT32)), True),
    "up_head_count_array_wrong": ("upstream", set_key(UP + ".attention.head_count",
                                                      MetaValue(GGUF_ARRAY, np.array([2, 2, 2, 4], np.uint32),
                                                                GGUF_UINT32)), False),
    "up_head_count_array_short": ("upstream", set_key(UP + ".attention.head_count",
                                                      MetaValue(GGUF_ARRAY, np.array([2, 2, 2], np.uint32),
                                                                GGUF_UINT32)), False),
    # llama.cpp reads the integer hyperparameters as uint32_t: another scalar type refuses the file ("has wrong type
    # i32 but expected type u32"; verify said OK and "loads"); a per-layer array may hold INT32 elements
    "up_block_count_i32": ("upstream", set_key(UP + ".block_count", MetaValue(GGUF_INT32, 4)), False),
    "up_head_count_kv_array_i32": ("upstream", set_key(UP + ".attention.head_count_kv",
                                                       MetaValue(GGUF_ARRAY, np.array([1, 1, 1, 2], np.int32),
                                                                 GGUF_INT32)), True),
    "target_no_per_layer_key": ("target", drop_keys("gemma4.embedding_length_per_layer_input"), False),
    "target_missing_attn_k": ("target", drop_tensors("blk.1.attn_k.weight"), False),
    "target_no_attn_v": ("target", drop_tensors("blk.0.attn_v.weight", "blk.1.attn_v.weight"), True),
}


def build(tmp_path: Path, name: str) -> Path:
    """Write mutant ``name`` of :data:`MUTANTS` into ``tmp_path``."""
    kind, fn, _ = MUTANTS[name]
    arch, kv, t = parts(kind)
    if fn is not None:
        arch = fn(kv, t) or arch
    return write(tmp_path / f"{name}.gguf", arch, kv, t)


def verify_kind(tmp_path: Path, kind: str, fn: Mut | None = None, name: str = "m.gguf", **kw: Any):
    """Write a ``kind`` file mutated by ``fn`` into ``tmp_path / name`` and ``verify`` it (``kw`` passed on)."""
    from mtpscope.inspector.validate import verify

    arch, kv, t = parts(kind)
    if fn is not None:
        arch = fn(kv, t) or arch
    return verify(write(tmp_path / name, arch, kv, t), **kw)


def one(report: Any, code: str) -> Any:
    """The single finding of ``code`` in ``report`` (asserts there is exactly one)."""
    hits = [f for f in report.findings if f.code == code]
    assert len(hits) == 1, (code, [(f.code, f.subject) for f in report.findings])
    return hits[0]




# --- the same drafter as a Hugging Face checkpoint (HF audit tests) ------------------------------------

# GGUF (fork names) -> HF checkpoint names, written out by hand from facts §2
_LAYER = {"attn_q": "self_attn.q_proj.weight", "attn_q_norm": "self_attn.q_norm.weight",
          "attn_output": "self_attn.o_proj.weight", "attn_norm": "input_layernorm.weight",
          "post_attention_norm": "post_attention_layernorm.weight", "ffn_norm": "pre_feedforward_layernorm.weight",
          "post_ffw_norm": "post_feedforward_layernorm.weight", "ffn_gate": "mlp.gate_proj.weight",
          "ffn_up": "mlp.up_proj.weight", "ffn_down": "mlp.down_proj.weight", "layer_output_scale": "layer_scalar"}
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "mtp.pre_projection.weight": "pre_projection.weight",
           "mtp.post_projection.weight": "post_projection.weight",
           "mtp.centroids.weight": "masked_embedding.centroids.weight",
           "mtp.token_ordering.weight": "masked_embedding.token_ordering"}


def hf_tensors() -> dict[str, np.ndarray]:
    """The fork demo drafter (:func:`parts`) as an HF checkpoint: ``{HF name: array}`` (numpy shapes, the
    ordering int64); rope_freqs left out (the converter generates it)."""
    _, _, t = parts("fork")
    out = {}
    for name, a in t.items():
        if name == "rope_freqs.weight":
            continue                       # generated by the converter, not in the checkpoint
        if name in _GLOBAL:
            hname = _GLOBAL[name]
        else:
            _, il, short, _w = name.split(".")
            hname = f"model.layers.{il}.{_LAYER[short]}"
        if hname == "masked_embedding.token_ordering":
            a = a.astype(np.int64)
        out[hname] = np.ascontiguousarray(a)
    return out


def hf_config() -> dict:
    """The config.json of the checkpoint :func:`hf_tensors` holds (the demo drafter's dimensions, 4096 tokens)."""
    return {
        "architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_assistant",
        "backbone_hidden_size": DIMS.n_embd_backbone, "use_ordered_embeddings": True, "num_centroids": N_C,
        "centroid_intermediate_top_k": 8, "tie_word_embeddings": True,
        "text_config": {
            "hidden_size": DIMS.n_embd, "num_hidden_layers": 4, "intermediate_size": DIMS.n_ff,
            "num_attention_heads": DIMS.n_head, "num_key_value_heads": DIMS.n_head_kv, "head_dim": DIMS.head_dim_swa,
            "global_head_dim": DIMS.head_dim, "sliding_window": DIMS.sliding_window, "vocab_size": 4096,
            "layer_types": ["sliding_attention"] * 3 + ["full_attention"], "num_global_key_value_heads": DIMS.n_head_kv,
            "rope_parameters": {"sliding_attention": {"rope_theta": 1e4},
                                "full_attention": {"rope_theta": 1e6, "partial_rotary_factor": 0.25,
                                                   "rope_type": "proportional"}},
        },
    }

__all__ = ["DIMS", "FK", "GGUF_ARRAY", "GGUF_BOOL", "GGUF_STRING", "GGUF_UINT32", "MUTANTS", "N_C", "N_VOCAB",
           "UP", "U32", "VSC", "MetaValue", "Mut", "add_tensor", "build", "chain", "drop_keys", "drop_tensors",
           "hf_config", "hf_tensors", "map_tensor", "one", "parts", "q8_0", "rename", "set_arch", "set_key", "verify_kind", "write"]
