"""Record a trace from the real llama.cpp MTP loop: :func:`record` (``mtpscope record``) and its
:class:`RecordSummary`.

The driver only: it takes the run parameters as one :class:`traces.run.record_config.RecordConfig`
(checked when it was built), checks the model pair (:mod:`traces.run.preflight`, before anything is
loaded), reads the prompts (:mod:`traces.run.prompts`), runs :class:`traces.run.mtp_runtime.MtpRuntime`
per prompt -- by default in a worker process (:class:`traces.run.record_worker.RecordWorker`), so that a
crash of llama.cpp ends the run with one line and keeps the trace; with a loaded ``runtime`` in this
process (:class:`traces.run.record_worker.InProcessRounds`) -- turns each round into records
(:mod:`traces.run.step_analysis`) and writes them with :class:`traces.store.writer.TraceWriter` (each round
durable in its write-ahead log when ``on_round`` is called; ``overwrite`` of an existing trace: written
next to it and swapped in at the end, :func:`traces.store.writer.swap_in`). Progress display is the caller's,
through ``on_round``.

:func:`record` runs its steps in order: the prompts (:func:`traces.run.prompts.prompt_specs`), the output folder
(:func:`_check_out`), the pair's pre-flight check and the centroid head beside the worker's start
(:func:`_check_inputs`), the manifest (:func:`_manifest`), then one :class:`_Recording` (one method per step:
the runtime's hello, each event of the loop, the closed trace, what a failure keeps, the summary). The loop
it reads is a :class:`traces.run.worker_protocol.RoundSource`, its messages that module's typed records.

Imports: numpy, mtpscope.errors, mtpscope.inspector (centroids, gguf), traces.run.llama.process,
traces.run.derived, traces.run.mtp_runtime, traces.run.preflight, traces.run.prompts, traces.run.record_config, traces.run.record_worker,
traces.run.worker_protocol, traces.run.step_analysis, traces.store.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mtpscope.errors import MtpscopeError, RuntimeAbortedError, TraceError
from mtpscope.inspector.centroids import CentroidHead, head_from_gguf, load_centroid_head
from mtpscope.traces.analysis import rates
from mtpscope.traces.run import row_kernels
from mtpscope.traces.run.derived import HInnerSolver, cached_solver, calibration_entry
from mtpscope.traces.run.llama.process import deferred_sigint, interrupts_held
from mtpscope.traces.run.mtp_runtime import Calibration, MtpRuntime, RoundResult
from mtpscope.traces.run.preflight import centroid_source_info, model_info, preflight, unchecked_models
from mtpscope.traces.run.prompts import PromptSpec, prompt_specs
from mtpscope.traces.run.record_config import RecordConfig, RecordJob
from mtpscope.traces.run.record_worker import STOP_GRACE_S, WAKE_EVERY, InProcessRounds, RecordWorker
from mtpscope.traces.run.step_analysis import derive_h_inner_rounds, round_record, step_records
from mtpscope.traces.run.worker_protocol import (
    Baseline,
    Event,
    ProbeDone,
    PromptDone,
    RoundSource,
    WorkerDone,
    WorkerRound,
)
from mtpscope.traces.store.layout import LLAMA_LOG

if TYPE_CHECKING:
    from mtpscope.traces.store.writer import TraceWriter

# --------------------------------------------------------------------------------------------------
# numpy's BLAS threads during the run
# --------------------------------------------------------------------------------------------------

_BLAS_THREAD_FUNCS = (("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
                      ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
                      ("openblas_set_num_threads", "openblas_get_num_threads"))


def _openblas_thread_control() -> tuple[Callable[[int], None], Callable[[], int]] | None:
    """``(set, get)`` for the thread count of the OpenBLAS that numpy's wheel bundles, else None."""
    import ctypes
    import glob

    libdir = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    for path in sorted(glob.glob(os.fspath(libdir / "*openblas*.so*"))):
        try:
            lib = ctypes.CDLL(path)  # already loaded by numpy: same handle, same globals
        except OSError:
            continue
        for set_name, get_name in _BLAS_THREAD_FUNCS:
            setf, getf = getattr(lib, set_name, None), getattr(lib, get_name, None)
            if setf is not None and getf is not None:
                setf.argtypes, setf.restype = [ctypes.c_int], None
                getf.argtypes, getf.restype = [], ctypes.c_int
                return setf, getf
    return None


def _warm_arrow() -> None:
    """pyarrow imports pandas on its first conversion of Python values (its pandas shim looks at every
    input): about 0.2 s of CPU. Done before ``go()``, while the worker loads the models, not inside the
    first round."""
    import pyarrow as pa

    pa.array([0], pa.int32())


