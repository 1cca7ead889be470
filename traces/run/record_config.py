"""The run parameters of one recording: :class:`RecordConfig` (validated once, in its constructor) and
:class:`RecordJob` (a config with its models and prompts: what the recording worker runs).

A :class:`RecordConfig` is built where the parameters come in -- ``mtpscope record``'s flags, a sweep
task (:meth:`traces.sweep.spec.SweepSpec.record_config`), the demo build -- and goes unchanged to
:func:`traces.run.recorder.record`, through the worker protocol (:mod:`traces.run.transport` packs it
like any dataclass) to :meth:`traces.run.mtp_runtime.MtpRuntime.run`; the trace manifest's ``params``
object is :meth:`RecordConfig.manifest_params`. Nothing downstream checks these values again; what
depends on the models stays with them (``n_draft`` against the runtime's batch in ``MtpRuntime.run``,
``centroid_top_k`` against the head's n_centroids in :meth:`inspector.centroids.CentroidHead.ready`).

Imports: mtpscope.errors, traces.run.prompts (:class:`PromptSpec`, the job's prompts).
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, fields
from typing import Any

from mtpscope.errors import TraceError
from mtpscope.traces.run.prompts import PromptSpec

#: ``hidden``: hidden states stored as float16, float32, or not at all
HIDDEN_CHOICES = ("f16", "f32", "off")
#: ``mtpscope record --capture``: h_inner derived from what llama.cpp returns, or copied out of the graph
#: (``RecordConfig.graph_capture``)
CAPTURE_CHOICES = ("derived", "graph")
#: the most drafts per round a recording accepts. llama.cpp's MTP default is 3 drafts per round; each
#: round verifies ``n_draft + 1`` tokens in one target batch and the drafter's acceptance decays with
#: depth, so far more drafts than that are a mistake (``--n-draft 1000000000`` would otherwise allocate
#: gigabytes before llama.cpp fails).
MAX_N_DRAFT = 64
#: the most CPU threads llama.cpp runs a graph with (ggml.h's ``GGML_MAX_N_THREADS``)
MAX_N_THREADS = 512
#: drafts per round unless told otherwise: llama.cpp's MTP default (``RecordConfig.n_draft``; the CLI's
#: ``--n-draft`` default)
DEFAULT_N_DRAFT = 3
#: the largest seed: llama.cpp's sampler seeds are ``uint32_t`` (``LLAMA_DEFAULT_SEED``, this value, asks for a
#: random one; -1 says the same, as llama-server's ``seed: -1``)
SEED_MAX = 2**32 - 1

_INT, _REAL, _BOOL, _OPT_INT, _OPT_PATH, _CHOICE = "int", "real", "bool", "int | None", "path | None", "choice"


def _cpu_list(text: str) -> set[int]:
    """The CPUs of a Linux cpu list (``"0-3,8,10-11"``); raises ValueError on anything else."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def server_threads(sys_root: str = "/sys", *, n_cpu: int | None = None, allowed: set[int] | None = None,
                   machine: str | None = None) -> int:
    """The CPU threads llama-server uses when not told (``--threads`` unset): llama.cpp's
    ``common_cpu_get_num_math`` (common/common.cpp of the vendored sources), so that a recording with its default
    threads runs as the server's decode does (llama.cpp's own library default, 4, oversubscribes a 2-core
    machine and leaves most of a large one idle):

    * a hybrid x86-64 CPU on Linux (performance and efficiency cores: ``<sys_root>/devices/cpu_atom/cpus``
      names the efficiency cores, as the kernel's hybrid PMUs do; the server asks CPUID leaf 0x1A on each CPU):
      the server's own walk over the ``n_cpu`` online CPUs, skipping efficiency cores and, after each
      performance core, the CPU after it (its hyper-thread sibling); if a CPU outside this process's affinity
      ``allowed`` would be visited, the server's pinning fails and it falls back to the next rule;
    * ppc64: physical cores times the SMT factor, at most 2;
    * else ``common_cpu_get_num_physical_cores``: the number of distinct
      ``<sys_root>/devices/system/cpu/cpuN/topology/thread_siblings`` sets, read from ``cpu0`` up to the first that
      is missing (one per physical core; SMT siblings share one); where those files are missing (macOS,
      Windows): ``os.cpu_count()``.

    ``n_cpu`` (online CPUs), ``allowed`` (this process's CPU affinity) and ``machine`` (``platform.machine()``)
    default to this machine's; a test passes its own with a ``sys_root`` of its own.
    """
    import platform

    root = sys_root.rstrip("/")
    if n_cpu is None:
        n_cpu = os.sysconf("SC_NPROCESSORS_ONLN") if hasattr(os, "sysconf") else (os.cpu_count() or 1)
    machine = (platform.machine() if machine is None else machine).lower()
    seen: set[str] = set()
    cpu = 0
    while True:
        try:
            with open(f"{root}/devices/system/cpu/cpu{cpu}/topology/thread_siblings", encoding="ascii") as f:
                seen.add(f.readline().strip())
        except OSError:
            break
        cpu += 1
    physical = len(seen) if seen else max(1, os.cpu_count() or 1)
    if machine in ("x86_64", "amd64") and n_cpu >= 1:
        try:
            with open(f"{root}/devices/cpu_atom/cpus", encoding="ascii") as f:
                atom = _cpu_list(f.read())
        except (OSError, ValueError):
            atom = set()
        if atom:                      # hybrid: the server's walk (cpu_count_math_cpus)
            if allowed is None:
                allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(n_cpu))
            result, cpu = 0, 0
            while cpu < n_cpu:
                if cpu not in allowed:            # pin_cpu fails: the server counts physical cores instead
                    return physical
                if cpu not in atom:
                    cpu += 1                      # its sibling: "hyperthreading isn't useful for linear algebra"
                    result += 1
                cpu += 1
            if result > 0:
                return result
    elif machine.startswith(("ppc64", "powerpc")):
        logical = n_cpu if n_cpu >= 1 else physical
        smt = logical // physical if logical > physical else 1
        return physical * min(smt, 2)
    return physical


