"""CLI commands: fidelity (see mtpscope/cli/main.py): ``convert`` (HF -> GGUF) and ``replay`` (recompute
recorded draft steps with the numpy reference drafter under option variants)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mtpscope.cli.common import (
    EXIT_FINDINGS,
    EXIT_UNREADABLE,
    MISSING,
    fmt,
    gguf_path,
    one_line_errors,
    out_file,
    out_folder,
    replaces_words,
)

if TYPE_CHECKING:
    from mtpscope.traces.run.replay import ReplaySummary


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root mtpscope app."""

    @app.command()
    def convert(
        hf_dir: Annotated[Path, typer.Argument(help="Hugging Face checkpoint folder (config.json + *.safetensors)")],
        out: Annotated[Path, typer.Option("--out", callback=out_file, help="GGUF file to write")],
        dialect: Annotated[str, typer.Option("--dialect", help="drafter dialect: upstream | fork")] = "upstream",
        outtype: Annotated[str, typer.Option("--outtype", help="f32 | f16 | bf16 | q8_0 (2-D weights)")] = "f32",
        centroids_out: Annotated[Path | None, typer.Option(
            "--centroids-out", callback=out_file,
            help="upstream drafter: also write the centroid head to this sidecar GGUF "
                 "(accepted by `record --centroids`)")] = None,
        vocab_from: Annotated[Path | None, typer.Option(
            "--vocab-from", help="GGUF to copy tokenizer.* keys from (default: the real Gemma 4 tokenizer, "
                                 "its first vocab_size tokens for smaller vocabularies)")] = None,
        overwrite: Annotated[bool, typer.Option("--overwrite", help="replace an existing --out / --centroids-out")] = False,
    ) -> None:
        """Convert a Gemma4AssistantForCausalLM (drafter) or Gemma4ForCausalLM / Gemma4ForConditionalGeneration
        (target: dense, K = V, per-layer embeddings with KV-shared layers, or MoE) checkpoint to GGUF."""
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
                           vocab_from=vocab_from, overwrite=overwrite)
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
        out: Annotated[Path | None, typer.Option("--out", callback=out_folder,
                                                 help="folder for summary.json and steps.parquet")] = None,
        target: Annotated[Path | None, typer.Option("--target", callback=gguf_path,
                                                    help="target GGUF (default: the manifest's)")] = None,
        assistant: Annotated[Path | None, typer.Option("--assistant", callback=gguf_path,
                                                       help="drafter GGUF (default: the manifest's)")] = None,
        centroids: Annotated[Path | None, typer.Option(
            "--centroids", help="centroid head source (default: the manifest's, if any)")] = None,
        max_rounds: Annotated[int | None, typer.Option("--max-rounds", help="replay only the first N rounds")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
    ) -> None:
        """Recompute every recorded draft step with the numpy reference drafter under each variant. With
        --out, a replay already in that folder is replaced (said first, on stderr); a folder holding anything
        else is refused."""
        from mtpscope.traces.run.replay import replay as do_replay
        from mtpscope.traces.run.replay_folder import SUMMARY_FILE, check_replay_out

        with one_line_errors():          # a folder holding something else: refused before anything is said
            replaces = None if out is None or not check_replay_out(out) else replaces_words("replay", out / SUMMARY_FILE)
        if replaces is not None:
            typer.echo(f"mtpscope: {out}: {replaces}", err=True)

        with one_line_errors():
            res = do_replay(trace, variants=list(variant or []), out=out, target=target, assistant=assistant,
                            centroids=centroids, max_rounds=max_rounds)
        for w in res.warnings:          # parts skipped: the replay covers the rest; exit 1 as `report` does
            typer.echo(f"warning: {w}", err=True)
        if as_json:
            typer.echo(json.dumps(res.summary().to_dict(), indent=2))
            if res.warnings:
                raise typer.Exit(EXIT_FINDINGS)
            return
        from mtpscope.traces.analysis.explain_report import token_label
        from mtpscope.traces.analysis.vocab import trace_vocab
        from mtpscope.traces.store.reader import read_manifest

        try:  # token text next to ids; ids alone when no vocabulary reads
            vocab = trace_vocab(read_manifest(trace), target)
        except Exception:  # noqa: BLE001 - the text is a convenience, never a reason to fail
            vocab = None
        typer.echo(format_replay(res.summary(), res.disagreements(), token_label(vocab) if vocab else None))
        if res.warnings:
            raise typer.Exit(EXIT_FINDINGS)


