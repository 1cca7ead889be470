"""Numbers and cells for people, one rule for every page (pure, standard library only: no Streamlit).

* a rate in [0, 1] is a percentage with one decimal and a space before the sign: ``34.8 %``
  (:func:`percent`); a difference of two rates is in percentage points: ``−13.8 points`` (:func:`points`);
* a plain number has a fixed number of decimals (:func:`number`: mean acceptance length ``1.62``);
* a missing value (None, NaN, pandas' NA) is ``—`` (:data:`MISSING`), never ``None`` or ``nan``
  (:func:`cell`, :func:`cells` for a table's records).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

#: What a missing value shows as.
MISSING = "—"


def is_missing(x: Any) -> bool:
    """True for None, a float NaN and pandas' ``NA`` / ``NaT`` (anything that is not equal to itself or whose
    truth is undefined), without importing pandas."""
    if x is None:
        return True
    if isinstance(x, float):
        return math.isnan(x)
    try:
        return bool(x != x)
    except (TypeError, ValueError):  # pandas.NA: its truth is ambiguous
        return True


def percent(rate: Any, digits: int = 1) -> str:
    """A rate (a fraction: 0.348) as ``34.8 %`` (``digits`` decimals); ``—`` when missing."""
    if is_missing(rate):
        return MISSING
    return f"{float(rate) * 100:.{digits}f} %"


def points(delta: Any, digits: int = 1) -> str:
    """A difference of two rates (fractions: -0.138) in percentage points, signed: ``−13.8 points`` (a minus
    sign, U+2212), ``+2.0 points``; ``—`` when missing."""
    if is_missing(delta):
        return MISSING
    v = float(delta) * 100
    text = f"{abs(v):.{digits}f}"
    sign = "" if float(text) == 0 else ("−" if v < 0 else "+")
    return f"{sign}{text} points"


def number(x: Any, digits: int = 2) -> str:
    """A number with ``digits`` decimals (``1.62``); an integer (``int``) with thousands separators (``3,246``);
    ``—`` when missing."""
    if is_missing(x):
        return MISSING
    if isinstance(x, int) and not isinstance(x, bool):
        return f"{x:,}"
    return f"{float(x):.{digits}f}"


def cell(x: Any) -> Any:
    """A table cell as shown: ``—`` for a missing value, anything else unchanged."""
    return MISSING if is_missing(x) else x


def cells(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A table's records (dicts) with every missing value as ``—`` (:func:`cell`)."""
    return [{k: cell(v) for k, v in r.items()} for r in rows]


__all__ = ["MISSING", "cell", "cells", "is_missing", "number", "percent", "points"]
