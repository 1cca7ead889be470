"""``diagnose(...)``: every step of ``mtpscope diagnose`` in order, and the :class:`Diagnosis` they add up to.

One job: run the steps (docs/DIAGNOSE.md, "Steps"), time them, keep going when one cannot run (saying why), and
rank what they found:

1. ``verify`` of the drafter with its target (and the HF checkpoint given as reference), with the runtime
   verdicts (:mod:`files`);
2. the drafter's metadata against the published configurations (:mod:`published`);
3. a recording of the prompts with llama.cpp (:func:`mtpscope.traces.run.recorder.record` with
   ``DiagnoseConfig.recording``: categories, the target's side, plain decoding measured: ``baseline=True``), or the
   given trace;
4. its explanation (:func:`mtpscope.traces.sweep.advice.explain_with_baseline`) and report
   (:func:`mtpscope.traces.analysis.metrics.report`);
5. a replay of a sample of its rounds under each convention variant (:mod:`variants`), and, for a key that differs
   from the target's (the sliding window), once more with the target's value (:func:`files.key_cost`);
6. with a reference, the same sample replayed through it, and the two files' differences (:mod:`reference`);
7. the advice: n_draft per category or plain decoding, what limits acceptance, and, without a reference, the
   behaviour that points at the drafter (:mod:`behaviour`; never the all-clear :data:`NOTHING_WRONG` then, but
   :data:`behaviour.UNPINNED`, the check that would pin it).

Imports: this area's modules; inspector (gguf, validate through :mod:`files`); traces.run (recorder, replay, llama
binding); traces.analysis (metrics, vocab, compare_report); traces.sweep.advice; traces.store.reader.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from mtpscope.errors import MtpscopeError, RuntimeAbortedError, RuntimeUnavailableError, TraceError
from mtpscope.traces.diagnose import behaviour, files, published, rank, reference, variants
from mtpscope.traces.diagnose.config import DiagnoseConfig
from mtpscope.traces.diagnose.records import (
    ERROR,
    HIGH,
    INFO,
    MEDIUM,
    Diagnosis,
    DiagnosisSummary,
    Evidence,
    Finding,
    Fix,
    ReferenceSummary,
    StepRun,
    VariantsSummary,
    ViewRef,
)

if TYPE_CHECKING:
    from mtpscope.traces.analysis.explain_report import Explanation
    from mtpscope.traces.analysis.report_records import TraceReport

#: The diagnosis document written into the output folder (``diagnosis.json``), and the folders beside it.
DIAGNOSIS_FILE, TRACE_DIR, REPLAY_DIR, REFERENCE_DIR = "diagnosis.json", "trace", "replay", "reference"
#: Where a key that differs from the target's is replayed with the target's value (a copy of the drafter, its replay).
KEY_DIR = "replay-key"
#: Said when nothing points at a defect.
NOTHING_WRONG = "nothing points at the drafter file or the runtime"


class _Steps:
    """The step log: each step's status, time and note, and a progress callback."""

    def __init__(self, on_step: Callable[[str, str], None] | None) -> None:
        self.runs: list[StepRun] = []
        self.notes: list[str] = []
        self.on_step = on_step

    def say(self, name: str, message: str) -> None:
        if self.on_step is not None:
            self.on_step(name, message)

    def skip(self, name: str, why: str) -> None:
        self.runs.append(StepRun(name, "skipped", 0.0, why))
        self.notes.append(f"{name}: skipped ({why})")
        self.say(name, f"skipped: {why}")

    @contextmanager
    def step(self, name: str, what: str, *, fatal: bool = False) -> Any:
        """Time the block; an error of ours (or an OSError) marks the step failed and raises :class:`_StepFailed`
        (the caller goes on), or, with ``fatal``, the error itself (unreadable input ends the diagnosis)."""
        self.say(name, what)
        t0 = time.perf_counter()
        box: dict[str, str] = {}
        try:
            yield box
        except (MtpscopeError, OSError) as e:
            self.runs.append(StepRun(name, "failed", time.perf_counter() - t0, str(e)))
            self.notes.append(f"{name}: failed ({e})")
            self.say(name, f"failed: {e}")
            if fatal:
                raise
            raise _StepFailed(name) from e
        self.runs.append(StepRun(name, "ran", time.perf_counter() - t0, box.get("note", "")))


