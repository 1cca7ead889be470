"""Shared pytest fixtures. Several helpers add fixtures here: only ADD, keep edits small."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest


# ---------------------------------------------------------------------------------- GGUF (inspector)


@pytest.fixture(scope="session")
def vocab_gguf() -> Path:
    """Path of the real ``ggml-vocab-gemma-4.gguf`` (15.8 MB, 262144 tokens, no tensors), from the cache."""
    from mtpscope.cache import vocab_path

    return vocab_path()


def write_gguf_file(path: Path, arch: str | None, kv: Sequence[tuple[Any, ...]] = (),
                    tensors: Sequence[tuple[Any, ...]] = (), **writer_kwargs: Any) -> Path:
    """Write a GGUF with gguf-py's ``GGUFWriter`` (an independent writer, not ours).

    Args:
        path: where to write.
        arch: ``general.architecture`` (written first by GGUFWriter); None writes no architecture key.
        kv: ``(key, value, GGUFValueType[, sub_type])`` tuples, in order (``general.alignment`` also
            sets the writer's data alignment).
        tensors: ``(name, ndarray[, raw_dtype])``; for quantized types pass the bytes from
            ``gguf.quants.quantize`` and the ``GGMLQuantizationType`` as raw_dtype.
        writer_kwargs: passed to ``GGUFWriter`` (e.g. ``endianess``).
    """
    import gguf

    w = gguf.GGUFWriter(str(path), arch or "x", **writer_kwargs)
    if arch is None:
        w.kv_data[0].pop("general.architecture", None)
    for item in kv:
        key, val, vtype, *sub = item
        if key == "general.alignment":
            w.add_custom_alignment(val)  # sets the writer's padding too, not only the key
            continue
        w.add_key_value(key, val, vtype, sub_type=sub[0] if sub else None)
    for item in tensors:
        name, arr, *raw = item
        w.add_tensor(name, arr, raw_dtype=raw[0] if raw else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


@pytest.fixture
def write_gguf(tmp_path: Path) -> Callable[..., Path]:
    """Factory ``write_gguf(name, arch, kv=(), tensors=(), **writer_kwargs) -> Path`` into ``tmp_path``
    (see :func:`write_gguf_file`)."""

    def make(name: str, arch: str | None, kv: Sequence[tuple[Any, ...]] = (),
             tensors: Sequence[tuple[Any, ...]] = (), **writer_kwargs: Any) -> Path:
        return write_gguf_file(tmp_path / name, arch, kv, tensors, **writer_kwargs)

    return make
