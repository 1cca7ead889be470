"""``mtpscope probe URL --prompts P``: send prompts to a running llama-server and write a trace of its requests.

Per prompt (``--repeat K`` passes over the file, in file order) the probe

1. turns the prompt into the token ids the server will see, asking the server itself: a ``tokens`` prompt as
   given; a text through ``/tokenize`` (BOS added, special tokens parsed: what ``/completion`` does with a text
   prompt); ``messages`` through ``/apply-template`` then ``/tokenize`` with BOS added (the server removes
   the template's BOS text and lets the tokenizer add it, as its ``/v1/chat/completions`` does). The ids go
   into the manifest's prompt entry (``tokens``), so a replay feeds mtpscope's recorder exactly what the
   server got;
2. sends them to ``/completion`` (``n_predict``, ``temperature`` (default 0: greedy), ``seed``,
   ``return_tokens``) and reads the response's ``timings``;
3. reads ``/metrics`` after it (and once before the first), so each request gets the counter deltas it caused:
   drafts (verification steps), accepted per draft position, and whether the deltas equal the response's own
   ``draft_n`` / ``draft_n_accepted`` (``counters_match``: false when another client used the server at the
   same time; the per-position numbers of that request are then left null, never guessed).

With ``concurrency`` N > 1 (:class:`ProbeSettings`) every prompt is tokenized first, then the requests go out N
at a time (N client threads, one connection each); ``/metrics`` is read only before and after all of them, so
the per-request deltas are left null. Every row keeps the slot that served it (``id_slot``) and when it was
sent and answered (``started_unix_s``, ``ended_unix_s``).

Each answered request is one row of the trace's ``requests`` table (schema
:data:`mtpscope.traces.store.schema.REQUESTS_SCHEMA`, kind ``"probe"``), written as its own Parquet part
at once: a probe that stops (server down, an HTTP error, garbage, a server killed mid-probe) keeps every row
written, the trace is closed incomplete with ``aborted`` naming the request and the reason, and one
:class:`~mtpscope.errors.ServerError` line says the same. ``resume=True`` continues such a trace: the requests
already answered are kept (copied into the new trace, which replaces the old one when the probe ends) and the
next one is sent.

Manifest (source ``"server-probe"``): ``params`` (URL without query, n_predict, repeat, temperature, seed,
the prompts file, the header *names* with values redacted: an API key is never written), ``server``
(``/health``, the ``/props`` fields that describe the run: build, model path, slots, n_ctx, speculative
types, sampling defaults), ``counters`` (``before`` / ``after`` the probe, and ``delta``), ``prompts``
(one entry per prompt, with the token ids) and ``alarm`` (:func:`mtpscope.traces.analysis.requests.not_drafting_alarm`).

Imports: ``client``, traces (``prompts``, ``schema``, the trace writer and reader, ``analysis.requests``),
pyarrow, errors.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from mtpscope.errors import MtpscopeError, ServerError, TraceError
from mtpscope.traces.analysis import rates
from mtpscope.traces.analysis.requests import not_drafting_alarm
from mtpscope.traces.run.prompts import PromptSpec, read_prompt_specs
from mtpscope.traces.server.client import ServerClient, SpecCounters, clean_url, redact_headers
from mtpscope.traces.store import schema as S
from mtpscope.traces.store.layout import holds_trace
from mtpscope.traces.store.reader import open_trace
from mtpscope.traces.store.writer import TraceWriter, partial_dir, swap_in

SOURCE = "server-probe"
KIND = "probe"
#: ``/props`` fields kept in the manifest (the rest, e.g. the chat template, is not about the run)
PROPS_KEPT = ("build_info", "model_path", "model_alias", "total_slots", "endpoint_metrics", "is_sleeping")
#: sampling defaults kept from ``default_generation_settings.params``
PARAMS_KEPT = ("speculative.types", "temperature", "top_k", "top_p", "min_p", "seed", "samplers", "n_predict")


@dataclass(frozen=True)
class ProbeSettings:
    """What each request asks for.

    Attributes:
        n_predict: tokens to generate at most per request (>= 1).
        repeat: passes over the prompts file (>= 1).
        temperature: the server's sampling temperature (``<= 0``: greedy, the default).
        seed: the sampling seed sent with each request.
        timeout_s: the longest silence allowed while waiting for an answer, seconds.
        concurrency: requests in flight at once (>= 1; 1: one after another, each with its own ``/metrics``
            deltas; N > 1: N client threads, the counters read only before and after all of them).
    """

    n_predict: int = 128
    repeat: int = 1
    temperature: float = 0.0
    seed: int = 0
    timeout_s: float = 600.0
    concurrency: int = 1

    def check(self) -> None:
        """Raises MtpscopeError for values out of range (names the option)."""
        for name, v, lo in (("n_predict", self.n_predict, 1), ("repeat", self.repeat, 1),
                            ("concurrency", self.concurrency, 1)):
            if int(v) < lo:
                raise MtpscopeError(f"{name} must be >= {lo}", key=f"--{name.replace('_', '-')}",
                                    expected=f">= {lo}", actual=v)
        if not self.timeout_s > 0:
            raise MtpscopeError("timeout must be positive", key="--timeout", expected="> 0", actual=self.timeout_s)


@dataclass(frozen=True)
class ProbeSummary:
    """What :func:`probe` did.

    Attributes:
        out: the trace directory.
        n_requests: rows in the trace (kept from a resumed trace included).
        n_sent: requests answered in this run.
        n_resumed: rows kept from the trace being resumed.
        alarm: the not-drafting alarm, or None.
        counters: the ``/metrics`` deltas over this run (None without ``/metrics``).
        warnings: requests whose counter deltas did not match their timings, and the like.
    """

    out: str
    n_requests: int
    n_sent: int
    n_resumed: int
    alarm: str | None
    counters: SpecCounters | None
    warnings: tuple[str, ...] = field(default_factory=tuple)


def _props_summary(props: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: props.get(k) for k in PROPS_KEPT if k in props}
    dgs = props.get("default_generation_settings")
    if isinstance(dgs, dict):
        out["n_ctx"] = dgs.get("n_ctx")
        params = dgs.get("params")
        if isinstance(params, dict):
            out["params"] = {k: params.get(k) for k in PARAMS_KEPT if k in params}
    return out


def _prompt_ids(client: ServerClient, spec: PromptSpec) -> tuple[list[int], str]:
    """The token ids the server will see for ``spec``, and the text they stand for (see the module docstring)."""
    if spec.tokens is not None:
        return list(spec.tokens), ""
    if spec.messages is not None:
        text = client.apply_template(spec.messages)
        return client.tokenize(text, add_special=True, parse_special=True), text
    text = spec.text or ""
    return client.tokenize(text, add_special=True, parse_special=True), text


def _label(spec: PromptSpec, i: int) -> str:
    return spec.id if spec.id is not None else str(i)


def _int_or_none(v: Any) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) and -(2 ** 31) <= v < 2 ** 31 else None


def _num_or_none(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def request_row(*, request: int, prompt_id: int, spec: PromptSpec, repeat: int, n_prompt_tokens: int,
                response: Mapping[str, Any], delta: SpecCounters | None, wall_ms: float, started: float,
                url: str, ended: float | None = None) -> tuple[dict[str, Any], str | None]:
    """One ``requests`` row from a ``/completion`` answer and the counter deltas it caused; and a warning (or
    None) when the deltas disagree with the answer's timings.

    Raises:
        ServerError: the answer lacks ``timings`` or has ``draft_n`` / ``draft_n_accepted`` that are not
            non-negative integers with accepted <= drafted (garbage; names the URL and request).
    """
    what = f"request {request} (prompt {_label(spec, prompt_id)})"
    timings = response.get("timings")
    if not isinstance(timings, dict):
        raise ServerError("the /completion answer has no 'timings' object", path=url, key=what,
                          expected="llama-server's completion JSON", actual=sorted(response)[:6])
    dn, da = timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)
    if not (_int_or_none(dn) is not None and _int_or_none(da) is not None and 0 <= da <= dn):
        raise ServerError("timings.draft_n / draft_n_accepted are not counts with accepted <= drafted", path=url,
                          key=what, expected="0 <= draft_n_accepted <= draft_n", actual=f"{dn!r} / {da!r}")
    toks = response.get("tokens")
    out_tokens = [int(t) for t in toks] if isinstance(toks, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in toks) else None
    content = response.get("content")
    warning = None
    n_drafts = per_pos = match = None
    if delta is not None and delta.present:
        match = delta.n_draft_tokens == dn and delta.n_accepted == da
        if match:
            n_drafts = delta.n_drafts
            per_pos = list(delta.accepted_per_pos)
        else:
            warning = (f"{what}: the /metrics deltas ({delta.n_draft_tokens} drafted, {delta.n_accepted} accepted) "
                       f"differ from its timings ({dn} / {da}): another client used the server meanwhile; its "
                       f"per-position counts are left out")
    row = {
        "request": request, "line": request + 1, "kind": KIND, "id_slot": _int_or_none(response.get("id_slot")),
        "id_task": None, "n_drafted": int(dn), "n_accepted": int(da),
        "acceptance_rate": rates.acceptance_rate(da, dn),
        "mean_acceptance_length": rates.mean_acceptance_length(da, n_drafts),
        "prompt_n": _int_or_none(timings.get("prompt_n")), "prompt_ms": _num_or_none(timings.get("prompt_ms")),
        "predicted_n": _int_or_none(timings.get("predicted_n")),
        "predicted_ms": _num_or_none(timings.get("predicted_ms")),
        "prompt_id": prompt_id, "prompt": _label(spec, prompt_id), "category": spec.category, "repeat": repeat,
        "n_prompt_tokens": n_prompt_tokens, "n_drafts": n_drafts, "accepted_per_pos": per_pos,
        "tokens_per_s": _num_or_none(timings.get("predicted_per_second")), "wall_ms": wall_ms,
        "started_unix_s": started, "ended_unix_s": ended if ended is not None else started + wall_ms / 1e3,
        "counters_match": match,
        "stop_type": response.get("stop_type") if isinstance(response.get("stop_type"), str) else None,
        "output_text": content if isinstance(content, str) else None, "output_tokens": out_tokens,
    }
    return row, warning


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=S.REQUESTS_SCHEMA)


def _old_probe(out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The manifest and request rows (plain dicts) of the probe trace in ``out`` (for ``resume``).

    Raises:
        TraceError: ``out`` holds another kind of trace.
    """
    import pyarrow.dataset as ds

    t = open_trace(out)
    if t.manifest.get("source") != SOURCE:
        raise TraceError("--resume continues a probe trace; this folder holds another kind", path=out,
                         key="source", expected=SOURCE, actual=t.manifest.get("source"))
    _ = t.requests                           # reads (and checks) every part; unreadable ones are dropped
    files = [str(p) for p in t.part_files("requests")]
    rows = ds.dataset(files, schema=S.REQUESTS_SCHEMA).to_table().to_pylist() if files else []
    return t.manifest, rows


