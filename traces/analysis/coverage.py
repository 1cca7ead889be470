"""Per-centroid coverage of a trace's draft steps, aggregated in DuckDB over the steps parts (never the steps
in pandas): :func:`centroid_coverage` -> :class:`Coverage`, and the steps the sparse head would have missed
(:func:`unreachable_steps`, a bounded list).

A million-round trace has about three million steps and 32 chosen centroid ids each. A trace closed cleanly
carries the counts the writer kept (manifest ``centroid_counts``, :mod:`traces.store.centroid_counts`): when
the head's token -> centroid map agrees with the trace's own ``target_centroid`` on every step (one DuckDB
pass over the distinct (target_token, target_centroid) pairs), those are the answer. Otherwise (another head,
a recovered or older trace) DuckDB streams the ``centroid_ids`` / ``target_token`` columns out of the Parquet
parts and returns n_centroids rows (the map enters the query as a table; the chosen counts, which do not
depend on the map, still come from the manifest when it has them). Either way the memory is a few MB;
``benchmarks/bench_app.py`` measures both.

Imports: duckdb (lazily), numpy, pandas, pyarrow, traces.store.centroid_counts, traces.store.protocols (the
trace's ``part_files``), traces.store.reader (DuckDB literals).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from mtpscope.traces.store.centroid_counts import from_manifest
from mtpscope.traces.store.protocols import TraceLike
from mtpscope.traces.store.reader import sql_file_list

#: columns :func:`unreachable_steps` returns (those the trace has), in this order
UNREACHABLE_COLUMNS = ("prompt_id", "round", "k", "token", "target_token", "target_centroid", "target_centroid_rank",
                       "accepted")


@dataclass(frozen=True)
class Coverage:
    """Per-centroid counts over a trace's draft steps (int64 arrays of length n_centroids).

    chosen: steps where the centroid was among the top-k chosen (``centroid_ids``).
    target_home: steps whose target token lives in the centroid.
    covered: of those, steps where the centroid was chosen (target reachable).
    """

    chosen: np.ndarray
    target_home: np.ndarray
    covered: np.ndarray

    @property
    def n_centroids(self) -> int:
        return int(self.chosen.size)

    def table(self) -> pd.DataFrame:
        """DataFrame: centroid, chosen, target_home, covered, coverage (covered / target_home)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            cov = np.where(self.target_home > 0, self.covered / np.maximum(self.target_home, 1), np.nan)
        return pd.DataFrame({"centroid": np.arange(self.n_centroids), "chosen": self.chosen,
                             "target_home": self.target_home, "covered": self.covered, "coverage": cov})


def _steps_source(trace: TraceLike) -> str | None:
    """The trace's steps parts as a DuckDB table expression (None without parts). ``hive_partitioning`` off:
    a trace under ``key=value`` folders (a sweep cell) reads its own columns, never values from its path."""
    files = trace.part_files("steps")
    return f"read_parquet({sql_file_list(files)}, hive_partitioning = false)" if files else None


def _counts(df: pd.DataFrame, col: str, n: int) -> np.ndarray:
    out = np.zeros(n, dtype=np.int64)
    if len(df):
        idx = df["c"].to_numpy(dtype=np.int64)
        ok = (idx >= 0) & (idx < n)
        out[idx[ok]] = df[col].to_numpy(dtype=np.int64)[ok]
    return out


