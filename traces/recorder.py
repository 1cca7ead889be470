"""Record traces from the real llama.cpp MTP loop (Gemma 4 target + ``gemma4-assistant`` drafter).

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

With tracing on, the drafter context carries a ``cb_eval`` callback that copies ``result_norm``
(h_inner); logits and h_next come from the API. See :func:`record` for what is stored.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.inspector.centroids import CentroidHead, head_from_gguf, load_centroid_head
from mtpscope.errors import LayoutError, MtpscopeError, RuntimeAbortedError, TraceError
from mtpscope.traces import llama_runtime as rt
from mtpscope.traces.centroid_head import centroid_steps
from mtpscope.traces.records import RoundRecord, StepRecord

H_INNER_NODE = "result_norm"
HIDDEN_CHOICES = ("f16", "f32", "off")

# --------------------------------------------------------------------------------------------------
# prompts
# --------------------------------------------------------------------------------------------------


def read_prompts(path: str | os.PathLike[str]) -> list[str]:
    """Prompts from a ``.jsonl`` file (one JSON string, or object with ``prompt`` or ``text``, per line)
    or any other text file (one prompt per non-empty line).

    Raises:
        MtpscopeError: unreadable JSON line or an object without ``prompt`` / ``text`` (names the line);
            a file without prompts; bytes that are not UTF-8 (names the byte offset).
        FileNotFoundError: missing file.
    """
    p = Path(path)
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MtpscopeError(f"prompts file is not UTF-8 text ({e.reason} at byte {e.start})", path=p,
                            offset=e.start, expected="UTF-8", actual=f"byte 0x{raw[e.start]:02x}") from None
    prompts: list[str] = []
    if p.suffix.lower() == ".jsonl":
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError) as e:
                raise MtpscopeError(f"line {n} is not JSON: {e}", path=p, key=f"line {n}") from None
            if isinstance(obj, str):
                prompts.append(obj)
            elif isinstance(obj, dict) and isinstance(obj.get("prompt", obj.get("text")), str):
                prompts.append(obj.get("prompt", obj.get("text")))
            else:
                raise MtpscopeError(f"line {n} needs a JSON string or an object with a 'prompt' or 'text' string",
                                    path=p, key=f"line {n}", expected="string or {\"prompt\": ...}",
                                    actual=type(obj).__name__)
    else:
        prompts = [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise MtpscopeError("no prompts in file", path=p, expected=">= 1 prompt", actual=0)
    return prompts


# --------------------------------------------------------------------------------------------------
# argument checks (before any model is loaded)
# --------------------------------------------------------------------------------------------------

#: the most drafts per round :func:`record` accepts. llama.cpp's MTP default is 3 drafts per round;
#: each round verifies ``n_draft + 1`` tokens in one target batch and the drafter's acceptance decays
#: with depth, so far more drafts than that are a mistake (``--n-draft 1000000000`` would otherwise
#: allocate gigabytes before llama.cpp fails).
MAX_N_DRAFT = 64


def check_draft_and_sampling(*, n_draft: int, temp: float, top_k: int, top_p: float) -> None:
    """Refuse draft / sampling parameters that llama.cpp cannot run or the manifest cannot store.

    Rules: ``1 <= n_draft <= MAX_N_DRAFT`` (64); ``temp`` finite and ``>= 0`` (0 = greedy); ``top_p``
    finite in ``(0, 1]`` (1 = off); ``top_k >= 0`` (0 = off).

    Raises:
        TraceError: the first parameter that breaks a rule, naming it with expected vs actual.
    """
    import math  # noqa: PLC0415

    if not (1 <= int(n_draft) <= MAX_N_DRAFT):
        raise TraceError(f"n_draft must be in 1..{MAX_N_DRAFT} (llama.cpp's MTP default is 3; far more "
                         "drafts than a verify batch holds is a mistake)", key="n_draft",
                         expected=f"1..{MAX_N_DRAFT}", actual=n_draft)
    t = float(temp)
    if not math.isfinite(t) or t < 0:
        raise TraceError("temp must be a finite number >= 0 (0 = greedy)", key="temp",
                         expected="finite >= 0", actual=temp)
    p = float(top_p)
    if not math.isfinite(p) or not (0.0 < p <= 1.0):
        raise TraceError("top_p must be in (0, 1] (1 = off)", key="top_p", expected="0 < top_p <= 1",
                         actual=top_p)
    if int(top_k) < 0:
        raise TraceError("top_k must be >= 0 (0 = off)", key="top_k", expected=">= 0", actual=top_k)


# --------------------------------------------------------------------------------------------------
# pre-flight (our reader, before llama.cpp sees the files)
# --------------------------------------------------------------------------------------------------


def _header_sha256(path: Path, data_offset: int) -> str:
    h = hashlib.sha256()
    left = data_offset
    with open(path, "rb") as fh:
        while left > 0:
            block = fh.read(min(left, 1 << 20))
            if not block:
                break
            h.update(block)
            left -= len(block)
    return h.hexdigest()


def model_info(f: Any) -> dict[str, Any]:
    """Manifest entry of an open GGUF: path, size (bytes), architecture, dialect, header_sha256
    (sha256 of bytes [0, data_offset), i.e. header, metadata and tensor infos, not the weights)."""
    from mtpscope.inspector.inventory import detect_dialect  # noqa: PLC0415

    p = Path(f.path)
    return {"path": os.fspath(p.resolve()), "size": int(f.file_size), "architecture": f.architecture,
            "dialect": detect_dialect(f).kind, "header_sha256": _header_sha256(p, int(f.data_offset))}


def centroid_source_info(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Manifest entry of a ``--centroids`` source (GGUF: as :func:`model_info`; HF: dialect ``hf``,
    size = bytes of its safetensors files, header_sha256 over their headers in name order)."""
    p = Path(path)
    if p.is_dir() or p.suffix == ".safetensors":
        files = [p] if p.is_file() else sorted(p.glob("*.safetensors"))
        h = hashlib.sha256()
        size = 0
        for file in files:
            size += file.stat().st_size
            with open(file, "rb") as fh:
                n8 = fh.read(8)
                h.update(n8)
                h.update(fh.read(int.from_bytes(n8, "little")))
        arch = None
        cfg = (p if p.is_dir() else p.parent) / "config.json"
        if cfg.exists():
            try:
                arch = json.loads(cfg.read_text()).get("model_type")
            except ValueError:
                arch = None
        return {"path": os.fspath(p.resolve()), "size": size, "architecture": arch, "dialect": "hf",
                "header_sha256": h.hexdigest()}
    from mtpscope.inspector.gguf import open_gguf  # noqa: PLC0415

    with open_gguf(p) as f:
        return model_info(f)


