"""traces/analysis/wording.py: the words the CLI and the app share (expected strings written by hand)."""

from __future__ import annotations

from mtpscope.traces.analysis import wording as W


def test_plural() -> None:
    assert W.plural(1, "round") == "1 round"
    assert W.plural(0, "round") == "0 rounds"
    assert W.plural(2, "round") == "2 rounds"
    assert W.plural(12000, "round") == "12,000 rounds"
    assert W.plural(1, "mismatch") == "1 mismatch" and W.plural(3, "mismatch") == "3 mismatches"
    assert W.plural(2, "bad line") == "2 bad lines"
    assert W.plural(5, "datum", "data") == "5 data"


def test_prompt_labels_and_shortening() -> None:
    assert W.shorten("The quick\n brown   fox", 40) == "The quick brown fox"
    assert W.shorten("abcdefghij", 5) == "abcd…"
    assert W.prompt_label(3, "Every sailor sings about") == "prompt 3 “Every sailor sings about”"
    assert W.prompt_label(3, "") == "prompt 3" and W.prompt_label(3, None) == "prompt 3"
    assert W.prompt_label(7, "x" * 50, width=10) == "prompt 7 “xxxxxxxxx…”"
    prompts = [{"prompt_id": 0, "text": "a"}, {"prompt_id": "1", "text": None}, {"prompt_id": "x"}, 5,
               {"prompt_id": True, "text": "bool is no id"}]
    assert W.prompt_texts(prompts) == {0: "a", 1: ""}
    assert W.prompt_labels([0, 1, 2], prompts) == {0: "prompt 0 “a”", 1: "prompt 1", 2: "prompt 2"}
    assert W.manifest_prompts("not a list") == []


def test_streak_and_rolling_words() -> None:
    assert W.streaks_line(12, 12, 1) == \
        "zero-acceptance streaks: 12 (12 rounds), longest 1 round"
    assert W.streaks_line(1, 3, 3) == \
        "zero-acceptance streaks: 1 (3 rounds), longest 3 rounds"
    assert W.streaks_line(0).startswith("zero-acceptance streaks: none")
    assert W.rolling_words(32, True) == \
        "window 32 rounds, across the trace, full windows only"
    # a trace shorter than the window: the min and max are over the growing windows ending at each round
    assert W.rolling_words(32, False) == \
        "window 32 rounds, across the trace, fewer rounds than the window: the partial windows ending at each round"
