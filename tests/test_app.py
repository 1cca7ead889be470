"""AppTest for every page of the Streamlit app on the demo data.

Each page must run without an exception and show the same key values as the libraries (reader,
inventory, validation, centroid head, traces.analysis.metrics.report) — and, for the acceptance numbers, the
same values as a direct pyarrow read of the trace's Parquet parts.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest

from mtpscope.app import selection
from mtpscope.cli.serve import main_script

MAIN = str(main_script())  # the entry script `mtpscope app` serves (packaged app/main.py)
TIMEOUT = 120


@pytest.fixture(scope="module")
def demo(demo_dir):
    """The built demo (mtpscope.demo.spec.DemoPaths); pages that need a trace skip without one."""
    return demo_dir


def _run(page: str | None = None, **slots) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    for k, v in slots.items():
        at.session_state[selection.slot_key(k)] = None if v is None else str(v)
    at.run()  # the start page (/)
    at.switch_page(f"screens/{page or 'files'}.py").run()  # no page: the Files page
    assert not at.exception, [e.value for e in at.exception]
    return at


def _metric(at: AppTest, label: str) -> str:
    vals = [m.value for m in at.metric if m.label == label]
    assert vals, f"no metric {label!r} in {[m.label for m in at.metric]}"
    return vals[0]


def _need_trace(demo) -> Path:
    if not (Path(demo.traces_clean) / "manifest.json").exists():
        pytest.skip("demo traces not built (llama-cpp-python missing)")
    return Path(demo.traces_clean)


def _decode_plotly(v):
    """A plotly JSON array (plain list, or typed array ``{"dtype", "bdata"}``) as a list of floats."""
    import base64

    import numpy as np

    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"])).astype(float).tolist()
    return [float(x) for x in v]


def _counts(rep) -> str:
    """'0 errors, 1 warning' for a validation report, pluralised by hand."""
    e, w = len(rep.errors), len(rep.warnings)
    return f"{e} error{'' if e == 1 else 's'}, {w} warning{'' if w == 1 else 's'}"


def _rounds_direct(trace: Path):
    """Rounds read straight from the Parquet parts with pyarrow (not through traces.store)."""
    import pyarrow as pa

    parts = sorted((trace / "rounds").glob("*.parquet"))
    return pa.concat_tables([pq.read_table(p) for p in parts]).to_pandas()


# ------------------------------------------------------------------------------------------ pages

def test_files_page_shows_reader_values(demo) -> None:
    from mtpscope.inspector.gguf import open_gguf
    from mtpscope.inspector.validate import verify

    at = _run(drafter=demo.drafter_fork, target=demo.target, trace=None)
    f = open_gguf(demo.drafter_fork)
    assert _metric(at, "tensors") == str(len(f.tensors))
    assert _metric(at, "architecture") == f.architecture == "gemma4_assistant"
    assert _metric(at, "dialect") == "fork"
    rep = verify(demo.drafter_fork, target=demo.target)
    lines = [s.value for s in at.success] + [w.value for w in at.warning]
    assert any(_counts(rep) in v and "fork" in v for v in lines)
    assert not at.error


def test_tensors_page_counts_equal_inventory(demo) -> None:
    from mtpscope.inspector.gguf import open_gguf
    from mtpscope.inspector.inventory import build_inventory

    at = _run("tensors", drafter=demo.drafter_fork)
    inv = build_inventory(open_gguf(demo.drafter_fork))
    assert _metric(at, "tensors") == str(inv.n_tensors) == "51"
    assert len(at.dataframe[0].value) == inv.n_tensors
    at.text_input(key=selection.TENSORS_GLOB).set_value("blk.0.*").run()
    assert len(at.dataframe[0].value) == len(inv.filter("blk.0.*"))
    at.text_input(key=selection.TENSORS_GLOB).set_value("").run()
    at.toggle(key=selection.TENSORS_FOCUS).set_value(True).run()
    names = set(at.dataframe[0].value["name"])
    assert names == {e.name for e in inv.entries if e.name.startswith(("mtp.", "nextn."))} and names
    assert not at.exception and not at.error


def test_validate_page_matches_verify(demo) -> None:
    from mtpscope.inspector.validate import verify

    at = _run("validate", drafter=demo.drafter_upstream, target=demo.target)
    rep = verify(demo.drafter_upstream, target=demo.target)
    head = [s.value for s in at.success] + [e.value for e in at.error]
    assert any(_counts(rep) in v for v in head)
    loads = {v.runtime: v.loads for v in rep.loadability}
    assert loads  # one verdict per runtime
    for runtime, ok in loads.items():
        box = at.success if ok else at.error
        assert any(runtime in b.value for b in box), (runtime, ok)
    assert any("pairs with" in s.value for s in at.success) == rep.pairing.ok


def test_centroids_page_matches_head_and_coverage(demo) -> None:
    from mtpscope.inspector.centroids import CentroidHead
    from mtpscope.inspector.gguf import open_gguf

    trace = _need_trace(demo)
    at = _run("centroids", drafter=demo.drafter_fork, trace=trace)
    head = CentroidHead.from_gguf(open_gguf(demo.drafter_fork))
    assert _metric(at, "centroids") == f"{head.n_centroids:,}"
    assert _metric(at, "tokens per centroid (vsc)") == str(head.vsc)
    st = pq.read_table(sorted((trace / "steps").glob("*.parquet"))[0],
                       columns=["prompt_id", "round", "k", "accepted", "target_in_candidates"]).to_pandas()
    # only steps the target checked: accepted, or the first rejection of their round
    first_rej = st[~st["accepted"].astype(bool)].groupby(["prompt_id", "round"])["k"].min()
    lim = st.set_index(["prompt_id", "round"]).index.map(lambda key: first_rej.get(key, 10 ** 9))
    steps = st.loc[st["k"].to_numpy() <= lim.to_numpy(), "target_in_candidates"].dropna()
    assert _metric(at, "steps whose target token was reachable") == f"{100 * (steps.mean()):.1f} %"
    # the browser lists centroid 0's tokens as text
    df = at.dataframe[0].value
    assert list(df["token id"]) == list(head.tokens_of(0))
    assert not at.error


def test_centroids_page_falls_back_to_the_traces_head(demo) -> None:
    trace = _need_trace(demo)
    at = _run("centroids", drafter=demo.drafter_upstream, trace=trace)
    assert any("has no centroid head" in c.value for c in at.caption)
    assert _metric(at, "centroids") == "2,048"


def test_values_page_stats(demo) -> None:
    import numpy as np

    from mtpscope.inspector.gguf import open_gguf

    at = _run("values", drafter=demo.drafter_upstream)
    name = at.selectbox(key=selection.VALUES_TENSOR).value
    a = open_gguf(demo.drafter_upstream).tensor_data(name, rows=slice(0, 256))
    # three significant digits (the boxes show every character)
    assert float(_metric(at, "max")) == pytest.approx(float(np.max(a)), rel=5e-3)
    assert float(_metric(at, "min")) == pytest.approx(float(np.min(a)), rel=5e-3)
    at.selectbox(key=selection.VALUES_TENSOR).set_value("token_embd.weight").run()
    assert not at.exception
    a = open_gguf(demo.drafter_upstream).tensor_data("token_embd.weight", rows=slice(0, 256))
    assert float(_metric(at, "max")) == pytest.approx(float(np.max(a)), rel=5e-3)


def test_acceptance_page_equals_report_and_parquet(demo) -> None:
    from mtpscope.traces.analysis import metrics
    from mtpscope.traces.store.reader import open_trace

    trace = _need_trace(demo)
    at = _run("acceptance", trace=trace)
    rep = metrics.report(open_trace(trace))
    r = _rounds_direct(trace)
    direct = r["n_accepted"].sum() / r["n_draft"].sum()
    assert _metric(at, "acceptance rate") == f"{100 * (rep.acceptance_rate):.1f} %" == f"{100 * (direct):.1f} %"
    verify_rounds = (r["n_draft"] > 0).sum()
    assert _metric(at, "mean acceptance length") == f"{1 + r['n_accepted'].sum() / verify_rounds:.3f}"
    assert _metric(at, "rounds") == f"{len(r):,}"
    # per-prompt table: worst first, one row per prompt
    table = at.dataframe[-1].value
    assert len(table) == r["prompt_id"].nunique()
    assert list(table["acceptance_rate"]) == sorted(table["acceptance_rate"])
    # choose a prompt: its own numbers
    pid = int(r["prompt_id"].iloc[-1])
    at.selectbox(key=selection.ACC_PROMPT).set_value(pid).run()
    sub = r[r["prompt_id"] == pid]
    assert _metric(at, f"prompt {pid}: acceptance rate") == f"{100 * (sub['n_accepted'].sum() / sub['n_draft'].sum()):.1f} %"


def test_step_page_shows_the_selected_round(demo) -> None:
    trace = _need_trace(demo)
    noisy = Path(demo.traces_noisy) if (Path(demo.traces_noisy) / "manifest.json").exists() else trace
    r = _rounds_direct(noisy)
    row = r[(r["n_accepted"] < r["n_draft"])].iloc[0] if (r["n_accepted"] < r["n_draft"]).any() else r.iloc[0]
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.session_state[selection.slot_key(selection.TRACE)] = str(noisy)
    at.session_state[selection.SEL_ROUND] = (int(row["prompt_id"]), int(row["round"]))
    at.run()
    at.switch_page("screens/step.py").run()
    assert not at.exception, [e.value for e in at.exception]
    df = next(d.value for d in at.dataframe if "verdict" in d.value.columns)
    nd, na = int(row["n_draft"]), int(row["n_accepted"])
    assert list(df["drafted_id"]) == [int(t) for t in row["drafted"]]
    # accepted up to n_accepted, then the first rejection, then steps the target never checked
    assert list(df["verdict"]) == ["✓ accepted"] * na + ["✗ rejected"] * (na < nd) + ["– not checked"] * max(0, nd - na - 1)
    checked = min(nd, na + 1)
    assert [int(t) for t in df["target_id"][:checked]] == [int(t) for t in row["target"][:checked]]
    assert df["target_id"][checked:].isna().all()
    assert at.number_input(key=selection.STEP_ROUND).value == int(row["round"])
    # hidden-state norms: the chart's ‖h‖ equals norms of the h column read straight from Parquet
    import json

    import numpy as np

    man = json.loads((noisy / "manifest.json").read_text())
    if (man.get("dims") or {}).get("hidden_dtype"):
        import pyarrow as pa

        st_ = pa.concat_tables([pq.read_table(p) for p in sorted((noisy / "steps").glob("*.parquet"))]).to_pandas()
        sel = st_[(st_["prompt_id"] == row["prompt_id"]) & (st_["round"] == row["round"])].sort_values("k")
        want = [float(np.linalg.norm(np.asarray(v, dtype=np.float64))) for v in sel["h"]]
        fig = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                   if "norms" in json.dumps(json.loads(c.proto.spec)["layout"].get("title", "")))
        tr_h = next(t for t in fig["data"] if t["name"] == "‖h‖")
        assert _decode_plotly(tr_h["y"]) == pytest.approx(want, rel=1e-6)


def test_compare_page_two_traces(demo) -> None:
    from mtpscope.traces.analysis import metrics
    from mtpscope.traces.store.reader import open_trace

    a = _need_trace(demo)
    b = Path(demo.traces_noisy)
    if not (b / "manifest.json").exists():
        pytest.skip("noisy demo trace not built")
    at = _run("compare", trace=a, trace_b=b)
    ra, rb = metrics.report(open_trace(a)), metrics.report(open_trace(b))
    rates = [m.value for m in at.metric if m.label.startswith("acceptance rate")]
    assert rates == [f"{100 * (ra.acceptance_rate):.1f} %", f"{100 * (rb.acceptance_rate):.1f} %"]
    at.radio(key=selection.CMP_MODE).set_value("two prompts of one trace").run()
    assert not at.exception


# ------------------------------------------------------------------------------------------ safety

@pytest.mark.parametrize("page", ["files", "tensors", "validate", "centroids", "values"])
def test_path_outside_roots_is_one_line_error(demo, page: str) -> None:
    at = _run(page, drafter="/etc/passwd", target=None, trace=None)
    errs = [e.value for e in at.error]
    assert errs and all("outside the allowed folders" in e and "\n" not in e for e in errs), errs


def test_missing_and_malformed_files_are_one_line_errors(demo, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MTPSCOPE_ROOTS", str(tmp_path))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOTGGUF" + b"\0" * 64)
    at = _run(None, drafter=bad, target=tmp_path / "missing.gguf", trace=tmp_path)
    errs = [e.value for e in at.error]
    assert any(str(bad) in e and "magic" in e.lower() for e in errs), errs
    assert any("missing.gguf" in e and "no such file" in e for e in errs), errs
    assert any("manifest" in e.lower() for e in errs), errs
    assert all("\n" not in e and "Traceback" not in e for e in errs)


def test_pages_without_selection_show_hints(demo) -> None:
    for page in ("tensors", "validate", "centroids", "values", "acceptance", "text", "step", "explain", "compare"):
        at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
        for k in ("drafter", "target", "trace", "trace_b", "checkpoint"):
            at.session_state[selection.slot_key(k)] = None
        at.session_state[selection.SEL_INIT] = True
        at.run()
        at.switch_page(f"screens/{page}.py").run()
        assert not at.exception, (page, [e.value for e in at.exception])
        if page != "centroids":  # the centroid page falls back to the demo's fork drafter
            assert at.info, page


def test_files_picker_and_typed_path_change_the_selection(demo) -> None:
    at = _run(drafter=demo.drafter_fork, target=None, trace=None)
    assert _metric(at, "tensors") == "51"
    pick, text, _ = selection.picker_keys(selection.DRAFTER)
    at.selectbox(key=pick).set_value(str(Path(demo.drafter_upstream).resolve())).run()
    assert not at.exception
    assert at.session_state[selection.slot_key(selection.DRAFTER)] == str(Path(demo.drafter_upstream).resolve())
    assert _metric(at, "tensors") == "49" and _metric(at, "dialect") == "upstream"
    at.text_input(key=text).set_value(str(demo.drafter_fork)).run()
    assert _metric(at, "tensors") == "51"
    at.text_input(key=text).set_value("/etc/passwd").run()
    assert any("outside the allowed folders" in e.value for e in at.error)


def test_long_trace_is_windowed(demo, tmp_path: Path, monkeypatch) -> None:
    import json

    from mtpscope.traces.synthetic import write_synthetic_trace

    t = write_synthetic_trace(tmp_path / "long", n_rounds=12_000, n_prompts=3, n_vocab=4096,
                              n_centroids=32, top_k=4, seed=1)
    monkeypatch.setenv("MTPSCOPE_ROOTS", str(tmp_path))
    at = _run("acceptance", trace=t, drafter=None, target=None)
    assert _metric(at, "rounds") == "12,000"
    metas = [json.loads(c.proto.spec)["layout"].get("meta") for c in at.get("plotly_chart")]
    modes = [(m or {}).get("mode") for m in metas]
    assert modes[:2] == ["bins", "marks"], modes
    assert metas[1]["n_rounds"] == 3000  # the clickable window, never all 12,000 marks
    at.slider(key=selection.ACC_WINDOW).set_value(6000).run()
    assert not at.exception
    assert json.loads(at.get("plotly_chart")[1].proto.spec)["layout"]["meta"]["n_rounds"] == 3000


@pytest.mark.slow
def test_compare_page_shows_replay_results(demo, tmp_path: Path, monkeypatch) -> None:
    import json

    pytest.importorskip("llama_cpp")
    from mtpscope.traces.run.replay import replay

    trace = _need_trace(demo)
    out = tmp_path / "replay"
    replay(Path(demo.traces_noisy) if (Path(demo.traces_noisy) / "manifest.json").exists() else trace,
           variants=["head=centroid"], out=out, max_rounds=4)
    summary = json.loads((out / "summary.json").read_text())
    monkeypatch.setenv("MTPSCOPE_ROOTS", f"{tmp_path}:{demo.root}")
    at = _run("compare", replay=out)
    table = next(d.value for d in at.dataframe if "variant" in d.value.columns)
    want = {"recorded": summary["recorded"]["acceptance_rate"],
            **{n: v["acceptance_rate"] for n, v in summary["variants"].items()}}
    assert dict(zip(table["variant"], table["acceptance_rate"])) == pytest.approx(want)
    buttons = [b for b in at.button if b.label.startswith("trace B = ")]
    assert {b.label for b in buttons} == {f"trace B = {n}" for n in summary["variant_traces"]}
    buttons[-1].click().run()
    assert not at.exception
    assert at.session_state[selection.slot_key(selection.TRACE_B)] == str((out / "traces").resolve() / Path(
        list(summary["variant_traces"].values())[-1]).name)


def test_validate_page_hf_audit(tmp_path: Path, monkeypatch) -> None:
    st_np = pytest.importorskip("safetensors.numpy")
    import json

    from mtpscope.inspector.hf_audit import audit as hf_audit
    from mtpscope.inspector.hf_checkpoint import read_checkpoint
    from tests import builders  # the HF checkpoint builders of the HF audit tests (same arrays as the demo)

    ck = tmp_path / "ckpt"
    ck.mkdir()
    st_np.save_file(builders.hf_tensors(), str(ck / "model.safetensors"))
    (ck / "config.json").write_text(json.dumps(builders.hf_config()))
    g = builders.write(tmp_path / "fork.gguf", *builders.parts("fork"))
    monkeypatch.setenv("MTPSCOPE_ROOTS", str(tmp_path))
    at = _run("validate", drafter=g, target=None, trace=None, checkpoint=ck)
    from mtpscope.inspector.gguf import open_gguf

    audit = hf_audit(read_checkpoint(ck), open_gguf(g))
    rows = next(d.value for d in at.dataframe if "hf_name" in d.value.columns)
    assert list(rows["hf_name"]) == [r.hf_name for r in audit.rows]
    assert list(rows["status"]) == [r.status for r in audit.rows]
    assert not at.error or all("\n" not in e.value for e in at.error)


def test_every_page_without_demo_or_selection(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MTPSCOPE_CACHE", str(tmp_path / "cache"))  # no demo built there
    monkeypatch.chdir(tmp_path)
    for page in (None, "tensors", "validate", "centroids", "values", "acceptance", "text", "step", "explain", "compare"):
        at = _run(page)
        assert not at.error, (page, [e.value for e in at.error])
        assert at.info, page
    at = _run(None)
    assert any("demo is not built" in i.value for i in at.info)


def test_imported_traces_render(tmp_path: Path, monkeypatch) -> None:
    """Traces imported from the fork's NDJSON (rounds and steps without target tokens) and from a
    llama-server log (requests only) open on every trace page without an exception."""
    from mtpscope.traces import importers
    from mtpscope.traces.analysis import metrics
    from mtpscope.traces.store.reader import open_trace

    nd = tmp_path / "fork.ndjson"
    nd.write_text(
        '{"evt":"mtp_draft","iter":1,"path":"sync","seq_id":0,"id_last":5,"h_idx":0,"attn_pos":10,"n_steps":3,'
        '"h_l2":12.5,"drafts":[1001,1002,1003]}\n{"evt":"mtp_accept","iter":1,"n_accepted":2,"n_drafted_prev":3}\n'
        '{"evt":"mtp_draft","iter":2,"path":"lazy","seq_id":0,"id_last":5,"h_idx":0,"attn_pos":13,"n_steps":3,'
        '"h_l2":11.0,"drafts":[1004,1005,1006]}\n{"evt":"mtp_accept","iter":2,"n_accepted":0,"n_drafted_prev":3}\n')
    log = tmp_path / "server.log"
    log.write_text("draft acceptance rate = 0.57143 (   12 accepted /    21 generated)\n"
                   "draft acceptance rate = 0.50000 (    5 accepted /    10 generated)\n")
    fork_t, srv_t = tmp_path / "fork-trace", tmp_path / "server-trace"
    importers.import_fork_ndjson(nd, fork_t)
    importers.import_server_log(log, srv_t)
    monkeypatch.setenv("MTPSCOPE_ROOTS", str(tmp_path))
    for t in (fork_t, srv_t):
        rep = metrics.report(open_trace(t))
        for page in ("acceptance", "text", "step", "explain", "centroids", "compare"):
            # no trace B: the demo's (its drafter fails verify) would put its banner on Compare
            at = _run(page, trace=t, trace_b=None, drafter=None, target=None)
            assert not at.error, (t.name, page, [e.value for e in at.error])
        at = _run("acceptance", trace=t, drafter=None, target=None)
        assert _metric(at, "acceptance rate") == f"{100 * (rep.acceptance_rate):.1f} %"
        assert _metric(at, "drafted tokens") == f"{rep.n_drafted:,}"


def test_files_page_rounds_are_the_rounds_its_metrics_read(tmp_path: Path, monkeypatch) -> None:
    """A complete trace one of whose rounds parts is gone: the Files page's "rounds" says "3 of 5" (read of the
    manifest's count), the count its acceptance rate covers (3 + 1 + 0 accepted of 3 + 3 + 3 drafted: the rounds
    of parts 0 and 2), not the manifest's 5 beside a rate of 3 rounds."""
    from mtpscope.traces import RoundRecord, TraceWriter

    t = tmp_path / "t"
    acc = [3, 1, 0, 2, 0]
    with TraceWriter(t, {"source": "record", "prompts": [{"prompt_id": 0, "text": "a", "n_prompt_tokens": 2}]},
                     n_embd_backbone=None, n_embd=None, hidden_dtype=None, centroids=False, flush_every=2,
                     compact=False) as w:
        for r, a in enumerate(acc):
            w.add_round(RoundRecord(prompt_id=0, round=r, pos=10 + r, pending_token=1, n_draft=3, drafted=(5, 6, 7),
                                    n_accepted=a, t_draft_ms=4.0, t_verify_ms=30.0))
    (t / "rounds" / "part-00001.parquet").unlink()      # rounds 2 and 3
    monkeypatch.setenv("MTPSCOPE_ROOTS", str(tmp_path))
    at = _run(trace=t, drafter=None, target=None)
    assert _metric(at, "rounds") == "3 of 5"
    assert any("acceptance rate 44.4 %" in s.value for s in at.success), [s.value for s in at.success]   # 4 / 9
    # every trace page says the part is lost, whichever is opened (before: the Acceptance and Files pages only)
    lost = ("Trace A lost 1 part file (rounds/part-00001.parquet: missing or unreadable): the numbers cover the "
            "rest; the Files page lists why.")
    for page in ("start", "acceptance", "text", "step", "explain"):
        at = _run(page, trace=t, trace_b=None, drafter=None, target=None)
        assert lost in [w.value for w in at.warning], (page, [w.value for w in at.warning])


