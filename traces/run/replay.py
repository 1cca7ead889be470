"""Replay a recorded trace's draft steps with the numpy reference drafter under option variants
(issue 7): :func:`replay` -> :class:`ReplayResult` and its output folder (:mod:`traces.run.replay_folder`: the
folder's layout, checked before a replay writes into it, and read back by ``read_replay``).

Per prompt the accepted token sequence is prefilled once in llama.cpp
(:func:`traces.run.target_prefill.prefill`), then every recorded round is recomputed by
:class:`inspector.reference.ReferenceDrafter` under each variant (:func:`parse_variant` on top of the
baseline, :data:`BASELINE_CPU` / :data:`BASELINE_GPU`); a step is summarized like a recorded one
(:func:`traces.run.step_analysis.summarize_logits`).

Output folder (``mtpscope replay --out DIR``): written here, laid out and read back by
:mod:`traces.run.replay_folder` (the app's Compare page).

Shapes are numpy order throughout.

Imports: numpy, pandas (inside functions), mtpscope.errors, inspector.reference,
traces.run.step_analysis, traces.run.replay_summary (the summary's records), traces.run.replay_folder,
traces.store.records, traces.store.layout,
traces.analysis.metrics, traces.store; and, inside :func:`replay` only,
traces.run.llama.model, traces.run.mtp_runtime, traces.run.preflight, traces.run.target_prefill, inspector.gguf and
traces.run.quantize (the drafter's quantization) (so that reading a replay folder never touches llama.cpp).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.errors import MtpscopeError, TraceError, TraceFormatError
from mtpscope.inspector.reference import ReferenceDrafter, ReferenceDrafterError, StepOptions
from mtpscope.traces.run.numerics import NEAR_TIE_FACTOR, numerics_check, numerics_options
from mtpscope.traces.run.replay_folder import (
    ROUNDS_FILE,
    STEPS_FILE,
    SUMMARY_FILE,
    TRACES_DIR,
    check_replay_out,
    read_replay,
)
from mtpscope.traces.run.replay_summary import ReplayRates, ReplaySummary, VariantSummary
from mtpscope.traces.run.step_analysis import LogitSummary, draft_logit, summarize_logits
from mtpscope.traces.store.layout import MANIFEST

#: drafter candidates kept per replayed step (as ``record``'s default ``n_top``)
REPLAY_N_TOP = 10


#: Options matching how ``mtpscope record`` drafts on CPU with upstream llama.cpp: dense head, the
#: pending position, post-norm hidden, F16 KV cache, ggml's F16 GELU table, and the activations of every
#: matrix product converted to the weight type's ``vec_dot_type`` (F16 for F16 weights, 8-bit blocks for
#: quantized ones: ``StepOptions.act_quant``), as every x86 kernel path of ggml-cpu does.
BASELINE_CPU = StepOptions(position="p", head="dense", hidden="postnorm", kv_f16=True, gelu="ggml-f16",
                           act_quant=True)
#: On a GPU build the GELU is computed in F32 (no table); CUDA's own activation rounding (MMVQ's Q8_1) is
#: not emulated: the numerical tolerance (:func:`numerics_options`) covers it.
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
    opts, seen = base, set()
    for part in spec.split(","):
        if part.strip():
            name = part.partition("=")[0].strip()
            if name in seen:
                raise ReferenceDrafterError(f"variant sets {name} twice", key=spec, expected=f"one {name}=VALUE",
                                            actual=spec)
            seen.add(name)
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
            unknown), per variant ``draft[NAME]`` and ``accepted[NAME]`` (would-be acceptance), and for the
            baseline the numerics (:func:`numerics_check`): ``gap[baseline]`` (the reference's logit of its draft
            minus its logit of the recorded draft, >= 0), ``tol[baseline]`` (``NEAR_TIE_FACTOR * E``, ``E`` the
            step's numerical effect, logits) and ``margin[baseline]`` (its top-2 logit gap).
        rounds: one row per round: ``prompt_id``, ``round``, ``pos``, ``n_draft``, ``n_accepted``
            (recorded) and per variant ``n_accepted[NAME]``.
        baseline: the options of the baseline variant.
        out: where summary.json / steps.parquet went, if anywhere.
        notes: diagnostics (e.g. the largest difference between recorded and recomputed h_next; why a
            quantized drafter's agreement is below 1.0).
        h_next_rel_err: per baseline step with a recorded h_next: ``|h_next - recorded| / |recorded|``.
        model_mismatch: one line per model replayed that is not the file the trace was recorded with (header
            sha256 against the manifest's ``models``): the figures then describe another model.
        drafter_weights: the replayed drafter's quantization (:func:`traces.run.quantize.weight_types`:
            ``matrices`` {ggml type: count}, ``type`` llama.cpp's file type name or None, ``quantized``).
        warnings: the trace reader's warnings (parts missing or unreadable, skipped: the replay covers the rest).
    """

    trace: str
    variants: dict[str, StepOptions]
    steps: Any
    rounds: Any
    baseline: StepOptions
    out: str | None = None
    notes: list[str] = field(default_factory=list)
    h_next_rel_err: list[float] = field(default_factory=list)
    model_mismatch: list[str] = field(default_factory=list)
    variant_traces: dict[str, str] = field(default_factory=dict)
    drafter_weights: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> ReplaySummary:
        """The :class:`ReplaySummary`: per variant ``acceptance_rate`` (accepted / drafted), ``mean_acceptance_length``
        (1 + accepted / rounds that drafted; both as :func:`traces.analysis.metrics.totals` defines them),
        ``agreement`` (share of steps whose recomputed draft equals the recorded one), ``options``;
        the recorded run's rates; and ``indistinguishable``: pairs of variants that draft the same token
        at every replayed step (this trace cannot tell them apart, :func:`indistinguishable`)."""
        from mtpscope.traces.analysis.metrics import totals

        r = self.rounds

        def rates(accepted_column: str) -> tuple[float, float]:
            t = totals(r[["n_draft", accepted_column]].rename(columns={accepted_column: "n_accepted"}))
            return t.acceptance_rate, t.mean_acceptance_length

        variants = {}
        for name, o in self.variants.items():
            ar, mal = rates(f"n_accepted[{name}]")
            agree = float((self.steps[f"draft[{name}]"] == self.steps["recorded"]).mean()) if len(self.steps) else float("nan")
            variants[name] = VariantSummary(options=_options_text(o, self.baseline), acceptance_rate=ar,
                                            mean_acceptance_length=mal, agreement=agree)
        return ReplaySummary(trace=self.trace, n_rounds=len(r), n_steps=len(self.steps),
                             recorded=ReplayRates(*rates("n_accepted")),
                             baseline=_options_text(self.baseline, StepOptions()), variants=variants,
                             out=self.out, notes=tuple(self.notes), model_mismatch=tuple(self.model_mismatch),
                             baseline_h_next_rel_err_max=max(self.h_next_rel_err) if self.h_next_rel_err else None,
                             variant_traces=dict(self.variant_traces), drafter_weights=dict(self.drafter_weights),
                             indistinguishable=tuple(indistinguishable(self.steps, list(self.variants))),
                             numerics=numerics_check(self.steps))

    def disagreements(self, limit: int | None = None) -> Any:
        """Steps where the recorded draft and the variants' drafts are not all equal."""
        cols = [f"draft[{n}]" for n in self.variants]
        s = self.steps
        same = np.ones(len(s), dtype=bool)
        for c in cols:
            same &= (s[c] == s["recorded"]).to_numpy()
        d = s.loc[~same, ["prompt_id", "round", "k", "recorded", "truth", *cols]]
        return d if limit is None else d.head(limit)


