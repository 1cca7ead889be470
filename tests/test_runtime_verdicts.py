"""verify's errors and verdicts against what the real llama.cpp does with the same files (issue 16 §3).

Each file is run by the real MTP loop in a child process (tests/runtime_probe.py: llama.cpp through
traces.run.llama; a GGML abort kills only the child), and the test asserts both sides: the runtime's
exit signal and message, or its output, and the finding / verdict verify gives.

Files: the demo's tiny pair with the first 4096 real Gemma 4 tokens (tests/builders.py). The demo drafter's
attention is inert by construction (the target's ``attn_output`` is zero and the drafter reads little
of it), so for the RoPE and KV-donor rules the drafter gets random ``attn_q`` / ``attn_output``: its
first-step logits then depend on every rotation and on which cache it reads. "Drafts silently wrong"
is shown as: the run completes (exit 0) and the first draft step's logits differ from those of the
correct file on the same target and prompt. Same process, same build, same inputs: identical files give
bit-identical logits (checked below), so any difference above rounding (5 decimals) is the defect's.
"""

from __future__ import annotations

import dataclasses
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mtpscope.demo import build as demo
from mtpscope.errors import GGUFFormatError, PreflightRefusal, TensorDataError
from mtpscope.inspector.gguf import open_gguf
from mtpscope.inspector.gguf_write import f32, u32
from mtpscope.inspector.validate import verify
from mtpscope.traces.run.preflight import preflight
from tests.builders import DIMS, parts, write
from tests.runtime_probe import probe, probe_many

pytestmark = [pytest.mark.llama, pytest.mark.slow]


@pytest.fixture(scope="module", autouse=True)
def _needs_llama() -> None:
    pytest.importorskip("llama_cpp")


def _attentive(t: dict[str, Any]) -> None:
    rng = np.random.default_rng(7)
    for k, v in list(t.items()):
        if ".attn_q.weight" in k or ".attn_output.weight" in k:
            t[k] = (rng.standard_normal(v.shape) * 0.5).astype(v.dtype)


def _drafter(d: Path, name: str, fn: Any = None, attentive: bool = True) -> Path:
    arch, kv, t = parts("upstream")
    if attentive:
        _attentive(t)
    if fn is not None:
        fn(arch, kv, t)
    return write(d / f"{name}.gguf", arch, kv, t)


def _target(d: Path, name: str, swa: tuple[bool, ...] | None = None, shared: int = 0, fn: Any = None) -> Path:
    voc = demo.load_vocab("subset")
    dims = dataclasses.replace(DIMS, target_swa=swa) if swa else DIMS
    w = demo.target_weights(voc, dims, 0)
    kv = dict(demo._hparam_kv(demo.ARCH_TARGET, dims, target=True, n_vocab=voc.n_vocab) + list(voc.kv))
    kv["gemma4.attention.shared_kv_layers"] = u32(shared)
    for il in range(len(dims.target_swa) - shared, len(dims.target_swa)):
        for n in ("attn_k", "attn_v", "attn_k_norm"):
            w.pop(f"blk.{il}.{n}.weight", None)
    if fn is not None:
        fn(w)
    return write(d / f"t-{name}.gguf", demo.ARCH_TARGET, kv, w)


@pytest.fixture(scope="module")
def d(tmp_path_factory: Any) -> Path:
    return tmp_path_factory.mktemp("runtime")


@pytest.fixture(scope="module")
def target(d: Path) -> Path:
    return _target(d, "demo")


def _diff(a: list[float] | None, b: list[float] | None) -> float:
    assert a is not None and b is not None
    return float(np.abs(np.asarray(a) - np.asarray(b)).max())


# ------------------------------------------------------------------------------------- 1-D F16 / BF16


