"""Hugging Face side of a drafter: config.json, safetensors headers, HF → GGUF names, audit.

Torch is not needed. This is the one safetensors parser of mtpscope: a safetensors file starts with an
8-byte little-endian header length ``N`` followed by ``N`` bytes of JSON ``{name: {"dtype", "shape",
"data_offsets"}, ..., "__metadata__": {...}}`` then the raw little-endian data (the safetensors format
spec). :func:`read_safetensors_header` reads only the header; :func:`tensor_array` /
:func:`read_tensors` / :func:`read_safetensors` return a tensor's data as a numpy view over a memory map
of the file, using that parsed header (BF16, which numpy lacks, widened to float32: a copy). Sharded
checkpoints are followed through ``model.safetensors.index.json`` (``{"weight_map": {name: file}}``).

Name mapping (docs/reference/gemma4-assistant-facts.md §2; upstream conversion/gemma.py
``Gemma4AssistantModel``): ``model.embed_tokens`` → ``token_embd``, ``model.norm`` → ``output_norm``,
``pre_projection`` / ``post_projection`` → ``mtp.*`` (fork) or ``nextn.*`` (upstream),
``model.layers.{i}.self_attn.{q_proj,q_norm,o_proj}`` → ``blk.{i}.{attn_q,attn_q_norm,attn_output}``,
``input_layernorm`` → ``attn_norm``, ``post_attention_layernorm`` → ``post_attention_norm``,
``pre_feedforward_layernorm`` → ``ffn_norm``, ``post_feedforward_layernorm`` → ``post_ffw_norm``,
``mlp.{gate,up,down}_proj`` → ``ffn_{gate,up,down}``, ``layer_scalar`` → ``layer_output_scale``;
``masked_embedding.centroids.weight`` / ``masked_embedding.token_ordering`` → ``mtp.centroids.weight`` /
``mtp.token_ordering.weight`` (I32) in the fork and **dropped** by the upstream converter.

Shapes: HF (safetensors) shapes are numpy order; the GGUF ``ne`` of a converted tensor is the reverse
(a 0-d scalar becomes ``ne = (1,)``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtpscope.errors import HFCheckpointError
from mtpscope.inspector.paths import require_regular_file

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors reference implementation's limit
INDEX_NAME = "model.safetensors.index.json"


@dataclass(frozen=True)
class HFTensor:
    """One tensor entry of a safetensors header.

    Attributes:
        name: checkpoint name (``model.layers.0.self_attn.q_proj.weight``).
        dtype: safetensors dtype string (``BF16``, ``F32``, ``I64``).
        shape: numpy order (outermost first).
        file: the ``.safetensors`` file holding it.
        data_offsets: (begin, end) byte offsets relative to the end of the header.
        data_start: absolute byte offset of the data section in ``file`` (8 + header length).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str
    data_offsets: tuple[int, int]
    data_start: int = 0

    @property
    def offset(self) -> int:
        """Absolute byte offset of this tensor's data in ``file``."""
        return self.data_start + self.data_offsets[0]

    @property
    def ne(self) -> tuple[int, ...]:
        """The GGUF ``ne`` a converter writes for this tensor (reversed shape; scalar -> (1,))."""
        return tuple(reversed(self.shape)) if self.shape else (1,)


@dataclass(frozen=True)
class HFCheckpoint:
    """A Hugging Face checkpoint folder, headers only.

    Attributes:
        path: the folder.
        config: parsed ``config.json`` ({} when absent).
        tensors: name -> :class:`HFTensor`, over all shards.
        files: the safetensors files read.
    """

    path: str
    config: Mapping[str, Any]
    tensors: Mapping[str, HFTensor]
    files: tuple[str, ...]

    @property
    def text_config(self) -> Mapping[str, Any]:
        """``config["text_config"]`` when present (assistant configs nest it), else the config itself."""
        return text_config(self.config)


_DTYPE_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "BOOL": 1, "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}


