"""Benchmark: the app's heavy paths on a 100,000-round synthetic trace (issue 6 targets).

1. "timeline" (target < 2 s): ``traces.open`` + ``Trace.rounds`` (load) and the Acceptance page's
   timeline figures: the binned overview of all rounds plus the clickable window of
   ``charts.TIMELINE_MAX_MARKS`` rounds with hover text decoded through the real Gemma 4 vocabulary
   (when the tokenizer GGUF is in the cache), serialised to JSON like Streamlit does.
2. "coverage" (target < 1 s): per-centroid coverage over the full 262144-token vocabulary as the Centroids
   page's loader computes it (``traces.analysis.coverage.centroid_coverage``, the trace's opening and the
   token -> centroid map of a 262144-entry ordering, 2048 centroids, inside the timing), twice: against the
   head the trace was scored with (the counts its writer kept in the manifest, after one DuckDB pass that
   checks the map against the steps' ``target_centroid``) and against another head (DuckDB over every step's
   32 chosen centroids). The steps are never in pandas; the process's peak RSS is printed after the
   timeline and after the coverage.

Baseline: the issue's targets (2 s, 1 s); printed as ratio = median / target (< 1 is within target).
Exits 0 whatever the numbers (speed targets are reported, never asserted).

Usage: ``python -m benchmarks.bench_app [--rounds 100000] [--repeats 3]``. The trace is written once
to ``<cache>/bench-app/trace-<rounds>-v2`` (its ``target_centroid`` from the benchmark head's map).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from pathlib import Path

import numpy as np

from mtpscope.app import charts, views
from mtpscope.app.tokens import TokenText
from mtpscope.cache import cache_dir
from mtpscope.inspector.centroids import CentroidHead
from mtpscope.inspector.layouts import GEMMA4_N_VOCAB
from mtpscope.traces.analysis.coverage import centroid_coverage
from mtpscope.traces.store.layout import MANIFEST
from mtpscope.traces.store.reader import open_trace
from mtpscope.traces.synthetic import write_synthetic_trace

N_VOCAB, N_CENTROIDS, TOP_K = GEMMA4_N_VOCAB, 2048, 32
TARGET_TIMELINE_S, TARGET_COVERAGE_S = 2.0, 1.0


def ordering() -> np.ndarray:
    """The token ordering of the benchmark's centroid head (a seeded permutation of the vocabulary)."""
    return np.random.default_rng(0).permutation(N_VOCAB).astype(np.int32)


def home_map(order: np.ndarray) -> np.ndarray:
    return CentroidHead.from_arrays(np.zeros((N_CENTROIDS, 1), np.float32), order).token_to_centroid


def trace_dir(n_rounds: int) -> Path:
    """The synthetic trace, scored as if with the benchmark's head (``target_centroid`` = its map of the target
    token, as a recording has it); written once (v2: since the head's map)."""
    d = cache_dir() / "bench-app" / f"trace-{n_rounds}-v2"
    if not (d / MANIFEST).exists():
        t = time.perf_counter()
        write_synthetic_trace(d, n_rounds=n_rounds, n_prompts=50, n_vocab=N_VOCAB, n_centroids=N_CENTROIDS,
                              top_k=TOP_K, seed=0, home=home_map(ordering()))
        print(f"wrote {d} in {time.perf_counter() - t:.1f} s")
    return d


def decoder() -> TokenText | None:
    try:
        from mtpscope.cache import vocab_path
        from mtpscope.inspector.gguf import open_gguf

        f = open_gguf(vocab_path(fetch=False))
        return TokenText(f.get("tokenizer.ggml.tokens"), "real vocab")
    except Exception as e:  # noqa: BLE001 - benchmark runs without the vocab too
        print(f"(no real vocabulary: hover shows ids; {e})")
        return None


def timeline_once(d: Path, dec: TokenText | None) -> dict[str, float]:
    t0 = time.perf_counter()
    tr = open_trace(d)
    rounds = tr.rounds
    t1 = time.perf_counter()
    ordered = views.ordered_rounds(rounds)
    overview = charts.timeline_figure(ordered, dec)
    window = charts.timeline_figure(ordered.iloc[:charts.TIMELINE_MAX_MARKS], dec)
    overview.to_json()
    window.to_json()
    t2 = time.perf_counter()
    assert overview.layout.meta["mode"] == "bins" and window.layout.meta["mode"] == "marks"
    return {"load": t1 - t0, "figures": t2 - t1, "total": t2 - t0, "n": len(rounds)}


def coverage_once(d: Path, order: np.ndarray, n_steps: int) -> float:
    """The Centroids page's coverage as its loader computes it: the head's token -> centroid map and the
    per-centroid counts (:func:`centroid_coverage`: the trace's own counts when the map agrees with its
    ``target_centroid``, else aggregated in DuckDB over the steps parts; the steps never in pandas)."""
    t0 = time.perf_counter()
    tr = open_trace(d)
    cov = centroid_coverage(tr, N_CENTROIDS, home_map(order))
    t1 = time.perf_counter()
    assert int(cov.chosen.sum()) == TOP_K * n_steps
    return t1 - t0


def peak_rss_gib() -> float:
    """This process's peak resident set so far (``ru_maxrss``, KiB on Linux), GiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    d = trace_dir(a.rounds)
    dec = decoder()

    runs = [timeline_once(d, dec) for _ in range(a.repeats)]
    med = {k: statistics.median(r[k] for r in runs) for k in ("load", "figures", "total")}
    print(f"timeline ({runs[0]['n']:,} rounds): load {med['load']:.3f} s + figures {med['figures']:.3f} s = "
          f"{med['total']:.3f} s (median of {a.repeats}); target {TARGET_TIMELINE_S:.1f} s; "
          f"ratio {med['total'] / TARGET_TIMELINE_S:.2f}")

    rss_timeline = peak_rss_gib()
    n_steps = int(open_trace(d).sql("SELECT count(*) AS n FROM steps")["n"].iloc[0])
    for what, order in (("the trace's own head: its manifest counts, the map checked against target_centroid",
                         ordering()),
                        ("another head: DuckDB over every step's ids", np.random.default_rng(1).permutation(N_VOCAB)
                         .astype(np.int32))):
        cov_t = statistics.median(coverage_once(d, order, n_steps) for _ in range(a.repeats))
        print(f"coverage, {what} ({n_steps:,} steps x {TOP_K} centroids, {N_VOCAB:,}-token vocabulary; trace "
              f"opened and head map built inside the timing): {cov_t:.3f} s (median of {a.repeats}); target "
              f"{TARGET_COVERAGE_S:.1f} s; ratio {cov_t / TARGET_COVERAGE_S:.2f}")
    print(f"peak RSS of this process: {rss_timeline:.2f} GiB after the timeline (the rounds in pandas), "
          f"{peak_rss_gib():.2f} GiB after the coverage; load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
