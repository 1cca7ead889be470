"""CLI commands: record (the real llama.cpp MTP loop; see traces/run/recorder.py; its flags become one
``RecordConfig``, traces/run/record_config.py; ``--runtime mlx`` / ``hf``: docs/RUNTIMES.md), with its
progress bar (rich, on stderr) drawn from ``record``'s ``on_round`` callback."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from mtpscope.cli.common import (
    EXIT_FINDINGS,
    EXIT_UNREADABLE,
    fmt,
    interrupted_words,
    model_path,
    n_draft_option,
    one_line_errors,
    out_folder,
)
from mtpscope.traces.run.record_config import CAPTURE_CHOICES, RecordConfig

if TYPE_CHECKING:
    from mtpscope.traces.run.prompts import PromptSpec

#: the flags' defaults: :class:`RecordConfig`'s own (its fields are the one list)
_D = RecordConfig()


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root ``mtpscope`` app."""

    @app.command("record")
    def record_cmd(
        runtime: str = typer.Option(
            "llama", "--runtime", is_eager=True, callback=runtime_choice,
            help="Which loop runs: 'llama' (llama.cpp, GGUF files; default), 'mlx' (mlx-vlm's own MTP loop on "
                 "Hugging Face checkpoint folders, greedy, token prompts; needs mtpscope\\[mlx]) or 'hf' (transformers' "
                 "own assisted generation on the same folders, greedy or --temp with --seed; needs mtpscope\\[parity]; "
                 "docs/RUNTIMES.md)."),
        target: Path = typer.Option(..., "--target", callback=model_path,
                                    help="Target GGUF (arch gemma4); with --runtime mlx / hf an HF checkpoint folder."),
        assistant: Path = typer.Option(..., "--assistant", callback=model_path,
                                       help="Drafter GGUF (arch gemma4-assistant, upstream); with --runtime mlx / hf "
                                            "an HF checkpoint folder."),
        draft_position: str = typer.Option(
            "p-1", "--draft-position",
            help="--runtime mlx: the drafter's position, 'p-1' (mlx-vlm's own) or 'p' (llama.cpp's convention)."),
        mlx_dtype: str = typer.Option(
            "f32", "--mlx-dtype",
            help="--runtime mlx: 'f32' casts both models' weights to float32 (as llama.cpp's CPU backend computes; "
                 "default) or 'checkpoint' keeps the stored dtype (mlx-vlm's own behaviour)."),
        mlx_head: str = typer.Option(
            "checkpoint", "--mlx-head",
            help="--runtime mlx: 'checkpoint' drafts with the assistant's own head (the centroid head where it has "
                 "one: mlx-vlm's behaviour) or 'dense' with the dense head, as llama.cpp does."),
        out: Path = typer.Option(..., "--out", callback=out_folder, help="Trace directory to write."),
        prompt: str | None = typer.Option(None, "--prompt", help="One prompt."),
        prompts: Path | None = typer.Option(
            None, "--prompts", help="Prompts file: .jsonl (strings, or objects with prompt/text, tokens or messages, "
                                    "optional id and category; docs/EXPLAIN.md §6) or .txt (one per line)."),
        category_field: str = typer.Option(
            "category", "--category-field", help="The prompts file's field that holds each prompt's category."),
        n_draft: int = n_draft_option("Drafts per round (the default is llama.cpp's MTP default)"),
        max_tokens: int = typer.Option(_D.max_tokens, "--max-tokens", min=1, help="Generated tokens per prompt at most."),
        temp: float = typer.Option(_D.temp, "--temp", help="Target sampling temperature, finite >= 0 (0 = greedy)."),
        seed: int = typer.Option(_D.seed, "--seed", help="Sampling seed."),
        top_k: int = typer.Option(_D.top_k, "--top-k", help="Sampling top-k, >= 0 (0: off)."),
        top_p: float = typer.Option(_D.top_p, "--top-p", help="Sampling top-p, in (0, 1] (1: off)."),
        min_p: float = typer.Option(_D.min_p, "--min-p", help="Sampling min-p, in [0, 1] (0: off)."),
        chat: bool = typer.Option(_D.chat, "--chat", help="Render each prompt as one user turn with the GGUF's own chat template, as llama-server's /v1/chat/completions does."),
        n_gpu_layers: int = typer.Option(
            _D.n_gpu_layers, "--n-gpu-layers", min=-1,
            help="Layers to offload to a GPU (-1 = all, 0 = CPU only; no effect in a CPU-only build)."),
        centroids: Path | None = typer.Option(
            None, "--centroids",
            help="Centroid head to evaluate next to the dense head: a fork-dialect GGUF or a Hugging Face "
                 "checkpoint directory (masked_embedding.*)."),
        hidden: str = typer.Option(_D.hidden, "--hidden", help="Store hidden states as f16, f32, or off."),
        n_top: int = typer.Option(_D.n_top, "--n-top", min=1, help="Drafter candidates stored per step."),
        flush_every: int = typer.Option(_D.flush_every, "--flush-every", min=1, help="Write a Parquet part every N rounds."),
        flash_attn: bool = typer.Option(_D.flash_attn, "--flash-attn/--no-flash-attn", help="Flash attention."),
        threads: int | None = typer.Option(_D.n_threads, "--threads",
                                           help="CPU threads for llama.cpp (default: llama-server's, one per physical core; "
                                                "--runtime hf: torch's, default 1)."),
        overwrite: bool = typer.Option(
            False, "--overwrite", help="Replace an existing trace in --out (swapped in only when the new run "
                                       "completes; until then it is written to <out>.partial-<pid>). The whole "
                                       "folder is replaced, so one that holds other files too is refused."),
        compact: bool = typer.Option(_D.compact, "--compact/--no-compact",
                                     help="Merge the small Parquet parts at the end (rewrites the trace once)."),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on stderr."),
        hidden_target: bool = typer.Option(
            _D.hidden_target, "--hidden-target", help="Also store the target's own hidden state at every verify row "
                                           "(h_target, for drafter drift in `mtpscope explain`)."),
        baseline: bool = typer.Option(
            _D.baseline, "--baseline", help="First time plain greedy decoding of the same prompts and store it in the "
                                      "manifest (what-if speedups in `mtpscope explain`)."),
        verbose: bool = typer.Option(
            False, "--verbose", "-v",
            help="Show llama.cpp's own output as it comes, and one flushed stderr line per finished round "
                 "(`round PROMPT:ROUND n_accepted=N`, printed once the round is in the trace); no progress bar."),
        no_preflight: bool = typer.Option(
            False, "--no-preflight",
            help="Skip the pre-flight check of the pair (for debugging a runtime crash on a pair it refuses)."),
        isolate: bool = typer.Option(
            True, "--isolate/--in-process",
            help="Run llama.cpp in a worker process (default), so that a crash of llama.cpp keeps the trace."),
        repack: bool = typer.Option(
            _D.repack, "--repack/--no-repack",
            help="Let llama.cpp put CPU weights in its extra buffer types (AMX, repacked layouts; its default). "
                 "--no-repack works around llama.cpp 0.3.36 crashing on Gemma 4 MoE targets on AVX-512 / AMX CPUs."),
        capture: str = typer.Option(
            "derived", "--capture",
            help="Where h_inner (and the centroid head's inputs) come from: 'derived' (default) from the logits "
                 "and h_next llama.cpp returns, no graph hook (manifest 'derived' gives the measured agreement); "
                 "'graph' a cb_eval copy out of every drafter decode (slower: docs/RECORDING.md)."),
    ) -> None:
        """Run the real MTP loop (target + drafter in llama.cpp) and write a trace directory.

        A crash of llama.cpp (abort, fatal signal) is reported in one line quoting llama.cpp (exit 1);
        the trace keeps every round before it, marked incomplete, with llama.cpp's output in llama.log.
        Ctrl-C, SIGTERM or SIGHUP keep the rounds finished, marked incomplete (exit 130, 143, 129).
        """
        if (prompt is None) == (prompts is None):
            print("mtpscope: give exactly one of --prompt and --prompts", file=sys.stderr)
            raise typer.Exit(EXIT_UNREADABLE)
        if prompt is not None and category_field != "category":    # (a field of a prompts file: --prompt has none)
            print(f"mtpscope: --category-field {category_field!r} names a field of a --prompts file; --prompt has "
                  "no fields", file=sys.stderr)
            raise typer.Exit(EXIT_UNREADABLE)
        if runtime == "mlx":
            _check_mlx_options(draft_position, mlx_dtype, mlx_head)
            _record_mlx(target=target, assistant=assistant, out=out, prompt=prompt, prompts=prompts,
                        category_field=category_field, draft_position=draft_position, overwrite=overwrite,
                        dtype=mlx_dtype, head=mlx_head,
                        config=_config(n_draft=n_draft, max_tokens=max_tokens, temp=temp, hidden=hidden, n_top=n_top,
                                       flush_every=flush_every, compact=compact))
            return
        if runtime == "hf":
            _check_mlx_options(draft_position, mlx_dtype, mlx_head)
            _record_hf(target=target, assistant=assistant, out=out, prompt=prompt, prompts=prompts,
                       category_field=category_field, overwrite=overwrite,
                       config=_config(n_draft=n_draft, max_tokens=max_tokens, temp=temp, seed=seed, top_k=top_k,
                                      top_p=top_p, min_p=min_p, hidden=hidden, n_top=n_top, flush_every=flush_every,
                                      compact=compact, n_threads=threads))
            return
        if capture not in CAPTURE_CHOICES:
            print(f"mtpscope: --capture must be {' or '.join(CAPTURE_CHOICES)} (got {capture!r})", file=sys.stderr)
            raise typer.Exit(EXIT_UNREADABLE)
        config = _config(n_draft=n_draft, max_tokens=max_tokens, temp=temp, seed=seed, top_k=top_k, top_p=top_p, min_p=min_p,
                         chat=chat, n_gpu_layers=n_gpu_layers, centroids=centroids, hidden=hidden, n_top=n_top,
                         flush_every=flush_every, compact=compact, flash_attn=flash_attn, n_threads=threads,
                         hidden_target=hidden_target, baseline=baseline, graph_capture=capture == "graph",
                         repack=repack)
        if threads is not None and threads > (os.cpu_count() or threads):
            from mtpscope.traces.run.record_config import server_threads

            print(f"note: --threads {threads} is more than this machine's {os.cpu_count()} CPUs: llama.cpp's threads "
                  f"will wait on one another (llama-server's default here: {server_threads()})", file=sys.stderr)
        from mtpscope.traces.run import worker_spawn

        if isolate:     # start the worker now: its Python start and imports run while the recorder is imported
            worker_spawn.prespawn()
        try:
            _check_mlx_options(draft_position, mlx_dtype, mlx_head)    # (after the spawn: its import runs beside it)
            _record(config, target=target, assistant=assistant, out=out, prompt=prompt, prompts=prompts,
                    category_field=category_field, progress=progress, verbose=verbose, overwrite=overwrite,
                    isolate=isolate, no_preflight=no_preflight)
        finally:
            worker_spawn.discard_prespawned()  # not taken: the command failed before the recording began


