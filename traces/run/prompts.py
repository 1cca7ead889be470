"""Reading a prompts file for :func:`traces.run.recorder.record` (``mtpscope record --prompts FILE``): what one
prompt is. UTF-8 only (a leading byte-order mark, as some editors write, is not part of the first prompt).

``.jsonl``: one JSON value per non-empty line, either a string (the prompt text) or an object with

* exactly one prompt source: ``prompt`` or ``text`` (a string), ``tokens`` (a list of token ids, fed as
  they are: no BOS added, no template; checked against the vocabulary when the model is loaded,
  :func:`check_tokens`), or ``messages`` (a chat: a non-empty list of ``{"role": str, "content": str}``,
  rendered with the GGUF's own chat template and its generation prompt);
* optionally ``id`` (a string or integer, unique in the file; kept in the trace, used by ``explain
  --prompt`` and ``compare``) and ``category`` (free text: acceptance and what-if per category; another
  field holds it with ``category_field``, ``--category-field NAME``);
* any other field: kept as it is in the manifest's prompt entry under ``extra``.

When no prompt has a category but all carry a field that looks like one (``domain``, ``type``, ``task``
...: :data:`mtpscope.traces.analysis.wording.CATEGORY_LIKE_FIELDS`), :func:`category_note` says so in
one line (``record`` and ``sweep`` print it).

``.json`` is refused (a JSON array or object of prompts is not one of these forms: the line says to write
one per line as ``.jsonl``). Any other file: one prompt text per non-empty line. A bad line is one
:class:`MtpscopeError` naming the file, the line number and the field (``key`` = ``"line N: field"``).

Imports: mtpscope.errors, traces.analysis.wording (standard library only).
"""

from __future__ import annotations

import codecs
import json
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtpscope.errors import MtpscopeError
from mtpscope.traces.analysis.wording import category_field_note, category_like_fields

SOURCES = ("prompt", "text", "tokens", "messages")
#: the field a prompt's category is read from unless ``category_field`` names another
CATEGORY_FIELD = "category"
KNOWN = (*SOURCES, "id", CATEGORY_FIELD)


@dataclass(frozen=True)
class PromptSpec:
    """One prompt.

    Attributes:
        text: the prompt text (``prompt`` / ``text`` field, or a plain line), else None.
        tokens: exact token ids, else None.
        messages: the chat, ``({"role", "content"}, ...)``, else None.
        id: the prompt's id (a string), or None.
        category: its category, or None.
        extra: the line's other fields.
        path / line: where it came from (None for prompts given in code).
    """

    text: str | None = None
    tokens: tuple[int, ...] | None = None
    messages: tuple[dict[str, str], ...] | None = None
    id: str | None = None
    category: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    path: str | None = None
    line: int | None = None

    @property
    def source(self) -> str:
        """``"text"``, ``"tokens"`` or ``"messages"``."""
        return "tokens" if self.tokens is not None else ("messages" if self.messages is not None else "text")

    def manifest_entry(self, prompt_id: int, n_prompt_tokens: int, text: str | None = None) -> dict[str, Any]:
        """The manifest's prompt entry: ``prompt_id``, ``text`` (``text`` overrides: the detokenized ids or the
        rendered chat), ``n_prompt_tokens``, and when set ``id``, ``category``, ``source``, ``tokens``,
        ``messages``, ``extra``."""
        e: dict[str, Any] = {"prompt_id": int(prompt_id), "text": text if text is not None else self.text,
                             "n_prompt_tokens": int(n_prompt_tokens)}
        if self.id is not None:
            e["id"] = self.id
        if self.category is not None:
            e["category"] = self.category
        if self.source != "text":
            e["source"] = self.source
        if self.tokens is not None:
            e["tokens"] = list(self.tokens)
        if self.messages is not None:
            e["messages"] = [dict(m) for m in self.messages]
        if self.extra:
            e["extra"] = dict(self.extra)
        return e

    def where(self, fld: str) -> dict[str, Any]:
        """``path`` / ``key`` for an error about field ``fld`` of this prompt."""
        key = fld if self.line is None else f"line {self.line}: {fld}"
        return {"path": self.path, "key": key}


def _fail(p: Path, n: int, fld: str, message: str, expected: Any = None, actual: Any = None) -> MtpscopeError:
    # (the key names the line: the message does not repeat it)
    return MtpscopeError(message, path=p, key=f"line {n}: {fld}", expected=expected, actual=actual)


