"""The models and their training.

* **Target** ``Gemma4ForCausalLM`` (:func:`target_config`, :func:`make_target`): next-token
  cross-entropy (:func:`train_target`).
* **Drafter** ``Gemma4AssistantForCausalLM`` (:func:`drafter_config`, :func:`make_drafter`) on the frozen
  target, as transformers' assisted generation (``SinglePositionMultiTokenCandidateGenerator``) and
  llama.cpp run it (:func:`train_drafter`): for every window position ``t``, step 1 reads the target's
  post-norm hidden state at ``t`` and the (scaled, target-embedded) token ``t+1``, at position ``t+1``;
  step ``k`` reads the token ``t+k`` and step ``k-1``'s own ``post_projection`` output, at the same
  position ``t+1``. Every step attends to the target's K/V of its last sliding and last full layer over
  positions ``<= t`` (sliding: llama.cpp's window, the last ``sliding_window - 1`` of them). The loss is
  cross-entropy against the target's greedy token at ``t+k`` (the token a greedy verifier accepts), summed
  over ``k = 1..n_draft``. The multi-query forward (:func:`drafter_forward`) is transformers' own drafter
  text model with per-query masks; ``tests/test_demo_train.py`` checks it against the drafter's
  one-query-per-call forward.

Imports: numpy, torch, transformers (lazily), :mod:`.recipe`, :mod:`.compact`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any, cast

import numpy as np
import torch

from mtpscope.demo.train.compact import CompactVocab, compact_cross_entropy, full_argmax
from mtpscope.demo.train.recipe import BOS, EOS, PAD, DrafterShape, Recipe, TargetShape


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
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    c = Gemma4TextConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    c._attn_implementation = "eager"
    return Gemma4ForCausalLM(c).float()


def make_drafter(cfg: dict[str, Any]) -> Any:
    """A fresh ``Gemma4AssistantForCausalLM`` (fp32, eager attention) from a config dict."""
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM

    c = Gemma4AssistantConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    c._attn_implementation = "eager"
    c.get_text_config()._attn_implementation = "eager"
    return Gemma4AssistantForCausalLM(c).float()


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
        loss = cast(torch.Tensor, sum(losses))  # n_draft >= 1 steps: a tensor, never sum()'s start 0
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
