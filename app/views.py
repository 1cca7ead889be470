"""Data preparation for the app's pages (pure: pandas / numpy, no Streamlit, no plotly).

Everything here takes the trace's DataFrames (``Trace.rounds`` / ``Trace.steps``, columns as in
docs/ARCHITECTURE.md) or reader records and returns small DataFrames / arrays sized for a widget:
vectorised so a 100,000-round trace or a 262144-token vocabulary stays well under a second.

Definitions (llama.cpp / vLLM, see docs/reference/gemma4-assistant-facts.md §4): acceptance rate = accepted drafts /
drafted tokens; mean acceptance length = 1 + accepted / verify rounds; per-position acceptance =
P(draft k accepted) for k = 1..K. The headline numbers shown in the app come from
``mtpscope.traces.analysis.metrics.report``; the helpers here only serve views the report does not carry (windows,
bins, streaks, tables for one round).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from mtpscope.traces.analysis import wording

Decode = Callable[[int | None], str]


# ----------------------------------------------------------------------------------------- rounds

def ordered_rounds(rounds: pd.DataFrame, prompt_ids: Sequence[int] | None = None) -> pd.DataFrame:
    """Rounds sorted by (prompt_id, round), optionally only some prompts, with a 0-based ``seq``
    column (the x position on the timeline) and the original index dropped."""
    df = rounds
    if prompt_ids is not None:
        df = df[df["prompt_id"].isin(list(prompt_ids))]
    df = df.sort_values(["prompt_id", "round"], kind="stable").reset_index(drop=True)
    df["seq"] = np.arange(len(df), dtype=np.int64)
    return df


def per_prompt_table(rounds: pd.DataFrame, prompts: Sequence[dict] | None = None) -> pd.DataFrame:
    """One row per prompt, worst first: :func:`mtpscope.traces.analysis.metrics.per_prompt` (n_rounds, n_drafted,
    n_accepted, acceptance_rate, mean_acceptance_length) plus the prompt's text (from the manifest's
    prompts when given) and its longest zero-acceptance streak (rounds, from
    :func:`mtpscope.traces.analysis.metrics.zero_acceptance_streaks`). Sorted by acceptance rate ascending (NaN first),
    then prompt_id."""
    from mtpscope.traces.analysis import metrics

    t = metrics.per_prompt(rounds)
    streaks = metrics.zero_acceptance_streaks(rounds) if len(rounds) else None
    if streaks is not None and len(streaks):
        longest = streaks.groupby("prompt_id")["length"].max()
        t["longest_zero_streak"] = longest.reindex(t["prompt_id"].to_numpy()).fillna(0).astype(np.int64).to_numpy()
    else:
        t["longest_zero_streak"] = np.zeros(len(t), dtype=np.int64)
    texts = prompt_texts(prompts)
    t.insert(1, "text", [texts.get(int(p), "") for p in t["prompt_id"]])
    return t.sort_values(["acceptance_rate", "prompt_id"], kind="stable", na_position="first").reset_index(drop=True)


def clean_prompts(prompts) -> list[dict]:
    """A manifest's well-formed ``prompts`` entries (:func:`mtpscope.traces.analysis.wording.manifest_prompts`)."""
    return wording.manifest_prompts(prompts)


def prompt_texts(prompts) -> dict[int, str]:
    """prompt_id -> text of a manifest's ``prompts`` (:func:`mtpscope.traces.analysis.wording.prompt_texts`)."""
    return wording.prompt_texts(prompts)


def prompt_labels(prompt_ids, prompts, width: int = wording.PROMPT_LABEL_CHARS) -> dict[int, str]:
    """prompt_id -> ``prompt 3 “text…”`` (:func:`mtpscope.traces.analysis.wording.prompt_labels`)."""
    return wording.prompt_labels(prompt_ids, prompts, width)


def zero_streaks(rounds: pd.DataFrame, min_length: int = 2) -> pd.DataFrame:
    """:func:`mtpscope.traces.analysis.metrics.zero_acceptance_streaks` (longest first) with the streaks' positions on
    the timeline: start_seq / end_seq from ``rounds``' ``seq`` column (:func:`ordered_rounds`)."""
    from mtpscope.traces.analysis import metrics

    df = rounds if "seq" in rounds.columns else ordered_rounds(rounds)
    cols = ["prompt_id", "start_round", "end_round", "length", "start_seq", "end_seq"]
    if len(df) == 0:
        return pd.DataFrame(columns=cols)
    st = metrics.zero_acceptance_streaks(df, min_length=max(1, int(min_length)))
    if len(st) == 0:
        return pd.DataFrame({c: np.array([], dtype=np.int64) for c in cols})
    key = pd.Series(df["seq"].to_numpy(), index=pd.MultiIndex.from_arrays(
        [df["prompt_id"].to_numpy(dtype=np.int64), df["round"].to_numpy(dtype=np.int64)]))
    st = st.copy()
    st["start_seq"] = key.reindex(pd.MultiIndex.from_arrays([st["prompt_id"].to_numpy(dtype=np.int64),
                                                            st["start_round"].to_numpy(dtype=np.int64)])).to_numpy()
    st["end_seq"] = key.reindex(pd.MultiIndex.from_arrays([st["prompt_id"].to_numpy(dtype=np.int64),
                                                          st["end_round"].to_numpy(dtype=np.int64)])).to_numpy()
    return st[cols].reset_index(drop=True)


