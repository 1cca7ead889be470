"""Advice on a sweep, and the plain-decoding baseline of a trace that lives in one. One job: bring what a
sweep measured to :mod:`traces.analysis.advice` (the one recommendation of the CLI, JSON and the app).

* :func:`trace_baseline`: a sweep cell's plain decoding is the sweep's baseline task over the same prompts
  (same shard: ``assistant=baseline/n_draft=0/shard=<i>``; a :class:`traces.sweep.reader.SweepCell`: the
  baseline over all shards), per prompt, so speedups of the cell's what-if are measured, not estimated;
  else the trace's own ``record --baseline``; else None (estimated, and :func:`explain_with_baseline`
  says so).
* :func:`explain_with_baseline`: :func:`traces.analysis.explain_report.explain_trace` with that baseline:
  what ``mtpscope explain`` and the app's Explain page show.
* :func:`advise_sweep`: the sweep's own measurements as candidates (every assistant x n_draft, and plain
  decoding), per prompt, with a paired bootstrap over prompts (each resample draws prompts once and
  weighs every configuration and the baseline with them); break-even from the measured costs (draft
  step and verify per size from the MTP rounds, plain decoding from the baseline task) and the
  measured mean acceptance lengths of the recommended assistant.

Imports: traces.analysis (advice, what_if, explain_report), traces.sweep (spec, reader), traces.store.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

from mtpscope.errors import TraceFormatError
from mtpscope.traces.analysis import rates
from mtpscope.traces.analysis.advice import PLAIN, Advice, Candidate, advise_candidates
from mtpscope.traces.analysis.costs import (
    MIN_SIZE_ROUNDS,
    PlainBaseline,
    manifest_baseline,
    rounds_baseline,
    verify_line,
)
from mtpscope.traces.analysis.timing_quality import LOAD_FACTOR
from mtpscope.traces.analysis.what_if import N_BOOT, QUANTILES, SEED
from mtpscope.traces.sweep.spec import ALL, BASELINE, SweepTask, is_sweep, read_state

if TYPE_CHECKING:
    from mtpscope.traces.analysis.explain_report import Explanation
    from mtpscope.traces.store.protocols import TraceLike

_BASE_COLUMNS = ["prompt_id", "round", "n_accepted", "emitted", "t_draft_ms", "t_verify_ms"]


def sweep_of(trace: Any) -> tuple[Path, str, int | None] | None:
    """``(sweep directory, task folder, shard)`` of a trace stored as a sweep's task (its folder is
    ``<sweep>/assistant=<a>/n_draft=<k>/shard=<i>``), or of a :class:`SweepCell` (shard None); None
    for any other trace."""
    m = getattr(trace, "manifest", None) or {}
    sw = m.get("sweep") if isinstance(m, dict) else None
    if isinstance(sw, dict) and sw.get("path"):
        return Path(sw["path"]), f"assistant={sw.get('assistant')}/n_draft={sw.get('n_draft')}", None
    p = Path(getattr(trace, "path", ""))
    task = SweepTask.parse_task_id("/".join(p.parts[-3:])) if len(p.parts) > 3 else None
    if task is None:
        return None
    root = p.parents[2]
    if not is_sweep(root):
        return None
    return root, os.path.relpath(p, root), task.shard


def trace_baseline(trace: Any) -> tuple[PlainBaseline | None, str | None]:
    """Plain decoding for a trace's speedups (module docstring) and, when a sweep cell's sweep has no
    usable baseline, a note saying so.

    Returns:
        ``(baseline or None, note or None)``.
    """
    where = sweep_of(trace)
    if where is None:
        return manifest_baseline(trace.manifest), None
    root, _task, shard = where
    try:
        state = read_state(root)
    except TraceFormatError as e:
        return manifest_baseline(trace.manifest), f"the sweep around this trace is unreadable ({e.one_line()})"
    tasks = [t for t in state["tasks"] if t.get("assistant") == BASELINE and (shard is None or t.get("shard") == shard)]
    if not tasks:
        return manifest_baseline(trace.manifest), ("this sweep recorded no plain decoding (sweep --baseline): "
                                                   "speedups are estimated")
    if any(t.get("state") != "done" for t in tasks):
        return manifest_baseline(trace.manifest), "this sweep's plain-decoding task has not finished: speedups are estimated"
    from mtpscope.traces.store.reader import open_trace

    bt: TraceLike
    if shard is not None:
        bt = open_trace(root / tasks[0]["dir"])
        how = f"the sweep's plain decoding of the same prompts ({tasks[0]['dir']})"
    else:
        from mtpscope.traces.sweep.reader import open_sweep

        bt = open_sweep(root).cell(BASELINE, 0)
        how = "the sweep's plain decoding of the same prompts (every shard)"
    b = rounds_baseline(bt.columns("rounds", _BASE_COLUMNS), how, "sweep")
    if b is None:
        return manifest_baseline(trace.manifest), "the sweep's plain-decoding trace has no timed rounds: speedups are estimated"
    return b, None


def trace_categories(trace: Any) -> dict[int, str] | None:
    """``{prompt_id: category}`` of a sweep task's trace from ``sweep.json`` (its shard's prompts; sweeps
    recorded before the categories reached the traces' manifests), None for any other trace."""
    where = sweep_of(trace)
    if where is None or where[2] is None:
        return None
    try:
        state = read_state(where[0])
    except TraceFormatError:
        return None
    return {int(p["prompt_id"]): str(p["category"]) for p in state["prompts"] if int(p["shard"]) == where[2]}


