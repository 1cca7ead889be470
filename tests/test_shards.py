"""Split models (``NAME-0000i-of-0000N.gguf``) read as one, locally and over HTTP.

Shards are written by gguf-py's GGUFWriter (``split_max_tensors``, the writer convert_hf_to_gguf uses
for ``--split-max-size``); the oracle for every tensor is gguf-py's GGUFReader on the shard that holds it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFReader

from mtpscope.errors import GGUFFormatError, LayoutError
from mtpscope.inspector.inventory import build_inventory
from mtpscope.inspector.remote import RemoteOptions
from mtpscope.inspector.shards import ShardedGGUF, open_model, shard_locations
from tests.conftest import write_gguf_file
from tests.remote_server import FileServer
from tests.specs import drafter_spec


@pytest.fixture(scope="module")
def split_fork(tmp_path_factory: Any) -> tuple[Path, list[Path]]:
    d = tmp_path_factory.mktemp("shards")
    arch, kv, tensors = drafter_spec("fork")
    whole = write_gguf_file(d / "whole.gguf", arch, kv, tensors)
    write_gguf_file(d / "fork.gguf", arch, kv, tensors, split_max_tensors=20)
    shards = sorted(d.glob("fork-*-of-*.gguf"))
    assert [p.name for p in shards] == [f"fork-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    return whole, shards


def test_names() -> None:
    assert shard_locations("/m/x-00002-of-00003.gguf") == [f"/m/x-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert shard_locations("https://h/r/x-00001-of-00002.gguf?download=1") == [
        "https://h/r/x-00001-of-00002.gguf?download=1", "https://h/r/x-00002-of-00002.gguf?download=1"]
    assert shard_locations("/m/x.gguf") is None
    assert shard_locations("/m/x-00004-of-00003.gguf") is None


def test_any_shard_opens_the_model(split_fork: tuple[Path, list[Path]]) -> None:
    whole, shards = split_fork
    m = open_model(shards[1])
    assert isinstance(m, ShardedGGUF) and [s.path for s in m.shards] == [str(p) for p in shards]
    assert m.path == str(shards[0]) and m.file_size == sum(p.stat().st_size for p in shards)
    readers = [GGUFReader(p) for p in shards]
    names = [t.name for r in readers for t in r.tensors]
    assert [t.name for t in m.tensors] == names and len(names) == 51
    assert m.architecture == "gemma4_assistant" and m.get("split.count") == 3
    for i, r in enumerate(readers):
        for t in r.tensors:
            assert m.shard_of(t.name) == i
            mine = m.tensor(t.name)
            assert list(mine.ne) == [int(x) for x in t.shape] and mine.ggml_type == int(t.tensor_type)
            if mine.type_name in ("F32", "F16", "I32"):
                assert np.array_equal(m.tensor_data(t.name).ravel(), np.asarray(t.data).ravel())
    inv = build_inventory(m)
    ref = build_inventory(open_model(whole))
    assert inv.dialect.kind == "fork" and inv.n_bytes == ref.n_bytes
    assert [(e.tensor.name, e.component, e.layer) for e in inv.entries] == \
        [(e.tensor.name, e.component, e.layer) for e in ref.entries]


def test_one_file_and_a_split_model_answer_alike(split_fork: tuple[Path, list[Path]]) -> None:
    """The reader protocol (GGUFLike): a single file is its own only shard and holds every tensor."""
    whole, shards = split_fork
    f = open_model(whole)
    assert f.shards == (f,) and f.reader is None
    name = f.tensors[-1].name
    assert f.shard_of(name) == 0
    m = open_model(shards[0])
    assert len(m.shards) == 3 and m.shard_of(name) == 2 and m.reader is None
    for x in (f, m):
        with pytest.raises(LayoutError):
            x.shard_of("no.such.tensor")


def test_verify_split_equals_whole(split_fork: tuple[Path, list[Path]]) -> None:
    from mtpscope.inspector.validate import verify

    whole, shards = split_fork
    a, b = verify(open_model(shards[0])), verify(open_model(whole))
    assert sorted((x.code, x.subject) for x in a.findings) == sorted((x.code, x.subject) for x in b.findings)


def test_missing_and_misplaced_shards(split_fork: tuple[Path, list[Path]], tmp_path: Path) -> None:
    _, shards = split_fork
    for p in shards[:2]:
        shutil.copy(p, tmp_path / p.name)
    with pytest.raises(GGUFFormatError) as e:
        open_model(tmp_path / shards[0].name)
    assert "a shard of the split model is missing" in e.value.one_line()
    assert e.value.path == str(tmp_path / shards[2].name)
    # shard 3's file under shard 2's name: split.no says 2, the name says 1 (0-based)
    shutil.copy(shards[2], tmp_path / shards[2].name)
    os.replace(tmp_path / shards[2].name, tmp_path / "tmp.gguf")
    shutil.copy(shards[1], tmp_path / shards[2].name)
    os.replace(tmp_path / "tmp.gguf", tmp_path / shards[1].name)
    with pytest.raises(GGUFFormatError, match="shard in the wrong place"):
        open_model(tmp_path / shards[0].name)
    # a shard that says it is split but is not named like one
    shutil.copy(shards[0], tmp_path / "renamed.gguf")
    with pytest.raises(GGUFFormatError, match="does not say which"):
        open_model(tmp_path / "renamed.gguf")


def test_remote_shards(split_fork: tuple[Path, list[Path]]) -> None:
    _, shards = split_fork
    with FileServer({p.name: p for p in shards}) as s:
        m = open_model(s.url("range", shards[2].name), RemoteOptions(retries=0, token=""))
        assert isinstance(m, ShardedGGUF) and len(m.shards) == 3
        assert m.tensors == open_model(shards[0]).tensors
        assert len(s.hits) == 3  # one header request per (small) shard
        t = next(t for t in m.tensors if t.type_name == "F32" and m.shard_of(t.name) == 2)
        assert np.array_equal(m.tensor_data(t.name), open_model(shards[0]).tensor_data(t.name))


@pytest.mark.llama
def test_llama_cpp_loads_the_same_split(tiny_pair: Any, tmp_path: Path) -> None:
    """Our shard naming is llama.cpp's: the real loader opens the first shard and finds the others."""
    pytest.importorskip("llama_cpp")
    from mtpscope.traces.run.llama.model import LlamaModel

    target, _ = tiny_pair()
    src = open_model(target)
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "t.gguf"), src.architecture, split_max_tensors=30)
    for k, kv in src.kv.items():
        if k in ("general.architecture", "GGUF.version"):
            continue
        v = kv.value
        if hasattr(v, "to_list"):
            w.add_key_value(k, v.to_list(), gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType(v.element_type))
        else:
            w.add_key_value(k, v, gguf.GGUFValueType(kv.value_type))
    for t in src.tensors:
        w.add_tensor(t.name, np.asarray(src.tensor_data(t.name, dequantize=False)), raw_shape=t.shape,
                     raw_dtype=gguf.GGMLQuantizationType(t.ggml_type))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    shards = sorted(tmp_path.glob("t-*-of-*.gguf"))
    assert len(shards) > 1
    ours = open_model(shards[-1])
    m = LlamaModel(shards[0])
    try:
        assert m.meta("split.count") == str(len(shards))
        assert m.meta("general.architecture") == "gemma4"
    finally:
        m.close()
    assert len(ours.tensors) == len(src.tensors)