def rolling_acceptance(rounds: pd.DataFrame, window: int | None = None, max_points: int = 4000,
                       per_prompt: bool = False) -> pd.DataFrame:
    """Rolling acceptance rate (:func:`mtpscope.traces.analysis.metrics.rolling_acceptance`: accepted / drafted over
    the last ``window`` rounds, default :data:`mtpscope.traces.analysis.metrics.DEFAULT_ROLLING_WINDOW`) in
    :func:`ordered_rounds` order, subsampled to at most ``max_points`` points.

    ``per_prompt=False``: one window running over the whole trace (across prompt boundaries, as the
    report's rolling summary); ``per_prompt=True``: each prompt's own window, restarting at its first
    round (each prompt is its own curve).

    Returns columns seq, prompt_id, round, rolling_rate (NaN where nothing was drafted in the window),
    n_window (rounds the window holds so far: ``window`` once full) and full (``n_window == window``).
    """
    from mtpscope.traces.analysis import metrics

    w = max(1, int(window if window is not None else metrics.DEFAULT_ROLLING_WINDOW))
    df = rounds if "seq" in rounds.columns else ordered_rounds(rounds)
    cols = ["seq", "prompt_id", "round", "rolling_rate", "n_window", "full"]
    if len(df) == 0:
        return pd.DataFrame(columns=cols)
    r = metrics.rolling_acceptance(df, window=w, by_prompt=per_prompt)
    # metrics orders by (prompt_id, round) like ordered_rounds, so rows align with seq
    if per_prompt:
        pid = df["prompt_id"].to_numpy()
        start = np.ones(len(df), dtype=bool)
        start[1:] = pid[1:] != pid[:-1]
        first = np.maximum.accumulate(np.where(start, np.arange(len(df)), 0))
        n_in = np.arange(len(df)) - first + 1
    else:
        n_in = np.arange(len(df)) + 1
    n_in = np.minimum(n_in, w)
    idx = _subsample_index(len(df), max_points)
    return pd.DataFrame({"seq": df["seq"].to_numpy()[idx], "prompt_id": r["prompt_id"].to_numpy()[idx],
                         "round": r["round"].to_numpy()[idx], "rolling_rate": r["acceptance_rate"].to_numpy()[idx],
                         "n_window": n_in[idx], "full": n_in[idx] == w})


def _subsample_index(n: int, max_points: int) -> np.ndarray:
    if n <= max_points:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, max_points).round().astype(np.int64))