def indistinguishable(steps: Any, names: Sequence[str]) -> list[tuple[str, str]]:
    """Pairs ``(a, b)`` of variants (in ``names`` order, ``a`` first) whose ``draft[NAME]`` columns are
    equal at every row of ``steps`` (a replay's steps): on this trace the two options make no
    difference to any draft. Empty when there are no steps."""
    if steps is None or len(steps) == 0:
        return []
    cols = {n: steps[f"draft[{n}]"].to_numpy() for n in names if f"draft[{n}]" in steps.columns}
    ns = list(cols)
    return [(a, b) for i, a in enumerate(ns) for b in ns[i + 1:] if bool((cols[a] == cols[b]).all())]


def _model_path(manifest: dict[str, Any], role: str, given: Any, trace: Path) -> Path | None:
    if given is not None:
        return Path(given)
    m = (manifest.get("models") or {}).get(role)
    if not m or not m.get("path"):
        return None
    p = Path(m["path"])
    return p if p.is_absolute() or p.exists() else (trace / p)


def replay(trace: str | os.PathLike[str], *, variants: Sequence[str] = (), out: str | os.PathLike[str] | None = None,
           target: str | os.PathLike[str] | None = None, assistant: str | os.PathLike[str] | None = None,
           centroids: str | os.PathLike[str] | None = None, max_rounds: int | None = None,
           baseline: StepOptions | None = None, chunk: int = 32, prompt_ids: Sequence[int] | None = None,
           rounds_per_prompt: int | None = None) -> ReplayResult:
    """Recompute every recorded draft step of a trace with the reference drafter under each variant.

    Per prompt, the accepted token sequence (prompt re-tokenized as the recorder did, then each round's
    pending token and accepted drafts) is prefilled once in llama.cpp (:func:`prefill`) to get the
    donor K/V and the target's hidden rows. Each round is then replayed at its recorded state: step 1
    feeds (pending token, target hidden at ``pos - 1``) at ``pos``, step k > 1 the previous draft and
    ``h_next``. A variant's draft k is *would-be accepted* when it and all earlier drafts of the round
    equal the tokens the target emitted at ``pos + 1 .. pos + k`` (exact for greedy traces: the greedy
    output does not depend on the drafts), under llama.cpp's rule as the recorder counts it
    (:func:`traces.run.mtp_runtime.accepted_prefix`). Rounds are replayed independently (a changed acceptance
    would shift later rounds; that is not simulated).

    Args:
        trace: trace directory (``mtpscope record``).
        variants: specs applied on top of the baseline, e.g. ``"position=p-1"``, ``"head=centroid"``,
            ``"fill=min-1,head=centroid"``, ``"hidden=prenorm"``.
        out: folder to write ``summary.json`` and ``steps.parquet`` into.
        target / assistant / centroids: override the manifest's model paths.
        max_rounds: replay only the first N rounds (over all prompts, after the two selections below).
        prompt_ids: replay only these prompts (prompt_id values; unknown ones are ignored).
        rounds_per_prompt: replay only each prompt's first N rounds (a sample spread over the prompts: the
            prefill then covers only those rounds' tokens).
        baseline: the baseline options (default: :func:`baseline_for` the manifest: CPU or GPU by the
            device that ran the drafter).
        chunk: rounds computed together (:meth:`ReferenceDrafter.step_batch`; memory ~ chunk x n_vocab x 4 B).

    Raises:
        TraceError: ``out`` holds something other than a replay (:func:`traces.run.replay_folder.check_replay_out`).
        TraceFormatError / TraceError: unreadable trace, missing model paths, token sequence that does
            not line up with the recorded positions; the drafter replayed computes non-finite logits
            (:func:`traces.run.step_analysis.draft_logit`: its weights hold NaN / Inf).
        ReferenceDrafterError: a malformed variant.
    """

    from mtpscope.traces.run.llama.model import LlamaModel
    from mtpscope.traces.store.reader import open_trace

    if out is not None:
        check_replay_out(out)     # before any work: a folder holding something else is refused
    tpath = Path(trace)
    t = open_trace(tpath)
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
    if prompt_ids is not None:
        rounds = rounds[rounds["prompt_id"].isin([int(p) for p in prompt_ids])].reset_index(drop=True)
    if rounds_per_prompt is not None:
        if int(rounds_per_prompt) < 1:
            raise TraceError("rounds_per_prompt must be positive", key="rounds_per_prompt", expected=">= 1",
                             actual=rounds_per_prompt)
        rounds = rounds.groupby("prompt_id", sort=True).head(int(rounds_per_prompt)).reset_index(drop=True)
    if max_rounds is not None:
        if int(max_rounds) < 1:
            raise TraceError("max_rounds must be positive", key="max_rounds", expected=">= 1", actual=max_rounds)
        rounds = rounds.head(int(max_rounds))
    prompts = {int(p["prompt_id"]): p for p in man.get("prompts") or []}
    chat = bool(params.get("chat", False))
    model = LlamaModel(tg)
    try:
        prompt_toks = {pid: recorded_prompt_tokens(model, prompts[pid], chat=chat, path=tpath / MANIFEST)
                       for pid in prompts}
        res = _replay_prompts(tpath, t, man, vmap, base, ref, tg, model, rounds, prompts, prompt_toks, out, chunk)
        from mtpscope.traces.run.preflight import model_mismatch_notes

        res.model_mismatch = model_mismatch_notes(man, {"target": tg, "assistant": dr})
        res.warnings = list(t.warnings)
        res.drafter_weights = _drafter_weights(dr)
        if res.drafter_weights["quantized"]:
            res.notes.append(_QUANTIZED_NOTE.format(types=", ".join(
                f"{n} x{c}" for n, c in res.drafter_weights["matrices"].items())))
        return res
    finally:
        model.close()


