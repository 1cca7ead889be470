"""The acceptance rate and the mean acceptance length have one home, ``traces.analysis.rates`` (docs/ARCHITECTURE.md):
no other module of the tree writes either formula out. Read from the syntax tree: a mean acceptance length is
``1 + accepted / n`` (an addition of 1 to a division of a count of accepted drafts); an acceptance rate is a count of
accepted drafts divided by a count of drafted tokens. Other divisions of accepted counts (per draft position, a
model's weighted rates with their floors, a simulator's per-position p_k) are other quantities and are not matched.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOME = ROOT / "traces" / "analysis" / "rates.py"
#: names a count of accepted drafts goes by in the tree, and a count of drafted tokens (or llama-server's "generated")
ACCEPTED = ("accepted", "n_accepted", "na", "da", "acc", "n_acc")
DRAFTED = ("drafted", "n_drafted", "nd", "dn", "gen", "n_draft")


def _name(node: ast.AST) -> str:
    """The last identifier of a plain operand (``x``, ``self.x``, ``d["x"]``, ``x.sum()``); "" otherwise."""
    if isinstance(node, ast.Call) and not node.args:
        return _name(node.func.value) if isinstance(node.func, ast.Attribute) else ""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("float", "int"):
        return _name(node.args[0])
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    return ""


def formulas(src: str) -> list[tuple[int, str]]:
    """``(line, source)`` of each division written as one of the two formulas in ``src``."""
    out = []
    for node in ast.walk(ast.parse(src)):
        if not isinstance(node, ast.BinOp):
            continue
        mal = isinstance(node.op, ast.Add) and isinstance(node.left, ast.Constant) and node.left.value == 1 \
            and isinstance(node.right, ast.BinOp) and isinstance(node.right.op, ast.Div) \
            and _name(node.right.left) in ACCEPTED
        rate = isinstance(node.op, ast.Div) and _name(node.left) in ACCEPTED and _name(node.right) in DRAFTED
        if mal or rate:
            out.append((node.lineno, ast.get_source_segment(src, node) or ""))
    return out


def test_the_matcher_finds_both_formulas_as_the_tree_wrote_them() -> None:
    """The forms the tree held before the rates module (the recorder, totals, requests, probes, the app)."""
    for src in ("x = (1 + n_accepted / n_verify) if n_verify else None", "r = na / nd if nd else None",
                "m = 1.0 + float(g['n_accepted'].sum()) / v", "r = self.n_accepted / self.n_drafted",
                "r = acc / gen if gen else None", "r = da / dn"):
        assert len(formulas(src)) == 1, src
    for src in ("p = sum(r.n_accepted >= k for r in made) / len(made)", "r = acc / drafts",
                "r = W @ s['accepted'] / np.maximum(W @ s['drafted'], 1e-12)"):
        assert formulas(src) == [], src


def test_no_module_writes_the_formulas_out() -> None:
    found = [f"{p.relative_to(ROOT)}:{line}: {seg}"
             for top in ("inspector", "traces", "app", "mtpscope", "benchmarks")
             for p in sorted((ROOT / top).rglob("*.py")) if p != HOME
             for line, seg in formulas(p.read_text())]
    assert found == [], "\n".join(found)
