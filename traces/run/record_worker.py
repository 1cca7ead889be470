"""The recording worker: llama.cpp and the MTP loop in a child process, so that a crash of the runtime
costs the recorder nothing but the round in progress (and :class:`InProcessRounds`, the same interface
without the process, for an already loaded runtime).

Parent (:class:`RecordWorker`, used by :func:`traces.run.recorder.record`) and child
(``python -m mtpscope.traces.run.record_worker``, :func:`main`) talk through :mod:`traces.run.transport`, every
message one frozen dataclass of :mod:`traces.run.worker_protocol` (built once, read by its attributes):

1. The parent starts the child with a control socket, a 4 KiB shared *status* block (where the child
   notes, before every llama.cpp decode, which prompt / round / draft step it is in) and the
   environment :data:`traces.run.worker_spawn.WORKER_ENV` and ``ABORT_ENV`` (no debugger from ggml's abort
   handler; :mod:`traces.run.worker_spawn` starts it, before the job is known when ``mtpscope record`` asks). The
   child's stdout and stderr (llama.cpp's log and any abort message) go to a pipe that a parent thread
   copies to ``llama.log`` in the trace folder and keeps the tail of.
2. ``start`` (parent -> child): the run, a :class:`traces.run.record_config.RecordJob` (models,
   prompts, :class:`~traces.run.record_config.RecordConfig`) packed by :func:`traces.run.packing.pack`.
   The child loads the models, tokenizes the prompts and answers ``hello`` (widths, vocabulary, context
   size, runtime facts, prompt lengths), then waits for ``go``: the parent sends the job first and runs its
   pre-flight check while the child loads (start-up = the longer of the two, not their sum), so nothing is
   decoded before the pair passed the check; a refused pair ends the child (:meth:`RecordWorker.abandon`,
   it has loaded at most). When the run derives ``h_inner`` (no ``cb_eval`` in the loop), a
   ``calibration`` message comes after the last prompt (:class:`~traces.run.mtp_runtime.Calibration`: a few
   drafter steps run after the loop in a temporary context with the in-graph capture, so the first decode
   does not wait for them; released like a round).
3. Per finished round: a ``round`` message (the ``RoundResult``, its arrays in the shared ring); the
   parent analyses and writes it, then ``release``s it. The parent is woken for rounds in sixteens (the ring's
   doorbell, :data:`WAKE_EVERY`; :func:`ring_slots`) and tells its releases in one message. Per prompt: ``prompt_done``. At the end ``done``
   (loop wall and CPU seconds). In the child the loop only copies a round's arrays into the ring (each drafter
   row with its top-k found in the same read: ``row_kernels.copy_top_k``, into buffers of its own that are
   summarized before the round is sent, ``step_analysis.summarize_drafts``; into the ring with ``--centroids``); a
   sender thread packs and sends it while llama.cpp computes the next round (``RoundSender(threaded=
   True)``), and a ``GGML_ABORT`` / ``GGML_ASSERT`` first lets it send what it holds
   (:func:`traces.run.llama.process.set_abort_hook`), so the rounds before an abort still reach the trace.
4. ``stop`` (Ctrl-C in the parent): the child stops before sending its next round and exits 0.

The child dies with the parent (``PR_SET_PDEATHSIG``: no orphaned llama.cpp holding a GPU after a
``kill -9`` of the recorder) and ignores SIGINT (the parent decides). When the child dies instead
(signal, non-zero exit, socket closed), :meth:`RecordWorker.events` raises
:class:`~mtpscope.errors.RuntimeAbortedError` carrying the ``aborted`` record for the manifest.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import itertools
import json
import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, BinaryIO, cast

from mtpscope import errors as E
from mtpscope.errors import MtpscopeError, RuntimeAbortedError
from mtpscope.traces.run.record_config import RecordJob
from mtpscope.traces.run.transport import Channel, RoundReceiver, RoundSender, StopRequested, TransportClosed
from mtpscope.traces.run.worker_protocol import (
    CALIBRATION,
    ROUND,
    Baseline,
    Event,
    Go,
    Hello,
    ProbeDone,
    PromptDone,
    Start,
    Stop,
    Stopped,
    WorkerDone,
    WorkerError,
    WorkerRound,
    decode,
    encode,
)
from mtpscope.traces.run.worker_spawn import spawn_worker, take_prespawned
from mtpscope.traces.store.layout import LLAMA_LOG

if TYPE_CHECKING:
    import numpy as np

    from mtpscope.traces.run.mtp_runtime import Calibration, MtpRuntime

#: lines of the worker's stderr kept for the ``aborted`` record (all of it is in ``llama.log``)
STDERR_TAIL = 80
#: a test fault, JSON ``{"abort_at_round": N}``: the worker calls ggml's own ``ggml_abort`` right after
#: handing round N - 1 of a prompt to its sender thread (the real abort path, hook included)
FAULT_ENV = "MTPSCOPE_WORKER_FAULT"
#: the worker's ``sys.setswitchinterval``: how soon the sender thread yields the GIL to the loop
SWITCH_INTERVAL_S = 0.0002
#: seconds an abort waits for the round sender to hand over the rounds it holds (a stuck recorder must not
#: keep a dying llama.cpp, e.g. one holding a GPU, alive)
ABORT_FLUSH_S = 5.0
#: rounds the recorder is woken for at once (the transport's doorbell: ``RoundSender(wake_every=...)``): one
#: wake-up per round cost the recorder about as much again as its work on a round of the tiny demo pair
#: (``benchmarks/bench_idle_memory.py``), so it handles rounds in sixteens (at least every
#: ``transport.WAKE_AFTER_S``); the ring holds two more, so the loop goes on while it does. Fours before: the
#: recorder's CPU per tiny round 0.89 / 0.99 ms with four, 0.70 ms with sixteen; the sender thread's 1.06 / 1.04 ms
#: and 0.97 ms (``bench_record.py --max-tokens 400``, 5 pairs each, alternating, docs/RECORDING.md)
WAKE_EVERY = 16
#: contexts of more tokens than this are checked against the machine's memory before llama.cpp allocates them
#: (:func:`traces.run.preflight.check_context_memory`, which reads both GGUF headers again: 0.2 s on the demo pair);
#: up to it the KV cache of every Gemma 4 size is far below the weights the worker already holds (8192 tokens,
#: llama.cpp's F16 cache with swa_full: 31B 7.2 GiB, 26B-A4B 1.8, E4B 0.59, E2B 0.19; inspector.estimate on
#: sample_configs), so a run of usual length pays nothing for it
CONTEXT_CHECK_ABOVE = 8192
#: the most shared memory the ring takes; fewer slots when rounds are bigger (down to 3, waking the recorder
#: every round when only 3 fit: a pair with many drafts of a big vocabulary has rounds long enough for that)
RING_BUDGET_BYTES = 64 << 20


def ring_slots(slot_bytes: int) -> tuple[int, int]:
    """``(n_slots, wake_every)`` of the ring for rounds of ``slot_bytes`` (:func:`round_bytes`):
    ``WAKE_EVERY + 2`` slots within :data:`RING_BUDGET_BYTES`, at least 3; the doorbell rings every
    ``n_slots - 2`` rounds (1: every round, no doorbell)."""
    n = max(3, min(WAKE_EVERY + 2, RING_BUDGET_BYTES // max(int(slot_bytes), 1)))
    return n, n - 2


#: seconds the worker gets to stop after a Ctrl-C before it is killed
STOP_GRACE_S = 10.0

# status block: magic, prompt_id, round, step, phase, n_decodes (int64 each)
_STATUS = struct.Struct("<6q")
_MAGIC = 0x6D7470736370  # "mtpscp"
PHASES = ("start", "load", "prefill", "draft", "verify", "done")
_PHASE = {p: i for i, p in enumerate(PHASES)}


class Status:
    """Where the worker is: written by the child before each decode, read by the parent after a crash."""

    def __init__(self, mm: mmap.mmap) -> None:
        self.mm = mm
        self.prompt_id = self.round = self.step = 0
        self.phase = "start"
        self.n_decodes = 0
        #: wall seconds spent inside llama.cpp decodes (the loop's time outside them is the Python around it)
        self.decode_seconds = 0.0
        self._drafted = False

    def _store(self) -> None:
        _STATUS.pack_into(self.mm, 0, _MAGIC, self.prompt_id, self.round, self.step, _PHASE[self.phase],
                          self.n_decodes)

    def set(self, phase: str, prompt_id: int | None = None) -> None:
        if prompt_id is not None:
            self.prompt_id, self.round, self.step, self._drafted = int(prompt_id), 0, 0, False
        self.phase = phase
        self._store()

    def on_decode(self, draft: bool) -> None:
        """Before a llama.cpp decode: the drafter's (``draft``) or the target's (prefill / verify)."""
        self.n_decodes += 1
        if draft:
            self.step += 1
            self._drafted = True
            self.phase = "draft"
        else:
            self.phase = "verify" if self._drafted else "prefill"
        self._store()

    def next_round(self) -> None:
        self.round += 1
        self.step = 0
        self._drafted = True  # later target decodes of this prompt are verifies
        self._store()

    @staticmethod
    def read(mm: mmap.mmap) -> dict[str, Any] | None:
        magic, pid, rnd, step, phase, n = _STATUS.unpack_from(mm, 0)
        if magic != _MAGIC:
            return None
        return {"prompt_id": pid, "round": rnd, "step": step,
                "phase": PHASES[phase] if 0 <= phase < len(PHASES) else "unknown", "n_decodes": n}


# ================================================================================== child side
def _die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this process when the parent dies (also if it already has)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # pragma: no cover - no prctl
            pass
    if os.getppid() != parent:
        os._exit(1)


def _fault_round() -> int | None:
    """The round of the test fault :data:`FAULT_ENV` asks for, or None."""
    raw = os.environ.get(FAULT_ENV)
    if not raw:
        return None
    return int(json.loads(raw)["abort_at_round"])


def _instrument(rtm: MtpRuntime, status: Status) -> None:
    """Note every decode of the runtime's two contexts in ``status`` (instance-level wrappers)."""
    for ctx, draft in ((rtm.tctx, False), (rtm.dctx, True)):
        if getattr(ctx, "_mtpscope_status", None) is status:
            continue
        orig = ctx.decode

        def timed_decode(batch: Any, _orig: Any = orig, _draft: bool = draft, _perf: Any = time.perf_counter) -> None:
            status.on_decode(_draft)
            t0 = _perf()
            try:
                _orig(batch)
            finally:
                status.decode_seconds += _perf() - t0

        ctx.decode = timed_decode  # type: ignore[method-assign]  # an instance-level wrapper, on purpose
        ctx._mtpscope_status = status  # type: ignore[attr-defined]  # the wrapper's mark: wrap each context once


