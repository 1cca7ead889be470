"""Benchmark: the explanation of a 100k-round trace (target: everything but drift under 1 s).

Trace: :func:`traces.synthetic.write_synthetic_trace` with ``--rounds`` rounds (default 100000, 20 prompts,
3 drafts, centroid columns, no hidden states), written once under ``<cache>/bench-explain/``; its token ids
are drawn over the real 262144-token Gemma 4 vocabulary, which is used for the token classes.

Baseline: :func:`traces.metrics.report` on the same trace (what ``mtpscope report`` pays today). Measured
(medians): reading the columns the explanation needs (``Trace.columns``), the analysis alone on those frames
(:func:`traces.explain_report.explain`: causes, first mismatches, aggregates, token classes of every output
position, what-if, categories), each part of it, and end-to-end (open + read + analyse). Prints seconds and
ratios against the baseline; exits 0 whatever the numbers (targets are reported, never asserted).

Usage: ``python benchmarks/bench_explain.py [--rounds 100000] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtpscope import traces  # noqa: E402
from mtpscope.cache import cache_dir, vocab_path  # noqa: E402
from mtpscope.traces.analysis import explain as E  # noqa: E402
from mtpscope.traces.analysis.breakdown import classify_outputs, draft_labels  # noqa: E402
from mtpscope.traces.analysis.explain_report import ROUNDS_COLUMNS, explain, step_columns  # noqa: E402
from mtpscope.traces.analysis.metrics import report  # noqa: E402
from mtpscope.traces.analysis.positions import positions  # noqa: E402
from mtpscope.traces.store.layout import MANIFEST  # noqa: E402
from mtpscope.traces.synthetic import write_synthetic_trace  # noqa: E402
from mtpscope.traces.analysis.token_classes import Classifier  # noqa: E402
from mtpscope.traces.analysis.vocab import load_vocab  # noqa: E402
from mtpscope.traces.analysis.what_if import what_if  # noqa: E402


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
    d = cache_dir() / "bench-explain" / f"syn-{args.rounds}"
    if not (d / MANIFEST).exists():
        t0 = time.perf_counter()
        write_synthetic_trace(d, n_rounds=args.rounds, n_prompts=20, seed=0)
        print(f"wrote {d} in {time.perf_counter() - t0:.2f} s")
    vocab = load_vocab(vocab_path())
    t = traces.open(d)

    def read(tr):
        return tr.columns("rounds", ROUNDS_COLUMNS), tr.columns("steps", step_columns(tr))

    rounds, steps = read(t)
    print(f"trace: {args.rounds} rounds, {len(steps)} steps; vocabulary {vocab.n_vocab} tokens")
    base = _median(lambda: report(traces.open(d)), args.repeats)
    t_read = _median(lambda: read(traces.open(d)), args.repeats)
    # warm the per-id token cache once, as a long-lived app process would have it; cold is reported too
    t_cold = _median(lambda: explain(rounds, steps, t.manifest, vocab=load_vocab(vocab_path())), 1)
    t_all = _median(lambda: explain(rounds, steps, t.manifest, vocab=vocab), args.repeats)
    t_causes = _median(lambda: E.first_mismatches(rounds, E.step_causes(rounds, steps)), args.repeats)
    clf = Classifier(vocab)
    pos = positions(rounds)
    t_pos = _median(lambda: positions(rounds), args.repeats)
    t_cls = _median(lambda: draft_labels(pos, classify_outputs(pos, clf)), args.repeats)
    t_wi = _median(lambda: what_if(rounds), args.repeats)
    t_e2e = _median(lambda: (lambda tr: explain(*read(tr), tr.manifest, vocab=vocab))(traces.open(d)), args.repeats)
    print(f"baseline traces.metrics.report (open + read + report): {base:.3f} s")
    for name, v in (("read the explain columns", t_read), ("explain analysis (cold vocabulary cache)", t_cold),
                    ("explain analysis (warm)", t_all), ("  causes + first mismatches", t_causes),
                    ("  output positions", t_pos), ("  token classes (every output position)", t_cls),
                    ("  what-if n_draft 1..8", t_wi), ("end-to-end open + read + explain (warm)", t_e2e)):
        print(f"{name:<45} {v:7.3f} s   {v / base:5.2f}x report")
    print(f"target: explain analysis < 1 s at 100k rounds: {'met' if t_all < 1.0 else 'NOT met'} ({t_all:.3f} s)")


if __name__ == "__main__":
    main()
