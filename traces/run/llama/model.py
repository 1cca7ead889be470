"""llama.cpp's objects, wrapped: a GGUF's vocabulary alone (:class:`LlamaVocab`, a ``vocab_only`` load: all
tokenization needs), a loaded model (:class:`LlamaModel`), a context on it (:class:`LlamaContext`: target
or MTP drafter; decode, logits and the "nextn" hidden rows as numpy views, KV clean-up), the batches
(:class:`TokenBatch`: tokens only; :class:`DraftBatch`: token + one hidden row, the input of a
``gemma4-assistant`` drafter step), the seeded sampler chain (:class:`SamplerChain`) and llama.cpp's own
quantizer (:func:`quantize`, ``llama_model_quantize``; its file types by name: :func:`ftype_ids`).

Each holds a C pointer: call ``close()`` when done (also on garbage collection, best effort).

Shapes: arrays returned here are in numpy ``shape`` order (outermost first).

Imports: ctypes, numpy, mtpscope.errors, :mod:`.binding`, :mod:`.logs` (llama.cpp's words in errors),
:mod:`.process` (a Ctrl-C during a decode), :mod:`.capture` / :mod:`.native_capture` (types only).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.errors import TraceError
from mtpscope.traces.run.llama import binding, logs
from mtpscope.traces.run.llama.capture import NodeCapture
from mtpscope.traces.run.llama.native_capture import NativeCapture
from mtpscope.traces.run.llama.process import sigint_state

#: how llama.cpp 0.3.36 recognises a Gemma 4 chat template (``common/chat.cpp``: its source contains this text);
#: the server then renders it with thinking on by default and appends ``<|turn>model\n`` after a closed turn
GEMMA4_TEMPLATE_MARK = "'<|tool_call>call:'"


def _created(ptr: Any, free: Any, what: str, path: Any) -> Any:
    """``ptr`` as a llama.cpp create call (a model load, a context) returned it, checked: a Ctrl-C caught in
    the log callback during the call is raised (``ptr`` freed with ``free`` first); a null ``ptr`` raises.

    Raises:
        KeyboardInterrupt: the pending Ctrl-C. TraceError: llama.cpp could not ``what`` (its last log lines).
    """
    pending = logs.take_pending()
    if pending is not None:
        if ptr:
            free(ptr)
        raise pending
    if not ptr:
        raise TraceError(f"llama.cpp could not {what}: {logs.recent_log(4) or 'no log'}", path=path)
    return ptr


class _ClosedOnDelete:
    """Calls ``close()`` when garbage-collected (best effort: errors at interpreter exit are ignored);
    a context manager that closes on exit."""

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:  # noqa: BLE001 - best effort at collection: __del__ never raises
            pass


class LlamaVocab(_ClosedOnDelete):
    """A GGUF's tokenizer as llama.cpp loads it without the weights (``llama_model_load_from_file`` with
    ``vocab_only``): tokenize, token pieces, end-of-generation ids, metadata, chat templates. A GGUF that
    carries only ``tokenizer.*`` keys (``ggml-vocab-gemma-4.gguf``) loads too. Call :meth:`close` when done.

    Args:
        path: the GGUF file.

    Raises:
        TraceError: llama.cpp could not load the file (the message carries llama.cpp's last log lines).
        RuntimeUnavailableError: llama-cpp-python missing.
    """

    _what = "vocabulary"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._load(path, vocab_only=True, n_gpu_layers=0)

    def _load(self, path: str | os.PathLike[str], *, vocab_only: bool, n_gpu_layers: int, repack: bool = True) -> None:
        lc = binding.llama()
        self.path = Path(path)
        params = lc.llama_model_default_params()
        params.n_gpu_layers = int(n_gpu_layers)
        params.use_mmap = True
        params.vocab_only = bool(vocab_only)
        params.use_extra_bufts = bool(repack)
        logs.clear_recent()
        self.ptr = ptr = _created(lc.llama_model_load_from_file(os.fspath(self.path).encode(), params),
                                  lc.llama_model_free, f"load the {self._what}", self.path)
        self.vocab = lc.llama_model_get_vocab(ptr)
        self.n_vocab = int(lc.llama_vocab_n_tokens(self.vocab))

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as llama.cpp renders it to a string, or None when absent."""
        lc = binding.llama()
        buf = ctypes.create_string_buffer(1 << 16)
        n = lc.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            lc.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, end of turn, ...), as llama.cpp decides."""
        return bool(binding.llama().llama_vocab_is_eog(self.vocab, int(token)))

    def eog_ids(self) -> list[int]:
        """Every end-of-generation id of the vocabulary (:meth:`is_eog` over ids 0 .. n_vocab - 1)."""
        return [i for i in range(self.n_vocab) if self.is_eog(i)]

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text`` (llama_tokenize; ``add_special`` adds BOS where the vocab wants it,
        ``parse_special`` reads ``<|turn>`` & co. in the text as special tokens)."""
        lc = binding.llama()
        data = text.encode("utf-8")
        cap = len(data) + 16
        while True:
            arr = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self.vocab, data, len(data), arr, cap, add_special, parse_special)
            if n >= 0:
                return list(arr[:n])
            cap = -n

    def token_to_piece(self, token: int) -> bytes:
        """The bytes of one token (special tokens rendered)."""
        lc = binding.llama()
        buf = ctypes.create_string_buffer(64)
        n = lc.llama_token_to_piece(self.vocab, int(token), buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lc.llama_token_to_piece(self.vocab, int(token), buf, len(buf), 0, True)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int]) -> str:
        """Text of ``tokens`` (pieces joined, decoded as UTF-8 with replacement)."""
        return b"".join(self.token_to_piece(t) for t in tokens).decode("utf-8", "replace")

    @property
    def add_bos(self) -> bool:
        """Whether the vocabulary wants BOS in front of a tokenized text (``tokenizer.ggml.add_bos_token``, as
        llama.cpp reads it: ``llama_vocab_get_add_bos``)."""
        return bool(binding.llama().llama_vocab_get_add_bos(self.vocab))

    def suppress_tokens(self) -> list[int]:
        """The ids llama.cpp's samplers never pick (``tokenizer.ggml.suppress_tokens``; empty without the key):
        llama-server's sampler chain starts with a ``-inf`` logit bias on them."""
        lc = binding.llama()
        n = ctypes.c_int32(0)
        ptr = lc.llama_vocab_get_suppress_tokens(self.vocab, ctypes.byref(n))
        return [int(ptr[i]) for i in range(int(n.value))] if ptr and n.value > 0 else []

    def apply_chat_template(self, user_text: str) -> str:
        """:meth:`render_chat` of ``user_text`` as one user turn (raises as it does)."""
        return self.render_chat([{"role": "user", "content": user_text}])

    def render_chat(self, messages: Sequence[dict[str, str]], *, enable_thinking: bool | None = None) -> str:
        """A chat (``[{"role", "content"}, ...]``) as llama-server 0.3.36 renders it for
        ``/v1/chat/completions`` and ``/apply-template`` (``common_chat_templates_apply``; docs/RECORDING.md
        "Prompt forms"): the GGUF's own ``tokenizer.chat_template`` (Jinja, through llama-cpp-python's
        Jinja2 formatter) with ``bos_token`` / ``eos_token`` set, the generation prompt added and
        ``enable_thinking``; then a leading BOS text removed when the vocabulary adds BOS itself
        (:attr:`add_bos`: the tokenizer puts it back), and for a Gemma 4 template (its source has
        ``'<|tool_call>call:'``) ``<|turn>model\n`` appended when the text ends with ``<turn|>\n``.

        ``enable_thinking`` None is the server's default (``--reasoning auto``): True where the template
        supports thinking (a Gemma 4 template, or one whose rendering changes with it). Tokenize the text
        returned with ``add_special=True, parse_special=True`` (the server's rule).

        Raises:
            TraceError: the GGUF has no chat template, or the template refuses the messages (its error
                message is kept).
        """
        tmpl = self.meta("tokenizer.chat_template")
        if not tmpl:
            raise TraceError("the model has no chat template (--chat and chat prompts need one)", path=self.path,
                             key="tokenizer.chat_template")
        formatter = binding.jinja2_chat_formatter()
        lc = binding.llama()
        bos = lc.llama_vocab_bos(self.vocab)
        eos = lc.llama_vocab_eos(self.vocab)
        bos_s = self.token_to_piece(bos).decode("utf-8", "replace") if bos >= 0 else ""
        eos_s = self.token_to_piece(eos).decode("utf-8", "replace") if eos >= 0 else ""
        fmt = formatter(template=tmpl, eos_token=eos_s, bos_token=bos_s, add_generation_prompt=True)
        gemma4 = GEMMA4_TEMPLATE_MARK in tmpl

        def render(msgs: Sequence[dict[str, str]], thinking: bool) -> str:
            try:
                out: str = fmt(messages=[dict(m) for m in msgs], enable_thinking=thinking).prompt
            except Exception as e:  # noqa: BLE001 - jinja2's errors (TemplateError, TypeError) -> one line
                raise TraceError(f"the chat template refused the messages: {type(e).__name__}: {e}", path=self.path,
                                 key="tokenizer.chat_template") from None
            return out

        if enable_thinking is None:
            probe = [{"role": "user", "content": "test"}]
            enable_thinking = gemma4 or render(probe, True) != render(probe, False)
        prompt = render(messages, enable_thinking)
        if bos_s and self.add_bos and prompt.startswith(bos_s):
            prompt = prompt[len(bos_s):]
        if gemma4 and prompt.endswith("<turn|>\n"):
            prompt += "<|turn>model\n"
        return prompt

    def close(self) -> None:
        """Free the model (idempotent)."""
        if getattr(self, "ptr", None):
            binding.llama().llama_model_free(self.ptr)
            self.ptr = None


