"""The view in the address bar: a page's state read from its URL on arrival and written back as it changes.

A link (:mod:`mtpscope.app.links`) opens a page on a view: ``/step?trace=DIR&prompt=34&round=20``. The router
calls :func:`arrive` before the sidebar: it parses the page's query parameters and selects the files they
name (a path outside the allowed folders, missing, or a target offered as the drafter is refused, the
selection kept); what the page itself shows (prompt, round, step, filters) the page takes with
:func:`requested` and :func:`take_prompt_round`. Each trace page then writes its state with :func:`publish`,
so the address bar always holds the link of what is shown. A URL the app wrote itself, or already took, is
not taken again (the widgets own the view between links); a new one (typed, pasted, Back / Forward, a
link from ``mtpscope diagnose``) is.

A bad value is refused in one line naming the parameter, the value and what is allowed, and the page
stops there: nothing of another prompt or round is shown under it.

Imports: streamlit, ``links``, ``loaders``, ``selection``, mtpscope.errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NoReturn
from urllib.parse import urlsplit

import streamlit as st

from mtpscope.app import links, loaders
from mtpscope.app import selection as sel
from mtpscope.errors import LinkError, MtpscopeError


def _query() -> dict[str, list[str]]:
    """The page's query parameters (every value of a repeated one), Streamlit's own left out."""
    qp = st.query_params
    return {k: qp.get_all(k) for k in qp if k not in links.STREAMLIT_PARAMS}


def _seen_key(page: str, params: Mapping[str, object]) -> tuple:
    """What :func:`arrive` compares a URL's query with: its parameters alone, not the page. A query the app wrote
    itself (on any page: one that stays in the address bar when another page is opened) is not a new link; taking
    it again would select the files it names over what the user chose since (``page`` is kept for the callers)."""
    del page
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else (str(v),)) for k, v in params.items()))


def arrive(page: str) -> None:
    """Take this run's URL for ``page`` (a URL path of :data:`mtpscope.app.links.PAGES`; others are
    ignored): when it is not the one last written or taken, parse it and select the files it names.
    Leaves for the page the view asked for, or the refusal (see :func:`requested`)."""
    st.session_state.pop(sel.URL_ARRIVAL, None)
    if page not in links.PAGES:
        return
    q = _query()
    if not q or _seen_key(page, q) == st.session_state.get(sel.URL_SEEN):
        return
    try:
        view = links.parse_view(page, q, other_pages="ignore")
        for slot, path in _ordered_slots(view):
            why = loaders.slot_refusal(slot, path)
            if why:
                raise LinkError(why, key=slot)
            if slot == sel.TRACE:
                sel.select_trace(path)
            else:
                sel.set_(slot, path)
    except MtpscopeError as e:
        st.session_state[sel.URL_ARRIVAL] = e.one_line()
        return
    st.session_state[sel.URL_ARRIVAL] = view
    if page not in links.TRACE_PAGES:  # nothing for the page to check: taken
        st.session_state[sel.URL_SEEN] = _seen_key(page, q)


def _ordered_slots(view: links.View) -> list[tuple[str, str]]:
    """The link's files, the trace first (it selects the models that recorded it; a link's own drafter or
    target then wins)."""
    slots = view.slots
    order = (sel.TRACE, sel.TRACE_B, sel.DRAFTER, sel.TARGET)
    return [(s, slots[s]) for s in order if s in slots]


def refusal() -> str | None:
    """The one-line refusal of this run's URL, or None."""
    a = st.session_state.get(sel.URL_ARRIVAL)
    return a if isinstance(a, str) else None


def refuse(line: str | MtpscopeError) -> NoReturn:
    """Show a link's refusal in one line and stop the page (nothing else of it is shown)."""
    st.error(line.one_line() if isinstance(line, MtpscopeError) else line, icon=":material/link_off:")
    st.caption("Fix the address, or open the page from the sidebar to show the current selection.")
    st.stop()
    raise AssertionError("unreachable")  # st.stop raises


def requested(page: str) -> links.View | None:
    """The view this run's URL asks ``page`` to show (None: the URL is the app's own, or empty); a refused
    URL is shown in one line and the page stops (:func:`refuse`)."""
    a = st.session_state.get(sel.URL_ARRIVAL)
    if isinstance(a, str):
        refuse(a)
    return a if isinstance(a, links.View) and a.page == page else None


