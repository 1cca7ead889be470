"""``mtpscope replay``: recompute a recorded trace's draft steps with the reference drafter.

Traces are recorded here by the real recorder (llama.cpp) on tiny pairs with a 4096-token slice of
the real tokenizer; the baseline variant must reproduce every recorded draft, and its would-be
acceptance must equal the recorder's own counts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

from mtpscope.errors import TraceError
from mtpscope.inspector.reference import ReferenceDrafterError
from mtpscope.traces.run.replay import BASELINE_CPU, BASELINE_GPU, baseline_for, replay
from tests.numerics import assert_replay_faithful, check_emulated_chain

pytestmark = pytest.mark.llama


@pytest.fixture(scope="module")
def demo_trace(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from mtpscope.demo import build as demo
    from mtpscope.demo.vocab import load_vocab
    from mtpscope.traces.run.record_config import RecordConfig
    from mtpscope.traces.run.recorder import record

    voc = load_vocab("subset")
    d = tmp_path_factory.mktemp("demo")
    t = demo.write_target(d / "target.gguf", vocab=voc)
    dr = demo.write_drafter(d / "drafter.gguf", vocab=voc, noise=1.5)
    fork = demo.write_drafter(d / "drafter-fork.gguf", vocab=voc, noise=1.5, dialect="fork", centroid_misplace=0.5,
                              centroid_top_k=2)  # 2 of 32 centroids: the sparse head really restricts
    words = demo.DEMO_PASSAGE.split()
    record(RecordConfig(max_tokens=40, centroids=fork, hidden="f32"), target=t, assistant=dr, out=d / "trace",
           prompts=[" ".join(words[:5]), " ".join(words[7:12])])
    return {"target": t, "drafter": dr, "fork": fork, "trace": d / "trace"}


def test_baseline_reproduces_recorded_drafts(demo_trace: dict[str, Path], tmp_path: Path) -> None:
    from mtpscope import traces

    tr = traces.open(demo_trace["trace"])
    res = replay(demo_trace["trace"], variants=["hidden=prenorm", "head=centroid,fill=min-1"], out=tmp_path / "r")
    s = res.summary().to_dict()
    assert s["n_rounds"] == len(tr.rounds) and s["n_steps"] == len(tr.steps)
    base = s["variants"]["baseline"]
    assert_replay_faithful(s, "demo trace")
    # the rule can fail: a baseline fed the pre-norm hidden state drafts what the numerics cannot explain
    wrong = replay(demo_trace["trace"], baseline=BASELINE_CPU.with_variant("hidden=prenorm")).summary().to_dict()
    assert wrong["numerics"]["unexplained"] > 0
    # h_next recomputed from the prefill's K/V vs the h_next llama.cpp produced during recording (f32)
    assert len(res.h_next_rel_err) == len(tr.steps)
    assert res.baseline == BASELINE_CPU  # recorded with the default n_gpu_layers=-1 on a CPU-only build
    check_emulated_chain(res.h_next_rel_err, "replayed h_next")  # tolerances: tests/numerics.py
    assert s["baseline_h_next_rel_err_max"] == max(res.h_next_rel_err)
    # would-be acceptance of the baseline equals the recorder's own per-round counts
    assert res.rounds["n_accepted[baseline]"].tolist() == res.rounds["n_accepted"].tolist()
    rec_rate = tr.rounds["n_accepted"].sum() / tr.rounds["n_draft"].sum()
    assert base["acceptance_rate"] == pytest.approx(rec_rate)
    assert s["recorded"]["acceptance_rate"] == pytest.approx(rec_rate)
    drafted = tr.rounds[tr.rounds["n_draft"] > 0]  # llama.cpp / vLLM: per verify round that drafted
    assert base["mean_acceptance_length"] == pytest.approx(1 + drafted["n_accepted"].sum() / len(drafted))
    assert s["recorded"]["mean_acceptance_length"] == pytest.approx(base["mean_acceptance_length"])
    assert 0.3 < rec_rate < 1.0  # partial acceptance: the would-be rule is exercised both ways
    # feeding the pre-norm hidden breaks drafting (public reports: roughly halves acceptance)
    assert s["variants"]["hidden=prenorm"]["acceptance_rate"] < 0.5 * rec_rate
    assert s["variants"]["hidden=prenorm"]["agreement"] < 0.9
    # files for the app's Compare page
    js = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert set(js["variants"]) == {"baseline", "hidden=prenorm", "head=centroid,fill=min-1"}
    import pandas as pd

    steps = pd.read_parquet(tmp_path / "r" / "steps.parquet")
    assert len(steps) == len(tr.steps)
    assert (steps["draft[baseline]"] == steps["recorded"]).all()
    # one trace per variant (source "replay"), readable like a recorded one (the Compare page's trace B)
    assert set(js["variant_traces"]) == set(js["variants"])
    vb = traces.open(js["variant_traces"]["baseline"])
    assert vb.manifest["source"] == "replay" and vb.manifest["params"]["variant"] == "baseline"
    a = tr.rounds.sort_values(["prompt_id", "round"]).reset_index(drop=True)
    b = vb.rounds.sort_values(["prompt_id", "round"]).reset_index(drop=True)
    assert [list(x) for x in a["drafted"]] == [list(x) for x in b["drafted"]]
    assert a["n_accepted"].tolist() == b["n_accepted"].tolist()
    assert [list(x) for x in a["emitted"]] == [list(x) for x in b["emitted"]]
    vp = traces.open(js["variant_traces"]["hidden=prenorm"])
    assert vp.rounds["n_accepted"].sum() / vp.rounds["n_draft"].sum() == pytest.approx(
        s["variants"]["hidden=prenorm"]["acceptance_rate"])
    # the drafter's own logits are kept: the greedy draft is rank 0
    assert (vp.steps["rank"] == 0).all()
    # step 1 of the centroid variant sees the recorded inputs: it must pick the centroid head's token that
    # the recorder computed from llama.cpp's h_inner (traces/run/centroid_head.py, an independent implementation)
    m = steps.merge(tr.steps[["prompt_id", "round", "k", "centroid_token"]], on=["prompt_id", "round", "k"])
    k1 = m[m["k"] == 1]
    assert len(k1) == len(tr.rounds)
    assert (k1["draft[head=centroid,fill=min-1]"] == k1["centroid_token"]).all()
    assert (k1["centroid_token"] != k1["recorded"]).any()   # and that differs from the dense draft


def test_replay_into_the_same_folder_removes_the_old_variant_traces(demo_trace: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    """`replay --out DIR` replaces a replay already in DIR: a variant trace the new replay does not write is
    gone (the app's Compare page would offer it beside the new ones), a folder that is not a replay trace stays."""
    from mtpscope import traces

    out = tmp_path / "r"
    first = replay(demo_trace["trace"], variants=["position=p-1"], out=out, max_rounds=2)
    old = Path(first.variant_traces["position=p-1"])
    assert traces.open(old).manifest["params"]["variant"] == "position=p-1"
    mine = out / "traces" / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("kept")
    second = replay(demo_trace["trace"], variants=["top_k=8"], out=out, max_rounds=2)
    assert not old.exists()
    assert sorted(p.name for p in (out / "traces").iterdir()) == sorted(
        [Path(p).name for p in second.variant_traces.values()] + ["mine"])
    assert (mine / "notes.txt").read_text() == "kept"
    assert json.loads((out / "summary.json").read_text())["variant_traces"] == second.variant_traces


def test_baseline_counts_an_eog_draft_as_the_recorder_does(trained_pair, tmp_path: Path) -> None:
    """Demo prompt 9 on the trained pair (greedy, 64 tokens, n_draft 3) has a round whose first draft is the
    end-of-generation token and the target's token too: llama.cpp's rule does not accept it (it ends the round
    as the target's own token, `eog_confirmed`), and the baseline's would-be acceptance must count it the same way,
    so identical drafts give the recorded rate (the round found from the trace, the EOG id from the GGUF)."""
    from mtpscope import traces
    from mtpscope.demo.trained import read_prompts
    from mtpscope.inspector.gguf import open_gguf
    from mtpscope.traces.run.prompts import PromptSpec
    from mtpscope.traces.run.record_config import RecordConfig
    from mtpscope.traces.run.recorder import record

    record(RecordConfig(max_tokens=64, n_draft=3), target=trained_pair.target, assistant=trained_pair.drafter,
           out=tmp_path / "t", prompts=[PromptSpec(tokens=tuple(read_prompts()[9]["ids"]))])
    rounds = traces.open(tmp_path / "t").rounds.sort_values("round").reset_index(drop=True)
    with open_gguf(trained_pair.target) as g:
        eos = int(g.get("tokenizer.ggml.eos_token_id"))
    eog = rounds[rounds["eog_confirmed"].fillna(False).astype(bool)]
    assert len(eog) == 1
    r = eog.iloc[0]
    assert int(r["drafted"][r["n_accepted"]]) == eos == int(r["emitted"][-1]) and r["n_accepted"] < r["n_draft"] - 1
    res = replay(tmp_path / "t")
    s = res.summary()
    assert s.variants["baseline"].agreement == 1.0
    assert res.rounds["n_accepted[baseline]"].tolist() == res.rounds["n_accepted"].tolist()
    assert s.variants["baseline"].acceptance_rate == s.recorded.acceptance_rate


def test_replay_out_refuses_a_folder_holding_something_else(demo_trace: dict[str, Path], tmp_path: Path) -> None:
    """`replay --out DIR` writes only into a new or empty folder or over an earlier replay: a folder with other
    files, one whose summary.json is not a replay's, a trace directory (the trace itself included) or a file are
    refused in one line before anything is written or said to be replaced (before, a user's own summary.json and
    steps.parquet were overwritten)."""
    from typer.testing import CliRunner

    from mtpscope.cli.main import app
    from mtpscope.traces.run.replay_folder import check_replay_out

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "summary.json").write_text('{"mine": true}')
    (mine / "steps.parquet").write_bytes(b"my data")
    (mine / "notes.txt").write_text("kept")
    cases = {mine: "notes.txt", demo_trace["trace"]: "manifest.json"}
    only = tmp_path / "only"
    only.mkdir()
    (only / "summary.json").write_text("[1, 2]")
    cases[only] = "summary.json"
    afile = tmp_path / "afile"
    afile.write_text("x")
    cases[afile] = "afile"
    for out, named in cases.items():
        with pytest.raises(TraceError) as ei:
            check_replay_out(out)
        assert named in ei.value.one_line(), ei.value.one_line()
        res = CliRunner().invoke(app, ["replay", str(demo_trace["trace"]), "--max-rounds", "1", "--out", str(out)])
        assert res.exit_code == 2 and "replaces" not in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1 and named in res.output
    assert (mine / "summary.json").read_text() == '{"mine": true}' and (mine / "steps.parquet").read_bytes() == b"my data"
    assert check_replay_out(tmp_path / "new") is False and check_replay_out(mine / "empty-later") is False
    (tmp_path / "empty").mkdir()
    assert check_replay_out(tmp_path / "empty") is False


