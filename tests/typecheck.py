"""Type-check the package with mypy: ``python -m tests.typecheck`` (run by ``make lint``).

mypy cannot import ``mtpscope.inspector`` from the editable install: pyproject.toml's package-dir mapping
puts ``inspector/``, ``traces/``, ``app/`` and ``sample_configs/`` under ``mtpscope`` only through
setuptools' import hook, which mypy does not run. So this script lays out the installed package as a tree
of symbolic links, ``build/typecheck/mtpscope/`` (``mtpscope/*`` plus ``inspector``, ``traces``, ``app``,
``sample_configs``), and runs mypy on it with pyproject.toml's ``[tool.mypy]`` settings (strict on
``mtpscope.inspector`` and ``mtpscope.traces``).

Which errors fail the run is pyproject.toml's ``[tool.mtpscope.typecheck]``: ``enforce`` lists the source
folders whose errors fail it (exit 1); errors elsewhere are counted per folder and reported, and do not
fail it. To make ``traces/`` fail too, add ``"traces"`` to ``enforce``.

Exit status: 0 (no error in an enforced folder), 1 (errors there; every one is printed), 2 (mypy itself
failed: a crash or a bad configuration).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"
#: source folder -> its folder in the installed package (pyproject.toml's package-dir mapping)
MAPPED = {"inspector": "inspector", "traces": "traces", "app": "app", "sample_configs": "sample_configs"}
_ERROR = re.compile(r"^(?P<path>[^:\s]+\.py):\d+(?::\d+)?: error: ")


def build_tree(root: Path = ROOT, tree: Path = TREE) -> Path:
    """(Re)make ``tree/mtpscope``: one link per entry of ``root/mtpscope`` and per mapped folder; returns it."""
    pkg = tree / "mtpscope"
    pkg.mkdir(parents=True, exist_ok=True)
    for old in pkg.iterdir():
        if old.is_symlink():
            old.unlink()
    for entry in sorted((root / "mtpscope").iterdir()):
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    for folder, name in MAPPED.items():
        (pkg / name).symlink_to(root / folder)
    return pkg


def enforced(pyproject: Path = ROOT / "pyproject.toml") -> tuple[str, ...]:
    """The source folders whose mypy errors fail the run (``[tool.mtpscope.typecheck] enforce``)."""
    cfg = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    return tuple(cfg.get("tool", {}).get("mtpscope", {}).get("typecheck", {}).get("enforce", ()))


def source_folder(path: str) -> str:
    """The checkout folder an error's path (relative to the link tree) lies in: ``<tree>/mtpscope/traces/x.py``
    -> ``traces``, ``<tree>/mtpscope/cli/main.py`` -> ``mtpscope``."""
    parts = Path(path).parts
    if len(parts) >= 2 and parts[0] == "mtpscope" and parts[1] in MAPPED.values():
        return next(f for f, n in MAPPED.items() if n == parts[1])
    return parts[0] if parts else path


def split_errors(output: str, enforce: tuple[str, ...]) -> tuple[list[str], Counter[str]]:
    """mypy's output -> (error lines in enforced folders, error count per other folder)."""
    failing: list[str] = []
    reported: Counter[str] = Counter()
    for line in output.splitlines():
        m = _ERROR.match(line)
        if not m:
            continue
        folder = source_folder(m.group("path"))
        if folder in enforce:
            failing.append(line)
        else:
            reported[folder] += 1
    return failing, reported


def main(argv: list[str] | None = None) -> int:
    build_tree()
    cmd = [sys.executable, "-m", "mypy", "--config-file", os.fspath(ROOT / "pyproject.toml"),
           "--python-executable", sys.executable, "--cache-dir", os.fspath(TREE / ".mypy_cache"),
           "--no-error-summary", "-p", "mtpscope", *(argv or [])]
    proc = subprocess.run(cmd, cwd=TREE, capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 1):
        sys.stderr.write(proc.stdout + proc.stderr)
        return 2
    enforce = enforced()
    failing, reported = split_errors(proc.stdout, enforce)
    for line in failing:
        print(line)
    for folder, n in sorted(reported.items()):
        print(f"mypy: {n} error(s) in {folder}/ (reported only; not in [tool.mtpscope.typecheck] enforce)")
    print(f"mypy: {len(failing)} error(s) in {', '.join(f + '/' for f in enforce) or 'no enforced folder'}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
