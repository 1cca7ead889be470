"""Loadability: whether each runtime mtpscope knows would load a GGUF, with the reasons it would give.

One job: per-runtime load rules and their :class:`findings.Verdict` — :func:`upstream_verdict` (llama.cpp as
vendored by llama-cpp-python 0.3.36, rules checked against the real loader in the tests), :func:`fork_verdict`
(the fork's documented rules), :func:`loadability` (both, in :data:`RUNTIMES` order).

May import: mtpscope.errors, inspector.findings, inspector.layouts, inspector.checks (helpers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from mtpscope.errors import LayoutError
from mtpscope.inspector import layouts as L
from mtpscope.inspector.checks import check_shared_kv, key_value, tensor_map, wire_type_problems
from mtpscope.inspector.findings import (
    OUTCOME_ABORTS_CONTEXT,
    OUTCOME_ABORTS_DECODE,
    OUTCOME_ABORTS_DRAFT,
    OUTCOME_ABORTS_LOAD,
    Verdict,
)

RUNTIME_UPSTREAM = "llama.cpp (llama-cpp-python 0.3.36)"
RUNTIME_FORK = "fork (atomic-llama-cpp-turboquant)"
RUNTIMES = (RUNTIME_UPSTREAM, RUNTIME_FORK)

# Architecture names llama.cpp of llama-cpp-python 0.3.36 knows (src/llama-arch.cpp LLM_ARCH_NAMES).
KNOWN_ARCHES_UPSTREAM = frozenset("""
clip llama llama4 deci falcon grok gpt2 gptj gptneox mpt baichuan starcoder refact bert modern-bert nomic-bert
nomic-bert-moe neo-bert jina-bert-v2 jina-bert-v3 eurobert bloom stablelm qwen qwen2 qwen2moe qwen2vl qwen3
qwen3moe qwen3next qwen3vl qwen3vlmoe qwen35 qwen35moe qwen4exp phi2 phi3 phimoe plamo plamo2 plamo3 codeshell
orion internlm2 minicpm minicpm3 gemma gemma2 gemma3 gemma3n gemma4 gemma4-assistant gemma-embedding starcoder2
mamba mamba2 maple jamba falcon-h1 xverse command-r cohere2 cohere2moe dbrx olmo olmo2 olmoe muse-glimmer openelm
arctic deepseek deepseek2 deepseek2-ocr deepseek32 deepseek4 chatglm glm4 glm4moe glm-dsa bitnet t5 t5encoder
jais jais2 nemotron nemotron_h nemotron_h_moe exaone exaone4 exaone-moe rwkv6 rwkv6qwen2 rwkv7 arwkv7 granite
granitemoe granitehybrid graniteswitch granite_swa chameleon wavtokenizer-dec plm bailingmoe bailingmoe2
bailingmoe3 dots1 dots3note arcee afmoe laguna ernie4_5 ernie4_5-moe hunyuan-moe hunyuan-dense hunyuan_vl hy_v3
hy_v4 smollm3 gpt-oss lfm2 lfm2moe dream smallthinker llada llada-moe seed_oss grovemoe apertus minimax-01
hrm_text minimax-m2 minimax-m3 cogvlm rnd1 pangu-embedded mistral3 eagle3 dflash mistral4 paddleocr mimo2 step35
spark2_5 llama-embed maincoder kimi-linear kimi-k3 glm5-next talkie mellum nanbeige qwen3tts pockettts
""".split())

_BASIS_UPSTREAM = ("rules read from the llama.cpp vendored by llama-cpp-python 0.3.36 (src/llama-model.cpp, "
                   "src/models/gemma4*.cpp) and checked against llama_model_load_from_file in the tests")
_BASIS_FORK = ("rules from the fork's documented layout and verify script (not run here); files of one dialect "
               "do not load in the other runtime")


def _runtime_keys(arch: str, dialect: str) -> list[str]:
    keys = ["context_length", "embedding_length", "block_count", "attention.sliding_window_pattern",
            "attention.sliding_window", "attention.layer_norm_rms_epsilon", "attention.key_length_swa",
            "attention.value_length_swa"]
    if dialect == "target":
        keys.append("embedding_length_per_layer_input")
    if dialect == "fork":
        keys.append("n_embd_backbone")
    return [f"{arch}.{k}" for k in keys]


MAX_REASONS = 8


def _capped(reasons: list[str]) -> tuple[str, ...]:
    """At most MAX_REASONS reasons, then one line counting the rest."""
    if len(reasons) <= MAX_REASONS:
        return tuple(reasons)
    return (*reasons[:MAX_REASONS], f"… and {len(reasons) - MAX_REASONS} more")


def _tensor_reasons(f: Any, hp: L.HParams, layout: Iterable[L.ExpectedTensor],
                    tmap: dict[str, Any], ignored: Iterable[str] = ()) -> list[str]:
    """Reasons a llama.cpp-style loader refuses the tensors, in create_tensor order."""
    reasons: list[str] = []
    layout = list(layout)
    if not tmap:
        reasons.append("the file has no tensors (a vocabulary-only GGUF?); "
                       f"tensor '{layout[0].name if layout else 'token_embd.weight'}' not found")
    created = set()
    for e in layout:
        t = tmap.get(e.name)
        if t is None:
            if e.required:
                reasons.append(f"tensor '{e.name}' not found (a required tensor is missing)")
            continue
        created.add(e.name)
        ne = tuple(int(x) for x in t.ne)
        if ne != e.ne:
            reasons.append(f"tensor '{e.name}' has wrong shape; expected {list(e.ne)}, got {list(ne)}")
    ignored = set(ignored)
    extra = [n for n in tmap if n not in created and n not in ignored]
    if extra and not reasons:
        reasons.append(f"wrong number of tensors; expected {len(tmap)}, got {len(tmap) - len(extra)} "
                       f"(tensors the runtime does not use: {', '.join(extra[:5])}"
                       + (", …" if len(extra) > 5 else "") + ")")
    return reasons


def _tokenizer_reasons(f: Any) -> list[str]:
    reasons = []
    model = key_value(f, "tokenizer.ggml.model")
    if model is None:
        reasons.append("key not found in model: tokenizer.ggml.model")
    if f.get("tokenizer.ggml.tokens") is None:
        reasons.append("cannot find tokenizer vocab in model file")
    if model == "gemma4" and f.get("tokenizer.ggml.merges") is None:
        reasons.append("cannot find tokenizer merges in model file")
    return reasons


def _layout_reason(e: LayoutError) -> str:
    """A refusal reason for a file whose hyperparameters cannot be read, worded as llama.cpp's loader
    words it (src/llama-model-loader.cpp)."""
    if e.message == "per-layer array has the wrong length":
        n = str(e.expected).split()[0]
        return f"key {e.key} has wrong array length; expected {n}, got {e.actual}"
    if e.message == "key has the wrong type":
        return f"key {e.key} has wrong type ({e.actual})"
    return f"key {e.key}: {e.message} (expected {e.expected}, got {e.actual})"


def _read_for_load(f: Any, arch: str, runtime: str, basis: str) -> L.HParams | Verdict:
    """What both loaders check first: the keys they read without a default, the vocabulary, then the
    hyperparameters. Returns the hyperparameters, or the refusing :class:`Verdict`."""
    reasons = [f"key not found in model: {k}" for k in _runtime_keys(arch, L.dialect_of(arch)) if f.get(k) is None]
    reasons += _tokenizer_reasons(f)
    reasons += [why for _, _, why in wire_type_problems(f, arch)]
    if reasons:
        return Verdict(runtime, False, _capped(reasons), basis)
    try:
        return L.read_hparams(f)
    except LayoutError as e:
        return Verdict(runtime, False, (_layout_reason(e),), basis)


#: llama.cpp's own messages for the aborts below (ggml/src/ggml-cpu/binary-ops.cpp, ggml/src/ggml.c,
#: src/llama-kv-cache.cpp), as a child process running the real runtime prints them
MSG_BINARY_OP = "binary_op: unsupported types: dst: f32, src0: f32, src1: {t}"
MSG_ROPE_FREQS = "GGML_ASSERT(c->type == GGML_TYPE_F32) failed"
MSG_SHARED_KV = "GGML_ASSERT(map_layer_ids.find(il_reuse) != map_layer_ids.end()) failed"
#: ggml's rope on rotated dims it cannot turn (layouts.rope_dims; ggml/src/ggml.c, ggml-cpu/ops.cpp)
MSG_ROPE_FACTORS = "GGML_ASSERT(c->ne[0] >= n_dims / 2) failed"
MSG_ROPE_ODD = "GGML_ASSERT(n_dims % 2 == 0) failed"
MSG_ROPE_WIDE = "GGML_ASSERT(n_dims <= ne0) failed"
_ABORT_NOTE = " (abort rules observed with upstream llama.cpp's CPU backend; the fork shares those ggml ops)"


def aborts(f: Any, hp: L.HParams, runtime: str, basis: str) -> Verdict | None:
    """For a file the runtime loads: the abort it meets after that, if any (checked against the real
    llama.cpp in a child process, tests/test_runtime_verdicts.py).

    * ``rope_freqs.weight`` not F32: ``ggml_rope_ext`` asserts F32 frequency factors while the model
      loads (its weights' ops are built then) -> outcome "aborts while loading", ``loads`` False.
    * another 1-D weight (norms, ``layer_output_scale``) in F16 / BF16: the CPU ``binary_op`` has no f32 x
      f16 kernel -> "aborts at first draft" (a drafter) / "aborts at first decode" (a target).
    * a target whose shared-KV layers reuse a layer of the other type: "aborts creating a context".
    * a drafter's ``rope.dimension_count`` over twice the ``rope_freqs`` factors: "aborts creating a context" (the
      graph llama.cpp reserves then ropes by the factors); an odd
      one, or one over its layers' head dim (either key): "aborts at first draft" (0, which hangs llama.cpp, is
      verify's error only).
    """
    dialect = L.dialect_of(f.architecture)
    try:
        layout = L.expected_layout(hp)
    except LayoutError:
        return None
    vectors = {e.name for e in layout if e.ggml_types == L.VECTOR_TYPES}
    tmap, _ = tensor_map(f)
    rope = tmap.get("rope_freqs.weight")
    if rope is not None and rope.type_name != "F32":
        return Verdict(runtime, False, (f"rope_freqs.weight is {rope.type_name}: {MSG_ROPE_FREQS} while loading "
                                        "(the RoPE frequency factors must be F32)",), basis, OUTCOME_ABORTS_LOAD,
                       MSG_ROPE_FREQS)
    half = [tmap[n] for n in sorted(vectors) if n in tmap and tmap[n].type_name in ("F16", "BF16")]
    if half:
        t = half[0]
        msg = MSG_BINARY_OP.format(t=t.type_name.lower())
        outcome = OUTCOME_ABORTS_DECODE if dialect == "target" else OUTCOME_ABORTS_DRAFT
        return Verdict(runtime, True, (f"{t.name} is {t.type_name} (and {len(half) - 1} more 1-D tensors): loads, then "
                                       f"{msg}",) if len(half) > 1 else
                       (f"{t.name} is {t.type_name}: loads, then {msg}",), basis, outcome, msg)
    if dialect in ("fork", "upstream"):
        rot = _rope_abort(hp, rope, runtime, basis)
        if rot is not None:
            return rot
    if dialect == "target":
        found: list[Any] = []
        check_shared_kv(f, hp, found.append)
        if found:
            return Verdict(runtime, True, (f"loads, then {MSG_SHARED_KV}: {found[0].message}",), basis,
                           OUTCOME_ABORTS_CONTEXT, MSG_SHARED_KV)
    return None


def _rope_abort(hp: L.HParams, rope: Any, runtime: str, basis: str) -> Verdict | None:
    """The abort a drafter's rotated dims (:func:`layouts.rope_dims`) meet, if any (see :func:`aborts`)."""
    kinds = {ly.sliding for ly in hp.layers}
    (fk, fr, fh), (sk, sr, sh) = L.rope_dims(hp)
    if False in kinds and rope is not None and rope.ne and fr > 2 * int(rope.ne[0]):
        return Verdict(runtime, True, (f"{fk} = {fr}, more than twice the {int(rope.ne[0])} rope_freqs factors: "
                                       f"loads, then {MSG_ROPE_FACTORS} creating a context",), basis,
                       OUTCOME_ABORTS_CONTEXT, MSG_ROPE_FACTORS)
    for present, key, n_rot, head_dim in ((False in kinds, fk, fr, fh), (True in kinds, sk, sr, sh)):
        msg = MSG_ROPE_ODD if n_rot % 2 else MSG_ROPE_WIDE if n_rot > head_dim else None
        if present and msg is not None:
            return Verdict(runtime, True, (f"{key} = {n_rot} (head dim {head_dim}): loads, then {msg}",), basis,
                           OUTCOME_ABORTS_DRAFT, msg)
    return None


