"""The real llama-server (built by `mtpscope server build` from the llama.cpp llama-cpp-python vendors) on
127.0.0.1, random free ports, with the trained demo pair: probe, replay against mtpscope's recorder, counters,
the server's own log, the not-drafting alarm, a server killed mid-probe, API keys, the Server page.

Skips, saying why, where llama-server cannot be built here or is not built (`make setup` builds it).
"""

from __future__ import annotations

import inspect
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mtpscope.errors import ServerError

pytestmark = [pytest.mark.slow, pytest.mark.llama]

KEY = "mtps-test-key-5f2c9a0e"
N_PREDICT = 32
KILL_PREDICT = 16
CATEGORIES = ("code", "prose", "json", "numbers", "chat", "random")
ROOT = Path(__file__).resolve().parents[1]
#: one thread each: the test machine is shared, and spinning threads of a busy server only wait on each other
THREADS = ["--threads", "1", "--threads-batch", "1", "--spec-draft-threads", "1", "--spec-draft-threads-batch", "1"]


@pytest.fixture(scope="module")
def pair(trained_pair):
    return trained_pair


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    """Six prompts, one per demo category: five as token ids, the prose one as text (the server tokenizes it)."""
    from mtpscope.demo.trained import read_prompts

    by_cat: dict[str, dict] = {}
    for p in read_prompts():
        by_cat.setdefault(p["category"], p)
    path = tmp_path_factory.mktemp("prompts") / "six.jsonl"
    lines = []
    for c in CATEGORIES:
        p = by_cat[c]
        src = {"text": p["text"]} if c == "prose" else {"tokens": p["ids"]}
        lines.append(json.dumps({"id": p["name"], "category": c, **src}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def mtp_server(server_bin, pair, tmp_path_factory):
    from mtpscope.traces.server.launch import launch

    d = tmp_path_factory.mktemp("srv")
    with launch(pair.target, pair.drafter, n_draft=3, log=d / "server.log", binary=server_bin,
                extra=[*THREADS, "--api-key", KEY]) as s:
        yield s


@pytest.fixture(scope="module")
def probed(mtp_server, prompts_file, tmp_path_factory):
    from mtpscope.traces.server.probe import ProbeSettings, probe

    out = tmp_path_factory.mktemp("probe") / "trace"
    summary = probe(mtp_server.url, prompts_file=prompts_file, out=out, settings=ProbeSettings(n_predict=N_PREDICT),
                    headers={"Authorization": f"Bearer {KEY}"})
    return out, summary


def _requests(out: Path):
    from mtpscope.traces.store.reader import open_trace

    t = open_trace(out)
    return t, t.requests.sort_values("request").reset_index(drop=True)


def test_probe_writes_one_row_per_request(probed):
    out, summary = probed
    t, req = _requests(out)
    assert summary.n_requests == 6 and summary.alarm is None and t.manifest["complete"]
    assert list(req["prompt"]) == [t.manifest["prompts"][i]["prompt"] for i in range(6)]
    assert list(req["category"]) == list(CATEGORIES)
    assert (req["n_drafted"] > 0).all() and (req["n_accepted"] <= req["n_drafted"]).all()
    assert (req["predicted_n"] == req["output_tokens"].list.len()).all()
    assert req["counters_match"].all()
    # the server's props as the probe saw them: its model, one slot
    props = t.manifest["server"]["props"]
    assert Path(props["model_path"]).name == "target.gguf" and props["total_slots"] == 1


def test_counter_deltas_equal_the_sum_over_requests(probed):
    out, summary = probed
    t, req = _requests(out)
    delta = t.manifest["counters"]["delta"]
    # /metrics (the server's counters) against each response's own timings
    assert delta["n_draft_tokens"] == int(req["n_drafted"].sum())
    assert delta["n_accepted"] == int(req["n_accepted"].sum())
    assert delta["n_predicted"] == int(req["predicted_n"].sum())
    per = [sum(int(v[i]) for v in req["accepted_per_pos"]) for i in range(3)]
    assert delta["accepted_per_pos"] == per and len(per) == 3      # one series per draft position, n_max 3
    assert delta["n_drafts"] == int(req["n_drafts"].sum())
    assert summary.counters.n_draft_tokens == delta["n_draft_tokens"]


def test_replay_agrees_exactly_with_mtpscope_recording(probed, pair):
    """Greedy, same llama.cpp (the server links llama-cpp-python's libraries), same token ids: every request has
    the same output, the same drafted and the same accepted in mtpscope's recording; the drafts and the
    per-position counts the server's counters gave each request equal the recording's rounds."""
    from mtpscope.traces.analysis.requests import requests_from_rounds
    from mtpscope.traces.server.replay import replay_probe
    from mtpscope.traces.store.reader import open_trace

    out, _ = probed
    res = replay_probe(out, assistant=pair.drafter, target=pair.target)
    table = res.table
    lines = ["request  prompt                     drafted server / mtpscope  accepted server / mtpscope  output"]
    for r in table.to_dict(orient="records"):
        lines.append(f"{r['request_a']:7d}  {r['prompt'][:25]:25}  {r['drafted_a']:>14} / {r['drafted_b']:<9} "
                     f"{r['accepted_a']:>15} / {r['accepted_b']:<9} {'same' if r['same_output'] else 'DIFFERS'}")
    report = "\n".join(lines)
    (ROOT / "test-output").mkdir(exist_ok=True)
    (ROOT / "test-output" / "server-vs-recording.txt").write_text(report + "\n")
    print(report)
    assert len(table) == 6
    assert table["same_counts"].all() and table["same_output"].all(), report
    assert res.first_difference is None and res.all_equal
    settings = {s.setting: s for s in res.settings}
    assert settings["llama.cpp build"].same is True, settings["llama.cpp build"]
    assert settings["draft max (--spec-draft-n-max)"].same is True
    # the server's per-request counter deltas against the recording's rounds
    _, req = _requests(out)
    rec = open_trace(res.recording)
    mine = requests_from_rounds(rec.rounds, rec.manifest["prompts"]).set_index("prompt")
    for r in req.to_dict(orient="records"):
        assert r["n_drafts"] == mine.loc[r["prompt"], "n_drafts"]
        assert list(r["accepted_per_pos"]) == list(mine.loc[r["prompt"], "accepted_per_pos"])
        assert list(r["output_tokens"]) == list(mine.loc[r["prompt"], "output_tokens"])


def test_server_log_import_gives_the_same_counts(probed, mtp_server, tmp_path):
    from mtpscope.traces.importers import import_server_log

    out, _ = probed
    _, req = _requests(out)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and mtp_server.log.read_text(errors="replace").count("draft acceptance") < 6:
        time.sleep(0.2)                                  # llama.cpp's log is written by its own thread
    res = import_server_log(mtp_server.log, tmp_path / "imported")
    assert res.n_bad == 0, res.bad_lines
    _, imp = _requests(tmp_path / "imported")
    logged = imp[imp["kind"] == "log"].reset_index(drop=True).iloc[:6]     # the probe's six, first
    assert len(logged) == 6
    assert list(logged["n_drafted"]) == list(req["n_drafted"])
    assert list(logged["n_accepted"]) == list(req["n_accepted"])
    # the server's "mean len" (2 decimals) against 1 + accepted / drafts from its counters
    assert list(logged["mean_acceptance_length"]) == pytest.approx(list(req["mean_acceptance_length"]), abs=0.006)
    # the drafts each log line's mean len allows are the server's counted drafts (docs/SERVER.md)
    from mtpscope.traces.analysis.requests import request_table

    assert list(request_table(logged)["n_drafts"]) == list(req["n_drafts"])
    assert list(logged["predicted_n"]) == list(req["predicted_n"])
    assert list(logged["id_task"].notna()) == [True] * 6


def test_api_key_never_reaches_the_trace(probed, mtp_server, prompts_file, tmp_path):
    from mtpscope.traces.server.probe import ProbeSettings, probe

    out, _ = probed
    for f in out.rglob("*"):
        if f.is_file():
            assert KEY.encode() not in f.read_bytes(), f
    from mtpscope.traces.store.reader import open_trace

    assert open_trace(out).manifest["params"]["headers"] == {"Authorization": "<redacted>"}
    with pytest.raises(ServerError) as e:            # without the key: one line, the server's own words
        probe(mtp_server.url, prompts_file=prompts_file, out=tmp_path / "nokey",
              settings=ProbeSettings(n_predict=4))
    assert "HTTP 401" in str(e.value) and "\n" not in str(e.value) and KEY not in str(e.value)


def _mtpscope(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtpscope.cli", *args], capture_output=True, text=True,
                          timeout=600, **kw)


def test_server_without_a_draft_model_raises_the_alarm(server_bin, pair, prompts_file, tmp_path):
    """`mtpscope server run` without --assistant: the target alone; `mtpscope probe` says it is not drafting."""
    from mtpscope.traces.server.launch import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mtpscope.cli", "server", "run", "--target", str(pair.target),
                             "--port", str(port), "--log", str(tmp_path / "plain.log"), "--", *THREADS],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}", proc.stderr.read() if proc.poll() is not None else url
        r = _mtpscope("probe", url, "--prompts", str(prompts_file), "--out", str(tmp_path / "plain"),
                      "--n-predict", "8")
        assert r.returncode == 1, r.stderr
        assert ("the server is not running MTP: no draft tokens in 6 requests — check `--spec-type draft-mtp` "
                "and the draft model") in r.stderr
        r2 = _mtpscope("explain", str(tmp_path / "plain"), "--by", "request")
        assert r2.returncode == 1 and "ALARM" in r2.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def test_server_killed_mid_probe_keeps_the_answered_requests(server_bin, pair, prompts_file, mtp_server, tmp_path):
    from mtpscope.traces.server.launch import launch
    from mtpscope.traces.server.probe import ProbeSettings, probe
    from mtpscope.traces.store.reader import open_trace

    out = tmp_path / "killed"
    srv = launch(pair.target, pair.drafter, n_draft=3, log=tmp_path / "k.log", binary=server_bin, extra=THREADS)
    try:
        def kill_after_two(row: dict) -> None:
            if row["request"] == 1:     # the third request is about to be sent: the server dies under it
                threading.Timer(0.02, srv.kill).start()

        with pytest.raises(ServerError) as e:
            probe(srv.url, prompts_file=prompts_file, out=out, settings=ProbeSettings(n_predict=KILL_PREDICT),
                  on_request=kill_after_two)
    finally:
        srv.stop()
    msg = str(e.value)
    assert "\n" not in msg and srv.url in msg and "request 2" in msg and "2 answered requests kept" in msg, msg
    t = open_trace(out)
    assert len(t.requests) == 2 and not t.manifest["complete"]
    assert t.manifest["aborted"]["request"].startswith("request 2")
    first_two = t.requests.sort_values("request")[["request", "n_drafted", "started_unix_s"]].to_dict("records")
    # --resume on another server (the module's, which wants a key): the two answered requests are kept as they
    # were, the other four are sent
    s2 = probe(mtp_server.url, prompts_file=prompts_file, out=out, settings=ProbeSettings(n_predict=KILL_PREDICT),
               resume=True, headers={"Authorization": f"Bearer {KEY}"})
    assert (s2.n_resumed, s2.n_sent, s2.n_requests) == (2, 4, 6)
    t2 = open_trace(out)
    assert t2.manifest["complete"] and len(t2.requests) == 6
    again = t2.requests.sort_values("request")[["request", "n_drafted", "started_unix_s"]].to_dict("records")[:2]
    assert again == first_two


