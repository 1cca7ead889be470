"""The real Gemma 4 tokenizer, read once from ``ggml-vocab-gemma-4.gguf``, for the demo writers.

The demo models carry the **real** tokenizer: every ``tokenizer.*`` key of the real tokenizer GGUF,
copied verbatim (``vocab="full"``: 262144 tokens, 514906 merges), or a consistent subset for fast
tests (``vocab="subset"``: the first ``n`` real tokens with their scores and types, and only the
merges whose two parts and whose result all lie inside that set; llama.cpp loads and runs such a
file, see ``docs/reference/gemma4-assistant-facts.md`` section 5).

The file is read by the project's GGUF reader and the copying logic lives in the inspector
(:mod:`mtpscope.inspector.tokenizer`, shared with ``mtpscope convert``); this module adds the demo's
view of it (:class:`DemoVocab`: token texts and ids).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

from mtpscope.errors import LayoutError
from mtpscope.inspector.gguf_write import MetaValue
from mtpscope.inspector.layouts import GEMMA4_N_VOCAB
from mtpscope.inspector.tokenizer import TOKENS, subset_kv, tokenizer_kv

N_VOCAB_FULL = GEMMA4_N_VOCAB  # the whole real tokenizer
N_VOCAB_SUBSET = 4096


@dataclass(frozen=True, eq=False)
class DemoVocab:
    """A tokenizer to embed in demo models.

    Attributes:
        kind: ``"full"`` or ``"subset"``.
        n_vocab: number of tokens (262144 for the full vocabulary).
        tokens: token texts as raw bytes (SentencePiece style, ``"▁"`` marks a space), index = id.
        kv: ``tokenizer.*`` keys in the real file's order, each a :class:`MetaValue`.
        source: the tokenizer GGUF they were read from.
    """

    kind: str
    n_vocab: int
    tokens: tuple[bytes, ...]
    kv: tuple[tuple[str, MetaValue], ...]
    source: Path
    _ids: dict[bytes, int] = field(default_factory=dict, compare=False, repr=False, hash=False)

    def token_id(self, text: str) -> int | None:
        """Id of the token whose text is exactly ``text`` (e.g. ``"▁the"``), or None."""
        if not self._ids:
            self._ids.update({t: i for i, t in enumerate(self.tokens)})
        return self._ids.get(text.encode("utf-8"))


@functools.lru_cache(maxsize=4)
def load_vocab(kind: str = "full", n_subset: int = N_VOCAB_SUBSET, path: str | None = None) -> DemoVocab:
    """The real Gemma 4 tokenizer (``kind="full"``) or its first-``n_subset``-tokens subset.

    Args:
        kind: ``"full"`` (262144 tokens) or ``"subset"``.
        n_subset: size of the subset (only for ``kind="subset"``).
        path: tokenizer GGUF; default :func:`mtpscope.cache.vocab_path` (fetched once, sha256-pinned).

    Raises:
        ValueError: unknown ``kind`` or ``n_subset`` outside 16..262144.
        LayoutError: the tokenizer file lacks ``tokenizer.ggml.tokens``.
    """
    if kind not in ("full", "subset"):
        raise ValueError(f"vocab kind must be 'full' or 'subset', got {kind!r}")
    if path is None:
        from mtpscope.cache import vocab_path
        src = vocab_path()
    else:
        src = Path(path)
    kv = tokenizer_kv(src)
    kvd = dict(kv)
    if TOKENS not in kvd:
        raise LayoutError("tokenizer GGUF has no token list", path=src, key=TOKENS)
    if kind == "subset":
        kv = subset_kv(kv, n_subset, src)
    tokens: list[bytes] = dict(kv)[TOKENS].value
    return DemoVocab(kind=kind, n_vocab=len(tokens), tokens=tuple(tokens), kv=tuple(kv), source=Path(src))


__all__ = ["N_VOCAB_FULL", "N_VOCAB_SUBSET", "DemoVocab", "load_vocab"]
