"""TraceWriter / traces.open: round trip, hidden states, SQL, crash safety, corrupt parts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from mtpscope import traces
from mtpscope.errors import TraceError, TraceFormatError
from mtpscope.traces import RoundRecord, StepRecord, TraceWriter

ROOT = Path(__file__).resolve().parents[1]


def _round(r: int, n_acc: int) -> RoundRecord:
    drafted = (100 + r, 200 + r, 300 + r)
    target = drafted[:n_acc] + (999,) + (7,) * (3 - n_acc)
    return RoundRecord(prompt_id=r % 2, round=r // 2, pos=50 + r, pending_token=r, n_draft=3,
                       drafted=drafted, n_accepted=n_acc, target=target,
                       emitted=drafted[:n_acc] + (999,), t_draft_ms=1.5 * r, t_verify_ms=10.0 + r)


def _steps(r: int, n_acc: int, hidden: bool = True) -> list[StepRecord]:
    out = []
    for k in (1, 2, 3):
        out.append(StepRecord(
            k=k, token=100 * k + r, logit=float(k), rank=0, top_ids=(100 * k + r, 5), top_logits=(2.0, 1.0),
            target_token=(100 * k + r) if k <= n_acc else (999 if k == n_acc + 1 else 7),
            target_rank=0 if k <= n_acc else 3, accepted=k <= n_acc,
            h=np.full(6, r * 10 + k, dtype=np.float32) if hidden else None,
            h_next=None,
            h_inner=np.arange(4, dtype=np.float32) * k if hidden else None,
            centroid_ids=(k, k + 1), centroid_logits=(0.5, 0.25), centroid_token=100 * k + r,
            target_in_candidates=k != 3, target_centroid=k, target_centroid_rank=0))
    return out


ACC = [3, 0, 1, 2, 3, 0, 0]


def _write(d: Path, flush_every: int = 3, hidden_dtype: str | None = "f32", compact: bool = False) -> None:
    with TraceWriter(d, {"source": "record", "prompts": [{"prompt_id": 0, "text": "a", "n_prompt_tokens": 3},
                                                       {"prompt_id": 1, "text": "b", "n_prompt_tokens": 2}]},
                     n_embd_backbone=6, n_embd=4, hidden_dtype=hidden_dtype, centroids=True,
                     flush_every=flush_every, compact=compact) as w:
        for r, a in enumerate(ACC):
            w.add_round(_round(r, a), _steps(r, a, hidden=hidden_dtype is not None))


def test_round_trip(tmp_path: Path) -> None:
    _write(tmp_path)
    t = traces.open(tmp_path)
    assert t.warnings == []
    m = t.manifest
    assert m["complete"] is True and m["schema_version"] == 1 and m["source"] == "record"
    # 7 rounds, flush every 3 -> parts of 3, 3, 1
    assert m["counts"] == {"n_rounds": 7, "n_steps": 21, "n_parts": 3}
    assert m["dims"] == {"n_embd_backbone": 6, "n_embd": 4, "hidden_dtype": "f32"}
    assert sorted(p.name for p in (tmp_path / "rounds").iterdir()) == [
        "part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    r = t.rounds
    assert list(r["n_accepted"]) == ACC
    assert list(r["prompt_id"]) == [0, 1, 0, 1, 0, 1, 0]
    assert list(r["drafted"][4]) == [104, 204, 304]
    assert list(r["target"][2]) == [102, 999, 7, 7]
    assert list(r["emitted"][3]) == [103, 203, 999]
    assert r["t_verify_ms"][6] == 16.0
    assert r["n_accepted"].dtype == np.int32
    s = t.steps
    assert len(s) == 21 and "h" not in s.columns
    assert list(s["accepted"][:6]) == [True, True, True, False, False, False]
    assert str(s["target_token"].dtype) == "Int32"
    assert list(s["centroid_ids"][0]) == [1, 2]


def test_hidden_projection_and_filters(tmp_path: Path) -> None:
    _write(tmp_path)
    t = traces.open(tmp_path)
    h = t.hidden("h")
    assert h.shape == (21, 6) and h.dtype == np.float32
    assert h[0, 0] == 1.0 and h[20, 5] == 63.0   # round 6, k 3 -> 6*10+3
    inner = t.hidden("h_inner", where=t.steps["k"].to_numpy() == 2)
    assert inner.shape == (7, 4)
    np.testing.assert_array_equal(inner[3], [0, 2, 4, 6])
    via_sql = t.hidden("h", where="k = 3 AND round = 1")   # rounds 2 (prompt 0) and 3 (prompt 1)
    np.testing.assert_array_equal(via_sql[:, 0], [23.0, 33.0])
    # a nullable pandas mask: <NA> counts as not selected
    acc = t.steps["accepted"].astype("boolean")
    acc[0] = pd.NA
    assert t.hidden("h", where=acc).shape == (sum(ACC) - 1, 6)
    with pytest.raises(TraceFormatError, match="mask length"):
        t.hidden("h", where=np.ones(5, dtype=bool))
    with pytest.raises(TraceFormatError, match="invalid where"):
        t.hidden("h", where="nope = 1")


def test_hidden_null_rows_are_nan_and_off_columns_raise(tmp_path: Path) -> None:
    _write(tmp_path / "a")
    t = traces.open(tmp_path / "a")
    # h_next was passed as None everywhere (column on): NaN rows, not an error
    assert np.isnan(t.hidden("h_next")).all()
    _write(tmp_path / "b", hidden_dtype=None)
    tb = traces.open(tmp_path / "b")
    with pytest.raises(TraceFormatError, match="no hidden state"):
        tb.hidden("h")
    with pytest.raises(TraceFormatError):
        tb.hidden("logit")


def test_f16_storage_type(tmp_path: Path) -> None:
    _write(tmp_path, hidden_dtype="f16")
    schema = pq.read_schema(tmp_path / "steps" / "part-00000.parquet")
    assert str(schema.field("h").type) == "fixed_size_list<element: halffloat>[6]"
    assert traces.open(tmp_path).hidden("h")[4, 0] == 12.0


def test_sql_views(tmp_path: Path) -> None:
    _write(tmp_path)
    t = traces.open(tmp_path)
    df = t.sql("SELECT sum(n_accepted) AS a, sum(n_draft) AS d FROM rounds")
    assert int(df["a"][0]) == sum(ACC) and int(df["d"][0]) == 21
    df = t.sql("SELECT count(*) AS n FROM steps WHERE accepted")
    assert int(df["n"][0]) == sum(ACC)
    assert len(t.sql("SELECT * FROM requests")) == 0
    with pytest.raises(TraceFormatError, match="query failed"):
        t.sql("SELECT nope FROM rounds")


def test_columns_projection(tmp_path: Path) -> None:
    _write(tmp_path)
    t = traces.open(tmp_path)
    df = t.columns("rounds", ["prompt_id", "n_accepted"])
    assert list(df.columns) == ["prompt_id", "n_accepted"]
    with pytest.raises(TraceFormatError):
        t.columns("rounds", ["nope"])
    with pytest.raises(TraceFormatError):
        t.columns("nope")


def test_writer_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError):
        RoundRecord(prompt_id=0, round=0, pos=0, pending_token=1, n_draft=2, drafted=(1,), n_accepted=0)
    with pytest.raises(TraceFormatError):
        RoundRecord(prompt_id=0, round=0, pos=0, pending_token=1, n_draft=1, drafted=(1,), n_accepted=2)
    with pytest.raises(TraceFormatError):
        RoundRecord(prompt_id=0, round=0, pos=0, pending_token=1, n_draft=1, drafted=(1,), n_accepted=0,
                    target=(1,))
    w = TraceWriter(tmp_path / "t", {}, n_embd_backbone=6, n_embd=None, hidden_dtype="f32", centroids=False)
    rr = _round(0, 1)
    with pytest.raises(TraceFormatError, match="width"):
        w.add_round(rr, [StepRecord(k=1, token=1, h=np.zeros(5))])
    with pytest.raises(TraceFormatError, match="stores none"):
        w.add_round(rr, [StepRecord(k=1, token=1, h_inner=np.zeros(4))])
    with pytest.raises(TraceFormatError, match="k out of range"):
        w.add_round(rr, [StepRecord(k=4, token=1)])
    # a value past int32 costs its own round only: the rounds buffered with it are written (part of 2 rows)
    w.add_round(_round(0, 1))
    w.add_round(RoundRecord(prompt_id=0, round=7, pos=0, pending_token=2 ** 40, n_draft=0, drafted=(),
                            n_accepted=0))
    w.add_round(_round(2, 3))
    with pytest.raises(TraceFormatError, match=r"'prompt 0 round 7': round does not fit the trace schema"):
        w.flush()
    w.close()
    back = traces.open(tmp_path / "t")
    assert list(back.rounds["pending_token"]) == [0, 2] and back.manifest["counts"]["n_rounds"] == 2
    with pytest.raises(TraceError, match="already holds a trace"):
        TraceWriter(tmp_path / "t", {}, n_embd_backbone=None, n_embd=None, hidden_dtype=None, centroids=False)
    TraceWriter(tmp_path / "t", {}, n_embd_backbone=None, n_embd=None, hidden_dtype=None, centroids=False,
                overwrite=True).close()
    assert traces.open(tmp_path / "t").manifest["counts"]["n_rounds"] == 0
    with pytest.raises(TraceFormatError, match="not JSON serialisable"):
        TraceWriter(tmp_path / "v", {"params": {"x": object()}}, n_embd_backbone=None, n_embd=None,
                    hidden_dtype=None, centroids=False)
    assert not (tmp_path / "v").exists()
    with pytest.raises(TraceFormatError, match="unknown trace source"):
        TraceWriter(tmp_path / "w", {"source": "nope"}, n_embd_backbone=None, n_embd=None,
                    hidden_dtype=None, centroids=False)
    with pytest.raises(TraceFormatError, match="hidden dtype"):
        TraceWriter(tmp_path / "u", {}, n_embd_backbone=6, n_embd=None, hidden_dtype="bf16", centroids=False)


def test_exception_inside_writer_keeps_rounds_incomplete(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        with TraceWriter(tmp_path, {}, n_embd_backbone=None, n_embd=None, hidden_dtype=None,
                         centroids=False, flush_every=100) as w:
            w.add_round(_round(0, 2), [])
            raise RuntimeError("boom")
    t = traces.open(tmp_path)
    assert t.manifest["complete"] is False
    assert len(t.rounds) == 1
    assert any("incomplete" in w for w in t.warnings)


def test_open_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="not a trace directory"):
        traces.open(tmp_path / "missing")
    with pytest.raises(TraceFormatError, match="no manifest"):
        traces.open(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(TraceFormatError, match="not valid JSON"):
        traces.open(tmp_path)
    (tmp_path / "manifest.json").write_text('{"a": "x\x01y"}')     # json's message ends in " at": not shown
    with pytest.raises(TraceFormatError) as e:
        traces.open(tmp_path)
    assert e.value.one_line().endswith("at offset 8: manifest is not valid JSON: Invalid control character")
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"schema_version": 99, "source": "record", "complete": True, "counts": {}}))
    with pytest.raises(TraceFormatError, match="expected 1, got 99"):
        traces.open(tmp_path)
    # the right number in the wrong JSON type: said as a type, not "expected 1, got 1"
    for sv, shown in (('"1"', 'str "1"'), ("1.0", "float 1.0"), ("true", "bool true")):
        (tmp_path / "manifest.json").write_text(
            '{"schema_version": ' + sv + ', "source": "record", "complete": true, "counts": {}}')
        with pytest.raises(TraceFormatError) as e:
            traces.open(tmp_path)
        assert e.value.one_line().endswith(
            f"'schema_version': trace schema version is not an integer (expected the integer 1, got {shown})"), sv


def test_a_folder_of_traces_names_them(tmp_path: Path) -> None:
    """A user gave the folder that holds traces (the demo's ``trained/traces``): the refusal names the traces in it
    (the folders with a manifest.json, sorted), not "no manifest"."""
    for name in ("q8_0", "f32", "buggy"):
        _write(tmp_path / name)
    (tmp_path / "notes").mkdir()                                   # a folder without a manifest is not named
    with pytest.raises(TraceFormatError) as e:
        traces.open(tmp_path)
    assert e.value.one_line() == (f"{tmp_path}: a folder of traces, not a trace (expected one of its traces: "
                                  "buggy, f32, q8_0, got no manifest.json here)")


def test_read_manifest_is_the_file_checked_and_names_where_it_fails(tmp_path: Path) -> None:
    from mtpscope.traces.store.reader import read_manifest

    _write(tmp_path / "t")
    assert read_manifest(tmp_path / "t") == json.loads((tmp_path / "t" / "manifest.json").read_text())
    assert traces.read_manifest is read_manifest
    with pytest.raises(TraceFormatError, match="not a trace directory"):
        read_manifest(tmp_path / "missing")
    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(TraceFormatError, match="no manifest") as e:
        read_manifest(bad)
    assert str(bad / "manifest.json") in e.value.one_line()
    (bad / "manifest.json").write_bytes(b'{"a": "\xff"}')          # byte 7 is not UTF-8
    with pytest.raises(TraceFormatError, match="not UTF-8") as e:
        read_manifest(bad)
    assert "offset 7:" in e.value.one_line() and "0xff" in e.value.one_line()
    text = '{"schema_version": 1,\n  "source": }'
    (bad / "manifest.json").write_text(text)
    with pytest.raises(TraceFormatError, match="not valid JSON") as e:
        read_manifest(bad)
    assert f"offset {text.index('}')}:" in e.value.one_line()       # where a value was expected
    (bad / "manifest.json").write_text(json.dumps({"schema_version": 1, "source": "record", "complete": True}))
    with pytest.raises(TraceFormatError, match="lacks a required key") as e:
        read_manifest(bad)
    assert "counts" in e.value.one_line()


def test_trace_files_lists_what_a_reader_sees(tmp_path: Path) -> None:
    """The manifest, then every finished part / merged file per table; never .tmp files or the WAL."""
    from mtpscope.traces.store.layout import trace_files

    assert trace_files(tmp_path) == []
    _write(tmp_path, flush_every=3)
    names = [p.relative_to(tmp_path).as_posix() for p in trace_files(tmp_path)]
    assert names == ["manifest.json"] + [f"{t}/part-0000{i}.parquet" for t in ("rounds", "steps") for i in range(3)]
    (tmp_path / "rounds" / "part-00003.parquet.tmp").write_bytes(b"PAR1")
    (tmp_path / "wal").mkdir()
    (tmp_path / "wal" / "part-00003.rounds.arrows").write_bytes(b"")
    (tmp_path / "rounds" / "notes.txt").write_text("x")
    assert [p.relative_to(tmp_path).as_posix() for p in trace_files(tmp_path)] == names
    c = tmp_path / "c"
    _write(c, flush_every=2, compact=True)
    assert [p.relative_to(c).as_posix() for p in trace_files(c)] == [
        "manifest.json", "rounds/merged-00000.parquet", "steps/merged-00000.parquet"]


def test_replacement_leftovers(tmp_path: Path) -> None:
    from mtpscope.traces.store.writer import partial_dir, replacement_leftovers

    out = tmp_path / "t"
    assert replacement_leftovers(out) == []
    mine = partial_dir(out)
    mine.mkdir()
    for name in ("t.partial-1", "t.old-77", "t.other", "tt.partial-1", "u.old-1"):
        (tmp_path / name).mkdir()
    assert sorted(p.name for p in replacement_leftovers(out)) == sorted(["t.partial-1", "t.old-77", mine.name])


def test_truncated_part_is_skipped_with_warning(tmp_path: Path) -> None:
    _write(tmp_path)
    bad = tmp_path / "rounds" / "part-00001.parquet"
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    t = traces.open(tmp_path)
    r = t.rounds
    assert list(r["n_accepted"]) == [3, 0, 1, 0]       # parts 0 and 2 only
    assert len(t.warnings) == 1 and "rounds/part-00001.parquet" in t.warnings[0]
    # the steps of part 1 are intact and still read
    assert len(t.steps) == 21
    assert int(t.sql("SELECT count(*) AS n FROM rounds")["n"][0]) == 4


def test_corrupted_bytes_in_part_are_caught(tmp_path: Path) -> None:
    _write(tmp_path)
    bad = tmp_path / "steps" / "part-00000.parquet"
    data = bytearray(bad.read_bytes())
    # overwrite bytes inside the first column chunk's data pages (after the 4-byte magic)
    for i in range(8, 40):
        data[i] ^= 0x5A
    bad.write_bytes(bytes(data))
    t = traces.open(tmp_path)
    s = t.steps
    assert len(s) == 12                                   # parts 1 (9 steps) and 2 (3 steps)
    assert any("steps/part-00000.parquet" in w for w in t.warnings)
    assert t.hidden("h").shape == (12, 6)
    assert len(t.rounds) == 7


def test_tmp_part_ignored(tmp_path: Path) -> None:
    # a writer that never closed (crash): no 'parts' listing, the reader globs part-*.parquet
    w = TraceWriter(tmp_path, {}, n_embd_backbone=None, n_embd=None, hidden_dtype=None, centroids=False,
                    flush_every=2, background=False)
    for r, a in enumerate(ACC):
        w.add_round(_round(r, a))
    (tmp_path / "rounds" / "part-00003.parquet.tmp").write_bytes(b"PAR1 half written")
    t = traces.open(tmp_path)
    assert "parts" not in t.manifest
    assert list(t.rounds["n_accepted"]) == ACC[:6]           # the 7th round is still buffered
    assert any("part-00003.parquet.tmp" in w for w in t.warnings)


def test_compaction_at_close(tmp_path: Path) -> None:
    _write(tmp_path / "c", flush_every=2, compact=True)
    _write(tmp_path / "p", flush_every=2, compact=False)
    c, p = traces.open(tmp_path / "c"), traces.open(tmp_path / "p")
    for t in ("rounds", "steps"):
        assert sorted(x.name for x in (tmp_path / "c" / t).iterdir()) == ["merged-00000.parquet"]
        assert len(list((tmp_path / "p" / t).iterdir())) == 4
    assert c.manifest["parts"]["rounds"] == ["merged-00000.parquet"]
    assert c.manifest["counts"] == {"n_rounds": 7, "n_steps": 21, "n_parts": 1}
    assert p.manifest["parts"]["steps"] == [f"part-{i:05d}.parquet" for i in range(4)]
    assert c.rounds.equals(p.rounds) and c.steps.equals(p.steps)
    np.testing.assert_array_equal(c.hidden("h"), p.hidden("h"))
    # several merged files when the run is longer than compact_rounds
    with TraceWriter(tmp_path / "m", {}, n_embd_backbone=None, n_embd=None, hidden_dtype=None,
                     centroids=False, flush_every=2, compact_rounds=4) as w:
        for r, a in enumerate(ACC):
            w.add_round(_round(r, a), _steps(r, a, hidden=False))
    m = traces.open(tmp_path / "m")
    assert m.manifest["parts"]["rounds"] == ["merged-00000.parquet", "merged-00001.parquet"]
    assert list(m.rounds["n_accepted"]) == ACC and len(m.steps) == 21


def test_merged_files_are_built_while_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With compact=True each part is appended to its group's merged file as it is written, so close()
    reads no part back; the merged files equal what reading the parts back makes (same listing, rows,
    row groups), several groups included."""
    import mtpscope.traces.store.merge as merge

    def build(d: Path) -> None:
        with TraceWriter(d, {"source": "record", "prompts": [{"prompt_id": 0, "text": "a", "n_prompt_tokens": 3},
                                                       {"prompt_id": 1, "text": "b", "n_prompt_tokens": 2}]},
                         n_embd_backbone=6, n_embd=4, hidden_dtype="f32", centroids=True, flush_every=2,
                         compact_rounds=4) as w:
            for r, a in enumerate(ACC):
                w.add_round(_round(r, a), _steps(r, a))

    with monkeypatch.context() as m:           # while writing: no part may be read back
        def no_read(*a: object, **k: object) -> None:
            raise AssertionError("a part was read back")
        m.setattr(pq, "read_table", no_read)
        build(tmp_path / "inc")
    with monkeypatch.context() as m:           # the old way: the merger is off, close() reads the parts back
        m.setattr(merge.Merger, "add", lambda self, rec, tables: setattr(self, "error", RuntimeError("off")))
        build(tmp_path / "old")
    a, b = traces.open(tmp_path / "inc"), traces.open(tmp_path / "old")
    assert a.manifest["parts"] == b.manifest["parts"]
    assert a.manifest["parts"]["rounds"] == ["merged-00000.parquet", "merged-00001.parquet"]
    for t in ("rounds", "steps"):
        assert sorted(p.name for p in (tmp_path / "inc" / t).iterdir()) == sorted(a.manifest["parts"][t])
        for name in a.manifest["parts"][t]:
            fa, fb = pq.ParquetFile(tmp_path / "inc" / t / name), pq.ParquetFile(tmp_path / "old" / t / name)
            assert fa.metadata.num_row_groups == fb.metadata.num_row_groups
            assert fa.read().equals(fb.read())
    assert list(a.rounds["n_accepted"]) == ACC
    np.testing.assert_array_equal(a.hidden("h"), b.hidden("h"))
    # a trace closed incomplete is not compacted: the merged files begun are deleted, the parts stay
    w = TraceWriter(tmp_path / "inc2", {}, n_embd_backbone=None, n_embd=None, hidden_dtype=None, centroids=False,
                    flush_every=2)
    for r, a_ in enumerate(ACC):
        w.add_round(_round(r, a_), _steps(r, a_, hidden=False))
    w.close(complete=False)
    assert sorted(p.name for p in (tmp_path / "inc2" / "rounds").iterdir()) == [f"part-{i:05d}.parquet"
                                                                              for i in range(4)]


def test_listed_part_missing(tmp_path: Path) -> None:
    _write(tmp_path)
    (tmp_path / "rounds" / "part-00001.parquet").unlink()
    t = traces.open(tmp_path)
    assert list(t.rounds["n_accepted"]) == [3, 0, 1, 0]
    assert any("part-00001.parquet: listed in the manifest but missing" in w for w in t.warnings)


@pytest.mark.parametrize("parts", [None, "missing", "empty"])
def test_manifest_that_lost_its_part_list_still_reads_the_merged_files(tmp_path: Path, parts: object) -> None:
    """A closed, compacted trace whose manifest lost its `parts` list (null, or the key gone): the merged files
    on disk are read, with a warning naming the manifest's `parts` (before: 0 rounds, no warning, exit 0); a
    merged file beside unmerged parts (a close cut short) is ignored with a warning, the parts read."""
    import json
    import shutil

    _write(tmp_path / "t", compact=True)
    man = json.loads((tmp_path / "t" / "manifest.json").read_text())
    assert man["parts"]["rounds"] == ["merged-00000.parquet"]
    if parts is None:
        man["parts"] = None
    elif parts == "empty":           # `{}`: before, 0 rounds without a word (as the key gone, once)
        man["parts"] = {}
    else:
        del man["parts"]
    (tmp_path / "t" / "manifest.json").write_text(json.dumps(man))
    t = traces.open(tmp_path / "t")
    assert list(t.rounds["n_accepted"]) == list(ACC) and len(t.steps) == 3 * len(ACC)
    assert any("manifest.json: 'parts' lists no files; the 1 merged rounds file" in w for w in t.warnings), t.warnings
    _write(tmp_path / "u")                               # unmerged parts, and a merged copy of their rows beside
    shutil.copy(tmp_path / "t" / "rounds" / "merged-00000.parquet", tmp_path / "u" / "rounds" / "merged-00000.parquet")
    man = json.loads((tmp_path / "u" / "manifest.json").read_text())
    man["parts"] = None
    (tmp_path / "u" / "manifest.json").write_text(json.dumps(man))
    u = traces.open(tmp_path / "u")
    assert list(u.rounds["n_accepted"]) == list(ACC)
    assert any("merged-00000.parquet: merged file the manifest does not list, ignored" in w for w in u.warnings)
    if parts == "empty":             # parts only, a list emptied: read, and said
        _write(tmp_path / "v")
        man = json.loads((tmp_path / "v" / "manifest.json").read_text())
        man["parts"] = {"rounds": [], "steps": []}
        (tmp_path / "v" / "manifest.json").write_text(json.dumps(man))
        v = traces.open(tmp_path / "v")
        assert list(v.rounds["n_accepted"]) == list(ACC) and len(v.steps) == 3 * len(ACC)
        assert f"{tmp_path / 'v' / 'manifest.json'}: 'parts' lists no rounds file but {tmp_path / 'v' / 'rounds'} " \
               "holds parts: read as they are" in v.warnings
        # ... but a list emptied with counts of 0 is a trace of no rounds, as its manifest says (files left aside)
        man["counts"] = {"n_rounds": 0, "n_steps": 0, "n_parts": 0}
        (tmp_path / "v" / "manifest.json").write_text(json.dumps(man))
        w = traces.open(tmp_path / "v")
        assert len(w.rounds) == 0 and not any("'parts' lists no" in x for x in w.warnings)


_KILL_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from mtpscope.traces import RoundRecord, StepRecord, TraceWriter
    w = TraceWriter(sys.argv[1], {"source": "synthetic"}, n_embd_backbone=16, n_embd=None,
                    hidden_dtype="f16", centroids=False, flush_every=4)
    r = 0
    while True:       # runs until killed
        a = r % 4
        w.add_round(RoundRecord(prompt_id=0, round=r, pos=r, pending_token=r % 1000, n_draft=3,
                                drafted=(r, r + 1, r + 2), n_accepted=a),
                    [StepRecord(k=k, token=r + k - 1, accepted=k <= a,
                                h=np.full(16, r, dtype=np.float32)) for k in (1, 2, 3)])
        print(r, flush=True)   # reported: add_round returned
        r += 1
""")


@pytest.mark.parametrize("n_kill", [37, 150])
def test_sigkill_mid_run_loses_no_reported_round(tmp_path: Path, n_kill: int) -> None:
    """kill -9 after ``n_kill`` reported rounds (not a multiple of flush_every): every round whose
    add_round returned is in the trace (parts + the write-ahead tail recovered on open)."""
    out = tmp_path / "trace"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT, str(out)], env=env, stdout=subprocess.PIPE,
                            text=True)
    reported = -1
    try:
        for line in proc.stdout:
            reported = int(line)
            if reported + 1 >= n_kill:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL and reported + 1 >= n_kill
    t = traces.open(out)
    assert t.manifest["complete"] is False
    assert t.manifest["recovered"]["n_rounds"] >= 1          # the tail since the last part came from the WAL
    assert any("recovered from the write-ahead log" in w for w in t.warnings)
    assert not (out / "wal").exists() or not any(p.suffix == ".log" for p in (out / "wal").iterdir())
    r = t.rounds
    # every reported round survived (the writer ran on for a few rounds while the pipe was read)
    assert len(r) >= reported + 1
    assert list(r["round"]) == list(range(len(r)))
    assert list(r["n_accepted"]) == [i % 4 for i in range(len(r))]
    s = t.steps
    assert len(s) == 3 * len(r)            # a round's steps come with it, steps of a torn round are dropped
    h = t.hidden("h", where=s["k"].to_numpy() == 1)
    np.testing.assert_array_equal(h[:, 0], np.arange(len(r), dtype=np.float32))
    assert t.manifest["counts"]["n_rounds"] == len(r)
    assert not any("unreadable" in w for w in t.warnings)
    # the merged file the writer was building as it went (compact=True) is gone, not left as litter
    assert not list(out.glob("*/merged-*.parquet.tmp"))
    # a second open finds nothing left to recover
    assert not any("write-ahead" in w for w in traces.open(out).warnings)


def test_wal_torn_tail_and_live_writer(tmp_path: Path) -> None:
    """A torn last message is dropped (its round lost, the earlier ones kept); while a writer holds the
    lock, readers leave its log alone; a second writer into the same folder is refused."""
    d = tmp_path / "t"
    w = TraceWriter(d, {"source": "synthetic"}, n_embd_backbone=6, n_embd=4, hidden_dtype="f32", centroids=True,
                    flush_every=100, background=False)
    for r, a in enumerate(ACC):
        w.add_round(_round(r, a), _steps(r, a))
    live = traces.open(d)
    assert len(live.rounds) == 0 and any("incomplete" in x for x in live.warnings)
    assert [p.name for p in (d / "wal").iterdir() if p.name != "lock"] == ["part-00000.log"]     # untouched
    with pytest.raises(TraceError, match="another process is writing"):
        TraceWriter(d, {}, n_embd_backbone=None, n_embd=None, hidden_dtype=None, centroids=False, overwrite=True)
    # simulate the death of the writer: release its lock without closing, then tear the last message
    os.close(w._lock_fd)
    w._lock_fd = None
    seg = d / "wal" / "part-00000.log"
    seg.write_bytes(seg.read_bytes()[:-40])     # the last round's hidden states are cut short
    t = traces.open(d)
    assert list(t.rounds["n_accepted"]) == ACC[:-1]
    assert len(t.steps) == 3 * (len(ACC) - 1)
    rec = t.manifest["recovered"]
    assert rec["n_rounds"] == len(ACC) - 1 and rec["torn_bytes"] > 0 and rec["n_steps_dropped"] == 3
    np.testing.assert_array_equal(t.hidden("h")[:, 0], [r * 10 + k for r in range(6) for k in (1, 2, 3)])


def test_background_write_error_is_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mtpscope.traces.store.writer as writer

    def boom(table, path):
        raise OSError(28, "No space left on device")

    w = TraceWriter(tmp_path, {}, n_embd_backbone=None, n_embd=None, hidden_dtype=None, centroids=False,
                    flush_every=1)
    monkeypatch.setattr(writer, "write_part", boom)
    w.add_round(_round(0, 1))                      # queued; the thread fails
    with pytest.raises(TraceError, match="No space left"):
        for r in range(1, 50):                     # surfaces at a later call at the latest at close
            w.add_round(_round(r, 1))
        w.close()
    monkeypatch.undo()
    w.close()                                      # idempotent after the failure


def test_compaction_failure_keeps_small_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        def __init__(self, *a, **k):
            raise OSError("disk went away")

    monkeypatch.setattr(pq, "ParquetWriter", Broken)
    _write(tmp_path, flush_every=2, compact=True)
    monkeypatch.undo()
    t = traces.open(tmp_path)
    assert t.manifest["complete"] is True
    assert t.manifest["parts"]["rounds"] == [f"part-{i:05d}.parquet" for i in range(4)]
    assert any("compaction failed" in w for w in t.manifest["warnings"])
    assert list(t.rounds["n_accepted"]) == ACC


def test_shared_between_threads(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    _write(tmp_path)
    t = traces.open(tmp_path)

    def work(i: int) -> tuple[int, int, float]:
        n = len(t.rounds) if i % 3 == 0 else len(t.steps)
        s = int(t.sql("SELECT sum(n_accepted) AS a FROM rounds")["a"][0])
        return n, s, float(t.hidden("h")[20, 5])

    with ThreadPoolExecutor(4) as ex:
        out = list(ex.map(work, range(24)))
    assert {o[1] for o in out} == {sum(ACC)} and {o[2] for o in out} == {63.0}
    assert {o[0] for o in out} == {7, 21}


@pytest.mark.parametrize("content, needle", [
    (b"\xff\xfe{}", "not UTF-8"),
    (b"[" * 100_000, "nested too deeply"),
    (b'{"schema_version": 1, "source": "record", "complete": true, "counts": {}, "dims": "x"}', "'dims'"),
    (b'{"schema_version": 1, "source": "record", "complete": true, "counts": {}, "dims": {"n_embd": -4}}',
     "'dims.n_embd'"),
    (b'{"schema_version": 1, "source": ["record"], "complete": true, "counts": {}}', "'source'"),
])
def test_bad_manifests_raise_one_trace_format_error(tmp_path: Path, content: bytes, needle: str) -> None:
    from mtpscope.errors import TraceFormatError

    (tmp_path / "manifest.json").write_bytes(content)
    with pytest.raises(TraceFormatError) as e:
        traces.open(tmp_path)
    assert needle in str(e.value) and "manifest.json" in str(e.value)


def test_rounds_values_that_break_the_format_raise(tmp_path: Path) -> None:
    """A part whose values break what every metric relies on (here n_accepted > n_draft) is one
    TraceFormatError naming the column, not a crash later; a part that lost a required column (prompt_id: a file
    of another table copied over it, say) is skipped like an unreadable one, with a warning naming the part and the
    column, and the other parts read (before: an error that named no file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mtpscope.errors import TraceFormatError
    from mtpscope.traces.synthetic import write_synthetic_trace

    d = tmp_path / "t"
    write_synthetic_trace(d, n_rounds=20, n_prompts=2, seed=0)
    part = sorted((d / "rounds").glob("*.parquet"))[0]
    t = pq.read_table(part)
    i = t.schema.get_field_index("n_accepted")
    pq.write_table(t.set_column(i, "n_accepted", pa.compute.add(t["n_draft"], 1)), part)
    with pytest.raises(TraceFormatError) as e:
        _ = traces.open(d).rounds
    assert e.value.key == "n_accepted" and "n_accepted <= n_draft" in str(e.value)
    pq.write_table(t.drop(["prompt_id"]), part)
    tr = traces.open(d)
    assert len(tr.rounds) == 20 - t.num_rows and tr.skipped == [part]
    assert any(w.startswith(f"{part}: unreadable rounds part skipped ('prompt_id': rounds table lacks a required "
                            "column") for w in tr.warnings), tr.warnings



def _synthetic_parts(d: Path) -> Path:
    """40 rounds of 4 prompts (ids 0..3, rounds 0..9 each) in 4 rounds parts of 10, params.n_vocab 1000."""
    from mtpscope.traces.synthetic import write_synthetic_trace

    return write_synthetic_trace(d, n_rounds=40, n_prompts=4, n_vocab=1000, rounds_per_part=10, seed=0)


def _set_round_value(d: Path, col: str, row: int, value) -> None:
    """Rewrite the rounds part holding global row ``row`` with ``col`` at that row set to ``value`` (a callable:
    applied to the old value); the column made nullable so that a null can be written."""
    _set_value(d, "rounds", col, row, value)


def _item(i: int, v: int):
    return lambda old: [*old[:i], v, *old[i + 1:]]


# (column broken, global row, new value, what the line says is expected, what it says the row holds)
BROKEN_ROUNDS = [
    ("prompt_id", 13, None, "no nulls", "null"),
    ("drafted", 12, None, "no nulls", "null"),      # a column report does not read: report refuses it too
    ("pos", 5, None, "no nulls", "null"),
    ("prompt_id", 13, -1, "0..3 (manifest.prompts)", "-1"),
    ("prompt_id", 13, 4, "0..3 (manifest.prompts)", "4"),
    ("round", 21, -2, ">= 0", "-2"),
    ("n_draft", 22, lambda nd: nd + 1, "len(drafted) = 3", "4"),
    ("t_draft_ms", 7, float("nan"), "null, 0 or 1e-06 <= t < 86400000 ms (a nanosecond to a day)", "nan"),
    ("t_verify_ms", 31, float("inf"), "null, 0 or 1e-06 <= t < 86400000 ms (a nanosecond to a day)", "inf"),
    ("t_verify_ms", 8, -0.5, "null, 0 or 1e-06 <= t < 86400000 ms (a nanosecond to a day)", "-0.5"),
    ("t_verify_ms", 9, 1e308, "null, 0 or 1e-06 <= t < 86400000 ms (a nanosecond to a day)", "1e+308"),
    ("t_draft_ms", 10, 5e-324, "null, 0 or 1e-06 <= t < 86400000 ms (a nanosecond to a day)", "5e-324"),
    ("pending_token", 3, -1, "token ids 0..999 (params.n_vocab 1000)", "-1"),
    ("pending_token", 3, 1000, "token ids 0..999 (params.n_vocab 1000)", "1000"),
    ("drafted", 17, _item(1, -7), "token ids 0..999 (params.n_vocab 1000)", "-7"),
    ("target", 18, _item(2, 1000), "token ids 0..999 (params.n_vocab 1000)", "1000"),
    ("emitted", 19, _item(0, -3), "token ids 0..999 (params.n_vocab 1000)", "-3"),
]


@pytest.mark.parametrize("col, row, value, expected, got", BROKEN_ROUNDS,
                         ids=[f"{c}-{r}-{g}" for c, r, _, _, g in BROKEN_ROUNDS])
def test_rounds_that_break_the_format_are_refused_whatever_columns_are_read(tmp_path: Path, col: str, row: int,
                                                                            value, expected: str, got: str) -> None:
    """Every rule of the rounds check refuses the trace in one TraceFormatError naming the trace, the column, the
    rows and the first one, and what it holds; the same error whichever columns a reader asks for (report reads
    no ``drafted``, a narrow read only ``t_verify_ms``): a read never gives numbers from rounds that break the
    format, and a null in a required column is this error too, not a part skipped (was: report exit 0 and explain
    'no rounds' on the same trace)."""
    d = _synthetic_parts(tmp_path / "t")
    _set_round_value(d, col, row, value)
    lines = set()
    for names in (["t_verify_ms"], ["prompt_id", "round", "n_draft", "n_accepted", "emitted"], None):
        with pytest.raises(TraceFormatError) as e:
            traces.open(d).columns("rounds", names)
        lines.add(e.value.one_line())
    assert lines == {f"{d}: {col!r}: rounds column breaks the trace format (1 row, first row {row}) "
                     f"(expected {expected}, got {got})"}


def test_a_round_listed_twice_across_parts_is_refused(tmp_path: Path) -> None:
    """The same (prompt_id, round) in two parts (a part copied twice, say): one error naming the pair, the later
    row and the earlier one (was: every count doubled, exit 0); read whatever the columns asked for."""
    import pyarrow as pa

    d = _synthetic_parts(tmp_path / "t")
    parts = traces.open(d).part_files("rounds")
    first, last = pq.read_table(parts[0]), pq.read_table(parts[-1])
    pq.write_table(pa.concat_tables([last, first.slice(3, 2)]), parts[-1])    # rows 40, 41 repeat rows 3, 4
    for names in (["round"], None):
        with pytest.raises(TraceFormatError) as e:
            traces.open(d).columns("rounds", names)
        assert e.value.one_line() == (f"{d}: 'prompt_id, round': rounds column breaks the trace format (2 rows, "
                                      "first row 40) (expected each (prompt_id, round) once, got (0, 3) again "
                                      "(first at row 3))")


def test_rounds_check_leaves_good_traces_alone(tmp_path: Path) -> None:
    """A manifest that lists no prompt bounds no prompt id (writers given none), a trace with no n_vocab bounds
    token ids only below, rounds out of (prompt_id, round) order are fine, and null times and target pass; their
    steps are found in them (and a step that is not its round's draft is refused there too)."""
    with TraceWriter(tmp_path / "t", {}, n_embd_backbone=None, n_embd=None, hidden_dtype=None,
                     centroids=False) as w:
        for pid, r in ((7, 1), (3, 0), (7, 0)):
            w.add_round(RoundRecord(prompt_id=pid, round=r, pos=r, pending_token=300_000, n_draft=1, drafted=(5,),
                                    n_accepted=0, target=None, emitted=(2**31 - 1,)),
                        [StepRecord(k=1, token=5, target_token=9, accepted=False)])
    t = traces.open(tmp_path / "t")
    rounds = t.rounds
    assert list(zip(rounds["prompt_id"], rounds["round"])) == [(7, 1), (3, 0), (7, 0)]
    assert rounds["t_verify_ms"].isna().all()
    # steps of rounds out of order are found in them (token = the draft; a null target checks no target_token)
    assert list(t.steps["token"]) == [5, 5, 5] and t.warnings == []
    with TraceWriter(tmp_path / "u", {}, n_embd_backbone=None, n_embd=None, hidden_dtype=None,
                     centroids=False) as w:
        for pid, r, tok in ((7, 1, 5), (3, 0, 6), (7, 0, 5)):
            w.add_round(RoundRecord(prompt_id=pid, round=r, pos=r, pending_token=1, n_draft=1, drafted=(5,),
                                    n_accepted=0, target=None, emitted=(2,)), [StepRecord(k=1, token=tok)])
    with pytest.raises(TraceFormatError) as e:
        _ = traces.open(tmp_path / "u").steps
    assert e.value.one_line() == (f"{tmp_path / 'u'}: 'token': steps column breaks the trace format (1 row, first row "
                                  "1) (expected drafted[k - 1] of its round = 5, got 6)")

def _set_value(d: Path, table: str, col: str, row: int, value) -> None:
    """:func:`_set_round_value` for either table: ``table``'s part holding global row ``row`` rewritten."""
    import pyarrow as pa

    start = 0
    for part in traces.open(d).part_files(table):
        t = pq.read_table(part)
        if row < start + t.num_rows:
            vals = t.column(col).to_pylist()
            vals[row - start] = value(vals[row - start]) if callable(value) else value
            f = t.schema.field(col)
            pq.write_table(t.set_column(t.schema.get_field_index(col), pa.field(col, f.type, nullable=True),
                                        pa.array(vals, f.type)), part)
            return
        start += t.num_rows
    raise AssertionError(f"no row {row}")


def _raw(d: Path, table: str) -> list[dict]:
    """Every row of ``table``'s parts as pyarrow reads them (not through mtpscope's reader)."""
    import pyarrow as pa

    return pa.concat_tables([pq.read_table(p) for p in sorted((d / table).glob("part-*.parquet"))]).to_pylist()


def _first(rows: list[dict], pred) -> int:
    return next(i for i, r in enumerate(rows) if pred(r))


def test_round_lists_that_contradict_the_round_are_refused(tmp_path: Path) -> None:
    """``target`` holds one token per verify row (n_draft + 1), ``emitted`` the accepted drafts then the target's
    token (1 .. n_accepted + 1 items, its first n_accepted the accepted drafts): a list that breaks this is refused
    in one line naming the row and what it holds, whatever columns are read (was: read as it was, and a round
    emitting 9 tokens on 2 accepted drafts counted 9 tokens)."""
    d0 = _synthetic_parts(tmp_path / "t")
    rows = _raw(d0, "rounds")
    r_acc = _first(rows, lambda r: r["n_accepted"] >= 1 and r["n_draft"] >= 2)
    rr = rows[r_acc]
    cases = [
        ("target", r_acc, lambda old: old[:-1],
         f"n_draft + 1 = {rr['n_draft'] + 1} items (one per verify row)", f"{rr['n_draft']} items {rr['target'][:-1]}"),
        ("emitted", r_acc, lambda old: [*old, 5],
         f"1 .. n_accepted + 1 = {rr['n_accepted'] + 1} items", f"{rr['n_accepted'] + 2} items {[*rr['emitted'], 5]}"),
        ("emitted", r_acc, [], f"1 .. n_accepted + 1 = {rr['n_accepted'] + 1} items", "0 items []"),
        ("emitted", r_acc, lambda old: [(old[0] + 1) % 1000, *old[1:]],
         f"its first n_accepted items the accepted drafts (drafted {rr['drafted']}, n_accepted {rr['n_accepted']})",
         str([(rr["emitted"][0] + 1) % 1000, *rr["emitted"][1:]])),
    ]
    for i, (col, row, value, expected, got) in enumerate(cases):
        d = tmp_path / f"c{i}"
        import shutil

        shutil.copytree(d0, d)
        _set_value(d, "rounds", col, row, value)
        for names in (["t_verify_ms"], None):
            with pytest.raises(TraceFormatError) as e:
                traces.open(d).columns("rounds", names)
            assert e.value.one_line() == (f"{d}: {col!r}: rounds column breaks the trace format (1 row, first row "
                                          f"{row}) (expected {expected}, got {got})"), (i, names)


def test_steps_that_break_the_format_are_refused_whatever_columns_are_read(tmp_path: Path) -> None:
    """The steps' rules: 1 <= k, each (prompt_id, round, k) once, k <= its round's n_draft, the step's token the
    round's draft, ``accepted`` as k <= n_accepted, ``target_token`` the round's target at that row, token ids in the
    vocabulary (was: none; a k past n_draft or a step copied twice gave per-position rates over steps no round
    holds). One line per trace, whichever steps columns a read asks for."""
    import shutil

    d0 = _synthetic_parts(tmp_path / "t")
    rounds, steps = _raw(d0, "rounds"), _raw(d0, "steps")
    by_round = {(r["prompt_id"], r["round"]): r for r in rounds}
    # the last step of a round of two drafts or more
    j = _first(steps, lambda s: s["k"] >= 2 and by_round[(s["prompt_id"], s["round"])]["n_draft"] == s["k"])
    s = steps[j]
    rr = by_round[(s["prompt_id"], s["round"])]
    k, nd, na = s["k"], rr["n_draft"], rr["n_accepted"]
    cases = [
        ("k", j, 0, "1 <= k <= 65535", "0"),
        (("k", "prompt_id, round, k"), j, k - 1, "each (prompt_id, round, k) once",
         f"({s['prompt_id']}, {s['round']}, {k - 1}) again (first at row {j - 1})"),
        ("k", j, nd + 1, f"k <= n_draft = {nd} of its round", str(nd + 1)),
        ("token", j, lambda t: (t + 1) % 1000, f"drafted[k - 1] of its round = {rr['drafted'][k - 1]}",
         str((s["token"] + 1) % 1000)),
        ("accepted", j, lambda a: not a, f"k <= n_accepted ({k} <= {na}: {k <= na})", str(not s["accepted"])),
        ("target_token", j, lambda t: (t + 1) % 1000, f"target[k - 1] of its round = {rr['target'][k - 1]}",
         str((s["target_token"] + 1) % 1000)),
        ("prompt_id", j, 4, "0..3 (manifest.prompts)", "4"),
    ]
    for i, (col, row, value, expected, got) in enumerate(cases):
        d = tmp_path / f"c{i}"
        shutil.copytree(d0, d)
        col, key = col if isinstance(col, tuple) else (col, col)    # (the column edited, the rule's key)
        _set_value(d, "steps", col, row, value)
        for names in (["logit"], ["k", "accepted"], None):
            with pytest.raises(TraceFormatError) as e:
                traces.open(d).columns("steps", names)
            assert e.value.one_line() == (f"{d}: {key!r}: steps column breaks the trace format (1 row, first row "
                                          f"{row}) (expected {expected}, got {got})"), (i, names)


def test_a_repeated_step_is_named_whatever_the_prompt_ids(tmp_path: Path) -> None:
    """The repeat rule names (prompt_id, round, k) as the trace holds them, for prompt ids past 2**15 too (a trace
    whose manifest lists no prompt bounds none)."""
    import pyarrow as pa

    from mtpscope.traces.store.checks import check_steps

    for pid in (3, 2**20, 2**31 - 1):
        steps = pa.table({"prompt_id": pa.array([pid, 0, pid], pa.int32()), "round": pa.array([7, 7, 7], pa.int32()),
                          "k": pa.array([2, 2, 2], pa.int32())})
        with pytest.raises(TraceFormatError) as e:
            check_steps(steps, pa.table({}), tmp_path, {})
        assert e.value.one_line() == (f"{tmp_path}: 'prompt_id, round, k': steps column breaks the trace format "
                                      f"(1 row, first row 2) (expected each (prompt_id, round, k) once, got "
                                      f"({pid}, 7, 2) again (first at row 0))"), pid


def test_steps_of_a_lost_rounds_part_are_read_unchecked_against_it(tmp_path: Path) -> None:
    """docs/TRACE_FORMAT.md: the steps of a part whose rounds part was lost are still returned; the steps' check
    compares only the steps whose round the rounds hold."""
    d = _synthetic_parts(tmp_path / "t")
    part = traces.open(d).part_files("rounds")[1]
    part.write_bytes(b"not parquet")
    t = traces.open(d)
    assert len(t.steps) == len(_raw(d, "steps")) and part in t.skipped


def test_accepted_drafts_that_differ_from_the_target_are_a_warning(tmp_path: Path) -> None:
    """A round whose accepted draft is not the target's token at its verify row (a runtime whose target tokens are
    recomputed after its own acceptance, at a near tie): the trace stays readable and says so in one warning."""
    d = _synthetic_parts(tmp_path / "t")
    rows = _raw(d, "rounds")
    r = _first(rows, lambda x: x["n_accepted"] >= 1)
    new_target = [(rows[r]["target"][0] + 1) % 1000, *rows[r]["target"][1:]]
    _set_value(d, "rounds", "target", r, new_target)
    t = traces.open(d)
    assert len(t.rounds) == 40
    assert t.warnings[-1] == (f"{d}: 1 round whose accepted drafts differ from the target's tokens (first row {r}: "
                              f"drafted {rows[r]['drafted']}, target {new_target}, n_accepted "
                              f"{rows[r]['n_accepted']}): the acceptance counts are the runtime's own")


def test_hidden_reads_only_the_row_groups_of_the_selected_rows(tmp_path: Path, monkeypatch) -> None:
    from mtpscope.traces.store import parts

    monkeypatch.setattr(parts, "ROW_GROUP_ROUNDS", 1)      # a row group every 3 steps in the merged file
    _write(tmp_path / "t", flush_every=1, compact=True)
    t = traces.open(tmp_path / "t")
    merged = t.part_files("steps")
    assert len(merged) == 1 and pq.ParquetFile(merged[0]).metadata.num_row_groups > 2
    full = t.hidden("h")
    assert full.shape == (3 * len(ACC), 6)
    np.testing.assert_array_equal(full[:, 0], [r * 10 + k for r in range(len(ACC)) for k in (1, 2, 3)])
    for mask in ((t.steps["round"] == 2).to_numpy(), (t.steps["k"] == 3).to_numpy(),
                 np.arange(len(full)) % 5 == 0, np.arange(len(full)) == len(full) - 1):
        np.testing.assert_array_equal(t.hidden("h", where=mask), full[mask])
        np.testing.assert_array_equal(t.hidden("h_inner", where=mask), t.hidden("h_inner")[mask])
    read: list[list[int]] = []
    orig = pq.ParquetFile.read_row_groups

    def spy(self, groups, *a, **kw):
        read.append(list(groups))
        return orig(self, groups, *a, **kw)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", spy)
    t.hidden("h", where=np.arange(len(full)) == 4)
    assert read == [[1]]                                     # step 4 lives in the second group of 3 steps


def test_report_counts_the_steps_of_the_rounds_it_counts(tmp_path: Path) -> None:
    """A trace whose rounds part was lost keeps that part's steps (above); report's centroid coverage, a figure over
    steps printed beside the rounds' counts, counts only the steps of the rounds it reads (was: 'rounds: 0' beside a
    coverage over 175 steps). Worked from the readable parts with pyarrow and the checked-step rule by hand."""
    from mtpscope.traces.analysis.metrics import report

    d = _synthetic_parts(tmp_path / "t")
    parts = traces.open(d).part_files("rounds")
    lost = {(r["prompt_id"], r["round"]) for r in pq.read_table(parts[1]).to_pylist()}
    parts[1].write_bytes(b"")
    kept = [s for s in _raw(d, "steps") if (s["prompt_id"], s["round"]) not in lost]
    first_rej: dict[tuple[int, int], int] = {}
    for s in kept:
        if not s["accepted"]:
            key = (s["prompt_id"], s["round"])
            first_rej[key] = min(first_rej.get(key, 99), s["k"])
    checked = [s for s in kept if s["accepted"] or s["k"] == first_rej[(s["prompt_id"], s["round"])]]
    rep = report(traces.open(d))
    assert rep.n_rounds == 30
    assert (rep.centroid_coverage.n_steps, rep.centroid_coverage.n_covered) == (
        len(checked), sum(bool(s["target_in_candidates"]) for s in checked))


def test_sql_over_a_trace_whose_steps_parts_are_all_unreadable(tmp_path: Path) -> None:
    """No readable steps part on a trace with f16 hidden states: the steps view is empty, of the table's columns (was:
    DuckDB's internal 'Unsupported Internal Arrow Type e' on the f16 columns, an internal error on the Centroids
    page)."""
    from mtpscope.traces.synthetic import write_synthetic_trace

    d = write_synthetic_trace(tmp_path / "t", n_rounds=20, n_prompts=2, n_vocab=1000, hidden=(8, 4), seed=0)
    for part in traces.open(d).part_files("steps"):
        part.write_bytes(b"not parquet")
    t = traces.open(d)
    t.check_parts()
    got = t.sql("SELECT count(*) AS n FROM steps")
    assert int(got["n"][0]) == 0 and len(t.sql("SELECT h FROM steps")) == 0
    assert len(t.rounds) == 20


def test_token_ids_of_list_rows_that_are_null_are_not_items(tmp_path: Path) -> None:
    """A list column whose null rows still cover values (Arrow allows it; a writer other than ours may make one):
    those values are no items, so no refusal, while a bad id in a row that is not null is named (was: ArrowInvalid,
    an internal error)."""
    import pyarrow as pa

    from mtpscope.traces.store.checks import check_rounds

    offsets = pa.array([0, 2, 4, 6], pa.int32())
    values = pa.array([1, 2, -5, 3000, 7, 8], pa.int32())       # row 1 (null) covers -5 and 3000
    emitted = pa.ListArray.from_arrays(offsets, values, mask=pa.array([False, True, False]))
    assert emitted.null_count == 1 and emitted.values.to_pylist()[2:4] == [-5, 3000]
    check_rounds(pa.table({"emitted": emitted}), tmp_path, {"params": {"n_vocab": 1000}})
    bad = pa.ListArray.from_arrays(offsets, pa.array([1, 2, -5, 3000, 7, 1000], pa.int32()),
                                   mask=pa.array([False, True, False]))
    with pytest.raises(TraceFormatError) as e:
        check_rounds(pa.table({"emitted": bad}), tmp_path, {"params": {"n_vocab": 1000}})
    assert e.value.one_line() == (f"{tmp_path}: 'emitted': rounds column breaks the trace format (1 row, first row 2) "
                                  "(expected token ids 0..999 (params.n_vocab 1000), got 1000)")
