"""Data preparation for the app's trace pages (pure: pandas / numpy, no Streamlit, no plotly): rounds
and prompts, the manifest's and the report's fields as the pages show them, and the cell helpers the other
view modules share.

Everything here takes the trace's DataFrames (``Trace.rounds``, columns as in docs/ARCHITECTURE.md), its
manifest, or a ``report()`` record (``report_records.TraceReport``) and returns small DataFrames / arrays /
values sized for a widget: vectorised so a 100,000-round trace stays well under a second. One round's tables and the generated text
are :mod:`mtpscope.app.round_views`; model files (tensors, values, centroids, validation) are
:mod:`mtpscope.app.model_views`.

Definitions (llama.cpp / vLLM, see docs/reference/gemma4-assistant-facts.md §4): acceptance rate = accepted drafts /
drafted tokens; mean acceptance length = 1 + accepted / verify rounds; per-position acceptance =
P(draft k accepted) for k = 1..K. The headline numbers shown in the app come from
``mtpscope.traces.analysis.metrics.report``; the helpers here only serve views the report does not carry (windows,
bins, streaks, per-prompt tables).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from mtpscope.app.formats import percent, points
from mtpscope.traces.analysis import wording

if TYPE_CHECKING:
    from mtpscope.traces.analysis.advice import BreakEven, Recommendation
    from mtpscope.traces.analysis.align import RateDelta
    from mtpscope.traces.analysis.report_records import PositionRow, TraceReport
    from mtpscope.traces.analysis.what_if import WhatIfRow

Decode = Callable[[int | None], str]

#: Row height (px) of a table whose long text cells must wrap instead of being cut: Streamlit's data grid
#: wraps a cell's text only in rows taller than 4rem (64 px); 88 px holds four lines.
WRAPPED_ROW_PX = 88


# ------------------------------------------------------------------------------------------- cells

def esc(s: str) -> str:
    """``s`` with ``&``, ``<``, ``>`` escaped for plotly hover and label text (which reads HTML)."""
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def is_null(x: Any) -> bool:
    """True for a missing cell value: None, ``pd.NA`` or a float NaN."""
    return x is None or x is pd.NA or (isinstance(x, float) and np.isnan(x))


def as_list(v: Any) -> list[int | None]:
    """A list cell (Python list, numpy array, Arrow scalar) as a list of int / None ([] for null)."""
    if is_null(v):
        return []
    if hasattr(v, "as_py"):
        v = v.as_py()
        if v is None:
            return []
    return [None if is_null(x) else int(x) for x in list(v)]


def opt_int(v: Any) -> int | None:
    """A cell as an int, or None when it is missing or not a number."""
    if is_null(v):
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


# --------------------------------------------------------------------------- manifest and report fields

def manifest_models(manifest: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A trace manifest's ``models`` entries that are objects (role -> dict); entries of any other
    type (a malformed manifest) are left out. ``{}`` when there is no ``models`` object."""
    models = manifest.get("models")
    if not isinstance(models, dict):
        return {}
    return {str(k): v for k, v in models.items() if isinstance(v, dict)}


def model_path(manifest: Mapping[str, Any], role: str) -> str | None:
    """``manifest.models[role].path`` (role ``assistant``, ``target``, ``centroids``) when it is a
    non-empty string, else None."""
    v = manifest_models(manifest).get(role, {}).get("path")
    return v if isinstance(v, str) and v.strip() and "\x00" not in v else None


def manifest_prompts(manifest: Mapping[str, Any]) -> list[dict]:
    """A trace manifest's ``prompts`` entries that are objects with an integer ``prompt_id`` (an int, or a
    string of digits); malformed entries are left out (:func:`clean_prompts`). Each returned dict has an
    ``int`` prompt_id and a ``str`` text."""
    return clean_prompts(manifest.get("prompts"))


def _num(v: Any) -> float:
    return float("nan") if v is None else float(v)


def acceptance_rate(rep: TraceReport) -> float:
    """``report().acceptance_rate`` as a float (NaN when the report says None)."""
    return _num(rep.acceptance_rate)


def mean_acceptance_length(rep: TraceReport) -> float:
    """``report().mean_acceptance_length`` as a float (NaN when None)."""
    return _num(rep.mean_acceptance_length)


