"""Validation of Gemma 4 drafter / target GGUFs: the entry point, ``verify``.

``verify(path, target=None, hf_dir=None) -> Report`` is the one entry point (CLI ``mtpscope verify``, the
recorder's pre-flight and the app use it): the file checks of :mod:`checks`, with a target the
:mod:`pairing` checks, with an HF folder the :mod:`hf_audit`, and the :mod:`loadability` verdicts, in one
:class:`Report` (:mod:`findings`) whose findings are sorted errors first.

Where each part lives (a newcomer's map):

* :mod:`mtpscope.inspector.findings` — severities, ``CODES``, ``Finding`` / ``Verdict`` / ``Pairing`` /
  ``Report``, the constructor ``finding(...)``;
* :mod:`mtpscope.inspector.checks` — ``check_file`` (keys, tokenizer, tensors vs layout, values);
* :mod:`mtpscope.inspector.pairing` — ``check_pairing``;
* :mod:`mtpscope.inspector.loadability` — ``RUNTIMES``, ``upstream_verdict``, ``fork_verdict``, ``loadability``;
* :mod:`mtpscope.inspector.hf_audit` — the HF checkpoint ↔ GGUF audit (``H_*`` codes).

The validation contract (docs/ARCHITECTURE.md) names those as ``validate.X``; they are re-exported here for
that documented entry point (``ERROR`` / ``WARNING`` / ``INFO``, ``CODES``, the records, ``check_file``,
``check_pairing``, the verdict functions and runtime names). New code imports them from their own module.

May import: inspector.findings, checks, pairing, loadability, layouts, gguf (opening paths) and
hf_checkpoint / hf_config / hf_audit (only with ``hf_dir``).
"""

from __future__ import annotations

import os
from typing import Any

from mtpscope.inspector import layouts as L
from mtpscope.inspector.checks import check_file
from mtpscope.inspector.findings import (
    CODES,
    ERROR,
    INFO,
    RUNTIME_CRASH_CODES,
    SEVERITY_ORDER,
    WARNING,
    Finding,
    Pairing,
    Report,
    Verdict,
    finding,
)
from mtpscope.inspector.loadability import (
    RUNTIME_FORK,
    RUNTIME_UPSTREAM,
    RUNTIMES,
    fork_verdict,
    loadability,
    upstream_verdict,
)
from mtpscope.inspector.pairing import check_pairing


def _open(path_or_file: Any) -> Any:
    if hasattr(path_or_file, "tensors") and hasattr(path_or_file, "get"):
        return path_or_file
    from mtpscope.inspector.gguf import open_gguf
    return open_gguf(path_or_file)


def verify(path: Any, target: Any = None, hf_dir: Any = None) -> Report:
    """Validate a drafter (or target) GGUF; optionally pair it with a target and audit an HF checkpoint.

    Args:
        path: GGUF path (or an open ``GGUFFile``).
        target: the target GGUF path / file to pair with, or None.
        hf_dir: a Hugging Face checkpoint folder (config.json + safetensors) the GGUF was converted
            from, or None.

    Returns:
        :class:`Report` (``ok`` is False when any finding is an error).

    Raises:
        GGUFFormatError / UnsupportedFileError / TensorDataError: the GGUF (or target) is unreadable.
        HFCheckpointError: the HF folder is unreadable.
    """
    f = _open(path)
    t = _open(target) if target is not None else None
    factor = L.DEFAULT_PARTIAL_ROTARY_FACTOR_FULL
    audit = None
    if hf_dir is not None:
        from mtpscope.inspector.hf_audit import audit as hf_audit
        from mtpscope.inspector.hf_checkpoint import read_checkpoint
        from mtpscope.inspector.hf_config import partial_rotary_factor_full

        ckpt = read_checkpoint(hf_dir)
        factor = partial_rotary_factor_full(ckpt.config) or factor
        audit = hf_audit(ckpt, f)
    dialect, hp, findings = check_file(f, partial_rotary_factor=factor)
    pairing = None
    if t is not None:
        if hp is None or dialect not in ("fork", "upstream"):
            pairing = Pairing(os.fspath(getattr(t, "path", "")), False, (finding(
                ERROR, "E_PAIR_TARGET_ARCH", "general.architecture", "a drafter to pair", f.architecture,
                "pairing needs a drafter (gemma4_assistant / gemma4-assistant) as the first file"),), {}, {})
        else:
            pairing = check_pairing(f, t, hp)
        findings += list(pairing.findings)
    if audit is not None:
        findings += list(audit.findings)
    findings.sort(key=lambda x: SEVERITY_ORDER.get(x.severity, 3))
    ok = not any(x.severity == ERROR for x in findings)
    return Report(dialect=dialect, ok=ok, findings=tuple(findings), loadability=loadability(f), pairing=pairing,
                  path=os.fspath(getattr(f, "path", path)), arch=f.architecture, hf_audit=audit)


__all__ = [
    "CODES", "ERROR", "INFO", "RUNTIMES", "RUNTIME_CRASH_CODES", "RUNTIME_FORK", "RUNTIME_UPSTREAM", "WARNING", "Finding", "Pairing",
    "Report", "Verdict", "check_file", "check_pairing", "fork_verdict", "loadability", "upstream_verdict", "verify",
]
