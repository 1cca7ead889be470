"""MLX-VLM's own Gemma 4 MTP loop, observed: :class:`MlxRuntime` (the only module that imports ``mlx`` /
``mlx_vlm``, lazily, as :mod:`traces.run.llama.binding` is the only ``llama_cpp`` importer).

Nothing of the loop is re-implemented. :meth:`MlxRuntime.run` calls mlx-vlm's public
``mlx_vlm.generate.ar.generate_step(..., draft_model=drafter, draft_kind="mtp")`` (greedy: ``temperature=0``)
and, for the length of that call only, wraps these functions of the installed mlx-vlm 0.7.10 to watch it:

* ``mlx_vlm.speculative.mtp._mtp_draft_position`` (the drafter's RoPE position from the target's KV length,
  ``kv_valid_len - 1``): records the pending token's position ``p`` (= that KV length) and the position
  used. ``draft_position="p"`` replaces its result by ``p`` (llama.cpp's convention) - the one change
  the runtime can make to the loop, documented in docs/RUNTIMES.md;
* the drafter's ``draft_block`` and ``_forward_hidden`` (instance attributes, so nothing global): the
  pending token, the K drafts, and per step the hidden row fed in (``h``), ``post_projection``'s output
  (``h_next``) and the final-norm output (``h_inner``);
* ``mlx_vlm.speculative.mtp._mtp_verify_target`` and ``_mtp_acceptance_walk``: the verify batch, the
  number accepted and the tokens the round emits.

Timings force evaluation: ``t_draft_ms`` ends with ``mx.eval`` of the drafts, ``t_verify_ms`` (verify
forward, acceptance walk) with ``mx.eval`` of the verify hidden states, so MLX's lazy graph is timed where
its work happens (this removes the overlap ``mx.async_eval`` gives the loop; docs/RUNTIMES.md). What the
trace holds beyond the loop's own values is recomputed after the timed span from arrays the loop made:
the drafter's dense logits (``h_inner`` times the tied embedding: the loop's greedy path uses the centroid
head and makes none) and the target's logits at every verify row (``speculative_logits_from_hidden`` of the
verify hidden states).

Imports: numpy, mlx / mlx_vlm (lazily), mtpscope.errors, traces.run.mtp_runtime (its round records),
traces.run.target_side.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.errors import RuntimeUnavailableError, TraceError
from mtpscope.traces.run.mtp_runtime import DraftStep, RoundResult
from mtpscope.traces.run.target_side import target_stats

#: the mlx-vlm release whose loop functions this module wraps (their names are private there)
MLX_VLM_TESTED = "0.7.10"
#: ``draft_position`` choices: ``"p-1"`` mlx-vlm's own (``kv_valid_len - 1``), ``"p"`` llama.cpp's
DRAFT_POSITIONS = ("p-1", "p")
_WRAPPED = ("_mtp_draft_position", "_mtp_verify_target", "_mtp_acceptance_walk")


def mlx_unavailable() -> str | None:
    """Why the MLX runtime cannot run here (one line), or None when ``mlx`` and ``mlx_vlm`` import and
    mlx-vlm's MTP loop has the functions this module wraps."""
    try:
        import mlx.core  # noqa: F401 - only checks that it imports
        from mlx_vlm.speculative import mtp
    except Exception as e:  # noqa: BLE001 - any import failure (missing wheel, missing libs) means "not here"
        return f"mlx / mlx-vlm not importable ({type(e).__name__}: {e}); install mtpscope[mlx]"
    missing = [n for n in _WRAPPED if not callable(getattr(mtp, n, None))]
    if missing:
        return f"mlx-vlm's MTP loop lacks {', '.join(missing)} (tested with mlx-vlm {MLX_VLM_TESTED})"
    return None


