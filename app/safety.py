"""Path and upload safety for the app (pure: no Streamlit, no network).

The app reads files only under allowed folders: the working directory and the demo cache
(:func:`mtpscope.cache.demo_dir`), plus the folders named in ``MTPSCOPE_ROOTS``
(``os.pathsep``-separated); with ``MTPSCOPE_ROOTS_ONLY=1`` only the named ones. Paths are resolved
(``~`` expanded, symlinks followed, ``..`` removed) before the check, so a symlink inside a root that
points outside it is refused.

Uploads are stored by content hash under ``<cache>/uploads`` (a folder the app always allows), never
executed or unpickled, never over another file: the GGUF reader memory-maps them like any other file.

Serving (:func:`serve_plan`): ``mtpscope app`` listens on 127.0.0.1; another address needs
``MTPSCOPE_ROOTS`` set, and then only the named folders (and the uploads folder) are readable unless
``MTPSCOPE_ROOTS_ONLY=0`` is set explicitly.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import ipaddress
import os
import shutil
import stat
import tempfile
import zipfile
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from mtpscope.errors import InspectorError, PathNotAllowedError, ServeRefusedError, TraceError
from mtpscope.inspector.paths import file_kind
from mtpscope.traces.store.layout import MANIFEST

ROOTS_ENV = "MTPSCOPE_ROOTS"
#: ``1`` (or true/yes/on): only the ``MTPSCOPE_ROOTS`` folders, without the working directory and demo.
ROOTS_ONLY_ENV = "MTPSCOPE_ROOTS_ONLY"

#: Largest upload the app accepts (bytes). Matches ``--server.maxUploadSize`` (MiB) in
#: :data:`mtpscope.cli.serve.SERVER_FLAGS` (what ``mtpscope app`` passes) and .streamlit/config.toml.
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


def roots_only(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``MTPSCOPE_ROOTS_ONLY`` asks for the named roots only.

    Unset, empty, ``0``, ``false``, ``no`` and ``off`` (any case) mean False; any other value means
    True (an unclear value errs on the side of reading less).
    """
    env = os.environ if environ is None else environ
    v = env.get(ROOTS_ONLY_ENV, "").strip().lower()
    return v not in ("", "0", "false", "no", "off")


def named_roots(environ: Mapping[str, str] | None = None) -> list[str]:
    """The non-empty entries of ``MTPSCOPE_ROOTS`` (split on ``os.pathsep``, stripped), as written."""
    env = os.environ if environ is None else environ
    return [e.strip() for e in env.get(ROOTS_ENV, "").split(os.pathsep) if e.strip()]


def allowed_roots(environ: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
                  demo: str | os.PathLike[str] | None = None,
                  uploads: str | os.PathLike[str] | None = None) -> tuple[Path, ...]:
    """The folders the app may read, resolved, duplicates removed, in order.

    Args:
        environ: environment to read ``MTPSCOPE_ROOTS`` / ``MTPSCOPE_ROOTS_ONLY`` from (default
            ``os.environ``).
        cwd: working directory used for the default and for relative entries (default ``os.getcwd()``).
        demo: demo folder used for the default (default :func:`mtpscope.cache.demo_dir`).
        uploads: the uploads folder, always allowed (default :func:`uploads_dir`).

    Returns:
        ``(cwd, demo)`` (left out when :func:`roots_only`), then the ``MTPSCOPE_ROOTS`` entries (empty
        entries ignored, ``~`` expanded, relative ones taken from ``cwd``), then the uploads folder.
    """
    env = os.environ if environ is None else environ
    base = Path(os.getcwd() if cwd is None else cwd)
    roots: list[Path] = []
    if not roots_only(env):
        if demo is None:
            from mtpscope.cache import demo_dir

            demo = demo_dir()
        roots = [_resolve(base), _resolve(Path(demo))]
    roots += [_resolve(base / Path(e).expanduser()) for e in named_roots(env)]
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


# ------------------------------------------------------------------------------------- serving

#: Host names a loopback server answers to (``server.allowedHosts``: a web page that rebinds its own
#: DNS name to 127.0.0.1 is refused).
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def is_loopback(address: str) -> bool:
    """True when a server listening on ``address`` is reachable from this machine only.

    ``localhost`` and any loopback IP literal (127.0.0.0/8, ``::1``, ``::ffff:127.x.y.z``, brackets
    allowed) are loopback. Every other value is not: ``0.0.0.0``, ``::``, the empty string (Streamlit
    then listens on every interface), a LAN address, and any other host name (it is not resolved).
    """
    a = address.strip().lower().removeprefix("[").removesuffix("]")
    if a == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(a)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


