"""Benchmark: the recorder and its readers at real sizes, on the real-geometry pair (issue 26).

The pair (:mod:`benchmarks.real_pair`, written once into the cache): the 26B-A4B drafter at its published
geometry (n_embd 1024, 4 layers, dense 262144-row head, Q8_0) and a 2-layer target with the 26B-A4B
hyperparameters (n_embd 2816, 128 experts with 8 used, Q4_0), plus a centroid head (2048 x 1024, top-k 32).
Everything below is measured in this one run and printed as a ratio against its baseline or goal:

1. ``estimate``: ``inspector.estimate`` against the buffer sizes llama.cpp logs while loading the same pair
   and creating the recorder's contexts (weights exact, KV +-1 %, compute +-10 %).
2. start-up: ``mtpscope record``'s start to the first decode against llama.cpp alone loading the two models
   (:mod:`benchmarks.bench_startup`; goal 1.25x), and the pre-flight check's time.
3. tracing overhead: the bare MTP loop (no callback, no copies, no trace) against ``record`` with full tracing
   (worker process, h / h_next / h_inner f16, the centroid head), each traced run paired with the untraced
   run just before it; for each capture (``derived``, the default, and ``graph``); goal <= 2 %.
4. the recorder's memory: a longer recording in a fresh process, RSS of the recording process and of the
   worker sampled after every round: at the start, at the end, and the growth per 1000 rounds (least-squares
   slope over the second half of the rounds). The recorder's grows while the merged file's current row group
   fills (the compaction buffer, at most 64 MiB of steps per table: ``traces.store.parts.row_group_full``),
   then drops when it is written; ``--no-compact`` keeps it flat.
5. trace bytes per round (and per draft step) on disk, of that recording.
6. readers: ``report``, ``explain`` on that trace and on a 10k-round trace made of copies of it, and every app
   page (Streamlit's AppTest) on the 10k-round one; goals: explain on 10k rounds < 1 s, every page < 2 s.

Prints the machine's load average with each section; exits 0 whatever the numbers (speed targets are
reported, never asserted). Usage: ``python -m benchmarks.bench_real_geometry [--max-tokens 24] [--prompts 3]
[--repeats 3] [--memory-prompts 5] [--memory-tokens 64] [--skip estimate,startup,overhead,memory,readers]
[--repack]``. Every load is without llama.cpp's extra
CPU weight buffers unless ``--repack`` (llama.cpp 0.3.36 crashes with them on this MoE target on AMX CPUs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import median_time
from benchmarks.real_pair import RealPair, build_pair
from mtpscope.cache import cache_dir

PROMPTS = ["The quick brown fox jumps over the lazy dog.", "def fibonacci(n):", "Once upon a time, in a land far away,",
           "The capital of France is", "import numpy as np\n"]
MiB = 1 << 20
#: llama.cpp's extra CPU weight buffers (AMX, repacked layouts) for every load here: off by default, since
#: llama.cpp 0.3.36 crashes in the first decode of this pair's MoE target with them on AVX-512 / AMX CPUs
REPACK = [False]
GOALS = {"overhead": 0.02, "startup": 1.25, "explain_10k": 1.0, "page": 2.0}


def load() -> str:
    return f"load average {os.getloadavg()[0]:.2f}"


# ------------------------------------------------------------------------------------------- estimate

def bench_estimate(pair: RealPair, n_ctx: int, n_batch: int) -> None:
    from mtpscope.inspector.estimate import EstimateParams, estimate
    from mtpscope.traces.run.llama import logs
    from mtpscope.traces.run.llama import model as lm
    from tests.estimate_models import parse_llama_sizes

    print(f"\n[1] estimate vs llama.cpp's logged buffers (n_ctx {n_ctx}, n_ubatch {n_batch}, flash attention off, "
          f"F16 KV; the recorder's contexts); {load()}")
    e = estimate(pair.target, pair.assistant, EstimateParams(n_ctx=n_ctx, n_ubatch=n_batch, flash_attn=False))
    with logs.capture_log() as tlog:
        tm = lm.LlamaModel(pair.target, repack=REPACK[0])
    with logs.capture_log() as dlog:
        dm = lm.LlamaModel(pair.assistant, repack=REPACK[0])
    try:
        with logs.capture_log() as clog:
            tc = lm.LlamaContext(tm, n_ctx=n_ctx, n_batch=n_batch, flash_attn=False, nextn=True, masked=False)
        with logs.capture_log() as dclog:
            dc = lm.LlamaContext(dm, n_ctx=n_ctx, n_batch=n_batch, flash_attn=False, mtp_of=tc, nextn=True,
                                 masked=True)
        got_t, got_d = parse_llama_sizes(clog), parse_llama_sizes(dclog)
        rows = [("target weights (llama_model_size)", e.target.weights, tm.model_size, "exact"),
                ("drafter weights (llama_model_size)", e.drafter.weights, dm.model_size, "exact"),
                ("target KV buffer", e.target.kv, sum(got_t["kv_buffer"].values()) * MiB, "+-1 %"),
                ("drafter KV buffer", e.drafter.kv, sum(got_d["kv_buffer"].values()) * MiB, "(shares the target's)"),
                ("target compute buffer", e.target.compute_bytes, sum(got_t["compute"].values()) * MiB, "+-10 %"),
                ("drafter compute buffer", e.drafter.compute_bytes, sum(got_d["compute"].values()) * MiB, "+-10 %")]
        tw = parse_llama_sizes(tlog)["model"]
        dw = parse_llama_sizes(dlog)["model"]
        for name, est, llama, goal in rows:
            ratio = est / llama if llama else float("nan")
            print(f"  {name:<36} estimate {est / MiB:10.2f} MiB  llama.cpp {llama / MiB:10.2f} MiB  ratio "
                  f"{ratio:7.4f}  (goal {goal})")
        print(f"  llama.cpp's model buffers as logged: target {tw}, drafter {dw} (MiB)")
        dc.close()
        tc.close()
    finally:
        dm.close()
        tm.close()


# ------------------------------------------------------------------------------------------- start-up

def bench_start(pair: RealPair, repeats: int) -> None:
    from benchmarks import bench_startup

    print(f"\n[2] start-up: start to the first decode vs llama.cpp alone loading the two models; {load()}")
    m = bench_startup.measure(pair.target, pair.assistant, repeats, repack=REPACK[0])
    bench_startup.report(m)


# ------------------------------------------------------------------------------------------- overhead

def bench_overhead(pair: RealPair, prompts: list[str], max_tokens: int, repeats: int, out: Path) -> None:
    """Untraced / traced pairs per capture mode."""
    from mtpscope.traces.run.mtp_runtime import MtpRuntime
    from mtpscope.traces.run.record_config import RecordConfig
    from mtpscope.traces.run.recorder import record

    print(f"\n[3] tracing overhead: {len(prompts)} prompts x {max_tokens} tokens, n_draft 3, 1 llama.cpp thread, "
          f"{repeats} repeats per capture, each traced run paired with the untraced run before it; {load()}")
    rt = MtpRuntime(pair.target, pair.assistant, capture=False, n_threads=1, repack=REPACK[0])
    toks = [rt.prompt_tokens(p) for p in prompts]
    cfg_off = RecordConfig(max_tokens=max_tokens, n_threads=1)

    def run_off() -> tuple[float, int, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        n = 0
        for tk in toks:
            rs = list(rt.run(tk, cfg_off, trace=False))
            n += 1 + sum(len(r.emitted) for r in rs)
        return time.perf_counter() - t0, n, time.process_time() - c0

    def run_on(mode: str, i: int) -> tuple[float, int, Any]:
        cfg = RecordConfig(max_tokens=max_tokens, n_threads=1, hidden="f16", centroids=pair.centroids,
                           graph_capture=mode == "graph", repack=REPACK[0])
        s = record(cfg, target=pair.target, assistant=pair.assistant, out=out / f"{mode}-{i}", prompts=prompts,
                   command=["bench_real_geometry"], overwrite=True)
        return s.seconds, s.n_generated, s

    run_off()                                   # warm-up
    res: dict[str, list[tuple[float, float, float, float]]] = {"derived": [], "graph": []}
    summaries: dict[str, list[Any]] = {"derived": [], "graph": []}
    for i in range(repeats):
        for mode in (("derived", "graph") if i % 2 == 0 else ("graph", "derived")):
            s_off, n_off, c_off = run_off()
            s_on, n_on, summ = run_on(mode, i)
            res[mode].append((n_off / s_off, n_on / s_on, n_off / c_off, n_on / summ.loop_cpu_seconds))
            summaries[mode].append(summ)
    rt.close()
    for mode, rows in res.items():
        paired = [on / off for off, on, _, _ in rows]
        paired_cpu = [on / off for _, _, off, on in rows]
        med_r = statistics.median(paired)
        ms = summaries[mode]
        print(f"  capture {mode}: tokens/s untraced {statistics.median(r[0] for r in rows):.2f}, traced "
              f"{statistics.median(r[1] for r in rows):.2f}; paired ratio traced/untraced {med_r:.3f} -> overhead "
              f"{100 * (1 - med_r):.1f} % (goal <= {100 * GOALS['overhead']:.0f} %; pairs "
              f"{', '.join(f'{100 * (1 - x):.1f}' for x in paired)} %); per CPU second of the loop: "
              f"{100 * (1 - statistics.median(paired_cpu)):.1f} %")
        print(f"    rounds per run {ms[-1].n_rounds}, loop waited for the recorder "
              f"{statistics.median(x.loop_wait_seconds for x in ms):.3f} s/run, recorder CPU "
              f"{statistics.median(x.recorder_cpu_seconds for x in ms):.2f} s/run")


# ------------------------------------------------------------------------------------------- memory

_RSS_RUN = """
import json, sys
from pathlib import Path
from mtpscope.traces.run.record_config import RecordConfig
from mtpscope.traces.run.recorder import record