def _record(config: RecordConfig, *, target: Path, assistant: Path, out: Path, prompt: str | None,
            prompts: Path | None, category_field: str, progress: bool, verbose: bool, overwrite: bool, isolate: bool,
            no_preflight: bool) -> None:
    """The ``record`` command once its flags are checked and its worker is started: the recording, its
    progress bar and the summary lines."""
    from mtpscope.errors import LayoutError, PreflightRefusal, RuntimeAbortedError
    from mtpscope.traces.run.recorder import record

    bar = _ProgressBar(config.max_tokens, prompts, category_field) if progress and not verbose else None

    def report_round(pid: int, res: Any) -> None:
        print(f"round {pid}:{res.round} n_accepted={res.n_accepted}", file=sys.stderr, flush=True)

    on_round = report_round if verbose else (None if bar is None else bar.on_round)
    # LayoutError: readable input that the pre-flight check refuses (exit 1); RuntimeAbortedError:
    # llama.cpp died on this pair (exit 1, the trace keeps the rounds); other errors exit 2
    with one_line_errors(EXIT_UNREADABLE, refusals=(LayoutError, RuntimeAbortedError)):
        specs = None
        if prompts is not None:
            from mtpscope.traces.run.prompts import category_note

            specs = _read_specs(prompts, category_field)
            note = category_note(specs)
            if note:
                print(f"note: {note}", file=sys.stderr)
        existed = out.exists()
        try:
            s = record(config, target=target, assistant=assistant, out=out, prompt=prompt, prompts=specs,
                       overwrite=overwrite, command=["mtpscope", *sys.argv[1:]], on_round=on_round,
                       isolate=isolate, preflight=not no_preflight, echo_log=verbose)
            if bar is not None:
                bar.finish(s.n_generated)
        except PreflightRefusal as e:      # and how to record it anyway (to see what the bug costs, or debug a crash)
            print(f"mtpscope: {e.one_line()}; `--no-preflight` records it anyway", file=sys.stderr)
            raise typer.Exit(EXIT_FINDINGS) from None
        except KeyboardInterrupt as e:     # Ctrl-C, SIGTERM, SIGHUP: say what was kept (the recorder's note), exit
            notes = [n for n in getattr(e, "__notes__", ()) if n.startswith("interrupted")]   # as the signal does
            if notes:
                said = notes[0]
            elif not existed and (out / "manifest.json").exists():    # (never claim nothing when a trace is there)
                said = (f"interrupted before the trace in {out} was closed: `mtpscope report {out}` reads the rounds "
                        "it holds")
            else:
                said = "interrupted before the recording began: nothing recorded"
            line, status = interrupted_words(said)
            print(f"mtpscope: {line}", file=sys.stderr)
            raise typer.Exit(status) from None
        finally:
            if bar is not None:
                bar.stop()
    acc = fmt(s.acceptance_rate, ".4f")
    mal = fmt(s.mean_acceptance_length, ".3f")
    typer.echo(f"trace: {s.out}")
    typer.echo(f"prompts {s.n_prompts}  rounds {s.n_rounds}  draft steps {s.n_steps}  "
               f"generated {s.n_generated} tokens in {s.seconds:.2f} s ({s.tokens_per_second:.1f} tokens/s of wall time, "
               "prefill included; `mtpscope report` gives the draft + verify rate)")
    typer.echo(f"acceptance rate {acc} ({s.n_accepted} accepted / {s.n_drafted} drafted)  "
               f"mean acceptance length {mal}")
    for w in s.warnings:            # (on stderr, as every command's warnings; the manifest keeps them too)
        print(f"warning: {w}", file=sys.stderr)


