"""The MTP recorder against the real llama.cpp (llama-cpp-python 0.3.36) on the tiny demo pair.

Invariants: greedy speculative output == plain greedy decoding of the target, token for token (flash
attention off); captured h_next == the API's; argmax of the captured logits == the drafted token. The
recorded hidden states are checked against the drafter's own weights read with gguf-py (an independent
reader): logits = token_embd · h_inner, h_next = post_projection · h_inner, centroid logits =
centroids · h_inner.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from mtpscope import traces
from mtpscope.errors import LayoutError, MtpscopeError, PreflightRefusal, RuntimeUnavailableError, TraceError
from mtpscope.traces.run.llama import binding, capture
from mtpscope.traces.run.llama import model as lm
from mtpscope.traces.run.mtp_runtime import MtpRuntime, Sampler
from mtpscope.traces.run.prompts import read_prompts
from mtpscope.traces.run.ranking import top_k_desc
from mtpscope.traces.run.record_config import RecordConfig
from mtpscope.traces.run.recorder import record
from tests.builders import TINY_PROMPTS as PROMPTS
from tests.gguf_oracle import gguf_arrays, gguf_types
from tests.numerics import assert_matvec_close, ggml_matvec_fit

pytestmark = pytest.mark.llama

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def noisy_rt(pair):
    r = MtpRuntime(pair["target"], pair["noisy"], n_ctx=1024)
    yield r
    r.close()


@pytest.fixture(scope="module")
def noisy_trace(pair, noisy_rt, tmp_path_factory):
    out = tmp_path_factory.mktemp("rec") / "noisy"
    s = record(RecordConfig(max_tokens=40, centroids=pair["fork"], hidden="f32", flush_every=3),
               target=pair["target"], assistant=pair["noisy"], out=out, prompts=PROMPTS, runtime=noisy_rt,
               command=["test"])
    return s, traces.open(out)


# ------------------------------------------------------------------------------------------ invariants

def test_greedy_speculative_equals_plain_greedy(noisy_rt) -> None:
    accepted = drafted = 0
    for p in PROMPTS:
        tk = noisy_rt.prompt_tokens(p)
        rounds = list(noisy_rt.run(tk, RecordConfig(n_draft=3, max_tokens=48), trace=False))
        spec = [rounds[0].pending_token] + [t for r in rounds for t in r.emitted]
        plain = noisy_rt.generate_plain(tk, max_tokens=48)
        assert spec == plain
        accepted += sum(r.n_accepted for r in rounds)
        drafted += sum(len(r.drafted) for r in rounds)
    assert 0 < accepted < drafted  # rejections happened, so roll-back was exercised


def test_cost_probe_times_every_size_and_leaves_the_loop_as_it_was(noisy_rt) -> None:
    tk = noisy_rt.prompt_tokens(PROMPTS[0])
    cfg = RecordConfig(n_draft=3, max_tokens=24)
    before = [(r.drafted, r.emitted) for r in noisy_rt.run(tk, cfg, trace=False)]
    cp = noisy_rt.probe_costs(tk, n_max=3, reps=2, budget_s=60.0)
    assert sorted(cp["verify_ms"]) == ["1", "2", "3", "4"] and sorted(cp["draft_ms"]) == ["1", "2", "3"]
    # 2 repetitions, unless a size's two differ by over PROBE_SPREAD (1.5x; sub-millisecond sizes of the tiny pair
    # jitter that much on a busy machine): then more, to PROBE_MAX_REPS (9) within the budget -- max / min over a
    # size's repetitions never shrinks, so once they disagree the probe runs them all
    first2 = [v[:2] for v in (*cp["verify_reps_ms"].values(), *cp["draft_reps_ms"].values())]
    assert cp["reps"] == (9 if any(max(v) / min(v) > 1.5 for v in first2) else 2) and cp["pos"] == len(tk)
    assert all(v > 0 for v in [*cp["verify_ms"].values(), *cp["draft_ms"].values()])
    # a repetition more only while under the budget: at least one
    assert noisy_rt.probe_costs(tk, n_max=1, reps=5, budget_s=0.0)["reps"] == 1
    # the probe cleared what it decoded: the loop runs as before
    assert [(r.drafted, r.emitted) for r in noisy_rt.run(tk, cfg, trace=False)] == before


def test_context_grows_when_needed(pair) -> None:
    with MtpRuntime(pair["target"], pair["noisy"], n_ctx=32, capture=False) as r:
        tk = r.prompt_tokens(PROMPTS[1])
        assert r.n_ctx == 256  # n_ctx is at least n_batch (256)
        rounds = list(r.run(tk, RecordConfig(n_draft=3, max_tokens=240), trace=False))
        assert r.n_ctx == 512 >= len(tk) + 240 + 4
        assert [rounds[0].pending_token] + [t for x in rounds for t in x.emitted] == \
            r.generate_plain(tk, max_tokens=240)


def test_long_prompt_is_prefilled_in_chunks(noisy_rt) -> None:
    tk = noisy_rt.prompt_tokens(" ".join([PROMPTS[1]] * 60))
    assert len(tk) > noisy_rt.tctx.n_batch  # more than one prefill batch
    rounds = list(noisy_rt.run(tk, RecordConfig(n_draft=3, max_tokens=20), trace=False))
    assert rounds[0].pos == len(tk)
    assert [rounds[0].pending_token] + [t for x in rounds for t in x.emitted] == \
        noisy_rt.generate_plain(tk, max_tokens=20)


def test_seeded_sampling_equals_plain_sampling(noisy_rt) -> None:
    # llama.cpp's scheme samples the target once per position with the chain and compares, so the
    # speculative output must equal plain sampling with the same seed
    tk = noisy_rt.prompt_tokens(PROMPTS[0])
    for seed in (1, 7):
        cfg = RecordConfig(n_draft=3, max_tokens=40, temp=0.9, seed=seed, top_k=20, top_p=0.95)
        rounds = list(noisy_rt.run(tk, cfg, trace=False))
        spec = [noisy_rt.first_token] + [t for r in rounds for t in r.emitted]
        s2 = Sampler(temp=0.9, seed=seed, top_k=20, top_p=0.95)
        assert spec == noisy_rt.generate_plain(tk, max_tokens=40, sampler=s2)
        s2.close()
        for r in rounds:  # rows after the first mismatch are never sampled
            assert all(t is None for t in r.target[r.n_accepted + 1:])
            assert r.target[r.n_accepted] is not None


def test_captured_nodes_equal_api_and_drafts(pair) -> None:
    tm, dm = lm.LlamaModel(pair["target"]), lm.LlamaModel(pair["noisy"])
    tc = lm.LlamaContext(tm, n_ctx=256, n_batch=64, flash_attn=False)
    cap = capture.NodeCapture(["result_norm", "h_nextn", "result_output"])
    dc = lm.LlamaContext(dm, n_ctx=256, n_batch=64, mtp_of=tc, capture=cap, masked=True)
    tb, db = lm.TokenBatch(64), lm.DraftBatch(dm.n_embd_inp)
    try:
        toks = tm.tokenize(PROMPTS[1])
        tb.set(toks, 0)
        tc.decode(tb)
        tok, h = int(np.argmax(tc.logits(-1))), tc.nextn(len(toks) - 1).copy()
        w, ty = gguf_arrays(pair["noisy"]), gguf_types(pair["noisy"])
        assert ty["token_embd.weight"] == "F16"  # the case where ggml rounds the activations
        for _ in range(4):
            cap.reset()
            db.set(tok, len(toks), h)
            dc.decode(db)
            api_logits, api_h = dc.logits(0).copy(), dc.nextn(0).copy()
            names = [n for n, _ in cap.captured]
            assert names == ["result_norm", "result_output", "h_nextn"]
            np.testing.assert_array_equal(cap.get("h_nextn").reshape(-1), api_h)
            np.testing.assert_array_equal(cap.get("result_output").reshape(-1), api_logits)
            d = int(np.argmax(cap.get("result_output")))
            assert d == int(np.argmax(api_logits))
            # independent maths from the drafter's weights (gguf-py): tied LM head and post-projection,
            # as ggml's CPU mul_mat computes them (F16 weight: h_inner rounded to F16 first), within the
            # F32 summation bound (tests/numerics.py)
            hi = cap.get("result_norm").reshape(-1)
            assert_matvec_close(w["token_embd.weight"], hi, api_logits, ty["token_embd.weight"], "logits")
            assert_matvec_close(w["nextn.post_projection.weight"], hi, api_h, ty["nextn.post_projection.weight"],
                                "h_next")
            tok, h = d, api_h
        assert cap.get("result_norm", occurrence=1) is None
    finally:
        for o in (db, tb, dc, tc, dm, tm):
            o.close()


def test_ggml_tensor_mirror_matches_library() -> None:
    import ctypes

    g = capture.tensor_functions()  # raises if sizeof differs from ggml_tensor_overhead() - GGML_OBJECT_SIZE
    assert ctypes.sizeof(capture.GgmlTensor) == 336 and capture.GgmlTensor.name.offset == 256
    assert "nbytes" in g


# ------------------------------------------------------------------------------------------ the trace


def test_trace_rounds_are_consistent(noisy_trace) -> None:
    s, tr = noisy_trace
    r = tr.rounds
    assert tr.manifest["complete"] is True and tr.warnings == []
    assert len(r) == s.n_rounds and tr.manifest["counts"]["n_rounds"] == s.n_rounds
    for pid, grp in r.groupby("prompt_id"):
        grp = grp.sort_values("round")
        assert grp["round"].tolist() == list(range(len(grp)))
        gen = [int(grp.iloc[0].pending_token)]
        for a, b in zip(grp.itertuples(), list(grp.itertuples())[1:]):
            assert b.pos == a.pos + a.n_accepted + 1
            assert b.pending_token == a.emitted[-1]
        for row in grp.itertuples():
            drafted, target, n = list(row.drafted), list(row.target), row.n_accepted
            assert drafted[:n] == target[:n] and (n == len(drafted) or drafted[n] != target[n])
            assert list(row.emitted) == drafted[:n] + [target[n]]
            assert row.t_draft_ms > 0 and row.t_verify_ms > 0
            gen += list(row.emitted)
        assert tuple(gen) == s.outputs[pid]
        assert len(gen) == 40
    assert 0 < s.acceptance_rate < 1
    assert s.acceptance_rate == pytest.approx(r.n_accepted.sum() / r.n_draft.sum())
    drafted_rounds = r[r.n_draft > 0]
    assert s.mean_acceptance_length == pytest.approx(1 + drafted_rounds.n_accepted.sum() / len(drafted_rounds))


def test_trace_steps(noisy_trace, pair) -> None:
    s, tr = noisy_trace
    st, r = tr.steps, tr.rounds
    assert len(st) == s.n_steps == r.n_draft.sum()
    m = st.merge(r[["prompt_id", "round", "drafted", "target", "n_accepted"]], on=["prompt_id", "round"])
    for row in m.itertuples():
        assert row.token == row.drafted[row.k - 1]
        assert row.target_token == row.target[row.k - 1]
        assert row.accepted == (row.k <= row.n_accepted)
        assert row.rank == 0 and row.top_ids[0] == row.token
        assert row.logit == pytest.approx(row.top_logits[0])
        assert list(row.top_logits) == sorted(row.top_logits, reverse=True) and len(row.top_ids) == 10
        assert (row.target_rank == 0) == (row.target_token == row.token)
    # hidden states: h of step 1 is the target's, h of step k>1 is h_next of step k-1
    h, hn, hi = tr.hidden("h"), tr.hidden("h_next"), tr.hidden("h_inner")
    assert h.shape == hn.shape == (len(st), 64) and hi.shape == (len(st), 128)
    ks = st["k"].to_numpy()
    later = np.flatnonzero(ks > 1)
    np.testing.assert_array_equal(h[later], hn[later - 1])
    # independent maths from the drafter's weights read with gguf-py
    w, ty = gguf_arrays(pair["noisy"]), gguf_types(pair["noisy"])
    assert_matvec_close(w["nextn.post_projection.weight"], hi, hn, ty["nextn.post_projection.weight"], "h_next")
    # the logits as one of ggml's kernels computes them (tests/numerics.py): the stored top logits within its bound
    top = np.stack(st["top_ids"].to_numpy())
    got = np.stack(st["top_logits"].to_numpy()).astype(np.float64)
    logits, bound, _ = ggml_matvec_fit(w["token_embd.weight"], hi, got, ty["token_embd.weight"], "top logits",
                                       cols=top)
    rows, tok, best = np.arange(len(st)), st["token"].to_numpy(), np.argmax(logits, axis=1)
    # the drafted token is the argmax (up to a near-tie inside the two logits' bounds)
    assert (logits[rows, best] - logits[rows, tok] <= bound[rows, best] + bound[rows, tok]).all()
    # centroid head from the fork file (gguf-py): c = centroids · h_inner, top-4
    f = gguf_arrays(pair["fork"])
    c = hi.astype(np.float64) @ f["mtp.centroids.weight"].T.astype(np.float64)
    order = np.argsort(-c, axis=1, kind="stable")[:, :4]
    assert (np.stack(st["centroid_ids"].to_numpy()) == order).all()
    ordering = f["mtp.token_ordering.weight"].reshape(64, -1)
    for i, row in enumerate(st.itertuples()):
        cand = ordering[order[i]].reshape(-1)
        assert row.centroid_token == cand[np.argmax(logits[i, cand])]
        tc = int(np.flatnonzero((ordering == row.target_token).any(axis=1))[0])
        assert row.target_centroid == tc
        assert row.target_centroid_rank == int((c[i] > c[i, tc]).sum())
        assert row.target_in_candidates == (tc in order[i])


def test_hf_centroid_source_gives_the_same_columns(noisy_trace, pair, noisy_rt, tmp_path) -> None:
    from safetensors.numpy import save_file

    f = gguf_arrays(pair["fork"])
    hf = tmp_path / "hf"
    hf.mkdir()
    save_file({"masked_embedding.centroids.weight": f["mtp.centroids.weight"],
               "masked_embedding.token_ordering": f["mtp.token_ordering.weight"].astype(np.int64)},
              str(hf / "model.safetensors"))
    (hf / "config.json").write_text(json.dumps({"model_type": "gemma4_assistant", "centroid_intermediate_top_k": 4}))
    record(RecordConfig(max_tokens=40, centroids=hf, hidden="off"), target=pair["target"], assistant=pair["noisy"],
           out=tmp_path / "t", prompts=PROMPTS[:1], runtime=noisy_rt)
    a = traces.open(tmp_path / "t")
    b = noisy_trace[1]
    assert a.manifest["models"]["centroids"]["dialect"] == "hf" and a.manifest["centroids"]["top_k"] == 4
    sb = b.steps[b.steps.prompt_id == 0].reset_index(drop=True)
    cols = ["token", "centroid_token", "target_in_candidates", "target_centroid", "target_centroid_rank"]
    assert a.steps[cols].equals(sb[cols])
    assert [list(x) for x in a.steps.centroid_ids] == [list(x) for x in sb.centroid_ids]


def test_manifest(noisy_trace, pair) -> None:
    from gguf import GGUFReader

    s, tr = noisy_trace
    m = tr.manifest
    assert m["source"] == "record" and m["command"] == ["test"]
    for role, path, arch, dialect in (("target", pair["target"], "gemma4", "target"),
                                      ("assistant", pair["noisy"], "gemma4-assistant", "upstream"),
                                      ("centroids", pair["fork"], "gemma4_assistant", "fork")):
        info = m["models"][role]
        data_offset = GGUFReader(str(path)).data_offset
        assert info["header_sha256"] == hashlib.sha256(path.read_bytes()[:data_offset]).hexdigest()
        assert (info["architecture"], info["dialect"], info["size"]) == (arch, dialect, path.stat().st_size)
        assert info["path"] == os.fspath(path.resolve())
    import llama_cpp

    assert m["runtime"]["llama_cpp_python"] == llama_cpp.__version__ == "0.3.36"
    assert m["runtime"]["device"] == (binding.gpu_name() or "cpu") and m["runtime"]["llama_cpp"]
    # the drafter's h_inner capture: the C callback wherever a C compiler is at hand (CI has one)
    import shutil

    has_cc = shutil.which(os.environ.get("CC") or "cc") is not None
    assert m["runtime"]["cb_eval"] == "native" if has_cc else m["runtime"]["cb_eval"].startswith("python (")
    # and the reductions over the rows of logits (the target's p and H, top-k, ranks): C there too
    assert m["runtime"]["row_kernels"] == "native" if has_cc else m["runtime"]["row_kernels"].startswith("numpy (")
    assert m["dims"] == {"n_embd_backbone": 64, "n_embd": 128, "hidden_dtype": "f32"}
    assert m["centroids"]["n_centroids"] == 64 and m["centroids"]["top_k"] == 4
    tm = lm.LlamaModel(pair["target"])
    try:
        assert [p["n_prompt_tokens"] for p in m["prompts"]] == [len(tm.tokenize(p)) for p in PROMPTS]
    finally:
        tm.close()
    assert [p["text"] for p in m["prompts"]] == PROMPTS
    assert m["params"]["n_draft"] == 3 and m["params"]["max_tokens"] == 40 and m["params"]["greedy"] is True
    # the reader's bound on token ids: the target's vocabulary as gguf-py reads it
    toks = GGUFReader(pair["target"]).fields["tokenizer.ggml.tokens"]
    assert m["params"]["n_vocab"] == len(toks.data)


def test_clean_drafter_accepts_everything(pair, tmp_path) -> None:
    s = record(RecordConfig(max_tokens=30, hidden="off"), target=pair["target"], assistant=pair["clean"],
               out=tmp_path / "t", prompt=PROMPTS[0])
    assert s.n_rounds > 0 and s.acceptance_rate == 1.0
    tr = traces.open(tmp_path / "t")
    assert tr.manifest["dims"]["hidden_dtype"] is None and tr.manifest["centroids"] is None
    assert tr.steps["accepted"].all() and tr.steps["centroid_ids"].isna().all()
    assert tr.rounds.n_accepted.sum() == tr.rounds.n_draft.sum()


def test_f16_default_and_chat(pair, tmp_path, noisy_rt) -> None:
    s = record(RecordConfig(max_tokens=6, chat=True), target=pair["target"], assistant=pair["noisy"],
               out=tmp_path / "c", prompt="Hi there", runtime=noisy_rt)
    tr = traces.open(tmp_path / "c")
    assert tr.manifest["dims"]["hidden_dtype"] == "f16"
    toks = noisy_rt.prompt_tokens("Hi there", chat=True)
    text = noisy_rt.tmodel.detokenize(toks)
    # (the 4096-token subset vocabulary renders the space as "▁"); llama-server's default for a Gemma 4 template
    # is thinking on: the template's system turn with <|think|> first
    assert text.startswith("<bos><|turn>system\n<|think|><turn|>\n<|turn>user\nHi") and "there<turn|>" in text
    assert text.endswith("<|turn>model\n")
    assert tr.manifest["prompts"][0]["n_prompt_tokens"] == len(toks) > len(noisy_rt.prompt_tokens("Hi there"))
    assert len(s.outputs[0]) == 6


def test_in_process_cpu_leaves_out_the_calibration_and_probe_like_isolated(pair, tmp_path, noisy_rt,
                                                                           monkeypatch) -> None:
    """In process the calibration and the cost probe run after the loop in this process; the run's CPU seconds
    leave them out as its wall seconds do (and as an isolated run does, whose worker does that work). The probe is
    made to burn BURN CPU seconds here, far above what the 8-token recording itself takes."""
    import time

    from mtpscope.traces.run.mtp_runtime import MtpRuntime

    burn, orig = 3.0, MtpRuntime.probe_costs

    def probe_costs(self, *a, **k):
        got = orig(self, *a, **k)
        c0 = time.process_time()
        while time.process_time() - c0 < burn:
            pass
        return got

    monkeypatch.setattr(MtpRuntime, "probe_costs", probe_costs)
    c0 = time.process_time()
    s = record(RecordConfig(max_tokens=8, hidden="off"), target=pair["target"], assistant=pair["noisy"],
               out=tmp_path / "t", prompt=PROMPTS[0], runtime=noisy_rt)
    assert not s.isolated and time.process_time() - c0 >= burn          # the probe did burn it
    assert s.cpu_seconds < burn / 2 and s.recorder_cpu_seconds == s.cpu_seconds


def test_a_second_interrupt_does_not_cut_the_close_short(pair, tmp_path, noisy_rt, monkeypatch) -> None:
    """`timeout` sends its SIGTERM to the command and again to its process group: a first interrupt lands in the
    trace's close at the end of the run, the second while the recorder closes it once more as an interrupted run.
    That close runs to its end all the same: the note says how many rounds were kept, the manifest holds them,
    marked incomplete, and no write-ahead log is left (before: the second one escaped the close, no note, and the
    command said "nothing recorded" over a trace of 246 rounds)."""
    import json
    import os
    import signal

    from mtpscope.traces.store.writer import TraceWriter

    orig, calls = TraceWriter.close, []

    def close(self, *a, **k):
        calls.append(k)
        if len(calls) == 1:
            raise KeyboardInterrupt                  # the first signal, as the run's close begins
        os.kill(os.getpid(), signal.SIGINT)           # the second, while the interrupted run's close runs
        return orig(self, *a, **k)

    monkeypatch.setattr(TraceWriter, "close", close)
    with pytest.raises(KeyboardInterrupt) as ei:
        record(RecordConfig(max_tokens=12, flush_every=2), target=pair["target"], assistant=pair["noisy"],
               out=tmp_path / "t", prompt=PROMPTS[0], runtime=noisy_rt)
    man = json.loads((tmp_path / "t" / "manifest.json").read_text())
    n = man["counts"]["n_rounds"]
    assert n > 0 and man["complete"] is False and len(calls) == 2
    assert getattr(ei.value, "__notes__", []) == [f"interrupted: {n} rounds kept in {tmp_path / 't'}, marked incomplete"]
    assert not (tmp_path / "t" / "wal").exists()
    assert len(traces.open(tmp_path / "t").rounds) == n


# ------------------------------------------------------------------------------------------ bad input


def test_preflight_refuses_fork_drafter(pair, tmp_path) -> None:
    with pytest.raises(LayoutError, match="--centroids") as ei:
        record(RecordConfig(), target=pair["target"], assistant=pair["fork"], out=tmp_path / "x", prompt="x")
    assert ei.value.key == "general.architecture" and ei.value.actual == "gemma4_assistant"
    assert not (tmp_path / "x").exists()


def test_preflight_refuses_wrong_roles_and_backbone(pair, tmp_path) -> None:
    from mtpscope.demo import build as demo

    with pytest.raises(LayoutError, match="target must be a gemma4") as ei:
        record(RecordConfig(), target=pair["noisy"], assistant=pair["noisy"], out=tmp_path / "x", prompt="x")
    assert ei.value.actual == "gemma4-assistant" and not isinstance(ei.value, PreflightRefusal)
    with pytest.raises(LayoutError, match="gemma4-assistant drafter"):
        record(RecordConfig(), target=pair["target"], assistant=pair["target"], out=tmp_path / "x", prompt="x")
    with pytest.raises(LayoutError, match="--target and --assistant are swapped") as ei:   # both roles wrong: said so
        record(RecordConfig(), target=pair["noisy"], assistant=pair["target"], out=tmp_path / "x", prompt="x")
    assert (ei.value.key, ei.value.expected, ei.value.actual) == ("general.architecture", "gemma4-assistant", "gemma4")
    assert not (tmp_path / "x").exists()
    other = demo.write_drafter(tmp_path / "d32.gguf", vocab="subset",
                               dims=demo.TinyDims(n_embd_backbone=32, n_embd=128))
    with pytest.raises(PreflightRefusal, match="E_PAIR_BACKBONE") as ei:
        record(RecordConfig(), target=pair["target"], assistant=other, out=tmp_path / "x", prompt="x")
    assert (ei.value.expected, ei.value.actual) == (32, 64)
    from mtpscope.demo.vocab import load_vocab

    small = demo.write_drafter(tmp_path / "v2048.gguf", vocab=load_vocab("subset", n_subset=2048))
    with pytest.raises(LayoutError, match="E_PAIR_VOCAB") as ei:
        record(RecordConfig(), target=pair["target"], assistant=small, out=tmp_path / "x", prompt="x")
    assert (ei.value.expected, ei.value.actual) == (4096, 2048)
    with pytest.raises(FileNotFoundError):
        record(RecordConfig(), target=pair["target"], assistant=tmp_path / "missing.gguf", out=tmp_path / "x",
               prompt="x")


def test_centroid_source_must_fit(pair, tmp_path, write_gguf) -> None:
    import gguf

    bad = write_gguf("c.gguf", "gemma4_assistant",
                     kv=[("gemma4_assistant.centroid_top_k", 2, gguf.GGUFValueType.UINT32)],
                     tensors=[("mtp.centroids.weight", np.zeros((4, 16), np.float32)),
                              ("mtp.token_ordering.weight", np.arange(4096, dtype=np.int32))])
    with pytest.raises(LayoutError, match="n_embd") as ei:
        record(RecordConfig(centroids=bad), target=pair["target"], assistant=pair["noisy"], out=tmp_path / "x",
               prompt="x")
    assert (ei.value.expected, ei.value.actual) == (128, 16)


def test_argument_errors(pair, tmp_path) -> None:
    kw = {"target": pair["target"], "assistant": pair["noisy"], "out": tmp_path / "x"}
    with pytest.raises(MtpscopeError, match="exactly one"):
        record(RecordConfig(), **kw)
    with pytest.raises(MtpscopeError, match="hidden"):
        record(RecordConfig(hidden="f8"), **kw, prompt="x")
    with pytest.raises(MtpscopeError, match="n_draft"):
        record(RecordConfig(n_draft=0), **kw, prompt="x")


def test_read_prompts(tmp_path) -> None:
    j = tmp_path / "p.jsonl"
    j.write_text('"plain"\n\n{"prompt": "a"}\n{"text": "b"}\n')
    assert read_prompts(j) == ["plain", "a", "b"]
    t = tmp_path / "p.txt"
    t.write_text("one\n\n two \n")
    assert read_prompts(t) == ["one", " two "]
    j.write_text('"ok"\n{"messages": []}\n')
    with pytest.raises(MtpscopeError, match="line 2"):
        read_prompts(j)
    j.write_text('"ok"\n{bad\n')
    with pytest.raises(MtpscopeError, match="line 2"):
        read_prompts(j)
    t.write_text("\n\n")
    with pytest.raises(MtpscopeError, match="no prompts"):
        read_prompts(t)


def test_runtime_unavailable_message(monkeypatch) -> None:
    monkeypatch.setattr(binding, "_state", {})
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp -> ImportError
    with pytest.raises(RuntimeUnavailableError, match="pip install") as ei:
        binding.llama()
    assert ei.value.key == "llama_cpp"
    assert binding.available() is False


def test_top_k_desc_matches_lexsort() -> None:
    rng = np.random.default_rng(3)
    for n in (5, 100, 4096, 262144):
        for _ in range(5):
            x = rng.integers(0, 40, n).astype(np.float32)  # many ties
            ref = np.lexsort((np.arange(n), -x))[:10]
            assert top_k_desc(x, 10).tolist() == ref.tolist()


# ------------------------------------------------------------------------------------------ CLI and kill -9


def test_cli_interrupt_never_says_nothing_recorded_over_a_trace(pair, tmp_path, monkeypatch) -> None:
    """An interrupt that reaches the command without the recorder's note (one that cut the recorder's own
    bookkeeping short) over a trace folder this run created: the line points at the trace instead of saying
    "nothing recorded"; with no folder made, it says nothing was recorded. Exit 130 either way."""
    from typer.testing import CliRunner

    from mtpscope.cli.main import app
    from mtpscope.traces.run import recorder

    def interrupted(config, *, out, **kw):
        out.mkdir()
        (out / "manifest.json").write_text("{}")
        raise KeyboardInterrupt

    args = ["record", "--target", str(pair["target"]), "--assistant", str(pair["noisy"]), "--prompt", "x",
            "--no-progress", "--in-process", "--out"]
    monkeypatch.setattr(recorder, "record", interrupted)
    res = CliRunner().invoke(app, [*args, str(tmp_path / "t")])
    assert res.exit_code == 130
    assert res.output.strip().splitlines()[-1] == (f"mtpscope: interrupted before the trace in {tmp_path / 't'} was "
                                                   f"closed: `mtpscope report {tmp_path / 't'}` reads the rounds it holds")

    def early(config, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(recorder, "record", early)
    res = CliRunner().invoke(app, [*args, str(tmp_path / "u")])
    assert res.exit_code == 130
    assert res.output.strip().splitlines()[-1] == "mtpscope: interrupted before the recording began: nothing recorded"


@pytest.mark.parametrize("opt, value, allowed", [("--draft-position", "q", "p-1 or p"),
                                                  ("--mlx-dtype", "f8", "f32 or checkpoint"),
                                                  ("--mlx-head", "sparse", "checkpoint or dense")])
def test_cli_record_refuses_a_bad_mlx_option_value_with_any_runtime(pair, tmp_path, opt, value, allowed) -> None:
    """An --runtime mlx option with a value it does not take is refused in one line with the default runtime too
    (was: ignored, exit 0), before anything is recorded."""
    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    res = CliRunner().invoke(app, ["record", "--target", str(pair["target"]), "--assistant", str(pair["noisy"]),
                                   "--prompt", "x", "--max-tokens", "4", "--no-progress", opt, value,
                                   "--out", str(tmp_path / "t")])
    assert res.exit_code == 2 and res.output.strip() == f"mtpscope: {opt} must be {allowed} (got {value!r})"
    assert not (tmp_path / "t").exists()


def test_cli_record_and_refusal(pair, tmp_path) -> None:
    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    runner = CliRunner()
    res = runner.invoke(app, ["record", "--target", str(pair["target"]), "--assistant", str(pair["clean"]),
                              "--prompt", "The quick brown fox", "--max-tokens", "12", "--no-progress",
                              "--out", str(tmp_path / "t")])
    assert res.exit_code == 0, res.output
    assert "acceptance rate 1.0000" in res.output
    assert traces.open(tmp_path / "t").manifest["params"]["max_tokens"] == 12
    res = runner.invoke(app, ["record", "--target", str(pair["target"]), "--assistant", str(pair["fork"]),
                              "--prompt", "x", "--out", str(tmp_path / "f")])
    assert res.exit_code == 1 and "--centroids" in res.output
    assert "--no-preflight" not in res.output          # llama.cpp cannot load a fork drafter at all
    # a wrong pairing: the refusal says how to record it anyway (the demo's buggy pair is recorded that way)
    from mtpscope.demo import build as demo

    other = demo.write_drafter(tmp_path / "d32.gguf", vocab="subset",
                               dims=demo.TinyDims(n_embd_backbone=32, n_embd=128))
    res = runner.invoke(app, ["record", "--target", str(pair["target"]), "--assistant", str(other),
                              "--prompt", "x", "--out", str(tmp_path / "b")])
    assert res.exit_code == 1 and "E_PAIR_BACKBONE" in res.output
    assert res.output.strip().splitlines()[-1].endswith("(expected 32, got 64); `--no-preflight` records it anyway")
    pf = tmp_path / "prompts.txt"
    pf.write_text("The quick brown fox\nHello world\n")
    args = ["record", "--target", str(pair["target"]), "--assistant", str(pair["noisy"]), "--prompts", str(pf),
            "--max-tokens", "8", "--hidden", "off", "--no-progress", "--out", str(tmp_path / "t")]
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and "already holds a trace" in res.output  # no --overwrite
    res = runner.invoke(app, [*args, "--overwrite"])
    assert res.exit_code == 0, res.output
    tr = traces.open(tmp_path / "t")
    assert [p["text"] for p in tr.manifest["prompts"]] == ["The quick brown fox", "Hello world"]
    assert tr.manifest["dims"]["hidden_dtype"] is None and sorted(tr.rounds.prompt_id.unique()) == [0, 1]


def test_cli_record_category_field(pair, tmp_path) -> None:
    import json as _json

    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    pf = tmp_path / "p.jsonl"
    pf.write_text("".join(_json.dumps({"prompt": t, "domain": d}) + "\n" for t, d in (("Hello world", "greet"),
                                                                                     ("Once upon", "story"))))
    base = ["record", "--target", str(pair["target"]), "--assistant", str(pair["clean"]), "--prompts", str(pf),
            "--max-tokens", "6", "--hidden", "off", "--no-progress"]
    res = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert "no 'category' but a 'domain' field: pass --category-field domain" in res.stderr
    assert "category" not in traces.open(tmp_path / "a").manifest["prompts"][0]
    res = CliRunner().invoke(app, [*base, "--category-field", "domain", "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    assert "--category-field" not in res.stderr
    assert [p["category"] for p in traces.open(tmp_path / "b").manifest["prompts"]] == ["greet", "story"]


def test_sigkill_keeps_finished_parts(pair, tmp_path) -> None:
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "mtpscope.cli", "record", "--target", str(pair["target"]),
           "--assistant", str(pair["noisy"]), "--prompt", PROMPTS[0], "--max-tokens", "3000",
           "--flush-every", "1", "--no-progress", "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if len(list((out / "rounds").glob("part-*.parquet"))) >= 4 or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is False
    assert manifest["command"][:2] == ["mtpscope", "record"] and "--flush-every" in manifest["command"]
    tr = traces.open(out)
    # parts are renamed into place: none is torn or skipped (only the incomplete flag and maybe a .tmp)
    assert not [w for w in tr.warnings if "skipped" in w or "unreadable" in w], tr.warnings
    assert any("incomplete" in w for w in tr.warnings)
    parts = sorted((out / "rounds").glob("part-*.parquet"))
    assert len(parts) >= 4 and len(tr.rounds) == len(parts)  # flush_every 1: one round per part
    assert sorted(tr.rounds["round"].tolist()) == list(range(len(parts)))
    # every finished round has all its steps (a steps part is written before its rounds part)
    n = tr.steps.groupby("round").size()
    for row in tr.rounds.itertuples():
        assert n[row.round] == row.n_draft


def test_single_thread_blas_is_restored() -> None:
    from mtpscope.traces.run.recorder import _openblas_thread_control, _SingleThreadBlas

    ctl = _openblas_thread_control()
    if ctl is None:
        pytest.skip("numpy does not bundle OpenBLAS here")
    before = ctl[1]()
    with _SingleThreadBlas():
        assert ctl[1]() == 1
    assert ctl[1]() == before


# ------------------------------------------------------------------------------------------ holes found by testing


def test_n_draft_upper_bound_refused_before_loading(pair, tmp_path, monkeypatch) -> None:
    from mtpscope.errors import TraceError
    from mtpscope.traces.run import recorder

    def boom(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(recorder, "preflight", boom)
    monkeypatch.setattr(recorder, "MtpRuntime", boom)
    for n in (65, 1_000_000_000):
        with pytest.raises(TraceError, match="n_draft") as ei:
            record(RecordConfig(n_draft=n), target=pair["target"], assistant=pair["noisy"], out=tmp_path / "x",
                   prompt="x")
        assert (ei.value.key, ei.value.expected, ei.value.actual) == ("n_draft", "1..64", n)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(("name", "value"), [("temp", float("nan")), ("temp", float("inf")), ("temp", -0.5),
                                             ("top_p", float("nan")), ("top_p", 0.0), ("top_p", 1.5),
                                             ("top_p", float("-inf")), ("top_k", -1)])
def test_bad_sampling_parameters_refused(pair, tmp_path, name, value) -> None:
    from mtpscope.errors import TraceError

    with pytest.raises(TraceError) as ei:
        record(RecordConfig(**{name: value}), target=pair["target"], assistant=pair["noisy"], out=tmp_path / "x",
               prompt="x")
    assert ei.value.key == name
    assert not (tmp_path / "x").exists()


def test_read_prompts_not_utf8(tmp_path) -> None:
    t = tmp_path / "latin1.txt"
    t.write_bytes(b"fine line\ncaf\xe9\n")  # 0xe9 (Latin-1) at byte 13 is not UTF-8
    with pytest.raises(MtpscopeError, match="byte 13") as ei:
        read_prompts(t)
    assert ei.value.offset == 13 and ei.value.path == os.fspath(t)


@pytest.fixture(scope="module")
def noisy_rt_python_capture(pair):
    r = MtpRuntime(pair["target"], pair["noisy"], n_ctx=1024, native_capture=False)
    yield r
    r.close()


def test_interrupt_inside_cb_eval_is_raised_after_decode(noisy_rt_python_capture, monkeypatch) -> None:
    noisy_rt = noisy_rt_python_capture
    cap = noisy_rt.capture
    assert isinstance(cap, capture.NodeCapture)
    tk = noisy_rt.prompt_tokens(PROMPTS[0])
    calls = []

    def interrupted(t: int) -> None:
        calls.append(t)
        raise KeyboardInterrupt  # what a Ctrl-C inside the callback looks like

    monkeypatch.setattr(cap, "_copy", interrupted)
    with pytest.raises(KeyboardInterrupt):
        list(noisy_rt.run(tk, RecordConfig(n_draft=3, max_tokens=20), trace=True))
    assert len(calls) == 1  # remembered once; the callback declined every later node
    assert cap.error is None  # raised once, then forgotten
    # the callback itself never raises: called directly it answers False and keeps the error
    cap.error = None
    assert cap._cb(0, False, None) is False and isinstance(cap.error, KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        cap.raise_pending()
    cap.raise_pending()  # nothing pending: no-op
    monkeypatch.undo()
    # the runtime is still usable and exact afterwards
    rounds = list(noisy_rt.run(tk, RecordConfig(n_draft=3, max_tokens=20), trace=False))
    assert [rounds[0].pending_token] + [t for r in rounds for t in r.emitted] == \
        noisy_rt.generate_plain(tk, max_tokens=20)


def test_interrupt_during_record_keeps_finished_parts(pair, noisy_rt_python_capture, tmp_path,
                                                     monkeypatch) -> None:
    noisy_rt = noisy_rt_python_capture      # a Ctrl-C injected through the Python callback
    cap = noisy_rt.capture
    real = cap._copy
    n = [0]

    def copy_then_interrupt(t: int) -> None:
        n[0] += 1
        if n[0] == 13:  # in round 5 of 3 drafts each
            raise KeyboardInterrupt
        real(t)

    monkeypatch.setattr(cap, "_copy", copy_then_interrupt)
    out = tmp_path / "int"
    with pytest.raises(KeyboardInterrupt):
        record(RecordConfig(max_tokens=200, flush_every=1, hidden="off", compact=False), target=pair["target"],
               assistant=pair["noisy"], out=out, prompt=PROMPTS[0], runtime=noisy_rt)
    tr = traces.open(out)
    assert tr.manifest["complete"] is False
    assert sorted(tr.rounds["round"].tolist()) == [0, 1, 2, 3]  # rounds 0-3 finished, round 4 interrupted


@pytest.mark.parametrize(("signum", "code", "said"), [(signal.SIGINT, 130, "interrupted"),
                                                      (signal.SIGTERM, 143, "stopped by SIGTERM")])
def test_one_sigint_stops_cli_record(pair, tmp_path, signum, code, said) -> None:
    """One Ctrl-C, or one SIGTERM (``timeout``, a service manager), sent to ``mtpscope record`` alone: the rounds
    finished are kept, marked incomplete, one line says so, and the exit status is the shell's for that signal
    (128 + its number). Before, a SIGTERM ended the recorder on the spot: nothing said, the trace left unclosed."""
    out = tmp_path / "sigint"
    cmd = [sys.executable, "-m", "mtpscope.cli", "record", "--target", str(pair["target"]),
           "--assistant", str(pair["noisy"]), "--prompt", PROMPTS[0], "--max-tokens", "3000",
           "--flush-every", "1", "--no-progress", "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if len(list((out / "rounds").glob("part-*.parquet"))) >= 3 or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        os.kill(proc.pid, signum)  # once
        try:
            proc.wait(timeout=60)  # without the fix the run goes on to 3000 tokens (minutes)
        except subprocess.TimeoutExpired:
            pytest.fail(f"mtpscope record still runs 60 s after one {signum.name}; where it is:\n"
                        + _stacks_of(proc, out))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code
    err = proc.stderr.read().decode() if proc.stderr else ""
    assert "Exception ignored" not in err and "Traceback" not in err, err
    tr = traces.open(out)
    assert tr.manifest["complete"] is False and len(tr.rounds) >= 3
    assert sorted(tr.rounds["round"].tolist()) == list(range(len(tr.rounds)))
    # one line says what was kept, the count read back from the trace (a Ctrl-C that lands between a round's
    # write-ahead record and the loop's own count: the writer's count is the one said)
    assert f"mtpscope: {said}: {len(tr.rounds)} rounds kept in {out}, marked incomplete" in err.splitlines(), err


def _stacks_of(proc: subprocess.Popen[bytes], out: Path) -> str:
    """Every thread's Python stack of a stuck ``mtpscope record`` (``proc``, stderr piped) and of its recording
    worker (`kill -USR1`: the CLI's and the worker's faulthandler), then ``proc`` killed: its stderr and the
    worker's output (``llama.log`` in ``out``, where the trace got that far)."""
    children = []
    for task in Path(f"/proc/{proc.pid}/task").glob("*/children"):
        children += [int(c) for c in task.read_text().split()]
    for pid in [proc.pid, *children]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR1)
    time.sleep(2.0)
    for pid in [proc.pid, *children]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    log = out / "llama.log"
    return f"{err}\n--- worker (llama.log) ---\n{log.read_text(errors='replace')[-20000:] if log.exists() else ''}"


