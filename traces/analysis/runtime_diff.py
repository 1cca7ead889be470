"""Where two runtimes' traces of the same prompts first differ, round by round, and which known convention
explains it (llama.cpp vs mlx-vlm; docs/RUNTIMES.md). Pure (numpy / pandas over ``rounds``); one job.

**Conventions.** A trace recorded by another runtime carries its conventions in ``manifest["convention"]``
(``runtime``, ``draft_position``, ``head``, ``dtype``, ``last_round``, ``eog``, and where the runtime says it
``kv_visibility``: what the drafter sees of the target's cache after a partial acceptance), read into a
:class:`Convention` record; a llama.cpp recording
(``runtime.llama_cpp_python`` set) has llama.cpp's, :data:`LLAMA_CPP_CONVENTION` (measured: docs/RUNTIMES.md).

**Aligning rounds.** Greedy rounds of the two traces are compared where both have a round whose pending
token sits at the same position ``pos`` with the same pending token: there both drafters saw the same
sequence, so their drafts should agree. The first such round (in A's order) whose drafts differ is the
prompt's first differing round, with the first differing draft step ``k`` (1-based). After it the round
boundaries usually shift (a different number accepted); later rounds at a common position are still
compared and counted (``n_rounds_compared``, ``n_rounds_differing``).

**Causes** (:data:`CAUSES`), named only where the two conventions differ in that respect:
``draft_position`` (drafts differ, the drafter positions differ: p vs p - 1), ``kv_visibility`` (drafts
differ at the same drafter position in a round that follows a partial acceptance, i.e. a round of either
trace whose drafts were not all accepted: the rejected drafts' cells were written to the target's cache, and
the two runtimes differ in whether the drafter then sees them), ``head`` / ``dtype`` (drafts differ, same
position, different head / weight dtype), ``last_round`` (the two drafted different numbers of tokens in a
prompt's last round: min(n_draft, remaining) vs min(n_draft, remaining - 1)), ``eog`` (one output goes on
past an end-of-generation token where the other stopped), ``n_draft`` (the two drafted different numbers of
tokens and the runs' ``params.n_draft`` differ: a recording parameter, checked before the last-round cap). ``None``:
no known convention explains it.

**Confirmation.** Reading the conventions names a candidate; it is checked where it can be:
``head`` by the dense-head trace's own centroid token at that step (:func:`confirm_head`); ``draft_position``,
``kv_visibility`` and ``head`` by replaying that step with the numpy reference drafter under both values of the
convention, another convention held fixed (the replay lives in ``traces.run.runtime_replay``, which fills
:class:`ReplayedDraft` records in; :func:`with_replays` turns them into ``confirmed`` here, purely; where a named
``kv_visibility`` is not confirmed and the head, which also differs, is, the head becomes the cause); ``eog`` by the
stop sets (:meth:`Convention.eog_stop_ids`): the shorter output's last token is not one the longer run stops at.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pandas as pd

from mtpscope.traces.analysis.records import JsonRecord

#: llama.cpp's conventions as mtpscope records them (traces/run/mtp_runtime.py; measured on the demo pair)
LLAMA_CPP_CONVENTION: dict[str, Any] = {
    "runtime": "llama.cpp", "draft_position": "p", "head": "dense",
    "last_round": "n_draft = min(n_draft, max_tokens - emitted - 1)",
    "eog": "stop at the first end-of-generation token (the vocabulary's EOG ids)",
    "kv_visibility": "llama.cpp: the rejected drafts' cells are removed from the target's cache before the next round"}

#: the convention keys compared (their values, by :func:`_norm`)
CONVENTION_KEYS = ("draft_position", "head", "dtype", "last_round", "eog", "kv_visibility")

#: known causes: name -> the words the report prints
CAUSES: dict[str, str] = {
    "draft_position": "draft position p vs p - 1 (the drafter's RoPE position for the pending token)",
    "kv_visibility": "KV visibility after a partial acceptance (rejected drafts' cells removed or still seen)",
    "head": "drafter head (dense vs centroid)",
    "dtype": "weight dtype",
    "last_round": "last-round cap: min(n_draft, remaining) vs min(n_draft, remaining - 1) drafts",
    "eog": "end of generation: one runtime does not stop, or stops at other ids",
    "n_draft": "the runs' n_draft differs (a recording parameter, not a runtime convention)",
}


@dataclass(frozen=True)
class Convention(JsonRecord):
    """One trace's runtime conventions (``manifest["convention"]``, or llama.cpp's for a llama.cpp recording).

    Attributes:
        runtime: the runtime's name (``"llama.cpp"``, ``"mlx"``, ``"hf"``), or None when the manifest has none.
        draft_position / head / dtype / last_round / eog / kv_visibility: the keys compared
            (:data:`CONVENTION_KEYS`), each as the manifest states it, None where it says nothing.
        other: the manifest's other keys (notes, ``acceptance``, ``timing``, ...) as ``(key, value)`` pairs.
        order: the manifest's key order (:meth:`to_dict` writes the keys in it).
    """

    runtime: str | None = None
    draft_position: str | None = None
    head: str | None = None
    dtype: str | None = None
    last_round: str | None = None
    eog: str | None = None
    kv_visibility: str | None = None
    other: tuple[tuple[str, Any], ...] = ()
    order: tuple[str, ...] = ()

    @classmethod
    def from_manifest(cls, conv: Mapping[str, Any]) -> Convention:
        """The record of a manifest's ``convention`` mapping (values of the compared keys as strings)."""
        known = {"runtime", *CONVENTION_KEYS}
        vals = {k: None if conv.get(k) is None else str(conv[k]) for k in known}
        return cls(**vals, other=tuple((str(k), v) for k, v in conv.items() if k not in known),
                   order=tuple(str(k) for k in conv))

    def to_dict(self) -> dict[str, Any]:
        """The manifest's mapping again (its keys in its order): the JSON of ``compare --json``."""
        extra = dict(self.other)
        return {k: extra[k] if k in extra else getattr(self, k) for k in self.order}

    def value(self, key: str) -> str | None:
        """The value of one compared key (:data:`CONVENTION_KEYS` or ``runtime``), None where not stated."""
        if key not in ("runtime", *CONVENTION_KEYS):
            return None
        v: str | None = getattr(self, key)
        return v

    def eog_stop_ids(self) -> frozenset[int] | None:
        """The end-of-generation ids this runtime stops at, where the convention lists them (an ``eog_ids`` key,
        or the ids in brackets in ``eog``: ``"... generation_config ([1]) ..."``); None: not listed (llama.cpp's
        "the vocabulary's EOG ids") or no stop."""
        extra = dict(self.other)
        ids = extra.get("eog_ids")
        if isinstance(ids, (list, tuple)):
            return frozenset(int(x) for x in ids)
        m = re.search(r"\[(\d+(?:\s*,\s*\d+)*)\]", self.eog or "")
        return frozenset(int(x) for x in m.group(1).split(",")) if m else None


