"""Readable token text from a GGUF's own vocabulary (pure: no Streamlit).

Gemma's SentencePiece-style vocabulary writes a space as ``▁`` (U+2581) and keeps newlines and tabs
as raw characters; byte-fallback tokens look like ``<0x0A>``. :func:`readable` turns a raw piece into
text a person can read in a table or a hover box (spaces as spaces, control characters as visible
marks). :class:`TokenText` decodes ids lazily from the reader's ``tokenizer.ggml.tokens`` array, so a
262144-entry vocabulary is never decoded whole.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from mtpscope.traces.analysis.wording import VISIBLE

SPACE_MARK = "\u2581"  # ▁
#: How a space shows in a token's label (U+2423 OPEN BOX): a whitespace token is never blank.
VISIBLE_SPACE = "\u2423"  # ␣
_BYTE_RE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_CONTROL = VISIBLE      # (the command line's marks too: one home, traces.analysis.wording)


def readable(piece: str) -> str:
    """Raw vocabulary piece → display text.

    ``▁`` becomes a space; ``\\n``, ``\\t``, ``\\r`` become ``↵``, ``⇥``, ``␍``; a byte-fallback token
    ``<0xNN>`` becomes the character it stands for when printable ASCII (``<0x0A>`` → ``↵``),
    else it is kept as written. Other control characters are shown as ``\\xNN``.
    """
    m = _BYTE_RE.match(piece)
    if m:
        b = int(m.group(1), 16)
        ch = chr(b)
        if ch in _CONTROL:
            return _CONTROL[ch]
        if 0x20 <= b < 0x7F:
            return ch
        return piece
    out = piece.replace(SPACE_MARK, " ")
    for raw, mark in _CONTROL.items():
        out = out.replace(raw, mark)
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in out):
        out = "".join(f"\\x{ord(c):02x}" if ord(c) < 0x20 or ord(c) == 0x7F else c for c in out)
    return out


def visible(text: str) -> str:
    """Display text of one token with its whitespace shown: every space as ``␣`` (:data:`VISIBLE_SPACE`); a
    newline, tab or carriage return is already ``↵``, ``⇥``, ``␍`` (:func:`readable`). The one rule for a
    token shown on its own (a table cell, an axis label, a hover box); running text keeps its spaces."""
    return text.replace(" ", VISIBLE_SPACE)


def quoted(text: str) -> str:
    """Display text in typographic quotes so leading and trailing spaces stay visible."""
    return f"“{text}”"


class TokenText:
    """Lazy id → readable text lookup over a vocabulary array.

    Args:
        tokens: anything with ``len()`` and integer ``[i]`` returning the raw piece (the reader's
            ``ArrayValue`` for ``tokenizer.ggml.tokens``, or a plain list). ``None`` means no
            vocabulary: ids are shown as ``#id``.
        source: where the vocabulary came from (shown in the UI).
    """

    def __init__(self, tokens: Any | None, source: str = "") -> None:
        self._tokens = tokens
        self.source = source
        self._n = len(tokens) if tokens is not None else 0
        self._cache: dict[int, str] = {}

    @property
    def n_vocab(self) -> int:
        """Number of entries in the vocabulary (0 without one)."""
        return self._n

    def raw(self, token_id: int) -> str | None:
        """The raw piece for ``token_id``, or None when out of range / no vocabulary."""
        if self._tokens is None or token_id is None or not 0 <= int(token_id) < self._n:
            return None
        v = self._tokens[int(token_id)]
        if isinstance(v, bytes):
            v = v.decode("utf-8", errors="replace")
        return str(v)

    def text(self, token_id: int | None) -> str:
        """Readable text of one id: ``readable(piece)``, ``#id`` without a vocabulary or out of
        range, ``∅`` for None / negative (unknown)."""
        if token_id is None:
            return "∅"
        try:
            tid = int(token_id)
        except (TypeError, ValueError):
            return "∅"
        if tid < 0:
            return "∅"
        hit = self._cache.get(tid)
        if hit is not None:
            return hit
        piece = self.raw(tid)
        out = f"#{tid}" if piece is None else readable(piece)
        if len(self._cache) < 300_000:  # the whole 262144-token vocabulary fits
            self._cache[tid] = out
        return out

    def label(self, token_id: int | None) -> str:
        """``“text”`` with quotes and its whitespace visible (:func:`visible`: ``“␣the”``, ``“↵”``), for hover
        boxes, tables and axis labels."""
        t = self.text(token_id)
        if t == "∅" or token_id is None or (t.startswith("#") and self.raw(int(token_id)) is None):
            return t
        return quoted(visible(t))

    def __call__(self, token_id: int | None) -> str:
        """Same as :meth:`label` (so a decoder can be passed where a callable is expected)."""
        return self.label(token_id)

    def join(self, ids: Iterable[int | None] | None, sep: str = " · ") -> str:
        """Readable labels of a sequence of ids, separated by ``sep`` (empty string for None)."""
        if ids is None:
            return ""
        return sep.join(self.label(i) for i in ids)

    def find(self, query: str, limit: int = 50, scan_limit: int | None = None) -> list[int]:
        """Ids whose readable text equals ``query`` first, then contains it (case-sensitive), up
        to ``limit``. Scans at most ``scan_limit`` entries (default: the whole vocabulary; each
        entry is decoded once and cached)."""
        if not query or self._tokens is None:
            return []
        n = self._n if scan_limit is None else min(self._n, scan_limit)
        exact: list[int] = []
        part: list[int] = []
        for i in range(n):
            t = self.text(i)
            if t == query:
                exact.append(i)
            elif query in t and len(part) < limit:
                part.append(i)
        return (exact + part)[:limit]

