"""The tensor inventory of a GGUF: each tensor's component and layer, totals, and the drafter dialect.

Nothing here reads tensor data: the inventory is built from the header (:class:`inspector.gguf.GGUFLike`).

Components (``TensorEntry.component``):

==================  =========================================================================
``token_embd``      ``token_embd.*`` (and ``blk.N.nextn.embed_tokens``)
``projection``      MTP / NextN projections: ``mtp.pre_projection``, ``nextn.post_projection``,
                    ``mtp_pre_proj``, ``assistant.pre_projection``, ``blk.N.nextn.eh_proj``, ...
``centroid_head``   ``mtp.centroids``, ``masked_embd_centroids``, ``mtp_centroids``, ...
``token_ordering``  ``mtp.token_ordering``, ``masked_embd_ordering``, ``mtp_token_ordering``, ...
``output_norm``     ``output_norm.*``
``output``          ``output.*`` (an untied LM head)
``rope_freqs``      ``rope_freqs.*`` (global or per layer)
``attention``       ``blk.N.attn_*`` except ``attn_norm`` (``attn_q``, ``attn_k``, ``attn_v``,
                    ``attn_output``, ``attn_qkv``, the per-head ``attn_q_norm`` / ``attn_k_norm``)
``feed_forward``    dense ``blk.N.ffn_*`` (gate, up, down)
``norm``            per-layer norms: ``attn_norm``, ``post_attention_norm``, ``ffn_norm``,
                    ``post_ffw_norm``, ``pre_ffw_norm_2``, ``post_ffw_norm_1``, ...
``layer_scale``     ``blk.N.layer_output_scale``
``moe_experts``     ``*_exps``, ``*_shexp``, the router ``ffn_gate_inp`` (and its ``.scale``)
``per_layer_embd``  Gemma per-layer embeddings: ``per_layer_token_embd``, ``per_layer_model_proj``,
                    ``per_layer_proj_norm``, ``blk.N.inp_gate``, ``blk.N.proj``, ``blk.N.post_norm``
``other``           anything else
==================  =========================================================================

The layer index is N of a ``blk.N.`` (or ``layers.N.``) prefix, else None.

Dialects (facts file section 1): fork = ``general.architecture`` ``gemma4_assistant`` with ``mtp.*``
tensors; upstream = ``gemma4-assistant`` with ``nextn.*``; target = ``gemma4``; ``other`` = a Gemma 4
MTP drafter under another name, matched by pattern (``gemma4_mtp``, ``mtp_pre_proj``, ``mtp_centroids``,
``mtp_token_ordering``, ``assistant.pre_projection``, ...); ``unknown`` = none of these.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from mtpscope.inspector.gguf import GGUFLike, TensorInfo
from mtpscope.inspector.layouts import ARCH_FORK, ARCH_TARGET, ARCH_UPSTREAM

COMPONENTS: tuple[str, ...] = (
    "token_embd", "projection", "centroid_head", "token_ordering", "output_norm", "output", "rope_freqs",
    "attention", "feed_forward", "norm", "layer_scale", "moe_experts", "per_layer_embd", "other",
)
"""Every component name, in display order."""

DIALECT_KINDS = ("fork", "upstream", "target", "other", "unknown")
#: The dialect kinds of an MTP drafter (under some name).
DRAFTER_KINDS = ("fork", "upstream", "other")

# names seen in the wild for the same drafter (facts file section 1); searched in the architecture and
# in tensor names, in this order. (pattern label, regex)
OTHER_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("gemma4_mtp", re.compile(r"gemma-?4[_-]?mtp", re.IGNORECASE)),
    ("mtp_pre_proj", re.compile(r"mtp_(pre|post)_proj")),
    ("mtp_centroids", re.compile(r"mtp_centroids")),
    ("mtp_token_ordering", re.compile(r"mtp_token_ordering")),
    ("assistant.pre_projection", re.compile(r"assistant\.(pre|post)_projection")),
    ("mtp.*", re.compile(r"^mtp\.")),
    ("nextn.*", re.compile(r"^nextn\.")),
    ("*assistant*", re.compile(r"assistant", re.IGNORECASE)),
)


@dataclass(frozen=True)
class Dialect:
    """Which GGUF dialect a file is written in.

    Attributes:
        kind: ``"fork"``, ``"upstream"``, ``"target"``, ``"other"`` or ``"unknown"``.
        arch: ``general.architecture`` (None if absent).
        evidence: what decided it, in words (keys, values, tensor-name families seen).
        pattern: for ``other``, the pattern that matched (e.g. ``"gemma4_mtp"``); else None.
    """

    kind: str
    arch: str | None
    evidence: tuple[str, ...]
    pattern: str | None = None

    @property
    def is_drafter(self) -> bool:
        """True for fork, upstream and other (an MTP drafter under some name: :data:`DRAFTER_KINDS`)."""
        return self.kind in DRAFTER_KINDS


@dataclass(frozen=True)
class TensorEntry:
    """One tensor with its classification.

    Attributes:
        tensor: the header record (shapes in ``ne`` and numpy order, offsets, sizes).
        component: one of :data:`COMPONENTS`.
        layer: layer index ``il`` for ``blk.{il}.`` tensors, else None.
    """

    tensor: TensorInfo
    component: str
    layer: int | None

    @property
    def name(self) -> str:
        """The tensor's name."""
        return self.tensor.name


