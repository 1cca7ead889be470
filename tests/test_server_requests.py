"""llama-server requests without a llama-server: the Prometheus text reader, counter deltas, the request tables
and their groupings, the alarm, the request diff, the URL rules of the Server page, and the client's one-line
errors against a real HTTP server on 127.0.0.1 that is not llama-server (redirects elsewhere, garbage).
The real llama-server is in tests/test_server.py."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mtpscope.errors import PathNotAllowedError, ServerError
from mtpscope.traces.analysis import requests as R
from mtpscope.traces.server.client import (
    ServerClient,
    SpecCounters,
    check_base_url,
    parse_header,
    parse_prometheus,
    redact_headers,
    spec_counters,
)

# llama-server's /metrics as its to_metrics() prints it (tools/server/server-task.cpp), values typed by hand
METRICS = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 57
llamacpp:tokens_predicted_total 31
# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 27
llamacpp:spec_decode_num_accepted_tokens_total 13
llamacpp:spec_decode_num_drafts_total 9
llamacpp:predicted_tokens_seconds 41.5
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 7
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 2
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 4
"""

ROOT = Path(__file__).resolve().parents[1]


def test_prometheus_text_and_counters():
    m = parse_prometheus(METRICS)
    assert m["llamacpp:predicted_tokens_seconds"][()] == 41.5
    assert m["llamacpp:spec_decode_num_accepted_tokens_per_pos_total"][(("position", "1"),)] == 4
    c = spec_counters(m)
    assert (c.n_draft_tokens, c.n_accepted, c.n_drafts, c.accepted_per_pos) == (27, 13, 9, (7, 4, 2))
    assert (c.n_predicted, c.n_prompt) == (31, 57)
    before = SpecCounters(20, 10, 7, (6, 3), 20, 40)
    d = c.minus(before)
    assert (d.n_draft_tokens, d.n_accepted, d.n_drafts, d.accepted_per_pos) == (7, 3, 2, (1, 1, 2))
    assert not spec_counters({}).present


@pytest.mark.parametrize("text,where", [("llamacpp:x 1 2 3", "line 1"), ("ok 1\nbad{position=1} 2", "line 2"),
                                        ("n 1.5e", "line 1")])
def test_prometheus_bad_lines_name_the_line(text, where):
    with pytest.raises(ServerError, match=where):
        parse_prometheus(text)


def test_fractional_counter_is_refused():
    with pytest.raises(ServerError, match="non-negative integer"):
        spec_counters(parse_prometheus("llamacpp:spec_decode_num_drafts_total 2.5"))


def test_urls_and_headers():
    assert check_base_url("http://127.0.0.1:8080/") == "http://127.0.0.1:8080"
    for bad in ("ftp://x", "http://u:p@127.0.0.1:1", "http://127.0.0.1:1/?key=s3cret", "127.0.0.1:8080"):
        with pytest.raises(ServerError) as e:
            check_base_url(bad)
        assert "s3cret" not in str(e.value) and ":p@" not in str(e.value)
    assert parse_header("Authorization: Bearer abc") == ("Authorization", "Bearer abc")
    with pytest.raises(ServerError) as e:
        parse_header("Bearer-abc-no-colon")
    assert "abc" not in str(e.value)
    assert redact_headers({"Authorization": "Bearer abc"}) == {"Authorization": "<redacted>"}


def _rows() -> pd.DataFrame:
    # four requests of two categories; counts chosen by hand
    return pd.DataFrame([
        {"request": 0, "kind": "probe", "prompt": "a", "category": "code", "n_drafted": 12, "n_accepted": 6,
         "n_drafts": 4, "accepted_per_pos": [3, 2, 1], "tokens_per_s": 10.0, "predicted_n": 11},
        {"request": 1, "kind": "probe", "prompt": "b", "category": "prose", "n_drafted": 9, "n_accepted": 0,
         "n_drafts": 3, "accepted_per_pos": [0, 0, 0], "tokens_per_s": 6.0, "predicted_n": 4},
        {"request": 2, "kind": "probe", "prompt": "a", "category": "code", "n_drafted": 6, "n_accepted": 6,
         "n_drafts": 2, "accepted_per_pos": [2, 2, 2], "tokens_per_s": 20.0, "predicted_n": 9},
        {"request": 3, "kind": "probe", "prompt": "c", "category": None, "n_drafted": 0, "n_accepted": 0,
         "n_drafts": None, "accepted_per_pos": None, "tokens_per_s": None, "predicted_n": 1},
    ])


