"""The cache folder for generated data (demo models, demo trace, the real tokenizer GGUF).

Nothing here is ever committed to git. The folder is ``$MTPSCOPE_CACHE`` if set, else
``$XDG_CACHE_HOME/mtpscope``, else ``~/.cache/mtpscope``.

The only thing ever fetched is the real Gemma 4 tokenizer GGUF, ``ggml-vocab-gemma-4.gguf``, which ships
inside the llama-cpp-python 0.3.36 source distribution (``vendor/llama.cpp/models/``). It is fetched by
``pip download`` from the package registry at set-up time (never at run time of the app or the
inspector), checked by sha256 and cached.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from inspector.errors import MtpscopeError

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
VOCAB_NAME = "ggml-vocab-gemma-4.gguf"
VOCAB_MEMBER = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/models/{VOCAB_NAME}"
VOCAB_SIZE_BYTES = 15_776_467
VOCAB_SHA256 = "58b1ba0b57f3b4d7c468ba4ffd91ad85190346a3d7ad7e71d1cabaae8a14bb65"


def cache_dir() -> Path:
    """The cache root (created if missing)."""
    env = os.environ.get("MTPSCOPE_CACHE")
    if env:
        root = Path(env)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg) if xdg else Path.home() / ".cache") / "mtpscope"
    root.mkdir(parents=True, exist_ok=True)
    return root


def demo_dir() -> Path:
    """Where ``mtpscope demo build`` writes by default: ``<cache>/demo``."""
    return cache_dir() / "demo"


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in ``chunk``-byte pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def vocab_path(fetch: bool = True) -> Path:
    """Path of the real ``ggml-vocab-gemma-4.gguf`` in the cache, fetching it once if allowed.

    Raises:
        MtpscopeError: the file is missing and ``fetch`` is False, the download failed, or the
            file's sha256 differs from the pinned one.
    """
    dest = cache_dir() / "vocab" / VOCAB_NAME
    if dest.exists() and dest.stat().st_size == VOCAB_SIZE_BYTES and sha256_file(dest) == VOCAB_SHA256:
        return dest
    if not fetch:
        raise MtpscopeError("the real Gemma 4 tokenizer GGUF is not in the cache; run `make setup`",
                            path=dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        sdist = _download_sdist(Path(tmp))
        with tarfile.open(sdist, "r:gz") as tar:
            try:
                member = tar.getmember(VOCAB_MEMBER)
            except KeyError as e:
                raise MtpscopeError("tokenizer GGUF not found in the sdist", path=sdist,
                                    key=VOCAB_MEMBER) from e
            src = tar.extractfile(member)
            if src is None:
                raise MtpscopeError("sdist member is not a regular file", path=sdist, key=VOCAB_MEMBER)
            part = dest.with_suffix(".part")
            with open(part, "wb") as out:
                while block := src.read(1 << 20):
                    out.write(block)
        digest = sha256_file(part)
        if digest != VOCAB_SHA256:
            part.unlink()
            raise MtpscopeError("sha256 mismatch for the tokenizer GGUF", path=dest,
                                expected=VOCAB_SHA256, actual=digest)
        os.replace(part, dest)
    return dest


def _download_sdist(into: Path) -> Path:
    """``pip download`` the llama-cpp-python sdist (pip's own cache makes a second call cheap)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "-d", str(into), f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(into.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        raise MtpscopeError(f"pip download of the llama-cpp-python sdist failed: {proc.stderr.strip()[-500:]}",
                            key="llama-cpp-python==" + LLAMA_CPP_PYTHON_VERSION)
    return found[0]