def _mlx() -> tuple[Any, Any]:
    """``(mlx.core, mlx_vlm.speculative.mtp)``, or :class:`RuntimeUnavailableError` saying why not."""
    why = mlx_unavailable()
    if why is not None:
        raise RuntimeUnavailableError(why)
    import mlx.core as mx
    from mlx_vlm.speculative import mtp
    return mx, mtp


def versions() -> dict[str, str]:
    """The manifest's runtime versions: ``{"mlx": ..., "mlx_vlm": ...}`` (package metadata)."""
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for name in ("mlx", "mlx-vlm"):
        try:
            out[name.replace("-", "_")] = version(name)
        except PackageNotFoundError:
            out[name.replace("-", "_")] = "unknown"
    return out


def _read_config(cfg_path: Path, role: str) -> dict[str, Any]:
    """A checkpoint's ``config.json`` (``role``: "target" / "assistant", for the message).

    Raises:
        TraceError: missing or not JSON.
    """
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise TraceError(f"cannot read the {role}'s config.json", path=str(cfg_path), actual=str(e)) from e
    return cfg if isinstance(cfg, dict) else {}


def _source_stamp(src: Path, role: str, out: Path) -> dict[str, Any] | None:
    """The stamp of a checkpoint re-labelled into ``out`` (its folder, config's and weights' size and mtime),
    or None when ``out/source.json`` already holds it (the copy is current). Write it there once the copy is
    made.

    Raises:
        TraceError: the checkpoint has no single ``model.safetensors``.
    """
    cfg_path, w_path = src / "config.json", src / "model.safetensors"
    if not w_path.is_file():
        raise TraceError(f"the {role} checkpoint has no model.safetensors", path=str(src),
                         expected="one model.safetensors (sharded checkpoints: not supported here)")
    stamp = {"source": str(src.resolve()), "config": [cfg_path.stat().st_size, cfg_path.stat().st_mtime_ns],
             "weights": [w_path.stat().st_size, w_path.stat().st_mtime_ns]}
    try:
        if json.loads((out / "source.json").read_text(encoding="utf-8")) == stamp:
            return None
    except (OSError, ValueError):
        pass
    return stamp


def _write_checkpoint(out: Path, mx: Any, weights: dict[str, Any], config: dict[str, Any], stamp: dict[str, Any],
                      *, index: bool = False) -> Path:
    """Write a re-labelled checkpoint into ``out``: ``model.safetensors`` (with ``index``: its one-file
    ``model.safetensors.index.json`` too), ``config.json``, then ``source.json`` with :func:`_source_stamp`'s
    stamp, last, so that it marks a complete copy."""
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    if index:
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": dict.fromkeys(sorted(weights), "model.safetensors")}),
            encoding="utf-8")
    (out / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    (out / "source.json").write_text(json.dumps(stamp), encoding="utf-8")
    return out


def mlx_target_checkpoint(hf_target: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> Path:
    """A Hugging Face target checkpoint as mlx-vlm's ``gemma4`` loads it.

    mlx-vlm loads Gemma 4 only as the multimodal ``gemma4`` model. A checkpoint that already says
    ``model_type: gemma4`` is returned as is. A text-only one (``gemma4_text``, ``Gemma4ForCausalLM``) is
    re-labelled into ``out_dir``: ``config.json`` with the text config nested as ``text_config``; the weights
    renamed ``model.X`` -> ``model.language_model.X`` (unchanged bytes); a ``model.safetensors.index.json``
    listing only them, from which mlx-vlm drops the vision / audio towers it finds no weights for. Rewritten
    only when the source's config or weights changed (size and mtime in ``out_dir/source.json``).

    Raises:
        TraceError: no config.json / model.safetensors, or a model_type other than gemma4 / gemma4_text.
        RuntimeUnavailableError: mlx is not importable (it reads and writes the weights).
    """
    src = Path(hf_target)
    cfg_path, w_path = src / "config.json", src / "model.safetensors"
    cfg = _read_config(cfg_path, "target")
    mt = cfg.get("model_type")
    if mt == "gemma4":
        return src
    if mt != "gemma4_text":
        raise TraceError("not a Gemma 4 target checkpoint", path=str(cfg_path), key="model_type",
                         expected="gemma4 or gemma4_text", actual=mt)
    out = Path(out_dir)
    stamp = _source_stamp(src, "target", out)
    if stamp is None:
        return out
    mx, _ = _mlx()
    text = {k: v for k, v in cfg.items() if k != "architectures"}
    new_cfg = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "text_config": text,
               "vocab_size": cfg.get("vocab_size"), "hidden_size": cfg.get("hidden_size"),
               "tie_word_embeddings": cfg.get("tie_word_embeddings", True), "eos_token_id": cfg.get("eos_token_id"),
               "pad_token_id": cfg.get("pad_token_id", 0)}
    weights = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
               for k, v in mx.load(str(w_path)).items()}
    return _write_checkpoint(out, mx, weights, new_cfg, stamp, index=True)


