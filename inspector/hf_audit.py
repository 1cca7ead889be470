"""The HF audit: an HF checkpoint (headers + config.json) against the GGUF converted from it, tensor by tensor.

One job: :func:`audit` -> :class:`HFAudit` (one :class:`AuditRow` per HF tensor: its GGUF name in both
dialects, the ``ne`` a converter writes, what the GGUF has; GGUF tensors with no HF source; config.json
values vs the GGUF keys; findings with codes ``H_*``, see :data:`findings.CODES`). The checkpoint against its own
config.json goes through the one expected layout, :func:`config_layout`: the audit's ``H_HF_SHAPE`` and
:func:`checkpoint_problems` (every tensor's presence, shape and dtype, what ``convert`` refuses before writing).
That check is one loop, :func:`layout_problems` (a checkpoint's headers against a layout), which the target's
(:func:`inspector.convert_target.target_tensor_problems`) runs too.

May import: mtpscope.errors, inspector.findings, inspector.layouts, inspector.safetensors,
inspector.hf_checkpoint, inspector.hf_config, inspector.hf_names.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtpscope.errors import HFCheckpointError, LayoutError
from mtpscope.inspector import layouts as L
from mtpscope.inspector.findings import ERROR, INFO, WARNING, finding
from mtpscope.inspector.hf_checkpoint import HFCheckpoint, read_checkpoint
from mtpscope.inspector.hf_config import TextHParams, assistant_fields, hparams_from_config, text_hparams
from mtpscope.inspector.hf_names import DRAFTER_KV, GENERATED, drafter_hf_name, drop_reason, gguf_name
from mtpscope.inspector.safetensors import FLOAT_DTYPES, INTEGER_DTYPES, HFTensor


@dataclass(frozen=True)
class AuditRow:
    """One HF tensor against the GGUF.

    Attributes:
        hf_name / hf_dtype / hf_shape: from the safetensors header (numpy order).
        gguf_fork / gguf_upstream: its GGUF name in each dialect (None = dropped by that converter).
        gguf_name: its name in the audited file's dialect (None = dropped / unmappable).
        expected_ne: GGUF ``ne`` a converter writes (reversed hf_shape).
        found_ne / found_type: what the GGUF has (None when absent).
        status: ``ok``, ``missing``, ``shape``, ``dropped``, ``unmapped``.
        note: a human explanation.
    """

    hf_name: str
    hf_dtype: str
    hf_shape: tuple[int, ...]
    gguf_fork: str | None
    gguf_upstream: str | None
    gguf_name: str | None
    expected_ne: tuple[int, ...]
    found_ne: tuple[int, ...] | None
    found_type: str | None
    status: str
    note: str = ""
    expected_type: str | None = None


def expected_gguf_type(t: HFTensor) -> str | None:
    """ggml type a converter must write for ``t``: ``I32`` for the token ordering, ``F32`` for 1-D tensors
    (norms, scalars); None for matrices (any float / quantized type, the converter's outtype)."""
    if t.name == "masked_embedding.token_ordering":
        return "I32"
    if len(t.shape) <= 1:
        return "F32"
    return None


#: the GGUF-side names in :mod:`inspector.layouts`' ``why`` texts -> the config.json field each comes from
_CONFIG_FIELDS = {"n_embd_backbone": "backbone_hidden_size", "n_embd": "hidden_size", "n_vocab": "vocab_size",
                  "n_head": "num_attention_heads", "head_dim_swa": "head_dim", "head_dim_full": "global_head_dim",
                  "n_ff": "intermediate_size", "n_centroids": "num_centroids", "n_head_kv": "num_key_value_heads",
                  "n_embd_per_layer": "hidden_size_per_layer_input", "n_layer": "num_hidden_layers",
                  "n_expert": "num_experts", "n_ff_exp": "moe_intermediate_size"}
_SYMBOL = re.compile(r"\b(" + "|".join(sorted(_CONFIG_FIELDS, key=len, reverse=True)) + r")\b")


def numpy_why(e: L.ExpectedTensor) -> str:
    """Where an expected tensor's dims come from, in numpy order and config.json's names
    (``(vocab_size, hidden_size)`` for ``token_embd``'s ``ne = (n_embd, n_vocab)``); "" when the layout says none."""
    m = re.search(r"ne = \(([^)]*)\)", e.why)
    if m is None:
        return ""
    dims = [_SYMBOL.sub(lambda x: _CONFIG_FIELDS[x.group(1)], d.strip()) for d in m.group(1).split(",") if d.strip()]
    return "(" + ", ".join(reversed(dims)) + ("," if len(dims) == 1 else "") + ")"


def config_layout(config: Mapping[str, Any], where: str | os.PathLike[str] | None = "config.json"
                  ) -> dict[str, L.ExpectedTensor]:
    """The drafter tensors an assistant ``config.json`` implies, by fork-dialect GGUF name (``ne`` order):
    :func:`inspector.layouts.expected_drafter_layout` of :func:`inspector.hf_config.hparams_from_config` (the
    centroid pair with ``use_ordered_embeddings``). The one expectation a checkpoint's tensors are held to: the
    audit's ``H_HF_SHAPE`` and :func:`checkpoint_problems` (so ``convert``) both read it.

    Raises:
        HFCheckpointError: a config field the layout needs is missing, mistyped or out of range.
        LayoutError: no layout from these hyperparameters.
    """
    return _layout(config, "fork", where)[1]


def _layout(config: Mapping[str, Any], dialect: str, where: str | os.PathLike[str] | None
            ) -> tuple[L.HParams, dict[str, L.ExpectedTensor]]:
    hp = hparams_from_config(config, dialect, where)
    return hp, {e.name: e for e in L.expected_drafter_layout(hp, dialect)}


@dataclass(frozen=True)
class TensorProblem:
    """One way a checkpoint's tensor disagrees with its config.json (:func:`layout_problems`).

    Attributes:
        hf_name: the checkpoint's tensor name (for a missing one, the name it should have).
        path: the safetensors file holding it (a missing tensor: the file, or the folder of a sharded checkpoint).
        message: what is wrong, in words; expected / actual: shape (numpy order) or dtype, as text.
    """

    hf_name: str
    path: str
    message: str
    expected: Any = None
    actual: Any = None


def refuse_problems(problems: list[TensorProblem]) -> None:
    """Raise the first problem as one :class:`~mtpscope.errors.HFCheckpointError` (file, tensor, expected vs got),
    saying how many more there are; nothing when there is none."""
    if problems:
        p = problems[0]
        more = f" ({len(problems) - 1} more tensor problem{'s' if len(problems) > 2 else ''} after it)" \
            if len(problems) > 1 else ""
        raise HFCheckpointError(p.message + more, path=p.path, key=p.hf_name, expected=p.expected, actual=p.actual)


def _dtypes_ok(e: L.ExpectedTensor) -> tuple[str, ...]:
    """The safetensors dtypes a tensor of this layout entry may have: integers for the token ordering (ids), floats
    for everything else (the converter writes them as F32, F16, BF16 or Q8_0)."""
    if e.ggml_types is not None and all(t in L.INTEGER_TYPES for t in e.ggml_types):
        return INTEGER_DTYPES
    return FLOAT_DTYPES


def layout_problems(headers: Iterable[HFTensor], layout: Mapping[str, L.ExpectedTensor], n_layer: int, folder: str,
                    *, gguf_of: Callable[[str], str | None], hf_of: Callable[[str], str | None],
                    required: Callable[[L.ExpectedTensor], bool], family: str) -> list[TensorProblem]:
    """THE check of a checkpoint's tensors against the layout its config implies, from the headers alone (no data
    read); the drafter's (:func:`checkpoint_problems`) and the target's
    (:func:`inspector.convert_target.target_tensor_problems`) are this loop with their own names and layout.

    Every tensor the converter writes (``gguf_of`` gives its GGUF name; None: left out) is in the layout, else it is
    refused as a name the mapping does not know (``gguf_of`` raises ``KeyError``), a layer past ``n_layer`` or a
    tensor the config does not enable; its shape is the reverse of the layout's ``ne`` (:attr:`HFTensor.ne`; one
    stored transposed says so); its dtype is of its kind (integer ids for the token ordering, floats otherwise);
    every tensor ``required`` says the converter needs is there (``hf_of``: its HF name).

    Args:
        headers: the checkpoint's safetensors header entries.
        layout: GGUF name -> expected tensor.
        n_layer: the config's ``num_hidden_layers``.
        folder: the checkpoint folder, where a missing tensor is placed when the tensors span several files.
        family: the model family named for an unknown tensor name (``assistant``, ``text model``).

    Returns:
        the problems, checkpoint order, then the missing tensors in layout order ([] = the checkpoint converts).
    """
    out: list[TensorProblem] = []
    seen: set[str] = set()
    files: set[str] = set()
    for t in headers:
        files.add(t.file)
        try:
            g = gguf_of(t.name)
        except KeyError:
            out.append(TensorProblem(t.name, t.file, "tensor name the converter does not know",
                                     f"a Gemma 4 {family} tensor name", repr(t.name)))
            continue
        if g is None:
            continue
        e = layout.get(g)
        if e is None:
            m = re.match(r"blk\.(\d+)\.", g)
            if m is not None and int(m.group(1)) >= n_layer:
                out.append(TensorProblem(t.name, t.file, f"tensor of layer {m.group(1)}, past num_hidden_layers",
                                         f"layers 0..{n_layer - 1}", f"layer {m.group(1)}"))
            else:
                out.append(TensorProblem(t.name, t.file, "tensor the model of this config.json does not have "
                                         "(one its config does not enable?)"))
            continue
        seen.add(g)
        if t.ne != e.ne:
            transposed = len(e.ne) == 2 and tuple(t.shape) == e.ne
            out.append(TensorProblem(t.name, t.file, "tensor shape disagrees with config.json"
                                     + (" (stored transposed)" if transposed else ""),
                                     f"{list(reversed(e.ne))} = {numpy_why(e)}", list(t.shape)))
            continue
        ok = _dtypes_ok(e)
        if t.dtype not in ok:
            kind = "an integer type (token ids)" if ok is INTEGER_DTYPES else "a floating-point type (weights)"
            out.append(TensorProblem(t.name, t.file, f"tensor dtype is not {kind}", "/".join(ok), t.dtype))
    missing_at = next(iter(files)) if len(files) == 1 else folder
    for name, e in layout.items():
        if name in seen or name in GENERATED or not required(e):
            continue
        out.append(TensorProblem(hf_of(name) or name, missing_at, "required tensor missing",
                                 f"{list(reversed(e.ne))} = {numpy_why(e)}, {'/'.join(_dtypes_ok(e))}", "absent"))
    return out


def checkpoint_problems(ckpt: HFCheckpoint, dialect: str = "fork", *, centroid_head: bool | None = None,
                        where: str | os.PathLike[str] | None = None) -> list[TensorProblem]:
    """Every tensor of a drafter checkpoint against what its config.json implies (:func:`config_layout`), from the
    headers alone (:func:`layout_problems`): each tensor the converter writes has the shape (numpy order, the
    reverse of the layout's ``ne``) and a dtype of its kind (floats; integer ids for the token ordering); no tensor
    lies outside the layout (a layer past ``num_hidden_layers``, a name the mapping does not know); every tensor
    ``dialect`` requires is there. Left out as the converter leaves them out: ``lm_head`` (tied), the K/V tensors
    (:data:`inspector.hf_names.DRAFTER_KV`), the centroid head when ``use_ordered_embeddings`` is false.

    Args:
        ckpt: the checkpoint's headers and config.
        dialect: ``fork`` or ``upstream`` (which tensors are required: upstream needs ``layer_output_scale``).
        centroid_head: whether the centroid head is written, so required (default: in the fork dialect); when it
            is not, a head that is there is still checked.
        where: the config.json named in config errors (default: the checkpoint's).

    Returns:
        the problems, checkpoint order, then the missing tensors in layout order ([] = the checkpoint converts).

    Raises:
        HFCheckpointError / LayoutError: the config itself gives no layout (see :func:`config_layout`).
    """
    where = where if where is not None else Path(ckpt.path) / "config.json"
    hp, lay = _layout(ckpt.config, "fork", where)
    up_required: dict[str, bool] = {}
    if dialect == "upstream":
        up_required = {name: e.required for name, e in _layout(ckpt.config, "upstream", where)[1].items()}
    head = dialect == "fork" if centroid_head is None else centroid_head

    def required(e: L.ExpectedTensor) -> bool:
        if e.component in ("centroid_head", "token_ordering"):
            return head and e.required
        if dialect == "upstream":
            return up_required.get(L.FORK_TO_UPSTREAM.get(e.name, e.name), e.required)
        return e.required

    def gguf_of(name: str) -> str | None:
        if name == "lm_head.weight" or name.endswith(DRAFTER_KV):
            return None
        g = gguf_name(name, "fork")
        if g in (L.FORK_CENTROIDS, L.FORK_ORDERING) and g not in lay:
            return None                         # use_ordered_embeddings is false: the head is not converted
        return g

    return layout_problems(ckpt.tensors.values(), lay, hp.n_layer, ckpt.path, gguf_of=gguf_of, hf_of=drafter_hf_name,
                           required=required, family="assistant")


@dataclass(frozen=True)
class HFAudit:
    """Result of :func:`audit`.

    Attributes:
        hf_dir / gguf_path / dialect: what was compared.
        rows: one :class:`AuditRow` per HF tensor, checkpoint order.
        gguf_only: GGUF tensors with no HF source -> explanation.
        config: GGUF key -> {"hf": value from config.json, "gguf": value in the file, "ok": bool}.
        findings: :class:`findings.Finding` records (codes ``H_*``).
    """

    hf_dir: str
    gguf_path: str
    dialect: str
    rows: tuple[AuditRow, ...]
    gguf_only: Mapping[str, str]
    config: Mapping[str, Mapping[str, Any]]
    findings: tuple[Any, ...] = field(default=())

    @property
    def dropped(self) -> tuple[AuditRow, ...]:
        """Rows the converter of this dialect dropped."""
        return tuple(r for r in self.rows if r.status == "dropped")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict."""
        return {"hf_dir": self.hf_dir, "gguf_path": self.gguf_path, "dialect": self.dialect,
                "rows": [dataclasses.asdict(r) for r in self.rows], "gguf_only": dict(self.gguf_only),
                "config": {k: dict(v) for k, v in self.config.items()},
                "findings": [f.to_dict() for f in self.findings]}


def _config_expectations(ckpt: HFCheckpoint, arch: str, dialect: str) -> dict[str, Any]:
    """GGUF key -> value the converter writes from config.json (conversion/gemma.py); text fields as
    :func:`text_hparams` reads them, only those the config states (no expectation from a default); the assistant's
    own fields as :func:`inspector.hf_config.assistant_fields` reads them (the one reading; its defaults are what
    the converter writes), none of them when it refuses the config (the layout check reports that once)."""
    c = ckpt.config
    a = arch + "."
    exp: dict[str, Any] = {}

    def put(key: str, v: Any) -> None:
        if v is not None:
            exp[a + key] = v

    where = Path(ckpt.path) / "config.json"
    try:
        hp: TextHParams | None = text_hparams(ckpt.text_config, where, require=())
    except HFCheckpointError:
        hp = None                              # reported by the layout check (H_CONFIG_INCOMPLETE)
    s = hp.stated if hp is not None else frozenset()

    def said(attr: str) -> Any:
        return getattr(hp, attr) if attr in s else None

    put("embedding_length", said("n_embd"))
    put("block_count", said("n_layer"))
    put("feed_forward_length", said("n_ff"))
    put("attention.head_count", said("n_head"))
    put("attention.key_length_swa", said("head_dim_swa"))
    put("attention.key_length", said("head_dim_full"))
    put("attention.sliding_window", said("sliding_window"))
    if hp is not None and "is_swa" in s:
        put("attention.sliding_window_pattern", list(hp.is_swa))
        put("attention.head_count_kv", list(hp.n_head_kv) if "n_head_kv" in s else None)
    put("attention.layer_norm_rms_epsilon", said("eps"))
    put("rope.freq_base", said("rope_base_full"))
    put("rope.freq_base_swa", said("rope_base_swa"))
    try:                                       # the assistant's own fields as the converter reads (and writes) them
        af = assistant_fields(c, hp.n_vocab, where) if hp is not None else None
    except HFCheckpointError:
        af = None                              # reported once, by the layout check (H_CONFIG_INCOMPLETE)
    if af is not None:
        put("n_embd_backbone" if dialect == "fork" else "embedding_length_out", af.n_embd_backbone)
        if dialect == "fork":
            put("use_ordered_embeddings", af.use_ordered_embeddings)
            if af.use_ordered_embeddings:
                put("n_centroids", af.n_centroids)
                put("centroid_top_k", af.centroid_top_k)
    if dialect != "fork":
        put("nextn_predict_layers", said("n_layer"))
    if said("n_vocab") is not None:
        exp["n_vocab"] = hp.n_vocab if hp is not None else None
    return exp


def audit(ckpt: HFCheckpoint | str | os.PathLike[str], f: Any) -> HFAudit:
    """Compare an HF checkpoint (headers + config) with a converted GGUF drafter, tensor by tensor.

    For every HF tensor: its GGUF name in both dialects, the ``ne`` a converter writes (reversed numpy
    shape), what the GGUF has, and whether this dialect's converter dropped it; GGUF tensors with no HF
    source; config.json values vs the GGUF keys.

    Args:
        ckpt: :class:`HFCheckpoint` or a folder path.
        f: an open GGUF (inspector/gguf.py) of arch ``gemma4_assistant`` or ``gemma4-assistant``.

    Raises:
        HFCheckpointError: an unreadable folder (when a path is given).
    """
    if not isinstance(ckpt, HFCheckpoint):
        ckpt = read_checkpoint(ckpt)
    arch = f.architecture or ""
    dialect = L.dialect_of(arch)
    dmap = dialect if dialect in ("fork", "upstream") else "upstream"
    tmap = {t.name: t for t in f.tensors}
    rows: list[AuditRow] = []
    fs: list[Any] = []
    if dialect not in ("fork", "upstream"):
        fs.append(finding(WARNING, "H_NOT_DRAFTER", "general.architecture", f"{L.ARCH_FORK} | {L.ARCH_UPSTREAM}", arch,
                     "the HF audit maps Gemma 4 assistant checkpoints; names are mapped as upstream's"))
    mapped: set[str] = set()
    cfg_layout: dict[str, Any] = {}
    if ckpt.config:
        try:
            cfg_layout = config_layout(ckpt.config, Path(ckpt.path) / "config.json")
        except (HFCheckpointError, LayoutError) as e:
            fs.append(finding(WARNING, "H_CONFIG_INCOMPLETE", e.key or "config.json", e.expected, e.actual,
                         f"no layout from config.json: {e.message}"))
    for t in ckpt.tensors.values():
        try:
            fork_name = gguf_name(t.name, "fork")
        except KeyError:
            fork_name = None
        want_cfg = cfg_layout.get(fork_name) if fork_name else None
        if want_cfg is not None and tuple(want_cfg.ne) != t.ne:
            fs.append(finding(ERROR, "H_HF_SHAPE", t.name, list(reversed(want_cfg.ne)), list(t.shape),
                         f"HF tensor {t.name} has numpy shape {list(t.shape)}; its config.json implies "
                         f"{list(reversed(want_cfg.ne))} ({want_cfg.why}, ne order)"))
        try:
            gf, gu = gguf_name(t.name, "fork"), gguf_name(t.name, "upstream")
        except KeyError:
            rows.append(AuditRow(t.name, t.dtype, t.shape, None, None, None, t.ne, None, None, "unmapped",
                                 "no known GGUF name"))
            fs.append(finding(WARNING, "H_UNMAPPED", t.name, "a known Gemma 4 assistant tensor", t.name,
                         f"HF tensor {t.name} has no known GGUF name"))
            continue
        g = gf if dmap == "fork" else gu
        if t.name == "lm_head.weight" and ckpt.config.get("tie_word_embeddings", True):
            g = None
        if g is None:
            why = drop_reason(t.name) if dmap == "upstream" else "tied to token_embd"
            rows.append(AuditRow(t.name, t.dtype, t.shape, gf, gu, None, t.ne, None, None, "dropped", why))
            fs.append(finding(INFO, "H_DROPPED", t.name, None, None, f"{t.name}: {why}"))
            continue
        mapped.add(g)
        gt = tmap.get(g)
        if gt is None:
            rows.append(AuditRow(t.name, t.dtype, t.shape, gf, gu, g, t.ne, None, None, "missing",
                                 f"{g} is not in the GGUF"))
            fs.append(finding(ERROR, "H_TENSOR_MISSING", g, list(t.ne), None,
                         f"HF tensor {t.name} (numpy shape {list(t.shape)}) should be {g}, which the GGUF lacks"))
            continue
        ne = tuple(int(x) for x in gt.ne)
        if ne != t.ne:
            note = f"expected ne {list(t.ne)} (reversed HF shape), found {list(ne)}"
            if ne == tuple(t.shape) and len(ne) == 2:
                note += ": written transposed"
            rows.append(AuditRow(t.name, t.dtype, t.shape, gf, gu, g, t.ne, ne, gt.type_name, "shape", note))
            fs.append(finding(ERROR, "H_TENSOR_SHAPE", g, list(t.ne), list(ne), f"{g} (from {t.name}): {note}"))
            continue
        note = ""
        want = expected_gguf_type(t)
        if want is not None and gt.type_name != want:
            note = f"should be {want} (HF {t.dtype}), found {gt.type_name}"
            fs.append(finding(ERROR if want == "I32" else WARNING, "H_DTYPE", g, want, gt.type_name, f"{g}: {note}"))
        rows.append(AuditRow(t.name, t.dtype, t.shape, gf, gu, g, t.ne, ne, gt.type_name, "ok", note, want))
    gguf_only = {}
    for name in tmap:
        if name not in mapped:
            gguf_only[name] = GENERATED.get(name, "no HF source tensor")
            if name not in GENERATED:
                fs.append(finding(WARNING, "H_GGUF_ONLY", name, None, list(tmap[name].ne),
                             f"GGUF tensor {name} has no source in the HF checkpoint"))
    # config vs keys
    cfg: dict[str, dict[str, Any]] = {}
    for key, want in _config_expectations(ckpt, arch, dmap).items():
        if key == "n_vocab":
            toks = f.get("tokenizer.ggml.tokens")
            have = len(toks) if toks is not None else None
        else:
            have = L._scalar(f.get(key))
        if isinstance(want, float):
            ok = isinstance(have, int | float) and abs(have - want) <= 1e-6 * max(1.0, abs(want))
        elif isinstance(want, list) and isinstance(have, int) and not isinstance(have, bool):
            ok = all(w == have for w in want)        # one value for every layer written as a scalar
        else:
            ok = have == want
        cfg[key] = {"hf": want, "gguf": have, "ok": ok}
        if not ok:
            fs.append(finding(ERROR, "H_CONFIG_MISMATCH", key, want, have,
                         f"config.json says {want!r}, the GGUF has {have!r} for {key}"))
    return HFAudit(ckpt.path, str(getattr(f, "path", "")), dialect, tuple(rows), gguf_only, cfg, tuple(fs))


__all__ = ["AuditRow", "HFAudit", "TensorProblem", "audit", "checkpoint_problems", "config_layout",
           "expected_gguf_type", "layout_problems", "numpy_why", "refuse_problems"]
