"""Benchmark: the n_draft what-if against re-recordings (goal: |delta acceptance rate| <= 0.03 and tokens/s
within 10 % at every n_draft, per category and overall).

Pair: the demo's trained pair (``mtpscope demo build``: ``trained/target.gguf`` + the F32 ``drafter.gguf``)
and its 36 categorised prompts (token ids), or any pair given with ``--target`` / ``--assistant`` /
``--prompts``. Recording: one sweep (``mtpscope sweep ... --baseline``, real llama.cpp on local Ray, one
worker, one thread, greedy, ``--shards`` 6: the cells run interleaved shard by shard) at n_draft 1..6 plus
plain decoding; an existing complete sweep in ``--out``
is reused (``--resume`` finishes a partial one). Baseline: each real recording of the sweep. Measured:
:func:`traces.analysis.what_if.what_if` of the ``--from`` cell (n_draft 3 by default; its categories from the
manifest; plain decoding from the sweep's baseline task, :func:`traces.sweep.advice.trace_baseline`),
predicting every other n_draft. Prints per n_draft and category the predicted (with its 95 % interval)
and measured acceptance rate, mean acceptance length and tokens/s with their errors, and the tokens/s the
predicted counts give with each recording's *own* measured costs (on a shared machine the draft-step and
verify costs move between recordings; this column checks the position model apart from that), then the
worst errors and whether the goals are met; exits 0 whatever the numbers.

A pair of your own, kept out of the repository: ``mtpscope demo train --out DIR --seed 11 --target-steps 300
--drafter-steps 300`` (about an hour of CPU), then ``--pair DIR`` converts its compact checkpoints into
``DIR/target.gguf`` / ``DIR/drafter.gguf`` (our converter, as ``demo build`` does) and uses its prompts.

Usage: ``python -m benchmarks.bench_what_if [--out DIR] [--n-draft 1,2,3,4,5,6] [--from 3] [--max-tokens 64]
[--target T --assistant A --prompts P.jsonl | --pair DIR]``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from mtpscope.cache import cache_dir, demo_dir

GOAL_ACC = 0.03
GOAL_TPS = 0.10


def demo_prompts(path: Path) -> Path:
    """The demo's categorised prompts as a prompts file (token ids, id, category)."""
    from mtpscope.demo.trained import read_prompts

    seen: set[str] = set()
    with open(path, "w", encoding="utf-8") as fh:
        for i, p in enumerate(read_prompts()):
            pid = p["name"] if p["name"] not in seen else f"{p['name']}#{i}"
            seen.add(pid)
            fh.write(json.dumps({"tokens": p["ids"], "id": pid, "category": p["category"]}) + "\n")
    return path


def build_pair(root: Path) -> tuple[str, str, str]:
    """GGUFs and a prompts file from compact checkpoints written by ``mtpscope demo train --out root``."""
    from mtpscope.demo.trained import expand
    from mtpscope.inspector.convert import convert

    target, drafter = root / "target.gguf", root / "drafter.gguf"
    if not (target.exists() and drafter.exists()):
        t, d = expand(root / "hf", root)
        convert(t, target, outtype="f16")
        convert(d, drafter, dialect="upstream", outtype="f32")
    prompts = root / "prompts.jsonl"
    if not prompts.exists():
        from mtpscope.demo.trained import read_prompts

        seen: set[str] = set()
        with open(prompts, "w", encoding="utf-8") as fh:
            for i, p in enumerate(read_prompts(root)):
                pid = p["name"] if p["name"] not in seen else f"{p['name']}#{i}"
                seen.add(pid)
                fh.write(json.dumps({"tokens": p["ids"], "id": pid, "category": p["category"]}) + "\n")
    return str(target), str(drafter), str(prompts)


def record(args: argparse.Namespace, out: Path) -> None:
    from mtpscope.traces.sweep.runner import run_sweep
    from mtpscope.traces.sweep.spec import SWEEP_FILE, SweepSpec, file_sha256, is_sweep, read_prompt_set, read_state

    if is_sweep(out) and read_state(out).get("complete"):
        print(f"reusing the complete sweep {out}")
        return
    if is_sweep(out):
        spec = SweepSpec.from_state(read_state(out), out / SWEEP_FILE)
        resume = True
    else:
        prompts = Path(args.prompts) if args.prompts else demo_prompts(out.parent / f"{out.name}-prompts.jsonl")
        spec = SweepSpec(target=str(Path(args.target).resolve()), assistants=(("a", str(Path(args.assistant).resolve())),),
                         prompts=read_prompt_set(prompts), n_drafts=tuple(args.n_draft), n_shards=args.shards, baseline=True,
                         max_tokens=args.max_tokens, hidden="off", prompts_file=str(prompts),
                         prompts_sha256=file_sha256(prompts))
        resume = False
    t0 = time.perf_counter()
    res = run_sweep(spec, out, ray_address="local", workers=1, threads_per_worker=1, resume=resume,
                    command=["bench_what_if"])
    print(f"recorded {res.n_done} of {res.n_tasks} tasks in {time.perf_counter() - t0:.0f} s -> {out}")


