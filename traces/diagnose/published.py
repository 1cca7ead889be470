"""Step 2 of ``diagnose``: the drafter's metadata against the published Gemma 4 assistant configurations.

One job: compare a drafter GGUF's hyperparameter keys with the keys our converter writes from each published
``config.json`` in ``sample_configs/`` (:func:`mtpscope.inspector.config_model.model_from_config`, which reads
them through :mod:`mtpscope.inspector.hf_config`), the variant picked by the drafter's geometry.

Two groups of values (docs/DIAGNOSE.md, "metadata against the published configurations"):

* **scale-free** values every drafter shares whatever its size: the RoPE bases, the RMS norm epsilon, the share
  of each head that RoPE rotates (``rope.dimension_count`` / ``attention.key_length``, per layer type), the
  full / sliding head-dim ratio, the logit soft-cap (none in any published drafter) and an embedding scale
  key (the runtime scales by sqrt(n_embd_backbone) itself). A value no published variant has is a finding;
* **geometry** (widths, head dims, heads, window, layer pattern, centroid counts): checked only when the
  drafter's backbone and inner widths are a published variant's (then a differing value is a finding); a
  custom geometry (the demo, a small test model) is reported as such, not as a defect.

Imports: inspector.config_model, inspector.hf_config, inspector.gguf (lazily), and this area's records.
"""

from __future__ import annotations

import functools
import importlib.resources
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtpscope.inspector.config_model import model_from_config
from mtpscope.inspector.hf_config import read_config
from mtpscope.traces.diagnose.records import ERROR, HIGH, INFO, MEDIUM, WARNING, Evidence, Finding, Fix, ViewRef

#: Scale-free keys (suffixes after the architecture): ``(key, cause, severity, minor)``: a value within a factor
#: ``minor`` of a published one is only a note (an RMS norm epsilon sits far under the mean square of the
#: activations it is added to: 5e-7 or 1e-5 instead of 1e-6 changes no draft; 1e-2 does); None: never minor.
SCALE_FREE = (("rope.freq_base", "rope", ERROR, None), ("rope.freq_base_swa", "rope", ERROR, None),
              ("attention.layer_norm_rms_epsilon", "metadata", WARNING, 10.0))
#: Scale-free ratios: ``(name, numerator key, denominator key, cause, severity)``.
RATIOS = (("rotated share of a full head", "rope.dimension_count", "attention.key_length", "rope", ERROR),
          ("rotated share of a sliding head", "rope.dimension_count_swa", "attention.key_length_swa", "rope", ERROR),
          ("full / sliding head dim", "attention.key_length", "attention.key_length_swa", "metadata", WARNING))
#: Geometry keys: compared only when the drafter's widths are a published variant's.
GEOMETRY = ("embedding_length", "embedding_length_out", "feed_forward_length", "block_count", "attention.head_count",
            "attention.head_count_kv", "attention.key_length", "attention.key_length_swa", "attention.value_length",
            "attention.value_length_swa", "attention.sliding_window", "attention.sliding_window_pattern",
            "n_centroids", "centroid_top_k")
#: The widths that decide whether a drafter has a published variant's geometry.
MATCH_KEYS = ("embedding_length_out", "embedding_length")
SOFTCAP = "final_logit_softcapping"
#: fork-dialect names of upstream keys
_ALIASES = {"n_embd_backbone": "embedding_length_out"}


@dataclass(frozen=True)
class Variant:
    """One published assistant: its folder name and the converter's keys (suffixes after the architecture),
    with ``n_centroids`` / ``centroid_top_k`` from its ``config.json``."""

    name: str
    values: dict[str, Any]


def configs_dir() -> Path:
    """The packaged ``sample_configs`` folder."""
    return Path(str(importlib.resources.files("mtpscope.sample_configs")))


@functools.lru_cache(maxsize=4)
def published_variants(folder: str | None = None) -> tuple[Variant, ...]:
    """Every ``*-assistant`` configuration under ``folder`` (default :func:`configs_dir`), as the keys the
    converter writes from it.

    Raises:
        HFCheckpointError: an unreadable ``config.json``.
    """
    root = Path(folder) if folder is not None else configs_dir()
    out = []
    for d in sorted(p for p in root.iterdir() if p.is_dir() and p.name.endswith("-assistant")):
        m = model_from_config(d)
        vals = _suffixes(m.architecture, m.kv)
        cfg = read_config(d)
        if cfg.get("use_ordered_embeddings"):
            vals["n_centroids"] = int(cfg.get("num_centroids", 2048))
            vals["centroid_top_k"] = int(cfg.get("centroid_intermediate_top_k", 32))
        out.append(Variant(d.name, vals))
    return tuple(out)