#: ``record --runtime`` choices
RUNTIMES = ("llama", "mlx", "hf")


def runtime_choice(value: str) -> str:
    """``--runtime`` (parsed first: it is eager): one of :data:`RUNTIMES`, else one line, exit 2."""
    if value not in RUNTIMES:
        print(f"mtpscope: --runtime must be {', '.join(RUNTIMES[:-1])} or {RUNTIMES[-1]} (got {value!r})", file=sys.stderr)
        raise typer.Exit(EXIT_UNREADABLE)
    return value


def _check_mlx_options(draft_position: str, dtype: str, head: str) -> None:
    """The ``--runtime mlx`` options' values, checked whatever the runtime (a bad value is refused even where the
    option does not apply, rather than ignored): one line, exit 2."""
    from mtpscope.traces.run.mlx_runtime import DRAFT_POSITIONS, HEADS

    for opt, value, allowed in (("--draft-position", draft_position, DRAFT_POSITIONS),
                                ("--mlx-dtype", dtype, ("f32", "checkpoint")), ("--mlx-head", head, HEADS)):
        if value not in allowed:
            print(f"mtpscope: {opt} must be {' or '.join(allowed)} (got {value!r})", file=sys.stderr)
            raise typer.Exit(EXIT_UNREADABLE)


def _read_specs(prompts: Path, category_field: str) -> list[PromptSpec]:
    """The prompts of a ``--prompts`` file (:func:`~mtpscope.traces.run.prompts.read_prompt_specs`), every runtime's;
    a ``--category-field`` other than the default that no prompt has ends the command with one line, exit 2, as
    ``explain`` refuses it (it recorded without categories).

    Raises:
        MtpscopeError: a bad prompts file (the caller's ``one_line_errors`` says it).
    """
    from mtpscope.traces.run.prompts import CATEGORY_FIELD, read_prompt_specs

    specs = read_prompt_specs(prompts, category_field=category_field)
    if category_field != CATEGORY_FIELD and all(s.category is None for s in specs):
        from mtpscope.traces.analysis.breakdown import missing_field_words

        words = missing_field_words({"prompts": [{"extra": dict(s.extra)} for s in specs]}, category_field)
        print(f"mtpscope: {prompts}: '--category-field': {words}", file=sys.stderr)
        raise typer.Exit(EXIT_UNREADABLE)
    return specs


