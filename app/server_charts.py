"""Pure plotly figures of the Server page (llama-server requests; no Streamlit import, tested directly).

Inputs are the small tables of :mod:`mtpscope.traces.analysis.requests` (one row per request, per category, per
draft position); sizes stay bounded: one mark per request up to :data:`MAX_MARKS` requests, the most recent ones
beyond.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from mtpscope.app.charts import empty_figure

MAX_MARKS = 5000
ACCEPT_COLOUR = "#2ca02c"
SPEED_COLOUR = "#1f77b4"


def _layout(fig: go.Figure, title: str, height: int = 360, **kw) -> go.Figure:
    kw.setdefault("margin", dict(l=50, r=50, t=50, b=40))
    fig.update_layout(title=title, height=height, template="plotly_white", **kw)
    return fig


def requests_over_time(table: pd.DataFrame, *, max_marks: int = MAX_MARKS) -> go.Figure:
    """Acceptance rate (left axis) and tokens/s (right axis) per request, in sending order.

    Args:
        table: :func:`mtpscope.traces.analysis.requests.request_table` (``request``, ``prompt``, ``category``,
            ``acceptance_rate``, ``tokens_per_s``, ``n_drafted``, ``n_accepted``, ``started_unix_s``).
        max_marks: at most this many requests are drawn (the last ones).

    x is seconds since the first request when sending times are known, else the request number;
    ``customdata`` = [request, prompt] on both traces (a click names the request).
    """
    if table is None or not len(table):
        return empty_figure("no request yet")
    t = table.tail(max_marks)
    started = pd.to_numeric(t["started_unix_s"], errors="coerce").to_numpy(np.float64)
    if np.isfinite(started).all():
        x, xlabel = started - np.nanmin(pd.to_numeric(table["started_unix_s"], errors="coerce")), "seconds since the first request"
    else:
        x, xlabel = t["request"].to_numpy(np.int64), "request"
    custom = np.stack([t["request"].astype("int64").to_numpy(), t["prompt"].astype(str).to_numpy()], axis=1)
    hover = ("request %{customdata[0]} (prompt %{customdata[1]})<br>%{y:.3f}<extra></extra>")
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=pd.to_numeric(t["acceptance_rate"], errors="coerce"), mode="markers+lines",
                             name="acceptance rate", marker=dict(color=ACCEPT_COLOUR, size=8), customdata=custom,
                             hovertemplate=hover))
    fig.add_trace(go.Scatter(x=x, y=pd.to_numeric(t["tokens_per_s"], errors="coerce"), mode="markers+lines",
                             name="tokens/s", yaxis="y2", marker=dict(color=SPEED_COLOUR, size=7, symbol="diamond"),
                             customdata=custom, hovertemplate=hover))
    fig.update_layout(xaxis=dict(title=xlabel), yaxis=dict(title="acceptance rate", range=[0, 1.02]),
                      yaxis2=dict(title="tokens/s", overlaying="y", side="right", rangemode="tozero"),
                      legend=dict(orientation="h", y=1.12))
    return _layout(fig, "Acceptance and speed per request")


def category_figure(by_cat: pd.DataFrame) -> go.Figure:
    """Acceptance rate per category (:func:`mtpscope.traces.analysis.requests.by_category`), worst first,
    each bar labelled with its request count."""
    if by_cat is None or not len(by_cat):
        return empty_figure("no categories")
    fig = go.Figure(go.Bar(x=by_cat["category"].astype(str), y=by_cat["acceptance_rate"],
                           text=[f"{n} req" for n in by_cat["n_requests"]], textposition="outside",
                           marker_color=ACCEPT_COLOUR,
                           hovertemplate="%{x}: %{y:.3f}<extra></extra>"))
    fig.update_yaxes(title="acceptance rate", range=[0, 1.1])
    return _layout(fig, "Acceptance rate by category")


def position_figure(per_pos: pd.DataFrame) -> go.Figure:
    """Accepted per draft position over drafts (:func:`mtpscope.traces.analysis.requests.per_position`: the
    server's ``acc per pos``), with the accepted count on each bar."""
    if per_pos is None or not len(per_pos):
        return empty_figure("no per-position counters (the server's /metrics was off or nothing was drafted)")
    fig = go.Figure(go.Bar(x=[f"k={int(k)}" for k in per_pos["k"]], y=per_pos["rate"],
                           text=[str(int(n)) for n in per_pos["n_accepted"]], textposition="outside",
                           marker_color=ACCEPT_COLOUR, hovertemplate="%{x}: %{y:.3f}<extra></extra>"))
    fig.update_yaxes(title="accepted / drafts", range=[0, 1.1])
    return _layout(fig, "Accepted per draft position (server counters)")


__all__ = ["category_figure", "position_figure", "requests_over_time"]
