"""One prompt's rounds as the Step and Text pages show them (pure: pandas / numpy, no Streamlit, no plotly):
what the target did with a round's drafts (verdicts and the round's one-line verdict), one round's step
table and top candidates, the centroid head's reach, rejected-round navigation, a replay's rows of a round,
and the generated text laid out token by token.

Inputs are the trace's DataFrames (``Trace.rounds`` / ``Trace.steps``, columns as in docs/ARCHITECTURE.md),
one step's record (a dict of its columns), or :class:`mtpscope.traces.analysis.positions.Positions`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np
import pandas as pd

from mtpscope.app.views import Decode, as_list, esc, is_null, opt_int

# ---------------------------------------------------------------------------------------- verdicts

#: What a draft step's verify said: the target agreed, disagreed (the first rejection of the round), or
#: was never asked (every draft after the first rejection is thrown away unchecked).
VERDICT_ACCEPTED, VERDICT_REJECTED, VERDICT_NOT_CHECKED = "accepted", "rejected", "not checked"
VERDICT_MARK = {VERDICT_ACCEPTED: "✓", VERDICT_REJECTED: "✗", VERDICT_NOT_CHECKED: "–"}
#: Words for a round that drafted nothing (the target decoded one token alone).
ZERO_DRAFT_WORDS = "drafted nothing: the target decoded one token alone (a plain decode step)"


def no_steps_words(manifest: Mapping[str, Any], *, lost_steps: bool) -> str:
    """What the Step page says of a round without per-step records: a steps part the reader skipped (``lost_steps``:
    missing or unreadable), an imported log (its ``source`` is not ``record`` or ``replay``: rounds only), or
    neither known; in each case the drafter's candidates are not known."""
    if lost_steps:
        why = "a steps part file of this trace was lost (missing or unreadable: the line above names it)"
    elif manifest.get("source") not in ("record", "replay"):
        why = "the trace carries rounds only (an imported log)"
    else:
        why = "the trace holds none for it"
    return f"This round has no per-step records: {why}, so the drafter's candidates are not known."


def step_verdict(k: int, n_draft: int, n_accepted: int) -> str:
    """The verdict of draft ``k`` (1-based) of a round that drafted ``n_draft`` and had ``n_accepted``
    accepted: :data:`VERDICT_ACCEPTED` for ``k <= n_accepted``, :data:`VERDICT_REJECTED` for the first
    rejected draft ``k == n_accepted + 1``, :data:`VERDICT_NOT_CHECKED` after it."""
    if k <= n_accepted:
        return VERDICT_ACCEPTED
    return VERDICT_REJECTED if k == n_accepted + 1 and k <= n_draft else VERDICT_NOT_CHECKED


def _k_range(a: int, b: int) -> str:
    return f"k={a}" if a == b else f"k={a}–{b}"


def round_verdict(n_draft: int, n_accepted: int, drafted: Sequence[int | None] | None,
                  target: Sequence[int | None] | None,
                  decode: Decode | None = None, step: dict | None = None, cause: str | None = None) -> str:
    """One line saying what the target did with a round's drafts.

    * nothing drafted: :data:`ZERO_DRAFT_WORDS`;
    * all accepted: ``All 3 drafts accepted; the target added “ the” (its bonus token)``;
    * else ``Rejected at k=1: the target chose “ islands” (drafter rank 13, logit 4.1 vs 5.3 for
      “Chiesa”); k=2–3 were not checked``. ``step`` is the rejected step's record (columns token,
      logit, top_ids, top_logits, target_rank) for the rank and logits (the target's logit under the
      drafter is known only when its token is among the stored top candidates);
    * with ``cause`` (the explanation's sentence, :func:`mtpscope.traces.analysis.explain.step_sentence`),
      which names the target's token, its rank and the gap itself, each fact is said once:
      ``Rejected at k=1 (near tie): drafted “x” (logit 4.90); the target's “ islands” was the drafter's
      runner-up, 0.80 logits behind; k=2–3 were not checked``.

    ``drafted`` / ``target``: the round's drafted ids and the target's id at each verify row."""
    dec = decode or (lambda t: "∅" if t is None else f"#{t}")
    nd, na = int(n_draft), int(n_accepted)
    d, t = as_list(drafted), as_list(target)
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
        rank = opt_int(step.get("target_rank"))
        if rank is not None:
            detail.append(f"drafter rank {rank}")
        top = as_list(step.get("top_ids"))
        lg = step.get("top_logits")
        lg = [] if lg is None or is_null(lg) else [float(x) for x in list(lg)]
        dl = step.get("logit")
        dl = None if dl is None or is_null(dl) else float(dl)
        if tgt is not None and tgt in top and top.index(tgt) < len(lg) and dl is not None:
            detail.append(f"logit {lg[top.index(tgt)]:.2f} vs {dl:.2f} for {dec(drf)}")
        elif dl is not None and drf is not None:
            bound = f", at most {min(lg):.2f}" if lg else ""
            detail.append(f"logit not stored{bound}, vs {dl:.2f} for {dec(drf)}")
    elif drf is not None:
        detail.append(f"the drafter drafted {dec(drf)}")
    tag, rest = _cause_parts(cause)
    if rest:   # the cause names the target's token, its rank and the gap: said once, after what was drafted
        line = f"Rejected at k={k}" + (f" ({tag})" if tag else "") + ": " + _drafted_words(drf, step, dec) + rest
    else:
        line = f"Rejected at k={k}: {what}" + (f" ({', '.join(detail)})" if detail else "")
    if k < nd:
        rest = _k_range(k + 1, nd)
        line += f"; {rest} {'was' if k + 1 == nd else 'were'} not checked"
    return line


