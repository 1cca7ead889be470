"""Real-browser test: Playwright driving Debian's Chromium against the app served like ``make run``.

Every page must render (its heading, no Streamlit exception box, no "Page not found" for its deep link
such as ``/files``) and get a screenshot under ``test-output/screenshots/``; a click on a round of the
Acceptance timeline must open the Step view on that round, and so must a click on a rejected token of
the generated-text view. Skips with a reason when Playwright or /usr/bin/chromium is missing (``make browser``
installs Chromium where it can; never ``playwright install``: no network for browsers).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.apphelpers import ROOT, start_app
from tests.browser import ARGS, CHROMIUM, need_browser, settle

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SHOTS = ROOT / "test-output" / "screenshots"

#: url path -> heading each page shows
PAGES = {"": "Start", "files": "Files", "tensors": "Tensors", "validate": "Validate", "centroids": "Centroids",
         "values": "Tensor values", "acceptance": "Acceptance", "text": "Generated text", "step": "Step view",
         "explain": "Explain", "compare": "Compare", "diagnose": "Diagnose"}


@pytest.fixture(scope="module")
def browser_app(demo_dir, tmp_path_factory):
    sync_api = need_browser()
    work = tmp_path_factory.mktemp("browser")
    log = work / "server.log"
    # uploads made by the test go to a temporary folder, not into the user's cache
    with start_app(log, env={"MTPSCOPE_UPLOADS": str(work / "uploads")}) as url, \
            sync_api.sync_playwright() as p:
        exe = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
        browser = p.chromium.launch(executable_path=exe, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            yield url, page, errors, demo_dir, browser
        finally:
            browser.close()
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]


def _open(page, url: str, path: str, query: str = "") -> None:
    page.goto(f"{url}/{path}{query}")
    page.get_by_role("heading", name=PAGES[path], exact=True).first.wait_for(timeout=120_000)
    settle(page)


def test_every_page_renders_with_screenshot(browser_app) -> None:
    url, page, errors, _demo, _browser = browser_app
    SHOTS.mkdir(parents=True, exist_ok=True)
    for path, heading in PAGES.items():
        _open(page, url, path)
        name = path or "root"
        page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
        assert page.locator('[data-testid="stException"]').count() == 0, name
        assert page.get_by_text("Page not found").count() == 0, name  # deep links work, /files included
        # the path is the page's (a trace page's view follows in the query string)
        assert urlsplit(page.url).path.rstrip("/") == ("/" + path if path else ""), (name, page.url)
        assert page.get_by_role("heading", name=heading, exact=True).count() >= 1, name
        # the sidebar navigation lists every page
        nav = page.locator('[data-testid="stSidebarNav"]').inner_text()
        assert all(h.split()[0] in nav for h in ("Files", "Tensors", "Compare")), nav
        if name in ("tensors", "acceptance", "centroids", "values", "compare", "text", "explain"):
            assert page.locator('[data-testid="stPlotlyChart"]').count() >= 1, name
            assert page.locator('[data-testid="stPlotlyChart"] .main-svg').count() >= 1, name
    assert not errors, errors


def test_timeline_click_opens_step_view(browser_app) -> None:
    url, page, errors, demo, _browser = browser_app
    if not (Path(demo.traces_clean) / "manifest.json").exists():
        pytest.skip("demo traces not built (llama-cpp-python missing)")
    # one prompt's rounds: its marks lie apart (all 890 rounds of the trace overlap, so a click at a mark's
    # centre may open a neighbour)
    _open(page, url, "acceptance", "?prompt=0")
    plot = page.locator('[data-testid="stPlotlyChart"]').first
    points = plot.locator(".scatterlayer .trace .points path.point")
    points.first.wait_for(timeout=60_000)
    i = min(4, points.count() - 1)
    # the round under that mark, from the figure's own data (customdata = [prompt_id, round, seq])
    prompt_id, round_ = plot.locator(".js-plotly-plot").first.evaluate(
        f"(el) => [el._fullData[0].customdata[{i}][0], el._fullData[0].customdata[{i}][1]]")
    box = points.nth(i).bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.get_by_role("heading", name="Step view", exact=True).first.wait_for(timeout=60_000)
    settle(page)
    assert urlsplit(page.url).path.rstrip("/").endswith("/step"), page.url
    body = page.locator('[data-testid="stMain"]').inner_text()
    assert f"prompt {int(prompt_id)} · round {int(round_)}" in body, body[:500]
    assert page.locator('[data-testid="stDataFrame"]').count() >= 1
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "step-after-click.png"), full_page=True)
    assert page.locator('[data-testid="stException"]').count() == 0
    assert not errors, errors


def test_text_view_click_on_a_rejected_token_opens_its_step(browser_app) -> None:
    """Fresh session: choose the noisy demo trace on the Files page, go to the Text page through the
    sidebar (same session), click the first token the target put in place of a rejected draft: the Step
    view opens on that token's round."""
    url, _page, errors, demo, browser = browser_app
    noisy = Path(demo.traces_noisy)
    if not (noisy / "manifest.json").exists():
        pytest.skip("demo traces not built (llama-cpp-python missing)")
    ctx = browser.new_context(viewport={"width": 1400, "height": 1800})
    try:
        page = ctx.new_page()
        _open(page, url, "files")
        box = page.get_by_label("…or a path").nth(2)  # drafter, target, trace
        box.fill(str(noisy))
        box.press("Enter")
        settle(page)
        page.locator('[data-testid="stSidebar"]').get_by_text("noisy").first.wait_for(timeout=60_000)
        page.locator('[data-testid="stSidebarNav"]').get_by_text("Text", exact=True).click()
        page.get_by_role("heading", name="Generated text", exact=True).first.wait_for(timeout=120_000)
        settle(page)
        plot = page.locator('[data-testid="stPlotlyChart"]').first
        el = plot.locator(".js-plotly-plot").first
        # the rejected trace's index among the bar traces and its first token's round (customdata [round, g, k])
        i, round_, prompt_text = el.evaluate(
            "(el) => { const d = el._fullData; const i = d.findIndex(t => t.name.startsWith(\"target's correction\"));"
            " return [i, d[i].customdata[0][0], d[i].text[0]]; }")
        assert i >= 0
        bar = plot.locator(".barlayer .trace").nth(i).locator("path").first
        b = bar.bounding_box()
        page.mouse.click(b["x"] + b["width"] / 2, b["y"] + b["height"] / 2)
        page.get_by_role("heading", name="Step view", exact=True).first.wait_for(timeout=60_000)
        settle(page)
        assert urlsplit(page.url).path.rstrip("/").endswith("/step"), page.url
        body = page.locator('[data-testid="stMain"]').inner_text()
        assert f"prompt 0 · round {int(round_)}" in body, body[:600]
        assert "Rejected at k=" in body  # the round it opened has a rejection, said in words
        page.screenshot(path=str(SHOTS / "step-after-text-click.png"), full_page=True)
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        ctx.close()
    assert not errors, errors


