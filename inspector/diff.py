"""Difference between two GGUF files: metadata keys, tensor table, and optionally sampled values.

``diff(a, b, values=False)`` -> :class:`GGUFDiff`. Keys are compared by decoded value (arrays: length,
then elements; string arrays such as the 262144-token vocabulary compare their raw bytes first). Tensors
are matched by name; with ``match_dialects`` the fork / upstream names of the same tensor
(``mtp.pre_projection.weight`` ↔ ``nextn.pre_projection.weight``) are matched and reported as renamed.
With ``values`` a relative-error summary is computed on up to ``n_rows`` evenly spaced rows (outermost
numpy dimension) of every tensor present in both with the same shape:
``rel = ||a − b||₂ / max(||a||₂, ||b||₂)`` per row (0 when both rows are zero; at most 2), reported as max
and mean over the sampled rows (values dequantized, computed in float64).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

RENAMES = {
    "mtp.pre_projection.weight": "nextn.pre_projection.weight",
    "mtp.post_projection.weight": "nextn.post_projection.weight",
    "mtp.centroids.weight": "masked_embd_centroids.weight",
    "mtp.token_ordering.weight": "masked_embd_ordering",
}


@dataclass(frozen=True)
class KeyChange:
    """A metadata key whose value differs. ``a`` / ``b`` are short, JSON-able summaries."""

    key: str
    a: Any
    b: Any


@dataclass(frozen=True)
class TensorChange:
    """A tensor present in both files whose type or shape differs (shapes in GGUF ``ne`` order)."""

    name: str
    a_type: str
    b_type: str
    a_ne: tuple[int, ...]
    b_ne: tuple[int, ...]


@dataclass(frozen=True)
class ValueDiff:
    """Relative error of sampled rows of one tensor (``rel = ||a−b|| / max(||a||, ||b||)`` per row)."""

    name: str
    rows_sampled: int
    rows_total: int
    rel_err_max: float
    rel_err_mean: float
    identical: bool


@dataclass(frozen=True)
class GGUFDiff:
    """Result of :func:`diff`.

    Attributes:
        a / b: paths.
        keys_added / keys_removed: keys only in b / only in a.
        keys_changed: :class:`KeyChange` list.
        tensors_added / tensors_removed: tensor names only in b / only in a.
        tensors_renamed: (name in a, name in b) pairs matched across dialects.
        tensors_changed: :class:`TensorChange` list.
        values: :class:`ValueDiff` list (empty unless ``values=True``).
    """

    a: str
    b: str
    keys_added: tuple[str, ...]
    keys_removed: tuple[str, ...]
    keys_changed: tuple[KeyChange, ...]
    tensors_added: tuple[str, ...]
    tensors_removed: tuple[str, ...]
    tensors_renamed: tuple[tuple[str, str], ...]
    tensors_changed: tuple[TensorChange, ...]
    values: tuple[ValueDiff, ...] = ()

    @property
    def identical(self) -> bool:
        """No key or tensor difference (and no value difference when values were compared)."""
        return not (self.keys_added or self.keys_removed or self.keys_changed or self.tensors_added
                    or self.tensors_removed or self.tensors_renamed or self.tensors_changed
                    or any(not v.identical for v in self.values))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=_default))


def _default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def _summary(v: Any) -> Any:
    """A short, JSON-able form of a key value (arrays: length and first items)."""
    if hasattr(v, "to_list") and hasattr(v, "__len__"):
        n = len(v)
        head = v[: min(n, 4)]
        return {"length": n, "first": [x if not hasattr(x, "to_list") else "[…]" for x in head]}
    if isinstance(v, np.generic):
        return v.item()
    return v


def string_array_bytes(v: Any) -> bytes | None:
    """The raw bytes of a GGUF string array's elements, length fields included (equal bytes <=> equal
    string lists); None when ``v`` is not a string ``ArrayValue`` of inspector/gguf.py."""
    offs = getattr(v, "_elem_offsets", None)
    src = getattr(v, "_file", None)
    if offs is None or src is None or len(offs) == 0:
        return None
    mm = src.mm
    last = int(offs[-1])
    n_last = int.from_bytes(bytes(mm[last:last + 8]), "little")
    return bytes(mm[int(offs[0]):last + 8 + n_last])


def _values_equal(va: Any, vb: Any) -> bool:
    arr_a, arr_b = hasattr(va, "to_list"), hasattr(vb, "to_list")
    if arr_a != arr_b:
        return False
    if not arr_a:
        if isinstance(va, float) and isinstance(vb, float):
            return va == vb or (np.isnan(va) and np.isnan(vb))
        return type(va) is type(vb) and va == vb
    if len(va) != len(vb) or va.element_type != vb.element_type:
        return False
    ra, rb = string_array_bytes(va), string_array_bytes(vb)
    if ra is not None and rb is not None:
        return ra == rb
    try:
        return bool(np.array_equal(va.to_numpy(), vb.to_numpy()))
    except Exception:  # noqa: BLE001 - strings / nested arrays: fall back to decoded lists
        return va.to_list() == vb.to_list()


def _row_rel_err(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    x = x.reshape(x.shape[0], -1).astype(np.float64)
    y = y.reshape(y.shape[0], -1).astype(np.float64)
    num = np.linalg.norm(x - y, axis=1)
    den = np.maximum(np.linalg.norm(x, axis=1), np.linalg.norm(y, axis=1))
    return np.divide(num, den, out=np.zeros_like(num), where=den > 0)


def diff(a: Any, b: Any, values: bool = False, n_rows: int = 16, match_dialects: bool = True) -> GGUFDiff:
    """Compare two GGUF files.

    Args:
        a / b: paths or open ``GGUFFile`` objects.
        values: also compare sampled tensor values.
        n_rows: rows sampled per tensor (evenly spaced over numpy ``shape[0]``; 1-D tensors are compared
            whole).
        match_dialects: match fork / upstream names of the same tensor and report them as renamed; the
            ``general.architecture``-prefixed keys are then compared by suffix too.

    Raises:
        GGUFFormatError / UnsupportedFileError / TensorDataError: an unreadable file.
        InspectorError: ``n_rows < 1`` with ``values``.
    """
    from mtpscope.errors import InspectorError
    from mtpscope.inspector.gguf import open_gguf

    if values and n_rows < 1:
        raise InspectorError("rows sampled per tensor must be positive", key="n_rows", expected=">= 1",
                             actual=n_rows)
    fa = a if hasattr(a, "tensors") else open_gguf(a)
    fb = b if hasattr(b, "tensors") else open_gguf(b)
    arch_a, arch_b = fa.architecture or "", fb.architecture or ""

    def norm_key(k: str, arch: str) -> str:
        if match_dialects and arch and k.startswith(arch + "."):
            return "{arch}." + k[len(arch) + 1:]
        return k

    ka = {norm_key(k, arch_a): (k, kv.value) for k, kv in fa.kv.items()}
    kb = {norm_key(k, arch_b): (k, kv.value) for k, kv in fb.kv.items()}
    added = tuple(kb[k][0] for k in kb if k not in ka)
    removed = tuple(ka[k][0] for k in ka if k not in kb)
    changed = tuple(KeyChange(ka[k][0] if ka[k][0] == kb[k][0] else f"{ka[k][0]} | {kb[k][0]}",
                              _summary(ka[k][1]), _summary(kb[k][1]))
                    for k in ka if k in kb and not _values_equal(ka[k][1], kb[k][1]))

    ta = {t.name: t for t in fa.tensors}
    tb = {t.name: t for t in fb.tensors}
    renamed: list[tuple[str, str]] = []
    pairs: list[tuple[str, str]] = [(n, n) for n in ta if n in tb]
    only_a = [n for n in ta if n not in tb]
    only_b = [n for n in tb if n not in ta]
    if match_dialects:
        inv = {v: k for k, v in RENAMES.items()}
        for n in list(only_a):
            other = RENAMES.get(n) or inv.get(n)
            if other is not None and other in only_b:
                renamed.append((n, other))
                pairs.append((n, other))
                only_a.remove(n)
                only_b.remove(other)
    tchanged = tuple(TensorChange(na if na == nb else f"{na} | {nb}", ta[na].type_name, tb[nb].type_name,
                                  tuple(ta[na].ne), tuple(tb[nb].ne))
                     for na, nb in pairs
                     if ta[na].type_name != tb[nb].type_name or tuple(ta[na].ne) != tuple(tb[nb].ne))
    vals: list[ValueDiff] = []
    if values:
        for na, nb in pairs:
            x, y = ta[na], tb[nb]
            if tuple(x.ne) != tuple(y.ne) or x.n_bytes is None or y.n_bytes is None:
                continue
            shape = x.shape or (1,)
            total = shape[0]
            if len(shape) == 1:
                xa = np.asarray(fa.tensor_data(na), dtype=np.float64)[None, :]
                ya = np.asarray(fb.tensor_data(nb), dtype=np.float64)[None, :]
                sampled = 1
            else:
                idx = np.unique(np.linspace(0, total - 1, num=min(n_rows, total)).round().astype(np.int64))
                xa = np.stack([np.asarray(fa.tensor_data(na, rows=int(i)), dtype=np.float64) for i in idx])
                ya = np.stack([np.asarray(fb.tensor_data(nb, rows=int(i)), dtype=np.float64) for i in idx])
                sampled = len(idx)
            rel = _row_rel_err(xa, ya)
            vals.append(ValueDiff(na if na == nb else f"{na} | {nb}", sampled, total, float(rel.max()),
                                  float(rel.mean()), bool(np.array_equal(xa, ya))))
    return GGUFDiff(str(getattr(fa, "path", a)), str(getattr(fb, "path", b)), added, removed, changed,
                    tuple(only_b), tuple(only_a), tuple(renamed), tchanged, tuple(vals))


def summarize(d: GGUFDiff) -> Mapping[str, int]:
    """Counts per category (for one-line CLI output)."""
    return {"keys_added": len(d.keys_added), "keys_removed": len(d.keys_removed),
            "keys_changed": len(d.keys_changed), "tensors_added": len(d.tensors_added),
            "tensors_removed": len(d.tensors_removed), "tensors_renamed": len(d.tensors_renamed),
            "tensors_changed": len(d.tensors_changed),
            "values_differ": sum(1 for v in d.values if not v.identical)}
