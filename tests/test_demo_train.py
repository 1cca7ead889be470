"""The demo pair's training code (mtpscope.demo.train): its multi-query drafter forward against
transformers' own one-query-per-call drafter forward, the compact loss against the full-vocabulary
softmax, the centroid head's permutation, and the MTP simulation's bookkeeping.

Small random models (a few hundred compact rows); no tokenizer, no training run.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the demo training code needs the parity extra (torch)")
pytest.importorskip("transformers", reason="the demo training code needs the parity extra (transformers)")

from mtpscope.demo.train import centroids, compact, evaluation, models, recipe  # noqa: E402  # after the importorskip of the parity extra
from mtpscope.errors import MtpscopeError  # noqa: E402  # after the importorskip of the parity extra

pytestmark = pytest.mark.slow

SMALL_T = recipe.TargetShape(n_embd=32, n_head=2, n_head_kv=2, n_head_kv_full=1, head_dim=16, head_dim_full=32,
                             n_ff=64, sliding_window=6, n_ctx=256)
SMALL_D = recipe.DrafterShape(n_embd=24, n_head=2, n_ff=48, n_centroids=8, top_k=2)


def _models(seed: int = 0, n_vocab: int = 300):
    torch.manual_seed(seed)
    tm = models.make_target(models.target_config(SMALL_T, n_vocab)).eval()
    dm = models.make_drafter(models.drafter_config(SMALL_D, SMALL_T, n_vocab)).eval()
    # HF's init leaves norms at 1 and the projections tiny; make every weight matter
    with torch.no_grad():
        for m in (tm, dm):
            for _name, p in m.named_parameters():
                if p.ndim == 1:
                    p.copy_(1 + 0.3 * torch.randn_like(p))
                else:
                    p.normal_(0, 1 / math.sqrt(p.shape[-1]))
    return tm, dm


def _chain_vs_hf(extra_sliding: int = 0, position_shift: int = 0) -> list[float]:
    """Worst |difference| / max |value| per draft step k between the batched chain and transformers'
    own one-query drafter calls (logits and h_next); ``extra_sliding`` / ``position_shift`` hand HF a
    deliberately different window / position (negative controls)."""
    tm, dm = _models()
    T, W, n_draft = 20, SMALL_T.sliding_window, 3
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 300, (2, T), generator=g)
    worst = [0.0] * n_draft
    n = 0
    with torch.no_grad():
        tp = models.target_pass(tm, ids, logits=False)
        ours = models.drafter_chain(dm, tm, ids, tp, n_draft, W)
        emb = tm.model.embed_tokens(ids)
        for b in range(2):
            for t in range(T - n_draft):
                lo = max(0, t + 2 - W - extra_sliding)   # llama.cpp's window for a query at t + 1: the last W - 1 positions
                kv = {"sliding_attention": tuple(a[b: b + 1, :, lo: t + 1] for a in tp["kv"]["sliding_attention"]),
                      "full_attention": tuple(a[b: b + 1, :, : t + 1] for a in tp["kv"]["full_attention"])}
                h = tp["h"][b: b + 1, t: t + 1]
                for k in range(1, n_draft + 1):
                    x = torch.cat([emb[b: b + 1, t + k: t + k + 1], h], dim=-1)
                    out = dm(inputs_embeds=x, position_ids=torch.tensor([[t + 1 + position_shift]]),
                             shared_kv_states=kv)
                    mine = ours[k - 1]
                    for a, m in ((out.logits[0, 0], mine["logits"][b, t]), (out.last_hidden_state[0, 0],
                                                                              mine["h_next"][b, t])):
                        worst[k - 1] = max(worst[k - 1], float((a - m).abs().max() / a.abs().max()))
                    h = out.last_hidden_state
                    n += 1
    assert n == 2 * (T - n_draft) * n_draft
    return worst


def test_drafter_forward_matches_hf_one_query_per_call() -> None:
    """Every (base t, step k) of the batched training chain equals transformers' own drafter forward
    called with one query, handed the K/V the batched masks make visible (full: positions <= t;
    sliding: the last W-1 of them) and chained on its own h_next: step 1 within 3e-6 of the values'
    scale (fp32 rounding, measured 1.3e-6), the chained steps within 1e-5 (rounding carried through
    h_next, measured 4.4e-6). One more sliding entry, or the position one off, differs by far more."""
    w = _chain_vs_hf()
    assert w[0] <= 3e-6 and max(w) <= 1e-5, w
    assert _chain_vs_hf(extra_sliding=1)[0] > 1e-3
    assert _chain_vs_hf(position_shift=-1)[0] > 1e-3


def test_hf_mask_of_a_short_sliding_array_shows_everything() -> None:
    """The comparison above hands HF at most W-1 sliding entries; HF's own drafter mask then hides none
    of them (so the visible set is the one the batched masks use)."""
    _, dm = _models()
    W = SMALL_T.sliding_window
    kv = {"sliding_attention": (torch.zeros(1, 2, W - 1, 16),) * 2, "full_attention": (torch.zeros(1, 1, 9, 32),) * 2}
    m = dm.create_attention_masks(torch.zeros(1, 1, SMALL_D.n_embd), None, kv)
    for name, n in (("sliding_attention", W - 1), ("full_attention", 9)):
        mask = m[name]
        if mask is not None:
            vis = mask.reshape(-1)[-n:]
            assert bool((vis if vis.dtype == torch.bool else vis == 0).all()), name


def test_multi_query_call_without_slice_hits_the_known_trap() -> None:
    """transformers 5.24: several drafter queries with an int ``logits_to_keep`` fail inside the text
    model (the reason drafter_forward passes ``slice(None)``)."""
    tm, dm = _models()
    ids = torch.randint(5, 300, (1, 8))
    with torch.no_grad():
        tp = models.target_pass(tm, ids, logits=False)
        x = dm.pre_projection(torch.cat([tm.model.embed_tokens(ids), tp["h"]], -1))
        with pytest.raises(TypeError):
            dm.model(inputs_embeds=x, position_ids=torch.arange(8)[None], shared_kv_states=dict(tp["kv"]),
                     use_cache=False)


def test_compact_cross_entropy_equals_full_vocabulary_softmax() -> None:
    """A 40-id vocabulary: 4 kept ids, 3 rare ids sharing one row, 33 unused (zero rows). The compact
    loss equals the full model's cross-entropy (rare label: the log-probability of the 3 copies)."""
    vocab = compact.CompactVocab(np.array([0, 5, 9, 20], dtype=np.int32), np.array([3, 11, 30], dtype=np.int32),
                                 n_vocab=40)
    assert vocab.n_rows == 5 and vocab.n_unused == 33
    g = torch.Generator().manual_seed(3)
    lg = torch.randn(7, 5, generator=g) * 3
    lab = torch.tensor([0, 1, 2, 3, 4, 5, 2])    # 4 = rare, 5 = an unused id
    got = compact.compact_cross_entropy(lg, lab, vocab, reduction="none")
    full = torch.zeros(7, 40)
    full[:, torch.tensor([0, 5, 9, 20])] = lg[:, :4]
    full[:, torch.tensor([3, 11, 30])] = lg[:, 4:5]
    logp = torch.log_softmax(full, 1)
    unused = [i for i in range(40) if i not in (0, 5, 9, 20, 3, 11, 30)]
    groups = {0: [0], 1: [5], 2: [9], 3: [20], 4: [3, 11, 30], 5: unused}
    want = -torch.stack([torch.logsumexp(logp[i, groups[int(lab[i])]], 0) for i in range(7)])
    assert torch.allclose(got, want, atol=1e-5)
    assert vocab.rows([0, 3, 20, 30]).tolist() == [0, 4, 3, 4]
    assert vocab.rows([7], unused=-1).tolist() == [-1]
    with pytest.raises(MtpscopeError):
        vocab.rows([7])
    assert [vocab.real(r) for r in range(6)] == [0, 5, 9, 20, 3, 1]