# ------------------------------------------------------------------------------------------------ the app

def test_server_page_in_apptest(probed, pair, monkeypatch):
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    from mtpscope.cli.serve import main_script

    out, _ = probed
    _, req = _requests(out)
    monkeypatch.setenv("MTPSCOPE_ROOTS", str(out.parent))
    at = AppTest.from_file(str(main_script()), default_timeout=120)
    at.run()
    at.switch_page("screens/server.py").run()
    at.text_input(key="w.server.trace").set_value(str(out)).run()
    assert not at.exception, [e.value for e in at.exception]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["requests"] == "6"
    assert metrics["drafted"] == str(int(req["n_drafted"].sum()))
    assert metrics["acceptance rate"] == f"{100 * req['n_accepted'].sum() / req['n_drafted'].sum():.1f} %"
    assert not [e for e in at.error if "not running MTP" in str(e.value)]
    assert len(at.get("plotly_chart")) == 3
    # replay one request from the page: mtpscope's recording agrees with the server's numbers of that request
    monkeypatch.setenv("MTPSCOPE_ROOTS", f"{out.parent}:{pair.root}")
    at.selectbox(key="w.server.request").set_value(3).run()
    at.text_input(key="w.server.assistant").set_value(str(pair.drafter))
    at.text_input(key="w.server.target").set_value(str(pair.target))
    next(b for b in at.button if b.key == "server.replay").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert [s.value for s in at.success] == ["same output, same drafted, same accepted"], [e.value for e in at.error]
    row = req[req["request"] == 3].iloc[0]
    shown = at.dataframe[-1].value
    assert list(shown["drafted (server)"]) == [row["n_drafted"]] == list(shown["drafted (mtpscope)"])
    assert list(shown["accepted (server)"]) == [row["n_accepted"]] == list(shown["accepted (mtpscope)"])


