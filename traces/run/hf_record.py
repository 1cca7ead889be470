"""``mtpscope record --runtime hf``: Hugging Face transformers' own assisted generation with the Gemma 4 assistant
(:class:`traces.run.hf_runtime.HfRuntime`) written as a trace of the same schema as a llama.cpp recording
(docs/TRACE_FORMAT.md), with the runtime's conventions in the manifest (``convention``; docs/RUNTIMES.md).

Greedy (``temp`` 0) or ``do_sample`` (``temp > 0``: HF's rejection sampling, ``top_k`` / ``top_p`` / ``min_p``
as its logits processors, ``torch.manual_seed(seed)`` before each prompt). The checks, the model entries and
the write loop are :mod:`traces.run.checkpoint_record`'s (shared with ``--runtime mlx``).

Imports: traces.run.checkpoint_record, traces.run.hf_runtime (lazily), traces.run.prompts,
traces.run.record_config.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

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

#: torch's CPU threads when the config names none (as the demo's llama.cpp traces are recorded: one thread)
DEFAULT_HF_THREADS = 1


def record_hf(config: RecordConfig, *, target: str | os.PathLike[str], assistant: str | os.PathLike[str],
              out: str | os.PathLike[str], prompts: Sequence[PromptSpec], overwrite: bool = False,
              command: Sequence[str] | None = None,
              on_round: Callable[[int, Any], None] | None = None) -> CheckpointRecordSummary:
    """Record HF's assisted generation on ``prompts`` into the trace folder ``out``.

    Args:
        config: the run (``n_draft``, ``max_tokens``, ``temp``, ``seed``, ``top_k``, ``top_p``, ``min_p``,
            ``n_threads`` (None: :data:`DEFAULT_HF_THREADS`), ``hidden``, ``n_top``, ``centroid_top_k``,
            ``flush_every``, ``compact`` are used).
        target / assistant: Hugging Face checkpoint folders (``Gemma4ForCausalLM``, ``Gemma4AssistantForCausalLM``).
        prompts: token prompts (``source == "tokens"``): the checkpoints carry no tokenizer.
        on_round: called with ``(prompt_id, RoundResult)`` after each written round.

    Raises:
        TraceError: a prompt without token ids, no prompts, ``out`` already a trace without ``overwrite``, a
            checkpoint transformers cannot load. RuntimeUnavailableError: torch / transformers >= 5.24 missing.
    """
    check_inputs("HF", prompts, out, overwrite=overwrite)
    from mtpscope.traces.run.hf_runtime import HfRuntime, versions

    threads = config.n_threads if config.n_threads is not None else DEFAULT_HF_THREADS
    rt = HfRuntime(target, assistant, n_threads=threads)
    head = centroid_head(rt.head, assistant, config)
    greedy = config.temp <= 0.0
    params = {"n_draft": config.n_draft, "max_tokens": config.max_tokens, "temp": config.temp, "greedy": greedy,
              "seed": config.seed, "top_k": config.top_k, "top_p": config.top_p, "min_p": config.min_p,
              "hidden": config.hidden, "n_top": config.n_top, "flush_every": config.flush_every,
              "compact": config.compact, "n_threads": threads, "runtime": "hf", "draft_position": "p",
              "dtype": rt.dtype, "draft_head": rt.head, "centroid_top_k": None if head is None else head.top_k,
              "n_vocab": rt.n_vocab}
    manifest: dict[str, Any] = {
        "source": "record", "command": list(command) if command is not None else list(sys.argv), "params": params,
        "models": {"target": model_entry(target, "gemma4"), "assistant": model_entry(assistant, "gemma4_assistant"),
                   "centroids": None if head is None else model_entry(assistant, "gemma4_assistant")},
        "runtime": {"name": "hf", **versions(), "device": "cpu", "llama_cpp_python": None, "llama_cpp": None},
        "prompts": [sp.manifest_entry(i, len(sp.tokens or ())) for i, sp in enumerate(prompts)],
        "centroids": head_manifest(head),
        "convention": rt.convention(greedy=greedy),
    }

    def rounds(_pid: int, sp: PromptSpec, trace: bool) -> Sequence[Any]:
        return rt.run(sp.tokens or (), n_draft=config.n_draft, max_tokens=config.max_tokens, temp=config.temp,
                      seed=config.seed, top_k=config.top_k, top_p=config.top_p, min_p=config.min_p,
                      trace=trace).rounds

    return write_rounds(config, out=out, manifest=manifest, n_embd_backbone=rt.n_embd_backbone, n_embd=rt.n_embd,
                        head=head, prompts=prompts, rounds=rounds, overwrite=overwrite, on_round=on_round)


__all__ = ["DEFAULT_HF_THREADS", "record_hf"]
