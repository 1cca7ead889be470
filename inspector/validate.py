"""Validation of Gemma 4 drafter / target GGUFs: findings, pairing with a target, loadability verdicts.

``verify(path, target=None, hf_dir=None) -> Report`` is the one entry point (CLI ``mtpscope verify`` and
the app use it). A :class:`Report` lists :class:`Finding` records (severity ``error`` / ``warning`` /
``info``, a stable ``code``, the tensor or key concerned, expected vs actual, a message), one
:class:`Verdict` per runtime mtpscope knows, and, with a target, a :class:`Pairing`.

Checks (superset of the fork's ``scripts/verify-gemma4-assistant-gguf.py``, see
docs/reference/gemma4-assistant-facts.md §1): arch / dialect, required hyperparameter keys, the full
expected tensor list of the dialect (inspector/layouts.py: missing, unexpected, duplicated, shapes,
projection widths vs the backbone width, dtypes: 1-D F32, ordering I32), token_embd rank and width,
centroid head (shape, orientation, n_vocab % n_centroids, ordering non-zero / in range / a permutation,
every centroid owning exactly n_vocab / n_centroids tokens), rope_freqs values, non-finite values in
small tensors, tokenizer present and consistent with n_vocab.

Finding codes are stable API (tests and the app key on them); see ``CODES``.
Shapes in messages are GGUF ``ne`` order (innermost first) unless they say "numpy shape".
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mtpscope.inspector import layouts as L
from mtpscope.errors import InspectorError, LayoutError

ERROR, WARNING, INFO = "error", "warning", "info"

#: Codes of findings on a drafter that llama.cpp (llama-cpp-python 0.3.36) loads and then crashes on
#: inside ``llama_decode`` (``GGML_ABORT`` / ``GGML_ASSERT`` / segfault), whatever their severity here:
#: a 1-D tensor not in F32 (``binary_op: unsupported types: dst: f32, src0: f32, src1: f16`` at the
#: first draft step), integer / unknown types and wrong shapes of weight matrices. The one list that
#: ``mtpscope record``'s pre-flight (``traces.recorder.preflight``) refuses.
RUNTIME_CRASH_CODES = frozenset({"E_DTYPE", "E_TENSOR_SHAPE", "E_PROJ_SHAPE", "E_TOKEN_EMBD_SHAPE", "W_DTYPE_VECTOR"})

RUNTIME_UPSTREAM = "llama.cpp (llama-cpp-python 0.3.36)"
RUNTIME_FORK = "fork (atomic-llama-cpp-turboquant)"
RUNTIMES = (RUNTIME_UPSTREAM, RUNTIME_FORK)

# Tensors with at most this many elements (and every 1-D tensor) are read in full for the
# non-finite check; larger ones are skipped (reading a 20 GB file is not a validation step).
SMALL_TENSOR_ELEMENTS = 1 << 20

CODES: dict[str, str] = {
    "I_DIALECT": "which dialect / layout the file was checked against",
    "W_ARCH_NOT_ASSISTANT": "general.architecture does not name an assistant (fork script check)",
    "W_ARCH_FOREIGN_DRAFTER": "a drafter architecture mtpscope has no layout for (e.g. gemma4_mtp)",
    "E_ARCH_MISSING": "no general.architecture",
    "E_KEY_MISSING": "a hyperparameter key the runtime needs is absent",
    "W_KEY_MISSING": "a hyperparameter key normally present is absent (a default is used)",
    "E_KEY_VALUE": "a hyperparameter key has an impossible value",
    "W_KEY_VALUE": "a hyperparameter key has an unusual value",
    "E_HEAD_DIM_KV": "key_length != value_length (or the _swa pair); the runtime refuses",
    "E_BACKBONE_EQUALS_NEMBD": "embedding_length_out equals embedding_length; upstream refuses",
    "E_NEXTN_LAYERS": "nextn_predict_layers differs from block_count",
    "E_SWA_PATTERN": "attention.sliding_window_pattern missing, not bool, or of the wrong length",
    "I_LAYER_TYPES": "the layer types read from sliding_window_pattern",
    "E_TOKENIZER_MISSING": "no tokenizer (tokenizer.ggml.tokens / .model / merges)",
    "E_TOKENIZER_LENGTHS": "tokenizer arrays of different lengths",
    "E_SPECIAL_TOKEN_RANGE": "a special token id outside 0..n_vocab-1",
    "E_VOCAB_SIZE": "token_embd's n_vocab differs from the tokenizer's",
    "E_TENSOR_MISSING": "a required tensor is absent",
    "I_TENSOR_OPTIONAL_ABSENT": "an optional tensor is absent",
    "E_TENSOR_UNEXPECTED": "a tensor the layout does not have (the runtime counts tensors and refuses)",
    "E_TENSOR_DUPLICATE": "the same tensor name twice",
    "E_TENSOR_SHAPE": "a tensor with the wrong shape",
    "E_LAYER_INCOMPLETE": "a block lacks some of its tensors",
    "E_PROJ_SHAPE": "a pre/post projection whose shape does not match n_embd / the backbone width",
    "E_TOKEN_EMBD_SHAPE": "token_embd not rank 2 or its width is not embedding_length (fork script check)",
    "W_DTYPE_VECTOR": "a 1-D tensor (norm, scale, rope_freqs) not F32",
    "E_DTYPE": "a weight matrix with an integer or unknown ggml type",
    "E_MASKED_EMBD_UPSTREAM": "upstream file carrying masked_embd_* tensors (llama-cpp-python 0.3.36 refuses)",
    "W_CENTROIDS_UNUSED": "centroid tensors present while use_ordered_embeddings is off (fork script check)",
    "E_CENTROID_SHAPE": "centroid matrix shape differs from (n_embd, n_centroids)",
    "E_CENTROID_TRANSPOSED": "centroid matrix stored transposed (n_centroids, n_embd) — a converter bug",
    "E_CENTROID_DIVISIBILITY": "n_vocab is not a multiple of n_centroids",
    "E_TOP_K": "centroid_top_k not in 1..n_centroids",
    "E_ORDERING_TYPE": "token ordering not I32",
    "E_ORDERING_LENGTH": "token ordering length != n_vocab",
    "E_ORDERING_ZERO": "token ordering all zero (fork script check)",
    "E_ORDERING_RANGE": "token ordering ids outside 0..n_vocab-1",
    "E_ORDERING_NOT_PERMUTATION": "token ordering repeats ids (so others are owned by no centroid)",
    "E_CLUSTER_SIZE": "centroids that do not own exactly n_vocab / n_centroids distinct tokens",
    "E_ROPE_FREQS_VALUES": "rope_freqs not of the form [1.0 … 1.0, 1e30 … 1e30]",
    "W_ROPE_FREQS_ROTATED": "rope_freqs rotates a number of pairs other than head_dim_full·factor/2",
    "E_NONFINITE": "NaN or Inf in a small tensor",
    "I_NONFINITE_SKIPPED": "large tensors not scanned for non-finite values",
    "E_PAIR_TARGET_ARCH": "the target is not a gemma4 model",
    "E_PAIR_BACKBONE": "target embedding_length != drafter backbone width",
    "E_PAIR_VOCAB": "drafter and target vocabularies differ",
    "E_PAIR_KV_HEADS": "drafter n_head_kv of a layer type != the target's",
    "E_PAIR_HEAD_DIM": "drafter head dim of a layer type != the target's",
    "W_PAIR_WINDOW": "sliding windows differ",
    "W_PAIR_ROPE": "rope bases differ",
    "W_PAIR_KV_DONOR": "llama.cpp's KV donors (n_layer-2, n_layer-1) are not the last sliding / full layers",
    "I_PAIR_KV_DONORS": "which target layers donate K/V to the drafter",
    "H_UNMAPPED": "an HF tensor with no known GGUF name",
    "H_HF_SHAPE": "an HF tensor whose shape contradicts its own config.json",
    "H_CONFIG_INCOMPLETE": "config.json lacks a field needed to derive the layout",
    "H_NOT_DRAFTER": "HF audit of a file that is not a drafter (names mapped as upstream's)",
    "H_DROPPED": "an HF tensor this dialect's converter drops (upstream: the centroid head)",
    "H_TENSOR_MISSING": "an HF tensor whose GGUF counterpart is absent",
    "H_TENSOR_SHAPE": "GGUF ne differs from the reversed HF shape (e.g. written transposed)",
    "H_DTYPE": "GGUF type differs from what the converter must write (1-D F32, ordering I32)",
    "H_GGUF_ONLY": "a GGUF tensor with no HF source (other than converter-generated rope_freqs)",
    "H_CONFIG_MISMATCH": "a config.json value differs from the GGUF key it converts to",
}


@dataclass(frozen=True)
class Finding:
    """One validation result.

    Attributes:
        severity: ``error`` (runtime refuses or drafts wrong), ``warning`` or ``info``.
        code: stable id from :data:`CODES` (``E_PROJ_SHAPE``).
        subject: tensor name or GGUF key concerned (``""`` for the whole file).
        expected: what a valid file has there (JSON-able).
        actual: what this file has.
        message: one line for humans.
    """

    severity: str
    code: str
    subject: str
    expected: Any
    actual: Any
    message: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return {k: _jsonable(v) for k, v in dataclasses.asdict(self).items()}


@dataclass(frozen=True)
class Verdict:
    """Whether one runtime loads the file.

    Attributes:
        runtime: :data:`RUNTIME_UPSTREAM` or :data:`RUNTIME_FORK`.
        loads: True / False; None when mtpscope has no rules for this architecture in that runtime.
        reasons: why (first the error the runtime reports first, as far as known).
        basis: where the rules come from (tested against the real runtime, or documented behaviour).
    """

    runtime: str
    loads: bool | None
    reasons: tuple[str, ...]
    basis: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return {"runtime": self.runtime, "loads": self.loads, "reasons": list(self.reasons), "basis": self.basis}


@dataclass(frozen=True)
class Pairing:
    """Drafter ↔ target compatibility.

    Attributes:
        target: path of the target file.
        ok: no error findings.
        findings: the pairing findings (also included in the report's findings).
        kv_donors: target layer that donates K/V per drafter layer type under llama.cpp's rule
            (``{"sliding": n_layer-2, "full": n_layer-1}``).
        kv_donors_hf: same under HF's rule (last target layer of each type).
    """

    target: str
    ok: bool
    findings: tuple[Finding, ...]
    kv_donors: Mapping[str, int | None]
    kv_donors_hf: Mapping[str, int | None]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return {"target": self.target, "ok": self.ok, "findings": [x.to_dict() for x in self.findings],
                "kv_donors": dict(self.kv_donors), "kv_donors_hf": dict(self.kv_donors_hf)}


@dataclass(frozen=True)
class Report:
    """Everything ``verify`` found.

    Attributes:
        dialect: ``fork``, ``upstream``, ``target``, ``other`` or ``unknown``.
        ok: no finding of severity error.
        findings: all findings (file, pairing and HF audit), errors first.
        loadability: one :class:`Verdict` per runtime in :data:`RUNTIMES`.
        pairing: with a target, else None.
        path: the file checked; arch: its ``general.architecture``.
        hf_audit: with ``hf_dir``, the :class:`inspector.hf.HFAudit`, else None.
    """

    dialect: str
    ok: bool
    findings: tuple[Finding, ...]
    loadability: tuple[Verdict, ...]
    pairing: Pairing | None = None
    path: str = ""
    arch: str | None = None
    hf_audit: Any = None

    @property
    def errors(self) -> tuple[Finding, ...]:
        """Findings of severity error."""
        return tuple(x for x in self.findings if x.severity == ERROR)

    @property
    def warnings(self) -> tuple[Finding, ...]:
        """Findings of severity warning."""
        return tuple(x for x in self.findings if x.severity == WARNING)

    def codes(self) -> set[str]:
        """Set of finding codes (handy in tests)."""
        return {x.code for x in self.findings}

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict with ``dialect``, ``ok``, ``findings``, ``loadability``, ``pairing``, ..."""
        return {
            "path": self.path, "arch": self.arch, "dialect": self.dialect, "ok": self.ok,
            "findings": [x.to_dict() for x in self.findings],
            "loadability": [v.to_dict() for v in self.loadability],
            "pairing": self.pairing.to_dict() if self.pairing else None,
            "hf_audit": self.hf_audit.to_dict() if self.hf_audit is not None else None,
        }

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, tuple | list):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, float) and not np.isfinite(v):
        return str(v)
    return v