def _copy_trace(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_malformed_manifest_models_and_prompts_are_skipped(demo, tmp_path: Path, monkeypatch) -> None:
    """A manifest whose ``models`` entries are not objects and whose ``prompts`` hold non-objects and
    non-integer ids: Acceptance, Step, Centroids and Files render without an exception or an error;
    the well-formed prompts keep their texts."""
    import json

    from mtpscope.traces.analysis import metrics
    from mtpscope.traces.store.reader import open_trace

    src = _need_trace(demo)
    t = _copy_trace(src, tmp_path / "trace")
    man = json.loads((t / "manifest.json").read_text())
    good = [p for p in man.get("prompts") or [] if isinstance(p, dict)]
    assert good, "the demo trace names its prompts"
    man["models"] = {"target": 5, "assistant": "x", "centroids": [1]}
    man["prompts"] = good + [{"prompt_id": "a"}, 5, None, {"text": "no id"}]
    (t / "manifest.json").write_text(json.dumps(man))
    monkeypatch.setenv("MTPSCOPE_ROOTS", str(tmp_path))
    for page in ("acceptance", "step", "centroids", None):
        at = _run(page, trace=t, drafter=None, target=None)
        assert not at.error, (page, [e.value for e in at.error])
    at = _run("acceptance", trace=t, drafter=None, target=None)
    rep = metrics.report(open_trace(src))
    assert _metric(at, "acceptance rate") == f"{100 * (rep.acceptance_rate):.1f} %"
    table = next(d.value for d in at.dataframe if "prompt" in d.value.columns and "n_drafted" in d.value.columns)
    want = {int(p["prompt_id"]): str(p.get("text", "")) for p in good}
    # every prompt named by id and text: prompt 3 “Every sailor sings about” (demo texts are short)
    assert sorted(table["prompt"]) == sorted(f"prompt {i} “{t}”" if t else f"prompt {i}" for i, t in want.items())
    at = _run(None, trace=t, drafter=None, target=None)
    assert _metric(at, "prompts") == str(len(good))


def test_steps_part_with_wrong_hidden_width_is_one_line(demo, tmp_path: Path, monkeypatch) -> None:
    """A steps part whose ``h`` is fixed_size_list[7] while the manifest says wider: the Step page
    shows one ``internal error (ValueError: ...)`` line for ``h``, no exception box."""
    import json

    import numpy as np
    import pyarrow as pa

    src = _need_trace(demo)
    man = json.loads((src / "manifest.json").read_text())
    if not (man.get("dims") or {}).get("hidden_dtype"):
        pytest.skip("demo trace recorded without hidden states")
    t = _copy_trace(src, tmp_path / "trace")
    for part in sorted((t / "steps").glob("*.parquet")):
        tab = pq.read_table(part)
        i = tab.schema.get_field_index("h")
        h7 = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(len(tab) * 7, np.float16)), 7)
        pq.write_table(tab.set_column(i, "h", h7), part)
    r = _rounds_direct(t)
    monkeypatch.setenv("MTPSCOPE_ROOTS", str(tmp_path))
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.session_state[selection.slot_key(selection.TRACE)] = str(t)
    at.session_state[selection.SEL_ROUND] = (int(r.iloc[0]["prompt_id"]), int(r.iloc[0]["round"]))
    at.run()
    at.switch_page("screens/step.py").run()
    assert not at.exception, [e.value for e in at.exception]
    errs = [e.value for e in at.error]
    assert len(errs) == 1 and errs[0].startswith("h: internal error (ValueError: "), errs
    assert "please report" in errs[0] and "\n" not in errs[0]


