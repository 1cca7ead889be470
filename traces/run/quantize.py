"""Quantizing a GGUF with llama.cpp's own quantizer, with its provenance in the output (``mtpscope
quantize``), and the cache of quantized copies that ``mtpscope sweep --assistant-quant`` reuses.

mtpscope has no quantizer of its own: :func:`mtpscope.traces.run.llama.model.quantize` calls
``llama_model_quantize``, which decides each tensor's type by llama.cpp's rules for the file type
(llama-quantize's names: ``q8_0``, ``q4_k_m``, ... :func:`quant_types`). What this module adds:

* the input is read first with our GGUF reader, so an unreadable file is one line naming the file and
  offset before llama.cpp sees it;
* provenance: llama.cpp copies every key of the input and writes the ``kv_overrides`` it is given into
  the new file, so the output carries :data:`PROVENANCE_KEYS` (``mtpscope.quantize.source`` = the input's
  file name, ``.source_header_sha256`` = sha256 of its bytes [0, data_offset) as a trace manifest's
  ``header_sha256``, ``.source_sha256`` = sha256 of the whole input where the caller hashed it (the
  cache does), ``.type``, ``.llama_cpp`` = the llama-cpp-python version and ggml commit). No second
  writer pass is needed;
* atomic output: llama.cpp writes a temporary file beside the output, which is renamed over it only
  after it reads back as a GGUF with the provenance keys;
* :func:`quantized_copy`: ``<cache>/quant/<sha256 of the input>/<type>.gguf``, made once per input
  content and type and reused by every later run.

:func:`weight_types` describes any GGUF's quantization (ggml types of its matrices, the provenance keys)
for the replay's agreement report.

Imports: mtpscope.errors, mtpscope.cache, mtpscope.inspector (``gguf``), traces.run.preflight
(``model_info``: the header hash); traces.run.llama (``model``, ``binding``) inside the functions that
run llama.cpp.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mtpscope.errors import MtpscopeError, TraceError

#: the metadata keys mtpscope adds to a quantized file (``source_sha256`` only when it was computed)
PROVENANCE_PREFIX = "mtpscope.quantize."
PROVENANCE_KEYS = tuple(PROVENANCE_PREFIX + k for k in
                        ("source", "source_header_sha256", "source_sha256", "type", "llama_cpp"))
#: the cache's folder (below :func:`mtpscope.cache.cache_dir`)
CACHE_FOLDER = "quant"


@dataclass(frozen=True)
class QuantizeResult:
    """One quantization.

    Attributes:
        out: the written GGUF; qtype: llama.cpp's file type name (``"q4_k_m"``); source: the input;
        provenance: the :data:`PROVENANCE_KEYS` written (key -> value); n_bytes_in / n_bytes_out: file
        sizes in bytes; tensor_types: ggml type name -> number of tensors in the output (every tensor);
        seconds: wall time of llama.cpp's call (0.0 when ``cached``); cached: the file was already in
        the cache (:func:`quantized_copy`).
    """

    out: Path
    qtype: str
    source: Path
    provenance: dict[str, str] = field(default_factory=dict)
    n_bytes_in: int = 0
    n_bytes_out: int = 0
    tensor_types: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    cached: bool = False


def quant_types() -> tuple[str, ...]:
    """llama.cpp's file types by llama-quantize's lower-case names, in llama.cpp's order (``f32``,
    ``f16``, ``q4_0``, ... ``q4_k_m``, ...; :func:`mtpscope.traces.run.llama.model.ftype_ids`).

    Raises:
        RuntimeUnavailableError: llama-cpp-python missing.
    """
    from mtpscope.traces.run.llama.model import ftype_ids

    return tuple(ftype_ids())


def check_types(names: str | list[str] | tuple[str, ...], *, key: str = "--type") -> tuple[str, ...]:
    """``"f32,q8_0"`` (or a sequence) as llama.cpp's file type names, lower-cased, in the given order.

    Raises:
        MtpscopeError: an unknown name (one line listing every valid one), an empty list or a repeat,
            naming ``key``.
        RuntimeUnavailableError: llama-cpp-python missing.
    """
    parts = [p.strip() for p in (names.split(",") if isinstance(names, str) else names)]
    parts = [p.lower() for p in parts if p]
    valid = quant_types()
    if not parts:
        raise MtpscopeError("no quantization type given", key=key, expected=", ".join(valid), actual="none")
    for p in parts:
        if p not in valid:
            raise MtpscopeError("unknown llama.cpp quantization type", key=key, expected=", ".join(valid), actual=p)
    dup = sorted({p for p in parts if parts.count(p) > 1})
    if dup:
        raise MtpscopeError("quantization types repeat", key=key, expected="distinct types", actual=", ".join(dup))
    return tuple(parts)


def llama_cpp_version() -> str:
    """``"llama-cpp-python 0.3.36, ggml <commit>"``: the quantizer that wrote a file (provenance)."""
    from mtpscope.traces.run.llama.binding import runtime_info

    info = runtime_info()
    return f"llama-cpp-python {info['llama_cpp_python']}, ggml {info['llama_cpp']}"


def _clip(text: str, n: int = 127) -> str:
    """``text`` cut to at most ``n`` bytes of UTF-8 (whole characters; llama.cpp's ``char[128]``)."""
    b = text.encode()
    return text if len(b) <= n else b[-n:].decode("utf-8", "ignore")


def _source_facts(src: Path) -> tuple[str, int]:
    """(header sha256, file size) of a readable GGUF.

    Raises:
        InspectorError: our reader's one line (file, offset) for an unreadable or malformed GGUF.
    """
    from mtpscope.inspector.gguf import open_gguf
    from mtpscope.traces.run.preflight import model_info

    with open_gguf(src) as f:
        info = model_info(f)
    return info["header_sha256"], int(info["size"])


def quantize_file(src: str | os.PathLike[str], out: str | os.PathLike[str], qtype: str, *,
                  n_threads: int = 0, overwrite: bool = False, source_sha256: str | None = None) -> QuantizeResult:
    """Quantize ``src`` to llama.cpp's file type ``qtype`` into ``out`` with the provenance keys (module
    docstring), atomically.

    Args:
        src: an F32 / F16 / BF16 GGUF (a drafter or a target).
        out: the GGUF to write; an existing file is replaced only with ``overwrite``.
        qtype: llama.cpp's file type name (:func:`quant_types`; case-insensitive).
        n_threads: quantizer threads, 0..``MAX_N_THREADS`` (0: one per core).
        overwrite: replace an existing ``out``.
        source_sha256: the input's content hash when the caller has it (written as
            ``mtpscope.quantize.source_sha256``).

    Returns:
        :class:`QuantizeResult`.

    Raises:
        InspectorError: ``src`` is not a readable GGUF (our reader's line: file, offset).
        TraceError: ``n_threads`` out of range; ``out`` exists (without ``overwrite``), is ``src`` or is not a regular file (a device,
            FIFO or folder); its folder takes no new file (the OS's reason); an unknown type (the line lists
            llama.cpp's); llama.cpp refused (its message quoted, e.g. "requantizing from type q8_0 is
            disabled"); the written file does not read back. Nothing is left at ``out`` then.
        FileNotFoundError: ``src`` is missing.
        RuntimeUnavailableError: llama-cpp-python missing.
    """
    from mtpscope.inspector.paths import file_kind
    from mtpscope.traces.run.llama.model import quantize
    from mtpscope.traces.run.record_config import MAX_N_THREADS

    src_p, out_p = Path(src), Path(out)
    name = check_types(qtype, key="type")[0]
    if not 0 <= int(n_threads) <= MAX_N_THREADS:    # (more: llama.cpp's quantizer aborts making its threads)
        raise TraceError(f"quantizer threads must be in 0..{MAX_N_THREADS} (ggml's GGML_MAX_N_THREADS; 0: one per "
                         "core)", key="n_threads", expected=f"0..{MAX_N_THREADS}", actual=n_threads)
    if out_p.exists() and out_p.resolve() == src_p.resolve():
        raise TraceError("the output would replace the input", path=out_p, expected="another file",
                         actual="the input file")
    if out_p.exists() and not out_p.is_file():  # a device, FIFO or folder is never replaced by the rename
        raise TraceError("the output is not a regular file", path=out_p, expected="a regular file (or a new name)",
                         actual=file_kind(out_p.stat().st_mode))
    if out_p.exists() and not overwrite:
        raise TraceError("the output exists (pass --overwrite to replace it)", path=out_p,
                         expected="a new file", actual="an existing file")
    header, n_in = _source_facts(src_p)
    prov = {PROVENANCE_PREFIX + "source": _clip(src_p.name), PROVENANCE_PREFIX + "source_header_sha256": header,
            PROVENANCE_PREFIX + "type": name, PROVENANCE_PREFIX + "llama_cpp": llama_cpp_version()}
    if source_sha256:
        prov[PROVENANCE_PREFIX + "source_sha256"] = source_sha256
    tmp = out_p.with_name(f".{out_p.name}.{os.getpid()}.tmp")
    try:  # the output's folder must take a new file: checked here, where the line can name the output
        out_p.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
    except OSError as e:
        raise TraceError("cannot write the output", path=out_p, expected="a writable folder",
                         actual=e.strerror or type(e).__name__) from None
    t0 = time.perf_counter()
    try:
        quantize(src_p, tmp, name, n_threads=n_threads, metadata=prov)
        seconds = time.perf_counter() - t0
        types = _check_written(tmp, prov)
        os.replace(tmp, out_p)
    finally:
        tmp.unlink(missing_ok=True)
    return QuantizeResult(out=out_p, qtype=name, source=src_p, provenance=prov, n_bytes_in=n_in,
                          n_bytes_out=out_p.stat().st_size, tensor_types=types, seconds=seconds)


def _check_written(path: Path, prov: dict[str, str]) -> dict[str, int]:
    """The tensor type counts of a file llama.cpp just wrote, after checking that our reader reads it
    and that it carries ``prov``.

    Raises:
        TraceError: unreadable, or a provenance key missing or different.
    """
    from mtpscope.inspector.gguf import open_gguf

    try:
        with open_gguf(path) as f:
            for k, v in prov.items():
                if f.get(k) != v:
                    raise TraceError("llama.cpp's output lacks a provenance key", path=path, key=k,
                                     expected=v, actual=f.get(k))
            return dict(Counter(t.type_name for t in f.tensors))
    except MtpscopeError as e:
        if isinstance(e, TraceError):
            raise
        raise TraceError(f"llama.cpp's output does not read back: {e.one_line()}", path=path) from None


def quantized_copy(src: str | os.PathLike[str], qtype: str, *, cache: str | os.PathLike[str] | None = None,
                   n_threads: int = 0, on_quantize: Callable[[str], None] | None = None) -> QuantizeResult:
    """``src`` quantized to ``qtype``, from the cache when this input content was quantized to this type
    before, else quantized now (:func:`quantize_file`) into ``<cache>/quant/<sha256 of src>/<qtype>.gguf``.

    The key is the input's content (sha256 of every byte: a retrained file with the same header is
    another input) and the type; a cached file is used when it reads as a GGUF whose
    ``mtpscope.quantize.type`` and ``.source_sha256`` match, else it is made again.

    Args:
        src: the GGUF to quantize; qtype: llama.cpp's file type name.
        cache: the cache root (default :func:`mtpscope.cache.cache_dir`).
        n_threads: quantizer threads (0: one per core).
        on_quantize: called with a line before llama.cpp runs (progress for the CLI).

    Returns:
        :class:`QuantizeResult` (``cached`` True when nothing was quantized).

    Raises:
        What :func:`quantize_file` raises.
    """
    from mtpscope.cache import cache_dir, sha256_file

    src_p = Path(src)
    name = check_types(qtype, key="type")[0]
    digest = sha256_file(src_p)
    out = Path(cache if cache is not None else cache_dir()) / CACHE_FOLDER / digest / f"{name}.gguf"
    hit = _cached(out, name, digest)
    if hit is not None:
        return QuantizeResult(out=out, qtype=name, source=src_p, provenance=hit[0], n_bytes_in=src_p.stat().st_size,
                              n_bytes_out=out.stat().st_size, tensor_types=hit[1], cached=True)
    if on_quantize is not None:
        on_quantize(f"quantizing {src_p.name} to {name} with llama.cpp -> {out}")
    try:
        return quantize_file(src_p, out, name, n_threads=n_threads, overwrite=True, source_sha256=digest)
    except BaseException:
        with contextlib.suppress(OSError):
            out.parent.rmdir()          # only when empty: no folder of a refused quantization stays behind
        raise


def _cached(out: Path, name: str, digest: str) -> tuple[dict[str, str], dict[str, int]] | None:
    """(provenance, tensor type counts) of a usable cached file, or None."""
    from mtpscope.inspector.gguf import open_gguf

    if not out.is_file():
        return None
    try:
        with open_gguf(out) as f:
            prov = {k: f.get(k) for k in PROVENANCE_KEYS if f.get(k) is not None}
            types = dict(Counter(t.type_name for t in f.tensors))
    except MtpscopeError:
        return None
    if prov.get(PROVENANCE_PREFIX + "type") != name or prov.get(PROVENANCE_PREFIX + "source_sha256") != digest:
        return None
    return {k: str(v) for k, v in prov.items()}, types


def weight_types(f: Any) -> dict[str, Any]:
    """How an open GGUF is quantized: ``{"matrices": {ggml type name: count of tensors with 2 or more
    dimensions}, "type": llama.cpp's file type name from ``mtpscope.quantize.type`` or None,
    "quantized": True when any matrix has a block-quantized type (not F32 / F16 / BF16)}``."""
    mats = Counter(t.type_name for t in f.tensors if len(t.ne) >= 2)
    typ = f.get(PROVENANCE_PREFIX + "type")
    return {"matrices": dict(sorted(mats.items())), "type": typ if isinstance(typ, str) else None,
            "quantized": any(n not in ("F32", "F16", "BF16", "F64") for n in mats)}
