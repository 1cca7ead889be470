"""The numerics of a replay: when a recomputed draft may differ from llama.cpp's (docs/FIDELITY.md, "Every x86 CPU").

One job: the options whose difference from a replay's baseline measures each step's numerical effect ``E``
(:func:`numerics_options`), and the judgement of a replay's steps by the near-tie rule (:func:`numerics_check`:
near ties, unexplained differences, the expected agreement). :mod:`mtpscope.traces.run.replay` computes the
columns; ``mtpscope diagnose`` (its runtime-divergence finding) and the tests read the judgement.

Imports: numpy, inspector.reference (``StepOptions``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from mtpscope.inspector.reference import StepOptions

#: A recomputed draft that differs from llama.cpp's is a **near tie** (explained by the numerics) when the
#: reference's logit of its own draft exceeds its logit of llama.cpp's draft by at most this many times ``E``,
#: ``E`` the step's numerical effect: the largest logit change between the baseline and
#: :func:`numerics_options` (every rounding the baseline emulates removed). llama.cpp computes the same
#: roundings and differs from the emulation by far less than their whole effect, so each of the two logits
#: moves by at most ``3 E`` between the runtimes and a swap needs a gap of at most ``6 E``: the rule of
#: docs/FIDELITY.md's whole-target comparison (``f16_effect``), applied per step.
NEAR_TIE_FACTOR = 6.0


def numerics_options(base: StepOptions) -> StepOptions:
    """The options whose difference from ``base`` measures a step's numerical effect ``E``
    (:data:`NEAR_TIE_FACTOR`): ``base`` with every rounding it emulates removed (exact GELU, F32 KV and
    attention, F32 activations) when it emulates ggml-cpu's activation rounding; else (a GPU baseline) with
    ggml-cpu's activation rounding added and the F16 KV removed, so that either way ``E`` is the size of the
    roundings by which runtimes differ."""
    if base.act_quant:
        return replace(base, act_quant=False, kv_f16=False, gelu="tanh")
    return replace(base, act_quant=True, kv_f16=False)


def numerics_check(steps: Any) -> dict[str, Any]:
    """How a replay's baseline agrees with the recorded drafts, judged by the numerics (:data:`NEAR_TIE_FACTOR`).

    Per round, steps are read in order up to the first one whose baseline draft differs from the recorded
    one; later steps of that round are *downstream* (their inputs differ) and not judged. The first
    difference is a *near tie* when ``gap <= tol`` (the columns ``gap[baseline]``, ``tol[baseline]``: the
    reference's logit of its draft minus that of the recorded draft, and ``NEAR_TIE_FACTOR * E``), else
    *unexplained*. A step is *decided* when it and every earlier step of its round have a top-2 margin
    (``margin[baseline]``) above their ``tol``: the numerics cannot flip it, so ``expected_agreement`` (the
    share of decided steps) is the least agreement a faithful runtime reaches on this sample.

    Args:
        steps: :attr:`ReplayResult.steps` (``prompt_id``, ``round``, ``k``, ``recorded``, ``draft[baseline]``;
            the three numerics columns, absent in replays written before them).

    Returns:
        ``{n_steps, n_differ, near_ties, unexplained, downstream, expected_agreement, first_unexplained
        ({prompt_id, round, k} or None), judged}``; ``judged`` False (and the counts None) when the columns
        are missing.
    """
    n = 0 if steps is None else len(steps)
    out: dict[str, Any] = {"n_steps": n, "n_differ": None, "near_ties": None, "unexplained": None,
                           "downstream": None, "expected_agreement": None, "first_unexplained": None,
                           "judged": False}
    if not n or not {"gap[baseline]", "tol[baseline]", "margin[baseline]"} <= set(steps.columns):
        return out
    s = steps.sort_values(["prompt_id", "round", "k"])
    differ = (s["draft[baseline]"] != s["recorded"]).to_numpy()
    key = (s["prompt_id"].astype(np.int64) * (1 << 32) + s["round"].astype(np.int64)).to_numpy()
    tol = s["tol[baseline]"].to_numpy(dtype=np.float64)
    gap = s["gap[baseline]"].to_numpy(dtype=np.float64)
    margin = s["margin[baseline]"].to_numpy(dtype=np.float64)
    before = np.zeros(n, dtype=bool)        # an earlier step of the round differed
    fragile_before = np.zeros(n, dtype=bool)  # an earlier step of the round could flip
    for i in range(1, n):
        if key[i] == key[i - 1]:
            before[i] = before[i - 1] or differ[i - 1]
            fragile_before[i] = fragile_before[i - 1] or not (margin[i - 1] > tol[i - 1])
    first = differ & ~before
    near = first & (gap <= tol)
    unexpl = first & ~(gap <= tol)
    decided = ~fragile_before & (margin > tol)
    out.update({"n_differ": int(differ.sum()), "near_ties": int(near.sum()), "unexplained": int(unexpl.sum()),
                "downstream": int((before).sum()), "expected_agreement": float(decided.mean()), "judged": True})
    if unexpl.any():
        r = s.iloc[int(np.argmax(unexpl))]
        out["first_unexplained"] = {"prompt_id": int(r["prompt_id"]), "round": int(r["round"]), "k": int(r["k"])}
    return out


__all__ = ["NEAR_TIE_FACTOR", "numerics_check", "numerics_options"]