def probe(url: str, *, prompts_file: str | os.PathLike[str], out: str | os.PathLike[str],
          settings: ProbeSettings | None = None, headers: Mapping[str, str] | None = None, resume: bool = False,
          overwrite: bool = False, on_request: Callable[[dict[str, Any]], None] | None = None,
          command: list[str] | None = None) -> ProbeSummary:
    """Probe the llama-server at ``url`` with every prompt of ``prompts_file`` (see the module docstring).

    Args:
        url: the server's base URL (``http://127.0.0.1:8080``).
        prompts_file: a prompts file (:func:`mtpscope.traces.run.prompts.read_prompt_specs`: text, chat
            messages or token ids, with ``id`` and ``category``).
        out: the trace directory.
        settings: :class:`ProbeSettings` (default: 128 tokens, one pass, greedy).
        headers: extra headers (an API key); sent to ``url``'s origin only, never written.
        resume: continue the probe trace in ``out`` (same prompts file; requests already answered are kept; the
            settings it started with are kept too).
        overwrite: replace a trace already in ``out`` (written beside it, swapped in at the end).
        on_request: called with each row as it is written (the CLI's progress line).
        command: argv for the manifest (default ``sys.argv``).

    Returns:
        :class:`ProbeSummary`.

    Raises:
        ServerError: the server is down, answers an HTTP error or garbage, or dies mid-probe (one line naming
            the URL and request; the rows answered before are in the trace, marked incomplete).
        TraceError: ``out`` holds a trace and neither ``resume`` nor ``overwrite`` is given; ``resume`` of a
            trace that is not a probe or was made from another prompts file.
        MtpscopeError: a bad prompts file or setting.
    """
    settings = settings or ProbeSettings()
    settings.check()
    headers = dict(headers or {})
    specs = read_prompt_specs(prompts_file)
    out = Path(out)
    plan = [(rep, i) for rep in range(settings.repeat) for i in range(len(specs))]
    old_manifest: dict[str, Any] | None = None
    old_rows: list[dict[str, Any]] = []
    exists = holds_trace(out)
    if exists and resume:
        old_manifest, old_rows = _old_probe(out)
        for p in old_manifest.get("prompts") or []:
            i = p["prompt_id"]
            if i >= len(specs) or p.get("prompt") != _label(specs[i], i):
                raise TraceError("--resume needs the prompts file the probe started with", path=out,
                                 key=f"prompt {i}", expected=p.get("prompt"),
                                 actual=_label(specs[i], i) if i < len(specs) else "no such prompt")
    elif exists and not overwrite:
        raise TraceError("directory already holds a trace (--resume continues a probe, --overwrite replaces it)",
                         path=out)
    if old_manifest is not None:        # a resumed probe keeps the settings it started with
        op = old_manifest.get("params") or {}
        settings = ProbeSettings(n_predict=int(op.get("n_predict", settings.n_predict)),
                                 repeat=int(op.get("repeat", settings.repeat)),
                                 temperature=float(op.get("temperature", settings.temperature)),
                                 seed=int(op.get("seed", settings.seed)), timeout_s=settings.timeout_s,
                                 concurrency=int(op.get("concurrency", settings.concurrency)))
        plan = [(rep, i) for rep in range(settings.repeat) for i in range(len(specs))]
    done = {(int(r["repeat"]), int(r["prompt_id"])) for r in old_rows
            if r.get("repeat") is not None and r.get("prompt_id") is not None}
    todo = [(rep, i) for rep, i in plan if (rep, i) not in done]
    if old_manifest is not None and not todo:          # nothing left: no request at all
        requests = open_trace(out).requests
        return ProbeSummary(os.fspath(out), len(old_rows), 0, len(old_rows),
                            old_manifest.get("alarm") or not_drafting_alarm(requests),
                            None)

    client = ServerClient(url, headers=headers, timeout_s=settings.timeout_s)
    base = client.url
    write_to = partial_dir(out) if exists else out
    if write_to.exists() and write_to != out:
        shutil.rmtree(write_to)
    w: TraceWriter | None = None
    warnings: list[str] = []
    rows: list[dict[str, Any]] = list(old_rows)
    sent = 0
    c_first: SpecCounters | None = None
    c_last: SpecCounters | None = None
    current = "GET /health"
    try:
        with client:
            health = client.health()
            props = client.props()
            current = "GET /metrics"
            c_first = c_last = client.counters()
            prompts: list[dict[str, Any] | None] = [None] * len(specs)
            for p in (old_manifest or {}).get("prompts") or []:
                prompts[p["prompt_id"]] = p
            manifest = {
                "source": SOURCE, "command": list(sys.argv if command is None else command),
                "params": {"url": clean_url(base), "prompts_file": os.fspath(prompts_file),
                           "n_predict": settings.n_predict, "repeat": settings.repeat,
                           "temperature": settings.temperature, "seed": settings.seed,
                           "concurrency": settings.concurrency, "headers": redact_headers(headers)},
                "server": {"health": health, "props": _props_summary(props), "metrics": c_first is not None},
                "prompts": [p for p in prompts if p is not None], "alarm": None,
            }
            w = TraceWriter(write_to, manifest, n_embd_backbone=None, n_embd=None, hidden_dtype=None,
                            centroids=False, compact=False, overwrite=not exists and overwrite)
            writer = w
            if old_rows:
                w.write_tables(None, None, _table(old_rows))
            ids: dict[int, list[int]] = {i: list(p["tokens"]) for i, p in enumerate(prompts)
                                         if isinstance(p, dict) and isinstance(p.get("tokens"), list)}
            def prompt_ids(rep: int, i: int) -> list[int]:
                nonlocal current
                spec = specs[i]
                current = f"request {rep * len(specs) + i} (prompt {_label(spec, i)})"
                if i not in ids:
                    toks, text = _prompt_ids(client, spec)
                    if not toks:
                        raise ServerError("the server tokenized the prompt to no tokens", path=clean_url(base),
                                          key=current)
                    ids[i] = toks
                    entry = spec.manifest_entry(i, len(toks), text or spec.text)
                    entry["prompt"] = _label(spec, i)
                    entry["tokens"] = toks
                    prompts[i] = entry
                    writer.manifest["prompts"] = [p for p in prompts if p is not None]
                return ids[i]

            def body(i: int) -> dict[str, Any]:
                return {"prompt": ids[i], "n_predict": settings.n_predict, "temperature": settings.temperature,
                        "seed": settings.seed, "return_tokens": True}

            def keep(rep: int, i: int, resp: dict[str, Any], wall_ms: float, started: float, ended: float,
                     delta: SpecCounters | None) -> None:
                nonlocal sent
                row, warn = request_row(request=rep * len(specs) + i, prompt_id=i, spec=specs[i], repeat=rep,
                                        n_prompt_tokens=len(ids[i]), response=resp, delta=delta, wall_ms=wall_ms,
                                        started=started, url=clean_url(base), ended=ended)
                if warn:
                    warnings.append(warn)
                writer.write_tables(None, None, _table([row]))
                rows.append(row)
                sent += 1
                if on_request is not None:
                    on_request(row)

            if settings.concurrency <= 1:
                for rep, i in todo:
                    prompt_ids(rep, i)
                    started = time.time()
                    t0 = time.perf_counter()
                    resp = client.completion(body(i), what=current)
                    wall_ms = (time.perf_counter() - t0) * 1e3
                    ended = time.time()
                    after = client.counters() if c_last is not None else None
                    delta = after.minus(c_last) if (after is not None and c_last is not None) else None
                    if after is not None:
                        c_last = after
                    keep(rep, i, resp, wall_ms, started, ended, delta)
            else:
                for rep, i in todo:          # every prompt's ids first, so the requests go out together
                    prompt_ids(rep, i)
                current = f"{len(todo)} requests, {settings.concurrency} at a time"
                try:
                    for rep, i, resp, wall_ms, started, ended in _send_concurrently(
                            base, headers, settings, [(rep, i, body(i), f"request {rep * len(specs) + i} (prompt "
                                                       f"{_label(specs[i], i)})") for rep, i in todo]):
                        keep(rep, i, resp, wall_ms, started, ended, None)
                except ServerError as e:
                    current = str(e.key or current)
                    raise
                current = "GET /metrics"
                if c_last is not None:
                    c_last = client.counters() or c_last
            alarm = not_drafting_alarm(_frame(rows))
            w.manifest["alarm"] = alarm
            w.manifest["counters"] = _counters_record(c_first, c_last)
            w.manifest["warnings"] = warnings
            w.close()
    except ServerError as e:
        n = len(rows)
        if w is not None:
            w.manifest["alarm"] = not_drafting_alarm(_frame(rows)) if rows else None
            w.manifest["counters"] = _counters_record(c_first, c_last)
            w.manifest["warnings"] = warnings
            w.close(complete=False, aborted={"request": current, "message": e.message, "url": clean_url(base)})
            if write_to != out:
                swap_in(write_to, out)
            e.message = f"{e.message} ({n} answered request{'s' if n != 1 else ''} kept in {out}, " \
                        f"marked incomplete; --resume continues)"
        e.args = (e.one_line(),)
        raise
    except BaseException:
        if w is not None:
            w.close(complete=False)
            if write_to != out:
                swap_in(write_to, out)
        raise
    if write_to != out:
        swap_in(write_to, out)
    delta = c_last.minus(c_first) if (c_first is not None and c_last is not None) else None
    return ProbeSummary(os.fspath(out), len(rows), sent, len(old_rows), alarm, delta, tuple(warnings))