class LlamaModel(LlamaVocab):
    """A GGUF loaded by llama.cpp with its weights (``llama_model_load_from_file``): its vocabulary
    (:class:`LlamaVocab`'s methods) and hyperparameters. Call :meth:`close` when done.

    Args:
        path: the GGUF file.
        n_gpu_layers: layers to offload (-1 = all, 0 = CPU only).
        repack: let llama.cpp put CPU weights in its extra buffer types (AMX, repacked layouts:
            ``llama_model_params.use_extra_bufts``, llama.cpp's default; ``--no-repack`` in its own tools). False
            works around llama.cpp 0.3.36 crashing (SIGSEGV in the first decode) on a Gemma 4 MoE target on an
            AVX-512 / AMX CPU with them (measured with benchmarks/real_pair.py's 26B-A4B-shaped target).

    Raises:
        TraceError: llama.cpp could not load the file (the message carries llama.cpp's last log lines).
        RuntimeUnavailableError: llama-cpp-python missing.
    """

    _what = "model"

    def __init__(self, path: str | os.PathLike[str], *, n_gpu_layers: int = 0, repack: bool = True) -> None:
        self._load(path, vocab_only=False, n_gpu_layers=n_gpu_layers, repack=repack)
        lc = binding.llama()
        ptr = self.ptr
        self.n_embd = int(lc.llama_model_n_embd(ptr))
        self.n_embd_inp = int(lc.llama_model_n_embd_inp(ptr))
        self.n_embd_out = int(lc.llama_model_n_embd_out(ptr))
        self.n_layer = int(lc.llama_model_n_layer(ptr))
        self.n_layer_nextn = int(lc.llama_model_n_layer_nextn(ptr))
        #: the context the model was trained for (``{arch}.context_length``; llama.cpp runs past it, warning)
        self.n_ctx_train = int(lc.llama_model_n_ctx_train(ptr))
        self.architecture = self.meta("general.architecture")
        self.n_gpu_layers = int(n_gpu_layers)

    @property
    def model_size(self) -> int:
        """Bytes of the model's tensors as llama.cpp counts them (``llama_model_size``)."""
        return int(binding.llama().llama_model_size(self.ptr))


