"""Benchmark: speed advice under a disturbed machine (issue 34, "Done when").

The trained demo pair (``<cache>/demo/trained/``: target + F32 drafter) is recorded as a user would
(``record --baseline``, n_draft 3: plain decoding timed first, then the MTP loop, then the recorder's cost
probe) while a CPU-burning load of the benchmark's own runs during a documented share of the recording.
The load is ``--burners`` processes (default: one per CPU) each spinning ``python -c 'while True: pass'``,
started and stopped at the recording's phases (the runtime's ``generate_plain`` / ``run`` / ``probe_costs``
calls are wrapped to say which phase is running). Patterns:

* ``none``: no load;
* ``probe``: a burst during the whole cost probe (the loop and the baseline quiet);
* ``baseline``: a burst during the whole plain-decoding baseline (the loop and the probe quiet);
* ``loop``: bursts during the loop: ``--burst-on`` s on, ``--burst-off`` s off, from the loop's first round
  to its end (the baseline and the probe quiet);
* ``steady``: the load on from the baseline's start to the probe's end.

The printed share is the burner's wall time on over each phase's wall time.

**The truth** for each pattern is a real interleaved sweep of the same prompts (a sweep directory
``mtpscope report`` reads, :mod:`traces.sweep`): plain decoding and n_draft 1..3, ``--shards`` shards (default 6),
every shard's four tasks run one after the other (their order rotated per shard), so a load change hits
every configuration alike -- under the same load as the pattern's loop: quiet for ``none`` / ``probe`` /
``baseline`` (one quiet sweep serves the three), the same on/off bursts for ``loop``, the load on throughout for
``steady``. The tasks run in this process on one loaded runtime, as a sweep's Ray actor runs them (no Ray:
its start-up does not fit a 2-core machine's budget); their cost probes are cut to one repetition (the
sweep's numbers do not use them). The sweep's tokens/s are its cells' (emitted tokens over the rounds'
draft + verify time, :meth:`traces.sweep.reader.Sweep.cells`).

**Checks** per pattern, on ``explain``'s JSON of the recording (:func:`traces.sweep.advice.explain_with_baseline`,
what ``mtpscope explain --json`` prints) and on ``report``'s JSON of its truth sweep
(:func:`traces.sweep.advice.sweep_advice_dict`, ``mtpscope report SWEEP --json``), overall and per prompt
category:

* **right**: a recommendation of X is right when X's measured tokens/s in the sweep is within ``--tol``
  (default 10 %) of the best configuration's (two configurations closer than that are not told apart by a
  sweep of this size); a tie is right when one of the two it names is; "cannot tell" and "too few rounds to
  tell" are never wrong (counted apart); an n_draft the sweep did not run (explain weighs 1..8) is "not in sweep"
  (counted apart, never right);
* **intervals**: every candidate's speedup and tokens/s interval, and the recommendation's, contain their
  point value.

Prints one table row per (pattern, source, group): the advice, its speedups of n_draft 1..3 over plain decoding
(explain: the what-if's estimates; report: the sweep's own), the sweep's best configuration and measured speedups,
the verdict, and whether the intervals hold their estimates; then a summary; the benchmark's own CPU load beside it
(``os.getloadavg``) is printed too: other processes on the machine are a disturbance the advice must survive.
Exit 0 whatever the numbers (reported, never asserted). About 3.5 minutes on a busy 2-core machine with the
defaults (207 s at a load average of 2-4 from other processes).

Usage: ``python -m benchmarks.bench_advice_noise [--prompts 12] [--tokens 32] [--patterns none,probe,baseline,loop,steady]
[--shards 6] [--burners N] [--burst-on 1.5] [--burst-off 1.5] [--tol 0.10] [--out DIR] [--json FILE]``.
Needs the trained demo pair (``mtpscope demo build``) and llama-cpp-python.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from mtpscope.cache import cache_dir

PATTERNS = ("none", "probe", "baseline", "loop", "steady")
#: the load each pattern's truth sweep runs under (the load its loop ran under)
TRUTH_LOAD = {"none": "quiet", "probe": "quiet", "baseline": "quiet", "loop": "bursts", "steady": "steady"}
#: per pattern: what the burner does in each phase of the recording ("off", "on", "bursts")
SCHEDULE = {"none": {}, "probe": {"probe": "on"}, "baseline": {"baseline": "on"}, "loop": {"loop": "bursts"},
            "steady": {"baseline": "on", "loop": "on", "probe": "on"}}
N_DRAFTS = (1, 2, 3)
ADVICE_N_DRAFT = 3
BURN = "while True: pass"


# ------------------------------------------------------------------------------------------ the load

class Burner:
    """``n`` spinning processes of our own, on or off; counts its seconds on."""

    def __init__(self, n: int) -> None:
        self.n = int(n)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.seconds_on = 0.0
        self._since = 0.0
        self._lock = threading.Lock()

    def on(self) -> None:
        with self._lock:
            if self.procs or self.n <= 0:
                return
            self.procs = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(self.n)]
            self._since = time.perf_counter()

    def off(self) -> None:
        with self._lock:
            if not self.procs:
                return
            for p in self.procs:
                p.kill()
            for p in self.procs:
                p.wait()
            self.procs = []
            self.seconds_on += time.perf_counter() - self._since


class Load:
    """The burner driven by a mode: ``off``, ``on`` or ``bursts`` (a thread toggling ``on_s`` on / ``off_s``
    off, starting on)."""

    def __init__(self, burner: Burner, on_s: float, off_s: float) -> None:
        self.burner, self.on_s, self.off_s = burner, on_s, off_s
        self.mode = "off"
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    def set(self, mode: str) -> None:
        if mode == self.mode:
            return
        if self._thread is not None:
            self._stop.set()  # type: ignore[union-attr]  # _stop is set whenever _thread is
            self._thread.join()
            self._thread = self._stop = None
        self.mode = mode
        if mode == "on":
            self.burner.on()
        elif mode == "off":
            self.burner.off()
        else:
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._cycle, args=(self._stop,), daemon=True)
            self._thread.start()

    def _cycle(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.burner.on()
            if stop.wait(self.on_s):
                break
            self.burner.off()
            stop.wait(self.off_s)
        self.burner.off()


class Phases:
    """Wraps the loaded runtime's ``generate_plain`` (the baseline), ``run`` (the loop) and ``probe_costs``
    (the probe) so that each call says which phase runs; the load follows ``schedule`` per phase and the wall
    and burner-on seconds are kept per phase. ``quick_probe``: the probe cut to one repetition (sweep tasks)."""

    def __init__(self, rtm: Any, load: Load) -> None:
        self.rtm, self.load = rtm, load
        self.schedule: Mapping[str, str] = {}
        self.drive = True
        self.quick_probe = False
        self.phase: str | None = None
        self.wall: dict[str, float] = {}
        self.burn: dict[str, float] = {}
        self._t = self._b = 0.0
        gp, run, probe = rtm.generate_plain, rtm.run, rtm.probe_costs

        def generate_plain(*a: Any, **k: Any) -> Any:
            self.enter("baseline")
            return gp(*a, **k)

        def run_(*a: Any, **k: Any) -> Any:
            self.enter("loop")
            return run(*a, **k)

        def probe_costs(*a: Any, **k: Any) -> Any:
            self.enter("probe")
            try:
                if self.quick_probe:
                    k = {**k, "reps": 1, "budget_s": 0.0}
                return probe(*a, **k)
            finally:
                self.enter(None)

        rtm.generate_plain, rtm.run, rtm.probe_costs = generate_plain, run_, probe_costs

    def start(self, schedule: Mapping[str, str], drive: bool = True) -> None:
        """A new recording: the load follows ``schedule`` per phase (``drive``), else it is left as set."""
        self.schedule, self.drive, self.phase, self.wall, self.burn = schedule, drive, None, {}, {}

    def enter(self, phase: str | None) -> None:
        if phase == self.phase:
            return
        now, b = time.perf_counter(), self._burned()
        if self.phase is not None:
            self.wall[self.phase] = self.wall.get(self.phase, 0.0) + now - self._t
            self.burn[self.phase] = self.burn.get(self.phase, 0.0) + b - self._b
        self.phase = phase
        if self.drive:
            self.load.set(self.schedule.get(phase, "off") if phase is not None else "off")
        self._t, self._b = time.perf_counter(), self._burned()

    def _burned(self) -> float:
        br = self.load.burner
        return br.seconds_on + ((time.perf_counter() - br._since) if br.procs else 0.0)

    def shares(self) -> str:
        return ", ".join(f"{p} {self.burn.get(p, 0.0) / w:.0%} of {w:.1f} s" for p, w in self.wall.items() if w > 0)


# ------------------------------------------------------------------------------------------ recording

def prompts(n: int) -> list[Any]:
    """The first ``n`` trained demo prompts taken round-robin over the categories (ids as the prompt)."""
    from mtpscope.demo.trained import read_prompts
    from mtpscope.traces.sweep.spec import SweepPrompt

    by: dict[str, list[dict[str, Any]]] = {}
    for p in read_prompts():
        by.setdefault(p["category"], []).append(p)
    order, i = [], 0
    while len(order) < n and any(i < len(v) for v in by.values()):
        order += [v[i] for v in by.values() if i < len(v)]
        i += 1
    return [SweepPrompt(index=j, text="", category=p["category"], tokens=tuple(int(t) for t in p["ids"]), id=p["name"])
            for j, p in enumerate(order[:n])]


def record_advice(ph: Phases, pattern: str, sps: Sequence[Any], tokens: int, tp: Any, out: Path) -> dict[str, Any]:
    """``record --baseline`` of the prompts at n_draft 3 under ``pattern``; explain's JSON of it."""
    from mtpscope.traces.run.record_config import RecordConfig
    from mtpscope.traces.run.recorder import record
    from mtpscope.traces.store.reader import open_trace
    from mtpscope.traces.sweep.advice import explain_with_baseline

    config = RecordConfig(n_draft=ADVICE_N_DRAFT, max_tokens=tokens, hidden="off", n_threads=1, baseline=True)
    ph.quick_probe = False
    ph.start(SCHEDULE[pattern])
    try:
        record(config, target=tp.target, assistant=tp.drafter, out=out, prompts=[p.prompt_spec() for p in sps],
               overwrite=True, command=["bench_advice_noise", pattern], runtime=ph.rtm)
    finally:
        ph.enter(None)
    d = explain_with_baseline(open_trace(out), with_drift=False).to_dict()   # the advice keys at the top level
    return {"advice": {k: d.get(k) for k in ("recommendation", "break_even", "candidates", "baseline", "timing_quality")},
            "shares": ph.shares()}