def test_request_table_groupings():
    t = R.request_table(_rows())
    assert list(t["acceptance_rate"].round(4))[:3] == [0.5, 0.0, 1.0] and math.isnan(t["acceptance_rate"][3])
    assert list(t["mean_acceptance_length"])[:3] == [2.5, 1.0, 4.0]
    tot = R.totals(_rows())
    assert (tot.n_requests, tot.n_drafted, tot.n_accepted, tot.n_drafts) == (4, 27, 12, 9)
    assert tot.acceptance_rate == pytest.approx(12 / 27)
    assert tot.mean_acceptance_length == pytest.approx(1 + 12 / 9)
    assert tot.tokens_per_s_mean == pytest.approx(12.0) and math.isnan(tot.tokens_per_s_pooled)   # no times
    # with generation times: all tokens (10 * 1.1 + 6 * 0.5 + 20 * 0.45 = 23) over all time (2.05 s)
    timed = _rows().assign(predicted_ms=[1100.0, 500.0, 450.0, None])
    assert R.totals(timed).tokens_per_s_pooled == pytest.approx(23 / 2.05)
    cat = R.by_category(_rows()).set_index("category")
    assert cat.loc["code", "n_drafted"] == 18 and cat.loc["code", "acceptance_rate"] == pytest.approx(12 / 18)
    assert cat.loc["(none)", "n_requests"] == 1
    assert list(R.by_category(_rows())["category"])[0] == "prose"          # worst first
    pos = R.per_position(_rows())
    assert list(pos["n_accepted"]) == [5, 4, 3] and list(pos["rate"]) == pytest.approx([5 / 9, 4 / 9, 3 / 9])


def test_alarm_only_when_nothing_was_drafted():
    assert R.not_drafting_alarm(_rows()) is None
    none = _rows().assign(n_drafted=0, n_accepted=0)
    msg = R.not_drafting_alarm(none)
    assert msg == ("the server is not running MTP: no draft tokens in 4 requests — check `--spec-type draft-mtp` "
                   "and the draft model")
    assert R.not_drafting_alarm(none.iloc[:0]) is None


def test_kinds_are_never_added_together():
    both = pd.concat([_rows().assign(kind="log"), _rows().assign(kind="response", n_drafted=1, n_accepted=1)])
    assert R.totals(both).n_drafted == 4            # the response rows, not the log rows, not both


def test_compare_requests_pairs_by_prompt_and_occurrence():
    a = _rows()
    b = pd.DataFrame([{"request": 0, "kind": "record", "prompt": "a", "n_drafted": 12, "n_accepted": 6},
                      {"request": 1, "kind": "record", "prompt": "b", "n_drafted": 9, "n_accepted": 1},
                      {"request": 2, "kind": "record", "prompt": "c", "n_drafted": 0, "n_accepted": 0}])
    d = R.compare_requests(a, b, reuse_b=True)
    assert list(d["request_a"]) == [0, 1, 2, 3]
    assert list(d["same_counts"]) == [True, False, False, True]        # request 2 (a again) vs a's 12 / 6
    d2 = R.compare_requests(a, b)
    assert list(d2["request_a"]) == [0, 1, 3]                           # a's second occurrence has no partner
    # the rows as records: their to_dict() is the table's JSON, their fields its columns
    import json

    pairs = R.request_pairs(d)
    assert [p.to_dict() for p in pairs] == json.loads(d.to_json(orient="records"))
    assert [p.differs for p in pairs] == [False, True, True, False] and pairs[1].request_a == 1
    tot = R.totals(_rows())
    assert list(tot.to_dict()) == ["n_requests", "n_drafted", "n_accepted", "acceptance_rate", "n_drafts",
                                   "mean_acceptance_length", "tokens_per_s_mean", "tokens_per_s_pooled"]
    v = R.requests_view(_rows())
    assert v.totals == tot and v.table.equals(R.request_table(_rows())) and v.alarm is None


def test_requests_from_rounds_by_hand():
    rounds = pd.DataFrame({"prompt_id": [0, 0, 0, 1], "round": [0, 1, 2, 0], "n_draft": [3, 3, 2, 3],
                           "n_accepted": [3, 1, 0, 2], "pending_token": [5, 9, 8, 4],
                           "emitted": [[1, 2, 3, 9], [4, 8], [7], [6, 6, 2]]})
    r = R.requests_from_rounds(rounds, [{"prompt_id": 0, "id": "x"}, {"prompt_id": 1}, {"prompt_id": 2}])
    assert list(r["n_drafted"]) == [8, 3, 0] and list(r["n_accepted"]) == [4, 2, 0]
    assert list(r["accepted_per_pos"][0]) == [2, 1, 1] and r["n_drafts"][0] == 3
    assert list(r["output_tokens"][0]) == [5, 1, 2, 3, 9, 4, 8, 7] and r["prompt"][0] == "x"
    assert r["output_tokens"][2] is None