def test_unexpected_exception_in_a_page_is_one_line(demo, tmp_path: Path, monkeypatch) -> None:
    """The page guard's last line of defence: an exception that is not an mtpscope error becomes one
    ``internal error (Type: message) while <what> — please report`` line, not a traceback box."""
    from mtpscope.app import views

    src = _need_trace(demo)

    def boom(*a, **k):
        raise KeyError("zz_col")

    monkeypatch.setattr(views, "per_prompt_table", boom)
    at = _run("acceptance", trace=src, drafter=None, target=None)
    errs = [e.value for e in at.error]
    assert errs == ["internal error (KeyError: 'zz_col') while trace store — please report"], errs


def test_exception_outside_any_block_guard_is_one_line(tmp_path: Path, monkeypatch) -> None:
    """main.py runs every page inside a guard: an exception raised outside the page's own guarded
    blocks is one ``internal error`` line naming the page."""
    def boom() -> None:
        raise RuntimeError("hint exploded\nsecond line")

    monkeypatch.setattr(selection, "demo_missing_hint", boom)
    monkeypatch.setenv("MTPSCOPE_ROOTS", str(tmp_path))
    at = _run("acceptance", trace=None, drafter=None, target=None)
    errs = [e.value for e in at.error]
    assert errs == ["internal error (RuntimeError: hint exploded second line) while showing the Acceptance "
                    "page — please report"], errs