def explain_with_baseline(trace: Any, *, vocab: Any = None, prompt: str | int | None = None,
                          category_field: str | None = None, with_drift: bool = True) -> Explanation:
    """:func:`traces.analysis.explain_report.explain_trace` with :func:`trace_baseline`'s plain decoding
    (its note added to the explanation's notes) and, for a sweep task, the sweep's prompt categories:
    the one explanation of ``mtpscope explain`` and the app."""
    from dataclasses import replace

    from mtpscope.traces.analysis.explain_report import explain_trace

    base, note = trace_baseline(trace)
    x = explain_trace(trace, vocab=vocab, prompt=prompt, baseline=base, category_field=category_field,
                      with_drift=with_drift, categories=trace_categories(trace))
    return replace(x, notes=(*x.notes, note)) if note else x


# ------------------------------------------------------------------------------------------ a sweep

def per_prompt(sw: Any) -> pd.DataFrame:
    """One row per (assistant, n_draft, prompt): ``assistant``, ``n_draft``, ``prompt_index``,
    ``category``, ``n_rounds``, ``n_verify``, ``n_drafted``, ``n_accepted``, ``n_emitted``, ``t_ms``
    (draft + verify), ``t_draft_ms`` (rounds that drafted), computed in DuckDB."""
    df: pd.DataFrame = sw.sql(
        "SELECT r.assistant, r.n_draft, p.prompt_index, p.category, count(*) AS n_rounds, "
        "count(*) FILTER (WHERE r.round_n_draft > 0) AS n_verify, sum(r.round_n_draft) AS n_drafted, "
        "sum(r.n_accepted) AS n_accepted, sum(coalesce(len(r.emitted), r.n_accepted + 1)) AS n_emitted, "
        "sum(coalesce(r.t_draft_ms, 0) + coalesce(r.t_verify_ms, 0)) AS t_ms, "
        "sum(CASE WHEN r.round_n_draft > 0 THEN coalesce(r.t_draft_ms, 0) ELSE 0 END) AS t_draft_ms "
        "FROM rounds r JOIN prompts p ON p.shard = r.shard AND p.prompt_id = r.prompt_id GROUP BY ALL")
    return df


def verify_costs(sw: Any) -> pd.DataFrame:
    """Mean ``t_verify_ms`` per verify size ``n`` (= a round's own draft count + 1) over the sweep's MTP
    rounds: columns ``assistant``, ``n``, ``t_verify_ms``, ``n_rounds``."""
    df: pd.DataFrame = sw.sql(
        f"SELECT assistant, round_n_draft + 1 AS n, avg(t_verify_ms) AS t_verify_ms, count(*) AS n_rounds "
        f"FROM rounds WHERE assistant <> '{BASELINE}' AND t_verify_ms IS NOT NULL GROUP BY ALL ORDER BY 1, 2")
    return df


def _iv(v: np.ndarray) -> tuple[float, float] | None:
    s = v[1:][np.isfinite(v[1:])]
    if len(s) < 2:
        return None
    lo, hi = np.quantile(s, QUANTILES)
    return float(lo), float(hi)