def binned_rounds(rounds: pd.DataFrame, max_bins: int = 2000) -> pd.DataFrame:
    """Aggregate ordered rounds into at most ``max_bins`` equal bins of consecutive rounds.

    Returns columns seq_start, seq_end (inclusive), prompt_id / round of the first round in the bin,
    n_rounds, mean_accepted (mean n_accepted), acceptance_rate (accepted / drafted in the bin),
    n_zero (rounds with n_accepted == 0 and n_draft > 0). Vectorised (np.add.reduceat).
    """
    df = rounds if "seq" in rounds.columns else ordered_rounds(rounds)
    n = len(df)
    cols = ["seq_start", "seq_end", "prompt_id", "round", "n_rounds", "mean_accepted", "acceptance_rate", "n_zero"]
    if n == 0:
        return pd.DataFrame(columns=cols)
    size = max(1, -(-n // max(1, max_bins)))
    starts = np.arange(0, n, size)
    ends = np.minimum(starts + size, n) - 1
    acc = df["n_accepted"].to_numpy(dtype=np.int64)
    dr = df["n_draft"].to_numpy(dtype=np.int64)
    zero = ((acc == 0) & (dr > 0)).astype(np.int64)
    s_acc = np.add.reduceat(acc, starts)
    s_dr = np.add.reduceat(dr, starts)
    s_zero = np.add.reduceat(zero, starts)
    cnt = ends - starts + 1
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(s_dr > 0, s_acc / np.where(s_dr > 0, s_dr, 1), np.nan)
    seq = df["seq"].to_numpy()
    return pd.DataFrame({"seq_start": seq[starts], "seq_end": seq[ends],
                         "prompt_id": df["prompt_id"].to_numpy()[starts], "round": df["round"].to_numpy()[starts],
                         "n_rounds": cnt, "mean_accepted": s_acc / cnt, "acceptance_rate": rate, "n_zero": s_zero})


#: What a draft step's verify said: the target agreed, disagreed (the first rejection of the round), or
#: was never asked (every draft after the first rejection is thrown away unchecked).
VERDICT_ACCEPTED, VERDICT_REJECTED, VERDICT_NOT_CHECKED = "accepted", "rejected", "not checked"
VERDICT_MARK = {VERDICT_ACCEPTED: "✓", VERDICT_REJECTED: "✗", VERDICT_NOT_CHECKED: "–"}
#: Words for a round that drafted nothing (the target decoded one token alone).
ZERO_DRAFT_WORDS = "drafted nothing: the target decoded one token alone (a plain decode step)"


def step_verdict(k: int, n_draft: int, n_accepted: int) -> str:
    """The verdict of draft ``k`` (1-based) of a round that drafted ``n_draft`` and had ``n_accepted``
    accepted: :data:`VERDICT_ACCEPTED` for ``k <= n_accepted``, :data:`VERDICT_REJECTED` for the first
    rejected draft ``k == n_accepted + 1``, :data:`VERDICT_NOT_CHECKED` after it."""
    if k <= n_accepted:
        return VERDICT_ACCEPTED
    return VERDICT_REJECTED if k == n_accepted + 1 and k <= n_draft else VERDICT_NOT_CHECKED


def _k_range(a: int, b: int) -> str:
    return f"k={a}" if a == b else f"k={a}–{b}"


def round_verdict(n_draft: int, n_accepted: int, drafted: Sequence[int | None], target: Sequence[int | None],
                  decode: Decode | None = None, step: dict | None = None, cause: str | None = None) -> str:
    """One line saying what the target did with a round's drafts.

    * nothing drafted: :data:`ZERO_DRAFT_WORDS`;
    * all accepted: ``All 3 drafts accepted; the target added “ the” (its bonus token)``;
    * else ``Rejected at k=1: the target chose “ islands” (drafter rank 13, logit 4.1 vs 5.3 for
      “Chiesa”); k=2–3 were not checked``. ``step`` is the rejected step's record (columns token,
      logit, top_ids, top_logits, target_rank) for the rank and logits (the target's logit under the
      drafter is known only when its token is among the stored top candidates); ``cause`` is the
      explanation of the rejection in words, appended after a colon.

    ``drafted`` / ``target``: the round's drafted ids and the target's id at each verify row."""
    dec = decode or (lambda t: "∅" if t is None else f"#{t}")
    nd, na = int(n_draft), int(n_accepted)
    d, t = _as_list(drafted), _as_list(target)
    if nd == 0:
        return ZERO_DRAFT_WORDS[0].upper() + ZERO_DRAFT_WORDS[1:]
    if na >= nd:
        bonus = t[nd] if len(t) > nd else None
        tail = f"; the target added {dec(bonus)} (its bonus token)" if bonus is not None else ""
        return f"All {nd} drafts accepted{tail}" if nd > 1 else f"The draft was accepted{tail}"
    k = na + 1
    tgt = t[k - 1] if len(t) >= k else None
    drf = d[k - 1] if len(d) >= k else None
    what = f"the target chose {dec(tgt)}" if tgt is not None else "the target's token is not in the trace"
    detail = []
    if step is not None:
        rank = _opt_int(step.get("target_rank"))
        if rank is not None:
            detail.append(f"drafter rank {rank}")
        top = _as_list(step.get("top_ids"))
        lg = step.get("top_logits")
        lg = [] if lg is None or _is_null(lg) else [float(x) for x in list(lg)]
        dl = step.get("logit")
        dl = None if dl is None or _is_null(dl) else float(dl)
        if tgt is not None and tgt in top and top.index(tgt) < len(lg) and dl is not None:
            detail.append(f"logit {lg[top.index(tgt)]:.2f} vs {dl:.2f} for {dec(drf)}")
        elif dl is not None and drf is not None:
            bound = f", at most {min(lg):.2f}" if lg else ""
            detail.append(f"logit not stored{bound}, vs {dl:.2f} for {dec(drf)}")
    elif drf is not None:
        detail.append(f"the drafter drafted {dec(drf)}")
    tag, rest = _cause_parts(cause)
    line = f"Rejected at k={k}" + (f" ({tag})" if tag else "") + f": {what}" \
        + (f" ({', '.join(detail)})" if detail else "") + (f" — {rest}" if rest else "")
    if k < nd:
        rest = _k_range(k + 1, nd)
        line += f"; {rest} {'was' if k + 1 == nd else 'were'} not checked"
    return line


def _cause_parts(cause: str | None) -> tuple[str | None, str | None]:
    """An explanation sentence (``rejected (near tie): the target's …``) split into its tag without the
    word "rejected" (``near tie``; None for a plain rejection) and the rest."""
    if not cause:
        return None, None
    tag, sep, rest = cause.partition(": ")
    if not sep:
        return None, cause
    tag = tag.strip()
    if tag.startswith("rejected"):
        tag = tag[len("rejected"):].strip().strip("()").strip()
    return tag or None, rest.strip() or None


def round_hover(rounds: pd.DataFrame, decode: Decode | None, max_tokens: int = 8,
                labels: dict[int, str] | None = None) -> list[str]:
    """Hover text per round: the prompt (``labels[prompt_id]``, see
    :func:`mtpscope.traces.analysis.wording.prompt_labels`) and round, accepted length, and each drafted token
    vs the target's token as text with its verdict (✓ accepted, ✗ rejected, – not checked); a round
    that drafted nothing says so.

    Only call on a window (thousands of rounds at most): it decodes every token shown."""
    dec = decode or (lambda t: "∅" if t is None else f"#{t}")
    labels = labels or {}
    out: list[str] = []
    pid = rounds["prompt_id"].to_numpy()
    rnd = rounds["round"].to_numpy()
    nacc = rounds["n_accepted"].to_numpy()
    ndr = rounds["n_draft"].to_numpy()
    drafted = rounds["drafted"].to_numpy() if "drafted" in rounds.columns else [None] * len(rounds)
    target = rounds["target"].to_numpy() if "target" in rounds.columns else [None] * len(rounds)
    for i in range(len(rounds)):
        head = f"{_esc(labels.get(int(pid[i]), f'prompt {pid[i]}'))} · round {rnd[i]}"
        if ndr[i] == 0:
            out.append(f"{head}<br>{ZERO_DRAFT_WORDS}")
            continue
        d = _as_list(drafted[i])[:max_tokens]
        t = _as_list(target[i])[:max_tokens]
        marks = []
        for k, tok in enumerate(d):
            v = step_verdict(k + 1, int(ndr[i]), int(nacc[i]))
            if v == VERDICT_NOT_CHECKED:
                marks.append(f"{k + 1}: {_esc(dec(tok))} – not checked")
                continue
            tgt = t[k] if k < len(t) else None
            marks.append(f"{k + 1}: {_esc(dec(tok))} vs {_esc(dec(tgt))} {VERDICT_MARK[v]}")
        lines = [head, f"accepted {nacc[i]} of {ndr[i]}"] + marks
        out.append("<br>".join(lines))
    return out


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _is_null(x) -> bool:
    return x is None or x is pd.NA or (isinstance(x, float) and np.isnan(x))


def _as_list(v) -> list:
    """A list cell (Python list, numpy array, Arrow scalar) as a list of int / None ([] for null)."""
    if _is_null(v):
        return []
    if hasattr(v, "as_py"):
        v = v.as_py()
        if v is None:
            return []
    return [None if _is_null(x) else int(x) for x in list(v)]


def _flatten_lists(col: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(length per row, all values concatenated) of a list column, int64; null rows have length 0.
    Arrow-backed columns (``pd.ArrowDtype``) are flattened without a Python loop."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(col.dtype, pd.ArrowDtype):
        arr = pa.chunked_array(col.array._pa_array) if hasattr(col.array, "_pa_array") else pa.chunked_array([pa.array(col)])
        lens = pc.fill_null(pc.list_value_length(arr), 0).to_numpy().astype(np.int64)
        flat = pc.list_flatten(arr).to_numpy(zero_copy_only=False)
        return lens, np.asarray(flat, dtype=np.int64)
    lens = np.fromiter((0 if _is_null(v) else len(v) for v in col), dtype=np.int64, count=len(col))
    parts = [np.asarray(v, dtype=np.int64) for v in col if not _is_null(v) and len(v)]
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return lens, flat


# ------------------------------------------------------------------------------------------ steps

def round_steps(steps: pd.DataFrame, prompt_id: int, round_: int) -> pd.DataFrame:
    """The steps of one round, sorted by k."""
    m = (steps["prompt_id"] == prompt_id) & (steps["round"] == round_)
    return steps[m].sort_values("k", kind="stable").reset_index(drop=True)


def leading_accepted(steps: pd.DataFrame) -> int:
    """How many of a round's steps (sorted by k) were accepted before the first that was not: the
    round's ``n_accepted`` as its steps tell it."""
    n = 0
    for v in (steps["accepted"] if "accepted" in steps.columns else []):
        if _is_null(v) or not bool(v):
            break
        n += 1
    return n


def step_table(steps: pd.DataFrame, decode: Decode | None, n_top: int = 5, *, n_draft: int | None = None,
               n_accepted: int | None = None, head: str = "dense") -> pd.DataFrame:
    """Display table of one round's draft steps (sorted by k): k, verdict (:func:`step_verdict`: a
    step after the first rejection is "not checked", its target token is not shown since the target
    never judged it), drafted (text), target (text), the target token's rank among the drafter's
    logits (0 = the drafter's choice), the drafter's top candidates (text), and, when the trace has
    centroid columns, the chosen centroids and whether the sparse head could have drafted the target's
    token (``head="dense"``: a what-if, "would be unreachable"): ``target_centroid`` "974 (rank 8)" and
    ``centroid_head``; then the ids.

    ``n_draft`` / ``n_accepted`` default to what the steps say (their count, the leading accepted)."""
    dec = decode or (lambda t: "∅" if t is None else f"#{t}")
    nd = len(steps) if n_draft is None else int(n_draft)
    na = leading_accepted(steps) if n_accepted is None else int(n_accepted)
    rows = []
    for r in steps.itertuples(index=False):
        d = r._asdict()
        k = int(d["k"])
        verdict = step_verdict(k, nd, na)
        checked = verdict != VERDICT_NOT_CHECKED
        top = _as_list(d.get("top_ids"))[:n_top]
        cids = _as_list(d.get("centroid_ids"))
        tgt = _opt_int(d.get("target_token"))
        reach = d.get("target_in_candidates")
        row = {
            "k": k,
            "verdict": f"{VERDICT_MARK[verdict]} {verdict}",
            "drafted": dec(int(d["token"])),  # decode may quote (TokenText.label) so spaces show
            "target": dec(tgt) if checked else "—",
            "target_rank": _opt_int(d.get("target_rank")) if checked else None,
            "top_candidates": " · ".join(dec(t) for t in top),
        }
        if "centroid_ids" in d:
            tc, tcr = _opt_int(d.get("target_centroid")), _opt_int(d.get("target_centroid_rank"))
            row["target_centroid"] = (f"{tc} (rank {tcr})" if tcr is not None else str(tc)) \
                if checked and tc is not None else "—"
            row["centroid_head"] = reachability_words(None if _is_null(reach) or not checked else bool(reach), head,
                                                      short=True)
        row["drafted_id"] = int(d["token"])
        row["target_id"] = tgt if checked else None
        rows.append(row)
    df = pd.DataFrame(rows)
    if len(df):
        df["target_rank"] = df["target_rank"].astype("Int64")
        df["target_id"] = df["target_id"].astype("Int64")
    return df


def reachability_words(reachable: bool | None, head: str = "dense", short: bool = False) -> str:
    """Whether the sparse (centroid) head's candidates held the target's token, in words. On a
    recording drafted by the dense head (``head="dense"``) the centroid head is a what-if: "would be
    unreachable with the centroid head"; drafted by the centroid head: "unreachable". ``short``: without
    "with the centroid head" (a table column that says it)."""
    if reachable is None:
        return "—"
    if head == "centroid":
        return "reachable" if reachable else "unreachable"
    tail = "" if short else " with the centroid head"
    return ("reachable" if reachable else "would be unreachable") + tail


def _opt_int(v) -> int | None:
    if _is_null(v):
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def top_candidates(step: dict, decode: Decode | None, n: int = 10) -> pd.DataFrame:
    """One step's top candidates: rank, id, text, logit, is_draft, is_target, stored.

    The target's token is always a row: when it is not among the stored top ``n`` (its rank is
    ``target_rank`` ≥ n, or unknown) a last row is added for it with ``stored`` False, ``rank`` its
    rank (``<NA>`` unknown) and ``logit`` NaN — its logit is not in the trace; it is at most the last
    stored logit (``logit_bound``). No target row when the target token is unknown."""
    dec = decode or (lambda t: f"#{t}")
    ids = _as_list(step.get("top_ids"))[:n]
    logits = list(step.get("top_logits") if step.get("top_logits") is not None else [])[:n]
    tgt = _opt_int(step.get("target_token"))
    tok = _opt_int(step.get("token"))
    lg = [float(x) for x in logits] + [np.nan] * (len(ids) - len(logits))
    df = pd.DataFrame({
        "rank": pd.array(np.arange(len(ids)), dtype="Int64"),
        "id": ids,
        "text": [dec(i) for i in ids],
        "logit": lg,
        "is_draft": [i == tok for i in ids],
        "is_target": [i == tgt for i in ids],
        "stored": [True] * len(ids),
        "logit_bound": [np.nan] * len(ids),
    })
    if tgt is not None and tgt not in ids:
        rank = _opt_int(step.get("target_rank"))
        bound = min((x for x in lg if np.isfinite(x)), default=np.nan)
        extra = pd.DataFrame({"rank": pd.array([rank], dtype="Int64"), "id": [tgt], "text": [dec(tgt)],
                              "logit": [np.nan], "is_draft": [tgt == tok], "is_target": [True], "stored": [False],
                              "logit_bound": [bound]})
        df = pd.concat([df, extra], ignore_index=True) if len(df) else extra
    return df


def unreachable_steps(steps: pd.DataFrame, limit: int = 500) -> pd.DataFrame:
    """Steps the sparse (centroid) head would have missed: the target's token was outside the chosen
    centroids' candidates (``target_in_candidates`` is False), in trace order, at most ``limit``.
    Only steps the target judged count (accepted, or the first rejection of their round): a step
    after its round's first rejection was never checked. On a recording drafted by the dense head
    these steps may well be accepted: the list is what the centroid head would have got wrong."""
    if "target_in_candidates" not in steps.columns:
        return steps.iloc[0:0]
    m = np.asarray(steps["target_in_candidates"].eq(False).fillna(False), dtype=bool)
    if "accepted" in steps.columns and {"prompt_id", "round", "k"} <= set(steps.columns):
        from mtpscope.traces.analysis.metrics import checked_mask

        m = m & checked_mask(steps)
    cols = [c for c in ("prompt_id", "round", "k", "token", "target_token", "target_centroid",
                        "target_centroid_rank", "accepted") if c in steps.columns]
    return steps.loc[m, cols].sort_values(["prompt_id", "round", "k"], kind="stable").head(limit).reset_index(drop=True)


def rejected_rounds(rounds: pd.DataFrame) -> list[tuple[int, int]]:
    """(prompt_id, round) of every round with a rejected draft (``n_accepted < n_draft``), in
    (prompt_id, round) order — the stops of the Step view's previous / next rejected round buttons."""
    m = rounds["n_accepted"].to_numpy(dtype=np.int64) < rounds["n_draft"].to_numpy(dtype=np.int64)
    sub = rounds.loc[m, ["prompt_id", "round"]].sort_values(["prompt_id", "round"], kind="stable")
    return [(int(p), int(r)) for p, r in zip(sub["prompt_id"], sub["round"])]


def neighbour(stops: Sequence[tuple[int, int]], current: tuple[int, int], direction: int) -> tuple[int, int] | None:
    """The stop after (``direction`` > 0) or before (< 0) ``current`` in the sorted ``stops``
    (``current`` need not be one of them); None when there is none."""
    import bisect

    cur = (int(current[0]), int(current[1]))
    if direction > 0:
        i = bisect.bisect_right(stops, cur)
        return stops[i] if i < len(stops) else None
    i = bisect.bisect_left(stops, cur) - 1
    return stops[i] if i >= 0 else None


def replay_for_round(rsteps: pd.DataFrame, prompt_id: int, round_: int, variants: Sequence[str],
                     decode: Decode | None = None) -> pd.DataFrame:
    """One round's rows of a replay's steps (``mtpscope replay --out``: columns prompt_id, round, k,
    recorded, truth, ``draft[NAME]`` per variant) as a display table: k, the target's token
    (``truth``: what the target emitted at that output position, "?" when unknown), the recorded draft,
    then per variant its draft with ✓ when it equals the target's token, and ``would_draft_target``:
    the variants that would have drafted the target's token (comma separated, "none")."""
    dec = decode or (lambda t: "∅" if t is None else f"#{t}")
    if rsteps is None or len(rsteps) == 0 or not {"prompt_id", "round", "k"} <= set(rsteps.columns):
        return pd.DataFrame(columns=["k", "target", "recorded", "would_draft_target"])
    sub = rsteps[(rsteps["prompt_id"] == prompt_id) & (rsteps["round"] == round_)].sort_values("k", kind="stable")
    rows = []
    for r in sub.to_dict("records"):
        truth = _opt_int(r.get("truth"))
        truth = None if truth is None or truth < 0 else truth
        row = {"k": int(r["k"]), "target": dec(truth) if truth is not None else "?",
               "recorded": dec(_opt_int(r.get("recorded")))}
        hits = []
        for name in variants:
            d = _opt_int(r.get(f"draft[{name}]"))
            ok = truth is not None and d == truth
            row[name] = ("✓ " if ok else "") + dec(d)
            if ok:
                hits.append(name)
        row["would_draft_target"] = ", ".join(hits) if hits else ("none" if truth is not None else "?")
        rows.append(row)
    return pd.DataFrame(rows, columns=["k", "target", "recorded", *variants, "would_draft_target"])


# ------------------------------------------------------------------------------------ generated text

#: What produced each generated token, in the order the text view's legend lists them.
TEXT_STATUSES = ("accepted", "bonus", "rejected", "decode", "prefill")
TEXT_STATUS_WORDS = {"accepted": "accepted draft", "bonus": "target's bonus token (every draft accepted)",
                     "rejected": "target's correction at a first rejection",
                     "decode": "target alone (the round drafted nothing)", "prefill": "the prefill's first token"}


def generated_text(pos, prompt_id: int, decode: Callable[[int], str], *, classes=None,
                   width: int = 100, max_tokens: int = 4000, start: int = 0) -> pd.DataFrame:
    """One prompt's generated tokens laid out as lines of text for the text view.

    Args:
        pos: :class:`mtpscope.traces.analysis.positions.Positions` of the trace (its ``sequences`` and
            ``emitted``: the status of every emitted token, ``accepted`` / ``rejected`` (the target's
            correction of a rejected draft) / ``bonus``; the first token, position 0, is the prefill's).
        prompt_id: the prompt.
        decode: id -> readable text without quotes (``TokenText.text``).
            A token of a round that drafted nothing is ``decode`` (the target decoded it alone).
        classes: ``mtpscope.traces.analysis.token_classes.TokenClasses`` of that prompt's sequence (optional).
        width: characters per line; a token whose text ends a line (``↵``) breaks it.
        max_tokens / start: at most this many tokens from output position ``start`` on.

    Returns:
        DataFrame, one row per token: g (output position), token, text, status (one of
        :data:`TEXT_STATUSES`), round, k (the draft position it answered, 0 for a bonus / prefill
        token), cls (token class or ""), line, col, n_chars (the text's width in characters, at least 1).
        Empty when the prompt's positions are not known.
    """
    cols = ["g", "token", "text", "status", "round", "k", "cls", "line", "col", "n_chars"]
    seq = pos.sequences.get(int(prompt_id)) if pos is not None else None
    if seq is None or len(seq) == 0:
        return pd.DataFrame(columns=cols)
    em = pos.emitted[pos.emitted["prompt_id"] == int(prompt_id)].sort_values("g", kind="stable")
    n = len(seq)
    status = np.full(n, "prefill", dtype=object)
    rnd = np.zeros(n, dtype=np.int64)
    kk = np.zeros(n, dtype=np.int64)
    g = em["g"].to_numpy(dtype=np.int64)
    ok = (g >= 0) & (g < n)
    st_ = em["status"].to_numpy(dtype=object).copy()
    drafted_rounds = set(pos.drafts.loc[pos.drafts["prompt_id"].to_numpy() == int(prompt_id), "round"].tolist())
    st_[~np.isin(em["round"].to_numpy(dtype=np.int64), list(drafted_rounds))] = "decode"
    status[g[ok]] = st_[ok]
    rnd[g[ok]] = em["round"].to_numpy(dtype=np.int64)[ok]
    kk[g[ok]] = em["k"].to_numpy(dtype=np.int64)[ok]
    cls = [""] * n
    if classes is not None:
        from mtpscope.traces.analysis.token_classes import CLASSES

        codes = np.asarray(classes.classes)
        cls = [CLASSES[int(c)] if 0 <= int(c) < len(CLASSES) else "" for c in codes[:n]]
        cls += [""] * (n - len(cls))
    lo, hi = max(0, int(start)), min(n, int(start) + int(max_tokens))
    rows = []
    line = col = 0
    for i in range(lo, hi):
        t = decode(int(seq[i]))
        w = max(1, len(t))
        if col and col + w > width:
            line, col = line + 1, 0
        rows.append((i, int(seq[i]), t, status[i], int(rnd[i]), int(kk[i]), cls[i], line, col, w))
        col += w
        if t.endswith("↵"):
            line, col = line + 1, 0
    return pd.DataFrame(rows, columns=cols)


def round_position(pos, prompt_id: int, round_: int) -> int | None:
    """The output position of the first token a round emitted (:class:`mtpscope.traces.analysis.positions.Positions`),
    None when unknown."""
    if pos is None or not len(pos.emitted):
        return None
    em = pos.emitted
    g = em.loc[(em["prompt_id"].to_numpy() == int(prompt_id)) & (em["round"].to_numpy() == int(round_)), "g"]
    return int(g.min()) if len(g) else None


# -------------------------------------------------------------------------------------- centroids

@dataclass(frozen=True)
class Coverage:
    """Per-centroid counts over a trace's draft steps (arrays of length n_centroids).

    chosen: steps where the centroid was among the top-k chosen (``centroid_ids``).
    target_home: steps whose target token lives in the centroid.
    covered: of those, steps where the centroid was chosen (target reachable).
    """

    chosen: np.ndarray
    target_home: np.ndarray
    covered: np.ndarray

    @property
    def n_centroids(self) -> int:
        return int(self.chosen.size)

    def table(self) -> pd.DataFrame:
        """DataFrame: centroid, chosen, target_home, covered, coverage (covered / target_home)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            cov = np.where(self.target_home > 0, self.covered / np.maximum(self.target_home, 1), np.nan)
        return pd.DataFrame({"centroid": np.arange(self.n_centroids), "chosen": self.chosen,
                             "target_home": self.target_home, "covered": self.covered, "coverage": cov})


def centroid_coverage(steps: pd.DataFrame, n_centroids: int, home: np.ndarray | None = None) -> Coverage:
    """Count per centroid how often it was chosen and how often the target token lived in it.

    The target's centroid is ``home[target_token]`` when ``home`` (np.int32[n_vocab], -1 = no centroid:
    ``CentroidHead.token_to_centroid`` of :mod:`mtpscope.inspector.centroids`, first row wins) is given,
    else the trace's ``target_centroid`` column. Vectorised: one
    concatenation of the ``centroid_ids`` lists and np.bincount.
    """
    n = int(n_centroids)
    empty = np.zeros(n, dtype=np.int64)
    if len(steps) == 0 or "centroid_ids" not in steps.columns:
        return Coverage(empty, empty.copy(), empty.copy())
    lens, flat = _flatten_lists(steps["centroid_ids"])
    ok = (flat >= 0) & (flat < n)
    chosen = np.bincount(flat[ok], minlength=n)[:n]
    if home is not None and "target_token" in steps.columns:
        tt = pd.to_numeric(steps["target_token"], errors="coerce").to_numpy(dtype=np.float64)
        valid = ~np.isnan(tt)
        tti = tt[valid].astype(np.int64)
        inr = (tti >= 0) & (tti < home.size)
        tc = np.full(len(steps), -1, dtype=np.int64)
        sub = np.full(tti.size, -1, dtype=np.int64)
        sub[inr] = home[tti[inr]]
        tc[np.flatnonzero(valid)] = sub
    elif "target_centroid" in steps.columns:
        tc = pd.to_numeric(steps["target_centroid"], errors="coerce").fillna(-1).to_numpy(dtype=np.int64)
    else:
        return Coverage(chosen, empty.copy(), empty.copy())
    okt = (tc >= 0) & (tc < n)
    target_home = np.bincount(tc[okt], minlength=n)[:n]
    # covered: the target's centroid is among this step's chosen ids
    step_of = np.repeat(np.arange(len(steps)), lens)
    hit = flat == tc[step_of]
    hit &= tc[step_of] >= 0
    covered_steps = np.zeros(len(steps), dtype=bool)
    covered_steps[step_of[hit]] = True
    covered = np.bincount(tc[okt & covered_steps], minlength=n)[:n]
    return Coverage(chosen, target_home, covered)


# ---------------------------------------------------------------------------------------- tensors

def inventory_frame(entries: Sequence) -> pd.DataFrame:
    """Inventory entries (``TensorEntry``) → table: name, component, layer, type, ne (GGUF order),
    shape (numpy order), n_elements, n_bytes, bits_per_weight, offset."""
    rows = []
    for e in entries:
        t = e.tensor
        rows.append({
            "name": t.name, "component": e.component, "layer": e.layer, "type": t.type_name,
            "ne": "×".join(str(x) for x in t.ne), "shape": "×".join(str(x) for x in t.shape),
            "n_elements": int(t.n_elements), "n_bytes": t.n_bytes, "bits_per_weight": t.bits_per_weight,
            "offset": int(t.offset),
        })
    df = pd.DataFrame(rows, columns=["name", "component", "layer", "type", "ne", "shape", "n_elements",
                                     "n_bytes", "bits_per_weight", "offset"])
    df["layer"] = df["layer"].astype("Int64")
    df["n_bytes"] = df["n_bytes"].astype("Int64")
    return df


FOCUS_RE = re.compile(r"^(mtp|nextn)\.")


def filter_inventory(df: pd.DataFrame, glob: str = "", components: Sequence[str] = (),
                     layers: Sequence[int] = (), types: Sequence[str] = (), focus: bool = False) -> pd.DataFrame:
    """Filter the inventory table: name glob (fnmatch, ``*`` when empty; a glob without wildcards
    matches as a substring), components, layers, ggml types, and the ``mtp.*`` / ``nextn.*`` focus."""
    m = np.ones(len(df), dtype=bool)
    g = glob.strip()
    if g:
        pat = g if any(c in g for c in "*?[") else f"*{g}*"
        m &= np.array([fnmatch.fnmatchcase(n, pat) for n in df["name"]], dtype=bool)
    if components:
        m &= df["component"].isin(list(components)).to_numpy()
    if layers:
        m &= df["layer"].isin(list(layers)).fillna(False).to_numpy(dtype=bool)
    if types:
        m &= df["type"].isin(list(types)).to_numpy()
    if focus:
        m &= df["name"].str.match(FOCUS_RE).to_numpy()
    return df[m].reset_index(drop=True)


_BLK_RE = re.compile(r"^blk\.(\d+)\.(.+?)(\.weight|\.bias)?$")


def layer_grid(present: Sequence[tuple[str, tuple[int, ...]]], missing: Sequence[str] = (),
               wrong_shape: Sequence[str] = ()) -> pd.DataFrame:
    """Layer × tensor status grid.

    Args:
        present: (name, shape) of every tensor in the file.
        missing: names the layout expects but the file lacks (from validation findings).
        wrong_shape: names present with a shape other than expected (from validation findings).

    Returns:
        Long DataFrame with layer, tensor (name within the block, e.g. ``attn_q``), name, status
        (``present`` / ``missing`` / ``wrong shape``), for every ``blk.{il}.*`` name.
    """
    status: dict[str, str] = {}
    for name, _shape in present:
        status[name] = "present"
    for name in missing:
        status[name] = "missing"
    for name in wrong_shape:
        status[name] = "wrong shape"
    rows = []
    for name, st in status.items():
        m = _BLK_RE.match(name)
        if not m:
            continue
        rows.append({"layer": int(m.group(1)), "tensor": m.group(2), "name": name, "status": st})
    return pd.DataFrame(rows, columns=["layer", "tensor", "name", "status"])


# ----------------------------------------------------------------------------------------- values

def downsample_matrix(a: np.ndarray, max_rows: int = 256, max_cols: int = 512) -> tuple[np.ndarray, int, int]:
    """Block-mean downsample a 2-D array to at most ``max_rows`` × ``max_cols`` (numpy order).

    Returns (small, row_factor, col_factor); edge blocks that do not fill a whole factor are averaged
    over what they hold (NaN-aware)."""
    a = np.asarray(a, dtype=np.float32)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim > 2:
        a = a.reshape(-1, a.shape[-1])
    r, c = a.shape
    fr = max(1, -(-r // max_rows))
    fc = max(1, -(-c // max_cols))
    if fr == 1 and fc == 1:
        return a, 1, 1
    pr = (-r) % fr
    pc = (-c) % fc
    padded = np.pad(a, ((0, pr), (0, pc)), constant_values=np.nan)
    blocks = padded.reshape(padded.shape[0] // fr, fr, padded.shape[1] // fc, fc)
    with np.errstate(invalid="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            small = np.nanmean(blocks, axis=(1, 3))
    return small.astype(np.float32), fr, fc


def value_stats(a: np.ndarray) -> dict[str, float]:
    """min, max, mean, std, abs max, fraction of zeros, count of non-finite values (float64 sums)."""
    v = np.asarray(a, dtype=np.float32).ravel()
    finite = np.isfinite(v)
    f = v[finite]
    if f.size == 0:
        return {"n": float(v.size), "non_finite": float(v.size)}
    return {"n": float(v.size), "min": float(f.min()), "max": float(f.max()),
            "mean": float(f.mean(dtype=np.float64)), "std": float(f.std(dtype=np.float64)),
            "abs_max": float(np.abs(f).max()), "zeros": float((f == 0).mean()),
            "non_finite": float(v.size - f.size)}


# ---------------------------------------------------------------------------------------- compare

def prompt_deltas(table_a: pd.DataFrame, table_b: pd.DataFrame,
                  pairs: Sequence[tuple[int, int]] | None = None) -> pd.DataFrame:
    """Join two :func:`per_prompt_table` results: rates a / b and delta (b − a), sorted by delta
    ascending (biggest drop first). ``pairs``: (prompt_id in A, prompt_id in B) as
    :func:`mtpscope.traces.analysis.align.pair_prompts` pairs them (by id, text or prompt_id); without it prompts
    are joined on prompt_id. The result's prompt_id is A's."""
    a = table_a.set_index("prompt_id")[["acceptance_rate", "mean_acceptance_length"]]
    b = table_b.set_index("prompt_id")[["acceptance_rate", "mean_acceptance_length"]]
    if pairs is not None:
        to_a = {int(pb_): int(pa_) for pa_, pb_ in pairs}
        b = b[b.index.isin(list(to_a))]
        b.index = [to_a[int(i)] for i in b.index]
        b.index.name = "prompt_id"
        a = a[a.index.isin([int(pa_) for pa_, _ in pairs])]
    j = a.merge(b, left_index=True, right_index=True, how="outer", suffixes=("_a", "_b"))
    j["delta_rate"] = j["acceptance_rate_b"] - j["acceptance_rate_a"]
    j["delta_length"] = j["mean_acceptance_length_b"] - j["mean_acceptance_length_a"]
    return j.reset_index().sort_values("delta_rate", kind="stable", na_position="last").reset_index(drop=True)



# ------------------------------------------------------------------------------------------ advice

def recommendation_label(rec: dict | None) -> str:
    """A recommendation (``Recommendation.to_dict()``) in two or three words: ``plain decoding``,
    ``n_draft 3``, ``q8 n_draft 3``, ``… (tie)``; ``—`` without one, ``too few rounds`` below the minimum."""
    if not rec:
        return "—"
    c = rec.get("choice")
    if c is None:
        return "too few rounds" if "too few" in (rec.get("reason") or "") else "—"
    who = f"{rec['assistant']} " if rec.get("assistant") else ""
    label = "plain decoding" if c == "plain" else f"{who}n_draft {c}"
    return label + (" (tie)" if rec.get("tie") else "")


def _iv(v) -> str:
    return "" if not v else f"{v[0]:.3g} – {v[1]:.3g}"


def what_if_table(rows: Sequence[dict]) -> pd.DataFrame:
    """The what-if rows (``Explanation.to_dict()["what_if"]``) as a table: each value with its 95 % interval."""
    out = []
    for r in rows:
        out.append({"n_draft": r["n_draft"],
                    "acceptance rate": r.get("acceptance_rate"),
                    "acceptance rate 95 %": _iv(r.get("acceptance_rate_interval")),
                    "mean acceptance length": r.get("mean_acceptance_length"),
                    "mean acceptance length 95 %": _iv(r.get("mean_acceptance_length_interval")),
                    "tokens/s": r.get("tokens_per_s"), "tokens/s 95 %": _iv(r.get("tokens_per_s_interval")),
                    "speedup": r.get("speedup"), "speedup 95 %": _iv(r.get("speedup_interval")),
                    "n_draft is": "recorded" if r.get("recorded") else ("extrapolated" if r.get("extrapolated")
                                                                        else "estimated")})
    return pd.DataFrame(out)


def recommendation_table(by_category: dict[str, dict]) -> pd.DataFrame:
    """Per-category recommendations (``recommendation["by_category"]``): category, choice, speedup and its
    interval, tie, and the short reason."""
    rows = []
    for cat, r in by_category.items():
        sp = r.get("speedup") or {}
        rows.append({"category": cat, "recommendation": recommendation_label(r), "speedup": sp.get("value"),
                     "interval": _iv(sp.get("interval")), "tie": bool(r.get("tie")),
                     "why": r.get("headline") or r.get("reason")})
    return pd.DataFrame(rows, columns=["category", "recommendation", "speedup", "interval", "tie", "why"])


def break_even_table(by_category: dict[str, dict]) -> pd.DataFrame:
    """Per-category break-even (``break_even["by_category"]``): the n_draft closest to paying, the draft
    cost ratio now and needed, the mean acceptance length now and needed, whether MTP pays."""
    rows = []
    for cat, b in by_category.items():
        rows.append({"category": cat, "n_draft": b["n_draft"], "draft step / plain decode": b["draft_cost_ratio"],
                     "needed below": b["draft_cost_ratio_needed"],
                     "mean acc. length": b["mean_acceptance_length"],
                     "needed": b["mean_acceptance_length_needed"],
                     "with a flat verify: draft step needed below": b["flat_verify_draft_cost_ratio_needed"],
                     "pays": bool(b["pays"])})
    return pd.DataFrame(rows)
