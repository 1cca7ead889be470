"""The app's URL field and memory estimate (Files page), and the pure URL check in app/safety.py.

URLs are off unless ``MTPSCOPE_ALLOW_URLS=1``; hosts must be on the allow-list (``MTPSCOPE_URL_HOSTS``,
default the Hub). The page test serves the demo target from a real HTTP server on 127.0.0.1.
"""

from __future__ import annotations

from typing import Any

import pytest

from mtpscope.app import safety
from mtpscope.errors import PathNotAllowedError

ON = {"MTPSCOPE_ALLOW_URLS": "1"}


def test_urls_off_by_default() -> None:
    assert not safety.urls_allowed({})
    with pytest.raises(PathNotAllowedError, match="reading URLs is off") as e:
        safety.check_url("https://huggingface.co/a/b/resolve/main/x.gguf", {})
    assert "MTPSCOPE_ALLOW_URLS=1" in e.value.one_line()


def test_host_allow_list() -> None:
    assert safety.check_url("https://huggingface.co/a/b/resolve/main/x.gguf", ON)
    assert safety.check_url("hf://org/repo/x.gguf", ON)  # the Hub's host
    assert safety.check_url("https://cdn-lfs.hf.co/x.gguf", ON)  # a sub-domain of an allowed host
    for bad in ("https://evilhf.co/x.gguf", "https://hf.co.example.org/x.gguf", "http://127.0.0.1:8000/x.gguf"):
        with pytest.raises(PathNotAllowedError, match="host not in the allow-list"):
            safety.check_url(bad, ON)
    own = {**ON, "MTPSCOPE_URL_HOSTS": "127.0.0.1, models.example.org"}
    assert safety.url_hosts(own) == ("127.0.0.1", "models.example.org")
    assert safety.check_url("http://127.0.0.1:8000/x.gguf", own)
    with pytest.raises(PathNotAllowedError, match="host not in the allow-list"):
        safety.check_url("https://huggingface.co/a/b/resolve/main/x.gguf", own)
    with pytest.raises(PathNotAllowedError, match="not a URL"):
        safety.check_url("ftp://huggingface.co/x.gguf", ON)


pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402  # after the importorskip of streamlit

from mtpscope.app import selection  # noqa: E402  # after the importorskip of streamlit
from mtpscope.cli.serve import main_script  # noqa: E402  # after the importorskip of streamlit

MAIN = str(main_script())


def _files(monkeypatch: Any, env: dict[str, str], **slots: Any) -> AppTest:
    for k in ("MTPSCOPE_ALLOW_URLS", "MTPSCOPE_URL_HOSTS"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    at = AppTest.from_file(MAIN, default_timeout=120)
    for k, v in slots.items():
        at.session_state[selection.slot_key(k)] = None if v is None else str(v)
    at.run()  # the start page (/)
    at.switch_page("screens/files.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_files_page_memory_estimate(monkeypatch: Any, demo_dir: Any) -> None:
    from mtpscope.app.charts import human_bytes
    from mtpscope.inspector.estimate import EstimateParams, estimate

    at = _files(monkeypatch, {}, drafter=demo_dir.drafter_upstream, target=demo_dir.target, trace=None)
    e = estimate(demo_dir.target, demo_dir.drafter_upstream, EstimateParams(n_ctx=8192))
    tables = [t.value for t in at.table]
    table = next(t for t in tables if t.index.name == "device" and "kv" in t.columns)
    row = table.loc["CPU"]
    assert row["weights"] == human_bytes(e.by_device["CPU"]["weights"])
    assert row["kv"] == human_bytes(e.target.kv) and row["total"] == human_bytes(e.total)
    assert any("KV none" in c.value for c in at.caption)
    assert any("reading URLs is off" in c.value or f"{safety.ALLOW_URLS_ENV}=1" in c.value for c in at.caption)


def test_files_page_url_field(monkeypatch: Any, demo_dir: Any) -> None:
    from mtpscope.inspector.gguf import open_gguf
    from tests.remote_server import FileServer

    with FileServer({"t.gguf": demo_dir.target}) as srv:
        at = _files(monkeypatch, {**ON, "MTPSCOPE_URL_HOSTS": "127.0.0.1"}, drafter=None, target=None, trace=None)
        at.text_input(key=selection.FILES_URL).input(srv.url("range", "t.gguf")).run()
        assert not at.exception, [e.value for e in at.exception]
        f = open_gguf(demo_dir.target)
        assert [m.value for m in at.metric if m.label == "tensors"][-1] == str(len(f.tensors))
        assert any("requests" in c.value for c in at.caption)
        assert all(h.status == 206 for h in srv.hits) and len(srv.hits) <= 6
        at.text_input(key=selection.FILES_URL).input("https://example.org/x.gguf").run()
        assert any("host not in the allow-list" in e.value for e in at.error)
