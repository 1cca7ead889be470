"""Explicit pyarrow schemas of the trace format (schema version 1).

The format is documented for users in ``docs/TRACE_FORMAT.md`` and for developers in the "Trace format"
section of ``docs/ARCHITECTURE.md``. Units are in column names (``t_verify_ms``); token ids are int32;
draft positions ``k`` are 1-based; ranks are 0-based (0 = best).

Hidden-state columns (``h``, ``h_next``: width ``n_embd_backbone``; ``h_inner``: width ``n_embd``) are
``fixed_size_list<float16|float32>[dim]`` when recorded and of arrow type ``null`` when off, so every
steps part of every trace has the same column names.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from mtpscope.errors import TraceFormatError

SCHEMA_VERSION = 1

SOURCES = ("record", "fork-ndjson", "server-log", "server-probe", "synthetic", "replay", "baseline")
HIDDEN_DTYPES = {"f16": pa.float16(), "f32": pa.float32()}
HIDDEN_COLUMNS = ("h", "h_next", "h_inner", "h_target")
CENTROID_COLUMNS = ("centroid_ids", "centroid_logits", "centroid_token", "target_in_candidates",
                    "target_centroid", "target_centroid_rank")

#: the plausible-time rule, its one home: a time the format holds as measured (a round's ``t_draft_ms`` /
#: ``t_verify_ms``, every time of a manifest's ``cost_probe``) is ``MIN_TIME_MS <= t < MAX_TIME_MS`` ms, a nanosecond
#: to below a day. Outside, it is no measurement, and the what-if's and the cost fits' sums, products and tokens per
#: second (1000 / ms) overflow (numpy's RuntimeWarnings, costs of inf: 1e308 or 5e-324). A round's time may also be
#: null (unknown) or 0 (nothing timed: the baseline's draft); a probe's may not (it lists only the sizes it timed).
MIN_TIME_MS = 1e-6
MAX_TIME_MS = 86_400_000.0

_i32 = pa.int32()
_f32 = pa.float32()
_f64 = pa.float64()

ROUNDS_SCHEMA = pa.schema([
    pa.field("prompt_id", _i32, nullable=False),
    pa.field("round", _i32, nullable=False),
    pa.field("pos", _i32, nullable=False),
    pa.field("pending_token", _i32, nullable=False),
    pa.field("n_draft", _i32, nullable=False),
    pa.field("drafted", pa.list_(_i32), nullable=False),
    pa.field("target", pa.list_(_i32)),          # n_draft + 1 items; null list when unknown
    pa.field("n_accepted", _i32, nullable=False),
    pa.field("emitted", pa.list_(_i32)),         # null when unknown (imports)
    pa.field("t_draft_ms", _f64),
    pa.field("t_verify_ms", _f64),
    pa.field("draft_path", pa.string()),         # fork NDJSON only
    pa.field("h_l2", _f32),                      # fork NDJSON only
    # the draft after the accepted ones is an end-of-generation token the target chose too: llama.cpp counts it
    # as the target's token, not in n_accepted (it was not the round's last draft); null before this column
    # existed and in imports
    pa.field("eog_confirmed", pa.bool_()),
])

_STEPS_BASE = [
    pa.field("prompt_id", _i32, nullable=False),
    pa.field("round", _i32, nullable=False),
    pa.field("k", _i32, nullable=False),
    pa.field("token", _i32, nullable=False),
    pa.field("logit", _f32),
    pa.field("rank", _i32),
    pa.field("top_ids", pa.list_(_i32)),
    pa.field("top_logits", pa.list_(_f32)),
    pa.field("target_token", _i32),
    pa.field("target_rank", _i32),
    pa.field("accepted", pa.bool_()),
    # the target's side at this step's verify row (k - 1): softmax(logits) at temperature 1; null in traces
    # recorded before these columns existed and in imports
    pa.field("target_p_drafted", _f32),      # the target's probability of the drafted token
    pa.field("target_entropy", _f32),        # the target's entropy there, nats
]
_STEPS_CENTROID = [
    pa.field("centroid_ids", pa.list_(_i32)),
    pa.field("centroid_logits", pa.list_(_f32)),
    pa.field("centroid_token", _i32),
    pa.field("target_in_candidates", pa.bool_()),
    pa.field("target_centroid", _i32),
    pa.field("target_centroid_rank", _i32),
]

# One row per llama-server request, written by the server-log importer (traces/importers/server_log.py, kind "log" /
# "response") and by `mtpscope probe` (traces/server/probe.py, kind "probe"); report, explain --by request,
# compare and the app's Server page read both alike. A column a source cannot know is null.
REQUESTS_SCHEMA = pa.schema([
    pa.field("request", _i32, nullable=False),       # 0-based, in file / sending order
    pa.field("line", _i32, nullable=False),          # 1-based line number in the source log (probe: request + 1)
    pa.field("kind", pa.string(), nullable=False),   # "log" (acceptance-rate line) | "response" (timings JSON)
                                                     # | "probe" (a request `mtpscope probe` sent)
    pa.field("id_slot", _i32),
    pa.field("id_task", _i32),
    pa.field("n_drafted", _i32, nullable=False),     # log: "generated"; response: timings.draft_n
    pa.field("n_accepted", _i32, nullable=False),    # log: "accepted"; response: timings.draft_n_accepted
    pa.field("acceptance_rate", _f64),               # n_accepted / n_drafted; null when n_drafted == 0
    pa.field("mean_acceptance_length", _f64),        # 1 + accepted / drafts (log: the server's "mean len")
    pa.field("prompt_n", _i32),                      # timings.prompt_n (tokens)
    pa.field("prompt_ms", _f64),                     # timings.prompt_ms
    pa.field("predicted_n", _i32),                   # timings.predicted_n (tokens)
    pa.field("predicted_ms", _f64),                  # timings.predicted_ms
    # log only: llama.cpp's `statistics <type>:` line after the acceptance line (common/speculative.cpp;
    # counters of the slot's speculative context as printed at the end of this request)
    pa.field("spec_type", pa.string()),              # "draft-mtp" (upstream) | "mtp" (older builds)
    pa.field("n_calls_begin", _i32),                 # #calls(b,g,a): begin / generate / accept calls
    pa.field("n_calls_draft", _i32),
    pa.field("n_calls_accept", _i32),
    pa.field("n_gen_drafts", _i32),                  # #gen drafts
    pa.field("n_acc_drafts", _i32),                  # #acc drafts
    pa.field("n_gen_tokens", _i32),                  # #gen tokens
    pa.field("n_acc_tokens", _i32),                  # #acc tokens
    pa.field("t_begin_ms", _f64),                    # dur(b,g,a), ms (when llama.cpp measured them)
    pa.field("t_draft_ms", _f64),
    pa.field("t_accept_ms", _f64),
    # which prompt (probe: index into manifest.prompts; the prompt's own id and category as in the prompts file)
    pa.field("prompt_id", _i32),
    pa.field("prompt", pa.string()),                 # the prompt's id from the prompts file (else its index)
    pa.field("category", pa.string()),
    pa.field("repeat", _i32),                        # probe --repeat: 0-based pass over the prompts
    pa.field("n_prompt_tokens", _i32),               # tokens in: the prompt's length (cached tokens included)
    pa.field("n_drafts", _i32),                      # verification steps (drafts sent to the target): counter delta
    pa.field("accepted_per_pos", pa.list_(_i32)),    # accepted at draft position 1, 2, …: per-position counter delta
    pa.field("tokens_per_s", _f64),                  # generation speed: timings.predicted_per_second
    pa.field("wall_ms", _f64),                       # the request's wall time as the client saw it
    pa.field("started_unix_s", _f64),                # when it was sent (seconds since the epoch)
    pa.field("ended_unix_s", _f64),                  # when its answer had come (probe; null in older traces)
    pa.field("counters_match", pa.bool_()),          # the /metrics deltas equal this response's draft_n / accepted
    pa.field("stop_type", pa.string()),              # "eos" | "limit" | "word" (the server's stop_type)
    pa.field("output_text", pa.string()),            # the generated text (probe)
    pa.field("output_tokens", pa.list_(_i32)),       # the generated token ids (probe: return_tokens)
])


def hidden_type(dim: int | None, hidden_dtype: str | None) -> pa.DataType:
    """Arrow type of one hidden-state column: ``fixed_size_list<dtype>[dim]``, or ``null`` when off.

    Raises:
        TraceFormatError: unknown ``hidden_dtype`` (expected ``"f16"``, ``"f32"`` or ``None``) or a
            non-positive ``dim``.
    """
    if hidden_dtype is None or dim is None:
        return pa.null()
    if hidden_dtype not in HIDDEN_DTYPES:
        raise TraceFormatError("unknown hidden dtype", key="hidden_dtype",
                               expected="'f16', 'f32' or None", actual=hidden_dtype)
    if int(dim) <= 0:
        raise TraceFormatError("hidden width must be positive", key="dim", expected="> 0", actual=dim)
    return pa.list_(HIDDEN_DTYPES[hidden_dtype], int(dim))


def steps_schema(n_embd_backbone: int | None, n_embd: int | None, hidden_dtype: str | None,
                 h_target: bool = False) -> pa.Schema:
    """The steps schema for given hidden widths (``None`` width or dtype -> that column is type null).

    ``h_target`` (``record --hidden-target``): the target's own hidden state at the step's verify row,
    width ``n_embd_backbone``; type null unless true.
    """
    return pa.schema(_STEPS_BASE + [
        pa.field("h", hidden_type(n_embd_backbone, hidden_dtype)),
        pa.field("h_next", hidden_type(n_embd_backbone, hidden_dtype)),
        pa.field("h_inner", hidden_type(n_embd, hidden_dtype)),
    ] + _STEPS_CENTROID + [
        pa.field("h_target", hidden_type(n_embd_backbone if h_target else None, hidden_dtype)),
    ])


def steps_schema_from_manifest(manifest: dict[str, Any]) -> pa.Schema:
    """The steps schema implied by ``manifest["dims"]`` (``dims.h_target`` true: ``h_target`` stored)."""
    dims = manifest.get("dims") or {}
    return steps_schema(dims.get("n_embd_backbone"), dims.get("n_embd"), dims.get("hidden_dtype"),
                        bool(dims.get("h_target")))


STEPS_NON_HIDDEN = tuple(f.name for f in _STEPS_BASE + _STEPS_CENTROID)
ROUNDS_COLUMNS = tuple(ROUNDS_SCHEMA.names)
REQUESTS_COLUMNS = tuple(REQUESTS_SCHEMA.names)

MANIFEST_REQUIRED = ("schema_version", "source", "complete", "counts")


def check_manifest(manifest: Any, path: str | None = None) -> dict[str, Any]:
    """Check the manifest keys every reader needs; return it.

    Raises:
        TraceFormatError: not a JSON object, missing ``schema_version`` / ``source`` / ``complete`` /
            ``counts``, a schema version other than :data:`SCHEMA_VERSION`, an unknown source, a
            top-level value of the wrong type, or ``parts.<table>`` that is not a list of file names.
        Malformed ``prompts`` entries (not an object, or a ``prompt_id`` that is not an int >= 0) are
        dropped from the returned manifest rather than refused; ``prompts_left_out`` then counts them.
    """
    if not isinstance(manifest, dict):
        raise TraceFormatError("manifest is not a JSON object", path=path,
                               expected="object", actual=type(manifest).__name__)
    for key in MANIFEST_REQUIRED:
        if key not in manifest:
            raise TraceFormatError("manifest lacks a required key", path=path, key=key,
                                   expected="present", actual="missing")
    sv = manifest["schema_version"]
    if type(sv) is not int:        # (JSON's "1" or 1.0 or true: the wrong type, said as such, not "expected 1, got 1")
        raise TraceFormatError("trace schema version is not an integer", path=path, key="schema_version",
                               expected=f"the integer {SCHEMA_VERSION}", actual=f"{type(sv).__name__} {json.dumps(sv)}")
    if sv != SCHEMA_VERSION:
        raise TraceFormatError("unsupported trace schema version", path=path, key="schema_version",
                               expected=SCHEMA_VERSION, actual=sv)
    if not isinstance(manifest["source"], str) or manifest["source"] not in SOURCES:
        raise TraceFormatError("unknown trace source", path=path, key="source",
                               expected=" | ".join(SOURCES), actual=manifest["source"])
    typed = {"counts": dict, "dims": dict, "params": dict, "models": dict, "runtime": dict,
             "prompts": list, "parts": dict, "command": list, "complete": bool}
    for key, kind in typed.items():
        v = manifest.get(key)
        if v is not None and not isinstance(v, kind):
            raise TraceFormatError("manifest value of the wrong type", path=path, key=key,
                                   expected=kind.__name__, actual=type(v).__name__)
    dims = manifest.get("dims") or {}
    for key in ("n_embd_backbone", "n_embd"):
        v = dims.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
            raise TraceFormatError("manifest hidden width is not a positive integer", path=path,
                                   key=f"dims.{key}", expected="int > 0 or null", actual=v)
    hd = dims.get("hidden_dtype")
    if hd is not None and (not isinstance(hd, str) or hd not in HIDDEN_DTYPES):
        raise TraceFormatError("unknown hidden dtype", path=path, key="dims.hidden_dtype",
                               expected="'f16', 'f32' or null", actual=hd)
    for table, names in (manifest.get("parts") or {}).items():
        if names is not None and (not isinstance(names, list) or not all(isinstance(n, str) for n in names)):
            raise TraceFormatError("manifest part list is not a list of file names", path=path,
                                   key=f"parts.{table}", expected="list of str or null",
                                   actual=type(names).__name__ if not isinstance(names, list)
                                   else "list with " + type(next(n for n in names if not isinstance(n, str))).__name__)
    prompts = manifest.get("prompts")
    if isinstance(prompts, list):
        # a malformed prompt entry (not an object, or a prompt_id that is not an int >= 0) is left out of
        # what readers see; the rounds of that prompt stay readable (nothing recorded is lost)
        manifest["prompts"] = [p for p in prompts if isinstance(p, dict) and isinstance(p.get("prompt_id"), int)
                               and not isinstance(p.get("prompt_id"), bool) and p["prompt_id"] >= 0]
        if len(manifest["prompts"]) < len(prompts):     # (their ids unknown: the reader bounds prompt_id by >= 0 only)
            manifest["prompts_left_out"] = len(prompts) - len(manifest["prompts"])
    return manifest
