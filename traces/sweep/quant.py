"""A sweep over drafter quantizations (``mtpscope sweep ... --assistant-quant f32,q8_0,q6_k,q4_k_m,q4_0``):
the quantized assistants, and the report's table per quantization x category.

* :func:`quant_assistants`: each given drafter quantized once per llama.cpp file type into the cache
  (:func:`traces.run.quantize.quantized_copy`: keyed by the drafter's content hash and the type, reused
  by every later sweep), each an assistant of its own named by its type (``q4_k_m``; with several
  drafters ``<name>-q4_k_m``), recorded in the spec as :class:`traces.sweep.spec.QuantAssistant`;
* :func:`restore_quantized`: ``--resume`` after the cache was cleaned makes the missing files again
  from their recorded source (refused when the source's content changed);
* :func:`quant_table`: the report's cells (:meth:`traces.sweep.reader.Sweep.cells`) of the quantized
  assistants as one table per category x type: acceptance rate, mean acceptance length, tokens/s,
  speedup and the file size. ``intervals`` is the hook for the advice's bootstrap intervals (issue 23):
  given ``{(assistant, n_draft, category): {metric: (lo, hi)}}``, the table gains ``<metric>_lo`` /
  ``<metric>_hi`` columns; without it the numbers are plain.

Imports: pandas, numpy, mtpscope.errors, traces.sweep.spec; traces.run.quantize inside the functions
that quantize (llama.cpp runs in this process, before Ray starts).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mtpscope.errors import MtpscopeError
from mtpscope.traces.analysis.records import JsonRecord, json_records
from mtpscope.traces.sweep.spec import ALL, QuantAssistant, SweepSpec

#: the columns of :func:`quant_table` (without intervals), in order
QUANT_COLUMNS = ("category", "qtype", "assistant", "n_draft", "n_prompts", "n_rounds", "acceptance_rate",
                 "mean_acceptance_length", "tokens_per_s", "speedup", "n_bytes", "source")
#: the metrics an ``intervals`` mapping may bound
INTERVAL_METRICS = ("acceptance_rate", "mean_acceptance_length", "tokens_per_s", "speedup")


@dataclass(frozen=True)
class QuantRow(JsonRecord):
    """One row of :func:`quant_table` as the report has it (:func:`quant_rows`): a category x llama.cpp type x
    n_draft with the quantized drafter's ``assistant`` name, prompts, rounds, acceptance rate (0..1), mean
    acceptance length (tokens), tokens/s, speedup (None where undefined), ``n_bytes`` (the quantized file's size)
    and ``source`` (the drafter's file name). ``intervals``: ``{metric: (lo, hi)}`` for the metrics the table
    bounds (``<metric>_lo`` / ``_hi`` columns; None where a cell has none); in ``to_dict()`` they follow as those
    keys."""

    category: str
    qtype: str
    assistant: str
    n_draft: int
    n_prompts: int
    n_rounds: int
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    tokens_per_s: float | None
    speedup: float | None
    n_bytes: int
    source: str
    intervals: Mapping[str, tuple[float | None, float | None]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The row as its JSON: :data:`QUANT_COLUMNS`, then ``<metric>_lo`` and ``<metric>_hi`` per interval."""
        out = {c: getattr(self, c) for c in QUANT_COLUMNS}
        for m, (lo, hi) in self.intervals.items():
            out[f"{m}_lo"], out[f"{m}_hi"] = lo, hi
        return out


def quant_rows(table: pd.DataFrame) -> tuple[QuantRow, ...]:
    """:func:`quant_table`'s rows as :class:`QuantRow` records (NaN -> None, numpy scalars -> Python numbers)."""
    rows = []
    for r in json_records(table):
        named = [m for m in INTERVAL_METRICS if f"{m}_lo" in r]
        rows.append(QuantRow(**{c: r[c] for c in QUANT_COLUMNS},
                             intervals={m: (r[f"{m}_lo"], r[f"{m}_hi"]) for m in named}))
    return tuple(rows)


def quant_name(assistant: str, qtype: str, n_assistants: int) -> str:
    """The partition name of ``assistant`` quantized to ``qtype``: the type alone when the sweep
    quantizes one drafter, else ``<assistant>-<qtype>``."""
    return qtype if n_assistants == 1 else f"{assistant}-{qtype}"[:64]


def quant_assistants(pairs: Sequence[tuple[str, str]], types: Sequence[str], *,
                     cache: str | os.PathLike[str] | None = None, n_threads: int = 0,
                     on_quantize: Callable[[str], None] | None = None
                     ) -> tuple[tuple[tuple[str, str], ...], tuple[QuantAssistant, ...]]:
    """Every drafter of ``pairs`` (``(name, path)``) quantized to every type of ``types``, from the cache
    where it was done before.

    Returns:
        ``(assistants, quantized)``: the spec's ``(name, path)`` pairs (drafter by drafter, types in the
        given order; paths in the cache) and their :class:`QuantAssistant` records.

    Raises:
        MtpscopeError: an unknown type (the line lists llama.cpp's), repeated types, no drafter.
        InspectorError / TraceError: what :func:`traces.run.quantize.quantize_file` raises (an unreadable
            drafter, llama.cpp's refusal quoted).
    """
    from mtpscope.cache import sha256_file
    from mtpscope.traces.run.quantize import check_types, quantized_copy

    qtypes = check_types(list(types), key="--assistant-quant")
    if not pairs:
        raise MtpscopeError("--assistant-quant needs a drafter to quantize", key="--assistant", expected=">= 1",
                            actual=0)
    assistants: list[tuple[str, str]] = []
    records: list[QuantAssistant] = []
    for name, path in pairs:
        src = Path(path).resolve()
        digest = sha256_file(src)
        for q in qtypes:
            r = quantized_copy(src, q, cache=cache, n_threads=n_threads, on_quantize=on_quantize)
            qn = quant_name(name, q, len(pairs))
            assistants.append((qn, os.fspath(r.out)))
            records.append(QuantAssistant(name=qn, qtype=q, source=os.fspath(src), source_sha256=digest,
                                          n_bytes=r.n_bytes_out))
    return tuple(assistants), tuple(records)


def restore_quantized(spec: SweepSpec, *, cache: str | os.PathLike[str] | None = None, n_threads: int = 0,
                      on_quantize: Callable[[str], None] | None = None) -> SweepSpec:
    """The spec of a sweep being resumed, with every quantized assistant's file present: one that is
    missing (a cleaned cache) is made again from its recorded source and type; its path in the returned
    spec is where it now lies.

    Raises:
        MtpscopeError: a missing file whose source is gone or has other content than recorded.
        What :func:`traces.run.quantize.quantized_copy` raises.
    """
    from mtpscope.cache import sha256_file
    from mtpscope.traces.run.quantize import quantized_copy

    paths = dict(spec.assistants)
    changed = False
    for q in spec.quantized:
        if Path(paths[q.name]).is_file():
            continue
        if not Path(q.source).is_file() or sha256_file(q.source) != q.source_sha256:
            raise MtpscopeError("a quantized assistant is missing and its source drafter is gone or changed",
                                path=paths[q.name], key=q.name, expected=f"{q.source} with sha256 {q.source_sha256}",
                                actual="missing" if not Path(q.source).is_file() else "other content")
        paths[q.name] = os.fspath(quantized_copy(q.source, q.qtype, cache=cache, n_threads=n_threads,
                                                 on_quantize=on_quantize).out)
        changed = True
    if not changed:
        return spec
    from dataclasses import replace

    return replace(spec, assistants=tuple((n, paths[n]) for n, _ in spec.assistants))


def quant_table(cells: pd.DataFrame, spec: SweepSpec,
                intervals: Mapping[tuple[str, int, str], Mapping[str, tuple[float, float]]] | None = None
                ) -> pd.DataFrame:
    """The report's cells of the quantized assistants, one row per category x type x n_draft (columns
    :data:`QUANT_COLUMNS`), ordered by category (``all`` first, then the cells' order), then by the
    spec's quantized assistants, then n_draft. ``n_bytes`` is the quantized file's size; ``source`` the
    drafter's file name. Empty (with the columns) for a sweep without ``--assistant-quant``.

    Args:
        cells: :meth:`traces.sweep.reader.Sweep.cells` (``CELL_COLUMNS``).
        spec: the sweep's spec (its ``quantized`` records).
        intervals: optional ``{(assistant, n_draft, category): {metric: (lo, hi)}}`` for metrics of
            :data:`INTERVAL_METRICS`; each metric named in it gets ``<metric>_lo`` / ``<metric>_hi``
            columns (NaN where a cell has none).
    """
    if not spec.quantized or cells is None or len(cells) == 0:
        return pd.DataFrame(columns=list(QUANT_COLUMNS))
    order = {q.name: i for i, q in enumerate(spec.quantized)}
    by_name = {q.name: q for q in spec.quantized}
    c = cells[cells["assistant"].isin(list(order))].copy()
    if c.empty:
        return pd.DataFrame(columns=list(QUANT_COLUMNS))
    cats = list(dict.fromkeys([ALL, *cells["category"].tolist()]))
    c["qtype"] = c["assistant"].map(lambda a: by_name[a].qtype)
    c["n_bytes"] = c["assistant"].map(lambda a: by_name[a].n_bytes).astype("int64")
    c["source"] = c["assistant"].map(lambda a: Path(by_name[a].source).name)
    c["_c"] = c["category"].map(cats.index)
    c["_q"] = c["assistant"].map(order)
    c = c.sort_values(["_c", "_q", "n_draft"], kind="stable").reset_index(drop=True)
    out = c[list(QUANT_COLUMNS)].copy()
    if intervals:
        named = [m for m in INTERVAL_METRICS if any(m in v for v in intervals.values())]
        keys = list(zip(out["assistant"], out["n_draft"].astype(int), out["category"], strict=True))
        for m in named:
            lo = [intervals.get(k, {}).get(m, (np.nan, np.nan))[0] for k in keys]
            hi = [intervals.get(k, {}).get(m, (np.nan, np.nan))[1] for k in keys]
            out[f"{m}_lo"] = np.asarray(lo, dtype="float64")
            out[f"{m}_hi"] = np.asarray(hi, dtype="float64")
    return out

