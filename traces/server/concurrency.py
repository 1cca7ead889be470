"""``mtpscope probe URL --check-concurrency N``: every request alone, then N at a time, compared request by request.

A llama-server started with ``--parallel N`` decodes the requests of its N slots in one batch: one target
batch holds every slot's pending token and drafts, and the MTP drafter (common/speculative.cpp, ``draft-mtp``)
keeps its carried hidden rows per sequence (slot) and drafts for all drafting slots in one call. A request's
drafted / accepted counts and output must not depend on what the other slots do; when a hidden row of one slot
reached another slot's draft (a cross-slot mix-up), that request's drafted / accepted (``timings.draft_n`` /
``draft_n_accepted``) or output would change while the others run. So the sentinel

1. probes every prompt with one request at a time (``<out>/solo``, concurrency 1),
2. probes them again, N requests in flight at once (``<out>/concurrent``; N = 1: alone again, the run-to-run
   baseline),
3. pairs the two runs' requests (same repeat, same prompt) and names each request whose drafted, accepted or
   output tokens differ (:class:`ConcurrencyCheck`, also written to ``<out>/concurrency.json``).

Greedy (temperature 0) or seeded requests are deterministic per request, so any difference is the batch's doing:
a mix-up, or (a milder cause worth knowing too) numerics that change with the batch's size (a near-tie argmax
that flips when the target's matrix products run over more rows).

Imports: ``probe``, traces (the trace reader), errors.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mtpscope.errors import MtpscopeError
from mtpscope.traces.analysis.records import JsonRecord
from mtpscope.traces.server.probe import ProbeSettings, probe
from mtpscope.traces.store.reader import open_trace

SOLO_DIR = "solo"
CONCURRENT_DIR = "concurrent"
CHECK_JSON = "concurrency.json"


@dataclass(frozen=True)
class ConcurrencyRow(JsonRecord):
    """One request alone and among N.

    Attributes:
        request: the request's number in both probes (repeat * prompts + prompt index).
        prompt: the prompt's id (from the prompts file, else its index).
        solo_drafted / solo_accepted: ``timings.draft_n`` / ``draft_n_accepted`` when it ran alone.
        drafted / accepted: the same among N concurrent requests.
        solo_slot / slot: the slot (``id_slot``) it ran in each time.
        same_output: the generated token ids are equal (None when a side did not return them).
        n_overlapping: other requests of the concurrent run whose [sent, answered] interval overlaps its own.
        differs: drafted, accepted or output differ.
    """

    request: int
    prompt: str
    solo_drafted: int
    solo_accepted: int
    drafted: int
    accepted: int
    solo_slot: int | None
    slot: int | None
    same_output: bool | None
    n_overlapping: int
    differs: bool


@dataclass(frozen=True)
class ConcurrencyCheck(JsonRecord):
    """What ``--check-concurrency N`` found.

    Attributes:
        url: the server (without query).
        concurrency: N, the requests in flight at once in the second run.
        total_slots: the server's ``/props`` ``total_slots`` (its ``--parallel``), None when not reported.
        solo / concurrent: the two probe traces.
        rows: one :class:`ConcurrencyRow` per request, in request order.
        n_differ: requests whose drafted, accepted or output differ.
        note: a caveat (the server has fewer slots than N: requests queued, not batched), or None.
    """

    url: str
    concurrency: int
    total_slots: int | None
    solo: str
    concurrent: str
    rows: tuple[ConcurrencyRow, ...]
    n_differ: int
    note: str | None

    @property
    def all_equal(self) -> bool:
        """Every request has the same drafted, accepted and output alone and among N."""
        return self.n_differ == 0 and len(self.rows) > 0

    @property
    def differing(self) -> tuple[ConcurrencyRow, ...]:
        """The rows that differ."""
        return tuple(r for r in self.rows if r.differs)


def _rows(path: Path) -> dict[tuple[int, int], dict[str, Any]]:
    t = open_trace(path)
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for r in t.requests.to_dict(orient="records"):
        out[(int(r["repeat"]), int(r["prompt_id"]))] = {str(k): v for k, v in r.items()}
    return out


def _int(v: Any) -> int | None:
    try:
        return None if v is None or v != v else int(v)
    except (TypeError, ValueError):
        return None


def _tokens(v: Any) -> list[int] | None:
    return None if v is None or isinstance(v, float) else [int(x) for x in v]


def compare_runs(solo: Mapping[tuple[int, int], Mapping[str, Any]],
                 concurrent: Mapping[tuple[int, int], Mapping[str, Any]]) -> tuple[ConcurrencyRow, ...]:
    """Pair two probes' request rows by (repeat, prompt id) and compare drafted, accepted and output tokens.

    Args:
        solo / concurrent: ``{(repeat, prompt_id): requests row}`` of each run (rows as the trace stores them:
            ``request``, ``prompt``, ``n_drafted``, ``n_accepted``, ``id_slot``, ``output_tokens``,
            ``started_unix_s``, ``ended_unix_s``).

    Returns:
        One :class:`ConcurrencyRow` per pair, by request number; requests missing from one run are left out.
    """
    spans = [(k, float(r["started_unix_s"]), float(r["ended_unix_s"])) for k, r in concurrent.items()
             if r.get("started_unix_s") is not None and r.get("ended_unix_s") is not None
             and r["ended_unix_s"] == r["ended_unix_s"]]
    out = []
    for key in sorted(set(solo) & set(concurrent), key=lambda k: int(concurrent[k]["request"])):
        a, b = solo[key], concurrent[key]
        ta, tb = _tokens(a.get("output_tokens")), _tokens(b.get("output_tokens"))
        same = None if ta is None or tb is None else ta == tb
        mine = next(((s, e) for k, s, e in spans if k == key), None)
        overl = 0 if mine is None else sum(1 for k, s, e in spans if k != key and s < mine[1] and mine[0] < e)
        da, aa, db, ab = (int(a["n_drafted"]), int(a["n_accepted"]), int(b["n_drafted"]), int(b["n_accepted"]))
        out.append(ConcurrencyRow(request=int(b["request"]), prompt=str(b.get("prompt")), solo_drafted=da,
                                  solo_accepted=aa, drafted=db, accepted=ab, solo_slot=_int(a.get("id_slot")),
                                  slot=_int(b.get("id_slot")), same_output=same, n_overlapping=overl,
                                  differs=(da, aa) != (db, ab) or same is False))
    return tuple(out)


def check_concurrency(url: str, *, prompts_file: str | os.PathLike[str], out: str | os.PathLike[str],
                      concurrency: int, settings: ProbeSettings | None = None,
                      headers: Mapping[str, str] | None = None, overwrite: bool = False,
                      on_request: Callable[[dict[str, Any]], None] | None = None) -> ConcurrencyCheck:
    """Probe every prompt alone, then ``concurrency`` at a time, and compare (see the module docstring).

    Args:
        url: the server (start it with ``--parallel N``, N >= ``concurrency``, for the requests to share a batch).
        prompts_file: as :func:`mtpscope.traces.server.probe.probe`.
        out: a folder for the two probe traces (``solo/``, ``concurrent/``) and ``concurrency.json``.
        concurrency: N >= 1 (1: every request twice alone, the run-to-run baseline).
        settings: the requests' settings (n_predict, temperature, seed, …; its ``concurrency`` is ignored).
        headers / overwrite / on_request: as :func:`~mtpscope.traces.server.probe.probe`.

    Returns:
        :class:`ConcurrencyCheck`.

    Raises:
        MtpscopeError: ``concurrency`` < 1 (nothing is sent).
        ServerError / TraceError: as :func:`~mtpscope.traces.server.probe.probe`.
    """
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise MtpscopeError("--check-concurrency compares N concurrent requests with each alone: N must be >= 1",
                            key="--check-concurrency", expected=">= 1", actual=concurrency)
    base = replace(settings or ProbeSettings(), concurrency=1)
    base.check()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    solo_dir, conc_dir = out / SOLO_DIR, out / CONCURRENT_DIR
    probe(url, prompts_file=prompts_file, out=solo_dir, settings=base, headers=headers, overwrite=overwrite,
          on_request=on_request)
    probe(url, prompts_file=prompts_file, out=conc_dir, settings=replace(base, concurrency=concurrency),
          headers=headers, overwrite=overwrite, on_request=on_request)
    rows = compare_runs(_rows(solo_dir), _rows(conc_dir))
    man = open_trace(conc_dir).manifest
    slots = _int(((man.get("server") or {}).get("props") or {}).get("total_slots"))
    note = None
    if slots is not None and slots < concurrency:
        note = (f"the server has {slots} slot{'s' if slots != 1 else ''} (--parallel {slots}): "
                f"{concurrency} requests were sent at once but at most {slots} decoded together")
    res = ConcurrencyCheck(url=str((man.get("params") or {}).get("url") or url), concurrency=concurrency,
                           total_slots=slots, solo=os.fspath(solo_dir), concurrent=os.fspath(conc_dir), rows=rows,
                           n_differ=sum(1 for r in rows if r.differs), note=note)
    (out / CHECK_JSON).write_text(json.dumps(res.to_dict(), indent=2, default=str) + "\n")
    return res


def format_check(res: ConcurrencyCheck) -> str:
    """:class:`ConcurrencyCheck` as text: one line per request, then the verdict."""
    lines = [f"{len(res.rows)} requests alone and {res.concurrency} at a time on {res.url} "
             f"({res.total_slots if res.total_slots is not None else '?'} slots)",
             "", "request  prompt                drafted alone / among N  accepted alone / among N  slot  "
                 "overlapping  output"]
    for r in res.rows:
        out = {True: "same", False: "differs", None: "?"}[r.same_output]
        mark = "≠" if r.differs else " "
        lines.append(f"{mark}{r.request:6d}  {r.prompt[:20]:20}  {r.solo_drafted:>13} / {r.drafted:<9}"
                     f"  {r.solo_accepted:>14} / {r.accepted:<9}  {_s(r.slot):>4}  {r.n_overlapping:11d}  {out}")
    lines.append("")
    if res.note:
        lines.append(f"note: {res.note}")
    if res.n_differ:
        lines.append(f"{res.n_differ} of {len(res.rows)} requests differ when run {res.concurrency} at a time: "
                     + ", ".join(f"{r.request} ({r.prompt})" for r in res.differing[:10])
                     + (" …" if res.n_differ > 10 else ""))
    else:
        lines.append(f"all {len(res.rows)} requests agree alone and {res.concurrency} at a time: same drafted, "
                     f"accepted and output")
    return "\n".join(lines)


def _s(v: Any) -> str:
    return "?" if v is None else str(v)


__all__ = ["CHECK_JSON", "CONCURRENT_DIR", "SOLO_DIR", "ConcurrencyCheck", "ConcurrencyRow", "check_concurrency",
           "compare_runs", "format_check"]