def rss(pid):
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0

def children():
    out = []
    for task in Path("/proc/self/task").iterdir():
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return out

samples, worker = [], []

def on_round(pid, res):
    if not worker:
        worker.extend(children())
    samples.append((rss("self"), rss(worker[0]) if worker else 0))

a = json.loads(sys.argv[1])
s = record(RecordConfig(max_tokens=a["max_tokens"], n_threads=1, hidden="f16", centroids=a["centroids"],
                        repack=a["repack"]), target=a["target"], assistant=a["assistant"], out=a["out"],
           prompts=a["prompts"], command=["bench_real_geometry", "memory"], on_round=on_round)
print(json.dumps({"samples": samples, "n_rounds": s.n_rounds, "seconds": s.seconds}))
"""


def bench_memory(pair: RealPair, prompts: list[str], max_tokens: int, out: Path) -> Path:
    """A recording in a fresh process (``record`` as the CLI runs it, capture derived), sampling the recorder's
    and the worker's RSS after every round; returns its trace."""
    import json
    import subprocess
    import sys

    print(f"\n[4] memory: a recording of {len(prompts)} prompts x {max_tokens} tokens in a fresh process, RSS of the "
          f"recorder and of the worker after every round; {load()}")
    args = {"max_tokens": max_tokens, "centroids": os.fspath(pair.centroids), "repack": REPACK[0],
            "target": os.fspath(pair.target), "assistant": os.fspath(pair.assistant), "out": os.fspath(out),
            "prompts": prompts}
    r = subprocess.run([sys.executable, "-c", _RSS_RUN, json.dumps(args)], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[1])
    if r.returncode != 0:
        raise RuntimeError(f"memory run failed: {r.stderr[-1500:]}")
    js = json.loads(r.stdout.strip().splitlines()[-1])
    pts = np.array(js["samples"], dtype=np.float64) / 1024          # MiB
    x = np.arange(len(pts), dtype=np.float64)
    half = len(pts) // 2      # the slope over the second half: past the first rounds' one-time allocations
    per = lambda y: float(np.polyfit(x[half:], y[half:], 1)[0]) * 1000  # noqa: E731 - MiB per 1000 rounds
    print(f"  {js['n_rounds']} rounds in {js['seconds']:.0f} s: recorder RSS {pts[0, 0]:.0f} -> {pts[-1, 0]:.0f} MiB "
          f"(growth {per(pts[:, 0]):+.1f} MiB per 1000 rounds), worker RSS {pts[0, 1]:.0f} -> {pts[-1, 1]:.0f} MiB "
          f"(growth {per(pts[:, 1]):+.1f} MiB per 1000 rounds); recorder / worker {pts[-1, 0] / max(pts[-1, 1], 1):.2f}")
    return out


