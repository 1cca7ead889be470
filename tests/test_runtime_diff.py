"""traces.analysis.runtime_diff on hand-made rounds: the first differing round and step per prompt, and the
known convention named as its cause only where the two traces' conventions differ in that respect."""

from __future__ import annotations

import pandas as pd

from mtpscope.traces.analysis.runtime_diff import LLAMA_CPP_CONVENTION, runtime_convention, runtime_diff

LLAMA = {"source": "record", "runtime": {"llama_cpp_python": "0.3.36"}}
MLX = {"source": "record", "runtime": {"name": "mlx"},
       "convention": {"runtime": "mlx", "draft_position": "p-1", "head": "centroid", "dtype": "float32",
                      "last_round": "n_draft = min(n_draft, max_tokens - emitted)",
                      "eog": "the round loop does not stop at end of generation"}}
MLX_P = {**MLX, "convention": {**MLX["convention"], "draft_position": "p"}}


def _rounds(rows: list[tuple[int, int, int, int, list[int]]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["prompt_id", "round", "pos", "pending_token", "drafted"])


# prompt 0: rounds at pos 10 agree, at pos 12 the second draft differs (then boundaries shift: pos 15 vs 14)
A = _rounds([(0, 0, 10, 5, [1, 2, 3]), (0, 1, 12, 2, [7, 8, 9]), (0, 2, 15, 4, [1, 1, 1]),
             (1, 0, 20, 6, [4, 4, 4]), (1, 1, 24, 9, [3, 3])])
B = _rounds([(0, 0, 10, 5, [1, 2, 3]), (0, 1, 12, 2, [7, 6, 9]), (0, 2, 14, 9, [2, 2, 2]),
             (1, 0, 20, 6, [4, 4, 4]), (1, 1, 24, 9, [3, 3, 5])])


def test_conventions_of_a_llama_recording_and_of_a_manifest_record() -> None:
    import json

    conv = runtime_convention(LLAMA)
    assert conv is not None and conv.to_dict() == LLAMA_CPP_CONVENTION
    assert (conv.runtime, conv.draft_position, conv.head, conv.dtype) == ("llama.cpp", "p", "dense", None)
    mlx = runtime_convention(MLX)
    assert mlx is not None and mlx.draft_position == "p-1" and mlx.kv_visibility is None
    assert runtime_convention({"source": "synthetic", "runtime": {}}) is None
    # the JSON of compare --json is the manifest's mapping again: its keys (notes included) in its order
    man = {"runtime": "hf", "draft_position": "p", "draft_position_note": "same for every step", "head": "centroid",
           "eog": "stop at ... generation_config ([1])", "acceptance": "greedy", "eog_ids": [1, 106]}
    got = runtime_convention({"convention": man})
    assert got is not None and json.dumps(got.to_dict()) == json.dumps(man)
    assert got.eog_stop_ids() == frozenset({1, 106})        # an eog_ids key before the ids in the text


def test_first_differing_round_step_and_cause() -> None:
    d = runtime_diff(A, B, [(0, 0), (1, 1)], manifest_a=LLAMA, manifest_b=MLX)
    assert d.differs == ("draft_position", "eog", "head", "last_round")   # llama.cpp's record names no dtype
    p0, p1 = d.prompts
    # prompt 0: round 1 at pos 12, draft k=2 (8 vs 6); positions differ between the conventions
    assert (p0.what, p0.round_a, p0.round_b, p0.pos, p0.step, p0.cause) == ("drafts", 1, 1, 12, 2, "draft_position")
    assert (p0.n_rounds_compared, p0.n_rounds_differing) == (2, 1)      # pos 15 / 14: not at a common position
    # prompt 1: the last round drafts 2 in A and 3 in B, the first two agree: the last-round cap
    assert (p1.what, p1.round_a, p1.step, p1.cause) == ("n_draft", 1, None, "last_round")
    assert d.causes == {"draft_position": 1, "last_round": 1}
    assert (d.n_rounds_compared, d.n_rounds_differing) == (4, 2)


def test_no_cause_named_where_the_conventions_agree() -> None:
    # the same drafts difference between two traces with llama.cpp's draft position: unexplained
    d = runtime_diff(A, B, [(0, 0)], manifest_a=MLX_P, manifest_b=MLX_P)
    assert d.differs == ()
    assert d.prompts[0].cause is None and d.causes == {"unexplained": 1}


def test_output_length_difference_is_the_eog_policy() -> None:
    same = A[A["prompt_id"] == 0]
    out = [5, 2, 7, 1]                                     # 1: end of generation in A, B goes on
    d = runtime_diff(same, same, [(0, 0)], manifest_a=LLAMA, manifest_b=MLX_P, outputs_a={0: out},
                     outputs_b={0: [*out, 2, 105]})
    assert (d.prompts[0].what, d.prompts[0].cause) == ("output_length", "eog")
    d = runtime_diff(same, same, [(0, 0)], manifest_a=LLAMA, manifest_b=MLX_P, outputs_a={0: out}, outputs_b={0: out})
    assert d.prompts[0].what == "none" and d.causes == {}


def test_a_different_target_token_is_not_a_drafter_convention() -> None:
    same = A[A["prompt_id"] == 0]
    d = runtime_diff(same, same, [(0, 0)], manifest_a=LLAMA, manifest_b=MLX_P, outputs_a={0: [5, 2, 7, 1]},
                     outputs_b={0: [5, 2, 8, 3, 3]})
    p = d.prompts[0]
    assert (p.what, p.cause, p.output_diverged_at) == ("output", None, 2)
    assert d.causes == {"unexplained": 1}


def test_head_cause_confirmed_by_the_dense_runs_own_centroid_token() -> None:
    from mtpscope.traces.analysis.runtime_diff import confirm_head

    d = runtime_diff(A, B, [(0, 0)], manifest_a=LLAMA, manifest_b=MLX_P)   # same position: head differs
    assert d.prompts[0].cause == "head" and d.prompts[0].step == 2
    # A's round 1, step 2: its sparse head would have drafted 6 (B's draft) / 5 (neither)
    steps = pd.DataFrame({"prompt_id": [0, 0], "round": [1, 1], "k": [1, 2], "centroid_token": [7, 6]})
    assert confirm_head(d, steps, None).prompts[0].confirmed is True
    steps["centroid_token"] = [7, 5]
    assert confirm_head(d, steps, None).prompts[0].confirmed is False
    assert confirm_head(d, None, None).prompts[0].confirmed is None


# kv_visibility: a runtime whose drafter still sees the rejected drafts' cells after a partial acceptance
LLAMA_KV = {**LLAMA, "convention": {**LLAMA_CPP_CONVENTION}}
HF_KV = {"source": "record", "runtime": {"name": "hf"},
         "convention": {**LLAMA_CPP_CONVENTION, "runtime": "hf",
                        "kv_visibility": "hf: the rejected drafts' cells stay in the cache until overwritten"}}


def _kv_rounds(acc0: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Round 0 at pos 10 drafts [1, 2, 3] in both and accepts ``acc0`` of them; the next round sits at the same
    position with the same pending token in both, and its second draft differs."""
    cols = ["prompt_id", "round", "pos", "pending_token", "drafted", "n_accepted"]
    nxt = 10 + acc0 + 1
    a = pd.DataFrame([(0, 0, 10, 5, [1, 2, 3], acc0), (0, 1, nxt, 7, [4, 5, 6], 3)], columns=cols)
    b = pd.DataFrame([(0, 0, 10, 5, [1, 2, 3], acc0), (0, 1, nxt, 7, [4, 9, 6], 1)], columns=cols)
    return a, b


def test_kv_visibility_names_a_difference_after_a_partial_acceptance() -> None:
    from mtpscope.traces.analysis.runtime_diff import CAUSES

    a, b = _kv_rounds(1)                  # round 0 accepted 1 of 3: two rejected cells written
    d = runtime_diff(a, b, [(0, 0)], manifest_a=LLAMA_KV, manifest_b=HF_KV)
    assert d.differs == ("kv_visibility",)
    p = d.prompts[0]
    assert (p.what, p.round_a, p.round_b, p.pos, p.step, p.cause) == ("drafts", 1, 1, 12, 2, "kv_visibility")
    assert d.causes == {"kv_visibility": 1} and "kv_visibility" in CAUSES


def test_kv_visibility_not_named_after_a_full_acceptance_nor_where_conventions_agree() -> None:
    a, b = _kv_rounds(3)                  # everything accepted: no rejected cell, nothing to see or hide
    d = runtime_diff(a, b, [(0, 0)], manifest_a=LLAMA_KV, manifest_b=HF_KV)
    assert d.prompts[0].what == "drafts" and d.prompts[0].cause is None
    a, b = _kv_rounds(1)
    d = runtime_diff(a, b, [(0, 0)], manifest_a=LLAMA_KV, manifest_b=LLAMA_KV)
    assert d.differs == () and d.prompts[0].cause is None
    # a runtime that does not say its KV visibility (an MLX trace): the key is not compared
    d = runtime_diff(a, b, [(0, 0)], manifest_a=LLAMA_KV, manifest_b=MLX_P)
    assert "kv_visibility" not in d.differs and d.prompts[0].cause == "head"


def test_draft_position_comes_before_kv_visibility() -> None:
    a, b = _kv_rounds(1)
    hf_p1 = {**HF_KV, "convention": {**HF_KV["convention"], "draft_position": "p-1"}}
    d = runtime_diff(a, b, [(0, 0)], manifest_a=LLAMA_KV, manifest_b=hf_p1)
    assert d.prompts[0].cause == "draft_position"


def test_replays_confirm_a_cause_only_when_each_value_reproduces_its_own_runs_draft() -> None:
    from mtpscope.traces.analysis.runtime_diff import ReplayedDraft, confirmed_counts, replay_plan, with_replays

    d = runtime_diff(A, B, [(0, 0)], manifest_a=LLAMA, manifest_b=MLX)   # prompt 0: step 2, 8 (A) vs 6 (B)
    p = d.prompts[0]
    assert replay_plan(p, d.convention_a, d.convention_b) == ("draft_position", "p", "p-1",
                                                              ("head=dense", "head=centroid"))

    def rd(value: str, held: str, token: int) -> ReplayedDraft:
        return ReplayedDraft("draft_position", value, f"head={held}", token, {8: "a", 6: "b"}.get(token))

    ok = with_replays(d, {0: ((rd("p", "dense", 8), rd("p-1", "dense", 6)), None)})
    assert ok.prompts[0].confirmed is True and confirmed_counts(ok) == {"draft_position": (1, 0)}
    # p-1 drafts A's token too: the position does not explain B's draft
    no = with_replays(d, {0: ((rd("p", "dense", 8), rd("p-1", "dense", 8)), None)})
    assert no.prompts[0].confirmed is False and confirmed_counts(no) == {"draft_position": (0, 1)}
    # the two reproductions under different held heads do not add up to a confirmation
    mixed = with_replays(d, {0: ((rd("p", "dense", 8), rd("p-1", "dense", 7), rd("p", "centroid", 5),
                                  rd("p-1", "centroid", 6)), None)})
    assert mixed.prompts[0].confirmed is False
    skipped = with_replays(d, {0: ((), "not replayed: no GGUF")})
    assert skipped.prompts[0].confirmed is None and skipped.prompts[0].replay_note == "not replayed: no GGUF"


# end of generation: llama.cpp stops at its vocabulary's EOG ids (1 and 106 in Gemma 4's), HF at generation_config's
HF_EOG = {**HF_KV, "convention": {**HF_KV["convention"],
                                  "eog": "stop at the first end-of-generation token of the target's generation_config "
                                         "([1]); a round's tokens after it are dropped"}}


def test_eog_stop_sets_are_compared() -> None:
    from mtpscope.traces.analysis.runtime_diff import runtime_convention

    same = A[A["prompt_id"] == 0]
    conv = runtime_convention(HF_EOG)
    assert conv is not None and conv.eog_stop_ids() == frozenset({1})
    # both say "stop": the listed set {1} is not taken to be llama.cpp's vocabulary set
    d = runtime_diff(same, same, [(0, 0)], manifest_a=LLAMA_KV, manifest_b=HF_EOG)
    assert "eog" in d.differs
    # llama.cpp stops at <end_of_turn> (106), HF goes on to <eos>: 106 is not among HF's stop ids
    out = [5, 2, 7, 106]
    d = runtime_diff(same, same, [(0, 0)], manifest_a=LLAMA_KV, manifest_b=HF_EOG, outputs_a={0: out},
                     outputs_b={0: [*out, 107, 1]})
    p = d.prompts[0]
    assert (p.what, p.cause, p.confirmed) == ("output_length", "eog", True) and d.causes == {"eog": 1}
    # the shorter output ends at 1, which HF stops at too: the stop sets do not explain it
    d = runtime_diff(same, same, [(0, 0)], manifest_a=LLAMA_KV, manifest_b=HF_EOG, outputs_a={0: [5, 2, 1]},
                     outputs_b={0: [5, 2, 1, 9]})
    assert (d.prompts[0].what, d.prompts[0].cause) == ("output_length", None) and d.causes == {"unexplained": 1}
    # two runtimes listing the same stop ids agree
    d = runtime_diff(same, same, [(0, 0)], manifest_a=HF_EOG, manifest_b=HF_EOG)
    assert "eog" not in d.differs


def test_an_alternative_cause_replaces_an_unconfirmed_kv_visibility() -> None:
    """Both the KV visibility and the head differ at a step after a partial acceptance: kv_visibility is named; the
    replays vary it with the head held and the head with the visibility held; where only the head's replays turn
    A's draft into B's, the head is the cause."""
    from mtpscope.traces.analysis.runtime_diff import ReplayedDraft, replay_plans, with_replays

    hf = {**HF_KV, "convention": {**HF_KV["convention"], "head": "centroid"}}
    a, b = _kv_rounds(1)                         # step 2: 5 (A) vs 9 (B)
    d = runtime_diff(a, b, [(0, 0)], manifest_a=LLAMA_KV, manifest_b=hf)
    p = d.prompts[0]
    assert d.differs == ("head", "kv_visibility") and p.cause == "kv_visibility"
    plans = replay_plans(p, d)
    assert plans == {"kv_visibility": ("kv_visibility", "llama.cpp", "hf", ("head=dense", "head=centroid")),
                     "head": ("head", "dense", "centroid", ("kv_visibility=llama.cpp", "kv_visibility=hf"))}

    def rd(key: str, value: str, held: str, token: int) -> ReplayedDraft:
        return ReplayedDraft(key, value, held, token, {5: "a", 9: "b"}.get(token))

    only_head = (rd("kv_visibility", "llama.cpp", "head=dense", 5), rd("kv_visibility", "hf", "head=dense", 5),
                 rd("head", "dense", "kv_visibility=llama.cpp", 5), rd("head", "centroid", "kv_visibility=llama.cpp", 9))
    x = with_replays(d, {0: (only_head, None)})
    assert (x.prompts[0].cause, x.prompts[0].confirmed) == ("head", True) and x.causes == {"head": 1}
    both = (*only_head, rd("kv_visibility", "llama.cpp", "head=centroid", 5), rd("kv_visibility", "hf", "head=centroid", 9))
    x = with_replays(d, {0: (both, None)})
    assert (x.prompts[0].cause, x.prompts[0].confirmed) == ("kv_visibility", True)
    neither = only_head[:3]
    x = with_replays(d, {0: (neither, None)})
    assert (x.prompts[0].cause, x.prompts[0].confirmed) == ("kv_visibility", False)


def test_hf_view_matches_what_hf_handed_over() -> None:
    """HF's view (``runtime_replay.hf_view``) against the arrays HF 5.24 handed its drafter on the demo pair
    (measured with ``HfRuntime.run(capture_calls=True)``, W = 128): prompt 1's round 1 at p = 39 after a round at 38
    that rejected all 3 drafts: full and sliding arrays 40 long, all visible; prompt 14's round 11 at p = 207 after a
    round at 206 that rejected all 3: full 208 long, sliding 131 long with its last 129 visible."""
    import numpy as np

    from mtpscope.inspector.reference import DonorKV
    from mtpscope.traces.run.runtime_replay import hf_view

    def kv(n: int) -> dict[str, DonorKV]:
        z = np.zeros((n, 1, 2), dtype=np.float32)
        return {k: DonorKV(z, z, np.arange(n)) for k in ("sliding", "full")}

    v = hf_view(kv(42), 39, 38, 41, 128)
    assert v["full"].pos.tolist() == list(range(40)) and v["full"].mask is not None and v["full"].mask.all()
    assert v["sliding"].pos.tolist() == list(range(40)) and v["sliding"].mask is not None and v["sliding"].mask.all()
    v = hf_view(kv(210), 207, 206, 209, 128)
    assert v["full"].pos.tolist() == list(range(208))
    s = v["sliding"]
    assert s.mask is not None and len(s.pos) == 131 and s.pos[0] == 206 - 127
    assert np.flatnonzero(s.mask).tolist() == list(range(2, 131))      # positions 81 .. 209: rejected drafts beyond p
    assert s.pos[s.mask].tolist() == list(range(81, 210))


def test_two_llama_runs_at_different_n_draft_name_it() -> None:
    """Two llama.cpp recordings of n_draft 3 and 1 (no convention differs): a round where B drafted fewer tokens,
    its one draft equal to A's first, is the runs' n_draft, not "no known convention explains it"; with equal
    n_draft it stays unnamed."""
    a = _rounds([(0, 0, 11, 5, [900, 518, 107]), (0, 1, 14, 7, [3, 4, 5])])
    b = _rounds([(0, 0, 11, 5, [900]), (0, 1, 13, 2, [8])])
    man_a, man_b = {**LLAMA, "params": {"n_draft": 3}}, {**LLAMA, "params": {"n_draft": 1}}
    d = runtime_diff(a, b, [(0, 0)], manifest_a=man_a, manifest_b=man_b)
    (p,) = d.prompts
    assert d.differs == () and (p.what, p.round_a, p.pos, p.cause) == ("n_draft", 0, 11, "n_draft")
    assert d.causes == {"n_draft": 1}
    same = runtime_diff(a, b, [(0, 0)], manifest_a=man_a, manifest_b={**LLAMA, "params": {"n_draft": 3}})
    assert same.prompts[0].cause is None and same.causes == {"unexplained": 1}
