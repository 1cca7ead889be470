"""CLI commands for llama-server (docs/SERVER.md).

``mtpscope server build [--force] [--jobs N]``: build llama-server into the cache (reused while its inputs are
unchanged). ``mtpscope server path``: print the built binary (exit 1 when not built). ``mtpscope server run
--target T --assistant A [--n-draft N] [--port P] [--log FILE] [-- llama-server flags…]``: start it on 127.0.0.1
with MTP on, print the URL, run until Ctrl-C.

``mtpscope probe URL --prompts P [--out DIR] [--n-predict N] [--repeat K] [--header 'K: V'] [--resume]
[--replay --assistant A [--target T] [--n-draft N]]``: send the prompts, write a trace of the server's
requests; with ``--replay`` also record them with mtpscope and compare request by request.

Exit codes: 0 fine; 1 the probe raised the not-drafting alarm, or the replay found a request that differs;
2 bad input, a server that cannot be reached or answered garbage (one line), a build that failed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from mtpscope.cli.common import EXIT_FINDINGS, gguf_path, n_draft_option, one_line_errors, out_folder
from mtpscope.cli.common import fmt as _f
from mtpscope.traces.analysis.wording import plural, shorten, shorten_path

if TYPE_CHECKING:
    from mtpscope.traces.analysis.requests import RequestsView
    from mtpscope.traces.server.replay import ServerReplay


def _i(v) -> str:
    """A count (a float where its column also holds a missing value: 12.0 prints as 12)."""
    return _f(v if v is None or v != v else int(v), "d")


def _s(v) -> str:
    return "" if v is None or (isinstance(v, float) and v != v) else str(v)


def request_view(trace) -> RequestsView:
    """The request tables of an opened trace (:func:`mtpscope.traces.analysis.requests.requests_view`): its
    ``requests`` rows, or for a recording its prompts seen as requests
    (:func:`mtpscope.traces.analysis.requests.requests_from_rounds`)."""
    from dataclasses import replace

    from mtpscope.traces.analysis import requests as R
    from mtpscope.traces.analysis.metrics import speed_by_prompt

    if trace.part_files("requests"):
        req = trace.requests
    else:   # a recording: each prompt's tokens/s and time as `report` measures the whole trace's (metrics.timing)
        req = R.requests_from_rounds(trace.rounds, trace.manifest.get("prompts"))
        speed = speed_by_prompt(trace.rounds)
        if len(req):
            req["tokens_per_s"] = [speed.get(int(p), (None, None))[0] for p in req["prompt_id"]]
            req["predicted_ms"] = [speed.get(int(p), (None, None))[1] for p in req["prompt_id"]]
        # the not-drafting alarm is about a server's flags (`--spec-type`); a recording drafts by construction
        return replace(R.requests_view(req), alarm=None)
    return R.requests_view(req)


def format_requests(v: RequestsView, limit: int = 50) -> str:
    """:func:`request_view` as text: one line per request, worst acceptance rate first (requests without one,
    such as a prompt a killed run never reached, last)."""
    from mtpscope.traces.analysis.ordering import worst_first

    t = worst_first(v.table)
    tot = v.totals
    lines = [f"{plural(tot.n_requests, 'request')}: drafted {tot.n_drafted}, accepted {tot.n_accepted}, "
             f"acceptance rate {_f(tot.acceptance_rate)}, mean acceptance length "
             f"{_f(tot.mean_acceptance_length, '.2f')}, {_f(tot.tokens_per_s_pooled, '.1f')} tokens/s (all tokens / "
             f"all generation time; the mean of the requests' own rates: {_f(tot.tokens_per_s_mean, '.1f')})"]
    if v.alarm:
        lines.append(f"ALARM: {v.alarm}")
    lines += ["", "request  prompt                category    in   out  drafted  accepted   rate  mean len  "
                  "per position    tokens/s  wall ms"]
    for r in t.head(limit).to_dict(orient="records"):
        per = "" if r["accepted_per_pos"] is None else ",".join(str(x) for x in r["accepted_per_pos"])
        lines.append(f"{int(r['request']):7d}  {str(r['prompt'])[:20]:20}  {_s(r['category'])[:9]:9} "
                     f"{_i(r['n_prompt_tokens'])[:5]:>5} {_i(r['n_output_tokens'])[:5]:>5}  "
                     f"{_i(r['n_drafted'])[:7]:>7}  {_i(r['n_accepted'])[:8]:>8}  {_f(r['acceptance_rate']):>5}"
                     f"  {_f(r['mean_acceptance_length'], '.2f'):>8}  {per[:14]:14}  {_f(r['tokens_per_s'], '.1f'):>8}"
                     f"  {_f(r['wall_ms'], '.0f'):>7}")
    if len(t) > limit:
        lines.append(f"... {len(t) - limit} more requests (use --json)")
    if len(v.by_category) > 1:
        lines += ["", "category        requests  drafted  accepted   rate  mean len"]
        for c in v.by_category.to_dict(orient="records"):
            lines.append(f"{str(c['category'])[:15]:15} {c['n_requests']:9d} {c['n_drafted']:8d} {c['n_accepted']:9d}"
                         f"  {_f(c['acceptance_rate']):>5}  {_f(c['mean_acceptance_length'], '.2f'):>8}")
    if len(v.per_position):
        lines += ["", "accepted per draft position, of the requests' rounds that drafted (the server's acc per pos): "
                  + ", ".join(
            f"k={int(p['k'])} {int(p['n_accepted'])} of {int(p['n_drafts'])} rounds ({_f(p['rate'])})"
            for p in v.per_position.to_dict(orient="records"))]
    return "\n".join(lines)


def _json_clean(obj):
    if isinstance(obj, dict):
        return {k: _json_clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_clean(v) for v in obj]
    if isinstance(obj, float) and obj != obj:
        return None
    return obj


def compare_request_traces(ta, tb, as_json: bool) -> int:
    """``mtpscope compare A B`` when one of them is a request trace (probe, server log): request by request
    (:func:`mtpscope.traces.analysis.requests.compare_requests`; a recording's prompts count as requests).
    The exit code: 1 when a paired request differs or none could be paired."""
    from mtpscope.traces.analysis.requests import compare_requests, request_pairs

    va, vb = request_view(ta), request_view(tb)
    ra = ta.requests if ta.part_files("requests") else None
    rb = tb.requests if tb.part_files("requests") else None
    from mtpscope.traces.analysis.requests import requests_from_rounds

    ra = ra if ra is not None else requests_from_rounds(ta.rounds, ta.manifest.get("prompts"))
    rb = rb if rb is not None else requests_from_rounds(tb.rounds, tb.manifest.get("prompts"))
    rows = request_pairs(compare_requests(ra, rb))
    if as_json:
        print(json.dumps(_json_clean({"a": str(ta.path), "b": str(tb.path), "totals_a": va.totals.to_dict(),
                                      "totals_b": vb.totals.to_dict(), "requests": [r.to_dict() for r in rows]}),
                         indent=2, default=str))
    else:
        print(f"A {ta.path}: {plural(va.totals.n_requests, 'request')}, acceptance rate "
              f"{_f(va.totals.acceptance_rate)}")
        print(f"B {tb.path}: {plural(vb.totals.n_requests, 'request')}, acceptance rate "
              f"{_f(vb.totals.acceptance_rate)}")
        print("")
        print("request A  request B  prompt                drafted A / B    accepted A / B   output")
        for r in rows:
            out = {True: "same", False: "differs", None: "?"}[r.same_output]
            print(f"{r.request_a:9} {r.request_b:10}  {str(r.prompt)[:20]:20}  {r.drafted_a:>6} / "
                  f"{r.drafted_b:<6}  {r.accepted_a:>6} / {r.accepted_b:<6}  {out}")
        n_diff = sum(1 for r in rows if r.differs)
        print("")
        print(f"{plural(len(rows), 'request')} paired, {n_diff} differ")
    return EXIT_FINDINGS if (not rows or any(r.differs for r in rows)) else 0


def explain_requests(path: Path, as_json: bool) -> int:
    """``mtpscope explain DIR --by request``; the exit code (1 with the not-drafting alarm)."""
    with one_line_errors():
        from mtpscope.traces.store.reader import open_trace

        t = open_trace(path)
        v = request_view(t)
    for w in t.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if as_json:
        print(json.dumps(_json_clean({"trace": str(t.path), "totals": v.totals.to_dict(), "alarm": v.alarm,
                                      "requests": json.loads(v.table.to_json(orient="records")),
                                      "by_category": json.loads(v.by_category.to_json(orient="records")),
                                      "per_position": json.loads(v.per_position.to_json(orient="records"))}),
                         indent=2, default=str))
    else:
        print(format_requests(v))
    return EXIT_FINDINGS if v.alarm or t.warnings else 0


def _cell(v: object, width: int, path: bool) -> str:
    """A settings cell in ``width`` characters: a ``path`` keeps its file name (``…/trained/target.gguf``), other
    text ends in ``…`` when cut (:mod:`mtpscope.traces.analysis.wording`): a cut never reads as another value."""
    return shorten_path(str(v), width) if path else shorten(str(v), width)


def format_replay(res: ServerReplay) -> str:
    """The server-vs-recording comparison (:class:`mtpscope.traces.server.replay.ServerReplay`) as text: one line
    per request, the settings, the first difference."""
    rows = res.requests
    lines = ["request  prompt                drafted (server / mtpscope)  accepted (server / mtpscope)  output"]
    for r in rows:
        out = {True: "same", False: "differs", None: "?"}[r.same_output]
        lines.append(f"{r.request_a:7d}  {str(r.prompt)[:20]:20}  {r.drafted_a:>10} / {r.drafted_b:<14}"
                     f"  {r.accepted_a:>11} / {r.accepted_b:<14}  {out}")
    lines.append("")
    lines.append("setting                                      server                       mtpscope recording")
    for s in res.settings:
        mark = {True: " ", False: "≠", None: "?"}[s.same]
        server = _cell(s.server, 27, path=s.setting.endswith(" model"))
        lines.append(f"{mark} {s.setting[:42]:42}  {server:27}  {s.recording}")
    fd = res.first_difference
    lines.append("")
    if fd is None and res.all_equal:
        lines.append(f"identical: all {plural(len(rows), 'request')} agree: same output, same drafted, same accepted")
    else:
        lines.append(res.verdict)
        if fd is not None:
            lines.append(f"look at it with `{fd.explain}`")
        if len(res.verdicts) > 1:
            counts: dict[str, int] = {}
            for v in res.verdicts:
                counts[v.reason] = counts.get(v.reason, 0) + 1
            lines.append(f"{plural(len(res.verdicts), 'request')} differ: "
                         + ", ".join(f"{n} {reason}" for reason, n in counts.items()))
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add ``server`` (build / path / run) and ``probe`` to the root mtpscope app."""
    srv = typer.Typer(help="Build and run llama-server (the llama.cpp mtpscope records with).",
                      no_args_is_help=True)

    @srv.command("build")
    def build_cmd(force: bool = typer.Option(False, "--force", help="Build again even if a build is cached."),
                  jobs: int | None = typer.Option(None, "--jobs", help="Parallel compile jobs (default: CPUs)."),
                  if_possible: bool = typer.Option(False, "--if-possible",
                                                   help="Where it cannot be built (no cmake, compiler or "
                                                        "llama-cpp-python), say so in one line and exit 0."),
                  ) -> None:
        """Build llama-server from llama-cpp-python 0.3.36's llama.cpp into the cache (minutes, once)."""
        from mtpscope.traces.server.build import build_server, unavailable_reason

        if if_possible:
            why = unavailable_reason()
            if why is not None:
                print(f"note: llama-server not built ({why}); the server tests will skip")
                raise typer.Exit(0)
        with one_line_errors():
            b = build_server(force=force, jobs=jobs, progress=lambda line: print(line, file=sys.stderr))
        if b.built_now:
            print(f"built {b.binary} (configure {b.configure_s:.0f} s, build {b.build_s:.0f} s with "
                  f"{b.jobs} jobs; log {b.log})")
        else:
            print(f"up to date: {b.binary}")

    @srv.command("path")
    def path_cmd() -> None:
        """Print the built llama-server (exit 1 when it is not built)."""
        from mtpscope.traces.server.build import server_path

        with one_line_errors():
            p = server_path()
        if p is None:
            print("mtpscope: llama-server is not built: run `mtpscope server build`", file=sys.stderr)
            raise typer.Exit(EXIT_FINDINGS)
        print(p)

    @srv.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def run_cmd(
        ctx: typer.Context,
        target: Path = typer.Option(..., "--target", callback=gguf_path, help="Target GGUF (gemma4)."),
        assistant: Path | None = typer.Option(None, "--assistant", callback=gguf_path,
                                                 help="Drafter GGUF (gemma4-assistant); without it: no MTP."),
        n_draft: int = n_draft_option("Drafts per round: llama-server's --spec-draft-n-max"),
        port: int | None = typer.Option(None, "--port", help="Port on 127.0.0.1 (default: a free one)."),
        parallel: int = typer.Option(1, "--parallel",
                                     help="Slots: requests decoded at once (llama-server -np; 1 = the recorder's)."),
        log: Path | None = typer.Option(None, "--log", help="Log file (default llama-server-PORT.log)."),
    ) -> None:
        """Start llama-server on 127.0.0.1 with MTP on (draft-mtp, --metrics), print its URL, run until Ctrl-C.

        Flags after the options (e.g. `-- --ctx-size 8192`) go to llama-server as they are.
        """
        from mtpscope.traces.server.launch import launch

        with one_line_errors():
            s = launch(target, assistant, n_draft=n_draft, port=port, parallel=parallel, extra=list(ctx.args),
                       log=log)
        # (a SIGTERM arrives as a Ctrl-C: cli.main's stop_signals_as_interrupt)
        print(s.url, flush=True)
        print(f"llama-server pid {s.pid}, log {s.log}; Ctrl-C (or SIGTERM) stops it", file=sys.stderr)
        try:
            rc = s.process.wait()
        except KeyboardInterrupt:
            s.stop()
            raise typer.Exit(0) from None
        print(f"mtpscope: llama-server exited with status {rc}; see {s.log}", file=sys.stderr)
        raise typer.Exit(2)

    app.add_typer(srv, name="server")

    @app.command("probe")
    def probe_cmd(
        url: str = typer.Argument(..., help="The server, e.g. http://127.0.0.1:8080."),
        prompts: Path = typer.Option(..., "--prompts", help="Prompts file (as `record --prompts`)."),
        out: Path = typer.Option(Path("probe"), "--out", callback=out_folder, help="Trace directory to write."),
        n_predict: int = typer.Option(128, "--n-predict", help="Tokens to generate per request at most."),
        repeat: int = typer.Option(1, "--repeat", help="Passes over the prompts file."),
        temperature: float = typer.Option(0.0, "--temperature", help="Sampling temperature (0: greedy)."),
        seed: int = typer.Option(0, "--seed", help="Sampling seed sent with each request."),
        header: list[str] | None = typer.Option(None, "--header",
                                                   help="'Name: value' sent with each request (an API key); "
                                                        "never written into the trace. Repeatable."),
        resume: bool = typer.Option(False, "--resume", help="Continue the probe trace in --out."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace a trace already in --out."),
        timeout: float = typer.Option(600.0, "--timeout", help="Longest wait for an answer, seconds."),
        replay: bool = typer.Option(False, "--replay", help="Record the same token ids with mtpscope and compare."),
        target: Path | None = typer.Option(None, "--target", callback=gguf_path,
                                              help="--replay: target GGUF (default /props' path)."),
        assistant: Path | None = typer.Option(None, "--assistant", callback=gguf_path,
                                                 help="--replay: the server's drafter GGUF."),
        n_draft: int | None = n_draft_option("--replay: the server's draft max when /metrics does not show it",
                                                default=None),
        concurrency: int = typer.Option(1, "--concurrency",
                                        help="Requests in flight at once (start the server with --parallel N)."),
        check_concurrency: int | None = typer.Option(None, "--check-concurrency", metavar="N",
                                                     help="Send every request alone, then N at a time (N >= 1), into "
                                                          "--out/solo and --out/concurrent; name each request "
                                                          "whose drafted / accepted or output differs (exit 1)."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary (and the replay) as JSON."),
    ) -> None:
        """Probe a running llama-server: per-request drafted / accepted, counters, tokens/s -> a trace."""
        from mtpscope.errors import MtpscopeError
        from mtpscope.traces.server.client import parse_header
        from mtpscope.traces.server.probe import ProbeSettings, probe

        with one_line_errors():
            if replay and assistant is None:
                raise MtpscopeError("--replay needs --assistant (the server does not report its draft model)",
                                    key="--assistant")
            if check_concurrency is not None and (replay or resume or concurrency != 1):
                raise MtpscopeError("--check-concurrency runs its own two probes: not with --replay, --resume or "
                                    "--concurrency", key="--check-concurrency")
            headers = dict(parse_header(h) for h in header or [])

            def progress(row: dict) -> None:
                if not as_json:
                    rate = row["acceptance_rate"]
                    print(f"request {row['request']} ({row['prompt']}): drafted {row['n_drafted']}, accepted "
                          f"{row['n_accepted']}" + (f" ({rate:.3f})" if rate is not None else "")
                          + (f", {row['tokens_per_s']:.1f} tokens/s" if row["tokens_per_s"] else ""),
                          file=sys.stderr)

            settings = ProbeSettings(n_predict=n_predict, repeat=repeat, temperature=temperature, seed=seed,
                                     timeout_s=timeout, concurrency=concurrency)
            if check_concurrency is not None:
                from mtpscope.traces.server.concurrency import check_concurrency as check
                from mtpscope.traces.server.concurrency import format_check

                chk = check(url, prompts_file=prompts, out=out, concurrency=check_concurrency, settings=settings,
                            headers=headers, overwrite=overwrite, on_request=progress)
                print(json.dumps(chk.to_dict(), indent=2, default=str) if as_json else format_check(chk))
                raise typer.Exit(0 if chk.all_equal else EXIT_FINDINGS)
            summary = probe(url, prompts_file=prompts, out=out, settings=settings, headers=headers, resume=resume,
                            overwrite=overwrite, on_request=progress)
        doc = {"trace": summary.out, "n_requests": summary.n_requests, "n_sent": summary.n_sent,
               "n_resumed": summary.n_resumed, "alarm": summary.alarm,
               "counters": None if summary.counters is None else summary.counters.to_dict(),
               "warnings": list(summary.warnings)}
        for w in summary.warnings:
            print(f"warning: {w}", file=sys.stderr)
        if not as_json:
            c = summary.counters
            print(f"wrote {summary.out}: {plural(summary.n_requests, 'request')} ({summary.n_sent} sent now"
                  + (f", {summary.n_resumed} kept" if summary.n_resumed else "") + ")"
                  + ("" if c is None else f"; counters: {c.n_draft_tokens} drafted, {c.n_accepted} accepted in "
                                          f"{c.n_drafts} drafts, per position {list(c.accepted_per_pos)}"))
        if summary.alarm:
            print(f"mtpscope: {summary.alarm}", file=sys.stderr)
        code = EXIT_FINDINGS if summary.alarm else 0
        if replay and assistant is not None:  # --replay without --assistant was refused above
            from mtpscope.traces.server.replay import replay_probe

            with one_line_errors():
                res = replay_probe(out, assistant=assistant, target=target, n_draft=n_draft)
            doc["replay"] = res.to_dict()
            if not as_json:
                print(format_replay(res))
            if not res.all_equal:
                code = EXIT_FINDINGS
        if as_json:
            print(json.dumps(doc, indent=2, default=str))
        raise typer.Exit(code)
