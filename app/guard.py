"""The app's error guard: an error in a block of a page is one line in the page, never a traceback.

:func:`guard` turns an mtpscope error (or an OS error) into the inspector's one-line message in the page;
anything else is a bug: it is shown as one ``internal error (Type: message) while <what> — please report``
line (:func:`internal_error_line`) instead of a traceback (set ``MTPSCOPE_DEBUG=1`` to let it propagate).
``main.py`` runs every page inside one, the last line of defence.

Imports: streamlit, mtpscope.errors.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import streamlit as st

from mtpscope.errors import MtpscopeError


@contextlib.contextmanager
def guard(what: str = "") -> Iterator[None]:
    """Show mtpscope / OS errors as one line (``st.error``) and anything else as one ``internal error``
    line (:func:`internal_error_line`); the rest of the ``with`` block is skipped."""
    try:
        yield
    except MtpscopeError as e:
        st.error(e.one_line(), icon=":material/error:")
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        st.error(f"{where}{e.strerror or e}", icon=":material/error:")
    except Exception as e:  # last line of defence: one line, never a traceback
        if os.environ.get("MTPSCOPE_DEBUG"):
            raise
        st.error(internal_error_line(e, what), icon=":material/bug_report:")


def internal_error_line(e: BaseException, what: str = "") -> str:
    """One line for an unexpected exception: ``internal error (Type: message) while <what> — please
    report`` (the message collapsed to one line and cut at 300 characters)."""
    msg = " ".join(str(e).split())
    if len(msg) > 300:
        msg = msg[:297] + "..."
    body = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
    return f"internal error ({body}) while {what or 'rendering this page'} — please report"


def status_line(e: BaseException) -> str:
    """One line for an error (mtpscope errors give their own)."""
    if isinstance(e, MtpscopeError):
        return e.one_line()
    return f"{type(e).__name__}: {e}"
