"""The write-ahead log's record format (traces/store/wal.py): what goes in comes back, a cut at any byte keeps
exactly the rounds appended before it, a flipped bit ends the log there, logs of older writers (Arrow IPC
segments) are still recovered, and a round that does not fit the schema costs only itself."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from mtpscope import traces
from mtpscope.traces import RoundRecord, StepRecord, TraceWriter
from mtpscope.traces.store import schema as S
from mtpscope.traces.store.wal import WalLog, read_log

STEPS_F16 = S.steps_schema(6, 4, "f16", False)


def _round(r: int, n_acc: int = 1, **kw) -> RoundRecord:
    drafted = (100 + r, 200 + r, 300 + r)
    values = dict(prompt_id=0, round=r, pos=10 + r, pending_token=r, n_draft=3, drafted=drafted, n_accepted=n_acc,
                  target=drafted[:n_acc] + (9,) * (4 - n_acc), emitted=drafted[:n_acc] + (9,), t_draft_ms=0.1 + r,
                  t_verify_ms=None, eog_confirmed=None if r % 2 else False)
    return RoundRecord(**{**values, **kw})


def _steps(r: int) -> list[StepRecord]:
    """Round ``r``'s three steps (with :func:`_round`'s default n_acc 1: tokens its drafts, target tokens its target)."""
    rng = np.random.default_rng(r)
    return [StepRecord(k=k, token=100 * k + r, logit=np.float32(1.25 * k), rank=0, top_ids=(100 * k + r, 5),
                       top_logits=(float("nan"), -1.0), target_token=100 + r if k == 1 else 9, target_rank=None, accepted=np.bool_(k == 1),
                       h=rng.standard_normal(6).astype(np.float32), h_next=None,
                       h_inner=rng.standard_normal(4).astype(np.float32) if k != 2 else None,
                       target_p_drafted=1e-30, target_entropy=float("inf"))
            for k in (1, 2, 3)]


def _log(tmp_path: Path, n: int, schema: pa.Schema = STEPS_F16) -> tuple[Path, list[int]]:
    """A log of ``n`` rounds and the file's size after each append (the record boundaries, by stat)."""
    log = WalLog(tmp_path, 0, schema)
    sizes = [os.path.getsize(log.paths[0])]
    for r in range(n):
        log.append(_round(r), _steps(r))
        sizes.append(os.path.getsize(log.paths[0]))
    log.close()
    return log.paths[0], sizes


def test_what_goes_in_comes_back(tmp_path: Path) -> None:
    path, _ = _log(tmp_path, 3)
    got = read_log(path)
    assert got.torn_bytes == 0 and got.n_rounds_invalid == 0 and len(got.items) == 3
    for r, (rr, steps) in enumerate(got.items):
        assert rr == _round(r)
        for s, want in zip(steps, _steps(r), strict=True):
            assert (s.k, s.token, s.logit, s.top_ids, s.target_token, s.target_rank, s.accepted) == \
                (want.k, want.token, 1.25 * want.k, want.top_ids, want.target_token, None, want.k == 1)
            assert math.isnan(s.top_logits[0]) and s.top_logits[1] == -1.0
            assert s.target_p_drafted == 1e-30 and s.target_entropy == float("inf")
            # stored in the trace's dtype: float16 of the value given
            np.testing.assert_array_equal(s.h, want.h.astype(np.float16).astype(np.float32))
            assert s.h_next is None
            assert (s.h_inner is None) == (want.h_inner is None)
            if want.h_inner is not None:
                np.testing.assert_array_equal(s.h_inner, want.h_inner.astype(np.float16).astype(np.float32))


def test_a_cut_at_any_byte_keeps_exactly_the_rounds_before_it(tmp_path: Path) -> None:
    path, sizes = _log(tmp_path, 3)
    data = path.read_bytes()
    cut = tmp_path / "cut.log"
    for n in range(sizes[1] - 3, len(data) + 1):        # from inside the first round's record to the end
        cut.write_bytes(data[:n])
        got = read_log(cut)
        whole = sum(1 for b in sizes[1:] if b <= n)
        assert [r.round for r, _ in got.items] == list(range(whole)), n
        assert got.torn_bytes == n - sizes[whole], n
        assert got.n_rounds_invalid == 0 and got.problem is None, (n, got.problem)   # a torn end: no damage