class _SingleThreadBlas:
    """Run numpy's OpenBLAS on one thread inside the ``with`` block (restored after).

    The trace analysis does small matrix products (centroids x h_inner) between llama.cpp decodes;
    multi-threaded OpenBLAS then leaves helper threads spinning that compete with llama.cpp's own
    threads for the cores. No-op where numpy does not bundle OpenBLAS.
    """

    def __enter__(self) -> _SingleThreadBlas:
        self._ctl = _openblas_thread_control()
        self._old = None
        if self._ctl is not None:
            self._old = int(self._ctl[1]())
            self._ctl[0](1)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ctl is not None and self._old is not None:
            self._ctl[0](self._old)


@dataclass(frozen=True)
class RecordSummary:
    """What :func:`record` did.

    Attributes:
        out: the trace directory.
        n_prompts, n_rounds, n_steps: counts written.
        n_drafted, n_accepted: draft tokens proposed / accepted.
        acceptance_rate: n_accepted / n_drafted (llama.cpp's definition), None with no drafts.
        mean_acceptance_length: 1 + n_accepted / verify rounds that drafted at least one token (the
            same definition as :func:`traces.analysis.metrics.totals`), None with no such round.
        n_generated: generated tokens over all prompts (each prompt's prefill token included).
        seconds: wall time of the generation loops (prefill and trace writing included; loading, and the
            derived h_inner's calibration and the cost probe after the loop, excluded).
        cpu_seconds: CPU time of the processes over the same span (``time.process_time``; this process
            and, when isolated, the worker process over its loop: loop thread and sender thread; in process,
            the calibration's and the cost probe's CPU left out as when isolated).
        trace_seconds: wall time spent outside the MTP loop on the trace: step analysis (top-k,
            ranks, centroid head), records and Parquet writing (the ``cb_eval`` copy inside the drafter
            decode is not included).
        tokens_per_second: n_generated / seconds.
        outputs: generated token ids per prompt.
        isolated: llama.cpp ran in a worker process.
        loop_seconds / loop_cpu_seconds: wall and CPU time of the MTP loop itself (when isolated: the
            worker process's CPU without its sender thread, which packs and sends the rounds beside the
            loop; that thread is in ``cpu_seconds`` = ``recorder_cpu_seconds`` + the worker process's CPU).
        recorder_cpu_seconds: CPU time of this process over ``seconds`` (analysis and writing, when
            isolated).
        loop_wait_seconds: isolated: wall time the worker's loop waited for this process to take a round
            (the analysis and writing falling behind the loop); 0 otherwise.
        loop_decode_seconds: isolated: wall time of the worker's loop inside llama.cpp decodes (the rest
            of ``loop_seconds`` is the Python around them: argmax, copies, handing rounds over); 0 otherwise.
        preflight_seconds: wall time of the pre-flight check (with the centroid head's loading).
        startup_seconds: wall time from the call to the loop's first decode (pre-flight beside the worker's
            start and model loading, prompts, the derived h_inner's solve and calibration).
        startup_cpu_seconds: CPU time of this process from its start to the runtime's ``hello`` (imports
            included) plus, when isolated, the worker process's up to its loop's start.
        warnings: what the run did that its numbers should be read with (the manifest's ``warnings`` too): a
            prompt and ``max_tokens`` that may run past the target's ``context_length``.
    """

    out: str
    n_prompts: int
    n_rounds: int
    n_steps: int
    n_drafted: int
    n_accepted: int
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    n_generated: int
    seconds: float
    cpu_seconds: float
    trace_seconds: float
    tokens_per_second: float
    outputs: tuple[tuple[int, ...], ...]
    isolated: bool = False
    loop_seconds: float = 0.0
    loop_cpu_seconds: float = 0.0
    recorder_cpu_seconds: float = 0.0
    loop_wait_seconds: float = 0.0
    loop_decode_seconds: float = 0.0
    preflight_seconds: float = 0.0
    startup_seconds: float = 0.0
    startup_cpu_seconds: float = 0.0
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        d = asdict(self)
        d["outputs"] = [list(o) for o in self.outputs]
        d["warnings"] = list(self.warnings)
        return d


# --------------------------------------------------------------------------------------------------
# the driver
# --------------------------------------------------------------------------------------------------


