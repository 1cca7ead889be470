"""sample_configs/: every HF config is marked with its source, pairs are consistent (the pairing rules of
docs/reference/gemma4-assistant-facts.md section 1), and the 26B-A4B target equals the hyperparameters the
real tokenizer GGUF carries (read here with the project's GGUF reader)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "sample_configs"
VARIANTS = ("E2B", "E4B", "26B-A4B", "31B")


def _cfg(name: str) -> dict:
    return json.loads((ROOT / name / "config.json").read_text())


@pytest.mark.parametrize("variant", VARIANTS)
def test_assistant_and_target_pair(variant: str) -> None:
    a, t = _cfg(f"gemma-4-{variant}-it-assistant"), _cfg(f"gemma-4-{variant}-it")
    assert a["_source"] and t["_source"]
    assert a["architectures"] == ["Gemma4AssistantForCausalLM"] and a["model_type"] == "gemma4_assistant"
    at, tt = a["text_config"], t["text_config"]
    assert a["backbone_hidden_size"] == tt["hidden_size"]
    assert at["num_hidden_layers"] == len(at["layer_types"]) == 4
    assert at["layer_types"] == ["sliding_attention"] * 3 + ["full_attention"]
    for k in ("num_key_value_heads", "num_global_key_value_heads", "head_dim", "global_head_dim",
              "sliding_window", "attention_k_eq_v", "vocab_size"):
        assert at[k] == tt[k], k
    assert at["vocab_size"] == 262144 and at["final_logit_softcapping"] is None
    assert tt["final_logit_softcapping"] == 30.0
    assert at["hidden_size"] != a["backbone_hidden_size"]      # upstream loader rule
    if a["use_ordered_embeddings"]:
        assert 262144 % a["num_centroids"] == 0
    if "layer_types" in tt:
        assert len(tt["layer_types"]) == tt["num_hidden_layers"]


def test_published_head_types() -> None:
    # centroid head on the edge variants, dense on the large ones (facts section 2)
    assert [_cfg(f"gemma-4-{v}-it-assistant")["use_ordered_embeddings"] for v in VARIANTS] == [True, True, False, False]


def test_26b_target_matches_the_real_gguf_hparams() -> None:
    from mtpscope.cache import vocab_path
    from mtpscope.inspector.gguf import open_gguf

    tc = _cfg("gemma-4-26B-A4B-it")["text_config"]
    with open_gguf(vocab_path()) as f:
        g = {k: f.get(k) for k in f.kv if k.startswith("gemma4.")}
        pattern = [bool(x) for x in g["gemma4.attention.sliding_window_pattern"].to_list()]
        kv_heads = g["gemma4.attention.head_count_kv"].to_list()
    assert tc["hidden_size"] == g["gemma4.embedding_length"]
    assert tc["num_hidden_layers"] == g["gemma4.block_count"]
    assert tc["intermediate_size"] == g["gemma4.feed_forward_length"]
    assert tc["num_attention_heads"] == g["gemma4.attention.head_count"]
    assert tc["layer_types"] == ["sliding_attention" if s else "full_attention" for s in pattern]
    assert {tc["num_key_value_heads"]} == {k for k, s in zip(kv_heads, pattern) if s}
    assert {tc["num_global_key_value_heads"]} == {k for k, s in zip(kv_heads, pattern) if not s}
    assert tc["num_experts"] == g["gemma4.expert_count"] and tc["top_k_experts"] == g["gemma4.expert_used_count"]
    assert tc["moe_intermediate_size"] == g["gemma4.expert_feed_forward_length"]
    assert tc["head_dim"] == g["gemma4.attention.key_length_swa"]
    assert tc["global_head_dim"] == g["gemma4.attention.key_length"]
    assert tc["sliding_window"] == g["gemma4.attention.sliding_window"]


def test_readme_names_every_folder() -> None:
    readme = (ROOT / "README.md").read_text()
    for d in ROOT.iterdir():
        if d.is_dir():
            assert f"`{d.name}/`" in readme or d.name in readme, d.name
