"""A real sweep on a real local Ray (2 CPUs, 2 workers) with the real llama.cpp and the demo pair:
2 n_draft values x 2 prompt shards + the plain-decoding baseline, small max_tokens.

- every finished task matches a sequential recording of the same task in this process, round for
  round (greedy: drafted, target, n_accepted, emitted, pos);
- a worker killed (SIGKILL) in the middle of a task gets the task retried on a fresh actor;
- a worker that aborts (as a GGML_ASSERT does) on both attempts leaves the task failed with the
  runtime's message, and the sweep finishes the others;
- ``resume`` finishes only what is missing: after the failure above, and after the driver itself
  (``mtpscope sweep`` in a subprocess) is killed with SIGKILL mid-sweep.

Faults are injected through the runner's test seam, the ``MTPSCOPE_SWEEP_FAULTS`` environment variable
(:func:`sweep_faults` here, or the subprocess's environment); the deaths are real process deaths that Ray
reports.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("ray")

pytestmark = [pytest.mark.slow, pytest.mark.llama]

PROMPTS = [("The quick brown fox", "prose"), ("def fibonacci(n):", "code"),
           ("Once upon a time", "prose"), ("import numpy as np", "code")]
MAX_TOKENS = 12
COLUMNS = ["prompt_id", "round", "pos", "pending_token", "n_draft", "drafted", "target", "n_accepted", "emitted"]
KILLED = "assistant=up/n_draft=3/shard=1"
ABORTED = "assistant=up/n_draft=2/shard=0"
HUNG = "assistant=baseline/n_draft=0/shard=1"


@pytest.fixture(scope="module")
def ray_local():
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             object_store_memory=100 * 1024 * 1024)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def spec(demo_dir, tmp_path_factory):
    from mtpscope.traces.sweep.spec import SweepSpec, read_prompt_set

    p = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    p.write_text("".join(json.dumps({"prompt": t, "category": c}) + "\n" for t, c in PROMPTS))
    return SweepSpec(target=os.fspath(demo_dir.target), assistants=(("up", os.fspath(demo_dir.drafter_upstream)),),
                     prompts=read_prompt_set(p), n_drafts=(2, 3), n_shards=2, baseline=True,
                     max_tokens=MAX_TOKENS, hidden="f16").check()


@pytest.fixture(scope="module")
def sequential(spec, tmp_path_factory):
    """Each task recorded here, one after the other, on one runtime: task id -> rounds / outputs."""
    from mtpscope.traces.run.mtp_runtime import MtpRuntime
    from mtpscope.traces.run.record_config import RecordConfig
    from mtpscope.traces.run.recorder import record
    from mtpscope.traces.store.reader import open_trace

    out = {}
    root = tmp_path_factory.mktemp("seq")
    with MtpRuntime(spec.target, spec.assistants[0][1], n_threads=1) as rtm:
        for t in spec.tasks():
            texts = [p.text for p in spec.shard_prompts(t.shard)]
            if t.is_baseline:
                out[t.task_id] = [rtm.generate_plain(rtm.prompt_tokens(x), max_tokens=MAX_TOKENS) for x in texts]
            else:
                d = root / t.task_id.replace("/", "_")
                record(RecordConfig(n_draft=t.n_draft, max_tokens=MAX_TOKENS, hidden="off", n_gpu_layers=0),
                       target=spec.target, assistant=spec.assistants[0][1], out=d, prompts=texts, runtime=rtm)
                out[t.task_id] = open_trace(d).rounds[COLUMNS]
    return out


def _canon(df):
    return [tuple(tuple(v) if isinstance(v, (list, np.ndarray)) else int(v) for v in row)
            for row in df[COLUMNS].itertuples(index=False)]


def _check_task(sweep_dir: Path, task_id: str, sequential) -> None:
    from mtpscope.traces.store.reader import open_trace

    tr = open_trace(sweep_dir / task_id)
    assert tr.manifest["complete"], task_id
    want = sequential[task_id]
    if task_id.startswith("assistant=baseline"):
        r = tr.rounds.sort_values(["prompt_id", "round"])
        got = []
        for pid in range(len(want)):
            rr = r[r["prompt_id"] == pid]
            got.append([int(rr["pending_token"].iloc[0]), *[int(e[0]) for e in rr["emitted"]]] if len(rr) else None)
        assert got == [list(w) for w in want], task_id
        assert (r["n_draft"] == 0).all() and (r["t_verify_ms"] > 0).all()
    else:
        assert _canon(tr.rounds.sort_values(["prompt_id", "round"])) == _canon(want), task_id


@contextlib.contextmanager
def sweep_faults(faults: dict[str, dict]) -> Iterator[None]:
    """Run the block with ``faults`` (task id -> fault) in the runner's test seam,
    :data:`~mtpscope.traces.sweep.runner.FAULTS_ENV`; it is unset again afterwards."""
    from mtpscope.traces.sweep.runner import FAULTS_ENV

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(FAULTS_ENV, json.dumps(faults))
        yield


def _states(d: Path) -> dict[str, dict]:
    return {t["task"]: t for t in json.loads((d / "sweep.json").read_text())["tasks"]}


def _mtimes(d: Path, tasks) -> dict[str, int]:
    return {t: (d / t / "manifest.json").stat().st_mtime_ns for t in tasks}


@pytest.fixture(scope="module")
def faulty_sweep(ray_local, spec, tmp_path_factory):
    from mtpscope.traces.sweep.runner import run_sweep

    out = tmp_path_factory.mktemp("sweep") / "a"
    faults = {KILLED: {"kind": "kill", "round": 2},
              ABORTED: {"kind": "abort", "round": 1, "attempts": [1, 2],
                        "message": "GGML_ASSERT(injected != nullptr) failed"}}
    with sweep_faults(faults):
        res = run_sweep(spec, out, workers=2, threads_per_worker=1, command=["test"])
    return out, res


def test_sweep_matches_sequential_and_retries_a_killed_worker(faulty_sweep, sequential) -> None:
    out, res = faulty_sweep
    assert (res.n_tasks, res.n_done, res.n_failed, res.workers, res.threads_per_worker) == (6, 5, 1, 2, 1)
    st = _states(out)
    # the killed task ran twice, the second time on a fresh actor, and finished
    assert st[KILLED]["state"] == "done" and st[KILLED]["attempts"] == 2
    assert st[KILLED]["worker"] not in ("worker-0", "worker-1")
    assert not list((out / KILLED).parent.glob("shard=1.partial-*"))   # the retry's partial folder is gone
    # the aborting task: failed after two attempts, with the runtime's own message
    assert st[ABORTED]["state"] == "failed" and st[ABORTED]["attempts"] == 2
    assert "GGML_ASSERT(injected != nullptr) failed" in st[ABORTED]["error"]
    assert "Fatal Python error: Aborted" in st[ABORTED]["stderr_tail"]
    assert res.failed == ((ABORTED, st[ABORTED]["error"]),)
    for tid, t in st.items():
        if t["state"] == "done":
            _check_task(out, tid, sequential)
            assert t["n_rounds"] > 0 and t["tokens_per_s"] > 0
            # every cell's manifest names its prompts' categories (the baseline's too)
            from mtpscope.traces.store.reader import open_trace

            shard = int(tid.rsplit("=", 1)[1])
            want = [c for i, (_, c) in enumerate(PROMPTS) if i % 2 == shard]
            assert [p.get("category") for p in open_trace(out / tid).manifest["prompts"]] == want, tid
    # llama.cpp ran with the actor's thread count
    from mtpscope.traces.store.reader import open_trace

    assert open_trace(out / KILLED).manifest["params"]["n_threads"] == 1


def test_resume_finishes_only_the_failed_task(faulty_sweep, sequential, spec) -> None:
    from mtpscope.traces.sweep.reader import open_sweep
    from mtpscope.traces.sweep.runner import run_sweep

    out, _ = faulty_sweep
    done = [t for t, s in _states(out).items() if s["state"] == "done"]
    before = _mtimes(out, done)
    res = run_sweep(spec, out, resume=True, workers=2, threads_per_worker=1, command=["test", "--resume"])
    assert (res.n_run, res.n_done, res.n_failed, res.workers) == (1, 6, 0, 1)
    assert _mtimes(out, done) == before
    _check_task(out, ABORTED, sequential)
    sw = open_sweep(out)
    assert sw.complete
    # the hidden states of a cell over its shards: each shard's, in prompt-set order
    cell = sw.cell("up", 3)
    h = cell.hidden("h")
    assert h.shape == (len(cell.steps), sw.cell("up", 3, shard=0).hidden("h").shape[1])
    s0 = sw.cell("up", 3, shard=0)
    first = s0.steps.index[s0.steps["prompt_id"] == 0]
    assert np.array_equal(h[: len(first)], s0.hidden("h")[first.to_numpy()], equal_nan=True)
    rep = sw.report()
    assert rep.complete and not rep.failed and set(rep.best) == {"all", "prose", "code"}
    assert {(c.assistant, c.n_draft) for c in rep.cells} == {("up", 2), ("up", 3), ("baseline", 0)}


def test_resume_after_the_driver_is_killed(ray_local, spec, sequential, tmp_path) -> None:
    from mtpscope.traces.sweep.runner import run_sweep

    out = tmp_path / "b"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t, "category": c}) + "\n" for t, c in PROMPTS))
    addr = ray_local.get_runtime_context().gcs_address
    from mtpscope.traces.sweep.runner import FAULTS_ENV

    env = {**os.environ, FAULTS_ENV: json.dumps({HUNG: {"kind": "hang", "round": 1}})}
    cmd = [sys.executable, "-m", "mtpscope.cli", "sweep", "--target", spec.target,
           "--assistant", f"up={spec.assistants[0][1]}", "--prompts", str(prompts), "--n-draft", "2,3",
           "--shards", "2", "--baseline", "--max-tokens", str(MAX_TOKENS), "--hidden", "f16",
           "--out", str(out), "--ray", addr, "--workers", "2", "--threads-per-worker", "1", "--no-progress"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 150
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            st = _states(out) if (out / "sweep.json").exists() else {}
            if st and st[HUNG]["state"] == "running" and sum(s["state"] == "done" for s in st.values()) == 5:
                break
            assert time.monotonic() < deadline, st
            time.sleep(0.3)
        os.kill(proc.pid, signal.SIGKILL)      # the driver dies; Ray ends its actors
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    done = [t for t, s in _states(out).items() if s["state"] == "done"]
    before = _mtimes(out, done)
    deadline = time.monotonic() + 60            # the dead job's actors give back their CPUs
    while ray_local.available_resources().get("CPU", 0) < 2:
        assert time.monotonic() < deadline, ray_local.available_resources()
        time.sleep(0.3)
    res = run_sweep(spec, out, resume=True, workers=2, threads_per_worker=1, command=["test", "--resume"])
    assert (res.n_run, res.n_done, res.n_failed) == (1, 6, 0)
    assert _mtimes(out, done) == before
    for tid in _states(out):
        _check_task(out, tid, sequential)
