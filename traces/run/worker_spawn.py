"""Starting the recording worker's process (:mod:`traces.run.record_worker`), with nothing but the standard
library: no numpy, no llama.cpp. So ``mtpscope record`` can start its worker before its own heavy imports
(:func:`prespawn`): the worker's Python start, its imports and llama.cpp's import then run while the recorder
imports the recorder, instead of after it (docs/RECORDING.md, *llama.cpp in a worker process*: start-up).

The worker process (``python -m mtpscope.traces.run.record_worker SOCK_FD STATUS_FD PARENT_PID``) gets one end
of a Unix socket pair, a 4 KiB shared status block (``memfd``) and :data:`WORKER_ENV`; its stdout and stderr
go to one pipe. It waits for its job (the ``start`` message) before it loads anything; a worker whose job
never comes ends when the parent closes its socket, and dies with the parent in any case
(``PR_SET_PDEATHSIG``).

Imports: the standard library only.
"""

from __future__ import annotations

import mmap
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

#: no debugger from ggml's abort handler: ``ggml_print_backtrace`` forks gdb / lldb unless it is set
#: (``ggml/src/ggml.c``); re-exported as :data:`traces.run.llama.process.ABORT_ENV`
ABORT_ENV = {"GGML_NO_BACKTRACE": "1"}
#: the worker's environment besides :data:`ABORT_ENV`: numpy's OpenBLAS on one thread. A BLAS call wakes
#: OpenBLAS's pool (one thread per core), whose threads then busy-wait and took the core the recorder's
#: analysis needs (measured: the worker used 2.0 CPU seconds per wall second with one llama.cpp thread).
#: llama.cpp's own threads are ``n_threads``, set per context. ``MTPSCOPE_LLAMA_LOG``: llama.cpp's log to
#: the worker's stderr, which the recorder copies to ``llama.log``.
WORKER_ENV = {"OPENBLAS_NUM_THREADS": "1", "MTPSCOPE_LLAMA_LOG": "1", "PYTHONUNBUFFERED": "1"}


@dataclass
class SpawnedWorker:
    """A started worker process waiting for its job.

    Attributes:
        proc: the process (stdout and stderr: one pipe).
        sock: the parent's end of the control socket.
        status_fd / status: the shared status block (``memfd``, 4 KiB) and its mapping.
        spawned_at: epoch seconds just before the process was started.
    """

    proc: subprocess.Popen[bytes]
    sock: socket.socket
    status_fd: int
    status: mmap.mmap
    spawned_at: float

    def discard(self) -> None:
        """Kill the process (it has loaded nothing: it waits for its job) and free the socket and status
        block. Idempotent."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if self.sock.fileno() >= 0:
            self.sock.close()
            self.status.close()
            os.close(self.status_fd)


def spawn_worker() -> SpawnedWorker:
    """Start a worker process (see the module docstring); it waits for its job.

    Raises:
        OSError: the process, socket pair or status block could not be made.
    """
    parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    status_fd = os.memfd_create("mtpscope-status") if hasattr(os, "memfd_create") else None
    if status_fd is None:  # pragma: no cover - macOS
        import tempfile

        status_fd, tmp = tempfile.mkstemp(prefix="mtpscope-status")
        os.unlink(tmp)
    os.ftruncate(status_fd, mmap.PAGESIZE)
    status = mmap.mmap(status_fd, mmap.PAGESIZE)
    env = {**os.environ, **ABORT_ENV, **WORKER_ENV}
    fds = (child_sock.fileno(), status_fd)
    spawned_at = time.time()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mtpscope.traces.run.record_worker", str(fds[0]), str(fds[1]), str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=fds, env=env)
    except BaseException:
        parent_sock.close()
        status.close()
        os.close(status_fd)
        raise
    finally:
        child_sock.close()
    return SpawnedWorker(proc, parent_sock, status_fd, status, spawned_at)


#: the worker :func:`prespawn` started for the next :class:`traces.run.record_worker.RecordWorker` of this process
_prespawned: list[SpawnedWorker] = []


def prespawn() -> None:
    """Start a worker now for the next recording of this process (``mtpscope record`` calls it before
    importing the recorder); :func:`take_prespawned` hands it over. Replaces one not taken yet."""
    discard_prespawned()
    _prespawned.append(spawn_worker())


def take_prespawned() -> SpawnedWorker | None:
    """The worker :func:`prespawn` started, if it is still waiting (else it is discarded): None when there is
    none. Each one is handed out once."""
    while _prespawned:
        w = _prespawned.pop()
        if w.proc.poll() is None:
            return w
        w.discard()
    return None


def discard_prespawned() -> None:
    """Kill a worker :func:`prespawn` started that no recording took (the command failed before it)."""
    while _prespawned:
        _prespawned.pop().discard()


__all__ = ["ABORT_ENV", "SpawnedWorker", "WORKER_ENV", "discard_prespawned", "prespawn", "spawn_worker",
           "take_prespawned"]