def _drafted_words(drafted: int | None, step: dict | None, dec: Decode) -> str:
    """``drafted “x” (logit 4.90); `` -- the start of a rejection's sentence whose cause says the rest."""
    if drafted is None:
        return ""
    dl = None if step is None else step.get("logit")
    dl = None if dl is None or is_null(dl) else float(dl)
    return f"drafted {dec(drafted)}" + (f" (logit {dl:.2f})" if dl is not None else "") + "; "


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


def round_verdict_line(row: pd.Series | Mapping[str, Any], steps: pd.DataFrame, decode: Decode,
                       first_mismatches: pd.DataFrame | None, manifest: Mapping[str, Any]) -> str:
    """The Step view's one-line verdict for a round (:func:`round_verdict`): the rejected step's record
    for the drafter's rank and logits, and the explanation layer's sentence for its cause and the
    target's side (:func:`mtpscope.traces.analysis.explain.step_sentence` of the round's first mismatch,
    as ``mtpscope explain --prompt`` prints it).

    Args:
        row: the round (columns prompt_id, round, n_draft, n_accepted, drafted, target).
        steps: the round's steps (:func:`round_steps`).
        decode: id -> token text (``TokenText.label``).
        first_mismatches: the explanation's ``first_mismatches`` (needed only when a draft was rejected).
        manifest: the trace's manifest (its ``centroids`` entry words the centroid head's reach).
    """
    from mtpscope.traces.analysis.explain import step_sentence

    nd, na = int(row["n_draft"]), int(row["n_accepted"])
    step = None
    cause = None
    if na < nd:
        if len(steps):
            hit = steps[steps["k"] == na + 1]
            step = hit.iloc[0].to_dict() if len(hit) else None
        fm = first_mismatches
        m = fm[(fm["prompt_id"] == int(row["prompt_id"])) & (fm["round"] == int(row["round"]))] \
            if fm is not None else None
        if m is not None and len(m):
            centroids = manifest.get("centroids")
            cen = centroids if isinstance(centroids, dict) else {}
            # a row's labels are the frame's column names, all str (pandas-stubs: dict[Hashable, Any])
            cause = step_sentence(cast("dict[str, Any]", m.iloc[0].to_dict()), decode, n_centroids=cen.get("n_centroids"),
                                  centroid_top_k=cen.get("top_k"))
    return round_verdict(nd, na, row.get("drafted"), row.get("target"), decode, step=step, cause=cause)


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
        head = f"{esc(labels.get(int(pid[i]), f'prompt {pid[i]}'))} · round {rnd[i]}"
        if ndr[i] == 0:
            out.append(f"{head}<br>{ZERO_DRAFT_WORDS}")
            continue
        d = as_list(drafted[i])[:max_tokens]
        t = as_list(target[i])[:max_tokens]
        marks = []
        for k, tok in enumerate(d):
            v = step_verdict(k + 1, int(ndr[i]), int(nacc[i]))
            if v == VERDICT_NOT_CHECKED:
                marks.append(f"{k + 1}: {esc(dec(tok))} – not checked")
                continue
            tgt = t[k] if k < len(t) else None
            marks.append(f"{k + 1}: {esc(dec(tok))} vs {esc(dec(tgt))} {VERDICT_MARK[v]}")
        lines = [head, f"accepted {nacc[i]} of {ndr[i]}"] + marks
        out.append("<br>".join(lines))
    return out



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
        if is_null(v) or not bool(v):
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
        d = cast(Any, r)._asdict()  # itertuples() yields namedtuples; pandas-stubs types them as plain tuples
        k = int(d["k"])
        verdict = step_verdict(k, nd, na)
        checked = verdict != VERDICT_NOT_CHECKED
        top = as_list(d.get("top_ids"))[:n_top]
        tgt = opt_int(d.get("target_token"))
        reach = d.get("target_in_candidates")
        row = {
            "k": k,
            "verdict": f"{VERDICT_MARK[verdict]} {verdict}",
            "drafted": dec(int(d["token"])),  # decode may quote (TokenText.label) so spaces show
            "target": dec(tgt) if checked else "—",
            "target_rank": opt_int(d.get("target_rank")) if checked else None,
            "top_candidates": " · ".join(dec(t) for t in top),
        }
        if "centroid_ids" in d:
            tc, tcr = opt_int(d.get("target_centroid")), opt_int(d.get("target_centroid_rank"))
            row["target_centroid"] = (f"{tc} (rank {tcr})" if tcr is not None else str(tc)) \
                if checked and tc is not None else "—"
            row["centroid_head"] = reachability_words(None if is_null(reach) or not checked else bool(reach), head,
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




def top_candidates(step: dict, decode: Decode | None, n: int = 10) -> pd.DataFrame:
    """One step's top candidates: rank, id, text, logit, is_draft, is_target, stored.

    The target's token is always a row: when it is not among the stored top ``n`` (its rank is
    ``target_rank`` ≥ n, or unknown) a last row is added for it with ``stored`` False, ``rank`` its
    rank (``<NA>`` unknown) and ``logit`` NaN — its logit is not in the trace; it is at most the last
    stored logit (``logit_bound``). No target row when the target token is unknown."""
    dec = decode or (lambda t: f"#{t}")
    ids = as_list(step.get("top_ids"))[:n]
    top_logits = step.get("top_logits")
    logits = list(top_logits if top_logits is not None else [])[:n]
    tgt = opt_int(step.get("target_token"))
    tok = opt_int(step.get("token"))
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
        rank = opt_int(step.get("target_rank"))
        bound = min((x for x in lg if np.isfinite(x)), default=np.nan)
        extra = pd.DataFrame({"rank": pd.array([rank], dtype="Int64"), "id": [tgt], "text": [dec(tgt)],
                              "logit": [np.nan], "is_draft": [tgt == tok], "is_target": [True], "stored": [False],
                              "logit_bound": [bound]})
        df = pd.concat([df, extra], ignore_index=True) if len(df) else extra
    return df


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


def prompt_round_spans(rounds: pd.DataFrame) -> dict[int, tuple[int, int]]:
    """prompt_id -> (first round, last round) of a trace's ``rounds`` table (what a link's ``prompt`` and
    ``round`` are checked against: :func:`mtpscope.app.links.check_in_trace`)."""
    if len(rounds) == 0:
        return {}
    g = rounds.groupby("prompt_id", sort=True)["round"].agg(["min", "max"])
    return {int(p): (int(lo), int(hi)) for p, lo, hi in zip(g.index, g["min"], g["max"])}


def worst_round(rounds: pd.DataFrame, prompt_id: int | None = None) -> tuple[int, int] | None:
    """The worst round of a trace (or of one prompt): the round that lost the most drafts
    (``n_draft − n_accepted``); among those, the one that opens the longest run of rounds that drafted and
    accepted nothing (:func:`mtpscope.traces.analysis.metrics.zero_acceptance_streaks` by its first round);
    then the earliest (prompt_id, round). None when no round lost a draft.

    Args:
        rounds: the ``rounds`` table (columns prompt_id, round, n_draft, n_accepted).
        prompt_id: only this prompt's rounds; None for every prompt.
    """
    from mtpscope.traces.analysis import metrics

    df = rounds if prompt_id is None else rounds[rounds["prompt_id"] == int(prompt_id)]
    if len(df) == 0:
        return None
    lost = df["n_draft"].to_numpy(dtype=np.int64) - df["n_accepted"].to_numpy(dtype=np.int64)
    if lost.max() <= 0:
        return None
    cand = pd.DataFrame({"prompt_id": df["prompt_id"].to_numpy(dtype=np.int64),
                         "round": df["round"].to_numpy(dtype=np.int64), "lost": lost})
    cand = cand[cand["lost"] == lost.max()]
    streaks = metrics.zero_acceptance_streaks(df, min_length=1)
    runs = pd.DataFrame({"prompt_id": streaks["prompt_id"].to_numpy(dtype=np.int64),
                         "round": streaks["start_round"].to_numpy(dtype=np.int64),
                         "run": streaks["length"].to_numpy(dtype=np.int64)})
    cand = cand.merge(runs, on=["prompt_id", "round"], how="left").fillna({"run": 0})
    best = cand.sort_values(["run", "prompt_id", "round"], ascending=[False, True, True], kind="stable").iloc[0]
    return int(best["prompt_id"]), int(best["round"])


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
        truth = opt_int(r.get("truth"))
        truth = None if truth is None or truth < 0 else truth
        row = {"k": int(r["k"]), "target": dec(truth) if truth is not None else "?",
               "recorded": dec(opt_int(r.get("recorded")))}
        hits = []
        for name in variants:
            d = opt_int(r.get(f"draft[{name}]"))
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

