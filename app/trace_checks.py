"""Cheap checks of the open traces, read through the cached loaders: ``verify`` of the drafter that recorded
each trace (the banner line every trace page shows when it fails: :func:`verify_banner`) and the facts the
start page's verdict is made of (:func:`trace_facts`; the verdict itself is pure: :mod:`mtpscope.app.verdict`).

Imports: streamlit, ``loaders``, ``selection``, ``verdict``, ``views``, mtpscope.errors, mtpscope.traces.analysis.advice
(types).
"""

from __future__ import annotations

import streamlit as st

from mtpscope.app import loaders, verdict, views
from mtpscope.app import selection as sel
from mtpscope.errors import MtpscopeError
from mtpscope.traces.analysis.advice import Recommendation

#: The roles of the trace slots, as the sidebar names them.
ROLES = {sel.TRACE: "trace A", sel.TRACE_B: "trace B"}


def recorded_check(path: str) -> tuple[str | None, bool | None, str | None]:
    """(the recording drafter's short path or None, verify passed (None: not checked: no readable, allowed
    drafter in the manifest), its first error line or None) for the trace at ``path``."""
    try:
        tr = loaders.trace(path)
    except (MtpscopeError, OSError):
        return None, None, None
    d = views.model_path(tr.manifest, "assistant")
    rep = loaders.recorded_validation(tr)
    if rep is None:
        return (sel.short(d) if d else None), None, None
    return sel.short(d), bool(rep.ok), verdict.first_error_line(rep)


def verify_banner(slots: tuple[str, ...] = (sel.TRACE,)) -> None:
    """One error line per selected trace in ``slots`` whose recording drafter fails ``verify`` (nothing
    otherwise, nothing when it cannot be checked)."""
    for slot in slots:
        path = sel.get(slot)
        if not path:
            continue
        drafter, ok, err = recorded_check(path)
        if ok is False:
            st.error(verdict.verify_banner(ROLES.get(slot, slot), drafter, err), icon=":material/report:")


def state_banner(slots: tuple[str, ...] = (sel.TRACE,)) -> None:
    """One warning line per selected trace in ``slots`` that is not complete (:func:`verdict.trace_state_line`:
    llama.cpp's death, a recovered interrupted run, or still being written), and one per trace whose reader skipped
    part files (:func:`verdict.lost_parts_line`); nothing for a complete, whole one, nor for one that cannot be
    read (the page says why, once: a line here too showed the same error twice)."""
    for slot in slots:
        path = sel.get(slot)
        if not path:
            continue
        try:
            tr = loaders.trace(path)
        except (MtpscopeError, OSError):
            continue
        line = verdict.trace_state_line(ROLES.get(slot, slot), tr.manifest)
        if line:
            st.warning(line, icon=":material/hourglass_bottom:")
        lost = verdict.lost_parts_line(ROLES.get(slot, slot), views.relative_paths(tr.skipped, tr.path))
        if lost:
            st.warning(lost, icon=":material/broken_image:")


def trace_facts(slot: str, with_advice: bool) -> verdict.TraceFacts | None:
    """The start page's facts of the trace in ``slot`` (None when none is selected): the report's
    acceptance rate, the per-prompt counts, the recording drafter's verify, a diagnosis the app already
    saved for it with its recorded models (never runs one) and, with ``with_advice``, the explanation's
    recommendation (the Explain page's, from the same cache).

    Raises:
        MtpscopeError: an unreadable trace (named).
    """
    path = sel.get(slot)
    if not path:
        return None
    rep = loaders.report(path)
    drafter, ok, err = recorded_check(path)
    prompts = tuple(verdict.PromptCounts(*row) for row in loaders.prompt_counts(path))
    models = sel.recorded_models(path)
    diag = loaders.existing_diagnosis(path, models.get(sel.DRAFTER), models.get(sel.TARGET))
    return verdict.TraceFacts(
        ROLES.get(slot, slot), path, sel.short(path), drafter, rep.acceptance_rate, prompts, ok, err,
        recommendation(path) if with_advice else None,
        None if diag is None else bool(diag.defects), None if diag is None else diag.headline)


def recommendation(path: str) -> Recommendation | None:
    """The Explain page's recommendation for the whole trace at ``path`` (the same cached explanation), or
    None (nothing drafted)."""
    adv = loaders.explanation(path).advice
    return None if adv is None else adv.recommendation


__all__ = ["ROLES", "recommendation", "recorded_check", "state_banner", "trace_facts", "verify_banner"]
