"""Check the cause ``compare`` names for two runtimes' first differing round by replaying that draft step
(issue 35): the numpy reference drafter (:class:`inspector.reference.ReferenceDrafter`) runs the step under
A's value and under B's value of the cause's convention, the other convention held fixed, and each replayed
draft is matched against the two traces' drafts (:func:`replay_first_differences`).

The replayed step sees what the recorded one saw: the target's donor K/V and its post-norm hidden row at
``pos - 1`` from one llama.cpp prefill (:func:`traces.run.target_prefill.prefill`, as
:func:`traces.run.replay.replay` does) of the common token sequence followed by the drafts the HF trace's previous
round rejected (their K/V at positions ``>= pos``, which HF's drafter sees; nothing before ``pos`` depends on
them), the pending token at ``pos``, and for step k > 1 the two traces' common drafts 1..k-1 with the replay's own
``h_next``. The options are the llama.cpp trace's replay baseline (:func:`traces.run.replay.baseline_for`) with
the varied and held conventions set (``draft_position`` -> ``StepOptions.position``, ``head`` ->
``StepOptions.head``, ``kv_visibility`` -> the K/V view: llama.cpp's, positions ``< pos`` under its sliding-window
rule, or HF's, :func:`hf_view`).

Which values and what "confirmed" means are pure (:func:`traces.analysis.runtime_diff.replay_plan`,
:func:`traces.analysis.runtime_diff.with_replays`); this module only computes the drafts. Needs a drafter GGUF
and its target GGUF (the llama.cpp trace's manifest names them, or pass them) and llama-cpp-python for the
prefill; without them each difference says why it was not replayed (``replay_note``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.errors import MtpscopeError
from mtpscope.inspector.reference import DonorKV
from mtpscope.traces.analysis.runtime_diff import ReplayedDraft, RuntimeDiff, replay_plans, replay_values, with_replays
from mtpscope.traces.store.protocols import TraceLike

_ROUND_COLUMNS = ["prompt_id", "round", "pos", "pending_token", "drafted", "n_accepted"]


def _gguf_models(t: TraceLike) -> dict[str, Path] | None:
    """The trace's target / assistant (and centroids) GGUF paths when its manifest names existing GGUF files."""
    models = t.manifest.get("models") or {}
    out: dict[str, Path] = {}
    for role in ("target", "assistant", "centroids"):
        m = models.get(role)
        if isinstance(m, dict) and m.get("path") and m.get("dialect") != "hf":
            p = Path(str(m["path"]))
            p = p if p.is_absolute() or p.exists() else Path(t.path) / p
            if p.is_file():
                out[role] = p
    return out if "target" in out and "assistant" in out else None


def _sequence(t: TraceLike, rounds: Any, pid: int, rnd: int, model: Any) -> list[int] | None:
    """The token ids at positions ``< pos`` of round ``rnd`` of prompt ``pid`` (prompt, then each earlier round's
    pending token and accepted drafts), or None when they do not line up with the recorded position."""
    from mtpscope.traces.run.replay import recorded_prompt_tokens

    entry = next((p for p in t.manifest.get("prompts") or [] if int(p.get("prompt_id", -1)) == pid), None)
    if entry is None:
        return None
    chat = bool((t.manifest.get("params") or {}).get("chat", False))
    seq = list(recorded_prompt_tokens(model, entry, chat=chat))
    r = rounds[rounds["prompt_id"] == pid].sort_values("round")
    for row in r.itertuples(index=False):
        if int(row.pos) != len(seq):
            return None
        if int(row.round) == rnd:
            return seq
        seq += [int(row.pending_token)] + [int(x) for x in list(row.drafted)[: int(row.n_accepted)]]
    return None


def hf_view(kv: Mapping[str, DonorKV], p: int, verify_lo: int, verify_end: int, window: int) -> dict[str, DonorKV]:
    """What HF 5.24's drafter sees of the target's K/V at a round whose pending token sits at ``p`` (facts §3;
    measured in ``tests/test_hf_runtime.py``), built from donor K/V over positions ``0..verify_end`` (the accepted
    tokens before ``p``, then what the previous verify forward held at ``p..verify_end``: its rejected drafts).

    HF hands over the verify forward's K/V (the cache before it, then the ``verify_lo..verify_end`` rows it
    computed) cut to its first ``p + 1`` entries: full layers see positions ``0..p`` (the entry at ``p`` the first
    rejected draft's, when the previous round rejected one); a sliding layer's cache keeps its last
    ``window - 1`` entries, so its array starts at ``max(0, verify_lo - window + 1)`` and the drafter's mask shows
    its last ``window + 1`` entries (rejected drafts beyond ``p`` included). Assumes no rejected entry of an
    earlier round is still in the sliding cache (exact while ``verify_end < window``).

    Args:
        kv: ``{"sliding": DonorKV, "full": DonorKV}`` with positions ``0..verify_end`` (at least).
        p: the pending token's position. verify_lo / verify_end: the previous verify forward's first and last
            positions (``verify_end = p - 1`` after a full acceptance). window: the sliding window W.

    Returns:
        ``{"sliding": ..., "full": ...}`` with explicit masks (use no ``kv_limit`` with them).
    """
    out = {}
    full = kv["full"].upto(p + 1)
    out["full"] = DonorKV(full.k, full.v, full.pos, np.ones(full.pos.size, dtype=bool), full.f16)
    s = kv["sliding"]
    lo = 0 if verify_lo <= window - 1 else verify_lo - (window - 1)
    keep = np.nonzero((s.pos >= lo) & (s.pos <= verify_end))[0][: p + 1]
    mask = np.zeros(keep.size, dtype=bool)
    mask[-(window + 1):] = True
    out["sliding"] = DonorKV(s.k[keep], s.v[keep], s.pos[keep], mask, s.f16)
    return out


