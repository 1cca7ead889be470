"""What the Server page starts: a probe on a thread of this app process (the page refreshes from its trace while
it writes) and a replay of one request with mtpscope's recorder (in its worker process). Both are library calls
(:mod:`mtpscope.traces.server`); the job lives in the session (:data:`mtpscope.app.selection.SERVER_JOB`).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import streamlit as st

from mtpscope.app import safety
from mtpscope.app import selection as sel
from mtpscope.app.guard import internal_error_line
from mtpscope.errors import MtpscopeError

if TYPE_CHECKING:
    from mtpscope.traces.server.probe import ProbeSettings, ProbeSummary
    from mtpscope.traces.server.replay import ServerReplay


@dataclass
class ProbeJob:
    """A probe started by the Server page (:func:`probe_start`), filled in by its thread: not frozen, the thread
    sets ``done`` (finished, either way), ``error`` (its one line, None when it succeeded) and ``summary``
    (:class:`mtpscope.traces.server.probe.ProbeSummary`) while the page reads them.

    Attributes:
        out: the trace folder it writes; url: the server (as checked).
    """

    out: str
    url: str
    done: bool = False
    error: str | None = None
    summary: ProbeSummary | None = None


def server_url(url: str) -> str:
    """``url`` if the Server page may send requests to it (:func:`mtpscope.app.safety.check_server_url`).

    Raises:
        PathNotAllowedError: another host without ``MTPSCOPE_ALLOW_URLS=1`` and the allow-list.
    """
    return safety.check_server_url(url)


def probe_start(url: str, prompts: str | os.PathLike[str], out: str | os.PathLike[str], *, n_predict: int,
                repeat: int, header: str | None = None) -> ProbeJob:
    """Start ``mtpscope probe`` on a thread after the URL and path checks; the :class:`ProbeJob` is kept in the
    session and returned.

    Raises:
        PathNotAllowedError: a URL or path the app may not use.
    """
    from mtpscope.traces.server.client import parse_header
    from mtpscope.traces.server.probe import ProbeSettings, probe

    base = server_url(url)
    pfile = safety.check_path(prompts, sel.roots(), kind="file")
    out_p = Path(out).expanduser()
    if out_p.parent == probes_dir():
        out_p.parent.mkdir(parents=True, exist_ok=True)
    safety.check_path(out_p.parent, sel.roots(), kind="dir")
    headers = dict([parse_header(header)]) if header and header.strip() else {}
    job = ProbeJob(out=str(out_p), url=base)

    def run() -> None:
        try:
            job.summary = probe(base, prompts_file=pfile, out=out_p, headers=headers, overwrite=True,
                                   settings=ProbeSettings(n_predict=int(n_predict), repeat=int(repeat)),
                                   command=["mtpscope app", "probe", base])
        except Exception as e:  # noqa: BLE001 - shown on the page as one line
            job.error = e.one_line() if isinstance(e, MtpscopeError) else internal_error_line(e, "probing")
        finally:
            job.done = True

    threading.Thread(target=run, name="mtpscope-probe", daemon=True).start()
    st.session_state[sel.SERVER_JOB] = job
    return job


def probe_defaults() -> ProbeSettings:
    """The probe's settings when nothing is changed: :class:`mtpscope.traces.server.probe.ProbeSettings`'
    defaults, the one home of ``mtpscope probe``'s (``--n-predict 128``, ``--repeat 1``)."""
    from mtpscope.traces.server.probe import ProbeSettings

    return ProbeSettings()


def probes_dir() -> Path:
    """Where the Server page writes its probe traces unless told otherwise: ``<uploads>/probes`` in the cache
    folder (:func:`mtpscope.app.safety.uploads_dir`, always allowed), never the working directory."""
    return safety.uploads_dir() / "probes"


def default_probe_out(url: str) -> Path:
    """The trace folder of a probe of ``url`` (``http://127.0.0.1:8080`` -> ``<probes>/127.0.0.1-8080``): one
    per server, a new probe of it replacing the last."""
    from urllib.parse import urlsplit

    parts = urlsplit(url.strip())
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in (parts.netloc or "server").replace(":", "-"))
    return probes_dir() / (name[:80] or "server")


def demo_prompts_file() -> Path:
    """The demo's categorised prompts (its ``prompts.json``: token ids, name, category) as a prompts file
    (``mtpscope record --prompts``, one JSON line ``{"tokens", "id", "category"}`` each), written once under the
    uploads folder; what the Server page probes with unless a file is given. A name the demo gives twice is
    numbered (``name#2``): the ids of a prompts file are unique.

    Raises:
        MtpscopeError: the demo's prompts are not there or not readable (naming the file).
    """
    import json

    from mtpscope.demo.spec import TRAINED_DATA

    src = TRAINED_DATA / "prompts.json"
    try:
        doc = json.loads(src.read_text(encoding="utf-8"))
        lines, seen = [], set()
        for p in doc["prompts"]:
            name = pid = str(p["name"])
            n = 1
            while pid in seen:      # a prompts file's ids are unique; the demo repeats a name: name#2, name#3
                n += 1
                pid = f"{name}#{n}"
            seen.add(pid)
            lines.append(json.dumps({"tokens": [int(t) for t in p["ids"]], "id": pid, "category": str(p["category"])}))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise MtpscopeError("the demo's prompts cannot be read", path=src, expected="prompts.json with "
                            "prompts[].ids, name, category", actual=type(e).__name__) from None
    return safety.store_upload(("\n".join(lines) + "\n").encode(), "demo-prompts.jsonl",
                               safety.uploads_dir() / "prompts")


def store_prompts(data: bytes, name: str) -> Path:
    """An uploaded prompts file stored by content hash under ``<uploads>/prompts`` (never over another file:
    :func:`mtpscope.app.safety.store_upload`).

    Raises:
        InspectorError: too large, or the name taken by other bytes.
    """
    return safety.store_upload(data, name, safety.uploads_dir() / "prompts")


def probe_job() -> ProbeJob | None:
    """The probe started in this session, if any."""
    return st.session_state.get(sel.SERVER_JOB)


def replay_request(path: str | os.PathLike[str], request: int, assistant: str | os.PathLike[str],
                   target: str | os.PathLike[str] | None = None) -> ServerReplay:
    """Replay one request of a probe trace with mtpscope's recorder (:mod:`mtpscope.traces.server.replay`) into
    ``<trace>/replay-request-N``; the comparison (:class:`mtpscope.traces.server.replay.ServerReplay`).

    Raises:
        PathNotAllowedError: a path outside the allowed folders; ServerError & co: the replay failed.
    """
    from mtpscope.traces.server.replay import replay_probe

    p = safety.check_path(path, sel.roots(), kind="dir")
    a = safety.check_path(assistant, sel.roots(), kind="file")
    t = safety.check_path(target, sel.roots(), kind="file") if target else None
    res = replay_probe(p, assistant=a, target=t, requests=[int(request)], out=p / f"replay-request-{int(request)}",
                       command=["mtpscope app", "replay", str(p), str(request)])
    return res


def open_step(trace_dir: str | os.PathLike[str], prompt_id: int, round_: int = 0) -> None:
    """Select ``trace_dir`` and open the Step view at (prompt_id, round)."""
    sel.select_trace(str(trace_dir))
    sel.open_round((int(prompt_id), int(round_)))
