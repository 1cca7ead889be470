"""The drafter's centroid head: the 262,144 ids in 2048 clusters of 128 (a permutation of all ids: used ids
clustered by their drafter embedding rows, balanced, unused ids spread over the clusters), and
``centroids`` trained so that the top-k clusters hold the target's token (:func:`fit_centroid_head`).

Imports: numpy, torch, mtpscope.errors, :mod:`.recipe`, :mod:`.compact`, :mod:`.models`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mtpscope.demo.train.compact import CompactVocab
from mtpscope.demo.train.models import drafter_chain, target_pass
from mtpscope.demo.train.recipe import N_VOCAB, Recipe
from mtpscope.errors import MtpscopeError


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
    """Cluster the drafter's embedding rows and train the centroids (:mod:`mtpscope.demo.train`, step 6). The kept
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