def _error_message(e: BaseException) -> WorkerError:
    if isinstance(e, MtpscopeError):
        return WorkerError(type(e).__name__, e.message, path=None if e.path is None else os.fspath(e.path),
                           offset=e.offset, key=e.key, expected=None if e.expected is None else str(e.expected),
                           actual=None if e.actual is None else str(e.actual))
    return WorkerError("internal", f"{type(e).__name__}: {e}")


def load_runtime(job: RecordJob) -> MtpRuntime:
    """The :class:`~traces.run.mtp_runtime.MtpRuntime` of ``job``: its models, with the config's
    ``n_gpu_layers``, ``flash_attn``, ``n_threads``, ``repack`` and the ``cb_eval`` capture when it needs one."""
    from mtpscope.traces.run.mtp_runtime import MtpRuntime

    c = job.config
    return MtpRuntime(job.target, job.assistant, n_gpu_layers=c.n_gpu_layers, capture=c.capture,
                      flash_attn=c.flash_attn, n_threads=c.n_threads, repack=c.repack)


def prepare_prompts(rtm: MtpRuntime, job: RecordJob) -> tuple[list[list[int]], list[str]]:
    """Tokenize the job's prompts and size the context.

    Returns:
        ``(token lists, texts)``: each prompt's ids and the text it stands for (the detokenized ids or the
        rendered chat).

    Raises:
        MtpscopeError: a token id outside the vocabulary; TraceError: no chat template for ``messages``; a
            context of the run's size whose KV cache cannot fit in this machine's memory
            (:func:`traces.run.preflight.check_context_memory`), or that llama.cpp could not allocate (one line
            naming ``max_tokens``, the size and llama.cpp's failed allocation).
    """
    from mtpscope.errors import TraceError
    from mtpscope.traces.run.mtp_runtime import spec_tokens

    c = job.config
    rendered = [spec_tokens(rtm.tmodel, sp, chat=c.chat) for sp in job.prompts]
    toks = [list(r[0]) for r in rendered]
    longest = max(len(t) for t in toks)
    need = longest + c.max_tokens + c.n_draft + 1
    why = f"the longest prompt's {longest} + max_tokens {c.max_tokens} + n_draft {c.n_draft} + 1"
    if need > max(rtm.n_ctx, CONTEXT_CHECK_ABOVE):
        from mtpscope.traces.run.llama.binding import gpu_name
        from mtpscope.traces.run.preflight import check_context_memory

        check_context_memory(job.target, job.assistant, need,
                             n_gpu_layers=c.n_gpu_layers if gpu_name() is not None else 0, flash_attn=c.flash_attn,
                             advice=_smaller(longest, c), why=why)
    try:
        rtm.ensure_context(need)
    except TraceError as e:
        raise TraceError(f"llama.cpp could not make a context of {need} tokens ({why}): {_allocation_line(e.message)}",
                         path=e.path, key="max_tokens", expected=f"a context llama.cpp can make ({_smaller(longest, c)})",
                         actual=c.max_tokens) from None
    return toks, [r[1] for r in rendered]


