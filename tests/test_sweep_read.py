"""Reading a sweep as one dataset (traces/sweep/reader.py) and ``mtpscope report DIR`` on a sweep, on a
small synthetic sweep. Expected values are computed straight from the Parquet files with pyarrow and
numpy (not through our DuckDB views). No Ray, no llama.cpp."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from mtpscope.errors import TraceFormatError
from mtpscope.traces.sweep.reader import CELL_COLUMNS, open_sweep
from mtpscope.traces.synthetic import write_synthetic_sweep

CATS = ("code", "math", "prose")


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_sweep(tmp_path_factory.mktemp("sw") / "sweep", n_rounds=6000, assistants=("q8", "q4"),
                                 n_drafts=(2, 4), n_shards=2, n_prompts=9, categories=CATS, steps=True, seed=3)


def _expected(path: Path) -> dict[tuple[str, int, str], dict[str, float]]:
    """Per (assistant, n_draft, category) sums, from the files: pyarrow reads each task's parts."""
    st = json.loads((path / "sweep.json").read_text())
    cat = {(p["shard"], p["prompt_id"]): p["category"] for p in st["prompts"]}
    acc: dict[tuple[str, int, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for t in st["tasks"]:
        if t["state"] != "done":
            continue
        d = path / t["dir"]
        man = json.loads((d / "manifest.json").read_text())
        files = [d / "rounds" / f for f in man["parts"]["rounds"]] if man.get("parts") else sorted((d / "rounds").glob("part-*.parquet"))
        for f in files:
            tb = pq.read_table(f).to_pydict()
            for i in range(len(tb["prompt_id"])):
                c = cat[(t["shard"], tb["prompt_id"][i])]
                for key in ((t["assistant"], t["n_draft"], c), (t["assistant"], t["n_draft"], "all")):
                    a = acc[key]
                    a["n_rounds"] += 1
                    a["nd"] += len(tb["drafted"][i])
                    a["na"] += tb["n_accepted"][i]
                    a["nv"] += 1 if len(tb["drafted"][i]) else 0
                    a["ne"] += len(tb["emitted"][i])
                    a["t"] += tb["t_draft_ms"][i] + tb["t_verify_ms"][i]
                    a.setdefault("prompts", set()).add(tb["prompt_id"][i] * 100 + t["shard"])  # type: ignore[attr-defined]  # "prompts" is the one set among the int counters
    return acc


def test_cells_match_the_files(sweep_dir: Path) -> None:
    sw = open_sweep(sweep_dir)
    cells = sw.cells()
    exp = _expected(sweep_dir)
    assert list(cells.columns) == list(CELL_COLUMNS)
    assert len(cells) == len(exp) == (2 * 2 + 1) * (len(CATS) + 1)
    base_tps = {k[2]: v["ne"] / (v["t"] / 1e3) for k, v in exp.items() if k[0] == "baseline"}
    for row in cells.to_dict("records"):
        e = exp[(row["assistant"], row["n_draft"], row["category"])]
        assert row["n_rounds"] == e["n_rounds"]
        assert row["n_drafted"] == e["nd"] and row["n_accepted"] == e["na"]
        assert row["n_prompts"] == len(e["prompts"])
        tps = e["ne"] / (e["t"] / 1e3)
        assert row["tokens_per_s"] == pytest.approx(tps, rel=1e-12)
        assert row["speedup"] == pytest.approx(tps / base_tps[row["category"]], rel=1e-12)
        if row["assistant"] == "baseline":
            assert e["nd"] == 0 and math.isnan(row["acceptance_rate"]) and math.isnan(row["mean_acceptance_length"])
        else:
            assert row["acceptance_rate"] == pytest.approx(e["na"] / e["nd"], rel=1e-12)
            assert row["mean_acceptance_length"] == pytest.approx(1 + e["na"] / e["nv"], rel=1e-12)
    # order: assistants as given, the baseline last; n_draft ascending; "all" first
    assert list(dict.fromkeys(cells["assistant"])) == ["q8", "q4", "baseline"]
    assert list(cells["category"][:4]) == ["all", *CATS]


def test_hive_columns_and_round_n_draft(sweep_dir: Path) -> None:
    sw = open_sweep(sweep_dir)
    got = sw.sql("SELECT assistant, n_draft, shard, count(*) AS n, sum(CASE WHEN round_n_draft < n_draft "
                 "THEN 1 ELSE 0 END) AS short, max(round_n_draft) AS mx FROM rounds GROUP BY ALL ORDER BY ALL")
    st = json.loads((sweep_dir / "sweep.json").read_text())
    want = sorted((t["assistant"], t["n_draft"], t["shard"], t["n_rounds"]) for t in st["tasks"])
    assert [tuple(r) for r in got[["assistant", "n_draft", "shard", "n"]].itertuples(index=False)] == want
    mtp = got[got["assistant"] != "baseline"]
    # the synthetic drafter drafts fewer than n_draft in about 2 % of rounds: round_n_draft keeps those
    assert (mtp["mx"] == mtp["n_draft"]).all() and (mtp["short"] > 0).all()
    # the file's own n_draft column, read without hive partitioning, equals round_n_draft
    d = sweep_dir / "assistant=q8" / "n_draft=4" / "shard=1"
    f = sorted((d / "rounds").glob("*.parquet"))
    own = np.concatenate([pq.read_table(x, columns=["n_draft"])["n_draft"].to_numpy() for x in f])
    ours = sw.sql("SELECT round_n_draft FROM rounds WHERE assistant = 'q8' AND n_draft = 4 AND shard = 1 "
                  "ORDER BY prompt_id, round")["round_n_draft"].to_numpy()
    assert np.array_equal(np.sort(own), np.sort(ours))
    assert sw.sql("SELECT count(*) AS n FROM steps WHERE assistant = 'baseline'")["n"][0] == 0
    assert sw.sql("SELECT DISTINCT n_draft FROM steps ORDER BY 1")["n_draft"].tolist() == [2, 4]


def test_timeline_and_cell(sweep_dir: Path) -> None:
    from mtpscope.traces.analysis.metrics import totals
    from mtpscope.traces.store.reader import open_trace

    sw = open_sweep(sweep_dir)
    tl = sw.timeline("q4", 2, columns=("n_draft", "n_accepted", "pos"))
    assert list(tl.columns) == ["prompt_id", "round", "n_draft", "n_accepted", "pos"]
    # prompt set order, then round
    keys = list(zip(tl["prompt_id"], tl["round"], strict=True))
    assert keys == sorted(keys)
    st = json.loads((sweep_dir / "sweep.json").read_text())
    shard_of = {p["index"]: (p["shard"], p["prompt_id"]) for p in st["prompts"]}
    t0 = open_trace(sweep_dir / "assistant=q4/n_draft=2/shard=0").rounds
    t1 = open_trace(sweep_dir / "assistant=q4/n_draft=2/shard=1").rounds
    for gid in (0, 1, 4):
        s, pid = shard_of[gid]
        src = (t0 if s == 0 else t1)
        src = src[src["prompt_id"] == pid].sort_values("round")
        mine = tl[tl["prompt_id"] == gid]
        assert mine["n_accepted"].tolist() == src["n_accepted"].tolist()
        assert mine["n_draft"].tolist() == src["n_draft"].tolist()
    code = sw.timeline("q4", 2, category="code")
    assert set(code["prompt_id"]) == {p["index"] for p in st["prompts"] if p["category"] == "code"}
    with pytest.raises(TraceFormatError, match="unknown rounds column"):
        sw.timeline("q4", 2, columns=("nope",))

    cell = sw.cell("q4", 2)
    r = cell.rounds
    assert len(r) == len(t0) + len(t1)
    assert r[["prompt_id", "round", "n_draft", "n_accepted"]].reset_index(drop=True).equals(
        tl[["prompt_id", "round", "n_draft", "n_accepted"]].astype(r[["prompt_id", "round", "n_draft", "n_accepted"]].dtypes))
    assert totals(r).n_accepted == int(t0["n_accepted"].sum() + t1["n_accepted"].sum())
    assert [p["prompt_id"] for p in cell.manifest["prompts"]] == list(range(9))
    assert {p["category"] for p in cell.manifest["prompts"]} == set(CATS)
    assert len(cell.steps) == len(open_trace(t0_dir := sweep_dir / "assistant=q4/n_draft=2/shard=0").steps) + \
        len(open_trace(sweep_dir / "assistant=q4/n_draft=2/shard=1").steps)
    assert t0_dir.is_dir()
    q = cell.sql("SELECT prompt_id, count(*) AS n FROM rounds GROUP BY 1 ORDER BY 1")
    assert q["n"].tolist() == r.groupby("prompt_id").size().tolist()
    assert sw.sql("SELECT count(*) AS n FROM rounds")["n"][0] == 6000   # the main views are back
    one = sw.cell("q4", 2, shard=1)
    assert len(one.rounds) == len(t1)
    # a cell reads like a trace (traces.store.protocols.TraceLike): the analysis functions take it
    from mtpscope.traces.analysis.explain_report import step_columns
    from mtpscope.traces.analysis.metrics import report

    assert cell.schemas == one.schemas and "token" in step_columns(cell)
    assert report(cell).n_accepted == int(t0["n_accepted"].sum() + t1["n_accepted"].sum())


@pytest.mark.slow
def test_report_json_failed_and_incomplete(sweep_dir: Path, tmp_path: Path) -> None:
    import shutil

    d = tmp_path / "copy"
    shutil.copytree(sweep_dir, d)
    st = json.loads((d / "sweep.json").read_text())
    t = st["tasks"][1]
    t.update(state="failed", error="worker died 2 times; the runtime said: GGML_ASSERT(x) failed")
    st["complete"] = False
    (d / "sweep.json").write_text(json.dumps(st))
    sw = open_sweep(d)
    rep = sw.report().to_dict()      # the JSON `report DIR --json` prints (before the advice keys)
    assert rep["failed"] == [{"task": t["task"], "error": t["error"], "attempts": 1}]
    assert not rep["complete"] and rep["n_done"] == rep["n_tasks"] - 1
    # the failed task's rounds are left out of every aggregate
    all_q8 = [c for c in rep["cells"] if c["assistant"] == t["assistant"] and c["n_draft"] == t["n_draft"]
              and c["category"] == "all"][0]
    done_rounds = sum(x["n_rounds"] for x in st["tasks"] if x["assistant"] == t["assistant"]
                      and x["n_draft"] == t["n_draft"] and x["state"] == "done")
    assert all_q8["n_rounds"] == done_rounds
    for c in rep["cells"]:
        assert set(c) == set(CELL_COLUMNS)
    assert set(rep["best"]) == {"all", *CATS}
    for cat, k in rep["best"].items():
        cands = [c for c in rep["cells"] if c["category"] == cat and c["assistant"] != "baseline"]
        assert k == max(cands, key=lambda c: c["tokens_per_s"])["n_draft"]
    json.dumps(rep, allow_nan=False)
    with pytest.raises(TraceFormatError, match="has not finished"):
        sw.cell(t["assistant"], t["n_draft"])

    # the CLI: `mtpscope report DIR` on a sweep; exit 1 because a task failed
    run = subprocess.run([sys.executable, "-m", "mtpscope.cli", "report", str(d), "--json"],
                         capture_output=True, text=True)
    assert run.returncode == 1, run.stderr
    assert json.loads(run.stdout)["failed"][0]["task"] == t["task"]
    run = subprocess.run([sys.executable, "-m", "mtpscope.cli", "report", str(sweep_dir)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "Recommendation:" in run.stdout and "speedup" in run.stdout
    (d / "sweep.json").write_text("{")
    run = subprocess.run([sys.executable, "-m", "mtpscope.cli", "report", str(d)], capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "sweep.json" in run.stderr


def test_a_sweep_with_nothing_finished(sweep_dir: Path, tmp_path: Path) -> None:
    import shutil

    d = tmp_path / "fresh"
    shutil.copytree(sweep_dir, d)
    st = json.loads((d / "sweep.json").read_text())
    for t in st["tasks"]:
        t["state"] = "pending"
    (d / "sweep.json").write_text(json.dumps(st))
    sw = open_sweep(d)
    assert sw.cells().empty and list(sw.cells().columns) == list(CELL_COLUMNS)
    assert sw.timeline("q8", 2).empty
    assert sw.sql("SELECT count(*) AS n FROM steps")["n"][0] == 0
    rep = sw.report()
    assert rep.cells == () and rep.best == {} and not rep.complete