def request_rows_words(kind: str, by_kind: Mapping[str, int]) -> str:
    """Which request rows a requests-only trace's numbers come from (``RequestTotals.kind``) and, when the trace holds
    rows of another kind too (a llama-server log with its acceptance lines and its responses' timings), that those are
    left out: both may describe the same requests (``metrics.request_totals`` keeps one kind)."""
    n = int(by_kind.get(kind, 0))
    words = f"The numbers above come from its {n:,} {kind} row{'' if n == 1 else 's'}"
    others = {k: int(v) for k, v in by_kind.items() if k != kind and v}
    if others:
        left = ", ".join(f"{v:,} {k} row{'' if v == 1 else 's'}" for k, v in sorted(others.items()))
        words += f"; its {left} are left out (both may describe the same requests)"
    return words + "."


def relative_paths(paths: Sequence[Any], root: Any) -> list[str]:
    """``paths`` as strings relative to ``root`` where they lie below it (``rounds/part-00001.parquet``), else whole."""
    from pathlib import Path

    out = []
    for p in paths:
        try:
            out.append(Path(p).relative_to(Path(root)).as_posix())
        except ValueError:
            out.append(str(p))
    return out


def rounds_read(rep: TraceReport | None, manifest: Mapping[str, Any]) -> str:
    """The Files page's "rounds": the rounds the metrics beside it read (``rep.n_rounds``), as "16 of 20" when a
    rounds part was lost (``rep.n_rounds_recorded``: the manifest's count); the manifest's count when the report
    could not be made ("?" without one)."""
    if rep is None:
        n = (manifest.get("counts") or {}).get("n_rounds")
        return "?" if n is None else str(n)
    if rep.n_rounds_recorded is not None:
        return f"{rep.n_rounds} of {rep.n_rounds_recorded}"
    return str(rep.n_rounds)


def per_position(rep: TraceReport | Sequence[PositionRow]) -> pd.DataFrame:
    """``report().per_position`` as a DataFrame (k, n_rounds, n_accepted, acceptance, conditional); ``rep`` may
    also be the rows themselves (a diagnosis' ``summary.per_position``,
    :class:`~mtpscope.traces.diagnose.records.DiagnosisSummary`)."""
    rows = [p.to_dict() for p in (rep if isinstance(rep, Sequence) else rep.per_position)]
    df = pd.DataFrame(rows, columns=["k", "n_rounds", "n_accepted", "acceptance", "conditional"])
    return df.astype({"acceptance": float, "conditional": float})


# ----------------------------------------------------------------------------------------- rounds

def ordered_rounds(rounds: pd.DataFrame, prompt_ids: Sequence[int] | None = None) -> pd.DataFrame:
    """Rounds sorted by (prompt_id, round), optionally only some prompts, with a 0-based ``seq``
    column (the x position on the timeline) and the original index dropped."""
    df = rounds
    if prompt_ids is not None:
        df = df[df["prompt_id"].isin(list(prompt_ids))]
    df = df.sort_values(["prompt_id", "round"], kind="stable").reset_index(drop=True)
    df["seq"] = np.arange(len(df), dtype=np.int64)
    return df


def per_prompt_table(rounds: pd.DataFrame, prompts: Sequence[dict] | None = None) -> pd.DataFrame:
    """One row per prompt, worst first: :func:`mtpscope.traces.analysis.metrics.per_prompt` (n_rounds, n_drafted,
    n_accepted, acceptance_rate, mean_acceptance_length) plus the prompt's text (from the manifest's
    prompts when given) and its longest zero-acceptance streak (rounds, from
    :func:`mtpscope.traces.analysis.metrics.zero_acceptance_streaks`). Worst first
    (:func:`mtpscope.traces.analysis.ordering.worst_first`: acceptance rate ascending, then prompt_id, prompts
    without a rate last, as the CLI lists them)."""
    from mtpscope.traces.analysis import metrics
    from mtpscope.traces.analysis.ordering import worst_first

    t = metrics.per_prompt(rounds)
    streaks = metrics.zero_acceptance_streaks(rounds) if len(rounds) else None
    if streaks is not None and len(streaks):
        longest = streaks.groupby("prompt_id")["length"].max()
        t["longest_zero_streak"] = longest.reindex(t["prompt_id"].to_numpy()).fillna(0).astype(np.int64).to_numpy()
    else:
        t["longest_zero_streak"] = np.zeros(len(t), dtype=np.int64)
    texts = prompt_texts(prompts)
    t.insert(1, "text", [texts.get(int(p), "") for p in t["prompt_id"]])
    return worst_first(t)


