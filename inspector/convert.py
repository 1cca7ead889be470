"""Convert a Hugging Face Gemma 4 checkpoint (safetensors) to a GGUF, through gguf-py's writer.

* ``Gemma4AssistantForCausalLM`` (``model_type: gemma4_assistant``) -> a drafter GGUF in the
  **upstream** dialect (arch ``gemma4-assistant``, ``nextn.*`` projections, ``embedding_length_out``,
  ``nextn_predict_layers``; no centroid head, which llama.cpp refuses, facts §1) or the **fork**
  dialect (arch ``gemma4_assistant``, ``mtp.*`` projections, ``n_embd_backbone``, the fork's centroid
  keys and ``mtp.centroids.weight`` / ``mtp.token_ordering.weight``). For upstream the centroid head can
  go to a **sidecar** GGUF (``centroids_out``): arch ``gemma4-assistant-centroids`` with
  ``mtp.centroids.weight`` (``ne [n_embd, n_centroids]``), ``mtp.token_ordering.weight`` (I32,
  ``ne [n_vocab]``) and the keys ``gemma4-assistant-centroids.{n_centroids, centroid_top_k,
  embedding_length, vocab_size}`` (what ``inspector.centroids.load_centroid_head`` and so
  ``record --centroids`` read).
* ``Gemma4ForCausalLM`` (``model_type: gemma4_text`` or ``gemma4`` with a text config) -> a ``gemma4``
  target GGUF of any published family (dense, K = V, per-layer embeddings with KV-shared layers, MoE):
  :mod:`inspector.convert_target`.

Names: :mod:`inspector.hf_names` (the one mapping). An HF ``Linear`` weight of numpy shape ``(out, in)`` is
written as-is: GGUF ``ne [in, out]``, what llama.cpp's loader expects.
Proportional RoPE of full layers becomes ``rope_freqs.weight`` (``(head_dim/2,)``: 1.0 for the
``partial_rotary_factor`` share of pairs, 1e30 for the rest), as llama.cpp's converter does.

The tokenizer is not converted: ``tokenizer.*`` keys are copied from a GGUF (``vocab_from``), by
default the real Gemma 4 tokenizer (``mtpscope.cache.vocab_path``), whole when the checkpoint's
``vocab_size`` is Gemma 4's (262144, ``layouts.GEMMA4_N_VOCAB``), else its first ``vocab_size`` tokens (a consistent subset that llama.cpp
loads, facts §5).

Safetensors are read by :mod:`inspector.safetensors` (the one parser: header, then memmap views; BF16 widened
to float32) through :mod:`inspector.hf_checkpoint`; the config by :func:`inspector.hf_config.text_hparams`; the
tokenizer is copied by :mod:`inspector.tokenizer` (read with the hardened reader, ``open_gguf``); the file is
written by :func:`inspector.gguf_write.write_gguf` (shared steps: :mod:`inspector.convert_common`). The tiny
random checkpoints of the tests (:func:`write_tiny_pair`) are written here too.

May import: numpy, mtpscope.errors, inspector.safetensors / hf_checkpoint / hf_config / hf_names / gguf_write /
convert_common / convert_target / layouts (the architecture and drafter tensor names).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.errors import HFCheckpointError, LayoutError, MtpscopeError
from mtpscope.inspector import hf_checkpoint
from mtpscope.inspector.convert_common import (
    OUTTYPES,
    SIDECAR_ARCH,
    ConvertResult,
    Source,
    common_kv,
    refuse_nonfinite,
    tokenizer_kv_for,
    values_of,
    write_converted,
)
from mtpscope.inspector.convert_common import ordered as ordered_tensors
from mtpscope.inspector.convert_target import convert_target
from mtpscope.inspector.gguf_write import MetaValue, boolean, string, u32
from mtpscope.inspector.hf_audit import checkpoint_problems, refuse_problems
from mtpscope.inspector.hf_config import (
    TextHParams,
    assistant_fields,
    assistant_text_config,
    got,
    text_config,
    text_hparams,
)
from mtpscope.inspector.hf_names import DRAFTER_KV, gguf_name
from mtpscope.inspector.layouts import ARCH_FORK, ARCH_TARGET, ARCH_UPSTREAM, FORK_CENTROIDS, FORK_ORDERING
from mtpscope.inspector.safetensors import lazy_tensors, read_tensors, write_safetensors

DIALECTS = ("upstream", "fork")

# --------------------------------------------------------------------------------------------------
# reading


def read_checkpoint(hf_dir: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``(config.json as dict, {tensor name: array})`` of an HF checkpoint folder: every ``*.safetensors``,
    or the shards of ``model.safetensors.index.json`` (headers by :func:`inspector.hf_checkpoint.read_checkpoint`,
    data by :func:`inspector.safetensors.read_tensors`: memmap views, BF16 widened to float32).

    Raises:
        HFCheckpointError: missing / unreadable config.json, no safetensors file, a bad header or index.
    """
    d = Path(hf_dir)
    if not (d / "config.json").exists():
        raise HFCheckpointError("no config.json", path=d / "config.json")
    ckpt = hf_checkpoint.read_checkpoint(d)
    return dict(ckpt.config), read_tensors(ckpt.tensors.values())


