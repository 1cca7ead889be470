"""CLI commands: ``mtpscope demo build | path | clean`` (see mtpscope/cli/main.py and docs/DEMO.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from mtpscope.cli.common import one_line_errors, out_folder

demo_app = typer.Typer(help="The demo pairs (a trained tiny Gemma 4 target + MTP drafter and a constructed "
                            "one, real tokenizer) and their traces.", no_args_is_help=True)


@demo_app.command("build")
def build(out: Path | None = typer.Option(None, "--out", callback=out_folder,
                                          help="Demo folder (default <cache>/demo)."),
          force: bool = typer.Option(False, "--force", help="Rebuild even if stamp.json matches."),
          no_traces: bool = typer.Option(False, "--no-traces", help="Write the models only."),
          config: Path | None = typer.Option(None, "--config",
                                             help="Recording configuration (default sample_configs/demo-record.json)."),
          quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines.")) -> None:
    """Write the demo models (and record the demo traces) unless they are already current."""
    from mtpscope.demo.spec import demo_is_current

    with one_line_errors():
        if not force and demo_is_current(out, config=config):   # milliseconds, no numpy import
            print(out if out is not None else _default_root())
            return
    from mtpscope.demo.build import build_demo

    def log(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr)

    with one_line_errors():
        paths = build_demo(out, force=force, traces=not no_traces, config=config, log=log)
    print(paths.root)


@demo_app.command("path")
def path(out: Path | None = typer.Option(None, "--out", help="Demo folder (default <cache>/demo)."),
         as_json: bool = typer.Option(False, "--json", help="Every demo path as JSON.")) -> None:
    """Print where the demo lives (nothing is built). --json: the constructed pair's paths, and under
    "trained" the trained pair's (the one the app opens on: docs/DEMO.md)."""
    from mtpscope.cache import demo_dir
    from mtpscope.demo.spec import RECORD_CONFIG, DemoPaths, TrainedPaths

    root = out if out is not None else demo_dir()
    paths = DemoPaths.under(root, RECORD_CONFIG)
    if as_json:
        doc: dict[str, object] = {k: str(v) for k, v in paths.__dict__.items()}
        doc["trained"] = {k: str(v) for k, v in TrainedPaths.under(root).__dict__.items()}
        print(json.dumps(doc, indent=2))
    else:
        print(paths.root)


@demo_app.command("train")
def train(out: Path | None = typer.Option(None, "--out", callback=out_folder,
                                          help="Where to write the compact checkpoints "
                                               "(default: the package's mtpscope/demo_data)."),
          seed: int = typer.Option(0, "--seed", help="The recipe's seed."),
          target_steps: int | None = typer.Option(None, "--target-steps", help="Target optimizer steps."),
          drafter_steps: int | None = typer.Option(None, "--drafter-steps", help="Drafter optimizer steps."),
          threads: int = typer.Option(1, "--threads", help="torch threads (the recipe is deterministic per count)."),
          no_eval: bool = typer.Option(False, "--no-eval", help="Skip the realism measurement."),
          stage_cache: Path | None = typer.Option(None, "--stage-cache",
                                                  help="Keep / reuse the trained target here (same result).")) -> None:
    """Train the demo pair (tiny Gemma 4 target + MTP drafter on real text, real tokenizer; CPU, torch and
    transformers from the parity extra) and write its compact checkpoints. Not part of `make run`."""
    from dataclasses import replace

    with one_line_errors():
        from mtpscope.demo import train as demo_train

        r = demo_train.Recipe()
        r = replace(r, seed=seed, threads=threads,
                    target_steps=target_steps if target_steps is not None else r.target_steps,
                    drafter_steps=drafter_steps if drafter_steps is not None else r.drafter_steps)
        rec = demo_train.train(out if out is not None else demo_train.DATA_DIR, r, evaluate_after=not no_eval,
                               stage_cache=stage_cache, log=lambda s: print(s, file=sys.stderr, flush=True))
    print(json.dumps({"train_wall_s": rec.get("train_wall_s"), "measured": rec.get("measured")}, indent=1))


@demo_app.command("clean")
def clean(out: Path | None = typer.Option(None, "--out", help="Demo folder (default <cache>/demo).")) -> None:
    """Delete the demo folder (models, traces, stamp)."""
    from mtpscope.demo.build import clean_demo

    with one_line_errors():
        gone = clean_demo(out)
    print(f"removed {gone}" if gone is not None else "nothing to remove", file=sys.stderr)


def _default_root() -> Path:
    from mtpscope.cache import demo_dir
    return demo_dir()


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root mtpscope app."""
    app.add_typer(demo_app, name="demo")