def _crash_codes() -> frozenset[str]:
    from mtpscope.inspector.validate import RUNTIME_CRASH_CODES  # noqa: PLC0415 - the one list (inspector)

    return RUNTIME_CRASH_CODES


def preflight(target: str | os.PathLike[str], assistant: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Check with our own GGUF reader that llama.cpp can run this pair, before llama.cpp sees it.

    Checks: both files readable GGUF; the drafter's architecture is ``gemma4-assistant`` (a fork-dialect
    ``gemma4_assistant`` drafter is refused: llama.cpp does not load it, use it via ``--centroids``);
    the target's is ``gemma4``; the inspector's upstream loadability rules for both files; the
    inspector's pairing check (backbone width, vocabulary, KV heads / head dims per layer type); no
    :func:`inspector.validate.verify` error about a tensor's ggml type or shape
    (the inspector's ``RUNTIME_CRASH_CODES``, e.g. a norm stored as F16; the first three are listed in
    the message).

    Returns:
        ``{"target": model_info, "assistant": model_info}``.

    Raises:
        LayoutError: a refusal, naming the file, the key and expected vs actual (from the finding).
        GGUFFormatError / UnsupportedFileError / TensorDataError: unreadable file.
        FileNotFoundError: a missing file.
    """
    from mtpscope.inspector import validate as V  # noqa: PLC0415
    from mtpscope.inspector.gguf import open_gguf  # noqa: PLC0415

    for p in (target, assistant):
        if not Path(p).is_file():
            raise FileNotFoundError(2, "No such file or directory", os.fspath(p))
    with open_gguf(assistant) as d, open_gguf(target) as t:
        if d.architecture == "gemma4_assistant":
            raise LayoutError("fork-dialect drafter (gemma4_assistant): llama.cpp's runtime does not load it; "
                              "record with an upstream gemma4-assistant drafter and pass this file as "
                              "--centroids to compare its centroid head", path=d.path,
                              key="general.architecture", expected="gemma4-assistant", actual=d.architecture)
        if d.architecture != "gemma4-assistant":
            raise LayoutError("the assistant must be a gemma4-assistant drafter", path=d.path,
                              key="general.architecture", expected="gemma4-assistant", actual=d.architecture)
        if t.architecture != "gemma4":
            raise LayoutError("the target must be a gemma4 model", path=t.path, key="general.architecture",
                              expected="gemma4", actual=t.architecture)
        for f in (t, d):
            v = V.upstream_verdict(f)
            if v.loads is False:
                raise LayoutError(f"llama.cpp would refuse this file: {v.reasons[0]}", path=f.path,
                                  key="loadability", expected="loads", actual="refused")
        pairing = V.check_pairing(d, t)
        errors = [x for x in pairing.findings if x.severity == V.ERROR]
        if errors:
            e = errors[0]
            raise LayoutError(f"{e.code}: {e.message} (target {t.path})", path=d.path, key=e.subject,
                              expected=e.expected, actual=e.actual)
        # wrong ggml types / shapes of the drafter's tensors: llama.cpp loads some of these and then
        # crashes (segfault) inside llama_decode, so refuse them here
        report = V.verify(d, target=t)
        crash = [x for x in report.findings if x.code in _crash_codes()]
        if crash:
            e = crash[0]
            listed = "; ".join(f"{x.code} {x.subject} (expected {x.expected}, got {x.actual})" for x in crash[:3])
            more = f"; and {len(crash) - 3} more" if len(crash) > 3 else ""
            raise LayoutError(f"llama.cpp would crash on this drafter ({len(crash)} tensor type/shape "
                              f"error{'s' if len(crash) != 1 else ''}: {listed}{more}; run `mtpscope verify`)",
                              path=d.path, key=e.subject, expected=e.expected, actual=e.actual)
        return {"target": model_info(t), "assistant": model_info(d)}


#: :func:`preflight` under another name: :func:`record` has a ``preflight`` flag
_preflight = preflight


# --------------------------------------------------------------------------------------------------
# the loop
# --------------------------------------------------------------------------------------------------


def top_k_desc(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest values of ``x`` (1-D), best first; ties: lower index first.

    Exact and fast on large vectors (about 0.3 ms for 262144 float32 here, against 2 ms for a full
    ``argpartition``): a block of 512 whose maximum is below the k-th largest block maximum cannot
    hold a top-k value, so only the best k blocks are searched.
    """
    x = np.asarray(x).reshape(-1)
    n = x.shape[0]
    k = min(int(k), n)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    b = 512
    if n >= 8 * b and n % b == 0:
        # "blocks" are the columns of x viewed as (n // 512, 512): column j holds j, j + 512, ...
        grid = x.reshape(-1, b)
        bmax = grid.max(axis=0)
        kb = min(k, b)
        thr = np.partition(bmax, b - kb)[b - kb]
        sel = np.flatnonzero(bmax >= thr)
        vals = grid[:, sel].reshape(-1)            # row-major over (rows, len(sel))
        kk = min(k, vals.shape[0])
        kth = -np.partition(-vals, kk - 1)[kk - 1]
        hit = np.flatnonzero(vals >= kth)          # every value >= the k-th largest (ties included)
        gid = (hit // sel.shape[0]) * b + sel[hit % sel.shape[0]]
    else:
        kk = min(k, n)
        kth = -np.partition(-x, kk - 1)[kk - 1]
        gid = np.flatnonzero(x >= kth)
    order = np.lexsort((gid, -x[gid]))
    return gid[order][:k]


@dataclass
class _Step:
    token: int
    logits: np.ndarray | None
    h: np.ndarray | None
    h_next: np.ndarray | None
    h_inner: np.ndarray | None


@dataclass(frozen=True)
class RoundResult:
    """One round as the loop ran it (before it is turned into trace records).

    ``steps`` carries per-step raw data (drafter logits copy, hidden states) only when tracing.
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
    steps: tuple[_Step, ...] = field(repr=False, default=())


class Sampler:
    """The target's token choice: greedy argmax (``temp <= 0``) or llama.cpp's seeded sampler chain
    ``top_k -> top_p -> temp -> dist(seed)`` (top_k <= 0 and top_p >= 1 leave those stages out)."""

    def __init__(self, *, temp: float = 0.0, seed: int = 0, top_k: int = 40, top_p: float = 1.0) -> None:
        self.temp, self.seed, self.top_k, self.top_p = float(temp), int(seed), int(top_k), float(top_p)
        self.greedy = self.temp <= 0.0
        self._chain = None
        if not self.greedy:
            lc = rt.llama()
            chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
            if self.top_k > 0:
                lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_k(self.top_k))
            if self.top_p < 1.0:
                lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_p(self.top_p, 1))
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(self.temp))
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_dist(self.seed & 0xFFFFFFFF))
            self._chain = chain

    def sample(self, ctx: rt.LlamaContext, i: int) -> int:
        """The target's token at batch row ``i`` of the last decode of ``ctx``."""
        if self.greedy:
            return int(np.argmax(ctx.logits(i)))
        return int(rt.llama().llama_sampler_sample(self._chain, ctx.ptr, int(i)))

    def close(self) -> None:
        if self._chain is not None:
            rt.llama().llama_sampler_free(self._chain)
            self._chain = None


class MtpRuntime:
    """A target and its drafter loaded in llama.cpp, with their contexts; reusable across prompts
    and :func:`record` calls (tests and benchmarks load once).

    Args:
        target / assistant: GGUF paths (run :func:`preflight` first; this class does not).
        n_gpu_layers: layers to offload (-1 all, 0 CPU only), for both models.
        n_ctx: initial context size in tokens; :meth:`run` and :meth:`generate_plain` grow it (new
            contexts, same models) when prompt + max_tokens + n_draft + 1 does not fit.
        n_batch: largest decode batch (prompts are prefilled in chunks of this size).
        capture: install the ``cb_eval`` capture of ``result_norm`` on the drafter (needed for h_inner
            and the centroid head); False runs the drafter without any callback.
        flash_attn: flash attention (off by default: batch-size dependent numerics can flip near-tie
            argmaxes, and the greedy-equivalence invariant is checked with it off).
        n_threads: CPU threads (None: llama.cpp's default).

    Raises:
        TraceError: llama.cpp cannot load a model or create a context.
        RuntimeUnavailableError: llama-cpp-python missing.
    """

    def __init__(self, target: str | os.PathLike[str], assistant: str | os.PathLike[str], *,
                 n_gpu_layers: int = 0, n_ctx: int = 1024, n_batch: int = 256, capture: bool = True,
                 flash_attn: bool | None = False, n_threads: int | None = None) -> None:
        self.target_path, self.assistant_path = Path(target), Path(assistant)
        self.n_gpu_layers = int(n_gpu_layers)
        self.flash_attn = flash_attn
        self.n_threads = n_threads
        self._closed = False
        self.tctx = self.dctx = None  # type: ignore[assignment]
        self.tmodel = rt.LlamaModel(target, n_gpu_layers=n_gpu_layers)
        try:
            self.dmodel = rt.LlamaModel(assistant, n_gpu_layers=n_gpu_layers)
        except BaseException:
            self.tmodel.close()
            raise
        self.n_vocab = self.tmodel.n_vocab
        self.n_embd_backbone = self.tmodel.n_embd_out
        self.n_embd = self.dmodel.n_embd
        self.n_batch = max(int(n_batch), 16)
        self.capture = rt.NodeCapture([H_INNER_NODE]) if capture else None
        self.tbatch = rt.TokenBatch(self.n_batch)
        self.dbatch = rt.DraftBatch(self.dmodel.n_embd_inp)
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
        self.tctx = rt.LlamaContext(self.tmodel, n_ctx=n_ctx, n_batch=self.n_batch, flash_attn=self.flash_attn,
                                    n_threads=self.n_threads, nextn=True, masked=False)
        self.dctx = rt.LlamaContext(self.dmodel, n_ctx=n_ctx, n_batch=self.n_batch, mtp_of=self.tctx,
                                    capture=self.capture, flash_attn=self.flash_attn, n_threads=self.n_threads,
                                    nextn=True, masked=True)
        self.n_ctx = self.tctx.n_ctx

    def ensure_context(self, n_tokens: int) -> None:
        """Grow the contexts (to a multiple of 256) when fewer than ``n_tokens`` positions fit."""
        if n_tokens > self.n_ctx:
            self._make_contexts(-(-int(n_tokens) // 256) * 256)

    # -- prompts
    def prompt_tokens(self, text: str, *, chat: bool = False) -> list[int]:
        """Token ids of a prompt (BOS added as the vocab wants; with ``chat`` the GGUF's own chat
        template is applied first and special tokens in it are parsed)."""
        if chat:
            return self.tmodel.tokenize(self.tmodel.apply_chat_template(text), add_special=False,
                                        parse_special=True)
        return self.tmodel.tokenize(text, add_special=True, parse_special=False)

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

    def generate_plain(self, tokens: Sequence[int], *, max_tokens: int, sampler: Sampler | None = None) -> list[int]:
        """Plain decoding of the target alone, one token per decode (the reference for the
        speculative loop). Same stopping rule as :meth:`run`. Returns the generated ids."""
        sampler = sampler or Sampler()
        self._check_fits(len(tokens), max_tokens, 0)
        self._prefill(tokens)
        out: list[int] = []
        pos = len(tokens)
        tok = sampler.sample(self.tctx, self.tbatch.batch.n_tokens - 1)
        while True:
            out.append(tok)
            if len(out) >= max_tokens or self.tmodel.is_eog(tok):
                return out
            self.tbatch.set([tok], pos, logits="last")
            self.tctx.decode(self.tbatch)
            pos += 1
            tok = sampler.sample(self.tctx, 0)

    def _check_fits(self, n_prompt: int, max_tokens: int, n_draft: int) -> None:
        self.ensure_context(n_prompt + max_tokens + n_draft + 1)

    def run(self, tokens: Sequence[int], *, n_draft: int = 3, max_tokens: int = 128,
            sampler: Sampler | None = None, trace: bool = True) -> Iterator[RoundResult]:
        """Run the MTP loop on one prompt, yielding each round as it finishes.

        Args:
            tokens: prompt token ids.
            n_draft: drafts per round (K >= 1).
            max_tokens: generated tokens at most (the prefill's token included).
            sampler: the target's token choice (default greedy).
            trace: keep per-step raw data (drafter logits, h, h_next, h_inner) in the results.
        """
        if n_draft < 1:
            raise TraceError("n_draft must be >= 1", key="n_draft", expected=">= 1", actual=n_draft)
        if max_tokens < 1:
            raise TraceError("max_tokens must be >= 1", key="max_tokens", expected=">= 1", actual=max_tokens)
        if n_draft + 1 > self.n_batch:
            raise TraceError("n_draft + 1 must fit one verify batch", key="n_draft",
                             expected=f"<= {self.n_batch - 1}", actual=n_draft)
        sampler = sampler or Sampler()
        self._check_fits(len(tokens), max_tokens, n_draft)
        self._prefill(tokens)
        tctx, dctx, cap = self.tctx, self.dctx, self.capture
        db, tb = self.dbatch, self.tbatch
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
            steps: list[_Step] = []
            t0 = perf()
            tok, h_in = pending, h
            for _ in range(k_max):
                if cap is not None:
                    cap.reset()
                db.set(tok, pos, h_in)
                dctx.decode(db)
                lg = dctx.logits(0)
                d = int(np.argmax(lg))
                h_next = dctx.nextn(0).copy()
                if trace:
                    hi = cap.get(H_INNER_NODE) if cap is not None else None
                    steps.append(_Step(d, lg.copy(), h_in, h_next, None if hi is None else hi.reshape(-1)))
                drafted.append(d)
                tok, h_in = d, h_next
            t1 = perf()
            tb.set([pending, *drafted], pos, logits="all")
            tctx.decode(tb)
            target: list[int | None] = []
            n_acc = 0
            if sampler.greedy:
                for i in range(k_max + 1):
                    target.append(int(np.argmax(tctx.logits(i))))
                while n_acc < k_max and drafted[n_acc] == target[n_acc]:
                    n_acc += 1
            else:
                for i in range(k_max + 1):
                    s = sampler.sample(tctx, i)
                    target.append(s)
                    if i < k_max and s == drafted[i]:
                        n_acc += 1
                        continue
                    break
                target += [None] * (k_max + 1 - len(target))
            emitted = drafted[:n_acc] + [int(target[n_acc])]  # type: ignore[arg-type]
            for j, e in enumerate(emitted):  # stop at an end-of-generation token
                if eog(e):
                    emitted = emitted[:j + 1]
                    n_acc = min(n_acc, j + 1)
                    break
            h = tctx.nextn(n_acc).copy()
            tctx.seq_rm(pos + n_acc + 1, -1)
            t2 = perf()
            yield RoundResult(round=rnd, pos=pos, pending_token=pending, drafted=tuple(drafted),
                              target=tuple(target), n_accepted=n_acc, emitted=tuple(emitted),
                              t_draft_ms=(t1 - t0) * 1e3, t_verify_ms=(t2 - t1) * 1e3, steps=tuple(steps))
            n_out += len(emitted)
            pos += n_acc + 1
            pending = emitted[-1]
            rnd += 1
            if eog(pending) or n_out >= max_tokens:
                return

    def close(self) -> None:
        """Free batches, contexts (drafter first) and models. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for obj in (self.dbatch, self.tbatch, self.dctx, self.tctx, self.dmodel, self.tmodel):
            if obj is not None:
                obj.close()

    def __enter__(self) -> MtpRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------------
# records
# --------------------------------------------------------------------------------------------------

_BLAS_THREAD_FUNCS = (("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
                      ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
                      ("openblas_set_num_threads", "openblas_get_num_threads"))


def _openblas_thread_control() -> tuple[Callable[[int], None], Callable[[], int]] | None:
    """``(set, get)`` for the thread count of the OpenBLAS that numpy's wheel bundles, else None."""
    import ctypes  # noqa: PLC0415
    import glob  # noqa: PLC0415

    libdir = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    for path in sorted(glob.glob(os.fspath(libdir / "*openblas*.so*"))):
        try:
            lib = ctypes.CDLL(path)  # already loaded by numpy: same handle, same globals
        except OSError:
            continue
        for set_name, get_name in _BLAS_THREAD_FUNCS:
            setf, getf = getattr(lib, set_name, None), getattr(lib, get_name, None)
            if setf is not None and getf is not None:
                setf.argtypes, setf.restype = [ctypes.c_int], None
                getf.argtypes, getf.restype = [], ctypes.c_int
                return setf, getf
    return None


class _SingleThreadBlas:
    """Run numpy's OpenBLAS on one thread inside the ``with`` block (restored after).

    The trace analysis does small matrix products (centroids x h_inner) between llama.cpp decodes;
    multi-threaded OpenBLAS then leaves helper threads spinning that compete with llama.cpp's own
    threads for the cores. No-op where numpy does not bundle OpenBLAS.
    """

    def __enter__(self) -> _SingleThreadBlas:
        self._ctl = _openblas_thread_control()
        self._old = None
        if self._ctl is not None:
            self._old = int(self._ctl[1]())
            self._ctl[0](1)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._ctl is not None and self._old is not None:
            self._ctl[0](self._old)


def _rank(logits: np.ndarray, token: int) -> int:
    """Rank of ``token`` among ``logits`` (0 = best; only strictly greater logits count)."""
    return int(np.count_nonzero(logits > logits[token]))


def _rank_with_top(logits: np.ndarray, token: int, top: np.ndarray, top_vals: np.ndarray) -> int:
    """:func:`_rank`, read off the top-k list when ``token`` is in it (every strictly greater logit is
    then in the list too), else counted over the whole vector."""
    hit = np.flatnonzero(top == token)
    if hit.size:
        return int(np.count_nonzero(top_vals > logits[token]))
    return _rank(logits, token)


def step_records(res: RoundResult, *, n_top: int = 10, hidden: str = "f16",
                 head: CentroidHead | None = None) -> list[StepRecord]:
    """Per-step trace records of one round (see :func:`record` for the fields)."""
    out: list[StepRecord] = []
    keep_h = hidden != "off"
    steps = res.steps
    targets = [res.target[k] if k < len(res.target) else None for k in range(len(steps))]
    cs_all = None
    if head is not None and steps and all(s.h_inner is not None for s in steps):
        logits = None
        if all(s.logits is not None for s in steps):
            logits = [s.logits for s in steps]
        cs_all = centroid_steps(head, np.stack([s.h_inner for s in steps]), dense_logits=logits,
                                target_tokens=targets)
    for k, s in enumerate(steps, start=1):
        lg = s.logits
        tt = targets[k - 1]
        top = top_k_desc(lg, n_top) if lg is not None else None
        kw: dict[str, Any] = {}
        if cs_all is not None:
            cs = cs_all[k - 1]
            kw = {"centroid_ids": cs.centroid_ids.tolist(), "centroid_logits": cs.centroid_logits.tolist(),
                  "centroid_token": cs.centroid_token, "target_in_candidates": cs.target_in_candidates,
                  "target_centroid": cs.target_centroid, "target_centroid_rank": cs.target_centroid_rank}
        top_vals = None if top is None else lg[top]
        out.append(StepRecord(
            k=k, token=s.token,
            logit=None if lg is None else float(lg[s.token]),
            rank=None if lg is None else _rank_with_top(lg, s.token, top, top_vals),
            top_ids=None if top is None else top.tolist(),
            top_logits=None if top_vals is None else top_vals.tolist(),
            target_token=tt,
            target_rank=None if (lg is None or tt is None) else _rank_with_top(lg, tt, top, top_vals),
            accepted=k <= res.n_accepted,
            h=s.h if keep_h else None, h_next=s.h_next if keep_h else None,
            h_inner=s.h_inner if keep_h else None, **kw))
    return out


def round_record(prompt_id: int, res: RoundResult) -> RoundRecord:
    """The trace record of one round."""
    return RoundRecord(prompt_id=prompt_id, round=res.round, pos=res.pos, pending_token=res.pending_token,
                       n_draft=len(res.drafted), drafted=res.drafted, n_accepted=res.n_accepted,
                       target=res.target, emitted=res.emitted, t_draft_ms=res.t_draft_ms,
                       t_verify_ms=res.t_verify_ms)


@dataclass(frozen=True)
class RecordSummary:
    """What :func:`record` did.

    Attributes:
        out: the trace directory.
        n_prompts, n_rounds, n_steps: counts written.
        n_drafted, n_accepted: draft tokens proposed / accepted.
        acceptance_rate: n_accepted / n_drafted (llama.cpp's definition), None with no drafts.
        mean_acceptance_length: 1 + n_accepted / verify rounds that drafted at least one token (the
            same definition as :func:`traces.metrics.totals`), None with no such round.
        n_generated: generated tokens over all prompts (each prompt's prefill token included).
        seconds: wall time of the generation loops (prefill and trace writing included, loading excluded).
        cpu_seconds: CPU time of this process over the same span (``time.process_time``).
        trace_seconds: wall time spent outside the MTP loop on the trace: step analysis (top-k,
            ranks, centroid head), records and Parquet writing (the ``cb_eval`` copy inside the drafter
            decode is not included).
        tokens_per_second: n_generated / seconds.
        outputs: generated token ids per prompt.
        isolated: llama.cpp ran in a worker process.
        loop_seconds / loop_cpu_seconds: wall and CPU time of the MTP loop itself (the worker's, when
            isolated; then ``cpu_seconds`` is ``recorder_cpu_seconds + loop_cpu_seconds``).
        recorder_cpu_seconds: CPU time of this process over ``seconds``.
    """

    out: str
    n_prompts: int
    n_rounds: int
    n_steps: int
    n_drafted: int
    n_accepted: int
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    n_generated: int
    seconds: float
    cpu_seconds: float
    trace_seconds: float
    tokens_per_second: float
    outputs: tuple[tuple[int, ...], ...]
    isolated: bool = False
    loop_seconds: float = 0.0
    loop_cpu_seconds: float = 0.0
    recorder_cpu_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        d = asdict(self)
        d["outputs"] = [list(o) for o in self.outputs]
        return d


def _holds_trace(path: Path) -> bool:
    """Whether ``path`` holds a trace (a manifest or Parquet parts in ``rounds/`` / ``steps/``)."""
    if (path / "manifest.json").exists():
        return True
    return any(any((path / t).glob("part-*.parquet")) for t in ("rounds", "steps") if (path / t).is_dir())


def _swap_in(new: Path, out: Path) -> None:
    """Replace the trace directory ``out`` with the finished ``new`` one: rename ``out`` to
    ``<out>.old-<pid>``, ``new`` to ``out``, then delete the old one (on a failed second rename the
    old trace is put back). The whole ``out`` folder is replaced, other files in it included."""
    import shutil  # noqa: PLC0415

    old = out.with_name(f"{out.name}.old-{os.getpid()}")
    if old.exists():
        shutil.rmtree(old)
    os.rename(out, old)
    try:
        os.rename(new, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _progress(enabled: bool, total: int) -> Any:
    if not enabled:
        return None
    from rich.console import Console  # noqa: PLC0415
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

    p = Progress(TextColumn("[bold]record[/]"), BarColumn(), MofNCompleteColumn(), TextColumn("tokens"),
                 TextColumn("{task.fields[acc]}"), TimeElapsedColumn(), transient=False,
                 console=Console(stderr=True))
    p.start()
    p.add_task("record", total=total, acc="acceptance rate -")
    return p


def record(*, target: str | os.PathLike[str], assistant: str | os.PathLike[str], out: str | os.PathLike[str],
           prompts: Sequence[str] | None = None, prompt: str | None = None,
           prompts_file: str | os.PathLike[str] | None = None, n_draft: int = 3, max_tokens: int = 128,
           temp: float = 0.0, seed: int = 0, top_k: int = 40, top_p: float = 1.0, chat: bool = False,
           n_gpu_layers: int = -1, centroids: str | os.PathLike[str] | None = None,
           centroid_top_k: int | None = None, hidden: str = "f16", n_top: int = 10, flush_every: int = 8,
           flash_attn: bool = False, n_threads: int | None = None, overwrite: bool = False, compact: bool = True,
           progress: bool = False, command: Sequence[str] | None = None,
           runtime: MtpRuntime | None = None, on_round: Callable[[int, RoundResult], None] | None = None,
           isolate: bool | None = None, preflight: bool = True, echo_log: bool = False,
           ) -> RecordSummary:
    """Run the real MTP loop on each prompt and write a trace directory (schema version 1).

    Per round (``rounds`` table): prompt id, round, position of the pending token, the pending token,
    drafted ids, the target's ids at each verify row (null after the first mismatch when sampling),
    n_accepted, emitted tokens (accepted drafts + the target's token; cut after an end-of-generation
    token, in which case ``n_accepted`` counts only the drafts up to it), draft / verify wall times in
    ms (draft: the K drafter decodes with their argmax and h_next reads; verify: the target decode,
    acceptance and KV roll-back; the trace analysis and writing are outside both). Per draft step (``steps``): k
    (1-based), the token, its logit and rank, the top ``n_top`` drafter candidates with logits, the
    target's token at that position and its rank among the drafter's logits, accepted, and unless
    ``hidden="off"``: ``h`` (fed in, width n_embd_backbone), ``h_next`` (post-projection output,
    width n_embd_backbone) and ``h_inner`` (``result_norm`` via ``cb_eval``, width n_embd), stored as
    float16 (``"f16"``) or float32. With a centroid head (``centroids``: fork-dialect GGUF or HF
    directory): top-k centroid ids and logits, the sparse head's token, whether the target's token is a
    candidate, the target token's centroid and that centroid's rank.

    Args:
        target / assistant: GGUF paths (gemma4 target, gemma4-assistant drafter).
        out: the trace directory.
        prompts / prompt / prompts_file: the prompts (exactly one of them).
        n_draft: drafts per round; max_tokens: tokens generated per prompt at most.
        temp / seed / top_k / top_p: the target's sampling (``temp <= 0``: greedy).
        chat: apply the GGUF's own chat template to each prompt.
        n_gpu_layers: layers offloaded (-1 = all, the default; no effect in a CPU-only build).
        centroids / centroid_top_k: centroid head source and its k (default: the source's).
        hidden: ``"f16"``, ``"f32"`` or ``"off"``.
        n_top: drafter candidates stored per step.
        flush_every: write a Parquet part every this many rounds (crash safety granularity).
        flash_attn: flash attention on (default off).
        overwrite: replace an existing trace in ``out``. The new trace is then written to the sibling
            folder ``<out>.partial-<pid>`` and swapped in only when the run completes; if it fails (an
            error, Ctrl-C) the old trace stays untouched and the partial one is left where it is (named
            on stderr and in a note on the exception). Without an existing trace ``out`` is written in
            place (crash-safe parts).
        compact: at the end, merge the small Parquet parts into large ones (the writer's default; it
            rewrites the trace once, hidden states included).
        progress: show a rich progress bar with the running acceptance rate (stderr).
        command: argv for the manifest (default ``sys.argv``).
        runtime: an already loaded :class:`MtpRuntime` for these paths (not closed here; runs in this
            process).
        on_round: called with ``(prompt_id, RoundResult)`` after each round is written (in the write-ahead
            log: it survives a ``kill -9`` from then on).
        isolate: run llama.cpp in a worker process (:mod:`traces.record_worker`; default: yes, unless
            ``runtime`` is given). A crash of llama.cpp then ends the run with
            :class:`~mtpscope.errors.RuntimeAbortedError` (one line quoting llama.cpp) and the trace keeps
            every round before it, marked incomplete, with an ``aborted`` record and ``llama.log``.
        preflight: check the pair with the inspector before loading (default). ``False`` skips it, for
            debugging a runtime crash on a pair that pre-flight refuses (the manifest says so).
        echo_log: copy llama.cpp's own output (isolated runs) to stderr as it comes (``--verbose``).

    Returns:
        :class:`RecordSummary`.

    Raises:
        RuntimeAbortedError: llama.cpp died in the worker process (abort, signal, exit); the trace written
            so far is closed incomplete with ``aborted`` in its manifest.
        LayoutError: the pre-flight check refused the pair or the centroid source does not fit.
        TraceError: n_draft outside 1..64 or bad sampling values (:func:`check_draft_and_sampling`),
            before any model is loaded; errors from the writer.
        MtpscopeError: bad arguments or prompts file; GGUF reader errors.
        RuntimeUnavailableError: llama-cpp-python missing.
        KeyboardInterrupt: a Ctrl-C, raised right after the llama.cpp decode it arrived in; the trace
            written so far stays readable, marked incomplete.
    """
    from mtpscope.traces.record_worker import (STOP_GRACE_S, PromptDone, RecordWorker, WorkerDone,  # noqa: PLC0415
                                               WorkerRound)
    from mtpscope.traces.store import TraceWriter  # noqa: PLC0415

    given = [x is not None for x in (prompts, prompt, prompts_file)]
    if sum(given) != 1:
        raise MtpscopeError("give exactly one of prompts, prompt, prompts_file", key="prompts",
                            expected="one source", actual=sum(given))
    if hidden not in HIDDEN_CHOICES:
        raise MtpscopeError("unknown hidden-state storage", key="hidden", expected="f16 | f32 | off",
                            actual=hidden)
    for name, val, lo in (("n_draft", n_draft, 1), ("max_tokens", max_tokens, 1), ("n_top", n_top, 1),
                          ("flush_every", flush_every, 1)):
        if int(val) < lo:
            raise MtpscopeError(f"{name} must be >= {lo}", key=name, expected=f">= {lo}", actual=val)
    check_draft_and_sampling(n_draft=n_draft, temp=temp, top_k=top_k, top_p=top_p)
    texts = list(prompts) if prompts is not None else ([prompt] if prompt is not None
                                                       else read_prompts(prompts_file))  # type: ignore[arg-type]
    if not texts:
        raise MtpscopeError("no prompts", key="prompts", expected=">= 1", actual=0)

    if not overwrite and (Path(out) / "manifest.json").exists():  # fail before loading anything
        raise TraceError("directory already holds a trace (pass --overwrite, or overwrite=True in Python, to replace it)",
                         path=out)
    # --overwrite of an existing trace: record next to it and swap it in only when the run completes
    swap = bool(overwrite) and _holds_trace(Path(out))
    write_to = Path(out).with_name(f"{Path(out).name}.partial-{os.getpid()}") if swap else Path(out)
    isolated = (runtime is None) if isolate is None else bool(isolate)
    if isolated and runtime is not None:
        raise MtpscopeError("a loaded runtime runs in this process; isolate=True needs runtime=None",
                            key="isolate", expected="runtime=None", actual="a MtpRuntime")
    models = _preflight(target, assistant) if preflight else unchecked_models(target, assistant)
    head = None
    models["centroids"] = None
    if centroids is not None:
        cp = Path(centroids)
        if cp.is_file() and cp.suffix != ".safetensors":  # a GGUF: read it once for both
            from mtpscope.inspector.gguf import open_gguf  # noqa: PLC0415

            with open_gguf(cp) as cf:
                head = head_from_gguf(cf, top_k=centroid_top_k)
                models["centroids"] = model_info(cf)
        else:
            head = load_centroid_head(cp, top_k=centroid_top_k)
            models["centroids"] = centroid_source_info(cp)

    need_capture = hidden != "off" or head is not None
    params = {"n_draft": n_draft, "max_tokens": max_tokens, "temp": temp, "seed": seed, "top_k": top_k,
              "top_p": top_p, "chat": chat, "n_gpu_layers": n_gpu_layers,
              "centroids": None if centroids is None else os.fspath(centroids),
              "centroid_top_k": None if head is None else head.top_k, "hidden": hidden, "n_top": n_top,
              "flush_every": flush_every, "compact": compact, "flash_attn": flash_attn, "n_threads": n_threads,
              "n_ctx": None, "greedy": temp <= 0, "isolated": isolated, "preflight": bool(preflight)}
    manifest = {
        "source": "record",
        "command": list(command) if command is not None else list(sys.argv),
        "params": params,
        "models": models,
        "prompts": [{"prompt_id": i, "text": t, "n_prompt_tokens": None} for i, t in enumerate(texts)],
        "centroids": None if head is None else {"n_centroids": head.n_centroids, "top_k": head.top_k,
                                                "source": head.source, "kind": head.kind},
    }
    cfg = {"target": os.fspath(target), "assistant": os.fspath(assistant), "n_gpu_layers": int(n_gpu_layers),
           "capture": need_capture, "flash_attn": flash_attn, "n_threads": n_threads, "prompts": texts,
           "chat": bool(chat), "n_draft": int(n_draft), "max_tokens": int(max_tokens), "temp": float(temp),
           "seed": int(seed), "top_k": int(top_k), "top_p": float(top_p), "trace": True}
    hd = None if hidden == "off" else hidden
    n_rounds = n_steps = n_drafted = n_accepted = n_gen = n_verify = 0
    outputs: list[tuple[int, ...]] = []
    trace_s = 0.0
    loop: WorkerDone | None = None
    w: TraceWriter | None = None
    src: RecordWorker | InProcessRounds | None = None
    bar = None
    blas = _SingleThreadBlas().__enter__()
    sigint = rt.deferred_sigint() if not isolated else contextlib.nullcontext()
    sigint.__enter__()
    t_start = c_start = 0.0
    try:
        src = RecordWorker(cfg, echo=echo_log) if isolated else InProcessRounds(runtime, cfg)
        info = src.hello()
        if head is not None:
            head.check_compatible(n_embd=info["n_embd"], n_vocab=info["n_vocab"], drafter=assistant)
        if need_capture and not info["capture"]:
            raise MtpscopeError("this runtime was loaded without the cb_eval capture; hidden states and the "
                                "centroid head need it", key="hidden", expected="capture=True", actual="False")
        params["n_ctx"] = info["n_ctx"]
        manifest["runtime"] = info["runtime"]
        for p, n in zip(manifest["prompts"], info["n_prompt_tokens"], strict=True):
            p["n_prompt_tokens"] = n
        t0 = time.perf_counter()
        w = TraceWriter(write_to, manifest, n_embd_backbone=None if hd is None else info["n_embd_backbone"],
                        n_embd=None if hd is None else info["n_embd"], hidden_dtype=hd,
                        centroids=head is not None, flush_every=flush_every, overwrite=overwrite or swap,
                        compact=compact)
        src.log_to(write_to / "llama.log")
        trace_s += time.perf_counter() - t0
        bar = _progress(progress, max_tokens * len(texts))
        t_start, c_start = time.perf_counter(), time.process_time()
        gen: list[int] = []
        for ev in src.events():
            if isinstance(ev, WorkerRound):
                pid, res = ev.prompt_id, ev.result
                t0 = time.perf_counter()
                if not gen:
                    gen.append(res.pending_token)
                gen.extend(res.emitted)
                steps = step_records(res, n_top=n_top, hidden=hidden, head=head)
                src.release()          # the records own copies of what they keep
                w.add_round(round_record(pid, res), steps)
                trace_s += time.perf_counter() - t0
                n_rounds += 1
                n_steps += len(steps)
                n_drafted += len(res.drafted)
                n_verify += 1 if res.drafted else 0
                n_accepted += res.n_accepted
                if on_round is not None:
                    on_round(pid, res)
                if bar is not None:
                    acc = f"acceptance rate {n_accepted / n_drafted:.3f}" if n_drafted else ""
                    bar.update(bar.task_ids[0], completed=pid * max_tokens + len(gen), acc=acc)
            elif isinstance(ev, PromptDone):
                if not gen:  # the prefill token ended generation (EOG or max_tokens 1): no round
                    gen = [int(ev.first_token)] if ev.first_token is not None else []
                outputs.append(tuple(gen))
                n_gen += len(gen)
                gen = []
                if bar is not None:
                    bar.update(bar.task_ids[0], completed=(ev.prompt_id + 1) * max_tokens)
            elif isinstance(ev, WorkerDone):
                loop = ev
        t0 = time.perf_counter()
        w.close()
        trace_s += time.perf_counter() - t0
    except RuntimeAbortedError as e:
        # llama.cpp died: keep every round received, say where it stopped and what llama.cpp said
        if w is None:      # before the trace existed (e.g. while loading): a trace of its manifest and log
            w = TraceWriter(write_to, manifest, n_embd_backbone=None, n_embd=None, hidden_dtype=None,
                            centroids=head is not None, overwrite=overwrite or swap, compact=False)
            src.log_to(write_to / "llama.log")
        src.close()        # the whole of llama.cpp's output is in llama.log now
        w.close(complete=False, aborted=e.aborted)
        e.trace = os.fspath(write_to)
        e.message = (f"{e.message} (trace {os.fspath(write_to)}: {n_rounds} rounds kept, marked incomplete; "
                     f"llama.cpp's output in llama.log there)")
        e.args = (e.one_line(),)
        _note_partial(e, swap, write_to, out)
        raise
    except BaseException as e:
        if src is not None and isolated:
            src.stop(grace=STOP_GRACE_S if isinstance(e, KeyboardInterrupt) else 0.0)
        if w is not None:
            w.close(complete=False)  # keep the finished rounds, marked incomplete
        _note_partial(e, swap, write_to, out)
        raise
    finally:
        if src is not None:
            src.close()
        sigint.__exit__(None, None, None)
        blas.__exit__()
        if bar is not None:
            bar.stop()
    secs, cpu_secs = time.perf_counter() - t_start, time.process_time() - c_start
    loop_cpu = loop.loop_cpu_seconds if (loop is not None and isolated) else 0.0
    if swap:
        _swap_in(write_to, Path(out))
    return RecordSummary(out=os.fspath(out), n_prompts=len(texts), n_rounds=n_rounds, n_steps=n_steps,
                         n_drafted=n_drafted, n_accepted=n_accepted,
                         acceptance_rate=(n_accepted / n_drafted) if n_drafted else None,
                         mean_acceptance_length=(1 + n_accepted / n_verify) if n_verify else None,
                         n_generated=n_gen, seconds=secs, cpu_seconds=cpu_secs + loop_cpu, trace_seconds=trace_s,
                         tokens_per_second=n_gen / secs if secs > 0 else 0.0,
                         outputs=tuple(outputs), isolated=isolated,
                         loop_seconds=loop.loop_seconds if loop is not None else secs,
                         loop_cpu_seconds=loop.loop_cpu_seconds if loop is not None else cpu_secs,
                         recorder_cpu_seconds=cpu_secs)


def _note_partial(e: BaseException, swap: bool, write_to: Path, out: Any) -> None:
    """With ``--overwrite`` of an existing trace: say where the unfinished new trace is."""
    if swap and write_to.exists():
        msg = (f"the run did not complete; the existing trace in {os.fspath(out)} is untouched and the "
               f"partial new trace is in {os.fspath(write_to)}")
        print(f"mtpscope: warning: {msg}", file=sys.stderr)
        e.add_note(msg)


def unchecked_models(target: str | os.PathLike[str], assistant: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest's model entries without the pre-flight checks (``record(preflight=False)``).

    Raises:
        GGUFFormatError / UnsupportedFileError / FileNotFoundError: a file our reader cannot read.
    """
    from mtpscope.inspector.gguf import open_gguf  # noqa: PLC0415

    out = {}
    for role, p in (("target", target), ("assistant", assistant)):
        if not Path(p).is_file():
            raise FileNotFoundError(2, "No such file or directory", os.fspath(p))
        with open_gguf(p) as f:
            out[role] = model_info(f)
    return out


class InProcessRounds:
    """The recording loop in this process, with the same interface as :class:`RecordWorker`
    (``hello`` / ``events`` / ``release`` / ``log_to`` / ``stop`` / ``close``): an already loaded
    :class:`MtpRuntime` (``runtime``), or one loaded from ``config`` and closed at :meth:`close`."""

    def __init__(self, runtime: MtpRuntime | None, config: dict[str, Any]) -> None:
        self.cfg = config
        self.own = runtime is None
        self.rtm = runtime if runtime is not None else MtpRuntime(
            config["target"], config["assistant"], n_gpu_layers=config["n_gpu_layers"],
            capture=config["capture"], flash_attn=config["flash_attn"], n_threads=config["n_threads"])
        self.toks = [self.rtm.prompt_tokens(t, chat=config["chat"]) for t in config["prompts"]]

    def hello(self) -> dict[str, Any]:
        r, c = self.rtm, self.cfg
        r.ensure_context(max(len(t) for t in self.toks) + c["max_tokens"] + c["n_draft"] + 1)
        return {"n_vocab": r.n_vocab, "n_embd_backbone": r.n_embd_backbone, "n_embd": r.n_embd, "n_ctx": r.n_ctx,
                "capture": r.capture is not None, "runtime": rt.runtime_info(c["n_gpu_layers"]),
                "n_prompt_tokens": [len(t) for t in self.toks]}

    def events(self) -> Iterator[Any]:
        from mtpscope.traces.record_worker import PromptDone, WorkerDone, WorkerRound  # noqa: PLC0415

        c = self.cfg
        t0, c0 = time.perf_counter(), time.process_time()
        for pid, tk in enumerate(self.toks):
            sampler = Sampler(temp=c["temp"], seed=c["seed"], top_k=c["top_k"], top_p=c["top_p"])
            try:
                for res in self.rtm.run(tk, n_draft=c["n_draft"], max_tokens=c["max_tokens"], sampler=sampler,
                                        trace=c["trace"]):
                    yield WorkerRound(pid, res)
            finally:
                sampler.close()
            yield PromptDone(pid, self.rtm.first_token)
        yield WorkerDone(time.perf_counter() - t0, time.process_time() - c0)

    def release(self) -> None:
        pass

    def log_to(self, path: Path) -> None:
        pass

    def stop(self, grace: float = 0.0) -> None:
        pass

    def close(self) -> None:
        if self.own:
            self.rtm.close()
