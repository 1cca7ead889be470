"""The recording worker's protocol, typed both ways: each message a frozen dataclass built once and read by
its attributes (:mod:`traces.run.record_worker` speaks it; :mod:`traces.run.transport` moves the bytes), and
:class:`RoundSource`, what the recorder needs of a worker (:class:`traces.run.record_worker.RecordWorker`) or
of the same loop in its own process (:class:`traces.run.record_worker.InProcessRounds`).

Recorder -> worker: :class:`Start` (the job), :class:`Go`, :class:`Stop` (and the transport's own
``release``). Worker -> recorder: :class:`Hello`, :class:`Baseline`, the rounds (:class:`WorkerRound`, its
arrays in the shared ring: :data:`ROUND`) and the calibration (:data:`CALIBRATION`, also through the ring),
:class:`PromptDone`, :class:`ProbeDone`, :class:`WorkerDone` or :class:`Stopped`, :class:`WorkerError`.

On the wire a message is one JSON object: ``{"kind": <its kind>, <field>: <value>, ...}`` (:func:`encode`,
:func:`decode`); the job inside :class:`Start` is packed by :func:`traces.run.packing.pack`.

Imports: mtpscope.errors, traces.run.packing, traces.run.record_config (:class:`RecordJob`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar, Union, cast

from mtpscope.errors import TraceError
from mtpscope.traces.run.packing import pack, unpack
from mtpscope.traces.run.record_config import RecordJob

if TYPE_CHECKING:
    from mtpscope.traces.run.mtp_runtime import Calibration, RoundResult

#: the kinds of the two messages that carry their arrays in the shared ring (:class:`traces.run.transport.RoundSender`)
ROUND = "round"
CALIBRATION = "calibration"


# ------------------------------------------------------------------------------------ recorder -> worker
@dataclass(frozen=True)
class Start:
    """The run (:class:`~traces.run.record_config.RecordJob`): the worker loads its models and prompts."""

    kind: ClassVar[str] = "start"
    job: RecordJob


@dataclass(frozen=True)
class Go:
    """The pre-flight check passed: the worker may decode."""

    kind: ClassVar[str] = "go"


@dataclass(frozen=True)
class Stop:
    """Stop (the pair was refused, or a Ctrl-C in the recorder); the worker's round sender knows the kind too."""

    kind: ClassVar[str] = "stop"


# ------------------------------------------------------------------------------------ worker -> recorder
@dataclass(frozen=True)
class Baseline:
    """The worker timed plain decoding first (``record --baseline``): the manifest entry
    (:func:`traces.run.mtp_runtime.time_plain`) and the plain outputs."""

    kind: ClassVar[str] = "baseline"
    entry: Mapping[str, Any]
    plain_outputs: Sequence[Sequence[int]]


@dataclass(frozen=True)
class Hello:
    """The runtime is loaded and the prompts tokenized: the models' widths and vocabulary, the context size,
    whether the drafter has the ``cb_eval`` capture, the runtime facts for the manifest
    (:func:`traces.run.llama.binding.runtime_info`), each prompt's token count and the text it stands for;
    ``pid``: the worker process (None in this process); ``baseline``: plain decoding timed already (in this
    process; a worker sends its :class:`Baseline` after :class:`Go`); ``startup``: a worker's start-up clock,
    epoch seconds (``time.time()``) when its ``main`` began (Python started, the module imported), the job
    arrived, the runtime was loaded (llama.cpp imported, both models, both contexts) and the prompts were
    tokenized (``main``, ``job``, ``runtime``, ``prompts``), and the process's CPU seconds then (``main_cpu``,
    ...; ``benchmarks/bench_startup.py`` breaks the start-up down with it); ``n_ctx_train``: the context the target
    was trained for (its ``context_length``; 0 where unknown)."""

    kind: ClassVar[str] = "hello"
    n_vocab: int
    n_embd_backbone: int
    n_embd: int
    n_ctx: int
    capture: bool
    runtime: Mapping[str, Any]
    n_prompt_tokens: Sequence[int]
    prompt_texts: Sequence[str | None]
    pid: int | None = None
    baseline: Baseline | None = None
    startup: Mapping[str, float] | None = None
    n_ctx_train: int = 0


@dataclass(frozen=True)
class WorkerRound:
    """A finished round from the worker; ``result``'s large arrays are ring views until released."""

    prompt_id: int
    result: RoundResult


@dataclass(frozen=True)
class PromptDone:
    """The worker finished a prompt; ``first_token``: the prefill's token (also when no round followed)."""

    kind: ClassVar[str] = "prompt_done"
    prompt_id: int
    first_token: int | None


@dataclass(frozen=True)
class ProbeDone:
    """The worker timed a round of every size after its loop: the manifest's ``cost_probe`` entry
    (:meth:`traces.run.mtp_runtime.MtpRuntime.probe_costs`)."""

    kind: ClassVar[str] = "cost_probe"
    entry: Mapping[str, Any]


