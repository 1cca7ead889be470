"""Pure plotly figure builders for the app (no Streamlit import; tests call them directly).

Every builder takes small, already-prepared data (see app/views.py) and returns a
``plotly.graph_objects.Figure``. Sizes are bounded here too: the timeline draws one mark per round
only up to ``max_marks`` rounds (WebGL beyond ``svg_limit``) and aggregates longer traces into bins;
heatmaps are block-averaged to a few hundred cells a side; histograms are computed with numpy and
sent as bars, never as raw values.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from mtpscope.app import views

#: Accepted-length colours, 0 (red) … K (green).
ACCEPT_SCALE = [[0.0, "#d62728"], [0.34, "#ff7f0e"], [0.67, "#bcbd22"], [1.0, "#2ca02c"]]
STATUS_COLORS = {"present": "#2ca02c", "missing": "#d62728", "wrong shape": "#ff7f0e"}
TIMELINE_MAX_MARKS = 3000
TIMELINE_SVG_LIMIT = 1500
MAX_STREAK_SHAPES = 40


def _layout(fig: go.Figure, title: str, height: int = 360, **kw) -> go.Figure:
    kw.setdefault("margin", dict(l=50, r=20, t=50, b=40))
    fig.update_layout(title=title, height=height, template="plotly_white", **kw)
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
                    highlight: tuple[int, int] | None = None) -> go.Figure:
    """The acceptance timeline.

    Args:
        rounds: rounds in timeline order with a ``seq`` column (:func:`mtpscope.app.views.ordered_rounds`):
            prompt_id, round, n_draft, n_accepted, drafted, target.
        decode: token id → display text for the hover boxes (drafted vs target).
        max_marks: up to this many rounds one clickable mark per round (y = accepted length,
            colour = accepted length, customdata = [prompt_id, round, seq]); beyond it the rounds
            are aggregated into at most ``max_bins`` bins (y = mean accepted length per bin,
            customdata = the bin's first round).
        svg_limit: above this many marks use WebGL (``Scattergl``).
        min_streak: zero-acceptance runs of at least this many rounds are shaded (longest
            :data:`MAX_STREAK_SHAPES` only).
        highlight: (first seq, last seq) of a window to outline (the detail window on the overview).

    Returns:
        The figure; ``fig.layout.meta`` is ``{"mode": "marks" | "bins", "n_rounds": n}``.
    """
    n = len(rounds)
    if n == 0:
        return empty_figure("no rounds in this selection")
    kmax = int(max(1, rounds["n_draft"].max()))
    if n <= max_marks:
        hover = views.round_hover(rounds, decode)
        cls = go.Scattergl if n > svg_limit else go.Scatter
        fig = go.Figure(cls(
            x=rounds["seq"], y=rounds["n_accepted"], mode="markers",
            marker=dict(size=9 if n <= 300 else 6, color=rounds["n_accepted"], colorscale=ACCEPT_SCALE,
                        cmin=0, cmax=kmax, line=dict(width=0.5, color="#444"),
                        colorbar=dict(title="accepted", thickness=12)),
            customdata=np.stack([rounds["prompt_id"].to_numpy(), rounds["round"].to_numpy(),
                                 rounds["seq"].to_numpy()], axis=1),
            hovertext=hover, hoverinfo="text", name="round",
        ))
        mode = "marks"
    else:
        b = views.binned_rounds(rounds, max_bins=max_bins)
        hover = [f"rounds {s}–{e} (from prompt {p} · round {r})<br>mean accepted {m:.2f}<br>"
                 f"acceptance rate {a:.1%}<br>zero-acceptance rounds {z}"
                 for s, e, p, r, m, a, z in zip(b["seq_start"], b["seq_end"], b["prompt_id"], b["round"],
                                                 b["mean_accepted"], b["acceptance_rate"].fillna(0), b["n_zero"])]
        fig = go.Figure(go.Scattergl(
            x=b["seq_start"], y=b["mean_accepted"], mode="markers+lines",
            marker=dict(size=4, color=b["mean_accepted"], colorscale=ACCEPT_SCALE, cmin=0, cmax=kmax,
                        colorbar=dict(title="mean acc.", thickness=12)),
            line=dict(width=1, color="#888"),
            customdata=np.stack([b["prompt_id"].to_numpy(), b["round"].to_numpy(), b["seq_start"].to_numpy()], axis=1),
            hovertext=hover, hoverinfo="text", name="bin",
        ))
        mode = "bins"
    # Shapes are built as plain dicts and set once: plotly's add_vrect / add_vline re-validate the
    # whole shape list on every call (seconds for a hundred shapes).
    shapes: list[dict] = []
    streaks = views.zero_streaks(rounds, min_length=min_streak).head(MAX_STREAK_SHAPES)
    for s in streaks.itertuples(index=False):
        shapes.append(dict(type="rect", xref="x", yref="paper", x0=float(s.start_seq) - 0.5,
                           x1=float(s.end_seq) + 0.5, y0=0, y1=1, fillcolor="#d62728", opacity=0.12,
                           line_width=0, layer="below"))
    # prompt boundaries
    first = rounds["prompt_id"].to_numpy()
    change = np.flatnonzero(first[1:] != first[:-1]) + 1 if len(first) > 1 else np.zeros(0, dtype=np.int64)
    if 0 < len(change) <= 60:
        seq = rounds["seq"].to_numpy()
        for i in change:
            shapes.append(dict(type="line", xref="x", yref="paper", x0=float(seq[i]) - 0.5, x1=float(seq[i]) - 0.5,
                               y0=0, y1=1, line=dict(width=1, dash="dot", color="#999")))
    if highlight is not None:
        shapes.append(dict(type="rect", xref="x", yref="paper", x0=float(highlight[0]) - 0.5,
                           x1=float(highlight[1]) + 0.5, y0=0, y1=1, fillcolor="#1f77b4", opacity=0.15,
                           line=dict(width=1, color="#1f77b4"), layer="below"))
    fig.update_layout(shapes=shapes)
    _layout(fig, title, height=340, clickmode="event+select", dragmode="zoom", showlegend=False,
            meta={"mode": mode, "n_rounds": n, "n_streaks_shaded": len(streaks)})
    fig.update_xaxes(title="round (in prompt order)")
    fig.update_yaxes(title="accepted length" if mode == "marks" else "mean accepted length",
                     range=[-0.3, kmax + 0.3])
    return fig


def per_position_figure(per_pos: pd.DataFrame, other: pd.DataFrame | None = None,
                        names: tuple[str, str] = ("A", "B"), title: str = "Per-position acceptance") -> go.Figure:
    """Bars of P(draft k accepted) for k = 1..K (columns k, acceptance as in
    :func:`mtpscope.traces.metrics.per_position_acceptance`); a second table adds a second series (Compare)."""
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


def rolling_figure(rolling: pd.DataFrame, overall: float | None = None, window: int = 64,
                   other: pd.DataFrame | None = None, names: tuple[str, str] = ("A", "B")) -> go.Figure:
    """Rolling acceptance rate (columns seq, rolling_rate) with the overall rate as a line."""
    if rolling is None or len(rolling) == 0:
        return empty_figure("no rounds")
    fig = go.Figure()
    fig.add_trace(go.Scattergl(x=rolling["seq"], y=rolling["rolling_rate"], mode="lines",
                               name=names[0] if other is not None else f"rolling ({window} rounds)"))
    if other is not None and len(other):
        fig.add_trace(go.Scattergl(x=other["seq"], y=other["rolling_rate"], mode="lines", name=names[1]))
    if overall is not None and np.isfinite(overall):
        fig.add_hline(y=overall, line_dash="dash", line_color="#555",
                      annotation_text=f"overall {overall:.1%}", annotation_position="top left")
    _layout(fig, f"Rolling acceptance rate (window {window} rounds)", height=280, showlegend=other is not None)
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%", title="acceptance rate")
    fig.update_xaxes(title="round (in prompt order)")
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

def top_candidates_figure(top: pd.DataFrame, k: int) -> go.Figure:
    """Horizontal bars of one step's top candidates (logits), the draft and the target marked."""
    if top is None or len(top) == 0:
        return empty_figure(f"step {k}: no top candidates stored", height=160)
    colors = ["#2ca02c" if t else ("#1f77b4" if d else "#aaaaaa")
              for d, t in zip(top["is_draft"], top["is_target"])]
    labels = [f"{r}. {views._esc(t)}" for r, t in zip(top["rank"], top["text"])]
    fig = go.Figure(go.Bar(x=top["logit"], y=labels, orientation="h", marker_color=colors,
                           hovertext=[f"id {i}" for i in top["id"]], hoverinfo="text+x"))
    _layout(fig, f"k={k} · green = target, blue = drafted", height=max(160, 26 * len(top) + 70))
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title="logit")
    return fig


