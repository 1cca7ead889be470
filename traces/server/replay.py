"""``mtpscope probe … --replay``: record a probe's prompts with mtpscope's own recorder and compare, request by
request, with what the server did.

The recording gets exactly the token ids the server got (the probe trace's ``manifest.prompts[i].tokens``), the
same GGUFs (the target from ``/props`` ``model_path`` unless given; the assistant must be given: the server
does not report its draft model), and the settings the server reports or shows:

* draft max (``n_draft``): the number of per-position counter series in ``/metrics`` (the server sizes it to
  its ``--spec-draft-n-max``), unless given;
* ``max_tokens`` = the probe's ``n_predict``; temperature and seed = the probe's (greedy by default).

With greedy decoding and the same llama.cpp (a server from ``mtpscope server build`` runs the very libraries
the recorder runs) every request must match: same output tokens, same drafted, same accepted. When one does not,
:attr:`ServerReplay.settings` names what differs that mtpscope can see (the server's ``/props`` and counters
against the recording's parameters: draft max / min, p_min, KV cache types, flash attention, batch sizes,
parallel slots, context size, sampling, the llama.cpp build), settings the server does not report being marked
so, and :attr:`ServerReplay.first_difference` points at the first request whose counts or output differ, with
the recorded trace and its prompt for ``mtpscope explain DIR --prompt P`` and the app's Step view.

Output: the recording in ``<probe trace>/replay/`` (a normal trace, source ``record``) and the comparison in
``<probe trace>/replay.json``.

Imports: traces (the recorder, prompts, the trace reader, ``analysis.requests``), pandas, errors.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from mtpscope.errors import ServerError, TraceError
from mtpscope.traces.analysis.records import JsonRecord
from mtpscope.traces.analysis.requests import (
    RequestPair,
    compare_requests,
    request_pairs,
    request_rows,
    requests_from_rounds,
)
from mtpscope.traces.run.prompts import PromptSpec
from mtpscope.traces.server.probe import SOURCE as PROBE_SOURCE
from mtpscope.traces.store.reader import open_trace

REPLAY_DIR = "replay"
REPLAY_JSON = "replay.json"
#: what llama-server does not report over HTTP (its command line / log says it); the recorder's value is shown
NOT_REPORTED = "not reported by the server"


@dataclass(frozen=True)
class ReplayCounts(JsonRecord):
    """Drafted and accepted tokens of one request on one side of :class:`FirstDifference` (as the comparison
    table has them)."""

    drafted: Any
    accepted: Any


@dataclass(frozen=True)
class FirstDifference(JsonRecord):
    """The first request whose counts or output differ (:attr:`ServerReplay.first_difference`).

    Attributes:
        request: its number in the probe; prompt / prompt_id: its prompt (None when the recording has no rounds
            for it); server / recording: :class:`ReplayCounts` of each side (None then too); same_output: the
            outputs equal (None when unknown); recording_trace: the recording's folder; recording_prompt_id: the
            prompt's id in the recording (the Step view's); explain: the command line that explains it.
    """

    request: int
    prompt: Any
    prompt_id: int | None
    server: ReplayCounts | None
    recording: ReplayCounts | None
    same_output: bool | None
    recording_trace: str
    recording_prompt_id: int | None
    explain: str


@dataclass(frozen=True)
class SettingRow(JsonRecord):
    """One setting side by side.

    Attributes:
        setting: its name in llama.cpp's words.
        server: the server's value (``/props``, ``/metrics``, the probe's request), or :data:`NOT_REPORTED`.
        recording: the recording's value.
        same: True / False, or None when the server does not report it.
    """

    setting: str
    server: Any
    recording: Any
    same: bool | None


@dataclass(frozen=True)
class ServerReplay:
    """The outcome of :func:`replay_probe`.

    Attributes:
        probe: the probe trace.
        recording: the recorded trace (``<probe>/replay``).
        table: one row per compared request (:func:`mtpscope.traces.analysis.requests.compare_requests`, A = the
            server, B = the recording): prompt, request, drafted / accepted on both sides, same_counts,
            same_output.
        settings: :class:`SettingRow` per setting.
        first_difference: the first request whose counts or output differ (:class:`FirstDifference`); None when
            all agree.
    """

    probe: str
    recording: str
    table: pd.DataFrame
    settings: tuple[SettingRow, ...]
    first_difference: FirstDifference | None

    @property
    def all_equal(self) -> bool:
        """Every compared request has the same counts and the same output."""
        return self.first_difference is None and len(self.table) > 0

    @property
    def requests(self) -> tuple[RequestPair, ...]:
        """:attr:`table`'s rows as records (:func:`mtpscope.traces.analysis.requests.request_pairs`)."""
        return request_pairs(self.table)

    def to_dict(self) -> dict[str, Any]:
        """``probe --replay --json``'s ``replay`` and ``replay.json``: probe, recording, all_equal, requests (the
        table's rows), settings, first_difference."""
        return {"probe": self.probe, "recording": self.recording, "all_equal": self.all_equal,
                "requests": [r.to_dict() for r in self.requests], "settings": [s.to_dict() for s in self.settings],
                "first_difference": None if self.first_difference is None else self.first_difference.to_dict()}


