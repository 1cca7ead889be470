"""Pure plotly figure builders for the app (no Streamlit import; tests call them directly).

Every builder takes small, already-prepared data (see app/views.py, round_views.py, model_views.py) and
returns a ``plotly.graph_objects.Figure``. Sizes are bounded here too: the timeline draws one mark per round
only up to ``max_marks`` rounds (WebGL beyond ``svg_limit``) and aggregates longer traces into bins;
heatmaps are block-averaged to a few hundred cells a side; histograms are computed with numpy and
sent as bars, never as raw values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from mtpscope.app import model_views, round_views, views
from mtpscope.traces.analysis import rates
from mtpscope.traces.analysis.explain import NEAR_TIE_GAP
from mtpscope.traces.analysis.ordering import worst_first_key
from mtpscope.traces.analysis.records import finite as _finite
from mtpscope.traces.analysis.wording import beside

if TYPE_CHECKING:
    from mtpscope.traces.analysis.align import OneSided, RateDelta
    from mtpscope.traces.analysis.breakdown import Acceptance, CategoryAcceptance, PositionAcceptance
    from mtpscope.traces.analysis.drift import Drift
    from mtpscope.traces.analysis.explain import PositionRejections
    from mtpscope.traces.analysis.what_if import WhatIfRow
    from mtpscope.traces.diagnose.records import VariantRow

#: Accepted-length colours, 0 (red) … K (green).
ACCEPT_SCALE = [[0.0, "#d62728"], [0.34, "#ff7f0e"], [0.67, "#bcbd22"], [1.0, "#2ca02c"]]
STATUS_COLORS = {"present": "#2ca02c", "missing": "#d62728", "wrong shape": "#ff7f0e"}
TIMELINE_MAX_MARKS = 3000
TIMELINE_SVG_LIMIT = 1500
MAX_STREAK_SHAPES = 40
#: Every figure's template, made plotly's default once here: a template given to each figure is validated and
#: deep-copied again every time (20-60 ms a figure, most of a page's figure building), the default is not.
TEMPLATE = "plotly_white"
pio.templates.default = TEMPLATE


def _layout(fig: go.Figure, title: str, height: int = 360, **kw) -> go.Figure:
    kw.setdefault("margin", dict(l=50, r=20, t=50, b=40))
    fig.update_layout(title=title, height=height, **kw)  # template: the default (TEMPLATE)
    return fig


def empty_figure(message: str, height: int = 200) -> go.Figure:
    """A blank figure carrying one centred message."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, "", height=height)


# ------------------------------------------------------------------------------------ acceptance

def timeline_figure(rounds: pd.DataFrame, decode: views.Decode | None = None, *,
                    max_marks: int = TIMELINE_MAX_MARKS, svg_limit: int = TIMELINE_SVG_LIMIT,
                    max_bins: int = 2000, min_streak: int = 2, title: str = "Acceptance timeline",
                    highlight: tuple[int, int] | None = None, labels: dict[int, str] | None = None) -> go.Figure:
    """The acceptance timeline.

    Args:
        rounds: rounds in timeline order with a ``seq`` column (:func:`mtpscope.app.views.ordered_rounds`):
            prompt_id, round, n_draft, n_accepted, drafted, target.
        decode: token id → display text for the hover boxes (drafted vs target).
        max_marks: up to this many rounds one clickable mark per round (y = accepted length, colour =
            share of the round's drafts accepted, n_accepted / n_draft, so 2 of 2 is as green as 3 of
            3; customdata = [prompt_id, round, seq]); rounds that drafted nothing are a second trace of
            grey hollow marks (name ``drafted nothing``), never a red zero. Beyond ``max_marks`` the
            rounds are aggregated into at most ``max_bins`` bins (y = mean accepted length per bin,
            colour = the bin's acceptance rate, customdata = the bin's first round).
        svg_limit: above this many marks use WebGL (``Scattergl``).
        min_streak: zero-acceptance runs of at least this many rounds are shaded (longest
            :data:`MAX_STREAK_SHAPES` only).
        highlight: (first seq, last seq) of a window to outline (the detail window on the overview).
        labels: prompt_id → prompt label (``prompt 3 “text…”``) for the hover boxes and the prompt
            boundaries (each prompt's start is a dotted line labelled with its prompt, up to 60).

    Returns:
        The figure; ``fig.layout.meta`` is ``{"mode": "marks" | "bins", "n_rounds": n, "n_zero_draft": …,
        "n_streaks_shaded": …}``.
    """
    n = len(rounds)
    if n == 0:
        return empty_figure("no rounds in this selection")
    labels = labels or {}
    kmax = int(max(1, rounds["n_draft"].max()))
    nd = rounds["n_draft"].to_numpy(dtype=np.int64)
    na = rounds["n_accepted"].to_numpy(dtype=np.int64)
    zero_draft = nd == 0
    n_zero_draft = int(zero_draft.sum())
    if n <= max_marks:
        hover = np.asarray(round_views.round_hover(rounds, decode, labels=labels), dtype=object)
        cls = go.Scattergl if n > svg_limit else go.Scatter
        custom = np.stack([rounds["prompt_id"].to_numpy(), rounds["round"].to_numpy(),
                           rounds["seq"].to_numpy()], axis=1)
        drew = ~zero_draft
        share = rates.acceptance_rates(na, nd)          # each round's own (NaN where it drafted nothing)
        size = 9 if n <= 300 else 6
        traces = [cls(
            x=rounds["seq"].to_numpy()[drew], y=na[drew], mode="markers",
            marker=dict(size=size, color=share[drew], colorscale=ACCEPT_SCALE, cmin=0, cmax=1,
                        line=dict(width=0.5, color="#444"),
                        colorbar=dict(title="share<br>accepted", thickness=12, tickformat=".0%")),
            customdata=custom[drew], hovertext=hover[drew], hoverinfo="text", name="round that drafted",
        )]
        if n_zero_draft:
            traces.append(cls(
                x=rounds["seq"].to_numpy()[zero_draft], y=np.zeros(n_zero_draft), mode="markers",
                marker=dict(size=size, symbol="circle-open", color="#888", line=dict(width=1.5, color="#888")),
                customdata=custom[zero_draft], hovertext=hover[zero_draft], hoverinfo="text",
                name="drafted nothing"))
        fig = go.Figure(traces)
        mode = "marks"
    else:
        b = views.binned_rounds(rounds, max_bins=max_bins)
        bin_hover = [f"rounds {s}–{e} (from {views.esc(labels.get(int(p), f'prompt {p}'))} · round {r})<br>"
                 f"mean accepted {m:.2f}<br>acceptance rate {'—' if np.isnan(a) else f'{a:.1%}'}<br>"
                 f"zero-acceptance rounds {z}"
                 for s, e, p, r, m, a, z in zip(b["seq_start"], b["seq_end"], b["prompt_id"], b["round"],
                                                 b["mean_accepted"], b["acceptance_rate"], b["n_zero"])]
        fig = go.Figure(go.Scattergl(
            x=b["seq_start"], y=b["mean_accepted"], mode="markers+lines",
            marker=dict(size=4, color=b["acceptance_rate"], colorscale=ACCEPT_SCALE, cmin=0, cmax=1,
                        colorbar=dict(title="acceptance<br>rate", thickness=12, tickformat=".0%")),
            line=dict(width=1, color="#888"),
            customdata=np.stack([b["prompt_id"].to_numpy(), b["round"].to_numpy(), b["seq_start"].to_numpy()], axis=1),
            hovertext=bin_hover, hoverinfo="text", name="bin",
        ))
        mode = "bins"
    # Shapes are built as plain dicts and set once: plotly's add_vrect / add_vline re-validate the
    # whole shape list on every call (seconds for a hundred shapes).
    shapes: list[dict] = []
    annotations: list[dict] = []
    streaks = views.zero_streaks(rounds, min_length=min_streak).head(MAX_STREAK_SHAPES)
    s: Any  # itertuples() yields namedtuples; pandas-stubs types them as plain tuples
    for s in streaks.itertuples(index=False):
        shapes.append(dict(type="rect", xref="x", yref="paper", x0=float(s.start_seq) - 0.5,
                           x1=float(s.end_seq) + 0.5, y0=0, y1=1, fillcolor="#d62728", opacity=0.12,
                           line_width=0, layer="below"))
    # prompt boundaries, each labelled with its prompt
    first = rounds["prompt_id"].to_numpy()
    starts = np.concatenate([[0], np.flatnonzero(first[1:] != first[:-1]) + 1]) if len(first) else np.zeros(0, np.int64)
    if len(starts) <= 60:
        seq = rounds["seq"].to_numpy()
        for j, i in enumerate(starts):
            if j:
                shapes.append(dict(type="line", xref="x", yref="paper", x0=float(seq[i]) - 0.5, x1=float(seq[i]) - 0.5,
                                   y0=0, y1=1, line=dict(width=1, dash="dot", color="#999")))
            if len(starts) > 1 or labels:
                pid = int(first[i])
                annotations.append(dict(x=float(seq[i]) - 0.5, y=1.0, xref="x", yref="paper", xanchor="left",
                                        yanchor="bottom", showarrow=False, textangle=0,
                                        text=views.esc(labels.get(pid, f"prompt {pid}")), font=dict(size=10, color="#555"),
                                        hovertext=views.esc(labels.get(pid, f"prompt {pid}"))))
    if highlight is not None:
        shapes.append(dict(type="rect", xref="x", yref="paper", x0=float(highlight[0]) - 0.5,
                           x1=float(highlight[1]) + 0.5, y0=0, y1=1, fillcolor="#1f77b4", opacity=0.15,
                           line=dict(width=1, color="#1f77b4"), layer="below"))
    fig.update_layout(shapes=shapes, annotations=_stagger(annotations))
    _layout(fig, title, height=360, clickmode="event+select", dragmode="zoom",
            showlegend=mode == "marks" and n_zero_draft > 0,
            legend=dict(orientation="h", yanchor="top", y=-0.18, x=0),
            margin=dict(l=50, r=20, t=80, b=40),
            meta={"mode": mode, "n_rounds": n, "n_zero_draft": n_zero_draft, "n_streaks_shaded": len(streaks)})
    fig.update_xaxes(title="round (in prompt order)")
    fig.update_yaxes(title="accepted drafts" if mode == "marks" else "mean accepted drafts",
                     range=[-0.3, kmax + 0.3], dtick=1 if mode == "marks" else None)
    return fig