# ------------------------------------------------------------------------------------------- trace size

def bench_bytes(trace_dir: Path) -> None:
    from mtpscope import traces

    t = traces.open(trace_dir)
    n_r, n_s = int(t.manifest["counts"]["n_rounds"]), int(t.manifest["counts"]["n_steps"])
    size = sum(p.stat().st_size for p in trace_dir.rglob("*") if p.is_file() and p.name != "llama.log")
    dims = t.manifest["dims"]
    raw = 2 * (2 * dims["n_embd_backbone"] + dims["n_embd"])          # f16 h, h_next, h_inner per step
    print(f"\n[5] trace bytes: {size / n_r / 1024:.1f} KiB per round, {size / n_s / 1024:.1f} KiB per step "
          f"({n_r} rounds, {n_s} steps, {size / MiB:.1f} MiB); per step the f16 hidden states alone are "
          f"{raw / 1024:.1f} KiB: ratio on disk / raw hidden {size / n_s / raw:.2f}")
    d = t.manifest.get("derived") or {}
    if d:
        print(f"    derived h_inner (capture derived): from {d.get('from')} {d.get('weights')}, rank {d.get('rank')} of "
              f"{d.get('n_embd')}, cond {d.get('cond', 0):.2f}; agreement with the in-graph capture on "
              f"{d.get('n_calibration')} calibration steps: max relative error {d.get('max_rel_err')} (bound "
              f"{d.get('bound_rel', 0):.3g})")


