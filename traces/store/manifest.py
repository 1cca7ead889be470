"""The manifest file of a trace (``DIR/manifest.json``): reading it checked (:func:`read_manifest`) and
writing it atomically (:func:`write_manifest`: a temporary file, then ``os.replace``).

The keys are described in ``docs/TRACE_FORMAT.md``; :func:`schema.check_manifest` checks those every
reader needs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mtpscope.errors import TraceFormatError
from mtpscope.traces.store import schema as S
from mtpscope.traces.store.layout import MANIFEST, tmp_path


def _json_default(o: Any) -> Any:
    import numpy as np  # only for values that plain JSON cannot hold

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, os.PathLike):
        return os.fspath(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def manifest_text(manifest: dict[str, Any], path: Path) -> str:
    """The manifest as written to disk: JSON, 2-space indent, numpy scalars / arrays and paths as plain
    values, no NaN; without the final newline.

    Raises:
        TraceFormatError: a value JSON cannot hold (``path``: the manifest file, for the message).
    """
    try:
        return json.dumps(manifest, indent=2, default=_json_default, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TraceFormatError(f"manifest is not JSON serialisable: {e}", path=path) from None


def write_manifest(path: str | os.PathLike[str], manifest: dict[str, Any]) -> None:
    """Write ``manifest`` as the trace ``path``'s manifest: to ``manifest.json.tmp``, then renamed over
    ``manifest.json`` (a reader sees the old or the new one, never half of one).

    Raises:
        TraceFormatError: a value JSON cannot hold (nothing is written).
        OSError: writing failed.
    """
    mpath = Path(path) / MANIFEST
    text = manifest_text(manifest, mpath)
    tmp = tmp_path(mpath)
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text + "\n")
    os.replace(tmp, mpath)


#: the traces a folder-of-traces refusal names
MAX_NAMED = 8


def correct_counts(path: str | os.PathLike[str], manifest: dict[str, Any], n_rounds: int,
                   n_steps: int) -> dict[str, tuple[Any, int]]:
    """Set the manifest's ``counts.n_rounds`` / ``counts.n_steps`` to the rows read from every part (``trace repair``,
    when no part was skipped) where they differ, and write the manifest (``path``: the trace folder) if any did.

    Returns:
        ``{key: (what the manifest said, the count read)}`` for each key corrected (``{}``: none).
    """
    counts = manifest.get("counts")
    if not isinstance(counts, dict):
        counts = manifest["counts"] = {}
    fixed: dict[str, tuple[Any, int]] = {}
    for key, n in (("n_rounds", n_rounds), ("n_steps", n_steps)):
        old = counts.get(key)
        if type(old) is not int or old != n:
            fixed[key] = (old, n)
            counts[key] = n
    if fixed:
        write_manifest(path, manifest)
    return fixed


def traces_inside(folder: Path) -> list[str]:
    """The names of ``folder``'s subfolders that hold a ``manifest.json`` (one level, sorted); [] when unreadable."""
    try:
        return sorted(e.name for e in os.scandir(folder) if e.is_dir() and (Path(e.path) / MANIFEST).is_file())
    except OSError:
        return []


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The trace directory ``path``'s ``manifest.json``, parsed and checked (:func:`schema.check_manifest`).

    Raises:
        TraceFormatError: ``path`` is not a directory; the manifest is missing (a folder of traces: their names),
            not UTF-8 (the byte
            offset named), not JSON (the offset named), or fails the check (the key named).
        OSError: the manifest cannot be read for another reason (permissions).
    """
    p = Path(path)
    if not p.is_dir():
        raise TraceFormatError("not a trace directory", path=p, expected=f"a directory with {MANIFEST}",
                               actual="missing" if not p.exists() else "not a directory")
    mpath = p / MANIFEST
    try:
        raw = mpath.read_bytes()
    except FileNotFoundError:
        inside = traces_inside(p)
        if inside:              # a folder of traces given for a trace: name them
            more = f" and {len(inside) - MAX_NAMED} more" if len(inside) > MAX_NAMED else ""
            raise TraceFormatError("a folder of traces, not a trace", path=p,
                                   expected=f"one of its traces: {', '.join(inside[:MAX_NAMED])}{more}",
                                   actual=f"no {MANIFEST} here") from None
        raise TraceFormatError("trace directory has no manifest", path=mpath,
                               expected=MANIFEST, actual="missing") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceFormatError("manifest is not UTF-8 text", path=mpath, offset=e.start,
                               expected="UTF-8 JSON", actual=f"byte 0x{raw[e.start]:02x}") from None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as e:
        # (json's msg for some errors ends in " at", its position following in str(e): the offset says it here)
        raise TraceFormatError(f"manifest is not valid JSON: {e.msg.removesuffix(' at')}", path=mpath,
                               offset=e.pos) from None
    except RecursionError:
        raise TraceFormatError("manifest JSON is nested too deeply", path=mpath,
                               expected="a flat JSON object", actual="deep nesting") from None
    return S.check_manifest(manifest, str(mpath))  # the same object, checked
