"""Helpers shared by the CLI modules: turning our errors into one line on stderr and an exit code, and the
checks of option values that typer would otherwise answer with its usage box (``--n-draft``, a GGUF path
that is a folder, an output folder that is a file)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import typer

from mtpscope.errors import MtpscopeError
from mtpscope.traces.run.record_config import DEFAULT_N_DRAFT, MAX_N_DRAFT

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_UNREADABLE = 2

#: ``--n-draft``'s allowed range in words (the recorder's rule: :data:`traces.run.record_config.MAX_N_DRAFT`)
N_DRAFT_RANGE = f"an integer in 1..{MAX_N_DRAFT}"
#: what the command line prints for a value that is not there (None, NaN), in every table (the app has its own:
#: ``app.formats.MISSING``)
MISSING = "-"

#: the signals that stop a command as a Ctrl-C does (:func:`stop_signals_as_interrupt`): a service manager or
#: ``timeout`` (SIGTERM), a closed terminal (SIGHUP)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
#: the stop signal that arrived, if one did (:func:`stopped_by`)
_stopped: dict[str, int | None] = {"signum": None}


def _stop_as_interrupt(signum: int, frame: Any) -> None:
    _stopped["signum"] = signum
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):     # Python's, or the recorder's that defers a Ctrl-C past llama.cpp's decode
        handler(signal.SIGINT, frame)
    else:                     # SIGINT ignored (a background job): stop all the same
        raise KeyboardInterrupt


@contextlib.contextmanager
def stop_signals_as_interrupt() -> Iterator[None]:
    """Within the block, :data:`STOP_SIGNALS` stop the command as a Ctrl-C does: through the SIGINT handler in place
    when one arrives (so ``record`` keeps the rounds finished, marked incomplete, and says so), instead of
    ending the process on the spot with nothing said. :func:`stopped_by` names the signal afterwards. No-op off
    the main thread (where Python cannot install handlers)."""
    _stopped["signum"] = None
    try:
        old = {s: signal.signal(s, _stop_as_interrupt) for s in STOP_SIGNALS}
    except ValueError:        # not the main thread
        yield
        return
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def stacks_on_sigusr1() -> None:
    """From now on ``kill -USR1 <pid>`` prints every thread's Python stack to stderr and the command goes on
    (Python's :mod:`faulthandler`, which writes from the signal handler itself, so it answers while the main
    thread is blocked in C): where a command that seems stuck is. No-op where SIGUSR1 does not exist or stderr
    is not a file (a test's captured stream)."""
    import faulthandler

    if hasattr(signal, "SIGUSR1"):
        with contextlib.suppress(AttributeError, OSError, ValueError):    # (io.UnsupportedOperation: an OSError)
            faulthandler.register(signal.SIGUSR1, all_threads=True)


def stopped_by() -> tuple[str, int] | None:
    """The stop signal that ended the command (``("SIGTERM", 143)``: its name and the exit status a shell gives
    a process it killed, 128 + its number), or None after a Ctrl-C or no signal."""
    n = _stopped["signum"]
    return None if n is None else (signal.Signals(n).name, 128 + n)


def interrupted_words(note: str | None = None) -> tuple[str, int]:
    """The line (without ``mtpscope: ``) and exit status for a command stopped by Ctrl-C or a stop signal:
    ``note`` (what the command kept, starting with "interrupted") or "interrupted", with "interrupted" turned
    into "stopped by SIGTERM" when that is what stopped it; 130 after a Ctrl-C, 128 + the signal's number else."""
    text = note or "interrupted"
    got = stopped_by()
    if got is None:
        return text, 130
    name, code = got
    if text.startswith("interrupted"):
        text = f"stopped by {name}" + text[len("interrupted"):]
    return text, code


def fmt(v: Any, spec: str = ".3f") -> str:
    """``v`` formatted with ``spec``, or :data:`MISSING` for None and NaN (a value ``spec`` does not fit: as ``str``)."""
    if v is None or (isinstance(v, float) and v != v):
        return MISSING
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


def trace_head(path: Any, source: Any, complete: bool, *, n_read: int | None = None,
               n_recorded: int | None = None, upper: bool = False) -> str:
    """The first line of ``report`` and ``explain``: ``trace: PATH (source S, complete)``; ``INCOMPLETE`` for a
    trace whose manifest says so (``upper``: "complete" is left out, only INCOMPLETE is said); with ``n_recorded``
    (:meth:`traces.store.reader.Trace.rounds_not_read`) "; 16 of its 20 rounds read: a rounds part is missing or
    unreadable, see the warnings", so that a complete trace with a lost part does not read as whole."""
    state = ("" if complete else "INCOMPLETE") if upper else ("complete" if complete else "INCOMPLETE")
    words = [f"source {source}"] + ([state] if state else [])
    lost = (f"; {n_read} of its {n_recorded} rounds read: a rounds part is missing or unreadable, see the warnings"
            if n_recorded is not None and n_read is not None else "")
    return f"trace: {path} ({', '.join(words)}{lost})"


def replaces_words(what: str, path: Path) -> str | None:
    """``"replaces the WHAT already there (written YYYY-MM-DD HH:MM)"`` when ``path`` (a command's output file)
    exists, else None: a command that rewrites its output folder says so before it works (``diagnose``,
    ``replay --out``)."""
    import time

    if not path.is_file():
        return None
    made = time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime))
    return f"replaces the {what} already there (written {made})"


