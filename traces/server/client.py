"""Talking to a running llama-server over HTTP: ``/health``, ``/props``, ``/metrics``, ``/tokenize``,
``/apply-template`` and ``/completion``; and reading its Prometheus text.

Library: **httpx2** (the client :mod:`mtpscope.inspector.remote` already uses), one ``Client`` per server with
``follow_redirects=False``: a redirect is followed only when it stays on the same scheme, host and port (at most
:data:`MAX_REDIRECTS`); any other target is refused, naming it. Extra headers (``--header 'Authorization:
Bearer KEY'``) go to that one origin only; :func:`redact_headers` is what may be written anywhere (names
kept, values replaced), and no message of this module quotes a header value.

Every failure is one :class:`~mtpscope.errors.ServerError` line naming the URL (without its query) and the
request: connection refused, a timeout, a connection cut mid-answer, an HTTP error status (the server's own
``error.message`` quoted when it sends one), a body that is not the JSON asked for.

The llama-server facts used here (llama.cpp ``tools/server``, the version llama-cpp-python 0.3.36 vendors):

* ``/completion`` takes ``prompt`` as text or a list of token ids, ``n_predict``, ``temperature`` (``<= 0``:
  greedy), ``seed``, ``return_tokens`` (the generated ids come back as ``tokens``); its ``timings`` carry
  ``prompt_n``, ``prompt_ms``, ``predicted_n``, ``predicted_ms``, ``predicted_per_second`` and, when the slot
  drafted at least one token, ``draft_n`` / ``draft_n_accepted``.
* ``/metrics`` (only with ``--metrics``) is Prometheus text: counters
  ``llamacpp:spec_decode_num_draft_tokens_total`` (tokens drafted), ``…_num_accepted_tokens_total``
  (drafts accepted), ``…_num_drafts_total`` (verification steps, i.e. drafts sent to the target) and
  ``…_num_accepted_tokens_per_pos_total{position="i"}`` (accepted at 0-based draft position i; one series per
  position up to the server's draft n_max, present once a request has drafted). Counts are printed with
  C++'s default 6 significant digits, so they are exact below 1,000,000.
* ``/props``: ``build_info``, ``model_path``, ``total_slots``, ``default_generation_settings`` (``n_ctx``,
  ``params`` with ``speculative.types`` and the sampling defaults).

Imports: httpx2 (lazily), mtpscope.errors.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit, urlunsplit

from mtpscope.errors import ServerError

MAX_REDIRECTS = 3
#: characters of a response body quoted in an error line
_BODY_QUOTE = 160
METRIC_PREFIX = "llamacpp:"
DRAFT_TOKENS = "llamacpp:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "llamacpp:spec_decode_num_accepted_tokens_total"
DRAFTS = "llamacpp:spec_decode_num_drafts_total"
ACCEPTED_PER_POS = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
TOKENS_PREDICTED = "llamacpp:tokens_predicted_total"
PROMPT_TOKENS = "llamacpp:prompt_tokens_total"

_SAMPLE_RE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$")
_LABEL_RE = re.compile(r'\s*(?P<k>[A-Za-z_][A-Za-z0-9_]*)\s*=\s*"(?P<v>(?:[^"\\]|\\.)*)"\s*,?')


def clean_url(url: str) -> str:
    """``url`` without query and fragment (what messages and traces name)."""
    p = urlsplit(url)
    return urlunsplit((p.scheme, p.netloc.rsplit("@", 1)[-1], p.path, "", ""))


def check_base_url(url: str) -> str:
    """The server's base URL, normalised (``http(s)://host:port`` plus a path prefix, no trailing slash).

    Raises:
        ServerError: not ``http://`` / ``https://``, no host, or user info / query / fragment in it (a key goes
            in ``--header``, never into a URL that ends up in a trace).
    """
    u = url.strip()
    p = urlsplit(u)
    if p.scheme not in ("http", "https") or not p.hostname:
        raise ServerError("not a llama-server URL", key="url", expected="http://HOST:PORT or https://HOST:PORT",
                          actual=clean_url(u)[:120] or "empty")
    if p.username or p.password:
        raise ServerError("credentials in the URL are refused (pass --header 'Authorization: Bearer KEY')",
                          key="url", expected="no user:password@", actual=f"{p.scheme}://…@{p.hostname}")
    if p.query or p.fragment:
        raise ServerError("the server URL takes no query or fragment", key="url", expected="http://HOST:PORT[/PREFIX]",
                          actual=clean_url(u))
    try:
        _ = p.port      # parsing it raises ValueError on a bad port
    except ValueError:
        raise ServerError("bad port in the server URL", key="url", actual=u[:120]) from None
    return urlunsplit((p.scheme, p.netloc, p.path.rstrip("/"), "", ""))


def parse_header(text: str) -> tuple[str, str]:
    """``'Name: value'`` -> ``(name, value)``.

    Raises:
        ServerError: no colon, an empty or non-token name, or a line break in the value (names the header
            name only, never the value).
    """
    name, sep, value = text.partition(":")
    name = name.strip()
    if not sep or not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name):
        raise ServerError("a header is 'Name: value'", key="--header", expected="Name: value",
                          actual=(name[:40] or "no name") if sep else "no colon")
    if "\n" in value or "\r" in value:
        raise ServerError("a header value may not hold a line break", key=name)
    return name, value.strip()


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """What may be written into a trace or printed: each header name with its value replaced by ``"<redacted>"``."""
    return dict.fromkeys(headers, "<redacted>")


def parse_prometheus(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Prometheus text exposition -> ``{metric name: {sorted label pairs: value}}``.

    Comment lines (``# HELP`` / ``# TYPE``) and blank lines are skipped; a sample's optional timestamp is
    dropped. Values: floats, ``+Inf`` / ``-Inf`` / ``NaN`` included.

    Raises:
        ServerError: a line that is neither a comment nor a sample (``key`` names its 1-based line number).
    """
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for i, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if m is None:
            raise ServerError("not Prometheus text", key=f"/metrics line {i}", expected="name{labels} value",
                              actual=line[:80])
        labels: list[tuple[str, str]] = []
        if m["labels"]:
            rest = m["labels"]
            pos = 0
            while pos < len(rest):
                lm = _LABEL_RE.match(rest, pos)
                if lm is None or lm.end() == pos:
                    raise ServerError("bad Prometheus labels", key=f"/metrics line {i}", actual=line[:80])
                labels.append((lm["k"], lm["v"]))
                pos = lm.end()
        try:
            value = float(m["value"])
        except ValueError:
            raise ServerError("bad Prometheus value", key=f"/metrics line {i}", actual=m["value"][:40]) from None
        out.setdefault(m["name"], {})[tuple(sorted(labels))] = value
    return out