class _StepFailed(Exception):
    pass


def _manifest_model(manifest: dict[str, Any], role: str) -> str | None:
    m = (manifest.get("models") or {}).get(role)
    p = m.get("path") if isinstance(m, dict) else None
    return p if isinstance(p, str) and Path(p).is_file() else None


def _llama_missing() -> str | None:
    try:
        from mtpscope.traces.run.llama.binding import llama

        llama()
    except RuntimeUnavailableError as e:
        return str(e)
    return None


def _record(steps: _Steps, found: list[Finding], cfg: Any, *, target: str, assistant: str, out: Path,
            prompts: Sequence[Any] | None, prompts_file: Any, command: Sequence[str] | None,
            on_round: Any) -> Path | None:
    """Step 3 with ``cfg`` (the :class:`RecordConfig` of :attr:`DiagnoseConfig.recording`)."""
    from mtpscope.traces.run.recorder import record

    dst = out / TRACE_DIR
    try:
        with steps.step("record", f"recording with llama.cpp into {dst} (n_draft {cfg.n_draft}, {cfg.max_tokens} "
                        "tokens per prompt, plain decoding measured first)") as box:
            try:
                s = record(cfg, target=target, assistant=assistant, out=dst, prompts=prompts,
                           prompts_file=prompts_file, overwrite=True, command=command, on_round=on_round,
                           preflight=False)
            except RuntimeAbortedError as e:
                found.append(Finding(
                    "runtime_refuses", ERROR, HIGH, f"llama.cpp aborted running the pair: {e}",
                    (Evidence("record", f"recording stopped: {e}", {"aborted": e.aborted}),),
                    Fix("replace_file", "the pair crashes llama.cpp: fix the findings of `mtpscope verify` first"),
                    ViewRef.of("validate", drafter=assistant, target=target), subject="recording",
                    expected="runs", actual="aborted"))
                box["note"] = "llama.cpp aborted"
                return None
            box["note"] = (f"{s.n_prompts} prompts, {s.n_rounds} rounds, acceptance rate "
                           f"{s.acceptance_rate if s.acceptance_rate is not None else float('nan'):.3f}")
    except _StepFailed:
        return None
    return dst


def check_out(out: str | os.PathLike[str]) -> None:
    """Refuse ``out`` as a diagnosis folder when it is a trace directory (it holds a trace's ``manifest.json``): the
    diagnosis would write its ``diagnosis.json`` and ``replay/`` into the trace.

    Raises:
        TraceError: it is one; nothing is written there.
    """
    from mtpscope.traces.store.layout import MANIFEST

    p = Path(out)
    if (p / MANIFEST).exists():
        raise TraceError("diagnose --out is a trace directory: the diagnosis needs a folder of its own", path=p,
                         key=MANIFEST, expected="a new folder, or an earlier diagnosis's", actual="a trace's manifest")


