"""Deterministic demo models: a tiny Gemma 4 target and its tiny MTP drafter, in both GGUF dialects.

What the demo pair **is**: real GGUF files that the real llama.cpp runtime (llama-cpp-python 0.3.36)
loads and runs, carrying the real Gemma 4 tokenizer (262144 tokens), with the real graph shapes of a
Gemma 4 target (``gemma4``: sliding and full attention layers, proportional RoPE through
``rope_freqs``, K = V on full layers, ``layer_output_scale``, final logit soft-capping) and of its
assistant drafter (``gemma4-assistant`` upstream, ``gemma4_assistant`` fork with a centroid head).
What it is **not**: a language model. The weights are synthetic (seeded), tiny (target width 64,
drafter width 128) and built so that draft acceptance is *known by construction*:

* **Target** (``write_target``): every ``attn_output`` weight is zero, so attention adds nothing and
  the target is a pure function of the current token (a bigram model). Layer 0's feed-forward is an
  associative memory that maps each word of :data:`DEMO_PASSAGE` to the next word (cyclically), so
  generated text walks through that sentence; layers 1-3 add small seeded random feed-forwards;
  layers 4-5 are identities (``ffn_down`` = 0, ``layer_output_scale`` = 1).
* **Drafter** (``write_drafter``, noise 0): its pre-projection copies the embedding half of
  ``concat(e, h)`` (``e = target.token_embd[tok] * sqrt(n_embd_backbone)``, the scale the target
  applies to its own input) into the first ``n_embd_backbone`` dims of the wider drafter stream and
  zeros the rest; its four layers copy the target's layers 0-3 (norm and feed-forward weights,
  zero-padded; RMSNorm weights times ``sqrt(n_embd_backbone / n_embd)`` and the drafter's RMS
  epsilon = target epsilon * ``n_embd_backbone / n_embd``, which makes the padded RMSNorm equal to
  the target's); its attention output is zero as well; its LM head is the target's ``token_embd``
  padded with zeros. The drafter's logits then equal the target's pre-soft-capping logits for the
  token it is fed, so every greedy draft equals the target's next token: acceptance rate 1.0.
  Soft-capping (``30 * tanh(x / 30)``) is monotonic and does not move the argmax.
* ``noise > 0`` adds seeded Gaussian noise to the drafter's LM head, pre-projection and feed-forward matrices
  (relative Frobenius size ``noise``: ``||dW|| ~= noise * ||W||``); acceptance falls smoothly.
* **Fork dialect** (``dialect="fork"``): the same weights under the fork's names (``mtp.*``) and keys,
  plus a centroid head: ``n_centroids`` balanced clusters of the token embeddings (recursive median
  splits, so each cluster holds exactly ``n_vocab / n_centroids`` tokens), centroid = mean of its
  tokens' (padded) embedding rows, ``mtp.token_ordering`` = the cluster members row by row (a
  permutation of the vocabulary). ``centroid_misplace`` moves that share of tokens (and the same
  share of the passage's tokens, at least one) to another cluster's row without changing the
  centroids, so the sparse head cannot reach them: a visible reason for a failed draft.

Shapes: dict values are numpy arrays in numpy order (``shape``); GGUF ``ne`` is the reverse.
Sources for the graph maths: llama.cpp 0c1e57098 ``src/models/gemma4.cpp`` and
``gemma4-assistant.cpp``; ``docs/reference/gemma4-assistant-facts.md`` sections 1, 3 and 5.
"""

from __future__ import annotations

import math
import os
import shutil
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.demo.spec import (  # noqa: F401 - re-exported: the public API lives here too
    DEFAULT_DIMS,
    DEMO_PASSAGE,
    RECORD_CONFIG,
    DemoPaths,
    TinyDims,
    _read_stamp,
    _trace_complete,
    _write_stamp,
    demo_is_current,
    load_record_config,
    models_hash,
    traces_hash,
)
from mtpscope.demo.vocab import DemoVocab, load_vocab  # load_vocab re-exported
from mtpscope.errors import MtpscopeError
from mtpscope.inspector.gguf import BOOL
from mtpscope.inspector.gguf_write import MetaValue, array, boolean, f32, string, u32, write_gguf
from mtpscope.inspector.layouts import (
    ARCH_FORK,
    ARCH_TARGET,
    ARCH_UPSTREAM,
    FORK_CENTROIDS,
    FORK_ORDERING,
    POST_PROJECTION,
    PRE_PROJECTION,
)