def take_prompt_round(view: links.View | None, prompt_rounds: Mapping[int, tuple[int, int]],
                      current_prompt: int | None = None) -> None:
    """Check a link's prompt / round against the opened trace (:func:`mtpscope.app.links.check_in_trace`;
    ``prompt_rounds``: prompt_id -> (first, last round); ``current_prompt``: the prompt the page shows, which
    a round without a prompt belongs to) and select them; a value the trace does not have is refused
    (:func:`refuse`)."""
    if view is None:
        return
    try:
        links.check_in_trace(view, prompt_rounds, current_prompt)
    except LinkError as e:
        refuse(e)
    if view.prompt is not None:
        sel.select_prompt(view.prompt)
    if view.round is not None:
        pid = view.prompt if isinstance(view.prompt, int) else current_prompt
        if pid is None:  # check_in_trace refused a round without its prompt above
            raise LinkError("a round needs its prompt")
        sel.select_round((int(pid), view.round))


def publish(view: links.View) -> None:
    """Write ``view`` into the address bar (when it differs from what is there) and remember it as the
    app's own, so the next run does not take it as a new link."""
    params = view.params()
    st.session_state[sel.URL_SEEN] = _seen_key(view.page, params)
    if _query() != {k: [v] for k, v in params.items()}:
        st.query_params.from_dict(params)


#: The selection slots that are the view of a page whose view is the selection (the others publish their own).
SELECTION_VIEWS: dict[str, tuple[str, ...]] = {
    "files": (sel.TRACE, sel.TRACE_B, sel.DRAFTER, sel.TARGET),
    "tensors": (sel.DRAFTER, sel.TARGET), "validate": (sel.DRAFTER, sel.TARGET),
    "centroids": (sel.DRAFTER, sel.TARGET),
    # Diagnose before a trace is chosen: both open traces (the page asks which); once chosen it publishes its own
    "diagnose": (sel.TRACE, sel.TRACE_B, sel.DRAFTER, sel.TARGET),
}


def selection_view(page: str) -> links.View | None:
    """The view of ``page`` when its view is the selection (:data:`SELECTION_VIEWS`): the selected files
    it shows; None for the other pages."""
    slots = SELECTION_VIEWS.get(page)
    if slots is None:
        return None
    return links.View(page, trace=sel.get(sel.TRACE) if sel.TRACE in slots else None,
                      trace_b=sel.get(sel.TRACE_B) if sel.TRACE_B in slots else None,
                      drafter=sel.get(sel.DRAFTER) if sel.DRAFTER in slots else None,
                      target=sel.get(sel.TARGET) if sel.TARGET in slots else None)


def publish_selection(page: str) -> None:
    """Write the selection into the address bar of a page whose view it is (:func:`selection_view`), so a
    reload or a pasted address selects the same files; a page that publishes its own view later in the run
    (with more in it) replaces it."""
    view = selection_view(page)
    if view is not None:
        publish(view)


#: Set once the session's first URL was checked for an unknown page.
_FIRST_URL = "url.first_checked"


def unknown_page(page: str) -> str | None:
    """On the session's first run only (an address typed, pasted or reloaded): the one-line refusal of a URL
    path that names no page of the app (Streamlit then runs the start page instead), else None."""
    if st.session_state.get(_FIRST_URL):
        return None
    st.session_state[_FIRST_URL] = True
    if page != links.START:
        return None
    try:
        url = st.context.url or ""
    except Exception:  # noqa: BLE001 - no browser context (AppTest): nothing to check
        return None
    base = "/" + str(st.get_option("server.baseUrlPath") or "").strip("/")
    path = urlsplit(url).path.rstrip("/")
    rest = path[len(base):] if base != "/" and (path + "/").startswith(base.rstrip("/") + "/") else path
    asked = rest.strip("/").rsplit("/", 1)[-1]
    if not asked or asked in links.PAGES:
        return None
    return LinkError("no such page in the app", key="page", expected="one of " + ", ".join(links.PAGES),
                     actual=repr(asked)).one_line()
