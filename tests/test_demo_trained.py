"""The trained demo pair's build helpers (mtpscope.demo.trained), without torch: row expansion, the
buggy RoPE-base copy, per-category bookkeeping, and the committed data's integrity."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mtpscope.demo import trained as dtr
from mtpscope.errors import MtpscopeError


def test_expand_rows_places_kept_rare_and_zero_rows() -> None:
    compact = np.arange(5 * 3, dtype=np.float16).reshape(5, 3) + 1   # 4 kept rows + the shared rare row
    ids = np.array([0, 2, 7, 9])
    rare = np.array([3, 11])
    full = dtr.expand_rows(compact, ids, rare, n_vocab=16)
    assert full.shape == (16, 3) and full.dtype == np.float16
    for i, r in enumerate(ids):
        assert np.array_equal(full[r], compact[i])
    for r in rare:
        assert np.array_equal(full[r], compact[4])
    others = sorted(set(range(16)) - set(ids.tolist()) - set(rare.tolist()))
    assert not full[others].any()
    with pytest.raises(MtpscopeError):
        dtr.expand_rows(compact[:4], ids, rare, n_vocab=16)


def test_worst_prompt_is_the_worst_categorys_worst() -> None:
    rows = [{"prompt_id": 0, "category": "code", "n_drafted": 10, "n_accepted": 9, "acceptance_rate": 0.9},
            {"prompt_id": 1, "category": "code", "n_drafted": 10, "n_accepted": 1, "acceptance_rate": 0.1},
            {"prompt_id": 2, "category": "random", "n_drafted": 10, "n_accepted": 3, "acceptance_rate": 0.3},
            {"prompt_id": 3, "category": "random", "n_drafted": 10, "n_accepted": 2, "acceptance_rate": 0.2}]
    cats = dtr.by_category(rows)
    assert cats["code"]["acceptance_rate"] == 0.5 and cats["random"]["acceptance_rate"] == 0.25
    # prompt 1 is the single worst prompt, but the worst *category* is random
    assert dtr.worst_prompt(rows) == ("random", 3)


def test_buggy_copy_changes_only_the_sliding_rope_base(tmp_path) -> None:
    from mtpscope.errors import LayoutError
    from mtpscope.inspector.gguf import open_gguf
    from mtpscope.inspector.gguf_write import f32, string, u32, write_gguf

    src = tmp_path / "d.gguf"
    rf = np.array([1.0, 1.0, 1e30, 1e30], dtype=np.float32)
    kv = [("gemma4-assistant.rope.freq_base", f32(1e6)), ("gemma4-assistant.rope.freq_base_swa", f32(1e4)),
          ("x.y", u32(1)), ("x.s", string("s"))]
    write_gguf(src, "gemma4-assistant", kv, {"rope_freqs.weight": rf})
    out = dtr.write_buggy_swa_base(src, tmp_path / "b.gguf")
    with open_gguf(src) as a, open_gguf(out) as b:
        va = {k: v.value for k, v in a.kv.items()}
        vb = {k: v.value for k, v in b.kv.items()}
        assert va["gemma4-assistant.rope.freq_base_swa"] == 1e4
        assert vb["gemma4-assistant.rope.freq_base_swa"] == 1e6      # the full layers' base
        assert {k: v for k, v in va.items() if not k.endswith("freq_base_swa")} == \
               {k: v for k, v in vb.items() if not k.endswith("freq_base_swa")}
        assert np.array_equal(b.tensor_data("rope_freqs.weight"), rf)
    assert src.read_bytes() != out.read_bytes() and src.stat().st_size == out.stat().st_size
    # only an upstream drafter with both bases
    write_gguf(tmp_path / "t.gguf", "gemma4", kv, {"rope_freqs.weight": rf})
    with pytest.raises(LayoutError):
        dtr.write_buggy_swa_base(tmp_path / "t.gguf", tmp_path / "t2.gguf")
    write_gguf(tmp_path / "n.gguf", "gemma4-assistant", kv[2:], {"rope_freqs.weight": rf})
    with pytest.raises(LayoutError):
        dtr.write_buggy_swa_base(tmp_path / "n.gguf", tmp_path / "n2.gguf")


def test_committed_data_matches_its_recipe() -> None:
    """The compact checkpoints in the package are the ones recipe.json hashed, with a categorised prompt
    set (>= 5 prompts per category, BOS-first real ids)."""
    if not (dtr.DATA_DIR / "recipe.json").exists():
        pytest.skip("no trained demo data in this checkout")
    rec = dtr.read_recipe()
    assert set(rec["files"]) >= {"target.safetensors", "drafter.safetensors", "ids.safetensors", "prompts.json"}
    prompts = dtr.read_prompts()
    cats: dict[str, int] = {}
    for p in prompts:
        cats[p["category"]] = cats.get(p["category"], 0) + 1
        assert p["ids"][0] == 2 and all(0 <= i < dtr.N_VOCAB for i in p["ids"])
    assert set(cats) == {"code", "prose", "json", "numbers", "chat", "random"}
    assert min(cats.values()) >= 5
    assert json.loads((dtr.DATA_DIR / "drafter.json").read_text())["text_config"]["vocab_size"] == dtr.N_VOCAB
