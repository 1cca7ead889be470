"""Importers on hand-written fork NDJSON and llama-server logs (expected values worked out by hand)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtpscope import traces
from mtpscope.errors import ImportFormatError
from mtpscope.traces.analysis.metrics import report
from mtpscope.traces.importers import import_fork_ndjson, import_server_log

FORK_LINES = [
    '{"evt":"mtp_draft","iter":1,"path":"sync","seq_id":0,"id_last":818,"h_idx":0,"attn_pos":57,"n_steps":3,"h_l2":93.5,"drafts":[10,11,12]}',  # 1
    '{"evt":"mtp_accept","iter":1,"n_accepted":2,"n_drafted_prev":3}',                                  # 2
    "llama_decode: some other log output",                                                              # 3 ignored
    '{"evt":"mtp_draft","iter":2,"path":"lazy","seq_id":0,"id_last":12,"attn_pos":60,"drafts":[20,21,22]}',  # 4
    '{"evt":"mtp_accept","iter":2,"n_accepted":0,"n_drafted_prev":3}',                                  # 5
    '{"evt":"mtp_draft","iter":3,"drafts":[30,31,32]',                                                  # 6 bad
    '{"evt":"mtp_accept","iter":3,"n_accepted":1}',                                                     # 7 no draft
    "",                                                                                                 # 8 blank
    '{"evt":"mtp_draft","iter":4,"path":"skip-streak","seq_id":0,"id_last":7,"attn_pos":61,"drafts":[]}',   # 9
    '{"evt":"mtp_accept","iter":4,"n_accepted":0,"n_drafted_prev":0}',                                  # 10
    '{"evt":"mtp_draft","iter":5,"seq_id":0,"id_last":8,"attn_pos":62,"drafts":[50,51,52]}',           # 11
    '{"evt":"mtp_accept","iter":5,"n_accepted":3,"n_drafted_prev":2}',                                  # 12 prev differs
    '{"evt":"mtp_draft","iter":"6","seq_id":0,"id_last":8,"attn_pos":66,"drafts":[1]}',                # 13 bad
    '{"evt":"mtp_accept","iter":5,"n_accepted":1}',                                                     # 14 no draft
    '{"evt":"other_evt","x":1}',                                                                        # 15 ignored
    "[1, 2]",                                                                                           # 16 bad
    '{"iter": 3}',                                                                                      # 17 bad
    '{"evt":"mtp_draft","iter":1,"seq_id":0,"id_last":100,"attn_pos":5,"drafts":[60,61]}',             # 18 new run
    'stderr: {"evt":"mtp_accept","iter":1,"n_accepted":1,"n_drafted_prev":2}',                          # 19 prefixed
    '{"evt":"mtp_draft","iter":2,"seq_id":0,"id_last":101,"attn_pos":7,"drafts":[70,71]}',             # 20 no accept
    '{"evt":"mtp_draft","iter":3,"seq_id":1,"id_last":1,"attn_pos":9,"drafts":[80]}',                  # 21 no accept
    '{"evt":"mtp_accept","iter":3,"n_accepted":2}',                                                     # 22 bad: 2 > 1
]


def _write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def test_fork_ndjson(tmp_path: Path) -> None:
    src = _write(tmp_path, "mtp.ndjson", FORK_LINES)
    res = import_fork_ndjson(src, tmp_path / "t")
    assert res.n_lines == 22
    assert [ln for ln, _ in res.bad_lines] == [6, 13, 16, 17, 22]
    assert "invalid JSON" in res.bad_lines[0][1]
    assert "'iter'" in res.bad_lines[1][1]
    assert "exceeds" in res.bad_lines[4][1]
    assert res.n_bad == 5 and res.n_ignored == 2
    # 5 rounds: drafts on lines 1, 4, 9, 11, 18 and accepts on 2, 5, 10, 12, 19
    assert res.n_used == 10
    assert (res.n_rounds, res.n_steps) == (5, 11)
    w = "\n".join(res.warnings)
    assert "2 mtp_accept events without an mtp_draft (lines 7, 14)" in w
    assert "2 mtp_draft events without an mtp_accept (not imported; lines 20, 21)" in w
    assert "n_drafted_prev differs" in w and "lines 12" in w
    assert "2 runs appended" in w

    t = traces.open(tmp_path / "t")
    assert t.manifest["source"] == "fork-ndjson" and t.manifest["complete"] is True
    r = t.rounds
    assert list(r["prompt_id"]) == [0, 0, 0, 0, 1]
    assert list(r["round"]) == [0, 1, 2, 3, 0]
    assert list(r["n_draft"]) == [3, 3, 0, 3, 2]
    assert list(r["n_accepted"]) == [2, 0, 0, 3, 1]
    assert list(r["pos"]) == [57, 60, 61, 62, 5]
    assert list(r["pending_token"]) == [818, 12, 7, 8, 100]
    assert list(r["drafted"][3]) == [50, 51, 52]
    assert list(r["draft_path"][:3]) == ["sync", "lazy", "skip-streak"]
    assert r["h_l2"][0] == pytest.approx(93.5)
    # never invented: no target, emitted or timings
    assert r["target"].isna().all() and r["emitted"].isna().all() and r["t_verify_ms"].isna().all()
    s = t.steps
    assert list(s["token"]) == [10, 11, 12, 20, 21, 22, 50, 51, 52, 60, 61]
    assert list(s["k"]) == [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2]
    assert list(s["accepted"]) == [True, True, False, False, False, False, True, True, True, True, False]
    assert s["target_token"].isna().all() and s["logit"].isna().all()

    rep = report(t)
    assert (rep.n_rounds, rep.n_drafted, rep.n_accepted) == (5, 11, 6)
    assert rep.acceptance_rate == pytest.approx(6 / 11)
    assert rep.mean_acceptance_length == pytest.approx(2.5)      # 1 + 6 / 4 verify rounds


def test_fork_ndjson_nothing_usable(tmp_path: Path) -> None:
    src = _write(tmp_path, "junk.ndjson", ["hello", '{"evt": "mtp_draft", "iter": 1}', "[]"])
    with pytest.raises(ImportFormatError, match=r"junk.ndjson.*no usable.*3 lines: 2 bad, 1 ignored.*first bad line 2"):
        import_fork_ndjson(src, tmp_path / "t")
    assert not (tmp_path / "t").exists()
    with pytest.raises(ImportFormatError, match="no such file"):
        import_fork_ndjson(tmp_path / "missing.ndjson", tmp_path / "t")



def test_fork_ndjson_negative_id_last_is_a_bad_line_not_an_unreadable_trace(tmp_path: Path) -> None:
    """``id_last`` becomes the round's ``pending_token``, a token id the trace reader refuses below 0: such a draft
    is a bad line (named by number) and the rest imports into a trace that reads (it was imported, then refused)."""
    src = _write(tmp_path, "neg.ndjson", [
        '{"evt":"mtp_draft","iter":1,"seq_id":0,"id_last":5,"attn_pos":9,"drafts":[1,2]}',       # 1
        '{"evt":"mtp_accept","iter":1,"n_accepted":1}',                                           # 2
        '{"evt":"mtp_draft","iter":2,"seq_id":0,"id_last":-1,"attn_pos":11,"drafts":[3]}',       # 3 bad
    ])
    res = import_fork_ndjson(src, tmp_path / "t")
    assert res.bad_lines == ((3, "mtp_draft: 'id_last' missing or not a token id"),)
    assert list(traces.open(tmp_path / "t").rounds["pending_token"]) == [5]

SERVER_LINES = [
    "main: server is listening on http://127.0.0.1:8080",                                                # 1
    "slot print_timing: id  0 | task 12 | ",                                                             # 2
    "draft acceptance rate = 0.57143 (    4 accepted /     7 generated)",                                 # 3
    "slot print_timing: id  1 | task 15 | draft acceptance = 0.75000 (    3 accepted /     4 generated), mean len =  2.50",  # 4
    "draft acceptance rate = 0.90000 (    4 accepted /     7 generated)",                                 # 5 bad
    "draft acceptance rate = oops",                                                                      # 6 bad
    '{"content":"hi","id_slot":0,"timings":{"prompt_n":5,"prompt_ms":12.5,"predicted_n":20,"predicted_ms":100.0,"draft_n":12,"draft_n_accepted":9}}',  # 7
    'data: {"content":"","id_slot":1,"timings":{"prompt_n":3,"prompt_ms":1.0,"predicted_n":8,"predicted_ms":50.0,"draft_n":6,"draft_n_accepted":2}}',  # 8
    '{"content":"x","timings":{"prompt_n":3}}',                                                          # 9 ignored
    '{"timings": {"draft_n": 3, "draft_n_accepted": 5}}',                                                # 10 bad
    '{"timings": {"draft_n": 3, broken',                                                                 # 11 bad
]


def test_server_log(tmp_path: Path) -> None:
    src = _write(tmp_path, "server.log", SERVER_LINES)
    res = import_server_log(src, tmp_path / "t")
    assert [ln for ln, _ in res.bad_lines] == [5, 6, 10, 11]
    assert "disagrees with 4 / 7 = 0.57143" in res.bad_lines[0][1]
    assert (res.n_used, res.n_requests, res.n_ignored) == (4, 4, 3)      # ignored: lines 1, 2, 9
    t = traces.open(tmp_path / "t")
    assert t.manifest["source"] == "server-log"
    q = t.requests
    assert list(q["line"]) == [3, 4, 7, 8]
    assert list(q["kind"]) == ["log", "log", "response", "response"]
    assert list(q["id_slot"]) == [0, 1, 0, 1]
    assert list(q["id_task"][:2]) == [12, 15] and q["id_task"][2:].isna().all()
    assert list(q["n_drafted"]) == [7, 4, 12, 6]
    assert list(q["n_accepted"]) == [4, 3, 9, 2]
    assert list(q["acceptance_rate"]) == pytest.approx([4 / 7, 0.75, 0.75, 1 / 3])
    assert q["mean_acceptance_length"][1] == 2.5
    assert q["predicted_ms"][2] == 100.0 and q["prompt_n"][3] == 3
    assert len(t.rounds) == 0 and len(t.steps) == 0
    rep = report(t)
    assert rep.requests.kind == "response"
    assert (rep.n_drafted, rep.n_accepted) == (18, 11)
    assert rep.acceptance_rate == pytest.approx(11 / 18)
    assert rep.mean_acceptance_length is None
    assert any("both log lines and response timings" in w for w in res.warnings)


def test_server_log_nothing_usable(tmp_path: Path) -> None:
    src = _write(tmp_path, "s.log", ["nothing here", "draft acceptance rate = x"])
    with pytest.raises(ImportFormatError, match="first bad line 2"):
        import_server_log(src, tmp_path / "t")


@pytest.mark.parametrize("lines", [['{', '  "timings": {"draft_n": 4, "draft_n_accepted": 2}', '}'],
                                   ['[{"timings": {"draft_n": 4, "draft_n_accepted": 2}}]']])
def test_server_responses_not_one_object_per_line_are_said_so(tmp_path: Path, lines: list[str]) -> None:
    """`curl | jq` output (pretty-printed) or a JSON array of responses: the refusal says responses are read one
    object per line (before: only "no ... found, N ignored")."""
    src = _write(tmp_path, "r.json", lines)
    with pytest.raises(ImportFormatError, match=r"JSON responses are read one object per line \(`jq -c \.`"):
        import_server_log(src, tmp_path / "t")
    with pytest.raises(ImportFormatError, match=r"\(1 line: 0 bad, 1 ignored\)" if len(lines) == 1 else r"\(3 lines"):
        import_server_log(src, tmp_path / "t")


def test_fork_ndjson_prompts_repeats_and_slots(tmp_path: Path) -> None:
    d = '{{"evt":"mtp_draft","iter":{it},"path":"sync","seq_id":{s},"id_last":{last},"h_idx":-1,"attn_pos":{pos},"n_steps":2,"h_l2":1.2500,"drafts":[{a},{b}]}}'
    a = '{{"evt":"mtp_accept","iter":{it},"n_accepted":{n},"n_drafted_prev":2}}'
    lines = [
        d.format(it=0, s=0, last=1, pos=10, a=5, b=6), a.format(it=0, n=2),      # 1, 2
        d.format(it=1, s=0, last=6, pos=13, a=7, b=8), a.format(it=1, n=0),      # 3, 4
        d.format(it=2, s=0, last=9, pos=4, a=1, b=2), a.format(it=2, n=1),       # 5, 6: attn_pos down -> new prompt
        d.format(it=3, s=0, last=2, pos=6, a=3, b=4),                            # 7: never verified
        d.format(it=3, s=0, last=2, pos=6, a=3, b=9), a.format(it=3, n=1),       # 8, 9: same iter again
        d.format(it=0, s=1, last=7, pos=20, a=11, b=12), a.format(it=0, n=2),    # 10, 11: second slot
    ]
    res = import_fork_ndjson(_write(tmp_path, "m.ndjson", lines), tmp_path / "t")
    assert res.n_bad == 0
    w = "\n".join(res.warnings)
    assert "without an mtp_accept (not imported; lines 7)" in w
    assert "drafts from 2 seq_ids" in w
    t = traces.open(tmp_path / "t")
    r = t.rounds
    assert list(r["prompt_id"]) == [0, 0, 1, 1, 2]
    assert list(r["round"]) == [0, 1, 0, 1, 0]
    assert list(r["n_accepted"]) == [2, 0, 1, 1, 2]
    assert list(r["drafted"][3]) == [3, 9]
    assert [(p["seq_id"], p["segment"], p["first_line"]) for p in t.manifest["prompts"]] == [
        (0, 0, 1), (0, 0, 5), (1, 0, 10)]


def test_out_of_range_integers_and_deep_nesting_are_bad_lines(tmp_path: Path) -> None:
    """Values that do not fit the trace's integer columns, and JSON nested past Python's recursion
    limit, are counted as bad lines (with their numbers), never a crash."""
    from mtpscope.traces.importers import import_fork_ndjson, import_server_log

    big = 2 ** 70
    srv = tmp_path / "srv.log"
    srv.write_text(
        "draft acceptance rate = 0.50000 (    1 accepted /     2 generated)\n"                    # 1 good
        f"id {big} | task -1 | draft acceptance rate = 0.50000 (  1 accepted /   2 generated)\n"  # 2 bad
        f'data: {{"timings": {{"draft_n": {big}, "draft_n_accepted": 2}}}}\n'                      # 3 bad
        + "{" + '"a":' * 1 + "[" * 100_000 + "\n",                                               # 4 bad
        encoding="utf-8")
    res = import_server_log(srv, tmp_path / "s")
    assert [ln for ln, _ in res.bad_lines] == [2, 3, 4]
    fork = tmp_path / "f.ndjson"
    fork.write_text(
        '{"evt":"mtp_draft","iter":1,"seq_id":0,"id_last":5,"attn_pos":9,"drafts":[1,2]}\n'        # 1 good
        '{"evt":"mtp_accept","iter":1,"n_accepted":1}\n'                                          # 2 good
        f'{{"evt":"mtp_draft","iter":2,"seq_id":{big},"id_last":5,"attn_pos":9,"drafts":[1]}}\n'  # 3 bad
        f'{{"evt":"mtp_accept","iter":2,"n_accepted":{big}}}\n'                                   # 4 bad
        + "[" * 100_000 + "\n",                                                                   # 5 bad
        encoding="utf-8")
    res = import_fork_ndjson(fork, tmp_path / "t")
    assert [ln for ln, _ in res.bad_lines] == [3, 4, 5]


# llama-server output around a request's end, as the vendored llama.cpp prints it
# (tools/server/server-context.cpp print_timing, common/speculative.cpp print_stats), plus an older
# server's layout: prefix-less timing and acceptance lines after a `print_timing` header
SERVER_TIMING_LINES = [
    "slot launch_slot_: id  0 | task 7 | processing task",                                               # 1
    "slot launch_slot_: id  1 | task 9 | processing task",                                               # 2
    "slot print_timing: id  0 | task 7 | ",                                                              # 3
    "prompt eval time =      86.38 ms /    13 tokens (    6.64 ms per token,   150.49 tokens per second)",  # 4
    "       eval time =    1284.26 ms /    99 tokens (   12.97 ms per token,    77.09 tokens per second)",  # 5
    "      total time =    1370.64 ms /   112 tokens",                                                  # 6
    "draft acceptance rate = 0.62500 (   40 accepted /    64 generated)",                                # 7 -> task 7
    "spec common_specu: statistics        draft-mtp: #calls(b,g,a) =    1     22     22, #gen drafts =     22, "
    "#acc drafts =    19, #gen tokens =     64, #acc tokens =    40, #mean acc len = 2.82, "
    "#acc rate/pos = (0.864, 0.591, 0.364), dur(b,g,a) = 0.010, 35.125, 1.500 ms",                      # 8 -> row of 7
    "slot print_timing: id  1 | task 9 | prompt eval time =  10.00 ms /  5 tokens",                      # 9
    "slot print_timing: id  1 | task 9 |        eval time = 100.00 ms / 12 tokens",                      # 10
    "slot print_timing: id  1 | task -1 | draft acceptance = 0.50000 (    4 accepted /     8 generated), mean len =  2.00",  # 11 -> task 9
    "spec common_specu: statistics           ngram: #calls(b,g,a) =    1      2      2, #gen drafts =      2, "
    "#acc drafts =     1, #gen tokens =      8, #acc tokens =     4",                                   # 12 ignored (not MTP)
    "spec common_specu: statistics              mtp: #calls(b,g,a) =    1      4      4, #gen drafts =      4, "
    "#acc drafts =     2, #gen tokens =      8, #acc tokens =     4",                                   # 13 -> row of 11
    "spec common_specu: statistics        draft-mtp: #calls(b,g,a) =    1      4      4, #gen drafts =      4, "
    "#acc drafts =     2, #gen tokens =      8, #acc tokens =     4",                                   # 14 ignored: row has stats
]


def test_server_log_acceptance_line_finds_its_request_and_statistics(tmp_path: Path) -> None:
    src = _write(tmp_path, "server.log", SERVER_TIMING_LINES)
    res = import_server_log(src, tmp_path / "t")
    # used: 2 acceptance lines, 2 statistics lines, 4 eval-time lines (4, 5, 9, 10)
    assert res.bad_lines == () and (res.n_used, res.n_requests, res.n_ignored) == (8, 2, 6)
    q = traces.open(tmp_path / "t").requests
    assert list(q["line"]) == [7, 11]
    # eval-time lines of the same request: prefix-less under task 7's header, and task 9's own prefix
    assert list(q["prompt_n"]) == [13, 5] and list(q["prompt_ms"]) == [86.38, 10.0]
    assert list(q["predicted_n"]) == [99, 12] and list(q["predicted_ms"]) == [1284.26, 100.0]
    assert q["tokens_per_s"][0] == 77.09 and q["tokens_per_s"][1:].isna().all()
    # line 7 stands four lines below its print_timing header (timing lines between); line 11 says task -1
    assert list(q["id_slot"]) == [0, 1] and list(q["id_task"]) == [7, 9]
    assert list(q["n_drafted"]) == [64, 8] and list(q["n_accepted"]) == [40, 4]
    assert list(q["spec_type"]) == ["draft-mtp", "mtp"]
    assert list(q["n_calls_begin"]) == [1, 1] and list(q["n_calls_draft"]) == [22, 4]
    assert list(q["n_calls_accept"]) == [22, 4]
    assert list(q["n_gen_drafts"]) == [22, 4] and list(q["n_acc_drafts"]) == [19, 2]
    assert list(q["n_gen_tokens"]) == [64, 8] and list(q["n_acc_tokens"]) == [40, 4]
    assert q["t_begin_ms"][0] == 0.010 and q["t_draft_ms"][0] == 35.125 and q["t_accept_ms"][0] == 1.5
    assert q["t_draft_ms"][1:].isna().all()      # no dur(...) printed for that one


def test_server_log_bad_statistics_line(tmp_path: Path) -> None:
    src = _write(tmp_path, "server.log", [
        "slot print_timing: id  0 | task 3 | draft acceptance = 0.50000 (    1 accepted /     2 generated), mean len =  1.50",
        "statistics        draft-mtp: #calls(b,g,a) = 1 1 1, #gen drafts = 1, #acc drafts = 2, #gen tokens = 2, "
        "#acc tokens = 1"])
    res = import_server_log(src, tmp_path / "t")
    assert [ln for ln, _ in res.bad_lines] == [2] and "more accepted than generated" in res.bad_lines[0][1]
    assert traces.open(tmp_path / "t").requests["spec_type"].isna().all()


def test_server_log_nan_acceptance_line_is_no_request(tmp_path: Path) -> None:
    """``draft acceptance = nan (0 accepted / 0 generated)`` (a slot releasing a task that drafted nothing, with
    task -1 once the task is gone) is no request: not an extra row for the task already imported, and the
    all-zero statistics line printed after it is not merged into that task's row."""
    src = _write(tmp_path, "server.log", [
        "slot print_timing: id  0 | task 3 | draft acceptance = 0.50000 (    1 accepted /     2 generated), mean len =  1.50",  # 1
        "slot print_timing: id  0 | task -1 | draft acceptance =    nan (    0 accepted /     0 generated), mean len =  1.00",  # 2
        "spec common_specu: statistics        draft-mtp: #calls(b,g,a) =    1      0      0, #gen drafts =      0, "
        "#acc drafts =     0, #gen tokens =      0, #acc tokens =     0",                                 # 3
        "draft acceptance rate = nan (0 accepted / 0 generated)",                                          # 4
    ])
    res = import_server_log(src, tmp_path / "t")
    assert res.bad_lines == () and res.n_requests == 1
    q = traces.open(tmp_path / "t").requests
    assert list(q["line"]) == [1] and list(q["id_task"]) == [3]
    assert list(q["n_drafted"]) == [2] and list(q["n_accepted"]) == [1]
    assert q["spec_type"].isna().all() and q["n_calls_begin"].isna().all()


