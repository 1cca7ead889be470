"""``record --runtime mlx`` (traces/run/mlx_runtime.py, mlx_record.py) on the trained demo pair, mlx-vlm's own
MTP loop on MLX's CPU backend, against values computed independently of it:

* the greedy output equals what the real llama.cpp generated in the demo's F32 trace (float32 weights);
* with llama.cpp's draft position (``draft_position="p"``) the drafts equal llama.cpp's in every round at a
  common position that drafted as many tokens, and each step's ``h`` / ``h_next`` equal the F32 trace's
  (stored as float16 there: tolerance half a float16 ulp of the largest element plus 1e-3 for the two
  runtimes' float32 sums, see ``_tol``); with mlx-vlm's own ``p - 1`` the first step's ``h_next`` differs by
  more than that tolerance and some drafts differ;
* ``compare`` of the two traces names the draft position as the cause of the first differing round;
* the round loop's own tokens: the trace's output equals ``mlx_vlm``'s ``generate_step`` without a drafter.

Skips (saying why) where mlx / mlx-vlm cannot be imported (the optional extra ``mtpscope[mlx]``).
"""

from __future__ import annotations

import numpy as np
import pytest

from mtpscope.traces.run.mlx_runtime import mlx_unavailable

_WHY = mlx_unavailable()
if _WHY is not None:
    pytest.skip(f"MLX runtime not available: {_WHY}", allow_module_level=True)
pytest.importorskip("llama_cpp", reason="the demo's llama.cpp traces need llama-cpp-python")

from mtpscope.demo.spec import TrainedPaths  # noqa: E402  # after the skip: nothing to import without mlx

pytestmark = [pytest.mark.slow]

PROMPTS = (0, 1)      # code prompts; prompt 1's drafts differ between p and p - 1 within 32 tokens
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def trained(demo_dir) -> TrainedPaths:
    tp = TrainedPaths.under(demo_dir.root)
    if not (tp.traces_f32 / "manifest.json").exists():
        pytest.skip("the trained demo's F32 trace was not recorded")
    return tp


@pytest.fixture(scope="module")
def f32(trained):
    from mtpscope.traces.store.reader import open_trace

    return open_trace(trained.traces_f32)


@pytest.fixture(scope="module")
def recorded(trained, f32, tmp_path_factory):
    """Both conventions recorded through ``record_mlx`` (float32 weights, 3 drafts, 32 tokens)."""
    from mtpscope.traces.run.mlx_record import record_mlx
    from mtpscope.traces.run.prompts import PromptSpec
    from mtpscope.traces.run.record_config import RecordConfig

    d = tmp_path_factory.mktemp("mlx")
    specs = [PromptSpec(tokens=tuple(f32.manifest["prompts"][p]["tokens"]), id=f"p{p}") for p in PROMPTS]
    cfg = RecordConfig(n_draft=3, max_tokens=MAX_TOKENS, hidden="f32")
    return {dp: record_mlx(cfg, target=trained.hf_target, assistant=trained.hf_drafter, out=d / dp, prompts=specs,
                           work_dir=d / "work", draft_position=dp, dtype="f32")
            for dp in ("p-1", "p")}


def _llama_output(f32, pid: int) -> list[int]:
    r = f32.rounds[f32.rounds["prompt_id"] == pid].sort_values("round")
    return [int(r["pending_token"].iloc[0])] + [int(x) for e in r["emitted"] for x in e]


def _n_layer(path) -> int:
    """A GGUF's ``n_layer`` (``inspector.layouts.read_hparams``)."""
    from mtpscope.inspector.gguf import open_gguf
    from mtpscope.inspector.layouts import read_hparams

    with open_gguf(path) as g:
        return read_hparams(g).n_layer


def _tol(ref: np.ndarray, trained, *, drafter: bool = True) -> float:
    """:func:`tests.numerics.f32_runtime_hidden_tol` over the layers the rows passed through: the target's, and the
    drafter's too unless ``drafter`` is False (step 1's ``h``: the target's last hidden state itself)."""
    from tests.numerics import f32_runtime_hidden_tol

    return f32_runtime_hidden_tol(ref, _n_layer(trained.target) + (_n_layer(trained.drafter) if drafter else 0))


