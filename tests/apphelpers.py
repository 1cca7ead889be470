"""Start the Streamlit app the way ``make run`` does, for the HTTP and browser tests.

``make run`` runs ``.venv/bin/mtpscope app --port 8501 --address 127.0.0.1`` (which execs Streamlit
on the packaged ``app/main.py``); :func:`start_app` runs the same command on a free port and
waits for ``/_stcore/health``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class AppURL(str):
    """The base URL of a started server, carrying its process (``.proc``)."""

    def __new__(cls, url: str, proc: subprocess.Popen):
        self = super().__new__(cls, url)
        self.proc = proc
        return self


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def streamlit_cmd(port: int) -> list[str]:
    """The ``make run`` command line (``mtpscope app``) with another port."""
    return [sys.executable, "-m", "mtpscope.cli", "app", "--port", str(port)]


@contextmanager
def start_app(log_path: Path, timeout: float = 90.0, env: dict[str, str] | None = None, cmd=None,
              cwd: Path = ROOT):
    """Run the app in a subprocess; yield its base URL once ``/_stcore/health`` says ok.

    ``cmd``: a function ``port -> argv`` to start instead of :func:`streamlit_cmd`; ``cwd``: its working
    directory (the checkout by default).
    The yielded URL (a str) carries the server process as ``.proc``.

    Raises:
        RuntimeError: the server exited or did not become healthy within ``timeout`` seconds
            (the message carries the end of its log).
    """
    port = free_port()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen((cmd or streamlit_cmd)(port), cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})})
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"streamlit exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
                try:
                    with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                        if r.read().strip() == b"ok":
                            break
                except (urllib.error.URLError, OSError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"streamlit not healthy after {timeout:.0f} s: {log_path.read_text()[-2000:]}")
                time.sleep(0.3)
            yield AppURL(url, proc)
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
