"""app/charts.py, app/views.py, app/round_views.py, app/model_views.py and app/tokens.py: pure builders, checked
against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from mtpscope.app import charts, model_views, round_views, views
from mtpscope.app.tokens import TokenText, readable
from mtpscope.inspector.centroids import CentroidHead
from mtpscope.traces.analysis import metrics


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

    toks = Counting(["<pad>", "\u2581the", "\u2581cat", "\n", "\u2581", "\u2581\u2581\u2581\u2581"])
    d = TokenText(toks, "test")
    # a label shows its whitespace: a space as ␣ (U+2423), a newline as ↵; running text keeps its spaces
    assert d.text(1) == " the" and d.label(2) == "“\u2423cat”" and d.label(3) == "“↵”"
    assert d.label(4) == "“\u2423”" and d.label(5) == "“\u2423\u2423\u2423\u2423”" and d.text(4) == " "
    assert d.text(1) == " the"
    assert Counting.hits == 5  # cached: id 1 decoded once
    assert d.label(99) == "#99" and d.label(None) == "∅" and d.label(-1) == "∅"
    assert d.join([1, 2]) == "“\u2423the” · “\u2423cat”"
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


def test_prompts_without_a_rate_come_last_in_the_app_as_in_the_cli() -> None:
    """A prompt that drafted nothing (acceptance rate NaN: nothing to judge) is listed after every prompt with a
    rate, in the app's table as in ``explain`` and ``server requests`` (they disagreed: the app put it first)."""
    from mtpscope.cli.explain import _rate_table
    from mtpscope.traces.analysis.breakdown import Acceptance

    r = _rounds([[0, 0], [1, 0], [2, 2]])
    r.loc[r["prompt_id"] == 0, "n_draft"] = 0                    # prompt 0 drafted nothing
    r.loc[r["prompt_id"] == 0, "n_accepted"] = 0
    t = views.per_prompt_table(r)
    assert t["prompt_id"].tolist() == [1, 2, 0] and math.isnan(t["acceptance_rate"].iloc[-1])
    groups = {"p0": Acceptance(n_drafted=0, n_accepted=0, acceptance_rate=None),
              "p1": Acceptance(n_drafted=6, n_accepted=1, acceptance_rate=1 / 6),
              "p2": Acceptance(n_drafted=6, n_accepted=4, acceptance_rate=4 / 6)}
    lines = _rate_table("prompts", groups)
    assert [ln.split()[0] for ln in lines[3:]] == ["p1", "p2", "p0"]        # (after "", the title, the columns)


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
    assert roll["full"].tolist() == [False, True, True, True]
    assert len(views.rolling_acceptance(views.ordered_rounds(_rounds([[1] * 50])), max_points=7)) <= 7
    # across the trace the window runs over the prompt boundary: p0 r1 (3/3) + p1 r0 (0/3) -> 0.5;
    # per prompt it restarts: p1 r0 alone -> 0
    two = views.ordered_rounds(_rounds([[3, 3], [0, 3]]))
    across = views.rolling_acceptance(two, window=2)
    per = views.rolling_acceptance(two, window=2, per_prompt=True)
    assert across["rolling_rate"].tolist() == pytest.approx([1.0, 1.0, 0.5, 0.5])
    assert per["rolling_rate"].tolist() == pytest.approx([1.0, 1.0, 0.0, 0.5])
    assert across["n_window"].tolist() == [1, 2, 2, 2] and per["n_window"].tolist() == [1, 2, 1, 2]
    assert views.rolling_acceptance(two)["n_window"].max() == 4  # default window: metrics' (32)
    fig = charts.rolling_figure(per, window=2, labels={0: "prompt 0 “a”", 1: "prompt 1 “b”"}, per_prompt=True)
    names = [t.name for t in fig.data if t.showlegend is not False]
    assert names == ["prompt 0 “a”", "prompt 1 “b”"]
    # the filling part is its own dotted trace, joined to the first full point
    dotted = [t for t in fig.data if t.line.dash == "dot"]
    assert len(dotted) == 2 and [v for v in dotted[0].y if v == v] == pytest.approx([1.0, 1.0])


