"""Bad command-line input answered in one line on stderr with exit 2 (never typer's usage box, never a run
that goes ahead): a bad ``--prompts`` file before ``diagnose`` / ``record`` run anything, a GGUF option that
names a folder, ``--n-draft`` out of 1..64 or not a number on every command that takes it; ``diagnose``'s
paths and links absolute whatever folder it ran in; ``trace repair`` deleting the ``.tmp`` parts a dead writer
left; an output ``--out`` that is a file (``record``, ``diagnose``, ``replay``, ``probe``, ``sweep``) or a
``diagnose --html`` that is a folder refused before any work starts.

Expected lines are built from the inputs (the file, its line number, the option, the value given), not copied
from mtpscope's output; nothing here runs llama.cpp except the ``diagnose --trace`` test (which only reads)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from typer.testing import CliRunner

from mtpscope.cli.main import app
from mtpscope.traces.run.record_config import MAX_N_DRAFT

runner = CliRunner()


def _one_line(res) -> str:
    """The one stderr line of a refused command (exit 2, no traceback, no usage box)."""
    assert res.exit_code == 2, (res.exit_code, res.stdout, res.stderr)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert "Usage:" not in res.output and "╭" not in res.output and "Traceback" not in res.output, res.output
    assert lines[0].startswith("mtpscope: "), lines[0]
    return lines[0]


# ------------------------------------------------------------------------------------------- --prompts

BAD_PROMPTS = [
    # (file lines, the line that is wrong, what the line must say)
    (['{"prompt": "fine"}', '{"prompt": "b",'], 2, ["line 2", "not JSON", "expected one JSON value",
                                                    "got '{\"prompt\": \"b\",'"]),
    (['{"tokens": ["a", "b"]}'], 1, ["line 1", "tokens[0]", "expected int >= 0", "got 'a'"]),
]


@pytest.mark.parametrize("lines, line_no, says", BAD_PROMPTS)
def test_a_bad_prompts_file_is_refused_before_diagnose_or_record_runs(demo_dir, tmp_path: Path, lines: list[str],
                                                                       line_no: int, says: list[str]) -> None:
    """With a real, valid pair, a malformed JSONL line or string token ids end ``diagnose`` with one line naming the
    file and the line (was: "[record] failed" and "no defect found", exit 0); nothing is written; ``record`` says
    the same line."""
    bad = tmp_path / "prompts.jsonl"
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    pair = ["--target", str(demo_dir.target), "--assistant", str(demo_dir.drafter_upstream)]
    out = tmp_path / "diag"
    d_line = _one_line(runner.invoke(app, ["diagnose", *pair, "--prompts", str(bad), "--out", str(out)]))
    assert d_line.startswith(f"mtpscope: {bad}: 'line {line_no}: "), d_line
    for s in says:
        assert s in d_line, (s, d_line)
    assert not out.exists()                          # refused before verify, before the recording
    r_line = _one_line(runner.invoke(app, ["record", *pair, "--prompts", str(bad), "--out", str(tmp_path / "rec")]))
    assert r_line == d_line
    assert not (tmp_path / "rec").exists()


# ------------------------------------------------------------------------------------ a GGUF that is a folder

def _folder_commands(folder: Path, tmp_path: Path) -> list[tuple[str, list[str]]]:
    gguf = tmp_path / "model.gguf"          # a file that is not there: the folder must be what is refused
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"hi"\n')
    o = str(tmp_path / "o")
    f = str(folder)
    return [
        ("--target", ["record", "--target", f, "--assistant", str(gguf), "--prompt", "x", "--out", o]),
        ("--assistant", ["record", "--target", str(gguf), "--assistant", f, "--prompt", "x", "--out", o]),
        ("--target", ["diagnose", "--target", f, "--assistant", str(gguf), "--out", o]),
        ("--assistant", ["diagnose", "--target", str(gguf), "--assistant", f, "--out", o]),
        ("--reference-assistant", ["diagnose", "--target", str(gguf), "--assistant", str(gguf),
                                   "--reference-assistant", f, "--out", o]),
        ("--target", ["server", "run", "--target", f]),
        ("--assistant", ["server", "run", "--target", str(gguf), "--assistant", f]),
        ("--assistant", ["probe", "http://127.0.0.1:9", "--prompts", str(prompts), "--out", o, "--replay",
                         "--assistant", f]),
        ("--target", ["sweep", "--out", o, "--target", f]),
        ("--assistant", ["sweep", "--out", o, "--assistant", f"name={f}"]),
        ("--target", ["replay", str(tmp_path / "trace"), "--target", f]),
    ]


def test_a_gguf_option_that_names_a_folder_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``record --target DIR`` (was "No such file or directory") and every other model option of the commands that
    hand a GGUF to llama.cpp: one line naming the folder and the option, expected a GGUF file; nothing started."""
    import mtpscope.traces.server.launch as launch
    import mtpscope.traces.server.probe as probe

    def must_not_run(*a, **k):
        raise AssertionError("started although an option was bad")

    monkeypatch.setattr(launch, "launch", must_not_run)
    monkeypatch.setattr(probe, "probe", must_not_run)
    folder = tmp_path / "models"
    folder.mkdir()
    for option, args in _folder_commands(folder, tmp_path):
        line = _one_line(runner.invoke(app, args))
        assert line.startswith(f"mtpscope: {folder}: '{option}': "), (args, line)
        assert "folder" in line and "expected a GGUF file" in line, (args, line)
        assert not (tmp_path / "o").exists(), args