# --------------------------------------------------------------------------------------------------
# the drafter's tensors


def _refuse_unsupported_drafter(tc: Mapping[str, Any], hp: TextHParams, where: str) -> None:
    """Raise HFCheckpointError for what llama.cpp's ``gemma4-assistant`` has no tensors for: MoE blocks and
    per-layer embeddings in a drafter (``src/models/gemma4-assistant.cpp``)."""
    if hp.n_expert or (hp.n_embd_per_layer and "n_embd_per_layer" in hp.stated):
        raise HFCheckpointError("a drafter with MoE blocks or per-layer embeddings: llama.cpp's gemma4-assistant "
                                "has neither", path=where, key="enable_moe_block / hidden_size_per_layer_input",
                                expected="false / 0", actual=(tc.get("enable_moe_block"),
                                                              tc.get("hidden_size_per_layer_input")))


def map_drafter_tensors(tensors: Mapping[str, Source], dialect: str,
                        where: str = "checkpoint") -> dict[str, Source]:
    """HF drafter ``model.*`` / projection tensors -> GGUF names in ``dialect`` (:func:`inspector.hf_names.gguf_name`);
    K/V tensors, ``lm_head`` (tied) and the centroid head (``masked_embedding.*``, written by the caller) are
    left out.

    Raises:
        HFCheckpointError: a tensor name the mapping does not know.
    """
    out: dict[str, Source] = {}
    for name, arr in tensors.items():
        if name.startswith("masked_embedding.") or name == "lm_head.weight" or name.endswith(DRAFTER_KV):
            continue
        try:
            g = gguf_name(name, dialect)
        except KeyError:
            raise HFCheckpointError("unknown tensor", path=where, key=name) from None
        if g is not None:
            out[g] = values_of(arr).reshape(1) if g.endswith("layer_output_scale.weight") else arr
    return out


# --------------------------------------------------------------------------------------------------
# writing