def clean_prompts(prompts) -> list[dict]:
    """A manifest's well-formed ``prompts`` entries (:func:`mtpscope.traces.analysis.wording.manifest_prompts`)."""
    return wording.manifest_prompts(prompts)


def prompt_texts(prompts) -> dict[int, str]:
    """prompt_id -> text of a manifest's ``prompts`` (:func:`mtpscope.traces.analysis.wording.prompt_texts`)."""
    return wording.prompt_texts(prompts)


def prompt_labels(prompt_ids, prompts, width: int = wording.PROMPT_LABEL_CHARS) -> dict[int, str]:
    """prompt_id -> ``prompt 3 “text…”`` (:func:`mtpscope.traces.analysis.wording.prompt_labels`)."""
    return wording.prompt_labels(prompt_ids, prompts, width)


def zero_streaks(rounds: pd.DataFrame, min_length: int = 2) -> pd.DataFrame:
    """:func:`mtpscope.traces.analysis.metrics.zero_acceptance_streaks` (longest first) with the streaks' positions on
    the timeline: start_seq / end_seq from ``rounds``' ``seq`` column (:func:`ordered_rounds`)."""
    from mtpscope.traces.analysis import metrics

    df = rounds if "seq" in rounds.columns else ordered_rounds(rounds)
    cols = ["prompt_id", "start_round", "end_round", "length", "start_seq", "end_seq"]
    if len(df) == 0:
        return pd.DataFrame(columns=cols)
    st = metrics.zero_acceptance_streaks(df, min_length=max(1, int(min_length)))
    if len(st) == 0:
        return pd.DataFrame({c: np.array([], dtype=np.int64) for c in cols})
    key = pd.Series(df["seq"].to_numpy(), index=pd.MultiIndex.from_arrays(
        [df["prompt_id"].to_numpy(dtype=np.int64), df["round"].to_numpy(dtype=np.int64)]))
    st = st.copy()
    st["start_seq"] = key.reindex(pd.MultiIndex.from_arrays([st["prompt_id"].to_numpy(dtype=np.int64),
                                                            st["start_round"].to_numpy(dtype=np.int64)])).to_numpy()
    st["end_seq"] = key.reindex(pd.MultiIndex.from_arrays([st["prompt_id"].to_numpy(dtype=np.int64),
                                                          st["end_round"].to_numpy(dtype=np.int64)])).to_numpy()
    return st[cols].reset_index(drop=True)


def rolling_acceptance(rounds: pd.DataFrame, window: int | None = None, max_points: int = 4000,
                       per_prompt: bool = False) -> pd.DataFrame:
    """Rolling acceptance rate (:func:`mtpscope.traces.analysis.metrics.rolling_acceptance`: accepted / drafted over
    the last ``window`` rounds, default :data:`mtpscope.traces.analysis.metrics.DEFAULT_ROLLING_WINDOW`) in
    :func:`ordered_rounds` order, subsampled to at most ``max_points`` points.

    ``per_prompt=False``: one window running over the whole trace (across prompt boundaries, as the
    report's rolling summary); ``per_prompt=True``: each prompt's own window, restarting at its first
    round (each prompt is its own curve).

    Returns columns seq, prompt_id, round, rolling_rate (NaN where nothing was drafted in the window),
    n_window (rounds the window holds so far: ``window`` once full) and full (``n_window == window``).
    """
    from mtpscope.traces.analysis import metrics

    w = max(1, int(window if window is not None else metrics.DEFAULT_ROLLING_WINDOW))
    df = rounds if "seq" in rounds.columns else ordered_rounds(rounds)
    cols = ["seq", "prompt_id", "round", "rolling_rate", "n_window", "full"]
    if len(df) == 0:
        return pd.DataFrame(columns=cols)
    r = metrics.rolling_acceptance(df, window=w, by_prompt=per_prompt)
    # metrics orders by (prompt_id, round) like ordered_rounds, so rows align with seq
    if per_prompt:
        pid = df["prompt_id"].to_numpy()
        start = np.ones(len(df), dtype=bool)
        start[1:] = pid[1:] != pid[:-1]
        first = np.maximum.accumulate(np.where(start, np.arange(len(df)), 0))
        n_in = np.arange(len(df)) - first + 1
    else:
        n_in = np.arange(len(df)) + 1
    n_in = np.minimum(n_in, w)
    idx = _subsample_index(len(df), max_points)
    return pd.DataFrame({"seq": df["seq"].to_numpy()[idx], "prompt_id": r["prompt_id"].to_numpy()[idx],
                         "round": r["round"].to_numpy()[idx], "rolling_rate": r["acceptance_rate"].to_numpy()[idx],
                         "n_window": n_in[idx], "full": n_in[idx] == w})


