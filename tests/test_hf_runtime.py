"""``record --runtime hf`` (traces/run/hf_runtime.py, hf_record.py) on the trained demo pair: transformers' own
assisted generation with the Gemma 4 assistant (float32, CPU), against values computed independently of it:

* every drafter call equals the numpy reference drafter (``inspector.reference.ReferenceDrafter`` from the
  demo's GGUFs) run on the inputs HF handed over, with HF's visibility (its masks) and conventions
  (``fill="min-1"``, centroid head, exact tanh GELU, float32 K/V): the same draft at every step (or a near tie
  of the reference's own logits), logits within 1e-4 of their scale;
* the greedy output equals the HF target's plain greedy ``generate`` (no assistant);
* the conventions the manifest states hold in the recorded rounds (the last round's draft count, the
  drafter position, the full layers' view of a rejected draft), and llama.cpp's visibility with its dense head,
  replayed on HF's inputs, drafts what the llama.cpp F32 trace recorded where HF's drafts differ;
* a seeded ``do_sample`` run records, follows the rejection rule's bookkeeping and is reproducible;
* the trace reads back through the trace store, and ``report`` / ``explain`` read it.

Skips (saying why) without torch / transformers >= 5.24 (the parity extra) or without the trained demo's trace.
"""

from __future__ import annotations

import numpy as np
import pytest

from mtpscope.traces.run.hf_runtime import hf_unavailable

_WHY = hf_unavailable()
if _WHY is not None:
    pytest.skip(f"HF runtime not available: {_WHY}", allow_module_level=True)

from mtpscope.demo.spec import TrainedPaths  # noqa: E402  # after the skip: nothing to import without torch

#: slow: importing torch + transformers and loading the pair takes 10-20 s
pytestmark = [pytest.mark.slow]

PROMPTS = (0, 1, 30)      # two code prompts and one of the random-word category (more rejections)
MAX_TOKENS = 32
N_DRAFT = 3
#: a near tie of the reference's own logits: the top-2 gap below this share of the largest |logit| (the reference
#: and HF agree to 1e-4 absolute on logits of size ~10-30: parity tests on the tiny pairs)
NEAR_TIE_REL = 1e-5


@pytest.fixture(scope="module")
def trained(demo_dir) -> TrainedPaths:
    tp = TrainedPaths.under(demo_dir.root)
    if not (tp.traces_f32 / "manifest.json").exists() or not (tp.hf_target / "config.json").exists():
        pytest.skip("the trained demo's F32 trace or HF checkpoints were not built")
    return tp


@pytest.fixture(scope="module")
def prompt_tokens(trained) -> list[list[int]]:
    from mtpscope.traces.store.manifest import read_manifest

    m = read_manifest(trained.traces_f32)
    return [list(m["prompts"][p]["tokens"]) for p in PROMPTS]


@pytest.fixture(scope="module")
def rt(trained):
    from mtpscope.traces.run.hf_runtime import HfRuntime

    return HfRuntime(trained.hf_target, trained.hf_drafter, n_threads=1)


@pytest.fixture(scope="module")
def recorded(trained, prompt_tokens, tmp_path_factory):
    """The greedy trace through ``record_hf`` (3 drafts, 32 tokens, float32 hidden states)."""
    from mtpscope.traces.run.hf_record import record_hf
    from mtpscope.traces.run.prompts import PromptSpec
    from mtpscope.traces.run.record_config import RecordConfig

    d = tmp_path_factory.mktemp("hf")
    specs = [PromptSpec(tokens=tuple(t), id=f"p{p}") for t, p in zip(prompt_tokens, PROMPTS, strict=True)]
    cfg = RecordConfig(n_draft=N_DRAFT, max_tokens=MAX_TOKENS, hidden="f32", n_threads=1)
    return record_hf(cfg, target=trained.hf_target, assistant=trained.hf_drafter, out=d / "greedy", prompts=specs)