# ----------------------------------------------------------------------------------------------
# seeded randomness


def _rng(seed: int, name: str) -> np.random.Generator:
    """An independent generator per (seed, tensor name): weights do not depend on creation order."""
    return np.random.default_rng([seed, zlib.crc32(name.encode("utf-8"))])


def _normal(seed: int, name: str, shape: tuple[int, ...], std: float) -> np.ndarray:
    return (_rng(seed, name).standard_normal(shape) * std).astype(np.float32)


def _positive(seed: int, name: str, n: int, center: float, spread: float) -> np.ndarray:
    """Norm weights: ``center * (1 + spread * N(0,1))``, clipped away from zero."""
    w = center * (1.0 + spread * _rng(seed, name).standard_normal(n))
    return np.clip(w, 0.2 * center, None).astype(np.float32)


def passage_tokens(vocab: DemoVocab, passage: str = DEMO_PASSAGE) -> list[int]:
    """Token ids of the passage's words (``"▁word"``, punctuation without ``▁``) that exist in ``vocab``.

    Duplicates are dropped (a bigram memory needs one successor per token).
    """
    ids: list[int] = []
    for word in passage.split():
        text = word if word in {",", ".", ";", ":", "!", "?"} else "\u2581" + word
        tid = vocab.token_id(text)
        if tid is not None and tid not in ids:
            ids.append(tid)
    return ids


# ----------------------------------------------------------------------------------------------
# weights