def test_overwrite_keeps_old_trace_when_the_new_run_fails(pair, noisy_rt, tmp_path, capsys) -> None:
    out = tmp_path / "t"
    kw = {"target": pair["target"], "assistant": pair["noisy"], "out": out, "prompt": PROMPTS[0], "runtime": noisy_rt}
    record(RecordConfig(max_tokens=10, hidden="off", flush_every=1), **kw)
    before = (out / "manifest.json").read_bytes()
    n_before = len(traces.open(out).rounds)

    def fail(pid: int, res) -> None:
        if res.round == 2:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom") as ei:
        record(RecordConfig(max_tokens=40, hidden="off", flush_every=1), **kw, overwrite=True, on_round=fail)
    partial = tmp_path / f"t.partial-{os.getpid()}"
    assert any(str(partial) in n for n in ei.value.__notes__)
    assert str(partial) in capsys.readouterr().err
    assert (out / "manifest.json").read_bytes() == before and len(traces.open(out).rounds) == n_before
    tp = traces.open(partial)
    assert tp.manifest["complete"] is False and sorted(tp.rounds["round"].tolist()) == [0, 1, 2]
    # a run that completes replaces the old trace; no partial or old folder is left
    s = record(RecordConfig(max_tokens=40, hidden="off", flush_every=1), **kw, overwrite=True)
    tr = traces.open(out)
    assert tr.manifest["complete"] is True and tr.manifest["params"]["max_tokens"] == 40
    assert len(tr.rounds) == s.n_rounds > n_before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def test_overwrite_refuses_a_trace_folder_that_holds_other_files(pair, noisy_rt, tmp_path, monkeypatch) -> None:
    """--overwrite replaces the trace's whole folder (swap_in): with a user's own files in it (here the prompts
    file the run would read, and a folder of notes), it is refused before anything loads and every file stays;
    an empty --out (the current folder) is refused too; with only the trace's own files it replaces as before."""
    from mtpscope.traces.run import recorder
    from mtpscope.traces.store.writer import swap_in

    out = tmp_path / "t"
    kw = {"target": pair["target"], "assistant": pair["noisy"], "runtime": noisy_rt}
    record(RecordConfig(max_tokens=6, hidden="off"), **kw, out=out, prompt=PROMPTS[0])
    (out / "prompts.jsonl").write_text('{"prompt": "hello"}\n')
    (out / "notes").mkdir()
    (out / "notes" / "a.txt").write_text("mine")
    before = sorted(p.name for p in out.iterdir())
    with monkeypatch.context() as m:
        m.setattr(recorder, "MtpRuntime", lambda *a, **k: pytest.fail("llama.cpp was reached"))
        with pytest.raises(TraceError, match="also holds notes, prompts.jsonl: move them out") as ei:
            record(RecordConfig(max_tokens=6, hidden="off"), target=pair["target"], assistant=pair["noisy"],
                   out=out, prompts_file=out / "prompts.jsonl", overwrite=True)
        assert ei.value.key == "out"
        with pytest.raises(TraceError, match="no output folder given"):
            record(RecordConfig(max_tokens=6), target=pair["target"], assistant=pair["noisy"], out="", prompt="x")
    assert sorted(p.name for p in out.iterdir()) == before and (out / "notes" / "a.txt").read_text() == "mine"
    # the guard is in swap_in itself too (files added during a run): nothing moves
    other = tmp_path / "other"
    record(RecordConfig(max_tokens=6, hidden="off"), **kw, out=other, prompt=PROMPTS[0])
    with pytest.raises(TraceError, match="also holds notes"):
        swap_in(other, out)
    assert sorted(p.name for p in out.iterdir()) == before and other.is_dir()
    (out / "prompts.jsonl").unlink()
    (out / "notes" / "a.txt").unlink()
    (out / "notes").rmdir()
    s = record(RecordConfig(max_tokens=8, hidden="off"), **kw, out=out, prompt=PROMPTS[0], overwrite=True)
    assert traces.open(out).manifest["params"]["max_tokens"] == 8 and len(traces.open(out).rounds) == s.n_rounds
    # "." (an --out of the current folder) has a sibling for the replacement: the folder's own name
    from mtpscope.traces.store.writer import partial_dir

    monkeypatch.chdir(out)
    assert partial_dir(".") == tmp_path / f"t.partial-{os.getpid()}"