def test_trace_reads_back_with_its_runtime_and_conventions(recorded, trained) -> None:
    from mtpscope.traces.store.reader import open_trace

    t = open_trace(recorded.out)
    m = t.manifest
    assert m["complete"] and m["runtime"]["name"] == "hf"
    assert {"transformers", "torch", "device"} <= set(m["runtime"])
    conv = m["convention"]
    assert {"runtime", "draft_position", "head", "dtype", "last_round", "eog", "kv_visibility"} <= set(conv)
    assert (conv["runtime"], conv["draft_position"], conv["head"], conv["dtype"]) == ("hf", "p", "centroid", "float32")
    # the stop ids: the HF target checkpoint's eos_token_id (its config.json; the folder has no
    # generation_config.json, from which transformers takes it then)
    import json

    eos = json.loads((trained.hf_target / "config.json").read_text())["eos_token_id"]
    assert conv["eog_ids"] == sorted([eos] if isinstance(eos, int) else eos)
    # the reader's bound on token ids: the target checkpoint's vocab_size (its config.json)
    cfg = json.loads((trained.hf_target / "config.json").read_text())
    assert m["params"]["n_vocab"] == cfg.get("text_config", cfg)["vocab_size"]
    assert len(t.rounds) == recorded.n_rounds and len(t.steps) == recorded.n_steps
    assert int(t.rounds["n_accepted"].sum()) == recorded.n_accepted
    for i in range(len(PROMPTS)):
        r = t.rounds[t.rounds["prompt_id"] == i].sort_values("round")
        out = [int(r["pending_token"].iloc[0])] + [int(x) for e in r["emitted"] for x in e]
        assert out == list(recorded.outputs[i])
    # hidden states kept for every step: h (the target's row fed in), h_next, h_inner
    assert t.hidden("h_next", where="prompt_id = 0 AND round = 0").shape[0] == N_DRAFT


def test_greedy_output_equals_plain_greedy_of_the_target(recorded, rt, prompt_tokens) -> None:
    for i, toks in enumerate(prompt_tokens):
        assert list(recorded.outputs[i]) == rt.generate_plain(toks, max_tokens=MAX_TOKENS), PROMPTS[i]


def test_conventions_hold_in_the_recorded_rounds(recorded) -> None:
    """The manifest's claims, read off the rounds: drafter position = the pending token's position (each round
    starts where the last ended: pos = prompt length + tokens generated before it - 1), a constant draft length
    of n_draft and, in the last rounds, min(n_draft, remaining - 1)."""
    from mtpscope.traces.store.reader import open_trace

    t = open_trace(recorded.out)
    n_prompt = [p["n_prompt_tokens"] for p in t.manifest["prompts"]]
    capped = 0
    for i in range(len(PROMPTS)):
        gen = 1
        for _, r in t.rounds[t.rounds["prompt_id"] == i].sort_values("round").iterrows():
            assert int(r["pos"]) == n_prompt[i] + gen - 1
            remaining = MAX_TOKENS - gen
            assert len(r["drafted"]) == min(N_DRAFT, remaining - 1), (i, r["round"])
            capped += remaining - 1 < N_DRAFT
            gen += len(r["emitted"])
        assert gen == MAX_TOKENS or int(t.rounds[t.rounds["prompt_id"] == i]["emitted"].iloc[-1][-1]) == 1
    assert capped >= 1