def _F(sev: str, code: str, subject: str, expected: Any, actual: Any, message: str) -> Finding:
    return Finding(sev, code, subject, _jsonable(expected), _jsonable(actual), message)


# --- small helpers over the reader -----------------------------------------------------------------

def _tensor_map(f: Any) -> tuple[dict[str, Any], list[str]]:
    """name -> TensorInfo (first occurrence) and the list of duplicated names."""
    out: dict[str, Any] = {}
    dups: list[str] = []
    for t in f.tensors:
        if t.name in out:
            dups.append(t.name)
        else:
            out[t.name] = t
    return out, dups


def _get(f: Any, key: str) -> Any:
    return L._scalar(f.get(key))


def _open(path_or_file: Any) -> Any:
    if hasattr(path_or_file, "tensors") and hasattr(path_or_file, "get"):
        return path_or_file
    from mtpscope.inspector.gguf import open_gguf
    return open_gguf(path_or_file)


def _read_small(f: Any, name: str) -> np.ndarray | None:
    try:
        return np.asarray(f.tensor_data(name))
    except InspectorError:
        return None


# --- file checks ------------------------------------------------------------------------------------

_FORK_TO_UPSTREAM = {
    "mtp.pre_projection.weight": "nextn.pre_projection.weight",
    "mtp.post_projection.weight": "nextn.post_projection.weight",
    L.FORK_CENTROIDS: L.UPSTREAM_MASKED_CENTROIDS,
    L.FORK_ORDERING: L.UPSTREAM_MASKED_ORDERING,
}
_UPSTREAM_TO_FORK = {v: k for k, v in _FORK_TO_UPSTREAM.items()}