def _short(v: Any) -> str:
    s = json.dumps(v) if not isinstance(v, str) else repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _spec(obj: Any, p: Path, n: int, category_field: str = CATEGORY_FIELD) -> PromptSpec:
    if isinstance(obj, str):
        return PromptSpec(text=obj, path=os.fspath(p), line=n)
    if not isinstance(obj, dict):
        raise _fail(p, n, "prompt", "needs a JSON string or an object with 'prompt', 'text', 'tokens' or 'messages'",
                    expected="string or object", actual=type(obj).__name__)
    given = [k for k in SOURCES if k in obj]
    if len(given) != 1:
        raise _fail(p, n, "/".join(given) if given else "prompt",
                    "give exactly one of 'prompt', 'text', 'tokens', 'messages'", expected="one of them",
                    actual=", ".join(given) if given else "none")
    src = given[0]
    v = obj[src]
    text = tokens = messages = None
    if src in ("prompt", "text"):
        if not isinstance(v, str):
            raise _fail(p, n, src, "must be a string", expected="string", actual=type(v).__name__)
        text = v
    elif src == "tokens":
        if not isinstance(v, list) or not v:
            raise _fail(p, n, "tokens", "must be a non-empty list of token ids", expected="[int, ...]",
                        actual=_short(v))
        for i, t in enumerate(v):
            if not isinstance(t, int) or isinstance(t, bool) or t < 0:
                raise _fail(p, n, f"tokens[{i}]", "must be a non-negative integer token id", expected="int >= 0",
                            actual=_short(t))
        tokens = tuple(int(t) for t in v)
    else:
        if not isinstance(v, list) or not v:
            raise _fail(p, n, "messages", "must be a non-empty list of {\"role\", \"content\"} objects",
                        expected="[{role, content}, ...]", actual=_short(v))
        out = []
        for i, m in enumerate(v):
            if not isinstance(m, dict):
                raise _fail(p, n, f"messages[{i}]", "must be an object", expected="{role, content}",
                            actual=type(m).__name__)
            for k in ("role", "content"):
                if not isinstance(m.get(k), str):
                    raise _fail(p, n, f"messages[{i}].{k}", "must be a string", expected="string",
                                actual=_short(m.get(k)) if k in m else "missing")
            out.append(dict(m))
        messages = tuple(out)
    pid = obj.get("id")
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, (str, int)) or pid == ""):
        raise _fail(p, n, "id", "must be a non-empty string or an integer", expected="string or int",
                    actual=_short(pid))
    cat = obj.get(category_field)
    if isinstance(cat, (int, float)) and not isinstance(cat, bool) and category_field != CATEGORY_FIELD:
        cat = str(cat)                  # another tool's numeric label (``"task": 3``) names a category too
    if cat is not None and (not isinstance(cat, str) or not cat):
        raise _fail(p, n, category_field, "must be a non-empty string", expected="string", actual=_short(cat))
    known = (*SOURCES, "id", category_field)
    extra = {k: v for k, v in obj.items() if k not in known}
    return PromptSpec(text=text, tokens=tokens, messages=messages, id=None if pid is None else str(pid),
                      category=cat, extra=extra, path=os.fspath(p), line=n)


