"""Tolerances for comparing llama.cpp's CPU numerics with numpy, derived from the numerics.

Every llama.cpp-vs-numpy comparison in the suite takes its tolerance from here, so that each has one
documented derivation (docs/FIDELITY.md, "Tolerances"). They hold on any x86-64 CPU (AVX2 and
AVX-512 builds pick different SIMD kernels and summation orders; nothing here depends on the order).

Facts about ggml's x86 CPU backend (llama-cpp-python 0.3.36's vendored ggml, ``ggml-cpu/vec.cpp``,
``ggml-cpu.c``, ``llamafile/sgemm.cpp``) that the bounds use:

* ``mul_mat`` of an F32 weight with F32 activations: F32 products, F32 accumulation (SIMD lanes,
  then a horizontal sum) in an order that depends on the kernel.
* ``mul_mat`` of an **F16** weight: the activations are first converted to F16 (``vec_dot_type`` of
  F16 is F16; round to nearest even), then F16 x F16 products (exact in F32: 11 + 11 significand bits)
  accumulate in F32. So the numpy side must round the activations to F16 too (:func:`ggml_matvec`);
  the remaining difference is F32 summation order only. Except on CPUs with AMX (Sapphire Rapids and
  later), where a weight placed in the AMX buffer is widened to F32 and meets the activations unrounded
  (:data:`F16_KERNELS`): a check accepts the one kernel that explains a whole result
  (:func:`ggml_matvec_fit`).
* The KV cache is F16; the query and the softmax probabilities meet it in F16 ``mul_mat`` s (rounded
  to F16); GELU is looked up in an F16 table (input and output rounded). The reference drafter
  emulates all of these (``StepOptions(kv_f16=True, gelu="ggml-f16")``).

Error model of a long chain whose F16 roundings are emulated (the reference drafter vs llama.cpp):
both sides round the same values to F16, so they agree to F32 summation order (relative ~1e-7) --
except where an F32 value lies so close to an F16 rounding midpoint that the two sides' F32 rounding
noise puts it on different sides. That element then differs by one F16 ulp: at most ``2**-10`` of
its own magnitude, so at most ``2**-10`` of the norm of the vector it is part of. Such "flips" are
rare (the chance per rounded element is about F32 noise / F16 ulp, ~1e-4), so most steps show F32-level
agreement and a few show up to about one F16 ulp. A missing emulation instead perturbs *every*
element by up to ``U16`` (rms ``U16 / sqrt(3)`` = 2.8e-4), which lifts *every* step's error by three
orders of magnitude. Hence two criteria (:func:`check_emulated_chain`): the lower quartile of the
step errors against :data:`CHAIN_QUANTILE_MAX` (catches a wrong or missing convention) and the
maximum against :data:`CHAIN_MAX` (one F16 ulp of the vector: catches a step that is wrong only
sometimes). The lower quartile, not the median: in a replayed round the reference's own ``h_next``
feeds the next step, so a flip at step k is carried into steps k+1..K; with a flip chance of about
0.2 per step (measured on the tiny pairs) about half of the third steps carry one, but far fewer than
three quarters of all steps do.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: unit roundoff of IEEE binary32 (round to nearest): 2**-24
U32 = 2.0 ** -24
#: unit roundoff of IEEE binary16: 2**-11 (one F16 ulp is 2 * U16 relative at most)
U16 = 2.0 ** -11
#: one F16 ulp relative to the value, at most (a value just above a power of two)
ULP16_REL = 2.0 ** -10

#: :data:`CHAIN_QUANTILE` of the per-step relative errors of an emulated chain (h_next of the
#: reference drafter vs llama.cpp's). 2**-16 = 1.5e-5 is 32 times below U16 -- a missing F16
#: emulation puts even the smallest step errors near 1e-4 (measured medians: exact-tanh GELU instead
#: of the F16 table 1.7e-4, F32 instead of F16 KV 2.1e-4) -- and 2**8 times above U32, far above F32
#: summation noise (dot lengths <= 2**10: sqrt(n) * U32 <= 2e-6 typical; measured 2e-7 .. 4e-7).
CHAIN_QUANTILE_MAX = 2.0 ** -16
#: the quantile compared with :data:`CHAIN_QUANTILE_MAX` (the lower quartile, see the module text)
CHAIN_QUANTILE = 0.25
#: largest per-step relative error of an emulated chain: one F16 ulp of the vector (a single flip
#: of the largest element; measured flips give 1e-5 .. 3e-4).
CHAIN_MAX = ULP16_REL


def gamma(n: int) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)`` for F32: the bound on the relative error of a sum of
    ``n`` terms in any order, relative to the sum of their absolute values (Higham, *Accuracy and
    Stability of Numerical Algorithms*, 2nd ed., Lemma 3.1 / eq. 3.5)."""
    nu = n * U32
    return nu / (1.0 - nu)


