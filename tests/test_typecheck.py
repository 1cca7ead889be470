"""tests/typecheck.py, the mypy runner of ``make lint``: its tree of links and how it splits mypy's errors
into failing (the enforced folders) and reported ones. mypy itself is not run here."""

from __future__ import annotations

import re
from pathlib import Path

from tests import typecheck as T


def test_the_link_tree_is_the_installed_layout(tmp_path: Path) -> None:
    root = tmp_path / "checkout"
    for rel in ("mtpscope/__init__.py", "mtpscope/cli/main.py", "inspector/gguf.py", "traces/store/reader.py",
                "app/main.py", "sample_configs/__init__.py", "mtpscope/__pycache__/x.pyc"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    pkg = T.build_tree(root, tmp_path / "tree")
    assert sorted(p.name for p in pkg.iterdir()) == ["__init__.py", "app", "cli", "inspector", "sample_configs",
                                                     "traces"]
    assert (pkg / "inspector" / "gguf.py").resolve() == (root / "inspector" / "gguf.py").resolve()
    assert (pkg / "traces" / "store" / "reader.py").is_file() and (pkg / "cli" / "main.py").is_file()
    (root / "mtpscope" / "cli").rename(root / "mtpscope" / "commands")     # rebuilt: no stale link stays
    assert sorted(p.name for p in T.build_tree(root, tmp_path / "tree").iterdir()) == [
        "__init__.py", "app", "commands", "inspector", "sample_configs", "traces"]


def test_errors_split_into_enforced_and_reported() -> None:
    out = ("mtpscope/inspector/gguf.py:12: error: Returning Any  [no-any-return]\n"
           "mtpscope/inspector/gguf.py:13:5: note: a note is not an error\n"
           "mtpscope/traces/store/reader.py:7: error: Missing type  [no-untyped-def]\n"
           "mtpscope/traces/run/x.py:1:2: error: Bad  [misc]\n"
           "mtpscope/cli/main.py:3: error: Bad  [misc]\n"
           "mtpscope/app/main.py:3: error: Bad  [misc]\n")
    failing, reported = T.split_errors(out, ("inspector",))
    assert failing == ["mtpscope/inspector/gguf.py:12: error: Returning Any  [no-any-return]"]
    assert dict(reported) == {"traces": 2, "mtpscope": 1, "app": 1}
    failing, reported = T.split_errors(out, ("inspector", "traces"))
    assert len(failing) == 3 and dict(reported) == {"mtpscope": 1, "app": 1}


def test_pyproject_enforces_inspector() -> None:
    assert "inspector" in T.enforced()


#: a suppression comment (ruff's "noqa" with its codes, mypy's "type: ignore" with its code) and the reason
#: written after it (" - why", or a second comment)
_SUPPRESSION = re.compile(r"#\s*(noqa(?::\s*[A-Z0-9, ]+)?|type:\s*ignore(?:\[[^\]]*\])?)(.*)$")


def test_every_suppression_says_why() -> None:
    # issue 37: the noqa / type: ignore comments that remain each say why (ruff and mypy only check the code)
    root = Path(__file__).resolve().parents[1]
    bare = []
    for folder in ("app", "inspector", "traces", "mtpscope", "benchmarks", "tests"):
        for path in sorted((root / folder).rglob("*.py")):
            for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                m = _SUPPRESSION.search(line)
                if m is None or '"' in line[m.start():] or "'" in line[m.start():m.start() + 2]:
                    continue
                why = m.group(2).strip().lstrip("-—:#(").strip()
                if len(why) < 4:
                    bare.append(f"{path.relative_to(root)}:{no}: {line.strip()}")
    assert bare == [], "suppressions without a reason:\n" + "\n".join(bare)