def _replay_step(ref: Any, pre: Any, p: int, step: int, pending: int, common: tuple[int, ...], opts: Any,
                 kv: Mapping[str, DonorKV], kv_limit: np.ndarray | None) -> int:
    """The reference drafter's draft at ``step`` of a round whose pending token sits at ``p``: step 1 from the
    pending token and the target's hidden row at ``p - 1``, steps 2..k from the ``common`` drafts (the two
    traces' equal drafts 1..k-1) and the replay's own ``h_next``; every step at ``p`` over the same ``kv``."""
    pos = np.array([p])
    tok = np.array([pending])
    h = pre.h_post[p - 1][None, :]
    token = -1
    for k in range(1, step + 1):
        o = opts if k == 1 else replace(opts, hidden="postnorm")
        res = ref.step_batch(tok, h, pos, kv, o, kv_limit=kv_limit,
                             h_prenorm=pre.h_pre[p - 1][None, :] if k == 1 else None)[0]
        token = int(res.token)
        if k < step:
            tok, h = np.array([common[k - 1]]), res.h_next[None, :]
    return token


def replay_first_differences(diff: RuntimeDiff, a: TraceLike, b: TraceLike, *,
                             target: str | os.PathLike[str] | None = None,
                             assistant: str | os.PathLike[str] | None = None,
                             centroids: str | os.PathLike[str] | None = None) -> RuntimeDiff:
    """``diff`` (of ``a`` and ``b``, :func:`traces.analysis.compare_report.compare_traces`) with each first
    difference whose cause is replayable (:data:`traces.analysis.runtime_diff.REPLAYED_CAUSES`) replayed and marked
    confirmed / not confirmed (the replay's verdict replaces a ``head`` confirmation read from a recorded centroid
    token: it checks the same thing through the reference drafter).

    Args:
        diff: the round-by-round diff (``AlignedDiff.runtimes``).
        a / b: the two opened traces (their rounds, prompts and manifests).
        target / assistant / centroids: GGUF files (default: those a trace's manifest names, the llama.cpp one).

    Returns:
        the diff with ``replayed`` / ``replay_note`` / ``confirmed`` set (:func:`with_replays`). Nothing raises for
        a step that cannot be replayed: its ``replay_note`` says why (no GGUF models, llama-cpp-python missing, the
        token sequence not lining up with the recorded position).
    """
    todo = [i for i, d in enumerate(diff.prompts) if replay_plans(d, diff)]
    if not todo:
        return diff
    models = next((m for m in (_gguf_models(a), _gguf_models(b)) if m is not None), {})
    side = a if _gguf_models(a) is not None else b
    if target is not None:
        models["target"] = Path(target)
    if assistant is not None:
        models["assistant"] = Path(assistant)
    if centroids is not None:
        models["centroids"] = Path(centroids)
    if "target" not in models or "assistant" not in models:
        note = "not replayed: neither trace names a drafter GGUF and its target GGUF that exist here"
        return with_replays(diff, dict.fromkeys(todo, ((), note)))
    try:
        return _replay_all(diff, a, b, todo, models, side)
    except MtpscopeError as e:   # llama-cpp-python missing, unreadable model: every step says why
        return with_replays(diff, dict.fromkeys(todo, ((), f"not replayed: {e}")))


def _previous_round(rounds: Any, pid: int, rnd: int) -> tuple[int, tuple[int, ...], int] | None:
    """``(pos, drafted, n_accepted)`` of the round before round ``rnd`` of prompt ``pid`` (None for the first)."""
    r = rounds[(rounds["prompt_id"] == pid) & (rounds["round"] == rnd - 1)]
    if not len(r):
        return None
    row = r.iloc[0]
    return int(row["pos"]), tuple(int(x) for x in list(row["drafted"])), int(row["n_accepted"])


