"""The native ``cb_eval`` capture (traces/run/llama/capture.c built by traces.run.llama.native_capture) against
the Python one and against the drafter's own weights, on the real llama.cpp; and its fall-backs (no compiler, a
failing compiler, the switch off), which leave the Python callback in place.

The C callback and the Python one copy the same node of the same graph with the same ggml call, so their
``h_inner`` must be equal bit for bit; that it is the right node is checked independently: the drafter's
logits and h_next recomputed from it with the GGUF's weights (gguf-py) as ggml's CPU mul_mat computes them
(F16 weights: the activation is rounded to F16 first), within the F32 summation bound of tests/numerics.py.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from mtpscope.errors import TraceError
from mtpscope.traces.run.llama import capture, native_capture
from mtpscope.traces.run.llama import model as lm
from mtpscope.traces.run.mtp_runtime import MtpRuntime
from mtpscope.traces.run.record_config import RecordConfig
from tests.builders import TINY_PROMPTS as PROMPTS
from tests.gguf_oracle import gguf_arrays, gguf_types
from tests.numerics import assert_matvec_close

pytestmark = pytest.mark.llama


def test_native_capture_equals_python_capture_and_the_weights(pair) -> None:
    if native_capture.load() is None:
        pytest.skip(f"native capture not built here: {native_capture.unavailable_reason()}")
    tm, dm = lm.LlamaModel(pair["target"]), lm.LlamaModel(pair["noisy"])
    tc = lm.LlamaContext(tm, n_ctx=256, n_batch=64, flash_attn=False)
    nat = capture.node_capture("result_norm")
    py = capture.node_capture("result_norm", native=False)
    assert isinstance(nat, native_capture.NativeCapture) and isinstance(py, capture.NodeCapture)
    dn = lm.LlamaContext(dm, n_ctx=256, n_batch=64, mtp_of=tc, capture=nat, masked=True)
    dp = lm.LlamaContext(dm, n_ctx=256, n_batch=64, mtp_of=tc, capture=py, masked=True)
    tb, db = lm.TokenBatch(64), lm.DraftBatch(dm.n_embd_inp)
    try:
        toks = tm.tokenize(PROMPTS[1])
        tb.set(toks, 0)
        tc.decode(tb)
        tok, h = int(np.argmax(tc.logits(-1))), tc.nextn(len(toks) - 1).copy()
        w, ty = gguf_arrays(pair["noisy"]), gguf_types(pair["noisy"])
        for _ in range(4):
            out = []
            for ctx, cap in ((dn, nat), (dp, py)):
                cap.reset()
                db.set(tok, len(toks), h)
                ctx.decode(db)
                out.append((cap.get("result_norm"), ctx.logits(0).copy(), ctx.nextn(0).copy()))
            (hn, ln, xn), (hp, lp, xp) = out
            assert hn.dtype == np.float32 and hn.shape == (dm.n_embd,)
            np.testing.assert_array_equal(hn, hp)          # the same bytes as the Python callback's
            np.testing.assert_array_equal(ln, lp)
            # every node was asked about (as often as the Python callback was asked), one was copied
            assert nat.n_asks == py._asks[0] > 50
            assert_matvec_close(w["token_embd.weight"], hn, ln, ty["token_embd.weight"], "logits")
            assert_matvec_close(w["nextn.post_projection.weight"], hn, xn, ty["nextn.post_projection.weight"],
                                "h_next")
            assert nat.get("result_norm", occurrence=1) is None and nat.get("h_nextn") is None
            tok, h = int(np.argmax(ln)), xn
        nat.enabled = False                                # nothing wanted: nothing copied
        nat.reset()
        db.set(tok, len(toks), h)
        dn.decode(db)
        assert nat.get("result_norm") is None and nat.n_asks > 50
    finally:
        for o in (db, tb, dn, dp, tc, dm, tm):
            o.close()
        nat.close()


def test_runtime_drafts_the_same_with_either_capture(pair) -> None:
    runs = []
    for native in (True, False):
        with MtpRuntime(pair["target"], pair["noisy"], n_ctx=512, native_capture=native) as r:
            toks = r.prompt_tokens(PROMPTS[0])
            rounds = r.run(toks, RecordConfig(n_draft=3, max_tokens=24))
            runs.append([(x.drafted, [s.h_inner for s in x.steps]) for x in rounds])
    (a, b) = runs
    assert [d for d, _ in a] == [d for d, _ in b]
    for (_, ha), (_, hb) in zip(a, b, strict=True):
        for x, y in zip(ha, hb, strict=True):
            np.testing.assert_array_equal(x, y)


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """native_capture as if never loaded in this process, with an empty cache."""
    monkeypatch.setattr(native_capture, "_state", {})
    monkeypatch.setenv("MTPSCOPE_CACHE", os.fspath(tmp_path / "cache"))
    monkeypatch.delenv(native_capture.ENV_SWITCH, raising=False)
    return tmp_path


def test_no_compiler_keeps_the_python_callback(fresh, monkeypatch) -> None:
    monkeypatch.setenv("CC", os.fspath(fresh / "no-such-cc"))
    assert native_capture.load() is None
    assert "no C compiler" in native_capture.unavailable_reason()
    assert isinstance(capture.node_capture("result_norm"), capture.NodeCapture)
    assert native_capture.kind().startswith("python (") and "no C compiler" in native_capture.kind()
    assert not native_capture.library_path().exists()


def test_failing_compiler_is_quoted(fresh, monkeypatch) -> None:
    cc = fresh / "broken-cc"
    cc.write_text("#!/bin/sh\necho 'capture.c:1: error: this compiler is broken' >&2\nexit 1\n")
    cc.chmod(cc.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CC", os.fspath(cc))
    with pytest.raises(TraceError, match="this compiler is broken"):
        native_capture.build()
    assert native_capture.load() is None and "C compiler failed" in native_capture.unavailable_reason()
    lib_dir = native_capture.library_path().parent
    assert not lib_dir.exists() or not any(lib_dir.iterdir())      # no half-written library left


def test_switch_off_and_a_real_build(fresh, monkeypatch) -> None:
    monkeypatch.setenv(native_capture.ENV_SWITCH, "0")
    assert native_capture.load() is None and native_capture.kind() == f"python ({native_capture.ENV_SWITCH}=0)"
    monkeypatch.setattr(native_capture, "_state", {})
    monkeypatch.delenv(native_capture.ENV_SWITCH)
    if native_capture.load() is None:
        pytest.skip(f"no native capture here: {native_capture.unavailable_reason()}")
    p = native_capture.library_path()
    assert p.is_file() and p.parent == Path(os.environ["MTPSCOPE_CACHE"]) / "native"
    assert native_capture.kind() == "native"
    with pytest.raises(TraceError, match="too long"):
        capture.node_capture("x" * 64)
