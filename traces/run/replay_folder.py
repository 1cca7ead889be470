"""A replay's output folder (``mtpscope replay --out DIR``): its file names, :func:`read_replay` (the app's Compare
page reads it back), and :func:`check_replay_out`, which refuses a folder that holds something else before a
replay writes into it. Reads JSON and Parquet only (no llama.cpp)::

    DIR/summary.json        ReplayResult.summary().to_dict()
    DIR/steps.parquet       ReplayResult.steps;  DIR/rounds.parquet  ReplayResult.rounds
    DIR/traces/<variant>/   one trace per variant (source "replay"), readable by traces.open

Imports: pandas / pyarrow (inside functions), mtpscope.errors, traces.run.replay_summary, traces.store.layout.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mtpscope.errors import TraceError, TraceFormatError
from mtpscope.traces.run.replay_summary import ReplaySummary
from mtpscope.traces.store.layout import MANIFEST

#: file names of a replay output folder
SUMMARY_FILE, STEPS_FILE, ROUNDS_FILE = "summary.json", "steps.parquet", "rounds.parquet"
#: its folder of variant traces
TRACES_DIR = "traces"
#: everything a replay writes into its folder
REPLAY_NAMES = frozenset({SUMMARY_FILE, STEPS_FILE, ROUNDS_FILE, TRACES_DIR})


def read_replay(path: str | os.PathLike[str]) -> tuple[ReplaySummary, Any]:
    """``(summary, steps DataFrame)`` of a replay output folder: ``summary.json`` (:meth:`ReplaySummary.from_dict`)
    and ``steps.parquet`` (``ReplayResult.steps``; an empty DataFrame when the folder has none).

    Raises:
        TraceFormatError: a missing or unreadable ``summary.json``, or an unreadable ``steps.parquet``
            (naming the file).
    """
    import pandas as pd
    import pyarrow.parquet as pq

    p = Path(path)
    summary = _summary(p)
    steps = None
    if (p / STEPS_FILE).exists():
        try:
            steps = pq.read_table(p / STEPS_FILE).to_pandas()
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise TraceFormatError(f"unreadable replay steps ({type(e).__name__}: {e})",
                                   path=p / STEPS_FILE) from None
    return summary, (steps if steps is not None else pd.DataFrame())


def _summary(p: Path) -> ReplaySummary:
    try:
        doc = json.loads((p / SUMMARY_FILE).read_text())
    except (OSError, ValueError) as e:
        raise TraceFormatError(f"unreadable replay summary ({e})", path=p / SUMMARY_FILE) from None
    if not isinstance(doc, Mapping):
        raise TraceFormatError(f"unreadable replay summary (a JSON {type(doc).__name__}, not an object)",
                               path=p / SUMMARY_FILE)
    try:
        return ReplaySummary.from_dict(doc)
    except (AttributeError, TypeError, ValueError, IndexError) as e:
        raise TraceFormatError(f"unreadable replay summary ({type(e).__name__}: {e})", path=p / SUMMARY_FILE) from None


def check_replay_out(path: str | os.PathLike[str]) -> bool:
    """Whether a replay may write into ``path``: absent, an empty folder, or a folder that holds a replay and
    nothing else (which the new replay then replaces). Returns True for that last case (a replay is there).

    Raises:
        TraceError: ``path`` is not a folder, is a trace directory, or holds files a replay does not write (the
            first one named), or its ``summary.json`` is not a replay's: nothing is written there.
    """
    p = Path(path)
    if not p.exists():
        return False
    if not p.is_dir():
        raise TraceError("replay --out needs a folder of its own", path=p, expected="a folder", actual="a file")
    if (p / MANIFEST).exists():
        raise TraceError("replay --out is a trace directory: the replay needs a folder of its own", path=p,
                         key=MANIFEST, expected="a new or empty folder, or an earlier replay's",
                         actual="a trace's manifest")
    names = sorted(os.listdir(p))
    if not names:
        return False
    other = [n for n in names if n not in REPLAY_NAMES]
    if other:
        raise TraceError("replay --out holds files a replay does not write; nothing is replaced", path=p / other[0],
                         expected=f"only {', '.join(sorted(REPLAY_NAMES))}",
                         actual=f"{len(other)} other entr{'y' if len(other) == 1 else 'ies'}")
    if SUMMARY_FILE not in names:          # a replay cut short before its summary: nothing but its own files
        return True
    try:
        _summary(p)
    except TraceFormatError as e:
        raise TraceError(f"replay --out holds a {SUMMARY_FILE} that is not a replay's; nothing is replaced "
                         f"({e.message})", path=p / SUMMARY_FILE) from None
    return True


__all__ = ["REPLAY_NAMES", "ROUNDS_FILE", "STEPS_FILE", "SUMMARY_FILE", "TRACES_DIR", "check_replay_out",
           "read_replay"]
