"""Real-browser walk of issue 36 (Playwright driving Debian's Chromium against the app served like ``make run``),
on the trained demo (its F32 trace as trace A, the buggy-RoPE trace as trace B: the default view):

- ``/`` answers first: the verdict names the buggy drafter's ``verify`` error (``rope.freq_base_swa``, checked
  against gguf-py's reading of the two files' keys), the acceptance of both traces with their difference,
  the worst category's worst prompt (demo.json's, found by the demo build from per-prompt counts), the advice
  saying what a tie is with; its link opens that prompt's rounds, "worst round ▶" its worst round on the Step
  view, whose verdict says why;
- ``/`` -> Diagnose of the buggy drafter (the start page's link) -> the top finding's buttons -> the evidence views
  (Compare: the acceptance gap; Validate: the RoPE key);
- the buggy trace's trace pages name the failing drafter in one banner line;
- a pasted address of each page (a fresh session) reproduces the view: the selected files and what the page
  shows; an unknown page or parameter is refused in one line.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.apphelpers import start_app
from tests.browser import ARGS, CHROMIUM, need_browser, settle

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def walk(demo_dir, tmp_path_factory):
    from mtpscope.demo.spec import TrainedPaths

    tp = TrainedPaths.under(demo_dir.root)
    if not all((d / "manifest.json").exists() for d in (tp.traces_f32, tp.traces_buggy)):
        pytest.skip("the trained demo traces were not recorded")
    sync_api = need_browser()
    work = tmp_path_factory.mktemp("walk")
    log = work / "server.log"
    with start_app(log, env={"MTPSCOPE_UPLOADS": str(work / "uploads")}) as url, sync_api.sync_playwright() as p:
        exe = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
        browser = p.chromium.launch(executable_path=exe, args=ARGS)
        try:
            yield url, browser, tp
        finally:
            browser.close()
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]


def _fresh(browser):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1800})
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    return ctx, page, errors


def _done(page, heading: str) -> None:
    """Wait for ``heading`` and the end of the script run (Streamlit's own run state on the app element: a
    quiet DOM alone can be a run still computing)."""
    page.get_by_role("heading", name=heading, exact=True).first.wait_for(timeout=120_000)
    page.locator('[data-testid="stApp"][data-test-script-state="notRunning"]').wait_for(timeout=120_000)
    settle(page)


def _go(page, url: str, heading: str) -> str:
    page.goto(url)
    _done(page, heading)
    return page.locator('[data-testid="stMain"]').inner_text()


def _side(page) -> str:
    return page.locator('[data-testid="stSidebar"]').inner_text()


def test_start_verdict_to_worst_prompt_to_worst_round_to_why(walk) -> None:
    import gguf  # gguf-py: the keys read independently of mtpscope's reader

    url, browser, tp = walk
    base = gguf.GGUFReader(str(tp.drafter_buggy))
    tgt = gguf.GGUFReader(str(tp.target))

    def key(r, name):
        f = r.fields[name]
        return float(f.parts[f.data[0]][0])

    swa_d, swa_t = key(base, "gemma4-assistant.rope.freq_base_swa"), key(tgt, "gemma4.rope.freq_base_swa")
    assert swa_d != swa_t  # the demo's bug, read by gguf-py
    default = json.loads(tp.demo_json.read_text())["default"]
    ctx, page, errors = _fresh(browser)
    try:
        body = _go(page, url + "/", "Start")
        alerts = page.locator('[data-testid="stAlert"]').all_inner_texts()
        verdict = next(a for a in alerts if "Defect found" in a)
        assert "trace B's drafter" in verdict and "drafter-buggy.gguf" in verdict, verdict
        assert f"rope.freq_base_swa: drafter {swa_d}, target {swa_t}" in verdict, verdict
        # acceptance of both traces (accepted / drafted, summed by hand from each rounds table) and B's difference
        import pyarrow.parquet as pq

        tables = {d: pq.read_table(d / "rounds").to_pandas() for d in (tp.traces_f32, tp.traces_buggy)}
        ra, rb = (int(t["n_accepted"].sum()) / int(t["n_draft"].sum()) for t in tables.values())
        assert f"{100 * ra:.1f} % on trace A" in body and f"{100 * rb:.1f} % on trace B" in body, body[:1500]
        assert f"B −{100 * (ra - rb):.1f} points" in body, body[:1500]
        # the worst category and its worst prompt: demo.json's (the demo build's own per-prompt count)
        assert f"worst category {default['category']}" in body, body[:2000]
        assert f"prompt {default['prompt_id']} " in body
        advice = next(line for line in body.splitlines() if line.startswith("Advice for trace A:"))
        # a tie says what it is tied with
        assert "tie" not in advice or "(a tie with " in advice or re.search(r"a tie between \S", advice), advice
        # the address holds the start page's view: both traces
        q = parse_qs(urlsplit(page.url).query)
        assert Path(q["trace"][0]).resolve() == tp.traces_f32.resolve()
        assert Path(q["trace_b"][0]).resolve() == tp.traces_buggy.resolve()
        # -> the worst prompt's rounds
        page.get_by_role("link", name=f"its rounds: Acceptance prompt {default['prompt_id']}").first.click()
        _done(page, "Acceptance")
        assert urlsplit(page.url).path.endswith("/acceptance")
        assert parse_qs(urlsplit(page.url).query)["prompt"] == [str(default["prompt_id"])], page.url
        # -> its worst round
        page.get_by_role("button", name="worst round ▶").click()
        _done(page, "Step view")
        q = parse_qs(urlsplit(page.url).query)
        assert q["prompt"] == [str(default["prompt_id"])], page.url
        rnd = int(q["round"][0])
        # the worst round by hand from the rounds table: the most drafts lost in this prompt
        rounds = tables[tp.traces_f32]
        mine = rounds[rounds["prompt_id"] == default["prompt_id"]]
        lost = mine["n_draft"] - mine["n_accepted"]
        assert int(lost[mine["round"] == rnd].iloc[0]) == int(lost.max())
        # -> why: the round's verdict in words
        body = page.locator('[data-testid="stMain"]').inner_text()
        assert f"prompt {default['prompt_id']} · round {rnd}" in body, body[:800]
        assert "Rejected" in body, body[:1500]
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        ctx.close()
    assert not errors, errors


def test_a_drafter_failing_verify_is_named_on_every_trace_page(walk) -> None:
    from mtpscope.app.links import view_url

    url, browser, tp = walk
    heads = {"explain": "Explain", "acceptance": "Acceptance", "step": "Step view", "text": "Generated text",
             "compare": "Compare"}
    ctx, page, errors = _fresh(browser)
    try:
        for name, head in heads.items():
            body = _go(page, url + view_url(name, trace=str(tp.traces_buggy)), head)
            hits = [a for a in page.locator('[data-testid="stAlert"]').all_inner_texts() if "fails verify" in a]
            assert len(hits) == 1, (name, hits)
            assert "drafter-buggy.gguf" in hits[0] and "rope.freq_base_swa" in hits[0], (name, hits)
        # the healthy trace: no banner
        _go(page, url + view_url("explain", trace=str(tp.traces_f32)), "Explain")
        assert not [a for a in page.locator('[data-testid="stAlert"]').all_inner_texts() if "fails verify" in a]
        body = page.locator('[data-testid="stMain"]').inner_text()
        assert "Every figure below is of all prompts" in body, body[:800]  # no prompt silently chosen
    finally:
        ctx.close()
    assert not errors, errors


def test_a_pasted_address_reproduces_each_page(walk) -> None:
    """Each page is set to a view that is not the default (the buggy trace as trace A, a prompt, a round);
    its address, pasted into a fresh session, shows the same selection and the same view."""
    from mtpscope.app.links import view_url

    url, browser, tp = walk
    buggy = str(tp.traces_buggy)
    ctx, page, _ = _fresh(browser)
    try:
        # Files: choose the buggy trace in the page's own box (not through a link)
        _go(page, url + "/files", "Files")
        box = page.get_by_label("…or a path").nth(2)  # drafter, target, trace
        box.fill(buggy)
        box.press("Enter")
        settle(page)
        page.locator('[data-testid="stSidebar"]').get_by_text("buggy").first.wait_for(timeout=60_000)
        settle(page)
        addresses = {"files": (page.url, "Files")}
        # the other pages of this session, each opened from the sidebar: the address they write
        for label, head, path in (("Start", "Start", ""), ("Diagnose", "Diagnose", "diagnose"),
                                  ("Tensors", "Tensors", "tensors"), ("Tensor values", "Tensor values", "values"),
                                  ("Explain", "Explain", "explain")):
            page.locator('[data-testid="stSidebarNav"]').get_by_text(label, exact=True).first.click()
            _done(page, head)
            addresses[path or "start"] = (page.url, head)
        line = next(x for x in _side(page).splitlines() if x.startswith("trace:"))
        assert "buggy" in line, line
    finally:
        ctx.close()
    # a Step view on a round, by link
    addresses["step"] = (url + view_url("step", trace=buggy, prompt=3, round=2), "Step view")
    for name, (address, head) in addresses.items():
        assert "trace=" in address or "drafter=" in address, (name, address)
        ctx, page, errors = _fresh(browser)
        try:
            body = _go(page, address, head)
            # the pasted address selected the buggy trace (its drafter on the model pages) again; a fresh
            # session without it opens the F32 trace
            slot = "drafter:" if name in ("tensors", "values") else "trace:"
            line = next(x for x in _side(page).splitlines() if x.startswith(slot))
            assert "buggy" in line, (name, address, line)
            if name == "step":
                assert "prompt 3 · round 2" in body, body[:800]
            if name == "values":  # the tensor shown, by its address
                tensor = parse_qs(urlsplit(address).query)["tensor"][0]
                assert tensor in body, (tensor, body[:800])
            assert page.locator('[data-testid="stException"]').count() == 0
            assert not [a for a in page.locator('[data-testid="stAlert"]').all_inner_texts() if "link" in a
                        and "refused" in a], name
        finally:
            ctx.close()
        assert not errors, (name, errors)


def test_unknown_page_and_parameter_are_said_in_one_line(walk) -> None:
    url, browser, _tp = walk
    ctx, page, _ = _fresh(browser)
    try:
        page.goto(url + "/no-such-page")
        page.get_by_text("no such page in the app").first.wait_for(timeout=120_000)
        alerts = [a for a in page.locator('[data-testid="stAlert"]').all_inner_texts() if "no-such-page" in a]
        assert len(alerts) == 1 and "'page'" in alerts[0], alerts
        page.goto(url + "/files?foo=1")
        page.get_by_text("no parameter 'foo'").first.wait_for(timeout=120_000)
        settle(page)
        alerts = [a for a in page.locator('[data-testid="stAlert"]').all_inner_texts() if "'foo'" in a]
        assert len(alerts) == 1, page.locator('[data-testid="stAlert"]').all_inner_texts()
    finally:
        ctx.close()


@pytest.mark.llama
def test_start_to_diagnose_of_the_buggy_drafter_to_its_evidence(walk) -> None:
    """``/`` -> the start page's Diagnose link (the suspect: trace B, the buggy drafter's) -> Diagnose it -> the top
    finding's "Compare: the acceptance gap" shows both traces' acceptance (summed by hand from their rounds
    tables) and B's difference in points; its Validate button shows the drafter failing on the RoPE key (read
    by gguf-py). The Diagnose page is opened again by its address: the saved diagnosis, no second run."""
    pytest.importorskip("llama_cpp", reason="diagnose replays rounds with llama.cpp")
    import gguf
    import pyarrow.parquet as pq

    from mtpscope.app import safety
    from mtpscope.app.selection import diag_open_key

    url, browser, tp = walk
    recorded = json.loads((tp.traces_buggy / "manifest.json").read_text())["models"]["assistant"]["path"]
    if not safety.is_allowed(recorded, safety.allowed_roots()):   # the server's folders: this process's environment
        pytest.skip(f"the buggy trace's recorded drafter {recorded} is outside the allowed folders (a copied cache): "
                    "the app diagnoses it with the selected drafter instead")
    rate = {}
    for d in (tp.traces_f32, tp.traces_buggy):
        t = pq.read_table(d / "rounds").to_pandas()
        rate[d] = int(t["n_accepted"].sum()) / int(t["n_draft"].sum())
    ra, rb = rate[tp.traces_f32], rate[tp.traces_buggy]
    swa = gguf.GGUFReader(str(tp.drafter_buggy)).fields["gemma4-assistant.rope.freq_base_swa"]
    swa_d = float(swa.parts[swa.data[0]][0])
    ctx, page, errors = _fresh(browser)
    try:
        _go(page, url + "/", "Start")
        # the verdict's suspect is trace B: the start page offers to diagnose it
        page.get_by_role("link", name="Diagnose trace B").first.click()
        _done(page, "Diagnose")
        q = parse_qs(urlsplit(page.url).query)
        assert urlsplit(page.url).path.endswith("/diagnose"), page.url
        assert Path(q["trace"][0]).resolve() == tp.traces_buggy.resolve(), page.url
        diagnose_url = page.url
        body = page.locator('[data-testid="stMain"]').inner_text()
        assert "trace A demo/trained/traces/buggy" in body, body[:1500]  # the link's trace, preset as the one
        page.get_by_role("button", name="Diagnose this trace").click()
        page.get_by_role("heading", name="Findings, worst first").wait_for(timeout=600_000)
        _done(page, "Diagnose")
        alerts = page.locator('[data-testid="stAlert"]').all_inner_texts()
        assert "Defect found: gemma4-assistant.rope.freq_base_swa" in alerts[0], alerts[:3]
        body = page.locator('[data-testid="stMain"]').inner_text()
        # the top finding's evidence against the other open trace: the acceptance gap, in words
        gap = (f"acceptance rate {100 * rb:.1f} % here against {100 * ra:.1f} % in trace B "
               f"demo/trained/traces/f32: −{100 * (ra - rb):.1f} points")
        assert gap in body, body[:3000]
        # -> the top finding's Compare button: the two runs' acceptance and the gap
        page.locator(f".st-key-{_css_key(diag_open_key(0, 1))}").get_by_role(  # Streamlit's class of a key
            "button", name="Compare: the acceptance gap").click()
        _done(page, "Compare")
        assert urlsplit(page.url).path.endswith("/compare"), page.url
        body = page.locator('[data-testid="stMain"]').inner_text()
        assert f"{100 * rb:.1f} %" in body and f"{100 * ra:.1f} %" in body, body[:2000]
        assert f"+{100 * (ra - rb):.1f} points" in body, body[:2000]  # B (f32) against A (buggy)
        assert page.locator('[data-testid="stException"]').count() == 0
        # the Diagnose page's address again: the diagnosis saved by the run above, shown without a click
        _go(page, diagnose_url, "Diagnose")
        page.get_by_role("heading", name="Findings, worst first").wait_for(timeout=60_000)
        # -> the top finding's own link: Validate, the buggy drafter failing on the RoPE key
        page.locator(f".st-key-{_css_key(diag_open_key(0))}").get_by_role("button", name="Validate: the keys").click()
        _done(page, "Validate")
        verdict = page.locator('[data-testid="stAlert"]').first.inner_text()
        assert verdict.startswith("✗ invalid") and "rope.freq_base_swa" in verdict, verdict
        assert "drafter-buggy.gguf" in _side(page)
        assert f"{swa_d:g}" in verdict or str(swa_d) in verdict, (swa_d, verdict)
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        ctx.close()
    assert not errors, errors


def _css_key(key: str) -> str:
    """The class suffix Streamlit's front end gives an element of ``key`` (``st-key-<key>``, every character
    other than letters, digits, ``_`` and ``-`` made ``-``)."""
    return re.sub(r"[^a-zA-Z0-9_-]", "-", key.strip())
