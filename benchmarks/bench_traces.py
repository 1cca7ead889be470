"""Benchmark: reading a 100k-round trace (target: open + rounds + report under 2 s).

Trace: :func:`traces.synthetic.write_synthetic_trace` with ``--rounds`` rounds (default 100000,
8 prompts, 3 drafts, centroid columns, no hidden states), written once under
``<cache>/bench-traces/``. Baseline: plain ``pyarrow.parquet.read_table`` of the same rounds files
followed by ``to_pandas()`` (what any reader has to pay). Measured: ``traces.open`` + ``.rounds``;
``traces.metrics.report``; ``.steps``; a small-part trace written through ``TraceWriter.add_round``
(``flush_every=8``) and compacted at close, per round. Prints medians and ratios vs the baseline;
exits 0 whatever the numbers (targets are reported, never asserted).

Usage: ``python benchmarks/bench_traces.py [--rounds 100000] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from mtpscope import traces  # noqa: E402
from mtpscope.cache import cache_dir  # noqa: E402
from mtpscope.traces.analysis.metrics import report  # noqa: E402
from mtpscope.traces.store.layout import MANIFEST  # noqa: E402
from mtpscope.traces.synthetic import write_synthetic_trace  # noqa: E402


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    d = cache_dir() / "bench-traces" / f"syn-{args.rounds}"
    if not (d / MANIFEST).exists():
        t0 = time.perf_counter()
        write_synthetic_trace(d, n_rounds=args.rounds, n_prompts=8, seed=0)
        print(f"wrote {d} in {time.perf_counter() - t0:.2f} s")

    files = traces.open(d).part_files("rounds")
    base = _median(lambda: pa.concat_tables([pq.read_table(f) for f in files]).to_pandas(), args.repeats)
    rounds = _median(lambda: traces.open(d).rounds, args.repeats)
    rep = _median(lambda: report(traces.open(d)), args.repeats)
    both = _median(lambda: (lambda t: (t.rounds, report(t)))(traces.open(d)), args.repeats)
    steps = _median(lambda: traces.open(d).steps, args.repeats)
    print(f"baseline pyarrow read_table+to_pandas (rounds): {base:.3f} s")
    print(f"traces.open + rounds:                {rounds:.3f} s  ratio vs baseline {rounds / base:.2f}")
    print(f"traces.open + report:                {rep:.3f} s")
    print(f"traces.open + rounds + report:       {both:.3f} s  (target < 2 s: {'met' if both < 2 else 'NOT met'})")
    print(f"traces.open + steps:                 {steps:.3f} s")

    from mtpscope.traces import RoundRecord, StepRecord, TraceWriter

    n = 4000
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        with TraceWriter(Path(tmp) / "t", {}, n_embd_backbone=None, n_embd=None, hidden_dtype=None,
                         centroids=False, flush_every=8) as w:
            for r in range(n):
                w.add_round(RoundRecord(prompt_id=0, round=r, pos=r, pending_token=1, n_draft=3,
                                        drafted=(1, 2, 3), n_accepted=r % 4, target=(1, 2, 3, 4),
                                        emitted=(1,) * (r % 4 + 1), t_draft_ms=1.0, t_verify_ms=2.0),
                            [StepRecord(k=k, token=k, logit=1.0, rank=0, top_ids=tuple(range(10)),
                                        top_logits=tuple(float(i) for i in range(10)), accepted=k <= r % 4)
                             for k in (1, 2, 3)])
            t1 = time.perf_counter()
        t2 = time.perf_counter()
        t_open = _median(lambda: traces.open(Path(tmp) / "t").rounds, args.repeats)
    print(f"TraceWriter.add_round (flush_every 8): {(t1 - t0) / n * 1e3:.3f} ms per round; "
          f"close + compaction of {n // 8} parts: {t2 - t1:.2f} s; reading it back: {t_open:.3f} s")


if __name__ == "__main__":
    main()
