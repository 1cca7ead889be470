"""The reference drafter's emulation of ggml-cpu's activation rounding (``StepOptions.act_quant``) and the replay's
near-tie rule (``numerics_check``), against values computed independently: gguf-py's own Q8_0 quantizer, hand-made
Q8_K blocks, and steps whose near ties are counted by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from mtpscope.inspector.ggml_types import VEC_DOT_TYPES
from mtpscope.inspector.reference import StepOptions, round_activations
from mtpscope.traces.diagnose.variants import divergence_finding
from mtpscope.traces.run.numerics import NEAR_TIE_FACTOR, numerics_check, numerics_options
from mtpscope.traces.run.replay import BASELINE_CPU, BASELINE_GPU


def test_q8_0_activations_equal_gguf_py_quantize_dequantize() -> None:
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((5, 256)) * rng.uniform(0.01, 30, (5, 1))).astype(np.float32)
    x[2, :32] = 0.0                                                     # an all-zero block stays zero
    ref = dequantize(quantize(x, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0).astype(np.float32)
    got = round_activations(x, "Q8_0")
    np.testing.assert_array_equal(got, ref)
    assert not np.array_equal(got, x)                                   # it does round
    np.testing.assert_array_equal(round_activations(x, "Q8_1"), ref)   # Q8_1 rounds the values alike


def test_q8_k_activations_by_hand() -> None:
    x = np.linspace(-1.0, 2.0, 256, dtype=np.float32)[None, :]        # largest magnitude 2.0, positive
    iscale = np.float32(-127.0) / np.float32(2.0)
    q = np.minimum(127, np.rint(iscale * x))
    want = (q * (np.float32(1.0) / iscale)).astype(np.float32)
    np.testing.assert_array_equal(round_activations(x, "Q8_K"), want)
    assert round_activations(x, "Q8_K")[0, -1] == np.float32(2.0)       # the extreme element is exact
    # a row that is not whole blocks cannot sit before a quantized weight: returned unchanged
    y = np.ones((1, 64), dtype=np.float32) * 0.3
    np.testing.assert_array_equal(round_activations(y, "Q8_K"), y)


def test_f16_and_bf16_activations() -> None:
    x = np.array([[1.0 + 2.0 ** -12, 3.14159, -2.5e-3, 65504.0]], dtype=np.float32)
    np.testing.assert_array_equal(round_activations(x, "F16"), x.astype(np.float16).astype(np.float32))
    # bf16: the top 16 bits, rounded to nearest even; 1 + 2^-12 rounds to 1.0, 3.14159 to 3.140625
    b = round_activations(x, "BF16")
    assert b[0, 0] == 1.0 and b[0, 1] == np.float32(3.140625)
    np.testing.assert_array_equal(round_activations(x, None), x)
    np.testing.assert_array_equal(round_activations(x, "F32"), x)


def test_vec_dot_table_follows_ggml_cpu() -> None:
    # ggml-cpu.c type_traits_cpu: the 32-blocks multiply Q8_0 (Q8_1 for the _1 types), k-quants Q8_K
    assert VEC_DOT_TYPES["Q8_0"] == VEC_DOT_TYPES["Q4_0"] == VEC_DOT_TYPES["Q5_0"] == "Q8_0"
    assert VEC_DOT_TYPES["Q4_1"] == VEC_DOT_TYPES["Q5_1"] == "Q8_1"
    assert {VEC_DOT_TYPES[t] for t in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")} == {"Q8_K"}
    assert VEC_DOT_TYPES["F16"] == "F16" and "F32" not in VEC_DOT_TYPES


def test_option_parses_and_the_numerics_options_remove_every_rounding() -> None:
    assert StepOptions().with_variant("act_quant=true").act_quant is True
    assert BASELINE_CPU.act_quant and BASELINE_CPU.kv_f16 and BASELINE_CPU.gelu == "ggml-f16"
    n = numerics_options(BASELINE_CPU)
    assert (n.act_quant, n.kv_f16, n.gelu) == (False, False, "tanh")
    assert (n.position, n.head, n.hidden) == (BASELINE_CPU.position, BASELINE_CPU.head, BASELINE_CPU.hidden)
    g = numerics_options(BASELINE_GPU)
    assert g.act_quant and not g.kv_f16


def _steps(rows: list[tuple[int, int, int, int, int, float, float, float]]) -> pd.DataFrame:
    cols = ["prompt_id", "round", "k", "recorded", "draft[baseline]", "gap[baseline]", "tol[baseline]",
            "margin[baseline]"]
    return pd.DataFrame(rows, columns=cols)


def test_numerics_check_counts_by_hand() -> None:
    s = _steps([
        # round (0, 0): agrees, then a near tie (gap 0.01 <= tol 0.05), then downstream
        (0, 0, 1, 5, 5, 0.0, 0.05, 1.0),
        (0, 0, 2, 6, 7, 0.01, 0.05, 0.01),
        (0, 0, 3, 8, 9, 3.0, 0.05, 0.5),
        # round (0, 1): first draft differs far beyond its tolerance -> unexplained
        (0, 1, 1, 5, 9, 2.0, 0.05, 2.0),
        (0, 1, 2, 5, 5, 0.0, 0.05, 2.0),
        # round (1, 0): agrees, margins wide
        (1, 0, 1, 4, 4, 0.0, 0.05, 0.9),
        (1, 0, 2, 4, 4, 0.0, 0.05, 0.03),                              # could flip (margin under tol)
    ])
    nc = numerics_check(s)
    assert nc["judged"] and nc["n_differ"] == 3
    assert nc["near_ties"] == 1 and nc["unexplained"] == 1 and nc["downstream"] == 2   # (0,0,3), (0,1,2)
    assert nc["first_unexplained"] == {"prompt_id": 0, "round": 1, "k": 1}
    # decided: steps whose own margin and every earlier margin of the round exceed tol:
    # (0,0,1) yes, (0,0,2) no (0.01), (0,0,3) no (after it), (0,1,1) yes, (0,1,2) yes, (1,0,1) yes, (1,0,2) no
    assert nc["expected_agreement"] == pytest.approx(4 / 7)


def test_divergence_finding_only_for_unexplained_differences() -> None:
    near_only = numerics_check(_steps([(0, 0, 1, 5, 6, 0.01, 0.05, 0.01), (0, 1, 1, 5, 5, 0.0, 0.05, 1.0)]))
    summ = {"n_rounds": 2, "n_steps": 2, "baseline_h_next_rel_err_max": None}
    assert divergence_finding(near_only, 0.5, summ, {}, trace="t") is None       # agreement 50 %, all explained
    one = numerics_check(_steps([(0, 0, 1, 5, 6, 4.0, 0.05, 4.0)] + [(0, r, 1, 5, 5, 0.0, 0.05, 1.0)
                                                                       for r in range(1, 20)]))
    f = divergence_finding(one, 0.95, {**summ, "n_rounds": 20, "n_steps": 20}, {"matrices": {"Q8_0": 3}},
                           trace="t")
    assert f is not None and f.cause == "runtime_divergence"
    assert f.severity == "warning" and f.confidence == "low"           # 1 of 20 rounds: under the error share
    assert "1 of 20" in f.title and "Q8_0" in f.evidence[0].text
    assert f.evidence[0].numbers["near_tie_factor"] == NEAR_TIE_FACTOR
    many = numerics_check(_steps([(0, r, 1, 5, 6, 4.0, 0.05, 4.0) for r in range(5)]))
    g = divergence_finding(many, 0.0, {**summ, "n_rounds": 5, "n_steps": 5}, {}, trace="t")
    assert g is not None and g.severity == "error" and g.confidence == "high"


def test_old_replays_without_the_columns_are_not_judged() -> None:
    s = pd.DataFrame({"prompt_id": [0], "round": [0], "k": [1], "recorded": [1], "draft[baseline]": [2]})
    nc = numerics_check(s)
    assert nc["judged"] is False and nc["unexplained"] is None
    assert divergence_finding(nc, 0.0, {"n_rounds": 1, "n_steps": 1}, {}, trace="t") is None