#: why a quantized drafter's baseline agreement is below 1.0 (docs/FIDELITY.md, "Quantized drafters")
_QUANTIZED_NOTE = ("the drafter's matrices are quantized ({types}): llama.cpp quantizes the activations they "
                   "multiply (Q8_K for k-quants, Q8_0 / Q8_1 for the 32-element blocks) and the baseline emulates "
                   "that; drafts that are near ties may still differ with the CPU's summation order, which the "
                   "near-tie rule counts (summary `numerics`)")


def _drafter_weights(path: Path) -> dict[str, Any]:
    """:func:`traces.run.quantize.weight_types` of the drafter file (its matrices' ggml types, its
    llama.cpp file type when ``mtpscope quantize`` wrote it)."""
    from mtpscope.inspector.gguf import open_gguf
    from mtpscope.traces.run.quantize import weight_types

    with open_gguf(path) as f:
        return weight_types(f)


def recorded_prompt_tokens(model: Any, entry: dict[str, Any], *, chat: bool, path: Path | None = None) -> list[int]:
    """The token ids a manifest prompt entry was recorded from: its ``tokens`` (a prompt given as ids),
    its ``messages`` rendered with the target's chat template, else its text tokenized as the recorder
    does (:func:`traces.run.mtp_runtime.spec_tokens`), or as it did before that rule read special tokens in a
    text when only that gives the recorded token count.

    Raises:
        TraceFormatError: a ``tokens`` entry that is not a list of ids in ``[0, n_vocab)`` (``path``: the trace,
            named with the manifest key).
    """
    from mtpscope.traces.run.mtp_runtime import spec_tokens
    from mtpscope.traces.run.prompts import PromptSpec

    if entry.get("tokens"):
        toks, n_vocab = entry["tokens"], int(model.n_vocab)
        where = f"prompts[prompt_id {entry.get('prompt_id')}].tokens"
        if not isinstance(toks, list):
            raise TraceFormatError("manifest prompt tokens are not a list of ids", path=path, key=where,
                                   expected="list of int", actual=type(toks).__name__)
        for j, x in enumerate(toks):
            if not isinstance(x, int) or isinstance(x, bool) or not 0 <= x < n_vocab:
                raise TraceFormatError("manifest prompt token is not an id of the target's vocabulary", path=path,
                                       key=f"{where}[{j}]", expected=f"an int in 0..{n_vocab - 1}", actual=x)
        return list(toks)
    if entry.get("messages"):
        return spec_tokens(model, PromptSpec(messages=tuple(dict(m) for m in entry["messages"])))[0]
    text = entry.get("text") or ""
    toks = spec_tokens(model, PromptSpec(text=text), chat=chat)[0]
    n = entry.get("n_prompt_tokens")
    if not chat and n is not None and len(toks) != int(n):
        # recorded before issue 33's rule (special-token texts read as plain text): that rule, where it fits
        old = model.tokenize(text, add_special=True, parse_special=False)
        return old if len(old) == int(n) else toks
    return toks


