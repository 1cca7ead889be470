"""What each generated token is: a small, deterministic classifier over what was written, prompt and output
together.

One job: give every position of a generated token sequence a **class** and, for chat output, the Gemma 4
template **channel** it is in, from the GGUF's own vocabulary (:class:`traces.analysis.vocab.Vocab`). Pure: no
I/O; the same ids (and prompt) give the same classes. The prompt is read as context only: a prompt that
opens code or JSON is continued by its output.

The text (prompt + output, token pieces joined; ``▁`` a space, byte tokens their byte) is cut into
*segments* at special tokens (a turn or channel token ends whatever was being written), each segment
into lines, and every line gets a **region** -- ``code``, ``json`` or ``text`` -- from its own look and
the region before it:

* a Markdown fence line (three or more backticks at the start) opens / closes a fenced block: ``code``,
  or ``json`` for a ``json`` / ``jsonl`` / ``json5`` fence (the fence lines are code);
* without fences, each line is read as (first that applies): ``json`` -- a lone bracket (``{``, ``[``,
  ``}``, ``],`` ...), an object opening with a key (``{"a":``), or a ``"key": value`` line; ``value``
  -- a lone JSON string, number or literal, with an optional comma; ``code`` -- a Python line: ``def`` /
  ``class`` headers, a compound statement ending in ``:`` (``if``, ``for``, ``while``, ``with``, ``try``,
  ``except``, ``else`` ...), ``return`` / ``yield`` / ``raise`` / ``import`` / ``from .. import`` /
  ``pass`` / ``break`` / ``continue`` / ``assert`` statements, an assignment (``name = ...``, ``a.b[i]
  += ...``), a statement that is a call (``name(...``), a decorator, a triple quote; ``repl`` -- an
  interactive-prompt line (``>>>``, ``...``: a doctest), code on its own without changing the region
  around it; ``comment`` -- a ``#`` line; ``text`` -- anything else;
* regions: ``text`` turns ``code`` at a code line and ``json`` at a json line; ``code`` stays code for
  every line that is indented, blank, a comment, JSON-like (a dict literal) or code, and while a triple-
  quoted string is open (docstrings are code), and turns ``text`` at an unindented text line; ``json``
  stays json for json and value lines and any line that starts like JSON (a quote, a bracket, a
  number, a literal), and turns text (or code) at a text (or code) line. A blank line belongs to the
  region before it when the next line continues that region, else to ``text``.

Inside ``text`` lines, an inline backtick span (backticks included) is code, and json: an inline JSON
object (``{"key": ...}`` up to its balancing brace) and a run of two or more ``"key": value`` pairs
(JSON written without its opening brace). Then each character of a text region is
``whitespace``, part of a **number** (digits with ``.`` / ``,`` groups, a sign before them, an exponent, a
``%`` after them; digits glued to letters, as in ``s30``, belong to the word), a **letter** (a word:
letters, digits in words, an apostrophe between letters) or **punctuation** (anything else).

Classes (:data:`CLASSES`) of a token, first rule that applies: ``special`` (GGUF token types control /
user-defined / unknown / unused: ``<bos>``, ``<|turn>``, ``<|channel>`` ...); ``unknown`` (an id outside
the vocabulary); ``code`` / ``json`` (any of its characters lies in a code / json region or span);
``prose`` (it has a letter); ``number`` (it has a number character); ``punctuation`` (any other
non-space character); ``whitespace``. So code and JSON are what the text *is* (every token of a Python
line is code, every token of a JSON document json, string values and numbers included), and numbers,
punctuation and prose are what ordinary text is made of.

Channels (:data:`CHANNELS`), from the template's own special tokens (matched by their piece text in the
vocabulary, so another id layout works too): ``<|channel>`` opens a named channel (Gemma 4's
``<|channel>thought``: ``thinking``), ``<channel|>`` closes it (``answer``); ``<|tool_call>`` ..
``<tool_call|>`` is ``tool_call``; ``<|tool_response>`` .. ``<tool_response|>`` is ``tool_response``.
A chat prompt rendered with the template's generation prompt ends inside the model's answer (the
template closes the empty thought channel when thinking is off), so chat output starts in ``answer``;
with thinking on, the model opens ``<|channel>`` itself. Opening / closing tokens belong to the channel
they open / close. Non-chat output is ``none`` until such a token appears.

Checked against a hand-labelled set of generated tokens (``tests/data/token_classes_labels.json``, how it
was labelled in its ``how`` field): ``tests/test_token_classes.py`` reports per-class precision and
recall. Speed: regular expressions per line and numpy per character; about a second per 300,000 tokens.
"""

