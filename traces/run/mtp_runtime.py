"""The real llama.cpp MTP loop (Gemma 4 target + ``gemma4-assistant`` drafter): :class:`MtpRuntime`.

The loop (llama.cpp ``common/speculative.cpp``, ``draft-mtp`` with shared memory; facts §3-§5):

1. **Prefill**: the target decodes the prompt; its first token ``t0`` is the argmax (or a sample)
   of the last row; the drafter's first hidden input is the target's post-final-norm hidden state at
   the last prompt token (``llama_get_embeddings_nextn_ith``).
2. **Draft**: per round, K steps in the drafter context (``ctx_type = MTP``, ``ctx_other`` = the
   target's context, so it reads the target's KV cache). Every step feeds one token at the pending
   position ``pos`` (the same position for all K steps, as llama.cpp does for shared-memory drafters)
   with hidden row ``h``: step 1 feeds the pending token and the target's hidden state, step k > 1 the
   previous draft and the previous step's ``h_next``. The draft is the argmax of the dense head.
3. **Verify**: the target decodes ``[pending, d1..dK]`` at ``pos..pos+K`` in one batch. Greedy: accept
   the longest prefix with ``d_i == argmax(row i-1)``; with ``temp > 0`` the target samples row by row
   with a seeded chain (top-k, top-p, temperature, dist) and compares (not rejection sampling), as
   llama.cpp does. The round emits the accepted drafts plus the target's token at the first mismatch
   (or a bonus token). Rejected KV cells are removed (``llama_memory_seq_rm``); the next drafter input
   is the target's hidden row of the last accepted token.

A prompt's generated text is ``[rounds[0].pending_token] + concat(round.emitted)``. Generation stops at
an end-of-generation token or after ``max_tokens`` tokens (``t0`` included); the last rounds draft fewer
tokens so that no round overshoots ``max_tokens``.

With tracing and ``capture`` on, the drafter context carries a ``cb_eval`` callback that copies
``result_norm`` (h_inner; the callback is C where a compiler is at hand, :mod:`traces.run.llama.native_capture`);
logits and h_next come from the API. Without it (a recording's default) the loop hooks nothing and
``h_inner`` is derived from the logits and h_next (:mod:`traces.run.derived`); :meth:`MtpRuntime.calibrate`
gives the steps that measure the agreement. See :func:`traces.run.recorder.record` for what is stored.

:meth:`MtpRuntime.run` yields one :class:`RoundResult` per round (with per-step raw data when tracing);
:mod:`traces.run.step_analysis` turns those into trace records and :func:`traces.run.recorder.record` drives it.

Imports: numpy, mtpscope.errors, traces.run.llama (capture, model: llama.cpp's C API, lazily), traces.run.prompts,
traces.run.record_config, traces.run.target_side.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.errors import TraceError
from mtpscope.traces.run.llama.capture import node_capture
from mtpscope.traces.run.llama.model import DraftBatch, LlamaContext, LlamaModel, SamplerChain, TokenBatch
from mtpscope.traces.run.prompts import PromptSpec, check_tokens
from mtpscope.traces.run.record_config import RecordConfig, check_n_threads, server_threads
from mtpscope.traces.run.target_side import target_stats

#: the drafter graph node copied by the ``cb_eval`` capture: ``h_inner`` (the drafter's final-norm output)
H_INNER_NODE = "result_norm"
#: :meth:`MtpRuntime.calibrate`: drafter steps with the in-graph capture, and prompt tokens prefilled for them
CALIBRATION_STEPS, CALIBRATION_TOKENS = 3, 16
#: :meth:`MtpRuntime.probe_costs`: round sizes probed (drafts 0..PROBE_N_MAX: the what-if's range,
#: ``traces.analysis.costs.N_MAX``, held equal by tests/test_what_if.py; the worker does not load the
#: analysis modules), repetitions at most, and the wall seconds after which no new one starts
PROBE_N_MAX, PROBE_REPS, PROBE_BUDGET_S = 8, 5, 3.0
#: where a size's repetitions differ by more than PROBE_SPREAD (max / min), the probe adds repetitions, up to
#: PROBE_MAX_REPS, within PROBE_EXTRA_BUDGET_S more seconds (issue 34: a 2-repetition probe priced a spike)
PROBE_SPREAD, PROBE_MAX_REPS, PROBE_EXTRA_BUDGET_S = 1.5, 9, 3.0


def prompt_tokens(model: LlamaModel, text: str, *, chat: bool = False) -> list[int]:
    """Token ids of a text prompt with the target ``model``, as llama-server reads it: :func:`spec_tokens` of
    ``PromptSpec(text=text)`` (BOS added, special tokens such as ``<|turn>`` parsed; with ``chat`` the text is
    one user turn under the GGUF's chat template)."""
    return spec_tokens(model, PromptSpec(text=text), chat=chat)[0]


def spec_tokens(model: Any, spec: PromptSpec, *, chat: bool = False) -> tuple[list[int], str]:
    """THE prompt-form rule (record, sweep, diagnose, replay): token ids of one prompts-file prompt
    (:class:`traces.run.prompts.PromptSpec`) exactly as llama-server 0.3.36 tokenizes the same request, and the
    text they stand for (docs/RECORDING.md "Prompt forms").

    * ``tokens``: the ids as given (no BOS, no template; checked against the vocabulary); the text is their
      detokenization. The server's ``/completion`` with a list of ids.
    * ``text``: ``llama_tokenize(text, add_special=True, parse_special=True)``: BOS where the vocabulary adds
      it, special-token texts (``<|turn>``, ``<bos>``) read as those tokens. The server's ``/completion`` with
      a string (``tokenize_input_prompts(..., add_special=true, parse_special=true)``) and its ``/tokenize``
      with ``add_special: true``.
    * ``messages`` (or a text with ``chat``, as one user turn): rendered as the server's
      ``/v1/chat/completions`` renders it (:meth:`traces.run.llama.model.LlamaVocab.render_chat`: the
      GGUF's template, generation prompt, the server's ``enable_thinking`` default, a leading BOS text
      removed), then tokenized as a text above; the text is the rendered prompt for ``messages``, the
      prompt's own text with ``chat``.

    Args:
        model: a :class:`traces.run.llama.model.LlamaVocab` (or model) of the target: ``tokenize``,
            ``render_chat``, ``detokenize``, ``n_vocab``.

    Raises:
        MtpscopeError: a token id outside the vocabulary (names the file, line and ``tokens[i]``).
        TraceError: no chat template for ``messages`` / ``chat``, or the template refuses them.
    """
    if spec.tokens is not None:
        check_tokens(spec, model.n_vocab)
        return list(spec.tokens), model.detokenize(spec.tokens)
    if spec.messages is not None:
        text = model.render_chat(spec.messages)
        return model.tokenize(text, add_special=True, parse_special=True), text
    text = spec.text or ""
    rendered = model.render_chat([{"role": "user", "content": text}]) if chat else text
    return model.tokenize(rendered, add_special=True, parse_special=True), text


#: ``MtpRuntime.run``'s ``keep_draft``: a drafter row (a view llama.cpp overwrites at the next decode) ->
#: ``(its copy, its top ids or None)``
KeepDraft = Callable[[np.ndarray], tuple[np.ndarray, "np.ndarray | None"]]


@dataclass
class DraftStep:
    """One drafter step's raw data as the loop saw it (kept only when tracing).

    Attributes:
        token: the draft (argmax of the dense head).
        logits: ``float32[n_vocab]`` copy of the drafter's dense logits, or None.
        h: ``float32[n_embd_backbone]`` hidden row fed in, or None.
        h_next: ``float32[n_embd_backbone]`` the step's ``h_nextn`` output, or None.
        h_inner: ``float32[n_embd]`` the ``result_norm`` node (cb_eval capture), or None without capture.
        top_ids: the ids of the best logits, best first (:func:`traces.run.ranking.top_k_desc` of ``logits``,
            ``int64[n_top]``), when they were found while the logits were copied out (``MtpRuntime.run``'s
            ``keep_draft``), else None.
        summary: what the trace keeps of the logits (a :class:`traces.run.step_analysis.LogitSummary`) when they
            were summarized where the loop ran (:func:`traces.run.step_analysis.summarize_drafts`: the recording
            worker, which then sends neither ``logits`` nor ``top_ids``), else None.
        logit_rows: with ``summary``, the logits at :func:`traces.run.derived.logit_row_ids` (``float32``), which
            is all a derived ``h_inner`` reads of them; else None.
    """

    token: int
    logits: np.ndarray | None
    h: np.ndarray | None
    h_next: np.ndarray | None
    h_inner: np.ndarray | None
    top_ids: np.ndarray | None = None
    summary: Any = None
    logit_rows: np.ndarray | None = None


@dataclass(frozen=True)
class RoundResult:
    """One round as the loop ran it (before it is turned into trace records).

    Attributes:
        round: 0-based round within the prompt; pos: position of the pending token.
        pending_token: the token fed at ``pos`` (the previous round's last emitted token, or ``t0``).
        drafted: the K drafts; target: the target's token at each of the K + 1 verify rows (None after
            the row that ended the round, when sampling); n_accepted: drafts accepted, counted as llama.cpp
            counts them (``timings.draft_n_accepted``); emitted: accepted drafts plus the target's token (cut
            after an end-of-generation token).
        eog_confirmed: the draft after the accepted ones is an end-of-generation token the target chose too,
            which llama.cpp counts as the target's token, not as accepted (it is not the round's last draft).
        t_draft_ms / t_verify_ms: wall time of the K drafter decodes / of the verify decode,
            acceptance and KV roll-back, in milliseconds.
        steps: one :class:`DraftStep` per draft, only when tracing (else empty).
        target_p_drafted / target_entropy: per draft, the target's probability of it and its entropy
            (nats) at the verify row that judged it (:func:`traces.run.target_side.target_stats`), only when
            tracing (else empty); computed after the verify timing.
        h_target: per draft, the target's ``nextn`` row at that verify row (``float32[n_embd_backbone]``),
            only with ``hidden_target`` (else empty).
        target_logits: per draft, a copy of the target's logits at that verify row (``float32[n_vocab]``),
            only with ``defer_target``: ``target_p_drafted`` / ``target_entropy`` are then empty until
            :func:`finish_target_side` computes them (outside the loop, in the recording process).
    """

    round: int
    pos: int
    pending_token: int
    drafted: tuple[int, ...]
    target: tuple[int | None, ...]
    n_accepted: int
    emitted: tuple[int, ...]
    t_draft_ms: float
    t_verify_ms: float
    steps: tuple[DraftStep, ...] = field(repr=False, default=())
    target_p_drafted: tuple[float, ...] = ()
    target_entropy: tuple[float, ...] = ()
    h_target: tuple[np.ndarray, ...] = field(repr=False, default=())
    target_logits: tuple[np.ndarray, ...] = field(repr=False, default=())
    eog_confirmed: bool = False


@dataclass(frozen=True)
class Calibration:
    """The steps of :meth:`MtpRuntime.calibrate` (the worker sends them to the recorder like a round).

    Attributes:
        steps: drafter steps with logits, ``h``, ``h_next`` and the in-graph ``h_inner``.
    """

    steps: tuple[DraftStep, ...] = field(repr=False, default=())


def accepts_draft(drafted: Sequence[int], i: int, target: int | None, is_eog: Callable[[int], bool]) -> bool:
    """Whether verify row ``i``'s token ``target`` accepts draft ``i`` of ``drafted`` (the round's drafts, in
    order), given that drafts ``0 .. i-1`` were accepted: llama.cpp's rule (``common/sampling.cpp``,
    ``common_sampler_sample_and_accept_n``, as its MTP loop applies it): the tokens are equal, except that an
    end-of-generation draft that is not the round's last one is never accepted -- it ends the round as the
    target's own token (``RoundResult.eog_confirmed``)."""
    d = drafted[i]
    return d == target and not (i + 1 < len(drafted) and is_eog(d))


def accepted_prefix(drafted: Sequence[int], target: Sequence[int | None], is_eog: Callable[[int], bool]) -> int:
    """How many of ``drafted`` the verify rows' tokens ``target`` (row ``i`` judges draft ``i``; at least
    ``len(drafted)`` of them) accept: the longest prefix :func:`accepts_draft` accepts draft by draft."""
    n = 0
    while n < len(drafted) and accepts_draft(drafted, n, target[n], is_eog):
        n += 1
    return n


def finish_target_side(res: RoundResult) -> RoundResult:
    """``res`` with ``target_p_drafted`` / ``target_entropy`` computed from its ``target_logits``
    (:func:`traces.run.target_side.target_stats`) and those logits dropped; ``res`` itself when it carries
    none. ``MtpRuntime.run(defer_target=True)`` leaves this to the process that analyses the round.

    Raises:
        TraceError: as :func:`traces.run.target_side.target_stats` (a draft id outside the vocabulary).
    """
    if not res.target_logits:
        return res
    pa_, ha_ = target_stats(res.target_logits, res.drafted[:len(res.target_logits)])
    return replace(res, target_p_drafted=tuple(pa_.tolist()), target_entropy=tuple(ha_.tolist()), target_logits=())


class Sampler:
    """The target's token choice, as llama-server 0.3.36 makes it for a request: greedy argmax (``temp <= 0``;
    the vocabulary's suppress tokens never chosen) or the server's seeded sampler chain
    (:class:`traces.run.llama.model.SamplerChain`: ``top_k -> top_p -> min_p -> temp -> dist(seed)``), called
    row by row in the order the server samples, so one request consumes the same random draws.

    Args:
        temp / seed / top_k / top_p / min_p: as :class:`traces.run.record_config.RecordConfig`.
        suppress: the target vocabulary's suppress tokens (``LlamaVocab.suppress_tokens``); n_vocab its size.
    """

    def __init__(self, *, temp: float = 0.0, seed: int = 0, top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, suppress: Sequence[int] = (), n_vocab: int = 0) -> None:
        self.temp, self.seed, self.top_k, self.top_p = float(temp), int(seed), int(top_k), float(top_p)
        self.min_p = float(min_p)
        self.greedy = self.temp <= 0.0
        self._suppress = np.asarray(sorted({int(t) for t in suppress}), dtype=np.int64)
        self._chain: SamplerChain | None = None
        if not self.greedy:
            self._chain = SamplerChain(temp=self.temp, seed=self.seed, top_k=self.top_k, top_p=self.top_p,
                                       min_p=self.min_p, suppress=self._suppress.tolist(), n_vocab=n_vocab)

    def sample(self, ctx: LlamaContext, i: int) -> int:
        """The target's token at batch row ``i`` of the last decode of ``ctx``."""
        if self.greedy:
            lg = ctx.logits(i)
            if self._suppress.size:
                lg = lg.copy()
                lg[self._suppress] = -np.inf
            return int(np.argmax(lg))
        if self._chain is None:     # (not greedy: made in __init__; None only once closed)
            raise TraceError("the sampler was closed", key="sampler")
        return self._chain.sample(ctx, i)

    def close(self) -> None:
        if self._chain is not None:
            self._chain.close()
            self._chain = None


class MtpRuntime:
    """A target and its drafter loaded in llama.cpp, with their contexts; reusable across prompts
    and :func:`traces.run.recorder.record` calls (tests and benchmarks load once).

    Args:
        target / assistant: GGUF paths (run :func:`traces.run.preflight.preflight` first; this class does not).
        n_gpu_layers: layers to offload (-1 all, 0 CPU only), for both models.
        n_ctx: initial context size in tokens; :meth:`run` and :meth:`generate_plain` grow it (new
            contexts, same models) when prompt + max_tokens + n_draft + 1 does not fit.
        n_batch: largest decode batch (prompts are prefilled in chunks of this size).
        capture: install the ``cb_eval`` capture of ``result_norm`` on the drafter (needed for h_inner
            and the centroid head; in C where it builds, :func:`traces.run.llama.capture.node_capture`); False
            runs the drafter without any callback.
        flash_attn: flash attention (off by default: batch-size dependent numerics can flip near-tie
            argmaxes, and the greedy-equivalence invariant is checked with it off).
        n_threads: CPU threads (:func:`traces.run.record_config.check_n_threads`; None: llama-server's default,
            :func:`traces.run.record_config.server_threads`).
        native_capture: False keeps the Python ``cb_eval`` callback even where the C one builds (it can
            cut a decode short on Ctrl-C; the C one lets the decode finish first).
        repack: llama.cpp's extra CPU weight buffers (:class:`traces.run.llama.model.LlamaModel`), both models.

    Raises:
        TraceError: llama.cpp cannot load a model or create a context; ``n_threads`` out of range.
        RuntimeUnavailableError: llama-cpp-python missing.
    """

    #: the target's and the drafter's contexts (:meth:`_make_contexts`, called by ``__init__``)
    tctx: LlamaContext
    dctx: LlamaContext

    def __init__(self, target: str | os.PathLike[str], assistant: str | os.PathLike[str], *,
                 n_gpu_layers: int = 0, n_ctx: int = 1024, n_batch: int = 256, capture: bool = True,
                 flash_attn: bool | None = False, n_threads: int | None = None,
                 native_capture: bool = True, repack: bool = True) -> None:
        self.target_path, self.assistant_path = Path(target), Path(assistant)
        self.n_gpu_layers = int(n_gpu_layers)
        self.flash_attn = flash_attn
        #: the threads both contexts run with (llama-server's default when not given)
        check_n_threads(n_threads)
        self.n_threads = server_threads() if n_threads is None else int(n_threads)
        self._closed = False
        self.tctx = self.dctx = None  # type: ignore[assignment]  # None only until _make_contexts makes them (close() and _make_contexts skip None)
        self.tmodel = LlamaModel(target, n_gpu_layers=n_gpu_layers, repack=repack)
        try:
            self.dmodel = LlamaModel(assistant, n_gpu_layers=n_gpu_layers, repack=repack)
        except BaseException:
            self.tmodel.close()
            raise
        self.n_vocab = self.tmodel.n_vocab
        self.n_embd_backbone = self.tmodel.n_embd_out
        self.n_embd = self.dmodel.n_embd
        self.n_batch = max(int(n_batch), 16)
        self.capture = node_capture(H_INNER_NODE, native=native_capture) if capture else None
        self.tbatch = TokenBatch(self.n_batch)
        self.dbatch = DraftBatch(self.dmodel.n_embd_inp)
        self.n_ctx = 0
        try:
            self._make_contexts(n_ctx)
        except BaseException:
            self.close()
            raise
        #: the token the prefill of the last :meth:`run` produced (``t0``), also when no round followed
        self.first_token: int | None = None

    def _make_contexts(self, n_ctx: int) -> None:
        """(Re)create the target and drafter contexts with room for ``n_ctx`` tokens (at least n_batch)."""
        n_ctx = max(int(n_ctx), self.n_batch)
        if self.dctx is not None:
            self.dctx.close()
        if self.tctx is not None:
            self.tctx.close()
        self.tctx = LlamaContext(self.tmodel, n_ctx=n_ctx, n_batch=self.n_batch, flash_attn=self.flash_attn,
                                 n_threads=self.n_threads, nextn=True, masked=False)
        self.dctx = LlamaContext(self.dmodel, n_ctx=n_ctx, n_batch=self.n_batch, mtp_of=self.tctx,
                                 capture=self.capture, flash_attn=self.flash_attn, n_threads=self.n_threads,
                                 nextn=True, masked=True)
        self.n_ctx = self.tctx.n_ctx

    def ensure_context(self, n_tokens: int) -> None:
        """Grow the contexts (to a multiple of 256) when fewer than ``n_tokens`` positions fit."""
        if n_tokens > self.n_ctx:
            self._make_contexts(-(-int(n_tokens) // 256) * 256)

    # -- prompts
    def prompt_tokens(self, text: str, *, chat: bool = False) -> list[int]:
        """Token ids of a text prompt as llama-server reads it (:func:`prompt_tokens`)."""
        return prompt_tokens(self.tmodel, text, chat=chat)

    # -- the loop
    def _prefill(self, tokens: Sequence[int]) -> None:
        if not tokens:
            raise TraceError("empty prompt (no tokens)", key="prompt")
        self.tctx.clear()
        step = min(self.n_batch, self.tctx.n_batch)
        for i in range(0, len(tokens), step):
            chunk = tokens[i:i + step]
            self.tbatch.set(chunk, i, logits="last")
            self.tctx.decode(self.tbatch)

    def generate_plain(self, tokens: Sequence[int], *, max_tokens: int, sampler: Sampler | None = None,
                       timing: dict[str, float] | None = None) -> list[int]:
        """Plain decoding of the target alone, one token per decode (the reference for the
        speculative loop). Same stopping rule as :meth:`run`. Returns the generated ids.

        ``timing``: a dict filled with ``prefill_ms`` (prompt decode and the first token's choice),
        ``decode_ms`` (every later one-token decode with its token choice) and ``n_decodes``.
        """
        sampler = sampler or Sampler()
        self._check_fits(len(tokens), max_tokens, 0)
        perf = time.perf_counter
        t0 = perf()
        self._prefill(tokens)
        out: list[int] = []
        pos = len(tokens)
        tok = sampler.sample(self.tctx, self.tbatch.batch.n_tokens - 1)
        t1 = perf()
        while True:
            out.append(tok)
            if len(out) >= max_tokens or self.tmodel.is_eog(tok):
                if timing is not None:
                    timing.update(prefill_ms=(t1 - t0) * 1e3, decode_ms=(perf() - t1) * 1e3,
                                  n_decodes=len(out) - 1)
                return out
            self.tbatch.set([tok], pos, logits="last")
            self.tctx.decode(self.tbatch)
            pos += 1
            tok = sampler.sample(self.tctx, 0)

    def _check_fits(self, n_prompt: int, max_tokens: int, n_draft: int) -> None:
        self.ensure_context(n_prompt + max_tokens + n_draft + 1)

    def run(self, tokens: Sequence[int], config: RecordConfig, *, trace: bool = True,
            keep: Callable[[np.ndarray], np.ndarray] | None = None,
            defer_target: bool = False, fence: Callable[[], None] | None = None,
            keep_draft: KeepDraft | None = None) -> Generator[RoundResult, None, None]:
        """Run the MTP loop on one prompt, yielding each round as it finishes.

        Args:
            tokens: prompt token ids.
            config: the run (:class:`traces.run.record_config.RecordConfig`, already valid): ``n_draft``
                drafts per round, ``max_tokens`` generated at most (the prefill's token included), the
                target's token choice (a fresh :class:`Sampler` of ``temp`` / ``seed`` / ``top_k`` /
                ``top_p`` per call; greedy at ``temp`` 0) and ``hidden_target``: also copy the target's
                ``nextn`` row of every verify row that judged a draft (``RoundResult.h_target``; with
                ``trace``). Its other fields (storage) are the recorder's.
            trace: keep per-step raw data (drafter logits, h, h_next, h_inner) and the target's side
                (p of each draft, entropy) in the results.
            keep: how a step's logits (a view llama.cpp overwrites at the next decode) are copied out
                (default ``np.copy``; the recording worker copies them straight into its transport ring).
            defer_target: with ``trace``, keep copies of the verify rows' logits (``RoundResult.
                target_logits``, copied by ``keep``) instead of computing the target's side in the loop
                (two passes over n_vocab per draft); :func:`finish_target_side` computes it later.
            fence: with ``defer_target``, hand out the verify rows' logits as live views instead of copies
                (valid until the target's next decode) and call ``fence()`` before every target decode:
                it must return only once whoever holds the views has copied them (the recording
                worker's sender thread copies them while the drafter runs).
            keep_draft: how a drafter step's logits are copied out, with their top ids found in the same read
                (``(copy, top_ids or None)``: ``DraftStep.top_ids``); default ``keep``.

        Raises:
            TraceError: ``n_draft + 1`` does not fit this runtime's verify batch (``n_batch``); an empty prompt.
        """
        n_draft, max_tokens, hidden_target = config.n_draft, config.max_tokens, config.hidden_target
        if n_draft + 1 > self.n_batch:
            raise TraceError("n_draft + 1 must fit one verify batch", key="n_draft",
                             expected=f"<= {self.n_batch - 1}", actual=n_draft)
        sampler = _sampler(config, self.tmodel)
        try:
            yield from self._rounds(tokens, n_draft, max_tokens, sampler, trace, hidden_target, keep,
                                    defer_target, fence, keep_draft)
        finally:
            sampler.close()

    def _draft_step(self, tok: int, pos: int, h_in: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
        """One drafter step at ``pos`` fed ``tok`` and hidden row ``h_in``: ``(draft, logits view, h_next copy)``
        (the capture, when installed, reset first)."""
        if self.capture is not None:
            self.capture.reset()
        self.dbatch.set(tok, pos, h_in)
        self.dctx.decode(self.dbatch)
        lg = self.dctx.logits(0)
        return int(np.argmax(lg)), lg, self.dctx.nextn(0).copy()

    def _rounds(self, tokens: Sequence[int], n_draft: int, max_tokens: int, sampler: Sampler, trace: bool,
                hidden_target: bool, keep: Callable[[np.ndarray], np.ndarray] | None, defer_target: bool,
                fence: Callable[[], None] | None, keep_draft: KeepDraft | None = None
                ) -> Generator[RoundResult, None, None]:
        """The loop of :meth:`run` (its arguments checked and its sampler made)."""
        live = fence is not None and defer_target and trace
        if live and fence is not None:    # (live implies a fence)
            fence()     # the last prompt's views are about to be overwritten (or freed, if the contexts grow)
        self._check_fits(len(tokens), max_tokens, n_draft)
        self._prefill(tokens)
        tctx, cap, tb = self.tctx, self.capture, self.tbatch
        pos = len(tokens)
        pending = sampler.sample(tctx, tb.batch.n_tokens - 1)
        self.first_token = pending
        h = tctx.nextn(tb.batch.n_tokens - 1).copy()
        n_out = 1
        rnd = 0
        eog = self.tmodel.is_eog
        if eog(pending) or n_out >= max_tokens:
            return
        perf = time.perf_counter
        while True:
            k_max = min(n_draft, max_tokens - n_out - 1)
            drafted: list[int] = []
            steps: list[DraftStep] = []
            t0 = perf()
            tok, h_in = pending, h
            for _ in range(k_max):
                d, lg, h_next = self._draft_step(tok, pos, h_in)
                if trace:
                    hi = cap.get(H_INNER_NODE) if cap is not None else None
                    top = None
                    if keep_draft is not None:
                        lg, top = keep_draft(lg)
                    else:
                        lg = lg.copy() if keep is None else keep(lg)
                    steps.append(DraftStep(d, lg, h_in, h_next, None if hi is None else hi.reshape(-1), top))
                drafted.append(d)
                tok, h_in = d, h_next
            t1 = perf()
            if live and fence is not None:
                fence()                 # the previous round's verify rows have been copied out
            tb.set([pending, *drafted], pos, logits="all")
            tctx.decode(tb)
            target: list[int | None] = []
            n_acc = 0
            # row i judges draft i (accepts_draft: llama.cpp's rule, the end-of-generation exception included)
            if sampler.greedy:
                for i in range(k_max + 1):
                    target.append(sampler.sample(tctx, i))
                n_acc = accepted_prefix(drafted, target, eog)
            else:
                for i in range(k_max + 1):
                    s = sampler.sample(tctx, i)
                    target.append(s)
                    if i < k_max and accepts_draft(drafted, i, s, eog):
                        n_acc += 1
                        continue
                    break
                target += [None] * (k_max + 1 - len(target))
            eog_confirmed = n_acc < k_max and drafted[n_acc] == target[n_acc]
            emitted = drafted[:n_acc] + [int(target[n_acc])]  # type: ignore[arg-type]  # target[n_acc] was sampled: the None padding comes after it
            for j, e in enumerate(emitted):  # stop at an end-of-generation token
                if eog(e):
                    emitted = emitted[:j + 1]
                    break
            h = tctx.nextn(n_acc).copy()
            tctx.seq_rm(pos + n_acc + 1, -1)
            t2 = perf()
            h_t: tuple[np.ndarray, ...] = ()
            t_lg: tuple[np.ndarray, ...] = ()
            if trace and k_max:  # the target's side, from the verify rows still in tctx (outside the timing)
                # deferred: copies for the recorder; else the live views, used by finish_target_side below
                cp = (np.copy if keep is None else keep) if defer_target and not live else (lambda a: a)
                t_lg = tuple(cp(tctx.logits(i)) for i in range(k_max))
                if hidden_target:
                    h_t = tuple(tctx.nextn(i).copy() for i in range(k_max))
            res = RoundResult(round=rnd, pos=pos, pending_token=pending, drafted=tuple(drafted),
                              target=tuple(target), n_accepted=n_acc, emitted=tuple(emitted),
                              t_draft_ms=(t1 - t0) * 1e3, t_verify_ms=(t2 - t1) * 1e3, steps=tuple(steps),
                              h_target=h_t, target_logits=t_lg, eog_confirmed=eog_confirmed)
            yield res if defer_target else finish_target_side(res)
            n_out += len(emitted)
            pos += n_acc + 1
            pending = emitted[-1]
            rnd += 1
            if eog(pending) or n_out >= max_tokens:
                return

    def probe_costs(self, tokens: Sequence[int], *, n_max: int = PROBE_N_MAX, reps: int = PROBE_REPS,
                    budget_s: float = PROBE_BUDGET_S) -> dict[str, Any]:
        """Time a round of every size on this machine, as :meth:`run` times one: for ``k = 0..n_max`` the
        drafter's ``k`` chained steps (``t_draft``) and the target's verify of ``k + 1`` tokens with its
        token choice, ``h`` copy and KV removal (``t_verify``), at the position after ``tokens`` (the
        first prompt, cut to fit the context). Sizes are interleaved within each repetition (a drift of the
        machine's speed hits them alike); up to ``reps`` repetitions, at least one, more only while the
        probe has run under ``budget_s`` seconds; where a size's repetitions differ by more than
        ``PROBE_SPREAD`` (a load spike), more, up to ``PROBE_MAX_REPS``, within ``PROBE_EXTRA_BUDGET_S`` more
        seconds. The target's memory is cleared afterwards.

        What it is for: the what-if (:mod:`traces.analysis.costs`) prices the round sizes a recording did
        not run with this curve's shape, scaled to the recording's own costs (llama.cpp's verify time is
        not a line in the batch size: kernels change with it).

        Returns:
            The manifest's ``cost_probe`` entry: ``verify_ms`` ``{"n": median ms}`` for ``n = 1..n_max + 1``,
            ``draft_ms`` ``{"k": median ms}`` for ``k = 1..n_max`` (a round's ``k`` drafter steps),
            ``verify_reps_ms`` / ``draft_reps_ms`` every repetition's ms (the probe's spread), ``reps``,
            ``pos`` (the position probed), ``seconds`` (the probe's wall time).

        Raises:
            TraceError: an empty prompt; llama.cpp could not decode.
        """
        perf = time.perf_counter
        t_start = perf()
        n_max = max(int(n_max), 1)
        self.ensure_context(min(len(tokens), 64) + n_max + 2)
        prefix = list(tokens[:max(1, min(len(tokens), self.n_ctx - n_max - 2))])
        tctx, tb = self.tctx, self.tbatch
        td: dict[int, list[float]] = {k: [] for k in range(1, n_max + 1)}
        tv: dict[int, list[float]] = {k + 1: [] for k in range(n_max + 1)}
        try:
            self._prefill(prefix)
            pos = len(prefix)
            last = tb.batch.n_tokens - 1
            pending = int(np.argmax(tctx.logits(last)))
            h0 = tctx.nextn(last).copy()
            rep = 0
            def disagree() -> bool:
                return any(len(v) >= 2 and min(v) > 0 and max(v) / min(v) > PROBE_SPREAD
                           for v in (*td.values(), *tv.values()))

            while rep == 0 or (rep < max(int(reps), 1) and perf() - t_start < budget_s) or (
                    rep < PROBE_MAX_REPS and perf() - t_start < budget_s + PROBE_EXTRA_BUDGET_S and disagree()):
                for k in range(n_max + 1):
                    t0 = perf()
                    drafted: list[int] = []
                    tok, h_in = pending, h0
                    for _ in range(k):
                        d, lg, h_in = self._draft_step(tok, pos, h_in)
                        lg.copy()                       # the loop copies each step's logits out
                        drafted.append(d)
                        tok = d
                    t1 = perf()
                    tb.set([pending, *drafted], pos, logits="all")
                    tctx.decode(tb)
                    for i in range(k + 1):
                        int(np.argmax(tctx.logits(i)))
                    tctx.nextn(0).copy()
                    tctx.seq_rm(pos, -1)
                    t2 = perf()
                    if k:
                        td[k].append((t1 - t0) * 1e3)
                    tv[k + 1].append((t2 - t1) * 1e3)
                rep += 1
        finally:
            self.tctx.clear()
        return {"verify_ms": {str(n): float(np.median(v)) for n, v in tv.items()},
                "draft_ms": {str(k): float(np.median(v)) for k, v in td.items()},
                "verify_reps_ms": {str(n): [float(x) for x in v] for n, v in tv.items()},
                "draft_reps_ms": {str(k): [float(x) for x in v] for k, v in td.items()},
                "reps": rep, "pos": pos, "seconds": perf() - t_start}

    def calibrate(self, tokens: Sequence[int], n_steps: int = CALIBRATION_STEPS) -> list[DraftStep]:
        """Drafter steps with the in-graph ``h_inner`` beside what llama.cpp returns, for measuring how well
        a derived ``h_inner`` (:mod:`traces.run.derived`) agrees with the graph.

        Prefills the first :data:`CALIBRATION_TOKENS` of ``tokens`` in the target, then runs ``n_steps``
        greedy drafter steps (as :meth:`run` does: the same position, each step fed the previous draft and
        ``h_next``) in a temporary drafter context that carries the ``cb_eval`` capture of
        ``result_norm``; the loop's own drafter context is not touched (it may have no callback at all).
        The target's memory is cleared afterwards.

        Returns:
            ``n_steps`` :class:`DraftStep` s with copies of the logits, ``h``, ``h_next`` and ``h_inner``.

        Raises:
            TraceError: llama.cpp could not create the context or decode; an empty prompt.
        """
        cap = self.capture or node_capture(H_INNER_NODE)
        own = self.capture is None
        ctx = None
        tok_s = list(tokens[:CALIBRATION_TOKENS])
        try:
            ctx = LlamaContext(self.dmodel, n_ctx=self.n_ctx, n_batch=self.n_batch, mtp_of=self.tctx, capture=cap,
                               flash_attn=self.flash_attn, n_threads=self.n_threads, nextn=True, masked=True)
            self._prefill(tok_s)
            last = self.tbatch.batch.n_tokens - 1
            tok, h = int(np.argmax(self.tctx.logits(last))), self.tctx.nextn(last).copy()
            pos = len(tok_s)
            steps: list[DraftStep] = []
            for _ in range(int(n_steps)):
                cap.reset()
                self.dbatch.set(tok, pos, h)
                ctx.decode(self.dbatch)
                lg = ctx.logits(0).copy()
                hn = ctx.nextn(0).copy()
                hi = cap.get(H_INNER_NODE)
                d = int(np.argmax(lg))
                steps.append(DraftStep(d, lg, h, hn, None if hi is None else hi.reshape(-1).copy()))
                tok, h = d, hn
            return steps
        finally:
            if ctx is not None:
                ctx.close()
            if own and hasattr(cap, "close"):
                cap.close()
            self.tctx.clear()

    def close(self) -> None:
        """Free batches, contexts (drafter first) and models. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for obj in (self.dbatch, self.tbatch, self.dctx, self.tctx, self.dmodel, self.tmodel):
            if obj is not None:
                obj.close()
        if self.capture is not None and hasattr(self.capture, "close"):
            self.capture.close()     # the native capture's copy buffer, after the context that wrote it

    def __enter__(self) -> MtpRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()




def _sampler(config: RecordConfig, model: LlamaModel) -> Sampler:
    """A fresh :class:`Sampler` for the target's token choice of ``config`` with the target ``model``."""
    return Sampler(temp=config.temp, seed=config.seed, top_k=config.top_k, top_p=config.top_p, min_p=config.min_p,
                   suppress=model.suppress_tokens(), n_vocab=model.n_vocab)


def time_plain(rtm: MtpRuntime, toks: Sequence[Sequence[int]],
               config: RecordConfig) -> tuple[list[list[int]], dict[str, Any]]:
    """Plain decoding of every prompt, timed (``record(baseline=True)``): ``(outputs, manifest entry)``.

    Each prompt is decoded by :meth:`MtpRuntime.generate_plain` (the target alone, one token per decode;
    ``config.max_tokens`` at most, the target's token choice of ``config``'s sampling, fresh per prompt);
    the entry holds ``t_per_token_ms`` (decode time per generated token after the first), ``n_tokens``,
    ``n_decodes``, ``decode_ms``, ``prefill_ms`` (milliseconds), ``per_prompt`` and ``outputs_equal`` (None;
    the recorder fills it at the end, greedy only)."""
    outs: list[list[int]] = []
    per = []
    for tk in toks:
        timing: dict[str, float] = {}
        sampler = _sampler(config, rtm.tmodel)
        try:
            outs.append(rtm.generate_plain(tk, max_tokens=config.max_tokens, sampler=sampler, timing=timing))
        finally:
            sampler.close()
        per.append({"n_tokens": len(outs[-1]), "prefill_ms": timing["prefill_ms"], "decode_ms": timing["decode_ms"],
                    "n_decodes": int(timing["n_decodes"])})
    n_dec = sum(p["n_decodes"] for p in per)
    dec = sum(p["decode_ms"] for p in per)
    return outs, {"t_per_token_ms": dec / n_dec if n_dec else None, "n_tokens": sum(p["n_tokens"] for p in per),
                  "n_decodes": n_dec, "decode_ms": dec, "prefill_ms": sum(p["prefill_ms"] for p in per),
                  "per_prompt": per, "outputs_equal": None}


__all__ = ["CALIBRATION_STEPS", "CALIBRATION_TOKENS", "H_INNER_NODE", "PROBE_BUDGET_S", "PROBE_N_MAX", "PROBE_REPS", "Calibration", "DraftStep", "KeepDraft", "MtpRuntime", "RoundResult", "Sampler", "accepted_prefix", "accepts_draft", "finish_target_side",
           "prompt_tokens", "spec_tokens", "time_plain"]
