"""app/safety.py: allowed roots, path checks, uploads (pure, no Streamlit)."""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from pathlib import Path

import pytest

from app import safety
from inspector.errors import InspectorError, PathNotAllowedError, TraceError


def test_default_roots_are_cwd_demo_and_uploads(tmp_path: Path) -> None:
    cwd, demo, up = tmp_path / "work", tmp_path / "cache" / "demo", tmp_path / "cache" / "uploads"
    cwd.mkdir()
    roots = safety.allowed_roots({}, cwd=cwd, demo=demo, uploads=up)
    assert roots == (cwd.resolve(), demo.resolve(), up.resolve())


def test_env_roots_replace_defaults_and_resolve_relative(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    env = {"MTPSCOPE_ROOTS": os.pathsep.join(["a", str(tmp_path / "b"), "", "a"])}
    roots = safety.allowed_roots(env, cwd=tmp_path, demo=tmp_path / "demo", uploads=tmp_path / "up")
    assert roots == ((tmp_path / "a").resolve(), (tmp_path / "b").resolve(), (tmp_path / "up").resolve())


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
