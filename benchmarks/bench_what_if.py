"""Benchmark: the n_draft what-if estimate against real recordings (target: |error| <= 0.05 in acceptance rate).

Pair: the demo target and its noisy drafter (``mtpscope demo build``), run by the real llama.cpp MTP loop.
The same prompts (the demo's five plus five more) are recorded at n_draft = 1..``--n-max`` (greedy,
``--max-tokens`` tokens each, hidden states off, ``--baseline`` timing of plain decoding). Baseline: each
real recording. Measured: :func:`traces.what_if.what_if_trace` of every recording, estimating every other
n_draft. Prints, per (estimated from K, real at N), the acceptance rate, the mean acceptance length and
tokens/s of the estimate and of the recording, and the errors; exits 0 whatever the numbers.

Usage: ``python -m benchmarks.bench_what_if [--n-max 4] [--max-tokens 96] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


from mtpscope import traces
from mtpscope.demo.build import build_demo
from mtpscope.traces.analysis.metrics import totals
from mtpscope.traces.analysis.what_if import what_if_trace

PROMPTS = ["The quick brown fox", "Tell me a story about dragons.", "Hello world", "Every sailor sings about",
           "Write a haiku about the moon.", "Seven clever wizards", "Purple dragons sleep", "Silver moons",
           "A list of things:", "Once upon a time"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-max", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from mtpscope.traces.run.record_config import RecordConfig
    from mtpscope.traces.run.recorder import MtpRuntime, record

    demo = build_demo()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-what-if-"))
    real: dict[int, dict] = {}
    with MtpRuntime(demo.target, demo.drafter_upstream_noisy, n_gpu_layers=0, capture=False) as rtm:
        for n in range(1, args.n_max + 1):
            d = out / f"n{n}"
            s = record(RecordConfig(n_draft=n, max_tokens=args.max_tokens, hidden="off", baseline=True),
                       target=demo.target, assistant=demo.drafter_upstream_noisy, out=d, prompts=PROMPTS,
                       overwrite=True, runtime=rtm, command=["bench_what_if"])
            t = traces.open(d)
            tot = totals(t.rounds)
            r = t.rounds
            loop_s = float((r["t_draft_ms"].sum() + r["t_verify_ms"].sum()) / 1000.0)
            real[n] = {"trace": t, "acceptance_rate": tot["acceptance_rate"],
                       "mean_acceptance_length": tot["mean_acceptance_length"],
                       "tokens_per_s": (len(r) + int(r["n_accepted"].sum())) / loop_s, "summary": s}
            print(f"recorded n_draft {n}: acceptance rate {tot['acceptance_rate']:.4f}, mean acceptance length "
                  f"{tot['mean_acceptance_length']:.3f}, {tot['n_rounds']} rounds -> {d}")
    print("\nestimate from K -> real at N: acceptance rate (est / real / error), mean acceptance length "
          "(est / real / error), tokens/s in the draft+verify loop (est / real / ratio)")
    worst = 0.0
    for k, rk in real.items():
        est = what_if_trace(rk["trace"])
        for n, rn in real.items():
            row = est.rows[n - 1]
            ea = row.acceptance_rate - rn["acceptance_rate"]
            em = row.mean_acceptance_length - rn["mean_acceptance_length"]
            tps = row.tokens_per_s
            ratio = tps / rn["tokens_per_s"] if tps else float("nan")
            if k != n:
                worst = max(worst, abs(ea))
            print(f"  K={k} -> N={n}: {row.acceptance_rate:.4f} / {rn['acceptance_rate']:.4f} / {ea:+.4f}   "
                  f"{row.mean_acceptance_length:.3f} / {rn['mean_acceptance_length']:.3f} / {em:+.3f}   "
                  f"{tps:.1f} / {rn['tokens_per_s']:.1f} / {ratio:.2f}")
    print(f"\nworst |acceptance-rate error| at another n_draft: {worst:.4f} (target <= 0.05: "
          f"{'met' if worst <= 0.05 else 'NOT met'})")


if __name__ == "__main__":
    main()
