"""Benchmark: first load of every app page on the demo, in real Chromium (issue 36 target: <= 2 s each).

Starts the app as ``make run`` does (``mtpscope app`` on a free loopback port) and opens each page by
its address (a page load: a new Streamlit session, nothing of the previous page's session state), timing
from ``page.goto`` to the moment the page is shown (:func:`load_time`). Two passes: ``cold`` (the first
visit of each page in this server process, right after it answers its health check: what the server's warm-up
(mtpscope.app.warmup) has not done yet is done by the page; the first page also loads the app's static files)
and ``warm`` (the same address again: what every later user sees). Printed as a table, seconds and ratio =
seconds / target (< 1 is within target), under the server's start time (the command to its health check: the
warm-up's imports are in it). ``MTPSCOPE_NO_WARMUP=1`` measures the server without its warm-up.

``--returning``: the browser has visited the app before, as a returning user's has: every page is first opened on
a server started on the same port and stopped again (the browser's HTTP cache then holds Streamlit's static files,
content-hashed and cached for a year, and the chart and table components they load on demand), then the measured
server starts; ``cold`` is then the first visit after a server start without the browser's first download of
Streamlit's frontend (by default the browser starts empty: ``cold`` includes that download, about 1 s here, and
plotly.js's first evaluation on a page with charts); the measured server's first request comes right after its
health check (a new browser is started after it).

Needs the demo (``mtpscope demo build``), playwright and Debian's Chromium (``make browser``). Exits 0
whatever the numbers (speed targets are reported, never asserted). Timings on a busy machine are noise:
run it on a quiet one.

``--floor``: Streamlit's own first visit, without the app: bare pages (:data:`FLOOR`: a title; a title and one
three-bar plotly chart; a title, a metric, that chart and a 10-row data frame), each on a fresh ``streamlit run``
with mtpscope's server flags and a new browser, timed like the app's pages: what no page of the app can beat.

Usage: ``python -m benchmarks.bench_pages [--pages start,explain] [--repeats 1] [--returning] [--floor]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

TARGET_S = 2.0
CHROMIUM = os.environ.get("MTPSCOPE_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

#: page (URL path; "" = the start page) -> the heading it shows
PAGES = {"": "Start", "files": "Files", "tensors": "Tensors", "validate": "Validate", "centroids": "Centroids",
         "values": "Tensor values", "acceptance": "Acceptance", "text": "Generated text", "step": "Step view",
         "explain": "Explain", "compare": "Compare", "sweep": "Sweep", "server": "Server", "diagnose": "Diagnose"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the app exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    raise SystemExit(f"the app was not healthy after {timeout:.0f} s")


def load_time(page, url: str, heading: str, timeout: float = 120.0, quiet_s: float = 1.0) -> float:
    """Seconds from ``goto(url)`` until the page is shown: its heading is there, Streamlit's run state on the
    app element is ``notRunning`` (a quiet DOM alone can be a run still computing), no skeleton is left,
    every chart is drawn, and the DOM has not changed for ``quiet_s`` (the time of its last change is
    returned, the quiet period is not counted)."""
    t0 = time.perf_counter()
    page.goto(url)
    page.get_by_role("heading", name=heading, exact=True).first.wait_for(timeout=timeout * 1000)
    last_n, last_change = -1, time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        n = page.locator("[data-testid]").count()
        busy = (page.locator('[data-testid="stApp"][data-test-script-state="running"]').count()
                or page.locator('[data-testid="stSkeleton"]').count()
                or page.locator('[data-testid="stPlotlyChart"]:not(:has(.main-svg))').count())  # not drawn yet
        now = time.perf_counter()
        if n != last_n or busy:
            last_n, last_change = n, now
        elif now - last_change >= quiet_s:
            return last_change - t0
        time.sleep(0.05)
    raise SystemExit(f"{url} did not settle within {timeout:.0f} s")


#: ``--floor``'s bare Streamlit pages (name -> script), each headed "Floor".
FLOOR = {
    "title": 'import streamlit as st\nst.title("Floor")\n',
    "chart": 'import plotly.graph_objects as go\nimport streamlit as st\nst.title("Floor")\n'
             'st.plotly_chart(go.Figure(go.Bar(x=[1, 2, 3], y=[1, 3, 2])))\n',
    "chart+table": 'import pandas as pd\nimport plotly.graph_objects as go\nimport streamlit as st\nst.title("Floor")\n'
                   'st.metric("a", 1)\nst.plotly_chart(go.Figure(go.Bar(x=[1, 2, 3], y=[1, 3, 2])))\n'
                   'st.dataframe(pd.DataFrame({"a": range(10), "b": range(10)}))\n',
}


def floor(pw, exe: str | None, work: Path) -> dict[str, tuple[float, float]]:
    """``{name: (first visit s, second visit s)}`` of each :data:`FLOOR` page on its own fresh server, by a new
    browser (the first visit downloads Streamlit's frontend, as the app's cold pass does)."""
    from mtpscope.cli.serve import SERVER_FLAGS

    out = {}
    for name, text in FLOOR.items():
        script = work / f"floor_{name.replace('+', '_')}.py"
        script.write_text(text)
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(script), "--server.port", str(port),
                                 "--server.address", "127.0.0.1", *SERVER_FLAGS],
                                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            _wait_healthy(url, proc)
            browser, tab = _browser(pw, exe)
            try:
                out[name] = (load_time(tab, url + "/", "Floor"), load_time(tab, url + "/", "Floor"))
            finally:
                browser.close()
        finally:
            _stop(proc)
    return out


def _serve(port: int, env: dict[str, str], log) -> subprocess.Popen:
    """Start ``mtpscope app`` on ``port`` (as ``make run`` does), its output to ``log``."""
    return subprocess.Popen([sys.executable, "-m", "mtpscope.cli", "app", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, env=env)


def _browser(pw, exe: str | None):
    """Chromium and one tab in one browser context: its HTTP cache holds the app's static files after the first
    page (as a returning user's browser does); each goto is a new Streamlit session all the same."""
    browser = pw.chromium.launch(executable_path=exe, args=ARGS)
    return browser, browser.new_context(viewport={"width": 1400, "height": 1800}).new_page()


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=20)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", default=",".join(p or "start" for p in PAGES),
                    help="comma-separated URL paths ('start' = /)")
    ap.add_argument("--repeats", type=int, default=1, help="warm passes (the median is printed)")
    ap.add_argument("--returning", action="store_true",
                    help="the browser visited every page before, on a server started on the same port and stopped")
    ap.add_argument("--floor", action="store_true", help="only Streamlit's own first visit of bare pages (no app)")
    a = ap.parse_args()
    from playwright.sync_api import sync_playwright

    if a.floor:
        with tempfile.TemporaryDirectory() as work, sync_playwright() as pw:
            exe = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
            got = floor(pw, exe, Path(work))
        print(f"{'bare page':<12} {'first s':>7} {'again s':>7}  (Streamlit alone, a fresh server and a new browser each)")
        for name, (first, again) in got.items():
            print(f"{name:<12} {first:7.2f} {again:7.2f}")
        return

    from mtpscope.cache import demo_dir

    if not (demo_dir() / "target.gguf").exists():
        raise SystemExit("the demo is not built: run `mtpscope demo build`")
    wanted = ["" if p == "start" else p for p in a.pages.split(",") if p]
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    rows: dict[str, list[float]] = {p: [] for p in wanted}
    with tempfile.TemporaryDirectory() as work, sync_playwright() as pw:
        env = {**os.environ, "MTPSCOPE_UPLOADS": str(Path(work) / "uploads")}
        log = open(Path(work) / "server.log", "w")  # noqa: SIM115 - closed after the server stops
        exe = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
        browser = None
        try:
            if a.returning:   # the browser's earlier visit, to a server on the same port that is then stopped
                browser, tab = _browser(pw, exe)
                proc = _serve(port, env, log)
                try:
                    _wait_healthy(url, proc)
                    for p in wanted:
                        load_time(tab, f"{url}/{p}", PAGES[p])
                    tab.goto("about:blank")
                finally:
                    _stop(proc)
            t_start = time.perf_counter()
            proc = _serve(port, env, log)
            try:
                _wait_healthy(url, proc)
                healthy_s = time.perf_counter() - t_start
                if browser is None:   # a new browser, started once the server is healthy
                    browser, tab = _browser(pw, exe)
                for _ in range(1 + a.repeats):
                    for p in wanted:
                        rows[p].append(load_time(tab, f"{url}/{p}", PAGES[p]))
            finally:
                _stop(proc)
        finally:
            if browser is not None:
                browser.close()
            log.close()
    import statistics

    print(f"server start: {healthy_s:.2f} s from the command to /_stcore/health ok (the warm-up's imports included; "
          f"{'off' if os.environ.get('MTPSCOPE_NO_WARMUP') == '1' else 'on'}: MTPSCOPE_NO_WARMUP); browser "
          + ("returning (its cache filled by an earlier server on this port)" if a.returning else "new (empty cache)"))
    print(f"{'page':<12} {'cold s':>7} {'warm s':>7} {'ratio':>6}  (target {TARGET_S:.1f} s; ratio = warm / target)")
    for p, ts in rows.items():
        warm = statistics.median(ts[1:])
        print(f"{p or 'start':<12} {ts[0]:7.2f} {warm:7.2f} {warm / TARGET_S:6.2f}")


if __name__ == "__main__":
    main()
