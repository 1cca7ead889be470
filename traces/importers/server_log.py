"""llama-server's log and response JSON -> a trace's ``requests`` table (:func:`import_server_log`; the format: the package docstring)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa

from mtpscope.errors import ImportFormatError
from mtpscope.traces.analysis import rates
from mtpscope.traces.importers.common import (
    DEEP_JSON,
    I32_RANGE,
    ImportResult,
    in_i32,
    is_int,
    is_num,
    json_line,
    read_lines,
    text_float,
    text_i32,
)
from mtpscope.traces.store import schema as S
from mtpscope.traces.store.writer import TraceWriter

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
    parsed = [text_i32(m[g]) for g in ("cb", "cg", "ca", "gd", "ad", "gt", "at")]
    ints = [v for v in parsed if v is not None]
    if len(ints) != len(parsed):
        return "statistics counter does not fit int32"
    if ints[4] > ints[3] or ints[6] > ints[5]:
        return f"statistics: more accepted than generated ({ints[4]} / {ints[3]} drafts, {ints[6]} / {ints[5]} tokens)"
    out: dict[str, Any] = dict(zip(_STATS_COLUMNS[1:8], ints, strict=True))
    out["spec_type"] = m["type"]
    d = _DUR_RE.search(m["rest"] or "")
    for key, g in (("t_begin_ms", "b"), ("t_draft_ms", "g"), ("t_accept_ms", "a")):
        out[key] = text_float(d[g]) if d else None
        if d and (out[key] is None or out[key] < 0):
            return f"statistics: dur(b,g,a): expected finite numbers of ms >= 0, got {_short(d[g])}"
    return out


def _short(text: str) -> str:
    """A number's text as a message quotes it: at most 20 characters (a log can hold any number of digits)."""
    return text if len(text) <= 20 else f"{text[:8]}...({len(text)} characters)"


def _slot_task(m: re.Match[str] | None) -> tuple[int, int] | None:
    """A ``id N | task M |`` prefix's (slot, task), or None without one or when either does not fit int32."""
    if m is None:
        return None
    slot, task = text_i32(m["slot"]), text_i32(m["task"])
    return None if slot is None or task is None else (slot, task)


def _response_row(obj: dict[str, Any], ln: int) -> tuple[str, Any]:
    timings = obj.get("timings")
    if not isinstance(timings, dict):
        return "ignored", None
    if "draft_n" not in timings and "draft_n_accepted" not in timings:
        return "ignored", None                       # a response without speculative decoding
    dn, da = timings.get("draft_n"), timings.get("draft_n_accepted")
    if not (is_int(dn) and is_int(da)) or not (0 <= dn <= I32_RANGE[1] and 0 <= da <= I32_RANGE[1]):
        return "bad", "timings.draft_n / draft_n_accepted missing or not non-negative 32-bit integers"
    if da > dn:
        return "bad", f"timings.draft_n_accepted {da} exceeds draft_n {dn}"

    # token counts and times: absent or null (llama-server writes a non-finite rate as null) is no value; any
    # other value must be one, never stored negative nor dropped silently
    row: dict[str, Any] = {}
    for key, col, integer in (("prompt_n", "prompt_n", True), ("prompt_ms", "prompt_ms", False),
                              ("predicted_n", "predicted_n", True), ("predicted_ms", "predicted_ms", False),
                              ("predicted_per_second", "tokens_per_s", False)):
        v = timings.get(key)
        if v is None:
            row[col] = None
        elif integer and is_int(v) and 0 <= v <= I32_RANGE[1]:
            row[col] = v
        elif not integer and is_num(v) and v >= 0:
            row[col] = float(v)
        else:
            what = "a 32-bit integer >= 0" if integer else "a finite number >= 0"
            return "bad", f"timings.{key}: expected {what} or null, got {_short(json.dumps(v))}"
    slot = obj.get("id_slot")
    return "ok", {"line": ln, "kind": "response", "id_slot": slot if is_int(slot) and in_i32(slot) else None,
                  "id_task": None, "n_drafted": dn, "n_accepted": da,
                  "acceptance_rate": rates.acceptance_rate(da, dn), "mean_acceptance_length": None, **row}


