"""What ``record --runtime mlx`` and ``--runtime hf`` share: a runtime that runs Hugging Face checkpoint folders
on token prompts, written as a trace of the same schema as a llama.cpp recording (docs/TRACE_FORMAT.md,
docs/RUNTIMES.md). One job: the checks of the inputs, the manifest's model entries, the write loop and its
summary; each runtime module (:mod:`traces.run.mlx_record`, :mod:`traces.run.hf_record`) builds its runtime,
its manifest and its rounds.

Rounds and steps go through the same records as the llama.cpp recorder (:mod:`traces.run.step_analysis`):
per round the pending token, its position, the drafts, the number accepted, the emitted tokens and the
target's token at every verify row; per step ``h``, ``h_next``, ``h_inner``, the drafter's dense top-k and,
with the assistant's centroid head, the centroid columns.

Imports: mtpscope.errors, inspector.centroids, traces.run.mtp_runtime (types), traces.run.prompts,
traces.run.record_config, traces.run.step_analysis, traces.store.writer (lazily).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtpscope.errors import TraceError
from mtpscope.inspector.centroids import CentroidHead
from mtpscope.traces.analysis import rates
from mtpscope.traces.run.prompts import PromptSpec
from mtpscope.traces.run.record_config import RecordConfig
from mtpscope.traces.run.step_analysis import round_record, step_records

if TYPE_CHECKING:
    from mtpscope.traces.run.mtp_runtime import RoundResult


@dataclass(frozen=True)
class CheckpointRecordSummary:
    """What a checkpoint runtime's recording wrote.

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
        """n_accepted / n_drafted (:func:`traces.analysis.rates.acceptance_rate`), None with no drafts."""
        return rates.acceptance_rate(self.n_accepted, self.n_drafted)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the fields and ``acceptance_rate``."""
        d = asdict(self)
        d["outputs"] = [list(o) for o in self.outputs]
        d["acceptance_rate"] = self.acceptance_rate
        return d


def model_entry(path: str | os.PathLike[str], architecture: str, dialect: str = "hf") -> dict[str, Any]:
    """The manifest's ``models`` entry of a checkpoint folder (its safetensors' total size; no GGUF header hash)."""
    p = Path(path)
    size = sum(f.stat().st_size for f in p.glob("*.safetensors")) if p.is_dir() else None
    return {"path": str(p), "size": size, "architecture": architecture, "dialect": dialect, "header_sha256": None}


def check_inputs(runtime: str, prompts: Sequence[PromptSpec], out: str | os.PathLike[str], *, overwrite: bool) -> None:
    """The checks every checkpoint runtime makes before loading anything.

    Raises:
        TraceError: no prompts, a prompt without token ids (names its file, line and key), ``out`` already a
            trace without ``overwrite``.
    """
    if not prompts:
        raise TraceError("no prompts", key="prompts", expected="at least one", actual=0)
    for sp in prompts:
        if sp.tokens is None:
            raise TraceError(f"the {runtime} runtime takes token prompts (the HF checkpoints carry no tokenizer)",
                             path=sp.path, key=sp.where("tokens")["key"], expected="a 'tokens' list",
                             actual=sp.source)
    o = Path(out)
    if (o / "manifest.json").exists() and not overwrite:
        raise TraceError("output folder already holds a trace", path=str(o), expected="a new folder or --overwrite",
                         actual="manifest.json present")


def centroid_head(kind: str, assistant: str | os.PathLike[str], config: RecordConfig) -> CentroidHead | None:
    """The assistant's centroid head for the trace's centroid columns (``kind`` the runtime's head), or None
    (a dense head, or no hidden states kept)."""
    if kind != "centroid" or config.hidden == "off":
        return None
    return CentroidHead.from_hf(assistant).ready(config.centroid_top_k)


def head_manifest(head: CentroidHead | None) -> dict[str, Any] | None:
    """The manifest's ``centroids`` object of the head (None without one)."""
    if head is None:
        return None
    return {"n_centroids": head.n_centroids, "top_k": head.top_k, "source": head.source, "kind": head.kind}


def write_rounds(config: RecordConfig, *, out: str | os.PathLike[str], manifest: dict[str, Any], n_embd_backbone: int,
                 n_embd: int, head: CentroidHead | None, prompts: Sequence[PromptSpec],
                 rounds: Callable[[int, PromptSpec, bool], Iterable[RoundResult]], overwrite: bool = False,
                 on_round: Callable[[int, Any], None] | None = None) -> CheckpointRecordSummary:
    """Write the trace: for each prompt, every round ``rounds(prompt_id, spec, trace)`` yields (``trace``: keep
    per-step data, False with ``hidden="off"``), as the llama.cpp recorder writes its rounds.

    Args:
        config: ``n_top``, ``hidden``, ``flush_every``, ``compact`` are used.
        manifest: the trace's manifest (without the writer's own keys).
        on_round: called with ``(prompt_id, RoundResult)`` after each written round.

    Raises:
        TraceError: as :class:`traces.store.writer.TraceWriter` and the runtime.
    """
    from mtpscope.traces.store.writer import TraceWriter

    hidden = None if config.hidden == "off" else config.hidden
    outputs: list[tuple[int, ...]] = []
    n_rounds = n_steps = n_drafted = n_accepted = 0
    t0 = time.perf_counter()
    with TraceWriter(Path(out), manifest, n_embd_backbone=n_embd_backbone, n_embd=n_embd, hidden_dtype=hidden,
                     centroids=head is not None, flush_every=config.flush_every, compact=config.compact,
                     overwrite=overwrite) as w:
        for pid, sp in enumerate(prompts):
            gen: list[int] = []
            for res in rounds(pid, sp, hidden is not None):
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
    return CheckpointRecordSummary(out=str(out), n_prompts=len(prompts), n_rounds=n_rounds, n_steps=n_steps,
                                   n_drafted=n_drafted, n_accepted=n_accepted, outputs=tuple(outputs),
                                   seconds=time.perf_counter() - t0)


__all__ = ["CheckpointRecordSummary", "centroid_head", "check_inputs", "head_manifest", "model_entry", "write_rounds"]
