"""Helpers shared by the CLI modules: turning our errors into one line on stderr and an exit code."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import typer

from mtpscope.errors import MtpscopeError

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_UNREADABLE = 2


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
