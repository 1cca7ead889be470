"""Checks before :func:`traces.run.recorder.record` loads anything, and the manifest's model entries.

The run parameters are checked once, where they are built (:class:`traces.run.record_config.RecordConfig`).

* :func:`preflight`: our own GGUF reader and :mod:`inspector.validate` decide whether llama.cpp can run
  a target / drafter pair, before llama.cpp sees the files (some bad drafters crash it).
* :func:`model_info` / :func:`centroid_source_info`: the manifest's ``models`` entries (path, size,
  architecture, dialect, header sha256); also used by the replay to notice a changed model file.

* :func:`check_context_memory`: a context whose KV cache cannot fit in this machine's memory is refused before
  llama.cpp tries to allocate it (the recording worker calls it when a run needs a bigger context).

Imports: mtpscope.errors, mtpscope.inspector (estimate, gguf, inventory, layouts, validate; inside the functions).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mtpscope.errors import LayoutError, PreflightRefusal


def _header_sha256(path: Path, data_offset: int) -> str:
    h = hashlib.sha256()
    left = data_offset
    with open(path, "rb") as fh:
        while left > 0:
            block = fh.read(min(left, 1 << 20))
            if not block:
                break
            h.update(block)
            left -= len(block)
    return h.hexdigest()


def model_info(f: Any) -> dict[str, Any]:
    """Manifest entry of an open GGUF: path, size (bytes), architecture, dialect, header_sha256
    (sha256 of bytes [0, data_offset), i.e. header, metadata and tensor infos, not the weights)."""
    from mtpscope.inspector.inventory import detect_dialect

    p = Path(f.path)
    return {"path": os.fspath(p.resolve()), "size": int(f.file_size), "architecture": f.architecture,
            "dialect": detect_dialect(f).kind, "header_sha256": _header_sha256(p, int(f.data_offset))}


def centroid_source_info(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Manifest entry of a ``--centroids`` source (GGUF: as :func:`model_info`; HF: dialect ``hf``,
    size = bytes of its safetensors files, header_sha256 over their headers in name order)."""
    p = Path(path)
    if p.is_dir() or p.suffix == ".safetensors":
        files = [p] if p.is_file() else sorted(p.glob("*.safetensors"))
        h = hashlib.sha256()
        size = 0
        for file in files:
            size += file.stat().st_size
            with open(file, "rb") as fh:
                n8 = fh.read(8)
                h.update(n8)
                h.update(fh.read(int.from_bytes(n8, "little")))
        arch = None
        cfg = (p if p.is_dir() else p.parent) / "config.json"
        if cfg.exists():
            try:
                arch = json.loads(cfg.read_text()).get("model_type")
            except ValueError:
                arch = None
        return {"path": os.fspath(p.resolve()), "size": size, "architecture": arch, "dialect": "hf",
                "header_sha256": h.hexdigest()}
    from mtpscope.inspector.gguf import open_gguf

    with open_gguf(p) as f:
        return model_info(f)


