"""`mtpscope record` with llama.cpp in a worker process, against the real llama.cpp (0.3.36).

Two drafters that llama.cpp really aborts on, built here from the demo's upstream drafter:
``blk.0.attn_norm.weight`` rewritten as F16 (``GGML_ABORT`` in ``binary_op`` at the first draft step)
and a drafter for a wider backbone than the target's (``GGML_ASSERT(ggml_can_mul_mat(a, b))`` while
the drafter's graph is reserved). Pre-flight refuses both; ``--no-preflight`` lets them reach llama.cpp.
Then a worker killed by a fatal signal mid-run (as a driver fault would), a recorder killed with
``kill -9`` at five random moments (every round it reported survives; its worker goes with it).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from mtpscope import traces

pytestmark = pytest.mark.llama

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "The quick brown fox"


def _rewrite_gguf(src: Path, dst: Path, change: dict) -> Path:
    """Copy a GGUF (read with our reader, written with the project's one GGUF writer) with some tensors
    replaced (``{name: fn(array) -> array}``)."""
    from mtpscope.inspector.gguf import open_gguf
    from mtpscope.inspector.gguf_write import meta_value, write_gguf

    with open_gguf(src) as f:
        kv = [(k, meta_value(v)) for k, v in f.kv.items()
              if k != "general.architecture" and not k.startswith("GGUF.")]
        tensors = {}
        for t in f.tensors:
            a = np.array(f.tensor_data(t.name))
            tensors[t.name] = change[t.name](a) if t.name in change else a
        return write_gguf(dst, f.architecture, kv, tensors)


@pytest.fixture(scope="module")
def crashing(tiny_pair, tmp_path_factory) -> dict[str, Path]:
    from mtpscope.demo import build as demo

    target, noisy = tiny_pair(vocab="subset", noise=1.0)
    d = tmp_path_factory.mktemp("crash")
    f16 = _rewrite_gguf(noisy, d / "drafter-f16-norm.gguf",
                        {"blk.0.attn_norm.weight": lambda a: a.astype(np.float16)})
    wide = demo.write_drafter(d / "drafter-backbone-96.gguf", vocab="subset", noise=1.0,
                              dims=demo.TinyDims(n_embd_backbone=96))
    return {"target": target, "noisy": noisy, "f16_norm": f16, "wide": wide}


def _record(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtpscope.cli", "record", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, **kw)


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def test_f16_norm_drafter_refused_then_aborts_llama_cpp(crashing, tmp_path) -> None:
    args = ["--target", str(crashing["target"]), "--assistant", str(crashing["f16_norm"]), "--prompt", PROMPT,
            "--max-tokens", "16", "--no-progress"]
    # the pre-flight knows llama.cpp would abort (the inspector's rule): refused before loading
    res = _record([*args, "--out", str(tmp_path / "refused")])
    assert res.returncode == 1
    assert "E_DTYPE_VECTOR blk.0.attn_norm.weight (expected F32, got F16)" in _one_line(res.stderr)
    assert not (tmp_path / "refused").exists()
    # past the pre-flight, the real llama.cpp aborts at the first draft step: one line quoting it
    out = tmp_path / "aborted"
    res = _record([*args, "--no-preflight", "--out", str(out)])
    assert res.returncode == 1, res.stderr
    line = _one_line(res.stderr)
    assert line.startswith("mtpscope: llama.cpp aborted at prompt 0, round 0, draft step 1: "
                           "binary_op: unsupported types: dst: f32, src0: f32, src1: f16"), line
    assert "gdb" not in res.stderr and "backtrace" not in res.stderr.lower()
    tr = traces.open(out)
    m = tr.manifest
    assert m["complete"] is False and m["params"]["preflight"] is False and m["params"]["isolated"] is True
    ab = m["aborted"]
    assert (ab["signal"], ab["exit_code"], ab["prompt_id"], ab["round"], ab["step"], ab["phase"]) == \
        ("SIGABRT", None, 0, 0, 1, "draft")
    assert ab["message"] == "binary_op: unsupported types: dst: f32, src0: f32, src1: f16"
    assert any("binary_op" in ln for ln in ab["stderr_tail"])
    log = (out / "llama.log").read_text()
    assert "llama_model_load" in log or "load_tensors" in log          # llama.cpp's own log, kept in full
    assert "binary-ops.cpp" in log and "attach" not in log              # the abort, and no debugger
    assert len(tr.rounds) == 0                                          # it aborted in the first round


def test_ggml_assert_backbone_mismatch(crashing, tmp_path) -> None:
    args = ["--target", str(crashing["target"]), "--assistant", str(crashing["wide"]), "--prompt", PROMPT,
            "--no-progress"]
    res = _record([*args, "--out", str(tmp_path / "refused")])
    assert res.returncode == 1 and "E_PAIR_BACKBONE" in _one_line(res.stderr)
    out = tmp_path / "t"
    res = _record([*args, "--no-preflight", "--out", str(out)])
    assert res.returncode == 1
    line = _one_line(res.stderr)
    assert line.startswith("mtpscope: llama.cpp aborted while loading the models: "
                           "GGML_ASSERT(ggml_can_mul_mat(a, b)) failed"), line
    m = traces.open(out).manifest
    assert m["aborted"]["phase"] == "load" and m["aborted"]["signal"] == "SIGABRT"
    assert "ggml_can_mul_mat" in (out / "llama.log").read_text()


def test_abort_mid_run_keeps_every_round_before_it(crashing, tmp_path) -> None:
    """ggml's own ``ggml_abort`` called by the worker right after its loop queued round 5 (the worker's
    test fault), before its sender thread could send it: the abort hook lets the thread hand it over
    before the process dies, so rounds 0-5 are all in the trace, the message is quoted in one line and
    the manifest says where it stopped. (Without the hook round 5 is lost.)"""
    out = tmp_path / "t"
    env = {**os.environ, "MTPSCOPE_WORKER_FAULT": json.dumps({"abort_at_round": 6})}
    res = _record(["--target", str(crashing["target"]), "--assistant", str(crashing["noisy"]), "--prompt", PROMPT,
                   "--max-tokens", "400", "--no-progress", "--out", str(out)], env=env)
    assert res.returncode == 1
    line = _one_line(res.stderr)
    assert line.startswith("mtpscope: llama.cpp aborted at prompt 0, round 6") and line.split(": ", 2)[2].startswith(
        "MTPSCOPE_WORKER_FAULT: injected abort at round 6 (trace "), line
    tr = traces.open(out)
    assert tr.manifest["complete"] is False and tr.manifest["aborted"]["signal"] == "SIGABRT"
    assert tr.manifest["aborted"]["round"] == 6
    assert list(tr.rounds["round"]) == [0, 1, 2, 3, 4, 5]
    assert len(tr.steps) == int(tr.rounds["n_draft"].sum())


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mtpscope.cli", "record", *args, "--verbose"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _read_rounds(proc: subprocess.Popen, until: int, deadline: float) -> list[tuple[int, int, int]]:
    """``round P:R n_accepted=N`` lines from the recorder's stderr until ``until`` of them."""
    got = []
    for line in proc.stderr:
        if line.startswith("round "):
            p, r = line.split()[1].split(":")
            got.append((int(p), int(r), int(line.split("n_accepted=")[1])))
            if len(got) >= until:
                break
        if time.monotonic() > deadline:
            break
    return got


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc children and PR_SET_PDEATHSIG")
def _signal_worker_mid_run(crashing, out: Path, n_rounds: int, sig: signal.Signals) -> tuple[list, str]:
    """Record with --verbose until ``n_rounds`` rounds are reported, send ``sig`` to llama.cpp's process (the
    worker), and return the rounds reported and the recorder's stderr once it has exited with 1."""
    proc = _start(["--target", str(crashing["target"]), "--assistant", str(crashing["noisy"]), "--prompt", PROMPT,
                   "--max-tokens", "100000", "--out", str(out)])
    try:
        got = _read_rounds(proc, n_rounds, time.monotonic() + 120)
        kids = _children(proc.pid)
        assert len(got) == n_rounds and len(kids) == 1
        os.kill(kids[0], sig)
        err = proc.stderr.read()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    return got, err