def diagnose(config: DiagnoseConfig, *, target: str | os.PathLike[str] | None = None,
             assistant: str | os.PathLike[str] | None = None, trace: str | os.PathLike[str] | None = None,
             prompts: Sequence[Any] | None = None, prompts_file: str | os.PathLike[str] | None = None,
             reference_hf: str | os.PathLike[str] | None = None,
             reference_assistant: str | os.PathLike[str] | None = None, out: str | os.PathLike[str] | None = None,
             command: Sequence[str] | None = None, on_step: Callable[[str, str], None] | None = None,
             on_round: Callable[..., None] | None = None) -> Diagnosis:
    """Diagnose a drafter / target pair (module docstring); write ``diagnosis.json`` into ``out``.

    Args:
        config: the run parameters (:class:`traces.diagnose.config.DiagnoseConfig`, valid by construction;
            ``DiagnoseConfig()`` holds ``mtpscope diagnose``'s defaults): the recording's n_draft, tokens per
            prompt and centroid head (its :class:`RecordConfig`, ``config.recording``), whether to replay
            (steps 5 and 6: they need llama.cpp and ``out``) and the replayed sample (``replay_prompts`` prompts x
            ``rounds_per_prompt`` rounds).
        target / assistant: the GGUFs (default with ``trace``: the models its manifest names).
        trace: a recorded trace to diagnose instead of recording one.
        prompts / prompts_file: what to record (:class:`mtpscope.traces.run.prompts.PromptSpec` objects or texts,
            or a prompts file); one of them without ``trace``.
        reference_hf / reference_assistant: a reference drafter (an HF checkpoint folder, or a good GGUF).
        out: the output folder (``trace/``, ``replay/``, ``reference/``, ``replay-key/`` (a key that differs from
            the target's: a copy of the drafter with the target's value and its replay), ``diagnosis.json``); needed
            to record, replay or convert a reference (without it, with a trace: steps 1, 2, 4 and 7 only).
        command: argv for the recording's manifest.
        on_step: progress, called ``(step, message)``; on_round: the recorder's per-round callback.

    Returns:
        :class:`Diagnosis` (findings ranked).

    Raises:
        MtpscopeError: no target or assistant, neither a trace nor prompts, no ``out`` to record into.
        TraceError: ``out`` is a trace directory (it holds a trace's ``manifest.json``): nothing is written there.
        GGUFFormatError / UnsupportedFileError / HFCheckpointError / TraceFormatError: unreadable input (a
            ``reference_assistant`` that is no GGUF, or a ``reference_hf`` that is no checkpoint folder, included,
            before any step runs).
    """
    from mtpscope.inspector.gguf import open_gguf
    from mtpscope.inspector.validate import verify
    from mtpscope.traces.store.reader import open_trace, read_manifest

    steps = _Steps(on_step)
    found: list[Finding] = []
    given = trace is not None
    outp = Path(out) if out is not None else None
    man: dict[str, Any] = read_manifest(trace) if trace is not None else {}
    target = os.fspath(target) if target is not None else _manifest_model(man, "target")
    assistant = os.fspath(assistant) if assistant is not None else _manifest_model(man, "assistant")
    if target is None or assistant is None:
        raise MtpscopeError("diagnose needs the target and the assistant GGUFs (the trace's manifest names none that "
                            "exist)", key="target" if target is None else "assistant", expected="a GGUF path")
    if trace is None and prompts is None and prompts_file is None:
        raise MtpscopeError("diagnose needs prompts to record, or a trace", key="prompts", expected="prompts or a trace")
    if trace is None and outp is None:
        raise MtpscopeError("recording needs an output folder", key="out", expected="a folder")
    if reference_assistant is not None:     # a reference the user gave that is no GGUF is bad input, said first
        with open_gguf(reference_assistant):
            pass
    if reference_hf is not None:            # likewise a folder that is no checkpoint (its headers only: no tensor read)
        from mtpscope.inspector.hf_checkpoint import read_checkpoint

        read_checkpoint(reference_hf)
    if outp is not None:
        check_out(outp)
        outp.mkdir(parents=True, exist_ok=True)

    with steps.step("verify", "verify: the drafter, the pair and the runtime verdicts", fatal=True):
        report = verify(assistant, target=target, hf_dir=reference_hf)
        found += files.file_findings(report, assistant=assistant, target=target)
    with steps.step("published", "the drafter's metadata against the published Gemma 4 configurations", fatal=True):
        with open_gguf(assistant) as f:
            pf, pub = published.published_findings(f, assistant=assistant, target=target)
        found += pf

    llama_missing = _llama_missing()
    if trace is None:
        why = files.can_record(report) or llama_missing
        if why:
            steps.skip("record", why)
        else:
            rec = _record(steps, found, config.recording, target=target, assistant=assistant,
                          out=cast(Path, outp),  # not None: raised above without a trace or an output folder
                          prompts=prompts, prompts_file=prompts_file, command=command, on_round=on_round)
            trace = os.fspath(rec) if rec is not None else None
    else:
        steps.runs.append(StepRun("record", "skipped", 0.0, f"the trace {trace} was given"))
        trace = os.fspath(trace)

    x: Explanation | None = None
    rep: TraceReport | None = None
    summary: dict[str, Any] = {}
    limits: list[str] = []
    variant_numbers = ref_numbers = None
    res_file = None
    if trace is not None:
        try:
            # a trace the user gave that cannot be read whole is bad input; one we recorded is a failed step
            with steps.step("explain", "explain: causes, hard vs wrong, classes, categories, what-if, advice",
                            fatal=given):
                x, rep, man = _explain(trace)
                summary = behaviour.summary(x, rep)
                summary["n_draft"] = (man.get("params") or {}).get("n_draft", config.n_draft)
        except _StepFailed:
            x = None
    rec_n = int(summary.get("n_draft") or config.n_draft)

    can_replay = trace is not None and x is not None and man.get("source") == "record"
    key_why = None      # why the keys that differ from the target's were not replayed with the target's value
    if not config.replay:
        steps.skip("replay", key_why := "replay off")
    elif not can_replay or trace is None:    # (can_replay implies a trace: narrows it for the type checker)
        steps.skip("replay", key_why := "no recorded trace to replay" if trace is None or x is None else
                   f"the trace's source is {man.get('source')!r}: only `mtpscope record` traces replay")
    elif llama_missing or outp is None:
        steps.skip("replay", key_why := llama_missing or "no output folder for the replay")
    else:
        from mtpscope.traces.run.replay import baseline_for

        t = open_trace(trace)
        pids = variants.sample_prompts(man, t.rounds["prompt_id"].unique().tolist(), config.replay_prompts)
        cen = (man.get("params") or {}).get("centroids")
        specs = variants.convention_variants(baseline_for(man), centroids=bool(cen) and Path(str(cen)).exists())
        try:
            with steps.step("replay", f"replay: {len(pids)} prompt{'' if len(pids) == 1 else 's'} x {config.rounds_per_prompt} rounds under "
                            f"{', '.join(specs)}") as box:
                res_file = variants.run_variants(trace, variants=specs, out=outp / REPLAY_DIR, prompt_ids=pids,
                                                 rounds_per_prompt=config.rounds_per_prompt, target=target,
                                                 assistant=assistant)
                vf, variant_numbers = variants.variant_findings(res_file, trace=trace)
                found += vf
                steps.notes.extend(f"replay: {n}" for n in res_file.notes if "variant traces" not in n)
                box["note"] = f"{variant_numbers['n_rounds']} rounds, {variant_numbers['n_steps']} steps"
                found = _pair_key_costs(found, trace=trace, assistant=assistant, outp=outp, res_file=res_file,
                                        pids=pids, rounds_per_prompt=config.rounds_per_prompt, rounds=t.rounds,
                                        recorded_rate=summary.get("acceptance_rate"))
        except _StepFailed:
            res_file = None
            key_why = "the replay failed"
        if (reference_hf or reference_assistant) and res_file is not None:
            try:
                with steps.step("reference", "the same rounds through the reference drafter"):
                    f_ref, ref_numbers = _reference(trace, assistant, outp, res_file, pids, config.rounds_per_prompt,
                                                    reference_hf, reference_assistant,
                                                    pair_subjects=[f.subject for f in found
                                                                   if f.cause == "pair_mismatch"])
                    found += f_ref
            except _StepFailed:
                pass
    if (reference_hf or reference_assistant) and not any(s.name == "reference" for s in steps.runs):
        steps.skip("reference", "needs a replayed trace (llama.cpp and an output folder)")
    elif not (reference_hf or reference_assistant):
        steps.runs.append(StepRun("reference", "skipped", 0.0, "no --reference / --reference-assistant given"))
    if ref_numbers is None:
        found += _quantization_note(assistant, trace)
    if res_file is not None:
        found = _with_expected_agreement(found, res_file)
    found = _pair_key_costs(found, trace=trace, assistant=assistant, why=key_why or "no replay",
                            recorded_rate=summary.get("acceptance_rate"))

    lf = None
    hints: list[Finding] = []
    if x is not None and rep is not None and trace is not None:    # (x implies rep and a trace)
        try:
            with steps.step("advice", "advice: n_draft per category or plain decoding; what limits acceptance"):
                cols = open_trace(trace).columns("rounds", ["prompt_id", "n_draft", "n_accepted"])
                found += behaviour.n_draft_findings(x, cols, trace=trace, n_draft=rec_n)
                hints = [b for b in (behaviour.broken_finding(rep, x, trace=trace),) if b is not None]
                # the behaviour points at the drafter: only where no reference compared the weights and no error
                # found elsewhere already explains the drafts
                if ref_numbers is None and not any(f.severity == ERROR for f in found):
                    hints += [h for h in (behaviour.sure_miss_finding(x, trace=trace),) if h is not None]
                found += hints
                lf, limits = behaviour.limit_finding(x, rep, trace=trace)
        except _StepFailed:
            lf = None
    ranked = rank.rank(found)
    if lf is not None:
        if hints:   # never an all-clear where the behaviour points at the drafter: the check that would pin it
            lf = replace(lf, title=f"{lf.title}; {behaviour.UNPINNED}")
            limits = [f"{limits[0]}; {behaviour.UNPINNED}", *limits[1:]]
        if not any(f.is_defect for f in ranked):
            lf = replace(lf, title=f"{lf.title}; {NOTHING_WRONG}")
            limits = [f"{limits[0]}; {NOTHING_WRONG}", *limits[1:]]
        else:   # measured with the defects in place: "nothing to change" would contradict them
            lf = replace(lf, fix=Fix("none", "fix the defects ranked above first: this limit was measured with them "
                                             "in place"))
        ranked = rank.rank([*ranked, lf])
    elif not any(f.is_defect for f in ranked) and trace is None:
        steps.notes.append("no trace: what limits acceptance is unknown (record one, or pass --trace)")
    mismatch: list[str] = []
    if given and man:       # the files given against the ones the trace was recorded with (said first, as replay does)
        from mtpscope.traces.run.preflight import model_mismatch_notes

        try:
            mismatch = model_mismatch_notes(man, {"target": target, "assistant": assistant})
        except (MtpscopeError, OSError) as e:     # (verify has said what is wrong with an unreadable file)
            steps.notes.append(f"the files were not compared with the trace's: {e}")
    d = Diagnosis(target=target, assistant=assistant, trace=trace, findings=ranked, limits=tuple(limits),
                  steps=tuple(steps.runs), summary=DiagnosisSummary.from_dict(summary),
                  variants=None if variant_numbers is None else VariantsSummary.from_dict(variant_numbers),
                  published=pub, reference=None if ref_numbers is None else ReferenceSummary.from_dict(ref_numbers),
                  notes=tuple(steps.notes), model_mismatch=tuple(mismatch), explanation=x,
                  out=None if outp is None else os.fspath(outp))
    if outp is not None:
        (outp / DIAGNOSIS_FILE).write_text(json.dumps(d.to_dict(), indent=1, default=str) + "\n", encoding="utf-8")
    return d


