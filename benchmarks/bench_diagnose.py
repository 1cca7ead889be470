"""Benchmark: ``mtpscope diagnose`` on the demo's trained pair (targets: the demo's 36 prompts from nothing under
3 minutes on 2 cores; with ``--trace`` under 30 s).

Runs the command as a user would (a subprocess, ``--html`` included): first from nothing (it records the 36
prompts, 64 tokens each, plain decoding measured first), then ``--trace`` on the trace it just recorded. Prints
each run's wall time, its steps' times from ``diagnosis.json`` (read back as a ``Diagnosis``:
``read_diagnosis``), the load average before and after, and the ratios against two named baselines: the targets
(180 s, 30 s) and, for the first run, the recording step inside it (``mtpscope record --baseline`` of the same
prompts: what diagnose adds on top). Exits 0 whatever the numbers (targets are reported, never asserted).

Usage: ``python -m benchmarks.bench_diagnose [--drafter drafter.gguf] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_FROM_NOTHING_S, TARGET_WITH_TRACE_S = 180.0, 30.0


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _run(args: list[str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    rc = subprocess.run([sys.executable, "-m", "mtpscope.cli", "diagnose", "-q", *args],
                        stdout=subprocess.DEVNULL, check=False).returncode
    return time.perf_counter() - t0, rc


def _steps(out: Path) -> dict[str, float]:
    from mtpscope.traces.diagnose.run import read_diagnosis

    return {s.name: s.seconds for s in read_diagnosis(out).steps if s.status == "ran"}


def main() -> None:
    from mtpscope.cache import demo_dir
    from mtpscope.demo.spec import TrainedPaths

    ap = argparse.ArgumentParser()
    ap.add_argument("--drafter", default="drafter", choices=("drafter", "drafter_q8_0", "drafter_buggy"))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    tp = TrainedPaths.under(demo_dir())
    out = Path(a.out or tempfile.mkdtemp(prefix="bench-diagnose-"))
    print(f"cores {os.cpu_count()}; load average before: {_load()}")
    first = out / "from-nothing"
    s1, rc1 = _run(["--target", str(tp.target), "--assistant", str(getattr(tp, a.drafter)), "--out", str(first),
                    "--html", str(first / "report.html")])
    st1 = _steps(first)
    rec = st1.get("record")
    print(f"from nothing (36 prompts x 64 tokens): {s1:.1f} s wall (exit {rc1}); target {TARGET_FROM_NOTHING_S:.0f} s: "
          f"{s1 / TARGET_FROM_NOTHING_S:.2f} of it"
          + (f"; the recording alone {rec:.1f} s: diagnose takes {s1 / rec:.2f}x the recording" if rec else ""))
    print("  steps: " + ", ".join(f"{k} {v:.1f} s" for k, v in st1.items()))
    print(f"  load average after: {_load()}; report {(first / 'report.html').stat().st_size / 1e6:.2f} MB")
    second = out / "with-trace"
    s2, rc2 = _run(["--trace", str(first / "trace"), "--out", str(second), "--html", str(second / "report.html")])
    print(f"--trace: {s2:.1f} s wall (exit {rc2}); target {TARGET_WITH_TRACE_S:.0f} s: {s2 / TARGET_WITH_TRACE_S:.2f} of it")
    print("  steps: " + ", ".join(f"{k} {v:.1f} s" for k, v in _steps(second).items()))
    print(f"  load average after: {_load()}")


if __name__ == "__main__":
    main()