def read_safetensors_header(path: str | os.PathLike[str]) -> dict[str, HFTensor]:
    """Parse the JSON header of one ``.safetensors`` file (no tensor data is read).

    Returns:
        name -> :class:`HFTensor` in header order (``__metadata__`` skipped).

    Raises:
        HFCheckpointError: file too short, header length beyond the file or above 100 MiB, header not
            JSON / not an object, an entry without dtype / shape / data_offsets, or data offsets beyond the
            file or not matching dtype × shape. The error names the file, offset and tensor.
    """
    p = os.fspath(path)
    try:
        size = require_regular_file(p, HFCheckpointError)
        with open(p, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise HFCheckpointError("file too short: shorter than the 8-byte header length", path=p, offset=0,
                                        expected=">= 8 bytes", actual=size)
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > MAX_HEADER_BYTES:
                raise HFCheckpointError("header length beyond the file or too large", path=p, offset=0,
                                        expected=f"<= {min(size - 8, MAX_HEADER_BYTES)}", actual=n)
            raw = fh.read(n)
    except OSError as e:
        raise HFCheckpointError(f"cannot read: {e.strerror or e}", path=p) from e
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise HFCheckpointError(f"header is not valid JSON: {e}", path=p, offset=8) from e
    if not isinstance(obj, dict):
        raise HFCheckpointError("header is not a JSON object", path=p, offset=8, actual=type(obj).__name__)
    data_len = size - 8 - n
    out: dict[str, HFTensor] = {}
    for name, ent in obj.items():
        if name == "__metadata__":
            continue
        try:
            dtype = str(ent["dtype"])
            shape = tuple(int(x) for x in ent["shape"])
            b, e = (int(x) for x in ent["data_offsets"])
        except (KeyError, TypeError, ValueError) as ex:
            raise HFCheckpointError("tensor entry lacks dtype / shape / data_offsets", path=p, offset=8,
                                    key=name) from ex
        if not 0 <= b <= e <= data_len:
            raise HFCheckpointError("data offsets out of range (beyond the end of the file)", path=p,
                                    offset=8 + n + b, key=name,
                                    expected=f"0 <= begin <= end <= {data_len}", actual=[b, e])
        item = _DTYPE_SIZES.get(dtype)
        if item is not None:
            n_el = 1
            for d in shape:
                n_el *= d
            if n_el * item != e - b:
                raise HFCheckpointError("data length does not match dtype and shape", path=p, offset=8 + n + b,
                                        key=name, expected=n_el * item, actual=e - b)
        out[name] = HFTensor(name, dtype, shape, p, (b, e), 8 + n)
    return out


#: safetensors dtype -> numpy dtype of the stored bytes (BF16 read as raw little-endian uint16)
_NP_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
              "I8": "i1", "U8": "u1", "BOOL": "?", "U16": "<u2", "U32": "<u4", "U64": "<u8"}


def _file_map(path: str) -> Any:
    import numpy as np

    try:
        return np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise HFCheckpointError(f"cannot map the file: {e}", path=path) from e


def _array(t: HFTensor, mm: Any) -> Any:
    import numpy as np

    dt = _NP_DTYPES.get(t.dtype)
    if dt is None:
        raise HFCheckpointError("unsupported safetensors dtype", path=t.file, offset=t.offset, key=t.name,
                                expected="/".join(_NP_DTYPES), actual=t.dtype)
    b, e = t.data_offsets
    start, end = t.data_start + b, t.data_start + e
    n_bytes = int(np.prod(t.shape, dtype=np.int64)) * np.dtype(dt).itemsize
    if end > mm.shape[0] or end - start != n_bytes:
        raise HFCheckpointError("tensor data out of range or of the wrong size", path=t.file, offset=start,
                                key=t.name, expected=f"{n_bytes} bytes within {mm.shape[0]}",
                                actual=f"bytes {start}..{end}")
    a = mm[start:end].view(dt).reshape(t.shape)
    if t.dtype == "BF16":                      # bf16 is the top half of an IEEE float32: exact
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return a


