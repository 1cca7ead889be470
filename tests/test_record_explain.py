"""The recorder's extra capture for the explanation layer, with the real llama.cpp: the target's side of
every draft (target_p_drafted, target_entropy), --hidden-target (h_target), --baseline, and prompts files
with tokens / messages / id / category / extra fields.

Independent checks: the target's probability and entropy are recomputed from a separate llama.cpp decode
of the same tokens (a fresh context, one prompt batch) with torch's softmax; h_target is checked against the
next round's drafter input, which the runtime copies from the same verify row.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from mtpscope import traces
from mtpscope.errors import MtpscopeError
from mtpscope.traces.run.llama import model as lm
from mtpscope.traces.run.mtp_runtime import MtpRuntime
from mtpscope.traces.run.record_config import RecordConfig
from mtpscope.traces.run.recorder import record

pytestmark = pytest.mark.llama


@pytest.fixture(scope="module")
def pair(tiny_pair):
    target, _ = tiny_pair(vocab="subset")
    _, noisy = tiny_pair(vocab="subset", noise=2.0)
    _, fork = tiny_pair(vocab="subset", dialect="fork", n_centroids=64, centroid_top_k=4)
    return target, noisy, fork


@pytest.fixture(scope="module")
def recorded(pair, tmp_path_factory):
    target, noisy, fork = pair
    d = tmp_path_factory.mktemp("recx")
    pf = d / "prompts.jsonl"
    lines = [{"prompt": "The quick brown fox", "id": "fox", "category": "story", "source": "hand"},
             {"tokens": [2, 651, 3823, 1024], "id": 7, "category": "ids"},
             {"messages": [{"role": "user", "content": "Hello"}], "category": "chat"}]
    pf.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    out = d / "t"
    with MtpRuntime(target, noisy, n_ctx=512) as r:
        s = record(RecordConfig(max_tokens=24, hidden="f32", hidden_target=True, baseline=True, centroids=fork),
                   target=target, assistant=noisy, out=out, prompts_file=pf, runtime=r, command=["test"])
    return s, traces.open(out), target


def test_manifest_prompts_and_baseline(recorded) -> None:
    s, t, _ = recorded
    p = t.manifest["prompts"]
    assert [x.get("id") for x in p] == ["fox", "7", None]
    assert [x["category"] for x in p] == ["story", "ids", "chat"]
    assert p[0]["extra"] == {"source": "hand"} and p[0]["text"] == "The quick brown fox"
    assert p[1]["tokens"] == [2, 651, 3823, 1024] and p[1]["n_prompt_tokens"] == 4 and p[1]["source"] == "tokens"
    assert "<|turn>user" in p[2]["text"] and p[2]["messages"] == [{"role": "user", "content": "Hello"}]
    b = t.manifest["baseline"]
    assert b["t_per_token_ms"] > 0 and b["n_decodes"] == sum(x["n_decodes"] for x in b["per_prompt"])
    assert b["outputs_equal"] is True          # greedy speculative decoding == plain greedy decoding
    assert t.manifest["dims"]["h_target"] is True and t.manifest["params"]["hidden_target"] is True


def test_target_side_matches_an_independent_decode(recorded) -> None:
    torch = pytest.importorskip("torch")
    _, t, target = recorded
    rounds, steps = t.rounds, t.steps
    # always captured, also next to the centroid head's columns
    assert steps["target_in_candidates"].notna().all()
    assert steps["target_p_drafted"].notna().all() and steps["target_entropy"].notna().all()
    assert (steps["target_p_drafted"] > 0).all() and (steps["target_p_drafted"] <= 1).all()
    r0 = rounds[(rounds["prompt_id"] == 1) & (rounds["round"] == 0)].iloc[0]
    s0 = steps[(steps["prompt_id"] == 1) & (steps["round"] == 0)].sort_values("k")
    # verify row k-1 of round 0 = the target after prompt + pending + d1..d(k-1): decode that sequence
    # alone in a fresh context and read its last row
    m = lm.LlamaModel(target)
    try:
        for k in (1, 2):
            seq = [2, 651, 3823, 1024, int(r0["pending_token"]), *[int(x) for x in list(r0["drafted"])[:k - 1]]]
            ctx = lm.LlamaContext(m, n_ctx=64, n_batch=64, nextn=False)
            b = lm.TokenBatch(64)
            try:
                b.set(seq, 0, logits="last")
                ctx.decode(b)
                lg = torch.tensor(np.array(ctx.logits(len(seq) - 1)), dtype=torch.float64)
            finally:
                b.close()
                ctx.close()
            d = int(list(r0["drafted"])[k - 1])
            p_ref = float(torch.softmax(lg, 0)[d])
            h_ref = float(torch.distributions.Categorical(logits=lg).entropy())
            row = s0[s0["k"] == k].iloc[0]
            # same F16 weights, another batch shape: logits agree to ~1e-4, so p and H to ~1e-4 relative;
            # stored as float32
            assert row["target_p_drafted"] == pytest.approx(p_ref, rel=2e-3, abs=1e-6)
            assert row["target_entropy"] == pytest.approx(h_ref, rel=2e-3, abs=1e-5)
    finally:
        m.close()


def test_h_target_is_the_next_rounds_input(recorded) -> None:
    _, t, _ = recorded
    rounds, steps = t.rounds, t.steps
    ht = t.hidden("h_target")
    h = t.hidden("h")
    assert np.isfinite(ht).all()
    idx = {(int(p), int(r), int(k)): i for i, (p, r, k) in enumerate(zip(steps["prompt_id"], steps["round"], steps["k"]))}
    checked = 0
    for _, r in rounds.iterrows():
        nxt = idx.get((int(r["prompt_id"]), int(r["round"]) + 1, 1))
        this = idx.get((int(r["prompt_id"]), int(r["round"]), int(r["n_accepted"]) + 1))
        if nxt is not None and this is not None:
            # the next round feeds the target's nextn row of the last accepted token: verify row n_accepted
            assert np.array_equal(h[nxt], ht[this])
            checked += 1
    assert checked >= 3


def test_explain_reads_the_new_columns(recorded) -> None:
    from mtpscope.traces.analysis.explain_report import explain_trace
    from mtpscope.traces.analysis.vocab import trace_vocab

    _, t, _ = recorded
    x = explain_trace(t, vocab=trace_vocab(t.manifest))
    d = x.to_dict()
    ts = d["rejections"]["target_side"]
    assert ts["unknown"] == 0 and ts["hard"] + ts["wrong"] == d["rejections"]["n_first_mismatch"] - \
        d["rejections"]["causes"]["after_eog"]
    assert d["drift"] is not None and [p["k"] for p in d["drift"]["per_position"]] == [1, 2, 3]
    assert all(-1.0 <= p["cos_mean"] <= 1.0 for p in d["drift"]["per_position"])
    assert set(d["by_category"]) == {"story", "ids", "chat"}
    assert d["what_if_model"]["cost"]["baseline"] == "measured"
    assert set(d["what_if_by_category"]) == {"story", "ids", "chat"}
    # --prompt by the prompts file's id
    one = explain_trace(t, vocab=trace_vocab(t.manifest), prompt="fox")
    assert one.totals.n_drafted == int(t.rounds.loc[t.rounds["prompt_id"] == 0, "n_draft"].sum())
    # a chat (messages) prompt: its output is in the answer channel, the plain prompts' in none
    nd = t.rounds.groupby("prompt_id")["n_draft"].sum()
    assert {k: v["n_drafted"] for k, v in d["by_channel"].items()} == {"none": int(nd[0] + nd[1]), "answer": int(nd[2])}


def test_bad_tokens_and_hidden_target_without_hidden(pair, tmp_path) -> None:
    target, noisy, _ = pair
    pf = tmp_path / "p.jsonl"
    pf.write_text('"fine"\n{"tokens": [2, 99999]}\n')
    with pytest.raises(MtpscopeError) as ei:
        record(RecordConfig(max_tokens=4, hidden="off"), target=target, assistant=noisy, out=tmp_path / "o",
               prompts_file=pf)
    assert ei.value.key == "line 2: tokens[1]" and ei.value.path == str(pf)
    with pytest.raises(MtpscopeError) as ei:
        record(RecordConfig(hidden="off", hidden_target=True), target=target, assistant=noisy, out=tmp_path / "o2",
               prompt="x")
    assert ei.value.key == "hidden_target"
