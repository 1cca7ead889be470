"""A diagnosis for people: its findings' links, its key figures, and the one-file HTML report (pure, no Streamlit).

Everything here reads the diagnosis' records (:class:`~mtpscope.traces.diagnose.records.Diagnosis`, its
``Finding`` / ``Evidence`` / ``Fix`` / ``ViewRef`` / ``StepRun``) by attribute; a saved ``diagnosis.json`` read back
(``read_diagnosis``: ``Diagnosis.from_dict``) holds the same values as a fresh diagnosis, so both show alike. The
figures come from :mod:`mtpscope.app.charts` (the app's own builders); ``mtpscope diagnose --html`` and the Diagnose
page both call :func:`figures`. :func:`document` is the JSON that ``mtpscope diagnose --json`` prints and the report
embeds (``Diagnosis.to_dict()`` with each link's URL).

:func:`html_report` writes one self-contained HTML file: plotly.js inlined once, the figures' data inline, styles
inline, no URL fetched when it is opened (the findings' links point at the app, and are only followed on a click).

The Diagnose page's evidence views (:func:`evidence_views`, :func:`first_differing_step`, :func:`gap_words`)
are pure too: they take the aligned diff's and the positions' frames by column.

Imports: plotly, the app's charts, formats, views and links, traces.diagnose.records (the records read).
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import plotly.graph_objects as go
import plotly.io as pio

from mtpscope.app import charts, formats, views
from mtpscope.app.links import view_url
from mtpscope.traces.diagnose.records import Diagnosis, Finding, ViewRef

#: Where the app listens by default (``mtpscope app``): the base of the links the CLI and the report print.
APP_URL = "http://127.0.0.1:8501"
SEVERITY_COLOURS = {"error": "#c62828", "warning": "#ef6c00", "info": "#1565c0"}


def link_url(link: ViewRef | None, base: str = APP_URL) -> str | None:
    """A finding's link (its :class:`ViewRef`) as a URL into the app, or None."""
    if link is None:
        return None
    params: dict[str, Any] = dict(link.params)  # view_url's keyword parameters, each its own type
    return view_url(str(link.page), base=base, **params)


def document(d: Diagnosis, base: str = APP_URL) -> dict[str, Any]:
    """The diagnosis' JSON document (``d.to_dict()``, docs/DIAGNOSE.md "JSON") with each finding's link given its
    URL into the app at ``base`` (``link["url"]``): what ``mtpscope diagnose --json`` prints and the HTML report
    embeds."""
    doc = d.to_dict()
    for f, rec in zip(doc["findings"], d.findings):
        if rec.link is not None:
            f["link"]["url"] = link_url(rec.link, base)
    return doc


def figures(d: Diagnosis) -> list[tuple[str, go.Figure]]:
    """The key figures of a diagnosis, ``(name, figure)`` in reading order: acceptance by draft position, by
    category, the first misses' causes, the replay variants (the one that recovers in red), the what-if (from its
    ``summary`` and ``variants`` numbers). Sections the diagnosis lacks (no trace, no replay) are left out."""
    sm = d.summary
    out: list[tuple[str, go.Figure]] = []
    if sm.per_position:
        out.append(("per_position", charts.per_position_figure(views.per_position(sm.per_position),
                                                                title="Acceptance by draft position")))
    if sm.by_category:
        cats = {k: v.acceptance for k, v in sm.by_category.items()}
        out.append(("by_category", charts.rate_bars_figure(cats, "Acceptance by prompt category", what="category")))
    if sm.causes:
        out.append(("causes", charts.causes_figure(sm.causes)))
    if d.variants is not None and d.variants.variants:
        out.append(("variants", charts.variants_figure(d.variants.variants)))
    if sm.what_if:
        out.append(("what_if", charts.what_if_figure(sm.what_if, sm.best_n_draft)))
    return out


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _finding_html(i: int, f: Finding, base: str) -> str:
    colour = SEVERITY_COLOURS.get(f.severity, "#555")
    ev = "".join(f"<li><b>{_e(e.step)}</b>: {_e(e.text)}</li>" for e in f.evidence)
    fix_text = f.fix.text if f.fix is not None else None
    url = link_url(f.link, base)
    link = f'<a href="{_e(url)}" rel="noreferrer">open in the app</a>' if url else ""
    return (f'<div class="finding" style="border-left-color:{colour}" id="finding-{i}">'
            f'<div class="head"><span class="sev" style="background:{colour}">{_e(f.severity)}</span> '
            f'<span class="cause">{_e(f.cause)}</span> <span class="conf">confidence {_e(f.confidence)}</span></div>'
            f'<div class="title">{i}. {_e(f.title)}</div><ul>{ev}</ul>'
            + (f'<div class="fix"><b>fix</b>: {_e(fix_text)}</div>' if fix_text else "")
            + f'<div class="link">{link}</div></div>')


