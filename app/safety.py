"""Path and upload safety for the app (pure: no Streamlit, no network).

The app reads files only under allowed folders. ``MTPSCOPE_ROOTS`` (``os.pathsep``-separated) names
them; when unset the defaults are the working directory and the demo cache
(:func:`mtpscope.cache.demo_dir`). Paths are resolved (``~`` expanded, symlinks followed, ``..``
removed) before the check, so a symlink inside a root that points outside it is refused.

Uploads are stored by content hash under ``<cache>/uploads`` (a folder the app always allows), never
executed or unpickled: the GGUF reader memory-maps them like any other file.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import zipfile
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath

from mtpscope.errors import InspectorError, PathNotAllowedError, TraceError
from mtpscope.inspector.paths import file_kind

ROOTS_ENV = "MTPSCOPE_ROOTS"

#: Largest upload the app accepts (bytes). Matches ``--server.maxUploadSize`` (MiB) in
#: :data:`mtpscope.cli_app.SERVER_FLAGS` (what ``mtpscope app`` passes) and .streamlit/config.toml.
MAX_UPLOAD_BYTES = 256 * 1024 * 1024
#: Largest total size unpacked from an uploaded trace archive (bytes).
MAX_UNPACKED_BYTES = 512 * 1024 * 1024
#: Most members an uploaded trace archive may hold.
MAX_ARCHIVE_MEMBERS = 10_000


def uploads_dir(cache_root: str | os.PathLike[str] | None = None) -> Path:
    """Folder where uploads are stored: ``$MTPSCOPE_UPLOADS`` if set, else ``<cache>/uploads``
    (not created here)."""
    if cache_root is None and os.environ.get("MTPSCOPE_UPLOADS"):
        return Path(os.environ["MTPSCOPE_UPLOADS"])
    if cache_root is None:
        from mtpscope.cache import cache_dir

        cache_root = cache_dir()
    return Path(cache_root) / "uploads"


def allowed_roots(environ: dict[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
                  demo: str | os.PathLike[str] | None = None,
                  uploads: str | os.PathLike[str] | None = None) -> tuple[Path, ...]:
    """The folders the app may read, resolved, duplicates removed, in order.

    Args:
        environ: environment to read ``MTPSCOPE_ROOTS`` from (default ``os.environ``).
        cwd: working directory used for the default and for relative entries (default ``os.getcwd()``).
        demo: demo folder used for the default (default :func:`mtpscope.cache.demo_dir`).
        uploads: the uploads folder, always allowed (default :func:`uploads_dir`).

    Returns:
        The roots from ``MTPSCOPE_ROOTS`` (empty entries ignored, relative ones taken from ``cwd``),
        or ``(cwd, demo)`` when the variable is unset or has no entries; the uploads folder is
        always appended.
    """
    env = os.environ if environ is None else environ
    base = Path(os.getcwd() if cwd is None else cwd)
    raw = env.get(ROOTS_ENV, "")
    entries = [e for e in raw.split(os.pathsep) if e.strip()]
    roots: list[Path] = []
    if entries:
        roots = [_resolve(base / Path(e.strip()).expanduser()) for e in entries]
    else:
        if demo is None:
            from mtpscope.cache import demo_dir

            demo = demo_dir()
        roots = [_resolve(base), _resolve(Path(demo))]
    roots.append(_resolve(Path(uploads) if uploads is not None else uploads_dir()))
    out: list[Path] = []
    for r in roots:
        if r not in out:
            out.append(r)
    return tuple(out)


def _resolve(p: Path) -> Path:
    return Path(os.path.realpath(os.path.expanduser(os.fspath(p))))


def is_allowed(path: str | os.PathLike[str], roots: Iterable[str | os.PathLike[str]]) -> bool:
    """True when ``path`` (resolved) is one of ``roots`` (resolved) or lies below one."""
    p = _resolve(Path(path))
    for r in roots:
        rr = _resolve(Path(r))
        if p == rr or p.is_relative_to(rr):
            return True
    return False


def check_path(path: str | os.PathLike[str], roots: Sequence[str | os.PathLike[str]], *,
               must_exist: bool = True, kind: str = "file",
               cwd: str | os.PathLike[str] | None = None) -> Path:
    """Resolve ``path`` and make sure the app may read it.

    Args:
        path: what the user typed or picked (``~`` and relative paths allowed; relative to ``cwd``).
        roots: the allowed folders (see :func:`allowed_roots`).
        must_exist: also require that it exists and is of ``kind``.
        kind: ``"file"`` or ``"dir"``.
        cwd: base for relative paths (default ``os.getcwd()``).

    Returns:
        The resolved absolute path.

    Raises:
        PathNotAllowedError: the resolved path lies outside every root (expected: under one of the
            roots, actual: the resolved path).
        InspectorError: ``must_exist`` and the path is missing, not a ``kind``, or not readable.
    """
    text = os.fspath(path).strip()
    if not text:
        raise InspectorError("no path given", expected=f"a {kind} path", actual="empty")
    if "\x00" in text:
        raise InspectorError("path contains a NUL byte", path=text.replace("\x00", "\\0"))
    p = Path(text).expanduser()
    if not p.is_absolute():
        p = Path(os.getcwd() if cwd is None else cwd) / p
    resolved = _resolve(p)
    if not is_allowed(resolved, roots):
        shown = ", ".join(os.fspath(_resolve(Path(r))) for r in roots) or "(none)"
        raise PathNotAllowedError(f"outside the allowed folders (set {ROOTS_ENV} to widen them)",
                                  path=resolved, expected=f"a path under {shown}", actual=str(resolved))
    if must_exist:
        if not resolved.exists():
            raise InspectorError("no such file or folder", path=resolved)
        if kind == "file" and not resolved.is_file():
            raise InspectorError("not a regular file", path=resolved, expected="a file",
                                 actual="a folder" if resolved.is_dir() else "something else")
        if kind == "dir" and not resolved.is_dir():
            raise InspectorError("not a folder", path=resolved, expected="a folder", actual="a file")
        if not os.access(resolved, os.R_OK):
            raise InspectorError("not readable (permission denied)", path=resolved)
    return resolved


#: Files of a Hugging Face checkpoint folder the inspector opens (see mtpscope.inspector.hf_checkpoint).
HF_FILE_PATTERNS = ("config.json", "*.safetensors", "*.safetensors.index.json")


def check_hf_dir(folder: str | os.PathLike[str], *, limit: int = 10_000) -> Path:
    """Refuse a Hugging Face checkpoint folder whose ``config.json``, ``*.safetensors`` or
    ``*.safetensors.index.json`` entries are not regular files (a FIFO would block the reader forever,
    a device would read without end). Links are followed; the folder itself was already checked by
    :func:`check_path`. Looks at the folder's direct entries only (at most ``limit`` of them).

    Returns:
        ``folder`` as a Path.

    Raises:
        InspectorError: an entry matching :data:`HF_FILE_PATTERNS` is not a regular file, is a
            dangling link, or cannot be examined (path: that entry; expected: a regular file).
    """
    import fnmatch

    d = Path(folder)
    try:
        with os.scandir(d) as it:
            for n, entry in enumerate(it):
                if n >= limit:
                    break
                if not any(fnmatch.fnmatchcase(entry.name, pat) for pat in HF_FILE_PATTERNS):
                    continue
                try:
                    mode = os.stat(entry.path).st_mode  # follows links, never opens the file
                except OSError as e:
                    raise InspectorError("checkpoint file cannot be examined", path=entry.path,
                                         expected="a regular file", actual=e.strerror or type(e).__name__) from None
                if not stat.S_ISREG(mode):
                    raise InspectorError("checkpoint file is not a regular file", path=entry.path,
                                         expected="a regular file", actual=file_kind(mode))
    except OSError as e:
        raise InspectorError("checkpoint folder cannot be listed", path=d,
                             actual=e.strerror or type(e).__name__) from None
    return d


def discover(roots: Sequence[str | os.PathLike[str]], *, suffix: str | None = None,
             marker: str | None = None, max_depth: int = 4, limit: int = 200) -> list[Path]:
    """Files ending in ``suffix`` or folders holding a file named ``marker``, under ``roots``.

    Walks at most ``max_depth`` levels below each root, skips hidden folders, ``.venv`` and
    ``__pycache__``, and stops after ``limit`` hits (for path completion; never a full scan of a
    large tree). Returns resolved paths, sorted, without duplicates.
    """
    skip = {".venv", "__pycache__", "node_modules", ".git"}
    hits: set[Path] = set()
    for root in roots:
        base = _resolve(Path(root))
        if not base.is_dir():
            continue
        base_depth = len(base.parts)
        for dirpath, dirnames, filenames in os.walk(base):
            depth = len(Path(dirpath).parts) - base_depth
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in skip)
            if depth >= max_depth:
                dirnames[:] = []
            if marker is not None and marker in filenames:
                hits.add(_resolve(Path(dirpath)))
            if suffix is not None:
                for name in filenames:
                    if name.endswith(suffix):
                        hits.add(_resolve(Path(dirpath) / name))
            if len(hits) >= limit:
                break
        if len(hits) >= limit:
            break
    return sorted(hits)[:limit]


def store_upload(data: bytes, name: str, dest: str | os.PathLike[str]) -> Path:
    """Write uploaded bytes to ``dest/<sha256[:16]>-<safe name>`` and return that path.

    The bytes are written as they are (never executed, never unpickled). An existing file with the
    same hash is reused.

    Raises:
        InspectorError: more than :data:`MAX_UPLOAD_BYTES` bytes.
    """
    if len(data) > MAX_UPLOAD_BYTES:
        raise InspectorError("upload too large", key=name, expected=f"at most {MAX_UPLOAD_BYTES} bytes",
                             actual=f"{len(data)} bytes")
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in Path(name).name)[:80] or "upload"
    digest = hashlib.sha256(data).hexdigest()[:16]
    out_dir = Path(dest)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{digest}-{safe}"
    if not (out.exists() and out.stat().st_size == len(data)):
        tmp = out.with_suffix(out.suffix + ".part")
        tmp.write_bytes(data)
        os.replace(tmp, out)
    return out


def extract_trace_zip(data: bytes, name: str, dest: str | os.PathLike[str]) -> Path:
    """Unpack an uploaded trace archive (a .zip of a trace folder) safely and return the trace folder.

    Only plain files are extracted; absolute names, ``..`` components, links and archives that
    unpack to more than :data:`MAX_UNPACKED_BYTES` or hold more than :data:`MAX_ARCHIVE_MEMBERS`
    members are refused. The trace folder is the one holding ``manifest.json``.

    Members are unpacked into a temporary folder that is moved in place only when all of them
    unpacked cleanly (a failure leaves no folder behind).

    Raises:
        TraceError: not a zip, unsafe or too large, no ``manifest.json`` inside, or a corrupt member
            (bad deflate data, a CRC mismatch, a member larger than it declares; key: the upload's
            name and the member).
    """
    if len(data) > MAX_UPLOAD_BYTES:
        raise TraceError("upload too large", key=name, expected=f"at most {MAX_UPLOAD_BYTES} bytes",
                         actual=f"{len(data)} bytes")
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as e:
        raise TraceError("not a zip archive", key=name) from e
    infos = zf.infolist()
    if len(infos) > MAX_ARCHIVE_MEMBERS:
        raise TraceError("archive has too many members", key=name,
                         expected=f"at most {MAX_ARCHIVE_MEMBERS}", actual=len(infos))
    total = sum(i.file_size for i in infos)
    if total > MAX_UNPACKED_BYTES:
        raise TraceError("archive unpacks too large", key=name,
                         expected=f"at most {MAX_UNPACKED_BYTES} bytes", actual=f"{total} bytes")
    manifests: list[PurePosixPath] = []
    for i in infos:
        pp = PurePosixPath(i.filename)
        mode = (i.external_attr >> 16) & 0o170000
        if pp.is_absolute() or ".." in pp.parts or "\\" in i.filename or mode == 0o120000:
            raise TraceError("unsafe member name in archive", key=i.filename)
        if not i.is_dir() and pp.name == "manifest.json":
            manifests.append(pp)
    if not manifests:
        raise TraceError("no manifest.json in the archive", key=name)
    top = min(manifests, key=lambda m: len(m.parts)).parent
    digest = hashlib.sha256(data).hexdigest()[:16]
    out = Path(dest) / f"trace-{digest}"
    if not (out / "manifest.json").is_file():
        # unpack into a fresh folder next to ``out`` and move it in place only when every member
        # unpacked cleanly: a corrupt archive leaves nothing behind (a half-unpacked folder with a
        # manifest would otherwise be reused as if complete next time)
        Path(dest).mkdir(parents=True, exist_ok=True)
        tmp = Path(dest) / f".trace-{digest}.part-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        member = "?"
        try:
            written = 0
            for i in infos:
                if i.is_dir():
                    continue
                member = i.filename
                target = tmp / PurePosixPath(i.filename)
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(i) as src, open(target, "wb") as dst:
                    while block := src.read(1 << 20):
                        written += len(block)
                        if written > MAX_UNPACKED_BYTES:
                            raise TraceError("archive unpacks larger than it declares", key=f"{name}: {i.filename}",
                                             expected=f"at most {MAX_UNPACKED_BYTES} bytes",
                                             actual=f"more than {written} bytes")
                        dst.write(block)
        except TraceError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError, ValueError) as e:
            shutil.rmtree(tmp, ignore_errors=True)
            kind = "zlib.error" if isinstance(e, zlib.error) else type(e).__name__
            raise TraceError(f"corrupt archive member ({kind}: {e})", key=f"{name}: {member}") from None
        except OSError as e:  # a member name the file system refuses, a file where a folder must go, ...
            shutil.rmtree(tmp, ignore_errors=True)
            raise TraceError(f"cannot unpack archive member ({e.strerror or type(e).__name__})",
                             key=f"{name}: {member}") from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(out, ignore_errors=True)
        try:
            os.replace(tmp, out)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not (out / "manifest.json").is_file():
                raise
    return out / top


# ------------------------------------------------------------------------------ URLs (issue 16)

#: ``MTPSCOPE_ALLOW_URLS=1`` lets the app read GGUF headers from URLs; off by default, because the app may
#: be exposed on a network and a text box must not make it send requests to arbitrary hosts.
ALLOW_URLS_ENV = "MTPSCOPE_ALLOW_URLS"
#: Hosts the app may fetch from (comma-separated; sub-domains included), default the Hugging Face Hub.
URL_HOSTS_ENV = "MTPSCOPE_URL_HOSTS"
DEFAULT_URL_HOSTS = ("huggingface.co", "hf.co")


def urls_allowed(environ: dict[str, str] | None = None) -> bool:
    """True when ``MTPSCOPE_ALLOW_URLS`` is ``1`` (or ``true`` / ``yes``)."""
    env = os.environ if environ is None else environ
    return env.get(ALLOW_URLS_ENV, "").strip().lower() in ("1", "true", "yes")


def url_hosts(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """The allow-list: ``MTPSCOPE_URL_HOSTS`` (comma-separated host names) or :data:`DEFAULT_URL_HOSTS`."""
    env = os.environ if environ is None else environ
    hosts = tuple(h.strip().lower().rstrip(".") for h in env.get(URL_HOSTS_ENV, "").split(",") if h.strip())
    return hosts or DEFAULT_URL_HOSTS


def check_url(url: str, environ: dict[str, str] | None = None) -> str:
    """``url`` (``https://``, ``http://`` or ``hf://``) if the app may fetch it; pure (no request is sent).

    Rules: URLs must be switched on (:func:`urls_allowed`); the URL's host (for ``hf://``, the Hub's, i.e.
    the ``HF_ENDPOINT`` host) must be an allow-listed host or a sub-domain of one (``evilhf.co`` is not one
    of ``hf.co``). Redirects are then followed only to the same host or the Hub's CDN
    (:mod:`mtpscope.inspector.remote`).

    Raises:
        PathNotAllowedError: URLs are off, the URL cannot be parsed, or its host is not allowed.
    """
    from mtpscope.inspector.remote import resolve

    if not urls_allowed(environ):
        raise PathNotAllowedError("reading URLs is off in this app", key=ALLOW_URLS_ENV,
                                  expected=f"{ALLOW_URLS_ENV}=1 in the app's environment", actual="unset")
    try:
        loc = resolve(url.strip())
    except InspectorError as e:
        raise PathNotAllowedError(f"not a URL the app can read: {e.message}", key="url",
                                  expected="https://HOST/PATH.gguf or hf://ORG/REPO/FILE.gguf", actual=url[:120]) from None
    from urllib.parse import urlsplit

    host = (urlsplit(loc.url).hostname or "").lower().rstrip(".")
    hosts = url_hosts(environ)
    if not any(host == h or host.endswith("." + h) for h in hosts):
        raise PathNotAllowedError("host not in the allow-list", key=URL_HOSTS_ENV, expected=", ".join(hosts),
                                  actual=host or "none")
    return url.strip()
