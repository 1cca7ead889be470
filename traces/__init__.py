"""Trace format, store, metrics and importers for MTP drafting runs.

``traces.open(DIR)`` opens a trace directory (see :func:`traces.store.open_trace`);
:class:`TraceWriter` writes one; :class:`RoundRecord` / :class:`StepRecord` are what the recorder hands it.
"""

from traces.records import RoundRecord, StepRecord
from traces.store import Trace, TraceWriter, open_trace

open = open_trace  # noqa: A001 - the documented reader entry point: traces.open(DIR)

__all__ = ["open", "open_trace", "Trace", "TraceWriter", "RoundRecord", "StepRecord"]
