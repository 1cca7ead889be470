"""The Diagnose page (Streamlit AppTest) and the HTML report in a real Chromium, on a diagnosis of the demo's buggy
trace (one diagnose run, a small replay, shared by the module).

The page must show the same findings as the library, worst first, and a finding's button must open the page and
selection that show its evidence. The report must open from a file with every figure drawn by plotly and without
a single request beyond the file itself.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

from mtpscope.app import selection
from mtpscope.app.diagnose_report import figures, html_report
from mtpscope.demo.spec import TrainedPaths
from mtpscope.traces.diagnose.config import DiagnoseConfig
from mtpscope.traces.diagnose.records import Diagnosis
from mtpscope.traces.diagnose.run import DIAGNOSIS_FILE, diagnose

pytestmark = [pytest.mark.llama, pytest.mark.slow]

MAIN = str(Path(__file__).resolve().parent.parent / "app" / "main.py")


@pytest.fixture(scope="module")
def buggy(demo_dir, tmp_path_factory) -> dict:
    tp = TrainedPaths.under(demo_dir.root)
    if not (tp.traces_buggy / "manifest.json").exists():
        pytest.skip("the trained demo traces are not built")
    out = tmp_path_factory.mktemp("diag")
    d = diagnose(DiagnoseConfig(replay_prompts=4, rounds_per_prompt=4), trace=tp.traces_buggy, out=out)
    return {"out": out, "d": d, "doc": d.to_dict(), "paths": tp}


def test_page_shows_the_saved_diagnosis_and_opens_a_findings_view(buggy, monkeypatch) -> None:
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("MTPSCOPE_ROOTS", str(buggy["out"]))
    doc = json.loads((buggy["out"] / DIAGNOSIS_FILE).read_text())
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.run()
    at.switch_page("screens/diagnose.py").run()
    at.text_input(key=selection.DIAG_SAVED).input(str(buggy["out"])).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.error[0].value.startswith("Defect found: " + doc["headline"])
    titles = [b.value for b in at.error[1:]] + [b.value for b in at.info]
    assert len([t for t in titles if t.startswith("**")]) == len(doc["findings"])
    assert titles[0].startswith(f"**1. {doc['findings'][0]['title']}**")
    assert len(at.get("plotly_chart")) == len(figures(Diagnosis.from_dict(doc)))
    at.button(key=selection.diag_open_key(0)).click().run()      # the RoPE finding: the Validate page
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state[selection.slot_key(selection.DRAFTER)] == str(buggy["paths"].drafter_buggy)
    assert [h.value for h in at.title] == ["Validate"]


def test_page_runs_diagnose_on_the_trace_looked_at(buggy, monkeypatch, tmp_path) -> None:
    """The demo opens two traces (A: the healthy drafter's, B: the buggy one's): the page asks which, diagnoses
    B with the models that recorded it, and each defect's buttons open Validate, Compare (with the acceptance
    gap) and Step (at the first step judged differently); the report downloads, the folder it is saved in is
    named, and a later run of the app reads it back instead of diagnosing again."""
    from streamlit.testing.v1 import AppTest

    from mtpscope.app import loaders

    monkeypatch.setenv("MTPSCOPE_UPLOADS", str(tmp_path / "uploads"))
    tp = buggy["paths"]
    at = AppTest.from_file(MAIN, default_timeout=300)
    for slot, path in ((selection.TRACE, tp.traces_f32), (selection.TRACE_B, tp.traces_buggy)):
        at.session_state[selection.slot_key(slot)] = str(path)
    at.run()
    at.switch_page("screens/diagnose.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.radio(key=selection.DIAG_WHICH).value is None and not at.error   # asked, nothing diagnosed yet
    at.radio(key=selection.DIAG_WHICH).set_value("B").run()
    at.button[0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    first = buggy["doc"]["findings"][0]
    assert at.error[0].value.startswith("Defect found: ") and first["title"] in at.error[0].value
    labels = {b.key: b.label for b in at.button}
    assert labels[selection.diag_open_key(0)].startswith("Validate")
    assert labels[selection.diag_open_key(0, 1)].startswith("Compare")
    assert labels[selection.diag_open_key(0, 2)].startswith("Step")
    # the gap against trace A, from the two traces' rounds counted here
    ra, rb = (loaders_rate(tp.traces_f32), loaders_rate(tp.traces_buggy))
    gap = f"acceptance rate {100 * rb:.1f} % here against {100 * ra:.1f} % in trace A"
    assert any(gap in m.value for m in at.markdown), [m.value for m in at.markdown if "compare" in m.value]
    assert [b.label for b in at.get("download_button")] == ["Download the HTML report"]
    saved = next(c.value for c in at.caption if c.value.startswith("Saved in"))
    out = Path(saved.split("`")[1])
    assert out.parent.parent == tmp_path / "uploads" and (out / DIAGNOSIS_FILE).is_file()
    # another run of the app (its in-memory cache gone) shows the saved diagnosis, read back: diagnose not called
    loaders._diagnosis.clear()

    def no_run(*a, **k):
        raise AssertionError("diagnosed again")

    monkeypatch.setattr("mtpscope.traces.diagnose.run.diagnose", no_run)
    again = AppTest.from_file(MAIN, default_timeout=120)
    for slot, path in ((selection.TRACE, tp.traces_f32), (selection.TRACE_B, tp.traces_buggy)):
        again.session_state[selection.slot_key(slot)] = str(path)
    again.run()
    again.switch_page("screens/diagnose.py").run()
    again.radio(key=selection.DIAG_WHICH).set_value("B").run()    # shown at once: no click, no diagnosis
    assert not again.exception, [e.value for e in again.exception]
    assert first["title"] in again.error[0].value
    # the Compare button: trace A against trace B, as selected
    at.button(key=selection.diag_open_key(0, 1)).click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert [h.value for h in at.title] == ["Compare"]
    assert at.session_state[selection.slot_key(selection.TRACE)] == str(tp.traces_f32)
    assert at.session_state[selection.slot_key(selection.TRACE_B)] == str(tp.traces_buggy)


def test_a_link_naming_the_trace_diagnoses_that_one(demo_dir) -> None:
    """``/diagnose?trace=BUGGY`` with the demo's two traces: the buggy one is trace A now and preset as the one
    to diagnose, also on the runs after the link was taken (nothing is diagnosed until the button)."""
    from streamlit.testing.v1 import AppTest

    tp = TrainedPaths.under(demo_dir.root)
    if not (tp.traces_buggy / "manifest.json").exists():
        pytest.skip("the trained demo traces are not built")
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.run()
    at.query_params.clear()   # the start page's own address (trace and trace_b) is not part of the link
    at.query_params["trace"] = str(tp.traces_buggy)
    at.switch_page("screens/diagnose.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state[selection.slot_key(selection.TRACE)] == str(tp.traces_buggy)
    assert at.radio(key=selection.DIAG_WHICH).value == "A"
    at.text_input(key=selection.DIAG_REFERENCE).input("").run()   # another run: the choice is kept
    assert at.radio(key=selection.DIAG_WHICH).value == "A"
    assert any(c.value.startswith("trace A `demo/trained/traces/buggy`") for c in at.caption), \
        [c.value for c in at.caption]


def loaders_rate(trace: Path) -> float:
    """accepted / drafted summed over a trace's rounds as the store reads them (not the aligned diff's delta)."""
    from mtpscope.traces.store.reader import open_trace

    r = open_trace(trace).rounds
    return int(r["n_accepted"].sum()) / int(r["n_draft"].sum())


def test_the_saved_diagnosis_reads_back_as_the_same_records(buggy) -> None:
    """diagnosis.json of a replayed diagnosis, rebuilt into records, writes the same bytes; the page, the report and
    the CLI read those records."""
    from mtpscope.traces.diagnose.run import read_diagnosis

    d, saved = buggy["d"], (buggy["out"] / DIAGNOSIS_FILE).read_text(encoding="utf-8")
    back = read_diagnosis(buggy["out"])
    assert json.dumps(back.to_dict(), indent=1, default=str) + "\n" == saved
    assert Diagnosis.from_dict(d.to_dict()).to_dict() == d.to_dict() == json.loads(saved)
    assert [(f.cause, f.title, f.link) for f in back.findings] == [(f.cause, f.title, f.link) for f in d.findings]
    assert back.variants == d.variants and back.variants.variants
    assert [n for n, _ in figures(back)] == [n for n, _ in figures(d)]


def test_html_report_draws_its_figures_offline_in_chromium(buggy, tmp_path: Path) -> None:
    from tests.browser import ARGS, CHROMIUM, need_browser

    sync_api = need_browser()
    page_file = tmp_path / "report.html"
    page_file.write_text(html_report(buggy["d"]), encoding="utf-8")
    assert page_file.stat().st_size < 5_000_000
    n_figs = len(figures(buggy["d"]))
    assert n_figs == 5                                         # position, category, causes, variants, what-if
    requests: list[str] = []
    with sync_api.sync_playwright() as p:
        exe = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
        browser = p.chromium.launch(executable_path=exe, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("request", lambda r: requests.append(r.url))
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_file.as_uri())
            page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {n_figs}",
                                   timeout=60_000)
            # a figure is drawn when plotly rendered its traces (bars, lines) into its SVG
            drawn = page.evaluate("[...document.querySelectorAll('.js-plotly-plot')].filter(d => "
                                  "d.querySelectorAll('.main-svg g.trace').length > 0).length")
            bars = page.evaluate("document.querySelectorAll('.js-plotly-plot .bars path').length")
            doc = json.loads(page.evaluate("document.getElementById('diagnosis').textContent"))
        finally:
            browser.close()
    assert errors == []
    assert requests == [page_file.as_uri()], requests
    assert drawn == n_figs and bars > 0
    assert doc["findings"][0]["cause"] == "rope"
