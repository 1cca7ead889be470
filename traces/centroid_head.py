"""The sparse centroid LM head of a Gemma 4 assistant drafter, computed next to the dense head.

Upstream llama.cpp always drafts with the dense head (``logits = token_embd · h_inner``). Fork-dialect
GGUFs and Hugging Face checkpoints also carry a centroid head; this module computes, per draft step,
what that head would have chosen, from the drafter's ``h_inner`` (the ``result_norm`` node).

Math (gemma4-assistant facts §3.5; Hugging Face ``Gemma4AssistantForCausalLM`` masked embedding):
``c = centroids · h_inner`` (shape (n_centroids,)); ``top = top_k(c, k)``; the token ordering, viewed
as n_centroids rows of ``vsc = n_vocab / n_centroids`` token ids, gives the candidates (rows ``top``,
k·vsc ids); the candidates' logits are ``token_embd[ids] · h_inner`` - exactly the dense logits at
those ids, since both heads share the drafter's tied ``token_embd`` - and every other token is masked
out; the sparse draft is the argmax.

Sources:

* a fork-dialect GGUF (``gemma4_assistant``): tensors ``mtp.centroids.weight`` (``ne`` [n_embd,
  n_centroids], numpy shape (n_centroids, n_embd)) and ``mtp.token_ordering.weight`` (I32, [n_vocab]);
  k from ``gemma4_assistant.centroid_top_k``. Read with our reader :func:`inspector.gguf.open_gguf`.
* a Hugging Face checkpoint directory (or one ``.safetensors`` file): ``masked_embedding.centroids.weight``
  (numpy shape (n_centroids, n_embd)) and ``masked_embedding.token_ordering`` (int64, (n_vocab,)), read
  with :mod:`inspector.hf` (our safetensors parser; BF16 widened to float32); k from config.json
  ``centroid_intermediate_top_k``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inspector.errors import HFCheckpointError, LayoutError

#: Default number of centroids kept when the source does not say (Gemma 4 E2B / E4B configs use 32).
DEFAULT_TOP_K = 32

_GGUF_CENTROID_NAMES = ("mtp.centroids.weight", "masked_embd_centroids.weight", "mtp_centroids.weight")
_GGUF_ORDERING_NAMES = ("mtp.token_ordering.weight", "masked_embd_ordering", "masked_embd_ordering.weight",
                        "mtp_token_ordering.weight")
_HF_CENTROIDS = "masked_embedding.centroids.weight"
_HF_ORDERING = "masked_embedding.token_ordering"


@dataclass(frozen=True)
class CentroidHead:
    """A centroid head ready to score h_inner vectors.

    Attributes:
        source: the file or directory it was read from.
        kind: "gguf" or "hf".
        centroids: float32, numpy shape (n_centroids, n_embd).
        ordering: int32, shape (n_vocab,); row j of the (n_centroids, vsc) view lists centroid j's tokens.
        token_centroid: int32, shape (n_vocab,): the centroid whose row holds each token id (-1 if none).
        top_k: centroids kept per step.
    """

    source: str
    kind: str
    centroids: np.ndarray
    ordering: np.ndarray
    token_centroid: np.ndarray
    top_k: int

    @property
    def n_centroids(self) -> int:
        return int(self.centroids.shape[0])

    @property
    def n_embd(self) -> int:
        return int(self.centroids.shape[1])

    @property
    def n_vocab(self) -> int:
        return int(self.ordering.shape[0])

    @property
    def vsc(self) -> int:
        """Tokens per centroid, n_vocab / n_centroids."""
        return self.n_vocab // self.n_centroids

    def check_compatible(self, *, n_embd: int, n_vocab: int, drafter: str | os.PathLike[str]) -> None:
        """Raise :class:`LayoutError` unless this head fits a drafter of width ``n_embd`` and ``n_vocab`` tokens."""
        if self.n_embd != n_embd:
            raise LayoutError(f"centroid head width differs from the drafter's n_embd ({os.fspath(drafter)})",
                              path=self.source, key="n_embd", expected=n_embd, actual=self.n_embd)
        if self.n_vocab != n_vocab:
            raise LayoutError(f"token ordering length differs from the drafter's n_vocab ({os.fspath(drafter)})",
                              path=self.source, key="n_vocab", expected=n_vocab, actual=self.n_vocab)


@dataclass(frozen=True)
class CentroidStep:
    """What the centroid head makes of one h_inner.

    Attributes:
        centroid_ids: int32 (top_k,), best first (ties: lower id first).
        centroid_logits: float32 (top_k,), ``centroids[id] · h_inner``.
        candidate_ids: int32 (top_k·vsc,), the ordering rows of ``centroid_ids`` in that order.
        centroid_token: argmax of the sparse head over the candidates (ties: lowest token id), or None
            when no dense logits were given.
        target_in_candidates: whether the target's token is a candidate (None without a target token).
        target_centroid: the centroid whose row holds the target's token (None if unknown / absent).
        target_centroid_rank: rank of that centroid among all centroids by logit (0 = best; ties count
            only strictly greater logits).
    """

    centroid_ids: np.ndarray
    centroid_logits: np.ndarray
    candidate_ids: np.ndarray
    centroid_token: int | None
    target_in_candidates: bool | None
    target_centroid: int | None
    target_centroid_rank: int | None


def head_from_arrays(centroids: np.ndarray, ordering: np.ndarray, *, top_k: int = DEFAULT_TOP_K,
                     source: str = "<arrays>", kind: str = "arrays") -> CentroidHead:
    """Build and validate a :class:`CentroidHead`.

    Args:
        centroids: numpy shape (n_centroids, n_embd).
        ordering: shape (n_vocab,) token ids, any integer dtype.
        top_k: centroids kept per step, 1 <= top_k <= n_centroids.

    Raises:
        LayoutError: wrong ranks, n_vocab not a multiple of n_centroids, ids out of range, bad top_k.
    """
    c = np.asarray(centroids, dtype=np.float32)
    o = np.asarray(ordering)
    if c.ndim != 2 or c.shape[0] == 0 or c.shape[1] == 0:
        raise LayoutError("centroids must be a non-empty matrix (n_centroids, n_embd)", path=source,
                          key="centroids", expected="rank 2", actual=f"shape {c.shape}")
    if o.ndim != 1 or not np.issubdtype(o.dtype, np.integer):
        raise LayoutError("token ordering must be a vector of integer token ids", path=source,
                          key="token_ordering", expected="rank 1 integer", actual=f"shape {o.shape} {o.dtype}")
    n_centroids, n_vocab = c.shape[0], o.shape[0]
    if n_vocab % n_centroids:
        raise LayoutError("n_vocab must be a multiple of n_centroids", path=source, key="token_ordering",
                          expected=f"multiple of {n_centroids}", actual=n_vocab)
    if n_vocab and (int(o.min()) < 0 or int(o.max()) >= n_vocab):
        raise LayoutError("token ordering holds ids outside [0, n_vocab)", path=source, key="token_ordering",
                          expected=f"0..{n_vocab - 1}", actual=f"{int(o.min())}..{int(o.max())}")
    if not 1 <= int(top_k) <= n_centroids:
        raise LayoutError("centroid top_k out of range", path=source, key="centroid_top_k",
                          expected=f"1..{n_centroids}", actual=top_k)
    o32 = o.astype(np.int32)
    vsc = n_vocab // n_centroids
    token_centroid = np.full(n_vocab, -1, dtype=np.int32)
    # row j holds ordering[j*vsc:(j+1)*vsc]; a token listed twice keeps its first row
    rows = np.repeat(np.arange(n_centroids, dtype=np.int32), vsc)
    token_centroid[o32[::-1]] = rows[::-1]
    c.setflags(write=False)
    o32.setflags(write=False)
    token_centroid.setflags(write=False)
    return CentroidHead(source=source, kind=kind, centroids=c, ordering=o32, token_centroid=token_centroid,
                        top_k=int(top_k))


def centroid_step(head: CentroidHead, h_inner: np.ndarray, *, dense_logits: np.ndarray | None = None,
                  target_token: int | None = None) -> CentroidStep:
    """Score one h_inner with the centroid head (formula in the module docstring).

    Args:
        h_inner: shape (n_embd,), the drafter's ``result_norm`` output for this step.
        dense_logits: shape (n_vocab,), the drafter's dense logits for the same step (they equal
            ``token_embd · h_inner``); needed for ``centroid_token``.
        target_token: the target's token at this position, if known.
    """
    h = np.asarray(h_inner, dtype=np.float32).reshape(1, -1)
    lg = None if dense_logits is None else [dense_logits]
    return centroid_steps(head, h, dense_logits=lg, target_tokens=[target_token])[0]


def centroid_steps(head: CentroidHead, h_inner: np.ndarray, *, dense_logits: np.ndarray | None = None,
                   target_tokens: Sequence[int | None] | None = None) -> list[CentroidStep]:
    """:func:`centroid_step` for several steps at once (one matrix product; used per round).

    Args:
        h_inner: shape (n_steps, n_embd).
        dense_logits: shape (n_steps, n_vocab) (or a sequence of n_steps vectors), or None.
        target_tokens: one target token (or None) per step, or None.
    """
    hs = np.asarray(h_inner, dtype=np.float32)
    if hs.ndim != 2 or hs.shape[1] != head.n_embd:
        raise LayoutError("h_inner must have shape (n_steps, n_embd)", key="h_inner",
                          expected=f"(n, {head.n_embd})", actual=f"shape {hs.shape}")
    n = hs.shape[0]
    # both operands C-contiguous: numpy 2.4 takes a ~50x slower path for a transposed (F-ordered) operand
    c = np.ascontiguousarray((head.centroids @ np.ascontiguousarray(hs.T)).T)   # (n, n_centroids)
    rows = head.ordering.reshape(head.n_centroids, head.vsc)
    lg = None if dense_logits is None else [np.asarray(x).reshape(-1) for x in dense_logits]
    tts = list(target_tokens) if target_tokens is not None else [None] * n
    out: list[CentroidStep] = []
    for i in range(n):
        ci = c[i]
        top = _top_k_desc(ci, head.top_k).astype(np.int32)
        cand = rows[top].reshape(-1)
        token: int | None = None
        if lg is not None:
            vals = lg[i][cand]
            token = int(cand[vals == vals.max()].min())
        tin: bool | None = None
        tc: int | None = None
        tcr: int | None = None
        t = tts[i]
        if t is not None and 0 <= int(t) < head.n_vocab:
            cid = int(head.token_centroid[int(t)])
            if cid >= 0:
                tc = cid
                tcr = int(np.count_nonzero(ci > ci[cid]))
                tin = bool(cid in top)
            else:
                tin = False
        out.append(CentroidStep(centroid_ids=top, centroid_logits=ci[top].astype(np.float32), candidate_ids=cand,
                                centroid_token=token, target_in_candidates=tin, target_centroid=tc,
                                target_centroid_rank=tcr))
    return out


def _top_k_desc(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, best first, ties by lower index (exact)."""
    k = min(int(k), x.shape[0])
    kth = -np.partition(-x, k - 1)[k - 1]
    hit = np.flatnonzero(x >= kth)
    return hit[np.lexsort((hit, -x[hit]))][:k]


