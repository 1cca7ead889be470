"""app/safety.py: allowed roots, path checks, uploads (pure, no Streamlit)."""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from pathlib import Path

import pytest

from mtpscope.app import safety
from mtpscope.errors import InspectorError, PathNotAllowedError, ServeRefusedError, TraceError


def test_default_roots_are_cwd_demo_and_uploads(tmp_path: Path) -> None:
    cwd, demo, up = tmp_path / "work", tmp_path / "cache" / "demo", tmp_path / "cache" / "uploads"
    cwd.mkdir()
    roots = safety.allowed_roots({}, cwd=cwd, demo=demo, uploads=up)
    assert roots == (cwd.resolve(), demo.resolve(), up.resolve())


def test_env_roots_add_to_defaults_and_resolve_relative(tmp_path: Path) -> None:
    """MTPSCOPE_ROOTS adds folders after the working directory and the demo (issue 14): setting it
    must not hide the demo and its vocabulary."""
    cwd = tmp_path / "work"
    (cwd / "a").mkdir(parents=True)
    env = {"MTPSCOPE_ROOTS": os.pathsep.join(["a", str(tmp_path / "b"), "", " a "])}
    roots = safety.allowed_roots(env, cwd=cwd, demo=tmp_path / "demo", uploads=tmp_path / "up")
    assert roots == (cwd.resolve(), (tmp_path / "demo").resolve(), (cwd / "a").resolve(),
                     (tmp_path / "b").resolve(), (tmp_path / "up").resolve())


@pytest.mark.parametrize("value, only", [("1", True), ("true", True), ("YES", True), ("on", True),
                                         ("2", True), ("0", False), ("false", False), ("No", False),
                                         ("off", False), ("", False), (" ", False)])
def test_roots_only_keeps_just_the_named_roots(tmp_path: Path, value: str, only: bool) -> None:
    env = {"MTPSCOPE_ROOTS": str(tmp_path / "b"), "MTPSCOPE_ROOTS_ONLY": value}
    roots = safety.allowed_roots(env, cwd=tmp_path / "work", demo=tmp_path / "demo", uploads=tmp_path / "up")
    named = ((tmp_path / "b").resolve(), (tmp_path / "up").resolve())
    assert roots == (named if only else ((tmp_path / "work").resolve(), (tmp_path / "demo").resolve(), *named))


def test_roots_only_without_roots_leaves_the_uploads_folder(tmp_path: Path) -> None:
    roots = safety.allowed_roots({"MTPSCOPE_ROOTS_ONLY": "1"}, cwd=tmp_path, demo=tmp_path / "demo",
                                 uploads=tmp_path / "up")
    assert roots == ((tmp_path / "up").resolve(),)
    with pytest.raises(PathNotAllowedError):
        safety.check_path(tmp_path / "x.gguf", roots, must_exist=False)


def test_check_path_inside_outside_and_traversal(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    f = root / "m.gguf"
    f.write_bytes(b"GGUF")
    (tmp_path / "secret.gguf").write_bytes(b"x")
    assert safety.check_path(f, [root]) == f.resolve()
    assert safety.check_path("m.gguf", [root], cwd=root) == f.resolve()
    with pytest.raises(PathNotAllowedError) as e:
        safety.check_path(root / ".." / "secret.gguf", [root])
    # the one-line message names the resolved path and what was allowed
    line = e.value.one_line()
    assert str((tmp_path / "secret.gguf").resolve()) in line and str(root.resolve()) in line
    assert "\n" not in line
    with pytest.raises(PathNotAllowedError):
        safety.check_path("/etc/passwd", [root])


def test_check_path_refuses_symlink_escape(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside.gguf"
    outside.write_bytes(b"x")
    link = root / "link.gguf"
    link.symlink_to(outside)
    with pytest.raises(PathNotAllowedError):
        safety.check_path(link, [root])


def test_check_path_missing_wrong_kind_and_empty(tmp_path: Path) -> None:
    with pytest.raises(InspectorError, match="no such file"):
        safety.check_path(tmp_path / "nope.gguf", [tmp_path])
    with pytest.raises(InspectorError, match="not a regular file"):
        safety.check_path(tmp_path, [tmp_path], kind="file")
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(InspectorError, match="not a folder"):
        safety.check_path(tmp_path / "f", [tmp_path], kind="dir")
    with pytest.raises(InspectorError, match="no path"):
        safety.check_path("  ", [tmp_path])
    # must_exist=False: only the root check
    assert safety.check_path(tmp_path / "later", [tmp_path], must_exist=False) == (tmp_path / "later").resolve()


def test_discover_finds_ggufs_and_trace_folders(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "x.gguf").write_bytes(b"")
    (tmp_path / "a" / "b" / "y.gguf").write_bytes(b"")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "z.gguf").write_bytes(b"")
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "manifest.json").write_text("{}")
    got = safety.discover([tmp_path], suffix=".gguf")
    assert got == sorted([(tmp_path / "a" / "x.gguf").resolve(), (tmp_path / "a" / "b" / "y.gguf").resolve()])
    assert safety.discover([tmp_path], marker="manifest.json") == [(tmp_path / "t").resolve()]
    assert len(safety.discover([tmp_path], suffix=".gguf", limit=1)) == 1
    assert safety.discover([tmp_path], suffix=".gguf", max_depth=1) == [(tmp_path / "a" / "x.gguf").resolve()]


