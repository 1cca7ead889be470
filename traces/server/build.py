"""Build llama.cpp's ``llama-server`` once into the cache (``mtpscope server build`` / ``server path``).

What is built: the ``llama-server`` of the llama.cpp that llama-cpp-python 0.3.36 vendors (the sdist
:func:`mtpscope.cache.llama_cpp_sdist` fetches with ``pip download``, sha256-pinned), so the server knows
``--spec-type draft-mtp`` and the ``gemma4-assistant`` drafter exactly as mtpscope's recorder does.

How: ``llama_server.cmake`` (beside this module) is configured as the top-level ``CMakeLists.txt``; it
compiles only the common library, cpp-httplib, the server and an empty web-UI stub
(``LLAMA_BUILD_UI=OFF``, ``LLAMA_USE_PREBUILT_UI=OFF``: nothing is downloaded; no OpenSSL), and links
against the wheel's own ``libggml-base`` / ``libggml`` / ``libggml-cpu`` / ``libllama`` / ``libmtmd``
(``site-packages/llama_cpp/lib``), copied beside the binary (RUNPATH ``$ORIGIN``). The server therefore
runs the very machine code the recorder runs, and ggml, llama and mtmd (most of a full build) are not
compiled again. Compiler: cmake's default (``$CC`` / ``$CXX``, else ``cc`` / ``c++``), the one pip's
build of llama-cpp-python used; generator Ninja when on PATH; ``CMAKE_BUILD_PARALLEL_LEVEL`` jobs (default:
the CPU count).

Where: ``<cache>/server/<key>/`` with ``bin/llama-server`` (+ the copied libraries), ``build.json`` (the
key's inputs, the seconds configure and build took) and ``build.log``. ``key`` = the first 16 hex digits of
the sha256 of: the sdist's pinned sha256, the recipe file, each wheel library's sha256 and the C++
compiler's ``--version`` line. While these are unchanged the build is reused; concurrent builders wait
for each other on ``<cache>/server/<key>.lock``; a half-finished build never takes the final folder's
name.

Imports: mtpscope.cache, mtpscope.errors (no llama_cpp: the wheel's folder is found with
``importlib.util.find_spec``, which does not import the package).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mtpscope.cache import (
    LLAMA_CPP_PYTHON_VERSION,
    LLAMA_CPP_SDIST_ROOT,
    LLAMA_CPP_SDIST_SHA256,
    cache_dir,
    llama_cpp_sdist,
    sha256_file,
)
from mtpscope.errors import MtpscopeError, ServerBuildUnavailableError, ServerError

RECIPE = Path(__file__).with_name("llama_server.cmake")
#: the wheel's shared libraries the server links against (their SONAME links are made beside them)
WHEEL_LIBS = ("libggml-base.so", "libggml.so", "libggml-cpu.so", "libllama.so", "libmtmd.so")
#: what the build needs of the sdist's llama.cpp tree (relative to its root); the rest is not extracted
SOURCE_PARTS = ("LICENSE", "cmake/", "common/", "include/", "ggml/include/", "vendor/",
                "tools/server/", "tools/ui/", "tools/mtmd/", "scripts/ui-assets.cmake", "src/llama-ext.h")
BINARY = "llama-server"


@dataclass(frozen=True)
class ServerBuild:
    """A built llama-server.

    Attributes:
        binary: ``<cache>/server/<key>/bin/llama-server``.
        key: the build's key (see the module docstring).
        built_now: True when this call compiled it, False when an earlier build was reused.
        configure_s / build_s: wall seconds of the cmake configure and of the compile + link (from
            ``build.json``; the numbers of the build that made the binary).
        jobs: parallel compile jobs used.
        log: the build's log file.
    """

    binary: Path
    key: str
    built_now: bool
    configure_s: float | None
    build_s: float | None
    jobs: int | None
    log: Path


def wheel_lib_dir() -> Path:
    """``site-packages/llama_cpp/lib`` of the installed llama-cpp-python (found without importing it).

    Raises:
        ServerBuildUnavailableError: llama-cpp-python is not installed, or its ``lib`` folder lacks one of
            :data:`WHEEL_LIBS`.
    """
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise ServerBuildUnavailableError("llama-cpp-python is not installed (the server links against its "
                                          "libraries)", key="llama-cpp-python",
                                          expected=LLAMA_CPP_PYTHON_VERSION, actual="missing")
    lib = Path(list(spec.submodule_search_locations)[0]) / "lib"
    for name in WHEEL_LIBS:
        if not (lib / name).is_file():
            raise ServerBuildUnavailableError("llama-cpp-python's library folder lacks a library the server "
                                              "links against", path=lib, key=name, expected="present",
                                              actual="missing")
    return lib


def _tools() -> dict[str, str]:
    """cmake, the C++ compiler and the generator's tool, or :class:`ServerBuildUnavailableError`."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise ServerBuildUnavailableError("cmake is not on PATH (needed to build llama-server)", key="cmake",
                                          expected="cmake >= 3.14", actual="missing")
    cxx_name = os.environ.get("CXX") or "c++"
    cxx = shutil.which(cxx_name)
    cc = shutil.which(os.environ.get("CC") or "cc")
    if cxx is None or cc is None:
        raise ServerBuildUnavailableError("no C/C++ compiler on PATH (needed to build llama-server)",
                                          key="CXX" if cxx is None else "CC", expected="a compiler on PATH",
                                          actual=cxx_name if cxx is None else os.environ.get("CC") or "cc")
    ninja = shutil.which("ninja")
    make = shutil.which("make")
    if ninja is None and make is None:
        raise ServerBuildUnavailableError("neither ninja nor make is on PATH (cmake needs one to build)",
                                          key="generator", expected="ninja or make", actual="missing")
    return {"cmake": cmake, "cxx": cxx, "generator": "Ninja" if ninja else "Unix Makefiles"}


