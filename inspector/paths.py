"""File checks shared by the readers."""

from __future__ import annotations

import os
import stat

from inspector.errors import InspectorError


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
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode)
                or stat.S_ISBLK(st.st_mode) else "not a regular file")
        raise error("not a regular file", path=path, expected="a regular file", actual=kind)
    return st.st_size
