"""Train the demo pair (``mtpscope demo train``): a tiny Gemma 4 target and its MTP drafter, on real text
with the real tokenizer. :func:`train` runs the recipe's stages in order, one module each.

The recipe (deterministic given the seed, on one CPU thread; torch + transformers 5.24 from the
``parity`` extra; every number in :mod:`.recipe`):

1. **Corpus** (:mod:`mtpscope.demo.corpus`): stdlib sources, ``pydoc_data.topics`` and the license,
   generated JSON records and number lists, conversations rendered with the Gemma 4 chat template.
2. **Tokens** (:mod:`.tokens`): llama.cpp's own tokenizer on a vocab-only load of
   ``ggml-vocab-gemma-4.gguf``: BOS + the text (special tokens parsed only in the chat part), packed
   into a stream cut into ``seq_len`` windows; random-word documents (the ``random`` category) added.
3. **Compact vocabulary** (:mod:`.compact`): the models are trained over the ids the stream uses at
   least ``min_count`` times (plus the special tokens the demo needs), each with a row, and one shared
   row for the rarer ids seen; the loss makes the compact softmax equal to the full 262,144-row one.
4. **Target** ``Gemma4ForCausalLM`` (:mod:`.models`): next-token cross-entropy.
5. **Drafter** ``Gemma4AssistantForCausalLM`` on the frozen target (:mod:`.models`), as transformers'
   assisted generation and llama.cpp run it, against the target's greedy tokens.
6. **Centroid head** (:mod:`.centroids`): the 262,144 ids in 2048 clusters of 128 (a permutation of all
   ids: used ids clustered by their drafter embedding rows, balanced, unused ids spread over the
   clusters), and ``centroids`` trained so that the top-k clusters hold the target's token.
7. **Prompts and evaluation** (:mod:`.evaluation`): the demo prompts chosen by the target's greedy
   continuation alone, then acceptance measured with a simulated greedy MTP loop.

Outputs (:mod:`.checkpoints`): the compact checkpoints (F16, compact rows, HF names), the id maps, the HF
configs for the full vocabulary, ``prompts.json`` and ``recipe.json``; a stage cache keeps the trained
target and drafter for runs that change only later stages.

Imports: numpy, torch, transformers (its version), mtpscope.cache, mtpscope.errors, mtpscope.demo.corpus,
the stage modules.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from mtpscope.cache import sha256_file
from mtpscope.demo import corpus as demo_corpus
from mtpscope.errors import MtpscopeError

try:  # torch / transformers come with the parity extra; importing this package needs them
    import torch
except ImportError as e:  # pragma: no cover - depends on the environment
    raise MtpscopeError("training the demo pair needs torch and transformers (pip install -e '.[parity]')") from e

from mtpscope.demo.train.centroids import fit_centroid_head
from mtpscope.demo.train.checkpoints import (
    DATA_DIR,
    drafter_stage_key,
    round_f16,
    save_compact,
    staged,
    target_stage_key,
)
from mtpscope.demo.train.compact import compact_vocab
from mtpscope.demo.train.evaluation import demo_prompts, evaluate, realism_checks, select_prompts
from mtpscope.demo.train.models import (
    drafter_config,
    greedy_labels,
    make_drafter,
    make_target,
    target_config,
    train_drafter,
    train_target,
    windows,
)
from mtpscope.demo.train.recipe import SPECIAL_IDS, Recipe, TargetShape
from mtpscope.demo.train.tokens import (
    add_random_documents,
    chat_template,
    open_tokenizer,
    random_documents,
    random_word_pool,
    tokenize_corpus,
)


def train(out: str | os.PathLike[str] = DATA_DIR, recipe: Recipe | None = None, *,
          vocab_gguf: str | os.PathLike[str] | None = None, evaluate_after: bool = True,
          stage_cache: str | os.PathLike[str] | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the recipe end to end and write the compact checkpoints to ``out``.

    Args:
        out: output folder (default: the package's ``demo_data``).
        recipe: the recipe (default :class:`Recipe`).
        vocab_gguf: the tokenizer GGUF (default: the cached real one).
        evaluate_after: also measure the realism numbers (recorded in ``recipe.json``).
        stage_cache: a folder keeping the trained target and drafter (f32) under hashes of everything
            each depends on (recipe parts, seed, token windows; the drafter also the target's hash), so a
            run that changes only later stages reuses them instead of retraining; the result is the same
            as a fresh run.

    Returns:
        the ``recipe.json`` content.
    """
    recipe = recipe or Recipe()
    t_all = time.perf_counter()
    torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    random.seed(recipe.seed)
    if vocab_gguf is None:
        from mtpscope.cache import vocab_path

        vocab_gguf = vocab_path()
    template = chat_template(vocab_gguf)
    t0 = time.perf_counter()
    docs = demo_corpus.build_corpus(recipe.seed, template, recipe.budget)
    with open_tokenizer(vocab_gguf) as tok:
        stream = tokenize_corpus(docs, tok)
        # candidates: three times the prompts needed, the first with only known ids are kept
        texts = demo_corpus.demo_prompt_texts(recipe.seed, template, docs, n_per_category=recipe.prompt_candidates)
        eog = tok.eog_ids()
        vocab = compact_vocab(stream.ids, min_count=recipe.min_count, keep=list(SPECIAL_IDS) + eog)
        pool = random_word_pool(stream, vocab, tok, recipe.random_pool, np.random.default_rng(recipe.seed + 6))
        rdocs = random_documents(pool, recipe.random_docs, recipe.random_words, np.random.default_rng(recipe.seed + 8))
        candidates = demo_prompts(texts, tok, rdocs, recipe.seed, used=np.union1d(vocab.ids, vocab.rare))
    stream = add_random_documents(stream, rdocs, np.random.default_rng(recipe.seed + 9), copies=recipe.random_copies)
    win = torch.as_tensor(vocab.rows(windows(stream.ids, recipe.seq_len)))
    log(f"corpus: {len(docs)} documents, {len(stream.ids)} tokens {stream.counts()}, {vocab.n_kept} kept ids + "
        f"{len(vocab.rare)} rare, {len(win)} windows ({time.perf_counter() - t0:.1f} s)")
    tm = make_target(target_config(recipe.target, vocab.n_rows))
    key = target_stage_key(recipe, win)
    st_t = staged(tm, None if stage_cache is None else Path(stage_cache) / f"target-{key[:16]}", "target",
                  lambda: {**train_target(tm, win, recipe, vocab, log), "key": key}, log)
    round_f16(tm)
    # the drafter sees drafter_steps * drafter_batch windows (a seeded subset when that is fewer)
    n_d = min(len(win), recipe.drafter_steps * recipe.drafter_batch)
    dwin = win[torch.as_tensor(np.sort(np.random.default_rng(recipe.seed + 7).permutation(len(win))[:n_d]))]
    t0 = time.perf_counter()
    labels = greedy_labels(tm, dwin)
    log(f"greedy labels for {len(dwin)} windows ({time.perf_counter() - t0:.1f} s)")
    win = dwin
    dm = make_drafter(drafter_config(recipe.drafter, recipe.target, vocab.n_rows))
    dkey = drafter_stage_key(key, recipe)
    st_d = staged(dm, None if stage_cache is None else Path(stage_cache) / f"drafter-{dkey[:16]}", "drafter",
                  lambda: train_drafter(dm, tm, win, labels, recipe, vocab, log), log)
    round_f16(dm)
    head = fit_centroid_head(dm, tm, win, labels, vocab, recipe, log)
    head["centroids"] = head["centroids"].astype(np.float16).astype(np.float32)
    info: dict[str, Any] = {
        "python": demo_corpus.python_info(), "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "tokenizer": {"file": Path(vocab_gguf).name, "sha256": sha256_file(Path(vocab_gguf))},
        "corpus": {"n_documents": len(docs), "n_tokens": int(len(stream.ids)), "tokens": stream.counts(),
                   "sha256": demo_corpus.corpus_sha256(docs)},
        "n_kept": vocab.n_kept, "n_rare": int(len(vocab.rare)), "n_unused": vocab.n_unused, "eog_ids": eog,
        "target_training": st_t, "drafter_training": st_d,
        "centroid_head": {"coverage": head["coverage"], "wall_s": head["wall_s"]},
    }
    t0 = time.perf_counter()
    prompts, counts = select_prompts(tm, candidates, vocab, eog, n_per_category=recipe.prompts_per_category)
    info["prompt_selection"] = {"rule": "target greedy continuation >= 16 tokens and distinct4 >= 0.6 "
                                        "(select_prompts)", "per_category": counts}
    log(f"prompts: {len(prompts)} chosen, per category {counts} ({time.perf_counter() - t0:.1f} s)")
    info["train_wall_s"] = round(time.perf_counter() - t_all, 1)
    if evaluate_after:
        ev = evaluate(tm, dm, prompts, vocab, eog, n_draft=recipe.n_draft, sliding_window=recipe.target.sliding_window,
                      log=log)
        info["measured"] = {k: ev[k] for k in ("categories", "overall", "spread")}
        info["measured"]["checks"] = realism_checks(ev)
        for p, q in zip(prompts, ev["prompts"]):
            p["measured"] = {k: q[k] for k in ("distinct4", "acceptance_rate", "n_generated")}
    save_compact(out, tm, dm, vocab, head, recipe, prompts, info)
    return json.loads((Path(out) / "recipe.json").read_text())


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mtpscope.demo.train [--out DIR] [--seed N] [--target-steps N] [--drafter-steps N]``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m mtpscope.demo.train", description=(train.__doc__ or "").splitlines()[0])
    ap.add_argument("--out", default=str(DATA_DIR))
    ap.add_argument("--seed", type=int, default=Recipe.seed)
    ap.add_argument("--target-steps", type=int, default=Recipe.target_steps)
    ap.add_argument("--drafter-steps", type=int, default=Recipe.drafter_steps)
    ap.add_argument("--threads", type=int, default=Recipe.threads)
    ap.add_argument("--n-embd", type=int, default=TargetShape.n_embd)
    ap.add_argument("--no-eval", action="store_true")
    ap.add_argument("--stage-cache", default=None, help="keep / reuse the trained target here")
    a = ap.parse_args(argv)
    r = Recipe(seed=a.seed, target_steps=a.target_steps, drafter_steps=a.drafter_steps, threads=a.threads,
               target=replace(TargetShape(), n_embd=a.n_embd))
    rec = train(a.out, r, evaluate_after=not a.no_eval, stage_cache=a.stage_cache, log=lambda s: print(s, flush=True))
    print(json.dumps({k: rec.get(k) for k in ("train_wall_s", "measured")}, indent=1)[:4000])
    return 0


__all__ = ["DATA_DIR", "Recipe", "TargetShape", "main", "train"]
