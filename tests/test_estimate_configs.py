"""``estimate`` on the published configs in ``sample_configs/`` (inspector/config_model.py): the tensor table a
converter would write, checked against transformers' own module structure (the model built on the meta device:
shapes, no memory) and, at real size, against what llama.cpp allocates for a GGUF with that header and its data a
hole (tests/estimate_models.py ``write_hole_gguf``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mtpscope.cli.main import app
from mtpscope.inspector.config_model import model_from_config
from mtpscope.inspector.estimate import EstimateParams, estimate

SAMPLES = Path(__file__).resolve().parents[1] / "sample_configs"
VARIANTS = ("E2B", "E4B", "26B-A4B", "31B")
MiB = 1 << 20


def _cfg(name: str) -> dict[str, Any]:
    return {k: v for k, v in json.loads((SAMPLES / name / "config.json").read_text()).items() if not k.startswith("_")}


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_config_layout_has_transformers_tensors(variant: str) -> None:
    """Weights laid out from the config = transformers' own parameters of that config (built on the meta device),
    matrices in bf16 and vectors in F32 as the converter writes them, the tied lm_head and the centroid head left
    out, plus the generated rope_freqs; MoE experts, per-layer embeddings and double-wide MLPs included."""
    torch = pytest.importorskip("torch")
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4ForCausalLM, Gemma4TextConfig

    def nbytes(model: Any) -> int:
        return sum(t.numel() * (4 if t.dim() <= 1 else 2) for k, t in model.state_dict().items()
                   if k != "lm_head.weight" and not k.startswith("masked_embedding."))

    tc = _cfg(f"gemma-4-{variant}-it")["text_config"]
    rope = tc["global_head_dim"] // 2 * 4
    with torch.device("meta"):
        target = Gemma4ForCausalLM(Gemma4TextConfig(**tc))
    m = model_from_config(SAMPLES / f"gemma-4-{variant}-it")
    assert sum(t.n_bytes for t in m.tensors) == nbytes(target) + rope
    a = _cfg(f"gemma-4-{variant}-it-assistant")
    dtc = Gemma4TextConfig(**a.pop("text_config"))
    with torch.device("meta"):
        drafter = Gemma4AssistantForCausalLM(Gemma4AssistantConfig(text_config=dtc, **{
            k: v for k, v in a.items() if k not in ("architectures", "model_type")}))
    d = model_from_config(SAMPLES / f"gemma-4-{variant}-it-assistant")
    assert sum(t.n_bytes for t in d.tensors) == nbytes(drafter) + rope
    assert d.architecture == "gemma4-assistant" and d.get("gemma4-assistant.embedding_length_out") == tc["hidden_size"]


def test_config_estimate_names_what_it_assumed(tmp_path: Path) -> None:
    """KV of the published E2B by hand: 15 of 35 layers hold K/V (20 shared), every fifth a full layer (3 of them,
    4096 cells x 1 head x 512) and 12 sliding ones (pad256(512 + 512) = 1024 cells x 256), f16, K and V alike;
    q8_0 weights are about 34/64 of bf16 for the matrices; a field the file leaves out is named."""
    m = model_from_config(SAMPLES / "gemma-4-E2B-it")
    e = estimate(m, model_from_config(SAMPLES / "gemma-4-E2B-it-assistant"), EstimateParams(n_ctx=4096))
    assert e.target.kv_k == e.target.kv_v == 2 * (3 * 4096 * 512 + 12 * 1024 * 256)
    assert e.drafter.kv_shared_from == {"sliding": 13, "full": 14}
    assert any("KV-shared layers" in n for n in e.notes)
    q8 = model_from_config(SAMPLES / "gemma-4-E2B-it", weight_type="q8_0")
    mats = sum(t.n_bytes for t in m.tensors if len(t.ne) > 1)
    assert sum(t.n_bytes for t in q8.tensors if len(t.ne) > 1) == mats * 34 // 64
    cfg = json.loads((SAMPLES / "gemma-4-31B-it" / "config.json").read_text())
    del cfg["text_config"]["intermediate_size"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert any("intermediate_size" in n for n in model_from_config(tmp_path).notes)


def test_cli_estimate_on_published_configs() -> None:
    r = CliRunner().invoke(app, ["estimate", "--target", str(SAMPLES / "gemma-4-26B-A4B-it"), "--assistant",
                                 str(SAMPLES / "gemma-4-26B-A4B-it-assistant"), "--n-ctx", "131072", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    # 30 layers, 128 experts of 3 x 2816 x 704 bf16 each: the experts alone are 45 GiB of the target
    assert d["target"]["weights"] > 30 * 128 * 3 * 2816 * 704 * 2
    assert d["total"] == sum(v["total"] for v in d["by_device"].values())
    r = CliRunner().invoke(app, ["estimate", "--target", str(SAMPLES / "gemma-4-31B-it"), "--weight-type", "q4_k"])
    assert r.exit_code == 2 and "weight type" in r.output
    r = CliRunner().invoke(app, ["estimate", "--target", str(SAMPLES / "gemma-4-E2B-it")])
    assert r.exit_code == 0 and "20 shared-KV layers hold none" in r.stdout


@pytest.mark.slow
@pytest.mark.llama
@pytest.mark.parametrize("variant,contexts", [("E2B", (4096, 131072)), ("E4B", (4096, 131072))])
def test_published_config_at_real_size_against_llama_cpp(variant: str, contexts: tuple[int, ...],
                                                        tmp_path: Path) -> None:
    """The header laid out from the published config, tensor data a hole: llama.cpp loads exactly that tensor
    table (its model size = the estimate's weights, bytes) and allocates the KV and compute the estimate says
    (KV within 1 %, compute within COMPUTE_TOLERANCE of one of the two allocator outcomes) at real size.
    (26B-A4B and 31B load in 30-80 s on these machines: measured once for docs/FAMILIES.md, not here.)"""
    pytest.importorskip("llama_cpp")
    from mtpscope.cache import vocab_path
    from mtpscope.inspector.tokenizer import tokenizer_kv
    from mtpscope.traces.run.llama.binding import llama
    from mtpscope.traces.run.llama.logs import capture_log
    from mtpscope.traces.run.llama.model import LlamaContext, LlamaModel
    from tests.estimate_models import compute_close, parse_llama_sizes, write_hole_gguf

    voc = list(tokenizer_kv(vocab_path()))
    tm = model_from_config(SAMPLES / f"gemma-4-{variant}-it")
    dm = model_from_config(SAMPLES / f"gemma-4-{variant}-it-assistant")
    tp, dp = write_hole_gguf(tmp_path / "t.gguf", tm, voc), write_hole_gguf(tmp_path / "d.gguf", dm, voc)
    t, d = LlamaModel(tp), LlamaModel(dp)
    try:
        assert llama().llama_model_size(t.ptr) == estimate(tm).target.weights
        assert llama().llama_model_size(d.ptr) == estimate(tm, dm).drafter.weights
        for n_ctx in contexts:
            e = estimate(tm, dm, EstimateParams(n_ctx=n_ctx))
            with capture_log() as log:
                c = LlamaContext(t, n_ctx=n_ctx, n_batch=512, flash_attn=True, swa_full=False)
            try:
                with capture_log() as dlog:
                    LlamaContext(d, n_ctx=n_ctx, n_batch=512, flash_attn=True, swa_full=False, mtp_of=c,
                                   masked=True).close()
            finally:
                c.close()
            got, dgot = parse_llama_sizes(log), parse_llama_sizes(dlog)
            kv = sum(got["kv_buffer"].values())
            assert abs(e.target.kv / MiB - kv) <= max(0.01 * kv, 0.01), (n_ctx, kv)
            assert compute_close(e.target, got["compute"]["CPU"]), (n_ctx, got["compute"])
            assert compute_close(e.drafter, dgot["compute"]["CPU"]), (n_ctx, dgot["compute"])
    finally:
        d.close()
        t.close()
