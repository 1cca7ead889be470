"""Deep links into the app: a page and its parameters as a URL (pure, standard library only).

MINIMAL VERSION (branch issue-27, ``mtpscope diagnose``): only :func:`view_url`, with the signature that the
deep-link work of issue 27 (branch issue-27-app: ``app/links.py`` with ``parse_url``, the checks and the pages'
URL state) defines; the coordinator keeps that module at merge. Here it turns a finding's
:class:`mtpscope.traces.diagnose.records.ViewRef` into the link that the CLI prints, the HTML report carries and
the Diagnose page opens.

    view_url("step", trace="/data/traces/f32", prompt=34, round=20)
        -> "/step?trace=%2Fdata%2Ftraces%2Ff32&prompt=34&round=20"
"""

from __future__ import annotations

import os
from urllib.parse import urlencode

from mtpscope.errors import MtpscopeError

#: Parameters a link may carry, in the order a link writes them.
PARAMS = ("trace", "trace_b", "drafter", "target", "prompt", "prompt_b", "round", "step", "window", "colour", "mode",
          "tensor")


def view_url(page: str, *, trace: str | os.PathLike[str] | None = None,
             trace_b: str | os.PathLike[str] | None = None, drafter: str | os.PathLike[str] | None = None,
             target: str | os.PathLike[str] | None = None, prompt: int | str | None = None,
             prompt_b: int | None = None, round: int | None = None, step: int | None = None,  # noqa: A002
             window: int | None = None, colour: str | None = None, mode: str | None = None,
             tensor: str | None = None, base: str = "") -> str:
    """The link that opens ``page`` (its URL path, e.g. ``step``) on a view: ``base`` + ``/page?name=value&...``
    (parameters in :data:`PARAMS` order, unset ones left out, values percent-encoded).

    Raises:
        MtpscopeError: an empty page name.
    """
    if not page or "/" in page:
        raise MtpscopeError("a link needs a page name", key="page", expected="a page's URL path", actual=page)
    values = {"trace": trace, "trace_b": trace_b, "drafter": drafter, "target": target, "prompt": prompt,
              "prompt_b": prompt_b, "round": round, "step": step, "window": window, "colour": colour, "mode": mode,
              "tensor": tensor}
    q = urlencode([(k, os.fspath(v) if isinstance(v, os.PathLike) else str(v))
                   for k, v in values.items() if v is not None])
    return f"{base.rstrip('/')}/{page}" + (f"?{q}" if q else "")


__all__ = ["PARAMS", "view_url"]