def test_worker_killed_mid_run_keeps_every_round(crashing, tmp_path) -> None:
    """A fatal signal in llama.cpp's process after some rounds (a driver fault): one line, exit 1, and
    every round the recorder reported is in the trace."""
    out = tmp_path / "t"
    got, err = _signal_worker_mid_run(crashing, out, 5, signal.SIGSEGV)
    line = [ln for ln in err.splitlines() if ln.startswith("mtpscope:")]
    assert len(line) == 1 and line[0].startswith("mtpscope: llama.cpp crashed (SIGSEGV) at prompt 0, round "), err
    tr = traces.open(out)
    keys = set(zip(tr.rounds["prompt_id"], tr.rounds["round"]))
    assert {(p, r) for p, r, _ in got} <= keys
    assert tr.manifest["aborted"]["signal"] == "SIGSEGV"
    assert tr.manifest["aborted"]["n_rounds_received"] == len(tr.rounds)


def test_worker_stopped_from_outside_is_not_given_a_cause_from_its_log(crashing, tmp_path) -> None:
    """A SIGTERM to llama.cpp's process (a service manager, a shell): the line says it was stopped from outside and
    quotes no log line (its log just ends; the last line used to be quoted as if it were the cause)."""
    out = tmp_path / "t"
    _got, err = _signal_worker_mid_run(crashing, out, 3, signal.SIGTERM)
    line = [ln for ln in err.splitlines() if ln.startswith("mtpscope:")]
    assert len(line) == 1 and line[0].startswith("mtpscope: llama.cpp was stopped from outside (SIGTERM) at prompt 0, "
                                                 "round "), err
    head = line[0].split(" (trace ")[0]
    assert ": " not in head.removeprefix("mtpscope: "), line[0]          # nothing quoted after the place
    man = traces.open(out).manifest
    m = man["aborted"]
    assert m["signal"] == "SIGTERM" and m["message"] is None and m["how"] == "was stopped from outside (SIGTERM)"
    # the app's banner says what the command line said
    from mtpscope.app.verdict import trace_state_line

    assert trace_state_line("trace A", man).startswith(f"Trace A is incomplete: {head.removeprefix('mtpscope: ')} — ")


