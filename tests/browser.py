"""Real-browser helpers shared by the tests that drive Debian's Chromium through Playwright.

Never ``playwright install``: no network for browsers; Chromium comes from Debian (``make browser``).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("MTPSCOPE_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

def need_browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (test extra) not installed")
    if not (Path(CHROMIUM).exists() or shutil.which("chromium")):
        pytest.skip(f"Chromium not found at {CHROMIUM} (run `make browser` to install Debian's chromium)")
    return sync_api


def settle(page, timeout: float = 120.0) -> None:
    """Wait until the script run is over: no running indicator, no skeletons, DOM size stable ~1.5 s."""
    t0 = time.monotonic()
    last, stable = -1, 0
    while time.monotonic() - t0 < timeout:
        n = page.locator("[data-testid]").count()
        busy = page.locator('[data-testid="stStatusWidget"], [data-testid="stSkeleton"]').count()
        stable = stable + 1 if (n == last and not busy) else 0
        last = n
        if stable >= 6:
            return
        time.sleep(0.25)
    raise AssertionError(f"page did not settle within {timeout:.0f} s")
