"""A real HTTP server on 127.0.0.1 for the remote-reading tests and benchmark, and a sparse GGUF builder.

:class:`FileServer` serves files from disk with knobs chosen by the first path segment:

``/range/NAME``     range requests honoured (206 + Content-Range; 416 past the end)
``/norange/NAME``   Range ignored: 200 with the whole file
``/slow/NAME``      like ``range`` after sleeping ``slow_s`` before the answer
``/trunc/NAME``     206 with the full Content-Length but only half the body, then the connection closed
``/short/NAME``     206 whose Content-Range and body end halfway through the asked range
``/flaky/NAME``     the first request answers 503 (Retry-After: 0), later ones like ``range``
``/redirect/NAME``  302 to ``/range/NAME`` on the same origin
``/away/NAME``      302 to ``http://localhost:PORT/range/NAME`` (another host name for the same server)
``/loop/NAME``      302 to itself
``/missing/...``    404

Every request is logged (path, Range header, status, body bytes written, Authorization header) so tests
can count requests and bytes on the server's side. Requests are bounded by the tests themselves; the
server only listens on 127.0.0.1 and stops with :meth:`close`.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class Hit:
    path: str
    range: str | None
    status: int
    sent: int
    auth: str | None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _hit(self, status: int, sent: int) -> None:
        with self.server.lock:
            self.server.hits.append(Hit(self.path, self.headers.get("Range"), status, sent,
                                        self.headers.get("Authorization")))

    def _plain(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()
        self._hit(status, 0)

    def _write(self, fh: object, n: int) -> int:
        sent = 0
        try:
            while sent < n:
                chunk = fh.read(min(1 << 20, n - sent))  # type: ignore[attr-defined]  # fh: an open binary file
                if not chunk:
                    break
                self.wfile.write(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        return sent

    def do_GET(self) -> None:  # http.server's name
        with self.server.lock:
            self.server.active += 1
        try:
            self._get()
        finally:
            with self.server.lock:
                self.server.active -= 1

    def _get(self) -> None:
        parts = self.path.lstrip("/").split("/", 1)
        mode, name = (parts + [""])[:2]
        srv = self.server
        if mode == "redirect":
            return self._plain(302, {"Location": f"/range/{name}"})
        if mode == "away":
            return self._plain(302, {"Location": f"http://localhost:{srv.server_address[1]}/range/{name}"})
        if mode == "loop":
            return self._plain(302, {"Location": self.path})
        path = srv.files.get(name)
        if mode == "missing" or path is None:
            return self._plain(404)
        if mode == "flaky":
            with srv.lock:
                first = name not in srv.flaked
                srv.flaked.add(name)
            if first:
                return self._plain(503, {"Retry-After": "0"})
        if mode == "slow":
            time.sleep(srv.slow_s)
        size = os.path.getsize(path)
        rng = self.headers.get("Range")
        with open(path, "rb") as fh:
            if mode == "norange" or not rng:
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                self._hit(200, self._write(fh, size))
                return
            a, b = rng.split("=", 1)[1].split("-")
            first_b, last_b = int(a), min(int(b) if b else size - 1, size - 1)
            if first_b >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                self._hit(416, 0)
                return
            n = last_b - first_b + 1
            if mode == "short":
                n = max(1, n // 2)
                last_b = first_b + n - 1
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {first_b}-{last_b}/{size}")
            self.send_header("Content-Length", str(n))
            self.end_headers()
            fh.seek(first_b)
            if mode == "trunc":
                self._hit(206, self._write(fh, n // 2))
                self.close_connection = True
                return
            self._hit(206, self._write(fh, n))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, files: dict[str, Path], slow_s: float) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files = files
        self.slow_s = slow_s
        self.hits: list[Hit] = []
        self.flaked: set[str] = set()
        self.active = 0  # requests being answered
        self.lock = threading.Lock()


class FileServer:
    """Start a :class:`_Server` on a free port of 127.0.0.1 in a thread (a context manager)."""

    def __init__(self, files: dict[str, Path | str], slow_s: float = 3.0) -> None:
        self.srv = _Server({k: Path(v) for k, v in files.items()}, slow_s)
        self.port = self.srv.server_address[1]
        self.thread = threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self.thread.start()

    def url(self, mode: str, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}/{name}"

    def _settle(self, timeout_s: float = 3.0) -> None:
        """Wait up to ``timeout_s`` for answers still being written: a client can have read a whole
        response before the server thread logged it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.srv.lock:
                if not self.srv.active:
                    return
            time.sleep(0.01)

    @property
    def hits(self) -> list[Hit]:
        """Every request answered so far (after :meth:`_settle`)."""
        self._settle()
        with self.srv.lock:
            return list(self.srv.hits)

    def reset(self) -> None:
        """Forget the hits so far; first let the answers in flight log themselves, so that a request
        made before the reset is never counted after it."""
        self._settle()
        with self.srv.lock:
            self.srv.hits.clear()
            self.srv.flaked.clear()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()

    def __enter__(self) -> FileServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------------------------ sparse GGUF


