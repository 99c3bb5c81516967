"""The embedded server's life cycle, driven through ``kip98 db`` in real processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.storage.embedded import EmbeddedPostgres
from tests.helpers.cli_runner import KIP98_BIN, run_kip98


@pytest.fixture
def home() -> Iterator[Path]:
    """A private KIP98_HOME the server user can reach, so no /var/tmp fallback kicks in."""
    path = Path(tempfile.mkdtemp(prefix="kip98-home-", dir="/var/tmp"))
    path.chmod(0o755)
    server = EmbeddedPostgres(path)
    try:
        yield path
    finally:
        server.stop()
        shutil.rmtree(path, ignore_errors=True)


def _db(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"KIP98_HOME": str(home), "KIP98_EMBEDDED_DURABILITY": "off"}
    result = run_kip98("db", *args, env=env)
    assert result.returncode == 0, result.stderr
    return result


def _status(home: Path) -> dict[str, object]:
    status: dict[str, object] = json.loads(_db(home, "status", "--output", "json").stdout)
    return status


def _postmasters(data_dir: Path) -> list[int]:
    """Pids of live postmasters serving ``data_dir`` (children show no ``-D``)."""
    wanted = str(data_dir.resolve())
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        if (
            args
            and Path(args[0]).name == "postgres"
            and "-D" in args
            and Path(args[args.index("-D") + 1]).resolve() == Path(wanted)
        ):
            found.append(int(proc.name))
    return found


def _wait_gone(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except OSError:
            return
        if state == "Z":  # a zombie nobody reaps is as dead as it gets
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} still alive")


def test_start_twice_leaves_one_server(home: Path) -> None:
    _db(home, "start")
    first = _status(home)
    _db(home, "start")
    second = _status(home)
    assert first["running"] is True
    assert first["pid"] == second["pid"]
    assert first["port"] == second["port"]
    assert _postmasters(home / "pgdata") == [first["pid"]]


def test_concurrent_starts_leave_exactly_one_server(home: Path) -> None:
    env = {**os.environ, "KIP98_HOME": str(home), "KIP98_EMBEDDED_DURABILITY": "off"}
    procs = [
        subprocess.Popen(
            [str(KIP98_BIN), "db", "start"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
    status = _status(home)
    assert status["running"] is True
    assert _postmasters(home / "pgdata") == [status["pid"]]
    # Every caller was told about the same server.
    assert {out.strip().rsplit(" ", 1)[-1] for out, _ in outputs} == {status["url"]}


def test_stop_stops_the_server(home: Path) -> None:
    _db(home, "start")
    pid = _status(home)["pid"]
    assert isinstance(pid, int)
    assert "stopped" in _db(home, "stop").stdout
    _wait_gone(pid)
    assert _status(home)["running"] is False
    assert _postmasters(home / "pgdata") == []
    assert "not running" in _db(home, "stop").stdout


def test_start_recovers_from_a_killed_postmaster_with_a_reused_pid(home: Path) -> None:
    _db(home, "start")
    pid = _status(home)["pid"]
    assert isinstance(pid, int)
    os.kill(pid, signal.SIGKILL)
    _wait_gone(pid)
    pidfile = home / "pgdata" / "postmaster.pid"
    lines = pidfile.read_text().splitlines()
    # The worst case after a crash: the recorded pid now belongs to some other live process.
    lines[0] = str(os.getpid())
    with open(pidfile, "r+") as fh:  # in place, keeping the server user's ownership
        fh.truncate()
        fh.write("\n".join(lines) + "\n")
    assert _status(home)["running"] is False

    _db(home, "start")
    status = _status(home)
    assert status["running"] is True
    assert status["pid"] != os.getpid()
    assert _postmasters(home / "pgdata") == [status["pid"]]
    url = run_kip98("db", "url", env={"KIP98_HOME": str(home)}).stdout.strip()
    assert url == status["url"]


def test_unreachable_home_falls_back_to_var_tmp(tmp_path: Path) -> None:
    """pytest's tmp_path is private to root; the server user cannot enter it."""
    if os.geteuid() != 0:
        pytest.skip("only root runs the server as another user")
    home = tmp_path / "home"
    server = EmbeddedPostgres(home)
    try:
        _db(home, "start")
        status = _status(home)
        assert status["running"] is True
        assert (home / "pgdata").resolve().is_relative_to("/var/tmp")
    finally:
        server.stop()
        target = (home / "pgdata").resolve().parent
        if target.is_relative_to("/var/tmp"):
            shutil.rmtree(target, ignore_errors=True)


def test_a_crash_restart_keeps_the_url(home: Path) -> None:
    """Clients hold the URL; a crash restart (immediate stop, start) must not move the port."""
    from app.storage.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(home)
    before = server.start()
    server.restart_immediate()
    after = server.status()
    assert after.running and after.pid != before.pid
    assert after.url == before.url


def test_a_port_left_with_connections_in_time_wait_counts_as_free() -> None:
    """After a crash stop the server's side of every connection it closed sits in TIME_WAIT
    on its port; the postmaster can listen there again (it binds with SO_REUSEADDR), so a
    restart must see the port as free and keep it, or every client's URL moves."""
    from app.storage.embedded import _port_is_free

    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        server_side, _ = listener.accept()
        server_side.close()  # the server closes first: its side goes to TIME_WAIT
        client.recv(1)
        client.close()
    assert _port_is_free(port)
