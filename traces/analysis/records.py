"""The typed results' JSON: :class:`JsonRecord`, the mixin of the frozen dataclasses that carry results to the app
and the CLI (``metrics.TraceReport``, ``requests.ServerTotals``, ``sweep.reader.SweepReport``, ...).

``to_dict()`` gives the fields in declaration order, a nested record as its own ``to_dict()``, tuples and lists as
lists, mappings key by key; other values as stored (the records keep None where a value is undefined, so their
JSON is what ``--json`` printed before they were typed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import pandas as pd


def as_json(v: Any) -> Any:
    """``v`` with every record in it as its ``to_dict()``, tuples and lists as lists, mappings as dicts."""
    if is_dataclass(v) and not isinstance(v, type):
        return v.to_dict()  # type: ignore[attr-defined]  # is_dataclass does not say to_dict exists; the records passed here have it
    if isinstance(v, (list, tuple)):
        return [as_json(x) for x in v]
    if isinstance(v, Mapping):
        return {k: as_json(x) for k, x in v.items()}
    return v


def finite(v: float | None) -> float | None:
    """``v`` as a float, or None for a missing, NaN or infinite value: a number as the JSON carries it."""
    return None if v is None or not math.isfinite(v) else float(v)


def json_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """A frame's rows as JSON-able dicts (column order): NaN -> None, numpy scalars -> Python numbers."""
    import numpy as np  # here, not at the top: the CLI imports this module and must start without numpy

    rows = cast("list[dict[str, Any]]", df.to_dict("records"))  # the frames' column names are str
    return [{k: (None if isinstance(v, float) and math.isnan(v) else
                 (int(v) if isinstance(v, (np.integer,)) else
                  float(v) if isinstance(v, np.floating) else v)) for k, v in r.items()}
            for r in rows]


class JsonRecord:
    """Mixin of a frozen dataclass result: :meth:`to_dict` is its JSON."""

    def to_dict(self) -> dict[str, Any]:
        """The record as a JSON-ready dict: one key per field, in declaration order (nested records, tuples and
        mappings through :func:`as_json`)."""
        return {f.name: as_json(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]  # JsonRecord is mixed into dataclasses only


__all__ = ["JsonRecord", "as_json", "finite", "json_records"]