def tensor_array(t: HFTensor) -> Any:
    """The data of one safetensors tensor, from its parsed header entry (:func:`read_safetensors_header`).

    Returns:
        np.ndarray of numpy shape ``t.shape``: a read-only view over a memory map of ``t.file``
        (little-endian F64/F32/F16/I64/I32/I16/I8/U8/U16/U32/U64/BOOL), or for BF16 a float32 copy
        (each value's 16 bits shifted up by 16, exact).

    Raises:
        HFCheckpointError: unsupported dtype (F8_*), data beyond the file or of the wrong length (names
            file, absolute offset, tensor, expected vs actual bytes), or the file cannot be mapped.
    """
    return _array(t, _file_map(t.file))


def read_tensors(tensors: Iterable[HFTensor]) -> dict[str, Any]:
    """:func:`tensor_array` of several tensors, one memory map per file: ``{name: np.ndarray}``.

    Raises:
        HFCheckpointError: as :func:`tensor_array`.
    """
    maps: dict[str, Any] = {}
    out: dict[str, Any] = {}
    for t in tensors:
        if t.file not in maps:
            maps[t.file] = _file_map(t.file)
        out[t.name] = _array(t, maps[t.file])
    return out


def read_safetensors(path: str | os.PathLike[str]) -> dict[str, Any]:
    """All tensors of one ``.safetensors`` file, ``{name: np.ndarray}`` in header order (memmap views;
    BF16 widened to float32).

    Raises:
        HFCheckpointError: from :func:`read_safetensors_header` and :func:`tensor_array`.
    """
    return read_tensors(read_safetensors_header(path).values())


def read_config(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """``config.json`` of a checkpoint folder ({} when absent).

    Raises:
        HFCheckpointError: the file exists but is not a JSON object.
    """
    p = Path(folder) / "config.json"
    if not p.exists():
        return {}
    require_regular_file(p, HFCheckpointError)
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise HFCheckpointError(f"config.json unreadable: {e}", path=p) from e
    if not isinstance(obj, dict):
        raise HFCheckpointError("config.json is not a JSON object", path=p, actual=type(obj).__name__)
    return obj


def read_checkpoint(folder: str | os.PathLike[str]) -> HFCheckpoint:
    """Read config.json and every safetensors header of a checkpoint folder (sharded or not).

    With ``model.safetensors.index.json`` the shards it names are read and every name of its
    ``weight_map`` must be in the shard it points to; otherwise every ``*.safetensors`` in the folder.

    Raises:
        HFCheckpointError: not a folder, no safetensors, a bad index / header, a tensor in two files, or an
            index entry missing from its shard.
    """
    d = Path(folder)
    if not d.is_dir():
        raise HFCheckpointError("not a folder", path=d)
    config = read_config(d)
    index = d / INDEX_NAME
    tensors: dict[str, HFTensor] = {}
    if index.exists():
        require_regular_file(index, HFCheckpointError)
        try:
            obj = json.loads(index.read_text(encoding="utf-8"))
            wm = obj["weight_map"]
            if not isinstance(wm, dict):
                raise TypeError("weight_map is not an object")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, RecursionError) as e:
            raise HFCheckpointError(f"bad sharded index: {e!r}", path=index, key="weight_map") from e
        for name, fn in wm.items():
            # a shard is a plain file name in this folder: no other folder is ever read through an index
            if not isinstance(fn, str) or not fn or Path(fn).name != fn or fn in (".", ".."):
                raise HFCheckpointError("bad shard file name in the sharded index", path=index,
                                        key=f"weight_map.{name}", expected="a file name in the same folder",
                                        actual=repr(fn))
        files = sorted(set(wm.values()))
        headers = {}
        for fn in files:
            fp = d / fn
            if not fp.exists():
                raise HFCheckpointError("shard named by the index is missing", path=fp, key=fn)
            headers[fn] = read_safetensors_header(fp)
        for name, fn in wm.items():
            t = headers[fn].get(name)
            if t is None:
                raise HFCheckpointError("index names a tensor its shard does not contain", path=d / fn, key=name)
            tensors[name] = t
        paths = tuple(str(d / fn) for fn in files)
    else:
        paths = tuple(str(p) for p in sorted(d.glob("*.safetensors")))
        if not paths:
            raise HFCheckpointError("no *.safetensors files and no index", path=d)
        for fp in paths:
            for name, t in read_safetensors_header(fp).items():
                if name in tensors:
                    raise HFCheckpointError("tensor present in two files", path=fp, key=name,
                                            actual=[tensors[name].file, fp])
                tensors[name] = t
    return HFCheckpoint(str(d), config, tensors, paths)


