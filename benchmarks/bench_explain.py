"""Benchmark: the explanation of a 100k-round trace (target: everything but drift under 1 s).

Trace: :func:`traces.synthetic.write_synthetic_trace` with ``--rounds`` rounds (default 100000, 20 prompts,
3 drafts, centroid columns, no hidden states), written once under ``<cache>/bench-explain/``; its token ids
are drawn over the real 262144-token Gemma 4 vocabulary, which is used for the token classes.

Baseline: :func:`traces.analysis.metrics.report` on the same trace (what ``mtpscope report`` pays today). Measured
(medians): reading the columns the explanation needs (``Trace.columns``), the analysis alone on those frames
(:func:`traces.analysis.explain_report.explain`: causes, first mismatches, aggregates, token classes of every output
position, what-if, categories), each part of it, and end-to-end (open + read + analyse). Prints seconds and
ratios against the baseline; exits 0 whatever the numbers (targets are reported, never asserted).

Usage: ``python -m benchmarks.bench_explain [--rounds 100000] [--repeats 3]``.
"""

from __future__ import annotations

import argparse

from benchmarks.harness import median_time, synthetic_trace
from mtpscope import traces
from mtpscope.cache import vocab_path
from mtpscope.traces.analysis import explain as E
from mtpscope.traces.analysis.breakdown import classify_outputs, draft_labels
from mtpscope.traces.analysis.explain_report import ROUNDS_COLUMNS, explain, step_columns
from mtpscope.traces.analysis.metrics import report
from mtpscope.traces.analysis.positions import positions
from mtpscope.traces.analysis.token_classes import Classifier
from mtpscope.traces.analysis.vocab import load_vocab
from mtpscope.traces.analysis.what_if import what_if


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    d = synthetic_trace("bench-explain", args.rounds, n_prompts=20)
    vocab = load_vocab(vocab_path())
    t = traces.open(d)

    def read(tr):
        return tr.columns("rounds", ROUNDS_COLUMNS), tr.columns("steps", step_columns(tr))

    rounds, steps = read(t)
    print(f"trace: {args.rounds} rounds, {len(steps)} steps; vocabulary {vocab.n_vocab} tokens")
    base = median_time(lambda: report(traces.open(d)), args.repeats)
    t_read = median_time(lambda: read(traces.open(d)), args.repeats)
    # warm the per-id token cache once, as a long-lived app process would have it; cold is reported too
    t_cold = median_time(lambda: explain(rounds, steps, t.manifest, vocab=load_vocab(vocab_path())), 1)
    t_all = median_time(lambda: explain(rounds, steps, t.manifest, vocab=vocab), args.repeats)
    t_causes = median_time(lambda: E.first_mismatches(rounds, E.step_causes(rounds, steps)), args.repeats)
    clf = Classifier(vocab)
    pos = positions(rounds)
    t_pos = median_time(lambda: positions(rounds), args.repeats)
    t_cls = median_time(lambda: draft_labels(pos, classify_outputs(pos, clf)), args.repeats)
    t_wi = median_time(lambda: what_if(rounds), args.repeats)
    t_e2e = median_time(lambda: (lambda tr: explain(*read(tr), tr.manifest, vocab=vocab))(traces.open(d)), args.repeats)
    print(f"baseline traces.metrics.report (open + read + report): {base:.3f} s")
    for name, v in (("read the explain columns", t_read), ("explain analysis (cold vocabulary cache)", t_cold),
                    ("explain analysis (warm)", t_all), ("  causes + first mismatches", t_causes),
                    ("  output positions", t_pos), ("  token classes (every output position)", t_cls),
                    ("  what-if n_draft 1..8", t_wi), ("end-to-end open + read + explain (warm)", t_e2e)):
        print(f"{name:<45} {v:7.3f} s   {v / base:5.2f}x report")
    print(f"target: explain analysis < 1 s at 100k rounds: {'met' if t_all < 1.0 else 'NOT met'} ({t_all:.3f} s)")


if __name__ == "__main__":
    main()
