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
the replay is the changed keys' evidence (what they cost, measured: something or nothing); else ``weights``
findings: one per tensor whose difference is a known conversion mistake (:func:`tensor_pattern`: the two halves of
its rows or columns exchanged, a norm off by exactly 1, the gate holding the up projection, transposed, all zero),
one for the differences it does not recognise (the tensor that differs most and its relative error named). Their
severity follows one rule, :func:`weights_severity` (docs/DIAGNOSE.md, "Severity of a weights finding").

The same comparison of two replays measures a key that differs from the target's (step 5, ``run.diagnose``): a copy
of the drafter with the target's value (:func:`mtpscope.traces.diagnose.files.with_key_value`) is the "reference",
:func:`replay_delta` compares the two replays and :func:`mtpscope.traces.diagnose.files.key_cost` says what it did.

Imports: numpy, inspector (convert, gguf: lazily), traces.analysis.align, this area's records, ``files`` (``cause_of``,
``effect``) and ``variants`` (the replay and its thresholds).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.inspector.diff import row_rel_err
from mtpscope.traces.analysis.align import AlignedDiff, bootstrap_delta
from mtpscope.traces.diagnose.files import EFFECT_WORDS, cause_of, effect
from mtpscope.traces.diagnose.records import ERROR, HIGH, INFO, LOW, MEDIUM, WARNING, Evidence, Finding, Fix, ViewRef
from mtpscope.traces.diagnose.variants import AGREEMENT_MIN, MIN_RISE, run_variants

#: ggml type-name prefixes of quantized matrices
QUANT_PREFIXES = ("Q", "IQ", "TQ")
#: Two tensors' values count as equal (:func:`tensor_pattern`) when every compared row's relative error
#: ``||a - b||_2 / max(||a||_2, ||b||_2)`` (the measure of :func:`mtpscope.inspector.diff.diff` with values) is under
#: this. A float type's rounding stays below it (BF16 keeps 8 significant bits: at most 2^-8 = 0.004 relative per
#: element; F16 11 bits: 2^-11), while a tensor of another checkpoint or a wrong conversion typically differs by 0.1
#: and more. Tensors that differ from the reference's by less are rounding, not a difference
#: :func:`reference_findings` names.
MATCH_REL = 0.01
#: Rows compared per tensor by :func:`tensor_pattern` (evenly spaced over the outermost numpy dimension, first and
#: last row included, so both halves of the rows are in the sample).
PATTERN_ROWS = 16
#: Square tensors of at most this many elements are checked for a transpose (the reference's tensor read whole:
#: 4 Mi elements, 32 MiB as float64); larger ones are not.
TRANSPOSE_MAX_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class TensorPattern:
    """A recognised difference between a tensor of the file and the same tensor of the reference.

    Attributes:
        pattern: the id, a key of :data:`PATTERNS` (``rows_halves_swapped``, ``norm_plus_one``, ...).
        tensor: the file's tensor name.
        words: what the file holds, in words ("the two halves of its rows are exchanged: ...").
        fix: what to change.
        rel_err_max: the largest relative error of the compared rows once the pattern is undone (under
            :data:`MATCH_REL`).
        rows_compared / rows_total: rows of the outermost numpy dimension compared / in the tensor.
    """

    pattern: str
    tensor: str
    words: str
    fix: str
    rel_err_max: float
    rows_compared: int
    rows_total: int