def _record_mlx(*, target: Path, assistant: Path, out: Path, prompt: str | None, prompts: Path | None,
                category_field: str, draft_position: str, overwrite: bool, dtype: str, head: str,
                config: RecordConfig) -> None:
    """``record --runtime mlx`` (:func:`mtpscope.traces.run.mlx_record.record_mlx`): one line per refusal, exit 2."""
    from mtpscope.cache import cache_dir
    from mtpscope.traces.run.mlx_record import record_mlx
    from mtpscope.traces.run.prompts import PromptSpec

    with one_line_errors(EXIT_UNREADABLE):
        specs = _read_specs(prompts, category_field) if prompts is not None else [PromptSpec(text=prompt)]
        s = record_mlx(config, target=target, assistant=assistant, out=out, prompts=specs,
                       work_dir=cache_dir() / "mlx", draft_position=draft_position, overwrite=overwrite,
                       dtype=None if dtype == "checkpoint" else dtype, head_choice=head,
                       command=["mtpscope", *sys.argv[1:]])
    acc = fmt(s.acceptance_rate, ".4f")
    typer.echo(f"trace: {s.out}")
    typer.echo(f"prompts {s.n_prompts}  rounds {s.n_rounds}  draft steps {s.n_steps}  ({s.seconds:.2f} s)")
    typer.echo(f"acceptance rate {acc} ({s.n_accepted} accepted / {s.n_drafted} drafted)")


