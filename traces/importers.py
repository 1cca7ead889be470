"""Importers: foreign logs -> trace directories.

* :func:`import_fork_ndjson` reads the NDJSON the fork writes when ``LLAMA_MTP_ACC_TRACE`` is set::

      {"evt":"mtp_draft","iter":12,"path":"sync","seq_id":0,"id_last":818,"h_idx":0,"attn_pos":57,
       "n_steps":3,"h_l2":93.1,"drafts":[236743,532,19]}
      {"evt":"mtp_accept","iter":12,"n_accepted":2,"n_drafted_prev":3}

  Draft and accept events are joined on ``iter``. Each joined pair is one round: ``pending_token`` =
  ``id_last``, ``pos`` = ``attn_pos``, ``drafted`` = ``drafts``, ``n_accepted`` from the accept event,
  ``draft_path`` = ``path``, ``h_l2`` = ``h_l2``. The log has no target tokens, emitted tokens,
  logits or timings: those columns are null (never invented). Steps get ``k``, ``token`` and
  ``accepted`` (``k <= n_accepted``) only. The fork counts ``iter`` per sequence and advances it at
  each accept, so a second draft at the same ``iter`` means the first was never verified (it is
  reported, not imported). The file is appended across runs: ``iter`` going backwards for a
  ``seq_id`` starts a new run (*segment*). The log marks no request boundaries; within one
  (segment, ``seq_id``) stream a new prompt starts where ``attn_pos`` goes down (positions only grow
  within one generation), so ``prompt_id`` counts such streams/requests, and ``manifest.prompts``
  records ``seq_id``, ``segment`` and ``first_line`` for each. Accept events carry no ``seq_id``:
  with several slots an accept is paired with the oldest open draft of the same ``iter`` (warned).
  Lines may carry a log prefix (stderr capture): the JSON object is taken from the first ``{"evt"``.
  Lines that neither start with ``{`` / ``[`` nor contain ``{"evt"`` (other log output) and events of
  other kinds are ignored and counted; every other line that cannot be used (invalid JSON, not an
  object, no ``evt``, missing or mistyped fields, more accepted than drafted) is *bad* and reported
  with its line number.

* :func:`import_server_log` reads llama-server output: the per-slot line
  ``draft acceptance rate = 0.57143 (  4 accepted /   7 generated)`` (newer servers:
  ``draft acceptance = ... , mean len = 1.57``), with the slot prefix ``id N | task M |`` when present (the
  vendored server prints it after a log prefix such as ``0.35.364.818 I slot print_timing:``), the
  ``prompt eval time`` / ``eval time`` lines before it (tokens and milliseconds, tokens per second),
  and per-response JSON with ``timings.draft_n`` / ``timings.draft_n_accepted`` (a JSON object per line,
  optionally after ``data: `` as in streamed responses). Each becomes one row of ``requests``
  (schema ``traces.schema.REQUESTS_SCHEMA``); rounds and steps stay empty.

Both return an :class:`ImportResult` and raise :class:`ImportFormatError` when not a single line
could be used.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from mtpscope.errors import ImportFormatError
from mtpscope.traces.store import schema as S
from mtpscope.traces.store.store import TraceWriter

ROUNDS_PER_PART = 65536
MAX_LISTED = 10          # line numbers listed per warning


@dataclass(frozen=True)
class ImportResult:
    """What an import read and wrote.

    Attributes:
        path: the source file.
        out_dir: the trace directory written.
        source: ``"fork-ndjson"`` or ``"server-log"``.
        n_lines: lines in the file.
        n_used: lines that went into the trace.
        n_ignored: lines that are not trace data (other log output, other event kinds); not errors.
        n_bad: lines that looked like trace data but could not be used.
        bad_lines: ``(line number (1-based), reason)`` for every bad line.
        warnings: other findings (unmatched events, inconsistent counts), each naming line numbers.
        n_rounds, n_steps, n_requests: rows written.
    """

    path: str
    out_dir: str
    source: str
    n_lines: int
    n_used: int
    n_ignored: int
    n_bad: int
    bad_lines: tuple[tuple[int, str], ...]
    warnings: tuple[str, ...]
    n_rounds: int = 0
    n_steps: int = 0
    n_requests: int = 0


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise ImportFormatError("no such file", path=path) from None
    except IsADirectoryError:
        raise ImportFormatError("is a directory, not a log file", path=path) from None
    with fh:
        for i, raw in enumerate(fh, start=1):
            yield i, raw.decode("utf-8", errors="replace").rstrip("\r\n")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _listed(nums: list[int]) -> str:
    head = ", ".join(map(str, nums[:MAX_LISTED]))
    return head + (f", ... ({len(nums)} in all)" if len(nums) > MAX_LISTED else "")


_I32 = (-(2 ** 31), 2 ** 31 - 1)


def _in_i32(v: int) -> bool:
    return _I32[0] <= v <= _I32[1]


# ============================================================================ fork NDJSON
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
    try:
        obj = json.loads(candidate)
    except json.JSONDecodeError as e:
        return "bad", f"invalid JSON ({e.msg} at column {e.colno})"
    except RecursionError:
        return "bad", "JSON nested too deeply"
    if not isinstance(obj, dict):
        return "bad", f"not a JSON object ({type(obj).__name__})"
    evt = obj.get("evt")
    if evt is None:
        return "bad", "no 'evt' field"
    if evt not in ("mtp_draft", "mtp_accept"):
        return "ignored", None
    if not _is_int(obj.get("iter")) or not -(2 ** 63) <= obj["iter"] < 2 ** 63:
        return "bad", f"{evt}: 'iter' missing or not a 64-bit integer"
    if evt == "mtp_draft":
        drafts = obj.get("drafts")
        if not isinstance(drafts, list) or not all(_is_int(t) and 0 <= t <= _I32[1] for t in drafts):
            return "bad", "mtp_draft: 'drafts' missing or not a list of token ids"
        for key in ("id_last", "attn_pos"):
            if not _is_int(obj.get(key)) or not _in_i32(obj[key]):
                return "bad", f"mtp_draft: '{key}' missing or not an integer"
        if "seq_id" in obj and not (_is_int(obj["seq_id"]) and _in_i32(obj["seq_id"])):
            return "bad", "mtp_draft: 'seq_id' not a 32-bit integer"
        if "path" in obj and not isinstance(obj["path"], str):
            return "bad", "mtp_draft: 'path' not a string"
        if obj.get("h_l2") is not None and not _is_num(obj["h_l2"]):
            return "bad", "mtp_draft: 'h_l2' not a finite number"
    else:
        na = obj.get("n_accepted")
        if not _is_int(na) or not 0 <= na <= _I32[1]:
            return "bad", "mtp_accept: 'n_accepted' missing or not a non-negative 32-bit integer"
        ndp = obj.get("n_drafted_prev")
        if ndp is not None and not (_is_int(ndp) and _in_i32(ndp)):
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
    joined: list[tuple[int, int, int, dict, int]] = []
    pending: dict[int, deque] = {}                 # iter -> FIFO of (line, draft, seq_id, segment)
    last_iter: dict[int, int] = {}                 # seq_id -> iter of its last draft
    segment_of: dict[int, int] = {}                # seq_id -> runs seen so far - 1
    unmatched_drafts: list[int] = []
    unmatched_accepts: list[int] = []
    prev_mismatch: list[int] = []
    n_used = 0

    def drop(entry: tuple[int, dict, int, int]) -> None:
        ln, d, sid, seg = entry
        if d["drafts"]:
            unmatched_drafts.append(ln)
        else:                     # nothing drafted: n_accepted is 0 by definition
            joined.append((ln, sid, seg, d, 0))

    def drop_pending(pred) -> None:  # noqa: ANN001
        for it in list(pending):
            keep = deque()
            for e in pending[it]:
                if pred(it, e):
                    drop(e)
                else:
                    keep.append(e)
            if keep:
                pending[it] = keep
            else:
                del pending[it]

    for ln, line in _lines(path):
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
                drop_pending(lambda _it, e, sid=sid: e[2] == sid)
                segment_of[sid] += 1
            elif sid in last_iter and it == last_iter[sid]:
                # the fork counts iter per accept: a second draft at the same iter means the
                # previous one was never verified
                drop_pending(lambda _it, e, sid=sid, it=it: e[2] == sid and _it == it)
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
    cols: dict[str, list] = {name: [] for name in S.ROUNDS_COLUMNS}
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
                        f"(not imported; lines {_listed(unmatched_drafts)})")
    if unmatched_accepts:
        warnings.append(f"{path}: {len(unmatched_accepts)} mtp_accept events without an mtp_draft "
                        f"(lines {_listed(unmatched_accepts)})")
    if prev_mismatch:
        warnings.append(f"{path}: {len(prev_mismatch)} mtp_accept events whose n_drafted_prev differs from "
                        f"the joined draft's length (lines {_listed(prev_mismatch)})")
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
                        tuple(bad), tuple(warnings), n_rounds=n, n_steps=len(flat_tokens))


# ============================================================================ llama-server logs
_RATE_RE = re.compile(
    r"draft acceptance(?: rate)?\s*=\s*(?P<rate>[-+0-9.eEnaif]+)\s*\(\s*(?P<acc>\d+)\s+accepted\s*/\s*"
    r"(?P<gen>\d+)\s+generated\s*\)(?:\s*,\s*mean len\s*=\s*(?P<mal>[-+0-9.eE]+))?")
_SLOT_RE = re.compile(r"\bid\s+(?P<slot>\d+)\s*\|\s*task\s+(?P<task>-?\d+)\s*\|")
#: ``common_speculative_print_stats`` (common/speculative.cpp): one line per speculative type
_STATS_RE = re.compile(
    r"statistics\s+(?P<type>[\w.-]+):\s*#calls\(b,g,a\)\s*=\s*(?P<cb>\d+)\s+(?P<cg>\d+)\s+(?P<ca>\d+)\s*,"
    r"\s*#gen drafts\s*=\s*(?P<gd>\d+)\s*,\s*#acc drafts\s*=\s*(?P<ad>\d+)\s*,"
    r"\s*#gen tokens\s*=\s*(?P<gt>\d+)\s*,\s*#acc tokens\s*=\s*(?P<at>\d+)"
    r"(?P<rest>.*)$")
#: ``print_timing`` (tools/server/server-context.cpp): ``prompt eval time = 86.38 ms / 13 tokens (6.64 ms per token,
#: 150.49 tokens per second)`` and the same for ``eval time`` (generation)
_EVAL_RE = re.compile(
    r"(?P<prompt>prompt\s+)?eval time\s*=\s*(?P<ms>[-+0-9.eE]+)\s*ms\s*/\s*(?P<n>\d+)\s+tokens"
    r"(?:\s*\(\s*[-+0-9.eE]+\s*ms per token,\s*(?P<tps>[-+0-9.eE]+|inf|nan)\s*tokens per second\s*\))?")
_DUR_RE = re.compile(r"dur\(b,g,a\)\s*=\s*(?P<b>[-+0-9.eE]+)\s*,\s*(?P<g>[-+0-9.eE]+)\s*,\s*(?P<a>[-+0-9.eE]+)\s*ms")
#: speculative types whose statistics describe an MTP drafter
_MTP_SPEC_TYPES = ("draft-mtp", "mtp")
_STATS_COLUMNS = ("spec_type", "n_calls_begin", "n_calls_draft", "n_calls_accept", "n_gen_drafts", "n_acc_drafts",
                  "n_gen_tokens", "n_acc_tokens", "t_begin_ms", "t_draft_ms", "t_accept_ms")


def _stats_fields(m: re.Match[str]) -> dict[str, Any] | str:
    """The request-row fields of one ``statistics`` line, or the reason it is bad."""
    ints = [int(m[g]) for g in ("cb", "cg", "ca", "gd", "ad", "gt", "at")]
    if not all(_in_i32(v) for v in ints):
        return "statistics counter does not fit int32"
    if ints[4] > ints[3] or ints[6] > ints[5]:
        return f"statistics: more accepted than generated ({ints[4]} / {ints[3]} drafts, {ints[6]} / {ints[5]} tokens)"
    out: dict[str, Any] = dict(zip(_STATS_COLUMNS[1:8], ints, strict=True))
    out["spec_type"] = m["type"]
    d = _DUR_RE.search(m["rest"] or "")
    for key, g in (("t_begin_ms", "b"), ("t_draft_ms", "g"), ("t_accept_ms", "a")):
        out[key] = float(d[g]) if d else None
    return out


def _response_row(obj: dict, ln: int) -> tuple[str, Any]:
    timings = obj.get("timings")
    if not isinstance(timings, dict):
        return "ignored", None
    if "draft_n" not in timings and "draft_n_accepted" not in timings:
        return "ignored", None                       # a response without speculative decoding
    dn, da = timings.get("draft_n"), timings.get("draft_n_accepted")
    if not (_is_int(dn) and _is_int(da)) or not (0 <= dn <= _I32[1] and 0 <= da <= _I32[1]):
        return "bad", "timings.draft_n / draft_n_accepted missing or not non-negative 32-bit integers"
    if da > dn:
        return "bad", f"timings.draft_n_accepted {da} exceeds draft_n {dn}"

    def num(key: str, integer: bool = False) -> Any:
        v = timings.get(key)
        if integer:
            return v if _is_int(v) and _in_i32(v) else None
        return float(v) if _is_num(v) else None

    slot = obj.get("id_slot")
    return "ok", {"line": ln, "kind": "response", "id_slot": slot if _is_int(slot) and _in_i32(slot) else None,
                  "id_task": None, "n_drafted": dn, "n_accepted": da,
                  "acceptance_rate": da / dn if dn else None, "mean_acceptance_length": None,
                  "prompt_n": num("prompt_n", True), "prompt_ms": num("prompt_ms"),
                  "predicted_n": num("predicted_n", True), "predicted_ms": num("predicted_ms"),
                  "tokens_per_s": num("predicted_per_second")}


def import_server_log(path: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                      overwrite: bool = False) -> ImportResult:
    """Import a llama-server log (and/or per-response JSON) as per-request rows (source ``server-log``).

    Each acceptance-rate log line gives a ``kind="log"`` row; each JSON object with ``timings.draft_n``
    gives a ``kind="response"`` row. A log line whose printed rate disagrees with ``accepted / generated``
    by more than its 5 printed decimals allow is bad.

    Which request a log line is: its own ``id N | task M |`` prefix; with task ``-1`` (the slot had
    already released its task) the last task seen on that slot; without a prefix (older servers print
    the line after the timing lines) the most recent ``id N | task M |`` line, however many timing or
    statistics lines stand between them. The ``prompt eval time`` / ``eval time`` lines of the same request
    (same slot and task, found the same way) give ``prompt_n`` / ``prompt_ms`` / ``predicted_n`` /
    ``predicted_ms`` / ``tokens_per_s``. A ``statistics draft-mtp:`` (or ``statistics mtp:``) line
    that follows goes into the same row (``spec_type``, ``n_calls_*``, ``n_gen_*`` / ``n_acc_*``,
    ``t_*_ms``); statistics of other speculative types are ignored.

    Raises:
        ImportFormatError: the file is missing or holds no usable line.
        TraceError: ``out_dir`` already holds a trace and ``overwrite`` is false.
    """
    path = Path(path)
    rows: list[dict] = []
    bad: list[tuple[int, str]] = []
    n_lines = n_ignored = 0
    last_slot: tuple[int, int] | None = None         # the most recent (slot, task) prefix
    slot_task: dict[int, int] = {}                    # per slot: its last task id >= 0
    last_log: dict | None = None                      # the last acceptance row (statistics go there)
    n_stats = 0                                       # statistics lines merged into a row
    timing: dict[tuple[int, int] | None, dict[str, Any]] = {}   # (slot, task) -> its eval-time numbers so far
    n_timing = 0                                      # eval-time lines merged into a row
    for ln, line in _lines(path):
        n_lines = ln
        s = line.strip()
        if not s:
            continue
        if s.startswith("data:"):
            s = s[5:].strip()
        if s.startswith("{"):
            try:
                obj = json.loads(s)
            except json.JSONDecodeError as e:
                if "timings" in s or "draft_n" in s:
                    bad.append((ln, f"invalid JSON ({e.msg} at column {e.colno})"))
                else:
                    n_ignored += 1
                continue
            except RecursionError:
                bad.append((ln, "JSON nested too deeply"))
                continue
            if not isinstance(obj, dict):
                n_ignored += 1
                continue
            kind, val = _response_row(obj, ln)
            if kind == "ok":
                rows.append(val)
            elif kind == "bad":
                bad.append((ln, val))
            else:
                n_ignored += 1
            continue
        slot_m = _SLOT_RE.search(s)
        eval_m = _EVAL_RE.search(s) if "eval time" in s else None
        if eval_m is not None:
            key = last_slot
            if slot_m and _in_i32(int(slot_m["slot"])) and _in_i32(int(slot_m["task"])):
                sl, tk = int(slot_m["slot"]), int(slot_m["task"])
                if tk >= 0:
                    slot_task[sl] = tk
                key = (sl, tk if tk >= 0 else slot_task.get(sl, tk))
                last_slot = key
            n, ms = int(eval_m["n"]), float(eval_m["ms"])
            if not _in_i32(n) or not math.isfinite(ms):
                bad.append((ln, "eval time: token count or milliseconds out of range"))
                continue
            t = timing.setdefault(key, {})
            if eval_m["prompt"]:
                t.update(prompt_n=n, prompt_ms=ms)
            else:
                tps = float(eval_m["tps"]) if eval_m["tps"] else None
                t.update(predicted_n=n, predicted_ms=ms, tokens_per_s=tps if tps is not None and math.isfinite(tps)
                         else None)
            n_timing += 1
            continue
        stats_m = _STATS_RE.search(s) if "statistics" in s else None
        if stats_m is not None:
            if stats_m["type"] not in _MTP_SPEC_TYPES or last_log is None or last_log["spec_type"] is not None:
                n_ignored += 1           # another drafter type, or no acceptance line to attach it to
                continue
            fields = _stats_fields(stats_m)
            if isinstance(fields, str):
                bad.append((ln, fields))
                continue
            last_log.update(fields)
            n_stats += 1
            continue
        if "draft acceptance" in s:
            m = _RATE_RE.search(s)
            if not m:
                bad.append((ln, "acceptance line not in the form "
                                "'draft acceptance rate = R (A accepted / G generated)'"))
                continue
            acc, gen = int(m["acc"]), int(m["gen"])
            try:
                rate = float(m["rate"])
            except ValueError:
                bad.append((ln, f"rate {m['rate']!r} is not a number"))
                continue
            if acc > gen:
                bad.append((ln, f"{acc} accepted exceeds {gen} generated"))
                continue
            if gen and not abs(rate - acc / gen) <= 6e-6:
                bad.append((ln, f"printed rate {m['rate']} disagrees with {acc} / {gen} = {acc / gen:.5f}"))
                continue
            if not _in_i32(gen):
                bad.append((ln, f"{gen} generated does not fit int32"))
                continue
            slot = task = None
            if slot_m:
                slot, task = int(slot_m["slot"]), int(slot_m["task"])
                if not (_in_i32(slot) and _in_i32(task)):
                    bad.append((ln, f"slot id {slot} / task id {task} does not fit int32"))
                    continue
                if task < 0:
                    task = slot_task.get(slot)
            elif last_slot is not None:
                slot, task = last_slot
            last_log = {"line": ln, "kind": "log", "id_slot": slot, "id_task": task,
                        "n_drafted": gen, "n_accepted": acc, "acceptance_rate": acc / gen if gen else None,
                        "mean_acceptance_length": float(m["mal"]) if m["mal"] else None,
                        "prompt_n": None, "prompt_ms": None, "predicted_n": None, "predicted_ms": None,
                        "tokens_per_s": None, **dict.fromkeys(_STATS_COLUMNS),
                        **timing.pop((slot, task) if slot is not None else None, {})}
            rows.append(last_log)
            continue
        if slot_m and _in_i32(int(slot_m["slot"])) and _in_i32(int(slot_m["task"])):
            sl, tk = int(slot_m["slot"]), int(slot_m["task"])
            if tk >= 0:
                slot_task[sl] = tk
                last_slot = (sl, tk)
            elif sl in slot_task:
                last_slot = (sl, slot_task[sl])
        n_ignored += 1

    if not rows:
        first = f"; first bad line {bad[0][0]}: {bad[0][1]}" if bad else ""
        raise ImportFormatError(
            f"no draft-acceptance line or response timings found ({n_lines} lines: {len(bad)} bad, "
            f"{n_ignored} ignored){first}", path=path,
            expected="'draft acceptance rate = ...' lines or JSON with timings.draft_n", actual="none")
    for i, r in enumerate(rows):
        r["request"] = i
    requests = pa.Table.from_pylist(rows, schema=S.REQUESTS_SCHEMA)
    kinds = sorted({r["kind"] for r in rows})
    warnings = []
    if len(kinds) == 2:
        warnings.append(f"{path}: both log lines and response timings found; they may describe the same "
                        f"requests (the report uses the response rows)")
    manifest = {
        "source": "server-log",
        "command": list(sys.argv),
        "params": {"file": str(path)},
        "prompts": [],
        "import": {"file": str(path), "n_lines": n_lines, "n_used": len(rows) + n_stats + n_timing,
                   "n_ignored": n_ignored, "n_bad": len(bad), "bad_lines": [ln for ln, _ in bad[:1000]],
                   "warnings": warnings},
    }
    with TraceWriter(out_dir, manifest, n_embd_backbone=None, n_embd=None, hidden_dtype=None,
                     centroids=False, compact=False, overwrite=overwrite) as w:
        w.write_tables(None, None, requests)
    return ImportResult(str(path), str(out_dir), "server-log", n_lines, len(rows) + n_stats + n_timing, n_ignored,
                        len(bad),
                        tuple(bad), tuple(warnings), n_requests=len(rows))


__all__ = ["ImportResult", "import_fork_ndjson", "import_server_log"]