def test_death_words_and_which_log_line_is_quoted() -> None:
    """How a worker's end is worded (negative return codes are signals), and ``abort_message``: ggml's abort line
    always, the last line only for a crash (not for a process stopped from outside)."""
    from mtpscope.traces.run.llama.process import abort_message
    from mtpscope.traces.run.record_worker import death_words

    assert death_words(-signal.SIGABRT) == ("SIGABRT", "aborted", False)
    assert death_words(-signal.SIGSEGV) == ("SIGSEGV", "crashed (SIGSEGV)", False)
    assert death_words(-signal.SIGTERM) == ("SIGTERM", "was stopped from outside (SIGTERM)", True)
    assert death_words(-signal.SIGKILL) == ("SIGKILL", "was killed (SIGKILL; out of memory?)", True)
    assert death_words(3) == (None, "exited with code 3", False)
    log = ["llama_context: n_ctx = 512", "ggml/src/ggml-cpu/ops.cpp:12: GGML_ASSERT(x) failed", "load_tensors: done"]
    assert abort_message(log, last_line=False) == abort_message(log) == "GGML_ASSERT(x) failed"
    plain = ["llama_context: n_ctx = 512", "decode: 3 tokens"]
    assert abort_message(plain) == "decode: 3 tokens" and abort_message(plain, last_line=False) is None


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc children and PR_SET_PDEATHSIG")
def test_sigkill_at_five_random_moments_loses_no_reported_round(crashing, tmp_path) -> None:
    """``kill -9`` of the recorder at 5 random moments of a long run (defaults: a Parquet part every 32 rounds, the write-ahead log between):
    every round it reported (``--verbose``) is in the trace, read back after recovering the
    write-ahead log, and the llama.cpp worker dies with it."""
    rng = random.Random(11)
    results = []
    for i in range(5):
        out = tmp_path / f"k{i}"
        proc = _start(["--target", str(crashing["target"]), "--assistant", str(crashing["noisy"]),
                       "--prompt", PROMPT, "--max-tokens", "100000", "--out", str(out)])
        try:
            first = _read_rounds(proc, 1, time.monotonic() + 120)
            assert first, "no round reported"
            kids = _children(proc.pid)
            time.sleep(rng.uniform(0.05, 2.0))           # a random moment of the run
            os.kill(proc.pid, signal.SIGKILL)
            rest = [ln for ln in proc.stderr.read().splitlines() if ln.startswith("round ")]
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        reported = {(0, int(ln.split()[1].split(":")[1])) for ln in rest} | {(p, r) for p, r, _ in first}
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{k}").exists() for k in kids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert kids and not any(Path(f"/proc/{k}").exists() for k in kids), "worker outlived the recorder"
        tr = traces.open(out)
        r = tr.rounds
        survived = set(zip(r["prompt_id"], r["round"]))
        assert reported <= survived, (i, sorted(reported - survived))
        assert list(r["round"]) == list(range(len(r)))                    # contiguous from round 0
        assert len(tr.steps) == int(r["n_draft"].sum())
        results.append((len(reported), len(survived)))
    (tmp_path / "results.json").write_text(json.dumps(results))
    print("reported vs survived per kill:", results)


