"""``mtpscope quantize``: llama.cpp's own quantizer (``llama_model_quantize``) with provenance, on a tiny
pair whose drafter has rows of 256 elements (so the k-quants apply, not only their fallbacks).

- the quantized file's tensor types, read back with gguf-py, are those llama.cpp's rules give for the
  file type on these shapes (``src/llama-quant.cpp`` of the vendored llama.cpp, written out by hand
  below: q4_k_m keeps the tied head and two ``ffn_down`` at Q6_K and falls back to Q5_0 for rows not
  a multiple of 256); the provenance keys read back with gguf-py, the header hash recomputed with
  hashlib;
- a trace recorded with each quantization (real llama.cpp), and replayed: the reference drafter reads
  the quantized weights (gguf.quants) and its argmax agrees with llama.cpp's drafts;
- bad input is one line (exit 2): an unknown type lists llama.cpp's, an unreadable file names its
  offset, llama.cpp's refusal is quoted, and no file or temporary file is left behind;
- the cache is keyed by the input's content and the type: a second request is a hit, a file with the
  same header and other weights is another key.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.numerics import assert_replay_faithful

pytest.importorskip("llama_cpp")
from gguf import GGUFReader

from mtpscope.cli.main import app

pytestmark = [pytest.mark.llama]

runner = CliRunner()
#: ``enum llama_ftype`` of llama.h (the ids ``general.file_type`` stores)
FTYPE_IDS = {"f32": 0, "q8_0": 7, "q4_k_m": 15}
QK_K = 256  # k-quant super-block (ggml-common.h); Q4_0 / Q5_0 / Q8_0 blocks are 32


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, Path]:
    """The demo's construction with n_embd = n_ff = 256 (subset vocabulary: 4096 tokens): target,
    F32 drafter and the drafter quantized to each type by ``mtpscope quantize``."""
    from mtpscope.demo import build as demo
    from mtpscope.demo.spec import DEFAULT_DIMS

    d = tmp_path_factory.mktemp("quant")
    dims = replace(DEFAULT_DIMS, n_embd=256, n_ff=256)
    out = {"target": demo.write_target(d / "target.gguf", vocab="subset", dims=dims),
           "drafter": demo.write_drafter(d / "drafter.gguf", vocab="subset", dims=dims)}
    for t in FTYPE_IDS:
        r = runner.invoke(app, ["quantize", str(out["drafter"]), str(d / f"drafter-{t}.gguf"), "--type", t,
                                "--threads", "1"])
        assert r.exit_code == 0, r.output
        assert f"wrote {d / f'drafter-{t}.gguf'}: {t}" in r.output
        out[t] = d / f"drafter-{t}.gguf"
    return out


def _use_more_bits(i_layer: int, n_layer: int) -> bool:
    """llama-quant.cpp's ``use_more_bits``: the first and last eighth of the layers and every third between."""
    return i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8 or (i_layer - n_layer // 8) % 3 == 2


def _fallback(qtype: str, ne0: int) -> str:
    """``tensor_type_fallback``: a row length that is not a multiple of the block gets the next type."""
    block = QK_K if qtype.endswith("_K") else 32
    if ne0 % block == 0:
        return qtype
    return {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}[qtype]


def expected_type(ftype: str, name: str, ne: list[int], n_layer: int, source_type: str) -> str:
    """The type llama.cpp's quantizer gives a tensor of this drafter (no output.weight: the token
    embedding is the tied head) for ``q8_0`` / ``q4_k_m`` / ``f32`` (llama-quant.cpp, by hand)."""
    if len(ne) < 2 or "_norm.weight" in name:
        return source_type                                    # only 2-D weights are quantized
    if ftype == "f32":
        return "F32"
    if ftype == "q8_0":
        return "Q8_0"                                         # every row here is a multiple of 32
    if name == "token_embd.weight":                           # tied embeddings: the output tensor's rule
        return "Q8_0" if ne[0] % QK_K else "Q6_K"
    if ".ffn_down." in name:
        i = int(name.split(".")[1])
        return _fallback("Q6_K" if _use_more_bits(i, n_layer) else "Q4_K", ne[0])
    return _fallback("Q4_K", ne[0])


@pytest.mark.parametrize("ftype", sorted(FTYPE_IDS))
def test_tensor_types_and_provenance_read_back_with_gguf_py(pair, ftype: str) -> None:
    src, out = GGUFReader(pair["drafter"]), GGUFReader(pair[ftype])
    n_layer = int(src.fields["gemma4-assistant.block_count"].contents())
    want = {t.name: expected_type(ftype, t.name, [int(x) for x in t.shape], n_layer, t.tensor_type.name)
            for t in src.tensors}
    got = {t.name: t.tensor_type.name for t in out.tensors}
    assert got == want
    if ftype == "q4_k_m":   # the mix, not one type: some k-quants, their fallbacks, Q6_K where llama.cpp keeps more bits
        assert {"Q4_K", "Q5_0", "Q6_K"} <= set(got.values())
        assert got["blk.3.ffn_down.weight"] == "Q6_K" and got["blk.0.ffn_down.weight"] == "Q4_K"
    f = out.fields
    header = hashlib.sha256(pair["drafter"].read_bytes()[:src.data_offset]).hexdigest()
    assert f["mtpscope.quantize.source"].contents() == "drafter.gguf"
    assert f["mtpscope.quantize.source_header_sha256"].contents() == header
    assert f["mtpscope.quantize.type"].contents() == ftype
    assert f["mtpscope.quantize.llama_cpp"].contents().startswith("llama-cpp-python 0.3.36, ggml ")
    assert "mtpscope.quantize.source_sha256" not in f          # only the cache hashes the whole input
    assert f["general.file_type"].contents() == FTYPE_IDS[ftype]
    # every key of the input is still there, with its value
    for k, v in src.fields.items():
        if not k.startswith("GGUF.") and k not in ("general.file_type",):
            assert k in f and f[k].contents() == v.contents(), k


@pytest.mark.slow
def test_record_and_replay_with_each_quantization(pair, tmp_path: Path) -> None:
    from mtpscope.traces.run.record_config import RecordConfig
    from mtpscope.traces.run.recorder import record
    from mtpscope.traces.run.replay import replay
    from mtpscope.traces.store.reader import open_trace

    for t in ("f32", "q8_0", "q4_k_m"):
        s = record(RecordConfig(n_draft=3, max_tokens=12), target=pair["target"], assistant=pair[t],
                   out=tmp_path / t, prompts=["The quick brown fox", "def fibonacci(n):"], isolate=False)
        assert s.n_rounds > 0 and s.n_drafted > 0
        man = open_trace(tmp_path / t).manifest
        r = GGUFReader(pair[t])
        assert man["models"]["assistant"]["header_sha256"] == hashlib.sha256(
            pair[t].read_bytes()[:r.data_offset]).hexdigest()
        summ = replay(tmp_path / t).summary().to_dict()
        agree = summ["variants"]["baseline"]["agreement"]
        mats: dict[str, int] = {}
        for x in r.tensors:
            if len(x.shape) >= 2:
                mats[x.tensor_type.name] = mats.get(x.tensor_type.name, 0) + 1
        assert summ["drafter_weights"]["matrices"] == dict(sorted(mats.items()))
        # every type: the baseline (activations rounded to each weight type's vec_dot_type) reproduces llama.cpp
        # up to near ties of the CPU's summation order (docs/FIDELITY.md, "Every x86 CPU")
        assert_replay_faithful(summ, f"{t} drafter")
        if t == "f32":
            assert not summ["drafter_weights"]["quantized"]
        else:
            assert summ["drafter_weights"]["quantized"] and summ["drafter_weights"]["type"] == t
            assert any("quantized" in n for n in summ["notes"])
        # a wrong dequantization drafts unrelated tokens: detected whatever the agreement threshold was
        assert agree >= 0.9, summ


def _one_line(r) -> str:
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1, r.output
    return lines[0]


def test_bad_input_is_one_line_and_leaves_no_file(pair, tmp_path: Path) -> None:
    out = tmp_path / "o.gguf"
    line = _one_line(runner.invoke(app, ["quantize", str(pair["drafter"]), str(out), "--type", "q5"]))
    assert "'--type'" in line and "got q5" in line and "q4_k_m" in line and "iq4_xs" in line and "f32" in line
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 8)
    line = _one_line(runner.invoke(app, ["quantize", str(bad), str(out), "--type", "q8_0"]))
    assert str(bad) in line and "offset" in line
    line = _one_line(runner.invoke(app, ["quantize", str(tmp_path / "none.gguf"), str(out)]))
    assert "none.gguf" in line
    # llama.cpp's own refusal, quoted: it does not requantize quantized tensors (llama-quant.cpp)
    line = _one_line(runner.invoke(app, ["quantize", str(pair["q4_k_m"]), str(out), "--type", "q8_0"]))
    assert "requantizing from type q4_K is disabled" in line and str(pair["q4_k_m"]) in line
    line = _one_line(runner.invoke(app, ["quantize", str(pair["drafter"]), str(out), "--type", "iq2_xxs"]))
    assert "this quantization requires an imatrix" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]
    # an existing output is kept unless --overwrite
    out.write_bytes(b"mine")
    line = _one_line(runner.invoke(app, ["quantize", str(pair["drafter"]), str(out), "--type", "q8_0"]))
    assert "--overwrite" in line and out.read_bytes() == b"mine"
    r = runner.invoke(app, ["quantize", str(pair["drafter"]), str(out), "--type", "q8_0", "--overwrite"])
    assert r.exit_code == 0, r.output
    assert GGUFReader(out).fields["mtpscope.quantize.type"].contents() == "q8_0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf", "o.gguf"]
    # more threads than ggml makes (GGML_MAX_N_THREADS, 512): one line, before llama.cpp aborts making them
    r = runner.invoke(app, ["quantize", str(pair["drafter"]), str(tmp_path / "t.gguf"), "--threads", "99999"])
    assert r.exit_code == 2 and "'--threads'" in r.output and "less than or equal to 512" in r.output, r.output
    from mtpscope.errors import TraceError
    from mtpscope.traces.run.quantize import quantize_file

    with pytest.raises(TraceError, match=r"quantizer threads must be in 0\.\.512"):
        quantize_file(pair["drafter"], tmp_path / "t.gguf", "q8_0", n_threads=513)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf", "o.gguf"]