def read_diagnosis(folder: str | os.PathLike[str]) -> Diagnosis:
    """The :class:`Diagnosis` that :func:`diagnose` wrote into ``folder`` (``diagnosis.json``), rebuilt by
    :meth:`Diagnosis.from_dict` (its ``explanation`` is None: not in the JSON).

    Raises:
        MtpscopeError: no ``diagnosis.json`` there, unreadable, or not a schema-1 diagnosis document (naming the
            file, and the first key that is missing or wrong).
    """
    p = Path(folder) / DIAGNOSIS_FILE
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MtpscopeError("no diagnosis in this folder (run `mtpscope diagnose --out FOLDER`)", path=p) from None
    except (OSError, ValueError) as e:
        raise MtpscopeError(f"unreadable diagnosis ({e})", path=p) from None
    return Diagnosis.from_dict(doc, path=p)


def _quantization_note(assistant: str, trace: str | None) -> list[Finding]:
    """A ``quantization`` note for a quantized drafter diagnosed without a reference (its cost unmeasured)."""
    q = reference.quantized_types(assistant)
    if not q:
        return []
    link = ViewRef.of("explain", trace=trace, prompt="all") if trace else ViewRef.of("tensors", drafter=assistant)
    return [Finding("quantization", INFO, MEDIUM, f"the drafter's matrices are {'/'.join(q)}: their cost in "
                    "acceptance is not measured here (pass --reference HF_DIR or --reference-assistant F32.gguf)",
                    (Evidence("verify", f"quantized tensor types: {', '.join(q)}", {"types": q}),),
                    Fix("none", "nothing to change unless a reference shows a cost"), link, subject="quantization")]