def upstream_verdict(f: Any) -> Verdict:
    """Whether llama.cpp as vendored in llama-cpp-python 0.3.36 loads this file (rules, not a real load).

    Rules (in the order the loader meets them): the architecture must be known (``gemma4_assistant``, the
    fork's name, is not); required hparam keys; the vocabulary; for ``gemma4-assistant``: K/V head dims
    equal, ``embedding_length_out`` present and different from ``embedding_length``; then every tensor
    ``load_arch_tensors`` creates (required ones present, exact ``ne``); ``masked_embd_*`` tensors fail with
    ``vector::_M_range_check``; any tensor not created fails "wrong number of tensors".
    """
    arch = f.architecture
    if not arch:
        return Verdict(RUNTIME_UPSTREAM, False, ("key not found in model: general.architecture",), _BASIS_UPSTREAM)
    if arch not in KNOWN_ARCHES_UPSTREAM:
        why = f"unknown model architecture: '{arch}'"
        if arch == L.ARCH_FORK:
            why += " (the fork's name; upstream spells it gemma4-assistant, with other key and tensor names)"
        return Verdict(RUNTIME_UPSTREAM, False, (why,), _BASIS_UPSTREAM)
    if arch not in (L.ARCH_UPSTREAM, L.ARCH_TARGET):
        return Verdict(RUNTIME_UPSTREAM, None, (f"mtpscope has no load rules for architecture '{arch}'",),
                       _BASIS_UPSTREAM)
    dialect = L.dialect_of(arch)
    hp = _read_for_load(f, arch, RUNTIME_UPSTREAM, _BASIS_UPSTREAM)
    if isinstance(hp, Verdict):
        return hp
    reasons: list[str] = []
    for a, b in (("attention.key_length", "attention.value_length"),
                 ("attention.key_length_swa", "attention.value_length_swa")):
        ka, kb = key_value(f, f"{arch}.{a}"), key_value(f, f"{arch}.{b}")
        if ka is not None and kb is not None and ka != kb:
            reasons.append(f"Gemma 4 requires n_embd_head_k == n_embd_head_v ({a} {ka}, {b} {kb})")
    tmap, dups = tensor_map(f)
    if dups:
        reasons.append(f"duplicated tensor name '{dups[0]}'")
    unknown = [t.name for t in f.tensors if t.n_bytes is None]
    if unknown:
        reasons.append(f"tensor '{unknown[0]}' has an unknown ggml type")
    if dialect == "upstream":
        n_out = key_value(f, f"{arch}.embedding_length_out")
        if n_out is None or int(n_out) == hp.n_embd:
            reasons.append("Gemma 4 assistant requires embedding_length_out to carry the target hidden size"
                           + (" (key missing)" if n_out is None else f" (it equals embedding_length {hp.n_embd})"))
        if reasons:
            return Verdict(RUNTIME_UPSTREAM, False, _capped(reasons), _BASIS_UPSTREAM)
        nextn = hp.nextn_predict_layers or 0
        hp_n = dataclasses.replace(hp, layers=hp.layers[:nextn])
        masked = [n for n in (L.UPSTREAM_MASKED_CENTROIDS, L.UPSTREAM_MASKED_ORDERING) if n in tmap]
        if masked:
            reasons.append(f"tensor '{masked[0]}' present: vector::_M_range_check: __n (which is 0) >= this->size() "
                           "(0.3.36 creates the masked_embd_* tensors with an empty shape)")
            return Verdict(RUNTIME_UPSTREAM, False, _capped(reasons), _BASIS_UPSTREAM)
        layout = L.expected_drafter_layout(hp_n, "upstream") if hp.n_vocab is not None else ()
        if nextn == 0:  # pre_projection is created inside the block loop (at il == 0)
            layout = tuple(e for e in layout if "pre_projection" not in e.name)
        reasons += _tensor_reasons(f, hp_n, layout, tmap)
        if nextn == 0:
            reasons.append("nextn_predict_layers is missing or 0: the runtime creates no drafter block")
    else:
        if reasons:
            return Verdict(RUNTIME_UPSTREAM, False, _capped(reasons), _BASIS_UPSTREAM)
        layout = L.expected_target_layout(hp) if hp.n_vocab is not None else ()
        reasons += _tensor_reasons(f, hp, layout, tmap)
    if reasons:
        return Verdict(RUNTIME_UPSTREAM, False, _capped(reasons), _BASIS_UPSTREAM)
    aborted = aborts(f, hp, RUNTIME_UPSTREAM, _BASIS_UPSTREAM)
    if aborted is not None:
        return aborted
    return Verdict(RUNTIME_UPSTREAM, True, (f"loads: a valid {arch} file for this runtime",), _BASIS_UPSTREAM)


