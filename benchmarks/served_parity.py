"""Served parity (issue 33's "Done when" table): does mtpscope's recording of a request equal what llama-server did?

For the trained demo's 36 prompts given (a) as text, (b) as chat messages, (c) as token ids, greedy and at
T = 0.8 with a seed, against the built llama-server started with ``--parallel 1`` (one client) and ``--parallel
4`` (4 concurrent clients): per request, the server's ``timings.draft_n`` / ``draft_n_accepted`` and output
tokens against mtpscope's recording of the same request through the replay path
(:func:`mtpscope.traces.server.replay.replay_probe` with ``prompt_form="given"``: the recorder gets each prompt
in the form the file gave it, as ``mtpscope record`` would). Prints one line per cell: requests equal /
differing, and the reasons of those that differ (:data:`mtpscope.traces.server.replay.REASONS`); ``--json``
writes the cells as JSON too.

    python -m benchmarks.served_parity [--n-predict 64] [--out DIR] [--json FILE] [--parallel 1,4] \\
        [--temps 0,0.8] [--forms text,messages,ids] [--seed 42] [--threads 1]

``--sentinel 1,2,4`` measures the concurrency sentinel instead: for each N a server with ``--parallel N`` and
``probe --check-concurrency N`` over the 36 prompts as token ids (greedy).

Not a speed benchmark: no timing is printed. It needs the demo (``make demo``) and the built server
(``mtpscope server build``); it runs 12 probes and 12 recordings of 36 prompts (minutes).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMS = ("text", "messages", "ids")


@dataclass(frozen=True)
class Cell:
    """One cell of the table: prompt form, temperature, server slots and clients, and what the replay found."""

    form: str
    temperature: float
    parallel: int
    clients: int
    n_requests: int
    n_equal: int
    n_differ: int
    reasons: dict[str, int]
    first: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def prompts_file(path: Path, form: str) -> Path:
    """The demo prompts in one form: ``text`` (the prompt's text), ``messages`` (the text as one user turn),
    ``ids`` (its token ids)."""
    from mtpscope.demo.trained import read_prompts

    lines = []
    for i, p in enumerate(read_prompts()):
        src: dict[str, Any] = ({"text": p["text"]} if form == "text" else
                               {"messages": [{"role": "user", "content": p["text"]}]} if form == "messages" else
                               {"tokens": list(p["ids"])})
        lines.append(json.dumps({"id": f"{i}:{p['name']}", "category": p["category"], **src}))
    path.write_text("\n".join(lines) + "\n")
    return path


def run(args: argparse.Namespace) -> list[Cell]:
    from mtpscope.cache import demo_dir
    from mtpscope.demo.spec import TrainedPaths
    from mtpscope.traces.server.launch import launch
    from mtpscope.traces.server.probe import ProbeSettings, probe
    from mtpscope.traces.server.replay import replay_probe

    tp = TrainedPaths.under(Path(demo_dir()))
    if not (tp.target.is_file() and tp.drafter.is_file()):
        sys.exit("served_parity: the trained demo pair is not built (make demo)")
    out = Path(args.out or tempfile.mkdtemp(prefix="served-parity-"))
    out.mkdir(parents=True, exist_ok=True)
    threads = ["--threads", str(args.threads), "--threads-batch", str(args.threads),
               "--spec-draft-threads", str(args.threads), "--spec-draft-threads-batch", str(args.threads)]
    cells: list[Cell] = []
    for par in args.parallel:
        clients = 1 if par == 1 else par
        with launch(tp.target, tp.drafter, n_draft=args.n_draft, parallel=par, log=out / f"server-np{par}.log",
                    extra=threads) as srv:
            for form in args.forms:
                pf = prompts_file(out / f"prompts-{form}.jsonl", form)
                for temp in args.temps:
                    name = f"np{par}-{form}-t{temp:g}"
                    t0 = time.perf_counter()
                    probe(srv.url, prompts_file=pf, out=out / name, overwrite=True,
                          settings=ProbeSettings(n_predict=args.n_predict, temperature=temp, seed=args.seed,
                                                 concurrency=clients))
                    res = replay_probe(out / name, assistant=tp.drafter, target=tp.target, n_draft=args.n_draft,
                                       prompt_form="given")
                    reasons: dict[str, int] = {}
                    for v in res.verdicts:
                        reasons[v.reason] = reasons.get(v.reason, 0) + 1
                    n = len(res.table)
                    cell = Cell(form, temp, par, clients, n, n - len(res.verdicts), len(res.verdicts), reasons,
                                res.verdict)
                    cells.append(cell)
                    print(f"{name}: {cell.n_equal} equal, {cell.n_differ} differ {reasons or ''} "
                          f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    return cells


def sentinel(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--sentinel 1,2,4``: for each N, a server with ``--parallel N`` and ``probe --check-concurrency N`` over the
    demo prompts as token ids (greedy): requests, those that differ, and which."""
    from mtpscope.cache import demo_dir
    from mtpscope.demo.spec import TrainedPaths
    from mtpscope.traces.server.concurrency import check_concurrency
    from mtpscope.traces.server.launch import launch
    from mtpscope.traces.server.probe import ProbeSettings

    tp = TrainedPaths.under(Path(demo_dir()))
    out = Path(args.out or tempfile.mkdtemp(prefix="served-sentinel-"))
    out.mkdir(parents=True, exist_ok=True)
    threads = ["--threads", str(args.threads), "--threads-batch", str(args.threads),
               "--spec-draft-threads", str(args.threads), "--spec-draft-threads-batch", str(args.threads)]
    pf = prompts_file(out / "prompts-ids.jsonl", "ids")
    rows = []
    for n in args.sentinel:
        with launch(tp.target, tp.drafter, n_draft=args.n_draft, parallel=n, log=out / f"server-np{n}.log",
                    extra=threads) as srv:
            res = check_concurrency(srv.url, prompts_file=pf, out=out / f"cc{n}", concurrency=n, overwrite=True,
                                    settings=ProbeSettings(n_predict=args.n_predict))
        slots = sorted({r.slot for r in res.rows if r.slot is not None})
        rows.append({"n": n, "requests": len(res.rows), "differ": res.n_differ,
                     "overlapping": sum(1 for r in res.rows if r.n_overlapping > 0), "slots": slots,
                     "drafted": sum(r.drafted for r in res.rows), "accepted": sum(r.accepted for r in res.rows),
                     "which": [f"{r.request} ({r.prompt})" for r in res.differing]})
        print(f"N={n}: {res.n_differ} of {len(res.rows)} differ", file=sys.stderr, flush=True)
    return rows


def sentinel_table(rows: list[dict[str, Any]]) -> str:
    """The sentinel's rows as a Markdown table."""
    lines = ["| N (--parallel, concurrent clients) | requests | ran overlapped | slots used | drafted | accepted "
             "| differ from solo |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['n']} | {r['requests']} | {r['overlapping']} | {', '.join(map(str, r['slots']))} "
                     f"| {r['drafted']} | {r['accepted']} | {r['differ']}"
                     + (f": {', '.join(r['which'][:5])}" if r["which"] else "") + " |")
    return "\n".join(lines)


def table(cells: list[Cell]) -> str:
    """The cells as a Markdown table."""
    lines = ["| prompts | T | --parallel | clients | requests | equal | differ | reasons |",
             "|---|---|---|---|---|---|---|---|"]
    for c in cells:
        why = ", ".join(f"{k} {v}" for k, v in c.reasons.items()) or "—"
        lines.append(f"| {c.form} | {c.temperature:g} | {c.parallel} | {c.clients} | {c.n_requests} | {c.n_equal} "
                     f"| {c.n_differ} | {why} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--n-draft", type=int, default=3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--parallel", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4])
    ap.add_argument("--temps", type=lambda s: [float(x) for x in s.split(",")], default=[0.0, 0.8])
    ap.add_argument("--forms", type=lambda s: [x for x in s.split(",") if x in FORMS], default=list(FORMS))
    ap.add_argument("--out", default=None, help="folder for the probes, recordings and logs (default: a temp dir)")
    ap.add_argument("--json", default=None, help="also write the cells to this JSON file")
    ap.add_argument("--sentinel", type=lambda s: [int(x) for x in s.split(",")], default=None,
                    help="instead: the concurrency sentinel at these N (e.g. 1,2,4)")
    args = ap.parse_args(argv)
    if args.sentinel:
        rows = sentinel(args)
        print(sentinel_table(rows))
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
        return 0
    cells = run(args)
    print(table(cells))
    for c in cells:
        if c.n_differ:
            print(f"np{c.parallel} {c.form} T={c.temperature:g}: {c.first}")
    if args.json:
        Path(args.json).write_text(json.dumps([c.to_dict() for c in cells], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