def test_greedy_output_equals_llama_cpp(recorded, f32, trained) -> None:
    from gguf import GGUFReader

    from mtpscope.traces.store.manifest import read_manifest

    n_vocab = len(GGUFReader(trained.target).fields["tokenizer.ggml.tokens"].data)    # the target's, as gguf-py reads it

    for dp, s in recorded.items():
        m = read_manifest(s.out)
        assert (m["convention"]["draft_position"], m["convention"]["head"], m["params"]["draft_head"]) == \
            (dp, "centroid", "centroid")
        assert m["runtime"]["name"] == "mlx" and m["complete"]
        assert m["params"]["n_vocab"] == n_vocab               # the reader's bound on token ids
        for i, pid in enumerate(PROMPTS):
            assert list(s.outputs[i]) == _llama_output(f32, pid)[:MAX_TOKENS], (dp, pid)


def test_drafts_and_hidden_states_equal_llama_cpp_at_position_p(recorded, f32, trained) -> None:
    from mtpscope.traces.store.reader import open_trace

    t = open_trace(recorded["p"].out)
    n_cmp = 0
    for i, pid in enumerate(PROMPTS):
        la = f32.rounds[f32.rounds["prompt_id"] == pid].set_index("pos")
        for _, r in t.rounds[t.rounds["prompt_id"] == i].iterrows():
            if r["pos"] in la.index and len(r["drafted"]) == len(la.loc[r["pos"], "drafted"]):
                assert list(r["drafted"]) == list(la.loc[r["pos"], "drafted"]), (pid, r["round"])
                n_cmp += 1
        for name in ("h", "h_next"):
            ref = f32.hidden(name, where=f"prompt_id = {pid} AND round = 0")
            got = t.hidden(name, where=f"prompt_id = {i} AND round = 0")
            assert np.abs(got - ref).max() <= _tol(ref, trained), (pid, name)    # (steps 2.. come from the drafter)
    assert n_cmp >= 10


def test_mlx_vlm_own_position_changes_the_drafter(recorded, f32, trained) -> None:
    from mtpscope.traces.store.reader import open_trace

    t = open_trace(recorded["p-1"].out)
    ref = f32.hidden("h_next", where="prompt_id = 0 AND round = 0 AND k = 1")
    got = t.hidden("h_next", where="prompt_id = 0 AND round = 0 AND k = 1")
    assert np.abs(got - ref).max() > _tol(ref, trained)
    # the hidden row fed in is the target's (no drafter position in it): equal
    ref_h = f32.hidden("h", where="prompt_id = 0 AND round = 0 AND k = 1")
    got_h = t.hidden("h", where="prompt_id = 0 AND round = 0 AND k = 1")
    assert np.abs(got_h - ref_h).max() <= _tol(ref_h, trained, drafter=False)


def test_compare_names_the_draft_position(recorded, f32) -> None:
    from mtpscope.traces.analysis.compare_report import compare_traces
    from mtpscope.traces.store.reader import open_trace

    d = compare_traces(f32, open_trace(recorded["p-1"].out)).runtimes
    assert d is not None and "draft_position" in d.differs
    by_pid = {x.prompt_id_a: x for x in d.prompts}
    assert by_pid[1].what == "drafts" and by_pid[1].cause == "draft_position"
    assert d.n_rounds_differing >= 1
    d_p = compare_traces(f32, open_trace(recorded["p"].out)).runtimes
    assert d_p is not None
    assert all(x.what in ("none", "n_draft", "output_length") for x in d_p.prompts)


def test_output_equals_mlx_vlm_without_drafter(recorded, trained, f32, tmp_path) -> None:
    import mlx.core as mx
    from mlx_vlm.generate.ar import generate_step
    from mlx_vlm.speculative import mtp
    from mlx_vlm.utils import load_model

    from mtpscope.traces.run.mlx_runtime import mlx_target_checkpoint

    # after the recordings mlx-vlm's own functions are back in place (the wrappers live only inside a run)
    for name in ("_mtp_draft_position", "_mtp_verify_target", "_mtp_acceptance_walk"):
        assert getattr(mtp, name).__qualname__ == name
    model = load_model(mlx_target_checkpoint(trained.hf_target, tmp_path / "t"))
    model.set_dtype(mx.float32)
    for i, pid in enumerate(PROMPTS):
        ids = mx.array([f32.manifest["prompts"][pid]["tokens"]])
        plain = [int(t) for t, _ in generate_step(ids, model, None, None, max_tokens=MAX_TOKENS, temperature=0.0)]
        assert list(recorded["p-1"].outputs[i]) == plain