@pytest.mark.browser
def test_server_page_in_chromium(probed, tmp_path):
    from tests.apphelpers import start_app
    from tests.browser import ARGS, CHROMIUM, need_browser, settle

    sync_api = need_browser()
    out, _ = probed
    _, req = _requests(out)
    with start_app(tmp_path / "app.log", env={"MTPSCOPE_ROOTS": str(out.parent)}) as url, \
            sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{url}/server")
            page.get_by_role("heading", name="Server", exact=True).first.wait_for(timeout=120_000)
            box = page.get_by_label("probe trace (or an imported server log)")
            box.fill(str(out))
            box.press("Enter")
            page.get_by_text("mean acceptance length").first.wait_for(timeout=120_000)
            settle(page)
            body = page.locator('[data-testid="stMain"]').inner_text()
            assert f"{100 * req['n_accepted'].sum() / req['n_drafted'].sum():.1f} %" in body, body[:800]
            assert page.locator('[data-testid="stPlotlyChart"]').count() == 3
            assert page.locator('[data-testid="stException"]').count() == 0
            shots = ROOT / "test-output" / "screenshots"
            shots.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shots / "server.png"), full_page=True)
            assert not errors, errors
        finally:
            browser.close()
    assert "Traceback" not in (tmp_path / "app.log").read_text()