def test_drafts_equal_the_numpy_reference_with_hf_visibility(rt, trained, prompt_tokens) -> None:
    from mtpscope.inspector.reference import ReferenceDrafter, StepOptions
    from mtpscope.traces.run.hf_runtime import donor_kv

    ref = ReferenceDrafter.from_gguf(trained.drafter_fork, trained.target)
    opts = StepOptions(fill="min-1", gelu="tanh", kv_f16=False, head="centroid")
    emb = rt.target_model.get_input_embeddings().weight.detach().numpy() * np.float32(np.sqrt(rt.n_embd_backbone))
    nb = rt.n_embd_backbone
    n_steps, ties, worst, n_rejected_seen = 0, [], 0.0, 0
    for toks in prompt_tokens[:2]:
        run = rt.run(toks, n_draft=N_DRAFT, max_tokens=MAX_TOKENS, trace=True, capture_calls=True)
        drafts = [d for r in run.rounds for d in r.drafted]
        assert [int(np.argmax(c.logits)) for c in run.calls] == drafts          # the trace's drafts are HF's argmax
        assert [c.pos for c in run.calls] == [r.pos for r in run.rounds for _ in r.drafted]
        for c in run.calls:
            e, h = c.embeds[:nb], c.embeds[nb:]
            token = int(np.argmin(np.abs(emb - e).sum(axis=1)))
            r = ref.step(token, h, c.pos, donor_kv(c), opts)
            scale = float(np.abs(c.logits).max())
            worst = max(worst, float(np.abs(r.logits - c.logits).max()) / scale)
            hf_draft = int(np.argmax(c.logits))
            if r.token != hf_draft:
                top2 = np.sort(r.logits)[-2:]
                assert top2[1] - top2[0] <= NEAR_TIE_REL * scale, (c.pos, r.token, hf_draft)
                ties.append(c.pos)
            # HF's full layers see the K/V array cut at the pending position p: after a round that rejected a
            # draft it holds an entry at p (that draft's), visible; otherwise it ends at p - 1
            full = c.kv["full_attention"][0]
            assert len(full) in (c.pos, c.pos + 1) and bool(c.visible["full_attention"].all())
            n_rejected_seen += len(full) == c.pos + 1
            n_steps += 1
    assert n_steps >= 20 and len(ties) <= 1 and n_rejected_seen >= 3
    assert worst <= 1e-4


def _full_keys(rt, seq: list[int]) -> np.ndarray:
    """The target's last full layer's keys over ``seq`` from one plain forward: ``(n, n_head_kv, head_dim)``."""
    import torch

    with torch.no_grad():
        o = rt.target_model(torch.tensor([seq]), return_shared_kv_states=True, use_cache=False)
    keys: np.ndarray = o.shared_kv_states["full_attention"][0][0].permute(1, 0, 2).numpy()
    return keys


def test_full_layers_show_the_rejected_draft(rt, prompt_tokens) -> None:
    """After a round that rejected a draft, the next round's first drafter call gets, at the pending position p,
    the K/V the target computed for that rejected draft (HF's visibility, facts §3): the entry differs from
    what a plain greedy prefill of the accepted sequence puts there."""
    toks = prompt_tokens[0]
    run = rt.run(toks, n_draft=N_DRAFT, max_tokens=MAX_TOKENS, trace=False, capture_calls=True)
    first_call = np.cumsum([0] + [len(r.drafted) for r in run.rounds])     # each round's first drafter call
    checked = 0
    for i, (prev, cur) in enumerate(zip(run.rounds, run.rounds[1:]), start=1):
        if not cur.drafted:
            break
        first = run.calls[first_call[i]]
        assert first.pos == cur.pos
        if prev.n_accepted < len(prev.drafted) and prev.drafted[prev.n_accepted] != prev.emitted[-1]:
            seq = list(toks) + list(run.output[:cur.pos - len(toks) + 1])
            assert seq[-1] == cur.pending_token
            k_true, k_draft = (_full_keys(rt, s) for s in (seq, seq[:-1] + [prev.drafted[prev.n_accepted]]))
            k_hf = first.kv["full_attention"][0]
            # everything before p is the accepted sequence's; the entry at p is the rejected draft's
            assert np.allclose(k_hf[:cur.pos], k_true[:cur.pos], atol=1e-4)
            assert np.allclose(k_hf[cur.pos], k_draft[cur.pos], atol=1e-4)
            assert not np.allclose(k_hf[cur.pos], k_true[cur.pos], atol=1e-3)
            checked += 1
            if checked >= 2:
                break
    assert checked >= 1