def _candidates(pp: pd.DataFrame, prompts: np.ndarray, W: np.ndarray, multi: bool) -> tuple[list[Candidate], int]:
    """Candidates over the prompts ``prompts`` (prompt indices, aligned with the columns of ``W``)."""
    col = {int(p): i for i, p in enumerate(prompts)}

    def vec(g: pd.DataFrame, c: str) -> np.ndarray:
        v = np.zeros(len(prompts))
        for p, x in zip(g["prompt_index"], g[c], strict=True):
            if int(p) in col:
                v[col[int(p)]] = float(x)
        return v

    base = pp[pp["assistant"] == BASELINE]
    plain_tps = None
    if len(base):
        ne, t = W @ vec(base, "n_emitted"), W @ vec(base, "t_ms")
        plain_tps = np.where(t > 0, 1000.0 * ne / np.maximum(t, 1e-12), np.nan)
    out = [Candidate(PLAIN, None if plain_tps is None else float(plain_tps[0]), 1.0,
                     None if plain_tps is None else _iv(plain_tps), (1.0, 1.0), measured=plain_tps is not None)]
    n_first = []
    for (a, k), g in pp[pp["assistant"] != BASELINE].groupby(["assistant", "n_draft"], sort=True):
        g = g[g["prompt_index"].isin(prompts)]
        if not len(g):
            continue
        ne, t = W @ vec(g, "n_emitted"), W @ vec(g, "t_ms")
        tps = np.where(t > 0, 1000.0 * ne / np.maximum(t, 1e-12), np.nan)
        sp = tps / plain_tps if plain_tps is not None else np.full_like(tps, np.nan)
        out.append(Candidate(int(k), float(tps[0]) if math.isfinite(tps[0]) else None,  # type: ignore[call-overload]  # pandas-stubs: a groupby key is a Hashable; n_draft holds ints
                             float(sp[0]) if math.isfinite(sp[0]) else None, _iv(tps), _iv(sp), measured=True,
                             assistant=str(a) if multi else None))
        n_first.append(int(g["n_verify"].sum()))
    return out, min(n_first) if n_first else 0


def _verify_ms(means: Mapping[int, float], v0: float, v1: float, n: int) -> float:
    """The verify time of ``n`` tokens: measured where recorded, else the fitted line ``v0 + v1 * n``."""
    return means[n] if n in means else v0 + v1 * n


def advise_sweep(sw: Any, *, n_boot: int = N_BOOT, seed: int = SEED) -> Advice:
    """The :class:`Advice` of a sweep (module docstring): measured candidates overall and per category,
    plain decoding from its baseline task (without one, no speedups: "too few rounds to tell" names
    the missing baseline through the estimate note)."""
    pp = per_prompt(sw)
    multi = len(sw.spec.assistants) > 1
    rng = np.random.default_rng(seed)
    prompts = np.array(sorted(int(p) for p in pp["prompt_index"].unique())) if len(pp) else np.zeros(0, int)

    def weights(n: int) -> np.ndarray:
        w = np.ones((1 + n_boot, n))
        if n and n_boot:
            w[1:] = rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot)
        return w

    cands, n_first = _candidates(pp, prompts, weights(len(prompts)), multi)
    by, nfd = {}, {}
    cat_of = {int(p["index"]): str(p["category"]) for p in sw.state["prompts"]}
    for cat in sw.categories:
        ps = np.array([p for p in prompts if cat_of.get(int(p)) == cat])
        if len(ps):
            by[cat], nfd[cat] = _candidates(pp, ps, weights(len(ps)), multi)
    base_rows = pp[pp["assistant"] == BASELINE]
    baseline = None
    if len(base_rows):
        per = {int(p): (int(ne), float(t)) for p, ne, t in zip(base_rows["prompt_index"], base_rows["n_emitted"],
                                                              base_rows["t_ms"], strict=True)}
        tok, ms = sum(v[0] for v in per.values()), sum(v[1] for v in per.values())
        if tok > 0 and ms > 0:
            baseline = PlainBaseline(ms / tok, "sweep", "the sweep's plain decoding of the same prompts (--baseline)",
                                     per)
    # break-even of the recommended assistant (or the first), from the measured costs
    mtp = pp[pp["assistant"] != BASELINE]
    tau: dict[int, float] = {}
    tau_cat: dict[str, dict[int, float]] = {}
    t_step = t_plain = None
    verify_ms: Callable[[int], float] | None = None
    if len(mtp) and baseline is not None:
        best = max((c for c in cands if c.choice != PLAIN and c.speedup is not None),
                   key=lambda c: cast(float, c.speedup), default=None)   # (speedup: not None, filtered above)
        a = (best.assistant if best is not None and best.assistant else None) or sw.spec.assistants[0][0]
        mine = mtp[mtp["assistant"] == a]
        nd = float(mine["n_drafted"].sum())
        t_step = float(mine["t_draft_ms"].sum()) / nd if nd > 0 else None
        for k, g in mine.groupby("n_draft"):
            mal = rates.mean_acceptance_length(g["n_accepted"].sum(), g["n_verify"].sum())
            if mal is not None:
                tau[int(k)] = mal  # type: ignore[arg-type]  # pandas-stubs: a groupby key is any Scalar; n_draft holds ints
        for (cat, n), g in mine.groupby(["category", "n_draft"]):
            mal = rates.mean_acceptance_length(g["n_accepted"].sum(), g["n_verify"].sum())
            if mal is not None:
                tau_cat.setdefault(str(cat), {})[int(n)] = mal  # type: ignore[call-overload]  # pandas-stubs: a groupby key is a Hashable; n_draft holds ints
        vc = verify_costs(sw)
        vc = vc[vc["assistant"] == a]
        means = {int(n): float(t) for n, t in zip(vc["n"], vc["t_verify_ms"], strict=True)}
        counts = {int(n): float(c) for n, c in zip(vc["n"], vc["n_rounds"], strict=True)}
        t_plain = baseline.t_per_token_ms
        xs = [float(n) for n in means] + [1.0]
        ys = [means[n] for n in means] + [t_plain]
        ws = [counts[n] for n in means] + [max(counts.values(), default=1.0)]
        v0, v1, _ = verify_line(xs, ys, ws)

        verify_ms = partial(_verify_ms, means, v0, v1)

    return advise_candidates(cands, by, n_first_drafts=n_first, n_first_drafts_by_category=nfd, tau=tau,
                             tau_by_category=tau_cat, t_step_ms=t_step, t_verify_ms=verify_ms, t_plain_ms=t_plain,
                             baseline=baseline)


