"""Step 5 of ``diagnose``: replay the trace under each convention variant and read what recovers acceptance.

One job: choose the variants and the sample of rounds, run :func:`mtpscope.traces.run.replay.replay` once over
that sample, and turn its per-round would-be acceptance into findings:

* a **convention** finding for each variant that raises acceptance clearly: the paired bootstrap interval over
  prompts of ``rate(variant) - rate(baseline)`` (:func:`mtpscope.traces.analysis.align.bootstrap_delta`) lies
  above 0 and the rise is at least :data:`MIN_RISE`. It names in words the mismatch the variant stands for
  (:data:`CONVENTIONS`: "the drafter behaves as if fed the pre-norm hidden state ...");
* a **runtime divergence** finding when the baseline (the recorder's own conventions) does not reproduce the drafts
  llama.cpp recorded: fewer than :data:`AGREEMENT_MIN` of the steps agree.

The variants: every value of the reference drafter's conventions (``position``, ``hidden``, ``gelu``, and ``head``
when a centroid head is at hand) other than the baseline's (docs/FIDELITY.md, "StepOptions"); a value added to the
reference later is replayed too, with generic words.

The sample: up to :data:`N_PROMPTS` prompts taken in turn from each category (the shortest prompts of each
first: a replay prefills every prompt it replays, and that prefill is most of its time), each prompt's first
:data:`ROUNDS_PER_PROMPT` rounds (the prefill then covers only those tokens).

Imports: numpy, inspector.reference (the convention values), traces.analysis.align (``bootstrap_delta``),
traces.run.replay, and this area's records.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mtpscope.inspector.reference import GELUS, HIDDENS, POSITIONS, StepOptions
from mtpscope.traces.analysis.align import bootstrap_delta
from mtpscope.traces.diagnose.records import ERROR, HIGH, MEDIUM, WARNING, Evidence, Finding, Fix, ViewRef
from mtpscope.traces.run.replay import ReplayResult, replay

#: A variant "recovers" acceptance when it raises it by at least this much (absolute), its interval above 0.
MIN_RISE = 0.03
#: The baseline must reproduce at least this share of the recorded drafts; below, llama.cpp and the reference
#: read the file differently (near ties flip a few drafts at most: docs/FIDELITY.md, "Tolerances").
AGREEMENT_MIN = 0.98
#: The sample replayed: prompts (in turn from each category) and rounds per prompt.
N_PROMPTS, ROUNDS_PER_PROMPT = 8, 6


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
    numbers: dict[str, Any] = {"n_rounds": summ["n_rounds"], "n_steps": summ["n_steps"],
                               "n_prompts": int(res.rounds["prompt_id"].nunique()) if len(res.rounds) else 0,
                               "recorded": summ["recorded"], "variants": {}}
    base_rate = summ["variants"].get("baseline", {}).get("acceptance_rate")
    rows = []
    for name, v in summ["variants"].items():
        entry = {"options": v["options"], "acceptance_rate": v["acceptance_rate"], "agreement": v["agreement"],
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
        ev = Evidence("replay", f"replaying {summ['n_rounds']} rounds of {numbers['n_prompts']} prompts with {name} "
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
    agree, first = agreement(res)
    numbers["baseline_agreement"] = agree
    numbers["baseline_h_next_rel_err_max"] = summ.get("baseline_h_next_rel_err_max")
    if agree is not None and agree < AGREEMENT_MIN and first is not None:
        herr = summ.get("baseline_h_next_rel_err_max")
        h = f"; h_next differs from the recorded one by up to {herr:.2g} (relative)" if herr is not None else ""
        found.append(Finding(
            "runtime_divergence", ERROR if agree < 0.9 else WARNING, HIGH if agree < 0.9 else MEDIUM,
            f"llama.cpp's drafts differ from the reference drafter's reading of the same file at {1 - agree:.0%} of "
            "steps", (Evidence("replay", f"the baseline replay (the recorder's conventions) reproduces {agree:.1%} of "
                               f"{summ['n_steps']} recorded drafts (at least {AGREEMENT_MIN:.0%} expected); first "
                               f"difference at prompt {first['prompt_id']}, round {first['round']}, draft {first['k']}{h}",
                               {"agreement": agree, **first, "h_next_rel_err_max": herr}),),
            Fix("reconvert", "a tensor or key that llama.cpp reads otherwise than its documented meaning: run `mtpscope "
                "verify` and compare the file with a known good conversion (`mtpscope diff`)"),
            ViewRef.of("step", trace=trace, prompt=first["prompt_id"], round=first["round"], step=first["k"]),
            subject="baseline agreement", expected=1.0, actual=agree))
    if base_rate is not None:
        numbers["baseline_acceptance_rate"] = base_rate
    return found, numbers


__all__ = ["AGREEMENT_MIN", "CONVENTIONS", "MIN_RISE", "N_PROMPTS", "ROUNDS_PER_PROMPT", "Convention", "agreement",
           "convention_variants", "rise", "run_variants", "sample_prompts", "variant_findings"]
