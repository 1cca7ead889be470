"""GGUF headers over HTTP: ``https://…/x.gguf`` and ``hf://ORG/REPO/[REVISION/]FILE.gguf`` without a download.

Only the header is read, with HTTP range requests: one small first request (it also tells the file size,
from ``Content-Range``), then reads sized by the header walk (:func:`open_gguf_reader`, the read strategy
over :func:`mtpscope.inspector.gguf.parse_header`: the walk knows the counts and lengths read so far and
estimates the rest; known local files, the layout hints, size the reads of what they repeat). Tensor data
is read only when a caller asks for values, and then only the rows asked for (:meth:`GGUFFile.tensor_data`).

Library choice (on merit, for this job): **httpx2** (the HTTP client huggingface_hub itself is built on)
for the requests: explicit ``Range`` headers, streamed bodies (a server that ignores ``Range`` is noticed
from its status line and the connection dropped before the body is read), per-phase timeouts, connection
reuse, and ``follow_redirects=False`` so that each redirect is checked against the allow-list below;
**huggingface_hub** for what is the Hub's: ``hf_hub_url`` (the resolve URL, ``HF_ENDPOINT`` honoured)
and ``get_token`` (``HF_TOKEN`` or the saved login). fsspec's HTTP file system needs aiohttp and reads
through its own block cache (no control over request count or redirect targets); ``HfFileSystem`` reads
only the Hub; requests retries only before the body is read. The retry loop here is a few lines because
what is retried includes a body cut short, which no client retries.

Rules:

* Redirects are followed (at most :data:`MAX_REDIRECTS`) to the same origin, or to a host of the Hub and
  its CDN (:data:`HUB_HOST_SUFFIXES`, e.g. ``cdn-lfs.hf.co``, ``cas-bridge.xethub.hf.co``), over https;
  any other target is refused, naming it.
* The token (``HF_TOKEN``) is sent only to the Hub's own hosts (``huggingface.co``, ``hf.co``, the
  ``HF_ENDPOINT`` host), never to a CDN after a redirect and never printed; URLs in messages lose their
  query string (signed CDN URLs carry credentials there).
* A server that answers a range request with the whole file (200) is refused unless
  ``allow_full_download`` (then the file is streamed to a temporary file and opened from there).
* Timeouts, 408 / 429 / 5xx answers, dropped connections and bodies shorter than asked are retried
  (``retries`` times, exponential backoff, ``Retry-After`` honoured up to :data:`MAX_RETRY_AFTER_S`);
  then one :class:`~mtpscope.errors.RemoteFileError` line names the URL and what happened.
* Caps: the header (``max_header_bytes``) and any single read of tensor data (``max_read_bytes``).
"""

from __future__ import annotations

import contextlib
import email.utils
import os
import re
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit, urlunsplit

from mtpscope.errors import GGUFFormatError, InspectorError, RemoteFileError

if TYPE_CHECKING:  # the reader itself is imported where a header is read (numpy stays out of ``import remote``)
    from mtpscope.inspector.gguf import ByteReader, GGUFFile, GGUFLike, NeedMoreBytes

#: Hosts (and their sub-domains) that serve the Hub's files: redirects there are followed.
HUB_HOST_SUFFIXES = ("huggingface.co", "hf.co")
#: Hosts that receive the Hub token (exact names; the ``HF_ENDPOINT`` host is added at run time).
HUB_TOKEN_HOSTS = ("huggingface.co", "hf.co")
MAX_REDIRECTS = 8
MAX_RETRY_AFTER_S = 30.0
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
#: Characters of a response body quoted in an error line.
_BODY_QUOTE = 120

#: First read of a header (a small request: most of a drafter-only or tokenizer-less header, the start of
#: a tokenizer's token list otherwise).
FIRST_READ_BYTES = 256 * 1024
#: Read past the walk's estimate of the header end, so that a small misestimate costs no extra read.
READ_AHEAD_BYTES = 128 * 1024
#: Cap on the extra margin given to the estimated (not yet walked) part of the header.
READ_AHEAD_MAX = 512 * 1024