# ------------------------------------------------------------------------------------------- --n-draft

def _n_draft_commands(tmp_path: Path) -> dict[str, list[str]]:
    gguf = str(tmp_path / "model.gguf")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"hi"\n')
    o = str(tmp_path / "o")
    return {
        "record": ["record", "--target", gguf, "--assistant", gguf, "--prompt", "x", "--out", o],
        "diagnose": ["diagnose", "--target", gguf, "--assistant", gguf, "--out", o],
        "sweep": ["sweep", "--target", gguf, "--assistant", gguf, "--prompts", str(prompts), "--out", o],
        "server run": ["server", "run", "--target", gguf, "--assistant", gguf],
        "probe --replay": ["probe", "http://127.0.0.1:9", "--prompts", str(prompts), "--out", o, "--replay",
                           "--assistant", gguf],
    }


@pytest.mark.parametrize("value, got", [("0", "got 0"), ("-1", "got -1"), ("three", "got 'three'"),
                                        (str(MAX_N_DRAFT + 1), f"got {MAX_N_DRAFT + 1}")])
@pytest.mark.parametrize("cmd", ["record", "diagnose", "sweep", "server run", "probe --replay"])
def test_n_draft_out_of_range_or_not_a_number_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cmd: str,
                                                          value: str, got: str) -> None:
    """``--n-draft 0`` / ``-1`` / ``three`` / 65: one line naming the option, the range 1..64 and the value given
    (was typer's "Invalid value" box, or for ``server run`` / ``probe --replay`` no check at all); the server is
    not started, no request is sent, nothing is written."""
    import mtpscope.traces.server.launch as launch
    import mtpscope.traces.server.probe as probe

    def must_not_run(*a, **k):
        raise AssertionError("started although --n-draft was bad")

    monkeypatch.setattr(launch, "launch", must_not_run)
    monkeypatch.setattr(probe, "probe", must_not_run)
    assert MAX_N_DRAFT == 64
    line = _one_line(runner.invoke(app, [*_n_draft_commands(tmp_path)[cmd], "--n-draft", value]))
    assert line.startswith("mtpscope: '--n-draft': "), line
    assert "1..64" in line and got in line, line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("value", ["1", "64"])
def test_n_draft_in_range_passes_the_check(tmp_path: Path, value: str) -> None:
    """1 and 64 are allowed: the command goes on and fails on what is really wrong (the missing model)."""
    line = _one_line(runner.invoke(app, [*_n_draft_commands(tmp_path)["record"], "--n-draft", value]))
    assert "--n-draft" not in line and "model.gguf" in line, line


def test_sweep_n_draft_list_names_the_bad_item(tmp_path: Path) -> None:
    line = _one_line(runner.invoke(app, [*_n_draft_commands(tmp_path)["sweep"], "--n-draft", "1,2,x"]))
    assert line.startswith("mtpscope: '--n-draft': 'x'"), line
    assert "1..64" in line and "got '1,2,x'" in line, line


@pytest.mark.parametrize("value, says", [("1,,2", "an empty item between commas"), ("1,2,", "an empty item"),
                                         ("2,1,2", "2 given twice")])
def test_sweep_n_draft_list_with_an_empty_or_repeated_item_is_refused(tmp_path: Path, value: str, says: str) -> None:
    """``--n-draft 1,,2`` dropped the empty item (two of the three values it seemed to name); ``2,1,2`` would record
    n_draft 2 twice. One line each, naming the list."""
    line = _one_line(runner.invoke(app, [*_n_draft_commands(tmp_path)["sweep"], "--n-draft", value]))
    assert line.startswith(f"mtpscope: '--n-draft': {says}"), line
    assert f"got {value!r}" in line and not (tmp_path / "o").exists(), line


