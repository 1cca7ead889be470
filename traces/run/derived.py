"""``h_inner`` derived from what llama.cpp hands out, without hooking the drafter's graph: :class:`HInnerSolver`.

The ``gemma4-assistant`` drafter ends (llama.cpp ``src/models/gemma4-assistant.cpp``; HF
``Gemma4AssistantForCausalLM``, ``final_logit_softcapping: null``) with

    h_inner = result_norm                     (n_embd,)
    logits  = token_embd . h_inner            (n_vocab,)        no soft-capping in the drafter
    h_next  = post_projection . h_inner       (n_embd_backbone,)

so ``h_inner`` is the solution of a linear least-squares problem over rows of ``[post_projection;
token_embd]`` whose right-hand sides the recorder already has (the ``nextn`` row and the logits of every
step). With ``n_embd_backbone >= n_embd`` (26B-A4B: 2816 >= 1024) ``post_projection`` alone determines it
(``pinv(post_projection) . h_next``); otherwise (the tiny demo pairs: 64 < 128) a subset of ``token_embd``'s
rows joins it: ``2 * n_embd`` rows in 16 blocks spread over the vocabulary. The solver is built once from
the drafter GGUF (:func:`h_inner_solver`: the weights' dequantized values, a factorisation of the normal
equations, O(m n^2) for m rows) and then costs one ``(n_steps, m) @ (m, n_embd)`` product per round.

What llama.cpp computes is ``W . r(h_inner)``: ggml's CPU ``mul_mat`` first rounds the activations to the
weight's ``vec_dot_type`` (F16 weights: F16; BF16: BF16; Q8_0 / Q4_0 & co.: Q8_0 blocks of 32; k-quants:
Q8_K blocks of 256; F32: none). Rows from one weight give back ``r(h_inner)`` exactly (up to F32 summation
order); rows from two weights mix two roundings. Sources are therefore taken in order of their rounding
(finest first) until they determine ``h_inner``, and rows are weighted by ``1 / u`` of their weight
(:data:`ACTIVATION_ROUNDING`, at most :data:`U_FLOOR`). :meth:`HInnerSolver.bound` is the resulting worst-case norm-wise relative
error against the graph's ``result_norm`` (each source's rounding times the solve's amplification of it, plus
F32 summation noise); the recorder also measures the agreement with the in-graph capture on a few
calibration steps after every run and writes both to the manifest (``derived``).

Shapes: numpy order. Imports: numpy, mtpscope.errors, inspector.layouts (tensor names); lazily mtpscope.cache and inspector.gguf
(:func:`cached_solver`: the solve kept in the cache folder per drafter file).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.errors import LayoutError
from mtpscope.inspector.layouts import POST_PROJECTION as _POST_BY_DIALECT

#: unit roundoff of IEEE binary32 / binary16 / bfloat16 (round to nearest)
_U32, _U16, _UBF16 = 2.0 ** -24, 2.0 ** -11, 2.0 ** -8
#: Q8_0 activation blocks (``quantize_row_q8_0``): 32 elements, ``d = amax / 127`` stored as F16, ``q =
#: round(x / d)``: per element at most ``d / 2 + 127 |d - f16(d)|`` <= ``amax (0.5 + 127 U16) / 127``, so
#: norm-wise at most ``sqrt(32) (0.5 + 127 U16) / 127`` of the block's norm (amax <= the block's norm)
_UQ8_0 = math.sqrt(32) * (0.5 + 127 * _U16) / 127
#: Q8_K blocks (k-quant and i-quant weights): 256 elements, ``d = amax / 127`` in F32
_UQ8_K = math.sqrt(256) * (0.5 + 127 * _U32) / 127

#: norm-wise relative rounding ggml's CPU ``mul_mat`` applies to the activations before multiplying with a
#: weight of this type (``type_traits_cpu[type].vec_dot_type``, ggml-cpu.c): F32 none, F16 / BF16 one
#: rounding, block quants their activation blocks. Types not listed: the Q8_K bound (the coarsest).
ACTIVATION_ROUNDING: dict[str, float] = {
    "F32": 0.0, "F16": _U16, "BF16": _UBF16,
    **dict.fromkeys(("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "IQ4_NL", "MXFP4"), _UQ8_0),
}
#: singular values below this share of the largest are treated as zero (directions the outputs do not see)
RCOND = 1e-6
#: the finest rounding a row weight stands for: rows are weighted by ``1 / max(u, U_FLOOR)``, so an exact
#: (F32) source outweighs an F16 one 32 : 1 and a Q8_0 one about 1500 : 1 -- enough to prefer it, and far
#: from :data:`RCOND`, so directions only a coarser source sees are never cut
U_FLOOR = 2.0 ** -16
#: a source whose condition number is at most this determines h_inner alone
COND_ALONE = 100.0
#: up to this n_embd, a solve over several sources computes its norms exactly (SVDs of n x m matrices); above,
#: it bounds them from the eigenvalues (one source never needs them: its amplification is exactly 1)
EXACT_NORMS_MAX = 512
#: token_embd rows taken per n_embd when logits rows are needed, and the blocks they come in
ROWS_PER_EMBD, ROW_BLOCKS = 2, 16
#: the upstream drafter's post projection and embedding (tensor names: :mod:`inspector.layouts`)
POST_PROJECTION = _POST_BY_DIALECT["upstream"]
TOKEN_EMBD = "token_embd.weight"


def activation_rounding(type_name: str) -> float:
    """:data:`ACTIVATION_ROUNDING` of a ggml type name (the Q8_K bound for types not listed)."""
    return ACTIVATION_ROUNDING.get(type_name, _UQ8_K)


def gamma(n: int) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)`` for F32: the relative error bound of an n-term sum."""
    nu = n * _U32
    return nu / (1.0 - nu)


