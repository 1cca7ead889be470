"""The cache folder for generated data (demo models, demo trace, the real tokenizer GGUF).

Nothing here is ever committed to git. The folder is ``$MTPSCOPE_CACHE`` if set, else
``$XDG_CACHE_HOME/mtpscope``, else ``~/.cache/mtpscope``.

The only thing ever fetched is the llama-cpp-python 0.3.36 source distribution, by ``pip download`` from
the package registry at set-up time (never at run time of the app or the inspector); pip's own cache makes
a second fetch cheap. Two things come out of it: the real Gemma 4 tokenizer GGUF,
``ggml-vocab-gemma-4.gguf`` (``vendor/llama.cpp/models/``), checked by sha256 and cached; and the
llama.cpp sources that ``mtpscope server build`` compiles ``llama-server`` from
(:func:`llama_cpp_sdist`, the whole archive checked against :data:`LLAMA_CPP_SDIST_SHA256`).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from mtpscope.errors import MtpscopeError

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
VOCAB_NAME = "ggml-vocab-gemma-4.gguf"
VOCAB_MEMBER = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/models/{VOCAB_NAME}"
#: sha256 of ``llama_cpp_python-0.3.36.tar.gz`` as the package registry serves it (its files are immutable)
LLAMA_CPP_SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
#: the llama.cpp tree inside that sdist
LLAMA_CPP_SDIST_ROOT = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
VOCAB_SIZE_BYTES = 15_776_467
VOCAB_SHA256 = "58b1ba0b57f3b4d7c468ba4ffd91ad85190346a3d7ad7e71d1cabaae8a14bb65"
# llama.cpp's own tokenizer test pairs for that file (text in, token ids out), kept beside it.
VOCAB_TEST_SHA256 = {
    ".inp": "0528aa007b06965f980181d252b5dff7bb170a77af6157bd48bba56885374448",
    ".out": "ba8c596bcd05e97e62566fa994b42eeaeffd6a4e4b4a4abe7b5b689aa6b43bf3",
}


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
    if _vocab_complete(dest):
        return dest
    if not fetch:
        raise MtpscopeError("the real Gemma 4 tokenizer GGUF is not in the cache; run `make setup`",
                            path=dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        sdist = download_sdist(Path(tmp))
        pinned = {"": VOCAB_SHA256, **VOCAB_TEST_SHA256}
        with tarfile.open(sdist, "r:gz") as tar:
            for suffix, want in pinned.items():
                _extract_checked(tar, sdist, VOCAB_MEMBER + suffix, Path(str(dest) + suffix), want)
    return dest


def vocab_test_pairs(fetch: bool = True) -> tuple[Path, Path]:
    """Paths of llama.cpp's tokenizer test pairs for the Gemma 4 vocab: (``.inp``, ``.out``).

    ``.inp`` holds texts separated by ``\n__ggml_vocab_test__\n``; ``.out`` one line of space-separated
    token ids per text. Both come from the same sdist as :func:`vocab_path`, sha256-pinned.
    """
    base = vocab_path(fetch=fetch)
    return Path(str(base) + ".inp"), Path(str(base) + ".out")


def _vocab_complete(dest: Path) -> bool:
    """True when the tokenizer GGUF and its test pairs are all in the cache with pinned sha256."""
    if not (dest.exists() and dest.stat().st_size == VOCAB_SIZE_BYTES and sha256_file(dest) == VOCAB_SHA256):
        return False
    for suffix, want in VOCAB_TEST_SHA256.items():
        p = Path(str(dest) + suffix)
        if not p.exists() or sha256_file(p) != want:
            return False
    return True


def _extract_checked(tar: tarfile.TarFile, sdist: Path, member_name: str, dest: Path, sha256: str) -> None:
    """Extract one member of the sdist to ``dest`` (atomically) after checking its sha256."""
    try:
        member = tar.getmember(member_name)
    except KeyError as e:
        raise MtpscopeError("file not found in the sdist", path=sdist, key=member_name) from e
    src = tar.extractfile(member)
    if src is None:
        raise MtpscopeError("sdist member is not a regular file", path=sdist, key=member_name)
    part = dest.with_name(dest.name + ".part")
    with open(part, "wb") as out:
        while block := src.read(1 << 20):
            out.write(block)
    digest = sha256_file(part)
    if digest != sha256:
        part.unlink()
        raise MtpscopeError("sha256 mismatch", path=dest, key=member_name, expected=sha256, actual=digest)
    os.replace(part, dest)


def download_sdist(into: Path) -> Path:
    """``pip download`` the llama-cpp-python sdist into the folder ``into`` (pip's own cache makes a second
    call cheap); the path of the ``.tar.gz``.

    Raises:
        MtpscopeError: pip could not fetch it (pip's last words quoted).
    """
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "-d", str(into), f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(into.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        raise MtpscopeError(f"pip download of the llama-cpp-python sdist failed: {proc.stderr.strip()[-500:]}",
                            key="llama-cpp-python==" + LLAMA_CPP_PYTHON_VERSION)
    return found[0]


def llama_cpp_sdist(into: Path) -> Path:
    """:func:`download_sdist`, then check the whole archive against :data:`LLAMA_CPP_SDIST_SHA256`.

    Raises:
        MtpscopeError: the download failed, or the archive's sha256 differs from the pinned one.
    """
    sdist = download_sdist(into)
    digest = sha256_file(sdist)
    if digest != LLAMA_CPP_SDIST_SHA256:
        raise MtpscopeError("sha256 mismatch of the llama-cpp-python sdist", path=sdist,
                            expected=LLAMA_CPP_SDIST_SHA256, actual=digest)
    return sdist


def layout_hints() -> tuple[str, ...]:
    """Local GGUFs whose metadata remote Gemma 4 headers repeat: the cached tokenizer when it is there
    (never fetched for this). Reads of a remote header are sized from it
    (:func:`mtpscope.inspector.remote.open_gguf_reader`); used by the CLI and the app."""
    try:
        return (str(vocab_path(fetch=False)),)
    except (MtpscopeError, OSError):
        return ()
