"""AppTest for the debugging walk (issue 14): from a number to a reason.

A hand-built trace (every value below written by hand) drives the Step view's verdict sentence, the
target bar past the stored top candidates, "not checked" steps, a round that drafted nothing, the
previous / next rejected round buttons, replay results in the step and the generated-text view; the
demo traces check that the Explain and Compare pages show the numbers `mtpscope explain --json` and
`mtpscope compare --json` print, and that selection stays consistent (trace -> its models, trace B is
never trace A, a target refused as the drafter).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest

from mtpscope.app import selection
from mtpscope.cli.serve import main_script

MAIN = str(main_script())
TIMEOUT = 120

# prompt 0 ("Hello there"), no vocabulary: ids show as #id.
#   round 0: pending 10, drafts 11 12 13, target 11 20 21 22 -> k=1 accepted, k=2 rejected (the target's 20 is
#            the drafter's runner-up: logits 4.00 vs 2.75, gap 1.25), k=3 not checked; entropy 0.20 nats
#   round 1: drafted nothing (the target decoded 30 alone)
#   round 2: pending 30, drafts 31 32, target 40 ...  -> k=1 rejected, the target's 40 at rank 13 (past the
#            stored top 10), k=2 not checked
#   round 3: pending 40, drafts 41 42, target 41 42 43 -> all accepted, bonus 43
TOP10 = [31, 50, 51, 52, 53, 54, 55, 56, 57, 58]


def _hand_trace(d: Path) -> Path:
    from mtpscope.traces import RoundRecord, StepRecord, TraceWriter

    man = {"source": "synthetic", "prompts": [{"prompt_id": 0, "text": "Hello there", "n_prompt_tokens": 2}],
           "params": {"n_draft": 3, "temp": 0.0}}
    with TraceWriter(d, man, n_embd_backbone=None, n_embd=None, hidden_dtype=None, centroids=False) as w:
        w.add_round(RoundRecord(prompt_id=0, round=0, pos=2, pending_token=10, n_draft=3, drafted=(11, 12, 13),
                                n_accepted=1, target=(11, 20, 21, 22), emitted=(11, 20), t_draft_ms=3.0,
                                t_verify_ms=9.0),
                    [StepRecord(k=1, token=11, logit=5.0, rank=0, top_ids=(11, 20), top_logits=(5.0, 1.0),
                                target_token=11, target_rank=0, accepted=True, target_p_drafted=0.9,
                                target_entropy=0.3),
                     StepRecord(k=2, token=12, logit=4.0, rank=0, top_ids=(12, 20), top_logits=(4.0, 2.75),
                                target_token=20, target_rank=1, accepted=False, target_p_drafted=0.01,
                                target_entropy=0.2),
                     StepRecord(k=3, token=13, logit=3.0, rank=0, top_ids=(13, 21), top_logits=(3.0, 2.0),
                                target_token=21, target_rank=1, accepted=False)])
        w.add_round(RoundRecord(prompt_id=0, round=1, pos=4, pending_token=20, n_draft=0, drafted=(), n_accepted=0,
                                target=(30,), emitted=(30,), t_draft_ms=0.0, t_verify_ms=8.0), [])
        w.add_round(RoundRecord(prompt_id=0, round=2, pos=5, pending_token=30, n_draft=2, drafted=(31, 32),
                                n_accepted=0, target=(40, 44, 45), emitted=(40,), t_draft_ms=2.0, t_verify_ms=9.0),
                    [StepRecord(k=1, token=31, logit=6.0, rank=0, top_ids=tuple(TOP10),
                                top_logits=tuple(6.0 - 0.5 * i for i in range(10)), target_token=40, target_rank=13,
                                accepted=False, target_p_drafted=0.02, target_entropy=2.5),
                     StepRecord(k=2, token=32, logit=5.0, rank=0, top_ids=(32,), top_logits=(5.0,), target_token=44,
                                target_rank=3, accepted=False)])
        w.add_round(RoundRecord(prompt_id=0, round=3, pos=6, pending_token=40, n_draft=2, drafted=(41, 42),
                                n_accepted=2, target=(41, 42, 43), emitted=(41, 42, 43), t_draft_ms=2.0,
                                t_verify_ms=9.0),
                    [StepRecord(k=1, token=41, logit=5.0, rank=0, top_ids=(41,), top_logits=(5.0,), target_token=41,
                                target_rank=0, accepted=True),
                     StepRecord(k=2, token=42, logit=5.0, rank=0, top_ids=(42,), top_logits=(5.0,), target_token=42,
                                target_rank=0, accepted=True)])
    return d


@pytest.fixture
def hand(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("MTPSCOPE_ROOTS", str(tmp_path))
    monkeypatch.setenv("MTPSCOPE_CACHE", str(tmp_path / "cache"))  # no demo: ids show as #id
    return _hand_trace(tmp_path / "trace")


def _step(trace: Path, sel: tuple[int, int], **more) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    for k in ("drafter", "target", "trace_b", "checkpoint", "replay"):
        at.session_state[selection.slot_key(k)] = None
    at.session_state[selection.slot_key(selection.TRACE)] = str(trace)
    for k, v in more.items():
        at.session_state[selection.slot_key(k)] = str(v)
    at.session_state[selection.SEL_ROUND] = sel
    at.run()
    at.switch_page("screens/step.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _arr(v):
    """A plotly JSON array (list, or typed array ``{"dtype", "bdata", "shape"}``) as a numpy array."""
    import base64

    import numpy as np

    if isinstance(v, dict) and "bdata" in v:
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        return a.reshape([int(x) for x in str(v["shape"]).split(",")]) if "shape" in v else a
    return np.asarray(v)


def _charts(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def test_step_verdict_for_a_known_rejected_step(hand: Path) -> None:
    at = _step(hand, (0, 0))
    verdict = [w.value for w in at.warning]
    assert verdict == [
        "Rejected at k=2: drafted #12 (logit 4.00); the target's #20 was the drafter's runner-up, 1.25 logits "
        "behind; the target was sure (entropy 0.20 nats, p(drafted) 0.01); k=3 was not checked"], verdict
    df = next(d.value for d in at.dataframe if "verdict" in d.value.columns)
    assert list(df["verdict"]) == ["✓ accepted", "✗ rejected", "– not checked"]
    assert list(df["target"]) == ["#11", "#20", "—"]  # the target never judged k=3: its token is not shown


def test_target_bar_present_past_the_stored_top_ten(hand: Path) -> None:
    at = _step(hand, (0, 2))
    assert any("Rejected at k=1" in w.value and "rank 13" in w.value and "far down" in w.value
               for w in at.warning), [w.value for w in at.warning]
    top = [c for c in _charts(at) if c["layout"]["title"]["text"].startswith("k=1")][0]
    bar = top["data"][0]
    assert bar["y"][-1] == "13. #40"  # the target's token, with its rank, after the stored ten
    assert len(bar["y"]) == 11 and bar["marker"]["color"][-1] == "#2ca02c"
    assert bar["marker"]["pattern"]["shape"][-1] == "/"
    k2 = [c for c in _charts(at) if c["layout"]["title"]["text"].startswith("k=2")][0]
    assert k2["layout"]["title"]["text"] == "k=2 · not checked" and "#2ca02c" not in k2["data"][0]["marker"]["color"]


def test_a_malformed_cost_probe_is_said_and_the_round_still_shown(hand: Path) -> None:
    """A manifest whose optional ``cost_probe`` is malformed: the Step page says so in one line naming the key and
    still shows the round's draft steps (before: the error, and nothing of the round after it)."""
    m = json.loads((hand / "manifest.json").read_text())
    m["cost_probe"] = {"verify_ms": "x"}
    (hand / "manifest.json").write_text(json.dumps(m))
    at = _step(hand, (0, 0))
    assert [e.value for e in at.error] == [
        f"{hand / 'manifest.json'}: 'cost_probe.verify_ms': malformed cost probe entry (expected an object of sizes "
        "to ms, at least one size, got 'x')"]
    assert any("verdict" in d.value.columns for d in at.dataframe)


