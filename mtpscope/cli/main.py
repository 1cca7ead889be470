"""The ``mtpscope`` command line (typer).

Sub-commands live in one module per area so that each can grow on its own; every module exposes
``register(app)``. Heavy imports (numpy, pyarrow, llama_cpp) happen inside the commands, so
``mtpscope --help`` stays fast and works without llama-cpp-python.

Exit codes: 0 success, 1 the input is readable but has errors (e.g. ``verify`` findings),
2 the input is unreadable (one line on stderr).
"""

from __future__ import annotations

from typing import Any

import typer

from mtpscope.cli import demo as cli_demo
from mtpscope.cli import diagnose as cli_diagnose
from mtpscope.cli import estimate as cli_estimate
from mtpscope.cli import explain as cli_explain
from mtpscope.cli import fidelity as cli_fidelity
from mtpscope.cli import inspect as cli_inspect
from mtpscope.cli import quantize as cli_quantize
from mtpscope.cli import record as cli_record
from mtpscope.cli import report as cli_report
from mtpscope.cli import serve as cli_serve
from mtpscope.cli import server as cli_server
from mtpscope.cli import sweep as cli_sweep
from mtpscope.cli import trace as cli_trace
from mtpscope.cli import verify as cli_verify
from mtpscope.cli.common import interrupted_words, stacks_on_sigusr1, stop_signals_as_interrupt

app = typer.Typer(
    name="mtpscope",
    help="Inspector and tracer for Gemma 4 MTP (assistant) drafters in llama.cpp / GGUF.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)



@app.callback()
def _root() -> None:
    """Inspector and tracer for Gemma 4 MTP (assistant) drafters in llama.cpp / GGUF."""


@app.command("version")
def version() -> None:
    """Print the versions of mtpscope and of the libraries it reads and runs with."""
    from importlib import metadata

    for dist in ("mtpscope", "gguf", "llama-cpp-python", "streamlit", "pyarrow", "duckdb"):
        try:
            v = metadata.version(dist)
        except metadata.PackageNotFoundError:
            v = "not installed"
        typer.echo(f"{dist} {v}")


for _module in (cli_inspect, cli_verify, cli_report, cli_trace, cli_record, cli_demo, cli_fidelity, cli_serve,
                cli_explain, cli_sweep, cli_estimate, cli_server, cli_quantize, cli_diagnose):
    _module.register(app)


EXIT_INTERNAL = 3


#: columns of the help when it does not go to a terminal (piped to ``less``, a file, CI logs): rich's 80 squeeze the
#: options' help into a column a word wide
PIPED_HELP_COLUMNS = 120


def help_width() -> None:
    """The help's width: a terminal's own, else :data:`PIPED_HELP_COLUMNS` (``COLUMNS`` or ``TERMINAL_WIDTH``
    in the environment win)."""
    import os
    import sys

    from typer import rich_utils

    if rich_utils.MAX_WIDTH is None and not os.environ.get("COLUMNS") and not sys.stdout.isatty():
        rich_utils.MAX_WIDTH = PIPED_HELP_COLUMNS


def main() -> None:
    """Console-script entry point.

    Expected bad input is reported by each command as one line (exit 2, see ``mtpscope.cli.common``). Anything
    else that escapes a command is a bug in mtpscope: it is still reported as one line naming the
    exception (exit 3), and ``MTPSCOPE_DEBUG=1`` shows the full traceback.
    """
    import os
    import sys

    help_width()
    stacks_on_sigusr1()
    try:
        with stop_signals_as_interrupt():         # SIGTERM / SIGHUP stop a command as a Ctrl-C does, saying so
            code = app(prog_name="mtpscope", standalone_mode=False)   # a usage error comes back here: one line below
    except SystemExit:
        raise
    except KeyboardInterrupt:
        line, status = interrupted_words()
        print(f"mtpscope: {line}", file=sys.stderr)
        raise SystemExit(status) from None
    except Exception as e:
        kinds = {c.__name__ for c in type(e).__mro__}    # click's classes, or typer's copy of them
        if "Exit" in kinds:
            raise SystemExit(getattr(e, "exit_code", 0)) from None
        if "Abort" in kinds:
            line, status = interrupted_words()
            print(f"mtpscope: {line}", file=sys.stderr)
            raise SystemExit(status) from None
        if "NoArgsIsHelpError" in kinds:              # a command group run bare: its help and exit 2, as before
            app(args=[*sys.argv[1:], "--help"], prog_name="mtpscope", standalone_mode=False)
            raise SystemExit(2) from None
        if "ClickException" in kinds:                 # a bad option or value, an unknown command: one line
            print(usage_line(e), file=sys.stderr)
            raise SystemExit(getattr(e, "exit_code", 2)) from None
        if os.environ.get("MTPSCOPE_DEBUG"):        # the last line of defence against a traceback
            raise
        print(f"mtpscope: internal error ({type(e).__name__}: {e}); this is a bug in mtpscope, "
              "please report it with MTPSCOPE_DEBUG=1 output", file=sys.stderr)
        raise SystemExit(EXIT_INTERNAL) from None
    if isinstance(code, int) and code:            # --help and the like end through click with their code
        raise SystemExit(code)


def usage_line(e: Any) -> str:
    """A usage error (click's ``ClickException``, or typer's copy of it: a bad option or value, an unknown
    command) as the one line
    ``mtpscope <command>: <what is wrong> (see mtpscope <command> --help)``; click's own text, its lines joined."""
    path = getattr(getattr(e, "ctx", None), "command_path", None)
    where = path if isinstance(path, str) and path else "mtpscope"
    what = " ".join(line.strip() for line in str(e.format_message()).splitlines() if line.strip())
    return f"{where}: {what} (see {where} --help)"


if __name__ == "__main__":
    main()