def read_prompt_specs(path: str | os.PathLike[str], *, category_field: str = CATEGORY_FIELD) -> list[PromptSpec]:
    """The prompts of a prompts file (module docstring).

    Args:
        path: the prompts file.
        category_field: the ``.jsonl`` field that holds each prompt's category (default ``category``;
            a string, or a number taken as its text); with another name, a ``category`` field is kept
            under ``extra`` like any other field.

    Raises:
        MtpscopeError: a ``.json`` file; a line that is not JSON, has no / several prompt sources, a field of the wrong
            type, a repeated ``id`` (each names the file, the line and the field); a file without
            prompts; bytes that are not UTF-8 (names the byte offset); a path that is not a regular
            file (a FIFO, a directory, a device: checked before it is opened).
        FileNotFoundError: missing file.
    """
    p = Path(path)
    st = p.stat()
    if p.suffix.lower() == ".json":   # (read as text lines, a JSON array would be one prompt: its whole text)
        raise MtpscopeError("a .json prompts file: write one prompt per line as JSON lines (.jsonl: a string or an "
                            "object each) or as plain text lines", path=p, expected=".jsonl, or text lines",
                            actual=".json")
    if not stat.S_ISREG(st.st_mode):  # checked before opening: reading a FIFO would block forever
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device")
        raise MtpscopeError("prompts file is not a regular file", path=p, expected="a regular file", actual=kind)
    raw = p.read_bytes()
    bom = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0   # (an editor's byte-order mark: not text)
    try:
        text = raw[bom:].decode("utf-8")
    except UnicodeDecodeError as e:
        at = e.start + bom
        raise MtpscopeError(f"prompts file is not UTF-8 text ({e.reason} at byte {at})", path=p,
                            offset=at, expected="UTF-8", actual=f"byte 0x{raw[at]:02x}") from None
    specs: list[PromptSpec] = []
    if p.suffix.lower() == ".jsonl":
        seen: dict[str, int] = {}
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise _fail(p, n, "json", f"is not JSON ({e.msg}; column {e.colno})",
                            expected="one JSON value: a string or an object", actual=_short(line.strip())) from None
            except (ValueError, RecursionError):
                raise _fail(p, n, "json", "is not JSON (nested too deeply)",
                            expected="one JSON value: a string or an object", actual=_short(line.strip())) from None
            s = _spec(obj, p, n, category_field)
            if s.id is not None:
                if s.id in seen:
                    raise _fail(p, n, "id", f"repeats the id of line {seen[s.id]}", expected="a unique id",
                                actual=_short(s.id))
                seen[s.id] = n
            specs.append(s)
    else:
        specs = [PromptSpec(text=line, path=os.fspath(p), line=n)
                 for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not specs:
        raise MtpscopeError("no prompts in file", path=p, expected=">= 1 prompt", actual=0)
    return specs


def prompt_specs(prompts: Sequence[str | PromptSpec] | None, prompt: str | None,
                 prompts_file: str | os.PathLike[str] | None) -> list[PromptSpec]:
    """A recording's prompts from exactly one of three sources (:func:`traces.run.recorder.record`'s): texts or
    :class:`PromptSpec` objects, one text, or a prompts file (:func:`read_prompt_specs`).

    Raises:
        MtpscopeError: not exactly one source, no prompts, a bad prompts file.
    """
    given = [x is not None for x in (prompts, prompt, prompts_file)]
    if sum(given) != 1:
        raise MtpscopeError("give exactly one of prompts, prompt, prompts_file", key="prompts",
                            expected="one source", actual=sum(given))
    if prompts is not None:
        specs = [p if isinstance(p, PromptSpec) else PromptSpec(text=p) for p in prompts]
    elif prompt is not None:
        specs = [PromptSpec(text=prompt)]
    else:
        specs = read_prompt_specs(prompts_file)  # type: ignore[arg-type]  # exactly one source is given (checked above): this one
    if not specs:
        raise MtpscopeError("no prompts", key="prompts", expected=">= 1", actual=0)
    return specs


def category_note(specs: list[PromptSpec], option: str = "--category-field") -> str | None:
    """One line when no prompt has a category but every prompt carries a field that looks like one
    (:func:`mtpscope.traces.analysis.wording.category_field_note`), else None."""
    if not specs or any(s.category is not None for s in specs):
        return None
    return category_field_note(category_like_fields(s.extra.keys() for s in specs), option)


def check_tokens(spec: PromptSpec, n_vocab: int) -> None:
    """Refuse token ids outside the model's vocabulary ``[0, n_vocab)``.

    Raises:
        MtpscopeError: naming the file, the line and ``tokens[i]``.
    """
    if spec.tokens is None:
        return
    for i, t in enumerate(spec.tokens):
        if not 0 <= t < n_vocab:
            raise MtpscopeError("token id outside the model's vocabulary", **spec.where(f"tokens[{i}]"),
                                expected=f"0..{n_vocab - 1}", actual=t)


def read_prompts(path: str | os.PathLike[str]) -> list[str]:
    """The prompt texts of a prompts file whose prompts are all texts (:func:`read_prompt_specs` for
    ``tokens`` / ``messages`` prompts and the other fields).

    Raises:
        MtpscopeError: as :func:`read_prompt_specs`; a ``tokens`` / ``messages`` line (names it).
        FileNotFoundError: missing file.
    """
    out = []
    for s in read_prompt_specs(path):
        if s.text is None:
            raise MtpscopeError(f"a {s.source} prompt has no text", **s.where(s.source),
                                expected="a text prompt", actual=s.source)
        out.append(s.text)
    return out


__all__ = ["CATEGORY_FIELD", "PromptSpec", "category_note", "check_tokens", "prompt_specs", "read_prompt_specs", "read_prompts"]