def test_every_trace_page_says_a_trace_is_incomplete(tmp_path: Path, monkeypatch) -> None:
    """A recording that a kill -9 ended (its write-ahead log recovered on open): the trace pages say so above
    themselves, once; a complete trace gets no such line."""
    import json

    from mtpscope.traces.synthetic import write_synthetic_trace

    d = write_synthetic_trace(tmp_path / "t", n_rounds=40, n_prompts=2, n_draft=3, steps=False)
    m = json.loads((d / "manifest.json").read_text())
    m["complete"] = False
    m["recovered"] = {"at": "2026-12-06T00:00:00+00:00", "n_rounds": 7, "n_steps": 21, "parts": [],
                      "torn_bytes": 0, "n_steps_dropped": 0, "n_rounds_invalid": 0, "problems": []}
    m.pop("parts", None)
    (d / "manifest.json").write_text(json.dumps(m))
    monkeypatch.setenv("MTPSCOPE_ROOTS", str(tmp_path))
    want = ("Trace A is incomplete: the run was interrupted; 7 rounds came back from its write-ahead log — the "
            "numbers cover the rounds recorded before.")
    for page in ("acceptance", "explain", "start"):
        at = _run(page, trace=d, trace_b=None, drafter=None, target=None)
        assert [w.value for w in at.warning if "incomplete" in w.value] == [want], (page, [w.value for w in at.warning])


