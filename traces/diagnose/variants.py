"""Step 5 of ``diagnose``: replay the trace under each convention variant and read what recovers acceptance.

One job: choose the variants and the sample of rounds, run :func:`mtpscope.traces.run.replay.replay` once over
that sample, and turn its per-round would-be acceptance into findings:

* a **convention** finding for each variant that raises acceptance clearly: the paired bootstrap interval over
  prompts of ``rate(variant) - rate(baseline)`` (:func:`mtpscope.traces.analysis.align.bootstrap_delta`) lies
  above 0 and the rise is at least :data:`MIN_RISE`. It names in words the mismatch the variant stands for
  (:data:`CONVENTIONS`: "the drafter behaves as if fed the pre-norm hidden state ...");
* a **runtime divergence** finding when the baseline (the recorder's own conventions) differs from the drafts
  llama.cpp recorded where the numerics cannot explain it: a round's first differing draft whose logit in the
  reference trails the reference's own draft by more than ``NEAR_TIE_FACTOR`` times the step's numerical effect
  (:func:`mtpscope.traces.run.replay.numerics_check`; docs/FIDELITY.md, "Replay agreement"). The rule has no
  agreement threshold: what a faithful runtime may flip follows from each step's own numbers (weight type, its
  activation rounding, the F16 KV cache and GELU table), on any CPU.

The variants: every value of the reference drafter's conventions (``position``, ``hidden``, ``gelu``, and ``head``
when a centroid head is at hand) other than the baseline's (docs/FIDELITY.md, "StepOptions"); a value added to the
reference later is replayed too, with generic words.

The sample: up to ``N_PROMPTS`` prompts taken in turn from each category (the shortest prompts of each
first: a replay prefills every prompt it replays, and that prefill is most of its time), each prompt's first
``ROUNDS_PER_PROMPT`` rounds (the prefill then covers only those tokens); both defaults live in :mod:`config`
(``DiagnoseConfig.replay_prompts`` / ``rounds_per_prompt``).

Imports: numpy, inspector.reference (the convention values), traces.analysis.align (``bootstrap_delta``),
traces.run.replay, and this area's records and config (the sample's defaults).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mtpscope.inspector.ggml_types import VEC_DOT_TYPES
from mtpscope.inspector.reference import GELUS, HIDDENS, POSITIONS, StepOptions
from mtpscope.traces.analysis.align import bootstrap_delta
from mtpscope.traces.diagnose.config import N_PROMPTS, ROUNDS_PER_PROMPT
from mtpscope.traces.diagnose.records import ERROR, HIGH, LOW, MEDIUM, WARNING, Evidence, Finding, Fix, ViewRef
from mtpscope.traces.run.numerics import NEAR_TIE_FACTOR
from mtpscope.traces.run.replay import ReplayResult, replay

#: A variant "recovers" acceptance when it raises it by at least this much (absolute), its interval above 0.
MIN_RISE = 0.03
#: Two replays of the same sample in the reference drafter (step 6: this file vs a reference file) draft alike at
#: 100 % of steps when the two files hold the same weights (the same code, the same inputs, the same machine); under
#: this share the weights differ. A detection threshold between two files, not a numerical tolerance: llama.cpp
#: is not part of that comparison (the runtime's own agreement is judged by the numerics, above).
AGREEMENT_MIN = 0.98
#: Unexplained differences in at least this share of the replayed rounds make the runtime divergence an error (most
#: drafts unrelated: a tensor read otherwise); fewer, a warning. Any unexplained difference is a finding.
DIVERGENCE_ERROR_SHARE = 0.1


@dataclass(frozen=True)
class Convention:
    """One replay variant and what it means when it recovers acceptance.

    Attributes:
        spec: the replay variant (``hidden=prenorm``).
        as_if: the mismatch in words ("the drafter behaves as if ...").
        fix: what to change.
        fix_kind: ``runtime_flag`` or ``reconvert``.
    """

    spec: str
    as_if: str
    fix: str
    fix_kind: str = "reconvert"


#: What each known variant stands for (docs/DIAGNOSE.md, "convention").
CONVENTIONS: dict[str, Convention] = {c.spec: c for c in (
    Convention("hidden=prenorm", "the drafter behaves as if fed the target's hidden state before its final norm "
               "(pre-norm): it was trained or converted for a runtime that feeds l_out, not the post-norm state",
               "feed the drafter what it was trained on: a runtime that passes the pre-norm hidden state, or a drafter "
               "converted / trained for the post-norm one (llama.cpp, HF and MLX feed the post-norm state)"),
    Convention("hidden=postnorm", "the drafter behaves as if fed the target's hidden state after its final norm",
               "feed the post-norm hidden state"),
    Convention("position=p-1", "the drafter behaves as if its position were one less than llama.cpp's (MLX's "
               "convention since its PR #1166): RoPE and the mask are off by one",
               "run the drafter at the position it was trained for (llama.cpp and HF use p, the pending token's)",
               "runtime_flag"),
    Convention("position=p", "the drafter behaves as if positioned at the pending token (HF, llama.cpp)",
               "use position p", "runtime_flag"),
    Convention("gelu=tanh", "the drafter behaves as if its GELU were the exact tanh form (HF, a GPU build) rather than "
               "ggml's F16 table", "run the drafter on a build with the exact GELU", "runtime_flag"),
    Convention("gelu=ggml-f16", "the drafter behaves as if its GELU were ggml's F16 table (llama.cpp on CPU)",
               "run the drafter with ggml's F16 GELU", "runtime_flag"),
    Convention("head=centroid", "the drafter behaves as if it drafted with its centroid head (the sparse head of the "
               "published assistants), not the dense one", "draft with the centroid head (the fork runtime, or HF)",
               "runtime_flag"),
)}


def convention_variants(base: StepOptions, *, centroids: bool) -> list[str]:
    """The replay variants of the conventions: each value of ``position``, ``hidden`` and ``gelu`` other than
    ``base``'s, and ``head=centroid`` when a centroid head is at hand (``centroids``)."""
    out = [f"{name}={v}" for name, values in (("hidden", HIDDENS), ("position", POSITIONS), ("gelu", GELUS))
           for v in values if v != getattr(base, name)]
    if centroids and base.head != "centroid":
        out.append("head=centroid")
    return out


