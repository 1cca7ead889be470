"""`mtpscope replay`'s text output (mtpscope.cli.fidelity.format_replay) on a hand-written summary: token
text next to ids, agreement explained, indistinguishable variants noted, nothing over 80 columns that
could split an id."""

from __future__ import annotations

import pandas as pd

from mtpscope.cli.fidelity import format_replay
from mtpscope.traces.run.replay import ReplaySummary, indistinguishable


def _summary() -> ReplaySummary:
    return ReplaySummary.from_dict({"trace": "t", "n_rounds": 1, "n_steps": 3,
            "recorded": {"acceptance_rate": 1 / 3, "mean_acceptance_length": 2.0},
            "variants": {"baseline": {"options": "-", "acceptance_rate": 1 / 3, "mean_acceptance_length": 2.0,
                                      "agreement": 1.0},
                         "position=p-1": {"options": "position=p-1", "acceptance_rate": 1 / 3,
                                          "mean_acceptance_length": 2.0, "agreement": 1.0},
                         "head=centroid": {"options": "head=centroid", "acceptance_rate": 0.0,
                                           "mean_acceptance_length": 1.0, "agreement": 1 / 3}},
            "indistinguishable": [["baseline", "position=p-1"]], "notes": [], "out": None})


def test_format_replay_text() -> None:
    steps = pd.DataFrame({"prompt_id": [0, 0, 0], "round": [0, 0, 0], "k": [1, 2, 3], "recorded": [1651, 7, 8],
                          "truth": [1651, 9, 10], "draft[baseline]": [1651, 7, 8], "draft[position=p-1]": [1651, 7, 8],
                          "draft[head=centroid]": [6819, 9, 8]})
    assert indistinguishable(steps, ["baseline", "position=p-1", "head=centroid"]) == [("baseline", "position=p-1")]
    dis = steps[steps["draft[head=centroid]"] != steps["recorded"]]
    label = {1651: " seven", 6819: " islands", 7: "\n", 8: "x", 9: "y", 10: "z"}.get
    out = format_replay(_summary(), dis, label)
    lines = out.splitlines()
    assert lines[0] == "replay of t: 1 round, 3 steps"
    assert any(ln.startswith("head=centroid") and "0.3333" in ln for ln in lines)
    flat = " ".join(" ".join(lines).split())
    assert "agreement = share of the recorded draft steps where the variant drafts the same token as" in flat
    assert "cannot tell position=p-1 from baseline" in flat
    assert "prompt 0 · round 0 · k=1 · target 1651 “ seven”" in lines
    assert "    head=centroid  6819 “ islands”" in lines
    assert "  ✓ recorded       1651 “ seven”" in lines
    assert "    recorded       7 “↵”" in lines  # a newline token shown as a mark, not a line break
    assert all(len(ln) <= 80 for ln in lines), [ln for ln in lines if len(ln) > 80]
    assert "1651" in format_replay(_summary(), dis, None) and "“" not in format_replay(_summary(), dis, None).split(
        "steps where")[1]


def test_a_replay_of_another_model_says_so_before_any_figure() -> None:
    """A model that is not the recorded file (header sha256 differs) is said on the line under the title, above
    the table whose figures it changes, and kept in summary.json's ``model_mismatch`` (not among the notes)."""
    mismatch = ("the assistant d.gguf is not the file the trace was recorded with (header sha256 4a87ff44c0f6… vs "
                "recorded 8cfe4eb31196…): agreement and rates describe another model")
    d = {**_summary().to_dict(), "model_mismatch": [mismatch],
         "notes": ["baseline h_next vs recorded h_next (f16): max relative error 1.54 over 3 steps"]}
    s = ReplaySummary.from_dict(d)
    assert s.model_mismatch == (mismatch,) and ReplaySummary.from_dict(s.to_dict()) == s
    lines = format_replay(s, None, None).splitlines()
    table = next(i for i, ln in enumerate(lines) if ln.startswith("variant"))
    head = " ".join(" ".join(lines[1:table]).split())
    assert head == f"warning: {mismatch}"
    assert "max relative error" in " ".join(lines[table:]) and "not the file" not in " ".join(lines[table:])
    assert _summary().model_mismatch == ()     # a summary.json from before the key
