"""``verify`` and the centroid head on the real demo models (full 262144-token Gemma 4 tokenizer), and the
upstream verdicts of those files against llama-cpp-python's real loader."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.slow


def test_demo_drafters_verify_and_pair(demo_dir: Any) -> None:
    from mtpscope.inspector.validate import verify

    for path, dialect in ((demo_dir.drafter_upstream, "upstream"), (demo_dir.drafter_upstream_noisy, "upstream"),
                          (demo_dir.drafter_fork, "fork")):
        r = verify(path, target=demo_dir.target)
        assert r.dialect == dialect and r.ok, [(f.code, f.message) for f in r.errors]
        assert not r.warnings, [(f.code, f.message) for f in r.warnings]
        assert r.pairing is not None and r.pairing.ok
        up, fork = r.loadability
        assert (up.loads, fork.loads) == ((True, False) if dialect == "upstream" else (False, True))
    r = verify(demo_dir.target)
    assert r.dialect == "target" and r.ok


def test_demo_centroid_head(demo_dir: Any) -> None:
    from mtpscope.inspector.centroids import CentroidHead
    from mtpscope.inspector.gguf import open_gguf

    with open_gguf(demo_dir.drafter_fork) as f:
        h = CentroidHead.from_gguf(f)
        assert h.n_vocab == 262144 and h.vsc * h.n_centroids == 262144
        assert (h.cluster_sizes() == h.vsc).all()
        o = np.asarray(f.tensor_data("mtp.token_ordering.weight"))
        assert np.array_equal(np.sort(o), np.arange(262144))
        tok = int(o[5 * h.vsc + 3])
        assert h.centroid_of(tok) == 5
        assert h.token_text([2])[0] == f.get("tokenizer.ggml.tokens")[2]


@pytest.mark.llama
def test_demo_verdicts_against_llama_cpp(demo_dir: Any) -> None:
    pytest.importorskip("llama_cpp")
    from mtpscope.inspector.gguf import open_gguf
    from mtpscope.inspector.loadability import upstream_verdict
    from tests.runtime_probe import run_loads

    paths = [str(p) for p in (demo_dir.target, demo_dir.drafter_upstream, demo_dir.drafter_fork)]
    real = run_loads(paths)
    for p in paths:
        with open_gguf(p) as f:
            assert upstream_verdict(f).loads is (real[p][0] == "OK"), (p, real[p][0])