def test_store_upload_by_hash_and_size_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = safety.store_upload(b"GGUF1234", "../../evil name.gguf", tmp_path)
    assert p.parent == tmp_path and p.read_bytes() == b"GGUF1234"
    assert p.name == hashlib.sha256(b"GGUF1234").hexdigest()[:16] + "-evil_name.gguf"
    assert safety.store_upload(b"GGUF1234", "other.gguf", tmp_path).read_bytes() == b"GGUF1234"
    monkeypatch.setattr(safety, "MAX_UPLOAD_BYTES", 4)
    with pytest.raises(InspectorError, match="too large"):
        safety.store_upload(b"12345", "big.gguf", tmp_path)


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def test_extract_trace_zip_safe_and_finds_manifest(tmp_path: Path) -> None:
    data = _zip({"mytrace/manifest.json": b"{}", "mytrace/rounds/part-00000.parquet": b"PAR1"})
    out = safety.extract_trace_zip(data, "t.zip", tmp_path)
    assert (out / "manifest.json").read_bytes() == b"{}"
    assert (out / "rounds" / "part-00000.parquet").read_bytes() == b"PAR1"
    assert out.resolve().is_relative_to(tmp_path.resolve())


@pytest.mark.parametrize("name", ["../evil/manifest.json", "/abs/manifest.json", "a/../../manifest.json"])
def test_extract_trace_zip_refuses_traversal(tmp_path: Path, name: str) -> None:
    with pytest.raises(TraceError, match="unsafe"):
        safety.extract_trace_zip(_zip({name: b"{}"}), "t.zip", tmp_path / "out")
    assert not (tmp_path / "evil").exists()


def test_extract_trace_zip_refuses_non_zip_and_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="not a zip"):
        safety.extract_trace_zip(b"not a zip", "t.zip", tmp_path)
    with pytest.raises(TraceError, match="no manifest"):
        safety.extract_trace_zip(_zip({"a.txt": b"x"}), "t.zip", tmp_path)


def test_uploads_folder_follows_mtpscope_uploads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MTPSCOPE_UPLOADS", str(tmp_path / "elsewhere"))
    assert safety.uploads_dir() == tmp_path / "elsewhere"
    assert safety.uploads_dir(tmp_path / "cache") == tmp_path / "cache" / "uploads"  # explicit root wins
    monkeypatch.delenv("MTPSCOPE_UPLOADS")
    monkeypatch.setenv("MTPSCOPE_CACHE", str(tmp_path / "c2"))
    assert safety.uploads_dir() == tmp_path / "c2" / "uploads"


