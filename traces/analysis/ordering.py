"""The order of every list of prompts, requests or categories by acceptance rate, worst first: one rule for the
app, ``explain`` and ``server requests`` (they disagreed on where a prompt without a rate goes).

Imports: pandas (nothing of mtpscope: the metrics and the request tables both use it).
"""

from __future__ import annotations

import math

import pandas as pd


def worst_first(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of a per-prompt (or per-request, per-category) table worst first: acceptance rate ascending, ties
    by ``prompt_id`` when the table has one, rows without a rate (nothing drafted: NaN) last -- they are not bad,
    there is nothing to judge. A new index 0..n-1.

    Raises:
        KeyError: no ``acceptance_rate`` column.
    """
    by = ["acceptance_rate", *(["prompt_id"] if "prompt_id" in table.columns else [])]
    return table.sort_values(by, kind="stable", na_position="last").reset_index(drop=True)


def worst_first_key(rate: float | None) -> float:
    """:func:`worst_first`'s order as the sort key of one rate (None or NaN: after every rate)."""
    return rate if rate is not None and math.isfinite(rate) else math.inf


__all__ = ["worst_first", "worst_first_key"]