def import_server_log(path: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                      overwrite: bool = False) -> ImportResult:
    """Import a llama-server log (and/or per-response JSON) as per-request rows (source ``server-log``).

    Each acceptance-rate log line with at least one generated draft token gives a ``kind="log"`` row (a
    ``nan (0 accepted / 0 generated)`` line drafted nothing and is no request: it is ignored, and so is the
    statistics line after it); each JSON object with ``timings.draft_n``
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
    rows: list[dict[str, Any]] = []
    bad: list[tuple[int, str]] = []
    n_lines = n_ignored = 0
    last_slot: tuple[int, int] | None = None         # the most recent (slot, task) prefix
    slot_task: dict[int, int] = {}                    # per slot: its last task id >= 0
    last_log: dict[str, Any] | None = None                      # the last acceptance row (statistics go there)
    n_stats = 0                                       # statistics lines merged into a row
    timing: dict[tuple[int, int | None] | None, dict[str, Any]] = {}   # (slot, task) -> its eval-time numbers so far
    n_timing = 0                                      # eval-time lines merged into a row
    n_json_parts = 0                                  # lines of JSON that is not one object per line (`[`, a bad `{`)
    for ln, line in read_lines(path):
        n_lines = ln
        s = line.strip()
        if not s:
            continue
        if s.startswith("data:"):
            s = s[5:].strip()
        if s.startswith("["):                         # (a JSON array of responses: ignored below, and said if nothing reads)
            n_json_parts += 1
        if s.startswith("{"):
            obj, why = json_line(s)
            if why is not None:
                if "timings" in s or "draft_n" in s or why == DEEP_JSON:
                    bad.append((ln, why))
                else:
                    n_ignored += 1
                    n_json_parts += 1
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
        st = _slot_task(slot_m)
        eval_m = _EVAL_RE.search(s) if "eval time" in s else None
        if eval_m is not None:
            key = last_slot
            if st is not None:
                sl, tk = st
                if tk >= 0:
                    slot_task[sl] = tk
                key = (sl, tk if tk >= 0 else slot_task.get(sl, tk))
                last_slot = key
            n, ms = text_i32(eval_m["n"]), text_float(eval_m["ms"])
            if n is None or ms is None or ms < 0:
                bad.append((ln, f"eval time: expected a token count that fits int32 and a finite number of ms >= 0, "
                                f"got {_short(eval_m['n'])} tokens, {_short(eval_m['ms'])} ms"))
                continue
            # llama.cpp prints inf / nan tokens per second for a zero time: no rate, not a bad line
            tps = text_float(eval_m["tps"]) if eval_m["tps"] not in (None, "inf", "nan") else None
            if eval_m["tps"] not in (None, "inf", "nan") and (tps is None or tps < 0):
                bad.append((ln, f"eval time: expected a finite number of tokens per second >= 0, "
                                f"got {_short(eval_m['tps'])}"))
                continue
            t = timing.setdefault(key, {})
            if eval_m["prompt"]:
                t.update(prompt_n=n, prompt_ms=ms)
            else:
                t.update(predicted_n=n, predicted_ms=ms, tokens_per_s=tps)
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
            acc, gen = text_i32(m["acc"]), text_i32(m["gen"])
            try:
                rate = float(m["rate"])
            except ValueError:
                bad.append((ln, f"rate {m['rate']!r} is not a number"))
                continue
            if acc is None or gen is None:
                bad.append((ln, f"{_short(m['acc'])} accepted / {_short(m['gen'])} generated does not fit int32"))
                continue
            if acc > gen:
                bad.append((ln, f"{acc} accepted exceeds {gen} generated"))
                continue
            if gen == 0:
                # `nan (0 accepted / 0 generated)`: a task that drafted nothing (older servers print it as a
                # slot releases); no request of its own, and the statistics / timing lines around it are not
                # another request's
                last_log = None
                gone: tuple[int, int | None] | None = last_slot
                if st is not None:
                    sl, tk = st
                    gone = (sl, tk if tk >= 0 else slot_task.get(sl))
                timing.pop(gone, None)
                n_ignored += 1
                continue
            computed = rates.acceptance_rate(acc, gen)
            if computed is not None and not abs(rate - computed) <= 6e-6:
                bad.append((ln, f"printed rate {m['rate']} disagrees with {acc} / {gen} = {computed:.5f}"))
                continue
            mal = text_float(m["mal"]) if m["mal"] else None
            if m["mal"] and (mal is None or not 1 <= mal <= 1 + acc + 0.005):
                # llama.cpp prints 1 + accepted / verify steps (%5.2f), and 1 <= verify steps <= generated
                bad.append((ln, f"mean len: expected a number from 1 to {1 + acc:.2f} (1 + {acc} accepted), "
                                f"got {_short(m['mal'])}"))
                continue
            slot = task = None
            if slot_m:
                if st is None:
                    bad.append((ln, f"slot id {_short(slot_m['slot'])} / task id {_short(slot_m['task'])} "
                                    f"does not fit int32"))
                    continue
                slot, task = st
                if task < 0:
                    task = slot_task.get(slot)
            elif last_slot is not None:
                slot, task = last_slot
            last_log = {"line": ln, "kind": "log", "id_slot": slot, "id_task": task,
                        "n_drafted": gen, "n_accepted": acc, "acceptance_rate": rates.acceptance_rate(acc, gen),
                        "mean_acceptance_length": mal,
                        "prompt_n": None, "prompt_ms": None, "predicted_n": None, "predicted_ms": None,
                        "tokens_per_s": None, **dict.fromkeys(_STATS_COLUMNS),
                        **timing.pop((slot, task) if slot is not None else None, {})}
            rows.append(last_log)
            continue
        if st is not None:
            sl, tk = st
            if tk >= 0:
                slot_task[sl] = tk
                last_slot = (sl, tk)
            elif sl in slot_task:
                last_slot = (sl, slot_task[sl])
        n_ignored += 1

    if not rows:
        first = f"; first bad line {bad[0][0]}: {bad[0][1]}" if bad else ""
        if n_json_parts:
            first += ("; JSON responses are read one object per line (`jq -c .` writes them so), not pretty-printed "
                      "or as an array")
        raise ImportFormatError(
            f"no draft-acceptance line or response timings found ({n_lines} line{'' if n_lines == 1 else 's'}: {len(bad)} bad, "
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