def record(config: RecordConfig, *, target: str | os.PathLike[str],
           assistant: str | os.PathLike[str], out: str | os.PathLike[str],
           prompts: Sequence[str | PromptSpec] | None = None, prompt: str | None = None,
           prompts_file: str | os.PathLike[str] | None = None, overwrite: bool = False,
           command: Sequence[str] | None = None, runtime: MtpRuntime | None = None,
           on_round: Callable[[int, RoundResult], None] | None = None, isolate: bool | None = None,
           preflight: bool = True, echo_log: bool = False) -> RecordSummary:
    """Run the real MTP loop on each prompt and write a trace directory (schema version 1).

    Per round (``rounds`` table): prompt id, round, position of the pending token, the pending token,
    drafted ids, the target's ids at each verify row (null after the first mismatch when sampling),
    n_accepted as llama.cpp counts it, emitted tokens (accepted drafts + the target's token; cut after an
    end-of-generation token), ``eog_confirmed`` (a drafted end-of-generation token the target chose too, not
    counted as accepted: llama.cpp's rule, docs/RECORDING.md), draft / verify wall times in
    ms (draft: the K drafter decodes with their argmax and h_next reads; verify: the target decode,
    acceptance and KV roll-back; the trace analysis and writing are outside both). Per draft step (``steps``): k
    (1-based), the token, its logit and rank, the top ``n_top`` drafter candidates with logits, the
    target's token at that position and its rank among the drafter's logits, accepted, and unless
    ``hidden="off"``: ``h`` (fed in, width n_embd_backbone), ``h_next`` (post-projection output,
    width n_embd_backbone) and ``h_inner`` (the drafter's ``result_norm``, width n_embd: derived from the
    logits and ``h_next`` by :mod:`traces.run.derived`, or with ``graph_capture`` copied by ``cb_eval``), stored
    as float16 (``"f16"``) or float32. With a centroid head (``centroids``: fork-dialect GGUF or HF
    directory): top-k centroid ids and logits, the sparse head's token, whether the target's token is a
    candidate, the target token's centroid and that centroid's rank. Always: the target's probability of
    the drafted token and its entropy at the verify row that judged it (``target_p_drafted``,
    ``target_entropy``; computed after the verify timing). With ``hidden_target``: the target's own
    hidden state at that row (``h_target``, width n_embd_backbone). The manifest's ``params`` are
    :meth:`RecordConfig.manifest_params`.

    Args:
        config: the run parameters (:class:`traces.run.record_config.RecordConfig`, valid by
            construction; ``RecordConfig()`` holds ``mtpscope record``'s defaults): ``n_draft``, ``max_tokens``,
            the target's sampling (``temp`` / ``seed`` / ``top_k`` / ``top_p``; ``temp <= 0``: greedy),
            ``chat``, ``n_gpu_layers``, the centroid head (``centroids`` / ``centroid_top_k``), what is
            stored (``hidden``, ``n_top``, ``hidden_target``), the writer (``flush_every``: a Parquet part
            every this many rounds, the crash safety granularity; ``compact``: at the end, merge the
            small parts into large ones, hidden states included), ``flash_attn``, ``n_threads`` and
            ``baseline``: first time plain greedy decoding of the same prompts (the target alone, one
            token per decode) and store it in the manifest as ``baseline``: ``t_per_token_ms`` (decode
            time per token after the first), ``n_tokens``, ``decode_ms``, ``prefill_ms``, ``per_prompt``
            and, at the end, ``outputs_equal`` (the speculative outputs equal plain decoding's; greedy
            only). After the loop the worker times a round of every size
            (:meth:`MtpRuntime.probe_costs`, outside the run's timing) into the manifest's ``cost_probe``,
            which the what-if prices round sizes with. ``hidden_target`` costs one copy of n_embd_backbone floats per draft and
            2 * n_embd_backbone bytes on disk in f16.
        target / assistant: GGUF paths (gemma4 target, gemma4-assistant drafter).
        out: the trace directory.
        prompts / prompt / prompts_file: the prompts (exactly one of them): texts or
            :class:`traces.run.prompts.PromptSpec` objects, one text, or a prompts file
            (:func:`traces.run.prompts.read_prompt_specs`: text / tokens / messages, id, category, extra fields).
        overwrite: replace an existing trace in ``out``. The new trace is then written to the sibling
            folder ``<out>.partial-<pid>`` and swapped in only when the run completes; if it fails (an
            error, Ctrl-C) the old trace stays untouched and the partial one is left where it is (named
            on stderr and in a note on the exception). Without an existing trace ``out`` is written in
            place (crash-safe parts). The swap replaces the whole folder, so a trace folder that also holds
            other files is refused before anything loads (:func:`~traces.store.layout.foreign_entries`).
        command: argv for the manifest (default ``sys.argv``).
        runtime: an already loaded :class:`MtpRuntime` for these paths (not closed here; runs in this
            process).
        on_round: called with ``(prompt_id, RoundResult)`` after each round is written -- into the
            write-ahead log, so it survives a ``kill -9`` from then on (the CLI draws its progress bar
            and ``--verbose`` lines from it).
        isolate: run llama.cpp in a worker process (:mod:`traces.run.record_worker`; default: yes unless
            ``runtime`` is given). A crash of llama.cpp then raises
            :class:`~mtpscope.errors.RuntimeAbortedError` (one line quoting llama.cpp) and the trace keeps
            every round before it, marked incomplete, with an ``aborted`` record and ``llama.log``.
        preflight: check the pair with the inspector before loading (default). ``False`` skips it, for
            debugging a runtime crash on a pair that pre-flight refuses (``params.preflight`` says so).
        echo_log: isolated runs: copy llama.cpp's own output to stderr as it comes (``--verbose``).

    Returns:
        :class:`RecordSummary`.

    Raises:
        RuntimeAbortedError: llama.cpp died in the worker process (abort, fatal signal, exit); the trace
            written so far is closed incomplete with ``aborted`` in its manifest and ``llama.log``.
        LayoutError: the pre-flight check refused the pair or the centroid source does not fit (its
            ``centroid_top_k`` outside 1..n_centroids included).
        TraceError: ``out`` is empty; it already holds a trace (without ``overwrite``), or (with it) a trace
            and other files; errors from the writer.
        MtpscopeError: not exactly one prompt source, no prompts, a bad prompts file; ``isolate=True``
            with a ``runtime``; GGUF reader errors.
        RuntimeUnavailableError: llama-cpp-python missing.
        KeyboardInterrupt: a Ctrl-C (isolated: the worker is stopped first; in process: raised right after
            the llama.cpp decode it arrived in); the trace written so far stays readable, marked incomplete.
    """
    specs = prompt_specs(prompts, prompt, prompts_file)
    _check_out(out, overwrite)                   # fail before loading anything
    isolated = (runtime is None) if isolate is None else bool(isolate)
    if isolated and runtime is not None:
        raise MtpscopeError("a loaded runtime runs in this process; isolate=True needs runtime=None",
                            key="isolate", expected="runtime=None", actual="a MtpRuntime")
    t_enter_epoch = time.time()
    job = RecordJob(target=os.fspath(target), assistant=os.fspath(assistant), prompts=tuple(specs), config=config)
    # isolated: the worker loads the pair while it is checked here, and decodes nothing before go(); a refused
    # pair ends it (it has loaded at most, in its own process): start-up is the longer of the two, not the sum
    early = RecordWorker(job, echo=echo_log) if isolated else None
    try:
        checked = _check_inputs(config, target, assistant, out, overwrite=overwrite, preflight=preflight)
        _warm_arrow()
        row_kernels.load()                       # built (first use: a compile) while the worker loads
    except BaseException:
        if early is not None:
            early.abandon()                      # refused: the worker decoded nothing
        raise
    if early is not None:
        early.go()

    run = _Recording(config, specs, checked, _manifest(config, specs, checked, command, isolated=isolated,
                                                       preflight=preflight),
                     assistant=assistant, out=out, overwrite=overwrite, isolated=isolated, on_round=on_round)
    run.run(lambda: early if early is not None else InProcessRounds(runtime, job))
    if checked.swap:
        from mtpscope.traces.store.writer import swap_in

        swap_in(checked.write_to, out)
    return run.summary(t_enter_epoch)


