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
* the Q8_0 drafter, the F32 one as reference -> no defect, a quantization note with its measured cost;
* ``attention.sliding_window`` 8 where the target has 128 -> a warning that names the key, both values and what
  replaying the sample with 128 measured (issue 32);
* blk.0's query rows' halves exchanged, blk.1's post-attention norm + 1, blk.2's ffn_up copied into ffn_gate, blk.3's
  ffn_down x 0.5, the F32 drafter as reference -> one weights finding per recognised tensor and pattern, one naming
  the unrecognised tensor, all of the documented rule's severity; the same recording without a reference -> the
  behaviour points at the drafter (first misses on tokens the target was sure of), never the all-clear.

Small on purpose: a few prompts, 24-32 tokens, a replay of 4 prompts x 4 rounds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from mtpscope.demo.spec import TRAINED_DATA, TrainedPaths
from mtpscope.inspector.gguf import open_gguf
from mtpscope.traces.diagnose.config import DiagnoseConfig
from mtpscope.traces.diagnose.run import NOTHING_WRONG, diagnose
from mtpscope.traces.run.prompts import PromptSpec

pytestmark = [pytest.mark.llama, pytest.mark.slow]

SMALL = {"replay_prompts": 4, "rounds_per_prompt": 4}


def small(**kw: object) -> DiagnoseConfig:
    """The diagnosis these tests run: a small replay (:data:`SMALL`), and ``kw`` (the recording's n_draft,
    max_tokens, centroids; replay)."""
    return DiagnoseConfig(**SMALL, **kw)
CONFIGS = Path(__file__).resolve().parent.parent / "sample_configs"


@pytest.fixture(scope="module")
def trained(demo_dir) -> TrainedPaths:
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


def first(d):
    assert d.findings, "no findings"
    return d.findings[0]


def test_buggy_rope_base_ranks_first_with_the_published_value(trained: TrainedPaths, tmp_path: Path) -> None:
    # with the HF checkpoint it was converted from as the reference: four steps name the same key
    d = diagnose(small(), trace=trained.traces_buggy, reference_hf=trained.hf_drafter, out=tmp_path)
    f = first(d)
    thetas = {json.loads((p / "config.json").read_text())["text_config"]["rope_parameters"]["sliding_attention"]
              ["rope_theta"] for p in CONFIGS.glob("*-assistant")}
    assert thetas == {10000.0}
    assert (f.cause, f.severity, f.subject) == ("rope", "error", "gemma4-assistant.rope.freq_base_swa")
    assert f.expected == 10000.0 and f.actual == 1e6 and f.fix.value == 10000.0
    assert {e.step for e in f.evidence} == {"verify", "published", "reference"} and f.confidence == "high"
    assert {e.numbers.get("code") for e in f.evidence if e.step == "verify"} == {"E_PAIR_ROPE", "H_CONFIG_MISMATCH"}
    # the same tensors, another key: the replayed difference is that key's cost, not a weights finding
    assert d.reference.numbers["tensors_differ"] == [] and d.reference.numbers["keys_differ"] == [
        "gemma4-assistant.rope.freq_base_swa"]
    assert not [g for g in d.findings if g.cause == "weights"]
    assert d.reference.numbers["rate_b"] > d.reference.numbers["rate_a"]
    assert d.exit_code == 1
    # what limits acceptance was measured with the defect in place: its fix never says "nothing to change"
    lim = [g for g in d.findings if g.cause == "acceptance_limit"]
    assert lim and all("nothing to change" not in g.fix.text and "defects ranked above" in g.fix.text for g in lim)


def test_drafter_meant_for_its_centroid_head_names_the_variant(trained: TrainedPaths, tmp_path: Path) -> None:
    bad = plant_dense_junk(trained, tmp_path / "drafter-dense-junk.gguf")
    d = diagnose(small(centroids=trained.sidecar, max_tokens=24), target=trained.target, assistant=bad,
                 prompts=prompts(), out=tmp_path / "out")
    f = first(d)
    assert (f.cause, f.subject, f.severity) == ("convention", "head=centroid", "error"), f.title
    v = d.variants.variants["head=centroid"]
    assert v.recovers and v.ci_low > 0.03 and v.acceptance_rate > d.variants.variants["baseline"].acceptance_rate + 0.1
    assert f.link.page == "compare" and Path(f.link.get("trace_b")).is_dir()
    assert d.exit_code == 1