_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class RemoteOptions:
    """How URLs are read.

    Attributes:
        timeout_s: connect / read / write timeout of one request, seconds.
        retries: further attempts after a timeout, a dropped or short body, or HTTP 408 / 429 / 5xx.
        backoff_s: wait before the first retry, seconds (doubled each time, at most 8 s).
        first_bytes: size of the first range request (bytes).
        max_header_bytes: refuse a header larger than this (bytes).
        max_read_bytes: refuse one read of tensor data larger than this (bytes).
        allow_full_download: accept a server without range requests by downloading the whole file.
        token: the Hub token; None = ``huggingface_hub.get_token()`` (``HF_TOKEN`` / saved login);
            ``""`` = send none.
        hub_hosts: hosts that get the token and count as the Hub (default the Hub's and ``HF_ENDPOINT``'s).
        cdn_suffixes: host suffixes a redirect may go to (default :data:`HUB_HOST_SUFFIXES`).
        cdn_require_https: redirects to those hosts only over https (False only for local test servers).
        layout_hints: local GGUF paths whose metadata a remote header may repeat (the cached Gemma 4
            tokenizer: reads sized from it, see :func:`open_gguf_reader`).
        download_dir: where ``allow_full_download`` puts its temporary copy (default the system temp).
    """

    timeout_s: float = 30.0
    retries: int = 3
    backoff_s: float = 1.0
    first_bytes: int = FIRST_READ_BYTES
    max_header_bytes: int = 64 * 1024 * 1024
    max_read_bytes: int = 256 * 1024 * 1024
    allow_full_download: bool = False
    token: str | None = None
    hub_hosts: tuple[str, ...] | None = None
    cdn_suffixes: tuple[str, ...] = HUB_HOST_SUFFIXES
    cdn_require_https: bool = True
    layout_hints: tuple[str, ...] = ()
    download_dir: str | None = None


@dataclass(frozen=True)
class Location:
    """A resolved remote location.

    Attributes:
        url: the URL requested first (for ``hf://``: the Hub's resolve URL).
        spec: what the user gave.
        repo_id / revision / filename: for ``hf://`` (and Hub resolve URLs), else None.
    """

    url: str
    spec: str
    repo_id: str | None = None
    revision: str | None = None
    filename: str | None = None

    @property
    def display(self) -> str:
        """The URL for messages: no query string, no user info."""
        return display_url(self.url)


def is_remote(spec: Any) -> bool:
    """True for ``http://``, ``https://`` and ``hf://`` strings."""
    return isinstance(spec, str) and spec.lower().startswith(("http://", "https://", "hf://"))


#: a URL's scheme at the start of a string (``ftp://``, ``s3://``, ...)
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def check_scheme(spec: Any) -> None:
    """Refuse a URL of a scheme mtpscope does not read (rather than looking for a local file of that name).

    Raises:
        RemoteFileError: ``spec`` starts with ``SCHEME://`` other than ``http``, ``https`` or ``hf``.
    """
    m = _SCHEME_RE.match(spec) if isinstance(spec, str) else None
    if m is not None and not is_remote(spec):
        raise RemoteFileError("unsupported URL scheme", path=display_url(spec), expected="http://, https:// or hf://",
                              actual=f"{m.group(1)}://")


def display_url(url: str) -> str:
    """``url`` without its query, fragment and user info (what error lines print); one that does not parse is
    cut the same way by its text."""
    try:
        p = urlsplit(url)
        host = p.hostname or ""
        if p.port is not None:
            host += f":{p.port}"
        return urlunsplit((p.scheme, host, p.path, "", ""))
    except ValueError:      # (an unclosed IPv6 bracket, a port out of range)
        shown = re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@", r"\1", url)
        return re.split(r"[?#]", shown, maxsplit=1)[0]


