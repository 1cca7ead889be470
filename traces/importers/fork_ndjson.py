"""The fork's ``LLAMA_MTP_ACC_TRACE`` NDJSON -> a trace (:func:`import_fork_ndjson`; the format: the package docstring)."""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from mtpscope.errors import ImportFormatError
from mtpscope.traces.importers.common import (
    I32_RANGE,
    ROUNDS_PER_PART,
    ImportResult,
    in_i32,
    is_int,
    is_num,
    json_line,
    listed,
    read_lines,
)
from mtpscope.traces.store import schema as S
from mtpscope.traces.store.writer import TraceWriter

_F32_MAX = float(np.finfo(np.float32).max)

#: a draft event waiting for its accept: (line, draft obj, seq_id, segment of that seq_id)
_Pending = tuple[int, dict[str, Any], int, int]


def _seq_is(sid: int, it: int | None = None) -> Callable[[int, _Pending], bool]:
    """A ``drop_pending`` test: the pending drafts of sequence ``sid`` (at iter ``it`` when given)."""
    return lambda pit, e: e[2] == sid and (it is None or pit == it)


def _parse_event(line: str) -> tuple[str, Any]:
    """-> ("ignored" | "bad" | "ok", reason or event dict)."""
    s = line.strip()
    if not s:
        return "blank", None
    if s.startswith(("{", "[")):
        candidate = s
    else:
        i = s.find('{"evt"')
        if i < 0:
            return "ignored", None
        candidate = s[i:]
    obj, why = json_line(candidate)
    if why is not None:
        return "bad", why
    if not isinstance(obj, dict):
        return "bad", f"not a JSON object ({type(obj).__name__})"
    evt = obj.get("evt")
    if evt is None:
        return "bad", "no 'evt' field"
    if evt not in ("mtp_draft", "mtp_accept"):
        return "ignored", None
    if not is_int(obj.get("iter")) or not -(2 ** 63) <= obj["iter"] < 2 ** 63:
        return "bad", f"{evt}: 'iter' missing or not a 64-bit integer"
    if evt == "mtp_draft":
        drafts = obj.get("drafts")
        if not isinstance(drafts, list) or not all(is_int(t) and 0 <= t <= I32_RANGE[1] for t in drafts):
            return "bad", "mtp_draft: 'drafts' missing or not a list of token ids"
        # id_last becomes the round's pending_token: a token id, as the reader checks it (docs/TRACE_FORMAT.md)
        if not is_int(obj.get("id_last")) or not 0 <= obj["id_last"] <= I32_RANGE[1]:
            return "bad", "mtp_draft: 'id_last' missing or not a token id"
        if not is_int(obj.get("attn_pos")) or not in_i32(obj["attn_pos"]):
            return "bad", "mtp_draft: 'attn_pos' missing or not an integer"
        if "seq_id" in obj and not (is_int(obj["seq_id"]) and in_i32(obj["seq_id"])):
            return "bad", "mtp_draft: 'seq_id' not a 32-bit integer"
        if "path" in obj and not isinstance(obj["path"], str):
            return "bad", "mtp_draft: 'path' not a string"
        # h_l2 is an L2 norm, stored as float32: a larger value would be stored as inf
        if obj.get("h_l2") is not None and not (is_num(obj["h_l2"]) and 0 <= obj["h_l2"] <= _F32_MAX):
            return "bad", f"mtp_draft: 'h_l2' not a finite number from 0 to {_F32_MAX:.6g} (float32)"
    else:
        na = obj.get("n_accepted")
        if not is_int(na) or not 0 <= na <= I32_RANGE[1]:
            return "bad", "mtp_accept: 'n_accepted' missing or not a non-negative 32-bit integer"
        ndp = obj.get("n_drafted_prev")
        if ndp is not None and not (is_int(ndp) and in_i32(ndp)):
            return "bad", "mtp_accept: 'n_drafted_prev' not a 32-bit integer"
    return "ok", obj