@dataclass(frozen=True)
class ServePlan:
    """What ``mtpscope app --address A --port P`` will serve (see :func:`serve_plan`).

    Attributes:
        address, port: where the server listens.
        loopback: :func:`is_loopback` of ``address``.
        env: environment settings the server process gets on top of the caller's (name, value).
        roots: the folders the served app can read (:func:`allowed_roots` under ``env``).
        uploads: where uploads from any visitor are stored (also one of ``roots``).
        allowed_hosts: Streamlit ``server.allowedHosts`` (``("*",)``: any Host header).
    """

    address: str
    port: int
    loopback: bool
    env: tuple[tuple[str, str], ...]
    roots: tuple[Path, ...]
    uploads: Path
    allowed_hosts: tuple[str, ...]

    def exposure_line(self) -> str | None:
        """One line saying what a non-loopback server exposes; None on loopback."""
        if self.loopback:
            return None
        where = f"{self.address}:{self.port}" if self.address.strip() else f"every interface, port {self.port}"
        readable = ", ".join(str(r) for r in self.roots if r != self.uploads) or "(no folder)"
        return (f"serving on {where}: anyone who can reach this machine can browse GGUF headers, tensor "
                f"values and traces under {readable} and upload files into {self.uploads} (no login; "
                f"XSRF protection on)")


def serve_plan(address: str, port: int, environ: Mapping[str, str] | None = None, *,
               cwd: str | os.PathLike[str] | None = None, demo: str | os.PathLike[str] | None = None,
               uploads: str | os.PathLike[str] | None = None) -> ServePlan:
    """Decide whether and how the app may be served on ``address:port``.

    A loopback address (:func:`is_loopback`) is always allowed; the server accepts only the
    :data:`LOOPBACK_HOSTS` (and ``address``) as Host. Any other address is an explicit choice to
    expose the app: it needs ``MTPSCOPE_ROOTS`` with at least one entry, and the server then reads
    only those folders and the uploads folder (``MTPSCOPE_ROOTS_ONLY=1`` is set for it unless the
    caller set ``MTPSCOPE_ROOTS_ONLY`` explicitly, e.g. ``0`` to keep the working directory and demo).

    Args:
        address: the listening address as given (``--address``).
        port: the TCP port.
        environ: the caller's environment (default ``os.environ``); ``cwd``, ``demo``, ``uploads``
            as for :func:`allowed_roots`.

    Raises:
        ServeRefusedError: a non-loopback ``address`` while ``MTPSCOPE_ROOTS`` names no folder
            (key: ``--address``; expected: the variable set; actual: what it holds).
    """
    env = dict(os.environ if environ is None else environ)
    loopback = is_loopback(address)
    overrides: list[tuple[str, str]] = []
    if not loopback:
        if not named_roots(env):
            raw = env.get(ROOTS_ENV)
            raise ServeRefusedError(
                f"{address or '(every interface)'} is reachable from other machines: set {ROOTS_ENV} to the "
                "folders the app may show, or keep 127.0.0.1 and use SSH port forwarding (README: Serving the app)",
                key="--address", expected=f"{ROOTS_ENV} naming at least one folder",
                actual="unset" if raw is None else repr(raw))
        if ROOTS_ONLY_ENV not in env:
            overrides.append((ROOTS_ONLY_ENV, "1"))
    served_env = {**env, **dict(overrides)}
    up = _resolve(Path(uploads) if uploads is not None else uploads_dir())
    roots = allowed_roots(served_env, cwd=cwd, demo=demo, uploads=up)
    hosts = tuple(dict.fromkeys((*LOOPBACK_HOSTS, address.strip().lower().strip("[]")))) if loopback else ("*",)
    return ServePlan(address=address, port=port, loopback=loopback, env=tuple(overrides), roots=roots,
                     uploads=up, allowed_hosts=hosts)


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


def _same_bytes(path: Path, size: int, sha256: str) -> bool:
    """True when ``path`` is a regular file (not a link) of ``size`` bytes whose sha256 is ``sha256``."""
    try:
        st_ = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st_.st_mode) or st_.st_size != size:
        return False
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest() == sha256


