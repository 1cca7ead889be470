"""Hugging Face transformers' own assisted generation with the Gemma 4 assistant, observed: :class:`HfRuntime`
(the only recording module that imports ``torch`` / ``transformers``, lazily; the parity extra).

Nothing of the loop is re-implemented. :meth:`HfRuntime.run` calls the target's public
``generate(input_ids, assistant_model=drafter, ...)`` (greedy, or ``do_sample`` with HF's Leviathan rejection
sampling, ``transformers.generation.utils._speculative_sampling``) and, for the length of that call only,
watches it:

* the target's ``_get_candidate_generator`` (an instance attribute shadows the method for this call): the
  candidate generator HF builds (``SinglePositionMultiTokenCandidateGenerator`` for a Gemma 4 assistant),
  whose ``get_candidates`` is wrapped on that object. Each call after the prefill is one round: its
  ``input_ids`` end with the pending token (position ``p = len(input_ids) - 1``), what it appends are the
  drafts; the tokens the next call (or ``generate``'s result) has beyond them are what the round emitted;
* a forward hook on the drafter (its ``inputs_embeds``: ``h`` is the part after the target embedding, its
  ``position_ids``, its ``logits`` and ``last_hidden_state``: ``h_next``) and one on its ``post_projection``
  (the input is ``h_inner``, the drafter's final-norm output);
* a forward hook on the target: the verify logits of each round (copied, before HF's logits processors
  change them in place).

With ``capture_calls`` the drafter's inputs are kept too (:class:`DrafterCall`: the shared K/V HF handed
over and the attention masks it built, through the drafter's ``create_attention_masks``), which is what a
step-by-step comparison with :class:`inspector.reference.ReferenceDrafter` needs (:func:`donor_kv`).

The draft length is fixed: the candidate generator takes ``num_assistant_tokens`` from the assistant's
``generation_config`` when it is built and never changes it (its ``update_candidate_strategy`` is the base
class's no-op); :meth:`HfRuntime.run` sets it to ``n_draft`` with the ``"constant"`` schedule for the call
and puts the previous values back afterwards (an assistant folder without ``generation_config.json``, as the
demo's, has None there, on which HF's loop fails).

Timings (torch on CPU, ``n_threads`` threads): ``t_draft_ms`` is ``get_candidates`` (the K drafter forwards
and HF's argmax), ``t_verify_ms`` the span from its return to the next round's start (the target's verify
forward, the acceptance rule, the cache crop, the stopping criteria), each less the time the hooks spent
copying tensors. Derived values are computed after ``generate`` returns: the drafter's dense logits
(``h_inner`` times the tied embedding, for a centroid head whose own logits are ``min - 1`` outside its
candidates) and the target's probability and entropy at each verify row (temperature 1).

Imports: numpy, torch / transformers (lazily), mtpscope.errors, inspector.reference (DonorKV),
traces.run.mtp_runtime (its round records), traces.run.target_side.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.errors import RuntimeUnavailableError, TraceError
from mtpscope.inspector.reference import DonorKV
from mtpscope.traces.run.mtp_runtime import DraftStep, RoundResult
from mtpscope.traces.run.target_side import target_stats

#: the transformers release whose assisted-generation loop this module observes (5.23 cannot run the drafter)
TRANSFORMERS_MIN = (5, 24)
#: HF's shared-K/V dictionary keys -> the reference drafter's layer kinds
KV_KINDS = {"sliding_attention": "sliding", "full_attention": "full"}


def hf_unavailable() -> str | None:
    """Why the HF runtime cannot run here (one line), or None when torch and transformers >= 5.24 import
    and transformers has the Gemma 4 assistant."""
    try:
        import torch  # noqa: F401 - only checks that it imports
        import transformers
        from transformers import Gemma4AssistantForCausalLM, Gemma4ForCausalLM  # noqa: F401 - only checks that 5.24 classes exist
    except Exception as e:  # noqa: BLE001 - any import failure (missing wheel, old release) means "not here"
        return f"torch / transformers not importable ({type(e).__name__}: {e}); install mtpscope[parity]"
    try:
        have = tuple(int(x) for x in transformers.__version__.split(".")[:2])
    except ValueError:
        return f"cannot read the transformers version {transformers.__version__!r}"
    if have < TRANSFORMERS_MIN:
        return (f"transformers {transformers.__version__} cannot run Gemma4AssistantForCausalLM; needs >= "
                f"{'.'.join(map(str, TRANSFORMERS_MIN))} (install mtpscope[parity])")
    return None


def versions() -> dict[str, str]:
    """The manifest's runtime versions: ``{"transformers": ..., "torch": ...}`` (package metadata)."""
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for name in ("transformers", "torch"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "unknown"
    return out


def visible_mask(mask: Any, n: int) -> np.ndarray:
    """HF's 4-D attention mask for one query (bool: True attends; float: 0 attends; None: all) as the
    ``(n,)`` bool visibility of the last ``n`` K/V entries."""
    if mask is None:
        return np.ones(n, dtype=bool)
    m = mask.reshape(-1)[-n:]
    if str(m.dtype) == "torch.bool":
        return np.asarray(m.cpu().numpy(), dtype=bool).copy()
    return np.asarray((m == 0).cpu().numpy(), dtype=bool).copy()


@dataclass(frozen=True)
class DrafterCall:
    """One drafter forward as HF ran it (``HfRuntime.run(capture_calls=True)``), numpy, float32.

    Attributes:
        embeds: ``(2 * n_embd_backbone,)`` the input row: the target's scaled embedding of the token fed, then ``h``.
        pos: the position id HF gave.
        kv: per HF layer type (``"sliding_attention"``, ``"full_attention"``) the shared ``(k, v)``, each
            ``(n_kv, n_head_kv, head_dim)``.
        visible: per layer type the ``(n_kv,)`` bool mask HF built (:func:`visible_mask`).
        logits: ``(n_vocab,)`` HF's logits (centroid head: ``min - 1`` outside its candidates).
        h_next: ``(n_embd_backbone,)`` the projected output.
    """

    embeds: np.ndarray = field(repr=False)
    pos: int
    kv: dict[str, tuple[np.ndarray, np.ndarray]] = field(repr=False)
    visible: dict[str, np.ndarray] = field(repr=False)
    logits: np.ndarray = field(repr=False)
    h_next: np.ndarray = field(repr=False)


def donor_kv(call: DrafterCall) -> dict[str, DonorKV]:
    """The call's K/V as :class:`inspector.reference.DonorKV` with HF's own visibility as the mask (positions
    0..n_kv-1, the array as HF handed it over): ``{"sliding": ..., "full": ...}``."""
    out = {}
    for name, kind in KV_KINDS.items():
        k, v = call.kv[name]
        out[kind] = DonorKV(k=k, v=v, pos=np.arange(len(k)), mask=call.visible[name])
    return out


@dataclass(frozen=True)
class HfRun:
    """One prompt through :meth:`HfRuntime.run`.

    Attributes:
        rounds: the rounds in order (the prefill's token is the first round's ``pending_token``).
        output: the generated ids (the prefill's token first), as ``generate`` returned them.
        calls: every drafter forward (with ``capture_calls``; else empty), in order.
    """

    rounds: tuple[RoundResult, ...]
    output: tuple[int, ...]
    calls: tuple[DrafterCall, ...] = ()


@dataclass
class _Round:
    """What the wrappers saw of the round in progress."""

    length: int
    pending: int
    drafted: tuple[int, ...] = ()
    steps: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    t_draft_ms: float = 0.0
    t_verify_ms: float = 0.0
    verify_logits: np.ndarray | None = None


class _Observer:
    """The hooks and wrappers of one :meth:`HfRuntime.run` (module doc)."""

    def __init__(self, rt: HfRuntime, trace: bool, capture_calls: bool) -> None:
        self.rt, self.trace, self.capture_calls = rt, trace, capture_calls
        self.cur: _Round | None = None
        self.done: list[tuple[_Round, tuple[int, ...]]] = []
        self.calls: list[DrafterCall] = []
        self.overhead = 0.0
        self.t_verify0 = 0.0
        self._masks: dict[str, Any] = {}
        self._h_inner = np.zeros(0, dtype=np.float32)

    def _close(self, ids: Sequence[int]) -> None:
        """End the round in progress: the tokens ``ids`` holds beyond its input are what it emitted."""
        cur = self.cur
        if cur is None:
            return
        cur.t_verify_ms = (time.perf_counter() - self.t_verify0 - self.overhead) * 1e3
        self.done.append((cur, tuple(int(t) for t in ids[cur.length:])))
        self.cur = None

    def get_candidates(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(input_ids: Any, *args: Any, **kwargs: Any) -> Any:
            ids = input_ids[0].tolist()
            self._close(ids)
            if kwargs.get("is_first_iteration"):
                return orig(input_ids, *args, **kwargs)
            self.cur = _Round(length=len(ids), pending=int(ids[-1]))
            self.overhead = 0.0
            t0 = time.perf_counter()
            cand, logits = orig(input_ids, *args, **kwargs)
            t1 = time.perf_counter()
            self.cur.t_draft_ms = (t1 - t0 - self.overhead) * 1e3
            self.cur.drafted = tuple(int(t) for t in cand[0, len(ids):].tolist())
            self.overhead = 0.0
            self.t_verify0 = time.perf_counter()
            return cand, logits
        return wrapped

    def candidate_generator(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            gen = orig(*args, **kwargs)
            if type(gen).__name__ != "SinglePositionMultiTokenCandidateGenerator":
                raise TraceError("transformers did not pick its Gemma 4 assistant loop", key="candidate_generator",
                                 expected="SinglePositionMultiTokenCandidateGenerator", actual=type(gen).__name__)
            gen.get_candidates = self.get_candidates(gen.get_candidates)
            return gen
        return wrapped

    def target_hook(self, _mod: Any, _args: Any, out: Any) -> None:
        cur = self.cur
        if cur is None or cur.verify_logits is not None:    # the prefill, or not a verify forward
            return
        t0 = time.perf_counter()
        n = len(cur.drafted) + 1
        cur.verify_logits = out.logits[0, -n:].detach().float().cpu().numpy().copy()
        self.overhead += time.perf_counter() - t0

    def masks(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            r = orig(*args, **kwargs)
            self._masks = dict(r)
            return r
        return wrapped

    def drafter_hook(self, _mod: Any, _args: Any, kwargs: dict[str, Any], out: Any) -> None:
        cur = self.cur
        if cur is None:
            return
        t0 = time.perf_counter()
        if self.trace or self.capture_calls:
            emb = kwargs["inputs_embeds"].detach().float().reshape(-1).cpu().numpy().copy()
            lg = out.logits.detach().float().reshape(-1).cpu().numpy().copy()
            hn = out.last_hidden_state.detach().float().reshape(-1).cpu().numpy().copy()
            cur.steps.append((emb, lg, hn, self._h_inner))
            if self.capture_calls:
                kv = {name: tuple(t.detach()[0].permute(1, 0, 2).float().cpu().numpy().copy() for t in pair)
                      for name, pair in kwargs["shared_kv_states"].items()}
                vis = {name: visible_mask(self._masks.get(name), len(kv[name][0])) for name in kv}
                self.calls.append(DrafterCall(embeds=emb, pos=int(kwargs["position_ids"].reshape(-1)[0]),
                                              kv=kv, visible=vis, logits=lg, h_next=hn))
        self.overhead += time.perf_counter() - t0

    def post_projection_hook(self, _mod: Any, args: Any, _out: Any) -> None:
        if self.cur is not None and (self.trace or self.capture_calls):
            t0 = time.perf_counter()
            self._h_inner = args[0].detach().float().reshape(-1).cpu().numpy().copy()
            self.overhead += time.perf_counter() - t0

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """The wrappers and hooks in place for the ``with`` block; everything removed after it."""
        tm, dm = self.rt.target_model, self.rt.drafter_model
        handles = [tm.register_forward_hook(self.target_hook),
                   dm.register_forward_hook(self.drafter_hook, with_kwargs=True),
                   dm.post_projection.register_forward_hook(self.post_projection_hook)]
        try:
            # instance attributes shadow the classes' methods for these two objects only
            tm._get_candidate_generator = self.candidate_generator(tm._get_candidate_generator)
            if self.capture_calls:
                dm.create_attention_masks = self.masks(dm.create_attention_masks)
            yield
        finally:
            for h in handles:
                h.remove()
            for obj, name in ((tm, "_get_candidate_generator"), (dm, "create_attention_masks")):
                with contextlib.suppress(AttributeError):
                    delattr(obj, name)


class HfRuntime:
    """A Gemma 4 target and its assistant loaded in transformers (float32, CPU), run through HF's own assisted
    generation.

    Args:
        target: a Hugging Face ``Gemma4ForCausalLM`` checkpoint folder (``gemma4_text``).
        assistant: a Hugging Face ``gemma4_assistant`` checkpoint folder.
        n_threads: torch's CPU threads (``torch.set_num_threads``, process-wide), default 1.
        attn_implementation: transformers' attention (``"eager"``: plain matrix products, as the parity
            tests compare with the numpy reference).

    Attributes:
        n_embd_backbone, n_embd, n_vocab: the target's hidden size, the drafter's, the vocabulary.
        head: ``"centroid"`` (``use_ordered_embeddings``) or ``"dense"``; dtype: ``"float32"``;
        eog: the ids ``generate`` stops at (the target's ``generation_config.eos_token_id``).

    Raises:
        RuntimeUnavailableError: torch / transformers >= 5.24 missing. TraceError: a folder without
            config.json, a checkpoint transformers cannot load, missing or unexpected weights.
    """

    def __init__(self, target: str | os.PathLike[str], assistant: str | os.PathLike[str], *, n_threads: int = 1,
                 attn_implementation: str = "eager") -> None:
        why = hf_unavailable()
        if why is not None:
            raise RuntimeUnavailableError(why)
        import torch
        from transformers import Gemma4AssistantForCausalLM, Gemma4ForCausalLM

        self.torch = torch
        if n_threads < 1:
            raise TraceError("threads must be >= 1", key="threads", expected=">= 1", actual=n_threads)
        torch.set_num_threads(int(n_threads))
        self.n_threads = int(n_threads)
        self.target_model = self._load(Gemma4ForCausalLM, target, attn_implementation)
        self.drafter_model = self._load(Gemma4AssistantForCausalLM, assistant, attn_implementation)
        tc = self.target_model.config.get_text_config()
        self.n_embd_backbone = int(tc.hidden_size)
        self.n_embd = int(self.drafter_model.config.get_text_config().hidden_size)
        self.n_vocab = int(tc.vocab_size)
        self.head = "centroid" if self.drafter_model.masked_embedding is not None else "dense"
        self.dtype = str(self.drafter_model.pre_projection.weight.dtype).replace("torch.", "")
        eos = self.target_model.generation_config.eos_token_id
        self.eog = frozenset([eos] if isinstance(eos, int) else (eos or []))
        self._lm_head_t: np.ndarray | None = None

    @staticmethod
    def _load(cls: Any, path: str | os.PathLike[str], attn: str) -> Any:
        p = Path(path)
        if not (p / "config.json").is_file():
            raise TraceError("not a Hugging Face checkpoint folder", path=str(p), expected="a folder with config.json",
                             actual="no config.json")
        from transformers.utils import logging as _hf_logging

        hf_logging: Any = _hf_logging       # (its functions carry no annotations)
        bar, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
        hf_logging.disable_progress_bar()       # no "Loading weights" bar, no load report on the recorder's stderr:
        hf_logging.set_verbosity_error()        # a mismatch is refused below, in one line
        try:
            model, info = cls.from_pretrained(p, dtype="float32", attn_implementation=attn, output_loading_info=True)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
            raise TraceError(f"transformers cannot load the checkpoint as {cls.__name__}", path=str(p),
                             expected=f"a {cls.__name__} checkpoint (config.json and model.safetensors)", actual=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
        finally:
            hf_logging.set_verbosity(level)
            if bar:
                hf_logging.enable_progress_bar()
        bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys") and v}
        if bad:
            raise TraceError(f"the checkpoint does not match {cls.__name__}", path=str(p), expected="all weights",
                             actual="; ".join(f"{k}: {', '.join(sorted(v)[:3])}" for k, v in bad.items()))
        return model.eval()

    def dense_logits(self, h_inner: np.ndarray) -> np.ndarray:
        """The drafter's dense head (its tied ``lm_head``) at ``h_inner``: ``float32[n_vocab]`` (recomputed in numpy;
        a centroid head's own logits hold only its candidates)."""
        if self._lm_head_t is None:
            w = self.drafter_model.lm_head.weight.detach().float().cpu().numpy()
            self._lm_head_t = np.ascontiguousarray(w.T)
        out: np.ndarray = np.asarray(h_inner, dtype=np.float32) @ self._lm_head_t
        return out

    def convention(self, *, greedy: bool) -> dict[str, Any]:
        """The manifest's ``convention`` record of this runtime (measured on the demo pair: docs/RUNTIMES.md)."""
        eog = sorted(self.eog)
        return {"runtime": "hf", "draft_position": "p",
                "draft_position_note": "p = position of the pending token (len(input_ids) - 1), the same position "
                                       "for every step of a round",
                "head": self.head, "dtype": self.dtype,
                "last_round": "n_draft = min(n_draft, max_tokens - emitted - 1) (SinglePositionMultiTokenCandidate"
                              "Generator: max_length - len(input_ids) - 1); a round may draft 0",
                "eog": f"stop at the first end-of-generation token of the target's generation_config ({eog}); "
                       "a round's tokens after it are dropped",
                "eog_ids": eog,
                "kv_visibility": "hf: the drafter sees rejected drafts' KV (full layers: the K/V array cut at the "
                                 "pending position, whose entry is the last round's first rejected draft) and the "
                                 "last W+1 entries handed over (sliding)",
                "acceptance": "greedy: longest prefix equal to the target's argmax" if greedy else
                              "Leviathan rejection sampling (transformers _speculative_sampling: accept d with "
                              "probability min(1, p(d)/q(d)), q = softmax of the drafter's own logits, p the "
                              "target's after its logits processors; resample from max(p - q, 0))",
                "n_draft_schedule": "constant (assistant generation_config.num_assistant_tokens = n_draft)",
                "timing": f"torch CPU, {self.n_threads} thread(s); hooks' copy time subtracted"}

    def run(self, tokens: Sequence[int], *, n_draft: int, max_tokens: int, temp: float = 0.0, seed: int = 0,
            top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, trace: bool = True,
            capture_calls: bool = False) -> HfRun:
        """Run HF's assisted generation on one prompt and return its rounds.

        Args:
            tokens: prompt token ids; n_draft: drafts per round (``num_assistant_tokens``);
            max_tokens: generated tokens at most, the prefill's token included (``max_new_tokens``).
            temp: 0 greedy; > 0 ``do_sample`` with ``temperature=temp``, ``top_k`` (0 off), ``top_p`` (1 off),
                ``min_p`` (0 off) as HF's logits processors; ``torch.manual_seed(seed)`` right before the call.
            trace: keep per-step data (h, h_next, h_inner, dense logits) and the target's side.
            capture_calls: keep every drafter call's inputs (:class:`DrafterCall`).

        Raises:
            TraceError: an empty prompt, ``n_draft < 1``, ``max_tokens < 1``, a token id outside the vocabulary.
        """
        if not tokens:
            raise TraceError("empty prompt", key="tokens", expected="at least one token", actual=0)
        if n_draft < 1:
            raise TraceError("n_draft must be >= 1", key="n_draft", expected=">= 1", actual=n_draft)
        if max_tokens < 1:
            raise TraceError("max_tokens must be >= 1", key="max_tokens", expected=">= 1", actual=max_tokens)
        bad = [t for t in tokens if not 0 <= int(t) < self.n_vocab]
        if bad:
            raise TraceError("token id outside the vocabulary", key="tokens", expected=f"0..{self.n_vocab - 1}",
                             actual=bad[0])
        torch = self.torch
        gc = self.drafter_model.generation_config
        saved = (gc.num_assistant_tokens, gc.num_assistant_tokens_schedule)
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = int(n_draft), "constant"
        kw: dict[str, Any] = {"do_sample": False}
        if temp > 0:
            kw = {"do_sample": True, "temperature": float(temp), "top_k": int(top_k) or None,
                  "top_p": float(top_p), "min_p": float(min_p) or None}
        obs = _Observer(self, trace, capture_calls)
        ids = torch.tensor([[int(t) for t in tokens]], dtype=torch.long)
        try:
            with obs.installed(), torch.no_grad():
                if temp > 0:
                    torch.manual_seed(int(seed))
                out = self.target_model.generate(ids, attention_mask=torch.ones_like(ids),
                                                 assistant_model=self.drafter_model, max_new_tokens=int(max_tokens),
                                                 **kw)
                seq = [int(t) for t in out[0].tolist()]
                obs._close(seq)
        finally:
            gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = saved
        rounds = tuple(self._result(i, cur, emitted, greedy=temp <= 0, trace=trace)
                       for i, (cur, emitted) in enumerate(obs.done))
        return HfRun(rounds=rounds, output=tuple(seq[len(tokens):]), calls=tuple(obs.calls))

    def _result(self, i: int, cur: _Round, emitted: tuple[int, ...], *, greedy: bool, trace: bool) -> RoundResult:
        """One round as a :class:`RoundResult` (after ``generate`` returned: the derived values)."""
        n_acc = len(emitted) - 1
        k = len(cur.drafted)
        # an accepted draft that is an end-of-generation token: HF cuts the round there and counts it as the
        # target's token, not as accepted (llama.cpp's eog_confirmed)
        eog_confirmed = (n_acc < k and bool(emitted) and emitted[-1] in self.eog and cur.drafted[n_acc] == emitted[-1])
        lg = cur.verify_logits
        if greedy and lg is not None:
            target: tuple[int | None, ...] = tuple(int(t) for t in lg.argmax(axis=1))
        else:
            target = tuple(emitted) + (None,) * (k + 1 - len(emitted))
        steps: tuple[DraftStep, ...] = ()
        p_d: tuple[float, ...] = ()
        ent: tuple[float, ...] = ()
        if trace and cur.drafted:
            nb = self.n_embd_backbone
            out = []
            for (emb, logits, h_next, h_inner), tok in zip(cur.steps, cur.drafted, strict=True):
                dense = self.dense_logits(h_inner) if self.head == "centroid" else logits
                out.append(DraftStep(token=tok, logits=dense, h=emb[nb:].copy(), h_next=h_next, h_inner=h_inner))
            steps = tuple(out)
            if lg is not None:
                p, e = target_stats(lg[:k], cur.drafted)
                p_d, ent = tuple(float(x) for x in p), tuple(float(x) for x in e)
        return RoundResult(round=i, pos=cur.length - 1, pending_token=cur.pending, drafted=cur.drafted, target=target,
                           n_accepted=n_acc, emitted=emitted, t_draft_ms=cur.t_draft_ms, t_verify_ms=cur.t_verify_ms,
                           steps=steps, target_p_drafted=p_d, target_entropy=ent, eog_confirmed=eog_confirmed)

    def generate_plain(self, tokens: Sequence[int], *, max_tokens: int) -> list[int]:
        """The target's own greedy ``generate`` without the assistant: the generated ids (``max_new_tokens``)."""
        torch = self.torch
        ids = torch.tensor([[int(t) for t in tokens]], dtype=torch.long)
        with torch.no_grad():
            out = self.target_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=int(max_tokens),
                                             do_sample=False)
        return [int(t) for t in out[0, len(tokens):].tolist()]


__all__ = ["DrafterCall", "HfRun", "HfRuntime", "KV_KINDS", "TRANSFORMERS_MIN", "donor_kv", "hf_unavailable",
           "versions", "visible_mask"]