@dataclass(frozen=True)
class WorkerDone:
    """The worker finished every prompt: its loop's wall seconds and CPU seconds (the worker process's
    without its sender thread; loading excluded), the seconds it waited for the recorder to release a round (back-pressure; 0 in
    this process), the wall seconds of its loop spent inside llama.cpp decodes and the CPU seconds of
    the whole worker process over the loop, its sender thread included (both 0 when not measured: in
    this process)."""

    kind: ClassVar[str] = "done"
    loop_seconds: float
    loop_cpu_seconds: float
    wait_seconds: float = 0.0
    decode_seconds: float = 0.0
    worker_cpu_seconds: float = 0.0
    #: when the loop began (``time.time()``, right before the first prompt's prefill decode) and the worker
    #: process's CPU seconds by then (imports, loading and prompts); 0 when not measured
    started_at: float = 0.0
    cpu_at_start: float = 0.0


@dataclass(frozen=True)
class Stopped:
    """The worker stopped on a :class:`Stop` before its next round."""

    kind: ClassVar[str] = "stopped"


@dataclass(frozen=True)
class WorkerError:
    """The worker failed: an :class:`~mtpscope.errors.MtpscopeError` (its class name and fields, for the
    recorder to raise the same error) or an internal error (``error_class`` ``"internal"``, its traceback in
    ``llama.log``)."""

    kind: ClassVar[str] = "error"
    error_class: str
    message: str
    path: str | None = None
    offset: int | None = None
    key: str | None = None
    expected: str | None = None
    actual: str | None = None


#: what the worker's loop yields to the recorder, in order (:meth:`RoundSource.events`)
Event = Union[Baseline, WorkerRound, PromptDone, "Calibration", ProbeDone, WorkerDone]
Message = Start | Go | Stop | Hello | Baseline | PromptDone | ProbeDone | WorkerDone | Stopped | WorkerError
_BY_KIND: dict[str, type[Message]] = {c.kind: c for c in (Start, Go, Stop, Hello, Baseline, PromptDone, ProbeDone,
                                                 WorkerDone, Stopped, WorkerError)}
M = TypeVar("M")


def encode(msg: Any) -> dict[str, Any]:
    """``msg`` (one of the message classes above) as the JSON object the channel sends."""
    body = {f.name: getattr(msg, f.name) for f in fields(msg)}
    if isinstance(msg, Start):
        body["job"] = pack(msg.job)[0]
    elif isinstance(msg, Hello) and msg.baseline is not None:
        raise TraceError("a worker's hello carries no baseline (it sends its Baseline after go)", key="baseline")
    return {"kind": msg.kind, **body}


def decode(raw: Mapping[str, Any], *expect: type[M]) -> M | None:
    """The message a JSON object from the channel stands for, when its kind is one of ``expect``'s (any
    message class when none is given); None for another kind.

    Raises:
        TraceError: a message of an expected kind whose fields do not fit its class.
    """
    cls = _BY_KIND.get(str(raw.get("kind")))
    if cls is None or (expect and cls not in expect):
        return None
    names = {f.name for f in fields(cls)}
    vals = {k: v for k, v in raw.items() if k in names}
    if cls is Start and "job" in vals:
        vals["job"] = unpack(vals["job"], ())
    try:
        # the kind's class is one of expect's (checked above), or any message class when none is expected
        return cast(M, cls(**vals))
    except TypeError as e:
        raise TraceError(f"malformed {cls.kind} message: {e}", key="kind", actual=cls.kind) from None


# ------------------------------------------------------------------------------------ the recorder's view
class RoundSource(Protocol):
    """What the recorder needs of the loop that produces its rounds: :class:`traces.run.record_worker.RecordWorker`
    (llama.cpp in a worker process) or :class:`traces.run.record_worker.InProcessRounds` (in this one)."""

    def hello(self) -> Hello:
        """Wait until the models are loaded and the prompts tokenized."""

    def events(self) -> Iterator[Event]:
        """The run's events in order (:data:`Event`); one :class:`WorkerDone` ends them."""

    def release(self) -> None:
        """The oldest unreleased round's (or the calibration's) arrays may be overwritten."""

    def ready(self) -> bool:
        """Whether the next event is here already (taking it from :meth:`events` would not wait): the
        recorder then takes it too and analyses the rounds together."""

    def log_to(self, path: str | os.PathLike[str]) -> None:
        """From now on copy llama.cpp's output to ``path``."""

    def stop(self, grace: float = ...) -> None:
        """Stop the loop (a Ctrl-C or an error in the recorder)."""

    def close(self) -> None:
        """Free the loop (idempotent)."""


__all__ = ["CALIBRATION", "ROUND", "Baseline", "Event", "Go", "Hello", "Message", "ProbeDone", "PromptDone",
           "RoundSource", "Start", "Stop", "Stopped", "WorkerDone", "WorkerError", "WorkerRound", "decode", "encode"]
