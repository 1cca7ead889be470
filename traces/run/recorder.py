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

Imports: numpy, mtpscope.errors, mtpscope.inspector (centroids, gguf), traces.run.llama.process,
traces.run.derived, traces.run.mtp_runtime, traces.run.preflight, traces.run.prompts, traces.run.record_config, traces.run.record_worker,
traces.run.step_analysis, traces.store.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.errors import MtpscopeError, RuntimeAbortedError, TraceError
from mtpscope.inspector.centroids import head_from_gguf, load_centroid_head
from mtpscope.traces.run.llama.process import deferred_sigint
from mtpscope.traces.run.derived import HInnerSolver, cached_solver, calibration_entry
from mtpscope.traces.run.mtp_runtime import Calibration, MtpRuntime, RoundResult
from mtpscope.traces.run.preflight import centroid_source_info, model_info, preflight, unchecked_models
from mtpscope.traces.run.prompts import PromptSpec, read_prompt_specs
from mtpscope.traces.run.record_config import RecordConfig, RecordJob
from mtpscope.traces.run.record_worker import (STOP_GRACE_S, Baseline, InProcessRounds, ProbeDone, PromptDone, RecordWorker,
                                               WorkerDone, WorkerRound)
from mtpscope.traces.run.step_analysis import round_record, step_records

# --------------------------------------------------------------------------------------------------
# numpy's BLAS threads during the run
# --------------------------------------------------------------------------------------------------