def fork_verdict(f: Any) -> Verdict:
    """Whether the fork (atomic-llama-cpp-turboquant) loads this file, from its documented rules.

    The fork predates upstream's ``gemma4-assistant`` and only knows ``gemma4_assistant`` (plus the
    ``gemma4`` target). For its drafter: ``n_embd_backbone`` key, ``mtp.*`` projections, the same per-layer
    tensors with ``layer_output_scale`` optional, and with ``use_ordered_embeddings`` the centroid pair
    ``mtp.centroids.weight`` (n_embd, n_centroids) / ``mtp.token_ordering.weight`` (n_vocab,) I32 with
    n_vocab % n_centroids == 0. Not run here: the fork is not available offline.
    """
    arch = f.architecture
    if arch == L.ARCH_UPSTREAM:
        return Verdict(RUNTIME_FORK, False, (
            "unknown model architecture: 'gemma4-assistant' (upstream's name; the fork expects "
            "gemma4_assistant with n_embd_backbone and mtp.* tensors)",), _BASIS_FORK)
    if arch not in (L.ARCH_FORK, L.ARCH_TARGET):
        return Verdict(RUNTIME_FORK, None if arch in KNOWN_ARCHES_UPSTREAM else False,
                       (f"mtpscope has no fork rules for architecture '{arch}'" if arch in KNOWN_ARCHES_UPSTREAM
                        else f"unknown model architecture: '{arch}'",), _BASIS_FORK)
    dialect = L.dialect_of(arch)
    hp = _read_for_load(f, arch, RUNTIME_FORK, _BASIS_FORK)
    if isinstance(hp, Verdict):
        return hp
    reasons: list[str] = []
    tmap, dups = tensor_map(f)
    if dups:
        reasons.append(f"duplicated tensor name '{dups[0]}'")
    if hp.n_vocab is None:
        reasons.append("n_vocab unknown")
        return Verdict(RUNTIME_FORK, False, _capped(reasons), _BASIS_FORK)
    if dialect == "fork":
        if hp.use_ordered_embeddings:
            if not hp.n_centroids:
                reasons.append(f"key not found in model: {arch}.n_centroids")
            elif hp.n_vocab % hp.n_centroids:
                reasons.append(f"n_vocab {hp.n_vocab} is not a multiple of n_centroids {hp.n_centroids}")
            o = tmap.get(L.FORK_ORDERING)
            if o is not None and o.type_name != "I32":
                reasons.append(f"{L.FORK_ORDERING} must be I32, found {o.type_name}")
        layout = L.expected_drafter_layout(hp, "fork")
        ignored = () if hp.use_ordered_embeddings else (L.FORK_CENTROIDS, L.FORK_ORDERING)
        reasons += _tensor_reasons(f, hp, layout, tmap, ignored)
    else:
        reasons += _tensor_reasons(f, hp, L.expected_target_layout(hp), tmap)
    if reasons:
        return Verdict(RUNTIME_FORK, False, _capped(reasons), _BASIS_FORK)
    aborted = aborts(f, hp, RUNTIME_FORK, _BASIS_FORK + _ABORT_NOTE)
    if aborted is not None:
        return aborted
    return Verdict(RUNTIME_FORK, True, (f"loads: a valid {arch} file for the fork",), _BASIS_FORK)


def loadability(f: Any) -> tuple[Verdict, ...]:
    """One :class:`Verdict` per runtime in :data:`RUNTIMES` for an open GGUF file."""
    return (upstream_verdict(f), fork_verdict(f))


__all__ = ["KNOWN_ARCHES_UPSTREAM", "MAX_REASONS", "RUNTIMES", "RUNTIME_FORK", "RUNTIME_UPSTREAM", "aborts",
           "fork_verdict", "loadability", "upstream_verdict"]
