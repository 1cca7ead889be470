"""Benchmark: opening a centroid head with the real vocabulary size (target: well under a second).

Measured ("head"): ``open_gguf`` + ``CentroidHead.from_gguf`` on a fork-dialect file with a 262144-entry
``mtp.token_ordering.weight`` (I32) and 2048 centroids of width 256, then ``cluster_sizes()`` and one
``centroid_of``. Baseline ("read"): reading the same ordering bytes with ``np.fromfile`` (the least any
reader must do). Prints both medians and the ratio head/read; exits 0 whatever the numbers (speed targets
are reported, never asserted).

Usage: ``python -m benchmarks.bench_centroids [--repeats 7]``. The file is written once to
``<cache>/bench-centroids/head.gguf`` with gguf-py's GGUFWriter.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from mtpscope.cache import cache_dir
from mtpscope.inspector.centroids import CentroidHead
from mtpscope.inspector.gguf import open_gguf
from mtpscope.inspector.layouts import GEMMA4_N_VOCAB

N_VOCAB, N_CENTROIDS, N_EMBD = GEMMA4_N_VOCAB, 2048, 256


def head_file() -> Path:
    from mtpscope.inspector.gguf_write import u32, write_gguf

    p = cache_dir() / "bench-centroids" / "head.gguf"
    if p.exists():
        return p
    rng = np.random.default_rng(0)
    return write_gguf(p, "gemma4_assistant", {"gemma4_assistant.n_centroids": u32(N_CENTROIDS),
                                              "gemma4_assistant.centroid_top_k": u32(32)},
                      {"mtp.centroids.weight": rng.standard_normal((N_CENTROIDS, N_EMBD)).astype(np.float32),
                       "mtp.token_ordering.weight": rng.permutation(N_VOCAB).astype(np.int32)})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    p = head_file()
    with open_gguf(p) as f:
        t = f.tensor("mtp.token_ordering.weight")
        off = t.offset
    heads, reads = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        with open_gguf(p) as f:
            h = CentroidHead.from_gguf(f)
            h.cluster_sizes()
            h.centroid_of(12345)
        heads.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        np.fromfile(p, dtype="<i4", count=N_VOCAB, offset=off).copy()
        reads.append(time.perf_counter() - t0)
    mh, mr = statistics.median(heads), statistics.median(reads)
    print(f"head (open + map + sizes): median {mh * 1e3:.1f} ms over {args.repeats} runs")
    print(f"read (np.fromfile of the ordering): median {mr * 1e3:.2f} ms")
    print(f"ratio head/read: {mh / mr:.1f}")


if __name__ == "__main__":
    main()
