"""Benchmark: what this machine charges for memory that sat idle, and what that does to the recorder's work.

Why it matters: ``bench_record`` compares an untraced loop that never pauses (its pages stay hot) with a
recording whose recorder works a millisecond or two per round and sleeps in between (about 50 ms a round on the
tiny demo pair), and whose trace is opened and closed once per run, seconds apart. Where the host of a virtual
machine reclaims or compresses guest pages left idle, every page touched again after such a pause costs a
fault on the host, which the guest counts as its own CPU time; without such a host it costs a cache miss
(about 0.1 µs). So ``bench_record``'s CPU figure for tracing depends on the machine as much as on the code;
this prints how much, on the machine it runs on:

1. **page touch after idle**: µs per 4 KiB page to read one value of each page of an 8 MiB buffer after it sat
   untouched for 0 / 10 / 50 / 200 ms / 1 s, above the same read done again at once (median of ``--repeats``;
   :func:`benchmarks.harness.idle_touch_us`);
2. **the recorder's work on real rounds**: the rounds of one recording of the tiny demo pair (96 tokens,
   n_draft 3, ``mtpscope record``'s default tracing), kept in memory, then the recorder's part of each round
   (:func:`traces.run.step_analysis.step_records` with the derived ``h_inner``, and
   :meth:`~traces.store.writer.TraceWriter.add_round`: the write-ahead log) replayed into a fresh trace, back to
   back and with the run's gap between rounds (each round's own arrays read just before, as the worker has
   just written them in a real run); thread CPU per round (the mean over the rounds, the median of the
   repeats), then the trace's close (the Parquet part, the manifest; CPU of all threads) after the gap too: as
   in a run, where the close's own code last ran a run earlier; and the same with :data:`BATCH` rounds handled
   at a time after as many gaps (what the recorder spends now that the worker's doorbell wakes it for
   ``traces.run.record_worker.WAKE_EVERY`` rounds at once).

Exits 0 whatever the numbers (nothing is asserted). Usage: ``python -m benchmarks.bench_idle_memory
[--repeats 3] [--gap-ms 50] [--pause-s S]``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import PAGE_BYTES, idle_touch_us
from mtpscope.traces.run.record_worker import WAKE_EVERY

#: idle times of the page-touch test, seconds
GAPS_S = (0.0, 0.01, 0.05, 0.2, 1.0)
#: rounds the batched arm of the replay handles at a time: as many as the recorder is woken for
BATCH = WAKE_EVERY


def recorded_rounds() -> tuple[list[tuple[int, Any]], dict[str, Any], Path]:
    """The rounds of one recording of the tiny demo pair (in this process, so that each round's arrays are its
    own), the trace's manifest and the drafter's path."""
    from benchmarks.bench_record import PROMPT, models
    from mtpscope.traces.run.record_config import RecordConfig
    from mtpscope.traces.run.recorder import record
    from mtpscope.traces.store.manifest import read_manifest

    target, drafter, _ = models("full")
    rounds: list[tuple[int, Any]] = []
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "trace"
        record(RecordConfig(n_draft=3, max_tokens=96), target=target, assistant=drafter, out=out, prompt=PROMPT,
               command=["bench_idle_memory"], isolate=False,
               on_round=lambda pid, res: rounds.append((pid, _as_worker_sends(res))))
        manifest = read_manifest(out)
    return rounds, manifest, drafter


def _as_worker_sends(res: Any) -> Any:
    """A copy of the round as the recording worker hands it over: each drafter row with its top-k ids found
    while it was copied (``DraftStep.top_ids``), so the recorder reads only the listed values of the row."""
    from mtpscope.traces.run.ranking import top_k_desc
    from mtpscope.traces.run.record_config import RecordConfig

    n_top = RecordConfig().n_top
    steps = tuple(dataclasses.replace(st, top_ids=top_k_desc(st.logits, n_top)) if st.logits is not None else st
                  for st in res.steps)
    return copy.deepcopy(dataclasses.replace(res, steps=steps))


def _touch(res: Any) -> None:
    """Read one value of every page of the round's arrays."""
    arrays = [a for st in res.steps for a in (st.logits, st.h, st.h_next, st.h_inner, st.top_ids) if a is not None]
    for a in (*arrays, *res.h_target, *res.target_logits):
        a.reshape(-1)[:: max(PAGE_BYTES // a.itemsize, 1)].sum()


def replay(rounds: list[tuple[int, Any]], manifest: dict[str, Any], solver: Any, gap_s: float,
           pause_s: float, folder: Path, batch: int = 1) -> tuple[float, float]:
    """The recorder's work on ``rounds`` into a fresh trace under ``folder``, ``batch`` rounds at a time after
    ``batch * gap_s`` of sleep (``gap_s`` a round), and ``pause_s`` before the close: (thread CPU ms per round,
    the mean over the rounds; CPU ms of the close, all threads)."""
    from mtpscope.traces.run.step_analysis import round_record, step_records
    from mtpscope.traces.store.writer import TraceWriter

    params = manifest["params"]
    h0 = rounds[0][1].steps[0]
    w = TraceWriter(folder, copy.deepcopy(manifest), n_embd_backbone=int(h0.h.shape[0]),
                    n_embd=solver.n_embd, hidden_dtype=params.get("hidden", "f16"), centroids=False,
                    flush_every=int(params.get("flush_every", 64)), overwrite=True)
    spent = 0.0
    for i in range(0, len(rounds), batch):
        group = rounds[i:i + batch]
        time.sleep(gap_s * len(group))
        for _, res in group:
            _touch(res)      # a round's arrays are fresh in a real run (the worker has just written them)
        c0 = time.thread_time()
        for pid, res in group:
            steps = step_records(res, n_top=int(params.get("n_top", 10)), hidden=params.get("hidden", "f16"),
                                 solver=solver)
            w.add_round(round_record(pid, res), steps)
        spent += time.thread_time() - c0
    time.sleep(pause_s)
    c0 = time.process_time()           # the close's Parquet part is written on the writer's thread
    w.close()
    return spent / len(rounds) * 1e3, (time.process_time() - c0) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gap-ms", type=float, default=50.0, help="gap between replayed rounds (a tiny pair's round)")
    ap.add_argument("--pause-s", type=float, default=None,
                    help="pause before the close (default: the gap; the close's own code last ran a run earlier)")
    args = ap.parse_args()
    import os

    from mtpscope.traces.run.derived import cached_solver

    print(f"bench_idle_memory: load average {os.getloadavg()[0]:.2f}; thread CPU time (CLOCK_THREAD_CPUTIME_ID)")
    print("page touch after idle (us per 4 KiB page above a hot touch; without a host that reclaims idle pages: a cache miss, about 0.1):")
    for gap in GAPS_S:
        print(f"  idle {gap * 1e3:6.0f} ms: {idle_touch_us(gap, args.repeats):7.2f} us")
    rounds, manifest, drafter = recorded_rounds()
    solver = cached_solver(drafter)
    print(f"the recorder's work on {len(rounds)} real rounds of the tiny demo pair (step records with the derived "
          "h_inner, write-ahead log), mean per round, then the trace's close (medians of the repeats):")
    gap = args.gap_ms / 1e3
    pause = gap if args.pause_s is None else args.pause_s
    arms = (("back to back", 0.0, 0.0, 1), (f"{args.gap_ms:.0f} ms between rounds", gap, pause, 1),
            (f"{BATCH} at a time, same gaps", gap, pause, BATCH))
    with tempfile.TemporaryDirectory() as d:
        got: dict[str, list[tuple[float, float]]] = {name: [] for name, *_ in arms}
        for r in range(args.repeats):
            for name, g, p, b in arms:
                got[name].append(replay(rounds, manifest, solver, g, p, Path(d) / f"t{r}-{b}-{g}", batch=b))
    med = {name: (statistics.median(x for x, _ in v), statistics.median(c for _, c in v)) for name, v in got.items()}
    for name, (per, close) in med.items():
        print(f"  {name:24s} {per:6.3f} ms per round; close {close:6.1f} ms")
    (a, ca), (b, cb), (c, _) = med.values()
    n = len(rounds)
    print(f"  idle memory adds {b - a:+.3f} ms per round ({(b / a - 1) * 100 if a else 0:+.0f} %) and "
          f"{cb - ca:+.1f} ms to the close: {(b - a) * n + (cb - ca):+.0f} ms of CPU per {n}-round run; "
          f"{BATCH} rounds at a time: {c - b:+.3f} ms per round")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