def test_llama_cpp_visibility_turns_hf_drafts_into_llama_cpp_drafts(rt, trained, prompt_tokens) -> None:
    """The KV-visibility convention, replayed: at prompt 1's first round that drafts differently from llama.cpp's
    F32 trace (round 1, after a round that rejected a draft), the numpy reference on HF's own inputs drafts
    HF's tokens with HF's masks, and llama.cpp's recorded tokens when the drafter sees only positions < p
    (the rejected draft's entry at p hidden; the sequence is shorter than the window, so sliding layers see
    the same), with llama.cpp's dense head."""
    from mtpscope.inspector.reference import DonorKV, ReferenceDrafter, StepOptions
    from mtpscope.traces.run.hf_runtime import KV_KINDS, donor_kv
    from mtpscope.traces.store.reader import open_trace

    f32 = open_trace(trained.traces_f32)
    ll = f32.rounds[f32.rounds["prompt_id"] == PROMPTS[1]].set_index("pos")
    run = rt.run(prompt_tokens[1], n_draft=N_DRAFT, max_tokens=MAX_TOKENS, trace=False, capture_calls=True)
    first_call = np.cumsum([0] + [len(r.drafted) for r in run.rounds])
    i = next(j for j, r in enumerate(run.rounds) if r.pos in ll.index and r.drafted
             and int(ll.loc[r.pos, "pending_token"]) == r.pending_token
             and tuple(ll.loc[r.pos, "drafted"]) != r.drafted)
    r, prev = run.rounds[i], run.rounds[i - 1]
    assert prev.n_accepted < len(prev.drafted)                # the round before it rejected a draft
    c = run.calls[first_call[i]]
    p, nb = c.pos, rt.n_embd_backbone
    assert p + 1 < rt.target_model.config.sliding_window
    ref = ReferenceDrafter.from_gguf(trained.drafter_fork, trained.target)
    emb = rt.target_model.get_input_embeddings().weight.detach().numpy() * np.float32(np.sqrt(nb))
    token = int(np.argmin(np.abs(emb - c.embeds[:nb]).sum(axis=1)))
    llama_kv = {}
    for name, kind in KV_KINDS.items():
        k, v = c.kv[name]
        llama_kv[kind] = DonorKV(k=k, v=v, pos=np.arange(len(k)), mask=np.arange(len(k)) < p)

    def replay(kv: dict[str, DonorKV], head: str) -> list[int]:
        t, h, out = token, c.embeds[nb:], []
        for _ in r.drafted:
            s = ref.step(t, h, p, kv, StepOptions(fill="min-1", gelu="tanh", head=head))
            out.append(s.token)
            t, h = s.token, s.h_next
        return out

    assert replay(donor_kv(c), "centroid") == list(r.drafted)
    assert replay(llama_kv, "dense") == [int(x) for x in ll.loc[p, "drafted"]]


def test_seeded_sampling_records_and_is_reproducible(trained, prompt_tokens, tmp_path) -> None:
    from dataclasses import replace

    from mtpscope.traces.run.hf_record import record_hf
    from mtpscope.traces.run.prompts import PromptSpec
    from mtpscope.traces.run.record_config import RecordConfig
    from mtpscope.traces.store.reader import open_trace

    specs = [PromptSpec(tokens=tuple(prompt_tokens[2]), id="random")]
    cfg = RecordConfig(n_draft=N_DRAFT, max_tokens=24, temp=0.9, seed=7, top_k=0, top_p=1.0, min_p=0.0, hidden="off")
    a = record_hf(cfg, target=trained.hf_target, assistant=trained.hf_drafter, out=tmp_path / "a", prompts=specs)
    b = record_hf(cfg, target=trained.hf_target, assistant=trained.hf_drafter, out=tmp_path / "b", prompts=specs)
    assert a.outputs == b.outputs
    ta, tb = open_trace(a.out), open_trace(b.out)
    assert ta.manifest["params"]["greedy"] is False and ta.manifest["params"]["seed"] == 7
    assert "rejection sampling" in ta.manifest["convention"]["acceptance"]
    cols = ["pos", "pending_token", "n_accepted"]
    assert ta.rounds[cols].equals(tb.rounds[cols])
    for _, r in ta.rounds.iterrows():
        d, e, n = list(r["drafted"]), list(r["emitted"]), int(r["n_accepted"])
        assert e[:n] == d[:n] and len(e) == n + 1
        if n < len(d):           # a rejected draft is never what the residual distribution samples there
            assert e[n] != d[n]
        # the target column: accepted drafts, then the sampled token, then unknown
        tgt = list(r["target"])
        assert tgt[:n + 1] == e and all(x is None or (isinstance(x, float) and np.isnan(x)) for x in tgt[n + 1:])
    other = record_hf(replace(cfg, seed=8), target=trained.hf_target,
                      assistant=trained.hf_drafter, out=tmp_path / "c", prompts=specs)
    assert other.outputs != a.outputs


