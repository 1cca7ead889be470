"""The app is safe by default when served (issue 17), checked on the real server.

- the server started like ``make run`` listens on loopback only (its listening sockets, read from
  /proc/net/tcp{,6});
- ``--address 0.0.0.0`` without ``MTPSCOPE_ROOTS`` refuses with one line and starts nothing;
- with ``MTPSCOPE_ROOTS`` the CLI says in one line what is exposed and hands Streamlit the settings;
- a symlink, a ``..`` path and an absolute path outside the roots are refused through the real server,
  typed into the Files page by real Chromium (Playwright), while the same file inside a root is shown.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.apphelpers import ROOT, free_port, start_app

pytest.importorskip("streamlit")

#: TCP state LISTEN in /proc/net/tcp (include/net/tcp_states.h: TCP_LISTEN = 10).
TCP_LISTEN = "0A"


def _make_run_argv(port: int, address: str | None = None) -> list[str]:
    """The command ``make run`` runs (read with ``make -n``), with this interpreter in place of
    ``.venv/bin/mtpscope`` (the console script runs ``mtpscope.cli.main:main``, as ``-m mtpscope.cli`` does)."""
    if shutil.which("make") is None:
        pytest.skip("make not installed")
    args = ["make", "-n", "-s", "-C", str(ROOT), "run", f"PORT={port}"]
    if address is not None:
        args.append(f"ADDRESS={address}")
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout
    lines = [ln for ln in out.splitlines() if re.search(r"/mtpscope app ", ln)]
    assert len(lines) == 1, out
    argv = shlex.split(lines[0])
    assert argv[0].endswith("/bin/mtpscope") and argv[1] == "app", argv
    return [sys.executable, "-m", "mtpscope.cli", *argv[1:]]


def _proc_net_address(hex_addr: str) -> str:
    """``/proc/net/tcp{,6}`` local address (the kernel prints each 32-bit word of the network-order
    address as a native-endian hex number) as text."""
    raw = bytes.fromhex(hex_addr)
    words = b"".join(struct.pack("=I", int.from_bytes(raw[i:i + 4], "big")) for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(words) == 4 else socket.AF_INET6, words)


def listening_sockets(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that process ``pid`` holds."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if m := re.fullmatch(r"socket:\[(\d+)\]", target):
            inodes.add(m.group(1))
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as f:
            next(f)  # header
            for line in f:
                cols = line.split()
                local, state, inode = cols[1], cols[3], cols[9]
                if state == TCP_LISTEN and inode in inodes:
                    addr, port = local.split(":")
                    found.add((_proc_net_address(addr), int(port, 16)))
    return found


def test_proc_net_parser_reads_a_known_socket() -> None:
    """The /proc reader itself, on sockets whose addresses we chose."""
    with socket.socket() as a:
        a.bind(("127.0.0.1", 0))
        a.listen()
        with socket.socket() as b:
            b.bind(("0.0.0.0", 0))
            b.listen()
            got = listening_sockets(os.getpid())
            assert ("127.0.0.1", a.getsockname()[1]) in got and ("0.0.0.0", b.getsockname()[1]) in got


@pytest.mark.slow
def test_make_run_listens_on_loopback_only(tmp_path: Path) -> None:
    cmd = _make_run_argv(0)
    assert cmd[cmd.index("--address") + 1] == "127.0.0.1", cmd
    with start_app(tmp_path / "server.log", cmd=_make_run_argv,
                   env={"MTPSCOPE_UPLOADS": str(tmp_path / "uploads")}) as url:
        port = int(url.rsplit(":", 1)[1])
        got = listening_sockets(url.proc.pid)
    assert got == {("127.0.0.1", port)}, got
    log = (tmp_path / "server.log").read_text()
    assert "serving on" not in log and "Traceback" not in log, log[-2000:]


def test_network_address_without_roots_refuses_with_one_line() -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MTPSCOPE_ROOTS")}
    r = subprocess.run(_make_run_argv(port, "0.0.0.0"), cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and r.stdout == "", (r.stdout, r.stderr)
    assert lines[0].startswith("mtpscope: ") and "MTPSCOPE_ROOTS" in lines[0] and "0.0.0.0" in lines[0]
    with socket.socket() as s:  # nothing was started on that port
        s.bind(("0.0.0.0", port))


def test_network_address_with_roots_says_what_is_exposed(tmp_path: Path, monkeypatch) -> None:
    """Through the CLI (typer's runner, with the final exec captured instead of run, so nothing is
    put on the network): one line names the folders; Streamlit gets the address, any Host, XSRF on,
    and MTPSCOPE_ROOTS_ONLY=1 in its environment."""
    from typer.testing import CliRunner

    from mtpscope.cli import main as cli
    from mtpscope.cli import serve as cli_app

    calls = []

    def fake_execve(path, argv, env):
        calls.append((path, list(argv), dict(env)))
        raise SystemExit(0)

    monkeypatch.setattr(cli_app.os, "execve", fake_execve)
    monkeypatch.setenv("MTPSCOPE_ROOTS", str(tmp_path / "models"))
    monkeypatch.delenv("MTPSCOPE_ROOTS_ONLY", raising=False)
    monkeypatch.setenv("MTPSCOPE_UPLOADS", str(tmp_path / "up"))
    r = CliRunner().invoke(cli.app, ["app", "--address", "0.0.0.0", "--port", "8599"])
    assert r.exit_code == 0, r.output
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "0.0.0.0:8599" in err[0], r.stderr
    assert str((tmp_path / "models").resolve()) in err[0] and str((tmp_path / "up").resolve()) in err[0]
    assert str(Path.cwd().resolve()) + " " not in err[0] + " "
    (_, argv, env), = calls
    flags = dict(zip(argv[5::2], argv[6::2]))  # after: python -m streamlit run main.py
    assert flags["--server.address"] == "0.0.0.0" and flags["--server.port"] == "8599"
    assert flags["--server.allowedHosts"] == "*" and flags["--server.enableXsrfProtection"] == "true"
    assert env["MTPSCOPE_ROOTS_ONLY"] == "1" and env["MTPSCOPE_ROOTS"] == str(tmp_path / "models")
    # on loopback: no line, only loopback Host names
    calls.clear()
    r = CliRunner().invoke(cli.app, ["app", "--port", "8599"])
    assert r.exit_code == 0 and r.stderr == "", r.output
    argv = calls[0][1]
    hosts = [argv[i + 1] for i, a in enumerate(argv) if a == "--server.allowedHosts"]
    assert argv[argv.index("--server.address") + 1] == "127.0.0.1"
    assert set(hosts) == {"localhost", "127.0.0.1", "::1"}
    assert "MTPSCOPE_ROOTS_ONLY" not in calls[0][2]


def test_streamlit_config_file_listens_on_loopback() -> None:
    import tomllib

    cfg = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())["server"]
    assert cfg["address"] == "127.0.0.1"
    assert cfg.get("enableXsrfProtection", True) is True and cfg.get("enableCORS", True) is True
    assert set(cfg["allowedHosts"]) == {"localhost", "127.0.0.1", "::1"}


# --------------------------------------------------------------------- refusals in the real browser

@pytest.mark.browser
@pytest.mark.slow
def test_paths_outside_the_roots_are_refused_in_the_browser(tmp_path: Path) -> None:
    from tests.browser import ARGS, CHROMIUM, need_browser, settle
    from tests.conftest import write_gguf_file

    sync_api = need_browser()
    root, secret_dir = tmp_path / "root", tmp_path / "secret"
    root.mkdir()
    secret_dir.mkdir()
    secret = write_gguf_file(secret_dir / "leak.gguf", "leakcheckarch")
    shutil.copy(secret, root / "inside.gguf")  # the same bytes inside the root: shown (control)
    (root / "link.gguf").symlink_to(secret)
    refused = {"symlink": (str(root / "link.gguf"), secret.resolve()),
               "dotdot": (f"{root}/../secret/leak.gguf", secret.resolve()),
               "absolute": (str(secret), secret.resolve())}
    env = {"MTPSCOPE_ROOTS": str(root), "MTPSCOPE_UPLOADS": str(tmp_path / "uploads")}
    with start_app(tmp_path / "server.log", env=env) as url, sync_api.sync_playwright() as p:
        exe = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
        browser = p.chromium.launch(executable_path=exe, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url + "/files")
            page.get_by_role("heading", name="Files", exact=True).first.wait_for(timeout=120_000)
            settle(page)
            box = page.get_by_label("…or a path").first

            def type_path(text: str) -> str:
                box.fill(text)
                box.press("Enter")
                settle(page)
                return page.locator('[data-testid="stMain"]').inner_text()

            body = type_path(str(root / "inside.gguf"))
            assert "leakcheckarch" in body, body[:1500]  # the control: this file is readable when allowed
            type_path("")  # nothing selected: a refused path must not bring the same bytes back
            for what, (typed, resolved) in refused.items():
                type_path(typed)
                # the refusal names the resolved path; read the page only once it is there (a heavier
                # default page can still show the previous run when the DOM first looks settled)
                page.locator('[data-testid="stAlert"]', has_text=str(resolved)).first.wait_for(timeout=60_000)
                settle(page)
                body = page.locator('[data-testid="stMain"]').inner_text()
                alerts = page.locator('[data-testid="stAlert"]').all_inner_texts()
                assert any("outside the allowed folders" in a and str(resolved) in a for a in alerts), (what, alerts)
                assert "leakcheckarch" not in body, (what, body[:1500])
            # a refused path is never selected (issue 27): not in the sidebar, not on the other pages
            side = page.locator('[data-testid="stSidebar"]').inner_text()
            assert "leak" not in side and "link.gguf" not in side, side
            page.locator('[data-testid="stSidebarNav"]').get_by_text("Tensors").first.click()
            page.get_by_role("heading", name="Tensors", exact=True).first.wait_for(timeout=60_000)
            settle(page)
            body = page.locator('[data-testid="stMain"]').inner_text()
            assert "leakcheckarch" not in body and "Choose a drafter" in body, body[:1500]
            assert page.locator('[data-testid="stException"]').count() == 0
            assert not errors, errors
        finally:
            browser.close()
    log = (tmp_path / "server.log").read_text()
    assert "Traceback" not in log, log[-3000:]
