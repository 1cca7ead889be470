"""Every module path named in the prose exists: docs/*.md, README.md and the docstrings and comments of the
package (``inspector/``, ``traces/``, ``app/``, ``mtpscope/``), the tests and the benchmarks, checked
statically (``ast``; nothing is imported).

Two kinds of names are checked:

- dotted names that start at an import root: ``mtpscope.x.y``, or the short forms the docs use below
  ``mtpscope`` -- ``traces.x.y``, ``inspector.x``, ``app.x`` (``traces.store.reader`` is
  ``mtpscope.traces.store.reader``). The longest prefix must be a module or a package; what follows it,
  if anything, must be a name that module defines at its top level (a function, a class, an assignment, an
  import, a sub-module, a lazy export of a package's ``_FROM`` table), and a second part after a class a
  name that class defines (``traces.store.reader.Trace.rounds``). Deeper chains are not followed.
- file paths below the checkout: ``traces/run/recorder.py``, ``docs/SWEEP.md``, ``app/screens/`` -- they
  must exist (a glob such as ``app/screens/*.py`` is skipped).

A file name that merely looks dotted (``app.py``, ``sweep.json``) is not a module path, and nor is a name
glued to a longer word (``x.traces.y``, ``my-app.io``). The ``test_rule_*`` self-tests plant bad paths in a
small synthetic text, so a checker that could never fail would be caught.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: source folder -> import package (pyproject.toml's package-dir mapping).
PACKAGES = {"mtpscope": "mtpscope", "inspector": "mtpscope.inspector", "traces": "mtpscope.traces",
            "app": "mtpscope.app", "sample_configs": "mtpscope.sample_configs"}
#: folders whose Python files are scanned too (their docstrings name the modules they test or time).
OTHER_FOLDERS = ("tests", "benchmarks")
#: files whose docstrings name made-up modules on purpose (the rule self-tests).
MADE_UP = ("tests/test_architecture.py", "tests/test_doc_paths.py")
#: the short roots the prose uses for ``mtpscope.<root>``.
SHORT_ROOTS = ("traces", "inspector", "app")
#: folders a file path may start with.
PATH_ROOTS = ("inspector", "traces", "app", "mtpscope", "tests", "benchmarks", "docs", "sample_configs")
#: last parts that make a dotted word a file name, not a module path.
FILE_SUFFIXES = {"py", "md", "json", "toml", "txt", "c", "h", "cmake", "gguf", "parquet", "log", "yaml", "yml",
                 "html", "csv", "ndjson", "jsonl", "safetensors", "sh", "cfg", "ini", "lock", "arrow", "bin"}

#: dotted names that are not module paths: the GGUF metadata keys ``mtpscope quantize`` writes
#: (``mtpscope.quantize.source``, ...).
NOT_MODULES = ("mtpscope.quantize",)
#: paths that are not in the checkout by design: the demo's trace folders (below the demo folder in the
#: cache), an example output folder, and the folder name the app must not use (``app/pages/``).
NOT_CHECKOUT = ("traces/clean", "traces/noisy", "traces/buggy", "traces/f32", "traces/q8_0", "traces/run1",
                "app/pages")

_DOTTED = re.compile(r"(?<![\w./-])((?:mtpscope|traces|inspector|app)(?:\.[A-Za-z_]\w*)+)(?![\w-])")
_PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(PATH_ROOTS) + r")/[\w./-]*[\w/])(?![\w*/{\[-]|\.[\w*])")


@dataclass(frozen=True)
class Module:
    """One module or package of the tree: its file, top-level names, and per class the names it defines."""

    path: Path
    names: frozenset[str]
    classes: Mapping[str, frozenset[str]]


@dataclass(frozen=True)
class Ref:
    """One path named in the prose: where (``file:line``) and the text as written."""

    where: str
    text: str


# ------------------------------------------------------------------------------------------ the tree

def _bound(node: ast.AST) -> set[str]:
    """Names bound by an assignment target."""
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, (ast.Tuple, ast.List)):
        return set().union(*(_bound(e) for e in node.elts)) if node.elts else set()
    return set()


def _defined(body: Iterable[ast.stmt]) -> set[str]:
    """Names a block defines, looking into ``if`` / ``try`` / ``with`` blocks but not into functions."""
    out: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                out |= _bound(t)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            out |= _bound(node.target)
        elif isinstance(node, ast.Import):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.If):
            out |= _defined(node.body) | _defined(node.orelse)
        elif isinstance(node, ast.Try):
            out |= _defined(node.body) | _defined(node.orelse) | _defined(node.finalbody)
            for h in node.handlers:
                out |= _defined(h.body)
        elif isinstance(node, (ast.With, ast.For)):
            out |= _defined(node.body)
    return out


def _lazy_exports(tree: ast.Module) -> set[str]:
    """The keys of a module-level ``_FROM = {...}`` table (a package's PEP 562 lazy exports)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_FROM" for t in node.targets) \
                and isinstance(node.value, ast.Dict):
            return {k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return set()


def parse_module(path: Path, source: str) -> Module:
    """:class:`Module` of ``source`` (read from ``path``)."""
    tree = ast.parse(source)
    classes = {n.name: frozenset(_defined(n.body)) for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    return Module(path, frozenset(_defined(tree.body) | _lazy_exports(tree)), classes)


def scan_tree(root: Path = ROOT, packages: Mapping[str, str] = PACKAGES) -> dict[str, Module]:
    """Import name -> :class:`Module` for every ``.py`` below the package folders; a package's sub-modules
    are among its names."""
    mods: dict[str, Module] = {}
    for folder, package in packages.items():
        d = root / folder
        for p in sorted(d.rglob("*.py")):
            rel = p.relative_to(d).with_suffix("")
            if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
                continue
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([package, *parts])] = parse_module(p, p.read_text(encoding="utf-8"))
    for name in list(mods):           # a package defines its sub-modules (``traces.store.reader``)
        parent, _, child = name.rpartition(".")
        if parent in mods:
            m = mods[parent]
            mods[parent] = Module(m.path, m.names | {child}, m.classes)
    return mods


# ------------------------------------------------------------------------------------------ the prose

def _comments_and_docstrings(source: str) -> list[tuple[int, str]]:
    """(first line, text) of every comment and docstring (module, class, function) of a Python source."""
    out: list[tuple[int, str]] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.append((first.lineno, first.value.value))
    return sorted(out)


def _refs_in(text: str, where: str, first_line: int) -> list[Ref]:
    out = []
    for i, line in enumerate(text.splitlines()):
        loc = f"{where}:{first_line + i}"
        for m in _DOTTED.finditer(line):
            if m.group(1).rsplit(".", 1)[1] not in FILE_SUFFIXES:
                out.append(Ref(loc, m.group(1)))
        out += [Ref(loc, m.group(1)) for m in _PATH.finditer(line)]
    return out


def references(files: Mapping[str, str]) -> list[Ref]:
    """Every module path and file path named in ``files`` (relative path -> text): all of a Markdown file,
    the comments and docstrings of a Python file."""
    out: list[Ref] = []
    for rel, text in sorted(files.items()):
        if rel.endswith(".py"):
            for line, chunk in _comments_and_docstrings(text):
                out += _refs_in(chunk, rel, line)
        else:
            out += _refs_in(text, rel, 1)
    return out


def prose_files(root: Path = ROOT) -> dict[str, str]:
    """docs/*.md, README.md and every ``.py`` of the package folders, the tests and the benchmarks but
    :data:`MADE_UP` (relative path -> text)."""
    paths = [*sorted((root / "docs").glob("*.md")), root / "README.md"]
    for folder in (*PACKAGES, *OTHER_FOLDERS):
        paths += [p for p in sorted((root / folder).rglob("*.py")) if "__pycache__" not in p.parts]
    files = {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8") for p in paths}
    return {rel: text for rel, text in files.items() if rel not in MADE_UP}


# ------------------------------------------------------------------------------------------ the check

def full_name(dotted: str) -> str:
    """``traces.x`` -> ``mtpscope.traces.x`` (the short roots); ``mtpscope.x`` unchanged."""
    return f"mtpscope.{dotted}" if dotted.split(".")[0] in SHORT_ROOTS else dotted


def dotted_problem(dotted: str, mods: Mapping[str, Module]) -> str | None:
    """Why ``dotted`` names nothing in ``mods`` (None when it names a module, a package, a module's
    top-level name, or a class's member)."""
    parts = full_name(dotted).split(".")
    for i in range(len(parts), 0, -1):
        mod = mods.get(".".join(parts[:i]))
        if mod is None:
            continue
        rest = parts[i:]
        if not rest:
            return None
        if rest[0] not in mod.names:
            return f"{'.'.join(parts[:i])} has no {rest[0]!r}"
        if len(rest) >= 2 and rest[0] in mod.classes and rest[1] not in mod.classes[rest[0]]:
            return f"class {'.'.join(parts[:i + 1])} has no {rest[1]!r}"
        return None
    return "no such module"


def path_problem(rel: str, root: Path = ROOT) -> str | None:
    """Why the checkout has no file or folder ``rel`` (None when it has)."""
    return None if (root / rel.rstrip("/")).exists() else "no such file or folder"


def problems(refs: Iterable[Ref], mods: Mapping[str, Module], root: Path = ROOT) -> list[str]:
    """``file:line: name (why)`` for every reference that names nothing."""
    out = []
    for r in refs:
        if r.text.rstrip("/") in NOT_CHECKOUT or any(r.text == n or r.text.startswith(n + ".") for n in NOT_MODULES):
            continue
        why = path_problem(r.text, root) if "/" in r.text else dotted_problem(r.text, mods)
        if why:
            out.append(f"{r.where}: {r.text} ({why})")
    return out


# ------------------------------------------------------------------------------------- the real tree

def test_every_module_path_in_the_prose_exists() -> None:
    refs = references(prose_files())
    assert len(refs) > 500, len(refs)   # the scanner sees the prose at all
    assert problems(refs, scan_tree()) == []


# ------------------------------------------------------------------------ self-tests: the check can fail

_SRC = '''"""Reads with :func:`traces.store.reader.open_trace` (see ``traces/store/reader.py``)."""
import numpy as np  # the one numpy; see inspector.gguf.GGUFFile.tensors
from mtpscope.traces import store

_FROM = {"open_sweep": ("mtpscope.traces.sweep.reader", "open_sweep")}


class Trace:
    """Wraps :meth:`traces.store.reader.Trace.rounds`."""

    size: int

    def rounds(self) -> None:
        x = "traces.not_checked"  # code strings are not prose: traces.mtp_runtime is stale
'''


def _tiny_tree(tmp_path: Path) -> dict[str, Module]:
    for rel in ("traces/__init__.py", "traces/store/__init__.py", "inspector/__init__.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    (tmp_path / "traces/store/reader.py").write_text(_SRC)
    (tmp_path / "inspector/gguf.py").write_text("class GGUFFile:\n    def tensors(self): ...\n")
    (tmp_path / "traces/__init__.py").write_text('_FROM = {"open": ("m", "open_trace")}\n')
    return scan_tree(tmp_path, {"traces": "mtpscope.traces", "inspector": "mtpscope.inspector"})


def test_rule_the_scanner_reads_comments_and_docstrings_only() -> None:
    refs = references({"traces/store/reader.py": _SRC})
    assert [(r.where, r.text) for r in refs] == [
        ("traces/store/reader.py:1", "traces.store.reader.open_trace"),
        ("traces/store/reader.py:1", "traces/store/reader.py"),
        ("traces/store/reader.py:2", "inspector.gguf.GGUFFile.tensors"),
        ("traces/store/reader.py:9", "traces.store.reader.Trace.rounds"),
        ("traces/store/reader.py:14", "traces.mtp_runtime"),
    ]
    md = ("See `traces.open(DIR)`, app.py, sweep.json, x.traces.y, my-app.io, `mtpscope.cli.main`,\n"
          "the files app/screens/*.py, sample_configs/gemma-4-{E2B,E4B}-it, sample_configs/gemma-4-*-it[-x] and\n"
          "`docs/SWEEP.md`; inspector/gguf.py:12.\n")
    assert [r.text for r in references({"docs/X.md": md})] == [
        "traces.open", "mtpscope.cli.main", "docs/SWEEP.md", "inspector/gguf.py"]


def test_rule_planted_bad_paths_fail(tmp_path) -> None:
    mods = _tiny_tree(tmp_path)
    assert {"mtpscope.traces", "mtpscope.traces.store", "mtpscope.traces.store.reader"} <= set(mods)
    assert "reader" in mods["mtpscope.traces.store"].names                 # a package names its modules
    assert {"open_sweep", "Trace", "np", "store", "_FROM"} <= mods["mtpscope.traces.store.reader"].names
    refs = [Ref("d:1", t) for t in (
        "traces.store.reader", "mtpscope.traces.store.reader.Trace", "traces.store.reader.Trace.rounds",
        "traces.store.reader.Trace.size", "traces.open", "inspector.gguf.GGUFFile.tensors", "traces.store",
        "traces/store/reader.py", "traces/store/", "inspector/gguf.py",
        # planted: gone modules, names and files
        "traces.mtp_runtime", "traces.store.reader.open_trac", "traces.store.reader.Trace.rows",
        "inspector.gguf.open_gguf", "app.state", "traces/run/recorder.py", "docs/NOPE.md",
        # not module paths: skipped
        "mtpscope.quantize.source", "traces/clean/", "app/pages/")]
    assert problems(refs, mods, tmp_path) == [
        "d:1: traces.mtp_runtime (mtpscope.traces has no 'mtp_runtime')",
        "d:1: traces.store.reader.open_trac (mtpscope.traces.store.reader has no 'open_trac')",
        "d:1: traces.store.reader.Trace.rows (class mtpscope.traces.store.reader.Trace has no 'rows')",
        "d:1: inspector.gguf.open_gguf (mtpscope.inspector.gguf has no 'open_gguf')",
        "d:1: app.state (no such module)",
        "d:1: traces/run/recorder.py (no such file or folder)",
        "d:1: docs/NOPE.md (no such file or folder)",
    ]