def test_compare_page_shows_the_round_by_round_causes(recorded, trained, monkeypatch) -> None:
    import os
    from pathlib import Path

    from tests.test_app import _run

    monkeypatch.setenv("MTPSCOPE_ROOTS", os.pathsep.join([str(trained.root), str(Path(recorded["p-1"].out).parent)]))
    at = _run("compare", trace=trained.traces_f32, trace_b=recorded["p-1"].out)
    df = next(d.value for d in at.dataframe if "cause" in d.value.columns)
    assert len(df) == len(PROMPTS)
    assert df["cause"].iloc[1].startswith("draft position p vs p - 1")
    assert (df["round A / B"].iloc[1], df["draft step"].iloc[1]) == ("5/5", 1)   # prompt 1: round 5, step 1 (docs)
    # the step replayed under both positions: each reproduced its own runtime's draft (drafts A / B are theirs)
    assert df["confirmed"].iloc[1] == "yes"
    a1, b1 = df["drafts A"].iloc[1].strip("[]").split(", ")[0], df["drafts B"].iloc[1].strip("[]").split(", ")[0]
    assert f"draft_position p (head=dense): {a1} = A's" in df["replayed"].iloc[1]
    assert f"draft_position p-1 (head=dense): {b1} = B's" in df["replayed"].iloc[1]


def test_compare_replay_confirms_the_draft_position(recorded, trained, f32) -> None:
    """The first differing step of prompt 1, replayed with the reference drafter: at p it drafts llama.cpp's token,
    at p - 1 mlx-vlm's (the drafts compared are the two runtimes' own, recorded independently of the replay)."""
    from mtpscope.traces.analysis.compare_report import compare_traces
    from mtpscope.traces.run.runtime_replay import replay_first_differences
    from mtpscope.traces.store.reader import open_trace

    t = open_trace(recorded["p-1"].out)
    rt = compare_traces(f32, t).runtimes
    assert rt is not None
    rt = replay_first_differences(rt, f32, t, target=trained.target, assistant=trained.drafter,
                                  centroids=trained.sidecar)
    x = {d.prompt_id_a: d for d in rt.prompts}[1]
    assert x.cause == "draft_position" and x.step is not None and x.replay_note is None
    assert x.confirmed is True
    k = x.step - 1
    by = {(r.held, r.value): r.token for r in x.replayed}
    held = [h for h in {r.held for r in x.replayed} if by.get((h, "p")) == x.drafted_a[k]
            and by.get((h, "p-1")) == x.drafted_b[k]]
    assert held, x.replayed
    # with llama.cpp's own head (dense) held, the position alone turns llama.cpp's draft into mlx-vlm's
    assert by[("head=dense", "p")] == x.drafted_a[k]


def test_report_explain_and_app_read_an_mlx_trace(recorded, monkeypatch) -> None:
    import json
    import os
    from pathlib import Path

    from typer.testing import CliRunner

    from mtpscope.cli.main import app
    from mtpscope.traces.store.reader import open_trace
    from tests.test_app import _metric, _run

    out = recorded["p-1"].out
    r = open_trace(out).rounds
    n_drafted = int(sum(len(d) for d in r["drafted"]))
    n_acc = int(r["n_accepted"].sum())
    n_first = int(sum(1 for d, a in zip(r["drafted"], r["n_accepted"], strict=True) if a < len(d)))
    runner = CliRunner()
    rep = runner.invoke(app, ["report", str(out), "--json"])
    assert rep.exit_code in (0, 1), rep.output
    d = json.loads(rep.stdout)
    assert d["acceptance_rate"] == pytest.approx(n_acc / n_drafted, abs=1e-12)
    ex = runner.invoke(app, ["explain", str(out), "--json"])
    assert ex.exit_code in (0, 1), ex.output
    assert json.loads(ex.stdout)["rejections"]["n_first_mismatch"] == n_first
    txt = runner.invoke(app, ["explain", str(out)])
    assert "Why drafts were rejected" in txt.stdout
    monkeypatch.setenv("MTPSCOPE_ROOTS", os.pathsep.join([str(Path(out).parent)]))
    at = _run("acceptance", trace=out)
    assert _metric(at, "acceptance rate").startswith(f"{100 * n_acc / n_drafted:.1f}")
    _run("explain", trace=out)


