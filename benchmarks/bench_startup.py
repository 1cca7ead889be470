"""Benchmark: start-up of ``mtpscope record`` against llama.cpp alone loading the same two models
(target: at most 1.25x), broken down.

Measured in one run, alternating ``--repeats`` times, each in a fresh process started by this script:

* **llama.cpp alone**: a Python process that loads the target and the drafter with llama.cpp
  (``llama_model_load_from_file`` through ``traces.run.llama.model.LlamaModel``, nothing else), from the
  process's start to both models loaded (the baseline); the same process then creates the two contexts the
  MTP loop needs (``MtpRuntime``'s: n_ctx 1024, the drafter's an MTP context on the target's), which is
  llama.cpp's own cost of being able to decode, printed beside it;
* **mtpscope record**: a Python process that imports the CLI (``mtpscope.cli.main``), starts the worker
  (``worker_spawn.prespawn``), imports the recorder and runs ``record()`` as ``mtpscope record --max-tokens 2``
  does (worker process, default capture ``derived``), from the process's start to the loop's first decode
  (``RecordSummary.startup_seconds``: the worker's clock when its loop began); and the same with the worker
  started inside ``record()`` (the Python API; the CLI before it started the worker early), alternating.

Both are wall times from ``Popen``, so Python's start and the imports count on both sides. The breakdown of
record's start-up (medians, seconds from ``Popen``; the worker's clock is ``Hello.startup``): the recorder's
Python start and imports; the worker's spawn to its ``main`` (Python start, the worker module's imports);
the job's arrival; llama.cpp's import, both loads and both contexts (``load_runtime``); tokenizing the
prompts; the recorder's pre-flight check (beside the worker, from ``record()``'s call) and its ``go``; the
first decode. Also CPU seconds up to that moment (llama.cpp alone: the process's; record:
``RecordSummary.startup_cpu_seconds``, both processes). Ratios of the medians and the median of the
paired ratios; exits 0 whatever the numbers (speed targets are reported, never asserted).

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
from mtpscope.traces.run.llama.model import LlamaContext, LlamaModel
from mtpscope.traces.run.llama import binding
binding.llama()
t_imp, c_imp = time.time(), time.process_time()
repack = sys.argv[4] == "1"
a = LlamaModel(sys.argv[2], repack=repack); b = LlamaModel(sys.argv[3], repack=repack)
t_load, cpu = time.time(), time.process_time()
tc = LlamaContext(a, n_ctx=1024, n_batch=256, flash_attn=False, nextn=True, masked=False)
dc = LlamaContext(b, n_ctx=1024, n_batch=256, mtp_of=tc, flash_attn=False, nextn=True, masked=True)
print(json.dumps({"imports": t_imp - t_spawn, "loaded": t_load - t_spawn, "cpu": cpu, "imports_cpu": c_imp,
                  "contexts": time.time() - t_load}))
"""

