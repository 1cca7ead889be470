"""Replay recorded draft steps with the numpy reference drafter (issue 7), plus the llama.cpp side
of the parity checks.

* :func:`prefill` runs the **target** once in llama.cpp over a token sequence and captures, with
  ``cb_eval`` (:class:`traces.llama_runtime.NodeCapture`), what the drafter reads from it: the K/V of
  the two donor layers (llama.cpp's rule, ``llama-model.cpp``: layer ``n_layer - 2`` for sliding
  attention, ``n_layer - 1`` for full attention; nodes ``Kcur_pos-{il}`` after ``attn_k_norm`` + RoPE
  and ``Vcur_normed-{il}``, ``src/models/gemma4.cpp``), the post-final-norm hidden per token
  (``llama_get_embeddings_nextn_ith``) and the pre-norm hidden (node ``l_out-{n_layer-1}``).
  K/V of positions ``< p`` depend only on the tokens before ``p`` (causal), so one prefill over the
  accepted tokens of a run gives what the target's cache held at every round.
* :func:`live_mtp_run` runs a real greedy MTP loop in llama.cpp (target + ``LLAMA_CONTEXT_TYPE_MTP``
  drafter context; every draft step of a round at the pending position, as llama.cpp's
  ``common/speculative.cpp`` does for shared-memory Gemma 4 assistants) and returns each step's
  inputs and llama.cpp outputs (``h_nextn``, logits argmax) for parity tests.
* :func:`replay` recomputes every recorded draft step of a trace under option variants.

Shapes are numpy order throughout.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.errors import LayoutError, MtpscopeError, TraceError
from mtpscope.inspector.reference import DonorKV, ReferenceDrafter, StepOptions


@dataclass(frozen=True)
class TargetPrefill:
    """What one llama.cpp prefill of the target exposes to the drafter.

    Attributes:
        tokens: ``(n,)`` int token ids at positions ``0..n-1``.
        kv: ``{"sliding": DonorKV, "full": DonorKV}`` over all ``n`` positions (float32; llama.cpp's
            cache holds them as F16 by default: use ``StepOptions(kv_f16=True)`` to match).
        h_post: ``(n, n_embd_backbone)`` target hidden after the final norm, per position.
        h_pre: ``(n, n_embd_backbone)`` target hidden before the final norm (``l_out`` of the last layer).
        argmax: ``(n,)`` the target's greedy next token after each position.
        donor_layers: ``{"sliding": il, "full": il}`` target layers the K/V come from.
    """

    tokens: np.ndarray
    kv: dict[str, DonorKV]
    h_post: np.ndarray
    h_pre: np.ndarray
    argmax: np.ndarray
    donor_layers: dict[str, int] = field(default_factory=dict)

    def kv_before(self, p: int, f16: bool = False) -> dict[str, DonorKV]:
        """Donor K/V of positions ``< p``: what the target's cache holds when the pending token is at ``p``.

        ``f16``: rounded to F16 (llama.cpp's default cache type), computed once and cached.
        """
        src = self.kv
        if f16:
            cache = self.__dict__.setdefault("_kv16", {})
            if not cache:
                cache.update({k: v.rounded_f16() for k, v in self.kv.items()})
            src = cache
        return {k: v.upto(p) for k, v in src.items()}


def donor_layers(target_gguf: str | os.PathLike[str]) -> dict[str, int]:
    """``{"sliding": n_layer - 2, "full": n_layer - 1}`` as llama.cpp shares them (``llama-model.cpp``,
    the drafter's ``share`` rule), mapped through the target's own KV reuse when it has
    ``attention.shared_kv_layers``.

    Raises:
        LayoutError: the target lacks ``{arch}.block_count`` or the two layers are not of the types
            llama.cpp assumes (its rule would then pair the drafter with the wrong cache).
    """
    from mtpscope.inspector.gguf import open_gguf

    f = open_gguf(target_gguf)
    arch = f.architecture or "gemma4"
    n = f.get(arch + ".block_count")
    if n is None:
        raise LayoutError("missing key", path=os.fspath(target_gguf), key=arch + ".block_count")
    n = int(n)
    pat = f.get(arch + ".attention.sliding_window_pattern")
    swa = [bool(v) for v in pat.to_list()] if pat is not None else None
    if swa is not None and len(swa) == n and not (swa[n - 2] and not swa[n - 1]):
        raise LayoutError("llama.cpp's donor rule needs layer n_layer-2 sliding and n_layer-1 full",
                          path=os.fspath(target_gguf), key=arch + ".attention.sliding_window_pattern",
                          expected="[..., true, false]", actual=swa[-2:])
    donors = {"sliding": n - 2, "full": n - 1}
    # targets whose last layers reuse earlier caches (E2B / E4B): llama.cpp's ``reuse`` maps a layer
    # il >= n_layer_kv_from_start to n_layer_kv_from_start - 2 (sliding) or - 1 (full); the drafter then
    # reads that cache, and that layer's K/V nodes are the ones to capture
    n_shared = int(f.get(arch + ".attention.shared_kv_layers") or 0)
    n_kv = n - n_shared
    if 0 < n_shared and n_kv >= 2:
        donors = {kind: (n_kv - (2 if kind == "sliding" else 1)) if il >= n_kv else il
                  for kind, il in donors.items()}
    return donors


def prefill(target_gguf: str | os.PathLike[str], tokens: Sequence[int], *, n_batch: int = 256,
            n_threads: int | None = None, model: Any = None) -> TargetPrefill:
    """Run the target over ``tokens`` (positions ``0..n-1``) in llama.cpp and capture the donor K/V.

    Flash attention off. Runs in chunks of ``n_batch`` tokens. ``model``: an already loaded
    :class:`traces.llama_runtime.LlamaModel` of ``target_gguf`` (not closed here); else it is loaded.

    Raises:
        RuntimeUnavailableError: llama-cpp-python missing.
        TraceError: llama.cpp could not load / decode, or a captured node is missing.
    """
    from mtpscope.traces import llama_runtime as rt

    layers = donor_layers(target_gguf)
    toks = np.asarray(list(tokens), dtype=np.int64)
    n = len(toks)
    if n == 0:
        raise TraceError("nothing to prefill", key="tokens", expected=">= 1 token", actual=0)
    own_model = model is None
    if own_model:
        model = rt.LlamaModel(target_gguf)
    n_last = model.n_layer - 1
    names = [f"Kcur_pos-{il}" for il in layers.values()] + [f"Vcur_normed-{il}" for il in layers.values()]
    names.append(f"l_out-{n_last}")
    cap = rt.NodeCapture(names)
    n_ctx = max(256, ((n + 255) // 256) * 256)
    ctx = rt.LlamaContext(model, n_ctx=n_ctx, n_batch=n_batch, capture=cap, flash_attn=False,
                          n_threads=n_threads, nextn=True, masked=False)
    batch = rt.TokenBatch(n_batch)
    parts: dict[str, list[np.ndarray]] = {nm: [] for nm in names}
    h_post, argmax = [], []
    try:
        for s in range(0, n, n_batch):
            chunk = toks[s:s + n_batch]
            batch.set(chunk.tolist(), s, logits="all")
            cap.reset()
            ctx.decode(batch)
            for nm in names:
                arr = cap.get(nm)
                if arr is None:
                    raise TraceError("cb_eval did not capture a target node", path=target_gguf, key=nm)
                parts[nm].append(np.array(arr, dtype=np.float32).reshape(len(chunk), -1))
            for i in range(len(chunk)):
                h_post.append(np.array(ctx.nextn(i), dtype=np.float32))
                argmax.append(int(np.argmax(ctx.logits(i))))
    finally:
        batch.close()
        ctx.close()
        if own_model:
            model.close()
    kv = {}
    pos = np.arange(n)
    for kind, il in layers.items():
        k = np.concatenate(parts[f"Kcur_pos-{il}"])
        v = np.concatenate(parts[f"Vcur_normed-{il}"])
        kv[kind] = DonorKV(k=k, v=v, pos=pos)  # reshaped below once head dims are known
    return TargetPrefill(tokens=toks, kv=kv, h_post=np.stack(h_post), h_pre=np.concatenate(parts[f"l_out-{n_last}"]),
                         argmax=np.asarray(argmax), donor_layers=layers)


def shape_kv(pre: TargetPrefill, drafter: ReferenceDrafter) -> TargetPrefill:
    """``pre`` with its K/V reshaped to ``(n, n_head_kv, head_dim)`` per the drafter's hparams.

    Raises:
        LayoutError: the captured widths do not match the drafter's KV head dims.
    """
    hp = drafter.hp
    out = {}
    for kind, d in pre.kv.items():
        il = next((i for i, s in enumerate(hp.is_swa) if s == (kind == "sliding")), None)
        if il is None:
            continue
        hd = hp.head_dim[il]
        width = d.k.reshape(len(d.pos), -1).shape[1]
        if width % hd:
            raise LayoutError("target K width is not a multiple of the drafter's head dim", key=f"{kind} kv",
                              expected=f"multiple of {hd}", actual=width)
        out[kind] = DonorKV(k=d.k.reshape(len(d.pos), width // hd, hd), v=d.v.reshape(len(d.pos), width // hd, hd),
                            pos=d.pos)
    return TargetPrefill(tokens=pre.tokens, kv=out, h_post=pre.h_post, h_pre=pre.h_pre, argmax=pre.argmax,
                         donor_layers=pre.donor_layers)


@dataclass(frozen=True)
class LiveStep:
    """One draft step of a live llama.cpp MTP run (inputs and llama.cpp's outputs)."""

    round: int
    k: int              # 1-based draft position
    pos: int            # position fed (the pending token's, for every k)
    token: int          # token fed
    h: np.ndarray       # (n_embd_backbone,) hidden fed
    draft: int          # llama.cpp's argmax
    h_next: np.ndarray  # (n_embd_backbone,) llama.cpp's h_nextn
    logits_top2: tuple[float, float]


@dataclass(frozen=True)
class LiveRun:
    """A live greedy MTP run: accepted tokens (prompt included) and every draft step."""

    tokens: list[int]
    n_prompt: int
    steps: list[LiveStep]
    rounds: list[dict[str, Any]]


def live_mtp_run(target_gguf: str | os.PathLike[str], drafter_gguf: str | os.PathLike[str],
                 prompt: Sequence[int], *, n_rounds: int = 20, n_draft: int = 3,
                 n_threads: int | None = None) -> LiveRun:
    """A greedy MTP loop in llama.cpp (flash attention off), returning every draft step.

    Round: the target's KV holds positions ``< p``; the pending token sits at ``p``. Each of the
    ``n_draft`` steps feeds (token, h) at position ``p`` (``common/speculative.cpp``, shared memory);
    the first h is the target's post-norm hidden at ``p - 1``, later ones the previous ``h_nextn``.
    The target verifies ``[pending, d1..dK]``; the longest matching prefix is kept and rejected cells
    are removed with ``llama_memory_seq_rm``.

    Raises:
        RuntimeUnavailableError / TraceError: as :mod:`traces.llama_runtime`.
    """
    from mtpscope.traces import llama_runtime as rt

    tm = rt.LlamaModel(target_gguf)
    dm = rt.LlamaModel(drafter_gguf)
    n_ctx = 512
    while n_ctx < len(prompt) + n_rounds * (n_draft + 1) + 8:
        n_ctx *= 2
    tctx = rt.LlamaContext(tm, n_ctx=n_ctx, n_batch=max(64, len(prompt)), flash_attn=False,
                           n_threads=n_threads, nextn=True, masked=False)
    dctx = rt.LlamaContext(dm, n_ctx=n_ctx, n_batch=8, mtp_of=tctx, flash_attn=False,
                           n_threads=n_threads, nextn=True, masked=True)
    tb = rt.TokenBatch(max(64, len(prompt)))
    db = rt.DraftBatch(dm.n_embd_inp)
    steps: list[LiveStep] = []
    rounds: list[dict[str, Any]] = []
    tokens = list(prompt)
    try:
        tb.set(list(prompt), 0, logits="all")
        tctx.decode(tb)
        h = np.array(tctx.nextn(len(prompt) - 1), dtype=np.float32)
        pending = int(np.argmax(tctx.logits(len(prompt) - 1)))
        for r in range(n_rounds):
            p = len(tokens)
            tok, hh, drafts = pending, h, []
            for k in range(1, n_draft + 1):
                db.set(tok, p, hh)
                dctx.decode(db)
                lg = np.array(dctx.logits(0), dtype=np.float32)
                top2 = np.sort(lg)[-2:]
                d = int(np.argmax(lg))
                hn = np.array(dctx.nextn(0), dtype=np.float32)
                steps.append(LiveStep(r, k, p, tok, hh.copy(), d, hn, (float(top2[1]), float(top2[0]))))
                drafts.append(d)
                tok, hh = d, hn
            verify = [pending] + drafts
            tb.set(verify, p, logits="all")
            tctx.decode(tb)
            tgt = [int(np.argmax(tctx.logits(i))) for i in range(len(verify))]
            n_acc = 0
            while n_acc < n_draft and drafts[n_acc] == tgt[n_acc]:
                n_acc += 1
            keep = [pending] + drafts[:n_acc]
            h = np.array(tctx.nextn(n_acc), dtype=np.float32)
            tokens += keep
            tctx.seq_rm(p + len(keep), -1)
            rounds.append({"round": r, "pos": p, "pending": pending, "drafted": drafts, "target": tgt,
                           "n_accepted": n_acc})
            pending = tgt[n_acc]
    finally:
        db.close()
        tb.close()
        dctx.close()
        tctx.close()
        dm.close()
        tm.close()
    return LiveRun(tokens=tokens, n_prompt=len(prompt), steps=steps, rounds=rounds)




# --------------------------------------------------------------------------------------------------
# replay of a recorded trace

#: Options matching how ``mtpscope record`` drafts on CPU with upstream llama.cpp: dense head, the
#: pending position, post-norm hidden, F16 KV cache, ggml's F16 GELU table.
BASELINE_CPU = StepOptions(position="p", head="dense", hidden="postnorm", kv_f16=True, gelu="ggml-f16")
#: On a GPU build the GELU is computed in F32 (no table).
BASELINE_GPU = StepOptions(position="p", head="dense", hidden="postnorm", kv_f16=True, gelu="tanh")


def baseline_for(manifest: dict[str, Any]) -> StepOptions:
    """The baseline options for a recorded trace: :data:`BASELINE_GPU` when its drafter ran on a GPU
    (``runtime.device`` names one and ``params.n_gpu_layers`` != 0), else :data:`BASELINE_CPU`.

    ``n_gpu_layers`` alone does not tell: the recorder's default is -1 (offload all), which a CPU-only
    build ignores; its manifest then says ``device: "cpu"`` and the CPU's F16 GELU table applies.
    """
    params = manifest.get("params") or {}
    device = (manifest.get("runtime") or {}).get("device")
    ngl = params.get("n_gpu_layers")
    offloads = not isinstance(ngl, int) or isinstance(ngl, bool) or ngl != 0  # unknown: trust the device
    on_gpu = isinstance(device, str) and device.lower() != "cpu" and offloads
    return BASELINE_GPU if on_gpu else BASELINE_CPU


def parse_variant(spec: str, base: StepOptions) -> StepOptions:
    """``"position=p-1,head=centroid"`` applied on top of ``base``.

    Raises:
        ReferenceDrafterError: unknown option or value.
    """
    opts = base
    for part in spec.split(","):
        if part.strip():
            opts = opts.with_variant(part)
    return opts


def _options_text(o: StepOptions, base: StepOptions) -> str:
    diff = [f"{k}={getattr(o, k)}" for k in o.__dataclass_fields__ if getattr(o, k) != getattr(base, k)]
    return ",".join(diff) or "-"


@dataclass
class ReplayResult:
    """Outcome of :func:`replay`.

    Attributes:
        trace: the trace directory.
        variants: ``{name: StepOptions}`` in order (``"baseline"`` first).
        steps: one row per recorded draft step: ``prompt_id``, ``round``, ``k``, ``pos``, ``recorded``
            (the recorded draft), ``truth`` (the token the target emitted at that position, or -1 when
            unknown), and per variant ``draft[NAME]`` and ``accepted[NAME]`` (would-be acceptance).
        rounds: one row per round: ``prompt_id``, ``round``, ``pos``, ``n_draft``, ``n_accepted``
            (recorded) and per variant ``n_accepted[NAME]``.
        baseline: the options of the baseline variant.
        out: where summary.json / steps.parquet went, if anywhere.
        notes: diagnostics (e.g. the largest difference between recorded and recomputed h_next).
        h_next_rel_err: per baseline step with a recorded h_next: ``|h_next - recorded| / |recorded|``.
    """

    trace: str
    variants: dict[str, StepOptions]
    steps: Any
    rounds: Any
    baseline: StepOptions
    out: str | None = None
    notes: list[str] = field(default_factory=list)
    h_next_rel_err: list[float] = field(default_factory=list)
    variant_traces: dict[str, str] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """JSON-able: per variant ``acceptance_rate`` (accepted / drafted), ``mean_acceptance_length``
        (1 + accepted / rounds that drafted; both as :func:`traces.metrics.totals` defines them),
        ``agreement`` (share of steps whose recomputed draft equals the recorded one), ``options``;
        and the recorded run's rates."""
        from mtpscope.traces.metrics import totals

        r = self.rounds
        n_rounds = len(r)

        def rates(accepted_column: str) -> tuple[float, float]:
            t = totals(r[["n_draft", accepted_column]].rename(columns={accepted_column: "n_accepted"}))
            return t["acceptance_rate"], t["mean_acceptance_length"]

        rec_ar, rec_mal = rates("n_accepted")
        out: dict[str, Any] = {"trace": self.trace, "n_rounds": n_rounds, "n_steps": len(self.steps),
                               "recorded": {"acceptance_rate": rec_ar, "mean_acceptance_length": rec_mal},
                               "baseline": _options_text(self.baseline, StepOptions()), "variants": {},
                               "out": self.out, "notes": list(self.notes),
                               "baseline_h_next_rel_err_max": max(self.h_next_rel_err) if self.h_next_rel_err else None,
                               "variant_traces": dict(self.variant_traces)}
        for name, o in self.variants.items():
            ar, mal = rates(f"n_accepted[{name}]")
            agree = float((self.steps[f"draft[{name}]"] == self.steps["recorded"]).mean()) if len(self.steps) else float("nan")
            out["variants"][name] = {"options": _options_text(o, self.baseline), "acceptance_rate": ar,
                                     "mean_acceptance_length": mal, "agreement": agree}
        return out

    def disagreements(self, limit: int | None = None) -> Any:
        """Steps where the recorded draft and the variants' drafts are not all equal."""
        cols = [f"draft[{n}]" for n in self.variants]
        s = self.steps
        same = np.ones(len(s), dtype=bool)
        for c in cols:
            same &= (s[c] == s["recorded"]).to_numpy()
        d = s.loc[~same, ["prompt_id", "round", "k", "recorded", "truth", *cols]]
        return d if limit is None else d.head(limit)


def _prompt_tokens(model: Any, text: str, chat: bool) -> list[int]:
    # the same rule as traces.recorder.MtpRuntime.prompt_tokens
    if chat:
        return model.tokenize(model.apply_chat_template(text), add_special=False, parse_special=True)
    return model.tokenize(text, add_special=True, parse_special=False)


def _model_path(manifest: dict[str, Any], role: str, given: Any, trace: Path) -> Path | None:
    if given is not None:
        return Path(given)
    m = (manifest.get("models") or {}).get(role)
    if not m or not m.get("path"):
        return None
    p = Path(m["path"])
    return p if p.is_absolute() or p.exists() else (trace / p)


def _model_mismatch_notes(man: dict[str, Any], used: dict[str, Path]) -> list[str]:
    """A note for each model whose header (sha256 of bytes [0, data_offset)) differs from the one
    the trace was recorded with: the replay then answers for another model than the recorded run."""
    from mtpscope.inspector.gguf import open_gguf
    from mtpscope.traces.recorder import model_info

    notes = []
    for role, path in used.items():
        entry = (man.get("models") or {}).get(role)
        want = entry.get("header_sha256") if isinstance(entry, dict) else None
        if not want:
            continue
        with open_gguf(path) as f:
            got = model_info(f)["header_sha256"]
        if got != want:
            notes.append(f"the {role} {path} is not the file the trace was recorded with (header sha256 "
                         f"{got[:12]}… vs recorded {want[:12]}…): agreement and rates describe another model")
    return notes


def replay(trace: str | os.PathLike[str], *, variants: Sequence[str] = (), out: str | os.PathLike[str] | None = None,
           target: str | os.PathLike[str] | None = None, assistant: str | os.PathLike[str] | None = None,
           centroids: str | os.PathLike[str] | None = None, max_rounds: int | None = None,
           baseline: StepOptions | None = None, chunk: int = 32) -> ReplayResult:
    """Recompute every recorded draft step of a trace with the reference drafter under each variant.

    Per prompt, the accepted token sequence (prompt re-tokenized as the recorder did, then each round's
    pending token and accepted drafts) is prefilled once in llama.cpp (:func:`prefill`) to get the
    donor K/V and the target's hidden rows. Each round is then replayed at its recorded state: step 1
    feeds (pending token, target hidden at ``pos - 1``) at ``pos``, step k > 1 the previous draft and
    ``h_next``. A variant's draft k is *would-be accepted* when it and all earlier drafts of the round
    equal the tokens the target emitted at ``pos + 1 .. pos + k`` (exact for greedy traces: the greedy
    output does not depend on the drafts). Rounds are replayed independently (a changed acceptance
    would shift later rounds; that is not simulated).

    Args:
        trace: trace directory (``mtpscope record``).
        variants: specs applied on top of the baseline, e.g. ``"position=p-1"``, ``"head=centroid"``,
            ``"fill=min-1,head=centroid"``, ``"hidden=prenorm"``.
        out: folder to write ``summary.json`` and ``steps.parquet`` into.
        target / assistant / centroids: override the manifest's model paths.
        max_rounds: replay only the first N rounds (over all prompts).
        baseline: the baseline options (default: :func:`baseline_for` the manifest: CPU or GPU by the
            device that ran the drafter).
        chunk: rounds computed together (:meth:`ReferenceDrafter.step_batch`; memory ~ chunk x n_vocab x 4 B).

    Raises:
        TraceFormatError / TraceError: unreadable trace, missing model paths, token sequence that does
            not line up with the recorded positions.
        ReferenceDrafterError: a malformed variant.
    """

    from mtpscope import traces as tr
    from mtpscope.traces import llama_runtime as rt

    tpath = Path(trace)
    t = tr.open(tpath)
    man = t.manifest
    params = man.get("params") or {}
    if man.get("source") != "record":
        raise TraceError("replay needs a trace recorded by `mtpscope record` (prompt texts, model paths, "
                         "every round's drafts)", path=tpath, key="manifest.source", expected="record",
                         actual=man.get("source"))
    base = baseline or baseline_for(man)
    vmap: dict[str, StepOptions] = {"baseline": base}
    for spec in variants:
        vmap[spec] = parse_variant(spec, base)
    tg = _model_path(man, "target", target, tpath)
    dr = _model_path(man, "assistant", assistant, tpath)
    if tg is None or dr is None:
        raise TraceError("the trace does not name its models; pass --target and --assistant", path=tpath,
                         key="manifest.models")
    cen = _model_path(man, "centroids", centroids, tpath)
    if cen is None and params.get("centroids"):
        cen = Path(params["centroids"])
    need_centroids = any(o.head == "centroid" for o in vmap.values())
    if need_centroids and cen is None:
        raise TraceError("a head=centroid variant needs a centroid head source; pass --centroids", path=tpath,
                         key="centroids")
    ref = ReferenceDrafter.from_gguf(dr, tg, centroids=cen if need_centroids else None)
    rounds = t.rounds.sort_values(["prompt_id", "round"]).reset_index(drop=True)
    if max_rounds is not None:
        if int(max_rounds) < 1:
            raise TraceError("max_rounds must be positive", key="max_rounds", expected=">= 1", actual=max_rounds)
        rounds = rounds.head(int(max_rounds))
    prompts = {int(p["prompt_id"]): p for p in man.get("prompts") or []}
    chat = bool(params.get("chat", False))
    model = rt.LlamaModel(tg)
    try:
        prompt_toks = {pid: _prompt_tokens(model, prompts[pid].get("text") or "", chat) for pid in prompts}
        res = _replay_prompts(tpath, t, man, vmap, base, ref, tg, model, rounds, prompts, prompt_toks, out, chunk)
        res.notes.extend(_model_mismatch_notes(man, {"target": tg, "assistant": dr}))
        return res
    finally:
        model.close()


def _replay_prompts(tpath: Path, t: Any, man: dict[str, Any], vmap: dict[str, StepOptions], base: StepOptions,
                    ref: ReferenceDrafter, tg: Path, model: Any, rounds: Any, prompts: dict[int, Any],
                    prompt_toks: dict[int, list[int]], out: Any, chunk: int) -> ReplayResult:
    import pandas as pd

    params = man.get("params") or {}
    rec_hnext: dict[tuple[int, int, int], np.ndarray] = {}
    dims = man.get("dims") or {}
    if dims.get("hidden_dtype"):
        try:
            keys = t.columns("steps", ["prompt_id", "round", "k"])
            hn = t.hidden("h_next")
            rec_hnext = {(int(a), int(b), int(c)): hn[i]
                         for i, (a, b, c) in enumerate(keys.itertuples(index=False, name=None))}
        except MtpscopeError:
            rec_hnext = {}
    h_errs: list[float] = []
    variant_records: dict[str, list[tuple[Any, list[Any]]]] = {}
    step_rows: list[dict[str, Any]] = []
    round_rows: list[dict[str, Any]] = []
    notes: list[str] = []
    if params.get("flash_attn"):
        notes.append("recorded with flash attention on: llama.cpp's numerics then differ from the baseline's "
                     "emulation (non-FA, F16 cache), near-tie drafts may disagree")
    if not params.get("greedy", True):
        notes.append("sampled trace (temp > 0): would-be acceptance compares drafts with the realized "
                     "continuation, which a different draft could have changed; exact only for greedy traces")
    for pid, grp in rounds.groupby("prompt_id", sort=True):
        pid = int(pid)
        if pid not in prompt_toks:
            raise TraceError("round refers to a prompt the manifest does not list", path=tpath, key="prompt_id",
                             actual=pid)
        seq = list(prompt_toks[pid])
        n_prompt = prompts[pid].get("n_prompt_tokens")
        if n_prompt is not None and len(seq) != int(n_prompt):
            raise TraceError("re-tokenized prompt length differs from the recorded one", path=tpath,
                             key=f"prompts[{pid}].n_prompt_tokens", expected=n_prompt, actual=len(seq))
        recs = list(grp.itertuples(index=False))
        for r in recs:
            if int(r.pos) != len(seq):
                raise TraceError("recorded positions do not line up with the accepted tokens", path=tpath,
                                 key=f"rounds[prompt {pid}, round {r.round}].pos", expected=len(seq), actual=int(r.pos))
            seq += [int(r.pending_token)] + [int(x) for x in list(r.drafted)[: int(r.n_accepted)]]
        last_emitted = list(recs[-1].emitted) if recs and recs[-1].emitted is not None else []
        truth_seq = seq + ([int(last_emitted[-1])] if last_emitted else [])
        pre = shape_kv(prefill(tg, seq, model=model), ref)
        P = np.array([int(r.pos) for r in recs], dtype=np.int64)
        recorded_all = [[int(x) for x in list(r.drafted)] for r in recs]
        truth_all = [[truth_seq[p + k] if p + k < len(truth_seq) else -1 for k in range(1, len(rec) + 1)]
                     for p, rec in zip(P.tolist(), recorded_all, strict=True)]
        # every variant: all rounds of the prompt in chunks, step k of all rows of a chunk at once
        drafts_v: dict[str, list[list[int]]] = {}
        steps_v: dict[str, list[list[tuple[Any, ...]]]] = {}
        for name, o in vmap.items():
            later = replace(o, hidden="postnorm")  # steps k > 1 feed the previous h_next either way
            kv_all = pre.kv_before(int(P.max()) if len(P) else 0, f16=o.kv_f16)
            drafts = [[] for _ in recs]
            summ: list[list[tuple[Any, ...]]] = [[] for _ in recs]
            for c0 in range(0, len(recs), chunk):
                rows = np.arange(c0, min(c0 + chunk, len(recs)))
                tok = np.array([int(recs[i].pending_token) for i in rows], dtype=np.int64)
                h = pre.h_post[P[rows] - 1]
                hpre = pre.h_pre[P[rows] - 1]
                kmax = max(len(recorded_all[i]) for i in rows)
                for k in range(kmax):
                    act = np.array([j for j, i in enumerate(rows) if k < len(recorded_all[i])], dtype=np.int64)
                    res = ref.step_batch(tok[act], h[act], P[rows[act]], kv_all, o if k == 0 else later,
                                         kv_limit=P[rows[act]], h_prenorm=hpre[act] if k == 0 else None)
                    for j, rr in zip(act.tolist(), res, strict=True):
                        i = int(rows[j])
                        drafts[i].append(rr.token)
                        tok[j] = rr.token
                        h[j] = rr.h_next
                        if out is not None:
                            summ[i].append(_step_summary(rr.logits, rr.token, truth_all[i][k]))
                        if name == "baseline":
                            want = rec_hnext.get((pid, int(recs[i].round), k + 1))
                            if want is not None and np.all(np.isfinite(want)) and np.linalg.norm(want) > 0:
                                h_errs.append(float(np.linalg.norm(rr.h_next - want) / np.linalg.norm(want)))
            drafts_v[name], steps_v[name] = drafts, summ
        for i, r in enumerate(recs):
            p = int(P[i])
            recorded, truth = recorded_all[i], truth_all[i]
            rrow: dict[str, Any] = {"prompt_id": pid, "round": int(r.round), "pos": p, "n_draft": len(recorded),
                                    "n_accepted": int(r.n_accepted)}
            for name in vmap:
                d = drafts_v[name][i]
                n_acc = 0
                while n_acc < len(d) and d[n_acc] == truth[n_acc]:
                    n_acc += 1
                rrow[f"n_accepted[{name}]"] = n_acc
                if out is not None:
                    variant_records.setdefault(name, []).append(
                        _variant_records(pid, r, p, d, steps_v[name][i], n_acc, truth, truth_seq))
            round_rows.append(rrow)
            for k in range(len(recorded)):
                row: dict[str, Any] = {"prompt_id": pid, "round": int(r.round), "k": k + 1, "pos": p,
                                       "recorded": recorded[k], "truth": truth[k]}
                for name in vmap:
                    row[f"draft[{name}]"] = drafts_v[name][i][k]
                    row[f"accepted[{name}]"] = k < rrow[f"n_accepted[{name}]"]
                step_rows.append(row)
    steps_df = pd.DataFrame(step_rows)
    rounds_df = pd.DataFrame(round_rows)
    if steps_df.empty:
        steps_df = pd.DataFrame(columns=["prompt_id", "round", "k", "pos", "recorded", "truth",
                                         *[f"draft[{n}]" for n in vmap], *[f"accepted[{n}]" for n in vmap]])
        rounds_df = pd.DataFrame(columns=["prompt_id", "round", "pos", "n_draft", "n_accepted",
                                          *[f"n_accepted[{n}]" for n in vmap]])
    if h_errs:
        notes.append(f"baseline h_next vs recorded h_next ({dims.get('hidden_dtype')}): max relative error "
                     f"{max(h_errs):.3g} over {len(h_errs)} steps")
    res = ReplayResult(trace=os.fspath(tpath), variants=vmap, steps=steps_df, rounds=rounds_df, baseline=base,
                       notes=notes, h_next_rel_err=h_errs)
    if out is not None:
        od = Path(out)
        od.mkdir(parents=True, exist_ok=True)
        res.out = os.fspath(od)
        steps_df.to_parquet(od / "steps.parquet", index=False)
        rounds_df.to_parquet(od / "rounds.parquet", index=False)
        paths = _write_variant_traces(od, tpath, man, vmap, base, variant_records)
        res.notes.append("variant traces (open one as the second trace on the Compare page): "
                         + ", ".join(f"{n} -> {p}" for n, p in paths.items()))
        res.variant_traces = {n: os.fspath(p) for n, p in paths.items()}
        (od / "summary.json").write_text(json.dumps(res.summary(), indent=2, default=float))
    return res


def _rank(logits: np.ndarray, token: int) -> int:
    return int(np.count_nonzero(logits > logits[token]))


def _step_summary(lg: np.ndarray, d: int, truth: int) -> tuple[Any, ...]:
    """(logit of the draft, its rank, top-10 ids, their logits, rank of the true token or None)."""
    part = np.argpartition(-lg, min(10, lg.size - 1))[:10]
    top = part[np.lexsort((part, -lg[part]))]            # best first, ties by id
    return (float(lg[d]), _rank(lg, d), tuple(int(i) for i in top), tuple(float(lg[i]) for i in top),
            None if truth < 0 else _rank(lg, truth))


def _variant_records(pid: int, r: Any, p: int, drafts: list[int], summ: list[tuple[Any, ...]], n_acc: int,
                     truth: list[int], truth_seq: list[int]) -> tuple[Any, list[Any]]:
    """One round of a variant as trace records: would-be acceptance, the true continuation as target."""
    from mtpscope.traces.records import RoundRecord, StepRecord

    # verify row i predicts position p + i + 1: known for rows 0..n_acc (the accepted prefix matches the
    # real sequence); rows after the first mismatch would be conditioned on rejected drafts: unknown
    known: list[int | None] = [None if t < 0 else int(t) for t in truth]
    if n_acc < len(drafts):
        target = tuple(known[: n_acc + 1]) + (None,) * (len(drafts) - n_acc)
    else:
        after = p + len(drafts) + 1
        target = tuple(known) + (truth_seq[after] if after < len(truth_seq) else None,)
    corr = target[n_acc]
    emitted = tuple(drafts[:n_acc]) + ((int(corr),) if corr is not None else ())
    rr = RoundRecord(prompt_id=pid, round=int(r.round), pos=p, pending_token=int(r.pending_token),
                     n_draft=len(drafts), drafted=tuple(drafts), n_accepted=n_acc, target=target,
                     emitted=emitted if corr is not None else None)
    steps = []
    for k, (d, (logit, rank, top_ids, top_logits, truth_rank)) in enumerate(zip(drafts, summ, strict=True), start=1):
        visible_row = k - 1 <= n_acc                          # rows after a mismatch: unknown target
        steps.append(StepRecord(k=k, token=int(d), logit=logit, rank=rank, top_ids=top_ids, top_logits=top_logits,
                                target_token=known[k - 1] if visible_row else None,
                                target_rank=truth_rank if visible_row else None, accepted=k <= n_acc))
    return rr, steps


def _slug(name: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "variant"


def _write_variant_traces(od: Path, tpath: Path, man: dict[str, Any], vmap: dict[str, StepOptions],
                          base: StepOptions, recs: dict[str, list[tuple[Any, list[Any]]]]) -> dict[str, Path]:
    """One trace directory per variant (source ``replay``) under ``od/traces/``, readable by
    ``traces.open`` and the app like any recorded trace."""
    from mtpscope.traces.store import TraceWriter

    paths: dict[str, Path] = {}
    for name, o in vmap.items():
        d = od / "traces" / _slug(name)
        m = {"source": "replay", "command": list(man.get("command") or []),
             "params": {**(man.get("params") or {}), "replay_of": os.fspath(tpath), "variant": name,
                        "options": _options_text(o, StepOptions()), "baseline": _options_text(base, StepOptions())},
             "models": man.get("models"), "runtime": man.get("runtime"), "prompts": man.get("prompts") or [],
             "centroids": None}
        with TraceWriter(d, m, n_embd_backbone=None, n_embd=None, hidden_dtype=None, centroids=False,
                         overwrite=True, background=False) as w:
            for rr, steps in recs.get(name, []):
                w.add_round(rr, steps)
        paths[name] = d
    return paths


__all__ = ["BASELINE_CPU", "BASELINE_GPU", "LiveRun", "LiveStep", "ReplayResult", "TargetPrefill", "baseline_for",
           "donor_layers", "live_mtp_run", "parse_variant", "prefill", "replay", "shape_kv"]
