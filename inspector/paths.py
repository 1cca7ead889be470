"""File checks shared by the readers."""

from __future__ import annotations

import os
import stat

from mtpscope.errors import InspectorError


def file_kind(mode: int) -> str:
    """What a non-regular ``st_mode`` is, in words ("a FIFO", "a directory", "a device", ...)."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def require_regular_file(path: str | os.PathLike[str], error: type[InspectorError] = InspectorError) -> int:
    """Size in bytes of ``path`` if it is a regular file (symlinks followed); else raise ``error``.

    Checked before any ``open()``: opening a FIFO blocks until a writer appears, and a device such as
    ``/dev/zero`` has no size, so both would hang or mislead a reader.

    Raises:
        error: ``path`` is a FIFO, socket, device or directory (naming which).
        OSError: ``path`` does not exist or cannot be stat'ed.
    """
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise error("not a regular file", path=path, expected="a regular file", actual=file_kind(st.st_mode))
    return st.st_size