def test_server_page_url_rules():
    from mtpscope.app.safety import check_server_url

    assert check_server_url("http://127.0.0.1:8080") == "http://127.0.0.1:8080"
    assert check_server_url("http://localhost:1/") == "http://localhost:1"
    with pytest.raises(PathNotAllowedError, match="MTPSCOPE_ALLOW_URLS"):
        check_server_url("http://gpu-box:8080", environ={})
    with pytest.raises(PathNotAllowedError, match="allow-list"):
        check_server_url("http://gpu-box:8080", environ={"MTPSCOPE_ALLOW_URLS": "1"})
    env = {"MTPSCOPE_ALLOW_URLS": "1", "MTPSCOPE_URL_HOSTS": "gpu-box,lab.example"}
    assert check_server_url("https://a.lab.example", environ=env) == "https://a.lab.example"
    with pytest.raises(PathNotAllowedError):
        check_server_url("https://evillab.example", environ=env)


def test_client_errors_against_a_real_http_server(tmp_path):
    from tests.remote_server import FileServer

    garbage = tmp_path / "garbage"
    garbage.write_text("<html>not llama-server</html>")
    with FileServer({"p/health": garbage}) as fs:
        base = f"http://127.0.0.1:{fs.port}"
        with ServerClient(base + "/away/p", headers={"Authorization": "Bearer s3cret"}, timeout_s=10) as c:
            with pytest.raises(ServerError, match="redirect to another origin refused") as e:
                c.health()
        assert "s3cret" not in str(e.value) and "localhost" in str(e.value)
        with ServerClient(base + "/norange/p", timeout_s=10) as c:
            with pytest.raises(ServerError, match="not JSON") as e:
                c.health()
        assert "/norange/p/health" in str(e.value) and "GET /health" in str(e.value)
        with ServerClient(base + "/missing/p", timeout_s=10) as c, pytest.raises(ServerError, match="HTTP 404"):
            c.props()
    with ServerClient(base, timeout_s=5) as c:       # the server is gone now
        with pytest.raises(ServerError, match="cannot connect"):
            c.health()


def test_launch_checks_the_model_files_with_our_reader_before_starting_anything(tmp_path, monkeypatch):
    """A file that is no GGUF is named with our reader's offset before llama-server runs or writes a log."""
    from mtpscope.errors import InspectorError
    from mtpscope.traces.server.launch import launch

    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "notgguf.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(InspectorError) as e:
        launch(bad, None, binary="/nonexistent/llama-server")
    assert str(bad) in str(e.value) and "offset 0" in str(e.value) and "magic" in str(e.value)
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (5).to_bytes(8, "little"))
    with pytest.raises(InspectorError) as e:
        launch(trunc, None, binary="/nonexistent/llama-server")
    assert str(trunc) in str(e.value) and "offset" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notgguf.gguf", "trunc.gguf"]   # no log written


def test_server_page_report_and_explain_give_one_tokens_per_s(tmp_path, monkeypatch):
    """An imported llama-server log (the server's own eval-time lines: 99 tokens in 1284.26 ms and 12 in 100 ms):
    the Server page's tokens/s, report's and `explain --by request`'s are all tokens over all time,
    111 / 1.38426 s = 80.2; the mean of the two requests' rates (77.09 and 120.0 = 98.5) is named as such."""
    from streamlit.testing.v1 import AppTest
    from typer.testing import CliRunner

    from mtpscope.app import selection as sel
    from mtpscope.cli.main import app
    from mtpscope.traces.importers import import_server_log
    from tests.test_importers import SERVER_TIMING_LINES

    src = tmp_path / "server.log"
    src.write_text("\n".join(SERVER_TIMING_LINES) + "\n")
    out = tmp_path / "t"
    import_server_log(src, out)
    pooled, mean = 111 / 1.38426, (77.09 + 120.0) / 2
    rep = CliRunner().invoke(app, ["report", str(out)])
    assert f"{pooled:.1f} tokens/s (all tokens / all generation time), {mean:.1f} tokens/s (mean per request)" \
        in rep.stdout, rep.stdout
    ex = CliRunner().invoke(app, ["explain", str(out), "--by", "request"])
    assert f"{pooled:.1f} tokens/s (all tokens / all generation time; the mean of the requests' own rates: " \
           f"{mean:.1f})" in ex.stdout, ex.stdout
    monkeypatch.setenv("MTPSCOPE_ROOTS", str(tmp_path))
    at = AppTest.from_file(str(ROOT / "app" / "screens" / "server.py"), default_timeout=60)
    at.session_state[sel.SERVER_TRACE] = str(out)
    at.run()
    assert not at.exception
    (m,) = [m for m in at.metric if m.label == "tokens/s"]
    assert m.value == f"{pooled:.1f}" and f"{mean:.1f}" in m.help


