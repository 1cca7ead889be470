"""Benchmark: start-up of ``mtpscope record`` against llama.cpp alone loading the same two models
(target: at most 1.25x).

Measured in one run, alternating ``--repeats`` times, each in a fresh process started by this script:

* **llama.cpp alone**: a Python process that loads the target and the drafter with llama.cpp
  (``llama_model_load_from_file`` through ``traces.run.llama.model.LlamaModel``, nothing else), from the
  process's start to both models loaded;
* **mtpscope record**: a Python process that imports the CLI (``mtpscope.cli.main``) and runs
  ``record()`` as ``mtpscope record --max-tokens 2`` does (worker process, default capture ``derived``: the
  solve and its calibration steps included), from the process's start to the loop's first decode
  (``RecordSummary.startup_seconds``: the worker's clock when its loop began).

Both are wall times from ``Popen``, so Python's start and the imports count on both sides. Also printed: CPU
seconds up to that moment (llama.cpp alone: the process's; record: ``RecordSummary.startup_cpu_seconds``,
both processes), and where record's start-up goes (Python start and imports, the pre-flight check -- run
while the worker loads the models --, the rest up to the first decode). Ratios of the medians and the
median of the paired ratios; exits 0 whatever the numbers (speed targets are reported, never asserted).

Usage: ``python -m benchmarks.bench_startup [--pair demo|real] [--repeats 5] [--no-repack]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL = 1.25
ROOT = Path(__file__).resolve().parents[1]

_LLAMA_ALONE = """
import json, sys, time
t_spawn = float(sys.argv[1])
from mtpscope.traces.run.llama.model import LlamaModel
repack = sys.argv[4] == "1"
a = LlamaModel(sys.argv[2], repack=repack); b = LlamaModel(sys.argv[3], repack=repack)
print(json.dumps({"loaded": time.time() - t_spawn, "cpu": time.process_time()}))
"""

_RECORD = """
import json, sys, time
t_spawn = float(sys.argv[1])
import mtpscope.cli.main
from mtpscope.traces.run.record_config import RecordConfig
from mtpscope.traces.run.recorder import record
t_enter = time.time()
s = record(RecordConfig(max_tokens=2, repack=sys.argv[6] == "1"), target=sys.argv[2], assistant=sys.argv[3],
           out=sys.argv[4], prompt=sys.argv[5], command=["bench"])
print(json.dumps({"imports": t_enter - t_spawn, "preflight": s.preflight_seconds, "startup": s.startup_seconds,
                  "first_decode": t_enter - t_spawn + s.startup_seconds, "cpu": s.startup_cpu_seconds}))
"""

PROMPT = "The quick brown fox"


def pair_paths(which: str) -> tuple[Path, Path]:
    """The demo pair (target + noisy upstream drafter) or the real-geometry pair (benchmarks/real_pair.py)."""
    if which == "real":
        from benchmarks.real_pair import build_pair

        p = build_pair()
        return p.target, p.assistant
    from mtpscope.cache import cache_dir
    from mtpscope.demo.spec import RECORD_CONFIG, DemoPaths

    d = DemoPaths.under(cache_dir() / "demo", RECORD_CONFIG)
    if not (d.target.exists() and d.drafter_upstream_noisy.exists()):
        from mtpscope.demo.build import build_demo

        d = build_demo(traces=False, trained=False)
    return d.target, d.drafter_upstream_noisy


def llama_alone(target: Path, assistant: Path, repack: bool = True) -> tuple[float, float]:
    """(wall seconds from Popen to both models loaded, CPU seconds of the process by then)."""
    t = time.time()
    out = subprocess.run([sys.executable, "-c", _LLAMA_ALONE, repr(t), os.fspath(target), os.fspath(assistant),
                          "1" if repack else "0"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    js = json.loads(out.strip().splitlines()[-1])
    return float(js["loaded"]), float(js["cpu"])


def record_run(target: Path, assistant: Path, repack: bool = True) -> dict[str, float]:
    """``record()`` in a fresh process: imports, pre-flight, start-up, first decode (seconds from Popen), CPU."""
    with tempfile.TemporaryDirectory() as td:
        t = time.time()
        out = subprocess.run([sys.executable, "-c", _RECORD, repr(t), os.fspath(target), os.fspath(assistant),
                              os.fspath(Path(td) / "t"), PROMPT, "1" if repack else "0"], capture_output=True,
                             text=True, cwd=ROOT)
        if out.returncode != 0:
            raise RuntimeError(f"record failed ({out.returncode}): {out.stderr[-800:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(target: Path, assistant: Path, repeats: int, repack: bool = True) -> dict[str, object]:
    """Alternating runs; medians and the ratios (start to first decode / llama.cpp's load). ``repack``:
    llama.cpp's extra CPU weight buffers on both sides (``record --no-repack`` when False)."""
    llama_alone(target, assistant, repack)  # page cache warm for both sides
    la, la_cpu, runs = [], [], []
    for _ in range(repeats):
        w, c = llama_alone(target, assistant, repack)
        la.append(w)
        la_cpu.append(c)
        runs.append(record_run(target, assistant, repack))
    med = statistics.median
    rc = [r["first_decode"] for r in runs]
    return {"llama": la, "record": rc, "llama_cpu": la_cpu, "record_cpu": [r["cpu"] for r in runs],
            "ratio": med(rc) / med(la), "ratio_paired": med(b / a for a, b in zip(la, rc, strict=True)),
            "ratio_cpu": med(r["cpu"] for r in runs) / med(la_cpu),
            "parts": {k: med(r[k] for r in runs) for k in ("imports", "preflight", "startup")}}


def report(m: dict[str, object]) -> None:
    med = statistics.median
    la, rc = m["llama"], m["record"]
    print(f"  llama.cpp alone, start to both models loaded: median {med(la):.2f} s  (runs: "
          f"{', '.join(f'{x:.2f}' for x in la)}); CPU {med(m['llama_cpu']):.2f} s")
    print(f"  mtpscope record, start to the first decode:   median {med(rc):.2f} s  (runs: "
          f"{', '.join(f'{x:.2f}' for x in rc)}); CPU of both processes {med(m['record_cpu']):.2f} s")
    print(f"  ratio record / llama.cpp alone: {m['ratio']:.2f}x (paired median {m['ratio_paired']:.2f}x; "
          f"CPU {m['ratio_cpu']:.2f}x); goal <= {GOAL}x")
    p = m["parts"]
    print(f"  record's start-up (medians): Python start and imports {p['imports']:.2f} s, then to the first "
          f"decode {p['startup']:.2f} s, of which the pre-flight check {p['preflight']:.2f} s (beside the "
          "worker's model loading)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="demo", choices=("demo", "real"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-repack", action="store_true", help="both sides without llama.cpp's extra CPU weight "
                    "buffers (record --no-repack; needed for the real pair's MoE target on AMX CPUs)")
    a = ap.parse_args()
    target, assistant = pair_paths(a.pair)
    m = measure(target, assistant, a.repeats, repack=not a.no_repack)
    print(f"bench_startup: {a.pair} pair ({target.name} + {assistant.name}), {a.repeats} alternating repeats; "
          f"load average {os.getloadavg()[0]:.2f}")
    report(m)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
