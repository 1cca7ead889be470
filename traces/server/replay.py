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

from mtpscope.errors import MtpscopeError, ServerError, TraceError
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


#: why a replayed request differs from the server's (:class:`ReplayVerdict`), in the order they are tried
REASONS = ("tokenization", "EOG rule", "sampler", "slot", "unexplained")
#: what each reason means (docs/SERVER.md has the same words)
REASON_TEXT = {
    "tokenization": "the prompt's token ids differ (server's vs the recording's)",
    "EOG rule": "same output; the counts differ only at a drafted end-of-generation token the target confirmed "
                "(llama.cpp and the recording count it differently)",
    "sampler": "sampling at T > 0: the settings differ or the run is not reproducible",
    "slot": "the request ran concurrently with others on the server; compare it with its solo run "
            "(`probe --check-concurrency N`)",
    "unexplained": "none of the known causes: check the settings marked ≠ or ?",
}


@dataclass(frozen=True)
class ReplayVerdict(JsonRecord):
    """Why one replayed request differs from the server's (:func:`why_differs`).

    Attributes:
        request: the request's number in the probe; prompt: its prompt's id.
        reason: one of :data:`REASONS`.
        round: the recording's first round that differs (0-based ``round``; None when the difference is not in
            a round: the prompt itself, the prefill's token, or counts without per-round data on the server side).
        token: index of the first output token that differs (0 = the prefill's token), None when the outputs
            are equal or unknown.
        detail: the evidence, one sentence.
    """

    request: int
    prompt: Any
    reason: str
    round: int | None
    token: int | None
    detail: str

    def line(self) -> str:
        """One line: ``request R (prompt P) differs from round N (output token T): REASON: detail``."""
        where = "" if self.round is None else f" from round {self.round}"
        tok = "" if self.token is None else f" (output token {self.token})"
        return f"request {self.request} (prompt {self.prompt}) differs{where}{tok}: {self.reason}: {self.detail}"


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
        verdicts: one :class:`ReplayVerdict` per request that differs, in request order (empty: identical).
    """

    probe: str
    recording: str
    table: pd.DataFrame
    settings: tuple[SettingRow, ...]
    first_difference: FirstDifference | None
    verdicts: tuple[ReplayVerdict, ...] = ()

    @property
    def verdict(self) -> str:
        """``"identical"``, or the first differing request's :meth:`ReplayVerdict.line` (never a silent
        mismatch: a request the recording lacks is named too)."""
        if self.all_equal:
            return "identical"
        if self.verdicts:
            return self.verdicts[0].line()
        fd = self.first_difference
        return (f"request {fd.request} differs: {fd.explain}" if fd is not None else
                "nothing to compare: no request was replayed")

    @property
    def all_equal(self) -> bool:
        """Every compared request has the same counts and the same output."""
        return self.first_difference is None and len(self.table) > 0

    @property
    def requests(self) -> tuple[RequestPair, ...]:
        """:attr:`table`'s rows as records (:func:`mtpscope.traces.analysis.requests.request_pairs`)."""
        return request_pairs(self.table)

    def to_dict(self) -> dict[str, Any]:
        """``probe --replay --json``'s ``replay`` and ``replay.json``: probe, recording, all_equal, verdict (the
        line), verdicts, requests (the table's rows), settings, first_difference."""
        return {"probe": self.probe, "recording": self.recording, "all_equal": self.all_equal,
                "verdict": self.verdict, "verdicts": [v.to_dict() for v in self.verdicts],
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


def _replay_spec(p: dict[str, Any], pid: int, prompt_form: str) -> PromptSpec:
    """The recorder's prompt for the probe's manifest entry ``p`` (see :func:`replay_probe`'s ``prompt_form``)."""
    ident, cat = str(p.get("prompt", pid)), p.get("category")
    if prompt_form == "given":
        src = p.get("source") or "text"
        if src == "messages" and isinstance(p.get("messages"), list):
            return PromptSpec(messages=tuple(dict(m) for m in p["messages"]), id=ident, category=cat)
        if src == "text" and isinstance(p.get("text"), str):
            return PromptSpec(text=p["text"], id=ident, category=cat)
    return PromptSpec(tokens=tuple(int(x) for x in p["tokens"]), id=ident, category=cat)


def _overlapping(rows: pd.DataFrame) -> dict[int, int]:
    """Per request number: how many other requests of the probe were in flight while it was (its [sent,
    answered] interval overlaps theirs; 0 without ``ended_unix_s``)."""
    spans: list[tuple[int, float | None, float | None]] = []
    for r in rows.to_dict(orient="records"):
        s0, e0 = r.get("started_unix_s"), r.get("ended_unix_s")
        if s0 is not None and e0 is not None and s0 == s0 and e0 == e0:
            spans.append((int(r["request"]), float(s0), float(e0)))
        else:
            spans.append((int(r["request"]), None, None))
    out: dict[int, int] = {}
    for q, s0, e0 in spans:
        out[q] = 0 if s0 is None or e0 is None else sum(
            1 for q2, s1, e1 in spans if q2 != q and s1 is not None and e1 is not None and s1 < e0 and s0 < e1)
    return out


def _verdicts(t: Any, rows: pd.DataFrame, table: pd.DataFrame, rec: Any, rec_rows: pd.DataFrame,
              settings: Sequence[SettingRow]) -> tuple[ReplayVerdict, ...]:
    """:func:`why_differs` for every compared request that differs, in request order."""
    pp = t.manifest.get("params") or {}
    temp = float(pp.get("temperature") or 0.0)
    seed = pp.get("seed")
    probe_ids = {int(p["prompt_id"]): p.get("tokens") for p in t.manifest.get("prompts") or []}
    rec_meta = {str(p.get("id", p.get("prompt_id"))): p for p in rec.manifest.get("prompts") or []}
    rec_by_prompt = {str(r["prompt"]): {str(k): x for k, x in r.items()} for r in rec_rows.to_dict(orient="records")}
    srv = {int(r["request"]): {str(k): x for k, x in r.items()} for r in t.requests.to_dict(orient="records")}
    over = _overlapping(t.requests)
    differ = [s.setting for s in settings if s.same is False]
    rounds = rec.rounds
    out = []
    for r in table.sort_values("request_a").to_dict(orient="records"):
        if r["same_counts"] and r["same_output"] is not False:
            continue
        q = int(r["request_a"])
        sv = srv.get(q, {})
        pid = int(sv.get("prompt_id", -1))
        meta = rec_meta.get(str(r["prompt"]), {})
        rr = rec_by_prompt.get(str(r["prompt"]), {})
        rpid = meta.get("prompt_id")
        rnds = rounds[rounds["prompt_id"] == int(rpid)] if rpid is not None and len(rounds) else rounds.iloc[0:0]
        ids = probe_ids.get(pid)
        out.append(why_differs(
            request=q, prompt=r["prompt"], server=sv, recording=rr,
            server_ids=[int(x) for x in ids] if isinstance(ids, list) else None,
            recording_ids=[int(x) for x in meta["tokens"]] if isinstance(meta.get("tokens"), list) else None,
            recording_n_prompt=meta.get("n_prompt_tokens"), rounds=rnds, temperature=temp,
            seed=None if seed is None else int(seed), n_overlapping=over.get(q, 0), settings_differ=differ))
    return tuple(out)


def _num_eq(a: Any, b: Any) -> bool | None:
    try:
        fa, fb = float(a), float(b)
    except (TypeError, ValueError):
        return None
    return (fa <= 0 and fb <= 0) or fa == fb


def _same_file(a: Any, b: Any) -> bool | None:
    """Both paths name one file: the same file here, else (one is not here: a server on another machine) the same
    full path; None when a side is unknown, or is relative and not here (llama-server's ``model_path`` is what its
    ``-m`` was given, relative to a folder this process does not know). (Not the file names: the demo's constructed
    and trained pairs are both ``…/target.gguf``.)"""
    if a is None or b is None:
        return None
    try:
        return os.path.samefile(a, b)
    except (OSError, TypeError):
        if not (os.path.isabs(str(a)) and os.path.isabs(str(b))):
            return None
        return os.path.normpath(str(a)) == os.path.normpath(str(b))


def _tokens(v: Any) -> list[int] | None:
    if v is None or isinstance(v, float):
        return None
    return [int(x) for x in v]


def _first_diff(a: Sequence[int], b: Sequence[int]) -> int | None:
    for j, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return j
    return None if len(a) == len(b) else min(len(a), len(b))


def round_of_token(rounds: pd.DataFrame, j: int) -> int | None:
    """The recording's round that emitted output token ``j`` of one prompt (0 = the prefill's token: None).

    Args:
        rounds: that prompt's rounds (``round``, ``emitted``), any order.
    """
    if j <= 0 or not len(rounds) or "emitted" not in rounds.columns:
        return None
    n = 1
    for r in rounds.sort_values("round").to_dict(orient="records"):
        em = r.get("emitted")
        if em is None or isinstance(em, float):
            return None
        n += len(em)
        if j < n:
            return int(r["round"])
    return None


def eog_rounds(rounds: pd.DataFrame) -> list[int]:
    """Rounds of one prompt where an accepted draft was an end-of-generation token: the recorder cut the round's
    emitted tokens there, so they are all drafts and no target token follows (``len(emitted) == n_accepted``;
    :func:`mtpscope.traces.run.recorder.record`'s rule, the one ``explain``'s ``after_eog`` uses)."""
    out: list[int] = []
    if not len(rounds) or "emitted" not in rounds.columns:
        return out
    for r in rounds.sort_values("round").to_dict(orient="records"):
        em = r.get("emitted")
        if em is not None and not isinstance(em, float) and int(r["n_accepted"]) > 0 \
                and len(em) == int(r["n_accepted"]):
            out.append(int(r["round"]))
    return out


def why_differs(*, request: int, prompt: Any, server: dict[str, Any], recording: dict[str, Any],
                server_ids: Sequence[int] | None, recording_ids: Sequence[int] | None,
                recording_n_prompt: int | None, rounds: pd.DataFrame, temperature: float, seed: int | None,
                n_overlapping: int, settings_differ: Sequence[str] = ()) -> ReplayVerdict:
    """Why a request's replay differs from the server's answer: the first of :data:`REASONS` that the evidence
    shows.

    1. **tokenization**: the recording's prompt ids (or, without them, its prompt length) differ from the
       ids the server read;
    2. **EOG rule**: the outputs are equal, the counts differ, and the recording has a round whose accepted
       draft was an end-of-generation token (:func:`eog_rounds`): llama.cpp does not count such a draft as
       the recorder does;
    3. **sampler**: temperature > 0 (a random seed, < 0, is never reproducible; otherwise the sampler chains
       or their settings differ);
    4. **slot**: the request overlapped ``n_overlapping`` > 0 others on the server;
    5. **unexplained**: none of these (``settings_differ`` names the settings marked ≠).

    Args:
        server / recording: the request's rows on each side (``n_drafted``, ``n_accepted``, ``output_tokens``).
        server_ids / recording_ids: the prompt's token ids each side read (None: not known).
        recording_n_prompt: the recording's prompt length in tokens.
        rounds: the recording's rounds of this prompt (``round``, ``n_accepted``, ``emitted``).
        temperature / seed: the request's sampling settings.
        n_overlapping: other requests of the probe that were in flight while it was.
        settings_differ: names of settings that differ (``≠`` in :func:`settings_table`).
    """
    out_s, out_r = _tokens(server.get("output_tokens")), _tokens(recording.get("output_tokens"))
    j = None if out_s is None or out_r is None else _first_diff(out_s, out_r)
    rnd = None if j is None else round_of_token(rounds, j)
    counts = (f"server drafted {server.get('n_drafted')} / accepted {server.get('n_accepted')}, recording "
              f"{recording.get('n_drafted')} / {recording.get('n_accepted')}")

    def v(reason: str, detail: str, rnd: int | None = rnd, tok: int | None = j) -> ReplayVerdict:
        return ReplayVerdict(int(request), prompt, reason, rnd, tok, detail)

    if server_ids is not None and recording_ids is not None and list(server_ids) != list(recording_ids):
        k = _first_diff(list(server_ids), list(recording_ids))
        return v("tokenization", f"the server read {len(server_ids)} prompt tokens, the recording "
                                 f"{len(recording_ids)}; the ids first differ at prompt token {k}", None, j)
    if server_ids is not None and recording_n_prompt is not None and len(server_ids) != int(recording_n_prompt):
        return v("tokenization", f"the server read {len(server_ids)} prompt tokens, the recording "
                                 f"{int(recording_n_prompt)}", None, j)
    if out_s is not None and out_r is not None and j is None:
        eog = eog_rounds(rounds)
        if eog:
            return v("EOG rule", f"same {len(out_s)} output tokens; {counts}; the recording accepted an "
                                 f"end-of-generation draft in round {eog[0]}", eog[0], None)
    if temperature > 0:
        if seed is not None and seed < 0:
            return v("sampler", f"T = {temperature:g} with a random seed ({seed}): not reproducible; {counts}")
        sampling = [x for x in settings_differ if x in ("temperature", "seed")]
        return v("sampler", f"T = {temperature:g}, seed {seed}: the server's sampler chain and the recording's "
                            f"differ ({', '.join(sampling) or 'top-k / top-p / min-p defaults'}); {counts}")
    if n_overlapping > 0:
        return v("slot", f"it ran while {n_overlapping} other request{'s' if n_overlapping != 1 else ''} were in "
                         f"flight; {counts}; run `probe --check-concurrency N` to compare it with its solo run")
    return v("unexplained", f"{counts}; " + (f"settings that differ: {', '.join(settings_differ)}"
                                              if settings_differ else "no setting that mtpscope sees differs"))


def replay_probe(probe_dir: str | os.PathLike[str], *, assistant: str | os.PathLike[str],
                 target: str | os.PathLike[str] | None = None, requests: Sequence[int] | None = None,
                 n_draft: int | None = None, out: str | os.PathLike[str] | None = None,
                 isolate: bool | None = None, command: Sequence[str] | None = None,
                 prompt_form: str = "ids") -> ServerReplay:
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
        prompt_form: ``"ids"`` (default): the recorder gets the token ids the server read; ``"given"``: each
            prompt as the prompts file gave it (text, chat messages or ids), tokenized by the recorder itself
            (what ``mtpscope record`` of the same file does), so a tokenization difference shows.

    Raises:
        TraceError: ``probe_dir`` is not a probe trace, has no requests, or lacks the prompts' token ids.
        ServerError: the target or draft max cannot be told (names what to pass), ``n_draft`` out of range
            (before anything is recorded).
        MtpscopeError: ``prompt_form`` is not ``"ids"`` or ``"given"``.
        MtpscopeError / RuntimeAbortedError: from the recorder.
    """
    from mtpscope.traces.run.record_config import RecordConfig
    from mtpscope.traces.run.recorder import record
    from mtpscope.traces.server.launch import check_server_n_draft

    if n_draft is not None:
        check_server_n_draft(n_draft)
    if prompt_form not in ("ids", "given"):
        raise MtpscopeError("prompt form is 'ids' or 'given'", key="prompt_form", expected="ids | given",
                            actual=prompt_form)
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
        specs.append(_replay_spec(p, pid, prompt_form))
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
    settings = settings_table(t.manifest, rec.manifest)
    res = ServerReplay(os.fspath(probe_dir), os.fspath(rec_dir), table, settings, first,
                       _verdicts(t, rows, table, rec, rec_rows, settings))
    (probe_dir / REPLAY_JSON).write_text(json.dumps(res.to_dict(), indent=2, default=str) + "\n")
    return res


__all__ = ["NOT_REPORTED", "REASONS", "REASON_TEXT", "REPLAY_DIR", "REPLAY_JSON", "FirstDifference", "ReplayCounts",
           "ReplayVerdict", "ServerReplay", "SettingRow", "eog_rounds", "replay_probe", "round_of_token",
           "server_n_draft", "settings_table", "why_differs"]