def server_n_draft(manifest: dict[str, Any]) -> int | None:
    """The server's draft max as its counters show it: the per-position series' count after the probe (None
    when the probe had no ``/metrics`` or nothing was drafted)."""
    after = ((manifest.get("counters") or {}).get("after") or {}).get("accepted_per_pos")
    return len(after) if after else None


def _props(manifest: dict[str, Any]) -> dict[str, Any]:
    return ((manifest.get("server") or {}).get("props")) or {}


def settings_table(probe_manifest: dict[str, Any], record_manifest: dict[str, Any]) -> tuple[SettingRow, ...]:
    """The settings of the server (as the probe saw them) against a recording's (see the module docstring)."""
    props = _props(probe_manifest)
    pp = probe_manifest.get("params") or {}
    rp = record_manifest.get("params") or {}
    runtime = record_manifest.get("runtime") or {}
    models = record_manifest.get("models") or {}
    build = props.get("build_info")
    rec_build = runtime.get("llama_cpp")
    rows = [
        SettingRow("llama.cpp build", build, rec_build,
                   None if not build or not rec_build else str(build).endswith("-" + str(rec_build))),
        SettingRow("target model", props.get("model_path"), (models.get("target") or {}).get("path"),
                   None if not props.get("model_path") else
                   _same_file(props.get("model_path"), (models.get("target") or {}).get("path"))),
        SettingRow("draft model", NOT_REPORTED, (models.get("assistant") or {}).get("path"), None),
        SettingRow("draft max (--spec-draft-n-max)", server_n_draft(probe_manifest) or NOT_REPORTED,
                   rp.get("n_draft"), None if server_n_draft(probe_manifest) is None else
                   server_n_draft(probe_manifest) == rp.get("n_draft")),
        SettingRow("draft min (--spec-draft-n-min)", NOT_REPORTED, 0, None),
        SettingRow("draft p_min (--spec-draft-p-min)", NOT_REPORTED, 0.0, None),
        SettingRow("n_predict / max_tokens", pp.get("n_predict"), rp.get("max_tokens"),
                   pp.get("n_predict") == rp.get("max_tokens")),
        SettingRow("temperature", pp.get("temperature"), rp.get("temp"),
                   _num_eq(pp.get("temperature"), rp.get("temp"))),
        SettingRow("seed", pp.get("seed"), rp.get("seed"),
                   None if (pp.get("temperature") or 0) <= 0 else pp.get("seed") == rp.get("seed")),
        SettingRow("parallel slots (--parallel)", props.get("total_slots"), 1,
                   None if props.get("total_slots") is None else props.get("total_slots") == 1),
        SettingRow("context size per slot (n_ctx)", props.get("n_ctx"), rp.get("n_ctx"), None),
        SettingRow("flash attention (--flash-attn)", NOT_REPORTED, "off" if not rp.get("flash_attn") else "on", None),
        SettingRow("KV cache types (--cache-type-k / -v)", NOT_REPORTED, "f16 / f16", None),
        SettingRow("batch sizes (--batch-size / --ubatch-size)", NOT_REPORTED, "256 / 256 (prompt chunks)", None),
    ]
    return tuple(rows)


def _num_eq(a: Any, b: Any) -> bool | None:
    try:
        fa, fb = float(a), float(b)
    except (TypeError, ValueError):
        return None
    return (fa <= 0 and fb <= 0) or fa == fb


def _same_file(a: Any, b: Any) -> bool | None:
    try:
        return os.path.samefile(a, b)
    except (OSError, TypeError):
        return None if a is None or b is None else os.path.basename(str(a)) == os.path.basename(str(b))