def test_zero_draft_round_says_so(hand: Path) -> None:
    at = _step(hand, (0, 1))
    infos = [i.value for i in at.info]
    assert any("drafted nothing" in i for i in infos), infos
    assert not any("per-step records" in i for i in infos)
    assert not at.dataframe or all("verdict" not in d.value.columns for d in at.dataframe)


def test_previous_and_next_rejected_round(hand: Path) -> None:
    at = _step(hand, (0, 1))
    at.button(key=selection.STEP_NEXT).click().run()
    assert at.session_state[selection.SEL_ROUND] == (0, 2) and at.number_input(key=selection.STEP_ROUND).value == 2
    at.button(key=selection.STEP_PREV).click().run()
    assert at.session_state[selection.SEL_ROUND] == (0, 0)
    assert at.button(key=selection.STEP_PREV).disabled


def test_replay_results_in_the_step(hand: Path, tmp_path: Path) -> None:
    import pandas as pd

    out = tmp_path / "replay"
    out.mkdir()
    (out / "summary.json").write_text(json.dumps({
        "trace": str(hand), "n_rounds": 4, "n_steps": 7, "recorded": {"acceptance_rate": 0.4},
        "variants": {"baseline": {"options": "-"}, "head=centroid": {"options": "head=centroid"}}}))
    pd.DataFrame({"prompt_id": [0, 0, 0], "round": [0, 0, 0], "k": [1, 2, 3], "recorded": [11, 12, 13],
                  "truth": [11, 20, 30], "draft[baseline]": [11, 12, 13], "draft[head=centroid]": [11, 20, 13]}
                 ).to_parquet(out / "steps.parquet")
    at = _step(hand, (0, 0), replay=out)
    t = next(d.value for d in at.dataframe if "would_draft_target" in d.value.columns)
    assert list(t["would_draft_target"]) == ["baseline, head=centroid", "head=centroid", "none"]


