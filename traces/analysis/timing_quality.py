"""Were these timings taken under one load? The disturbance detector behind ``timing_quality`` (explain /
report JSON and text, the app's advice): pure, one job.

Speed advice from one recording holds only when the machine ran at one speed throughout: the loop's rounds,
the recorder's cost probe (after the loop) and the plain-decoding baseline (``record --baseline``) are
compared with each other, and each with itself across time. A check **disturbs** the timings when two
medians of the same thing differ by more than ``LOAD_FACTOR`` (1.5×: a second process sharing a 2-core
machine slows llama.cpp by about 2×; quiet re-recordings of the development pairs stayed within 1.2×):

* ``drift``: a round size (a verify of ``n`` tokens, a round's ``k`` drafter steps) with at least
  ``2 * MIN_SIZE_ROUNDS`` rounds, its rounds in recording order (prompt, then round) cut into up to
  ``WINDOWS`` consecutive windows of at least ``MIN_SIZE_ROUNDS`` rounds: max / min of the windows' medians;
* ``probe_level``: the probe's scale to the trace (``CostModel.verify_scale`` / ``draft_scale``: the trace's
  medians over the probe's, over the sizes both timed): outside ``[1 / LOAD_FACTOR, LOAD_FACTOR]``;
* ``probe_spread``: a probed size whose repetitions differ by more than the factor (max / min); it
  disturbs only when the probe has at most 2 repetitions there (a median of 3 or more absorbs one spike);
* ``baseline_level``: the measured plain decoding's ms per token against the one-token verify as priced
  (the trace's own median or the scaled probe; not checked when it comes from a line): outside
  ``[1 / BASELINE_FACTOR, BASELINE_FACTOR]`` (1.25×, tighter than the others: plain decoding is the reference of
  every speedup, so a gap of g moves every speedup by g -- benchmarks/bench_advice_noise.py's plain decoding
  timed under a second process came out 1.40× the loop's one-token verify and, unflagged, made "n_draft 1 at
  1.30× [1.06, 1.52]" of a pair that ran 0.75× on an interleaved sweep; quiet recordings of the trained demo
  pair gave 0.87-1.13 and a sweep's plain decoding 0.89 of its one-token verifies: the same work, a target
  decode of one token);
* ``baseline_drift``: the baseline's per-prompt ms per token in prompt order, windows of at least 2
  prompts: max / min of the windows' medians;
* ``spikes`` (never disturbs, only reported): rounds over ``SPIKE_FACTOR`` × their size's median, which the
  medians already ignore.

Medians everywhere: the check must not fire on the few spikes the pricing already ignores.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from mtpscope.traces.analysis.costs import MIN_SIZE_ROUNDS, CostModel, CostProbe, PlainBaseline

#: two medians of the same thing further apart than this: the load changed
LOAD_FACTOR = 1.5
#: at most this many time windows per round size
WINDOWS = 4
#: a round over this many times its size's median is a spike (reported, not a disturbance)
SPIKE_FACTOR = 3.0
#: the measured baseline against the loop's one-token verify further apart than this: plain decoding ran under
#: another load (module docstring: tighter than LOAD_FACTOR, the baseline scales every speedup)
BASELINE_FACTOR = 1.25


@dataclass(frozen=True)
class TimingEvidence:
    """One check's finding.

    Attributes:
        kind: ``drift``, ``probe_level``, ``probe_spread``, ``baseline_level``, ``baseline_drift``, ``spikes``.
        subject: what was compared (``verify of 2 tokens``, ``probe``, ``baseline``, ...).
        ratio: the ratio compared with the factor (max / min, or the level ratio; for spikes their share).
        disturbing: whether it makes the timings unusable for advice.
        words: one sentence with the numbers.
    """

    kind: str
    subject: str
    ratio: float
    disturbing: bool
    words: str


@dataclass(frozen=True)
class TimingQuality:
    """The detector's verdict on one recording (module docstring).

    Attributes:
        disturbed: some check disturbs (the advice then says "cannot tell from these timings").
        factor: ``LOAD_FACTOR``. checked: the checks that could run.
        evidence: every finding (disturbing or not). words: one line for the terminal.
    """

    disturbed: bool
    factor: float
    checked: tuple[str, ...]
    evidence: tuple[TimingEvidence, ...]
    words: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: the fields, ``evidence`` as a list of dicts."""
        d = asdict(self)
        d["checked"] = list(self.checked)
        d["evidence"] = [asdict(e) for e in self.evidence]
        return d


