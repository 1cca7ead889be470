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


def test_a_prespawned_worker_runs_the_recording_and_reports_its_clock(pair, tmp_path: Path, spy) -> None:
    """``mtpscope record`` starts its worker before importing the recorder (worker_spawn.prespawn): the next
    RecordWorker takes that very process, which loads and decodes the job sent to it later."""
    from mtpscope.traces.run import worker_spawn

    hellos: list[Any] = []
    hello = W.RecordWorker.hello

    def spy_hello(self: Any) -> Any:
        hellos.append(hello(self))
        return hellos[-1]

    W.RecordWorker.hello = spy_hello  # type: ignore[method-assign]  # restored below
    try:
        worker_spawn.prespawn()
        early = worker_spawn._prespawned[-1]
        s = record(RecordConfig(max_tokens=4, hidden="off"), target=pair["target"], assistant=pair["noisy"],
                   out=tmp_path / "t", prompt="The quick brown fox")
    finally:
        W.RecordWorker.hello = hello  # type: ignore[method-assign]  # the original
        worker_spawn.discard_prespawned()
    assert len(spy["workers"]) == 1 and spy["workers"][0].proc is early.proc
    assert hellos[0].pid == early.proc.pid and s.n_generated == 4 and early.proc.returncode == 0
    assert worker_spawn.take_prespawned() is None                    # handed out once
    st = hellos[0].startup                                            # the worker's start-up clock, in order
    assert early.spawned_at <= st["main"] <= st["job"] <= st["runtime"] <= st["prompts"]
    assert all(st[k + "_cpu"] > 0 for k in ("main", "job", "runtime", "prompts"))


def test_a_prespawned_worker_nobody_takes_is_killed(pair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``record`` command that fails before recording (an unreadable prompts file) leaves no worker behind."""
    from typer.testing import CliRunner

    from mtpscope.cli.main import app
    from mtpscope.traces.run import worker_spawn

    spawned: list[worker_spawn.SpawnedWorker] = []
    spawn = worker_spawn.spawn_worker

    def spy_spawn() -> worker_spawn.SpawnedWorker:
        spawned.append(spawn())
        return spawned[-1]

    monkeypatch.setattr(worker_spawn, "spawn_worker", spy_spawn)
    r = CliRunner().invoke(app, ["record", "--target", str(pair["target"]), "--assistant", str(pair["noisy"]),
                                 "--prompts", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "t")])
    assert r.exit_code == 2, r.output
    assert len(spawned) == 1 and spawned[0].proc.returncode is not None   # started early, then killed
    assert worker_spawn.take_prespawned() is None and not (tmp_path / "t").exists()