@dataclass(frozen=True)
class SpecCounters:
    """llama-server's speculative-decoding counters at one moment (``/metrics``), or their difference.

    Attributes:
        n_draft_tokens: ``spec_decode_num_draft_tokens_total``; None when the server does not export it.
        n_accepted: ``spec_decode_num_accepted_tokens_total``.
        n_drafts: ``spec_decode_num_drafts_total`` (verification steps).
        accepted_per_pos: ``spec_decode_num_accepted_tokens_per_pos_total`` by 0-based position (empty until
            a request has drafted).
        n_predicted: ``tokens_predicted_total``; n_prompt: ``prompt_tokens_total``.
    """

    n_draft_tokens: int | None
    n_accepted: int | None
    n_drafts: int | None
    accepted_per_pos: tuple[int, ...] = ()
    n_predicted: int | None = None
    n_prompt: int | None = None

    @property
    def present(self) -> bool:
        """True when the server exports the speculative counters at all."""
        return self.n_draft_tokens is not None

    def minus(self, before: SpecCounters) -> SpecCounters:
        """``self - before`` field by field (per position: missing positions count 0; None stays None)."""
        def d(a: int | None, b: int | None) -> int | None:
            return None if a is None or b is None else a - b
        n = max(len(self.accepted_per_pos), len(before.accepted_per_pos))
        pa = list(self.accepted_per_pos) + [0] * (n - len(self.accepted_per_pos))
        pb = list(before.accepted_per_pos) + [0] * (n - len(before.accepted_per_pos))
        return SpecCounters(d(self.n_draft_tokens, before.n_draft_tokens), d(self.n_accepted, before.n_accepted),
                            d(self.n_drafts, before.n_drafts), tuple(x - y for x, y in zip(pa, pb, strict=True)),
                            d(self.n_predicted, before.n_predicted), d(self.n_prompt, before.n_prompt))

    def to_dict(self) -> dict[str, Any]:
        return {"n_draft_tokens": self.n_draft_tokens, "n_accepted": self.n_accepted, "n_drafts": self.n_drafts,
                "accepted_per_pos": list(self.accepted_per_pos), "n_predicted": self.n_predicted,
                "n_prompt": self.n_prompt}