def test_preflight_refuses_wrong_dtype_before_llama_cpp_crashes(pair, tmp_path, monkeypatch) -> None:
    from mtpscope.traces.run import recorder
    from tests.builders import parts, write

    arch, kv, tensors = parts("upstream")
    tensors["blk.0.attn_q.weight"] = tensors["blk.0.attn_q.weight"].astype(np.int32)  # I32 matrix
    bad = write(tmp_path / "i32.gguf", arch, kv, tensors)
    from gguf import GGUFReader  # independent check that the file really holds an I32 matrix

    assert {t.name: t.tensor_type.name for t in GGUFReader(str(bad)).tensors}["blk.0.attn_q.weight"] == "I32"
    monkeypatch.setattr(recorder, "MtpRuntime", lambda *a, **k: pytest.fail("llama.cpp was reached"))
    with pytest.raises(LayoutError, match="E_DTYPE blk.0.attn_q.weight") as ei:
        record(RecordConfig(), target=pair["target"], assistant=bad, out=tmp_path / "x", prompt="x")
    assert ei.value.key == "blk.0.attn_q.weight" and ei.value.actual == "I32"
    assert ei.value.path == os.fspath(bad) and not (tmp_path / "x").exists()
    # the unmutated drafter from the same parts passes the pre-flight
    arch, kv, tensors = parts("upstream")
    assert set(recorder.preflight(pair["target"], write(tmp_path / "ok.gguf", arch, kv, tensors))) == \
        {"target", "assistant"}