def test_an_output_that_is_no_regular_file_or_cannot_be_written_is_refused_naming_it(pair, tmp_path: Path) -> None:
    import stat

    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    folder = tmp_path / "folder.gguf"
    folder.mkdir()
    for out, kind in ((fifo, "a FIFO"), (folder, "a directory")):
        for extra in ([], ["--overwrite"]):   # --overwrite never replaces a device, FIFO or folder
            line = _one_line(runner.invoke(app, ["quantize", str(pair["drafter"]), str(out), "--type", "q8_0", *extra]))
            assert str(out) in line and "not a regular file" in line and kind in line, line
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and folder.is_dir() and not any(folder.iterdir())
    # a folder that takes no new file (here: a path below a regular file): the line names the output
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    out = plain / "o.gguf"
    line = _one_line(runner.invoke(app, ["quantize", str(pair["drafter"]), str(out), "--type", "q8_0"]))
    assert str(out) in line and "cannot write the output" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.gguf", "pipe.gguf", "plain.txt"]

def test_the_cache_is_keyed_by_content_and_type(pair, tmp_path: Path) -> None:
    from mtpscope.traces.run.quantize import quantized_copy

    said: list[str] = []
    a = quantized_copy(pair["drafter"], "q8_0", cache=tmp_path, n_threads=1, on_quantize=said.append)
    b = quantized_copy(pair["drafter"], "Q8_0", cache=tmp_path, n_threads=1, on_quantize=said.append)
    digest = hashlib.sha256(pair["drafter"].read_bytes()).hexdigest()
    assert a.out == b.out == tmp_path / "quant" / digest / "q8_0.gguf"
    assert not a.cached and b.cached and len(said) == 1
    assert GGUFReader(a.out).fields["mtpscope.quantize.source_sha256"].contents() == digest
    # same header, other weights: another input
    other = tmp_path / "drafter.gguf"
    shutil.copyfile(pair["drafter"], other)
    r = GGUFReader(other)
    t = next(x for x in r.tensors if x.name == "blk.0.ffn_up.weight")
    with open(other, "r+b") as fh:
        fh.seek(int(t.data_offset))
        fh.write(np.full(4, 0.5, np.float32).tobytes())
    c = quantized_copy(other, "q8_0", cache=tmp_path, n_threads=1, on_quantize=said.append)
    assert c.out != a.out and not c.cached and len(said) == 2
    assert (GGUFReader(c.out).fields["mtpscope.quantize.source_header_sha256"].contents()
            == GGUFReader(a.out).fields["mtpscope.quantize.source_header_sha256"].contents())
    # a damaged cached file is made again, never used
    os.truncate(a.out, 100)
    d = quantized_copy(pair["drafter"], "q8_0", cache=tmp_path, n_threads=1, on_quantize=said.append)
    assert not d.cached and len(said) == 3 and GGUFReader(d.out).fields["mtpscope.quantize.type"].contents() == "q8_0"