# ----------------------------------------------------------------------------------- diagnose --out, absolute

def test_diagnose_writes_absolute_paths_and_links_with_the_default_out(demo_dir, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Run in a folder with relative --trace / --target / --assistant and the default --out: diagnosis.json, the
    --json document and every link's trace / model parameter name the files from the root, and they still exist
    when looked up from another folder (the app starts wherever it is started)."""
    src = Path(demo_dir.traces_noisy)
    if not (src / "manifest.json").exists():
        pytest.skip("demo traces need llama-cpp-python")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    rel = {name: os.path.relpath(p, work) for name, p in
           (("trace", src), ("target", demo_dir.target), ("assistant", demo_dir.drafter_upstream_noisy))}
    assert not any(os.path.isabs(p) for p in rel.values())
    res = runner.invoke(app, ["diagnose", "--trace", rel["trace"], "--target", rel["target"], "--assistant",
                              rel["assistant"], "--no-replay", "--json", "-q"])
    assert res.exit_code in (0, 1), (res.exit_code, res.stderr)
    doc = json.loads(res.stdout)
    out = work / "mtpscope-diagnose"
    assert doc["out"] == str(out)
    on_disk = json.loads((out / "diagnosis.json").read_text())
    for d in (doc, on_disk):
        assert os.path.samefile(d["trace"], src)
        for k in ("trace", "target", "assistant", "out"):
            assert os.path.isabs(d[k]), (k, d[k])
    paths = []
    links = [f["link"] for f in doc["findings"] if f.get("link")]
    assert links, doc["findings"]
    for link in links:
        query = parse_qs(urlsplit(link["url"]).query)
        for key in ("trace", "trace_b", "drafter", "target"):
            for v in [*query.get(key, []), *([link["params"][key]] if link["params"].get(key) else [])]:
                assert os.path.isabs(v), (key, v, link)
                paths.append(v)
    assert paths
    monkeypatch.chdir(tmp_path)                      # another folder: every path still names its file
    assert all(Path(p).exists() for p in paths), paths


# ------------------------------------------------------------------------------------------- trace repair

def _trace(d: Path, n_rounds: int = 5, **kw) -> object:
    from mtpscope.traces import RoundRecord, StepRecord, TraceWriter

    w = TraceWriter(d, {"source": "synthetic"}, n_embd_backbone=None, n_embd=None, hidden_dtype=None,
                    centroids=False, flush_every=2, compact=False, **kw)
    for r in range(n_rounds):
        a = r % 4
        w.add_round(RoundRecord(prompt_id=0, round=r, pos=r, pending_token=r, n_draft=3,
                                drafted=(r, r + 1, r + 2), n_accepted=min(a, 3)),
                    [StepRecord(k=k, token=r + k - 1, accepted=k <= a) for k in (1, 2, 3)])
    return w


def _leave_tmp_parts(d: Path) -> list[str]:
    """What a writer killed while writing a part or a merged file leaves: ``.tmp`` Parquet files."""
    names = ["rounds/part-00009.parquet.tmp", "steps/merged-00000.parquet.tmp"]
    for n in names:
        (d / n).parent.mkdir(exist_ok=True)
        (d / n).write_bytes(b"PAR1 half a file")
    return names


def test_repair_with_nothing_to_recover_removes_the_tmp_parts(tmp_path: Path) -> None:
    from mtpscope import traces

    d = tmp_path / "t"
    _trace(d).close(complete=False)
    finished = sorted(p.relative_to(d).as_posix() for p in d.rglob("*.parquet"))
    tmps = _leave_tmp_parts(d)
    assert all((d / n).is_file() for n in tmps)
    res = runner.invoke(app, ["trace", "repair", str(d), "--json"])
    assert res.exit_code == 0, (res.stdout, res.stderr)
    doc = json.loads(res.stdout)
    assert doc["status"] == "none" and sorted(doc["tmp_removed"]) == sorted(tmps)
    assert not any((d / n).exists() for n in tmps)
    assert sorted(p.relative_to(d).as_posix() for p in d.rglob("*.parquet")) == finished   # parts untouched
    assert doc["n_rounds"] == 5 and not any(".tmp" in w for w in doc["warnings"])
    assert not any(".tmp" in w for w in traces.open(d).warnings)
    # the text says it, and a second repair has nothing left to remove
    _leave_tmp_parts(d)
    text = runner.invoke(app, ["trace", "repair", str(d)])
    assert text.exit_code == 0 and "removed 2 unfinished parts" in text.stdout and tmps[0] in text.stdout
    again = runner.invoke(app, ["trace", "repair", str(d), "--json"])
    assert again.exit_code == 0 and json.loads(again.stdout)["tmp_removed"] == []


def test_repair_after_a_recovery_removes_the_tmp_parts_too(tmp_path: Path) -> None:
    d = tmp_path / "t"
    w = _trace(d, background=False)
    os.close(w._lock_fd)                       # the writer dies: its lock is released, its log stays
    w._lock_fd = None
    tmps = _leave_tmp_parts(d)
    doc = json.loads(runner.invoke(app, ["trace", "repair", str(d), "--json"]).stdout)
    assert doc["status"] == "recovered" and doc["n_rounds"] == 5
    assert not any((d / n).exists() for n in tmps)
    assert sorted(doc["tmp_removed"]) == sorted(tmps)   # (the recovery drops the merged file itself: said too)


def test_repair_names_a_log_it_could_not_read_to_its_end_on_stderr(tmp_path: Path) -> None:
    """A dead writer's log with garbage after its records: repair recovers what precedes it, exits 1 and names the
    log on stderr, as its help says (before: on stdout only, stderr empty)."""
    d = tmp_path / "t"
    w = _trace(d, background=False)
    os.close(w._lock_fd)                       # the writer dies: its lock is released, its log stays
    w._lock_fd = None
    logs = sorted((d / "wal").glob("part-*.log"))
    assert logs
    with open(logs[-1], "ab") as f:
        f.write(os.urandom(5000))
    res = runner.invoke(app, ["trace", "repair", str(d)])
    assert res.exit_code == 1, (res.stdout, res.stderr)
    named = [ln for ln in res.stderr.splitlines() if ln.startswith(f"mtpscope: {d}: wal/{logs[-1].name}")]
    assert named and "not read" in named[0] and named[0].endswith(".damaged"), res.stderr


@pytest.mark.parametrize("bad", [999, -5, "5"])
def test_repair_recounts_a_manifest_whose_counts_are_wrong(tmp_path: Path, bad: object) -> None:
    """A closed trace whose manifest counts 999, -5 or "5" rounds: repair sets the count read from every part (5) and
    says so, as its help promises (before: left as it was, beside its own "5 rounds"); a second repair finds nothing."""
    d = tmp_path / "t"
    _trace(d).close()
    man = json.loads((d / "manifest.json").read_text())
    man["counts"]["n_rounds"] = bad
    (d / "manifest.json").write_text(json.dumps(man))
    res = runner.invoke(app, ["trace", "repair", str(d)])
    assert res.exit_code == 0, (res.stdout, res.stderr)
    assert f"{d}: manifest counts corrected: n_rounds {bad!r} -> 5" in res.stdout
    assert json.loads((d / "manifest.json").read_text())["counts"]["n_rounds"] == 5
    doc = json.loads(runner.invoke(app, ["trace", "repair", str(d), "--json"]).stdout)
    assert doc["counts_corrected"] == {} and doc["n_rounds"] == 5


def test_repair_of_a_trace_with_a_garbage_part_says_so_and_exits_1(tmp_path: Path) -> None:
    """A closed trace whose rounds part is garbage: repair names the part on stderr (was stdout), its count line says
    how many rounds read against the manifest's count, and it exits 1 (was 0, the count unexplained)."""
    d = tmp_path / "t"
    _trace(d).close()
    bad = sorted((d / "rounds").glob("*.parquet"))[0]         # parts of 2 rounds: 2 of the 5 unreadable
    bad.write_bytes(b"garbage")
    res = runner.invoke(app, ["trace", "repair", str(d)])
    assert res.exit_code == 1, (res.stdout, res.stderr)
    assert f"warning: {bad}: unreadable rounds part skipped" in res.stderr and "warning:" not in res.stdout
    assert ("trace: 3 rounds, 15 draft steps readable (the manifest counts 5; parts skipped: see the warnings), "
            "complete") in res.stdout
    doc = json.loads(runner.invoke(app, ["trace", "repair", str(d), "--json"]).stdout)
    assert doc["n_rounds"] == 3 and any(str(bad) in w for w in doc["warnings"])


def test_repair_touches_nothing_while_a_writer_holds_the_lock(tmp_path: Path) -> None:
    d = tmp_path / "t"
    w = _trace(d, n_rounds=0)                  # open, no round yet: no log segment, but the lock is held
    try:
        tmps = _leave_tmp_parts(d)
        res = runner.invoke(app, ["trace", "repair", str(d), "--json"])
        assert res.exit_code == 1, (res.stdout, res.stderr)
        assert json.loads(res.stdout)["status"] == "live"
        assert all((d / n).exists() for n in tmps)
    finally:
        w.close()


@pytest.mark.parametrize("n_draft, parallel", [(0, 1), (-1, 1), (3, 0)])
def test_launch_refuses_bad_n_draft_or_parallel_before_starting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                n_draft: int, parallel: int) -> None:
    """The library's `launch(n_draft=0 / -1, parallel=0)` (what `server run` calls): a ServerError naming the option,
    before any process starts or any log file is written (was: llama-server started with `--spec-draft-n-max 0`)."""
    import subprocess

    from mtpscope.errors import ServerError
    from mtpscope.traces.server.launch import launch

    def must_not_run(*a, **k):
        raise AssertionError("llama-server started although an option was bad")

    monkeypatch.setattr(subprocess, "Popen", must_not_run)
    log = tmp_path / "server.log"
    with pytest.raises(ServerError) as e:
        launch(tmp_path / "t.gguf", tmp_path / "a.gguf", n_draft=n_draft, parallel=parallel, log=log,
               binary=tmp_path / "llama-server")
    assert e.value.key == ("--n-draft" if n_draft < 1 else "--parallel"), e.value.one_line()
    assert not log.exists()


