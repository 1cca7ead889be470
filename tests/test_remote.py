"""Remote GGUF headers over HTTP range requests, against a real HTTP server on 127.0.0.1.

The server (tests/remote_server.py) serves the real Gemma 4 tokenizer GGUF and sparse GGUFs of more
than 10 GB (tensor data a hole); it logs every request and the body bytes it wrote, which is what the
request and byte counts below are checked against. The reference for every record is our local
memory-mapped reader on the same file (itself checked against gguf-py in test_gguf.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from mtpscope.errors import GGUFFormatError, RemoteFileError
from mtpscope.inspector.gguf import open_gguf
from mtpscope.inspector.remote import (
    RemoteOptions,
    display_url,
    open_remote_reader,
    parse_hf,
    redirect_allowed,
    request_totals,
    resolve,
)
from tests.remote_server import FileServer, write_sparse_gguf

MiB = 1 << 20
FAST = dict(retries=1, backoff_s=0.01, token="")


@pytest.fixture(scope="module")
def files(tmp_path_factory, vocab_gguf):
    d = tmp_path_factory.mktemp("remote")
    sparse = d / "sparse.gguf"
    size, header, n_t = write_sparse_gguf(sparse, n_layers=40)
    tok = d / "sparse-tok.gguf"
    size_tok, header_tok, _ = write_sparse_gguf(tok, n_layers=40, kv_from=vocab_gguf)
    assert size > 10 * 10**9 and size_tok > 10 * 10**9
    return {"vocab.gguf": vocab_gguf, "sparse.gguf": sparse, "sparse-tok.gguf": tok}


@pytest.fixture(scope="module")
def server(files):
    with FileServer(files, slow_s=1.5) as s:
        yield s


def _same(remote, local) -> None:
    assert remote.file_size == local.file_size and remote.data_offset == local.data_offset
    assert list(remote.kv) == list(local.kv)
    assert remote.tensors == local.tensors
    for k, kv in local.kv.items():
        a, b = kv.value, remote.kv[k].value
        if hasattr(a, "to_list"):
            assert b.length == a.length and b[: 3] == a[: 3] and b[-1] == a[-1]
        else:
            assert a == b


def test_sparse_inventory_in_one_request(server, files):
    """A > 10 GB file whose header is 31 kB: one request, the bytes of the first read only."""
    server.reset()
    f, r = open_remote_reader(server.url("range", "sparse.gguf"), RemoteOptions(**FAST))
    local = open_gguf(files["sparse.gguf"])
    _same(f, local)
    hits = server.hits
    assert len(hits) == 1 and hits[0].status == 206
    assert sum(h.sent for h in hits) <= local.header_end + MiB
    assert r.log.n_requests == 1 and r.log.n_bytes == hits[0].sent
    assert request_totals(f) == (1, hits[0].sent) and request_totals(local) is None
    assert f.path == server.url("range", "sparse.gguf")
    # the header bytes a remote file holds are the local file's
    assert f.header_bytes(0, local.header_end) == local.header_bytes(0, local.header_end)
    assert local.header_bytes(0, 4) == b"GGUF" and f.header_bytes(local.file_size, 8) == b""


def test_rows_read_by_range_only(server, files):
    """tensor_data on a remote file reads only the rows asked for, and equals the local read."""
    f, _ = open_remote_reader(server.url("range", "sparse.gguf"), RemoteOptions(**FAST))
    local = open_gguf(files["sparse.gguf"])
    t = local.tensor("token_embd.weight")  # Q8_0, numpy shape (262144, 4096): 4352 bytes a row
    server.reset()
    got = f.tensor_data("token_embd.weight", rows=slice(1000, 1003))
    assert np.array_equal(got, local.tensor_data("token_embd.weight", rows=slice(1000, 1003)))
    assert got.shape == (3, 4096)
    hits = server.hits
    assert len(hits) == 1 and hits[0].sent == 3 * 4096 // 32 * 34
    assert hits[0].range == f"bytes={t.offset + 1000 * 4352}-{t.offset + 1003 * 4352 - 1}"
    raw = f.tensor_data("token_embd.weight", rows=-1, dequantize=False)
    assert raw.shape == (4352,) and np.array_equal(raw, local.tensor_data("token_embd.weight", rows=-1,
                                                                             dequantize=False))
    norm = f.tensor_data("blk.3.attn_norm.weight")
    assert np.array_equal(norm, local.tensor_data("blk.3.attn_norm.weight"))


def test_tokenizer_gguf_remote_equals_local(server, vocab_gguf):
    vocab_path = vocab_gguf
    """The real tokenizer GGUF (header = whole file, 15.8 MB): every read is header, nothing twice.

    Without a hint each string array met costs one read (5); with the cached tokenizer as a layout
    hint the reads are sized from it (2)."""
    local = open_gguf(vocab_path)
    for hints, n_req in (((), 5), ((str(vocab_path),), 2)):
        server.reset()
        f, r = open_remote_reader(server.url("range", "vocab.gguf"), RemoteOptions(layout_hints=hints, **FAST))
        _same(f, local)
        assert f.get("tokenizer.ggml.tokens").to_list() == local.get("tokenizer.ggml.tokens").to_list()
        hits = server.hits
        assert len(hits) == n_req and all(h.status == 206 for h in hits)
        assert sum(h.sent for h in hits) == local.file_size  # no byte read twice
        ranges = [tuple(map(int, h.range.split("=")[1].split("-"))) for h in hits]
        assert all(b[0] == a[1] + 1 for a, b in zip(ranges, ranges[1:]))


def test_big_target_with_tokenizer_bounds(server, files, vocab_gguf):
    vocab_path = vocab_gguf
    """A > 10 GB gemma4 file with the 15.8 MB tokenizer metadata: 2 requests and <= header + 1 MiB with
    the hint; without it one read per string array (5) and a bounded overshoot."""
    local = open_gguf(files["sparse-tok.gguf"])
    server.reset()
    f, _ = open_remote_reader(server.url("range", "sparse-tok.gguf"),
                              RemoteOptions(layout_hints=(str(vocab_path),), **FAST))
    _same(f, local)
    hits = server.hits
    assert len(hits) <= 3 and sum(h.sent for h in hits) <= local.header_end + MiB
    server.reset()
    f, _ = open_remote_reader(server.url("range", "sparse-tok.gguf"), RemoteOptions(**FAST))
    _same(f, local)
    hits = server.hits
    assert len(hits) <= 6 and sum(h.sent for h in hits) <= local.header_end + 2 * MiB


def test_no_range_support_refused_then_allowed(server, files, vocab_gguf, tmp_path):
    vocab_path = vocab_gguf
    server.reset()
    with pytest.raises(RemoteFileError) as e:
        open_remote_reader(server.url("norange", "sparse.gguf"), RemoteOptions(**FAST))
    line = e.value.one_line()
    assert "does not support range requests" in line and "--allow-full-download" in line
    assert server.url("norange", "sparse.gguf") in line and "\n" not in line
    # the client dropped the connection: far less than the 11 GB body went out
    assert sum(h.sent for h in server.hits) < 256 * MiB
    f, r = open_remote_reader(server.url("norange", "vocab.gguf"),
                              RemoteOptions(allow_full_download=True, download_dir=str(tmp_path), **FAST))
    _same(f, open_gguf(vocab_path))
    assert r.log.n_bytes == vocab_path.stat().st_size
    assert list(tmp_path.iterdir()) == []  # the temporary copy is gone (the map keeps the bytes)


def test_slow_server_times_out(server):
    server.reset()
    with pytest.raises(RemoteFileError) as e:
        open_remote_reader(server.url("slow", "sparse.gguf"), RemoteOptions(timeout_s=0.3, **FAST))
    assert "timed out after 0.3 s (2 attempts)" in e.value.one_line()


def test_truncated_body_retried_then_error(server):
    server.reset()
    with pytest.raises(RemoteFileError) as e:
        open_remote_reader(server.url("trunc", "sparse.gguf"), RemoteOptions(**FAST))
    assert "cut short" in e.value.one_line()
    assert len([h for h in server.hits if h.path.startswith("/trunc/")]) == 2  # first try + 1 retry


def test_transient_503_is_retried(server, files):
    server.reset()
    f, r = open_remote_reader(server.url("flaky", "sparse.gguf"), RemoteOptions(**FAST))
    assert [h.status for h in server.hits] == [503, 206]
    assert f.tensors == open_gguf(files["sparse.gguf"]).tensors


def test_404_and_redirects(server, files):
    with pytest.raises(RemoteFileError, match=r"HTTP 404 Not Found"):
        open_remote_reader(server.url("missing", "x.gguf"), RemoteOptions(**FAST))
    server.reset()
    f, _ = open_remote_reader(server.url("redirect", "sparse.gguf"), RemoteOptions(**FAST))
    assert [h.status for h in server.hits] == [302, 206]
    assert f.tensors == open_gguf(files["sparse.gguf"]).tensors
    with pytest.raises(RemoteFileError) as e:
        open_remote_reader(server.url("away", "sparse.gguf"), RemoteOptions(**FAST))
    assert f"redirect to http://localhost:{server.port}/range/sparse.gguf refused" in e.value.one_line()
    with pytest.raises(RemoteFileError, match="more than 8 redirects"):
        open_remote_reader(server.url("loop", "sparse.gguf"), RemoteOptions(**FAST))


def test_token_only_to_hub_hosts_never_printed(server, files):
    """The token goes to a Hub host, not to the CDN a redirect leads to, and never into a message."""
    opts = RemoteOptions(retries=0, token="hf_SECRET", hub_hosts=("127.0.0.1",), cdn_suffixes=("localhost",),
                         cdn_require_https=False)
    server.reset()
    f, _ = open_remote_reader(server.url("away", "sparse.gguf"), opts)
    hits = server.hits
    assert [h.status for h in hits] == [302, 206]
    assert hits[0].auth == "Bearer hf_SECRET" and hits[1].auth is None
    with pytest.raises(RemoteFileError) as e:
        open_remote_reader(server.url("missing", "x.gguf") + "?sig=abc", opts)
    assert "hf_SECRET" not in e.value.one_line() and "sig=abc" not in e.value.one_line()


def test_header_cap(server):
    with pytest.raises(GGUFFormatError) as e:
        open_remote_reader(server.url("range", "vocab.gguf"), RemoteOptions(max_header_bytes=MiB, **FAST))
    assert "header is larger than the cap" in e.value.one_line() and f"<= {MiB} bytes" in e.value.one_line()


def test_read_cap(server):
    f, _ = open_remote_reader(server.url("range", "sparse.gguf"), RemoteOptions(max_read_bytes=MiB, **FAST))
    with pytest.raises(RemoteFileError, match="one read would exceed the cap"):
        f.tensor_data("token_embd.weight")


# --------------------------------------------------------------------------------------- pure parts


def test_hf_locations():
    ep = "https://huggingface.co"
    assert parse_hf("hf://google/gemma-4-E2B-it/model.gguf", ep).url == \
        "https://huggingface.co/google/gemma-4-E2B-it/resolve/main/model.gguf"
    loc = parse_hf("hf://org/repo/v1.0/model-Q8_0.gguf", ep)
    assert loc.url == "https://huggingface.co/org/repo/resolve/v1.0/model-Q8_0.gguf" and loc.revision == "v1.0"
    loc = parse_hf("hf://org/repo@main/sub/dir/m.gguf", ep)
    assert loc.url == "https://huggingface.co/org/repo/resolve/main/sub/dir/m.gguf"
    assert loc.repo_id == "org/repo" and loc.filename == "sub/dir/m.gguf"
    assert parse_hf("hf://org/repo/m.gguf", "https://mirror.example").url.startswith("https://mirror.example/")
    # a '.' or '..' segment would be resolved away by the URL (hf://org/repo/../m.gguf: https://HUB/org/repo/m.gguf)
    for bad in ("hf://org/m.gguf", "hf://org//m.gguf", "hf://org/repo@/m.gguf", "hf://org/repo/../m.gguf",
                "hf://org/repo@../m.gguf", "hf://org/repo@main/sub/../m.gguf", "hf://../repo/m.gguf",
                "hf://org/./m.gguf"):
        with pytest.raises(RemoteFileError):
            parse_hf(bad, ep)
    with pytest.raises(RemoteFileError, match="not an http"):
        resolve("ftp://host/x.gguf")
    assert resolve("https://huggingface.co/a/b/resolve/main/x.gguf").repo_id == "a/b"


def test_redirect_rules():
    src = "https://huggingface.co/a/b/resolve/main/x.gguf"
    assert redirect_allowed(src, "https://huggingface.co/other")
    assert redirect_allowed(src, "https://cdn-lfs.hf.co/repos/x?sig=1")
    assert redirect_allowed(src, "https://cas-bridge.xethub.hf.co/x")
    assert redirect_allowed(src, "https://cdn-lfs-us-1.huggingface.co/x")
    assert not redirect_allowed(src, "https://evilhf.co/x")
    assert not redirect_allowed(src, "https://hf.co.evil.example/x")
    assert not redirect_allowed(src, "http://cdn-lfs.hf.co/x")  # no downgrade
    assert not redirect_allowed("https://example.org/x.gguf", "https://example.net/x.gguf")
    assert redirect_allowed("http://127.0.0.1:8000/a", "http://127.0.0.1:8000/b")
    assert not redirect_allowed("http://127.0.0.1:8000/a", "http://127.0.0.1:8001/b")


def test_display_url_drops_secrets():
    assert display_url("https://user:pw@cdn-lfs.hf.co:443/x.gguf?X-Amz-Signature=s#f") == \
        "https://cdn-lfs.hf.co:443/x.gguf"
    # a URL that does not parse is cut the same way by its text; port 0 is shown
    assert display_url("https://user:pw@[::1/x.gguf?sig=s") == "https://[::1/x.gguf"
    assert display_url("https://a:b@:99999/x.gguf#f") == "https://:99999/x.gguf"
    assert display_url("http://localhost:0/x.gguf") == "http://localhost:0/x.gguf"


@pytest.mark.parametrize("url, words", [
    ("https://256.0.0.1/x.gguf", "https://256.0.0.1/x.gguf: unparsable URL (Invalid IPv4 address: '256.0.0.1')"),
    ("https://a:b@:99999/x.gguf", "https://:99999/x.gguf: unparsable URL (Port out of range 0-65535)"),
    ("https://[::1/x.gguf", "https://[::1/x.gguf: unparsable URL (Invalid IPv6 URL)"),
    ("ftp://host/x.gguf", "ftp://host/x.gguf: unsupported URL scheme (expected http://, https:// or hf://, got ftp://)"),
])
def test_cli_refuses_a_url_it_cannot_read_in_one_line(url, words):
    """A URL whose host or port does not parse (where httpx or urllib would raise inside the CLI: an internal
    error, exit 3, before), or of a scheme mtpscope does not read (looked for as a local file before): one line,
    exit 2."""
    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    res = CliRunner().invoke(app, ["inspect", url])
    assert res.exit_code == 2 and res.output.strip() == f"mtpscope: {words}", res.output


# ------------------------------------------------------------------------------------------ the CLI


def test_cli_accepts_urls(server, files, demo_dir, vocab_gguf):
    """inspect / verify / diff take a URL wherever they take a path; errors are one line, exit 2."""
    import json

    from typer.testing import CliRunner

    from mtpscope.cli.main import app

    runner = CliRunner()
    with FileServer({"d.gguf": demo_dir.drafter_upstream, "t.gguf": demo_dir.target}) as s:
        r = runner.invoke(app, ["inspect", s.url("range", "d.gguf"), "--json"])
        assert r.exit_code == 0, r.output
        remote = json.loads(r.stdout)
        local = json.loads(runner.invoke(app, ["inspect", str(demo_dir.drafter_upstream), "--json"]).stdout)
        assert remote["tensors"] == local["tensors"] and remote["metadata"] == local["metadata"]
        assert remote["path"] == s.url("range", "d.gguf") and remote["remote"]["requests"] == len(s.hits)
        r = runner.invoke(app, ["verify", s.url("range", "d.gguf"), "--target", s.url("range", "t.gguf"), "--json"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["ok"] is True
        r = runner.invoke(app, ["diff", s.url("range", "d.gguf"), str(demo_dir.drafter_upstream)])
        assert r.exit_code == 0 and "identical" in r.stdout
        r = runner.invoke(app, ["inspect", s.url("norange", "d.gguf")])
        assert r.exit_code == 2 and "--allow-full-download" in r.output and len(r.output.strip().splitlines()) == 1
        r = runner.invoke(app, ["inspect", s.url("norange", "d.gguf"), "--allow-full-download", "--json"])
        assert r.exit_code == 0 and json.loads(r.stdout)["tensors"] == local["tensors"]
        r = runner.invoke(app, ["verify", s.url("missing", "x.gguf")])
        assert r.exit_code == 2 and "HTTP 404" in r.output
        r = runner.invoke(app, ["estimate", "--target", s.url("range", "t.gguf"), "--assistant",
                                s.url("range", "d.gguf"), "--json"])
        assert r.exit_code == 0 and json.loads(r.stdout)["drafter"]["kv"] == 0
