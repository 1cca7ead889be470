"""Model files as the Files, Tensors, Tensor values, Validate and Centroids pages show them (pure: pandas /
numpy, no Streamlit, no plotly): the tensor inventory table and its filters, the layer × tensor grid, a
validation report's one-line verdict and the grid's findings, value statistics and a downsampled matrix;
per-centroid coverage of a trace is :mod:`mtpscope.traces.analysis.coverage`'s (``Coverage`` named here for the
charts).
"""

from __future__ import annotations

import fnmatch
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from mtpscope.inspector.findings import MISSING_CODES, SHAPE_CODES, Report
from mtpscope.traces.analysis import coverage
from mtpscope.traces.analysis.wording import plural

if TYPE_CHECKING:
    from mtpscope.inspector.inventory import TensorEntry
    from mtpscope.traces.analysis.run_diff import DifferenceRow

# -------------------------------------------------------------------------------------- centroids

#: per-centroid coverage of a trace (aggregated in DuckDB: :mod:`mtpscope.traces.analysis.coverage`); the
#: charts draw it
Coverage = coverage.Coverage


# ---------------------------------------------------------------------------------------- tensors

def inventory_frame(entries: Sequence[TensorEntry]) -> pd.DataFrame:
    """Inventory entries (``TensorEntry``) → table: name, component, layer, type, ne (GGUF order),
    shape (numpy order), n_elements, n_bytes, bits_per_weight, offset."""
    rows = []
    for e in entries:
        t = e.tensor
        rows.append({
            "name": t.name, "component": e.component, "layer": e.layer, "type": t.type_name,
            "ne": "×".join(str(x) for x in t.ne), "shape": "×".join(str(x) for x in t.shape),
            "n_elements": int(t.n_elements), "n_bytes": t.n_bytes, "bits_per_weight": t.bits_per_weight,
            "offset": int(t.offset),
        })
    df = pd.DataFrame(rows, columns=["name", "component", "layer", "type", "ne", "shape", "n_elements",
                                     "n_bytes", "bits_per_weight", "offset"])
    df["layer"] = df["layer"].astype("Int64")
    df["n_bytes"] = df["n_bytes"].astype("Int64")
    return df


FOCUS_RE = re.compile(r"^(mtp|nextn)\.")


def filter_inventory(df: pd.DataFrame, glob: str = "", components: Sequence[str] = (),
                     layers: Sequence[int] = (), types: Sequence[str] = (), focus: bool = False) -> pd.DataFrame:
    """Filter the inventory table: name glob (fnmatch, ``*`` when empty; a glob without wildcards
    matches as a substring), components, layers, ggml types, and the ``mtp.*`` / ``nextn.*`` focus."""
    m = np.ones(len(df), dtype=bool)
    g = glob.strip()
    if g:
        pat = g if any(c in g for c in "*?[") else f"*{g}*"
        m &= np.array([fnmatch.fnmatchcase(n, pat) for n in df["name"]], dtype=bool)
    if components:
        m &= df["component"].isin(list(components)).to_numpy()
    if layers:
        m &= df["layer"].isin(list(layers)).fillna(False).to_numpy(dtype=bool)
    if types:
        m &= df["type"].isin(list(types)).to_numpy()
    if focus:
        m &= df["name"].str.match(FOCUS_RE).to_numpy()
    return df[m].reset_index(drop=True)


_BLK_RE = re.compile(r"^blk\.(\d+)\.(.+?)(\.weight|\.bias)?$")


def layer_grid(present: Sequence[tuple[str, tuple[int, ...]]], missing: Sequence[str] = (),
               wrong_shape: Sequence[str] = ()) -> pd.DataFrame:
    """Layer × tensor status grid.

    Args:
        present: (name, shape) of every tensor in the file.
        missing: names the layout expects but the file lacks (from validation findings).
        wrong_shape: names present with a shape other than expected (from validation findings).

    Returns:
        Long DataFrame with layer, tensor (name within the block, e.g. ``attn_q``), name, status
        (``present`` / ``missing`` / ``wrong shape``), for every ``blk.{il}.*`` name.
    """
    status: dict[str, str] = {}
    for name, _shape in present:
        status[name] = "present"
    for name in missing:
        status[name] = "missing"
    for name in wrong_shape:
        status[name] = "wrong shape"
    rows = []
    for name, st in status.items():
        m = _BLK_RE.match(name)
        if not m:
            continue
        rows.append({"layer": int(m.group(1)), "tensor": m.group(2), "name": name, "status": st})
    return pd.DataFrame(rows, columns=["layer", "tensor", "name", "status"])


# ----------------------------------------------------------------------------------------- values