def _required_keys(dialect: str, hp: L.HParams | None) -> list[tuple[str, str]]:
    """(key suffix, severity) the runtime reads without a default (src/llama-model.cpp, models/gemma4*.cpp)."""
    keys = [("context_length", ERROR), ("embedding_length", ERROR), ("block_count", ERROR),
            ("attention.head_count", ERROR), ("feed_forward_length", ERROR),
            ("attention.sliding_window", ERROR), ("attention.layer_norm_rms_epsilon", ERROR),
            ("attention.key_length_swa", ERROR), ("attention.value_length_swa", ERROR),
            ("attention.key_length", WARNING), ("attention.value_length", WARNING),
            ("rope.freq_base", WARNING), ("rope.freq_base_swa", WARNING)]
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
            add(_F(ERROR, "E_ARCH_MISSING", "general.architecture", "gemma4_assistant or gemma4-assistant", None,
                   "no general.architecture key"))
        elif isinstance(kv.value, str):
            add(_F(ERROR, "E_ARCH_MISSING", "general.architecture", "gemma4_assistant or gemma4-assistant", "''",
                   "general.architecture is empty"))
        else:
            add(_F(ERROR, "E_ARCH_MISSING", "general.architecture", "a STRING value", kv.type_name,
                   "general.architecture is not a string"))
        return "unknown", None, findings
    if dialect == "other":
        from mtpscope.inspector.inventory import detect_dialect

        d = detect_dialect(f)
        low = arch.lower()
        if d.kind == "other" or "assistant" in low:
            add(_F(WARNING, "W_ARCH_FOREIGN_DRAFTER", "general.architecture", "gemma4_assistant | gemma4-assistant",
                   arch, f"drafter architecture {arch!r} is neither the fork's nor upstream's "
                   f"({'; '.join(d.evidence)}); only generic checks apply and neither runtime loads it"))
            return "other", None, findings
        add(_F(WARNING, "W_ARCH_NOT_ASSISTANT", "general.architecture", "an assistant architecture", arch,
               f"architecture {arch!r} is not a Gemma 4 drafter or target"))
        return d.kind, None, findings
    what = {"fork": "fork drafter (gemma4_assistant)", "upstream": "upstream drafter (gemma4-assistant)",
            "target": "Gemma 4 target (gemma4)"}[dialect]
    add(_F(INFO, "I_DIALECT", "general.architecture", None, arch, f"checked against the {what} layout"))

    try:
        hp = L.read_hparams(f)
    except LayoutError as e:
        code = "E_KEY_VALUE" if e.actual is not None else "E_KEY_MISSING"
        add(_F(ERROR, code, e.key or "", e.expected or "present", e.actual, e.message))
        return dialect, None, findings

    # --- keys
    for suffix, sev in _required_keys(dialect, hp):
        key = f"{arch}.{suffix}"
        if f.get(key) is None:
            add(_F(sev, "E_KEY_MISSING" if sev == ERROR else "W_KEY_MISSING", key, "present", None,
                   f"key {key} is missing" + (" (the runtime needs it)" if sev == ERROR else
                                               " (a default is used)")))
    for a, b in (("attention.key_length", "attention.value_length"),
                 ("attention.key_length_swa", "attention.value_length_swa")):
        ka, kb = _get(f, f"{arch}.{a}"), _get(f, f"{arch}.{b}")
        if ka is not None and kb is not None and ka != kb:
            add(_F(ERROR, "E_HEAD_DIM_KV", f"{arch}.{b}", ka, kb,
                   f"{a} = {ka} but {b} = {kb}; Gemma 4 requires equal K and V head dims"))
    if any(ly.n_head <= 0 for ly in hp.layers) and f.get(f"{arch}.attention.head_count") is not None:
        add(_F(ERROR, "E_KEY_VALUE", f"{arch}.attention.head_count", "> 0", [ly.n_head for ly in hp.layers],
               "a layer with 0 attention heads"))
    pattern = _get(f, f"{arch}.attention.sliding_window_pattern")
    if pattern is None:
        add(_F(ERROR, "E_SWA_PATTERN", f"{arch}.attention.sliding_window_pattern", "array of bool", None,
               "no sliding_window_pattern: layer types unknown (runtime needs it)"))
    elif not isinstance(pattern, list) or len(pattern) != hp.n_layer:
        add(_F(ERROR, "E_SWA_PATTERN", f"{arch}.attention.sliding_window_pattern", f"{hp.n_layer} bools",
               pattern if not isinstance(pattern, list) else f"{len(pattern)} values",
               "sliding_window_pattern must have one bool per block"))
    types = "".join("s" if ly.sliding else "f" for ly in hp.layers)
    add(_F(INFO, "I_LAYER_TYPES", f"{arch}.attention.sliding_window_pattern", None, types,
           f"layer types (s = sliding, f = full): {types}; head dims swa {hp.head_dim_swa}, full {hp.head_dim_full}"))
    if dialect in ("fork", "upstream"):
        _check_drafter_keys(f, hp, dialect, add)

    # --- tokenizer
    _check_tokenizer(f, hp, add)

    # --- tensors vs layout
    tmap, dups = _tensor_map(f)
    for name in sorted(set(dups)):
        add(_F(ERROR, "E_TENSOR_DUPLICATE", name, 1, 1 + dups.count(name), f"tensor {name} appears more than once"))
    try:
        layout = L.expected_layout(hp)
    except LayoutError as e:
        add(_F(ERROR, "E_KEY_MISSING", e.key or "", "present", None, f"no layout: {e.message}"))
        layout = ()
    if layout:
        _check_tensors(f, hp, dialect, layout, tmap, add)
    if scan_values:
        _check_values(f, hp, dialect, tmap, add, partial_rotary_factor)
    return dialect, hp, findings