# ------------------------------------------------------------------------------------------- readers

def replicate(trace_dir: Path, out: Path, n_rounds: int) -> Path:
    """A trace of about ``n_rounds`` rounds made of copies of ``trace_dir`` (prompt ids shifted per copy)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from mtpscope import traces
    from mtpscope.traces.store.writer import TraceWriter

    t = traces.open(trace_dir)
    m = dict(t.manifest)
    rounds = pa.concat_tables([pq.read_table(p) for p in t.part_files("rounds")])
    steps = pa.concat_tables([pq.read_table(p) for p in t.part_files("steps")])
    n_p = len(m["prompts"])
    copies = max(1, -(-n_rounds // rounds.num_rows))
    man = {k: v for k, v in m.items() if k in ("source", "params", "models", "runtime", "dims", "centroids",
                                               "derived")}
    man["command"] = ["bench_real_geometry", "replicate"]
    man["prompts"] = [{**p, "prompt_id": p["prompt_id"] + c * n_p} for c in range(copies) for p in m["prompts"]]
    d = m["dims"]
    with TraceWriter(out, man, n_embd_backbone=d["n_embd_backbone"], n_embd=d["n_embd"],
                     hidden_dtype=d["hidden_dtype"], centroids=m.get("centroids") is not None,
                     flush_every=1 << 30, overwrite=True) as w:
        def shift(tb: pa.Table, by: int) -> pa.Table:
            return tb.set_column(tb.schema.get_field_index("prompt_id"), "prompt_id",
                                 pc.add(tb.column("prompt_id"), pa.scalar(by, pa.int32())))

        for c in range(copies):
            w.write_tables(shift(rounds, c * n_p), shift(steps, c * n_p))
    return out


def bench_readers(pair: RealPair, trace_dir: Path, work: Path) -> None:
    from mtpscope import traces
    from mtpscope.cache import vocab_path
    from mtpscope.traces.analysis.explain_report import explain_trace
    from mtpscope.traces.analysis.metrics import report
    from mtpscope.traces.analysis.vocab import load_vocab

    print(f"\n[6] readers on the recorded trace; {load()}")
    vocab = load_vocab(vocab_path())
    n_r = traces.open(trace_dir).manifest["counts"]["n_rounds"]
    t_rep = median_time(lambda: report(traces.open(trace_dir)), 3)
    t_exp = median_time(lambda: explain_trace(traces.open(trace_dir), vocab=vocab), 3)
    print(f"  report {t_rep:.3f} s, explain {t_exp:.3f} s on {n_r} rounds (open + read + analysis, warm vocabulary)")
    big = replicate(trace_dir, work / "x10k", 10_000)
    n_big = traces.open(big).manifest["counts"]["n_rounds"]
    t_rep = median_time(lambda: report(traces.open(big)), 3)
    t_exp = median_time(lambda: explain_trace(traces.open(big), vocab=vocab), 3)
    print(f"  on {n_big} rounds (copies of it, hidden states included): report {t_rep:.3f} s, explain "
          f"{t_exp:.3f} s: ratio to the goal ({GOALS['explain_10k']:.0f} s) {t_exp / GOALS['explain_10k']:.2f}")
    bench_pages(pair, big)


def bench_pages(pair: RealPair, trace_dir: Path) -> None:
    import logging

    os.environ.setdefault("STREAMLIT_LOGGER_LEVEL", "error")
    from streamlit.testing.v1 import AppTest

    logging.getLogger("streamlit").setLevel(logging.ERROR)

    from mtpscope.app import selection
    from mtpscope.cli.serve import main_script

    os.environ["MTPSCOPE_ROOTS"] = os.pathsep.join([os.fspath(cache_dir()), os.fspath(trace_dir.parent)])
    pages = sorted(p.stem for p in (Path(main_script()).parent / "screens").glob("*.py"))
    slots = {"trace": trace_dir, "drafter": pair.assistant, "target": pair.target}
    print(f"  app pages (AppTest: each page's first run with Streamlit's caches cleared, then a rerun; the trace "
          f"{trace_dir.name}, the pair selected; goal < {GOALS['page']:.0f} s):")
    import streamlit as st

    for page in pages:
        st.cache_resource.clear()          # each page cold, as the first page a user opens on this trace
        st.cache_data.clear()
        at = AppTest.from_file(str(main_script()), default_timeout=600)
        for k, v in slots.items():
            at.session_state[selection.slot_key(k)] = str(v)
        at.run()
        t0 = time.perf_counter()
        at.switch_page(f"screens/{page}.py").run()
        t1 = time.perf_counter()
        at.run()
        t2 = time.perf_counter()
        err = [e.value for e in at.exception][:1]
        print(f"    {page:<11} {t1 - t0:7.2f} s  rerun {t2 - t1:6.2f} s  ratio {(t1 - t0) / GOALS['page']:5.2f}  "
              f"({len(at.metric)} metrics, {len(at.dataframe)} tables, {len(at.get('plotly_chart'))} charts)"
              + (f"  EXCEPTION {str(err[0])!r:.160}" if err else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--startup-repeats", type=int, default=3)
    ap.add_argument("--memory-prompts", type=int, default=5)
    ap.add_argument("--memory-tokens", type=int, default=64)
    ap.add_argument("--skip", default="", help="comma-separated: estimate,startup,overhead,memory,readers "
                    "(the readers need the memory run's trace)")
    ap.add_argument("--repack", action="store_true", help="llama.cpp's extra CPU weight buffers on (crashes "
                    "llama.cpp 0.3.36 with this MoE target on AVX-512 / AMX CPUs)")
    a = ap.parse_args()
    REPACK[0] = a.repack
    skip = set(filter(None, a.skip.split(",")))
    pair = build_pair()
    print(f"bench_real_geometry: target {pair.target.name} ({pair.target.stat().st_size / 2**30:.2f} GiB), "
          f"drafter {pair.assistant.name} ({pair.assistant.stat().st_size / 2**30:.2f} GiB), centroids "
          f"{pair.centroids}; {load()}")
    if "estimate" not in skip:
        bench_estimate(pair, n_ctx=1024, n_batch=256)
    if "startup" not in skip:
        bench_start(pair, a.startup_repeats)
    work = Path(tempfile.mkdtemp(prefix="bench-real-", dir=cache_dir()))
    try:
        if "overhead" not in skip:
            bench_overhead(pair, PROMPTS[:a.prompts], a.max_tokens, a.repeats, work)
        if not {"memory", "readers"} <= skip:
            trace = bench_memory(pair, PROMPTS[:a.memory_prompts], a.memory_tokens, work / "memory")
            bench_bytes(trace)
            if "readers" not in skip:
                bench_readers(pair, trace, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
