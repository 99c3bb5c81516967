"""``kip98 db`` with standbys, through the real command: start, status, url, stop and start
again, and every kind of bad input refused in one line with nothing changed."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.storage.replica_set import EmbeddedReplicaSet
from app.storage.urls import parse
from tests.helpers.cli_runner import run_kip98
from tests.helpers.replication import admin, wait_gone


@pytest.fixture
def home() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kip98-home-", dir="/var/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        EmbeddedReplicaSet(path).stop()
        shutil.rmtree(path, ignore_errors=True)


def _db(home: Path, *args: str, ok: bool = True) -> Any:
    result = run_kip98("db", *args, env={"KIP98_HOME": str(home)}, timeout=300)
    if ok:
        assert result.returncode == 0, result.stderr
    return result


def _status(home: Path) -> dict[str, Any]:
    status: dict[str, Any] = json.loads(_db(home, "status", "--output", "json").stdout)
    return status


def _refused(home: Path, *args: str, says: str) -> None:
    """A non-zero exit, its reason one line at the end of stderr (after any progress
    lines), no traceback."""
    result = _db(home, *args, ok=False)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and says in last, result.stderr


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaps is as dead as it gets)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_standbys_started_shown_addressed_stopped_and_brought_back(home: Path) -> None:
    _db(home, "start", "--standbys", "2")
    status = _status(home)
    nodes = status["nodes"]
    assert [n["role"] for n in nodes] == ["primary", "standby", "standby"]
    primary = nodes[0]
    # Today's keys describe the primary.
    assert {k: status[k] for k in ("running", "pid", "port", "data_dir", "url")} == {
        "running": True, "pid": primary["pid"], "port": primary["port"],
        "data_dir": primary["data_dir"], "url": primary["url"],
    }  # fmt: skip
    assert primary["sync_state"] is None and primary["replay_lag_bytes"] == 0
    for standby in nodes[1:]:
        assert standby["sync_state"] == "quorum"  # ANY 1 (...): each may confirm
        assert isinstance(standby["replay_lag_bytes"], int) and standby["lsn"]
    assert len({n["port"] for n in nodes}) == 3 and all(_alive(n["pid"]) for n in nodes)

    to_primary = parse(_db(home, "url").stdout.strip())
    to_standby = parse(_db(home, "url", "--standby").stdout.strip())
    ports = [n["port"] for n in nodes]
    assert sorted(p for _, p in to_primary.hosts) == sorted(ports)
    assert to_primary.target_session_attrs == "read-write"
    assert to_standby.hosts == to_primary.hosts
    assert to_standby.target_session_attrs == "standby"
    assert status["database_url"] == to_primary.render()

    _db(home, "stop")
    for n in nodes:
        wait_gone(n["pid"])
    assert [n["running"] for n in _status(home)["nodes"]] == [False, False, False]

    _db(home, "start")  # no flags: the same nodes, remembered
    again = _status(home)["nodes"]
    assert [(n["name"], n["role"], n["port"]) for n in again] == [
        (n["name"], n["role"], n["port"]) for n in nodes
    ]
    assert all(n["running"] for n in again)


def test_bad_input_is_refused_in_one_line_and_changes_nothing(home: Path) -> None:
    _refused(home, "start", "--standbys", "-1", says="must be 0 or more")
    _refused(home, "start", "--standbys", "99", says="this host can run at most")
    _refused(
        home, "start", "--standbys", "2", "--min-insync-standbys", "3",
        says="more than the 2 standbys",
    )  # fmt: skip
    assert not (home / "pgdata").exists()  # nothing was started for any of them
    _refused(home, "failover", says="no standbys to fail over to")

    _db(home, "start", "--standbys", "1")
    cluster = EmbeddedReplicaSet(home)
    layout = cluster.layout()
    primary = cluster.node(layout.primary, layout).status()
    cluster.node(layout.standby_names[0], layout).stop()
    _refused(home, "failover", says="no live standby to promote")
    # The primary was not fenced for nothing.
    assert cluster.node(layout.primary, layout).status().pid == primary.pid


def test_a_failed_start_with_standbys_leaves_the_primary_as_it_was(home: Path) -> None:
    _db(home, "start")
    cluster = EmbeddedReplicaSet(home)
    before = cluster.primary().status()
    assert before.port is not None
    (home / "node2").write_text("not a directory")  # the second standby cannot be made
    _refused(home, "start", "--standbys", "2", says="the primary is as it was")

    after = cluster.primary().status()
    assert (after.pid, after.port) == (before.pid, before.port)
    assert cluster.layout().standbys == 0
    assert not (home / "node1" / "pgdata").exists()  # the first standby removed again
    with admin(before.port) as conn:
        assert conn.execute("SHOW synchronous_standby_names").fetchone() == ("",)
        assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_stat_replication").fetchone() == (0,)
    status = _status(home)
    assert status["running"] and [n["role"] for n in status["nodes"]] == ["primary"]
