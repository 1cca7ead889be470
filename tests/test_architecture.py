"""The import rules of docs/ARCHITECTURE.md, checked statically (``ast``; nothing is imported).

Every ``.py`` file under ``inspector/``, ``traces/``, ``app/`` and ``mtpscope/`` is parsed and named by its
import name (``inspector/gguf.py`` -> ``mtpscope.inspector.gguf``, ``traces/store/reader.py`` ->
``mtpscope.traces.store.reader``, ``app/screens/step.py`` -> ``mtpscope.app.screens.step``). Every
``import`` / ``from ... import`` counts, at module level or inside a function (a lazy import is still an
arrow), relative imports resolved, and so does ``importlib.import_module("x")`` / ``__import__("x")`` with a
literal name, and so does each entry of a package's lazy-export table (``_FROM = {"name": "module"}`` or
``{"name": ("module", "attr")}``, imported by its PEP 562 ``__getattr__``). Importing ``a.b.c`` also runs the packages ``a`` and ``a.b``: those implicit arrows count for
what a module can reach. The rules:

- only ``mtpscope.app`` imports ``streamlit``, and its pure helpers (charts, views, ...) do not;
- only the llama.cpp binding module (:data:`LLAMA_BINDING`) imports ``llama_cpp``;
- only the MLX runtime module (:data:`MLX_RUNTIME`) imports ``mlx`` / ``mlx_vlm``;
- only the HF runtime module (:data:`HF_RUNTIME`) and the demo's training / family builders import ``torch`` /
  ``transformers``;
- the layers, bottom up: the leaves ``mtpscope.errors`` / ``mtpscope.cache``, ``mtpscope.inspector``,
  ``mtpscope.traces``, ``mtpscope.app``, then the CLI (``mtpscope.cli``) and the demo (``mtpscope.demo``) on
  top; nothing reaches a layer above its own, not even through another module or a package's ``__init__``
  (the app may reach ``mtpscope.demo.spec`` -- the demo's file names -- and nothing else of the demo);
- inside ``mtpscope.traces`` the areas, bottom up: ``store`` (schema, records, the trace files), ``analysis``
  (pure over frames), ``run`` (llama.cpp, the recorder, replay), then ``sweep`` and ``server``, then
  ``diagnose`` (which runs all of them); an area
  imports only its own modules and the areas below it, so the store imports nothing above it and the
  analysis never imports the run;
- no import cycle between the project's modules (reported by its path ``a -> b -> a``);
- no top-level ``import inspector`` / ``import traces`` / ``import app`` (the old import roots) in the
  library tree, the tests or the benchmarks, and no ``sys.path`` edits there (the tree imports only what is
  installed);
- docs/ARCHITECTURE.md's module tables list every module file, and only those; each row's "may import"
  column names exactly the project modules and third-party packages the module imports;
- no module is over :data:`MAX_LINES` lines unless ARCHITECTURE.md's "Long modules" list names it with the
  one job it holds;
- every module name the demo's stamp hashes (the dotted ``mtpscope.*`` strings of :data:`DEMO_SPEC`) names a
  module of the tree, so that a rename fails here instead of silently hashing ``b"<missing>"`` into a
  new stamp.

Each rule is a pure function over an import graph; the ``test_rule_*`` self-tests feed it a small
synthetic graph that breaks it, so a rule that could never fail would be caught.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: source folder -> import package (pyproject.toml's package-dir mapping).
PACKAGES = {"mtpscope": "mtpscope", "inspector": "mtpscope.inspector", "traces": "mtpscope.traces",
            "app": "mtpscope.app"}
#: folders scanned only for the old import roots and ``sys.path`` edits.
OTHER_FOLDERS = ("tests", "benchmarks")
OLD_ROOTS = ("inspector", "traces", "app")
#: the ``mtpscope`` folder's modules every layer may import -> the only project modules each may import.
LEAVES = {"mtpscope.errors": (), "mtpscope.cache": ("mtpscope.errors",)}
#: app modules documented as pure (no streamlit): tested without a Streamlit runtime.
PURE_APP = ("mtpscope.app.charts", "mtpscope.app.views", "mtpscope.app.round_views", "mtpscope.app.model_views",
            "mtpscope.app.safety", "mtpscope.app.tokens", "mtpscope.app.links", "mtpscope.app.diagnose_report",
            "mtpscope.app.formats")
#: the one module that imports ``llama_cpp``.
LLAMA_BINDING = "mtpscope.traces.run.llama.binding"
#: the one module that imports ``mlx`` and ``mlx_vlm`` (mlx-vlm's MTP loop, observed).
MLX_RUNTIME = "mtpscope.traces.run.mlx_runtime"
#: the one module below the demo that imports ``torch`` and ``transformers`` (HF's assisted generation, observed);
#: the demo's training and tiny-family builders import them too (TORCH_USERS).
HF_RUNTIME = "mtpscope.traces.run.hf_runtime"
TORCH_USERS = (HF_RUNTIME, "mtpscope.demo.train", "mtpscope.demo.families")
#: the layers, bottom up: a module may reach only its own layer and those below.
LAYERS = ("leaf", "inspector", "traces", "app", "top")
#: the areas of ``mtpscope.traces``, bottom up (areas of equal rank may not import each other); a module
#: directly in ``traces/`` (the package's public face, importers, synthetic traces) sits above them all.
TRACE_AREAS = {"store": 0, "analysis": 1, "run": 2, "sweep": 3, "server": 3, "diagnose": 4}
#: what the app may reach of the top layer: the demo's file names (and the packages that hold them).
APP_MAY_REACH_TOP = ("mtpscope.demo.spec", "mtpscope.demo")
#: a module over this many lines must be named, with its one job, in ARCHITECTURE.md's "Long modules".
MAX_LINES = 600
#: the demo's specification: its ``mtpscope.*`` strings name the modules whose sources the stamp hashes.
DEMO_SPEC = ROOT / "mtpscope" / "demo" / "spec.py"
#: the name of a package's lazy-export table (``name -> module`` or ``name -> (module, attr)``).
LAZY_TABLE = "_FROM"


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


_DYNAMIC = ("import_module", "__import__")


def imports_of(source: str, module: str, is_package: bool = False) -> list[Imp]:
    """Every import in ``source`` (module level, in functions, in ``if`` blocks), relative ones resolved
    against ``module`` (``is_package``: ``module`` is a package's ``__init__``), and every
    ``importlib.import_module("x")`` / ``import_module("x")`` / ``__import__("x")`` with a literal name, and
    every entry of a module-level lazy-export table (:data:`LAZY_TABLE`: ``"name": "module"`` counts as
    ``from module import name``, ``"name": ("module", "attr")`` as ``from module import attr``)."""
    out: list[Imp] = []
    base = module.split(".") if is_package else module.split(".")[:-1]
    tree = ast.parse(source)
    out += lazy_exports(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [Imp(a.name, (), node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                up = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                name = ".".join(up + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.append(Imp(name, tuple(a.name for a in node.names), node.lineno))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if fname in _DYNAMIC:
                out.append(Imp(node.args[0].value, (), node.lineno))
    return sorted(out, key=lambda i: i.line)


def lazy_exports(tree: ast.Module) -> list[Imp]:
    """The imports a module-level ``_FROM = {...}`` table stands for (see :func:`imports_of`); a value that
    is neither a string nor a tuple starting with one is skipped."""
    out: list[Imp] = []
    for node in tree.body:
        if not (isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict)):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if not any(isinstance(t, ast.Name) and t.id == LAZY_TABLE for t in targets):
            continue
        for k, v in zip(node.value.keys, node.value.values):
            key = k.value if isinstance(k, ast.Constant) and isinstance(k.value, str) else None
            parts = v.elts if isinstance(v, ast.Tuple) else [v]
            strs = [e.value for e in parts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if not strs or not (isinstance(parts[0], ast.Constant) and isinstance(parts[0].value, str)):
                continue
            name = strs[1] if isinstance(v, ast.Tuple) and len(strs) > 1 else key
            out.append(Imp(strs[0], (name,) if name else (), v.lineno))
    return out


def demo_stamp_modules(source: str) -> list[tuple[str, int]]:
    """``(module name, line)`` for every string constant of the demo's spec that looks like a module path
    (``mtpscope`` or ``mtpscope.x.y``, dotted words only)."""
    return sorted({(n.value, n.lineno) for n in ast.walk(ast.parse(source))
                   if isinstance(n, ast.Constant) and isinstance(n.value, str)
                   and re.fullmatch(r"mtpscope(\.\w+)*", n.value)}, key=lambda x: (x[1], x[0]))


def missing_modules(names: Iterable[tuple[str, int]], known: Iterable[str]) -> list[str]:
    """``line: name`` for every name that is not a module or package among ``known``."""
    known = set(known)
    return [f"{line}: {n}" for n, line in names if n not in known]


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


def with_packages(g: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """``g`` plus the implicit arrows of Python's import system: importing ``a.b.c`` runs ``a/__init__`` and
    ``a/b/__init__`` first, so a module that imports ``a.b.c`` also reaches the packages ``a`` and ``a.b``
    (at the same line). Used for what a module can reach, not for cycles (a package's lazy re-export map
    points down at its own modules by design)."""
    out = {m: dict(deps) for m, deps in g.items()}
    for m, deps in g.items():
        for t, line in deps.items():
            parts = t.split(".")
            for i in range(1, len(parts)):
                pkg = ".".join(parts[:i])
                if pkg in g and pkg != m and not _under(m, pkg):
                    out[m].setdefault(pkg, line)
    return out


def external_imports(imps: Iterable[Imp]) -> set[str]:
    """The third-party top-level packages among ``imps`` (not the standard library, not mtpscope)."""
    tops = {i.name.split(".")[0] for i in imps if i.name}
    return {t for t in tops if t and t != "mtpscope" and t not in sys.stdlib_module_names and t != "__future__"}


# ------------------------------------------------------------------------------------------- rules

def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def layer_of(name: str) -> str:
    """The layer of a project module (:data:`LAYERS`)."""
    if name in LEAVES:
        return "leaf"
    for lib in ("inspector", "traces", "app"):
        if _under(name, f"mtpscope.{lib}"):
            return lib
    return "top"  # mtpscope.cli.*, mtpscope.demo.*, the mtpscope package itself


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


def _may_reach(m: str, t: str) -> bool:
    """Whether module ``m`` may import (or reach) module ``t`` by the layer rules."""
    lm, lt = LAYERS.index(layer_of(m)), LAYERS.index(layer_of(t))
    if m in LEAVES:
        return t == "mtpscope" or t in LEAVES[m]
    if t == "mtpscope":  # the root package (``__version__``) runs for every import of mtpscope.*
        return True
    if layer_of(m) == "app" and layer_of(t) == "top":
        return t in APP_MAY_REACH_TOP
    return lt <= lm


def layer_violations(g: Mapping[str, Mapping[str, int]]) -> list[str]:
    """``module:line imports target`` for every arrow that points to a higher layer (:data:`LAYERS`), or from
    the app to the top layer other than :data:`APP_MAY_REACH_TOP`, or from a leaf to anything but a lower
    leaf."""
    out = []
    for m, deps in sorted(g.items()):
        for t, line in sorted(deps.items()):
            if not _may_reach(m, t):
                out.append(f"{m}:{line} imports {t}")
    return out


def reach_violations(g: Mapping[str, Mapping[str, int]]) -> list[str]:
    """``module reaches target via a -> b -> target`` for every module that reaches, through any chain of
    imports (package ``__init__`` s included: :func:`with_packages`), a module its layer may not reach.
    Catches what a permitted import pulls in behind it (the app importing the demo's ``spec``, which
    imports the CLI)."""
    gp = with_packages(g)
    out = []
    for m in sorted(gp):
        prev = {m: ""}
        frontier = [m]
        while frontier:
            nxt = []
            for v in frontier:
                for t in sorted(gp.get(v, {})):
                    if t in prev:
                        continue
                    prev[t] = v
                    nxt.append(t)
                    if not _may_reach(m, t):
                        path, cur = [t], v
                        while cur != m:
                            path.append(cur)
                            cur = prev[cur]
                        out.append(f"{m} reaches {t} via {' -> '.join([m, *reversed(path)])}")
            frontier = nxt
    return out


def _area(name: str) -> str | None:
    """The traces area of a module (``store``, ``run``, ...); ``"."`` for a module directly in ``traces/``;
    None outside ``mtpscope.traces``."""
    if not _under(name, "mtpscope.traces"):
        return None
    parts = name.split(".")
    if len(parts) >= 4 and parts[2] in TRACE_AREAS:
        return parts[2]
    return "."


def area_violations(g: Mapping[str, Mapping[str, int]]) -> list[str]:
    """``module:line imports target`` for every arrow between two areas of ``mtpscope.traces`` that does not
    point to a strictly lower area (:data:`TRACE_AREAS`); a module directly in ``traces/`` sits above every
    area and no area module may import it."""
    out = []
    for m, deps in sorted(g.items()):
        am = _area(m)
        if am is None or am == ".":
            continue
        for t, line in sorted(deps.items()):
            at = _area(t)
            if at is None or at == am:
                continue
            if at == "." or TRACE_AREAS.get(at, 99) >= TRACE_AREAS[am]:
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


def sys_path_edits(source: str) -> list[int]:
    """Lines that change ``sys.path`` (``sys.path.insert / append / extend``, assignments to it)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("insert", "append", "extend") and ast.unparse(node.func.value) == "sys.path":
            out.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(ast.unparse(t).startswith("sys.path") for t in targets):
                out.append(node.lineno)
    return sorted(out)


def _fmt(cycle: list[str]) -> str:
    return " -> ".join(cycle)


# ------------------------------------------------------------------------------ ARCHITECTURE.md tables

@dataclass(frozen=True)
class DocRow:
    """One row of a module table: its package, the file (relative to the package folder), the
    project modules and third-party packages of its "may import" column."""

    package: str
    file: str
    modules: frozenset[str]
    external: frozenset[str]


_TABLE_HEAD = re.compile(r"^\*\*`([\w.]+)`\*\* \(`([\w/]+)/`\)")


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside parentheses."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [s.strip() for s in out if s.strip()]


def parse_may_import(cell: str) -> tuple[set[str], set[str]]:
    """The "may import" column: entries separated by commas, each a project module in backticks as its
    dotted name below ``mtpscope`` (`` `traces.store.layout` ``, `` `errors` ``) or a third-party package's
    import name (numpy, pyarrow), optionally followed by a note in parentheses; ``nothing`` for none.
    Returns (project modules as full dotted names, third-party packages)."""
    mods, ext = set(), set()
    for entry in _split_top(cell):
        head = re.sub(r"\(.*\)", "", entry).strip()
        if head in ("nothing", "-", ""):
            continue
        m = re.fullmatch(r"`([\w.]+)`", head)
        if m:
            mods.add("mtpscope" if m.group(1) == "mtpscope" else "mtpscope." + m.group(1))
        else:
            ext.add(head)
    return mods, ext


def documented_rows(markdown: str) -> list[DocRow]:
    """The rows of every module table under docs/ARCHITECTURE.md's "### Modules" (a table starts at a line
    ``**`mtpscope.x.y`** (`x/y/`)``; a row is ``| `file.py` | one job | may import |``)."""
    out: list[DocRow] = []
    current = None
    body = markdown.split("### Modules", 1)[1] if "### Modules" in markdown else ""
    for line in body.splitlines():
        if line.startswith("## ") or line.startswith("### "):
            break
        head = _TABLE_HEAD.match(line)
        if head:
            current = head.group(1)
        elif current is not None and line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            mods, ext = parse_may_import(cells[-1]) if len(cells) >= 3 else (set(), set())
            out.append(DocRow(current, cells[0].strip("`"), frozenset(mods), frozenset(ext)))
    return out


def long_modules_listed(markdown: str) -> set[str]:
    """Module file paths (relative to the checkout) named in ARCHITECTURE.md's "### Long modules" list."""
    body = markdown.split("### Long modules", 1)[1] if "### Long modules" in markdown else ""
    body = re.split(r"^#{2,3} ", body, maxsplit=1, flags=re.M)[0]
    return set(re.findall(r"^- `([\w/]+\.py)`", body, flags=re.M))


def table_problems(rows: Iterable[DocRow], mods: Mapping[str, tuple[Path, list[Imp]]]) -> list[str]:
    """Differences between the module tables and the tree: modules without a row, rows without a module,
    and per module the project modules / third-party packages it imports that its row does not name, or
    that its row names and it does not import."""
    g = graph(mods)
    by_module: dict[str, DocRow] = {}
    out = []
    for r in rows:
        stem = r.file[:-3]
        if stem.endswith("*"):  # screens/*.py: every module of that folder
            prefix = f"{r.package}.{stem[:-2].replace('/', '.')}."
            names = [m for m in mods if m.startswith(prefix)]
        else:
            names = [r.package if stem == "__init__" else f"{r.package}.{stem.replace('/', '.')}"]
        for n in names:
            by_module[n] = r
        if not any(n in mods for n in names):
            out.append(f"row without a module: {r.package} {r.file}")
    for m, (_, imps) in sorted(mods.items()):
        r = by_module.get(m)
        if r is None:
            out.append(f"module without a row: {m}")
            continue
        got_mods = {t for t in g[m] if not (r.file.endswith("*.py") and t in by_module and by_module[t] is r)}
        got_ext = external_imports(imps)
        glob = r.file.endswith("*.py")
        for t in sorted(got_mods - r.modules):
            out.append(f"{m} imports {t}: not in its 'may import'")
        for t in sorted(got_ext - r.external):
            out.append(f"{m} imports {t}: not in its 'may import'")
        if not glob:
            for t in sorted(r.modules - got_mods):
                out.append(f"{m}: 'may import' names {t}, which it does not import")
            for t in sorted(r.external - got_ext):
                out.append(f"{m}: 'may import' names {t}, which it does not import")
    return out


def long_module_problems(mods: Mapping[str, tuple[Path, list[Imp]]], listed: set[str],
                         max_lines: int = MAX_LINES) -> list[str]:
    """Modules over ``max_lines`` lines missing from the "Long modules" list, and listed ones that are not
    long (or not there)."""
    out = []
    long = set()
    for _, (path, _imps) in sorted(mods.items()):
        rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.as_posix()
        n = len(path.read_text(encoding="utf-8").splitlines()) if path.exists() else 0
        if n > max_lines:
            long.add(rel)
            if rel not in listed:
                out.append(f"{rel} has {n} lines (over {max_lines}) and is not in 'Long modules'")
    out += [f"{rel} is in 'Long modules' but is not over {max_lines} lines" for rel in sorted(listed - long)]
    return out


# ------------------------------------------------------------------------------------ the real tree

@pytest.fixture(scope="module")
def tree() -> dict[str, tuple[Path, list[Imp]]]:
    mods = scan()
    assert {"mtpscope.errors", "mtpscope.inspector.gguf", LLAMA_BINDING, "mtpscope.app.main",
            "mtpscope.app.screens.step", "mtpscope.cli.main", "mtpscope.demo.spec"} <= set(mods), sorted(mods)
    return mods


@pytest.fixture(scope="module")
def doc() -> str:
    return (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")


def test_only_app_imports_streamlit(tree) -> None:
    assert external_import_violations(tree, "streamlit", ["mtpscope.app"], denied=PURE_APP) == []


def test_only_the_binding_module_imports_llama_cpp(tree) -> None:
    assert external_import_violations(tree, "llama_cpp", [LLAMA_BINDING]) == []


def test_only_the_mlx_runtime_imports_mlx(tree) -> None:
    assert external_import_violations(tree, "mlx", [MLX_RUNTIME]) == []
    assert external_import_violations(tree, "mlx_vlm", [MLX_RUNTIME]) == []


def test_only_the_hf_runtime_and_the_demo_builders_import_torch(tree) -> None:
    assert external_import_violations(tree, "torch", TORCH_USERS) == []
    assert external_import_violations(tree, "transformers", TORCH_USERS) == []


def test_rule_torch_outside_its_modules_fails() -> None:
    mods = _mods({HF_RUNTIME: "def f():\n    import torch\n    from transformers import Gemma4ForCausalLM\n",
                  "mtpscope.traces.run.hf_record": "import torch\n",
                  "mtpscope.demo.train.models": "import torch\n",
                  "mtpscope.traces.analysis.runtime_diff": "from transformers import AutoModel\n"})
    assert external_import_violations(mods, "torch", TORCH_USERS) == ["mtpscope.traces.run.hf_record:1 imports torch"]
    assert external_import_violations(mods, "transformers", TORCH_USERS) == [
        "mtpscope.traces.analysis.runtime_diff:1 imports transformers"]


def test_rule_mlx_outside_its_module_fails() -> None:
    mods = _mods({MLX_RUNTIME: "def f():\n    import mlx.core as mx\n    from mlx_vlm.speculative import mtp\n",
                  "mtpscope.traces.run.mlx_record": "import mlx.core\n",
                  "mtpscope.traces.analysis.runtime_diff": "from mlx_vlm.speculative import mtp\n"})
    assert external_import_violations(mods, "mlx", [MLX_RUNTIME]) == ["mtpscope.traces.run.mlx_record:1 imports mlx.core"]
    assert external_import_violations(mods, "mlx_vlm", [MLX_RUNTIME]) == [
        "mtpscope.traces.analysis.runtime_diff:1 imports mlx_vlm.speculative"]


def test_arrows_point_down(tree) -> None:
    assert layer_violations(graph(tree)) == []


def test_nothing_reaches_a_layer_above_its_own(tree) -> None:
    assert reach_violations(graph(tree)) == []


def test_trace_areas_point_down(tree) -> None:
    assert area_violations(graph(tree)) == []


def test_no_import_cycles(tree) -> None:
    assert [_fmt(c) for c in cycles(graph(tree))] == []


def _other_files() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8")
            for folder in OTHER_FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))}