def _stagger(annotations: list[dict], levels: int = 3) -> list[dict]:
    """Prompt labels on up to ``levels`` rows (by yshift) so neighbouring labels do not sit on each other."""
    for i, a in enumerate(annotations):
        a["yshift"] = 14 * (i % levels) if len(annotations) > 1 else 0
    return annotations


def per_position_figure(per_pos: pd.DataFrame, other: pd.DataFrame | None = None,
                        names: tuple[str, str] = ("A", "B"), title: str = "Per-position acceptance") -> go.Figure:
    """Bars of P(draft k accepted) for k = 1..K (columns k, acceptance as in
    :func:`mtpscope.traces.analysis.metrics.per_position_acceptance`); a second table adds a second series (Compare)."""
    if per_pos is None or len(per_pos) == 0:
        return empty_figure("no drafted tokens")
    fig = go.Figure()
    fig.add_bar(x=per_pos["k"], y=per_pos["acceptance"], name=names[0] if other is not None else "acceptance",
                text=[f"{v:.1%}" for v in per_pos["acceptance"].fillna(0)], textposition="outside")
    if other is not None and len(other):
        fig.add_bar(x=other["k"], y=other["acceptance"], name=names[1],
                    text=[f"{v:.1%}" for v in other["acceptance"].fillna(0)], textposition="outside")
    _layout(fig, title, height=300, barmode="group", showlegend=other is not None)
    fig.update_xaxes(title="draft position k", dtick=1)
    fig.update_yaxes(title="P(accepted)", range=[0, 1.1], tickformat=".0%")
    return fig


#: Most prompts drawn as their own curve on the per-prompt rolling chart (the worst first).
ROLLING_MAX_PROMPTS = 12


def rolling_figure(rolling: pd.DataFrame, overall: float | None = None, window: int = 32,
                   other: pd.DataFrame | None = None, names: tuple[str, str] = ("A", "B"),
                   labels: dict[int, str] | None = None, per_prompt: bool = False) -> go.Figure:
    """Rolling acceptance rate (:func:`mtpscope.app.views.rolling_acceptance`: columns seq, prompt_id,
    round, rolling_rate, full) with the overall rate as a dashed line.

    Across the trace (``per_prompt`` False): one curve over ``seq``; where the window is still filling
    (the first ``window - 1`` rounds) it is dotted. Per prompt: one curve per prompt over the round
    within the prompt, named by ``labels[prompt_id]`` (at most :data:`ROLLING_MAX_PROMPTS`, in the
    order given), dotted where that prompt's window is still filling. ``other``: a second trace's
    curve (Compare), across the trace."""
    if rolling is None or len(rolling) == 0:
        return empty_figure("no rounds")
    labels = labels or {}
    fig = go.Figure()

    def add(df: pd.DataFrame, x: str, name: str, color: str | None, group: str) -> None:
        full = df["full"].to_numpy(dtype=bool) if "full" in df.columns else np.ones(len(df), dtype=bool)
        y_full = np.where(full, df["rolling_rate"].to_numpy(dtype=float), np.nan)
        # the filling part, joined to the first full point so the curve is continuous
        fill = ~full
        if fill.any() and full.any():
            fill[np.argmax(full)] = True
        y_fill = np.where(fill, df["rolling_rate"].to_numpy(dtype=float), np.nan)
        line = dict(color=color) if color else {}
        if fill.any():
            fig.add_trace(go.Scatter(x=df[x], y=y_fill, mode="lines", name=f"{name} (window still filling)",
                                     line=dict(dash="dot", width=1, **line), legendgroup=group, showlegend=False,
                                     hovertemplate="%{y:.1%} (fewer rounds than the window so far)<extra>" + name + "</extra>"))
        fig.add_trace(go.Scatter(x=df[x], y=y_full, mode="lines", name=name, line=dict(width=2, **line),
                                 legendgroup=group, hovertemplate="%{y:.1%}<extra>" + name + "</extra>"))

    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf"]
    if per_prompt:
        pids = list(dict.fromkeys(int(p) for p in rolling["prompt_id"]))[:ROLLING_MAX_PROMPTS]
        for i, pid in enumerate(pids):
            sub = rolling[rolling["prompt_id"] == pid]
            add(sub, "round", labels.get(pid, f"prompt {pid}"), palette[i % len(palette)], f"p{pid}")
        xtitle = "round within the prompt"
    else:
        add(rolling, "seq", names[0] if other is not None else f"rolling ({window} rounds)", palette[0], "a")
        if other is not None and len(other):
            add(other, "seq", names[1], palette[1], "b")
        xtitle = "round (in prompt order, window running across prompts)"
    if overall is not None and np.isfinite(overall):
        fig.add_hline(y=overall, line_dash="dash", line_color="#555",
                      annotation_text=f"overall {overall:.1%}", annotation_position="top left")
    where = "per prompt" if per_prompt else "across the trace"
    _layout(fig, f"Rolling acceptance rate (window {window} rounds, {where})", height=300,
            showlegend=per_prompt or other is not None,
            legend=dict(orientation="h", yanchor="top", y=-0.2, x=0))
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%", title="acceptance rate")
    fig.update_xaxes(title=xtitle)
    return fig


