"""The real-geometry benchmark pair (issue 26): seeded random weights at the published shapes, written once
into ``<cache>/bench-real/`` (never in git).

* **Drafter**: the 26B-A4B assistant at its published geometry (``sample_configs/
  gemma-4-26B-A4B-it-assistant``: 4 layers sliding x 3 + full, n_embd 1024, 16 heads, KV heads 8 / 2,
  head dims 256 / 512, n_ff 8192, the dense 262144-row head tied to ``token_embd``, ``embedding_length_out``
  2816), upstream dialect (``gemma4-assistant``), quantized to Q8_0 by llama.cpp.
* **Target**: the 26B-A4B hyperparameters as the real tokenizer GGUF in the cache carries them (its
  ``gemma4.*`` keys: n_embd 2816, 16 heads, KV heads 8 / 2 sliding / full, head dims 256 / 512, window 1024,
  dense FFN 2112 beside 128 experts with 8 used, expert FFN 704, softcap 30), cut to ``n_layer`` blocks
  (default 2: one sliding, one full; K = V on the full one), quantized to Q4_0 by llama.cpp.
* **Centroid head**: an HF-style folder (``masked_embedding.centroids.weight`` 2048 x 1024,
  ``masked_embedding.token_ordering`` a seeded permutation of the vocabulary, top-k 32), for ``--centroids``.

The tensor lists come from :mod:`mtpscope.inspector.layouts` (the loader's lists per dialect; MoE names
checked against llama.cpp's ``src/models/gemma4.cpp``), the files from :mod:`mtpscope.inspector.gguf_write`
(F16 matrices, F32 vectors, big matrices streamed from memmaps so the builder never holds them) and the
quantization from :func:`mtpscope.traces.run.llama.model.quantize` (``llama_model_quantize``). Sizes at
the default 2 target layers: target Q4_0 about 1.4 GB, drafter Q8_0 about 0.4 GB (the F16 intermediates,
about 5 GB, are deleted).

Weights: ``N(0, 1/fan_in)`` matrices (unit-scale activations), norms ``1 + 0.05 N(0, 1)``, layer scales 1,
``rope_freqs`` the proportional-RoPE values. Acceptance is not the point (the drafter is random); shapes are.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.cache import cache_dir, vocab_path
from mtpscope.inspector.gguf import BOOL, open_gguf
from mtpscope.inspector.gguf_write import MetaValue, array, f32, string, u32, write_gguf
from mtpscope.inspector.layouts import (
    ExpectedTensor,
    expected_drafter_layout,
    expected_rope_freqs,
    expected_target_layout,
    read_hparams,
)
from mtpscope.inspector.tokenizer import tokenizer_kv

SAMPLE = Path(__file__).resolve().parents[1] / "sample_configs" / "gemma-4-26B-A4B-it-assistant" / "config.json"
#: bump when the pair's construction changes (the cached files are rebuilt)
VERSION = 1
TARGET_TYPE, DRAFTER_TYPE = "Q4_0", "Q8_0"
N_CENTROIDS, CENTROID_TOP_K = 2048, 32
#: optional target tensors the pair carries (26B-A4B as converted: separate gate / up experts, router scale,
#: per-expert down scale, layer output scale); attn_v only on sliding layers (K = V on full ones)
TARGET_OPTIONAL = ("layer_output_scale.weight", "ffn_gate_inp.weight", "ffn_gate_inp.scale", "pre_ffw_norm_2.weight",
                   "post_ffw_norm_1.weight", "post_ffw_norm_2.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight",
                   "ffn_down_exps.weight", "ffn_down_exps.scale")


@dataclass(frozen=True)
class RealPair:
    """The pair's files: ``target`` / ``assistant`` GGUFs, the ``centroids`` folder (HF layout), and the
    folder they live in."""

    folder: Path
    target: Path
    assistant: Path
    centroids: Path


class _KV:
    """A key/value list seen as a GGUF by :func:`read_hparams` (``architecture``, ``get``, ``tensors``)."""

    def __init__(self, arch: str, kv: list[tuple[str, MetaValue]]) -> None:
        self.architecture, self.tensors = arch, ()
        self._d = {k: v.value for k, v in kv}

    def get(self, key: str, default: Any = None) -> Any:
        v = self._d.get(key, default)
        return v.tolist() if isinstance(v, np.ndarray) else v


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def _tensor(e: ExpectedTensor, seed: int, tmp: Path, n_embd: int, rope: np.ndarray) -> Any:
    """One tensor of ``e``'s ``ne``: a vector in F32, a matrix in F16 (a memmap under ``tmp`` when large)."""
    shape = tuple(reversed(e.ne))        # numpy order
    rng = _rng(seed, e.name)
    if e.name.endswith("rope_freqs.weight"):
        return rope.astype(np.float32)
    if len(shape) == 1:
        if "scale" in e.name:
            return np.ones(shape, np.float32)
        return (1.0 + 0.05 * rng.standard_normal(shape)).astype(np.float32)
    fan_in = shape[-1]
    std = 1.0 / np.sqrt(n_embd if e.name == "token_embd.weight" else fan_in)
    n = int(np.prod(shape))
    if n < (1 << 24):
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float16)
    mm = np.lib.format.open_memmap(tmp / (e.name + ".npy"), mode="w+", dtype=np.float16, shape=shape)
    flat = mm.reshape(-1)
    step = 1 << 24
    for i in range(0, n, step):
        k = min(step, n - i)
        flat[i:i + k] = rng.standard_normal(k, dtype=np.float32) * std
    mm.flush()
    return mm