def test_parallel_and_concurrency_below_range_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`server run --parallel 0`, `probe --concurrency 0`, `probe --check-concurrency 0`: one line naming the option;
    no process started, no request sent (port 9 refuses connections: a request would make the line say so)."""
    import subprocess

    def must_not_run(*a, **k):
        raise AssertionError("started although an option was bad")

    monkeypatch.setattr(subprocess, "Popen", must_not_run)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"hi"\n')
    o = str(tmp_path / "o")
    probe = ["probe", "http://127.0.0.1:9", "--prompts", str(prompts), "--out", o]
    for args, option in ((["server", "run", "--target", str(tmp_path / "t.gguf"), "--parallel", "0"], "--parallel"),
                         ([*probe, "--concurrency", "0"], "--concurrency"),
                         ([*probe, "--check-concurrency", "0"], "--check-concurrency")):
        line = _one_line(runner.invoke(app, args))
        assert line.startswith(f"mtpscope: '{option}': "), (args, line)
        assert "connect" not in line, line
        assert not (tmp_path / "o").exists(), args


# ------------------------------------------------------------------------------------------ record --out

def test_record_out_that_is_a_file_is_refused_before_any_model_loads(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``record --out FILE`` (an existing regular file, or a path below one) with a real, valid tiny pair: one line
    naming the path and ``--out``, exit 2, before the worker starts or a model loads (was: refused by the trace
    writer only after both models had loaded); the file is left as it was."""
    import mtpscope.traces.run.recorder as recorder
    import mtpscope.traces.run.worker_spawn as worker_spawn
    from tests.builders import build

    def must_not_run(*a, **k):
        raise AssertionError("started although --out is a file")

    monkeypatch.setattr(worker_spawn, "prespawn", must_not_run)
    monkeypatch.setattr(recorder, "record", must_not_run)
    target, drafter = build(tmp_path, "valid_target"), build(tmp_path, "valid_upstream")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "gemma4_text"}))
    out = tmp_path / "trace.txt"
    out.write_text("not a trace\n")
    for where, says in ((out, "is a file"), (out / "sub", f"below {out}, a file")):
        for runtime in (["--runtime", "llama", "--target", str(target), "--assistant", str(drafter)],
                        ["--runtime", "hf", "--target", str(hf), "--assistant", str(hf)]):
            line = _one_line(runner.invoke(app, ["record", *runtime, "--prompt", "x", "--out", str(where)]))
            assert line.startswith(f"mtpscope: {where}: '--out': "), (runtime, line)
            assert says in line and "not a folder" in line and "got a file)" in line, (runtime, line)
    assert out.read_text() == "not a trace\n"


