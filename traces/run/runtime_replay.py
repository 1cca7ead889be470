"""Check the cause ``compare`` names for two runtimes' first differing round by replaying that draft step
(issue 35): the numpy reference drafter (:class:`inspector.reference.ReferenceDrafter`) runs the step under
A's value and under B's value of the cause's convention, the other convention held fixed, and each replayed
draft is matched against the two traces' drafts (:func:`replay_first_differences`).

The replayed step sees what the recorded one saw: the target's donor K/V of positions ``< pos`` and its
post-norm hidden row at ``pos - 1`` from one llama.cpp prefill of the common token sequence
(:func:`traces.run.target_prefill.prefill`, as :func:`traces.run.replay.replay` does), the pending token at
``pos``, and for step k > 1 the two traces' common drafts 1..k-1 with the replay's own ``h_next``. The
options are the llama.cpp trace's replay baseline (:func:`traces.run.replay.baseline_for`) with the varied and
held conventions set (``draft_position`` -> ``StepOptions.position``, ``head`` -> ``StepOptions.head``).

Which values and what "confirmed" means are pure (:func:`traces.analysis.runtime_diff.replay_plan`,
:func:`traces.analysis.runtime_diff.with_replays`); this module only computes the drafts. Needs a drafter GGUF
and its target GGUF (the llama.cpp trace's manifest names them, or pass them) and llama-cpp-python for the
prefill; without them each difference says why it was not replayed (``replay_note``).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.errors import MtpscopeError
from mtpscope.traces.analysis.runtime_diff import ReplayedDraft, RuntimeDiff, replay_plan, with_replays
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


def _replay_step(ref: Any, pre: Any, p: int, step: int, pending: int, common: tuple[int, ...], opts: Any) -> int:
    """The reference drafter's draft at ``step`` of a round whose pending token sits at ``p``: step 1 from the
    pending token and the target's hidden row at ``p - 1``, steps 2..k from the ``common`` drafts (the two
    traces' equal drafts 1..k-1) and the replay's own ``h_next``."""
    pos = np.array([p])
    kv = pre.kv_before(p, f16=opts.kv_f16)
    tok = np.array([pending])
    h = pre.h_post[p - 1][None, :]
    token = -1
    for k in range(1, step + 1):
        o = opts if k == 1 else replace(opts, hidden="postnorm")
        res = ref.step_batch(tok, h, pos, kv, o, kv_limit=pos, h_prenorm=pre.h_pre[p - 1][None, :] if k == 1 else None)[0]
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
    todo = [i for i, d in enumerate(diff.prompts) if replay_plan(d, diff.convention_a, diff.convention_b) is not None]
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


def _replay_all(diff: RuntimeDiff, a: TraceLike, b: TraceLike, todo: list[int], models: dict[str, Path],
                side: TraceLike) -> RuntimeDiff:
    from mtpscope.inspector.reference import ReferenceDrafter
    from mtpscope.traces.run.llama.model import LlamaModel
    from mtpscope.traces.run.replay import baseline_for
    from mtpscope.traces.run.target_prefill import prefill, shape_kv

    plans = {i: replay_plan(diff.prompts[i], diff.convention_a, diff.convention_b) for i in todo}
    want_centroid = any(p is not None and "centroid" in (p[1], p[2], *p[3]) for p in plans.values())
    cen = models.get("centroids") if want_centroid else None
    ref = ReferenceDrafter.from_gguf(models["assistant"], models["target"], centroids=cen)
    base = baseline_for(side.manifest)
    rounds = {"a": a.columns("rounds", _ROUND_COLUMNS), "b": b.columns("rounds", _ROUND_COLUMNS)}
    out: dict[int, tuple[tuple[ReplayedDraft, ...], str | None]] = {}
    model = LlamaModel(models["target"])
    try:
        for i in todo:
            d, plan = diff.prompts[i], plans[i]
            if plan is None or d.pos is None or d.step is None:   # not in todo (replay_plan checked both)
                continue
            key, va, vb, holds = plan
            seq = None
            for t, r, pid, rnd in ((a, rounds["a"], d.prompt_id_a, d.round_a), (b, rounds["b"], d.prompt_id_b, d.round_b)):
                seq = _sequence(t, r, pid, int(rnd if rnd is not None else -1), model) if seq is None else seq
            if seq is None or len(seq) != d.pos or d.pos < 1:
                out[i] = ((), "not replayed: the recorded token sequence does not line up with the round's position")
                continue
            ra = rounds["a"]
            row = ra[(ra["prompt_id"] == d.prompt_id_a) & (ra["round"] == d.round_a)]
            pending = int(row["pending_token"].iloc[0])
            try:
                pre = shape_kv(prefill(models["target"], seq, model=model), ref)
                held_key = "head" if key == "draft_position" else "draft_position"
                got: list[ReplayedDraft] = []
                skipped: list[str] = []
                for h in holds:
                    if (h == "centroid" and held_key == "head") and ref.w.centroids is None:
                        skipped.append(f"{held_key}={h} (no centroid head given)")
                        continue
                    for v in dict.fromkeys((va, vb)):
                        if v == "centroid" and ref.w.centroids is None:
                            skipped.append(f"{key}={v} (no centroid head given)")
                            continue
                        pos_v, head_v = (v, h) if key == "draft_position" else (h, v)
                        opts = replace(base, position=pos_v, head=head_v)
                        tok = _replay_step(ref, pre, d.pos, d.step, pending, d.drafted_a, opts)
                        rep = ("a" if tok == d.drafted_a[d.step - 1] else
                               "b" if tok == d.drafted_b[d.step - 1] else None)
                        got.append(ReplayedDraft(key=key, value=v, held=f"{held_key}={h}", token=tok, reproduces=rep))
                out[i] = (tuple(got), ("not replayed: " + ", ".join(skipped)) if skipped else None)
            except MtpscopeError as e:
                out[i] = ((), f"not replayed: {e}")
    finally:
        model.close()
    return with_replays(diff, out)


__all__ = ["replay_first_differences"]