class LlamaContext(_ClosedOnDelete):
    """A llama.cpp context on a :class:`LlamaModel`.

    Args:
        model: the loaded model.
        n_ctx: context size in tokens.
        n_batch: largest batch handed to :meth:`decode`.
        mtp_of: for an MTP drafter context, the target's context (``ctx_type = MTP``, ``ctx_other``):
            the drafter then reads the target's KV cache.
        capture: a :class:`~.capture.NodeCapture` (or :func:`~.capture.node_capture`'s native one) installed
            as ``cb_eval``.
        flash_attn: flash attention on (True), off (False), or llama.cpp's auto (None).
        n_threads: CPU threads (None = llama.cpp default).
        nextn: turn on the nextn hidden-state output (``llama_set_embeddings_nextn``); ``masked``
            True keeps one row per output row (drafter), False one row per batch token (target).
        n_ubatch / n_seq_max / kv_unified / swa_full / type_k / type_v: the ``llama_context_params``
            fields of those names (``n_ubatch`` default ``n_batch``; None keeps llama.cpp's default;
            ``type_k`` / ``type_v`` are ggml type ids, e.g. 8 = Q8_0).

    Raises:
        TraceError: llama.cpp could not create the context.
    """

    #: the ``llama_context *`` (llama-cpp-python's untyped ctypes pointer, hence Any); None once closed
    ptr: Any

    def __init__(self, model: LlamaModel, *, n_ctx: int, n_batch: int, mtp_of: LlamaContext | None = None,
                 capture: NodeCapture | NativeCapture | None = None, flash_attn: bool | None = False,
                 n_threads: int | None = None, nextn: bool = True, masked: bool = False,
                 n_ubatch: int | None = None, n_seq_max: int = 1, kv_unified: bool | None = None,
                 swa_full: bool | None = None, type_k: int | None = None, type_v: int | None = None) -> None:
        lc = binding.llama()
        self.model = model
        params = lc.llama_context_default_params()
        params.n_ctx = int(n_ctx)
        params.n_batch = int(n_batch)
        params.n_ubatch = int(n_batch if n_ubatch is None else n_ubatch)
        params.n_seq_max = int(n_seq_max)
        # None keeps llama.cpp's default (llama_context_default_params)
        for name, value in (("kv_unified", kv_unified), ("swa_full", swa_full), ("type_k", type_k),
                            ("type_v", type_v)):
            if value is not None:
                setattr(params, name, value)
        params.no_perf = True
        if flash_attn is not None:
            params.flash_attn_type = (lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                                      else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        if n_threads:
            params.n_threads = int(n_threads)
            params.n_threads_batch = int(n_threads)
        if mtp_of is not None:
            params.ctx_type = lc.LLAMA_CONTEXT_TYPE_MTP
            params.ctx_other = mtp_of.ptr
        self.capture = capture
        if capture is not None:
            params.cb_eval = capture.callback
            params.cb_eval_user_data = getattr(capture, "user_data", None)
        logs.clear_recent()
        self.ptr = ptr = _created(lc.llama_init_from_model(model.ptr, params), lc.llama_free, "create a context",
                                  model.path)
        self.n_ctx = int(lc.llama_n_ctx(ptr))
        self.n_batch = int(lc.llama_n_batch(ptr))  # llama.cpp clamps n_batch to n_ctx
        self.mem = lc.llama_get_memory(ptr)
        self.n_vocab = model.n_vocab
        self.n_embd_out = model.n_embd_out
        if nextn:
            binding.ext().llama_set_embeddings_nextn(ptr, True, bool(masked))

    def decode(self, batch: Any) -> None:
        """``llama_decode``; raises :class:`TraceError` with the return code on failure, or the
        exception (e.g. ``KeyboardInterrupt``) the ``cb_eval`` capture caught during the decode."""
        sigint_state["native"] = True
        try:
            rc = binding.llama().llama_decode(self.ptr, batch.batch)
        finally:
            sigint_state["native"] = False
        if sigint_state["pending"]:
            sigint_state["pending"] = False
            if self.capture is not None:
                self.capture.error = None
            raise KeyboardInterrupt
        if self.capture is not None:
            self.capture.raise_pending()
        logs.raise_pending_log()
        if rc != 0:
            raise TraceError(f"llama_decode failed with rc {rc}: {logs.recent_log(3) or 'no log'}",
                             path=self.model.path)

    def logits(self, i: int) -> np.ndarray:
        """Logits of output row ``i`` (batch index; -1 = last), a float32 view of shape (n_vocab,).

        The view is only valid until the next decode: copy it to keep it.
        """
        p = binding.llama().llama_get_logits_ith(self.ptr, int(i))
        if not p:
            raise TraceError(f"no logits for batch row {i}", path=self.model.path)
        return np.ctypeslib.as_array(p, shape=(self.n_vocab,))

    def nextn(self, i: int) -> np.ndarray:
        """Hidden row ``i`` from ``llama_get_embeddings_nextn_ith``, a float32 view of shape (n_embd_out,).

        Target context (unmasked): row per batch token, the post-final-norm hidden state. Drafter
        context (masked): row per output, the post-projection state h_next. Valid until the next decode.
        """
        p = binding.ext().llama_get_embeddings_nextn_ith(self.ptr, int(i))
        if not p:
            raise TraceError(f"no nextn hidden row {i}", path=self.model.path)
        return np.ctypeslib.as_array(p, shape=(self.n_embd_out,))

    def seq_rm(self, p0: int, p1: int = -1) -> None:
        """Remove the cells of sequence 0 at positions [p0, p1) (p1 = -1: to the end)."""
        if not binding.llama().llama_memory_seq_rm(self.mem, 0, int(p0), int(p1)):
            raise TraceError(f"llama_memory_seq_rm({p0}, {p1}) failed", path=self.model.path)

    def clear(self) -> None:
        """Empty the memory (KV cache) of this context."""
        binding.llama().llama_memory_clear(self.mem, True)

    def close(self) -> None:
        """Free the context (idempotent). Free a drafter context before its target's."""
        if getattr(self, "ptr", None):
            binding.llama().llama_free(self.ptr)
            self.ptr = None


class TokenBatch:
    """A ``llama_batch`` of tokens for sequence 0 (``llama_batch_init(capacity, 0, 1)``)."""

    def __init__(self, capacity: int) -> None:
        lc = binding.llama()
        self.capacity = int(capacity)
        self.batch = lc.llama_batch_init(self.capacity, 0, 1)

    def set(self, tokens: Sequence[int], pos0: int, logits: str = "last") -> None:
        """Fill with ``tokens`` at positions pos0, pos0+1, ...; ``logits`` "last" or "all" rows output.

        Raises:
            TraceError: more tokens than the capacity.
        """
        n = len(tokens)
        if n > self.capacity:
            raise TraceError("batch too small", expected=f"<= {self.capacity} tokens", actual=n)
        b = self.batch
        b.n_tokens = n
        for i, t in enumerate(tokens):
            b.token[i] = int(t)
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1 if (logits == "all" or i == n - 1) else 0

    def close(self) -> None:
        """Free the batch (idempotent)."""
        if getattr(self, "batch", None) is not None:
            binding.llama().llama_batch_free(self.batch)
            self.batch = None


class DraftBatch:
    """A one-token ``llama_batch`` carrying both a token id and a hidden row (MTP drafter input).

    ``llama_batch_init(1, n_embd, 1)`` allocates only ``embd``; the token buffer is ours and is
    detached again before the batch is freed.
    """

    def __init__(self, n_embd: int) -> None:
        lc = binding.llama()
        self.n_embd = int(n_embd)
        self.batch = lc.llama_batch_init(1, self.n_embd, 1)
        self._tok = (lc.llama_token * 1)()
        self.batch.token = ctypes.cast(self._tok, ctypes.POINTER(lc.llama_token))
        self.embd = np.ctypeslib.as_array(self.batch.embd, shape=(self.n_embd,))

    def set(self, token: int, pos: int, h: np.ndarray) -> None:
        """Token ``token`` at position ``pos`` with hidden row ``h`` (shape (n_embd,), copied)."""
        b = self.batch
        b.n_tokens = 1
        self._tok[0] = int(token)
        b.pos[0] = int(pos)
        b.n_seq_id[0] = 1
        b.seq_id[0][0] = 0
        b.logits[0] = 1
        self.embd[:] = h

    def close(self) -> None:
        """Free the batch (idempotent)."""
        if getattr(self, "batch", None) is not None:
            lc = binding.llama()
            self.batch.token = ctypes.POINTER(lc.llama_token)()
            lc.llama_batch_free(self.batch)
            self.batch = None


class SamplerChain(_ClosedOnDelete):
    """llama-server 0.3.36's sampler chain for a request (``common_sampler_init`` with the server's defaults;
    ``llama_sampler_chain_*``, ``llama_sampler_init_*``): ``logit_bias`` (``-inf`` on the vocabulary's
    suppress tokens, when it has any) -> ``top_k`` -> ``top_p`` -> ``min_p`` -> ``temp_ext`` -> ``dist(seed)``.
    The server's other stages (penalties, DRY, top-n-sigma, typical, XTC) return without touching the
    candidates at its defaults and are left out. The seed is taken modulo 2**32 (``dist`` takes a uint32;
    ``0xFFFFFFFF`` asks llama.cpp for a random one, as the server's ``seed: -1``).

    Args: ``temp`` (``temp_ext``, no dynamic range; <= 0 keeps only the best token), ``seed`` (``dist``'s),
    ``top_k`` / ``top_p`` / ``min_p`` (``min_keep`` 0; ``<= 0`` / ``>= 1`` / ``<= 0``: no filtering),
    ``suppress`` (ids given a ``-inf`` bias: :meth:`LlamaVocab.suppress_tokens`), ``n_vocab`` (with it).
    """

    def __init__(self, *, temp: float, seed: int, top_k: int, top_p: float, min_p: float = 0.0,
                 suppress: Sequence[int] = (), n_vocab: int = 0) -> None:
        lc = binding.llama()
        chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        if suppress:
            bias = (lc.llama_logit_bias * len(suppress))(*[lc.llama_logit_bias(int(t), -np.inf) for t in suppress])
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_logit_bias(int(n_vocab), len(suppress), bias))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_k(int(top_k)))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_p(float(top_p), 0))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_min_p(float(min_p), 0))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp_ext(float(temp), 0.0, 1.0))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_dist(int(seed) & 0xFFFFFFFF))
        self.ptr = chain

    def sample(self, ctx: LlamaContext, i: int) -> int:
        """The chain's token for output row ``i`` of the last decode of ``ctx`` (``llama_sampler_sample``;
        the chain's state, e.g. its random stream, moves on)."""
        return int(binding.llama().llama_sampler_sample(self.ptr, ctx.ptr, int(i)))

    def close(self) -> None:
        """Free the chain (idempotent)."""
        if getattr(self, "ptr", None):
            binding.llama().llama_sampler_free(self.ptr)
            self.ptr = None


