"""Benchmark: reading a 100k-round trace (target: open + rounds + report under 2 s).

Trace: :func:`traces.synthetic.write_synthetic_trace` with ``--rounds`` rounds (default 100000,
8 prompts, 3 drafts, centroid columns, no hidden states), written once under
``<cache>/bench-traces/``. Baseline: plain ``pyarrow.parquet.read_table`` of the same rounds files
followed by ``to_pandas()`` (what any reader has to pay). Measured: ``traces.open`` + ``.rounds``;
``traces.analysis.metrics.report``; ``.steps`` (against pyarrow's read of the steps files: the first read of each
table runs its value checks, ``traces.store.checks``); a small-part trace written through ``TraceWriter.add_round``
(``flush_every=8``) and compacted at close, per round. Prints medians and ratios vs the baseline;
exits 0 whatever the numbers (targets are reported, never asserted).

Usage: ``python -m benchmarks.bench_traces [--rounds 100000] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.harness import median_time, synthetic_trace
from mtpscope import traces
from mtpscope.traces.analysis.metrics import report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    d = synthetic_trace("bench-traces", args.rounds, n_prompts=8)

    files = traces.open(d).part_files("rounds")
    base = median_time(lambda: pa.concat_tables([pq.read_table(f) for f in files]).to_pandas(), args.repeats)
    rounds = median_time(lambda: traces.open(d).rounds, args.repeats)
    rep = median_time(lambda: report(traces.open(d)), args.repeats)
    both = median_time(lambda: (lambda t: (t.rounds, report(t)))(traces.open(d)), args.repeats)
    steps = median_time(lambda: traces.open(d).steps, args.repeats)
    s_files = traces.open(d).part_files("steps")
    s_base = median_time(lambda: pa.concat_tables([pq.read_table(f) for f in s_files]).to_pandas(), args.repeats)
    print(f"baseline pyarrow read_table+to_pandas (rounds): {base:.3f} s")
    print(f"traces.open + rounds:                {rounds:.3f} s  ratio vs baseline {rounds / base:.2f}")
    print(f"traces.open + report:                {rep:.3f} s")
    print(f"traces.open + rounds + report:       {both:.3f} s  (target < 2 s: {'met' if both < 2 else 'NOT met'})")
    print(f"traces.open + steps:                 {steps:.3f} s  ratio vs pyarrow read_table+to_pandas of the steps "
          f"({s_base:.3f} s) {steps / s_base:.2f} (the rounds' and the steps' value checks included)")

    from mtpscope.traces import RoundRecord, StepRecord, TraceWriter

    n = 4000
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        with TraceWriter(Path(tmp) / "t", {}, n_embd_backbone=None, n_embd=None, hidden_dtype=None,
                         centroids=False, flush_every=8) as w:
            for r in range(n):
                w.add_round(RoundRecord(prompt_id=0, round=r, pos=r, pending_token=1, n_draft=3,
                                        drafted=(1, 2, 3), n_accepted=r % 4, target=(1, 2, 3, 4),
                                        emitted=(1, 2, 3, 4)[:r % 4 + 1], t_draft_ms=1.0, t_verify_ms=2.0),
                            [StepRecord(k=k, token=k, logit=1.0, rank=0, top_ids=tuple(range(10)),
                                        top_logits=tuple(float(i) for i in range(10)), accepted=k <= r % 4)
                             for k in (1, 2, 3)])
            t1 = time.perf_counter()
        t2 = time.perf_counter()
        t_open = median_time(lambda: traces.open(Path(tmp) / "t").rounds, args.repeats)
    print(f"TraceWriter.add_round (flush_every 8): {(t1 - t0) / n * 1e3:.3f} ms per round; "
          f"close + compaction of {n // 8} parts: {t2 - t1:.2f} s; reading it back: {t_open:.3f} s")


if __name__ == "__main__":
    main()