def test_no_old_import_roots() -> None:
    files = {f"{m}": imps for m, (_, imps) in scan().items()}
    for rel, src in _other_files().items():
        files[rel] = imports_of(src, rel.replace("/", ".")[:-3])
    assert old_root_violations(files) == []


def test_no_sys_path_edits(tree) -> None:
    srcs = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p, _ in tree.values()}
    srcs.update(_other_files())
    assert [f"{f}:{line}" for f, src in sorted(srcs.items()) for line in sys_path_edits(src)] == []


def test_lazy_export_tables_are_seen_as_imports(tree) -> None:
    """The packages' ``_FROM`` tables reach the modules they name (and so fall under every rule above)."""
    g = graph(tree)
    assert {"mtpscope.traces.store.reader", "mtpscope.traces.sweep.reader"} <= set(g["mtpscope.traces"])
    assert {"mtpscope.inspector.gguf", "mtpscope.inspector.inventory"} <= set(g["mtpscope.inspector"])


def test_demo_stamp_names_existing_modules(tree) -> None:
    """Every module the demo's stamp hashes exists (a rename must fail here, not change the stamp)."""
    names = demo_stamp_modules(DEMO_SPEC.read_text(encoding="utf-8"))
    assert len(names) >= 20, names   # the three source tuples are seen at all
    known = set(tree) | set(scan(packages={"sample_configs": "mtpscope.sample_configs"}))
    assert missing_modules(names, known) == []