def runtime_convention(manifest: Mapping[str, Any]) -> Convention | None:
    """The trace's runtime conventions (module docstring), or None when unknown (imports, synthetic)."""
    conv = manifest.get("convention")
    if isinstance(conv, Mapping):
        return Convention.from_manifest(conv)
    rt = manifest.get("runtime")
    if manifest.get("source") == "record" and isinstance(rt, Mapping) and rt.get("llama_cpp_python"):
        return Convention.from_manifest(LLAMA_CPP_CONVENTION)
    return None


@dataclass(frozen=True)
class ReplayedDraft(JsonRecord):
    """One replay of a first differing step (``traces.run.runtime_replay``): the reference drafter run on the
    step's common prefix with one value of the cause's convention.

    Attributes:
        key: the convention varied (``"draft_position"``, ``"head"`` or ``"kv_visibility"``).
        value: its value in this replay (``"p"`` / ``"p-1"``; ``"dense"`` / ``"centroid"``; ``"llama.cpp"`` / ``"hf"``).
        held: the other convention held fixed, ``"name=value"`` (e.g. ``"head=dense"``, ``"kv_visibility=hf"``).
        token: the draft the replay made at the step.
        reproduces: ``"a"`` / ``"b"``: it equals that trace's draft at the step; None: neither's.
    """

    key: str
    value: str
    held: str
    token: int
    reproduces: str | None