def run_truth(ph: Phases, load: str, sps: Sequence[Any], tokens: int, shards: int, tp: Any, out: Path,
              on_s: float, off_s: float) -> dict[str, Any]:
    """The interleaved sweep under ``load`` (``quiet`` / ``bursts`` / ``steady``): its cells' tokens/s per
    (configuration, category) and report's JSON."""
    from mtpscope.traces.run.baseline import record_baseline
    from mtpscope.traces.run.recorder import record
    from mtpscope.traces.sweep.advice import sweep_advice_dict
    from mtpscope.traces.sweep.reader import open_sweep
    from mtpscope.traces.sweep.runner import _task_payload, trace_counts
    from mtpscope.traces.sweep.spec import SweepSpec, new_state, now, task_states, write_state

    spec = SweepSpec(target=os.fspath(tp.target), assistants=(("trained", os.fspath(tp.drafter)),), prompts=tuple(sps),
                     n_drafts=N_DRAFTS, n_shards=shards, baseline=True, max_tokens=tokens, hidden="off").check()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    command = ["bench_advice_noise", "truth", load]
    state = new_state(spec, command=command)
    states = {ts.task: ts for ts in task_states(state)}
    per_shard: dict[int, list[Any]] = {}
    for t in spec.tasks():
        per_shard.setdefault(t.shard, []).append(t)
    order = []
    for s, ts in sorted(per_shard.items()):
        k = s % len(ts)
        order += ts[k:] + ts[:k]
    ph.quick_probe = True
    ph.start({}, drive=False)
    ph.load.set({"quiet": "off", "bursts": "bursts", "steady": "on"}[load])
    t0 = time.perf_counter()
    try:
        for t in order:
            pay = _task_payload(spec, t, out, command)
            config = replace(pay["config"], n_threads=1)
            t1 = time.perf_counter()
            started = now()
            if pay["baseline"]:
                record_baseline(config, rtm=ph.rtm, out=pay["out"], prompts=pay["prompts"], overwrite=True, command=command)
            else:
                record(config, target=pay["target"], assistant=pay["assistant_path"], out=pay["out"],
                       prompts=pay["prompts"], overwrite=True, command=command, runtime=ph.rtm, preflight=False)
            states[t.task_id] = states[t.task_id].with_(state="done", attempts=1, worker="bench", started=started,
                                                        finished=now(), seconds=time.perf_counter() - t1,
                                                        load_seconds=0.0, **trace_counts(pay["out"]))
    finally:
        ph.load.set("off")
        ph.quick_probe = False
    secs = time.perf_counter() - t0
    state["tasks"] = [states[t.task_id].to_dict() for t in spec.tasks()]
    state["complete"] = True
    write_state(out, state)
    sw = open_sweep(out)
    cells = sw.cells()
    tps: dict[str, dict[str, float]] = {}
    for _, r in cells.iterrows():
        key = "plain" if r["assistant"] == "baseline" else str(int(r["n_draft"]))
        tps.setdefault(str(r["category"]), {})[key] = float(r["tokens_per_s"])
    return {"tokens_per_s": tps, "report": sweep_advice_dict(sw), "seconds": secs}