def accepted_length_histogram(rounds: pd.DataFrame) -> go.Figure:
    """Distribution of accepted length per round (0..K)."""
    if len(rounds) == 0:
        return empty_figure("no rounds")
    counts = rounds["n_accepted"].value_counts().sort_index()
    fig = go.Figure(go.Bar(x=counts.index, y=counts.values, marker_color="#1f77b4"))
    _layout(fig, "Accepted length per round", height=260)
    fig.update_xaxes(title="accepted drafts", dtick=1)
    fig.update_yaxes(title="rounds")
    return fig


# ---------------------------------------------------------------------------------------- step

def top_candidates_figure(top: pd.DataFrame, k: int, title: str | None = None) -> go.Figure:
    """Horizontal bars of one step's top candidates (logits; :func:`mtpscope.app.round_views.top_candidates`),
    the draft blue and the target's token green. The target's bar is always there: when its token is
    past the stored top candidates its logit is not in the trace, so its bar is drawn hatched up to the
    last stored logit (an upper bound) and labelled with its rank."""
    if top is None or len(top) == 0:
        return empty_figure(f"step {k}: no top candidates stored", height=160)
    stored = top["stored"].to_numpy(dtype=bool) if "stored" in top.columns else np.ones(len(top), dtype=bool)
    colors = ["#2ca02c" if t else ("#1f77b4" if d else "#aaaaaa")
              for d, t in zip(top["is_draft"], top["is_target"])]

    def rank_text(r) -> str:
        return "?" if r is None or r is pd.NA or (isinstance(r, float) and np.isnan(r)) else str(int(r))

    labels = [f"{rank_text(r)}. {views.esc(t)}" for r, t in zip(top["rank"], top["text"])]
    x = top["logit"].to_numpy(dtype=float).copy()
    bound = top["logit_bound"].to_numpy(dtype=float) if "logit_bound" in top.columns else np.full(len(top), np.nan)
    x[~stored] = bound[~stored]
    hover = []
    for i, (tid, r) in enumerate(zip(top["id"], top["rank"])):
        if stored[i]:
            hover.append(f"id {tid} · rank {rank_text(r)} · logit {x[i]:.3f}")
        else:
            b = "" if np.isnan(bound[i]) else f" (at most {bound[i]:.3f})"
            hover.append(f"id {tid} · the target's token, rank {rank_text(r)} under the drafter: past the stored "
                         f"top {int(stored.sum())}, its logit is not in the trace{b}")
    lo, hi = logit_axis_range(x)
    ends = np.where(np.isfinite(x), x, lo)
    # each bar runs from the axis' left end (base) to its logit: the axis does not start at 0, so a gap of a
    # fraction of a logit between the drafted token and the target's is as wide as it is on the axis
    fig = go.Figure(go.Bar(x=ends - lo, base=[lo] * len(ends), y=labels, orientation="h", marker_color=colors,
                           marker_pattern_shape=["" if s else "/" for s in stored],
                           hovertext=hover, hoverinfo="text"))
    tgt = np.flatnonzero(top["is_target"].to_numpy(dtype=bool) & stored)
    drf = np.flatnonzero(top["is_draft"].to_numpy(dtype=bool) & stored)
    gap = None
    if len(tgt) and len(drf) and tgt[0] != drf[0] and np.isfinite(x[tgt[0]]) and np.isfinite(x[drf[0]]):
        gap = float(x[drf[0]] - x[tgt[0]])
        fig.add_annotation(x=float(x[tgt[0]]), y=labels[int(tgt[0])], xanchor="left", showarrow=False,
                           text=f" {beside(gap, NEAR_TIE_GAP)} logits behind the draft", font=dict(size=11))
    _layout(fig, title or f"k={k} · green = target, blue = drafted", height=max(160, 26 * len(top) + 70),
            meta={"target_rows": [int(i) for i in np.flatnonzero(top["is_target"].to_numpy(dtype=bool))],
                  "unstored_rows": [int(i) for i in np.flatnonzero(~stored)], "gap": gap})
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title="drafter's logit", range=[lo, hi])
    return fig


