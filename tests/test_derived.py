"""The derived ``h_inner`` (traces/run/derived.py): the drafter's ``result_norm`` solved from the logits and
``h_next`` llama.cpp returns, instead of a ``cb_eval`` copy out of the graph.

Without llama.cpp: known ``h`` through known weights, the outputs computed as ggml does (activations rounded to
F16 for an F16 weight), the solve gives ``h`` back within the error model of tests/numerics.py
(:func:`derived_tolerance`), and within the solver's own stated bound. With llama.cpp (the tiny pair, flash
attention off): the derived value equals the least-squares solution of llama.cpp's own outputs computed
here from gguf-py's weights, lies within the error model of the captured ``result_norm``, and a recorded trace's
derived columns (h_inner, every centroid column) equal a graph-captured recording of the same run within that
tolerance; the manifest says which columns are derived and the agreement measured on the calibration steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from mtpscope.errors import LayoutError
from mtpscope.traces.run.derived import h_inner_solver, relative_errors
from tests.numerics import U16, derived_tolerance, ggml_matvec_fit


@dataclass(frozen=True)
class _T:
    name: str
    shape: tuple[int, ...]
    type_name: str


class _FakeGGUF:
    """The two tensors the solver reads, as values (what our reader's ``tensor_data`` gives: dequantized)."""

    def __init__(self, emb: np.ndarray, post: np.ndarray, emb_type: str = "F16", post_type: str = "F32") -> None:
        self.path = "fake.gguf"
        self.arrays = {"token_embd.weight": emb, "nextn.post_projection.weight": post}
        self.tensors = (_T("token_embd.weight", emb.shape, emb_type),
                        _T("nextn.post_projection.weight", post.shape, post_type))

    def tensor_data(self, name: str, rows: Any = None) -> np.ndarray:
        a = self.arrays[name]
        return a if rows is None else a[rows]


def _weights(n_vocab: int, n_embd: int, n_bb: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((n_vocab, n_embd)).astype(np.float16).astype(np.float32) / np.sqrt(n_embd)
    post = (rng.standard_normal((n_bb, n_embd)) / np.sqrt(n_embd)).astype(np.float32)
    return emb, post


def _outputs(emb: np.ndarray, post: np.ndarray, h: np.ndarray, emb_f16: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """What ggml's CPU mul_mat returns (up to F32 summation): F16 weight meets F16-rounded activations."""
    he = h.astype(np.float16).astype(np.float64) if emb_f16 else h.astype(np.float64)
    return ((he @ emb.T.astype(np.float64)).astype(np.float32),
            (h.astype(np.float64) @ post.T.astype(np.float64)).astype(np.float32))


def _blocks(solver: Any, emb: np.ndarray, post: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per source of ``solver``: (its columns of X, its weight rows)."""
    out, m0 = [], 0
    x = solver.xt.T.astype(np.float64)
    for s in solver.sources:
        w = post if s.name == "h_next" else emb[s.rows]
        out.append((x[:, m0:m0 + w.shape[0]], w))
        m0 += w.shape[0]
    return out


def test_one_exact_source_gives_h_back_to_f32_rounding() -> None:
    emb, post = _weights(4096, 48, 96)        # n_embd_backbone >= n_embd: post_projection alone
    s = h_inner_solver(_FakeGGUF(emb, post))
    assert [x.name for x in s.sources] == ["h_next"] and s.rank == 48 and s.n_rows == 96
    assert s.amplification[0] == pytest.approx(1.0, rel=1e-6)   # X W = I: the one source's rounding passes as it is
    h = np.random.default_rng(1).standard_normal((5, 48)).astype(np.float32)
    lg, hn = _outputs(emb, post, h)
    got = s.solve(lg, hn)
    err = relative_errors(got, h)
    assert err.max() < 1e-5 and err.max() <= s.bound()
    for i in range(5):
        assert np.linalg.norm(got[i] - h[i]) <= derived_tolerance(*zip(*[(x, w, h[i]) for x, w in _blocks(s, emb, post)]),
                                                                   h[i])


def test_a_narrow_backbone_takes_logit_rows_and_mixes_their_f16_rounding() -> None:
    emb, post = _weights(4096, 64, 32)        # the tiny pairs' case: n_embd_backbone < n_embd
    s = h_inner_solver(_FakeGGUF(emb, post))
    assert [x.name for x in s.sources] == ["h_next", "logits"] and s.rank == 64
    assert len(s.sources[1].rows) == 2 * 64 and len(np.unique(s.sources[1].rows)) == 128
    h = np.random.default_rng(2).standard_normal((6, 64)).astype(np.float32)
    lg, hn = _outputs(emb, post, h)
    got = s.solve(lg, hn)
    for i in range(6):
        rounded = [h[i] if x.name == "h_next" else h[i].astype(np.float16).astype(np.float32) for x in s.sources]
        xs, ws = zip(*_blocks(s, emb, post))
        tol = derived_tolerance(xs, ws, rounded, h[i])
        assert np.linalg.norm(got[i] - h[i]) <= tol
        assert tol <= s.bound() * np.linalg.norm(h[i])        # the solver's stated bound covers the error model
    assert relative_errors(got, h).max() <= 2 * U16               # amplification of the F16 rounding stays ~1


def test_the_finer_source_goes_first() -> None:
    emb, post = _weights(4096, 32, 64)
    # post_projection in Q8_0 (activations rounded to Q8_0 blocks), token_embd in F16: the logits alone suffice
    s = h_inner_solver(_FakeGGUF(emb, post, emb_type="F16", post_type="Q8_0"))
    assert [x.name for x in s.sources] == ["logits"]
    h = np.random.default_rng(3).standard_normal((2, 32)).astype(np.float32)
    lg, hn = _outputs(emb, post, h)
    assert relative_errors(s.solve(lg, None), h).max() <= U16


def test_directions_the_outputs_do_not_see_come_back_as_zero() -> None:
    emb, post = _weights(4096, 64, 32)
    emb[:, 48:] = 0.0                          # the demo's clean drafter: padded widths nothing reads
    post[:, 48:] = 0.0
    s = h_inner_solver(_FakeGGUF(emb, post))
    assert s.rank == 48 and s.describe()["rank"] == 48
    h = np.random.default_rng(4).standard_normal((3, 64)).astype(np.float32)
    h[:, 48:] = 0.0
    lg, hn = _outputs(emb, post, h)
    got = s.solve(lg, hn)
    assert np.abs(got[:, 48:]).max() == 0.0 or np.abs(got[:, 48:]).max() < 1e-6
    assert relative_errors(got, h).max() <= 2 * U16


def test_bad_widths_are_refused() -> None:
    emb, post = _weights(256, 16, 8)
    with pytest.raises(LayoutError, match="token_embd and post_projection disagree"):
        h_inner_solver(_FakeGGUF(emb[:, :8], post))
    s = h_inner_solver(_FakeGGUF(emb, post))
    with pytest.raises((LayoutError, ValueError)):
        s.solve(np.zeros((1, 256), np.float32), np.zeros((1, 9), np.float32))
    f = _FakeGGUF(emb, post)
    f.tensors = f.tensors[:1]
    with pytest.raises(LayoutError, match="post_projection"):
        h_inner_solver(f)


# ------------------------------------------------------------------------------------------- llama.cpp

@pytest.fixture(scope="module")
def graph_rt(pair):
    pytest.importorskip("llama_cpp")
    from mtpscope.traces.run.mtp_runtime import MtpRuntime

    r = MtpRuntime(pair["target"], pair["noisy"], n_ctx=512, capture=True)
    yield r
    r.close()


@pytest.mark.llama
def test_derived_is_the_least_squares_solution_of_llamas_outputs(pair, graph_rt) -> None:
    from mtpscope.inspector.gguf import open_gguf
    from mtpscope.traces.run.record_config import RecordConfig
    from tests.builders import TINY_PROMPTS
    from tests.gguf_oracle import gguf_arrays, gguf_types

    with open_gguf(pair["noisy"]) as f:
        s = h_inner_solver(f)
    w, ty = gguf_arrays(pair["noisy"]), gguf_types(pair["noisy"])
    emb, post = w["token_embd.weight"], w["nextn.post_projection.weight"]
    assert [x.name for x in s.sources] == ["h_next", "logits"] and s.rank == s.n_embd == 128
    steps = [st for p in TINY_PROMPTS[:2] for r in graph_rt.run(graph_rt.prompt_tokens(p),
                                                                RecordConfig(max_tokens=24), trace=True)
             for st in r.steps]
    assert len(steps) >= 10
    hcap = np.stack([st.h_inner for st in steps])
    got = s.solve([st.logits for st in steps], [st.h_next for st in steps])
    rows = s.sources[1].rows
    # which of ggml's kernels computed the logits (F16 weight: F16-rounded activations, or F32 on AMX)
    lg_rows = np.stack([st.logits[rows] for st in steps])
    _, _, kernel = ggml_matvec_fit(emb[rows], hcap, lg_rows, ty["token_embd.weight"], "logit rows")
    xs, ws = zip(*_blocks(s, emb, post))
    for i in range(len(steps)):
        he = hcap[i] if kernel == "f32" or ty["token_embd.weight"] == "F32" else \
            hcap[i].astype(np.float16).astype(np.float32)
        tol = derived_tolerance(xs, ws, [hcap[i], he], hcap[i])
        assert np.linalg.norm(got[i] - hcap[i]) <= tol, i
        assert tol <= s.bound() * np.linalg.norm(hcap[i])


@pytest.fixture(scope="module")
def two_traces(pair, graph_rt, tmp_path_factory):
    from mtpscope import traces
    from mtpscope.traces.run.mtp_runtime import MtpRuntime
    from mtpscope.traces.run.record_config import RecordConfig
    from mtpscope.traces.run.recorder import record
    from tests.builders import TINY_PROMPTS

    out = tmp_path_factory.mktemp("derived")
    kw = dict(target=pair["target"], assistant=pair["noisy"], prompts=TINY_PROMPTS, command=["test"])
    record(RecordConfig(max_tokens=32, centroids=pair["fork"], hidden="f32", graph_capture=True), out=out / "graph",
           runtime=graph_rt, **kw)
    with MtpRuntime(pair["target"], pair["noisy"], n_ctx=512, capture=False) as r:
        record(RecordConfig(max_tokens=32, centroids=pair["fork"], hidden="f32"), out=out / "derived", runtime=r, **kw)
    return traces.open(out / "graph"), traces.open(out / "derived")


@pytest.mark.llama
def test_recorded_derived_columns_equal_the_graph_capture(pair, two_traces) -> None:
    from tests.gguf_oracle import gguf_arrays

    g, d = two_traces
    m = d.manifest["derived"]
    assert g.manifest["derived"] is None and g.manifest["params"]["graph_capture"] is True
    # keys appended in RecordConfig's field order (min_p came last, issue 33), then the loaded target's n_vocab
    assert d.manifest["params"]["graph_capture"] is False and list(d.manifest["params"])[-4:] == ["graph_capture",
                                                                                                 "repack", "min_p",
                                                                                                 "n_vocab"]
    assert m["columns"] == ["h_inner", "centroid_ids", "centroid_logits", "centroid_token", "target_in_candidates",
                            "target_centroid", "target_centroid_rank"]
    assert m["from"] == ["h_next", "logits"] and m["rank"] == m["n_embd"] == 128 and m["n_calibration"] == 3
    assert 0 <= m["max_rel_err"] <= m["bound_rel"] < 4 * U16
    # the same run (greedy, the same decodes): rounds and dense columns equal
    cols = [c for c in g.rounds.columns if not c.startswith("t_")]
    assert g.rounds[cols].equals(d.rounds[cols])
    for c in ("token", "logit", "rank", "target_token", "target_rank", "accepted"):
        assert g.steps[c].equals(d.steps[c]), c
    hg, hd = g.hidden("h_inner"), d.hidden("h_inner")
    err = relative_errors(hd, hg)
    assert err.max() <= m["bound_rel"]
    np.testing.assert_array_equal(g.hidden("h_next"), d.hidden("h_next"))
    # centroid logits: c = C h, so |c_d - c_g| <= ||C_i|| ||h_d - h_g|| per centroid
    cent = gguf_arrays(pair["fork"])["mtp.centroids.weight"].astype(np.float64)
    cn = np.linalg.norm(cent, axis=1)
    dh = np.linalg.norm(hd.astype(np.float64) - hg, axis=1)
    for i, (rg, rd) in enumerate(zip(g.steps.itertuples(), d.steps.itertuples(), strict=True)):
        cg, cd = list(rg.centroid_ids), list(rd.centroid_ids)
        tol = cn * dh[i] + 4 * U16 * np.abs(cent @ hg[i])       # + the stored logits' own F32 rounding
        full_g = cent @ hg[i].astype(np.float64)
        if cg != cd:        # only near-ties may swap: every id in one list but not the other is within tol
            kth = np.sort(full_g)[::-1][len(cg) - 1]
            for c in set(cg) ^ set(cd):
                assert abs(full_g[c] - kth) <= 2 * tol[c] + 2 * tol.max(), (i, c)
        assert np.abs(np.asarray(rd.centroid_logits) - full_g[cd]).max() <= (tol[cd] + 1e-6).max()
    same = ["centroid_token", "target_in_candidates", "target_centroid"]
    assert (g.steps[same] == d.steps[same]).all().all()
    assert (g.steps["target_centroid_rank"] - d.steps["target_centroid_rank"]).abs().max() <= 1


def test_the_solve_is_kept_per_drafter_file(tiny_pair, tmp_path, monkeypatch) -> None:
    import os

    from mtpscope.inspector.gguf import open_gguf
    from mtpscope.traces.run.derived import cached_solver

    monkeypatch.setenv("MTPSCOPE_CACHE", str(tmp_path / "cache"))
    _, drafter = tiny_pair(vocab="subset", noise=2.0)
    with open_gguf(drafter) as f:
        want = h_inner_solver(f)
    a = cached_solver(drafter)                                   # built and kept
    entries = sorted((tmp_path / "cache" / "derived").glob("*.npz"))
    assert len(entries) == 1
    b = cached_solver(drafter)                                   # read back
    for s in (a, b):
        np.testing.assert_array_equal(s.xt, want.xt)
        assert s.describe() == want.describe() and s.amplification == want.amplification
        assert [x.name for x in s.sources] == [x.name for x in want.sources]
        for x, y in zip(s.sources, want.sources, strict=True):
            assert (x.rows is None and y.rows is None) or np.array_equal(x.rows, y.rows)
    entries[0].write_bytes(b"not an npz")                        # a damaged entry is rebuilt
    np.testing.assert_array_equal(cached_solver(drafter).xt, want.xt)
    st = os.stat(drafter)
    os.utime(drafter, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # another version of the file: its own entry
    cached_solver(drafter)
    assert len(list((tmp_path / "cache" / "derived").glob("*.npz"))) == 2


def test_rounds_analysed_together_get_each_steps_own_h_inner() -> None:
    """The recorder derives the h_inner of the rounds it receives together with one solve
    (``derive_h_inner_rounds``): each step gets back its own h (known here: the outputs are made from it), a
    captured h_inner is kept as it is, a step without logits stays None, and every value equals the one-round
    solve to float32 summation noise."""
    from mtpscope.traces.run.mtp_runtime import DraftStep, RoundResult
    from mtpscope.traces.run.step_analysis import derive_h_inner, derive_h_inner_rounds

    emb, post = _weights(4096, 48, 96)
    s = h_inner_solver(_FakeGGUF(emb, post))
    rng = np.random.default_rng(7)
    h = rng.standard_normal((9, 48)).astype(np.float32)
    lg, hn = _outputs(emb, post, h)
    captured = rng.standard_normal(48).astype(np.float32)

    def step(i: int, *, inner: np.ndarray | None = None, logits: bool = True) -> DraftStep:
        return DraftStep(token=i, logits=lg[i] if logits else None, h=None, h_next=hn[i], h_inner=inner)

    def rnd(r: int, steps: list[DraftStep]) -> RoundResult:
        return RoundResult(round=r, pos=r, pending_token=0, drafted=tuple(x.token for x in steps),
                           target=(None,) * (len(steps) + 1), n_accepted=0, emitted=(0,), t_draft_ms=0.0,
                           t_verify_ms=0.0, steps=tuple(steps))

    rounds = [rnd(0, [step(0), step(1), step(2)]), rnd(1, [step(3, inner=captured), step(4)]),
              rnd(2, [step(5), step(6, logits=False), step(7)]), rnd(3, [step(8)])]
    got = derive_h_inner_rounds(rounds, s)
    assert [len(r) for r in got] == [3, 2, 3, 1]
    assert got[1][0] is captured and got[2][1] is None
    # (round, step) -> the row of h its outputs were made from
    for (r, i), k in {(0, 0): 0, (0, 1): 1, (0, 2): 2, (1, 1): 4, (2, 0): 5, (2, 2): 7, (3, 0): 8}.items():
        x = got[r][i]
        assert x is not None and relative_errors(x[None], h[k][None]).max() <= s.bound()
    for r, res in enumerate(rounds):
        one = derive_h_inner(res, s)
        for a, b in zip(got[r], one, strict=True):
            assert (a is None) == (b is None)
            if a is not None:
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * float(np.abs(b).max()))


def test_logit_row_ids_are_the_ids_the_solve_reads_and_gathered_rows_solve_alike() -> None:
    """The recording worker sends a step's logits at ``logit_row_ids(n_vocab, n_embd)`` only (``summarize_drafts``):
    those are the solver's own ``"logits"`` source ids (``2 * n_embd`` ids in 16 blocks spread over the vocabulary:
    block starts by hand, ``linspace(0, n_vocab - 8, 16)`` truncated, for 128 ids), and solving from them (``gathered=True``)
    gives the dense rows' h_inner; a gathered row of another length is refused in one line."""
    from mtpscope.traces.run.derived import logit_row_ids

    emb, post = _weights(4096, 64, 32)        # n_embd_backbone < n_embd: the logits source is used
    s = h_inner_solver(_FakeGGUF(emb, post))
    ids = logit_row_ids(4096, 64)
    per = 128 // 16
    starts = [i * (4096 - per) // 15 for i in range(16)]           # (numpy.linspace, truncated to int64)
    assert ids.tolist() == [a + j for a in starts for j in range(per)]
    assert s.sources[1].name == "logits" and np.array_equal(s.sources[1].rows, ids)
    h = np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32)
    lg, hn = _outputs(emb, post, h)
    dense = s.solve(lg, hn)
    np.testing.assert_array_equal(s.solve(lg[:, ids], hn, gathered=True), dense)
    with pytest.raises(LayoutError, match="gathered logits of the wrong length"):
        s.solve(lg[:, ids[:-1]], hn, gathered=True)
