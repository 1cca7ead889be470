"""The one error tree of mtpscope.

Every error a user can trigger with bad input is a subclass of :class:`MtpscopeError`. Each carries
where it happened (file path, byte offset, key or tensor name) and, where it makes sense, what was
expected and what was found, so the one-line message is enough to fix the input::

    MtpscopeError
    ├── InspectorError            GGUF / checkpoint reading and validation (inspector/)
    │   ├── GGUFFormatError       malformed GGUF bytes (bad magic, truncation, bad counts, ...)
    │   ├── UnsupportedFileError  well-formed but unsupported (big-endian, version 1, ...)
    │   ├── TensorDataError       tensor data out of file, misaligned, overlapping, undecodable
    │   ├── LayoutError           file does not have the layout a function needs
    │   │   └── PreflightRefusal  `record`'s pre-flight check refuses the pair (`--no-preflight` skips it)
    │   ├── HFCheckpointError     unreadable Hugging Face config.json / safetensors header
    │   ├── ReferenceDrafterError bad input to the numpy reference drafter (inspector/reference.py)
    │   └── PathNotAllowedError   a path outside the allowed roots (app)
    ├── ServeRefusedError         `mtpscope app` asked to serve beyond this machine unsafely (app)
    ├── LinkError                 a link to an app view the app cannot show (bad page, parameter or value)
    └── TraceError                trace directories and logs (traces/)
        ├── TraceFormatError      a manifest or Parquet part that does not match the schema
        ├── ImportFormatError     a foreign log that cannot be imported at all
        ├── TraceMismatchError    two readable traces that cannot be compared (no common prompt)
        ├── EmptyTraceError       a trace with no readable rounds where a command needs some (compare)
        ├── RuntimeUnavailableError  llama-cpp-python missing or lacking a needed symbol
        ├── RuntimeAbortedError   llama.cpp died under the recorder (abort, signal, exit)
        └── ServerError           llama-server: cannot be built or started here, or a probe failed
            └── ServerBuildUnavailableError  no cmake / C++ compiler / llama-cpp-python to build it with
"""

from __future__ import annotations

import os
from typing import Any


class MtpscopeError(Exception):
    """Root of every error mtpscope raises for bad input.

    Args:
        message: what went wrong, in words.
        path: the file or directory concerned, if any.
        offset: absolute byte offset in ``path`` where the problem was found, if known.
        key: GGUF key, tensor name, column or field concerned, if any.
        expected: what a valid input has there (free text or value).
        actual: what this input has there.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike[str] | None = None,
        offset: int | None = None,
        key: str | None = None,
        expected: Any = None,
        actual: Any = None,
    ) -> None:
        self.message = message
        self.path = None if path is None else os.fspath(path)
        self.offset = offset
        self.key = key
        self.expected = expected
        self.actual = actual
        super().__init__(self.one_line())

    def one_line(self) -> str:
        """The error as a single line: ``path: at offset N: key 'k': message (expected X, got Y)``."""
        parts: list[str] = []
        if self.path is not None:
            parts.append(f"{self.path}:")
        if self.offset is not None:
            parts.append(f"at offset {self.offset}:")
        if self.key is not None:
            parts.append(f"{self.key!r}:")
        parts.append(self.message)
        line = " ".join(parts)
        if self.expected is not None or self.actual is not None:
            line += f" (expected {self.expected}, got {self.actual})"
        return line



class InspectorError(MtpscopeError):
    """Errors reading or validating model files (GGUF, Hugging Face checkpoints)."""


class GGUFFormatError(InspectorError):
    """The bytes are not a valid GGUF file (bad magic, truncated, impossible counts or lengths)."""


class UnsupportedFileError(InspectorError):
    """A recognisable GGUF that this reader does not support (e.g. big-endian, version 1)."""


class TensorDataError(InspectorError):
    """Tensor data that lies outside the file, is misaligned, overlaps, or cannot be decoded."""


class LayoutError(InspectorError):
    """The file lacks a tensor or key that the requested operation needs."""


class PreflightRefusal(LayoutError):
    """``record``'s pre-flight check refuses a pair that llama.cpp loads but would refuse, abort or crash on,
    or whose pairing is wrong (``record(preflight=False)`` / ``--no-preflight`` records it anyway)."""


class HFCheckpointError(InspectorError):
    """A Hugging Face checkpoint folder whose config.json or safetensors headers cannot be read."""


class ReferenceDrafterError(InspectorError):
    """Bad input to the numpy reference drafter (wrong shape, unknown step option, missing hidden)."""


class PathNotAllowedError(InspectorError):
    """A path outside the folders the app may read (``MTPSCOPE_ROOTS``)."""


class RemoteFileError(InspectorError):
    """A GGUF URL (``https://`` / ``hf://``) that cannot be read: an HTTP error status, a server without
    range requests, a redirect to a host that is not allowed, a timeout, a truncated response or a cap
    exceeded. ``path`` is the URL without its query string; a token is never part of the message."""


class TraceError(MtpscopeError):
    """Errors reading, writing or importing traces."""


class TraceFormatError(TraceError):
    """A trace manifest or Parquet part that does not match the trace schema."""


class ImportFormatError(TraceError):
    """A foreign log (fork NDJSON, llama-server log) that cannot be imported at all."""


class TraceMismatchError(TraceError):
    """Two readable traces that cannot be compared: no prompt in common."""


class EmptyTraceError(TraceError):
    """A trace with no readable rounds (nothing recorded, or every rounds part unreadable) given to a command that
    needs some (``compare``): bad input, not a finding about two runs."""


class RuntimeUnavailableError(TraceError):
    """llama-cpp-python is not installed or lacks a symbol the recorder needs."""


class ServerError(TraceError):
    """llama-server (traces/server/): a build that failed, a server that would not start, or a probe that
    could not go on (server down, an HTTP error status, a response that is not the server's JSON).
    ``path`` is the URL, the binary or the build log concerned; an API key is never part of the message."""


class ServerBuildUnavailableError(ServerError):
    """llama-server cannot be built on this machine at all: cmake, a C++ compiler or llama-cpp-python's
    own libraries are missing (the message names which)."""


class ServeRefusedError(MtpscopeError):
    """``mtpscope app`` asked to listen on a non-loopback address without ``MTPSCOPE_ROOTS`` set."""


class LinkError(MtpscopeError):
    """A link to a view of the app (``/step?prompt=34&round=20``) that the app cannot show: an unknown page
    or parameter, a value of the wrong kind, or a prompt / round / draft step the trace does not have.
    ``key`` is the parameter, ``actual`` the value given, ``expected`` what is allowed."""


class RuntimeAbortedError(TraceError):
    """llama.cpp died under the recorder: an abort (``GGML_ABORT`` / ``GGML_ASSERT``), a fatal signal
    or a non-zero exit of the recording worker process. A crash of the runtime is bad input (the
    models or their pairing), reported in one line that quotes llama.cpp's own message.

    Args:
        message: the one line, e.g. ``"llama.cpp aborted at prompt 0, round 0, draft step 1: binary_op:
            unsupported types: dst: f32, src0: f32, src1: f16"``.
        aborted: the manifest's ``aborted`` record (signal or exit code, where, llama.cpp's message,
            the last lines of its stderr); see docs/TRACE_FORMAT.md.
        path: the trace directory that keeps the rounds before the crash, if one was written.
    """

    def __init__(self, message: str, *, aborted: dict | None = None, path: str | os.PathLike[str] | None = None) -> None:
        self.aborted = dict(aborted or {})
        self.trace = None if path is None else os.fspath(path)
        super().__init__(message)
