"""The CLI entry point's last line of defence: an exception that escapes a command is one line."""

from __future__ import annotations

import pytest

from mtpscope.cli import main as cli


def _boom(**_kw: object) -> None:
    raise ValueError("kaboom")


def test_escaped_exception_is_one_line_exit_3(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "app", _boom)
    monkeypatch.delenv("MTPSCOPE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ValueError: kaboom" in err and "Traceback" not in err


def test_debug_shows_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "app", _boom)
    monkeypatch.setenv("MTPSCOPE_DEBUG", "1")
    with pytest.raises(ValueError, match="kaboom"):
        cli.main()