def check_n_threads(n_threads: int | None) -> None:
    """The one rule of llama.cpp's thread count (``RecordConfig.n_threads``, ``MtpRuntime(n_threads=...)``):
    None (llama-server's default, :func:`server_threads`) or 1..:data:`MAX_N_THREADS`.

    Raises:
        TraceError: any other value (key ``n_threads``).
    """
    if n_threads is not None and not 1 <= int(n_threads) <= MAX_N_THREADS:
        raise TraceError(f"n_threads must be in 1..{MAX_N_THREADS} (ggml's GGML_MAX_N_THREADS), or unset for "
                         "llama-server's default (one per physical core)", key="n_threads",
                         expected=f"1..{MAX_N_THREADS} or unset", actual=n_threads)


@dataclass(frozen=True)
class RecordConfig:
    """The run parameters of a recording (``mtpscope record``'s flags; the defaults are the CLI's).

    Attributes:
        n_draft: drafts per round, 1..:data:`MAX_N_DRAFT` (64).
        max_tokens: tokens generated per prompt at most (the prefill's token included), >= 1.
        temp / seed / top_k / top_p / min_p: the target's sampling, llama-server 0.3.36's chain and defaults
            (top_k 40, top_p 0.95, min_p 0.05; docs/RECORDING.md "Sampling"): ``temp`` finite >= 0 (0 =
            greedy), ``seed`` in 0..2**32 - 1 (llama.cpp's ``uint32_t``; -1 or 2**32 - 1: a random seed, as
            llama-server's ``seed: -1``), ``top_k >= 0`` (0 = off), ``top_p`` in (0, 1]
            (1 = off), ``min_p`` in [0, 1] (0 = off).
        chat: apply the target GGUF's own chat template to each text prompt.
        n_gpu_layers: layers offloaded, >= -1 (-1 = all; no effect in a CPU-only build).
        centroids: centroid head source (fork-dialect GGUF or HF directory), kept as a path string; None.
        centroid_top_k: that head's k (None: the source's own; its range is the head's: 1..n_centroids).
        hidden: hidden states stored as ``"f16"``, ``"f32"`` or ``"off"`` (:data:`HIDDEN_CHOICES`).
        n_top: drafter candidates stored per step, >= 1.
        flush_every: rounds per Parquet part, >= 1 (each round is in the write-ahead log before it is reported
            whatever this is; fewer parts cost the recorder less: 32 against 8 saves about 0.5 ms of a demo round).
        compact: merge the small parts at the end.
        flash_attn: flash attention (off by default: see :class:`traces.run.mtp_runtime.MtpRuntime`).
        n_threads: llama.cpp CPU threads, 1..:data:`MAX_N_THREADS` (None: llama-server's default,
            :func:`server_threads`).
        hidden_target: also store the target's hidden state per draft (needs ``hidden`` f16 / f32).
        baseline: time plain decoding of the same prompts first (the manifest's ``baseline``).
        graph_capture: copy ``h_inner`` (the drafter's ``result_norm``) out of llama.cpp's graph with a
            ``cb_eval`` callback in every drafter decode (``--capture graph``; ggml's scheduler then computes
            the graph in pieces); only where something reads ``h_inner`` (stored hidden states or ``centroids``). Default False: ``h_inner`` and the centroid head's inputs are derived in
            the recording process from the logits and ``h_next`` llama.cpp returns anyway
            (:mod:`traces.run.derived`; manifest ``derived``: the solve, its bound and the agreement with
            the in-graph capture measured on calibration steps after the run).
        repack: let llama.cpp put CPU weights in its extra buffer types (AMX, repacked layouts; its default).
            ``--no-repack`` (as llama.cpp's own tools call it) works around llama.cpp 0.3.36 crashing on Gemma 4
            MoE targets on AVX-512 / AMX CPUs with them (:class:`traces.run.llama.model.LlamaModel`).

    Ints are stored as ``int``, reals as ``float``, flags as ``bool``, ``centroids`` as ``str``.

    Raises:
        TraceError: the first field that breaks its rule, naming it (``key``) with expected vs actual
            (a value of the wrong type too: ``n_draft="3"``).
    """

    n_draft: int = DEFAULT_N_DRAFT
    max_tokens: int = 128
    temp: float = 0.0
    seed: int = 0
    top_k: int = 40
    top_p: float = 0.95
    chat: bool = False
    n_gpu_layers: int = -1
    centroids: str | None = None
    centroid_top_k: int | None = None
    hidden: str = "f16"
    n_top: int = 10
    flush_every: int = 32
    compact: bool = True
    flash_attn: bool = False
    n_threads: int | None = None
    hidden_target: bool = False
    baseline: bool = False
    graph_capture: bool = False
    repack: bool = True
    min_p: float = 0.05

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, _typed(f.name, _KINDS[f.name], getattr(self, f.name)))
        _check(self)

    @property
    def greedy(self) -> bool:
        """``temp <= 0``: the target takes its argmax."""
        return self.temp <= 0

    @property
    def needs_h_inner(self) -> bool:
        """Whether the run needs ``h_inner``: hidden states are stored or a centroid head is scored."""
        return self.hidden != "off" or self.centroids is not None

    @property
    def capture(self) -> bool:
        """Whether the drafter needs the ``cb_eval`` capture of ``h_inner`` in every decode: ``h_inner`` is
        needed and ``graph_capture`` asks for it from the graph (else it is derived)."""
        return self.needs_h_inner and self.graph_capture

    @property
    def derive(self) -> bool:
        """Whether ``h_inner`` is derived from the logits and ``h_next`` (:mod:`traces.run.derived`)."""
        return self.needs_h_inner and not self.graph_capture

    def manifest_params(self, *, centroid_top_k: int | None, n_ctx: int | None, isolated: bool,
                        preflight: bool) -> dict[str, Any]:
        """The trace manifest's ``params`` object (docs/TRACE_FORMAT.md; key order fixed, as traces have it):
        every field in its order, the run's own entries (``n_ctx``, ``greedy``, ``isolated``, ``preflight``)
        after ``n_threads``.

        Args:
            centroid_top_k: the centroid head's k in use (None without a head); it stands for the field.
            n_ctx: the context size (None until the runtime is loaded).
            isolated: llama.cpp runs in a worker process; preflight: the pair was checked before loading.
        """
        run = {"n_ctx": n_ctx, "greedy": self.greedy, "isolated": bool(isolated), "preflight": bool(preflight)}
        out: dict[str, Any] = {}
        for f in fields(self):
            out[f.name] = centroid_top_k if f.name == "centroid_top_k" else getattr(self, f.name)
            if f.name == _RUN_PARAMS_AFTER:
                out.update(run)
        return out