def convert(hf_dir: str | os.PathLike[str], out: str | os.PathLike[str], *, dialect: str = "upstream",
            outtype: str = "f32", centroids_out: str | os.PathLike[str] | None = None,
            vocab_from: str | os.PathLike[str] | None = None, overwrite: bool = True) -> ConvertResult:
    """Convert an HF Gemma 4 assistant (drafter) or Gemma 4 text (target) checkpoint to GGUF.

    A checkpoint is checked whole before anything is written: its config.json field by field
    (:func:`inspector.hf_config.text_hparams`, :func:`inspector.hf_config.assistant_fields`), every tensor's
    presence, shape and dtype against what that config implies (a drafter: :func:`inspector.hf_audit.checkpoint_problems`;
    a target: :func:`inspector.convert_target.target_tensor_problems`), then the values it writes (no NaN or Inf; the
    token ordering a permutation of the vocabulary). A refusal leaves ``out`` as it was (the file is written to
    ``out.tmp`` then renamed).

    Args:
        hf_dir: folder with ``config.json`` and ``*.safetensors``.
        out: the GGUF to write (written to ``out.tmp`` then renamed).
        dialect: drafter only: ``"upstream"`` or ``"fork"``.
        outtype: type of 2-D weights: ``f32``, ``f16``, ``bf16``, ``q8_0`` (rows whose length is not a
            multiple of 32 fall back to F16); 1-D tensors stay F32, the token ordering I32.
        centroids_out: upstream drafter with a centroid head: also write the head to this sidecar GGUF.
        vocab_from: GGUF to copy ``tokenizer.*`` keys from (default: the real Gemma 4 tokenizer).
        overwrite: replace an existing ``out`` / ``centroids_out`` (``mtpscope convert`` passes its ``--overwrite``,
            False by default, as ``quantize`` and ``import`` do).

    Raises:
        HFCheckpointError: unreadable checkpoint, unknown model type, a bad config field, a tensor missing, of the
            wrong shape or dtype, unknown or past the layers, bad tensor values.
        LayoutError: a drafter llama.cpp refuses (backbone width = its width), no centroid head for a sidecar,
            tokenizer of the wrong size.
        ValueError: unknown dialect / outtype.
        MtpscopeError: ``out`` or ``centroids_out`` exists and ``overwrite`` is False (nothing read or written).
    """
    if not overwrite:
        for o, opt in ((out, "--out"), (centroids_out, "--centroids-out")):
            if o is not None and Path(o).exists():
                raise MtpscopeError("the output exists (pass --overwrite to replace it)", path=os.fspath(o), key=opt,
                                    expected="a new file", actual="an existing file")
    if dialect not in DIALECTS:
        raise ValueError(f"dialect must be one of {DIALECTS}, got {dialect!r}")
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype must be one of {OUTTYPES}, got {outtype!r}")
    d = Path(hf_dir)
    if not (d / "config.json").exists():
        raise HFCheckpointError("no config.json", path=d / "config.json")
    ckpt = hf_checkpoint.read_checkpoint(d)
    config = ckpt.config
    where = os.fspath(d / "config.json")
    mt = config.get("model_type")
    out = Path(out)
    _refuse_outputs_over_inputs(out, None if centroids_out is None else Path(centroids_out),
                                [d / "config.json", *(Path(f) for f in ckpt.files),
                                 *([Path(vocab_from)] if vocab_from is not None else [])])
    if mt == "gemma4_assistant":
        return _convert_drafter(ckpt, out, dialect, outtype, centroids_out, vocab_from, where)
    if mt in ("gemma4_text", "gemma4"):
        tc = text_config(config, where) if mt == "gemma4" else config
        return convert_target(tc, ckpt.tensors, out, outtype, vocab_from, where)   # headers checked, then read
    raise HFCheckpointError("unsupported model_type", path=where, key="model_type",
                            expected="gemma4_assistant, gemma4_text or gemma4", actual=got(mt))


def _refuse_outputs_over_inputs(out: Path, centroids_out: Path | None, inputs: Sequence[Path]) -> None:
    """Refuse, before anything is written, an output that is one of the files the conversion reads (the checkpoint's
    ``config.json`` or a safetensors shard, ``--vocab-from``): its rename would destroy the input; and
    ``centroids_out`` equal to ``out`` (the sidecar would replace the drafter just written).

    Raises:
        HFCheckpointError: naming the output and the input it would replace.
    """
    def same(a: Path, b: Path) -> bool:
        try:
            return a.exists() and b.exists() and a.samefile(b)
        except OSError:
            return False

    for o, opt in ((out, "--out"), (centroids_out, "--centroids-out")):
        if o is None:
            continue
        hit = next((i for i in inputs if same(o, i) or o.resolve() == i.resolve()), None)
        if hit is not None:
            raise HFCheckpointError("the output would replace a file the conversion reads", path=o, key=opt,
                                    expected="another file", actual=f"the input {hit}")
    if centroids_out is not None and (centroids_out.resolve() == out.resolve() or same(centroids_out, out)):
        raise HFCheckpointError("the centroid sidecar would replace the drafter just written", path=centroids_out,
                                key="--centroids-out", expected="another file than --out", actual=f"--out {out}")