def logit_axis_range(logits: Any, margin: float = 0.15, min_span: float = 0.5) -> tuple[float, float]:
    """The x range of a top-candidates chart (:func:`top_candidates_figure`): from just below the lowest
    finite logit to just above the highest, ``margin`` of their span added on each side (the span at least
    ``min_span`` logits, so one bar or equal logits still get a readable axis). Not from 0: logits of 12 and
    11.2 would otherwise draw two bars of nearly one length, the 0.8-logit gap that decided a rejection
    invisible. No finite logit: ``(0, 1)``."""
    v = np.asarray(logits, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return 0.0, 1.0
    a, b = float(v.min()), float(v.max())
    span = max(b - a, min_span)
    mid = (a + b) / 2 if b - a < min_span else None
    if mid is not None:
        a, b = mid - span / 2, mid + span / 2
    return a - margin * span, b + margin * span


#: One line each on what the stored hidden states are (docs/TRACE_FORMAT.md).
HIDDEN_MEANING = {
    "h": "h — the hidden state fed to this step: the target's last hidden state at k=1, the previous step's "
         "h_next after that (width n_embd_backbone).",
    "h_next": "h_next — what this step hands on: its output after the post-projection, fed to the next step "
              "(width n_embd_backbone).",
    "h_inner": "h_inner — the drafter's final-norm output before that projection; the logits are computed from "
               "it (width n_embd).",
}


def hidden_norms_figure(norms: pd.DataFrame) -> go.Figure:
    """L2 norms of the stored hidden states per draft step (columns k and one per hidden name), one
    panel per hidden state so no line hides another."""
    if norms is None or len(norms) == 0 or len(norms.columns) <= 1:
        return empty_figure("no hidden states stored in this trace", height=160)
    from plotly.subplots import make_subplots

    cols = [c for c in norms.columns if c != "k"]
    fig = make_subplots(rows=1, cols=len(cols), shared_xaxes=True, subplot_titles=[f"‖{c}‖" for c in cols],
                        horizontal_spacing=0.08)
    for i, col in enumerate(cols):
        fig.add_trace(go.Scatter(x=norms["k"], y=norms[col], mode="lines+markers", name=f"‖{col}‖",
                                 hovertemplate="k=%{x}: %{y:.3f}<extra>‖" + col + "‖</extra>"), row=1, col=i + 1)
        fig.update_xaxes(title="draft position k", dtick=1, row=1, col=i + 1)
    _layout(fig, "Hidden-state norms per draft step", height=280, showlegend=False)
    fig.update_yaxes(title="L2 norm", row=1, col=1)
    return fig


# --------------------------------------------------------------------------------------- explain

#: The rejection causes of the explanation layer (docs/EXPLAIN.md §1) in plain words.
CAUSE_WORDS = {"near_tie": "near tie", "runner_up": "runner-up", "in_top_k": "in the drafter's top list",
               "far_miss": "far miss", "unreachable": "unreachable (centroid head)",
               "after_eog": "after end of generation", "unknown": "unknown"}
CAUSE_COLOURS = {"near_tie": "#bcbd22", "runner_up": "#ff7f0e", "in_top_k": "#e377c2", "far_miss": "#d62728",
                 "unreachable": "#9467bd", "after_eog": "#7f7f7f", "unknown": "#c7c7c7"}


def causes_figure(causes: Mapping[str, int], title: str = "Why the first rejected draft of each round was rejected") -> go.Figure:
    """Bars of the rejection causes (``Rejections.causes``: cause → count), with each cause's share."""
    items = [(c, int(v)) for c, v in (causes or {}).items() if v]
    if not items:
        return empty_figure("no rejected drafts with a known target token")
    total = sum(v for _, v in items)
    items.sort(key=lambda cv: -cv[1])
    fig = go.Figure(go.Bar(x=[CAUSE_WORDS.get(c, c) for c, _ in items], y=[v for _, v in items],
                           marker_color=[CAUSE_COLOURS.get(c, "#888") for c, _ in items],
                           text=[f"{v} ({v / total:.0%})" for _, v in items], textposition="outside",
                           hovertemplate="%{x}: %{y} rounds<extra></extra>"))
    _layout(fig, title, height=300, meta={"counts": dict(items)})
    fig.update_yaxes(title="rounds", rangemode="tozero")
    return fig


def rank_histogram_figure(hist: Mapping[str, int], title: str = "The target token's rank under the drafter") -> go.Figure:
    """Bars of ``Rejections.rank_histogram`` (rank bin "0".."9", "10+" → count): where the target's
    token stood in the drafter's list at each round's first mismatch (0 = the drafter's own choice)."""
    if not hist or not any(hist.values()):
        return empty_figure("no ranks known")
    keys = list(hist)
    fig = go.Figure(go.Bar(x=keys, y=[int(hist[k]) for k in keys], marker_color="#1f77b4",
                           hovertemplate="rank %{x}: %{y} rounds<extra></extra>"))
    _layout(fig, title, height=300)
    fig.update_xaxes(title="rank of the target's token (0 = the drafter's choice, 1 = runner-up)", type="category")
    fig.update_yaxes(title="rounds")
    return fig


def causes_by_position_figure(by_position: Sequence[PositionRejections], title: str = "Causes by draft position"
                              ) -> go.Figure:
    """Stacked bars: for each draft position k of the first mismatch, its causes (``Rejections.by_position``)."""
    rows = [p for p in (by_position or ()) if p.n]
    if not rows:
        return empty_figure("no rejected drafts")
    fig = go.Figure()
    causes = list(CAUSE_WORDS)
    for c in causes:
        y = [int(p.causes.get(c, 0)) for p in rows]
        if any(y):
            fig.add_bar(x=[f"k={p.k}" for p in rows], y=y, name=CAUSE_WORDS[c], marker_color=CAUSE_COLOURS[c])
    _layout(fig, title, height=300, barmode="stack", legend=dict(orientation="h", yanchor="top", y=-0.2, x=0))
    fig.update_yaxes(title="rounds")
    return fig


def rate_bars_figure(groups: Mapping[str, Acceptance | CategoryAcceptance] | None, title: str,
                     what: str = "class") -> go.Figure:
    """Acceptance rate per group (``{name: Acceptance}``: by class, channel or category), worst first, each
    bar labelled with accepted / drafted."""
    items = [(n, g) for n, g in (groups or {}).items() if g.n_drafted]
    if not items:
        return empty_figure(f"no drafted tokens by {what}")
    items.sort(key=lambda ng: (worst_first_key(ng[1].acceptance_rate), ng[0]))
    fig = go.Figure(go.Bar(x=[n for n, _ in items], y=[g.acceptance_rate for _, g in items], marker_color="#2ca02c",
                           text=[f"{g.n_accepted}/{g.n_drafted}" for _, g in items], textposition="outside",
                           hovertemplate="%{x}: %{y:.1%} of drafts accepted (%{text})<extra></extra>"))
    _layout(fig, title, height=300)
    fig.update_yaxes(title="acceptance rate", range=[0, 1.12], tickformat=".0%")
    fig.update_xaxes(title=what, type="category")
    return fig


def class_position_figure(by_class_position: Mapping[str, Sequence[PositionAcceptance]] | None,
                          title: str = "Acceptance by token class and draft position") -> go.Figure:
    """Heatmap class × draft position k of the acceptance rate (``Explanation.by_class_position``), each cell
    labelled with its rate and accepted / drafted; empty where nothing was drafted."""
    if not by_class_position:
        return empty_figure("token classes need the trace's vocabulary")
    classes = [c for c, rows in by_class_position.items() if any(r.n_drafted for r in rows)]
    if not classes:
        return empty_figure("no drafted tokens")
    ks = sorted({int(r.k) for c in classes for r in by_class_position[c]})
    z = np.full((len(classes), len(ks)), np.nan)
    text = [["" for _ in ks] for _ in classes]
    for i, c in enumerate(classes):
        for r in by_class_position[c]:
            j = ks.index(int(r.k))
            if r.n_drafted:
                z[i, j] = r.acceptance_rate
                text[i][j] = f"{r.acceptance_rate:.0%}<br>{r.n_accepted}/{r.n_drafted}"
    fig = go.Figure(go.Heatmap(z=z, x=[f"k={k}" for k in ks], y=classes, zmin=0, zmax=1, colorscale=ACCEPT_SCALE,
                               text=text, texttemplate="%{text}", hovertemplate="%{y} at %{x}: %{text}<extra></extra>",
                               colorbar=dict(title="acceptance", tickformat=".0%", thickness=12)))
    _layout(fig, title, height=max(220, 40 * len(classes) + 120))
    fig.update_yaxes(autorange="reversed")
    return fig


def drift_figure(drift: Drift | None, title: str = "How far the drafter's state drifts from the target's") -> go.Figure:
    """Per draft position k: mean cosine and mean relative error of the drafter's ``h_next`` against the
    target's own hidden state (``Drift.per_position``), one panel each."""
    if drift is None or not drift.per_position:
        return empty_figure("drift needs the target's hidden states (record --hidden-target)")
    from plotly.subplots import make_subplots

    pp = drift.per_position
    quant = drift.by_quantile
    fig = make_subplots(rows=1, cols=3 if quant else 2, horizontal_spacing=0.09)
    ks = [p.k for p in pp]
    rel = [p.rel_err_mean for p in pp]
    # trace 0: cosine, trace 1: relative error; then the cosine of accepted / rejected drafts
    fig.add_trace(go.Scatter(x=ks, y=[p.cos_mean for p in pp], mode="lines+markers", name="cosine, all"),
                  row=1, col=1)
    fig.add_trace(go.Scatter(x=ks, y=rel, mode="lines+markers", name="relative error"), row=1, col=2)
    for side, dash in (("accepted", "dot"), ("rejected", "dash")):
        ys = [p.cos_mean_accepted if side == "accepted" else p.cos_mean_rejected for p in pp]
        if any(y is not None for y in ys):
            fig.add_trace(go.Scatter(x=ks, y=ys, mode="lines+markers", name=f"cosine, {side}",
                                     line=dict(dash=dash)), row=1, col=1)
    fig.update_xaxes(title="draft position k", dtick=1, row=1, col=1)
    fig.update_xaxes(title="draft position k", dtick=1, row=1, col=2)
    # whole scales: a cosine is in [-1, 1]; a relative error of 1 is "as far as a zero vector"
    fig.update_yaxes(title="cosine (1 = same direction)", range=[-1.05, 1.05], row=1, col=1)
    top = max([1.5] + [1.1 * r for r in rel if r is not None])
    fig.update_yaxes(title="relative error", range=[0, top], row=1, col=2)
    if quant:
        fig.add_trace(go.Bar(x=[f"{q.cos_low:.2f}..{q.cos_high:.2f}" for q in quant],
                             y=[q.acceptance_rate for q in quant], name="acceptance by cosine quarter",
                             text=[f"{q.acceptance_rate:.0%} of {q.n_steps}" for q in quant],
                             textposition="outside"), row=1, col=3)
        fig.update_yaxes(title="acceptance rate", range=[0, 1.1], tickformat=".0%", row=1, col=3)
        fig.update_xaxes(title="cosine quarter (checked steps)", row=1, col=3)
    return _layout(fig, title, height=300, showlegend=False)


def what_if_figure(rows: Sequence[WhatIfRow] | None, best: int | None = None,
                   title: str = "Which n_draft? Estimated from this trace", plain: float | None = None) -> go.Figure:
    """The what-if estimate per n_draft (``WhatIf.rows``): acceptance rate and tokens per second (when
    the trace has timings) with their 95 % intervals as error bars, the recorded n_draft, the fastest
    one and plain decoding's tokens/s (``plain``, a horizontal line) marked."""
    if not rows:
        return empty_figure("nothing drafted: no estimate")
    from plotly.subplots import make_subplots

    n = [r.n_draft for r in rows]
    has_speed = any(_finite(r.tokens_per_s) is not None for r in rows)
    fig = make_subplots(rows=1, cols=2 if has_speed else 1, horizontal_spacing=0.12)
    sym = ["star" if r.recorded else ("circle-open" if r.extrapolated else "circle") for r in rows]

    def bars(vals: list[float | None], ivs: list[tuple[float, float] | None]) -> dict | None:
        if not any(ivs):
            return None
        return dict(type="data", symmetric=False,
                    array=[(iv[1] - v) if iv and v is not None else 0 for v, iv in zip(vals, ivs)],
                    arrayminus=[(v - iv[0]) if iv and v is not None else 0 for v, iv in zip(vals, ivs)])

    rate = [_finite(r.acceptance_rate) for r in rows]
    fig.add_trace(go.Scatter(x=n, y=rate, mode="lines+markers", marker=dict(symbol=sym, size=11),
                             name="acceptance rate", error_y=bars(rate, [r.acceptance_rate_interval for r in rows]),
                             hovertemplate="n_draft %{x}: %{y:.1%}<extra></extra>"), row=1, col=1)
    if has_speed:
        tps = [_finite(r.tokens_per_s) for r in rows]
        fig.add_trace(go.Scatter(x=n, y=tps, mode="lines+markers",
                                 marker=dict(symbol=sym, size=11), name="tokens/s",
                                 error_y=bars(tps, [r.tokens_per_s_interval for r in rows]),
                                 hovertemplate="n_draft %{x}: %{y:.1f} tokens/s<extra></extra>"), row=1, col=2)
        if best is not None:
            fig.add_vline(x=best, line_dash="dash", line_color="#2ca02c", row=1, col=2,
                          annotation_text=f"fastest: {best}", annotation_position="top")
        if plain is not None:
            fig.add_hline(y=plain, line_dash="dot", line_color="#d62728", row=1, col=2,
                          annotation_text="plain decoding", annotation_position="bottom right")
    fig.update_xaxes(title="n_draft", dtick=1)
    fig.update_yaxes(title="acceptance rate", tickformat=".0%", range=[0, 1.05], row=1, col=1)
    if has_speed:
        fig.update_yaxes(title="tokens per second", row=1, col=2)
    return _layout(fig, title, height=300, showlegend=False)


# ------------------------------------------------------------------------------------ generated text

STATUS_COLOURS = {"accepted": "#b7e4b0", "bonus": "#b9d3f0", "rejected": "#f4b6b0", "decode": "#f3e3b3",
                  "prefill": "#e0e0e0"}
CLASS_COLOURS = {"prose": "#e8e3d3", "code": "#cfe0f7", "json": "#f7dcc0", "number": "#e3d0f2",
                 "punctuation": "#d9d9d9", "whitespace": "#f2f2f2", "special": "#f6c7d6", "unknown": "#ffffff",
                 "": "#ffffff"}
TEXT_LINE_PX = 24


def text_figure(layout: pd.DataFrame, *, colour_by: str = "status", width: int = 100,
                highlight_round: int | None = None, title: str = "") -> go.Figure:
    """The generated-text view: every token of one prompt as a coloured box holding its text, line by
    line (:func:`mtpscope.app.round_views.generated_text`), clickable (customdata = [round, g, k]).

    ``colour_by="status"``: what produced the token (:data:`STATUS_COLOURS`: accepted draft, the
    target's bonus token, the target's correction at a first rejection, the prefill's token);
    ``"class"``: its token class (:data:`CLASS_COLOURS`). The tokens of ``highlight_round`` are
    outlined. One bar trace per colour (so the legend names them); ``fig.layout.meta`` is
    ``{"n_tokens", "n_lines", "colour_by"}``."""
    if layout is None or len(layout) == 0:
        return empty_figure("no generated text known for this prompt (rounds without emitted tokens)")
    key = "status" if colour_by == "status" else "cls"
    palette = STATUS_COLOURS if key == "status" else CLASS_COLOURS
    words = round_views.TEXT_STATUS_WORDS
    order = list(round_views.TEXT_STATUSES) if key == "status" else list(CLASS_COLOURS)
    fig = go.Figure()
    n_lines = int(layout["line"].max()) + 1
    for name in order:
        sub = layout[layout[key] == name]
        if not len(sub):
            continue
        hl = (sub["round"].to_numpy() == highlight_round) if highlight_round is not None else np.zeros(len(sub), bool)
        hover = [f"“{views.esc(t)}” · position {g} · {words.get(st_, st_)}<br>round {r}"
                 + (f" · draft k={k}" if k else "") + (f" · class {c}" if c else "") + "<br>click to open the round"
                 for t, g, st_, r, k, c in zip(sub["text"], sub["g"], sub["status"], sub["round"], sub["k"], sub["cls"])]
        fig.add_trace(go.Bar(
            x=sub["n_chars"], base=sub["col"], y=sub["line"], orientation="h", width=0.86,
            marker=dict(color=palette.get(name, "#ffffff"),
                        line=dict(width=np.where(hl, 2.5, 0.5).tolist(),
                                  color=np.where(hl, "#000000", "#ffffff").tolist())),
            text=[views.esc(t) for t in sub["text"]], textposition="inside", insidetextanchor="start",
            textangle=0, textfont=dict(family="DejaVu Sans Mono, monospace", size=13, color="#111"),
            cliponaxis=False, customdata=np.stack([sub["round"].to_numpy(), sub["g"].to_numpy(),
                                                   sub["k"].to_numpy()], axis=1),
            hovertext=hover, hoverinfo="text", name=words.get(name, name) if key == "status" else name))
    _layout(fig, title, height=max(140, TEXT_LINE_PX * n_lines + 110), barmode="overlay", bargap=0,
            clickmode="event+select", dragmode=False, uniformtext=dict(minsize=8, mode="show"),
            legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0), margin=dict(l=10, r=10, t=40, b=10),
            meta={"n_tokens": len(layout), "n_lines": n_lines, "colour_by": key})
    fig.update_xaxes(visible=False, range=[0, width])
    fig.update_yaxes(visible=False, autorange="reversed", range=None)
    return fig