def test_upload_small_gguf_selects_it(browser_app, tiny_pair) -> None:
    """Upload a small drafter on the Files page (fresh session): it is stored by content hash under the
    uploads folder, selected, and its header is shown."""
    import hashlib

    from mtpscope.inspector.gguf import open_gguf

    url, _page, errors, _demo, browser = browser_app
    _target, drafter = tiny_pair(vocab="subset", dialect="fork")
    ctx = browser.new_context(viewport={"width": 1400, "height": 1800})
    try:
        page = ctx.new_page()
        _open(page, url, "files")
        page.locator('[data-testid="stFileUploaderDropzoneInput"]').first.set_input_files(str(drafter))
        digest = hashlib.sha256(Path(drafter).read_bytes()).hexdigest()[:16]
        page.locator('[data-testid="stSidebar"]').get_by_text(digest).first.wait_for(timeout=60_000)
        settle(page)
        body = page.locator('[data-testid="stMain"]').inner_text()
        n = len(open_gguf(drafter).tensors)
        assert "gemma4_assistant" in body and f"tensors\n{n}" in body.replace("\n\n", "\n"), body[:800]
        page.screenshot(path=str(SHOTS / "files-after-upload.png"), full_page=True)
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        ctx.close()


def test_upload_of_a_non_gguf_selects_nothing_and_says_why_once(browser_app, tmp_path) -> None:
    """A file that is not a GGUF uploaded as the drafter (fresh session): refused in one line naming it, and the
    drafter selected before stays selected (the sidebar unchanged)."""
    url, _page, errors, _demo, browser = browser_app
    bad = tmp_path / "notes.gguf"
    bad.write_bytes(b"PK\x03\x04 this is a zip, not a GGUF")
    ctx = browser.new_context(viewport={"width": 1400, "height": 1800})
    try:
        page = ctx.new_page()
        _open(page, url, "files")
        before = page.locator('[data-testid="stSidebar"]').inner_text()
        page.locator('[data-testid="stFileUploaderDropzoneInput"]').first.set_input_files(str(bad))
        page.get_by_text("is not a GGUF file").first.wait_for(timeout=60_000)
        settle(page)
        body = page.locator('[data-testid="stMain"]').inner_text()
        assert body.count("notes.gguf is not a GGUF file") == 1, body[:1500]
        assert page.locator('[data-testid="stSidebar"]').inner_text() == before
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        ctx.close()
    assert not errors, errors


