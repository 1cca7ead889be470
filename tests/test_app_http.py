"""`make run` serves the app: start the server like the Makefile does and fetch it over HTTP."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest

from tests.apphelpers import ROOT, start_app

pytest.importorskip("streamlit")


@pytest.mark.slow
def test_make_run_serves_the_app(tmp_path: Path) -> None:
    makefile = (ROOT / "Makefile").read_text()
    # the command we start is the Makefile's (`mtpscope app`, which serves the packaged entry script)
    assert re.search(r"^run:.*\n\t\$\(VENV\)/bin/mtpscope app --port \$\(PORT\)", makefile, re.M)
    with start_app(tmp_path / "server.log") as url:
        with urllib.request.urlopen(url + "/", timeout=10) as r:
            assert r.status == 200
            html = r.read().decode("utf-8", "replace")
        assert '<div id="root">' in html
        with urllib.request.urlopen(url + "/_stcore/health", timeout=10) as r:
            assert r.read().strip() == b"ok"
        # every page's URL is served by the same single-page app
        for page in ("tensors", "validate", "centroids", "values", "acceptance", "step", "compare"):
            with urllib.request.urlopen(f"{url}/{page}", timeout=10) as r:
                assert r.status == 200
    log = (tmp_path / "server.log").read_text()
    assert "Traceback" not in log, log[-2000:]
