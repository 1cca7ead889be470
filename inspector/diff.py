"""Difference between two GGUF files: metadata keys, tensor table, tensor data, and optionally sampled values.

``diff(a, b)`` -> :class:`GGUFDiff`. Keys are compared by decoded value (arrays: length, then elements;
string arrays such as the 262144-token vocabulary compare their raw bytes first). Tensors are matched by
name; with ``match_dialects`` the fork / upstream names of the same tensor (``mtp.pre_projection.weight`` ↔
``nextn.pre_projection.weight``) are matched and reported as renamed.

Tensor data is compared by default, byte for byte in the files' own encoding (quantized blocks undecoded),
for every tensor present in both with the same type and shape, read through the memory map (never a whole
big tensor at once): ``data="sampled"`` (default) compares a tensor of at most :data:`WHOLE_BYTES` whole and
a larger one on :data:`SAMPLE_ROWS` rows of its outermost numpy dimension, in :data:`SAMPLE_RUNS` runs of
consecutive rows evenly spaced from the first row to the last (:func:`sample_rows_of`), so the cost is
bounded per tensor whatever the file size (a 20 GB model: tens of MB read, a few seeks per tensor);
``data="whole"`` compares every byte; ``data="none"`` compares no data. Each compared tensor gets a
blake2b digest of the bytes compared in each file (:class:`DataCompare`), and :class:`Compared` says what
was compared. Files read over HTTP (header only) have their data left out, said so.

With ``values`` a relative-error summary is computed on up to ``n_rows`` evenly spaced rows (outermost
numpy dimension) of every tensor present in both with the same shape:
``rel = ||a − b||₂ / max(||a||₂, ||b||₂)`` per row (0 when both rows are zero; at most 2), reported as max
and mean over the sampled rows (values dequantized, computed in float64): how much, where the data
comparison says whether. A row holding NaN or Inf in either file has no such norm: it counts 0 when both files
hold the same values there, else 2, the largest (it was 0 whatever the other file held), and is counted apart.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mtpscope.inspector.layouts import FORK_TO_UPSTREAM

#: a fork-dialect tensor's upstream name (:data:`inspector.layouts.FORK_TO_UPSTREAM`)
RENAMES = FORK_TO_UPSTREAM


@dataclass(frozen=True)
class KeyChange:
    """A metadata key whose value or GGUF value type differs. ``a`` / ``b`` are short, JSON-able summaries;
    ``a_type`` / ``b_type`` the value types (``UINT32``; ``ARRAY[INT32]`` for an array): the same value in another type
    is a change (llama.cpp refuses e.g. a block count stored as INT32)."""

    key: str
    a: Any
    b: Any
    a_type: str = ""
    b_type: str = ""


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
    """Relative error of sampled rows of one tensor (``rel = ||a−b|| / max(||a||, ||b||)`` per row; rows: the
    outermost numpy dimension, a 1-D tensor being one row)."""

    name: str
    rows_sampled: int
    rows_total: int
    rel_err_max: float
    rel_err_mean: float
    identical: bool
    rows_nonfinite: int = 0     # sampled rows holding NaN / Inf in either file (:func:`row_rel_err`: 0 or 2)


#: Tensors of at most this many bytes have their data compared whole with ``data="sampled"``.
WHOLE_BYTES = 1 << 20
#: Rows (outermost numpy dimension) compared per larger tensor with ``data="sampled"``.
SAMPLE_ROWS = 32
#: Runs of consecutive rows the sampled rows come in (one read each).
SAMPLE_RUNS = 4
#: Bytes of each file read per step when a tensor is compared whole (bounds the memory of a comparison).
CHUNK_BYTES = 16 << 20
#: The ``data`` modes of :func:`diff`.
DATA_MODES = ("sampled", "whole", "none")


@dataclass(frozen=True)
class DataCompare:
    """One tensor's data compared byte for byte (each file's encoding; quantized blocks undecoded).

    Attributes:
        name: the tensor (``a | b`` for a renamed pair).
        rows_compared / rows_total: rows of the outermost numpy dimension compared / in the tensor (a 1-D
            tensor counts as one row).
        bytes_compared: bytes compared in each file.
        same: every compared byte is equal.
        first_diff_row: the first compared row whose bytes differ (None when ``same``).
        digest_a / digest_b: blake2b (128-bit, hex) of the compared bytes of each file, rows in order.
    """

    name: str
    rows_compared: int
    rows_total: int
    bytes_compared: int
    same: bool
    first_diff_row: int | None
    digest_a: str
    digest_b: str

    @property
    def whole(self) -> bool:
        """Every row was compared."""
        return self.rows_compared == self.rows_total


@dataclass(frozen=True)
class Compared:
    """What :func:`diff` compared.

    Attributes:
        keys: metadata keys present in both files (compared by value).
        tensors: tensors present in both (compared by type and ``ne``), renamed pairs included.
        data: the data mode (:data:`DATA_MODES`), or ``"none"`` when the data could not be read.
        data_whole / data_sampled: tensors whose data was compared whole / on ``sample_rows`` rows.
        data_skipped: tensors present in both whose data was not compared (type or shape differ, unknown
            type).
        sample_rows: rows compared per sampled tensor.
        bytes_read: tensor bytes read (both files together); bytes_total: tensor data bytes of both files.
        note: why no data was compared (a file read over HTTP), or None.
    """

    keys: int
    tensors: int
    data: str
    data_whole: int = 0
    data_sampled: int = 0
    data_skipped: tuple[str, ...] = ()
    sample_rows: int = SAMPLE_ROWS
    bytes_read: int = 0
    bytes_total: int = 0
    note: str | None = None

    def line(self) -> str:
        """What was compared, in one line."""
        head = (f"compared: {self.keys} metadata key{'' if self.keys == 1 else 's'}, {self.tensors} "
                f"tensor{'' if self.tensors == 1 else 's'} (names, types, shapes)")
        if self.data == "none":
            return head + "; tensor bytes not compared" + (f" ({self.note})" if self.note else "")
        parts = [f"{self.data_whole} whole"] + ([f"{self.data_sampled} on {self.sample_rows} sampled rows each"]
                                                if self.data_sampled else [])
        skipped = f", {len(self.data_skipped)} not (type or shape differ)" if self.data_skipped else ""
        return (head + f"; tensor bytes: {' + '.join(parts)}{skipped} ({_mib(self.bytes_read)} of "
                f"{_mib(self.bytes_total)} read)")


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


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
        data: :class:`DataCompare` per tensor whose data was compared (``data`` of :func:`diff`).
        compared: :class:`Compared`: what was compared.
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
    data: tuple[DataCompare, ...] = ()
    compared: Compared | None = None

    @property
    def data_differ(self) -> tuple[DataCompare, ...]:
        """The tensors whose compared bytes differ."""
        return tuple(d for d in self.data if not d.same)

    @property
    def identical(self) -> bool:
        """No key or tensor difference, no compared tensor byte different (and no value difference when
        values were compared). What was compared: :attr:`compared`."""
        return not (self.keys_added or self.keys_removed or self.keys_changed or self.tensors_added
                    or self.tensors_removed or self.tensors_renamed or self.tensors_changed
                    or self.data_differ or any(not v.identical for v in self.values))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        out: dict[str, Any] = json.loads(json.dumps(dataclasses.asdict(self), default=_default))
        return out


def _default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def value_type_words(kv: Any) -> str:
    """A key's GGUF value type as :class:`KeyChange` names it: ``UINT32``, ``STRING``; an array with its elements'
    type, ``ARRAY[INT32]``."""
    from mtpscope.inspector.gguf import value_type_name

    name = str(getattr(kv, "type_name", ""))
    et = getattr(kv.value, "element_type", None)
    return f"{name}[{value_type_name(et)}]" if name == "ARRAY" and isinstance(et, int) else name


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
        return bool(va.to_list() == vb.to_list())


def row_rel_err(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per row ``||x - y||_2 / max(||x||_2, ||y||_2)`` in float64 (0 where both rows are zero; at most 2): the
    relative error the sampled comparison reports. A row holding NaN or Inf in either input has no norm: 0 when
    both hold the same values (NaN equal to NaN), else 2, the largest. Shapes: ``(n_rows, ...)`` each, rows
    flattened."""
    x = x.reshape(x.shape[0], -1).astype(np.float64)
    y = y.reshape(y.shape[0], -1).astype(np.float64)
    bad = ~(np.isfinite(x).all(axis=1) & np.isfinite(y).all(axis=1))
    xf, yf = np.where(bad[:, None], 0.0, x), np.where(bad[:, None], 0.0, y)   # no inf - inf, no NaN norms
    num = np.linalg.norm(xf - yf, axis=1)
    den = np.maximum(np.linalg.norm(xf, axis=1), np.linalg.norm(yf, axis=1))
    out: np.ndarray = np.divide(num, den, out=np.zeros_like(num), where=den > 0)
    for i in np.flatnonzero(bad):
        out[i] = 0.0 if np.array_equal(x[i], y[i], equal_nan=True) else 2.0
    return out