def _subsample_index(n: int, max_points: int) -> np.ndarray:
    if n <= max_points:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, max_points).round().astype(np.int64))


def binned_rounds(rounds: pd.DataFrame, max_bins: int = 2000) -> pd.DataFrame:
    """Aggregate ordered rounds into at most ``max_bins`` equal bins of consecutive rounds.

    Returns columns seq_start, seq_end (inclusive), prompt_id / round of the first round in the bin,
    n_rounds, mean_accepted (mean n_accepted), acceptance_rate (accepted / drafted in the bin),
    n_zero (rounds with n_accepted == 0 and n_draft > 0). Vectorised (np.add.reduceat).
    """
    df = rounds if "seq" in rounds.columns else ordered_rounds(rounds)
    n = len(df)
    cols = ["seq_start", "seq_end", "prompt_id", "round", "n_rounds", "mean_accepted", "acceptance_rate", "n_zero"]
    if n == 0:
        return pd.DataFrame(columns=cols)
    size = max(1, -(-n // max(1, max_bins)))
    starts = np.arange(0, n, size)
    ends = np.minimum(starts + size, n) - 1
    acc = df["n_accepted"].to_numpy(dtype=np.int64)
    dr = df["n_draft"].to_numpy(dtype=np.int64)
    zero = ((acc == 0) & (dr > 0)).astype(np.int64)
    s_acc = np.add.reduceat(acc, starts)
    s_dr = np.add.reduceat(dr, starts)
    s_zero = np.add.reduceat(zero, starts)
    cnt = ends - starts + 1
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(s_dr > 0, s_acc / np.where(s_dr > 0, s_dr, 1), np.nan)
    seq = df["seq"].to_numpy()
    return pd.DataFrame({"seq_start": seq[starts], "seq_end": seq[ends],
                         "prompt_id": df["prompt_id"].to_numpy()[starts], "round": df["round"].to_numpy()[starts],
                         "n_rounds": cnt, "mean_accepted": s_acc / cnt, "acceptance_rate": rate, "n_zero": s_zero})


# ---------------------------------------------------------------------------------------- compare

def prompt_deltas(table_a: pd.DataFrame, table_b: pd.DataFrame,
                  pairs: Sequence[tuple[int, int]] | None = None) -> pd.DataFrame:
    """Join two :func:`per_prompt_table` results: rates a / b and delta (b − a), sorted by delta
    ascending (biggest drop first). ``pairs``: (prompt_id in A, prompt_id in B) as
    :func:`mtpscope.traces.analysis.align.pair_prompts` pairs them (by id, text or prompt_id); without it prompts
    are joined on prompt_id. The result's prompt_id is A's."""
    a = table_a.set_index("prompt_id")[["acceptance_rate", "mean_acceptance_length"]]
    b = table_b.set_index("prompt_id")[["acceptance_rate", "mean_acceptance_length"]]
    if pairs is not None:
        to_a = {int(pb_): int(pa_) for pa_, pb_ in pairs}
        b = b[b.index.isin(list(to_a))]
        b.index = [to_a[int(i)] for i in b.index]
        b.index.name = "prompt_id"
        a = a[a.index.isin([int(pa_) for pa_, _ in pairs])]
    j = a.merge(b, left_index=True, right_index=True, how="outer", suffixes=("_a", "_b"))
    j["delta_rate"] = j["acceptance_rate_b"] - j["acceptance_rate_a"]
    j["delta_length"] = j["mean_acceptance_length_b"] - j["mean_acceptance_length_a"]
    return j.reset_index().sort_values("delta_rate", kind="stable", na_position="last").reset_index(drop=True)


#: the rate columns of :func:`prompt_deltas` and how the Compare page shows them (:func:`as_percent_columns`):
#: acceptance rates as ``34.8 %``, their change in points
DELTA_RATE_COLUMNS = {"acceptance_rate_a": "%.1f %%", "acceptance_rate_b": "%.1f %%", "delta_rate": "%+.1f points"}


def as_percent_columns(df: pd.DataFrame, cols: Mapping[str, str]) -> pd.DataFrame:
    """``df`` with the rate columns ``cols`` (fractions 0..1, or their differences) times 100, for a table whose
    column formats (``cols``' values, printf style) print them as ``34.8 %`` / ``+2.0 points``, as the page's
    metrics do (:func:`mtpscope.app.formats.percent`, :func:`~mtpscope.app.formats.points`)."""
    out = df.copy()
    for c in cols:
        if c in out.columns:
            out[c] = out[c] * 100.0
    return out


def paired_delta_help(d: RateDelta | None, names: Sequence[str], *, n_pairs: int) -> str:
    """The help of Compare's "acceptance-rate delta over the paired prompts": its own two rates (the paired prompts'
    rounds only, so it may differ from the difference of the two overall rates beside it) and its 95 % bootstrap
    interval in points."""
    if d is None:
        return f"no paired prompt drafted a token ({wording.plural(n_pairs, 'paired prompt')})"
    interval = (f"[{points(d.ci_low)}, {points(d.ci_high)}]" if d.ci_low is not None and d.ci_high is not None
                else "none: fewer than 2 prompts")
    return (f"{names[0]} {percent(d.rate_a)} → {names[1]} {percent(d.rate_b)} over the rounds of the "
            f"{wording.plural(d.n_prompts, 'paired prompt')} (the acceptance rates above cover every prompt of each "
            f"trace); 95 % bootstrap interval over prompts: {interval}")


def signed_or_none(x: Any, digits: int = 3) -> str | None:
    """``x`` signed with ``digits`` decimals (``+0.125``) for a metric's delta; None (no delta shown) when ``x`` is
    missing (None or NaN)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return f"{float(x):+.{digits}f}"


# ------------------------------------------------------------------------------------------ advice

def recommendation_label(rec: Recommendation | None) -> str:
    """A :class:`~mtpscope.traces.analysis.advice.Recommendation` in two or three words: ``plain decoding``,
    ``n_draft 3``, ``q8 n_draft 3``, ``… (a tie with plain decoding)`` / ``… (a tie with n_draft 2)`` (what the
    choice is tied with: the runner-up; ``… (a tie)`` when it is not known); ``—`` without one, ``too few
    rounds`` below the minimum, ``cannot tell (timings disturbed)`` when the timing-quality check withheld it
    (``cannot_tell``)."""
    if rec is None:
        return "—"
    c = rec.choice
    if c is None:
        if rec.cannot_tell:
            return "cannot tell (timings disturbed)"
        return "too few rounds" if "too few" in (rec.reason or "") else "—"
    who = f"{rec.assistant} " if rec.assistant else ""
    label = "plain decoding" if c == "plain" else f"{who}n_draft {c}"
    if not rec.tie:
        return label
    other = rec.runner_up
    return label + (" (a tie)" if other is None else " (a tie with plain decoding)" if other == "plain"
                    else f" (a tie with n_draft {other})")


def _iv(v) -> str:
    return "" if not v else f"{v[0]:.3g} – {v[1]:.3g}"


def _fin(v: float | None) -> float | None:
    """None for a missing, NaN or infinite value (as the JSON carries it)."""
    return None if v is None or not math.isfinite(v) else float(v)


def what_if_table(rows: Sequence[WhatIfRow]) -> pd.DataFrame:
    """The what-if rows (``WhatIf.rows``) as a table: each value with its 95 % interval."""
    out = []
    for r in rows:
        out.append({"n_draft": r.n_draft,
                    "acceptance rate": _fin(r.acceptance_rate),
                    "acceptance rate 95 %": _iv(r.acceptance_rate_interval),
                    "mean acceptance length": _fin(r.mean_acceptance_length),
                    "mean acceptance length 95 %": _iv(r.mean_acceptance_length_interval),
                    "tokens/s": _fin(r.tokens_per_s), "tokens/s 95 %": _iv(r.tokens_per_s_interval),
                    "speedup": _fin(r.speedup), "speedup 95 %": _iv(r.speedup_interval),
                    "n_draft is": "recorded" if r.recorded else ("extrapolated" if r.extrapolated else "estimated")})
    return pd.DataFrame(out)


def recommendation_table(by_category: Mapping[str, Recommendation]) -> pd.DataFrame:
    """Per-category recommendations (``Advice.by_category``): category, choice, speedup and its interval, tie,
    and the short reason."""
    rows = []
    for cat, r in by_category.items():
        rows.append({"category": cat, "recommendation": recommendation_label(r), "speedup": _fin(r.speedup),
                     "interval": _iv(r.interval), "tie": bool(r.tie), "why": r.headline or r.reason})
    return pd.DataFrame(rows, columns=["category", "recommendation", "speedup", "interval", "tie", "why"])


def break_even_table(by_category: Mapping[str, BreakEven]) -> pd.DataFrame:
    """Per-category break-even (``Advice.break_even_by_category``): the n_draft closest to paying, the draft
    cost ratio now and needed, the mean acceptance length now and needed, whether MTP pays."""
    rows = []
    for cat, b in by_category.items():
        rows.append({"category": cat, "n_draft": b.n_draft, "draft step / plain decode": _fin(b.draft_cost_ratio),
                     "needed below": _fin(b.draft_cost_ratio_needed),
                     "mean acc. length": _fin(b.mean_acceptance_length),
                     "needed": _fin(b.mean_acceptance_length_needed),
                     "with a flat verify: draft step needed below": _fin(b.flat_verify_draft_cost_ratio_needed),
                     "pays": bool(b.pays)})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------ sweep: drafter quantizations (--assistant-quant)

#: what the Sweep page's quantization table shows per type x category: label -> column of
#: :func:`mtpscope.traces.sweep.quant.quant_table` and its format
QUANT_VALUES = {"acceptance rate": ("acceptance_rate", "{:.1%}"),
                "mean acceptance length": ("mean_acceptance_length", "{:.3f}"),
                "tokens/s": ("tokens_per_s", "{:.1f}"), "speedup": ("speedup", "{:.3f}")}


def quant_matrix(quant: pd.DataFrame, value: str) -> pd.DataFrame:
    """The quantization table of a sweep (:func:`mtpscope.traces.sweep.quant.quant_table`) as one row per
    llama.cpp type (``q4_k_m``; ``q4_k_m n_draft 3`` when the sweep has several n_draft values) and one
    column per category (``all`` first), each cell ``value`` (a key of :data:`QUANT_VALUES`) as text,
    with the interval ``[lo, hi]`` where the table has one; a first column ``size MiB`` (the quantized
    file). Empty frame for an empty table.

    Raises:
        KeyError: an unknown ``value``.
    """
    col, fmt = QUANT_VALUES[value]
    if quant is None or len(quant) == 0:
        return pd.DataFrame()
    several = quant["n_draft"].nunique() > 1
    rows: dict[str, dict[str, str]] = {}
    for r in quant.to_dict("records"):
        label = f"{r['qtype']} n_draft {int(r['n_draft'])}" if several else str(r["qtype"])
        row = rows.setdefault(label, {"size MiB": f"{float(r['n_bytes']) / (1024 * 1024):.1f}"})
        v, lo, hi = r.get(col), r.get(f"{col}_lo"), r.get(f"{col}_hi")
        text = "-" if v is None or is_null(v) else fmt.format(float(v))
        if not is_null(v) and lo is not None and hi is not None and not (is_null(lo) or is_null(hi)):
            text += f" [{fmt.format(float(lo))}, {fmt.format(float(hi))}]"
        row[str(r["category"])] = text
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "type"
    return out.fillna("-")
