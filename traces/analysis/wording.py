"""Words for people, shared by the CLI and the app so both say the same thing: counts with the right
plural (``1 round``, ``2 rounds``), a prompt named by its text (``prompt 3 “Every sailor sings…”``), a token's
text on one line (:func:`visible`) and the prompts' texts read from a trace manifest. Pure (standard library only).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: Nouns whose plural is not the noun + "s".
IRREGULAR = {"mismatch": "mismatches", "entry": "entries", "quantity": "quantities", "was": "were",
             "this": "these", "has": "have", "is": "are", "does": "do"}

#: Characters of prompt text shown in a label by default (selectboxes, axes, table cells).
PROMPT_LABEL_CHARS = 40
#: how a token's text shows the characters that would break a line of terminal output
VISIBLE = {"\n": "↵", "\t": "⇥", "\r": "␍"}


def visible(text: str) -> str:
    """``text`` with newlines, tabs and carriage returns as visible marks (:data:`VISIBLE`): a token's text on
    one line of output."""
    return "".join(VISIBLE.get(c, c) for c in text)


def plural_word(n: int, word: str, many: str | None = None) -> str:
    """``word`` for a count of one (and minus one), else its plural (``many``, :data:`IRREGULAR`, or
    ``word + "s"``)."""
    if abs(int(n)) == 1:
        return word
    return many or IRREGULAR.get(word) or word + "s"


def plural(n: int, word: str, many: str | None = None) -> str:
    """A count and its noun: ``plural(1, "round") == "1 round"``, ``plural(12000, "round") ==
    "12,000 rounds"`` (thousands separated by commas, as the app shows counts)."""
    return f"{int(n):,} {plural_word(n, word, many)}"


def shorten(text: str, width: int = PROMPT_LABEL_CHARS) -> str:
    """``text`` on one line (runs of whitespace, newlines included, collapsed to one space), cut to at
    most ``width`` characters with ``…`` at the end when cut."""
    one = " ".join(str(text).split())
    if len(one) <= width:
        return one
    return one[:max(1, width - 1)].rstrip() + "…"


def shorten_path(path: str, width: int) -> str:
    """``path`` in at most ``width`` characters, keeping its file name: whole folders are dropped from the front
    and ``…`` stands where they were (``…/demo/trained/target.gguf``); a file name longer than ``width`` keeps
    its end (``…rget.gguf``). Never a cut that reads as another real path."""
    p = str(path)
    if len(p) <= width:
        return p
    parts = p.split("/")
    kept = parts[-1]
    if len(kept) + 2 > width:
        return "…" + kept[len(kept) - max(1, width - 1):]
    for folder in reversed(parts[:-1]):
        if len(folder) + 1 + len(kept) + 2 > width:
            break
        kept = f"{folder}/{kept}"
    return f"…/{kept}"


def prompt_label(prompt_id: int, text: str | None = None, width: int = PROMPT_LABEL_CHARS) -> str:
    """A prompt named by id and text: ``prompt 3 “Every sailor sings about”`` (the text shortened to
    ``width`` characters by :func:`shorten`); ``prompt 3`` without a text."""
    t = shorten(text, width) if text else ""
    return f"prompt {int(prompt_id)} “{t}”" if t else f"prompt {int(prompt_id)}"


def _prompt_id(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if hasattr(v, "__index__") and not isinstance(v, (str, bytes, float)):
        try:
            return int(v.__index__())
        except (TypeError, ValueError):
            return None
    if isinstance(v, str) and v.strip().isdigit():
        return int(v.strip())
    return None


def manifest_prompts(prompts: Any) -> list[dict[str, Any]]:
    """The entries of a manifest's ``prompts`` list that are objects with an integer ``prompt_id`` (an
    int, or a string of digits), each copied with an ``int`` prompt_id and a ``str`` text; anything
    else (not a list, a non-object entry, a missing / non-integer id) is left out."""
    if not isinstance(prompts, (list, tuple)):
        return []
    out = []
    for p in prompts:
        if not isinstance(p, Mapping):
            continue
        pid = _prompt_id(p.get("prompt_id"))
        if pid is None:
            continue
        text = p.get("text", "")
        out.append({**p, "prompt_id": pid, "text": "" if text is None else str(text)})
    return out


def prompt_texts(prompts: Any) -> dict[int, str]:
    """prompt_id -> text of a manifest's ``prompts`` list (malformed entries skipped, see
    :func:`manifest_prompts`)."""
    return {p["prompt_id"]: p["text"] for p in manifest_prompts(prompts)}


def prompt_labels(prompt_ids: Iterable[int], prompts: Any, width: int = PROMPT_LABEL_CHARS) -> dict[int, str]:
    """prompt_id -> :func:`prompt_label` for each id, texts from a manifest's ``prompts`` list."""
    texts = prompt_texts(prompts)
    return {int(p): prompt_label(int(p), texts.get(int(p)), width) for p in prompt_ids}


