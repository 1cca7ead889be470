"""Acceptance broken down by a label of each draft: token class, template channel, class x draft
position, prompt category. Pure (numpy / pandas); one job.

A drafted step counts in the class of the **target's token at its output position** (the token the
generated sequence holds at the position the draft stood in for, :mod:`traces.analysis.positions`), so the
classes' drafted counts add up to the trace's drafted total; a draft whose position is unknown (a prompt
without ``emitted``, a gap in its rounds, no vocabulary) or lies past the end of the output counts as
``unknown``. Acceptance rate = accepted / drafted within the group (llama.cpp's definition,
:mod:`traces.analysis.metrics`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from mtpscope.traces.analysis import rates
from mtpscope.traces.analysis.positions import Positions
from mtpscope.traces.analysis.token_classes import C_UNKNOWN, CHANNELS, CLASSES, Classifier, TokenClasses
from mtpscope.traces.analysis.wording import category_field_note, category_like_fields

UNCATEGORIZED = "(none)"


@dataclass(frozen=True)
class Acceptance:
    """Drafted and accepted counts of one group (a token class, a channel).

    Attributes:
        n_drafted / n_accepted: drafted tokens of the group and those accepted.
        acceptance_rate: ``n_accepted / n_drafted`` (None when nothing was drafted).
    """

    n_drafted: int
    n_accepted: int
    acceptance_rate: float | None

    def to_dict(self) -> dict[str, Any]:
        """``{n_drafted, n_accepted, acceptance_rate}`` (docs/EXPLAIN.md)."""
        return {"n_drafted": self.n_drafted, "n_accepted": self.n_accepted, "acceptance_rate": self.acceptance_rate}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Acceptance:
        """The counts back from a group's JSON (:meth:`to_dict`, or :class:`CategoryAcceptance`'s: its
        ``n_prompts`` left out), as a document read back carries them (``diagnosis.json``'s summary)."""
        rate = d.get("acceptance_rate")
        return cls(int(d["n_drafted"]), int(d["n_accepted"]), None if rate is None else float(rate))


@dataclass(frozen=True)
class PositionAcceptance:
    """:class:`Acceptance` of one group at one draft position ``k`` (1-based)."""

    k: int
    n_drafted: int
    n_accepted: int
    acceptance_rate: float | None

    def to_dict(self) -> dict[str, Any]:
        """``{k, n_drafted, n_accepted, acceptance_rate}``."""
        return {"k": self.k, "n_drafted": self.n_drafted, "n_accepted": self.n_accepted,
                "acceptance_rate": self.acceptance_rate}


@dataclass(frozen=True)
class CategoryAcceptance:
    """:class:`Acceptance` of one prompt category, with the number of its prompts."""

    n_prompts: int
    n_drafted: int
    n_accepted: int
    acceptance_rate: float | None

    def to_dict(self) -> dict[str, Any]:
        """``{n_prompts, n_drafted, n_accepted, acceptance_rate}``."""
        return {"n_prompts": self.n_prompts, "n_drafted": self.n_drafted, "n_accepted": self.n_accepted,
                "acceptance_rate": self.acceptance_rate}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CategoryAcceptance:
        """The counts back from :meth:`to_dict`'s JSON (``diagnosis.json``'s summary)."""
        rate = d["acceptance_rate"]
        return cls(int(d["n_prompts"]), int(d["n_drafted"]), int(d["n_accepted"]), None if rate is None else float(rate))

    @property
    def acceptance(self) -> Acceptance:
        """The counts without the number of prompts."""
        return Acceptance(self.n_drafted, self.n_accepted, self.acceptance_rate)



def _group(label: np.ndarray | pd.Categorical[str], accepted: np.ndarray, names: Sequence[str] | None = None) -> dict[str, Acceptance]:
    codes, uniq = pd.factorize(pd.Series(label), sort=True)
    nd = np.bincount(codes[codes >= 0], minlength=len(uniq))
    na = np.bincount(codes[codes >= 0], weights=accepted[codes >= 0].astype(np.float64), minlength=len(uniq))
    found = {str(u): (int(d), int(a)) for u, d, a in zip(uniq.tolist(), nd, na)}
    out: dict[str, Acceptance] = {}
    for name in names if names is not None else sorted(found):
        if name not in found or found[name][0] == 0:
            continue
        d, a = found[name]
        out[str(name)] = Acceptance(d, a, rates.acceptance_rate(a, d))
    return out


def classify_outputs(pos: Positions, classifier: Classifier,
                     prefixes: Mapping[int, Sequence[int] | str] | None = None,
                     chat_prompts: Collection[int] = ()) -> dict[int, TokenClasses]:
    """Classes and channels of every known prompt's generated sequence.

    Args:
        pos: :func:`traces.analysis.positions.positions` of the trace.
        classifier: over the trace's vocabulary (``chat`` as recorded).
        prefixes: per prompt_id the prompt, read for context: its token ids or its text (optional).
        chat_prompts: prompt ids rendered with the chat template although ``classifier`` is not a chat
            one (prompts-file ``messages`` prompts): classified with ``chat=True``.
    """
    prefixes = prefixes or {}
    chat_clf = Classifier(classifier.vocab, chat=True) if chat_prompts and not classifier.chat else classifier
    return {p: (chat_clf if p in chat_prompts else classifier).classify(seq, prefixes.get(p, ()))
            for p, seq in pos.sequences.items()}


def draft_labels(pos: Positions, classes: Mapping[int, TokenClasses]) -> tuple[pd.Categorical[str], pd.Categorical[str]]:
    """(class names, channel names) of each draft in ``pos.drafts`` order, as ``pandas.Categorical``: the
    labels of the output position it stood in for; ``unknown`` / ``unknown`` where that is not known."""
    d = pos.drafts
    pid = d["prompt_id"].to_numpy(dtype=np.int64)
    g = d["g"].to_numpy(dtype=np.int64)
    cls = np.full(len(d), C_UNKNOWN, dtype=np.int8)
    chan = np.full(len(d), -1, dtype=np.int8)
    order = np.argsort(pid, kind="stable")
    sp = pid[order]
    for p, tc in classes.items():
        a, b = np.searchsorted(sp, p, side="left"), np.searchsorted(sp, p, side="right")
        rows = order[a:b]
        gg = g[rows]
        ok = (gg >= 0) & (gg < len(tc.classes))
        cls[rows[ok]] = tc.classes[gg[ok]]
        chan[rows[ok]] = tc.channels[gg[ok]]
    chan = np.where(chan >= 0, chan, len(CHANNELS)).astype(np.int8)
    return (pd.Categorical.from_codes(cls, pd.Index(CLASSES)),
            pd.Categorical.from_codes(chan, pd.Index((*CHANNELS, "unknown"))))


def by_label(pos: Positions, labels: np.ndarray | pd.Categorical[str], names: Sequence[str] | None = None) -> dict[str, Acceptance]:
    """``{label: Acceptance}`` over ``pos.drafts`` (labels aligned with it); with ``names`` only those
    keys, in that order, empty groups left out."""
    return _group(labels, pos.drafts["accepted"].to_numpy(dtype=bool), names)


def by_label_and_position(pos: Positions, labels: np.ndarray | pd.Categorical[str],
                          names: Sequence[str] | None = None) -> dict[str, tuple[PositionAcceptance, ...]]:
    """``{label: (PositionAcceptance for k = 1.., ...)}``: the same per draft position k (up to the
    group's last drafted position)."""
    codes, uniq = pd.factorize(pd.Series(labels), sort=True)
    acc = pos.drafts["accepted"].to_numpy(dtype=bool)
    k = pos.drafts["k"].to_numpy(dtype=np.int64)
    kmax = int(k.max()) if len(k) else 0
    ok = codes >= 0
    flat = codes[ok] * (kmax + 1) + k[ok]
    nd = np.bincount(flat, minlength=len(uniq) * (kmax + 1)).reshape(len(uniq), kmax + 1)
    na = np.bincount(flat, weights=acc[ok].astype(np.float64),
                     minlength=len(uniq) * (kmax + 1)).reshape(len(uniq), kmax + 1)
    index = {str(u): i for i, u in enumerate(uniq.tolist())}
    out: dict[str, tuple[PositionAcceptance, ...]] = {}
    for name in names if names is not None else sorted(index):
        i = index.get(str(name))
        if i is None or nd[i].sum() == 0:
            continue
        top = int(np.flatnonzero(nd[i])[-1])
        out[str(name)] = tuple(PositionAcceptance(kk, int(nd[i, kk]), int(na[i, kk]),
                                                  rates.acceptance_rate(na[i, kk], nd[i, kk]))
                               for kk in range(1, top + 1))
    return out


def prompt_categories(manifest: Mapping[str, Any], field: str | None = None) -> dict[int, str] | None:
    """``{prompt_id: category}`` from ``manifest["prompts"]``: the entry's ``category``, or with ``field``
    (``explain --category-field NAME``) the field of that name among the entry's ``extra`` fields (a
    number is taken as its text); prompts without one get :data:`UNCATEGORIZED`; None when no prompt
    has one."""
    prompts = manifest.get("prompts") or []
    cats: dict[int, str] = {}
    any_cat = False
    for i, p in enumerate(prompts):
        if not isinstance(p, dict):
            continue
        pid = p.get("prompt_id", i)
        if field is None or field == "category":
            c = p.get("category")
        else:
            extra_ = p.get("extra")
            extra = extra_ if isinstance(extra_, dict) else {}
            c = _category_value(extra.get(field, p.get(field)))
        if isinstance(c, str) and c:
            any_cat = True
            cats[int(pid)] = c
        else:
            cats[int(pid)] = UNCATEGORIZED
    return cats if any_cat else None


#: prompt entry keys that are no category (the prompt itself, its counts and ids of tokens)
NOT_CATEGORY_FIELDS = frozenset({"prompt_id", "text", "prompt", "n_prompt_tokens", "tokens", "messages"})


def _category_value(v: Any) -> str | None:
    """A prompt field's value as a category, as :func:`prompt_categories` takes it: a non-empty text, or a number
    as its text; None for anything else (null, empty, a boolean, a list ...)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return str(v)
    return v if isinstance(v, str) and v else None


def prompt_fields(manifest: Mapping[str, Any]) -> list[str]:
    """The fields ``--category-field`` can name, sorted (a typo is told which exist): every field of the manifest's
    prompt entries (their ``extra`` fields and their own, :func:`prompt_categories`' lookup) that holds a category
    value (:func:`_category_value`) in some prompt, less :data:`NOT_CATEGORY_FIELDS`."""
    names: set[str] = set()
    for p in manifest.get("prompts") or []:
        if isinstance(p, dict):
            extra = p.get("extra")
            for src in (extra if isinstance(extra, dict) else {}, p):
                names.update(str(k) for k, v in src.items() if k != "extra" and _category_value(v) is not None)
    return sorted(names - NOT_CATEGORY_FIELDS)


def missing_field_words(manifest: Mapping[str, Any], field: str) -> str:
    """``no prompt has a 'domian' field (the prompts' fields: domain, source)``, or ``... has a 'domain' value
    (null, empty or not text) ...`` when the field is there without one: the one wording of a ``--category-field``
    that gives no category (the CLI's refusal, the app's note)."""
    have = prompt_fields(manifest)
    entries = [p for p in manifest.get("prompts") or [] if isinstance(p, dict)]
    there = any(field in p or (isinstance(p.get("extra"), dict) and field in p["extra"]) for p in entries)
    what = f"a {field!r} value (each is null, empty or not text)" if there else f"a {field!r} field"
    return (f"no prompt has {what} (the prompts' fields: "
            f"{', '.join(have) if have else 'none besides their text'})")


def category_note(manifest: Mapping[str, Any]) -> str | None:
    """The one-line note when the manifest's prompts carry no category but every one carries an
    ``extra`` field that looks like one (:func:`traces.analysis.wording.category_field_note`), else None."""
    prompts = [p for p in manifest.get("prompts") or [] if isinstance(p, dict)]
    if not prompts or any(isinstance(p.get("category"), str) and p.get("category") for p in prompts):
        return None
    return category_field_note(category_like_fields(
        (p.get("extra") or {}).keys() if isinstance(p.get("extra"), dict) else () for p in prompts))


def by_category(rounds: pd.DataFrame, categories: Mapping[int, str]) -> dict[str, CategoryAcceptance]:
    """``{category: CategoryAcceptance}`` over rounds (columns
    ``prompt_id``, ``n_draft``, ``n_accepted``); prompts missing from ``categories`` are
    :data:`UNCATEGORIZED`. Ordered by category name."""
    pid = rounds["prompt_id"].to_numpy(dtype=np.int64)
    lut = {int(p): categories.get(int(p), UNCATEGORIZED) for p in np.unique(pid)}
    lab = pd.Series(pid).map(lut).to_numpy(dtype=object)
    nd = rounds["n_draft"].to_numpy(dtype=np.int64)
    na = rounds["n_accepted"].to_numpy(dtype=np.int64)
    out: dict[str, CategoryAcceptance] = {}
    for name in sorted(set(lab.tolist())):
        m = lab == name
        d, a = int(nd[m].sum()), int(na[m].sum())
        out[name] = CategoryAcceptance(int(len(np.unique(pid[m]))), d, a, rates.acceptance_rate(a, d))
    return out