# --------------------------------------------------------------------------------------------------
# its steps
# --------------------------------------------------------------------------------------------------


def _check_out(out: str | os.PathLike[str], overwrite: bool) -> None:
    """Refuse an empty ``out``; one that holds a trace unless ``overwrite``; and with ``overwrite``, a trace
    folder that holds other files too (replacing the trace replaces the folder: they would be deleted)
    (TraceError)."""
    from mtpscope.traces.store.layout import MANIFEST, foreign_entries, foreign_message, holds_trace

    if not os.fspath(out):
        raise TraceError("no output folder given", key="out", expected="a folder path", actual="''")
    if not overwrite and (Path(out) / MANIFEST).exists():
        raise TraceError("directory already holds a trace (pass --overwrite, or overwrite=True in Python, to replace it)",
                         path=out)
    if overwrite and holds_trace(out):
        others = foreign_entries(out)
        if others:
            raise TraceError(foreign_message(others), path=out, key="out")


@dataclass(frozen=True)
class _Checked:
    """What the checks before the run found: the manifest's model entries (``centroids`` included), the
    centroid head (None without one), the pre-flight's wall seconds, and where the trace is written
    (``swap``: beside an existing trace in ``write_to``, swapped in at the end)."""

    models: dict[str, Any]
    head: CentroidHead | None
    preflight_seconds: float
    swap: bool
    write_to: Path


def _check_inputs(config: RecordConfig, target: str | os.PathLike[str], assistant: str | os.PathLike[str],
                  out: str | os.PathLike[str], *, overwrite: bool, preflight: bool) -> _Checked:
    """The pair's pre-flight check (or its unchecked entries) and the centroid head, before anything decodes.

    Raises:
        LayoutError: the pre-flight check refused the pair, or the centroid source does not fit.
    """
    from mtpscope.traces.store.layout import holds_trace
    from mtpscope.traces.store.writer import partial_dir

    # --overwrite of an existing trace: record next to it and swap it in only when the run completes
    swap = bool(overwrite) and holds_trace(out)
    write_to = partial_dir(out) if swap else Path(out)
    t_pf = time.perf_counter()
    # the target's and the assistant's model info, and the centroids' (None without a centroid head)
    models: dict[str, dict[str, Any] | None] = {
        **(_preflight(target, assistant) if preflight else unchecked_models(target, assistant))}
    preflight_s = time.perf_counter() - t_pf
    head = None
    models["centroids"] = None
    if config.centroids is not None:
        cp = Path(config.centroids)
        if cp.is_file() and cp.suffix != ".safetensors":  # a GGUF: read it once for both
            from mtpscope.inspector.gguf import open_gguf

            with open_gguf(cp) as cf:
                head = head_from_gguf(cf, top_k=config.centroid_top_k)
                models["centroids"] = model_info(cf)
        else:
            head = load_centroid_head(cp, top_k=config.centroid_top_k)
            models["centroids"] = centroid_source_info(cp)
    return _Checked(models, head, preflight_s, swap, write_to)


