"""Aligned diff of two traces of the same prompts (two builds, two drafter quantizations, fork vs
upstream). Pure (numpy / pandas); one job.

**Pairing prompts.** Prompts pair by their ``id`` (prompts files, §6 of docs/EXPLAIN.md) when both traces
carry ids and some match, else by their text, else by their token ids (prompts given as ids), else by
``prompt_id``; a name given to several prompts pairs them in order (the first with the first). Unpaired
prompts are listed, not compared. When both traces name every prompt (ids, texts or token ids) and no name
matches, nothing is paired (two different prompt sets are never paired by ``prompt_id``).

**Aligning rounds.** Rounds are aligned by *output position* (:mod:`traces.analysis.positions`): with greedy
decoding the target's output does not depend on the drafter, so the two generated sequences of a
prompt are identical when the target (and its build) is the same. Where they differ the comparison stops
at the first differing position (``diverged_at``) and the result says so: later positions describe
different text.

**Per output position** each run says how the token got there: an ``accepted`` draft, the target's
correction of a ``rejected`` draft, or a ``bonus`` token (no draft covered it). ``a_only`` lists
positions accepted in A and rejected in B, ``b_only`` the reverse; by token class (when classes are
given) and by draft position (the draft position of the run that *rejected* it: B's for ``a_only``,
A's for ``b_only``). ``first_difference`` is, per prompt, the first position whose status differs.

**Acceptance delta** per category (and ``all``): ``rate_B - rate_A`` with ``rate`` = accepted / drafted
over the category's paired prompts, each trace's own rounds; a percentile bootstrap over prompts (paired:
the same resampled prompts for A and B; ``n_boot`` resamples, seeded) gives the 95 % interval.

**Not comparable** (``AlignedDiff.not_comparable``, the reason): two runs of different targets
(:func:`target_difference`: the manifests' target width or architecture differ) or whose outputs differ
from the first token of every paired prompt generate different text, so no output position is compared
and no delta is given: ``delta["all"]`` keeps each run's own rate, its ``delta`` and interval None.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pandas as pd

from mtpscope.traces.analysis.positions import Positions
from mtpscope.traces.analysis.records import JsonRecord
from mtpscope.traces.analysis.runtime_diff import RuntimeDiff

N_BOOT = 2000


@dataclass(frozen=True)
class PromptPairing:
    """Which prompt of A goes with which of B.

    Attributes:
        pairs: ``((prompt_id_a, prompt_id_b), ...)`` in A's order.
        by: ``"id"``, ``"text"``, ``"tokens"`` or ``"prompt_id"``.
        unpaired_a / unpaired_b: prompt ids left over.
    """

    pairs: tuple[tuple[int, int], ...]
    by: str
    unpaired_a: tuple[int, ...] = ()
    unpaired_b: tuple[int, ...] = ()


def pair_prompts(manifest_a: Mapping[str, Any], manifest_b: Mapping[str, Any],
                 ids_a: Sequence[int] = (), ids_b: Sequence[int] = ()) -> PromptPairing:
    """Pair prompts (module docstring). ``ids_a`` / ``ids_b``: prompt ids present in each trace's rounds
    (added when the manifest lists fewer)."""
    def entries(m: Mapping[str, Any], extra: Sequence[int]) -> dict[int, dict[str, Any]]:
        out = {}
        for i, p in enumerate(m.get("prompts") or []):
            if isinstance(p, dict):
                out[int(p.get("prompt_id", i))] = p
        for i in extra:
            out.setdefault(int(i), {})
        return out

    def nth(names: Mapping[int, Any]) -> dict[int, tuple[Any, int]]:
        """Each prompt's name with its occurrence (a prompt given twice: the first with the first, in order)."""
        seen: dict[Any, int] = {}
        out = {}
        for pid, v in sorted(names.items()):
            out[pid] = (v, seen.get(v, 0))
            seen[v] = seen.get(v, 0) + 1
        return out

    def name(p: Mapping[str, Any], key: str) -> Any:
        """A prompt's ``id`` / ``text`` (a non-empty string) or its ``tokens`` (a non-empty tuple of ints), else
        None."""
        v = p.get(key)
        if key == "tokens":
            if isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                return tuple(v)
            return None
        return v if isinstance(v, str) and v else None

    ea, eb = entries(manifest_a, ids_a), entries(manifest_b, ids_b)
    carried = None  # the first key both traces carry for every prompt
    for by, key in (("id", "id"), ("text", "text"), ("tokens", "tokens")):
        ka = {pid: name(p, key) for pid, p in ea.items()}
        kb = {pid: name(p, key) for pid, p in eb.items()}
        if all(v is not None for v in ka.values()) and all(v is not None for v in kb.values()) and ka and kb:
            carried = carried or by
            inv = {v: pid for pid, v in nth(kb).items()}
            pairs = tuple((pa_, inv[v]) for pa_, v in nth(ka).items() if v in inv)
            if pairs:
                used_b = {b for _, b in pairs}
                return PromptPairing(pairs, by, tuple(p for p in sorted(ea) if p not in dict(pairs)),
                                     tuple(p for p in sorted(eb) if p not in used_b))
    if carried is not None:  # both name their prompts and no name matches: different prompts, pair none
        return PromptPairing((), carried, tuple(sorted(ea)), tuple(sorted(eb)))
    common = sorted(set(ea) & set(eb))
    return PromptPairing(tuple((p, p) for p in common), "prompt_id",
                         tuple(p for p in sorted(ea) if p not in common), tuple(p for p in sorted(eb) if p not in common))


