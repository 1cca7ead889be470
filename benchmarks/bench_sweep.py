"""Benchmark: sweeps (traces/sweep/runner.py on Ray, traces/sweep/reader.py).

Three parts (``--part ray|read|whatif|all``; targets are printed, never asserted; exit 0):

* **ray** -- the same task list (the demo target + noisy drafter, n_draft 1..4 x 2 shards + the
  baseline, 4 prompts of 48 tokens) on 1 and on 2 local Ray workers of 1 llama.cpp thread each, on one
  ``ray.init(num_cpus=2)``. Baseline: the 1-worker wall time; ratio = t(1 worker) / t(2 workers),
  goal >= 1.7x. Each wall time includes starting the actors and loading the models once per actor.
* **read** -- a synthetic sweep of ``--rounds`` rounds in total (default 1,000,000: 2 assistants x
  n_draft 1,2,3,4,6 x 4 shards + 4 baseline shards, 240 prompts in 12 categories, rounds only), written
  once under ``<cache>/bench-sweep/``; then, in a fresh process: ``open_sweep`` + ``matrix`` + one
  configuration's timeline (goal < 1.5 s, peak RSS < 1 GB; imports timed apart), and the full cells
  aggregate. Baseline: the goals.
* **whatif** -- the n_draft what-if estimate of issue 13 (``traces.analysis.what_if``, when this build has it)
  from the sweep's n_draft=3 cell against the sweep's measured values at n_draft 1..6 on the demo pair
  (target + noisy drafter: the clean one accepts everything at every n_draft): the error per n_draft.

Usage: ``python -m benchmarks.bench_sweep [--part all] [--rounds 1000000] [--max-tokens 48]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mtpscope.cache import cache_dir

PROMPTS = [("The quick brown fox", "prose"), ("def fibonacci(n):", "code"), ("Once upon a time", "prose"),
           ("import numpy as np", "code")]

READ_PROBE = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from mtpscope.traces.sweep.reader import open_sweep
t1 = time.perf_counter()
sw = open_sweep(sys.argv[1]); m = sw.matrix
t2 = time.perf_counter()
tl = sw.timeline(sw.spec.assistants[0][0], 3)
t3 = time.perf_counter()
rss_open = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
cells = sw.cells()
t4 = time.perf_counter()
n = int(sw.sql("SELECT count(*) AS n FROM rounds")["n"][0])
print(json.dumps({"import_s": t1 - t0, "open_matrix_s": t2 - t1, "timeline_s": t3 - t2, "timeline_rounds": len(tl),
                  "n_tasks": len(m), "rss_mb_after_timeline": rss_open, "cells_s": t4 - t3, "n_cells": len(cells),
                  "n_rounds": n, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _demo():
    from mtpscope.demo.build import build_demo

    return build_demo()


def _spec(demo, n_drafts, n_shards, max_tokens, tmp: Path):
    from mtpscope.traces.sweep.spec import SweepSpec, read_prompt_set

    p = tmp / "prompts.jsonl"
    p.write_text("".join(json.dumps({"prompt": t, "category": c}) + "\n" for t, c in PROMPTS))
    return SweepSpec(target=os.fspath(demo.target), assistants=(("noisy", os.fspath(demo.drafter_upstream_noisy)),),
                     prompts=read_prompt_set(p), n_drafts=tuple(n_drafts), n_shards=n_shards, baseline=True,
                     max_tokens=max_tokens, hidden="off").check()


def part_ray(max_tokens: int) -> None:
    import ray

    from mtpscope.traces.sweep.runner import run_sweep
    from mtpscope.traces.sweep.spec import read_state

    demo = _demo()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             object_store_memory=100 * 1024 * 1024)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            spec = _spec(demo, (1, 2, 3, 4), 2, max_tokens, Path(tmp))
            walls = {}
            for workers in (1, 2):
                load0 = os.getloadavg()[0]
                res = run_sweep(spec, Path(tmp) / f"w{workers}", workers=workers, threads_per_worker=1,
                                command=["bench_sweep"])
                walls[workers] = res.seconds
                tasks = read_state(Path(tmp) / f"w{workers}")["tasks"]
                busy = sum(t["seconds"] or 0 for t in tasks)
                load = sum(t["load_seconds"] or 0 for t in tasks)
                print(f"ray: {res.n_tasks} tasks on {workers} worker(s) x 1 thread: {res.seconds:.2f} s "
                      f"({res.n_done} done, {res.n_failed} failed; task time {busy:.1f} s + model loading "
                      f"{load:.1f} s summed over workers; load average {load0:.1f} -> {os.getloadavg()[0]:.1f} "
                      f"on {os.cpu_count()} CPUs)")
            print(f"ray: baseline 1 worker {walls[1]:.2f} s; 2 workers {walls[2]:.2f} s; "
                  f"ratio {walls[1] / walls[2]:.2f}x (goal >= 1.7x)")
    finally:
        ray.shutdown()


def part_read(n_rounds: int) -> None:
    from mtpscope.traces.sweep.spec import is_sweep
    from mtpscope.traces.synthetic import write_synthetic_sweep

    d = cache_dir() / "bench-sweep" / f"syn-{n_rounds}"
    if not is_sweep(d):
        t0 = time.perf_counter()
        write_synthetic_sweep(d, n_rounds=n_rounds)
        print(f"read: wrote {d} in {time.perf_counter() - t0:.2f} s")
    out = subprocess.run([sys.executable, "-c", READ_PROBE, str(d)], capture_output=True, text=True, check=True)
    r = json.loads(out.stdout)
    total = r["open_matrix_s"] + r["timeline_s"]
    print(f"read: {r['n_rounds']:,} rounds, {r['n_tasks']} tasks; imports {r['import_s']:.3f} s; open_sweep + matrix "
          f"{r['open_matrix_s']:.3f} s; one configuration's timeline ({r['timeline_rounds']:,} rounds) "
          f"{r['timeline_s']:.3f} s")
    print(f"read: open + matrix + timeline {total:.3f} s ({total / 1.5:.2f} of the 1.5 s goal; with imports "
          f"{total + r['import_s']:.3f} s); peak RSS {r['rss_mb_after_timeline']:.0f} MB "
          f"({r['rss_mb_after_timeline'] / 1024:.2f} of the 1 GB goal)")
    print(f"read: all cells ({r['n_cells']} rows, DuckDB) {r['cells_s']:.3f} s; peak RSS after it {r['rss_mb']:.0f} MB")


def part_whatif(max_tokens: int) -> None:
    try:
        from mtpscope.traces.analysis import what_if as W
    except ImportError:
        print("whatif: skipped: traces.what_if (issue 13) is not in this build")
        return
    import ray

    from mtpscope.traces.sweep.reader import open_sweep
    from mtpscope.traces.sweep.runner import run_sweep

    demo = _demo()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             object_store_memory=100 * 1024 * 1024)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            spec = _spec(demo, (1, 2, 3, 4, 5, 6), 1, max_tokens, Path(tmp))
            run_sweep(spec, Path(tmp) / "wi", workers=2, threads_per_worker=1, command=["bench_sweep"])
            sw = open_sweep(Path(tmp) / "wi")
            cells = sw.cells()
            allc = cells[cells["category"] == "all"].set_index(["assistant", "n_draft"])
            t_plain = 1000.0 / float(allc.loc[("baseline", 0), "tokens_per_s"])
            rounds = sw.cell("noisy", 3).columns("rounds", W.WHAT_IF_ROUNDS_COLUMNS)
            est = W.what_if(rounds, t_plain_ms=t_plain, n_max=6)
            print("whatif: estimate from the n_draft=3 trace vs the sweep's measurement (demo target + noisy drafter)")
            print("whatif: n_draft  acc.rate meas  est   error   mean acc.len meas  est   error   speedup meas  est")
            worst = 0.0
            for row in est.rows:
                m = allc.loc[("noisy", row.n_draft)]
                ea = row.acceptance_rate - float(m["acceptance_rate"])
                el = row.mean_acceptance_length - float(m["mean_acceptance_length"])
                worst = max(worst, abs(ea))
                sp = f"{float(m['speedup']):.3f} {row.speedup:.3f}" if row.speedup is not None else "-"
                print(f"whatif: {row.n_draft:7d}  {float(m['acceptance_rate']):.3f} {row.acceptance_rate:.3f} {ea:+.3f}"
                      f"   {float(m['mean_acceptance_length']):.3f} {row.mean_acceptance_length:.3f} {el:+.3f}   {sp}")
            print(f"whatif: worst acceptance-rate error {worst:.3f}")
    finally:
        ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=("ray", "read", "whatif", "all"), default="all")
    ap.add_argument("--rounds", type=int, default=1_000_000)
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()
    if args.part in ("read", "all"):
        part_read(args.rounds)
    if args.part in ("ray", "all"):
        part_ray(args.max_tokens)
    if args.part in ("whatif", "all"):
        part_whatif(args.max_tokens)


if __name__ == "__main__":
    main()
