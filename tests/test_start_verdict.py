"""The start page's verdict (``mtpscope.app.verdict``), pure: every number below is worked by hand from the
counts given, never read from the function's own output."""

from __future__ import annotations

import pytest

from mtpscope.app.verdict import PromptCounts, TraceFacts, advice_line, pct, start_verdict, worst
from mtpscope.app.views import recommendation_label
from mtpscope.traces.analysis.advice import Recommendation

# category "code": prompts 0 (3/10) and 1 (5/10) -> pooled 8/20 = 40 %
# category "prose": prompts 2 (1/10) and 3 (9/10) -> pooled 10/20 = 50 %; prompt 2 is the worst prompt overall
# prompt 4 drafted nothing (left out)
PROMPTS = (PromptCounts(0, "code", 10, 3), PromptCounts(1, "code", 10, 5), PromptCounts(2, "prose", 10, 1),
           PromptCounts(3, "prose", 10, 9), PromptCounts(4, "prose", 0, 0))


def test_worst_category_is_pooled_and_its_worst_prompt_is_inside_it() -> None:
    w = worst(PROMPTS)
    # "code" pools 8/20 = 0.40 < "prose" 10/20 = 0.50, although prompt 2 (0.10) is the worst of all
    assert (w.category, w.prompt_id) == ("code", 0)
    assert w.category_rate == pytest.approx(0.40)
    assert w.prompt_rate == pytest.approx(0.30)


def test_worst_without_categories_is_the_worst_prompt_and_ties_go_to_the_lower_id() -> None:
    rows = (PromptCounts(7, None, 4, 1), PromptCounts(3, None, 8, 2), PromptCounts(9, None, 0, 0))
    w = worst(rows)  # 1/4 = 2/8 = 0.25: a tie, prompt 3 first
    assert (w.category, w.prompt_id, w.prompt_rate) == (None, 3, 0.25)
    assert worst(()).prompt_id is None


def test_a_drafter_failing_verify_is_the_defect_and_b_is_compared_in_points() -> None:
    a = TraceFacts("trace A", "/d/f32", "trained/traces/f32", "trained/drafter.gguf", 0.348, PROMPTS, True)
    b = TraceFacts("trace B", "/d/buggy", "trained/traces/buggy", "trained/drafter-buggy.gguf", 0.210, (), False,
                   "E_PAIR_ROPE rope.freq_base_swa: drafter 1000000.0, target 10000.0")
    v = start_verdict([a, b])
    assert v.defect is True and v.suspect == "/d/buggy"
    assert v.sentence == ("Defect found: trace B's drafter `trained/drafter-buggy.gguf` fails verify — "
                          "E_PAIR_ROPE rope.freq_base_swa: drafter 1000000.0, target 10000.0.")
    # 21.0 - 34.8 = -13.8 points
    assert v.acceptance == ("Acceptance rate 34.8 % on trace A (`trained/traces/f32`) against 21.0 % on trace B "
                            "(`trained/traces/buggy`): B −13.8 points.")
    assert v.advice is None  # no recommendation given
    assert v.checked == "verify of the drafter of trace A and trace B; no saved diagnosis (Diagnose runs one)"
    assert v.worst["/d/f32"].prompt_id == 0


def test_a_saved_diagnosis_wins_over_verify() -> None:
    a = TraceFacts("trace A", "/a", "a", verify_ok=False, verify_error="E_X k: bad", diagnosis_defect=True,
                   diagnosis_headline="rope.freq_base_swa is 1e6 (expected 1e4)")
    v = start_verdict([a])
    assert v.sentence == "Defect found in trace A (`a`) by its saved diagnosis: rope.freq_base_swa is 1e6 (expected 1e4)."


def test_no_defect_names_the_checks_and_the_advice_says_what_a_tie_is_with() -> None:
    rec = Recommendation("plain", 1.0, (1.0, 1.0), True, "plain decoding is faster", runner_up=1,
                         headline="plain decoding (best MTP: n_draft 1 at 0.91× [0.87, 1.06]), a tie between "
                                  "plain decoding and n_draft 1")
    a = TraceFacts("trace A", "/a", "a", "d.gguf", 0.5, PROMPTS, True, recommendation=rec)
    v = start_verdict([a])
    assert v.defect is False and v.suspect == "/a"
    assert v.sentence.startswith("No defect found by the file checks")
    # the headline starts with the choice and names the tie: said once, not after the label again
    assert v.advice == ("Advice for trace A: plain decoding (best MTP: n_draft 1 at 0.91× [0.87, 1.06]), a tie "
                        "between plain decoding and n_draft 1.")
    # a headline that does not start with the choice follows the label, which names what the tie is with
    tied = Recommendation(3, 1.2, (0.9, 1.5), True, "n_draft 3: 1.20×", runner_up=2, headline="1.20× plain decoding")
    assert advice_line(tied) == "Advice for trace A: n_draft 3 (a tie with n_draft 2) — 1.20× plain decoding."
    few = Recommendation(None, None, None, False, "too few rounds to tell: 3 first drafts",
                         headline="too few rounds to tell (3 first drafts)")
    assert advice_line(few) == "Advice for trace A: too few rounds to tell (3 first drafts)."
    # one trace, the choice is plain: nothing to compare acceptance with but another trace
    assert "no other trace is open" in v.acceptance
    mtp = Recommendation(3, 1.25, (1.1, 1.4), False, "n_draft 3: 1.25×")
    assert start_verdict([TraceFacts("trace A", "/a", "a", acceptance_rate=0.5, recommendation=mtp)]).acceptance == \
        "Acceptance rate 50.0 % on trace A (`a`): MTP at n_draft 3 runs 1.25× the speed of plain decoding."


