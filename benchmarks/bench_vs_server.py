"""Benchmark: ``mtpscope record`` (default tracing) against llama-server's own MTP loop on the same pair
(goal: recording >= 0.97x llama-server's tokens/s).

The anchor users know: llama.cpp's ``llama-server`` with ``--spec-type draft-mtp`` (the build of
``mtpscope server build``, the very llama.cpp the recorder runs: docs/SERVER.md), started with the project's
launcher (:func:`traces.server.launch.launch`: ``--parallel 1 --flash-attn off``, plus the same threads for
the target and the drafter, ``-c 1024 -b 256 -ub 256`` as the recorder's contexts, and the GPU layers when
given), against :func:`traces.run.recorder.record` as ``mtpscope record`` runs it (worker process,
``RecordConfig()``'s tracing: h, h_next, h_inner f16 with h_inner derived, top-k, the target's side,
write-ahead log, Parquet parts, compaction). Same prompts (texts; BOS added on both sides), ``n_draft``,
``max_tokens`` (= the server's ``n_predict``), greedy, same threads. Per repeat the arms alternate (server
first on even repeats); the server is loaded once (its load is excluded), each ``record`` call starts its own
worker (its start-up is excluded: ``benchmarks/bench_startup.py`` measures that).

Tokens per second, per repeat over all prompts (generated tokens, the first one included on both sides):

* server ``predicted_per_second``: the server's own figure, ``predicted_n / predicted_ms`` summed over the
  requests (generation only: the prompt's prefill is in ``prompt_ms``, left out);
* server prompt + gen: ``predicted_n / (prompt_ms + predicted_ms)`` (from the prefill's start to the last
  token, as the recorder's loop clock runs);
* server HTTP wall: ``predicted_n`` / the requests' wall time as this client saw it;
* record loop: ``n_generated / loop_seconds`` (the worker's clock from the first prompt's prefill until
  the last round was handed to the recorder);
* record to the trace's close: ``RecordSummary.tokens_per_second`` (what ``mtpscope record`` prints).

Ratios (medians of the repeats, and the median of each repeat's pair): record loop / server prompt + gen
(like for like), record loop / server ``predicted_per_second`` (the server's own number, which also leaves
out the prefill: it flatters the server by the prefill's share), record to close / server HTTP wall. Also
the tokens per CPU second of all processes (server: its process's CPU over the requests, from
``/proc/PID/stat``; record: ``RecordSummary.cpu_seconds``, both processes over the loop), whether the
outputs are equal token for token, and the drafted / accepted counts of each side.

llama.cpp's own loop without a server: the vendored llama.cpp has ``examples/speculative-simple`` (it
drives the MTP drafter too), but ``mtpscope server build`` compiles only the server (the common library,
cpp-httplib, the server), so there is no such binary to run; llama-server is the anchor.

Usage: ``python -m benchmarks.bench_vs_server [--pair demo|real] [--repeats 5] [--n-draft 3]
[--max-tokens 64] [--threads 1] [--n-gpu-layers N] [--no-repack]``; exits 0 whatever the numbers (speed
targets are reported, never asserted); exits 2 when llama-server is not built.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_startup import pair_paths

GOAL = 0.97
PROMPTS = ("The quick brown fox", "Once upon a time in a small village", "Speculative decoding works by")
#: the recorder's contexts (traces.run.mtp_runtime.MtpRuntime: n_ctx 1024, n_batch 256)
CONTEXT_FLAGS = ("-c", "1024", "-b", "256", "-ub", "256")


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) of a running process, from ``/proc/PID/stat``."""
    with open(f"/proc/{pid}/stat") as fh:
        rest = fh.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def server_flags(threads: int, n_gpu_layers: int | None, repack: bool) -> list[str]:
    """The llama-server flags that make its run the recorder's: threads for both contexts, context sizes,
    GPU layers (record's -1 = all), ``--no-repack``."""
    t = str(threads)
    flags = ["-t", t, "-tb", t, "-td", t, "-tbd", t, *CONTEXT_FLAGS]
    if n_gpu_layers is not None:
        ngl = "all" if n_gpu_layers < 0 else str(n_gpu_layers)
        flags += ["-ngl", ngl, "-ngld", ngl]
    if not repack:
        flags.append("--no-repack")
    return flags


def server_run(client: Any, pid: int, max_tokens: int) -> dict[str, Any]:
    """One pass over :data:`PROMPTS` on the running server: summed timings, wall, CPU, outputs, drafts."""
    tot = dict.fromkeys(("n", "gen_ms", "prompt_ms", "wall", "cpu", "drafted", "accepted"), 0.0)
    outs = []
    for text in PROMPTS:
        c0, t0 = _proc_cpu(pid), time.perf_counter()
        r = client.completion({"prompt": text, "n_predict": max_tokens, "temperature": 0, "seed": 0,
                               "cache_prompt": False, "return_tokens": True})
        tot["wall"] += time.perf_counter() - t0
        tot["cpu"] += _proc_cpu(pid) - c0
        tm = r["timings"]
        tot["n"] += tm["predicted_n"]
        tot["gen_ms"] += tm["predicted_ms"]
        tot["prompt_ms"] += tm["prompt_ms"]
        tot["drafted"] += tm.get("draft_n", 0)
        tot["accepted"] += tm.get("draft_n_accepted", 0)
        outs.append(tuple(r.get("tokens") or ()))
    return {**tot, "outputs": outs}


