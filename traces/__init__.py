"""Trace format, store, metrics and importers for MTP drafting runs.

``traces.open(DIR)`` opens a trace directory (see :func:`traces.store.open_trace`);
:class:`TraceWriter` writes one; :class:`RoundRecord` / :class:`StepRecord` are what the recorder hands it.
"""

from mtpscope.traces.records import RoundRecord, StepRecord
from mtpscope.traces.store import Trace, TraceWriter, open_trace

open = open_trace  # noqa: A001 - the documented reader entry point: traces.open(DIR)

# "open" is left out of __all__ so that `from traces import *` never shadows the builtin open().
__all__ = ["open_trace", "Trace", "TraceWriter", "RoundRecord", "StepRecord"]
