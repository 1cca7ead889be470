"""The run parameters of one diagnosis: :class:`DiagnoseConfig` (validated once, in its constructor).

A :class:`DiagnoseConfig` is built where the parameters come in -- ``mtpscope diagnose``'s flags, the app's Diagnose
page, a benchmark or a test -- and goes unchanged to :func:`traces.diagnose.run.diagnose`, which checks none of
them again. It holds what the recording does (drafts per round, tokens per prompt, the centroid head: the
:class:`traces.run.record_config.RecordConfig` the recording runs with, ``recording``) and how much of the trace the
replays take (``replay``, ``replay_prompts``, ``rounds_per_prompt``). The files diagnosed (target, drafter, trace,
prompts, reference) are :func:`diagnose`'s own arguments.

Imports: mtpscope.errors, traces.run.record_config (``RecordConfig``, ``DEFAULT_N_DRAFT``: the one home of
``n_draft``'s default).
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass, field

from mtpscope.errors import TraceError
from mtpscope.traces.run.record_config import DEFAULT_N_DRAFT, RecordConfig

#: Tokens per prompt of the recording unless told otherwise (the demo's traces record 64; ``mtpscope diagnose
#: --max-tokens``'s default).
MAX_TOKENS = 64
#: The replayed sample unless told otherwise: up to this many prompts (taken in turn from each category,
#: :func:`traces.diagnose.variants.sample_prompts`), this many rounds of each.
N_PROMPTS, ROUNDS_PER_PROMPT = 8, 6


@dataclass(frozen=True)
class DiagnoseConfig:
    """The run parameters of ``diagnose`` (``mtpscope diagnose``'s flags; the defaults are the CLI's).

    Attributes:
        n_draft: the recording's drafts per round, 1..``MAX_N_DRAFT`` (default :data:`DEFAULT_N_DRAFT`); with a
            given trace, the n_draft assumed where its manifest names none.
        max_tokens: the recording's tokens per prompt, >= 1 (default :data:`MAX_TOKENS`).
        centroids: the drafter's centroid head for the recording (a sidecar or fork GGUF, or an HF folder; kept as
            a path string), or None: the trace then scores it beside the dense head and the replay adds the
            ``head=centroid`` variant.
        replay: run the replays (steps 5 and 6; they need llama.cpp and an output folder).
        replay_prompts / rounds_per_prompt: the replayed sample, each >= 1 (defaults :data:`N_PROMPTS`,
            :data:`ROUNDS_PER_PROMPT`).
        recording: derived, not an argument: the :class:`RecordConfig` the recording runs with (``n_draft``,
            ``max_tokens``, ``centroids``, plain decoding measured first: ``baseline=True``; everything else
            ``mtpscope record``'s defaults).

    Raises:
        TraceError: the first field that breaks its rule, naming it (``key``) with expected vs actual (a value of
            the wrong type too: ``replay_prompts="8"``; ``n_draft`` and ``max_tokens`` by
            :class:`RecordConfig`'s own rules).
    """

    n_draft: int = DEFAULT_N_DRAFT
    max_tokens: int = MAX_TOKENS
    centroids: str | None = None
    replay: bool = True
    replay_prompts: int = N_PROMPTS
    rounds_per_prompt: int = ROUNDS_PER_PROMPT
    recording: RecordConfig = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("replay_prompts", "rounds_per_prompt"):
            v = getattr(self, name)
            if not isinstance(v, numbers.Integral) or isinstance(v, bool):
                raise TraceError(f"{name} must be an integer", key=name, expected="int", actual=repr(v)[:60])
            if v < 1:
                raise TraceError(f"{name} must be >= 1", key=name, expected=">= 1", actual=v)
            object.__setattr__(self, name, int(v))
        if not isinstance(self.replay, (bool, numbers.Integral)) or int(self.replay) not in (0, 1):
            raise TraceError("replay must be true or false", key="replay", expected="bool",
                             actual=repr(self.replay)[:60])
        object.__setattr__(self, "replay", bool(self.replay))
        if self.centroids is not None and not isinstance(self.centroids, (str, os.PathLike)):
            raise TraceError("centroids must be a path or None", key="centroids", expected="path | None",
                             actual=repr(self.centroids)[:60])
        rec = RecordConfig(n_draft=self.n_draft, max_tokens=self.max_tokens, baseline=True, centroids=self.centroids)
        for name in ("n_draft", "max_tokens", "centroids"):     # as RecordConfig holds them (int, str)
            object.__setattr__(self, name, getattr(rec, name))
        object.__setattr__(self, "recording", rec)


__all__ = ["MAX_TOKENS", "N_PROMPTS", "ROUNDS_PER_PROMPT", "DiagnoseConfig"]
