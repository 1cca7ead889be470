"""The validation report model: severities, the finding codes, and the records ``verify`` returns.

One job: what a finding, a loadability verdict, a pairing and a report *are* (and their JSON form).
Every check module (:mod:`checks`, :mod:`pairing`, :mod:`loadability`, :mod:`hf_audit`) builds
:class:`Finding` records through :func:`finding`; :mod:`validate` assembles them into a :class:`Report`.

Finding codes are stable API (tests and the app key on them); :data:`CODES` lists every one with one line.
Shapes in ``expected`` / ``actual`` are GGUF ``ne`` lists unless a message says "numpy shape".

May import: numpy (JSON conversion of numpy scalars / arrays). Nothing else of mtpscope.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ERROR, WARNING, INFO = "error", "warning", "info"

#: sort order of severities in a report (errors first)
SEVERITY_ORDER = {ERROR: 0, WARNING: 1, INFO: 2}

#: Codes of findings on a drafter that llama.cpp (llama-cpp-python 0.3.36) loads and then crashes on
#: inside ``llama_decode`` (``GGML_ABORT`` / ``GGML_ASSERT`` / segfault), whatever their severity here:
#: a 1-D tensor not in F32 (``E_DTYPE_VECTOR``: ``binary_op: unsupported types: dst: f32, src0: f32, src1:
#: f16`` at the first draft step; F16 ``rope_freqs`` aborts the load), integer / unknown types and wrong
#: shapes of weight matrices, and a target whose shared-KV layers abort context creation
#: (``E_SHARED_KV_LAYOUT``). The one list that ``mtpscope record``'s pre-flight (``traces.run.preflight``)
#: refuses.
RUNTIME_CRASH_CODES = frozenset({"E_DTYPE", "E_TENSOR_SHAPE", "E_PROJ_SHAPE", "E_TOKEN_EMBD_SHAPE", "E_DTYPE_VECTOR",
                                 "E_SHARED_KV_LAYOUT"})

#: Codes whose subject is a tensor the expected layout has and the file lacks (a layer grid's "missing").
MISSING_CODES = frozenset({"E_TENSOR_MISSING"})
#: Codes whose subject is a tensor present with a shape other than the layout's (a layer grid's "wrong
#: shape"): any tensor, a pre/post projection, the centroid matrix (also stored transposed), token_embd.
SHAPE_CODES = frozenset({"E_TENSOR_SHAPE", "E_PROJ_SHAPE", "E_CENTROID_SHAPE", "E_CENTROID_TRANSPOSED",
                         "E_TOKEN_EMBD_SHAPE"})

CODES: dict[str, str] = {
    "I_DIALECT": "which dialect / layout the file was checked against",
    "W_ARCH_NOT_ASSISTANT": "general.architecture does not name an assistant (fork script check)",
    "W_ARCH_FOREIGN_DRAFTER": "a drafter architecture mtpscope has no layout for (e.g. gemma4_mtp)",
    "E_ARCH_MISSING": "no general.architecture",
    "E_KEY_MISSING": "a hyperparameter key the runtime needs is absent",
    "W_KEY_MISSING": "a hyperparameter key normally present is absent (a default is used)",
    "E_KEY_VALUE": "a hyperparameter key has an impossible value, or a GGUF type llama.cpp does not read it as",
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
    "E_DTYPE_VECTOR": "a 1-D tensor (norm, layer output scale, rope_freqs) not F32: llama.cpp loads the drafter "
                      "and aborts at its first draft (binary_op: unsupported types); rope_freqs aborts the load",
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
    "E_ROPE_FREQS_VALUES": "rope_freqs differs from the proportional RoPE the hyperparameters imply (first differing "
                           "pair: expected vs actual); llama.cpp runs and drafts silently wrong tokens",
    "E_NONFINITE": "NaN or Inf in a small tensor",
    "I_NONFINITE_SKIPPED": "large tensors not scanned for non-finite values",
    "E_PAIR_TARGET_ARCH": "the target is not a gemma4 model",
    "E_PAIR_BACKBONE": "target embedding_length != drafter backbone width",
    "E_PAIR_VOCAB": "drafter and target vocabularies differ",
    "E_PAIR_KV_HEADS": "drafter n_head_kv of a layer type != the target's",
    "E_PAIR_HEAD_DIM": "drafter head dim of a layer type != the target's",
    "W_PAIR_WINDOW": "sliding windows differ",
    "E_PAIR_ROPE": "drafter and target rope bases differ: the drafter's queries and the target's cached keys are "
                   "rotated differently (llama.cpp runs, drafts differ)",
    "E_PAIR_KV_DONOR": "llama.cpp's KV donors (target layers n_layer-2, n_layer-1) are not a sliding and a full "
                       "layer: the drafter silently reads another layer type's cache",
    "E_SHARED_KV_LAYOUT": "target: a shared-KV layer's source (n_layer - shared_kv_layers - 2 / - 1) is not of its "
                          "type, or fewer than 2 layers hold KV: llama.cpp aborts creating a context",
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
        return {k: jsonable(v) for k, v in dataclasses.asdict(self).items()}


def finding(severity: str, code: str, subject: str, expected: Any, actual: Any, message: str) -> Finding:
    """A :class:`Finding` whose ``expected`` / ``actual`` are made JSON-able (:func:`jsonable`).

    Args:
        severity: :data:`ERROR`, :data:`WARNING` or :data:`INFO`.
        code: a key of :data:`CODES`.
        subject: tensor name or GGUF key ("" for the whole file).
        expected / actual: any value; numpy scalars and arrays become Python values and lists, tuples
            lists, non-finite floats strings.
        message: one line for humans.
    """
    return Finding(severity, code, subject, jsonable(expected), jsonable(actual), message)


#: Verdict outcomes: the runtime loads the file and runs it; loads it and then aborts the process (at the
#: first draft step of a drafter, the first decode of a target, or creating a context); aborts the process
#: while loading it; refuses it (an error, the process goes on); no rules.
OUTCOME_LOADS = "loads"
OUTCOME_ABORTS_DRAFT = "aborts at first draft"
OUTCOME_ABORTS_DECODE = "aborts at first decode"
OUTCOME_ABORTS_CONTEXT = "aborts creating a context"
OUTCOME_ABORTS_LOAD = "aborts while loading"
OUTCOME_REFUSES = "refuses"
OUTCOME_UNKNOWN = "unknown"
OUTCOMES = (OUTCOME_LOADS, OUTCOME_ABORTS_DRAFT, OUTCOME_ABORTS_DECODE, OUTCOME_ABORTS_CONTEXT, OUTCOME_ABORTS_LOAD,
            OUTCOME_REFUSES, OUTCOME_UNKNOWN)


@dataclass(frozen=True)
class Verdict:
    """Whether one runtime loads the file, and what it does then.

    Attributes:
        runtime: ``loadability.RUNTIME_UPSTREAM`` or ``loadability.RUNTIME_FORK``.
        loads: True / False; None when mtpscope has no rules for this architecture in that runtime. True
            also for a file that loads and then aborts (see ``outcome``).
        reasons: why (first the error the runtime reports first, as far as known).
        basis: where the rules come from (tested against the real runtime, or documented behaviour).
        outcome: one of :data:`OUTCOMES` (default: ``loads`` / ``refuses`` / ``unknown`` from ``loads``).
        message: for an abort, the runtime's own message (``binary_op: unsupported types: ...``).
    """

    runtime: str
    loads: bool | None
    reasons: tuple[str, ...]
    basis: str
    outcome: str = ""
    message: str | None = None

    def __post_init__(self) -> None:
        if not self.outcome:
            object.__setattr__(self, "outcome", {True: OUTCOME_LOADS, False: OUTCOME_REFUSES,
                                                 None: OUTCOME_UNKNOWN}[self.loads])

    @property
    def runs(self) -> bool:
        """Loads and does not abort."""
        return self.outcome == OUTCOME_LOADS

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return {"runtime": self.runtime, "loads": self.loads, "outcome": self.outcome, "message": self.message,
                "reasons": list(self.reasons), "basis": self.basis}


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
        kv_cache / kv_cache_hf: the target layer whose K/V cache the drafter really reads, per type: the donor
            resolved through the target's own KV sharing (``attention.shared_kv_layers``; E2B / E4B) under
            llama.cpp's ``reuse`` rule / HF's ``"store"`` layer. Equal to the donors when nothing is shared.
    """

    target: str
    ok: bool
    findings: tuple[Finding, ...]
    kv_donors: Mapping[str, int | None]
    kv_donors_hf: Mapping[str, int | None]
    kv_cache: Mapping[str, int | None] = field(default_factory=dict)
    kv_cache_hf: Mapping[str, int | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return {"target": self.target, "ok": self.ok, "findings": [x.to_dict() for x in self.findings],
                "kv_donors": dict(self.kv_donors), "kv_donors_hf": dict(self.kv_donors_hf),
                "kv_cache": dict(self.kv_cache), "kv_cache_hf": dict(self.kv_cache_hf)}


@dataclass(frozen=True)
class Report:
    """Everything ``verify`` found.

    Attributes:
        dialect: ``fork``, ``upstream``, ``target``, ``other`` or ``unknown``.
        ok: no finding of severity error.
        findings: all findings (file, pairing and HF audit), errors first.
        loadability: one :class:`Verdict` per runtime in ``loadability.RUNTIMES``.
        pairing: with a target, else None.
        path: the file checked; arch: its ``general.architecture``.
        hf_audit: with ``hf_dir``, the :class:`mtpscope.inspector.hf_audit.HFAudit`, else None.
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


def jsonable(v: Any) -> Any:
    """``v`` with numpy scalars / arrays as Python values / lists, tuples as lists, dict keys as str and
    non-finite floats as strings (``"nan"``, ``"inf"``): what :class:`Finding` stores."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, tuple | list):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, float) and not np.isfinite(v):
        return str(v)
    return v


__all__ = ["CODES", "ERROR", "INFO", "MISSING_CODES", "RUNTIME_CRASH_CODES", "SEVERITY_ORDER", "SHAPE_CODES", "WARNING",
           "Finding", "Pairing", "Report", "Verdict", "finding", "jsonable"]
