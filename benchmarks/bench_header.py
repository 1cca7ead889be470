"""Header-reading speed of our GGUF reader against gguf-py's GGUFReader (the baseline).

1. ``ggml-vocab-gemma-4.gguf`` (the real Gemma 4 tokenizer: 262144 tokens, 514906 merges): parse time
   of ``open_gguf`` (best of N) and of ``GGUFReader`` (one run), their ratio (target >= 40x), and a
   check that every key, value and type is equal between the two (the values are decoded from our lazy
   arrays for the check; that decode is timed separately and reported, it is not part of the parse).
2. A >= 10 GB sparse GGUF with a few thousand tensors (header written with gguf's GGUFWriter, data
   region a hole made by ``truncate``): time of ``open_gguf`` + ``build_inventory`` (target <= 50 ms,
   which is only possible if no tensor data is touched), and the same with the real tokenizer's metadata
   in the header.
3. Peak Python heap (tracemalloc) of each parse and the process's max RSS.

Run: ``.venv/bin/python -m benchmarks.bench_header [--repeat N] [--layers L]``. Prints numbers; asserts
nothing about time (speed targets are reported, not tested).
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import best_cpu_time, best_time
from mtpscope.inspector.gguf import ArrayValue, open_gguf
from mtpscope.inspector.inventory import build_inventory


def _peak(fn: Any) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _eq(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def check_equal(path: Path, reader: Any) -> int:
    """Every key, type and value of our reader equals GGUFReader's; returns how many values compared."""
    f = open_gguf(path)
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    if keys != list(f.kv):
        raise SystemExit("key lists differ")
    n = 0
    for k in keys:
        field, kv = reader.fields[k], f.kv[k]
        if kv.value_type != int(field.types[0]) or kv.offset != field.offset:
            raise SystemExit(f"type/offset of {k} differ")
        want = field.contents()
        got = kv.value.to_list() if isinstance(kv.value, ArrayValue) else kv.value
        if isinstance(got, list):
            if len(got) != len(want) or not all(_eq(x, y) for x, y in zip(got, want)):
                raise SystemExit(f"values of {k} differ")
            n += len(got)
        else:
            if not _eq(got, want):
                raise SystemExit(f"value of {k} differs: {got!r} vs {want!r}")
            n += 1
    if reader.data_offset != f.data_offset or len(reader.tensors) != len(f.tensors):
        raise SystemExit("data offset / tensor count differ")
    return n


# ------------------------------------------------------------------------------------ sparse file