@dataclass(frozen=True)
class RoundDifference(JsonRecord):
    """One prompt pair's first difference round by round.

    Attributes:
        prompt_id_a / prompt_id_b: the prompt in A and B.
        what: ``"drafts"`` (same position, different drafts), ``"n_draft"`` (same position, a different
            number of drafts), ``"output"`` (no round differs, the generated tokens differ: the target's own
            choice, a near tie or numerics, not a drafter convention), ``"output_length"`` (no round differs, one
            output goes on where the other stopped) or ``"none"``.
        round_a / round_b: the rounds (0-based) that first differ (None for output_length / none).
        pos: position of those rounds' pending token (None likewise).
        step: the first differing draft step k (1-based; None when the shorter draft list is a prefix).
        drafted_a / drafted_b: the two rounds' drafts (empty when no round differs).
        cause: a key of :data:`CAUSES`, or None (unexplained, or no difference).
        n_rounds_compared / n_rounds_differing: rounds at a common position with the same pending token, and
            those of them whose drafts differ (in number or ids).
        output_diverged_at: the first output position whose token differs (not a length difference), or None.
        confirmed: whether the named cause was checked and holds: for ``head``, the dense-head trace's own
            centroid head (its step's ``centroid_token``) drafted the other trace's token at that step
            (:func:`confirm_head`); for a replayed cause (``draft_position``, ``head``), the reference drafter under
            A's value of the convention drafted A's token at ``step`` and under B's value B's token, the other
            convention held fixed (:func:`with_replays`). None: not checked.
        replayed: the replayed drafts of that step (:class:`ReplayedDraft`, empty when not replayed).
        replay_note: why the step was not replayed, or what the replay could not decide (None otherwise).
    """

    prompt_id_a: int
    prompt_id_b: int
    what: str
    round_a: int | None
    round_b: int | None
    pos: int | None
    step: int | None
    drafted_a: tuple[int, ...]
    drafted_b: tuple[int, ...]
    cause: str | None
    n_rounds_compared: int
    n_rounds_differing: int
    output_diverged_at: int | None = None
    confirmed: bool | None = None
    replayed: tuple[ReplayedDraft, ...] = ()
    replay_note: str | None = None


@dataclass(frozen=True)
class RuntimeDiff(JsonRecord):
    """The round-by-round comparison of two traces (:func:`runtime_diff`).

    Attributes:
        convention_a / convention_b: each trace's conventions (None: unknown).
        differs: the convention keys whose values differ (sorted).
        prompts: per pair a :class:`RoundDifference`.
        causes: ``{cause or "unexplained": prompts whose first difference it names}``.
        n_rounds_compared / n_rounds_differing: sums over the prompts.
    """

    convention_a: Convention | None
    convention_b: Convention | None
    differs: tuple[str, ...]
    prompts: tuple[RoundDifference, ...]
    causes: dict[str, int]
    n_rounds_compared: int
    n_rounds_differing: int


def _lists(col: pd.Series) -> list[tuple[int, ...]]:
    return [tuple(int(t) for t in v) if v is not None and not (isinstance(v, float) and np.isnan(v)) else ()
            for v in col.tolist()]


def _cause(what: str, differs: Sequence[str], after_partial: bool = False) -> str | None:
    """The cause of a first difference of kind ``what`` (module docstring): the first of the known ones that
    ``differs`` names (the conventions that differ, plus ``n_draft`` when the runs' n_draft does)."""
    if what == "drafts":
        if "draft_position" in differs:
            return "draft_position"
        if after_partial and "kv_visibility" in differs:
            return "kv_visibility"
        for key in ("head", "dtype"):
            if key in differs:
                return key
        return None
    if what == "n_draft":
        if "n_draft" in differs:
            return "n_draft"
        return "last_round" if "last_round" in differs else None
    if what == "output_length":
        return "eog" if "eog" in differs else None
    return None


