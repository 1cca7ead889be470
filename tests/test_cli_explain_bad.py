"""Bad input to `mtpscope explain` / `compare` (and the manifest and rounds checks behind every trace reader): one
line naming the file and key, exit 2 for an unreadable manifest, rounds that break the trace format or a trace with
no rounds, 1 for traces that are readable but cannot be compared; never a traceback. Built from copies of the
demo's noisy trace, and of small synthetic traces."""

from __future__ import annotations

import json
import shutil
import warnings
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
    # the last entry malformed too: its rounds' prompt_id is past the entries left, and still readable
    last = _copy(noisy, tmp_path / "last", lambda m: m["prompts"][-1].__setitem__("prompt_id", bad_id))
    res = runner.invoke(app, ["explain", str(last), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["rejections"] == good["rejections"], res.output


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


def test_compare_with_an_empty_or_torn_trace_is_one_line_exit_2(tmp_path: Path, noisy: Path) -> None:
    """A trace with no readable rounds is bad input to compare: exit 2, not 1 (compare's "the outputs differ")."""
    empty = _copy(noisy, tmp_path / "empty", _no_rounds)
    res = runner.invoke(app, ["compare", str(noisy), str(empty)])
    err = _one_line(res)
    assert res.exit_code == 2 and res.stdout == ""
    assert err.startswith(f"mtpscope: {empty}: 'rounds': trace B has no rounds") and "(expected >= 1 round, got 0)" in err
    torn = _copy(noisy, tmp_path / "torn")
    part = torn / "rounds" / "merged-00000.parquet"
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    res = runner.invoke(app, ["compare", str(torn), str(noisy)])
    lines = res.stderr.splitlines()
    assert res.exit_code == 2 and "Traceback" not in res.stderr and len(lines) == 2
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


def test_compare_of_traces_without_outputs_says_unknown_not_different(tmp_path: Path) -> None:
    """Two fork imports of the same log (no emitted tokens): the outputs are unknown, not different; compare said
    'outputs identical: NO' and 'the two runs' outputs are not identical' (the app: 'The two runs' outputs
    differ'). Exit 1 stays: no output position was compared."""
    from mtpscope.traces.importers import import_fork_ndjson

    log = tmp_path / "mtp.ndjson"
    log.write_text('{"evt":"mtp_draft","iter":1,"id_last":5,"attn_pos":9,"drafts":[1,2]}\n'
                   '{"evt":"mtp_accept","iter":1,"n_accepted":1}\n', encoding="utf-8")
    a, b = import_fork_ndjson(log, tmp_path / "a").out_dir, import_fork_ndjson(log, tmp_path / "b").out_dir
    res = runner.invoke(app, ["compare", a, b])
    assert res.exit_code == 1, res.output
    assert "outputs identical: unknown (no emitted tokens)" in res.stdout and "NO" not in res.stdout
    assert res.stderr.strip() == ("mtpscope: the two runs' outputs are unknown (no emitted tokens): no output "
                                  "position was compared")
    assert json.loads(runner.invoke(app, ["compare", a, b, "--json"]).stdout)["outputs_identical"] is None


# ------------------------------------------------------------------ rounds that break the format, every command

def _synthetic(d: Path) -> Path:
    from mtpscope.traces.synthetic import write_synthetic_trace

    return write_synthetic_trace(d, n_rounds=40, n_prompts=4, n_vocab=1000, rounds_per_part=10, seed=0)


def _rewrite_rounds(d: Path, edit) -> None:
    import pyarrow.parquet as pq

    for part in sorted((d / "rounds").glob("*.parquet")):
        pq.write_table(edit(pq.read_table(part)), part)


def _drafted_null(t):
    import pyarrow as pa

    return t.set_column(t.schema.get_field_index("drafted"), pa.field("drafted", t["drafted"].type),
                        pa.nulls(t.num_rows, t["drafted"].type))


def _huge_verify(t):
    import pyarrow as pa

    return t.set_column(t.schema.get_field_index("t_verify_ms"), "t_verify_ms", pa.array([1e308] * t.num_rows))


def _copy_first_part_into_the_last(d: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = sorted((d / "rounds").glob("*.parquet"))
    pq.write_table(pa.concat_tables([pq.read_table(parts[-1]), pq.read_table(parts[0])]), parts[-1])


BROKEN = {
    # report reads no `drafted`: it gave its numbers, exit 0, while explain skipped the part and said "no rounds"
    "drafted_null": (lambda d: _rewrite_rounds(d, _drafted_null),
                     "'drafted': rounds column breaks the trace format (40 rows, first row 0) (expected no nulls, "
                     "got null)"),
    # every count doubled, exit 0
    "duplicated": (_copy_first_part_into_the_last,
                   "'prompt_id, round': rounds column breaks the trace format (10 rows, first row 40) (expected each "
                   "(prompt_id, round) once, got (0, 0) again (first at row 0))"),
    # numpy's overflow warnings on the terminal, costs of inf, exit 0
    "huge_times": (lambda d: _rewrite_rounds(d, _huge_verify),
                   "'t_verify_ms': rounds column breaks the trace format (40 rows, first row 0) (expected null, 0 or "
                   "1e-06 <= t < 86400000 ms (a nanosecond to a day), got 1e+308)"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_rounds_that_break_the_format_are_refused_alike_by_every_command(tmp_path: Path, case: str) -> None:
    """report, explain (text or JSON) and compare (either side) read different columns; each refuses the same trace
    with the same line, exit 2, and no numpy warning reaches the terminal."""
    good = _synthetic(tmp_path / "good")
    bad = tmp_path / case
    shutil.copytree(good, bad)
    edit, line = BROKEN[case]
    edit(bad)
    for args in (["report", str(bad)], ["report", str(bad), "--json"], ["explain", str(bad)],
                 ["explain", str(bad), "--json"], ["compare", str(good), str(bad)], ["compare", str(bad), str(good)]):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = runner.invoke(app, args)
        assert res.exit_code == 2 and res.stdout == "", (args, res.exit_code, res.output)
        assert _one_line(res) == f"mtpscope: {bad}: {line}\n", args
        assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], (args, [str(w.message) for w in caught])


def test_times_at_the_edge_of_the_rule_give_numbers_without_numpy_warnings(tmp_path: Path) -> None:
    """Times the rounds check lets through (0, a nanosecond, just under a day) go through report, explain and compare
    without a RuntimeWarning (overflow, division by zero) reaching the terminal."""
    import pyarrow as pa

    good = _synthetic(tmp_path / "good")
    edge = tmp_path / "edge"
    shutil.copytree(good, edge)
    vals = [0.0, 1e-6, 86_399_999.0, 0.001]

    def edit(t):
        n = t.num_rows
        t = t.set_column(t.schema.get_field_index("t_verify_ms"), "t_verify_ms",
                         pa.array([vals[i % 4] for i in range(n)]))
        return t.set_column(t.schema.get_field_index("t_draft_ms"), "t_draft_ms",
                            pa.array([vals[(i + 1) % 4] for i in range(n)]))

    _rewrite_rounds(edge, edit)
    for args in (["report", str(edge)], ["explain", str(edge)], ["explain", str(edge), "--json"],
                 ["compare", str(good), str(edge)]):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = runner.invoke(app, args)
        assert res.exit_code == 0 and "Traceback" not in res.output, (args, res.output)
        assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], (args, [str(w.message) for w in caught])