def _doc_fields(doc: str, event: str) -> tuple[set[str], set[str]]:
    """(fields docs/TRACE_FORMAT.md says ``event`` needs, fields it says are optional): the backticked names of
    its sentence "A draft event needs ..." / "An accept event needs ..." and of the "Optional, ..." one after it."""
    import re

    text = " ".join(doc.split())
    m = re.search(rf"An? {event} event needs (.*?)\. Optional, checked when present: (.*?)\. ", text)
    assert m, f"docs/TRACE_FORMAT.md has no sentence on what a {event} event needs"
    return set(re.findall(r"`(\w+)`", m.group(1))), set(re.findall(r"`(\w+)`", m.group(2)))


def test_fork_ndjson_docs_name_exactly_the_required_fields(tmp_path: Path) -> None:
    """The importer section of docs/TRACE_FORMAT.md names exactly the fields an event cannot do without: for every
    field of the full example events (the fork's own), a line lacking it is a bad line if and only if the docs
    say the event needs it (they once said a draft needs only ``iter`` and ``drafts``)."""
    import json

    doc = (Path(__file__).resolve().parent.parent / "docs" / "TRACE_FORMAT.md").read_text(encoding="utf-8")
    full = {
        "draft": {"evt": "mtp_draft", "iter": 2, "path": "sync", "seq_id": 0, "id_last": 818, "h_idx": 0,
                  "attn_pos": 41, "n_steps": 3, "h_l2": 61.5, "drafts": [2461, 531, 1010]},
        "accept": {"evt": "mtp_accept", "iter": 2, "n_accepted": 2, "n_drafted_prev": 3},
    }
    # one good pair first (line 1, 2) keeps every file importable
    good = ['{"evt":"mtp_draft","iter":1,"seq_id":0,"id_last":5,"attn_pos":9,"drafts":[1]}',
            '{"evt":"mtp_accept","iter":1,"n_accepted":1}']
    for event, obj in full.items():
        needed, optional = _doc_fields(doc, event)
        assert needed and not needed & optional, (event, needed, optional)
        refused = set()
        for field in obj:
            if field == "evt":
                continue
            lines = {"draft": json.dumps(full["draft"]), "accept": json.dumps(full["accept"])}
            lines[event] = json.dumps({k: v for k, v in obj.items() if k != field})
            src = _write(tmp_path, f"{event}-{field}.ndjson", [*good, lines["draft"], lines["accept"]])
            res = import_fork_ndjson(src, tmp_path / f"t-{event}-{field}")
            bad = {ln for ln, _ in res.bad_lines}
            assert bad <= {3, 4}, (event, field, res.bad_lines)
            if bad == {3 if event == "draft" else 4}:
                refused.add(field)
        assert refused == needed, (event, refused, needed)
        assert optional <= set(obj) - needed, (event, optional)