#: ggml's x86 CPU kernels for ``mul_mat`` of an **F16** weight with F32 activations, by what happens to the
#: activations: ``"f16"`` rounds them to F16 first (``vec_dot_type`` of F16 is F16: the generic path and
#: llamafile's tinyBLAS, ``ggml-cpu.c`` ``ggml_compute_forward_mul_mat``); ``"f32"`` keeps them in F32 and widens
#: the weight (the AMX extra buffer type, ``ggml-cpu/amx/amx.cpp`` / ``mmq.cpp``: taken on CPUs with AMX when
#: the weight's rows are a multiple of 16 and the activations are F32). Which one runs depends on the CPU
#: and on where llama.cpp put the weight, so a check accepts the one kernel that explains a whole result.
F16_KERNELS = ("f16", "f32")


def ggml_matvec(w: np.ndarray, x: np.ndarray, weight_type: str,
                kernel: str = "f16") -> tuple[np.ndarray, np.ndarray]:
    """What ggml's x86 CPU ``mul_mat`` computes for ``w @ x`` exactly, and the bound of its rounding.

    Shapes: ``w`` numpy ``(n_out, n_in)`` (GGUF ``ne [n_in, n_out]``), values as stored (an F16
    weight already widened exactly to float); ``x`` ``(n_in,)`` or ``(n_rows, n_in)`` F32
    activations. ``weight_type``: the ggml type name of the weight, ``"F32"`` or ``"F16"``; ``kernel``
    (F16 only, :data:`F16_KERNELS`): ``"f16"`` rounds the activations to F16 first, as ggml converts them
    to the weight's ``vec_dot_type``; ``"f32"`` keeps them (the AMX kernels).

    Returns:
        ``(exact, bound)``: the product in float64 of the (rounded) operands, and per element the
        worst-case difference of any F32 evaluation order from it:
        ``gamma(n_in) * (|w| @ |x|) + U32 * |exact|`` (the last term: the final rounding to F32).

    Raises:
        ValueError: a weight type other than F32 / F16, or an unknown kernel.
    """
    if weight_type not in ("F32", "F16"):
        raise ValueError(f"weight_type must be 'F32' or 'F16', got {weight_type!r}")
    if kernel not in F16_KERNELS:
        raise ValueError(f"kernel must be one of {F16_KERNELS}, got {kernel!r}")
    w64 = np.asarray(w, dtype=np.float64)
    x64 = np.asarray(x, dtype=np.float64)
    if weight_type == "F16" and kernel == "f16":
        x64 = x64.astype(np.float16).astype(np.float64)
    exact = x64 @ w64.T
    bound = gamma(w64.shape[1]) * (np.abs(x64) @ np.abs(w64).T) + U32 * np.abs(exact)
    return exact, bound


