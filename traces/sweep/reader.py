"""Reading a sweep directory as one dataset: :func:`open_sweep` -> :class:`Sweep`.

A sweep (:mod:`traces.sweep.spec`, docs/SWEEP.md) is ``sweep.json`` plus one ordinary trace per task
under ``assistant=<a>/n_draft=<k>/shard=<i>/``. :class:`Sweep` gives

- ``matrix``: one row per task (its state, attempts, counts, timings, error) from ``sweep.json``;
- ``sql(query)``: DuckDB over every finished task's Parquet parts with hive partitioning, so
  ``assistant``, ``n_draft`` (the configuration's; 0 for the baseline) and ``shard`` are columns of the
  views ``rounds`` and ``steps``; the table ``prompts`` (``prompt_index``, ``category``, ``shard``,
  ``prompt_id``, ``text``) joins on ``(shard, prompt_id)``. A round's own draft count (shorter at the
  end of a prompt) is ``round_n_draft`` (``= len(drafted)``, the trace format's invariant), because the
  hive column takes the name ``n_draft``;
- ``cells()``: the report's aggregates per (assistant, n_draft, category), computed in DuckDB;
- ``timeline(...)``: one configuration's rounds in prompt order (only the columns asked for);
- ``cell(assistant, n_draft, shard)``: that task's trace (:class:`traces.store.reader.Trace`), and
  ``cell(assistant, n_draft)``: a :class:`SweepCell` over all its shards, read like a trace
  (:class:`traces.store.protocols.TraceLike`: ``manifest``, ``rounds``, ``steps``, ``columns``, ``sql``,
  ``hidden``, ``part_files``, ``warnings``, ``schemas``), prompt ids renumbered to the prompt set's indices.

Nothing reads all rounds into pandas: aggregates stay in DuckDB, and a cell holds one configuration.

Definitions (the same as :func:`traces.analysis.metrics.totals`): acceptance rate = accepted / drafted;
mean acceptance length = 1 + accepted / verify rounds (rounds that drafted); measured tokens/s =
emitted tokens / (t_draft_ms + t_verify_ms) over the rounds, i.e. generation after each prompt's
first token, prompt processing excluded (the baseline's rounds are timed the same way,
:mod:`traces.run.baseline`); speedup = tokens/s / the baseline's tokens/s over the same category.

Imports: duckdb, pandas, numpy, traces.sweep.spec, traces.sweep.quant (the quantizations' table),
traces.store (``reader``, ``protocols``, ``schema``).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mtpscope.errors import TraceFormatError
from mtpscope.traces.analysis import rates
from mtpscope.traces.analysis.costs import CostProbe
from mtpscope.traces.analysis.records import JsonRecord, json_records
from mtpscope.traces.store import schema as S
from mtpscope.traces.store.protocols import TraceLike
from mtpscope.traces.store.reader import Trace, open_trace, sql_file_list, sql_str
from mtpscope.traces.sweep.quant import QuantRow, quant_rows, quant_table
from mtpscope.traces.sweep.spec import ALL, BASELINE, SWEEP_FILE, SweepSpec, TaskState, read_state, task_states

#: the columns of :meth:`Sweep.cells` (and of ``report --json``'s ``cells``)
CELL_COLUMNS = ("assistant", "n_draft", "category", "n_prompts", "n_rounds", "n_drafted", "n_accepted",
                "acceptance_rate", "mean_acceptance_length", "tokens_per_s", "speedup")
MATRIX_COLUMNS = ("task", "assistant", "n_draft", "shard", "state", "attempts", "worker", "n_prompts",
                  "n_rounds", "n_generated", "n_drafted", "n_accepted", "acceptance_rate", "tokens_per_s",
                  "seconds", "load_seconds", "started", "finished", "error", "dir")
_HIVE_TYPES = "{'assistant': VARCHAR, 'n_draft': INTEGER, 'shard': INTEGER}"


@dataclass(frozen=True)
class CellRow(JsonRecord):
    """One row of :meth:`Sweep.cells` (:data:`CELL_COLUMNS`) as the report has it: a configuration x category with
    its prompts, rounds, draft tokens, acceptance rate (0..1), mean acceptance length (tokens), measured tokens/s
    and speedup over the baseline; None where undefined."""

    assistant: str
    n_draft: int
    category: str
    n_prompts: int
    n_rounds: int
    n_drafted: int
    n_accepted: int
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    tokens_per_s: float | None
    speedup: float | None


@dataclass(frozen=True)
class FailedTask(JsonRecord):
    """A failed task of a sweep (:attr:`Sweep.failed`): its id, the error, the tail of its stderr, attempts made."""

    task: str
    error: str | None
    stderr_tail: str | None
    attempts: int


@dataclass(frozen=True)
class FailedRow(JsonRecord):
    """A failed task as the report lists it: ``task``, ``error``, ``attempts``."""

    task: str
    error: str | None
    attempts: int


@dataclass(frozen=True)
class BestConfig(JsonRecord):
    """:meth:`Sweep.best` of one category: the configuration with the highest measured tokens/s (the baseline
    excluded), its tokens/s and speedup (None when the category has no baseline)."""

    assistant: str
    n_draft: int
    tokens_per_s: float
    speedup: float | None


@dataclass(frozen=True)
class SweepReport(JsonRecord):
    """:meth:`Sweep.report`: ``to_dict()`` is ``mtpscope report DIR --json`` on a sweep before the advice keys.

    Attributes:
        sweep: the directory; complete: every task done; n_tasks / n_done: tasks; categories: in prompt-set
        order; cells: :class:`CellRow` per configuration x category; failed: :class:`FailedRow` per failed task;
        best: ``{category: n_draft}`` of :attr:`best_configs`; best_configs: :meth:`Sweep.best`; warnings: the
        reader's; quantization: the quantized assistants' rows (:func:`traces.sweep.quant.quant_rows`; empty
        without ``--assistant-quant``).
    """

    sweep: str
    complete: bool
    n_tasks: int
    n_done: int
    categories: tuple[str, ...]
    cells: tuple[CellRow, ...]
    failed: tuple[FailedRow, ...]
    best: Mapping[str, int]
    best_configs: Mapping[str, BestConfig]
    warnings: tuple[str, ...]
    quantization: tuple[QuantRow, ...] = ()


class Sweep:
    """An opened sweep directory (see :func:`open_sweep` and the module docstring).

    Attributes:
        path: the directory; state: the parsed ``sweep.json``; spec: its :class:`SweepSpec`;
        warnings: human-readable warnings (finished tasks whose trace cannot be read, ...).
    """

    def __init__(self, path: Path, state: dict[str, Any]) -> None:
        self.path = path
        self.state = state
        self.spec = SweepSpec.from_state(state, path / SWEEP_FILE)
        self.warnings: list[str] = []
        self._tasks = task_states(state)
        self._con: Any = None
        self._views = False
        self._lock = threading.RLock()
        self._traces: dict[str, Trace] = {}
        self._checked: set[str] = set()

    def __repr__(self) -> str:
        return f"Sweep({os.fspath(self.path)!r}, tasks={len(self._tasks)}, done={self.n_done})"

    # ------------------------------------------------------------------ the matrix
    @property
    def n_done(self) -> int:
        return sum(t.state == "done" for t in self._tasks)

    @property
    def complete(self) -> bool:
        """Every task done."""
        return bool(self._tasks) and self.n_done == len(self._tasks)

    @property
    def matrix(self) -> pd.DataFrame:
        """One row per task (columns :data:`MATRIX_COLUMNS`), in ``sweep.json`` order."""
        rows = [{c: getattr(t, c) for c in MATRIX_COLUMNS} for t in self._tasks]
        return pd.DataFrame(rows, columns=list(MATRIX_COLUMNS))

    @property
    def prompts(self) -> pd.DataFrame:
        """The prompt set: ``prompt_index``, ``category``, ``shard``, ``prompt_id`` (in its shard), ``text``."""
        rows = [{"prompt_index": int(p["index"]), "category": str(p["category"]), "shard": int(p["shard"]),
                 "prompt_id": int(p["prompt_id"]), "text": str(p["text"])} for p in self.state["prompts"]]
        return pd.DataFrame(rows, columns=["prompt_index", "category", "shard", "prompt_id", "text"])

    @property
    def categories(self) -> tuple[str, ...]:
        """Categories in order of first appearance in the prompt set."""
        return tuple(dict.fromkeys(p.category for p in self.spec.prompts))

    @property
    def failed(self) -> tuple[FailedTask, ...]:
        """The failed tasks (:class:`FailedTask`), in ``sweep.json`` order."""
        return tuple(FailedTask(t.task, t.error, t.stderr_tail, t.attempts) for t in self._tasks if t.state == "failed")

    def configs(self) -> list[tuple[str, int]]:
        """(assistant, n_draft) of every configuration (the baseline as ``("baseline", 0)``)."""
        return list(dict.fromkeys((t.assistant, t.n_draft) for t in self._tasks))

    # ------------------------------------------------------------------ traces of tasks
    def _open(self, task_dir: str) -> Trace:
        with self._lock:
            if task_dir not in self._traces:
                self._traces[task_dir] = open_trace(self.path / task_dir)
            return self._traces[task_dir]

    def _trace(self, task: TaskState) -> Trace:
        """``task``'s trace, opened once and checked against the task (:meth:`_check`)."""
        tr = self._open(task.dir)
        self._check(task, tr)
        return tr

    def _check(self, task: TaskState, tr: Trace) -> None:
        """A finished task's trace is that task's: recorded with its n_draft (manifest ``params.n_draft``; the
        baseline's 0), its rounds what the trace reader accepts (:meth:`Trace.columns` runs its rounds check on the
        first read; the sweep's SQL reads the parts through DuckDB and would otherwise count a duplicated part
        twice, or sum times of 1e308), its steps too (``check_steps``), no round drafting more, its cost probe well formed
        (:meth:`CostProbe.of_trace`). Otherwise the sweep would report its rows under the task's label (the
        folder's ``n_draft=<k>``), or report rounds that ``explain`` on the same task refuses.

        Raises:
            TraceFormatError: naming ``tasks[i]`` of ``sweep.json`` (the trace's folder for its rounds, its manifest
                for the probe).
        """
        with self._lock:
            if task.dir in self._checked:
                return
            i = next(j for j, x in enumerate(self._tasks) if x is task)
            nd = (tr.manifest.get("params") or {}).get("n_draft")
            if isinstance(nd, int) and not isinstance(nd, bool) and nd != task.n_draft:
                raise TraceFormatError("the task's trace was recorded with another n_draft (its rows would be "
                                       "reported under the task's)", path=self.path / SWEEP_FILE, key=f"tasks[{i}]",
                                       expected=f"n_draft {task.n_draft} (the task {task.task})",
                                       actual=f"n_draft {nd} ({task.dir}/manifest.json params.n_draft)")
            tr.columns("rounds", ["prompt_id"])     # the reader's rounds check (once a trace; the column is cached)
            if tr.part_files("steps"):
                tr.columns("steps", ["k"])          # and its steps check (a repeated k, a step that is not its draft)
            if tr.part_files("rounds"):
                m = tr.sql("SELECT max(coalesce(len(drafted), 0)) AS m FROM rounds")["m"].iloc[0]
                if pd.notna(m) and int(m) > task.n_draft:
                    raise TraceFormatError("the task's trace drafts more tokens a round than the task's n_draft (its "
                                           "rows would be reported under the task's)", path=self.path / SWEEP_FILE,
                                           key=f"tasks[{i}]", expected=f"at most {task.n_draft} (the task {task.task})",
                                           actual=f"rounds drafting {int(m)} ({task.dir}/rounds)")
            CostProbe.of_trace(tr)
            self._checked.add(task.dir)

    def _task(self, assistant: str, n_draft: int, shard: int) -> Any:
        for t in self._tasks:
            if t.assistant == assistant and t.n_draft == int(n_draft) and t.shard == int(shard):
                return t
        raise TraceFormatError("no such task in this sweep", path=self.path / SWEEP_FILE,
                               key=f"assistant={assistant}/n_draft={n_draft}/shard={shard}",
                               expected=f"one of the tasks in {SWEEP_FILE}", actual="missing")

    def _done_files(self, table: str, config: tuple[str, int] | None = None) -> list[Path]:
        """Part files of ``table`` of every finished task (of one configuration when given)."""
        files: list[Path] = []
        for t in self._tasks:
            if t.state != "done" or (config is not None and (t.assistant, t.n_draft) != (config[0], int(config[1]))):
                continue
            try:
                tr = self._open(t.dir)
                parts = tr.part_files(table)
            except TraceFormatError as e:
                w = f"{t.task}: finished task's trace unreadable, left out: {e.one_line()}"
                if w not in self.warnings:
                    self.warnings.append(w)
                continue
            self._check(t, tr)    # a readable trace that is not the task's is refused, not left out
            files += parts
        return files

    # ------------------------------------------------------------------ DuckDB
    def _base_con(self) -> Any:
        """The connection with the ``prompts`` table only (views come with :attr:`con`)."""
        import duckdb

        with self._lock:
            if self._con is None:
                con = duckdb.connect()
                con.register("_prompts_df", self.prompts)
                con.execute("CREATE TABLE prompts AS SELECT prompt_index::INTEGER AS prompt_index, category, "
                            "shard::INTEGER AS shard, prompt_id::INTEGER AS prompt_id, text FROM _prompts_df")
                con.unregister("_prompts_df")
                self._con = con
            return self._con

    def _relation(self, table: str, files: Sequence[Path]) -> str:
        """SQL for ``table``'s rows in ``files`` with the hive columns (rounds: plus ``round_n_draft``)."""
        opts = f"hive_partitioning = true, hive_types = {_HIVE_TYPES}, union_by_name = true"
        if files:
            extra = ", coalesce(len(drafted), 0)::INTEGER AS round_n_draft" if table == "rounds" else ""
            return f"(SELECT *{extra} FROM read_parquet({sql_file_list(files)}, {opts}))"
        con = self._base_con()
        name = f"_empty_{table}"
        if table == "rounds":
            con.register(name, S.ROUNDS_SCHEMA.empty_table())
            return (f"(SELECT * EXCLUDE (n_draft), 0::INTEGER AS n_draft, ''::VARCHAR AS assistant, 0::INTEGER AS shard, "
                    f"0::INTEGER AS round_n_draft FROM {name})")
        con.register(name, S.steps_schema(None, None, None).empty_table())
        return f"(SELECT *, ''::VARCHAR AS assistant, 0::INTEGER AS n_draft, 0::INTEGER AS shard FROM {name})"

    @property
    def con(self) -> Any:
        """The DuckDB connection with the views ``rounds`` / ``steps`` and the table ``prompts``."""
        with self._lock:
            con = self._base_con()
            if not self._views:
                con.execute(f"CREATE VIEW rounds AS SELECT * FROM {self._relation('rounds', self._done_files('rounds'))}")
                con.execute(f"CREATE VIEW steps AS SELECT * FROM {self._relation('steps', self._done_files('steps'))}")
                self._views = True
            return con

    def _query(self, con: Any, query: str, params: Sequence[Any] | None = None) -> pd.DataFrame:
        import duckdb

        with self._lock:
            try:
                df: pd.DataFrame = con.execute(query, list(params) if params else None).df()
                return df
            except duckdb.Error as e:
                raise TraceFormatError(f"query failed: {e}", path=self.path, key="sql",
                                       expected="a valid DuckDB query over rounds/steps/prompts",
                                       actual=query[:200]) from None

    def sql(self, query: str, params: Sequence[Any] | None = None) -> pd.DataFrame:
        """Run a DuckDB query over the views ``rounds``, ``steps`` and the table ``prompts``.

        Raises:
            TraceFormatError: the query fails (DuckDB's message).
        """
        return self._query(self.con, query, params)

    # ------------------------------------------------------------------ aggregates
    def cells(self) -> pd.DataFrame:
        """The report's aggregates (columns :data:`CELL_COLUMNS`): one row per (assistant, n_draft,
        category) and one per (assistant, n_draft) with category :data:`ALL`, ordered by assistant
        (the baseline last), n_draft, category (``all`` first). ``n_prompts`` counts prompts with at
        least one round; ``speedup`` is None without a baseline for that category; ``acceptance_rate``
        / ``mean_acceptance_length`` are None where nothing was drafted (the baseline)."""
        df = self.sql(
            "WITH r AS (SELECT r.assistant, r.n_draft, p.category, p.prompt_index, r.round_n_draft AS nd, "
            "r.n_accepted AS na, coalesce(len(r.emitted), 0) AS ne, "
            "coalesce(r.t_draft_ms, 0) + coalesce(r.t_verify_ms, 0) AS t "
            "FROM rounds r JOIN prompts p ON p.shard = r.shard AND p.prompt_id = r.prompt_id) "
            "SELECT assistant, n_draft, category, grouping(category) AS is_all, "
            "count(DISTINCT prompt_index) AS n_prompts, count(*) AS n_rounds, sum(nd) AS n_drafted, "
            "sum(na) AS n_accepted, count(*) FILTER (WHERE nd > 0) AS n_verify, sum(ne) AS n_emitted, "
            "sum(t) AS t_ms FROM r GROUP BY GROUPING SETS ((assistant, n_draft, category), (assistant, n_draft))")
        if df.empty:
            return pd.DataFrame(columns=list(CELL_COLUMNS))
        df["category"] = np.where(df["is_all"].astype(int) == 1, ALL, df["category"])
        nd, na, nv = (df[c].astype("float64") for c in ("n_drafted", "n_accepted", "n_verify"))
        t = df["t_ms"].astype("float64")
        with np.errstate(divide="ignore", invalid="ignore"):
            df["acceptance_rate"] = rates.acceptance_rates(na, nd)
            df["mean_acceptance_length"] = rates.mean_acceptance_lengths(na, nv)
            df["tokens_per_s"] = np.where(t > 0, df["n_emitted"].astype("float64") / (t / 1e3), np.nan)
        base = df[df["assistant"] == BASELINE].set_index("category")["tokens_per_s"]
        ref = df["category"].map(base)
        with np.errstate(divide="ignore", invalid="ignore"):
            df["speedup"] = df["tokens_per_s"] / ref.astype("float64")
        order_a = {a: i for i, (a, _) in enumerate(self.spec.assistants)}
        order_c = {c: i for i, c in enumerate((ALL, *self.categories))}
        df["_a"] = df["assistant"].map(lambda a: order_a.get(a, len(order_a)))
        df["_c"] = df["category"].map(lambda c: order_c.get(c, len(order_c)))
        df = df.sort_values(["_a", "n_draft", "_c"], kind="stable").reset_index(drop=True)
        out = df[list(CELL_COLUMNS)].copy()
        for c in ("n_draft", "n_prompts", "n_rounds", "n_drafted", "n_accepted"):
            out[c] = out[c].astype("int64")
        return out

    @staticmethod
    def best(cells: pd.DataFrame) -> dict[str, BestConfig]:
        """Per category (``all`` included) the configuration with the highest measured tokens/s (the
        baseline excluded): ``{category: BestConfig}``."""
        out: dict[str, BestConfig] = {}
        c = cells[(cells["assistant"] != BASELINE) & cells["tokens_per_s"].notna()]
        for cat, g in c.groupby("category", sort=False):
            row = g.loc[g["tokens_per_s"].astype(float).idxmax()]  # type: ignore[call-overload]  # pandas-stubs: idxmax's label is a Hashable, which .loc's overloads do not take
            sp = row["speedup"]
            out[str(cat)] = BestConfig(str(row["assistant"]), int(row["n_draft"]), float(row["tokens_per_s"]),
                                       None if sp is None or (isinstance(sp, float) and math.isnan(sp)) else float(sp))
        return out

    def report(self) -> SweepReport:
        """``mtpscope report DIR`` on a sweep (:class:`SweepReport`; its ``to_dict()`` is ``--json``'s body
        before the advice keys): the cells (:data:`CELL_COLUMNS`), failed tasks, the best configuration per
        category (:meth:`best`), warnings and the quantized assistants' rows (:func:`traces.sweep.quant.quant_rows`;
        empty without ``--assistant-quant``). NaN becomes None."""
        cells = self.cells()
        best = self.best(cells)
        return SweepReport(
            sweep=os.fspath(self.path), complete=self.complete, n_tasks=len(self._tasks), n_done=self.n_done,
            categories=tuple(self.categories), cells=tuple(CellRow(**r) for r in json_records(cells)),
            failed=tuple(FailedRow(f.task, f.error, f.attempts) for f in self.failed),
            best={c: b.n_draft for c, b in best.items()}, best_configs=best, warnings=tuple(self.warnings),
            # --- drafter quantizations (--assistant-quant): traces.sweep.quant; () without them
            quantization=quant_rows(quant_table(cells, self.spec)))

    def timeline(self, assistant: str, n_draft: int, category: str | None = None,
                 columns: Sequence[str] = ("n_draft", "n_accepted")) -> pd.DataFrame:
        """One configuration's rounds in prompt order: ``prompt_id`` (the prompt set's index),
        ``round``, then ``columns`` of the rounds view (``n_draft`` here is each round's own draft
        count, as in a trace), over all its finished shards (``category``: only those prompts).

        Raises:
            TraceFormatError: an unknown column name.
        """
        names = set(S.ROUNDS_SCHEMA.names)
        sel = []
        for c in columns:
            if c not in names:
                raise TraceFormatError("unknown rounds column", path=self.path, key=c,
                                       expected=", ".join(S.ROUNDS_SCHEMA.names), actual=c)
            if c in ("prompt_id", "round"):
                continue
            sel.append("r.round_n_draft AS n_draft" if c == "n_draft" else f'r."{c}"')
        where = "r.assistant = ? AND r.n_draft = ?"
        params: list[Any] = [assistant, int(n_draft)]
        if category is not None:
            where += " AND p.category = ?"
            params.append(category)
        cols = ", ".join(["p.prompt_index AS prompt_id", "r.round", *sel])
        # only this configuration's files: the other tasks' traces are not even opened
        src = self._relation("rounds", self._done_files("rounds", (assistant, int(n_draft))))
        return self._query(self._base_con(), f"SELECT {cols} FROM {src} r JOIN prompts p ON p.shard = r.shard AND "
                           f"p.prompt_id = r.prompt_id WHERE {where} ORDER BY p.prompt_index, r.round", params)

    # ------------------------------------------------------------------ cells
    def cell(self, assistant: str, n_draft: int, shard: int | None = None) -> TraceLike:
        """One task's trace (``shard`` given: a :class:`traces.store.reader.Trace`) or a configuration over all
        its shards (:class:`SweepCell`).

        Raises:
            TraceFormatError: no such task, or a task that is not done (its state named), or its
                trace unreadable.
        """
        shards = [shard] if shard is not None else range(self.spec.n_shards)
        tasks = [self._task(assistant, n_draft, s) for s in shards]
        for t in tasks:
            if t.state != "done":
                raise TraceFormatError("this task has not finished", path=self.path / t.dir, key=t.task,
                                       expected="done", actual=t.state)
        if shard is not None:
            return self._trace(tasks[0])
        return SweepCell(self, assistant, int(n_draft), [self._trace(t) for t in tasks],
                         [t.shard for t in tasks])

    def shard_of(self, prompt_index: int) -> tuple[int, int]:
        """``(shard, prompt_id in that shard)`` of a prompt of the set."""
        for p in self.state["prompts"]:
            if int(p["index"]) == int(prompt_index):
                return int(p["shard"]), int(p["prompt_id"])
        raise TraceFormatError("no such prompt", path=self.path / SWEEP_FILE, key="prompt_index",
                               expected=f"0..{len(self.state['prompts']) - 1}", actual=prompt_index)

    def close(self) -> None:
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None
                self._views = False


