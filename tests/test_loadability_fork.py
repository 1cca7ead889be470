"""Fork loadability verdicts (rules from the fork's documented layout; the fork itself is not available
offline, so these check the rules, not a real load) and the verdict record."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mtpscope.inspector.gguf import open_gguf
from mtpscope.inspector.loadability import RUNTIME_FORK, RUNTIME_UPSTREAM, fork_verdict, loadability
from tests.builders import FK, MUTANTS, U32, build, drop_tensors, parts, write


def _verdict(path: Path):
    with open_gguf(path) as f:
        return fork_verdict(f)


def test_fork_loads_its_own_dialect_and_the_target(tmp_path: Path) -> None:
    for name in ("valid_fork", "valid_target"):
        v = _verdict(build(tmp_path, name))
        assert v.loads is True and v.runtime == RUNTIME_FORK


def test_fork_refuses_upstream_dialect(tmp_path: Path) -> None:
    v = _verdict(build(tmp_path, "valid_upstream"))
    assert v.loads is False and "gemma4-assistant" in v.reasons[0]


def test_fork_layer_output_scale_optional(tmp_path: Path) -> None:
    arch, kv, t = parts("fork")
    drop_tensors("blk.0.layer_output_scale.weight", "blk.3.layer_output_scale.weight")(kv, t)
    assert _verdict(write(tmp_path / "a.gguf", arch, kv, t)).loads is True


def test_fork_refusals(tmp_path: Path) -> None:
    arch, kv, t = parts("fork")
    del t["mtp.token_ordering.weight"]
    v = _verdict(write(tmp_path / "a.gguf", arch, kv, t))
    assert v.loads is False and "mtp.token_ordering.weight" in v.reasons[0]

    arch, kv, t = parts("fork")
    t["mtp.token_ordering.weight"] = t["mtp.token_ordering.weight"].astype(np.float32)
    v = _verdict(write(tmp_path / "b.gguf", arch, kv, t))
    assert v.loads is False and "I32" in v.reasons[0]

    arch, kv, t = parts("fork")
    kv[FK + ".n_centroids"] = U32(30)
    t["mtp.centroids.weight"] = t["mtp.centroids.weight"][:30].copy()
    v = _verdict(write(tmp_path / "c.gguf", arch, kv, t))
    assert v.loads is False and "multiple of n_centroids 30" in v.reasons[0]

    arch, kv, t = parts("fork")
    del kv[FK + ".n_embd_backbone"]
    v = _verdict(write(tmp_path / "d.gguf", arch, kv, t))
    assert v.loads is False and "n_embd_backbone" in v.reasons[0]

    arch, kv, t = parts("fork")
    t["mtp.pre_projection.weight"] = t["mtp.pre_projection.weight"].T.copy()
    assert _verdict(write(tmp_path / "e.gguf", arch, kv, t)).loads is True   # square 128x128: same ne
    t["mtp.post_projection.weight"] = t["mtp.post_projection.weight"].T.copy()
    v = _verdict(write(tmp_path / "f.gguf", arch, kv, t))
    assert v.loads is False and "mtp.post_projection.weight" in v.reasons[0] and "wrong shape" in v.reasons[0]


def test_verdicts_for_every_runtime(tmp_path: Path) -> None:
    with open_gguf(build(tmp_path, "valid_upstream")) as f:
        vs = loadability(f)
    assert [v.runtime for v in vs] == [RUNTIME_UPSTREAM, RUNTIME_FORK]
    assert [v.loads for v in vs] == [True, False]
    assert all(v.basis for v in vs) and vs[0].to_dict()["loads"] is True
    assert set(MUTANTS) >= {"valid_upstream", "valid_fork"}
