"""CLI commands: sweep (see mtpscope/cli/main.py; the runner is traces/sweep/runner.py, the reader traces/sweep/reader.py).

``mtpscope sweep --target T --assistant A [--assistant B ...] [--assistant-quant f32,q8_0,q4_k_m] --prompts
P.jsonl --n-draft 1,2,3 [--baseline] [--shards N] --out DIR [--ray auto|local|ADDRESS] [--workers N]
[--gpus-per-worker G] [--resume]``: record every (assistant, n_draft, prompt shard) on Ray; with
``--assistant-quant`` the assistants are the given drafters quantized by llama.cpp to each type
(:mod:`traces.sweep.quant`), and the report gains a section per quantization x category.
``mtpscope report DIR`` on a sweep directory prints :func:`format_sweep_report` (cli_traces detects
``sweep.json`` and calls :func:`sweep_report`).

Exit codes: 0 every task done; 1 some task failed (named on stderr) or the report covers an
incomplete sweep; 2 bad arguments or unreadable input (one line on stderr).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from mtpscope.cli.common import EXIT_FINDINGS, EXIT_OK, gguf_path, n_drafts_option, one_line_errors, out_folder
from mtpscope.cli.common import fmt as _fmt

if TYPE_CHECKING:
    from mtpscope.traces.sweep.advice import SweepAdvice
    from mtpscope.traces.sweep.quant import QuantRow
    from mtpscope.traces.sweep.reader import SweepReport


def format_sweep_report(rep: SweepReport, advice: SweepAdvice | None = None) -> str:
    """The sweep report (:meth:`traces.sweep.reader.Sweep.report`) as plain text: one line per
    configuration × category, the recommendation and break-even (``advice``:
    :class:`traces.sweep.advice.SweepAdvice`, when given; printed by :func:`mtpscope.cli.advice.format_advice`),
    the quantizations, the failed tasks."""
    state = "complete" if rep.complete else f"INCOMPLETE: {rep.n_done} of {rep.n_tasks} tasks done"
    lines = [f"sweep: {rep.sweep} ({state})"]
    head = (f"{'assistant':<24} {'n_draft':>7}  {'category':<16} {'prompts':>7} {'rounds':>8} "
            f"{'acceptance rate':>15} {'mean acc. length':>16} {'tokens/s':>9} {'speedup':>8}")
    lines += ["", head]
    prev = None
    for c in rep.cells:
        cfg = (c.assistant, c.n_draft)
        if prev is not None and cfg != prev:
            lines.append("")
        prev = cfg
        lines.append(f"{c.assistant[:24]:<24} {c.n_draft:>7}  {str(c.category)[:16]:<16} "
                     f"{c.n_prompts:>7} {c.n_rounds:>8} {_fmt(c.acceptance_rate, '.4f'):>15} "
                     f"{_fmt(c.mean_acceptance_length, '.3f'):>16} {_fmt(c.tokens_per_s, '.1f'):>9} "
                     f"{_fmt(c.speedup, '.3f'):>8}")
    if not rep.cells:
        lines.append("(no finished task yet)")
    if advice is not None:
        from mtpscope.cli.advice import format_advice

        lines += format_advice(advice.advice, advice.load_warnings)
    lines += format_quant_section(rep.quantization)
    if rep.failed:
        lines += ["", f"failed tasks ({len(rep.failed)}):"]
        lines += [f"  {f.task}: {f.error}" for f in rep.failed]
    lines += ["", "tokens/s: emitted tokens / (draft + verify time), prompt processing excluded; speedup: over "
              "the baseline (plain decoding) of the same category; intervals: 95 % bootstrap over prompts"]
    return "\n".join(lines)


# ------------------------------------------------------------------ drafter quantizations (--assistant-quant)

def format_quant_section(rows: Sequence[QuantRow]) -> list[str]:
    """The sweep report's section on drafter quantizations (``report().quantization``,
    :func:`traces.sweep.quant.quant_rows`): per category, one line per llama.cpp type (and n_draft) with
    the quantized file's size, acceptance rate, mean acceptance length, tokens/s and speedup; where a row
    carries an interval for a metric it follows the number. No lines without quantizations."""
    if not rows:
        return []
    sources = sorted({str(r.source) for r in rows})
    lines = ["", f"drafter quantizations (llama.cpp's quantizer; source {', '.join(sources)}):",
             f"{'category':<16} {'type':<12} {'n_draft':>7} {'size MiB':>9} {'acceptance rate':>15} "
             f"{'mean acc. length':>16} {'tokens/s':>9} {'speedup':>8}"]
    prev = None

    def num(r: QuantRow, k: str, spec: str) -> str:
        v = _fmt(getattr(r, k), spec)
        lo, hi = r.intervals.get(k, (None, None))
        return v if lo is None or hi is None else f"{v} [{_fmt(lo, spec)}, {_fmt(hi, spec)}]"

    for r in rows:
        cat = str(r.category)
        lines.append(f"{(cat if cat != prev else '')[:16]:<16} {str(r.qtype)[:12]:<12} {r.n_draft:>7} "
                     f"{r.n_bytes / (1024 * 1024):>9.1f} {num(r, 'acceptance_rate', '.4f'):>15} "
                     f"{num(r, 'mean_acceptance_length', '.3f'):>16} {num(r, 'tokens_per_s', '.1f'):>9} "
                     f"{num(r, 'speedup', '.3f'):>8}")
        prev = cat
    return lines


# ------------------------------------------------------------------ the report

def refuse_sweep_folder(path: Path, command: str) -> None:
    """Exit 1 with one line when ``path`` is a folder inside a sweep that holds no trace (a configuration
    folder, ``DIR/assistant=A/n_draft=N``): name the sweep and the folders that can be read."""
    from mtpscope.traces.store.layout import MANIFEST
    from mtpscope.traces.sweep.spec import sweep_of

    root = sweep_of(path)
    if root is None or (Path(path) / MANIFEST).exists() or Path(path).name.startswith("shard="):
        return                   # a shard folder is a trace's (without a manifest: the reader says so)
    print(f"mtpscope: {path} is a folder of the sweep {root}, not a trace: {command} {root} (every configuration, "
          f"measured) or one shard's trace (a shard=N folder below it)", file=sys.stderr)
    raise typer.Exit(1)


def sweep_report(path: Path, as_json: bool, advice_only: bool = False) -> int:
    """``mtpscope report DIR`` on a sweep: print the report, with the recommendation and break-even
    (:func:`traces.sweep.advice.advise_sweep`); ``advice_only`` (``explain DIR``): only those. Return the
    exit code (1 when a task failed, the sweep is incomplete or a finished task's trace was unreadable)."""
    with one_line_errors():
        from mtpscope.traces.sweep.advice import sweep_advice
        from mtpscope.traces.sweep.reader import open_sweep

        sw = open_sweep(path)
        rep = sw.report()
        adv = sweep_advice(sw)
        doc = {**rep.to_dict(), **adv.to_dict()}        # the JSON: the report's keys, then the advice's
        if advice_only:
            doc = {k: doc[k] for k in ("sweep", "complete", "n_tasks", "n_done", "recommendation", "break_even",
                                       "candidates", "baseline", "load_warnings", "failed", "warnings")
                   if k in doc}
    for w in rep.warnings:
        print(f"warning: {w}", file=sys.stderr)
    for lw in adv.load_warnings:
        print(f"warning: {lw.words}", file=sys.stderr)
    if as_json:
        print(json.dumps(doc, indent=2, allow_nan=False))
    elif advice_only:
        from mtpscope.cli.advice import format_advice

        print("\n".join([f"sweep: {rep.sweep}", *format_advice(adv.advice, adv.load_warnings)]))
    else:
        print(format_sweep_report(rep, adv))
    return EXIT_FINDINGS if (rep.failed or not rep.complete or rep.warnings) else EXIT_OK


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root ``mtpscope`` app."""

    @app.command("sweep")
    def sweep_cmd(
        out: Path = typer.Option(..., "--out", callback=out_folder,
                                 help="Sweep directory (sweep.json + one trace per task)."),
        target: Path | None = typer.Option(None, "--target", callback=gguf_path,
                                              help="Target GGUF (arch gemma4)."),
        assistant: list[str] | None = typer.Option(
            None, "--assistant", callback=gguf_path,
            help="Drafter GGUF (gemma4-assistant), repeatable; NAME=PATH names it (default name: the file's stem)."),
        assistant_quant: str | None = typer.Option(
            None, "--assistant-quant", help="Sweep each --assistant quantized by llama.cpp's quantizer to each of "
                                            "these types instead (e.g. f32,q8_0,q6_k,q4_k_m,q4_0; quantized once "
                                            "into the cache, named by type)."),
        prompts: Path | None = typer.Option(
            None, "--prompts", help="Prompt set, as `record --prompts`: .jsonl (strings, or objects with prompt/text, "
                                    "tokens or messages, optional id and category) or .txt (one per line)."),
        category_field: str = typer.Option(
            "category", "--category-field", help="The prompts file's field that holds each prompt's category."),
        n_draft: Any = n_drafts_option("Drafts per round of each configuration, e.g. 1,2,3,4,6"),  # tuple[int, ...]
        baseline: bool = typer.Option(False, "--baseline", help="Also record plain decoding of the target "
                                                                "(the speedup's reference)."),
        hidden: str = typer.Option("off", "--hidden", help="Hidden states in the traces: off, f16 or f32."),
        max_tokens: int = typer.Option(128, "--max-tokens", min=1, help="Generated tokens per prompt at most."),
        shards: int = typer.Option(0, "--shards", min=0, help="Split the prompts into N shards (one task each; "
                                   "0, the default: min(4, number of prompts), so the cells interleave in time)."),
        chat: bool = typer.Option(False, "--chat", help="Apply the target's chat template to each prompt."),
        ray_address: str = typer.Option("auto", "--ray", help="auto ($RAY_ADDRESS, else a local Ray sized to this "
                                                              "machine), local, or a cluster address."),
        workers: int | None = typer.Option(None, "--workers", min=1, help="Ray actors (default: one per GPU "
                                                                              "group, or one per 4 CPUs)."),
        threads: int | None = typer.Option(None, "--threads-per-worker", min=1,
                                              help="llama.cpp threads (Ray CPUs) per actor (default: CPUs / workers)."),
        gpus_per_worker: float = typer.Option(0.0, "--gpus-per-worker", min=0.0, help="GPUs per actor (0: CPU)."),
        resume: bool = typer.Option(False, "--resume", help="Finish an existing sweep in --out: skip done tasks. "
                                                            "Without --target/--assistant/--prompts the stored "
                                                            "settings are used."),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on stderr."),
    ) -> None:
        """Record a prompt set against several configurations on Ray, one trace per (assistant, n_draft, shard)."""
        with one_line_errors():
            from mtpscope.errors import MtpscopeError
            from mtpscope.traces.sweep.quant import quant_assistants, restore_quantized
            from mtpscope.traces.sweep.runner import run_sweep
            from mtpscope.traces.sweep.spec import (
                SWEEP_FILE,
                SweepSpec,
                default_shards,
                file_sha256,
                parse_assistant,
                prompt_set_note,
                read_prompt_set,
                read_state,
            )

            def say(line: str) -> None:
                print(line, file=sys.stderr)

            given = [x is not None for x in (target, assistant, prompts)]
            if resume and not any(given):
                spec = restore_quantized(SweepSpec.from_state(read_state(out), out / SWEEP_FILE), on_quantize=say)
            else:
                if target is None or assistant is None or prompts is None:  # not all(given)
                    raise MtpscopeError("give --target, --assistant and --prompts (or --resume alone)",
                                        key="--target/--assistant/--prompts", expected="all three",
                                        actual=", ".join(n for n, g in zip(("--target", "--assistant", "--prompts"),
                                                                             given, strict=True) if g) or "none")
                pairs = [parse_assistant(a) for a in assistant or []]
                prompt_set, n_drafts = read_prompt_set(prompts, category_field=category_field), n_draft
                note = prompt_set_note(prompt_set)                 # bad input first, then quantize
                if note:
                    print(f"note: {note}", file=sys.stderr)
                quantized: tuple = ()
                assistants = tuple((n, os.path.abspath(p)) for n, p in pairs)
                if assistant_quant is not None:
                    assistants, quantized = quant_assistants(assistants, assistant_quant.split(","), on_quantize=say)
                spec = SweepSpec(target=os.path.abspath(target), prompts=prompt_set, assistants=assistants,
                                 n_drafts=n_drafts, n_shards=shards or default_shards(len(prompt_set)),
                                 baseline=baseline,
                                 max_tokens=max_tokens, hidden=hidden, chat=chat,
                                 prompts_file=os.path.abspath(prompts), prompts_sha256=file_sha256(prompts),
                                 quantized=quantized)
            res = run_sweep(spec, out, ray_address=ray_address, workers=workers, threads_per_worker=threads,
                            gpus_per_worker=gpus_per_worker, resume=resume, progress=progress,
                            command=["mtpscope", *sys.argv[1:]])
        if res.n_run == 0 and res.workers == 0:
            print(f"sweep {res.out}: all {res.n_tasks} tasks were done already; nothing to run")
            raise typer.Exit(EXIT_OK)
        skipped = res.n_tasks - res.n_run
        print(f"sweep {res.out}: {res.n_tasks} tasks, {res.n_done} done, {res.n_failed} failed "
              f"(ran {res.n_run}{f', skipped {skipped} already done' if skipped else ''}"
              f"{f', retried {res.n_retried}' if res.n_retried else ''}) in {res.seconds:.1f} s on "
              f"{res.workers} worker{'s' if res.workers != 1 else ''} x {res.threads_per_worker} thread"
              f"{'s' if res.threads_per_worker != 1 else ''}"
              f"{f' x {res.gpus_per_worker:g} GPU' if res.gpus_per_worker else ''}")
        if res.failed:
            print(f"mtpscope: {len(res.failed)} task{'s' if len(res.failed) != 1 else ''} failed:", file=sys.stderr)
            for tid, err in res.failed:
                print(f"  {tid}: {err}", file=sys.stderr)
            raise typer.Exit(EXIT_FINDINGS)
        if not res.ok:
            raise typer.Exit(EXIT_FINDINGS)