def _zero_draft_round(pid: int, rnd: int, token: int = 555) -> dict:
    return {"prompt_id": pid, "round": rnd, "pos": rnd, "pending_token": 1, "n_draft": 0, "drafted": [],
            "target": [token], "n_accepted": 0, "emitted": [token], "t_draft_ms": 0.0, "t_verify_ms": 2.0}


def test_round_hover_shows_text() -> None:
    r = views.ordered_rounds(pd.concat([_rounds([[1]]), pd.DataFrame([_zero_draft_round(0, 1)])], ignore_index=True))
    d = TokenText(["<pad>"] * 100 + ["\u2581a", "\u2581b", "\u2581c"], "t")
    h = round_views.round_hover(r, d, labels={0: "prompt 0 “hi”"})
    assert h[0].startswith("prompt 0 “hi” · round 0") and "accepted 1 of 3" in h[0]
    # k=1 accepted, k=2 the first rejection, k=3 after it: never checked, so no target shown
    assert "1: “␣a” vs “␣a” ✓" in h[0] and "2: “␣b” vs #901 ✗" in h[0] and "3: “␣c” – not checked" in h[0]
    assert "#902" not in h[0]
    assert "drafted nothing" in h[1] and "vs" not in h[1]


def test_step_verdicts() -> None:
    assert [round_views.step_verdict(k, 3, 1) for k in (1, 2, 3)] == ["accepted", "rejected", "not checked"]
    assert [round_views.step_verdict(k, 3, 3) for k in (1, 2, 3)] == ["accepted"] * 3
    assert [round_views.step_verdict(k, 2, 0) for k in (1, 2)] == ["rejected", "not checked"]


def test_round_verdict_sentences() -> None:
    def dec(i: int) -> str:
        return f"t{i}"

    step = {"token": 101, "logit": 4.0, "top_ids": [101, 901], "top_logits": [4.0, 2.75], "target_rank": 1}
    assert round_views.round_verdict(3, 1, [100, 101, 102], [100, 901, 902, 903], dec, step=step) == (
        "Rejected at k=2: the target chose t901 (drafter rank 1, logit 2.75 vs 4.00 for t101); k=3 was not checked")
    cause = "rejected (near tie): the target's t901 was the drafter's runner-up, 0.10 logits behind"
    assert round_views.round_verdict(3, 1, [100, 101, 102], [100, 901, 902, 903], dec, step=step, cause=cause) == (
        "Rejected at k=2 (near tie): drafted t101 (logit 4.00); the target's t901 was the drafter's runner-up, "
        "0.10 logits behind; k=3 was not checked")
    # said once: the cause names the target's token, rank and gap; the sentence does not repeat them
    line = round_views.round_verdict(3, 1, [100, 101, 102], [100, 901, 902, 903], dec, step=step, cause=cause)
    assert line.count("t901") == 1 and line.count("rank") == 0 and line.count("runner-up") == 1
    # the target's token below the stored top list: its logit is only bounded by the last stored one
    far = {"token": 100, "logit": 5.0, "top_ids": [100, 7], "top_logits": [5.0, 1.5], "target_rank": 13}
    assert round_views.round_verdict(3, 0, [100, 101, 102], [900, 901, 902, 903], dec, step=far) == (
        "Rejected at k=1: the target chose t900 (drafter rank 13, logit not stored, at most 1.50, vs 5.00 for "
        "t100); k=2–3 were not checked")
    assert round_views.round_verdict(2, 2, [1, 2], [1, 2, 3], dec) == "All 2 drafts accepted; the target added t3 (its bonus token)"
    assert round_views.round_verdict(1, 1, [1], [1, 3], dec) == "The draft was accepted; the target added t3 (its bonus token)"
    assert round_views.round_verdict(0, 0, [], [4], dec).startswith("Drafted nothing")


