"""Sweeps on Ray: record a prompt set against several configurations, one ordinary trace per task.

:func:`run_sweep` (``mtpscope sweep``) runs every task of a :class:`SweepSpec` -- one per (assistant,
n_draft, prompt shard), plus one per shard of plain decoding with ``baseline`` -- on Ray actors and
keeps ``DIR/sweep.json`` (layout: :mod:`traces.sweep.spec`, docs/SWEEP.md) up to date.

- **Actors load once, run many.** Each :class:`SweepWorker` actor keeps its llama.cpp models loaded
  (an :class:`MtpRuntime`) and takes the next task of the same assistant when there is one, so model
  loading is paid once per actor and assistant, not per task. On CPU an actor asks Ray for
  ``num_cpus = threads_per_worker`` and llama.cpp runs that many threads (``n_threads``); with
  ``gpus_per_worker`` it asks for ``num_gpus`` (Ray sets ``CUDA_VISIBLE_DEVICES``) and offloads every
  layer.
- **A task** is :func:`traces.run.recorder.record` (MTP) or :func:`traces.run.baseline.record_baseline`
  (plain decoding) into ``DIR/<task_id>/``, in the actor's process, on its loaded runtime.
- **The actor process is the isolation boundary.** A llama.cpp abort, a segfault or the OOM killer
  ends the actor; Ray reports it (``RayActorError``), the driver starts a fresh actor and runs the
  task once more there (``record(overwrite=True)`` keeps the partial trace until the new one is
  complete); a second death marks the task ``failed`` with the runtime's message: the tail of the
  actor's stderr (``DIR/_logs/worker-<n>.log``: llama.cpp's log lines, its abort message, Python's
  faulthandler dump). A Python error inside a task (bad prompt, a refusal) is not retried: the task
  is failed with that error's one line. The sweep finishes every other task.
- **Resume.** ``resume=True`` keeps each task that ``sweep.json`` says is ``done`` and whose trace
  is complete, and runs the others (pending, running when the driver was killed, failed). A killed
  sweep loses at most the tasks that were in flight.
- **Progress**: one rich bar on the driver's stderr: tasks done, tokens/s over the sweep so far,
  running acceptance rate (finished tasks plus the rounds of the ones in flight, polled from the
  actors).

Ray is an optional extra (``pip install 'mtpscope[sweep]'``); it is imported only inside
:func:`run_sweep`. Everything else (reading sweeps, reports, the app) works without it.

Imports: ray (lazily), traces.sweep.spec, traces.run.recorder, traces.run.mtp_runtime, traces.run.preflight,
traces.run.baseline, traces.store.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mtpscope.errors import MtpscopeError, RuntimeUnavailableError, TraceError
from mtpscope.traces.analysis import rates
from mtpscope.traces.store.layout import now
from mtpscope.traces.sweep.spec import (
    LOG_DIR,
    SWEEP_FILE,
    SweepSpec,
    SweepTask,
    TaskState,
    check_out_dir,
    new_state,
    read_state,
    task_states,
    write_state,
)

#: how often a task runs at most when its worker dies (the first run and one retry)
MAX_ATTEMPTS = 2
#: test seam, not an interface: JSON ``{task_id: {"kind": "kill"|"abort"|"hang", "round": r, "attempts": [1, ...],
#: "message": "..."}}`` in this variable makes chosen tasks die on purpose; read in one place,
#: :func:`_load_faults`, when :func:`run_sweep` starts (docs/SWEEP.md)
FAULTS_ENV = "MTPSCOPE_SWEEP_FAULTS"
TASK_MARK = "=== mtpscope sweep task "
STDERR_TAIL_LINES = 20


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RuntimeUnavailableError("Ray is not installed; install the sweep extra: pip install "
                                      "'mtpscope[sweep]'", key="ray", expected="ray importable",
                                      actual="missing") from None
    return ray


# ------------------------------------------------------------------------------------------ the actor

def _fault_action(fault: Mapping[str, Any] | None, attempt: int, count: int) -> None:
    """Carry out a test fault (:data:`FAULTS_ENV`) once ``count`` rounds / prompts are done."""
    if not fault or attempt not in fault.get("attempts", [1]) or count != int(fault.get("round", 1)):
        return
    kind = fault.get("kind", "kill")
    if kind == "abort":
        os.write(2, (str(fault.get("message", "GGML_ABORT: injected abort")) + "\n").encode())
        os.abort()
    elif kind == "hang":
        time.sleep(3600)
    else:
        os.kill(os.getpid(), signal.SIGKILL)


class SweepWorker:
    """The work of one Ray actor (wrapped with ``ray.remote`` by :func:`run_sweep`).

    Args:
        log_path: this actor's stderr file (fd 2 is redirected there, appended, so llama.cpp's own
            messages land in it; Python's faulthandler writes there too).
        n_threads: llama.cpp threads; n_gpu_layers: layers offloaded (-1 all, 0 CPU).
    """

    def __init__(self, log_path: str, n_threads: int, n_gpu_layers: int) -> None:
        import faulthandler

        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115 - stderr for the rest of the process, never closed
        os.environ["MTPSCOPE_LLAMA_LOG"] = "1"       # echo llama.cpp's log lines into that file
        faulthandler.enable(file=sys.stderr, all_threads=True)
        self.n_threads = int(n_threads)
        self.n_gpu_layers = int(n_gpu_layers)
        self._rtm: Any = None
        self._key: tuple[str, str, bool, bool] | None = None
        self._progress: dict[str, Any] = {}

    def info(self) -> dict[str, Any]:
        """``{"pid", "node"}`` of the actor's process."""
        return {"pid": os.getpid(), "node": socket.gethostname()}

    def progress(self) -> dict[str, Any]:
        """Counters of the task in flight: ``task``, ``rounds``, ``drafted``, ``accepted``, ``generated``."""
        return dict(self._progress)

    def _runtime(self, target: str, assistant: str, capture: bool, repack: bool = True) -> tuple[Any, float]:
        from mtpscope.traces.run.mtp_runtime import MtpRuntime

        key = (target, assistant, capture, repack)
        if self._rtm is not None and self._key == key:
            return self._rtm, 0.0
        if self._rtm is not None:
            self._rtm.close()
            self._rtm = self._key = None
        t0 = time.perf_counter()
        self._rtm = MtpRuntime(target, assistant, n_gpu_layers=self.n_gpu_layers, capture=capture,
                               n_threads=self.n_threads, repack=repack)
        self._key = key
        return self._rtm, time.perf_counter() - t0

    def loaded(self) -> str | None:
        """The assistant path of the loaded runtime, or None."""
        return None if self._key is None else self._key[1]

    def run(self, task: Mapping[str, Any], attempt: int, fault: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Run one task (a :func:`_task_payload`) and return its counters (see :class:`TaskState`)."""
        from mtpscope.traces.run.baseline import record_baseline
        from mtpscope.traces.run.recorder import record

        print(f"{TASK_MARK}{task['task']} attempt {attempt} ===", file=sys.stderr, flush=True)
        out = Path(task["out"])
        # the task's run parameters on this actor's device and threads
        config = replace(task["config"], n_gpu_layers=self.n_gpu_layers, n_threads=self.n_threads)
        baseline = task["baseline"]
        capture = config.capture
        if baseline and self._rtm is not None and self._key is not None and self._key[0] == task["target"]:
            rtm, load_s = self._rtm, 0.0              # plain decoding needs the target only
        else:
            rtm, load_s = self._runtime(task["target"], task["assistant_path"], capture, config.repack)
        prog = {"task": task["task"], "rounds": 0, "drafted": 0, "accepted": 0, "generated": 0}
        self._progress = prog
        t0 = time.perf_counter()
        command = [*task["command"], "--task", task["task"]]
        prompts = list(task["prompts"])
        if baseline:
            def on_prompt(pid: int, n_gen: int) -> None:
                prog["generated"] += n_gen
                prog["rounds"] += max(n_gen - 1, 0)
                _fault_action(fault, attempt, pid + 1)

            record_baseline(config, rtm=rtm, out=out, prompts=prompts, overwrite=True, command=command,
                            on_prompt=on_prompt)
        else:
            def on_round(pid: int, res: Any) -> None:
                prog["rounds"] += 1
                prog["drafted"] += len(res.drafted)
                prog["accepted"] += res.n_accepted
                prog["generated"] += len(res.emitted) + (1 if res.round == 0 else 0)
                _fault_action(fault, attempt, prog["rounds"])

            record(config, target=task["target"], assistant=task["assistant_path"], out=out, prompts=prompts,
                   overwrite=True, command=command, runtime=rtm, on_round=on_round)
        seconds = time.perf_counter() - t0
        _clean_siblings(out)
        counts = trace_counts(out)
        self._progress = {}
        return {**counts, "seconds": seconds, "load_seconds": load_s}

    def close(self) -> None:
        if self._rtm is not None:
            self._rtm.close()
            self._rtm = self._key = None


def _clean_siblings(out: Path) -> None:
    """Remove what earlier attempts of this task left next to its folder (``<dir>.partial-*`` /
    ``<dir>.old-*`` of ``record(overwrite=True)``)."""
    from mtpscope.traces.store.writer import replacement_leftovers

    for p in replacement_leftovers(out):
        shutil.rmtree(p, ignore_errors=True)


def trace_counts(trace_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """A finished task's counters from its trace: ``n_prompts``, ``n_rounds``, ``n_generated`` (each
    prompt's first token included), ``n_drafted``, ``n_accepted``, ``acceptance_rate`` (None without
    drafts) and ``tokens_per_s`` (emitted tokens / (t_draft_ms + t_verify_ms), the sweep's measured
    tokens/s; None without rounds)."""
    from mtpscope.traces.store.reader import open_trace

    tr = open_trace(trace_dir)
    r = tr.sql("SELECT count(*) AS n, coalesce(sum(n_draft), 0) AS nd, coalesce(sum(n_accepted), 0) AS na, "
               "coalesce(sum(len(emitted)), 0) AS ne, coalesce(sum(t_draft_ms + t_verify_ms), 0) AS t, "
               "count(DISTINCT prompt_id) AS np FROM rounds").iloc[0]
    n_prompts = len(tr.manifest.get("prompts") or [])
    nd, na, ne, t = int(r["nd"]), int(r["na"]), int(r["ne"]), float(r["t"])
    return {"n_prompts": n_prompts, "n_rounds": int(r["n"]), "n_generated": ne + n_prompts,
            "n_drafted": nd, "n_accepted": na, "acceptance_rate": rates.acceptance_rate(na, nd),
            "tokens_per_s": ne / (t / 1e3) if t > 0 else None}


# ------------------------------------------------------------------------------------------ the driver

@dataclass(frozen=True)
class SweepResult:
    """What :func:`run_sweep` did.

    Attributes:
        out: the sweep directory. n_tasks: all tasks; n_done / n_failed: their states at the end;
        n_run: tasks run by this call (the rest were done before: ``resume``); n_retried: tasks run a
        second time after their worker died. failed: ``(task_id, error)`` pairs. seconds: wall time.
        workers / threads_per_worker / gpus_per_worker: the actors used.
    """

    out: str
    n_tasks: int
    n_done: int
    n_failed: int
    n_run: int
    n_retried: int
    failed: tuple[tuple[str, str], ...]
    seconds: float
    workers: int
    threads_per_worker: int
    gpus_per_worker: float

    @property
    def ok(self) -> bool:
        return self.n_failed == 0 and self.n_done == self.n_tasks


def _task_payload(spec: SweepSpec, t: SweepTask, out: Path, command: Sequence[str]) -> dict[str, Any]:
    """What an actor needs for task ``t``: its folder, models, prompts (:class:`traces.run.prompts.PromptSpec`:
    text, tokens or messages, with id and category) and run parameters (:meth:`SweepSpec.record_config`; the
    baseline's takes only ``max_tokens`` and ``chat`` from it)."""
    prompts = [p.prompt_spec() for p in spec.shard_prompts(t.shard)]
    apath = spec.assistant_path(t.assistant) if not t.is_baseline else spec.assistants[0][1]
    return {"task": t.task_id, "out": os.fspath(out / t.task_id), "target": spec.target, "assistant_path": apath,
            "baseline": t.is_baseline, "config": spec.record_config(None if t.is_baseline else t.n_draft),
            "prompts": prompts, "command": list(command)}


_CRASH_RE = re.compile(r"^(\*\*\* SIG[A-Z]+ received|Fatal Python error)")


def stderr_tail(log_path: str | os.PathLike[str], task_id: str, attempt: int,
                n_lines: int = STDERR_TAIL_LINES) -> str:
    """What an actor wrote to stderr during one attempt of a task: its last ``n_lines`` lines before
    the crash dumps (Ray's ``*** SIGABRT received ...`` and Python's faulthandler), then one line
    naming the signal and the innermost Python frame of the thread that died; '' when nothing was
    written."""
    try:
        text = Path(log_path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    mark = f"{TASK_MARK}{task_id} attempt {attempt} ==="
    i = text.rfind(mark)
    if i >= 0:
        text = text[i + len(mark):]
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    start = next((j for j, ln in enumerate(lines) if _CRASH_RE.match(ln)), None)
    if start is None:
        return "\n".join(lines[-n_lines:])
    crash = lines[start:]
    fatal = [ln for ln in crash if ln.startswith("Fatal Python error")]
    sig = [ln for ln in crash if ln.startswith("*** SIG")]
    frames = [ln.strip() for ln in crash if ln.strip().startswith("File ")]
    return "\n".join(lines[:start][-n_lines:] + (fatal or sig)[:1] + frames[:1])


def runtime_message(tail: str) -> str:
    """The runtime's own message in a :func:`stderr_tail`: its last line before the crash dump, else
    the dump's first line, else ''."""
    lines = tail.splitlines()
    for i, ln in enumerate(lines):
        if _CRASH_RE.match(ln):
            return lines[i - 1].strip() if i > 0 else ln.strip()
    return lines[-1].strip() if lines else ""


def _error_line(e: BaseException) -> str:
    cause = getattr(e, "cause", None) or e
    if isinstance(cause, MtpscopeError):
        return cause.one_line()
    msg = " ".join(str(cause).split())
    return f"{type(cause).__name__}: {msg[:500]}"


def _resolve_address(ray_address: str) -> str | None:
    """``auto``: ``$RAY_ADDRESS`` when set, else None (a new local instance); ``local``: None;
    anything else: that address."""
    if ray_address == "auto":
        return os.environ.get("RAY_ADDRESS") or None
    if ray_address == "local":
        return None
    return ray_address


def _sizes(ray: Any, n_tasks: int, workers: int | None, threads: int | None,
           gpus: float) -> tuple[int, int, float]:
    """(workers, threads per worker, gpus per worker) that fit the cluster.

    Defaults: with GPUs, one worker per ``gpus_per_worker`` GPUs; on CPU one worker per 4 CPUs (at
    least one); never more workers than tasks. Threads: the cluster's CPUs / workers (at least 1).

    Raises:
        MtpscopeError: more GPUs or CPUs asked for than the cluster has.
    """
    res = ray.cluster_resources()
    n_cpu = max(int(res.get("CPU", 1)), 1)
    n_gpu = float(res.get("GPU", 0))
    if gpus > 0:
        if n_gpu < gpus:
            raise MtpscopeError("the Ray cluster has fewer GPUs than one worker asks for", key="--gpus-per-worker",
                                expected=f"<= {n_gpu:g}", actual=gpus)
        w = int(workers) if workers else max(int(n_gpu // gpus), 1)
        if w * gpus > n_gpu + 1e-9:
            raise MtpscopeError("workers x gpus-per-worker exceeds the cluster's GPUs", key="--workers",
                                expected=f"<= {int(n_gpu // gpus)}", actual=w)
    else:
        w = int(workers) if workers else max(n_cpu // 4, 1)
    w = max(min(w, n_tasks), 1)
    th = int(threads) if threads else max(n_cpu // w, 1)
    if gpus <= 0 and w * th > n_cpu:
        raise MtpscopeError("workers x threads exceeds the cluster's CPUs", key="--workers",
                            expected=f"workers x threads <= {n_cpu}", actual=f"{w} x {th}")
    return w, th, gpus


class _Progress:
    """The driver's one bar: tasks done, tokens/s so far, running acceptance rate."""

    def __init__(self, enabled: bool, total: int, done: int) -> None:
        self.bar = None
        self.t0 = time.perf_counter()
        self.tokens = self.drafted = self.accepted = 0
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("[bold]sweep[/]"), BarColumn(), MofNCompleteColumn(), TextColumn("tasks"),
                            TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[acc]}"),
                            TimeElapsedColumn(), console=Console(stderr=True))
        self.bar.start()
        self.id = self.bar.add_task("sweep", total=total, completed=done, rate="", acc="")

    def add_done(self, counts: Mapping[str, Any]) -> None:
        self.tokens += int(counts.get("n_generated") or 0)
        self.drafted += int(counts.get("n_drafted") or 0)
        self.accepted += int(counts.get("n_accepted") or 0)

    def show(self, done: int, inflight: Sequence[Mapping[str, Any]] = ()) -> None:
        if self.bar is None:
            return
        tok = self.tokens + sum(int(p.get("generated", 0)) for p in inflight)
        nd = self.drafted + sum(int(p.get("drafted", 0)) for p in inflight)
        na = self.accepted + sum(int(p.get("accepted", 0)) for p in inflight)
        dt = max(time.perf_counter() - self.t0, 1e-9)
        self.bar.update(self.id, completed=done, rate=f"{tok / dt:.1f} tokens/s",
                        acc=f"acceptance rate {rates.acceptance_rate(na, nd):.3f}" if nd else "")

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _load_faults() -> dict[str, Any]:
    """The test faults of :data:`FAULTS_ENV` (``{}`` when unset), per task id.

    Raises:
        MtpscopeError: the variable is set but not JSON.
    """
    raw = os.environ.get(FAULTS_ENV)
    if not raw:
        return {}
    try:
        got = json.loads(raw)
    except ValueError as e:
        raise MtpscopeError(f"{FAULTS_ENV} is not JSON: {e}", key=FAULTS_ENV) from None
    return got if isinstance(got, dict) else {}


def _check_models(spec: SweepSpec) -> None:
    """Pre-flight every (target, assistant) pair in the driver, before any actor starts."""
    from mtpscope.traces.run.preflight import preflight

    for _, path in spec.assistants:
        preflight(spec.target, path)


def _resume_state(spec: SweepSpec, out: Path, command: Sequence[str]) -> dict[str, Any]:
    """The stored state of ``out`` for ``--resume``: its spec must equal ``spec``; a ``done`` task
    whose trace is not complete any more is reset to pending.

    Raises:
        TraceError: the spec differs (naming what differs).
    """
    from mtpscope.errors import TraceFormatError
    from mtpscope.traces.store.reader import read_manifest

    state = read_state(out)
    old = SweepSpec.from_state(state, out / SWEEP_FILE)
    diff = old.differences(spec)
    if diff:
        raise TraceError("--resume: this sweep was started with other settings", path=out / SWEEP_FILE,
                         key="spec", expected="the stored spec", actual="; ".join(diff[:3]))
    tasks = []
    for ts in task_states(state):
        if ts.state == "done":
            try:
                ok = bool(read_manifest(out / ts.dir).get("complete"))
            except TraceFormatError:
                ok = False
            if not ok:
                ts = ts.with_(state="pending")
        tasks.append(ts.to_dict())
    state["tasks"] = tasks
    state.setdefault("resumed", []).append({"at": now(), "command": list(command)})
    return state


def run_sweep(spec: SweepSpec, out: str | os.PathLike[str], *, ray_address: str = "auto",
              workers: int | None = None, threads_per_worker: int | None = None, gpus_per_worker: float = 0.0,
              resume: bool = False, progress: bool = False, command: Sequence[str] | None = None) -> SweepResult:
    """Run (or, with ``resume``, finish) a sweep on Ray; see the module docstring.

    Args:
        spec: what to record (:meth:`SweepSpec.check` is applied; paths should be absolute, as actors
            may run elsewhere: the sweep directory and the models must be visible to every node at
            the same paths).
        out: the sweep directory (created).
        ray_address: ``auto`` ($RAY_ADDRESS, else a local instance sized to the machine), ``local``
            or a cluster address. An already initialised Ray (``ray.init`` by the caller) is used as is.
        workers / threads_per_worker / gpus_per_worker: actor sizes (defaults: :func:`_sizes`).
        resume: finish an existing sweep (the spec must match).
        progress: show the progress bar on stderr.
        command: argv for ``sweep.json`` and the traces' manifests (default ``sys.argv``).

    Returns:
        :class:`SweepResult` (``failed`` names each failed task with its message).

    Raises:
        MtpscopeError: a bad spec, a refused model pair (``LayoutError`` from the pre-flight), sizes that
            do not fit the cluster; TraceError: ``out`` holds a sweep and not ``resume`` (or a trace),
            ``resume`` with another spec; RuntimeUnavailableError: Ray missing.
        KeyboardInterrupt: Ctrl-C; ``sweep.json`` keeps every finished task, the rest run on ``--resume``.
    """
    t_start = time.perf_counter()
    spec.check()
    out = Path(out)
    check_out_dir(out, resume)
    command = list(command) if command is not None else list(sys.argv)
    faults = _load_faults()                           # tests only: tasks that die on purpose
    state = _resume_state(spec, out, command) if resume else new_state(spec, command=command)
    tasks = {t.task_id: t for t in spec.tasks()}
    states = {ts.task: ts for ts in task_states(state)}
    todo = [tid for tid in tasks if states[tid].state != "done"]

    def save() -> None:
        state["tasks"] = [states[tid].to_dict() for tid in tasks]
        state["complete"] = all(s.state == "done" for s in states.values())
        write_state(out, state)

    if not todo:                                      # --resume of a finished sweep: nothing to start
        save()
        return SweepResult(out=os.fspath(out), n_tasks=len(tasks), n_done=len(tasks), n_failed=0, n_run=0,
                           n_retried=0, failed=(), seconds=time.perf_counter() - t_start, workers=0,
                           threads_per_worker=0, gpus_per_worker=gpus_per_worker)
    _check_models(spec)
    ray = _ray()                                      # before anything is written: Ray missing -> one line
    started = False
    if not ray.is_initialized():
        addr = _resolve_address(ray_address)
        kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
        if addr is None:
            ray.init(address="local", num_cpus=os.cpu_count() or 1, **kw)
        else:
            ray.init(address=addr, **kw)
        started = True
    try:
        n_workers, n_threads, gpus = _sizes(ray, len(todo), workers, threads_per_worker, gpus_per_worker)
        state["ray"] = {"address": _resolve_address(ray_address) or "local", "workers": n_workers,
                        "threads_per_worker": n_threads, "gpus_per_worker": gpus}
        for tid in todo:                              # a fresh start for everything not done
            states[tid] = states[tid].with_(state="pending", attempts=0, error=None, stderr_tail=None)
        out.mkdir(parents=True, exist_ok=True)
        save()
        result = _drive(ray, spec, out, tasks, states, todo, save, n_workers=n_workers, n_threads=n_threads,
                        gpus=gpus, command=command, faults=faults, progress=progress)
    finally:
        if started:
            ray.shutdown()
    n_done = sum(s.state == "done" for s in states.values())
    failed = tuple((tid, s.error or "failed") for tid, s in states.items() if s.state == "failed")
    return SweepResult(out=os.fspath(out), n_tasks=len(tasks), n_done=n_done, n_failed=len(failed),
                       n_run=result[0], n_retried=result[1], failed=failed,
                       seconds=time.perf_counter() - t_start, workers=n_workers, threads_per_worker=n_threads,
                       gpus_per_worker=gpus)


def _drive(ray: Any, spec: SweepSpec, out: Path, tasks: Mapping[str, SweepTask], states: dict[str, TaskState],
           todo: list[str], save: Any, *, n_workers: int, n_threads: int, gpus: float, command: Sequence[str],
           faults: Mapping[str, Any], progress: bool) -> tuple[int, int]:
    """The scheduling loop; returns ``(tasks run, tasks retried)``."""
    from ray.exceptions import RayActorError

    opts: dict[str, Any] = {"num_cpus": n_threads, "max_restarts": 0, "max_concurrency": 2}
    if gpus > 0:
        opts["num_gpus"] = gpus
    remote_cls = ray.remote(SweepWorker).options(**opts)
    n_gpu_layers = -1 if gpus > 0 else 0
    pending = list(todo)
    actors: dict[int, Any] = {}                 # actor number -> handle
    loaded: dict[int, str | None] = {}          # actor number -> assistant name of its runtime
    reserved: dict[int, str] = {}               # fresh actor -> the task it must retry
    inflight: dict[Any, tuple[int, str, int]] = {}   # future -> (actor number, task, attempt)
    next_no = 0
    n_run = n_retried = 0
    bar = _Progress(progress, len(tasks), len(tasks) - len(todo))

    def log_path(no: int) -> str:
        return os.fspath(out / LOG_DIR / f"worker-{no}.log")

    def spawn() -> int:
        nonlocal next_no
        no = next_no
        next_no += 1
        actors[no] = remote_cls.remote(log_path(no), n_threads, n_gpu_layers)
        loaded[no] = None
        return no

    def pick(no: int) -> str | None:
        if no in reserved:
            return reserved.pop(no)
        want = loaded.get(no)
        for tid in pending:                      # in order, on the models loaded: the same assistant, or plain
            if want is not None and (tasks[tid].assistant == want or tasks[tid].is_baseline):   # decoding (any
                return tid                       # loaded target runs it)
        taken = set(loaded.values())
        for tid in pending:                      # an assistant no other actor holds
            if tasks[tid].assistant not in taken:
                return tid
        return pending[0] if pending else None

    def start(no: int) -> None:
        nonlocal n_run
        tid = pick(no)
        if tid is None:
            return
        if tid in pending:
            pending.remove(tid)
        ts = states[tid]
        attempt = ts.attempts + 1
        payload = _task_payload(spec, tasks[tid], out, command)
        fut = actors[no].run.remote(payload, attempt, faults.get(tid))
        inflight[fut] = (no, tid, attempt)
        if not tasks[tid].is_baseline:
            loaded[no] = tasks[tid].assistant
        elif loaded[no] is None:
            loaded[no] = spec.assistants[0][0]
        states[tid] = ts.with_(state="running", attempts=attempt, started=now(), worker=f"worker-{no}",
                               finished=None, error=None, stderr_tail=None)
        if attempt == 1:
            n_run += 1
        save()

    def busy() -> set[int]:
        return {v[0] for v in inflight.values()}

    try:
        for _ in range(min(n_workers, len(pending))):
            spawn()
        for no in list(actors):
            start(no)
        last_poll = 0.0
        while inflight:
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=0.5)
            for fut in ready:
                no, tid, attempt = inflight.pop(fut)
                ts = states[tid]
                try:
                    counts = ray.get(fut)
                except RayActorError as e:
                    tail = stderr_tail(log_path(no), tid, attempt)
                    actors.pop(no, None)
                    loaded.pop(no, None)
                    msg = runtime_message(tail) or _error_line(e).splitlines()[0]
                    if attempt < MAX_ATTEMPTS:
                        states[tid] = ts.with_(state="pending", error=f"worker died (attempt {attempt}): {msg}",
                                               stderr_tail=tail)
                        n_retried += 1
                        fresh = spawn()
                        reserved[fresh] = tid
                        start(fresh)
                    else:
                        states[tid] = ts.with_(state="failed", finished=now(), stderr_tail=tail,
                                               error=f"worker died {attempt} times; the runtime said: {msg}")
                        save()
                        if pending and len(actors) < n_workers:
                            start(spawn())
                    continue
                except Exception as e:  # noqa: BLE001 - a Python error inside the task: not retried
                    states[tid] = ts.with_(state="failed", finished=now(), error=_error_line(e),
                                           stderr_tail=stderr_tail(log_path(no), tid, attempt))
                    save()
                    start(no)
                    continue
                states[tid] = ts.with_(state="done", finished=now(), error=None, stderr_tail=None,
                                       **{k: counts.get(k) for k in ("seconds", "load_seconds", "n_prompts",
                                                                     "n_rounds", "n_generated", "n_drafted",
                                                                     "n_accepted", "tokens_per_s",
                                                                     "acceptance_rate")})
                bar.add_done(counts)
                save()
                start(no)
            for no in [n for n in actors if n not in busy() and n not in reserved]:
                if not pending:                   # nothing left for it: let it go
                    ray.kill(actors.pop(no))
                    loaded.pop(no, None)
            if bar.bar is not None and time.perf_counter() - last_poll > 1.0:
                last_poll = time.perf_counter()
                polls = [actors[no].progress.remote() for no in busy() if no in actors]
                got, _ = ray.wait(polls, num_returns=len(polls), timeout=0.2) if polls else ([], [])
                inflight_prog = []
                for g in got:
                    try:
                        inflight_prog.append(ray.get(g))
                    except Exception:  # noqa: BLE001 - a dying actor: its task result tells
                        pass
                bar.show(sum(s.state == "done" for s in states.values()), inflight_prog)
        bar.show(sum(s.state == "done" for s in states.values()))
    finally:
        bar.stop()
        save()
        for a in actors.values():
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - best effort
                pass
    return n_run, n_retried