@dataclass(frozen=True)
class Totals:
    """Sums over a group of tensors.

    Attributes:
        n_tensors: number of tensors.
        n_elements: sum of their element counts.
        n_bytes: sum of their data sizes in bytes (tensors of unknown ggml type count 0).
        n_unknown_size: how many tensors have an unknown ggml type (size unknown).
    """

    n_tensors: int
    n_elements: int
    n_bytes: int
    n_unknown_size: int = 0


@dataclass(frozen=True)
class Inventory:
    """The classified tensor list of one GGUF file.

    Attributes:
        path: the file.
        architecture: ``general.architecture`` or None.
        dialect: see :class:`Dialect`.
        entries: one :class:`TensorEntry` per tensor, in file order.
        by_component: :class:`Totals` per component (only components present), in :data:`COMPONENTS` order.
        by_type: :class:`Totals` per ggml type name (``"Q8_0"``), largest n_bytes first.
        n_bytes: total tensor data bytes (known types only).
    """

    path: str
    architecture: str | None
    dialect: Dialect
    entries: tuple[TensorEntry, ...]
    by_component: Mapping[str, Totals]
    by_type: Mapping[str, Totals]
    n_bytes: int

    def __repr__(self) -> str:
        return (f"Inventory(path={self.path!r}, architecture={self.architecture!r}, "
                f"dialect={self.dialect.kind!r}, n_tensors={len(self.entries)}, n_bytes={self.n_bytes})")

    @property
    def n_tensors(self) -> int:
        """Number of tensors."""
        return len(self.entries)

    @property
    def layers(self) -> tuple[int, ...]:
        """Sorted distinct layer indices."""
        return tuple(sorted({e.layer for e in self.entries if e.layer is not None}))

    def filter(self, pattern: str) -> tuple[TensorEntry, ...]:
        """Entries whose tensor name matches the shell glob ``pattern`` (``"mtp.*"``, ``"blk.3.*"``)."""
        return tuple(e for e in self.entries if fnmatch.fnmatchcase(e.tensor.name, pattern))

    def by_layer(self) -> dict[int | None, tuple[TensorEntry, ...]]:
        """Entries grouped by layer index (None = not in a layer), layers ascending, None last."""
        groups: dict[int | None, list[TensorEntry]] = {}
        for e in self.entries:
            groups.setdefault(e.layer, []).append(e)
        order = sorted(k for k in groups if k is not None) + ([None] if None in groups else [])
        return {k: tuple(groups[k]) for k in order}