# --------------------------------------------------------------------------------------------------
# llama.cpp's quantizer (llama-quantize's library call)
# --------------------------------------------------------------------------------------------------

#: ``llama_model_kv_override`` keeps a key and a string value in ``char[128]`` each (``include/llama.h``)
KV_OVERRIDE_MAX_BYTES = 127


def ftype_ids() -> dict[str, int]:
    """llama.cpp's file types (``enum llama_ftype`` of ``include/llama.h``, as llama-cpp-python exports
    it) by llama-quantize's lower-case names, ordered by id: ``LLAMA_FTYPE_ALL_F32`` -> ``"f32"``,
    ``LLAMA_FTYPE_MOSTLY_Q4_K_M`` -> ``"q4_k_m"``, ... (``LLAMA_FTYPE_GUESSED`` is not a file type).

    Raises:
        RuntimeUnavailableError: llama-cpp-python missing.
    """
    lc = binding.llama()
    out: dict[str, int] = {}
    for attr in dir(lc):
        for prefix in ("LLAMA_FTYPE_MOSTLY_", "LLAMA_FTYPE_ALL_"):
            if attr.startswith(prefix):
                out[attr[len(prefix):].lower()] = int(getattr(lc, attr))
    return dict(sorted(out.items(), key=lambda kv: kv[1]))