def _write(path: Path, arch: str, kv: list[tuple[str, MetaValue]], layout: tuple[ExpectedTensor, ...], seed: int,
           n_embd: int, rope: np.ndarray) -> None:
    with tempfile.TemporaryDirectory(dir=path.parent) as td:
        tensors = {e.name: _tensor(e, seed, Path(td), n_embd, rope) for e in layout}
        write_gguf(path, arch, kv, tensors)


def _arch_keys(arch: str, src: dict[str, Any], swa: list[bool], head_count_kv: list[int]) -> list[tuple[str, MetaValue]]:
    a = arch + "."
    kv = [(a + "context_length", u32(src["context_length"])), (a + "embedding_length", u32(src["embedding_length"])),
          (a + "block_count", u32(len(swa))), (a + "feed_forward_length", u32(src["feed_forward_length"])),
          (a + "attention.head_count", u32(src["head_count"])),
          (a + "attention.head_count_kv", array(np.array(head_count_kv, np.int32), 5)),  # INT32, as the real file
          (a + "attention.key_length", u32(src["key_length"])), (a + "attention.value_length", u32(src["key_length"])),
          (a + "attention.key_length_swa", u32(src["key_length_swa"])),
          (a + "attention.value_length_swa", u32(src["key_length_swa"])),
          (a + "attention.sliding_window", u32(src["sliding_window"])),
          (a + "attention.sliding_window_pattern", array(swa, BOOL)),
          (a + "attention.layer_norm_rms_epsilon", f32(src["eps"])), (a + "attention.shared_kv_layers", u32(0)),
          (a + "rope.freq_base", f32(src["freq_base"])), (a + "rope.freq_base_swa", f32(src["freq_base_swa"])),
          (a + "rope.dimension_count", u32(src["key_length"])),
          (a + "rope.dimension_count_swa", u32(src["key_length_swa"]))]
    return kv


def _source_hparams() -> dict[str, Any]:
    """The 26B-A4B target's keys from the real tokenizer GGUF (``gemma4.*``)."""
    with open_gguf(vocab_path()) as f:
        def g(k: str) -> Any:
            return f.get("gemma4." + k)

        hkv = list(g("attention.head_count_kv").to_numpy())
        pattern = [bool(x) for x in g("attention.sliding_window_pattern").to_list()]
        return {"context_length": int(g("context_length")), "embedding_length": int(g("embedding_length")),
                "feed_forward_length": int(g("feed_forward_length")), "head_count": int(g("attention.head_count")),
                "kv_sliding": int(hkv[pattern.index(True)]), "kv_full": int(hkv[pattern.index(False)]),
                "key_length": int(g("attention.key_length")), "key_length_swa": int(g("attention.key_length_swa")),
                "sliding_window": int(g("attention.sliding_window")),
                "eps": float(g("attention.layer_norm_rms_epsilon")), "freq_base": float(g("rope.freq_base")),
                "freq_base_swa": float(g("rope.freq_base_swa")), "expert_count": int(g("expert_count")),
                "expert_used_count": int(g("expert_used_count")),
                "expert_feed_forward_length": int(g("expert_feed_forward_length")),
                "softcap": float(g("final_logit_softcapping"))}


def target_kv(src: dict[str, Any], n_layer: int) -> list[tuple[str, MetaValue]]:
    """The target's ``gemma4.*`` keys: the source's, cut to ``n_layer`` blocks (sliding first, the last full)."""
    swa = [True] * (n_layer - 1) + [False]
    hkv = [src["kv_sliding"] if s else src["kv_full"] for s in swa]
    kv = _arch_keys("gemma4", src, swa, hkv)
    kv += [("gemma4.expert_count", u32(src["expert_count"])), ("gemma4.expert_used_count", u32(src["expert_used_count"])),
           ("gemma4.expert_feed_forward_length", u32(src["expert_feed_forward_length"])),
           ("gemma4.embedding_length_per_layer_input", u32(0)),
           ("gemma4.final_logit_softcapping", f32(src["softcap"]))]
    return kv