_RECORD = """
import json, sys, time
t_spawn = float(sys.argv[1])
import mtpscope.cli.main
if sys.argv[7] == "1":        # as the record command does: the worker starts before the recorder is imported
    from mtpscope.traces.run import worker_spawn
    worker_spawn.prespawn()
from mtpscope.traces.run import record_worker as rw
from mtpscope.traces.run.record_config import RecordConfig
from mtpscope.traces.run.recorder import record
marks = {}
_init, _hello, _go = rw.RecordWorker.__init__, rw.RecordWorker.hello, rw.RecordWorker.go
def init(self, *a, **k):
    _init(self, *a, **k)
    marks["spawn"] = self.spawned_at
def hello(self):
    info = _hello(self)
    marks.update(info.startup or {})
    return info
def go(self):
    marks["go"], marks["go_cpu"] = time.time(), time.process_time()
    _go(self)
rw.RecordWorker.__init__, rw.RecordWorker.hello, rw.RecordWorker.go = init, hello, go
t_enter, c_enter = time.time(), time.process_time()
s = record(RecordConfig(max_tokens=2, repack=sys.argv[6] == "1"), target=sys.argv[2], assistant=sys.argv[3],
           out=sys.argv[4], prompt=sys.argv[5], command=["bench"])
print(json.dumps({"imports": t_enter - t_spawn, "preflight": s.preflight_seconds, "startup": s.startup_seconds,
                  "first_decode": t_enter - t_spawn + s.startup_seconds, "cpu": s.startup_cpu_seconds,
                  "imports_cpu": c_enter, **{k: v if k.endswith("_cpu") else v - t_spawn for k, v in marks.items()}}))
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


def llama_alone(target: Path, assistant: Path, repack: bool = True) -> dict[str, float]:
    """Seconds from Popen to llama.cpp imported and to both models loaded, the CPU seconds by then, and the
    seconds the two contexts took after."""
    t = time.time()
    out = subprocess.run([sys.executable, "-c", _LLAMA_ALONE, repr(t), os.fspath(target), os.fspath(assistant),
                          "1" if repack else "0"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    return {k: float(v) for k, v in json.loads(out.strip().splitlines()[-1]).items()}


def record_run(target: Path, assistant: Path, repack: bool = True, prespawn: bool = True) -> dict[str, float]:
    """``record()`` in a fresh process: imports, pre-flight, start-up, first decode (seconds from Popen), CPU.
    ``prespawn``: the worker started before the recorder's imports, as ``mtpscope record`` does; else inside
    ``record()`` (the Python API's way, and the CLI's before the worker was started early)."""
    with tempfile.TemporaryDirectory() as td:
        t = time.time()
        out = subprocess.run([sys.executable, "-c", _RECORD, repr(t), os.fspath(target), os.fspath(assistant),
                              os.fspath(Path(td) / "t"), PROMPT, "1" if repack else "0", "1" if prespawn else "0"],
                             capture_output=True,
                             text=True, cwd=ROOT)
        if out.returncode != 0:
            raise RuntimeError(f"record failed ({out.returncode}): {out.stderr[-800:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


#: record's start-up pieces: (label, from mark, to mark); marks in seconds from Popen, and ``<mark>_cpu`` the
#: CPU seconds of that mark's process then (None: the process's start, 0 CPU seconds)
PIECES = (("recorder: Python start + CLI imports -> worker spawned", None, "spawn"),
          ("recorder: worker spawned -> record() called (imports)", "spawn", "imports"),
          ("worker: spawn -> main (Python start, imports)", None, "main"),
          ("worker: main -> job received (llama.cpp imported meanwhile)", "main", "job"),
          ("worker: 2 model loads, 2 contexts", "job", "runtime"),
          ("worker: tokenize prompts, hello", "runtime", "prompts"),
          ("worker: hello -> first decode (waits for go)", "prompts", "first_decode"))


def measure(target: Path, assistant: Path, repeats: int, repack: bool = True) -> dict[str, object]:
    """Alternating runs; medians and the ratios (start to first decode / llama.cpp's load). ``repack``:
    llama.cpp's extra CPU weight buffers on both sides (``record --no-repack`` when False)."""
    llama_alone(target, assistant, repack)  # page cache warm for both sides
    las, runs, lates = [], [], []
    for i in range(repeats):
        las.append(llama_alone(target, assistant, repack))
        for early in ((True, False) if i % 2 == 0 else (False, True)):
            (runs if early else lates).append(record_run(target, assistant, repack, prespawn=early))
    med = statistics.median
    la = [x["loaded"] for x in las]
    rc = [r["first_decode"] for r in runs]
    late = [r["first_decode"] for r in lates]
    return {"llama": la, "record": rc, "late": late, "ratio_late": med(late) / med(la),
            "ratio_late_paired": med(b / a for a, b in zip(la, late, strict=True)),
            "llama_cpu": [x["cpu"] for x in las], "record_cpu": [r["cpu"] for r in runs],
            "ratio": med(rc) / med(la), "ratio_paired": med(b / a for a, b in zip(la, rc, strict=True)),
            "ratio_cpu": med(r["cpu"] for r in runs) / med(x["cpu"] for x in las),
            "llama_imports": med(x["imports"] for x in las), "contexts": med(x["contexts"] for x in las),
            "llama_imports_cpu": med(x["imports_cpu"] for x in las),
            "runs": runs}


def _piece(runs: list[dict[str, float]], a: str | None, b: str, cpu: bool = False) -> float | None:
    """Median of mark ``b`` minus mark ``a`` (wall, or with ``cpu`` the ``_cpu`` marks) over the runs that have
    both; ``a`` None: from Popen (wall) / from 0 CPU seconds."""
    sfx = "_cpu" if cpu else ""
    if not cpu and a is None and b == "main":     # the worker's Python start is counted from its spawn
        a = "spawn"
    vals = [r[b + sfx] - (r[a + sfx] if a else 0.0) for r in runs if b + sfx in r and (a is None or a + sfx in r)]
    return statistics.median(vals) if vals else None


def _f(v: float | None) -> str:
    return "     -" if v is None else f"{v:6.2f}"


def report(m: dict[str, object]) -> None:
    med = statistics.median
    la, rc = m["llama"], m["record"]
    runs = m["runs"]
    print(f"  llama.cpp alone, start to both models loaded: median {med(la):.2f} s  (runs: "
          f"{', '.join(f'{x:.2f}' for x in la)}); CPU {med(m['llama_cpu']):.2f} s; of which Python start and "
          f"imports (numpy, llama.cpp) {m['llama_imports']:.2f} s (CPU {m['llama_imports_cpu']:.2f} s); then its "
          f"two contexts {m['contexts']:.2f} s")
    print(f"  mtpscope record, start to the first decode:   median {med(rc):.2f} s  (runs: "
          f"{', '.join(f'{x:.2f}' for x in rc)}); CPU of both processes {med(m['record_cpu']):.2f} s")
    print(f"  ratio record / llama.cpp alone: {m['ratio']:.2f}x (paired median {m['ratio_paired']:.2f}x; "
          f"CPU {m['ratio_cpu']:.2f}x); goal <= {GOAL}x; record minus llama.cpp alone {med(rc) - med(la):+.2f} s")
    late = m["late"]
    print(f"  worker started inside record() instead (the Python API; the CLI before): median {med(late):.2f} s "
          f"(runs: {', '.join(f'{x:.2f}' for x in late)}); ratio {m['ratio_late']:.2f}x (paired "
          f"{m['ratio_late_paired']:.2f}x)")
    print(f"  record's start-up, medians (wall: s from Popen; CPU: s of that process)   {'wall':>6s} {'CPU':>6s}")
    for label, a, b in PIECES:
        print(f"    {label:70s} {_f(_piece(runs, a, b))} {_f(_piece(runs, a, b, cpu=True) if b != 'first_decode' else None)}")
    pf = med(r["preflight"] for r in runs)
    print(f"    {'recorder: pre-flight check (beside the worker), then go':70s} {pf:6.2f} "
          f"{_f(_piece(runs, 'imports', 'go', cpu=True))}   (go sent at {_f(_piece(runs, None, 'go')).strip()} s, "
          f"the worker's hello at {_f(_piece(runs, None, 'prompts')).strip()} s)")


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