def test_request_table_text_counts_are_integers_and_unmeasured_requests_come_last() -> None:
    """`explain --by request`'s text: a request without an acceptance rate (a prompt a killed run never reached:
    its counts missing, so the columns are floats) is listed after the measured ones, not first as the "worst";
    counts print as integers (12, not 12.0) and a missing one as the command line's mark for it."""
    import pandas as pd

    from mtpscope.cli.common import MISSING
    from mtpscope.cli.server import format_requests
    from mtpscope.traces.analysis.requests import requests_view

    req = pd.DataFrame({"request": [0, 1, 2], "prompt": ["ran-well", "never-ran", "ran-badly"],
                        "n_prompt_tokens": [12, None, 9], "predicted_n": [40, None, 30],
                        "n_drafted": [30, None, 30], "n_accepted": [27, None, 6], "n_drafts": [10, None, 10]})
    lines = format_requests(requests_view(req)).splitlines()
    rows = [ln for ln in lines if ln.split()[:1] in (["0"], ["1"], ["2"])]
    assert [r.split()[1] for r in rows] == ["ran-badly", "ran-well", "never-ran"]       # 0.2, 0.9, then no rate
    assert rows[0].split()[2:6] == ["9", "30", "30", "6"] and "12.0" not in "\n".join(rows)
    assert rows[2].split()[2:6] == [MISSING] * 4


# the two answers of one probe of the trained demo pair (n_predict 24, n_draft 3) as llama-server logged them
# (tools/server/server-context.cpp prints mean len with %5.2f); the server's counters gave these requests 7 and 8
# drafts (verification steps): 1 + 16 / 7 = 3.2857 prints 3.29, 1 + 14 / 8 = 2.75
LOGGED = [
    "0.16.914.282 I slot print_timing: id  0 | task 1 | draft acceptance = 0.80000 (   16 accepted /    20 generated),"
    " mean len =  3.29",
    "0.31.238.759 I slot print_timing: id  0 | task 12 | draft acceptance = 0.58333 (   14 accepted /    24 generated),"
    " mean len =  2.75",
]


def test_a_log_lines_drafts_come_from_its_mean_len_when_one_count_fits() -> None:
    """A log line prints no drafts count; its `mean len` (two decimals) allows exactly one whole number of drafts, or
    several, or none (worked by hand: 16 accepted at 3.29 -> 7, since 16/6 = 2.67 and 16/8 = 2.0 are far off)."""
    assert R.drafts_from_mean_len(16, 20, 3.29) == 7
    assert R.drafts_from_mean_len(14, 24, 2.75) == 8
    # 1000 accepted at 2.50: 1 + 1000/666 = 2.5015 and 1 + 1000/667 = 2.4993 both print 2.50 -> unknown
    assert R.drafts_from_mean_len(1000, 3000, 2.50) is None
    # nothing accepted: 1.00 whatever the drafts (1..9) -> unknown; no count at all fits 1.50 with 1 accepted of 1
    assert R.drafts_from_mean_len(0, 9, 1.00) is None
    assert R.drafts_from_mean_len(1, 1, 1.50) is None
    assert R.drafts_from_mean_len(3, 4, None) is None


