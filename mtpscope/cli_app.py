"""``mtpscope app``: start the Streamlit app (the same server ``make run`` starts).

The app ships inside the package (``mtpscope.app``), so an installed mtpscope needs no checkout. The
server settings that a checkout keeps in ``.streamlit/config.toml`` are passed as flags here, so the
app behaves the same from any working directory.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

#: Streamlit settings of every mtpscope server (mirrors .streamlit/config.toml; maxUploadSize in MiB
#: must match mtpscope.app.safety.MAX_UPLOAD_BYTES).
SERVER_FLAGS = (
    "--server.headless", "true",
    "--server.runOnSave", "false",
    "--server.fileWatcherType", "none",
    "--server.maxUploadSize", "256",
    "--browser.gatherUsageStats", "false",
    "--client.toolbarMode", "minimal",
    "--theme.base", "light",
)


def main_script() -> Path:
    """Path of the app's entry script (``mtpscope/app/main.py`` as installed; ``app/main.py`` in a checkout)."""
    import mtpscope.app

    return Path(mtpscope.app.__file__).resolve().parent / "main.py"


def streamlit_argv(port: int, address: str) -> list[str]:
    """The command line that serves the app on ``address:port``."""
    return [sys.executable, "-m", "streamlit", "run", str(main_script()), "--server.port", str(port),
            "--server.address", address, *SERVER_FLAGS]


def register(app: typer.Typer) -> None:
    """Add the ``app`` command to the CLI."""

    @app.command("app")
    def app_cmd(
        port: int = typer.Option(8501, "--port", min=1, max=65535, help="TCP port to serve on."),
        address: str = typer.Option("127.0.0.1", "--address",
                                    help="Address to listen on (default: this machine only)."),
    ) -> None:
        """Start the mtpscope app (Streamlit) on the demo and your allowed folders."""
        argv = streamlit_argv(port, address)
        os.execv(argv[0], argv)