def _record_hf(*, target: Path, assistant: Path, out: Path, prompt: str | None, prompts: Path | None,
               category_field: str, overwrite: bool, config: RecordConfig) -> None:
    """``record --runtime hf`` (:func:`mtpscope.traces.run.hf_record.record_hf`): one line per refusal, exit 2."""
    from mtpscope.traces.run.hf_record import record_hf
    from mtpscope.traces.run.prompts import PromptSpec

    with one_line_errors(EXIT_UNREADABLE):
        specs = _read_specs(prompts, category_field) if prompts is not None else [PromptSpec(text=prompt)]
        s = record_hf(config, target=target, assistant=assistant, out=out, prompts=specs, overwrite=overwrite,
                      command=["mtpscope", *sys.argv[1:]])
    acc = fmt(s.acceptance_rate, ".4f")
    typer.echo(f"trace: {s.out}")
    typer.echo(f"prompts {s.n_prompts}  rounds {s.n_rounds}  draft steps {s.n_steps}  ({s.seconds:.2f} s)")
    typer.echo(f"acceptance rate {acc} ({s.n_accepted} accepted / {s.n_drafted} drafted)")


def _config(**kw: Any) -> RecordConfig:
    """The :class:`~mtpscope.traces.run.record_config.RecordConfig` of the flags; a bad value ends the
    command with one line (exit 2): ``--hidden``, ``--threads`` and ``--capture graph`` in their own words, the
    others as the config names them."""
    from mtpscope.errors import MtpscopeError
    from mtpscope.traces.run.record_config import HIDDEN_CHOICES, MAX_N_THREADS

    with one_line_errors(EXIT_UNREADABLE):
        try:
            return RecordConfig(**kw)
        except MtpscopeError as e:
            if e.key == "n_threads":
                print(f"mtpscope: --threads must be in 1..{MAX_N_THREADS} (unset: llama-server's default, one per "
                      f"physical core) (got {kw['n_threads']})", file=sys.stderr)
                raise typer.Exit(EXIT_UNREADABLE) from None
            if e.key == "graph_capture":
                print("mtpscope: --capture graph copies h_inner out of llama.cpp's graph, which nothing reads with "
                      "--hidden off and no --centroids: store hidden states (--hidden f16) or drop --capture graph",
                      file=sys.stderr)
                raise typer.Exit(EXIT_UNREADABLE) from None
            if e.key != "hidden":
                raise
    print(f"mtpscope: --hidden must be {', '.join(HIDDEN_CHOICES[:-1])} or {HIDDEN_CHOICES[-1]} "
          f"(got {kw['hidden']!r})", file=sys.stderr)
    raise typer.Exit(EXIT_UNREADABLE)