def _after_partial(r: pd.DataFrame, drafted: Sequence[tuple[int, ...]]) -> list[bool]:
    """Per round (sorted): whether the round before it drafted more than it accepted (False without an
    ``n_accepted`` column)."""
    if "n_accepted" not in r.columns:
        return [False] * len(r)
    acc = [int(x) for x in r["n_accepted"].tolist()]
    return [i > 0 and acc[i - 1] < len(drafted[i - 1]) for i in range(len(r))]


def _eog_check(out_a: Sequence[int], out_b: Sequence[int], ca: Convention | None,
               cb: Convention | None) -> bool | None:
    """For an output-length difference: whether the shorter output's last token is one the longer run's runtime
    does not stop at (its listed stop ids, :meth:`Convention.eog_stop_ids`, lack it, or it does not stop at
    all). None: not decidable (that runtime's stop ids are not listed)."""
    short, conv_long = (out_a, cb) if len(out_a) < len(out_b) else (out_b, ca)
    if not short or conv_long is None:
        return None
    if not _norm("eog", conv_long.eog)[0]:
        return True
    ids = conv_long.eog_stop_ids()
    return None if ids is None else int(short[-1]) not in ids


def _prompt(ra: pd.DataFrame, rb: pd.DataFrame, pa_: int, pb_: int, differs: Sequence[str],
            out_a: Sequence[int], out_b: Sequence[int], ca: Convention | None = None,
            cb: Convention | None = None) -> RoundDifference:
    """One pair (module docstring); ``ra`` / ``rb`` the pair's rounds sorted by round."""
    n = min(len(out_a), len(out_b))
    neq = [g for g in range(n) if int(out_a[g]) != int(out_b[g])]
    div = neq[0] if neq else None
    b_at = {int(p): i for i, p in enumerate(rb["pos"].tolist())}
    da, db = _lists(ra["drafted"]), _lists(rb["drafted"])
    pend_a, pend_b = ra["pending_token"].tolist(), rb["pending_token"].tolist()
    # a round after one whose drafts were not all accepted (its rejected cells were written), per trace
    part_a, part_b = _after_partial(ra, da), _after_partial(rb, db)
    first: RoundDifference | None = None
    n_cmp = n_diff = 0
    for i, pos in enumerate(ra["pos"].tolist()):
        j = b_at.get(int(pos))
        if j is None or int(pend_a[i]) != int(pend_b[j]):
            continue
        n_cmp += 1
        xa, xb = da[i], db[j]
        if xa == xb:
            continue
        n_diff += 1
        if first is None:
            ne = [k for k, (u, v) in enumerate(zip(xa, xb), start=1) if u != v]
            what = "n_draft" if len(xa) != len(xb) and not ne else "drafts"
            first = RoundDifference(prompt_id_a=pa_, prompt_id_b=pb_, what=what, round_a=int(ra["round"].iloc[i]),
                                    round_b=int(rb["round"].iloc[j]), pos=int(pos), step=ne[0] if ne else None,
                                    drafted_a=xa, drafted_b=xb,
                                    cause=_cause(what, differs, part_a[i] or part_b[j]),
                                    n_rounds_compared=0, n_rounds_differing=0)
    if first is not None:
        return RoundDifference(**{**first.__dict__, "n_rounds_compared": n_cmp, "n_rounds_differing": n_diff,
                                  "output_diverged_at": div})
    what = "output" if div is not None else ("output_length" if len(out_a) != len(out_b) else "none")
    cause, ok = _cause(what, differs), None
    if cause == "eog":
        ok = _eog_check(out_a, out_b, ca, cb)
        cause = None if ok is False else cause
        ok = None if ok is False else ok
    return RoundDifference(prompt_id_a=pa_, prompt_id_b=pb_, what=what, round_a=None, round_b=None, pos=None,
                           step=None, drafted_a=(), drafted_b=(), cause=cause,
                           n_rounds_compared=n_cmp, n_rounds_differing=0, output_diverged_at=div, confirmed=ok)