from __future__ import annotations

import re
import unicodedata
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mtpscope.traces.analysis.vocab import TYPE_BYTE, TYPE_CONTROL, TYPE_UNKNOWN, TYPE_UNUSED, TYPE_USER_DEFINED, Vocab

CLASSES = ("prose", "code", "json", "number", "punctuation", "whitespace", "special", "unknown")
CHANNELS = ("none", "answer", "thinking", "tool_call", "tool_response")
C_PROSE, C_CODE, C_JSON, C_NUMBER, C_PUNCT, C_SPACE, C_SPECIAL, C_UNKNOWN = range(len(CLASSES))
CH_NONE, CH_ANSWER, CH_THINKING, CH_TOOL_CALL, CH_TOOL_RESPONSE = range(len(CHANNELS))

SPACE_MARK = "\u2581"
_BYTE_RE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_NUMBER_RE = re.compile(r"^[+-]?(\d+([.,]\d+)*[.,]?|[.,]\d+)([eE][+-]?\d+)?%?$")
_SPECIAL_TYPES = frozenset({TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED})

#: per-vocabulary cache of per-id facts (text, class, flags), shared by classifiers
_INFO: weakref.WeakKeyDictionary[Vocab, dict[str, _Facts]] = weakref.WeakKeyDictionary()

#: template tokens (piece text) -> the channel they switch to; None = "the channel named after it"
TEMPLATE_OPEN = {"<|channel>": CH_THINKING, "<|tool_call>": CH_TOOL_CALL, "<|tool_response>": CH_TOOL_RESPONSE,
                 "<|turn>": CH_ANSWER}
TEMPLATE_CLOSE = {"<channel|>": CH_ANSWER, "<tool_call|>": CH_ANSWER, "<tool_response|>": CH_ANSWER,
                  "<turn|>": None}


def piece_text(piece: str | None, token_type: int = 1) -> str:
    """The text a raw vocabulary piece stands for: ``▁`` -> space, a byte token ``<0xNN>`` -> that byte
    (bytes >= 0x80, parts of a multi-byte character, -> U+FFFD), anything else unchanged."""
    if piece is None:
        return ""
    m = _BYTE_RE.match(piece) if (token_type == TYPE_BYTE or piece.startswith("<0x")) else None
    if m:
        b = int(m.group(1), 16)
        return chr(b) if b < 0x80 else "\ufffd"
    return piece.replace(SPACE_MARK, " ")


def text_class(text: str) -> int:
    """A token's class from its own text alone (no context): a code into :data:`CLASSES`
    (``whitespace``, ``number``, ``punctuation`` or ``prose``)."""
    if not text or text.isspace():
        return C_SPACE if text else C_PROSE
    s = text.strip()
    if s.isalpha():
        return C_PROSE
    if _NUMBER_RE.match(s):
        return C_NUMBER
    if all(unicodedata.category(c)[0] in "PS" for c in s):
        return C_PUNCT
    return C_PROSE


@dataclass(frozen=True)
class TokenClasses:
    """Classes and channels of one token sequence.

    Attributes:
        classes: ``int8[n]`` codes into :data:`CLASSES` (numpy ``shape (n,)``).
        channels: ``int8[n]`` codes into :data:`CHANNELS`.
    """

    classes: np.ndarray
    channels: np.ndarray

    def class_names(self) -> list[str]:
        """The classes as names."""
        return [CLASSES[c] for c in self.classes]

    def channel_names(self) -> list[str]:
        """The channels as names."""
        return [CHANNELS[c] for c in self.channels]


# ------------------------------------------------------------------------------------------ lines

R_TEXT, R_CODE, R_JSON = 0, 1, 2
K_BLANK, K_TEXT, K_CODE, K_JSON, K_VALUE, K_COMMENT, K_FENCE, K_REPL = range(8)