def test_unreadable_numbers_are_bad_lines_never_a_crash_nor_a_stored_value(tmp_path: Path) -> None:
    """Numbers a log cannot mean are bad lines naming what was expected: integers of more digits than Python's
    int() reads (4300; it raised ValueError, an internal error), text the number patterns match that is no number
    (``.``: it raised too), and values that were stored: a negative or infinite ``mean len`` (llama.cpp prints
    1 + accepted / verify steps, so 1 to 1 + accepted), negative or infinite times, an ``h_l2`` past float32's
    largest (stored as inf) or below 0 (a norm)."""
    big = "1" * 5000
    good = "slot print_timing: id  0 | task 5 | draft acceptance rate = 0.50000 (    1 accepted /     2 generated)"
    srv = _write(tmp_path, "srv.log", [
        good,                                                                                            # 1
        f'{{"timings":{{"draft_n":{big},"draft_n_accepted":1}}}}',                                     # 2
        f"slot x: id {big} | task 5 | draft acceptance rate = 0.50000 (  1 accepted /  2 generated)",  # 3
        f"draft acceptance rate = 0.50000 (  {big} accepted /  2 generated)",                          # 4
        "draft acceptance = 0.50000 (  1 accepted /  2 generated), mean len = .",                      # 5
        "draft acceptance = 0.50000 (  1 accepted /  2 generated), mean len = -5",                     # 6
        "draft acceptance = 0.50000 (  1 accepted /  2 generated), mean len = 2.01",                   # 7 > 1 + 1
        "slot print_timing: id  0 | task 6 | prompt eval time = -86.0 ms / 13 tokens",                 # 8
        "slot print_timing: id  0 | task 6 |   eval time = 86.0 ms / 13 tokens (6.6 ms per token, . tokens per second)",  # 9
        f"slot print_timing: id  0 | task 6 |   eval time = 86.0 ms / {big} tokens",                   # 10
        '{"timings":{"draft_n":2,"draft_n_accepted":1,"predicted_per_second":-1}}',                   # 11
        '{"timings":{"draft_n":2,"draft_n_accepted":1,"prompt_n":"5"}}',                              # 12
        good,                                                                                            # 13
        "statistics draft-mtp: #calls(b,g,a) = 1 2 3, #gen drafts = 2, #acc drafts = 1, #gen tokens = 2, "
        "#acc tokens = 1, dur(b,g,a) = ., 1, 2 ms",                                                    # 14
        "draft acceptance = 0.75000 (  3 accepted /  4 generated), mean len = 4.00",                   # 15 good: 1 + 3
    ])
    res = import_server_log(srv, tmp_path / "s")
    assert [ln for ln, _ in res.bad_lines] == list(range(2, 13)) + [14]
    why = dict(res.bad_lines)
    assert why[2] == "invalid JSON (an integer of more than 4300 digits)"
    assert "mean len: expected a number from 1 to 2.00" in why[6] and why[6].endswith("got -5")
    assert why[8].endswith("got 13 tokens, -86.0 ms")
    assert why[11] == "timings.predicted_per_second: expected a finite number >= 0 or null, got -1"
    assert all(len(r) < 200 for r in why.values())
    rows = traces.open(tmp_path / "s").requests
    assert list(rows["line"]) == [1, 13, 15] and list(rows["mean_acceptance_length"].iloc[2:]) == [4.0]
    fork = _write(tmp_path, "f.ndjson", [
        '{"evt":"mtp_draft","iter":1,"id_last":5,"attn_pos":9,"drafts":[1,2],"h_l2":3.4e38}',          # 1 good
        '{"evt":"mtp_accept","iter":1,"n_accepted":1}',                                               # 2
        f'{{"evt":"mtp_draft","iter":{big},"id_last":5,"attn_pos":9,"drafts":[1]}}',                  # 3 bad
        '{"evt":"mtp_draft","iter":2,"id_last":5,"attn_pos":10,"drafts":[1],"h_l2":3.5e38}',           # 4 bad
        '{"evt":"mtp_draft","iter":3,"id_last":5,"attn_pos":11,"drafts":[1],"h_l2":-1.0}',            # 5 bad
    ])
    res = import_fork_ndjson(fork, tmp_path / "t")
    assert [ln for ln, _ in res.bad_lines] == [3, 4, 5]
    assert res.bad_lines[0][1] == "invalid JSON (an integer of more than 4300 digits)"
    assert res.n_rounds == 1
