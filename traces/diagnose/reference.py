"""Step 6 of ``diagnose``: the same steps through a reference drafter, and how the two files differ.

One job: with ``--reference HF_DIR`` (converted here by :func:`mtpscope.inspector.convert.convert` to an F32 upstream
GGUF: the numpy reference drafter reads GGUFs) or ``--reference-assistant GOOD.gguf``, the trace's sampled rounds are
replayed once more with the reference file as the drafter (:func:`mtpscope.traces.run.replay.replay`: same rounds,
same conventions, the same prefill of the target), then

* where the two first draft differently, and how often they agree;
* the acceptance delta ``rate(reference) - rate(file)`` with its paired interval over prompts, per category as well
  (:func:`mtpscope.traces.analysis.compare_report.compare_traces` of the two replays' baseline traces, aligned
  position by position);
* which keys and tensors differ (:func:`mtpscope.inspector.diff.diff` with sampled values): a changed ``{arch}.*``
  key is a finding of its own (a RoPE key a ``rope`` finding, another a ``metadata`` one), the reference's value the
  expected one.

The drafts' difference is a ``quantization`` finding when the file's matrices are quantized (a note unless the
reference is clearly better: the measured cost of the quantization); when only keys differ (the same tensor values)
it is the changed keys' evidence (what they cost, measured); else a ``weights`` finding.

Imports: numpy, inspector (convert, gguf: lazily), traces.analysis.align, this area's records, ``files.cause_of`` and
``variants`` (the replay and its thresholds).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.traces.analysis.align import bootstrap_delta
from mtpscope.traces.diagnose.files import cause_of
from mtpscope.traces.diagnose.records import ERROR, HIGH, INFO, MEDIUM, WARNING, Evidence, Finding, Fix, ViewRef
from mtpscope.traces.diagnose.variants import AGREEMENT_MIN, MIN_RISE, run_variants

#: ggml type-name prefixes of quantized matrices
QUANT_PREFIXES = ("Q", "IQ", "TQ")


def reference_gguf(out: str | os.PathLike[str], *, hf_dir: str | os.PathLike[str] | None = None,
                   gguf: str | os.PathLike[str] | None = None) -> tuple[Path, str]:
    """The reference drafter as a GGUF and its kind (``"hf"`` / ``"gguf"``): ``gguf`` as given, or ``hf_dir``
    converted to ``out/reference-drafter.gguf`` (upstream dialect, F32).

    Raises:
        HFCheckpointError / LayoutError: the checkpoint cannot be converted.
    """
    if gguf is not None:
        return Path(gguf), "gguf"
    from mtpscope.inspector.convert import convert  # noqa: PLC0415

    dst = Path(out) / "reference-drafter.gguf"
    dst.parent.mkdir(parents=True, exist_ok=True)
    convert(hf_dir, dst, dialect="upstream", outtype="f32")  # type: ignore[arg-type]
    return dst, "hf"


def quantized_types(path: str | os.PathLike[str]) -> list[str]:
    """The quantized ggml types among a GGUF's tensors (``["Q8_0"]``), sorted; [] for a float file."""
    from mtpscope.inspector.gguf import open_gguf  # noqa: PLC0415

    with open_gguf(path) as f:
        return sorted({t.type_name for t in f.tensors if t.type_name.startswith(QUANT_PREFIXES)})


def replay_reference(trace: str | os.PathLike[str], ref: str | os.PathLike[str], *, out: str | os.PathLike[str],
                     prompt_ids: Any, rounds_per_prompt: int | None) -> Any:
    """The sample replayed with the reference file as the drafter (baseline conventions only)."""
    return run_variants(trace, variants=(), out=out, prompt_ids=prompt_ids, rounds_per_prompt=rounds_per_prompt,
                        assistant=ref)