def test_cli_refuses_bad_draft_and_sampling_values(pair, tmp_path) -> None:
    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    base = ["record", "--target", str(pair["target"]), "--assistant", str(pair["noisy"]), "--prompt", "x",
            "--no-progress", "--out", str(tmp_path / "t")]
    for extra, name in ((["--n-draft", "1000000000"], "--n-draft"), (["--temp", "nan"], "temp"),
                        (["--top-p", "nan"], "top_p"), (["--top-k", "-1"], "top_k")):
        res = CliRunner().invoke(app, [*base, *extra])
        assert res.exit_code == 2 and f"'{name}'" in res.output, res.output
    assert not (tmp_path / "t").exists()


def test_a_context_too_big_for_memory_is_refused_before_llama_cpp_allocates(pair, tmp_path) -> None:
    """``max_tokens`` 10**9: the worker refuses the context (its KV cache is hundreds of GiB) in one line naming
    max_tokens, before llama.cpp tries the allocation (which took 10-60 s of swapping and then an allocation error
    or the kernel's out-of-memory kill), and before the trace folder is made (as the pre-flight's refusals)."""
    t0 = time.monotonic()
    with pytest.raises(TraceError, match="needs [0-9.]+ GiB for its KV cache alone") as ei:
        record(RecordConfig(max_tokens=10**9), target=pair["target"], assistant=pair["noisy"], out=tmp_path / "x",
               prompt=PROMPTS[0])
    assert ei.value.key == "max_tokens"
    assert "max_tokens 1000000000" in str(ei.value) and "\n" not in str(ei.value)
    assert not (tmp_path / "x").exists()
    assert time.monotonic() - t0 < 30