def _raw_rows(f: Any, name: str, shape: tuple[int, ...], r0: int, r1: int) -> np.ndarray:
    """Rows ``r0:r1`` (outermost numpy dimension) of a tensor as bytes, shape (rows, bytes per row): a view
    of the memory map for plain and quantized types alike. A 1-D tensor is one row (read whole)."""
    if len(shape) <= 1:
        raw = np.asarray(f.tensor_data(name, dequantize=False))
        return np.ascontiguousarray(raw).reshape(1, -1).view(np.uint8)
    raw = np.ascontiguousarray(f.tensor_data(name, rows=slice(r0, r1), dequantize=False))
    return raw.reshape(r1 - r0, -1).view(np.uint8)


def compare_data(fa: Any, fb: Any, na: str, nb: str, rows: np.ndarray | None = None,
                 chunk_bytes: int = CHUNK_BYTES) -> DataCompare:
    """Compare the bytes of tensor ``na`` of ``fa`` and ``nb`` of ``fb`` (same type and shape), through the
    memory map.

    Args:
        fa / fb: open GGUF readers (``GGUFLike`` of local files).
        na / nb: the tensor's name in each.
        rows: sorted distinct row indices (outermost numpy dimension) to compare; None compares every row,
            ``chunk_bytes`` of each file at a time.

    Returns:
        :class:`DataCompare` (digests over the compared rows, in order).
    """
    t = fa.tensor(na)
    shape = tuple(int(x) for x in t.shape) or (1,)
    total = shape[0] if len(shape) > 1 else 1
    per_row = max(1, (t.n_bytes or 0) // max(1, total))
    ha, hb = hashlib.blake2b(digest_size=16), hashlib.blake2b(digest_size=16)
    first: int | None = None
    n_rows = n_bytes = 0
    if rows is None:
        step = max(1, chunk_bytes // per_row)
        spans = [(r, min(total, r + step)) for r in range(0, total, step)]
    else:  # runs of consecutive sampled rows read together
        idx = [int(i) for i in rows]
        spans, start = [], 0
        for j in range(1, len(idx) + 1):
            if j == len(idx) or idx[j] != idx[j - 1] + 1:
                spans.append((idx[start], idx[j - 1] + 1))
                start = j
    for r0, r1 in spans:
        xa, xb = _raw_rows(fa, na, shape, r0, r1), _raw_rows(fb, nb, shape, r0, r1)
        ha.update(xa.data)
        hb.update(xb.data)
        n_rows += xa.shape[0]
        n_bytes += xa.nbytes
        if first is None and not np.array_equal(xa, xb):
            first = r0 + int(np.flatnonzero((xa != xb).any(axis=1))[0])
    da, db = ha.hexdigest(), hb.hexdigest()
    return DataCompare(na if na == nb else f"{na} | {nb}", n_rows, total, n_bytes, first is None, first, da, db)


def sample_rows_of(total: int, n: int, runs: int = SAMPLE_RUNS) -> np.ndarray:
    """The rows a sampled comparison reads of a tensor of ``total`` rows: about ``n`` rows in ``runs`` runs of
    ``ceil(n / runs)`` consecutive rows, the runs' starts evenly spaced from the first row to the last run
    ending at the last row (sorted, distinct). Runs, not single rows: one read each, so a cold file costs
    ``runs`` seeks per tensor, not ``n``."""
    length = -(-n // max(1, runs))
    if total <= n or length >= total:
        return np.arange(total, dtype=np.int64)
    starts = np.linspace(0, total - length, num=min(runs, total)).round().astype(np.int64)
    return np.unique((starts[:, None] + np.arange(length, dtype=np.int64)[None, :]).ravel())


def diff(a: Any, b: Any, values: bool = False, n_rows: int = SAMPLE_ROWS, match_dialects: bool = True,
         data: str = "sampled", sample_rows: int = SAMPLE_ROWS, whole_bytes: int = WHOLE_BYTES) -> GGUFDiff:
    """Compare two GGUF files: metadata keys, tensor table, tensor data (and optionally value errors).

    Args:
        a / b: paths or open ``GGUFLike`` readers.
        values: also compute the relative error of sampled rows (dequantized; ``n_rows`` rows per tensor, and the
            first row whose bytes differ where the data comparison found one).
        n_rows: rows sampled per tensor with ``values`` (evenly spaced over numpy ``shape[0]``; 1-D tensors
            are compared whole); default :data:`SAMPLE_ROWS`, as many as the byte comparison samples, so that the two
            lines of a tensor name the same count.
        match_dialects: match fork / upstream names of the same tensor and report them as renamed; the
            ``general.architecture``-prefixed keys are then compared by suffix too.
        data: tensor bytes compared: ``"sampled"`` (tensors of at most ``whole_bytes`` whole, larger ones on
            ``sample_rows`` rows: :func:`sample_rows_of`), ``"whole"`` (every byte) or ``"none"``. Files read over
            HTTP have no data compared (:attr:`Compared.note` says so).
        sample_rows: rows compared per larger tensor with ``data="sampled"``.
        whole_bytes: the largest tensor compared whole with ``data="sampled"`` (bytes).

    Returns:
        :class:`GGUFDiff`; its ``compared`` says what was compared.

    Raises:
        GGUFFormatError / UnsupportedFileError / TensorDataError: an unreadable file.
        InspectorError: ``n_rows < 1`` with ``values``, ``sample_rows < 1``, or an unknown ``data`` mode.
    """
    from mtpscope.errors import InspectorError
    from mtpscope.inspector.gguf import open_gguf

    if values and n_rows < 1:
        raise InspectorError("rows sampled per tensor must be positive", key="n_rows", expected=">= 1",
                             actual=n_rows)
    if data not in DATA_MODES:
        raise InspectorError("unknown data comparison", key="data", expected=" | ".join(DATA_MODES), actual=data)
    if sample_rows < 1:
        raise InspectorError("rows compared per tensor must be positive", key="sample_rows", expected=">= 1",
                             actual=sample_rows)
    fa = a if hasattr(a, "tensors") else open_gguf(a)
    fb = b if hasattr(b, "tensors") else open_gguf(b)
    arch_a, arch_b = fa.architecture or "", fb.architecture or ""

    def norm_key(k: str, arch: str) -> str:
        if match_dialects and arch and k.startswith(arch + "."):
            return "{arch}." + k[len(arch) + 1:]
        return k

    ka = {norm_key(k, arch_a): (k, kv.value, value_type_words(kv)) for k, kv in fa.kv.items()}
    kb = {norm_key(k, arch_b): (k, kv.value, value_type_words(kv)) for k, kv in fb.kv.items()}
    added = tuple(kb[k][0] for k in kb if k not in ka)
    removed = tuple(ka[k][0] for k in ka if k not in kb)
    changed = tuple(KeyChange(ka[k][0] if ka[k][0] == kb[k][0] else f"{ka[k][0]} | {kb[k][0]}",
                              _summary(ka[k][1]), _summary(kb[k][1]), ka[k][2], kb[k][2])
                    for k in ka if k in kb and (ka[k][2] != kb[k][2] or not _values_equal(ka[k][1], kb[k][1])))

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
    same_layout = [(na, nb) for na, nb in pairs if ta[na].type_name == tb[nb].type_name
                   and tuple(ta[na].ne) == tuple(tb[nb].ne) and ta[na].n_bytes is not None]
    skipped = tuple(na if na == nb else f"{na} | {nb}" for na, nb in pairs if (na, nb) not in same_layout)
    remote = getattr(fa, "reader", None) is not None or getattr(fb, "reader", None) is not None
    mode = "none" if remote else data
    compares: list[DataCompare] = []
    for na, nb in (same_layout if mode != "none" else ()):
        t = ta[na]
        total = (t.shape[0] if len(t.shape) > 1 else 1) if t.shape else 1
        small = mode == "whole" or (t.n_bytes or 0) <= whole_bytes or total <= sample_rows
        compares.append(compare_data(fa, fb, na, nb, None if small else sample_rows_of(total, sample_rows)))
    compared = Compared(
        keys=sum(1 for k in ka if k in kb), tensors=len(pairs), data=mode,
        data_whole=sum(1 for c in compares if c.whole), data_sampled=sum(1 for c in compares if not c.whole),
        data_skipped=skipped if mode != "none" else (), sample_rows=sample_rows,
        bytes_read=2 * sum(c.bytes_compared for c in compares),
        bytes_total=sum(t.n_bytes or 0 for t in ta.values()) + sum(t.n_bytes or 0 for t in tb.values()),
        note="a file read over HTTP: only its header is here" if remote and data != "none" else None)
    vals: list[ValueDiff] = []
    # the first row whose bytes differ, per tensor: its values are compared too, so that the values never call a
    # tensor identical whose bytes were found to differ (a NaN in a row the even spacing skips)
    first_diff = {c.name: c.first_diff_row for c in compares if c.first_diff_row is not None}
    if values:
        for na, nb in pairs:
            x, y = ta[na], tb[nb]
            if tuple(x.ne) != tuple(y.ne) or x.n_bytes is None or y.n_bytes is None:
                continue
            shape = x.shape or (1,)
            total = shape[0] if len(shape) > 1 else 1          # (a vector is one row, compared whole)
            if len(shape) == 1:
                xa = np.asarray(fa.tensor_data(na), dtype=np.float64)[None, :]
                ya = np.asarray(fb.tensor_data(nb), dtype=np.float64)[None, :]
                sampled = 1
            else:
                idx = np.linspace(0, total - 1, num=min(n_rows, total)).round().astype(np.int64)
                fd = first_diff.get(na if na == nb else f"{na} | {nb}")
                idx = np.unique(np.append(idx, [] if fd is None else [fd]).astype(np.int64))
                xa = np.stack([np.asarray(fa.tensor_data(na, rows=int(i)), dtype=np.float64) for i in idx])
                ya = np.stack([np.asarray(fb.tensor_data(nb, rows=int(i)), dtype=np.float64) for i in idx])
                sampled = len(idx)
            rel = row_rel_err(xa, ya)
            fin = (np.isfinite(xa.reshape(len(xa), -1)).all(axis=1) & np.isfinite(ya.reshape(len(ya), -1)).all(axis=1))
            vals.append(ValueDiff(na if na == nb else f"{na} | {nb}", sampled, total, float(rel.max()),
                                  float(rel.mean()), bool(np.array_equal(xa, ya, equal_nan=True)),
                                  int((~fin).sum())))
    return GGUFDiff(str(getattr(fa, "path", a)), str(getattr(fb, "path", b)), added, removed, changed,
                    tuple(only_b), tuple(only_a), tuple(renamed), tchanged, tuple(vals), tuple(compares), compared)


def summarize(d: GGUFDiff) -> Mapping[str, int]:
    """Counts per category (for one-line CLI output)."""
    return {"keys_added": len(d.keys_added), "keys_removed": len(d.keys_removed),
            "keys_changed": len(d.keys_changed), "tensors_added": len(d.tensors_added),
            "tensors_removed": len(d.tensors_removed), "tensors_renamed": len(d.tensors_renamed),
            "tensors_changed": len(d.tensors_changed), "data_differ": len(d.data_differ),
            "values_differ": sum(1 for v in d.values if not v.identical)}