# --- names -------------------------------------------------------------------------------------------

_LAYER_MAP = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "layer_scalar": "layer_output_scale.weight",
    "layer_scalar.weight": "layer_output_scale.weight",
}
_GLOBAL_MAP: dict[str, dict[str, str | None]] = {
    "model.embed_tokens.weight": {"fork": "token_embd.weight", "upstream": "token_embd.weight"},
    "model.norm.weight": {"fork": "output_norm.weight", "upstream": "output_norm.weight"},
    "pre_projection.weight": {"fork": "mtp.pre_projection.weight", "upstream": "nextn.pre_projection.weight"},
    "post_projection.weight": {"fork": "mtp.post_projection.weight", "upstream": "nextn.post_projection.weight"},
    "masked_embedding.centroids.weight": {"fork": "mtp.centroids.weight", "upstream": None},
    "masked_embedding.token_ordering": {"fork": "mtp.token_ordering.weight", "upstream": None},
    "lm_head.weight": {"fork": "output.weight", "upstream": None},
}
_DROP_REASON = {
    "masked_embedding.centroids.weight": "the upstream converter drops masked_embedding.* (the centroid head)",
    "masked_embedding.token_ordering": "the upstream converter drops masked_embedding.* (the centroid head)",
    "lm_head.weight": "the upstream drafter ties its LM head to token_embd (no output tensor)",
}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# GGUF tensors converters generate without an HF source
GENERATED = {"rope_freqs.weight": "generated by the converter from rope_parameters (proportional RoPE)"}


def gguf_name(hf_name: str, dialect: str) -> str | None:
    """GGUF name of an HF checkpoint tensor in ``dialect`` (``fork`` / ``upstream``).

    Returns:
        the GGUF name; None when that dialect's converter drops the tensor (see :func:`drop_reason`).

    Raises:
        KeyError: a name mtpscope cannot map.
    """
    if dialect not in ("fork", "upstream"):
        raise ValueError(f"dialect must be 'fork' or 'upstream', got {dialect!r}")
    if hf_name in _GLOBAL_MAP:
        return _GLOBAL_MAP[hf_name][dialect]
    m = _LAYER_RE.match(hf_name)
    if m and m.group(2) in _LAYER_MAP:
        return f"blk.{m.group(1)}.{_LAYER_MAP[m.group(2)]}"
    raise KeyError(hf_name)


def drop_reason(hf_name: str) -> str:
    """Why the upstream converter drops ``hf_name`` ("" if it does not)."""
    return _DROP_REASON.get(hf_name, "")


# --- config.json -------------------------------------------------------------------------------------
# The one reading of a Gemma 4 text config (a ``gemma4_text`` config, or the ``text_config`` of an
# assistant / multimodal config). Defaults are transformers 5.24's ``Gemma4TextConfig`` ones.

#: Gemma4TextConfig defaults (transformers 5.24 configuration_gemma4.py) for absent fields
TEXT_DEFAULTS: Mapping[str, Any] = {
    "vocab_size": 262144, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 30,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "global_head_dim": 512,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "sliding_window": 512,
}
#: fields the converter cannot do without
CONVERT_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
#: fields a drafter layout (:func:`hparams_from_config`) cannot do without
LAYOUT_REQUIRED = ("num_hidden_layers", "layer_types", "head_dim", "num_key_value_heads", "num_attention_heads",
                   "intermediate_size", "hidden_size", "vocab_size")