@contextlib.contextmanager
def one_line_errors(code: int = EXIT_UNREADABLE, *,
                    refusals: tuple[type[MtpscopeError], ...] = ()) -> Iterator[None]:
    """Turn any :class:`MtpscopeError` (or ``OSError``) raised inside into one line on stderr and
    ``exit(code)``; an error of one of the ``refusals`` types (readable input that a check refuses,
    e.g. ``LayoutError`` for ``record``'s pre-flight) exits with :data:`EXIT_FINDINGS` instead."""
    try:
        yield
    except MtpscopeError as e:
        print(f"mtpscope: {e.one_line()}", file=sys.stderr)
        raise typer.Exit(EXIT_FINDINGS if isinstance(e, refusals) else code) from None
    except OSError as e:
        print(f"mtpscope: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        raise typer.Exit(code) from None


def refuse(error: MtpscopeError, code: int = EXIT_UNREADABLE) -> NoReturn:
    """Print ``error`` as one line on stderr (``mtpscope: ...``, as :func:`one_line_errors`) and exit with
    ``code``; for checks that run while typer parses the command line, outside any :func:`one_line_errors`.

    Raises:
        typer.Exit: always, with ``code``.
    """
    print(f"mtpscope: {error.one_line()}", file=sys.stderr)
    raise typer.Exit(code)


def check_n_draft(value: Any, option: str = "--n-draft") -> int:
    """``value`` (the command line's text, or an int) as drafts per round, 1..:data:`MAX_N_DRAFT`.

    Raises:
        MtpscopeError: not an integer, or out of range; ``key`` = ``option``, expected
            :data:`N_DRAFT_RANGE`, actual the value as given.
    """
    n: int | None
    if isinstance(value, bool):
        n = None
    elif isinstance(value, int):
        n = value
    else:
        try:
            n = int(str(value).strip())
        except ValueError:
            n = None
    if n is None:
        raise MtpscopeError("drafts per round must be a whole number", key=option, expected=N_DRAFT_RANGE,
                            actual=repr(value) if isinstance(value, str) else value)
    if not 1 <= n <= MAX_N_DRAFT:
        raise MtpscopeError("drafts per round out of range", key=option, expected=N_DRAFT_RANGE, actual=value)
    return n


def _parse_n_draft(value: Any) -> int:
    try:
        return check_n_draft(value)
    except MtpscopeError as e:
        refuse(e)


def _parse_n_drafts(value: Any) -> tuple[int, ...]:
    items = str(value).replace(" ", "").split(",")
    expected = f"integers in 1..{MAX_N_DRAFT} separated by commas, e.g. 1,2,3"
    if not any(items):
        refuse(MtpscopeError("no drafts per round given", key="--n-draft", expected=expected, actual=repr(value)))
    if len(items) == 1:                 # one value: the same line as every other command's --n-draft
        return (_parse_n_draft(items[0]),)
    out: list[int] = []
    for x in items:
        if not x:                       # (was: dropped, so "1,,2" ran two of the three values it seemed to name)
            refuse(MtpscopeError("an empty item between commas", key="--n-draft", expected=expected,
                                 actual=repr(value)))
        try:
            n = check_n_draft(x)
        except MtpscopeError as e:
            refuse(MtpscopeError(f"{x!r}: {e.message}", key="--n-draft", expected=expected, actual=repr(value)))
        if n in out:                    # (a task per value: one given twice would be recorded twice)
            refuse(MtpscopeError(f"{n} given twice", key="--n-draft", expected=expected + ", each once",
                                 actual=repr(value)))
        out.append(n)
    return tuple(out)


def n_draft_option(help: str, default: int | None = DEFAULT_N_DRAFT) -> Any:
    """The ``--n-draft N`` option of every command that takes one (``typer.Option``): drafts per round in
    1..:data:`MAX_N_DRAFT`, checked while the command line is parsed, so a bad value (``0``, ``-1``,
    ``three``) is one line on stderr and exit 2 (:func:`check_n_draft`) before the command runs, never
    typer's usage box. ``default``: :data:`DEFAULT_N_DRAFT`, or None where the command finds it elsewhere."""
    return typer.Option(default, "--n-draft", parser=_parse_n_draft, metavar="N",
                        help=f"{help} ({N_DRAFT_RANGE.removeprefix('an ')})")


def n_drafts_option(help: str, default: str = str(DEFAULT_N_DRAFT)) -> Any:
    """``--n-draft 1,2,3`` (``sweep``): one or more drafts per round separated by commas, each checked as
    :func:`n_draft_option` checks one; the command gets a ``tuple[int, ...]``."""
    return typer.Option(default, "--n-draft", parser=_parse_n_drafts, metavar="N[,N...]",
                        help=f"{help} (each {N_DRAFT_RANGE.removeprefix('an ')})")


def check_gguf_path(value: str | os.PathLike[str] | None, option: str) -> None:
    """Refuse a GGUF argument that names a folder (``--target DIR``), in one line naming the option.

    A URL (``https://``, ``hf://``), a missing path or a file passes: the reader says what is wrong with it.

    Raises:
        MtpscopeError: ``path`` = the folder, ``key`` = ``option``, expected a GGUF file, got a folder.
    """
    if value is None:
        return
    s = os.fspath(value)
    if "://" in s:
        return
    if Path(s).is_dir():
        raise MtpscopeError("is a folder, not a GGUF file", path=s, key=option, expected="a GGUF file",
                            actual="a folder")


def gguf_path(param: typer.CallbackParam, value: Any) -> Any:
    """A typer ``callback=`` for a GGUF path option or argument (one path, or a list of them whose items may be
    ``NAME=PATH``, as ``sweep --assistant`` takes them): a folder is refused by :func:`check_gguf_path` in one line, exit 2,
    while the command line is parsed. Returns ``value`` unchanged."""
    option = _option_name(param)
    many = isinstance(value, (list, tuple))
    for v in value if many else [value]:
        if v is None:
            continue
        s = os.fspath(v)
        try:
            check_gguf_path(s, option)
            if many and "=" in s and not Path(s).exists():          # sweep's NAME=PATH
                check_gguf_path(s.split("=", 1)[1], option)
        except MtpscopeError as e:
            refuse(e)
    return value


def _option_name(param: typer.CallbackParam) -> str:
    """The option's first long name (``--out``), or the argument's name in capitals."""
    return param.opts[0] if param.opts and param.opts[0].startswith("-") else str(param.name).upper()


def _file_above(value: Path) -> Path | None:
    """The nearest existing path among ``value`` and its parents when that is not a folder (a file, or anything
    else that cannot hold a folder), else None (the nearest existing one is a folder, or none exists)."""
    for p in (value, *value.parents):
        if p.exists():
            return None if p.is_dir() else p
    return None


def out_folder(param: typer.CallbackParam, value: Path | None) -> Path | None:
    """A typer ``callback=`` for an output folder option (``record`` / ``sweep`` / ``probe`` / ``diagnose`` /
    ``replay`` / ``import`` / ``demo build`` / ``demo train`` ``--out``), so checked while the command line is parsed, before any model loads or any work starts:
    the folder, new or existing. An existing file, or a path below one, is refused in one line naming it and the
    option, exit 2 (the command's writer would refuse it only after the long work). Returns ``value``."""
    if value is None:
        return value
    p = _file_above(value)
    if p is not None:
        why = "is a file, not a folder" if p == value else f"lies below {p}, a file, not a folder"
        refuse(MtpscopeError(why, path=value, key=_option_name(param), expected="a folder, new or existing",
                             actual="a file"))
    return value


def out_file(param: typer.CallbackParam, value: Path | None) -> Path | None:
    """A typer ``callback=`` for an output file option written after long work (``diagnose --html``, ``convert --out``
    and ``--centroids-out``), checked while
    the command line is parsed: a path that is an existing folder, or that lies below a file, is refused in one
    line naming it and the option, exit 2. Returns ``value``."""
    if value is None:
        return value
    if value.is_dir():
        refuse(MtpscopeError("is a folder, not a file", path=value, key=_option_name(param),
                             expected="a file, new or existing", actual="a folder"))
    p = _file_above(value.parent)
    if p is not None:
        refuse(MtpscopeError(f"lies below {p}, a file, not a folder", path=value, key=_option_name(param),
                             expected="a file in a folder, new or existing", actual="a file"))
    return value


def model_path(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """A typer ``callback=`` for ``--target`` / ``--assistant`` of a command with a ``--runtime`` option (eager,
    so it is parsed first): a GGUF file (:func:`gguf_path`) for llama.cpp (``llama``, the default), a Hugging Face
    checkpoint folder holding a config.json for any other runtime; else one line, exit 2. Returns ``value``."""
    if ctx.params.get("runtime", "llama") != "llama":
        if value is not None and not (Path(value) / "config.json").is_file():
            print(f"mtpscope: {param.opts[0]}: not a Hugging Face checkpoint folder (no config.json): {value}",
                  file=sys.stderr)
            raise typer.Exit(EXIT_UNREADABLE)
        return value
    return gguf_path(param, value)

