"""Synthetic traces of any size, for benchmarks and app tests (``source: "synthetic"``).

Not a model of any real drafter: a seeded random process with the structure real traces have, so
charts and metrics have something realistic to show:

* per-position acceptance decays with the draft position k: the conditional probability that draft k
  is accepted given draft k-1 was is ``0.82 * 0.88**(k-1)`` times a per-prompt quality in [0.75, 1.0];
* zero-acceptance streaks: a two-state (good / bad) Markov chain over rounds, entering "bad" with
  probability 0.012 per round and leaving with 0.25 (mean streak 4 rounds), accepts nothing while bad;
* about 2 % of rounds draft fewer than ``n_draft`` tokens;
* tokens are consistent: accepted drafts equal the target's tokens, the target's token at the first
  mismatch differs from the draft, ``emitted`` = accepted drafts + that token, ``pos`` advances by
  ``n_accepted + 1`` per round and the next ``pending_token`` is the last emitted token;
* steps: greedy drafts (``rank`` 0, the draft is ``top_ids[0]``), the target token placed in
  ``top_ids`` at its ``target_rank`` when that is within the list; centroid columns consistent with
  ``target_in_candidates`` (``target_centroid_rank < top_k`` exactly when covered);
* hidden states (optional): standard normal, with ``h`` of step k > 1 equal to ``h_next`` of step k-1.

Everything is vectorised with numpy; 100k rounds write in about a second (without hidden states).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa

from mtpscope.errors import TraceError
from mtpscope.inspector.layouts import GEMMA4_N_VOCAB
from mtpscope.traces.run.record_config import DEFAULT_N_DRAFT
from mtpscope.traces.store.writer import TraceWriter

P_FIRST = 0.82
P_DECAY = 0.88
P_ENTER_BAD = 0.012
P_LEAVE_BAD = 0.25


def _list_array(values: np.ndarray, lengths: np.ndarray, typ: pa.DataType) -> pa.ListArray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(values, typ))


def _fixed_list(values2d: np.ndarray, typ: pa.DataType) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(values2d.reshape(-1), typ), values2d.shape[1])


def write_synthetic_trace(
    out_dir: str | os.PathLike[str],
    *,
    n_rounds: int,
    n_prompts: int = 4,
    n_draft: int = DEFAULT_N_DRAFT,
    n_vocab: int = GEMMA4_N_VOCAB,
    n_centroids: int = 2048,
    top_k: int = 32,
    hidden: bool | tuple[int, int] = False,
    hidden_dtype: str = "f16",
    top_n: int = 8,
    rounds_per_part: int = 32768,
    seed: int = 0,
    overwrite: bool = True,
    steps: bool = True,
    home: np.ndarray | None = None,
) -> Path:
    """Write a synthetic trace directory and return its path.

    Args:
        out_dir: trace directory (created; an existing trace there is replaced when ``overwrite``).
        n_rounds: total rounds, split as evenly as possible over ``n_prompts`` (earlier prompts get
            the remainder), written prompt after prompt.
        n_prompts: number of prompts (>= 1).
        n_draft: draft length K per round (>= 1).
        n_vocab: token ids are drawn from ``[0, n_vocab)``.
        n_centroids, top_k: centroid head size and its top-k (``top_k <= n_centroids``).
        hidden: ``False`` for no hidden states, or ``(n_embd_backbone, n_embd)`` widths.
        hidden_dtype: ``"f16"`` or ``"f32"`` storage.
        top_n: length of ``top_ids`` / ``top_logits`` per step.
        rounds_per_part: rounds per Parquet part.
        seed: RNG seed; the same arguments give the same trace.
        steps: write the ``steps`` table (False: rounds only, about a tenth of the bytes and time).
        home: a centroid head's token -> centroid map (int32[n_vocab], ``CentroidHead.token_to_centroid``):
            ``target_centroid`` is then ``home[target_token]`` and ``target_in_candidates`` whether it is
            among the step's ``centroid_ids``, as a recording scored with that head has them; None: both drawn
            at random (about three quarters of the targets reachable).

    Raises:
        TraceError: a non-positive size argument, ``top_k > n_centroids`` or ``top_n > n_vocab``.
    """
    for name, v in (("n_rounds", n_rounds), ("n_prompts", n_prompts), ("n_draft", n_draft),
                    ("n_vocab", n_vocab), ("n_centroids", n_centroids), ("top_k", top_k),
                    ("top_n", top_n), ("rounds_per_part", rounds_per_part)):
        if int(v) < 1:
            raise TraceError("synthetic trace size must be positive", key=name, expected=">= 1", actual=v)
    if top_k > n_centroids or top_n > n_vocab:
        raise TraceError("top_k must be <= n_centroids and top_n <= n_vocab", key="top_k/top_n",
                         expected=f"<= {n_centroids} / <= {n_vocab}", actual=(top_k, top_n))
    rng = np.random.default_rng(seed)
    n, K = int(n_rounds), int(n_draft)

    # ---- rounds per prompt
    per = np.full(n_prompts, n // n_prompts, dtype=np.int64)
    per[: n % n_prompts] += 1
    prompt_id = np.repeat(np.arange(n_prompts, dtype=np.int32), per)
    starts = np.concatenate([[0], np.cumsum(per)[:-1]])
    round_idx = (np.arange(n) - np.repeat(starts, per)).astype(np.int32)
    quality = rng.uniform(0.75, 1.0, size=n_prompts)
    n_prompt_tokens = rng.integers(16, 256, size=n_prompts)

    # ---- acceptance: good / bad regime chain, decaying per-position conditional acceptance
    u_state = rng.random(n)
    bad = np.zeros(n, dtype=bool)
    state = False
    for i in range(n):
        if round_idx[i] == 0:
            state = False
        state = (u_state[i] >= P_LEAVE_BAD) if state else (u_state[i] < P_ENTER_BAD)
        bad[i] = state
    nd = np.full(n, K, dtype=np.int32)
    short = rng.random(n) < 0.02
    if K > 1:
        nd[short] = rng.integers(1, K, size=int(short.sum()))
    p_cond = P_FIRST * P_DECAY ** np.arange(K)
    acc = rng.random((n, K)) < (p_cond[None, :] * quality[prompt_id][:, None])
    acc &= ~bad[:, None]
    acc &= np.arange(K)[None, :] < nd[:, None]
    na = np.cumprod(acc, axis=1).sum(axis=1).astype(np.int32)

    # ---- tokens
    D = rng.integers(0, n_vocab, size=(n, K), dtype=np.int64)
    T = rng.integers(0, n_vocab, size=(n, K + 1), dtype=np.int64)
    cols = np.arange(K + 1)[None, :]
    T[:, :K] = np.where(cols[:, :K] < na[:, None], D, T[:, :K])
    # the target's token at the first mismatch must differ from the draft there
    rows = np.flatnonzero(na < nd)
    clash = T[rows, na[rows]] == D[rows, na[rows]]
    T[rows[clash], na[rows[clash]]] = (D[rows[clash], na[rows[clash]]] + 1) % n_vocab
    last = T[np.arange(n), na]                       # the correction / bonus token
    pending = np.empty(n, dtype=np.int64)
    pending[1:] = last[:-1]
    first_rounds = round_idx == 0
    pending[first_rounds] = rng.integers(0, n_vocab, size=int(first_rounds.sum()))
    adv = (na + 1).astype(np.int64)
    cum = np.cumsum(adv) - adv                      # tokens emitted before this round (global)
    pos = n_prompt_tokens[prompt_id] + cum - np.repeat(cum[starts], per)

    dmask = np.arange(K)[None, :] < nd[:, None]
    tmask = cols <= nd[:, None]
    emask = cols <= na[:, None]
    E = T.copy()                                     # emitted = accepted drafts (== target) + last
    t_draft = nd * rng.gamma(8.0, 0.5, size=n)      # ~4 ms per draft step
    t_verify = 25.0 + 2.0 * nd + rng.gamma(2.0, 1.5, size=n)
    rounds = pa.table({
        "prompt_id": pa.array(prompt_id, pa.int32()),
        "round": pa.array(round_idx, pa.int32()),
        "pos": pa.array(pos.astype(np.int32), pa.int32()),
        "pending_token": pa.array(pending.astype(np.int32), pa.int32()),
        "n_draft": pa.array(nd, pa.int32()),
        "drafted": _list_array(D[dmask].astype(np.int32), nd, pa.int32()),
        "target": _list_array(T[tmask].astype(np.int32), nd + 1, pa.int32()),
        "n_accepted": pa.array(na, pa.int32()),
        "emitted": _list_array(E[emask].astype(np.int32), na + 1, pa.int32()),
        "t_draft_ms": pa.array(t_draft, pa.float64()),
        "t_verify_ms": pa.array(t_verify, pa.float64()),
    })

    # ---- steps (row-major over (round, k)); none with steps=False
    steps_tbl = None
    if steps:
        srow, scol = np.nonzero(dmask)
        m = len(srow)
        token = D[srow, scol]
        accepted = scol < na[srow]
        target_token = T[srow, scol]
        target_rank = np.where(accepted, 0, 1 + rng.geometric(0.25, size=m) - 1).astype(np.int32)
        logit = (rng.normal(18.0, 3.0, size=m)).astype(np.float32)
        top_ids = rng.integers(0, n_vocab, size=(m, top_n), dtype=np.int64)
        top_ids[:, 0] = token
        put = (~accepted) & (target_rank < top_n)
        top_ids[np.flatnonzero(put), target_rank[put]] = target_token[put]
        top_logits = (logit[:, None] - np.cumsum(rng.exponential(0.8, size=(m, top_n)), axis=1)
                      + rng.exponential(0.8, size=(m, 1))).astype(np.float32)
        top_logits[:, 0] = logit
        stride = max(n_centroids // top_k, 1)
        cbase = rng.integers(0, n_centroids, size=m)
        cids = (cbase[:, None] + np.arange(top_k)[None, :] * stride) % n_centroids
        clogits = (rng.normal(6.0, 1.0, size=(m, 1))
                   - np.cumsum(rng.exponential(0.3, size=(m, top_k)), axis=1)).astype(np.float32)
        in_cand = accepted | (rng.random(m) < 0.75)
        crank = np.where(in_cand,
                         np.where(accepted, 0, rng.integers(0, top_k, size=m)),
                         rng.integers(top_k, max(n_centroids, top_k + 1), size=m)).astype(np.int32)
        tcent = np.where(in_cand, cids[np.arange(m), np.minimum(crank, top_k - 1)],
                         rng.integers(0, n_centroids, size=m))
        if home is not None:
            tcent = np.asarray(home, dtype=np.int64)[target_token]
            in_cand = (cids == tcent[:, None]).any(axis=1)
            crank = np.where(in_cand, np.argmax(cids == tcent[:, None], axis=1), crank).astype(np.int32)
        steps_tbl = pa.table({
            "prompt_id": pa.array(prompt_id[srow], pa.int32()),
            "round": pa.array(round_idx[srow], pa.int32()),
            "k": pa.array((scol + 1).astype(np.int32), pa.int32()),
            "token": pa.array(token.astype(np.int32), pa.int32()),
            "logit": pa.array(logit, pa.float32()),
            "rank": pa.array(np.zeros(m, dtype=np.int32), pa.int32()),
            "top_ids": _list_array(top_ids.reshape(-1).astype(np.int32), np.full(m, top_n), pa.int32()),
            "top_logits": _list_array(top_logits.reshape(-1), np.full(m, top_n), pa.float32()),
            "target_token": pa.array(target_token.astype(np.int32), pa.int32()),
            "target_rank": pa.array(target_rank, pa.int32()),
            "accepted": pa.array(accepted, pa.bool_()),
            "centroid_ids": _list_array(cids.reshape(-1).astype(np.int32), np.full(m, top_k), pa.int32()),
            "centroid_logits": _list_array(clogits.reshape(-1), np.full(m, top_k), pa.float32()),
            "centroid_token": pa.array(token.astype(np.int32), pa.int32()),
            "target_in_candidates": pa.array(in_cand, pa.bool_()),
            "target_centroid": pa.array(tcent.astype(np.int32), pa.int32()),
            "target_centroid_rank": pa.array(crank, pa.int32()),
        })

    widths: tuple[int, int] | None = None
    if hidden:
        if isinstance(hidden, bool):
            raise TypeError("hidden: False, or the (n_embd_backbone, n_embd) widths; not True")
        widths = (int(hidden[0]), int(hidden[1]))
    dims: tuple[int | None, int | None] = (None, None) if widths is None else widths
    manifest = {
        "source": "synthetic",
        "command": ["write_synthetic_trace"],
        "params": {"n_rounds": n, "n_prompts": n_prompts, "n_draft": K, "n_vocab": n_vocab,
                   "n_centroids": n_centroids, "top_k": top_k, "top_n": top_n, "seed": seed},
        "prompts": [{"prompt_id": i, "text": f"synthetic prompt {i}", "n_prompt_tokens": int(n_prompt_tokens[i])}
                    for i in range(n_prompts)],
        "centroids": {"n_centroids": n_centroids, "top_k": top_k},
    }
    step_off = np.concatenate([[0], np.cumsum(nd, dtype=np.int64)])
    np_dtype = np.float16 if hidden_dtype == "f16" else np.float32
    with TraceWriter(out_dir, manifest, n_embd_backbone=dims[0], n_embd=dims[1],
                     hidden_dtype=hidden_dtype if hidden else None, centroids=True,
                     flush_every=max(rounds_per_part, 1), compact=False,
                     overwrite=overwrite) as w:
        arrow_h = w.steps_schema.field("h").type
        for a in range(0, n, rounds_per_part):
            b = min(a + rounds_per_part, n)
            sa, sb = int(step_off[a]), int(step_off[b])
            if steps_tbl is None:
                w.write_tables(rounds.slice(a, b - a), None)
                continue
            st = steps_tbl.slice(sa, sb - sa)
            if widths is not None:
                mm = sb - sa
                hn = rng.standard_normal((mm, widths[0]), dtype=np.float32).astype(np_dtype)
                h = rng.standard_normal((mm, widths[0]), dtype=np.float32).astype(np_dtype)
                later = np.flatnonzero(scol[sa:sb] > 0)
                h[later] = hn[later - 1]
                hi = rng.standard_normal((mm, widths[1]), dtype=np.float32).astype(np_dtype)
                vt = arrow_h.value_type
                st = st.append_column("h", _fixed_list(h, vt)) \
                       .append_column("h_next", _fixed_list(hn, vt)) \
                       .append_column("h_inner", _fixed_list(hi, vt))
            w.write_tables(rounds.slice(a, b - a), st)
    return Path(out_dir)


#: the categories of :func:`write_synthetic_sweep` (a SPEED-Bench-like dozen)
SYNTHETIC_CATEGORIES = ("coding", "math", "reasoning", "writing", "roleplay", "qa", "summarization",
                        "translation", "extraction", "stem", "humanities", "multilingual")


def _synthetic_baseline(out_dir: Path, *, n_rounds: int, n_prompts: int, n_vocab: int, seed: int) -> None:
    """A synthetic plain-decoding trace (``source: "baseline"``): one token per round, n_draft 0,
    ``t_verify_ms`` about 24 ms (the synthetic MTP rounds' verify time without drafts)."""
    rng = np.random.default_rng(seed)
    n = int(n_rounds)
    per = np.full(n_prompts, n // n_prompts, dtype=np.int64)
    per[: n % n_prompts] += 1
    prompt_id = np.repeat(np.arange(n_prompts, dtype=np.int32), per)
    starts = np.concatenate([[0], np.cumsum(per)[:-1]])
    round_idx = (np.arange(n) - np.repeat(starts, per)).astype(np.int32)
    n_prompt_tokens = rng.integers(16, 256, size=n_prompts)
    toks = rng.integers(0, n_vocab, size=n + n_prompts, dtype=np.int64).astype(np.int32)
    nxt = toks[1:n + 1]
    ones = np.ones(n, dtype=np.int32)
    rounds = pa.table({
        "prompt_id": pa.array(prompt_id, pa.int32()),
        "round": pa.array(round_idx, pa.int32()),
        "pos": pa.array((n_prompt_tokens[prompt_id] + round_idx).astype(np.int32), pa.int32()),
        "pending_token": pa.array(toks[:n], pa.int32()),
        "n_draft": pa.array(np.zeros(n, dtype=np.int32), pa.int32()),
        "drafted": _list_array(np.zeros(0, dtype=np.int32), np.zeros(n, dtype=np.int32), pa.int32()),
        "target": _list_array(nxt, ones, pa.int32()),
        "n_accepted": pa.array(np.zeros(n, dtype=np.int32), pa.int32()),
        "emitted": _list_array(nxt, ones, pa.int32()),
        "t_draft_ms": pa.array(np.zeros(n), pa.float64()),
        "t_verify_ms": pa.array(22.0 + rng.gamma(2.0, 1.0, size=n), pa.float64()),
    })
    manifest = {"source": "baseline", "command": ["write_synthetic_sweep"],
                "params": {"decoding": "plain", "n_draft": 0, "synthetic": True, "seed": seed},
                "prompts": [{"prompt_id": i, "text": f"synthetic prompt {i}", "n_prompt_tokens": int(n_prompt_tokens[i])}
                            for i in range(n_prompts)]}
    with TraceWriter(out_dir, manifest, n_embd_backbone=None, n_embd=None, hidden_dtype=None, centroids=False,
                     compact=False, overwrite=True) as w:
        for a in range(0, n, 65536):
            w.write_tables(rounds.slice(a, min(65536, n - a)))


def write_synthetic_sweep(
    out_dir: str | os.PathLike[str],
    *,
    n_rounds: int = 1_000_000,
    assistants: tuple[str, ...] = ("assistant-q8_0", "assistant-q4_0"),
    n_drafts: tuple[int, ...] = (1, 2, 3, 4, 6),
    n_shards: int = 4,
    n_prompts: int = 240,
    categories: tuple[str, ...] = SYNTHETIC_CATEGORIES,
    baseline: bool = True,
    steps: bool = False,
    n_vocab: int = GEMMA4_N_VOCAB,
    seed: int = 0,
) -> Path:
    """Write a synthetic sweep directory (docs/SWEEP.md layout, every task done) and return its path.

    ``n_rounds`` are split evenly over the tasks (assistants x n_drafts x shards, plus one baseline
    task per shard); each MTP task is a :func:`write_synthetic_trace` of its shard's prompts with its
    own seed, each baseline task a plain-decoding trace. Prompt ``i`` has category
    ``categories[i % len(categories)]`` and goes to shard ``i % n_shards``. The paths in the spec are
    placeholders (no models exist). ``steps=False`` writes rounds only (1,000,000 rounds: about 70 MB,
    a few seconds).

    Raises:
        TraceError: a non-positive size, or fewer rounds than tasks.
        MtpscopeError: a spec that :meth:`SweepSpec.check` refuses (e.g. more shards than prompts).
    """
    from mtpscope.traces.sweep.spec import SweepPrompt, SweepSpec, new_state, write_state

    out = Path(out_dir)
    prompts = tuple(SweepPrompt(i, f"synthetic prompt {i}", categories[i % len(categories)])
                    for i in range(int(n_prompts)))
    spec = SweepSpec(target="synthetic-target.gguf", assistants=tuple((a, f"{a}.gguf") for a in assistants),
                     prompts=prompts, n_drafts=tuple(n_drafts), n_shards=int(n_shards), baseline=baseline,
                     max_tokens=1 << 20, hidden="off").check()
    tasks = spec.tasks()
    if int(n_rounds) < len(tasks):
        raise TraceError("fewer rounds than tasks", key="n_rounds", expected=f">= {len(tasks)}", actual=n_rounds)
    out.mkdir(parents=True, exist_ok=True)
    state = new_state(spec, command=["write_synthetic_sweep"], ray={"address": "synthetic"})
    per = np.full(len(tasks), int(n_rounds) // len(tasks), dtype=np.int64)
    per[: int(n_rounds) % len(tasks)] += 1
    entries = []
    for i, (t, n) in enumerate(zip(tasks, per, strict=True)):
        d = out / t.task_id
        n_p = len(spec.shard_prompts(t.shard))
        if t.is_baseline:
            _synthetic_baseline(d, n_rounds=int(n), n_prompts=n_p, n_vocab=n_vocab, seed=seed + i)
        else:
            write_synthetic_trace(d, n_rounds=int(n), n_prompts=n_p, n_draft=t.n_draft, n_vocab=n_vocab,
                                  seed=seed + i, steps=steps, rounds_per_part=65536)
        e = dict(state["tasks"][i])
        e.update(state="done", attempts=1, worker="synthetic", n_prompts=n_p, n_rounds=int(n))
        entries.append(e)
    state["tasks"] = entries
    state["complete"] = True
    write_state(out, state)
    return out