def drafter_kv(config: Mapping[str, Any], hp: TextHParams, dialect: str) -> list[tuple[str, MetaValue]]:
    """The ``{arch}.*`` keys of a drafter converted from an assistant ``config`` (text part read into ``hp``) in
    ``dialect``: the common keys, then upstream ``embedding_length_out`` / ``nextn_predict_layers`` or the
    fork's ``n_embd_backbone``, ``use_ordered_embeddings``, ``attention.k_eq_v``, ``requires_target_arch`` and,
    with a centroid head, ``n_centroids`` / ``centroid_top_k`` (``general.name`` not included).

    Raises:
        HFCheckpointError: an assistant field missing or bad (:func:`inspector.hf_config.assistant_fields`).
    """
    arch = ARCH_UPSTREAM if dialect == "upstream" else ARCH_FORK
    a = assistant_fields(config, hp.n_vocab)
    kv = common_kv(arch, hp)
    if dialect == "upstream":
        return kv + [(arch + ".embedding_length_out", u32(a.n_embd_backbone)),
                     (arch + ".nextn_predict_layers", u32(hp.n_layer))]
    kv += [(arch + ".n_embd_backbone", u32(a.n_embd_backbone)),
           (arch + ".use_ordered_embeddings", boolean(a.use_ordered_embeddings)),
           (arch + ".attention.k_eq_v", boolean(hp.k_eq_v)), (arch + ".requires_target_arch", string(ARCH_TARGET))]
    if a.use_ordered_embeddings:
        kv += [(arch + ".n_centroids", u32(a.n_centroids)), (arch + ".centroid_top_k", u32(a.centroid_top_k))]
    return kv


def _refuse_bad_values(tensors: Mapping[str, Source], files: Mapping[str, str], n_vocab: int,
                       ordering: str | None) -> None:
    """Refuse NaN / Inf in a float tensor (verify's ``E_NONFINITE``) and an ordering that is not a permutation of
    ``0..n_vocab-1`` (``E_ORDERING_RANGE`` / ``E_ORDERING_NOT_PERMUTATION``: ids no centroid can draft)."""
    for name, arr in tensors.items():
        if name == ordering:
            o = values_of(arr).astype(np.int64).ravel()
            outside = int(((o < 0) | (o >= n_vocab)).sum())
            counts = np.bincount(o[(o >= 0) & (o < n_vocab)], minlength=n_vocab)
            if outside or (counts != 1).any():
                raise HFCheckpointError("token ordering is not a permutation of the token ids", path=files[name],
                                        key=name, expected=f"each of 0..{n_vocab - 1} once",
                                        actual=f"{outside} ids outside, {int((counts > 1).sum())} repeated, "
                                               f"{int((counts == 0).sum())} never listed")
        else:
            refuse_nonfinite(name, arr, files[name])


def _convert_drafter(ckpt: hf_checkpoint.HFCheckpoint, out: Path, dialect: str, outtype: str, centroids_out: Any,
                     vocab_from: Any, where: str) -> ConvertResult:
    config = ckpt.config
    tc = assistant_text_config(config, where)
    hp = text_hparams(tc, where)
    _refuse_unsupported_drafter(tc, hp, where)
    a = assistant_fields(config, hp.n_vocab, where)
    if a.n_embd_backbone == hp.n_embd:
        raise LayoutError("backbone_hidden_size equals hidden_size: llama.cpp refuses such a drafter",
                          path=where, key="backbone_hidden_size", expected=f"!= {hp.n_embd}", actual=a.n_embd_backbone)
    ordered = a.use_ordered_embeddings
    if centroids_out is not None and not ordered:
        raise LayoutError("the checkpoint has no centroid head to write to a sidecar", path=where,
                          key="use_ordered_embeddings", expected=True, actual=False)
    head = ordered and (dialect == "fork" or centroids_out is not None)
    refuse_problems(checkpoint_problems(ckpt, dialect, centroid_head=head, where=where))
    tensors = lazy_tensors(ckpt.tensors.values())     # read a block at a time, while each is checked and written
    g = map_drafter_tensors(tensors, dialect, where)
    cen: Source | None = None
    order: Source | None = None
    if head:
        cen = tensors["masked_embedding.centroids.weight"]
        order = tensors["masked_embedding.token_ordering"]
    written = {n: t for n, t in tensors.items() if (head or not n.startswith("masked_embedding."))
               and n != "lm_head.weight" and not n.endswith(DRAFTER_KV)}
    _refuse_bad_values(written, {n: ckpt.tensors[n].file for n in written}, hp.n_vocab,
                       "masked_embedding.token_ordering" if head else None)
    g["rope_freqs.weight"] = hp.rope_freqs
    if order is not None:
        order = values_of(order).astype(np.int32)
    arch = ARCH_UPSTREAM if dialect == "upstream" else ARCH_FORK
    kv = [("general.name", string("mtpscope-converted-drafter"))] + drafter_kv(config, hp, dialect)
    if dialect == "fork" and cen is not None and order is not None:   # both set exactly when ordered
        g[FORK_CENTROIDS] = cen
        g[FORK_ORDERING] = order
    tok_kv = tokenizer_kv_for(hp.n_vocab, vocab_from)
    write_converted(out, arch, kv, tok_kv, ordered_tensors(g), outtype)
    side = None
    if centroids_out is not None and cen is not None and order is not None:
        side = Path(centroids_out)
        s = SIDECAR_ARCH + "."
        skv = [("general.name", string("mtpscope-centroid-sidecar")),
               (s + "n_centroids", u32(a.n_centroids)), (s + "centroid_top_k", u32(a.centroid_top_k)),
               (s + "embedding_length", u32(hp.n_embd)), (s + "vocab_size", u32(hp.n_vocab))]
        write_converted(side, SIDECAR_ARCH, skv, [], {FORK_CENTROIDS: cen, FORK_ORDERING: order},
                        outtype)
    return ConvertResult(out=out, kind="drafter", dialect=dialect, arch=arch, n_tensors=len(g), centroids_out=side)


