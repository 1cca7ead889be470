"""The Sweep page (app/screens/sweep.py) and its figure (app.charts.sweep_heatmap) on a small synthetic
sweep: the heatmap holds the cells' values, the page shows them, and a cell opens its trace in the
Acceptance page."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest

from mtpscope.app import selection

MAIN = str(Path(__file__).resolve().parent.parent / "app" / "main.py")


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mtpscope.traces.synthetic import write_synthetic_sweep

    return write_synthetic_sweep(tmp_path_factory.mktemp("app_sweep") / "sw", n_rounds=3000, assistants=("q8", "q4"),
                                 n_drafts=(2, 3), n_shards=2, n_prompts=6, categories=("code", "prose", "math"),
                                 steps=True, seed=5)


def test_heatmap_holds_the_cells(sweep_dir: Path) -> None:
    from mtpscope.app import charts
    from mtpscope.traces.sweep.reader import open_sweep

    cells = open_sweep(sweep_dir).cells()
    for label, (col, _, _) in charts.SWEEP_VALUES.items():
        fig = charts.sweep_heatmap(cells, label)
        h = fig.data[0]
        rows, cols = fig.layout.meta["rows"], fig.layout.meta["columns"]
        assert rows == [["q8", 2], ["q8", 3], ["q4", 2], ["q4", 3], ["baseline", 0]]
        assert cols == ["all", "code", "prose", "math"]
        z = np.asarray(h.z, dtype=float)
        for r in cells.to_dict("records"):
            i, j = rows.index([r["assistant"], r["n_draft"]]), cols.index(r["category"])
            v = r[col]
            assert (math.isnan(z[i, j]) and (v is None or math.isnan(v))) or z[i, j] == pytest.approx(v)
            assert list(h.customdata[i][j]) == [r["assistant"], r["n_draft"], r["category"]]
        assert (h.zmid == 1.0) == (col == "speedup")
    assert "no finished task" in charts.sweep_heatmap(cells.iloc[0:0]).layout.annotations[0].text


def test_sweep_page_and_opening_a_cell(sweep_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mtpscope.traces.sweep.reader import open_sweep

    monkeypatch.setenv("MTPSCOPE_ROOTS", str(sweep_dir.parent))
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.session_state[selection.SEL_SWEEP] = str(sweep_dir)
    at.run()
    at.switch_page("screens/sweep.py").run()
    assert not at.exception, [e.value for e in at.exception]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["tasks"] == "10" and metrics["done"] == "10" and metrics["failed"] == "0"
    # the page's recommendation is the CLI's (`mtpscope report DIR --json`), word for word
    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    rep = __import__("json").loads(CliRunner().invoke(app, ["report", str(sweep_dir), "--json"]).stdout)
    boxes = [b.value for b in (*at.success, *at.warning)]
    assert any(rep["recommendation"]["reason"] in b for b in boxes), boxes
    at.selectbox(key=selection.SWEEP_CONFIG).set_value("q4 · n_draft 3")
    at.selectbox(key=selection.SWEEP_CATEGORY).set_value("code")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    cells = open_sweep(sweep_dir).cells()
    r = cells[(cells["assistant"] == "q4") & (cells["n_draft"] == 3) & (cells["category"] == "code")].iloc[0]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["acceptance rate"] == f"{100 * r['acceptance_rate']:.1f} %"
    assert metrics["speedup"] == f"{r['speedup']:.3f}"
    assert at.selectbox(key=selection.SWEEP_SHARD).options == ["shard 0 (1 prompt of this category)",
                                                         "shard 1 (1 prompt of this category)"]
    at.selectbox(key=selection.SWEEP_SHARD).set_value(1)
    at.run()
    at.button(key=selection.sweep_open_key("acceptance")).click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state[selection.slot_key(selection.TRACE)] == str(sweep_dir / "assistant=q4" / "n_draft=3" / "shard=1")
    assert [t.value for t in at.title] == ["Acceptance"]


def test_sweep_page_refuses_paths_outside_the_roots(sweep_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    monkeypatch.setenv("MTPSCOPE_ROOTS", str(tmp_path))
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.session_state[selection.SEL_SWEEP] = str(sweep_dir)
    at.run()
    at.switch_page("screens/sweep.py").run()
    assert not at.exception
    assert any("allowed" in e.value or "outside" in e.value for e in at.error), [e.value for e in at.error]
    assert not at.metric