_BLAS_THREAD_FUNCS = (("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
                      ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
                      ("openblas_set_num_threads", "openblas_get_num_threads"))


def _openblas_thread_control() -> tuple[Callable[[int], None], Callable[[], int]] | None:
    """``(set, get)`` for the thread count of the OpenBLAS that numpy's wheel bundles, else None."""
    import ctypes  # noqa: PLC0415
    import glob  # noqa: PLC0415

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
        seconds: wall time of the generation loops (prefill and trace writing included; loading and the
            derived h_inner's calibration after the loop excluded).
        cpu_seconds: CPU time of the processes over the same span (``time.process_time``; this process
            and, when isolated, the worker process over its loop: loop thread and sender thread).
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        d = asdict(self)
        d["outputs"] = [list(o) for o in self.outputs]
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
    n_accepted, emitted tokens (accepted drafts + the target's token; cut after an end-of-generation
    token, in which case ``n_accepted`` counts only the drafts up to it), draft / verify wall times in
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
            place (crash-safe parts).
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
        TraceError: ``out`` already holds a trace (without ``overwrite``); errors from the writer.
        MtpscopeError: not exactly one prompt source, no prompts, a bad prompts file; ``isolate=True``
            with a ``runtime``; GGUF reader errors.
        RuntimeUnavailableError: llama-cpp-python missing.
        KeyboardInterrupt: a Ctrl-C (isolated: the worker is stopped first; in process: raised right after
            the llama.cpp decode it arrived in); the trace written so far stays readable, marked incomplete.
    """
    from mtpscope.traces.store.layout import MANIFEST  # noqa: PLC0415 - standard library only

    given = [x is not None for x in (prompts, prompt, prompts_file)]
    if sum(given) != 1:
        raise MtpscopeError("give exactly one of prompts, prompt, prompts_file", key="prompts",
                            expected="one source", actual=sum(given))
    if prompts is not None:
        specs = [p if isinstance(p, PromptSpec) else PromptSpec(text=p) for p in prompts]
    elif prompt is not None:
        specs = [PromptSpec(text=prompt)]
    else:
        specs = read_prompt_specs(prompts_file)  # type: ignore[arg-type]
    if not specs:
        raise MtpscopeError("no prompts", key="prompts", expected=">= 1", actual=0)

    if not overwrite and (Path(out) / MANIFEST).exists():  # fail before loading anything
        raise TraceError("directory already holds a trace (pass --overwrite, or overwrite=True in Python, to replace it)",
                         path=out)
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
        from mtpscope.traces.store.writer import TraceWriter, holds_trace, partial_dir, swap_in  # noqa: PLC0415

        # --overwrite of an existing trace: record next to it and swap it in only when the run completes
        swap = bool(overwrite) and holds_trace(out)
        write_to = partial_dir(out) if swap else Path(out)
        t_pf = time.perf_counter()
        models = _preflight(target, assistant) if preflight else unchecked_models(target, assistant)
        preflight_s = time.perf_counter() - t_pf
        head = None
        models["centroids"] = None
        if config.centroids is not None:
            cp = Path(config.centroids)
            if cp.is_file() and cp.suffix != ".safetensors":  # a GGUF: read it once for both
                from mtpscope.inspector.gguf import open_gguf  # noqa: PLC0415

                with open_gguf(cp) as cf:
                    head = head_from_gguf(cf, top_k=config.centroid_top_k)
                    models["centroids"] = model_info(cf)
            else:
                head = load_centroid_head(cp, top_k=config.centroid_top_k)
                models["centroids"] = centroid_source_info(cp)
    except BaseException:
        if early is not None:
            early.abandon()                      # refused: the worker decoded nothing
        raise
    if early is not None:
        early.go()

    params = config.manifest_params(centroid_top_k=None if head is None else head.top_k, n_ctx=None,
                                    isolated=isolated, preflight=preflight)
    manifest = {
        "source": "record",
        "command": list(command) if command is not None else list(sys.argv),
        "params": params,
        "models": models,
        "prompts": [sp.manifest_entry(i, 0) for i, sp in enumerate(specs)],
        "centroids": None if head is None else {"n_centroids": head.n_centroids, "top_k": head.top_k,
                                                "source": head.source, "kind": head.kind},
        "derived": None,
    }
    hd = None if config.hidden == "off" else config.hidden
    n_rounds = n_steps = n_drafted = n_accepted = n_gen = n_verify = 0
    outputs: list[tuple[int, ...]] = []
    trace_s = 0.0
    loop: WorkerDone | None = None
    w: TraceWriter | None = None
    src: RecordWorker | InProcessRounds | None = None
    blas = _SingleThreadBlas().__enter__()
    sigint = contextlib.nullcontext() if isolated else deferred_sigint()
    sigint.__enter__()
    t_start, c_start = time.perf_counter(), time.process_time()
    try:
        src = early if early is not None else InProcessRounds(runtime, job)
        # while the worker loads the models: the solve that derives h_inner from the logits and h_next (built
        # here, it never holds up the loop; unused when a loaded runtime brings the graph capture)
        solver = _solver(assistant) if config.derive else None
        info = src.hello()
        cpu_at_hello = time.process_time()
        if head is not None:
            head.check_compatible(n_embd=info["n_embd"], n_vocab=info["n_vocab"], drafter=assistant)
        if config.capture and not info["capture"]:
            raise MtpscopeError("this runtime was loaded without the cb_eval capture; hidden states and the "
                                "centroid head need it", key="hidden", expected="capture=True", actual="False")
        if info["capture"]:
            solver = None
        if solver is not None:
            manifest["derived"] = derived_entry(solver, (), hidden=config.hidden != "off", centroids=head is not None)
        params["n_ctx"] = info["n_ctx"]
        manifest["runtime"] = info["runtime"]
        manifest["prompts"] = [sp.manifest_entry(i, n, text=None if sp.source == "text" else txt)
                               for i, (sp, n, txt) in enumerate(zip(specs, info["n_prompt_tokens"],
                                                                    info["prompt_texts"], strict=True))]
        plain_outputs = info.get("plain_outputs")
        if info.get("baseline") is not None:
            manifest["baseline"] = info["baseline"]
        t_start, c_start = time.perf_counter(), time.process_time()
        w = TraceWriter(write_to, manifest, n_embd_backbone=None if hd is None else info["n_embd_backbone"],
                        n_embd=None if hd is None else info["n_embd"], hidden_dtype=hd,
                        centroids=head is not None, flush_every=config.flush_every, overwrite=overwrite or swap,
                        compact=config.compact, h_target=config.hidden_target)
        src.log_to(write_to / "llama.log")
        trace_s += time.perf_counter() - t_start
        gen: list[int] = []
        cal_s = 0.0            # the calibration after the loop: not part of the run's timing
        t_ev = time.perf_counter()
        for ev in src.events():
            if isinstance(ev, Baseline):
                w.manifest["baseline"], plain_outputs = ev.entry, ev.plain_outputs
                t_start, c_start = time.perf_counter(), time.process_time()   # the run's timing: from the loop
            elif isinstance(ev, ProbeDone):
                cal_s += time.perf_counter() - t_ev
                w.manifest["cost_probe"] = ev.entry
            elif isinstance(ev, Calibration):
                cal_s += time.perf_counter() - t_ev
                if solver is not None:
                    w.manifest["derived"] = derived_entry(solver, ev.steps, hidden=config.hidden != "off",
                                                          centroids=head is not None)
                src.release()
            elif isinstance(ev, WorkerRound):
                pid, res = ev.prompt_id, ev.result
                t0 = time.perf_counter()
                if not gen:
                    gen.append(res.pending_token)
                gen.extend(res.emitted)
                steps = step_records(res, n_top=config.n_top, hidden=config.hidden, head=head, solver=solver)
                src.release()          # the records own copies of all they keep: the worker may go on
                w.add_round(round_record(pid, res), steps)
                trace_s += time.perf_counter() - t0
                n_rounds += 1
                n_steps += len(steps)
                n_drafted += len(res.drafted)
                n_verify += 1 if res.drafted else 0
                n_accepted += res.n_accepted
                if on_round is not None:
                    on_round(pid, res)
            elif isinstance(ev, PromptDone):
                if not gen:  # the prefill token ended generation (EOG or max_tokens 1): no round
                    gen = [int(ev.first_token)] if ev.first_token is not None else []
                outputs.append(tuple(gen))
                n_gen += len(gen)
                gen = []
            elif isinstance(ev, WorkerDone):
                loop = ev
            t_ev = time.perf_counter()
        t0 = time.perf_counter()
        if plain_outputs is not None and config.greedy:
            w.manifest["baseline"]["outputs_equal"] = [list(o) for o in outputs] == [list(o) for o in plain_outputs]
        w.close()
        trace_s += time.perf_counter() - t0
        # the run ends here: the worker's exit (freeing the models) is not part of it
        secs, cpu_secs = time.perf_counter() - t_start - cal_s, time.process_time() - c_start
    except RuntimeAbortedError as e:
        # llama.cpp died: keep every round received, say where it stopped and what llama.cpp said
        if w is None:      # before the trace existed (e.g. while loading): a trace of its manifest and log
            w = TraceWriter(write_to, manifest, n_embd_backbone=None, n_embd=None, hidden_dtype=None,
                            centroids=head is not None, overwrite=overwrite or swap, compact=False)
            src.log_to(write_to / "llama.log")
        src.close()        # all of llama.cpp's output is in llama.log now
        w.close(complete=False, aborted=e.aborted)
        e.trace = os.fspath(write_to)
        e.message = (f"{e.message} (trace {os.fspath(write_to)}: {n_rounds} rounds kept, marked incomplete; "
                     f"llama.cpp's output in llama.log there)")
        e.args = (e.one_line(),)
        _note_partial(e, swap, write_to, out)
        raise
    except BaseException as e:
        if src is not None and isolated:
            src.stop(grace=STOP_GRACE_S if isinstance(e, KeyboardInterrupt) else 0.0)
        if w is not None:
            w.close(complete=False)  # keep the finished rounds, marked incomplete
        _note_partial(e, swap, write_to, out)
        raise
    finally:
        if src is not None:
            src.close()
        sigint.__exit__(None, None, None)
        blas.__exit__()
    worker_cpu = loop.worker_cpu_seconds if (loop is not None and isolated) else 0.0
    if swap:
        swap_in(write_to, out)
    return RecordSummary(out=os.fspath(out), n_prompts=len(specs), n_rounds=n_rounds, n_steps=n_steps,
                         n_drafted=n_drafted, n_accepted=n_accepted,
                         acceptance_rate=(n_accepted / n_drafted) if n_drafted else None,
                         mean_acceptance_length=(1 + n_accepted / n_verify) if n_verify else None,
                         n_generated=n_gen, seconds=secs, cpu_seconds=cpu_secs + worker_cpu, trace_seconds=trace_s,
                         tokens_per_second=n_gen / secs if secs > 0 else 0.0,
                         outputs=tuple(outputs), isolated=isolated,
                         loop_seconds=loop.loop_seconds if loop is not None else secs,
                         loop_cpu_seconds=loop.loop_cpu_seconds if loop is not None else cpu_secs,
                         recorder_cpu_seconds=cpu_secs, loop_wait_seconds=loop.wait_seconds if loop else 0.0,
                         loop_decode_seconds=loop.decode_seconds if loop else 0.0,
                         preflight_seconds=preflight_s,
                         startup_seconds=(loop.started_at - t_enter_epoch) if loop and loop.started_at else 0.0,
                         startup_cpu_seconds=cpu_at_hello + (loop.cpu_at_start if loop and isolated else 0.0))


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