# --------------------------------------------------------------------------------------------------
# tiny random HF checkpoints (tests, parity) written without torch




def tiny_text_config(*, vocab_size: int = 4096, hidden_size: int = 64, n_layer: int = 6, n_head: int = 2,
                     n_kv: int = 1, n_kv_full: int | None = None, head_dim: int = 32, global_head_dim: int = 64,
                     intermediate_size: int = 128, sliding_window: int = 16, k_eq_v: bool = False,
                     layer_types: list[str] | None = None, softcap: float | None = 30.0) -> dict[str, Any]:
    """A ``gemma4_text`` config dict for a tiny random model (transformers 5.24 field names)."""
    types = layer_types or ["sliding_attention" if (i + 1) % 3 else "full_attention" for i in range(n_layer)]
    cfg: dict[str, Any] = {
        "model_type": "gemma4_text", "vocab_size": vocab_size, "hidden_size": hidden_size,
        "intermediate_size": intermediate_size, "num_hidden_layers": n_layer, "num_attention_heads": n_head,
        "num_key_value_heads": n_kv, "head_dim": head_dim, "global_head_dim": global_head_dim,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "sliding_window": sliding_window, "layer_types": types, "final_logit_softcapping": softcap,
        "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0, "attention_k_eq_v": k_eq_v,
        "num_kv_shared_layers": 0, "enable_moe_block": False, "use_double_wide_mlp": False,
        "tie_word_embeddings": True, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                               "rope_theta": 1000000.0}},
    }
    if n_kv_full is not None:
        cfg["num_global_key_value_heads"] = n_kv_full
    return cfg


