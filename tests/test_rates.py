"""The acceptance figures' one home (traces.analysis.rates): values worked by hand, undefined where nothing was
drafted (None for a scalar, NaN in an array), no numpy warning."""

from __future__ import annotations

import math
import warnings

import numpy as np

from mtpscope.traces.analysis import rates


def test_scalars_by_hand() -> None:
    assert rates.acceptance_rate(3, 4) == 0.75 and rates.acceptance_rate(np.int64(0), 7) == 0.0
    assert rates.acceptance_rate(0, 0) is None
    # 5 accepted over 2 verify rounds: 1 + 5 / 2 tokens per verify
    assert rates.mean_acceptance_length(5, 2) == 3.5 and rates.mean_acceptance_length(0, 3) == 1.0
    assert rates.mean_acceptance_length(0, 0) is None
    assert math.isnan(rates.nan_if_none(None)) and rates.nan_if_none(0.0) == 0.0


def test_arrays_by_hand_without_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = rates.acceptance_rates([3, 0, 2], [4, 0, 8])
        m = rates.mean_acceptance_lengths([5, 1, 0], np.array([2, 0, 4]))
    assert r[0] == 0.75 and math.isnan(r[1]) and r[2] == 0.25
    assert m[0] == 3.5 and math.isnan(m[1]) and m[2] == 1.0