def runtime_diff(rounds_a: pd.DataFrame, rounds_b: pd.DataFrame, pairs: Sequence[tuple[int, int]], *,
                 manifest_a: Mapping[str, Any], manifest_b: Mapping[str, Any],
                 outputs_a: Mapping[int, Sequence[int]] | None = None,
                 outputs_b: Mapping[int, Sequence[int]] | None = None) -> RuntimeDiff:
    """Round-by-round first differences of two traces (module docstring).

    Args:
        rounds_a / rounds_b: rounds with ``prompt_id``, ``round``, ``pos``, ``pending_token``, ``drafted`` and,
            for the ``kv_visibility`` cause, ``n_accepted``.
        pairs: ``(prompt_id_a, prompt_id_b)`` pairs (:func:`traces.analysis.align.pair_prompts`).
        manifest_a / manifest_b: the manifests (their conventions).
        outputs_a / outputs_b: ``{prompt_id: generated ids}`` (:attr:`traces.analysis.positions.Positions.sequences`;
            ``output`` / ``output_length`` differences), optional.
    """
    ca, cb = runtime_convention(manifest_a), runtime_convention(manifest_b)
    differs = tuple(sorted(k for k in CONVENTION_KEYS if ca is not None and cb is not None
                           and ca.value(k) is not None and cb.value(k) is not None
                           and _norm(k, ca.value(k), ca) != _norm(k, cb.value(k), cb)))
    # cast: the group keys of the integer column prompt_id are ints (pandas-stubs types them as any scalar)
    ga = {int(cast(int, p)): f.sort_values("round") for p, f in rounds_a.groupby("prompt_id", sort=False)}
    gb = {int(cast(int, p)): f.sort_values("round") for p, f in rounds_b.groupby("prompt_id", sort=False)}
    # a recording parameter that changes what a round drafts: a round with fewer drafts is then no convention's doing
    nd_a, nd_b = ((m.get("params") or {}).get("n_draft") for m in (manifest_a, manifest_b))
    causes = (*differs, "n_draft") if nd_a is not None and nd_b is not None and nd_a != nd_b else differs
    out = []
    for pa_, pb_ in pairs:
        if pa_ not in ga or pb_ not in gb:
            continue
        out.append(_prompt(ga[pa_], gb[pb_], pa_, pb_, causes, (outputs_a or {}).get(pa_, ()),
                           (outputs_b or {}).get(pb_, ()), ca, cb))
    return RuntimeDiff(convention_a=ca, convention_b=cb, differs=differs, prompts=tuple(out),
                       causes=_count_causes(out), n_rounds_compared=sum(d.n_rounds_compared for d in out),
                       n_rounds_differing=sum(d.n_rounds_differing for d in out))


def confirm_head(diff: RuntimeDiff, steps_a: pd.DataFrame | None, steps_b: pd.DataFrame | None) -> RuntimeDiff:
    """``diff`` with ``confirmed`` set on each first difference whose cause is ``head``: the trace whose
    convention drafts with the dense head and whose steps carry ``centroid_token`` (the sparse head scored on
    the same step) is looked up at that round and step; confirmed when that token is the other trace's draft.

    Args:
        steps_a / steps_b: steps with ``prompt_id``, ``round``, ``k``, ``centroid_token`` (None: not read).
    """
    ca, cb = diff.convention_a, diff.convention_b
    if ca is not None and ca.head == "dense" and steps_a is not None:
        side, steps = "a", steps_a
    elif cb is not None and cb.head == "dense" and steps_b is not None:
        side, steps = "b", steps_b
    else:
        return diff
    out = []
    for d in diff.prompts:
        if d.cause == "head" and d.step is not None:
            pid, rnd, other = ((d.prompt_id_a, d.round_a, d.drafted_b) if side == "a"
                               else (d.prompt_id_b, d.round_b, d.drafted_a))
            row = steps[(steps["prompt_id"] == pid) & (steps["round"] == rnd) & (steps["k"] == d.step)]
            ct = row["centroid_token"].iloc[0] if len(row) else None
            ok = None if ct is None or pd.isna(ct) or d.step > len(other) else int(ct) == other[d.step - 1]
            d = RoundDifference(**{**d.__dict__, "confirmed": ok})
        out.append(d)
    return RuntimeDiff(**{**diff.__dict__, "prompts": tuple(out)})