def test_mem_available_takes_the_smaller_of_the_machine_and_its_cgroup(tmp_path) -> None:
    """``MemAvailable`` of /proc/meminfo, or what a cgroup v2 limit leaves when that is less; no limit ("max") and
    no files leave the machine's figure, nothing known gives None."""
    from mtpscope.traces.run.preflight import mem_available

    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n")
    cg = tmp_path / "cg"
    cg.mkdir()
    assert mem_available(info, cg) == 20000000 * 1024                       # no cgroup files
    (cg / "memory.max").write_text("max\n")
    (cg / "memory.current").write_text("123\n")
    assert mem_available(info, cg) == 20000000 * 1024
    (cg / "memory.max").write_text(f"{8 << 30}\n")
    (cg / "memory.current").write_text(f"{3 << 30}\n")
    assert mem_available(info, cg) == 5 << 30
    assert mem_available(tmp_path / "none", cg) == 5 << 30
    assert mem_available(tmp_path / "none", tmp_path / "none") is None


def test_context_memory_check_agrees_with_llama_cpp_kv_buffer(pair) -> None:
    """``check_context_memory`` refuses exactly when the KV cache llama.cpp allocates for the recorder's contexts
    (``MtpRuntime``'s: swa_full as llama.cpp's default, no flash attention, so V rows padded to the widest; its own
    ``KV buffer size`` lines, summed over target and drafter) is more than the memory available: checked a tenth
    of a MiB either side of llama.cpp's figure (printed to 0.01 MiB)."""
    from mtpscope.traces.run.llama.logs import capture_log
    from mtpscope.traces.run.preflight import check_context_memory
    from tests.estimate_models import parse_llama_sizes

    n_ctx = 4096
    with capture_log() as pieces, MtpRuntime(pair["target"], pair["noisy"], n_ctx=n_ctx, capture=False) as r:
        assert r.n_ctx == n_ctx
    kv = sum(parse_llama_sizes(pieces)["kv_buffer"].values()) * 2**20
    assert kv > 0
    with pytest.raises(TraceError, match="KV cache alone"):
        check_context_memory(pair["target"], pair["noisy"], n_ctx, n_gpu_layers=0, flash_attn=False, why="test",
                             available=int(kv - 0.1 * 2**20))
    check_context_memory(pair["target"], pair["noisy"], n_ctx, n_gpu_layers=0, flash_attn=False, why="test",
                         available=int(kv + 0.1 * 2**20))
    check_context_memory(pair["target"], pair["noisy"], n_ctx, n_gpu_layers=-1, flash_attn=False, why="test",
                         available=1)                         # every layer on a GPU: no cache on the CPU


