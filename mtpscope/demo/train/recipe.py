"""The demo pair's training recipe: the target's and the drafter's shapes (:class:`TargetShape`,
:class:`DrafterShape`), every number a training run depends on (:class:`Recipe`, recorded in
``recipe.json``), and the Gemma 4 token ids the pipeline uses by number.

Imports: mtpscope.demo.corpus (the default corpus budget).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mtpscope.demo import corpus as demo_corpus
from mtpscope.inspector.layouts import GEMMA4_N_VOCAB
from mtpscope.traces.run.record_config import DEFAULT_N_DRAFT

#: the real Gemma 4 vocabulary: rows of the full-vocabulary models
N_VOCAB = GEMMA4_N_VOCAB
BOS, EOS, PAD = 2, 1, 0
#: special tokens always in the compact vocabulary (pad, eos, bos, unk, mask, the chat turn markers)
SPECIAL_IDS = (0, 1, 2, 3, 4, 105, 106)


@dataclass(frozen=True)
class TargetShape:
    """The target's hyperparameters (an E-series Gemma 4 scaled down).

    ``pattern``: one letter per layer, ``s`` sliding / ``f`` full attention. K = V on full layers
    (``attention_k_eq_v``), proportional RoPE (25 % of the full layers' pairs rotate), soft-cap 30.
    """

    n_embd: int = 128
    pattern: str = "ssfssf"
    n_head: int = 4
    n_head_kv: int = 2          # sliding layers
    n_head_kv_full: int = 1     # full layers (num_global_key_value_heads, with k_eq_v)
    head_dim: int = 32          # sliding layers
    head_dim_full: int = 64
    n_ff: int = 512
    sliding_window: int = 128
    softcap: float = 30.0
    n_ctx: int = 2048


@dataclass(frozen=True)
class DrafterShape:
    """The drafter's hyperparameters: 4 layers ``[s, s, s, f]`` reading the target's K/V (so its head
    dims and KV head counts are the target's), dense tied LM head plus a centroid head."""

    n_embd: int = 64
    n_head: int = 4
    n_ff: int = 256
    n_centroids: int = 2048
    top_k: int = 32


@dataclass(frozen=True)
class Recipe:
    """Everything a training run depends on besides the interpreter's own files and the tokenizer.

    Steps count optimizer updates; ``*_batch`` is windows of ``seq_len`` tokens per update.
    """

    seed: int = 0
    target: TargetShape = field(default_factory=TargetShape)
    drafter: DrafterShape = field(default_factory=DrafterShape)
    seq_len: int = 256
    budget: dict[str, int] = field(default_factory=lambda: dict(demo_corpus.DEFAULT_BUDGET))
    target_steps: int = 450
    target_batch: int = 16
    target_lr: float = 3e-3
    drafter_steps: int = 400
    drafter_batch: int = 8
    drafter_lr: float = 3e-3
    n_draft: int = DEFAULT_N_DRAFT
    centroid_steps: int = 300
    min_count: int = 2
    random_docs: int = 6
    random_words: int = 160
    random_copies: int = 8
    random_pool: int = 128
    prompt_candidates: int = 30
    prompts_per_category: int = 6
    threads: int = 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (recorded in ``recipe.json``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Recipe:
        """Inverse of :meth:`to_dict` (unknown keys are an error)."""
        d = dict(d)
        t = TargetShape(**d.pop("target", {}))
        dr = DrafterShape(**d.pop("drafter", {}))
        return cls(target=t, drafter=dr, **d)