_FENCE_RE = re.compile(r"^\s*(`{3,})\s*([A-Za-z0-9_+.-]*)")
_JSON_RE = re.compile(r'^(?:[\[{]\s*$|[\]}]\s*,?\s*$|\[\s*\{|\{\s*"(?:[^"\\]|\\.)*"\s*:|'
                      r'"(?:[^"\\]|\\.)*"\s*:\s*(?:["\[{\d-]|true\b|false\b|null\b|$))')
_VALUE_RE = re.compile(r'^(?:"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null)\s*,?\s*$')
_CODE_RES = tuple(re.compile(x) for x in (
    r"^(?:async\s+)?(?:def|class)\s+[A-Za-z_]\w*\s*[(:]",
    r"^(?:if|elif|while|for|with|except|async\s+for|async\s+with)\b.*:\s*(?:#.*)?$",
    r"^(?:else|try|finally|except)\s*:",
    r"^(?:return|yield)\b(?:\s*$|\s+(?![a-z]+\s+[a-z]+\s+[a-z]+\b))",
    r"^raise\b(?:\s*$|\s+[A-Za-z_][\w.]*\s*(?:\(|$))",
    r"^(?:import\s+[A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_][\w.]*)*(?:\s+as\s+\w+)?\s*$|from\s+[\w.]+\s+import\b)",
    r"^(?:pass|break|continue)\s*(?:#.*)?$",
    r"^(?:assert|del|global|nonlocal)\s+[A-Za-z_(]",
    r"^@[A-Za-z_][\w.]*",
    r"^[A-Za-z_][\w.]*(?:\[[^\]]*\])?(?:\s*,\s*[A-Za-z_][\w.]*)*\s*(?:[-+*/%&|^@]|//|\*\*|<<|>>)?=(?!=)",
    r"^[A-Za-z_][\w.]*\(",
    r"^[rbuf]{0,2}(?:\"\"\"|\'\'\')",
))
#: an interactive-prompt line (a doctest, a REPL session): code on its own, the region around it unchanged
_REPL_RE = re.compile(r"^(?:>>>|\.\.\.)(?:\s|$)")
#: a run of two or more ``"key": value`` pairs inside a text line: JSON without its opening brace
_PAIRS_RE = re.compile(r'"(?:[^"\\\n]|\\.)*"\s*:\s*(?:"(?:[^"\\\n]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null)'
                       r'(?:\s*,\s*"(?:[^"\\\n]|\\.)*"\s*:\s*(?:"(?:[^"\\\n]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null|[\[{]))+'
                       r'\s*,?')
#: in a JSON region, a line that starts like JSON (a string, a bracket, a number, a literal) stays JSON
_JSONISH_START_RE = re.compile(r'^(?:"|[\[\]{}]|-?\d|true\b|false\b|null\b)')
_TRIPLE_RE = re.compile(r"\"\"\"|\'\'\'")
_INLINE_JSON_RE = re.compile(r'\{\s*"(?:[^"\\]|\\.)*"\s*:')
_NUMBER_SPAN_RE = re.compile(r"(?<![\w.])[-+]?\d+(?:[.,]\d+)*(?:[eE][-+]?\d+)?%?(?![A-Za-z_])")
_JSON_FENCES = frozenset({"json", "jsonl", "json5"})


def _fence_tag(line: str) -> str:
    """The language tag of a fence line (``K_FENCE``: :data:`_FENCE_RE` matches it); ``""`` when none."""
    m = _FENCE_RE.match(line.strip())
    if m is None:
        raise ValueError(f"not a fence line: {line!r}")
    return m.group(2)


def line_kind(line: str) -> int:
    """What one line looks like on its own (module docstring): ``K_BLANK``, ``K_JSON``, ``K_VALUE``,
    ``K_CODE``, ``K_COMMENT``, ``K_FENCE``, ``K_REPL`` or ``K_TEXT``."""
    s = line.strip()
    if not s:
        return K_BLANK
    if _FENCE_RE.match(s):
        return K_FENCE
    if _JSON_RE.match(s):
        return K_JSON
    if _VALUE_RE.match(s):
        return K_VALUE
    if s.startswith("#"):
        return K_COMMENT
    if _REPL_RE.match(s):
        return K_REPL
    if any(r.match(s) for r in _CODE_RES):
        return K_CODE
    return K_TEXT


