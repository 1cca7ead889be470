"""Bad input to `mtpscope sweep` (prompts files: refused before Ray, which is blocked here) and to
`mtpscope report DIR` on a sweep whose sweep.json is corrupt: one line naming the file and key, exit 2,
never a traceback. No Ray is started."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mtpscope.cli.main import app

NO_RAY = "import sys; sys.modules['ray'] = None; "
runner = CliRunner()


def _cli(*args: str) -> subprocess.CompletedProcess:
    code = NO_RAY + "import sys; from mtpscope.cli.main import main; sys.argv = ['mtpscope', *sys.argv[1:]]; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_sweep_prompts_fifo_and_reserved_category_are_one_line(demo_dir, tmp_path: Path) -> None:
    fifo = tmp_path / "prompts.jsonl"
    os.mkfifo(fifo)  # reading it would block forever
    allcat = tmp_path / "all.jsonl"
    allcat.write_text('{"prompt": "a", "category": "x"}\n{"prompt": "b", "category": "all"}\n')
    base = ["sweep", "--target", str(demo_dir.target), "--assistant", str(demo_dir.drafter_upstream),
            "--out", str(tmp_path / "o")]
    for prompts, want in ((fifo, f"mtpscope: {fifo}: prompts file is not a regular file (expected a regular file, "
                                 "got a FIFO)"),
                          (allcat, f"mtpscope: {allcat}: 'line 2: category': the category 'all' is reserved for the "
                                   "totals over all prompts (expected a category other than 'all', got all)"),
                          (tmp_path, f"mtpscope: {tmp_path}: prompts file is not a regular file (expected a regular "
                                     "file, got a directory)")):
        r = _cli(*base, "--prompts", str(prompts))
        assert r.returncode == 2 and r.stderr.splitlines() == [want], r.stderr
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mtpscope.traces.synthetic import write_synthetic_sweep

    return Path(write_synthetic_sweep(tmp_path_factory.mktemp("s") / "sw", n_rounds=200, assistants=("a",),
                                      n_drafts=(2,), n_shards=1, n_prompts=2, categories=("x",), baseline=False))


def _set(d: dict, path: tuple, val: object) -> dict:
    d = copy.deepcopy(d)
    o = d
    for p in path[:-1]:
        o = o[p]
    if val is KeyError:
        del o[path[-1]]
    else:
        o[path[-1]] = val
    return d


@pytest.mark.parametrize("path, val, key, got", [
    (("tasks",), 5, "'tasks'", "expected list, got int"),
    (("tasks",), KeyError, "'tasks'", "expected list, got missing"),
    (("tasks", 0, "task"), KeyError, "'tasks[0].task'", "expected string, got missing"),
    (("tasks", 0, "n_draft"), "x", "'tasks[0].n_draft'", "expected int >= 0, got 'x'"),
    (("tasks", 0, "assistant"), None, "'tasks[0].assistant'", "expected string, got None"),
    (("prompts", 0, "shard"), None, "'prompts[0].shard'", "expected int >= 0, got None"),
    (("prompts", 0, "prompt_id"), KeyError, "'prompts[0].prompt_id'", "expected int >= 0, got missing"),
    (("prompts", 1, "text"), 5, "'prompts[1].text'", "expected string, got 5"),
    # was the whole task dict, cut mid-word
    (("tasks", 0, "state"), "bogus", "'tasks[0].state'", "expected one of pending, running, done, failed, got 'bogus')"),
    # was accepted: the rows are labelled by the folder (n_draft=2), the entry said 7
    (("tasks", 0, "n_draft"), 7, "'tasks[0].n_draft'", "expected 2 (its task 'assistant=a/n_draft=2/shard=0'), got 7)"),
    (("tasks", 0, "dir"), "assistant=a/n_draft=1/shard=0", "'tasks[0].dir'",
     "expected 'assistant=a/n_draft=2/shard=0', got 'assistant=a/n_draft=1/shard=0')"),
    # was silently dropped from every row
    (("prompts", 0, "shard"), 99, "'prompts[0].shard'", "expected 0..0 (spec.shards = 1), got 99)"),
    # was an internal error (the report's totals row is named 'all')
    (("prompts", 0, "category"), "all", "'prompts[0].category'",
     "the category 'all' is reserved for the totals over all prompts (expected a category other than 'all', got 'all')"),
])
def test_report_on_a_corrupt_sweep_json_is_one_line_exit_2(tmp_path: Path, sweep: Path, path: tuple, val: object,
                                                          key: str, got: str) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(sweep, bad)
    state = json.loads((bad / "sweep.json").read_text())
    (bad / "sweep.json").write_text(json.dumps(_set(state, path, val)))
    res = runner.invoke(app, ["report", str(bad), "--json"])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert res.exit_code == 2 and res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"mtpscope: {bad / 'sweep.json'}: {key}: ") and got in lines[0], lines


@pytest.fixture(scope="module")
def sweep2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mtpscope.traces.synthetic import write_synthetic_sweep

    return Path(write_synthetic_sweep(tmp_path_factory.mktemp("s2") / "sw", n_rounds=400, assistants=("a",),
                                      n_drafts=(1, 3), n_shards=1, n_prompts=4, categories=("x", "y"),
                                      baseline=False))


def _report_line(bad: Path) -> str:
    res = runner.invoke(app, ["report", str(bad)])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert res.exit_code == 2 and res.stdout == "", res.output
    lines = res.stderr.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_task_or_prompt_listed_twice_is_refused_not_counted_twice(tmp_path: Path, sweep2: Path) -> None:
    state = json.loads((sweep2 / "sweep.json").read_text())
    for name, edit, want in (
            ("task", lambda s: s["tasks"].append(dict(s["tasks"][0])),
             "'tasks[2]': task listed twice (expected each task once, got assistant=a/n_draft=1/shard=0 again "
             "(also tasks[0]))"),
            ("prompt", lambda s: s["prompts"].append({**s["prompts"][0], "index": 9}),
             "'prompts[4]': prompt listed twice (expected each prompt once, got shard 0 prompt_id 0 again "
             "(also prompts[0]))")):
        bad = tmp_path / name
        shutil.copytree(sweep2, bad)
        st = copy.deepcopy(state)
        edit(st)
        (bad / "sweep.json").write_text(json.dumps(st))
        assert _report_line(bad) == f"mtpscope: {bad / 'sweep.json'}: {want}"


@pytest.mark.parametrize("cmd", ["report", "explain"])
def test_a_cell_whose_trace_has_another_n_draft_is_refused_not_mislabelled(tmp_path: Path, sweep2: Path,
                                                                          cmd: str) -> None:
    """The n_draft=3 task's trace under the n_draft=1 task's folder: its numbers were reported as n_draft 1's."""
    bad = tmp_path / "lies"
    shutil.copytree(sweep2, bad)
    one, three = bad / "assistant=a" / "n_draft=1" / "shard=0", bad / "assistant=a" / "n_draft=3" / "shard=0"
    shutil.rmtree(one)
    shutil.copytree(three, one)
    res = runner.invoke(app, [cmd, str(bad)])
    assert res.exit_code == 2 and res.stdout == "", res.output
    assert res.stderr.splitlines() == [
        f"mtpscope: {bad / 'sweep.json'}: 'tasks[0]': the task's trace was recorded with another n_draft (its rows "
        "would be reported under the task's) (expected n_draft 1 (the task assistant=a/n_draft=1/shard=0), got "
        "n_draft 3 (assistant=a/n_draft=1/shard=0/manifest.json params.n_draft))"]
    # the manifest made to agree: its rounds still draft 3 tokens
    m = json.loads((one / "manifest.json").read_text())
    m["params"]["n_draft"] = 1
    (one / "manifest.json").write_text(json.dumps(m))
    assert _report_line(bad) == (
        f"mtpscope: {bad / 'sweep.json'}: 'tasks[0]': the task's trace drafts more tokens a round than the task's "
        "n_draft (its rows would be reported under the task's) (expected at most 1 (the task "
        "assistant=a/n_draft=1/shard=0), got rounds drafting 3 (assistant=a/n_draft=1/shard=0/rounds))")