def unavailable_reason() -> str | None:
    """Why llama-server cannot be built here (one line), or None when it can (tools and wheel present)."""
    try:
        _tools()
        wheel_lib_dir()
    except ServerBuildUnavailableError as e:
        return str(e)
    return None


def _compiler_line(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return cxx
    return (out.splitlines() or [cxx])[0].strip()


def build_key() -> tuple[str, dict[str, object]]:
    """``(key, inputs)``: the build's key and what it hashes (see the module docstring).

    Raises:
        ServerBuildUnavailableError: as :func:`unavailable_reason`.
    """
    tools = _tools()
    lib = wheel_lib_dir()
    inputs: dict[str, object] = {
        "sdist_sha256": LLAMA_CPP_SDIST_SHA256,
        "recipe_sha256": sha256_file(RECIPE),
        "wheel_libs": {name: sha256_file(lib / name) for name in WHEEL_LIBS},
        "compiler": _compiler_line(tools["cxx"]),
    }
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
    return digest, inputs


def server_root() -> Path:
    """``<cache>/server``."""
    return cache_dir() / "server"


def _read_build(folder: Path) -> ServerBuild | None:
    binary = folder / "bin" / BINARY
    info_path = folder / "build.json"
    if not (binary.is_file() and os.access(binary, os.X_OK) and info_path.is_file()):
        return None
    try:
        info = json.loads(info_path.read_text())
    except (OSError, ValueError):
        return None
    return ServerBuild(binary=binary, key=folder.name, built_now=False, configure_s=info.get("configure_s"),
                       build_s=info.get("build_s"), jobs=info.get("jobs"), log=folder / "build.log")


def server_path() -> Path | None:
    """The built ``llama-server`` for today's inputs, or None when it is not built (nothing is built here).

    Raises:
        ServerBuildUnavailableError: as :func:`unavailable_reason`.
    """
    key, _ = build_key()
    b = _read_build(server_root() / key)
    return None if b is None else b.binary


def find_build() -> ServerBuild | None:
    """The :class:`ServerBuild` for today's inputs if it exists (never builds); None otherwise, also when it
    cannot be built here."""
    try:
        key, _ = build_key()
    except ServerBuildUnavailableError:
        return None
    return _read_build(server_root() / key)


def _extract_sources(sdist: Path, dest: Path) -> Path:
    """Extract :data:`SOURCE_PARTS` of the sdist's llama.cpp tree into ``dest``; returns the tree's root."""
    root = dest / "llama.cpp"
    with tarfile.open(sdist, "r:gz") as tar:
        members = []
        for m in tar.getmembers():
            if not m.name.startswith(LLAMA_CPP_SDIST_ROOT) or not (m.isfile() or m.isdir()):
                continue
            rel = m.name[len(LLAMA_CPP_SDIST_ROOT):]
            if any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in SOURCE_PARTS):
                m.name = rel
                members.append(m)
        tar.extractall(root, members=members, filter="data")
    missing = [p for p in SOURCE_PARTS if not (root / p.rstrip("/")).exists()]
    if missing:
        raise ServerError("the llama-cpp-python sdist lacks llama.cpp sources the server build needs", path=sdist,
                          key=missing[0], expected="present", actual="missing")
    return root


