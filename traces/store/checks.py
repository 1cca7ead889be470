"""The values a trace's rows must hold for any metric over them to mean something: the rounds' rules
(:func:`check_rounds`) and the steps' rules (:func:`check_steps`), run by :class:`traces.store.reader.Trace` on the
first read of each table whatever columns that read asks for, so that ``report``, ``explain``, ``diagnose``,
``compare`` and the app refuse the same traces with the same line. docs/TRACE_FORMAT.md lists the rules.

Each rule is vectorised (pyarrow.compute and numpy over every part read together: a few milliseconds per 100k
rounds). A broken rule is one :class:`~mtpscope.errors.TraceFormatError` naming the trace, the table and column,
how many rows break it, the first one (rows in part order, as ``Trace.rounds`` / ``Trace.steps`` give them) and
what it holds. One rule is a warning instead (:func:`accepted_drafts_warning`): it compares two things a runtime
reports, which a runtime may define differently, and refusing would lose a recording.

Imports: numpy, pyarrow, errors, traces.store.schema.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mtpscope.errors import TraceFormatError
from mtpscope.traces.store import schema as S

#: the rounds columns :func:`check_rounds` reads, on the first read of a trace's rounds whatever it asks for
CHECKED_ROUNDS_COLUMNS = ("prompt_id", "round", "pos", "pending_token", "n_draft", "drafted", "target", "n_accepted",
                          "emitted", "t_draft_ms", "t_verify_ms")
#: the steps columns :func:`check_steps` reads, on the first read of a trace's steps whatever it asks for
CHECKED_STEPS_COLUMNS = ("prompt_id", "round", "k", "token", "accepted", "target_token")
#: token-id columns of rounds (a list column's every item is a token id)
TOKEN_COLUMNS = ("pending_token", "drafted", "target", "emitted")
#: token-id columns of steps (not ``top_ids``: ``n_top`` ids a step, up to 256 of them, would make the first read of
#: any steps column read them all; the candidates' ids name tokens to show, no count is made of them)
STEP_TOKEN_COLUMNS = ("token", "target_token")
#: a round's draft or verify time is null (unknown), 0, or in [MIN_ROUND_MS, MAX_ROUND_MS): the format's
#: plausible-time rule (:data:`schema.MIN_TIME_MS`, its one home, a cost probe's times too), a nanosecond to a day
MIN_ROUND_MS, MAX_ROUND_MS = S.MIN_TIME_MS, S.MAX_TIME_MS

Fail = Any      # fail(col, bad rows mask, expected words, actual value) -> NoReturn


def prompt_id_bound(manifest: dict[str, Any]) -> int | None:
    """How many prompt ids a trace's rounds may use: ``prompt_id`` is an index into ``manifest.prompts``, so
    ``0..n - 1`` with ``n`` the prompts listed, or the largest listed ``prompt_id`` + 1 when larger; None (only
    ``>= 0`` is checked) when the manifest lists no prompt (a writer given none) or :func:`schema.check_manifest`
    left a malformed entry out (``prompts_left_out``: its id unknown, its rounds stay readable)."""
    prompts = manifest.get("prompts") or []
    if not prompts or manifest.get("prompts_left_out"):
        return None
    return max(len(prompts), 1 + max(int(p["prompt_id"]) for p in prompts))


def manifest_n_vocab(manifest: dict[str, Any]) -> int | None:
    """The target's vocabulary size where the manifest records it (``params.n_vocab``, an int > 0: recordings of
    every runtime, synthetic traces), else None (token ids are then checked ``>= 0`` only)."""
    v = (manifest.get("params") or {}).get("n_vocab")
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _failer(table: str, path: Path) -> Fail:
    def fail(col: str, bad: pa.Array | pa.ChunkedArray | np.ndarray, expected: str, actual: Any) -> None:
        idx = np.flatnonzero(np.asarray(bad, dtype=bool)) if isinstance(bad, np.ndarray) else \
            pc.indices_nonzero(bad).to_numpy()
        rows = "1 row" if len(idx) == 1 else f"{len(idx)} rows"
        raise TraceFormatError(f"{table} column breaks the trace format ({rows}, first row {int(idx[0])})",
                               path=path, key=col, expected=expected, actual=actual)
    return fail


def _scalar(t: pa.Table, fail: Fail, col: str, bad: pa.ChunkedArray | pa.Array, expected: str) -> None:
    bad = pc.fill_null(bad, False)
    if pc.any(bad).as_py():
        fail(col, bad, expected, pc.filter(t[col], bad)[0].as_py())


def _prompt_and_round(t: pa.Table, fail: Fail, manifest: dict[str, Any], names: set[str]) -> None:
    n_prompts = prompt_id_bound(manifest)
    if "prompt_id" in names:
        pid = t["prompt_id"]
        if n_prompts is None:
            _scalar(t, fail, "prompt_id", pc.less(pid, 0), ">= 0")
        else:
            _scalar(t, fail, "prompt_id", pc.or_(pc.less(pid, 0), pc.greater_equal(pid, n_prompts)),
                    f"0..{n_prompts - 1} (manifest.prompts)")
    if "round" in names:
        _scalar(t, fail, "round", pc.less(t["round"], 0), ">= 0")


def _token_ids(t: pa.Table, fail: Fail, manifest: dict[str, Any], cols: tuple[str, ...]) -> None:
    names = set(t.column_names)
    n_vocab = manifest_n_vocab(manifest)
    ids = ">= 0" if n_vocab is None else f"0..{n_vocab - 1} (params.n_vocab {n_vocab})"
    hi = np.iinfo(np.int64).max if n_vocab is None else n_vocab
    for col in cols:
        if col not in names:
            continue
        c = t[col]
        if not pa.types.is_list(c.type):
            bad = pc.fill_null(pc.or_(pc.less(c, 0), pc.greater_equal(c, hi)), False)
            if pc.any(bad).as_py():
                fail(col, bad, f"token ids {ids}", pc.filter(c, bad)[0].as_py())
            continue
        # a list column over its offsets: the items of the rows that are not null (a null row's range, whatever
        # it covers, is no item), a null item passing
        arr = c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c
        offsets = np.asarray(arr.offsets.to_numpy(), dtype=np.int64)
        lengths = np.where(arr.is_valid().to_numpy(zero_copy_only=False), offsets[1:] - offsets[:-1], 0)
        values = arr.values
        v = pc.fill_null(values, 0).to_numpy().astype(np.int64)
        item_bad = ((v < 0) | (v >= hi)) & values.is_valid().to_numpy(zero_copy_only=False)
        if not item_bad.any():
            continue
        rows, pos = _items(lengths)
        at = offsets[:-1][rows] + pos
        hit = item_bad[at]
        if hit.any():
            row_bad = np.zeros(t.num_rows, dtype=bool)      # the rows holding a bad item
            row_bad[rows[hit]] = True
            fail(col, row_bad, f"token ids {ids}", int(v[at[hit][0]]))


def _keys(t: pa.Table) -> np.ndarray:
    """One int64 key per row of ``(prompt_id, round)`` (both checked ``>= 0`` before, int32), in their order."""
    key: np.ndarray = (t["prompt_id"].to_numpy().astype(np.int64) << 32) | t["round"].to_numpy().astype(np.int64)
    return key


def _step_keys(r_key: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, Any]:
    """One int64 key per step from its round's key (:func:`_keys`) and its ``k`` (``1 .. 65535``, checked before),
    in their order, and how a key reads as ``(prompt_id, round, k)``: shifted when the prompt ids fit 15 bits, else
    through the rounds' distinct keys."""
    if not len(r_key) or int(r_key.max()) >> 32 < 1 << 15:
        return (r_key << 16) | k, lambda v: (v >> 48, (v >> 16) & 0xFFFFFFFF, v & 0xFFFF)
    uniq, inv = np.unique(r_key, return_inverse=True)
    return (inv.astype(np.int64) << 16) | k, lambda v: (int(uniq[v >> 16]) >> 32, int(uniq[v >> 16]) & 0xFFFFFFFF,
                                                           v & 0xFFFF)