def _per_prompt(rounds: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    g = rounds.groupby("prompt_id", sort=True)[["n_draft", "n_accepted[baseline]"]].sum()
    return g.index.to_numpy(), g["n_draft"].to_numpy(np.float64), g["n_accepted[baseline]"].to_numpy(np.float64)


def _first_difference(a: Any, b: Any) -> tuple[float | None, dict[str, int] | None]:
    keys = ["prompt_id", "round", "k"]
    m = a[keys + ["draft[baseline]"]].merge(b[keys + ["draft[baseline]"]], on=keys, suffixes=("_a", "_b"))
    if not len(m):
        return None, None
    same = (m["draft[baseline]_a"] == m["draft[baseline]_b"]).to_numpy()
    first = None
    if not same.all():
        r = m.loc[~same].sort_values(keys).iloc[0]
        first = {k: int(r[k]) for k in keys}
    return float(same.mean()), first


def key_findings(gdiff: Any, *, assistant: str, reference: str) -> list[Finding]:
    """A finding per ``{arch}.*`` key whose value differs between the file and the reference (the reference's
    value expected), and one listing the keys only one of them has."""
    out = []
    link = ViewRef.of("validate", drafter=assistant)
    for kc in gdiff.keys_changed:
        key = kc.key.split(" | ")[0]
        if key.startswith(("general.", "tokenizer.")):
            continue
        cause = cause_of("", key)
        cause = cause if cause in ("rope", "metadata") else "metadata"
        sev = ERROR if cause == "rope" else WARNING
        out.append(Finding(cause, sev, HIGH, f"{key}: {kc.a!r} where the reference has {kc.b!r}",
                           (Evidence("reference", f"diff against {reference}: {key} {kc.a!r} (this file) vs {kc.b!r} "
                                     "(reference)", {"key": key, "file": kc.a, "reference": kc.b}),),
                           Fix("metadata", f"set {key} to {kc.b!r}", key=key, value=kc.b), link, subject=key,
                           expected=kc.b, actual=kc.a))
    only = [k for k in (*gdiff.keys_added, *gdiff.keys_removed) if not k.startswith(("general.", "tokenizer."))]
    if only:
        out.append(Finding("metadata", WARNING, MEDIUM, f"{len(only)} key(s) in only one of the file and the "
                           f"reference: {', '.join(only[:4])}",
                           (Evidence("reference", f"only in the reference: {', '.join(gdiff.keys_added) or '-'}; "
                                     f"only in this file: {', '.join(gdiff.keys_removed) or '-'}"),),
                           Fix("reconvert", "reconvert so the file carries the reference's keys"), link,
                           subject="keys present"))
    return out


def reference_findings(res_file: Any, res_ref: Any, *, trace: str, assistant: str, reference: str, kind: str,
                       gdiff: Any = None, aligned: Any = None, quantized: list[str] | None = None
                       ) -> tuple[list[Finding], dict[str, Any]]:
    """Findings of the file against the reference, and the numbers (``agreement``, ``first_difference``,
    ``delta`` with ``ci_low`` / ``ci_high``, ``by_category``, ``tensors_differ``, ``keys_differ``, ``quantized``).

    Args:
        res_file / res_ref: the replays of the same sample with the file and with the reference.
        gdiff: :func:`mtpscope.inspector.diff.diff` of the file (a) and the reference (b), with values, or None.
        aligned: :func:`compare_traces` of the two replays' baseline traces, or None.
        quantized: the file's quantized types (:func:`quantized_types`).
    """
    found: list[Finding] = []
    _, d_a, a_a = _per_prompt(res_file.rounds)
    _, d_b, a_b = _per_prompt(res_ref.rounds)
    delta = bootstrap_delta(d_a, a_a, d_b, a_b)
    agree, first = _first_difference(res_file.steps, res_ref.steps)
    tensors = [] if gdiff is None else sorted(
        ((v.name, v.rel_err_max) for v in gdiff.values if not v.identical and v.rel_err_max > 1e-6),
        key=lambda x: -x[1])
    nums: dict[str, Any] = {"kind": kind, "path": reference, "agreement": agree, "first_difference": first,
                            **{k: delta[k] for k in ("rate_a", "rate_b", "delta", "ci_low", "ci_high", "n_prompts")},
                            "by_category": None if aligned is None else aligned.delta,
                            "tensors_differ": [{"name": n, "rel_err_max": e} for n, e in tensors],
                            "keys_differ": [] if gdiff is None else [k.key for k in gdiff.keys_changed],
                            "quantized": list(quantized or [])}
    keys = key_findings(gdiff, assistant=assistant, reference=reference) if gdiff is not None else []
    if agree is None or delta["delta"] is None:
        return found + keys, nums
    where = "" if first is None else (f"; they first differ at prompt {first['prompt_id']}, round {first['round']}, "
                                      f"draft {first['k']}")
    tens = ""
    if tensors:
        tens = "; tensors that differ (sampled rows, largest relative error): " + ", ".join(
            f"{n} {e:.2g}" for n, e in tensors[:5]) + (f" and {len(tensors) - 5} more" if len(tensors) > 5 else "")
    iv = "" if delta["ci_low"] is None else f" [{delta['ci_low']:+.3f}, {delta['ci_high']:+.3f}]"
    ev = Evidence("reference", f"replaying the same {len(res_file.rounds)} rounds with the reference ({kind}: {reference}): "
                  f"acceptance {delta['rate_a']:.3f} (this file) vs {delta['rate_b']:.3f} (reference), delta "
                  f"{delta['delta']:+.3f}{iv}; drafts agree at {agree:.1%} of steps{where}{tens}",
                  {"agreement": agree, "delta": delta["delta"], "ci_low": delta["ci_low"], "ci_high": delta["ci_high"]})
    better = delta["ci_low"] is not None and delta["ci_low"] > 0 and delta["delta"] >= MIN_RISE
    link = (ViewRef.of("compare", trace=res_file.variant_traces.get("baseline"),
                       trace_b=res_ref.variant_traces.get("baseline"))
            if res_file.variant_traces.get("baseline") and res_ref.variant_traces.get("baseline") else
            ViewRef.of("explain", trace=trace, prompt="all"))
    if quantized:
        q = "/".join(quantized)
        sev = WARNING if better else INFO
        found.append(Finding("quantization", sev, HIGH if better else MEDIUM,
                             f"the {q} drafter costs {delta['delta']:+.3f}{iv} acceptance against the unquantized "
                             "reference" + ("" if better else " (within noise: no defect)"), (ev,),
                             Fix("reconvert", "convert with a wider type (--outtype f16 / bf16 / f32)" if better else
                                 "nothing to change", key="outtype", value="f16" if better else None),
                             link, subject="quantization", expected=delta["rate_b"], actual=delta["rate_a"]))
    elif (agree < AGREEMENT_MIN or better) and keys and not tensors:
        # the same weights, other keys: the drafts differ because of the keys; the replay measures what they cost
        keys = [replace(k, evidence=(*k.evidence, ev)) for k in keys]
    elif agree < AGREEMENT_MIN or better:
        sev = ERROR if better else WARNING
        found.append(Finding("weights", sev, HIGH if better else MEDIUM,
                             f"the drafter's drafts differ from the reference's at {1 - agree:.0%} of steps "
                             f"(acceptance {delta['rate_a']:.3f} vs {delta['rate_b']:.3f})", (ev,),
                             Fix("reconvert", "reconvert the drafter from the reference checkpoint (`mtpscope convert`), "
                                 "or use the reference file"), link, subject="weights",
                             expected=delta["rate_b"], actual=delta["rate_a"]))
    return keys + found, nums


__all__ = ["QUANT_PREFIXES", "key_findings", "quantized_types", "reference_findings", "reference_gguf",
           "replay_reference"]
