"""app/charts.py, app/views.py and app/tokens.py: pure builders, checked against hand-computed values."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from mtpscope.app import charts, views
from mtpscope.app.tokens import TokenText, readable
from mtpscope.inspector.centroids import CentroidHead
from mtpscope.traces import metrics


def _rounds(accepted: list[list[int]], n_draft: int = 3) -> pd.DataFrame:
    """Rounds for prompts given as lists of n_accepted per round (drafted ids 100+k, target ids
    equal on accepted positions, 900+k at the first mismatch)."""
    rows = []
    for pid, accs in enumerate(accepted):
        for r, na in enumerate(accs):
            drafted = [100 + k for k in range(n_draft)]
            target = [100 + k if k < na else 900 + k for k in range(n_draft + 1)]
            rows.append({"prompt_id": pid, "round": r, "pos": r, "pending_token": 1, "n_draft": n_draft,
                         "drafted": drafted, "target": target, "n_accepted": na,
                         "emitted": drafted[:na] + [target[na]], "t_draft_ms": 1.0, "t_verify_ms": 2.0})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------- tokens

def test_readable_real_gemma_pieces() -> None:
    assert readable("\u2581about") == " about"
    assert readable("\n\n") == "↵↵"
    assert readable("<0x41>") == "A"
    assert readable("<0x0A>") == "↵"
    assert readable("<0xFF>") == "<0xFF>"
    assert readable("a\x01b") == "a\\x01b"


def test_token_text_lazy_lookup_and_labels() -> None:
    class Counting(list):
        hits = 0

        def __getitem__(self, i):
            Counting.hits += 1
            return super().__getitem__(i)

    toks = Counting(["<pad>", "\u2581the", "\u2581cat", "\n"])
    d = TokenText(toks, "test")
    assert d.text(1) == " the" and d.label(2) == "“ cat”" and d.label(3) == "“↵”"
    assert d.text(1) == " the"
    assert Counting.hits == 3  # cached: id 1 decoded once
    assert d.label(99) == "#99" and d.label(None) == "∅" and d.label(-1) == "∅"
    assert d.join([1, 2]) == "“ the” · “ cat”"
    assert d.find("cat") == [2] and d.find(" the") == [1]
    assert TokenText(None).label(5) == "#5"


def test_token_text_on_real_vocab(vocab_gguf) -> None:
    from mtpscope.inspector.gguf import open_gguf

    f = open_gguf(vocab_gguf)
    d = TokenText(f.get("tokenizer.ggml.tokens"), str(vocab_gguf))
    assert d.n_vocab == 262144
    # ids checked with an independent struct walk of the file: tokens[1003] is '▁about', tokens[107] is '\n'
    assert d.text(1003) == " about"
    assert d.text(2) == "<bos>"
    assert d.text(107) == "↵"


# ------------------------------------------------------------------------------------- rounds

def test_zero_streaks_positions() -> None:
    r = views.ordered_rounds(_rounds([[3, 0, 0, 0, 2], [0, 0, 1]]))
    s = views.zero_streaks(r, min_length=2)
    assert s[["prompt_id", "start_round", "end_round", "length", "start_seq", "end_seq"]].values.tolist() == [
        [0, 1, 3, 3, 1, 3], [1, 0, 1, 2, 5, 6]]


def test_per_prompt_table_worst_first() -> None:
    r = _rounds([[3, 3], [0, 1], [2, 0, 0]])
    t = views.per_prompt_table(r, [{"prompt_id": 1, "text": "hi"}])
    # rates: p0 6/6, p1 1/6, p2 2/9 -> worst first: p1, p2, p0
    assert t["prompt_id"].tolist() == [1, 2, 0]
    assert t["acceptance_rate"].tolist() == pytest.approx([1 / 6, 2 / 9, 1.0])
    assert t["text"].tolist() == ["hi", "", ""]
    assert t["longest_zero_streak"].tolist() == [1, 2, 0]


def test_binned_rounds_sums() -> None:
    accs = [[k % 4 for k in range(10)]]
    r = views.ordered_rounds(_rounds(accs))
    b = views.binned_rounds(r, max_bins=3)  # bins of 4: [0,1,2,3] [0,1,2,3] [0,1]
    assert b["n_rounds"].tolist() == [4, 4, 2]
    assert b["mean_accepted"].tolist() == pytest.approx([1.5, 1.5, 0.5])
    assert b["acceptance_rate"].tolist() == pytest.approx([6 / 12, 6 / 12, 1 / 6])
    assert b["n_zero"].tolist() == [1, 1, 1]


def test_rolling_acceptance_window() -> None:
    r = views.ordered_rounds(_rounds([[3, 0, 3, 0]]))
    roll = views.rolling_acceptance(r, window=2)
    assert roll["rolling_rate"].tolist() == pytest.approx([1.0, 0.5, 0.5, 0.5])
    assert len(views.rolling_acceptance(views.ordered_rounds(_rounds([[1] * 50])), max_points=7)) <= 7


def test_round_hover_shows_text() -> None:
    r = views.ordered_rounds(_rounds([[1]]))
    d = TokenText(["<pad>"] * 100 + ["\u2581a", "\u2581b", "\u2581c"], "t")
    h = views.round_hover(r, d)[0]
    assert "accepted 1 / 3" in h
    assert "1: “ a” vs “ a” ✓" in h and "2: “ b” vs #901 ✗" in h


# ------------------------------------------------------------------------------------- timeline

def test_timeline_marks_are_clickable_points() -> None:
    r = views.ordered_rounds(_rounds([[3, 0, 0, 0], [1, 2]]))
    fig = charts.timeline_figure(r, None, min_streak=3)
    assert isinstance(fig.data[0], go.Scatter)
    assert fig.layout.meta["mode"] == "marks"
    assert list(fig.data[0].y) == [3, 0, 0, 0, 1, 2]
    assert [tuple(c) for c in fig.data[0].customdata] == [(0, 0, 0), (0, 1, 1), (0, 2, 2), (0, 3, 3), (1, 0, 4), (1, 1, 5)]
    # one shaded zero-acceptance streak (rounds 1..3 of prompt 0)
    rects = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(rects) == 1 and (rects[0].x0, rects[0].x1) == (0.5, 3.5)


def test_timeline_large_trace_is_binned_webgl() -> None:
    rng = np.random.default_rng(0)
    n = 100_000
    r = pd.DataFrame({"prompt_id": np.repeat(np.arange(4), n // 4), "round": np.tile(np.arange(n // 4), 4),
                      "n_draft": 3, "n_accepted": rng.integers(0, 4, n)})
    r = views.ordered_rounds(r)
    fig = charts.timeline_figure(r, None, max_bins=2000)
    assert fig.layout.meta["mode"] == "bins"
    assert isinstance(fig.data[0], go.Scattergl)
    assert len(fig.data[0].x) == 2000
    assert float(np.mean(fig.data[0].y)) == pytest.approx(r["n_accepted"].mean(), rel=1e-9)
    hl = charts.timeline_figure(r, None, max_bins=2000, highlight=(100, 3099))
    rect = [s for s in hl.layout.shapes if s.type == "rect" and s.fillcolor == "#1f77b4"]
    assert len(rect) == 1 and (rect[0].x0, rect[0].x1) == (99.5, 3099.5)


def test_per_position_and_other_figures_build() -> None:
    r = _rounds([[3, 1, 0, 2]])
    pp = metrics.per_position_acceptance(r)
    # P(k accepted): k=1: 3/4, k=2: 2/4, k=3: 1/4
    assert pp["acceptance"].tolist() == pytest.approx([0.75, 0.5, 0.25])
    fig = charts.per_position_figure(pp)
    assert list(fig.data[0].y) == pytest.approx([0.75, 0.5, 0.25])
    assert len(charts.per_position_figure(pp, pp, names=("a", "b")).data) == 2
    assert charts.accepted_length_histogram(r).data[0].y.tolist() == [1, 1, 1, 1]


def test_histogram_and_heatmap_downsampling() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    small, fr, fc = views.downsample_matrix(a, max_rows=2, max_cols=2)
    # row blocks [0,1] and [2] (NaN padded), column blocks [0,1], [2,3]
    assert (fr, fc) == (2, 2)
    assert small.tolist() == [[2.5, 4.5], [8.5, 10.5]]
    fig = charts.heatmap_figure(np.ones((1000, 3000)), max_rows=100, max_cols=200)
    assert np.asarray(fig.data[0].z).shape == (100, 200)
    v = np.array([0.0, 0.0, 1.0, np.inf, np.nan], dtype=np.float32)
    h = charts.histogram_figure(v, bins=2)
    assert sum(h.data[0].y) == 3
    st = views.value_stats(v)
    assert st["non_finite"] == 2 and st["zeros"] == pytest.approx(2 / 3) and st["max"] == 1.0


# ------------------------------------------------------------------------------------- centroids

def test_token_to_centroid_inverse() -> None:
    ordering = np.array([5, 0, 3, 1, 2, 4], dtype=np.int32)  # 3 centroids x 2 tokens
    home = CentroidHead.from_arrays(np.zeros((3, 1), np.float32), ordering).token_to_centroid
    assert home.tolist() == [0, 1, 2, 1, 2, 0]


def test_centroid_coverage_counts_by_hand() -> None:
    home = np.array([0, 0, 1, 1, 2, 2])  # token -> centroid
    steps = pd.DataFrame({
        "centroid_ids": [[0, 1], [1, 2], [2, 0], None],
        "target_token": [2, 0, 5, 1],  # homes 1, 0, 2, 0
    })
    cov = views.centroid_coverage(steps, 3, home)
    assert cov.chosen.tolist() == [2, 2, 2]
    assert cov.target_home.tolist() == [2, 1, 1]
    # step0 home 1 in [0,1] yes; step1 home 0 in [1,2] no; step2 home 2 in [2,0] yes; step3 no ids
    assert cov.covered.tolist() == [0, 1, 1]
    # same result from an Arrow-backed list column (how Trace.steps returns lists)
    import pyarrow as pa

    arrow = steps.assign(centroid_ids=pd.Series(pa.array(steps["centroid_ids"].tolist(), pa.list_(pa.int32())),
                                                dtype=pd.ArrowDtype(pa.list_(pa.int32()))))
    cov2 = views.centroid_coverage(arrow, 3, home)
    assert cov2.covered.tolist() == [0, 1, 1] and cov2.chosen.tolist() == [2, 2, 2]
    fig = charts.coverage_heatmap(cov, cols=2)
    z = np.asarray(fig.data[0].z, dtype=float)
    assert z.shape == (2, 2) and z[0, 0] == 0.0 and z[0, 1] == 1.0 and z[1, 0] == 1.0 and np.isnan(z[1, 1])


def test_cluster_size_figure_counts() -> None:
    fig = charts.cluster_size_figure(np.array([128, 128, 127, 128]))
    assert list(fig.data[0].x) == [127, 128] and list(fig.data[0].y) == [1, 3]


# ------------------------------------------------------------------------------------- tensors

class _T:
    def __init__(self, name, type_name, shape, n_bytes):
        self.name, self.type_name, self.shape, self.ne = name, type_name, shape, tuple(reversed(shape))
        self.n_elements = int(np.prod(shape))
        self.n_bytes, self.bits_per_weight, self.offset = n_bytes, 8.5, 0


class _E:
    def __init__(self, t, component, layer):
        self.tensor, self.component, self.layer = t, component, layer


def _inv() -> pd.DataFrame:
    es = [_E(_T("token_embd.weight", "Q8_0", (100, 8), 850), "token_embd", None),
          _E(_T("mtp.pre_projection.weight", "F16", (8, 32), 512), "projection", None),
          _E(_T("blk.0.attn_q.weight", "F16", (8, 8), 128), "attention", 0),
          _E(_T("blk.1.attn_q.weight", "F16", (8, 8), 128), "attention", 1),
          _E(_T("blk.1.attn_norm.weight", "F32", (8,), 32), "norm", 1)]
    return views.inventory_frame(es)


def test_inventory_frame_and_filters() -> None:
    df = _inv()
    assert df.loc[0, "ne"] == "8×100" and df.loc[0, "shape"] == "100×8"
    assert views.filter_inventory(df, "blk.1.*")["name"].tolist() == ["blk.1.attn_q.weight", "blk.1.attn_norm.weight"]
    assert views.filter_inventory(df, "attn_q")["name"].tolist() == ["blk.0.attn_q.weight", "blk.1.attn_q.weight"]
    assert views.filter_inventory(df, focus=True)["name"].tolist() == ["mtp.pre_projection.weight"]
    assert len(views.filter_inventory(df, layers=[1], types=["F32"])) == 1
    assert views.filter_inventory(df, components=["norm", "projection"])["name"].tolist() == [
        "mtp.pre_projection.weight", "blk.1.attn_norm.weight"]


def test_treemap_sums_bytes() -> None:
    fig = charts.treemap_figure(_inv())
    t = fig.data[0]
    vals = dict(zip(t.ids, t.values))
    assert vals["all"] == 850 + 512 + 128 + 128 + 32
    assert vals["c/attention"] == 256 and vals["c/attention/F16"] == 256


def test_layer_grid_statuses() -> None:
    present = [("blk.0.attn_q.weight", (8, 8)), ("blk.1.attn_q.weight", (8, 8)), ("token_embd.weight", (1, 1))]
    g = views.layer_grid(present, missing=["blk.1.ffn_up.weight"], wrong_shape=["blk.0.attn_q.weight"])
    got = {(r.layer, r.tensor): r.status for r in g.itertuples()}
    assert got == {(0, "attn_q"): "wrong shape", (1, "attn_q"): "present", (1, "ffn_up"): "missing"}
    fig = charts.layer_grid_figure(g)
    z = np.asarray(fig.data[0].z, dtype=float)
    # x = [attn_q, ffn_up], y = [blk.0, blk.1]; codes present 0, wrong shape 1, missing 2
    assert z[0, 0] == 1 and z[1, 0] == 0 and z[1, 1] == 2 and np.isnan(z[0, 1])


# ------------------------------------------------------------------------------------- compare

def test_first_divergence_and_deltas() -> None:
    a = _rounds([[3, 1, 2], [0]])
    b = _rounds([[3, 2, 2], [0]])
    d = views.first_divergence(a, b)
    # drafted tokens are the same (100, 101, 102) in both; round 1 accepts 1 vs 2
    assert d.values.tolist() == [[0, 1, "n_accepted", "1", "2"]]
    c = _rounds([[3, 1, 2], [0]])
    c.at[1, "drafted"] = [100, 555, 102]
    assert views.first_divergence(a, c, decode=lambda t: f"t{t}").values.tolist() == [
        [0, 1, "drafted", "t100 · t101 · t102", "t100 · t555 · t102"]]
    longer = _rounds([[3, 1, 2, 3], [0]])
    assert views.first_divergence(a, longer).values.tolist() == [[0, 3, "length", "3 rounds", "4 rounds"]]
    deltas = views.prompt_deltas(views.per_prompt_table(a), views.per_prompt_table(b))
    row = deltas.set_index("prompt_id").loc[0]
    assert row["delta_rate"] == pytest.approx(7 / 9 - 6 / 9)
    assert views.first_divergence(a, a).empty


def test_step_table_and_top_candidates() -> None:
    steps = pd.DataFrame({"prompt_id": [0, 0], "round": [0, 0], "k": [2, 1], "token": [7, 5],
                          "top_ids": [[7, 8], [5, 6]], "top_logits": [[2.0, 1.0], [3.0, 0.5]],
                          "target_token": [8, 5], "target_rank": [1, 0], "accepted": [False, True],
                          "centroid_ids": [[1, 2], [3]], "target_in_candidates": [False, True],
                          "target_centroid": [4, 3], "target_centroid_rank": [40, 0]})
    s = views.round_steps(steps, 0, 0)
    assert s["k"].tolist() == [1, 2]
    t = views.step_table(s, lambda i: f"t{i}")
    assert t["drafted"].tolist() == ["t5", "t7"] and t["target"].tolist() == ["t5", "t8"]
    assert t["target_reachable"].tolist() == [True, False]
    top = views.top_candidates(s.iloc[1].to_dict(), lambda i: f"t{i}")
    assert top["is_target"].tolist() == [False, True] and top["is_draft"].tolist() == [True, False]
    fig = charts.top_candidates_figure(top, 2)
    assert list(fig.data[0].marker.color) == ["#1f77b4", "#2ca02c"]
    un = views.unreachable_steps(steps)
    assert un["k"].tolist() == [2]


def test_pure_modules_do_not_import_streamlit() -> None:
    import subprocess
    import sys

    code = ("import sys; import mtpscope.app.charts, mtpscope.app.views, mtpscope.app.safety, mtpscope.app.tokens; "
            "print('streamlit' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    assert out.stdout.strip() == "False", out.stderr
