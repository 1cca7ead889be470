"""The aligned diff of two opened traces (what ``mtpscope compare A B`` prints). One job: read the
columns :func:`traces.analysis.align.aligned_diff` needs from both traces, classify A's output with its
vocabulary, and call it; then the round-by-round first differences with their named causes
(:func:`traces.analysis.runtime_diff.runtime_diff`, ``AlignedDiff.runtimes``), unless the runs are not comparable
(``AlignedDiff.not_comparable``: different targets, or outputs that differ from the first token on).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from mtpscope.errors import EmptyTraceError, TraceMismatchError
from mtpscope.traces.analysis.align import AlignedDiff, aligned_diff, pair_prompts, target_difference
from mtpscope.traces.analysis.breakdown import classify_outputs, prompt_categories
from mtpscope.traces.analysis.positions import positions
from mtpscope.traces.analysis.runtime_diff import confirm_head, runtime_diff
from mtpscope.traces.analysis.token_classes import CLASSES, Classifier
from mtpscope.traces.analysis.vocab import Vocab
from mtpscope.traces.analysis.wording import plural
from mtpscope.traces.store.protocols import TraceLike

COMPARE_ROUNDS_COLUMNS = ["prompt_id", "round", "pos", "pending_token", "n_draft", "drafted", "n_accepted", "emitted",
                          "eog_confirmed"]


def compare_traces(a: TraceLike, b: TraceLike, *, vocab: Vocab | None = None, n_boot: int = 2000, seed: int = 0) -> AlignedDiff:
    """:func:`traces.analysis.align.aligned_diff` of two opened traces (:class:`traces.store.protocols.TraceLike`).

    Args:
        a / b: the traces (A is the reference: its categories and token classes are used).
        vocab: A's vocabulary for token classes (None: classes ``unknown``).
        n_boot, seed: bootstrap resamples and seed.

    Raises:
        EmptyTraceError: A or B has no readable rounds.
        TraceMismatchError: the two share no prompt.
    """
    ra = a.columns("rounds", COMPARE_ROUNDS_COLUMNS)
    rb = b.columns("rounds", COMPARE_ROUNDS_COLUMNS)
    for name, t, r in (("A", a, ra), ("B", b, rb)):
        if not len(r):
            raise EmptyTraceError(f"trace {name} has no rounds (nothing recorded, or its rounds parts were "
                                  "unreadable): nothing to compare", path=t.path, key="rounds",
                                  expected=">= 1 round", actual="0")
    pa_, pb_ = positions(ra), positions(rb)
    pairing = pair_prompts(a.manifest, b.manifest, np.unique(ra["prompt_id"]).tolist(),
                           np.unique(rb["prompt_id"]).tolist())
    if not pairing.pairs:
        raise TraceMismatchError(f"the two traces share no prompt (paired by {pairing.by}): they are runs of "
                                 "different prompts", path=b.path, key="prompts",
                                 expected=f"some of A's {plural(len(pairing.unpaired_a), 'prompt')}",
                                 actual=plural(len(pairing.unpaired_b), "other prompt"))
    classes = None
    if vocab is not None:
        clf = Classifier(vocab, chat=bool((a.manifest.get("params") or {}).get("chat")))
        tc = classify_outputs(pa_, clf)
        classes = {p: np.asarray(CLASSES, dtype=object)[c.classes] for p, c in tc.items()}
    diff = aligned_diff(ra, pa_, rb, pb_, pairing, classes_a=classes, categories=prompt_categories(a.manifest),
                        n_boot=n_boot, seed=seed, targets_differ=target_difference(a.manifest, b.manifest))
    if diff.not_comparable is not None:   # different text: no round is at a common position to explain
        return diff
    rt = runtime_diff(ra, rb, pairing.pairs, manifest_a=a.manifest, manifest_b=b.manifest,
                      outputs_a={p: s.tolist() for p, s in pa_.sequences.items()},
                      outputs_b={p: s.tolist() for p, s in pb_.sequences.items()})
    if "head" in rt.causes:
        cols = ["prompt_id", "round", "k", "centroid_token"]
        rt = confirm_head(rt, *(t.columns("steps", cols) if t.manifest.get("centroids") else None for t in (a, b)))
    return dataclasses.replace(diff, runtimes=rt)