def test_replay_of_a_trace_with_an_unreadable_part_warns_and_exits_1(demo_trace: dict[str, Path],
                                                                      tmp_path: Path) -> None:
    """A trace whose steps file is garbage: the replay covers what reads (its rounds) and says which file it
    skipped on stderr, exit 1 as `report` does (before: exit 0, not a word)."""
    import shutil

    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    t = tmp_path / "t"
    shutil.copytree(demo_trace["trace"], t)
    (bad,) = sorted((t / "steps").glob("*.parquet"))
    bad.write_bytes(b"garbage")
    res = CliRunner().invoke(app, ["replay", str(t), "--max-rounds", "3", "--json"])
    assert res.exit_code == 1, res.output
    assert f"warning: {bad}: unreadable steps part skipped" in res.stderr
    assert json.loads(res.stdout)["n_rounds"] == 3


@pytest.mark.parametrize("bad", ["x", 10 ** 12, -5, 3.5, True])
def test_bad_token_ids_in_the_manifest_are_named(demo_trace: dict[str, Path], tmp_path: Path, bad: object) -> None:
    """A manifest prompt given as token ids with one that is not an id of the target's vocabulary (a string, past
    the vocabulary, negative, a float, a bool): one line naming manifest.json and the key, before llama.cpp sees it
    (before: an internal error, or llama.cpp's "invalid token" blamed on the target GGUF after the id wrapped)."""
    import shutil

    from typer.testing import CliRunner

    from mtpscope.cli.main import app
    from mtpscope.errors import TraceFormatError

    t = tmp_path / "t"
    shutil.copytree(demo_trace["trace"], t)
    man = json.loads((t / "manifest.json").read_text())
    man["prompts"][0]["tokens"] = [2, 5, bad]
    (t / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(TraceFormatError) as ei:
        replay(t)
    assert ei.value.key == "prompts[prompt_id 0].tokens[2]" and str(t / "manifest.json") in ei.value.one_line()
    res = CliRunner().invoke(app, ["replay", str(t)])
    assert res.exit_code == 2 and res.output.strip() == f"mtpscope: {ei.value.one_line()}"


def test_cli_replay_json(demo_trace: dict[str, Path]) -> None:
    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    r = CliRunner().invoke(app, ["replay", str(demo_trace["trace"]), "--variant", "position=p-1",
                                 "--max-rounds", "4", "--json"])
    assert r.exit_code == 0, r.output
    js = json.loads(r.output)
    assert js["n_rounds"] == 4
    for v in js["variants"].values():
        assert {"acceptance_rate", "mean_acceptance_length", "agreement"} <= set(v)
    r = CliRunner().invoke(app, ["replay", str(demo_trace["trace"]), "--max-rounds", "2"])
    assert r.exit_code == 0 and "acceptance rate" in r.output
    bad = CliRunner().invoke(app, ["replay", str(demo_trace["trace"]), "--variant", "position=p+1"])
    assert bad.exit_code == 2 and "position" in bad.output


def test_replay_errors(demo_trace: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ReferenceDrafterError):
        replay(demo_trace["trace"], variants=["nonsense"])
    # a trace whose positions do not line up with its tokens
    import shutil

    import pyarrow.parquet as pq

    bad = tmp_path / "bad"
    shutil.copytree(demo_trace["trace"], bad)
    part = sorted((bad / "rounds").glob("*.parquet"))[0]
    tab = pq.read_table(part)
    pos = tab.column("pos").to_pylist()
    pos[1] += 1
    import pyarrow as pa

    tab = tab.set_column(tab.schema.get_field_index("pos"), tab.schema.field("pos"), pa.array(pos, pa.int32()))
    pq.write_table(tab, part)
    with pytest.raises(TraceError, match="line up"):
        replay(bad)
    # imported / synthetic traces lack what a replay needs
    import json as _json

    man = _json.loads((bad / "manifest.json").read_text())
    man["source"] = "synthetic"
    (bad / "manifest.json").write_text(_json.dumps(man))
    with pytest.raises(TraceError, match="recorded by"):
        replay(bad)


def test_replay_position_variant_on_random_pair(tmp_path: Path) -> None:
    """On a drafter whose attention matters, the position convention changes drafts."""
    from mtpscope.demo import build as demo
    from mtpscope.inspector.convert import convert, write_tiny_pair
    from mtpscope.traces.run.record_config import RecordConfig
    from mtpscope.traces.run.recorder import record

    tdir, ddir = write_tiny_pair(tmp_path / "hf", seed=5)
    t = convert(tdir, tmp_path / "t.gguf").out
    d = convert(ddir, tmp_path / "d.gguf").out
    words = demo.DEMO_PASSAGE.split()
    record(RecordConfig(max_tokens=24, hidden="f32"), target=t, assistant=d, out=tmp_path / "trace",
           prompts=[" ".join(words[:9])])
    res = replay(tmp_path / "trace", variants=["position=p-1"])
    s = res.summary().to_dict()
    assert_replay_faithful(s, "converted tiny pair")
    check_emulated_chain(res.h_next_rel_err, "replayed h_next")  # every recorded step, attention in play
    assert s["variants"]["position=p-1"]["agreement"] < 1.0
    # the exact-tanh GELU of a GPU build is a different convention here: F16-table rounding is missing
    gpu = replay(tmp_path / "trace", baseline=BASELINE_GPU)
    with pytest.raises(AssertionError, match="not emulated"):
        check_emulated_chain(gpu.h_next_rel_err, "GPU baseline on a CPU trace")


def test_baseline_follows_the_recorded_device() -> None:
    """CPU numerics unless the manifest says the drafter ran on a GPU (n_gpu_layers=-1, the recorder's
    default, is ignored by a CPU-only build, whose manifest says device "cpu")."""
    cpu_default = {"params": {"n_gpu_layers": -1}, "runtime": {"device": "cpu"}}
    assert baseline_for(cpu_default) == BASELINE_CPU
    assert baseline_for({"params": {"n_gpu_layers": -1}, "runtime": {"device": "NVIDIA H200"}}) == BASELINE_GPU
    assert baseline_for({"params": {"n_gpu_layers": 0}, "runtime": {"device": "NVIDIA H200"}}) == BASELINE_CPU
    assert baseline_for({"params": {"n_gpu_layers": -1}}) == BASELINE_CPU
    assert BASELINE_CPU.gelu == "ggml-f16" and BASELINE_GPU.gelu == "tanh"


def test_cli_replay_says_it_replaces_an_earlier_replay(demo_trace: dict[str, Path], tmp_path: Path) -> None:
    """``replay --out DIR`` into a folder that holds a replay says, on stderr and before it works, that it replaces
    it and when that one was written (as ``diagnose`` does); a first run says nothing of the kind."""
    import os
    import time

    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    out = tmp_path / "r"
    args = ["replay", str(demo_trace["trace"]), "--max-rounds", "1", "--out", str(out), "--json"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "replaces" not in r.stderr and (out / "summary.json").is_file()
    os.utime(out / "summary.json", (0, 86400 * 365))
    made = time.strftime("%Y-%m-%d %H:%M", time.localtime(86400 * 365))
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert r.stderr == f"mtpscope: {out}: replaces the replay already there (written {made})\n"
    assert json.loads(r.stdout)["n_rounds"] == 1 and (out / "summary.json").stat().st_mtime > 86400 * 365