def test_worker_and_in_process_recordings_are_identical(crashing, tmp_path) -> None:
    """Everything the loop produces passes the worker's transport unchanged: prompts given as text, token
    ids and chat messages, h_target and the plain-decoding baseline; rounds, steps and hidden states
    equal an in-process recording of the same run exactly."""
    from mtpscope.traces.run.mtp_runtime import MtpRuntime
    from mtpscope.traces.run.record_config import RecordConfig
    from mtpscope.traces.run.recorder import record

    pf = tmp_path / "prompts.jsonl"
    lines = [{"prompt": PROMPT, "id": "fox", "category": "story"}, {"tokens": [2, 651, 3823, 1024], "id": 7},
             {"messages": [{"role": "user", "content": "Hello"}]}]
    pf.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    cfg = RecordConfig(max_tokens=20, hidden="f32", hidden_target=True, baseline=True, n_gpu_layers=0)
    kw = dict(target=crashing["target"], assistant=crashing["noisy"], prompts_file=pf, command=["test"])
    s_iso = record(cfg, out=tmp_path / "iso", **kw)
    # no cb_eval in the loop, as in the worker: h_inner derived from the same outputs by the same solve
    with MtpRuntime(crashing["target"], crashing["noisy"], n_gpu_layers=0, capture=False) as r:
        s_in = record(cfg, out=tmp_path / "in", runtime=r, **kw)
    assert s_iso.isolated and not s_in.isolated and s_iso.outputs == s_in.outputs
    a, b = traces.open(tmp_path / "iso"), traces.open(tmp_path / "in")
    assert a.manifest["prompts"] == b.manifest["prompts"]
    assert a.manifest["derived"] == b.manifest["derived"] and a.manifest["derived"]["columns"] == ["h_inner"]
    assert a.manifest["baseline"]["outputs_equal"] is True and a.manifest["params"]["isolated"] is True
    # both ran the probe of every round size after the loop (timings differ, the sizes do not)
    for m in (a.manifest, b.manifest):
        cp = m["cost_probe"]
        assert sorted(map(int, cp["verify_ms"])) == list(range(1, 10)) and sorted(map(int, cp["draft_ms"])) == list(range(1, 9))
        assert all(v > 0 for v in [*cp["verify_ms"].values(), *cp["draft_ms"].values()]) and cp["reps"] >= 1
    cols = [c for c in a.rounds.columns if not c.startswith("t_")]          # timings differ, of course
    assert a.rounds[cols].equals(b.rounds[cols])
    assert a.steps.equals(b.steps)
    for name in ("h", "h_next", "h_inner", "h_target"):
        np.testing.assert_array_equal(a.hidden(name), b.hidden(name))
    assert (tmp_path / "iso" / "llama.log").is_file()
