"""Expected tensor layouts of Gemma 4 drafters (both GGUF dialects) and Gemma 4 targets.

Everything here is derived from a file's own hyperparameters (GGUF keys), so a validator can say
"tensor X should be [a, b] because key K says so".

Sources (the llama.cpp vendored by llama-cpp-python 0.3.36):

* ``src/models/gemma4-assistant.cpp`` ``load_arch_tensors`` — the upstream drafter: every
  ``create_tensor`` call, its ``ne`` and whether it is required;
* ``src/models/gemma4.cpp`` ``load_arch_tensors`` — the ``gemma4`` target;
* ``src/llama-arch.cpp`` — tensor names (``nextn.pre_projection``, ``masked_embd_centroids``, ...);
* ``conversion/gemma.py`` ``Gemma4Model.generate_extra_tensors`` — ``rope_freqs`` values
  (1.0 for the ``head_dim_full · partial_rotary_factor / 2`` rotated pairs, then 1e30);
* the fork dialect (``gemma4_assistant``): docs/reference/gemma4-assistant-facts.md §1 (same per-layer
  tensors, ``mtp.*`` projection / centroid names, ``layer_output_scale`` optional, ``n_embd_backbone`` key).

All shapes in this module are GGUF ``ne`` order (innermost first), e.g. ``attn_q`` is
``ne = (n_embd, n_head·head_dim)``; the numpy ``shape`` of the same tensor is the reverse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mtpscope.errors import LayoutError

# --- architecture strings and dialects ------------------------------------------------------------

ARCH_FORK = "gemma4_assistant"
ARCH_UPSTREAM = "gemma4-assistant"
ARCH_TARGET = "gemma4"

DIALECT_OF_ARCH: dict[str, str] = {ARCH_FORK: "fork", ARCH_UPSTREAM: "upstream", ARCH_TARGET: "target"}
"""``general.architecture`` -> layout dialect."""

#: Vocabulary size of every Gemma 4 model (the real tokenizer's ``tokenizer.ggml.tokens``: 262144 tokens;
#: ``vocab_size`` of the published configs).
GEMMA4_N_VOCAB = 262144

# Tensor-name prefix of the pre/post projections per dialect.
PROJ_PREFIX = {"fork": "mtp", "upstream": "nextn"}

# Names of the centroid head.  Fork: read by the fork's loader.  Upstream: the names the upstream
# loader "knows" only as ignored tensors; in llama-cpp-python 0.3.36 a file carrying them fails to load.
FORK_CENTROIDS = "mtp.centroids.weight"
FORK_ORDERING = "mtp.token_ordering.weight"
UPSTREAM_MASKED_CENTROIDS = "masked_embd_centroids.weight"
UPSTREAM_MASKED_ORDERING = "masked_embd_ordering"

#: The pre / post projection's tensor name per dialect (``mtp.pre_projection.weight`` /
#: ``nextn.pre_projection.weight``, ...): THE drafter tensor names every other module takes.
PRE_PROJECTION: dict[str, str] = {d: f"{p}.pre_projection.weight" for d, p in PROJ_PREFIX.items()}
POST_PROJECTION: dict[str, str] = {d: f"{p}.post_projection.weight" for d, p in PROJ_PREFIX.items()}
#: A fork-dialect drafter tensor's upstream name (the projections and the centroid head; the other
#: tensors carry one name in both dialects).
FORK_TO_UPSTREAM: dict[str, str] = {
    PRE_PROJECTION["fork"]: PRE_PROJECTION["upstream"],
    POST_PROJECTION["fork"]: POST_PROJECTION["upstream"],
    FORK_CENTROIDS: UPSTREAM_MASKED_CENTROIDS,
    FORK_ORDERING: UPSTREAM_MASKED_ORDERING,
}

# Default partial rotary factor of Gemma 4 full-attention layers ("proportional" RoPE), used when no
# HF config says otherwise (conversion/gemma.py; HF Gemma4TextConfig default).
DEFAULT_PARTIAL_ROTARY_FACTOR_FULL = 0.25
ROPE_FREQ_UNROTATED = 1e30

# ggml types a norm / scale / rope_freqs vector is written in by every converter.
VECTOR_TYPES: tuple[str, ...] = ("F32",)
ORDERING_TYPES: tuple[str, ...] = ("I32",)
# Any float or quantized ggml type is fine for a weight matrix (integer types are not).
MATRIX_TYPES: tuple[str, ...] | None = None  # None = "any non-integer ggml type"
INTEGER_TYPES = frozenset({"I8", "I16", "I32", "I64"})


@dataclass(frozen=True)
class ExpectedTensor:
    """One tensor a layout expects.

    Attributes:
        name: GGUF tensor name (``blk.0.attn_q.weight``).
        ne: expected dims in GGUF ``ne`` order (innermost first).
        ggml_types: allowed ggml type names, or None for "any float / quantized type".
        required: whether the runtime refuses a file without it.
        component: inventory component (``projection``, ``attention``, ...).
        layer: block index ``il`` or None for global tensors.
        why: where each dim comes from, in words (``"ne = (n_embd, n_head·head_dim_swa)"``).
    """

    name: str
    ne: tuple[int, ...]
    ggml_types: tuple[str, ...] | None
    required: bool
    component: str
    layer: int | None = None
    why: str = ""

    def type_ok(self, type_name: str) -> bool:
        """Whether ``type_name`` is allowed for this tensor."""
        if self.ggml_types is None:
            return type_name not in INTEGER_TYPES and not type_name.startswith("unknown")
        return type_name in self.ggml_types


@dataclass(frozen=True)
class LayerSpec:
    """Hyperparameters of one block ``il`` (per-layer arrays resolved)."""

    il: int
    sliding: bool
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int


@dataclass(frozen=True)
class HParams:
    """Hyperparameters of a Gemma 4 drafter or target, read from GGUF keys.

    Attributes:
        arch: ``general.architecture``.
        dialect: ``fork``, ``upstream``, ``target`` or ``other``.
        n_layer: ``{arch}.block_count``.
        n_embd: ``{arch}.embedding_length`` (the drafter's inner width).
        n_embd_backbone: the target width the drafter consumes: fork ``n_embd_backbone``, upstream
            ``embedding_length_out``; None for a target or when the key is missing.
        n_vocab: number of tokens (``tokenizer.ggml.tokens`` length, else ``token_embd`` ``ne[1]``).
        n_vocab_source: ``"tokenizer"``, ``"token_embd"`` or ``"unknown"``.
        head_dim_full / head_dim_swa: ``attention.key_length`` / ``attention.key_length_swa``.
        layers: one :class:`LayerSpec` per block.
        use_ordered_embeddings: fork key (False when absent).
        n_centroids: fork key ``n_centroids`` or None.
        centroid_top_k: fork key ``centroid_top_k`` or None.
        nextn_predict_layers: upstream key or None.
        n_embd_per_layer: target ``embedding_length_per_layer_input`` (0 when absent).
        shared_kv_layers: target ``attention.shared_kv_layers`` (0 when absent).
        n_expert: ``expert_count`` (0 when absent); n_ff_exp: ``expert_feed_forward_length``.
        sliding_window: ``attention.sliding_window`` or None.
        missing_keys: keys this module needed but did not find (the layout uses fallbacks).
        raw: the keys read, by full key name.
    """

    arch: str
    dialect: str
    n_layer: int
    n_embd: int
    n_embd_backbone: int | None
    n_vocab: int | None
    n_vocab_source: str
    head_dim_full: int
    head_dim_swa: int
    layers: tuple[LayerSpec, ...]
    use_ordered_embeddings: bool = False
    n_centroids: int | None = None
    centroid_top_k: int | None = None
    nextn_predict_layers: int | None = None
    n_embd_per_layer: int = 0
    shared_kv_layers: int = 0
    n_expert: int = 0
    n_ff_exp: int = 0
    sliding_window: int | None = None
    missing_keys: tuple[str, ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def n_layer_kv_from_start(self) -> int:
        """Layers that own K/V (target): ``n_layer - shared_kv_layers`` (src/models/gemma4.cpp)."""
        return self.n_layer - self.shared_kv_layers

    def has_kv(self, il: int) -> bool:
        """Whether target layer ``il`` computes its own K/V (else it reuses an earlier layer's)."""
        return il < self.n_layer_kv_from_start

    def kv_owner(self, il: int) -> int:
        """The target layer whose K/V cache layer ``il`` reads in llama.cpp: ``il`` itself when it has its own,
        else ``n_kv - 2`` (sliding) / ``n_kv - 1`` (full), ``n_kv = n_layer - shared_kv_layers``
        (``src/llama-model.cpp``, the ``reuse`` callback of Gemma 3n / Gemma 4)."""
        if self.has_kv(il) or self.n_layer_kv_from_start < 2:
            return il
        return self.n_layer_kv_from_start - (2 if self.layers[il].sliding else 1)

    def kv_store_hf(self, sliding: bool) -> int | None:
        """HF's K/V source of a layer type for KV-shared layers and the drafter: the last layer of that type that
        computes its own K/V (transformers ``Gemma4TextConfig.kv_sharing_modes``, mode ``"store"``); None when
        no such layer exists."""
        for ly in reversed(self.layers[:self.n_layer_kv_from_start]):
            if ly.sliding == sliding:
                return ly.il
        return None

    @property
    def has_full_layer(self) -> bool:
        """True when at least one block is full attention (then ``rope_freqs`` is required)."""
        return any(not ly.sliding for ly in self.layers)

    def last_layer_of(self, sliding: bool) -> int | None:
        """Index of the last block of the given type, or None (HF's KV-donor rule)."""
        for ly in reversed(self.layers):
            if ly.sliding == sliding:
                return ly.il
        return None


def dialect_of(arch: str | None) -> str:
    """``fork`` / ``upstream`` / ``target`` for the three Gemma 4 arch strings, else ``other``."""
    return DIALECT_OF_ARCH.get(arch or "", "other")


def _scalar(v: Any) -> Any:
    """A KV value as a plain Python value (arrays -> list)."""
    if v is None:
        return None
    if hasattr(v, "to_list"):
        return v.to_list()
    if isinstance(v, np.generic):
        return v.item()
    return v


#: llama.cpp's limit on layers per model (src/llama-hparams.h); a larger block_count cannot load.
LLAMA_MAX_LAYERS = 512


def _per_layer(v: Any, n_layer: int, default: int, key: str = "", path: Any = None) -> list[int]:
    """Resolve a u32-or-array key (``get_key_or_arr``) to one int per layer.

    Raises:
        LayoutError: an array whose length is not ``n_layer`` (llama.cpp src/llama-model-loader.cpp
            ``get_key_or_arr``: "key ... has wrong array length").
    """
    v = _scalar(v)
    if v is None:
        return [default] * n_layer
    if isinstance(v, list | tuple):
        if len(v) != n_layer:
            raise LayoutError("per-layer array has the wrong length", path=path, key=key,
                              expected=f"{n_layer} entries (block_count)", actual=len(v))
        return [int(x) for x in v]
    return [int(v)] * n_layer


INT_KEYS = frozenset({      # (all but the fork's own three are uint32_t in llama.cpp: loadability.wire_type_reasons)
    "block_count", "embedding_length", "attention.head_count", "attention.head_count_kv", "feed_forward_length",
    "attention.key_length", "attention.key_length_swa", "attention.value_length", "attention.value_length_swa",
    "n_embd_backbone", "embedding_length_out", "n_centroids", "centroid_top_k", "nextn_predict_layers",
    "embedding_length_per_layer_input", "attention.shared_kv_layers", "expert_count",
    "expert_feed_forward_length", "attention.sliding_window", "context_length", "rope.dimension_count",
    "rope.dimension_count_swa"})


def _int_like(v: Any) -> bool:
    if isinstance(v, list):
        return all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def read_hparams(f: Any) -> HParams:
    """Read the hyperparameters a layout needs from an open GGUF file.

    Args:
        f: a ``GGUFFile`` (inspector/gguf.py) or anything with ``architecture``, ``get(key)`` and
            ``tensors``.

    Returns:
        :class:`HParams`. Missing keys do not raise: they are listed in ``missing_keys`` and the
        llama.cpp default is used (e.g. ``head_count_kv`` defaults to ``head_count``,
        ``key_length`` to ``n_embd / n_head``; src/llama-model.cpp ``load_hparams``).

    Raises:
        LayoutError: the file has no ``general.architecture``, or no ``{arch}.block_count`` /
            ``{arch}.embedding_length`` (nothing can be laid out without them), or an integer key holds
            something else (a string, a float, a negative number).
    """
    arch = f.architecture
    if not arch:
        raise LayoutError("no general.architecture key; cannot derive a layout",
                          path=getattr(f, "path", None), key="general.architecture")
    dialect = dialect_of(arch)
    raw: dict[str, Any] = {}
    missing: list[str] = []

    def get(suffix: str, needed: bool = False) -> Any:
        key = f"{arch}.{suffix}"
        v = _scalar(f.get(key))
        if v is None:
            if needed:
                missing.append(key)
        else:
            if suffix in INT_KEYS and not _int_like(v):
                raise LayoutError("key has the wrong type", path=getattr(f, "path", None), key=key,
                                  expected="an unsigned integer (or one per layer)", actual=repr(v)[:60])
            raw[key] = v
        return v

    n_layer = get("block_count")
    n_embd = get("embedding_length")
    if n_layer is None or n_embd is None:
        raise LayoutError("cannot derive a layout without block_count and embedding_length",
                          path=getattr(f, "path", None),
                          key=f"{arch}.block_count" if n_layer is None else f"{arch}.embedding_length")
    n_layer = int(n_layer)
    n_embd = int(n_embd)
    if not 0 < n_layer <= LLAMA_MAX_LAYERS:
        raise LayoutError("block_count out of range", path=getattr(f, "path", None), key=f"{arch}.block_count",
                          expected=f"1..{LLAMA_MAX_LAYERS} (llama.cpp's LLAMA_MAX_LAYERS)", actual=n_layer)

    fpath = getattr(f, "path", None)
    n_head = _per_layer(get("attention.head_count", True), n_layer, 0, f"{arch}.attention.head_count", fpath)
    hkv_raw = get("attention.head_count_kv")
    n_head_kv = (_per_layer(hkv_raw, n_layer, 0, f"{arch}.attention.head_count_kv", fpath)
                 if hkv_raw is not None else list(n_head))
    n_ff = _per_layer(get("feed_forward_length", True), n_layer, 0, f"{arch}.feed_forward_length", fpath)
    n_head0 = n_head[0] if n_head and n_head[0] else 0
    hd_default = n_embd // n_head0 if n_head0 else 0
    hd_full = get("attention.key_length", True)
    hd_full = int(hd_full) if hd_full is not None else hd_default
    hd_swa = get("attention.key_length_swa", True)
    hd_swa = int(hd_swa) if hd_swa is not None else hd_full
    get("attention.value_length")
    get("attention.value_length_swa")
    pattern = get("attention.sliding_window_pattern", True)
    if isinstance(pattern, list):
        sliding = [bool(x) for x in pattern[:n_layer]] + [False] * max(0, n_layer - len(pattern))
    else:
        sliding = [False] * n_layer
    layers = tuple(
        LayerSpec(il, sliding[il], n_head[il], n_head_kv[il], hd_swa if sliding[il] else hd_full, n_ff[il])
        for il in range(n_layer)
    )

    n_bb = None
    if dialect == "fork":
        n_bb = get("n_embd_backbone", True)
    elif dialect == "upstream":
        n_bb = get("embedding_length_out", True)
    n_bb = int(n_bb) if n_bb is not None else None

    tokens = f.get("tokenizer.ggml.tokens")
    n_vocab: int | None
    if tokens is not None and hasattr(tokens, "__len__"):
        n_vocab, src = len(tokens), "tokenizer"
    else:
        n_vocab, src = None, "unknown"
        for t in f.tensors:
            if t.name == "token_embd.weight" and len(t.ne) >= 2:
                n_vocab, src = int(t.ne[1]), "token_embd"

    ordered = get("use_ordered_embeddings")
    n_c = get("n_centroids", bool(ordered))
    if n_c is None and ordered:  # fall back to the centroid matrix width (ne[1]) so the layout stays usable
        n_c = next((t.ne[1] for t in f.tensors if t.name == FORK_CENTROIDS and len(t.ne) == 2), None)
    top_k = get("centroid_top_k")
    nextn = get("nextn_predict_layers", dialect == "upstream")
    per_layer = get("embedding_length_per_layer_input", dialect == "target")
    shared = get("attention.shared_kv_layers")
    n_expert = get("expert_count")
    n_ff_exp = get("expert_feed_forward_length")
    window = get("attention.sliding_window", True)
    for extra in ("context_length", "attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.freq_base_swa",
                  "rope.dimension_count", "rope.dimension_count_swa", "attention.k_eq_v",
                  "requires_target_arch", "final_logit_softcapping"):
        get(extra)
    return HParams(
        arch=arch, dialect=dialect, n_layer=n_layer, n_embd=n_embd, n_embd_backbone=n_bb,
        n_vocab=n_vocab, n_vocab_source=src, head_dim_full=hd_full, head_dim_swa=hd_swa, layers=layers,
        use_ordered_embeddings=bool(ordered) if ordered is not None else False,
        n_centroids=int(n_c) if n_c is not None else None,
        centroid_top_k=int(top_k) if top_k is not None else None,
        nextn_predict_layers=int(nextn) if nextn is not None else None,
        n_embd_per_layer=int(per_layer or 0), shared_kv_layers=int(shared or 0),
        n_expert=int(n_expert or 0), n_ff_exp=int(_per_layer(n_ff_exp, 1, 0)[0]) if n_ff_exp is not None else 0,
        sliding_window=int(window) if window is not None else None,
        missing_keys=tuple(missing), raw=raw,
    )


# --- layouts ----------------------------------------------------------------------------------------

def _vec(name: str, n: int, component: str, il: int | None, why: str, required: bool = True) -> ExpectedTensor:
    return ExpectedTensor(name, (n,), VECTOR_TYPES, required, component, il, why)


def _mat(name: str, ne: tuple[int, int], component: str, il: int | None, why: str,
         required: bool = True) -> ExpectedTensor:
    return ExpectedTensor(name, ne, MATRIX_TYPES, required, component, il, why)


def _drafter_layer(ly: LayerSpec, n_embd: int, scale_required: bool) -> list[ExpectedTensor]:
    """The 11 per-layer tensors of a drafter block (gemma4-assistant.cpp create_tensor order)."""
    il, hd, nh, ff = ly.il, ly.head_dim, ly.n_head, ly.n_ff
    kind = "head_dim_swa" if ly.sliding else "head_dim_full"
    p = f"blk.{il}."
    return [
        _vec(p + "attn_norm.weight", n_embd, "norm", il, "ne = (n_embd,)"),
        _mat(p + "attn_q.weight", (n_embd, hd * nh), "attention", il, f"ne = (n_embd, n_head·{kind})"),
        _mat(p + "attn_output.weight", (hd * nh, n_embd), "attention", il, f"ne = (n_head·{kind}, n_embd)"),
        _vec(p + "attn_q_norm.weight", hd, "norm", il, f"ne = ({kind},)"),
        *_block_tail(p, il, n_embd, ff, scale_required),
    ]


def _block_tail(p: str, il: int, n_embd: int, ff: int, scale_required: bool) -> list[ExpectedTensor]:
    """The tensors after attention that drafter and target blocks share (post-attention norm, layer scale,
    feed-forward), in create_tensor order; ``p`` = ``"blk.{il}."``."""
    return [
        _vec(p + "post_attention_norm.weight", n_embd, "norm", il, "ne = (n_embd,)"),
        _vec(p + "layer_output_scale.weight", 1, "layer_scale", il, "ne = (1,)", required=scale_required),
        _vec(p + "ffn_norm.weight", n_embd, "norm", il, "ne = (n_embd,)"),
        _mat(p + "ffn_gate.weight", (n_embd, ff), "feed_forward", il, "ne = (n_embd, n_ff)"),
        _mat(p + "ffn_up.weight", (n_embd, ff), "feed_forward", il, "ne = (n_embd, n_ff)"),
        _mat(p + "ffn_down.weight", (ff, n_embd), "feed_forward", il, "ne = (n_ff, n_embd)"),
        _vec(p + "post_ffw_norm.weight", n_embd, "norm", il, "ne = (n_embd,)"),
    ]


def expected_drafter_layout(hp: HParams, dialect: str | None = None) -> tuple[ExpectedTensor, ...]:
    """Every tensor a Gemma 4 drafter of these hyperparameters should carry, in one dialect.

    Global tensors first (``token_embd``, ``output_norm``, ``rope_freqs``, the two projections, the
    centroid pair in the fork dialect when ``use_ordered_embeddings``), then the 11 tensors of each
    block. A 4-layer drafter has 49 tensors (51 with the centroid pair).

    Shapes (``ne`` order): ``{pre}.pre_projection.weight`` (2·n_embd_backbone, n_embd),
    ``{pre}.post_projection.weight`` (n_embd, n_embd_backbone), ``token_embd`` (n_embd, n_vocab),
    ``rope_freqs`` (head_dim_full/2,) only when a full-attention block exists, ``mtp.centroids.weight``
    (n_embd, n_centroids), ``mtp.token_ordering.weight`` (n_vocab,) I32. No K/V tensors: the drafter
    reads the target's cache. ``layer_output_scale`` is required upstream, optional in the fork.
    The LM head is tied to ``token_embd`` in both dialects (no ``output.weight``).

    Args:
        hp: from :func:`read_hparams`.
        dialect: ``fork`` or ``upstream``; default ``hp.dialect``.

    Raises:
        LayoutError: the dialect is not a drafter dialect, or n_vocab / n_embd_backbone are unknown.
    """
    dialect = dialect or hp.dialect
    if dialect not in PROJ_PREFIX:
        raise LayoutError(f"no drafter layout for dialect {dialect!r}", key="general.architecture",
                          expected="fork or upstream", actual=dialect)
    if hp.n_vocab is None:
        raise LayoutError("n_vocab unknown (no tokenizer.ggml.tokens and no token_embd.weight)",
                          key="tokenizer.ggml.tokens")
    if hp.n_embd_backbone is None:
        key = "n_embd_backbone" if dialect == "fork" else "embedding_length_out"
        raise LayoutError("backbone width unknown", key=f"{hp.arch}.{key}")
    n_embd, n_bb, n_vocab = hp.n_embd, hp.n_embd_backbone, hp.n_vocab
    out: list[ExpectedTensor] = [
        _mat("token_embd.weight", (n_embd, n_vocab), "token_embd", None, "ne = (n_embd, n_vocab)"),
        _vec("output_norm.weight", n_embd, "output_norm", None, "ne = (n_embd,)"),
    ]
    if hp.has_full_layer:
        out.append(_vec("rope_freqs.weight", hp.head_dim_full // 2, "rope_freqs", None,
                        "ne = (head_dim_full/2,)"))
    out.append(_mat(PRE_PROJECTION[dialect], (2 * n_bb, n_embd), "projection", None,
                    "ne = (2·n_embd_backbone, n_embd)"))
    out.append(_mat(POST_PROJECTION[dialect], (n_embd, n_bb), "projection", None,
                    "ne = (n_embd, n_embd_backbone)"))
    if dialect == "fork" and hp.use_ordered_embeddings:
        n_c = hp.n_centroids or 0
        out.append(_mat(FORK_CENTROIDS, (n_embd, n_c), "centroid_head", None, "ne = (n_embd, n_centroids)"))
        out.append(ExpectedTensor(FORK_ORDERING, (n_vocab,), ORDERING_TYPES, True, "token_ordering", None,
                                  "ne = (n_vocab,), I32"))
    for ly in hp.layers:
        out.extend(_drafter_layer(ly, n_embd, scale_required=(dialect == "upstream")))
    return tuple(out)


def expected_target_layout(hp: HParams, k_eq_v: bool | None = None) -> tuple[ExpectedTensor, ...]:
    """Every tensor a ``gemma4`` target of these hyperparameters should carry (src/models/gemma4.cpp).

    Per block: ``attn_norm``, ``attn_q`` (n_embd, n_head·hd), ``attn_k`` (n_embd, n_head_kv·hd;
    optional on layers that reuse an earlier layer's K/V), ``attn_v`` (same shape, never required: absent
    where K = V), ``attn_output``, ``attn_q_norm`` / ``attn_k_norm`` (hd,), ``post_attention_norm``,
    ``layer_output_scale`` (optional), ``ffn_norm``, ``ffn_gate`` / ``ffn_up`` (n_embd, n_ff), ``ffn_down``,
    ``post_ffw_norm``; MoE tensors (optional) when ``expert_count`` > 0; per-layer-embedding tensors when
    ``embedding_length_per_layer_input`` > 0. ``output.weight`` is optional (tied to ``token_embd``).

    Args:
        hp: from :func:`read_hparams` on a ``gemma4`` file.
        k_eq_v: True: full-attention layers carry no ``attn_v`` and sliding ones must; False: every K/V
            layer must carry ``attn_v``; None (default): ``attn_v`` optional everywhere, as llama.cpp.

    Raises:
        LayoutError: n_vocab unknown.
    """
    if hp.n_vocab is None:
        raise LayoutError("n_vocab unknown (no tokenizer.ggml.tokens and no token_embd.weight)",
                          key="tokenizer.ggml.tokens")
    n_embd, n_vocab, n_pl = hp.n_embd, hp.n_vocab, hp.n_embd_per_layer
    out: list[ExpectedTensor] = [
        _mat("token_embd.weight", (n_embd, n_vocab), "token_embd", None, "ne = (n_embd, n_vocab)"),
        _mat("output.weight", (n_embd, n_vocab), "output", None, "ne = (n_embd, n_vocab); optional (tied)",
             required=False),
        _vec("output_norm.weight", n_embd, "output_norm", None, "ne = (n_embd,)"),
    ]
    if n_pl > 0:
        out.append(_mat("per_layer_token_embd.weight", (n_pl * hp.n_layer, n_vocab), "per_layer_embd", None,
                        "ne = (n_embd_per_layer·n_layer, n_vocab)"))
        out.append(_mat("per_layer_model_proj.weight", (n_embd, n_pl * hp.n_layer), "per_layer_embd", None,
                        "ne = (n_embd, n_embd_per_layer·n_layer)"))
        out.append(_vec("per_layer_proj_norm.weight", n_pl, "per_layer_embd", None, "ne = (n_embd_per_layer,)"))
    if hp.has_full_layer:
        out.append(_vec("rope_freqs.weight", hp.head_dim_full // 2, "rope_freqs", None,
                        "ne = (head_dim_full/2,)"))
    for ly in hp.layers:
        il, hd, nh, nkv, ff = ly.il, ly.head_dim, ly.n_head, ly.n_head_kv, ly.n_ff
        kind = "head_dim_swa" if ly.sliding else "head_dim_full"
        has_kv = hp.has_kv(il)
        if k_eq_v is None:
            v_required = False
        else:
            v_required = has_kv and (ly.sliding or not k_eq_v)
        p = f"blk.{il}."
        out += [
            _vec(p + "attn_norm.weight", n_embd, "norm", il, "ne = (n_embd,)"),
            _mat(p + "attn_q.weight", (n_embd, hd * nh), "attention", il, f"ne = (n_embd, n_head·{kind})"),
            _mat(p + "attn_k.weight", (n_embd, hd * nkv), "attention", il, f"ne = (n_embd, n_head_kv·{kind})",
                 required=has_kv),
            _mat(p + "attn_v.weight", (n_embd, hd * nkv), "attention", il,
                 f"ne = (n_embd, n_head_kv·{kind}); absent where K = V", required=v_required),
            _mat(p + "attn_output.weight", (hd * nh, n_embd), "attention", il, f"ne = (n_head·{kind}, n_embd)"),
            _vec(p + "attn_q_norm.weight", hd, "norm", il, f"ne = ({kind},)"),
            _vec(p + "attn_k_norm.weight", hd, "norm", il, f"ne = ({kind},)", required=has_kv),
            *_block_tail(p, il, n_embd, ff, scale_required=False),
        ]
        if hp.n_expert > 0:
            ne_, nfe = hp.n_expert, hp.n_ff_exp
            out += [
                _mat(p + "ffn_gate_inp.weight", (n_embd, ne_), "moe_experts", il, "ne = (n_embd, n_expert)",
                     required=False),
                _vec(p + "ffn_gate_inp.scale", n_embd, "moe_experts", il, "ne = (n_embd,)", required=False),
                _vec(p + "pre_ffw_norm_2.weight", n_embd, "norm", il, "ne = (n_embd,)", required=False),
                _vec(p + "post_ffw_norm_1.weight", n_embd, "norm", il, "ne = (n_embd,)", required=False),
                _vec(p + "post_ffw_norm_2.weight", n_embd, "norm", il, "ne = (n_embd,)", required=False),
                ExpectedTensor(p + "ffn_gate_up_exps.weight", (n_embd, 2 * nfe, ne_), None, False, "moe_experts",
                               il, "ne = (n_embd, 2·n_ff_exp, n_expert)"),
                ExpectedTensor(p + "ffn_gate_exps.weight", (n_embd, nfe, ne_), None, False, "moe_experts", il,
                               "ne = (n_embd, n_ff_exp, n_expert)"),
                ExpectedTensor(p + "ffn_up_exps.weight", (n_embd, nfe, ne_), None, False, "moe_experts", il,
                               "ne = (n_embd, n_ff_exp, n_expert)"),
                ExpectedTensor(p + "ffn_down_exps.weight", (nfe, n_embd, ne_), None, False, "moe_experts", il,
                               "ne = (n_ff_exp, n_embd, n_expert)"),
                _vec(p + "ffn_down_exps.scale", ne_, "moe_experts", il, "ne = (n_expert,)", required=False),
            ]
        if n_pl > 0:
            out += [
                _mat(p + "inp_gate.weight", (n_embd, n_pl), "per_layer_embd", il, "ne = (n_embd, n_embd_per_layer)"),
                _mat(p + "proj.weight", (n_pl, n_embd), "per_layer_embd", il, "ne = (n_embd_per_layer, n_embd)"),
                _vec(p + "post_norm.weight", n_embd, "per_layer_embd", il, "ne = (n_embd,)"),
            ]
    return tuple(out)


def expected_layout(hp: HParams) -> tuple[ExpectedTensor, ...]:
    """The layout of ``hp.dialect``: drafter (fork / upstream) or target.

    Raises:
        LayoutError: the dialect is ``other`` (no layout known), or what the dialect layout raises.
    """
    if hp.dialect == "target":
        return expected_target_layout(hp)
    return expected_drafter_layout(hp)


def rope_dims(hp: HParams) -> tuple[tuple[str, int, int], tuple[str, int, int]]:
    """``(key the value came from, n_rot, head dim)``, full layers then sliding, as llama.cpp reads them: ``rope.
    dimension_count`` (default ``attention.key_length``), ``rope.dimension_count_swa`` (default: the full's, its key)."""
    full_key, swa_key = hp.arch + ".rope.dimension_count", hp.arch + ".rope.dimension_count_swa"
    full = (full_key, int(hp.raw[full_key])) if hp.raw.get(full_key) is not None else (hp.arch + ".attention.key_length", hp.head_dim_full)
    swa = (swa_key, int(hp.raw[swa_key])) if hp.raw.get(swa_key) is not None else full
    return (full[0], full[1], hp.head_dim_full), (swa[0], swa[1], hp.head_dim_swa)


def rope_dim_fault(n_rot: int, head_dim: int) -> str | None:
    """Why ggml cannot rotate ``n_rot`` of ``head_dim`` dims (it asserts even and ``<= ne0``; 0 hangs), or None."""
    if not 2 <= n_rot <= head_dim:
        return f"{n_rot} rotated dims of a {head_dim}-dim head"
    return f"{n_rot} rotated dims, an odd number (ggml's rope turns pairs of dims)" if n_rot % 2 else None


def expected_rope_freqs(head_dim_full: int,
                        partial_rotary_factor: float = DEFAULT_PARTIAL_ROTARY_FACTOR_FULL) -> np.ndarray:
    """The ``rope_freqs.weight`` values of a Gemma 4 full-attention layer ("proportional" RoPE).

    ``n_rot = int(head_dim_full · partial_rotary_factor / 2)`` ones, then ``head_dim_full/2 − n_rot``
    values of 1e30 (ggml divides the angle by the factor, so 1e30 leaves a pair unrotated). Source:
    conversion/gemma.py ``Gemma4Model.generate_extra_tensors``.

    Returns:
        np.ndarray float32, shape (head_dim_full // 2,).
    """
    n_rot = int(head_dim_full * partial_rotary_factor / 2)
    half = head_dim_full // 2
    return np.array([1.0] * n_rot + [ROPE_FREQ_UNROTATED] * (half - n_rot), dtype=np.float32)