def _deflated(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def _data_span(data: bytes, name: str) -> tuple[int, int]:
    """(offset, length) of ``name``'s compressed bytes, from its local header (PKZIP APPNOTE 4.3.7:
    30 fixed bytes, then the name and the extra field)."""
    import struct

    info = zipfile.ZipFile(io.BytesIO(data)).getinfo(name)
    n_name, n_extra = struct.unpack_from("<HH", data, info.header_offset + 26)
    return info.header_offset + 30 + n_name + n_extra, info.compress_size


def test_extract_trace_zip_corrupt_deflate_is_trace_error_and_leaves_nothing(tmp_path: Path) -> None:
    payload = bytes(range(256)) * 64
    data = bytearray(_deflated({"t/manifest.json": b"{}", "t/rounds/part-00000.parquet": payload}))
    off, n = _data_span(bytes(data), "t/rounds/part-00000.parquet")
    data[off:off + n] = b"\xff" * n  # BFINAL=1, BTYPE=11: a reserved block type (RFC 1951 3.2.3)
    import zlib

    with pytest.raises(zlib.error):  # the bytes really are bad deflate data
        zlib.decompressobj(-15).decompress(bytes(data[off:off + n]))
    out = tmp_path / "up"
    with pytest.raises(TraceError) as ei:
        safety.extract_trace_zip(bytes(data), "bad.zip", out)
    line = ei.value.one_line()
    assert "bad.zip" in line and "t/rounds/part-00000.parquet" in line and "zlib.error" in line
    assert list(out.iterdir()) == []  # the half-unpacked folder was removed


def test_extract_trace_zip_member_lying_about_its_size_is_trace_error(tmp_path: Path) -> None:
    import struct

    name = "t/rounds/part-00000.parquet"
    data = bytearray(_deflated({"t/manifest.json": b"{}", name: b"\0" * 100_000}))
    info = zipfile.ZipFile(io.BytesIO(bytes(data))).getinfo(name)
    # uncompressed size: offset 22 in the local header, 24 in the central directory entry (APPNOTE 4.3.7 / 4.3.12)
    struct.pack_into("<I", data, info.header_offset + 22, 10)
    cd = bytes(data).find(b"PK\x01\x02")
    while cd >= 0 and bytes(data[cd + 46:cd + 46 + len(name)]) != name.encode():
        cd = bytes(data).find(b"PK\x01\x02", cd + 4)
    assert cd >= 0
    struct.pack_into("<I", data, cd + 24, 10)
    assert zipfile.ZipFile(io.BytesIO(bytes(data))).getinfo(name).file_size == 10
    out = tmp_path / "up"
    with pytest.raises(TraceError) as ei:
        safety.extract_trace_zip(bytes(data), "liar.zip", out)
    line = ei.value.one_line()
    assert "liar.zip" in line and name in line and "CRC" in line
    assert list(out.iterdir()) == []
    # the same archive, repaired, unpacks (the first failure left nothing that would be reused)
    good = _deflated({"t/manifest.json": b"{}", name: b"\0" * 100_000})
    t = safety.extract_trace_zip(good, "liar.zip", out)
    assert (t / "rounds" / "part-00000.parquet").stat().st_size == 100_000


@pytest.mark.parametrize("entry", ["config.json", "model.safetensors", "model.safetensors.index.json"])
def test_check_hf_dir_refuses_fifo_checkpoint_files(tmp_path: Path, entry: str) -> None:
    ck = tmp_path / "ckpt"
    ck.mkdir()
    for name in ("config.json", "model.safetensors"):
        (ck / name).write_bytes(b"{}")
    assert safety.check_hf_dir(ck) == ck  # all regular: accepted
    (ck / entry).unlink(missing_ok=True)
    os.mkfifo(ck / entry)  # opening it for reading would block forever
    with pytest.raises(InspectorError) as ei:
        safety.check_hf_dir(ck)
    line = ei.value.one_line()
    assert entry in line and "not a regular file" in line and "FIFO" in line and "\n" not in line


def test_check_hf_dir_refuses_folder_named_like_a_shard_and_ignores_other_files(tmp_path: Path) -> None:
    ck = tmp_path / "ckpt"
    ck.mkdir()
    (ck / "config.json").write_text("{}")
    os.mkfifo(ck / "README.md")  # not a file the inspector opens: ignored
    assert safety.check_hf_dir(ck) == ck
    (ck / "model-00001-of-00002.safetensors").mkdir()
    with pytest.raises(InspectorError, match="not a regular file"):
        safety.check_hf_dir(ck)


# ----------------------------------------------------------------------------- serving (issue 17)

# Loopback per RFC 1122 3.2.1.3 (127.0.0.0/8) and RFC 4291 2.5.3 (::1); ::ffff:a.b.c.d is an IPv4
# address mapped into IPv6 (RFC 4291 2.5.5.2); "" makes Streamlit listen on every interface.
@pytest.mark.parametrize("address, loopback", [
    ("127.0.0.1", True), ("127.1.2.3", True), ("localhost", True), ("LOCALHOST", True), ("::1", True),
    ("[::1]", True), ("::ffff:127.0.0.1", True), ("0.0.0.0", False), ("::", False), ("", False),
    ("10.0.0.5", False), ("192.168.1.20", False), ("fe80::1", False), ("gpu-box.example.org", False),
    ("128.0.0.1", False)])
def test_is_loopback(address: str, loopback: bool) -> None:
    assert safety.is_loopback(address) is loopback


def test_serve_plan_loopback_needs_nothing_and_limits_hosts(tmp_path: Path) -> None:
    plan = safety.serve_plan("127.0.0.1", 8501, {}, cwd=tmp_path, demo=tmp_path / "demo", uploads=tmp_path / "up")
    assert plan.loopback and plan.env == () and plan.exposure_line() is None
    assert plan.roots == (tmp_path.resolve(), (tmp_path / "demo").resolve(), (tmp_path / "up").resolve())
    assert set(plan.allowed_hosts) == {"localhost", "127.0.0.1", "::1"}
    assert "127.0.0.2" in safety.serve_plan("127.0.0.2", 1, {}, cwd=tmp_path, demo=tmp_path,
                                            uploads=tmp_path).allowed_hosts


@pytest.mark.parametrize("env", [{}, {"MTPSCOPE_ROOTS": ""}, {"MTPSCOPE_ROOTS": os.pathsep + " "}])
@pytest.mark.parametrize("address", ["0.0.0.0", "::", "", "10.0.0.5"])
def test_serve_plan_refuses_network_address_without_roots(tmp_path: Path, env: dict, address: str) -> None:
    with pytest.raises(ServeRefusedError) as ei:
        safety.serve_plan(address, 8501, env, cwd=tmp_path, demo=tmp_path, uploads=tmp_path / "up")
    line = ei.value.one_line()
    assert "\n" not in line and "MTPSCOPE_ROOTS" in line and "--address" in line
    assert ("got unset" in line) == ("MTPSCOPE_ROOTS" not in env)


def test_serve_plan_network_address_exposes_only_the_named_roots(tmp_path: Path) -> None:
    named = tmp_path / "models"
    env = {"MTPSCOPE_ROOTS": str(named)}
    plan = safety.serve_plan("0.0.0.0", 9000, env, cwd=tmp_path / "home", demo=tmp_path / "demo",
                             uploads=tmp_path / "up")
    assert not plan.loopback and plan.env == (("MTPSCOPE_ROOTS_ONLY", "1"),)
    assert plan.roots == (named.resolve(), (tmp_path / "up").resolve())  # no working directory, no demo
    assert plan.allowed_hosts == ("*",)
    line = plan.exposure_line()
    assert line is not None and "\n" not in line
    assert "0.0.0.0:9000" in line and str(named.resolve()) in line and str((tmp_path / "up").resolve()) in line
    assert str((tmp_path / "home").resolve()) not in line
    # the server's environment really restricts the roots the app computes
    assert safety.allowed_roots({**env, **dict(plan.env)}, cwd=tmp_path / "home", demo=tmp_path / "demo",
                                uploads=tmp_path / "up") == plan.roots
    # an explicit MTPSCOPE_ROOTS_ONLY=0 keeps the defaults, and the line says so
    plan0 = safety.serve_plan("0.0.0.0", 9000, {**env, "MTPSCOPE_ROOTS_ONLY": "0"}, cwd=tmp_path / "home",
                              demo=tmp_path / "demo", uploads=tmp_path / "up")
    assert plan0.env == () and (tmp_path / "home").resolve() in plan0.roots
    assert str((tmp_path / "home").resolve()) in plan0.exposure_line()
    assert "every interface, port 9000" in safety.serve_plan("", 9000, env, cwd=tmp_path, demo=tmp_path,
                                                             uploads=tmp_path).exposure_line()


# ------------------------------------------------------------------------- uploads never overwrite

def test_store_upload_never_overwrites_another_file(tmp_path: Path) -> None:
    data = b"GGUF" + bytes(range(200))
    name = hashlib.sha256(data).hexdigest()[:16] + "-m.gguf"
    (tmp_path / name).write_bytes(b"someone else's bytes")  # same name, other content
    with pytest.raises(InspectorError) as ei:
        safety.store_upload(data, "m.gguf", tmp_path)
    assert "not overwritten" in ei.value.one_line() and name in ei.value.one_line()
    assert (tmp_path / name).read_bytes() == b"someone else's bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no temporary file left behind


def test_store_upload_refuses_a_link_under_its_name(tmp_path: Path) -> None:
    data = b"GGUF-linked"
    victim = tmp_path / "victim.txt"
    victim.write_bytes(data)  # even the same bytes: a link is never written through nor reused
    up = tmp_path / "up"
    up.mkdir()
    (up / (hashlib.sha256(data).hexdigest()[:16] + "-m.gguf")).symlink_to(victim)
    with pytest.raises(InspectorError, match="not overwritten"):
        safety.store_upload(data, "m.gguf", up)
    assert victim.read_bytes() == data


def test_store_upload_same_bytes_reused_other_bytes_side_by_side(tmp_path: Path) -> None:
    a = safety.store_upload(b"AAAA", "m.gguf", tmp_path)
    ino = a.stat().st_ino
    assert safety.store_upload(b"AAAA", "m.gguf", tmp_path) == a and a.stat().st_ino == ino  # reused
    b = safety.store_upload(b"BBBB", "m.gguf", tmp_path)
    assert b != a and a.read_bytes() == b"AAAA" and b.read_bytes() == b"BBBB"
    assert b.name == hashlib.sha256(b"BBBB").hexdigest()[:16] + "-m.gguf"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]