@dataclass(frozen=True)
class Source:
    """One block of rows of the least-squares problem.

    Attributes:
        name: ``"h_next"`` (rows of ``post_projection``) or ``"logits"`` (rows of ``token_embd``).
        tensor: the GGUF tensor; ggml_type: its type name; rounding: :func:`activation_rounding` of it.
        rows: for ``"logits"``, the token ids (int64) whose logits are used; None for ``"h_next"`` (all rows).
    """

    name: str
    tensor: str
    ggml_type: str
    rounding: float
    rows: np.ndarray | None = field(default=None, repr=False)


@dataclass(frozen=True)
class HInnerSolver:
    """``h_inner`` from a step's ``h_next`` and logits (see the module docstring); build with
    :func:`h_inner_solver`.

    Attributes:
        n_embd / n_embd_backbone / n_vocab: the drafter's widths.
        sources: the row blocks used, finest rounding first.
        xt: float32 ``(m, n_embd)``: ``h_inner = y @ xt`` for ``y`` the sources' values concatenated.
        rank: the numerical rank of the weighted system (``< n_embd``: the outputs do not see every direction
            of h_inner; the solution is then the minimum-norm one, i.e. the part they see).
        cond: the condition number of the weighted system over the kept singular values (for one source:
            of its unit-length rows).
        amplification: per source, the spectral norm of how the solve maps that source's activation
            rounding into h_inner (1 for a single full-rank source).
        bound_rel: worst-case norm-wise relative error against the graph's ``result_norm``
            (:meth:`bound`).
    """

    n_embd: int
    n_embd_backbone: int
    n_vocab: int
    sources: tuple[Source, ...]
    xt: np.ndarray = field(repr=False)
    rank: int
    cond: float
    amplification: tuple[float, ...]
    bound_rel: float

    @property
    def n_rows(self) -> int:
        return int(self.xt.shape[0])

    def inputs(self, logits: np.ndarray | Sequence[np.ndarray], h_next: np.ndarray | Sequence[np.ndarray], *,
               gathered: bool = False) -> np.ndarray:
        """The right-hand sides ``y`` (float32 ``(n, m)``) of ``n`` steps: their ``h_next`` rows
        (``(n, n_embd_backbone)``) and / or the logits at the sources' token ids (``(n, n_vocab)`` or n views; with
        ``gathered``, each row holds only the logits at :func:`logit_row_ids` ``(n_vocab, n_embd)``, which are the
        ``"logits"`` source's ids).

        Raises:
            LayoutError: ``gathered`` rows of another length than the source's ids.
        """
        parts = []
        for s in self.sources:
            if s.name == "h_next":
                parts.append(np.asarray(np.stack(h_next) if not isinstance(h_next, np.ndarray) else h_next,
                                        dtype=np.float32).reshape(-1, self.n_embd_backbone))
            elif gathered:
                y = np.stack([np.asarray(lg) for lg in logits]).astype(np.float32, copy=False)
                n_ids = 0 if s.rows is None else int(s.rows.shape[0])
                if y.shape[1] != n_ids:
                    raise LayoutError("derived h_inner: gathered logits of the wrong length", key="logit_rows",
                                      expected=n_ids, actual=y.shape[1])
                parts.append(y)
            else:
                parts.append(np.stack([np.asarray(lg)[s.rows] for lg in logits]).astype(np.float32, copy=False))
        return np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]

    def solve(self, logits: np.ndarray | Sequence[np.ndarray],
              h_next: np.ndarray | Sequence[np.ndarray], *, gathered: bool = False) -> np.ndarray:
        """``h_inner`` (float32 ``(n, n_embd)``) of ``n`` steps from their logits and ``h_next`` (either may
        be None when no source uses it); ``gathered``: the logits at :func:`logit_row_ids` only (:meth:`inputs`).

        Raises:
            LayoutError: an input of the wrong width.
        """
        y = self.inputs(logits, h_next, gathered=gathered)
        if y.shape[1] != self.n_rows:
            raise LayoutError("derived h_inner: inputs of the wrong width", key="h_next",
                              expected=self.n_rows, actual=y.shape[1])
        out: np.ndarray = y @ self.xt
        return out

    def bound(self) -> float:
        """Worst-case norm-wise relative error of :meth:`solve` against the graph's ``result_norm``:
        ``sum_k amplification_k * u_k`` (each source's activation rounding, :data:`ACTIVATION_ROUNDING`)
        plus F32 summation noise (Higham's gamma over each dot product, amplified by the solve). An upper
        bound: the measured agreement (manifest ``derived.max_rel_err``) is typically far below it."""
        return self.bound_rel

    def describe(self) -> dict[str, Any]:
        """The manifest's ``derived`` fields of this solver (without the measured agreement)."""
        return {"from": [s.name for s in self.sources],
                "weights": {s.tensor: s.ggml_type for s in self.sources},
                "n_rows": self.n_rows, "rank": self.rank, "n_embd": self.n_embd,
                "cond": float(self.cond), "bound_rel": float(self.bound_rel)}


