"""Bad input: a corpus of mutants of a valid GGUF, each must raise one typed InspectorError that names the
file and the offset (or key), never a traceback of another kind, a hang, or a big allocation.

The valid file is written here byte by byte with ``struct`` (not by our reader, not by gguf-py), so the
offsets every mutation targets are known independently of the code under test.
"""

from __future__ import annotations

import struct
import tempfile
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtpscope.cli.inspect import inspect_report
from mtpscope.errors import GGUFFormatError, InspectorError, TensorDataError, UnsupportedFileError
from mtpscope.inspector import build_inventory, open_gguf

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?", U64: "Q", I64: "q",
        F64: "d"}


@dataclass
class Built:
    """A GGUF written by hand plus the absolute offset of every field (``marks``)."""

    data: bytearray = field(default_factory=bytearray)
    marks: dict[str, int] = field(default_factory=dict)

    def mark(self, name: str) -> None:
        self.marks[name] = len(self.data)

    def put(self, fmt: str, *v: Any) -> None:
        self.data += struct.pack("<" + fmt, *v)

    def string(self, name: str, s: str | bytes) -> None:
        b = s.encode() if isinstance(s, str) else s
        self.mark(name + ".len")
        self.put("Q", len(b))
        self.mark(name + ".bytes")
        self.data += b

    def value(self, name: str, vtype: int, v: Any) -> None:
        self.mark(name)
        if vtype == STR:
            self.string(name, v)
        elif vtype == ARR:
            etype, items = v
            self.mark(name + ".etype")
            self.put("I", etype)
            self.mark(name + ".n")
            self.put("Q", len(items))
            for j, item in enumerate(items):
                self.value(f"{name}[{j}]", etype, item)
        else:
            self.put(_FMT[vtype], v)


KVS: list[tuple[str, int, Any]] = [
    ("general.architecture", STR, "gemma4_assistant"),
    ("general.alignment", U32, 32),
    ("x.u32", U32, 7),
    ("x.f64", F64, 2.5),
    ("x.strs", ARR, (STR, ["ab", "", "cde"])),
    ("x.f32s", ARR, (F32, [1.0, 2.0])),
    ("x.nested", ARR, (ARR, [(I32, [1, 2]), (I32, [3])])),
]
# name, ne, ggml type, data bytes
TENSORS: list[tuple[str, tuple[int, ...], int]] = [
    ("mtp.pre_projection.weight", (8, 4), 0),   # F32, 128 bytes
    ("output_norm.weight", (16,), 0),           # F32, 64 bytes
    ("blk.0.attn_q.weight", (32, 2), 8),        # Q8_0, 2 blocks of 34 bytes = 68
]


def _nbytes(ne: tuple[int, ...], gt: int) -> int:
    n = int(np.prod(ne))
    return n * 4 if gt == 0 else n // 32 * 34