def test_a_bad_cost_probe_in_a_sweep_task_is_refused(tmp_path: Path, sweep2: Path) -> None:
    bad = tmp_path / "probe"
    shutil.copytree(sweep2, bad)
    man = bad / "assistant=a" / "n_draft=3" / "shard=0" / "manifest.json"
    m = json.loads(man.read_text())
    m["cost_probe"] = {"verify_ms": {"1": 5.0, "2": -1.0}}
    man.write_text(json.dumps(m))
    assert _report_line(bad) == (f"mtpscope: {man}: 'cost_probe.verify_ms.2': malformed cost probe entry (expected a "
                                 "finite number of ms, 1e-06 <= t < 86400000 (a nanosecond to a day), got -1.0)")


def test_a_sweep_folder_that_holds_no_trace_is_one_line(tmp_path: Path) -> None:
    # explain / report on DIR/assistant=a/n_draft=1 (a configuration folder: its traces are the shard
    # folders below it) names the sweep and what can be read, exit 1; a shard's trace folder is read as usual
    root = tmp_path / "sw"
    cell = root / "assistant=a" / "n_draft=1"
    (cell / "shard=0").mkdir(parents=True)
    (root / "sweep.json").write_text("{}")
    for cmd in ("explain", "report"):
        for folder in (cell, cell.parent):
            r = runner.invoke(app, [cmd, str(folder)])
            assert r.exit_code == 1, r.output
            assert r.output.strip().splitlines() == [
                f"mtpscope: {folder} is a folder of the sweep {root.resolve()}, not a trace: mtpscope {cmd} "
                f"{root.resolve()} (every configuration, measured) or one shard's trace (a shard=N folder below it)"]
        # the shard folder is a trace folder (here an empty one): the reader's own one-line error, not this one
        r = runner.invoke(app, [cmd, str(cell / "shard=0")])
        assert "is a folder of the sweep" not in r.output and r.exit_code != 0