def test_extract_trace_zip_never_replaces_other_files(tmp_path: Path) -> None:
    data = _zip({"t/manifest.json": b"{}"})
    taken = tmp_path / f"trace-{hashlib.sha256(data).hexdigest()[:16]}"
    taken.mkdir()
    (taken / "notes.txt").write_bytes(b"keep me")  # a folder of that name that is not this upload
    with pytest.raises(TraceError, match="not overwritten"):
        safety.extract_trace_zip(data, "t.zip", tmp_path)
    assert (taken / "notes.txt").read_bytes() == b"keep me" and not (taken / "t").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [taken.name]
    (taken / "notes.txt").unlink()
    taken.rmdir()
    taken.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(TraceError, match="not overwritten"):
        safety.extract_trace_zip(data, "t.zip", tmp_path)
    assert not (tmp_path / "elsewhere").exists()


# ----------------------------------------------------------------- the app with MTPSCOPE_ROOTS (issue 14)

def test_app_with_roots_set_keeps_demo_and_its_vocabulary(demo_dir, tmp_path: Path, monkeypatch) -> None:
    """Setting MTPSCOPE_ROOTS keeps the demo preselected and its tokens readable (not ``#id``);
    MTPSCOPE_ROOTS_ONLY=1 hides it."""
    import re

    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    from mtpscope.app import selection

    if not (Path(demo_dir.traces_clean) / "manifest.json").exists():
        pytest.skip("demo traces not built (llama-cpp-python missing)")
    main = str(Path(__file__).resolve().parent.parent / "app" / "main.py")
    monkeypatch.setenv("MTPSCOPE_ROOTS", str(tmp_path))
    at = AppTest.from_file(main, default_timeout=120)
    at.run()
    at.switch_page("screens/step.py").run()
    assert not at.exception and not at.error, [e.value for e in (*at.exception, *at.error)]
    # the demo's default view: the trained pair's F32 trace when it is built (demo.json), else the clean one
    from mtpscope.demo.spec import TrainedPaths

    f32 = TrainedPaths.under(Path(demo_dir.root)).traces_f32
    want = f32 if (f32 / "manifest.json").exists() else Path(demo_dir.traces_clean)
    assert Path(at.session_state[selection.slot_key(selection.TRACE)]).resolve() == want.resolve()
    emitted = next(m.value for m in at.markdown if m.value.startswith("emitted: "))
    assert emitted != "emitted: —" and not re.search(r"#\d", emitted), emitted
    monkeypatch.setenv("MTPSCOPE_ROOTS_ONLY", "1")
    at = AppTest.from_file(main, default_timeout=120)
    at.run()
    assert at.session_state[selection.slot_key(selection.TRACE)] is None
    assert at.session_state[selection.slot_key(selection.DRAFTER)] is None


def test_upload_limit_is_the_servers() -> None:
    """MAX_UPLOAD_BYTES is the limit `mtpscope app` gives Streamlit (and the checkout's config.toml)."""
    import tomllib

    from mtpscope.cli.serve import SERVER_FLAGS

    flags = dict(zip(SERVER_FLAGS[::2], SERVER_FLAGS[1::2]))
    assert int(flags["--server.maxUploadSize"]) * 1024 * 1024 == safety.MAX_UPLOAD_BYTES
    cfg = Path(__file__).resolve().parent.parent / ".streamlit" / "config.toml"
    if cfg.exists():
        assert tomllib.loads(cfg.read_text())["server"]["maxUploadSize"] * 1024 * 1024 == safety.MAX_UPLOAD_BYTES
