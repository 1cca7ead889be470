"""Deep links, the one prompt selection across pages, and the new-user fixes of issue 27, in AppTest on the
demo (the trained pair's F32 trace as trace A, its buggy-RoPE trace as trace B).

Expected values come from the trace's Parquet parts read with pyarrow, the manifest read as JSON, the GGUFs
read with gguf-py, and demo.json's description of the planted bug — never from the page under test.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest

from mtpscope.app import selection
from mtpscope.cli.serve import main_script

MAIN = str(main_script())
TIMEOUT = 180


@pytest.fixture(scope="module")
def demo(demo_dir):
    if not (Path(demo_dir.root) / "trained" / "traces" / "f32" / "manifest.json").exists():
        pytest.skip("trained demo traces not built (llama-cpp-python missing)")
    return demo_dir


def _trace(demo, name: str = "f32") -> Path:
    return Path(demo.root) / "trained" / "traces" / name


def _rounds(trace: Path):
    """Rounds straight from the Parquet parts (pyarrow), not through mtpscope.traces."""
    return pa.concat_tables([pq.read_table(p) for p in sorted((trace / "rounds").glob("*.parquet"))]).to_pandas()


def _app(**slots) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    for k, v in slots.items():
        at.session_state[selection.slot_key(k)] = None if v is None else str(v)
    at.run()  # the start page (/)
    at.switch_page("screens/files.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _open(at: AppTest, page: str, **query) -> AppTest:
    """Open ``page`` as a link would (its query string), or as the sidebar does (no query string)."""
    at.switch_page(f"screens/{page}.py")
    at.query_params.clear()
    at.query_params.update({k: str(v) for k, v in query.items()})
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _round_line(at: AppTest) -> str:
    return next((m.value for m in at.markdown if m.value.startswith("**prompt ")), "")


# ------------------------------------------------------------------------------------------ deep links

def test_a_step_link_opens_its_prompt_round_and_step(demo) -> None:
    r = _rounds(_trace(demo))
    row = r[(r["prompt_id"] == 3) & (r["n_draft"] >= 2)].iloc[1]
    pid, rnd = int(row["prompt_id"]), int(row["round"])
    at = _open(_app(), "step", prompt=pid, round=rnd, step=2)
    assert _round_line(at).startswith(f"**prompt {pid} · round {rnd}**")
    assert at.selectbox(key=selection.STEP_PROMPT).value == pid
    assert at.number_input(key=selection.STEP_ROUND).value == rnd
    assert any("draft step **k=2**" in m.value for m in at.markdown)
    # the address bar now holds the whole view: the trace too
    assert at.query_params == {"trace": str(_trace(demo)), "prompt": str(pid), "round": str(rnd), "step": "2"}
    assert not at.error


@pytest.mark.parametrize("query, line", [
    ({"prompt": "abc"}, "'prompt': link value is not an integer (expected a prompt id (an integer >= 0), got 'abc')"),
    ({"prompt": "34", "round": "999999"}, "'round': no such round of prompt 34 (expected a round 0–{hi}, got 999999)"),
    ({"prompt": "36"}, "'prompt': no such prompt in this trace (expected a prompt 0–35, got 36)"),
    ({"prompt": "34", "round": "0", "step": "9"},
     "'step': no such draft step in prompt 34, round 0 (expected a step 1–{nd}, got 9)"),
    ({"trace": "/etc"}, "'trace': /etc: outside the allowed folders"),
])
def test_a_bad_link_is_refused_in_one_line_and_shows_nothing_else(demo, query, line) -> None:
    r = _rounds(_trace(demo))
    p34 = r[r["prompt_id"] == 34]
    line = line.format(hi=int(p34["round"].max()), nd=int(p34[p34["round"] == 0]["n_draft"].iloc[0]))
    at = _open(_app(), "step", **query)
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and errors[0].startswith(line) and "\n" not in errors[0], errors
    assert _round_line(at) == "" and not at.dataframe  # not prompt 0, round 0 (nor anything else) under it
    assert at.session_state[selection.slot_key(selection.TRACE)] == str(_trace(demo))  # selection kept


def test_link_of_another_trace_selects_it_and_its_models(demo) -> None:
    buggy = _trace(demo, "buggy")
    man = json.loads((buggy / "manifest.json").read_text())
    at = _open(_app(), "explain", trace=buggy, prompt="all")
    assert at.session_state[selection.slot_key(selection.TRACE)] == str(buggy)
    assert at.session_state[selection.slot_key(selection.DRAFTER)] == man["models"]["assistant"]["path"]
    assert at.selectbox(key=selection.EXP_PROMPT).value == "all"
    assert "`demo/trained/traces/buggy`" in " ".join(c.value for c in at.sidebar.caption)


# ------------------------------------------------------------------------------- one prompt selection

def test_one_prompt_selection_across_pages(demo) -> None:
    at = _app()
    _open(at, "acceptance")
    at.selectbox(key=selection.ACC_PROMPT).set_value(7).run()
    assert at.query_params["prompt"] == "7"
    _open(at, "text")
    assert at.selectbox(key=selection.TEXT_PROMPT).value == 7
    _open(at, "step")
    assert at.selectbox(key=selection.STEP_PROMPT).value == 7 and _round_line(at).startswith("**prompt 7 · ")
    _open(at, "explain")
    assert at.selectbox(key=selection.EXP_PROMPT).value == 7
    at.selectbox(key=selection.EXP_PROMPT).set_value("all").run()
    _open(at, "acceptance")
    assert at.selectbox(key=selection.ACC_PROMPT).value == "all"
    _open(at, "text")  # one prompt at a time: while every prompt is selected, the selected round's prompt
    assert at.selectbox(key=selection.TEXT_PROMPT).value == 7
    at.selectbox(key=selection.TEXT_PROMPT).set_value(12).run()
    _open(at, "compare")
    at.radio(key=selection.CMP_MODE).set_value("two prompts of one trace").run()
    assert at.selectbox(key=selection.CMP_PROMPT_A).value == 12
    assert at.query_params["mode"] == "prompts" and at.query_params["prompt"] == "12"


def _worst_by_hand(r, prompt_id=None) -> tuple[int, int]:
    """The round that lost the most drafts; among those the one opening the longest run of drafting rounds
    that accepted nothing; then the earliest — walked round by round."""
    if prompt_id is not None:
        r = r[r["prompt_id"] == prompt_id]
    r = r.sort_values(["prompt_id", "round"])
    rows = list(zip(r["prompt_id"], r["round"], r["n_draft"], r["n_accepted"]))
    lost_max = max(nd - na for _, _, nd, na in rows)
    best = None
    for i, (p, rd, nd, na) in enumerate(rows):
        if nd - na != lost_max:
            continue
        prev = next(((q, nd2, na2) for q, _, nd2, na2 in reversed(rows[:i]) if q == p and nd2 > 0), None)
        run = 0
        if na == 0 and nd > 0 and not (prev and prev[2] == 0):  # a zero-acceptance run starts here
            for q, _, nd2, na2 in rows[i:]:
                if q != p:
                    break
                if nd2 == 0:
                    continue
                if na2 != 0:
                    break
                run += 1
        key = (-run, int(p), int(rd))
        best = key if best is None or key < best else best
    return best[1], best[2]


def test_worst_round_jump_on_acceptance_and_step(demo) -> None:
    r = _rounds(_trace(demo))
    at = _open(_app(), "acceptance")
    at.selectbox(key=selection.ACC_PROMPT).set_value("all").run()
    at.button(key=selection.ACC_WORST).click().run()
    want = _worst_by_hand(r)
    assert at.session_state[selection.SEL_ROUND] == want
    _open(at, "step")
    assert _round_line(at).startswith(f"**prompt {want[0]} · round {want[1]}**")
    at.selectbox(key=selection.STEP_PROMPT).set_value(20).run()
    at.button(key=selection.STEP_WORST).click().run()
    w20 = _worst_by_hand(r, 20)
    assert _round_line(at).startswith(f"**prompt 20 · round {w20[1]}**")


# ------------------------------------------------------------------------------------ new-user fixes

def test_a_round_typed_past_the_last_is_refused_and_next_clears_it(demo) -> None:
    r = _rounds(_trace(demo))
    hi = int(r[r["prompt_id"] == 0]["round"].max())
    at = _open(_app(), "step", prompt=0, round=0)
    at.number_input(key=selection.STEP_ROUND).set_value(hi + 1000).run()
    assert [e.value for e in at.error] == [f"round {hi + 1000}: prompt 0 has rounds 0–{hi}"]
    at.button(key=selection.STEP_PREV).click().run()  # the closest rejected round before it
    assert not at.error and _round_line(at).startswith("**prompt 0 · ")


def test_refused_path_is_not_shown_as_selected(demo) -> None:
    at = _app()
    _, text, _ = selection.picker_keys(selection.TRACE)
    at.text_input(key=text).input("/etc").run()
    assert any("outside the allowed folders" in e.value for e in at.error)
    side = " ".join(c.value for c in at.sidebar.caption)
    assert "`/etc`" not in side and "`demo/trained/traces/f32`" in side
    assert at.session_state[selection.slot_key(selection.TRACE)] == str(_trace(demo))


def test_bad_zip_upload_hides_the_previous_traces_numbers(demo, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MTPSCOPE_UPLOADS", str(tmp_path / "uploads"))
    at = _app()
    labels = [m.label for m in at.metric]
    assert "rounds" in labels  # the selected trace's summary, before the upload
    bad = io.BytesIO()
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("notes.txt", "not a trace")
    up = next(u for u in at.get("file_uploader") if "trace" in u.proto.label)
    up.upload("bad.zip", bad.getvalue(), "application/zip")
    at.run()
    errs = [e.value for e in at.error]
    assert any(e.startswith("upload refused:") and "manifest" in e for e in errs), errs
    assert "rounds" not in [m.label for m in at.metric] and "source" not in [m.label for m in at.metric]
    assert any("selection is unchanged" in c.value and "traces/f32" in c.value for c in at.caption)


def test_prompt_text_keeps_its_newlines(demo) -> None:
    man = json.loads((_trace(demo) / "manifest.json").read_text())
    p = next(p for p in man["prompts"] if "\n" in p["text"])
    at = _open(_app(), "text", prompt=p["prompt_id"])
    # every inner line break and indentation as written (st.code drops a trailing newline only)
    assert [c.value for c in at.code] == [p["text"].rstrip("\n")] and "\n    " in at.code[0].value


def test_token_id_past_the_vocabulary_is_no_such_token(demo) -> None:
    import gguf

    fork = Path(demo.root) / "trained" / "drafter-fork.gguf"
    n_vocab = len(gguf.GGUFReader(str(fork)).fields["tokenizer.ggml.tokens"].data)
    at = _app(drafter=fork)
    at.switch_page("screens/centroids.py").run()
    at.text_input(key=selection.CENT_QUERY).input(f"#{n_vocab}").run()
    assert [w.value for w in at.warning if "no such token" in w.value] == [
        f"no such token: #{n_vocab} — the head's vocabulary has {n_vocab:,} tokens (ids 0–{n_vocab - 1:,})"]
    assert not any("-1" in str(v) for d in at.dataframe for v in d.value.get("centroid", []))


def test_values_page_mean_is_readable(demo) -> None:
    import gguf

    drafter = Path(demo.root) / "trained" / "drafter.gguf"
    at = _app(drafter=drafter)
    at.switch_page("screens/values.py").run()
    name = at.selectbox(key=selection.VALUES_TENSOR).value
    t = next(t for t in gguf.GGUFReader(str(drafter)).tensors if t.name == name)
    a = np.asarray(t.data, dtype=np.float64).reshape(list(reversed([int(x) for x in t.shape])))[:256]
    vals = {m.label: m.value for m in at.metric}
    for key, want in (("mean", a.mean()), ("min", a.min()), ("max", a.max()), ("std", a.std())):
        assert len(vals[key]) <= 9, vals  # fits its box: "-0.0005663" was cut to "-0.000…"
        assert float(vals[key]) == pytest.approx(want, rel=6e-3, abs=1e-9), (key, vals[key], want)


def test_compare_marks_the_difference_verify_explains(demo) -> None:
    import gguf

    doc = json.loads((Path(demo.root) / "demo.json").read_text())
    bug = next(m for m in doc["models"] if m.get("role") == "drafter-buggy")
    assert "rope.freq_base_swa" in bug["bug"]
    reader = gguf.GGUFReader(str(Path(demo.root) / bug["path"]))
    key = next(k for k in reader.fields if k.endswith(".rope.freq_base_swa"))
    at = _open(_app(), "compare")
    table = next(d.value for d in at.dataframe if "verify" in d.value.columns)
    first = table.iloc[0]
    assert first["name"] == key and float(first["B"]) == float(reader.fields[key].contents())
    assert "E_PAIR_ROPE" in first["verify"] and first["verify"].startswith("B: ✗")
    assert (table["verify"].iloc[1:] == "").all()  # the other differences: nothing verify says about them
    assert any(w.value.startswith(f"Likely cause: `{key}`") for w in at.warning)


def test_long_text_tables_wrap(demo) -> None:
    at = _open(_app(), "explain")
    why = next(d for d in at.dataframe if "why" in d.value.columns)
    assert why.proto.row_height > 64  # Streamlit's grid wraps a cell's text only in rows over 4rem
    _open(at, "step", prompt=34, round=0)
    steps = next(d for d in at.dataframe if "verdict" in d.value.columns)
    assert steps.proto.row_height > 64


def test_a_values_link_opens_its_tensor(demo) -> None:
    import gguf

    drafter = Path(demo.root) / "trained" / "drafter.gguf"
    name = [t.name for t in gguf.GGUFReader(str(drafter)).tensors if t.name.endswith("ffn_up.weight")][0]
    at = _open(_app(), "values", drafter=drafter, tensor=name)
    assert at.selectbox(key=selection.VALUES_TENSOR).value == name and not at.error
    at = _open(_app(), "values", drafter=drafter, tensor="blk.99.nope")
    assert [e.value for e in at.error] == [
        f"'tensor': no such tensor in demo/trained/drafter.gguf (expected one of its "
        f"{len(gguf.GGUFReader(str(drafter)).tensors)} tensors, got 'blk.99.nope')"]