def test_nothing_checked_is_said() -> None:
    v = start_verdict([TraceFacts("trace A", "/a", "a", acceptance_rate=None)])
    assert v.defect is None and v.sentence.startswith("Not checked")
    assert pct(None) == "—" and pct(0.2101) == "21.0 %"
    with pytest.raises(ValueError):
        start_verdict([])


def test_recommendation_label_names_what_a_tie_is_with() -> None:
    assert recommendation_label(Recommendation("plain", 1.0, None, True, "r", runner_up=1)) == \
        "plain decoding (a tie with n_draft 1)"
    assert recommendation_label(Recommendation(2, 1.2, None, True, "r", runner_up="plain")) == \
        "n_draft 2 (a tie with plain decoding)"
    assert recommendation_label(Recommendation(2, 1.2, None, True, "r", runner_up=3)) == "n_draft 2 (a tie with n_draft 3)"
    assert recommendation_label(Recommendation(2, 1.2, None, False, "r", runner_up=3)) == "n_draft 2"


def test_an_incomplete_trace_says_why_in_one_line() -> None:
    from mtpscope.app.verdict import trace_state_line

    assert trace_state_line("trace A", {"complete": True}) is None
    assert trace_state_line("trace A", {"complete": False}) == (
        "Trace A is incomplete: still being written, or the run stopped early — the numbers cover the rounds "
        "recorded before.")
    died = {"complete": False, "aborted": {"signal": "SIGABRT", "exit_code": None, "where": "at prompt 0, round 3"}}
    assert trace_state_line("trace B", died) == (
        "Trace B is incomplete: llama.cpp died at prompt 0, round 3 (SIGABRT) — the numbers cover the rounds recorded "
        "before.")
    stopped = {"complete": False, "aborted": {"signal": "SIGTERM", "exit_code": None, "where": "at prompt 0, round 3",
                                              "how": "was stopped from outside (SIGTERM)"}}
    assert trace_state_line("trace A", stopped) == (         # the recorder's own words, as `record` printed them
        "Trace A is incomplete: llama.cpp was stopped from outside (SIGTERM) at prompt 0, round 3 — the numbers cover "
        "the rounds recorded before.")
    rec = {"complete": False, "recovered": {"n_rounds": 1, "problems": ["wal/part-00001.log: at offset 9: ..."]}}
    assert trace_state_line("trace A", rec) == (
        "Trace A is incomplete: the run was interrupted; 1 round came back from its write-ahead log, 1 log could not "
        "be read to the end (Files page) — the numbers cover the rounds recorded before.")


def test_lost_parts_line_names_the_files_and_counts_them() -> None:
    """The banner of a trace whose reader skipped part files: each named up to three, then how many more."""
    from mtpscope.app.verdict import lost_parts_line

    assert lost_parts_line("trace A", []) is None
    assert lost_parts_line("trace B", ["steps/merged-00000.parquet"]) == (
        "Trace B lost 1 part file (steps/merged-00000.parquet: missing or unreadable): the numbers cover the rest; "
        "the Files page lists why.")
    five = [f"rounds/part-0000{i}.parquet" for i in range(5)]
    assert lost_parts_line("trace A", five).startswith(
        "Trace A lost 5 part files (rounds/part-00000.parquet, rounds/part-00001.parquet, rounds/part-00002.parquet "
        "and 2 more: missing")


def test_no_steps_words_say_why_a_round_has_no_steps() -> None:
    """A lost steps part is not called an imported log (before: every round without steps was 'an imported log')."""
    from mtpscope.app.round_views import no_steps_words

    assert "a steps part file of this trace was lost" in no_steps_words({"source": "record"}, lost_steps=True)
    assert "rounds only (an imported log)" in no_steps_words({"source": "fork-ndjson"}, lost_steps=False)
    assert "the trace holds none for it" in no_steps_words({"source": "record"}, lost_steps=False)


def test_a_requests_only_trace_is_not_said_to_have_drafted_nothing() -> None:
    """A llama-server log (request rows, an acceptance rate, no per-prompt rounds): its start-page line says so, not
    "no prompt drafted a token" beside its 61.1 %."""
    from mtpscope.app.verdict import no_worst_words

    srv = TraceFacts(role="trace A", path="/t", name="t", acceptance_rate=11 / 18, prompts=())
    assert no_worst_words(srv).startswith("trace A: llama-server requests, no rounds per prompt")
    idle = TraceFacts(role="trace B", path="/t", name="t", acceptance_rate=None,
                      prompts=(PromptCounts(0, None, 0, 0),))
    assert no_worst_words(idle) == "trace B: no prompt drafted a token."


def test_request_rows_words_name_the_rows_used_and_those_left_out() -> None:
    """A llama-server log with acceptance lines and response timings: the Acceptance page says the numbers come from
    the response rows and that the log rows are left out (before: "from its requests", the 2 log rows unmentioned)."""
    from mtpscope.app.views import request_rows_words

    assert request_rows_words("response", {"response": 2, "log": 2}) == (
        "The numbers above come from its 2 response rows; its 2 log rows are left out (both may describe the same "
        "requests).")
    assert request_rows_words("log", {"log": 1}) == "The numbers above come from its 1 log row."
