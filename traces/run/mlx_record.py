"""``mtpscope record --runtime mlx``: mlx-vlm's own MTP loop (:class:`traces.run.mlx_runtime.MlxRuntime`)
written as a trace of the same schema as a llama.cpp recording (docs/TRACE_FORMAT.md), with the runtime's
conventions in the manifest (``convention``; docs/RUNTIMES.md).

The checks, the model entries and the write loop are :mod:`traces.run.checkpoint_record`'s (shared with
``--runtime hf``).

Imports: mtpscope.errors, traces.run.checkpoint_record, traces.run.mlx_runtime (lazily), traces.run.prompts,
traces.run.record_config.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from mtpscope.errors import TraceError
from mtpscope.traces.run.checkpoint_record import (
    CheckpointRecordSummary,
    centroid_head,
    check_inputs,
    head_manifest,
    model_entry,
    write_rounds,
)
from mtpscope.traces.run.prompts import PromptSpec
from mtpscope.traces.run.record_config import RecordConfig

#: what :func:`record_mlx` wrote (the summary every checkpoint runtime returns)
MlxRecordSummary = CheckpointRecordSummary


def record_mlx(config: RecordConfig, *, target: str | os.PathLike[str], assistant: str | os.PathLike[str],
               out: str | os.PathLike[str], prompts: Sequence[PromptSpec], work_dir: str | os.PathLike[str],
               draft_position: str = "p-1", dtype: str | None = None, head_choice: str = "checkpoint",
               stop_at_eog: bool = True,
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
        head_choice: ``"checkpoint"`` (mlx-vlm's own) or ``"dense"`` (llama.cpp's; :class:`MlxRuntime`),
        stop_at_eog: see :meth:`MlxRuntime.run`.
        on_round: called with ``(prompt_id, RoundResult)`` after each written round.

    Raises:
        TraceError: sampling asked for (``temp > 0``), a prompt without token ids, no prompts, ``out`` already a
            trace without ``overwrite``. RuntimeUnavailableError: mlx / mlx-vlm missing.
    """
    if config.temp != 0.0:
        raise TraceError("the MLX runtime records greedy decoding only", key="temp", expected=0.0, actual=config.temp)
    check_inputs("MLX", prompts, out, overwrite=overwrite)
    from mtpscope.traces.run.mlx_runtime import MlxRuntime, versions

    rt = MlxRuntime(target, assistant, work_dir=work_dir, draft_position=draft_position, dtype=dtype,
                    head_choice=head_choice)
    head = centroid_head(rt.head, assistant, config)
    params = {"n_draft": config.n_draft, "max_tokens": config.max_tokens, "temp": 0.0, "greedy": True,
              "hidden": config.hidden, "n_top": config.n_top, "flush_every": config.flush_every,
              "compact": config.compact, "runtime": "mlx", "draft_position": draft_position,
              "dtype": rt.dtype, "stop_at_eog": stop_at_eog, "draft_head": rt.head,
              "centroid_top_k": None if head is None else head.top_k, "n_vocab": rt.n_vocab}
    manifest: dict[str, Any] = {
        "source": "record", "command": list(command) if command is not None else list(sys.argv), "params": params,
        "models": {"target": model_entry(target, "gemma4"), "assistant": model_entry(assistant, "gemma4_assistant"),
                   "centroids": None if head is None else model_entry(assistant, "gemma4_assistant")},
        "runtime": {"name": "mlx", **versions(), "device": str(rt.mx.default_device()),
                    "llama_cpp_python": None, "llama_cpp": None},
        "prompts": [sp.manifest_entry(i, len(sp.tokens or ())) for i, sp in enumerate(prompts)],
        "centroids": head_manifest(head),
        "convention": rt.convention(stop_at_eog=stop_at_eog),
    }
    return write_rounds(config, out=out, manifest=manifest, n_embd_backbone=rt.n_embd_backbone, n_embd=rt.n_embd,
                        head=head, prompts=prompts, overwrite=overwrite, on_round=on_round,
                        rounds=lambda _pid, sp, trace: rt.run(sp.tokens or (), n_draft=config.n_draft,
                                                             max_tokens=config.max_tokens, trace=trace,
                                                             stop_at_eog=stop_at_eog))


__all__ = ["MlxRecordSummary", "record_mlx"]