# ------------------------------------------------------------------------------------------ checks

def _key(choice: Any) -> str:
    return "plain" if choice == "plain" else str(choice)


def verdict(rec: Mapping[str, Any], truth: Mapping[str, float], tol: float) -> tuple[str, str]:
    """``(what the advice said, right | wrong | cannot tell)`` of one recommendation dict against the sweep's
    tokens/s of that group (rule of the module docstring)."""
    if not truth:
        return "-", "no truth"
    if rec.get("choice") is not None and _key(rec["choice"]) not in truth:
        return f"n_draft {rec['choice']}", "not in sweep"
    best = max(truth.values())
    good = {k for k, v in truth.items() if v >= (1 - tol) * best}
    ch = rec.get("choice")
    if ch is None:
        return ("cannot tell" if rec.get("cannot_tell") else "too few rounds"), "cannot tell"
    named = {_key(ch)}
    said = f"{'plain' if ch == 'plain' else f'n_draft {ch}'}"
    sp = (rec.get("speedup") or {})
    if sp.get("value") is not None and ch != "plain":
        iv = sp.get("interval")
        said += f" {sp['value']:.2f}×" + (f" [{iv[0]:.2f}, {iv[1]:.2f}]" if iv else "")
    if rec.get("tie") and rec.get("runner_up") is not None:
        named.add(_key(rec["runner_up"]))
        said += f" (tie with {'plain' if rec['runner_up'] == 'plain' else 'n_draft ' + str(rec['runner_up'])})"
    return said, ("right" if named & good else "wrong")