def random_text_tensors(tc: Mapping[str, Any], seed: int, *, with_kv: bool = True,
                        prefix: str = "model.") -> dict[str, np.ndarray]:
    """Random weights (HF names, numpy ``(out, in)``) for a ``gemma4_text`` config: norms near 1,
    matrices ~ N(0, 1/in), ``layer_scalar`` in [0.5, 1.5]."""
    rng = np.random.default_rng(seed)
    hp = text_hparams(tc)
    D, F = hp.n_embd, hp.n_ff

    def mat(o: int, i: int) -> np.ndarray:
        return (rng.standard_normal((o, i)) / math.sqrt(i)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    t: dict[str, np.ndarray] = {prefix + "embed_tokens.weight": (rng.standard_normal((hp.n_vocab, D)) * 0.5
                                                                  ).astype(np.float32),
                                prefix + "norm.weight": norm(D)}
    for il in range(hp.n_layer):
        hd = hp.head_dim_swa if hp.is_swa[il] else hp.head_dim_full
        p = f"{prefix}layers.{il}."
        t[p + "input_layernorm.weight"] = norm(D)
        t[p + "self_attn.q_proj.weight"] = mat(hp.n_head * hd, D)
        t[p + "self_attn.q_norm.weight"] = norm(hd)
        if with_kv:
            t[p + "self_attn.k_proj.weight"] = mat(hp.n_head_kv[il] * hd, D)
            if not (hp.k_eq_v and not hp.is_swa[il]):
                t[p + "self_attn.v_proj.weight"] = mat(hp.n_head_kv[il] * hd, D)
            t[p + "self_attn.k_norm.weight"] = norm(hd)
        t[p + "self_attn.o_proj.weight"] = mat(D, hp.n_head * hd)
        t[p + "post_attention_layernorm.weight"] = norm(D)
        t[p + "pre_feedforward_layernorm.weight"] = norm(D)
        t[p + "mlp.gate_proj.weight"] = mat(F, D)
        t[p + "mlp.up_proj.weight"] = mat(F, D)
        t[p + "mlp.down_proj.weight"] = mat(D, F)
        t[p + "post_feedforward_layernorm.weight"] = norm(D)
        t[p + "layer_scalar"] = rng.uniform(0.5, 1.5, 1).astype(np.float32)
    return t


def write_tiny_pair(root: str | os.PathLike[str], *, seed: int = 0, vocab_size: int = 4096,
                    centroids: bool = False, k_eq_v: bool = False, n_centroids: int = 64, top_k: int = 4,
                    drafter_hidden: int = 48) -> tuple[Path, Path]:
    """Write a tiny random HF target (``Gemma4ForCausalLM``) and drafter (``Gemma4AssistantForCausalLM``)
    checkpoint pair under ``root/target`` and ``root/drafter``; returns the two folders.

    Target: 6 layers [s, s, f, s, s, f], hidden 64, 2 heads, KV heads 1 (with ``k_eq_v``: 2 on sliding,
    1 on full layers), head dims 32 / 64. Drafter: 4 layers [s, s, s, f], hidden ``drafter_hidden``, the
    same KV head layout, backbone 64.
    """
    root = Path(root)
    # with K = V, as in 26B-A4B / 31B: more KV heads on sliding layers (2) than on full layers (1)
    n_kv = 2 if k_eq_v else 1
    n_kv_full = 1 if k_eq_v else None
    ttc = tiny_text_config(vocab_size=vocab_size, k_eq_v=k_eq_v, n_kv=n_kv, n_kv_full=n_kv_full)
    ttc["architectures"] = ["Gemma4ForCausalLM"]
    dtc = tiny_text_config(vocab_size=vocab_size, hidden_size=drafter_hidden, n_layer=4, k_eq_v=k_eq_v,
                           n_kv=n_kv, n_kv_full=n_kv_full, intermediate_size=96, softcap=None,
                           layer_types=["sliding_attention"] * 3 + ["full_attention"])
    dtc["num_kv_shared_layers"] = 4
    for d in (root / "target", root / "drafter"):
        d.mkdir(parents=True, exist_ok=True)
    (root / "target" / "config.json").write_text(json.dumps(ttc, indent=1))
    write_safetensors(root / "target" / "model.safetensors", random_text_tensors(ttc, seed))
    dcfg = {"model_type": "gemma4_assistant", "architectures": ["Gemma4AssistantForCausalLM"],
            "text_config": dtc, "backbone_hidden_size": ttc["hidden_size"], "use_ordered_embeddings": centroids,
            "num_centroids": n_centroids, "centroid_intermediate_top_k": top_k, "tie_word_embeddings": True}
    (root / "drafter" / "config.json").write_text(json.dumps(dcfg, indent=1))
    rng = np.random.default_rng(seed + 1000)
    dt = random_text_tensors(dtc, seed + 1, with_kv=False)
    B = ttc["hidden_size"]
    dt["pre_projection.weight"] = (rng.standard_normal((drafter_hidden, 2 * B)) / math.sqrt(2 * B)).astype(np.float32)
    dt["post_projection.weight"] = (rng.standard_normal((B, drafter_hidden)) / math.sqrt(drafter_hidden)
                                    ).astype(np.float32)
    if centroids:
        dt["masked_embedding.centroids.weight"] = (rng.standard_normal((n_centroids, drafter_hidden))
                                                   ).astype(np.float32)
        dt["masked_embedding.token_ordering"] = rng.permutation(vocab_size).astype(np.int64)
    write_safetensors(root / "drafter" / "model.safetensors", dt)
    return root / "target", root / "drafter"


__all__ = ["DIALECTS", "OUTTYPES", "ConvertResult", "convert", "drafter_kv", "map_drafter_tensors", "random_text_tensors",
           "read_checkpoint", "tiny_text_config", "write_tiny_pair"]