def parse_hf(spec: str, endpoint: str | None = None) -> Location:
    """``hf://ORG/REPO/FILE.gguf``, ``hf://ORG/REPO/REVISION/FILE.gguf`` or ``hf://ORG/REPO@REVISION/PATH``.

    With three or more segments after the repo, the first is the revision (the issue's
    ``[REVISION/]FILE`` form); a file in a sub-folder of a branch is named with ``@``:
    ``hf://ORG/REPO@main/sub/FILE.gguf``. The URL is ``huggingface_hub.hf_hub_url``'s resolve URL.

    Raises:
        RemoteFileError: not of these forms.
    """
    from huggingface_hub import hf_hub_url

    rest = spec[len("hf://"):]
    parts = rest.split("/")
    if len(parts) < 3 or any(not x for x in parts):
        raise RemoteFileError("not an hf:// file location", path=spec,
                              expected="hf://ORG/REPO/[REVISION/]FILE.gguf or hf://ORG/REPO@REVISION/PATH",
                              actual=spec)
    if any(x in (".", "..") or x.split("@")[-1] in (".", "..") for x in parts):
        # (a URL would resolve them away: hf://org/repo/../x.gguf asked for https://HUB/org/repo/x.gguf)
        raise RemoteFileError("not an hf:// file location: a '.' or '..' segment", path=spec,
                              expected="ORG/REPO[@REVISION]/[REVISION/]FILE without '.' or '..' segments", actual=spec)
    org, repo = parts[0], parts[1]
    revision = None
    if "@" in repo:
        repo, revision = repo.split("@", 1)
        path = "/".join(parts[2:])
    elif len(parts) >= 4:
        revision, path = parts[2], "/".join(parts[3:])
    else:
        path = parts[2]
    if not repo or revision == "":
        raise RemoteFileError("not an hf:// file location", path=spec, expected="ORG/REPO[@REVISION]", actual=spec)
    repo_id = f"{org}/{repo}"
    url = hf_hub_url(repo_id, path, revision=revision, endpoint=endpoint)
    return Location(url, spec, repo_id, revision or "main", path)


def resolve(spec: str, endpoint: str | None = None) -> Location:
    """A :class:`Location` for an ``https://``, ``http://`` or ``hf://`` string.

    Raises:
        RemoteFileError: not a URL of these kinds, or an unparsable one.
    """
    if spec.lower().startswith("hf://"):
        return parse_hf(spec, endpoint)
    import httpx2

    try:
        p = urlsplit(spec)
        _ = p.port               # (urlsplit checks the port only when asked)
        httpx2.URL(spec)         # what the requests will be made with: its host rules (an IPv4 address's parts)
    except (ValueError, httpx2.InvalidURL) as e:
        raise RemoteFileError(f"unparsable URL ({e})", path=display_url(spec)) from None
    if p.scheme.lower() not in ("http", "https") or not p.hostname:
        raise RemoteFileError("not an http(s) URL", path=display_url(spec), expected="https://HOST/PATH",
                              actual=spec[:80])
    m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", p.path)
    if m and _host_matches(p.hostname, HUB_HOST_SUFFIXES):
        return Location(spec, spec, m.group(1), m.group(2), m.group(3))
    return Location(spec, spec)


def _host_matches(host: str | None, suffixes: Sequence[str]) -> bool:
    h = (host or "").lower().rstrip(".")
    return any(h == s or h.endswith("." + s) for s in (x.lower() for x in suffixes))


def _origin(url: str) -> tuple[str, str, int]:
    p = urlsplit(url)
    port = p.port or {"http": 80, "https": 443}.get(p.scheme.lower(), 0)
    return p.scheme.lower(), (p.hostname or "").lower(), port


def redirect_allowed(from_url: str, to_url: str, cdn_suffixes: Sequence[str] = HUB_HOST_SUFFIXES,
                     require_https: bool = True) -> bool:
    """Whether a redirect from ``from_url`` to ``to_url`` may be followed (pure).

    Allowed: the same origin (scheme, host, port), or a URL on a host that is, or is a sub-domain of, one
    of ``cdn_suffixes`` (the Hub and its CDN), over https unless ``require_https`` is False (tests with a
    local server). Refused: anything else (``evilhf.co`` is not a sub-domain of ``hf.co``).
    """
    try:
        src, dst = _origin(from_url), _origin(to_url)
    except ValueError:
        return False
    if dst == src:
        return True
    return (dst[0] == "https" or not require_https) and _host_matches(dst[1], cdn_suffixes)