# ------------------------------------------------ diagnose / replay / probe / sweep --out (cli.common.out_folder)

def _must_not_run(monkeypatch: pytest.MonkeyPatch, *targets: tuple[object, str]) -> None:
    """Replace each ``(module, name)`` with a function that fails the test when called (the command's long work)."""
    def must_not_run(*a, **k):
        raise AssertionError("started although --out is a file")

    for module, name in targets:
        monkeypatch.setattr(module, name, must_not_run)


def _file_out(tmp_path: Path) -> Path:
    out = tmp_path / "out.txt"
    out.write_text("not a folder\n")
    return out


def _assert_out_refused(args: list[str], out: Path, option: str = "--out") -> None:
    """``args`` + ``option`` at ``out`` (a file) and at a path below it: one line naming the path and the option,
    exit 2; the file is left as it was."""
    for where, says in ((out, "is a file"), (out / "sub" / "deeper", f"below {out}, a file")):
        line = _one_line(runner.invoke(app, [*args, option, str(where)]))
        assert line.startswith(f"mtpscope: {where}: '{option}': "), (args, line)
        assert says in line and "not a folder" in line and "got a file)" in line, (args, line)
    assert out.read_text() == "not a folder\n"


def _pair_command(tmp_path: Path, command: str) -> list[str]:
    """``command --target T --assistant A --prompts P`` over a real, valid tiny pair and a one-prompt file."""
    from tests.builders import build

    target, drafter = build(tmp_path, "valid_target"), build(tmp_path, "valid_upstream")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"hi"\n')
    return [command, "--target", str(target), "--assistant", str(drafter), "--prompts", str(prompts)]


