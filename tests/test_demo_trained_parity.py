"""The trained demo pair as built by ``mtpscope demo build`` (``<cache>/demo/trained``): HF transformers
and llama.cpp agree on it, and a second build does nothing.

* greedy: teacher-forced on the tokens the real llama.cpp generated in the recorded F32 trace (64 tokens
  or up to an end-of-generation token), the full-vocabulary HF target (fp32) puts its argmax on each of
  them, except at a rare near tie within the F16-KV bound of ``tests.numerics.greedy_near_tie_tol``;
* first round: HF's own assisted generation (``generate(assistant_model=...)``, dense head) drafts what
  llama.cpp drafted in round 0 of each prompt (later rounds differ by design: docs/FIDELITY.md), and the
  centroid head's first draft equals the trace's ``centroid_token`` of step 1;
* idempotent: building again changes no file and returns in well under a second.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.numerics import greedy_near_tie_tol

torch = pytest.importorskip("torch", reason="HF parity needs the parity extra (torch)")
transformers = pytest.importorskip("transformers", reason="HF parity needs the parity extra (transformers)")
pytest.importorskip("llama_cpp", reason="the demo traces need llama-cpp-python")

from mtpscope.demo import trained as dtr  # noqa: E402  # after the importorskip of the parity extra
from mtpscope.demo.spec import TrainedPaths  # noqa: E402  # after the importorskip of the parity extra

pytestmark = [pytest.mark.slow, pytest.mark.llama]

if not (dtr.DATA_DIR / "recipe.json").exists():  # pragma: no cover - a checkout without the trained data
    pytest.skip("no trained demo data in this checkout", allow_module_level=True)


@pytest.fixture(scope="module")
def trained(demo_dir) -> TrainedPaths:
    tp = TrainedPaths.under(demo_dir.root)
    if not all(d.joinpath("manifest.json").exists() for d in tp.traces.values()):
        pytest.skip("the trained demo traces were not recorded")
    return tp


@pytest.fixture(scope="module")
def hf_pair(trained):
    from transformers import Gemma4AssistantForCausalLM, Gemma4ForCausalLM

    torch.set_num_threads(1)
    tm = Gemma4ForCausalLM.from_pretrained(trained.hf_target, dtype=torch.float32, attn_implementation="eager")
    dense = Gemma4AssistantForCausalLM.from_pretrained(trained.hf_drafter, dtype=torch.float32,
                                                       attn_implementation="eager", use_ordered_embeddings=False)
    cent = Gemma4AssistantForCausalLM.from_pretrained(trained.hf_drafter, dtype=torch.float32,
                                                      attn_implementation="eager")
    for dm in (dense, cent):
        dm.generation_config.num_assistant_tokens = 3
        dm.generation_config.num_assistant_tokens_schedule = "constant"
    return tm.eval(), dense.eval(), cent.eval()


def _trace(path):
    from mtpscope.traces.store.reader import open_trace

    return open_trace(path)


def _generated(tr, pid: int) -> list[int]:
    r = tr.rounds[tr.rounds["prompt_id"] == pid].sort_values("round")
    out = [int(r["pending_token"].iloc[0])]
    for e in r["emitted"]:
        out += [int(x) for x in e]
    return out


def _hf_drafts(tm, dm, prompt: list[int], n: int = 3) -> list[int]:
    """HF's own assisted generation, the first ``n`` drafter calls' argmax (the first round). HF drafts
    at most ``max_new_tokens - 2`` tokens in its first round (the prefill's token counts as generated and
    one token is kept for the target's own), so ``max_new_tokens`` is ``n + 2``."""
    got: list[int] = []

    def hook(_m, _a, _k, out):
        got.append(int(out.logits[0, -1].argmax()))

    h = dm.register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            tm.generate(torch.tensor([prompt]), assistant_model=dm, max_new_tokens=n + 2, do_sample=False)
    finally:
        h.remove()
    return got[:n]


def test_hf_agrees_with_llama_cpp_greedy_on_every_demo_prompt(trained, hf_pair) -> None:
    """Teacher-forced on llama.cpp's greedy output: at every generated position the token llama.cpp
    picked is HF's argmax, or (a near tie broken the other way by llama.cpp's F16 KV cache) lies within
    :func:`tests.numerics.greedy_near_tie_tol` of HF's best logit; near ties stay rare."""
    tm = hf_pair[0]
    tr = _trace(trained.traces_f32)
    prompts = tr.manifest["prompts"]
    assert len(prompts) == len(dtr.read_prompts())
    n_layer = tm.config.num_hidden_layers
    n_tokens, ties = 0, []
    for p in prompts:
        ids = [int(x) for x in p["tokens"]]
        want = _generated(tr, int(p["prompt_id"]))
        with torch.no_grad():
            logits = tm(torch.tensor([ids + want[:-1]])).logits[0, len(ids) - 1:].double().numpy()
        assert logits.shape[0] == len(want)
        for i, tok in enumerate(want):
            row = logits[i]
            best = int(row.argmax())
            n_tokens += 1
            if best == tok:
                continue
            gap = float(row[best] - row[tok])
            tol = greedy_near_tie_tol(n_layer, row)
            assert gap <= tol, (p["category"], p["prompt_id"], i, best, tok, gap, tol)
            ties.append((p["prompt_id"], i, gap))
    assert n_tokens >= 1000
    assert len(ties) <= n_tokens // 200, ties


def test_first_round_drafts_match_hf_assisted_generation(trained, hf_pair) -> None:
    tm, dense, cent = hf_pair
    tr = _trace(trained.traces_f32)
    steps = tr.steps
    n = 0
    for p in tr.manifest["prompts"]:
        pid = int(p["prompt_id"])
        r0 = tr.rounds[(tr.rounds["prompt_id"] == pid) & (tr.rounds["round"] == 0)]
        if not len(r0):
            continue  # the first token ended the generation
        drafted = [int(x) for x in r0["drafted"].iloc[0]]
        ids = [int(x) for x in p["tokens"]]
        assert _hf_drafts(tm, dense, ids, len(drafted)) == drafted, (p["category"], pid)
        s1 = steps[(steps["prompt_id"] == pid) & (steps["round"] == 0) & (steps["k"] == 1)]
        assert _hf_drafts(tm, cent, ids, 1) == [int(s1["centroid_token"].iloc[0])], (p["category"], pid)
        n += 1
    assert n >= 25


def test_trained_build_is_idempotent(trained) -> None:
    files = sorted(p for p in trained.root.rglob("*") if p.is_file())
    before = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in files}
    demo_json = trained.demo_json.read_bytes()
    t0 = time.perf_counter()
    dtr.build_trained(trained.root.parent)
    took = time.perf_counter() - t0
    after = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(q for q in trained.root.rglob("*")
                                                                          if q.is_file())}
    assert after == before
    assert trained.demo_json.read_bytes() == demo_json
    assert took < 1.0


