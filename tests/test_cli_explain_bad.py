"""Bad input to `mtpscope explain` / `compare` (and the manifest checks behind every trace reader): one line
naming the file and key, exit 2 for an unreadable manifest, 1 for traces that are readable but cannot be
compared; never a traceback. Built from copies of the demo's noisy trace."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

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


def _copy(src: Path, dst: Path, edit=None) -> Path:
    shutil.copytree(src, dst)
    if edit is not None:
        m = json.loads((dst / "manifest.json").read_text())
        edit(m)
        (dst / "manifest.json").write_text(json.dumps(m))
    return dst


def _one_line(res) -> str:
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1, res.stderr
    return res.stderr


@pytest.mark.parametrize("edit, key, got", [
    (lambda m: m["parts"].__setitem__("rounds", 5), "'parts.rounds'", "got int"),
    (lambda m: m["parts"].__setitem__("steps", [1]), "'parts.steps'", "got list with int"),
    (lambda m: m["dims"].__setitem__("hidden_dtype", [1]), "'dims.hidden_dtype'", "got [1]"),
])
@pytest.mark.parametrize("cmd", ["explain", "compare"])
def test_manifest_of_wrong_types_is_one_line_exit_2(tmp_path: Path, noisy: Path, edit, key: str, got: str,
                                                     cmd: str) -> None:
    bad = _copy(noisy, tmp_path / "bad", edit)
    args = ["explain", str(bad), "--json"] if cmd == "explain" else ["compare", str(noisy), str(bad)]
    res = runner.invoke(app, args)
    err = _one_line(res)
    assert res.exit_code == 2 and err.startswith(f"mtpscope: {bad / 'manifest.json'}: {key}: ") and got in err, err


@pytest.mark.parametrize("edit, key, got", [
    (lambda m: m["cost_probe"]["draft_ms"].__setitem__("8", -1.0), "'cost_probe.draft_ms.8'", "got -1.0)"),
    (lambda m: m["cost_probe"]["draft_ms"].__setitem__("8", "33.0"), "'cost_probe.draft_ms.8'", "got '33.0')"),
    (lambda m: m["cost_probe"].__setitem__("verify_ms", "fast"), "'cost_probe.verify_ms'", "got 'fast')"),
    (lambda m: m["cost_probe"]["draft_ms"].__setitem__("a", 1.0), "'cost_probe.draft_ms.a'", "got 'a')"),
])
@pytest.mark.parametrize("cmd", ["explain", "report", "diagnose"])
def test_one_bad_cost_probe_entry_is_refused_not_dropped(tmp_path: Path, noisy: Path, edit, key: str, got: str,
                                                         cmd: str) -> None:
    """One malformed entry of the probe mtpscope wrote used to drop the whole probe silently (the what-if then
    priced every size on lines and explain's advice flipped): now each command refuses it in one line, exit 2."""
    bad = _copy(noisy, tmp_path / "bad", edit)
    args = {"explain": ["explain", str(bad)], "report": ["report", str(bad)],
            "diagnose": ["diagnose", "--trace", str(bad), "--no-replay", "-q", "--out", str(tmp_path / "o")]}[cmd]
    res = runner.invoke(app, args)
    err = _one_line(res)
    assert res.exit_code == 2, res.output
    assert err.startswith(f"mtpscope: {bad / 'manifest.json'}: {key}: malformed cost probe entry (expected "), err
    assert err.rstrip().endswith(got), err


@pytest.mark.parametrize("bad_id", ["x", None, -1, True])
def test_malformed_prompt_entries_are_left_out_not_fatal(tmp_path: Path, noisy: Path, bad_id) -> None:
    """A prompt entry with a prompt_id that is not an int >= 0 is dropped from what readers see (its
    rounds stay readable): explain still reports every round, without that prompt's text."""
    bad = _copy(noisy, tmp_path / "bad", lambda m: m["prompts"][0].__setitem__("prompt_id", bad_id))
    res = runner.invoke(app, ["explain", str(bad), "--json"])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    good = json.loads(runner.invoke(app, ["explain", str(noisy), "--json"]).stdout)
    got = json.loads(res.stdout)
    assert got["rejections"] == good["rejections"]


def _no_rounds(m: dict) -> None:
    m["parts"] = {"rounds": [], "steps": [], "requests": []}
    m["counts"] = {"n_rounds": 0, "n_steps": 0, "n_parts": 0}


def test_explain_zero_rounds_says_so(tmp_path: Path, noisy: Path) -> None:
    empty = _copy(noisy, tmp_path / "empty", _no_rounds)
    res = runner.invoke(app, ["explain", str(empty)])
    assert res.exit_code == 0, res.output
    assert "acceptance rate - (0 / 0 drafted), mean acceptance length -" in res.stdout and "nan" not in res.stdout
    assert "note: the trace has no rounds" in res.stdout
    d = json.loads(runner.invoke(app, ["explain", str(empty), "--json"]).stdout)
    assert any("no rounds" in n for n in d["notes"])


def test_compare_with_an_empty_or_torn_trace_is_one_line_exit_1(tmp_path: Path, noisy: Path) -> None:
    empty = _copy(noisy, tmp_path / "empty", _no_rounds)
    res = runner.invoke(app, ["compare", str(noisy), str(empty)])
    err = _one_line(res)
    assert res.exit_code == 1 and res.stdout == ""
    assert err.startswith(f"mtpscope: {empty}: 'rounds': trace B has no rounds") and "(expected >= 1 round, got 0)" in err
    torn = _copy(noisy, tmp_path / "torn")
    part = torn / "rounds" / "merged-00000.parquet"
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    res = runner.invoke(app, ["compare", str(torn), str(noisy)])
    lines = res.stderr.splitlines()
    assert res.exit_code == 1 and "Traceback" not in res.stderr and len(lines) == 2
    assert lines[0].startswith(f"warning: {part}: unreadable rounds part skipped")   # the reason is kept
    assert lines[1].startswith(f"mtpscope: {torn}: 'rounds': trace A has no rounds")


def test_compare_traces_of_different_prompts_is_refused(tmp_path: Path, noisy: Path) -> None:
    def other(m: dict) -> None:
        for p in m["prompts"]:
            p["text"] = "another " + p["text"]

    b = _copy(noisy, tmp_path / "other", other)
    res = runner.invoke(app, ["compare", str(noisy), str(b), "--json"])
    err = _one_line(res)
    assert res.exit_code == 1 and res.stdout == ""
    assert err == (f"mtpscope: {b}: 'prompts': the two traces share no prompt (paired by text): they are runs of "
                   "different prompts (expected some of A's 5 prompts, got 5 other prompts)\n")


def test_compare_of_two_targets_gives_no_delta_and_blames_no_numerics(tmp_path: Path, noisy: Path) -> None:
    """A recording of another target (its manifest says so) generates other text: compare printed a delta over
    zero compared positions and put the first difference down to "a near tie or numerics"."""
    def other_target(m: dict) -> None:
        m["models"]["target"].update(architecture="gemma3", header_sha256="0" * 64)

    other = _copy(noisy, tmp_path / "other", other_target)
    res = runner.invoke(app, ["compare", str(noisy), str(other), "--no-replay"])
    assert res.exit_code == 1, res.output
    why = "different targets: architecture (models.target.architecture) A gemma4, B gemma3"
    assert res.stderr.splitlines() == [f"mtpscope: the two runs are not comparable position by position: {why}"]
    out = res.stdout.splitlines()
    assert f"not comparable position by position: {why}; no output position, acceptance delta or first differing " \
           "round is given" in out, res.stdout
    assert any(ln.startswith("acceptance rate of each run on its own (not a paired delta): A ") for ln in out)
    assert "delta (B - A)" not in res.stdout and "numerics" not in res.stdout and "accepted in A" not in res.stdout
    j = json.loads(runner.invoke(app, ["compare", str(noisy), str(other), "--json", "--no-replay"]).stdout)
    assert j["not_comparable"] == why and j["delta"]["all"]["delta"] is None and "runtimes" not in j
    assert j["delta"]["all"]["rate_a"] == j["delta"]["all"]["rate_b"]        # the same rounds, each on its own


def test_compare_a_trace_with_itself(noisy: Path) -> None:
    res = runner.invoke(app, ["compare", str(noisy), str(noisy), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["outputs_identical"] and d["n_pairs"] == 5 and d["a_only"]["n"] == 0 and d["b_only"]["n"] == 0
