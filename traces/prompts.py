"""Reading a prompts file for :func:`traces.recorder.record` (``mtpscope record --prompts FILE``).

Formats: ``.jsonl`` (one JSON string, or an object with ``prompt`` or ``text``, per line) or any other
text file (one prompt per non-empty line); UTF-8 only.

Imports: mtpscope.errors only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mtpscope.errors import MtpscopeError


def read_prompts(path: str | os.PathLike[str]) -> list[str]:
    """Prompts from a ``.jsonl`` file (one JSON string, or object with ``prompt`` or ``text``, per line)
    or any other text file (one prompt per non-empty line).

    Raises:
        MtpscopeError: unreadable JSON line or an object without ``prompt`` / ``text`` (names the line);
            a file without prompts; bytes that are not UTF-8 (names the byte offset).
        FileNotFoundError: missing file.
    """
    p = Path(path)
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MtpscopeError(f"prompts file is not UTF-8 text ({e.reason} at byte {e.start})", path=p,
                            offset=e.start, expected="UTF-8", actual=f"byte 0x{raw[e.start]:02x}") from None
    prompts: list[str] = []
    if p.suffix.lower() == ".jsonl":
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError) as e:
                raise MtpscopeError(f"line {n} is not JSON: {e}", path=p, key=f"line {n}") from None
            if isinstance(obj, str):
                prompts.append(obj)
            elif isinstance(obj, dict) and isinstance(obj.get("prompt", obj.get("text")), str):
                prompts.append(obj.get("prompt", obj.get("text")))
            else:
                raise MtpscopeError(f"line {n} needs a JSON string or an object with a 'prompt' or 'text' string",
                                    path=p, key=f"line {n}", expected="string or {\"prompt\": ...}",
                                    actual=type(obj).__name__)
    else:
        prompts = [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise MtpscopeError("no prompts in file", path=p, expected=">= 1 prompt", actual=0)
    return prompts


__all__ = ["read_prompts"]
