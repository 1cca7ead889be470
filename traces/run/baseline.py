"""Plain decoding of the target alone, timed token by token and written as a trace: the baseline a
sweep's speedups are measured against (``mtpscope sweep --baseline``).

The decoding is :meth:`MtpRuntime.generate_plain` (the recorder's own reference loop, greedy); this
module only times it: a thin stand-in for the target context notes when each ``decode`` returns.
``generate_plain`` decodes the prompt (one or more batches), then one token per decode, so of ``D``
decodes for ``n`` generated tokens the last ``n - 1`` are generation steps and the ones before them
the prefill.

The trace (docs/TRACE_FORMAT.md, ``source: "baseline"``) has one round per generated token after the
first: ``n_draft`` 0, ``drafted`` [], ``n_accepted`` 0, ``pending_token`` the token fed, ``target`` and
``emitted`` ``[next token]``, ``t_draft_ms`` 0 and ``t_verify_ms`` the wall time from the end of the
previous decode (the prefill's last one for round 0) to the end of this token's decode (the
previous token's argmax included, as an MTP round's verify time includes its argmaxes). So a
prompt's text is ``[rounds[0].pending_token] + emitted...`` as for MTP traces, and "tokens per
second" = emitted tokens / (t_draft_ms + t_verify_ms) means the same in both: generation after the
prefill's first token, prompt processing excluded. No ``steps``.

Imports: traces.store, traces.store.records, traces.run.record_config, traces.run.mtp_runtime (Sampler), traces.run.preflight
(model_info), traces.run.llama.binding (runtime_info), inspector.gguf.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtpscope.errors import MtpscopeError, TraceError
from mtpscope.traces.run.prompts import PromptSpec
from mtpscope.traces.run.record_config import RecordConfig
from mtpscope.traces.store.records import RoundRecord

if TYPE_CHECKING:
    from mtpscope.traces.run.mtp_runtime import MtpRuntime


class _TimedContext:
    """Stands in for a ``LlamaContext``: forwards everything, notes when each ``decode`` returns."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx
        self.ends: list[float] = []

    def decode(self, batch: Any) -> None:
        self._ctx.decode(batch)
        self.ends.append(time.perf_counter())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


def timed_plain(rtm: MtpRuntime, tokens: Sequence[int], *, max_tokens: int) -> tuple[list[int], list[float]]:
    """Greedy plain decoding of ``tokens`` with ``rtm.generate_plain``, timed.

    Args:
        rtm: a loaded :class:`traces.run.mtp_runtime.MtpRuntime` (only its target is used).
        tokens: prompt token ids; max_tokens: generated tokens at most (the prefill's token included).

    Returns:
        ``(generated ids, step_ms)``: ``step_ms[i]`` (ms) is the wall time that produced token
        ``i + 1`` (see the module docstring), ``len(step_ms) == len(generated) - 1``.

    Raises:
        TraceError: the contexts were recreated under the timer (cannot happen after
            ``ensure_context``; guards a change of ``generate_plain``).
    """
    from mtpscope.traces.run.mtp_runtime import Sampler

    rtm.ensure_context(len(tokens) + int(max_tokens) + 1)   # generate_plain would otherwise grow it
    real = rtm.tctx
    timed = _TimedContext(real)
    rtm.tctx = timed  # type: ignore[assignment]  # a stand-in with LlamaContext's decode / logits, timing each decode
    try:
        out = rtm.generate_plain(list(tokens), max_tokens=int(max_tokens), sampler=Sampler())
    finally:
        rtm.tctx = real
    n_gen = len(out) - 1
    n_prefill = len(timed.ends) - n_gen
    if n_gen < 0 or n_prefill < 1:
        raise TraceError("plain decoding was not timed (the target context changed under the timer)",
                         key="baseline", expected=f">= {n_gen + 1} decodes", actual=len(timed.ends))
    ends = timed.ends[n_prefill - 1:]
    return out, [(b - a) * 1e3 for a, b in zip(ends[:-1], ends[1:], strict=True)]


@dataclass(frozen=True)
class BaselineSummary:
    """What :func:`record_baseline` did: ``n_prompts``, ``n_rounds`` (= generation steps),
    ``n_generated`` (tokens, each prompt's first included), ``decode_seconds`` (sum of the steps'
    times), ``tokens_per_second`` (n_rounds / decode_seconds), ``seconds`` (wall time, prefill and
    writing included), ``outputs`` (generated ids per prompt)."""

    out: str
    n_prompts: int
    n_rounds: int
    n_generated: int
    decode_seconds: float
    tokens_per_second: float
    seconds: float
    outputs: tuple[tuple[int, ...], ...]


