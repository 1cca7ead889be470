"""The ``mtpscope`` command line (typer).

Sub-commands live in one module per area so that each can grow on its own; every module exposes
``register(app)``. Heavy imports (numpy, pyarrow, llama_cpp) happen inside the commands, so
``mtpscope --help`` stays fast and works without llama-cpp-python.

Exit codes: 0 success, 1 the input is readable but has errors (e.g. ``verify`` findings),
2 the input is unreadable (one line on stderr).
"""

from __future__ import annotations

import typer

from mtpscope import cli_demo, cli_fidelity, cli_inspect, cli_record, cli_traces, cli_verify

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


for _module in (cli_inspect, cli_verify, cli_traces, cli_record, cli_demo, cli_fidelity):
    _module.register(app)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