def test_an_imported_logs_mean_acceptance_length_over_all_requests(tmp_path) -> None:
    """The same two requests imported from the server's log: each row's drafts from its mean len (7, 8), so the
    overall mean acceptance length is 1 + (16 + 14) / (7 + 8) = 3.0, as the probe's counters give it (was: "-")."""
    from typer.testing import CliRunner

    from mtpscope.cli.main import app
    from mtpscope.traces.importers import import_server_log
    from mtpscope.traces.store.reader import open_trace

    src = tmp_path / "server.log"
    src.write_text("\n".join(LOGGED) + "\n")
    out = tmp_path / "imported"
    import_server_log(src, out)
    req = open_trace(out).requests
    t = R.request_table(req)
    assert list(t["n_drafts"]) == [7, 8]
    assert list(t["mean_acceptance_length"]) == pytest.approx([1 + 16 / 7, 1 + 14 / 8])
    tot = R.totals(req)
    assert tot.n_drafts == 15 and tot.mean_acceptance_length == pytest.approx(1 + 30 / 15)
    rep = CliRunner().invoke(app, ["report", str(out)])
    assert "mean acceptance length: 3.0000   (1 + accepted / drafts)" in rep.stdout, rep.stdout
    assert "drafts: 15   drafted: 44   accepted: 30" in rep.stdout and "verify rounds" not in rep.stdout
    ex = CliRunner().invoke(app, ["explain", str(out), "--by", "request"])
    assert "mean acceptance length 3.00," in ex.stdout, ex.stdout


def test_no_overall_mean_acceptance_length_when_a_requests_drafts_are_unknown() -> None:
    """Three log rows (a reviewer's case): 0 of 10 accepted (mean len 1.00 fits any drafts count), 30 of 40 at 4.00
    (10 drafts), 2000 of 3000 at 3.00 (1000 drafts, but 999 and 1001 print 3.00 too). A total over the one request
    whose drafts are known gave 4.0 beside 2030 accepted: the overall is not given unless every request's drafts
    are known; the rows keep their own. Also: a plain float64 frame (pandas' copy-on-write gives read-only views)
    is read without writing into it."""
    rows = pd.DataFrame({"kind": ["server-log"] * 3, "request": [0, 1, 2], "n_drafted": [10.0, 40.0, 3000.0],
                         "n_accepted": [0.0, 30.0, 2000.0], "mean_acceptance_length": [1.0, 4.0, 3.0],
                         "n_drafts": [np.nan] * 3})
    t = R.request_table(rows)
    assert [None if x is None or (isinstance(x, float) and np.isnan(x)) else int(x) for x in t["n_drafts"]] == \
        [None, 10, None]
    tot = R.totals(rows)
    assert tot.n_accepted == 2030 and tot.n_drafts is None and np.isnan(tot.mean_acceptance_length)
    # every request's drafts known (given for the first and last): 1 + 2030 / (10 + 10 + 1000)
    known = rows.assign(n_drafts=[10.0, np.nan, 1000.0])
    assert R.totals(known).n_drafts == 1020 and R.totals(known).mean_acceptance_length == pytest.approx(1 + 2030 / 1020)
    # a request that drafted nothing has no drafts to know
    idle = pd.DataFrame({"kind": ["server-log"] * 2, "request": [0, 1], "n_drafted": [0.0, 40.0],
                         "n_accepted": [0.0, 30.0], "mean_acceptance_length": [np.nan, 4.0], "n_drafts": [np.nan] * 2})
    assert R.totals(idle).n_drafts == 10 and R.totals(idle).mean_acceptance_length == pytest.approx(4.0)


def _probe_trace(d: Path) -> Path:
    """A probe trace written by hand: the two requests above as `mtpscope probe` records them (counter deltas: 7 and
    8 drafts), no rounds, and a manifest that records no model."""
    import pyarrow as pa

    from mtpscope.traces.store import schema as S
    from mtpscope.traces.store.writer import TraceWriter

    rows = [{"request": 0, "line": 1, "kind": "probe", "prompt": "j1", "prompt_id": 0, "category": "json",
             "n_drafted": 20, "n_accepted": 16, "acceptance_rate": 0.8, "n_drafts": 7,
             "mean_acceptance_length": 1 + 16 / 7, "accepted_per_pos": [6, 6, 4], "predicted_n": 24},
            {"request": 1, "line": 2, "kind": "probe", "prompt": "n1", "prompt_id": 1, "category": "numbers",
             "n_drafted": 24, "n_accepted": 14, "acceptance_rate": 14 / 24, "n_drafts": 8,
             "mean_acceptance_length": 1 + 14 / 8, "accepted_per_pos": [5, 5, 4], "predicted_n": 24}]
    with TraceWriter(d, {"source": "server-probe", "prompts": [{"prompt_id": 0, "prompt": "j1"},
                                                               {"prompt_id": 1, "prompt": "n1"}]},
                     n_embd_backbone=None, n_embd=None, hidden_dtype=None, centroids=False, compact=False) as w:
        w.write_tables(None, None, pa.Table.from_pylist(rows, schema=S.REQUESTS_SCHEMA))
    return d