def write_sparse_model(path: Path, n_layers: int, vocab: Path | None) -> tuple[int, int]:
    """A gemma4-like target header with ``n_layers`` x 20 tensors (Q8_0 matrices, F32 norms), data a hole.

    Returns (file size, tensor count). Shapes: n_embd 4096, n_ff 16384, 16 heads x 256, vocab 262144.
    """
    import gguf
    from gguf import GGMLQuantizationType as Q

    n_embd, n_ff, n_head, hd, n_vocab = 4096, 16384, 16, 256, 262144
    w = gguf.GGUFWriter(str(path), "gemma4")
    w.add_uint32("gemma4.block_count", n_layers)
    w.add_uint32("gemma4.embedding_length", n_embd)
    if vocab is not None:  # copy the real tokenizer's keys (values decoded by our reader)
        src = open_gguf(vocab)
        for k, kv in src.kv.items():
            if k.startswith("tokenizer."):
                v = kv.value
                if isinstance(v, ArrayValue):
                    w.add_key_value(k, v.to_list(), gguf.GGUFValueType.ARRAY,
                                    sub_type=gguf.GGUFValueType(v.element_type))
                else:
                    w.add_key_value(k, v, gguf.GGUFValueType(kv.value_type))

    def q8(name: str, shape: tuple[int, ...]) -> None:  # shape in numpy order
        n = int(np.prod(shape))
        w.add_tensor_info(name, shape, np.dtype(np.float32), n // 32 * 34, raw_dtype=Q.Q8_0)

    def f32(name: str, shape: tuple[int, ...]) -> None:
        w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)

    q8("token_embd.weight", (n_vocab, n_embd))
    f32("output_norm.weight", (n_embd,))
    f32("rope_freqs.weight", (hd // 2,))
    for il in range(n_layers):
        b = f"blk.{il}."
        for n in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm", "pre_ffw_norm_2",
                  "post_ffw_norm_1", "post_ffw_norm_2"):
            f32(b + n + ".weight", (n_embd,))
        f32(b + "attn_q_norm.weight", (hd,))
        f32(b + "attn_k_norm.weight", (hd,))
        f32(b + "layer_output_scale.weight", (1,))
        q8(b + "attn_q.weight", (n_head * hd, n_embd))
        q8(b + "attn_k.weight", (4 * hd, n_embd))
        q8(b + "attn_v.weight", (4 * hd, n_embd))
        q8(b + "attn_output.weight", (n_embd, n_head * hd))
        q8(b + "ffn_gate.weight", (n_ff, n_embd))
        q8(b + "ffn_up.weight", (n_ff, n_embd))
        q8(b + "ffn_down.weight", (n_embd, n_ff))
        f32(b + "ffn_gate_inp.weight", (8, n_embd))
        q8(b + "ffn_gate_up_exps.weight", (8, 2 * 256, n_embd))
        q8(b + "ffn_down_exps.weight", (8, n_embd, 256))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    align = 32
    header = path.stat().st_size
    data_offset = -(-header // align) * align
    total = data_offset
    for ti in w.tensors[0].values():
        total += -(-ti.nbytes // align) * align
    os.truncate(path, total)  # a hole: no tensor byte is ever written
    return total, sum(len(t) for t in w.tensors)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="runs of our parser (best is reported)")
    ap.add_argument("--layers", type=int, default=128, help="layers of the sparse model (20 tensors each)")
    ap.add_argument("--vocab", type=Path, default=None, help="tokenizer GGUF (default: the cached one)")
    args = ap.parse_args()
    if args.vocab is None:
        from mtpscope.cache import vocab_path

        args.vocab = vocab_path()
    from gguf import GGUFReader

    vocab = args.vocab
    print(f"file: {vocab} ({vocab.stat().st_size:,} bytes)")
    t_ours, f = best_time(lambda: open_gguf(vocab), args.repeat)
    t0 = time.perf_counter()
    reader = GGUFReader(vocab)
    t_ref = time.perf_counter() - t0
    t0 = time.perf_counter()
    n_values = check_equal(vocab, reader)
    t_check = time.perf_counter() - t0
    t_decode, _ = best_time(lambda: [kv.value.to_list() for kv in f.kv.values() if isinstance(kv.value, ArrayValue)], 1)
    c_ours = best_cpu_time(lambda: open_gguf(vocab), args.repeat)
    print(f"  ours open_gguf (best of {args.repeat}): {t_ours * 1000:8.1f} ms wall, {c_ours * 1000:.1f} ms CPU")
    print(f"  gguf-py GGUFReader (1 run):       {t_ref * 1000:8.1f} ms")
    print(f"  ratio GGUFReader / ours:          {t_ref / t_ours:8.1f}x   (target >= 40x)")
    print(f"  values checked equal: {n_values:,} (all keys, types, offsets; check took {t_check:.1f} s)")
    print(f"  ours, decoding every array to Python lists on top: {t_decode * 1000:.0f} ms")
    del reader
    peak = _peak(lambda: open_gguf(vocab))
    print(f"  peak Python heap of open_gguf: {peak / 2**20:.1f} MiB")

    with tempfile.TemporaryDirectory() as tmp:
        for with_vocab in (False, True):
            p = Path(tmp) / f"sparse-{with_vocab}.gguf"
            size, n_t = write_sparse_model(p, args.layers, vocab if with_vocab else None)
            used = os.stat(p).st_blocks * 512
            label = "with the real tokenizer keys" if with_vocab else "metadata: 2 keys"
            print(f"sparse model ({label}): {size / 1e9:.1f} GB, {n_t} tensors, "
                  f"{used / 2**20:.1f} MiB on disk")
            t_open, g = best_time(lambda p=p: open_gguf(p), args.repeat)
            t_inv, inv = best_time(lambda g=g: build_inventory(g), args.repeat)
            t_both, _ = best_time(lambda p=p: build_inventory(open_gguf(p)), 2 * args.repeat)
            c_both = best_cpu_time(lambda p=p: build_inventory(open_gguf(p)), 2 * args.repeat)
            if inv.n_bytes + g.data_offset > size or len(inv.entries) != n_t:
                raise SystemExit("inventory does not match the file")
            print(f"  open_gguf {t_open * 1000:.1f} ms + build_inventory {t_inv * 1000:.1f} ms; "
                  f"both in one go {t_both * 1000:.1f} ms wall, {c_both * 1000:.1f} ms CPU (target <= 50 ms)")
            peak = _peak(lambda p=p: build_inventory(open_gguf(p)))
            print(f"  peak Python heap of open + inventory: {peak / 2**20:.1f} MiB")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"process max RSS (whole run, GGUFReader included): {rss / 1024:.0f} MiB")
    print(f"(best-of-{args.repeat} timings; python {sys.version.split()[0]}, numpy {np.__version__})")


if __name__ == "__main__":
    main()
