"""The Diagnose page's evidence views (app/diagnose_report.py, pure): which views a finding's buttons open, the
first step judged differently, the acceptance gap in words. Frames and values built by hand."""

from __future__ import annotations

import pandas as pd

from mtpscope.app import diagnose_report as dr
from mtpscope.traces.diagnose.records import Finding, ViewRef


def _positions() -> pd.DataFrame:
    # prompt 0 (both traces): g 1, 2 the same; g 3 accepted in A, rejected in B; prompt 1 differs earlier in g
    # but comes after prompt 0 in the diff's order
    return pd.DataFrame({"prompt_id_a": [0, 0, 0, 1], "prompt_id_b": [0, 0, 0, 1], "g": [1, 2, 3, 1],
                         "status_a": ["accepted", "bonus", "accepted", "accepted"],
                         "status_b": ["accepted", "bonus", "rejected", "rejected"]})


def _emitted() -> pd.DataFrame:
    # B's emitted tokens: prompt 0's g 3 is round 1's correction of draft k=2
    return pd.DataFrame({"prompt_id": [0, 0, 0, 1], "g": [1, 2, 3, 1], "round": [0, 0, 1, 0], "k": [1, 0, 2, 1]})


def test_first_differing_step_is_the_first_status_that_differs() -> None:
    assert dr.first_differing_step(_positions(), _emitted(), "b") == (0, 1, 2)
    same = _positions().assign(status_b=lambda f: f["status_a"])
    assert dr.first_differing_step(same, _emitted(), "b") is None
    # a bonus token differs: its round only (no draft step answered it)
    bonus = _positions().assign(status_a=["accepted", "rejected", "accepted", "accepted"])
    assert dr.first_differing_step(bonus, _emitted(), "b") == (0, 0, None)
    assert dr.first_differing_step(_positions().iloc[:0], _emitted()) is None


def test_gap_words_in_percent_and_points() -> None:
    # 682 / 3246 accepted here, 1130 / 3246 in the other trace: 21.0 % against 34.8 %, -13.8 points
    assert dr.gap_words(682 / 3246, 1130 / 3246, "trace A") == (
        "acceptance rate 21.0 % here against 34.8 % in trace A: −13.8 points")
    assert dr.gap_words(None, 0.3, "trace A") is None


def test_a_defect_opens_validate_compare_and_step() -> None:
    key = Finding("rope", "error", "high", "rope.freq_base_swa wrong", link=ViewRef.of("validate", drafter="/d.gguf"))
    views = dr.evidence_views(key, trace="/t/b", compare_with=("/t/a", "/t/b"), first_step=(0, 1, 2))
    assert [v.page for _, v in views] == ["validate", "compare", "step"]
    assert dict(views[1][1].params) == {"trace": "/t/a", "trace_b": "/t/b", "mode": "traces"}
    assert dict(views[2][1].params) == {"trace": "/t/b", "prompt": 0, "round": 1, "step": 2}
    assert dr.link_url(views[2][1], base="") == "/step?trace=%2Ft%2Fb&prompt=0&round=1&step=2"
    # one trace open: only the finding's own link; an info finding: no comparison either
    assert [v.page for _, v in dr.evidence_views(key, trace="/t/b")] == ["validate"]
    info = Finding("acceptance_limit", "info", "medium", "hard tokens", link=ViewRef.of("explain", trace="/t/b"))
    assert [v.page for _, v in dr.evidence_views(info, trace="/t/b", compare_with=("/t/a", "/t/b"),
                                                 first_step=(0, 1, 2))] == ["explain"]


def test_app_base_from_the_page_url() -> None:
    assert dr.app_base("http://10.0.0.5:8600/diagnose?x=1") == "http://10.0.0.5:8600"
    assert dr.app_base(None) == dr.app_base("") == dr.APP_URL