def pairing_caveat(pairing: PromptPairing) -> str | None:
    """The caveat of prompts paired by their numbers only (:func:`pair_prompts`' last resort: neither id, text nor
    tokens names every prompt in both traces, as with an imported log), for ``compare``'s text and the app's Compare
    page; None for any other pairing, or when nothing was paired."""
    if pairing.by != "prompt_id" or not pairing.pairs:
        return None
    return ("neither id, text nor tokens names every prompt in both traces (an imported log names none): the prompts "
            "are paired by their numbers only, which may pair different prompts")


def target_difference(manifest_a: Mapping[str, Any], manifest_b: Mapping[str, Any]) -> str | None:
    """How the two runs' targets differ, in words, when their manifests say so: the target's hidden width
    (``dims.n_embd_backbone``, which the drafter reads) or its architecture (``models.target.architecture``);
    None when both agree or either is unknown (an import). The same target in another file (a quantization,
    a Hugging Face checkpoint of it) has the same of both: compared as usual."""
    def get(m: Mapping[str, Any], *keys: str) -> Any:
        v: Any = m
        for k in keys:
            v = v.get(k) if isinstance(v, Mapping) else None
        return v

    out = []
    for what, keys in (("hidden width", ("dims", "n_embd_backbone")), ("architecture", ("models", "target", "architecture"))):
        a, b = get(manifest_a, *keys), get(manifest_b, *keys)
        if isinstance(a, (int, str)) and isinstance(b, (int, str)) and a != b:
            out.append(f"{what} ({'.'.join(keys)}) A {a}, B {b}")
    return f"different targets: {'; '.join(out)}" if out else None


@dataclass(frozen=True)
class OneSided(JsonRecord):
    """The output positions accepted in one run and rejected in the other (``a_only`` or ``b_only``).

    Attributes:
        n: how many output positions.
        by_class: ``{token class: positions}`` (sorted by class).
        by_position: ``{draft position k as text: positions}`` (k of the run that rejected them, ascending).
        n_eog_confirmed: of ``n``, the rejecting run's end-of-generation drafts the target chose too
            (:class:`~traces.analysis.positions.Positions`: not accepted as llama.cpp counts, not a miss of its
            drafter: ``explain``'s ``after_eog``).
    """

    n: int
    by_class: dict[str, int]
    by_position: dict[str, int]
    n_eog_confirmed: int = 0


@dataclass(frozen=True)
class PromptComparison(JsonRecord):
    """One pair of prompts compared position by position.

    Attributes:
        prompt_id_a / prompt_id_b: the prompt in A and in B.
        n_compared: output positions compared (0 when a prompt has no emitted tokens).
        identical_output: the two outputs are the same (None: unknown, no emitted tokens).
        diverged_at: the first output position where the two texts differ (None when they do not).
        first_difference: the first compared output position whose status differs (None when none does).
    """

    prompt_id_a: int
    prompt_id_b: int
    n_compared: int
    identical_output: bool | None
    diverged_at: int | None
    first_difference: int | None