def ggml_commit(lib: Path) -> str:
    """The commit the wheel's ggml was built from (``ggml_commit()`` of ``lib/libggml-base.so``, read in a child
    process so that no second copy of ggml is loaded here), or ``"unknown"``. It becomes llama-server's
    ``LLAMA_BUILD_COMMIT``, so ``/props`` ``build_info`` (``b0-<commit>``) names the same llama.cpp build as a
    recording's ``runtime.llama_cpp``."""
    code = ("import ctypes,sys; f=ctypes.CDLL(sys.argv[1]).ggml_commit; f.restype=ctypes.c_char_p; "
            "print((f() or b'').decode('utf-8','replace'))")
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(lib / "libggml-base.so")], capture_output=True,
                              text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = proc.stdout.strip()
    return commit if proc.returncode == 0 and re.fullmatch(r"[A-Za-z0-9._-]{1,64}", commit) else "unknown"


def _run_logged(cmd: list[str], log: Path, what: str, env: dict[str, str] | None = None) -> float:
    """Run ``cmd`` appending its output to ``log``; the wall seconds it took.

    Raises:
        ServerError: a non-zero exit (the first compiler ``error:`` line, else the last output line, quoted;
            the log named).
    """
    t0 = time.monotonic()
    with open(log, "a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, check=False)
    took = time.monotonic() - t0
    if proc.returncode != 0:
        lines = log.read_text(errors="replace").splitlines()
        first = next((ln for ln in lines if "error:" in ln or "Error" in ln), lines[-1] if lines else "")
        raise ServerError(f"llama-server {what} failed (exit {proc.returncode}): {first.strip()[:300]}", path=log)
    return took


def build_server(*, force: bool = False, jobs: int | None = None,
                 progress: Callable[[str], None] | None = None) -> ServerBuild:
    """Build llama-server into the cache unless today's build is there (see the module docstring).

    Args:
        force: build again even when a build with today's key exists (it is replaced at the end).
        jobs: parallel compile jobs (default ``$CMAKE_BUILD_PARALLEL_LEVEL``, else the CPU count).
        progress: called with one line of text at each stage (the CLI prints them), or None.

    Returns:
        the :class:`ServerBuild` (``built_now`` says whether this call compiled).

    Raises:
        ServerBuildUnavailableError: no cmake, compiler or llama-cpp-python libraries.
        ServerError: the download, the configure or the build failed (one line naming the build's log, kept as
            ``<cache>/server/<key>-failed-build.log``), or the built binary does not start (``--version``).
    """
    say = progress or (lambda _line: None)
    key, inputs = build_key()
    tools = _tools()
    root = server_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / key
    with open(root / f"{key}.lock", "w") as lock_fh:
        fcntl.flock(lock_fh, fcntl.LOCK_EX)          # another builder of the same key: wait for it
        found = _read_build(final)
        if found is not None and not force:
            return found
        work = root / f"{key}.build-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        try:
            built = _build_in(work, key, inputs, tools, jobs, say)
            if final.exists():
                shutil.rmtree(final)
            os.replace(built, final)
        except ServerError as e:             # keep the log of a failed build where the message says
            log = work / "out" / "build.log"
            if log.is_file():
                kept = root / f"{key}-failed-build.log"
                shutil.copy2(log, kept)
                e.path = os.fspath(kept)
                e.args = (e.one_line(),)
            raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    b = _read_build(final)
    if b is None:
        raise ServerError("llama-server build finished but its folder is incomplete", path=final)
    return ServerBuild(b.binary, b.key, True, b.configure_s, b.build_s, b.jobs, b.log)


def _build_in(work: Path, key: str, inputs: dict[str, object], tools: dict[str, str], jobs: int | None,
              say: Callable[[str], None]) -> Path:
    """Configure and build in ``work``; returns the finished folder ``work/out`` (bin/, build.json, build.log)."""
    out = work / "out"
    (out / "bin").mkdir(parents=True)
    log = out / "build.log"
    say(f"fetching the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist (pip download; pip's cache)")
    try:
        sdist = llama_cpp_sdist(work)
    except MtpscopeError as e:
        raise ServerError(f"could not fetch the llama.cpp sources: {e}") from None
    src = _extract_sources(sdist, work / "src")
    sdist.unlink()
    lib = wheel_lib_dir()
    for name in WHEEL_LIBS:              # each library once, its versioned (SONAME) names as links to it
        shutil.copy2((lib / name).resolve(), out / "bin" / name)
        for alias in lib.glob(name + ".*"):
            os.symlink(name, out / "bin" / alias.name)
    wrapper = work / "wrapper"
    wrapper.mkdir()
    shutil.copy2(RECIPE, wrapper / "CMakeLists.txt")
    commit = ggml_commit(out / "bin")
    n_jobs = int(jobs or os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or os.cpu_count() or 1)
    bdir = work / "build"
    say(f"configuring llama-server ({tools['generator']}, {inputs['compiler']})")
    configure_s = _run_logged([tools["cmake"], "-S", str(wrapper), "-B", str(bdir), "-G", tools["generator"],
                               "-DCMAKE_BUILD_TYPE=Release", f"-DLLAMA_SRC={src}", f"-DWHEEL_LIBS={out / 'bin'}",
                               f"-DLLAMA_BUILD_COMMIT={commit}", "-DLLAMA_BUILD_UI=OFF",
                               "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF"], log, "configure")
    say(f"building llama-server with {n_jobs} jobs (log: {log})")
    build_s = _run_logged([tools["cmake"], "--build", str(bdir), "--target", BINARY, "-j", str(n_jobs)], log,
                          "build")
    shutil.copy2(bdir / "bin" / BINARY, out / "bin" / BINARY)
    probe = subprocess.run([str(out / "bin" / BINARY), "--version"], capture_output=True, text=True, timeout=60,
                           check=False)
    if probe.returncode != 0:
        tail = (probe.stderr or probe.stdout).strip().splitlines()
        raise ServerError(f"the built llama-server does not start: {(tail or ['no output'])[-1][:300]}",
                          path=out / "bin" / BINARY)
    info = {"key": key, "inputs": inputs, "configure_s": round(configure_s, 1), "build_s": round(build_s, 1),
            "jobs": n_jobs, "ggml_commit": commit, "generator": tools["generator"], "version": (probe.stderr + probe.stdout).strip(),
            "built": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (out / "build.json").write_text(json.dumps(info, indent=2) + "\n")
    return out


__all__ = ["BINARY", "ServerBuild", "build_key", "build_server", "find_build", "server_path",
           "server_root", "unavailable_reason", "wheel_lib_dir"]
