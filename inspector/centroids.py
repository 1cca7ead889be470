"""A drafter's centroid head (sparse LM head of the E2B / E4B assistants): the one record and its loading.

The head is a matrix of ``n_centroids`` centroid vectors (GGUF ``mtp.centroids.weight``,
``ne = (n_embd, n_centroids)``, numpy shape ``(n_centroids, n_embd)``) and a token ordering
(``mtp.token_ordering.weight``, ``ne = (n_vocab,)``, I32). Row ``j`` of the ordering viewed as
``(n_centroids, vsc)`` with ``vsc = n_vocab / n_centroids`` lists the tokens of centroid ``j``
(facts §3 step 5; fork src/models/gemma4-assistant.cpp views the ordering as ``[vsc, n_centroids]`` in ne
order, which is the same memory).

Sources (all give the same :class:`CentroidHead`):

* a fork-dialect GGUF (``gemma4_assistant``) or an upstream **sidecar** GGUF written by ``mtpscope
  convert --centroids-out`` (``gemma4-assistant-centroids``): the tensors above (or another name holding
  ``centroid`` / ``ordering``), keys ``{arch}.n_centroids`` and ``{arch}.centroid_top_k``
  (:meth:`CentroidHead.from_gguf`);
* a Hugging Face checkpoint folder or one ``.safetensors`` file: ``masked_embedding.centroids.weight``
  (numpy shape (n_centroids, n_embd)) and ``masked_embedding.token_ordering`` (int64, (n_vocab,)) read with
  :mod:`inspector.safetensors`; k from config.json ``centroid_intermediate_top_k`` (:meth:`CentroidHead.from_hf`);
* numpy arrays (:meth:`CentroidHead.from_arrays`).

Loading is tolerant so that broken heads can be explored (ids out of range, a transposed matrix);
:meth:`CentroidHead.ready` checks what per-step scoring (``traces.run.centroid_head``) needs and fixes
``top_k``. :func:`load_centroid_head`, :func:`head_from_gguf` and :func:`head_from_arrays` are the loaders
followed by ``ready``.

Usage (the app calls these)::

    head = CentroidHead.from_gguf(f)          # f = inspector.gguf.open_gguf(path)
    head.cluster_sizes()                      # np.ndarray[n_centroids] int64, distinct tokens per centroid
    ids = head.tokens_of(17)                  # np.ndarray[vsc] int32, token ids of centroid 17
    head.token_text(ids)                      # list[str], decoded with the file's own vocabulary
    head.centroid_of(token_id)                # int, or -1 when no centroid owns the token
    head.centroid_norms()                     # np.ndarray[n_centroids] float32 (L2 norms)
    head.pairwise_similarity([1, 5, 9])       # np.ndarray[k, k] float32 cosine similarities

Building the token → centroid map is one numpy scatter over the ordering (no Python loop): well under
a second for 262144 tokens (see benchmarks/).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.errors import HFCheckpointError, LayoutError
from mtpscope.inspector.layouts import (
    ARCH_FORK,
    FORK_CENTROIDS,
    FORK_ORDERING,
    UPSTREAM_MASKED_CENTROIDS,
    UPSTREAM_MASKED_ORDERING,
)

#: Default number of centroids kept when the source does not say (Gemma 4 E2B / E4B configs use 32).
DEFAULT_TOP_K = 32

#: Known names of the centroid matrix and the token ordering, preferred first: the fork's, upstream's masked
#: names, other converters' spellings, the HF names. THE one list (the reference drafter uses it too).
CENTROID_NAMES = (FORK_CENTROIDS, UPSTREAM_MASKED_CENTROIDS, "mtp_centroids.weight",
                  "masked_embedding.centroids.weight")
ORDERING_NAMES = (FORK_ORDERING, "mtp.token_ordering", UPSTREAM_MASKED_ORDERING,
                  "masked_embd_ordering.weight", "mtp_token_ordering.weight", "mtp_token_ordering",
                  "masked_embedding.token_ordering")
HF_CENTROIDS = "masked_embedding.centroids.weight"
HF_ORDERING = "masked_embedding.token_ordering"
_C_PAT = re.compile(r"centroid", re.I)
_O_PAT = re.compile(r"ordering", re.I)


def find_centroid_tensors(f: Any) -> tuple[str | None, str | None]:
    """Names of the centroid matrix and the token ordering in an open GGUF (known names first, then any
    name containing ``centroid`` / ``ordering``); None where absent."""
    names = [t.name for t in f.tensors]
    have = set(names)
    c = next((n for n in CENTROID_NAMES if n in have), None) or next((n for n in names if _C_PAT.search(n)), None)
    o = next((n for n in ORDERING_NAMES if n in have), None) or next((n for n in names if _O_PAT.search(n)), None)
    return c, o


def _token_to_centroid(ordering: np.ndarray, n_centroids: int) -> np.ndarray:
    """np.int32[n_vocab]: the first (lowest) ordering row listing each token, -1 where none does."""
    n_vocab = ordering.shape[0]
    vsc = n_vocab // n_centroids
    valid = (ordering >= 0) & (ordering < n_vocab)
    owner = np.arange(n_vocab, dtype=np.int32) // vsc
    t2c = np.full(n_vocab, -1, dtype=np.int32)
    # reversed so that, of the writes to one token, the lowest row is the last
    t2c[ordering[valid][::-1]] = owner[valid][::-1]
    return t2c


@dataclass(frozen=True, eq=False)
class CentroidHead:
    """A drafter's centroid head: data, exploration, and what per-step scoring needs.

    Attributes:
        source: the file or folder it was read from (``path`` is the same).
        kind: ``"gguf"`` (fork or sidecar GGUF), ``"hf"`` (safetensors) or ``"arrays"``.
        centroids: np.float32, numpy shape (rows, n_embd), read-only; rows = n_centroids for a well-formed
            head (a transposed GGUF matrix is already turned the right way).
        ordering: np.int32[n_vocab], read-only; row j of the (n_centroids, vsc) view lists centroid j's tokens.
        token_to_centroid: np.int32[n_vocab], read-only: the first ordering row listing each token, -1 for
            tokens no row lists (``token_centroid`` is the same array).
        n_centroids: number of centroids (the file's ``n_centroids`` key when it has one, else the matrix rows).
        top_k: centroids kept per step: the source's own (``centroid_top_k`` key / config.json
            ``centroid_intermediate_top_k``), None when it does not say; always set after :meth:`ready`.
        centroids_name / ordering_name: tensor names used (None for arrays).
        transposed: True when the GGUF stores the centroids as ``ne = (n_centroids, n_embd)`` (a converter
            bug the validator reports).
    """

    source: str
    kind: str
    centroids: np.ndarray
    ordering: np.ndarray
    token_to_centroid: np.ndarray
    n_centroids: int
    top_k: int | None = None
    centroids_name: str | None = None
    ordering_name: str | None = None
    transposed: bool = False
    _file: Any = dataclasses.field(default=None, repr=False)

    # --- building
    @classmethod
    def build(cls, centroids: np.ndarray, ordering: np.ndarray, *, n_centroids: int | None = None,
              top_k: int | None = None, source: str = "<arrays>", kind: str = "arrays",
              centroids_name: str | None = None, ordering_name: str | None = None, transposed: bool = False,
              file: Any = None) -> CentroidHead:
        """The record from arrays (copied to float32 / int32, read-only) with the checks every use needs.

        Args:
            centroids: numpy shape (n_centroids, n_embd).
            ordering: (n_vocab,) token ids, any integer dtype.
            n_centroids: default ``centroids.shape[0]``.

        Raises:
            LayoutError: centroids not a non-empty matrix, ordering not a vector of integers, or n_vocab not a
                multiple of n_centroids.
        """
        c = np.array(centroids, dtype=np.float32)
        o = np.asarray(ordering)
        if c.ndim != 2 or c.shape[0] == 0 or c.shape[1] == 0:
            raise LayoutError("centroids must be a non-empty matrix (n_centroids, n_embd)", path=source,
                              key=centroids_name or "centroids", expected="rank 2", actual=f"shape {c.shape}")
        if o.ndim != 1 or not np.issubdtype(o.dtype, np.integer):
            raise LayoutError("token ordering must be a vector of integer token ids", path=source,
                              key=ordering_name or "token_ordering", expected="rank 1 integer",
                              actual=f"shape {o.shape} {o.dtype}")
        n_c = int(n_centroids or c.shape[0])
        n_vocab = o.shape[0]
        if n_c <= 0 or n_vocab % n_c:
            raise LayoutError("n_vocab must be a multiple of n_centroids", path=source, key="token_ordering",
                              expected=f"multiple of {n_c}", actual=n_vocab)
        o32 = np.array(o, dtype=np.int32)
        t2c = _token_to_centroid(o32, n_c)
        for a in (c, o32, t2c):
            a.setflags(write=False)
        return cls(source=source, kind=kind, centroids=c, ordering=o32, token_to_centroid=t2c, n_centroids=n_c,
                   top_k=None if top_k is None else int(top_k), centroids_name=centroids_name,
                   ordering_name=ordering_name, transposed=transposed, _file=file)

    @classmethod
    def from_arrays(cls, centroids: np.ndarray, ordering: np.ndarray, *, top_k: int | None = None,
                    source: str = "<arrays>", kind: str = "arrays") -> CentroidHead:
        """:meth:`build` with n_centroids = ``centroids.shape[0]``."""
        return cls.build(centroids, ordering, top_k=top_k, source=source, kind=kind)

    @classmethod
    def from_gguf(cls, f: Any, n_centroids: int | None = None) -> CentroidHead:
        """Read the head from an open GGUF file (fork dialect or upstream sidecar); arrays are copied out.

        Args:
            f: ``inspector.gguf.GGUFFile`` (kept for :meth:`token_text`).
            n_centroids: override; default the ``{arch}.n_centroids`` key, else the centroid matrix width.

        Raises:
            LayoutError: no centroid matrix or ordering, an ordering that is not 1-D integers, a matrix not of
                rank 2, or n_vocab not a multiple of n_centroids.
        """
        c_name, o_name = find_centroid_tensors(f)
        path = str(getattr(f, "path", ""))
        if c_name is None or o_name is None:
            raise LayoutError("no centroid head in this file (no centroid matrix / token ordering tensor)",
                              path=path, key=c_name or o_name or FORK_CENTROIDS)
        ct, ot = f.tensor(c_name), f.tensor(o_name)
        if len(ot.ne) != 1 or ot.type_name not in ("I32", "I64", "I16"):
            raise LayoutError("token ordering must be a 1-D integer tensor", path=path, key=o_name,
                              expected="ne (n_vocab,) I32", actual=f"ne {list(ot.ne)} {ot.type_name}")
        if len(ct.ne) != 2:
            raise LayoutError("centroid matrix must be rank 2", path=path, key=c_name,
                              expected="ne (n_embd, n_centroids)", actual=list(ct.ne))
        arch = f.architecture or ""
        key_nc = f.get(f"{arch}.n_centroids")
        n_c = int(n_centroids or key_nc or ct.ne[1])
        transposed = ct.ne[1] != n_c and ct.ne[0] == n_c
        m = np.asarray(f.tensor_data(c_name), dtype=np.float32)
        top_k = None
        for key in (f"{arch}.centroid_top_k", f"{ARCH_FORK}.centroid_top_k"):
            v = f.get(key)
            if isinstance(v, int | np.integer) and not isinstance(v, bool):
                top_k = int(v)
                break
        return cls.build(m.T if transposed else m, np.asarray(f.tensor_data(o_name, dequantize=False)).reshape(-1),
                         n_centroids=n_c, top_k=top_k, source=path, kind="gguf", centroids_name=c_name,
                         ordering_name=o_name, transposed=bool(transposed), file=f)

    @classmethod
    def from_hf(cls, path: str | os.PathLike[str]) -> CentroidHead:
        """Read the head of a Hugging Face checkpoint folder (every ``*.safetensors``) or one ``.safetensors``
        file (a tensor whose name is, or ends with ``.`` +, ``masked_embedding.centroids.weight`` /
        ``masked_embedding.token_ordering``); top_k from config.json (its ``text_config`` as fallback).

        Raises:
            HFCheckpointError: no safetensors file, a bad header / data, or an unreadable config.json.
            LayoutError: no centroid head, or impossible shapes (as :meth:`build`).
        """
        from mtpscope.inspector.hf_config import read_config
        from mtpscope.inspector.safetensors import read_safetensors_header, tensor_array

        p = Path(path)
        files = [p] if p.is_file() else sorted(p.glob("*.safetensors"))
        if not files:
            raise HFCheckpointError("no .safetensors files in the directory", path=p,
                                    expected="model*.safetensors", actual="none")
        found: dict[str, Any] = {}
        for file in files:
            for name, t in read_safetensors_header(file).items():
                for want in (HF_CENTROIDS, HF_ORDERING):
                    if (name == want or name.endswith("." + want)) and want not in found:
                        found[want] = t
        missing = [n for n in (HF_CENTROIDS, HF_ORDERING) if n not in found]
        if missing:
            raise LayoutError("checkpoint has no centroid head", path=p, key=missing[0],
                              expected=f"{HF_CENTROIDS} and {HF_ORDERING}", actual="missing")
        cfg = read_config(p if p.is_dir() else p.parent)
        top_k = None
        for src in (cfg, cfg.get("text_config") or {}):
            v = src.get("centroid_intermediate_top_k") if isinstance(src, dict) else None
            if isinstance(v, int) and not isinstance(v, bool):
                top_k = v
                break
        ct, ot = found[HF_CENTROIDS], found[HF_ORDERING]
        return cls.build(tensor_array(ct), tensor_array(ot), top_k=top_k, source=os.fspath(p), kind="hf",
                         centroids_name=ct.name, ordering_name=ot.name)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CentroidHead:
        """:meth:`from_hf` for a folder or ``.safetensors`` file, else :meth:`from_gguf` of the opened GGUF
        (closed again: :meth:`token_text` then has no vocabulary).

        Raises:
            FileNotFoundError: path does not exist; others as those two and ``inspector.gguf.open_gguf``.
        """
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(2, "No such file or directory", os.fspath(p))
        if p.is_dir() or p.suffix == ".safetensors":
            return cls.from_hf(p)
        from mtpscope.inspector.gguf import open_gguf

        with open_gguf(p) as f:
            return dataclasses.replace(cls.from_gguf(f), _file=None)

    def ready(self, top_k: int | None = None) -> CentroidHead:
        """This head checked for per-step scoring, with ``top_k`` fixed.

        Args:
            top_k: centroids kept per step; default the source's own, else min(32, n_centroids).

        Raises:
            LayoutError: matrix rows != n_centroids, ordering ids outside [0, n_vocab), or top_k outside
                1..n_centroids.
        """
        if self.centroids.shape[0] != self.n_centroids:
            raise LayoutError("centroid matrix rows differ from n_centroids", path=self.source,
                              key=self.centroids_name or "centroids", expected=self.n_centroids,
                              actual=self.centroids.shape[0])
        o = self.ordering
        if o.size and (int(o.min()) < 0 or int(o.max()) >= self.n_vocab):
            raise LayoutError("token ordering holds ids outside [0, n_vocab)", path=self.source,
                              key="token_ordering", expected=f"0..{self.n_vocab - 1}",
                              actual=f"{int(o.min())}..{int(o.max())}")
        k = top_k or self.top_k or min(DEFAULT_TOP_K, self.n_centroids)
        if not 1 <= int(k) <= self.n_centroids:
            raise LayoutError("centroid top_k out of range", path=self.source, key="centroid_top_k",
                              expected=f"1..{self.n_centroids}", actual=k)
        return dataclasses.replace(self, top_k=int(k))

    def check_compatible(self, *, n_embd: int, n_vocab: int, drafter: str | os.PathLike[str]) -> None:
        """Raise :class:`LayoutError` unless this head fits a drafter of width ``n_embd`` and ``n_vocab`` tokens."""
        if self.n_embd != n_embd:
            raise LayoutError(f"centroid head width differs from the drafter's n_embd ({os.fspath(drafter)})",
                              path=self.source, key="n_embd", expected=n_embd, actual=self.n_embd)
        if self.n_vocab != n_vocab:
            raise LayoutError(f"token ordering length differs from the drafter's n_vocab ({os.fspath(drafter)})",
                              path=self.source, key="n_vocab", expected=n_vocab, actual=self.n_vocab)

    # --- sizes
    @property
    def path(self) -> str:
        """The source file / folder."""
        return self.source

    @property
    def n_embd(self) -> int:
        """Width of a centroid vector (the drafter's n_embd)."""
        return int(self.centroids.shape[1])

    @property
    def n_vocab(self) -> int:
        """Tokens in the ordering."""
        return int(self.ordering.shape[0])

    @property
    def vsc(self) -> int:
        """Tokens per centroid, ``n_vocab // n_centroids``."""
        return self.n_vocab // self.n_centroids

    @property
    def token_centroid(self) -> np.ndarray:
        """Same as ``token_to_centroid``."""
        return self.token_to_centroid

    # --- tokens
    def cluster_sizes(self) -> np.ndarray:
        """Distinct valid token ids listed in each centroid's row.

        Returns:
            np.ndarray[n_centroids] int64; every entry equals ``vsc`` for a well-formed head.
        """
        rows = np.sort(self.ordering.reshape(self.n_centroids, self.vsc), axis=1)
        valid = (rows >= 0) & (rows < self.n_vocab)
        new = np.ones_like(rows, dtype=bool)
        new[:, 1:] = rows[:, 1:] != rows[:, :-1]
        out: np.ndarray = (new & valid).sum(axis=1).astype(np.int64)
        return out

    def tokens_of(self, centroid: int) -> np.ndarray:
        """Token ids of ``centroid`` (its ordering row), np.ndarray[vsc] int32.

        Raises:
            IndexError: centroid outside 0..n_centroids-1.
        """
        c = int(centroid)
        if not 0 <= c < self.n_centroids:
            raise IndexError(f"centroid {c} outside 0..{self.n_centroids - 1}")
        return self.ordering[c * self.vsc:(c + 1) * self.vsc]

    def centroid_of(self, token_id: int) -> int:
        """The (first) centroid whose row lists ``token_id``; -1 when none does.

        Raises:
            IndexError: token id outside 0..n_vocab-1.
        """
        t = int(token_id)
        if not 0 <= t < self.n_vocab:
            raise IndexError(f"token {t} outside 0..{self.n_vocab - 1}")
        return int(self.token_to_centroid[t])

    def token_text(self, ids: Sequence[int] | np.ndarray) -> list[str]:
        """Token texts from the GGUF's own ``tokenizer.ggml.tokens`` (``"<id N>"`` where the source has no
        open tokenizer or the id is out of its range)."""
        toks: Any = self._file.get("tokenizer.ggml.tokens") if self._file is not None else None
        n = len(toks) if toks is not None else 0
        return [toks[int(i)] if 0 <= int(i) < n else f"<id {int(i)}>" for i in np.asarray(ids).ravel()]

    # --- vectors
    def centroid_vectors(self, ids: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """Centroid vectors as float32, numpy shape ``(k, n_embd)`` (all when ``ids`` is None)."""
        if ids is None:
            return self.centroids
        return self.centroids[np.asarray(ids, dtype=np.int64).reshape(-1)]

    def centroid_norms(self) -> np.ndarray:
        """L2 norm of every centroid vector, np.ndarray[n_centroids] float32."""
        m = self.centroids
        out: np.ndarray = np.sqrt(np.einsum("ij,ij->i", m, m, dtype=np.float64)).astype(np.float32)
        return out

    def pairwise_similarity(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Cosine similarity between the given centroids, np.ndarray[k, k] float32 (0 for zero vectors)."""
        m = self.centroid_vectors(ids).astype(np.float64)
        n = np.linalg.norm(m, axis=1)
        n[n == 0] = 1.0
        u = m / n[:, None]
        out: np.ndarray = (u @ u.T).astype(np.float32)
        return out

    def sample(self, k: int, seed: int = 0) -> np.ndarray:
        """``k`` distinct centroid ids chosen with a seeded generator (sorted), np.ndarray[k] int64."""
        k = min(int(k), self.n_centroids)
        return np.sort(np.random.default_rng(seed).choice(self.n_centroids, size=k, replace=False))


def head_from_arrays(centroids: np.ndarray, ordering: np.ndarray, *, top_k: int = DEFAULT_TOP_K,
                     source: str = "<arrays>", kind: str = "arrays") -> CentroidHead:
    """A :class:`CentroidHead` from arrays, ready for per-step scoring (:meth:`CentroidHead.ready`).

    Args:
        centroids: numpy shape (n_centroids, n_embd).
        ordering: shape (n_vocab,) token ids, any integer dtype.
        top_k: centroids kept per step, 1 <= top_k <= n_centroids.

    Raises:
        LayoutError: wrong ranks, n_vocab not a multiple of n_centroids, ids out of range, bad top_k.
    """
    return CentroidHead.from_arrays(centroids, ordering, source=source, kind=kind).ready(top_k)


def head_from_gguf(f: Any, *, top_k: int | None = None) -> CentroidHead:
    """:meth:`CentroidHead.from_gguf` of an open GGUF, ready for per-step scoring (``top_k`` default: the
    file's ``centroid_top_k`` key, else min(32, n_centroids)).

    Raises:
        LayoutError: as :meth:`CentroidHead.from_gguf` and :meth:`CentroidHead.ready`.
    """
    return CentroidHead.from_gguf(f).ready(top_k)


def load_centroid_head(path: str | os.PathLike[str], *, top_k: int | None = None) -> CentroidHead:
    """Read a centroid head from a fork-dialect or sidecar GGUF, a Hugging Face folder, or a ``.safetensors``
    file (:meth:`CentroidHead.load`), ready for per-step scoring.

    Args:
        path: the source.
        top_k: override the number of centroids kept (default: the source's own, else min(32, n_centroids)).

    Raises:
        LayoutError: the source has no centroid head, or its tensors have impossible shapes.
        HFCheckpointError: unreadable safetensors / config.json.
        GGUFFormatError and friends: from the GGUF reader.
        FileNotFoundError: path does not exist.
    """
    return CentroidHead.load(path).ready(top_k)


__all__ = ["CENTROID_NAMES", "DEFAULT_TOP_K", "ORDERING_NAMES", "CentroidHead", "find_centroid_tensors",
           "head_from_arrays", "head_from_gguf", "load_centroid_head"]