def mlx_dense_assistant(hf_assistant: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> Path:
    """The assistant checkpoint without its centroid head, so that mlx-vlm drafts with the dense head as
    llama.cpp does (``record --runtime mlx --mlx-head dense``).

    mlx-vlm builds the sparse head (``masked_embedding``) when the config says ``use_ordered_embeddings`` and
    then drafts with it on the greedy path; llama.cpp's upstream drafter always drafts with the dense head
    (``token_embd · h_inner``, the same tied embedding). A checkpoint without ordered embeddings is returned as
    is; otherwise it is re-labelled into ``out_dir``: ``config.json`` with ``use_ordered_embeddings: false``
    and the weights without ``masked_embedding.*`` (the others unchanged). Rewritten only when the source's
    config or weights changed (size and mtime in ``out_dir/source.json``).

    Raises:
        TraceError: no readable config.json / model.safetensors.
        RuntimeUnavailableError: mlx is not importable (it reads and writes the weights).
    """
    src = Path(hf_assistant)
    cfg_path, w_path = src / "config.json", src / "model.safetensors"
    cfg = _read_config(cfg_path, "assistant")
    if not cfg.get("use_ordered_embeddings"):
        return src
    out = Path(out_dir)
    stamp = _source_stamp(src, "assistant", out)
    if stamp is None:
        return out
    mx, _ = _mlx()
    weights = {k: v for k, v in mx.load(str(w_path)).items() if not k.startswith("masked_embedding.")}
    return _write_checkpoint(out, mx, weights, {**cfg, "use_ordered_embeddings": False}, stamp)


#: ``MlxRuntime(head=...)``: the checkpoint's own head (the centroid head where it has one) or the dense head
HEADS = ("checkpoint", "dense")


@dataclass
class _Round:
    """What the wrappers saw of the round in progress."""

    pos: int = 0
    draft_pos: int = 0
    pending: int = 0
    drafted: tuple[int, ...] = ()
    steps: list[tuple[Any, Any, Any]] | None = None
    t_draft_ms: float = 0.0
    t_verify0: float = 0.0
    verify: Any = None


class _Observer:
    """The wrappers around mlx-vlm's loop functions for one :meth:`MlxRuntime.run` (see the module doc)."""

    def __init__(self, rt: MlxRuntime, trace: bool) -> None:
        self.rt, self.trace = rt, trace
        self.cur = _Round()
        self.last_pos = (0, 0)
        self.done: list[RoundResult] = []
        self.n_round = 0

    # --- wrappers (each calls the original and returns what it returned, except the draft position option)
    def draft_position(self, orig: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def wrapped(kv_valid_len: Any) -> Any:
            used = kv_valid_len if self.rt.draft_position == "p" else orig(kv_valid_len)
            if isinstance(kv_valid_len, int):
                self.last_pos = (kv_valid_len, int(used))
            return used
        return wrapped

    def draft_block(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        mx = self.rt.mx

        def wrapped(last_bonus: Any, *args: Any, **kwargs: Any) -> Any:
            self.cur = _Round(pos=self.last_pos[0], draft_pos=self.last_pos[1], pending=int(last_bonus),
                              steps=[] if self.trace else None)
            t0 = time.perf_counter()
            out = orig(last_bonus, *args, **kwargs)
            mx.eval(out)
            self.cur.t_draft_ms = (time.perf_counter() - t0) * 1e3
            self.cur.drafted = tuple(int(t) for t in np.asarray(out).reshape(-1))
            return out
        return wrapped

    def forward_hidden(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(inputs_embeds: Any, *args: Any, **kwargs: Any) -> Any:
            last_hidden, h = orig(inputs_embeds, *args, **kwargs)
            if self.cur.steps is not None:
                self.cur.steps.append((inputs_embeds, last_hidden, h))
            return last_hidden, h
        return wrapped

    def verify_target(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.cur.t_verify0 = time.perf_counter()
            return orig(*args, **kwargs)
        return wrapped

    def acceptance_walk(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        mx = self.rt.mx

        def wrapped(lm: Any, verify: Any, *args: Any, **kwargs: Any) -> Any:
            accepted, new_tokens = orig(lm, verify, *args, **kwargs)
            mx.eval(verify.hidden)
            t_verify_ms = (time.perf_counter() - self.cur.t_verify0) * 1e3
            self.done.append(self._result(lm, verify.hidden, int(accepted), [int(t) for t in new_tokens],
                                          t_verify_ms))
            return accepted, new_tokens
        return wrapped

    def _result(self, lm: Any, verify_hidden: Any, accepted: int, emitted: list[int], t_verify_ms: float) -> RoundResult:
        """The round as a :class:`RoundResult`; the recomputed values (target logits, drafter logits) after the
        timed span."""
        cur, rt, mx = self.cur, self.rt, self.rt.mx
        logits = np.asarray(rt.mtp._mtp_logits_from_hidden(lm, verify_hidden).astype(mx.float32)).reshape(
            -1, rt.n_vocab)
        target = tuple(int(t) for t in logits.argmax(axis=1))
        steps: tuple[DraftStep, ...] = ()
        p_d: tuple[float, ...] = ()
        ent: tuple[float, ...] = ()
        if cur.steps is not None and cur.drafted:
            nb = rt.n_embd_backbone
            out = []
            for (emb, h_next, h_inner), tok in zip(cur.steps, cur.drafted):
                hi = np.asarray(h_inner.astype(mx.float32)).reshape(-1)
                out.append(DraftStep(token=tok, logits=rt.dense_logits(hi),
                                     h=np.asarray(emb.astype(mx.float32)).reshape(-1)[nb:].copy(),
                                     h_next=np.asarray(h_next.astype(mx.float32)).reshape(-1).copy(), h_inner=hi))
            steps = tuple(out)
            p, e = target_stats(logits[:len(cur.drafted)], cur.drafted)
            p_d, ent = tuple(float(x) for x in p), tuple(float(x) for x in e)
        res = RoundResult(round=self.n_round, pos=cur.pos, pending_token=cur.pending, drafted=cur.drafted,
                          target=target, n_accepted=accepted, emitted=tuple(emitted), t_draft_ms=cur.t_draft_ms,
                          t_verify_ms=t_verify_ms, steps=steps, target_p_drafted=p_d, target_entropy=ent)
        self.n_round += 1
        return res

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """The wrappers in place for the ``with`` block; the originals back after it, whatever happens."""
        mtp, drafter = self.rt.mtp, self.rt.drafter
        saved = {n: getattr(mtp, n) for n in _WRAPPED}
        try:
            mtp._mtp_draft_position = self.draft_position(saved["_mtp_draft_position"])
            mtp._mtp_verify_target = self.verify_target(saved["_mtp_verify_target"])
            mtp._mtp_acceptance_walk = self.acceptance_walk(saved["_mtp_acceptance_walk"])
            # instance attributes shadow the class's methods for this drafter object only
            object.__setattr__(drafter, "draft_block", self.draft_block(type(drafter).draft_block.__get__(drafter)))
            object.__setattr__(drafter, "_forward_hidden",
                               self.forward_hidden(type(drafter)._forward_hidden.__get__(drafter)))
            yield
        finally:
            for n, f in saved.items():
                setattr(mtp, n, f)
            for n in ("draft_block", "_forward_hidden"):    # the class's methods show through again
                with contextlib.suppress(AttributeError):
                    object.__delattr__(drafter, n)


class MlxRuntime:
    """mlx-vlm's Gemma 4 MTP loop on a target and its assistant, loaded once (CPU or Metal: MLX's default
    device).

    Args:
        target: a Hugging Face target checkpoint folder (``gemma4``, or text-only ``gemma4_text``:
            re-labelled into ``work_dir`` by :func:`mlx_target_checkpoint`).
        assistant: a Hugging Face ``gemma4_assistant`` checkpoint folder (loaded as is).
        work_dir: where a re-labelled target is kept.
        draft_position: ``"p-1"`` (mlx-vlm's own) or ``"p"`` (llama.cpp's; see the module doc).
        dtype: ``None`` keeps the checkpoints' dtypes; ``"f32"`` casts both models' weights to float32.
        head_choice: ``"checkpoint"`` (mlx-vlm's own: the centroid head where the assistant has one) or
            ``"dense"`` (llama.cpp's: the assistant re-labelled by :func:`mlx_dense_assistant` into ``work_dir``).

    Attributes:
        n_embd_backbone, n_embd, n_vocab: the target's hidden size, the drafter's, the vocabulary.
        dtype: the weights' dtype as run (``"float16"``, ...), head: ``"centroid"`` (masked embedding) or
        ``"dense"``; eog: the target's end-of-generation ids from its config.

    Raises:
        RuntimeUnavailableError: mlx / mlx-vlm missing; TraceError: bad checkpoints or option values.
    """

    def __init__(self, target: str | os.PathLike[str], assistant: str | os.PathLike[str], *,
                 work_dir: str | os.PathLike[str], draft_position: str = "p-1", dtype: str | None = None,
                 head_choice: str = "checkpoint") -> None:
        if head_choice not in HEADS:
            raise TraceError("unknown drafter head choice", key="head", expected=" | ".join(HEADS), actual=head_choice)
        if draft_position not in DRAFT_POSITIONS:
            raise TraceError("unknown draft position convention", key="draft_position",
                             expected=" | ".join(DRAFT_POSITIONS), actual=draft_position)
        if dtype not in (None, "f32"):
            raise TraceError("unknown dtype", key="dtype", expected="f32 or none", actual=dtype)
        self.mx, self.mtp = _mlx()
        from mlx_vlm.speculative.drafters import load_drafter
        from mlx_vlm.utils import load_model

        self.draft_position = draft_position
        tdir = mlx_target_checkpoint(target, Path(work_dir) / "mlx-target")
        self.model = load_model(tdir)
        if head_choice == "dense":
            assistant = mlx_dense_assistant(assistant, Path(work_dir) / "mlx-assistant-dense")
        self.drafter, kind = load_drafter(str(assistant), kind="mtp")
        if kind != "mtp":
            raise TraceError("the assistant is not an MTP drafter for mlx-vlm", path=str(assistant),
                             expected="mtp", actual=kind)
        if dtype == "f32":
            self.model.set_dtype(self.mx.float32)
            self.drafter.set_dtype(self.mx.float32)
        tc = self.model.config.text_config
        self.n_embd_backbone = int(tc.hidden_size)
        self.n_embd = int(self.drafter.config.text_config.hidden_size)
        self.n_vocab = int(tc.vocab_size)
        self.dtype = str(self.drafter.model.embed_tokens.weight.dtype).replace("mlx.core.", "")
        self.head = "centroid" if getattr(self.drafter, "masked_embedding", None) is not None else "dense"
        eos = json.loads((Path(target) / "config.json").read_text(encoding="utf-8")).get("eos_token_id")
        self.eog = frozenset([eos] if isinstance(eos, int) else (eos or []))
        self._embed_t: np.ndarray | None = None

    def dense_logits(self, h_inner: np.ndarray) -> np.ndarray:
        """The drafter's dense head (tied embedding) at ``h_inner``: ``float32[n_vocab]``, in numpy float32
        (recomputed; mlx-vlm's greedy path with a centroid head computes only the candidates' logits)."""
        if self._embed_t is None:
            w = self.drafter.model.embed_tokens.weight.astype(self.mx.float32)
            self._embed_t = np.ascontiguousarray(np.asarray(w).T)
        out: np.ndarray = np.asarray(h_inner, dtype=np.float32) @ self._embed_t
        return out

    def convention(self, *, stop_at_eog: bool) -> dict[str, Any]:
        """The manifest's ``convention`` record of this runtime (docs/RUNTIMES.md)."""
        return {"runtime": "mlx", "draft_position": self.draft_position,
                "draft_position_note": "p = position of the pending token (the target's KV length); mlx-vlm "
                                       "feeds the drafter at p - 1 unless the option 'p' is given",
                "head": self.head, "dtype": self.dtype,
                "last_round": "n_draft = min(n_draft, max_tokens - emitted) (block = min(n_draft + 1, remaining + 1))",
                "eog": ("the round loop does not stop at end of generation; the recorder stops taking tokens after "
                        "the first one (as mlx_vlm.stream_generate does), the round holding it keeps its later tokens"
                        if stop_at_eog else "no stop at end of generation: max_tokens per prompt"),
                "timing": "mx.eval forced at the end of the drafts and of the verify walk"}

    def run(self, tokens: Sequence[int], *, n_draft: int, max_tokens: int, trace: bool = True,
            stop_at_eog: bool = True) -> Generator[RoundResult, None, None]:
        """Run mlx-vlm's greedy MTP loop on one prompt, yielding each round as it finishes.

        Args:
            tokens: prompt token ids; n_draft: drafts per round (mlx-vlm's ``draft_block_size - 1``);
            max_tokens: generated tokens at most, the prefill's token included (mlx-vlm's ``max_tokens``).
            trace: keep per-step data (h, h_next, h_inner, dense logits) and the target's side.
            stop_at_eog: stop taking tokens after the first end-of-generation token (the loop may have made
                more in that round: they stay in its ``emitted``).

        The prefill's token is the first round's ``pending_token``.

        Raises:
            TraceError: an empty prompt, ``n_draft < 1``.
        """
        if not tokens:
            raise TraceError("empty prompt", key="tokens", expected="at least one token", actual=0)
        if n_draft < 1:
            raise TraceError("n_draft must be >= 1", key="n_draft", expected=">= 1", actual=n_draft)
        from mlx_vlm.generate.ar import generate_step

        obs = _Observer(self, trace)
        mx = self.mx
        with obs.installed():
            gen = generate_step(mx.array([list(tokens)]), self.model, None, None, max_tokens=max_tokens,
                                temperature=0.0, draft_model=self.drafter, draft_kind="mtp",
                                draft_block_size=n_draft + 1)
            try:
                for tok, _ in gen:
                    while obs.done:
                        yield obs.done.pop(0)
                    if stop_at_eog and int(tok) in self.eog:
                        break
                while obs.done:
                    yield obs.done.pop(0)
            finally:
                gen.close()


__all__ = ["DRAFT_POSITIONS", "MLX_VLM_TESTED", "MlxRuntime", "mlx_target_checkpoint", "mlx_unavailable",
           "versions"]