@dataclass(frozen=True)
class RateDelta(JsonRecord):
    """``rate_b - rate_a`` over paired prompts and its percentile bootstrap interval (:func:`rate_delta`).

    Attributes:
        n_prompts: paired prompts counted.
        rate_a / rate_b: acceptance rate (accepted / drafted, 0..1) of A and B; None when nothing was drafted.
        delta: ``rate_b - rate_a`` (rate points, -1..1); None when a rate is.
        ci_low / ci_high: the bootstrap interval of ``delta``; None with fewer than 2 prompts.
        level: the interval's coverage (0.95).
        n_boot: bootstrap resamples.
    """

    n_prompts: int
    rate_a: float | None
    rate_b: float | None
    delta: float | None
    ci_low: float | None
    ci_high: float | None
    level: float
    n_boot: int


@dataclass(frozen=True)
class AlignedDiff:
    """The aligned diff (module docstring).

    Attributes:
        pairing: the :class:`PromptPairing`.
        positions: DataFrame, one row per compared output position: ``prompt_id_a``, ``prompt_id_b``,
            ``g``, ``token``, ``status_a``, ``status_b``, ``k_a``, ``k_b`` (0 for bonus), ``cls`` (token class or
            ``unknown``).
        status_counts: ``{"accepted/rejected": n, ...}`` over (status_a, status_b) pairs.
        a_only / b_only: :class:`OneSided`.
        prompts: per pair a :class:`PromptComparison`.
        outputs_identical: every pair's outputs are identical over their common length and of equal length; None
            when none is known to differ but some pair's output is unknown (no emitted tokens: imports), never
            False for outputs nobody saw.
        delta: ``{category: RateDelta}`` (``all`` included).
        runtimes: the round-by-round first differences and their named causes
            (:func:`traces.analysis.runtime_diff.runtime_diff`), or None when not computed.
        not_comparable: why the two runs cannot be compared position by position (module docstring), or None;
            then ``positions`` is empty, ``a_only`` / ``b_only`` count nothing and ``delta`` holds only ``all``
            with each run's own rate and no delta.
    """

    pairing: PromptPairing
    positions: pd.DataFrame
    status_counts: dict[str, int]
    a_only: OneSided
    b_only: OneSided
    prompts: tuple[PromptComparison, ...]
    outputs_identical: bool | None
    delta: dict[str, RateDelta] = field(default_factory=dict)
    runtimes: RuntimeDiff | None = None
    not_comparable: str | None = None

    def to_dict(self, max_positions: int = 0) -> dict[str, Any]:
        """JSON-able dict; ``max_positions`` rows of ``positions`` (0: none) under ``positions``."""
        d: dict[str, Any] = {"paired_by": self.pairing.by, "n_pairs": len(self.pairing.pairs),
                             "unpaired_a": list(self.pairing.unpaired_a), "unpaired_b": list(self.pairing.unpaired_b),
                             "outputs_identical": self.outputs_identical, "status_counts": self.status_counts,
                             "a_only": self.a_only.to_dict(), "b_only": self.b_only.to_dict(),
                             "prompts": [p.to_dict() for p in self.prompts],
                             "not_comparable": self.not_comparable,
                             "delta": {k: v.to_dict() for k, v in self.delta.items()}}
        if self.runtimes is not None:
            d["runtimes"] = self.runtimes.to_dict()
        if max_positions:
            d["positions"] = self.positions.head(max_positions).to_dict(orient="records")
        return d


def _summary(rows: pd.DataFrame, k_col: str, eog_col: str) -> OneSided:
    by_cls = rows["cls"].value_counts().sort_index()
    by_k = rows[k_col].value_counts().sort_index()
    return OneSided(n=int(len(rows)), by_class={str(c): int(v) for c, v in by_cls.items()},
                    by_position={str(int(k)): int(v) for k, v in zip(by_k.index.tolist(), by_k.tolist(), strict=True)},
                    n_eog_confirmed=int(rows[eog_col].astype(bool).sum()) if len(rows) else 0)


