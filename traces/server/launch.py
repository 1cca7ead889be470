"""Start the built llama-server on this machine with MTP on (``mtpscope server run``, the tests).

The command line (llama.cpp's own flags)::

    llama-server -m TARGET -md ASSISTANT --spec-type draft-mtp --spec-draft-n-max N --metrics
                 --host 127.0.0.1 --port PORT --parallel P --flash-attn off [EXTRA…]

``--parallel 1`` (the default P) and ``--flash-attn off`` are what mtpscope's recorder runs with (one
sequence, flash attention off), so a probe of this server and a recording of the same prompts agree token
for token; ``--parallel P`` > 1 gives P slots that decode concurrent requests in one batch (what
``probe --check-concurrency`` compares against each request alone); EXTRA
flags come last and override them (llama.cpp takes the last value of a repeated flag). Without an assistant
the server runs the target alone (no ``-md`` / ``--spec-*`` flags): the not-drafting case.

Everything the server prints (stdout and stderr, llama.cpp's log included) goes to one log file, which
``mtpscope import server-log`` reads. The server listens on 127.0.0.1 only.

Imports: ``build``, ``client``, errors.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mtpscope.errors import ServerError
from mtpscope.traces.run.record_config import DEFAULT_N_DRAFT, MAX_N_DRAFT
from mtpscope.traces.server.build import server_path
from mtpscope.traces.server.client import ServerClient

HOST = "127.0.0.1"
#: what mtpscope's recorder runs with; see the module docstring
RECORDER_FLAGS = ("--parallel", "1", "--flash-attn", "off")


def free_port(host: str = HOST) -> int:
    """A TCP port free on ``host`` right now (the kernel's choice for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_server_n_draft(n_draft: object, option: str = "--n-draft") -> int:
    """``n_draft`` as an int in 1..:data:`MAX_N_DRAFT` (llama-server's ``--spec-draft-n-max``).

    Raises:
        ServerError: not an integer, or out of range (names ``option``; expected 1..64, the value given).
    """
    if isinstance(n_draft, bool) or not isinstance(n_draft, int) or not 1 <= n_draft <= MAX_N_DRAFT:
        raise ServerError("drafts per round out of range", key=option, expected=f"an integer in 1..{MAX_N_DRAFT}",
                          actual=n_draft)
    return n_draft


def server_argv(binary: str | os.PathLike[str], target: str | os.PathLike[str],
                assistant: str | os.PathLike[str] | None, *, n_draft: int = DEFAULT_N_DRAFT, port: int,
                parallel: int = 1, extra: Sequence[str] = ()) -> list[str]:
    """The llama-server command line (see the module docstring).

    Raises:
        ServerError: ``n_draft`` outside 1..:data:`MAX_N_DRAFT` with an assistant (llama-server would start
            and draft nothing, or refuse in its log), ``parallel`` < 1.
    """
    if assistant is not None:
        check_server_n_draft(n_draft, "--n-draft")
    if int(parallel) < 1:
        raise ServerError("--parallel must be at least 1 (llama-server's slots)", key="--parallel",
                          expected=">= 1", actual=parallel)
    argv = [os.fspath(binary), "-m", os.fspath(target)]
    if assistant is not None:
        argv += ["-md", os.fspath(assistant), "--spec-type", "draft-mtp", "--spec-draft-n-max", str(int(n_draft))]
    argv += ["--metrics", "--host", HOST, "--port", str(int(port)), "--parallel", str(int(parallel)),
             *RECORDER_FLAGS[2:], *extra]
    return argv


@dataclass
class LaunchedServer:
    """A llama-server this process started.

    Attributes:
        url: ``http://127.0.0.1:PORT``.
        process: the server's process.
        log: the file holding its output.
        argv: its command line.
    """

    url: str
    process: subprocess.Popen[bytes]
    log: Path
    argv: tuple[str, ...]

    def __enter__(self) -> LaunchedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """Stop it (SIGTERM, then SIGKILL after ``timeout_s``); its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL now (a server dying mid-request)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _log_tail(log: Path, n: int = 3) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])[:400]


def launch(target: str | os.PathLike[str], assistant: str | os.PathLike[str] | None = None, *, n_draft: int = DEFAULT_N_DRAFT,
           port: int | None = None, parallel: int = 1, extra: Sequence[str] = (),
           log: str | os.PathLike[str] | None = None,
           binary: str | os.PathLike[str] | None = None, wait_s: float = 180.0) -> LaunchedServer:
    """Start llama-server (see the module docstring) and wait until ``/health`` answers ok.

    Args:
        target / assistant: GGUF paths (assistant None: no drafter, no MTP).
        n_draft: ``--spec-draft-n-max`` (1..:data:`MAX_N_DRAFT`; checked before anything starts).
        port: the port (None: a free one).
        parallel: ``--parallel`` (slots: requests the server decodes at once; 1 is the recorder's setting).
        extra: more llama-server flags, appended last.
        log: the log file (default ``llama-server-PORT.log`` in the working directory); truncated.
        binary: the llama-server to run (default the built one, :func:`mtpscope.traces.server.build.server_path`).
        wait_s: how long the model may take to load.

    Raises:
        InspectorError: a model file is not a readable GGUF (our reader's line: file, offset).
        ServerError: ``n_draft`` or ``parallel`` out of range (before anything starts: no process, no log
            file), no built server (``mtpscope server build``), a model file missing, the server exited
            before it was ready (the log's last lines quoted) or was not ready within ``wait_s``.
    """
    from mtpscope.inspector.gguf import open_gguf

    if assistant is not None:
        check_server_n_draft(n_draft)
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise ServerError("--parallel must be at least 1 (llama-server's slots)", key="--parallel",
                          expected=">= 1", actual=parallel)
    for role, p in (("target", target), ("assistant", assistant)):
        if p is not None and not Path(p).is_file():
            raise ServerError(f"{role} GGUF not found", path=p)
        if p is not None:   # our reader's line (file, offset) before llama-server's own words in a log
            open_gguf(p).close()
    if binary is None:
        binary = server_path()
        if binary is None:
            raise ServerError("llama-server is not built: run `mtpscope server build` (or `make setup`)",
                              key="llama-server")
    port = free_port() if port is None else int(port)
    log_path = Path(log) if log is not None else Path(f"llama-server-{port}.log")
    argv = server_argv(binary, target, assistant, n_draft=n_draft, port=port, parallel=parallel, extra=extra)
    with open(log_path, "wb") as fh:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    srv = LaunchedServer(f"http://{HOST}:{port}", proc, log_path, tuple(argv))
    deadline = time.monotonic() + wait_s
    with ServerClient(srv.url, timeout_s=5.0) as c:
        while True:
            if proc.poll() is not None:
                raise ServerError(f"llama-server exited with status {proc.returncode} before it was ready: "
                                  f"{_log_tail(log_path)}", path=log_path)
            try:
                if c.health().get("status") == "ok":
                    return srv
            except ServerError:
                pass
            if time.monotonic() > deadline:
                srv.stop()
                raise ServerError(f"llama-server was not ready within {wait_s:g} s: {_log_tail(log_path)}",
                                  path=log_path)
            time.sleep(0.2)


__all__ = ["HOST", "LaunchedServer", "RECORDER_FLAGS", "check_server_n_draft", "free_port", "launch", "server_argv"]
