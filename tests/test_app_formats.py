"""The app's one rule for numbers and missing cells (app/formats.py), pure: values worked out by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from mtpscope.app import formats


def test_rates_are_percentages_with_a_space() -> None:
    # 1130 of 3246 drafts accepted: 34.81 %; 682 of 3246: 21.01 %
    assert formats.percent(1130 / 3246) == "34.8 %"
    assert formats.percent(682 / 3246) == "21.0 %"
    assert formats.percent(0.5, digits=0) == "50 %"
    assert formats.percent(None) == formats.percent(math.nan) == formats.percent(pd.NA) == "—"


def test_a_difference_of_rates_is_in_points() -> None:
    assert formats.points(682 / 3246 - 1130 / 3246) == "−13.8 points"
    assert formats.points(0.02) == "+2.0 points"
    assert formats.points(0.0) == formats.points(-0.0001) == "0.0 points"
    assert formats.points(None) == "—"


def test_numbers_and_missing_cells() -> None:
    assert formats.number(1.6192) == "1.62" and formats.number(3246) == "3,246" and formats.number(2.0, 1) == "2.0"
    assert formats.number(float("nan")) == "—"
    rows = formats.cells([{"a": None, "b": float("nan"), "c": pd.NA, "d": 0, "e": "x", "f": False}])
    assert rows == [{"a": "—", "b": "—", "c": "—", "d": 0, "e": "x", "f": False}]
    assert not formats.is_missing(0.0) and formats.is_missing(pd.NaT)


def test_a_non_gguf_upload_is_refused_before_it_is_stored() -> None:
    """The Files page checks an uploaded drafter's first bytes against the GGUF magic (b"GGUF") before storing
    or selecting it: a zip (b"PK\\x03\\x04") is refused in one line naming the upload."""
    from mtpscope.app import loaders
    from mtpscope.errors import InspectorError

    with pytest.raises(InspectorError) as e:
        loaders.check_gguf_upload(b"PK\x03\x04rest", "notes.zip")
    line = e.value.one_line()
    assert "notes.zip is not a GGUF file" in line and "b'GGUF'" in line and "b'PK\\x03\\x04'" in line
    assert "\n" not in line
    loaders.check_gguf_upload(b"GGUF\x03\x00\x00\x00", "ok.gguf")   # the magic: accepted (its reader checks the rest)
