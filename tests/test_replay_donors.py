"""Which target layers' K/V the drafter reads (llama.cpp's share rule, through the target's KV reuse)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtpscope.errors import LayoutError
from mtpscope.traces.run.target_prefill import donor_layers


def _target(path: Path, n: int, shared: int, pattern: list[int]) -> Path:
    from mtpscope.inspector.gguf import BOOL
    from mtpscope.inspector.gguf_write import array, u32, write_gguf

    return write_gguf(path, "gemma4", {"gemma4.block_count": u32(n), "gemma4.embedding_length": u32(64),
                                       "gemma4.attention.shared_kv_layers": u32(shared),
                                       "gemma4.attention.sliding_window_pattern": array(map(bool, pattern), BOOL)}, {})


def test_plain_target(tmp_path: Path) -> None:
    # 6 layers [s, s, f, s, s, f]: sliding donor n_layer-2 = 4, full donor n_layer-1 = 5
    assert donor_layers(_target(tmp_path / "a.gguf", 6, 0, [1, 1, 0, 1, 1, 0])) == {"sliding": 4, "full": 5}


def test_kv_shared_target_like_e2b(tmp_path: Path) -> None:
    # E2B: 35 layers (4 sliding : 1 full), the last 20 reuse caches -> 15 layers own K/V (0..14);
    # llama.cpp's reuse maps 33 -> 15 - 2 = 13 (sliding) and 34 -> 15 - 1 = 14 (full)
    p = _target(tmp_path / "e2b.gguf", 35, 20, [1, 1, 1, 1, 0] * 7)
    assert donor_layers(p) == {"sliding": 13, "full": 14}


def test_layer_types_that_break_the_rule(tmp_path: Path) -> None:
    with pytest.raises(LayoutError, match="n_layer-2 sliding"):
        donor_layers(_target(tmp_path / "b.gguf", 4, 0, [1, 0, 0, 0]))
