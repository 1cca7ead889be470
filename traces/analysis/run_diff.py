"""What differs between the runs behind two traces: their recording parameters and, per model role, the
models themselves (GGUF metadata keys and tensor types / shapes, when both files are still there). One
job: the "why would B differ from A" list that the Compare page shows above the numbers.

A model counts as the same when its manifest entries carry the same ``header_sha256`` (sha256 of the
GGUF's header, metadata and tensor infos; :func:`traces.run.preflight.model_info`), so a re-quantized or
re-converted drafter shows up even at the same path. Weights alone (same header, other values) are not
compared here: ``mtpscope diff --values`` does that.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: manifest ``params`` that describe the run (not where it was written or how it was stored)
RUN_PARAMS = ("n_draft", "max_tokens", "temp", "seed", "top_k", "top_p", "min_p", "chat", "n_gpu_layers", "centroid_top_k",
              "flash_attn", "n_threads", "n_ctx", "greedy")
#: model roles of a manifest's ``models``, as the recorder writes them
ROLES = ("target", "assistant", "centroids")


@dataclass(frozen=True)
class ModelDifference:
    """One model role whose file differs between the runs.

    Attributes:
        role: ``target``, ``assistant`` or ``centroids``.
        path_a / path_b: the recorded paths (None: no such model in that run).
        keys: ``(key, value in A, value in B)`` for metadata keys that differ (a value None: absent);
            empty when the files could not be read (then ``note`` says why).
        tensors: ``(name, A's "TYPE ne", B's "TYPE ne")`` for tensors whose type or shape differ (None:
            absent in that file); shapes in GGUF ``ne`` order.
        note: why the files were not compared, or None.
    """

    role: str
    path_a: str | None
    path_b: str | None
    keys: tuple[tuple[str, Any, Any], ...] = ()
    tensors: tuple[tuple[str, str | None, str | None], ...] = ()
    note: str | None = None


@dataclass(frozen=True)
class RunDifferences:
    """:func:`run_differences`' result: ``params`` as ``(name, A, B)`` and the differing models."""

    params: tuple[tuple[str, Any, Any], ...] = ()
    models: tuple[ModelDifference, ...] = field(default_factory=tuple)

    @property
    def none(self) -> bool:
        """Same parameters and the same models."""
        return not self.params and not self.models


def _entry(man: dict[str, Any], role: str) -> dict[str, Any] | None:
    models = man.get("models")
    e = models.get(role) if isinstance(models, dict) else None
    return e if isinstance(e, dict) else None


def _gguf_changes(pa: str, pb: str) -> tuple[tuple[tuple[str, Any, Any], ...], tuple[tuple[str, str | None, str | None], ...]]:
    from mtpscope.inspector.diff import diff

    d = diff(pa, pb, values=False, data="none")  # keys and tensor table only (fast)
    keys: list[tuple[str, Any, Any]] = [(c.key, c.a, c.b) if c.a_type == c.b_type else   # (a type change: said)
                                         (c.key, f"{c.a!r} ({c.a_type})", f"{c.b!r} ({c.b_type})") for c in d.keys_changed]
    keys += [(k, None, "(present)") for k in d.keys_added] + [(k, "(present)", None) for k in d.keys_removed]
    tens: list[tuple[str, str | None, str | None]] = [(t.name, f"{t.a_type} {list(t.a_ne)}", f"{t.b_type} {list(t.b_ne)}") for t in d.tensors_changed]
    tens += [(n, None, "(present)") for n in d.tensors_added] + [(n, "(present)", None) for n in d.tensors_removed]
    return tuple(sorted(keys)), tuple(sorted(tens))


