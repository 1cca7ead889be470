"""llama.cpp's own quantizer through the binding (traces.run.llama.model.quantize): the file it writes, read with
gguf-py (an independent reader), has its weight matrices in the asked type and its vectors in F32, dequantizes
to the source within the type's rounding, and llama.cpp loads it; a bad type or file is one clear error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from mtpscope.errors import TraceError
from mtpscope.traces.run.llama import model as lm

pytestmark = pytest.mark.llama


def test_quantize_to_q8_0(tiny_pair, tmp_path: Path) -> None:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    _, drafter = tiny_pair(vocab="subset", noise=1.0)
    out = lm.quantize(drafter, tmp_path / "q8.gguf", "Q8_0", pure=True)
    src, got = GGUFReader(str(drafter)), GGUFReader(str(out))
    s_t, g_t = {t.name: t for t in src.tensors}, {t.name: t for t in got.tensors}
    assert set(s_t) == set(g_t)
    for name, t in g_t.items():
        if len(t.shape) == 1 or t.shape[0] % 32:
            assert t.tensor_type.name == "F32", name        # 1-D tensors (norms, scales) stay F32
            continue
        assert t.tensor_type.name == "Q8_0", name
        want = np.asarray(s_t[name].data, dtype=np.float32).reshape(-1, int(t.shape[0]))
        back = dequantize(t.data, t.tensor_type).reshape(want.shape)
        # Q8_0: per block of 32, d = amax / 127 (stored F16), q = round(x / d): |x - q d| <= d/2 + 127 |d - f16(d)|
        amax = np.abs(want.reshape(-1, 32)).max(axis=1, keepdims=True)
        bound = (amax / 127) * (0.5 + 127 * 2.0 ** -11) + 1e-12
        assert (np.abs(back.reshape(-1, 32) - want.reshape(-1, 32)) <= bound).all(), name
    m = lm.LlamaModel(out)
    try:
        assert m.n_embd == 128 and m.model_size < Path(drafter).stat().st_size
    finally:
        m.close()


def test_bad_type_and_bad_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="unknown llama.cpp quantization type") as ei:
        lm.quantize(tmp_path / "a.gguf", tmp_path / "b.gguf", "Q3_K_XL")
    assert ei.value.key == "type"
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(TraceError, match="refused to quantize"):
        lm.quantize(bad, tmp_path / "b.gguf", "Q8_0")