def replay_probe(probe_dir: str | os.PathLike[str], *, assistant: str | os.PathLike[str],
                 target: str | os.PathLike[str] | None = None, requests: Sequence[int] | None = None,
                 n_draft: int | None = None, out: str | os.PathLike[str] | None = None,
                 isolate: bool | None = None, command: Sequence[str] | None = None) -> ServerReplay:
    """Record the probe's prompts (those of ``requests``, default all) and compare (module docstring).

    Args:
        probe_dir: a probe trace (source ``server-probe``).
        assistant: the drafter GGUF the server ran (``-md``).
        target: the target GGUF (default: ``/props`` ``model_path`` as the probe saw it).
        requests: request numbers to replay (default every request of the probe).
        n_draft: the server's draft max when its counters do not show it.
        out: the recording's folder (default ``<probe_dir>/replay``; replaced).
        isolate: passed to the recorder (default: a worker process).
        command: argv for the recording's manifest.

    Raises:
        TraceError: ``probe_dir`` is not a probe trace, has no requests, or lacks the prompts' token ids.
        ServerError: the target or draft max cannot be told (names what to pass).
        MtpscopeError / RuntimeAbortedError: from the recorder.
    """
    from mtpscope.traces.run.record_config import RecordConfig
    from mtpscope.traces.run.recorder import record

    probe_dir = Path(probe_dir)
    t = open_trace(probe_dir)
    if t.manifest.get("source") != PROBE_SOURCE:
        raise TraceError("not a probe trace", path=probe_dir, key="source", expected=PROBE_SOURCE,
                         actual=t.manifest.get("source"))
    rows = request_rows(t.requests)
    if requests is not None:
        want = {int(r) for r in requests}
        unknown = sorted(want - {int(r) for r in rows["request"]})
        if unknown:
            raise TraceError("no such request in the probe trace", path=probe_dir, key="request",
                             expected=f"0..{len(rows) - 1}", actual=unknown[0])
        rows = rows[rows["request"].isin(want)]
    if not len(rows):
        raise TraceError("the probe trace has no answered request to replay", path=probe_dir)
    prompts = {int(p["prompt_id"]): p for p in t.manifest.get("prompts") or []}
    pids = list(dict.fromkeys(int(p) for p in rows["prompt_id"]))
    specs = []
    for pid in pids:
        p = prompts.get(pid)
        if p is None or not isinstance(p.get("tokens"), list) or not p["tokens"]:
            raise TraceError("the probe trace lacks the token ids of a prompt", path=probe_dir,
                             key=f"prompts[{pid}].tokens", expected="the ids the server got", actual="missing")
        specs.append(PromptSpec(tokens=tuple(int(x) for x in p["tokens"]), id=str(p.get("prompt", pid)),
                                category=p.get("category")))
    if target is None:
        target = _props(t.manifest).get("model_path")
        if not target or not Path(target).is_file():
            raise ServerError("the server's target model is not a file here: pass --target", key="--target",
                              expected="the GGUF the server runs", actual=target or "not reported")
    k = n_draft if n_draft is not None else server_n_draft(t.manifest)
    if k is None:
        raise ServerError("the server's draft max is not known (its /metrics showed no per-position counter): "
                          "pass --n-draft", key="--n-draft")
    pp = t.manifest.get("params") or {}
    rec_dir = Path(out) if out is not None else probe_dir / REPLAY_DIR
    cfg = RecordConfig(n_draft=int(k), max_tokens=int(pp.get("n_predict") or 128),
                       temp=float(pp.get("temperature") or 0.0), seed=int(pp.get("seed") or 0), hidden="off")
    record(cfg, target=target, assistant=assistant, out=rec_dir, prompts=specs, overwrite=True, isolate=isolate,
           command=list(command) if command is not None else None)
    rec = open_trace(rec_dir)
    rec_rows = requests_from_rounds(rec.rounds, rec.manifest.get("prompts"))
    table = compare_requests(rows, rec_rows, reuse_b=True)
    rec_pid = {str(p.get("id")): int(p["prompt_id"]) for p in rec.manifest.get("prompts") or []}
    first = None
    for r in table.to_dict(orient="records"):
        if not r["same_counts"] or r["same_output"] is False:
            pid = next(int(x["prompt_id"]) for x in rows.to_dict(orient="records") if x["request"] == r["request_a"])
            first = FirstDifference(
                request=int(r["request_a"]), prompt=r["prompt"], prompt_id=pid,
                server=ReplayCounts(r["drafted_a"], r["accepted_a"]),
                recording=ReplayCounts(r["drafted_b"], r["accepted_b"]), same_output=r["same_output"],
                recording_trace=os.fspath(rec_dir), recording_prompt_id=rec_pid.get(str(r["prompt"])),
                explain=f"mtpscope explain {os.fspath(rec_dir)} --prompt {rec_pid.get(str(r['prompt']))}")
            break
    missing = {int(x) for x in rows["request"]} - {int(x) for x in table["request_a"]}
    if missing and first is None:
        req = min(missing)
        first = FirstDifference(request=req, prompt=None, prompt_id=None, server=None, recording=None,
                                same_output=None, recording_trace=os.fspath(rec_dir), recording_prompt_id=None,
                                explain="the recording has no rounds for this request's prompt")
    res = ServerReplay(os.fspath(probe_dir), os.fspath(rec_dir), table, settings_table(t.manifest, rec.manifest),
                       first)
    (probe_dir / REPLAY_JSON).write_text(json.dumps(res.to_dict(), indent=2, default=str) + "\n")
    return res


__all__ = ["NOT_REPORTED", "REPLAY_DIR", "REPLAY_JSON", "FirstDifference", "ReplayCounts", "ServerReplay",
           "SettingRow", "replay_probe",
           "server_n_draft", "settings_table"]