def _smaller(longest: int, c: Any) -> str:
    """What makes a run's context smaller: fewer max_tokens, or a shorter prompt when the prompt is the bigger part."""
    return "shorten the prompt" if longest > c.max_tokens else "lower max_tokens"


def _allocation_line(message: str) -> str:
    """The line of a failed context creation's message that says what llama.cpp could not allocate (the
    first line naming an allocation, else the first line)."""
    head, sep, rest = message.partition(": ")
    if sep and head.startswith("llama.cpp could not"):
        message = rest                                 # (_created's own words: said better by the caller)
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    return next((ln for ln in lines if "allocate" in ln), lines[0] if lines else message)


def hello_of(rtm: MtpRuntime, job: RecordJob, toks: list[list[int]], texts: list[str], *, pid: int | None = None,
             baseline: Baseline | None = None, startup: dict[str, float] | None = None) -> Hello:
    """The :class:`~traces.run.worker_protocol.Hello` of a loaded runtime and its prepared prompts
    (:func:`prepare_prompts`)."""
    from mtpscope.traces.run import row_kernels
    from mtpscope.traces.run.llama.binding import runtime_info

    # row_kernels: what computes the target's side (p, H) of each round, in the process that computes it (loaded,
    # on a first use built, here: before the first round)
    runtime = {**runtime_info(job.config.n_gpu_layers), "row_kernels": row_kernels.kind(), "n_threads": rtm.n_threads}
    return Hello(n_vocab=rtm.n_vocab, n_embd_backbone=rtm.n_embd_backbone, n_embd=rtm.n_embd, n_ctx=rtm.n_ctx,
                 capture=rtm.capture is not None, runtime=runtime,
                 n_prompt_tokens=[len(t) for t in toks], prompt_texts=texts, pid=pid, baseline=baseline,
                 startup=startup, n_ctx_train=rtm.tmodel.n_ctx_train)