def test_kv_head_mismatch_is_the_pair_finding(trained: TrainedPaths, tmp_path: Path) -> None:
    bad = plant_kv_heads(trained, tmp_path / "drafter-kv1.gguf")
    d = diagnose(small(max_tokens=24), target=trained.target, assistant=bad, prompts=prompts(("code", "prose")),
                 out=tmp_path / "out")
    f = first(d)
    assert (f.cause, f.subject, f.severity) == ("pair_mismatch", "gemma4-assistant.attention.head_count_kv", "error")
    assert f.expected == 2 and f.actual == 1
    assert len([e for e in f.evidence if e.step == "verify"]) == 3          # the three sliding layers


def test_n_draft_far_past_the_decay_ranks_first(trained: TrainedPaths, tmp_path: Path) -> None:
    d = diagnose(small(n_draft=10, max_tokens=32), target=trained.target, assistant=trained.drafter,
                 prompts=prompts(), out=tmp_path)
    f = first(d)
    assert (f.cause, f.severity) == ("n_draft", "warning"), f.title
    # by hand from the trace: among rounds that drafted 10, the share with all 10 accepted
    from mtpscope.traces.store.reader import open_trace

    r = open_trace(d.trace).rounds
    full = r[r["n_draft"] == 10]
    assert f.evidence[0].numbers["marginal"] == pytest.approx(float((full["n_accepted"] >= 10).mean()))
    assert isinstance(f.fix.value, int) and 1 <= f.fix.value < 10
    per_k = {p.k: p.acceptance for p in d.summary.per_position or ()}
    assert per_k[f.fix.value] >= 0.05                                     # the kept depth still pays its way


def test_healthy_f32_drafter_no_defect_says_what_limits(trained: TrainedPaths, tmp_path: Path) -> None:
    d = diagnose(small(), trace=trained.traces_f32, out=tmp_path)
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
    # accepted drafts (an accepted draft ended the generation, no correction token followed), or whose drafted
    # end-of-generation token the target confirmed, which llama.cpp counts as the target's own (eog_confirmed)
    ended = {(int(p), int(q)) for p, q, e, a, c in zip(r["prompt_id"], r["round"], r["emitted"], r["n_accepted"],
                                                       r["eog_confirmed"], strict=True) if len(e) == a or (c is not None and bool(c))}
    judged = m[[(int(p), int(q)) not in ended for p, q in zip(m["prompt_id"], m["round"], strict=True)]]
    hard = int((judged["target_entropy"] >= 1.0).sum())
    assert f"({hard} of the {len(judged)} the target judged)" in d.limits[0], d.limits[0]
    # llama.cpp and the reference agree up to what the numerics explain (docs/FIDELITY.md, any CPU)
    nc = d.variants.baseline_numerics
    assert nc["judged"] and nc["unexplained"] == 0 and d.variants.baseline_agreement >= nc["expected_agreement"]
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
    d = diagnose(small(), trace=trained.traces_q8_0, reference_assistant=trained.drafter, out=tmp_path)
    assert d.exit_code == 0, [f.title for f in d.defects]
    (q,) = [f for f in d.findings if f.cause == "quantization"]
    assert q.severity == "info" and "Q8_0" in q.title
    ref = d.reference.numbers
    assert ref["quantized"] == ["Q8_0"] and ref["agreement"] is not None and ref["agreement"] > 0.8
    assert ref["ci_low"] is not None and ref["ci_low"] <= 0.03                   # not clearly worse
    # the reference's numbers are the two replays' own counts
    assert ref["delta"] == pytest.approx(ref["rate_b"] - ref["rate_a"])
    # no runtime divergence on any CPU, and the finding states what the numerics lead to expect of the runtime
    assert not [f for f in d.findings if f.cause == "runtime_divergence"]
    nc = d.variants.baseline_numerics
    assert nc["judged"] and nc["unexplained"] == 0
    ev = [e for e in q.evidence if e.numbers.get("expected_agreement") is not None]
    assert ev and ev[0].numbers["expected_agreement"] == nc["expected_agreement"]
    assert "Q8_0 (Q8_0 weights)" in ev[0].text and f"measured {d.variants.baseline_agreement:.1%}" in ev[0].text


