"""The explanation's recommendation, categories under another field name, and a sweep cell explained against
the sweep's own plain decoding, on synthetic traces and sweeps (expected values from the Parquet parts)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from mtpscope.cli.main import app
from mtpscope.traces.analysis import breakdown as B
from mtpscope.traces.analysis.explain_report import explain_trace
from mtpscope.traces.store.reader import open_trace
from mtpscope.traces.synthetic import write_synthetic_sweep, write_synthetic_trace

runner = CliRunner()


def _tab(trace_dir: Path) -> pa.Table:
    m = json.loads((trace_dir / "manifest.json").read_text())
    files = m["parts"]["rounds"] if m.get("parts") else sorted(p.name for p in (trace_dir / "rounds").glob("part-*.parquet"))
    return pa.concat_tables([pq.read_table(trace_dir / "rounds" / f) for f in files])


def _with_prompts(d: Path, entries: list[dict]) -> None:
    m = json.loads((d / "manifest.json").read_text())
    m["prompts"] = entries
    (d / "manifest.json").write_text(json.dumps(m))


def test_categories_from_another_field_and_the_note(tmp_path: Path) -> None:
    d = write_synthetic_trace(tmp_path / "t", n_rounds=400, n_prompts=8, n_draft=3, steps=False)
    _with_prompts(d, [{"prompt_id": i, "text": f"p{i}", "extra": {"domain": "code" if i < 4 else "chat"}}
                      for i in range(8)])
    assert B.prompt_categories(json.loads((d / "manifest.json").read_text())) is None
    x = explain_trace(open_trace(d), with_drift=False)
    assert x.by_category is None
    assert any("no 'category' but a 'domain' field" in n and "explain --category-field domain" in n for n in x.notes)
    y = explain_trace(open_trace(d), with_drift=False, category_field="domain")
    tab = _tab(d)
    pid, nd, na = (np.asarray(tab[c]) for c in ("prompt_id", "n_draft", "n_accepted"))
    for name, m in (("code", pid < 4), ("chat", pid >= 4)):
        assert y.by_category[name].acceptance_rate == pytest.approx(na[m].sum() / nd[m].sum())
        assert y.what_if.by_category[name].row(3).acceptance_rate == pytest.approx(na[m].sum() / nd[m].sum())
    # a field no prompt has (a typo): the note names the fields the prompts do have; the CLI refuses it, exit 2
    z = explain_trace(open_trace(d), with_drift=False, category_field="domian")
    assert z.by_category is None and "no prompt has a 'domian' field (the prompts' fields: domain): no categories" \
        in z.notes
    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    r = CliRunner().invoke(app, ["explain", str(d), "--category-field", "domian"])
    assert r.exit_code == 2 and "no prompt has a 'domian' field (the prompts' fields: domain)" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
    # a field every prompt has with no usable value: said so, not "no such field"; a top-level field is listed
    from mtpscope.traces.analysis.breakdown import missing_field_words, prompt_fields

    m = {"prompts": [{"prompt_id": 0, "text": "a", "source": "docs", "extra": {"domain": None}},
                     {"prompt_id": 1, "text": "b", "source": "web", "extra": {"domain": ""}}]}
    assert prompt_fields(m) == ["source"]
    assert missing_field_words(m, "domain") == ("no prompt has a 'domain' value (each is null, empty or not text) "
                                                "(the prompts' fields: source)")
    assert B.prompt_categories(m, "source") == {0: "docs", 1: "web"}
    rec = y.to_dict()["recommendation"]
    assert set(rec["by_category"]) == {"code", "chat"}
    # without a measured plain decoding the speedups are labelled estimated, with how
    assert rec["speedup"]["estimated"] is True or rec["choice"] is None
    assert any("no plain decoding was measured" in n for n in y.notes)


def test_a_sweep_cell_uses_the_sweeps_plain_decoding(tmp_path: Path) -> None:
    from mtpscope.traces.sweep.advice import explain_with_baseline, trace_baseline

    d = write_synthetic_sweep(tmp_path / "s", n_rounds=3000, assistants=("q8",), n_drafts=(2, 3), n_shards=2,
                              n_prompts=16, categories=("code", "chat"))
    cell = open_trace(d / "assistant=q8" / "n_draft=3" / "shard=1")
    base, note = trace_baseline(cell)
    assert note is None and base.source == "sweep"
    bt = _tab(d / "assistant=baseline" / "n_draft=0" / "shard=1")
    ms = float(np.sum(bt["t_verify_ms"]) + np.sum(bt["t_draft_ms"]))
    ne = sum(len(x) for x in bt["emitted"].to_pylist())
    assert base.t_per_token_ms == pytest.approx(ms / ne)
    x = explain_with_baseline(cell, with_drift=False)
    d3 = x.to_dict()
    assert d3["baseline"]["source"] == "sweep" and d3["what_if_model"]["cost"]["baseline"] == "measured"
    # the recorded n_draft's speedup = the cell's tokens/s at its robust prices (each round size at the
    # median of its rounds, issue 34) over the baseline's, same prompts
    ct = _tab(d / "assistant=q8" / "n_draft=3" / "shard=1")
    nd, td, tv = (np.asarray(ct[c]) for c in ("n_draft", "t_draft_ms", "t_verify_ms"))
    ks = np.unique(nd)
    cnt = {int(k): int((nd == k).sum()) for k in ks}
    mv = {int(k): float(np.median(tv[nd == k])) for k in ks}
    md = {int(k): float(np.median(td[nd == k])) for k in ks if k}
    # a size with under 5 rounds: on the weighted least-squares lines through the medians (verify: and the
    # measured plain decoding at n = 1, weighted as the largest size), no probe in a synthetic trace
    xv = [k + 1 for k in cnt] + [1]
    yv = [mv[k] for k in cnt] + [ms / ne]
    wv = list(cnt.values()) + [max(cnt.values())]
    v1, v0 = np.polyfit(xv, yv, 1, w=np.sqrt(wv))
    kd = list(md)
    d1, d0 = np.polyfit(kd, [md[k] for k in kd], 1, w=np.sqrt([cnt[k] for k in kd]))
    assert min(v0, v1, d0, d1) >= 0        # the free fits, as the rule keeps them
    price = {k: (md[k] if k and cnt[k] >= 5 else (d0 + d1 * k if k else 0.0))
             + (mv[k] if cnt[k] >= 5 else v0 + v1 * (k + 1)) for k in cnt}
    tps = 1000 * sum(len(x) for x in ct["emitted"].to_pylist()) / sum(price[int(k)] for k in nd)
    row = next(r for r in d3["what_if"] if r["recorded"])
    assert row["tokens_per_s"] == pytest.approx(tps) and row["speedup"] == pytest.approx(tps * ms / ne / 1000)
    assert not any("no plain decoding" in n for n in x.notes)
    # a sweep without its baseline: estimated, and it says so
    e = write_synthetic_sweep(tmp_path / "nb", n_rounds=600, assistants=("q8",), n_drafts=(3,), n_shards=1,
                              n_prompts=8, baseline=False)
    y = explain_with_baseline(open_trace(e / "assistant=q8" / "n_draft=3" / "shard=0"), with_drift=False)
    assert any("recorded no plain decoding" in n for n in y.notes)
    assert y.to_dict()["recommendation"]["speedup"]["estimated"] is True


def test_cli_explain_and_report_on_a_sweep(tmp_path: Path) -> None:
    d = write_synthetic_sweep(tmp_path / "s", n_rounds=3000, assistants=("q8",), n_drafts=(1, 3), n_shards=2,
                              n_prompts=18, categories=("code", "chat", "json"))
    for cmd in (["explain", str(d), "--json"], ["report", str(d), "--json"]):
        res = runner.invoke(app, cmd)
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout)
        rec = out["recommendation"]
        assert rec["choice"] == "plain" or rec["choice"] in (1, 3)
        assert set(rec["speedup"]) == {"value", "interval", "estimated"} and isinstance(rec["tie"], bool)
        assert set(rec["by_category"]) == {"code", "chat", "json"} and out["break_even"] is not None
        assert out["baseline"]["source"] == "sweep"
    text = runner.invoke(app, ["explain", str(d)])
    assert text.exit_code == 0 and "Recommendation:" in text.stdout and "Break-even:" in text.stdout
    cell = d / "assistant=q8" / "n_draft=3" / "shard=0"
    res = runner.invoke(app, ["explain", str(cell), "--json"])
    assert res.exit_code == 0, res.output
    j = json.loads(res.stdout)
    assert j["baseline"]["source"] == "sweep" and "recommendation" in j and "break_even" in j
    # shard 0 holds prompts 0, 2, ..., 16: every category (from sweep.json: these synthetic traces'
    # manifests name none)
    assert set(j["recommendation"]["by_category"]) == {"code", "chat", "json"}


def test_the_n_draft_1_estimate_says_why_it_is_not_p_accepted_at_k_1(tmp_path: Path) -> None:
    """Two numbers that look alike: the what-if's acceptance at n_draft 1 and report's P(accepted) at k = 1; the
    note names both (the second counted here from the rounds part) and why they differ; none at n_draft 1."""
    d = write_synthetic_trace(tmp_path / "t", n_rounds=400, n_prompts=8, n_draft=3, steps=False)
    x = explain_trace(open_trace(d), with_drift=False)
    tab = _tab(d)
    nd, na = np.asarray(tab["n_draft"]), np.asarray(tab["n_accepted"])
    p1 = (na[nd >= 1] >= 1).sum() / (nd >= 1).sum()
    (note,) = [n for n in x.notes if n.startswith("n_draft 1's estimated")]
    assert f"({x.what_if.row(1).acceptance_rate:.3f})" in note and f"at k = 1 ({p1:.4f}, `report`)" in note
    one = write_synthetic_trace(tmp_path / "one", n_rounds=200, n_prompts=4, n_draft=1, steps=False)
    assert not [n for n in explain_trace(open_trace(one), with_drift=False).notes if n.startswith("n_draft 1's")]


def test_no_n_draft_1_note_when_the_two_numbers_print_alike(demo_dir) -> None:
    """The demo's clean trace accepts every draft: the estimate at n_draft 1 and P(accepted) at k = 1 are both 1, and
    a note saying "(1.000) is not ... (1.0000)" contradicted itself (a fresh user's report)."""
    if not Path(demo_dir.traces_clean).is_dir():
        pytest.skip("the demo's clean trace needs llama-cpp-python")
    tr = open_trace(demo_dir.traces_clean)
    r = tr.columns("rounds", ["n_draft", "n_accepted"])
    nd, na = np.asarray(r["n_draft"]), np.asarray(r["n_accepted"])
    assert nd.max() > 1 and (na[nd >= 1] >= 1).all()            # recorded at n_draft > 1; P(accepted) at k = 1 is 1
    x = explain_trace(tr, with_drift=False)
    assert f"{x.what_if.row(1).acceptance_rate:.3f}" == "1.000"
    assert not [n for n in x.notes if n.startswith("n_draft 1's")]


def test_select_prompt_names_what_it_accepts_and_refuses_a_shared_id() -> None:
    """``--prompt``: an id, else a prompt_id; a miss lists the ids (the first 10, and how many more) and the
    prompt_id range; an id two prompts share is refused with their prompt_ids (it used to pick the first)."""
    from mtpscope.errors import TraceError
    from mtpscope.traces.analysis.explain_report import select_prompt

    prompts = [{"prompt_id": i, "id": f"p{i}"} for i in range(12)] + [{"prompt_id": 12, "id": "p3"}]
    m = {"prompts": prompts}
    assert select_prompt(m, "p7") == 7 and select_prompt(m, "11") == 11 and select_prompt(m, 12) == 12
    with pytest.raises(TraceError) as e:
        select_prompt(m, "99")
    assert e.value.expected == "an id (p0, p1, p2, p3, p4, p5, p6, p7, p8, p9 and 2 more) or a prompt_id (0..12)"
    with pytest.raises(TraceError) as e:
        select_prompt(m, "p3")
    assert "names 2 prompts" in e.value.one_line() and e.value.expected == "one of prompt_id 3, 12"
    with pytest.raises(TraceError) as e:
        select_prompt({"prompts": [{"prompt_id": 0}, {"prompt_id": 2}]}, "x")
    assert e.value.expected == "a prompt_id (0, 2)"


def test_no_vocabulary_says_why() -> None:
    """Why a trace has no vocabulary, from its manifest's models: an HF / MLX recording names checkpoint folders
    (dialect hf, no GGUF token list: a reviewer saw it told "the recorded target GGUF is not at its recorded path"
    of a folder still in place); a GGUF recording whose files moved; an import that names none."""
    from mtpscope.traces.analysis.explain_report import no_vocab_note

    hf = {"models": {"target": {"path": "/m/target", "dialect": "hf"}, "assistant": {"path": "/m/a", "dialect": "hf"}}}
    assert "Hugging Face checkpoints, which hold no GGUF token list" in no_vocab_note(hf)
    gguf = {"models": {"target": {"path": "/gone/t.gguf", "dialect": "target"}}}
    assert "the recorded target GGUF is not at its recorded path" in no_vocab_note(gguf)
    assert "the trace records no target GGUF" in no_vocab_note({"source": "import"})