@pytest.mark.parametrize("temp", [0.0, 0.9], ids=["greedy", "sampled"])
def test_worker_summarized_steps_equal_the_recorder_summarizing_the_rows(pair, tmp_path, temp) -> None:
    """The recording worker summarizes each drafter step before it sends a round (``step_analysis.summarize_drafts``:
    top ids and logits, the draft's and the target's rank, the logits a derived h_inner reads), so the rows of
    ``n_vocab`` logits never cross to the recorder; in process (``runtime=``) the recorder gets the rows and
    summarizes them itself. One run recorded both ways gives equal traces, every column of both tables (timings
    aside) and every hidden state (h_inner, derived in both, to float32 summation noise); sampled, rows past the one that ended a round have no
    target token (target_rank null) in both. The values themselves are held against the drafter's weights by
    test_trace_steps."""
    cfg = RecordConfig(max_tokens=40, hidden="f32", temp=temp, seed=5)
    rt = MtpRuntime(pair["target"], pair["noisy"], n_ctx=1024, capture=False)
    try:
        record(cfg, target=pair["target"], assistant=pair["noisy"], out=tmp_path / "in", prompts=PROMPTS, runtime=rt,
               command=["test"])
    finally:
        rt.close()
    record(cfg, target=pair["target"], assistant=pair["noisy"], out=tmp_path / "worker", prompts=PROMPTS,
           command=["test"])
    a, b = traces.open(tmp_path / "in"), traces.open(tmp_path / "worker")
    assert a.manifest["derived"]["from"] == b.manifest["derived"]["from"]
    for table in ("rounds", "steps"):
        x, y = getattr(a, table), getattr(b, table)
        assert list(x.columns) == list(y.columns) and len(x) == len(y) > 0
        for c in x.columns:
            if not c.startswith("t_"):
                assert [repr(v.tolist() if isinstance(v, np.ndarray) else v) for v in x[c]] == \
                       [repr(v.tolist() if isinstance(v, np.ndarray) else v) for v in y[c]], (table, c)
    for h in ("h", "h_next"):
        np.testing.assert_array_equal(a.hidden(h), b.hidden(h))
    # h_inner to float32 summation noise: one solve per round in process, per batch of rounds received together
    # through the worker (derive_h_inner_rounds; tests/test_derived.py holds the two against each other)
    hb = b.hidden("h_inner")
    np.testing.assert_allclose(a.hidden("h_inner"), hb, rtol=1e-5, atol=1e-6 * float(np.abs(hb).max()))
    if temp:
        assert b.steps["target_token"].isna().any() and b.steps["target_rank"].isna().any()