def test_rejected_rounds_navigation() -> None:
    stops = round_views.rejected_rounds(_rounds([[3, 0, 1], [3, 2]]))
    assert stops == [(0, 1), (0, 2), (1, 1)]
    assert round_views.neighbour(stops, (0, 0), 1) == (0, 1)
    assert round_views.neighbour(stops, (0, 2), 1) == (1, 1)
    assert round_views.neighbour(stops, (1, 1), 1) is None
    assert round_views.neighbour(stops, (1, 0), -1) == (0, 2)
    assert round_views.neighbour(stops, (0, 1), -1) is None


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
    # colour = share of the round's drafts accepted (n_accepted / n_draft), not the accepted count
    assert list(fig.data[0].marker.color) == pytest.approx([1, 0, 0, 0, 1 / 3, 2 / 3])
    assert (fig.data[0].marker.cmin, fig.data[0].marker.cmax) == (0, 1)


def test_timeline_zero_draft_rounds_apart_and_prompts_labelled() -> None:
    two = _rounds([[2, 2]], n_draft=2)  # 2 of 2 accepted is as green as it gets
    r = views.ordered_rounds(pd.concat([two, pd.DataFrame([_zero_draft_round(0, 2)]), _rounds([[], [3]]).assign(
        prompt_id=1)], ignore_index=True))
    fig = charts.timeline_figure(r, None, labels={0: "prompt 0 “The quick”", 1: "prompt 1 “Hello”"})
    assert list(fig.data[0].marker.color) == [1.0, 1.0, 1.0]
    assert fig.data[1].name == "drafted nothing" and list(fig.data[1].x) == [2] and list(fig.data[1].y) == [0]
    assert fig.layout.meta["n_zero_draft"] == 1 and fig.layout.showlegend
    assert [a.text for a in fig.layout.annotations] == ["prompt 0 “The quick”", "prompt 1 “Hello”"]
    assert [a.x for a in fig.layout.annotations] == [-0.5, 2.5]


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
    small, fr, fc = model_views.downsample_matrix(a, max_rows=2, max_cols=2)
    # row blocks [0,1] and [2] (NaN padded), column blocks [0,1], [2,3]
    assert (fr, fc) == (2, 2)
    assert small.tolist() == [[2.5, 4.5], [8.5, 10.5]]
    fig = charts.heatmap_figure(np.ones((1000, 3000)), max_rows=100, max_cols=200)
    assert np.asarray(fig.data[0].z).shape == (100, 200)
    v = np.array([0.0, 0.0, 1.0, np.inf, np.nan], dtype=np.float32)
    h = charts.histogram_figure(v, bins=2)
    assert sum(h.data[0].y) == 3
    st = model_views.value_stats(v)
    assert st["non_finite"] == 2 and st["zeros"] == pytest.approx(2 / 3) and st["max"] == 1.0


# ------------------------------------------------------------------------------------- centroids

def test_token_to_centroid_inverse() -> None:
    ordering = np.array([5, 0, 3, 1, 2, 4], dtype=np.int32)  # 3 centroids x 2 tokens
    home = CentroidHead.from_arrays(np.zeros((3, 1), np.float32), ordering).token_to_centroid
    assert home.tolist() == [0, 1, 2, 1, 2, 0]


def test_coverage_heatmap_by_hand() -> None:
    # counts of tests/test_coverage.py's hand-made trace (centroid_coverage itself is tested there)
    cov = model_views.Coverage(np.array([2, 2, 2]), np.array([2, 1, 1]), np.array([0, 1, 1]))
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
    return model_views.inventory_frame(es)


def test_inventory_frame_and_filters() -> None:
    df = _inv()
    assert df.loc[0, "ne"] == "8×100" and df.loc[0, "shape"] == "100×8"
    assert model_views.filter_inventory(df, "blk.1.*")["name"].tolist() == ["blk.1.attn_q.weight", "blk.1.attn_norm.weight"]
    assert model_views.filter_inventory(df, "attn_q")["name"].tolist() == ["blk.0.attn_q.weight", "blk.1.attn_q.weight"]
    assert model_views.filter_inventory(df, focus=True)["name"].tolist() == ["mtp.pre_projection.weight"]
    assert len(model_views.filter_inventory(df, layers=[1], types=["F32"])) == 1
    assert model_views.filter_inventory(df, components=["norm", "projection"])["name"].tolist() == [
        "mtp.pre_projection.weight", "blk.1.attn_norm.weight"]


