"""CLI command: ``diagnose`` (docs/DIAGNOSE.md): every check of a drafter / target pair in order, the findings
ranked worst first as text, ``--json`` or a one-file ``--html`` report; exit 1 when a defect is found."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, cast

import typer

from mtpscope.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_UNREADABLE,
    gguf_path,
    model_path,
    n_draft_option,
    one_line_errors,
    out_file,
    out_folder,
    replaces_words,
)
from mtpscope.traces.diagnose.config import MAX_TOKENS

if TYPE_CHECKING:
    from mtpscope.traces.diagnose.records import Diagnosis
    from mtpscope.traces.run.prompts import PromptSpec

#: Where the results go without --out.
DEFAULT_OUT = "mtpscope-diagnose"


def demo_prompts() -> list[PromptSpec]:
    """The demo's 36 categorised prompts (code, prose, json, numbers, chat, random; Gemma 4 token ids), used when
    neither ``--prompts`` nor ``--trace`` is given."""
    from mtpscope.demo.spec import TRAINED_DATA
    from mtpscope.traces.run.prompts import PromptSpec

    doc = json.loads((TRAINED_DATA / "prompts.json").read_text(encoding="utf-8"))
    return [PromptSpec(tokens=tuple(int(t) for t in p["ids"]), id=str(p["name"]), category=str(p["category"]))
            for p in doc["prompts"]]


def absolute(path: str | os.PathLike[str]) -> Path:
    """``path`` from the root (``os.path.abspath``: the working folder joined in front, ``..`` folded; symbolic
    links kept as given)."""
    return Path(os.path.abspath(os.fspath(path)))


def _absolute(path: Path | None) -> Path | None:
    return None if path is None else absolute(path)


def format_text(d: Diagnosis, *, base: str) -> str:
    """The diagnosis (a :class:`~mtpscope.traces.diagnose.records.Diagnosis`) as terminal text: the verdict, the
    findings worst first (evidence, fix, view at ``base``), what limits acceptance, the steps and notes."""
    from mtpscope.app.diagnose_report import finding_lines

    lines = [f"drafter {d.assistant}", f"target  {d.target}", f"trace   {d.trace or '-'}"]
    lines += [f"warning: {m}" for m in d.model_mismatch]      # before any figure of the trace: they describe another
    sm = d.summary
    if sm.acceptance_rate is not None:
        lines.append(f"acceptance rate {sm.acceptance_rate:.3f} ({sm.n_accepted} / {sm.n_drafted}), "
                     f"mean acceptance length {sm.mean_acceptance_length or 0:.2f}, n_draft {sm.n_draft}")
    lines += ["", ("DEFECT: " if d.defects else "no defect: ") + str(d.headline), ""]
    lines += finding_lines(d.findings, base=base) or ["no findings"]
    if d.limits:
        lines += ["", "What limits acceptance:"] + [f"  - {x}" for x in d.limits]
    lines += ["", "steps: " + ", ".join(f"{st.name} {st.seconds:.1f} s" if st.status == "ran"
                                         else f"{st.name} {st.status}" for st in d.steps)]
    if d.notes:
        lines += ["notes:"] + [f"  - {n}" for n in d.notes]
    return "\n".join(lines)


def runtime_choice(value: str) -> str:
    """``--runtime`` (parsed first: it is eager): ``llama`` or a key of
    :data:`mtpscope.traces.diagnose.runtimes.RUNTIMES`, else one line, exit 2."""
    from mtpscope.traces.diagnose.runtimes import RUNTIMES

    if value != "llama" and value not in RUNTIMES:
        print(f"mtpscope: --runtime must be {' or '.join(['llama', *RUNTIMES])} (got {value!r})", file=sys.stderr)
        raise typer.Exit(EXIT_UNREADABLE)
    return value


def _refuse(message: str) -> NoReturn:
    print(f"mtpscope: {message}", file=sys.stderr)
    raise typer.Exit(EXIT_UNREADABLE)


def register(app: typer.Typer) -> None:
    """Add this module's command to the root ``mtpscope`` app."""

    @app.command("diagnose")
    def diagnose_cmd(
        runtime: str = typer.Option(
            "llama", "--runtime", is_eager=True, callback=runtime_choice,
            help="Which loop is diagnosed: 'llama' (llama.cpp, GGUF files; default), 'mlx' (mlx-vlm's own MTP loop) "
                 "or 'hf' (HF transformers' assisted generation), the last two on Hugging Face checkpoint folders, "
                 "compared with the llama.cpp trace --against; "
                 "docs/DIAGNOSE.md)."),
        target: Path | None = typer.Option(None, "--target", callback=model_path,
                                              help="Target GGUF (default with --trace: the trace's own); with "
                                                   "--runtime mlx / hf an HF checkpoint folder."),
        assistant: Path | None = typer.Option(None, "--assistant", callback=model_path,
                                                 help="Drafter GGUF (default with --trace: the trace's own); with "
                                                      "--runtime mlx / hf an HF checkpoint folder."),
        against: Path | None = typer.Option(
            None, "--against", help="With --runtime mlx / hf: a llama.cpp trace of the same pair (its GGUFs are verified) "
                                    "and prompts (the default prompts), compared round by round."),
        prompts: Path | None = typer.Option(
            None, "--prompts", help="Prompts file to record (docs/EXPLAIN.md §6; default: the demo's 36 categorised "
                                    "prompts)."),
        trace: Path | None = typer.Option(None, "--trace", help="Diagnose this recorded trace instead of recording."),
        reference: Path | None = typer.Option(
            None, "--reference", help="A Hugging Face checkpoint of the drafter to compare with (converted, then "
                                      "replayed through the reference drafter)."),
        reference_assistant: Path | None = typer.Option(
            None, "--reference-assistant", callback=gguf_path, help="A known good drafter GGUF to compare with."),
        centroids: Path | None = typer.Option(
            None, "--centroids", help="The drafter's centroid head (sidecar / fork GGUF, or HF folder): recorded "
                                      "beside the dense head, and the replay tries drafting with it."),
        n_draft: int = n_draft_option("Drafts per round of the recording"),
        max_tokens: int = typer.Option(MAX_TOKENS, "--max-tokens", min=1, help="Generated tokens per prompt."),
        out: Path = typer.Option(Path(DEFAULT_OUT), "--out", callback=out_folder,
                                 help="Output folder: the recording, the replays, diagnosis.json (made absolute: "
                                      "the paths and links written name it from the root)."),
        html_out: Path | None = typer.Option(None, "--html", callback=out_file, help="Write the one-file HTML report here."),
        as_json: bool = typer.Option(False, "--json", help="Print the diagnosis as JSON (docs/DIAGNOSE.md)."),
        no_replay: bool = typer.Option(False, "--no-replay", help="Skip the replays (steps 5 and 6)."),
        app_url: str = typer.Option("http://127.0.0.1:8501", "--app-url",
                                    help="The app's address, for the findings' links (`mtpscope app`)."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines on stderr."),
    ) -> None:
        """Check a drafter / target pair from every side and rank what is wrong, worst first.

        Runs verify (with the runtime verdicts), the metadata against the published Gemma 4 configurations, a
        recording (or --trace), explain, a replay under each convention variant, with a reference the same
        rounds through it, and the advice. Exit 1 when a defect is found, 0 when none, 2 on unreadable input.
        """
        from mtpscope.traces.diagnose.config import DiagnoseConfig
        from mtpscope.traces.diagnose.run import DIAGNOSIS_FILE, diagnose

        if runtime != "llama":
            if trace is not None or reference is not None or reference_assistant is not None or centroids is not None:
                _refuse(f"--runtime {runtime} records the pair itself: --trace, --reference, --reference-assistant "
                        "and --centroids are for llama.cpp")
            if target is None or assistant is None or against is None:
                _refuse(f"--runtime {runtime} needs --target and --assistant (HF checkpoint folders) and --against "
                        "(a llama.cpp trace of the same pair and prompts)")
        elif against is not None:
            _refuse("--against goes with --runtime mlx or hf (a llama.cpp diagnosis records or reads its own trace)")
        if prompts is not None and trace is not None:
            print("mtpscope: give --prompts or --trace, not both", file=sys.stderr)
            raise typer.Exit(EXIT_UNREADABLE)
        if reference is not None and reference_assistant is not None:
            print("mtpscope: give --reference or --reference-assistant, not both", file=sys.stderr)
            raise typer.Exit(EXIT_UNREADABLE)

        def say(step: str, message: str) -> None:
            if not quiet:
                print(f"[{step}] {message}", file=sys.stderr, flush=True)

        # every path the diagnosis writes (diagnosis.json, the links, the text) names the file from the root, so
        # that it still works from another folder (the app starts wherever it is started); --prompts stays as
        # given (it is read here, not written anywhere, and its errors read as `record --prompts`'s)
        out = absolute(out)
        target, assistant, trace = _absolute(target), _absolute(assistant), _absolute(trace)
        centroids, html_out = _absolute(centroids), _absolute(html_out)
        reference, reference_assistant = _absolute(reference), _absolute(reference_assistant)
        with one_line_errors(EXIT_UNREADABLE):
            specs: list[PromptSpec] | None
            if prompts is not None:       # bad input first: read and check the whole file before anything runs
                from mtpscope.traces.run.prompts import read_prompt_specs

                specs = read_prompt_specs(prompts)
            elif runtime != "llama":
                specs = None
                say("record", f"no --prompts: the prompts of {against}")
            else:
                specs = demo_prompts() if trace is None else None
                if specs is not None:
                    say("record", f"no --prompts: the demo's {len(specs)} categorised prompts")
            # (said once the input is known good: a bad prompts file is one line and nothing else)
            from mtpscope.traces.diagnose.run import check_out

            check_out(out)
            written = [DIAGNOSIS_FILE] + ([] if trace is not None else ["the recording"]) + \
                ([] if no_replay else ["the replays"])
            say("out", f"{', '.join(written[:-1])} and {written[-1]} go to {out}" if len(written) > 1 else
                f"{written[0]} goes to {out}")
            if out == absolute(Path(DEFAULT_OUT)):
                say("out", "(the default folder, in the current directory; --out chooses another)")
            replaces = replaces_words("diagnosis", out / DIAGNOSIS_FILE)     # (re-running replaces it: say so)
            if replaces is not None:
                say("out", replaces)
            # centroids as the str the config keeps anyway (RecordConfig stores os.fspath of a path)
            cfg = DiagnoseConfig(n_draft=n_draft, max_tokens=max_tokens,
                                 centroids=None if centroids is None else os.fspath(centroids), replay=not no_replay)
            if runtime != "llama":
                from mtpscope.cache import cache_dir
                from mtpscope.traces.diagnose.runtimes import diagnose_runtime

                d = diagnose_runtime(cfg, runtime=runtime, target=cast(Path, target), assistant=cast(Path, assistant),
                                     against=cast(Path, _absolute(against)), prompts=specs, out=out,
                                     work_dir=cache_dir() / runtime, command=list(sys.argv), on_step=say)
            else:
                d = diagnose(cfg, target=target, assistant=assistant, trace=trace, prompts=specs,
                             reference_hf=reference, reference_assistant=reference_assistant, out=out,
                             command=list(sys.argv), on_step=say)
            if html_out is not None:
                from mtpscope.app.diagnose_report import html_report

                html_out.parent.mkdir(parents=True, exist_ok=True)
                html_out.write_text(html_report(d, base=app_url), encoding="utf-8")
                say("html", f"report written to {html_out}")
            if as_json:
                from mtpscope.app.diagnose_report import document

                text = json.dumps(document(d, app_url), indent=2, default=str)
            else:
                text = format_text(d, base=app_url)
        typer.echo(text)
        raise typer.Exit(EXIT_FINDINGS if d.defects else EXIT_OK)