def _with_expected_agreement(found: list[Finding], res_file: Any) -> list[Finding]:
    """Each ``quantization`` finding with the replay's evidence of what the quantized file's numerics lead to expect
    of llama.cpp against the reference (:func:`variants.expected_agreement_text`: the expected agreement, the
    measured one, the near ties, the activation type each matrix multiplies)."""
    summ = res_file.summary()
    base = summ.variants.get("baseline")
    agree = None if base is None else base.agreement
    text = variants.expected_agreement_text(summ.numerics, agree, summ.drafter_weights)
    if not text:
        return found
    nc = summ.numerics
    ev = Evidence("replay", f"llama.cpp against the reference drafter reading this file: {text}",
                  {"expected_agreement": nc["expected_agreement"], "agreement": agree, "near_ties": nc["near_ties"],
                   "unexplained": nc["unexplained"]})
    return [replace(f, evidence=(*f.evidence, ev)) if f.cause == "quantization" else f for f in found]


def _is_measured_key(f: Finding) -> bool:
    """A finding of one key that differs from the target's while llama.cpp runs the pair (``files.MEASURED_PAIR_CODES``)
    whose cost is not stated yet."""
    return (f.cause == "pair_mismatch" and any(e.numbers.get("code") in files.MEASURED_PAIR_CODES for e in f.evidence)
            and not any(e.step == "replay" and "measured" in e.numbers for e in f.evidence))