def test_grid_findings_and_verdict_line() -> None:
    """The layer grid's missing / wrong-shape names come from the findings' codes; the verdict line counts
    errors and warnings and names the first error."""
    from mtpscope.inspector.findings import ERROR, WARNING, Report, Verdict, finding

    fs = (finding(ERROR, "E_TENSOR_MISSING", "blk.1.ffn_up.weight", "present", "absent", "missing"),
          finding(ERROR, "E_CENTROID_TRANSPOSED", "mtp.centroids.weight", [8, 4], [4, 8], "transposed"),
          finding(ERROR, "E_PROJ_SHAPE", "mtp.pre_projection.weight", [8, 32], [8, 16], "bad"),
          finding(WARNING, "W_KEY_MISSING", "x.key", 1, None, "absent"),
          finding(ERROR, "E_TENSOR_MISSING", "", "present", "absent", "no subject"))
    rep = Report("fork", False, fs, (Verdict("llama.cpp (upstream)", False, ("r",), "b"),))
    assert model_views.grid_findings(rep) == (["blk.1.ffn_up.weight"],
                                              ["mtp.centroids.weight", "mtp.pre_projection.weight"])
    assert model_views.verdict_line(rep) == (
        "✗ invalid fork file: 4 errors, 1 warning · llama.cpp does not load · "
        "first error: E_TENSOR_MISSING blk.1.ffn_up.weight: missing")


def test_manifest_fields_tolerate_malformed_entries() -> None:
    m = {"models": {"target": {"path": "/m/t.gguf"}, "assistant": "not an object", "centroids": {"path": ""}},
         "prompts": [{"prompt_id": "3", "text": "hi"}, {"text": "no id"}, 7]}
    assert views.model_path(m, "target") == "/m/t.gguf"
    assert views.model_path(m, "assistant") is None and views.model_path(m, "centroids") is None
    assert list(views.manifest_models(m)) == ["target", "centroids"]
    assert views.manifest_prompts(m) == [{"prompt_id": 3, "text": "hi"}]
    assert views.manifest_models({"models": [1]}) == {} and views.manifest_prompts({}) == []


def test_treemap_sums_bytes() -> None:
    fig = charts.treemap_figure(_inv())
    t = fig.data[0]
    vals = dict(zip(t.ids, t.values))
    assert vals["all"] == 850 + 512 + 128 + 128 + 32
    assert vals["c/attention"] == 256 and vals["c/attention/F16"] == 256


def test_layer_grid_statuses() -> None:
    present = [("blk.0.attn_q.weight", (8, 8)), ("blk.1.attn_q.weight", (8, 8)), ("token_embd.weight", (1, 1))]
    g = model_views.layer_grid(present, missing=["blk.1.ffn_up.weight"], wrong_shape=["blk.0.attn_q.weight"])
    got = {(r.layer, r.tensor): r.status for r in g.itertuples()}
    assert got == {(0, "attn_q"): "wrong shape", (1, "attn_q"): "present", (1, "ffn_up"): "missing"}
    fig = charts.layer_grid_figure(g)
    z = np.asarray(fig.data[0].z, dtype=float)
    # x = [attn_q, ffn_up], y = [blk.0, blk.1]; codes present 0, wrong shape 1, missing 2
    assert z[0, 0] == 1 and z[1, 0] == 0 and z[1, 1] == 2 and np.isnan(z[0, 1])


# ------------------------------------------------------------------------------------- compare

