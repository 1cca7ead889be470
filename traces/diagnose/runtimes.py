"""``mtpscope diagnose --runtime NAME``: diagnose another runtime's MTP loop on a pair (docs/DIAGNOSE.md,
"Another runtime"). One job: record the pair with that runtime (:data:`RUNTIMES`), diagnose that trace with the
steps of :func:`traces.diagnose.run.diagnose` (the files checked are the GGUFs of a llama.cpp trace of the same
pair and prompts, given as ``against``), and add the runtime's convention differences from that llama.cpp trace as
``convention`` findings: ``compare``'s first differing round per prompt (``traces.analysis.runtime_diff``), its
cause checked by replaying the step under both conventions (``traces.run.runtime_replay``).

The registry is the one seam for a runtime: an entry names the runtime and the function that records it with
``record --runtime NAME``'s signature (``config``, ``target`` / ``assistant`` HF checkpoint folders, ``out``,
``prompts``, ``work_dir``, ``overwrite``, ``command``): ``mlx`` (mlx-vlm, :func:`_record_mlx`) and ``hf``
(HF transformers' assisted generation, :func:`_record_hf`). Another runtime is one more entry: its label and a
function that imports its recorder lazily and calls it with ``(config, **kw)``.

Imports: the records and ranking of this area, traces.diagnose.run, traces.analysis (compare_report,
runtime_diff), traces.run (mlx_record / hf_record lazily, runtime_replay lazily, record_config),
traces.store.reader.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtpscope.errors import MtpscopeError
from mtpscope.traces.analysis.runtime_diff import CAUSES as DIFF_CAUSES
from mtpscope.traces.analysis.runtime_diff import RuntimeDiff, confirmed_counts
from mtpscope.traces.analysis.wording import plural
from mtpscope.traces.diagnose import rank
from mtpscope.traces.diagnose.config import DiagnoseConfig
from mtpscope.traces.diagnose.records import (
    HIGH,
    INFO,
    LOW,
    WARNING,
    Diagnosis,
    Evidence,
    Finding,
    Fix,
    StepRun,
    ViewRef,
)
from mtpscope.traces.run.record_config import RecordConfig


def _record_mlx(config: RecordConfig, **kw: Any) -> Any:
    """``record --runtime mlx`` with its defaults: mlx-vlm's own position (p - 1), float32 weights (as llama.cpp's CPU
    backend computes: the checkpoints' float16 alone changes the demo's greedy output, docs/RUNTIMES.md)."""
    from mtpscope.traces.run.mlx_record import record_mlx

    return record_mlx(config, draft_position="p-1", dtype="f32", **kw)


def _record_hf(config: RecordConfig, *, work_dir: str | os.PathLike[str] | None = None, **kw: Any) -> Any:
    """``record --runtime hf`` with its defaults (greedy, float32, one torch thread); HF needs no working folder."""
    from mtpscope.traces.run.hf_record import record_hf

    return record_hf(config, **kw)


@dataclass(frozen=True)
class RuntimeEntry:
    """One runtime ``diagnose --runtime`` can record: ``label`` (in the text), ``record`` (``record --runtime``'s
    function: ``record(config, target=, assistant=, out=, prompts=, work_dir=, overwrite=, command=)``)."""

    label: str
    record: Callable[..., Any]


#: ``diagnose --runtime`` choices besides llama.cpp (the default)
RUNTIMES: dict[str, RuntimeEntry] = {
    "mlx": RuntimeEntry("mlx-vlm's own MTP loop", _record_mlx),
    "hf": RuntimeEntry("HF transformers' assisted generation", _record_hf),
}
#: where the runtime's recording goes in the output folder
RUNTIME_TRACE_DIR = "trace-{name}"
#: causes whose confirmed difference changes drafts (a defect against llama.cpp's drafts: a warning); the others
#: (last-round cap, end of generation, a difference no replay confirmed) are notes
_DRAFT_CAUSES = ("draft_position", "kv_visibility", "head", "dtype")


def gguf_pair(against: str | os.PathLike[str]) -> tuple[str, str]:
    """The target and assistant GGUFs a llama.cpp trace's manifest names (and that exist here).

    Raises:
        MtpscopeError: the trace is not a llama.cpp recording, or names no existing GGUF for a role.
    """
    from mtpscope.traces.store.reader import read_manifest

    man = read_manifest(against)
    if not (man.get("runtime") or {}).get("llama_cpp_python"):
        raise MtpscopeError("not a llama.cpp recording (its manifest names no llama_cpp_python)", path=against,
                            key="runtime.llama_cpp_python", expected="a llama.cpp trace of the same pair and prompts")
    out = []
    for role in ("target", "assistant"):
        m = (man.get("models") or {}).get(role)
        p = m.get("path") if isinstance(m, dict) else None
        if not isinstance(p, str) or not Path(p).is_file():
            raise MtpscopeError("the llama.cpp trace names no GGUF that exists here", path=against,
                                key=f"models.{role}.path", expected="an existing GGUF file", actual=p)
        out.append(p)
    return out[0], out[1]


def check_same_run(manifest: dict[str, Any], prompts: Sequence[Any], against_prompts: Sequence[Any], *, n_draft: int,
                   max_tokens: int, against: str | os.PathLike[str]) -> None:
    """Refuse a recording that ``compare`` could not line up with the llama.cpp trace: ``compare`` pairs these
    token prompts by their place, so they must be the llama.cpp trace's first prompts in its order, and the run
    must draft as many tokens per round and generate as many per prompt (else the last rounds differ by length).

    Raises:
        MtpscopeError: the first prompt, or the parameter, that differs (expected vs actual).
    """
    params = manifest.get("params") or {}
    for key, mine in (("n_draft", n_draft), ("max_tokens", max_tokens)):
        if params.get(key) is not None and int(params[key]) != int(mine):
            raise MtpscopeError(f"the llama.cpp trace was recorded with another {key}: record with the same",
                                path=against, key=f"params.{key}", expected=params[key], actual=mine)
    if len(prompts) > len(against_prompts):
        raise MtpscopeError("more prompts than the llama.cpp trace has", path=against, key="prompts",
                            expected=f"<= {len(against_prompts)}", actual=len(prompts))
    for i, (p, q) in enumerate(zip(prompts, against_prompts, strict=False)):
        if p.tokens != q.tokens:
            raise MtpscopeError("a prompt is not the llama.cpp trace's prompt at the same place (compare pairs them "
                                "by place): give its prompts, or its first ones, in its order", path=against,
                                key=f"prompts[{i}].tokens", expected=f"{len(q.tokens or ())} tokens as recorded",
                                actual="other tokens")


def convention_findings(rt: RuntimeDiff, *, runtime: str, against: str, trace: str) -> list[Finding]:
    """One ``convention`` finding per cause of the prompts' first differing rounds (``rt``: ``compare against
    trace``'s round-by-round diff, replayed): a warning where a replay confirmed a cause that changes drafts, else
    a note; unexplained first differences are one note."""
    link = ViewRef.of("compare", trace=against, trace_b=trace)
    checked = confirmed_counts(rt)
    ca, cb = rt.convention_a, rt.convention_b
    out = []
    for cause, n in rt.causes.items():
        yes, no = checked.get(cause, (0, 0))
        firsts = [d for d in rt.prompts if (d.cause or "unexplained") == cause and d.what != "none"]
        ex = firsts[0]
        where = (f"prompt {ex.prompt_id_a}, round {ex.round_a}/{ex.round_b} at position {ex.pos}"
                 + (f", step {ex.step}" if ex.step is not None else ""))
        if cause == "unexplained":
            out.append(Finding("convention", INFO, LOW,
                               f"{runtime}: the first difference from llama.cpp of {plural(n, 'prompt')} has no "
                               f"known convention (e.g. {where})",
                               (Evidence("explain", f"compare {against} {trace}: first difference of {n} prompts "
                                                    "unexplained", {"prompts": n}),),
                               Fix("none", "look at the round on the Compare page"), link,
                               subject=f"{runtime}:unexplained"))
            continue
        key = "draft_position" if cause == "draft_position" else cause
        va = ca.value(key) if ca is not None else None
        vb = cb.value(key) if cb is not None else None
        sure = yes > 0 and no == 0
        sev = WARNING if sure and cause in _DRAFT_CAUSES else INFO
        check = (f"; replayed: {yes} confirmed, {no} not" if (yes or no) else "; not replayed")
        title = (f"{runtime} differs from llama.cpp by {DIFF_CAUSES[cause]}: the first difference of "
                 f"{plural(n, 'prompt')}{check}")
        ev = [Evidence("replay" if (yes or no) else "explain",
                       f"{cause}: llama.cpp {va!r}, {runtime} {vb!r}; first differences {n} (e.g. {where}){check}",
                       {"prompts": n, "confirmed": yes, "not_confirmed": no,
                        "rounds_compared": rt.n_rounds_compared, "rounds_differing": rt.n_rounds_differing})]
        out.append(Finding("convention", sev, HIGH if sure else LOW, title, tuple(ev),
                           Fix("runtime_flag", f"run {runtime} with llama.cpp's {key} ({va!r}) where it has the option, "
                                               "or expect its drafts to differ from llama.cpp's (docs/RUNTIMES.md)",
                               key=key, value=va),
                           link, subject=f"{runtime}:{cause}", expected=va, actual=vb))
    return out


def diagnose_runtime(config: DiagnoseConfig, *, runtime: str, target: str | os.PathLike[str],
                     assistant: str | os.PathLike[str], against: str | os.PathLike[str],
                     prompts: Sequence[Any] | None, out: str | os.PathLike[str], work_dir: str | os.PathLike[str],
                     command: Sequence[str] | None = None,
                     on_step: Callable[[str, str], None] | None = None) -> Diagnosis:
    """Record ``prompts`` with ``runtime`` and diagnose that trace (module docstring); write ``diagnosis.json``.

    Args:
        config: the run parameters (``n_draft``, ``max_tokens``; the replay steps are not run on the runtime's
            trace: their baseline is llama.cpp's own conventions, which this runtime does not share).
        runtime: a key of :data:`RUNTIMES`.
        target / assistant: the pair as Hugging Face checkpoint folders (``record --runtime``).
        against: a llama.cpp trace of the same pair and prompts (its GGUFs are the files verified).
        prompts: token prompts (:class:`traces.run.prompts.PromptSpec`); None: ``against``'s own prompts.
        out: the output folder (``trace-NAME/``, ``diagnosis.json``); work_dir: the runtime's working folder.

    Raises:
        MtpscopeError: an unknown runtime, ``against`` not a llama.cpp trace naming existing GGUFs, a recording that
            fails (its message).
    """
    from mtpscope.traces.analysis.compare_report import compare_traces
    from mtpscope.traces.diagnose.run import DIAGNOSIS_FILE, NOTHING_WRONG, diagnose
    from mtpscope.traces.run.prompts import PromptSpec
    from mtpscope.traces.run.runtime_replay import replay_first_differences
    from mtpscope.traces.store.reader import open_trace, read_manifest

    if runtime not in RUNTIMES:
        raise MtpscopeError("unknown runtime", key="runtime", expected=" or ".join(RUNTIMES), actual=runtime)
    entry = RUNTIMES[runtime]
    g_target, g_assistant = gguf_pair(against)
    man = read_manifest(against)
    ours = [PromptSpec(tokens=tuple(int(t) for t in p["tokens"]), category=p.get("category"))
            for p in man.get("prompts") or [] if p.get("tokens")]
    prompts = ours if prompts is None else list(prompts)
    check_same_run(man, prompts, ours, n_draft=config.n_draft, max_tokens=config.max_tokens, against=against)
    outp = Path(out)
    outp.mkdir(parents=True, exist_ok=True)
    dst = outp / RUNTIME_TRACE_DIR.format(name=runtime)
    say = on_step or (lambda step, msg: None)
    say("record", f"recording with {entry.label} into {dst} (n_draft {config.n_draft}, {config.max_tokens} tokens)")
    t0 = time.perf_counter()
    entry.record(RecordConfig(n_draft=config.n_draft, max_tokens=config.max_tokens), target=target,
                 assistant=assistant, out=dst, prompts=list(prompts), work_dir=work_dir, overwrite=True,
                 command=command)
    rec = StepRun("record", "ran", time.perf_counter() - t0, f"{entry.label} into {dst}")
    d = diagnose(dataclasses.replace(config, replay=False), target=g_target, assistant=g_assistant, trace=dst,
                 out=outp, on_step=on_step)
    say("compare", f"{runtime} against llama.cpp ({against}), first differing steps replayed")
    ta, tb = open_trace(against), open_trace(dst)
    rt = compare_traces(ta, tb).runtimes
    conv: list[Finding] = []
    if rt is not None:
        rt = replay_first_differences(rt, ta, tb)
        conv = convention_findings(rt, runtime=runtime, against=os.fspath(against), trace=os.fspath(dst))
    found = list(d.findings)
    limits = list(d.limits)
    if any(f.is_defect for f in conv):    # the core's all-clear was said before these findings
        found = [dataclasses.replace(f, title=f.title.replace(f"; {NOTHING_WRONG}", "")) for f in found]
        limits = [x.replace(f"; {NOTHING_WRONG}", "") for x in limits]
    steps = tuple(rec if s.name == "record" else s for s in d.steps)
    notes = (*d.notes, f"{runtime}: the files verified are the GGUFs of the llama.cpp trace {against}; the replay "
             "steps did not run on the runtime's trace (their baseline is llama.cpp's conventions), its first "
             "differing steps were replayed instead")
    res = dataclasses.replace(d, findings=rank.rank([*found, *conv]), limits=tuple(limits), steps=steps, notes=notes)
    (outp / DIAGNOSIS_FILE).write_text(json.dumps(res.to_dict(), indent=1, default=str) + "\n", encoding="utf-8")
    return res


__all__ = ["RUNTIMES", "RUNTIME_TRACE_DIR", "RuntimeEntry", "check_same_run", "convention_findings", "diagnose_runtime", "gguf_pair"]