def load_centroid_head(path: str | os.PathLike[str], *, top_k: int | None = None) -> CentroidHead:
    """Read a centroid head from a fork-dialect GGUF, a Hugging Face directory, or a ``.safetensors`` file.

    Args:
        path: the source.
        top_k: override the number of centroids kept (default: the source's own, else
            min(32, n_centroids)).

    Raises:
        LayoutError: the source has no centroid head, or its tensors have impossible shapes.
        HFCheckpointError: unreadable safetensors / config.json.
        GGUFFormatError and friends: from the GGUF reader.
        FileNotFoundError: path does not exist.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(2, "No such file or directory", os.fspath(p))
    if p.is_dir() or p.suffix == ".safetensors":
        return _load_hf(p, top_k)
    return _load_gguf(p, top_k)


def _load_gguf(p: Path, top_k: int | None) -> CentroidHead:
    from inspector.gguf import open_gguf  # noqa: PLC0415

    with open_gguf(p) as f:
        return head_from_gguf(f, top_k=top_k)


def head_from_gguf(f: Any, *, top_k: int | None = None) -> CentroidHead:
    """The centroid head of an already open GGUF (:class:`inspector.gguf.GGUFFile`); see
    :func:`load_centroid_head` for names, keys and errors. The arrays are copied out of the file."""
    p = Path(f.path)
    names = [t.name for t in f.tensors]
    cname = next((n for n in _GGUF_CENTROID_NAMES if n in names), None) or \
        next((n for n in names if "centroid" in n), None)
    oname = next((n for n in _GGUF_ORDERING_NAMES if n in names), None) or \
        next((n for n in names if "ordering" in n), None)
    if cname is None or oname is None:
        raise LayoutError("GGUF has no centroid head (expected mtp.centroids.weight and "
                          "mtp.token_ordering.weight, fork dialect)", path=p,
                          key="mtp.centroids.weight" if cname is None else "mtp.token_ordering.weight",
                          expected="present", actual="missing")
    cinfo = f.tensor(cname)
    if len(cinfo.shape) != 2:
        raise LayoutError("centroid tensor must be 2-D", path=p, key=cname, expected="ne [n_embd, n_centroids]",
                          actual=f"ne {list(cinfo.ne)}")
    centroids = np.array(f.tensor_data(cname), dtype=np.float32)
    ordering = np.array(f.tensor_data(oname, dequantize=False)).reshape(-1)
    if not np.issubdtype(ordering.dtype, np.integer):
        raise LayoutError("token ordering must be an integer tensor", path=p, key=oname, expected="I32",
                          actual=f.tensor(oname).type_name)
    k = top_k
    if k is None:
        arch = f.architecture or ""
        for key in (f"{arch}.centroid_top_k", "gemma4_assistant.centroid_top_k"):
            v = f.get(key)
            if isinstance(v, (int, np.integer)):
                k = int(v)
                break
    return head_from_arrays(centroids, ordering, top_k=k or min(DEFAULT_TOP_K, centroids.shape[0]),
                            source=os.fspath(p), kind="gguf")


def _hf_files(p: Path) -> list[Path]:
    if p.is_file():
        return [p]
    files = sorted(p.glob("*.safetensors"))
    if not files:
        raise HFCheckpointError("no .safetensors files in the directory", path=p,
                                expected="model*.safetensors", actual="none")
    return files


def _load_hf(p: Path, top_k: int | None) -> CentroidHead:
    from inspector import hf  # noqa: PLC0415

    found: dict[str, np.ndarray] = {}
    for file in _hf_files(p):
        for name, t in hf.read_safetensors_header(file).items():
            for want in (_HF_CENTROIDS, _HF_ORDERING):
                if (name == want or name.endswith("." + want)) and want not in found:
                    found[want] = hf.tensor_array(t)
    missing = [n for n in (_HF_CENTROIDS, _HF_ORDERING) if n not in found]
    if missing:
        raise LayoutError("checkpoint has no centroid head", path=p, key=missing[0],
                          expected="masked_embedding.centroids.weight and masked_embedding.token_ordering",
                          actual="missing")
    k = top_k
    if k is None:
        cfg_path = (p if p.is_dir() else p.parent) / "config.json"
        if cfg_path.exists():
            try:
                cfg = json.loads(cfg_path.read_text())
            except (OSError, ValueError) as e:
                raise HFCheckpointError(f"unreadable config.json: {e}", path=cfg_path) from e
            for src in (cfg, cfg.get("text_config") or {}):
                v = src.get("centroid_intermediate_top_k") if isinstance(src, dict) else None
                if isinstance(v, int):
                    k = v
                    break
    return head_from_arrays(found[_HF_CENTROIDS], found[_HF_ORDERING],
                            top_k=k or min(DEFAULT_TOP_K, found[_HF_CENTROIDS].shape[0]),
                            source=os.fspath(p), kind="hf")
