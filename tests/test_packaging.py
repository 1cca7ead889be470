"""A regular (non-editable) install works without the checkout: one import root, the app and the demo's
data packaged, the demo built and the app served from the installed copy.

The wheel is built from a copy of the tracked files (so the checkout gets no ``build/`` folder), unpacked
with pip into a target folder, and run from an empty working directory with only that folder first on
``sys.path``: the checkout's editable finder is never consulted, because the normal path finder finds
``mtpscope`` in the target folder first.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _tracked_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: cannot list the tracked files")
    return [line for line in out.splitlines() if line and (ROOT / line).is_file()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for rel in _tracked_files():
        dst = src / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dst)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(out), str(src)], check=True, capture_output=True)
    (whl,) = out.glob("mtpscope-*.whl")
    return whl


def test_wheel_has_one_import_root_and_the_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    roots = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith((".dist-info", ".data"))}
    assert roots == {"mtpscope"}  # never `inspector`, `traces` or `app` at the top of site-packages
    for must in ("mtpscope/errors.py", "mtpscope/inspector/gguf.py", "mtpscope/cli/main.py",
                 "mtpscope/traces/store/reader.py",
                 "mtpscope/app/main.py", "mtpscope/app/screens/files.py",
                 "mtpscope/sample_configs/demo-record.json", "mtpscope/traces/server/llama_server.cmake",
                 "mtpscope/sample_configs/gemma-4-E2B-it-assistant/config.json"):
        assert must in names, must
    # every module of the libraries and of the mtpscope folder is in the wheel, sub-packages included
    for folder, pkg in (("inspector", "mtpscope/inspector"), ("traces", "mtpscope/traces"), ("app", "mtpscope/app"),
                        ("mtpscope", "mtpscope")):
        for f in (ROOT / folder).rglob("*.py"):
            rel = f.relative_to(ROOT / folder)
            if "__pycache__" not in rel.parts:
                assert f"{pkg}/{rel.as_posix()}" in names, f
    for data in ("capture.c", "rowstats.c", "demo_data/prompts.json", "demo_data/drafter.safetensors"):
        assert any(n.endswith("/" + data) for n in names), data


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel unpacked by pip into a target folder (put first on ``PYTHONPATH`` by the tests)."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target",
                    str(target), str(wheel)], check=True, capture_output=True)
    return target


def test_installed_copy_runs_without_the_checkout(installed: Path, tmp_path: Path) -> None:
    target = installed
    work = tmp_path / "cwd"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target)}
    probe = (
        "import json, mtpscope, mtpscope.inspector.gguf as g, mtpscope.traces.store.reader as s\n"
        "from mtpscope.demo.spec import RECORD_CONFIG, load_record_config\n"
        "from mtpscope.cli.serve import main_script\n"
        "print(json.dumps({'files': [mtpscope.__file__, g.__file__, s.__file__, str(main_script())],"
        " 'config': str(RECORD_CONFIG), 'n_prompts': len(load_record_config()['record']['prompts'])}))\n"
    )
    r = subprocess.run([sys.executable, "-c", probe], cwd=work, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    for f in got["files"] + [got["config"]]:
        assert Path(f).resolve().is_relative_to(target.resolve()), f
    assert got["n_prompts"] == len(json.loads((ROOT / "sample_configs" / "demo-record.json").read_text())
                                   ["record"]["prompts"])
    # the app's entry script and its pages are there; the CLI knows the app command
    r = subprocess.run([sys.executable, "-m", "mtpscope.cli", "app", "--help"], cwd=work, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0 and "--address" in r.stdout, r.stdout + r.stderr


def test_installed_copy_builds_the_demo_and_serves_the_app(installed: Path, tmp_path: Path,
                                                            vocab_gguf: Path) -> None:
    """From an empty working directory with only the installed copy: ``mtpscope demo build`` writes the demo's
    models into a fresh cache (the real tokenizer copied in, so nothing is fetched), and ``mtpscope app``
    serves the app on it (``/_stcore/health`` ok, the page's HTML)."""
    from tests.apphelpers import start_app

    work = tmp_path / "cwd"
    work.mkdir()
    cache = tmp_path / "cache"
    (cache / "vocab").mkdir(parents=True)
    for f in vocab_gguf.parent.iterdir():
        if f.name.startswith(vocab_gguf.name):
            shutil.copy2(f, cache / "vocab" / f.name)
    env = {**os.environ, "PYTHONPATH": str(installed), "MTPSCOPE_CACHE": str(cache)}
    r = subprocess.run([sys.executable, "-m", "mtpscope.cli", "demo", "build", "--no-traces", "-q"], cwd=work,
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    demo = cache / "demo"
    for name in ("target.gguf", "drafter-upstream.gguf", "drafter-fork.gguf"):
        assert (demo / name).stat().st_size > 0, name
    with start_app(tmp_path / "app.log", env=env, cwd=work) as url:
        import urllib.request

        with urllib.request.urlopen(url + "/", timeout=10) as page:
            assert page.status == 200 and b"<html" in page.read().lower()
        # `mtpscope app` exec'd Streamlit on the installed copy's main.py (same process id)
        argv = Path(f"/proc/{url.proc.pid}/cmdline").read_bytes().split(b"\0")
        assert any(a.decode().startswith(str(installed)) and a.endswith(b"main.py") for a in argv), argv