def test_an_unreadable_trace_is_one_error_on_every_page(tmp_path: Path, monkeypatch) -> None:
    """A trace slot naming a file, or a folder whose manifest is not UTF-8: each page that reads the trace shows
    its one error line once (the incomplete-trace banner above the trace pages, and the Centroids page's second
    read of the trace, showed the same line a second time)."""
    not_dir = tmp_path / "afile"
    not_dir.write_text("x")
    bad_manifest = tmp_path / "t"
    bad_manifest.mkdir()
    (bad_manifest / "manifest.json").write_bytes(b"\xff\xfe garbage")
    monkeypatch.setenv("MTPSCOPE_ROOTS", str(tmp_path))
    for trace, want in ((not_dir, f"{not_dir}: not a folder"),
                        (bad_manifest, f"{bad_manifest / 'manifest.json'}: at offset 0: manifest is not UTF-8")):
        for page in ("start", "acceptance", "text", "step", "explain", "compare", "centroids"):
            at = _run(page, trace=trace, trace_b=None, drafter=None, target=None)
            errs = [e.value for e in at.error]
            assert len(errs) == 1 and errs[0].startswith(want), (trace.name, page, errs)


def test_centroids_page_of_a_trace_whose_steps_are_all_unreadable(tmp_path: Path, monkeypatch) -> None:
    """A trace recorded with a centroid head whose every steps part is unreadable: the Centroids page says no step
    could be read, naming the part (was: DuckDB's 'Unsupported Internal Arrow Type e' over the f16 columns, an
    internal error; then 'recorded without a centroid head', which it was not)."""
    from mtpscope import traces
    from mtpscope.traces.synthetic import write_synthetic_trace

    d = write_synthetic_trace(tmp_path / "t", n_rounds=20, n_prompts=2, n_vocab=1000, hidden=(8, 4), seed=0)
    (part,) = traces.open(d).part_files("steps")
    part.write_bytes(b"not parquet")
    monkeypatch.setenv("MTPSCOPE_ROOTS", str(tmp_path))
    at = _run("centroids", trace=d, trace_b=None, drafter=None, target=None)
    assert not at.error and not at.exception, [e.value for e in at.error]
    assert [w.value for w in at.warning if "could be read" in w.value] == [
        f"No step of this trace could be read: {part}: unreadable steps part skipped (Parquet magic bytes not found "
        "in footer. Either the file is corrupted or this is not a parquet file.)"]