#: The recognised patterns: id -> (what the file holds, what to change); ``{t}`` the tensor, ``{n}`` / ``{h}`` its
#: rows or columns and half of them, ``{other}`` the tensor it was taken from.
PATTERNS: dict[str, tuple[str, str]] = {
    "zero": ("its values are all zero where the reference's are not (the {n} compared rows)",
             "the converter wrote no values into {t}: reconvert it from the checkpoint"),
    "norm_plus_one": ("it equals the reference's + 1: the Gemma \"1 + w\" norm shift is applied once more than in "
                      "the reference (twice, or to a checkpoint that already stores the scale)",
                      "subtract 1 from {t}: reconvert without adding 1 to this norm's weight"),
    "norm_minus_one": ("it equals the reference's - 1: the Gemma \"1 + w\" norm shift the reference carries is not "
                       "applied", "add 1 to {t}: reconvert with the \"1 + w\" shift on this norm's weight"),
    "rows_halves_swapped": ("the two halves of its rows are exchanged: its rows [0, {h}) hold the reference's rows "
                            "[{h}, {n}) and back (a projection split or fused in the wrong order)",
                            "exchange the two halves of {t}'s rows back: reconvert with the reference's order of "
                            "its output rows"),
    "cols_halves_swapped": ("the two halves of its columns (inputs) are exchanged: its columns [0, {h}) hold the "
                            "reference's columns [{h}, {n}) and back (its two inputs concatenated in the wrong order)",
                            "exchange the two halves of {t}'s columns back: reconvert with the reference's order of "
                            "its inputs"),
    "gate_is_up": ("it equals the reference's {other}: the up projection was written into the gate",
                   "write {t} from the checkpoint's gate projection, not its up projection"),
    "up_is_gate": ("it equals the reference's {other}: the gate projection was written into the up projection",
                   "write {t} from the checkpoint's up projection, not its gate projection"),
    "gate_up_swapped": ("it equals the reference's {other}, and the file's {other} the reference's {t}: gate and up "
                        "are exchanged", "exchange {t} and {other} (reconvert with gate and up in the right order)"),
    "transposed": ("it equals the reference's transposed", "transpose {t} back: reconvert it in the reference's "
                   "(out, in) order"),
}


def reference_gguf(out: str | os.PathLike[str], *, hf_dir: str | os.PathLike[str] | None = None,
                   gguf: str | os.PathLike[str] | None = None) -> tuple[Path, str]:
    """The reference drafter as a GGUF and its kind (``"hf"`` / ``"gguf"``): ``gguf`` as given, or ``hf_dir``
    converted to ``out/reference-drafter.gguf`` (upstream dialect, F32).

    Raises:
        HFCheckpointError / LayoutError: the checkpoint cannot be converted.
    """
    if gguf is not None:
        return Path(gguf), "gguf"
    from mtpscope.inspector.convert import convert

    dst = Path(out) / "reference-drafter.gguf"
    dst.parent.mkdir(parents=True, exist_ok=True)
    convert(hf_dir, dst, dialect="upstream", outtype="f32")  # type: ignore[arg-type]  # the callers give hf_dir or gguf: hf_dir here
    return dst, "hf"


def quantized_types(path: str | os.PathLike[str]) -> list[str]:
    """The quantized ggml types among a GGUF's tensors (``["Q8_0"]``), sorted; [] for a float file."""
    from mtpscope.inspector.gguf import open_gguf

    with open_gguf(path) as f:
        return sorted({t.type_name for t in f.tensors if t.type_name.startswith(QUANT_PREFIXES)})


def _rows(f: Any, name: str, idx: np.ndarray | None) -> np.ndarray:
    """Rows ``idx`` of a tensor (outermost numpy dimension) as float64, shape ``(len(idx), row size)``; a 1-D
    tensor (``idx`` None) is one row, read whole."""
    if idx is None:
        return np.asarray(f.tensor_data(name), dtype=np.float64).reshape(1, -1)
    return np.stack([np.asarray(f.tensor_data(name, rows=int(i)), dtype=np.float64).ravel() for i in idx])


def _rel_max(x: np.ndarray, y: np.ndarray) -> float:
    """The largest row relative error ``||x - y|| / max(||x||, ||y||)`` (0 for two zero rows)."""
    return float(row_rel_err(x, y).max()) if len(x) else 0.0


def _partner(name: str) -> tuple[str, str] | None:
    """(the gate / up partner of a feed-forward tensor's name, ``"gate"`` / ``"up"``), else None."""
    if "ffn_gate" in name:
        return name.replace("ffn_gate", "ffn_up"), "gate"
    if "ffn_up" in name:
        return name.replace("ffn_up", "ffn_gate"), "up"
    return None