_EMITTED: dict[tuple[int, str], float] = {}


def _emitted(sw, name: str, n: int, cat: str) -> float:
    """Emitted tokens of a recording (one category, or all): the same at every n_draft (greedy)."""
    if (n, cat) not in _EMITTED:
        q = ("SELECT p.category, sum(len(r.emitted)) AS ne FROM rounds r JOIN prompts p ON p.shard = r.shard AND "
             f"p.prompt_id = r.prompt_id WHERE r.assistant = '{name}' AND r.n_draft = {int(n)} GROUP BY ALL")
        df = sw.sql(q)
        for c, ne in zip(df["category"], df["ne"], strict=True):
            _EMITTED[(n, str(c))] = float(ne)
        _EMITTED[(n, "all")] = float(df["ne"].sum())
    return _EMITTED[(n, cat)]


def _err(p: float | None, m: float | None, rel: bool = False) -> float:
    if p is None or m is None or (isinstance(m, float) and math.isnan(m)):
        return math.nan
    return (p / m - 1.0) if rel else (p - m)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None, help="sweep directory (default <cache>/bench/what-if-demo)")
    ap.add_argument("--n-draft", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3, 4, 5, 6])
    ap.add_argument("--from", dest="k", type=int, default=3, help="the n_draft the estimate is fitted on")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--shards", type=int, default=6, help="shards of the sweep (its cells run interleaved shard by "
                    "shard, so a drift of the machine's speed hits every n_draft alike)")
    ap.add_argument("--target", default=None)
    ap.add_argument("--assistant", default=None)
    ap.add_argument("--prompts", default=None)
    ap.add_argument("--pair", type=Path, default=None, help="compact checkpoints of `mtpscope demo train --out DIR`")
    args = ap.parse_args()
    if args.pair is not None:
        args.target, args.assistant, args.prompts = build_pair(args.pair)
    if args.target is None or args.assistant is None:
        from mtpscope.demo.build import build_demo
        from mtpscope.demo.spec import TrainedPaths

        build_demo()
        tp = TrainedPaths.under(demo_dir())
        args.target, args.assistant = args.target or str(tp.target), args.assistant or str(tp.drafter)
    out = args.out or cache_dir() / "bench" / "what-if-demo"
    out.parent.mkdir(parents=True, exist_ok=True)
    record(args, out)

    from mtpscope.traces.analysis.breakdown import prompt_categories
    from mtpscope.traces.analysis.costs import CostProbe
    from mtpscope.traces.analysis.what_if import what_if
    from mtpscope.traces.sweep.advice import trace_baseline
    from mtpscope.traces.sweep.reader import open_sweep

    sw = open_sweep(out)
    name = sw.spec.assistants[0][0]
    cell = sw.cell(name, args.k)
    base, note = trace_baseline(cell)
    if note:
        print(f"note: {note}")
    rounds = cell.columns("rounds", ["prompt_id", "round", "n_draft", "n_accepted", "emitted", "t_draft_ms",
                                     "t_verify_ms"])
    cats = prompt_categories(cell.manifest)
    t0 = time.perf_counter()
    probe = CostProbe.from_manifest(cell.manifest)
    est = what_if(rounds, categories=cats, baseline=base, max_tokens=sw.spec.max_tokens, n_max=max(args.n_draft),
                  probe=probe)
    print(f"what-if fitted on n_draft {args.k} ({len(rounds)} rounds, {len(cats or {})} prompts) in "
          f"{time.perf_counter() - t0:.2f} s; plain decoding: {base.how if base else 'estimated'}")
    cells = sw.cells()
    meas = {(int(r["n_draft"]), str(r["category"])): r for r in cells[cells["assistant"] == name].to_dict("records")}
    # each recording's own costs (the machine's load changes between recordings): the model's counts
    # priced with them separate the position model from the drift of the costs
    from mtpscope.traces.analysis.costs import verify_line
    from mtpscope.traces.analysis.metrics import timing

    own: dict[int, tuple[float, dict[int, float], tuple[float, float]]] = {}
    for n in args.n_draft:
        t = timing(sw.cell(name, n).columns("rounds", ["n_draft", "n_accepted", "emitted", "t_draft_ms",
                                                        "t_verify_ms"]))
        tv = {int(k): v for k, v in t["t_verify_ms_mean_by_size"].items()}
        own[n] = (t["t_step_ms_mean"], tv, verify_line(list(map(float, tv)), list(tv.values()), [1.0] * len(tv))[:2])

    def own_tps(n: int, row, cat: str) -> float:
        t_step, tv, (v0, v1) = own[n]
        t = t_step * row.n_drafted + sum(c * tv.get(L + 1, v0 + v1 * (L + 1)) for L, c in enumerate(row.rounds_by_size))
        return 1000.0 * _emitted(sw, name, n, cat) / t
    groups = [("all", est)] + sorted(est.by_category.items())
    print(f"\n{'n_draft':>7} {'category':<10} {'acceptance rate (pred [95 %] / meas / |d|)':>45} "
          f"{'mean acc. length':>22} {'tokens/s':>26} {'own costs':>16}")
    print(f"{'':>7} {'':<10} {'pred':>8} {'95 %':>15} {'meas':>8} {'|d|':>7} {'pred':>7} {'meas':>7} {'|d|':>6} "
          f"{'pred':>8} {'meas':>8} {'err':>7} {'pred':>8} {'err':>7}")
    worst_acc = worst_tps = 0.0
    worst_acc_all = worst_tps_all = 0.0
    covered = [0, 0]
    within_se = [0, 0]      # |d| within 2 binomial standard errors of the measured rate, per category
    worst_own = worst_own_all = 0.0
    for n in args.n_draft:
        for cat, w in groups:
            m = meas.get((n, cat))
            if m is None:
                continue
            r = w.row(n)
            da = _err(r.acceptance_rate, m["acceptance_rate"])
            dm = _err(r.mean_acceptance_length, m["mean_acceptance_length"])
            dt = _err(r.tokens_per_s, m["tokens_per_s"], rel=True)
            po = own_tps(n, r, cat)
            do = _err(po, m["tokens_per_s"], rel=True)
            mark = " (fit)" if n == args.k else ""
            iv = r.acceptance_rate_interval
            ivs = f"[{iv[0]:.3f}, {iv[1]:.3f}]" if iv else "-"
            inside = iv is not None and iv[0] <= m["acceptance_rate"] <= iv[1]
            covered[0] += inside and n != args.k
            covered[1] += iv is not None and n != args.k
            if cat != "all" and n != args.k and m["n_drafted"]:
                se = math.sqrt(max(m["acceptance_rate"] * (1 - m["acceptance_rate"]), 1e-12) / m["n_drafted"])
                within_se[0] += abs(da) <= 2 * se
                within_se[1] += 1
            print(f"{n:>7} {cat:<10} {r.acceptance_rate:8.4f} {ivs:>15} {m['acceptance_rate']:8.4f} {abs(da):7.4f} "
                  f"{r.mean_acceptance_length:7.3f} {m['mean_acceptance_length']:7.3f} {abs(dm):6.3f} "
                  f"{(r.tokens_per_s or math.nan):8.2f} {m['tokens_per_s']:8.2f} {dt:+7.1%} {po:8.2f} {do:+7.1%}{mark}")
            if n != args.k and math.isfinite(da):
                worst_acc = max(worst_acc, abs(da))
                worst_tps = max(worst_tps, abs(dt)) if math.isfinite(dt) else worst_tps
                worst_own = max(worst_own, abs(do))
                if cat == "all":
                    worst_acc_all = max(worst_acc_all, abs(da))
                    worst_tps_all = max(worst_tps_all, abs(dt)) if math.isfinite(dt) else worst_tps_all
                    worst_own_all = max(worst_own_all, abs(do))
        print()
    print(f"worst |delta acceptance rate| at another n_draft: all prompts {worst_acc_all:.4f}, any category "
          f"{worst_acc:.4f} (goal <= {GOAL_ACC}: {'met' if worst_acc_all <= GOAL_ACC else 'NOT met'} overall, "
          f"{'met' if worst_acc <= GOAL_ACC else 'NOT met'} per category)")
    print(f"measured acceptance rate inside the predicted 95 % interval: {covered[0]} of {covered[1]} (n_draft, "
          "category) pairs at other n_draft")
    print("per category |delta| within 2 standard errors of the measured rate (sqrt(r (1 - r) / drafted): how much the "
          f"rate of a few hundred drafted positions moves with which positions a run drafts): {within_se[0]} of "
          f"{within_se[1]}")
    print(f"worst tokens/s error at another n_draft: all prompts {worst_tps_all:.1%}, any category {worst_tps:.1%} "
          f"(goal <= {GOAL_TPS:.0%}: {'met' if worst_tps_all <= GOAL_TPS else 'NOT met'} overall, "
          f"{'met' if worst_tps <= GOAL_TPS else 'NOT met'} per category)")
    print(f"the same priced with each recording's own measured costs (the position model alone): all prompts "
          f"{worst_own_all:.1%}, any category {worst_own:.1%}")
    costs = ", ".join(f"n_draft {n}: {own[n][0]:.1f}" for n in args.n_draft)
    print(f"each recording's own draft-step cost (ms; the machine's load moves it): {costs}")
    c = est.cost
    if c is not None:
        print("the what-if's round costs (ms; draft + verify) against each recording's own at its n_draft:")
        for n in args.n_draft:
            t_step, tv, _ = own[n]
            rec = sw.cell(name, n).columns("rounds", ["n_draft", "t_draft_ms", "t_verify_ms"])
            full = rec[rec["n_draft"] == n]
            print(f"  n_draft {n}: draft {c.t_draft(n):6.2f} vs {full['t_draft_ms'].mean():6.2f}   verify "
                  f"{c.t_verify(n + 1):6.2f} vs {full['t_verify_ms'].mean():6.2f}")
        print(f"  probe: {'none' if probe is None else f'{probe.reps} repetitions over the shards'}; {c.basis}")


if __name__ == "__main__":
    main()