def test_report_on_a_probe_names_the_drafts_it_divides_by(tmp_path) -> None:
    """A probe has no rounds: its mean acceptance length is 1 + accepted / drafts (docs/SERVER.md), (16 + 14) /
    (7 + 8) = 2 -> 3.0, and the label says so (was: "(1 + accepted / verify rounds)" beside "verify rounds 0")."""
    import json

    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    out = _probe_trace(tmp_path / "probe")
    rep = CliRunner().invoke(app, ["report", str(out)])
    assert rep.exit_code == 0, rep.output
    assert "mean acceptance length: 3.0000   (1 + accepted / drafts)" in rep.stdout, rep.stdout
    assert "requests: 2 (probe rows)   drafts: 15   drafted: 44   accepted: 30" in rep.stdout
    assert "verify rounds" not in rep.stdout
    doc = json.loads(CliRunner().invoke(app, ["report", str(out), "--json"]).stdout)
    assert doc["mean_acceptance_length"] == pytest.approx(3.0) and doc["requests"]["n_drafts"] == 15
    assert doc["mean_acceptance_length_formula"] == "1 + accepted / drafts"


def test_explain_on_a_probe_gives_its_acceptance_and_what_needs_rounds(tmp_path) -> None:
    """`explain` on a request trace: the acceptance `report` gives (30 / 44 = 0.6818, 1 + 30 / 15 = 3.0), one line on
    what needs rounds pointing at `--by request`; not "0 / 0 drafted", not "unreadable", and no claim that a
    recorded target GGUF moved (the manifest records none)."""
    import json

    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    out = _probe_trace(tmp_path / "probe")
    res = CliRunner().invoke(app, ["explain", str(out)])
    assert res.exit_code == 0, res.output
    assert "acceptance rate 0.6818 (30 / 44 drafted), mean acceptance length 3.0000 (1 + accepted / drafts; " \
           "15 drafts)" in res.stdout, res.stdout
    assert f"`mtpscope explain {out} --by request`" in res.stdout
    for wrong in ("0 / 0 drafted", "unreadable", "recorded path", "Why drafts were rejected"):
        assert wrong not in res.stdout, res.stdout
    doc = json.loads(CliRunner().invoke(app, ["explain", str(out), "--json"]).stdout)
    assert (doc["n_drafted"], doc["n_accepted"], doc["requests"]["n_drafts"]) == (44, 30, 15)
    assert doc["acceptance_rate"] == pytest.approx(30 / 44) and doc["mean_acceptance_length"] == pytest.approx(3.0)
    bad = CliRunner().invoke(app, ["explain", str(out), "--prompt", "0"])
    assert bad.exit_code == 2 and "--by request" in bad.stderr


def test_replay_settings_cut_a_path_with_an_ellipsis_and_compare_it_whole(tmp_path) -> None:
    """The settings table's server column (27 characters): a long path keeps its file name behind a visible "…"
    (was: cut to "/root/.cache/mtpscope/demo/", another real folder); two paths with the same file name in different
    folders are marked ≠ whether or not the files are here."""
    from mtpscope.cli.server import format_replay
    from mtpscope.traces.server.replay import ServerReplay, SettingRow, settings_table

    long = "/root/.cache/mtpscope/demo/trained/target.gguf"
    res = ServerReplay("p", "p/replay", pd.DataFrame(), (SettingRow("target model", long, long, True),), None)
    row = next(ln for ln in format_replay(res).splitlines() if "target model" in ln)
    assert "  …/demo/trained/target.gguf" in row and "/root/.cache/mtpscope/demo/ " not in row, row
    assert row.rstrip().endswith(long)                            # the recording's column keeps the whole path

    def target_same(server: Path, recording: Path) -> bool | None:
        rows = settings_table({"server": {"props": {"model_path": str(server)}}},
                              {"models": {"target": {"path": str(recording)}}})
        return next(r.same for r in rows if r.setting == "target model")

    a, b = tmp_path / "demo" / "target.gguf", tmp_path / "demo" / "trained" / "target.gguf"
    assert target_same(a, b) is False                  # neither file here: the full paths differ, not the names
    b.parent.mkdir(parents=True)
    b.write_bytes(b"x")
    assert target_same(a, b) is False                  # the server's is not here
    assert target_same(b, b) is True
    # a relative model_path (what llama-server's -m was given) of a file not here: unknown, not "differs"
    assert target_same(Path("models/target.gguf"), b) is None