def centroid_coverage(trace: TraceLike, n_centroids: int, home: np.ndarray | None = None) -> Coverage:
    """Count per centroid how often it was chosen and how often the target token lived in it.

    The target's centroid is ``home[target_token]`` when ``home`` (int32[n_vocab], -1 = no centroid:
    ``CentroidHead.token_to_centroid``, first row wins) is given, else the trace's ``target_centroid`` column.
    Ids outside ``0..n_centroids-1`` and steps without ``centroid_ids`` or target are not counted; a step
    counts as covered when its target's centroid is among its ``centroid_ids``.

    Raises:
        TraceFormatError: an unreadable part (from the reader).
    """
    import duckdb
    import pyarrow as pa

    n = int(n_centroids)
    empty = np.zeros(n, dtype=np.int64)
    src = _steps_source(trace)
    names = set(trace.schemas["steps"].names)
    if src is None or "centroid_ids" not in names:
        return Coverage(empty, empty.copy(), empty.copy())
    con = duckdb.connect()
    try:
        counts = from_manifest(trace.manifest, n)
        if counts is not None and (home is None or _home_agrees(con, src, names, home, n)):
            return Coverage(*counts)
        con.execute("SET threads TO 2")
        # how often each id was chosen does not depend on the map: the writer's counts when there are any
        chosen = counts[0] if counts is not None else _counts(con.execute(
            f"SELECT c, count(*) AS n FROM (SELECT unnest(centroid_ids) AS c FROM {src}) "
            f"WHERE c BETWEEN 0 AND {n - 1} GROUP BY c").df(), "n", n)
        if home is not None and "target_token" in names:
            h = np.asarray(home, dtype=np.int32)
            con.register("home", pa.table({"token": pa.array(np.arange(h.size, dtype=np.int32)), "c": pa.array(h)}))
            tc = f"(SELECT s.centroid_ids AS ids, h.c AS c FROM {src} s JOIN home h ON h.token = s.target_token)"
        elif "target_centroid" in names:
            tc = f"(SELECT centroid_ids AS ids, target_centroid AS c FROM {src})"
        else:
            return Coverage(chosen, empty.copy(), empty.copy())
        df = con.execute(f"SELECT c, count(*) AS home, count_if(coalesce(list_contains(ids, c), false)) AS covered "
                         f"FROM {tc} WHERE c BETWEEN 0 AND {n - 1} GROUP BY c").df()
        return Coverage(chosen, _counts(df, "home", n), _counts(df, "covered", n))
    finally:
        con.close()


def _home_agrees(con: Any, src: str, names: set[str], home: np.ndarray, n: int) -> bool:
    """Whether ``home[target_token]`` equals the trace's ``target_centroid`` on every step (both read as
    "no centroid" outside ``0..n-1``), checked on the distinct (target_token, target_centroid) pairs: then
    the counts the writer kept by ``target_centroid`` are exactly the counts by ``home``."""
    if not {"target_token", "target_centroid"} <= names:
        return False
    pairs = con.execute(f"SELECT DISTINCT target_token AS t, target_centroid AS c FROM {src} "
                        "WHERE target_token IS NOT NULL").df()
    t = pairs["t"].to_numpy(dtype=np.int64)
    c = pd.to_numeric(pairs["c"]).fillna(-1).to_numpy(dtype=np.int64)
    h = np.asarray(home, dtype=np.int64)
    mine = np.full(t.size, -1, np.int64)
    inr = (t >= 0) & (t < h.size)
    mine[inr] = h[t[inr]]
    mine[(mine < 0) | (mine >= n)] = -1
    c[(c < 0) | (c >= n)] = -1
    return bool(np.array_equal(mine, c))


def unreachable_steps(trace: TraceLike, limit: int = 500) -> pd.DataFrame:
    """Steps the sparse (centroid) head would have missed: the target's token was outside the chosen
    centroids' candidates (``target_in_candidates`` false), in trace order (prompt, round, k), at most
    ``limit``. Only steps the target judged count: accepted ones and the first rejection of their round (a
    step after its round's first rejection was never checked). On a recording drafted by the dense head these
    steps may well be accepted: the list is what the centroid head would have got wrong.

    Returns:
        DataFrame with the :data:`UNREACHABLE_COLUMNS` the trace has (empty when it has no
        ``target_in_candidates``).
    """
    import duckdb

    names = trace.schemas["steps"].names
    cols = [c for c in UNREACHABLE_COLUMNS if c in names]
    src = _steps_source(trace)
    if src is None or "target_in_candidates" not in names:
        return pd.DataFrame({c: pd.Series([], dtype="Int64") for c in cols})
    sel = ", ".join(f"b.{c}" for c in cols)
    checked = ""
    if {"accepted", "prompt_id", "round", "k"} <= set(names):
        checked = (f"LEFT JOIN (SELECT prompt_id, round, min(k) AS first_rej FROM {src} WHERE NOT coalesce(accepted, "
                   "false) GROUP BY prompt_id, round) r ON r.prompt_id = b.prompt_id AND r.round = b.round "
                   "WHERE r.first_rej IS NULL OR b.k <= r.first_rej")
    order = ", ".join(f"b.{c}" for c in ("prompt_id", "round", "k") if c in names) or "1"
    con = duckdb.connect()
    try:
        q = (f"SELECT {sel} FROM (SELECT * FROM {src} WHERE target_in_candidates = false) b {checked} "
             f"ORDER BY {order} LIMIT {int(limit)}")
        df: pd.DataFrame = con.execute(q).df()
    finally:
        con.close()
    return df.reset_index(drop=True)


__all__ = ["Coverage", "UNREACHABLE_COLUMNS", "centroid_coverage", "unreachable_steps"]