def test_a_flipped_bit_ends_the_log_at_that_record(tmp_path: Path) -> None:
    path, sizes = _log(tmp_path, 4)
    data = bytearray(path.read_bytes())
    data[(sizes[2] + sizes[3]) // 2] ^= 0x10           # inside the third round's record
    path.write_bytes(bytes(data))
    got = read_log(path)
    assert [r.round for r, _ in got.items] == [0, 1]
    assert got.torn_bytes == len(data) - sizes[2]
    assert got.problem == f"at offset {sizes[2]}: record corrupt (CRC-32 mismatch)"


def _killed_trace(tmp_path: Path, n: int) -> tuple[Path, Path, list[int]]:
    """A trace whose writer died after ``n`` rounds (its lock released, nothing closed): the folder, its log and
    the log's size after each append."""
    d = tmp_path / "t"
    w = TraceWriter(d, {"source": "synthetic"}, n_embd_backbone=6, n_embd=4, hidden_dtype="f16", centroids=False,
                    flush_every=100, background=False)
    log = d / "wal" / "part-00000.log"
    sizes = []
    for r in range(n):
        w.add_round(_round(r), _steps(r))
        sizes.append(os.path.getsize(log))
    os.close(w._lock_fd)
    w._lock_fd = None
    return d, log, sizes


@pytest.mark.parametrize("damage", ["flip", "future", "garbage"])
def test_a_log_that_cannot_be_read_to_its_end_is_kept_never_deleted(tmp_path: Path, damage: str) -> None:
    """Opening the trace recovers the rounds before the damage, keeps the log as wal/part-00000.log.damaged (its
    bytes as they were) and says so in one warning naming it and the offset; a second open finds nothing to do."""
    import json
    import struct
    import zlib

    d, log, sizes = _killed_trace(tmp_path, 4)
    data = bytearray(log.read_bytes())
    if damage == "flip":            # inside round 2's record: rounds 0 and 1 come back
        data[(sizes[1] + sizes[2]) // 2] ^= 0x10
        want_rounds, where = [0, 1], f"at offset {sizes[1]}: record corrupt (CRC-32 mismatch)"
    elif damage == "future":        # a newer writer's format: its first record says version 2
        n0 = struct.unpack_from("<I", data, 4)[0]
        head = json.loads(bytes(data[16:16 + n0]))
        head["version"] = 2
        new = json.dumps(head).encode()
        data[:16 + n0] = struct.pack("<4sIII", b"MTPW", len(new), zlib.crc32(new), len(new)) + new
        want_rounds, where = [], "at offset 0: not a log this version reads (expected mtpscope-wal version 1, got "
    else:
        data = bytearray(b"\x00garbage" * 100)
        want_rounds, where = [], "at offset 0: not a record (bad magic or lengths)"
    log.write_bytes(bytes(data))
    t = traces.open(d)
    assert list(t.rounds["round"]) == want_rounds
    kept = d / "wal" / "part-00000.log.damaged"
    assert kept.read_bytes() == bytes(data) and not log.exists()
    (w,) = [w for w in t.warnings if "write-ahead" in w]
    assert f"wal/part-00000.log: {where}" in w and "kept as wal/part-00000.log.damaged" in w, w
    assert t.manifest["recovered"]["problems"] and t.manifest["recovered"]["n_rounds_invalid"] == 0
    again = traces.open(d)
    assert not [w for w in again.warnings if "write-ahead" in w] and kept.exists()


def test_a_legacy_arrow_log_is_recovered(tmp_path: Path) -> None:
    """A trace left by a writer before the .log format: two Arrow IPC streams, one record batch per round."""
    from mtpscope.traces.store.columns import rounds_table, steps_table

    d = tmp_path / "t"
    TraceWriter(d, {"source": "synthetic"}, n_embd_backbone=6, n_embd=4, hidden_dtype="f16", centroids=False,
                flush_every=100, background=False, wal=False)       # its manifest; then it "dies"
    (d / "wal").mkdir()
    for table, schema, batches in (
            ("steps", STEPS_F16, [steps_table([(_round(r), s) for s in _steps(r)], STEPS_F16) for r in range(3)]),
            ("rounds", S.ROUNDS_SCHEMA, [rounds_table([_round(r)]) for r in range(3)])):
        with pa.OSFile(str(d / "wal" / f"part-00000.{table}.arrows"), "wb") as f, \
                pa.ipc.new_stream(f, schema) as ws:
            for b in batches:
                ws.write_table(b)
    t = traces.open(d)
    assert list(t.rounds["round"]) == [0, 1, 2] and len(t.steps) == 9
    assert t.manifest["recovered"]["n_rounds"] == 3
    np.testing.assert_array_equal(t.hidden("h")[3], _steps(1)[0].h.astype(np.float16).astype(np.float32))
    assert not list((d / "wal").glob("*.arrows"))


def test_recovery_drops_only_a_round_that_does_not_fit(tmp_path: Path) -> None:
    d = tmp_path / "t"
    w = TraceWriter(d, {"source": "synthetic"}, n_embd_backbone=6, n_embd=4, hidden_dtype="f16", centroids=False,
                    flush_every=100, background=False)
    w.add_round(_round(0), _steps(0))
    w._seg.append(_round(1, pending_token=2 ** 40), _steps(1))      # as if add_round had logged it
    w.add_round(_round(2), _steps(2))
    os.close(w._lock_fd)                                            # the writer dies
    w._lock_fd = None
    t = traces.open(d)
    assert list(t.rounds["round"]) == [0, 2] and len(t.steps) == 6
    rec = t.manifest["recovered"]
    assert rec["n_rounds"] == 2 and rec["n_rounds_invalid"] == 1 and rec["torn_bytes"] == 0
    assert any("; 1 round whose values do not fit the trace's schema dropped" in w for w in t.warnings)


def test_a_value_json_cannot_hold_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    from mtpscope.errors import TraceFormatError

    d = tmp_path / "t"
    w = TraceWriter(d, {"source": "synthetic"}, n_embd_backbone=None, n_embd=None, hidden_dtype=None,
                    centroids=False, flush_every=100, background=False)
    w.add_round(_round(0), [])
    size = os.path.getsize(d / "wal" / "part-00000.log")
    with pytest.raises(TraceFormatError, match="'prompt 0 round 1'"):
        w.add_round(_round(1, draft_path=object()), [])
    assert os.path.getsize(d / "wal" / "part-00000.log") == size
    w.close()
    assert list(traces.open(d).rounds["round"]) == [0]


def test_an_unreadable_legacy_log_is_kept(tmp_path: Path) -> None:
    d = tmp_path / "t"
    TraceWriter(d, {"source": "synthetic"}, n_embd_backbone=6, n_embd=4, hidden_dtype="f16", centroids=False,
                flush_every=100, background=False, wal=False)
    (d / "wal").mkdir()
    (d / "wal" / "part-00000.rounds.arrows").write_bytes(b"garbage" * 10)
    t = traces.open(d)
    assert len(t.rounds) == 0 and (d / "wal" / "part-00000.rounds.arrows.damaged").read_bytes() == b"garbage" * 10
    (w,) = [w for w in t.warnings if "write-ahead" in w]
    assert "wal/part-00000.rounds.arrows (an older writer's log): 70 bytes could not be read" in w, w


def test_trace_repair_names_a_damaged_log_and_exits_1(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    d, log, sizes = _killed_trace(tmp_path, 3)
    data = bytearray(log.read_bytes())
    data[sizes[1] + 20] ^= 0x01                     # inside round 2's record
    log.write_bytes(bytes(data))
    res = CliRunner().invoke(app, ["trace", "repair", str(d), "--json"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    assert doc["status"] == "recovered" and doc["recovered_rounds"] == 2 and doc["n_rounds"] == 2
    (problem,) = doc["problems"]
    assert problem.startswith(f"wal/part-00000.log: at offset {sizes[1]}: record corrupt (CRC-32 mismatch): "
                              "2 rounds before it recovered"), problem