#: causes checked by replaying the step: cause -> (the convention key varied, the one held fixed where no other
#: replayed key differs)
REPLAYED_CAUSES: dict[str, tuple[str, str]] = {"draft_position": ("draft_position", "head"),
                                               "head": ("head", "draft_position"),
                                               "kv_visibility": ("kv_visibility", "head")}
#: a named cause's alternatives, replayed too: when the replay does not confirm the named cause but confirms one of
#: these (both conventions differ at that step), the alternative is the cause
ALTERNATIVES: dict[str, tuple[str, ...]] = {"kv_visibility": ("head",)}


def replay_values(key: str, c: Convention) -> str | None:
    """The value of ``key`` a replay sets for this convention: ``draft_position`` / ``head`` as stated,
    ``kv_visibility`` by its runtime word (``"llama.cpp"`` / ``"hf"``, :func:`_norm`)."""
    v = c.value(key)
    if v is None:
        return None
    return str(_norm(key, v, c)) if key == "kv_visibility" else v


def replay_plan(d: RoundDifference, convention_a: Convention | None, convention_b: Convention | None,
                cause: str | None = None, differs: Sequence[str] = ()) -> tuple[str, str, str, tuple[str, ...]] | None:
    """What replaying ``d``'s step must run to check a cause (``cause``, default ``d.cause``): ``(key, value_a,
    value_b, held)`` -- the varied convention key (:data:`REPLAYED_CAUSES`), its value in A and in B, and the
    values of the held key to try in order, each as ``"name=value"`` (A's, then B's where it differs). The held
    key is another replayed key among ``differs`` (the conventions that differ), else the cause's default. None:
    nothing to replay (no replayed cause, no draft step, a convention value missing)."""
    cause = d.cause if cause is None else cause
    if cause not in REPLAYED_CAUSES or d.step is None or convention_a is None or convention_b is None:
        return None
    key, held_key = REPLAYED_CAUSES[cause]
    held_key = next((k for k in REPLAYED_CAUSES if k != key and k in differs), held_key)
    va, vb = replay_values(key, convention_a), replay_values(key, convention_b)
    holds = tuple(dict.fromkeys(f"{held_key}={v}" for v in (replay_values(held_key, c)
                                                             for c in (convention_a, convention_b)) if v is not None))
    if va is None or vb is None or not holds:
        return None
    return key, va, vb, holds


def replay_plans(d: RoundDifference, diff: RuntimeDiff) -> dict[str, tuple[str, str, str, tuple[str, ...]]]:
    """``{cause: plan}`` for ``d``'s named cause and its :data:`ALTERNATIVES` that differ (:func:`replay_plan`)."""
    out = {}
    for cause in (d.cause, *ALTERNATIVES.get(d.cause or "", ())):
        if cause is not None and (cause == d.cause or cause in diff.differs):
            plan = replay_plan(d, diff.convention_a, diff.convention_b, cause, diff.differs)
            if plan is not None:
                out[cause] = plan
    return out


def replay_verdict(replayed: Sequence[ReplayedDraft], value_a: str, value_b: str, key: str | None = None) -> bool | None:
    """Whether the replays (of ``key``, all of them when None) confirm the cause: for some held value, the replay
    under A's value drafted A's token and the one under B's value B's token. None without replays."""
    replayed = [r for r in replayed if key is None or r.key == key]
    if not replayed:
        return None
    by = {(r.held, r.value): r.reproduces for r in replayed}
    return any(by.get((h, value_a)) == "a" and by.get((h, value_b)) == "b" for h in {r.held for r in replayed})


