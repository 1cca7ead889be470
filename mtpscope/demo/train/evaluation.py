"""Evaluation and the choice of the demo prompts: the target's greedy continuation
(:func:`generate_greedy`), a simulated greedy MTP loop over it as llama.cpp runs one (:func:`simulate_mtp`,
docs/RECORDING.md) and its acceptance numbers (:func:`acceptance_stats`), the candidate prompts
(:func:`demo_prompts`), the rule that picks the demo's prompts by the target alone (:func:`select_prompts`),
and a pair's realism numbers on them (:func:`evaluate`, :func:`realism_checks`).

Imports: numpy, torch, mtpscope.demo.corpus (prompt texts), traces (``run.llama.model``: the tokenizer),
:mod:`.recipe`, :mod:`.compact`, :mod:`.models`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mtpscope.demo import corpus as demo_corpus
from mtpscope.demo.train.compact import CompactVocab, full_argmax
from mtpscope.demo.train.models import drafter_forward, drafter_masks, target_pass
from mtpscope.demo.train.recipe import BOS
from mtpscope.traces.analysis import rates
from mtpscope.traces.run.llama.model import LlamaVocab
from mtpscope.traces.run.record_config import DEFAULT_N_DRAFT


@torch.no_grad()
def generate_greedy(tm: Any, prompt: Sequence[int], max_tokens: int, eog: set[int]) -> list[int]:
    """The target's greedy continuation of ``prompt`` (compact rows): up to ``max_tokens`` tokens,
    stopping after an end-of-generation row in ``eog`` or an unused id (returned as ``n_compact``)."""
    seq = list(prompt)
    out: list[int] = []
    n_c = tm.config.vocab_size
    while len(out) < max_tokens:
        h = tm.model(input_ids=torch.tensor([seq]), use_cache=False).last_hidden_state[:, -1]
        lg = tm.lm_head(h)
        nxt = int(full_argmax(lg)[0])
        out.append(nxt)
        if nxt in eog or nxt >= n_c:
            break
        seq.append(nxt)
    return out


@dataclass(frozen=True)
class SimRound:
    """One simulated MTP round: pending position ``pos``, ``drafted`` rows, ``n_accepted``."""

    pos: int
    drafted: tuple[int, ...]
    n_accepted: int


@torch.no_grad()
def simulate_mtp(tm: Any, dm: Any, prompt: Sequence[int], generated: Sequence[int], *, n_draft: int,
                 sliding_window: int, eog: set[int], head: dict[str, Any] | None = None) -> list[SimRound]:
    """Greedy MTP rounds over a known greedy continuation, as llama.cpp's loop runs them.

    The target's K/V and hidden rows come from one teacher-forced pass over ``prompt + generated``
    (identical to incremental decoding for a causal model); each round drafts ``min(n_draft, left)``
    tokens from the pending position (steps chained on the drafter's own argmax and h_next, all at
    the pending position, K/V of positions before it), accepts the longest prefix equal to the target's
    tokens, and moves on by ``n_accepted + 1``, as :mod:`traces.run.recorder` does. ``head``: a centroid
    head ``{"centroids": [C, n_embd] tensor, "ordering_rows": [C, vsc] compact rows or -1, "top_k"}``
    to draft with instead of the dense head.
    """
    seq = list(prompt) + list(generated)
    x = torch.tensor([seq])
    tp = target_pass(tm, x, logits=False)
    emb = tm.model.embed_tokens(x)
    rounds: list[SimRound] = []
    p = len(prompt)
    n_out = 1
    if generated and generated[0] in eog:
        return rounds
    while n_out < len(generated):
        k_max = min(n_draft, len(generated) - n_out)
        masks = drafter_masks(1, len(seq), sliding_window, offset=p - 1)
        e, h = emb[:, p: p + 1], tp["h"][:, p - 1: p]
        drafted: list[int] = []
        for _ in range(k_max):
            lg, hn, hi = drafter_forward(dm, e, h, torch.tensor([[p]]), tp["kv"], masks)
            d = int(_draft_token(lg[0, 0], hi[0, 0], head))
            drafted.append(d)
            if d >= tm.config.vocab_size:
                break
            e, h = tm.model.embed_tokens(torch.tensor([[d]])), hn
        n_acc = 0
        while n_acc < len(drafted) and p + 1 + n_acc < len(seq) and drafted[n_acc] == seq[p + 1 + n_acc]:
            n_acc += 1
        rounds.append(SimRound(p, tuple(drafted), n_acc))
        emitted = seq[p + 1: p + 2 + n_acc]
        n_out += len(emitted)
        p += n_acc + 1
        if any(t in eog for t in emitted):
            break
    return rounds


def _draft_token(logits: torch.Tensor, h_inner: torch.Tensor, head: dict[str, Any] | None) -> int:
    if head is None:
        return int(full_argmax(logits))
    top = (head["centroids"] @ h_inner).topk(head["top_k"]).indices
    rows = head["ordering_rows"][top].reshape(-1)
    used = rows[rows >= 0]
    if len(used) == 0:
        return logits.shape[-1]
    sel = logits[used]
    best = int(sel.argmax())
    return int(used[best]) if float(sel[best]) >= 0 or len(used) == len(rows) else logits.shape[-1]


def distinct_4gram_ratio(tokens: Sequence[int]) -> float:
    """Distinct 4-grams / all 4-grams of ``tokens`` (1.0 when there are fewer than 4 tokens)."""
    grams = [tuple(tokens[i: i + 4]) for i in range(len(tokens) - 3)]
    return len(set(grams)) / len(grams) if grams else 1.0


def acceptance_stats(rounds: Sequence[SimRound], n_draft: int) -> dict[str, Any]:
    """Acceptance rate (accepted / drafted), mean acceptance length (1 + accepted / rounds that drafted: both
    :mod:`traces.analysis.rates`, as a trace's) and per-position acceptance ``p_k`` = P(draft k accepted | a k-th
    draft was made), k = 1..n_draft."""
    drafted = sum(len(r.drafted) for r in rounds)
    accepted = sum(r.n_accepted for r in rounds)
    pk = []
    for k in range(1, n_draft + 1):
        made = [r for r in rounds if len(r.drafted) >= k]
        pk.append(sum(r.n_accepted >= k for r in made) / len(made) if made else float("nan"))
    return {"n_rounds": len(rounds), "n_drafted": drafted, "n_accepted": accepted,
            "acceptance_rate": rates.nan_if_none(rates.acceptance_rate(accepted, drafted)),
            "mean_acceptance_length": rates.nan_if_none(rates.mean_acceptance_length(
                accepted, sum(1 for r in rounds if r.drafted))), "p_k": pk}


def demo_prompts(texts: Sequence[demo_corpus.PromptText], tok: LlamaVocab, random_docs: Sequence[np.ndarray],
                 seed: int, random_lens: Sequence[int] = (24, 40), *, used: np.ndarray | None = None,
                 n_per_category: int | None = None) -> list[dict[str, Any]]:
    """Tokenized candidate demo prompts: ``[{"prompt_id", "category", "name", "text", "ids"}]`` (real ids,
    BOS first), each of ``texts`` whose ids all lie in ``used`` (the ids the corpus has: an id it never saw
    is a zero row in the full model, with no compact row), at most ``n_per_category`` per category (None:
    all). The ``random`` category: the first ``n`` words of every random-word training document
    (:func:`.tokens.random_documents`) for each ``n`` in ``random_lens``, in a seeded order; text = their decoded
    pieces (the ids are the prompt). :func:`select_prompts` picks the demo's prompts among them."""
    out: list[dict[str, Any]] = []
    n_cat: dict[str, int] = {}
    for t in texts:
        x = tok.tokenize(t.text, add_special=False, parse_special=t.special)
        if not x or x[0] != BOS:
            x = [BOS, *x]
        full = n_per_category is not None and n_cat.get(t.category, 0) >= n_per_category
        if full or (used is not None and not np.isin(x, used).all()):
            continue
        n_cat[t.category] = n_cat.get(t.category, 0) + 1
        out.append({"category": t.category, "name": t.name, "text": t.text, "ids": [int(v) for v in x]})
    rng = np.random.default_rng(seed + 5)
    cuts = [(j, n) for j in range(len(random_docs)) for n in random_lens]
    for k in rng.permutation(len(cuts))[: n_per_category if n_per_category is not None else len(cuts)]:
        j, n = cuts[int(k)]
        x = [int(v) for v in random_docs[j][: n + 1]]
        out.append({"category": "random", "name": f"random:doc{j}:{n}", "text": tok.detokenize(x[1:]), "ids": x})
    for i, p in enumerate(out):
        p["prompt_id"] = i
    return out


