"""Shared pytest fixtures. Several helpers add fixtures here: only ADD, keep edits small."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """A suite started in the background by a non-interactive shell (``make test &``, ``nohup``) inherits Ctrl-C
    ignored (POSIX: SIGINT is SIG_IGN for such jobs), and so would every CLI process the tests start and then
    stop with one SIGINT (test_recorder, test_server): give them the default disposition back."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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


# ---------------------------------------------------------------------------------- demo (mtpscope/demo/build.py)


@pytest.fixture(scope="session")
def demo_dir() -> Any:
    """The cached demo folder (``<cache>/demo``), built once if its stamp is stale: a
    :class:`mtpscope.demo.spec.DemoPaths`. Full real tokenizer; traces only where llama-cpp-python is
    installed (``paths.traces_clean`` may be missing otherwise)."""
    from mtpscope.demo.build import build_demo

    return build_demo()


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, Path]]:
    """Factory ``tiny_pair(vocab="subset", noise=0.0, dialect="upstream", seed=0, **drafter_kwargs)
    -> (target_path, drafter_path)``: a demo target and drafter written once per argument set
    (session cache). ``vocab="subset"`` (first 4096 real tokens) files are ~2 MB and load in llama.cpp
    in well under a second."""
    from mtpscope.demo import build as demo

    root = tmp_path_factory.mktemp("tiny_pair")
    made: dict[tuple[Any, ...], tuple[Path, Path]] = {}

    def make(vocab: str = "subset", noise: float = 0.0, dialect: str = "upstream", seed: int = 0,
             **drafter_kwargs: Any) -> tuple[Path, Path]:
        key = (vocab, noise, dialect, seed, tuple(sorted(drafter_kwargs.items())))
        if key not in made:
            tag = f"{vocab}-s{seed}"
            target = root / f"target-{tag}.gguf"
            if not target.exists():
                demo.write_target(target, vocab=vocab, seed=seed)
            drafter = root / f"drafter-{tag}-{dialect}-n{noise}-{len(made)}.gguf"
            demo.write_drafter(drafter, dialect=dialect, noise=noise, vocab=vocab, seed=seed, **drafter_kwargs)
            made[key] = (target, drafter)
        return made[key]

    return make


@pytest.fixture(scope="module")
def pair(tiny_pair) -> dict[str, Path]:
    """The tiny pair the recorder tests run: target, clean / noisy upstream drafters, a fork drafter (subset vocab)."""
    target, clean = tiny_pair(vocab="subset")
    _, noisy = tiny_pair(vocab="subset", noise=2.0)
    _, fork = tiny_pair(vocab="subset", dialect="fork", n_centroids=64, centroid_top_k=4)
    return {"target": target, "clean": clean, "noisy": noisy, "fork": fork}


@pytest.fixture(scope="session")
def server_bin() -> Path:
    """llama-server built from the llama-cpp-python sdist's sources (``mtpscope server build``); skips, saying
    why, where it cannot be built or is not built yet."""
    from mtpscope.traces.server.build import find_build, unavailable_reason

    why = unavailable_reason()
    if why is not None:
        pytest.skip(f"llama-server cannot be built here: {why}")
    b = find_build()
    if b is None:
        pytest.skip("llama-server is not built: run `mtpscope server build` (`make test` builds it)")
    return b.binary


@pytest.fixture(scope="session")
def trained_pair(demo_dir: Any) -> Any:
    """The trained demo pair's paths (:class:`mtpscope.demo.spec.TrainedPaths`); skips where it is not built."""
    from mtpscope.demo.spec import TrainedPaths

    tp = TrainedPaths.under(Path(demo_dir.root))
    if not (tp.target.is_file() and tp.drafter.is_file()):
        pytest.skip("the trained demo pair is not built")
    return tp
