"""Centroid head exploration against the arrays the file was written from (demo.centroid_head output,
written with gguf-py's GGUFWriter), and against the real 262144-token vocabulary size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mtpscope.errors import LayoutError
from mtpscope.inspector.centroids import CentroidHead
from mtpscope.inspector.gguf import open_gguf
from tests.builders import FK, N_C, N_VOCAB, U32, VSC, parts, write


@pytest.fixture(scope="module")
def fork_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    arch, kv, t = parts("fork")
    p = write(tmp_path_factory.mktemp("c") / "fork.gguf", arch, kv, t)
    return p, t


def test_sizes_rows_and_map(fork_file: tuple[Path, dict]) -> None:
    p, t = fork_file
    order = t["mtp.token_ordering.weight"]
    with open_gguf(p) as f:
        h = CentroidHead.from_gguf(f)
        assert (h.n_vocab, h.n_centroids, h.vsc, h.top_k, h.transposed) == (N_VOCAB, N_C, VSC, 8, False)
        assert (h.cluster_sizes() == VSC).all() and h.cluster_sizes().shape == (N_C,)
        for c in (0, 7, N_C - 1):
            assert (h.tokens_of(c) == order[c * VSC:(c + 1) * VSC]).all()
        # token -> centroid: position in the ordering // vsc, checked token by token on a sample
        pos = {int(tok): i for i, tok in enumerate(order)}
        for tok in (0, 1, 2, 100, 2047, 4095):
            assert h.centroid_of(tok) == pos[tok] // VSC
        with pytest.raises(IndexError):
            h.centroid_of(N_VOCAB)
        with pytest.raises(IndexError):
            h.tokens_of(N_C)


def test_token_text_uses_the_files_vocabulary(fork_file: tuple[Path, dict]) -> None:
    from mtpscope.demo.build import load_vocab

    p, _ = fork_file
    voc = load_vocab("subset")
    with open_gguf(p) as f:
        h = CentroidHead.from_gguf(f)
        ids = h.tokens_of(3)[:6]
        assert h.token_text(ids) == [voc.tokens[int(i)].decode("utf-8") for i in ids]
        assert h.token_text([N_VOCAB + 1]) == [f"<id {N_VOCAB + 1}>"]


def test_norms_and_similarity(fork_file: tuple[Path, dict]) -> None:
    p, t = fork_file
    cent = t["mtp.centroids.weight"].astype(np.float64)       # numpy (n_centroids, n_embd)
    with open_gguf(p) as f:
        h = CentroidHead.from_gguf(f)
        np.testing.assert_allclose(h.centroid_norms(), np.sqrt((cent ** 2).sum(axis=1)), rtol=1e-6)
        ids = [0, 5, 9, 31]
        s = h.pairwise_similarity(ids)
        u = cent[ids] / np.linalg.norm(cent[ids], axis=1, keepdims=True)
        np.testing.assert_allclose(s, u @ u.T, rtol=1e-5, atol=1e-6)
        assert s.shape == (4, 4)
        sample = h.sample(5, seed=1)
        assert len(set(sample.tolist())) == 5 and (np.diff(sample) > 0).all()


def test_transposed_centroids_are_read_the_right_way(tmp_path: Path) -> None:
    arch, kv, t = parts("fork")
    cent = t["mtp.centroids.weight"].copy()
    t["mtp.centroids.weight"] = cent.T.copy()                 # ne (n_centroids, n_embd): converter bug
    with open_gguf(write(tmp_path / "tr.gguf", arch, kv, t)) as f:
        h = CentroidHead.from_gguf(f)
        assert h.transposed and h.n_embd == 128
        np.testing.assert_array_equal(h.centroid_vectors([2, 3]), cent[[2, 3]])


def test_broken_ordering_sizes(tmp_path: Path) -> None:
    arch, kv, t = parts("fork")
    o = t["mtp.token_ordering.weight"]
    lost = int(o[VSC + 1])
    o[VSC + 1] = o[VSC + 2]                                   # row 1 lists one token twice
    with open_gguf(write(tmp_path / "b.gguf", arch, kv, t)) as f:
        h = CentroidHead.from_gguf(f)
        sizes = h.cluster_sizes()
        assert sizes[1] == VSC - 1 and (np.delete(sizes, 1) == VSC).all()
        assert h.centroid_of(lost) == -1


def test_no_head(tmp_path: Path) -> None:
    arch, kv, t = parts("upstream")
    with open_gguf(write(tmp_path / "u.gguf", arch, kv, t)) as f, pytest.raises(LayoutError):
        CentroidHead.from_gguf(f)


def test_full_size_ordering(tmp_path: Path) -> None:
    """262144 tokens, 2048 centroids: the map is a scatter; every token lands in its row."""
    rng = np.random.default_rng(0)
    n, nc, d = 262144, 2048, 8
    order = rng.permutation(n).astype(np.int32)
    arch, kv, _ = parts("fork")
    kv[FK + ".n_centroids"] = U32(nc)
    t = {"mtp.centroids.weight": rng.standard_normal((nc, d)).astype(np.float32),
         "mtp.token_ordering.weight": order}
    with open_gguf(write(tmp_path / "big.gguf", arch, kv, t)) as f:
        h = CentroidHead.from_gguf(f)
        assert h.vsc == 128
        inv = np.empty(n, np.int64)
        inv[order] = np.arange(n)
        np.testing.assert_array_equal(h.token_to_centroid, inv // 128)
        assert (h.cluster_sizes() == 128).all()


def test_one_record_from_every_source(fork_file: tuple[Path, dict], tmp_path: Path) -> None:
    """Fork GGUF, upstream sidecar GGUF and HF safetensors all give inspector.centroids.CentroidHead, the
    record traces.run.centroid_head scores with; arrays equal what the files were written from."""
    import json

    from mtpscope.inspector.convert import convert, write_tiny_pair
    from mtpscope.inspector.safetensors import read_safetensors
    from mtpscope.traces.run import centroid_head as tch

    assert tch.CentroidHead is CentroidHead
    p, t = fork_file
    g = CentroidHead.load(p)
    assert g.kind == "gguf" and g.top_k == 8 and g.centroids_name == "mtp.centroids.weight"
    np.testing.assert_array_equal(g.centroids, t["mtp.centroids.weight"])
    ddir = write_tiny_pair(tmp_path / "hf", seed=5, centroids=True, n_centroids=64, top_k=4)[1]
    side = convert(ddir, tmp_path / "d.gguf", centroids_out=tmp_path / "side.gguf").centroids_out
    st = read_safetensors(ddir / "model.safetensors")
    want_c, want_o = st["masked_embedding.centroids.weight"], st["masked_embedding.token_ordering"]
    heads = [CentroidHead.load(side), CentroidHead.load(ddir), CentroidHead.load(ddir / "model.safetensors"),
             tch.load_centroid_head(side)]
    for h in heads:
        assert isinstance(h, CentroidHead) and (h.n_centroids, h.n_vocab, h.vsc, h.n_embd, h.top_k) == (64, 4096, 64, 48, 4)
        np.testing.assert_array_equal(h.centroids, want_c)
        np.testing.assert_array_equal(h.ordering, want_o)
        assert (h.cluster_sizes() == 64).all()
        tok = int(want_o[200])                                # position 200 lies in row 200 // 64 = 3
        assert h.centroid_of(tok) == 3
    assert [h.kind for h in heads] == ["gguf", "hf", "hf", "gguf"]
    assert json.loads((ddir / "config.json").read_text())["centroid_intermediate_top_k"] == 4


def test_duplicate_token_belongs_to_its_first_row_and_ready_refuses_it() -> None:
    # 2 centroids, vsc 2: rows [0, 1] and [1, 3]: token 1 in both rows (first wins), token 2 in none
    h = CentroidHead.from_arrays(np.eye(2, dtype=np.float32), np.array([0, 1, 1, 3]))
    assert h.token_to_centroid.tolist() == [0, 0, -1, 1] and h.top_k is None
    assert h.cluster_sizes().tolist() == [2, 2]
    assert h.ready().top_k == 2                               # min(32, n_centroids)
    bad = CentroidHead.from_arrays(np.eye(2, dtype=np.float32), np.array([0, 1, 2, 7]))
    assert bad.centroid_of(3) == -1                           # id 7 is no token: explorable, not scorable
    with pytest.raises(LayoutError) as e:
        bad.ready()
    assert e.value.key == "token_ordering"