def test_report_and_explain_read_the_trace(recorded) -> None:
    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    runner = CliRunner()
    res = runner.invoke(app, ["report", recorded.out])
    assert res.exit_code == 0, res.output
    assert f"{recorded.n_accepted}" in res.output
    res = runner.invoke(app, ["explain", recorded.out])
    assert res.exit_code == 0, res.output


def test_record_command_runs_hf(trained, prompt_tokens, tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    pf = tmp_path / "p.jsonl"
    pf.write_text(json.dumps({"tokens": prompt_tokens[0]}) + "\n")
    out = tmp_path / "cli"
    res = CliRunner().invoke(app, ["record", "--runtime", "hf", "--target", str(trained.hf_target), "--assistant",
                                   str(trained.hf_drafter), "--prompts", str(pf), "--max-tokens", "8",
                                   "--n-draft", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert f"trace: {out}" in res.output
    m = json.loads((out / "manifest.json").read_text())
    assert m["params"]["n_draft"] == 2 and m["runtime"]["name"] == "hf"


def test_unloadable_checkpoint_is_one_line(trained, tmp_path) -> None:
    """A folder with a config.json but no weights, and the assistant given as the target: one line, exit 2,
    nothing written (the input checks without torch: tests/test_cli_record_runtime.py)."""
    import json

    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "gemma4_text"}))
    pf = tmp_path / "p.jsonl"
    pf.write_text(json.dumps({"tokens": [2, 10, 11]}) + "\n")
    for target in (bad, trained.hf_drafter):
        out = tmp_path / f"o-{target.name}"
        res = CliRunner().invoke(app, ["record", "--runtime", "hf", "--target", str(target), "--assistant",
                                       str(trained.hf_drafter), "--prompts", str(pf), "--out", str(out)])
        assert res.exit_code == 2, res.output
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"mtpscope: {target}: ") and "Gemma4ForCausalLM" in lines[0]
        assert not out.exists()


# ------------------------------------------------------------------- compare / diagnose against llama.cpp

#: the F32 trace's first prompts (``compare`` pairs token prompts by their place; ``diagnose --runtime`` records the
#: llama.cpp trace's first prompts, 64 tokens): prompt 0's first differing round from llama.cpp is round 10 (position
#: 79, step 1), prompt 1's round 1 (position 39, step 3), each after a round that rejected a draft (docs/RUNTIMES.md)
KV_PROMPTS = (0, 1)


@pytest.fixture(scope="module")
def hf_diagnosis(trained, tmp_path_factory):
    """``diagnose --runtime hf`` (the RUNTIMES entry) on ``KV_PROMPTS`` against the F32 trace: its diagnosis and its
    output folder (``trace-hf/`` holds HF's recording)."""
    from mtpscope.traces.diagnose.config import DiagnoseConfig
    from mtpscope.traces.diagnose.runtimes import diagnose_runtime
    from mtpscope.traces.run.prompts import PromptSpec
    from mtpscope.traces.store.manifest import read_manifest

    m = read_manifest(trained.traces_f32)
    specs = [PromptSpec(tokens=tuple(m["prompts"][p]["tokens"])) for p in KV_PROMPTS]
    out = tmp_path_factory.mktemp("hfdiag") / "o"
    d = diagnose_runtime(DiagnoseConfig(max_tokens=64), runtime="hf", target=trained.hf_target,
                         assistant=trained.hf_drafter, against=trained.traces_f32, prompts=specs, out=out,
                         work_dir=out.parent / "work")
    return d, out