def _check_unique(key: np.ndarray, fail: Fail, col: str, words: Any) -> None:
    """Each key once; in order already (how writers write) costs one comparison, else one stable sort. ``words``:
    key -> how the line shows it."""
    if len(key) < 2 or bool(np.all(key[1:] > key[:-1])):
        return
    order = np.argsort(key, kind="stable")
    same = key[order[1:]] == key[order[:-1]]
    if not same.any():
        return
    again = np.zeros(len(key), dtype=bool)
    again[order[1:][same]] = True          # a row whose key an earlier row holds (stable: the earlier one first)
    first = int(np.flatnonzero(again)[0])
    earlier = int(np.flatnonzero(key == key[first])[0])
    fail(col, again, f"each ({col}) once", f"{words(int(key[first]))} again (first at row {earlier})")


def check_rounds(t: pa.Table, path: Path, manifest: dict[str, Any]) -> None:
    """The values every metric relies on, checked on whichever of :data:`CHECKED_ROUNDS_COLUMNS` ``t`` holds,
    in this order (the first rule broken is the error):

    * no nulls in a column the format marks non-null (``prompt_id``, ``round``, ``pos``, ``pending_token``,
      ``n_draft``, ``drafted``, ``n_accepted``);
    * ``prompt_id`` in ``0..n - 1`` (:func:`prompt_id_bound`; ``>= 0`` when the manifest lists no prompt);
      ``round >= 0``;
    * ``n_draft >= 0`` and ``n_draft == len(drafted)``; ``0 <= n_accepted <= n_draft``;
    * each ``(prompt_id, round)`` once (across parts: ``t`` is every part read);
    * token ids (``pending_token``, the items of ``drafted``, ``target``, ``emitted``) ``>= 0`` and below
      the manifest's ``n_vocab`` where it records one (:func:`manifest_n_vocab`); null items pass;
    * ``target`` null (unknown) or ``n_draft + 1`` items, one per verify row (``RoundRecord.target``);
    * ``emitted`` null (unknown) or ``1 .. n_accepted + 1`` items (the accepted drafts and the target's own
      token, cut after an end-of-generation token), its first ``n_accepted`` the accepted drafts;
    * ``t_draft_ms`` / ``t_verify_ms`` null (unknown), 0, or :data:`MIN_ROUND_MS` ``<= t <`` :data:`MAX_ROUND_MS`
      (NaN and infinities refused).

    Raises:
        TraceFormatError: naming the trace, the column, how many rows break the rule, the first one, and what
            that row holds.
    """
    fail = _failer("rounds", path)
    names = set(t.column_names)
    n = t.num_rows
    for col in CHECKED_ROUNDS_COLUMNS:
        if col in names and not S.ROUNDS_SCHEMA.field(col).nullable and t[col].null_count:
            fail(col, pc.is_null(t[col]), "no nulls", "null")
    if not n:
        return
    _prompt_and_round(t, fail, manifest, names)
    if "n_draft" in names:
        _scalar(t, fail, "n_draft", pc.less(t["n_draft"], 0), ">= 0")
        if "drafted" in names:
            lengths = pc.list_value_length(t["drafted"])
            bad = pc.not_equal(t["n_draft"], lengths)
            if pc.any(bad).as_py():
                first = pc.indices_nonzero(bad)[0].as_py()
                fail("n_draft", bad, f"len(drafted) = {lengths[first].as_py()}", t["n_draft"][first].as_py())
    if "n_accepted" in names:
        bad = pc.less(t["n_accepted"], 0)
        if "n_draft" in names:
            bad = pc.or_(bad, pc.greater(t["n_accepted"], t["n_draft"]))
        _scalar(t, fail, "n_accepted", bad, "0 <= n_accepted <= n_draft")
    if "prompt_id" in names and "round" in names:
        _check_unique(_keys(t), fail, "prompt_id, round", lambda key: (key >> 32, key & 0xFFFFFFFF))
    _token_ids(t, fail, manifest, TOKEN_COLUMNS)
    if {"target", "n_draft"} <= names:
        ln = pc.list_value_length(t["target"])          # null for a null list: passes
        _lengths(t, fail, "target", pc.not_equal(ln, pc.add(t["n_draft"], 1)), ln,
                 lambda i: f"n_draft + 1 = {t['n_draft'][i].as_py() + 1} items (one per verify row)")
    if {"emitted", "n_accepted"} <= names:
        ln = pc.list_value_length(t["emitted"])
        _lengths(t, fail, "emitted", pc.or_(pc.less(ln, 1), pc.greater(ln, pc.add(t["n_accepted"], 1))), ln,
                 lambda i: f"1 .. n_accepted + 1 = {t['n_accepted'][i].as_py() + 1} items")
        if "drafted" in names:
            _prefix_equal(t, fail, "emitted", "drafted", "its first n_accepted items the accepted drafts")
    for col in ("t_draft_ms", "t_verify_ms"):
        if col in names:
            v = t[col]     # (NaN compares false: not ok)
            ok = pc.or_(pc.equal(v, 0.0), pc.and_(pc.greater_equal(v, MIN_ROUND_MS), pc.less(v, MAX_ROUND_MS)))
            _scalar(t, fail, col, pc.invert(ok),
                    f"null, 0 or {MIN_ROUND_MS:g} <= t < {MAX_ROUND_MS:.0f} ms (a nanosecond to a day)")