@dataclass(frozen=True)
class TextHParams:
    """What a Gemma 4 text config says, per layer where it varies (see :func:`text_hparams`).

    Attributes:
        n_vocab / n_embd / n_ff / n_layer / n_head: ``vocab_size`` / ``hidden_size`` /
            ``intermediate_size`` / ``num_hidden_layers`` / ``num_attention_heads``.
        n_head_kv: KV heads of each layer, length n_layer.
        is_swa: per layer, True for ``sliding_attention``, length n_layer.
        head_dim_swa / head_dim_full: head dims of sliding / full-attention layers.
        sliding_window: tokens; eps: RMSNorm epsilon.
        rope_base_swa / rope_base_full: RoPE theta of sliding / full layers.
        partial_rotary_factor: share of the full layers' rotary pairs that rotate (proportional RoPE).
        k_eq_v: ``attention_k_eq_v``; context_length: ``max_position_embeddings``;
        softcap: ``final_logit_softcapping`` or None.
        stated: names of the attributes above that config.json states (directly, through
            ``per_layer_config`` or, for n_head_kv, through ``num_key_value_heads`` + ``layer_types``);
            the others hold transformers' defaults.
    """

    n_vocab: int
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_head_kv: tuple[int, ...]
    is_swa: tuple[bool, ...]
    head_dim_swa: int
    head_dim_full: int
    sliding_window: int
    eps: float
    rope_base_swa: float
    rope_base_full: float
    partial_rotary_factor: float
    k_eq_v: bool
    context_length: int
    softcap: float | None
    stated: frozenset[str] = frozenset()

    @property
    def rope_freqs(self) -> Any:
        """``(head_dim_full/2,)`` float32 numpy: 1.0 for the rotated pairs, 1e30 for the rest (what
        llama.cpp's converter writes as ``rope_freqs.weight`` for proportional RoPE)."""
        import numpy as np

        half = self.head_dim_full // 2
        n_rot = int(self.partial_rotary_factor * self.head_dim_full // 2)
        return np.array([1.0] * n_rot + [1e30] * (half - n_rot), np.float32)


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """``config["text_config"]`` when present (assistant / multimodal configs nest it), else ``config``."""
    tc = config.get("text_config")
    return tc if isinstance(tc, Mapping) else config


def _rope_parameters(tc: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """``(sliding_attention, full_attention)`` sub-dicts of ``rope_parameters`` ({} where absent)."""
    rp = tc.get("rope_parameters")
    rp = rp if isinstance(rp, Mapping) else {}
    swa, full = rp.get("sliding_attention"), rp.get("full_attention")
    return (swa if isinstance(swa, Mapping) else {}), (full if isinstance(full, Mapping) else {})


def text_hparams(tc: Mapping[str, Any], where: str | os.PathLike[str] = "config.json", *,
                 require: tuple[str, ...] = CONVERT_REQUIRED) -> TextHParams:
    """Read a Gemma 4 text config dict the way transformers 5.24 does (the one reading in mtpscope).

    Full-attention layers: head dim ``global_head_dim`` (default 512); KV heads
    ``num_global_key_value_heads`` when ``attention_k_eq_v`` is true, else ``num_key_value_heads``
    (transformers ``Gemma4TextConfig.__post_init__``). A config saved by transformers 5.24 spells these as
    ``per_layer_config {"il": {"head_dim", "num_key_value_heads"}}`` instead; those overrides win
    (``head_dim`` on full layers, ``num_key_value_heads`` on any layer). Absent ``layer_types`` default
    to 5 sliding : 1 full; other absent fields to :data:`TEXT_DEFAULTS`.

    Args:
        tc: the text config (use :func:`text_config` on a nested config).
        where: the file named in errors.
        require: config fields that must be present (:data:`CONVERT_REQUIRED`, :data:`LAYOUT_REQUIRED`, ()).

    Raises:
        HFCheckpointError: a required field is missing, an integer field is not an integer, ``layer_types``
            has not ``num_hidden_layers`` entries, or a bad ``per_layer_config`` entry.
    """
    stated: set[str] = set()

    def num(k: str, attr: str | None, kind: type = int) -> Any:
        v = tc.get(k)
        if v is None:
            if k in require:
                raise HFCheckpointError("config.json field missing or not an integer", path=where, key=k,
                                        expected=kind.__name__, actual=None)
            return TEXT_DEFAULTS[k]
        ok = isinstance(v, int) if kind is int else isinstance(v, int | float)
        if not ok or isinstance(v, bool):
            raise HFCheckpointError(f"config.json field not {'an integer' if kind is int else 'a number'}",
                                    path=where, key=k, expected=kind.__name__, actual=v)
        if attr:
            stated.add(attr)
        return kind(v)

    n_layer = num("num_hidden_layers", "n_layer")
    types = tc.get("layer_types")
    if types is None and "layer_types" not in require:
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n_layer)]
    elif not isinstance(types, list) or len(types) != n_layer:
        raise HFCheckpointError("config.json layer_types missing or of the wrong length", path=where,
                                key="layer_types", expected=f"{n_layer} entries", actual=types)
    else:
        stated.add("is_swa")
    is_swa = tuple(t == "sliding_attention" for t in types)
    k_eq_v = bool(tc.get("attention_k_eq_v", False))
    n_kv = num("num_key_value_heads", None)
    n_kv_full = n_kv
    if tc.get("num_global_key_value_heads") is not None and k_eq_v:
        n_kv_full = num("num_global_key_value_heads", None)
    if "num_key_value_heads" in tc and "is_swa" in stated:
        stated.add("n_head_kv")
    head_dim_full = num("global_head_dim", "head_dim_full")
    kv_per_layer = [n_kv if s else n_kv_full for s in is_swa]
    plc = tc.get("per_layer_config") or {}
    if not isinstance(plc, Mapping):
        raise HFCheckpointError("per_layer_config is not an object", path=where, key="per_layer_config",
                                expected="{layer index: {head_dim, num_key_value_heads}}", actual=plc)
    for key, over in plc.items():
        try:
            il = int(key)
        except (TypeError, ValueError):
            il = -1
        if not 0 <= il < n_layer or not isinstance(over, Mapping):
            raise HFCheckpointError("bad per_layer_config entry", path=where, key=f"per_layer_config.{key}",
                                    expected=f"a layer index 0..{n_layer - 1} -> object", actual=over)
        for fld in ("num_key_value_heads", "head_dim"):
            v = over.get(fld)
            if fld in over and (not isinstance(v, int) or isinstance(v, bool)):
                raise HFCheckpointError("config.json field not an integer", path=where,
                                        key=f"per_layer_config.{key}.{fld}", expected="int", actual=v)
        if "num_key_value_heads" in over:
            kv_per_layer[il] = int(over["num_key_value_heads"])
        if "head_dim" in over and not is_swa[il]:
            head_dim_full = int(over["head_dim"])
            stated.add("head_dim_full")
    swa_rp, full_rp = _rope_parameters(tc)

    def rope(sub: Mapping[str, Any], k: str, default: float, attr: str) -> float:
        v = sub.get(k)
        if isinstance(v, int | float) and not isinstance(v, bool):
            stated.add(attr)
            return float(v)
        return default

    sc = tc.get("final_logit_softcapping")
    return TextHParams(
        n_vocab=num("vocab_size", "n_vocab"), n_embd=num("hidden_size", "n_embd"),
        n_ff=num("intermediate_size", "n_ff"), n_layer=n_layer, n_head=num("num_attention_heads", "n_head"),
        n_head_kv=tuple(kv_per_layer), is_swa=is_swa, head_dim_swa=num("head_dim", "head_dim_swa"),
        head_dim_full=head_dim_full, sliding_window=num("sliding_window", "sliding_window"),
        eps=num("rms_norm_eps", "eps", float),
        rope_base_swa=rope(swa_rp, "rope_theta", 1e4, "rope_base_swa"),
        rope_base_full=rope(full_rp, "rope_theta", 1e6, "rope_base_full"),
        partial_rotary_factor=rope(full_rp, "partial_rotary_factor", 0.25, "partial_rotary_factor"),
        k_eq_v=k_eq_v, context_length=num("max_position_embeddings", "context_length"),
        softcap=float(sc) if isinstance(sc, int | float) and not isinstance(sc, bool) else None,
        stated=frozenset(stated))


