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
inspector.hf_config, inspector.safetensors (its lazy tensors), inspector.tokenizer, and lazily mtpscope.cache (where the default real tokenizer is kept).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from mtpscope.errors import HFCheckpointError, LayoutError
from mtpscope.inspector.gguf import BOOL, UINT32
from mtpscope.inspector.gguf_write import MetaValue, StreamedTensor, array, f32, u32, write_gguf
from mtpscope.inspector.hf_config import TextHParams
from mtpscope.inspector.layouts import GEMMA4_N_VOCAB
from mtpscope.inspector.safetensors import INTEGER_DTYPES, LazyTensor
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
        if n is None:     # (no tokenizer at all: said as such, not "got None")
            raise LayoutError("the file has no tokenizer to copy", path=os.fspath(vocab_from),
                              key="tokenizer.ggml.tokens", expected=f"{n_vocab} tokens", actual="no such key")
        if n != n_vocab:
            raise LayoutError("tokenizer size differs from the checkpoint's vocab_size", path=os.fspath(vocab_from),
                              key="tokenizer.ggml.tokens", expected=n_vocab, actual=n)
        return list(kv)
    from mtpscope.cache import vocab_path

    src = vocab_path()
    kv = tokenizer_kv(src)
    return list(kv) if n_vocab == N_VOCAB_FULL else list(subset_kv(kv, n_vocab, src))


#: values a tensor is converted and written in at a time (64 MiB of float32): whole outermost rows, at least one
WRITE_BLOCK_ELEMENTS = 2**24

#: a tensor to write: a numpy array (numpy order) or a checkpoint tensor read a block of rows at a time
Source = np.ndarray | LazyTensor


def values_of(x: Source) -> np.ndarray:
    """The whole of ``x`` as a numpy array (a checkpoint tensor read: for small tensors, a scale or an ordering)."""
    return x.load() if isinstance(x, LazyTensor) else np.asarray(x)


def tensor_values(tensors: Mapping[str, Source], outtype: str) -> dict[str, StreamedTensor]:
    """The tensors to write (:func:`inspector.gguf_write.write_gguf` values), each converted while it is written, a
    block of :data:`WRITE_BLOCK_ELEMENTS` values at a time: integers as I32, 1-D tensors F32, 2-D+ tensors in
    ``outtype`` (Q8_0 falls back to F16 for rows not a multiple of its block of 32; a 3-D expert tensor is
    quantized row by row like a matrix, which its blocks of outermost rows keep: each row's bytes are the same
    whether quantized alone or with the others). Memory: one block, whatever the tensors' sizes (a block holds one
    outermost row at least: a tensor whose rows are each larger than a block is written a row at a time)."""
    import gguf

    q = gguf.GGMLQuantizationType
    qt = {"f32": q.F32, "f16": q.F16, "bf16": q.BF16, "q8_0": q.Q8_0}[outtype]
    out: dict[str, StreamedTensor] = {}
    for name, x in tensors.items():
        shape = tuple(x.shape)
        # integers as I32; any other values (floats, and bool as before) as floats
        is_int = x.header.dtype in INTEGER_DTYPES if isinstance(x, LazyTensor) else np.asarray(x).dtype.kind in "iu"
        if is_int:
            t = q.I32
        else:
            t = qt if len(shape) >= 2 else q.F32
            if t == q.Q8_0 and shape[-1] % 32:
                t = q.F16  # rows not a multiple of the Q8_0 block (32)
        n = math.prod(shape)
        block, size = gguf.GGML_QUANT_SIZES[t]
        rows = x.rows if isinstance(x, LazyTensor) else functools.partial(_array_rows, np.asarray(x))
        out[name] = StreamedTensor(shape, int(t), n // block * size,
                                   functools.partial(_blocks, rows, shape, t))
    return out


