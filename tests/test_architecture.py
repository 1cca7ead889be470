"""The import rules of docs/ARCHITECTURE.md, checked statically (``ast``; nothing is imported).

Every ``.py`` file under ``inspector/``, ``traces/``, ``app/`` and ``mtpscope/`` is parsed and named by its
import name (``inspector/gguf.py`` -> ``mtpscope.inspector.gguf``, ``app/screens/step.py`` ->
``mtpscope.app.screens.step``). Every ``import`` / ``from ... import`` counts, at module level or inside a
function (a lazy import is still an arrow), relative imports resolved. The rules:

- only ``mtpscope.app`` imports ``streamlit``, and its pure helpers (charts, views, safety, tokens) do not;
- only ``mtpscope.traces.run.llama_runtime`` imports ``llama_cpp``;
- ``mtpscope.inspector`` imports neither ``mtpscope.traces`` nor ``mtpscope.app`` nor ``mtpscope.cli.main*`` /
  ``mtpscope.demo.build*``;
- ``mtpscope.traces`` imports neither ``mtpscope.app`` nor ``mtpscope.cli.main*`` / ``mtpscope.demo.build*``;
- ``mtpscope.app`` imports no ``mtpscope.cli.main*`` and, of the demo, only ``mtpscope.demo.spec`` (its file
  names, no numpy);
- of the ``mtpscope`` folder's own modules the libraries import only the leaves ``mtpscope.errors``
  (which imports no other mtpscope module) and ``mtpscope.cache`` (which imports only the errors);
- no import cycle between the project's modules (reported by its path ``a -> b -> a``);
- no top-level ``import inspector`` / ``import traces`` / ``import app`` is left (the old import roots),
  in the library tree, the tests and the benchmarks;
- docs/ARCHITECTURE.md's module tables list every module file, and only those.

Each rule is a pure function over an import graph; the ``test_rule_*`` self-tests feed it a small
synthetic graph that breaks it, so a rule that could never fail would be caught.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: source folder -> import package (pyproject.toml's package-dir mapping).
PACKAGES = {"mtpscope": "mtpscope", "inspector": "mtpscope.inspector", "traces": "mtpscope.traces",
            "app": "mtpscope.app"}
#: folders scanned only for the old import roots.
OTHER_FOLDERS = ("tests", "benchmarks")
OLD_ROOTS = ("inspector", "traces", "app")
#: the ``mtpscope`` folder's modules every layer may import -> the only project modules each may import.
LEAVES = {"mtpscope.errors": (), "mtpscope.cache": ("mtpscope.errors",)}
#: app modules documented as pure (no streamlit): tested without a Streamlit runtime.
PURE_APP = ("mtpscope.app.charts", "mtpscope.app.views", "mtpscope.app.safety", "mtpscope.app.tokens")


@dataclass(frozen=True)
class Imp:
    """One import statement's target: ``name`` absolute dotted (``numpy``, ``mtpscope.inspector.gguf``),
    ``names`` what a ``from`` import takes from it (empty for ``import x``), ``line`` 1-based."""

    name: str
    names: tuple[str, ...]
    line: int


# ------------------------------------------------------------------------------------------ parsing

def module_name(path: Path, folder: Path, package: str) -> str:
    """Import name of ``path`` below ``folder`` installed as ``package`` (``__init__.py`` -> the package)."""
    rel = path.relative_to(folder).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([package, *parts])


def imports_of(source: str, module: str, is_package: bool = False) -> list[Imp]:
    """Every import in ``source`` (module level, in functions, in ``if`` blocks), relative ones resolved
    against ``module`` (``is_package``: ``module`` is a package's ``__init__``)."""
    out: list[Imp] = []
    base = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [Imp(a.name, (), node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                up = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                name = ".".join(up + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.append(Imp(name, tuple(a.name for a in node.names), node.lineno))
    return out


def scan(root: Path = ROOT, packages: Mapping[str, str] = PACKAGES) -> dict[str, tuple[Path, list[Imp]]]:
    """module name -> (file, its imports) for every ``.py`` under the package folders."""
    mods: dict[str, tuple[Path, list[Imp]]] = {}
    for folder, package in packages.items():
        d = root / folder
        for p in sorted(d.rglob("*.py")):
            if any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(d).parts):
                continue
            name = module_name(p, d, package)
            mods[name] = (p, imports_of(p.read_text(encoding="utf-8"), name, p.name == "__init__.py"))
    return mods


def resolve(imp: Imp, known: Iterable[str]) -> set[str]:
    """The project modules an import reaches: ``from pkg import mod`` -> ``pkg.mod`` when that is a module,
    else ``pkg``; ``import a.b.c`` -> the longest known prefix. Empty for outside packages."""
    known = set(known)
    hit = {f"{imp.name}.{n}" for n in imp.names if f"{imp.name}.{n}" in known}
    if len(hit) < len(imp.names) or not imp.names:
        parts = imp.name.split(".")
        for i in range(len(parts), 0, -1):
            if ".".join(parts[:i]) in known:
                hit.add(".".join(parts[:i]))
                break
    return hit


def graph(mods: Mapping[str, tuple[Path, list[Imp]]]) -> dict[str, dict[str, int]]:
    """module -> {imported project module: first line}; self-imports of a package by its own modules
    (``from mtpscope.x import y`` inside ``mtpscope/x/__init__.py``) included like any other."""
    g: dict[str, dict[str, int]] = {m: {} for m in mods}
    for m, (_, imps) in mods.items():
        for imp in imps:
            for t in resolve(imp, mods):
                if t != m:
                    g[m].setdefault(t, imp.line)
    return g


# ------------------------------------------------------------------------------------------- rules

def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _is_root_module(name: str) -> bool:
    """A module of the ``mtpscope`` folder itself (cli*, demo*, cache, errors), not of a library."""
    return name.startswith("mtpscope.") and not any(
        _under(name, p) for p in ("mtpscope.inspector", "mtpscope.traces", "mtpscope.app"))


def external_import_violations(mods: Mapping[str, tuple[Path, list[Imp]]], top: str,
                               allowed: Iterable[str], denied: Iterable[str] = ()) -> list[str]:
    """``module:line imports top`` for each import of the outside package ``top`` by a module that is not
    under one of the ``allowed`` prefixes, or is one of ``denied``."""
    allowed, denied = tuple(allowed), set(denied)
    out = []
    for m, (_, imps) in sorted(mods.items()):
        if any(_under(m, a) for a in allowed) and m not in denied:
            continue
        out += [f"{m}:{i.line} imports {i.name}" for i in imps if _under(i.name, top)]
    return out


def layer_violations(g: Mapping[str, Mapping[str, int]]) -> list[str]:
    """Arrows that point up. Of the ``mtpscope`` folder's own modules, the libraries may import only the
    leaves in :data:`LEAVES` (so never ``cli*`` / ``demo*``), the app those and ``demo_spec``:

    inspector -> traces / app / cli* / demo*; traces -> app / cli* / demo*; app -> cli* / demo* other
    than demo_spec; a leaf -> anything but a lower leaf."""
    out = []
    for m, deps in sorted(g.items()):
        for t, line in sorted(deps.items()):
            up = False
            root = _is_root_module(t)
            if _under(m, "mtpscope.inspector"):
                up = _under(t, "mtpscope.traces") or _under(t, "mtpscope.app") or (root and t not in LEAVES)
            elif _under(m, "mtpscope.traces"):
                up = _under(t, "mtpscope.app") or (root and t not in LEAVES)
            elif _under(m, "mtpscope.app"):
                up = root and t not in LEAVES and t != "mtpscope.demo.spec"
            elif m in LEAVES:
                up = t != "mtpscope" and t not in LEAVES[m]
            if up:
                out.append(f"{m}:{line} imports {t}")
    return out


def cycles(g: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (or a module importing
    itself), as a path ``[a, b, ..., a]`` (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    comps: list[list[str]] = []
    counter = 0
    for start in sorted(g):
        if start in index:
            continue
        work = [(start, iter(sorted(g.get(start, {}))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in g:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(g.get(nxt, {})))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in g.get(v, {}):
                    comps.append(sorted(comp))
    return [_cycle_path(g, c) for c in sorted(comps)]


def _cycle_path(g: Mapping[str, Mapping[str, int]], comp: list[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first inside the component)."""
    inside = set(comp)
    start = comp[0]
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for v in frontier:
            for t in sorted(g.get(v, {})):
                if t == start:
                    path = [start]
                    while v != start:
                        path.append(v)
                        v = prev[v]
                    return [start, *reversed(path[1:]), start]
                if t in inside and t not in prev and t != start:
                    prev[t] = v
                    nxt_frontier.append(t)
        frontier = nxt_frontier
    return [*comp, comp[0]]  # not reached for a strongly connected component


def old_root_violations(files: Mapping[str, list[Imp]]) -> list[str]:
    """``file:line imports inspector...`` for absolute imports of the old top-level roots."""
    out = []
    for f, imps in sorted(files.items()):
        out += [f"{f}:{i.line} imports {i.name}" for i in imps if i.name.split(".")[0] in OLD_ROOTS]
    return out


def _fmt(cycle: list[str]) -> str:
    return " -> ".join(cycle)


# ------------------------------------------------------------------------------------ the real tree

@pytest.fixture(scope="module")
def tree() -> dict[str, tuple[Path, list[Imp]]]:
    mods = scan()
    assert {"mtpscope.errors", "mtpscope.inspector.gguf", "mtpscope.traces.run.llama_runtime",
            "mtpscope.app.state", "mtpscope.app.screens.step"} <= set(mods), sorted(mods)
    return mods


def test_only_app_imports_streamlit(tree) -> None:
    assert external_import_violations(tree, "streamlit", ["mtpscope.app"], denied=PURE_APP) == []


def test_only_the_runtime_module_imports_llama_cpp(tree) -> None:
    assert external_import_violations(tree, "llama_cpp", ["mtpscope.traces.run.llama_runtime"]) == []


def test_arrows_point_down(tree) -> None:
    assert layer_violations(graph(tree)) == []


def test_no_import_cycles(tree) -> None:
    assert [_fmt(c) for c in cycles(graph(tree))] == []


def test_no_old_import_roots() -> None:
    files = {f"{m}": imps for m, (_, imps) in scan().items()}
    for folder in OTHER_FOLDERS:
        for p in sorted((ROOT / folder).rglob("*.py")):
            files[str(p.relative_to(ROOT))] = imports_of(p.read_text(encoding="utf-8"), f"{folder}.{p.stem}")
    assert old_root_violations(files) == []


def documented_modules(markdown: str) -> dict[str, set[str]]:
    """Package -> the file names in the first column of its table under docs/ARCHITECTURE.md's
    "### Modules" (a section starts at a line ``**`mtpscope.x`** (`x/`)``)."""
    out: dict[str, set[str]] = {}
    current = None
    body = markdown.split("### Modules", 1)[1] if "### Modules" in markdown else ""
    for line in body.splitlines():
        if line.startswith("#"):
            break
        head = re.match(r"^\*\*`([\w.]+)`\*\*", line)
        if head:
            current = out.setdefault(head.group(1), set())
        elif current is not None and line.startswith("| `"):
            current.add(line.split("`")[1])
    return out


def test_architecture_doc_lists_every_module() -> None:
    """Every module file is a row of its package's table (app/screens/*.py as one row), and every row a file."""
    doc = documented_modules((ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8"))
    want: dict[str, set[str]] = {}
    for folder, package in PACKAGES.items():
        names = set()
        for p in (ROOT / folder).rglob("*.py"):
            rel = p.relative_to(ROOT / folder)
            if "__pycache__" in rel.parts:
                continue
            names.add(f"{rel.parent}/*.py" if len(rel.parts) > 1 else rel.name)
        want[package] = names
    assert {k: sorted(v) for k, v in doc.items()} == {k: sorted(v) for k, v in want.items()}


# ------------------------------------------------------------------- self-tests: each rule can fail

def _mods(sources: Mapping[str, str]) -> dict[str, tuple[Path, list[Imp]]]:
    """A synthetic tree: module name -> source (a name that prefixes another one is a package)."""
    return {m: (Path(m), imports_of(src, m, is_package=any(o.startswith(m + ".") for o in sources)))
            for m, src in sources.items()}


def test_rule_parser_sees_lazy_relative_and_from_imports() -> None:
    src = ("import os\nfrom . import gguf\nfrom .layouts import read_hparams\n"
           "def f():\n    from mtpscope.traces import store\n    import llama_cpp\n"
           "if True:\n    from ..errors import LayoutError\n")
    imps = imports_of(src, "mtpscope.inspector.x")
    assert [(i.name, i.names) for i in imps] == [
        ("os", ()), ("mtpscope.inspector", ("gguf",)), ("mtpscope.inspector.layouts", ("read_hparams",)),
        ("mtpscope.traces", ("store",)), ("llama_cpp", ()), ("mtpscope.errors", ("LayoutError",))]
    assert [i.name for i in imports_of("from . import a\n", "mtpscope.traces", is_package=True)] == ["mtpscope.traces"]
    known = {"mtpscope.inspector", "mtpscope.inspector.gguf", "mtpscope.traces", "mtpscope.traces.store.store"}
    assert resolve(imps[1], known) == {"mtpscope.inspector.gguf"}
    assert resolve(imps[3], known) == {"mtpscope.traces.store.store"}
    assert resolve(Imp("mtpscope.inspector", ("open_gguf",), 1), known) == {"mtpscope.inspector"}
    assert resolve(Imp("numpy", (), 1), known) == set()


def test_rule_streamlit_and_llama_cpp_outside_their_modules_fail() -> None:
    mods = _mods({"mtpscope.app.state": "import streamlit as st\n",
                  "mtpscope.app.views": "def f():\n    import streamlit\n",
                  "mtpscope.traces.analysis.metrics": "import streamlit.components.v1\n",
                  "mtpscope.traces.run.llama_runtime": "def llama():\n    import llama_cpp\n",
                  "mtpscope.traces.run.recorder": "from llama_cpp import llama_cpp as lc\n"})
    assert external_import_violations(mods, "streamlit", ["mtpscope.app"], denied=PURE_APP) == [
        "mtpscope.app.views:2 imports streamlit", "mtpscope.traces.analysis.metrics:1 imports streamlit.components.v1"]
    assert external_import_violations(mods, "llama_cpp", ["mtpscope.traces.run.llama_runtime"]) == [
        "mtpscope.traces.run.recorder:1 imports llama_cpp"]
    # a package whose name merely starts the same is not the package
    assert external_import_violations(_mods({"mtpscope.cli.main": "import streamlit_extras\n"}), "streamlit",
                                      ["mtpscope.app"]) == []


def test_rule_upward_arrows_fail() -> None:
    g = graph(_mods({
        "mtpscope.errors": "import mtpscope.cache\n",
        "mtpscope.cache": "from mtpscope.errors import MtpscopeError\nfrom mtpscope import demo_spec\n",
        "mtpscope.cli.verify": "",
        "mtpscope.demo.vocab": "",
        "mtpscope.demo.build": "",
        "mtpscope.demo.spec": "",
        "mtpscope.app.state": "from mtpscope.inspector import gguf\nfrom mtpscope.traces import store\n"
                              "from mtpscope.demo.spec import DemoPaths\n",
        "mtpscope.app.views": "from mtpscope import demo\nfrom mtpscope.cli.verify import x\n",
        "mtpscope.inspector.gguf": "from mtpscope.errors import LayoutError\nfrom mtpscope.cache import demo_dir\n",
        "mtpscope.inspector.convert": "def f():\n    from mtpscope.demo.vocab import load_vocab\n",
        "mtpscope.inspector.diff": "from mtpscope.traces.store.store import open_trace\nimport mtpscope.cli.verify\n",
        "mtpscope.traces.store.store": "from mtpscope.inspector.gguf import open_gguf\n",
        "mtpscope.traces.run.replay": "from mtpscope.app import state\nimport mtpscope.cli.main\n",
        "mtpscope.cli.main": "",
    }))
    assert layer_violations(g) == [
        "mtpscope.app.views:2 imports mtpscope.cli.verify",
        "mtpscope.app.views:1 imports mtpscope.demo.build",
        "mtpscope.cache:2 imports mtpscope.demo.spec",
        "mtpscope.errors:1 imports mtpscope.cache",
        "mtpscope.inspector.convert:2 imports mtpscope.demo.vocab",
        "mtpscope.inspector.diff:2 imports mtpscope.cli.verify",
        "mtpscope.inspector.diff:1 imports mtpscope.traces.store.store",
        "mtpscope.traces.run.replay:1 imports mtpscope.app.state",
        "mtpscope.traces.run.replay:2 imports mtpscope.cli.main",
    ]


def test_rule_cycles_are_found_and_reported_by_their_path() -> None:
    g = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1, "d": 1}, "d": {}, "e": {"e": 1}, "f": {"d": 1}}
    assert [_fmt(c) for c in cycles(g)] == ["a -> b -> c -> a", "e -> e"]
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {}}) == []
    # through lazy imports in real sources: hf <-> validate
    mods = _mods({"mtpscope.inspector.hf": "def f():\n    from mtpscope.inspector.validate import _F\n",
                  "mtpscope.inspector.validate": "from mtpscope.inspector import hf\n"})
    assert [_fmt(c) for c in cycles(graph(mods))] == [
        "mtpscope.inspector.hf -> mtpscope.inspector.validate -> mtpscope.inspector.hf"]


def test_rule_old_roots_fail() -> None:
    files = {"tests/t.py": imports_of("import inspector.gguf\nfrom traces import metrics\nfrom app import views\n"
                                      "import mtpscope.app\nimport appdirs\n", "tests.t")}
    assert old_root_violations(files) == ["tests/t.py:1 imports inspector.gguf", "tests/t.py:2 imports traces",
                                          "tests/t.py:3 imports app"]


def test_rule_doc_table_parser_sees_rows_per_package() -> None:
    md = ("intro\n### Modules\n\n**`mtpscope.inspector`** (`inspector/`)\n\n| module | job | may import |\n"
          "|---|---|---|\n| `gguf.py` | reader | numpy |\n\n**`mtpscope.app`** (`app/`)\n\n"
          "| `screens/*.py` | pages | streamlit |\n\n## Reader contract\n| `not_a_module.py` | x | y |\n")
    assert documented_modules(md) == {"mtpscope.inspector": {"gguf.py"}, "mtpscope.app": {"screens/*.py"}}
    assert documented_modules("no modules section") == {}