def sample_prompts(manifest: Mapping[str, Any], prompt_ids: Sequence[int], n: int = N_PROMPTS) -> list[int]:
    """Up to ``n`` of ``prompt_ids``, taken in turn from each category (the manifest's prompt entries; one group
    when none has a category), each category's shortest prompts first (``n_prompt_tokens``; then by id)."""
    entries = {int(p.get("prompt_id", i)): p for i, p in enumerate(manifest.get("prompts") or []) if isinstance(p, dict)}

    def length(pid: int) -> int:
        n = entries.get(pid, {}).get("n_prompt_tokens")
        return int(n) if isinstance(n, int) else 0

    groups: dict[str, list[int]] = {}
    for pid in sorted((int(p) for p in prompt_ids), key=lambda p: (length(p), p)):
        groups.setdefault(str(entries.get(pid, {}).get("category")), []).append(pid)
    out: list[int] = []
    while len(out) < n and any(groups.values()):
        for g in list(groups):
            if groups[g] and len(out) < n:
                out.append(groups[g].pop(0))
    return sorted(out)


def _per_prompt(rounds: Any, column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    g = rounds.groupby("prompt_id", sort=True)[["n_draft", column]].sum()
    return g.index.to_numpy(), g["n_draft"].to_numpy(dtype=np.float64), g[column].to_numpy(dtype=np.float64)


def run_variants(trace: str | os.PathLike[str], *, variants: Sequence[str], out: str | os.PathLike[str] | None,
                 prompt_ids: Sequence[int] | None, rounds_per_prompt: int | None = ROUNDS_PER_PROMPT,
                 centroids: str | os.PathLike[str] | None = None, assistant: str | os.PathLike[str] | None = None,
                 target: str | os.PathLike[str] | None = None) -> ReplayResult:
    """:func:`mtpscope.traces.run.replay.replay` of the sample (``prompt_ids``, ``rounds_per_prompt``) under
    ``variants``, written to ``out`` (the variant traces the findings link to).

    Raises:
        TraceError / TraceFormatError / ReferenceDrafterError / RuntimeUnavailableError: as ``replay``.
    """
    return replay(trace, variants=list(variants), out=out, prompt_ids=prompt_ids, rounds_per_prompt=rounds_per_prompt,
                  centroids=centroids, assistant=assistant, target=target)


def rise(res: ReplayResult, name: str, baseline: str = "baseline") -> dict[str, Any]:
    """``rate(name) - rate(baseline)`` over the replayed rounds with its paired 95 % bootstrap interval over
    prompts (:func:`bootstrap_delta`'s keys)."""
    _, d0, a0 = _per_prompt(res.rounds, f"n_accepted[{baseline}]")
    _, d1, a1 = _per_prompt(res.rounds, f"n_accepted[{name}]")
    return bootstrap_delta(d0, a0, d1, a1)


def agreement(res: ReplayResult) -> tuple[float | None, dict[str, int] | None]:
    """The share of replayed steps whose baseline draft equals the recorded one, and the first step that
    differs (``{prompt_id, round, k}``) or None."""
    s = res.steps
    if s is None or not len(s):
        return None, None
    same = (s["draft[baseline]"] == s["recorded"]).to_numpy()
    first = None
    if not same.all():
        r = s.loc[~same].iloc[0]
        first = {"prompt_id": int(r["prompt_id"]), "round": int(r["round"]), "k": int(r["k"])}
    return float(same.mean()), first


def variant_findings(res: ReplayResult, *, trace: str) -> tuple[list[Finding], dict[str, Any]]:
    """Convention and runtime-divergence findings of a replay (module docstring), and the variants' numbers
    (``{variant: {options, acceptance_rate, agreement, delta, ci_low, ci_high, recovers, trace}}`` plus
    ``baseline_agreement``, ``n_rounds``, ``n_steps``, ``n_prompts``)."""
    summ = res.summary()
    found: list[Finding] = []
    numbers: dict[str, Any] = {"n_rounds": summ.n_rounds, "n_steps": summ.n_steps,
                               "n_prompts": int(res.rounds["prompt_id"].nunique()) if len(res.rounds) else 0,
                               "recorded": summ.recorded.to_dict(), "variants": {}}
    base = summ.variants.get("baseline")
    base_rate = None if base is None else base.acceptance_rate
    rows = []
    for name, v in summ.variants.items():
        entry = {"options": v.options, "acceptance_rate": v.acceptance_rate, "agreement": v.agreement,
                 "trace": res.variant_traces.get(name)}
        if name != "baseline":
            d = rise(res, name)
            entry.update({"delta": d["delta"], "ci_low": d["ci_low"], "ci_high": d["ci_high"]})
            entry["recovers"] = bool(d["delta"] is not None and d["ci_low"] is not None and d["ci_low"] > 0
                                     and d["delta"] >= MIN_RISE)
            if entry["recovers"]:
                rows.append((name, d, entry))
        numbers["variants"][name] = entry
    for name, d, entry in sorted(rows, key=lambda r: -r[1]["delta"]):
        conv = CONVENTIONS.get(name, Convention(name, f"the drafter behaves as if replayed with {name}",
                                                f"find which runtime or conversion difference {name} stands for"))
        strong = d["ci_low"] >= MIN_RISE
        ev = Evidence("replay", f"replaying {summ.n_rounds} rounds of {numbers['n_prompts']} prompts with {name} "
                      f"raises acceptance {d['rate_a']:.2f} -> {d['rate_b']:.2f} (+{d['delta']:.2f}, 95 % interval "
                      f"[{d['ci_low']:+.2f}, {d['ci_high']:+.2f}] over prompts); its drafts agree with the recorded "
                      f"ones at {entry['agreement']:.0%} of steps",
                      {"variant": name, **{k: d[k] for k in ("rate_a", "rate_b", "delta", "ci_low", "ci_high",
                                                              "n_prompts")}})
        link = ViewRef.of("compare", trace=trace, trace_b=entry["trace"]) if entry["trace"] else None
        found.append(Finding("convention", ERROR if strong else WARNING, HIGH if strong else MEDIUM,
                             f"{conv.as_if}: replaying with {name} raises acceptance {d['rate_a']:.2f} -> "
                             f"{d['rate_b']:.2f}", (ev,), Fix(conv.fix_kind, conv.fix, key=name.partition("=")[0],
                                                              value=name.partition("=")[2] or None),
                             link, subject=name, expected=d["rate_b"], actual=d["rate_a"]))
    agree, _ = agreement(res)
    numbers["baseline_agreement"] = agree
    numbers["baseline_h_next_rel_err_max"] = summ.baseline_h_next_rel_err_max
    nc = summ.numerics
    numbers["baseline_numerics"] = nc
    weights = summ.drafter_weights or {}
    div = divergence_finding(nc, agree, summ.to_dict(), weights, trace=trace)
    if div is not None:
        found.append(div)
    if base_rate is not None:
        numbers["baseline_acceptance_rate"] = base_rate
    return found, numbers


def expected_agreement_text(nc: Mapping[str, Any], agree: float | None, weights: Mapping[str, Any]) -> str:
    """One sentence: the agreement the numerics lead to expect on this sample and the measured one, with the
    near ties (:func:`mtpscope.traces.run.replay.numerics_check`'s ``nc``); the drafter's matrix types
    (``weights``: ``drafter_weights`` of a replay) name the activation rounding. Empty when not judged."""
    if not nc.get("judged") or agree is None:
        return ""
    mats = weights.get("matrices") or {}
    types = ", ".join(f"{t} x{c}" for t, c in mats.items())
    why = (f"its matrices ({types}) multiply activations rounded to "
           + ", ".join(sorted({VEC_DOT_NAMES.get(t, t) for t in mats})) if mats else "")
    if not nc["n_differ"]:
        tail = "no draft differs"
    else:
        tail = (f"of the rounds whose drafts differ, {nc['near_ties']} first differ at a near tie the numerics explain "
                f"and {nc['unexplained']} beyond it")
    return (f"expected agreement at least {nc['expected_agreement']:.1%} (steps whose top-2 logit margin exceeds "
            f"{NEAR_TIE_FACTOR:g}x the step's numerical effect{'; ' + why if why else ''}), measured {agree:.1%} "
            f"(the recorded drafts, llama.cpp's, that the reference drafter reading this file drafts alike); {tail}")


#: the activation type of a weight type in words (for :func:`expected_agreement_text`)
VEC_DOT_NAMES = {t: f"{a} ({t} weights)" for t, a in VEC_DOT_TYPES.items() if a not in ("F16", "BF16")}
VEC_DOT_NAMES.update({"F16": "F16 (F16 weights)", "BF16": "BF16 (BF16 weights)", "F32": "F32 (F32 weights)"})


def divergence_finding(nc: Mapping[str, Any], agree: float | None, summ: Mapping[str, Any],
                       weights: Mapping[str, Any], *, trace: str) -> Finding | None:
    """The runtime-divergence finding of a replay's numerics (module docstring), or None when every difference
    is a near tie (or the replay was not judged).

    Severity: an error when the unexplained first differences reach :data:`DIVERGENCE_ERROR_SHARE` of the
    replayed rounds, else a warning; confidence high from 3 unexplained differences, else low (one or two steps).
    """
    if not nc.get("judged") or not nc.get("unexplained"):
        return None
    u, n_rounds = int(nc["unexplained"]), max(1, int(summ.get("n_rounds") or 0))
    first = nc["first_unexplained"]
    herr = summ.get("baseline_h_next_rel_err_max")
    h = f"; h_next differs from the recorded one by up to {herr:.2g} (relative)" if herr is not None else ""
    err = u / n_rounds >= DIVERGENCE_ERROR_SHARE
    return Finding(
        "runtime_divergence", ERROR if err else WARNING, HIGH if u >= 3 else LOW,
        f"llama.cpp's drafts differ from the reference drafter's reading of the same file at {u} of {n_rounds} "
        "replayed rounds where rounding cannot explain it",
        (Evidence("replay", f"the baseline replay (the recorder's conventions, with ggml's roundings emulated) "
                            f"reproduces {agree:.1%} of {summ['n_steps']} recorded drafts; "
                            f"{expected_agreement_text(nc, agree, weights)}; first unexplained difference at prompt "
                            f"{first['prompt_id']}, round {first['round']}, draft {first['k']}{h}",
                  {"agreement": agree, **first, "h_next_rel_err_max": herr, "unexplained": u,
                   "near_ties": nc["near_ties"], "expected_agreement": nc["expected_agreement"],
                   "near_tie_factor": NEAR_TIE_FACTOR}),),
        Fix("reconvert", "a tensor or key that llama.cpp reads otherwise than its documented meaning: run `mtpscope "
            "verify` and compare the file with a known good conversion (`mtpscope diff`)"),
        ViewRef.of("step", trace=trace, prompt=first["prompt_id"], round=first["round"], step=first["k"]),
        subject="baseline agreement", expected=nc["expected_agreement"], actual=agree)


__all__ = ["AGREEMENT_MIN", "DIVERGENCE_ERROR_SHARE", "divergence_finding", "expected_agreement_text", "CONVENTIONS", "MIN_RISE", "Convention", "agreement",
           "convention_variants", "rise", "run_variants", "sample_prompts", "variant_findings"]