# ------------------------------------------------------------------------- issue 32: what is said around them

WINDOW_KEY = "gemma4-assistant.attention.sliding_window"


def plant_window(tp: TrainedPaths, dst: Path, value: int = 8) -> Path:
    """The F32 drafter with ``attention.sliding_window`` = ``value`` (a UINT32 key: the pair's key string, its
    u32 type, then the value; the old bytes checked before patching)."""
    with open_gguf(tp.drafter) as f:
        kv = f.kv[WINDOW_KEY]
        assert kv.type_name == "UINT32"
        off = kv.offset + 8 + len(WINDOW_KEY.encode()) + 4
        old = kv.value
    with open(tp.drafter, "rb") as fh:
        fh.seek(off)
        assert int(np.frombuffer(fh.read(4), dtype="<u4")[0]) == old
    return patched(tp.drafter, dst, [(off, np.array([value], dtype="<u4").tobytes())])


#: the weights plant: tensor -> what was done to it (the first three are patterns diagnose must name)
WEIGHT_PLANTS = {"blk.0.attn_q.weight": "rows_halves_swapped", "blk.1.post_attention_norm.weight": "norm_plus_one",
                 "blk.2.ffn_gate.weight": "gate_is_up", "blk.3.ffn_down.weight": "scaled by 0.5"}


def plant_weights(tp: TrainedPaths, dst: Path) -> Path:
    """The F32 drafter with :data:`WEIGHT_PLANTS`: blk.0's query projection with its two row halves exchanged,
    blk.1's post-attention norm + 1, blk.2's up projection copied into its gate, blk.3's down projection x 0.5 (no
    known pattern: every row's relative error |1 - 0.5| / 1 = 0.5)."""
    with open_gguf(tp.drafter) as f:
        def arr(n: str) -> tuple[int, np.ndarray]:
            t = f.tensor(n)
            assert t.type_name == "F32"
            return t.offset, np.array(f.tensor_data(n), dtype=np.float32)

        (oq, q), (on, nrm), (og, _), (_, up), (od, down) = (arr(n) for n in (
            "blk.0.attn_q.weight", "blk.1.post_attention_norm.weight", "blk.2.ffn_gate.weight", "blk.2.ffn_up.weight",
            "blk.3.ffn_down.weight"))
    h = q.shape[0] // 2
    return patched(tp.drafter, dst, [(oq, np.concatenate([q[h:], q[:h]]).astype("<f4").tobytes()),
                                     (on, (nrm + 1).astype("<f4").tobytes()), (og, up.astype("<f4").tobytes()),
                                     (od, (0.5 * down).astype("<f4").tobytes())])


def _replayed(folder: Path) -> tuple[object, np.ndarray, np.ndarray]:
    """A replay folder's steps and, per prompt (sorted by id), the drafted and the would-be accepted count of its
    baseline, read from its steps.parquet here."""
    import pandas as pd

    s = pd.read_parquet(folder / "steps.parquet")
    g = s.groupby("prompt_id", sort=True)["accepted[baseline]"].agg(["size", "sum"])
    return s, g["size"].to_numpy(np.float64), g["sum"].to_numpy(np.float64)


def _compared(a: Path, b: Path) -> dict:
    """Two replays of the same sample compared by hand: rates, delta b - a, the paired bootstrap interval over prompts
    (traces.analysis.align.bootstrap_delta on the counts counted here), and the share of steps drafted alike."""
    from mtpscope.traces.analysis.align import bootstrap_delta

    sa, da, aa = _replayed(a)
    sb, db, ab = _replayed(b)
    out = bootstrap_delta(da, aa, db, ab)
    keys = ["prompt_id", "round", "k"]
    m = sa[keys + ["draft[baseline]"]].merge(sb[keys + ["draft[baseline]"]], on=keys, suffixes=("_a", "_b"))
    out["agreement"] = float((m["draft[baseline]_a"] == m["draft[baseline]_b"]).mean())
    assert out["rate_a"] == pytest.approx(aa.sum() / da.sum()) and out["rate_b"] == pytest.approx(ab.sum() / db.sum())
    return out