def test_test_faults_come_only_from_the_environment_seam(monkeypatch) -> None:
    """The runner's test faults are read in one place (``_load_faults``) from ``MTPSCOPE_SWEEP_FAULTS``; the
    public ``run_sweep`` has no parameter for them; a value that is not JSON is one error naming the variable."""
    import inspect

    from mtpscope.errors import MtpscopeError
    from mtpscope.traces.sweep.runner import FAULTS_ENV, _load_faults, run_sweep

    assert FAULTS_ENV == "MTPSCOPE_SWEEP_FAULTS"
    assert "faults" not in inspect.signature(run_sweep).parameters
    monkeypatch.delenv(FAULTS_ENV, raising=False)
    assert _load_faults() == {}
    monkeypatch.setenv(FAULTS_ENV, '{"a/n_draft=2/shard=0": {"kind": "kill", "round": 2}}')
    assert _load_faults() == {"a/n_draft=2/shard=0": {"kind": "kill", "round": 2}}
    monkeypatch.setenv(FAULTS_ENV, "{not json")
    with pytest.raises(MtpscopeError, match=FAULTS_ENV):
        _load_faults()


def _doubled(t):
    import pyarrow as pa

    return pa.concat_tables([t, t])     # the part's rows copied in after themselves: every (prompt_id, round) twice


def _huge_verify(t):
    import pyarrow as pa

    return t.set_column(t.schema.get_field_index("t_verify_ms"), "t_verify_ms", pa.array([1e308] * t.num_rows))