def _plain(v: Any) -> Any:
    return v.to_list() if hasattr(v, "to_list") else v


def _suffixes(arch: str | None, kv: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    pre = f"{arch}."
    for k in kv:
        if arch and k.startswith(pre):
            s = k[len(pre):]
            out[_ALIASES.get(s, s)] = _plain(kv[k].value if hasattr(kv[k], "value") else kv[k])
    if isinstance(out.get("attention.head_count_kv"), int) and isinstance(out.get("block_count"), int):
        out["attention.head_count_kv"] = [out["attention.head_count_kv"]] * out["block_count"]
    return out


def drafter_values(f: Any) -> dict[str, Any]:
    """A drafter GGUF's ``{arch}.*`` keys by suffix (fork names mapped to upstream's; ``head_count_kv`` per
    layer)."""
    return _suffixes(f.architecture, {k: f.get(k) for k in f.kv})


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-5)
    return bool(a == b)


def pick_variant(values: dict[str, Any], variants: tuple[Variant, ...]) -> tuple[Variant, bool]:
    """The published variant nearest the drafter's geometry (most equal :data:`GEOMETRY` values; ties by name)
    and whether the drafter has its geometry (equal :data:`MATCH_KEYS`)."""
    def score(v: Variant) -> int:
        return sum(1 for k in GEOMETRY if k in values and k in v.values and _same(values[k], v.values[k]))

    best = max(variants, key=lambda v: (score(v), [-ord(c) for c in v.name]))
    return best, all(k in values and _same(values[k], best.values.get(k)) for k in MATCH_KEYS)


def _ratio(values: dict[str, Any], a: str, b: str) -> float | None:
    x, y = values.get(a), values.get(b)
    if isinstance(x, (int, float)) and isinstance(y, (int, float)) and y:
        return float(x) / float(y)
    return None


def _names(variants: tuple[Variant, ...]) -> str:
    return ", ".join(v.name.replace("gemma-4-", "").replace("-it-assistant", "") for v in variants)