def drafter_kv(src: dict[str, Any], cfg: dict[str, Any]) -> list[tuple[str, MetaValue]]:
    """The drafter's ``gemma4-assistant.*`` keys from the published config (its geometry) and the target's
    RoPE / window / eps keys."""
    tc = cfg["text_config"]
    swa = [t == "sliding_attention" for t in tc["layer_types"]]
    hkv = [tc["num_key_value_heads"] if s else tc["num_global_key_value_heads"] for s in swa]
    d = dict(src, embedding_length=tc["hidden_size"], feed_forward_length=tc["intermediate_size"],
             head_count=tc["num_attention_heads"], key_length=tc["global_head_dim"], key_length_swa=tc["head_dim"],
             sliding_window=tc["sliding_window"], eps=tc["rms_norm_eps"])
    kv = _arch_keys("gemma4-assistant", d, swa, hkv)
    kv += [("gemma4-assistant.embedding_length_out", u32(cfg["backbone_hidden_size"])),
           ("gemma4-assistant.nextn_predict_layers", u32(len(swa)))]
    return kv


def _target_layout(kv: list[tuple[str, MetaValue]]) -> tuple[ExpectedTensor, ...]:
    hp = read_hparams(_KV("gemma4", kv + [("tokenizer.ggml.tokens", MetaValue(9, [b""] * 262144, 8))]))
    out = []
    for e in expected_target_layout(hp, k_eq_v=True):
        sliding = e.layer is not None and hp.layers[e.layer].sliding
        if e.required or e.name.endswith(TARGET_OPTIONAL) or (e.name.endswith("attn_v.weight") and sliding):
            out.append(e)
    return tuple(out)


def _drafter_layout(kv: list[tuple[str, MetaValue]]) -> tuple[ExpectedTensor, ...]:
    hp = read_hparams(_KV("gemma4-assistant", kv + [("tokenizer.ggml.tokens", MetaValue(9, [b""] * 262144, 8))]))
    return tuple(e for e in expected_drafter_layout(hp, "upstream") if e.required)


def build_pair(n_layer: int = 2, *, seed: int = 0, log: Any = print) -> RealPair:
    """Write the pair into ``<cache>/bench-real/L<n_layer>-v<VERSION>/`` once; later calls return it.

    Raises:
        MtpscopeError: the real tokenizer GGUF cannot be fetched; TraceError: llama.cpp's quantizer failed.
    """
    from mtpscope.inspector.safetensors import write_safetensors
    from mtpscope.traces.run.llama.model import quantize

    folder = cache_dir() / "bench-real" / f"L{n_layer}-v{VERSION}"
    pair = RealPair(folder, folder / f"target-{TARGET_TYPE}.gguf", folder / f"drafter-{DRAFTER_TYPE}.gguf",
                    folder / "centroids")
    if pair.target.exists() and pair.assistant.exists() and (pair.centroids / "config.json").exists():
        return pair
    folder.mkdir(parents=True, exist_ok=True)
    src = _source_hparams()
    cfg = json.loads(SAMPLE.read_text())
    tok = list(tokenizer_kv(vocab_path()))
    rope = expected_rope_freqs(src["key_length"])

    def general(name: str) -> list[tuple[str, Any]]:
        return [("general.name", string(name)), ("general.file_type", u32(1))]

    for path, arch, kv, layout, qtype, n_embd in (
            (pair.assistant, "gemma4-assistant", drafter_kv(src, cfg), None, DRAFTER_TYPE,
             cfg["text_config"]["hidden_size"]),
            (pair.target, "gemma4", target_kv(src, n_layer), None, TARGET_TYPE, src["embedding_length"])):
        if path.exists():
            continue
        layout = _drafter_layout(kv) if arch != "gemma4" else _target_layout(kv)
        f16 = path.with_name(path.stem + "-F16.gguf")
        t0 = time.perf_counter()
        _write(f16, arch, general(f"mtpscope-bench-real-{arch}") + kv + tok, layout, seed, n_embd, rope)
        t1 = time.perf_counter()
        quantize(f16, path.with_name(path.name + ".tmp"), qtype)
        os.replace(path.with_name(path.name + ".tmp"), path)
        log(f"wrote {path.name}: {path.stat().st_size / 2**30:.2f} GiB (F16 {f16.stat().st_size / 2**30:.2f} GiB "
            f"in {t1 - t0:.0f} s, quantized to {qtype} in {time.perf_counter() - t1:.0f} s)")
        f16.unlink()
    if not (pair.centroids / "config.json").exists():
        tmp = folder / "centroids.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        n_embd = cfg["text_config"]["hidden_size"]
        cent = (_rng(seed, "centroids").standard_normal((N_CENTROIDS, n_embd)) / np.sqrt(n_embd)).astype(np.float32)
        order = _rng(seed, "ordering").permutation(262144).astype(np.int64)
        write_safetensors(tmp / "model.safetensors", {"masked_embedding.centroids.weight": cent,
                                                      "masked_embedding.token_ordering": order})
        (tmp / "config.json").write_text(json.dumps({"model_type": "gemma4_assistant",
                                                     "centroid_intermediate_top_k": CENTROID_TOP_K,
                                                     "num_centroids": N_CENTROIDS}))
        shutil.rmtree(pair.centroids, ignore_errors=True)
        os.replace(tmp, pair.centroids)
    return pair


def main() -> int:
    p = build_pair()
    print(json.dumps({k: os.fspath(v) for k, v in p.__dict__.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["RealPair", "build_pair", "drafter_kv", "target_kv"]