# ---------------------------------------------------------------------------------------- tensors

def treemap_figure(inv: pd.DataFrame, title: str = "Bytes by component and type") -> go.Figure:
    """Treemap of bytes: file → component → ggml type (inventory table from
    :func:`mtpscope.app.model_views.inventory_frame`)."""
    if inv is None or len(inv) == 0:
        return empty_figure("no tensors")
    df = inv.assign(n_bytes=inv["n_bytes"].fillna(0).astype(np.int64))
    g = df.groupby(["component", "type"], sort=True).agg(n_bytes=("n_bytes", "sum"), n=("name", "size")).reset_index()
    comp = g.groupby("component", sort=True).agg(n_bytes=("n_bytes", "sum"), n=("n", "sum")).reset_index()
    total = int(comp["n_bytes"].sum())
    ids = ["all"] + [f"c/{c}" for c in comp["component"]] + [f"c/{c}/{t}" for c, t in zip(g["component"], g["type"])]
    labels = [f"all ({_human(total)})"] + list(comp["component"]) + list(g["type"])
    parents = [""] + ["all"] * len(comp) + [f"c/{c}" for c in g["component"]]
    values = [total] + comp["n_bytes"].tolist() + g["n_bytes"].tolist()
    counts = [int(comp["n"].sum())] + comp["n"].tolist() + g["n"].tolist()
    fig = go.Figure(go.Treemap(ids=ids, labels=labels, parents=parents, values=values, branchvalues="total",
                               customdata=[[_human(v), c] for v, c in zip(values, counts)],
                               hovertemplate="%{label}<br>%{customdata[0]} in %{customdata[1]} tensors<extra></extra>",
                               textinfo="label+percent root"))
    return _layout(fig, title, height=420, margin=dict(l=5, r=5, t=40, b=5))