def _check_drafter_keys(f: Any, hp: L.HParams, dialect: str, add: Any) -> None:
    arch = hp.arch
    if hp.n_embd_backbone is not None:
        if hp.n_embd_backbone == hp.n_embd:
            key = f"{arch}.embedding_length_out" if dialect == "upstream" else f"{arch}.n_embd_backbone"
            add(_F(ERROR if dialect == "upstream" else WARNING, "E_BACKBONE_EQUALS_NEMBD" if dialect == "upstream"
                   else "W_KEY_VALUE", key, f"!= embedding_length ({hp.n_embd})", hp.n_embd_backbone,
                   "the backbone width equals the drafter's own width; upstream llama.cpp refuses this "
                   "('embedding_length_out must carry the target hidden size')"))
        elif hp.n_embd_backbone <= 0:
            add(_F(ERROR, "E_KEY_VALUE", f"{arch}.n_embd_backbone", "> 0", hp.n_embd_backbone, "backbone width 0"))
    if dialect == "upstream" and hp.nextn_predict_layers is not None and hp.nextn_predict_layers != hp.n_layer:
        add(_F(ERROR, "E_NEXTN_LAYERS", f"{arch}.nextn_predict_layers", hp.n_layer, hp.nextn_predict_layers,
               "nextn_predict_layers must equal block_count for a Gemma 4 assistant (the runtime only "
               "builds blocks 0..nextn_predict_layers-1)"))
    if dialect == "fork":
        req = _get(f, f"{arch}.requires_target_arch")
        if req is not None and req != "gemma4":
            add(_F(WARNING, "W_KEY_VALUE", f"{arch}.requires_target_arch", "gemma4", req,
                   "the drafter declares a target architecture other than gemma4"))
        if hp.use_ordered_embeddings and hp.n_centroids is not None and hp.centroid_top_k is not None:
            if not 1 <= hp.centroid_top_k <= hp.n_centroids:
                add(_F(ERROR, "E_TOP_K", f"{arch}.centroid_top_k", f"1..{hp.n_centroids}", hp.centroid_top_k,
                       "centroid_top_k must be between 1 and n_centroids"))