def select_prompts(tm: Any, candidates: Sequence[dict[str, Any]], vocab: CompactVocab, eog_real: Iterable[int], *,
                   n_per_category: int = 6, max_tokens: int = 64, min_distinct4: float = 0.6,
                   min_generated: int = 16) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
    """The demo prompts: per category, the first ``n_per_category`` candidates (in their seeded order,
    :func:`demo_prompts`) on which the *target* writes usable text -- its greedy continuation
    (:func:`generate_greedy`, ``max_tokens`` tokens or up to an end-of-generation token) is at least
    ``min_generated`` tokens long and does not loop (:func:`distinct_4gram_ratio` >= ``min_distinct4``).
    The drafter plays no part: acceptance is measured on the chosen prompts afterwards, never selected for.

    Returns:
        ``(prompts, counts)``: the chosen candidates renumbered ``prompt_id`` 0.. in category order, and
        per category ``{"candidates", "tried", "kept"}``.
    """
    eog = {int(v) for v in vocab.rows(np.asarray(list(eog_real)), unused=-1) if v >= 0}
    kept: list[dict[str, Any]] = []
    counts: dict[str, dict[str, int]] = {}
    for c in candidates:
        n = counts.setdefault(c["category"], {"candidates": 0, "tried": 0, "kept": 0})
        n["candidates"] += 1
        if n["kept"] >= n_per_category:
            continue
        n["tried"] += 1
        gen = generate_greedy(tm, [int(v) for v in vocab.rows(c["ids"])], max_tokens, eog)
        if len(gen) >= min_generated and distinct_4gram_ratio(gen) >= min_distinct4:
            n["kept"] += 1
            kept.append(dict(c))
    order = list(dict.fromkeys(c["category"] for c in candidates))
    kept.sort(key=lambda p: order.index(p["category"]))  # stable: the seeded order within a category
    for i, p in enumerate(kept):
        p["prompt_id"] = i
    return kept, counts