class SweepCell(TraceLike):
    """One configuration (assistant, n_draft) over all its shards, read like a :class:`Trace`
    (:class:`TraceLike`; ``rounds`` / ``steps`` / ``requests`` are ``columns(table)``).

    ``prompt_id`` in ``rounds`` / ``steps`` / ``sql`` / the manifest's ``prompts`` is the prompt set's
    index (unique over the shards); rows are in prompt-index order, then round (and k). ``manifest``
    is the first shard's with ``prompts`` (with ``category``) over all shards, ``complete`` true when
    every shard's is, ``counts`` summed and ``sweep`` = ``{path, assistant, n_draft, shards}``. ``schemas``
    are the first shard's (every shard is recorded with the same settings).
    """

    def __init__(self, sweep: Sweep, assistant: str, n_draft: int, traces: list[Trace], shards: list[int]) -> None:
        self.sweep = sweep
        self.assistant = assistant
        self.n_draft = n_draft
        self._traces = traces
        self._shards = shards
        self.path = sweep.path / f"assistant={assistant}" / f"n_draft={n_draft}"
        self.warnings = [w for t in traces for w in t.warnings]
        self.schemas = traces[0].schemas
        pmap = {(int(p["shard"]), int(p["prompt_id"])): p for p in sweep.state["prompts"]}
        self._index: dict[int, np.ndarray] = {}
        prompts = []
        for tr, s in zip(traces, shards, strict=True):
            mp = tr.manifest.get("prompts") or []
            n = max([len(mp)] + [pid + 1 for (ps, pid) in pmap if ps == s])
            idx = np.full(n, -1, np.int64)
            for (ps, pid), p in pmap.items():
                if ps == s:
                    idx[pid] = int(p["index"])
            self._index[s] = idx
            for e in mp:
                pid = int(e.get("prompt_id", -1))
                if 0 <= pid < len(idx) and idx[pid] >= 0:
                    prompts.append({**e, "prompt_id": int(idx[pid]), "category": pmap[(s, pid)]["category"]})
        prompts.sort(key=lambda e: e["prompt_id"])
        m = dict(traces[0].manifest)
        m["prompts"] = prompts
        m["complete"] = all(bool(t.manifest.get("complete")) for t in traces)
        m["counts"] = {k: sum(int((t.manifest.get("counts") or {}).get(k) or 0) for t in traces)
                       for k in ("n_rounds", "n_steps", "n_parts")}
        m["sweep"] = {"path": os.fspath(sweep.path), "assistant": assistant, "n_draft": n_draft, "shards": shards}
        #: the shards' probes (each checked by Sweep._check) merged, given as is by CostProbe.of_trace
        self.cost_probe = CostProbe.merged([CostProbe.of_trace(t) for t in traces])
        m["cost_probe"] = None if self.cost_probe is None else self.cost_probe.to_dict()
        self.manifest = m
        self._cache: dict[tuple[str, tuple[str, ...] | None], pd.DataFrame] = {}

    def __repr__(self) -> str:
        return f"SweepCell({os.fspath(self.sweep.path)!r}, assistant={self.assistant!r}, n_draft={self.n_draft})"

    def part_files(self, table: str) -> list[Path]:
        """Every shard's part files of ``table``."""
        return [p for t in self._traces for p in t.part_files(table)]

    def _concat(self, frames: list[tuple[int, pd.DataFrame]], table: str) -> pd.DataFrame:
        parts = []
        for s, df in frames:
            if "prompt_id" in df.columns and len(df):
                df = df.copy()
                pid = df["prompt_id"].to_numpy(dtype=np.int64, na_value=-1)
                ok = (pid >= 0) & (pid < len(self._index[s]))
                gid = np.where(ok, self._index[s][np.clip(pid, 0, len(self._index[s]) - 1)], -1)
                df["prompt_id"] = gid.astype(np.int32)
            parts.append(df)
        if not parts:
            return pd.DataFrame()
        out = pd.concat(parts, ignore_index=True)
        keys = [k for k in ("prompt_id", "round", "k") if k in out.columns]
        if keys and table in ("rounds", "steps"):
            out = out.sort_values(keys, kind="stable").reset_index(drop=True)
        return out

    def columns(self, table: str, names: Sequence[str] | None = None) -> pd.DataFrame:
        """As :meth:`Trace.columns`, over every shard (``prompt_id`` renumbered, rows in prompt order)."""
        key = (table, None if names is None else tuple(names))
        if key not in self._cache:
            frames = [(s, t.columns(table, names)) for t, s in zip(self._traces, self._shards, strict=True)]
            self._cache[key] = self._concat(frames, table)
        return self._cache[key]

    def hidden(self, name: str, where: Any = None) -> np.ndarray:
        """As :meth:`Trace.hidden` over every shard, stacked in prompt order (``where``: None or a
        DuckDB predicate string; a boolean mask is aligned with :attr:`steps`)."""
        if where is not None and not isinstance(where, str):
            mask = np.asarray(where, dtype=bool)
            picked: np.ndarray = self.hidden(name)[mask]
            return picked
        blocks = []
        for t, s in zip(self._traces, self._shards, strict=True):
            h = t.hidden(name, where)
            st = t.columns("steps", ["prompt_id", "round", "k"])
            if where is not None:
                st = t.sql(f"SELECT prompt_id, round, k FROM steps WHERE {where}")
            gid = self._index[s][st["prompt_id"].to_numpy(dtype=np.int64)]
            blocks.append((gid, st["round"].to_numpy(), st["k"].to_numpy(), h))
        if not blocks:
            return np.zeros((0, 0), np.float32)
        gid = np.concatenate([b[0] for b in blocks])
        rnd = np.concatenate([b[1] for b in blocks])
        k = np.concatenate([b[2] for b in blocks])
        h = np.concatenate([b[3] for b in blocks])
        return h[np.lexsort((k, rnd, gid))]

    def sql(self, query: str) -> pd.DataFrame:
        """DuckDB over this configuration: views ``rounds`` / ``steps`` of the sweep restricted to it,
        ``prompt_id`` renumbered to the prompt set's index (``round_n_draft`` dropped, ``n_draft`` the
        round's own)."""
        con = self.sweep.con
        name = f"_cell_{abs(hash((self.assistant, self.n_draft))) % 10**9}"
        with self.sweep._lock:
            con.execute(f"CREATE SCHEMA IF NOT EXISTS {name}")
            a, k = sql_str(self.assistant), int(self.n_draft)
            con.execute(f"CREATE OR REPLACE VIEW {name}.rounds AS SELECT r.* EXCLUDE (assistant, shard, n_draft, "
                        f"round_n_draft, prompt_id), p.prompt_index AS prompt_id, r.round_n_draft AS n_draft "
                        f"FROM main.rounds r JOIN main.prompts p ON p.shard = r.shard AND p.prompt_id = r.prompt_id "
                        f"WHERE r.assistant = {a} AND r.n_draft = {k}")
            con.execute(f"CREATE OR REPLACE VIEW {name}.steps AS SELECT s.* EXCLUDE (assistant, shard, n_draft, "
                        f"prompt_id), p.prompt_index AS prompt_id FROM main.steps s JOIN main.prompts p "
                        f"ON p.shard = s.shard AND p.prompt_id = s.prompt_id WHERE s.assistant = {a} AND s.n_draft = {k}")
            con.execute(f"SET schema = '{name}'")
            try:
                return self.sweep.sql(query)
            finally:
                con.execute("SET schema = 'main'")


def open_sweep(path: str | os.PathLike[str]) -> Sweep:
    """Open a sweep directory for reading (``traces.open_sweep``). Reads ``sweep.json`` now; each
    task's trace is opened when first needed.

    Raises:
        TraceFormatError: not a sweep directory, or an unreadable / malformed ``sweep.json``.
    """
    p = Path(path)
    return Sweep(p, read_state(p))