def test_vector_f16_bf16_loads_then_aborts_at_first_draft(d: Path, target: Path) -> None:
    def half(dtype: str) -> Any:
        def fn(arch: str, kv: dict, t: dict) -> None:
            import gguf

            for k, v in list(t.items()):
                if k.endswith("norm.weight"):
                    if dtype == "f16":
                        t[k] = v.astype(np.float16)
                    else:
                        q = gguf.GGMLQuantizationType.BF16
                        t[k] = (gguf.quants.quantize(v.astype(np.float32), q), q)
        return fn

    for dtype in ("f16", "bf16"):
        path = _drafter(d, f"norms-{dtype}", half(dtype), attentive=False)
        p = probe(target, path)
        assert p.stage == "prefill" and p.signal == "SIGABRT", (p.stage, p.stderr[-500:])  # died in the 1st draft
        msg = f"binary_op: unsupported types: dst: f32, src0: f32, src1: {dtype}"
        assert msg in p.stderr
        r = verify(path, target=target)
        errs = [f for f in r.errors if f.code == "E_DTYPE_VECTOR"]
        assert errs and all(f.actual == dtype.upper() for f in errs) and not r.ok
        up = r.loadability[0]
        assert up.loads is True and up.outcome == "aborts at first draft" and up.message == msg


def test_rope_freqs_f16_aborts_while_loading(d: Path, target: Path) -> None:
    path = _drafter(d, "rope-f16", lambda a, k, t: t.__setitem__("rope_freqs.weight",
                                                                 t["rope_freqs.weight"].clip(0, 6e4).astype(np.float16)),
                    attentive=False)
    p = probe(target, path)
    assert p.stage == "target_loaded" and p.signal == "SIGABRT"  # the drafter's load
    assert "GGML_ASSERT(c->type == GGML_TYPE_F32) failed" in p.stderr
    r = verify(path, target=target)
    assert "E_DTYPE_VECTOR" in {f.code for f in r.errors}
    up = r.loadability[0]
    assert up.loads is False and up.outcome == "aborts while loading"
    assert up.message == "GGML_ASSERT(c->type == GGML_TYPE_F32) failed"


@pytest.mark.parametrize(("suffix", "n_rot", "stage", "message", "loads", "outcome"), [
    # 66 full dims, more than twice the 32 rope_freqs factors: both load, the context's graph reservation aborts
    ("rope.dimension_count", 66, "loaded", "GGML_ASSERT(c->ne[0] >= n_dims / 2) failed", True,
     "aborts creating a context"),
    ("rope.dimension_count", 63, "prefill", "GGML_ASSERT(n_dims % 2 == 0) failed", True, "aborts at first draft"),
    # 34 dims of the sliding layers' 32-dim heads (they have no rope_freqs)
    ("rope.dimension_count_swa", 34, "prefill", "GGML_ASSERT(n_dims <= ne0) failed", True, "aborts at first draft"),
])
def test_rope_dims_ggml_cannot_rotate_by_abort(d: Path, target: Path, suffix: str, n_rot: int, stage: str,
                                               message: str, loads: bool, outcome: str) -> None:
    """rope.dimension_count(_swa) odd or above what the head (or rope_freqs) holds: the real llama.cpp aborts where the
    verdict says (it said 'loads'), and verify has the E_KEY_VALUE."""
    path = _drafter(d, f"rot-{suffix}-{n_rot}", lambda a, k, t: k.__setitem__(f"{a}.{suffix}", u32(n_rot)),
                    attentive=False)
    p = probe(target, path)
    assert p.stage == stage and p.signal == "SIGABRT", (p.stage, p.stderr[-500:])
    assert message in p.stderr
    r = verify(path, target=target)
    assert [f.actual for f in r.errors if f.code == "E_KEY_VALUE"] == [n_rot] and not r.ok
    up = r.loadability[0]
    assert (up.loads, up.outcome, up.message) == (loads, outcome, message)
    with pytest.raises(PreflightRefusal) as e:       # record refuses it before llama.cpp starts (it ran and aborted)
        preflight(target, path)
    assert (e.value.key, e.value.actual) == ("loadability", outcome)


# ------------------------------------------------------------------------ silently wrong drafts