def with_replays(diff: RuntimeDiff, replays: Mapping[int, tuple[tuple[ReplayedDraft, ...], str | None]]) -> RuntimeDiff:
    """``diff`` with the replays of its first differences filled in (``traces.run.runtime_replay``).

    Args:
        replays: ``{index into diff.prompts: (replayed drafts, note)}``; ``confirmed`` is set from the drafts by
            :func:`replay_verdict` with the values of :func:`replay_plans` (left as it was without replayed drafts).
            Where the named cause is not confirmed and an alternative (:data:`ALTERNATIVES`) is, the alternative
            becomes the cause, confirmed; ``causes`` is counted again.
    """
    out = []
    for i, d in enumerate(diff.prompts):
        if i in replays:
            rep, note = replays[i]
            verdicts = {c: replay_verdict(rep, p[1], p[2], p[0]) for c, p in replay_plans(d, diff).items()}
            ok, cause = verdicts.get(d.cause or ""), d.cause
            if ok is False:
                cause = next((c for c, v in verdicts.items() if v), cause)
                ok = True if cause != d.cause else ok
            d = RoundDifference(**{**d.__dict__, "cause": cause, "replayed": tuple(rep), "replay_note": note,
                                   "confirmed": d.confirmed if ok is None else ok})
        out.append(d)
    return RuntimeDiff(**{**diff.__dict__, "prompts": tuple(out), "causes": _count_causes(out)})


def _count_causes(prompts: Sequence[RoundDifference]) -> dict[str, int]:
    """``{cause or "unexplained": prompts whose first difference it names}`` (those that differ), sorted."""
    causes: dict[str, int] = {}
    for d in prompts:
        if d.what != "none":
            name = d.cause or "unexplained"
            causes[name] = causes.get(name, 0) + 1
    return dict(sorted(causes.items()))


def confirmed_counts(diff: RuntimeDiff) -> dict[str, tuple[int, int]]:
    """``{cause: (confirmed, not confirmed)}`` over the first differences that were checked."""
    out: dict[str, tuple[int, int]] = {}
    for d in diff.prompts:
        if d.cause is not None and d.confirmed is not None:
            y, n = out.get(d.cause, (0, 0))
            out[d.cause] = (y + 1, n) if d.confirmed else (y, n + 1)
    return dict(sorted(out.items()))


def _norm(key: str, v: Any, conv: Convention | None = None) -> Any:
    """A convention value compared by its kind: the last-round rule by its first words (``min(...)`` with or
    without ``- 1``); the EOG policy as (stops or not, the stop ids where ``conv`` lists them,
    :meth:`Convention.eog_stop_ids`, else ``"unlisted"``: llama.cpp's vocabulary EOG ids, which a listed set is
    not taken to equal); the KV visibility by the runtime word before its first ``:`` (``"llama.cpp"``,
    ``"hf"``); the rest as given."""
    s = str(v)
    if key == "last_round":
        return "remaining - 1" in s or "emitted - 1" in s
    if key == "eog":
        stops = s.startswith("stop")
        ids = conv.eog_stop_ids() if conv is not None and stops else None
        return (stops, tuple(sorted(ids)) if ids is not None else ("unlisted" if stops else None))
    if key == "kv_visibility":
        return s.split(":", 1)[0].strip()
    return s


__all__ = ["ALTERNATIVES", "CAUSES", "CONVENTION_KEYS", "Convention", "LLAMA_CPP_CONVENTION", "REPLAYED_CAUSES", "ReplayedDraft", "RoundDifference",
           "RuntimeDiff", "confirm_head", "confirmed_counts", "replay_plan", "replay_verdict", "replay_plans", "replay_values",
           "runtime_convention", "runtime_diff", "with_replays"]