def record_run(target: Path, assistant: Path, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One ``record`` of :data:`PROMPTS` (default tracing) in a worker process."""
    from mtpscope.traces.run.record_config import RecordConfig
    from mtpscope.traces.run.recorder import record

    kw: dict[str, Any] = {} if args.n_gpu_layers is None else {"n_gpu_layers": args.n_gpu_layers}
    s = record(RecordConfig(n_draft=args.n_draft, max_tokens=args.max_tokens, n_threads=args.threads,
                            repack=not args.no_repack, **kw),
               target=target, assistant=assistant, out=out, prompts=list(PROMPTS), command=["bench"], overwrite=True)
    return {"n": s.n_generated, "loop": s.loop_seconds, "secs": s.seconds, "cpu": s.cpu_seconds,
            "drafted": s.n_drafted, "accepted": s.n_accepted, "outputs": [tuple(o) for o in s.outputs]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="demo", choices=("demo", "real"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--n-draft", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-gpu-layers", type=int, default=None, help="both sides (default: each one's own default)")
    ap.add_argument("--no-repack", action="store_true", help="both sides without llama.cpp's extra CPU weight "
                    "buffers (needed for the real pair's MoE target on AMX CPUs)")
    args = ap.parse_args()

    from mtpscope.cache import cache_dir
    from mtpscope.traces.server.build import server_path
    from mtpscope.traces.server.client import ServerClient
    from mtpscope.traces.server.launch import launch

    if server_path() is None:
        print("bench_vs_server: llama-server is not built (`mtpscope server build`)", file=sys.stderr)
        return 2
    target, assistant = pair_paths(args.pair)
    work = cache_dir() / "bench-vs-server"
    work.mkdir(parents=True, exist_ok=True)
    srv_runs: list[dict[str, Any]] = []
    rec_runs: list[dict[str, Any]] = []
    with launch(target, assistant, n_draft=args.n_draft, log=work / "llama-server.log",
                extra=server_flags(args.threads, args.n_gpu_layers, not args.no_repack)) as srv, \
            ServerClient(srv.url, timeout_s=600.0) as client, tempfile.TemporaryDirectory() as td:
        server_run(client, srv.pid, args.max_tokens)              # warm-up: page cache, graphs
        record_run(target, assistant, args, Path(td) / "warm")
        for i in range(args.repeats):
            arms = ("server", "record") if i % 2 == 0 else ("record", "server")
            for arm in arms:
                if arm == "server":
                    srv_runs.append(server_run(client, srv.pid, args.max_tokens))
                else:
                    rec_runs.append(record_run(target, assistant, args, Path(td) / f"r{i}"))
    report(args, target, assistant, srv_runs, rec_runs)
    return 0


def report(args: argparse.Namespace, target: Path, assistant: Path, srv: list[dict[str, Any]],
           rec: list[dict[str, Any]]) -> None:
    """The compact table: tokens/s of each measure (median, runs), the ratios, CPU, outputs, drafts."""
    med = statistics.median
    rows = {
        "server predicted_per_second (gen only)": [r["n"] / (r["gen_ms"] / 1e3) for r in srv],
        "server prompt + gen (its timings)": [r["n"] / ((r["prompt_ms"] + r["gen_ms"]) / 1e3) for r in srv],
        "server HTTP wall": [r["n"] / r["wall"] for r in srv],
        "record loop (worker clock)": [r["n"] / r["loop"] for r in rec],
        "record to the trace's close": [r["n"] / r["secs"] for r in rec],
        "server per CPU second": [r["n"] / r["cpu"] if r["cpu"] else float("nan") for r in srv],
        "record per CPU second (both processes)": [r["n"] / r["cpu"] for r in rec],
    }
    print(f"bench_vs_server: {args.pair} pair ({target.name} + {assistant.name}), {len(PROMPTS)} prompts x "
          f"{args.max_tokens} tokens, n_draft {args.n_draft}, {args.threads} thread(s), {args.repeats} alternating "
          f"repeats; load average {os.getloadavg()[0]:.2f}")
    print(f"  {'tokens/s':42s} {'median':>8s}  runs")
    for k, v in rows.items():
        print(f"  {k:42s} {med(v):8.1f}  {', '.join(f'{x:.1f}' for x in v)}")

    def ratio(num: str, den: str, label: str, goal: float | None = GOAL) -> None:
        a, b = rows[num], rows[den]
        paired = med(x / y for x, y in zip(a, b, strict=True))
        g = f"  goal >= {goal}" if goal is not None else ""
        print(f"  ratio {label:52s} {med(a) / med(b):6.3f}  (paired {paired:.3f}){g}")

    ratio("record loop (worker clock)", "server prompt + gen (its timings)", "record loop / server prompt+gen")
    ratio("record loop (worker clock)", "server predicted_per_second (gen only)",
          "record loop / server predicted_per_second")
    ratio("record to the trace's close", "server HTTP wall", "record to close / server HTTP wall")
    ratio("record per CPU second (both processes)", "server per CPU second", "record / server per CPU second",
          goal=0.95)
    same = all(list(r["outputs"]) == list(s["outputs"]) for r, s in zip(rec, srv, strict=True))
    print(f"  outputs equal token for token: {'yes' if same else 'NO'}; drafted / accepted per pass: server "
          f"{srv[-1]['drafted']:.0f} / {srv[-1]['accepted']:.0f}, record {rec[-1]['drafted']} / {rec[-1]['accepted']}")


if __name__ == "__main__":
    raise SystemExit(main())