def test_rope_and_donor_defects_run_and_draft_differently(d: Path, target: Path) -> None:
    """One child for all the files that llama.cpp runs to the end."""
    def rope(values: Any) -> Any:
        return lambda a, k, t: t.__setitem__("rope_freqs.weight", np.asarray(values(t["rope_freqs.weight"]),
                                                                             np.float32))

    n = 32  # rope_freqs entries: head_dim_full 64 / 2; 8 rotated
    files = {
        "clean": _drafter(d, "clean"),
        "clean-again": _drafter(d, "clean-again"),
        "rope-ones": _drafter(d, "rope-ones", rope(lambda r: np.ones_like(r))),
        "rope-16-rotated": _drafter(d, "rope-16", rope(lambda r: [1.0] * 16 + [1e30] * (n - 16))),
        "no-freq-base": _drafter(d, "no-freq-base", lambda a, k, t: k.pop(a + ".rope.freq_base")),
        "no-freq-base-swa": _drafter(d, "no-freq-base-swa", lambda a, k, t: k.pop(a + ".rope.freq_base_swa")),
        "base-swa-5e4": _drafter(d, "base-swa-5e4", lambda a, k, t: k.__setitem__(
            a + ".rope.freq_base_swa", f32(5e4))),
        "window-16": _drafter(d, "window-16", lambda a, k, t: k.__setitem__(
            a + ".attention.sliding_window", u32(16))),
    }
    # a target whose llama.cpp donors are not a sliding and a full layer: [s, s, s, s, f, f]: HF's sliding
    # donor is layer 3, llama.cpp's is n_layer - 2 = 4, a full layer, which is not in the target's sliding
    # cache: the share lookup (src/llama-kv-cache.cpp, map_layer_ids[il_share], an unordered_map) then
    # yields that cache's first layer, 0. The target's attn_output is zero, so changing a layer's attn_k
    # changes only what sits in that layer's KV cache, not the target's own hidden state.
    swa = (True, True, True, True, False, False)

    def scale_k(il: int) -> Any:  # new K directions (a plain scale would vanish in attn_k_norm)
        def fn(w: dict) -> None:
            k = w[f"blk.{il}.attn_k.weight"]
            w[f"blk.{il}.attn_k.weight"] = k + np.random.default_rng(il).standard_normal(k.shape).astype(k.dtype)
        return fn

    donors = {"base": _target(d, "ff", swa), "hf-donor-changed": _target(d, "ff-k3", swa, fn=scale_k(3)),
              "layer-4-changed": _target(d, "ff-k4", swa, fn=scale_k(4)),
              "layer-0-changed": _target(d, "ff-k0", swa, fn=scale_k(0))}
    pairs = [(target, p) for p in files.values()] + [(t, files["clean"]) for t in donors.values()]
    res = probe_many(pairs)
    assert all(r.stage == "done" and r.returncode == 0 for r in res), [(r.stage, r.stderr[-300:]) for r in res]
    got = dict(zip([*files, *(f"target:{k}" for k in donors)], res))
    clean = got["clean"].first_logits
    assert _diff(got["clean-again"].first_logits, clean) == 0.0  # the comparison's noise floor
    for name in ("rope-ones", "rope-16-rotated", "no-freq-base", "base-swa-5e4"):
        assert _diff(got[name].first_logits, clean) > 1e-3, name  # runs, computes something else
    # llama.cpp's default freq_base_swa (10000) is Gemma 4's value: no difference, so it stays a warning
    assert _diff(got["no-freq-base-swa"].first_logits, clean) == 0.0
    # the drafter masks with its own window, as HF does: different logits, kept a warning (W_PAIR_WINDOW)
    assert _diff(got["window-16"].first_logits, clean) > 1e-3
    # KV donors: llama.cpp never reads HF's sliding donor (layer 3), nor its nominal one (4): it reads layer 0
    base = got["target:base"].first_logits
    assert _diff(got["target:hf-donor-changed"].first_logits, base) == 0.0
    assert _diff(got["target:layer-4-changed"].first_logits, base) == 0.0
    assert _diff(got["target:layer-0-changed"].first_logits, base) > 1e-3

    def codes(path: Path, t: Path = target) -> dict[str, str]:
        return {f.code: f.severity for f in verify(path, target=t).findings}

    assert "error" not in codes(files["clean"]).values()
    assert codes(files["rope-ones"])["E_ROPE_FREQS_VALUES"] == "error"
    f = next(x for x in verify(files["rope-16-rotated"], target=target).findings if x.code == "E_ROPE_FREQS_VALUES")
    assert f.expected == {"pair": 8, "value": float(np.float32(1e30))} and f.actual == {"pair": 8, "value": 1.0}
    assert codes(files["no-freq-base"])["E_KEY_MISSING"] == "error"
    assert codes(files["no-freq-base-swa"])["W_KEY_MISSING"] == "warning"
    assert codes(files["base-swa-5e4"])["E_PAIR_ROPE"] == "error"
    assert codes(files["window-16"])["W_PAIR_WINDOW"] == "warning"
    assert codes(files["clean"], donors["base"])["E_PAIR_KV_DONOR"] == "error"


