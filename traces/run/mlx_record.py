"""``mtpscope record --runtime mlx``: mlx-vlm's own MTP loop (:class:`traces.run.mlx_runtime.MlxRuntime`)
written as a trace of the same schema as a llama.cpp recording (docs/TRACE_FORMAT.md), with the runtime's
conventions in the manifest (``convention``; docs/RUNTIMES.md).

Rounds and steps go through the same records as the llama.cpp recorder (:mod:`traces.run.step_analysis`):
per round the pending token, its position, the drafts, the number accepted, the emitted tokens and the
target's token at every verify row; per step ``h``, ``h_next``, ``h_inner``, the drafter's dense top-k and,
with the assistant's centroid head, the centroid columns.

Imports: mtpscope.errors, inspector.centroids, traces.run.mlx_runtime (lazily), traces.run.prompts,
traces.run.record_config, traces.run.step_analysis, traces.store.writer (lazily).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mtpscope.errors import TraceError
from mtpscope.inspector.centroids import CentroidHead
from mtpscope.traces.run.prompts import PromptSpec
from mtpscope.traces.run.record_config import RecordConfig
from mtpscope.traces.run.step_analysis import round_record, step_records


@dataclass(frozen=True)
class MlxRecordSummary:
    """What :func:`record_mlx` wrote.

    Attributes:
        out: the trace directory; n_prompts, n_rounds, n_steps: counts written; n_drafted, n_accepted: drafts
        proposed / accepted (acceptance rate = n_accepted / n_drafted); outputs: per prompt the generated ids
        (the prefill's token first); seconds: wall time of the loops (loading excluded).
    """

    out: str
    n_prompts: int
    n_rounds: int
    n_steps: int
    n_drafted: int
    n_accepted: int
    outputs: tuple[tuple[int, ...], ...]
    seconds: float

    @property
    def acceptance_rate(self) -> float | None:
        """n_accepted / n_drafted, None with no drafts."""
        return self.n_accepted / self.n_drafted if self.n_drafted else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the fields and ``acceptance_rate``."""
        d = asdict(self)
        d["outputs"] = [list(o) for o in self.outputs]
        d["acceptance_rate"] = self.acceptance_rate
        return d


def _model_entry(path: str | os.PathLike[str], architecture: str, dialect: str) -> dict[str, Any]:
    p = Path(path)
    size = sum(f.stat().st_size for f in p.glob("*.safetensors")) if p.is_dir() else None
    return {"path": str(p), "size": size, "architecture": architecture, "dialect": dialect, "header_sha256": None}


def record_mlx(config: RecordConfig, *, target: str | os.PathLike[str], assistant: str | os.PathLike[str],
               out: str | os.PathLike[str], prompts: Sequence[PromptSpec], work_dir: str | os.PathLike[str],
               draft_position: str = "p-1", dtype: str | None = None, stop_at_eog: bool = True,
               overwrite: bool = False, command: Sequence[str] | None = None,
               on_round: Callable[[int, Any], None] | None = None) -> MlxRecordSummary:
    """Record mlx-vlm's greedy MTP loop on ``prompts`` into the trace folder ``out``.

    Args:
        config: the run (``n_draft``, ``max_tokens``, ``hidden``, ``n_top``, ``centroid_top_k``,
            ``flush_every``, ``compact`` are used; ``temp`` must be 0: greedy only).
        target / assistant: Hugging Face checkpoint folders (:class:`traces.run.mlx_runtime.MlxRuntime`).
        prompts: token prompts (``source == "tokens"``): the checkpoints carry no tokenizer.
        work_dir: where a re-labelled target is kept (the cache folder).
        draft_position: ``"p-1"`` (mlx-vlm's own) or ``"p"`` (llama.cpp's), dtype: None or ``"f32"``,
        stop_at_eog: see :meth:`MlxRuntime.run`.
        on_round: called with ``(prompt_id, RoundResult)`` after each written round.

    Raises:
        TraceError: sampling asked for (``temp > 0``), a prompt without token ids, no prompts, ``out`` already a
            trace without ``overwrite``. RuntimeUnavailableError: mlx / mlx-vlm missing.
    """
    if config.temp != 0.0:
        raise TraceError("the MLX runtime records greedy decoding only", key="temp", expected=0.0, actual=config.temp)
    if not prompts:
        raise TraceError("no prompts", key="prompts", expected="at least one", actual=0)
    for sp in prompts:
        if sp.tokens is None:
            raise TraceError("the MLX runtime takes token prompts (the HF checkpoints carry no tokenizer)",
                             path=sp.path, key=sp.where("tokens")["key"], expected="a 'tokens' list",
                             actual=sp.source)
    o = Path(out)
    if (o / "manifest.json").exists() and not overwrite:
        raise TraceError("output folder already holds a trace", path=str(o), expected="a new folder or --overwrite",
                         actual="manifest.json present")
    from mtpscope.traces.run.mlx_runtime import MlxRuntime, versions
    from mtpscope.traces.store.writer import TraceWriter

    rt = MlxRuntime(target, assistant, work_dir=work_dir, draft_position=draft_position, dtype=dtype)
    head = None
    if rt.head == "centroid" and config.hidden != "off":
        head = CentroidHead.from_hf(assistant).ready(config.centroid_top_k)
    params = {"n_draft": config.n_draft, "max_tokens": config.max_tokens, "temp": 0.0, "greedy": True,
              "hidden": config.hidden, "n_top": config.n_top, "flush_every": config.flush_every,
              "compact": config.compact, "runtime": "mlx", "draft_position": draft_position,
              "dtype": rt.dtype, "stop_at_eog": stop_at_eog, "draft_head": rt.head,
              "centroid_top_k": None if head is None else head.top_k}
    manifest: dict[str, Any] = {
        "source": "record", "command": list(command) if command is not None else list(sys.argv), "params": params,
        "models": {"target": _model_entry(target, "gemma4", "hf"),
                   "assistant": _model_entry(assistant, "gemma4_assistant", "hf"),
                   "centroids": None if head is None else _model_entry(assistant, "gemma4_assistant", "hf")},
        "runtime": {"name": "mlx", **versions(), "device": str(rt.mx.default_device()),
                    "llama_cpp_python": None, "llama_cpp": None},
        "prompts": [sp.manifest_entry(i, len(sp.tokens or ())) for i, sp in enumerate(prompts)],
        "centroids": None if head is None else {"n_centroids": head.n_centroids, "top_k": head.top_k,
                                                "source": head.source, "kind": head.kind},
        "convention": rt.convention(stop_at_eog=stop_at_eog),
    }
    hidden = None if config.hidden == "off" else config.hidden
    outputs: list[tuple[int, ...]] = []
    n_rounds = n_steps = n_drafted = n_accepted = 0
    t0 = time.perf_counter()
    with TraceWriter(o, manifest, n_embd_backbone=rt.n_embd_backbone, n_embd=rt.n_embd, hidden_dtype=hidden,
                     centroids=head is not None, flush_every=config.flush_every, compact=config.compact,
                     overwrite=overwrite) as w:
        for pid, sp in enumerate(prompts):
            gen: list[int] = []
            for res in rt.run(sp.tokens or (), n_draft=config.n_draft, max_tokens=config.max_tokens,
                              trace=hidden is not None, stop_at_eog=stop_at_eog):
                if not gen:
                    gen.append(res.pending_token)
                steps = step_records(res, n_top=config.n_top, hidden=config.hidden, head=head) if res.steps else []
                w.add_round(round_record(pid, res), steps)
                gen.extend(res.emitted)
                n_rounds, n_steps = n_rounds + 1, n_steps + len(steps)
                n_drafted, n_accepted = n_drafted + len(res.drafted), n_accepted + res.n_accepted
                if on_round is not None:
                    on_round(pid, res)
            outputs.append(tuple(gen))
    return MlxRecordSummary(out=str(o), n_prompts=len(prompts), n_rounds=n_rounds, n_steps=n_steps,
                            n_drafted=n_drafted, n_accepted=n_accepted, outputs=tuple(outputs),
                            seconds=time.perf_counter() - t0)


__all__ = ["MlxRecordSummary", "record_mlx"]