def spec_counters(metrics: Mapping[str, Mapping[tuple[tuple[str, str], ...], float]]) -> SpecCounters:
    """The :class:`SpecCounters` in parsed ``/metrics`` (:func:`parse_prometheus`).

    Raises:
        ServerError: a per-position series whose ``position`` label is not a non-negative integer, or a
            counter that is negative, fractional or not finite.
    """
    def one(name: str) -> int | None:
        series = metrics.get(name)
        if not series:
            return None
        return _count(name, sum(series.values()))

    per: dict[int, int] = {}
    for labels, v in (metrics.get(ACCEPTED_PER_POS) or {}).items():
        pos = dict(labels).get("position", "")
        if not pos.isdigit():
            raise ServerError("per-position counter without an integer position label", key=ACCEPTED_PER_POS,
                              expected='position="0", "1", …', actual=pos or "missing")
        per[int(pos)] = _count(ACCEPTED_PER_POS, v)
    vec = tuple(per.get(i, 0) for i in range(max(per) + 1)) if per else ()
    return SpecCounters(one(DRAFT_TOKENS), one(ACCEPTED_TOKENS), one(DRAFTS), vec, one(TOKENS_PREDICTED),
                        one(PROMPT_TOKENS))


def _count(name: str, v: float) -> int:
    if not math.isfinite(v) or v < 0 or v != int(v):
        raise ServerError("counter is not a non-negative integer", key=name, expected="0, 1, 2, …", actual=v)
    return int(v)