#: the field after which the manifest's ``params`` hold the run's own entries (the order traces have)
_RUN_PARAMS_AFTER = "n_threads"
#: each field's kind, read from its annotation (``RecordConfig``'s fields are the one list)
_KIND_OF_ANNOTATION = {"int": _INT, "float": _REAL, "bool": _BOOL, "int | None": _OPT_INT, "str | None": _OPT_PATH,
                       "str": _CHOICE}
_KINDS = {f.name: _KIND_OF_ANNOTATION[str(f.type)] for f in fields(RecordConfig)}


def _typed(name: str, kind: str, v: Any) -> Any:
    """``v`` as the field's type, or a :class:`TraceError` naming the field."""
    if v is None and kind in (_OPT_INT, _OPT_PATH):
        return None
    if kind in (_INT, _OPT_INT) and isinstance(v, numbers.Integral) and not isinstance(v, bool):
        return int(v)
    if kind == _REAL and isinstance(v, numbers.Real) and not isinstance(v, bool):
        return float(v)
    if kind == _BOOL and isinstance(v, (bool, numbers.Integral)) and int(v) in (0, 1):
        return bool(v)
    if kind == _OPT_PATH and isinstance(v, (str, os.PathLike)):
        return os.fspath(v)
    if kind == _CHOICE and isinstance(v, str):
        return v
    want = {_INT: "an integer", _OPT_INT: "an integer or None", _REAL: "a number", _BOOL: "true or false",
            _OPT_PATH: "a path or None", _CHOICE: "a string"}[kind]
    raise TraceError(f"{name} must be {want}", key=name, expected=kind, actual=repr(v)[:60])