def test_a_sliding_window_unlike_the_targets_says_what_it_costs(trained: TrainedPaths, tmp_path: Path) -> None:
    # one key differs from the target's: the finding says so, with both values, and what replaying the sample with
    # the target's value measured (and the reference, the healthy drafter, measures the same key alone)
    bad = plant_window(trained, tmp_path / "drafter-window8.gguf")
    with open_gguf(trained.target) as f:
        want = int(f.kv["gemma4.attention.sliding_window"].value)
    assert want != 8
    d = diagnose(small(max_tokens=24), target=trained.target, assistant=bad, prompts=prompts(),
                 reference_assistant=trained.drafter, out=tmp_path / "out")
    f = first(d)
    assert (f.cause, f.subject, f.severity) == ("pair_mismatch", WINDOW_KEY, "warning"), f.title
    assert f.title.startswith(f"{WINDOW_KEY}: the drafter has 8, its target {want}; ")
    assert "another target" not in f.fix.text and (f.fix.kind, f.fix.key, f.fix.value) == ("metadata", WINDOW_KEY, want)
    # the reference's diff of the same key is evidence of this finding, not a second finding
    assert [g.subject for g in d.findings].count(WINDOW_KEY) == 1
    assert {e.step for e in f.evidence} == {"verify", "replay", "reference"}
    # by hand: the sample replayed with the file (replay/) and with a copy holding the target's window (replay-key/)
    key_dir = tmp_path / "out" / "replay-key" / "sliding_window"
    with open_gguf(key_dir / "drafter.gguf") as g:
        assert g.kv[WINDOW_KEY].value == want
    m = _compared(tmp_path / "out" / "replay", key_dir / "replay")
    (ev,) = [e for e in f.evidence if e.step == "replay"]
    assert ev.numbers["delta"] == pytest.approx(m["delta"]) and ev.numbers["agreement"] == pytest.approx(m["agreement"])
    assert (ev.numbers["ci_low"], ev.numbers["ci_high"]) == pytest.approx((m["ci_low"], m["ci_high"]))
    lo, hi, dl = m["ci_low"], m["ci_high"], m["delta"]
    words = ("it costs acceptance" if lo > 0 and dl >= 0.03 else
             "drafts better with its own value" if hi < 0 and dl <= -0.03 else
             "a small effect" if lo > 0 or hi < 0 else
             "no measurable effect on acceptance" if lo > -0.03 and hi < 0.03 else "not clearly different from no effect")
    assert words in f.title and f"{dl:+.3f}" in f.title and f"{1 - m['agreement']:.0%} of steps" in f.title, f.title
    # the recording's own acceptance (with the drafter's window), counted from its rounds
    from mtpscope.traces.store.reader import open_trace

    r = open_trace(d.trace).rounds
    assert f"the recording's acceptance (with 8) is {r['n_accepted'].sum() / r['n_draft'].sum():.3f}" in ev.text
    assert d.exit_code == 1


@pytest.fixture(scope="module")
def weights_plant(trained: TrainedPaths, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, object]:
    """The drafter of :func:`plant_weights`, recorded and diagnosed with the healthy F32 drafter as the reference:
    (drafter, output folder, diagnosis)."""
    root = tmp_path_factory.mktemp("weights-plant")
    bad = plant_weights(trained, root / "drafter-weights.gguf")
    d = diagnose(small(max_tokens=24), target=trained.target, assistant=bad, prompts=prompts(),
                 reference_assistant=trained.drafter, out=root / "out")
    return bad, root / "out", d


