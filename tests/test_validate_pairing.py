"""Drafter ↔ target pairing and the ``mtpscope verify`` command line (exit codes 0 / 1 / 2, --json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mtpscope.cli.main import app
from mtpscope.inspector.validate import verify
from tests.builders import FK, GGUF_ARRAY, GGUF_BOOL, U32, UP, MetaValue, build, one, parts, set_key, write


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pair")
    return {k: write(d / f"{k}.gguf", *parts(k)) for k in ("upstream", "fork", "target")}


def _target(tmp_path: Path, fn, name: str = "t.gguf") -> Path:
    arch, kv, t = parts("target")
    fn(kv, t)
    return write(tmp_path / name, arch, kv, t)


@pytest.mark.parametrize("kind", ["upstream", "fork"])
def test_valid_pair(pair: dict[str, Path], kind: str) -> None:
    r = verify(pair[kind], target=pair["target"])
    assert r.ok and r.pairing is not None and r.pairing.ok
    # target of 6 layers [s, s, f, s, s, f]: llama.cpp n_layer-2 = 4, n_layer-1 = 5; HF: last of each type
    assert dict(r.pairing.kv_donors) == {"sliding": 4, "full": 5}
    assert dict(r.pairing.kv_donors_hf) == {"sliding": 4, "full": 5}
    assert r.to_dict()["pairing"]["kv_donors"] == {"sliding": 4, "full": 5}


def test_backbone_width_mismatch(tmp_path: Path, pair: dict[str, Path]) -> None:
    from mtpscope.demo import build as demo

    t = demo.write_target(tmp_path / "t96.gguf", vocab="subset",
                          dims=demo.TinyDims(n_embd_backbone=96, n_embd=128))
    r = verify(pair["upstream"], target=t)
    f = one(r, "E_PAIR_BACKBONE")
    assert (f.expected, f.actual) == (64, 96) and not r.ok


def test_vocab_mismatch(tmp_path: Path, pair: dict[str, Path]) -> None:
    def change(kv, t) -> None:
        mv = kv["tokenizer.ggml.tokens"]
        toks = list(mv.value)
        toks[100] = b"other"
        kv["tokenizer.ggml.tokens"] = MetaValue(mv.type, toks, mv.sub_type)
    r = verify(pair["upstream"], target=_target(tmp_path, change))
    f = one(r, "E_PAIR_VOCAB")
    assert "1 token strings differ, first at id 100" in f.message and "'other'" in f.message

    def shorter(kv, t) -> None:
        mv = kv["tokenizer.ggml.tokens"]
        kv["tokenizer.ggml.tokens"] = MetaValue(mv.type, list(mv.value)[:4000], mv.sub_type)
    r = verify(pair["upstream"], target=_target(tmp_path, shorter, "s.gguf"))
    f = one(r, "E_PAIR_VOCAB")
    assert (f.expected, f.actual) == (4000, 4096)


def test_kv_heads_and_head_dims(tmp_path: Path, pair: dict[str, Path]) -> None:
    arch, kv, t = parts("upstream")
    kv[UP + ".attention.head_count_kv"] = U32(2)
    r = verify(write(tmp_path / "d.gguf", arch, kv, t), target=pair["target"])
    heads = [f for f in r.findings if f.code == "E_PAIR_KV_HEADS"]
    assert len(heads) == 4 and {(f.expected, f.actual) for f in heads} == {(1, 2)}
    r = verify(pair["upstream"], target=_target(tmp_path, set_key("gemma4.attention.key_length_swa", U32(16))))
    dims = [f for f in r.findings if f.code == "E_PAIR_HEAD_DIM"]
    assert len(dims) == 3 and {(f.expected, f.actual) for f in dims} == {(16, 32)}   # the 3 sliding layers


def test_donor_layers_of_an_unusual_target(tmp_path: Path, pair: dict[str, Path]) -> None:
    pattern = MetaValue(GGUF_ARRAY, [True, True, False, True, False, True], GGUF_BOOL)
    r = verify(pair["upstream"], target=_target(tmp_path, set_key("gemma4.attention.sliding_window_pattern", pattern)))
    assert dict(r.pairing.kv_donors_hf) == {"sliding": 5, "full": 4}
    flagged = {f.subject for f in r.findings if f.code == "E_PAIR_KV_DONOR" and f.severity == "error"}
    assert flagged == {"blk.4", "blk.5"}


def test_window_warning(tmp_path: Path, pair: dict[str, Path]) -> None:
    arch, kv, t = parts("fork")
    kv[FK + ".attention.sliding_window"] = U32(256)
    r = verify(write(tmp_path / "w.gguf", arch, kv, t), target=pair["target"])
    f = one(r, "W_PAIR_WINDOW")
    assert (f.expected, f.actual) == (128, 256) and r.ok


def test_target_must_be_gemma4(pair: dict[str, Path]) -> None:
    r = verify(pair["upstream"], target=pair["fork"])
    assert one(r, "E_PAIR_TARGET_ARCH").actual == "gemma4_assistant"
    r = verify(pair["target"], target=pair["target"])
    assert one(r, "E_PAIR_TARGET_ARCH").actual == "gemma4"


def test_a_target_without_an_architecture_is_said_so_not_none(tmp_path: Path, pair: dict[str, Path]) -> None:
    """A target GGUF with no general.architecture: the finding says so (before: "found None ... got None")."""
    arch, kv, t = parts("target")
    f = one(verify(pair["upstream"], target=write(tmp_path / "t.gguf", None, kv, t)), "E_PAIR_TARGET_ARCH")
    assert f.actual == "no general.architecture" and "None" not in f.message
    assert f.message.endswith("found no general.architecture")


# --- CLI -------------------------------------------------------------------------------------------------

def test_cli_exit_codes_and_json(tmp_path: Path, pair: dict[str, Path]) -> None:
    run = CliRunner().invoke
    res = run(app, ["verify", str(pair["fork"]), "--target", str(pair["target"])])
    assert res.exit_code == 0, res.output
    assert "OK: 0 errors" in res.stdout and "refuses" in res.stdout
    bad = build(tmp_path, "up_masked_embd")
    res = run(app, ["verify", str(bad), "--json"])
    assert res.exit_code == 1
    d = json.loads(res.stdout)
    assert {"dialect", "ok", "findings", "loadability"} <= d.keys()
    assert d["ok"] is False and d["dialect"] == "upstream"
    assert "E_MASKED_EMBD_UPSTREAM" in {f["code"] for f in d["findings"]}
    up = next(v for v in d["loadability"] if v["runtime"].startswith("llama.cpp"))
    assert up["loads"] is False and "_M_range_check" in up["reasons"][0]
    res = run(app, ["verify", str(bad)])
    assert res.exit_code == 1 and "E_MASKED_EMBD_UPSTREAM" in res.stdout
    # the counts of the JSON's findings, in words: "1 error", not "1 errors"
    n = {s: sum(f["severity"] == s for f in d["findings"]) for s in ("error", "warning")}
    assert n["error"] >= 1
    assert "NOT OK: " + ", ".join(f"{n[s]} {s}" + ("" if n[s] == 1 else "s") for s in n) in res.stdout, res.stdout
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"NOPE" + bytes(40))
    res = run(app, ["verify", str(junk)])
    assert res.exit_code == 2
    res = run(app, ["verify", str(pair["fork"]), "--target", str(junk)])
    assert res.exit_code == 2


def test_kv_heads_per_layer_array(tmp_path: Path, pair: dict[str, Path]) -> None:
    r = verify(build(tmp_path, "up_head_count_kv_array"), target=pair["target"])   # [1, 1, 1, 2]
    f = one(r, "E_PAIR_KV_HEADS")
    assert f.subject.endswith("head_count_kv[3]") and (f.expected, f.actual) == (1, 2)