def test_architecture_doc_tables_match_the_imports(tree, doc) -> None:
    """Every module has a row, every row a module, and each row's "may import" is exactly what it imports."""
    assert table_problems(documented_rows(doc), tree) == []


def test_long_modules_are_named_with_their_job(tree, doc) -> None:
    assert long_module_problems(tree, long_modules_listed(doc)) == []


# ------------------------------------------------------------------- self-tests: each rule can fail

def _mods(sources: Mapping[str, str]) -> dict[str, tuple[Path, list[Imp]]]:
    """A synthetic tree: module name -> source (a name that prefixes another one is a package)."""
    return {m: (Path(m), imports_of(src, m, is_package=any(o.startswith(m + ".") for o in sources)))
            for m, src in sources.items()}


def test_rule_parser_sees_lazy_relative_from_and_dynamic_imports() -> None:
    src = ("import os\nfrom . import gguf\nfrom .layouts import read_hparams\n"
           "def f():\n    from mtpscope.traces import store\n    import llama_cpp\n"
           "if True:\n    from ..errors import LayoutError\n"
           "import importlib\nm = importlib.import_module('mtpscope.app.state')\n"
           "n = __import__('llama_cpp.llama_cpp')\nk = importlib.import_module(name)\n")
    imps = imports_of(src, "mtpscope.inspector.x")
    assert [(i.name, i.names) for i in imps if i.name != "importlib"] == [
        ("os", ()), ("mtpscope.inspector", ("gguf",)), ("mtpscope.inspector.layouts", ("read_hparams",)),
        ("mtpscope.traces", ("store",)), ("llama_cpp", ()), ("mtpscope.errors", ("LayoutError",)),
        ("mtpscope.app.state", ()), ("llama_cpp.llama_cpp", ())]
    assert [i.name for i in imports_of("from . import a\n", "mtpscope.traces", is_package=True)] == ["mtpscope.traces"]
    known = {"mtpscope.inspector", "mtpscope.inspector.gguf", "mtpscope.traces", "mtpscope.traces.store"}
    assert resolve(imps[1], known) == {"mtpscope.inspector.gguf"}
    assert resolve(imps[3], known) == {"mtpscope.traces.store"}
    assert resolve(Imp("mtpscope.inspector", ("open_gguf",), 1), known) == {"mtpscope.inspector"}
    assert resolve(Imp("numpy", (), 1), known) == set()
    assert external_imports(imps) == {"llama_cpp"}