def test_diagnose_runtime_hf_names_the_kv_visibility(hf_diagnosis) -> None:
    """The KV visibility is a confirmed convention finding (a warning) whose expected value is llama.cpp's."""
    from mtpscope.traces.analysis.runtime_diff import LLAMA_CPP_CONVENTION
    from mtpscope.traces.diagnose.runtimes import RUNTIMES

    d, out = hf_diagnosis
    assert "hf" in RUNTIMES
    f = next(f for f in d.findings if f.subject == "hf:kv_visibility")
    assert (f.cause, f.severity, f.confidence) == ("convention", "warning", "high")
    assert f.expected == LLAMA_CPP_CONVENTION["kv_visibility"] and str(f.actual).startswith("hf: ")
    ev = f.evidence[0].numbers
    assert ev["confirmed"] == ev["prompts"] == len(KV_PROMPTS) and ev["not_confirmed"] == 0
    assert (out / "trace-hf" / "manifest.json").is_file() and (out / "diagnosis.json").is_file()
    assert [s.status for s in d.steps if s.name == "record"] == ["ran"]


def test_compare_replay_confirms_the_kv_visibility(trained, hf_diagnosis) -> None:
    """Each prompt's first differing step, replayed with the reference drafter from a llama.cpp prefill of the
    accepted tokens and the rejected drafts: under llama.cpp's view (rejected cells removed) it drafts llama.cpp's
    recorded token, under HF's (``runtime_replay.hf_view``: the rejected draft's K/V at p visible) HF's recorded
    token, with either head held. The drafts compared are the two runtimes' own, recorded independently of the
    replay; with HF's view replaced by llama.cpp's the HF replays draft llama.cpp's token and this fails."""
    from mtpscope.traces.analysis.compare_report import compare_traces
    from mtpscope.traces.run.runtime_replay import replay_first_differences
    from mtpscope.traces.store.reader import open_trace

    f32, t = open_trace(trained.traces_f32), open_trace(hf_diagnosis[1] / "trace-hf")
    rt = compare_traces(f32, t).runtimes
    assert rt is not None and {"head", "kv_visibility", "eog"} <= set(rt.differs)
    got = [(x.what, x.round_a, x.round_b, x.pos, x.step, x.cause) for x in rt.prompts]
    assert got == [("drafts", 10, 10, 79, 1, "kv_visibility"), ("drafts", 1, 1, 39, 3, "kv_visibility")]
    rt = replay_first_differences(rt, f32, t, target=trained.target, assistant=trained.drafter,
                                  centroids=trained.sidecar)
    for x in rt.prompts:
        assert x.replay_note is None and x.cause == "kv_visibility" and x.confirmed is True
        k = x.step - 1
        by = {(r.key, r.held, r.value): r.token for r in x.replayed}
        for held in ("head=dense", "head=centroid"):
            assert by[("kv_visibility", held, "llama.cpp")] == x.drafted_a[k]
            assert by[("kv_visibility", held, "hf")] == x.drafted_b[k]


def test_compare_page_shows_the_kv_visibility(trained, hf_diagnosis, monkeypatch) -> None:
    import os

    from tests.test_app import _run

    trace = hf_diagnosis[1] / "trace-hf"
    monkeypatch.setenv("MTPSCOPE_ROOTS", os.pathsep.join([str(trained.root), str(hf_diagnosis[1])]))
    at = _run("compare", trace=trained.traces_f32, trace_b=trace)
    df = next(d.value for d in at.dataframe if "cause" in d.value.columns)
    assert list(df["round A / B"]) == ["10/10", "1/1"]
    assert all(c.startswith("KV visibility after a partial acceptance") for c in df["cause"])
    assert list(df["confirmed"]) == ["yes", "yes"]
    assert all("kv_visibility hf (head=dense)" in r for r in df["replayed"])
