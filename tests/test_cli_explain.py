"""`mtpscope explain`, `mtpscope compare` and `report --json`'s explanation keys through the real typer app,
on the demo traces (recorded by the real llama.cpp). Expected numbers are recomputed here straight from the
Parquet parts with pyarrow, not through mtpscope's analysis."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from mtpscope.cli.main import app

runner = CliRunner()


@pytest.fixture(scope="module")
def noisy(demo_dir) -> Path:
    p = Path(demo_dir.traces_noisy)
    if not (p / "manifest.json").exists():
        pytest.skip("demo traces need llama-cpp-python")
    return p


def _table(trace: Path, name: str):
    m = json.loads((trace / "manifest.json").read_text())
    import pyarrow as pa

    return pa.concat_tables([pq.read_table(trace / name / f) for f in m["parts"][name]])


def test_explain_json_keys_and_values(noisy: Path) -> None:
    res = runner.invoke(app, ["explain", str(noisy), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    rounds = _table(noisy, "rounds").to_pydict()
    steps = _table(noisy, "steps").select(["prompt_id", "round", "k", "target_rank"]).to_pydict()
    rank = {(p, r, k): t for p, r, k, t in zip(steps["prompt_id"], steps["round"], steps["k"], steps["target_rank"])}
    fm = [(p, r, na + 1) for p, r, nd, na in zip(rounds["prompt_id"], rounds["round"], rounds["n_draft"],
                                                 rounds["n_accepted"]) if na < nd]
    rej = d["rejections"]
    assert rej["n_first_mismatch"] == len(fm) == 36
    hist = dict.fromkeys([str(i) for i in range(10)] + ["10+"], 0)
    for key in fm:
        hist[str(rank[key]) if rank[key] < 10 else "10+"] += 1
    assert rej["rank_histogram"] == hist
    assert sum(rej["causes"].values()) == len(fm)
    # every draft lands in exactly one class: the classes add up to the drafted total
    n_drafted = sum(rounds["n_draft"])
    assert sum(v["n_drafted"] for v in d["by_class"].values()) == n_drafted
    assert sum(v["n_accepted"] for v in d["by_class"].values()) == sum(rounds["n_accepted"])
    assert d["by_category"] is None and d["drift"] is None
    wi = d["what_if"]
    assert [r["n_draft"] for r in wi] == list(range(1, 9))
    rec = [r for r in wi if r["recorded"]]
    assert len(rec) == 1 and rec[0]["n_draft"] == 3
    assert rec[0]["acceptance_rate"] == pytest.approx(sum(rounds["n_accepted"]) / n_drafted, abs=1e-12)
    assert set(wi[0]) >= {"n_draft", "acceptance_rate", "mean_acceptance_length", "tokens_per_s", "speedup"}


def test_report_json_carries_the_sections(noisy: Path) -> None:
    res = runner.invoke(app, ["report", str(noisy), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    for key in ("rejections", "by_class", "by_category", "drift", "what_if", "per_position", "acceptance_rate"):
        assert key in d
    assert d["rejections"]["n_first_mismatch"] == 36


def test_explain_text_and_prompt(noisy: Path) -> None:
    res = runner.invoke(app, ["explain", str(noisy), "--prompt", "2"])
    assert res.exit_code == 0, res.output
    assert "Why drafts were rejected" in res.stdout and "Which n_draft?" in res.stdout
    assert "First mismatches of this prompt:" in res.stdout and "round 0 k=" in res.stdout
    bad = runner.invoke(app, ["explain", str(noisy), "--prompt", "nope"])
    assert bad.exit_code == 2 and "no such prompt" in bad.stderr
    # each acceptance table's column names end where its numbers end (a long title pushed them right before)
    lines = runner.invoke(app, ["explain", str(noisy)]).stdout.splitlines()
    heads = [i for i, ln in enumerate(lines) if ln.startswith("Acceptance by ") and ln.endswith("(worst first)")]
    assert heads
    for i in heads:
        cols, row = lines[i + 1], lines[i + 2]
        assert cols.rstrip().endswith("acceptance rate") and len(cols.rstrip()) == len(row.rstrip()), (cols, row)
        assert cols.index("drafted") + len("drafted") == len(row[:row.index(row.split()[-3]) + len(row.split()[-3])])


def test_compare_clean_vs_noisy(demo_dir, noisy: Path) -> None:
    clean = Path(demo_dir.traces_clean)
    res = runner.invoke(app, ["compare", str(clean), str(noisy), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["paired_by"] == "text" and d["n_pairs"] == 5 and d["outputs_identical"]
    ra, rb = _table(clean, "rounds").to_pydict(), _table(noisy, "rounds").to_pydict()

    def rate(r: dict[str, list[int]]) -> float:
        return sum(r["n_accepted"]) / sum(r["n_draft"])

    assert d["delta"]["all"]["delta"] == pytest.approx(rate(rb) - rate(ra))
    lo, hi = d["delta"]["all"]["ci_low"], d["delta"]["all"]["ci_high"]
    assert lo <= d["delta"]["all"]["delta"] <= hi
    # the clean drafter accepts everything: nothing is accepted in B and rejected in A
    assert d["b_only"]["n"] == 0 and d["a_only"]["n"] > 0
    # positions B rejected = rounds of B with a mismatch whose position A accepted (A never rejects)
    n_rej_b = int(np.sum(np.array(rb["n_accepted"]) < np.array(rb["n_draft"])))
    assert d["a_only"]["n"] + d["status_counts"].get("bonus/rejected", 0) == n_rej_b


def test_compare_unreadable(tmp_path: Path, noisy: Path) -> None:
    res = runner.invoke(app, ["compare", str(tmp_path / "missing"), str(noisy)])
    assert res.exit_code == 2 and "not a trace directory" in res.stderr


def test_explain_by_request_on_a_recording_gives_each_prompts_speed(noisy: Path) -> None:
    """A recording seen request by request carries each prompt's tokens/s: its emitted tokens over its rounds'
    draft + verify time (the definition `report` uses for the whole trace), recomputed here from the parts."""
    from mtpscope.cli.server import request_view
    from mtpscope.traces.store.reader import open_trace

    r = _table(noisy, "rounds").to_pandas()
    want = {int(p): 1000.0 * sum(len(e) for e in g["emitted"]) / float(g["t_draft_ms"].sum() + g["t_verify_ms"].sum())
            for p, g in r.groupby("prompt_id")}
    t = request_view(open_trace(noisy)).table
    got = dict(zip(t["request"].astype(int), t["tokens_per_s"].astype(float), strict=True))
    assert set(got) == set(want) and all(abs(got[p] - want[p]) <= 1e-9 * want[p] for p in want), (got, want)
    res = runner.invoke(app, ["explain", str(noisy), "--by", "request"])
    assert res.exit_code == 0 and ", - tokens/s" not in res.stdout, res.output
    # the headline's rate is report's (all emitted tokens over all draft + verify time, from the parts here), the
    # mean of the prompts' own rates beside it: the two numbers say which is which
    pooled = 1000.0 * sum(len(e) for e in r["emitted"]) / float(r["t_draft_ms"].sum() + r["t_verify_ms"].sum())
    mean = sum(want.values()) / len(want)
    assert f"{pooled:.1f} tokens/s (all tokens / all generation time; the mean of the requests' own rates: " \
           f"{mean:.1f})" in res.stdout, res.stdout
    rep = runner.invoke(app, ["report", str(noisy)])
    assert f"; {pooled:.1f} tokens/s (emitted tokens / draft + verify time" in rep.stdout, rep.stdout
    # accepted per draft position over the rounds that drafted (llama-server's acc per pos): the same in both
    nd, na = r["n_draft"].to_numpy(), r["n_accepted"].to_numpy()
    n_verify = int((nd > 0).sum())
    for k in range(1, int(nd.max()) + 1):
        acc = int((na >= k).sum())
        assert f"k={k} {acc} of {n_verify} rounds ({acc / n_verify:.3f})" in res.stdout, res.stdout
        row = next(ln.split() for ln in rep.stdout.splitlines() if ln.split()[:2] == [str(k), str(int((nd >= k).sum()))])
        assert row[-1] == f"{acc / n_verify:.4f}", row


def test_compare_names_what_differs_between_the_runs(demo_dir) -> None:
    """`compare` of the trained demo's f32 and buggy traces names the cause before the numbers: the drafter
    metadata key that differs, with both files' values as gguf-py reads them; --json carries the same rows."""
    import gguf  # gguf-py: the values read independently of mtpscope's reader

    from mtpscope.demo.spec import TrainedPaths

    tp = TrainedPaths.under(demo_dir.root)
    if not all((d / "manifest.json").exists() for d in (tp.traces_f32, tp.traces_buggy)):
        pytest.skip("the trained demo traces were not recorded")
    key = "gemma4-assistant.rope.freq_base_swa"

    def value(path: Path) -> float:
        f = gguf.GGUFReader(str(path)).fields[key]
        return float(f.parts[f.data[0]][0])

    want = f"  drafter metadata {key}: A {value(tp.drafter)}, B {value(tp.drafter_buggy)}"
    res = runner.invoke(app, ["compare", str(tp.traces_f32), str(tp.traces_buggy)])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[2].startswith("runs differ in ") and want in lines, res.stdout
    j = json.loads(runner.invoke(app, ["compare", str(tp.traces_f32), str(tp.traces_buggy), "--json"]).stdout)
    assert {"what": "drafter metadata", "name": key, "A": str(value(tp.drafter)), "B": str(value(tp.drafter_buggy))} \
        in j["run_differences"]
    same = runner.invoke(app, ["compare", str(tp.traces_f32), str(tp.traces_f32)])
    assert "runs: same parameters and models" in same.stdout.splitlines()
    # one runtime, one convention: the rounds' first differences are one line, not one "no known convention" line
    # per prompt (a fresh user found 36 of them burying the metadata line above); --json keeps each prompt's
    n = sum(1 for d in j["runtimes"]["prompts"] if d["what"] == "drafts" and not d["cause"])
    assert n > 1 and "no known convention explains it" not in res.stdout
    assert f"  {n} prompts: the drafts differ in the first differing round with no convention" in res.stdout