def ggml_matvec_fit(w: np.ndarray, x: np.ndarray, got: np.ndarray, weight_type: str, what: str,
                    cols: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    """The kernel of :func:`ggml_matvec` that explains llama.cpp's ``got`` as a whole: every element within
    the F32 summation bound of that kernel's exact product (an F32 weight has one kernel).

    ``cols``: when ``got`` holds only some output elements per row (e.g. the top-k logits), their indices
    (same shape as ``got``). Returns ``(exact, bound, kernel)`` of the full product.

    Raises:
        AssertionError: no kernel explains ``got`` (names the worst element of the closest one and its bound).
    """
    kernels = F16_KERNELS if weight_type == "F16" else ("f16",)
    worst_msg, best_ratio = "", np.inf
    for k in kernels:
        exact, bound = ggml_matvec(w, x, weight_type, k)
        ex, bd = (exact, bound) if cols is None else (np.take_along_axis(exact, cols, axis=-1),
                                                      np.take_along_axis(bound, cols, axis=-1))
        got64 = np.asarray(got, dtype=np.float64).reshape(ex.shape)
        err = np.abs(got64 - ex)
        ratio = err / np.maximum(bd, np.finfo(np.float64).tiny)
        worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        if ratio[worst] <= 1.0:
            return exact, bound, k
        if ratio[worst] < best_ratio:
            best_ratio = float(ratio[worst])
            worst_msg = (f"{what}: element {tuple(int(i) for i in worst)} differs by {err[worst]:.3g}, above the "
                         f"F32 summation bound {bd[worst]:.3g} ({weight_type} weight, {k} activations)")
    raise AssertionError(worst_msg)


def assert_matvec_close(w: np.ndarray, x: np.ndarray, got: np.ndarray, weight_type: str, what: str) -> np.ndarray:
    """Assert llama.cpp's ``got`` equals ``w @ x`` as one of ggml's kernels computes it
    (:func:`ggml_matvec_fit`) within the F32 summation bound, element by element. Returns the exact
    product (float64) of that kernel.

    Raises:
        AssertionError: no kernel explains every element (names the worst one and its bound).
    """
    return ggml_matvec_fit(w, x, got, weight_type, what)[0]


def check_emulated_chain(rel_errs: Sequence[float], what: str, *, quantile_max: float = CHAIN_QUANTILE_MAX,
                         max_max: float = CHAIN_MAX) -> tuple[float, float]:
    """Assert per-step relative errors of an F16-emulating chain fit the error model above: the
    :data:`CHAIN_QUANTILE` quantile at most ``quantile_max``, the largest at most ``max_max``.

    Returns ``(quantile, max)``.

    Raises:
        AssertionError: no errors given, or a criterion broken (with both numbers).
    """
    e = np.asarray(list(rel_errs), dtype=np.float64)
    assert e.size > 0, f"{what}: no steps compared"
    q, mx = float(np.quantile(e, CHAIN_QUANTILE)), float(e.max())
    assert q <= quantile_max, (f"{what}: lower-quartile relative error {q:.3g} > {quantile_max:.3g}: most steps "
                               "differ by more than F32 rounding, an F16 rounding of llama.cpp is not emulated")
    assert mx <= max_max, (f"{what}: max relative error {mx:.3g} > {max_max:.3g} (one F16 ulp of the vector)")
    return q, mx


def greedy_near_tie_tol(n_layer: int, logits: np.ndarray) -> float:
    """How far below the best logit the token llama.cpp picked greedily may lie in an F32 reference's
    logits (HF transformers, fp32) at one position, and still be the same computation.

    llama.cpp keeps the KV cache in F16: every K and V element is rounded to F16 (relative error at
    most :data:`U16`), so each layer's attention output carries a relative perturbation of about one
    F16 ulp (:data:`ULP16_REL`) that the F32 reference does not have; the residual stream adds the
    ``n_layer`` layers' perturbations, so the final hidden state and the logits ``W h`` differ by up to
    about ``n_layer * ULP16_REL`` of the logits' scale (``max |logit|``). Two tokens whose logits lie
    closer than that are a tie the two runtimes may break either way; anything farther apart is a real
    disagreement. Measured on the trained demo target (6 layers, max |logit| 13.2): the one near tie on
    an AVX-512 machine was 0.0074 apart, the bound is 0.078.
    """
    return float(n_layer * ULP16_REL * np.max(np.abs(logits)))



def f32_runtime_hidden_tol(ref: np.ndarray, n_layer: int) -> float:
    """Largest ``max |a - b|`` between a hidden state of llama.cpp's run, stored as float16 in its trace (``ref``),
    and the same hidden state from a runtime that computes it in F32 throughout (MLX, HF transformers fp32).

    Two terms: each of the ``n_layer`` layers the value passed through perturbs it by about one F16 ulp of its
    scale, ``ULP16_REL * max |ref|`` (llama.cpp's F16 KV cache, the query and softmax probabilities meeting it in
    F16: the argument of :func:`greedy_near_tie_tol`); and the trace's float16 storage rounds ``ref`` by half an
    ulp of its largest element. Measured on the trained demo (target 6 layers, drafter 4): the target's last
    hidden state from MLX against llama.cpp's differed by at most 4.7e-3 on an AMD EPYC (Zen 4) with the AVX-512
    build and 3.1e-3 with the AVX2-only one (bound 2.8e-2, max |ref| 4.37), below 3e-3 on an Intel Xeon (AVX-512 +
    AMX); the drafter's ``h_next`` (10 layers in all) by at most 8.2e-4 (bound 1.6e-2), while drafting from the
    other position convention moved it by 4.9e-2 .. 1.2e-1 (both builds).
    """
    m = float(np.abs(np.asarray(ref, np.float64)).max())
    if m == 0.0:
        return 0.0
    return float(n_layer * ULP16_REL * m + 2.0 ** (np.floor(np.log2(m)) - 11))


#: the largest multiple of the F16 effect ``E`` (:func:`f16_effect`) that llama.cpp's flips may reach: see there
FLIP_SHARE_MAX = 2.0


def f16_effect(hf: np.ndarray, emulated: np.ndarray) -> float:
    """``E``: the effect of llama.cpp's F16 roundings on one prompt's logits of a whole target, measured on HF
    itself: ``max |emulated - hf|`` over positions and vocabulary.

    ``hf``: HF's fp32 logits ``(n_pos, n_vocab)``; ``emulated``: the same model with every F16 rounding of
    llama.cpp's CPU graph applied (tests/hf_ggml.py: F16 KV cache, Q and the softmax probabilities meeting it
    in F16, ggml's F16 GELU table). ``E`` is what the roundings do to *this* model, amplified by its own layers
    (a fixed bound like :func:`greedy_near_tie_tol` assumes about one ulp per layer; the tiny random targets of
    tests/test_families.py amplify more: measured ``E / max|logit|`` 5e-4 .. 1.7e-2).

    llama.cpp rounds the same values, so it differs from the emulated model only where its F32 evaluation order
    puts a value on the other side of an F16 rounding midpoint (a flip: one F16 ulp of one element), which then
    propagates like any rounding. Flips are a small subset of the roundings (the chance per rounded element is
    F32 noise / F16 ulp, 1e-4 .. 1e-3), so their effect is a fraction of ``E``: measured ``max |llama -
    emulated| / E`` 0.10 .. 0.78 per prompt over the four families (x86-64, AVX2 build). Another CPU sums in
    another order and flips other elements, so :data:`FLIP_SHARE_MAX` = 2 leaves that room. Then
    ``max |llama - hf| <= max |llama - emulated| + E <= (1 + FLIP_SHARE_MAX) E`` (measured up to 1.44 E). A
    convention error moves the logits by far more: swapping the experts' gate / up halves 141 E, dropping the
    per-expert scale 94 E, the per-layer projection norm 47 E (measured on the tiny 26B-A4B / E2B targets).
    In greedy decoding two tokens whose HF logits are closer than ``2 (1 + FLIP_SHARE_MAX) E`` may swap (each
    of the two logits may move by ``(1 + FLIP_SHARE_MAX) E``).
    """
    return float(np.abs(np.asarray(emulated, np.float64) - np.asarray(hf, np.float64)).max())


#: a near-tie: a top-2 logit gap below 2**-8 of the largest |logit|. The drafter inputs (HF vs llama.cpp)
#: differ by the target's F16 numerics (tests/test_parity_hf.py), which reach the drafter's logits as up to 1.5e-3 of their scale (measured:
#: max |logits_HF - logits_llama.cpp| / max |logits| = 5e-4 .. 1.5e-3); two candidates closer than
#: that may swap, and everything fed after the swap differs.
TIE_REL = 2.0 ** -8


# ------------------------------------------------------------------------------------ derived h_inner

#: Error model of a derived ``h_inner`` (traces/run/derived.py: the drafter's ``result_norm`` solved from the
#: logits and ``h_next`` llama.cpp returns, ``h* = X y``). llama.cpp computes each output block ``k`` as
#: ``y_k = W_k r_k(h) + e_k``: ``r_k`` rounds the activations once per ``mul_mat`` (the same rounded vector for
#: every row of that weight; F16 weight: F16 on the "f16" kernel, nothing on the AMX "f32" one; F32: nothing)
#: and ``e_k`` is F32 summation noise (``|e_k| <= gamma(n_embd) |W_k| |h|``, :func:`ggml_matvec`). A left
#: inverse ``X`` (``X W = I`` on the directions the outputs see) turns that into
#: ``h* - h = sum_k X_k W_k (r_k(h) - h) + X e``: one source alone gives back ``r_k(h)`` exactly (its rounding,
#: not amplified); two sources mix their roundings through ``X_k W_k``. Hence the comparison of a derived
#: ``h_inner`` with the graph's (:func:`derived_tolerance`): ``sum_k ||X_k W_k||_2 * ||r_k(h) - h||`` (the
#: roundings measured on the captured ``h``, in norm) plus the summation noise propagated element by element
#: through ``|X|``, plus our own F32 solve (``gamma(m) |X| |y|``).
def derived_tolerance(x_blocks: Sequence[np.ndarray], w_blocks: Sequence[np.ndarray],
                      rounded: Sequence[np.ndarray], h: np.ndarray) -> float:
    """Largest ``||h* - h||`` (absolute, norm) a derived ``h_inner`` may differ from the captured ``h`` by
    (the error model above).

    Args:
        x_blocks: per source, the columns of the solve ``X`` that act on it (numpy ``(n_embd, m_k)``).
        w_blocks: per source, its weight rows as values (numpy ``(m_k, n_embd)``, dequantized / widened).
        rounded: per source, ``r_k(h)``: ``h`` as ggml rounds it for that weight's ``mul_mat``.
        h: the captured ``h_inner`` (``(n_embd,)``).
    """
    h64 = np.asarray(h, np.float64)
    tol = 0.0
    y_abs = []
    for xk, wk, rk in zip(x_blocks, w_blocks, rounded, strict=True):
        x64, w64 = np.asarray(xk, np.float64), np.asarray(wk, np.float64)
        tol += float(np.linalg.norm(x64 @ w64, 2)) * float(np.linalg.norm(np.asarray(rk, np.float64) - h64))
        e = gamma(w64.shape[1]) * (np.abs(w64) @ np.abs(np.asarray(rk, np.float64))) + U32 * np.abs(w64 @ rk)
        tol += float(np.linalg.norm(np.abs(x64) @ e))
        y_abs.append(np.abs(w64 @ np.asarray(rk, np.float64)))
    x_all = np.concatenate([np.asarray(x, np.float64) for x in x_blocks], axis=1)
    tol += float(np.linalg.norm(gamma(x_all.shape[1]) * (np.abs(x_all) @ np.concatenate(y_abs))))
    return tol


def assert_replay_faithful(summary: dict, what: str) -> None:
    """A replay's baseline (``ReplayResult.summary().to_dict()``) reproduces llama.cpp up to what the numerics allow
    (docs/FIDELITY.md, "Every x86 CPU"): every round's first differing draft is a near tie (within
    ``NEAR_TIE_FACTOR`` x the step's numerical effect), and the agreement is at least the expected agreement
    (the share of steps no faithful runtime can flip). No fixed agreement: it holds on any CPU.

    Raises:
        AssertionError: naming ``what``, the unexplained count, the first unexplained step and the agreements.
    """
    nc = summary["numerics"]
    agree = summary["variants"]["baseline"]["agreement"]
    assert nc["judged"], f"{what}: the replay carries no numerics columns"
    assert nc["unexplained"] == 0, (f"{what}: {nc['unexplained']} differing drafts the numerics cannot explain "
                                    f"(first {nc['first_unexplained']}); agreement {agree}")
    assert agree >= nc["expected_agreement"], (f"{what}: agreement {agree} under the expected "
                                               f"{nc['expected_agreement']}")