def _send_concurrently(base: str, headers: Mapping[str, str], settings: ProbeSettings,
                       jobs: list[tuple[int, int, dict[str, Any], str]],
                       ) -> Iterator[tuple[int, int, dict[str, Any], float, float, float]]:
    """Send ``jobs`` (repeat, prompt index, ``/completion`` body, what) ``settings.concurrency`` at a time, one
    client (connection) per thread; yields ``(repeat, prompt index, answer, wall ms, started, ended unix s)`` as
    the answers come. The first failure stops the sending (requests not yet sent are cancelled) and is raised
    once the requests in flight have ended; the answers before it are yielded first.

    Raises:
        ServerError: the first request that failed (``key`` names it).
    """
    local = threading.local()
    made: list[ServerClient] = []
    lock = threading.Lock()

    def one(job: tuple[int, int, dict[str, Any], str]) -> tuple[int, int, dict[str, Any], float, float, float]:
        c = getattr(local, "client", None)
        if c is None:
            c = local.client = ServerClient(base, headers=dict(headers), timeout_s=settings.timeout_s)
            with lock:
                made.append(c)
        rep, i, body, what = job
        started = time.time()
        t0 = time.perf_counter()
        resp = c.completion(body, what=what)
        return rep, i, resp, (time.perf_counter() - t0) * 1e3, started, time.time()

    pool = ThreadPoolExecutor(max_workers=settings.concurrency, thread_name_prefix="mtpscope-probe")
    try:
        futures = [pool.submit(one, j) for j in jobs]
        failure: BaseException | None = None
        for f in as_completed(futures):
            try:
                res = f.result()
            except BaseException as e:   # noqa: BLE001  # the first failure is raised after the others end
                if failure is None:
                    failure = e
                    for g in futures:
                        g.cancel()
                continue
            if failure is None:
                yield res
        if failure is not None:
            raise failure
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        for c in made:
            c.close()


def _frame(rows: list[dict[str, Any]]) -> Any:
    return _table(rows).to_pandas()


def _counters_record(first: SpecCounters | None, last: SpecCounters | None) -> dict[str, Any] | None:
    if first is None or last is None:
        return None
    return {"before": first.to_dict(), "after": last.to_dict(), "delta": last.minus(first).to_dict()}


__all__ = ["KIND", "SOURCE", "ProbeSettings", "ProbeSummary", "probe", "request_row"]
