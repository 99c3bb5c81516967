"""The failover nemesis, for a run on a primary with standbys (``--standbys N``): the
primary's machine is lost, its postmaster and every process it started SIGKILLed and its
data directory deleted, and the most advanced standby is promoted (``kip98 db failover``'s
own code). The clients are not told: they hold the URL naming every node and find the new
primary by themselves. The lost node then comes back as a standby, copied afresh from the
new primary, so that the next failover has standbys to choose from again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

from app.storage.embedded import EmbeddedPostgres
from app.storage.replica_set import EmbeddedReplicaSet

KIND = "failover"
WEIGHT = 1  # each one disturbs every client, as a server restart does


def node_processes(node: EmbeddedPostgres) -> list[int]:
    """The node's postmaster and every process it started."""
    status = node.status()
    if status.pid is None:
        return []
    pids = [status.pid]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == status.pid:
                pids.append(int(proc.name))
    return pids


def kill_node(node: EmbeddedPostgres, timeout_s: float = 30.0) -> None:
    """SIGKILL the node's processes, as a machine that stops does; returns once they are
    gone (a zombie nobody reaps counts as gone)."""
    pids = node_processes(node)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                break
            if state == "Z":
                break
            time.sleep(0.02)


def lose_machine(node: EmbeddedPostgres) -> None:
    """The node's machine is gone: its processes killed, its data directory deleted."""
    kill_node(node)
    shutil.rmtree(node.data_dir.resolve(), ignore_errors=True)


def fail_over(cluster: EmbeddedReplicaSet) -> str:
    """Lose the primary's machine, promote a standby, bring the lost node back as a
    standby; says which node went and which took over."""
    lost = cluster.layout().primary
    lose_machine(cluster.primary())
    promoted = cluster.failover()
    cluster.start()  # the lost node rejoins, copied afresh
    return f"{lost} lost, {promoted} promoted"
