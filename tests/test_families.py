"""Every published Gemma 4 family end to end, on tiny checkpoints built by transformers itself
(:mod:`mtpscope.demo.families`: E2B / E4B with per-layer embeddings and KV-shared layers, 26B-A4B with the MoE
block, 31B dense with K = V; drafters with the centroid head (E2B / E4B) or a dense head with K = V).

* conversion: the GGUF's keys and tensors are what llama.cpp's loader expects (shapes written here by hand from
  ``src/models/gemma4.cpp`` and the family's config) and hold the HF checkpoint's values; llama.cpp loads both
  files exactly when ``verify`` says it does;
* HF parity (torch): the target's logits on prompts longer than the sliding window lie within the F16 bound of
  :func:`tests.numerics.f16_effect` (HF with llama.cpp's roundings emulated, tests/hf_ggml.py), llama.cpp's
  greedy continuation is HF's argmax at every position (up to a near tie inside that bound), and the drafter's
  first round in llama.cpp drafts what HF's assisted generation drafts;
* MTP: the real llama.cpp records each pair (``record``), ``report`` / ``explain`` / ``compare`` read the
  traces, ``replay``'s reference drafter reproduces every recorded draft (agreement 1.0; for E2B / E4B through
  the KV donors of the shared-KV layers), and the app's pages open on a family trace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mtpscope.demo.families import FAMILIES, SPECS, build_family
from mtpscope.inspector.gguf import open_gguf
from mtpscope.inspector.safetensors import read_safetensors

#: prompts of real token ids (the tiny models' vocabulary is the real tokenizer's first 4096 tokens); the first
#: is longer than every family's sliding window (16 / 32), so sliding layers drop cells
PROMPTS = [[2, 100, 200, 300, 400, 500, 17, 33, 900, 1200, 55, 66, 77, 88, 99, 111, 222, 333, 444, 555, 666, 777,
            888, 999, 1111, 2222, 3333, 31, 41, 3000, 2999, 1234, 4000, 5, 6],
           [2, 7, 8, 9, 10], [2, 3000, 2999, 1234, 4000, 5, 6, 7, 8, 9, 11]]


@pytest.fixture(scope="module", params=FAMILIES)
def fam(request: pytest.FixtureRequest) -> Any:
    return build_family(request.param)


def _hf(path: Path) -> dict[str, np.ndarray]:
    return read_safetensors(path / "model.safetensors")


def _val(f: Any, key: str) -> Any:
    v = f.get(key)
    return v.to_list() if hasattr(v, "to_list") else v


# what each family's target must look like in llama.cpp's layout, written by hand from the spec
# (SPECS in mtpscope/demo/families.py) and src/models/gemma4.cpp load_arch_tensors; ne order (innermost first)
EXPECT = {
    "e2b": {"block_count": 10, "attention.shared_kv_layers": 5, "embedding_length_per_layer_input": 16,
            "feed_forward_length": [128] * 5 + [256] * 5, "attention.head_count_kv": 1,
            "ne": {"per_layer_token_embd.weight": (160, 4096), "per_layer_model_proj.weight": (64, 160),
                   "per_layer_proj_norm.weight": (16,), "blk.0.inp_gate.weight": (64, 16),
                   "blk.0.proj.weight": (16, 64), "blk.9.post_norm.weight": (64,), "blk.7.ffn_gate.weight": (64, 256),
                   "blk.2.ffn_down.weight": (128, 64), "blk.4.attn_k.weight": (64, 64),
                   "blk.3.attn_v.weight": (64, 32)},
            "absent": ["blk.5.attn_k.weight", "blk.9.attn_v.weight", "blk.6.attn_k_norm.weight",
                       "blk.0.ffn_gate_inp.weight"]},
    "e4b": {"block_count": 12, "attention.shared_kv_layers": 6, "embedding_length_per_layer_input": 16,
            "feed_forward_length": 192, "attention.head_count_kv": 2,
            "ne": {"per_layer_token_embd.weight": (192, 4096), "blk.11.inp_gate.weight": (96, 16),
                   "blk.5.attn_v.weight": (96, 128), "blk.4.attn_k.weight": (96, 64)},
            "absent": ["blk.6.attn_k.weight", "blk.11.attn_v.weight"]},
    "26b-a4b": {"block_count": 6, "attention.shared_kv_layers": 0, "embedding_length_per_layer_input": 0,
                "feed_forward_length": 48, "attention.head_count_kv": [2, 2, 2, 2, 2, 1], "expert_count": 8,
                "expert_used_count": 2, "expert_feed_forward_length": 32,
                "ne": {"blk.0.ffn_gate_inp.weight": (64, 8), "blk.0.ffn_gate_inp.scale": (64,),
                       "blk.3.ffn_gate_up_exps.weight": (64, 64, 8), "blk.3.ffn_down_exps.weight": (32, 64, 8),
                       "blk.3.ffn_down_exps.scale": (8,), "blk.5.pre_ffw_norm_2.weight": (64,),
                       "blk.5.post_ffw_norm_1.weight": (64,), "blk.5.post_ffw_norm_2.weight": (64,),
                       "blk.5.attn_k.weight": (64, 64), "blk.4.attn_v.weight": (64, 64),
                       "blk.1.ffn_gate.weight": (64, 48)},
                "absent": ["blk.5.attn_v.weight", "per_layer_token_embd.weight", "blk.0.ffn_gate_exps.weight"]},
    "31b": {"block_count": 6, "attention.shared_kv_layers": 0, "embedding_length_per_layer_input": 0,
            "feed_forward_length": 256, "attention.head_count_kv": [2, 2, 2, 2, 2, 1],
            "ne": {"blk.5.attn_k.weight": (96, 64), "blk.5.attn_q.weight": (96, 256), "blk.0.attn_v.weight": (96, 64)},
            "absent": ["blk.5.attn_v.weight", "blk.0.ffn_gate_inp.weight"]},
}
# HF tensor -> GGUF tensor whose values must be equal (numpy shapes equal: GGUF ne is the reverse of numpy shape)
SAME = {
    "e2b": {"model.embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
            "model.per_layer_model_projection.weight": "per_layer_model_proj.weight",
            "model.layers.7.per_layer_input_gate.weight": "blk.7.inp_gate.weight",
            "model.layers.7.per_layer_projection.weight": "blk.7.proj.weight",
            "model.layers.7.mlp.up_proj.weight": "blk.7.ffn_up.weight"},
    "e4b": {"model.layers.0.post_per_layer_input_norm.weight": "blk.0.post_norm.weight",
            "model.per_layer_projection_norm.weight": "per_layer_proj_norm.weight"},
    "26b-a4b": {"model.layers.2.experts.gate_up_proj": "blk.2.ffn_gate_up_exps.weight",
                "model.layers.2.experts.down_proj": "blk.2.ffn_down_exps.weight",
                "model.layers.2.router.proj.weight": "blk.2.ffn_gate_inp.weight",
                "model.layers.2.router.scale": "blk.2.ffn_gate_inp.scale",
                "model.layers.2.router.per_expert_scale": "blk.2.ffn_down_exps.scale",
                "model.layers.2.pre_feedforward_layernorm_2.weight": "blk.2.pre_ffw_norm_2.weight",
                "model.layers.2.post_feedforward_layernorm_1.weight": "blk.2.post_ffw_norm_1.weight"},
    "31b": {"model.layers.5.self_attn.k_proj.weight": "blk.5.attn_k.weight"},
}


def test_target_in_llama_cpps_layout_with_hfs_values(fam) -> None:
    want = EXPECT[fam.name]
    f = open_gguf(fam.target)
    for k in ("block_count", "attention.shared_kv_layers", "embedding_length_per_layer_input", "feed_forward_length",
              "attention.head_count_kv", "expert_count", "expert_used_count", "expert_feed_forward_length"):
        if k in want:
            assert _val(f, "gemma4." + k) == want[k], k
    names = {t.name: t for t in f.tensors}
    for name, ne in want["ne"].items():
        assert names[name].ne == ne, name
    for name in want["absent"]:
        assert name not in names, name
    st = _hf(fam.hf_target)
    for hf_name, g in SAME[fam.name].items():
        a, b = st[hf_name], f.tensor_data(g)
        assert b.shape == (a.shape if a.ndim > 1 or a.size > 1 else (1,)), g
        assert np.array_equal(np.asarray(b, np.float32).reshape(a.shape), a), g
    # every HF tensor went somewhere (the tied lm_head is not saved by save_pretrained)
    n_rope = 1
    assert len(names) == len(st) + n_rope


def test_verify_and_llama_cpps_loader_agree(fam) -> None:
    """``verify``: no error, llama.cpp's verdict "loads"; llama.cpp then loads both files (model sizes as our
    reader sums them) and creates the drafter's MTP context on the target's."""
    pytest.importorskip("llama_cpp")
    from mtpscope.inspector.validate import verify
    from mtpscope.traces.run.llama.binding import llama
    from mtpscope.traces.run.llama.model import LlamaContext, LlamaModel

    rt = verify(fam.target)
    rd = verify(fam.drafter, target=fam.target)
    for r in (rt, rd):
        assert r.ok, [(x.code, x.message) for x in r.errors]
        assert r.loadability[0].loads is True and r.loadability[0].outcome == "loads"
    n_kv = SPECS[fam.name].target["num_hidden_layers"] - SPECS[fam.name].target["num_kv_shared_layers"]
    n = SPECS[fam.name].target["num_hidden_layers"]
    # the drafter's caches: llama.cpp's donors n-2 / n-1, resolved through the target's KV sharing; HF: the
    # last layer of each type that computes its own K/V
    want = {"sliding": n_kv - 2, "full": n_kv - 1}
    assert dict(rd.pairing.kv_donors) == {"sliding": n - 2, "full": n - 1}
    assert dict(rd.pairing.kv_cache) == want == dict(rd.pairing.kv_cache_hf)
    t = LlamaModel(fam.target)
    d = LlamaModel(fam.drafter)
    try:
        assert llama().llama_model_size(t.ptr) == sum(x.n_bytes for x in open_gguf(fam.target).tensors)
        assert llama().llama_model_size(d.ptr) == sum(x.n_bytes for x in open_gguf(fam.drafter).tensors)
        c = LlamaContext(t, n_ctx=256, n_batch=64)
        dc = LlamaContext(d, n_ctx=256, n_batch=64, mtp_of=c, masked=True)
        dc.close()
        c.close()
    finally:
        d.close()
        t.close()


def test_converter_refuses_what_llama_cpp_cannot_load(fam, tmp_path: Path) -> None:
    """Per-layer embeddings over another vocabulary (llama.cpp sizes them by n_vocab) and KV-shared layers
    whose donors are not of their type (llama.cpp aborts creating the context) are refused by ``convert``."""
    import json
    import shutil

    from mtpscope.errors import HFCheckpointError
    from mtpscope.inspector.convert import convert

    if not SPECS[fam.name].target["num_kv_shared_layers"]:
        pytest.skip("a family without PLE / KV sharing")
    src = tmp_path / "hf"
    shutil.copytree(fam.hf_target, src)
    cfg = json.loads((src / "config.json").read_text())
    bad = dict(cfg, vocab_size_per_layer_input=cfg["vocab_size"] // 2)
    (src / "config.json").write_text(json.dumps(bad))
    with pytest.raises(HFCheckpointError, match="per_layer_token_embd by vocab_size") as e:
        convert(src, tmp_path / "t.gguf")
    assert e.value.key == "vocab_size_per_layer_input"
    bad = dict(cfg, num_kv_shared_layers=cfg["num_kv_shared_layers"] + 1)  # donors n_kv-2 / n_kv-1 now full / s
    (src / "config.json").write_text(json.dumps(bad))
    with pytest.raises(HFCheckpointError, match="aborts creating a context"):
        convert(src, tmp_path / "t.gguf")


@pytest.mark.llama
def test_preflight_and_verify_name_what_llama_cpp_aborts_on(tmp_path: Path) -> None:
    """An E2B target whose KV-shared layers llama.cpp cannot place (6 shared of 10: a full shared layer would
    reuse layer 3, a sliding one): llama.cpp loads it and aborts creating the context (its own message, run in a
    child process); ``verify`` names it (E_SHARED_KV_LAYOUT, verdict "aborts creating a context" with that
    message) and ``record``'s pre-flight refuses the pair before llama.cpp sees it."""
    pytest.importorskip("llama_cpp")
    from mtpscope.errors import LayoutError
    from mtpscope.inspector.gguf_write import meta_value, u32, write_gguf
    from mtpscope.inspector.validate import verify
    from mtpscope.traces.run.preflight import preflight
    from tests.runtime_probe import probe

    fam = build_family("e2b")
    f = open_gguf(fam.target)
    kv = [(k, meta_value(v)) for k, v in f.kv.items() if k != "general.architecture"]
    kv = [(k, u32(6) if k == "gemma4.attention.shared_kv_layers" else v) for k, v in kv]
    bad = write_gguf(tmp_path / "bad.gguf", "gemma4", kv, {t.name: np.array(f.tensor_data(t.name)) for t in f.tensors})
    res = probe(bad, fam.drafter)
    msg = "GGML_ASSERT(map_layer_ids.find(il_reuse) != map_layer_ids.end()) failed"
    assert res.signal == "SIGABRT" and msg in res.stderr
    r = verify(bad)
    e = next(x for x in r.errors if x.code == "E_SHARED_KV_LAYOUT")
    assert e.expected == "layer 3 full" and e.actual == "layer 3 sliding"
    assert r.loadability[0].outcome == "aborts creating a context" and r.loadability[0].message == msg
    with pytest.raises(LayoutError, match="llama.cpp would abort on this file"):
        preflight(bad, fam.drafter)
    assert preflight(fam.target, fam.drafter)["target"]["architecture"] == "gemma4"