_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1100px;
color:#222;line-height:1.4}h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em}
.verdict{padding:.8em 1em;border-radius:6px;font-weight:600}.defect{background:#fdecea}.ok{background:#e8f5e9}
.finding{border-left:6px solid #999;padding:.4em .9em;margin:.8em 0;background:#fafafa}.finding ul{margin:.3em 0}
.sev{color:#fff;border-radius:3px;padding:0 .4em;font-size:.85em}.cause{font-family:monospace}.conf{color:#666;
font-size:.85em}.title{font-weight:600;margin:.2em 0}.fix{margin:.2em 0}table{border-collapse:collapse}
td,th{border:1px solid #ddd;padding:.2em .5em;text-align:left;font-size:.9em}code{font-size:.9em}
.meta{color:#555;font-size:.9em}"""


def html_report(d: Diagnosis, *, base: str = APP_URL, title: str = "mtpscope diagnose") -> str:
    """The diagnosis as one self-contained HTML page (module docstring): verdict, ranked findings (evidence, fix,
    link), what limits acceptance, the key figures (:func:`figures`), the steps and notes, and the JSON document
    (:func:`document`, links at ``base``) embedded as ``<script type="application/json" id="diagnosis">``."""
    figs = figures(d)
    parts = []
    for i, (name, fig) in enumerate(figs):
        parts.append(f'<div class="figure" data-figure="{_e(name)}">' + pio.to_html(
            fig, full_html=False, include_plotlyjs=(i == 0), div_id=f"fig-{name}",
            config={"displaylogo": False, "responsive": True}) + "</div>")
    defect = bool(d.defects)
    verdict = (f'<div class="verdict {"defect" if defect else "ok"}">'
               f'{"Defect found" if defect else "No defect found"}: {_e(d.headline)}</div>')
    findings = "".join(_finding_html(i + 1, f, base) for i, f in enumerate(d.findings))
    limits = "".join(f"<li>{_e(x)}</li>" for x in d.limits)
    steps = "".join(f"<tr><td>{_e(s.name)}</td><td>{_e(s.status)}</td><td>{s.seconds:.1f} s</td>"
                    f"<td>{_e(s.note)}</td></tr>" for s in d.steps)
    notes = "".join(f"<li>{_e(x)}</li>" for x in d.notes)
    mismatch = "".join(f'<p class="verdict defect">warning: {_e(m)}</p>' for m in d.model_mismatch)
    sm = d.summary
    numbers = ""
    if sm.acceptance_rate is not None:
        numbers = (f"<p>acceptance rate {sm.acceptance_rate:.3f} ({sm.n_accepted} / {sm.n_drafted} "
                   f"drafted), mean acceptance length {sm.mean_acceptance_length or 0:.2f}, n_draft "
                   f"{_e(sm.n_draft)}, {_e(sm.n_prompts)} prompts</p>")
    doc = json.dumps(document(d, base), default=str).replace("</", "<\\/")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_CSS}</style></head>
<body><h1>{_e(title)}</h1>
<p class="meta">drafter <code>{_e(d.assistant)}</code><br>target <code>{_e(d.target)}</code><br>
trace <code>{_e(d.trace or '-')}</code>{'<br>reference <code>' + _e(d.reference.path) + '</code>' if d.reference else ''}</p>
{mismatch}{verdict}{numbers}
<h2>Findings, worst first</h2>{findings or '<p>none</p>'}
<h2>What limits acceptance</h2><ul>{limits or '<li>unknown (no trace)</li>'}</ul>
<h2>Figures</h2>{''.join(parts) or '<p>no trace: no figures</p>'}
<h2>Steps</h2><table><tr><th>step</th><th>status</th><th>time</th><th>note</th></tr>{steps}</table>
{'<h2>Notes</h2><ul>' + notes + '</ul>' if notes else ''}
<script type="application/json" id="diagnosis">{doc}</script>
</body></html>
"""


# ------------------------------------------------------------------------------ the Diagnose page's evidence views

#: A finding's own link, in words, by the page it opens.
LINK_WORDS = {"validate": "Validate: the keys", "explain": "Explain: the causes", "compare": "Compare: the runs",
              "step": "Step: the step", "tensors": "Tensors: the tensors"}


def app_base(url: str | None) -> str:
    """The app's own address (``scheme://host:port``) from the URL of the page it serves (Streamlit's
    ``st.context.url``), for the report's links; :data:`APP_URL` when there is none."""
    parts = urlsplit(url or "")
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme in ("http", "https") and parts.netloc else APP_URL


def first_differing_step(positions: Any, emitted: Any, side: str = "b") -> tuple[int, int, int | None] | None:
    """Where the diagnosed trace first draws a different verdict from the one it is compared with, as a view of
    its Step page: ``(prompt_id, round, k)`` of the output position of the aligned diff (``positions``:
    :attr:`mtpscope.traces.analysis.align.AlignedDiff.positions`, columns ``prompt_id_a``, ``prompt_id_b``,
    ``g``, ``status_a``, ``status_b``) whose statuses differ first (its rows' order: pairs of prompts, then
    output position), looked up in the diagnosed trace's emitted tokens (``emitted``:
    :attr:`mtpscope.traces.analysis.positions.Positions.emitted`, columns ``prompt_id``, ``g``, ``round``,
    ``k``). ``side``: ``"a"`` or ``"b"``, which trace of the diff is diagnosed. ``k`` is the draft step the
    token answered, None for the target's bonus token or a token it decoded alone (the round only). None when
    every compared position has the same status."""
    if positions is None or not len(positions):
        return None
    differs = positions[positions["status_a"] != positions["status_b"]]
    if not len(differs):
        return None
    row = differs.iloc[0]
    pid, g = int(row[f"prompt_id_{side}"]), int(row["g"])
    hit = emitted[(emitted["prompt_id"] == pid) & (emitted["g"] == g)]
    if not len(hit):
        return None
    k = int(hit.iloc[0]["k"])
    return pid, int(hit.iloc[0]["round"]), (k if k >= 1 else None)


def gap_words(rate_this: float | None, rate_other: float | None, other: str) -> str | None:
    """The acceptance gap to the trace compared with, in words: ``acceptance rate 21.0 % here against 34.8 % in
    trace A (f32): −13.8 points`` (rates as fractions; :mod:`mtpscope.app.formats`). None when a rate is
    missing."""
    if rate_this is None or rate_other is None:
        return None
    return (f"acceptance rate {formats.percent(rate_this)} here against {formats.percent(rate_other)} in {other}: "
            f"{formats.points(rate_this - rate_other)}")


def evidence_views(f: Finding, *, trace: str | None = None, compare_with: tuple[str, str] | None = None,
                   first_step: tuple[int, int, int | None] | None = None) -> list[tuple[str, ViewRef]]:
    """The views that show a finding's evidence, each ``(words for its button, ViewRef)``: its own link
    (:data:`LINK_WORDS`; Validate for a key), and for a defect (:attr:`Finding.is_defect`) of the diagnosed
    ``trace`` with another trace open (``compare_with``: the Compare page's trace A and trace B, as selected; the
    diagnosed trace is one of them) the acceptance gap on Compare and the first step judged differently on Step
    (``first_step``: :func:`first_differing_step`, in ``trace``). A view already given by the link is not
    repeated."""
    out: list[tuple[str, ViewRef]] = []
    if f.link is not None:
        out.append((LINK_WORDS.get(f.link.page, f.link.page.capitalize()), f.link))
    if f.is_defect and trace and compare_with is not None:
        a, b = compare_with
        if not any(v.page == "compare" for _, v in out):
            out.append(("Compare: the acceptance gap",
                        ViewRef.of("compare", trace=a, trace_b=b, mode="traces")))
        if first_step is not None and not any(v.page == "step" for _, v in out):
            pid, rnd, k = first_step
            out.append(("Step: the first differing step",
                        ViewRef.of("step", trace=trace, prompt=pid, round=rnd, step=k)))
    return out


def finding_lines(findings: Sequence[Finding], *, base: str = APP_URL) -> list[str]:
    """The findings as plain text, worst first: ``N. SEVERITY cause (confidence): title``, then evidence, fix
    and link lines (what ``mtpscope diagnose`` prints)."""
    out = []
    for i, f in enumerate(findings, start=1):
        out.append(f"{i}. {f.severity.upper()} {f.cause} (confidence {f.confidence}): {f.title}")
        out += [f"     [{e.step}] {e.text}" for e in f.evidence]
        if f.fix is not None and f.fix.text:
            out.append(f"     fix: {f.fix.text}")
        url = link_url(f.link, base)
        if url:
            out.append(f"     view: {url}")
    return out


__all__ = ["APP_URL", "LINK_WORDS", "app_base", "document", "evidence_views", "figures", "finding_lines",
           "first_differing_step", "gap_words", "html_report", "link_url"]
