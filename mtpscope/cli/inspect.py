"""CLI commands: inspect (see mtpscope/cli/main.py).

``mtpscope inspect PATH [--json | --markdown] [--filter GLOB] [--full]``: the header and tensor
inventory of a GGUF file. Exit 0 with the inventory; exit 1 with the inventory and one line on stderr when a
tensor has a ggml type id this reader does not know (its size and data cannot be read; ``verify`` flags it
too; ``--json`` lists it under ``problems``); exit 2 with one line on stderr when the file is unreadable. No tensor data is read.

Shapes are printed in GGUF ``ne`` order (innermost first); the JSON says so in ``shape_order``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mtpscope.cli.common import EXIT_FINDINGS, one_line_errors
from mtpscope.cli.sources import (
    DEFAULT_MAX_HEADER_MIB,
    DEFAULT_TIMEOUT_S,
    AllowFullDownload,
    MaxHeaderMiB,
    Timeout,
    open_source,
)

if TYPE_CHECKING:
    from mtpscope.inspector.gguf import GGUFLike

ARRAY_INLINE_MAX = 64
"""Arrays longer than this are summarised (type, length, first elements) unless ``--full``."""
ARRAY_HEAD = 8
STRING_INLINE_MAX = 200
"""Text mode: longer string values are cut (``--full`` prints them whole)."""


def _json_safe(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, list):
        return [_json_safe(x) for x in v]
    return v


def metadata_value(kv: Any, full: bool = False) -> Any:
    """A JSON-able form of one :class:`inspector.gguf.KeyValue`'s value.

    Scalars and strings as they are (non-finite floats as ``"nan"`` / ``"inf"`` / ``"-inf"``); arrays of
    at most :data:`ARRAY_INLINE_MAX` elements (or any with ``full``) as lists; longer arrays as
    ``{"element_type": "STRING", "length": 262144, "head": [first 8]}``.
    """
    from mtpscope.inspector.gguf import ArrayValue

    v = kv.value
    if not isinstance(v, ArrayValue):
        return _json_safe(v)
    if full or len(v) <= ARRAY_INLINE_MAX:
        return _json_safe(v.to_list())
    head = v[:ARRAY_HEAD]
    if v.element_type_name == "ARRAY":
        head = [c.to_list() for c in head]
    return {"element_type": v.element_type_name, "length": len(v), "head": _json_safe(head)}


def metadata_type(kv: Any) -> str:
    """``"UINT32"``, or ``"ARRAY[STRING]"`` for arrays."""
    from mtpscope.inspector.gguf import ArrayValue

    if isinstance(kv.value, ArrayValue):
        return f"ARRAY[{kv.value.element_type_name}]"
    return str(kv.type_name)


def _totals_dict(totals: Any) -> dict[str, Any]:
    return {k: {"n_tensors": t.n_tensors, "n_elements": t.n_elements, "n_bytes": t.n_bytes,
                "n_unknown_size": t.n_unknown_size} for k, t in totals.items()}


def inspect_report(path: str | os.PathLike[str] | GGUFLike, full: bool = False, pattern: str | None = None) -> dict[str, Any]:
    """The JSON-able report of ``mtpscope inspect``.

    Keys: ``path``, ``file_size``, ``gguf_version``, ``alignment``, ``data_offset``, ``architecture``,
    ``dialect`` {kind, arch, evidence, pattern}, ``metadata`` {key: value} (see :func:`metadata_value`),
    ``metadata_types`` {key: type}, ``shape_order`` ("ne"), ``filter``, ``n_tensors``, ``n_bytes``,
    ``tensors`` [{name, ggml_type, ggml_type_id, shape (ne order), n_elements, n_bytes, bits_per_weight,
    offset (absolute bytes), component, layer}], ``by_component``, ``by_type`` (over the listed tensors),
    ``problems`` (over every tensor, whatever ``pattern``: what makes ``inspect`` exit 1; empty when none, see
    :func:`unknown_type_problems`);
    for a split model ``shards`` [paths] and each tensor's ``shard`` (0-based; ``offset`` is within it);
    for a URL ``remote`` {requests, bytes} (what reading the header cost).

    ``path`` may also be an already open file (``GGUFFile`` / ``ShardedGGUF``, see
    :func:`mtpscope.cli.sources.open_source`).

    Raises:
        InspectorError: the file is not a readable GGUF (see :func:`inspector.gguf.open_gguf`).
        OSError: the file cannot be opened.
    """
    from mtpscope.cli.sources import open_source, remote_summary
    from mtpscope.inspector.inventory import COMPONENTS, build_inventory, totals

    f = open_source(str(path)) if isinstance(path, (str, os.PathLike)) else path
    inv = build_inventory(f)
    entries = list(inv.filter(pattern)) if pattern else list(inv.entries)
    by_comp: dict[str, list[Any]] = {}
    by_type: dict[str, list[Any]] = {}
    for e in entries:
        by_comp.setdefault(e.component, []).append(e)
        by_type.setdefault(e.tensor.type_name, []).append(e)
    comp_totals = {c: totals(by_comp[c]) for c in COMPONENTS if c in by_comp}
    type_totals = dict(sorted(((k, totals(v)) for k, v in by_type.items()),
                              key=lambda kv: (-kv[1].n_bytes, kv[0])))
    rep: dict[str, Any] = {
        "path": f.path,
        "file_size": f.file_size,
        "gguf_version": f.version,
        "alignment": f.alignment,
        "data_offset": f.data_offset,
        "architecture": f.architecture,
        "dialect": {"kind": inv.dialect.kind, "arch": inv.dialect.arch,
                    "evidence": list(inv.dialect.evidence), "pattern": inv.dialect.pattern},
        "metadata": {k: metadata_value(kv, full) for k, kv in f.kv.items()},
        "metadata_types": {k: metadata_type(kv) for k, kv in f.kv.items()},
        "shape_order": "ne",
        "filter": pattern,
        "n_tensors": len(entries),
        "n_bytes": sum(e.tensor.n_bytes or 0 for e in entries),
        "tensors": [
            {"name": e.tensor.name, "ggml_type": e.tensor.type_name, "ggml_type_id": e.tensor.ggml_type,
             "shape": list(e.tensor.ne), "n_elements": e.tensor.n_elements, "n_bytes": e.tensor.n_bytes,
             "bits_per_weight": e.tensor.bits_per_weight, "offset": e.tensor.offset,
             "component": e.component, "layer": e.layer}
            for e in entries
        ],
        "by_component": _totals_dict(comp_totals),
        "by_type": _totals_dict(type_totals),
        "problems": unknown_type_problems(f.tensors),
    }
    if len(f.shards) > 1:  # a split model
        rep["shards"] = [s.path for s in f.shards]
        for row in rep["tensors"]:
            row["shard"] = f.shard_of(row["name"])
    remote = remote_summary(f)
    if remote is not None:
        rep["remote"] = remote
    return rep


# ------------------------------------------------------------------------------------------ text


#: tensors of unknown ggml types named by name in :func:`unknown_type_line` (the rest are counted)
UNKNOWN_TYPES_NAMED = 3


#: the ``kind`` of a problem of :func:`unknown_type_problems`
UNKNOWN_GGML_TYPE = "unknown_ggml_type"


def unknown_type_problems(tensors: Any) -> list[dict[str, Any]]:
    """The report's ``problems``: ``{"kind": "unknown_ggml_type", "tensor": NAME, "ggml_type_id": 77}`` for each
    tensor (in file order) whose ggml type id this reader does not know (its size, and so its data, cannot be
    known); empty when every type is known."""
    return [{"kind": UNKNOWN_GGML_TYPE, "tensor": t.name, "ggml_type_id": t.ggml_type}
            for t in tensors if t.n_bytes is None]      # (None only for an unknown type: gguf.TensorInfo)


def unknown_type_line(path: str, problems: list[dict[str, Any]]) -> str | None:
    """The one stderr line of ``inspect`` on the report's ``problems`` (:func:`unknown_type_problems`):
    ``PATH: 'NAME': unknown ggml type: ... (expected a known ggml type id, got 77)`` for the first tensor of an
    unknown type, the others named after it; None when there is none."""
    from mtpscope.errors import TensorDataError

    bad = [p for p in problems if p["kind"] == UNKNOWN_GGML_TYPE]
    if not bad:
        return None
    more = ""
    if len(bad) > 1:
        named = ", ".join(f"{p['tensor']!r} ({p['ggml_type_id']})" for p in bad[1:1 + UNKNOWN_TYPES_NAMED])
        rest = len(bad) - 1 - UNKNOWN_TYPES_NAMED
        n = len(bad) - 1
        more = (f"; {n} more {'tensor' if n == 1 else 'tensors'} of an unknown type: {named}"
                + (f" and {rest} others" if rest > 0 else ""))
    return TensorDataError("unknown ggml type: its size and data cannot be read",
                           path=path, key=bad[0]["tensor"], expected="a known ggml type id",
                           actual=bad[0]["ggml_type_id"]).one_line() + more


def _human_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if x < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{x:.2f} {unit}"
        x /= 1024
    return f"{n} B"  # pragma: no cover


def _short(v: Any, full: bool) -> str:
    if isinstance(v, dict) and "length" in v:
        head = ", ".join(json.dumps(x, ensure_ascii=False) for x in v["head"])
        return f"[{head}, ...] ({v['length']} elements)"
    s = json.dumps(v, ensure_ascii=False)
    if not full and len(s) > STRING_INLINE_MAX:
        s = s[:STRING_INLINE_MAX] + f"... ({len(s)} chars)"
    return s


def _rows(rep: dict[str, Any]) -> list[list[str]]:
    return [[t["name"], t["ggml_type"], "[" + ", ".join(map(str, t["shape"])) + "]", _human_bytes(t["n_bytes"]),
             str(t["offset"]), t["component"], "" if t["layer"] is None else str(t["layer"])]
            for t in rep["tensors"]]


TENSOR_HEADER = ["name", "type", "ne", "bytes", "offset", "component", "layer"]


def format_text(rep: dict[str, Any], full: bool = False) -> str:
    """The report as aligned plain text."""
    d = rep["dialect"]
    out = [f"{rep['path']}",
           f"GGUF v{rep['gguf_version']}  {_human_bytes(rep['file_size'])}  alignment {rep['alignment']}"
           f"  data offset {rep['data_offset']}",
           *([f"split model: {len(rep['shards'])} shards"] if rep.get("shards") else []),
           *([f"read over HTTP: {rep['remote']['requests']} requests, {_human_bytes(rep['remote']['bytes'])}"]
             if rep.get("remote") else []),
           f"architecture: {rep['architecture']}   dialect: {d['kind']}"
           + (f" (pattern {d['pattern']})" if d["pattern"] else ""),
           *(f"  evidence: {e}" for e in d["evidence"]),
           "", f"metadata: {len(rep['metadata'])} keys"]
    width = max((len(k) for k in rep["metadata"]), default=0)
    for k, v in rep["metadata"].items():
        out.append(f"  {k:<{width}}  {rep['metadata_types'][k]:<14} {_short(v, full)}")
    flt = f" matching {rep['filter']!r}" if rep["filter"] else ""
    out += ["", f"tensors{flt}: {rep['n_tensors']}  ({_human_bytes(rep['n_bytes'])}; shapes in ne order)"]
    rows = _rows(rep)
    if rows:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(TENSOR_HEADER)]
        out.append("  " + "  ".join(h.ljust(w) for h, w in zip(TENSOR_HEADER, widths)).rstrip())
        out += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    for title, key in (("by component", "by_component"), ("by type", "by_type")):
        if rep[key]:
            out += ["", f"{title}:"]
            for name, t in rep[key].items():
                noun = "tensor " if t["n_tensors"] == 1 else "tensors"      # (padded: the columns stay aligned)
                out.append(f"  {name:<16} {t['n_tensors']:>6} {noun}  {_human_bytes(t['n_bytes']):>12}")
    return "\n".join(out)


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def format_markdown(rep: dict[str, Any], full: bool = False) -> str:
    """The report as Markdown (headings and tables)."""
    d = rep["dialect"]
    out = [f"# `{rep['path']}`", "",
           f"- GGUF v{rep['gguf_version']}, {rep['file_size']} bytes, alignment {rep['alignment']}, "
           f"data offset {rep['data_offset']}",
           f"- architecture: `{rep['architecture']}`",
           f"- dialect: **{d['kind']}**" + (f" (pattern `{d['pattern']}`)" if d["pattern"] else ""),
           *(f"  - {_md_cell(e)}" for e in d["evidence"]),
           "", "## Metadata", "", "| key | type | value |", "|---|---|---|"]
    for k, v in rep["metadata"].items():
        out.append(f"| `{k}` | {rep['metadata_types'][k]} | {_md_cell(_short(v, full))} |")
    flt = f" matching `{rep['filter']}`" if rep["filter"] else ""
    out += ["", f"## Tensors{flt} ({rep['n_tensors']}, shapes in ne order)", "",
            "| " + " | ".join(TENSOR_HEADER) + " |", "|" + "---|" * len(TENSOR_HEADER)]
    out += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in _rows(rep)]
    for title, key in (("By component", "by_component"), ("By type", "by_type")):
        if rep[key]:
            out += ["", f"## {title}", "", "| | tensors | bytes |", "|---|---|---|"]
            out += [f"| {n} | {t['n_tensors']} | {t['n_bytes']} |" for n, t in rep[key].items()]
    return "\n".join(out)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the root mtpscope app."""

    @app.command("inspect")
    def inspect(
        path: Annotated[str, typer.Argument(help="A GGUF file, any shard of a split model, or an https:// or "
                                                 "hf://ORG/REPO/[REVISION/]FILE.gguf URL (header only).")],
        as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
        markdown: Annotated[bool, typer.Option("--markdown", help="Markdown tables.")] = False,
        pattern: Annotated[str | None, typer.Option("--filter", metavar="GLOB",
                                                    help="Only tensors whose name matches (e.g. 'mtp.*').")] = None,
        full: Annotated[bool, typer.Option("--full", help="Print big arrays and long strings whole.")] = False,
        allow_full_download: AllowFullDownload = False,
        max_header_mib: MaxHeaderMiB = DEFAULT_MAX_HEADER_MIB,
        timeout: Timeout = DEFAULT_TIMEOUT_S,
    ) -> None:
        """Header, metadata and tensor inventory of a GGUF (no tensor data is read).

        Exit 0 with the inventory; 1 with the inventory and one line on stderr naming a tensor whose ggml type
        id is unknown (--json: listed under "problems"); 2 with one line on stderr if the file is unreadable.
        """
        if as_json and markdown:
            print("mtpscope: --json and --markdown exclude each other", file=sys.stderr)
            raise typer.Exit(2)
        with one_line_errors():
            f = open_source(path, allow_full_download, max_header_mib, timeout)
            rep = inspect_report(f, full=full, pattern=pattern)
        if as_json:
            sys.stdout.write(json.dumps(rep, ensure_ascii=False, allow_nan=False) + "\n")
        elif markdown:
            sys.stdout.write(format_markdown(rep, full) + "\n")
        else:
            sys.stdout.write(format_text(rep, full) + "\n")
        problem = unknown_type_line(f.path, rep["problems"])
        if problem is not None:
            print(f"mtpscope: {problem}", file=sys.stderr)
            raise typer.Exit(EXIT_FINDINGS)
