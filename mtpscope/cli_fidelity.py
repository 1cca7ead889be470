"""CLI commands: fidelity (see mtpscope/cli.py): ``convert`` (HF -> GGUF) and ``replay`` (recompute
recorded draft steps with the numpy reference drafter under option variants)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from mtpscope.cli_common import EXIT_UNREADABLE, one_line_errors


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root mtpscope app."""

    @app.command()
    def convert(
        hf_dir: Annotated[Path, typer.Argument(help="Hugging Face checkpoint folder (config.json + *.safetensors)")],
        out: Annotated[Path, typer.Option("--out", help="GGUF file to write")],
        dialect: Annotated[str, typer.Option("--dialect", help="drafter dialect: upstream | fork")] = "upstream",
        outtype: Annotated[str, typer.Option("--outtype", help="f32 | f16 | bf16 | q8_0 (2-D weights)")] = "f32",
        centroids_out: Annotated[Path | None, typer.Option(
            "--centroids-out", help="upstream drafter: also write the centroid head to this sidecar GGUF "
                                    "(accepted by `record --centroids`)")] = None,
        vocab_from: Annotated[Path | None, typer.Option(
            "--vocab-from", help="GGUF to copy tokenizer.* keys from (default: the real Gemma 4 tokenizer, "
                                 "its first vocab_size tokens for smaller vocabularies)")] = None,
    ) -> None:
        """Convert a Gemma4AssistantForCausalLM (drafter) or Gemma4ForCausalLM (target) checkpoint to GGUF."""
        from mtpscope.inspector.convert import DIALECTS, OUTTYPES
        from mtpscope.inspector.convert import convert as do_convert

        if dialect not in DIALECTS:
            typer.echo(f"mtpscope: --dialect must be one of {', '.join(DIALECTS)}, got {dialect!r}", err=True)
            raise typer.Exit(EXIT_UNREADABLE)
        if outtype not in OUTTYPES:
            typer.echo(f"mtpscope: --outtype must be one of {', '.join(OUTTYPES)}, got {outtype!r}", err=True)
            raise typer.Exit(EXIT_UNREADABLE)
        with one_line_errors():
            r = do_convert(hf_dir, out, dialect=dialect, outtype=outtype, centroids_out=centroids_out,
                           vocab_from=vocab_from)
        what = f"{r.kind} ({r.arch}" + (f", {r.dialect} dialect" if r.dialect else "") + ")"
        typer.echo(f"wrote {r.out}: {what}, {r.n_tensors} tensors, {outtype}")
        if r.centroids_out is not None:
            typer.echo(f"wrote {r.centroids_out}: centroid head sidecar")

    @app.command()
    def replay(
        trace: Annotated[Path, typer.Argument(help="trace directory recorded by `mtpscope record`")],
        variant: Annotated[list[str] | None, typer.Option(
            "--variant", help="NAME=VALUE[,NAME=VALUE...] on top of the baseline, e.g. position=p-1, "
                              "head=centroid, head=dense, fill=min-1, hidden=prenorm, top_k=8 (repeatable)")] = None,
        out: Annotated[Path | None, typer.Option("--out", help="folder for summary.json and steps.parquet")] = None,
        target: Annotated[Path | None, typer.Option("--target", help="target GGUF (default: the manifest's)")] = None,
        assistant: Annotated[Path | None, typer.Option("--assistant", help="drafter GGUF (default: the manifest's)")] = None,
        centroids: Annotated[Path | None, typer.Option(
            "--centroids", help="centroid head source (default: the manifest's, if any)")] = None,
        max_rounds: Annotated[int | None, typer.Option("--max-rounds", help="replay only the first N rounds")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
    ) -> None:
        """Recompute every recorded draft step with the numpy reference drafter under each variant."""
        from mtpscope.traces.replay import replay as do_replay

        with one_line_errors():
            res = do_replay(trace, variants=list(variant or []), out=out, target=target, assistant=assistant,
                            centroids=centroids, max_rounds=max_rounds)
        if as_json:
            typer.echo(json.dumps(res.summary(), indent=2))
            return
        _print_replay(res)


def _print_replay(res: object) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    s = res.summary()  # type: ignore[attr-defined]
    con = Console()
    t = Table(title=f"replay of {s['trace']} ({s['n_rounds']} rounds, {s['n_steps']} steps)")
    for col in ("variant", "options", "acceptance rate", "mean acceptance length", "agreement"):
        t.add_column(col, overflow="fold")
    rec = s["recorded"]
    t.add_row("recorded", "-", f"{rec['acceptance_rate']:.4f}", f"{rec['mean_acceptance_length']:.3f}", "-")
    for name, v in s["variants"].items():
        t.add_row(escape(name), escape(v["options"]), f"{v['acceptance_rate']:.4f}", f"{v['mean_acceptance_length']:.3f}",
                  f"{v['agreement']:.4f}")
    con.print(t)
    dis = res.disagreements(limit=20)  # type: ignore[attr-defined]
    if len(dis):
        d = Table(title="steps where variants disagree (first 20)")
        for col in dis.columns:  # "draft[head=centroid]": escape, or rich reads [..] as markup
            d.add_column(escape(str(col)), overflow="fold")
        for row in dis.itertuples(index=False):
            d.add_row(*[escape(str(x)) for x in row])
        con.print(d)
    for note in s.get("notes") or []:
        con.print(f"note: {escape(note)}")
    if s.get("out"):
        con.print(f"wrote {s['out']}")