def test_full_argmax_prefers_unused_zero_logits_when_all_negative() -> None:
    lg = torch.tensor([[-1.0, -0.5, -3.0], [0.2, -1.0, 0.1]])
    assert compact.full_argmax(lg).tolist() == [3, 0]


def test_drafter_masks_follow_llama_cpp_window() -> None:
    m = models.drafter_masks(4, 6, sliding_window=3, offset=2)
    vis_full = (m["full_attention"][0, 0] == 0).int().tolist()
    vis_swa = (m["sliding_attention"][0, 0] == 0).int().tolist()
    # base t = 2..5 (query position t + 1): full sees j <= t; sliding also needs t + 1 - j < 3
    assert vis_full == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]
    assert vis_swa == [[0, 1, 1, 0, 0, 0], [0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1]]


def test_token_ordering_is_a_permutation_with_used_ids_first() -> None:
    rng = np.random.default_rng(0)
    ids = np.array([0, 1, 2, 7, 9, 30, 31, 40], dtype=np.int32)
    cluster = np.array([0, 0, 1, 1, 2, 2, 3, 3], dtype=np.int32)
    o = centroids.token_ordering(ids, cluster, 4, 64, rng)
    assert sorted(o.tolist()) == list(range(64))
    rows = o.reshape(4, 16)
    for c in range(4):
        assert rows[c, :2].tolist() == ids[cluster == c].tolist()
        assert not set(rows[c, 2:].tolist()) & set(ids.tolist())


def test_balanced_clusters_respect_capacity_and_group_directions() -> None:
    rng = np.random.default_rng(1)
    base = rng.standard_normal((4, 8))
    rows = np.concatenate([base[i] + 0.01 * rng.standard_normal((3, 8)) for i in range(4)]).astype(np.float32)
    c = centroids.balanced_clusters(rows, 4, 3, np.random.default_rng(2))
    assert np.bincount(c, minlength=4).max() <= 3
    for i in range(4):  # the three near-copies of one direction share a cluster
        assert len(set(c[3 * i: 3 * i + 3].tolist())) == 1