def _pair_key_costs(found: list[Finding], *, trace: str | None, assistant: str, outp: Path | None = None,
                    res_file: Any = None, pids: Sequence[int] = (), rounds_per_prompt: int | None = None,
                    rounds: Any = None, why: str = "no replay", recorded_rate: float | None = None) -> list[Finding]:
    """Each key that differs from the target's (the sliding window) with what setting it to the target's value does:
    with ``res_file`` (the sample's baseline replay) the sample is replayed once more with a copy of the drafter
    whose key holds the target's value (``out/replay-key/``; skipped when no position of the sample reaches the smaller
    window: the masks are then the same) and the two compared (``reference.replay_delta``); without it, the finding
    says why nothing was measured. A failure of that replay is said in the finding, never raised."""
    out = []
    for f in found:
        if not _is_measured_key(f) or not isinstance(f.expected, int) or not isinstance(f.actual, int):
            out.append(f)
            continue
        smaller = min(f.expected, f.actual) if f.subject.endswith("attention.sliding_window") else None
        if res_file is None or outp is None or trace is None:
            top = None
            if trace is not None and smaller is not None:
                from mtpscope.traces.store.reader import open_trace

                try:
                    r = open_trace(trace).columns("rounds", ["pos", "n_draft"])
                    top = int((r["pos"] + r["n_draft"] - 1).max()) if len(r) else None
                except (MtpscopeError, OSError, KeyError, ValueError):
                    top = None      # a trace without positions (an import): the recording's reach is unknown
            out.append(files.key_cost(f, None, value=f.expected, smaller=smaller, max_pos=top, why=why,
                                          recorded_rate=recorded_rate))
            continue
        r = rounds[rounds["prompt_id"].isin(list(pids))].sort_values(["prompt_id", "round"])
        r = r.groupby("prompt_id", sort=True).head(int(rounds_per_prompt)) if rounds_per_prompt else r
        top = int((r["pos"] + r["n_draft"] - 1).max()) if len(r) else None
        if smaller is not None and top is not None and top < smaller:
            out.append(files.key_cost(f, None, value=f.expected, smaller=smaller, max_pos=top))
            continue
        dst = outp / KEY_DIR / f.subject.rpartition(".")[2]
        try:
            copy = files.with_key_value(assistant, dst / "drafter.gguf", f.subject, f.expected)
            res_key = reference.replay_reference(trace, copy, out=dst / "replay", prompt_ids=pids,
                                                 rounds_per_prompt=rounds_per_prompt)
        except (MtpscopeError, OSError) as e:
            out.append(files.key_cost(f, None, value=f.expected, why=f"the replay with it failed: {e}"))
            continue
        m = reference.replay_delta(res_file, res_key)
        a, b = res_file.variant_traces.get("baseline"), res_key.variant_traces.get("baseline")
        out.append(files.key_cost(f, m, value=f.expected, smaller=smaller, max_pos=top, recorded_rate=recorded_rate,
                                      link=ViewRef.of("compare", trace=a, trace_b=b) if a and b else None))
    return out


