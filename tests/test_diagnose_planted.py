"""``mtpscope diagnose`` on the demo's trained pair with one defect planted per documented cause: the planted
cause must rank first (real llama.cpp, the real recorder and replay).

Plants (each a copy of the trained F32 drafter with bytes patched in place, or a demo file as built):

* the demo's buggy drafter (``rope.freq_base_swa`` = 1e6, demo build) -> ``rope``, expected 10000 (the published
  configs' sliding ``rope_theta``, read from their config.json here);
* dense LM-head rows of 64 tokens pointed along the drafter's mean state, in centroids its centroid head never picks
  (a drafter trained for its sparse head whose dense rows were left untrained) -> ``convention``, ``head=centroid``;
* ``head_count_kv`` [1, 1, 1, 1] where the target's sliding layers have 2 -> ``pair_mismatch``;
* the healthy drafter recorded at n_draft 10 -> ``n_draft``;
* the healthy F32 drafter -> no defect, "nothing points at the drafter file or the runtime";
* the Q8_0 drafter, the F32 one as reference -> no defect, a quantization note with its measured cost.

Small on purpose: a few prompts, 24-32 tokens, a replay of 4 prompts x 4 rounds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from mtpscope.demo.spec import TRAINED_DATA, TrainedPaths  # noqa: E402
from mtpscope.inspector.gguf import open_gguf  # noqa: E402
from mtpscope.traces.diagnose.run import NOTHING_WRONG, diagnose  # noqa: E402
from mtpscope.traces.run.prompts import PromptSpec  # noqa: E402

pytestmark = [pytest.mark.llama, pytest.mark.slow]

SMALL = {"replay_prompts": 4, "rounds_per_prompt": 4}
CONFIGS = Path(__file__).resolve().parent.parent / "sample_configs"


@pytest.fixture(scope="module")
def trained(demo_dir) -> TrainedPaths:  # noqa: ANN001
    tp = TrainedPaths.under(demo_dir.root)
    if not all(p.exists() for p in (*tp.models, *tp.traces.values())):
        pytest.skip("the trained demo pair is not built (mtpscope demo build)")
    return tp


def prompts(categories: tuple[str, ...] = ("code", "json", "prose", "numbers")) -> list[PromptSpec]:
    """The first demo prompt of each category (token ids)."""
    doc = json.loads((TRAINED_DATA / "prompts.json").read_text())["prompts"]
    out = []
    for c in categories:
        p = next(x for x in doc if x["category"] == c)
        out.append(PromptSpec(tokens=tuple(p["ids"]), id=p["name"], category=c))
    return out


def patched(src: Path, dst: Path, writes: list[tuple[int, bytes]]) -> Path:
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as fh:
        for off, data in writes:
            fh.seek(off)
            fh.write(data)
    return dst


def plant_dense_junk(tp: TrainedPaths, dst: Path) -> Path:
    """The F32 drafter with 64 dense LM-head rows set to ``c * u`` (``u``: the mean direction of the drafter's
    ``h_inner`` in the demo's F32 trace; ``c``: twice the 99th percentile of what the best real token scores per unit
    of ``u . h``), the 64 tokens taken from the 4 centroids the sidecar head scores lowest on the mean state."""
    from mtpscope.inspector.centroids import load_centroid_head
    from mtpscope.traces.store.reader import open_trace

    hi = open_trace(tp.traces_f32).hidden("h_inner").astype(np.float64)
    hi = hi[np.isfinite(hi).all(axis=1)]
    mean = hi.mean(axis=0)
    u = mean / np.linalg.norm(mean)
    head = load_centroid_head(tp.sidecar)
    low = np.argsort(head.centroids.astype(np.float64) @ mean)[:4]
    junk = np.concatenate([head.tokens_of(int(c)) for c in low])[:64]
    with open_gguf(tp.drafter) as f:
        t = f.tensor("token_embd.weight")
        emb = np.asarray(f.tensor_data("token_embd.weight"), dtype=np.float64)
    sub = hi[:: max(1, len(hi) // 100)][:100]
    c = 2.0 * float(np.quantile((emb @ sub.T).max(axis=0) / (sub @ u), 0.99))
    row = emb.shape[1] * 4
    return patched(tp.drafter, dst, [(t.offset + int(j) * row, (c * u).astype("<f4").tobytes()) for j in junk])


def plant_kv_heads(tp: TrainedPaths, dst: Path) -> Path:
    """The F32 drafter with ``head_count_kv`` [1, 1, 1, 1] (the target's sliding layers have 2 KV heads)."""
    with open_gguf(tp.drafter) as f:
        arr = f.kv["gemma4-assistant.attention.head_count_kv"].value
        assert arr.element_type_name == "UINT32" and arr.to_list() == [2, 2, 2, 1]
        off = arr.data_offset
    return patched(tp.drafter, dst, [(off, np.array([1, 1, 1, 1], dtype="<u4").tobytes())])


def first(d):  # noqa: ANN001, ANN201
    assert d.findings, "no findings"
    return d.findings[0]


def test_buggy_rope_base_ranks_first_with_the_published_value(trained: TrainedPaths, tmp_path: Path) -> None:
    # with the HF checkpoint it was converted from as the reference: four steps name the same key
    d = diagnose(trace=trained.traces_buggy, reference_hf=trained.hf_drafter, out=tmp_path, **SMALL)
    f = first(d)
    thetas = {json.loads((p / "config.json").read_text())["text_config"]["rope_parameters"]["sliding_attention"]
              ["rope_theta"] for p in CONFIGS.glob("*-assistant")}
    assert thetas == {10000.0}
    assert (f.cause, f.severity, f.subject) == ("rope", "error", "gemma4-assistant.rope.freq_base_swa")
    assert f.expected == 10000.0 and f.actual == 1e6 and f.fix.value == 10000.0
    assert {e.step for e in f.evidence} == {"verify", "published", "reference"} and f.confidence == "high"
    assert {e.numbers.get("code") for e in f.evidence if e.step == "verify"} == {"E_PAIR_ROPE", "H_CONFIG_MISMATCH"}
    # the same tensors, another key: the replayed difference is that key's cost, not a weights finding
    assert d.reference["tensors_differ"] == [] and d.reference["keys_differ"] == [
        "gemma4-assistant.rope.freq_base_swa"]
    assert not [g for g in d.findings if g.cause == "weights"]
    assert d.reference["rate_b"] > d.reference["rate_a"]
    assert d.exit_code == 1
    # what limits acceptance was measured with the defect in place: its fix never says "nothing to change"
    lim = [g for g in d.findings if g.cause == "acceptance_limit"]
    assert lim and all("nothing to change" not in g.fix.text and "defects ranked above" in g.fix.text for g in lim)


def test_drafter_meant_for_its_centroid_head_names_the_variant(trained: TrainedPaths, tmp_path: Path) -> None:
    bad = plant_dense_junk(trained, tmp_path / "drafter-dense-junk.gguf")
    d = diagnose(target=trained.target, assistant=bad, centroids=trained.sidecar, prompts=prompts(), max_tokens=24,
                 out=tmp_path / "out", **SMALL)
    f = first(d)
    assert (f.cause, f.subject, f.severity) == ("convention", "head=centroid", "error"), f.title
    v = d.variants["variants"]["head=centroid"]
    assert v["recovers"] and v["ci_low"] > 0.03 and v["acceptance_rate"] > d.variants["variants"]["baseline"][
        "acceptance_rate"] + 0.1
    assert f.link.page == "compare" and Path(f.link.get("trace_b")).is_dir()
    assert d.exit_code == 1


def test_kv_head_mismatch_is_the_pair_finding(trained: TrainedPaths, tmp_path: Path) -> None:
    bad = plant_kv_heads(trained, tmp_path / "drafter-kv1.gguf")
    d = diagnose(target=trained.target, assistant=bad, prompts=prompts(("code", "prose")), max_tokens=24,
                 out=tmp_path / "out", **SMALL)
    f = first(d)
    assert (f.cause, f.subject, f.severity) == ("pair_mismatch", "gemma4-assistant.attention.head_count_kv", "error")
    assert f.expected == 2 and f.actual == 1
    assert len([e for e in f.evidence if e.step == "verify"]) == 3          # the three sliding layers


def test_n_draft_far_past_the_decay_ranks_first(trained: TrainedPaths, tmp_path: Path) -> None:
    d = diagnose(target=trained.target, assistant=trained.drafter, prompts=prompts(), n_draft=10, max_tokens=32,
                 out=tmp_path, **SMALL)
    f = first(d)
    assert (f.cause, f.severity) == ("n_draft", "warning"), f.title
    # by hand from the trace: among rounds that drafted 10, the share with all 10 accepted
    from mtpscope.traces.store.reader import open_trace

    r = open_trace(d.trace).rounds
    full = r[r["n_draft"] == 10]
    assert f.evidence[0].numbers["marginal"] == pytest.approx(float((full["n_accepted"] >= 10).mean()))
    assert isinstance(f.fix.value, int) and 1 <= f.fix.value < 10
    per_k = {p["k"]: p["acceptance"] for p in d.summary["per_position"]}
    assert per_k[f.fix.value] >= 0.05                                     # the kept depth still pays its way


def test_healthy_f32_drafter_no_defect_says_what_limits(trained: TrainedPaths, tmp_path: Path) -> None:
    d = diagnose(trace=trained.traces_f32, out=tmp_path, **SMALL)
    assert d.exit_code == 0 and not d.defects, [f.title for f in d.defects]
    assert d.limits[0].endswith(NOTHING_WRONG) and d.findings[0].cause == "acceptance_limit"
    assert d.findings[0].title == d.limits[0] == d.headline
    # the hard share, by hand: each round's first rejected draft, hard when the target's entropy >= 1 nat
    from mtpscope.traces.store.reader import open_trace

    t = open_trace(trained.traces_f32)
    r = t.rounds
    s = t.columns("steps", ["prompt_id", "round", "k", "target_entropy", "target_token"])
    rej = r[r["n_accepted"] < r["n_draft"]][["prompt_id", "round", "n_accepted"]].assign(k=lambda x: x.n_accepted + 1)
    m = rej.merge(s, on=["prompt_id", "round", "k"])
    m = m[m["target_token"].notna() & m["target_entropy"].notna()]
    share = float((m["target_entropy"] >= 1.0).mean())
    pct = int(d.limits[0].split(" %")[0])
    assert abs(pct - 100 * share) <= 1.5, (pct, share)
    # the target judged none past an end-of-generation token: a round whose emitted tokens stop at its
    # accepted drafts (an accepted draft ended the generation, no correction token followed)
    ended = {(int(p), int(q)) for p, q, e, a in zip(r["prompt_id"], r["round"], r["emitted"], r["n_accepted"],
                                                    strict=True) if len(e) == a}
    judged = m[[(int(p), int(q)) not in ended for p, q in zip(m["prompt_id"], m["round"], strict=True)]]
    hard = int((judged["target_entropy"] >= 1.0).sum())
    assert f"({hard} of the {len(judged)} the target judged)" in d.limits[0], d.limits[0]
    assert d.variants["baseline_agreement"] == 1.0
    # explain's target-side line accounts for every rejected round: hard + wrong + unknown + those past the
    # end of generation (no target side) = the rounds with a first mismatch, counted here by hand
    import re

    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    out = CliRunner().invoke(app, ["explain", str(trained.traces_f32)]).stdout
    line = next(ln for ln in out.splitlines() if "target side:" in ln)
    nums = [int(re.search(rf"{w}\D*?(\d+)", line).group(1)) for w in ("nat\\) ", "sure\\) ", "unknown ")]
    eog = re.search(r"none after the end of generation (\d+)", line)
    assert sum(nums) + (int(eog.group(1)) if eog else 0) == len(rej), (line, len(rej))
    assert nums[0] == hard and (int(eog.group(1)) if eog else 0) == len(m) - len(judged), line


def test_q8_0_drafter_no_defect_quantization_cost_measured(trained: TrainedPaths, tmp_path: Path) -> None:
    d = diagnose(trace=trained.traces_q8_0, reference_assistant=trained.drafter, out=tmp_path, **SMALL)
    assert d.exit_code == 0, [f.title for f in d.defects]
    (q,) = [f for f in d.findings if f.cause == "quantization"]
    assert q.severity == "info" and "Q8_0" in q.title
    ref = d.reference
    assert ref["quantized"] == ["Q8_0"] and ref["agreement"] is not None and ref["agreement"] > 0.8
    assert ref["ci_low"] is not None and ref["ci_low"] <= 0.03                   # not clearly worse
    # the reference's numbers are the two replays' own counts
    assert ref["delta"] == pytest.approx(ref["rate_b"] - ref["rate_a"])
