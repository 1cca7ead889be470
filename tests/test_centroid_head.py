"""Centroid head (traces/run/centroid_head.py): hand-computed steps, GGUF (gguf-py writer) and Hugging Face
(safetensors) sources, errors. No llama.cpp needed."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from mtpscope.errors import HFCheckpointError, LayoutError
from mtpscope.traces.run.centroid_head import centroid_step, head_from_arrays, load_centroid_head

# n_centroids 4, n_embd 2, n_vocab 8 (vsc 2); ordering rows: 0:[7,6] 1:[5,4] 2:[3,2] 3:[1,0]
CENTROIDS = np.array([[0.5, 0.0], [2.0, 0.0], [-1.0, 0.0], [1.0, 1.0]], dtype=np.float32)
ORDERING = np.array([7, 6, 5, 4, 3, 2, 1, 0], dtype=np.int32)
H = np.array([1.0, 0.0], dtype=np.float32)  # centroid logits = first column: [0.5, 2, -1, 1]


def test_step_by_hand() -> None:
    head = head_from_arrays(CENTROIDS, ORDERING, top_k=2)
    assert (head.n_centroids, head.n_embd, head.n_vocab, head.vsc) == (4, 2, 8, 2)
    dense = np.array([0, 9, 0, 0, 3, 5, 0, 0], dtype=np.float32)  # token 1 best overall, token 5 best among ids
    s = centroid_step(head, H, dense_logits=dense, target_token=3)
    assert s.centroid_ids.tolist() == [1, 3]                      # logits 2 and 1
    assert s.centroid_logits.tolist() == [2.0, 1.0]
    assert s.candidate_ids.tolist() == [5, 4, 1, 0]
    assert s.centroid_token == 1                                    # dense 9 at token 1 (row of centroid 3)
    assert s.target_centroid == 2 and s.target_centroid_rank == 3   # token 3 sits in row 2, logit -1: last
    assert s.target_in_candidates is False
    s2 = centroid_step(head, H, dense_logits=dense, target_token=4)
    assert (s2.target_centroid, s2.target_centroid_rank, s2.target_in_candidates) == (1, 0, True)
    s3 = centroid_step(head, H)                                     # no dense logits, no target
    assert s3.centroid_token is None and s3.target_in_candidates is None and s3.target_centroid is None


def test_ties_lower_id_first_and_sparse_argmax_ties() -> None:
    head = head_from_arrays(np.array([[1.0], [1.0], [0.0], [1.0]], np.float32), ORDERING, top_k=2)
    s = centroid_step(head, np.array([2.0], np.float32), dense_logits=np.zeros(8, np.float32), target_token=1)
    assert s.centroid_ids.tolist() == [0, 1]                        # three centroids tie at 2.0
    assert s.centroid_token == 4                                    # all candidates tie: lowest id of 7,6,5,4
    assert s.target_centroid == 3 and s.target_centroid_rank == 0 and s.target_in_candidates is False


@pytest.mark.parametrize("centroids, ordering, top_k, key", [
    (np.zeros((3, 2)), ORDERING, 1, "token_ordering"),             # 8 % 3 != 0
    (np.zeros(4), ORDERING, 1, "centroids"),                        # rank 1
    (CENTROIDS, ORDERING.astype(np.float32), 1, "token_ordering"),  # not integers
    (CENTROIDS, np.array([0, 1, 2, 3, 4, 5, 6, 8]), 1, "token_ordering"),  # id out of range
    (CENTROIDS, ORDERING, 5, "centroid_top_k"),
])
def test_bad_arrays(centroids: np.ndarray, ordering: np.ndarray, top_k: int, key: str) -> None:
    with pytest.raises(LayoutError) as ei:
        head_from_arrays(centroids, ordering, top_k=top_k, source="x.gguf")
    assert ei.value.key == key and ei.value.path == "x.gguf"


def test_check_compatible() -> None:
    head = head_from_arrays(CENTROIDS, ORDERING, top_k=2)
    head.check_compatible(n_embd=2, n_vocab=8, drafter="d.gguf")
    with pytest.raises(LayoutError, match="n_embd"):
        head.check_compatible(n_embd=3, n_vocab=8, drafter="d.gguf")
    with pytest.raises(LayoutError, match="n_vocab"):
        head.check_compatible(n_embd=2, n_vocab=9, drafter="d.gguf")


def _fork_gguf(write_gguf, name: str = "fork.gguf", top_k: int = 2) -> Path:
    import gguf

    # GGUFWriter takes numpy arrays; the GGUF ne is the reverse: centroids ne [n_embd, n_centroids]
    return write_gguf(name, "gemma4_assistant",
                      kv=[("gemma4_assistant.centroid_top_k", top_k, gguf.GGUFValueType.UINT32),
                          ("gemma4_assistant.n_centroids", 4, gguf.GGUFValueType.UINT32)],
                      tensors=[("mtp.centroids.weight", CENTROIDS), ("mtp.token_ordering.weight", ORDERING)])


def test_gguf_source(write_gguf) -> None:
    p = _fork_gguf(write_gguf)
    head = load_centroid_head(p)
    assert head.kind == "gguf" and head.top_k == 2
    np.testing.assert_array_equal(head.centroids, CENTROIDS)
    np.testing.assert_array_equal(head.ordering, ORDERING)
    assert load_centroid_head(p, top_k=3).top_k == 3
    s = centroid_step(head, H, target_token=4)
    assert s.centroid_ids.tolist() == [1, 3] and s.target_in_candidates is True


def test_gguf_without_head(write_gguf) -> None:
    p = write_gguf("up.gguf", "gemma4-assistant", tensors=[("token_embd.weight", np.zeros((8, 2), np.float32))])
    with pytest.raises(LayoutError, match="no centroid head") as ei:
        load_centroid_head(p)
    assert ei.value.key == "mtp.centroids.weight"


def _write_safetensors_by_hand(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    """The safetensors layout written byte by byte: u64 header size, JSON header, data."""
    header, blobs, off = {}, [], 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_hf_directory_f32_via_safetensors(tmp_path: Path, write_gguf) -> None:
    from safetensors.numpy import save_file

    d = tmp_path / "hf"
    d.mkdir()
    save_file({"masked_embedding.centroids.weight": CENTROIDS,
               "masked_embedding.token_ordering": ORDERING.astype(np.int64),
               "model.norm.weight": np.ones(2, np.float32)}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"model_type": "gemma4_assistant", "centroid_intermediate_top_k": 2}))
    head = load_centroid_head(d)
    assert head.kind == "hf" and head.top_k == 2
    np.testing.assert_array_equal(head.centroids, CENTROIDS)
    g = load_centroid_head(_fork_gguf(write_gguf))
    dense = np.arange(8, dtype=np.float32)
    a, b = centroid_step(head, H, dense_logits=dense, target_token=2), centroid_step(g, H, dense_logits=dense,
                                                                                    target_token=2)
    assert a.centroid_ids.tolist() == b.centroid_ids.tolist() == [1, 3]
    assert a.candidate_ids.tolist() == b.candidate_ids.tolist() == [5, 4, 1, 0]
    assert a.centroid_token == b.centroid_token == 5      # dense = arange: best candidate id is 5
    assert (a.target_centroid, a.target_centroid_rank) == (b.target_centroid, b.target_centroid_rank) == (2, 3)


def test_hf_bf16_widened_exactly(tmp_path: Path) -> None:
    # bf16 = upper 16 bits of float32; these values are exact in bf16
    c16 = (CENTROIDS.view(np.uint32) >> 16).astype("<u2").tobytes()
    _write_safetensors_by_hand(tmp_path / "model-00001-of-00001.safetensors", {
        "masked_embedding.centroids.weight": ("BF16", [4, 2], c16),
        "masked_embedding.token_ordering": ("I64", [8], ORDERING.astype("<i8").tobytes()),
    })
    head = load_centroid_head(tmp_path)
    np.testing.assert_array_equal(head.centroids, CENTROIDS)
    np.testing.assert_array_equal(head.ordering, ORDERING)
    assert head.top_k == 4                                # no config.json: min(32, n_centroids)
    assert load_centroid_head(tmp_path, top_k=2).top_k == 2


def test_hf_errors(tmp_path: Path) -> None:
    with pytest.raises(HFCheckpointError):
        load_centroid_head(tmp_path)                      # no safetensors at all
    from safetensors.numpy import save_file

    save_file({"model.norm.weight": np.ones(2, np.float32)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(LayoutError, match="no centroid head"):
        load_centroid_head(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(HFCheckpointError):
        load_centroid_head(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_centroid_head(tmp_path / "missing.gguf")


def test_batched_steps_equal_single_steps() -> None:
    from mtpscope.traces.run.centroid_head import centroid_steps

    rng = np.random.default_rng(0)
    cent = rng.standard_normal((16, 8)).astype(np.float32)
    order = rng.permutation(64).astype(np.int32)
    head = head_from_arrays(cent, order, top_k=3)
    hs = rng.standard_normal((5, 8)).astype(np.float32)
    hs[4] = 0.0                                                 # all centroid logits tie at 0
    dense = rng.standard_normal((5, 64)).astype(np.float32)
    targets = [0, 5, None, 63, 7]
    batch = centroid_steps(head, hs, dense_logits=dense, target_tokens=targets)
    for i, b in enumerate(batch):
        c = cent.astype(np.float64) @ hs[i].astype(np.float64)
        want = np.lexsort((np.arange(16), -c))[:3]              # independent: full sort, ties by id
        assert b.centroid_ids.tolist() == want.tolist()
        s = centroid_step(head, hs[i], dense_logits=dense[i], target_token=targets[i])
        assert s.centroid_ids.tolist() == b.centroid_ids.tolist()
        assert (s.centroid_token, s.target_in_candidates, s.target_centroid, s.target_centroid_rank) == \
            (b.centroid_token, b.target_in_candidates, b.target_centroid, b.target_centroid_rank)
    assert batch[4].centroid_ids.tolist() == [0, 1, 2]
    with pytest.raises(LayoutError, match="n_embd"):
        centroid_steps(head, np.zeros((2, 7), np.float32))


@pytest.mark.parametrize("n_top", [0, 1, 3, 10])
def test_dense_top_shortcut_equals_the_gather(n_top: int) -> None:
    # the sparse head's token read off the dense top list must equal the argmax over all candidates,
    # computed independently here (full gather, ties by the lowest id), including tied logits
    from mtpscope.traces.run.centroid_head import centroid_steps
    from mtpscope.traces.run.ranking import top_k_desc

    rng = np.random.default_rng(1)
    cent = rng.standard_normal((32, 8)).astype(np.float32)
    order = rng.permutation(512).astype(np.int32)
    head = head_from_arrays(cent, order, top_k=4)
    hs = rng.standard_normal((40, 8)).astype(np.float32)
    dense = np.round(rng.standard_normal((40, 512)) * 2).astype(np.float32)   # coarse: many ties
    tops = [top_k_desc(d, n_top) for d in dense]
    got = centroid_steps(head, hs, dense_logits=dense, dense_top=tops)
    rows = order.reshape(32, 16)
    for i, g in enumerate(got):
        c = cent.astype(np.float64) @ hs[i].astype(np.float64)
        cand = rows[np.lexsort((np.arange(32), -c))[:4]].reshape(-1)
        best = dense[i][cand].max()
        assert g.centroid_token == int(cand[dense[i][cand] == best].min())
