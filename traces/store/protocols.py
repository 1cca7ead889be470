"""What readers of a trace rely on: :class:`TraceLike`, satisfied by an opened trace
(:class:`traces.store.reader.Trace`) and by one configuration of a sweep read over all its shards
(:class:`traces.sweep.reader.SweepCell`), so the analysis functions and the app take either.

Standard library only at run time (the pandas / numpy / pyarrow names are for type checkers).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import pyarrow as pa


class TraceLike(Protocol):
    """An opened trace, as the analysis functions and the app read it.

    Attributes:
        path: the directory (a sweep configuration: its ``assistant=<a>/n_draft=<k>`` folder).
        manifest: the parsed ``manifest.json`` (dict; keys in docs/TRACE_FORMAT.md).
        warnings: human-readable warnings (skipped parts, incomplete trace, ...), each naming the file.
        schemas: table name (``rounds``, ``steps``, ``requests``) -> its pyarrow schema.

    ``rounds`` / ``steps`` / ``requests`` are ``columns(table)``: classes that subclass this protocol
    explicitly inherit them.
    """

    path: Path
    manifest: dict[str, Any]
    warnings: list[str]
    schemas: dict[str, pa.Schema]

    def columns(self, table: str, names: Sequence[str] | None = None) -> pd.DataFrame:
        """Only ``names`` of ``table`` (``None``: every non-hidden column) as a DataFrame."""
        ...

    def hidden(self, name: str, where: Any = None) -> np.ndarray:
        """One hidden-state column as float32 ``(n, dim)`` (numpy order); ``where``: None, a boolean mask
        aligned with :attr:`steps`, or a DuckDB predicate over the steps columns."""
        ...

    def sql(self, query: str) -> pd.DataFrame:
        """A DuckDB query over the views ``rounds``, ``steps`` (and ``requests``)."""
        ...

    def part_files(self, table: str) -> list[Path]:
        """The readable Parquet files of ``table``, in order."""
        ...

    def rounds_not_read(self, n_read: int) -> int | None:
        """The rounds the manifest counts when a rounds part was skipped and fewer than that (``n_read``) were
        read, else None (:meth:`traces.store.reader.Trace.rounds_not_read`; None here: a trace that cannot tell)."""
        return None

    @property
    def rounds(self) -> pd.DataFrame:
        """All rounds (one row per round), columns as in ``schema.ROUNDS_SCHEMA``."""
        return self.columns("rounds")

    @property
    def steps(self) -> pd.DataFrame:
        """All draft steps (one row per step), hidden-state columns excluded."""
        return self.columns("steps")

    @property
    def requests(self) -> pd.DataFrame:
        """Per-request summaries (server-log imports; empty otherwise)."""
        return self.columns("requests")