def test_rule_streamlit_and_llama_cpp_outside_their_modules_fail() -> None:
    mods = _mods({"mtpscope.app.state": "import streamlit as st\n",
                  "mtpscope.app.views": "def f():\n    import streamlit\n",
                  "mtpscope.traces.analysis.metrics": "import streamlit.components.v1\n",
                  LLAMA_BINDING: "def llama():\n    import llama_cpp\n",
                  "mtpscope.traces.run.recorder": "from llama_cpp import llama_cpp as lc\n",
                  "mtpscope.demo.train": "import importlib\nlc = importlib.import_module('llama_cpp')\n"})
    assert external_import_violations(mods, "streamlit", ["mtpscope.app"], denied=PURE_APP) == [
        "mtpscope.app.views:2 imports streamlit", "mtpscope.traces.analysis.metrics:1 imports streamlit.components.v1"]
    assert external_import_violations(mods, "llama_cpp", [LLAMA_BINDING]) == [
        "mtpscope.demo.train:2 imports llama_cpp", "mtpscope.traces.run.recorder:1 imports llama_cpp"]
    # a package whose name merely starts the same is not the package
    assert external_import_violations(_mods({"mtpscope.cli.main": "import streamlit_extras\n"}), "streamlit",
                                      ["mtpscope.app"]) == []


