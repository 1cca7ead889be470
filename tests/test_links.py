"""Deep links (app/links.py) and the pure helpers of the pages they open: built, parsed and refused without
Streamlit; URLs written out by hand (RFC 3986 percent-encoding), rounds and prompts counted by hand."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from mtpscope.app import links
from mtpscope.app.links import View, check_in_trace, check_step, parse_url, parse_view, view_url
from mtpscope.errors import LinkError


def test_view_url_is_the_page_and_its_parameters_in_order() -> None:
    assert view_url("step", trace="/data/traces/f32", prompt=34, round=20) == \
        "/step?trace=%2Fdata%2Ftraces%2Ff32&prompt=34&round=20"
    # the order of PARAMS, whatever the order of the arguments; base joined with one slash
    assert view_url("step", step=2, round=20, prompt=34, base="http://127.0.0.1:8501/") == \
        "http://127.0.0.1:8501/step?prompt=34&round=20&step=2"
    assert view_url("explain", prompt="all") == "/explain?prompt=all"
    assert view_url("files") == "/files"
    assert view_url("start", trace="/t", trace_b="/u") == "/?trace=%2Ft&trace_b=%2Fu"  # the start page is the root
    assert view_url("compare", trace="/a b/t", trace_b="/x&y", mode="traces") == \
        "/compare?trace=%2Fa+b%2Ft&trace_b=%2Fx%26y&mode=traces"


@pytest.mark.parametrize("url, view", [
    ("/step?prompt=34&round=20", View("step", prompt=34, round=20)),
    ("http://host:8501/step?round=0&step=3", View("step", round=0, step=3)),
    ("/acceptance?prompt=all&window=64", View("acceptance", prompt="all", window=64)),
    ("/text?prompt=1&colour=class", View("text", prompt=1, colour="class")),
    ("/compare?mode=prompts&prompt=2&prompt_b=5", View("compare", mode="prompts", prompt=2, prompt_b=5)),
    ("/values?drafter=%2Fm%2Fd.gguf&tensor=blk.0.ffn_up.weight",
     View("values", drafter="/m/d.gguf", tensor="blk.0.ffn_up.weight")),
    ("/", View("start")),
    ("/step?prompt=34&embed=true", View("step", prompt=34)),  # Streamlit's own parameter is not the view's
    ("/step?prompt=3&prompt=3", View("step", prompt=3)),      # repeated with one value: counts once
])
def test_parse_url(url: str, view: View) -> None:
    assert parse_url(url) == view


def test_a_built_link_parses_back_to_its_view() -> None:
    for v in (View("step", trace="/t/f32", prompt=34, round=20, step=2), View("explain", trace="/t", prompt="all"),
              View("compare", trace="/a", trace_b="/b", mode="traces"), View("text", prompt=0, round=0, colour="status")):
        url = view_url(v.page, **v.params(), base="http://127.0.0.1:1")
        assert parse_url(url) == links.make_view(v.page, **v.params()) == v
        assert v.url() == url.removeprefix("http://127.0.0.1:1")


@pytest.mark.parametrize("url, name, value, allowed", [
    ("/step?prompt=abc", "prompt", "'abc'", "a prompt id (an integer >= 0)"),
    ("/step?round=-1", "round", "'-1'", "an integer >= 0"),
    ("/step?round=1.5", "round", "'1.5'", "an integer >= 0"),
    ("/step?step=0", "step", "'0'", "an integer >= 1"),
    ("/step?prompt=all", "prompt", "'all'", "a prompt id (an integer >= 0)"),  # Step shows one prompt
    ("/acceptance?round=3", "round", "'3'", "one of trace, trace_b, drafter, target, prompt, window"),
    ("/step?rund=3", "rund", "'3'", "one of trace, trace_b"),
    ("/text?colour=red", "colour", "'red'", "one of status, class"),
    ("/step?prompt=1&prompt=2", "prompt", "'1, 2'", "one value"),
    ("/step?trace=", "trace", "''", "a path under the app's allowed folders"),
    ("/stepp?prompt=1", "page", "'stepp'", "one of start, files, tensors"),
])
def test_a_bad_link_is_refused_in_one_line_naming_parameter_value_and_allowed(url, name, value, allowed) -> None:
    with pytest.raises(LinkError) as e:
        parse_url(url)
    line = e.value.one_line()
    assert "\n" not in line and line.startswith(f"{name!r}:"), line
    assert f"got {value})" in line and f"(expected {allowed}" in line, line


def test_view_url_refuses_what_the_app_would_refuse() -> None:
    with pytest.raises(LinkError, match="'round'"):
        view_url("explain", round=3)
    with pytest.raises(LinkError, match="'step'"):
        view_url("step", step=0)
    with pytest.raises(LinkError, match="'prompt'"):
        view_url("text", prompt=True)  # a bool is not a prompt id


def test_other_pages_parameters_can_be_ignored() -> None:
    # the app's own address bar: Back can pair /acceptance with the Text page's parameters
    assert parse_view("acceptance", {"prompt": "34", "round": "20", "colour": "status"}, other_pages="ignore") == \
        View("acceptance", prompt=34)
    with pytest.raises(LinkError, match="'rund'"):  # an unknown parameter is still refused
        parse_view("acceptance", {"rund": "2"}, other_pages="ignore")


def test_check_in_trace_names_what_the_trace_has() -> None:
    spans = dict.fromkeys(range(36), (0, 57))
    check_in_trace(View("step", prompt=3, round=57), spans)
    check_in_trace(View("acceptance", prompt="all"), spans)
    with pytest.raises(LinkError) as e:
        check_in_trace(View("step", prompt=3, round=999999), spans)
    assert e.value.one_line() == "'round': no such round of prompt 3 (expected a round 0–57, got 999999)"
    with pytest.raises(LinkError) as e:
        check_in_trace(View("step", prompt=36), spans)
    assert e.value.one_line() == "'prompt': no such prompt in this trace (expected a prompt 0–35, got 36)"
    with pytest.raises(LinkError) as e:  # ids with gaps are listed
        check_in_trace(View("explain", prompt=1), {0: (0, 3), 2: (0, 5)})
    assert "(expected one of 0, 2, got 1)" in e.value.one_line()
    # a round without its prompt belongs to the prompt the page shows
    check_in_trace(View("step", round=5), {7: (0, 9)}, current_prompt=7)
    with pytest.raises(LinkError, match="no such round of prompt 7"):
        check_in_trace(View("step", round=10), {7: (0, 9)}, current_prompt=7)
    with pytest.raises(LinkError, match="'prompt_b'"):
        check_in_trace(View("compare", prompt_b=9), {0: (0, 1)})


def test_check_step_and_offered_values() -> None:
    check_step(View("step", step=3), 3, "prompt 0, round 2")
    with pytest.raises(LinkError) as e:
        check_step(View("step", step=4), 3, "prompt 0, round 2")
    assert e.value.one_line() == "'step': no such draft step in prompt 0, round 2 (expected a step 1–3, got 4)"
    with pytest.raises(LinkError, match="it drafted nothing"):
        check_step(View("step", step=1), 0, "prompt 0, round 1")
    links.check_offered(View("acceptance", window=64), "window", (8, 64))
    with pytest.raises(LinkError, match=r"\(expected one of 8, 64, got 50\)"):
        links.check_offered(View("acceptance", window=50), "window", (8, 64))


def test_links_import_without_streamlit_pandas_or_numpy() -> None:
    code = ("import sys, mtpscope.app.links as l; l.view_url('step', prompt=1);"
            "bad = [m for m in ('streamlit', 'pandas', 'numpy', 'plotly') if m in sys.modules];"
            "sys.exit(str(bad) if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr + r.stdout


# ----------------------------------------------------------------------- the pages' pure helpers

def _rounds(rows: list[tuple[int, int, int, int]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["prompt_id", "round", "n_draft", "n_accepted"])


def test_prompt_round_spans_and_worst_round() -> None:
    from mtpscope.app.round_views import prompt_round_spans, worst_round

    r = _rounds([
        (0, 0, 3, 3), (0, 1, 3, 0), (0, 2, 3, 1), (0, 3, 3, 0), (0, 4, 3, 0), (0, 5, 0, 0),
        (1, 0, 3, 0), (1, 1, 2, 0), (1, 2, 3, 0), (1, 3, 3, 0), (1, 4, 3, 2),
    ])
    assert prompt_round_spans(r) == {0: (0, 5), 1: (0, 4)}
    # most drafts lost = 3: prompt 0 rounds 1, 3, 4 and prompt 1 rounds 0, 2, 3. The zero-acceptance runs
    # they open: (0,1) 1 round, (0,3) 2 rounds (round 5 drafted nothing: not part of it), (1,0) 4 rounds
    # (the 2-draft round 1 accepted nothing too), (1,2) / (1,3) do not start one.
    assert worst_round(r) == (1, 0)
    assert worst_round(r, prompt_id=0) == (0, 3)
    assert worst_round(_rounds([(0, 0, 3, 3), (0, 1, 0, 0)])) is None  # nothing lost
    assert worst_round(r, prompt_id=9) is None


def test_compact_number_fits_a_metric_box() -> None:
    from mtpscope.app.model_views import compact_number

    # the values page's mean of nextn.post_projection.weight printed "-0.000…" in its metric box
    assert compact_number(-0.0005663) == "-5.66e-4"
    assert compact_number(0.03289) == "0.0329" and compact_number(-0.1281) == "-0.128"
    assert compact_number(-0.0) == "0" and compact_number(1.0) == "1"
    assert compact_number(7.5e29) == "7.50e+29" and compact_number(99999.0) == "1.00e+5"
    for v in (-0.0005663, -2.5e-5, 123456.7, -0.00999, 1e-300):
        assert len(compact_number(v)) <= 9
        assert float(compact_number(v)) == pytest.approx(v, rel=5e-3)


def test_prompt_delta_figure_one_row_per_prompt() -> None:
    from mtpscope.app import charts

    n = 36
    d = pd.DataFrame({"prompt_id": range(n), "delta_rate": [-(i % 7) / 10 for i in range(n)]})
    labels = {i: f"prompt {i} “{'long prompt text ' * 6}”" for i in range(n)}
    fig = charts.prompt_delta_figure(d, labels=labels)
    bar = fig.data[0]
    assert bar.orientation == "h" and len(bar.y) == n == len(set(bar.y))  # one labelled row per prompt
    assert all(len(t) <= charts.DELTA_LABEL_CHARS for t in bar.y)
    assert fig.layout.height >= n * charts.DELTA_ROW_PX  # each label has its own row: no overlap
    assert bar.customdata[0].startswith("prompt 0 “long prompt text")  # the whole label on hover


def test_explained_differences_puts_what_verify_flags_first() -> None:
    from mtpscope.app.model_views import explained_differences
    from mtpscope.inspector.findings import Report, finding
    from mtpscope.traces.analysis.run_diff import DifferenceRow

    rows = [DifferenceRow("parameter", "centroid_top_k", "32", "—"),
            DifferenceRow("drafter metadata", "gemma4-assistant.rope.freq_base_swa", "10000.0", "1000000.0"),
            DifferenceRow("centroids file", "only one run has this model", "/x", "—")]
    f = finding("error", "E_PAIR_ROPE", "gemma4-assistant.rope.freq_base_swa", 10000.0, 1000000.0,
                "rope.freq_base_swa: drafter 1000000.0, target 10000.0")
    rep = Report(dialect="upstream", ok=False, findings=(f,), loadability=(), pairing=None)
    out = explained_differences(rows, {"A": None, "B": rep})
    assert [r.row.name for r in out] == ["gemma4-assistant.rope.freq_base_swa", "centroid_top_k",
                                         "only one run has this model"]
    assert out[0].verify.startswith("B: ✗ E_PAIR_ROPE — rope.freq_base_swa")
    assert out[1].verify == out[2].verify == ""
    assert list(out[0].to_dict()) == ["what", "name", "A", "B", "verify"]