# ------------------------------------------------------------------------------ target shared KV


def test_shared_kv_layout_aborts_creating_a_context(d: Path) -> None:
    drafter = _drafter(d, "plain", attentive=False)
    ok = _target(d, "shared-ok", (True, True, False, True, True, False, True, True, False), shared=3)
    # shared layers start at 6; sliding ones reuse layer 4 and full ones layer 5: here 4 is full, 5 sliding
    bad = _target(d, "shared-bad", (True, True, True, True, False, True, True, True, False), shared=3)
    res = probe_many([(ok, drafter), (bad, drafter)])
    assert res[0].stage == "done"
    assert res[1].stage == "loaded" and res[1].signal == "SIGABRT"
    msg = "GGML_ASSERT(map_layer_ids.find(il_reuse) != map_layer_ids.end()) failed"
    assert msg in res[1].stderr
    assert "E_SHARED_KV_LAYOUT" not in {f.code for f in verify(ok).findings}
    r = verify(bad)
    f = next(x for x in r.errors if x.code == "E_SHARED_KV_LAYOUT")
    assert f.expected == "layer 4 sliding" and f.actual == "layer 4 full"
    up = r.loadability[0]
    assert up.loads is True and up.outcome == "aborts creating a context" and up.message == msg


# ------------------------------------------------------------------------- GGUF parser refusals

_LOAD = r"""
import sys
import llama_cpp
llama_cpp.llama_backend_init()
p = llama_cpp.llama_model_default_params()
m = llama_cpp.llama_model_load_from_file(sys.argv[1].encode(), p)
print("LOADED" if m else "REFUSED", flush=True)
"""


def _gguf(kvs: list[tuple[str, int]], names: list[str], offsets: list[int] | None = None) -> bytes:
    """A tiny GGUF by hand (ggml/docs/gguf.md): UINT32 pairs, F32 tensors of ne [32] (128 bytes) at ``offsets``
    in the data section (default packed: 0, 128, ...)."""
    def s(x: str) -> bytes:
        b = x.encode()
        return struct.pack("<Q", len(b)) + b

    offsets = offsets if offsets is not None else [128 * i for i in range(len(names))]
    out = b"GGUF" + struct.pack("<IQQ", 3, len(names), len(kvs))
    for k, v in kvs:
        out += s(k) + struct.pack("<II", 4, v)
    for n, off in zip(names, offsets, strict=True):
        out += s(n) + struct.pack("<IQIQ", 1, 32, 0, off)
    out += b"\0" * (-len(out) % 32) + b"\0" * (max(offsets, default=-128) + 128)
    return out


_CASES = {"empty_key": ([("general.alignment", 32), ("", 1)], [], None),
          "long_name": ([("general.alignment", 32)], ["x" * 64], None),
          # a gap between two tensors (what a type changed without moving the data leaves), and two tensors
          # stored in the other order than the table lists them: both fine by the GGUF format's own rules
          # (gguf-py reads them), both refused by llama.cpp's parser
          "gap": ([("general.alignment", 32)], ["a", "b"], [0, 160]),
          "order": ([("general.alignment", 32)], ["a", "b"], [128, 0])}


@pytest.mark.parametrize("case, phrase", [("empty_key", "key 1 is empty"),
                                          ("long_name", "tensor name 0 is too long: 64 >= 64"),
                                          ("gap", "tensor 'b' has offset 160, expected 128"),
                                          ("order", "tensor 'a' has offset 128, expected 0")])
def test_gguf_refusals_named_like_llama_cpp(tmp_path: Path, case: str, phrase: str) -> None:
    data = _gguf(*_CASES[case])
    path = tmp_path / f"{case}.gguf"
    path.write_bytes(data)
    proc = subprocess.run([sys.executable, "-c", _LOAD, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "REFUSED" and phrase in proc.stderr
    with pytest.raises((GGUFFormatError, TensorDataError)) as e:
        open_gguf(path)
    assert phrase in e.value.one_line()
    ok = tmp_path / "ok.gguf"  # the limit itself: a 63-byte name is read by both
    ok.write_bytes(_gguf([("general.alignment", 32)], ["x" * 63]))
    assert open_gguf(ok).tensors[0].name == "x" * 63