def test_prompt_deltas_by_pairs() -> None:
    a = _rounds([[3, 1, 2], [0]])
    b = _rounds([[0], [3, 2, 2]])  # B's prompt 1 is A's prompt 0 (paired by text, say), B's 0 is A's 1
    deltas = views.prompt_deltas(views.per_prompt_table(a), views.per_prompt_table(b), pairs=[(0, 1), (1, 0)])
    row = deltas.set_index("prompt_id")
    assert row.loc[0, "delta_rate"] == pytest.approx(7 / 9 - 6 / 9)
    assert row.loc[1, "delta_rate"] == pytest.approx(0.0)
    same_ids = views.prompt_deltas(views.per_prompt_table(a), views.per_prompt_table(b)).set_index("prompt_id")
    assert same_ids.loc[0, "delta_rate"] == pytest.approx(0 / 3 - 6 / 9)


def test_step_table_and_top_candidates() -> None:
    steps = pd.DataFrame({"prompt_id": [0, 0, 0], "round": [0, 0, 0], "k": [2, 1, 3], "token": [7, 5, 9],
                          "top_ids": [[7, 8], [5, 6], [9, 4]], "top_logits": [[2.0, 1.0], [3.0, 0.5], [1.0, 0.2]],
                          "target_token": [8, 5, 4], "target_rank": [1, 0, 1], "accepted": [False, True, False],
                          "centroid_ids": [[1, 2], [3], [2]], "target_in_candidates": [False, True, False],
                          "target_centroid": [4, 3, 2], "target_centroid_rank": [40, 0, 0]})
    s = round_views.round_steps(steps, 0, 0)
    assert s["k"].tolist() == [1, 2, 3]
    t = round_views.step_table(s, lambda i: f"t{i}")
    assert t["drafted"].tolist() == ["t5", "t7", "t9"]
    assert t["verdict"].tolist() == ["✓ accepted", "✗ rejected", "– not checked"]
    # the step after the first rejection was never judged: no target, no rank, no reachability
    assert t["target"].tolist() == ["t5", "t8", "—"] and t["target_id"].isna().tolist() == [False, False, True]
    assert t["centroid_head"].tolist() == ["reachable", "would be unreachable", "—"]
    assert t["target_centroid"].tolist() == ["3 (rank 0)", "4 (rank 40)", "—"]
    assert round_views.reachability_words(False) == "would be unreachable with the centroid head"
    assert round_views.step_table(s, None, head="centroid")["centroid_head"].tolist()[:2] == ["reachable", "unreachable"]
    top = round_views.top_candidates(s.iloc[1].to_dict(), lambda i: f"t{i}")
    assert top["is_target"].tolist() == [False, True] and top["is_draft"].tolist() == [True, False]
    fig = charts.top_candidates_figure(top, 2)
    assert list(fig.data[0].marker.color) == ["#1f77b4", "#2ca02c"]


def test_top_candidate_axis_shows_the_gap_behind_a_rejection() -> None:
    """A near tie: the drafter drafted 12.0 and the target's token scored 11.2 (0.8 logits behind). From 0 the
    two bars would differ by 0.8 / 12 = 7 % of the axis; the axis spans the logits shown (3.0 to 12.0 plus a
    margin of 15 % of their 9.0 span on each side: 1.65 to 13.35), so the gap is 0.8 / 11.7 = 6.8 % of it and
    every bar ends at its own logit."""
    step = {"token": 5, "top_ids": [5, 9, 7], "top_logits": [12.0, 11.2, 3.0], "target_token": 9, "target_rank": 1}
    top = round_views.top_candidates(step, lambda i: f"t{i}")
    fig = charts.top_candidates_figure(top, 1)
    lo, hi = fig.layout.xaxis.range
    assert (lo, hi) == pytest.approx((3.0 - 1.35, 12.0 + 1.35))
    assert lo > 0
    bar = fig.data[0]
    assert [b + x for b, x in zip(bar.base, bar.x)] == pytest.approx([12.0, 11.2, 3.0])
    assert fig.layout.meta["gap"] == pytest.approx(0.8)
    assert "0.80 logits behind" in fig.layout.annotations[0].text
    # a tie with nothing else: the axis is still 0.5 logits wide around it, not empty
    tie = charts.logit_axis_range([4.0, 4.0])
    assert tie == pytest.approx((4.0 - 0.25 - 0.075, 4.0 + 0.25 + 0.075))
    assert charts.logit_axis_range([float("nan")]) == (0.0, 1.0)


