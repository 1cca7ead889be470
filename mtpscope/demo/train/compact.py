"""The compact vocabulary the models are trained over (:class:`CompactVocab`): the ids the token stream
uses at least ``min_count`` times (plus the special tokens the demo needs) each get a row, and the rarer
ids seen share one row. The full model has 262,144 rows: the kept rows, a copy of the shared row for every
rare id, and zero rows for the unused ids, so each unused id gets logit exactly 0 (``tanh(0) = 0`` under
the soft-cap too). The loss accounts for both with fixed logit offsets (``log(n_rare)`` on the shared row,
one more logit ``log(n_unused)``: :func:`compact_cross_entropy`), which makes the compact softmax equal
to the full one; :func:`full_argmax` is the full model's greedy choice seen from compact logits.

Imports: numpy, torch, mtpscope.errors, :mod:`.recipe`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from mtpscope.demo.train.recipe import N_VOCAB, SPECIAL_IDS
from mtpscope.errors import MtpscopeError


@dataclass(frozen=True, eq=False)
class CompactVocab:
    """The rows the models are trained over, and how they map to the 262,144 real ids.

    Attributes:
        ids: np.int32[n_kept], sorted real ids with a row of their own (row i is ``ids[i]``).
        rare: np.int32[n_rare], sorted real ids seen fewer than ``min_count`` times; they share one
            row, ``n_kept`` (in the full model each of them carries a copy of it).
        n_vocab: the full vocabulary (262,144).

    Every other id is *unused*: a zero row in the full model, logit exactly 0. Row ``n_rows`` is the
    label of "an unused id" in :func:`compact_cross_entropy`.
    """

    ids: np.ndarray
    rare: np.ndarray
    n_vocab: int = N_VOCAB

    @property
    def n_kept(self) -> int:
        return len(self.ids)

    @property
    def n_rows(self) -> int:
        """Rows of the compact models: the kept ids and the shared rare row."""
        return len(self.ids) + 1

    @property
    def n_unused(self) -> int:
        return self.n_vocab - len(self.ids) - len(self.rare)

    def rows(self, real: np.ndarray | Sequence[int], *, unused: int | None = None) -> np.ndarray:
        """Real ids -> compact rows (np.int64; rare ids -> ``n_kept``).

        Args:
            unused: the row to give unused ids; None raises instead.

        Raises:
            MtpscopeError: an unused id and ``unused`` is None.
        """
        real = np.asarray(real, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.ids, real), len(self.ids) - 1)
        kept = self.ids[pos] == real
        rpos = np.minimum(np.searchsorted(self.rare, real), max(len(self.rare) - 1, 0))
        is_rare = (self.rare[rpos] == real) if len(self.rare) else np.zeros(real.shape, bool)
        out = np.where(kept, pos, np.where(is_rare, self.n_kept, -1))
        if (out < 0).any():
            if unused is None:
                raise MtpscopeError("token id outside the compact vocabulary", key="ids",
                                    actual=int(real[out < 0].reshape(-1)[0]))
            out = np.where(out < 0, unused, out)
        return out.astype(np.int64)

    def real(self, row: int) -> int:
        """The real id the full model's greedy choice lands on for a compact row: kept -> its id, the rare
        row -> the lowest rare id (ties go to the first index, as in torch and llama.cpp), ``n_rows`` ->
        the lowest unused id."""
        if row < self.n_kept:
            return int(self.ids[row])
        if row == self.n_kept and len(self.rare):
            return int(self.rare[0])
        used = np.union1d(self.ids, self.rare)
        free = np.setdiff1d(np.arange(min(self.n_vocab, len(used) + 1)), used)
        return int(free[0])

    def log_offsets(self) -> torch.Tensor:
        """Per-row log multiplicity added to the logits in the loss: 0 for kept rows, ``log(n_rare)``
        for the shared rare row."""
        off = torch.zeros(self.n_rows)
        off[-1] = math.log(len(self.rare)) if len(self.rare) else -1e30
        return off


def compact_vocab(stream_ids: np.ndarray, *, min_count: int = 5, keep: Iterable[int] = SPECIAL_IDS) -> CompactVocab:
    """The compact vocabulary of a token stream: ids seen at least ``min_count`` times (and ``keep``)
    get a row; the other ids seen share the rare row."""
    u, n = np.unique(stream_ids, return_counts=True)
    kept = np.union1d(u[n >= min_count], np.asarray(list(keep), dtype=np.int64)).astype(np.int32)
    rare = np.setdiff1d(u, kept).astype(np.int32)
    return CompactVocab(kept, rare)


def compact_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, vocab: CompactVocab,
                          reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of the full-vocabulary model computed on compact logits.

    The full model's softmax over 262,144 ids equals a softmax over the compact rows with the rare
    row's logit raised by ``log(n_rare)`` (its copies) and one more logit ``log(n_unused)`` (the unused
    ids' zero logits); the loss of a rare label is that of "one of the rare ids".

    Args:
        logits: [N, n_rows] (after any soft-cap).
        labels: [N] compact rows, ``n_kept`` for a rare id, ``n_rows`` for an unused id.
        vocab: the compact vocabulary.
    """
    off = vocab.log_offsets().to(logits.dtype)
    bucket = logits.new_full((logits.shape[0], 1), math.log(vocab.n_unused) if vocab.n_unused else -1e30)
    return F.cross_entropy(torch.cat([logits + off, bucket], dim=1), labels, reduction=reduction)


def full_argmax(logits: torch.Tensor) -> torch.Tensor:
    """The full model's greedy choice seen from compact logits [..., n_rows]: the compact argmax (the
    rare row standing for its lowest id), or ``n_rows`` (an unused id, logit 0) when every compact
    logit is below 0."""
    best, arg = logits.max(dim=-1)
    return torch.where(best < 0, torch.full_like(arg, logits.shape[-1]), arg)