def _manifest(config: RecordConfig, specs: Sequence[PromptSpec], checked: _Checked, command: Sequence[str] | None,
              *, isolated: bool, preflight: bool) -> dict[str, Any]:
    """The manifest as far as it is known before the runtime's hello (:meth:`_Recording.start` completes it)."""
    head = checked.head
    params = config.manifest_params(centroid_top_k=None if head is None else head.top_k, n_ctx=None,
                                    isolated=isolated, preflight=preflight)
    return {
        "source": "record",
        "command": list(command) if command is not None else list(sys.argv),
        "params": params,
        "models": checked.models,
        "prompts": [sp.manifest_entry(i, 0) for i, sp in enumerate(specs)],
        "centroids": None if head is None else {"n_centroids": head.n_centroids, "top_k": head.top_k,
                                                "source": head.source, "kind": head.kind},
        "derived": None,
    }


#: the most rounds analysed together: all a worker can have sent and not had released (its ring's slots but one,
#: :func:`~traces.run.record_worker.ring_slots`)
ROUND_BATCH = WAKE_EVERY + 1


class _Recording:
    """One run of :func:`record` from the runtime's hello to the closed trace: one method per step
    (:meth:`start`, one per event of the loop, :meth:`finish`, what a failure keeps, :meth:`summary`)."""

    def __init__(self, config: RecordConfig, specs: Sequence[PromptSpec], checked: _Checked,
                 manifest: dict[str, Any], *, assistant: str | os.PathLike[str], out: str | os.PathLike[str],
                 overwrite: bool, isolated: bool, on_round: Callable[[int, RoundResult], None] | None) -> None:
        self.config, self.specs, self.checked, self.manifest = config, specs, checked, manifest
        self.head = checked.head
        self.assistant, self.out, self.overwrite, self.isolated = assistant, out, overwrite, isolated
        self.on_round = on_round
        self.hd = None if config.hidden == "off" else config.hidden
        self.n_rounds = self.n_steps = self.n_drafted = self.n_accepted = self.n_gen = self.n_verify = 0
        self.outputs: list[tuple[int, ...]] = []
        self.warnings: list[str] = []
        self.gen: list[int] = []
        self.trace_s = 0.0
        self.cal_s = self.cal_cpu = 0.0   # the calibration and cost probe after the loop: not part of the run's timing
        self.loop: WorkerDone | None = None
        self.w: TraceWriter | None = None
        self.src: RoundSource | None = None
        self.solver: HInnerSolver | None = None
        self.plain_outputs: Sequence[Sequence[int]] | None = None
        self.t_start = self.c_start = self.t_ev = self.c_ev = self.cpu_at_hello = 0.0
        self.secs = self.cpu_secs = 0.0

    @property
    def write_to(self) -> Path:
        return self.checked.write_to

    def run(self, open_source: Callable[[], RoundSource]) -> None:
        """The loop from the runtime's hello to the closed trace, numpy's BLAS on one thread and (in this
        process) a Ctrl-C deferred past llama.cpp's decodes; on a failure the trace written so far is kept,
        marked incomplete (:meth:`aborted`, :meth:`failed`)."""
        batch: list[WorkerRound] = []      # rounds received together, not analysed yet
        with contextlib.ExitStack() as stack:
            stack.enter_context(_SingleThreadBlas())
            stack.enter_context(contextlib.nullcontext() if self.isolated else deferred_sigint())
            self.t_start, self.c_start = time.perf_counter(), time.process_time()
            try:
                self.src = open_source()
                stack.callback(self.src.close)
                self.start(self.src)
                self.t_ev, self.c_ev = time.perf_counter(), time.process_time()
                for ev in self.src.events():
                    if isinstance(ev, WorkerRound):
                        batch.append(ev)
                        if len(batch) < ROUND_BATCH and self.src.ready():
                            continue               # more rounds came with this one: analysed together
                    if batch:
                        self.on_rounds_done(batch)
                    if not isinstance(ev, WorkerRound):
                        self.on_event(ev)
                    self.t_ev, self.c_ev = time.perf_counter(), time.process_time()
                if batch:
                    self.on_rounds_done(batch)
                self.finish()
            except RuntimeAbortedError as e:
                with interrupts_held():      # a second Ctrl-C / SIGTERM does not cut the trace's close short
                    self._keep(batch)
                    self.aborted(e)
                raise
            except BaseException as e:
                with interrupts_held():
                    self._keep(batch)
                    self.failed(e)
                raise

    def start(self, src: RoundSource) -> None:
        """The runtime's :class:`~traces.run.worker_protocol.Hello` into the manifest (checked against the
        centroid head and the capture), then the trace writer."""
        config, head, manifest = self.config, self.head, self.manifest
        # while the worker loads the models: the solve that derives h_inner from the logits and h_next (built
        # here, it never holds up the loop; unused when a loaded runtime brings the graph capture)
        solver = _solver(self.assistant) if config.derive else None
        info = src.hello()
        self.cpu_at_hello = time.process_time()
        if head is not None:
            head.check_compatible(n_embd=info.n_embd, n_vocab=info.n_vocab, drafter=self.assistant)
        if config.n_top > info.n_vocab:     # (a bad flag, not the pair's fault; a manifest's n_top is what each step stores)
            raise MtpscopeError("more drafter candidates per step than the vocabulary holds", key="n_top",
                              expected=f"1..{info.n_vocab} (the target's n_vocab)", actual=config.n_top)
        if config.capture and not info.capture:
            raise MtpscopeError("this runtime was loaded without the cb_eval capture; hidden states and the "
                                "centroid head need it", key="hidden", expected="capture=True", actual="False")
        if info.capture:
            solver = None
        self.solver = solver
        if solver is not None:
            manifest["derived"] = derived_entry(solver, (), hidden=config.hidden != "off", centroids=head is not None)
        manifest["params"]["n_ctx"] = info.n_ctx
        manifest["params"]["n_vocab"] = info.n_vocab     # the reader's bound on every token id of the rounds
        # the reductions over the rows of logits (C or numpy: their p and H differ by ~1e-7): the worker's (p, H; top-k
        # and ranks, summarize_drafts) and this process's (top-k and ranks of rows it receives: --centroids); both
        # named when they differ
        runtime = dict(info.runtime)
        here = row_kernels.kind()
        there = runtime.get("row_kernels", here)
        runtime["row_kernels"] = here if there == here else f"worker: {there}; recorder: {here}"
        manifest["runtime"] = runtime
        manifest["prompts"] = [sp.manifest_entry(i, n, text=None if sp.source == "text" else txt)
                               for i, (sp, n, txt) in enumerate(zip(self.specs, info.n_prompt_tokens,
                                                                    info.prompt_texts, strict=True))]
        longest = max(info.n_prompt_tokens, default=0)
        if info.n_ctx_train and longest + config.max_tokens > info.n_ctx_train:
            w = (f"the longest prompt ({longest} tokens) and max_tokens {config.max_tokens} can run past the target's "
                 f"context_length {info.n_ctx_train}: llama.cpp goes on past the positions the model was trained for")
            self.warnings.append(w)
            manifest.setdefault("warnings", []).append(w)
        if info.baseline is not None:
            self.plain_outputs = info.baseline.plain_outputs
            manifest["baseline"] = info.baseline.entry
        self.t_start, self.c_start = time.perf_counter(), time.process_time()
        from mtpscope.traces.store.writer import TraceWriter

        hd = self.hd
        self.w = TraceWriter(self.write_to, manifest, n_embd_backbone=None if hd is None else info.n_embd_backbone,
                             n_embd=None if hd is None else info.n_embd, hidden_dtype=hd,
                             centroids=head is not None, flush_every=config.flush_every,
                             overwrite=self.overwrite or self.checked.swap, compact=config.compact,
                             h_target=config.hidden_target)
        src.log_to(self.write_to / LLAMA_LOG)
        self.trace_s += time.perf_counter() - self.t_start

    def _writer(self) -> TraceWriter:
        """The trace being written (:meth:`start` made it; every event comes after)."""
        if self.w is None:
            raise MtpscopeError("the recording has no trace yet (start() comes first)", key="trace")
        return self.w

    def _source(self) -> RoundSource:
        """The worker's rounds (:meth:`run` opens them first)."""
        if self.src is None:
            raise MtpscopeError("the recording has no round source yet (run() opens it first)", key="source")
        return self.src

    def on_event(self, ev: Event) -> None:
        """One event of the loop other than a round (:data:`~traces.run.worker_protocol.Event`; rounds:
        :meth:`on_rounds_done`)."""
        if isinstance(ev, Baseline):
            self._writer().manifest["baseline"], self.plain_outputs = ev.entry, ev.plain_outputs
            self.t_start, self.c_start = time.perf_counter(), time.process_time()   # the run's timing: from the loop
        elif isinstance(ev, ProbeDone):
            self._after_loop()
            self._writer().manifest["cost_probe"] = ev.entry
        elif isinstance(ev, Calibration):
            self._after_loop()
            if self.solver is not None:
                self._writer().manifest["derived"] = derived_entry(
                    self.solver, ev.steps, hidden=self.config.hidden != "off", centroids=self.head is not None)
            self._source().release()
        elif isinstance(ev, PromptDone):
            gen = self.gen
            if not gen:  # the prefill token ended generation (EOG or max_tokens 1): no round
                gen = [int(ev.first_token)] if ev.first_token is not None else []
            self.outputs.append(tuple(gen))
            self.n_gen += len(gen)
            self.gen = []
        elif isinstance(ev, WorkerDone):
            self.loop = ev

    def _after_loop(self) -> None:
        """The time since the last event went to the calibration or the cost probe after the loop (in this
        process when not isolated: its CPU too), which the run's wall and CPU seconds leave out."""
        self.cal_s += time.perf_counter() - self.t_ev
        self.cal_cpu += time.process_time() - self.c_ev

    def on_rounds_done(self, batch: list[WorkerRound]) -> None:
        """Finished rounds received together (the worker's doorbell wakes this process for several): the
        derived ``h_inner`` of all their steps in one solve (:func:`~traces.run.step_analysis.derive_h_inner_rounds`:
        the solve's matrix read once), then each round as :meth:`on_round_done`. Each round leaves ``batch``
        as its turn comes; a round that fails empties it (the rounds after it are not written after a gap).
        What a failure elsewhere leaves in it, received but not started: :meth:`_keep`."""
        inner: list[list[Any] | None] = [None] * len(batch)
        if self.solver is not None and len(batch) > 1:
            t0 = time.perf_counter()
            inner = list(derive_h_inner_rounds([ev.result for ev in batch], self.solver))
            self.trace_s += time.perf_counter() - t0
        try:
            for inn in inner:
                ev = batch.pop(0)
                self.on_round_done(ev.prompt_id, ev.result, inner=inn)
        except BaseException:
            batch.clear()          # (a round that failed is not followed by later ones: no gap in the trace)
            raise

    def _keep(self, batch: list[WorkerRound]) -> None:
        """The run failed with rounds received but not yet in the trace: put them in (best effort: the
        failure already says what went wrong)."""
        try:
            while batch:
                ev = batch.pop(0)
                self.on_round_done(ev.prompt_id, ev.result)
        except BaseException:  # noqa: BLE001 - the run's own failure is what is reported (a Ctrl-C here too)
            batch.clear()

    def on_round_done(self, pid: int, res: RoundResult, *, inner: Sequence[Any] | None = None) -> None:
        """A finished round: its records into the trace (the worker may go on once they are built). ``inner``:
        its steps' ``h_inner`` already derived (:meth:`on_rounds_done`)."""
        config = self.config
        t0 = time.perf_counter()
        if not self.gen:
            self.gen.append(res.pending_token)
        self.gen.extend(res.emitted)
        steps = step_records(res, n_top=config.n_top, hidden=config.hidden, head=self.head, solver=self.solver,
                             inner=inner)
        self._source().release()          # the records own copies of all they keep: the worker may go on
        self._writer().add_round(round_record(pid, res), steps)
        self.trace_s += time.perf_counter() - t0
        self.n_rounds += 1
        self.n_steps += len(steps)
        self.n_drafted += len(res.drafted)
        self.n_verify += 1 if res.drafted else 0
        self.n_accepted += res.n_accepted
        if self.on_round is not None:
            self.on_round(pid, res)

    def finish(self) -> None:
        """The loop is over: the baseline's comparison, the trace closed, the run's wall and CPU seconds."""
        t0 = time.perf_counter()
        w = self._writer()
        if self.plain_outputs is not None and self.config.greedy:
            w.manifest["baseline"]["outputs_equal"] = ([list(o) for o in self.outputs]
                                                       == [list(o) for o in self.plain_outputs])
        w.close()
        self.trace_s += time.perf_counter() - t0
        # the run ends here: the worker's exit (freeing the models) is not part of it
        self.secs = time.perf_counter() - self.t_start - self.cal_s
        self.cpu_secs = time.process_time() - self.c_start - self.cal_cpu

    def aborted(self, e: RuntimeAbortedError) -> None:
        """llama.cpp died: keep every round received, say where it stopped and what llama.cpp said."""
        from mtpscope.traces.store.writer import TraceWriter

        w, write_to = self.w, self.write_to
        if w is None:      # before the trace existed (e.g. while loading): a trace of its manifest and log
            w = self.w = TraceWriter(write_to, self.manifest, n_embd_backbone=None, n_embd=None, hidden_dtype=None,
                                     centroids=self.head is not None, overwrite=self.overwrite or self.checked.swap,
                                     compact=False)
            self._source().log_to(write_to / LLAMA_LOG)
        self._source().close()   # all of llama.cpp's output is in llama.log now
        w.close(complete=False, aborted=e.aborted)
        e.trace = os.fspath(write_to)
        e.message = (f"{e.message} (trace {os.fspath(write_to)}: {self.n_rounds} rounds kept, marked incomplete; "
                     f"llama.cpp's output in llama.log there)")
        e.args = (e.one_line(),)
        _note_partial(e, self.checked.swap, write_to, self.out)

    def failed(self, e: BaseException) -> None:
        """Any other failure (a Ctrl-C included): the worker stopped, the finished rounds kept, marked
        incomplete."""
        if self.src is not None and self.isolated:
            self.src.stop(grace=STOP_GRACE_S if isinstance(e, KeyboardInterrupt) else 0.0)
        if self.w is not None:
            self.w.close(complete=False)  # keep the finished rounds, marked incomplete
            if isinstance(e, KeyboardInterrupt):   # (the CLI says it: a Ctrl-C is not a crash)
                # the rounds in the trace: the writer's count (a Ctrl-C may land after a round's add_round and
                # before this loop counted it)
                n = int(self.w.manifest["counts"]["n_rounds"])
                e.add_note(f"interrupted: {n} round{'' if n == 1 else 's'} kept in {os.fspath(self.write_to)}, "
                           "marked incomplete")
        _note_partial(e, self.checked.swap, self.write_to, self.out)

    def summary(self, t_enter_epoch: float) -> RecordSummary:
        """The :class:`RecordSummary` of the completed run (``t_enter_epoch``: when :func:`record` was called)."""
        loop, secs, cpu_secs, isolated = self.loop, self.secs, self.cpu_secs, self.isolated
        worker_cpu = loop.worker_cpu_seconds if (loop is not None and isolated) else 0.0
        n_drafted, n_accepted, n_verify, n_gen = self.n_drafted, self.n_accepted, self.n_verify, self.n_gen
        return RecordSummary(out=os.fspath(self.out), n_prompts=len(self.specs), n_rounds=self.n_rounds,
                             n_steps=self.n_steps, n_drafted=n_drafted, n_accepted=n_accepted,
                             acceptance_rate=rates.acceptance_rate(n_accepted, n_drafted),
                             mean_acceptance_length=rates.mean_acceptance_length(n_accepted, n_verify),
                             n_generated=n_gen, seconds=secs, cpu_seconds=cpu_secs + worker_cpu,
                             trace_seconds=self.trace_s, tokens_per_second=n_gen / secs if secs > 0 else 0.0,
                             outputs=tuple(self.outputs), isolated=isolated,
                             loop_seconds=loop.loop_seconds if loop is not None else secs,
                             loop_cpu_seconds=loop.loop_cpu_seconds if loop is not None else cpu_secs,
                             recorder_cpu_seconds=cpu_secs, loop_wait_seconds=loop.wait_seconds if loop else 0.0,
                             loop_decode_seconds=loop.decode_seconds if loop else 0.0,
                             preflight_seconds=self.checked.preflight_seconds,
                             startup_seconds=(loop.started_at - t_enter_epoch) if loop and loop.started_at else 0.0,
                             startup_cpu_seconds=self.cpu_at_hello + (loop.cpu_at_start if loop and isolated else 0.0),
                             warnings=tuple(self.warnings))


