"""Trace format, store, metrics and importers for MTP drafting runs.

``traces.open(DIR)`` opens a trace directory (see :func:`traces.store.reader.open_trace`),
``traces.open_sweep(DIR)`` a sweep directory (:func:`traces.sweep.reader.open_sweep`);
:func:`read_manifest` reads its manifest alone; :class:`TraceWriter` writes one; :class:`RoundRecord` / :class:`StepRecord` are what the recorder hands it.

The public names below are imported lazily (PEP 562): importing a submodule by name, or finding it
(the demo stamp hashes module sources by import name), does not pull in numpy, pyarrow and pandas.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# "open" is left out of __all__ so that `from traces import *` never shadows the builtin open().
__all__ = ["open_trace", "read_manifest", "Trace", "TraceWriter", "RoundRecord", "StepRecord", "open_sweep"]

_FROM = {
    "RoundRecord": ("mtpscope.traces.store.records", "RoundRecord"),
    "StepRecord": ("mtpscope.traces.store.records", "StepRecord"),
    "Trace": ("mtpscope.traces.store.reader", "Trace"),
    "TraceWriter": ("mtpscope.traces.store.writer", "TraceWriter"),
    "open_trace": ("mtpscope.traces.store.reader", "open_trace"),
    "read_manifest": ("mtpscope.traces.store.reader", "read_manifest"),
    # the documented reader entry point: traces.open(DIR)
    "open": ("mtpscope.traces.store.reader", "open_trace"),
    # a sweep directory (sweep.json + one trace per task) read as one dataset
    "open_sweep": ("mtpscope.traces.sweep.reader", "open_sweep"),
}

if TYPE_CHECKING:
    from mtpscope.traces.store.reader import Trace, open_trace, read_manifest
    from mtpscope.traces.store.records import RoundRecord, StepRecord
    from mtpscope.traces.store.writer import TraceWriter
    from mtpscope.traces.sweep.reader import open_sweep

    open = open_trace


def __getattr__(name: str) -> Any:
    where = _FROM.get(name)
    if where is None:
        raise AttributeError(f"module 'mtpscope.traces' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(where[0]), where[1])
    globals()[name] = value
    return value