def rate_delta(drafted_a: np.ndarray, accepted_a: np.ndarray, drafted_b: np.ndarray, accepted_b: np.ndarray,
               *, n_boot: int = N_BOOT, seed: int = 0, level: float = 0.95) -> RateDelta:
    """``rate_b - rate_a`` over paired prompts (per-prompt counts, ``shape (n_prompts,)`` each) and its
    percentile bootstrap interval (prompts resampled with replacement, the same indices for A and B).

    Returns:
        The :class:`RateDelta`; rates None when nothing was drafted, interval None with fewer than 2 prompts.
    """
    da, aa, db, ab = (np.asarray(x, dtype=np.float64) for x in (drafted_a, accepted_a, drafted_b, accepted_b))
    n = len(da)
    ra = aa.sum() / da.sum() if da.sum() else None
    rb = ab.sum() / db.sum() if db.sum() else None
    delta = None if ra is None or rb is None else rb - ra
    ci_low = ci_high = None
    if n >= 2 and delta is not None:
        rng = np.random.default_rng(seed)
        idx = rng.integers(0, n, size=(int(n_boot), n))
        sda, saa, sdb, sab = da[idx].sum(1), aa[idx].sum(1), db[idx].sum(1), ab[idx].sum(1)
        ok = (sda > 0) & (sdb > 0)
        d = sab[ok] / sdb[ok] - saa[ok] / sda[ok]
        if len(d):
            lo, hi = np.quantile(d, [(1 - level) / 2, 1 - (1 - level) / 2])
            ci_low, ci_high = float(lo), float(hi)
    return RateDelta(n_prompts=int(n), rate_a=ra, rate_b=rb, delta=delta, ci_low=ci_low, ci_high=ci_high,
                     level=level, n_boot=int(n_boot))