def _check(c: RecordConfig) -> None:
    """The rules of :class:`RecordConfig` (the first broken one raises)."""
    if not 1 <= c.n_draft <= MAX_N_DRAFT:
        raise TraceError(f"n_draft must be in 1..{MAX_N_DRAFT} (llama.cpp's MTP default is {DEFAULT_N_DRAFT}; far more "
                         "drafts than a verify batch holds is a mistake)", key="n_draft",
                         expected=f"1..{MAX_N_DRAFT}", actual=c.n_draft)
    for name in ("max_tokens", "n_top", "flush_every"):
        if getattr(c, name) < 1:
            raise TraceError(f"{name} must be >= 1", key=name, expected=">= 1", actual=getattr(c, name))
    check_n_threads(c.n_threads)
    if not math.isfinite(c.temp) or c.temp < 0:
        raise TraceError("temp must be a finite number >= 0 (0 = greedy)", key="temp",
                         expected="finite >= 0", actual=c.temp)
    if not math.isfinite(c.top_p) or not 0.0 < c.top_p <= 1.0:
        raise TraceError("top_p must be in (0, 1] (1 = off)", key="top_p", expected="0 < top_p <= 1",
                         actual=c.top_p)
    if not math.isfinite(c.min_p) or not 0.0 <= c.min_p <= 1.0:
        raise TraceError("min_p must be in [0, 1] (0 = off)", key="min_p", expected="0 <= min_p <= 1",
                         actual=c.min_p)
    if not -1 <= c.seed <= SEED_MAX:      # (llama.cpp's dist takes a uint32: 2**32 drew with seed 0's numbers)
        raise TraceError(f"seed must be in 0..{SEED_MAX} (llama.cpp's uint32_t; -1: a random one, as llama-server's)",
                         key="seed", expected=f"-1..{SEED_MAX}", actual=c.seed)
    if c.top_k < 0:
        raise TraceError("top_k must be >= 0 (0 = off)", key="top_k", expected=">= 0", actual=c.top_k)
    if c.n_gpu_layers < -1:
        raise TraceError("n_gpu_layers must be >= -1 (-1 = all, 0 = CPU only)", key="n_gpu_layers",
                         expected=">= -1", actual=c.n_gpu_layers)
    if c.hidden not in HIDDEN_CHOICES:
        raise TraceError("unknown hidden-state storage", key="hidden", expected=" | ".join(HIDDEN_CHOICES),
                         actual=c.hidden)
    if c.hidden_target and c.hidden == "off":
        raise TraceError("hidden_target stores a hidden state: it needs hidden f16 or f32", key="hidden_target",
                         expected="hidden f16 | f32", actual="hidden off")
    if c.graph_capture and not c.needs_h_inner:
        raise TraceError("graph_capture copies h_inner, which only stored hidden states and a centroid head read",
                         key="graph_capture", expected="hidden f16 | f32, or centroids", actual="hidden off, no centroids")


@dataclass(frozen=True)
class RecordJob:
    """One recording as the worker runs it (the worker protocol's ``start`` message, packed by
    :func:`traces.run.packing.pack`): the model paths, the prompts (read and checked by the recorder)
    and the :class:`RecordConfig`. It comes back from :func:`traces.run.packing.unpack` equal, except
    that lists inside a prompt's ``extra`` fields come back as tuples (the worker does not read them)."""

    target: str
    assistant: str
    prompts: tuple[PromptSpec, ...]
    config: RecordConfig


__all__ = ["CAPTURE_CHOICES", "DEFAULT_N_DRAFT", "HIDDEN_CHOICES", "MAX_N_DRAFT", "MAX_N_THREADS", "RecordConfig", "RecordJob",
           "SEED_MAX",
           "check_n_threads", "server_threads"]