def time_baseline(rtm: MtpRuntime, job: RecordJob, toks: list[list[int]]) -> Baseline | None:
    """With the config's ``baseline``: plain decoding of the prompts timed
    (:func:`traces.run.mtp_runtime.time_plain`): its manifest entry and outputs; else None."""
    from mtpscope.traces.run.mtp_runtime import time_plain

    if not job.config.baseline:
        return None
    plain, entry = time_plain(rtm, toks, job.config)
    return Baseline(entry, plain)


def _wait_go(chan: Channel) -> bool:
    """After ``hello``: block until the recorder says :class:`Go` (the pre-flight check passed: True) or
    :class:`Stop` (refused, or the recorder gave up: False)."""
    while True:
        got = chan.recv()
        if got is None:
            continue
        msg, fds = got
        for fd in fds:
            os.close(fd)
        said = decode(msg, Go, Stop)
        if said is not None:
            return isinstance(said, Go)


def calibration(rtm: MtpRuntime, job: RecordJob, toks: list[list[int]]) -> Calibration | None:
    """The run's :class:`~traces.run.mtp_runtime.Calibration` (:meth:`~traces.run.mtp_runtime.MtpRuntime.calibrate` on
    the first prompt) when its ``h_inner`` is derived and the loop's drafter has no capture; else None."""
    from mtpscope.traces.run.mtp_runtime import Calibration

    if not job.config.derive or rtm.capture is not None or not toks:
        return None
    return Calibration(tuple(rtm.calibrate(toks[0])))


def cost_probe(rtm: MtpRuntime, toks: list[list[int]]) -> ProbeDone | None:
    """The round sizes timed after the loop (:meth:`~traces.run.mtp_runtime.MtpRuntime.probe_costs` on the first
    prompt), None without prompts."""
    if not toks:
        return None
    return ProbeDone(rtm.probe_costs(toks[0]))