def tensor_pattern(file: Any, reference: Any, name: str, ref_name: str | None = None, *,
                   n_rows: int = PATTERN_ROWS) -> TensorPattern | None:
    """Which known conversion mistake turns the reference's tensor into the file's, or None.

    Compares ``n_rows`` evenly spaced rows (outermost numpy dimension; a 1-D tensor whole) of the file's tensor
    with the reference's, values dequantized to float64, "equal" meaning every compared row's relative error is under
    :data:`MATCH_REL`. Checked in this order, the first that holds wins:

    * ``zero``: the file's compared rows are all zero, the reference's are not;
    * ``norm_plus_one`` / ``norm_minus_one`` (1-D tensors): file - 1 (or file + 1) equals the reference;
    * ``rows_halves_swapped``: with ``n`` rows (even), the file's row ``i`` equals the reference's row
      ``(i + n/2) mod n``;
    * ``cols_halves_swapped``: with ``m`` columns (even), each file row equals the reference's row with its two
      halves exchanged;
    * ``gate_is_up`` / ``up_is_gate`` / ``gate_up_swapped``: a ``ffn_gate`` (``ffn_up``) tensor equals the reference's
      ``ffn_up`` (``ffn_gate``) of the same layer (both exchanged: ``gate_up_swapped``);
    * ``transposed``: a square tensor of at most :data:`TRANSPOSE_MAX_ELEMENTS` equals the reference's transposed.

    Args:
        file / reference: open GGUF readers (:func:`mtpscope.inspector.gguf.open_gguf`).
        name: the tensor in the file; ref_name: its name in the reference (default ``name``).
        n_rows: rows compared per tensor.

    Returns:
        :class:`TensorPattern`, or None: the tensors differ otherwise, or their shapes differ (nothing to compare).

    Raises:
        LayoutError: no tensor of that name in one of the files.
    """
    rn = ref_name or name
    ta, tb = file.tensor(name), reference.tensor(rn)
    shape = tuple(int(x) for x in ta.shape) or (1,)
    if shape != (tuple(int(x) for x in tb.shape) or (1,)):
        return None
    one_d = len(shape) == 1
    total = 1 if one_d else shape[0]
    idx = None if one_d else np.unique(np.linspace(0, total - 1, num=min(n_rows, total)).round().astype(np.int64))
    a, b = _rows(file, name, idx), _rows(reference, rn, idx)
    n_cmp = a.shape[0]

    def found(pattern: str, err: float, n: int = 0, other: str = "") -> TensorPattern:
        words, fix = PATTERNS[pattern]
        fmt = {"t": name, "n": n, "h": n // 2, "other": other}
        return TensorPattern(pattern, name, words.format(**fmt), fix.format(**fmt), err, n_cmp, total)

    if not a.any() and b.any():
        return found("zero", 0.0, n=n_cmp)
    if one_d:
        for pattern, shift in (("norm_plus_one", 1.0), ("norm_minus_one", -1.0)):
            if (e := _rel_max(a - shift, b)) < MATCH_REL:
                return found(pattern, e)
    elif idx is not None and total % 2 == 0 and total >= 2:    # (not one_d: idx holds the compared rows)
        e = _rel_max(a, _rows(reference, rn, (idx + total // 2) % total))
        if e < MATCH_REL:
            return found("rows_halves_swapped", e, n=total)
    m = a.shape[1]
    if not one_d and m % 2 == 0 and (e := _rel_max(a, np.roll(b, m // 2, axis=1))) < MATCH_REL:
        return found("cols_halves_swapped", e, n=m)
    pa, pb = _partner(name), _partner(rn)
    if pa is not None and pb is not None and not one_d:
        fnames, rnames = {t.name for t in file.tensors}, {t.name for t in reference.tensors}
        if pa[0] in fnames and pb[0] in rnames and tuple(reference.tensor(pb[0]).shape) == shape \
                and (e := _rel_max(a, _rows(reference, pb[0], idx))) < MATCH_REL:
            back = _rel_max(_rows(file, pa[0], idx), b) < MATCH_REL
            return found("gate_up_swapped" if back else f"{pa[1]}_is_{'up' if pa[1] == 'gate' else 'gate'}",
                         e, other=pa[0])
    if not one_d and len(shape) == 2 and shape[0] == shape[1] and ta.n_elements <= TRANSPOSE_MAX_ELEMENTS:
        bt = np.asarray(reference.tensor_data(rn), dtype=np.float64).T[idx]
        if (e := _rel_max(a, bt)) < MATCH_REL:
            return found("transposed", e)
    return None


def tensor_patterns(file: str | os.PathLike[str], reference: str | os.PathLike[str], names: Any, *,
                    n_rows: int = PATTERN_ROWS) -> dict[str, TensorPattern]:
    """:func:`tensor_pattern` of each tensor in ``names`` (as :func:`mtpscope.inspector.diff.diff` names them:
    ``"name"``, or ``"file name | reference name"`` for a tensor the two dialects name differently), keyed by that
    name; tensors with no recognised pattern, or absent from either file, are left out."""
    from mtpscope.inspector.gguf import open_gguf

    out: dict[str, TensorPattern] = {}
    with open_gguf(file) as fa, open_gguf(reference) as fb:
        have_a, have_b = {t.name for t in fa.tensors}, {t.name for t in fb.tensors}
        for full in names:
            na, _, nb = full.partition(" | ")
            nb = nb or na
            if na in have_a and nb in have_b:
                p = tensor_pattern(fa, fb, na, nb, n_rows=n_rows)
                if p is not None:
                    out[full] = p
    return out


def weights_severity(*, agreement: float | None = None, ci_low: float | None = None) -> tuple[str, str]:
    """THE rule for a ``weights`` finding's severity and confidence (docs/DIAGNOSE.md, "Severity of a weights
    finding"), from the reference's replay of the sample: ``agreement`` (share of steps both files draft alike) and
    ``ci_low``, the low end of the paired 95 % bootstrap interval over prompts of ``rate(reference) - rate(file)``
    (:func:`mtpscope.traces.analysis.align.bootstrap_delta`, 2000 resamples).

    * no reference measured (``agreement`` None): ``(warning, low)``: the behaviour hints at the weights, nothing
      compared them;
    * ``ci_low`` at least :data:`~mtpscope.traces.diagnose.variants.MIN_RISE` (0.03): ``(error, high)``: the
      reference is better by 0.03 acceptance or more, 95 % sure (the error rule of a convention variant);
    * otherwise, ``ci_low`` above 0 or drafts agreeing at under
      :data:`~mtpscope.traces.diagnose.variants.AGREEMENT_MIN` (98 %) of steps: ``(warning, medium)``: the weights
      change the drafts, their cost is not shown to exceed 0.03;
    * otherwise ``(info, medium)``: no measured difference (a recognised pattern is then a note; an unrecognised
      difference no finding).
    """
    if agreement is None:
        return WARNING, LOW
    if ci_low is not None and ci_low >= MIN_RISE:
        return ERROR, HIGH
    if (ci_low is not None and ci_low > 0) or agreement < AGREEMENT_MIN:
        return WARNING, MEDIUM
    return INFO, MEDIUM


def replay_delta(res_a: Any, res_b: Any) -> dict[str, Any]:
    """Two replays of the same sample compared: :func:`bootstrap_delta`'s keys (``rate_a``, ``rate_b``, ``delta`` =
    ``rate_b - rate_a``, ``ci_low``, ``ci_high``, ``n_prompts``), ``agreement`` (share of steps whose baseline drafts
    are equal, None without common steps), ``first_difference`` (``{prompt_id, round, k}`` or None), ``n_rounds``
    and ``max_pos`` (the largest position a replayed draft step queries, ``pos + n_draft - 1``; None when unknown)."""
    _, d_a, a_a = _per_prompt(res_a.rounds)
    _, d_b, a_b = _per_prompt(res_b.rounds)
    out = dict(bootstrap_delta(d_a, a_a, d_b, a_b))
    out["agreement"], out["first_difference"] = _first_difference(res_a.steps, res_b.steps)
    out["n_rounds"] = int(len(res_a.rounds))
    r = res_a.rounds
    top = r["pos"] + r["n_draft"] - 1 if "pos" in r.columns and len(r) else None
    out["max_pos"] = None if top is None else int(top.max())
    return out


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


def key_findings(gdiff: Any, *, assistant: str, reference: str, pair_subjects: Any = ()) -> list[Finding]:
    """A finding per ``{arch}.*`` key whose value differs between the file and the reference (the reference's
    value expected), and one listing the keys only one of them has. A key in ``pair_subjects`` (the subjects of the
    ``pair_mismatch`` findings of step 1: the drafter's value differs from its target's) gets that cause, so that it
    merges with that finding (:func:`rank.merge`: one finding per key)."""
    out = []
    link = ViewRef.of("validate", drafter=assistant)
    pairs = set(pair_subjects)
    for kc in gdiff.keys_changed:
        key = kc.key.split(" | ")[0]
        if key.startswith(("general.", "tokenizer.")):
            continue
        cause = cause_of("", key)
        cause = "pair_mismatch" if key in pairs else cause if cause in ("rope", "metadata") else "metadata"
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


def _iv(m: Mapping[str, Any]) -> str:
    return "" if m.get("ci_low") is None else f" [{m['ci_low']:+.3f}, {m['ci_high']:+.3f}]"


def _replay_evidence(m: Mapping[str, Any], n_rounds: int, *, kind: str, reference: str, tensors: list[Any]) -> Evidence:
    first = m["first_difference"]
    where = "" if first is None else (f"; they first differ at prompt {first['prompt_id']}, round {first['round']}, "
                                      f"draft {first['k']}")
    tens = ""
    if tensors:
        tens = "; tensors that differ (sampled rows, largest relative error): " + ", ".join(
            f"{n} {e:.2g}" for n, e in tensors[:5]) + (f" and {len(tensors) - 5} more" if len(tensors) > 5 else "")
    return Evidence("reference", f"replaying the same {n_rounds} rounds with the reference ({kind}: {reference}): "
                    f"acceptance {m['rate_a']:.3f} (this file) vs {m['rate_b']:.3f} (reference), delta "
                    f"{m['delta']:+.3f}{_iv(m)}; this file's drafts equal the reference's at {m['agreement']:.1%} of the replayed "
                    f"steps{where}{tens}",
                    {"agreement": m["agreement"], "delta": m["delta"], "ci_low": m["ci_low"], "ci_high": m["ci_high"]})


def reference_findings(res_file: Any, res_ref: Any, *, trace: str, assistant: str, reference: str, kind: str,
                       gdiff: Any = None, aligned: AlignedDiff | None = None, quantized: list[str] | None = None,
                       file_path: str | os.PathLike[str] | None = None,
                       reference_path: str | os.PathLike[str] | None = None,
                       pair_subjects: Any = ()) -> tuple[list[Finding], dict[str, Any]]:
    """Findings of the file against the reference, and the numbers (``agreement``, ``first_difference``,
    ``delta`` with ``ci_low`` / ``ci_high``, ``by_category``, ``tensors_differ`` [{``name``, ``rel_err_max``,
    ``pattern``}], ``keys_differ``, ``quantized``).

    Args:
        res_file / res_ref: the replays of the same sample with the file and with the reference.
        gdiff: :func:`mtpscope.inspector.diff.diff` of the file (a) and the reference (b), with values, or None.
        aligned: :func:`compare_traces` of the two replays' baseline traces, or None.
        quantized: the file's quantized types (:func:`quantized_types`).
        file_path / reference_path: the two GGUFs, to recognise how a differing tensor differs
            (:func:`tensor_patterns`); without them every difference is unrecognised.
        pair_subjects: keys step 1 found differing from the target's (:func:`key_findings`).

    A difference of the weights is a finding per recognised tensor (subject: the tensor; title: the tensor and the
    pattern; fix: what to change) and one ``weights`` finding for the unrecognised differences (the tensor that differs
    most and its largest relative error in the title), all of the severity :func:`weights_severity` gives.
    """
    found: list[Finding] = []
    m = replay_delta(res_file, res_ref)
    agree = m["agreement"]
    tensors = [] if gdiff is None else sorted(
        ((v.name, v.rel_err_max) for v in gdiff.values if not v.identical and v.rel_err_max > 1e-6),
        key=lambda x: -x[1])
    real = [(n, e) for n, e in tensors if e >= MATCH_REL]
    patterns: dict[str, TensorPattern] = {}
    if file_path is not None and reference_path is not None and real and not quantized:
        patterns = tensor_patterns(file_path, reference_path, [n for n, _ in real])
    nums: dict[str, Any] = {"kind": kind, "path": reference, "agreement": agree, "first_difference": m["first_difference"],
                            **{k: m[k] for k in ("rate_a", "rate_b", "delta", "ci_low", "ci_high", "n_prompts")},
                            "by_category": None if aligned is None else {c: x.to_dict() for c, x in aligned.delta.items()},
                            "tensors_differ": [{"name": n, "rel_err_max": e,
                                                "pattern": patterns[n].pattern if n in patterns else None}
                                               for n, e in tensors],
                            "keys_differ": [] if gdiff is None else [k.key for k in gdiff.keys_changed],
                            "quantized": list(quantized or [])}
    keys = (key_findings(gdiff, assistant=assistant, reference=reference, pair_subjects=pair_subjects)
            if gdiff is not None else [])
    if agree is None or m["delta"] is None:
        return found + keys, nums
    ev = _replay_evidence(m, len(res_file.rounds), kind=kind, reference=reference, tensors=tensors)
    iv = _iv(m)
    better = m["ci_low"] is not None and m["ci_low"] > 0 and m["delta"] >= MIN_RISE
    link = (ViewRef.of("compare", trace=res_file.variant_traces.get("baseline"),
                       trace_b=res_ref.variant_traces.get("baseline"))
            if res_file.variant_traces.get("baseline") and res_ref.variant_traces.get("baseline") else
            ViewRef.of("explain", trace=trace, prompt="all"))
    if quantized:
        q = "/".join(quantized)
        sev = WARNING if better else INFO
        found.append(Finding("quantization", sev, HIGH if better else MEDIUM,
                             f"the {q} drafter costs {m['delta']:+.3f}{iv} acceptance against the unquantized "
                             "reference" + ("" if better else " (within noise: no defect)"), (ev,),
                             Fix("reconvert", "convert with a wider type (--outtype f16 / bf16 / f32)" if better else
                                 "nothing to change", key="outtype", value="f16" if better else None),
                             link, subject="quantization", expected=m["rate_b"], actual=m["rate_a"]))
        return keys + found, nums
    if keys and not real:
        # the same weights (up to rounding), other keys: the replay measures what the keys cost, something or nothing
        said = f"what the differing keys do: {EFFECT_WORDS[effect(m)]}"
        rounding = f" (and by rounding in {len(tensors)} tensor(s))" if tensors else ""
        kev = Evidence("reference", f"the reference differs from this file only in its keys "
                       f"({', '.join(nums['keys_differ'][:4])}){rounding}: {ev.text}; {said}",
                       {**ev.numbers, "effect": effect(m)})
        keys = [replace(k, evidence=(*k.evidence, kev)) for k in keys]
        return keys + found, nums
    sev, conf = weights_severity(agreement=agree, ci_low=m["ci_low"])
    measured = (f"drafts differ from the reference's at {1 - agree:.0%} of steps, acceptance {m['rate_a']:.3f} vs "
                f"{m['rate_b']:.3f} ({m['delta']:+.3f}{iv})")
    for name, p in patterns.items():
        pev = Evidence("reference", f"{name} against the reference's, {p.rows_compared} of {p.rows_total} rows "
                       f"compared: {p.words} (relative error {p.rel_err_max:.2g} once undone)",
                       {"tensor": name, "pattern": p.pattern, "rel_err_max": p.rel_err_max,
                        "rows_compared": p.rows_compared, "rows_total": p.rows_total})
        tail = measured if sev != INFO else "the replayed drafts do not change (a note)"
        found.append(Finding("weights", sev, HIGH if sev != INFO else MEDIUM, f"{name}: {p.words}; {tail}",
                             (pev, ev), Fix("reconvert", p.fix, key=name, value=p.pattern), link,
                             subject=name, expected=m["rate_b"], actual=m["rate_a"]))
    rest = [(n, e) for n, e in tensors if n not in patterns]
    if sev != INFO and (rest or not patterns):
        big = [(n, e) for n, e in rest if e >= MATCH_REL]
        if big:
            worst = (f"; {'besides the tensors named above, ' if patterns else ''}the tensor that differs most: "
                     f"{big[0][0]} (largest relative error {big[0][1]:.2g})"
                     + (f", and {len(big) - 1} more" if len(big) > 1 else ""))
        elif rest:
            worst = (f"; the tensors differ by rounding only (largest relative error {rest[0][1]:.2g}, in "
                     f"{rest[0][0]})")
        else:
            worst = ""
        found.append(Finding("weights", sev, conf, f"the drafter's {measured}{worst}", (ev,),
                             Fix("reconvert", "reconvert the drafter from the reference checkpoint (`mtpscope convert`), "
                                 "or use the reference file"), link, subject="weights",
                             expected=m["rate_b"], actual=m["rate_a"]))
    return keys + found, nums


__all__ = ["MATCH_REL", "PATTERNS", "PATTERN_ROWS", "QUANT_PREFIXES", "TRANSPOSE_MAX_ELEMENTS", "TensorPattern",
           "key_findings", "quantized_types", "reference_findings", "reference_gguf", "replay_delta", "replay_reference",
           "tensor_pattern", "tensor_patterns", "weights_severity"]