def test_a_prompt_that_can_run_past_the_target_s_context_is_said(pair, tmp_path) -> None:
    """A prompt of 4090 tokens and max_tokens 16 against the tiny target's context_length 4096 (the GGUF's key, read
    here with our reader): recorded (llama.cpp goes on) with exit 0 and no word. Now a warning on stderr, in the
    summary and in the manifest's ``warnings``; a short prompt gives none."""
    from typer.testing import CliRunner

    from mtpscope.cli.main import app
    from mtpscope.inspector.gguf import open_gguf

    with open_gguf(pair["target"]) as f:
        ctx = int(f.get(f"{f.architecture}.context_length"))
    assert ctx == 4096
    p = tmp_path / "long.jsonl"
    p.write_text(json.dumps({"tokens": [int(t) for t in np.arange(4090) % 4000 + 10]}) + "\n")
    res = CliRunner().invoke(app, ["record", "--target", str(pair["target"]), "--assistant", str(pair["clean"]),
                                   "--prompts", str(p), "--max-tokens", "16", "--no-progress",
                                   "--out", str(tmp_path / "t")])
    assert res.exit_code == 0, res.output
    want = ("the longest prompt (4090 tokens) and max_tokens 16 can run past the target's context_length 4096: "
            "llama.cpp goes on past the positions the model was trained for")
    assert f"warning: {want}" in res.stderr.splitlines()
    assert traces.open(tmp_path / "t").manifest["warnings"] == [want]
    s = record(RecordConfig(max_tokens=4), target=pair["target"], assistant=pair["clean"], out=tmp_path / "s",
               prompt="The quick brown fox")
    assert s.warnings == () and "warnings" not in traces.open(tmp_path / "s").manifest