def test_text_view_colours_every_token_by_what_produced_it(hand: Path) -> None:
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.session_state[selection.slot_key(selection.TRACE)] = str(hand)
    at.run()
    at.switch_page("screens/text.py").run()
    assert not at.exception, [e.value for e in at.exception]
    fig = next(c for c in _charts(at) if (c["layout"].get("meta") or {}).get("colour_by") == "status")
    got = {}
    for tr in fig["data"]:
        for text, cd in zip(tr["text"], _arr(tr["customdata"])):
            got[int(cd[1])] = (text, tr["name"], int(cd[0]))
    words = {"accepted": "accepted draft", "rejected": "target's correction at a first rejection",
             "bonus": "target's bonus token (every draft accepted)", "decode": "target alone (the round drafted nothing)",
             "prefill": "the prefill's first token"}
    want = [("#10", "prefill", 0), ("#11", "accepted", 0), ("#20", "rejected", 0), ("#30", "decode", 1),
            ("#40", "rejected", 2), ("#41", "accepted", 3), ("#42", "accepted", 3), ("#43", "bonus", 3)]
    assert [got[g] for g in range(8)] == [(t, words[s], r) for t, s, r in want]
    # the caption counts every token it says there are: 3 + 2 + 1 + 1 + the prefill's 1 = 8 (before: the grey one
    # left out, "8 tokens" beside counts summing to 7)
    cap = next(c.value for c in at.caption if c.value.startswith("The target's output"))
    assert cap.startswith("The target's output for this prompt, 8 tokens: green tokens were accepted drafts (3), red "
                          "ones the target's correction where it rejected a draft (2), blue its bonus token after a "
                          "fully accepted round (1), yellow decoded by the target alone in a round that drafted "
                          "nothing (1), grey the target's first token, from the prompt's prefill (1). "), cap
    assert at.selectbox(key=selection.TEXT_PROMPT).options == ["prompt 0 “Hello there”"]
    assert not at.button(key=selection.TEXT_NEXT).disabled


# ------------------------------------------------------------------------------ the demo traces

def _need(demo_dir, *names: str) -> list[Path]:
    paths = [Path(getattr(demo_dir, n)) for n in names]
    if not all((p / "manifest.json").exists() for p in paths):
        pytest.skip("demo traces not built (llama-cpp-python missing)")
    return paths


def _run(page: str | None = None, **sel) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    for k, v in sel.items():
        at.session_state[selection.slot_key(k)] = None if v is None else str(v)
    at.run()  # the start page (/)
    at.switch_page(f"screens/{page or 'files'}.py").run()  # no page: the Files page
    assert not at.exception, [e.value for e in at.exception]
    return at


def _metric(at: AppTest, label: str) -> str:
    vals = [m.value for m in at.metric if m.label == label]
    assert vals, f"no metric {label!r} in {[m.label for m in at.metric]}"
    return vals[0]


def _cli_json(*args: str) -> dict:
    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    r = CliRunner().invoke(app, list(args))
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.stdout)