def test_server_page_probes_a_server_in_apptest(mtp_server, prompts_file, tmp_path, monkeypatch):
    """The page's own probe: a URL, a key, a prompts file; the probe runs on a thread and the page shows it."""
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    from mtpscope.cli.serve import main_script

    monkeypatch.setenv("MTPSCOPE_ROOTS", f"{tmp_path}:{prompts_file.parent}")
    out = tmp_path / "page-probe"
    at = AppTest.from_file(str(main_script()), default_timeout=120)
    at.run()
    at.switch_page("screens/server.py").run()
    at.radio(key="w.server.mode").set_value("probe a server").run()
    at.text_input(key="w.server.url").set_value(mtp_server.url)
    at.text_input(key="w.server.header").set_value(f"Authorization: Bearer {KEY}")
    at.radio(key="w.server.prompt_source").set_value("a file path")
    at.text_input(key="w.server.prompts").set_value(str(prompts_file))
    at.text_input(key="w.server.out").set_value(str(out))
    at.number_input(key="w.server.n_predict").set_value(8)
    at.button[0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    job = at.session_state["server.job"]
    deadline = time.monotonic() + 300
    while not job.done and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job.done and job.error is None, job
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert {m.label: m.value for m in at.metric}["requests"] == "6"
    # the requests table and the replay are on this page, where the probe ran (no switch to "open a probe trace")
    assert at.radio(key="w.server.mode").value == "probe a server"
    assert len(at.dataframe[0].value) == 6 and at.selectbox(key="w.server.request").value == 0
    for f in out.rglob("*"):
        if f.is_file():
            assert KEY.encode() not in f.read_bytes(), f
    # another host is refused without the switch and the allow-list, before anything is sent
    at.text_input(key="w.server.url").set_value("http://192.0.2.7:8080")
    at.button[0].click().run()
    assert any("only this machine's llama-server" in str(e.value) for e in at.error), [e.value for e in at.error]


def test_server_page_probes_with_the_demo_prompts_into_the_cache(mtp_server, pair, tmp_path, monkeypatch):
    """The page's defaults: the demo's 36 prompts, ``mtpscope probe``'s n_predict (128, read from the CLI's own
    option here), and the trace written under the cache folder's uploads, not the working directory."""
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    from mtpscope.cli.main import app as cli_app
    from mtpscope.cli.serve import main_script

    cmd = next(c for c in cli_app.registered_commands if c.name == "probe")
    cli_default = next(p.default for p in inspect.signature(cmd.callback).parameters.values()
                       if getattr(p.default, "param_decls", None) == ("--n-predict",)).default
    uploads = tmp_path / "uploads"
    monkeypatch.setenv("MTPSCOPE_UPLOADS", str(uploads))
    monkeypatch.chdir(tmp_path)
    at = AppTest.from_file(str(main_script()), default_timeout=120)
    at.run()
    at.switch_page("screens/server.py").run()
    at.radio(key="w.server.mode").set_value("probe a server").run()
    assert at.number_input(key="w.server.n_predict").value == cli_default == 128
    assert at.radio(key="w.server.prompt_source").value.startswith("the demo's")
    at.text_input(key="w.server.url").set_value(mtp_server.url)
    at.text_input(key="w.server.header").set_value(f"Authorization: Bearer {KEY}")
    at.number_input(key="w.server.n_predict").set_value(4)
    at.button[0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    job = at.session_state["server.job"]
    host = mtp_server.url.split("://", 1)[1].replace(":", "-")
    assert Path(job.out) == uploads / "probes" / host
    deadline = time.monotonic() + 400
    while not job.done and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job.done and job.error is None, job
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    from mtpscope.demo.trained import read_prompts

    assert {m.label: m.value for m in at.metric}["requests"] == str(len(read_prompts())) == "36"
    assert len(at.dataframe[0].value) == 36
    assert not [p for p in tmp_path.iterdir() if p.name != "uploads"]   # nothing in the working directory


@pytest.mark.browser
def test_server_page_shows_the_probe_where_it_ran_in_chromium(mtp_server, tmp_path):
    """In a real browser: a probe started on the page with the demo's prompts; when it ends the requests table and
    the replay controls appear on the same page, with no click (the refreshing view reruns the whole page)."""
    from tests.apphelpers import start_app
    from tests.browser import ARGS, CHROMIUM, need_browser, settle

    sync_api = need_browser()
    with start_app(tmp_path / "app.log", env={"MTPSCOPE_UPLOADS": str(tmp_path / "uploads")}) as url, \
            sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{url}/server")
            page.get_by_role("heading", name="Server", exact=True).first.wait_for(timeout=120_000)
            page.get_by_text("probe a server", exact=True).click()
            page.get_by_role("textbox", name="server URL").fill(mtp_server.url)
            page.get_by_role("textbox", name="header (e.g. an API key").fill(f"Authorization: Bearer {KEY}")
            page.get_by_role("spinbutton", name="n_predict").fill("4")
            page.get_by_role("button", name="start probe").click()
            page.get_by_text("request to replay (or click its row)").first.wait_for(timeout=400_000)
            settle(page)
            body = page.locator('[data-testid="stMain"]').inner_text()
            assert "Requests" in body and "replay request" in body, body[:1500]
            assert page.locator('[data-testid="stException"]').count() == 0
            assert not errors, errors
        finally:
            browser.close()
    assert (tmp_path / "uploads" / "probes").is_dir()
    assert "Traceback" not in (tmp_path / "app.log").read_text()
