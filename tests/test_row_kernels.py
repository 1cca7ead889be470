"""The C reductions over rows of logits (traces/run/rowstats.c through traces.run.row_kernels) against
independent references: the target's probability and entropy against a float64 softmax computed here, top-k
against a full stable sort, the count against numpy's; the numpy fall-backs against the same references; every
instruction set's build of the library (AVX-512, AVX2, the x86-64 baseline) bit for bit equal to the
library the recorder loads (AVX2's too on an AVX-512 machine); and the fall-backs (switch off, no compiler), which leave the numpy path in place.

Tolerances: ``p`` and ``H`` come from float32 exponentials (Cephes' expf: about 1e-7 relative; numpy's: a few
ulps) summed in float64 (C: 16-term float32 lane sums first, about 16 * 2^-24 relative); 1e-6 relative covers
both with a margin of about 5x over the worst seen (1.2e-7).
"""

from __future__ import annotations

import os
import platform

import numpy as np
import pytest

from mtpscope.traces.run import native_build, ranking, row_kernels, target_side

N_VOCAB = 262144
REL = 1e-6


def _lib():
    lib = row_kernels.load()
    if lib is None:
        pytest.skip(f"the native row kernels do not build here: {row_kernels.unavailable_reason()}")
    return lib


def _logits(rng: np.random.Generator, n_rows: int, n: int) -> np.ndarray:
    """Gemma-like logits: soft-capped (30 tanh(x / 30)), float32."""
    return (30 * np.tanh(rng.normal(0, 6, size=(n_rows, n)) / 30)).astype(np.float32)


