"""A trace stored under ``key=value`` folders (every sweep cell lives under ``…/n_draft=3/shard=0/``) must read
its own columns, not the folder's values: every reader gives the same numbers as for the same trace stored
elsewhere (``Trace.sql``, ``report``, ``explain``, the what-if, a sweep task's counters, the app's loaders)."""

from __future__ import annotations

import shutil
from pathlib import Path

from mtpscope.traces.analysis.explain_report import explain_trace
from mtpscope.traces.analysis.metrics import report
from mtpscope.traces.analysis.what_if import what_if_trace
from mtpscope.traces.store.reader import open_trace
from mtpscope.traces.sweep.runner import trace_counts
from mtpscope.traces.synthetic import write_synthetic_trace


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
        assert getattr(rb, key) == getattr(ra, key)
    assert [r.acceptance_rate for r in what_if_trace(b, n_boot=0).rows] == \
        [r.acceptance_rate for r in what_if_trace(a, n_boot=0).rows]
    # the rounds' own n_draft (the synthetic trace caps some rounds below 2 at a prompt's end) is what is summed
    own = int(a.rounds["n_draft"].sum())
    assert b.sql(q).iloc[0]["nd"] == own != 3 * len(a.rounds)
    xa, xb = explain_trace(a, with_drift=False).to_dict(), explain_trace(b, with_drift=False).to_dict()
    assert xb["rejections"] == xa["rejections"] and xb["what_if"] == xa["what_if"]
    ca, cb = trace_counts(plain), trace_counts(hive)
    assert cb == ca and ca["n_drafted"] == own


def test_the_app_reads_a_trace_under_key_value_folders_as_elsewhere(tmp_path: Path, monkeypatch) -> None:
    plain = write_synthetic_trace(tmp_path / "plain", n_rounds=120, n_prompts=3, n_draft=2, steps=False)
    hive = tmp_path / "n_draft=5" / "shard=0"
    hive.parent.mkdir(parents=True)
    shutil.copytree(plain, hive)
    monkeypatch.setenv("MTPSCOPE_ROOTS", str(tmp_path))
    from mtpscope.app import loaders

    ra, rb = loaders.report(plain), loaders.report(hive)
    assert rb.n_drafted == ra.n_drafted and rb.acceptance_rate == ra.acceptance_rate
