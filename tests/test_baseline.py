"""The plain-decoding baseline trace (traces/run/baseline.py) against llama.cpp's own plain decoding
(``MtpRuntime.generate_plain`` run untimed), on the tiny demo pair."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp")
pytestmark = pytest.mark.llama


def test_baseline_trace_is_plain_decoding(tiny_pair, tmp_path) -> None:
    from mtpscope.traces.analysis import metrics
    from mtpscope.traces.run.baseline import record_baseline, timed_plain
    from mtpscope.traces.run.mtp_runtime import MtpRuntime
    from mtpscope.traces.run.record_config import RecordConfig
    from mtpscope.traces.store.reader import open_trace

    target, drafter = tiny_pair()
    prompts = ["The quick brown fox", "Once upon a time there was"]
    with MtpRuntime(target, drafter, n_threads=1, n_batch=16) as rtm:
        want = [rtm.generate_plain(rtm.prompt_tokens(p), max_tokens=10) for p in prompts]
        # a prompt longer than n_batch is prefilled in several decodes: the timer skips them all
        long_toks = rtm.prompt_tokens(" ".join(["word"] * 40))
        gen, ms = timed_plain(rtm, long_toks, max_tokens=6)
        assert gen == rtm.generate_plain(long_toks, max_tokens=6) and len(ms) == len(gen) - 1
        s = record_baseline(RecordConfig(max_tokens=10, n_gpu_layers=0), rtm=rtm, out=tmp_path / "b", prompts=prompts,
                            command=["test"])
    assert [list(o) for o in s.outputs] == want
    tr = open_trace(tmp_path / "b")
    assert tr.manifest["source"] == "baseline" and tr.manifest["complete"]
    assert tr.manifest["models"]["assistant"] is None
    r = tr.rounds
    assert len(r) == s.n_rounds == sum(len(w) - 1 for w in want)
    for pid, w in enumerate(want):
        rr = r[r["prompt_id"] == pid].sort_values("round")
        assert [int(rr["pending_token"].iloc[0]), *[int(e[0]) for e in rr["emitted"]]] == w
        n0 = tr.manifest["prompts"][pid]["n_prompt_tokens"]
        assert rr["pos"].tolist() == list(range(n0, n0 + len(w) - 1))
    assert (r["n_draft"] == 0).all() and (r["n_accepted"] == 0).all() and (r["t_verify_ms"] > 0).all()
    assert s.decode_seconds == pytest.approx(r["t_verify_ms"].sum() / 1e3)
    assert metrics.totals(r).n_drafted == 0
    assert len(tr.steps) == 0


def test_baseline_takes_what_record_takes(tiny_pair, tmp_path) -> None:
    """Token-id prompts (as a sweep passes them) with an id and a category: the same ids decoded, and the
    manifest's prompt entries name them as `record` writes them."""
    from mtpscope.traces.run.baseline import record_baseline
    from mtpscope.traces.run.mtp_runtime import MtpRuntime
    from mtpscope.traces.run.prompts import PromptSpec
    from mtpscope.traces.run.record_config import RecordConfig
    from mtpscope.traces.store.reader import open_trace

    target, drafter = tiny_pair()
    with MtpRuntime(target, drafter, n_threads=1) as rtm:
        ids = rtm.prompt_tokens("Every sailor sings about")
        want = rtm.generate_plain(ids, max_tokens=8)
        s = record_baseline(RecordConfig(max_tokens=8, n_gpu_layers=0), rtm=rtm, out=tmp_path / "b", command=["test"],
                            prompts=[PromptSpec(tokens=tuple(ids), id="s1", category="story"), "Hello world"])
    assert list(s.outputs[0]) == want
    e = open_trace(tmp_path / "b").manifest["prompts"]
    assert (e[0]["id"], e[0]["category"], e[0]["source"], e[0]["tokens"]) == ("s1", "story", "tokens", list(ids))
    assert e[0]["n_prompt_tokens"] == len(ids) and e[1]["text"] == "Hello world" and "category" not in e[1]