def import_fork_ndjson(path: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                       overwrite: bool = False) -> ImportResult:
    """Import the fork's ``LLAMA_MTP_ACC_TRACE`` NDJSON into a trace (source ``fork-ndjson``).

    Rows are in the order of the draft events. See the module docstring for the mapping.

    Raises:
        ImportFormatError: the file is missing, or has no draft event that could be joined
            (every line bad or ignored); the message gives the counts and the first bad line.
        TraceError: ``out_dir`` already holds a trace and ``overwrite`` is false.
    """
    path = Path(path)
    n_lines = n_ignored = 0
    bad: list[tuple[int, str]] = []
    # joined rounds: (draft line, seq_id, segment of that seq_id, draft obj, n_accepted)
    joined: list[tuple[int, int, int, dict[str, Any], int]] = []
    pending: dict[int, deque[_Pending]] = {}       # iter -> FIFO of (line, draft, seq_id, segment)
    last_iter: dict[int, int] = {}                 # seq_id -> iter of its last draft
    segment_of: dict[int, int] = {}                # seq_id -> runs seen so far - 1
    unmatched_drafts: list[int] = []
    unmatched_accepts: list[int] = []
    prev_mismatch: list[int] = []
    n_used = 0

    def drop(entry: _Pending) -> None:
        ln, d, sid, seg = entry
        if d["drafts"]:
            unmatched_drafts.append(ln)
        else:                     # nothing drafted: n_accepted is 0 by definition
            joined.append((ln, sid, seg, d, 0))

    def drop_pending(pred: Callable[[int, _Pending], bool]) -> None:
        for it in list(pending):
            keep: deque[_Pending] = deque()
            for e in pending[it]:
                if pred(it, e):
                    drop(e)
                else:
                    keep.append(e)
            if keep:
                pending[it] = keep
            else:
                del pending[it]

    for ln, line in read_lines(path):
        n_lines = ln
        kind, val = _parse_event(line)
        if kind == "blank":
            continue
        if kind == "ignored":
            n_ignored += 1
            continue
        if kind == "bad":
            bad.append((ln, val))
            continue
        obj = val
        it = obj["iter"]
        if obj["evt"] == "mtp_draft":
            sid = int(obj.get("seq_id", 0))
            if sid in last_iter and it < last_iter[sid]:
                # iter went backwards for this sequence: a new run appended to the same file
                drop_pending(_seq_is(sid))
                segment_of[sid] += 1
            elif sid in last_iter and it == last_iter[sid]:
                # the fork counts iter per accept: a second draft at the same iter means the
                # previous one was never verified
                drop_pending(_seq_is(sid, it))
            segment_of.setdefault(sid, 0)
            last_iter[sid] = it
            pending.setdefault(it, deque()).append((ln, obj, sid, segment_of[sid]))
        else:
            q = pending.get(it)
            if not q:
                unmatched_accepts.append(ln)
                continue
            d_ln, d, sid, seg = q[0]
            if obj["n_accepted"] > len(d["drafts"]):
                bad.append((ln, f"mtp_accept: n_accepted {obj['n_accepted']} exceeds the "
                                f"{len(d['drafts'])} drafts of iter {it} (line {d_ln})"))
                continue
            q.popleft()
            if not q:
                del pending[it]
            if obj.get("n_drafted_prev") is not None and obj["n_drafted_prev"] != len(d["drafts"]):
                prev_mismatch.append(ln)
            joined.append((d_ln, sid, seg, d, obj["n_accepted"]))
            n_used += 1                               # the accept line
    drop_pending(lambda _it, e: True)
    n_used += len(joined)                             # the draft lines

    if not joined:
        first = f"; first bad line {bad[0][0]}: {bad[0][1]}" if bad else ""
        raise ImportFormatError(
            f"no usable mtp_draft/mtp_accept pair ({n_lines} lines: {len(bad)} bad, {n_ignored} ignored, "
            f"{len(unmatched_drafts)} drafts and {len(unmatched_accepts)} accepts without a partner){first}",
            path=path, expected="NDJSON events from LLAMA_MTP_ACC_TRACE", actual="none usable")

    # prompts: the log marks no request boundaries; within one (run, seq_id) stream a new request
    # is recognised when attn_pos goes down (positions only grow within one generation)
    joined.sort(key=lambda j: j[0])
    prompt_info: list[dict[str, Any]] = []
    current: dict[tuple[int, int], tuple[int, int]] = {}      # stream -> (prompt_id, last attn_pos)
    round_count: dict[int, int] = {}
    cols: dict[str, list[Any]] = {name: [] for name in S.ROUNDS_COLUMNS}
    drafted_lists: list[list[int]] = []
    for d_ln, sid, seg, d, na in joined:
        stream = (seg, sid)
        cur = current.get(stream)
        if cur is None or d["attn_pos"] < cur[1]:
            pid = len(prompt_info)
            prompt_info.append({"prompt_id": pid, "text": None, "n_prompt_tokens": None, "seq_id": sid,
                                "segment": seg, "first_line": d_ln})
        else:
            pid = cur[0]
        current[stream] = (pid, d["attn_pos"])
        r = round_count.get(pid, 0)
        round_count[pid] = r + 1
        cols["prompt_id"].append(pid)
        cols["round"].append(r)
        cols["pos"].append(d["attn_pos"])
        cols["pending_token"].append(d["id_last"])
        cols["n_draft"].append(len(d["drafts"]))
        drafted_lists.append(d["drafts"])
        cols["n_accepted"].append(na)
        cols["draft_path"].append(d.get("path"))
        cols["h_l2"].append(d.get("h_l2"))
    n = len(joined)
    nd = np.asarray(cols["n_draft"], dtype=np.int64)
    na_arr = np.asarray(cols["n_accepted"], dtype=np.int64)
    rounds = pa.table({
        "prompt_id": pa.array(cols["prompt_id"], pa.int32()),
        "round": pa.array(cols["round"], pa.int32()),
        "pos": pa.array(cols["pos"], pa.int32()),
        "pending_token": pa.array(cols["pending_token"], pa.int32()),
        "n_draft": pa.array(nd, pa.int32()),
        "drafted": pa.array(drafted_lists, pa.list_(pa.int32())),
        "n_accepted": pa.array(na_arr, pa.int32()),
        "draft_path": pa.array(cols["draft_path"], pa.string()),
        "h_l2": pa.array(cols["h_l2"], pa.float32()),
    })
    ridx = np.repeat(np.arange(n), nd)
    kk = np.arange(len(ridx)) - np.repeat(np.cumsum(nd) - nd, nd) + 1
    flat_tokens = [t for lst in drafted_lists for t in lst]
    steps = pa.table({
        "prompt_id": pa.array(np.asarray(cols["prompt_id"], dtype=np.int32)[ridx], pa.int32()),
        "round": pa.array(np.asarray(cols["round"], dtype=np.int32)[ridx], pa.int32()),
        "k": pa.array(kk.astype(np.int32), pa.int32()),
        "token": pa.array(flat_tokens, pa.int32()),
        "accepted": pa.array(kk <= na_arr[ridx], pa.bool_()),
    })

    warnings: list[str] = []
    if unmatched_drafts:
        warnings.append(f"{path}: {len(unmatched_drafts)} mtp_draft events without an mtp_accept "
                        f"(not imported; lines {listed(unmatched_drafts)})")
    if unmatched_accepts:
        warnings.append(f"{path}: {len(unmatched_accepts)} mtp_accept events without an mtp_draft "
                        f"(lines {listed(unmatched_accepts)})")
    if prev_mismatch:
        warnings.append(f"{path}: {len(prev_mismatch)} mtp_accept events whose n_drafted_prev differs from "
                        f"the joined draft's length (lines {listed(prev_mismatch)})")
    n_runs = max(segment_of.values(), default=0) + 1
    if n_runs > 1:
        warnings.append(f"{path}: iter went backwards: {n_runs} runs appended in one file, imported as "
                        f"separate prompts")
    if len(segment_of) > 1:
        warnings.append(f"{path}: drafts from {len(segment_of)} seq_ids; mtp_accept events carry no seq_id, "
                        f"so accepts were paired with the oldest open draft of the same iter")

    prompts = prompt_info
    manifest = {
        "source": "fork-ndjson",
        "command": list(sys.argv),
        "params": {"file": str(path)},
        "prompts": prompts,
        "import": {"file": str(path), "n_lines": n_lines, "n_used": n_used, "n_ignored": n_ignored,
                   "n_bad": len(bad), "bad_lines": [ln for ln, _ in bad[:1000]], "warnings": warnings},
    }
    with TraceWriter(out_dir, manifest, n_embd_backbone=None, n_embd=None, hidden_dtype=None,
                     centroids=False, compact=False, overwrite=overwrite) as w:
        step_off = np.concatenate([[0], np.cumsum(nd)])
        for a in range(0, n, ROUNDS_PER_PART):
            b = min(a + ROUNDS_PER_PART, n)
            w.write_tables(rounds.slice(a, b - a), steps.slice(int(step_off[a]), int(step_off[b] - step_off[a])))
    return ImportResult(str(path), str(out_dir), "fork-ndjson", n_lines, n_used, n_ignored, len(bad),
                        tuple(bad), tuple(warnings), n_rounds=n, n_steps=len(flat_tokens),
                        n_dropped=len(unmatched_drafts) + len(unmatched_accepts))