def intervals_hold(adv: Mapping[str, Any]) -> tuple[bool, list[str]]:
    """Every candidate's speedup and tokens/s interval (all and per category) and every recommendation's
    interval contains its point value; the failures named."""
    bad = []

    def check(what: str, v: Any, iv: Any) -> None:
        if v is None or iv is None:
            return
        if not (iv[0] - 1e-9 <= v <= iv[1] + 1e-9):
            bad.append(f"{what} {v:.4g} outside [{iv[0]:.4g}, {iv[1]:.4g}]")

    cands = adv.get("candidates") or {}
    groups = {"all": cands.get("all") or [], **(cands.get("by_category") or {})}
    for g, cs in groups.items():
        for c in cs:
            check(f"{g} {c['choice']} speedup", c.get("speedup"), c.get("speedup_interval"))
            check(f"{g} {c['choice']} tokens/s", c.get("tokens_per_s"), c.get("tokens_per_s_interval"))
    rec = adv.get("recommendation") or {}
    for g, r in {"all": rec, **(rec.get("by_category") or {})}.items():
        sp = r.get("speedup") or {}
        check(f"{g} recommendation", sp.get("value"), sp.get("interval"))
    return not bad, bad


def rows_for(pattern: str, source: str, adv: Mapping[str, Any], truth: Mapping[str, Mapping[str, float]],
             tol: float) -> list[dict[str, Any]]:
    rec = adv.get("recommendation") or {}
    ok, bad = intervals_hold(adv)
    out = []
    for g, r in {"all": rec, **(rec.get("by_category") or {})}.items():
        tr = truth.get(g, {})
        said, v = verdict(r, tr, tol)
        best = max(tr, key=tr.get) if tr else "-"
        meas = " ".join(f"{k}:{tr[k] / tr['plain']:.2f}" for k in ("1", "2", "3") if k in tr and tr.get("plain"))
        cs = (adv.get("candidates") or {}).get("all") if g == "all" else ((adv.get("candidates") or {})
                                                                       .get("by_category") or {}).get(g)
        est = " ".join(f"{c['choice']}:{c['speedup']:.2f}" for c in cs or []
                       if str(c["choice"]) in ("1", "2", "3") and c.get("speedup") is not None)
        out.append({"pattern": pattern, "source": source, "group": g, "said": said, "verdict": v,
                    "truth_best": best, "truth": meas, "estimate": est, "intervals_ok": ok, "interval_failures": bad if g == "all" else []})
    return out