def _ref_stats(x: np.ndarray, tok: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """float64 softmax probability of ``tok[i]`` and entropy (nats) of each row; -inf entries add nothing."""
    d = x.astype(np.float64)
    d = d - d.max(axis=1, keepdims=True)
    e = np.exp(d)
    z = e.sum(axis=1)
    with np.errstate(invalid="ignore"):
        s = np.where(e > 0, e * d, 0.0).sum(axis=1)
    return e[np.arange(len(tok)), tok] / z, np.log(z) - s / z


@pytest.mark.parametrize("n", [N_VOCAB, 100_003, 17])
def test_target_stats_against_float64(n: int) -> None:
    lib = _lib()
    rng = np.random.default_rng(n)
    x = _logits(rng, 4, n)
    x[1, 3] = 40.0                                   # a near-certain row
    x[2, rng.choice(n, size=n // 3, replace=False)] = -np.inf   # masked tokens (suppressed ids)
    x[2, 0] = 1.0
    x[3] = np.float32(-20.0)                         # a flat row: H = log n
    tok = [5 % n, 3, 0, n - 1]
    rp, rh = _ref_stats(x, tok)
    rows = list(x)
    got = row_kernels.target_stats(rows, np.asarray(tok), lib)
    assert got is not None
    for p, h in (got, target_side.numpy_target_stats(rows, np.asarray(tok))):
        np.testing.assert_allclose(p, rp, rtol=REL)
        np.testing.assert_allclose(h, rh, rtol=REL, atol=1e-7)
    assert got[1][3] == pytest.approx(np.log(n), rel=REL)


def test_target_stats_bad_rows_are_nan() -> None:
    lib = _lib()
    x = np.zeros((3, 64), dtype=np.float32)
    x[0, 9] = np.nan
    x[1] = -np.inf
    x[2, 4] = np.inf
    p, h = row_kernels.target_stats(list(x), np.zeros(3, dtype=np.int64), lib)
    assert np.isnan(p).all() and np.isnan(h).all()
    # and the public function gives the same as its numpy path there
    tp, th = target_side.target_stats(x, [0, 0, 0])
    assert np.isnan(tp).all() and np.isnan(th).all()


def _ref_top_k(x: np.ndarray, k: int) -> np.ndarray:
    """Best first, ties by the lower index: a stable sort of -x (NaN left out)."""
    idx = np.flatnonzero(~np.isnan(x))
    return idx[np.argsort(-x[idx], kind="stable")][:k]


@pytest.mark.parametrize(("n", "k"), [(N_VOCAB, 10), (N_VOCAB, 600), (N_VOCAB, 4096), (1000, 10), (517, 40),
                                      (7, 10), (N_VOCAB, 1)])
def test_top_k_and_count_against_a_sort(n: int, k: int) -> None:
    lib = _lib()
    rng = np.random.default_rng(k + n)
    for x in (_logits(rng, 1, n)[0],
              rng.integers(-3, 4, size=n).astype(np.float32),              # ties everywhere
              np.where(rng.random(n) < 0.5, -np.inf, rng.normal(size=n)).astype(np.float32),
              np.sort(rng.normal(size=n)).astype(np.float32)):              # ascending: every block beats the list
        ref = _ref_top_k(x, k)
        np.testing.assert_array_equal(row_kernels.top_k(x, k, lib), ref)
        np.testing.assert_array_equal(ranking.top_k_desc(x, k), ref)
        np.testing.assert_array_equal(ranking._numpy_top_k(x, min(k, n)), ref)
        for v in (x[ref[0]], x[ref[-1]], np.float32(0.5), np.float32(-np.inf)):
            assert row_kernels.count_greater(x, v, lib) == int(np.count_nonzero(x > v))


@pytest.mark.parametrize(("n", "k"), [(N_VOCAB, 10), (N_VOCAB, 600), (1000, 10), (517, 40), (7, 10), (1536, 5)])
def test_copy_top_k_copies_the_row_and_agrees_with_a_sort(n: int, k: int) -> None:
    """The worker's drafter rows: ``copy_top_k`` leaves a bit-for-bit copy (NaN and -inf included) and the top-k of
    a full stable sort, for rows whose block maxima tie, rows where fewer than k blocks hold a finite value, and
    ascending rows (every block's maximum beats the one before)."""
    lib = _lib()
    rng = np.random.default_rng(3 * n + k)
    few = np.full(n, -np.inf, dtype=np.float32)
    few[rng.choice(n, size=min(3, n), replace=False)] = [1.0, 2.0, 2.0][:min(3, n)]     # 3 finite values, k > 3
    nan_tail = _logits(rng, 1, n)[0]
    nan_tail[k::3] = np.nan                                                     # NaN after the first k
    for x in (_logits(rng, 1, n)[0], rng.integers(-3, 4, size=n).astype(np.float32), few, nan_tail,
              np.sort(rng.normal(size=n)).astype(np.float32), np.zeros(n, dtype=np.float32)):   # flat: all tie
        dst = np.full(n, 7.0, dtype=np.float32)
        ids = row_kernels.copy_top_k(x, dst, k, lib)
        assert ids is not None
        np.testing.assert_array_equal(dst.view(np.uint32), x.view(np.uint32))
        np.testing.assert_array_equal(ids, _ref_top_k(x, k))
        np.testing.assert_array_equal(ids, ranking.top_k_desc(x, k))


def test_copy_top_k_gives_none_where_top_k_desc_answers_with_numpy() -> None:
    """A NaN among the first k values (``top_k_desc`` then gives numpy's answer), a k past ``MAX_K``, a row that
    is not float32: no ids, and the copy made all the same."""
    lib = _lib()
    x = np.arange(2048, dtype=np.float32)
    x[2] = np.nan
    for k, src in ((10, x), (row_kernels.MAX_K + 1, x), (10, x.astype(np.float64))):
        dst = np.zeros(2048, dtype=src.dtype)
        assert row_kernels.copy_top_k(src, dst, k, lib) is None
        np.testing.assert_array_equal(np.isnan(dst), np.isnan(src))
        np.testing.assert_array_equal(np.nan_to_num(dst), np.nan_to_num(src))


def test_rank_reads_the_listed_top_as_the_array_does() -> None:
    """``rank(..., listed=(ids, values))`` (the recorder's Python lists) equals ``rank`` from the array, in and out
    of the list, with ties."""
    x = np.array([1, 3, 3, 0, 2, 3, -np.inf, 5, 2], dtype=np.float32)
    top = ranking.top_k_desc(x, 4)
    listed = (top.tolist(), x[top].tolist())
    for i in range(len(x)):
        want = int(np.count_nonzero(x > x[i]))
        assert ranking.rank(x, i, top, listed=listed) == want == ranking.rank(x, i, top) == ranking.rank(x, i)


def test_top_k_skips_nan_and_rank_counts() -> None:
    lib = _lib()
    x = np.array([1, 3, 3, np.nan, 2, 3, -np.inf, 5], dtype=np.float32)
    assert row_kernels.top_k(x, 10, lib).tolist() == [7, 1, 2, 5, 4, 0, 6]
    assert ranking.rank(x, 4) == 4 and ranking.rank(x, 7) == 0 and ranking.rank(x, 6) == 6
    # a NaN among the first k: the public function answers as numpy does
    np.testing.assert_array_equal(ranking.top_k_desc(x, 3), ranking._numpy_top_k(x, 3))


def test_every_instruction_set_computes_the_same_bits() -> None:
    """One library per instruction set (16, 8 or 4 float32 lanes a register); each this CPU can run, built
    here, gives the loaded library's bits (an AVX2-only CPU's build included, on an AVX-512 machine)."""
    lib = _lib()
    order = ["baseline", "avx2", "avx512"]
    runnable = order[:order.index(row_kernels.isa()) + 1]
    rng = np.random.default_rng(7)
    x = _logits(rng, 3, N_VOCAB + 5)
    x[1, ::7] = -np.inf
    tok = np.array([1, 2, 3])
    want = row_kernels.target_stats(list(x), tok, lib)
    want_top = [row_kernels.top_k(r, 64, lib) for r in x]
    lanes = set()
    for name in runnable:
        path = native_build.build(row_kernels.SOURCE, row_kernels.flags(name), what=f"the {name} build")
        other = row_kernels.open_library(path)
        lanes.add(int(other.mtps_lanes()))
        got = row_kernels.target_stats(list(x), tok, other)
        np.testing.assert_array_equal(got[0], want[0], err_msg=name)
        np.testing.assert_array_equal(got[1], want[1], err_msg=name)
        for r, t in zip(x, want_top, strict=True):
            np.testing.assert_array_equal(row_kernels.top_k(r, 64, other), t, err_msg=name)
            assert row_kernels.count_greater(r, r[t[-1]], other) == 63
    if platform.machine() in ("x86_64", "AMD64"):      # each build has its register width (one per instruction set)
        assert lanes == {{"baseline": 4, "avx2": 8, "avx512": 16}[n] for n in runnable}


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.setattr(row_kernels, "_state", {})
    monkeypatch.setenv("MTPSCOPE_CACHE", os.fspath(tmp_path / "cache"))
    return tmp_path


def test_switch_off_and_no_compiler_keep_numpy(fresh, monkeypatch) -> None:
    x = _logits(np.random.default_rng(1), 2, 4096)
    ref_p, ref_h = _ref_stats(x, [3, 4])
    monkeypatch.setenv(row_kernels.ENV_SWITCH, "0")
    assert row_kernels.load() is None and row_kernels.kind() == f"numpy ({row_kernels.ENV_SWITCH}=0)"
    p, h = target_side.target_stats(x, [3, 4])
    np.testing.assert_allclose(p, ref_p, rtol=REL)
    np.testing.assert_allclose(h, ref_h, rtol=REL)
    np.testing.assert_array_equal(ranking.top_k_desc(x[0], 10), _ref_top_k(x[0], 10))
    monkeypatch.setattr(row_kernels, "_state", {})
    monkeypatch.delenv(row_kernels.ENV_SWITCH)
    monkeypatch.setenv("CC", os.fspath(fresh / "no-such-cc"))
    assert row_kernels.load() is None and "no C compiler" in row_kernels.kind()
    assert not row_kernels.library_path().exists()
    np.testing.assert_array_equal(ranking.top_k_desc(x[1], 10), _ref_top_k(x[1], 10))


def test_rows_of_nan_rank_below_every_number_and_a_nan_draft_is_bad_input() -> None:
    """A drafter whose weights hold NaN computes NaN logits: ``top_k_desc`` ranked them with an IndexError (``record``,
    ``replay`` and ``diagnose`` ended as internal errors). NaN now ranks below every number (then by index), and the
    step's summary refuses a drafted token whose logit is not finite, naming the step."""
    from mtpscope.errors import TraceError
    from mtpscope.traces.run.step_analysis import summarize_logits

    n = 8192                                                  # the block path of _numpy_top_k (>= 8 blocks of 512)
    all_nan = np.full(n, np.nan, dtype=np.float32)
    some = all_nan.copy()
    some[[5, 4000, 8000]] = [1.0, 3.0, 2.0]
    for x, want in ((all_nan, [0, 1, 2, 3]), (some, [4000, 8000, 5, 0])):
        np.testing.assert_array_equal(ranking.top_k_desc(x, 4), want)
        np.testing.assert_array_equal(ranking._numpy_top_k(x, 4), want)
    with pytest.raises(TraceError) as e:
        summarize_logits(all_nan, 7, n_top=4, where="round 3, draft 2")
    assert "round 3, draft 2" in str(e.value) and e.value.key == "logits[7]"
    assert summarize_logits(some, 4000, n_top=2).top_ids == (4000, 8000)     # a finite draft: summarized