@pytest.mark.parametrize("case", ["duplicated", "huge_times"])
def test_a_task_whose_rounds_break_the_format_is_refused_by_the_sweep_report(tmp_path: Path, sweep2: Path,
                                                                            case: str) -> None:
    """`report DIR` (text, --json) and the sweep's advice (`explain DIR`) read the task parts through DuckDB without
    the trace reader's rounds check: a duplicated part was counted twice, exit 0, while `explain` on the task's
    trace and the sweep cell (the app's sweep page) refused it. Now each refuses the task with the trace reader's
    own line naming the task's folder, exit 2."""
    import pyarrow.parquet as pq

    from mtpscope.errors import TraceFormatError
    from mtpscope.traces.sweep.reader import open_sweep

    bad = tmp_path / case
    shutil.copytree(sweep2, bad)
    task = bad / "assistant=a" / "n_draft=3" / "shard=0"
    parts = sorted((task / "rounds").glob("*.parquet"))
    assert len(parts) == 1
    t = pq.read_table(parts[0])
    n = t.num_rows
    if case == "duplicated":
        pq.write_table(_doubled(t), parts[0])
        pair = (t["prompt_id"][0].as_py(), t["round"][0].as_py())
        want = (f"'prompt_id, round': rounds column breaks the trace format ({n} rows, first row {n}) (expected each "
                f"(prompt_id, round) once, got {pair} again (first at row 0))")
    else:
        pq.write_table(_huge_verify(t), parts[0])
        want = (f"'t_verify_ms': rounds column breaks the trace format ({n} rows, first row 0) (expected null, 0 or "
                "1e-06 <= t < 86400000 ms (a nanosecond to a day), got 1e+308)")
    line = f"mtpscope: {task}: {want}"
    assert _report_line(bad) == line
    for args in (["report", str(bad), "--json"], ["explain", str(bad)], ["explain", str(bad), "--json"],
                 ["explain", str(task)]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and res.stdout == "", (args, res.output)
        assert res.stderr.splitlines() == [line], args
    for read in (lambda sw: sw.cell("a", 3).rounds, lambda sw: sw.sql("SELECT count(*) FROM rounds")):
        with pytest.raises(TraceFormatError) as e:
            read(open_sweep(bad))
        assert f"mtpscope: {e.value.one_line()}" == line
    # the task's trace is the only one refused: the same sweep without that task's fault reports, exit 0
    pq.write_table(t, parts[0])
    assert runner.invoke(app, ["report", str(bad)]).exit_code == 0


def test_explain_on_a_sweep_cell_whose_probes_lack_draft_ms(tmp_path: Path, sweep2: Path) -> None:
    """A sweep cell's manifest holds its shards' probes merged; with no draft_ms (older probes) it held
    ``"draft_ms": {}``, which the probe check refused, naming ``<sweep>/assistant=a/n_draft=3/manifest.json`` (a
    configuration folder: no such file). The cell's what-if and explanation now price with the merged probe."""
    from mtpscope.traces.analysis.costs import CostProbe
    from mtpscope.traces.sweep.advice import explain_with_baseline
    from mtpscope.traces.sweep.reader import open_sweep

    d = tmp_path / "noprobe"
    shutil.copytree(sweep2, d)
    for nd in (1, 3):
        man = d / "assistant=a" / f"n_draft={nd}" / "shard=0" / "manifest.json"
        m = json.loads(man.read_text())
        m["cost_probe"] = {"verify_ms": {"1": 10.0 + nd, "2": 12.0, "3": 14.0, "4": 16.0}, "reps": 3}
        man.write_text(json.dumps(m))
    cell = open_sweep(d).cell("a", 3)
    assert not (cell.path / "manifest.json").exists()
    want = CostProbe({1: 13.0, 2: 12.0, 3: 14.0, 4: 16.0}, {}, 3)      # one shard: its own probe
    assert CostProbe.of_trace(cell) == want and CostProbe.of_trace(cell) is cell.cost_probe
    ex = explain_with_baseline(cell, with_drift=False)
    assert ex.what_if.cost.probe == want


def test_a_task_whose_steps_break_the_format_is_refused_by_the_sweep_report(tmp_path: Path, sweep2: Path) -> None:
    """The steps' rules too (traces.store.checks.check_steps): a task whose steps repeat a (prompt_id, round, k) is
    refused by `report DIR` with the trace reader's line naming the task's folder, as `explain` on that task's trace
    refuses it (was: the sweep read its rounds' check only)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mtpscope.traces.synthetic import write_synthetic_sweep

    bad = Path(write_synthetic_sweep(tmp_path / "steps_twice", n_rounds=200, assistants=("a",), n_drafts=(3,),
                                     n_shards=1, n_prompts=4, baseline=False, steps=True))
    task = bad / "assistant=a" / "n_draft=3" / "shard=0"
    (part,) = sorted((task / "steps").glob("*.parquet"))
    t = pq.read_table(part)
    pq.write_table(pa.concat_tables([t, t.slice(0, 1)]), part)      # the first step again, at the end
    s0 = t.slice(0, 1).to_pylist()[0]
    want = (f"mtpscope: {task}: 'prompt_id, round, k': steps column breaks the trace format (1 row, first row "
            f"{t.num_rows}) (expected each (prompt_id, round, k) once, got ({s0['prompt_id']}, {s0['round']}, "
            f"{s0['k']}) again (first at row 0))")
    assert _report_line(bad) == want
    res = runner.invoke(app, ["explain", str(task)])
    assert res.exit_code == 2 and res.stderr.splitlines() == [want]
