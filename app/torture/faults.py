"""The nemesis: faults at random moments, each recorded in the run's history.

Kinds: SIGKILL (and restart) of a worker, a copier, a coordinator loop; SIGSTOP/SIGCONT
of a client for longer than its transaction timeout (it wakes up as a zombie and must be
fenced); stops of any process at random instants, mostly brief, some held past the bound
on sessions stalled by their client (``STALL_BOUND_MS``: the others must go on, ending a
stopped process's session that holds what they wait for, docs/design.md rule 34);
pg_terminate_backend of client connections (by application_name); an immediate
(crash) restart of PostgreSQL when the run owns the server; slow transactions (a
worker told by SIGUSR1 to keep its next transaction open past the timeout); and, on a run
with standbys, the primary's machine lost and a standby promoted (``failover``). The first
faults go through every kind once in random order, so a short run still sees them all (a
kind whose injection failed, the database being away, say, is tried again).
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from app.storage.driver import libpq_conninfo
from app.storage.embedded import EmbeddedPostgres, _pg_bindir
from app.storage.replica_set import EmbeddedReplicaSet
from app.torture import failover
from app.torture.history import INFO, INVOKE, OK, HistoryWriter
from app.torture.processes import STALL_BOUND_MS, Fleet, Role
from app.torture.workload import TXN_TIMEOUT_MS

KINDS = (
    "kill-worker",
    "kill-copier",
    "kill-coordinator",
    "pause",
    "stall",
    "terminate-backends",
    "pg-restart",
    "slow-txn",
)
# Relative frequency after the first round; a server restart disturbs everyone, so rarer.
WEIGHTS = {
    "kill-worker": 3,
    "kill-copier": 2,
    "kill-coordinator": 2,
    "pause": 2,
    "stall": 3,
    "terminate-backends": 3,
    "pg-restart": 1,
    "slow-txn": 2,
    failover.KIND: failover.WEIGHT,
}


def terminate_backends(url: str, application_names: list[str] | None) -> int:
    """Terminate the backends of the given clients (all torture clients when None)."""
    with psycopg.connect(libpq_conninfo(url), autocommit=True, connect_timeout=5) as conn:
        if application_names is None:
            rows = conn.execute(
                """SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                   WHERE application_name LIKE 'torture-%%' AND pid <> pg_backend_pid()"""
            ).fetchall()
        else:
            rows = conn.execute(
                """SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                   WHERE application_name = ANY(%s) AND pid <> pg_backend_pid()""",
                (application_names,),
            ).fetchall()
    return sum(1 for (done,) in rows if done)


def restart_server_immediate(server: EmbeddedPostgres) -> None:
    """Crash-stop and start the server on the same port, as a real server comes back:
    clients hold its address, so a restart elsewhere would be an outage, not a restart
    (``EmbeddedPostgres.restart_immediate`` picks a new free port when it starts again)."""
    data = server.data_dir.resolve()
    server._run(
        [
            str(_pg_bindir() / "pg_ctl"), "restart", "-w", "-m", "immediate",
            "-D", str(data), "-l", str(data.parent / "postgres.log"),
        ]
    )  # fmt: skip


class Nemesis:
    def __init__(
        self,
        fleet: Fleet,
        url: str,
        out: Path,
        rng: random.Random,
        server: EmbeddedPostgres | None,
        cluster: EmbeddedReplicaSet | None = None,
    ) -> None:
        self.fleet = fleet
        self.url = url
        self.rng = rng
        self.server = server
        self.cluster = cluster  # a run with standbys: its primary moves at each failover
        self.kinds = [k for k in KINDS if server is not None or k != "pg-restart"]
        if cluster is not None:
            self.kinds.append(failover.KIND)
        self.pending = list(self.kinds)
        rng.shuffle(self.pending)
        self.hist = HistoryWriter(out / "history" / "nemesis.jsonl", "nemesis")

    def next_kind(self) -> str:
        if self.pending:
            return self.pending.pop()
        return self.rng.choices(self.kinds, weights=[WEIGHTS[k] for k in self.kinds])[0]

    def supervise(self) -> None:
        """Restart any role whose process ended on its own, and say so in the history."""
        for role in self.fleet.reap():
            self.hist.record(INFO, "crash", kind="crash", target=role.name, code=role.crashes[-1])
            self.fleet.start(role)

    def sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self.supervise()
            time.sleep(min(0.2, left))

    def inject(self, kind: str) -> None:
        actions: dict[str, Callable[[], str]] = {
            "kill-worker": lambda: self._kill("worker"),
            "kill-copier": lambda: self._kill("copier"),
            "kill-coordinator": lambda: self._kill("coordinator"),
            "pause": self._pause,
            "stall": self._stall,
            "terminate-backends": self._terminate,
            "pg-restart": self._pg_restart,
            "slow-txn": self._slow,
            failover.KIND: lambda: failover.fail_over(self._cluster()),
        }
        self.hist.record(INVOKE, "fault", kind=kind)
        try:
            target = actions[kind]()
        except Exception as exc:
            self.hist.record(INFO, "fault", kind=kind, error=f"{type(exc).__name__}: {exc}")
            if kind not in self.pending:
                self.pending.insert(0, kind)  # not done yet: again, after the others due
            return
        self.hist.record(OK, "fault", kind=kind, target=target)

    def _pick(self, *kinds: str) -> Role:
        return self.rng.choice([r for r in self.fleet.roles if r.kind in kinds])

    def _kill(self, kind: str) -> str:
        role = self._pick(kind)
        self.fleet.kill(role)
        role.proc = None
        self.sleep(self.rng.uniform(0.2, 1.5))
        self.fleet.start(role)
        return role.name

    def _pause(self) -> str:
        role = self._pick("worker", "copier")
        self.fleet.signal(role, signal.SIGSTOP)
        role.paused = True
        self.sleep(TXN_TIMEOUT_MS / 1000.0 * self.rng.uniform(1.3, 2.0))
        self.fleet.signal(role, signal.SIGCONT)
        role.paused = False
        return role.name

    def _stall(self) -> str:
        """A burst of stops of one process at random instants: each brief, or (one in four)
        held past the bound, so that a stop inside a transaction stalls whoever waits on
        its locks until they end its session."""
        role = self._pick("worker", "copier", "racer", "coordinator")
        stops = self.rng.randint(3, 10)
        past = 0
        for _ in range(stops):
            self.sleep(self.rng.uniform(0.0, 0.1))
            self.fleet.signal(role, signal.SIGSTOP)
            role.paused = True
            if self.rng.random() < 0.25:
                past += 1
                self.sleep(STALL_BOUND_MS / 1000.0 * self.rng.uniform(1.5, 3.0))
            else:
                self.sleep(self.rng.uniform(0.0, 0.3))
            self.fleet.signal(role, signal.SIGCONT)
            role.paused = False
        return f"{role.name} ({stops} stops, {past} past the bound)"

    def _terminate(self) -> str:
        if self.rng.random() < 0.3:
            n = terminate_backends(self.url, None)
            return f"all ({n} backends)"
        role = self._pick("worker", "copier")
        short = f"w{role.index}" if role.kind == "worker" else f"c{role.index}"
        n = terminate_backends(self.url, [f"torture-{short}", f"torture-{short}-c"])
        return f"{role.name} ({n} backends)"

    def _pg_restart(self) -> str:
        server = self.server if self.cluster is None else self.cluster.primary()
        assert server is not None
        restart_server_immediate(server)
        return "postgresql"

    def _cluster(self) -> EmbeddedReplicaSet:
        assert self.cluster is not None
        return self.cluster

    def _slow(self) -> str:
        role = self._pick("worker")
        self.fleet.signal(role, signal.SIGUSR1)
        return role.name