def hub_token_hosts(extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The hosts that receive the Hub token: the Hub's and the ``HF_ENDPOINT`` host, plus ``extra``."""
    from huggingface_hub import constants

    hosts = list(HUB_TOKEN_HOSTS)
    ep = urlsplit(constants.ENDPOINT).hostname
    if ep:
        hosts.append(ep.lower())
    return tuple(dict.fromkeys([*hosts, *(h.lower() for h in extra)]))


# ------------------------------------------------------------------------------------------- reader


@dataclass
class RequestLog:
    """What a reader sent: one entry per HTTP request (redirect hops included)."""

    entries: list[tuple[str, str, int, int]] = field(default_factory=list)  # (method, url, status, bytes)

    @property
    def n_requests(self) -> int:
        return len(self.entries)

    @property
    def n_bytes(self) -> int:
        return sum(e[3] for e in self.entries)


class HTTPRangeReader:
    """A :class:`inspector.gguf.ByteReader` over HTTP range requests (see the module docstring).

    Attributes:
        location: what was asked for; ``url``: where the bytes come from now (after redirects).
        size: the file size (from the first answer's ``Content-Range``), known after :meth:`start`.
        log: every request sent (:class:`RequestLog`).
    """

    def __init__(self, location: Location, options: RemoteOptions | None = None) -> None:
        self.location = location
        self.options = options or RemoteOptions()
        self.url = location.url
        self.size: int | None = None
        self.log = RequestLog()
        self._client: Any = None
        o = self.options
        self._hub_hosts = tuple(h.lower() for h in o.hub_hosts) if o.hub_hosts is not None else hub_token_hosts()
        self._token = o.token
        if self._token is None:
            from huggingface_hub import get_token

            self._token = get_token() or ""

    # -- plumbing
    @property
    def display(self) -> str:
        return self.location.display

    def _http(self) -> Any:
        if self._client is None:
            import httpx2

            t = self.options.timeout_s
            self._client = httpx2.Client(timeout=httpx2.Timeout(t), follow_redirects=False,
                                         headers={"Accept-Encoding": "identity", "User-Agent": "mtpscope"})
        return self._client

    def close(self) -> None:
        """Close the connection pool (a later read opens a new one)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def _headers(self, url: str, rng: str | None) -> dict[str, str]:
        """Request headers: the range, and the token only for a Hub host over https (or a host the caller
        named in ``hub_hosts``)."""
        h: dict[str, str] = {}
        if rng:
            h["Range"] = rng
        p = urlsplit(url)
        if self._token and (p.hostname or "").lower() in self._hub_hosts \
                and (p.scheme == "https" or self.options.hub_hosts is not None):
            h["Authorization"] = f"Bearer {self._token}"
        return h

    def _fail(self, message: str, url: str | None = None, **kw: Any) -> RemoteFileError:
        return RemoteFileError(message, path=display_url(url or self.location.url), **kw)

    @contextlib.contextmanager
    def _get(self, rng: str | None) -> Iterator[Any]:
        """One GET (streamed) of ``self.url`` with ``rng``, redirects checked, retries on transient
        failures; yields the final response with its body not yet read."""
        import httpx2

        o = self.options
        attempt = 0
        while True:
            attempt += 1
            url = self.url
            hops = 0
            try:
                while True:
                    req = self._http().build_request("GET", url, headers=self._headers(url, rng))
                    resp = self._http().send(req, stream=True)
                    if resp.status_code in (301, 302, 303, 307, 308) and "location" in resp.headers:
                        self.log.entries.append(("GET", display_url(url), resp.status_code, 0))
                        resp.close()
                        target = urljoin(url, resp.headers["location"])
                        if not redirect_allowed(url, target, o.cdn_suffixes, o.cdn_require_https):
                            raise self._fail(f"redirect to {display_url(target)} refused (only the same host "
                                             f"or the Hub's CDN: {', '.join(o.cdn_suffixes)})", url)
                        hops += 1
                        if hops > MAX_REDIRECTS:
                            raise self._fail(f"more than {MAX_REDIRECTS} redirects", url)
                        url = target
                        continue
                    break
            except httpx2.TimeoutException:
                err: Exception = self._fail(f"timed out after {o.timeout_s:g} s ({attempt} attempt"
                                            f"{'s' if attempt > 1 else ''})", url)
                wait = None
            except (httpx2.NetworkError, httpx2.RemoteProtocolError) as e:
                err = self._fail(f"connection failed: {type(e).__name__}: {str(e)[:_BODY_QUOTE]} ({attempt} "
                                 f"attempt{'s' if attempt > 1 else ''})", url)
                wait = None
            except httpx2.HTTPError as e:  # invalid URL, unsupported protocol, ...
                raise self._fail(f"request failed: {type(e).__name__}: {str(e)[:_BODY_QUOTE]}", url) from None
            else:
                if resp.status_code not in RETRY_STATUS or attempt > o.retries:
                    self.url = url  # later reads go straight to where the bytes are
                    try:
                        yield resp
                    finally:
                        resp.close()
                    return
                self.log.entries.append(("GET", display_url(url), resp.status_code, 0))
                err = self._status_error(resp, url, attempt)
                wait = _retry_after(resp.headers.get("retry-after"))
                resp.close()
            if attempt > o.retries:
                raise err
            time.sleep(min(8.0, o.backoff_s * 2 ** (attempt - 1)) if wait is None else min(wait, MAX_RETRY_AFTER_S))

    def _pause(self, attempt: int) -> None:
        time.sleep(min(8.0, self.options.backoff_s * 2 ** attempt))

    def _status_error(self, resp: Any, url: str, attempt: int | None = None) -> RemoteFileError:
        hint = ""
        if resp.status_code in (401, 403) and (urlsplit(url).hostname or "").lower() in self._hub_hosts:
            hint = "; a gated or private repo needs HF_TOKEN" if not self._token else "; HF_TOKEN was sent"
        tries = f" after {attempt} attempts" if attempt and attempt > 1 else ""
        return self._fail(f"HTTP {resp.status_code} {resp.reason_phrase}{tries}{hint}", url)

    def _read_body(self, resp: Any, limit: int) -> bytes:
        """The body, at most ``limit`` bytes (a body longer than asked is an error, not a download)."""
        out = bytearray()
        try:
            for chunk in resp.iter_raw():
                out += chunk
                if len(out) > limit:
                    raise self._fail("the server sent more bytes than the range asked for", self.url,
                                     expected=f"{limit} bytes", actual=f"more than {limit}")
        finally:
            self.log.entries.append(("GET", display_url(self.url), resp.status_code, len(out)))
        return bytes(out)

    # -- the first request
    def start(self) -> bytes:
        """First range request ``[0, first_bytes)``: learns the size and whether ranges work.

        Returns the bytes read. With ``allow_full_download`` and a server without range requests the
        whole file is streamed to a temporary file, whose path is then :attr:`full_copy`.

        Raises:
            RemoteFileError: HTTP error, no range support (without ``allow_full_download``), no size.
        """
        self.full_copy: str | None = None
        n = self.options.first_bytes
        for attempt in range(self.options.retries + 1):
            with self._get(f"bytes=0-{n - 1}") as resp:
                if resp.status_code == 200:
                    if not self.options.allow_full_download:
                        self.log.entries.append(("GET", display_url(self.url), 200, 0))
                        length = resp.headers.get("content-length")
                        raise self._fail(
                            "the server does not support range requests (HTTP 200 to a Range request); "
                            "refusing to download the whole file" + (f" of {int(length):,} bytes" if
                                                                     length and length.isdigit() else "")
                            + " (--allow-full-download permits it)", self.url)
                    self.full_copy = self._download(resp)
                    return b""
                if resp.status_code == 416:
                    self.log.entries.append(("GET", display_url(self.url), 416, 0))
                    m = _CONTENT_RANGE.match(resp.headers.get("content-range", ""))
                    if m and m.group(3) == "0":
                        self.size = 0
                        return b""
                    raise self._status_error(resp, self.url)
                if resp.status_code != 206:
                    self.log.entries.append(("GET", display_url(self.url), resp.status_code, 0))
                    raise self._status_error(resp, self.url)
                first, last, total = self._content_range(resp, 0)
                try:
                    body = self._read_body(resp, last - first + 1)
                except RemoteFileError:
                    raise
                except Exception as e:  # noqa: BLE001 - a body cut short: retried below
                    if attempt >= self.options.retries:
                        raise self._fail(f"response cut short ({type(e).__name__}: {str(e)[:_BODY_QUOTE]})",
                                         self.url) from None
                    self._pause(attempt)
                    continue
                if len(body) != last - first + 1:
                    if attempt >= self.options.retries:
                        raise self._fail("truncated response", self.url, expected=f"{last - first + 1} bytes",
                                         actual=f"{len(body)} bytes")
                    self._pause(attempt)
                    continue
                self.size = total
                return body
        raise AssertionError("unreachable")  # pragma: no cover

    def _content_range(self, resp: Any, offset: int) -> tuple[int, int, int]:
        cr = resp.headers.get("content-range", "")
        m = _CONTENT_RANGE.match(cr)
        if not m or m.group(1) is None or m.group(3) == "*":
            raise self._fail("a 206 answer without a usable Content-Range (the file size is needed)", self.url,
                             expected="bytes FIRST-LAST/SIZE", actual=cr or "none")
        first, last, total = int(m.group(1)), int(m.group(2)), int(m.group(3))
        if first != offset or last < first or last >= total:
            raise self._fail("the server answered another range than asked", self.url,
                             expected=f"bytes {offset}-…", actual=cr)
        if self.size is not None and total != self.size:
            raise self._fail("the file changed size between requests", self.url, expected=self.size, actual=total)
        return first, last, total

    def _download(self, resp: Any) -> str:
        """Stream a 200 body to a temporary file (``allow_full_download``); return its path."""
        fd, path = tempfile.mkstemp(prefix="mtpscope-", suffix=".gguf", dir=self.options.download_dir)
        n = 0
        try:
            with os.fdopen(fd, "wb") as fh:
                for chunk in resp.iter_raw():
                    fh.write(chunk)
                    n += len(chunk)
            length = resp.headers.get("content-length")
            if length and length.isdigit() and int(length) != n:
                raise self._fail("truncated download", self.url, expected=f"{int(length)} bytes", actual=f"{n} bytes")
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        finally:
            self.log.entries.append(("GET", display_url(self.url), 200, n))
        self.size = n
        return path

    # -- ByteReader
    def read(self, offset: int, n: int) -> bytes:
        """Exactly ``n`` bytes at ``offset`` (fewer only past the end of the file), one range request.

        Raises:
            RemoteFileError: ``n`` over ``max_read_bytes``, an HTTP error, a truncated answer.
        """
        if n <= 0:
            return b""
        if self.size is not None:
            n = min(n, self.size - offset)
            if n <= 0:
                return b""
        if n > self.options.max_read_bytes:
            raise self._fail("one read would exceed the cap", self.url,
                             expected=f"<= {self.options.max_read_bytes} bytes (max_read_bytes)",
                             actual=f"{n} bytes at offset {offset}")
        for attempt in range(self.options.retries + 1):
            with self._get(f"bytes={offset}-{offset + n - 1}") as resp:
                if resp.status_code != 206:
                    self.log.entries.append(("GET", display_url(self.url), resp.status_code, 0))
                    if resp.status_code == 200:
                        raise self._fail("the server stopped honouring range requests (HTTP 200)", self.url)
                    raise self._status_error(resp, self.url)
                first, last, _ = self._content_range(resp, offset)
                try:
                    body = self._read_body(resp, last - first + 1)
                except RemoteFileError:
                    raise
                except Exception as e:  # noqa: BLE001 - a body cut short: retried
                    if attempt >= self.options.retries:
                        raise self._fail(f"response cut short ({type(e).__name__}: {str(e)[:_BODY_QUOTE]})",
                                         self.url) from None
                    self._pause(attempt)
                    continue
                if len(body) == n:
                    return body
                if attempt >= self.options.retries:
                    raise self._fail("truncated response", self.url, expected=f"{n} bytes at offset {offset}",
                                     actual=f"{len(body)} bytes")
                self._pause(attempt)
        raise AssertionError("unreachable")  # pragma: no cover


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta seconds or an HTTP date), else None."""
    if not value:
        return None
    v = value.strip()
    if v.isdigit():
        return float(v)
    try:
        when = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


# -------------------------------------------------------------------------------- the header read strategy


def _hinted_end(e: NeedMoreBytes, buf: bytes | bytearray, hints: Sequence[GGUFFile]) -> int | None:
    """Where the header ends if its metadata goes on as in a known file (see :func:`open_gguf_reader`).

    A hint applies when it has the key being read, with an array of the same length if one is being
    walked, the same values for the scalar keys of that key's group read so far (``tokenizer.ggml.model``
    for ``tokenizer.ggml.tokens``), and byte-identical bytes for the part of the pair already read (at
    least 4 KiB of it). The prediction is this pair's offset + the rest of the known file's metadata
    section from the same key on + the estimated tensor-info table.
    """
    from mtpscope.inspector.gguf import ArrayValue

    if e.key is None or e.key_offset < 0:
        return None
    group = e.key.rsplit(".", 1)[0] + "."
    n = min(len(buf) - e.key_offset, 1 << 20)
    if n < 4096:
        return None
    for h in hints:
        kv = h.kv.get(e.key)
        if kv is None:
            continue
        if e.array_length is not None and not (isinstance(kv.value, ArrayValue) and kv.value.length == e.array_length):
            continue
        same = all(h.kv[k].value == p.value for k, p in e.pairs.items()
                   if k.startswith(group) and k in h.kv and not isinstance(p.value, ArrayValue))
        if not same or h.header_bytes(kv.offset, n) != bytes(buf[e.key_offset:e.key_offset + n]):
            continue
        kv_end = h.tensors[0].info_offset if h.tensors else h.header_end
        return e.key_offset + (kv_end - kv.offset) + e.tensors_estimate
    return None


def open_gguf_reader(name: str, reader: ByteReader, size: int, *, first: bytes = b"",
                     first_bytes: int = FIRST_READ_BYTES, max_header_bytes: int | None = None,
                     layout_hints: Sequence[GGUFFile] = ()) -> GGUFFile:
    """Open a GGUF whose bytes come from ``reader`` (e.g. HTTP range requests): read only the header.

    The walk is :func:`mtpscope.inspector.gguf.parse_header` (the same checks and records as
    ``open_gguf``) on the bytes read so far; when they end before the header does, it says where it must
    and probably will end (:class:`~mtpscope.inspector.gguf.NeedMoreBytes`). Each further read goes from
    the end of the bytes present to that estimate plus :data:`READ_AHEAD_BYTES` and an eighth of the
    estimated part (at most :data:`READ_AHEAD_MAX`), so a header is read in a few requests and little
    past its end. Tensor data is read later, only for the rows ``GGUFFile.tensor_data`` is asked for.

    Args:
        name: what errors and ``.path`` call the file (a URL).
        reader: the byte source.
        size: the file's size in bytes.
        first: bytes ``[0, len(first))`` already read (e.g. with the request that learned ``size``).
        first_bytes: size of the first read when ``first`` is empty.
        max_header_bytes: refuse a header that needs more bytes than this (None: no cap).
        layout_hints: local GGUF files whose metadata the remote one may repeat. Every Gemma 4 GGUF
            carries the same 15.8 MB tokenizer (the token list, scores, types and 514906 merges); string
            arrays can only be sized by walking them, so without a hint each array met is one more read
            (5 for such a header), with the cached tokenizer GGUF as a hint 2 (see :func:`_hinted_end`).
            A hint only sizes the reads; what is parsed is always the remote bytes.

    Returns:
        A ``GGUFFile`` whose metadata and tensor-info records are in memory.

    Raises:
        GGUFFormatError / UnsupportedFileError / TensorDataError: as ``open_gguf``.
        GGUFFormatError: the header needs more than ``max_header_bytes`` bytes.
        InspectorError: whatever ``reader.read`` raises.
    """
    from mtpscope.inspector.gguf import NeedMoreBytes, parse_header

    hints = tuple(layout_hints)
    buf = bytearray(first)
    if not buf and size:
        want = min(size, first_bytes if max_header_bytes is None else min(first_bytes, max_header_bytes))
        buf += reader.read(0, want)
    while True:
        try:
            return parse_header(name, bytes(buf), size, reader)
        except NeedMoreBytes as e:
            have = len(buf)
            if max_header_bytes is not None and e.needed_end > max_header_bytes:
                raise GGUFFormatError("the header is larger than the cap", path=name, offset=have,
                                      expected=f"<= {max_header_bytes} bytes",
                                      actual=f"at least {e.needed_end} bytes") from None
            est = e.estimated_end
            if hints:
                est = max(e.needed_end, _hinted_end(e, buf, hints) or est)
            margin = READ_AHEAD_BYTES + min(READ_AHEAD_MAX, (est - e.needed_end) // 8)
            end = min(size, est + margin)
            if max_header_bytes is not None:
                end = min(end, max_header_bytes)
            end = max(end, e.needed_end)
            buf += reader.read(have, end - have)
            if len(buf) < end:
                raise GGUFFormatError("the source returned fewer bytes than asked", path=name, offset=len(buf),
                                      expected=f"{end - have} bytes from offset {have}",
                                      actual=f"{len(buf) - have} bytes") from None


# ----------------------------------------------------------------------------------------- opening


_HINTS: dict[tuple[str, float, int], GGUFFile] = {}


def _hints(paths: Sequence[str]) -> list[GGUFFile]:
    """The layout hints that open (a missing or unreadable one is skipped: hints only size reads);
    each is parsed once per process while it is unchanged on disk."""
    from mtpscope.inspector.gguf import open_gguf

    out = []
    for p in paths:
        try:
            st = os.stat(p)
            key = (os.fspath(p), st.st_mtime, st.st_size)
            if key not in _HINTS:
                _HINTS[key] = open_gguf(p)
            out.append(_HINTS[key])
        except (OSError, InspectorError):
            continue
    return out


def open_remote(spec: str, options: RemoteOptions | None = None) -> GGUFFile:
    """Open the GGUF at an ``https://`` / ``hf://`` location, header only; see :func:`open_remote_reader`
    (this returns only the file)."""
    return open_remote_reader(spec, options)[0]


def open_remote_reader(spec: str, options: RemoteOptions | None = None) -> tuple[GGUFFile, HTTPRangeReader]:
    """Open the GGUF at an ``https://`` / ``hf://`` location: header only (see the module docstring).

    Args:
        spec: the URL.
        options: :class:`RemoteOptions` (default: 30 s timeouts, 3 retries, 64 MiB header cap).

    Returns:
        (file, reader): an :class:`mtpscope.inspector.gguf.GGUFFile` whose ``path`` is the URL (no query string)
        and whose tensor rows are read by range requests on demand (``f.close()`` closes the
        connections), and its :class:`HTTPRangeReader` (``reader.log``: every request and its bytes).

    Raises:
        RemoteFileError: see :class:`HTTPRangeReader`.
        GGUFFormatError / UnsupportedFileError / TensorDataError: the bytes are not a valid GGUF.
    """
    from mtpscope.inspector.gguf import open_gguf

    o = options or RemoteOptions()
    loc = resolve(spec)
    reader = HTTPRangeReader(loc, o)
    try:
        first = reader.start()
        if reader.full_copy is not None:
            try:
                f = open_gguf(reader.full_copy, name=loc.display)
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(reader.full_copy)  # the map keeps the bytes; nothing is left on disk
            reader.close()
            return f, reader
        assert reader.size is not None  # noqa: S101 - set by start()
        f = open_gguf_reader(loc.display, reader, reader.size, first=first, max_header_bytes=o.max_header_bytes,
                             layout_hints=_hints(o.layout_hints))
    except BaseException:
        reader.close()
        raise
    return f, reader


def request_totals(f: GGUFLike) -> tuple[int, int] | None:
    """(HTTP requests sent, bytes read) for a model read over HTTP, every shard together (each shard's
    :attr:`HTTPRangeReader.log`); None when no shard was read over HTTP."""
    logs = [s.reader.log for s in f.shards if isinstance(s.reader, HTTPRangeReader)]
    if not logs:
        return None
    return sum(x.n_requests for x in logs), sum(x.n_bytes for x in logs)