def test_demo_json_lists_roles_and_a_worst_prompt(trained) -> None:
    import json

    doc = json.loads(trained.demo_json.read_text())
    roles = {m["role"] for m in doc["models"] if m["pair"] == "trained"}
    assert {"target", "drafter", "drafter-q8_0", "drafter-buggy", "drafter-fork", "sidecar"} <= roles
    assert {t["role"] for t in doc["traces"]} >= {"trace-f32", "trace-q8_0", "trace-buggy"}
    d = doc["default"]
    rows = dtr.per_prompt_acceptance(trained.root.parent / d["trace"])
    assert (d["category"], d["prompt_id"]) == dtr.worst_prompt(rows)
    # independently: the chosen category has the lowest pooled acceptance of the trace
    acc = {}
    for r in rows:
        a = acc.setdefault(r["category"], [0, 0])
        a[0] += r["n_accepted"]
        a[1] += r["n_drafted"]
    assert min(acc, key=lambda c: acc[c][0] / acc[c][1]) == d["category"]
    f32 = next(t for t in doc["traces"] if t["role"] == "trace-f32")["acceptance_rate"]
    buggy = next(t for t in doc["traces"] if t["role"] == "trace-buggy")["acceptance_rate"]
    assert buggy < f32
    assert np.isfinite(f32)


def test_the_buggy_drafter_is_named_by_verify_replay_and_compare(trained, tmp_path) -> None:
    """The demo's conversion bug (rope.freq_base_swa = 1e6 in the drafter) as a user meets it: verify
    names the key against the target; replaying the buggy trace with the correct drafter file
    recovers acceptance the buggy file does not; the Compare page's default view lists the key."""
    from mtpscope.inspector.validate import verify
    from mtpscope.traces.run.replay import replay

    rep = verify(trained.drafter_buggy, target=trained.target)
    codes = {f.code: f for f in rep.findings}
    assert "E_PAIR_ROPE" in codes and "freq_base_swa" in codes["E_PAIR_ROPE"].message
    assert "E_PAIR_ROPE" not in {f.code for f in verify(trained.drafter, target=trained.target).findings}

    same = replay(trained.traces_buggy, max_rounds=60).summary().to_dict()
    fixed = replay(trained.traces_buggy, assistant=trained.drafter, max_rounds=60).summary().to_dict()
    # the reference drafter reproduces the buggy run from the buggy file, and the correct file drafts better
    assert same["variants"]["baseline"]["agreement"] > 0.9
    assert fixed["variants"]["baseline"]["acceptance_rate"] > same["variants"]["baseline"]["acceptance_rate"] + 0.03

    from streamlit.testing.v1 import AppTest

    from mtpscope.cli.serve import main_script

    at = AppTest.from_file(str(main_script()), default_timeout=120)
    at.session_state["sel.trace"] = str(trained.traces_f32)
    at.session_state["sel.trace_b"] = str(trained.traces_buggy)
    at.run()
    at.switch_page("screens/compare.py").run()
    assert not at.exception, [e.value for e in at.exception]
    rows = next(d.value for d in at.dataframe if "what" in d.value.columns)
    hit = rows[rows["name"].str.endswith("rope.freq_base_swa")]
    assert list(hit["A"]) == ["10000.0"] and list(hit["B"]) == ["1000000.0"]


def test_the_app_opens_on_the_trained_trace_and_names_its_worst_prompt(trained) -> None:
    import json

    from streamlit.testing.v1 import AppTest

    from mtpscope.app import selection
    from mtpscope.cli.serve import main_script

    at = AppTest.from_file(str(main_script()), default_timeout=120)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    from pathlib import Path

    assert Path(at.session_state["sel.trace"]).resolve() == trained.traces_f32.resolve()
    assert Path(at.session_state["sel.trace_b"]).resolve() == trained.traces_buggy.resolve()
    d = json.loads(trained.demo_json.read_text())["default"]
    # the start page names the worst category's worst prompt (demo.json's, found by the demo build) ...
    body = " ".join(m.value for m in at.markdown)
    assert f"worst category **{d['category']}**" in body and f"prompt {d['prompt_id']} " in body, body
    # ... and no trace page silently opens on it: every prompt until one is chosen (issue 36)
    assert selection.SEL_PROMPT not in at.session_state
    at.switch_page("screens/acceptance.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key=selection.ACC_PROMPT).value == selection.ALL