def test_target_bar_past_the_stored_top() -> None:
    step = {"token": 5, "top_ids": [5, 6, 7], "top_logits": [3.0, 2.0, 1.0], "target_token": 9, "target_rank": 13}
    top = round_views.top_candidates(step, lambda i: f"t{i}")
    assert top["id"].tolist() == [5, 6, 7, 9] and top["is_target"].tolist() == [False, False, False, True]
    assert top["stored"].tolist() == [True, True, True, False] and int(top["rank"].iloc[3]) == 13
    fig = charts.top_candidates_figure(top, 1)
    assert list(fig.data[0].y)[3] == "13. t9"
    ends = [b + x for b, x in zip(fig.data[0].base, fig.data[0].x)]
    assert ends == pytest.approx([3.0, 2.0, 1.0, 1.0])  # drawn up to the last stored logit, its upper bound
    assert list(fig.data[0].marker.pattern.shape) == ["", "", "", "/"]
    assert fig.layout.meta["target_rows"] == [3] and fig.data[0].marker.color[3] == "#2ca02c"
    unknown = round_views.top_candidates({**step, "target_rank": None}, None)
    assert charts.top_candidates_figure(unknown, 1).data[0].y[3] == "?. #9"
    assert len(round_views.top_candidates({**step, "target_token": None}, None)) == 3


def test_generated_text_layout_by_hand() -> None:
    from mtpscope.traces.analysis.positions import positions

    # prompt 0: round 0 accepts 1 of 3 (then the target's 901), round 1 accepts 3 of 3 (then its bonus 903)
    pos = positions(_rounds([[1, 3]]))
    lay = round_views.generated_text(pos, 0, lambda i: f"t{i}", width=10)
    assert lay["token"].tolist() == [1, 100, 901, 100, 101, 102, 903]
    assert lay["status"].tolist() == ["prefill", "accepted", "rejected", "accepted", "accepted", "accepted", "bonus"]
    assert lay["round"].tolist() == [0, 0, 0, 1, 1, 1, 1] and lay["k"].tolist() == [0, 1, 2, 1, 2, 3, 0]
    # widths 2, 4, 4, ... in lines of 10 characters
    assert lay["line"].tolist() == [0, 0, 0, 1, 1, 2, 2] and lay["col"].tolist() == [0, 2, 6, 0, 4, 0, 4]
    fig = charts.text_figure(lay, width=10, highlight_round=1)
    rej = next(t for t in fig.data if t.name == round_views.TEXT_STATUS_WORDS["rejected"])
    assert [list(c) for c in rej.customdata] == [[0, 2, 2]] and list(rej.text) == ["t901"]
    acc = next(t for t in fig.data if t.name == round_views.TEXT_STATUS_WORDS["accepted"])
    assert list(acc.marker.line.width) == [0.5, 2.5, 2.5, 2.5]  # round 1 outlined
    assert fig.layout.meta == {"n_tokens": 7, "n_lines": 3, "colour_by": "status"}
    assert round_views.round_position(pos, 0, 1) == 3
    assert round_views.generated_text(pos, 9, str).empty


def test_replay_for_round_names_the_variants_that_would_draft_the_target() -> None:
    rs = pd.DataFrame({"prompt_id": [0, 0, 1], "round": [2, 2, 2], "k": [2, 1, 1], "recorded": [5, 4, 4],
                       "truth": [6, 4, -1], "draft[baseline]": [5, 4, 4], "draft[head=centroid]": [6, 3, 4]})
    t = round_views.replay_for_round(rs, 0, 2, ["baseline", "head=centroid"], lambda i: f"t{i}")
    assert t["k"].tolist() == [1, 2]
    assert t["would_draft_target"].tolist() == ["baseline", "head=centroid"]
    assert t["head=centroid"].tolist() == ["t3", "✓ t6"]
    assert round_views.replay_for_round(rs, 1, 2, ["baseline"])["would_draft_target"].tolist() == ["?"]


