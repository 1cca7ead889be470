"""A trace's vocabulary: token pieces and token types, read lazily from a GGUF's own tokenizer.

One job: give the analysis (:mod:`traces.analysis.token_classes`, :mod:`traces.analysis.explain`) the raw pieces of the
ids it meets, without decoding the 262144-entry ``tokenizer.ggml.tokens`` array whole. The pieces stay
in the memory-mapped GGUF; a piece is decoded when it is first asked for and cached.

Token types are the GGUF's ``tokenizer.ggml.token_type`` values (llama.cpp's ``llama_token_type``):
1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.

Imports: mtpscope.inspector.gguf (the reader), mtpscope.errors.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mtpscope.errors import LayoutError, MtpscopeError, TraceError

if TYPE_CHECKING:
    from mtpscope.inspector.gguf import GGUFFile

TOKENS_KEY = "tokenizer.ggml.tokens"
TYPES_KEY = "tokenizer.ggml.token_type"

TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = 1, 2, 3, 4, 5, 6


class Vocab:
    """Token id -> raw piece and token type.

    Args:
        pieces: anything with ``len()`` and integer ``[i]`` giving the raw piece (``str`` or ``bytes``):
            the reader's ``ArrayValue`` for ``tokenizer.ggml.tokens`` or a plain list.
        types: ``int32[n_vocab]`` token types (numpy ``shape (n_vocab,)``), or None (all normal).
        source: where it came from (a path), for messages.
        keep: an object to keep alive as long as this vocabulary (the open GGUF file).

    Raises:
        TraceError: ``types`` of another length than ``pieces``.
    """

    def __init__(self, pieces: Any, types: np.ndarray | Sequence[int] | None = None, source: str = "",
                 keep: Any = None) -> None:
        self._pieces = pieces
        self.n_vocab = int(len(pieces))
        self.types = None if types is None else np.asarray(types, dtype=np.int32).reshape(-1)
        if self.types is not None and len(self.types) != self.n_vocab:
            raise TraceError("token types and tokens differ in length", key=TYPES_KEY,
                             expected=self.n_vocab, actual=len(self.types))
        self._types_list = None if self.types is None else self.types.tolist()
        self.source = source
        self._keep = keep
        self._cache: dict[int, str] = {}

    def piece(self, token_id: int) -> str | None:
        """The raw piece of ``token_id`` (``▁the``, ``<0x0A>``, ``<|channel>``); None out of range."""
        tid = int(token_id)
        hit = self._cache.get(tid)
        if hit is not None:
            return hit
        if not 0 <= tid < self.n_vocab:
            return None
        v = self._pieces[tid]
        s = v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)
        self._cache[tid] = s
        return s

    def decode_all(self) -> None:
        """Decode every piece now (one bulk read, about 0.2 s for 262144 tokens); later :meth:`piece`
        calls are dictionary look-ups. Worth it when a large share of the vocabulary will be asked for."""
        if len(self._cache) >= self.n_vocab:
            return
        bulk = self._pieces.to_list() if hasattr(self._pieces, "to_list") else list(self._pieces)
        self._cache = {i: (v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v))
                       for i, v in enumerate(bulk)}

    def token_type(self, token_id: int) -> int:
        """The token type of ``token_id`` (1 normal when the vocabulary has no types); 2 out of range."""
        tid = int(token_id)
        if not 0 <= tid < self.n_vocab:
            return TYPE_UNKNOWN
        return TYPE_NORMAL if self._types_list is None else self._types_list[tid]

    def find(self, piece: str) -> int | None:
        """The id of the first token whose raw piece equals ``piece`` (scans the vocabulary once per
        call; used for a handful of template tokens), None when absent."""
        for i in range(self.n_vocab):
            if self.piece(i) == piece:
                return i
        return None

    def __len__(self) -> int:
        return self.n_vocab


def load_vocab(path: str | os.PathLike[str], *, like: GGUFFile | None = None) -> Vocab:
    """The vocabulary of a GGUF (model or vocab-only file), pieces memory-mapped and read lazily; ``like``: an open
    GGUF whose token list this file probably repeats, compared instead of walked (``open_gguf``'s ``like``).

    Raises:
        LayoutError: the file has no ``tokenizer.ggml.tokens``.
        GGUFFormatError / UnsupportedFileError: not a readable GGUF.
        FileNotFoundError: no such file.
    """
    from mtpscope.inspector.gguf import open_gguf

    f = open_gguf(path, like=like)
    toks = f.get(TOKENS_KEY)
    if toks is None:
        f.close()
        raise LayoutError("GGUF has no token list", path=path, key=TOKENS_KEY, expected="present",
                          actual="missing")
    types = f.get(TYPES_KEY)
    tarr = types.to_numpy() if types is not None and hasattr(types, "to_numpy") else None
    return Vocab(toks, tarr, source=os.fspath(path), keep=f)


def trace_vocab(manifest: dict[str, Any], override: str | os.PathLike[str] | None = None) -> Vocab | None:
    """The vocabulary a trace's tokens come from: ``override`` when given, else the recorded target's
    GGUF (``manifest["models"]["target"]["path"]``), else the assistant's; None when neither file is
    there (imports, synthetic traces, a trace moved to another machine).

    Raises:
        LayoutError / GGUFFormatError: ``override`` is not a GGUF with a token list (a recorded path that
            cannot be read is skipped, not an error).
    """
    if override is not None:
        return load_vocab(override)
    models = manifest.get("models") or {}
    for role in ("target", "assistant"):
        entry = models.get(role)
        p = entry.get("path") if isinstance(entry, dict) else None
        if isinstance(p, str) and Path(p).is_file():
            try:
                return load_vocab(p)
            except (MtpscopeError, OSError, ValueError):  # a recorded model that no longer reads
                continue
    return None