def test_diagnose_runtime_mlx_names_the_draft_position(trained, f32, tmp_path) -> None:
    """``diagnose --runtime mlx`` on the demo's first two prompts (64 tokens, as the F32 trace): the MLX trace's
    greedy output is llama.cpp's, and the draft position is a confirmed convention finding (a warning)."""
    from mtpscope.traces.diagnose.config import DiagnoseConfig
    from mtpscope.traces.diagnose.runtimes import diagnose_runtime
    from mtpscope.traces.run.prompts import PromptSpec
    from mtpscope.traces.store.reader import open_trace

    specs = [PromptSpec(tokens=tuple(f32.manifest["prompts"][p]["tokens"])) for p in PROMPTS]
    d = diagnose_runtime(DiagnoseConfig(max_tokens=64), runtime="mlx", target=trained.hf_target,
                         assistant=trained.hf_drafter, against=trained.traces_f32, prompts=specs, out=tmp_path / "o",
                         work_dir=tmp_path / "work")
    t = open_trace(d.trace)
    for i, pid in enumerate(PROMPTS):
        r = t.rounds[t.rounds["prompt_id"] == i].sort_values("round")
        out = [int(r["pending_token"].iloc[0])] + [int(x) for e in r["emitted"] for x in e]
        assert out[:40] == _llama_output(f32, pid)[:40], pid
    f = next(f for f in d.findings if f.subject == "mlx:draft_position")
    assert (f.cause, f.severity, f.confidence, f.expected, f.actual) == ("convention", "warning", "high", "p", "p-1")
    ev = f.evidence[0].numbers
    assert ev["confirmed"] == ev["prompts"] >= 1 and ev["not_confirmed"] == 0
    assert d.exit_code == 1 and (tmp_path / "o" / "diagnosis.json").is_file()
    assert [s.status for s in d.steps if s.name == "record"] == ["ran"]


def _drafts_differing_from_llama(f32, trace, pids: tuple[int, ...]) -> tuple[int, list[tuple[int, int]]]:
    """Rounds at a common position (same pending token) with as many drafts on both sides, and those whose drafts
    differ, as (prompt id, position); ``trace``'s prompt i is the F32 trace's ``pids[i]``."""
    a = f32.rounds
    b = trace.rounds.copy()
    b["prompt_id"] = [pids[int(i)] for i in b["prompt_id"]]
    m = a.merge(b, on=["prompt_id", "pos", "pending_token"], suffixes=("_a", "_b"))
    same = m[[len(x) == len(y) for x, y in zip(m["drafted_a"], m["drafted_b"], strict=True)]]
    bad = [(int(r.prompt_id), int(r.pos)) for r in same.itertuples()
           if [int(t) for t in r.drafted_a] != [int(t) for t in r.drafted_b]]
    return len(same), bad


def test_dense_head_at_p_drafts_what_llama_cpp_drafts(trained, f32, tmp_path) -> None:
    # llama.cpp's whole convention (--draft-position p --mlx-head dense): every common round drafts llama.cpp's
    # tokens; with the checkpoint's centroid head the random-word prompts 30 and 31 differ within 32 tokens
    from mtpscope.traces.run.mlx_record import record_mlx
    from mtpscope.traces.run.prompts import PromptSpec
    from mtpscope.traces.run.record_config import RecordConfig
    from mtpscope.traces.store.manifest import read_manifest
    from mtpscope.traces.store.reader import open_trace

    pids = (30, 31)
    specs = [PromptSpec(tokens=tuple(f32.manifest["prompts"][p]["tokens"]), id=f"p{p}") for p in pids]
    cfg = RecordConfig(n_draft=3, max_tokens=MAX_TOKENS, hidden="off")
    got = {}
    for head in ("checkpoint", "dense"):
        record_mlx(cfg, target=trained.hf_target, assistant=trained.hf_drafter, out=tmp_path / head, prompts=specs,
                   work_dir=tmp_path / "work", draft_position="p", dtype="f32", head_choice=head)
        got[head] = _drafts_differing_from_llama(f32, open_trace(tmp_path / head), pids)
    assert read_manifest(tmp_path / "dense")["convention"]["head"] == "dense"
    n_dense, bad_dense = got["dense"]
    n_ck, bad_ck = got["checkpoint"]
    assert n_dense >= 10 and bad_dense == []
    assert n_ck >= 10 and bad_ck, "the centroid head should change a draft here (else this test proves nothing)"
