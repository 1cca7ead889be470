"""A trace stored under ``key=value`` folders (every sweep cell lives under ``…/n_draft=3/shard=0/``) must read
its own columns, not the folder's values: every reader gives the same numbers as for the same trace stored
elsewhere (issue 23, first bullet; the readers are fixed with the store split)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mtpscope.traces.analysis.metrics import report
from mtpscope.traces.analysis.what_if import what_if_trace
from mtpscope.traces.store.reader import open_trace
from mtpscope.traces.synthetic import write_synthetic_trace


@pytest.mark.xfail(reason="DuckDB's hive auto-detection replaces the rounds' own n_draft with the folder's value; "
                          "the coordinator fixes the store and sweep readers after the store split", strict=False)
def test_a_trace_under_key_value_folders_reads_its_own_columns(tmp_path: Path) -> None:
    plain = write_synthetic_trace(tmp_path / "plain", n_rounds=300, n_prompts=4, n_draft=2, steps=True)
    hive = tmp_path / "n_draft=3" / "assistant=x"
    hive.parent.mkdir(parents=True)
    shutil.copytree(plain, hive)
    a, b = open_trace(plain), open_trace(hive)
    q = "SELECT sum(n_draft) AS nd, sum(n_accepted) AS na, count(*) AS n FROM rounds"
    assert b.sql(q).to_dict("records") == a.sql(q).to_dict("records")
    assert b.sql("SELECT count(*) AS n FROM steps").to_dict("records") == \
        a.sql("SELECT count(*) AS n FROM steps").to_dict("records")
    ra, rb = report(a), report(b)
    for key in ("n_drafted", "n_accepted", "acceptance_rate", "mean_acceptance_length", "per_position"):
        assert rb[key] == ra[key]
    assert [r.acceptance_rate for r in what_if_trace(b, n_boot=0).rows] == \
        [r.acceptance_rate for r in what_if_trace(a, n_boot=0).rows]
