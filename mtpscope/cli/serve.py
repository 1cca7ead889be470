"""``mtpscope app``: start the Streamlit app (the same server ``make run`` starts).

The app ships inside the package (``mtpscope.app``), so an installed mtpscope needs no checkout. The
server settings that a checkout keeps in ``.streamlit/config.toml`` are passed as flags here, so the
app behaves the same from any working directory (and a user's own Streamlit config cannot loosen them).

Safe by default when served: the server listens on 127.0.0.1 and accepts only loopback Host names.
Any other ``--address`` is refused unless ``MTPSCOPE_ROOTS`` names the folders to expose; the server
then reads only those (and the uploads folder), and one line on stderr says what is exposed
(``mtpscope.app.safety.serve_plan``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

import typer

#: Streamlit settings of every mtpscope server (mirrors .streamlit/config.toml; maxUploadSize in MiB
#: must match mtpscope.app.safety.MAX_UPLOAD_BYTES). XSRF and CORS protection stay on.
SERVER_FLAGS = (
    "--server.headless", "true",
    "--server.runOnSave", "false",
    "--server.fileWatcherType", "none",
    "--server.maxUploadSize", "256",
    "--server.enableXsrfProtection", "true",
    "--server.enableCORS", "true",
    "--browser.gatherUsageStats", "false",
    "--client.toolbarMode", "minimal",
    "--theme.base", "light",
)

DEFAULT_ADDRESS = "127.0.0.1"


def main_script() -> Path:
    """Path of the app's entry script (``app/main.py`` as installed; ``app/main.py`` in a checkout)."""
    import mtpscope.app

    return Path(mtpscope.app.__file__).resolve().parent / "main.py"


def streamlit_argv(port: int, address: str, allowed_hosts: Sequence[str] = ()) -> list[str]:
    """The command line that serves the app on ``address:port``: ``streamlit run`` through
    :mod:`mtpscope.app.launch` (which warms the process first: :mod:`mtpscope.app.warmup`); ``allowed_hosts``:
    Streamlit's ``server.allowedHosts`` (Host names the server accepts; ``*`` any)."""
    hosts = [a for h in allowed_hosts for a in ("--server.allowedHosts", h)]
    return [sys.executable, "-m", "mtpscope.app.launch", "run", str(main_script()), "--server.port", str(port),
            "--server.address", address, *hosts, *SERVER_FLAGS]


def register(app: typer.Typer) -> None:
    """Add the ``app`` command to the CLI."""

    @app.command("app")
    def app_cmd(
        port: int = typer.Option(8501, "--port", min=1, max=65535, help="TCP port to serve on."),
        address: str = typer.Option(
            DEFAULT_ADDRESS, "--address",
            help="Address to listen on. Default 127.0.0.1: this machine only (use SSH port forwarding "
                 "from elsewhere). Any other address needs MTPSCOPE_ROOTS set to the folders to expose."),
    ) -> None:
        """Start the mtpscope app (Streamlit) on the demo and your allowed folders."""
        from mtpscope.app import safety
        from mtpscope.cli.common import one_line_errors

        with one_line_errors():
            plan = safety.serve_plan(address, port)
        line = plan.exposure_line()
        if line:
            typer.echo(f"mtpscope: {line}", err=True)
        argv = streamlit_argv(port, address, plan.allowed_hosts)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(argv[0], argv, {**os.environ, **dict(plan.env)})