# ------------------------------------------------------------------------------------------- HF parity


@pytest.fixture(scope="module")
def torch_hf():
    torch = pytest.importorskip("torch", reason="HF parity needs the parity extra (torch)")
    pytest.importorskip("transformers", reason="HF parity needs the parity extra (transformers)")
    torch.set_num_threads(1)
    return torch


def _llama_logits(model: Any, tokens: list[int]) -> np.ndarray:
    from mtpscope.traces.run.llama.model import LlamaContext, TokenBatch

    c = LlamaContext(model, n_ctx=256, n_batch=64, flash_attn=False, nextn=False)
    b = TokenBatch(64)
    try:
        b.set(tokens, 0, logits="all")
        c.decode(b)
        return np.stack([np.array(c.logits(i), np.float64) for i in range(len(tokens))])
    finally:
        b.close()
        c.close()


def _llama_greedy(model: Any, tokens: list[int], n: int) -> list[int]:
    from mtpscope.traces.run.llama.model import LlamaContext, TokenBatch

    c = LlamaContext(model, n_ctx=256, n_batch=64, flash_attn=False, nextn=False)
    b = TokenBatch(64)
    out: list[int] = []
    try:
        b.set(tokens, 0)
        c.decode(b)
        for i in range(n):
            out.append(int(np.argmax(c.logits(-1))))
            b.set([out[-1]], len(tokens) + i)
            c.decode(b)
    finally:
        b.close()
        c.close()
    return out