def _lengths(t: pa.Table, fail: Fail, col: str, bad: Any, ln: Any, expected: Any) -> None:
    bad = pc.fill_null(bad, False)
    if pc.any(bad).as_py():
        first = pc.indices_nonzero(bad)[0].as_py()
        fail(col, bad, expected(first), f"{ln[first].as_py()} items {t[col][first].as_py()}")


def _items(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first ``lengths[r]`` items of each row ``r`` as ``(row, position in the row)``, int64, rows in order."""
    rows = np.repeat(np.arange(len(lengths)), lengths)
    pos = np.arange(len(rows), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return rows, pos


def _list_parts(c: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A list column as numpy: ``(offsets into values, n + 1), values (int64, a null item -1), valid (bool, n)``."""
    if isinstance(c, pa.ChunkedArray):
        c = c.combine_chunks()
    offsets = np.asarray(c.offsets.to_numpy(), dtype=np.int64)
    values = pc.fill_null(c.values, -1).to_numpy().astype(np.int64)
    valid = c.is_valid().to_numpy(zero_copy_only=False)
    return offsets, values, valid


def _accepted_pairs(t: pa.Table, col: str, ref: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The items of list columns ``col`` and ``ref`` at each position ``i < n_accepted`` of a row where ``col`` is not
    null, up to ``col``'s length (``ref`` holds ``n_accepted`` items at least where it is not null: drafted, checked
    before): ``(row, col's item, ref's item)``, a null item -1. Vectorised over offsets: no Python per row."""
    o, v, valid = _list_parts(t[col])
    ro, rv, r_valid = _list_parts(t[ref])
    n_acc = t["n_accepted"].to_numpy().astype(np.int64)
    rows, pos = _items(np.where(valid & r_valid, np.minimum(n_acc, o[1:] - o[:-1]), 0))
    return rows, v[o[:-1][rows] + pos], rv[ro[:-1][rows] + pos]


def _prefix_equal(t: pa.Table, fail: Fail, col: str, ref: str, expected: str) -> None:
    """``col[i] == ref[i]`` for ``i < min(n_accepted, len(col))`` where ``col`` is not null (``ref``: the
    drafts, ``n_accepted`` of them at least: checked before)."""
    rows, got, want = _accepted_pairs(t, col, ref)
    bad_item = got != want
    if bad_item.any():
        bad = np.zeros(t.num_rows, dtype=bool)
        bad[rows[bad_item]] = True
        first = int(np.flatnonzero(bad)[0])
        fail(col, bad, f"{expected} ({ref} {t[ref][first].as_py()}, n_accepted {t['n_accepted'][first].as_py()})",
             t[col][first].as_py())


def accepted_drafts_warning(t: pa.Table, path: Path) -> str | None:
    """A warning (None when none) for rounds whose accepted drafts differ from the target's tokens at their verify
    rows (``drafted[i] != target[i]`` for an ``i < n_accepted``, ``target`` not null; a null target item
    differs). llama.cpp's rule accepts a draft only where they are equal
    (:func:`traces.run.mtp_runtime.accepts_draft`), so a recording of it never holds one; a runtime whose
    ``target`` is recomputed after its own acceptance (HF, MLX) could, at a near tie. The rounds stay readable:
    acceptance counts are the runtime's, the tokens the trace's."""
    if not {"drafted", "target", "n_accepted"} <= set(t.column_names) or not t.num_rows:
        return None
    rows, got, want = _accepted_pairs(t, "target", "drafted")
    differ = got != want
    if not differ.any():
        return None
    bad = np.unique(rows[differ])
    r = int(bad[0])
    n = len(bad)
    return (f"{path}: {n} round{'s' if n != 1 else ''} whose accepted drafts differ from the target's tokens (first "
            f"row {r}: drafted {t['drafted'][r].as_py()}, target {t['target'][r].as_py()}, n_accepted "
            f"{t['n_accepted'][r].as_py()}): the acceptance counts are the runtime's own")


def check_steps(steps: pa.Table, rounds: pa.Table, path: Path, manifest: dict[str, Any]) -> None:
    """The steps' values, checked on whichever of :data:`CHECKED_STEPS_COLUMNS` ``steps`` holds, against the
    trace's rounds (``rounds``: :data:`CHECKED_ROUNDS_COLUMNS`, already through :func:`check_rounds`), in this
    order:

    * ``prompt_id`` and ``round`` as the rounds' rule; ``1 <= k <= 65535``;
    * each ``(prompt_id, round, k)`` once;
    * token ids (``token``, ``target_token``) as the rounds' rule;
    * for a step whose round the rounds hold (a step of a rounds part that was lost is kept and not checked
      against it: docs/TRACE_FORMAT.md): ``k <= n_draft``, ``token == drafted[k - 1]``, ``accepted`` null or
      ``k <= n_accepted``, and, where the round's ``target`` is not null, ``target_token == target[k - 1]``
      (both null alike).

    Raises:
        TraceFormatError: as :func:`check_rounds`, the table named ``steps``.
    """
    fail = _failer("steps", path)
    names = set(steps.column_names)
    if not steps.num_rows:
        return
    _prompt_and_round(steps, fail, manifest, names)
    if "k" not in names or not {"prompt_id", "round"} <= names:
        return
    _scalar(steps, fail, "k", pc.or_(pc.less(steps["k"], 1), pc.greater(steps["k"], 0xFFFF)), "1 <= k <= 65535")
    s_round = _keys(steps)
    k = steps["k"].to_numpy().astype(np.int64)
    key, words = _step_keys(s_round, k)
    _check_unique(key, fail, "prompt_id, round, k", words)
    _token_ids(steps, fail, manifest, STEP_TOKEN_COLUMNS)
    if not rounds.num_rows or not {"prompt_id", "round", "n_draft"} <= set(rounds.column_names):
        return
    r_key = _keys(rounds)
    in_order = len(r_key) < 2 or bool(np.all(r_key[1:] > r_key[:-1]))      # (how writers write)
    order = np.arange(len(r_key)) if in_order else np.argsort(r_key, kind="stable")
    sorted_keys = r_key if in_order else r_key[order]
    at = np.searchsorted(sorted_keys, s_round)
    found = at < len(r_key)
    found[found] = sorted_keys[at[found]] == s_round[found]
    row = np.full(len(key), -1, dtype=np.int64)
    row[found] = order[at[found]]                      # each step's round (row of rounds), -1: not in rounds
    nd = rounds["n_draft"].to_numpy().astype(np.int64)
    bad = found.copy()
    bad[found] = k[found] > nd[row[found]]
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        fail("k", bad, f"k <= n_draft = {int(nd[row[i]])} of its round", int(k[i]))
    if "token" in names and "drafted" in rounds.column_names:
        _match(steps, rounds, fail, row, k, "token", "drafted", "drafted[k - 1] of its round")
    if "accepted" in names and "n_accepted" in rounds.column_names:
        acc = steps["accepted"]
        na = rounds["n_accepted"].to_numpy().astype(np.int64)
        valid = acc.is_valid().to_numpy(zero_copy_only=False) & found
        want = np.zeros(len(k), dtype=bool)
        want[found] = k[found] <= na[row[found]]
        got = pc.fill_null(acc, False).to_numpy(zero_copy_only=False)
        bad = valid & (got != want)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            fail("accepted", bad, f"k <= n_accepted ({int(k[i])} <= {int(na[row[i]])}: {bool(want[i])})",
                 bool(got[i]))
    if "target_token" in names and "target" in rounds.column_names:
        _match(steps, rounds, fail, row, k, "target_token", "target", "target[k - 1] of its round")


def _match(steps: pa.Table, rounds: pa.Table, fail: Fail, row: np.ndarray, k: np.ndarray, col: str, ref: str,
           expected: str) -> None:
    """``steps[col] == rounds[ref][row][k - 1]`` where ``row >= 0`` and the round's ``ref`` list is not null
    (null items equal null values only)."""
    offsets, items, list_ok = _list_parts(rounds[ref])
    lengths = offsets[1:] - offsets[:-1]
    sel = row >= 0
    sel[sel] = list_ok[row[sel]] & (k[sel] <= lengths[row[sel]])
    want = np.full(len(k), -1, dtype=np.int64)
    want[sel] = items[offsets[row[sel]] + k[sel] - 1]
    got = pc.fill_null(steps[col], -1).to_numpy().astype(np.int64)
    bad = sel & (got != want)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        fail(col, bad, f"{expected} = {None if want[i] < 0 else int(want[i])}", None if got[i] < 0 else int(got[i]))


__all__ = ["CHECKED_ROUNDS_COLUMNS", "CHECKED_STEPS_COLUMNS", "MAX_ROUND_MS", "MIN_ROUND_MS", "STEP_TOKEN_COLUMNS",
           "TOKEN_COLUMNS", "accepted_drafts_warning", "check_rounds", "check_steps", "manifest_n_vocab",
           "prompt_id_bound"]
