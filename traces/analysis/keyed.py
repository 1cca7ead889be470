"""The records of an explanation read by their JSON keys: a transitional bridge. One job.

The sections of :class:`traces.analysis.explain_report.Explanation` are typed records (attributes); their
``to_dict()`` is the one JSON form (docs/EXPLAIN.md). :class:`JsonKeys` lets a reader that still indexes
the old dicts by key (``traces/diagnose/behaviour.py``: ``x.rejections.get("target_side")``, its JSON-able
``summary``) read a record the same way, each key answering from ``to_dict()``. New code reads
attributes; once no reader indexes a record by key, this module goes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


class JsonKeys(Mapping[str, Any]):
    """Mixin for a frozen dataclass with ``to_dict()``: the read-only mapping of its JSON keys (``rec["k"]``,
    ``rec.get("k")``, ``dict(rec)`` equal ``rec.to_dict()``'s)."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())