def _replay_prompts(tpath: Path, t: Any, man: dict[str, Any], vmap: dict[str, StepOptions], base: StepOptions,
                    ref: ReferenceDrafter, tg: Path, model: Any, rounds: Any, prompts: dict[int, Any],
                    prompt_toks: dict[int, list[int]], out: Any, chunk: int) -> ReplayResult:
    import pandas as pd

    from mtpscope.traces.run.mtp_runtime import accepted_prefix
    from mtpscope.traces.run.target_prefill import prefill, shape_kv

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
        steps_v: dict[str, list[list[LogitSummary]]] = {}
        numerics: dict[tuple[int, int], tuple[float, float, float]] = {}  # baseline (gap, tol, margin)
        for name, o in vmap.items():
            later = replace(o, hidden="postnorm")  # steps k > 1 feed the previous h_next either way
            kv_all = pre.kv_before(int(P.max()) if len(P) else 0, f16=o.kv_f16)
            drafts: list[list[int]] = [[] for _ in recs]
            summ: list[list[LogitSummary]] = [[] for _ in recs]
            if name == "baseline":  # the numerics pass (numerics_options) runs beside the baseline only
                num = numerics_options(o)
                num_later = replace(num, hidden="postnorm")
                kv_num = kv_all if o.kv_f16 == num.kv_f16 else pre.kv_before(int(P.max()) if len(P) else 0,
                                                                              f16=num.kv_f16)
            for c0 in range(0, len(recs), chunk):
                rows = np.arange(c0, min(c0 + chunk, len(recs)))
                tok = np.array([int(recs[i].pending_token) for i in rows], dtype=np.int64)
                h = pre.h_post[P[rows] - 1]
                hpre = pre.h_pre[P[rows] - 1]
                h_num = h.copy()  # the numerics chain: the baseline's tokens, its own h_next
                kmax = max(len(recorded_all[i]) for i in rows)
                for k in range(kmax):
                    act = np.array([j for j, i in enumerate(rows) if k < len(recorded_all[i])], dtype=np.int64)
                    if name == "baseline":
                        res_num = ref.step_batch(tok[act], h_num[act], P[rows[act]], kv_num,
                                                 num if k == 0 else num_later, kv_limit=P[rows[act]],
                                                 h_prenorm=hpre[act] if k == 0 else None)
                    res = ref.step_batch(tok[act], h[act], P[rows[act]], kv_all, o if k == 0 else later,
                                         kv_limit=P[rows[act]], h_prenorm=hpre[act] if k == 0 else None)
                    for jj, (j, rr) in enumerate(zip(act.tolist(), res, strict=True)):
                        i = int(rows[j])
                        if name == "baseline":
                            rn = res_num[jj]
                            h_num[j] = rn.h_next
                            lg = rr.logits
                            e = float(np.max(np.abs(lg.astype(np.float64) - rn.logits)))
                            top2 = np.partition(lg, -2)[-2:]
                            numerics[(i, k)] = (float(lg[rr.token]) - float(lg[recorded_all[i][k]]),
                                                NEAR_TIE_FACTOR * e, float(top2[1]) - float(top2[0]))
                        draft_logit(rr.logits, rr.token, f"prompt {pid}, round {int(recs[i].round)}, draft {k + 1} "
                                    f"of the {name} replay")
                        drafts[i].append(rr.token)
                        tok[j] = rr.token
                        h[j] = rr.h_next
                        if out is not None:
                            tt = truth_all[i][k]
                            summ[i].append(summarize_logits(rr.logits, rr.token, target=None if tt < 0 else tt,
                                                            n_top=REPLAY_N_TOP))
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
                n_acc = accepted_prefix(d, truth, model.is_eog)      # llama.cpp's rule, as the recorder counts
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
                row["gap[baseline]"], row["tol[baseline]"], row["margin[baseline]"] = numerics[(i, k)]
                step_rows.append(row)
    steps_df = pd.DataFrame(step_rows)
    rounds_df = pd.DataFrame(round_rows)
    if steps_df.empty:
        steps_df = pd.DataFrame(columns=["prompt_id", "round", "k", "pos", "recorded", "truth",
                                         *[f"draft[{n}]" for n in vmap], *[f"accepted[{n}]" for n in vmap],
                                         "gap[baseline]", "tol[baseline]", "margin[baseline]"])
        rounds_df = pd.DataFrame(columns=["prompt_id", "round", "pos", "n_draft", "n_accepted",
                                          *[f"n_accepted[{n}]" for n in vmap]])
    if h_errs:
        notes.append(f"baseline h_next vs recorded h_next ({dims.get('hidden_dtype')}): max relative error "
                     f"{max(h_errs):.3g} over {len(h_errs)} steps")
    result = ReplayResult(trace=os.fspath(tpath), variants=vmap, steps=steps_df, rounds=rounds_df, baseline=base,
                          notes=notes, h_next_rel_err=h_errs)
    if out is not None:
        od = Path(out)
        od.mkdir(parents=True, exist_ok=True)
        result.out = os.fspath(od)
        steps_df.to_parquet(od / STEPS_FILE, index=False)
        rounds_df.to_parquet(od / ROUNDS_FILE, index=False)
        paths = _write_variant_traces(od, tpath, man, vmap, base, variant_records)
        result.notes.append("variant traces (open one as the second trace on the Compare page): "
                            + ", ".join(f"{n} -> {p}" for n, p in paths.items()))
        result.variant_traces = {n: os.fspath(p) for n, p in paths.items()}
        (od / SUMMARY_FILE).write_text(json.dumps(result.summary().to_dict(), indent=2, default=float))
    return result