def _gguf_string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def write_sparse_gguf(path: Path, *, n_layers: int = 40, kv_from: Path | None = None) -> tuple[int, int, int]:
    """A GGUF v3 of ``n_layers`` Q8_0 blocks (n_embd 4096, n_ff 16384, 262144 rows of token_embd) whose
    tensor data is a hole (``os.truncate``): a file of more than 10 GB that takes a few MB on disk.

    The metadata is ``general.architecture = "gemma4"`` and ``gemma4.block_count``, or, with
    ``kv_from``, every pair of that GGUF copied byte for byte (the real tokenizer GGUF: a 15.8 MB
    metadata section like every Gemma 4 file's). Written by hand with struct (the layout of
    ggml/docs/gguf.md), so it needs no writer and takes well under a second.

    Returns:
        (file size, header end, tensor count).
    """
    n_embd, n_ff, n_vocab, hd, n_head = 4096, 16384, 262144, 256, 16
    tensors: list[tuple[str, tuple[int, ...], int]] = []  # (name, ne, ggml type)
    Q8_0, F32 = 8, 0
    tensors.append(("token_embd.weight", (n_embd, n_vocab), Q8_0))
    tensors.append(("output_norm.weight", (n_embd,), F32))
    for il in range(n_layers):
        b = f"blk.{il}."
        for n in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            tensors.append((b + n + ".weight", (n_embd,), F32))
        tensors.append((b + "attn_q_norm.weight", (hd,), F32))
        tensors.append((b + "attn_k_norm.weight", (hd,), F32))
        tensors.append((b + "attn_q.weight", (n_embd, n_head * hd), Q8_0))
        tensors.append((b + "attn_k.weight", (n_embd, 4 * hd), Q8_0))
        tensors.append((b + "attn_v.weight", (n_embd, 4 * hd), Q8_0))
        tensors.append((b + "attn_output.weight", (n_head * hd, n_embd), Q8_0))
        tensors.append((b + "ffn_gate.weight", (n_embd, n_ff), Q8_0))
        tensors.append((b + "ffn_up.weight", (n_embd, n_ff), Q8_0))
        tensors.append((b + "ffn_down.weight", (n_ff, n_embd), Q8_0))
    if kv_from is not None:
        from mtpscope.inspector.gguf import open_gguf

        src = open_gguf(kv_from)
        kv_end = src.tensors[0].info_offset if src.tensors else src.header_end
        with open(kv_from, "rb") as fh:
            fh.seek(24)
            kv_bytes = fh.read(kv_end - 24)
        n_kv = len(src.kv)
    else:
        kv_bytes = (_gguf_string("general.architecture") + struct.pack("<I", 8) + _gguf_string("gemma4")
                    + _gguf_string("gemma4.block_count") + struct.pack("<I", 4) + struct.pack("<I", n_layers))
        n_kv = 2
    align = 32
    infos = bytearray()
    rel = 0
    for name, ne, t in tensors:
        n_el = 1
        for d in ne:
            n_el *= d
        nbytes = n_el // 32 * 34 if t == Q8_0 else n_el * 4
        infos += _gguf_string(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        infos += struct.pack("<IQ", t, rel)
        rel += -(-nbytes // align) * align
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), n_kv) + kv_bytes + bytes(infos)
    header_end = len(head)
    data_offset = -(-header_end // align) * align
    with open(path, "wb") as fh:
        fh.write(head + b"\0" * (data_offset - header_end))
    os.truncate(path, data_offset + rel)
    return data_offset + rel, header_end, len(tensors)