def round_bytes(rtm: MtpRuntime, n_draft: int, *, hidden_target: bool = False, dense: bool = True) -> int:
    """Ring bytes one traced round of ``n_draft`` drafts needs (``MtpRuntime.run(trace=True,
    defer_target=True)``, its target side reduced by the sender thread: :func:`_reduce_target_side`): per draft
    the drafter's logits (``dense``: all ``n_vocab`` float32; else those a derived h_inner reads,
    :func:`traces.run.derived.logit_row_ids`, as :func:`traces.run.step_analysis.summarize_drafts` sends them), h and
    h_next (``n_embd_backbone``), h_inner (``n_embd``), h_target with ``hidden_target``; each array 64-byte aligned,
    plus a page."""
    from mtpscope.traces.run.derived import logit_row_ids

    def row(n: int) -> int:
        return -(-4 * int(n) // 64) * 64

    logits = rtm.n_vocab if dense else logit_row_ids(rtm.n_vocab, rtm.n_embd).shape[0]
    step = row(logits) + 2 * row(rtm.n_embd_backbone) + row(rtm.n_embd)
    if hidden_target:
        step += row(rtm.n_embd_backbone)
    return int(n_draft) * step + 4096


def _reduce_target_side(kind: str, obj: Any) -> Any:
    """A round's target side computed (:func:`traces.run.mtp_runtime.finish_target_side`), anything else as it is:
    the sender thread's ``prepare`` (:class:`traces.run.transport.RoundSender`)."""
    from mtpscope.traces.run.mtp_runtime import finish_target_side

    return finish_target_side(obj) if kind == ROUND else obj


def _serve(chan: Channel, status: Status, job: RecordJob, marks: dict[str, float] | None = None) -> None:
    import numpy as np

    from mtpscope.traces.run import row_kernels
    from mtpscope.traces.run.llama.process import ggml_abort, set_abort_hook
    from mtpscope.traces.run.step_analysis import summarize_drafts

    marks = {} if marks is None else marks             # start-up clock for Hello.startup (epoch seconds)
    marks["job"], marks["job_cpu"] = time.time(), time.process_time()
    status.set("load")
    c = job.config
    rtm = load_runtime(job)
    marks["runtime"], marks["runtime_cpu"] = time.time(), time.process_time()
    # the sender thread gives the GIL back to the loop within 0.2 ms when the loop wants it (Python's
    # default, 5 ms, is more than a drafter step of a small pair)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # the target's side of each round (p of the draft, entropy) computed on the sender thread from the verify rows
    # themselves (live views of llama.cpp's logits until the next target decode, which fence() holds back): no
    # copy of those rows into the ring, and the recorder reads none of them
    # a round's drafter rows are summarized here before it is sent (summarize_drafts: what the trace keeps of them, and
    # the few logits a derived h_inner reads), unless the recorder scores the centroid head, which reads them whole
    dense = c.centroids is not None
    rb = round_bytes(rtm, c.n_draft, hidden_target=c.hidden_target, dense=dense)
    n_slots, wake_every = ring_slots(rb)
    sender = RoundSender(chan, threaded=True, prepare=_reduce_target_side, n_slots=n_slots, wake_every=wake_every,
                         batch_kinds=frozenset({ROUND}))
    # a GGML_ABORT / GGML_ASSERT ends the process at once: first hand the rounds still queued to the recorder
    def _flush_on_abort(_msg: str) -> None:
        sender.flush(timeout=ABORT_FLUSH_S)

    set_abort_hook(_flush_on_abort)
    try:
        toks, texts = prepare_prompts(rtm, job)
        marks["prompts"], marks["prompts_cpu"] = time.time(), time.process_time()
        chan.send(encode(hello_of(rtm, job, toks, texts, pid=os.getpid(), startup=marks)))
        if not _wait_go(chan):
            return                                     # the pre-flight check refused the pair: nothing decoded
        base = time_baseline(rtm, job, toks)
        if base is not None:
            sender.post(encode(base))
        sender.reserve(rb)

        # each drafter row copied out of llama.cpp's buffer with its top n_top ids found in the same read, while that
        # buffer is still in this core's cache: into the ring when the recorder reads the rows (dense), else into
        # n_draft buffers of this process, reused every round (warm in the caches, no page of the ring touched)
        fill_top = functools.partial(row_kernels.copy_top_k, k=c.n_top)    # (made once: this runs per draft step)
        bufs: list[np.ndarray] = []
        turn = itertools.count()

        def keep_own(lg: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
            i = next(turn) % c.n_draft          # (a round has at most n_draft steps: its rows never share a buffer)
            if i == len(bufs):
                bufs.append(np.empty_like(lg))
            return bufs[i], fill_top(lg, bufs[i])

        keep_draft = functools.partial(sender.stage_with, fill=fill_top) if dense else keep_own

        started_at = time.time()
        t0, c0, s0 = time.perf_counter(), time.process_time(), sender.thread_cpu_seconds()
        cpu_at_start = c0
        fault = _fault_round()
        try:
            for pid, tk in enumerate(toks):
                _instrument(rtm, status)
                status.set("prefill", prompt_id=pid)
                rounds = rtm.run(tk, c, trace=True, keep=sender.stage,
                                 defer_target=True,    # the target's side: the sender thread computes it from
                                 fence=sender.fence,   # the verify rows before the next target decode
                                 keep_draft=keep_draft)
                try:
                    for res in rounds:
                        if not dense:      # (before the next round's drafts overwrite those buffers)
                            res = summarize_drafts(res, n_top=c.n_top, n_embd=rtm.n_embd)
                        sender.send(ROUND, res, prompt_id=pid)
                        status.next_round()
                        if fault is not None and res.round + 1 == fault:    # the test fault: round N-1 was
                            ggml_abort(f"{FAULT_ENV}: injected abort at round {fault}")  # just queued
                finally:
                    rounds.close()                     # frees the prompt's sampler now
                sender.check_stop()
                sender.post(encode(PromptDone(pid, None if rtm.first_token is None else int(rtm.first_token))))
        except StopRequested:
            sender.post(encode(Stopped()))
            return
        status.set("done")
        sender.flush()
        done = WorkerDone(loop_seconds=time.perf_counter() - t0,
                          loop_cpu_seconds=(time.process_time() - c0) - (sender.thread_cpu_seconds() - s0),
                          wait_seconds=sender.wait_seconds, decode_seconds=status.decode_seconds,
                          worker_cpu_seconds=time.process_time() - c0, started_at=started_at,
                          cpu_at_start=cpu_at_start)
        # the derived h_inner's agreement, measured after the loop: nothing waits for it before the first decode
        cal = calibration(rtm, job, toks)
        if cal is not None:
            sender.send(CALIBRATION, cal)
            sender.flush()
        probe = cost_probe(rtm, toks)
        if probe is not None:
            sender.post(encode(probe))
        sender.post(encode(done))
    finally:
        sender.close()
        rtm.close()


def _import_llama() -> None:
    """Import llama.cpp (``binding.llama()``: llama-cpp-python, the backend initialised) and the loop's analysis
    (:mod:`traces.run.step_analysis`, 20 ms) before the job is read: a worker started early
    (:func:`traces.run.worker_spawn.prespawn`) does it while the recorder is still importing. A failure is left to
    the model load, which reports it to the recorder."""
    from mtpscope.traces.run import step_analysis  # noqa: F401 - for _serve's summarize_drafts
    from mtpscope.traces.run.llama import binding

    try:
        binding.llama()
    except MtpscopeError:
        pass


def main(argv: list[str] | None = None) -> int:
    """Child entry point: ``python -m mtpscope.traces.run.record_worker SOCK_FD STATUS_FD PARENT_PID``."""
    marks = {"main": time.time(), "main_cpu": time.process_time()}
    args = list(sys.argv[1:] if argv is None else argv)
    sock_fd, status_fd, parent = int(args[0]), int(args[1]), int(args[2])
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # the recorder decides what a Ctrl-C means
    import faulthandler

    faulthandler.enable(all_threads=False)            # a segfault in llama.cpp: the loop's stack to llama.log
    if hasattr(signal, "SIGUSR1"):                    # `kill -USR1 <worker pid>`: every thread's stack to llama.log
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    chan = Channel(socket.socket(fileno=sock_fd))
    status = Status(mmap.mmap(status_fd, mmap.PAGESIZE))
    try:
        _import_llama()
        got = chan.recv()
        start = decode(got[0], Start) if got else None
        if start is None:
            return 2
        _serve(chan, status, start.job, marks)
        return 0
    except TransportClosed:
        return 1                                      # the recorder is gone
    except BaseException as e:  # noqa: BLE001 - reported to the recorder, traceback to llama.log
        traceback.print_exc()
        try:
            chan.send(encode(_error_message(e)))
        except (TransportClosed, OSError):
            pass
        return 1


# ================================================================================== parent side
class _LogPump(threading.Thread):
    """Copies the worker's output to a file (once known; buffered until then), keeps its tail, and
    echoes it to our stderr when ``echo``."""

    def __init__(self, pipe: IO[bytes], echo: bool) -> None:
        super().__init__(name="mtpscope-worker-log", daemon=True)
        self.pipe = pipe
        self.echo = echo
        self.tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
        self._lock = threading.Lock()
        self._buf: list[bytes] = []
        self._fh: BinaryIO | None = None

    def run(self) -> None:
        for raw in iter(self.pipe.readline, b""):
            text = raw.decode("utf-8", "replace")
            with self._lock:
                self.tail.append(text.rstrip("\n"))
                if self._fh is not None:
                    self._fh.write(raw)
                    self._fh.flush()
                else:
                    self._buf.append(raw)
            if self.echo:
                sys.stderr.write(text)
                sys.stderr.flush()

    def log_to(self, path: Path) -> None:
        with self._lock:
            fh = open(path, "wb")  # noqa: SIM115 - kept open while the worker runs
            fh.write(b"".join(self._buf))
            fh.flush()
            self._buf = []
            self._fh = fh

    def close(self) -> None:
        self.join(timeout=5.0)
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None


def _where(st: dict[str, Any] | None) -> str:
    if not st:
        return "while starting"
    phase = st["phase"]
    if phase in ("start", "load"):
        return "while loading the models"
    if phase == "prefill":
        return f"at prompt {st['prompt_id']}, prefill"
    if phase == "draft":
        return f"at prompt {st['prompt_id']}, round {st['round']}, draft step {st['step']}"
    if phase == "verify":
        return f"at prompt {st['prompt_id']}, round {st['round']}, verify"
    return "after the last prompt"


class RecordWorker:
    """Parent-side handle on one recording worker (see the module docstring).

    Args:
        job: the run: models, prompts and :class:`~traces.run.record_config.RecordConfig` (sent to the
            child packed by :func:`traces.run.packing.pack`). The child loads the models and tokenizes the
            prompts at once, then waits after ``hello`` for :meth:`go` (the recorder's pre-flight check runs
            meanwhile; :meth:`abandon` ends a refused run).
        echo: copy the worker's stderr (llama.cpp's log) to ours as it comes (``--verbose``).

    Raises (from :meth:`hello` and :meth:`events`):
        RuntimeAbortedError: the worker died; ``.aborted`` is the manifest record.
        MtpscopeError (or subclass): the worker reported one (e.g. llama.cpp could not load a model).
        RuntimeError: the worker reported an internal error (a bug; its traceback is in the log).
    """

    def __init__(self, job: RecordJob, *, echo: bool = False) -> None:
        # the worker :func:`~traces.run.worker_spawn.prespawn` started (``mtpscope record``), else a new one
        sp = take_prespawned() or spawn_worker()
        self.proc, self._status_fd, self._status = sp.proc, sp.status_fd, sp.status
        #: epoch seconds just before the worker process was started (its start-up clock's zero)
        self.spawned_at = sp.spawned_at
        parent_sock = sp.sock
        self.chan = Channel(parent_sock)
        # releases told in one message before the recorder sleeps (the worker's doorbell wakes it for WAKE_EVERY rounds)
        self.receiver = RoundReceiver(self.chan, defer_release=True)
        self.log = _LogPump(cast(IO[bytes], self.proc.stdout), echo)    # (stdout=PIPE: never None)
        self.log.start()
        self.info: Hello | None = None
        self.trace_dir: Path | None = None
        self._closed = False
        self.n_rounds_received = 0
        #: (prompt_id, round) of the last round received: where the worker was at least, should its status block
        #: say nothing when it dies
        self.last_received: tuple[int, int] | None = None
        try:
            self.chan.send(encode(Start(job)))
        except TransportClosed:
            pass  # reported by hello()

    # -- parent API
    def go(self) -> None:
        """Let the worker decode (the pre-flight check passed): after its ``hello`` it calibrates and runs the
        loop. Until then it only loads the models and tokenizes the prompts."""
        try:
            self.chan.send(encode(Go()))
        except TransportClosed:
            pass  # reported by hello() / events()

    def abandon(self) -> None:
        """End a worker whose run will not happen (the pre-flight check refused the pair) at once: it is
        killed wherever it is (loading the models at most: it decodes nothing before :meth:`go`).
        Idempotent with :meth:`close`."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.close()

    def hello(self) -> Hello:
        """Wait for the worker to load the models and tokenize the prompts: its
        :class:`~traces.run.worker_protocol.Hello`."""
        while self.info is None:
            self.info = decode(self._next(), Hello)   # anything else before hello is ignored
        return self.info

    def log_to(self, path: str | os.PathLike[str]) -> None:
        """From now on copy the worker's output to ``path`` (what came before is written first)."""
        self.trace_dir = Path(path).parent
        self.log.log_to(Path(path))

    def events(self) -> Iterator[Event]:
        """The worker's :class:`Baseline` (``--baseline``) first, its rounds and prompt ends, its
        :class:`~traces.run.mtp_runtime.Calibration` (when the run derives ``h_inner``), its :class:`ProbeDone`, then
        one :class:`WorkerDone`. After a :class:`WorkerRound` or the calibration, call :meth:`release` once its
        arrays are no longer needed."""
        from mtpscope.traces.run.mtp_runtime import finish_target_side

        while True:
            msg = self._next()
            kind = msg.get("kind")
            if kind == ROUND:      # through the ring: the transport's message, its prompt id beside it
                self.n_rounds_received += 1
                got = WorkerRound(int(msg["prompt_id"]), finish_target_side(self.receiver.unpack(msg)))
                self.last_received = (got.prompt_id, got.result.round)
                yield got
                continue
            if kind == CALIBRATION:
                yield self.receiver.unpack(msg)
                continue
            ev = decode(msg, Baseline, PromptDone, ProbeDone, WorkerDone, Stopped)
            if isinstance(ev, Stopped):
                return
            if isinstance(ev, (Baseline, PromptDone, ProbeDone, WorkerDone)):    # (not None: the kinds asked for)
                yield ev
            if isinstance(ev, WorkerDone):
                return

    def release(self) -> None:
        """The oldest unreleased round's arrays may be overwritten: the worker may send another round."""
        try:
            self.receiver.release()
        except TransportClosed:
            pass  # the worker died: the next events() step reports it

    def ready(self) -> bool:
        """Whether the worker's next message is here already (the doorbell woke the recorder for several).

        Raises:
            TraceError: a malformed message (its bytes are gone: it is reported now).
        """
        try:
            return self.chan.ready()
        except TransportClosed:
            return False   # the worker died: the next events() step reports it (a malformed message raises here)

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """Ask the worker to stop (Ctrl-C) and wait up to ``grace`` seconds for it to exit, then kill it."""
        try:
            self.chan.send(encode(Stop()))
        except (TransportClosed, OSError):
            pass
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        """Wait for (or kill) the worker and free the channels. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        self.receiver.close()
        self.chan.close()
        try:
            self._status.close()
        finally:
            os.close(self._status_fd)

    def __enter__(self) -> RecordWorker:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is not None and self.proc.poll() is None:
            self.stop(grace=2.0 if exc_type is KeyboardInterrupt else 0.0)
        self.close()

    # -- internals
    def _next(self) -> dict[str, Any]:
        while True:
            try:
                got = self.receiver.wait(timeout=1.0)
            except TransportClosed:
                raise self._death() from None
            if got is None:
                if self.proc.poll() is not None:
                    raise self._death()
                continue
            msg, fds = got
            kind = msg.get("kind")
            if kind == "ring":
                self.receiver.on_ring(msg, fds)
                continue
            for fd in fds:
                os.close(fd)
            failed = decode(msg, WorkerError)
            if failed is not None:
                raise self._reported_error(failed)
            return msg

    def _reported_error(self, err: WorkerError) -> BaseException:
        self.proc.wait()
        cls = getattr(E, err.error_class, None)
        if isinstance(cls, type) and issubclass(cls, MtpscopeError) and cls is not RuntimeAbortedError:
            return cls(err.message, path=err.path, offset=err.offset, key=err.key, expected=err.expected,
                       actual=err.actual)
        return RuntimeError(f"recording worker failed: {err.message} (traceback in llama.log)")

    def _death(self) -> RuntimeAbortedError:
        """The worker is gone: wait for it and describe how it died."""
        try:
            rc = self.proc.wait(timeout=30.0)
        except subprocess.TimeoutExpired:  # socket closed but still running: kill it
            self.proc.kill()
            rc = self.proc.wait()
        self.log.join(timeout=5.0)
        st = Status.read(self._status)
        tail = list(self.log.tail)
        from mtpscope.traces.run.llama.process import abort_message, before_faulthandler

        sig, verb, from_outside = death_words(rc)
        said = abort_message(tail, last_line=not from_outside)
        where = _where(st)
        if st is None and self.last_received is not None:    # (no status block to read, but rounds came)
            p, r = self.last_received
            where = f"at prompt {p}, round {r + 1} or later (round {r} was the last it sent; its status block was empty)"
        line = f"llama.cpp {verb} {where}" + (f": {said}" if said else "")
        aborted = {"signal": sig, "exit_code": None if rc < 0 else rc, "message": said, "where": where, "how": verb,
                   "prompt_id": None if st is None else st["prompt_id"],
                   "round": None if st is None else st["round"],
                   "step": None if st is None or st["phase"] != "draft" else st["step"],
                   "phase": None if st is None else st["phase"],
                   "n_rounds_received": self.n_rounds_received,
                   "stderr_tail": before_faulthandler(tail)[-20:], "log": LLAMA_LOG}
        return RuntimeAbortedError(line, aborted=aborted, path=self.trace_dir)


#: signals that stop a process from outside (a service manager, a shell, the OOM killer): llama.cpp's log just
#: ends, so its last line is not quoted as a cause
STOPPED_FROM_OUTSIDE = ("SIGKILL", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


def death_words(rc: int) -> tuple[str | None, str, bool]:
    """How a worker that exited with return code ``rc`` (negative: the signal, as ``subprocess`` reports it) died:
    ``(signal name or None, the verb of the one-line message, whether it was stopped from outside)``."""
    sig = None
    if rc < 0:
        try:
            sig = signal.Signals(-rc).name
        except ValueError:
            sig = f"signal {-rc}"
    if sig == "SIGABRT":
        verb = "aborted"
    elif sig == "SIGKILL":
        verb = "was killed (SIGKILL; out of memory?)"
    elif sig in STOPPED_FROM_OUTSIDE:
        verb = f"was stopped from outside ({sig})"
    elif sig is not None:
        verb = f"crashed ({sig})"
    else:
        verb = f"exited with code {rc}"
    return sig, verb, sig in STOPPED_FROM_OUTSIDE


class InProcessRounds:
    """The recording loop in this process, with :class:`RecordWorker`'s interface (``hello`` /
    ``events`` / ``release`` / ``log_to`` / ``stop`` / ``close``): an already loaded
    :class:`~traces.run.mtp_runtime.MtpRuntime` (``runtime``; not closed here), or one loaded for ``job``
    (closed by :meth:`close`). No isolation: a crash of llama.cpp takes this process with it.
    """

    def __init__(self, runtime: MtpRuntime | None, job: RecordJob) -> None:
        self.job = job
        self.own = runtime is None
        self.rtm = runtime if runtime is not None else load_runtime(job)
        self.toks: list[list[int]] = []

    def hello(self) -> Hello:
        """Tokenize the prompts and (``baseline``) time plain decoding: the
        :class:`~traces.run.worker_protocol.Hello`, its :class:`Baseline` in it."""
        self.toks, texts = prepare_prompts(self.rtm, self.job)
        return hello_of(self.rtm, self.job, self.toks, texts, baseline=time_baseline(self.rtm, self.job, self.toks))

    def events(self) -> Iterator[Event]:
        started_at = time.time()
        t0, c0 = time.perf_counter(), time.process_time()
        for pid, tk in enumerate(self.toks):
            rounds = self.rtm.run(tk, self.job.config, trace=True)
            try:
                for res in rounds:
                    yield WorkerRound(pid, res)
            finally:
                rounds.close()
            yield PromptDone(pid, self.rtm.first_token)
        done = WorkerDone(time.perf_counter() - t0, time.process_time() - c0, started_at=started_at)
        cal = calibration(self.rtm, self.job, self.toks)
        if cal is not None:
            yield cal
        probe = cost_probe(self.rtm, self.toks)
        if probe is not None:
            yield probe
        yield done

    def release(self) -> None:
        """Nothing to release: the arrays are the runtime's own copies."""

    def ready(self) -> bool:
        """Never: the next event is the loop's next round, made when asked for."""
        return False

    def log_to(self, path: str | os.PathLike[str]) -> None:
        """llama.cpp logs into this process (``traces.run.llama.logs``): nothing to copy."""

    def stop(self, grace: float = 0.0) -> None:
        """A Ctrl-C reaches the loop in this process directly."""

    def close(self) -> None:
        if self.own:
            self.rtm.close()


__all__ = ["PHASES", "STOP_GRACE_S", "InProcessRounds", "RecordWorker", "Status", "calibration", "cost_probe", "death_words", "hello_of",
           "load_runtime", "main", "prepare_prompts", "time_baseline"]


if __name__ == "__main__":
    raise SystemExit(main())