def test_explain_page_numbers_equal_the_cli(demo_dir) -> None:
    (noisy,) = _need(demo_dir, "traces_noisy")
    cli = _cli_json("explain", str(noisy), "--json")
    at = _run("explain", trace=noisy)
    rej = cli["rejections"]
    assert _metric(at, "acceptance rate") == f"{100 * cli['acceptance_rate']:.1f} %"    # (the other pages' form)
    assert _metric(at, "rounds with a rejection") == f"{rej['n_rounds_rejected']:,}"
    assert _metric(at, "of them, target known") == f"{rej['n_first_mismatch']:,}"
    rec = cli["recommendation"]
    # (a demo recorded on a busy machine has its advice withheld: the timing-quality check, docs/EXPLAIN.md §4)
    none = "cannot tell (timings disturbed)" if rec.get("cannot_tell") else "too few rounds"
    want = (none if rec["choice"] is None else "plain decoding" if rec["choice"] == "plain"
            else f"n_draft {rec['choice']}") + ((" (a tie with plain decoding)" if rec["runner_up"] == "plain" else
                                                      f" (a tie with n_draft {rec['runner_up']})") if rec["tie"] else "")
    assert _metric(at, "recommendation") == want
    figs = _charts(at)
    causes = next(f for f in figs if (f["layout"].get("meta") or {}).get("counts") is not None)
    assert causes["layout"]["meta"]["counts"] == {c: v for c, v in rej["causes"].items() if v}
    wi = next(d.value for d in at.dataframe if "tokens/s" in d.value.columns)
    assert list(wi["n_draft"]) == [r["n_draft"] for r in cli["what_if"]]
    assert list(wi["acceptance rate"]) == pytest.approx([r["acceptance_rate"] for r in cli["what_if"]])
    assert list(wi["tokens/s"]) == pytest.approx([r["tokens_per_s"] for r in cli["what_if"]])
    if cli.get("by_class"):
        bars = next(f for f in figs if f["layout"]["title"]["text"] == "Acceptance rate by token class")
        assert dict(zip(bars["data"][0]["x"], bars["data"][0]["y"])) == pytest.approx(
            {c: g["acceptance_rate"] for c, g in cli["by_class"].items() if g["n_drafted"]})
    # one prompt, as `explain --prompt 3`
    one = _cli_json("explain", str(noisy), "--json", "--prompt", "3")
    at.selectbox(key=selection.EXP_PROMPT).set_value(3).run()
    assert _metric(at, "rounds with a rejection") == f"{one['rejections']['n_rounds_rejected']:,}"


def test_compare_page_aligned_numbers_equal_the_cli(demo_dir) -> None:
    clean, noisy = _need(demo_dir, "traces_clean", "traces_noisy")
    cli = _cli_json("compare", str(clean), str(noisy), "--json")
    at = _run("compare", trace=clean, trace_b=noisy)
    assert _metric(at, "accepted in A, rejected in B") == f"{cli['a_only']['n']:,}"
    assert _metric(at, "accepted in B, rejected in A") == f"{cli['b_only']['n']:,}"
    # in points as the rates beside it (a minus sign, U+2212); over the paired prompts' rounds, as the CLI's delta
    d = 100 * cli["delta"]["all"]["delta"]
    want = f"{'−' if round(d, 1) < 0 else '+' if round(d, 1) > 0 else ''}{abs(d):.1f} points"
    assert _metric(at, "acceptance-rate delta (B − A) over the paired prompts") == want
    rows = next(d.value for d in at.dataframe if "positions compared" in d.value.columns)
    assert list(rows["positions compared"]) == [p["n_compared"] for p in cli["prompts"]]


def test_compare_warns_when_a_is_b_and_b_defaults_elsewhere(demo_dir) -> None:
    clean, noisy = _need(demo_dir, "traces_clean", "traces_noisy")
    at = _run("compare", trace=clean, trace_b=clean)
    assert any("same folder" in w.value for w in at.warning), [w.value for w in at.warning]
    assert not any(m.label.startswith("accepted in A") for m in at.metric)
    # a session that starts on the noisy trace: trace B's default is not the noisy trace again
    at = _run("compare", trace=noisy)
    b = at.session_state[selection.slot_key(selection.TRACE_B)]
    assert b and Path(b).resolve() != noisy.resolve()


def test_choosing_a_trace_selects_its_models_and_shows_its_parameters(demo_dir) -> None:
    (noisy,) = _need(demo_dir, "traces_noisy")
    man = json.loads((noisy / "manifest.json").read_text())
    at = _run(None, drafter=demo_dir.drafter_fork, target=None, trace=None)
    at.selectbox(key=selection.picker_keys(selection.TRACE)[0]).set_value(str(noisy.resolve())).run()
    assert not at.exception
    assert Path(at.session_state[selection.slot_key(selection.DRAFTER)]) == Path(man["models"]["assistant"]["path"])
    assert Path(at.session_state[selection.slot_key(selection.TARGET)]) == Path(man["models"]["target"]["path"])
    text = " ".join(m.value for m in at.markdown)
    p = man["params"]
    assert f"n_draft: {p['n_draft']}" in text and f"temperature: {p['temp']}" in text
    assert f"hidden states: {man['dims']['hidden_dtype']}" in text and man["runtime"]["device"] in text
    assert any("Selected the models that recorded this trace" in c.value for c in at.caption)