def test_rule_upward_arrows_fail() -> None:
    g = graph(_mods({
        "mtpscope.errors": "import mtpscope.cache\n",
        "mtpscope.cache": "from mtpscope.errors import MtpscopeError\nfrom mtpscope.demo import spec\n",
        "mtpscope.cli.verify": "",
        "mtpscope.demo": "",
        "mtpscope.demo.vocab": "",
        "mtpscope.demo.build": "",
        "mtpscope.demo.spec": "",
        "mtpscope.app.state": "from mtpscope.inspector import gguf\nfrom mtpscope.traces.store import writer\n"
                              "from mtpscope.demo.spec import DemoPaths\n",
        "mtpscope.app.views": "from mtpscope.demo import build\nfrom mtpscope.cli.verify import x\n",
        "mtpscope.inspector.gguf": "from mtpscope.errors import LayoutError\nfrom mtpscope.cache import demo_dir\n",
        "mtpscope.inspector.convert": "def f():\n    from mtpscope.demo.vocab import load_vocab\n",
        "mtpscope.inspector.diff": "from mtpscope.traces.store.writer import open_trace\nimport mtpscope.cli.verify\n",
        "mtpscope.traces.store.writer": "from mtpscope.inspector.gguf import open_gguf\n",
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
        "mtpscope.inspector.diff:1 imports mtpscope.traces.store.writer",
        "mtpscope.traces.run.replay:1 imports mtpscope.app.state",
        "mtpscope.traces.run.replay:2 imports mtpscope.cli.main",
    ]


def test_rule_reaching_upwards_through_a_permitted_module_or_a_package_init_fails() -> None:
    g = graph(_mods({
        "mtpscope.app.state": "from mtpscope.demo.spec import DemoPaths\n",
        "mtpscope.demo": "def __getattr__(n):\n    from mtpscope.demo import build\n",
        "mtpscope.demo.spec": "import json\n",
        "mtpscope.demo.build": "from mtpscope.cli import common\n",
        "mtpscope.cli": "",
        "mtpscope.cli.common": "",
        "mtpscope.inspector.gguf": "from mtpscope.traces.store.schema import S\n",
        "mtpscope.traces": "def __getattr__(n):\n    import mtpscope.app.views\n",
        "mtpscope.traces.store": "",
        "mtpscope.traces.store.schema": "",
        "mtpscope.app.views": "",
    }))
    assert layer_violations(g) == ["mtpscope.inspector.gguf:1 imports mtpscope.traces.store.schema",
                                   "mtpscope.traces:2 imports mtpscope.app.views"]
    got = reach_violations(g)
    # the app imports only demo.spec, but running mtpscope.demo's __init__ pulls in the builder and the CLI
    assert "mtpscope.app.state reaches mtpscope.demo.build via mtpscope.app.state -> mtpscope.demo -> " \
           "mtpscope.demo.build" in got
    assert any(v.startswith("mtpscope.app.state reaches mtpscope.cli.common via") for v in got)
    # the inspector reaches the app through the traces package's __init__
    assert "mtpscope.inspector.gguf reaches mtpscope.app.views via mtpscope.inspector.gguf -> mtpscope.traces " \
           "-> mtpscope.app.views" in got
    # a clean chain reaches nothing it may not
    ok = graph(_mods({"mtpscope.app.state": "from mtpscope.demo.spec import D\n", "mtpscope.demo": "",
                      "mtpscope.demo.spec": "from mtpscope.errors import E\n", "mtpscope.errors": ""}))
    assert reach_violations(ok) == []


def test_rule_trace_areas_fail_upwards_and_sideways() -> None:
    g = graph(_mods({
        "mtpscope.traces": "",
        "mtpscope.traces.importers": "from mtpscope.traces.store.writer import W\n",
        "mtpscope.traces.store.writer": "from mtpscope.traces.analysis.metrics import m\n",
        "mtpscope.traces.store.layout": "from mtpscope.traces.store import writer\n",
        "mtpscope.traces.analysis.metrics": "from mtpscope.traces.store.layout import M\n"
                                            "from mtpscope.traces.run.prompts import P\n",
        "mtpscope.traces.run.prompts": "from mtpscope.traces.analysis.metrics import m\n"
                                       "from mtpscope.traces.sweep.spec import S\n",
        "mtpscope.traces.sweep.spec": "from mtpscope.traces.run.prompts import P\n"
                                      "from mtpscope.traces.server.probe import p\n",
        "mtpscope.traces.server.probe": "from mtpscope.traces.run.prompts import P\nimport mtpscope.traces.importers\n",
    }))
    assert area_violations(g) == [
        "mtpscope.traces.analysis.metrics:2 imports mtpscope.traces.run.prompts",
        "mtpscope.traces.run.prompts:2 imports mtpscope.traces.sweep.spec",
        "mtpscope.traces.server.probe:2 imports mtpscope.traces.importers",
        "mtpscope.traces.store.writer:1 imports mtpscope.traces.analysis.metrics",
        "mtpscope.traces.sweep.spec:2 imports mtpscope.traces.server.probe",
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


def test_rule_old_roots_and_sys_path_edits_fail() -> None:
    files = {"tests/t.py": imports_of("import inspector.gguf\nfrom traces import metrics\nfrom app import views\n"
                                      "import mtpscope.app\nimport appdirs\n", "tests.t")}
    assert old_root_violations(files) == ["tests/t.py:1 imports inspector.gguf", "tests/t.py:2 imports traces",
                                          "tests/t.py:3 imports app"]
    src = ("import sys\nsys.path.insert(0, 'x')\nsys.path.append('y')\nsys.path[:0] = ['z']\n"
           "sys.path += ['w']\nprint(sys.path)\nx = [1]\nx.insert(0, 2)\n")
    assert sys_path_edits(src) == [2, 3, 4, 5]


def test_rule_doc_tables_are_parsed_per_package_with_their_may_import() -> None:
    md = ("intro\n### Modules\n\n**`mtpscope.inspector`** (`inspector/`)\n\n| module | job | may import |\n"
          "|---|---|---|\n| `gguf.py` | reader | numpy, gguf (dequant only), `inspector.ggml_types`, `errors` |\n"
          "| `paths.py` | file checks | nothing |\n\n**`mtpscope.traces.store`** (`traces/store/`)\n\n"
          "| `layout.py` | names | `errors` (`TraceError`, lazily) |\n\n**`mtpscope.app`** (`app/`)\n\n"
          "| `screens/*.py` | pages | streamlit, `app.state` |\n\n## Reader contract\n| `not_a_module.py` | x | y |\n")
    rows = documented_rows(md)
    assert [(r.package, r.file) for r in rows] == [("mtpscope.inspector", "gguf.py"),
                                                    ("mtpscope.inspector", "paths.py"),
                                                    ("mtpscope.traces.store", "layout.py"),
                                                    ("mtpscope.app", "screens/*.py")]
    assert rows[0].modules == {"mtpscope.inspector.ggml_types", "mtpscope.errors"}
    assert rows[0].external == {"numpy", "gguf"}
    assert rows[1].modules == rows[1].external == frozenset()
    assert rows[2].modules == {"mtpscope.errors"}
    assert documented_rows("no modules section") == []


def test_rule_doc_table_drift_fails_both_ways() -> None:
    mods = _mods({"mtpscope.inspector": "", "mtpscope.inspector.gguf": "import numpy\nfrom mtpscope.errors import E\n",
                  "mtpscope.inspector.paths": "import pandas\n", "mtpscope.errors": "",
                  "mtpscope.inspector.new": ""})
    rows = [DocRow("mtpscope.inspector", "__init__.py", frozenset(), frozenset()),
            DocRow("mtpscope.inspector", "gguf.py", frozenset({"mtpscope.inspector.paths"}), frozenset({"numpy"})),
            DocRow("mtpscope.inspector", "paths.py", frozenset(), frozenset({"pandas", "pyarrow"})),
            DocRow("mtpscope.inspector", "gone.py", frozenset(), frozenset())]
    assert table_problems(rows, {**mods, "mtpscope.errors": mods["mtpscope.errors"]}) == [
        "row without a module: mtpscope.inspector gone.py",
        "module without a row: mtpscope.errors",
        "mtpscope.inspector.gguf imports mtpscope.errors: not in its 'may import'",
        "mtpscope.inspector.gguf: 'may import' names mtpscope.inspector.paths, which it does not import",
        "module without a row: mtpscope.inspector.new",
        "mtpscope.inspector.paths: 'may import' names pyarrow, which it does not import",
    ]


def test_rule_long_modules_must_be_listed(tmp_path) -> None:
    big, small = tmp_path / "big.py", tmp_path / "small.py"
    big.write_text("x = 1\n" * 12)
    small.write_text("x = 1\n")
    mods = {"a.big": (big, []), "a.small": (small, [])}
    assert long_module_problems(mods, set(), max_lines=10) == [f"{big.as_posix()} has 12 lines (over 10) and is "
                                                               "not in 'Long modules'"]
    assert long_module_problems(mods, {big.as_posix()}, max_lines=10) == []
    assert long_module_problems(mods, {big.as_posix(), small.as_posix()}, max_lines=10) == [
        f"{small.as_posix()} is in 'Long modules' but is not over 10 lines"]
    md = "### Long modules\n\n- `traces/run/replay.py`: one job (replay)\n\n## Next\n- `x.py`: no\n"
    assert long_modules_listed(md) == {"traces/run/replay.py"}


def test_rule_lazy_export_tables_count_as_imports() -> None:
    src = ('_FROM = {\n    "open_gguf": "mtpscope.inspector.gguf",\n    "open": ("mtpscope.traces.store.reader", "open_trace"),\n'
           '    "bad": 3,\n    "up": ("mtpscope.app.views", "f"),\n}\nOTHER = {"x": "mtpscope.cli.main"}\n'
           'def __getattr__(n):\n    import importlib\n    return importlib.import_module(_FROM[n])\n')
    assert [(i.name, i.names, i.line) for i in imports_of(src, "mtpscope.traces", is_package=True)
            if i.name != "importlib"] == [
        ("mtpscope.inspector.gguf", ("open_gguf",), 2), ("mtpscope.traces.store.reader", ("open_trace",), 3),
        ("mtpscope.app.views", ("f",), 5)]
    # an upward import named only in a package's table fails the layer rules, directly and by reach
    g = graph(_mods({"mtpscope.inspector": '_FROM = {"x": ("mtpscope.traces.store.reader", "x")}\n',
                     "mtpscope.inspector.gguf": "", "mtpscope.traces": "", "mtpscope.traces.store": "",
                     "mtpscope.traces.store.reader": '_FROM = {"v": "mtpscope.app.views"}\n',
                     "mtpscope.app": "", "mtpscope.app.views": ""}))
    assert layer_violations(g) == ["mtpscope.inspector:1 imports mtpscope.traces.store.reader",
                                   "mtpscope.traces.store.reader:1 imports mtpscope.app.views"]
    assert "mtpscope.inspector reaches mtpscope.app.views via mtpscope.inspector -> " \
           "mtpscope.traces.store.reader -> mtpscope.app.views" in reach_violations(g)


def test_rule_a_renamed_demo_stamp_module_fails() -> None:
    src = ('import importlib.resources\n_MODEL = ("mtpscope.demo.build", "mtpscope.inspector.gguf_write")\n'
           '_TRACE = ("mtpscope.traces.run.recorder",\n          "mtpscope.traces.mtp_runtime")\n'
           'R = importlib.resources.files("mtpscope.sample_configs").joinpath("demo-record.json")\n'
           'CMD = "mtpscope record"\nKEY = "mtpscope.demo-x"\n')
    names = demo_stamp_modules(src)
    assert names == [("mtpscope.demo.build", 2), ("mtpscope.inspector.gguf_write", 2),
                     ("mtpscope.traces.run.recorder", 3), ("mtpscope.traces.mtp_runtime", 4),
                     ("mtpscope.sample_configs", 5)]
    known = {"mtpscope.demo.build", "mtpscope.inspector.gguf_write", "mtpscope.traces.run.recorder",
             "mtpscope.traces.run.mtp_runtime", "mtpscope.sample_configs"}
    assert missing_modules(names, known) == ["4: mtpscope.traces.mtp_runtime"]
