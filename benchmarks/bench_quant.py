"""Benchmark: which drafter quantization to use, on the demo's trained pair (``<cache>/demo/trained/``:
``target.gguf`` F16 + the F32 ``drafter.gguf``), answered by one quantization sweep.

1. the F32 drafter is quantized by llama.cpp's own quantizer to each ``--types`` type
   (``traces.sweep.quant.quant_assistants``: into the cache, reused by a second run; the time and size
   of each are printed);
2. one sweep (``traces.sweep.runner.run_sweep`` on a local Ray, one worker) records every demo prompt
   (6 categories) with each quantization as its own assistant at ``--n-draft``, plus plain decoding;
3. the report's table per type x category (``mtpscope report``'s section: acceptance rate, mean
   acceptance length, tokens/s, speedup over plain decoding), then each type against the named baseline
   **f32** (the unquantized drafter): acceptance-rate difference and tokens/s ratio over all prompts;
4. the replay's argmax agreement per type: the numpy reference drafter, reading the quantized weights
   through gguf.quants, against llama.cpp's recorded drafts (first ``--replay-rounds`` rounds of each
   type's trace). 1.0 for F32; below 1.0 for quantized weights is expected (docs/FIDELITY.md).

Timings are wall times on whatever shares the machine: compare types within one run. A worker's first
task runs several times slower than later ones, so an unreported warm-up assistant (the F32 drafter)
goes first (``--no-warmup`` to see it). Nothing is asserted; exit 0.

Usage: ``python -m benchmarks.bench_quant [--types f32,q8_0,q6_k,q4_k_m,q4_0] [--n-draft 3]
[--max-tokens 32] [--per-category 6] [--replay-rounds 120] [--no-warmup] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

BASELINE_TYPE = "f32"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="f32,q8_0,q6_k,q4_k_m,q4_0")
    ap.add_argument("--n-draft", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--per-category", type=int, default=6, help="demo prompts per category (6 = all 36)")
    ap.add_argument("--replay-rounds", type=int, default=120, help="rounds replayed per type (0: no replay)")
    ap.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                    help="record the F32 drafter once first, unreported (the worker's first task is slow)")
    ap.add_argument("--threads", type=int, default=max(1, min(os.cpu_count() or 1, 4)))
    ap.add_argument("--out", type=Path, default=None, help="sweep directory (default: a temporary one)")
    a = ap.parse_args(argv)

    import ray

    from mtpscope.cli.sweep import format_quant_section
    from mtpscope.demo.build import build_demo
    from mtpscope.demo.spec import TrainedPaths
    from mtpscope.demo.trained import read_prompts
    from mtpscope.traces.sweep.quant import quant_assistants
    from mtpscope.traces.sweep.reader import open_sweep
    from mtpscope.traces.sweep.runner import run_sweep
    from mtpscope.traces.sweep.spec import SweepSpec, read_prompt_set

    demo = build_demo()
    tp = TrainedPaths.under(demo.root)
    types = [t.strip() for t in a.types.split(",") if t.strip()]
    tmp = tempfile.TemporaryDirectory(prefix="bench-quant-")
    out = a.out or Path(tmp.name) / "sweep"
    seen: dict[str, int] = {}
    chosen = []
    for p in read_prompts():
        if seen.get(p["category"], 0) < a.per_category:
            chosen.append(p)
            seen[p["category"]] = seen.get(p["category"], 0) + 1
    pf = Path(tmp.name) / "prompts.jsonl"
    pf.write_text("".join(json.dumps({"prompt": p["text"], "category": p["category"]}) + "\n" for p in chosen))

    print(f"demo trained pair: {tp.target.name} + {tp.drafter.name} ({tp.drafter.stat().st_size / 2**20:.1f} MiB)")
    print(f"{len(chosen)} prompts in {len(seen)} categories, n_draft {a.n_draft}, max_tokens {a.max_tokens}")
    print("\n1. llama.cpp's quantizer (cached by content hash and type):")
    t0 = time.perf_counter()
    said: list[str] = []
    assistants, quantized = quant_assistants([("drafter", os.fspath(tp.drafter))], types, n_threads=a.threads,
                                             on_quantize=said.append)
    for q, (_, path) in zip(quantized, assistants, strict=True):
        made = any(f" to {q.qtype} " in s for s in said)
        print(f"  {q.qtype:<8} {q.n_bytes / 2**20:8.1f} MiB  {'quantized now' if made else 'from the cache'}  {path}")
    print(f"  ({time.perf_counter() - t0:.1f} s in all)")

    # the worker's first task runs several times slower than the same task later (first use of llama.cpp in
    # the actor: thread pool, page cache, CPU repacking): a throwaway first assistant takes that cost
    warm = (("warmup", os.fspath(tp.drafter)),) if a.warmup else ()
    spec = SweepSpec(target=os.fspath(tp.target), assistants=warm + assistants, prompts=read_prompt_set(pf),
                     n_drafts=(a.n_draft,), n_shards=1, baseline=True, max_tokens=a.max_tokens, hidden="off",
                     quantized=quantized).check()
    print(f"\n2. the sweep ({len(spec.tasks())} tasks) -> {out}")
    ray.init(num_cpus=a.threads, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        res = run_sweep(spec, out, ray_address="auto", workers=1, threads_per_worker=a.threads, progress=False,
                        command=["benchmarks.bench_quant", *(argv or sys.argv[1:])])
    finally:
        ray.shutdown()
    print(f"  {res.n_done} of {res.n_tasks} tasks done in {res.seconds:.1f} s")
    rep = open_sweep(out).report()
    print("\n3. per type x category (mtpscope report's section):")
    print("\n".join(format_quant_section(rep["quantization"])[1:]))
    rows = {(r["qtype"], r["category"]): r for r in rep["quantization"]}
    base = rows.get((BASELINE_TYPE, "all"))
    if base is not None:
        print(f"\n   against the baseline {BASELINE_TYPE} (all prompts): acceptance rate difference, tokens/s ratio")
        for t in types:
            r = rows.get((t, "all"))
            if r is None or r["acceptance_rate"] is None:
                continue
            ratio = r["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else float("nan")
            print(f"   {t:<8} {r['acceptance_rate'] - base['acceptance_rate']:+.4f}   {ratio:.3f}x")
    if a.replay_rounds > 0:
        from mtpscope.traces.run.replay import replay

        print(f"\n4. replay's argmax agreement with llama.cpp per type (first {a.replay_rounds} rounds):")
        for t in types:
            t1 = time.perf_counter()
            s = replay(out / f"assistant={t}" / f"n_draft={a.n_draft}" / "shard=0", max_rounds=a.replay_rounds).summary().to_dict()
            w = s["drafter_weights"]
            mats = ", ".join(f"{k} x{v}" for k, v in w["matrices"].items())
            print(f"   {t:<8} agreement {s['variants']['baseline']['agreement']:.4f} over {s['n_steps']} steps "
                  f"({mats}; {time.perf_counter() - t1:.0f} s)")
    if a.out is None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