def downsample_matrix(a: np.ndarray, max_rows: int = 256, max_cols: int = 512) -> tuple[np.ndarray, int, int]:
    """Block-mean downsample a 2-D array to at most ``max_rows`` × ``max_cols`` (numpy order).

    Returns (small, row_factor, col_factor); edge blocks that do not fill a whole factor are averaged
    over what they hold (NaN-aware)."""
    a = np.asarray(a, dtype=np.float32)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim > 2:
        a = a.reshape(-1, a.shape[-1])
    r, c = a.shape
    fr = max(1, -(-r // max_rows))
    fc = max(1, -(-c // max_cols))
    if fr == 1 and fc == 1:
        return a, 1, 1
    pr = (-r) % fr
    pc = (-c) % fc
    padded = np.pad(a, ((0, pr), (0, pc)), constant_values=np.nan)
    blocks = padded.reshape(padded.shape[0] // fr, fr, padded.shape[1] // fc, fc)
    with np.errstate(invalid="ignore"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            small = np.nanmean(blocks, axis=(1, 3))
    return small.astype(np.float32), fr, fc


def value_stats(a: np.ndarray) -> dict[str, float]:
    """min, max, mean, std, abs max, fraction of zeros, count of non-finite values (float64 sums)."""
    v = np.asarray(a, dtype=np.float32).ravel()
    finite = np.isfinite(v)
    f = v[finite]
    if f.size == 0:
        return {"n": float(v.size), "non_finite": float(v.size)}
    return {"n": float(v.size), "min": float(f.min()), "max": float(f.max()),
            "mean": float(f.mean(dtype=np.float64)), "std": float(f.std(dtype=np.float64)),
            "abs_max": float(np.abs(f).max()), "zeros": float((f == 0).mean()),
            "non_finite": float(v.size - f.size)}



def compact_number(v: float, digits: int = 3) -> str:
    """``v`` in at most about 9 characters with ``digits`` significant digits: fixed notation for
    1e-2 <= |v| < 1e5, else scientific with a short exponent (``-5.66e-4``, ``1.2e+7``); ``0`` for zero
    (also -0.0). What a narrow metric box shows in full (a long fixed form such as ``-0.0005663`` is cut to
    ``-0.000…`` by the box)."""
    if v == 0:
        return "0"
    if not np.isfinite(v):
        return str(v)
    a = abs(v)
    if 1e-2 <= a < 1e5 and "e" not in f"{v:.{digits}g}":
        return f"{v:.{digits}g}"
    mant, exp = f"{v:.{digits - 1}e}".split("e")
    return f"{mant}e{int(exp):+d}" if int(exp) > 0 else f"{mant}e{int(exp)}"


# ------------------------------------------------------------------------------------------ validation

def verdict_line(rep: Report) -> str:
    """One line for a validation report: dialect, error / warning counts, loadability per runtime,
    pairing, the first error."""
    errs = len(rep.errors)
    warns = len(rep.warnings)
    head = ("✓ valid" if rep.ok else "✗ invalid") + f" {rep.dialect} file: {plural(errs, 'error')}, " \
        f"{plural(warns, 'warning')}"
    loads = []
    for v in rep.loadability:
        word = {"refuses": "does not load", "unknown": "no rules"}.get(v.outcome, v.outcome)
        loads.append(f"{v.runtime.split(' (')[0]} {word}")
    parts = [head, "; ".join(loads)]
    if rep.pairing is not None:
        parts.append("pairs with the target" if rep.pairing.ok else "does NOT pair with the target")
    if errs:
        first = rep.errors[0]
        parts.append(f"first error: {first.code} {first.subject}: {first.message}")
    return " · ".join(parts)


def grid_findings(rep: Report) -> tuple[list[str], list[str]]:
    """(missing tensor names, wrong-shape tensor names) from a validation report's findings
    (:data:`mtpscope.inspector.findings.MISSING_CODES` / :data:`~mtpscope.inspector.findings.SHAPE_CODES`)."""
    missing = [x.subject for x in rep.findings if x.code in MISSING_CODES and x.subject]
    wrong = [x.subject for x in rep.findings if x.code in SHAPE_CODES and x.subject]
    return missing, wrong


# ---------------------------------------------------------------------------- what differs between runs

@dataclass(frozen=True)
class ExplainedDifference:
    """A difference row (:class:`mtpscope.traces.analysis.run_diff.DifferenceRow`) with what verify says of it.

    Attributes:
        row: the difference.
        verify: the findings (error or warning) of either run's verify whose subject is the row's key or tensor
            (``B: ✗ E_PAIR_ROPE — …``, ``; ``-joined); ``""`` when none.
    """

    row: DifferenceRow
    verify: str

    def to_dict(self) -> dict[str, str]:
        """The table row: ``{"what", "name", "A", "B", "verify"}``."""
        return {**self.row.to_dict(), "verify": self.verify}


def explained_differences(rows: Sequence[DifferenceRow], reports: dict[str, Report | None]) -> list[ExplainedDifference]:
    """What differs between two runs (:func:`mtpscope.traces.analysis.run_diff.difference_rows`) joined with
    verify: each model metadata key or tensor row gets the findings (error or warning) of ``reports[run]`` whose
    subject is that key or tensor (``B: ✗ E_PAIR_ROPE …``), so a difference verify explains is told from the
    others; rows so explained come first (errors first), the rest keep their order.

    Args:
        rows: the difference rows (a renamed key's name is ``"a | b"``: either name matches).
        reports: run name (``"A"``, ``"B"``) -> ``verify`` of that run's drafter paired with its target
            (:class:`mtpscope.inspector.findings.Report`), or None when it could not be checked.
    """
    out = []
    for i, r in enumerate(rows):
        names = set(r.name.split(" | ")) if r.what.endswith(("metadata", "tensor")) else set()
        notes, worst = [], 2
        for run, rep in reports.items():
            for f in (rep.findings if rep is not None else ()):
                if f.severity in ("error", "warning") and f.subject in names:
                    notes.append(f"{run}: {'✗' if f.severity == 'error' else '⚠'} {f.code} — {f.message}")
                    worst = min(worst, 0 if f.severity == "error" else 1)
        out.append((worst, i, ExplainedDifference(r, "; ".join(notes))))
    return [r for _, _, r in sorted(out, key=lambda t: (t[0], t[1]))]