class _ProgressBar:
    """The ``record`` progress bar on stderr: tokens generated (``max_tokens`` per prompt) and the
    running acceptance rate, advanced by :meth:`on_round` (``record``'s ``on_round`` callback).

    ``prompts_file``: the ``--prompts`` file, counted for the total at the first round (``record`` has
    read and checked it by then); None for one ``--prompt``. The bar appears at the first round.
    """

    def __init__(self, max_tokens: int, prompts_file: Path | None, category_field: str = "category") -> None:
        self.category_field = category_field
        self.max_tokens = int(max_tokens)
        self.prompts_file = prompts_file
        self.bar: Any = None
        self.rates: Any = None     # traces.analysis.rates, imported by _start
        self.pid = -1
        self.n_gen = self.n_drafted = self.n_accepted = 0

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from mtpscope.traces.analysis import rates
        from mtpscope.traces.run.prompts import read_prompt_specs

        self.rates = rates      # (imported once, with the first round; on_round runs every round)
        n_prompts = 1 if self.prompts_file is None else len(read_prompt_specs(self.prompts_file,
                                                                                  category_field=self.category_field))
        self.bar = Progress(TextColumn("[bold]record[/]"), BarColumn(), MofNCompleteColumn(), TextColumn("tokens"),
                            TextColumn("{task.fields[acc]}"), TimeElapsedColumn(), transient=False,
                            console=Console(stderr=True))
        self.bar.start()
        self.bar.add_task("record", total=self.max_tokens * n_prompts, acc="acceptance rate -")

    def on_round(self, pid: int, res: Any) -> None:
        """``record``'s callback: ``(prompt_id, RoundResult)`` after each written round."""
        if self.bar is None:
            self._start()
        if pid != self.pid:  # a prompt's first round also counts its pending (prefill) token
            self.pid, self.n_gen = pid, 1
        self.n_gen += len(res.emitted)
        self.n_drafted += len(res.drafted)
        self.n_accepted += res.n_accepted
        acc = (f"acceptance rate {self.rates.acceptance_rate(self.n_accepted, self.n_drafted):.3f}" if self.n_drafted
               else "")
        self.bar.update(self.bar.task_ids[0], completed=pid * self.max_tokens + self.n_gen, acc=acc)

    def finish(self, n_generated: int) -> None:
        """The run completed: every prompt is done. The bar ends at the tokens generated (``RecordSummary.n_generated``,
        the number the summary line prints), not at the budget: prompts that ended early (EOG) leave it short."""
        if self.bar is not None:
            self.bar.update(self.bar.task_ids[0], total=n_generated, completed=n_generated)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