@dataclass(frozen=True)
class LoadWarning:
    """Cells of a sweep that ran under different load (:func:`load_warnings`).

    Attributes:
        n: the verify size compared (1: a plain decode step, the baseline's every token).
        slow / fast: the cells (``assistant/n_draft/shard``) with the highest and lowest median.
        slow_ms / fast_ms: their medians (ms). ratio: ``slow_ms / fast_ms``. words: one sentence.
    """

    n: int
    slow: str
    fast: str
    slow_ms: float
    fast_ms: float
    ratio: float
    words: str


def load_warnings(sw: Any, factor: float = LOAD_FACTOR) -> list[LoadWarning]:
    """Verify sizes whose median ``t_verify_ms`` differs by more than ``factor`` between the sweep's cells
    (each task: assistant, n_draft, shard; the baseline's rounds are verifies of 1 token), over cells with at
    least ``MIN_SIZE_ROUNDS`` rounds of that size. A verify of ``n`` tokens costs the same whatever the
    configuration, so a gap is load (docs/SWEEP.md): the cells' speeds are not comparable."""
    try:
        df = sw.sql("SELECT assistant, n_draft, shard, round_n_draft + 1 AS n, median(t_verify_ms) AS ms, "
                    "count(*) AS c FROM rounds WHERE t_verify_ms IS NOT NULL GROUP BY ALL")
    except Exception:   # noqa: BLE001 -- a sweep without rounds yet: nothing to compare
        return []
    out = []
    df = df[(df["c"] >= MIN_SIZE_ROUNDS) & (df["ms"] > 0)]
    for n, g in df.groupby("n"):
        if len(g) < 2:
            continue
        hi, lo = g.loc[g["ms"].idxmax()], g.loc[g["ms"].idxmin()]
        ratio = float(hi["ms"] / lo["ms"])
        if ratio > factor:
            def name(r: pd.Series) -> str:
                return f"{r['assistant']}/n_draft={int(r['n_draft'])}/shard={int(r['shard'])}"

            out.append(LoadWarning(int(n), name(hi), name(lo), float(hi["ms"]), float(lo["ms"]), ratio,
                                   f"cells ran under different load: a verify of {int(n)} token{'s' if n > 1 else ''} "
                                   f"took {float(hi['ms']):.2f} ms (median) in {name(hi)} and {float(lo['ms']):.2f} ms "
                                   f"in {name(lo)}, {ratio:.2f}× (over {factor:g}×); compare speeds only from "
                                   "cells recorded under the same load (more shards interleave them)"))
    return out


@dataclass(frozen=True)
class SweepAdvice:
    """A sweep's advice (:func:`advise_sweep`) and its load warnings (:func:`load_warnings`): what the sweep
    report (CLI, ``--json``) and the app's Sweep page show."""

    advice: Advice
    load_warnings: tuple[LoadWarning, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The JSON keys ``recommendation``, ``break_even``, ``candidates``, ``baseline``, ``timing_quality``
        (:meth:`traces.analysis.advice.Advice.to_dict`) and ``load_warnings`` (each :class:`LoadWarning`'s fields)."""
        d = self.advice.to_dict()
        d["load_warnings"] = [asdict(w) for w in self.load_warnings]
        return d


def sweep_advice(sw: Any) -> SweepAdvice:
    """:func:`advise_sweep` and :func:`load_warnings` of an opened sweep (:class:`traces.sweep.reader.Sweep`)."""
    return SweepAdvice(advise_sweep(sw), tuple(load_warnings(sw)))


def sweep_advice_dict(sw: Any) -> dict[str, Any]:
    """:func:`sweep_advice`'s JSON (:meth:`SweepAdvice.to_dict`)."""
    return sweep_advice(sw).to_dict()


__all__ = ["ALL", "LoadWarning", "SweepAdvice", "advise_sweep", "load_warnings", "explain_with_baseline", "per_prompt",
           "sweep_advice", "sweep_advice_dict", "sweep_of", "trace_baseline", "trace_categories", "verify_costs"]