def _replay_all(diff: RuntimeDiff, a: TraceLike, b: TraceLike, todo: list[int], models: dict[str, Path],
                side: TraceLike) -> RuntimeDiff:
    from mtpscope.inspector.reference import ReferenceDrafter
    from mtpscope.traces.run.llama.model import LlamaModel
    from mtpscope.traces.run.replay import baseline_for
    from mtpscope.traces.run.target_prefill import prefill, shape_kv

    plans = {i: replay_plans(diff.prompts[i], diff) for i in todo}
    want_centroid = any("centroid" in (p[1], p[2]) or "head=centroid" in p[3]
                        for ps in plans.values() for p in ps.values())
    cen = models.get("centroids") if want_centroid else None
    ref = ReferenceDrafter.from_gguf(models["assistant"], models["target"], centroids=cen)
    base = baseline_for(side.manifest)
    window = int(ref.hp.sliding_window)
    rounds = {"a": a.columns("rounds", _ROUND_COLUMNS), "b": b.columns("rounds", _ROUND_COLUMNS)}
    out: dict[int, tuple[tuple[ReplayedDraft, ...], str | None]] = {}
    model = LlamaModel(models["target"])
    try:
        for i in todo:
            d = diff.prompts[i]
            if not plans[i] or d.pos is None or d.step is None:   # not in todo (replay_plan checked both)
                continue
            seq = None
            for t, r, pid, rnd in ((a, rounds["a"], d.prompt_id_a, d.round_a), (b, rounds["b"], d.prompt_id_b, d.round_b)):
                seq = _sequence(t, r, pid, int(rnd if rnd is not None else -1), model) if seq is None else seq
            if seq is None or len(seq) != d.pos or d.pos < 1:
                out[i] = ((), "not replayed: the recorded token sequence does not line up with the round's position")
                continue
            ra = rounds["a"]
            row = ra[(ra["prompt_id"] == d.prompt_id_a) & (ra["round"] == d.round_a)]
            pending = int(row["pending_token"].iloc[0])
            # HF's view needs the previous verify forward of the trace whose visibility is HF's: its rows at >= pos
            prev = {"a": _previous_round(rounds["a"], d.prompt_id_a, int(d.round_a or 0)),
                    "b": _previous_round(rounds["b"], d.prompt_id_b, int(d.round_b or 0))}
            hf_side = next((s_ for s_, c in (("a", diff.convention_a), ("b", diff.convention_b))
                            if c is not None and replay_values("kv_visibility", c) == "hf"), None)
            hp = prev[hf_side] if hf_side is not None else None
            verify = None
            extra: list[int] = []
            if hp is not None and hp[0] + hp[2] + 1 == d.pos:
                verify = (hp[0], hp[0] + len(hp[1]))
                extra = list(hp[1][hp[2]:])
            try:
                pre = shape_kv(prefill(models["target"], seq + extra, model=model), ref)
                got: list[ReplayedDraft] = []
                skipped: list[str] = []
                for key, va, vb, holds in plans[i].values():
                    for h in holds:
                        held_key, _, hv = h.partition("=")
                        for v in dict.fromkeys((va, vb)):
                            setting = {"draft_position": base.position, "head": base.head, "kv_visibility": "llama.cpp"}
                            setting[held_key], setting[key] = hv, v
                            if setting["head"] == "centroid" and ref.w.centroids is None:
                                skipped.append(f"{key}={v}, {h} (no centroid head given)")
                                continue
                            opts = replace(base, position=setting["draft_position"], head=setting["head"])
                            kv: Mapping[str, DonorKV]
                            if setting["kv_visibility"] == "hf":
                                if verify is None:
                                    skipped.append(f"{key}={v}, {h} (the HF trace's previous round does not line up)")
                                    continue
                                lo, end = verify
                                kv = hf_view(pre.kv_before(len(pre.tokens), f16=opts.kv_f16), d.pos, lo, end, window)
                                limit = None
                            else:
                                kv, limit = pre.kv_before(d.pos, f16=opts.kv_f16), np.array([d.pos])
                            tok = _replay_step(ref, pre, d.pos, d.step, pending, d.drafted_a, opts, kv, limit)
                            rep = ("a" if tok == d.drafted_a[d.step - 1] else
                                   "b" if tok == d.drafted_b[d.step - 1] else None)
                            got.append(ReplayedDraft(key=key, value=v, held=h, token=tok, reproduces=rep))
                out[i] = (tuple(got), ("not replayed: " + ", ".join(skipped)) if skipped else None)
            except MtpscopeError as e:
                out[i] = ((), f"not replayed: {e}")
    finally:
        model.close()
    return with_replays(diff, out)


__all__ = ["hf_view", "replay_first_differences"]
