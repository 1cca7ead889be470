"""The corpus as tokens: llama.cpp's own tokenizer on a vocab-only load of ``ggml-vocab-gemma-4.gguf``
(:func:`open_tokenizer`, a :class:`~mtpscope.traces.run.llama.model.LlamaVocab`); BOS + each document + EOS
(special tokens parsed only in the chat part) packed into one stream (:class:`TokenStream`); the ``random``
category's documents (words drawn at random from the stream's frequent word tokens), inserted between the
others at seeded places.

Imports: numpy, mtpscope.errors, mtpscope.cache (``vocab_path``, lazily), mtpscope.demo.corpus, inspector
(``gguf``, lazily), traces (``run.llama.model``), :mod:`.recipe`, :mod:`.compact`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mtpscope.demo import corpus as demo_corpus
from mtpscope.demo.train.compact import CompactVocab
from mtpscope.demo.train.recipe import BOS, EOS
from mtpscope.errors import MtpscopeError
from mtpscope.traces.run.llama.model import LlamaVocab


def open_tokenizer(path: str | os.PathLike[str] | None = None) -> LlamaVocab:
    """llama.cpp's tokenizer on a vocab-only load of ``path`` (default: the cached
    ``ggml-vocab-gemma-4.gguf``, the real Gemma 4 tokenizer). Close it when done (it is a context manager).

    Raises:
        RuntimeUnavailableError: llama-cpp-python missing.
        TraceError: llama.cpp could not load the vocabulary.
    """
    if path is None:
        from mtpscope.cache import vocab_path

        path = vocab_path()
    return LlamaVocab(path)


def chat_template(vocab_gguf: str | os.PathLike[str]) -> str:
    """``tokenizer.chat_template`` of the tokenizer GGUF.

    Raises:
        MtpscopeError: the file has no chat template.
    """
    from mtpscope.inspector.gguf import open_gguf

    with open_gguf(vocab_gguf) as f:
        t = f.get("tokenizer.chat_template")
    if isinstance(t, str) and t:
        return t
    raise MtpscopeError("the tokenizer GGUF has no chat template", path=vocab_gguf, key="tokenizer.chat_template")


@dataclass(frozen=True, eq=False)
class TokenStream:
    """The tokenized corpus: ``ids`` np.int32[n] (real ids), ``category`` np.int8[n] (index into
    :data:`mtpscope.demo.corpus.CATEGORIES`), ``n_docs``."""

    ids: np.ndarray
    category: np.ndarray
    n_docs: int

    def counts(self) -> dict[str, int]:
        """Tokens per category."""
        c = np.bincount(self.category, minlength=len(demo_corpus.CATEGORIES))
        return {name: int(c[i]) for i, name in enumerate(demo_corpus.CATEGORIES) if c[i]}


def tokenize_corpus(docs: Sequence[demo_corpus.Document], tok: LlamaVocab) -> TokenStream:
    """BOS + tokens of each document + EOS, concatenated (chat documents start with their own ``<bos>``).
    The EOS teaches the target to end a finished document (an end-of-generation token) rather than run on."""
    ids: list[np.ndarray] = []
    cats: list[np.ndarray] = []
    for d in docs:
        chat = d.category == "chat"
        x = tok.tokenize(d.text, add_special=False, parse_special=chat)
        if not chat or not x or x[0] != BOS:
            x = [BOS, *x]
        a = np.asarray([*x, EOS], dtype=np.int32)
        ids.append(a)
        cats.append(np.full(len(a), demo_corpus.CATEGORIES.index(d.category), dtype=np.int8))
    return TokenStream(np.concatenate(ids), np.concatenate(cats), len(docs))


def random_word_pool(stream: TokenStream, vocab: CompactVocab, tok: LlamaVocab, n: int,
                     rng: np.random.Generator, n_candidates: int = 1000) -> np.ndarray:
    """``n`` word tokens (a leading space and letters, at least 3 bytes) drawn from the ``n_candidates``
    most frequent ones of the stream: the vocabulary of the ``random`` documents and prompts."""
    u, c = np.unique(stream.ids, return_counts=True)
    order = u[np.argsort(-c, kind="stable")]
    found: list[int] = []
    for t in order:
        p = tok.token_to_piece(int(t))
        if len(p) >= 3 and p[:1] == b" " and p[1:].isalpha() and p[1:].isascii():
            found.append(int(t))
            if len(found) >= n_candidates:
                break
    cands = np.asarray(found, dtype=np.int32)
    cands = cands[np.isin(cands, vocab.ids)]
    return np.sort(rng.choice(cands, min(n, len(cands)), replace=False))


def random_documents(pool: np.ndarray, n_docs: int, n_words: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``n_docs`` documents of ``n_words`` words drawn uniformly from ``pool`` (BOS, words, EOS): text
    without any rule, which the target could only learn by heart (with the recipe's copies it does not:
    docs/DEMO.md)."""
    return [np.concatenate([[BOS], rng.choice(pool, n_words), [EOS]]).astype(np.int32) for _ in range(n_docs)]


def add_random_documents(stream: TokenStream, docs: Sequence[np.ndarray], rng: np.random.Generator,
                         copies: int = 1) -> TokenStream:
    """Insert ``copies`` copies of each of ``docs`` (:func:`random_documents`, category ``random``) between
    the stream's documents at seeded places. With the recipe's 8 copies the target does *not* learn them
    by heart: cut from one, it continues with a word or two of the document and then other words of the
    pool, without a loop, unsure at almost every position (docs/DEMO.md); the drafter cannot follow
    either: the demo's unpredictable category, where both models are unsure ("hard", not "wrong")."""
    docs = [d for d in docs for _ in range(copies)]
    starts = np.flatnonzero(stream.ids == BOS)
    parts_ids = np.split(stream.ids, starts[1:])
    parts_cat = np.split(stream.category, starts[1:])
    rnd_cat = demo_corpus.CATEGORIES.index("random")
    extra = [(int(rng.integers(0, len(parts_ids) + 1)), d) for d in docs]
    for at, doc in sorted(extra, key=lambda e: -e[0]):
        parts_ids.insert(at, doc)
        parts_cat.insert(at, np.full(len(doc), rnd_cat, dtype=np.int8))
    return TokenStream(np.concatenate(parts_ids), np.concatenate(parts_cat), stream.n_docs + len(extra))