def partial_rotary_factor_full(config: Mapping[str, Any]) -> float | None:
    """``rope_parameters.full_attention.partial_rotary_factor`` of the (text) config, or None."""
    v = _rope_parameters(text_config(config))[1].get("partial_rotary_factor")
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def hparams_from_config(config: Mapping[str, Any], dialect: str = "upstream") -> Any:
    """A drafter's :class:`inspector.layouts.HParams` from its HF ``config.json`` (no GGUF needed).

    Text fields through :func:`text_hparams` (``require=LAYOUT_REQUIRED``; so ``per_layer_config`` and the
    ``attention_k_eq_v`` gating of ``num_global_key_value_heads`` are honoured); from the top level
    (conversion/gemma.py): ``backbone_hidden_size`` -> n_embd_backbone, ``use_ordered_embeddings`` /
    ``num_centroids`` / ``centroid_intermediate_top_k``.

    Raises:
        HFCheckpointError: a field the layout needs is missing or not an integer.
    """
    from mtpscope.inspector import layouts as L

    hp = text_hparams(text_config(config), require=LAYOUT_REQUIRED)
    bb = config.get("backbone_hidden_size")
    if not isinstance(bb, int) or isinstance(bb, bool):
        raise HFCheckpointError("config.json field missing or not an integer", key="backbone_hidden_size",
                                expected="int", actual=bb)
    layers = tuple(L.LayerSpec(il, s, hp.n_head, hp.n_head_kv[il], hp.head_dim_swa if s else hp.head_dim_full,
                               hp.n_ff) for il, s in enumerate(hp.is_swa))
    ordered = bool(config.get("use_ordered_embeddings", False))
    return L.HParams(
        arch=L.ARCH_FORK if dialect == "fork" else L.ARCH_UPSTREAM, dialect=dialect, n_layer=hp.n_layer,
        n_embd=hp.n_embd, n_embd_backbone=bb, n_vocab=hp.n_vocab, n_vocab_source="config.json",
        head_dim_full=hp.head_dim_full, head_dim_swa=hp.head_dim_swa, layers=layers, use_ordered_embeddings=ordered,
        n_centroids=config.get("num_centroids") if ordered else None,
        centroid_top_k=config.get("centroid_intermediate_top_k") if ordered else None,
        sliding_window=hp.sliding_window if "sliding_window" in hp.stated else None)