#: :func:`traces.run.preflight.preflight` under another name: :func:`record` has a ``preflight`` flag
_preflight = preflight

#: the steps columns a derived ``h_inner`` feeds (manifest ``derived.columns``): h_inner itself (stored with
#: hidden states) and every centroid-head column (scored from it)
DERIVED_CENTROID_COLUMNS = ("centroid_ids", "centroid_logits", "centroid_token", "target_in_candidates",
                            "target_centroid", "target_centroid_rank")


def _solver(assistant: str | os.PathLike[str]) -> HInnerSolver:
    """The drafter's :class:`~traces.run.derived.HInnerSolver` (our reader, the weights' dequantized values;
    kept in the cache folder per drafter file: :func:`~traces.run.derived.cached_solver`)."""
    return cached_solver(assistant)


def derived_entry(solver: HInnerSolver, steps: Sequence[Any], *, hidden: bool, centroids: bool) -> dict[str, Any]:
    """The manifest's ``derived`` record (docs/TRACE_FORMAT.md): which steps columns are derived rather than
    copied from llama.cpp's graph, how (:meth:`~traces.run.derived.HInnerSolver.describe`), the worst-case
    bound and the agreement with the in-graph capture measured on the calibration ``steps``."""
    cols = (["h_inner"] if hidden else []) + (list(DERIVED_CENTROID_COLUMNS) if centroids else [])
    return {"columns": cols, **calibration_entry(solver, steps)}


def _note_partial(e: BaseException, swap: bool, write_to: Path, out: Any) -> None:
    """With ``overwrite`` of an existing trace: say where the unfinished new trace is."""
    if swap and write_to.exists():
        msg = (f"the run did not complete; the existing trace in {os.fspath(out)} is untouched and the "
               f"partial new trace is in {os.fspath(write_to)}")
        print(f"mtpscope: warning: {msg}", file=sys.stderr)
        e.add_note(msg)


__all__ = ["RecordSummary", "record"]