# --------------------------------------------------------------------------------- classification

_LAYER_RE = re.compile(r"^(?:.*\.)?(?:blk|layers)\.(\d+)\.(.*)$")
_PER_LAYER_EMBD_GLOBAL = ("per_layer_token_embd", "per_layer_model_proj", "per_layer_proj_norm")
_PER_LAYER_EMBD_LOCAL = ("inp_gate", "proj", "post_norm")
_PROJECTION_RE = re.compile(r"(?:^|[._])(?:pre|post)_proj(?:ection)?(?:[._]|$)|(?:^|[._])eh_proj(?:[._]|$)")


def _base(name: str) -> str:
    """The name without its trailing ``.weight`` / ``.bias`` / ``.scale``."""
    for suffix in (".weight", ".bias", ".scale"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def classify(name: str) -> tuple[str, int | None]:
    """``(component, layer)`` of a tensor name (see the module docstring for the rules)."""
    m = _LAYER_RE.match(name)
    if m is not None:
        return _classify_in_layer(_base(m.group(2))), int(m.group(1))
    return _classify_global(_base(name)), None


def _classify_global(base: str) -> str:
    if base in _PER_LAYER_EMBD_GLOBAL:
        return "per_layer_embd"
    if base == "token_embd":
        return "token_embd"
    if base == "output_norm":
        return "output_norm"
    if base == "output":
        return "output"
    if base == "rope_freqs":
        return "rope_freqs"
    return _classify_mtp(base) or "other"


def _classify_mtp(base: str) -> str | None:
    if "centroid" in base:
        return "centroid_head"
    if "ordering" in base:
        return "token_ordering"
    if _PROJECTION_RE.search(base):
        return "projection"
    return None


def _classify_in_layer(base: str) -> str:
    if base.startswith("nextn."):
        sub = base[len("nextn."):]
        if sub == "embed_tokens":
            return "token_embd"
        if sub == "shared_head_head":
            return "output"
        if "norm" in sub:
            return "norm"
        return _classify_mtp(sub) or "other"
    if base.endswith("_exps") or "_shexp" in base or base.startswith("ffn_gate_inp") or base.startswith("exp_probs"):
        return "moe_experts"
    if base in ("layer_output_scale", "layer_scale"):
        return "layer_scale"
    if base in _PER_LAYER_EMBD_LOCAL:
        return "per_layer_embd"
    if base in ("attn_q_norm", "attn_k_norm"):
        return "attention"
    if "norm" in base:
        return "norm"
    if base.startswith("attn_"):
        return "attention"
    if base.startswith("ffn_"):
        return "feed_forward"
    if base == "rope_freqs":
        return "rope_freqs"
    return _classify_mtp(base) or "other"


# --------------------------------------------------------------------------------------- dialect


def detect_dialect(f: GGUFLike) -> Dialect:
    """The dialect of ``f`` from ``general.architecture`` and tensor names (facts file section 1)."""
    arch = f.architecture
    names = [t.name for t in f.tensors]
    mtp = [n for n in names if n.startswith("mtp.")]
    nextn = [n for n in names if n.startswith("nextn.")]
    evidence: list[str] = []
    if arch is not None:
        evidence.append(f"general.architecture = {arch!r}")

    def named(group: list[str]) -> str:        # the first three named; the count says how many there are
        more = len(group) - 3
        return ", ".join(group[:3]) + (f" and {more} more" if more > 0 else "")

    def families() -> None:
        if mtp:
            evidence.append(f"{len(mtp)} mtp.* tensors ({named(mtp)})")
        if nextn:
            evidence.append(f"{len(nextn)} nextn.* tensors ({named(nextn)})")

    if arch == ARCH_FORK:
        if f"{ARCH_FORK}.n_embd_backbone" in f.kv:
            evidence.append(f"key {ARCH_FORK}.n_embd_backbone")
        families()
        return Dialect("fork", arch, tuple(evidence))
    if arch == ARCH_UPSTREAM:
        if f"{ARCH_UPSTREAM}.embedding_length_out" in f.kv:
            evidence.append(f"key {ARCH_UPSTREAM}.embedding_length_out")
        families()
        return Dialect("upstream", arch, tuple(evidence))
    if arch == ARCH_TARGET:
        families()
        return Dialect("target", arch, tuple(evidence))
    for label, rx in OTHER_PATTERNS:
        if arch is not None and rx.search(arch):
            evidence.append(f"architecture {arch!r} matches {label!r}")
            return Dialect("other", arch, tuple(evidence), label)
        hit = next((n for n in names if rx.search(n)), None)
        if hit is not None:
            evidence.append(f"tensor {hit!r} matches {label!r}")
            return Dialect("other", arch, tuple(evidence), label)
    if arch is None:
        kv = getattr(f, "kv", {}).get("general.architecture")     # present, but not a string: said as such
        evidence.append("no general.architecture" if kv is None else
                        f"general.architecture is a {getattr(kv, 'type_name', '?')}, not a STRING")
    return Dialect("unknown", arch, tuple(evidence))


# ------------------------------------------------------------------------------------- inventory


def totals(entries: list[TensorEntry] | tuple[TensorEntry, ...]) -> Totals:
    """The :class:`Totals` of some entries."""
    n_el = n_b = n_unk = 0
    for e in entries:
        n_el += e.tensor.n_elements
        if e.tensor.n_bytes is None:
            n_unk += 1
        else:
            n_b += e.tensor.n_bytes
    return Totals(len(entries), n_el, n_b, n_unk)


def build_inventory(f: GGUFLike) -> Inventory:
    """Classify every tensor of ``f`` and total them; reads the header only, never tensor data.

    Args:
        f: an opened model (:func:`inspector.gguf.open_gguf`, or a split model: any
            :class:`inspector.gguf.GGUFLike`).

    Returns:
        The :class:`Inventory`.
    """
    entries: list[TensorEntry] = []
    # per component / type: [n_tensors, n_elements, n_bytes, n_unknown_size]
    by_comp: dict[str, list[int]] = {}
    by_type: dict[str, list[int]] = {}
    in_layer: dict[str, str] = {}  # classification of "blk.N.<rest>" by <rest>, computed once per rest
    for t in f.tensors:
        name = t.name
        comp = None
        if name.startswith("blk."):
            dot = name.find(".", 4)
            idx = name[4:dot]
            if dot > 4 and idx.isdigit():
                rest = name[dot + 1:]
                comp = in_layer.get(rest)
                if comp is None:
                    comp = in_layer[rest] = _classify_in_layer(_base(rest))
                layer: int | None = int(idx)
        if comp is None:
            comp, layer = classify(name)
        entries.append(TensorEntry(t, comp, layer))
        nb = t.n_bytes
        for acc in (by_comp.get(comp) or by_comp.setdefault(comp, [0, 0, 0, 0]),
                    by_type.get(t.type_name) or by_type.setdefault(t.type_name, [0, 0, 0, 0])):
            acc[0] += 1
            acc[1] += t.n_elements
            if nb is None:
                acc[3] += 1
            else:
                acc[2] += nb
    comp_totals = {c: Totals(*by_comp[c]) for c in COMPONENTS if c in by_comp}
    type_totals = dict(sorted(((k, Totals(*v)) for k, v in by_type.items()),
                              key=lambda kv: (-kv[1].n_bytes, kv[0])))
    total = sum(v[2] for v in by_type.values())
    return Inventory(f.path, f.architecture, detect_dialect(f), tuple(entries),
                     MappingProxyType(comp_totals), MappingProxyType(type_totals), total)
