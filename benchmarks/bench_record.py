"""Benchmark: cost of tracing in the real MTP loop (target: tracing costs at most 5 %).

Baseline ("off"): the MTP loop on the demo pair (full 262144-token vocabulary) with no ``cb_eval``
callback, no per-step analysis and no trace writing. Traced ("on"): :func:`traces.recorder.record`
with hidden states (f16) and the fork drafter's centroid head, writing Parquet parts. Both generate the
same tokens (greedy); runs alternate off / on ``--repeats`` times and the medians of tokens per second
are compared (the maximum too: the run least disturbed by other processes), both per wall-clock
second and per CPU second of this process (``time.process_time``; the stable measure on a shared
machine, where wall time mostly measures the neighbours). llama.cpp runs with ``--threads`` threads
(default 1, so that CPU time has no spin-waiting in it). Also printed: the share of each traced run
that :func:`record` itself spent on trace analysis and writing (``RecordSummary.trace_seconds``),
measured inside the run and so less sensitive to neighbours. Prints ``ratio on/off`` and the overhead
in percent; exits 0 whatever the numbers (speed targets are reported, never asserted).

Usage: ``python benchmarks/bench_record.py [--max-tokens 96] [--repeats 5] [--n-draft 3] [--vocab full]
[--size tiny|medium]``.
Models are written once to ``<cache>/bench-record/<vocab>/`` with ``mtpscope.demo``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtpscope import demo  # noqa: E402
from mtpscope.cache import cache_dir  # noqa: E402
from mtpscope.traces.mtp_runtime import MtpRuntime  # noqa: E402
from mtpscope.traces.recorder import record  # noqa: E402

PROMPT = "The quick brown fox"


#: "tiny": the demo pair (target width 64, drafter 128); "medium": target 256, drafter 512 (steps
#: ~4x dearer, still far cheaper than any real Gemma 4 pair: tracing's per-step cost is fixed).
SIZES = {"tiny": demo.TinyDims(), "medium": demo.TinyDims(n_embd_backbone=256, n_embd=512)}


def models(vocab: str, size: str = "tiny") -> tuple[Path, Path, Path]:
    """Target, noisy upstream drafter, fork drafter (centroid head) under the cache; written once."""
    d = cache_dir() / "bench-record" / (vocab if size == "tiny" else f"{vocab}-{size}")
    d.mkdir(parents=True, exist_ok=True)
    dims = SIZES[size]
    t, a, f = d / "target.gguf", d / "drafter-noisy.gguf", d / "drafter-fork.gguf"
    if not t.exists():
        demo.write_target(t, vocab=vocab, dims=dims)
    if not a.exists():
        demo.write_drafter(a, vocab=vocab, noise=1.2, noise_seed=1, dims=dims)  # the demo's noisy drafter
    if not f.exists():
        demo.write_drafter(f, vocab=vocab, dialect="fork", dims=dims)
    return t, a, f


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--n-draft", type=int, default=3)
    ap.add_argument("--vocab", default="full", choices=("full", "subset"))
    ap.add_argument("--size", default="tiny", choices=tuple(SIZES))
    ap.add_argument("--n-gpu-layers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    t, a, f = models(args.vocab, args.size)
    off_rt = MtpRuntime(t, a, capture=False, n_gpu_layers=args.n_gpu_layers,
                        n_threads=args.threads)
    on_rt = MtpRuntime(t, a, capture=True, n_gpu_layers=args.n_gpu_layers,
                       n_threads=args.threads)
    tokens = off_rt.prompt_tokens(PROMPT)

    def run_off() -> tuple[float, float, int, list[int]]:
        c0, t0 = time.process_time(), time.perf_counter()
        out: list[int] = []
        for r in off_rt.run(tokens, n_draft=args.n_draft, max_tokens=args.max_tokens, trace=False):
            if not out:
                out.append(r.pending_token)
            out.extend(r.emitted)
        return time.perf_counter() - t0, time.process_time() - c0, len(out), out

    def run_on(tmp: Path, i: int) -> tuple[float, float, int, list[int]]:
        s = record(target=t, assistant=a, out=tmp / f"on-{i}", prompt=PROMPT, n_draft=args.n_draft,
                   max_tokens=args.max_tokens, centroids=f, hidden="f16", runtime=on_rt, command=["bench"])
        shares.append(s.trace_seconds / s.seconds)
        return s.seconds, s.cpu_seconds, s.n_generated, list(s.outputs[0])

    run_off()  # warm-up: graph allocation, page cache
    off_tps: list[float] = []
    on_tps: list[float] = []
    off_cps: list[float] = []
    on_cps: list[float] = []
    shares: list[float] = []
    with tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(tmpd)
        run_on(tmp, -1)
        for i in range(args.repeats):
            s_off, c_off, n_off, out_off = run_off()
            s_on, c_on, n_on, out_on = run_on(tmp, i)
            if out_off != out_on:
                print("warning: traced and untraced runs generated different tokens", file=sys.stderr)
            off_tps.append(n_off / s_off)
            on_tps.append(n_on / s_on)
            off_cps.append(n_off / c_off)
            on_cps.append(n_on / c_on)
    on_rt.close()
    off_rt.close()
    print(f"bench_record: {args.size} demo pair ({args.vocab} vocab), n_draft {args.n_draft}, {args.max_tokens} tokens, "
          f"{args.threads} thread(s), {args.repeats} alternating repeats")
    for label, off, on in (("wall", off_tps, on_tps), ("cpu", off_cps, on_cps)):
        print(f"  [{label}] baseline (tracing off: bare MTP loop)     median {statistics.median(off):7.1f}  "
              f"best {max(off):7.1f} tokens/s  (runs: {', '.join(f'{x:.1f}' for x in off)})")
        print(f"  [{label}] traced (h/h_next/h_inner f16 + centroids) median {statistics.median(on):7.1f}  "
              f"best {max(on):7.1f} tokens/s  (runs: {', '.join(f'{x:.1f}' for x in on)})")
        for how, f in (("median", statistics.median), ("best", max)):
            r = f(on) / f(off)
            print(f"  [{label}] {how:6s} ratio on/off = {r:.3f}   tracing overhead = {100 * (1 - r):5.1f} %"
                  f"  (target <= 5 %)")
    sh = statistics.median(shares[1:] or shares)
    print(f"  [in-process] share of the traced run spent on trace analysis and writing (outside the MTP loop): "
          f"median {100 * sh:.1f} %  (runs: {', '.join(f'{100 * x:.1f}' for x in shares[1:])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