def store_upload(data: bytes, name: str, dest: str | os.PathLike[str]) -> Path:
    """Write uploaded bytes to ``dest/<sha256[:16]>-<safe name>`` and return that path.

    The bytes are written as they are (never executed, never unpickled), first to a private temporary
    file in ``dest`` and then linked to their final name, which fails if that name exists: an upload
    never replaces another file. An existing file with the same name and the same bytes (the same
    upload again) is reused. ``<safe name>``: the last path component of ``name`` with every character
    other than letters, digits and ``._-`` replaced by ``_``, at most 80 characters.

    Raises:
        InspectorError: more than :data:`MAX_UPLOAD_BYTES` bytes; or the name is taken by something
            else (other bytes with the same 64-bit hash prefix, a link, a folder): path: that name,
            expected: the upload's sha256.
    """
    if len(data) > MAX_UPLOAD_BYTES:
        raise InspectorError("upload too large", key=name, expected=f"at most {MAX_UPLOAD_BYTES} bytes",
                             actual=f"{len(data)} bytes")
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in Path(name).name)[:80] or "upload"
    full = hashlib.sha256(data).hexdigest()
    out_dir = Path(dest)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{full[:16]}-{safe}"

    def taken() -> InspectorError:
        return InspectorError("upload name already taken by other content; not overwritten", path=out,
                              expected=f"a file with sha256 {full}", actual="different bytes or not a file")

    if os.path.lexists(out):
        if _same_bytes(out, len(data), full):
            return out
        raise taken()
    fd, tmp = tempfile.mkstemp(prefix=f".{full[:16]}-", suffix=".part", dir=out_dir)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        try:
            os.link(tmp, out)  # atomic, and refuses an existing name (unlike os.replace)
        except FileExistsError:
            if not _same_bytes(out, len(data), full):  # someone else got there first
                raise taken() from None
        except OSError:  # a file system without hard links: check, then move (a tiny race remains)
            if os.path.lexists(out):
                if not _same_bytes(out, len(data), full):
                    raise taken() from None
            else:
                os.rename(tmp, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return out


def extract_trace_zip(data: bytes, name: str, dest: str | os.PathLike[str]) -> Path:
    """Unpack an uploaded trace archive (a .zip of a trace folder) safely and return the trace folder.

    Only plain files are extracted; absolute names, ``..`` components, links and archives that
    unpack to more than :data:`MAX_UNPACKED_BYTES` or hold more than :data:`MAX_ARCHIVE_MEMBERS`
    members are refused. The trace folder is the one holding ``manifest.json``.

    Members are unpacked into a temporary folder that is moved in place only when all of them
    unpacked cleanly (a failure leaves no folder behind). The folder is ``dest/trace-<sha256[:16]>``
    of the archive's bytes; the same archive again reuses it, and it never replaces other files.

    Raises:
        TraceError: not a zip, unsafe or too large, no ``manifest.json`` inside, or a corrupt member
            (bad deflate data, a CRC mismatch, a member larger than it declares; key: the upload's
            name and the member); or ``trace-<hash>`` is taken by a link, a file or a folder without
            ``manifest.json`` (path: that name).
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
        if not i.is_dir() and pp.name == MANIFEST:
            manifests.append(pp)
    if not manifests:
        raise TraceError(f"no {MANIFEST} in the archive", key=name)
    top = min(manifests, key=lambda m: len(m.parts)).parent
    digest = hashlib.sha256(data).hexdigest()[:16]
    out = Path(dest) / f"trace-{digest}"
    if out.is_symlink() or (os.path.lexists(out) and not out.is_dir()):
        raise TraceError("upload folder name already taken by something else; not overwritten", path=out,
                         expected="a folder unpacked from this archive", actual=file_kind(os.lstat(out).st_mode))
    if not (out / MANIFEST).is_file():
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
        try:
            os.rename(tmp, out)  # refuses a non-empty folder: never over another upload's files
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not (out / MANIFEST).is_file():  # not the same archive unpacked meanwhile
                raise TraceError("upload folder name already taken by other files; not overwritten", path=out,
                                 expected="a folder unpacked from this archive",
                                 actual=f"a folder without {MANIFEST}") from None
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


# ------------------------------------------------------------------------------ llama-server URLs (issue 24)

#: hosts a Server page may always talk to: this machine
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def check_server_url(url: str, environ: dict[str, str] | None = None) -> str:
    """``url`` (``http://`` / ``https://``) if the Server page may send requests to it; pure (nothing is sent).

    Rules: a loopback host (:data:`LOOPBACK_HOSTS`, any port) is always allowed; any other host only with URLs
    switched on (:func:`urls_allowed`, ``MTPSCOPE_ALLOW_URLS=1``) and the host in the allow-list
    (``MTPSCOPE_URL_HOSTS``, a host or a sub-domain of one), as for remote GGUFs. No user info, query or
    fragment (:func:`mtpscope.traces.server.client.check_base_url`).

    Raises:
        PathNotAllowedError: not an http(s) URL, or a host that is not allowed (naming the switch or the list).
    """
    from urllib.parse import urlsplit

    from mtpscope.errors import ServerError
    from mtpscope.traces.server.client import check_base_url

    try:
        base = check_base_url(url)
    except ServerError as e:
        raise PathNotAllowedError(e.message, key="url", expected=e.expected, actual=e.actual) from None
    host = (urlsplit(base).hostname or "").lower().rstrip(".")
    if host in LOOPBACK_HOSTS:
        return base
    if not urls_allowed(environ):
        raise PathNotAllowedError("only this machine's llama-server (127.0.0.1) is allowed", key=ALLOW_URLS_ENV,
                                  expected=f"{ALLOW_URLS_ENV}=1 and the host in {URL_HOSTS_ENV}", actual=host)
    hosts = url_hosts(environ)
    if not any(host == h or host.endswith("." + h) for h in hosts):
        raise PathNotAllowedError("host not in the allow-list", key=URL_HOSTS_ENV, expected=", ".join(hosts),
                                  actual=host)
    return base