def quantize(src: str | os.PathLike[str], dst: str | os.PathLike[str], ftype: str = "q8_0", *,
             n_threads: int = 0, pure: bool = False, metadata: dict[str, str] | None = None) -> Path:
    """Quantize a GGUF with llama.cpp's own quantizer (``llama_model_quantize`` on
    ``llama_model_quantize_default_params()``), as ``llama-quantize SRC DST TYPE`` does: the weight
    matrices to the file type's types by llama.cpp's per-tensor rules (``src/llama-quant.cpp``: e.g.
    ``q4_k_m`` keeps some ``ffn_down`` / ``attn_v`` at Q6_K, a tied output head at Q6_K or Q8_0, and falls
    back to Q5_0 / Q8_0 / F16 where a row's length is not a multiple of the block), 1-D tensors as
    they are. llama.cpp writes ``dst`` itself (not atomically: :func:`mtpscope.traces.run.quantize.quantize_file`
    writes to a temporary name and renames).

    Args:
        src: an F32 / F16 / BF16 GGUF (llama.cpp refuses to requantize quantized tensors).
        dst: the file to write.
        ftype: a name of :func:`ftype_ids` (case-insensitive: ``"Q8_0"`` = ``"q8_0"``).
        n_threads: quantizer threads (0: llama.cpp's default, one per core).
        pure: every matrix to the file type's default type (llama-quantize's ``--pure``).
        metadata: string keys added to the output's metadata (llama.cpp's ``kv_overrides``, which the
            quantizer writes into the new file; key and value at most :data:`KV_OVERRIDE_MAX_BYTES` bytes
            of UTF-8 each).

    Returns:
        ``dst`` as a :class:`Path`.

    Raises:
        TraceError: an unknown file type (the line lists llama.cpp's), a metadata key or value too long,
            or llama.cpp refused (its own message, e.g. "requantizing from type q8_0 is disabled").
        RuntimeUnavailableError: llama-cpp-python missing.
    """
    ids = ftype_ids()
    name = str(ftype).lower()
    if name not in ids:
        raise TraceError("unknown llama.cpp quantization type", key="type", expected=", ".join(ids), actual=ftype)
    lc = binding.llama()
    params = lc.llama_model_quantize_default_params()
    params.ftype = ids[name]
    params.nthread = int(n_threads)
    params.pure = bool(pure)
    overrides = _kv_overrides(lc, metadata or {})
    if overrides is not None:
        params.kv_overrides = ctypes.cast(overrides, ctypes.POINTER(lc.llama_model_kv_override))
    logs.clear_recent()
    rc = lc.llama_model_quantize(os.fspath(src).encode(), os.fspath(dst).encode(), ctypes.byref(params))
    logs.raise_pending_log()
    if rc != 0:
        raise TraceError(f"llama.cpp refused to quantize the model: {_quantize_refusal()}", path=src,
                         key=f"type {name}")
    return Path(dst)


