"""What the importers share: :class:`ImportResult`, reading a log file line by line, small value checks."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from mtpscope.errors import ImportFormatError

ROUNDS_PER_PART = 65536
MAX_LISTED = 10          # line numbers listed per warning


@dataclass(frozen=True)
class ImportResult:
    """What an import read and wrote.

    Attributes:
        path: the source file.
        out_dir: the trace directory written.
        source: ``"fork-ndjson"`` or ``"server-log"``.
        n_lines: lines in the file.
        n_used: lines that went into the trace.
        n_ignored: lines that are not trace data (other log output, other event kinds); not errors.
        n_bad: lines that looked like trace data but could not be used.
        bad_lines: ``(line number (1-based), reason)`` for every bad line.
        warnings: other findings (unmatched events, inconsistent counts), each naming line numbers.
        n_rounds, n_steps, n_requests: rows written.
        n_dropped: well-formed events that are not in the trace (a draft without its accept, an accept
            without its draft); a warning names their lines. Data left out, as bad lines are.
    """

    path: str
    out_dir: str
    source: str
    n_lines: int
    n_used: int
    n_ignored: int
    n_bad: int
    bad_lines: tuple[tuple[int, str], ...]
    warnings: tuple[str, ...]
    n_rounds: int = 0
    n_steps: int = 0
    n_requests: int = 0
    n_dropped: int = 0


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        fh = open(path, "rb")  # noqa: SIM115 - opened outside `with` so that only open()'s errors become ImportFormatError
    except FileNotFoundError:
        raise ImportFormatError("no such file", path=path) from None
    except IsADirectoryError:
        raise ImportFormatError("is a directory, not a log file", path=path) from None
    with fh:
        for i, raw in enumerate(fh, start=1):
            yield i, raw.decode("utf-8", errors="replace").rstrip("\r\n")


def is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> TypeGuard[float]:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def listed(nums: list[int]) -> str:
    head = ", ".join(map(str, nums[:MAX_LISTED]))
    return head + (f", ... ({len(nums)} in all)" if len(nums) > MAX_LISTED else "")


I32_RANGE = (-(2 ** 31), 2 ** 31 - 1)


def in_i32(v: int) -> bool:
    return I32_RANGE[0] <= v <= I32_RANGE[1]


def text_i32(text: str) -> int | None:
    """A decimal integer as a log prints it (a regex's ``-?\\d+`` group) if it fits int32, else None.

    Any length is answered: Python's ``int()`` refuses strings of more than ``sys.get_int_max_str_digits()``
    digits, and no number of more than 10 significant digits fits int32 anyway.
    """
    digits = text.lstrip("+-").lstrip("0")
    if len(digits) > 10:
        return None
    v = int(text)
    return v if in_i32(v) else None


def text_float(text: str) -> float | None:
    """A number as a log prints it (a regex's ``[-+0-9.eE]+`` group, which also matches ``.`` or ``1e``) if it
    is one and finite, else None."""
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


#: :func:`json_line`'s reason for JSON nested past Python's recursion limit
DEEP_JSON = "JSON nested too deeply"


def json_line(text: str) -> tuple[Any, str | None]:
    """One log line's JSON value -> ``(value, None)``, or ``(None, why it cannot be read)``.

    Unreadable: invalid JSON (the reason names the column), nesting past Python's recursion limit, an
    integer longer than Python converts (``sys.get_int_max_str_digits()`` digits).
    """
    try:
        return json.loads(text), None
    except json.JSONDecodeError as e:
        return None, f"invalid JSON ({e.msg}; column {e.colno})"
    except RecursionError:
        return None, DEEP_JSON
    except ValueError:          # int() of a literal over the digit limit (json raises it unwrapped)
        return None, f"invalid JSON (an integer of more than {sys.get_int_max_str_digits()} digits)"
