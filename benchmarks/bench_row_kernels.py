"""Benchmark: the recorder's reductions over rows of logits, C (``traces/run/rowstats.c`` through
:mod:`traces.run.row_kernels`) against the numpy functions they replace (the named baseline:
:func:`traces.run.target_side.numpy_target_stats` and ``traces.run.ranking._numpy_top_k``).

Per round the recorder reduces ``--n-draft`` verify rows (the target's probability of each draft and its
entropy) and ``--n-draft`` drafter rows (top-10, the draft's and the target's ranks), each ``--n-vocab``
float32 logits (262144 for Gemma 4). Rows are taken from a pool of ``--pool-mib`` MiB so that each arrives
cold (as it does from the worker's ring: written by the other core), and also hot (the same rows again).
Printed: milliseconds per round of each part for both, and the ratio numpy / C; exits 0 whatever the numbers.

``--isa avx2`` (or ``baseline``): the C library an AVX2-only CPU (or one without AVX2) gets, instead of this CPU's.

Usage: ``python -m benchmarks.bench_row_kernels [--n-vocab 262144] [--n-draft 3] [--rounds 200] [--isa avx512|avx2|baseline]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from mtpscope.traces.run import native_build, ranking, row_kernels
from mtpscope.traces.run.target_side import numpy_target_stats


def _time(fn: Callable[[np.ndarray], object], rows: list[np.ndarray], n_draft: int, rounds: int,
          hot: bool) -> float:
    """Median milliseconds of ``fn`` over one round's rows (``n_draft`` of them)."""
    ts = []
    for i in range(rounds):
        j = 0 if hot else (i * n_draft) % (len(rows) - n_draft)
        batch = rows[j:j + n_draft]
        t0 = time.perf_counter()
        fn(batch)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-vocab", type=int, default=262144)
    ap.add_argument("--n-draft", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--pool-mib", type=int, default=192)
    ap.add_argument("--isa", choices=tuple(row_kernels.ISA_FLAGS), default=None,
                    help="the build of another instruction set (default: this CPU's)")
    args = ap.parse_args()
    lib = row_kernels.load()
    if lib is None:
        print(f"the C row kernels do not build here: {row_kernels.unavailable_reason()}")
        return 0
    isa = args.isa or row_kernels.isa()
    path = native_build.build(row_kernels.SOURCE, row_kernels.flags(isa), what=f"the {isa} build of the row kernels")
    lib = row_kernels.open_library(path)
    name = f"{path.name} ({isa}, {lib.mtps_lanes()} float32 lanes a register)"
    rng = np.random.default_rng(0)
    n_rows = max(2 * args.n_draft, args.pool_mib * 2**20 // (4 * args.n_vocab))
    rows = list((30 * np.tanh(rng.normal(0, 6, size=(n_rows, args.n_vocab)) / 30)).astype(np.float32))
    tok = np.arange(args.n_draft, dtype=np.int64)

    def summarize_c(batch: list[np.ndarray]) -> None:
        for r in batch:
            top = row_kernels.top_k(r, 10, lib)
            row_kernels.count_greater(r, r[7], lib)
            del top

    def summarize_np(batch: list[np.ndarray]) -> None:
        for r in batch:
            ranking._numpy_top_k(r, 10)
            int(np.count_nonzero(r > r[7]))

    parts = {"target's p and H (verify rows)": (lambda b: row_kernels.target_stats(b, tok, lib),
                                                 lambda b: numpy_target_stats(b, tok)),
             "top-10 and a full rank (drafter rows)": (summarize_c, summarize_np)}
    print(f"{args.n_draft} rows of {args.n_vocab} float32 per part, median of {args.rounds} rounds; "
          f"C library: {name}")
    print("| part | rows | numpy ms | C ms | numpy / C |\n|---|---|---|---|---|")
    for name, (c_fn, np_fn) in parts.items():
        for hot in (False, True):
            tn = _time(np_fn, rows, args.n_draft, args.rounds, hot)
            tc = _time(c_fn, rows, args.n_draft, args.rounds, hot)
            print(f"| {name} | {'hot' if hot else 'cold'} | {tn:.3f} | {tc:.3f} | {tn / tc:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
