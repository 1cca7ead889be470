"""Start-up of ``record``: the worker process loads the pair while the pre-flight check runs, and decodes
nothing before the check passed (``go``); a pair the check refuses is refused with the same one line as
before, its worker ended (it has loaded at most), no trace written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("llama_cpp")

from mtpscope.errors import LayoutError
from mtpscope.traces.run import record_worker as W
from mtpscope.traces.run.record_config import RecordConfig
from mtpscope.traces.run.recorder import record

pytestmark = pytest.mark.llama


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Every RecordWorker made, every go(), and the worker's status block when it was abandoned."""
    seen: dict[str, list[Any]] = {"workers": [], "go": [], "abandoned": []}
    init, go, abandon = W.RecordWorker.__init__, W.RecordWorker.go, W.RecordWorker.abandon

    def spy_init(self: Any, *a: Any, **kw: Any) -> None:
        init(self, *a, **kw)
        seen["workers"].append(self)

    def spy_go(self: Any) -> None:
        seen["go"].append(self)
        go(self)

    def spy_abandon(self: Any) -> None:
        seen["abandoned"].append(W.Status.read(self._status))
        abandon(self)

    monkeypatch.setattr(W.RecordWorker, "__init__", spy_init)
    monkeypatch.setattr(W.RecordWorker, "go", spy_go)
    monkeypatch.setattr(W.RecordWorker, "abandon", spy_abandon)
    return seen


def test_a_refused_pair_is_refused_and_its_worker_never_decodes(pair, tmp_path: Path, spy) -> None:
    with pytest.raises(LayoutError, match="fork-dialect drafter") as ei:
        record(RecordConfig(), target=pair["target"], assistant=pair["fork"], out=tmp_path / "x", prompt="x")
    assert ei.value.key == "general.architecture"
    assert len(spy["workers"]) == 1 and spy["go"] == []           # the worker never got the go
    st = spy["abandoned"][0]
    assert st is None or st["n_decodes"] == 0                       # and decoded nothing
    assert spy["workers"][0].proc.returncode is not None            # and is gone: no process left behind
    assert not (tmp_path / "x").exists()


def test_a_checked_pair_goes_once(pair, tmp_path: Path, spy) -> None:
    s = record(RecordConfig(max_tokens=4, hidden="off"), target=pair["target"], assistant=pair["noisy"],
               out=tmp_path / "t", prompt="The quick brown fox")
    assert len(spy["workers"]) == 1 and len(spy["go"]) == 1 and spy["abandoned"] == [] and s.isolated
    assert 0 < s.preflight_seconds < s.startup_seconds and s.startup_cpu_seconds > 0
    assert spy["workers"][0].proc.returncode == 0


def test_baseline_is_timed_after_the_go(pair, tmp_path: Path) -> None:
    from mtpscope import traces

    s = record(RecordConfig(max_tokens=8, hidden="off", baseline=True), target=pair["target"],
               assistant=pair["noisy"], out=tmp_path / "t", prompt="The quick brown fox")
    b = traces.open(tmp_path / "t").manifest["baseline"]
    assert b["outputs_equal"] is True and b["n_tokens"] == len(s.outputs[0]) == 8
