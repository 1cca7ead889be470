"""What differs between two runs (traces.analysis.run_diff): parameters and, per model role, GGUF metadata and
tensor-table changes, on files written here with known differences."""

from __future__ import annotations

import numpy as np

from mtpscope.inspector.gguf_write import f32, u32, write_gguf
from mtpscope.traces.analysis.run_diff import DifferenceRow, difference_rows, run_differences


def _gguf(path, swa_base: float, norm_dtype=np.float32) -> str:
    write_gguf(path, "gemma4-assistant",
               [("gemma4-assistant.rope.freq_base", f32(1e6)), ("gemma4-assistant.rope.freq_base_swa", f32(swa_base)),
                ("gemma4-assistant.block_count", u32(4))],
               {"blk.0.attn_norm.weight": np.ones(8, dtype=norm_dtype), "rope_freqs.weight": np.ones(4, np.float32)})
    return str(path)


def _man(assistant: str, sha: str, **params) -> dict:
    return {"params": {"n_draft": 3, "max_tokens": 64, **params},
            "models": {"target": {"path": "/nowhere/t.gguf", "header_sha256": "T"},
                       "assistant": {"path": assistant, "header_sha256": sha}}}


def test_a_changed_rope_base_and_tensor_type_are_named(tmp_path) -> None:
    a = _gguf(tmp_path / "a.gguf", 1e4)
    b = _gguf(tmp_path / "b.gguf", 1e6, norm_dtype=np.float16)
    d = run_differences(_man(a, "A"), _man(b, "B", max_tokens=32))
    assert d.params == (("max_tokens", 64, 32),)
    (m,) = d.models                      # the target's header hash is the same: not listed
    assert m.role == "assistant" and m.note is None
    assert m.keys == (("gemma4-assistant.rope.freq_base_swa", 1e4, 1e6),)
    assert m.tensors == (("blk.0.attn_norm.weight", "F32 [8]", "F16 [8]"),)
    rows = difference_rows(d)
    assert {"what": "drafter metadata", "name": "gemma4-assistant.rope.freq_base_swa", "A": "10000.0",
            "B": "1000000.0"} in [r.to_dict() for r in rows]
    assert DifferenceRow("drafter metadata", "gemma4-assistant.rope.freq_base_swa", "10000.0", "1000000.0") in rows
    assert not d.none


def test_same_header_hash_is_no_difference_and_missing_files_are_a_note(tmp_path) -> None:
    a = _gguf(tmp_path / "a.gguf", 1e4)
    assert run_differences(_man(a, "A"), _man(a, "A")).none
    d = run_differences(_man(a, "A"), _man(str(tmp_path / "gone.gguf"), "B"))
    assert d.models[0].note == "a recorded file is gone: not compared" and not d.models[0].keys
    # a malformed manifest: absent, not an error
    assert run_differences({"params": "x", "models": []}, {}).none


def test_files_the_caller_may_not_read_are_not_opened(tmp_path) -> None:
    a = _gguf(tmp_path / "a.gguf", 1e4)
    b = _gguf(tmp_path / "b.gguf", 1e6)
    d = run_differences(_man(a, "A"), _man(b, "B"), readable=lambda p: p == a)
    assert d.models[0].note == "outside the allowed folders: not compared" and not d.models[0].keys