def build(version: int = 3, kvs: list[tuple[str, int, Any]] | None = None,
          tensors: list[tuple[str, tuple[int, ...], int]] | None = None) -> Built:
    kvs = KVS if kvs is None else kvs
    tensors = TENSORS if tensors is None else tensors
    nbytes = [_nbytes(ne, gt) for _, ne, gt in tensors]
    b = Built()
    b.data += b"GGUF"
    b.mark("version")
    b.put("I", version)
    b.mark("n_tensors")
    b.put("Q", len(tensors))
    b.mark("n_kv")
    b.put("Q", len(kvs))
    for i, (k, vt, v) in enumerate(kvs):
        b.mark(f"kv{i}")
        b.string(f"kv{i}.key", k)
        b.mark(f"kv{i}.type")
        b.put("I", vt)
        b.value(f"kv{i}.value", vt, v)
    rel = 0
    rels = []
    for i, (name, ne, gt) in enumerate(tensors):
        b.mark(f"t{i}")
        b.string(f"t{i}.name", name)
        b.mark(f"t{i}.n_dims")
        b.put("I", len(ne))
        for j, d in enumerate(ne):
            b.mark(f"t{i}.ne{j}")
            b.put("Q", d)
        b.mark(f"t{i}.type")
        b.put("I", gt)
        b.mark(f"t{i}.offset")
        b.put("Q", rel)
        rels.append(rel)
        rel += -(-nbytes[i] // 32) * 32
    b.mark("header_end")
    b.data += bytes(-len(b.data) % 32)
    b.mark("data")
    rng = np.random.default_rng(0)
    for i, r in enumerate(rels):
        b.data += bytes(b.marks["data"] + r - len(b.data))
        b.mark(f"t{i}.data")
        if tensors[i][2] == 8:  # Q8_0 block: f16 scale + 32 int8
            for _ in range(nbytes[i] // 34):
                b.data += np.float16(0.5).tobytes() + rng.integers(-127, 127, 32, dtype=np.int8).tobytes()
        else:
            b.data += rng.standard_normal(nbytes[i] // 4).astype("<f4").tobytes()
    b.mark("end")
    return b


def _write(tmp_path: Path, data: bytes | bytearray, name: str = "m.gguf") -> Path:
    p = tmp_path / name
    p.write_bytes(bytes(data))
    return p


def _u64(b: Built, mark: str, v: int) -> bytearray:
    d = bytearray(b.data)
    struct.pack_into("<Q", d, b.marks[mark], v)
    return d


def _u32(b: Built, mark: str, v: int) -> bytearray:
    d = bytearray(b.data)
    struct.pack_into("<I", d, b.marks[mark], v)
    return d


# --------------------------------------------------------------------------------------- the base


def test_base_file_is_valid(tmp_path: Path) -> None:
    b = build()
    f = open_gguf(_write(tmp_path, b.data))
    assert f.get("x.strs").to_list() == ["ab", "", "cde"]
    assert f.get("x.nested").to_list() == [[1, 2], [3]]
    assert [t.offset for t in f.tensors] == [b.marks[f"t{i}.data"] for i in range(3)]
    assert f.data_offset == b.marks["data"] and f.header_end == b.marks["header_end"]
    assert [kv.offset for kv in f.kv.values()] == [b.marks[f"kv{i}"] for i in range(len(KVS))]
    assert f.tensors[2].n_bytes == 68


# ------------------------------------------------------------------------------------- truncation


def test_truncation_at_every_byte(tmp_path: Path) -> None:
    b = build()
    header_end, end = b.marks["header_end"], b.marks["end"]
    for cut in range(end):
        p = _write(tmp_path, b.data[:cut])
        with pytest.raises(InspectorError) as e:
            open_gguf(p)
        err = e.value
        assert err.path == str(p), cut
        assert err.offset is not None, cut
        if cut < header_end:
            assert isinstance(err, GGUFFormatError), (cut, err)
            assert 0 <= err.offset <= cut, (cut, err)
        else:
            # names the first tensor whose data the cut removes, at its data offset
            first = next(i for i in range(3) if b.marks[f"t{i}.data"] + [128, 64, 68][i] > cut)
            assert err.offset == b.marks[f"t{first}.data"], (cut, err)
            assert isinstance(err, TensorDataError) and "outside the file" in err.message, (cut, err)


@pytest.mark.parametrize("mark", ["n_tensors", "n_kv", "kv0.key.len", "kv0.type", "kv0.value.len",
                                  "kv4.value.etype", "kv4.value.n", "kv4.value[1].len", "kv6.value[1].n",
                                  "t0.name.len", "t0.n_dims", "t1.ne0", "t2.type", "t2.offset"])
def test_truncation_at_field_boundaries_names_the_field(tmp_path: Path, mark: str) -> None:
    b = build()
    cut = b.marks[mark]
    with pytest.raises(GGUFFormatError, match="file ends early|past the end|exceeds what") as e:
        open_gguf(_write(tmp_path, b.data[:cut]))
    assert e.value.offset is not None and e.value.offset <= cut
    assert e.value.expected is not None and e.value.actual is not None


# ------------------------------------------------------------------------------ magic and version


def test_bad_magic(tmp_path: Path) -> None:
    d = bytearray(build().data)
    d[0:4] = b"GGML"
    with pytest.raises(GGUFFormatError, match="magic") as e:
        open_gguf(_write(tmp_path, d))
    assert e.value.offset == 0 and e.value.actual == b"GGML"


@pytest.mark.parametrize("version", [0, 1, 4, 1000])
def test_unsupported_version(tmp_path: Path, version: int) -> None:
    with pytest.raises(UnsupportedFileError, match="version") as e:
        open_gguf(_write(tmp_path, build(version).data))
    assert e.value.offset == 4 and e.value.actual == version


def test_big_endian_detected(tmp_path: Path) -> None:
    d = bytearray(build().data)
    d[4:8] = struct.pack(">I", 3)
    with pytest.raises(UnsupportedFileError, match="big-endian"):
        open_gguf(_write(tmp_path, d))


# ----------------------------------------------------------------------- impossible counts / lengths

HUGE = 2**63


@pytest.mark.parametrize(("mark", "width", "value", "err_mark"), [
    ("n_tensors", 8, HUGE, "n_tensors"),
    ("n_kv", 8, HUGE, "n_kv"),
    ("n_kv", 8, 2**64 - 1, "n_kv"),
    ("kv0.key.len", 8, HUGE, "kv0.key.len"),
    ("kv0.value.len", 8, HUGE, "kv0.value.len"),
    ("kv0.value.len", 8, 10_000, "kv0.value.len"),             # a string past the end
    ("kv5.value.n", 8, HUGE, "kv5.value.n"),                   # numeric array length
    ("kv5.value.n", 8, 10_000, "kv5.value.n"),
    ("kv4.value.n", 8, HUGE, "kv4.value.n"),                   # string-array length
    ("kv4.value[1].len", 8, HUGE, "kv4.value[1].len"),         # one string of an array
    ("kv4.value[2].len", 8, 2**64 - 1, "kv4.value[2].len"),
    ("kv6.value.n", 8, HUGE, "kv6.value.n"),                   # array of arrays
    ("kv6.value[0].n", 8, HUGE, "kv6.value[0].n"),
    ("t0.name.len", 8, HUGE, "t0.name.len"),
    ("t1.n_dims", 4, 5, "t1.n_dims"),
    ("t1.n_dims", 4, 2**32 - 1, "t1.n_dims"),
    ("t1.ne0", 8, HUGE, "t1.ne0"),
    ("t0.ne1", 8, 2**62, "t0.ne0"),                            # 8 * 2**62 elements > INT64_MAX
])
def test_impossible_counts(tmp_path: Path, mark: str, width: int, value: int, err_mark: str) -> None:
    b = build()
    d = _u64(b, mark, value) if width == 8 else _u32(b, mark, value)
    p = _write(tmp_path, d)
    tracemalloc.start()
    try:
        with pytest.raises(GGUFFormatError) as e:
            open_gguf(p)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000 and peak < 100 * len(d)  # no allocation sized by the bogus count
    err = e.value
    assert err.path == str(p)
    if err_mark in ("n_tensors", "n_kv", "t1.n_dims"):
        assert err.offset == b.marks[err_mark]
    else:
        # the offset named is the field's, or the start of the record it belongs to
        assert err.offset in (b.marks[err_mark], b.marks[err_mark] - 4, b.marks[err_mark] - 8), err
    assert err.actual is not None and err.expected is not None


# ---------------------------------------------------------------------------------- bad values


@pytest.mark.parametrize(("mark", "value", "what"), [
    ("kv2.type", 13, "unknown value type"),
    ("kv2.type", 2**32 - 1, "unknown value type"),
    ("kv5.value.etype", 13, "unknown array element type"),
    ("kv6.value[1].etype", 99, "unknown array element type"),
])
def test_unknown_value_types(tmp_path: Path, mark: str, value: int, what: str) -> None:
    b = build()
    with pytest.raises(GGUFFormatError, match=what) as e:
        open_gguf(_write(tmp_path, _u32(b, mark, value)))
    assert e.value.offset == b.marks[mark] and e.value.actual == value


def test_duplicate_key(tmp_path: Path) -> None:
    b = build()
    d = bytearray(b.data)
    at = b.marks["kv3.key.bytes"]
    d[at:at + 5] = b"x.u32"  # "x.f64" -> "x.u32"
    with pytest.raises(GGUFFormatError, match="duplicate key") as e:
        open_gguf(_write(tmp_path, d))
    assert e.value.key == "x.u32" and e.value.offset == b.marks["kv3"]


def test_invalid_utf8_key_and_tensor_name(tmp_path: Path) -> None:
    b = build()
    d = bytearray(b.data)
    d[b.marks["kv2.key.bytes"] + 1] = 0xFF
    with pytest.raises(GGUFFormatError, match="UTF-8") as e:
        open_gguf(_write(tmp_path, d))
    assert e.value.offset == b.marks["kv2.key.bytes"] + 1
    d = bytearray(b.data)
    d[b.marks["t1.name.bytes"]] = 0xC3  # a lead byte without its continuation
    with pytest.raises(GGUFFormatError, match="UTF-8"):
        open_gguf(_write(tmp_path, d))


def test_invalid_utf8_in_a_lazy_string_raises_on_access(tmp_path: Path) -> None:
    b = build()
    d = bytearray(b.data)
    d[b.marks["kv4.value[2].bytes"]] = 0xFF
    f = open_gguf(_write(tmp_path, d))  # the walk only checks structure
    assert f.get("x.strs")[0] == "ab"
    with pytest.raises(GGUFFormatError, match="UTF-8") as e:
        f.get("x.strs").to_list()
    assert e.value.offset == b.marks["kv4.value[2].bytes"] and e.value.key == "x.strs"


@pytest.mark.parametrize(("value", "vtype"), [(0, U32), (48, U32), (2**31 + 1, U32), (32, U64), (32, I32)])
def test_bad_alignment(tmp_path: Path, value: int, vtype: int) -> None:
    kvs = list(KVS)
    kvs[1] = ("general.alignment", vtype, value)
    b = build(kvs=kvs)
    with pytest.raises(GGUFFormatError, match="alignment") as e:
        open_gguf(_write(tmp_path, b.data))
    assert e.value.key == "general.alignment" and e.value.offset == b.marks["kv1"]


# ------------------------------------------------------------------------------- tensor records


def test_misaligned_tensor_data(tmp_path: Path) -> None:
    b = build()
    with pytest.raises(TensorDataError, match="not aligned") as e:
        open_gguf(_write(tmp_path, _u64(b, "t1.offset", 128 + 4)))
    assert e.value.key == "output_norm.weight" and e.value.offset == b.marks["data"] + 132


def test_overlapping_tensor_data(tmp_path: Path) -> None:
    b = build()
    with pytest.raises(TensorDataError, match="overlaps") as e:
        open_gguf(_write(tmp_path, _u64(b, "t1.offset", 64)))  # inside t0's [0, 128)
    assert e.value.key == "output_norm.weight" and "mtp.pre_projection.weight" in e.value.message
    assert e.value.offset == b.marks["data"] + 64


@pytest.mark.parametrize("rel", [4096, 2**62, 2**64 - 32])
def test_tensor_data_outside_file(tmp_path: Path, rel: int) -> None:
    b = build()
    with pytest.raises(TensorDataError, match="outside the file") as e:
        open_gguf(_write(tmp_path, _u64(b, "t2.offset", rel)))
    assert e.value.key == "blk.0.attn_q.weight" and e.value.offset == b.marks["data"] + rel


def test_duplicate_tensor_names(tmp_path: Path) -> None:
    tensors = list(TENSORS)
    tensors[1] = (TENSORS[0][0], TENSORS[1][1], TENSORS[1][2])  # tensor 1 named like tensor 0
    b = build(tensors=tensors)
    with pytest.raises(GGUFFormatError, match="duplicate tensor name") as e:
        open_gguf(_write(tmp_path, b.data))
    assert e.value.key == "mtp.pre_projection.weight" and e.value.offset == b.marks["t1"]


def test_zero_sized_dimension(tmp_path: Path) -> None:
    b = build()
    with pytest.raises(GGUFFormatError, match="zero-sized") as e:
        open_gguf(_write(tmp_path, _u64(b, "t0.ne1", 0)))
    assert e.value.key == "mtp.pre_projection.weight" and e.value.offset == b.marks["t0.ne1"]


def test_row_not_multiple_of_block(tmp_path: Path) -> None:
    b = build()
    with pytest.raises(GGUFFormatError, match="block size") as e:
        open_gguf(_write(tmp_path, _u64(b, "t2.ne0", 16)))  # Q8_0 rows hold 32-element blocks
    assert e.value.key == "blk.0.attn_q.weight" and e.value.expected == "a multiple of 32"


def test_nesting_too_deep(tmp_path: Path) -> None:
    data = bytearray(b"GGUF") + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<I", ARR)
    for _ in range(5000):  # 5000 levels of one-element arrays of arrays
        data += struct.pack("<IQ", ARR, 1)
    data += struct.pack("<IQ", U8, 0)
    with pytest.raises(GGUFFormatError, match="nested too deeply"):
        open_gguf(_write(tmp_path, data))


# ------------------------------------------------------------------------------ property based


def _exercise(path: Path) -> None:
    """Open and use everything; only InspectorError may escape."""
    f = open_gguf(path)
    for kv in f.kv.values():
        v = kv.value
        if hasattr(v, "to_list"):
            v.to_list()
            if len(v):
                v[0], v[-1]
            if v.element_type not in (STR, ARR):
                v.to_numpy()
    inv = build_inventory(f)
    assert len(inv.entries) == len(f.tensors)
    for t in f.tensors:
        if t.n_bytes is None:
            continue
        f.tensor_data(t.name)
        f.tensor_data(t.name, rows=slice(0, 1), dequantize=False)
    inspect_report(path)


BASE = bytes(build().data)
HEADER_END = build().marks["header_end"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flips=st.lists(st.tuples(st.integers(0, HEADER_END - 1), st.integers(0, 255)), min_size=1, max_size=8),
       cut=st.one_of(st.none(), st.integers(0, len(BASE))))
def test_random_byte_flips_raise_only_inspector_errors(flips: list[tuple[int, int]], cut: int | None) -> None:
    d = bytearray(BASE)
    for pos, val in flips:
        d[pos] = val
    if cut is not None:
        d = d[:cut]
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "flip.gguf"
        p.write_bytes(bytes(d))
        try:
            _exercise(p)
        except InspectorError as e:
            assert e.path == str(p)


@settings(max_examples=150, deadline=None)
@given(data=st.binary(min_size=0, max_size=300))
def test_random_bytes_after_magic(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "r.gguf"
        p.write_bytes(b"GGUF\x03\x00\x00\x00" + data)
        try:
            _exercise(p)
        except InspectorError:
            pass


def test_many_nested_arrays_stay_compact(tmp_path: Path) -> None:
    n = 30_000  # an array of 30k empty arrays: 12 bytes each in the file
    data = bytearray(b"GGUF") + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"k"
    data += struct.pack("<IIQ", ARR, ARR, n) + struct.pack("<IQ", U8, 0) * n
    p = _write(tmp_path, data)
    tracemalloc.start()
    try:
        f = open_gguf(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < len(data)  # no Python object per element
    a = f.get("k")
    assert len(a) == n and a[n - 1].to_list() == [] and a[7].element_type_name == "UINT8"


def test_fifo_and_devices_are_refused_without_opening(tmp_path) -> None:
    """Opening a FIFO blocks until a writer appears; the reader must refuse it (and devices) first."""
    import os

    from mtpscope.errors import GGUFFormatError
    from mtpscope.inspector.gguf import open_gguf

    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    for p, kind in ((fifo, "a FIFO"), ("/dev/zero", "a device"), (tmp_path, "a directory")):
        with pytest.raises(GGUFFormatError) as e:
            open_gguf(p)
        assert e.value.actual == kind and str(p) in str(e.value)


def test_a_header_cut_short_says_the_file_ends_early(tmp_path: Path) -> None:
    """A file cut at byte 30 ends inside key 0's length field (8 bytes at offset 24, 6 of them present): the error
    says the file ends early there, naming the file and that offset (was: "key/value count exceeds what the file
    can hold" at offset 16, blaming a count that is right). No cut inside the header blames a count."""
    b = build()
    p = _write(tmp_path, b.data[:30])
    with pytest.raises(GGUFFormatError) as e:
        open_gguf(p)
    err = e.value
    assert err.message.startswith("file ends early") and "byte 30" in err.message, err
    assert (err.path, err.offset) == (str(p), b.marks["kv0.key.len"]) and b.marks["kv0.key.len"] == 24
    assert (err.expected, err.actual) == ("8 bytes", "6 bytes left")
    assert err.one_line().startswith(f"{p}: at offset 24: file ends early")
    # cut inside key 0's text ("general.architecture", 20 bytes after its length): the string is cut short
    p = _write(tmp_path, b.data[:b.marks["kv0.key.bytes"] + 5], "k.gguf")
    with pytest.raises(GGUFFormatError, match="file ends early") as e:
        open_gguf(p)
    assert e.value.offset == b.marks["kv0.key.len"]
    for cut in range(24, b.marks["header_end"]):
        p = _write(tmp_path, b.data[:cut], "c.gguf")
        with pytest.raises(GGUFFormatError) as e:
            open_gguf(p)
        assert "count exceeds" not in e.value.message, (cut, e.value)
