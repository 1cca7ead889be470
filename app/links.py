"""Deep links: one view of the app (a page and what it shows) as a URL, and a URL back as that view.

Pure (standard library only, no Streamlit): the app reads and writes its pages' state with it
(:mod:`mtpscope.app.url_state`), and other commands build links to the app with it (``mtpscope diagnose``
gives each finding the link of the view that shows its evidence)::

    view_url("step", trace="/data/traces/f32", prompt=34, round=20)
        -> "/step?trace=%2Fdata%2Ftraces%2Ff32&prompt=34&round=20"
    parse_url("/step?prompt=34&round=20")  -> View(page="step", prompt=34, round=20)

A link names the page by its URL path (:data:`PAGES`, the ``url_path`` of each page in
``app/main.py``) and carries query parameters (:data:`PARAMS`): the selected files (``trace``,
``trace_b``, ``drafter``, ``target``: paths as the app's selection holds them), the prompt (a
``prompt_id``; ``all`` where a page can show every prompt), the round (0-based within its prompt, as the
trace's ``round`` column), the draft step (``step``: the 1-based draft position k of the trace's ``steps``
table) and a page's own filters. A parameter absent from a link leaves the app's selection as it is.

Checks come in two stages: :func:`parse_view` / :func:`view_url` refuse what is wrong in any trace (an
unknown page or parameter, a parameter the page does not show, a value that is not a number or not one
of the choices), :func:`check_in_trace` / :func:`check_step` what is outside the opened trace (no such
prompt, round or draft step). Each refusal is one :class:`mtpscope.errors.LinkError` naming the parameter,
the value given and what is allowed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from mtpscope.errors import LinkError

#: The app's pages by URL path (``st.Page(..., url_path=...)`` in ``app/main.py``); ``start`` is the app's root,
#: ``/`` (its links are ``/?trace=...``).
PAGES = ("start", "files", "tensors", "validate", "centroids", "values", "acceptance", "text", "step", "explain",
         "compare", "sweep", "server", "diagnose")
#: The start page (the app's root, ``/``).
START = "start"
#: The pages that show a trace (trace A) and read a prompt from their link.
TRACE_PAGES = ("acceptance", "text", "step", "explain", "compare")
#: The value of ``prompt`` meaning every prompt of the trace (Acceptance, Explain).
ALL = "all"
#: Query parameters Streamlit itself uses; a link may carry them and they are not the view's.
STREAMLIT_PARAMS = ("embed", "embed_options")

_SLOTS = ("trace", "trace_b", "drafter", "target")


@dataclass(frozen=True)
class Param:
    """One query parameter of a link.

    Attributes:
        name: the parameter (``round``).
        kind: ``path`` (a file or folder), ``text`` (a name), ``prompt`` (a prompt id or ``all``), ``int``
            (an integer >= ``minimum``) or ``choice`` (one of ``choices``).
        pages: the pages that read it.
        meaning: what it selects, in words.
        minimum: the smallest value of an ``int``.
        choices: the values of a ``choice``.
    """

    name: str
    kind: str
    pages: tuple[str, ...]
    meaning: str
    minimum: int = 0
    choices: tuple[str, ...] = ()

    def allowed(self, page: str | None = None) -> str:
        """What values are allowed, in words (``an integer >= 1``, ``one of status, class``)."""
        if self.kind == "path":
            return "a path under the app's allowed folders"
        if self.kind == "text":
            return "a name"
        if self.kind == "prompt":
            all_ok = page is None or page in PROMPT_ALL_PAGES
            return "a prompt id (an integer >= 0)" + (f" or {ALL!r}" if all_ok else "")
        if self.kind == "int":
            return f"an integer >= {self.minimum}"
        return "one of " + ", ".join(self.choices)


#: The pages where ``prompt=all`` (every prompt) is a view.
PROMPT_ALL_PAGES = ("acceptance", "explain")

#: Every query parameter a link may carry, in the order a link writes them.
PARAMS: dict[str, Param] = {p.name: p for p in (
    Param("trace", "path", PAGES, "the trace folder (trace A)"),
    Param("trace_b", "path", PAGES, "the second trace (Compare's trace B)"),
    Param("drafter", "path", PAGES, "the drafter GGUF"),
    Param("target", "path", PAGES, "the target GGUF"),
    Param("prompt", "prompt", TRACE_PAGES, "the prompt (prompt_id of trace A)"),
    Param("prompt_b", "int", ("compare",), "Compare's second prompt of one trace (prompt_id)"),
    Param("round", "int", ("text", "step"), "the verify round, 0-based within its prompt"),
    Param("step", "int", ("step",), "the draft step k of the round (1-based)", minimum=1),
    Param("window", "int", ("acceptance",), "the rolling window (rounds)", minimum=1),
    Param("colour", "choice", ("text",), "what colours the tokens", choices=("status", "class")),
    Param("mode", "choice", ("compare",), "two traces, or two prompts of trace A", choices=("traces", "prompts")),
    Param("tensor", "text", ("values",), "the tensor shown (a GGUF tensor name)"),
)}


@dataclass(frozen=True)
class View:
    """One view of the app: a page and the selection a link sets on it (None = leave as it is).

    Attributes:
        page: the page's URL path (:data:`PAGES`).
        trace / trace_b / drafter / target: paths (as given; the app checks them against its allowed
            folders).
        prompt: a ``prompt_id`` (int), or :data:`ALL` on the pages of :data:`PROMPT_ALL_PAGES`.
        prompt_b: Compare's second prompt.
        round: 0-based round within the prompt.
        step: the draft step k (1-based) of the round.
        window / colour / mode / tensor: the page filters of :data:`PARAMS`.
    """

    page: str
    trace: str | None = None
    trace_b: str | None = None
    drafter: str | None = None
    target: str | None = None
    prompt: int | str | None = None
    prompt_b: int | None = None
    round: int | None = None
    step: int | None = None
    window: int | None = None
    colour: str | None = None
    mode: str | None = None
    tensor: str | None = None

    def params(self) -> dict[str, str]:
        """The query parameters, in :data:`PARAMS` order, values as text; unset ones left out."""
        out: dict[str, str] = {}
        for name in PARAMS:
            v = getattr(self, name)
            if v is not None:
                out[name] = str(v)
        return out

    def url(self, base: str = "") -> str:
        """The link: ``base`` (e.g. ``http://127.0.0.1:8501``; empty: a path from the app's root),
        ``/page`` and the query string."""
        q = urlencode(self.params())
        return f"{base.rstrip('/')}/{'' if self.page == START else self.page}" + (f"?{q}" if q else "")

    @property
    def slots(self) -> dict[str, str]:
        """The selection slots the link sets (``trace``, ``trace_b``, ``drafter``, ``target`` -> path)."""
        return {s: getattr(self, s) for s in _SLOTS if getattr(self, s) is not None}

    @property
    def empty(self) -> bool:
        """True when the link sets nothing (the page as the selection has it)."""
        return not self.params()


_FIELDS = tuple(f.name for f in fields(View))


def _refuse(name: str, value: Any, message: str, allowed: str) -> LinkError:
    return LinkError(message, key=name, expected=allowed, actual=repr(value) if isinstance(value, str) else value)


def _check_page(page: str) -> str:
    if page not in PAGES:
        raise _refuse("page", page, "no such page in the app", "one of " + ", ".join(PAGES))
    return page


def _int(text: str) -> int | None:
    """``text`` as an integer (optional sign, ASCII digits), else None."""
    s = text.strip()
    body = s[1:] if s[:1] in "+-" else s
    return int(s) if body.isascii() and body.isdigit() else None


def _value(page: str, name: str, raw: Any) -> Any:
    """One parameter's value checked and typed (``raw``: text from a URL, or a value given in Python)."""
    p = PARAMS.get(name)
    if p is None:
        raise _refuse(name, raw, f"the app's links have no parameter {name!r}", "one of " + ", ".join(PARAMS))
    if page not in p.pages:
        shown = [q for q, pp in PARAMS.items() if page in pp.pages]
        raise _refuse(name, raw, f"the {page} page takes no {name!r}", f"one of {', '.join(shown)}")
    allowed = p.allowed(page)
    if p.kind in ("path", "text"):
        text = os.fspath(raw) if isinstance(raw, os.PathLike) else raw
        if not isinstance(text, str) or not text.strip() or "\x00" in text:
            raise _refuse(name, raw, f"link value is not {'a path' if p.kind == 'path' else 'a name'}", allowed)
        return text
    if p.kind == "choice":
        if not isinstance(raw, str) or raw not in p.choices:
            raise _refuse(name, raw, f"link value is not {p.meaning}", allowed)
        return raw
    if p.kind == "prompt" and isinstance(raw, str) and raw.strip().lower() == ALL:
        if page not in PROMPT_ALL_PAGES:
            raise _refuse(name, raw, f"the {page} page shows one prompt at a time", allowed)
        return ALL
    v = raw if isinstance(raw, int) and not isinstance(raw, bool) else _int(raw) if isinstance(raw, str) else None
    if v is None:
        raise _refuse(name, raw, "link value is not an integer", allowed)
    if v < p.minimum:
        raise _refuse(name, raw, "link value too small", allowed)
    return v


def make_view(page: str, **values: Any) -> View:
    """A :class:`View` of ``page`` with its values checked (None values left unset).

    Raises:
        LinkError: an unknown page or parameter, a parameter ``page`` does not show, or a value of the
            wrong kind (naming the parameter, the value and what is allowed).
    """
    _check_page(page)
    out: dict[str, Any] = {}
    for name, raw in values.items():
        if raw is None:
            continue
        out[name] = _value(page, name, raw)
    return View(page, **out)


def view_url(page: str, *, trace: str | os.PathLike[str] | None = None,
             trace_b: str | os.PathLike[str] | None = None, drafter: str | os.PathLike[str] | None = None,
             target: str | os.PathLike[str] | None = None, prompt: int | str | None = None,
             prompt_b: int | None = None, round: int | None = None, step: int | None = None,
             window: int | None = None, colour: str | None = None, mode: str | None = None,
             tensor: str | None = None, base: str = "") -> str:
    """The link that opens ``page`` on a view: ``base`` + ``/page?name=value&...``.

    Args:
        page: a page's URL path (:data:`PAGES`).
        trace / trace_b / drafter / target: paths to select (as the app will check them: under its
            allowed folders; absolute paths are the safe choice).
        prompt: a ``prompt_id``, or ``"all"`` on Acceptance / Explain.
        prompt_b: Compare's second prompt (``mode="prompts"``).
        round: the round, 0-based within ``prompt`` (Text, Step).
        step: the draft step k, 1-based (Step).
        window: Acceptance's rolling window (rounds); colour: Text's ``status`` / ``class``; mode:
            Compare's ``traces`` / ``prompts``; tensor: Tensor values' tensor name.
        base: the app's address, e.g. ``http://127.0.0.1:8501``; empty for a path from the app's root.

    Returns:
        The URL; parameters in :data:`PARAMS` order, values percent-encoded.

    Raises:
        LinkError: as :func:`make_view` (a link that the app would refuse is never built).
    """
    return make_view(page, trace=trace, trace_b=trace_b, drafter=drafter, target=target, prompt=prompt,
                     prompt_b=prompt_b, round=round, step=step, window=window, colour=colour, mode=mode,
                     tensor=tensor).url(base)


def parse_view(page: str, query: Mapping[str, str | Sequence[str]], other_pages: str = "refuse") -> View:
    """The view a page's query parameters ask for (``st.query_params`` as a dict; a repeated parameter
    counts once when its values agree). Streamlit's own parameters (:data:`STREAMLIT_PARAMS`) are skipped.

    Args:
        page: the page's URL path.
        query: parameter -> value (or values).
        other_pages: ``"refuse"`` a parameter of the app's links that ``page`` does not take (a link
            built by hand), or ``"ignore"`` it (the app's own address bar: the browser's Back button can
            pair a page with the parameters of the page shown after it).

    Raises:
        LinkError: the first bad parameter: unknown, not taken by ``page`` (with ``other_pages="refuse"``),
            given twice with different values, or a value of the wrong kind.
    """
    _check_page(page)
    values: dict[str, Any] = {}
    for name, raw in query.items():
        if name in STREAMLIT_PARAMS:
            continue
        if other_pages == "ignore" and name in PARAMS and page not in PARAMS[name].pages:
            continue
        if isinstance(raw, (list, tuple)):
            distinct = list(dict.fromkeys(raw))
            if len(distinct) != 1:
                raise _refuse(name, ", ".join(map(str, raw)), "link parameter given more than once",
                              "one value")
            raw = distinct[0]
        values[name] = raw
    return make_view(page, **values)


def parse_url(url: str) -> View:
    """The view of a link (absolute URL or path; the page is the path's last part, the app's root
    being ``start``).

    Raises:
        LinkError: as :func:`parse_view`.
    """
    parts = urlsplit(url)
    page = parts.path.rstrip("/").rsplit("/", 1)[-1] or START
    query: dict[str, list[str]] = {}
    for k, v in parse_qsl(parts.query, keep_blank_values=True):
        query.setdefault(k, []).append(v)
    return parse_view(page, query)


def _span(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}–{hi}"


def check_in_trace(view: View, prompt_rounds: Mapping[int, tuple[int, int]],
                   current_prompt: int | None = None) -> None:
    """Refuse a view whose prompt or round is not in the opened trace.

    Args:
        view: the view a link asked for.
        prompt_rounds: ``prompt_id -> (first round, last round)`` of trace A (its ``rounds`` table).
        current_prompt: the prompt a ``round`` without ``prompt`` belongs to (the page's current one).

    Raises:
        LinkError: ``prompt`` / ``prompt_b`` not a prompt of the trace, or ``round`` outside its prompt's
            rounds (the message names the allowed ids or range).
    """
    ids = sorted(prompt_rounds)
    allowed = _ids_text(ids)
    for name in ("prompt", "prompt_b"):
        v = getattr(view, name)
        if v is not None and v != ALL and v not in prompt_rounds:
            raise _refuse(name, v, "no such prompt in this trace", allowed)
    if view.round is None:
        return
    pid = view.prompt if isinstance(view.prompt, int) else current_prompt
    if pid is None or pid not in prompt_rounds:
        raise _refuse("round", view.round, "a round needs its prompt", f"prompt= one of {allowed}")
    lo, hi = prompt_rounds[pid]
    if not lo <= view.round <= hi:
        raise _refuse("round", view.round, f"no such round of prompt {pid}", f"a round {_span(lo, hi)}")


def check_offered(view: View, name: str, offered: Sequence[Any]) -> None:
    """Refuse a view whose ``name`` value is not among the values the page ``offered`` (e.g. Acceptance's
    rolling windows).

    Raises:
        LinkError: the value is set and not in ``offered``.
    """
    v = getattr(view, name)
    if v is not None and v not in offered:
        raise _refuse(name, v, f"the {view.page} page does not offer this value",
                      "one of " + ", ".join(map(str, offered)))


def check_step(view: View, n_draft: int, where: str) -> None:
    """Refuse a view whose ``step`` (draft position k) is past the round's drafts.

    Args:
        view: the view a link asked for.
        n_draft: how many tokens the round drafted.
        where: the round in words (``prompt 3, round 20``).

    Raises:
        LinkError: ``step`` > ``n_draft`` (or any step of a round that drafted nothing).
    """
    if view.step is None or view.step <= n_draft:
        return
    allowed = f"a step 1–{n_draft}" if n_draft > 1 else "step 1" if n_draft == 1 else "no step (it drafted nothing)"
    raise _refuse("step", view.step, f"no such draft step in {where}", allowed)


def _ids_text(ids: Sequence[int], most: int = 12) -> str:
    """Prompt ids in words: ``0–35`` for a contiguous run, else the first ``most`` of them."""
    if not ids:
        return "none (the trace has no rounds)"
    if ids[-1] - ids[0] + 1 == len(ids):
        return f"a prompt {_span(ids[0], ids[-1])}"
    head = ", ".join(map(str, ids[:most]))
    return f"one of {head}" + (f", … ({len(ids)} prompts)" if len(ids) > most else "")


__all__ = ["ALL", "PAGES", "PARAMS", "PROMPT_ALL_PAGES", "START", "STREAMLIT_PARAMS", "TRACE_PAGES", "Param", "View",
           "check_in_trace", "check_offered", "check_step", "make_view", "parse_url", "parse_view", "view_url"]
