"""What the two converters (drafter in :mod:`inspector.convert`, target in :mod:`inspector.convert_target`) share.

One job: the pieces of an HF → GGUF conversion that do not depend on the architecture: the architecture keys
every Gemma 4 GGUF carries (:func:`common_kv`), the ``tokenizer.*`` keys to copy (:func:`tokenizer_kv_for`),
the tensors as writer values in an output type (:func:`tensor_values`, :data:`OUTTYPES`), the tensor order
(:func:`ordered`), the refusal of non-finite values (:func:`refuse_nonfinite`) and the record of what was written
(:class:`ConvertResult`).

Key names and values: llama.cpp's converter (``conversion/gemma.py`` ``Gemma4Model.set_gguf_parameters``,
llama-cpp-python 0.3.36): head dims per layer type as ``attention.key_length(_swa)`` /
``value_length(_swa)``, KV heads as one number or a per-layer array, ``rope.dimension_count`` = the full
head dim (proportional RoPE is done by ``rope_freqs``).

May import: numpy, gguf (quantization), mtpscope.errors, inspector.gguf (type ids), inspector.gguf_write,
inspector.hf_config, inspector.tokenizer, and lazily mtpscope.cache (where the default real tokenizer is kept).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from mtpscope.errors import HFCheckpointError, LayoutError
from mtpscope.inspector.gguf import BOOL, UINT32
from mtpscope.inspector.gguf_write import MetaValue, array, f32, u32, write_gguf
from mtpscope.inspector.hf_config import TextHParams
from mtpscope.inspector.layouts import GEMMA4_N_VOCAB
from mtpscope.inspector.tokenizer import n_tokens, subset_kv, tokenizer_kv

OUTTYPES = ("f32", "f16", "bf16", "q8_0")
SIDECAR_ARCH = "gemma4-assistant-centroids"
#: vocabulary size of the real Gemma 4 tokenizer (copied whole; smaller checkpoints get its first tokens)
N_VOCAB_FULL = GEMMA4_N_VOCAB

_T = TypeVar("_T")


@dataclass(frozen=True)
class ConvertResult:
    """What :func:`inspector.convert.convert` wrote."""

    out: Path
    kind: str            # "drafter" | "target"
    dialect: str | None  # drafter: "upstream" | "fork"
    arch: str
    n_tensors: int
    centroids_out: Path | None = None


def per_layer_u32(values: tuple[int, ...] | list[int]) -> MetaValue:
    """One UINT32 when every layer has the same value, else a per-layer UINT32 array (``get_key_or_arr``)."""
    return u32(values[0]) if len(set(values)) == 1 else array([int(v) for v in values], UINT32)


def common_kv(arch: str, hp: TextHParams) -> list[tuple[str, MetaValue]]:
    """Architecture keys shared by target and drafter (``{arch}.*``), from :func:`inspector.hf_config.text_hparams`.

    ``feed_forward_length`` is per layer when the widths differ (``use_double_wide_mlp``);
    ``attention.shared_kv_layers`` is the config's ``num_kv_shared_layers`` for a target, 0 for a drafter (its
    whole cache is the target's, llama.cpp's ``share`` rule; the target converter overrides it).
    """
    a = arch + "."
    return [
        (a + "context_length", u32(hp.context_length)),
        (a + "embedding_length", u32(hp.n_embd)),
        (a + "block_count", u32(hp.n_layer)),
        (a + "feed_forward_length", per_layer_u32(hp.n_ff_layers)),
        (a + "attention.head_count", u32(hp.n_head)),
        (a + "attention.head_count_kv", per_layer_u32(hp.n_head_kv)),
        (a + "attention.key_length", u32(hp.head_dim_full)),
        (a + "attention.value_length", u32(hp.head_dim_full)),
        (a + "attention.key_length_swa", u32(hp.head_dim_swa)),
        (a + "attention.value_length_swa", u32(hp.head_dim_swa)),
        (a + "attention.sliding_window", u32(hp.sliding_window)),
        (a + "attention.sliding_window_pattern", array([bool(v) for v in hp.is_swa], BOOL)),
        (a + "attention.layer_norm_rms_epsilon", f32(hp.eps)),
        (a + "attention.shared_kv_layers", u32(0)),
        (a + "rope.freq_base", f32(hp.rope_base_full)),
        (a + "rope.freq_base_swa", f32(hp.rope_base_swa)),
        (a + "rope.dimension_count", u32(hp.head_dim_full)),
        (a + "rope.dimension_count_swa", u32(hp.head_dim_swa)),
    ]


def tokenizer_kv_for(n_vocab: int, vocab_from: str | os.PathLike[str] | None) -> list[tuple[str, MetaValue]]:
    """The ``tokenizer.*`` keys to write: all of ``vocab_from`` (which must have ``n_vocab`` tokens), or of the
    real Gemma 4 tokenizer (whole for :data:`~mtpscope.inspector.layouts.GEMMA4_N_VOCAB` tokens, else its first ``n_vocab``).

    Raises:
        LayoutError: ``vocab_from`` has another number of tokens.
    """
    if vocab_from is not None:
        kv = tokenizer_kv(vocab_from)
        n = n_tokens(kv)
        if n != n_vocab:
            raise LayoutError("tokenizer size differs from the checkpoint's vocab_size", path=os.fspath(vocab_from),
                              key="tokenizer.ggml.tokens", expected=n_vocab, actual=n)
        return list(kv)
    from mtpscope.cache import vocab_path

    src = vocab_path()
    kv = tokenizer_kv(src)
    return list(kv) if n_vocab == N_VOCAB_FULL else list(subset_kv(kv, n_vocab, src))


def tensor_values(tensors: Mapping[str, np.ndarray], outtype: str) -> dict[str, Any]:
    """The arrays to write (:func:`inspector.gguf_write.write_gguf` values): integers as I32, 1-D tensors F32,
    2-D+ tensors in ``outtype`` (Q8_0 falls back to F16 for rows not a multiple of its block of 32; a 3-D
    expert tensor is quantized row by row like a matrix)."""
    import gguf

    qt = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
          "bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}[outtype]
    out: dict[str, Any] = {}
    for name, arr in tensors.items():
        a = np.asarray(arr)
        if a.dtype.kind in "iu":
            out[name] = np.ascontiguousarray(a.astype(np.int32))
            continue
        a = np.ascontiguousarray(a, dtype=np.float32)
        t = qt if a.ndim >= 2 else gguf.GGMLQuantizationType.F32
        if t == gguf.GGMLQuantizationType.Q8_0 and a.shape[-1] % 32:
            t = gguf.GGMLQuantizationType.F16  # rows not a multiple of the Q8_0 block (32)
        if t == gguf.GGMLQuantizationType.F32:
            out[name] = a
        elif t == gguf.GGMLQuantizationType.F16:
            out[name] = a.astype(np.float16)
        else:
            out[name] = (gguf.quants.quantize(a, t), t)
    return out


#: elements :func:`refuse_nonfinite` checks at a time (64 MiB of float32; its mask is a quarter of that), so the
#: check of a tensor of any size (the 31B target's embedding: 1.4 G values) holds one chunk's mask, not the whole's
NONFINITE_CHUNK_ELEMENTS = 2**24


def count_nonfinite(a: np.ndarray) -> int:
    """How many values of the float array ``a`` are NaN or Inf, counted over chunks of outermost rows of at most
    :data:`NONFINITE_CHUNK_ELEMENTS` values (a row longer than that is split the same way), so the mask held at
    once is bounded whatever the size of ``a``."""
    n = NONFINITE_CHUNK_ELEMENTS
    if a.ndim == 0 or a.size <= n:
        return int(a.size - np.count_nonzero(np.isfinite(a)))
    row = a.size // a.shape[0]
    if row > n:
        return sum(count_nonfinite(a[i]) for i in range(a.shape[0]))
    step = n // row
    return sum(int(a[i:i + step].size - np.count_nonzero(np.isfinite(a[i:i + step])))
               for i in range(0, a.shape[0], step))


def refuse_nonfinite(name: str, a: np.ndarray, path: str) -> None:
    """Refuse a float tensor holding NaN or Inf (what ``verify``'s ``E_NONFINITE`` rejects in a written file),
    checked in bounded chunks (:func:`count_nonfinite`).

    Raises:
        HFCheckpointError: naming the file and the tensor, with how many values are not finite.
    """
    a = np.asarray(a)
    if a.dtype.kind == "f":
        bad = count_nonfinite(a)
        if bad:
            raise HFCheckpointError("tensor holds NaN or Inf", path=path, key=name, expected="finite values",
                                    actual=f"{bad} non-finite values")


def ordered(g: Mapping[str, _T]) -> dict[str, _T]:
    """Tensors in the order llama.cpp's converter writes them: ``token_embd``, ``rope_freqs`` and the other
    globals first, then the blocks by index, then the rest."""
    def key(n: str) -> tuple[int, int, str]:
        if n.startswith("blk."):
            return (1, int(n.split(".")[1]), n)
        return (0 if n in ("token_embd.weight", "rope_freqs.weight") else 2, 0, n)
    return {n: g[n] for n in sorted(g, key=key)}


def write_converted(path: Path, arch: str, kv: list[tuple[str, MetaValue]], tok_kv: list[tuple[str, MetaValue]],
                    tensors: Mapping[str, np.ndarray], outtype: str) -> Path:
    """Write one converted GGUF (keys, tokenizer keys, tensors in ``outtype``) atomically."""
    return write_gguf(path, arch, kv + tok_kv, tensor_values(tensors, outtype))


__all__ = ["NONFINITE_CHUNK_ELEMENTS", "N_VOCAB_FULL", "OUTTYPES", "SIDECAR_ARCH", "ConvertResult",
           "common_kv", "count_nonfinite", "ordered", "per_layer_u32", "refuse_nonfinite", "tensor_values",
           "tokenizer_kv_for", "write_converted"]