def test_sweep_quant_assistants_names_refusals_and_resume(pair, tmp_path: Path, monkeypatch) -> None:
    from mtpscope.errors import MtpscopeError
    from mtpscope.traces.sweep.quant import quant_assistants, restore_quantized
    from mtpscope.traces.sweep.spec import SweepPrompt, SweepSpec

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "a b c", "category": "x"}\n')
    base = ["sweep", "--target", str(pair["target"]), "--assistant", str(pair["drafter"]), "--prompts", str(prompts),
            "--out", str(tmp_path / "o")]
    line = _one_line(runner.invoke(app, [*base, "--assistant-quant", "q8_0,q5"]))
    assert "'--assistant-quant'" in line and "got q5" in line and "q4_k_m" in line
    line = _one_line(runner.invoke(app, [*base, "--assistant-quant", "q8_0,Q8_0"]))
    assert "repeat" in line and "q8_0" in line
    monkeypatch.setenv("MTPSCOPE_CACHE", str(tmp_path / "cli-cache"))
    r = runner.invoke(app, [*base, "--assistant", str(pair["q4_k_m"]), "--assistant-quant", "q8_0"])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]   # progress lines, then the one error line
    assert [ln for ln in lines if ln.startswith("mtpscope:")] == lines[-1:]
    assert "requantizing from type q4_K is disabled" in lines[-1] and all(ln.startswith("quantizing ") for ln in lines[:-1])
    refused = hashlib.sha256(pair["q4_k_m"].read_bytes()).hexdigest()
    assert not (tmp_path / "cli-cache" / "quant" / refused).exists()
    assert not (tmp_path / "o").exists()

    cache = tmp_path / "cache"
    one, recs = quant_assistants([("d", str(pair["drafter"]))], ["f32", "q8_0"], cache=cache, n_threads=1)
    assert [n for n, _ in one] == ["f32", "q8_0"] and [r.qtype for r in recs] == ["f32", "q8_0"]
    two, _ = quant_assistants([("a", str(pair["drafter"])), ("b", str(pair["f32"]))], ["q8_0"], cache=cache,
                              n_threads=1)
    assert [n for n, _ in two] == ["a-q8_0", "b-q8_0"]
    spec = SweepSpec(target=str(pair["target"]), assistants=one, prompts=(SweepPrompt(0, "a b c", "x"),),
                     n_drafts=(2,), n_shards=1, quantized=recs).check()
    assert SweepSpec.from_state({"spec": spec.to_dict(), "prompts": [
        {"index": 0, "text": "a b c", "category": "x"}]}) == spec
    assert restore_quantized(spec, cache=cache) is spec        # every file there: nothing to do
    Path(one[1][1]).unlink()
    said: list[str] = []
    again = restore_quantized(spec, cache=cache, n_threads=1, on_quantize=said.append)
    assert again.assistants == spec.assistants and Path(one[1][1]).is_file() and len(said) == 1
    Path(one[1][1]).unlink()
    moved = replace(spec, quantized=(recs[0], replace(recs[1], source_sha256="0" * 64)))
    with pytest.raises(MtpscopeError, match="source drafter is gone or changed"):
        restore_quantized(moved, cache=cache)
    with pytest.raises(MtpscopeError, match="not one of the sweep's assistants"):
        replace(spec, quantized=(replace(recs[0], name="other"),)).check()