def _check_tokenizer(f: Any, hp: L.HParams, add: Any) -> None:
    tokens = f.get("tokenizer.ggml.tokens")
    if tokens is None:
        add(_F(ERROR, "E_TOKENIZER_MISSING", "tokenizer.ggml.tokens", "262144 token strings", None,
               "no tokenizer in the file; llama.cpp cannot load it and the vocab cannot be matched to a target"))
        return
    n = len(tokens)
    model = _get(f, "tokenizer.ggml.model")
    if model is None:
        add(_F(ERROR, "E_TOKENIZER_MISSING", "tokenizer.ggml.model", "gemma4", None, "no tokenizer.ggml.model"))
    elif model == "gemma4" and f.get("tokenizer.ggml.merges") is None:
        add(_F(ERROR, "E_TOKENIZER_MISSING", "tokenizer.ggml.merges", "BPE merges", None,
               "a gemma4 (BPE) tokenizer without merges; llama.cpp refuses it"))
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        v = f.get(key)
        if v is not None and len(v) != n:
            add(_F(ERROR, "E_TOKENIZER_LENGTHS", key, n, len(v), f"{key} has {len(v)} entries, tokens has {n}"))
    for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"):
        v = _get(f, f"tokenizer.ggml.{key}")
        if isinstance(v, int) and not 0 <= v < n:
            add(_F(ERROR, "E_SPECIAL_TOKEN_RANGE", f"tokenizer.ggml.{key}", f"0..{n - 1}", v,
                   f"special token id {v} outside the vocabulary"))
    te = {t.name: t for t in f.tensors}.get("token_embd.weight")
    if te is not None and len(te.ne) >= 2 and te.ne[1] != n:
        add(_F(ERROR, "E_VOCAB_SIZE", "token_embd.weight", n, te.ne[1],
               f"token_embd has {te.ne[1]} rows (ne[1]) but the tokenizer has {n} tokens"))