def target_weights(vocab: DemoVocab, dims: TinyDims = DEFAULT_DIMS, seed: int = 0) -> dict[str, np.ndarray]:
    """All tensors of the tiny target, numpy order, in GGUF name -> array form.

    ``token_embd.weight`` is float16 with shape ``(n_vocab, n_embd_backbone)``; every other tensor
    is float32. Rows of ``token_embd`` are unit-norm (after the float16 rounding the norm is 1 to
    about 1e-3). See the module docstring for the construction.
    """
    T, V, F = dims.n_embd_backbone, vocab.n_vocab, dims.n_ff
    w: dict[str, np.ndarray] = {}
    emb = _rng(seed, "token_embd").standard_normal((V, T)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    w["token_embd.weight"] = emb.astype(np.float16)
    u = w["token_embd.weight"].astype(np.float32)      # the rounded values: the model really uses these
    w["output_norm.weight"] = _positive(seed, "output_norm", T, 1.0, 0.1)
    w["rope_freqs.weight"] = rope_freqs(dims)
    chain = passage_tokens(vocab)
    if len(chain) < 2:
        raise MtpscopeError("the demo passage needs at least two tokens in the vocabulary",
                            key="DEMO_PASSAGE", expected=">= 2 tokens", actual=len(chain))
    if len(chain) > F:
        raise MtpscopeError("the demo passage has more tokens than feed-forward units",
                            key="n_ff", expected=f">= {len(chain)}", actual=F)
    n_active = dims.n_layer_drafter
    for il, swa in enumerate(dims.target_swa):
        p = f"blk.{il}."
        hd = dims.head_dim_swa if swa else dims.head_dim
        w[p + "attn_norm.weight"] = _positive(seed, p + "attn_norm", T, 1.0, 0.1)
        w[p + "attn_q.weight"] = _normal(seed, p + "attn_q", (dims.n_head * hd, T), 1 / math.sqrt(T))
        w[p + "attn_k.weight"] = _normal(seed, p + "attn_k", (dims.n_head_kv * hd, T), 1 / math.sqrt(T))
        if swa:  # full layers: K = V (attention_k_eq_v), no attn_v tensor
            w[p + "attn_v.weight"] = _normal(seed, p + "attn_v", (dims.n_head_kv * hd, T), 1 / math.sqrt(T))
        w[p + "attn_q_norm.weight"] = _positive(seed, p + "attn_q_norm", hd, 1.0, 0.1)
        w[p + "attn_k_norm.weight"] = _positive(seed, p + "attn_k_norm", hd, 1.0, 0.1)
        w[p + "attn_output.weight"] = np.zeros((T, dims.n_head * hd), np.float32)
        w[p + "post_attention_norm.weight"] = _positive(seed, p + "post_attention_norm", T, 1.0, 0.1)
        if il == 0:   # associative memory: token chain[i] -> chain[i + 1]
            gate = _normal(seed, p + "ffn_gate", (F, T), 0.02)
            up = _normal(seed, p + "ffn_up", (F, T), 0.02)
            down = _normal(seed, p + "ffn_down", (T, F), 0.02)
            for i, tok in enumerate(chain):
                nxt = chain[(i + 1) % len(chain)]
                gate[i] = dims.memory_gain * u[tok]
                up[i] = dims.memory_gain * u[tok]
                down[:, i] = u[nxt]
            w[p + "ffn_norm.weight"] = np.ones(T, np.float32)
            w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"], w[p + "ffn_down.weight"] = gate, up, down
            w[p + "post_ffw_norm.weight"] = _positive(seed, p + "post_ffw_norm", T, dims.memory_out, 0.05)
            scale = 1.0
        elif il < n_active:
            w[p + "ffn_norm.weight"] = _positive(seed, p + "ffn_norm", T, 1.0, 0.1)
            w[p + "ffn_gate.weight"] = _normal(seed, p + "ffn_gate", (F, T), 1 / math.sqrt(T))
            w[p + "ffn_up.weight"] = _normal(seed, p + "ffn_up", (F, T), 1 / math.sqrt(T))
            w[p + "ffn_down.weight"] = _normal(seed, p + "ffn_down", (T, F), 1 / math.sqrt(F))
            w[p + "post_ffw_norm.weight"] = _positive(seed, p + "post_ffw_norm", T, dims.random_out, 0.1)
            scale = (0.9, 1.1, 0.95, 1.05)[il % 4]
        else:         # identity layer: the feed-forward adds exactly zero
            w[p + "ffn_norm.weight"] = _positive(seed, p + "ffn_norm", T, 1.0, 0.1)
            w[p + "ffn_gate.weight"] = _normal(seed, p + "ffn_gate", (F, T), 1 / math.sqrt(T))
            w[p + "ffn_up.weight"] = _normal(seed, p + "ffn_up", (F, T), 1 / math.sqrt(T))
            w[p + "ffn_down.weight"] = np.zeros((T, F), np.float32)
            w[p + "post_ffw_norm.weight"] = _positive(seed, p + "post_ffw_norm", T, 1.0, 0.1)
            scale = 1.0
        w[p + "layer_output_scale.weight"] = np.array([scale], np.float32)
    return w


def rope_freqs(dims: TinyDims) -> np.ndarray:
    """Proportional RoPE factors for full layers, shape ``(head_dim // 2,)``: 1.0 for the first
    ``partial_rotary_factor`` share of pairs, 1e30 (no rotation) for the rest (as the upstream
    converter writes them, conversion/gemma.py ``generate_extra_tensors``)."""
    half = dims.head_dim // 2
    n_rot = int(dims.head_dim * dims.partial_rotary_factor / 2)
    return np.array([1.0] * n_rot + [1e30] * (half - n_rot), np.float32)


def drafter_weights(target: dict[str, np.ndarray], dims: TinyDims = DEFAULT_DIMS, *, noise: float = 0.0,
                    seed: int = 0) -> dict[str, np.ndarray]:
    """The drafter's tensors (upstream names), built from the target's, numpy order.

    Args:
        target: :func:`target_weights` output.
        noise: relative Frobenius size of the Gaussian noise added to ``token_embd`` (the drafter's
            LM head; the drafter's *input* embedding is the target's table, untouched),
            ``nextn.pre_projection`` and every ``ffn_gate`` / ``ffn_up`` / ``ffn_down``
            (0 = exact copy, acceptance 1.0).
        seed: noise seed (independent of the target's seed stream: names are prefixed ``noise/``).

    Raises:
        ValueError: ``noise < 0`` or ``n_embd == n_embd_backbone``.
    """
    if noise < 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    T, D, F = dims.n_embd_backbone, dims.n_embd, dims.n_ff
    if D == T:
        raise ValueError("the drafter's n_embd must differ from n_embd_backbone (upstream loader rule)")
    k = math.sqrt(T / D)

    def pad_norm(v: np.ndarray) -> np.ndarray:
        out = np.zeros(D, np.float32)
        out[:T] = v * k
        return out

    def noisy(name: str, m: np.ndarray) -> np.ndarray:
        if noise == 0:
            return m
        fro = float(np.linalg.norm(m))
        return (m + _normal(seed, "noise/" + name, m.shape, noise * fro / math.sqrt(m.size))).astype(np.float32)

    emb = target["token_embd.weight"]
    w: dict[str, np.ndarray] = {}
    tok = np.zeros((emb.shape[0], D), np.float16)
    tok[:, :T] = emb
    w["token_embd.weight"] = noisy("token_embd", tok.astype(np.float32)).astype(np.float16) if noise else tok
    w["output_norm.weight"] = pad_norm(target["output_norm.weight"])
    w["rope_freqs.weight"] = target["rope_freqs.weight"].copy()
    pre = np.zeros((D, 2 * T), np.float32)
    pre[:T, :T] = np.eye(T, dtype=np.float32)
    w[PRE_PROJECTION["upstream"]] = noisy(PRE_PROJECTION["upstream"].removesuffix(".weight"), pre)
    post = np.zeros((T, D), np.float32)
    post[:, :T] = np.eye(T, dtype=np.float32)
    w[POST_PROJECTION["upstream"]] = post
    for il, swa in enumerate(dims.drafter_swa):
        p, tp = f"blk.{il}.", f"blk.{il}."      # drafter layer il copies target layer il (0..3)
        hd = dims.head_dim_swa if swa else dims.head_dim
        w[p + "attn_norm.weight"] = pad_norm(target[tp + "attn_norm.weight"])
        q = np.zeros((dims.n_head * hd, D), np.float32)
        q[:, :T] = _normal(seed, "drafter/" + p + "attn_q", (dims.n_head * hd, T), 1 / math.sqrt(T))
        w[p + "attn_q.weight"] = q
        w[p + "attn_q_norm.weight"] = _positive(seed, "drafter/" + p + "attn_q_norm", hd, 1.0, 0.1)
        w[p + "attn_output.weight"] = np.zeros((D, dims.n_head * hd), np.float32)
        w[p + "post_attention_norm.weight"] = pad_norm(target[tp + "post_attention_norm.weight"])
        w[p + "layer_output_scale.weight"] = target[tp + "layer_output_scale.weight"].copy()
        w[p + "ffn_norm.weight"] = pad_norm(target[tp + "ffn_norm.weight"])
        gate = np.zeros((F, D), np.float32)
        gate[:, :T] = target[tp + "ffn_gate.weight"]
        up = np.zeros((F, D), np.float32)
        up[:, :T] = target[tp + "ffn_up.weight"]
        down = np.zeros((D, F), np.float32)
        down[:T] = target[tp + "ffn_down.weight"]
        w[p + "ffn_gate.weight"] = noisy(p + "ffn_gate", gate)
        w[p + "ffn_up.weight"] = noisy(p + "ffn_up", up)
        w[p + "ffn_down.weight"] = noisy(p + "ffn_down", down)
        w[p + "post_ffw_norm.weight"] = pad_norm(target[tp + "post_ffw_norm.weight"])
    return w


def centroid_head(target: dict[str, np.ndarray], vocab: DemoVocab, dims: TinyDims = DEFAULT_DIMS, *,
                  n_centroids: int = 2048, misplace: float = 0.0, seed: int = 0
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A centroid head for the fork dialect.

    Returns:
        ``(centroids, ordering, misplaced)``: ``centroids`` float32 shape ``(n_centroids, n_embd)``
        (GGUF ``ne`` ``[n_embd, n_centroids]``); ``ordering`` int32 shape ``(n_vocab,)``, a permutation
        of ``0..n_vocab-1`` whose row ``j`` (``ordering[j*vsc:(j+1)*vsc]``, ``vsc = n_vocab / n_centroids``)
        lists cluster ``j``'s tokens; ``misplaced`` sorted int32 ids of the tokens moved to another row.

    Clusters: ``log2(n_centroids)`` rounds of median splits of every group along one seeded random
    direction per round (balanced by construction). Centroid = mean of the cluster's embedding rows,
    zero-padded to ``n_embd``. Misplacement: a seeded share ``misplace`` of all tokens plus the same
    share (at least one, if ``misplace > 0``) of :func:`passage_tokens` trade places cyclically in the
    ordering; the centroids stay those of the intended clusters.

    Raises:
        ValueError: ``n_centroids`` not a power of two dividing ``n_vocab``, or ``misplace`` not in [0, 1).
    """
    V, T = vocab.n_vocab, dims.n_embd_backbone
    if n_centroids <= 0 or n_centroids & (n_centroids - 1) or V % n_centroids:
        raise ValueError(f"n_centroids must be a power of two dividing n_vocab={V}, got {n_centroids}")
    if not 0 <= misplace < 1:
        raise ValueError(f"misplace must be in [0, 1), got {misplace}")
    emb = target["token_embd.weight"].astype(np.float32)
    order = np.arange(V)
    rng = _rng(seed, "centroids/directions")
    for level in range(int(math.log2(n_centroids))):
        direction = rng.standard_normal(T).astype(np.float32)
        groups = order.reshape(1 << level, -1)
        proj = emb[groups] @ direction                       # (n_groups, group_size)
        idx = np.argsort(proj, axis=1, kind="stable")
        order = np.take_along_axis(groups, idx, axis=1).reshape(-1)
    vsc = V // n_centroids
    centroids = np.zeros((n_centroids, dims.n_embd), np.float32)
    centroids[:, :T] = emb[order].reshape(n_centroids, vsc, T).mean(axis=1)
    misplaced = np.zeros(0, np.int64)
    if misplace > 0:
        r = _rng(seed, "centroids/misplace")
        n_all = max(2, int(round(misplace * V)))
        chosen = set(r.choice(V, size=n_all, replace=False).tolist())
        chain = passage_tokens(vocab)
        n_chain = max(1, int(math.ceil(misplace * len(chain))))
        chosen.update(int(t) for t in r.choice(chain, size=min(n_chain, len(chain)), replace=False))
        misplaced = np.array(sorted(chosen), np.int64)
        pos = np.empty(V, np.int64)
        pos[order] = np.arange(V)
        slots = pos[misplaced]                               # where these tokens sit now
        shuffled = r.permutation(len(misplaced))
        # a derangement-like cycle: token i takes the slot of token shuffled[i+1]
        cyc = np.roll(shuffled, 1)
        new = order.copy()
        new[slots[cyc]] = misplaced[shuffled]
        order = new
    return centroids, order.astype(np.int32), misplaced.astype(np.int32)


def fork_weights(upstream: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The upstream drafter tensors renamed to the fork dialect (``nextn.*`` -> ``mtp.*``)."""
    ren = {PRE_PROJECTION["upstream"]: PRE_PROJECTION["fork"], POST_PROJECTION["upstream"]: POST_PROJECTION["fork"]}
    return {ren.get(k, k): v for k, v in upstream.items()}


# ----------------------------------------------------------------------------------------------
# GGUF metadata (files are written by inspector.gguf_write.write_gguf)


def _hparam_kv(arch: str, dims: TinyDims, *, target: bool, n_vocab: int) -> list[tuple[str, MetaValue]]:
    """Architecture keys (prefix ``arch``) for the target or the drafter."""
    swa = dims.target_swa if target else dims.drafter_swa
    n_embd = dims.n_embd_backbone if target else dims.n_embd
    eps = dims.rms_eps if target else dims.rms_eps * dims.n_embd_backbone / dims.n_embd
    a = arch + "."
    kv: list[tuple[str, MetaValue]] = [
        (a + "context_length", u32(dims.context_length)),
        (a + "embedding_length", u32(n_embd)),
        (a + "block_count", u32(len(swa))),
        (a + "feed_forward_length", u32(dims.n_ff)),
        (a + "attention.head_count", u32(dims.n_head)),
        (a + "attention.head_count_kv", u32(dims.n_head_kv)),
        (a + "attention.key_length", u32(dims.head_dim)),
        (a + "attention.value_length", u32(dims.head_dim)),
        (a + "attention.key_length_swa", u32(dims.head_dim_swa)),
        (a + "attention.value_length_swa", u32(dims.head_dim_swa)),
        (a + "attention.sliding_window", u32(dims.sliding_window)),
        (a + "attention.sliding_window_pattern", array(swa, BOOL)),
        (a + "attention.layer_norm_rms_epsilon", f32(eps)),
        (a + "attention.shared_kv_layers", u32(0)),
        (a + "rope.freq_base", f32(dims.rope_freq_base)),
        (a + "rope.freq_base_swa", f32(dims.rope_freq_base_swa)),
        (a + "rope.dimension_count", u32(dims.head_dim)),
        (a + "rope.dimension_count_swa", u32(dims.head_dim_swa)),
    ]
    if target:
        kv += [(a + "embedding_length_per_layer_input", u32(0)),
               (a + "final_logit_softcapping", f32(dims.softcap))]
    return kv


def _general_kv(name: str, extra: dict[str, Any]) -> list[tuple[str, MetaValue]]:
    kv = [("general.name", string(name)),
          ("general.description", string("mtpscope demo: tiny synthetic weights, real "
                                         "Gemma 4 tokenizer; see docs/DEMO.md"))]
    for k, v in extra.items():
        if isinstance(v, bool):
            kv.append(("mtpscope.demo." + k, boolean(v)))
        elif isinstance(v, int):
            kv.append(("mtpscope.demo." + k, u32(v)))
        elif isinstance(v, float):
            kv.append(("mtpscope.demo." + k, f32(v)))
        else:
            kv.append(("mtpscope.demo." + k, string(str(v))))
    return kv


def write_target(path: str | os.PathLike[str], *, vocab: str | DemoVocab = "full", seed: int = 0,
                 dims: TinyDims = DEFAULT_DIMS) -> Path:
    """Write the tiny ``gemma4`` target GGUF (see module docstring); returns ``path``.

    Args:
        vocab: ``"full"`` (real 262144-token tokenizer), ``"subset"`` (first 4096 real tokens) or a
            :class:`DemoVocab`.
        seed: weight seed; the same seed, dims and vocab give byte-identical files.

    Size: about 33 MB with the full vocabulary (``token_embd`` float16 ``ne [64, 262144]``).
    """
    voc = vocab if isinstance(vocab, DemoVocab) else load_vocab(vocab)
    w = target_weights(voc, dims, seed)
    kv = _general_kv("mtpscope-demo-target", {"role": "target", "seed": seed, "vocab": voc.kind})
    kv += _hparam_kv(ARCH_TARGET, dims, target=True, n_vocab=voc.n_vocab) + list(voc.kv)
    return write_gguf(Path(path), ARCH_TARGET, kv, w)


def write_drafter(path: str | os.PathLike[str], *, dialect: str = "upstream", noise: float = 0.0,
                  centroid_misplace: float = 0.0, n_centroids: int | None = None, centroid_top_k: int = 32,
                  vocab: str | DemoVocab = "full", seed: int = 0, noise_seed: int | None = None,
                  dims: TinyDims = DEFAULT_DIMS) -> Path:
    """Write the tiny drafter for the target of the same ``seed`` / ``vocab`` / ``dims``; returns ``path``.

    Args:
        dialect: ``"upstream"`` (arch ``gemma4-assistant``, ``nextn.*``, ``embedding_length_out``,
            ``nextn_predict_layers``; loads in llama.cpp) or ``"fork"`` (arch ``gemma4_assistant``,
            ``mtp.*`` tensors, ``n_embd_backbone`` and the fork's centroid keys, plus
            ``mtp.centroids.weight`` / ``mtp.token_ordering.weight``).
        noise: see :func:`drafter_weights` (0 gives acceptance rate 1.0 against the target).
        centroid_misplace: fork only: share of tokens moved out of their cluster's ordering row.
        n_centroids: fork only: default 2048 for the full vocabulary, 32 for smaller ones.
        centroid_top_k: fork only: ``centroid_top_k`` key (number of centroids the head keeps).
        seed: the target's seed (the drafter copies that target).
        noise_seed: seed of the noise (default: ``seed``).

    Raises:
        ValueError: unknown dialect, negative noise, bad ``n_centroids`` / ``centroid_misplace``.
    """
    if dialect not in ("upstream", "fork"):
        raise ValueError(f"dialect must be 'upstream' or 'fork', got {dialect!r}")
    voc = vocab if isinstance(vocab, DemoVocab) else load_vocab(vocab)
    tw = target_weights(voc, dims, seed)
    w = drafter_weights(tw, dims, noise=noise, seed=seed if noise_seed is None else noise_seed)
    extra = {"role": "drafter", "dialect": dialect, "seed": seed, "noise": float(noise), "vocab": voc.kind}
    if dialect == "upstream":
        arch = ARCH_UPSTREAM
        kv = _general_kv("mtpscope-demo-drafter", extra) + _hparam_kv(arch, dims, target=False, n_vocab=voc.n_vocab)
        kv += [(arch + ".embedding_length_out", u32(dims.n_embd_backbone)),
               (arch + ".nextn_predict_layers", u32(dims.n_layer_drafter))]
        return write_gguf(Path(path), arch, kv + list(voc.kv), w)
    arch = ARCH_FORK
    nc = n_centroids if n_centroids is not None else (2048 if voc.n_vocab >= 2048 * 16 else 32)
    cent, ordering, _mis = centroid_head(tw, voc, dims, n_centroids=nc, misplace=centroid_misplace, seed=seed)
    fw = fork_weights(w)
    fw[FORK_CENTROIDS] = cent
    fw[FORK_ORDERING] = ordering
    extra["centroid_misplace"] = float(centroid_misplace)
    kv = _general_kv("mtpscope-demo-drafter-fork", extra) + _hparam_kv(arch, dims, target=False, n_vocab=voc.n_vocab)
    kv += [(arch + ".n_embd_backbone", u32(dims.n_embd_backbone)),
           (arch + ".n_centroids", u32(nc)),
           (arch + ".centroid_top_k", u32(centroid_top_k)),
           (arch + ".use_ordered_embeddings", boolean(True)),
           (arch + ".attention.k_eq_v", boolean(True)),
           (arch + ".requires_target_arch", string(ARCH_TARGET))]
    return write_gguf(Path(path), arch, kv + list(voc.kv), fw)


# ----------------------------------------------------------------------------------------------
# the demo folder



def build_demo(out_dir: str | os.PathLike[str] | None = None, force: bool = False, *, traces: bool = True,
               config: str | os.PathLike[str] | None = None, trained: bool = True,
               log: Callable[[str], None] | None = None) -> DemoPaths:
    """Build (or reuse) the demo folder: four constructed GGUFs and, when the recorder and llama.cpp are
    available, their two traces; then the trained pair (``trained/``, :func:`mtpscope.demo.trained.build_trained`:
    converted variants, their traces, ``demo.json``). Idempotent: ``stamp.json`` holds
    :func:`models_hash` / :func:`traces_hash` (``trained/stamp.json`` the trained pair's); only what
    changed is rebuilt, and a current folder returns in milliseconds. A file lock (``.lock``) keeps
    concurrent builders from writing the same folder.

    Args:
        out_dir: the folder (default ``<cache>/demo``).
        force: rebuild everything.
        traces: also record the demo traces (skipped with a log line if llama-cpp-python is missing).
        config: recording configuration (default :data:`RECORD_CONFIG`).
        trained: also build the trained pair (``trained/``) and ``demo.json``.
        log: receives one line per action (default: silent).

    Returns:
        :class:`DemoPaths`.

    Raises:
        MtpscopeError: bad configuration, tokenizer missing (see :func:`mtpscope.cache.vocab_path`),
            or a recorder error.
    """
    import fcntl

    from mtpscope.cache import demo_dir
    say = log or (lambda _msg: None)
    cfg = load_record_config(config)
    root = Path(out_dir) if out_dir is not None else demo_dir()
    paths = DemoPaths.under(root, Path(config) if config is not None else RECORD_CONFIG)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = _read_stamp(paths.stamp)
        mh = models_hash(cfg)
        if force or stamp.get("models") != mh or not all(p.exists() for p in paths.models):
            say(f"writing demo models into {root}")
            _write_models(paths, cfg)
            stamp = {"models": mh, "traces": None, "summary": None}
            _write_stamp(paths.stamp, stamp)
        if traces:
            th = traces_hash(cfg, mh)
            if force or stamp.get("traces") != th or not (_trace_complete(paths.traces_clean)
                                                          and _trace_complete(paths.traces_noisy)):
                summary = _record_traces(paths, cfg, say)
                if summary is not None:
                    stamp = {**stamp, "traces": th, "summary": summary}
                    _write_stamp(paths.stamp, stamp)
        if trained:
            from mtpscope.demo.trained import build_trained

            build_trained(root, force=force, traces=traces, log=say)
    return paths


def _write_models(paths: DemoPaths, cfg: dict[str, Any]) -> None:
    seed, voc = cfg["seed"], load_vocab(cfg["vocab"])
    fork = cfg["fork"]
    noisy = cfg["drafters"]["noisy"]
    write_target(paths.target, vocab=voc, seed=seed)
    write_drafter(paths.drafter_upstream, vocab=voc, seed=seed, noise=float(cfg["drafters"]["clean"]["noise"]))
    write_drafter(paths.drafter_upstream_noisy, vocab=voc, seed=seed, noise=float(noisy["noise"]),
                  noise_seed=int(noisy.get("noise_seed", seed)))
    write_drafter(paths.drafter_fork, dialect="fork", vocab=voc, seed=seed,
                  noise=float(cfg["drafters"]["clean"]["noise"]), n_centroids=fork["n_centroids"],
                  centroid_top_k=fork["centroid_top_k"], centroid_misplace=float(fork["centroid_misplace"]))


def _record_traces(paths: DemoPaths, cfg: dict[str, Any], say: Callable[[str], None]) -> dict[str, Any] | None:
    """HOOK (helper H4's recorder): record ``traces/clean`` and ``traces/noisy`` with the real llama.cpp
    MTP loop, :func:`traces.run.recorder.record`. Returns per-trace summaries, or None when the recorder
    or llama-cpp-python is unavailable (the models are still usable; a later build retries)."""
    try:
        from mtpscope.traces.run import recorder
        from mtpscope.traces.run.llama.binding import llama
        from mtpscope.traces.run.record_config import RecordConfig
        llama()
    except Exception as e:  # noqa: BLE001  # ImportError, RuntimeUnavailableError or any failure loading llama.cpp: record later
        say(f"demo traces skipped: {e}")
        return None
    rec = cfg["record"]
    config = RecordConfig(n_draft=int(rec["n_draft"]), max_tokens=int(rec["max_tokens"]),
                          centroids=os.fspath(paths.drafter_fork) if rec.get("centroids") == "fork" else None,
                          hidden=str(rec.get("hidden", "f16")), n_top=int(rec.get("n_top", 10)))
    summary: dict[str, Any] = {}
    for name, drafter, out in (("clean", paths.drafter_upstream, paths.traces_clean),
                               ("noisy", paths.drafter_upstream_noisy, paths.traces_noisy)):
        tmp = out.with_name(out.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        say(f"recording demo trace {name} -> {out}")
        res = recorder.record(config, target=paths.target, assistant=drafter, out=tmp, prompts=list(rec["prompts"]),
                              overwrite=True, command=["mtpscope", "demo", "build"])
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
        summary[name] = {"acceptance_rate": res.acceptance_rate, "n_drafted": res.n_drafted,
                         "n_accepted": res.n_accepted, "n_rounds": res.n_rounds,
                         "mean_acceptance_length": res.mean_acceptance_length}
        rate = "-" if res.acceptance_rate is None else f"{res.acceptance_rate:.3f}"
        say(f"  {name}: acceptance rate {rate} ({res.n_accepted}/{res.n_drafted})")
    return summary


def clean_demo(out_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """Delete a demo folder (default ``<cache>/demo``); returns it, or None if there was none.

    Raises:
        MtpscopeError: ``out_dir`` exists but is not a demo folder (no ``stamp.json`` and no demo GGUF).
    """
    from mtpscope.cache import demo_dir
    root = Path(out_dir) if out_dir is not None else demo_dir()
    if not root.exists():
        return None
    paths = DemoPaths.under(root, RECORD_CONFIG)
    if not (paths.stamp.exists() or any(p.exists() for p in paths.models)):
        raise MtpscopeError("refusing to delete: not a demo folder (no stamp.json, no demo GGUF)", path=root)
    shutil.rmtree(root)
    return root