def evaluate(tm: Any, dm: Any, prompts: Sequence[dict[str, Any]], vocab: CompactVocab, eog_real: Iterable[int], *,
             n_draft: int = DEFAULT_N_DRAFT, max_tokens: int = 64, sliding_window: int, head: dict[str, Any] | None = None,
             log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Realism numbers of a pair on the demo prompts (greedy target, simulated greedy MTP).

    Returns ``{"prompts": [{prompt_id, category, distinct4, acceptance_rate, n_generated, generated
    (real ids), p_k, ...}], "categories": {cat: {acceptance_rate, distinct4_min, p_k}}, "overall":
    {...}, "spread": highest - lowest category acceptance}``. Acceptance per category pools the
    category's rounds (accepted / drafted).
    """
    eog = {int(v) for v in vocab.rows(np.asarray(list(eog_real)), unused=-1) if v >= 0}
    per: list[dict[str, Any]] = []
    pooled: dict[str, list[SimRound]] = {}
    for p in prompts:
        pr = [int(v) for v in vocab.rows(p["ids"])]
        gen = generate_greedy(tm, pr, max_tokens, eog)
        rounds = simulate_mtp(tm, dm, pr, gen, n_draft=n_draft, sliding_window=sliding_window, eog=eog, head=head)
        st = acceptance_stats(rounds, n_draft)
        real = [vocab.real(g) for g in gen]
        d4 = distinct_4gram_ratio(gen)
        per.append({"prompt_id": p["prompt_id"], "category": p["category"], "distinct4": round(d4, 4),
                    "n_generated": len(gen), "generated": real, **st})
        pooled.setdefault(p["category"], []).extend(rounds)
        if log:
            log(f"  {p['category']:8s} #{p['prompt_id']:<3d} acc {st['acceptance_rate']:.3f}  d4 {d4:.3f}  "
                f"n {len(gen)}")
    cats = {}
    for c, rs in pooled.items():
        st = acceptance_stats(rs, n_draft)
        cats[c] = {"acceptance_rate": round(st["acceptance_rate"], 4), "p_k": [round(v, 4) for v in st["p_k"]],
                   "distinct4_min": min(q["distinct4"] for q in per if q["category"] == c),
                   "n_rounds": st["n_rounds"], "n_drafted": st["n_drafted"]}
    allr = [r for rs in pooled.values() for r in rs]
    ov = acceptance_stats(allr, n_draft)
    accs = [v["acceptance_rate"] for v in cats.values()]
    return {"prompts": per, "categories": cats,
            "overall": {"acceptance_rate": round(ov["acceptance_rate"], 4), "p_k": [round(v, 4) for v in ov["p_k"]],
                        "distinct4_min": min(q["distinct4"] for q in per)},
            "spread": round(max(accs) - min(accs), 4)}


def realism_checks(ev: dict[str, Any], unpredictable: str = "random") -> dict[str, bool]:
    """The issue's realism conditions on an :func:`evaluate` result."""
    cats = ev["categories"]
    low = min(cats, key=lambda c: cats[c]["acceptance_rate"])
    pk = ev["overall"]["p_k"]
    return {"distinct4_min>=0.6": ev["overall"]["distinct4_min"] >= 0.6, "spread>=0.25": ev["spread"] >= 0.25,
            f"{unpredictable}_lowest": low == unpredictable, "p1>p2>p3": all(a > b for a, b in zip(pk, pk[1:]))}
