"""File checks of one drafter / target GGUF: keys, tokenizer, tensors against the layout, values.

One job: :func:`check_file`, every single-file check (superset of the fork's
``scripts/verify-gemma4-assistant-gguf.py``, docs/reference/gemma4-assistant-facts.md §1): arch / dialect,
required hyperparameter keys, the full expected tensor list of the dialect (:mod:`layouts`: missing,
unexpected, duplicated, shapes, projection widths vs the backbone width, dtypes: 1-D F32, ordering I32),
token_embd rank and width, the centroid head (shape, orientation, n_vocab % n_centroids, ordering non-zero /
in range / a permutation, every centroid owning exactly n_vocab / n_centroids tokens), rope_freqs values,
non-finite values in small tensors, an RMS norm epsilon or a RoPE base that is not a finite number > 0 and a
target's final_logit_softcapping that is not finite (:data:`_NUMBER_KEYS`), RoPE dims llama.cpp cannot rotate by
(:func:`layouts.rope_dims`), tokenizer present and consistent with
n_vocab. Also the small helpers over an open file that :mod:`pairing` and :mod:`loadability`
share (:func:`tensor_map`, :func:`key_value`).

Shapes in messages are GGUF ``ne`` order (innermost first) unless they say "numpy shape".

May import: numpy, mtpscope.errors, inspector.findings, inspector.hf_config (``number_fault``, the one rule of the
number keys), inspector.layouts, inspector.inventory (dialect detection of foreign architectures).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mtpscope.errors import InspectorError, LayoutError
from mtpscope.inspector import layouts as L
from mtpscope.inspector.findings import ERROR, INFO, WARNING, Finding, finding
from mtpscope.inspector.hf_config import number_fault

# Tensors with at most this many elements (and every 1-D tensor) are read in full for the
# non-finite check; larger ones are skipped (reading a 20 GB file is not a validation step).
SMALL_TENSOR_ELEMENTS = 1 << 20


# --- small helpers over the reader -----------------------------------------------------------------

def tensor_map(f: Any) -> tuple[dict[str, Any], list[str]]:
    """``(name -> TensorInfo (first occurrence), [duplicated names])`` of an open GGUF."""
    out: dict[str, Any] = {}
    dups: list[str] = []
    for t in f.tensors:
        if t.name in out:
            dups.append(t.name)
        else:
            out[t.name] = t
    return out, dups


def key_value(f: Any, key: str) -> Any:
    """The value of GGUF key ``key`` as a plain Python value (arrays as lists), None when absent."""
    return L._scalar(f.get(key))


def read_small(f: Any, name: str) -> np.ndarray | None:
    """Tensor ``name`` read in full (numpy order), or None when it cannot be read."""
    try:
        return np.asarray(f.tensor_data(name))
    except InspectorError:
        return None


# --- file checks ------------------------------------------------------------------------------------

_UPSTREAM_TO_FORK = {v: k for k, v in L.FORK_TO_UPSTREAM.items()}


def _required_keys(dialect: str, hp: L.HParams | None) -> list[tuple[str, str]]:
    """(key suffix, severity) the runtime reads without a default (src/llama-model.cpp, models/gemma4*.cpp)."""
    keys = [("context_length", ERROR), ("embedding_length", ERROR), ("block_count", ERROR),
            ("attention.head_count", ERROR), ("feed_forward_length", ERROR),
            ("attention.sliding_window", ERROR), ("attention.layer_norm_rms_epsilon", ERROR),
            ("attention.key_length_swa", ERROR), ("attention.value_length_swa", ERROR),
            ("attention.key_length", WARNING), ("attention.value_length", WARNING),
            # without rope.freq_base llama.cpp uses 10000 for the full-attention layers (Gemma 4: 1e6) and
            # runs with wrongly rotated queries (checked: tests/test_runtime_verdicts.py); the sliding
            # layers' default, 10000, is Gemma 4's own value
            ("rope.freq_base", ERROR), ("rope.freq_base_swa", WARNING)]
    if dialect == "upstream":
        keys += [("embedding_length_out", ERROR), ("nextn_predict_layers", ERROR)]
    elif dialect == "fork":
        keys += [("n_embd_backbone", ERROR)]
        if hp is not None and hp.use_ordered_embeddings:
            keys += [("n_centroids", ERROR), ("centroid_top_k", WARNING)]
    elif dialect == "target":
        keys += [("embedding_length_per_layer_input", ERROR)]
    return keys


def check_file(f: Any, partial_rotary_factor: float = L.DEFAULT_PARTIAL_ROTARY_FACTOR_FULL,
               scan_values: bool = True) -> tuple[str, L.HParams | None, list[Finding]]:
    """All single-file checks.

    Args:
        f: an open GGUF file (inspector/gguf.py ``GGUFFile``).
        partial_rotary_factor: the full-attention partial rotary factor the ``rope_freqs`` values are
            checked against (0.25 for every published Gemma 4; an HF config can say otherwise).
        scan_values: read small tensors for non-finite values and rope_freqs / ordering contents.

    Returns:
        (dialect, hparams or None when no layout could be derived, findings).
    """
    findings: list[Finding] = []
    add = findings.append
    arch = f.architecture
    dialect = L.dialect_of(arch)
    if not arch:
        kv = f.kv.get("general.architecture")
        if kv is None:
            add(finding(ERROR, "E_ARCH_MISSING", "general.architecture", f"{L.ARCH_FORK} or {L.ARCH_UPSTREAM}", None,
                   "no general.architecture key"))
        elif isinstance(kv.value, str):
            add(finding(ERROR, "E_ARCH_MISSING", "general.architecture", f"{L.ARCH_FORK} or {L.ARCH_UPSTREAM}", "''",
                   "general.architecture is empty"))
        else:
            add(finding(ERROR, "E_ARCH_MISSING", "general.architecture", "a STRING value", kv.type_name,
                   "general.architecture is not a string"))
        return "unknown", None, findings
    if dialect == "other":
        from mtpscope.inspector.inventory import detect_dialect

        d = detect_dialect(f)
        low = arch.lower()
        if d.kind == "other" or "assistant" in low:
            add(finding(WARNING, "W_ARCH_FOREIGN_DRAFTER", "general.architecture", f"{L.ARCH_FORK} | {L.ARCH_UPSTREAM}",
                   arch, f"drafter architecture {arch!r} is neither the fork's nor upstream's "
                   f"({'; '.join(d.evidence)}); only generic checks apply and neither runtime loads it"))
            return "other", None, findings
        add(finding(WARNING, "W_ARCH_NOT_ASSISTANT", "general.architecture", "an assistant architecture", arch,
               f"architecture {arch!r} is not a Gemma 4 drafter or target"))
        return d.kind, None, findings
    what = {"fork": "fork drafter (gemma4_assistant)", "upstream": "upstream drafter (gemma4-assistant)",
            "target": "Gemma 4 target (gemma4)"}[dialect]
    add(finding(INFO, "I_DIALECT", "general.architecture", None, arch, f"checked against the {what} layout"))

    wire = wire_type_problems(f, arch)      # llama.cpp reads these as uint32_t and refuses another type
    for key, got, why in wire:
        add(finding(ERROR, "E_KEY_VALUE", key, "u32 (llama.cpp reads it as uint32_t)", got, f"{why}: llama.cpp refuses "
                    "the file"))
    try:
        hp = L.read_hparams(f)
    except LayoutError as e:
        if e.key not in {k for k, _, _ in wire}:     # (a FLOAT32 block_count: said by its type, not as 5.6e-45)
            code = "E_KEY_VALUE" if e.actual is not None else "E_KEY_MISSING"
            add(finding(ERROR, code, e.key or "", e.expected or "present", e.actual, e.message))
        return dialect, None, findings

    # --- keys
    for suffix, sev in _required_keys(dialect, hp):
        key = f"{arch}.{suffix}"
        if f.get(key) is None:
            why = (" (llama.cpp then uses 10000 for the full-attention layers, Gemma 4 uses 1e6: it runs and "
                   "drafts wrong tokens)" if suffix == "rope.freq_base" else
                   " (the runtime needs it)" if sev == ERROR else " (a default is used)")
            add(finding(sev, "E_KEY_MISSING" if sev == ERROR else "W_KEY_MISSING", key, "present", None,
                   f"key {key} is missing" + why))
    for a, b in (("attention.key_length", "attention.value_length"),
                 ("attention.key_length_swa", "attention.value_length_swa")):
        ka, kb = key_value(f, f"{arch}.{a}"), key_value(f, f"{arch}.{b}")
        if ka is not None and kb is not None and ka != kb:
            add(finding(ERROR, "E_HEAD_DIM_KV", f"{arch}.{b}", ka, kb,
                   f"{a} = {ka} but {b} = {kb}; Gemma 4 requires equal K and V head dims"))
    if any(ly.n_head <= 0 for ly in hp.layers) and f.get(f"{arch}.attention.head_count") is not None:
        add(finding(ERROR, "E_KEY_VALUE", f"{arch}.attention.head_count", "> 0", [ly.n_head for ly in hp.layers],
               "a layer with 0 attention heads"))
    _check_number_keys(f, arch, dialect, add)
    _check_rope_dims(hp, add)
    pattern = key_value(f, f"{arch}.attention.sliding_window_pattern")
    if pattern is None:
        add(finding(ERROR, "E_SWA_PATTERN", f"{arch}.attention.sliding_window_pattern", "array of bool", None,
               "no sliding_window_pattern: layer types unknown (runtime needs it)"))
    elif not isinstance(pattern, list) or len(pattern) != hp.n_layer:
        add(finding(ERROR, "E_SWA_PATTERN", f"{arch}.attention.sliding_window_pattern", f"{hp.n_layer} bools",
               pattern if not isinstance(pattern, list) else f"{len(pattern)} values",
               "sliding_window_pattern must have one bool per block"))
    types = "".join("s" if ly.sliding else "f" for ly in hp.layers)
    add(finding(INFO, "I_LAYER_TYPES", f"{arch}.attention.sliding_window_pattern", None, types,
           f"layer types (s = sliding, f = full): {types}; head dims swa {hp.head_dim_swa}, full {hp.head_dim_full}"))
    if dialect in ("fork", "upstream"):
        _check_drafter_keys(f, hp, dialect, add)
    if dialect == "target":
        check_shared_kv(f, hp, add)

    # --- tokenizer
    _check_tokenizer(f, hp, add)

    # --- tensors vs layout
    tmap, dups = tensor_map(f)
    for name in sorted(set(dups)):
        add(finding(ERROR, "E_TENSOR_DUPLICATE", name, 1, 1 + dups.count(name), f"tensor {name} appears more than once"))
    try:
        layout = L.expected_layout(hp)
    except LayoutError as e:
        add(finding(ERROR, "E_KEY_MISSING", e.key or "", "present", None, f"no layout: {e.message}"))
        layout = ()
    if layout:
        _check_tensors(f, hp, dialect, layout, tmap, add)
    if scan_values:
        _check_values(f, hp, dialect, tmap, add, partial_rotary_factor)
    return dialect, hp, findings


#: the number keys llama.cpp reads and uses as they are, with no check of their own (a bad value loads and runs, and
#: what comes out is wrong), each as (key suffix, the dialects whose runtime reads it, whether 0 and negative values
#: are legal, what a bad value does). Paths are llama.cpp's (vendored in llama-cpp-python 0.3.36); the rule for all
#: four is :func:`inspector.hf_config.number_fault` (the config fields they are written from are read by it too).
_NUMBER_KEYS: tuple[tuple[str, tuple[str, ...], bool, str], ...] = (
    # models/gemma4.cpp, models/gemma4-assistant.cpp: ml.get_key(LLM_KV_ATTENTION_LAYERNORM_RMS_EPS,
    # hparams.f_norm_rms_eps)
    ("attention.layer_norm_rms_epsilon", ("fork", "upstream", "target"), False,
     "every RMS norm computes x / sqrt(mean(x^2) + eps), so NaN makes its outputs NaN, infinity makes them 0, and 0 or "
     "less can divide by zero or take the root of a negative number"),
    # src/llama-model.cpp (every architecture): ml.get_key(LLM_KV_ROPE_FREQ_BASE, hparams.rope_freq_base_train,
    # false); src/llama-context.cpp: cparams.rope_freq_base = params.rope_freq_base == 0.0f ?
    # hparams.rope_freq_base_train : params.rope_freq_base (the file's value unless --rope-freq-base is given), used
    # by the full-attention layers (llama_model::get_rope_freq_base); ggml's rope: theta_scale =
    # powf(freq_base, -2.0f/n_dims)
    ("rope.freq_base", ("fork", "upstream", "target"), False,
     "the full-attention layers rotate by angles in powers of freq_base^(-2/n_dims): 0 makes them infinite, a negative "
     "or NaN base NaN, and the rotated queries and keys of those layers are NaN"),
    # models/gemma4.cpp, models/gemma4-assistant.cpp: ml.get_key(LLM_KV_ROPE_FREQ_BASE_SWA,
    # hparams.rope_freq_base_train_swa, false); src/llama-model.cpp, llama_model::get_rope_freq_base: return
    # hparams.is_swa(il) ? hparams.rope_freq_base_train_swa : cparams.rope_freq_base
    ("rope.freq_base_swa", ("fork", "upstream", "target"), False,
     "the sliding-window layers rotate by angles in powers of freq_base_swa^(-2/n_dims): 0 makes them infinite, a "
     "negative or NaN base NaN, and the rotated queries and keys of those layers are NaN"),
    # models/gemma4.cpp (the target only; gemma4-assistant.cpp neither reads the key nor soft-caps):
    # ml.get_key(LLM_KV_FINAL_LOGIT_SOFTCAPPING, hparams.f_final_logit_softcapping, false), then
    # if (hparams.f_final_logit_softcapping) { scale 1/s, tanh, scale s }: 0 means no soft-capping (legal), and a
    # negative s gives s*tanh(x/s) = |s|*tanh(x/|s|), the same logits as |s|; NaN passes the if
    ("final_logit_softcapping", ("target",), True,
     "the logits are computed as s * tanh(logits / s), so NaN makes every logit NaN and an infinite s makes them "
     "inf * tanh(0) = NaN"),
)


def _check_number_keys(f: Any, arch: str, dialect: str, add: Any) -> None:
    """E_KEY_VALUE for each key of :data:`_NUMBER_KEYS` present with a value its runtime would use wrongly."""
    for suffix, dialects, zero_and_sign_ok, why in _NUMBER_KEYS:
        key = f"{arch}.{suffix}"
        v = key_value(f, key)
        if dialect in dialects and v is not None and number_fault(v, zero_and_sign_ok=zero_and_sign_ok) is not None:
            add(finding(ERROR, "E_KEY_VALUE", key, "a finite number" if zero_and_sign_ok else "a finite number > 0",
                        v, f"{suffix} is {v!r}: {why}"))


#: the integer keys llama.cpp does not read (the fork dialect's own): any type loads
_NOT_READ = frozenset({"n_embd_backbone", "n_centroids", "centroid_top_k"})
#: llama.cpp's names of GGUF value types in its loader's messages (gguf.cpp ``GGUF_TYPE_NAME``)
_LLAMA_TYPE_NAMES = {"UINT8": "u8", "INT8": "i8", "UINT16": "u16", "INT16": "i16", "UINT32": "u32", "INT32": "i32",
                     "FLOAT32": "f32", "BOOL": "bool", "STRING": "str", "ARRAY": "arr", "UINT64": "u64",
                     "INT64": "i64", "FLOAT64": "f64"}


def wire_type_problems(f: Any, arch: str) -> list[tuple[str, str, str]]:
    """``(key, type stored, llama.cpp's refusal)`` per integer hyperparameter stored as another GGUF type: llama.cpp's
    loader reads each as ``uint32_t`` and takes no other scalar type (``GGUFMeta::GKV``: "key ... has wrong type i32
    but expected type u32"); a per-layer array's elements may be INT32 or UINT32 (``get_arr``). The keys of
    :data:`layouts.INT_KEYS` but the fork's own; a file without typed values (``f.kv``) has none. The loadability
    verdict refuses with the sentences; verify says each as an ``E_KEY_VALUE``."""
    kv = getattr(f, "kv", None)
    if not isinstance(kv, Mapping):
        return []
    out = []
    for suffix in sorted(L.INT_KEYS - _NOT_READ):
        e = kv.get(f"{arch}.{suffix}")
        if e is None:
            continue
        if e.type_name == "ARRAY":
            el = getattr(e.value, "element_type_name", None)
            if el not in (None, "INT32", "UINT32"):
                got = _LLAMA_TYPE_NAMES.get(el, el)
                out.append((e.key, f"arr[{got}]", f"key {e.key} has wrong array type {got} but expected type i32 or u32"))
        elif e.type_name != "UINT32":
            got = _LLAMA_TYPE_NAMES.get(e.type_name, e.type_name)
            out.append((e.key, got, f"key {e.key} has wrong type {got} but expected type u32"))
    return out


def _check_rope_dims(hp: L.HParams, add: Any) -> None:
    """E_KEY_VALUE for a ``rope.dimension_count(_swa)`` llama.cpp cannot rotate by (:func:`layouts.rope_dims`): it
    aborts on an odd or too large one (``GGML_ASSERT``) and hangs on 0. Only layer types the file has count."""
    kinds = {ly.sliding for ly in hp.layers}
    (fk, fr, fh), (sk, sr, sh) = L.rope_dims(hp)
    for present, key, n_rot, head_dim, which in ((False in kinds, fk, fr, fh, "full-attention"),
                                                 (True in kinds, sk, sr, sh, "sliding-window")):
        why = L.rope_dim_fault(n_rot, head_dim) if present else None
        if why is not None:
            add(finding(ERROR, "E_KEY_VALUE", key, f"an even number from 2 to {head_dim}", n_rot,
                        f"the {which} layers' RoPE: {why}; llama.cpp aborts (GGML_ASSERT) or hangs on it"))


def _check_drafter_keys(f: Any, hp: L.HParams, dialect: str, add: Any) -> None:
    arch = hp.arch
    if hp.n_embd_backbone is not None:
        if hp.n_embd_backbone == hp.n_embd:
            key = f"{arch}.embedding_length_out" if dialect == "upstream" else f"{arch}.n_embd_backbone"
            add(finding(ERROR if dialect == "upstream" else WARNING, "E_BACKBONE_EQUALS_NEMBD" if dialect == "upstream"
                   else "W_KEY_VALUE", key, f"!= embedding_length ({hp.n_embd})", hp.n_embd_backbone,
                   "the backbone width equals the drafter's own width; upstream llama.cpp refuses this "
                   "('embedding_length_out must carry the target hidden size')"))
        elif hp.n_embd_backbone <= 0:
            add(finding(ERROR, "E_KEY_VALUE", f"{arch}.n_embd_backbone", "> 0", hp.n_embd_backbone, "backbone width 0"))
    if dialect == "upstream" and hp.nextn_predict_layers is not None and hp.nextn_predict_layers != hp.n_layer:
        add(finding(ERROR, "E_NEXTN_LAYERS", f"{arch}.nextn_predict_layers", hp.n_layer, hp.nextn_predict_layers,
               "nextn_predict_layers must equal block_count for a Gemma 4 assistant (the runtime only "
               "builds blocks 0..nextn_predict_layers-1)"))
    if dialect == "fork":
        req = key_value(f, f"{arch}.requires_target_arch")
        if req is not None and req != L.ARCH_TARGET:
            add(finding(WARNING, "W_KEY_VALUE", f"{arch}.requires_target_arch", L.ARCH_TARGET, req,
                   "the drafter declares a target architecture other than gemma4"))
        if hp.use_ordered_embeddings and hp.n_centroids is not None and hp.centroid_top_k is not None \
                and not 1 <= hp.centroid_top_k <= hp.n_centroids:
            add(finding(ERROR, "E_TOP_K", f"{arch}.centroid_top_k", f"1..{hp.n_centroids}", hp.centroid_top_k,
                        "centroid_top_k must be between 1 and n_centroids"))


def _check_tokenizer(f: Any, hp: L.HParams, add: Any) -> None:
    tokens = f.get("tokenizer.ggml.tokens")
    if tokens is None:
        add(finding(ERROR, "E_TOKENIZER_MISSING", "tokenizer.ggml.tokens", f"{L.GEMMA4_N_VOCAB} token strings", None,
               "no tokenizer in the file; llama.cpp cannot load it and the vocab cannot be matched to a target"))
        return
    n = len(tokens)
    model = key_value(f, "tokenizer.ggml.model")
    if model is None:
        add(finding(ERROR, "E_TOKENIZER_MISSING", "tokenizer.ggml.model", "gemma4", None, "no tokenizer.ggml.model"))
    elif model == "gemma4" and f.get("tokenizer.ggml.merges") is None:
        add(finding(ERROR, "E_TOKENIZER_MISSING", "tokenizer.ggml.merges", "BPE merges", None,
               "a gemma4 (BPE) tokenizer without merges; llama.cpp refuses it"))
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        v = f.get(key)
        if v is not None and len(v) != n:
            add(finding(ERROR, "E_TOKENIZER_LENGTHS", key, n, len(v), f"{key} has {len(v)} entries, tokens has {n}"))
    for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"):
        v = key_value(f, f"tokenizer.ggml.{key}")
        if isinstance(v, int) and not 0 <= v < n:
            add(finding(ERROR, "E_SPECIAL_TOKEN_RANGE", f"tokenizer.ggml.{key}", f"0..{n - 1}", v,
                   f"special token id {v} outside the vocabulary"))
    te = {t.name: t for t in f.tensors}.get("token_embd.weight")
    if te is not None and len(te.ne) >= 2 and te.ne[1] != n:
        add(finding(ERROR, "E_VOCAB_SIZE", "token_embd.weight", n, te.ne[1],
               f"token_embd has {te.ne[1]} rows (ne[1]) but the tokenizer has {n} tokens"))


def _alt_name_hint(name: str, dialect: str) -> str:
    if dialect == "upstream" and name in L.FORK_TO_UPSTREAM:
        return f"; this is the fork's name, upstream calls it {L.FORK_TO_UPSTREAM[name]}"
    if dialect == "fork" and name in _UPSTREAM_TO_FORK:
        return f"; this is upstream's name, the fork calls it {_UPSTREAM_TO_FORK[name]}"
    if dialect in ("fork", "upstream") and any(s in name for s in (".attn_k.", ".attn_v.", ".attn_k_norm.")):
        return "; a drafter has no K/V tensors (it reads the target's KV cache)"
    if name.startswith("blk."):
        return "; not part of a Gemma 4 block of this layout"
    low = name.lower()
    want = {"fork": "mtp.", "upstream": "nextn."}.get(dialect, "")
    for part, what in (("pre_proj", "pre_projection"), ("post_proj", "post_projection"),
                       ("centroid", "centroids"), ("ordering", "token_ordering")):
        if part in low and want:
            return (f"; looks like the {what} under a name from another converter (facts: mtp_pre_proj, "
                    f"mtp_centroids, assistant.pre_projection, ...), this dialect uses {want}{what}")
    return ""


def _check_tensors(f: Any, hp: L.HParams, dialect: str, layout: tuple[L.ExpectedTensor, ...],
                   tmap: dict[str, Any], add: Any) -> None:
    expected = {e.name: e for e in layout}
    missing_by_layer: dict[int, list[str]] = {}
    for e in layout:
        t = tmap.get(e.name)
        if t is None:
            if e.required:
                add(finding(ERROR, "E_TENSOR_MISSING", e.name, list(e.ne), None,
                       f"required tensor {e.name} is missing ({e.why})"))
                if e.layer is not None:
                    missing_by_layer.setdefault(e.layer, []).append(e.name)
            elif dialect != "target" or e.name.endswith("layer_output_scale.weight"):
                add(finding(INFO, "I_TENSOR_OPTIONAL_ABSENT", e.name, list(e.ne), None,
                       f"optional tensor {e.name} is absent"))
            continue
        ne = tuple(int(x) for x in t.ne)
        if ne != e.ne:
            code, msg = "E_TENSOR_SHAPE", f"{e.name}: expected ne {list(e.ne)} ({e.why}), found {list(ne)}"
            if e.component == "projection":
                code = "E_PROJ_SHAPE"
                if "pre_projection" in e.name and len(ne) == 2:
                    msg += (f"; it consumes concat(embedding, h) of width {ne[0]}, i.e. a backbone width of "
                            f"{ne[0] / 2:g}, but the file says n_embd_backbone = {hp.n_embd_backbone}")
                elif "post_projection" in e.name and len(ne) == 2:
                    msg += f"; it produces width {ne[1]}, but the file says n_embd_backbone = {hp.n_embd_backbone}"
            elif e.name == L.FORK_CENTROIDS:
                if ne == tuple(reversed(e.ne)) and ne != e.ne:
                    code = "E_CENTROID_TRANSPOSED"
                    msg = (f"{e.name} is stored transposed: ne {list(ne)} = (n_centroids, n_embd), the runtime "
                           f"expects ne {list(e.ne)} = (n_embd, n_centroids) (HF rows must be written as-is)")
                else:
                    code = "E_CENTROID_SHAPE"
            elif e.name == "token_embd.weight":
                code = "E_TOKEN_EMBD_SHAPE"
                if len(ne) != 2:
                    msg += "; token_embd must be rank 2"
            add(finding(ERROR, code, e.name, list(e.ne), list(ne), msg))
        if not e.type_ok(t.type_name):
            if e.ggml_types == L.ORDERING_TYPES:
                add(finding(ERROR, "E_ORDERING_TYPE", e.name, "I32", t.type_name,
                       f"{e.name} must be I32 (the runtime gathers rows with it), found {t.type_name}"))
            elif e.ggml_types == L.VECTOR_TYPES:
                then = ("llama.cpp aborts while loading (GGML_ASSERT(c->type == GGML_TYPE_F32), the RoPE frequency "
                        "factors)" if e.name == "rope_freqs.weight" else
                        "llama.cpp loads the file and aborts at the first " + ("decode" if dialect == "target" else "draft")
                        + f" (binary_op: unsupported types: dst: f32, src0: f32, src1: {t.type_name.lower()})")
                add(finding(ERROR, "E_DTYPE_VECTOR", e.name, "F32", t.type_name,
                       f"1-D tensor {e.name} must be F32, found {t.type_name}: {then}"))
            else:
                add(finding(ERROR, "E_DTYPE", e.name, "a float or quantized type", t.type_name,
                       f"{e.name} has type {t.type_name}"))
    for il, names in sorted(missing_by_layer.items()):
        n_all = sum(1 for e in layout if e.layer == il and e.required)
        add(finding(ERROR, "E_LAYER_INCOMPLETE", f"blk.{il}", n_all, n_all - len(names),
               f"block {il} has {n_all - len(names)} of its {n_all} required tensors; missing: "
               + ", ".join(n.split(".", 2)[2] for n in names)))
    for name, t in tmap.items():
        if name in expected:
            continue
        if dialect == "upstream" and name in (L.UPSTREAM_MASKED_CENTROIDS, L.UPSTREAM_MASKED_ORDERING):
            add(finding(ERROR, "E_MASKED_EMBD_UPSTREAM", name, "absent", list(t.ne),
                   f"{name}: llama-cpp-python 0.3.36 refuses an upstream drafter carrying the centroid head "
                   "(vector::_M_range_check); the upstream converter drops it"))
            continue
        if dialect == "fork" and name in (L.FORK_CENTROIDS, L.FORK_ORDERING) and not hp.use_ordered_embeddings:
            add(finding(WARNING, "W_CENTROIDS_UNUSED", name, None, list(t.ne),
                   f"{name} present while use_ordered_embeddings is off; the dense head is used"))
            continue
        m = name.split(".")
        if len(m) > 2 and m[0] == "blk" and m[1].isdigit() and int(m[1]) >= hp.n_layer:
            hint = f"; block {m[1]} is beyond block_count = {hp.n_layer}"
        else:
            hint = _alt_name_hint(name, dialect)
        add(finding(ERROR, "E_TENSOR_UNEXPECTED", name, "absent", list(t.ne),
               f"unexpected tensor {name}{hint} (llama.cpp refuses files with tensors it does not create)"))


def _check_values(f: Any, hp: L.HParams, dialect: str, tmap: dict[str, Any], add: Any,
                  partial_rotary_factor: float) -> None:
    skipped = 0
    remote = getattr(f, "reader", None) is not None
    for name, t in tmap.items():
        if t.n_bytes is None:
            continue
        if remote and name not in ("rope_freqs.weight",):  # a request per tensor: values read only for rules
            skipped += 1
            continue
        if len(t.ne) != 1 and t.n_elements > SMALL_TENSOR_ELEMENTS:
            skipped += 1
            continue
        if t.type_name in L.INTEGER_TYPES:
            continue
        a = read_small(f, name)
        if a is None:
            continue
        bad = ~np.isfinite(a.astype(np.float32, copy=False))
        if bad.any():
            first = int(np.flatnonzero(bad.ravel())[0])
            add(finding(ERROR, "E_NONFINITE", name, 0, int(bad.sum()),
                   f"{name} has {int(bad.sum())} non-finite values (first at flat index {first})"))
    if skipped:
        add(finding(INFO, "I_NONFINITE_SKIPPED", "", None, skipped,
               f"{skipped} tensors not scanned for NaN/Inf ("
               + ("a remote file: tensor data is read only where a rule needs it)" if remote else
                  f"above {SMALL_TENSOR_ELEMENTS} elements)")))

    rf = tmap.get("rope_freqs.weight")
    if rf is not None and len(rf.ne) == 1 and rf.type_name in ("F32", "F16", "BF16"):
        a = read_small(f, "rope_freqs.weight")
        if a is not None:
            _check_rope_freqs(a.astype(np.float64).ravel(), hp, add, partial_rotary_factor)

    if dialect in ("fork", "upstream"):
        c_name = L.FORK_CENTROIDS if dialect == "fork" else L.UPSTREAM_MASKED_CENTROIDS
        o_name = L.FORK_ORDERING if dialect == "fork" else L.UPSTREAM_MASKED_ORDERING
        _check_centroid_head(f, hp, tmap.get(c_name), tmap.get(o_name), add)


def _check_rope_freqs(a: np.ndarray, hp: L.HParams, add: Any, factor: float) -> None:
    """``rope_freqs`` against the proportional RoPE the hyperparameters imply
    (:func:`layouts.expected_rope_freqs`: ``head_dim_full * factor / 2`` pairs of 1.0, then 1e30, i.e.
    unrotated). Any value >= 1e29 counts as unrotated (ggml divides the angle by the factor). The first
    differing pair is reported with its expected and actual value: llama.cpp runs such a file and
    rotates the full-attention queries wrongly (checked: tests/test_runtime_verdicts.py)."""
    want = L.expected_rope_freqs(hp.head_dim_full, factor).astype(np.float64)
    n = min(a.size, want.size)
    unrot = want[:n] >= 1e29
    same = np.where(unrot, a[:n] >= 1e29, a[:n] == want[:n])
    bad = np.flatnonzero(~same)
    if not bad.size:
        return
    i = int(bad[0])
    n_rot = int((want == 1.0).sum())
    add(finding(ERROR, "E_ROPE_FREQS_VALUES", "rope_freqs.weight", {"pair": i, "value": float(want[i])},
                {"pair": i, "value": float(a[i])},
                f"rope_freqs pair {i} is {float(a[i]):g}, the hyperparameters imply {float(want[i]):g} (head_dim_full "
                f"{hp.head_dim_full} x partial factor {factor:g} / 2 = {n_rot} rotated pairs of {want.size}, the rest "
                f"unrotated); {int(bad.size)} pairs differ; llama.cpp runs and drafts silently wrong tokens"))


def check_shared_kv(f: Any, hp: L.HParams, add: Any) -> None:
    """A target's shared-KV layers (``attention.shared_kv_layers`` = s): llama.cpp lets layer ``il >= n - s``
    reuse the cache of layer ``n - s - 2`` (sliding) or ``n - s - 1`` (full) and asserts that layer is of
    the same type (src/llama-model.cpp ``reuse``, src/llama-kv-cache.cpp); otherwise, or with fewer than
    2 layers holding KV, it aborts creating a context (checked: tests/test_runtime_verdicts.py)."""
    s = hp.shared_kv_layers
    if not s:
        return
    start = hp.n_layer - s
    key = f"{hp.arch}.attention.shared_kv_layers"
    if start < 2:
        add(finding(ERROR, "E_SHARED_KV_LAYOUT", key, f"<= {hp.n_layer - 2}", s,
                    f"{s} shared-KV layers leave {max(start, 0)} layers holding KV; llama.cpp needs at least 2 and "
                    "aborts creating a context (GGML_ASSERT(hparams.n_layer_kv_from_start >= 2))"))
        return
    for ly in hp.layers[start:]:
        src = start - (2 if ly.sliding else 1)
        if hp.layers[src].sliding != ly.sliding:
            kind = "sliding" if ly.sliding else "full"
            add(finding(ERROR, "E_SHARED_KV_LAYOUT", key, f"layer {src} {kind}",
                        f"layer {src} {'sliding' if hp.layers[src].sliding else 'full'}",
                        f"shared-KV layer {ly.il} ({kind}) reuses the cache of layer {src}, which is not a {kind} "
                        "layer: llama.cpp aborts creating a context (GGML_ASSERT(map_layer_ids.find(il_reuse) != "
                        "map_layer_ids.end()) failed)"))
            return


def _check_centroid_head(f: Any, hp: L.HParams, ct: Any, ot: Any, add: Any) -> None:
    """Fork-script checks plus permutation / cluster-size checks on the ordering."""
    n_vocab = hp.n_vocab
    n_c = hp.n_centroids
    if ct is not None and n_c is None and len(ct.ne) == 2:
        n_c = int(ct.ne[1])
    if ct is not None and len(ct.ne) != 2:
        add(finding(ERROR, "E_CENTROID_SHAPE", ct.name, "rank 2", list(ct.ne), f"{ct.name} must be rank 2"))
    if n_c and n_vocab and n_vocab % n_c:
        add(finding(ERROR, "E_CENTROID_DIVISIBILITY", f"{hp.arch}.n_centroids", f"a divisor of {n_vocab}", n_c,
               f"n_vocab {n_vocab} is not a multiple of n_centroids {n_c}"))
    if ot is None:
        return
    if len(ot.ne) != 1:
        add(finding(ERROR, "E_ORDERING_LENGTH", ot.name, "rank 1", list(ot.ne), f"{ot.name} must be rank 1"))
        return
    if n_vocab is not None and ot.ne[0] != n_vocab:
        add(finding(ERROR, "E_ORDERING_LENGTH", ot.name, n_vocab, int(ot.ne[0]),
               f"{ot.name} has {ot.ne[0]} entries, n_vocab is {n_vocab}"))
        return
    if ot.type_name not in L.INTEGER_TYPES:
        return  # E_ORDERING_TYPE already reported; values are not ids
    o = read_small(f, ot.name)
    if o is None:
        return
    o = o.astype(np.int64, copy=False).ravel()
    if not o.any():
        add(finding(ERROR, "E_ORDERING_ZERO", ot.name, "a permutation of 0..n_vocab-1", "all zero",
               f"{ot.name} is all zero (the converter wrote no ordering)"))
        return
    n = o.size
    out_of_range = int(((o < 0) | (o >= n)).sum())
    if out_of_range:
        add(finding(ERROR, "E_ORDERING_RANGE", ot.name, f"0..{n - 1}", out_of_range,
               f"{out_of_range} ordering entries are outside 0..{n - 1}"))
    valid = o[(o >= 0) & (o < n)]
    counts = np.bincount(valid, minlength=n)
    n_missing = int((counts == 0).sum())
    n_repeated = int((counts > 1).sum())
    if n_missing or n_repeated:
        add(finding(ERROR, "E_ORDERING_NOT_PERMUTATION", ot.name, "each id exactly once",
               {"ids_missing": n_missing, "ids_repeated": n_repeated},
               f"{ot.name} is not a permutation: {n_missing} token ids never appear (no centroid can draft "
               f"them), {n_repeated} appear more than once"))
    if n_c and n % n_c == 0:
        vsc = n // n_c
        rows = np.sort(o.reshape(n_c, vsc), axis=1)
        distinct = 1 + (np.diff(rows, axis=1) != 0).sum(axis=1)
        ok_ids = ((rows >= 0) & (rows < n)).all(axis=1)
        sizes = np.where(ok_ids, distinct, -1)
        # a token listed in two rows belongs to both: count tokens owned by more than one centroid
        bad = np.flatnonzero(sizes != vsc)
        shared = n_repeated
        if bad.size or shared:
            add(finding(ERROR, "E_CLUSTER_SIZE", ot.name, vsc,
                   {"centroids_wrong_size": int(bad.size), "first": bad[:8].tolist(),
                    "tokens_in_several_centroids": shared},
                   f"{bad.size} centroids do not own exactly n_vocab / n_centroids = {vsc} distinct tokens"
                   + (f", {shared} tokens belong to several centroids" if shared else "")))


__all__ = ["SMALL_TENSOR_ELEMENTS", "check_file", "key_value", "read_small", "tensor_map"]