def published_findings(f: Any, *, assistant: str, target: str | None = None,
                       folder: str | None = None) -> tuple[list[Finding], dict[str, Any]]:
    """Findings of a drafter's metadata against the published configurations, and what was checked.

    Args:
        f: the open drafter GGUF (either dialect).
        assistant / target: paths, for the findings' links.
        folder: the configurations (default the packaged ``sample_configs``).

    Returns:
        ``(findings, summary)``; ``summary``: ``variant`` (the nearest published drafter), ``matched`` (its
        geometry), ``checked`` (``[{key, group, value, published, ok}]``), ``custom`` (geometry values that
        differ, for a custom geometry).
    """
    variants = published_variants(folder)
    vals = drafter_values(f)
    best, matched = pick_variant(vals, variants)
    link = ViewRef.of("validate", drafter=assistant, target=target)
    arch = f.architecture or "?"
    names = _names(variants)
    found: list[Finding] = []
    checked: list[dict[str, Any]] = []
    where = (f"the published {best.name} (this drafter's geometry)" if matched else
             f"every published Gemma 4 drafter ({names})")

    def add(key: str, group: str, value: Any, published: list[Any], ok: bool) -> None:
        checked.append({"key": key, "group": group, "value": value, "published": published, "ok": ok})

    for key, cause, sev, minor in SCALE_FREE:
        if key not in vals:
            continue
        pub = sorted({v.values[key] for v in variants if key in v.values}, key=str)
        ok = any(_same(vals[key], p) for p in pub)
        add(key, "scale-free", vals[key], pub, ok)
        if not ok and pub:
            want = best.values.get(key, pub[0])
            if minor is not None and isinstance(vals[key], (int, float)) and vals[key] > 0 and \
                    any(p / minor <= vals[key] <= p * minor for p in pub):
                sev = INFO
            found.append(Finding(
                cause, sev, HIGH, f"{arch}.{key} = {vals[key]!r}: no published Gemma 4 drafter has it (expected {want!r})",
                (Evidence("published", f"{arch}.{key} = {vals[key]!r} where {where} has "
                          f"{' / '.join(map(repr, pub))}", {"key": key, "value": vals[key], "published": pub}),),
                Fix("metadata", f"set {arch}.{key} to {want!r}", key=f"{arch}.{key}", value=want), link,
                subject=f"{arch}.{key}", expected=want, actual=vals[key]))
    for name, a, b, cause, sev in RATIOS:
        r = _ratio(vals, a, b)
        if r is None:
            continue
        pub = sorted({x for v in variants if (x := _ratio(v.values, a, b)) is not None})
        ok = any(_same(r, p) for p in pub)
        add(f"{a} / {b}", "scale-free", r, pub, ok)
        if not ok and pub:
            want = pub[0] * float(vals[b])
            found.append(Finding(
                cause, sev, HIGH, f"{arch}.{a} = {vals[a]!r}: the {name} is {r:g}, {' / '.join(f'{p:g}' for p in pub)} "
                f"in every published drafter (expected {want:g})",
                (Evidence("published", f"{a} / {b} = {vals[a]} / {vals[b]} = {r:g}; {where}: "
                          f"{' / '.join(f'{p:g}' for p in pub)}", {"ratio": r, "published": pub}),),
                Fix("metadata", f"set {arch}.{a} to {want:g}", key=f"{arch}.{a}", value=want), link,
                subject=f"{arch}.{a}", expected=want, actual=vals[a]))
    if SOFTCAP in vals:
        add(SOFTCAP, "scale-free", vals[SOFTCAP], [None], False)
        found.append(Finding(
            "metadata", INFO, HIGH, f"{arch}.{SOFTCAP} = {vals[SOFTCAP]!r}: no published drafter soft-caps its logits",
            (Evidence("published", "published assistants have final_logit_softcapping null; tanh soft-capping is "
                      "monotonic, so greedy drafts do not change (probabilities do)", {"value": vals[SOFTCAP]}),),
            Fix("metadata", f"remove {arch}.{SOFTCAP}", key=f"{arch}.{SOFTCAP}", value=None), link,
            subject=f"{arch}.{SOFTCAP}", expected=None, actual=vals[SOFTCAP]))
    scale = next((k for k in vals if "embedding_scale" in k or "embd_scale" in k), None)
    n_bb = vals.get("embedding_length_out")
    if scale is not None and isinstance(n_bb, int):
        want = math.sqrt(n_bb)
        ok = _same(vals[scale], want)
        add(scale, "scale-free", vals[scale], [want], ok)
        if not ok:
            found.append(Finding(
                "metadata", WARNING, MEDIUM, f"{arch}.{scale} = {vals[scale]!r}: the embedding scale is sqrt(n_embd_backbone) "
                f"= {want:g}", (Evidence("published", f"every Gemma 4 drafter scales the target's embedding by "
                                          f"sqrt({n_bb}) = {want:g}", {"value": vals[scale], "expected": want}),),
                Fix("metadata", f"set {arch}.{scale} to {want:g}", key=f"{arch}.{scale}", value=want), link,
                subject=f"{arch}.{scale}", expected=want, actual=vals[scale]))
    custom = []
    for key in GEOMETRY:
        if key not in vals or key not in best.values:
            continue
        ok = _same(vals[key], best.values[key])
        add(key, "geometry", vals[key], [best.values[key]], ok)
        if ok:
            continue
        if matched:
            found.append(Finding(
                "metadata", WARNING, MEDIUM, f"{arch}.{key} = {vals[key]!r} where the published {best.name} has "
                f"{best.values[key]!r}",
                (Evidence("published", f"the drafter's widths are {best.name}'s (embedding_length_out "
                          f"{vals.get('embedding_length_out')}, embedding_length {vals.get('embedding_length')}) but "
                          f"{key} differs", {"key": key, "value": vals[key], "published": best.values[key]}),),
                Fix("metadata", f"set {arch}.{key} to {best.values[key]!r} (or reconvert from the published "
                    "checkpoint)", key=f"{arch}.{key}", value=best.values[key]), link,
                subject=f"{arch}.{key}", expected=best.values[key], actual=vals[key]))
        else:
            custom.append(key)
    summary = {"variant": best.name, "matched": matched, "checked": checked, "custom": custom,
               "embedding_scale": None if not isinstance(n_bb, int) else math.sqrt(n_bb)}
    return found, summary


def open_and_check(path: str, *, target: str | None = None) -> tuple[list[Finding], dict[str, Any]]:
    """:func:`published_findings` of the drafter GGUF at ``path``.

    Raises:
        GGUFFormatError / UnsupportedFileError: unreadable file.
    """
    from mtpscope.inspector.gguf import open_gguf

    with open_gguf(path) as f:
        return published_findings(f, assistant=path, target=target)


__all__ = ["GEOMETRY", "MATCH_KEYS", "RATIOS", "SCALE_FREE", "Variant", "configs_dir", "drafter_values",
           "open_and_check", "pick_variant", "published_findings", "published_variants"]
