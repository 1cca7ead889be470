"""Per-centroid counts of a trace's steps, kept while the trace is written and stored in its manifest at a
clean close (``centroid_counts``): how often each centroid was chosen (``centroid_ids``), how often the
target's token lived in it (``target_centroid``) and how often it was then chosen too (the target reachable).
A reader of a million-round trace gets the Centroids page's coverage from these 3 x n_centroids numbers
instead of scanning every step's 32 ids (:func:`traces.analysis.coverage.centroid_coverage`).

Imports: numpy, pyarrow.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: the manifest key
MANIFEST_KEY = "centroid_counts"


class CentroidCounts:
    """The running counts (int64 arrays, grown to the largest centroid id seen + 1)."""

    def __init__(self) -> None:
        self.chosen = np.zeros(0, np.int64)
        self.target_home = np.zeros(0, np.int64)
        self.covered = np.zeros(0, np.int64)
        self.n_steps = 0

    def _grow(self, n: int) -> None:
        if n > self.chosen.size:
            for name in ("chosen", "target_home", "covered"):
                a = getattr(self, name)
                setattr(self, name, np.concatenate([a, np.zeros(n - a.size, np.int64)]))

    def add(self, steps: pa.Table) -> None:
        """Count one part's steps (a table with ``centroid_ids`` list<int32> and ``target_centroid`` int32;
        negative ids are not counted)."""
        if steps.num_rows == 0 or "centroid_ids" not in steps.column_names:
            return
        self.n_steps += steps.num_rows
        col = steps.column("centroid_ids")
        ids = pa.concat_arrays(col.chunks) if col.num_chunks else pa.array([], col.type)
        lens = pc.fill_null(pc.list_value_length(ids), 0).to_numpy().astype(np.int64)
        flat = pc.list_flatten(ids).to_numpy(zero_copy_only=False).astype(np.int64)
        tc = pc.fill_null(steps.column("target_centroid"), -1).to_numpy().astype(np.int64) \
            if "target_centroid" in steps.column_names else np.full(steps.num_rows, -1, np.int64)
        hi = max(int(flat.max()) + 1 if flat.size else 0, int(tc.max()) + 1 if tc.size else 0)
        self._grow(hi)
        ok = flat >= 0
        self.chosen[: hi] += np.bincount(flat[ok], minlength=hi)[:hi]
        has = tc >= 0
        self.target_home[: hi] += np.bincount(tc[has], minlength=hi)[:hi]
        row = np.repeat(np.arange(steps.num_rows), lens)
        hit = np.zeros(steps.num_rows, dtype=bool)
        hit[row[(flat == tc[row]) & (tc[row] >= 0)]] = True
        self.covered[: hi] += np.bincount(tc[hit], minlength=hi)[:hi]

    def entry(self, n_centroids: int | None = None) -> dict[str, Any]:
        """The manifest record: ``n_centroids`` (given, else the largest id seen + 1), ``n_steps`` counted,
        ``chosen`` / ``target_home`` / ``covered`` lists of that length, ``by``: where the target's centroid
        came from (the trace's ``target_centroid`` column)."""
        n = int(n_centroids) if n_centroids is not None else int(self.chosen.size)
        self._grow(n)
        return {"n_centroids": n, "n_steps": int(self.n_steps), "by": "target_centroid",
                "chosen": self.chosen[:n].tolist(), "target_home": self.target_home[:n].tolist(),
                "covered": self.covered[:n].tolist()}


def from_manifest(manifest: dict[str, Any], n_centroids: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(chosen, target_home, covered)`` of a manifest's counts when they exist for ``n_centroids``
    centroids and are well formed; else None."""
    e = manifest.get(MANIFEST_KEY)
    if not isinstance(e, dict) or e.get("n_centroids") != int(n_centroids):
        return None
    try:
        out = (np.asarray(e["chosen"], dtype=np.int64), np.asarray(e["target_home"], dtype=np.int64),
               np.asarray(e["covered"], dtype=np.int64))
    except (KeyError, TypeError, ValueError):
        return None
    if any(a.shape != (int(n_centroids),) for a in out):
        return None
    return out


__all__ = ["MANIFEST_KEY", "CentroidCounts", "from_manifest"]