def _human(n: float) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_bytes(n: float | None) -> str:
    """Bytes as text with binary units (``1.5 MiB``); ``?`` for None."""
    return "?" if n is None else _human(n)


def layer_grid_figure(grid: pd.DataFrame, title: str = "Layers × tensors") -> go.Figure:
    """Heatmap of present / missing / wrong-shape per layer and per-block tensor
    (:func:`mtpscope.app.model_views.layer_grid`). Empty cells: the name is neither in the file nor expected."""
    if grid is None or len(grid) == 0:
        return empty_figure("no per-layer (blk.N.*) tensors")
    codes = {"present": 0, "wrong shape": 1, "missing": 2}
    tensors = sorted(grid["tensor"].unique())
    layers = sorted(grid["layer"].unique())
    z = np.full((len(layers), len(tensors)), np.nan)
    text = [["" for _ in tensors] for _ in layers]
    li = {v: i for i, v in enumerate(layers)}
    ti = {v: i for i, v in enumerate(tensors)}
    r: Any  # itertuples() yields namedtuples; pandas-stubs types them as plain tuples
    for r in grid.itertuples(index=False):
        z[li[r.layer], ti[r.tensor]] = codes[r.status]
        text[li[r.layer]][ti[r.tensor]] = f"{r.name}: {r.status}"
    scale = [[0.0, STATUS_COLORS["present"]], [0.33, STATUS_COLORS["present"]],
             [0.34, STATUS_COLORS["wrong shape"]], [0.66, STATUS_COLORS["wrong shape"]],
             [0.67, STATUS_COLORS["missing"]], [1.0, STATUS_COLORS["missing"]]]
    fig = go.Figure(go.Heatmap(z=z, x=tensors, y=[f"blk.{v}" for v in layers], zmin=0, zmax=2,
                               colorscale=scale, xgap=2, ygap=2, hovertext=text, hoverinfo="text",
                               colorbar=dict(tickvals=[0.33, 1, 1.67], ticktext=["present", "wrong shape", "missing"],
                                             thickness=12)))
    _layout(fig, title, height=max(220, 28 * len(layers) + 140))
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(tickangle=-35)
    return fig


def histogram_figure(values: np.ndarray, bins: int = 120, title: str = "Value histogram",
                     log_y: bool = False) -> go.Figure:
    """Histogram of finite values, computed with numpy (only the bin counts reach the browser)."""
    v = np.asarray(values, dtype=np.float32).ravel()
    v = v[np.isfinite(v)]
    if v.size == 0:
        return empty_figure("no finite values")
    lo, hi = float(v.min()), float(v.max())
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    counts, edges = np.histogram(v, bins=bins, range=(lo, hi))
    centers = (edges[:-1] + edges[1:]) / 2
    fig = go.Figure(go.Bar(x=centers, y=counts, width=(edges[1] - edges[0]), marker_color="#1f77b4"))
    _layout(fig, title, height=300, bargap=0)
    fig.update_xaxes(title="value")
    fig.update_yaxes(title="count", type="log" if log_y else "linear")
    return fig


def heatmap_figure(matrix: np.ndarray, max_rows: int = 256, max_cols: int = 512, row_offset: int = 0,
                   title: str = "Values") -> go.Figure:
    """Block-averaged heatmap of a 2-D slice (numpy order: rows = outermost dim), diverging colours
    centred on 0. Axis labels are the original row / column indices of each block's start."""
    small, fr, fc = model_views.downsample_matrix(matrix, max_rows=max_rows, max_cols=max_cols)
    if small.size == 0:
        return empty_figure("empty slice")
    finite = small[np.isfinite(small)]
    amax = float(np.abs(finite).max()) if finite.size else 1.0
    amax = amax or 1.0
    y = row_offset + np.arange(small.shape[0]) * fr
    x = np.arange(small.shape[1]) * fc
    fig = go.Figure(go.Heatmap(z=small, x=x, y=y, colorscale="RdBu", zmid=0, zmin=-amax, zmax=amax,
                               colorbar=dict(thickness=12)))
    sub = "" if fr == fc == 1 else f" (block mean {fr}×{fc})"
    _layout(fig, title + sub, height=420)
    fig.update_yaxes(autorange="reversed", title="row (numpy dim 0)")
    fig.update_xaxes(title="column (numpy dim 1)")
    return fig