def hidden_norms_figure(norms: pd.DataFrame) -> go.Figure:
    """L2 norms of the stored hidden states per draft step (columns k and one per hidden name)."""
    if norms is None or len(norms) == 0 or len(norms.columns) <= 1:
        return empty_figure("no hidden states stored in this trace", height=160)
    fig = go.Figure()
    for col in norms.columns:
        if col == "k":
            continue
        fig.add_trace(go.Scatter(x=norms["k"], y=norms[col], mode="lines+markers", name=f"‖{col}‖"))
    _layout(fig, "Hidden-state norms per draft step", height=260)
    fig.update_xaxes(title="draft position k", dtick=1)
    fig.update_yaxes(title="L2 norm")
    return fig


# ---------------------------------------------------------------------------------------- tensors

def treemap_figure(inv: pd.DataFrame, title: str = "Bytes by component and type") -> go.Figure:
    """Treemap of bytes: file → component → ggml type (inventory table from
    :func:`mtpscope.app.views.inventory_frame`)."""
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
    (:func:`mtpscope.app.views.layer_grid`). Empty cells: the name is neither in the file nor expected."""
    if grid is None or len(grid) == 0:
        return empty_figure("no per-layer (blk.N.*) tensors")
    codes = {"present": 0, "wrong shape": 1, "missing": 2}
    tensors = sorted(grid["tensor"].unique())
    layers = sorted(grid["layer"].unique())
    z = np.full((len(layers), len(tensors)), np.nan)
    text = [["" for _ in tensors] for _ in layers]
    li = {v: i for i, v in enumerate(layers)}
    ti = {v: i for i, v in enumerate(tensors)}
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
    small, fr, fc = views.downsample_matrix(matrix, max_rows=max_rows, max_cols=max_cols)
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


def coverage_heatmap(cov: views.Coverage, cols: int = 64, title: str = "Centroid coverage") -> go.Figure:
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


def chosen_vs_home_figure(cov: views.Coverage, top: int = 40) -> go.Figure:
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

def prompt_delta_figure(deltas: pd.DataFrame, names: tuple[str, str] = ("A", "B"), top: int = 60) -> go.Figure:
    """Per-prompt acceptance-rate delta (B − A), biggest drops first."""
    if deltas is None or len(deltas) == 0:
        return empty_figure("no prompts in common")
    d = deltas.dropna(subset=["delta_rate"]).head(top)
    if len(d) == 0:
        return empty_figure("no prompts in common")
    colors = ["#d62728" if v < 0 else "#2ca02c" for v in d["delta_rate"]]
    fig = go.Figure(go.Bar(x=[str(p) for p in d["prompt_id"]], y=d["delta_rate"], marker_color=colors,
                           hovertemplate="prompt %{x}<br>Δ rate %{y:.1%}<extra></extra>"))
    _layout(fig, f"Per-prompt acceptance-rate delta ({names[1]} − {names[0]})", height=300)
    fig.update_xaxes(title="prompt", type="category")
    fig.update_yaxes(title="Δ acceptance rate", tickformat=".0%")
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
        cells: :meth:`traces.sweep_read.Sweep.cells` (columns assistant, n_draft, category, and the
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