@pytest.mark.slow
@pytest.mark.llama
def test_target_logits_and_greedy_match_hf(fam, torch_hf) -> None:
    """llama.cpp's logits within (1 + FLIP_SHARE_MAX) E of HF's fp32 logits, E = the F16 effect measured on HF
    with llama.cpp's roundings (:func:`tests.numerics.f16_effect`); its distance from that emulated model at most
    FLIP_SHARE_MAX E; and its greedy tokens HF's argmax, teacher-forced, up to a near tie of 2 (1 + share) E."""
    torch = torch_hf
    pytest.importorskip("llama_cpp")
    from transformers import Gemma4ForCausalLM

    from mtpscope.traces.run.llama.model import LlamaModel
    from tests.hf_ggml import emulate
    from tests.numerics import FLIP_SHARE_MAX, f16_effect

    load = dict(dtype=torch.float32, attn_implementation="eager")
    tm = Gemma4ForCausalLM.from_pretrained(fam.hf_target, **load).eval()
    em = emulate(Gemma4ForCausalLM.from_pretrained(fam.hf_target, **load).eval())
    m = LlamaModel(fam.target)
    n_tokens, ties = 0, []
    try:
        for prompt in PROMPTS:
            gen = _llama_greedy(m, prompt, 12)
            seq = prompt + gen[:-1]
            with torch.no_grad():
                hf = tm(torch.tensor([seq])).logits[0].double().numpy()
                he = em(torch.tensor([seq])).logits[0].double().numpy()
            ll = _llama_logits(m, seq)
            e = f16_effect(hf, he)
            scale = float(np.abs(hf).max())
            assert e < 0.05 * scale  # the roundings are a small effect (a mapping error is O(scale))
            assert np.abs(ll - he).max() <= FLIP_SHARE_MAX * e, (fam.name, np.abs(ll - he).max(), e)
            assert np.abs(ll - hf).max() <= (1 + FLIP_SHARE_MAX) * e
            # greedy: HF's argmax at every generated position, or a near tie
            tie = 2 * (1 + FLIP_SHARE_MAX) * e
            for i, tok in enumerate(gen):
                row = hf[len(prompt) - 1 + i]
                n_tokens += 1
                if int(row.argmax()) != tok:
                    gap = float(row.max() - row[tok])
                    assert gap <= tie, (fam.name, prompt, i, gap, tie)
                    ties.append((i, gap))
    finally:
        m.close()
    assert n_tokens == 36 and len(ties) <= 2, ties