def test_deep_link_opens_its_prompt_and_round(browser_app) -> None:
    """A link built with mtpscope.app.links.view_url opens the Step view on its prompt and round in a fresh
    session; a bad round is refused in one line; a round typed past the last is refused and the next click
    clears the refusal (no stale range error)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from mtpscope.app.links import view_url

    url, _page, errors, demo, browser = browser_app
    trace = Path(demo.root) / "trained" / "traces" / "f32"
    if not (trace / "manifest.json").exists():
        trace = Path(demo.traces_noisy)
    if not (trace / "manifest.json").exists():
        pytest.skip("demo traces not built (llama-cpp-python missing)")
    r = pa.concat_tables([pq.read_table(p) for p in sorted((trace / "rounds").glob("*.parquet"))]).to_pandas()
    pid = int(r["prompt_id"].max())
    rounds = sorted(int(x) for x in r.loc[r["prompt_id"] == pid, "round"])
    rnd, hi = rounds[len(rounds) // 2], rounds[-1]
    ctx = browser.new_context(viewport={"width": 1400, "height": 1800})
    try:
        page = ctx.new_page()
        page.goto(view_url("step", trace=trace, prompt=pid, round=rnd, base=url))
        page.get_by_role("heading", name="Step view", exact=True).first.wait_for(timeout=120_000)
        settle(page)
        body = page.locator('[data-testid="stMain"]').inner_text()
        assert f"prompt {pid} · round {rnd}" in body, body[:600]
        assert f"prompt={pid}&round={rnd}" in page.url, page.url
        page.screenshot(path=str(SHOTS / "step-deep-link.png"), full_page=True)

        page.goto(view_url("step", prompt=pid, round=999999, base=url))
        page.get_by_text("no such round").first.wait_for(timeout=60_000)
        settle(page)
        body = page.locator('[data-testid="stMain"]').inner_text()
        assert f"'round': no such round of prompt {pid} (expected a round 0–{hi}, got 999999)" in body, body[:600]
        assert f"prompt {pid} · round" not in body

        page.goto(view_url("step", prompt=pid, round=rounds[0], base=url))
        page.get_by_role("heading", name="Step view", exact=True).first.wait_for(timeout=60_000)
        settle(page)
        box = page.get_by_label("round")
        box.fill(str(hi + 1000))
        box.press("Enter")
        page.get_by_text(f"round {hi + 1000}: prompt {pid} has rounds").first.wait_for(timeout=60_000)
        settle(page)
        page.get_by_role("button", name="◀ previous rejected round").click()
        settle(page)
        body = page.locator('[data-testid="stMain"]').inner_text()
        assert "has rounds" not in body and "outside the allowed range" not in body, body[:600]
        assert f"prompt {pid} · round" in body
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        ctx.close()
    assert not errors, errors