def test_weights_findings_name_the_tensor_and_its_pattern(trained: TrainedPaths, weights_plant) -> None:
    bad, out, d = weights_plant
    weights = [f for f in d.findings if f.cause == "weights"]
    named = {f.subject: f for f in weights if f.subject != "weights"}
    assert {n: f.fix.value for n, f in named.items()} == {n: p for n, p in WEIGHT_PLANTS.items() if "_" in p}
    with open_gguf(trained.drafter) as f:
        rows = f.tensor("blk.0.attn_q.weight").shape[0]
    q = named["blk.0.attn_q.weight"]
    assert q.title.startswith(f"blk.0.attn_q.weight: the two halves of its rows are exchanged: its rows [0, {rows // 2}) "
                              f"hold the reference's rows [{rows // 2}, {rows})"), q.title
    assert named["blk.1.post_attention_norm.weight"].title.startswith(
        "blk.1.post_attention_norm.weight: it equals the reference's + 1")
    assert "subtract 1" in named["blk.1.post_attention_norm.weight"].fix.text
    assert named["blk.2.ffn_gate.weight"].title.startswith(
        "blk.2.ffn_gate.weight: it equals the reference's blk.2.ffn_up.weight")
    # the difference no pattern explains: its tensor and its largest relative error (0.5 on every row, by hand)
    (gen,) = [f for f in weights if f.subject == "weights"]
    assert "blk.3.ffn_down.weight (largest relative error 0.5)" in gen.title, gen.title
    # one rule, from the two replays compared by hand (docs/DIAGNOSE.md "Severity of a weights finding")
    m = _compared(out / "replay", out / "reference" / "replay")
    assert d.reference.numbers["agreement"] == pytest.approx(m["agreement"]) and d.reference.numbers["ci_low"] == pytest.approx(m["ci_low"])
    sev = ("error" if m["ci_low"] >= 0.03 else "warning" if m["ci_low"] > 0 or m["agreement"] < 0.98 else "info")
    assert {f.severity for f in weights} == {sev}
    assert {f.confidence for f in named.values()} == {"high"}
    assert gen.confidence == {"error": "high", "warning": "medium"}[sev]
    assert f"{1 - m['agreement']:.0%} of steps" in q.title
    assert d.exit_code == 1


def test_without_a_reference_the_behaviour_points_at_the_drafter(weights_plant, tmp_path: Path) -> None:
    # the same recording, no reference: the first misses' sides say the drafter is wrong where the target was sure
    _, out, d0 = weights_plant
    d = diagnose(DiagnoseConfig(replay=False), trace=d0.trace, out=tmp_path)
    from mtpscope.traces.store.reader import open_trace

    t = open_trace(d0.trace)
    r = t.rounds
    s = t.columns("steps", ["prompt_id", "round", "k", "target_entropy", "target_token"])
    s = s.merge(r[["prompt_id", "round", "n_draft", "n_accepted"]], on=["prompt_id", "round"])
    ended = {(int(p), int(q)) for p, q, e, a in zip(r["prompt_id"], r["round"], r["emitted"], r["n_accepted"],
                                                    strict=True) if len(e) == a}
    s = s[s["target_entropy"].notna()]
    acc = s[s["k"] <= s["n_accepted"]]
    miss = s[(s["k"] == s["n_accepted"] + 1) & (s["n_accepted"] < s["n_draft"]) & s["target_token"].notna()]
    miss = miss[[(int(p), int(q)) not in ended for p, q in zip(miss["prompt_id"], miss["round"], strict=True)]]
    ms, mh = int((miss["target_entropy"] < 1).sum()), int((miss["target_entropy"] >= 1).sum())
    js, jh = ms + int((acc["target_entropy"] < 1).sum()), mh + int((acc["target_entropy"] >= 1).sum())
    assert ms / (ms + mh) >= 0.5 * js / (js + jh) and ms + mh >= 20       # the plant is in the documented regime
    (h,) = [f for f in d.findings if f.cause == "weights"]
    assert (h.severity, h.confidence) == ("warning", "low")
    n = h.evidence[0].numbers
    assert (n["missed_sure"], n["missed_hard"], n["judged_sure"], n["judged_hard"]) == (ms, mh, js, jh)
    assert f"{100 * ms / (ms + mh):.0f} % of first misses ({ms} of {ms + mh})" in h.title
    assert "--reference HF_DIR" in h.fix.text and "mtpscope diff" in h.fix.text
    # never the all-clear: the limit names the check that would pin it
    assert not d.limits[0].endswith(NOTHING_WRONG) and "--reference-assistant GOOD.gguf" in d.limits[0]
    assert d.exit_code == 1
