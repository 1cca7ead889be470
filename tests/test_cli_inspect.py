"""``mtpscope inspect``: JSON / Markdown / text output and exit codes, checked against GGUFReader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gguf import GGUFReader
from gguf import GGUFValueType as V
from typer.testing import CliRunner

from mtpscope.cli.main import app
from tests.specs import drafter_spec

runner = CliRunner()


@pytest.fixture
def fork_path(write_gguf: Any) -> Path:
    arch, kv, tensors = drafter_spec("fork")
    kv = [*kv, ("t.nan", float("nan"), V.FLOAT32)]
    return write_gguf("fork.gguf", arch, kv, tensors)


def _run(*args: str) -> Any:
    return runner.invoke(app, ["inspect", *args])


def test_json_matches_gguf_reader(fork_path: Path) -> None:
    r = _run(str(fork_path), "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    oracle = GGUFReader(fork_path)
    assert rep["path"] == str(fork_path) and rep["gguf_version"] == 3
    assert rep["architecture"] == "gemma4_assistant"
    assert rep["dialect"]["kind"] == "fork" and rep["dialect"]["pattern"] is None
    assert rep["shape_order"] == "ne"
    assert len(rep["tensors"]) == len(oracle.tensors) == 51
    for t, rt in zip(rep["tensors"], oracle.tensors):
        assert t["name"] == rt.name
        assert t["ggml_type"] == rt.tensor_type.name
        assert t["shape"] == [int(d) for d in rt.shape]  # ne order, as GGUFReader's .shape
        assert t["n_bytes"] == rt.n_bytes and t["offset"] == rt.data_offset
    by_name = {t["name"]: t for t in rep["tensors"]}
    assert (by_name["blk.2.ffn_down.weight"]["component"], by_name["blk.2.ffn_down.weight"]["layer"]) == (
        "feed_forward", 2)
    assert by_name["mtp.centroids.weight"]["component"] == "centroid_head"
    assert by_name["mtp.centroids.weight"]["layer"] is None
    # metadata: small values inline, the 256-token array summarised, NaN as a string (valid JSON)
    md = rep["metadata"]
    assert md["gemma4_assistant.n_embd_backbone"] == 64
    assert md["gemma4_assistant.attention.sliding_window_pattern"] == [True, True, True, False]
    assert md["tokenizer.ggml.tokens"] == {"element_type": "STRING", "length": 256,
                                           "head": [f"t{i}" for i in range(8)]}
    assert rep["metadata_types"]["tokenizer.ggml.tokens"] == "ARRAY[STRING]"
    assert md["t.nan"] == "nan"
    assert rep["n_bytes"] == sum(int(t.n_bytes) for t in oracle.tensors)
    assert rep["problems"] == []            # always there, so a script reads it without a fallback


def test_json_full_and_filter(fork_path: Path) -> None:
    r = _run(str(fork_path), "--json", "--full", "--filter", "mtp.*")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["metadata"]["tokenizer.ggml.tokens"] == [f"t{i}" for i in range(256)]
    assert [t["name"] for t in rep["tensors"]] == ["mtp.pre_projection.weight", "mtp.post_projection.weight",
                                                   "mtp.centroids.weight", "mtp.token_ordering.weight"]
    assert rep["filter"] == "mtp.*" and rep["n_tensors"] == 4
    assert set(rep["by_component"]) == {"projection", "centroid_head", "token_ordering"}


def test_markdown_and_text(fork_path: Path) -> None:
    r = _run(str(fork_path), "--markdown", "--filter", "blk.0.*")
    assert r.exit_code == 0, r.output
    assert "| `gemma4_assistant.n_embd_backbone` | UINT32 | 64 |" in r.stdout
    assert "dialect: **fork**" in r.stdout
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| blk.0.")]
    assert len(rows) == 11
    assert any(ln.startswith("| blk.0.attn_q.weight | Q8_0 | [32, 64] |") for ln in rows)
    t = _run(str(fork_path))
    assert t.exit_code == 0
    assert "dialect: fork" in t.stdout and "mtp.token_ordering.weight" in t.stdout
    assert "(256 elements)" in t.stdout


def test_unreadable_file_exit_2_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (2**63).to_bytes(8, "little") + bytes(8))
    r = _run(str(bad), "--json")
    assert r.exit_code == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "tensor count" in lines[0]
    missing = _run(str(tmp_path / "missing.gguf"))
    assert missing.exit_code == 2 and len(missing.stderr.strip().splitlines()) == 1


def test_real_tokenizer_json(vocab_gguf: Path) -> None:
    r = _run(str(vocab_gguf), "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["architecture"] == "gemma4" and rep["dialect"]["kind"] == "target"
    assert rep["metadata"]["tokenizer.ggml.tokens"]["length"] == 262144
    assert rep["metadata"]["tokenizer.ggml.merges"]["length"] == 514906
    assert rep["metadata"]["gemma4.embedding_length"] == 2816
    assert rep["tensors"] == []


def test_big_endian_and_option_clash_exit_2(write_gguf: Any) -> None:
    from gguf import GGUFEndian

    be = write_gguf("be.gguf", "gemma4", [("k", 1, V.UINT32)], endianess=GGUFEndian.BIG)
    r = _run(str(be))
    assert r.exit_code == 2 and "big-endian" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    ok = write_gguf("ok.gguf", "gemma4", [("k", 1, V.UINT32)])
    clash = _run(str(ok), "--json", "--markdown")
    assert clash.exit_code == 2 and clash.stdout == ""


def _with_unknown_types(write_gguf: Any, tmp_path: Path, types: dict[str, int]) -> Path:
    """A GGUF written by gguf-py with F32 tensors a, b, c whose ggml type field is then overwritten with ``types``
    (its offset found through gguf-py's own reader: after the name, n_dims and the two ne values)."""
    import struct

    import numpy as np

    x = np.arange(64, dtype=np.float32).reshape(2, 32)
    p = write_gguf("u.gguf", "gemma4", [], [("a", x), ("b", x), ("c", x)])
    data = bytearray(p.read_bytes())
    for t in GGUFReader(p).tensors:
        if t.name in types:
            type_pos = t.field.offset + 8 + len(t.name) + 4 + 2 * 8
            assert struct.unpack_from("<I", data, type_pos)[0] == 0   # F32, where we expected it
            struct.pack_into("<I", data, type_pos, types[t.name])
    q = tmp_path / "unknown.gguf"
    q.write_bytes(bytes(data))
    return q


def test_unknown_ggml_type_shows_the_inventory_and_exits_1(write_gguf: Any, tmp_path: Path) -> None:
    """A tensor of ggml type 77 (no such type): the inventory is still printed (every tensor, the type named), and
    one stderr line names the file, the tensor and the type number, exit 1 (was exit 0, nothing on stderr); the
    JSON names it under ``problems`` too, with or without a ``--filter`` that leaves it out (was: only the exit
    code and the tensor's null ``n_bytes`` told a script)."""
    q = _with_unknown_types(write_gguf, tmp_path, {"b": 77})
    for args in ([], ["--json"], ["--markdown"], ["--filter", "a"]):
        r = _run(str(q), *args)
        assert r.exit_code == 1, (args, r.output)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, (args, r.stderr)
        assert lines[0].startswith(f"mtpscope: {q}: 'b': ") and "unknown ggml type" in lines[0], lines
        assert lines[0].endswith("got 77)"), lines
    rep = json.loads(_run(str(q), "--json").stdout)
    assert [(t["name"], t["ggml_type_id"], t["n_bytes"]) for t in rep["tensors"]] == [
        ("a", 0, 2 * 32 * 4), ("b", 77, None), ("c", 0, 2 * 32 * 4)]
    assert rep["problems"] == [{"kind": "unknown_ggml_type", "tensor": "b", "ggml_type_id": 77}]
    filtered = json.loads(_run(str(q), "--json", "--filter", "a").stdout)
    assert [t["name"] for t in filtered["tensors"]] == ["a"] and filtered["problems"] == rep["problems"]
    assert "unknown type 77" in _run(str(q)).stdout


def test_several_unknown_ggml_types_still_one_line(write_gguf: Any, tmp_path: Path) -> None:
    q = _with_unknown_types(write_gguf, tmp_path, {"a": 90, "c": 91})
    r = _run(str(q))
    assert r.exit_code == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"mtpscope: {q}: 'a': ") and "got 90)" in lines[0], lines
    assert "'c' (91)" in lines[0], lines
    rep = json.loads(_run(str(q), "--json").stdout)
    assert [(p["kind"], p["tensor"], p["ggml_type_id"]) for p in rep["problems"]] == [
        ("unknown_ggml_type", "a", 90), ("unknown_ggml_type", "c", 91)]