@dataclass
class ServerClient:
    """One llama-server at ``url`` (see the module docstring for the rules).

    Args:
        url: the base URL (:func:`check_base_url`).
        headers: extra request headers (an API key), sent to this origin only.
        timeout_s: connect / read timeout of one request, seconds (a completion may take long: the read
            timeout is the longest silence allowed, not the whole answer).
        transport: an httpx2 transport (tests only), else None.

    Use as a context manager or call :meth:`close`.
    """

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0
    transport: Any = None

    def __post_init__(self) -> None:
        import httpx2

        self.url = check_base_url(self.url)
        self._httpx = httpx2
        kw: dict[str, Any] = {"transport": self.transport} if self.transport is not None else {}
        self._client = httpx2.Client(timeout=httpx2.Timeout(self.timeout_s, connect=min(self.timeout_s, 10.0)),
                                     follow_redirects=False, headers=dict(self.headers), **kw)

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def _origin(self, url: str) -> tuple[str, str, int | None]:
        p = urlsplit(url)
        port = p.port or (443 if p.scheme == "https" else 80)
        return p.scheme, (p.hostname or "").lower(), port

    def request(self, method: str, path: str, *, body: Any = None, what: str | None = None) -> Any:
        """Send one request; the response (``httpx2.Response``) of status 2xx.

        Raises:
            ServerError: see the module docstring (``key`` is ``what``, default ``"METHOD /path"``).
        """
        what = what or f"{method} {path}"
        url = self.url + path
        origin = self._origin(url)
        hx = self._httpx
        for _ in range(MAX_REDIRECTS + 1):
            try:
                resp = self._client.request(method, url, json=body) if body is not None else \
                    self._client.request(method, url)
            except hx.ConnectError as e:
                raise ServerError(f"cannot connect: {_reason(e)} (is llama-server running there?)",
                                  path=clean_url(url), key=what) from None
            except hx.TimeoutException:
                raise ServerError(f"no answer within {self.timeout_s:g} s", path=clean_url(url), key=what) from None
            except (hx.RemoteProtocolError, hx.ReadError, hx.WriteError) as e:
                raise ServerError(f"the connection broke before the answer was complete ({_reason(e)}); "
                                  f"did the server die?", path=clean_url(url), key=what) from None
            except hx.HTTPError as e:
                raise ServerError(f"request failed: {_reason(e)}", path=clean_url(url), key=what) from None
            if resp.is_redirect:
                target = urljoin(url, resp.headers.get("location", ""))
                if self._origin(target) != origin:
                    raise ServerError("redirect to another origin refused", path=clean_url(url), key=what,
                                      expected=f"{origin[0]}://{origin[1]}:{origin[2]}", actual=clean_url(target))
                url = target
                continue
            if resp.status_code >= 400:
                raise ServerError(f"HTTP {resp.status_code}: {_error_text(resp)}", path=clean_url(url), key=what)
            return resp
        raise ServerError(f"more than {MAX_REDIRECTS} redirects", path=clean_url(url), key=what)

    def json(self, method: str, path: str, *, body: Any = None, what: str | None = None) -> dict[str, Any]:
        """:meth:`request`, the body parsed as a JSON object.

        Raises:
            ServerError: as :meth:`request`, or a body that is not a JSON object.
        """
        what = what or f"{method} {path}"
        resp = self.request(method, path, body=body, what=what)
        try:
            obj = resp.json()
        except (ValueError, UnicodeDecodeError):
            raise ServerError("the answer is not JSON", path=clean_url(self.url + path), key=what,
                              expected="a JSON object", actual=_quote(resp.text)) from None
        if not isinstance(obj, dict):
            raise ServerError("the answer is not a JSON object", path=clean_url(self.url + path), key=what,
                              expected="a JSON object", actual=type(obj).__name__)
        return obj

    # ------------------------------------------------------------------ endpoints
    def health(self) -> dict[str, Any]:
        """``GET /health`` (``{"status": "ok"}`` once the model is loaded; 503 while loading raises)."""
        return self.json("GET", "/health")

    def props(self) -> dict[str, Any]:
        """``GET /props``."""
        return self.json("GET", "/props")

    def metrics_text(self) -> str | None:
        """``GET /metrics`` as text, or None when the server answers 501 / 404 (started without ``--metrics``).

        Raises:
            ServerError: any other failure.
        """
        try:
            text: str = self.request("GET", "/metrics").text
            return text
        except ServerError as e:
            if e.message.startswith(("HTTP 501", "HTTP 404")):
                return None
            raise

    def counters(self) -> SpecCounters | None:
        """The speculative counters now (:func:`spec_counters`), or None without ``/metrics``."""
        text = self.metrics_text()
        return None if text is None else spec_counters(parse_prometheus(text))

    def tokenize(self, content: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """``POST /tokenize``: the server's own token ids for ``content`` (with BOS when ``add_special``, special
        tokens parsed as ``/completion`` does for a text prompt).

        Raises:
            ServerError: as :meth:`json`, or ``tokens`` missing / not a list of ids.
        """
        obj = self.json("POST", "/tokenize", body={"content": content, "add_special": add_special,
                                                   "parse_special": parse_special})
        toks = obj.get("tokens")
        if not isinstance(toks, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in toks):
            raise ServerError("the /tokenize answer lacks a list of token ids", path=self.url + "/tokenize",
                              key="tokens", expected="[int, …]", actual=_quote(json.dumps(toks)))
        return toks

    def apply_template(self, messages: Sequence[Mapping[str, str]]) -> str:
        """``POST /apply-template``: the chat rendered by the server's own template, with its generation prompt.

        Raises:
            ServerError: as :meth:`json`, or no ``prompt`` string in the answer.
        """
        obj = self.json("POST", "/apply-template", body={"messages": [dict(m) for m in messages]})
        text = obj.get("prompt")
        if not isinstance(text, str):
            raise ServerError("the /apply-template answer lacks 'prompt'", path=self.url + "/apply-template",
                              key="prompt", expected="a string", actual=type(text).__name__)
        return text

    def completion(self, body: Mapping[str, Any], *, what: str = "POST /completion") -> dict[str, Any]:
        """``POST /completion`` (not streamed).

        Raises:
            ServerError: as :meth:`json`.
        """
        return self.json("POST", "/completion", body=dict(body, stream=False), what=what)


def _reason(e: Exception) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:160]


def _quote(text: str) -> str:
    t = " ".join(text.split())
    return repr(t[:_BODY_QUOTE] + ("…" if len(t) > _BODY_QUOTE else ""))


def _error_text(resp: Any) -> str:
    """The server's ``error.message`` when the body is llama-server's error JSON, else the body quoted."""
    try:
        obj = resp.json()
        msg = obj.get("error", {}).get("message") if isinstance(obj, dict) else None
        if isinstance(msg, str) and msg:
            return msg[:_BODY_QUOTE]
    except (ValueError, AttributeError, UnicodeDecodeError):
        pass
    return _quote(resp.text) if resp.text else "empty body"


__all__ = ["ACCEPTED_PER_POS", "ACCEPTED_TOKENS", "DRAFTS", "DRAFT_TOKENS", "ServerClient", "SpecCounters",
           "check_base_url", "clean_url", "parse_header", "parse_prometheus", "redact_headers", "spec_counters"]
