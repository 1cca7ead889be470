"""The sweep's table per drafter quantization x category (traces/sweep/quant.py ``quant_table``), its text
(``format_quant_section``) and the Sweep page's matrix (``app.views.quant_matrix``) on hand-made cells:
rows relabelled from the report's cells without changing a number, ordered by category then type, the
intervals hook, and nothing for a sweep without quantizations."""

from __future__ import annotations

import math

import pandas as pd

from mtpscope.traces.sweep.spec import QuantAssistant, SweepPrompt, SweepSpec

CELLS = pd.DataFrame(
    [("q8_0", 3, "all", 2, 20, 60, 30, 0.5, 2.5, 40.0, 1.2),
     ("q8_0", 3, "code", 1, 10, 30, 20, 2 / 3, 3.0, 44.0, 1.3),
     ("q8_0", 3, "prose", 1, 10, 30, 10, 1 / 3, 2.0, 36.0, 1.1),
     ("q4_k_m", 3, "all", 2, 22, 66, 22, 1 / 3, 2.0, 41.0, 1.25),
     ("q4_k_m", 3, "code", 1, 11, 33, 11, 1 / 3, 2.0, 45.0, 1.35),
     ("q4_k_m", 3, "prose", 1, 11, 33, 11, 1 / 3, 2.0, 37.0, 1.15),
     ("other", 3, "all", 2, 5, 15, 5, 1 / 3, 2.0, 30.0, 0.9),
     ("baseline", 0, "all", 2, 40, 0, 0, math.nan, math.nan, 33.0, 1.0)],
    columns=["assistant", "n_draft", "category", "n_prompts", "n_rounds", "n_drafted", "n_accepted", "acceptance_rate",
             "mean_acceptance_length", "tokens_per_s", "speedup"])


def _spec(quantized=True) -> SweepSpec:
    q = (QuantAssistant("q8_0", "q8_0", "/m/drafter.gguf", "ab" * 32, 3 * 2**20),
         QuantAssistant("q4_k_m", "q4_k_m", "/m/drafter.gguf", "ab" * 32, 2**20)) if quantized else ()
    return SweepSpec(target="/m/t.gguf", assistants=(("q8_0", "/c/q8_0.gguf"), ("q4_k_m", "/c/q4_k_m.gguf"),
                                                     ("other", "/m/o.gguf")),
                     prompts=(SweepPrompt(0, "a", "code"), SweepPrompt(1, "b", "prose")), n_drafts=(3,), n_shards=1,
                     quantized=q)


def test_rows_are_the_cells_relabelled_by_category_then_type() -> None:
    from mtpscope.traces.sweep.quant import QUANT_COLUMNS, quant_table

    t = quant_table(CELLS, _spec())
    assert list(t.columns) == list(QUANT_COLUMNS)
    assert list(zip(t["category"], t["qtype"], strict=True)) == [
        ("all", "q8_0"), ("all", "q4_k_m"), ("code", "q8_0"), ("code", "q4_k_m"), ("prose", "q8_0"), ("prose", "q4_k_m")]
    for r in t.to_dict("records"):
        c = CELLS[(CELLS["assistant"] == r["assistant"]) & (CELLS["category"] == r["category"])].iloc[0]
        for k in ("acceptance_rate", "mean_acceptance_length", "tokens_per_s", "speedup", "n_rounds"):
            assert r[k] == c[k]
    assert set(t["n_bytes"]) == {3 * 2**20, 2**20} and set(t["source"]) == {"drafter.gguf"}
    assert quant_table(CELLS, _spec(quantized=False)).empty
    assert quant_table(CELLS.iloc[0:0], _spec()).empty


def test_intervals_hook_text_and_page_matrix() -> None:
    from mtpscope.app.views import quant_matrix
    from mtpscope.cli.sweep import format_quant_section
    from mtpscope.traces.sweep.quant import quant_rows, quant_table

    plain = quant_rows(quant_table(CELLS, _spec()))
    text = format_quant_section(plain)
    assert text[1].startswith("drafter quantizations") and "drafter.gguf" in text[1]
    assert text[3].split() == ["all", "q8_0", "3", "3.0", "0.5000", "2.500", "40.0", "1.200"]
    assert text[4].split() == ["q4_k_m", "3", "1.0", "0.3333", "2.000", "41.0", "1.250"]
    assert format_quant_section([]) == []
    iv = {("q4_k_m", 3, "code"): {"acceptance_rate": (0.25, 0.4)}}
    t = quant_table(CELLS, _spec(), intervals=iv)
    assert {"acceptance_rate_lo", "acceptance_rate_hi"} <= set(t.columns) and "tokens_per_s_lo" not in t.columns
    row = t[(t["qtype"] == "q4_k_m") & (t["category"] == "code")].iloc[0]
    assert (row["acceptance_rate_lo"], row["acceptance_rate_hi"]) == (0.25, 0.4)
    assert math.isnan(t[(t["qtype"] == "q8_0") & (t["category"] == "code")].iloc[0]["acceptance_rate_lo"])
    text = format_quant_section(quant_rows(t))
    assert any("0.3333 [0.2500, 0.4000]" in ln for ln in text)
    m = quant_matrix(t, "acceptance rate")
    assert list(m.index) == ["q8_0", "q4_k_m"] and list(m.columns) == ["size MiB", "all", "code", "prose"]
    assert m.loc["q4_k_m", "code"] == "33.3% [25.0%, 40.0%]" and m.loc["q8_0", "code"] == "66.7%"
    assert m.loc["q8_0", "size MiB"] == "3.0"
    assert quant_matrix(quant_table(CELLS, _spec()), "speedup").loc["q4_k_m", "all"] == "1.250"