#: Steps listed where the variants disagree; characters of token text shown per token.
MAX_DISAGREEMENTS, TOKEN_CHARS = 20, 24
AGREEMENT_WORDS = ("agreement = share of the recorded draft steps where the variant drafts the same token as "
                   "the recording (1.0000: identical drafts)")


def _token(t: Any, label) -> str:
    """``1651 “ seven”``: the id (any cell value: an int, a numpy int, None), then its text (cut to TOKEN_CHARS)
    when a vocabulary is there."""
    try:
        i = int(t)
    except (TypeError, ValueError):
        return "?"
    if i < 0:
        return "? (unknown)"
    if label is None:
        return str(i)
    from mtpscope.traces.analysis.wording import visible

    text = visible(label(i))
    return f"{i} “{text if len(text) <= TOKEN_CHARS else text[:TOKEN_CHARS - 1] + '…'}”"


def format_replay(s: ReplaySummary, dis, label=None) -> str:
    """A replay summary (:class:`mtpscope.traces.run.replay.ReplaySummary`) and its disagreeing steps
    (``disagreements()``) as plain text for a terminal: a rate table, what agreement means, the variants this
    trace cannot tell apart, then one block per disagreeing step with token ids and their text (``label``:
    id -> text); every line is a few words, so nothing splits an id at 80 columns."""
    from mtpscope.traces.analysis.wording import plural

    lines = [f"replay of {s.trace}: {plural(s.n_rounds, 'round')}, {plural(s.n_steps, 'step')}"]
    for m in s.model_mismatch:       # first: every figure below describes another model
        lines += _wrap(f"warning: {m}")
    lines.append("")
    names = ["recorded", *s.variants]
    w = max(len(n) for n in names)
    lines.append(f"{'variant':<{w}}  acceptance rate  mean acceptance length  agreement")
    rec = s.recorded

    lines.append(f"{'recorded':<{w}}  {fmt(rec.acceptance_rate, '.4f'):>15}  "
                 f"{fmt(rec.mean_acceptance_length, '.3f'):>22}  {MISSING:>9}")
    for name, v in s.variants.items():
        lines.append(f"{name:<{w}}  {fmt(v.acceptance_rate, '.4f'):>15}  {fmt(v.mean_acceptance_length, '.3f'):>22}"
                     f"  {fmt(v.agreement, '.4f'):>9}")
    opts = [(n, v.options) for n, v in s.variants.items() if v.options not in ("-", n)]
    for n, o in opts:
        lines.append(f"  {n}: {o}")
    lines += ["", *_wrap(AGREEMENT_WORDS)]
    for a, b in s.indistinguishable or ():
        lines += _wrap(f"note: this trace cannot tell {b} from {a}: both draft the same token at every one of "
                       f"the {plural(s.n_steps, 'replayed step')}")
    if dis is not None and len(dis):
        cols = [c for c in dis.columns if c.startswith("draft[")]
        lines += ["", f"steps where the variants disagree (first {min(len(dis), MAX_DISAGREEMENTS)} of {len(dis)}):"]
        for r in dis.head(MAX_DISAGREEMENTS).to_dict(orient="records"):
            truth = r.get("truth")
            lines.append(f"prompt {r['prompt_id']} · round {r['round']} · k={r['k']} · target {_token(truth, label)}")
            for name, col in (("recorded", "recorded"), *((c[len('draft['):-1], c) for c in cols)):
                mark = "✓" if r.get(col) == truth and truth is not None and int(truth) >= 0 else " "
                lines.append(f"  {mark} {name:<{w}}  {_token(r.get(col), label)}")
    for note in s.notes:
        lines += _wrap(f"note: {note}")
    if s.out:
        lines.append(f"wrote {s.out}")
    return "\n".join(lines)


def _wrap(text: str, width: int = 80) -> list[str]:
    """A sentence on lines of at most ``width`` columns, broken between words only."""
    import textwrap

    return textwrap.wrap(text, width=width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