def test_explain_figures() -> None:
    fig = charts.causes_figure({"near_tie": 3, "runner_up": 0, "far_miss": 1})
    assert list(fig.data[0].x) == ["near tie", "far miss"] and list(fig.data[0].y) == [3, 1]
    assert list(fig.data[0].text) == ["3 (75%)", "1 (25%)"]
    h = charts.rank_histogram_figure({"0": 0, "1": 4, "10+": 2})
    assert list(h.data[0].y) == [0, 4, 2]
    from mtpscope.traces.analysis.breakdown import Acceptance
    from mtpscope.traces.analysis.what_if import WhatIfRow

    rows = [WhatIfRow(n_draft=n, acceptance_rate=1 - n / 10, mean_acceptance_length=1.0, tokens_per_s=10.0 + n,
                      speedup=1.0, recorded=n == 2, extrapolated=n > 2) for n in (1, 2, 3)]
    w = charts.what_if_figure(rows, best=3)
    assert list(w.data[0].marker.symbol) == ["circle", "star", "circle-open"] and list(w.data[1].y) == [11, 12, 13]
    g = charts.rate_bars_figure({"prose": Acceptance(n_drafted=4, n_accepted=3, acceptance_rate=0.75),
                                 "code": Acceptance(n_drafted=2, n_accepted=0, acceptance_rate=0.0)}, "t")
    assert list(g.data[0].x) == ["code", "prose"] and list(g.data[0].text) == ["0/2", "3/4"]


def test_pure_modules_do_not_import_streamlit() -> None:
    import subprocess
    import sys

    code = ("import sys; import mtpscope.app.charts, mtpscope.app.views, mtpscope.app.round_views, "
            "mtpscope.app.model_views, mtpscope.app.safety, mtpscope.app.tokens; print('streamlit' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    assert out.stdout.strip() == "False", out.stderr


def test_drift_figure_whole_scales_and_acceptance_by_cosine() -> None:
    from mtpscope.traces.analysis.drift import Drift, DriftPosition, DriftQuantile
    from mtpscope.traces.analysis.what_if import WhatIfRow

    dr = Drift(n_steps=20, cos_mean=-0.065, rel_err_mean=1.05,
               per_position=(DriftPosition(k=1, n_steps=10, cos_mean=-0.05, rel_err_mean=1.04, split=True,
                                           cos_mean_accepted=-0.04, cos_mean_rejected=-0.06),
                             DriftPosition(k=2, n_steps=10, cos_mean=-0.08, rel_err_mean=1.06, split=True,
                                           cos_mean_accepted=None, cos_mean_rejected=-0.08)),
               by_quantile=(DriftQuantile(cos_low=-0.3, cos_high=-0.1, n_steps=10, acceptance_rate=0.2),
                            DriftQuantile(cos_low=-0.1, cos_high=0.2, n_steps=10, acceptance_rate=0.3)))
    f = charts.drift_figure(dr)
    # a cosine axis over [-1, 1] and a relative error from 0: values near 0 / 1 do not fill the panel
    assert tuple(f.layout.yaxis.range) == (-1.05, 1.05) and f.layout.yaxis2.range[0] == 0
    assert f.layout.yaxis2.range[1] >= 1.5
    bars = [d for d in f.data if d.type == "bar"]
    assert list(bars[0].y) == [0.2, 0.3] and list(bars[0].x) == ["-0.30..-0.10", "-0.10..0.20"]
    w = charts.what_if_figure([WhatIfRow(n_draft=1, acceptance_rate=0.5, mean_acceptance_length=None, tokens_per_s=10.0,
                                         speedup=None, recorded=True, extrapolated=False,
                                         acceptance_rate_interval=(0.4, 0.6), tokens_per_s_interval=(9.0, 12.0))],
                              plain=20.0)
    assert list(w.data[1].error_y.array) == [2.0] and list(w.data[1].error_y.arrayminus) == [1.0]
    assert any(s.y0 == 20.0 for s in w.layout.shapes)