def _kv_overrides(lc: Any, metadata: dict[str, str]) -> Any:
    """``metadata`` as a ``llama_model_kv_override`` array ended by an empty key (None when empty).

    Raises:
        TraceError: a key or value longer than :data:`KV_OVERRIDE_MAX_BYTES` bytes.
    """
    if not metadata:
        return None
    arr = (lc.llama_model_kv_override * (len(metadata) + 1))()
    for i, (k, v) in enumerate(metadata.items()):
        kb, vb = str(k).encode(), str(v).encode()
        for what, b in (("key", kb), ("value", vb)):
            if len(b) > KV_OVERRIDE_MAX_BYTES:
                raise TraceError(f"metadata {what} too long for llama.cpp's kv_overrides", key=str(k),
                                 expected=f"<= {KV_OVERRIDE_MAX_BYTES} bytes", actual=f"{len(b)} bytes")
        arr[i].key = kb
        arr[i].tag = lc.LLAMA_KV_OVERRIDE_TYPE_STR
        arr[i].value.val_str = vb
    return arr


def _quantize_refusal() -> str:
    """llama.cpp's own reason from its log: the text after ``failed to quantize:`` (what
    ``llama_model_quantize`` logs when its implementation throws), else its last log lines."""
    lines = logs.recent_log(40).splitlines()
    for ln in reversed(lines):
        _, sep, why = ln.partition("failed to quantize: ")
        if sep:
            return why.strip() or ln.strip()
    return " ".join(ln.strip() for ln in lines[-3:] if ln.strip()) or "no log"