def window_medians(x: np.ndarray, min_per: int, windows: int = WINDOWS) -> np.ndarray:
    """Medians of ``x`` (``float[r]``, in time order) cut into ``min(windows, r // min_per)`` consecutive
    windows of (nearly) equal size; empty when fewer than two windows fit."""
    n = min(windows, len(x) // max(min_per, 1))
    if n < 2:
        return np.zeros(0)
    return np.array([float(np.median(p)) for p in np.array_split(np.asarray(x, np.float64), n)])


def _size_series(rounds: pd.DataFrame) -> dict[str, np.ndarray]:
    """``{"verify of n tokens" | "k drafter steps": ms in recording order}`` (rounds with both times)."""
    r = rounds
    if "round" in r.columns and "prompt_id" in r.columns:
        r = r.sort_values(["prompt_id", "round"], kind="stable")
    nd = r["n_draft"].to_numpy(dtype=np.int64)
    td = pd.to_numeric(r["t_draft_ms"], errors="coerce").to_numpy(dtype=np.float64)
    tv = pd.to_numeric(r["t_verify_ms"], errors="coerce").to_numpy(dtype=np.float64)
    ok = np.isfinite(td) & np.isfinite(tv)
    out = {}
    for k in np.unique(nd[ok]):
        m = ok & (nd == k)
        out[f"verify of {k + 1} token{'s' if k else ''}"] = tv[m]
        if k > 0:
            out[f"{k} drafter step{'s' if k > 1 else ''}"] = td[m]
    return out


def timing_quality(rounds: pd.DataFrame, cost: CostModel | None, baseline: PlainBaseline | None = None,
                   probe: CostProbe | None = None, *, factor: float = LOAD_FACTOR,
                   baseline_factor: float = BASELINE_FACTOR) -> TimingQuality | None:
    """The checks of the module docstring on a trace's rounds (``prompt_id``, ``round``, ``n_draft``,
    ``t_draft_ms``, ``t_verify_ms``), its cost model (:func:`traces.analysis.costs.fit_cost`), its measured
    baseline and probe. ``factor``: every check's but ``baseline_level``'s, which is ``baseline_factor``. None
    without timings (``cost`` None)."""
    if cost is None or "t_verify_ms" not in rounds.columns or "t_draft_ms" not in rounds.columns:
        return None
    ev: list[TimingEvidence] = []
    checked = ["drift", "spikes"]
    for subject, x in _size_series(rounds).items():
        med = float(np.median(x)) if len(x) else float("nan")
        if len(x) >= MIN_SIZE_ROUNDS and med > 0:
            n_sp = int((x > SPIKE_FACTOR * med).sum())
            if n_sp:
                ev.append(TimingEvidence("spikes", subject, n_sp / len(x), False,
                                         f"{n_sp} of {len(x)} rounds of the {subject} took over {SPIKE_FACTOR:g}× their "
                                         f"median {med:.2f} ms (max {float(x.max()):.1f} ms; the medians ignore them)"))
        wm = window_medians(x, MIN_SIZE_ROUNDS) if len(x) >= 2 * MIN_SIZE_ROUNDS else np.zeros(0)
        if len(wm) >= 2 and wm.min() > 0:
            ratio = float(wm.max() / wm.min())
            if ratio > factor:
                ev.append(TimingEvidence("drift", subject, ratio, True,
                                         f"the {subject} changed speed during the recording: medians of "
                                         f"{len(wm)} consecutive windows " + ", ".join(f"{v:.2f}" for v in wm)
                                         + f" ms ({ratio:.2f}× apart, over {factor:g}×)"))
    for kind, sc in (("verify", cost.verify_scale), ("draft", cost.draft_scale)):
        if sc is None or not np.isfinite(sc) or sc <= 0:
            continue
        checked.append(f"probe_level:{kind}")
        ratio = float(max(sc, 1.0 / sc))
        if ratio > factor:
            ev.append(TimingEvidence("probe_level", f"probe ({kind})", float(sc), True,
                                     f"the cost probe's {kind} times are {sc:.2f}× the loop's own (trace / probe over "
                                     f"the sizes both timed; over {factor:g}× either way): the load changed between the "
                                     "loop and the probe"))
    pr = probe if probe is not None else cost.probe
    if pr is not None:
        checked.append("probe_spread")
        for kind, reps in (("verify of", pr.verify_reps_ms), ("drafter steps", pr.draft_reps_ms)):
            for n, rep in sorted(reps.items()):
                r = np.asarray(rep, np.float64)
                if len(r) < 2 or r.min() <= 0:
                    continue
                ratio = float(r.max() / r.min())
                if ratio > factor:
                    few = len(r) <= 2
                    what = f"verify of {n} tokens" if kind == "verify of" else f"{n} drafter steps"
                    ev.append(TimingEvidence("probe_spread", f"probe {what}", ratio, few,
                                             f"the probe's {len(r)} repetitions of the {what} differ {ratio:.2f}× "
                                             "(" + ", ".join(f"{v:.1f}" for v in r) + " ms)"
                                             + ("; two repetitions cannot tell the spike from the level" if few else
                                                "; the median absorbs it")))
    if baseline is not None and baseline.measured:
        src = cost.sizes.source("verify", 1) if cost.sizes is not None else "line"
        if src != "line":
            checked.append("baseline_level")
            v1 = cost.t_verify(1)
            ratio = baseline.t_per_token_ms / v1 if v1 > 0 else float("nan")
            if np.isfinite(ratio) and max(ratio, 1.0 / ratio) > baseline_factor:
                ev.append(TimingEvidence("baseline_level", "baseline", float(ratio), True,
                                         f"plain decoding was timed at {baseline.t_per_token_ms:.2f} ms per token, "
                                         f"{ratio:.2f}× the one-token verify of the loop ({v1:.2f} ms, "
                                         f"{'its own rounds' if src == 'own' else 'the probe scaled to the loop'}; over "
                                         f"{baseline_factor:g}× either way, the same work): the baseline ran under "
                                         "another load"))
        if baseline.per_prompt:
            checked.append("baseline_drift")
            per = [ms / n for _, (n, ms) in sorted(baseline.per_prompt.items()) if n > 0]
            wm = window_medians(np.asarray(per), 2)
            if len(wm) >= 2 and wm.min() > 0 and wm.max() / wm.min() > factor:
                ratio = float(wm.max() / wm.min())
                ev.append(TimingEvidence("baseline_drift", "baseline", ratio, True,
                                         "plain decoding changed speed across its prompts: medians of "
                                         f"{len(wm)} windows " + ", ".join(f"{v:.2f}" for v in wm)
                                         + f" ms per token ({ratio:.2f}× apart, over {factor:g}×)"))
    disturbed = any(e.disturbing for e in ev)
    if disturbed:
        words = "load changed during the recording: " + "; ".join(e.words for e in ev if e.disturbing)
    else:
        words = f"timings consistent (checked: {', '.join(checked)}; factor {factor:g}×)"
        sp = [e for e in ev if e.kind == "spikes"]
        if sp:
            words += f"; spikes ignored by the medians in {len(sp)} round size{'s' if len(sp) > 1 else ''}"
    return TimingQuality(disturbed, float(factor), tuple(checked), tuple(ev), words)

