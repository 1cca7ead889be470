"""Run the real MTP loop (llama.cpp through traces.run.llama) on a target/drafter pair in a child process.

A file llama.cpp aborts on (GGML_ABORT / GGML_ASSERT -> SIGABRT) kills only the child; the parent gets the
stage the child reached, its exit status / signal and llama.cpp's last stderr lines. Used by the tests
that check verify's verdicts against what the runtime really does (tests/test_runtime_verdicts.py).

Stages per pair, in order: ``target_loaded``, ``loaded`` (both models), ``contexts`` (target context + MTP drafter context),
``prefill``, ``first_draft`` (the first drafter decode returned), ``done`` (``rounds`` greedy rounds of 3
drafts, with the drafts and the number accepted). ``first_logits``: the drafter's logits at the first
draft step (rounded to 5 decimals), to compare two drafters on the same target.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PROMPT = ("The history of the city begins with a small market by the river, where traders met each week. "
          "Over the years the market grew into a town, the town into a city, and the river was bridged. ")

_CHILD = r"""
import json, sys
import numpy as np
from mtpscope.traces.run.llama import model as lm

jobs, rounds, prompt = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
for job, (target, drafter) in enumerate(jobs):
    def say(**kw):
        print(json.dumps({"job": job, **kw}), flush=True)
    tm = lm.LlamaModel(target)
    say(stage="target_loaded")
    dm = lm.LlamaModel(drafter)
    say(stage="loaded")
    tctx = lm.LlamaContext(tm, n_ctx=1024, n_batch=512, flash_attn=False, nextn=True, masked=False)
    dctx = lm.LlamaContext(dm, n_ctx=1024, n_batch=512, mtp_of=tctx, flash_attn=False, nextn=True, masked=True)
    say(stage="contexts")
    tb = lm.TokenBatch(512)
    db = lm.DraftBatch(dm.n_embd_inp)
    toks = tm.tokenize(prompt, add_special=True)
    tb.set(toks, 0, logits="last")
    tctx.decode(tb)
    say(stage="prefill", n_prompt=len(toks))
    pos = len(toks)
    pending = int(np.argmax(tctx.logits(tb.batch.n_tokens - 1)))
    h = tctx.nextn(tb.batch.n_tokens - 1).copy()
    drafts, accepted = [], 0
    for r in range(rounds):
        tok, hin, dr = pending, h, []
        for k in range(3):
            db.set(tok, pos, hin)
            dctx.decode(db)
            if r == 0 and k == 0:
                say(stage="first_draft", first_logits=[round(float(x), 5) for x in dctx.logits(0)])
            d = int(np.argmax(dctx.logits(0)))
            hn = dctx.nextn(0).copy()
            dr.append(d)
            tok, hin = d, hn
        tb.set([pending, *dr], pos, logits="all")
        tctx.decode(tb)
        tgt = [int(np.argmax(tctx.logits(i))) for i in range(4)]
        n = 0
        while n < 3 and dr[n] == tgt[n]:
            n += 1
        h = tctx.nextn(n).copy()
        tctx.seq_rm(pos + n + 1, -1)
        drafts.append(dr)
        accepted += n
        pending = tgt[n]
        pos += n + 1
    say(stage="done", drafts=drafts, accepted=accepted, drafted=3 * rounds)
    for x in (db, tb, dctx, tctx, dm, tm):
        x.close()