# --- audit -------------------------------------------------------------------------------------------

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


@dataclass(frozen=True)
class HFAudit:
    """Result of :func:`audit`.

    Attributes:
        hf_dir / gguf_path / dialect: what was compared.
        rows: one :class:`AuditRow` per HF tensor, checkpoint order.
        gguf_only: GGUF tensors with no HF source -> explanation.
        config: GGUF key -> {"hf": value from config.json, "gguf": value in the file, "ok": bool}.
        findings: :class:`inspector.validate.Finding` records (codes ``H_*``).
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
    :func:`text_hparams` reads them, only those the config states (no expectation from a default)."""
    c = ckpt.config
    a = arch + "."
    exp: dict[str, Any] = {}

    def put(key: str, v: Any) -> None:
        if v is not None:
            exp[a + key] = v

    try:
        hp: TextHParams | None = text_hparams(ckpt.text_config, Path(ckpt.path) / "config.json", require=())
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
    bb = c.get("backbone_hidden_size")
    put("n_embd_backbone" if dialect == "fork" else "embedding_length_out", bb)
    if dialect == "fork":
        put("use_ordered_embeddings", c.get("use_ordered_embeddings"))
        if c.get("use_ordered_embeddings"):
            put("n_centroids", c.get("num_centroids"))
            put("centroid_top_k", c.get("centroid_intermediate_top_k"))
    else:
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
    from mtpscope.inspector import layouts as L
    from mtpscope.inspector.validate import ERROR, INFO, WARNING, _F

    if not isinstance(ckpt, HFCheckpoint):
        ckpt = read_checkpoint(ckpt)
    arch = f.architecture or ""
    dialect = L.dialect_of(arch)
    dmap = dialect if dialect in ("fork", "upstream") else "upstream"
    tmap = {t.name: t for t in f.tensors}
    rows: list[AuditRow] = []
    fs: list[Any] = []
    if dialect not in ("fork", "upstream"):
        fs.append(_F(WARNING, "H_NOT_DRAFTER", "general.architecture", "gemma4_assistant | gemma4-assistant", arch,
                     "the HF audit maps Gemma 4 assistant checkpoints; names are mapped as upstream's"))
    mapped: set[str] = set()
    cfg_layout: dict[str, Any] = {}
    if ckpt.config:
        try:
            cfg_layout = {e.name: e for e in L.expected_drafter_layout(hparams_from_config(ckpt.config, "fork"))}
        except (HFCheckpointError, L.LayoutError) as e:
            fs.append(_F(WARNING, "H_CONFIG_INCOMPLETE", e.key or "config.json", e.expected, e.actual,
                         f"no layout from config.json: {e.message}"))
    for t in ckpt.tensors.values():
        try:
            fork_name = gguf_name(t.name, "fork")
        except KeyError:
            fork_name = None
        want_cfg = cfg_layout.get(fork_name) if fork_name else None
        if want_cfg is not None and tuple(want_cfg.ne) != t.ne:
            fs.append(_F(ERROR, "H_HF_SHAPE", t.name, list(reversed(want_cfg.ne)), list(t.shape),
                         f"HF tensor {t.name} has numpy shape {list(t.shape)}; its config.json implies "
                         f"{list(reversed(want_cfg.ne))} ({want_cfg.why}, ne order)"))
        try:
            gf, gu = gguf_name(t.name, "fork"), gguf_name(t.name, "upstream")
        except KeyError:
            rows.append(AuditRow(t.name, t.dtype, t.shape, None, None, None, t.ne, None, None, "unmapped",
                                 "no known GGUF name"))
            fs.append(_F(WARNING, "H_UNMAPPED", t.name, "a known Gemma 4 assistant tensor", t.name,
                         f"HF tensor {t.name} has no known GGUF name"))
            continue
        g = gf if dmap == "fork" else gu
        if t.name == "lm_head.weight" and ckpt.config.get("tie_word_embeddings", True):
            g = None
        if g is None:
            why = drop_reason(t.name) if dmap == "upstream" else "tied to token_embd"
            rows.append(AuditRow(t.name, t.dtype, t.shape, gf, gu, None, t.ne, None, None, "dropped", why))
            fs.append(_F(INFO, "H_DROPPED", t.name, None, None, f"{t.name}: {why}"))
            continue
        mapped.add(g)
        gt = tmap.get(g)
        if gt is None:
            rows.append(AuditRow(t.name, t.dtype, t.shape, gf, gu, g, t.ne, None, None, "missing",
                                 f"{g} is not in the GGUF"))
            fs.append(_F(ERROR, "H_TENSOR_MISSING", g, list(t.ne), None,
                         f"HF tensor {t.name} (numpy shape {list(t.shape)}) should be {g}, which the GGUF lacks"))
            continue
        ne = tuple(int(x) for x in gt.ne)
        if ne != t.ne:
            note = f"expected ne {list(t.ne)} (reversed HF shape), found {list(ne)}"
            if ne == tuple(t.shape) and len(ne) == 2:
                note += ": written transposed"
            rows.append(AuditRow(t.name, t.dtype, t.shape, gf, gu, g, t.ne, ne, gt.type_name, "shape", note))
            fs.append(_F(ERROR, "H_TENSOR_SHAPE", g, list(t.ne), list(ne), f"{g} (from {t.name}): {note}"))
            continue
        note = ""
        want = expected_gguf_type(t)
        if want is not None and gt.type_name != want:
            note = f"should be {want} (HF {t.dtype}), found {gt.type_name}"
            fs.append(_F(ERROR if want == "I32" else WARNING, "H_DTYPE", g, want, gt.type_name, f"{g}: {note}"))
        rows.append(AuditRow(t.name, t.dtype, t.shape, gf, gu, g, t.ne, ne, gt.type_name, "ok", note, want))
    gguf_only = {}
    for name in tmap:
        if name not in mapped:
            gguf_only[name] = GENERATED.get(name, "no HF source tensor")
            if name not in GENERATED:
                fs.append(_F(WARNING, "H_GGUF_ONLY", name, None, list(tmap[name].ne),
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
            fs.append(_F(ERROR, "H_CONFIG_MISMATCH", key, want, have,
                         f"config.json says {want!r}, the GGUF has {have!r} for {key}"))
    return HFAudit(ckpt.path, str(getattr(f, "path", "")), dialect, tuple(rows), gguf_only, cfg, tuple(fs))