def _explain(trace: str) -> tuple[Explanation, TraceReport, dict[str, Any]]:
    from mtpscope.traces.analysis.metrics import report
    from mtpscope.traces.analysis.vocab import trace_vocab
    from mtpscope.traces.store.reader import open_trace
    from mtpscope.traces.sweep.advice import explain_with_baseline

    t = open_trace(trace)
    x = explain_with_baseline(t, vocab=trace_vocab(t.manifest), with_drift=True)
    rep = report(t)
    if t.skipped:   # ranking causes over the rows that are left would pass a damaged trace as healthy
        raise TraceError("the trace has parts that cannot be read: diagnose needs every recorded round "
                         f"({len(t.skipped)} part(s); `mtpscope report` lists them)", path=t.skipped[0],
                         expected="a readable part", actual="missing" if not t.skipped[0].exists() else "unreadable")
    return x, rep, t.manifest


def _reference(trace: str, assistant: str, outp: Path, res_file: Any, pids: list[int], rounds_per_prompt: int,
               reference_hf: Any, reference_assistant: Any, *, pair_subjects: Sequence[str] = ()
               ) -> tuple[list[Finding], dict[str, Any]]:
    from mtpscope.inspector.diff import diff
    from mtpscope.traces.analysis.compare_report import compare_traces
    from mtpscope.traces.store.reader import open_trace

    ref, kind = reference.reference_gguf(outp / REFERENCE_DIR, hf_dir=reference_hf, gguf=reference_assistant)
    res_ref = reference.replay_reference(trace, ref, out=outp / REFERENCE_DIR / "replay", prompt_ids=pids,
                                         rounds_per_prompt=rounds_per_prompt)
    gd = diff(assistant, ref, values=True)
    aligned = None
    a, b = res_file.variant_traces.get("baseline"), res_ref.variant_traces.get("baseline")
    if a and b:
        try:
            aligned = compare_traces(open_trace(a), open_trace(b))
        except MtpscopeError:
            aligned = None
    shown = os.fspath(reference_hf if kind == "hf" else ref)
    return reference.reference_findings(res_file, res_ref, trace=trace, assistant=assistant, reference=shown,
                                        kind=kind, gdiff=gd, aligned=aligned,
                                        quantized=reference.quantized_types(assistant), file_path=assistant,
                                        reference_path=ref, pair_subjects=pair_subjects)


__all__ = ["DIAGNOSIS_FILE", "KEY_DIR", "NOTHING_WRONG", "REFERENCE_DIR", "REPLAY_DIR", "TRACE_DIR",
           "check_out", "diagnose", "read_diagnosis"]
