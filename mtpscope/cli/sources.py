"""Where the CLI's GGUF arguments come from: a path, an ``https://`` / ``hf://`` URL, or a shard.

One opener for ``inspect``, ``verify``, ``diff`` and ``estimate`` (:func:`open_source`), and the options
they share for URLs (``--allow-full-download``, ``--max-header-mib``, ``--timeout``). Remote reads use
the cached Gemma 4 tokenizer GGUF, when it is there, as a layout hint (fewer requests; see
:func:`mtpscope.inspector.remote.open_gguf_reader`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from mtpscope.inspector.gguf import GGUFLike
    from mtpscope.inspector.remote import RemoteOptions

AllowFullDownload = Annotated[bool, typer.Option(
    "--allow-full-download",
    help="For a URL whose server ignores range requests: download the whole file (refused otherwise).")]
MaxHeaderMiB = Annotated[int, typer.Option(
    "--max-header-mib", min=1, help="For a URL: refuse a GGUF header larger than this many MiB.")]
Timeout = Annotated[float, typer.Option("--timeout", min=0.1, help="For a URL: seconds per HTTP request.")]

DEFAULT_MAX_HEADER_MIB = 64
DEFAULT_TIMEOUT_S = 30.0


def remote_options(allow_full_download: bool = False, max_header_mib: int = DEFAULT_MAX_HEADER_MIB,
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> RemoteOptions:
    """:class:`mtpscope.inspector.remote.RemoteOptions` for the CLI (and the app), with the cached
    tokenizer as a layout hint when it exists."""
    from mtpscope.cache import layout_hints
    from mtpscope.inspector.remote import RemoteOptions

    hints = layout_hints()
    return RemoteOptions(allow_full_download=allow_full_download, max_header_bytes=max_header_mib << 20,
                         timeout_s=timeout_s, layout_hints=hints)


def open_source(spec: str, allow_full_download: bool = False, max_header_mib: int = DEFAULT_MAX_HEADER_MIB,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> GGUFLike:
    """Open ``spec`` (path, URL or shard) with :func:`mtpscope.inspector.shards.open_model`; the remote
    options (and the tokenizer hint) are only made for a URL."""
    from mtpscope.inspector.remote import check_scheme, is_remote
    from mtpscope.inspector.shards import open_model

    check_scheme(spec)
    opts = remote_options(allow_full_download, max_header_mib, timeout_s) if is_remote(spec) else None
    return open_model(spec, remote=opts)


def remote_summary(f: GGUFLike) -> dict[str, Any] | None:
    """For a file read over HTTP: ``{"requests": n, "bytes": n}`` (every shard together,
    :func:`mtpscope.inspector.remote.request_totals`), else None."""
    from mtpscope.inspector.remote import request_totals

    totals = request_totals(f)
    if totals is None:
        return None
    return {"requests": totals[0], "bytes": totals[1]}