def run_differences(manifest_a: dict[str, Any], manifest_b: dict[str, Any], *,
                    readable: Callable[[str], bool] | None = None) -> RunDifferences:
    """Recording parameters (:data:`RUN_PARAMS`) and models (:data:`ROLES`) that differ between the
    runs of two trace manifests. Models whose ``header_sha256`` differ are compared with
    :func:`inspector.diff.diff` (metadata and tensor table, no weights) when both files exist and
    ``readable`` (e.g. the app's allowed folders) accepts both paths; otherwise a ``note`` says why
    not. Never raises on a malformed manifest: what cannot be read counts as absent."""
    params_a, params_b = manifest_a.get("params"), manifest_b.get("params")
    pa_ = params_a if isinstance(params_a, dict) else {}
    pb_ = params_b if isinstance(params_b, dict) else {}
    params = tuple((k, pa_.get(k), pb_.get(k)) for k in RUN_PARAMS if pa_.get(k) != pb_.get(k))
    models: list[ModelDifference] = []
    for role in ROLES:
        ea, eb = _entry(manifest_a, role), _entry(manifest_b, role)
        if ea is None and eb is None:
            continue
        path_a = ea.get("path") if ea else None
        path_b = eb.get("path") if eb else None
        if ea and eb and ea.get("header_sha256") and ea.get("header_sha256") == eb.get("header_sha256"):
            continue
        if not (isinstance(path_a, str) and isinstance(path_b, str)):
            models.append(ModelDifference(role, path_a, path_b, note="only one run has this model"))
            continue
        if readable is not None and not (readable(path_a) and readable(path_b)):
            models.append(ModelDifference(role, path_a, path_b, note="outside the allowed folders: not compared"))
            continue
        if not all(Path(p).is_file() for p in (path_a, path_b)):
            models.append(ModelDifference(role, path_a, path_b, note="a recorded file is gone: not compared"))
            continue
        if Path(path_a).suffix == ".safetensors" or Path(path_a).is_dir():
            models.append(ModelDifference(role, path_a, path_b, note="not a GGUF: not compared"))
            continue
        try:
            keys, tens = _gguf_changes(os.fspath(path_a), os.fspath(path_b))
        except Exception as e:  # noqa: BLE001 - an unreadable file is a note here, not an error of the page
            models.append(ModelDifference(role, path_a, path_b, note=f"could not compare: {e}"))
            continue
        models.append(ModelDifference(role, path_a, path_b, keys=keys, tensors=tens,
                                      note=None if keys or tens else "same metadata and tensor table "
                                                                     "(the weights may differ)"))
    return RunDifferences(params=params, models=tuple(models))


@dataclass(frozen=True)
class DifferenceRow:
    """One row of the "what differs between the two runs" table (values as text, ``—`` for none).

    Attributes:
        what: ``parameter``, ``<role> metadata``, ``<role> tensor`` or ``<role> file`` (role ``drafter`` for
            the assistant).
        name: the parameter, metadata key (a renamed key ``"a | b"``), tensor, or the file note.
        a / b: the value in run A and in run B (a tensor: ``"F32 [8]"``; a file note: the paths).
    """

    what: str
    name: str
    a: str
    b: str

    def to_dict(self) -> dict[str, str]:
        """The row as ``{"what", "name", "A", "B"}``."""
        return {"what": self.what, "name": self.name, "A": self.a, "B": self.b}


def difference_rows(d: RunDifferences, missing: str = "—") -> list[DifferenceRow]:
    """:class:`RunDifferences` as table rows (:class:`DifferenceRow`); ``missing`` stands for a value one run does
    not have (the app's mark by default; the command line passes its own)."""

    def txt(v: Any) -> str:
        return missing if v is None else str(v)

    rows = [DifferenceRow("parameter", k, txt(a), txt(b)) for k, a, b in d.params]
    for m in d.models:
        who = "drafter" if m.role == "assistant" else m.role
        for k, a, b in m.keys:
            rows.append(DifferenceRow(f"{who} metadata", k, txt(a), txt(b)))
        for n, a, b in m.tensors:
            rows.append(DifferenceRow(f"{who} tensor", n, txt(a), txt(b)))
        if m.note:
            rows.append(DifferenceRow(f"{who} file", m.note, txt(m.path_a), txt(m.path_b)))
    return rows


__all__ = ["ROLES", "RUN_PARAMS", "DifferenceRow", "ModelDifference", "RunDifferences", "difference_rows", "run_differences"]