def test_import_and_demo_out_that_is_a_file_is_refused_before_any_work(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``import fork-ndjson|server-log --out FILE`` and ``demo build|train --out FILE`` (or a path below a file): one
    line naming the path and the option, exit 2, before the log is read or any model is written (was: the writer's
    own error after the import's work, and the demo's build or training first)."""
    import mtpscope.demo.spec as spec
    import mtpscope.traces.importers as importers

    _must_not_run(monkeypatch, (importers, "import_fork_ndjson"), (importers, "import_server_log"),
                  (spec, "demo_is_current"))
    log = tmp_path / "log.ndjson"
    log.write_text("{}\n")
    out = _file_out(tmp_path)
    for args in (["import", "fork-ndjson", str(log)], ["import", "server-log", str(log)], ["demo", "build"],
                 ["demo", "train"]):
        _assert_out_refused(args, out)


def test_convert_out_that_is_a_folder_or_below_a_file_is_refused_before_any_work(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``convert --out`` and ``--centroids-out`` name GGUF files: an existing folder, or a path below a file, is
    refused in one line naming it and the option, exit 2, before the checkpoint is read (was: after the conversion,
    at the write)."""
    import mtpscope.inspector.convert as convert

    _must_not_run(monkeypatch, (convert, "convert"))
    hf = tmp_path / "hf"
    hf.mkdir()
    afile = _file_out(tmp_path)
    good = tmp_path / "ok.gguf"
    for option in ("--out", "--centroids-out"):
        rest = [] if option == "--out" else ["--out", str(good)]
        for where, says in ((tmp_path, "is a folder, not a file"), (afile / "x.gguf", f"below {afile}, a file")):
            line = _one_line(runner.invoke(app, ["convert", str(hf), *rest, option, str(where)]))
            assert line.startswith(f"mtpscope: {where}: '{option}': ") and says in line, (option, line)
    assert afile.read_text() == "not a folder\n" and not good.exists()


def test_record_n_top_past_the_vocabulary_is_refused_before_any_decode(tmp_path: Path) -> None:
    """``record --n-top`` above the target's vocabulary (4096 tokens in the tiny pair): one line naming n_top and the
    vocabulary, exit 2, no trace (was: every token stored per step, the manifest saying n_top 99999999)."""
    pytest.importorskip("llama_cpp")
    args = _pair_command(tmp_path, "record")
    out = tmp_path / "t"
    res = runner.invoke(app, [*args, "--out", str(out), "--n-top", "99999999", "--max-tokens", "4"])
    line = _one_line(res)
    assert res.exit_code == 2 and "'n_top'" in line and "1..4096" in line and "got 99999999" in line, line
    assert not (out / "manifest.json").exists()


def test_record_category_field_with_one_prompt_is_refused(tmp_path: Path) -> None:
    """``--category-field`` names a field of a prompts file; with ``--prompt`` it was silently ignored."""
    args = [a for a in _pair_command(tmp_path, "record") if a not in ("--prompts", str(tmp_path / "p.jsonl"))]
    res = runner.invoke(app, [*args, "--prompt", "hi", "--category-field", "topic", "--out", str(tmp_path / "t")])
    assert res.exit_code == 2 and _one_line(res) == ("mtpscope: --category-field 'topic' names a field of a --prompts "
                                                     "file; --prompt has no fields")
    assert not (tmp_path / "t").exists()


def test_diagnose_out_that_is_a_file_is_refused_before_any_work(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``diagnose --out FILE`` (or a path below a file) with a real, valid tiny pair: one line, exit 2, before verify,
    the recording or any runtime starts (was: the progress lines, then the library's mkdir failing inside
    ``diagnose``); ``--html`` at an existing folder or below a file is refused the same way (was: written only after
    the whole diagnosis, and then failing)."""
    import mtpscope.traces.diagnose.run as run
    import mtpscope.traces.diagnose.runtimes as runtimes

    _must_not_run(monkeypatch, (run, "diagnose"), (runtimes, "diagnose_runtime"))
    args = _pair_command(tmp_path, "diagnose")
    out = _file_out(tmp_path)
    _assert_out_refused(args, out)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "gemma4_text"}))
    _assert_out_refused(["diagnose", "--runtime", "hf", "--target", str(hf), "--assistant", str(hf),
                         "--against", str(tmp_path / "trace")], out)
    folder = tmp_path / "report"
    folder.mkdir()
    ok_out = ["--out", str(tmp_path / "diag")]
    line = _one_line(runner.invoke(app, [*args, *ok_out, "--html", str(folder)]))
    assert line.startswith(f"mtpscope: {folder}: '--html': is a folder, not a file"), line
    assert line.endswith("got a folder)"), line
    below = out / "report.html"
    line = _one_line(runner.invoke(app, [*args, *ok_out, "--html", str(below)]))
    assert line.startswith(f"mtpscope: {below}: '--html': lies below {out}, a file"), line
    assert not (tmp_path / "diag").exists() and out.read_text() == "not a folder\n"


def test_replay_out_below_a_file_is_refused_before_the_replay(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``replay TRACE --out FILE/sub``: one line, exit 2, before the reference drafter replays anything (was: the
    whole replay ran, then writing its summary failed); ``--out FILE`` itself says the same line."""
    import mtpscope.traces.run.replay as replay

    _must_not_run(monkeypatch, (replay, "replay"))
    _assert_out_refused(["replay", str(tmp_path / "trace")], _file_out(tmp_path))


def test_probe_out_that_is_a_file_is_refused_before_any_request(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``probe URL --out FILE`` (or below a file), plain and with ``--check-concurrency``: one line, exit 2, before a
    request is sent (was: the probe asked the server first; its trace writer refused the path only then)."""
    import mtpscope.traces.server.concurrency as concurrency
    import mtpscope.traces.server.probe as probe

    _must_not_run(monkeypatch, (probe, "probe"), (concurrency, "check_concurrency"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"hi"\n')
    out = _file_out(tmp_path)
    args = ["probe", "http://127.0.0.1:9", "--prompts", str(prompts)]
    _assert_out_refused(args, out)
    _assert_out_refused([*args, "--check-concurrency", "2"], out)


def test_sweep_out_that_is_a_file_is_refused_before_any_task(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``sweep --out FILE`` (or below a file) with a real, valid tiny pair, plain, with ``--assistant-quant`` and
    with ``--resume``: one line, exit 2, before a drafter is quantized or Ray starts (was: quantized and handed to
    the runner, which failed on the folder)."""
    import mtpscope.traces.sweep.quant as quant
    import mtpscope.traces.sweep.runner as runner_mod

    _must_not_run(monkeypatch, (runner_mod, "run_sweep"), (quant, "quant_assistants"))
    args = _pair_command(tmp_path, "sweep")
    out = _file_out(tmp_path)
    _assert_out_refused(args, out)
    _assert_out_refused([*args, "--assistant-quant", "q8_0"], out)
    _assert_out_refused(["sweep", "--resume"], out)


def test_a_graph_capture_nothing_reads_is_refused(demo_dir, tmp_path: Path) -> None:
    """``--capture graph`` copies h_inner, which only stored hidden states and a centroid head read: with
    ``--hidden off`` and no ``--centroids`` it is refused in one line (it was accepted and captured nothing), before
    anything is written (``RecordConfig``'s rule, tests/test_record_config.py)."""
    pair = ["--target", str(demo_dir.target), "--assistant", str(demo_dir.drafter_upstream)]
    out = tmp_path / "rec"
    line = _one_line(runner.invoke(app, ["record", *pair, "--prompt", "x", "--out", str(out), "--hidden", "off",
                                         "--capture", "graph"]))
    assert "--capture graph" in line and "--hidden off" in line and "--centroids" in line, line
    assert not out.exists()


def test_a_drafter_with_nan_weights_is_bad_input_not_a_crash(demo_dir, tmp_path: Path) -> None:
    """NaN in a drafter's weights makes every logit NaN: ``record`` ended with "internal error (IndexError ...)", exit
    3. Now one line naming the step and pointing at ``verify``, exit 2, the trace kept (marked incomplete)."""
    import shutil

    from mtpscope.inspector.gguf import open_gguf

    bad = tmp_path / "nan.gguf"
    shutil.copy(demo_dir.drafter_upstream, bad)
    with open_gguf(bad) as f:
        t = next(t for t in f.tensors if t.name.endswith("pre_projection.weight"))
        off, nbytes, typ = int(t.offset), int(t.n_bytes), t.type_name
    assert typ == "F32"
    with open(bad, "r+b") as fh:                   # every value of the input projection NaN (0xffffffff)
        fh.seek(off)
        fh.write(b"\xff" * nbytes)
    out = tmp_path / "rec"
    line = _one_line(runner.invoke(app, ["record", "--target", str(demo_dir.target), "--assistant", str(bad),
                                         "--prompt", "The quick brown fox", "--max-tokens", "8", "--out", str(out)]))
    assert "the drafter's logits are not finite at round 0, draft 1" in line and "mtpscope verify" in line, line
    man = json.loads((out / "manifest.json").read_text())
    assert man["complete"] is False


def test_diagnose_out_that_is_a_trace_directory_is_refused_before_any_work(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``diagnose --out TRACE`` wrote its diagnosis.json and replay/ into the trace (``replay --out`` refuses the same
    folder): one line naming the manifest, exit 2, before any step runs, nothing written."""
    import mtpscope.traces.diagnose.run as run

    _must_not_run(monkeypatch, (run, "diagnose"))
    trace = tmp_path / "trace"
    trace.mkdir()
    (trace / "manifest.json").write_text("{}")
    line = _one_line(runner.invoke(app, [*_pair_command(tmp_path, "diagnose"), "--out", str(trace)]))
    assert line.startswith(f"mtpscope: {trace}: 'manifest.json': diagnose --out is a trace directory"), line
    assert sorted(p.name for p in trace.iterdir()) == ["manifest.json"]


def test_a_category_field_no_prompt_has_is_refused_by_record_as_by_explain(demo_dir, tmp_path: Path) -> None:
    """``record --prompts P --category-field nope`` recorded without a category (exit 0) where ``explain
    --category-field nope`` refuses: now one line naming the file, the option and the prompts' fields, before
    anything is recorded; with ``--runtime hf`` and ``--runtime mlx`` too."""
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "a", "domain": "x"}\n{"prompt": "b", "domain": "y"}\n')
    out = tmp_path / "rec"
    line = _one_line(runner.invoke(app, ["record", "--target", str(demo_dir.target), "--assistant",
                                         str(demo_dir.drafter_upstream), "--prompts", str(p), "--category-field",
                                         "nope", "--out", str(out)]))
    assert line == (f"mtpscope: {p}: '--category-field': no prompt has a 'nope' field (the prompts' fields: "
                    "domain)"), line
    assert not out.exists()
    for runtime in ("hf", "mlx"):       # the same line before the runtime loads anything (checkpoint folders)
        hf = {}
        for role, model_type in (("target", "gemma4_text"), ("assistant", "gemma4_assistant")):
            hf[role] = tmp_path / f"{runtime}-{role}"
            hf[role].mkdir()
            (hf[role] / "config.json").write_text(json.dumps({"model_type": model_type}))
        other = _one_line(runner.invoke(app, ["record", "--runtime", runtime, "--target", str(hf["target"]),
                                              "--assistant", str(hf["assistant"]), "--prompts", str(p),
                                              "--category-field", "nope", "--out", str(out)]))
        assert other == line, (runtime, other)
        assert not out.exists()


def test_repair_reads_every_page_and_names_a_damaged_one(tmp_path: Path) -> None:
    """A closed trace whose steps part has a damaged page (its footer intact) in a column repair did not read: repair
    said "complete", exit 0, and the next command to read that column warned. Now every page is read, checksums
    verified: the part is named on stderr, exit 1."""
    import pyarrow.parquet as pq

    d = tmp_path / "t"
    _trace(d).close()
    part = sorted((d / "steps").glob("*.parquet"))[0]
    md = pq.read_metadata(part)
    names = [md.schema.column(i).name for i in range(md.num_columns)]
    col = md.row_group(0).column(names.index("token"))          # a column neither "round" nor "k"
    end = col.data_page_offset + col.total_compressed_size - 1   # the last byte of its page data
    raw = bytearray(part.read_bytes())
    raw[end] ^= 0xFF
    part.write_bytes(bytes(raw))
    pq.read_metadata(part)                                       # the footer still reads
    res = runner.invoke(app, ["trace", "repair", str(d)])
    assert res.exit_code == 1, (res.stdout, res.stderr)
    assert f"warning: {part}: unreadable steps part skipped" in res.stderr, res.stderr
