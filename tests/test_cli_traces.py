"""`mtpscope report` and `mtpscope import` through the real typer app."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mtpscope.cli.main import app
from mtpscope.traces import RoundRecord, TraceWriter

runner = CliRunner()

# (prompt_id, round, n_draft, n_accepted)
ROWS = [(0, 0, 3, 3), (0, 1, 3, 1), (0, 2, 3, 0), (1, 0, 3, 2), (1, 1, 2, 0)]


def _trace(d: Path, compact: bool = True) -> Path:
    with TraceWriter(d, {"prompts": [{"prompt_id": 0, "text": "a", "n_prompt_tokens": 2},
                                     {"prompt_id": 1, "text": "b", "n_prompt_tokens": 3}]},
                     n_embd_backbone=None, n_embd=None, hidden_dtype=None, centroids=False,
                     flush_every=2, compact=compact) as w:
        for p, r, nd, na in ROWS:
            w.add_round(RoundRecord(prompt_id=p, round=r, pos=10 + r, pending_token=1, n_draft=nd,
                                    drafted=tuple(range(nd)), n_accepted=na, t_draft_ms=4.0, t_verify_ms=30.0))
    return d


def test_report_json(tmp_path: Path) -> None:
    res = runner.invoke(app, ["report", str(_trace(tmp_path / "t")), "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    # drafted 3+3+3+3+2 = 14, accepted 3+1+0+2+0 = 6, 5 verify rounds
    assert (rep["n_rounds"], rep["n_drafted"], rep["n_accepted"]) == (5, 14, 6)
    assert rep["acceptance_rate"] == pytest.approx(6 / 14)
    assert rep["mean_acceptance_length"] == pytest.approx(1 + 6 / 5)
    # k=1: 5 rounds drafted, 3 accepted; k=2: 5 drafted, 2 accepted; k=3: 4 drafted (not the n_draft=2 one), 1
    assert [(p["k"], p["n_rounds"], p["n_accepted"]) for p in rep["per_position"]] == [(1, 5, 3), (2, 5, 2), (3, 4, 1)]
    assert [(p["prompt_id"], p["n_drafted"], p["n_accepted"]) for p in rep["prompts"]] == [(0, 9, 4), (1, 5, 2)]
    assert rep["n_prompts"] == 2 and rep["complete"] is True
    assert [p["text"] for p in rep["prompts"]] == ["a", "b"]  # the manifest's prompt texts
    # 5 rounds of 4 ms drafting and 30 ms verifying; 14 drafted; 6 accepted + 5 correction / bonus tokens
    assert rep["timing_ms"] == {"t_draft_ms_mean": 4.0, "t_verify_ms_mean": 30.0, "t_step_ms_mean": pytest.approx(20 / 14),
                                "t_verify_ms_mean_by_size": {"3": 30.0, "4": 30.0},
                                "tokens_per_s": pytest.approx(1000 * 11 / (5 * 34))}


def test_report_text(tmp_path: Path) -> None:
    res = runner.invoke(app, ["report", str(_trace(tmp_path / "t"))])
    assert res.exit_code == 0, res.output
    assert "acceptance rate:        0.4286" in res.stdout
    assert "mean acceptance length: 2.2000" in res.stdout
    # zero-acceptance rounds: p0 r2 and p1 r1, each a streak of one round
    assert "zero-acceptance streaks: 2 (2 rounds), longest 1 round" in res.stdout
    table = res.stdout[res.stdout.index("prompt  rounds"):].splitlines()[1:]
    rows = [ln.split() for ln in table if ln.strip()]
    assert [r[0] + r[-1] for r in rows] == ["0a", "1b"]  # the per-prompt table ends with each prompt's text


def test_report_errors_and_warnings(tmp_path: Path) -> None:
    res = runner.invoke(app, ["report", str(tmp_path / "nope")])
    assert res.exit_code == 2
    assert res.stderr.startswith("mtpscope: ") and "not a trace directory" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    d = _trace(tmp_path / "t", compact=False)
    part = d / "rounds" / "part-00001.parquet"
    part.write_bytes(part.read_bytes()[:20])
    res = runner.invoke(app, ["report", str(d), "--json"])
    assert res.exit_code == 1  # read, but a part was skipped
    assert "part-00001.parquet" in res.stderr
    rep = json.loads(res.stdout)
    assert rep["n_rounds"] == 3 and len(rep["warnings"]) == 1
    # the manifest counts the 5 rounds written (ROWS); the 2 of part 1 are lost: the first line says so rather
    # than "complete" alone
    assert rep["complete"] is True and rep["n_rounds_recorded"] == len(ROWS) == 5
    res = runner.invoke(app, ["report", str(d)])
    assert res.stdout.splitlines()[0] == (f"trace: {d} (source record, complete; 3 of its 5 rounds read: a rounds part is "
                                          "missing or unreadable, see the warnings)")
    res = runner.invoke(app, ["report", str(_trace(tmp_path / "whole", compact=False)), "--json"])
    assert json.loads(res.stdout)["n_rounds_recorded"] is None     # every round read


def test_import_commands(tmp_path: Path) -> None:
    src = tmp_path / "mtp.ndjson"
    src.write_text('{"evt":"mtp_draft","iter":1,"seq_id":0,"id_last":5,"attn_pos":9,"drafts":[1,2,3]}\n'
                   "{not json\n"
                   '{"evt":"mtp_accept","iter":1,"n_accepted":2,"n_drafted_prev":3}\n')
    res = runner.invoke(app, ["import", "fork-ndjson", str(src), "--out", str(tmp_path / "t")])
    assert res.exit_code == 1, res.output
    assert "1 round, 3 steps" in res.stdout
    assert "1 bad line skipped" in res.stderr and "line 2: invalid JSON" in res.stderr
    rep = json.loads(runner.invoke(app, ["report", str(tmp_path / "t"), "--json"]).stdout)
    assert (rep["n_drafted"], rep["n_accepted"]) == (3, 2)
    # same --out again: refused without --overwrite
    res = runner.invoke(app, ["import", "fork-ndjson", str(src), "--out", str(tmp_path / "t")])
    assert res.exit_code == 2 and "already holds a trace" in res.stderr
    (tmp_path / "t" / "llama.log").write_text("a recording's llama.cpp output\n")   # as a recorded trace has
    res = runner.invoke(app, ["import", "fork-ndjson", str(src), "--out", str(tmp_path / "t"), "--overwrite"])
    assert res.exit_code == 1
    assert not (tmp_path / "t" / "llama.log").exists()     # the replaced trace's log does not stay beside the new one

    log = tmp_path / "server.log"
    log.write_text("slot print_timing: id  0 | task 3 | \ndraft acceptance rate = 0.50000 (    2 accepted /     4 generated)\n")
    res = runner.invoke(app, ["import", "server-log", str(log), "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    rep = json.loads(runner.invoke(app, ["report", str(tmp_path / "s"), "--json"]).stdout)
    assert rep["acceptance_rate"] == 0.5 and rep["requests"]["n_requests"] == 1

    junk = tmp_path / "junk.log"
    junk.write_text("nothing\n")
    res = runner.invoke(app, ["import", "server-log", str(junk), "--out", str(tmp_path / "j")])
    assert res.exit_code == 2 and "junk.log" in res.stderr


def test_report_empty_trace(tmp_path: Path) -> None:
    TraceWriter(tmp_path / "e", {}, n_embd_backbone=None, n_embd=None, hidden_dtype=None, centroids=False).close()
    res = runner.invoke(app, ["report", str(tmp_path / "e"), "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["n_rounds"] == 0 and rep["acceptance_rate"] is None and rep["per_position"] == []
    assert runner.invoke(app, ["report", str(tmp_path / "e")]).exit_code == 0


def test_import_fork_ndjson_dropping_events_exits_1(tmp_path: Path) -> None:
    """A well-formed draft without its accept, or an accept without its draft, is left out of the trace: that
    is data dropped, so exit 1 with the warning naming the line on stderr (was exit 0); a file where every
    event is joined exits 0."""
    pair = ('{"evt":"mtp_draft","iter":1,"seq_id":0,"id_last":5,"attn_pos":9,"drafts":[1,2,3]}\n'
            '{"evt":"mtp_accept","iter":1,"n_accepted":2}\n')
    cases = {
        # line 3: a draft never verified (no accept with iter 2)
        "draft": pair + '{"evt":"mtp_draft","iter":2,"seq_id":0,"id_last":7,"attn_pos":12,"drafts":[4,5]}\n',
        # line 3: an accept whose iter has no draft
        "accept": pair + '{"evt":"mtp_accept","iter":9,"n_accepted":1}\n',
    }
    for name, text in cases.items():
        src = tmp_path / f"{name}.ndjson"
        src.write_text(text)
        res = runner.invoke(app, ["import", "fork-ndjson", str(src), "--out", str(tmp_path / name)])
        assert res.exit_code == 1, (name, res.output)
        assert "1 round, 3 steps" in res.stdout                       # the joined pair is still imported
        warned = [ln for ln in res.stderr.splitlines() if ln.startswith("warning: ")]
        other = "mtp_draft" if name == "accept" else "mtp_accept"
        assert len(warned) == 1 and str(src) in warned[0], res.stderr
        assert f"1 mtp_{name} events without an {other}" in warned[0] and "lines 3" in warned[0], warned
    clean = tmp_path / "clean.ndjson"
    clean.write_text(pair)
    res = runner.invoke(app, ["import", "fork-ndjson", str(clean), "--out", str(tmp_path / "c")])
    assert res.exit_code == 0 and res.stderr == "", res.output


def test_explain_on_a_fork_import_counts_its_rejections_as_unknown(tmp_path: Path) -> None:
    """The fork's NDJSON has no target tokens, so each first mismatch's cause is `unknown` (docs/EXPLAIN.md §1):
    by hand, rounds 2/3 and 0/3 accepted have a first mismatch, 3/3 none -> `unknown 2` (100 %) under the heading
    (was: the heading and nothing under it); the manifest records no target GGUF, so no claim that it moved."""
    src = tmp_path / "fork.ndjson"
    src.write_text("\n".join([
        '{"evt":"mtp_draft","iter":12,"seq_id":0,"id_last":818,"attn_pos":41,"drafts":[2461,531,1010]}',
        '{"evt":"mtp_accept","iter":12,"n_accepted":2}',
        '{"evt":"mtp_draft","iter":13,"seq_id":0,"id_last":1010,"attn_pos":44,"drafts":[5,6,7]}',
        '{"evt":"mtp_accept","iter":13,"n_accepted":0}',
        '{"evt":"mtp_draft","iter":14,"seq_id":0,"id_last":9,"attn_pos":45,"drafts":[5,6,7]}',
        '{"evt":"mtp_accept","iter":14,"n_accepted":3}']) + "\n")
    assert runner.invoke(app, ["import", "fork-ndjson", str(src), "--out", str(tmp_path / "t")]).exit_code == 0
    res = runner.invoke(app, ["explain", str(tmp_path / "t")])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("Why drafts were rejected"))
    assert "2 rounds had a first mismatch (0 with a known target token)" in lines[head]
    assert lines[head + 1].split() == ["unknown", "2", "100.0", "%"], lines[head:head + 3]
    assert "the trace records no target GGUF" in res.stdout and "recorded path" not in res.stdout
