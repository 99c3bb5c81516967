"""A replicated embedded database for the tests: a primary and two hot standbys under a
private ``KIP98_HOME``, and the faults done to its nodes with real signals.

One set of nodes serves a whole session (``conftest.replicated``); each test gets a fresh
database on it, made from a migrated template on the primary and replicated to the
standbys like everything else (``conftest.replica_db``). Before each test the nodes are
brought back as they were meant to be: a stopped standby started, an old primary rejoined,
every standby streaming.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from app.storage.embedded import SUPERUSER, EmbeddedPostgres
from app.storage.replica_set import EmbeddedReplicaSet, Layout
from app.storage.urls import parse
from app.torture.failover import node_processes
from tests.helpers.cli_runner import run_kip98

STANDBYS = 2


@dataclass
class ReplicatedDatabase:
    """One test's database on the replicated nodes."""

    cluster: EmbeddedReplicaSet
    name: str

    @property
    def home(self) -> Path:
        return self.cluster.home

    @property
    def url(self) -> str:
        """Every node, reaching the primary: the URL clients are given."""
        return parse(self.cluster.url()).with_database(self.name).render()

    @property
    def standby_url(self) -> str:
        return parse(self.cluster.url(standby=True)).with_database(self.name).render()

    def layout(self) -> Layout:
        return self.cluster.layout()

    def primary(self) -> EmbeddedPostgres:
        return self.cluster.primary()

    def standbys(self) -> list[EmbeddedPostgres]:
        layout = self.layout()
        return [self.cluster.node(n, layout) for n in layout.standby_names]

    def node_url(self, node: EmbeddedPostgres) -> str:
        """One node alone (a standby to read from, a primary to inspect)."""
        port = node.status().port
        assert port is not None, f"{node.data_dir} is not running"
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{port}/{self.name}"

    def kip98(self, *args: str) -> Any:
        """``kip98`` as a real process on these nodes."""
        return run_kip98(*args, env={"KIP98_HOME": str(self.home)}, timeout=300)


def admin(port: int, dbname: str = "postgres") -> psycopg.Connection[Any]:
    return psycopg.connect(
        host="127.0.0.1", port=port, user=SUPERUSER, dbname=dbname, autocommit=True
    )


def signal_node(node: EmbeddedPostgres, signum: int) -> None:
    for pid in node_processes(node):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def wait_gone(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state == "Z":
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} still alive")


def wait_streaming(cluster: EmbeddedReplicaSet, count: int, timeout: float = 120) -> None:
    """Until ``count`` standbys stream from the primary (a hang guard, not a bound)."""
    deadline = time.monotonic() + timeout
    while True:
        port = cluster.primary().status().port
        if port is not None:
            with contextlib.suppress(psycopg.Error), admin(port) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_replication"
                    " WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum')"
                ).fetchone()
                if row is not None and row[0] >= count:
                    return
        if time.monotonic() > deadline:
            raise AssertionError(f"fewer than {count} standbys streaming")
        time.sleep(0.05)


@contextlib.contextmanager
def server_setting(port: int, name: str, value: str) -> Iterator[None]:
    """A setting of one running node changed for the block (ALTER SYSTEM and a reload)."""
    with admin(port) as conn:
        conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield
    finally:
        with contextlib.suppress(psycopg.Error), admin(port) as conn:
            conn.execute(f"ALTER SYSTEM RESET {name}")
            conn.execute("SELECT pg_reload_conf()")


@contextlib.contextmanager
def paused(nodes: list[EmbeddedPostgres]) -> Iterator[None]:
    """The nodes' processes stopped (SIGSTOP: a machine that hangs), resumed after."""
    for node in nodes:
        signal_node(node, signal.SIGSTOP)
    try:
        yield
    finally:
        for node in nodes:
            signal_node(node, signal.SIGCONT)


def restore(cluster: EmbeddedReplicaSet) -> None:
    """Every node back as it is meant to be: resumed, started, rejoined, streaming."""
    layout = cluster.layout()
    for name in layout.nodes:
        signal_node(cluster.node(name, layout), signal.SIGCONT)
    cluster.start()
    wait_streaming(cluster, STANDBYS)
