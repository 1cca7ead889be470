"""Synthetic Gemma 4 models for the memory-estimate checks: any layer count and widths, tensor data a
hole (``os.truncate``), written with gguf-py's GGUFWriter (header only) so llama.cpp loads them and
creates contexts (no decode: the values are zeros).

The tokenizer is the demo's real-token subset (first 4096 Gemma 4 tokens, mtpscope/demo/vocab.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class SynthTarget:
    n_layer: int = 24
    n_embd: int = 512
    n_ff: int = 1024
    n_head: int = 8
    n_head_kv_swa: int = 4
    n_head_kv_full: int = 2
    head_dim_swa: int = 64
    head_dim_full: int = 128
    window: int = 512
    shared_kv_layers: int = 0
    pattern: tuple[bool, ...] = field(default=())  # True = sliding; default: 5 sliding then 1 full
    weight_type: str = "Q8_0"
    context_length: int = 131072
    write_value_length_swa: bool = True   # False: no attention.value_length_swa key (llama.cpp's default then)

    def swa(self) -> tuple[bool, ...]:
        if self.pattern:
            return self.pattern
        return tuple((il % 6) != 5 for il in range(self.n_layer))


def write_synth_target(path: Path, s: SynthTarget, vocab_kv: list) -> Path:
    import gguf
    from gguf import GGMLQuantizationType as Q

    arch = "gemma4"
    swa = s.swa()
    w = gguf.GGUFWriter(str(path), arch)
    a = arch + "."
    kv_heads = [s.n_head_kv_swa if x else s.n_head_kv_full for x in swa]
    w.add_uint32(a + "context_length", s.context_length)
    w.add_uint32(a + "embedding_length", s.n_embd)
    w.add_uint32(a + "block_count", s.n_layer)
    w.add_uint32(a + "feed_forward_length", s.n_ff)
    w.add_uint32(a + "attention.head_count", s.n_head)
    w.add_key_value(a + "attention.head_count_kv", kv_heads, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.UINT32)
    w.add_uint32(a + "attention.key_length", s.head_dim_full)
    w.add_uint32(a + "attention.value_length", s.head_dim_full)
    w.add_uint32(a + "attention.key_length_swa", s.head_dim_swa)
    if s.write_value_length_swa:
        w.add_uint32(a + "attention.value_length_swa", s.head_dim_swa)
    w.add_uint32(a + "attention.sliding_window", s.window)
    w.add_key_value(a + "attention.sliding_window_pattern", list(swa), gguf.GGUFValueType.ARRAY,
                    sub_type=gguf.GGUFValueType.BOOL)
    w.add_float32(a + "attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32(a + "attention.shared_kv_layers", s.shared_kv_layers)
    w.add_float32(a + "rope.freq_base", 1e6)
    w.add_float32(a + "rope.freq_base_swa", 1e4)
    w.add_uint32(a + "rope.dimension_count", s.head_dim_full)
    w.add_uint32(a + "rope.dimension_count_swa", s.head_dim_swa)
    w.add_uint32(a + "embedding_length_per_layer_input", 0)
    w.add_float32(a + "final_logit_softcapping", 30.0)
    n_vocab = 0
    for key, mv in vocab_kv:
        vt = gguf.GGUFValueType(mv.type)
        if vt == gguf.GGUFValueType.ARRAY:
            val = mv.value.tolist() if isinstance(mv.value, np.ndarray) else list(mv.value)
            w.add_key_value(key, val, vt, sub_type=gguf.GGUFValueType(mv.sub_type))
            if key == "tokenizer.ggml.tokens":
                n_vocab = len(val)
        else:
            w.add_key_value(key, mv.value, vt)
    wt = Q[s.weight_type]
    bs, ts = gguf.GGML_QUANT_SIZES[wt]

    def mat(name: str, ne0: int, ne1: int) -> None:  # GGUF ne (ne0 innermost)
        w.add_tensor_info(name, (ne1, ne0), np.dtype(np.float32), ne0 * ne1 // bs * ts, raw_dtype=wt)

    def vec(name: str, n: int) -> None:
        w.add_tensor_info(name, (n,), np.dtype(np.float32), n * 4)

    mat("token_embd.weight", s.n_embd, n_vocab)
    vec("output_norm.weight", s.n_embd)
    vec("rope_freqs.weight", s.head_dim_full // 2)
    n_kv_layers = s.n_layer - s.shared_kv_layers
    for il, sl in enumerate(swa):
        hd = s.head_dim_swa if sl else s.head_dim_full
        nkv = kv_heads[il]
        b = f"blk.{il}."
        vec(b + "attn_norm.weight", s.n_embd)
        mat(b + "attn_q.weight", s.n_embd, s.n_head * hd)
        if il < n_kv_layers:
            mat(b + "attn_k.weight", s.n_embd, nkv * hd)
            mat(b + "attn_v.weight", s.n_embd, nkv * hd)
            vec(b + "attn_k_norm.weight", hd)
        mat(b + "attn_output.weight", s.n_head * hd, s.n_embd)
        vec(b + "attn_q_norm.weight", hd)
        vec(b + "post_attention_norm.weight", s.n_embd)
        vec(b + "layer_output_scale.weight", 1)
        vec(b + "ffn_norm.weight", s.n_embd)
        mat(b + "ffn_gate.weight", s.n_embd, s.n_ff)
        mat(b + "ffn_up.weight", s.n_embd, s.n_ff)
        mat(b + "ffn_down.weight", s.n_ff, s.n_embd)
        vec(b + "post_ffw_norm.weight", s.n_embd)
    return header_and_hole(w, path)


def header_and_hole(w, path: Path) -> Path:
    """Write GGUFWriter ``w``'s header and tensor table, then extend the file to where its tensor data would end
    (a hole: no data written, nothing read by llama.cpp's mmap until used)."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    align = 32
    total = -(-path.stat().st_size // align) * align
    for ti in w.tensors[0].values():
        total += -(-ti.nbytes // align) * align
    os.truncate(path, total)
    return path


def parse_llama_sizes(pieces: list[str]) -> dict:
    """Sizes llama.cpp logged while loading a model / creating a context, in MiB as printed:
    ``model`` {buffer name: MiB} (``load_tensors: X model buffer size``), ``kv_buffer`` {name: MiB}
    (allocated KV buffers), ``kv`` [(cells, layers, K MiB, V MiB)] (``llama_kv_cache: size = ...``
    lines, one per cache; shared layers included, allocation or not), ``compute`` {name: MiB},
    ``output`` {name: MiB}."""
    import re

    out: dict = {"model": {}, "kv_buffer": {}, "kv": [], "compute": {}, "output": {}}
    for line in "".join(pieces).splitlines():
        m = re.search(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB", line)
        if m:
            out["model"][m.group(1)] = out["model"].get(m.group(1), 0.0) + float(m.group(2))
        m = re.search(r"llama_kv_cache:\s+(\S+) KV buffer size =\s+([\d.]+) MiB", line)
        if m:
            out["kv_buffer"][m.group(1)] = out["kv_buffer"].get(m.group(1), 0.0) + float(m.group(2))
        m = re.search(r"llama_kv_cache: size =\s+([\d.]+) MiB \(\s*(\d+) cells,\s+(\d+) layers.*K \((\w+)\):\s+([\d.]+) MiB, "
                      r"V \((\w+)\):\s+([\d.]+) MiB", line)
        if m:
            out["kv"].append((int(m.group(2)), int(m.group(3)), float(m.group(5)), float(m.group(7))))
        m = re.search(r"(\S+) compute buffer size =\s+([\d.]+) MiB", line)
        if m:
            out["compute"][m.group(1)] = out["compute"].get(m.group(1), 0.0) + float(m.group(2))
        m = re.search(r"(\S+)\s+output buffer size =\s+([\d.]+) MiB", line)
        if m:
            out["output"][m.group(1)] = out["output"].get(m.group(1), 0.0) + float(m.group(2))
    return out


#: a synthetic target shaped like Gemma 4 E2B (35 layers, 20 of them sharing KV), small enough to load in llama.cpp
E2B_LIKE = SynthTarget(n_layer=35, shared_kv_layers=20, n_embd=384, n_ff=2048, n_head=4, n_head_kv_swa=1,
                       n_head_kv_full=1, head_dim_swa=256, head_dim_full=512, window=512,
                       pattern=tuple(il % 5 != 4 for il in range(35)))


def compute_close(m, got_mib: float) -> bool:
    """Whether llama.cpp's compute buffer (``got_mib``, MiB as logged) lies within
    :data:`inspector.estimate.COMPUTE_TOLERANCE` of one of the two allocator outcomes of a
    :class:`inspector.estimate.ModelEstimate` (``compute_bytes`` / ``compute_bytes_max``)."""
    from mtpscope.inspector.estimate import COMPUTE_TOLERANCE

    return any(abs(b / (1 << 20) - got_mib) <= COMPUTE_TOLERANCE * got_mib
               for b in (m.compute_bytes, m.compute_bytes_max))


def write_hole_gguf(path: Path, model, vocab_kv: list) -> Path:
    """A GGUF with the keys and tensor table of ``model`` (:class:`inspector.config_model.ConfigModel`: what the
    converter would write from a published config) and ``vocab_kv`` (``tokenizer.*`` writer values), the tensor
    data a hole: llama.cpp loads it (mmap) and creates contexts at the model's real size, no data read.
    Written with gguf-py's GGUFWriter (an independent writer)."""
    import gguf

    w = gguf.GGUFWriter(str(path), model.architecture)

    def add(key: str, mv) -> None:
        vt = gguf.GGUFValueType(mv.type)
        if vt == gguf.GGUFValueType.ARRAY:
            val = mv.value.tolist() if isinstance(mv.value, np.ndarray) else list(mv.value)
            w.add_key_value(key, val, vt, sub_type=gguf.GGUFValueType(mv.sub_type))
        else:
            w.add_key_value(key, mv.value, vt)

    for key, mv in model.meta.items():
        add(key, mv)
    for key, mv in vocab_kv:
        add(key, mv)
    for t in model.tensors:
        raw = gguf.GGMLQuantizationType(t.ggml_type)
        w.add_tensor_info(t.name, tuple(reversed(t.ne)), np.dtype(np.float32), t.n_bytes, raw_dtype=raw)
    return header_and_hole(w, path)
