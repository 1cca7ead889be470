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


@pytest.mark.parametrize(("argv", "line"), [
    (["record", "--max-tokens", "0"],
     "mtpscope record: Invalid value for '--max-tokens': "),
    (["record", "--bogus"], "mtpscope record: No such option: --bogus"),
    (["bogus"], "mtpscope: No such command 'bogus'."),
    (["record", "--threads", "abc"], "mtpscope record: Invalid value for '--threads': "),
    (["record", "--n-gpu-layers", "-5"], "mtpscope record: Invalid value for '--n-gpu-layers': "),
])
def test_a_usage_error_is_one_line_exit_2(argv: list[str], line: str, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A bad option or value, an unknown option or command: one line naming the command and the option, and where
    its help is (the project's rule for bad input), not a framed usage box; exit 2 as click's own."""
    monkeypatch.setattr("sys.argv", ["mtpscope", *argv])
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith(line) and err.rstrip().endswith("--help)"), err
    assert "Usage:" not in err and "╭" not in err and out == ""


def test_a_bare_group_shows_its_help_exit_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.argv", ["mtpscope", "trace"])
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 2 and "Usage: mtpscope trace" in capsys.readouterr().out


def test_stop_signals_stop_a_command_as_ctrl_c_does() -> None:
    """SIGHUP (a closed terminal) inside the block raises KeyboardInterrupt through the SIGINT handler, names itself
    (exit status 128 + 1 = 129, as a shell reports a process it hung up), and the old handlers come back after."""
    import os
    import signal

    from mtpscope.cli.common import interrupted_words, stop_signals_as_interrupt, stopped_by

    before = signal.getsignal(signal.SIGHUP)
    with pytest.raises(KeyboardInterrupt), stop_signals_as_interrupt():
        os.kill(os.getpid(), signal.SIGHUP)
        for _ in range(1000):      # the handler runs at the next bytecode boundary
            pass
    assert stopped_by() == ("SIGHUP", 129)
    assert interrupted_words("interrupted: 3 rounds kept in t, marked incomplete") == (
        "stopped by SIGHUP: 3 rounds kept in t, marked incomplete", 129)
    assert signal.getsignal(signal.SIGHUP) is before
    with stop_signals_as_interrupt():      # a new command: nothing stopped it yet
        assert stopped_by() is None
    assert interrupted_words() == ("interrupted", 130)


def test_sigusr1_prints_where_each_thread_is_and_the_command_goes_on() -> None:
    """``kill -USR1`` on a command that seems stuck: every thread's Python stack on stderr (the function it is in,
    by name), and the command carries on (SIGUSR1's default action would end it)."""
    import subprocess
    import sys

    code = ("import os, signal, threading, time\n"
            "from mtpscope.cli.common import stacks_on_sigusr1\n"
            "def waiting_here(): threading.Event().wait(0.5)\n"
            "t = threading.Thread(target=waiting_here); t.start(); time.sleep(0.1)\n"
            "stacks_on_sigusr1()\n"
            "os.kill(os.getpid(), signal.SIGUSR1)\n"
            "t.join(); print('went on')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "went on"
    assert "waiting_here" in done.stderr and done.stderr.count("hread 0x") == 2, done.stderr


def test_help_piped_is_120_columns_wide_unless_columns_says_otherwise() -> None:
    """``mtpscope record --help | less``: rich's default of 80 columns squeezed each option's help into a column a
    word wide; piped help is 120 columns wide now, a terminal keeps its own width, and ``COLUMNS`` still decides."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH", "LINES")}

    def widest(extra: dict[str, str]) -> int:
        r = subprocess.run([sys.executable, "-m", "mtpscope.cli", "record", "--help"], capture_output=True, text=True,
                           env={**env, **extra}, timeout=120)
        assert r.returncode == 0, r.stderr
        return max(len(line) for line in r.stdout.splitlines())

    assert widest({}) == cli.PIPED_HELP_COLUMNS
    assert widest({"COLUMNS": "80"}) == 80


def test_no_help_text_shows_rst_markup() -> None:
    """Every command's and option's help as ``--help`` shows it: no reStructuredText ````--out```` markup (a
    docstring's double backticks print as they are; replay's help did)."""
    from typing import Any

    import typer

    def walk(cmd: Any, path: str) -> list[str]:      # (typer's own command classes: groups have .commands)
        found = [f"{path}: {t}" for t in [cmd.help or "", *(getattr(p, "help", None) or "" for p in cmd.params)]
                 if "``" in t]
        for name, sub in getattr(cmd, "commands", {}).items():
            found += walk(sub, f"{path} {name}")
        return found

    root = typer.main.get_command(cli.app)
    assert len(getattr(root, "commands", {})) > 5
    assert walk(root, "mtpscope") == []