"""


@dataclass(frozen=True)
class Probe:
    """What the child did: ``stage`` (last reached), ``returncode`` (negative = killed by that signal),
    ``signal`` name or None, ``drafts`` / ``accepted`` / ``drafted`` (stage ``done``), ``stderr`` tail,
    ``first_logits`` (the first draft step's logits)."""

    stage: str
    returncode: int
    signal: str | None
    drafts: list[list[int]] | None
    accepted: int | None
    drafted: int | None
    stderr: str
    first_logits: list[float] | None = None

    @property
    def acceptance_rate(self) -> float | None:
        return None if not self.drafted else (self.accepted or 0) / self.drafted


def probe_many(pairs: list[tuple[Path | str, Path | str]], rounds: int = 2, timeout: float = 600) -> list[Probe]:
    """Run the loop on each (target, drafter) pair in turn in one child process (one start-up for all).

    A pair the runtime aborts on ends the child: that pair's :class:`Probe` says so (signal, stderr),
    and the pairs after it are run in a new child."""
    # llama.cpp's log on stderr (for its messages); no gdb backtrace on an abort (slow, and not needed)
    env = {**os.environ, "MTPSCOPE_LLAMA_LOG": "1", "GGML_NO_BACKTRACE": "1"}
    out: list[Probe] = []
    todo = [(str(t), str(d)) for t, d in pairs]
    while todo:
        proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(todo), str(rounds), PROMPT],
                              capture_output=True, text=True, timeout=timeout, env=env)
        seen: dict[int, dict] = {}
        first: dict[int, list[float]] = {}
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                seen[r["job"]] = r
                if "first_logits" in r:
                    first[r["job"]] = r["first_logits"]
        done = [j for j, r in seen.items() if r["stage"] == "done"]
        n_ok = len(done)
        for j in range(n_ok):
            r = seen[j]
            out.append(Probe("done", 0, None, r["drafts"], r["accepted"], r["drafted"], "", first.get(j)))
        if n_ok == len(todo):
            break
        # the pair after the last finished one ended the child
        r = seen.get(n_ok, {"stage": "none"})
        sig = signal.Signals(-proc.returncode).name if proc.returncode < 0 else None
        tail = "\n".join(proc.stderr.splitlines()[-40:])
        out.append(Probe(r["stage"], proc.returncode, sig, None, None, None, tail, first.get(n_ok)))
        todo = todo[n_ok + 1:]
    return out


def probe(target: Path | str, drafter: Path | str, rounds: int = 2, timeout: float = 300) -> Probe:
    """:func:`probe_many` for one pair."""
    return probe_many([(target, drafter)], rounds, timeout)[0]

# ------------------------------------------------------------------- plain model loads (verdict tests)

_LOAD_CHILD = r"""
import json, os, sys
import llama_cpp
llama_cpp.llama_backend_init()
for path in sys.argv[1:]:
    print("@@BEGIN " + path, file=sys.stderr, flush=True)
    p = llama_cpp.llama_model_default_params()
    p.vocab_only = False
    p.use_mmap = True
    m = llama_cpp.llama_model_load_from_file(path.encode(), p)
    ok = bool(m)
    if ok:
        llama_cpp.llama_model_free(m)
    print("@@END " + path, file=sys.stderr, flush=True)
    print(json.dumps({"path": path, "ok": ok}), flush=True)
"""


def run_loads(paths: list[str]) -> dict[str, tuple[str, str]]:
    """Load each GGUF with llama.cpp's own ``llama_model_load_from_file`` in a child process (one child for
    many files; a file that aborts the child is recorded as CRASH and a new child goes on with the rest).

    Returns:
        path -> (``"OK"`` | ``"FAIL"`` | ``"CRASH"``, llama.cpp's log of that load).
    """
    out: dict[str, tuple[str, str]] = {}
    todo = list(paths)
    while todo:
        proc = subprocess.run([sys.executable, "-c", _LOAD_CHILD, *todo], capture_output=True, text=True, timeout=300)
        done = {}
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                done[r["path"]] = "OK" if r["ok"] else "FAIL"
        logs: dict[str, str] = {}
        cur = None
        for line in proc.stderr.splitlines():
            if line.startswith("@@BEGIN "):
                cur = line[8:]
                logs[cur] = ""
            elif line.startswith("@@END "):
                cur = None
            elif cur is not None:
                logs[cur] += line + "\n"
        for p in todo:
            if p in done:
                out[p] = (done[p], logs.get(p, ""))
        rest = [p for p in todo if p not in done]
        if rest:
            # the first unfinished file crashed the child; record it and go on with the others
            out[rest[0]] = ("CRASH", logs.get(rest[0], proc.stderr[-2000:]))
            rest = rest[1:]
        todo = rest
    return out