def test_drafter_picker_lists_drafters_and_refuses_a_target(demo_dir) -> None:
    at = _run(None, drafter=demo_dir.drafter_fork, target=None, trace=None)
    pick, text, _ = selection.picker_keys(selection.DRAFTER)
    opts = at.selectbox(key=pick).options
    assert not any(o.endswith("target.gguf") for o in opts) and any(o.endswith("drafter-fork.gguf") for o in opts)
    at.text_input(key=text).set_value(str(demo_dir.target)).run()
    errs = [e.value for e in at.error]
    assert any("is a target model" in e and "'gemma4'" in e for e in errs), errs
    # the selection did not move
    assert at.session_state[selection.slot_key(selection.DRAFTER)] == str(demo_dir.drafter_fork)
    at.button(key=selection.FILES_AS_TARGET).click().run()
    assert at.session_state[selection.slot_key(selection.TARGET)] == str(demo_dir.target)


def test_acceptance_page_says_what_the_cli_says(demo_dir) -> None:
    from typer.testing import CliRunner

    from mtpscope.cli.main import app
    from mtpscope.traces.analysis import metrics

    (noisy,) = _need(demo_dir, "traces_noisy")
    out = CliRunner().invoke(app, ["report", str(noisy)]).stdout
    streak_line = next(ln for ln in out.splitlines() if ln.startswith("zero-acceptance streaks"))
    at = _run("acceptance", trace=noisy)
    assert streak_line in [m.value for m in at.markdown]
    assert at.select_slider(key=selection.ACC_ROLL).value == metrics.DEFAULT_ROLLING_WINDOW
    rep = _cli_json("report", str(noisy), "--json")
    assert rep["rolling"]["window"] == metrics.DEFAULT_ROLLING_WINDOW
    man = json.loads((noisy / "manifest.json").read_text())
    first = man["prompts"][0]
    assert f"prompt {first['prompt_id']} “{first['text']}”" in at.selectbox(key=selection.ACC_PROMPT).options
    # the timeline's prompt boundaries are labelled with the prompts
    tl = next(c for c in _charts(at) if (c["layout"].get("meta") or {}).get("mode") == "marks")
    assert [a["text"] for a in tl["layout"]["annotations"]][:1] == [f"prompt {first['prompt_id']} “{first['text']}”"]


def test_step_view_shows_the_drift_when_the_target_state_is_stored(tmp_path: Path, monkeypatch) -> None:
    import numpy as np

    from mtpscope.traces import RoundRecord, StepRecord, TraceWriter

    monkeypatch.setenv("MTPSCOPE_ROOTS", str(tmp_path))
    monkeypatch.setenv("MTPSCOPE_CACHE", str(tmp_path / "cache"))
    e = np.eye(4, dtype=np.float32)
    # k=1: h_next e0 vs the target's e0 + e1 -> cosine 1/sqrt(2), relative error |−e1| / |e0 + e1| = 1/sqrt(2)
    # k=2: h_next 2·e1 vs the target's e1 -> cosine 1, relative error |e1| / |e1| = 1
    d = tmp_path / "drift"
    man = {"source": "synthetic", "prompts": [{"prompt_id": 0, "text": "x"}]}
    with TraceWriter(d, man, n_embd_backbone=4, n_embd=4, hidden_dtype="f32", centroids=False, h_target=True) as w:
        w.add_round(RoundRecord(prompt_id=0, round=0, pos=1, pending_token=1, n_draft=2, drafted=(2, 3), n_accepted=1,
                                target=(2, 4, 5), emitted=(2, 4)),
                    [StepRecord(k=1, token=2, logit=1.0, rank=0, top_ids=(2,), top_logits=(1.0,), target_token=2,
                                target_rank=0, accepted=True, h=e[3], h_next=e[0], h_inner=e[2], h_target=e[0] + e[1]),
                     StepRecord(k=2, token=3, logit=1.0, rank=0, top_ids=(3,), top_logits=(1.0,), target_token=4,
                                target_rank=5, accepted=False, h=e[0], h_next=2 * e[1], h_inner=e[2], h_target=e[1])])
    at = _step(d, (0, 0))
    fig = next(c for c in _charts(at) if "drafter's state against" in c["layout"]["title"]["text"])
    assert list(_arr(fig["data"][0]["y"])) == pytest.approx([2 ** -0.5, 1.0], rel=1e-6)
    assert list(_arr(fig["data"][1]["y"])) == pytest.approx([2 ** -0.5, 1.0], rel=1e-6)