#: Field names that often hold what mtpscope calls a prompt's ``category`` (prompts files of other tools:
#: SPEED-Bench's ``category``, others' ``domain``, ``task``, ``type`` ...), in the order they are suggested.
CATEGORY_LIKE_FIELDS = ("domain", "type", "task", "topic", "kind", "subject", "genre", "label", "class", "group",
                        "category_name", "task_type", "dataset", "source")


def category_like_fields(field_sets: Iterable[Iterable[str]]) -> list[str]:
    """The names among :data:`CATEGORY_LIKE_FIELDS` (in that order) that every non-empty one of
    ``field_sets`` (each prompt's field names) carries; ``[]`` when there is none or no set."""
    common: set[str] | None = None
    for fields in field_sets:
        names = {str(f) for f in fields}
        if not names:
            continue
        common = names if common is None else common & names
    return [f for f in CATEGORY_LIKE_FIELDS if common and f in common]


def category_field_note(fields: Iterable[str], option: str = "--category-field") -> str | None:
    """The one-line note when prompts carry no ``category`` but a field that looks like one
    (:func:`category_like_fields`'s result): ``prompts have no 'category' but a 'domain' field: pass
    --category-field domain to break the results down by it``; None for no such field."""
    fields = list(fields)
    if not fields:
        return None
    more = f" (also {', '.join(repr(f) for f in fields[1:])})" if len(fields) > 1 else ""
    return (f"prompts have no 'category' but a {fields[0]!r} field{more}: pass {option} {fields[0]} to break the "
            "results down by it")


def streaks_line(n_streaks: int, n_rounds_in_streaks: int = 0, longest: int = 0) -> str:
    """Zero-acceptance streaks (``report().zero_acceptance_streaks``' counts) in words, the one wording the CLI
    and the app share: ``zero-acceptance streaks: 12 (12 rounds), longest 1 round`` or
    ``zero-acceptance streaks: none``."""
    if not n_streaks:
        return "zero-acceptance streaks: none (every round that drafted accepted at least one draft)"
    return (f"zero-acceptance streaks: {n_streaks} ({plural(n_rounds_in_streaks, 'round')}), "
            f"longest {plural(longest, 'round')}")


def rolling_words(window: int, full_windows: bool) -> str:
    """What ``report().rolling`` was computed over (its ``window`` in rounds, ``full_windows``), in words
    (``window 32 rounds, across the trace, full windows only``)."""
    full = ("full windows only" if full_windows
            else "fewer rounds than the window: the partial windows ending at each round")
    return f"window {plural(window, 'round')}, across the trace, {full}"


def beside(value: float, limit: float, digits: int = 2) -> str:
    """``value`` with ``digits`` decimals, or more where those would print it on the other side of ``limit`` or on
    it: a rule's threshold beside the value it judges. A gap of 0.5007 logits is no near tie (at most 0.5, explain's
    ``NEAR_TIE_GAP``) and prints ``0.501``, not ``0.50``; an entropy of 0.9996 nats is a sure target (hard from 1)
    and prints ``0.9996``, not ``1.00``. Up to 6 decimals; closer still, Python's shortest exact form (``repr``:
    0.5000001, never ``0.500000``)."""
    v = float(value)
    side = (v > limit) - (v < limit)
    for d in range(int(digits), 7):
        text = f"{v:.{d}f}"
        if (float(text) > limit) - (float(text) < limit) == side:
            return text
    return repr(v)