def record_baseline(config: RecordConfig, *, rtm: MtpRuntime, out: str | os.PathLike[str], prompts: Sequence[str | PromptSpec],
                    overwrite: bool = False, command: Sequence[str] | None = None,
                    on_prompt: Callable[[int, int], None] | None = None) -> BaselineSummary:
    """Plain-decode each prompt with the loaded target of ``rtm`` and write a baseline trace.

    Args:
        config: the run parameters (:class:`traces.run.record_config.RecordConfig`); plain greedy decoding
            uses ``max_tokens`` (tokens per prompt at most), ``chat`` (apply the target's chat template)
            and ``n_gpu_layers`` (as ``rtm`` was loaded, for the manifest's device), nothing else.
        rtm: a loaded :class:`traces.run.mtp_runtime.MtpRuntime`.
        out: the trace directory; prompts: prompt texts or :class:`traces.run.prompts.PromptSpec` (text,
            ``tokens`` or ``messages``, as ``record`` takes them; their id and category go to the
            manifest's prompt entries).
        overwrite: replace a trace already in ``out`` (its parts are deleted first).
        command: argv for the manifest (default ``sys.argv``).
        on_prompt: called with ``(prompt_id, generated tokens)`` after each prompt.

    Returns:
        :class:`BaselineSummary`.

    Raises:
        MtpscopeError: no prompts; TraceError: ``out`` holds a trace and not ``overwrite``; errors of the
            writer and the runtime.
    """
    from mtpscope.inspector.gguf import open_gguf
    from mtpscope.traces.run.llama.binding import runtime_info
    from mtpscope.traces.run.mtp_runtime import spec_tokens
    from mtpscope.traces.run.preflight import model_info
    from mtpscope.traces.store.writer import TraceWriter

    if not prompts:
        raise MtpscopeError("no prompts", key="prompts", expected=">= 1", actual=0)
    max_tokens, chat, n_gpu_layers = config.max_tokens, config.chat, config.n_gpu_layers
    t_start = time.perf_counter()
    specs = [p if isinstance(p, PromptSpec) else PromptSpec(text=p) for p in prompts]
    rendered = [spec_tokens(rtm.tmodel, sp, chat=chat) for sp in specs]
    toks = [tk for tk, _ in rendered]
    rtm.ensure_context(max(len(t) for t in toks) + int(max_tokens) + 1)
    with open_gguf(rtm.target_path) as f:
        target_info = model_info(f)
    manifest = {
        "source": "baseline",
        "command": list(command) if command is not None else list(sys.argv),
        "params": {"decoding": "plain", "n_draft": 0, "max_tokens": max_tokens, "temp": 0.0,
                   "greedy": True, "chat": chat, "n_gpu_layers": n_gpu_layers,
                   "n_threads": rtm.n_threads, "n_ctx": rtm.n_ctx, "hidden": "off"},
        "models": {"target": target_info, "assistant": None, "centroids": None},
        "runtime": runtime_info(n_gpu_layers),
        "prompts": [sp.manifest_entry(i, len(tk), text=None if sp.source == "text" else txt)
                    for i, (sp, (tk, txt)) in enumerate(zip(specs, rendered, strict=True))],
    }
    n_rounds = n_gen = 0
    decode_ms = 0.0
    outputs: list[tuple[int, ...]] = []
    with TraceWriter(Path(out), manifest, n_embd_backbone=None, n_embd=None, hidden_dtype=None,
                     centroids=False, flush_every=256, overwrite=overwrite) as w:
        for pid, tk in enumerate(toks):
            gen, step_ms = timed_plain(rtm, tk, max_tokens=max_tokens)
            for i, ms in enumerate(step_ms):
                nxt = int(gen[i + 1])
                w.add_round(RoundRecord(prompt_id=pid, round=i, pos=len(tk) + i, pending_token=int(gen[i]),
                                        n_draft=0, drafted=(), n_accepted=0, target=(nxt,), emitted=(nxt,),
                                        t_draft_ms=0.0, t_verify_ms=float(ms)))
            n_rounds += len(step_ms)
            n_gen += len(gen)
            decode_ms += sum(step_ms)
            outputs.append(tuple(int(x) for x in gen))
            if on_prompt is not None:
                on_prompt(pid, len(gen))
    secs = decode_ms / 1e3
    return BaselineSummary(out=os.fspath(out), n_prompts=len(toks), n_rounds=n_rounds, n_generated=n_gen,
                           decode_seconds=secs, tokens_per_second=n_rounds / secs if secs > 0 else 0.0,
                           seconds=time.perf_counter() - t_start, outputs=tuple(outputs))