def line_regions(lines: Sequence[str]) -> list[int]:
    """The region (``R_TEXT``, ``R_CODE``, ``R_JSON``) of each line of one segment (module docstring)."""
    kinds = [line_kind(x) for x in lines]
    out = [R_TEXT] * len(lines)
    region = R_TEXT
    fence: str | None = None
    triple: str | None = None          # an open triple-quoted string in code: its quote
    blanks: list[int] = []
    for i, (line, kind) in enumerate(zip(lines, kinds, strict=True)):
        if fence is not None:
            if kind == K_FENCE and not _fence_tag(line):
                out[i], fence, region = R_CODE, None, R_TEXT
            else:
                out[i] = R_JSON if fence in _JSON_FENCES else R_CODE
            continue
        if kind == K_FENCE:
            fence = _fence_tag(line).lower()
            out[i] = R_CODE
            for j in blanks:
                out[j] = R_TEXT
            blanks = []
            continue
        if triple is not None:
            out[i] = R_CODE
            triple = _triple_after(line, triple)
            continue
        if kind == K_BLANK:
            blanks.append(i)
            continue
        indented = line[:1] in (" ", "\t")
        if kind == K_REPL and region != R_CODE:      # a doctest line: code, the region goes on around it
            for j in blanks:
                out[j] = R_TEXT
            blanks = []
            out[i] = R_CODE
            continue
        if region == R_CODE:
            new = R_TEXT if (kind == K_TEXT and not indented) else R_CODE
        elif region == R_JSON:
            if kind in (K_JSON, K_VALUE, K_BLANK) or _JSONISH_START_RE.match(line.strip()):
                new = R_JSON
            else:
                new = R_CODE if kind == K_CODE else R_TEXT
        else:
            new = R_CODE if kind == K_CODE else (R_JSON if kind == K_JSON else R_TEXT)
        for j in blanks:                 # blank lines inside a region belong to it
            out[j] = region if new == region else R_TEXT
        blanks = []
        region = out[i] = new
        if region == R_CODE:
            triple = _triple_after(line, None)
    for j in blanks:
        out[j] = region if region != R_TEXT else R_TEXT
    return out


def _triple_after(line: str, open_quote: str | None) -> str | None:
    """The triple quote still open after ``line`` (``open_quote``: the one open before it)."""
    for m in _TRIPLE_RE.finditer(line):
        q = m.group(0)
        if open_quote is None:
            open_quote = q
        elif q == open_quote:
            open_quote = None
    return open_quote


C_REGION_CODE, C_REGION_JSON, C_NUM, C_LETTER, C_PUNCT_CH, C_SPACE_CH = 1, 2, 3, 4, 5, 6


def char_classes(text: str) -> np.ndarray:
    """``int8[len(text)]``: per character of one segment, its region (code / json) or, in text, number,
    letter, punctuation or space (module docstring)."""
    n = len(text)
    out = np.zeros(n, dtype=np.int8)
    if not n:
        return out
    lines = text.splitlines(keepends=True)
    regions = line_regions(lines)
    cp = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    space = np.isin(cp, np.frombuffer(" \t\n\r\x0b\x0c".encode("utf-32-le"), dtype=np.uint32))
    ascii_letter = ((cp >= 65) & (cp <= 90)) | ((cp >= 97) & (cp <= 122))
    digit = (cp >= 48) & (cp <= 57)
    hi = cp >= 128
    letter = ascii_letter.copy()
    if hi.any():                                   # other scripts: one lookup per distinct character
        uniq, inv = np.unique(cp[hi], return_inverse=True)
        chars = [chr(c) for c in uniq.tolist()]
        letter[hi] = np.array([c.isalpha() for c in chars], dtype=bool)[inv]
        space[hi] |= np.array([c.isspace() for c in chars], dtype=bool)[inv]
    out[:] = C_PUNCT_CH
    out[letter | digit] = C_LETTER
    # an apostrophe between letters is part of the word
    ap = (cp == 39) | (cp == 0x2019)
    if ap.any():
        mid = np.zeros(n, bool)
        mid[1:-1] = ap[1:-1] & letter[:-2] & letter[2:]
        out[mid] = C_LETTER
    for m in _NUMBER_SPAN_RE.finditer(text):
        out[m.start():m.end()] = C_NUM
    out[space] = C_SPACE_CH
    pos = 0
    for line, reg in zip(lines, regions, strict=True):
        end = pos + len(line)
        if reg == R_CODE:
            out[pos:end] = C_REGION_CODE
        elif reg == R_JSON:
            out[pos:end] = C_REGION_JSON
        else:
            _inline_spans(line, out, pos)
        pos = end
    return out