def _array_rows(a: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Outermost rows ``start:stop`` of ``a`` (a 0-d array: itself)."""
    return a[start:stop] if a.ndim else a


def _blocks(rows: Any, shape: tuple[int, ...], t: Any) -> Iterator[np.ndarray]:
    """The data of a tensor of numpy ``shape`` in GGML type ``t``: its outermost rows (``rows(start, stop)``) a block
    at a time, converted (:func:`tensor_values`)."""
    import gguf

    q = gguf.GGMLQuantizationType
    n_rows = shape[0] if shape else 1
    per_row = math.prod(shape[1:]) if shape else 1
    step = max(1, WRITE_BLOCK_ELEMENTS // max(per_row, 1))
    for i in range(0, n_rows, step):
        a = np.asarray(rows(i, i + step))
        if t == q.I32:
            yield np.ascontiguousarray(a.astype(np.int32))
            continue
        a = np.ascontiguousarray(a, dtype=np.float32)
        if t == q.F32:
            yield a
        elif t == q.F16:
            yield a.astype(np.float16)
        else:
            yield gguf.quants.quantize(a, t)


#: elements :func:`refuse_nonfinite` checks at a time (64 MiB of float32; its mask is a quarter of that), so the
#: check of a tensor of any size (the 31B target's embedding: 1.4 G values) holds one chunk's mask, not the whole's
NONFINITE_CHUNK_ELEMENTS = 2**24


def _nonfinite(a: np.ndarray, bf16: bool) -> int:
    if bf16:        # bfloat16's exponent (bits 7..14) all ones: Inf or NaN, as float32's top half
        return int(np.count_nonzero((a & 0x7F80) == 0x7F80))
    return int(a.size - np.count_nonzero(np.isfinite(a)))


def count_nonfinite(a: np.ndarray, *, bf16: bool = False) -> int:
    """How many values of the float array ``a`` are NaN or Inf (``bf16``: ``a`` holds bfloat16 values' raw 16 bits,
    as uint16), counted over chunks of outermost rows of at most :data:`NONFINITE_CHUNK_ELEMENTS` values (a row longer
    than that is split the same way), so the mask held at once is bounded whatever the size of ``a``."""
    n = NONFINITE_CHUNK_ELEMENTS
    if a.ndim == 0 or a.size <= n:
        return _nonfinite(a, bf16)
    row = a.size // a.shape[0]
    if row > n:
        return sum(count_nonfinite(a[i], bf16=bf16) for i in range(a.shape[0]))
    step = n // row
    return sum(_nonfinite(a[i:i + step], bf16) for i in range(0, a.shape[0], step))


def refuse_nonfinite(name: str, a: Source, path: str) -> None:
    """Refuse a float tensor holding NaN or Inf (what ``verify``'s ``E_NONFINITE`` rejects in a written file),
    checked in bounded chunks (:func:`count_nonfinite`); a checkpoint tensor as it is stored (BF16's bits tested,
    not widened).

    Raises:
        HFCheckpointError: naming the file and the tensor, with how many values are not finite.
    """
    if isinstance(a, LazyTensor):
        bf16 = a.header.dtype == "BF16"
        bad = count_nonfinite(a.stored, bf16=True) if bf16 else (count_nonfinite(a.stored) if a.is_float else 0)
    else:
        a = np.asarray(a)
        bad = count_nonfinite(a) if a.dtype.kind == "f" else 0
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
                    tensors: Mapping[str, Source], outtype: str) -> Path:
    """Write one converted GGUF (keys, tokenizer keys, tensors in ``outtype``, a block at a time:
    :func:`tensor_values`) atomically."""
    return write_gguf(path, arch, kv + tok_kv, tensor_values(tensors, outtype))


__all__ = ["NONFINITE_CHUNK_ELEMENTS", "N_VOCAB_FULL", "OUTTYPES", "SIDECAR_ARCH", "WRITE_BLOCK_ELEMENTS",
           "ConvertResult", "Source", "common_kv", "count_nonfinite", "ordered", "per_layer_u32", "refuse_nonfinite",
           "tensor_values", "tokenizer_kv_for", "values_of", "write_converted"]
