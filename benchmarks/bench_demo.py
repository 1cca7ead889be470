"""Realism of the trained demo pair (mtpscope/demo_data): printed, not a timed test.

For each categorised demo prompt: the target's greedy continuation (64 tokens, stopping at an
end-of-generation token as the recorder does), its distinct-4-gram ratio, and greedy MTP with
n_draft = 3 simulated in torch exactly as llama.cpp's loop runs (one teacher-forced target pass, the
drafter chained on its own drafts at the pending position; mtpscope.demo.train.evaluation.simulate_mtp).
Then per category: pooled acceptance rate, per-position acceptance p1..p3, the minimum distinct-4-gram ratio; and
the issue's checks (distinct-4 >= 0.6 everywhere, highest - lowest category acceptance >= 0.25, the
random category lowest, p1 > p2 > p3).

    .venv/bin/python -m benchmarks.bench_demo [--src DIR] [--centroid] [--text] [--json] [--demo DIR]

Then, when the demo is built (``mtpscope demo build``; ``--demo``, default ``<cache>/demo``), the same
per-category figures from the traces the real llama.cpp recorded for each drafter variant (F32, Q8_0,
buggy): acceptance rate and p1..p3 per category, and the distinct-4-gram ratio of every prompt's
generated tokens.

Needs the parity extra (torch + transformers); ``--text`` also llama-cpp-python (to decode tokens).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from mtpscope.demo.train import checkpoints, evaluation, tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=str(checkpoints.DATA_DIR), help="folder with the compact checkpoints")
    ap.add_argument("--centroid", action="store_true", help="draft with the centroid head instead of the dense one")
    ap.add_argument("--text", action="store_true", help="print each prompt's generated text (needs llama-cpp-python)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", action="store_true", help="print the full result as JSON")
    ap.add_argument("--demo", default=None, help="built demo folder (default <cache>/demo)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    pair = checkpoints.load_compact(a.src)
    rec = pair.recipe
    ev = evaluation.evaluate(pair.target, pair.drafter, pair.prompts, pair.vocab, rec["eog_ids"],
                     n_draft=rec["recipe"]["n_draft"], max_tokens=a.max_tokens,
                     sliding_window=rec["recipe"]["target"]["sliding_window"],
                     head=pair.head() if a.centroid else None)
    wall = time.perf_counter() - t0
    if a.json:
        print(json.dumps(ev, indent=1))
        return 0
    tok = None
    if a.text:
        tok = tokens.open_tokenizer()
    print(f"demo pair {a.src}: head {'centroid' if a.centroid else 'dense'}, {len(pair.prompts)} prompts, "
          f"{wall:.1f} s")
    print(f"{'id':>3} {'category':8} {'accept':>6} {'d4':>5} {'n':>3}  p1/p2/p3")
    for p in ev["prompts"]:
        pk = "/".join(f"{v:.2f}" for v in p["p_k"])
        line = f"{p['prompt_id']:>3} {p['category']:8} {p['acceptance_rate']:6.3f} {p['distinct4']:5.2f} " \
               f"{p['n_generated']:>3}  {pk}"
        if tok is not None:
            line += "  " + repr(tok.detokenize([t for t in p["generated"] if t >= 0]))[:100]
        print(line)
    print()
    print(f"{'category':8} {'accept':>6} {'d4 min':>6}  p1/p2/p3   rounds")
    for c, v in sorted(ev["categories"].items(), key=lambda kv: -kv[1]["acceptance_rate"]):
        pk = "/".join(f"{x:.2f}" for x in v["p_k"])
        print(f"{c:8} {v['acceptance_rate']:6.3f} {v['distinct4_min']:6.2f}  {pk}  {v['n_rounds']}")
    ov = ev["overall"]
    print(f"{'overall':8} {ov['acceptance_rate']:6.3f} {ov['distinct4_min']:6.2f}  "
          + "/".join(f"{x:.2f}" for x in ov["p_k"]))
    print(f"spread (highest - lowest category) {ev['spread']:.3f}")
    checks = evaluation.realism_checks(ev)
    for k, v in checks.items():
        print(f"  {'ok ' if v else 'FAIL'} {k}")
    tr = rec.get("target_training", {}), rec.get("drafter_training", {})
    print(f"training: target {tr[0].get('wall_s')} s, drafter {tr[1].get('wall_s')} s, total {rec.get('train_wall_s')} s; "
          f"centroid coverage {rec.get('centroid_head', {}).get('coverage')}")
    if tok is not None:
        tok.close()
    print(f"prompt selection: {rec.get('prompt_selection')}")
    recorded(a.demo)
    return 0 if all(checks.values()) else 1


def recorded(demo: str | None) -> None:
    """The realism figures of the traces llama.cpp recorded in the built demo (if it is built)."""
    from mtpscope.cache import demo_dir
    from mtpscope.demo.spec import TrainedPaths
    from mtpscope.traces.analysis import metrics
    from mtpscope.traces.store.layout import MANIFEST
    from mtpscope.traces.store.reader import open_trace

    tp = TrainedPaths.under(Path(demo) if demo else demo_dir())
    print()
    for name, d in tp.traces.items():
        if not (d / MANIFEST).exists():
            print(f"llama.cpp trace {name}: not built ({d})")
            continue
        tr = open_trace(d)
        r = tr.columns("rounds", ["prompt_id", "round", "n_draft", "n_accepted", "pending_token", "emitted"])
        cat = {int(p["prompt_id"]): p.get("category") for p in tr.manifest["prompts"]}
        r["category"] = [cat[int(p)] for p in r["prompt_id"]]
        d4 = {}
        for pid, g in r.sort_values(["prompt_id", "round"]).groupby("prompt_id"):
            toks = [int(g["pending_token"].iloc[0])] + [int(x) for e in g["emitted"] for x in e]
            d4[int(pid)] = evaluation.distinct_4gram_ratio(toks)
        print(f"llama.cpp trace {name} ({d}): acceptance rate {metrics.acceptance_rate(r):.3f}")
        print(f"  {'category':8} {'accept':>6} {'d4 min':>6}  p1/p2/p3")
        rows = []
        for c, g in r.groupby("category"):
            pk = metrics.per_position_acceptance(g)["acceptance"].tolist()
            rows.append((metrics.acceptance_rate(g), c, pk, min(d4[int(p)] for p in g["prompt_id"].unique())))
        for acc, c, pk, m in sorted(rows, reverse=True):
            print(f"  {c:8} {acc:6.3f} {m:6.2f}  " + "/".join(f"{x:.2f}" for x in pk))
        pk = metrics.per_position_acceptance(r)["acceptance"].tolist()
        print(f"  spread {rows and max(x[0] for x in rows) - min(x[0] for x in rows):.3f}, overall p1/p2/p3 "
              + "/".join(f"{x:.2f}" for x in pk) + f", distinct4 min {min(d4.values()):.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