def _inline_spans(line: str, out: np.ndarray, base: int) -> None:
    """Mark inline backtick code spans and inline JSON objects of one text line."""
    if "`" in line:
        for m in re.finditer(r"(`{1,2})[^`\n]+?\1", line):
            out[base + m.start():base + m.end()] = C_REGION_CODE
    if "{" in line:
        for m in _INLINE_JSON_RE.finditer(line):
            end = _balanced_end(line, m.start())
            if end is not None:
                sl = out[base + m.start():base + end]
                sl[sl != C_REGION_CODE] = C_REGION_JSON
    if '":' in line:
        for m in _PAIRS_RE.finditer(line):
            end = m.end()
            if line[end - 1] in "[{":                 # the last value opens a bracket: up to its close
                end = _balanced_end(line, end - 1) or end
            sl = out[base + m.start():base + end]
            sl[sl != C_REGION_CODE] = C_REGION_JSON


def _balanced_end(line: str, start: int) -> int | None:
    """End (exclusive) of the bracketed JSON value at ``start`` on this line, or the line's end when it is
    still open there (an object continued on the next lines); None when a bracket mismatches."""
    stack: list[str] = []
    in_str = esc = False
    for i in range(start, len(line)):
        ch = line[i]
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"':
            in_str = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]":
            if not stack or stack.pop() != ch:
                return None
            if not stack:
                return i + 1
    return len(line.rstrip("\n"))


class _Facts:
    """Per-id facts over a vocabulary (+1 slot for ids outside it), filled as ids are met: text, its
    length, special, the channel a template token opens (-1 none) or closes to (-1 none, -2 ends the turn
    without changing it)."""

    def __init__(self, n: int) -> None:
        self.known = np.zeros(n + 1, dtype=bool)
        self.known[n] = True
        self.text: list[str] = [""] * (n + 1)
        self.length = np.zeros(n + 1, dtype=np.int64)
        self.special = np.zeros(n + 1, dtype=bool)
        self.unknown = np.zeros(n + 1, dtype=bool)
        self.unknown[n] = True
        self.opens = np.full(n + 1, -1, dtype=np.int8)
        self.closes = np.full(n + 1, -1, dtype=np.int8)


