"""Benchmark: a diagnosis in the app against ``mtpscope diagnose`` (target: the app no slower than 1.5x the CLI).

Both diagnose the trained demo's buggy trace (``--trace``, the CLI's defaults). In turn, ``--repeats`` times:

* **cli**: ``mtpscope diagnose -q --trace BUGGY --out DIR`` as a user runs it (a subprocess: start, imports,
  the diagnosis, ``diagnosis.json``); its wall time.
* **app**: what the Diagnose page does when its button is clicked, in Streamlit's AppTest in a fresh process
  (the demo's two traces open, trace B chosen, "Diagnose this trace" clicked): the click's run, which is what the
  user waits for (the diagnosis, the comparison with trace A, the figures); the process' start and the page's
  first run are not in it (the app is already running when a user clicks). Its uploads folder is new each time,
  so nothing is read back.
* **app, read back**: the same click in that process after its in-memory cache is cleared: the diagnosis saved in
  the cache folder (``inputs.json`` unchanged) read back, as after a restart of the app.

Prints each run, the medians, ``ratio = app / cli`` against the 1.5 target, and the load average before and after.
Exits 0 whatever the numbers (targets are reported, never asserted). On a machine shared with other work the
numbers are indicative only: measure on a quiet machine.

Usage: ``python -m benchmarks.bench_diagnose_app [--repeats 3]``.
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

TARGET_RATIO = 1.5
MAIN = Path(__file__).resolve().parent.parent / "app" / "main.py"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_cli(trace: Path, out: Path) -> float:
    """Wall seconds of ``mtpscope diagnose -q --trace TRACE --out OUT`` (a subprocess)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mtpscope.cli", "diagnose", "-q", "--trace", str(trace), "--out", str(out)],
                   stdout=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t0


def app_once() -> None:
    """In this process (``--app-once``; ``MTPSCOPE_UPLOADS`` set by the caller): the Diagnose page's click, timed,
    then again after the in-memory cache is cleared; one JSON line ``{"click": s, "read_back": s}``."""
    from streamlit.testing.v1 import AppTest

    from mtpscope.app import loaders, selection
    from mtpscope.cache import demo_dir
    from mtpscope.demo.spec import TrainedPaths

    tp = TrainedPaths.under(demo_dir())

    def page() -> AppTest:
        at = AppTest.from_file(str(MAIN), default_timeout=600)
        for slot, path in ((selection.TRACE, tp.traces_f32), (selection.TRACE_B, tp.traces_buggy)):
            at.session_state[selection.slot_key(slot)] = str(path)
        at.run()
        at.switch_page("screens/diagnose.py").run()
        at.radio(key=selection.DIAG_WHICH).set_value("B").run()
        return at

    def click(at: AppTest) -> float:
        t0 = time.perf_counter()
        at.button[0].click().run()
        dt = time.perf_counter() - t0
        if at.exception or not at.error or not at.error[0].value.startswith("Defect found"):
            raise SystemExit(f"the page did not diagnose: {[e.value for e in at.exception]}")
        return dt

    first = click(page())
    loaders._diagnosis.clear()
    again = click(page())
    print(json.dumps({"click": first, "read_back": again}))


def run_app(uploads: Path) -> dict[str, float]:
    env = {**os.environ, "MTPSCOPE_UPLOADS": str(uploads)}
    p = subprocess.run([sys.executable, "-m", "benchmarks.bench_diagnose_app", "--app-once"], env=env,
                       capture_output=True, text=True, check=False)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode or not lines:
        raise SystemExit(f"the app run failed:\n{p.stderr[-2000:]}")
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--app-once", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.app_once:
        app_once()
        return
    from mtpscope.cache import demo_dir
    from mtpscope.demo.spec import TrainedPaths

    trace = TrainedPaths.under(demo_dir()).traces_buggy
    if not (trace / "manifest.json").is_file():
        raise SystemExit(f"the trained demo's buggy trace is not built ({trace}): run `mtpscope demo build`")
    print(f"load average before: {_load()}  (cores: {os.cpu_count()})")
    cli: list[float] = []
    app: list[float] = []
    back: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-diagnose-app-") as tmp:
        for r in range(args.repeats):
            cli.append(run_cli(trace, Path(tmp) / f"cli-{r}"))
            a = run_app(Path(tmp) / f"uploads-{r}")
            app.append(a["click"])
            back.append(a["read_back"])
            print(f"run {r + 1}: cli {cli[-1]:.1f} s · app {app[-1]:.1f} s · app read back {back[-1]:.2f} s "
                  f"(load {_load()})")
    mc, ma, mb = statistics.median(cli), statistics.median(app), statistics.median(back)
    print(f"\nmedian      cli {mc:.1f} s · app {ma:.1f} s · app read back {mb:.2f} s")
    print(f"ratio app / cli = {ma / mc:.2f} (target <= {TARGET_RATIO}); read back / cli = {mb / mc:.3f}")
    print(f"load average after: {_load()}  (timings on a busy machine are indicative only)")


if __name__ == "__main__":
    main()