def unchecked_models(target: str | os.PathLike[str], assistant: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """``{"target": model_info, "assistant": model_info}`` without any check (``record(preflight=False)``,
    for debugging a runtime crash on a pair that :func:`preflight` refuses).

    Raises:
        GGUFFormatError / UnsupportedFileError: a file our reader cannot read.
        FileNotFoundError: a missing file.
    """
    from mtpscope.inspector.gguf import open_gguf

    out = {}
    for role, p in (("target", target), ("assistant", assistant)):
        if not Path(p).is_file():
            raise FileNotFoundError(2, "No such file or directory", os.fspath(p))
        with open_gguf(p) as f:
            out[role] = model_info(f)
    return out


def preflight(target: str | os.PathLike[str], assistant: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Check with our own GGUF reader that llama.cpp can run this pair, before llama.cpp sees it.

    Checks: both files readable GGUF; not swapped (a ``gemma4`` assistant beside a drafter target is said to be
    ``--target`` and ``--assistant`` swapped); the drafter's architecture is ``gemma4-assistant`` (a fork-dialect
    ``gemma4_assistant`` drafter is refused: llama.cpp does not load it, use it via ``--centroids``);
    the target's is ``gemma4``; the inspector's upstream loadability rules for both files; the
    inspector's pairing check (backbone width, vocabulary, KV heads / head dims per layer type); no
    :func:`inspector.validate.verify` finding that llama.cpp crashes on (the inspector's one list,
    :data:`inspector.findings.RUNTIME_CRASH_CODES`: a 1-D tensor not in F32, wrong ggml types or shapes
    of weight matrices; the first three are listed in the message); a drafter whose verdict is "aborts at first
    draft" for another reason (RoPE dims ggml cannot turn).

    Returns:
        ``{"target": model_info, "assistant": model_info}``.

    Raises:
        LayoutError: a refusal, naming the file, the key and expected vs actual (from the finding): a fork-dialect
            drafter or a file of another architecture; :class:`~mtpscope.errors.PreflightRefusal` (a LayoutError)
            where llama.cpp would refuse, abort or crash, or the pairing is wrong (``preflight=False`` skips these).
        GGUFFormatError / UnsupportedFileError / TensorDataError: unreadable file.
        FileNotFoundError: a missing file.
    """
    from mtpscope.inspector import validate as V
    from mtpscope.inspector.findings import OUTCOME_ABORTS_CONTEXT, OUTCOME_ABORTS_DRAFT
    from mtpscope.inspector.gguf import open_gguf
    from mtpscope.inspector.layouts import ARCH_FORK, ARCH_TARGET, ARCH_UPSTREAM

    for p in (target, assistant):
        if not Path(p).is_file():
            raise FileNotFoundError(2, "No such file or directory", os.fspath(p))
    # the target repeats the drafter's tokenizer: its string arrays are compared, not walked a second time
    with open_gguf(assistant) as d, open_gguf(target, like=d) as t:
        if d.architecture == ARCH_TARGET and t.architecture in (ARCH_UPSTREAM, ARCH_FORK):
            raise LayoutError(f"the assistant is a {ARCH_TARGET} model and the target a {t.architecture} drafter: "
                              "--target and --assistant are swapped", path=d.path, key="general.architecture",
                              expected=ARCH_UPSTREAM, actual=d.architecture)
        if d.architecture == ARCH_FORK:
            raise LayoutError(f"fork-dialect drafter ({ARCH_FORK}): llama.cpp's runtime does not load it; "
                              f"record with an upstream {ARCH_UPSTREAM} drafter and pass this file as "
                              "--centroids to compare its centroid head", path=d.path,
                              key="general.architecture", expected=ARCH_UPSTREAM, actual=d.architecture)
        if d.architecture != ARCH_UPSTREAM:
            raise LayoutError(f"the assistant must be a {ARCH_UPSTREAM} drafter", path=d.path,
                              key="general.architecture", expected=ARCH_UPSTREAM, actual=d.architecture)
        if t.architecture != ARCH_TARGET:
            raise LayoutError(f"the target must be a {ARCH_TARGET} model", path=t.path, key="general.architecture",
                              expected=ARCH_TARGET, actual=t.architecture)
        verdicts = {}
        for f in (t, d):
            v = verdicts[f.path] = V.upstream_verdict(f)
            if v.loads is False or v.outcome == OUTCOME_ABORTS_CONTEXT:
                word = "refuse" if v.loads is False and v.outcome == "refuses" else "abort on"
                raise PreflightRefusal(f"llama.cpp would {word} this file: {v.reasons[0]}", path=f.path,
                                  key="loadability", expected="loads", actual=v.outcome)
        pairing = V.check_pairing(d, t)
        errors = [x for x in pairing.findings if x.severity == V.ERROR]
        if errors:
            e = errors[0]
            raise PreflightRefusal(f"{e.code}: {e.message} (target {t.path})", path=d.path, key=e.subject,
                              expected=e.expected, actual=e.actual)
        # what llama.cpp loads and then crashes on inside llama_decode (abort, segfault): refuse it here
        report = V.verify(d, target=t)
        crash = [x for x in report.findings if x.code in V.RUNTIME_CRASH_CODES]
        if crash:
            e = crash[0]
            listed = "; ".join(f"{x.code} {x.subject} (expected {x.expected}, got {x.actual})" for x in crash[:3])
            more = f"; and {len(crash) - 3} more" if len(crash) > 3 else ""
            raise PreflightRefusal(f"llama.cpp would crash on this drafter ({len(crash)} tensor type/shape "
                              f"error{'s' if len(crash) != 1 else ''}: {listed}{more}; run `mtpscope verify`)",
                              path=d.path, key=e.subject, expected=e.expected, actual=e.actual)
        v = verdicts[d.path]      # what else aborts the first draft: rotated dims ggml cannot turn
        if v.outcome == OUTCOME_ABORTS_DRAFT:
            raise PreflightRefusal(f"llama.cpp would abort on this file: {v.reasons[0]}", path=d.path,
                                   key="loadability", expected="loads", actual=v.outcome)
        return {"target": model_info(t), "assistant": model_info(d)}


def model_mismatch_notes(man: dict[str, Any], used: Mapping[str, str | os.PathLike[str]]) -> list[str]:
    """A line for each model (``{role: path}``, roles as the manifest's ``models``: ``target``, ``assistant``) whose
    header (sha256 of bytes [0, data_offset)) differs from the one the trace ``man`` was recorded with: what is
    replayed or diagnosed with it answers for another model than the recorded run. A role the manifest does not
    name is not compared.

    Raises:
        GGUFFormatError / OSError: a model that is not a readable GGUF.
    """
    from mtpscope.inspector.gguf import open_gguf

    notes = []
    for role, path in used.items():
        entry = (man.get("models") or {}).get(role)
        want = entry.get("header_sha256") if isinstance(entry, dict) else None
        if not want:
            continue
        with open_gguf(path) as f:
            got = model_info(f)["header_sha256"]
        if got != want:
            notes.append(f"the {role} {path} is not the file the trace was recorded with (header sha256 "
                         f"{got[:12]}… vs recorded {want[:12]}…): the trace's recorded figures are another model's")
    return notes


def mem_available(meminfo: str | os.PathLike[str] = "/proc/meminfo",
                  cgroup: str | os.PathLike[str] = "/sys/fs/cgroup") -> int | None:
    """Bytes of memory this process can still get without swapping: Linux ``/proc/meminfo`` ``MemAvailable``, or
    less where a cgroup v2 limit (a container: ``memory.max`` minus ``memory.current`` in ``cgroup``) leaves
    less; None where neither is known."""
    got: int | None = None
    try:
        with open(meminfo, encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    got = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        got = None
    try:
        cg = Path(cgroup)
        limit = (cg / "memory.max").read_text().strip()
        if limit != "max":
            left = max(0, int(limit) - int((cg / "memory.current").read_text().strip()))
            got = left if got is None else min(got, left)
    except (OSError, ValueError):
        pass
    return got


def check_context_memory(target: str | os.PathLike[str], assistant: str | os.PathLike[str], n_ctx: int, *,
                         n_gpu_layers: int, flash_attn: bool, why: str, advice: str = "lower max_tokens",
                         available: int | None = None) -> None:
    """Refuse a context of ``n_ctx`` tokens whose KV cache alone (:func:`inspector.estimate.estimate`, exact
    for llama.cpp's F16 cache) is more than this machine's available memory, before llama.cpp tries to allocate
    it (a huge ``max_tokens`` otherwise ends in an allocation failure after seconds of swapping, or in the
    kernel's out-of-memory kill of the worker). Only the cache of the layers on the CPU counts: with layers
    offloaded to a GPU (``n_gpu_layers``, -1 = all; 0 where the build has no GPU) llama.cpp keeps theirs there.

    Args:
        n_ctx: tokens the context must hold. flash_attn: the contexts' flash attention (without it llama.cpp
            pads every layer's V rows to the widest). why: what ``n_ctx`` is made of (for the message), e.g. "the
            longest prompt's 12 + max_tokens 100000000 + n_draft 3 + 1". advice: what to change ("lower max_tokens",
            "shorten the prompt"). available: bytes (default :func:`mem_available`; None there: no check). A pair the
            estimate cannot read (``record(preflight=False)`` on a file it refuses) is not checked.

    Raises:
        TraceError: the KV cache does not fit (key ``max_tokens``; expected / actual in GiB).
    """
    from mtpscope.errors import MtpscopeError, TraceError
    from mtpscope.inspector.estimate import EstimateParams, estimate

    available = mem_available() if available is None else available
    if available is None:
        return
    # the recorder's contexts keep llama_context_default_params' swa_full (on in llama.cpp 0.3.36: the sliding
    # layers hold the whole context too), unlike llama-server's --swa-full default (off)
    try:
        est = estimate(target, assistant, EstimateParams(n_ctx=int(n_ctx), n_gpu_layers=int(n_gpu_layers),
                                                         swa_full=True, flash_attn=bool(flash_attn)))
    except MtpscopeError:
        return                      # (preflight=False on a pair the estimate refuses: llama.cpp says what it can)
    kv = est.by_device.get("CPU", {}).get("kv", 0)
    if kv > available:
        raise TraceError(f"a context of {n_ctx} tokens ({why}) needs {kv / 2**30:.2f} GiB for its KV cache alone, "
                         f"more than this machine's {available / 2**30:.2f} GiB available: {advice}",
                         path=os.fspath(target), key="max_tokens",
                         expected=f"a KV cache <= {available / 2**30:.2f} GiB", actual=f"{kv / 2**30:.2f} GiB")


__all__ = ["centroid_source_info", "check_context_memory", "mem_available", "model_info", "model_mismatch_notes",
           "preflight", "unchecked_models"]