def _alt_name_hint(name: str, dialect: str) -> str:
    if dialect == "upstream" and name in _FORK_TO_UPSTREAM:
        return f"; this is the fork's name, upstream calls it {_FORK_TO_UPSTREAM[name]}"
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
                add(_F(ERROR, "E_TENSOR_MISSING", e.name, list(e.ne), None,
                       f"required tensor {e.name} is missing ({e.why})"))
                if e.layer is not None:
                    missing_by_layer.setdefault(e.layer, []).append(e.name)
            elif dialect != "target" or e.name.endswith("layer_output_scale.weight"):
                add(_F(INFO, "I_TENSOR_OPTIONAL_ABSENT", e.name, list(e.ne), None,
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
            add(_F(ERROR, code, e.name, list(e.ne), list(ne), msg))
        if not e.type_ok(t.type_name):
            if e.ggml_types == L.ORDERING_TYPES:
                add(_F(ERROR, "E_ORDERING_TYPE", e.name, "I32", t.type_name,
                       f"{e.name} must be I32 (the runtime gathers rows with it), found {t.type_name}"))
            elif e.ggml_types == L.VECTOR_TYPES:
                add(_F(WARNING, "W_DTYPE_VECTOR", e.name, "F32", t.type_name,
                       f"1-D tensor {e.name} should be F32, found {t.type_name}"))
            else:
                add(_F(ERROR, "E_DTYPE", e.name, "a float or quantized type", t.type_name,
                       f"{e.name} has type {t.type_name}"))
    for il, names in sorted(missing_by_layer.items()):
        n_all = sum(1 for e in layout if e.layer == il and e.required)
        add(_F(ERROR, "E_LAYER_INCOMPLETE", f"blk.{il}", n_all, n_all - len(names),
               f"block {il} has {n_all - len(names)} of its {n_all} required tensors; missing: "
               + ", ".join(n.split(".", 2)[2] for n in names)))
    for name, t in tmap.items():
        if name in expected:
            continue
        if dialect == "upstream" and name in (L.UPSTREAM_MASKED_CENTROIDS, L.UPSTREAM_MASKED_ORDERING):
            add(_F(ERROR, "E_MASKED_EMBD_UPSTREAM", name, "absent", list(t.ne),
                   f"{name}: llama-cpp-python 0.3.36 refuses an upstream drafter carrying the centroid head "
                   "(vector::_M_range_check); the upstream converter drops it"))
            continue
        if dialect == "fork" and name in (L.FORK_CENTROIDS, L.FORK_ORDERING) and not hp.use_ordered_embeddings:
            add(_F(WARNING, "W_CENTROIDS_UNUSED", name, None, list(t.ne),
                   f"{name} present while use_ordered_embeddings is off; the dense head is used"))
            continue
        m = name.split(".")
        if len(m) > 2 and m[0] == "blk" and m[1].isdigit() and int(m[1]) >= hp.n_layer:
            hint = f"; block {m[1]} is beyond block_count = {hp.n_layer}"
        else:
            hint = _alt_name_hint(name, dialect)
        add(_F(ERROR, "E_TENSOR_UNEXPECTED", name, "absent", list(t.ne),
               f"unexpected tensor {name}{hint} (llama.cpp refuses files with tensors it does not create)"))


def _check_values(f: Any, hp: L.HParams, dialect: str, tmap: dict[str, Any], add: Any,
                  partial_rotary_factor: float) -> None:
    skipped = 0
    for name, t in tmap.items():
        if t.n_bytes is None:
            continue
        if len(t.ne) != 1 and t.n_elements > SMALL_TENSOR_ELEMENTS:
            skipped += 1
            continue
        if t.type_name in L.INTEGER_TYPES:
            continue
        a = _read_small(f, name)
        if a is None:
            continue
        bad = ~np.isfinite(a.astype(np.float32, copy=False))
        if bad.any():
            first = int(np.flatnonzero(bad.ravel())[0])
            add(_F(ERROR, "E_NONFINITE", name, 0, int(bad.sum()),
                   f"{name} has {int(bad.sum())} non-finite values (first at flat index {first})"))
    if skipped:
        add(_F(INFO, "I_NONFINITE_SKIPPED", "", None, skipped,
               f"{skipped} tensors above {SMALL_TENSOR_ELEMENTS} elements not scanned for NaN/Inf"))

    rf = tmap.get("rope_freqs.weight")
    if rf is not None and len(rf.ne) == 1 and rf.type_name in ("F32", "F16", "BF16"):
        a = _read_small(f, "rope_freqs.weight")
        if a is not None:
            _check_rope_freqs(a.astype(np.float64).ravel(), hp, add, partial_rotary_factor)

    c_name = L.FORK_CENTROIDS if dialect == "fork" else (L.UPSTREAM_MASKED_CENTROIDS if dialect == "upstream" else None)
    o_name = L.FORK_ORDERING if dialect == "fork" else (L.UPSTREAM_MASKED_ORDERING if dialect == "upstream" else None)
    if dialect in ("fork", "upstream"):
        _check_centroid_head(f, hp, tmap.get(c_name), tmap.get(o_name), add)


def _check_rope_freqs(a: np.ndarray, hp: L.HParams, add: Any, factor: float) -> None:
    ones = a == 1.0
    big = a >= 1e29
    n_rot = int(np.argmin(ones)) if not ones.all() else a.size
    shape_ok = bool(ones[:n_rot].all() and big[n_rot:].all())
    if not shape_ok:
        add(_F(ERROR, "E_ROPE_FREQS_VALUES", "rope_freqs.weight", "[1.0]*n_rot + [1e30]*rest",
               a[:8].tolist(), "rope_freqs is not a run of 1.0 followed by 1e30 (proportional RoPE of the "
               "full-attention layers); drafts will be rotated wrongly"))
        return
    want = int(hp.head_dim_full * factor / 2)
    if n_rot != want:
        add(_F(WARNING, "W_ROPE_FREQS_ROTATED", "rope_freqs.weight", want, n_rot,
               f"rope_freqs rotates {n_rot} of {a.size} pairs; head_dim_full {hp.head_dim_full} × partial "
               f"factor {factor} / 2 = {want}"))


def _check_centroid_head(f: Any, hp: L.HParams, ct: Any, ot: Any, add: Any) -> None:
    """Fork-script checks plus permutation / cluster-size checks on the ordering."""
    n_vocab = hp.n_vocab
    n_c = hp.n_centroids
    if ct is not None and n_c is None and len(ct.ne) == 2:
        n_c = int(ct.ne[1])
    if ct is not None and len(ct.ne) != 2:
        add(_F(ERROR, "E_CENTROID_SHAPE", ct.name, "rank 2", list(ct.ne), f"{ct.name} must be rank 2"))
    if n_c and n_vocab and n_vocab % n_c:
        add(_F(ERROR, "E_CENTROID_DIVISIBILITY", f"{hp.arch}.n_centroids", f"a divisor of {n_vocab}", n_c,
               f"n_vocab {n_vocab} is not a multiple of n_centroids {n_c}"))
    if ot is None:
        return
    if len(ot.ne) != 1:
        add(_F(ERROR, "E_ORDERING_LENGTH", ot.name, "rank 1", list(ot.ne), f"{ot.name} must be rank 1"))
        return
    if n_vocab is not None and ot.ne[0] != n_vocab:
        add(_F(ERROR, "E_ORDERING_LENGTH", ot.name, n_vocab, int(ot.ne[0]),
               f"{ot.name} has {ot.ne[0]} entries, n_vocab is {n_vocab}"))
        return
    if ot.type_name not in L.INTEGER_TYPES:
        return  # E_ORDERING_TYPE already reported; values are not ids
    o = _read_small(f, ot.name)
    if o is None:
        return
    o = o.astype(np.int64, copy=False).ravel()
    if not o.any():
        add(_F(ERROR, "E_ORDERING_ZERO", ot.name, "a permutation of 0..n_vocab-1", "all zero",
               f"{ot.name} is all zero (the converter wrote no ordering)"))
        return
    n = o.size
    out_of_range = int(((o < 0) | (o >= n)).sum())
    if out_of_range:
        add(_F(ERROR, "E_ORDERING_RANGE", ot.name, f"0..{n - 1}", out_of_range,
               f"{out_of_range} ordering entries are outside 0..{n - 1}"))
    valid = o[(o >= 0) & (o < n)]
    counts = np.bincount(valid, minlength=n)
    n_missing = int((counts == 0).sum())
    n_repeated = int((counts > 1).sum())
    if n_missing or n_repeated:
        add(_F(ERROR, "E_ORDERING_NOT_PERMUTATION", ot.name, "each id exactly once",
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
            add(_F(ERROR, "E_CLUSTER_SIZE", ot.name, vsc,
                   {"centroids_wrong_size": int(bad.size), "first": bad[:8].tolist(),
                    "tokens_in_several_centroids": shared},
                   f"{bad.size} centroids do not own exactly n_vocab / n_centroids = {vsc} distinct tokens"
                   + (f", {shared} tokens belong to several centroids" if shared else "")))


# --- pairing ------------------------------------------------------------------------------------------

def check_pairing(drafter: Any, target: Any, hp: L.HParams | None = None) -> Pairing:
    """Drafter ↔ target checks (facts §1 "Pairing rules", src/llama-model.cpp KV sharing).

    Checks: target arch ``gemma4``; target ``embedding_length`` == drafter backbone width; identical
    vocabulary (token text, in order); per layer type (sliding / full) the drafter's ``n_head_kv`` and head
    dim equal the target's at the donor layer; windows and rope bases; which target layers donate K/V
    (llama.cpp: n_layer−2 for sliding, n_layer−1 for full; HF: last layer of each type).

    Args:
        drafter / target: open GGUF files.
        hp: drafter hparams if already read.
    """
    fs: list[Finding] = []
    add = fs.append
    tpath = os.fspath(getattr(target, "path", ""))
    donors: dict[str, int | None] = {"sliding": None, "full": None}
    donors_hf: dict[str, int | None] = {"sliding": None, "full": None}
    if target.architecture != L.ARCH_TARGET:
        add(_F(ERROR, "E_PAIR_TARGET_ARCH", "general.architecture", "gemma4", target.architecture,
               f"the target must be a gemma4 model, found {target.architecture!r}"))
        return Pairing(tpath, False, tuple(fs), donors, donors_hf)
    if hp is None:
        hp = L.read_hparams(drafter)
    try:
        thp = L.read_hparams(target)
    except LayoutError as e:
        add(_F(ERROR, "E_KEY_VALUE" if e.actual is not None else "E_KEY_MISSING", e.key or "",
               e.expected or "present", e.actual, f"target: {e.message}"))
        return Pairing(tpath, False, tuple(fs), donors, donors_hf)
    if hp.n_embd_backbone is not None and thp.n_embd != hp.n_embd_backbone:
        add(_F(ERROR, "E_PAIR_BACKBONE", "gemma4.embedding_length", hp.n_embd_backbone, thp.n_embd,
               f"the drafter expects a backbone width of {hp.n_embd_backbone}, the target's "
               f"embedding_length is {thp.n_embd}"))
    _compare_vocab(drafter, target, add)
    n = thp.n_layer
    if n >= 2:
        donors = {"sliding": n - 2, "full": n - 1}
    donors_hf = {"sliding": thp.last_layer_of(True), "full": thp.last_layer_of(False)}
    for kind, il in donors.items():
        if il is not None and thp.layers[il].sliding != (kind == "sliding"):
            add(_F(WARNING, "W_PAIR_KV_DONOR", f"blk.{il}", kind, "sliding" if thp.layers[il].sliding else "full",
                   f"llama.cpp takes {kind} K/V from target layer {il}, which is a "
                   f"{'sliding' if thp.layers[il].sliding else 'full'} layer; HF uses layer {donors_hf[kind]}"))
    add(_F(INFO, "I_PAIR_KV_DONORS", "", None, {"llama.cpp": donors, "hf": donors_hf},
           f"K/V donors: sliding ← target layer {donors['sliding']}, full ← target layer {donors['full']} "
           f"(HF: {donors_hf['sliding']}, {donors_hf['full']})"))
    for kind, sliding in (("sliding", True), ("full", False)):
        d_layers = [ly for ly in hp.layers if ly.sliding == sliding]
        il = donors_hf[kind]
        if not d_layers or il is None:
            continue
        t_ly = thp.layers[il]
        for ly in d_layers:
            if ly.n_head_kv != t_ly.n_head_kv:
                add(_F(ERROR, "E_PAIR_KV_HEADS", f"{hp.arch}.attention.head_count_kv[{ly.il}]", t_ly.n_head_kv,
                       ly.n_head_kv, f"drafter {kind} layer {ly.il} has n_head_kv {ly.n_head_kv}, the target's "
                       f"{kind} layers have {t_ly.n_head_kv}"))
            if ly.head_dim != t_ly.head_dim:
                key = "attention.key_length_swa" if sliding else "attention.key_length"
                add(_F(ERROR, "E_PAIR_HEAD_DIM", f"{hp.arch}.{key}", t_ly.head_dim, ly.head_dim,
                       f"drafter {kind} head dim {ly.head_dim} != target {t_ly.head_dim}"))
    for key, code in (("attention.sliding_window", "W_PAIR_WINDOW"), ("rope.freq_base", "W_PAIR_ROPE"),
                      ("rope.freq_base_swa", "W_PAIR_ROPE")):
        a, b = _get(drafter, f"{hp.arch}.{key}"), _get(target, f"gemma4.{key}")
        if a is not None and b is not None and a != b:
            add(_F(WARNING, code, f"{hp.arch}.{key}", b, a, f"{key}: drafter {a}, target {b}"))
    ok = not any(x.severity == ERROR for x in fs)
    return Pairing(tpath, ok, tuple(fs), donors, donors_hf)


def _compare_vocab(a: Any, b: Any, add: Any) -> None:
    ta, tb = a.get("tokenizer.ggml.tokens"), b.get("tokenizer.ggml.tokens")
    if ta is None or tb is None:
        add(_F(ERROR, "E_PAIR_VOCAB", "tokenizer.ggml.tokens", "both files carry a tokenizer",
               {"drafter": ta is not None, "target": tb is not None}, "cannot compare vocabularies"))
        return
    if len(ta) != len(tb):
        add(_F(ERROR, "E_PAIR_VOCAB", "tokenizer.ggml.tokens", len(tb), len(ta),
               f"drafter has {len(ta)} tokens, target {len(tb)}"))
        return
    from mtpscope.inspector.diff import string_array_bytes

    ra, rb = string_array_bytes(ta), string_array_bytes(tb)
    if ra is not None and ra == rb:
        return  # byte-identical token lists (the common case, no decoding of 262144 strings)
    la, lb = ta.to_list(), tb.to_list()
    if la != lb:
        diff = [i for i, (x, y) in enumerate(zip(la, lb, strict=True)) if x != y]
        add(_F(ERROR, "E_PAIR_VOCAB", "tokenizer.ggml.tokens", "identical token text", f"{len(diff)} differ",
               f"{len(diff)} token strings differ, first at id {diff[0]}: drafter {la[diff[0]]!r}, "
               f"target {lb[diff[0]]!r}"))


# --- loadability -------------------------------------------------------------------------------------

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
    model = _get(f, "tokenizer.ggml.model")
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
    reasons: list[str] = []
    for key in _runtime_keys(arch, dialect):
        if f.get(key) is None:
            reasons.append(f"key not found in model: {key}")
    reasons += _tokenizer_reasons(f)
    if reasons:
        return Verdict(RUNTIME_UPSTREAM, False, _capped(reasons), _BASIS_UPSTREAM)
    try:
        hp = L.read_hparams(f)
    except LayoutError as e:
        return Verdict(RUNTIME_UPSTREAM, False, (_layout_reason(e),), _BASIS_UPSTREAM)
    for a, b in (("attention.key_length", "attention.value_length"),
                 ("attention.key_length_swa", "attention.value_length_swa")):
        ka, kb = _get(f, f"{arch}.{a}"), _get(f, f"{arch}.{b}")
        if ka is not None and kb is not None and ka != kb:
            reasons.append(f"Gemma 4 requires n_embd_head_k == n_embd_head_v ({a} {ka}, {b} {kb})")
    tmap, dups = _tensor_map(f)
    if dups:
        reasons.append(f"duplicated tensor name '{dups[0]}'")
    unknown = [t.name for t in f.tensors if t.n_bytes is None]
    if unknown:
        reasons.append(f"tensor '{unknown[0]}' has an unknown ggml type")
    if dialect == "upstream":
        n_out = _get(f, f"{arch}.embedding_length_out")
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
    reasons = [f"key not found in model: {k}" for k in _runtime_keys(arch, dialect) if f.get(k) is None]
    reasons += _tokenizer_reasons(f)
    if reasons:
        return Verdict(RUNTIME_FORK, False, _capped(reasons), _BASIS_FORK)
    try:
        hp = L.read_hparams(f)
    except LayoutError as e:
        return Verdict(RUNTIME_FORK, False, (_layout_reason(e),), _BASIS_FORK)
    tmap, dups = _tensor_map(f)
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
    return Verdict(RUNTIME_FORK, True, (f"loads: a valid {arch} file for the fork",), _BASIS_FORK)


def loadability(f: Any) -> tuple[Verdict, ...]:
    """One :class:`Verdict` per runtime in :data:`RUNTIMES` for an open GGUF file."""
    return (upstream_verdict(f), fork_verdict(f))


# --- entry point -------------------------------------------------------------------------------------

_SEV_ORDER = {ERROR: 0, WARNING: 1, INFO: 2}


def verify(path: Any, target: Any = None, hf_dir: Any = None) -> Report:
    """Validate a drafter (or target) GGUF; optionally pair it with a target and audit an HF checkpoint.

    Args:
        path: GGUF path (or an open ``GGUFFile``).
        target: the target GGUF path / file to pair with, or None.
        hf_dir: a Hugging Face checkpoint folder (config.json + safetensors) the GGUF was converted
            from, or None.

    Returns:
        :class:`Report` (``ok`` is False when any finding is an error).

    Raises:
        GGUFFormatError / UnsupportedFileError / TensorDataError: the GGUF (or target) is unreadable.
        HFCheckpointError: the HF folder is unreadable.
    """
    f = _open(path)
    t = _open(target) if target is not None else None
    factor = L.DEFAULT_PARTIAL_ROTARY_FACTOR_FULL
    audit = None
    if hf_dir is not None:
        from mtpscope.inspector import hf as _hf
        ckpt = _hf.read_checkpoint(hf_dir)
        factor = _hf.partial_rotary_factor_full(ckpt.config) or factor
        audit = _hf.audit(ckpt, f)
    dialect, hp, findings = check_file(f, partial_rotary_factor=factor)
    pairing = None
    if t is not None:
        if hp is None or dialect not in ("fork", "upstream"):
            pairing = Pairing(os.fspath(getattr(t, "path", "")), False, (_F(
                ERROR, "E_PAIR_TARGET_ARCH", "general.architecture", "a drafter to pair", f.architecture,
                "pairing needs a drafter (gemma4_assistant / gemma4-assistant) as the first file"),), {}, {})
        else:
            pairing = check_pairing(f, t, hp)
        findings += list(pairing.findings)
    if audit is not None:
        findings += list(audit.findings)
    findings.sort(key=lambda x: _SEV_ORDER.get(x.severity, 3))
    ok = not any(x.severity == ERROR for x in findings)
    return Report(dialect=dialect, ok=ok, findings=tuple(findings), loadability=loadability(f), pairing=pairing,
                  path=os.fspath(getattr(f, "path", path)), arch=f.architecture, hf_audit=audit)