def test_acceptance_stats_and_distinct_4grams() -> None:
    r = [evaluation.SimRound(5, (1, 2, 3), 3), evaluation.SimRound(9, (4, 5, 6), 1), evaluation.SimRound(11, (7, 8), 0)]
    s = evaluation.acceptance_stats(r, 3)
    assert s["n_drafted"] == 8 and s["n_accepted"] == 4
    assert s["acceptance_rate"] == 0.5
    assert s["p_k"] == [2 / 3, 1 / 3, 1 / 2]
    assert evaluation.distinct_4gram_ratio([1, 2, 3, 4, 1, 2, 3, 4]) == 4 / 5
    assert evaluation.distinct_4gram_ratio([1, 2]) == 1.0


def test_simulated_rounds_match_a_stepwise_replay() -> None:
    """simulate_mtp's drafts equal one-query HF drafter calls on the true prefix, chained on the
    drafter's own argmax, and acceptance follows the generated tokens."""
    tm, dm = _models(seed=4)
    prompt = [2, 17, 33, 48, 5, 99, 123]
    gen = evaluation.generate_greedy(tm, prompt, 12, eog=set())
    assert len(gen) == 12
    rounds = evaluation.simulate_mtp(tm, dm, prompt, gen, n_draft=3, sliding_window=SMALL_T.sliding_window, eog=set())
    seq = prompt + gen
    with torch.no_grad():
        tp = models.target_pass(tm, torch.tensor([seq]), logits=False)
        for r in rounds:
            p = r.pos
            lo = max(0, p + 1 - SMALL_T.sliding_window)
            kv = {"sliding_attention": tuple(a[:, :, lo:p] for a in tp["kv"]["sliding_attention"]),
                  "full_attention": tuple(a[:, :, :p] for a in tp["kv"]["full_attention"])}
            tok, h, want = seq[p], tp["h"][:, p - 1: p], []
            for _ in r.drafted:
                e = tm.model.embed_tokens(torch.tensor([[tok]]))
                out = dm(inputs_embeds=torch.cat([e, h], -1), position_ids=torch.tensor([[p]]), shared_kv_states=kv)
                tok, h = int(out.logits[0, 0].argmax()), out.last_hidden_state
                want.append(tok)
            assert list(r.drafted) == want
            n = 0
            while n < len(want) and want[n] == seq[p + 1 + n]:
                n += 1
            assert r.n_accepted == n
    assert sum(r.n_accepted + 1 for r in rounds) == len(gen) - 1


class _RuleTarget:
    """A stand-in target whose greedy next row is ``rule(last row)`` (one-hot hidden state, identity
    head): enough for :func:`mtpscope.demo.train.evaluation.generate_greedy`."""

    def __init__(self, n_rows: int, rule) -> None:
        self.config = type("C", (), {"vocab_size": n_rows})()
        self.rule, self.n = rule, n_rows

    def model(self, input_ids, use_cache=False):
        h = torch.full((1, input_ids.shape[1], self.n), -1.0)
        h[0, -1, self.rule(int(input_ids[0, -1]))] = 1.0
        return type("O", (), {"last_hidden_state": h})()

    def lm_head(self, h):
        return h


def test_select_prompts_keeps_only_prompts_the_target_continues_without_a_loop() -> None:
    vocab = compact.CompactVocab(ids=np.arange(100, 200, dtype=np.int32), rare=np.array([], dtype=np.int32))
    # rows 0..49 count up (no loop: 64 distinct 4-grams); from a row >= 50 the target alternates two
    # rows (a loop: 2 distinct 4-grams out of 61); row 99 is an end-of-generation token after row 98
    tm = _RuleTarget(100, lambda r: r + 1 if r < 49 else (98 if r == 97 else 99 if r == 98 else 50 + (r + 1) % 2))
    real = vocab.ids

    def cand(cat, name, row):
        return {"category": cat, "name": name, "text": name, "ids": [int(real[row])]}

    cands = [cand("a", "loop", 60), cand("b", "count", 0), cand("a", "count", 1), cand("a", "count2", 2),
             cand("b", "short", 97), cand("a", "count3", 3)]
    got, counts = evaluation.select_prompts(tm, cands, vocab, [int(real[99])], n_per_category=2, max_tokens=40)
    # by hand: "a" keeps count, count2 (loop rejected; count3 not tried once two are kept); "b" keeps
    # count (40 tokens counting 1..40) and rejects short (97 -> 98 -> 99 = EOG: 2 tokens < 16)
    assert [(p["category"], p["name"]) for p in got] == [("a", "count"), ("a", "count2"), ("b", "count")]
    assert [p["prompt_id"] for p in got] == [0, 1, 2]
    assert counts == {"a": {"candidates": 4, "tried": 3, "kept": 2}, "b": {"candidates": 2, "tried": 2, "kept": 1}}