def logit_row_ids(n_vocab: int, n_embd: int) -> np.ndarray:
    """The token ids whose drafter logits the solve may read (its ``"logits"`` source: ``ROWS_PER_EMBD * n_embd``
    ids in :data:`ROW_BLOCKS` blocks spread over the vocabulary), ``int64``, in the order the solve reads them. The
    recording worker sends a step's logits at these ids only (:func:`traces.run.step_analysis.summarize_drafts`), not
    the whole row; :meth:`HInnerSolver.solve` takes them with ``gathered=True``."""
    return _block_ids(_logit_rows(n_vocab, ROWS_PER_EMBD * n_embd))


def _block_ids(blocks: list[slice]) -> np.ndarray:
    """The token ids of contiguous ``blocks``, in order (int64)."""
    return np.concatenate([np.arange(b.start, b.stop, dtype=np.int64) for b in blocks])


def _logit_rows(n_vocab: int, n_rows: int) -> list[slice]:
    """:data:`ROW_BLOCKS` contiguous blocks of token ids spread evenly over the vocabulary."""
    per = -(-n_rows // ROW_BLOCKS)
    starts = np.linspace(0, max(n_vocab - per, 0), ROW_BLOCKS).astype(np.int64)
    return [slice(int(a), int(min(a + per, n_vocab))) for a in starts]


def _rows_of(f: Any, name: str, blocks: list[slice] | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Dequantized float64 rows of tensor ``name`` (all, or the given blocks) and their token ids."""
    if blocks is None:
        return np.asarray(f.tensor_data(name), dtype=np.float64), None
    parts = [np.asarray(f.tensor_data(name, rows=b), dtype=np.float64) for b in blocks]
    return np.concatenate(parts), _block_ids(blocks)


def _factor(blocks: list[tuple[np.ndarray, float]], n_embd: int) -> tuple[np.ndarray, int, float, list[float], float]:
    """Weighted least squares over the row blocks ``(W_k, u_k)``: rows normalised to unit length and
    weighted by ``1 / max(u_k, U_FLOOR)``. Returns ``(X, rank, cond, amplification_k, bound)`` with
    ``h = X @ y`` (X float64 ``(n_embd, m)``).

    Costs two ``m n^2`` products and one ``n^3`` eigendecomposition. One source's amplification is exactly 1
    (``X W`` projects onto the rows' span) and its norms are bounded from the eigenvalues
    (``||X|| <= max(s) / sigma_min(A_w)``, ``||A|| <= ||A||_F``); several sources get exact norms up to
    :data:`EXACT_NORMS_MAX` (SVDs), those bounds above it."""
    scaled, scales, grams = [], [], []
    for w, u in blocks:
        norms = np.linalg.norm(w, axis=1)
        ok = norms > 0
        s = np.zeros_like(norms)
        s[ok] = 1.0 / (norms[ok] * max(u, U_FLOOR))
        aw = w * s[:, None]
        scaled.append(aw)
        scales.append(s)
        grams.append(aw.T @ aw)
    g = np.sum(grams, axis=0)
    lam, v = np.linalg.eigh(g)
    lam = np.clip(lam, 0.0, None)
    sig = np.sqrt(lam)
    keep = sig > sig[-1] * RCOND
    rank = int(keep.sum())
    cond = float(sig[-1] / sig[keep][0]) if rank else math.inf
    vk = v[:, keep]
    pinv_g = (vk / lam[keep]) @ vk.T                      # (n, n): the pseudo-inverse of the normal equations
    x = np.concatenate([pinv_g @ aw.T * s[None, :] for aw, s in zip(scaled, scales, strict=True)], axis=1)
    inv_smin = 1.0 / float(sig[keep][0]) if rank else math.inf
    exact = len(blocks) > 1 and n_embd <= EXACT_NORMS_MAX
    if len(blocks) == 1:
        amps = [1.0]
    else:      # ||G^+ G_k||: exact up to EXACT_NORMS_MAX, else its Frobenius norm (an upper bound)
        amps = [float(np.linalg.norm(pinv_g @ gk, 2 if exact else "fro")) for gk in grams]
    bound, m0 = 0.0, 0
    for (w, u), s, amp in zip(blocks, scales, amps, strict=True):
        xk_norm = float(np.linalg.norm(x[:, m0:m0 + w.shape[0]], 2)) if exact else inv_smin * float(s.max())
        # rounding of the activations, and F32 summation in each of the block's dot products
        bound += amp * u + xk_norm * gamma(n_embd) * float(np.linalg.norm(w))
        m0 += w.shape[0]
    # the solve itself in F32: one m-term dot product per output element
    a_all = np.concatenate([w for w, _ in blocks])
    x_norm = float(np.linalg.norm(x, 2)) if exact else inv_smin * max(float(s.max()) for s in scales)
    bound += gamma(x.shape[1]) * x_norm * float(np.linalg.norm(a_all, 2 if exact else "fro"))
    return x, rank, cond, amps, bound


def h_inner_solver(f: Any) -> HInnerSolver:
    """Build the solver of a ``gemma4-assistant`` drafter GGUF (an opened ``GGUFLike``: our reader).

    Reads ``nextn.post_projection.weight`` (numpy ``(n_embd_backbone, n_embd)``) and, when it does not
    determine h_inner alone with a finer rounding, ``2 * n_embd`` rows of ``token_embd.weight`` (numpy
    ``(n_vocab, n_embd)``), dequantized (their values as ggml multiplies them).

    Raises:
        LayoutError: the file has no post-projection or no token embedding of matching width.
    """
    names = {t.name: t for t in f.tensors}
    for nm in (POST_PROJECTION, TOKEN_EMBD):
        if nm not in names:
            raise LayoutError("derived h_inner needs the drafter's output weights", path=getattr(f, "path", None),
                              key=nm, expected="present", actual="missing")
    p_t, e_t = names[POST_PROJECTION], names[TOKEN_EMBD]
    n_bb, n_embd = int(p_t.shape[0]), int(p_t.shape[1])
    n_vocab = int(e_t.shape[0])
    if int(e_t.shape[1]) != n_embd:
        raise LayoutError("token_embd and post_projection disagree on n_embd", path=getattr(f, "path", None),
                          key=TOKEN_EMBD, expected=n_embd, actual=int(e_t.shape[1]))
    cands = [("h_next", POST_PROJECTION, p_t.type_name, None),
             ("logits", TOKEN_EMBD, e_t.type_name, _logit_rows(n_vocab, ROWS_PER_EMBD * n_embd))]
    cands.sort(key=lambda c: (activation_rounding(c[2]), c[0] != "h_next"))
    chosen: list[tuple[Source, np.ndarray]] = []
    for name, tensor, typ, blocks in cands:
        w, ids = _rows_of(f, tensor, blocks)
        chosen.append((Source(name, tensor, typ, activation_rounding(typ), ids), w))
        x, rank, cond, amps, bound = _factor([(w_, s.rounding) for s, w_ in chosen], n_embd)
        if rank == n_embd and cond <= COND_ALONE:
            break
    return HInnerSolver(n_embd=n_embd, n_embd_backbone=n_bb, n_vocab=n_vocab, sources=tuple(s for s, _ in chosen),
                        xt=np.ascontiguousarray(x.T, dtype=np.float32), rank=rank, cond=cond,
                        amplification=tuple(amps), bound_rel=bound)


#: bump when what :func:`h_inner_solver` computes changes: solves cached under an older version are rebuilt
SOLVER_VERSION = 1


def cached_solver(path: str | os.PathLike[str]) -> HInnerSolver:
    """:func:`h_inner_solver` of the drafter GGUF at ``path``, kept in ``<cache>/derived/`` (an ``.npz`` of its
    arrays and a JSON of the rest, no pickle) under the file's resolved path, size, mtime and
    :data:`SOLVER_VERSION`, so that later recordings with the same drafter load it (a few MB) instead of
    rebuilding it (about 0.7 CPU seconds at the 26B-A4B drafter's geometry). A cache entry that cannot be
    read is rebuilt; one that cannot be written is skipped.

    Raises:
        LayoutError: as :func:`h_inner_solver`; GGUFFormatError & co.: an unreadable GGUF; FileNotFoundError.
    """
    from mtpscope.cache import cache_dir
    from mtpscope.inspector.gguf import open_gguf

    p = Path(path).resolve()
    st = p.stat()
    key = hashlib.sha256(f"{SOLVER_VERSION}|{p}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:32]
    entry = cache_dir() / "derived" / f"{key}.npz"
    if entry.exists():
        try:
            return _load_solver(entry)
        except (OSError, ValueError, KeyError, TypeError):
            pass
    with open_gguf(p) as f:
        solver = h_inner_solver(f)
    try:
        _save_solver(solver, entry)
    except OSError:
        pass
    return solver


def _save_solver(s: HInnerSolver, entry: Path) -> None:
    meta = {"n_embd": s.n_embd, "n_embd_backbone": s.n_embd_backbone, "n_vocab": s.n_vocab, "rank": s.rank,
            "cond": s.cond, "amplification": list(s.amplification), "bound_rel": s.bound_rel,
            "sources": [{"name": x.name, "tensor": x.tensor, "ggml_type": x.ggml_type, "rounding": x.rounding}
                        for x in s.sources]}
    rows = {f"rows{i}": x.rows for i, x in enumerate(s.sources) if x.rows is not None}
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.with_name(entry.name + f".{os.getpid()}.tmp.npz")
    np.savez(tmp, xt=s.xt, meta=np.array(json.dumps(meta)), **rows)  # type: ignore[arg-type]  # numpy's stub checks **kwds against allow_pickle
    os.replace(tmp, entry)


def _load_solver(entry: Path) -> HInnerSolver:
    with np.load(entry, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        sources = tuple(Source(m["name"], m["tensor"], m["ggml_type"], float(m["rounding"]),
                               np.asarray(z[f"rows{i}"], dtype=np.int64) if f"rows{i}" in z.files else None)
                        for i, m in enumerate(meta["sources"]))
        xt = np.ascontiguousarray(z["xt"], dtype=np.float32)
    return HInnerSolver(n_embd=int(meta["n_embd"]), n_embd_backbone=int(meta["n_embd_backbone"]),
                        n_vocab=int(meta["n_vocab"]), sources=sources, xt=xt, rank=int(meta["rank"]),
                        cond=float(meta["cond"]), amplification=tuple(float(a) for a in meta["amplification"]),
                        bound_rel=float(meta["bound_rel"]))


def relative_errors(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per row, ``||got - ref|| / ||ref||`` (float64; 0 where both are 0)."""
    got64, ref64 = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    num = np.linalg.norm(got64 - ref64, axis=-1)
    den = np.linalg.norm(ref64, axis=-1)
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num > 0, np.inf, 0.0))


def calibration_entry(solver: HInnerSolver, steps: Sequence[Any]) -> dict[str, Any]:
    """The manifest's ``derived`` record: :meth:`HInnerSolver.describe` plus the agreement measured on
    calibration ``steps`` (``DraftStep`` s with logits, h_next and the in-graph ``h_inner``): ``max_rel_err``
    (largest norm-wise relative error), ``n_calibration`` steps, ``against`` what."""
    d = solver.describe()
    cal = [s for s in steps if s.h_inner is not None and s.logits is not None and s.h_next is not None]
    if cal:
        got = solver.solve([s.logits for s in cal], [s.h_next for s in cal])
        err = relative_errors(got, np.stack([s.h_inner for s in cal]))
        d.update(max_rel_err=float(err.max()), n_calibration=len(cal))
    else:
        d.update(max_rel_err=None, n_calibration=0)
    d["against"] = "cb_eval capture of result_norm (calibration steps after the run)"
    return d


__all__ = ["ACTIVATION_ROUNDING", "COND_ALONE", "HInnerSolver", "RCOND", "SOLVER_VERSION", "Source",
           "activation_rounding", "cached_solver", "calibration_entry", "gamma", "h_inner_solver", "logit_row_ids",
           "relative_errors"]
