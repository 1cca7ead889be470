"""Building the package's small C sources into shared libraries in the cache, on first use (no build step at
install time, no compiler needed to run: every caller keeps a Python path and says why it is in use).

A library is ``<cache>/native/<stem>-<first 16 hex of sha256(source + flags)>.so``: a changed source or
changed flags make a new file. The build is ``$CC`` (default ``cc``) ``FLAGS -shared -fPIC``, written to a
temporary file beside the target and renamed into place (several processes may build at once).

Used by :mod:`traces.run.llama.native_capture` (``capture.c``) and :mod:`traces.run.row_kernels`
(``rowstats.c``), each loaded once per process with :func:`load_once`.

Imports: ctypes, hashlib, shutil, subprocess, tempfile, mtpscope.cache, mtpscope.errors.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mtpscope.cache import cache_dir
from mtpscope.errors import TraceError

#: seconds a compile may take
COMPILE_TIMEOUT_S = 120


def library_path(source: Path, flags: Sequence[str]) -> Path:
    """Where ``source`` built with ``flags`` lives: ``<cache>/native/<source stem>-<16 hex>.so``, the hex
    digits from sha256 of the source's bytes and the flags."""
    h = hashlib.sha256(source.read_bytes())
    h.update("\0".join(flags).encode())
    return cache_dir() / "native" / f"{source.stem}-{h.hexdigest()[:16]}.so"


def build(source: Path, flags: Sequence[str], path: Path | None = None, *, what: str) -> Path:
    """Compile ``source`` with ``flags`` into ``path`` (default :func:`library_path`) unless it is there already.

    Args:
        source: a C file of the package.
        flags: compiler flags before ``-shared -fPIC`` (e.g. ``["-O2"]``).
        path: where the library goes.
        what: what the library is, for the messages ("the native capture").

    Returns:
        the library's path.

    Raises:
        TraceError: no C compiler (``$CC`` or ``cc`` not on PATH), or the compiler failed (its first error
            line quoted); no file is left behind.
    """
    path = library_path(source, flags) if path is None else path
    if path.exists():
        return path
    cc = os.environ.get("CC") or "cc"
    exe = shutil.which(cc)
    if exe is None:
        raise TraceError(f"no C compiler for {what}", key="CC", expected="a C compiler on PATH", actual=cc)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.stem + ".", suffix=".tmp.so", dir=path.parent)
    os.close(fd)
    try:
        proc = subprocess.run([exe, *flags, "-shared", "-fPIC", "-o", tmp, os.fspath(source)],
                              capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False)
        if proc.returncode != 0:
            first = next((ln for ln in proc.stderr.splitlines() if "error" in ln),
                         next((ln for ln in proc.stderr.splitlines() if ln.strip()), f"exit status {proc.returncode}"))
            raise TraceError(f"the C compiler failed on {source.name}: {first}", key="CC", path=source)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def load_once(state: dict[str, Any], switch: str, open_built: Callable[[], ctypes.CDLL]) -> ctypes.CDLL | None:
    """A library loaded once per process: ``state["lib"]`` once tried (None when it could not be), and
    ``state["why"]`` the reason then; ``switch`` (an environment variable) set to ``"0"`` turns it off.

    Args:
        state: the caller's module-level dict (tests reset it).
        switch: the environment variable's name.
        open_built: builds (if needed) and opens the library, its functions declared; may raise TraceError,
            OSError or SubprocessError, which become ``state["why"]``.
    """
    if "lib" in state:
        cached: ctypes.CDLL | None = state["lib"]
        return cached
    lib = None
    if os.environ.get(switch, "1") == "0":
        state["why"] = f"{switch}=0"
    else:
        try:
            lib = open_built()
        except (TraceError, OSError, subprocess.SubprocessError) as e:
            state["why"] = str(e)
            lib = None
    state["lib"] = lib
    return lib


__all__ = ["COMPILE_TIMEOUT_S", "build", "library_path", "load_once"]