def bootstrap_delta(drafted_a: np.ndarray, accepted_a: np.ndarray, drafted_b: np.ndarray, accepted_b: np.ndarray,
                    *, n_boot: int = N_BOOT, seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    """:func:`rate_delta` as its JSON dict: ``{"n_prompts", "rate_a", "rate_b", "delta", "ci_low", "ci_high",
    "level", "n_boot"}`` (what ``mtpscope diagnose`` keeps in its numbers)."""
    return rate_delta(drafted_a, accepted_a, drafted_b, accepted_b, n_boot=n_boot, seed=seed, level=level).to_dict()


def _per_prompt_counts(rounds: pd.DataFrame) -> dict[int, tuple[int, int]]:
    g = pd.DataFrame({"p": rounds["prompt_id"].to_numpy(dtype=np.int64),
                      "d": rounds["n_draft"].to_numpy(dtype=np.int64),
                      "a": rounds["n_accepted"].to_numpy(dtype=np.int64)}).groupby("p").sum()
    return {int(p): (int(d), int(a)) for p, d, a in zip(g.index.tolist(), g["d"].tolist(), g["a"].tolist(), strict=True)}


def aligned_diff(rounds_a: pd.DataFrame, pos_a: Positions, rounds_b: pd.DataFrame, pos_b: Positions,
                 pairing: PromptPairing, *, classes_a: Mapping[int, np.ndarray] | None = None,
                 categories: Mapping[int, str] | None = None, n_boot: int = N_BOOT, seed: int = 0,
                 targets_differ: str | None = None) -> AlignedDiff:
    """The aligned diff of two traces.

    Args:
        rounds_a / rounds_b: rounds (``prompt_id``, ``n_draft``, ``n_accepted``) of A and B.
        pos_a / pos_b: :func:`traces.analysis.positions.positions` of each.
        pairing: :func:`pair_prompts`.
        classes_a: ``{prompt_id_a: class names per output position}`` (e.g. from
            :func:`traces.analysis.breakdown.classify_outputs` on A), optional.
        categories: ``{prompt_id_a: category}`` (A's manifest), optional.
        n_boot, seed: bootstrap resamples and seed.
        targets_differ: how the runs' targets differ (:func:`target_difference`), None when they do not: the
            runs are then not comparable (module docstring).
    """
    # cast: the group keys of the integer column prompt_id are ints (pandas-stubs types them as any scalar)
    ga = {int(cast(int, p)): f for p, f in pos_a.emitted.groupby("prompt_id", sort=False)}
    gb = {int(cast(int, p)): f for p, f in pos_b.emitted.groupby("prompt_id", sort=False)}
    empty = pos_a.emitted.iloc[:0]
    frames = []
    prompts: list[PromptComparison] = []
    identical = True
    unknown = False           # a pair whose output is not in either trace
    for pa_, pb_ in pairing.pairs:
        sa, sb = pos_a.sequences.get(pa_), pos_b.sequences.get(pb_)
        if sa is None or sb is None:
            prompts.append(PromptComparison(prompt_id_a=pa_, prompt_id_b=pb_, n_compared=0, identical_output=None,
                                            diverged_at=None, first_difference=None))
            unknown = True
            continue
        n = min(len(sa), len(sb))
        neq = np.flatnonzero(sa[:n] != sb[:n])
        div = int(neq[0]) if len(neq) else (n if len(sa) != len(sb) else None)
        same = div is None
        identical &= same
        upto = div if div is not None else n
        xa, xb = ga.get(pa_, empty), gb.get(pb_, empty)
        xa = xa.loc[xa["g"].to_numpy() < upto, ["g", "token", "status", "k", "eog_confirmed"]]
        xb = xb.loc[xb["g"].to_numpy() < upto, ["g", "status", "k", "eog_confirmed"]]
        j = xa.merge(xb, on="g", how="inner", suffixes=("_a", "_b"), sort=True)
        j.insert(0, "prompt_id_b", pb_)
        j.insert(0, "prompt_id_a", pa_)
        cls = classes_a.get(pa_) if classes_a else None
        gg = j["g"].to_numpy(dtype=np.int64)
        if cls is not None:
            cl = np.asarray(cls, dtype=object)
            j["cls"] = np.where(gg < len(cl), cl[np.minimum(gg, max(len(cl) - 1, 0))], "unknown") if len(cl) else "unknown"
        else:
            j["cls"] = "unknown"
        frames.append(j)
        differs = np.flatnonzero(j["status_a"].to_numpy() != j["status_b"].to_numpy())
        prompts.append(PromptComparison(prompt_id_a=pa_, prompt_id_b=pb_, n_compared=int(len(j)), identical_output=same,
                                        diverged_at=div,
                                        first_difference=int(gg[differs[0]]) if len(differs) else None))
    known = [p for p in prompts if p.identical_output is not None]
    why = targets_differ or ("every paired prompt's output differs from its first token on (different text)"
                             if known and all(p.diverged_at == 0 for p in known) else None)
    cols = ["prompt_id_a", "prompt_id_b", "g", "token", "status_a", "k_a", "status_b", "k_b", "cls", "eog_confirmed_a",
            "eog_confirmed_b"]
    if why is not None:      # the positions "before the divergence" of different targets are not the same text
        frames = []
        prompts = [dataclasses.replace(p, n_compared=0, first_difference=None) for p in prompts]
    allpos = pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)
    sc = allpos.groupby(["status_a", "status_b"]).size() if len(allpos) else pd.Series(dtype=int)
    status_counts = {f"{a}/{b}": int(v) for (a, b), v in zip(sc.index.tolist(), sc.tolist(), strict=True)}
    a_only = allpos[(allpos["status_a"] == "accepted") & (allpos["status_b"] == "rejected")]
    b_only = allpos[(allpos["status_a"] == "rejected") & (allpos["status_b"] == "accepted")]
    # acceptance delta per category, bootstrap over the paired prompts
    ca, cb = _per_prompt_counts(rounds_a), _per_prompt_counts(rounds_b)
    pairs = [(a, b) for a, b in pairing.pairs if a in ca and b in cb]
    cat = np.asarray([(categories or {}).get(a, "all") if categories else "all" for a, _ in pairs], dtype=object)
    arr = np.asarray([(*ca[a], *cb[b]) for a, b in pairs], dtype=np.float64).reshape(-1, 4)
    delta = {"all": rate_delta(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3], n_boot=n_boot, seed=seed)}
    if why is not None:      # each run's own rate, never a paired delta
        delta = {"all": dataclasses.replace(delta["all"], delta=None, ci_low=None, ci_high=None)}
    elif categories:
        for name in sorted(set(cat.tolist())):
            m = cat == name
            delta[name] = rate_delta(arr[m, 0], arr[m, 1], arr[m, 2], arr[m, 3], n_boot=n_boot, seed=seed)
    return AlignedDiff(pairing=pairing, positions=allpos, status_counts=status_counts,
                       a_only=_summary(a_only, "k_b", "eog_confirmed_b"), b_only=_summary(b_only, "k_a", "eog_confirmed_a"),
                       prompts=tuple(prompts),
                       outputs_identical=(False if not identical or pairing.unpaired_a or pairing.unpaired_b
                                          else None if unknown else True),
                       delta=delta, not_comparable=why)