@pytest.mark.slow
@pytest.mark.llama
def test_drafter_first_round_drafts_like_hf(fam, torch_hf) -> None:
    """HF's own assisted generation (dense head) and llama.cpp's MTP loop draft the same first round on each
    prompt, up to a near tie (tests/test_parity_hf.py's TIE_REL: the target's F16 numerics reach the drafter).
    Only prompts shorter than the sliding window W: on a longer one HF's assistant shows its sliding layers the
    last W cells of the handed-over K/V, llama.cpp's mask the last W - 1 (positions p-W+1 .. p-1 for a draft at
    p; facts §3), so drafts differ by design from the first step on (seen on e4b's 35-token prompt)."""
    torch = torch_hf
    pytest.importorskip("llama_cpp")
    from transformers import Gemma4AssistantForCausalLM, Gemma4ForCausalLM

    from mtpscope.traces.run.live_run import live_mtp_run
    from tests.numerics import TIE_REL

    load = dict(dtype=torch.float32, attn_implementation="eager")
    tm = Gemma4ForCausalLM.from_pretrained(fam.hf_target, **load).eval()
    dm = Gemma4AssistantForCausalLM.from_pretrained(fam.hf_drafter, use_ordered_embeddings=False, **load).eval()
    dm.generation_config.num_assistant_tokens = 3
    dm.generation_config.num_assistant_tokens_schedule = "constant"
    n_same = 0
    for prompt in [p for p in PROMPTS if len(p) < SPECS[fam.name].drafter["sliding_window"]]:
        got: list[np.ndarray] = []
        h = dm.register_forward_hook(lambda _m, _a, _k, out, got=got: got.append(out.logits[0, -1].double().numpy()),
                                     with_kwargs=True)
        try:
            with torch.no_grad():
                tm.generate(torch.tensor([prompt]), assistant_model=dm, max_new_tokens=5, do_sample=False)
        finally:
            h.remove()
        run = live_mtp_run(fam.target, fam.drafter, prompt, n_rounds=1, n_draft=3)
        for lg, s in zip(got[:3], run.steps[:3], strict=True):
            if s.draft != int(lg.argmax()):
                assert lg.max() - lg[s.draft] <= TIE_REL * np.abs(lg).max(), (fam.name, prompt, s.k)
                break
            n_same += 1
    assert n_same >= 4