# -------------------------------------------------------------------------------------- centroids

def cluster_size_figure(sizes: np.ndarray, title: str = "Cluster sizes (tokens per centroid)") -> go.Figure:
    """Distribution of tokens per centroid (array of length n_centroids)."""
    s = np.asarray(sizes).ravel()
    if s.size == 0:
        return empty_figure("no centroids")
    vals, counts = np.unique(s, return_counts=True)
    fig = go.Figure(go.Bar(x=vals, y=counts, marker_color="#9467bd",
                           hovertemplate="%{y} centroids hold %{x} tokens<extra></extra>"))
    _layout(fig, title, height=280)
    fig.update_xaxes(title="tokens in the centroid", type="category")
    fig.update_yaxes(title="centroids")
    return fig


def coverage_heatmap(cov: model_views.Coverage, cols: int = 64, title: str = "Centroid coverage") -> go.Figure:
    """Per-centroid coverage on a grid (centroid id = row·cols + col): colour = fraction of the
    steps whose target token lived in that centroid where the centroid was chosen (reachable);
    grey = the target never lived there. Hover: chosen / target-home / covered counts."""
    n = cov.n_centroids
    if n == 0:
        return empty_figure("no centroids")
    rows = -(-n // cols)
    tab = cov.table()
    z = np.full(rows * cols, np.nan)
    z[:n] = tab["coverage"].to_numpy()
    chosen = np.zeros(rows * cols, dtype=np.int64)
    home = np.zeros(rows * cols, dtype=np.int64)
    covered = np.zeros(rows * cols, dtype=np.int64)
    chosen[:n], home[:n], covered[:n] = cov.chosen, cov.target_home, cov.covered
    ids = np.arange(rows * cols)
    custom = np.stack([ids, chosen, home, covered], axis=-1).reshape(rows, cols, 4)
    fig = go.Figure(go.Heatmap(
        z=z.reshape(rows, cols), colorscale="RdYlGn", zmin=0, zmax=1, customdata=custom, xgap=1, ygap=1,
        hovertemplate="centroid %{customdata[0]}<br>chosen %{customdata[1]} steps<br>"
                      "target lived here %{customdata[2]} steps<br>of which reachable %{customdata[3]}"
                      "<br>coverage %{z:.0%}<extra></extra>",
        colorbar=dict(title="coverage", tickformat=".0%", thickness=12)))
    _layout(fig, title, height=max(260, min(900, 9 * rows + 120)), plot_bgcolor="#e5e5e5")
    fig.update_yaxes(autorange="reversed", title=f"centroid // {cols}")
    fig.update_xaxes(title=f"centroid % {cols}")
    return fig


def chosen_vs_home_figure(cov: model_views.Coverage, top: int = 40) -> go.Figure:
    """For the ``top`` centroids where target tokens lived most often: how often each was chosen vs
    how often the target's token lived in it (and was reachable)."""
    tab = cov.table()
    tab = tab[(tab["target_home"] > 0) | (tab["chosen"] > 0)]
    if len(tab) == 0:
        return empty_figure("no centroid data in this trace")
    tab = tab.sort_values(["target_home", "chosen"], ascending=False).head(top)
    x = [str(c) for c in tab["centroid"]]
    fig = go.Figure()
    fig.add_bar(x=x, y=tab["chosen"], name="chosen (in top-k)", marker_color="#1f77b4")
    fig.add_bar(x=x, y=tab["target_home"], name="target token lived here", marker_color="#ff7f0e")
    fig.add_bar(x=x, y=tab["covered"], name="…and was reachable", marker_color="#2ca02c")
    _layout(fig, f"Chosen vs target home (top {len(tab)} centroids by target count)", height=320, barmode="group")
    fig.update_xaxes(title="centroid", type="category")
    fig.update_yaxes(title="steps")
    return fig


# ---------------------------------------------------------------------------------------- compare

#: Pixels per prompt of the per-prompt delta chart (one horizontal bar and its label per row).
DELTA_ROW_PX = 22
#: Characters of a prompt's label shown on the per-prompt delta chart's axis (the whole label on hover).
DELTA_LABEL_CHARS = 44


def prompt_delta_figure(deltas: pd.DataFrame, names: tuple[str, str] = ("A", "B"), top: int = 60,
                        labels: dict[int, str] | None = None) -> go.Figure:
    """Per-prompt acceptance-rate delta (B − A): one horizontal bar per prompt, biggest drop at the top, the
    prompt named on the y axis by ``labels[prompt_id]`` (id and the start of its text) cut to
    :data:`DELTA_LABEL_CHARS` characters (the whole label on hover). The figure grows by
    :data:`DELTA_ROW_PX` per prompt, so the labels sit one per row and never overlap."""
    if deltas is None or len(deltas) == 0:
        return empty_figure("no prompts in common")
    d = deltas.dropna(subset=["delta_rate"]).head(top)
    if len(d) == 0:
        return empty_figure("no prompts in common")
    labels = labels or {}
    full = [labels.get(int(p), f"prompt {p}") for p in d["prompt_id"]]
    y = [views.esc(t if len(t) <= DELTA_LABEL_CHARS else t[:DELTA_LABEL_CHARS - 1] + "…") for t in full]
    colors = ["#d62728" if v < 0 else "#2ca02c" for v in d["delta_rate"]]
    fig = go.Figure(go.Bar(x=d["delta_rate"], y=y, orientation="h", marker_color=colors,
                           customdata=[views.esc(t) for t in full],
                           hovertemplate="%{customdata}<br>Δ rate %{x:.1%}<extra></extra>"))
    _layout(fig, f"Per-prompt acceptance-rate delta ({names[1]} − {names[0]})",
            height=110 + DELTA_ROW_PX * len(d), margin=dict(l=20, r=20, t=50, b=50))
    fig.update_yaxes(type="category", autorange="reversed", automargin=True)
    fig.update_xaxes(title="Δ acceptance rate", tickformat=".0%", zeroline=True)
    return fig


def only_counts_figure(a_only: OneSided, b_only: OneSided, by: str = "by_class", names: tuple[str, str] = ("A", "B"),
                       title: str | None = None) -> go.Figure:
    """Grouped bars of the aligned diff's one-sided positions (``a_only`` / ``b_only``:
    :class:`mtpscope.traces.analysis.align.OneSided`) by token class (``by="by_class"``) or by draft position
    (``"by_position"``)."""
    ca, cb = ((a_only.by_class, b_only.by_class) if by == "by_class" else (a_only.by_position, b_only.by_position))
    keys = sorted(set(ca) | set(cb), key=lambda k: (int(k) if str(k).isdigit() else 0, str(k)))
    if not keys:
        return empty_figure("no output position is accepted in one run and rejected in the other")
    x = [f"k={k}" if by == "by_position" else str(k) for k in keys]
    fig = go.Figure()
    fig.add_bar(x=x, y=[int(ca.get(k, 0)) for k in keys], name=f"accepted in {names[0]}, rejected in {names[1]}",
                marker_color="#1f77b4")
    fig.add_bar(x=x, y=[int(cb.get(k, 0)) for k in keys], name=f"accepted in {names[1]}, rejected in {names[0]}",
                marker_color="#ff7f0e")
    what = "token class" if by == "by_class" else "draft position"
    _layout(fig, title or f"Accepted in one run only, by {what}", height=300, barmode="group",
            legend=dict(orientation="h", yanchor="top", y=-0.2, x=0))
    fig.update_yaxes(title="output positions")
    return fig


def delta_ci_figure(delta: Mapping[str, RateDelta], names: tuple[str, str] = ("A", "B")) -> go.Figure:
    """Acceptance-rate delta (B − A) per category with its 95 % bootstrap interval (``AlignedDiff.delta``:
    category -> :class:`mtpscope.traces.analysis.align.RateDelta`)."""
    items = [(c, x, x.delta) for c, x in delta.items() if x.delta is not None]
    if not items:
        return empty_figure("no drafted tokens in the paired prompts")
    fig = go.Figure(go.Scatter(
        x=[d for _, _, d in items], y=[c for c, _, _ in items], mode="markers", marker=dict(size=11, color="#1f77b4"),
        error_x=dict(type="data", symmetric=False,
                     array=[(x.ci_high - d) if x.ci_high is not None else 0 for _, x, d in items],
                     arrayminus=[(d - x.ci_low) if x.ci_low is not None else 0 for _, x, d in items]),
        hovertemplate="%{y}: %{x:+.3f}<extra></extra>"))
    fig.add_vline(x=0, line_dash="dot", line_color="#888")
    _layout(fig, f"Acceptance-rate delta ({names[1]} − {names[0]}) with a 95 % interval", height=max(200, 50 * len(items) + 120))
    fig.update_xaxes(title="Δ acceptance rate", tickformat="+.0%")
    fig.update_yaxes(type="category", autorange="reversed")
    return fig


def summary_bars(values: Sequence[float], labels: Sequence[str], title: str) -> go.Figure:
    """Simple labelled bars (e.g. acceptance rate of two traces)."""
    fig = go.Figure(go.Bar(x=list(labels), y=list(values), text=[f"{v:.3f}" for v in values],
                           textposition="outside"))
    return _layout(fig, title, height=260)


# ------------------------------------------------------------------------------------------ sweep

#: what the Sweep heatmap can colour by: label -> (cells column, number format, colour scale)
SWEEP_VALUES = {
    "speedup": ("speedup", ".2f", "RdYlGn"),
    "acceptance rate": ("acceptance_rate", ".1%", "Viridis"),
    "mean acceptance length": ("mean_acceptance_length", ".2f", "Viridis"),
    "tokens/s": ("tokens_per_s", ".1f", "Viridis"),
}


def sweep_config_label(assistant: str, n_draft: int) -> str:
    """Row label of a configuration in the Sweep heatmap (``q8 · n_draft 3``, ``baseline (plain)``)."""
    return "baseline (plain)" if int(n_draft) == 0 else f"{assistant} · n_draft {int(n_draft)}"


def sweep_heatmap(cells: pd.DataFrame, value: str = "speedup") -> go.Figure:
    """Configuration × category heatmap of a sweep's cells.

    Args:
        cells: :meth:`traces.sweep.reader.Sweep.cells` (columns assistant, n_draft, category, and the
            value column); rows in its order become the heatmap's rows (top to bottom), categories in
            order of first appearance its columns.
        value: a key of :data:`SWEEP_VALUES`. Speedup is centred on 1 (red slower than the baseline,
            green faster).

    Returns:
        The figure; each cell's ``customdata`` is ``[assistant, n_draft, category]`` and
        ``fig.layout.meta`` is ``{"value": column, "rows": [(assistant, n_draft), ...], "columns": [...]}``.
    """
    if cells is None or len(cells) == 0:
        return empty_figure("no finished task in this sweep yet")
    col, fmt, scale = SWEEP_VALUES[value]
    configs = list(dict.fromkeys(zip(cells["assistant"], cells["n_draft"].astype(int), strict=True)))
    cats = list(dict.fromkeys(cells["category"]))
    z = np.full((len(configs), len(cats)), np.nan)
    idx = {c: i for i, c in enumerate(configs)}
    jdx = {c: j for j, c in enumerate(cats)}
    for a, k, c, v in zip(cells["assistant"], cells["n_draft"].astype(int), cells["category"], cells[col], strict=True):
        z[idx[(a, k)], jdx[c]] = np.nan if v is None else float(v)
    text = [[("" if np.isnan(v) else format(v, fmt)) for v in row] for row in z]
    custom = [[[a, int(k), c] for c in cats] for a, k in configs]
    labels = [sweep_config_label(a, k) for a, k in configs]
    kw: dict = {}
    if col == "speedup" and np.isfinite(z).any():
        kw = {"zmid": 1.0}
    fig = go.Figure(go.Heatmap(z=z, x=cats, y=labels, text=text, texttemplate="%{text}", customdata=custom,
                               colorscale=scale, hoverongaps=False, colorbar=dict(title=value), **kw,
                               hovertemplate="%{y}<br>%{x}<br>" + value + " %{text}<extra></extra>"))
    _layout(fig, f"{value} by configuration and category", height=max(260, 60 + 34 * len(configs)),
            meta={"value": col, "rows": [[a, int(k)] for a, k in configs], "columns": cats})
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(type="category", side="top")
    return fig


# ------------------------------------------------------------------------------------------ diagnose

def variants_figure(variants: Mapping[str, VariantRow] | None,
                    title: str = "Replayed acceptance per convention variant") -> go.Figure:
    """Would-be acceptance of each replay variant on the same rounds (``diagnose``'s ``variants.variants``:
    ``{name: VariantRow}``, ``baseline`` first), the change against the baseline as a label with its 95 % interval,
    a variant that recovers acceptance in red."""
    items = [(n, v) for n, v in (variants or {}).items() if v.acceptance_rate is not None]
    if not items:
        return empty_figure("no replay")
    text = []
    for _, v in items:
        d = v.delta
        iv = f" [{v.ci_low:+.2f}, {v.ci_high:+.2f}]" if v.ci_low is not None and v.ci_high is not None else ""
        text.append(f"{v.acceptance_rate:.2f}" if d is None else f"{v.acceptance_rate:.2f} ({d:+.2f}{iv})")
    colours = ["#7f7f7f" if n == "baseline" else ("#d62728" if v.recovers else "#1f77b4") for n, v in items]
    fig = go.Figure(go.Bar(x=[n for n, _ in items], y=[v.acceptance_rate for _, v in items], marker_color=colours,
                           text=text, textposition="outside",
                           hovertemplate="%{x}: %{y:.1%} of drafts would be accepted<extra></extra>"))
    _layout(fig, title, height=300, meta={"recovers": [n for n, v in items if v.recovers]})
    fig.update_yaxes(title="acceptance rate", range=[0, 1.12], tickformat=".0%")
    fig.update_xaxes(title="variant (on top of the recorder's conventions)", type="category")
    return fig
