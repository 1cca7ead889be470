"""Train the demo pair: a tiny Gemma 4 target and its MTP drafter, on real text with the real tokenizer.

The recipe (deterministic given the seed, on one CPU thread; torch + transformers 5.24 from the
``parity`` extra):

1. **Corpus** (:mod:`mtpscope.demo.corpus`): stdlib sources, ``pydoc_data.topics`` and the license,
   generated JSON records and number lists, conversations rendered with the Gemma 4 chat template.
2. **Tokens**: llama.cpp's own tokenizer on a vocab-only load of ``ggml-vocab-gemma-4.gguf``
   (:class:`VocabTokenizer`): BOS + the text (special tokens parsed only in the chat part), packed
   into a stream cut into ``seq_len`` windows.
3. **Compact vocabulary** (:class:`CompactVocab`): the models are trained over the ids the stream
   uses at least ``min_count`` times (plus the special tokens the demo needs), each with a row, and
   one shared row for the rarer ids seen. The full model has 262,144 rows: the kept rows, a copy of
   the shared row for every rare id, and zero rows for the unused ids, so each unused id gets logit
   exactly 0 (``tanh(0) = 0`` under the soft-cap too). The loss accounts for both with fixed logit
   offsets (``log(n_rare)`` on the shared row, one more logit ``log(n_unused)``:
   :func:`compact_cross_entropy`), which makes the compact softmax equal to the full one.
4. **Target** ``Gemma4ForCausalLM``: next-token cross-entropy.
5. **Drafter** ``Gemma4AssistantForCausalLM`` on the frozen target, as transformers' assisted generation
   (``SinglePositionMultiTokenCandidateGenerator``) and llama.cpp run it: for every window position
   ``t``, step 1 reads the target's post-norm hidden state at ``t`` and the (scaled, target-embedded)
   token ``t+1``, at position ``t+1``; step ``k`` reads the token ``t+k`` and step ``k-1``'s own
   ``post_projection`` output, at the same position ``t+1``. Every step attends to the target's K/V
   of its last sliding and last full layer over positions ``<= t`` (sliding: llama.cpp's window, the
   last ``sliding_window - 1`` of them). The loss is cross-entropy against the target's greedy token
   at ``t+k`` (the token a greedy verifier accepts), summed over ``k = 1..n_draft``. The multi-query
   forward (:func:`drafter_forward`) is transformers' own drafter text model with per-query masks;
   ``tests/test_demo_train.py`` checks it against the drafter's one-query-per-call forward.
6. **Centroid head**: the 262,144 ids in 2048 clusters of 128 (a permutation of all ids: used ids
   clustered by their drafter embedding rows, balanced, unused ids spread over the clusters), and
   ``centroids`` trained so that the top-k clusters hold the target's token (:func:`fit_centroid_head`).

Outputs (:func:`save_compact`): ``target.safetensors`` / ``drafter.safetensors`` (HF names, F16,
compact rows), ``ids.safetensors`` (``ids`` I32: compact row -> real token id; ``ordering`` I32, the
centroid head's permutation), ``target.json`` / ``drafter.json`` (HF configs for the full 262,144
vocabulary), ``prompts.json`` (the categorised demo prompts, text and ids) and ``recipe.json``
(everything the run used, file hashes, wall times and the measured numbers).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.cache import sha256_file
from mtpscope.errors import MtpscopeError
from mtpscope.demo import corpus as demo_corpus
from mtpscope.demo.spec import TRAINED_DATA

try:  # torch / transformers come with the parity extra; importing this module needs them
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover - depends on the environment
    raise MtpscopeError("training the demo pair needs torch and transformers (pip install -e '.[parity]')") from e

N_VOCAB = 262144
BOS, EOS, PAD = 2, 1, 0
#: special tokens always in the compact vocabulary (pad, eos, bos, unk, mask, the chat turn markers)
SPECIAL_IDS = (0, 1, 2, 3, 4, 105, 106)
DATA_DIR = TRAINED_DATA  # the one home of the compact checkpoints: mtpscope.demo.spec


# --------------------------------------------------------------------------------------------------
# recipe


@dataclass(frozen=True)
class TargetShape:
    """The target's hyperparameters (an E-series Gemma 4 scaled down).

    ``pattern``: one letter per layer, ``s`` sliding / ``f`` full attention. K = V on full layers
    (``attention_k_eq_v``), proportional RoPE (25 % of the full layers' pairs rotate), soft-cap 30.
    """

    n_embd: int = 128
    pattern: str = "ssfssf"
    n_head: int = 4
    n_head_kv: int = 2          # sliding layers
    n_head_kv_full: int = 1     # full layers (num_global_key_value_heads, with k_eq_v)
    head_dim: int = 32          # sliding layers
    head_dim_full: int = 64
    n_ff: int = 512
    sliding_window: int = 128
    softcap: float = 30.0
    n_ctx: int = 2048


@dataclass(frozen=True)
class DrafterShape:
    """The drafter's hyperparameters: 4 layers ``[s, s, s, f]`` reading the target's K/V (so its head
    dims and KV head counts are the target's), dense tied LM head plus a centroid head."""

    n_embd: int = 64
    n_head: int = 4
    n_ff: int = 256
    n_centroids: int = 2048
    top_k: int = 32


@dataclass(frozen=True)
class Recipe:
    """Everything a training run depends on besides the interpreter's own files and the tokenizer.

    Steps count optimizer updates; ``*_batch`` is windows of ``seq_len`` tokens per update.
    """

    seed: int = 0
    target: TargetShape = field(default_factory=TargetShape)
    drafter: DrafterShape = field(default_factory=DrafterShape)
    seq_len: int = 256
    budget: dict[str, int] = field(default_factory=lambda: dict(demo_corpus.DEFAULT_BUDGET))
    target_steps: int = 450
    target_batch: int = 16
    target_lr: float = 3e-3
    drafter_steps: int = 400
    drafter_batch: int = 8
    drafter_lr: float = 3e-3
    n_draft: int = 3
    centroid_steps: int = 300
    min_count: int = 2
    random_docs: int = 6
    random_words: int = 160
    random_copies: int = 8
    random_pool: int = 128
    prompt_candidates: int = 30
    prompts_per_category: int = 6
    threads: int = 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (recorded in ``recipe.json``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Recipe:
        """Inverse of :meth:`to_dict` (unknown keys are an error)."""
        d = dict(d)
        t = TargetShape(**d.pop("target", {}))
        dr = DrafterShape(**d.pop("drafter", {}))
        return cls(target=t, drafter=dr, **d)


# --------------------------------------------------------------------------------------------------
# tokenizer: llama.cpp, vocab only


class VocabTokenizer:
    """llama.cpp's tokenizer on a vocab-only load of a GGUF (the real Gemma 4 tokenizer).

    Args:
        path: a GGUF carrying ``tokenizer.*`` keys (default: the cached ``ggml-vocab-gemma-4.gguf``).

    Raises:
        RuntimeUnavailableError: llama-cpp-python missing.
        MtpscopeError: llama.cpp could not load the vocabulary.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        from mtpscope.traces.run.llama_runtime import llama  # noqa: PLC0415 - the one place that imports llama_cpp

        if path is None:
            from mtpscope.cache import vocab_path  # noqa: PLC0415

            path = vocab_path()
        self.path = Path(path)
        self._lc = lc = llama()
        params = lc.llama_model_default_params()
        params.vocab_only = True
        self._model = lc.llama_model_load_from_file(os.fspath(self.path).encode(), params)
        if not self._model:
            raise MtpscopeError("llama.cpp could not load the vocabulary", path=self.path)
        self._vocab = lc.llama_model_get_vocab(self._model)
        self.n_vocab = int(lc.llama_vocab_n_tokens(self._vocab))

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        """Token ids of ``text`` without BOS (``special``: parse ``<|turn>`` & co. as special tokens)."""
        lc = self._lc
        data = text.encode("utf-8")
        cap = len(data) + 16
        while True:
            arr = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self._vocab, data, len(data), arr, cap, False, special)
            if n >= 0:
                return list(arr[:n])
            cap = -n

    def piece(self, token: int) -> bytes:
        """The bytes of one token (special tokens rendered)."""
        lc = self._lc
        buf = ctypes.create_string_buffer(64)
        n = lc.llama_token_to_piece(self._vocab, int(token), buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lc.llama_token_to_piece(self._vocab, int(token), buf, len(buf), 0, True)
        return buf.raw[:n]

    def text(self, tokens: Iterable[int]) -> str:
        """Decoded text of ``tokens`` (UTF-8, invalid bytes replaced)."""
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        """llama.cpp's end-of-generation test (``<eos>``, ``<turn|>``, ...)."""
        return bool(self._lc.llama_vocab_is_eog(self._vocab, int(token)))

    def eog_ids(self) -> list[int]:
        """All end-of-generation ids of the vocabulary."""
        return [i for i in range(self.n_vocab) if self.is_eog(i)]

    def close(self) -> None:
        """Free the llama.cpp model (idempotent)."""
        if getattr(self, "_model", None):
            self._lc.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> VocabTokenizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def chat_template(vocab_gguf: str | os.PathLike[str]) -> str:
    """``tokenizer.chat_template`` of the tokenizer GGUF.

    Raises:
        MtpscopeError: the file has no chat template.
    """
    from mtpscope.inspector.gguf import open_gguf  # noqa: PLC0415

    with open_gguf(vocab_gguf) as f:
        t = f.get("tokenizer.chat_template")
    if isinstance(t, str) and t:
        return t
    raise MtpscopeError("the tokenizer GGUF has no chat template", path=vocab_gguf, key="tokenizer.chat_template")


@dataclass(frozen=True, eq=False)
class TokenStream:
    """The tokenized corpus: ``ids`` np.int32[n] (real ids), ``category`` np.int8[n] (index into
    :data:`mtpscope.demo.corpus.CATEGORIES`), ``n_docs``."""

    ids: np.ndarray
    category: np.ndarray
    n_docs: int

    def counts(self) -> dict[str, int]:
        """Tokens per category."""
        c = np.bincount(self.category, minlength=len(demo_corpus.CATEGORIES))
        return {name: int(c[i]) for i, name in enumerate(demo_corpus.CATEGORIES) if c[i]}


def tokenize_corpus(docs: Sequence[demo_corpus.Document], tok: VocabTokenizer) -> TokenStream:
    """BOS + tokens of each document + EOS, concatenated (chat documents start with their own ``<bos>``).
    The EOS teaches the target to end a finished document (an end-of-generation token) rather than run on."""
    ids: list[np.ndarray] = []
    cats: list[np.ndarray] = []
    for d in docs:
        chat = d.category == "chat"
        x = tok.tokenize(d.text, special=chat)
        if not chat or not x or x[0] != BOS:
            x = [BOS, *x]
        a = np.asarray([*x, EOS], dtype=np.int32)
        ids.append(a)
        cats.append(np.full(len(a), demo_corpus.CATEGORIES.index(d.category), dtype=np.int8))
    return TokenStream(np.concatenate(ids), np.concatenate(cats), len(docs))


@dataclass(frozen=True, eq=False)
class CompactVocab:
    """The rows the models are trained over, and how they map to the 262,144 real ids.

    Attributes:
        ids: np.int32[n_kept], sorted real ids with a row of their own (row i is ``ids[i]``).
        rare: np.int32[n_rare], sorted real ids seen fewer than ``min_count`` times; they share one
            row, ``n_kept`` (in the full model each of them carries a copy of it).
        n_vocab: the full vocabulary (262,144).

    Every other id is *unused*: a zero row in the full model, logit exactly 0. Row ``n_rows`` is the
    label of "an unused id" in :func:`compact_cross_entropy`.
    """

    ids: np.ndarray
    rare: np.ndarray
    n_vocab: int = N_VOCAB

    @property
    def n_kept(self) -> int:
        return len(self.ids)

    @property
    def n_rows(self) -> int:
        """Rows of the compact models: the kept ids and the shared rare row."""
        return len(self.ids) + 1

    @property
    def n_unused(self) -> int:
        return self.n_vocab - len(self.ids) - len(self.rare)

    def rows(self, real: np.ndarray | Sequence[int], *, unused: int | None = None) -> np.ndarray:
        """Real ids -> compact rows (np.int64; rare ids -> ``n_kept``).

        Args:
            unused: the row to give unused ids; None raises instead.

        Raises:
            MtpscopeError: an unused id and ``unused`` is None.
        """
        real = np.asarray(real, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.ids, real), len(self.ids) - 1)
        kept = self.ids[pos] == real
        rpos = np.minimum(np.searchsorted(self.rare, real), max(len(self.rare) - 1, 0))
        is_rare = (self.rare[rpos] == real) if len(self.rare) else np.zeros(real.shape, bool)
        out = np.where(kept, pos, np.where(is_rare, self.n_kept, -1))
        if (out < 0).any():
            if unused is None:
                raise MtpscopeError("token id outside the compact vocabulary", key="ids",
                                    actual=int(real[out < 0].reshape(-1)[0]))
            out = np.where(out < 0, unused, out)
        return out.astype(np.int64)

    def real(self, row: int) -> int:
        """The real id the full model's greedy choice lands on for a compact row: kept -> its id, the rare
        row -> the lowest rare id (ties go to the first index, as in torch and llama.cpp), ``n_rows`` ->
        the lowest unused id."""
        if row < self.n_kept:
            return int(self.ids[row])
        if row == self.n_kept and len(self.rare):
            return int(self.rare[0])
        used = np.union1d(self.ids, self.rare)
        free = np.setdiff1d(np.arange(min(self.n_vocab, len(used) + 1)), used)
        return int(free[0])

    def log_offsets(self) -> torch.Tensor:
        """Per-row log multiplicity added to the logits in the loss: 0 for kept rows, ``log(n_rare)``
        for the shared rare row."""
        off = torch.zeros(self.n_rows)
        off[-1] = math.log(len(self.rare)) if len(self.rare) else -1e30
        return off


def random_word_pool(stream: TokenStream, vocab: CompactVocab, tok: VocabTokenizer, n: int,
                     rng: np.random.Generator, n_candidates: int = 1000) -> np.ndarray:
    """``n`` word tokens (a leading space and letters, at least 3 bytes) drawn from the ``n_candidates``
    most frequent ones of the stream: the vocabulary of the ``random`` documents and prompts."""
    u, c = np.unique(stream.ids, return_counts=True)
    order = u[np.argsort(-c, kind="stable")]
    cands = []
    for t in order:
        p = tok.piece(int(t))
        if len(p) >= 3 and p[:1] == b" " and p[1:].isalpha() and p[1:].isascii():
            cands.append(int(t))
            if len(cands) >= n_candidates:
                break
    cands = np.asarray(cands, dtype=np.int32)
    cands = cands[np.isin(cands, vocab.ids)]
    return np.sort(rng.choice(cands, min(n, len(cands)), replace=False))


def random_documents(pool: np.ndarray, n_docs: int, n_words: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``n_docs`` documents of ``n_words`` words drawn uniformly from ``pool`` (BOS, words, EOS): text
    without any rule, which the target could only learn by heart (with the recipe's copies it does not:
    docs/DEMO.md)."""
    return [np.concatenate([[BOS], rng.choice(pool, n_words), [EOS]]).astype(np.int32) for _ in range(n_docs)]


def add_random_documents(stream: TokenStream, docs: Sequence[np.ndarray], rng: np.random.Generator,
                         copies: int = 1) -> TokenStream:
    """Insert ``copies`` copies of each of ``docs`` (:func:`random_documents`, category ``random``) between
    the stream's documents at seeded places. With the recipe's 8 copies the target does *not* learn them
    by heart: cut from one, it continues with a word or two of the document and then other words of the
    pool, without a loop, unsure at almost every position (docs/DEMO.md); the drafter cannot follow
    either: the demo's unpredictable category, where both models are unsure ("hard", not "wrong")."""
    docs = [d for d in docs for _ in range(copies)]
    starts = np.flatnonzero(stream.ids == BOS)
    parts_ids = np.split(stream.ids, starts[1:])
    parts_cat = np.split(stream.category, starts[1:])
    rnd_cat = demo_corpus.CATEGORIES.index("random")
    extra = [(int(rng.integers(0, len(parts_ids) + 1)), d) for d in docs]
    for at, doc in sorted(extra, key=lambda e: -e[0]):
        parts_ids.insert(at, doc)
        parts_cat.insert(at, np.full(len(doc), rnd_cat, dtype=np.int8))
    return TokenStream(np.concatenate(parts_ids), np.concatenate(parts_cat), stream.n_docs + len(extra))


def compact_vocab(stream_ids: np.ndarray, *, min_count: int = 5, keep: Iterable[int] = SPECIAL_IDS) -> CompactVocab:
    """The compact vocabulary of a token stream: ids seen at least ``min_count`` times (and ``keep``)
    get a row; the other ids seen share the rare row."""
    u, n = np.unique(stream_ids, return_counts=True)
    kept = np.union1d(u[n >= min_count], np.asarray(list(keep), dtype=np.int64)).astype(np.int32)
    rare = np.setdiff1d(u, kept).astype(np.int32)
    return CompactVocab(kept, rare)


# --------------------------------------------------------------------------------------------------
# configs and models


def target_config(shape: TargetShape, vocab_size: int) -> dict[str, Any]:
    """The target's ``gemma4_text`` config (transformers 5.24 field names) for ``vocab_size`` rows."""
    types = ["sliding_attention" if c == "s" else "full_attention" for c in shape.pattern]
    return {
        "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "vocab_size": int(vocab_size),
        "hidden_size": shape.n_embd, "intermediate_size": shape.n_ff, "num_hidden_layers": len(types),
        "num_attention_heads": shape.n_head, "num_key_value_heads": shape.n_head_kv,
        "num_global_key_value_heads": shape.n_head_kv_full, "head_dim": shape.head_dim,
        "global_head_dim": shape.head_dim_full, "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": shape.n_ctx, "rms_norm_eps": 1e-6, "sliding_window": shape.sliding_window,
        "layer_types": types, "final_logit_softcapping": shape.softcap, "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": 0, "attention_k_eq_v": True, "num_kv_shared_layers": 0,
        "enable_moe_block": False, "use_double_wide_mlp": False, "tie_word_embeddings": True,
        "pad_token_id": PAD, "eos_token_id": EOS, "bos_token_id": BOS, "initializer_range": 0.02,
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                               "rope_theta": 1000000.0}},
    }


def drafter_config(shape: DrafterShape, target: TargetShape, vocab_size: int, *,
                   centroids: bool = False) -> dict[str, Any]:
    """The drafter's ``gemma4_assistant`` config: 4 layers ``[s, s, s, f]`` all reading shared K/V,
    no soft-cap, backbone width = the target's ``n_embd``."""
    tc = target_config(target, vocab_size)
    tc.update({"architectures": None, "hidden_size": shape.n_embd, "intermediate_size": shape.n_ff,
               "num_hidden_layers": 4, "num_attention_heads": shape.n_head, "final_logit_softcapping": None,
               "layer_types": ["sliding_attention"] * 3 + ["full_attention"], "num_kv_shared_layers": 4})
    del tc["architectures"]
    return {"model_type": "gemma4_assistant", "architectures": ["Gemma4AssistantForCausalLM"], "text_config": tc,
            "backbone_hidden_size": target.n_embd, "use_ordered_embeddings": bool(centroids),
            "num_centroids": shape.n_centroids, "centroid_intermediate_top_k": shape.top_k,
            "tie_word_embeddings": True}


def make_target(cfg: dict[str, Any]) -> Any:
    """A fresh ``Gemma4ForCausalLM`` (fp32, eager attention) from a config dict."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig  # noqa: PLC0415

    c = Gemma4TextConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    c._attn_implementation = "eager"
    return Gemma4ForCausalLM(c).float()


def make_drafter(cfg: dict[str, Any]) -> Any:
    """A fresh ``Gemma4AssistantForCausalLM`` (fp32, eager attention) from a config dict."""
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM  # noqa: PLC0415

    c = Gemma4AssistantConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    c._attn_implementation = "eager"
    c.get_text_config()._attn_implementation = "eager"
    return Gemma4AssistantForCausalLM(c).float()


# --------------------------------------------------------------------------------------------------
# losses and forwards


def compact_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, vocab: CompactVocab,
                          reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of the full-vocabulary model computed on compact logits.

    The full model's softmax over 262,144 ids equals a softmax over the compact rows with the rare
    row's logit raised by ``log(n_rare)`` (its copies) and one more logit ``log(n_unused)`` (the unused
    ids' zero logits); the loss of a rare label is that of "one of the rare ids".

    Args:
        logits: [N, n_rows] (after any soft-cap).
        labels: [N] compact rows, ``n_kept`` for a rare id, ``n_rows`` for an unused id.
        vocab: the compact vocabulary.
    """
    off = vocab.log_offsets().to(logits.dtype)
    bucket = logits.new_full((logits.shape[0], 1), math.log(vocab.n_unused) if vocab.n_unused else -1e30)
    return F.cross_entropy(torch.cat([logits + off, bucket], dim=1), labels, reduction=reduction)


def full_argmax(logits: torch.Tensor) -> torch.Tensor:
    """The full model's greedy choice seen from compact logits [..., n_rows]: the compact argmax (the
    rare row standing for its lowest id), or ``n_rows`` (an unused id, logit 0) when every compact
    logit is below 0."""
    best, arg = logits.max(dim=-1)
    return torch.where(best < 0, torch.full_like(arg, logits.shape[-1]), arg)


def target_pass(tm: Any, ids: torch.Tensor, *, logits: bool = True) -> dict[str, Any]:
    """One teacher-forced target forward over windows ``ids`` [B, T] (compact rows, position 0 = first).

    Returns ``{"h": [B, T, n_embd] post-norm hidden, "kv": {"sliding_attention": (K, V),
    "full_attention": (K, V)} each [B, n_head_kv, T, head_dim] (K after k_norm + RoPE, V after
    v_norm: what the drafter reads), "logits": [B, T, n_compact] soft-capped (if asked)}``.
    """
    out = tm.model(input_ids=ids, use_cache=False, return_shared_kv_states=True)
    res: dict[str, Any] = {"h": out.last_hidden_state, "kv": dict(out.shared_kv_states)}
    if logits:
        lg = tm.lm_head(out.last_hidden_state)
        cap = tm.config.final_logit_softcapping
        res["logits"] = torch.tanh(lg / cap) * cap if cap else lg
    return res


def drafter_masks(n_query: int, n_kv: int, sliding_window: int, *, offset: int = 0,
                  dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Additive attention masks [1, 1, n_query, n_kv] (0 visible, dtype's min hidden) for queries whose
    base is ``t = offset + q``: full layers see key positions ``j <= t``, sliding layers those with
    ``t + 1 - j < sliding_window`` too (llama.cpp's rule for a query at position ``t + 1``)."""
    t = torch.arange(n_query)[:, None] + offset
    j = torch.arange(n_kv)[None, :]
    full = j <= t
    swa = full & (t + 1 - j < sliding_window)
    neg = torch.finfo(dtype).min

    def add(m: torch.Tensor) -> torch.Tensor:
        return torch.where(m, torch.zeros((), dtype=dtype), torch.full((), neg, dtype=dtype))[None, None]

    return {"full_attention": add(full), "sliding_attention": add(swa)}


def drafter_forward(dm: Any, emb: torch.Tensor, h: torch.Tensor, pos: torch.Tensor,
                    kv: dict[str, tuple[torch.Tensor, torch.Tensor]],
                    masks: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Many drafter queries at once, through transformers' own drafter modules.

    Args:
        dm: ``Gemma4AssistantForCausalLM``.
        emb: [B, Q, n_bb] the target's scaled embeddings of the fed tokens.
        h: [B, Q, n_bb] the hidden rows fed with them.
        pos: [B, Q] RoPE positions.
        kv: the target's shared K/V, ``{"sliding_attention": (K, V), "full_attention": (K, V)}``,
            each [B, n_head_kv, T, head_dim].
        masks: additive masks per layer type, broadcastable to [B, 1, Q, T] (:func:`drafter_masks`).

    Returns:
        (dense logits [B, Q, n_vocab of dm], h_next [B, Q, n_bb] (post_projection), h_inner [B, Q, n_embd]).
    """
    x = dm.pre_projection(torch.cat([emb, h], dim=-1))
    # logits_to_keep=slice(None): with an int, transformers 5.24 slices per-layer inputs that a drafter
    # does not have (TypeError 'NoneType' object is not subscriptable)
    out = dm.model(inputs_embeds=x, attention_mask=masks, position_ids=pos, shared_kv_states=dict(kv),
                   use_cache=False, logits_to_keep=slice(None))
    hi = out.last_hidden_state
    return dm.lm_head(hi), dm.post_projection(hi), hi


def drafter_chain(dm: Any, tm: Any, ids: torch.Tensor, tp: dict[str, Any], n_draft: int,
                  sliding_window: int, *, feed: torch.Tensor | None = None) -> list[dict[str, torch.Tensor]]:
    """The drafter's ``n_draft`` chained steps for every base position of windows ``ids`` [B, T].

    Step k (1-based) at base t feeds token ``feed[:, t + k]`` (default: ``ids``, teacher forcing) and
    step k-1's h_next (step 1: the target's h at t), all at position t + 1, over the target's K/V at
    positions <= t. Returns per step ``{"logits": [B, T-k, V], "h_next": ..., "h_inner": ...}`` for bases
    t = 0..T-1-k.
    """
    B, T = ids.shape
    feed = ids if feed is None else feed
    emb_all = tm.model.embed_tokens(feed)
    pos = (torch.arange(T - 1) + 1)[None].expand(B, -1)
    masks = drafter_masks(T - 1, T, sliding_window)
    h = tp["h"][:, : T - 1]
    out = []
    for k in range(1, n_draft + 1):
        q = T - k
        lg, hn, hi = drafter_forward(dm, emb_all[:, k: k + q], h[:, :q], pos[:, :q], tp["kv"],
                                     {n: m[:, :, :q] for n, m in masks.items()})
        out.append({"logits": lg, "h_next": hn, "h_inner": hi})
        h = hn
    return out


# --------------------------------------------------------------------------------------------------
# training


def _lr(step: int, total: int, peak: float, warmup: int = 40) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    x = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, x))))


def windows(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """Non-overlapping windows of the stream: np.int64[n_windows, seq_len]."""
    n = len(stream) // seq_len
    return np.asarray(stream[: n * seq_len], dtype=np.int64).reshape(n, seq_len)


def _batches(n: int, batch: int, steps: int, rng: np.random.Generator) -> Iterable[np.ndarray]:
    order = np.array([], dtype=np.int64)
    for _ in range(steps):
        if len(order) < batch:
            order = np.concatenate([order, rng.permutation(n)])
        idx, order = order[:batch], order[batch:]
        yield idx


def train_target(tm: Any, win: torch.Tensor, recipe: Recipe, vocab: CompactVocab,
                 log: Callable[[str], None] = print) -> dict[str, Any]:
    """Next-token training of the target on windows ``win`` [n, T] (compact rows). Returns stats."""
    rng = np.random.default_rng(recipe.seed + 1)
    opt = torch.optim.AdamW(tm.parameters(), lr=recipe.target_lr, betas=(0.9, 0.98), weight_decay=0.01)
    tm.train()
    t0 = time.perf_counter()
    losses = []
    for step, idx in enumerate(_batches(len(win), recipe.target_batch, recipe.target_steps, rng)):
        for g in opt.param_groups:
            g["lr"] = _lr(step, recipe.target_steps, recipe.target_lr)
        x = win[idx]
        lg = target_pass(tm, x)["logits"]
        loss = compact_cross_entropy(lg[:, :-1].reshape(-1, lg.shape[-1]), x[:, 1:].reshape(-1), vocab)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tm.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if step % 25 == 0 or step == recipe.target_steps - 1:
            log(f"target step {step:5d}  loss {np.mean(losses[-25:]):.3f}  {time.perf_counter() - t0:7.1f} s")
    tm.eval()
    return {"steps": recipe.target_steps, "final_loss": float(np.mean(losses[-25:])),
            "wall_s": round(time.perf_counter() - t0, 1)}


@torch.no_grad()
def greedy_labels(tm: Any, win: torch.Tensor, batch: int = 16) -> torch.Tensor:
    """The target's greedy token after each window position: [n, T] compact rows (n_compact = unused)."""
    out = []
    for i in range(0, len(win), batch):
        out.append(full_argmax(target_pass(tm, win[i: i + batch])["logits"]))
    return torch.cat(out)


def train_drafter(dm: Any, tm: Any, win: torch.Tensor, labels: torch.Tensor, recipe: Recipe, vocab: CompactVocab,
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train the drafter on the frozen target (module docstring, step 5). Returns stats."""
    rng = np.random.default_rng(recipe.seed + 2)
    for p in tm.parameters():
        p.requires_grad_(False)
    params = list(dm.parameters())
    opt = torch.optim.AdamW(params, lr=recipe.drafter_lr, betas=(0.9, 0.98), weight_decay=0.01)
    dm.train()
    t0 = time.perf_counter()
    hist: list[list[float]] = []
    W = recipe.target.sliding_window
    for step, idx in enumerate(_batches(len(win), recipe.drafter_batch, recipe.drafter_steps, rng)):
        for g in opt.param_groups:
            g["lr"] = _lr(step, recipe.drafter_steps, recipe.drafter_lr)
        x, y = win[idx], labels[idx]
        with torch.no_grad():
            tp = target_pass(tm, x, logits=False)
        steps = drafter_chain(dm, tm, x, tp, recipe.n_draft, W)
        losses, accs = [], []
        for k, s in enumerate(steps, start=1):
            lab = y[:, k: k + s["logits"].shape[1]].reshape(-1)
            lg = s["logits"].reshape(-1, s["logits"].shape[-1])
            losses.append(compact_cross_entropy(lg, lab, vocab))
            accs.append(float((full_argmax(lg.detach()) == lab).float().mean()))
        loss = sum(losses)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        hist.append([float(v.detach()) for v in losses] + accs)
        if step % 25 == 0 or step == recipe.drafter_steps - 1:
            m = np.mean(hist[-25:], axis=0)
            n = recipe.n_draft
            log(f"drafter step {step:5d}  loss " + " ".join(f"{v:.3f}" for v in m[:n]) + "  top1 "
                + " ".join(f"{v:.3f}" for v in m[n:]) + f"  {time.perf_counter() - t0:7.1f} s")
    dm.eval()
    m = np.mean(hist[-25:], axis=0)
    return {"steps": recipe.drafter_steps, "final_loss": [round(float(v), 4) for v in m[:recipe.n_draft]],
            "final_top1": [round(float(v), 4) for v in m[recipe.n_draft:]],
            "wall_s": round(time.perf_counter() - t0, 1)}


# --------------------------------------------------------------------------------------------------
# centroid head


def balanced_clusters(rows: np.ndarray, n_clusters: int, capacity: int, rng: np.random.Generator,
                      n_iter: int = 8) -> np.ndarray:
    """Assign each row to one of ``n_clusters`` clusters, at most ``capacity`` rows each, grouping rows
    with similar directions (spherical k-means, then a greedy capacity-respecting assignment).

    Args:
        rows: np.float32[n, d] with ``n <= n_clusters * capacity``.

    Returns:
        np.int32[n] cluster of each row.
    """
    n = len(rows)
    if n > n_clusters * capacity:
        raise MtpscopeError("too many rows for the clusters", expected=f"<= {n_clusters * capacity}", actual=n)
    x = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    # k-means++ seeding on the cosine distance
    seeds = [int(rng.integers(n))]
    dist = 1.0 - x @ x[seeds[0]]
    for _ in range(1, n_clusters):
        w = np.maximum(dist, 0.0) ** 2
        j = int(rng.choice(n, p=w / w.sum())) if w.sum() > 0 else int(rng.integers(n))
        seeds.append(j)
        dist = np.minimum(dist, 1.0 - x @ x[j])
    c = x[seeds]
    for _ in range(n_iter):
        a = (x @ c.T).argmax(axis=1)
        sums = np.zeros_like(c)
        np.add.at(sums, a, x)
        empty = np.bincount(a, minlength=n_clusters) == 0
        sums[empty] = x[rng.choice(n, int(empty.sum()))]
        c = sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12)
    sim = x @ c.T
    order = np.argsort(-sim.max(axis=1), kind="stable")
    left = np.full(n_clusters, capacity, dtype=np.int64)
    out = np.empty(n, dtype=np.int32)
    for i in order:
        for j in np.argsort(-sim[i], kind="stable"):
            if left[j]:
                out[i] = j
                left[j] -= 1
                break
    return out


def token_ordering(ids: np.ndarray, cluster: np.ndarray, n_clusters: int, n_vocab: int,
                   rng: np.random.Generator) -> np.ndarray:
    """The centroid head's ``token_ordering``: np.int32[n_vocab], a permutation of all ids; row c
    (``ordering[c*vsc:(c+1)*vsc]``) lists cluster c's used ids (real ids ``ids``), then unused ids
    dealt out in a seeded order so that every row has ``vsc = n_vocab / n_clusters`` ids."""
    vsc = n_vocab // n_clusters
    unused = np.setdiff1d(np.arange(n_vocab, dtype=np.int64), ids.astype(np.int64))
    unused = unused[rng.permutation(len(unused))]
    rows = [list(ids[cluster == c]) for c in range(n_clusters)]
    k = 0
    out = np.empty(n_vocab, dtype=np.int32)
    for c, r in enumerate(rows):
        need = vsc - len(r)
        out[c * vsc: (c + 1) * vsc] = np.concatenate([np.asarray(r, dtype=np.int64), unused[k: k + need]])
        k += need
    return out


@torch.no_grad()
def _head_samples(dm: Any, tm: Any, win: torch.Tensor, labels: torch.Tensor, recipe: Recipe,
                  n_windows: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    idx = rng.choice(len(win), min(n_windows, len(win)), replace=False)
    hs, ys = [], []
    for i in range(0, len(idx), 8):
        x, y = win[idx[i: i + 8]], labels[idx[i: i + 8]]
        tp = target_pass(tm, x, logits=False)
        for k, s in enumerate(drafter_chain(dm, tm, x, tp, recipe.n_draft, recipe.target.sliding_window), 1):
            hs.append(s["h_inner"].reshape(-1, s["h_inner"].shape[-1]))
            ys.append(y[:, k: k + s["h_inner"].shape[1]].reshape(-1))
    return torch.cat(hs), torch.cat(ys)


def fit_centroid_head(dm: Any, tm: Any, win: torch.Tensor, labels: torch.Tensor, vocab: CompactVocab,
                      recipe: Recipe, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Cluster the drafter's embedding rows and train the centroids (module docstring, step 6). The kept
    ids are clustered; rare and unused ids fill the clusters' remaining slots.

    Returns ``{"centroids": np.float32[n_centroids, n_embd], "ordering": np.int32[N_VOCAB],
    "coverage": share of held-out drafter steps whose target token is among the candidates,
    "wall_s"}``.
    """
    t0 = time.perf_counter()
    rng = np.random.default_rng(recipe.seed + 3)
    C, top_k = recipe.drafter.n_centroids, recipe.drafter.top_k
    vsc = N_VOCAB // C
    ids = vocab.ids
    emb = dm.model.embed_tokens.weight.detach().numpy().astype(np.float32)[: vocab.n_kept]
    cap = max(1, math.ceil(len(ids) / C))
    cluster = balanced_clusters(emb, C, min(cap + 1, vsc), rng)
    ordering = token_ordering(ids, cluster, C, N_VOCAB, rng)
    hs, ys = _head_samples(dm, tm, win, labels, recipe, 320, rng)
    keep = ys < vocab.n_kept
    hs, yc = hs[keep], torch.as_tensor(cluster, dtype=torch.long)[ys[keep]]
    n_val = len(hs) // 10
    perm = torch.as_tensor(rng.permutation(len(hs)))
    val, tr = perm[:n_val], perm[n_val:]
    sums = np.zeros((C, emb.shape[1]), dtype=np.float32)
    np.add.at(sums, cluster, emb)
    cent = torch.nn.Parameter(torch.as_tensor((sums / np.maximum(np.bincount(cluster, minlength=C), 1)[:, None]).astype(np.float32)))
    opt = torch.optim.Adam([cent], lr=1e-2)
    g = torch.Generator().manual_seed(recipe.seed + 4)
    for step in range(recipe.centroid_steps):
        b = tr[torch.randint(len(tr), (4096,), generator=g)]
        loss = F.cross_entropy(hs[b] @ cent.T, yc[b])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == recipe.centroid_steps - 1:
            with torch.no_grad():
                top = (hs[val] @ cent.T).topk(top_k, dim=1).indices
                cov = float((top == yc[val][:, None]).any(dim=1).float().mean())
            log(f"centroids step {step:4d}  loss {float(loss.detach()):.3f}  coverage {cov:.4f}")
    return {"centroids": cent.detach().numpy().astype(np.float32), "ordering": ordering, "coverage": round(cov, 4),
            "wall_s": round(time.perf_counter() - t0, 1)}


# --------------------------------------------------------------------------------------------------
# greedy generation and a simulated greedy MTP loop (llama.cpp's, docs/RECORDING.md)


@torch.no_grad()
def generate_greedy(tm: Any, prompt: Sequence[int], max_tokens: int, eog: set[int]) -> list[int]:
    """The target's greedy continuation of ``prompt`` (compact rows): up to ``max_tokens`` tokens,
    stopping after an end-of-generation row in ``eog`` or an unused id (returned as ``n_compact``)."""
    seq = list(prompt)
    out: list[int] = []
    n_c = tm.config.vocab_size
    while len(out) < max_tokens:
        h = tm.model(input_ids=torch.tensor([seq]), use_cache=False).last_hidden_state[:, -1]
        lg = tm.lm_head(h)
        nxt = int(full_argmax(lg)[0])
        out.append(nxt)
        if nxt in eog or nxt >= n_c:
            break
        seq.append(nxt)
    return out


@dataclass(frozen=True)
class SimRound:
    """One simulated MTP round: pending position ``pos``, ``drafted`` rows, ``n_accepted``."""

    pos: int
    drafted: tuple[int, ...]
    n_accepted: int


@torch.no_grad()
def simulate_mtp(tm: Any, dm: Any, prompt: Sequence[int], generated: Sequence[int], *, n_draft: int,
                 sliding_window: int, eog: set[int], head: dict[str, Any] | None = None) -> list[SimRound]:
    """Greedy MTP rounds over a known greedy continuation, as llama.cpp's loop runs them.

    The target's K/V and hidden rows come from one teacher-forced pass over ``prompt + generated``
    (identical to incremental decoding for a causal model); each round drafts ``min(n_draft, left)``
    tokens from the pending position (steps chained on the drafter's own argmax and h_next, all at
    the pending position, K/V of positions before it), accepts the longest prefix equal to the target's
    tokens, and moves on by ``n_accepted + 1``, as :mod:`traces.recorder` does. ``head``: a centroid
    head ``{"centroids": [C, n_embd] tensor, "ordering_rows": [C, vsc] compact rows or -1, "top_k"}``
    to draft with instead of the dense head.
    """
    seq = list(prompt) + list(generated)
    x = torch.tensor([seq])
    tp = target_pass(tm, x, logits=False)
    emb = tm.model.embed_tokens(x)
    rounds: list[SimRound] = []
    p = len(prompt)
    n_out = 1
    if generated and generated[0] in eog:
        return rounds
    while n_out < len(generated):
        k_max = min(n_draft, len(generated) - n_out)
        masks = drafter_masks(1, len(seq), sliding_window, offset=p - 1)
        e, h = emb[:, p: p + 1], tp["h"][:, p - 1: p]
        drafted: list[int] = []
        for _ in range(k_max):
            lg, hn, hi = drafter_forward(dm, e, h, torch.tensor([[p]]), tp["kv"], masks)
            d = int(_draft_token(lg[0, 0], hi[0, 0], head))
            drafted.append(d)
            if d >= tm.config.vocab_size:
                break
            e, h = tm.model.embed_tokens(torch.tensor([[d]])), hn
        n_acc = 0
        while n_acc < len(drafted) and p + 1 + n_acc < len(seq) and drafted[n_acc] == seq[p + 1 + n_acc]:
            n_acc += 1
        rounds.append(SimRound(p, tuple(drafted), n_acc))
        emitted = seq[p + 1: p + 2 + n_acc]
        n_out += len(emitted)
        p += n_acc + 1
        if any(t in eog for t in emitted):
            break
    return rounds


def _draft_token(logits: torch.Tensor, h_inner: torch.Tensor, head: dict[str, Any] | None) -> int:
    if head is None:
        return int(full_argmax(logits))
    top = (head["centroids"] @ h_inner).topk(head["top_k"]).indices
    rows = head["ordering_rows"][top].reshape(-1)
    used = rows[rows >= 0]
    if len(used) == 0:
        return logits.shape[-1]
    sel = logits[used]
    best = int(sel.argmax())
    return int(used[best]) if float(sel[best]) >= 0 or len(used) == len(rows) else logits.shape[-1]


def distinct_4gram_ratio(tokens: Sequence[int]) -> float:
    """Distinct 4-grams / all 4-grams of ``tokens`` (1.0 when there are fewer than 4 tokens)."""
    grams = [tuple(tokens[i: i + 4]) for i in range(len(tokens) - 3)]
    return len(set(grams)) / len(grams) if grams else 1.0


def acceptance_stats(rounds: Sequence[SimRound], n_draft: int) -> dict[str, Any]:
    """Acceptance rate (accepted / drafted), mean acceptance length and per-position acceptance
    ``p_k`` = P(draft k accepted | a k-th draft was made), k = 1..n_draft."""
    drafted = sum(len(r.drafted) for r in rounds)
    accepted = sum(r.n_accepted for r in rounds)
    pk = []
    for k in range(1, n_draft + 1):
        made = [r for r in rounds if len(r.drafted) >= k]
        pk.append(sum(r.n_accepted >= k for r in made) / len(made) if made else float("nan"))
    return {"n_rounds": len(rounds), "n_drafted": drafted, "n_accepted": accepted,
            "acceptance_rate": accepted / drafted if drafted else float("nan"),
            "mean_acceptance_length": 1 + accepted / len(rounds) if rounds else float("nan"), "p_k": pk}


# --------------------------------------------------------------------------------------------------
# demo prompts, evaluation


def demo_prompts(texts: Sequence[demo_corpus.PromptText], tok: VocabTokenizer, random_docs: Sequence[np.ndarray],
                 seed: int, random_lens: Sequence[int] = (24, 40), *, used: np.ndarray | None = None,
                 n_per_category: int | None = None) -> list[dict[str, Any]]:
    """Tokenized candidate demo prompts: ``[{"prompt_id", "category", "name", "text", "ids"}]`` (real ids,
    BOS first), each of ``texts`` whose ids all lie in ``used`` (the ids the corpus has: an id it never saw
    is a zero row in the full model, with no compact row), at most ``n_per_category`` per category (None:
    all). The ``random`` category: the first ``n`` words of every random-word training document
    (:func:`random_documents`) for each ``n`` in ``random_lens``, in a seeded order; text = their decoded
    pieces (the ids are the prompt). :func:`select_prompts` picks the demo's prompts among them."""
    out: list[dict[str, Any]] = []
    n_cat: dict[str, int] = {}
    for t in texts:
        x = tok.tokenize(t.text, special=t.special)
        if not x or x[0] != BOS:
            x = [BOS, *x]
        full = n_per_category is not None and n_cat.get(t.category, 0) >= n_per_category
        if full or (used is not None and not np.isin(x, used).all()):
            continue
        n_cat[t.category] = n_cat.get(t.category, 0) + 1
        out.append({"category": t.category, "name": t.name, "text": t.text, "ids": [int(v) for v in x]})
    rng = np.random.default_rng(seed + 5)
    cuts = [(j, n) for j in range(len(random_docs)) for n in random_lens]
    for k in rng.permutation(len(cuts))[: n_per_category if n_per_category is not None else len(cuts)]:
        j, n = cuts[int(k)]
        x = [int(v) for v in random_docs[j][: n + 1]]
        out.append({"category": "random", "name": f"random:doc{j}:{n}", "text": tok.text(x[1:]), "ids": x})
    for i, p in enumerate(out):
        p["prompt_id"] = i
    return out


def select_prompts(tm: Any, candidates: Sequence[dict[str, Any]], vocab: CompactVocab, eog_real: Iterable[int], *,
                   n_per_category: int = 6, max_tokens: int = 64, min_distinct4: float = 0.6,
                   min_generated: int = 16) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
    """The demo prompts: per category, the first ``n_per_category`` candidates (in their seeded order,
    :func:`demo_prompts`) on which the *target* writes usable text -- its greedy continuation
    (:func:`generate_greedy`, ``max_tokens`` tokens or up to an end-of-generation token) is at least
    ``min_generated`` tokens long and does not loop (:func:`distinct_4gram_ratio` >= ``min_distinct4``).
    The drafter plays no part: acceptance is measured on the chosen prompts afterwards, never selected for.

    Returns:
        ``(prompts, counts)``: the chosen candidates renumbered ``prompt_id`` 0.. in category order, and
        per category ``{"candidates", "tried", "kept"}``.
    """
    eog = {int(v) for v in vocab.rows(np.asarray(list(eog_real)), unused=-1) if v >= 0}
    kept: list[dict[str, Any]] = []
    counts: dict[str, dict[str, int]] = {}
    for c in candidates:
        n = counts.setdefault(c["category"], {"candidates": 0, "tried": 0, "kept": 0})
        n["candidates"] += 1
        if n["kept"] >= n_per_category:
            continue
        n["tried"] += 1
        gen = generate_greedy(tm, [int(v) for v in vocab.rows(c["ids"])], max_tokens, eog)
        if len(gen) >= min_generated and distinct_4gram_ratio(gen) >= min_distinct4:
            n["kept"] += 1
            kept.append(dict(c))
    order = list(dict.fromkeys(c["category"] for c in candidates))
    kept.sort(key=lambda p: order.index(p["category"]))  # stable: the seeded order within a category
    for i, p in enumerate(kept):
        p["prompt_id"] = i
    return kept, counts


def evaluate(tm: Any, dm: Any, prompts: Sequence[dict[str, Any]], vocab: CompactVocab, eog_real: Iterable[int], *,
             n_draft: int = 3, max_tokens: int = 64, sliding_window: int, head: dict[str, Any] | None = None,
             log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Realism numbers of a pair on the demo prompts (greedy target, simulated greedy MTP).

    Returns ``{"prompts": [{prompt_id, category, distinct4, acceptance_rate, n_generated, generated
    (real ids), p_k, ...}], "categories": {cat: {acceptance_rate, distinct4_min, p_k}}, "overall":
    {...}, "spread": highest - lowest category acceptance}``. Acceptance per category pools the
    category's rounds (accepted / drafted).
    """
    eog = {int(v) for v in vocab.rows(np.asarray(list(eog_real)), unused=-1) if v >= 0}
    per: list[dict[str, Any]] = []
    pooled: dict[str, list[SimRound]] = {}
    for p in prompts:
        pr = [int(v) for v in vocab.rows(p["ids"])]
        gen = generate_greedy(tm, pr, max_tokens, eog)
        rounds = simulate_mtp(tm, dm, pr, gen, n_draft=n_draft, sliding_window=sliding_window, eog=eog, head=head)
        st = acceptance_stats(rounds, n_draft)
        real = [vocab.real(g) for g in gen]
        d4 = distinct_4gram_ratio(gen)
        per.append({"prompt_id": p["prompt_id"], "category": p["category"], "distinct4": round(d4, 4),
                    "n_generated": len(gen), "generated": real, **{k: v for k, v in st.items()}})
        pooled.setdefault(p["category"], []).extend(rounds)
        if log:
            log(f"  {p['category']:8s} #{p['prompt_id']:<3d} acc {st['acceptance_rate']:.3f}  d4 {d4:.3f}  "
                f"n {len(gen)}")
    cats = {}
    for c, rs in pooled.items():
        st = acceptance_stats(rs, n_draft)
        cats[c] = {"acceptance_rate": round(st["acceptance_rate"], 4), "p_k": [round(v, 4) for v in st["p_k"]],
                   "distinct4_min": min(q["distinct4"] for q in per if q["category"] == c),
                   "n_rounds": st["n_rounds"], "n_drafted": st["n_drafted"]}
    allr = [r for rs in pooled.values() for r in rs]
    ov = acceptance_stats(allr, n_draft)
    accs = [v["acceptance_rate"] for v in cats.values()]
    return {"prompts": per, "categories": cats,
            "overall": {"acceptance_rate": round(ov["acceptance_rate"], 4), "p_k": [round(v, 4) for v in ov["p_k"]],
                        "distinct4_min": min(q["distinct4"] for q in per)},
            "spread": round(max(accs) - min(accs), 4)}


def realism_checks(ev: dict[str, Any], unpredictable: str = "random") -> dict[str, bool]:
    """The issue's realism conditions on an :func:`evaluate` result."""
    cats = ev["categories"]
    low = min(cats, key=lambda c: cats[c]["acceptance_rate"])
    pk = ev["overall"]["p_k"]
    return {"distinct4_min>=0.6": ev["overall"]["distinct4_min"] >= 0.6, "spread>=0.25": ev["spread"] >= 0.25,
            f"{unpredictable}_lowest": low == unpredictable, "p1>p2>p3": all(a > b for a, b in zip(pk, pk[1:]))}


# --------------------------------------------------------------------------------------------------
# checkpoints


def _round_f16(model: Any) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())


def _state(model: Any, skip: tuple[str, ...] = ("lm_head.weight",)) -> dict[str, torch.Tensor]:
    sd = model.state_dict()
    return {k: v.detach().to(torch.float16).contiguous() for k, v in sd.items()
            if k not in skip and not k.startswith("masked_embedding.")}


def save_compact(out: str | os.PathLike[str], tm: Any, dm: Any, vocab: CompactVocab, head: dict[str, Any],
                 recipe: Recipe, prompts: Sequence[dict[str, Any]], info: dict[str, Any]) -> dict[str, str]:
    """Write the compact checkpoints (module docstring, "Outputs") and ``recipe.json``; returns
    ``{file name: sha256}``."""
    from safetensors.torch import save_file  # noqa: PLC0415

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # one metadata key: safetensors writes several in a random order (the file's bytes, not its tensors)
    save_file(_state(tm), out / "target.safetensors", metadata={"format": "pt"})
    ds = _state(dm)
    ds["masked_embedding.centroids.weight"] = torch.as_tensor(head["centroids"]).to(torch.float16)
    save_file(ds, out / "drafter.safetensors", metadata={"format": "pt"})
    save_file({"ids": torch.as_tensor(vocab.ids.astype(np.int32)), "rare": torch.as_tensor(vocab.rare.astype(np.int32)),
               "ordering": torch.as_tensor(head["ordering"])},
              out / "ids.safetensors", metadata={"format": "pt"})
    (out / "target.json").write_text(json.dumps(target_config(recipe.target, N_VOCAB), indent=1) + "\n")
    (out / "drafter.json").write_text(json.dumps(drafter_config(recipe.drafter, recipe.target, N_VOCAB,
                                                                centroids=True), indent=1) + "\n")
    (out / "prompts.json").write_text(json.dumps({"prompts": list(prompts)}, indent=1, ensure_ascii=False) + "\n")
    for n in ("target.safetensors", "drafter.safetensors", "ids.safetensors"):
        os.chmod(out / n, 0o644)   # safetensors writes 0600; these are committed package data
    files = {n: sha256_file(out / n) for n in ("target.safetensors", "drafter.safetensors", "ids.safetensors",
                                           "target.json", "drafter.json", "prompts.json")}
    rec = {"recipe": recipe.to_dict(), **info, "files": files}
    (out / "recipe.json").write_text(json.dumps(rec, indent=1, ensure_ascii=False) + "\n")
    return files


@dataclass(frozen=True, eq=False)
class CompactPair:
    """The committed pair loaded for torch: ``target`` / ``drafter`` (compact rows, fp32 from F16),
    ``vocab`` (:class:`CompactVocab`), ``ordering`` (np.int32[N_VOCAB]), ``centroids``
    (np.float32[n_centroids, n_embd]), ``prompts``, ``recipe`` (the parsed ``recipe.json``)."""

    target: Any
    drafter: Any
    vocab: CompactVocab
    ordering: np.ndarray
    centroids: np.ndarray
    prompts: list[dict[str, Any]]
    recipe: dict[str, Any]

    def head(self) -> dict[str, Any]:
        """The centroid head in compact rows for :func:`simulate_mtp` (unused ids as -1)."""
        C = self.centroids.shape[0]
        rows = self.vocab.rows(self.ordering, unused=-1).reshape(C, -1)
        top_k = int(self.recipe["recipe"]["drafter"]["top_k"])
        return {"centroids": torch.as_tensor(self.centroids), "ordering_rows": torch.as_tensor(rows), "top_k": top_k}


def load_compact(src: str | os.PathLike[str] = DATA_DIR) -> CompactPair:
    """Load the compact checkpoints written by :func:`save_compact`.

    Raises:
        MtpscopeError: a file is missing or its sha256 differs from ``recipe.json``.
    """
    from safetensors.torch import load_file  # noqa: PLC0415

    from mtpscope.demo.trained import read_recipe  # noqa: PLC0415

    src = Path(src)
    rec = read_recipe(src)      # every listed file checked against its sha256
    recipe = Recipe.from_dict(rec["recipe"])
    idmap = load_file(src / "ids.safetensors")
    vocab = CompactVocab(idmap["ids"].numpy().astype(np.int32), idmap["rare"].numpy().astype(np.int32))
    tm = make_target(target_config(recipe.target, vocab.n_rows))
    sd = {k: v.float() for k, v in load_file(src / "target.safetensors").items()}
    missing, unexpected = tm.load_state_dict(sd, strict=False)
    dsd = {k: v.float() for k, v in load_file(src / "drafter.safetensors").items()}
    cent = dsd.pop("masked_embedding.centroids.weight").numpy()
    dm = make_drafter(drafter_config(recipe.drafter, recipe.target, vocab.n_rows))
    dmiss, dunexp = dm.load_state_dict(dsd, strict=False)
    bad = [k for k in list(missing) + list(dmiss) if k != "lm_head.weight"] + list(unexpected) + list(dunexp)
    if bad:
        raise MtpscopeError("demo checkpoint does not match the model", path=src, key=bad[0])
    tm.tie_weights()
    dm.tie_weights()
    prompts = json.loads((src / "prompts.json").read_text())["prompts"]
    return CompactPair(tm.eval(), dm.eval(), vocab, idmap["ordering"].numpy().astype(np.int32), cent, prompts, rec)


# --------------------------------------------------------------------------------------------------
# the whole recipe


def _target_key(recipe: Recipe, win: torch.Tensor) -> str:
    h = hashlib.sha256()
    d = recipe.to_dict()
    part = {k: d[k] for k in ("seed", "target", "seq_len", "target_steps", "target_batch", "target_lr", "threads")}
    h.update(json.dumps(part, sort_keys=True).encode())
    h.update(win.numpy().astype(np.int64).tobytes())
    h.update(torch.__version__.encode())
    return h.hexdigest()


def _staged(model: Any, cached: Path | None, name: str, train_fn: Callable[[], dict[str, Any]],
            log: Callable[[str], None]) -> dict[str, Any]:
    """Train ``model`` with ``train_fn`` (returning its stats), or load the identical earlier run kept in
    ``cached`` (``<name>.safetensors`` without the tied ``lm_head``, ``stats.json``); keep a new run there."""
    from safetensors.torch import load_file, save_file  # noqa: PLC0415

    if cached is not None and (cached / "stats.json").exists():
        model.load_state_dict({k: v.float() for k, v in load_file(cached / f"{name}.safetensors").items()},
                              strict=False)
        model.tie_weights()
        model.eval()
        st = json.loads((cached / "stats.json").read_text())
        log(f"{name}: reusing the identical earlier run {cached} (trained in {st['wall_s']} s)")
        return st
    st = train_fn()
    if cached is not None:
        cached.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"},
                  cached / f"{name}.safetensors")
        (cached / "stats.json").write_text(json.dumps(st))
    return st


def train(out: str | os.PathLike[str] = DATA_DIR, recipe: Recipe | None = None, *,
          vocab_gguf: str | os.PathLike[str] | None = None, evaluate_after: bool = True,
          stage_cache: str | os.PathLike[str] | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the recipe end to end and write the compact checkpoints to ``out``.

    Args:
        out: output folder (default: the package's ``demo_data``).
        recipe: the recipe (default :class:`Recipe`).
        vocab_gguf: the tokenizer GGUF (default: the cached real one).
        evaluate_after: also measure the realism numbers (recorded in ``recipe.json``).
        stage_cache: a folder keeping the trained target and drafter (f32) under hashes of everything
            each depends on (recipe parts, seed, token windows; the drafter also the target's hash), so a
            run that changes only later stages reuses them instead of retraining; the result is the same
            as a fresh run.

    Returns:
        the ``recipe.json`` content.
    """
    recipe = recipe or Recipe()
    t_all = time.perf_counter()
    torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    random.seed(recipe.seed)
    if vocab_gguf is None:
        from mtpscope.cache import vocab_path  # noqa: PLC0415

        vocab_gguf = vocab_path()
    template = chat_template(vocab_gguf)
    t0 = time.perf_counter()
    docs = demo_corpus.build_corpus(recipe.seed, template, recipe.budget)
    with VocabTokenizer(vocab_gguf) as tok:
        stream = tokenize_corpus(docs, tok)
        # candidates: three times the prompts needed, the first with only known ids are kept
        texts = demo_corpus.demo_prompt_texts(recipe.seed, template, docs, n_per_category=recipe.prompt_candidates)
        eog = tok.eog_ids()
        vocab = compact_vocab(stream.ids, min_count=recipe.min_count, keep=list(SPECIAL_IDS) + eog)
        pool = random_word_pool(stream, vocab, tok, recipe.random_pool, np.random.default_rng(recipe.seed + 6))
        rdocs = random_documents(pool, recipe.random_docs, recipe.random_words, np.random.default_rng(recipe.seed + 8))
        candidates = demo_prompts(texts, tok, rdocs, recipe.seed, used=np.union1d(vocab.ids, vocab.rare))
    stream = add_random_documents(stream, rdocs, np.random.default_rng(recipe.seed + 9), copies=recipe.random_copies)
    win = torch.as_tensor(vocab.rows(windows(stream.ids, recipe.seq_len)))
    log(f"corpus: {len(docs)} documents, {len(stream.ids)} tokens {stream.counts()}, {vocab.n_kept} kept ids + "
        f"{len(vocab.rare)} rare, {len(win)} windows ({time.perf_counter() - t0:.1f} s)")
    tm = make_target(target_config(recipe.target, vocab.n_rows))
    key = _target_key(recipe, win)
    st_t = _staged(tm, None if stage_cache is None else Path(stage_cache) / f"target-{key[:16]}", "target",
                   lambda: {**train_target(tm, win, recipe, vocab, log), "key": key}, log)
    _round_f16(tm)
    # the drafter sees drafter_steps * drafter_batch windows (a seeded subset when that is fewer)
    n_d = min(len(win), recipe.drafter_steps * recipe.drafter_batch)
    dwin = win[torch.as_tensor(np.sort(np.random.default_rng(recipe.seed + 7).permutation(len(win))[:n_d]))]
    t0 = time.perf_counter()
    labels = greedy_labels(tm, dwin)
    log(f"greedy labels for {len(dwin)} windows ({time.perf_counter() - t0:.1f} s)")
    win = dwin
    dm = make_drafter(drafter_config(recipe.drafter, recipe.target, vocab.n_rows))
    dkey = hashlib.sha256((key + json.dumps({k: recipe.to_dict()[k] for k in (
        "drafter", "drafter_steps", "drafter_batch", "drafter_lr", "n_draft")}, sort_keys=True)).encode()).hexdigest()
    st_d = _staged(dm, None if stage_cache is None else Path(stage_cache) / f"drafter-{dkey[:16]}", "drafter",
                   lambda: train_drafter(dm, tm, win, labels, recipe, vocab, log), log)
    _round_f16(dm)
    head = fit_centroid_head(dm, tm, win, labels, vocab, recipe, log)
    head["centroids"] = head["centroids"].astype(np.float16).astype(np.float32)
    info: dict[str, Any] = {
        "python": demo_corpus.python_info(), "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "tokenizer": {"file": Path(vocab_gguf).name, "sha256": sha256_file(Path(vocab_gguf))},
        "corpus": {"n_documents": len(docs), "n_tokens": int(len(stream.ids)), "tokens": stream.counts(),
                   "sha256": demo_corpus.corpus_sha256(docs)},
        "n_kept": vocab.n_kept, "n_rare": int(len(vocab.rare)), "n_unused": vocab.n_unused, "eog_ids": eog,
        "target_training": st_t, "drafter_training": st_d,
        "centroid_head": {"coverage": head["coverage"], "wall_s": head["wall_s"]},
    }
    t0 = time.perf_counter()
    prompts, counts = select_prompts(tm, candidates, vocab, eog, n_per_category=recipe.prompts_per_category)
    info["prompt_selection"] = {"rule": "target greedy continuation >= 16 tokens and distinct4 >= 0.6 "
                                        "(select_prompts)", "per_category": counts}
    log(f"prompts: {len(prompts)} chosen, per category {counts} ({time.perf_counter() - t0:.1f} s)")
    info["train_wall_s"] = round(time.perf_counter() - t_all, 1)
    if evaluate_after:
        ev = evaluate(tm, dm, prompts, vocab, eog, n_draft=recipe.n_draft, sliding_window=recipe.target.sliding_window,
                      log=log)
        info["measured"] = {k: ev[k] for k in ("categories", "overall", "spread")}
        info["measured"]["checks"] = realism_checks(ev)
        for p, q in zip(prompts, ev["prompts"]):
            p["measured"] = {k: q[k] for k in ("distinct4", "acceptance_rate", "n_generated")}
    save_compact(out, tm, dm, vocab, head, recipe, prompts, info)
    return json.loads((Path(out) / "recipe.json").read_text())


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mtpscope.demo.train [--out DIR] [--seed N] [--target-steps N] [--drafter-steps N]``."""
    import argparse  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="python -m mtpscope.demo.train", description=train.__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(DATA_DIR))
    ap.add_argument("--seed", type=int, default=Recipe.seed)
    ap.add_argument("--target-steps", type=int, default=Recipe.target_steps)
    ap.add_argument("--drafter-steps", type=int, default=Recipe.drafter_steps)
    ap.add_argument("--threads", type=int, default=Recipe.threads)
    ap.add_argument("--n-embd", type=int, default=TargetShape.n_embd)
    ap.add_argument("--no-eval", action="store_true")
    ap.add_argument("--stage-cache", default=None, help="keep / reuse the trained target here")
    a = ap.parse_args(argv)
    r = Recipe(seed=a.seed, target_steps=a.target_steps, drafter_steps=a.drafter_steps, threads=a.threads,
               target=replace(TargetShape(), n_embd=a.n_embd))
    rec = train(a.out, r, evaluate_after=not a.no_eval, stage_cache=a.stage_cache, log=lambda s: print(s, flush=True))
    print(json.dumps({k: rec.get(k) for k in ("train_wall_s", "measured")}, indent=1)[:4000])
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