class Classifier:
    """Classes and channels of token sequences over one vocabulary (see the module docstring).

    Args:
        vocab: the GGUF's vocabulary.
        chat: the prompts were rendered with the chat template (output starts in ``answer``).
    """

    def __init__(self, vocab: Vocab, *, chat: bool = False) -> None:
        self.vocab = vocab
        self.chat = bool(chat)
        # per-id facts do not depend on the context: shared by every classifier of this vocabulary
        self._cache: dict[str, _Facts] = _INFO.setdefault(vocab, {})

    def _facts(self, ids: np.ndarray) -> _Facts:
        """The facts, filled for every id of ``ids`` (already mapped into ``[0, n_vocab]``)."""
        f = self._cache.get("facts")
        if f is None:
            f = self._cache["facts"] = _Facts(self.vocab.n_vocab)
        seen = np.zeros(len(f.known), dtype=bool)
        seen[ids] = True
        new = np.flatnonzero(seen & ~f.known)
        if len(new) > 4096:
            self.vocab.decode_all()      # one bulk decode beats many single reads
        for tid in new.tolist():
            piece = self.vocab.piece(tid)
            if piece is None:
                f.unknown[tid] = True
                continue
            ttype = self.vocab.token_type(tid)
            special = ttype in _SPECIAL_TYPES or (self.vocab.types is None and (
                piece in TEMPLATE_OPEN or piece in TEMPLATE_CLOSE))
            text = "" if special else piece_text(piece, ttype)
            f.text[tid], f.length[tid], f.special[tid] = text, len(text), special
            if (special or piece in TEMPLATE_OPEN) and piece in TEMPLATE_OPEN:
                f.opens[tid] = TEMPLATE_OPEN[piece]
            if piece in TEMPLATE_CLOSE:
                close = TEMPLATE_CLOSE[piece]
                f.closes[tid] = close if close is not None else -2
        f.known[new] = True
        return f

    def classify(self, ids: Sequence[int] | np.ndarray, prefix: Sequence[int] | np.ndarray | str = ()) -> TokenClasses:
        """Classes and channels of ``ids`` (one generated sequence, in order).

        Args:
            ids: token ids, ``shape (n,)``.
            prefix: the prompt, read for context only: its token ids, or its text.

        Returns:
            :class:`TokenClasses` with ``n`` entries.
        """
        nv = self.vocab.n_vocab
        out_ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        n = len(out_ids)
        text_prefix = prefix if isinstance(prefix, str) else ""
        pre_ids = np.zeros(0, np.int64) if isinstance(prefix, str) else np.asarray(prefix, dtype=np.int64).reshape(-1)
        seq = np.concatenate([pre_ids, out_ids])
        seq = np.where((seq >= 0) & (seq < nv), seq, nv)          # outside the vocabulary: the last slot
        f = self._facts(seq)
        off = len(pre_ids)
        classes = np.full(n, C_PROSE, dtype=np.int8)
        start_ch = CH_ANSWER if self.chat else CH_NONE
        channels = np.full(n, start_ch, dtype=np.int8)
        # channels: a walk over the template tokens only, the runs between them filled at once
        marks = np.flatnonzero((f.opens[seq] >= 0) | (f.closes[seq] != -1))
        ch, prev = start_ch, 0
        full = np.empty(len(seq), dtype=np.int8)
        for i in marks.tolist():
            full[prev:i] = ch
            t = seq[i]
            if f.closes[t] != -1:
                full[i] = ch
                if f.closes[t] >= 0:
                    ch = int(f.closes[t])
            else:
                ch = int(f.opens[t])
                full[i] = ch
            prev = i + 1
        full[prev:] = ch
        channels[:] = full[off:]
        # classes: per segment between special (or unknown) tokens; a text prefix is one more segment head
        stops = np.flatnonzero(f.special[seq] | f.unknown[seq])
        bounds = [-1, *stops.tolist(), len(seq)]
        for a_, b_ in zip(bounds[:-1], bounds[1:]):
            lo, hi = a_ + 1, b_
            head = text_prefix if lo == 0 else ""
            if hi > lo or head:
                self._segment(f, seq[lo:hi], head, lo, off, classes)
        if len(stops):
            so = stops[stops >= off]
            classes[so - off] = np.where(f.unknown[seq[so]], C_UNKNOWN, C_SPECIAL)
        return TokenClasses(classes, channels)

    @staticmethod
    def _segment(f: _Facts, seg: np.ndarray, head: str, lo: int, off: int, classes: np.ndarray) -> None:
        """Classes of the tokens ``seg`` (sequence positions ``lo..``; ``head``: text before them, context only)."""
        if lo + len(seg) <= off:                 # wholly inside the prompt: nothing to label
            return
        texts = f.text
        text = head + "".join([texts[t] for t in seg.tolist()])
        if not text:
            return
        cc = char_classes(text)
        lens = f.length[seg]
        starts = len(head) + np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
        ok = lens > 0

        def any_of(code: int) -> np.ndarray:
            out = np.zeros(len(lens), dtype=bool)
            if ok.any():
                flag = (cc == code).astype(np.int64)
                out[ok] = np.add.reduceat(flag, starts[ok]) > 0
            return out

        code, js, let, num, pun = (any_of(c) for c in (C_REGION_CODE, C_REGION_JSON, C_LETTER, C_NUM, C_PUNCT_CH))
        cls = np.select([code, js, let, num, pun, ok], [C_CODE, C_JSON, C_PROSE, C_NUMBER, C_PUNCT, C_SPACE], C_PROSE)
        a = max(lo, off)
        classes[a - off:lo + len(seg) - off] = cls[a - lo:].astype(np.int8)


def classify_ids(vocab: Vocab, ids: Sequence[int], *, chat: bool = False, prefix: Sequence[int] = ()) -> list[str]:
    """Convenience: the class names of one sequence (``Classifier(vocab, chat=chat).classify``)."""
    return Classifier(vocab, chat=chat).classify(ids, prefix).class_names()