# ------------------------------------------------------------------------------------------- MTP in llama.cpp


@pytest.fixture(scope="module")
def recorded(fam, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("llama_cpp")
    from mtpscope.traces.run.record_config import RecordConfig
    from mtpscope.traces.run.recorder import record

    d = tmp_path_factory.mktemp(f"rec-{fam.name}")
    out = {}
    for n_draft in (3, 2):
        out[n_draft] = d / f"n{n_draft}"
        cfg = RecordConfig(max_tokens=20, n_draft=n_draft, centroids=fam.sidecar, n_gpu_layers=0)
        s = record(cfg, target=fam.target, assistant=fam.drafter, out=out[n_draft],
                   prompts=["The quick brown fox", "def main():"])
        assert s.n_rounds > 0 and s.n_drafted > 0
    return out


@pytest.mark.llama
def test_mtp_recorded_reported_explained_and_replayed(fam, recorded) -> None:
    from mtpscope.traces import open as open_trace
    from mtpscope.traces.analysis.compare_report import compare_traces
    from mtpscope.traces.analysis.explain_report import explain_trace
    from mtpscope.traces.analysis.metrics import report
    from mtpscope.traces.run.replay import replay

    tr = open_trace(recorded[3])
    rep = report(tr)
    rounds = tr.rounds
    # the report's numbers, recounted from the rounds table
    assert rep.n_rounds == len(rounds)
    assert rep.n_drafted == int(rounds["n_draft"].sum())
    assert rep.n_accepted == int(rounds["n_accepted"].sum())
    assert tr.manifest["models"]["target"]["architecture"] == "gemma4"
    if fam.sidecar is not None:  # the centroid head's columns are filled (E2B / E4B)
        assert tr.manifest["centroids"]["top_k"] == SPECS[fam.name].centroids[1]
        assert tr.steps["centroid_token"].notna().all()
    ex = explain_trace(tr)
    assert ex.to_dict()["rejections"]["n_rounds_rejected"] == int((rounds["n_accepted"] < rounds["n_draft"]).sum())
    diff = compare_traces(tr, open_trace(recorded[2]))
    assert diff.prompts
    # the reference drafter (numpy) reproduces every recorded draft, through the KV-shared donors on E2B / E4B
    s = replay(recorded[3]).summary().to_dict()
    from tests.numerics import assert_replay_faithful

    assert_replay_faithful(s, f"{fam.name} family")
    assert s["n_steps"] == rep.n_drafted


@pytest.mark.slow
@pytest.mark.llama
def test_app_pages_open_on_a_family_trace(fam, recorded, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    from mtpscope.cli.serve import main_script

    if fam.name not in ("e2b", "26b-a4b"):
        pytest.skip("one PLE / shared-KV family and the MoE family are enough for the pages")
    monkeypatch.setenv("MTPSCOPE_ROOTS", str(recorded[3].parent))
    at = AppTest.from_file(str(main_script()), default_timeout=120)
    at.session_state["sel.trace"] = str(recorded[3])
    at.session_state["sel.trace_b"] = str(recorded[2])
    at.session_state["sel.target"] = str(fam.target)
    at.session_state["sel.drafter"] = str(fam.drafter)
    at.run()
    for page in ("acceptance", "step", "explain", "compare", "tensors", "validate"):
        at.switch_page(f"screens/{page}.py").run()
        assert not at.exception, (page, [e.value for e in at.exception])


# ------------------------------------------------------------------------------------------- estimate

#: (n_ctx, cache type) cases of the issue; flash attention on (llama.cpp's auto on CPU), swa_full off (llama-server)
EST_CASES = [(4096, "f16"), (4096, "q8_0"), (131072, "f16"), (131072, "q8_0")]
_GGML_TYPE = {"f16": 1, "q8_0": 8}


@pytest.mark.llama
def test_estimate_against_llama_cpp(fam) -> None:
    """``estimate`` vs what llama.cpp allocates for the pair: weights exact (bytes), KV within 1 % (shared-KV
    layers and sliding windows included; the drafter none), output buffers exact to the log's 0.01 MiB, compute
    buffers within COMPUTE_TOLERANCE of one of the estimate's two allocator outcomes."""
    pytest.importorskip("llama_cpp")
    from mtpscope.inspector.estimate import EstimateParams, estimate
    from mtpscope.traces.run.llama.binding import llama
    from mtpscope.traces.run.llama.logs import capture_log
    from mtpscope.traces.run.llama.model import LlamaContext, LlamaModel
    from tests.estimate_models import compute_close, parse_llama_sizes

    mib, res = 1 << 20, 0.005  # llama.cpp prints MiB with 2 decimals
    t, d = LlamaModel(fam.target), LlamaModel(fam.drafter)
    try:
        e0 = estimate(fam.target, fam.drafter)
        assert e0.target.weights == llama().llama_model_size(t.ptr)
        assert e0.drafter.weights == llama().llama_model_size(d.ptr)
        n = SPECS[fam.name].target["num_hidden_layers"]
        n_kv = n - SPECS[fam.name].target["num_kv_shared_layers"]
        assert e0.drafter.kv_shared_from == {"sliding": n_kv - 2, "full": n_kv - 1}
        for n_ctx, ct in EST_CASES:
            e = estimate(fam.target, fam.drafter, EstimateParams(n_ctx=n_ctx, cache_type_k=ct, cache_type_v=ct))
            with capture_log() as log:
                c = LlamaContext(t, n_ctx=n_ctx, n_batch=512, flash_attn=True, swa_full=False,
                                   type_k=_GGML_TYPE[ct], type_v=_GGML_TYPE[ct])
            got = parse_llama_sizes(log)
            try:
                with capture_log() as dlog:
                    dc = LlamaContext(d, n_ctx=n_ctx, n_batch=512, flash_attn=True, swa_full=False, mtp_of=c,
                                        masked=True, type_k=_GGML_TYPE[ct], type_v=_GGML_TYPE[ct])
                dc.close()
            finally:
                c.close()
            dgot = parse_llama_sizes(dlog)
            kv = sum(got["kv_buffer"].values())
            case = (fam.name, n_ctx, ct)
            assert abs(e.target.kv / mib - kv) <= max(0.01 * kv, 2 * res), (case, e.target.kv / mib, kv)
            assert dgot["kv_buffer"] == {} and e.drafter.kv == 0
            assert abs(e.target.output_bytes / mib - got["output"]["CPU"]) <= res, case
            assert compute_close(e.target, got["compute"]["CPU"]), (case, got["compute"])
            assert compute_close(e.drafter, dgot["compute"]["CPU"]), (case, dgot["compute"])
    finally:
        d.close()
        t.close()