# ------------------------------------------------------------------------------------------ main

def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--patterns", default=",".join(PATTERNS))
    ap.add_argument("--shards", type=int, default=6)
    ap.add_argument("--burners", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--burst-on", type=float, default=1.5)
    ap.add_argument("--burst-off", type=float, default=1.5)
    ap.add_argument("--tol", type=float, default=0.10)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    pats = [p.strip() for p in a.patterns.split(",") if p.strip()]
    unknown = [p for p in pats if p not in PATTERNS]
    if unknown:
        ap.error(f"unknown pattern(s) {unknown}; choose from {PATTERNS}")

    from mtpscope.demo.spec import TrainedPaths
    from mtpscope.traces.run.mtp_runtime import MtpRuntime

    tp = TrainedPaths.under(cache_dir() / "demo")
    if not tp.target.exists() or not tp.drafter.exists():
        print(f"no trained demo pair under {tp.root} (run `mtpscope demo build`)")
        return 0
    out = a.out or cache_dir() / "bench-advice-noise"
    out.mkdir(parents=True, exist_ok=True)
    sps = prompts(a.prompts)
    shards = max(1, min(a.shards, len(sps)))
    print(f"trained demo pair: {len(sps)} prompts x {a.tokens} tokens, advice at n_draft {ADVICE_N_DRAFT} "
          f"(record --baseline), truth: interleaved sweeps of plain + n_draft {N_DRAFTS} in {shards} shards; "
          f"{a.burners} burner(s), bursts {a.burst_on:g} s on / {a.burst_off:g} s off; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    t_all = time.perf_counter()
    burner = Burner(a.burners)
    load = Load(burner, a.burst_on, a.burst_off)
    rtm = MtpRuntime(tp.target, tp.drafter, n_ctx=1024, capture=False, n_threads=1)
    ph = Phases(rtm, load)
    rows: list[dict[str, Any]] = []
    truths: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    try:
        for pat in sorted(pats, key=lambda p: (list(TRUTH_LOAD.values()).index(TRUTH_LOAD[p]), PATTERNS.index(p))):
            tl = TRUTH_LOAD[pat]
            if tl not in truths:
                la = os.getloadavg()[0]
                truths[tl] = run_truth(ph, tl, sps, a.tokens, shards, tp, out / f"truth-{tl}", a.burst_on, a.burst_off)
                tr = truths[tl]
                rows += rows_for(f"({tl} sweep)", "report", tr["report"], tr["tokens_per_s"], a.tol)
                lw = tr["report"].get("load_warnings") or []
                notes.append(f"truth {tl}: {tr['seconds']:.0f} s, load average {la:.1f} -> {os.getloadavg()[0]:.1f}; "
                             f"sweep load_warnings: {len(lw)}" + (f" ({lw[0]['words']})" if lw else ""))
            la = os.getloadavg()[0]
            t0 = time.perf_counter()
            res = record_advice(ph, pat, sps, a.tokens, tp, out / f"advice-{pat}")
            tq = res["advice"].get("timing_quality") or {}
            notes.append(f"{pat}: recorded in {time.perf_counter() - t0:.0f} s, load average {la:.1f} -> "
                         f"{os.getloadavg()[0]:.1f}; burner on: {res['shares']}; timing_quality: "
                         f"{'DISTURBED' if tq.get('disturbed') else 'consistent'}"
                         + (" (" + "; ".join(e["kind"] + " " + e["subject"] for e in tq.get("evidence", [])
                                             if e.get("disturbing")) + ")" if tq.get("disturbed") else ""))
            rows += rows_for(pat, "explain", res["advice"], truths[tl]["tokens_per_s"], a.tol)
    finally:
        load.set("off")
        rtm.close()
    print()
    for n in notes:
        print(n)
    print()
    hdr = (f"{'pattern':<15} {'source':<7} {'group':<7} {'advice':<44} {'its speedups':<20} {'best':<5} "
           f"{'sweep speedups':<20} {'verdict':<12} intervals")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['pattern']:<15} {r['source']:<7} {r['group']:<7} {r['said'][:44]:<44} {r['estimate']:<20} "
              f"{r['truth_best']:<5} {r['truth']:<20} {r['verdict']:<12} {'ok' if r['intervals_ok'] else 'FAIL'}")
        for b in r["interval_failures"]:
            print(f"    interval: {b}")
    wrong = [r for r in rows if r["verdict"] == "wrong"]
    bad_iv = {(r["pattern"], r["source"]) for r in rows if not r["intervals_ok"]}
    print(f"\n{len(rows)} recommendations: {sum(r['verdict'] == 'right' for r in rows)} right, {len(wrong)} wrong, "
          f"{sum(r['verdict'] == 'cannot tell' for r in rows)} cannot tell / too few rounds, "
          f"{sum(r['verdict'] == 'not in sweep' for r in rows)} not in the sweep; intervals holding their "
          f"estimate: {'all' if not bad_iv else 'NOT in ' + ', '.join(map(str, sorted(bad_iv)))}; "
          f"total {time.perf_counter() - t_all:.0f} s")
    if a.json is not None:
        a.json.write_text(json.dumps({"rows": rows, "notes": notes, "truth": {k: v["tokens_per_s"] for k, v in truths.items()}},
                                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