def _variant_records(pid: int, r: Any, p: int, drafts: list[int], summ: list[LogitSummary], n_acc: int,
                     truth: list[int], truth_seq: list[int]) -> tuple[Any, list[Any]]:
    """One round of a variant as trace records: would-be acceptance, the true continuation as target."""
    from mtpscope.traces.store.records import RoundRecord, StepRecord

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
    for k, (d, ls) in enumerate(zip(drafts, summ, strict=True), start=1):
        visible_row = k - 1 <= n_acc                          # rows after a mismatch: unknown target
        steps.append(StepRecord(k=k, token=int(d), logit=ls.logit, rank=ls.rank, top_ids=ls.top_ids,
                                top_logits=ls.top_logits, target_token=known[k - 1] if visible_row else None,
                                target_rank=ls.target_rank if visible_row else None, accepted=k <= n_acc))
    return rr, steps


def _is_replay_trace(d: Path) -> bool:
    from mtpscope.traces.store.reader import read_manifest

    try:
        return read_manifest(d).get("source") == "replay"
    except (OSError, TraceError):
        return False


def _slug(name: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "variant"


def _write_variant_traces(od: Path, tpath: Path, man: dict[str, Any], vmap: dict[str, StepOptions],
                          base: StepOptions, recs: dict[str, list[tuple[Any, list[Any]]]]) -> dict[str, Path]:
    """One trace directory per variant (source ``replay``) under ``od/traces/``, readable by
    ``traces.open`` and the app like any recorded trace. A replay already in ``od`` is replaced whole: its
    variant traces that this one does not write are removed (only folders whose manifest says source
    ``replay``; anything else there is left alone)."""
    from mtpscope.traces.store.writer import TraceWriter

    keep = {_slug(name) for name in vmap}
    for d in sorted((od / TRACES_DIR).iterdir()) if (od / TRACES_DIR).is_dir() else ():
        if d.name not in keep and d.is_dir() and _is_replay_trace(d):
            shutil.rmtree(d)
    paths: dict[str, Path] = {}
    for name, o in vmap.items():
        d = od / TRACES_DIR / _slug(name)
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


__all__ = ["BASELINE_CPU", "BASELINE_GPU", "REPLAY_N_TOP", "ReplayRates", "ReplayResult", "ReplaySummary",
           "VariantSummary", "baseline_for", "indistinguishable", "parse_variant", "read_replay",
           "recorded_prompt_tokens", "replay"]
