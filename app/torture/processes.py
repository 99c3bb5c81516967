"""The run's processes: workers, copiers, racers and coordinator loops as child processes, each
restartable under the same role (so a restarted worker reuses its transactional id)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]
# The run's bound on sessions waiting on their client inside a transaction (PostgreSQL's
# idle one, and the stalled-session watch of docs/design.md rule 34): short, so the
# nemesis' stops past it are seconds.
STALL_BOUND_MS = 2_000


@dataclass
class Role:
    kind: str  # worker | copier | racer | coordinator
    index: int
    incarnation: int = 0
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False
    crashes: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.index}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def child_env(url: str) -> dict[str, str]:
    """Coordinator work is left to the dedicated loops (so killing them matters); short
    leases and passes make a killed loop's successor take over within a transaction timeout."""
    env = {**os.environ, "KIP98_DATABASE_URL": url}
    env.setdefault("KIP98_COORDINATOR_INTERVAL_MS", "200")
    env.setdefault("KIP98_COORDINATOR_LEASE_MS", "2000")
    env.setdefault("KIP98_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS", str(STALL_BOUND_MS))
    env["KIP98_CLIENT_COORDINATOR_LOOP"] = "0"
    env.pop("KIP98_CRASH_AT", None)
    return env


class Fleet:
    def __init__(self, url: str, out: Path, seed: int) -> None:
        self.url = url
        self.out = out
        self.seed = seed
        self.roles: list[Role] = []
        self._logs: list[IO[bytes]] = []
        (out / "logs").mkdir(parents=True, exist_ok=True)

    def add(self, kind: str, count: int) -> list[Role]:
        added = [Role(kind, i) for i in range(count)]
        self.roles.extend(added)
        return added

    def of(self, kind: str) -> list[Role]:
        return [r for r in self.roles if r.kind == kind]

    def start(self, role: Role) -> None:
        role.incarnation += 1
        args = [
            sys.executable, "-m", "app.torture", role.kind,
            "--index", str(role.index), "--incarnation", str(role.incarnation),
            "--seed", str(self.seed), "--url", self.url, "--out", str(self.out),
        ]  # fmt: skip
        log = open(self.out / "logs" / f"{role.name}-{role.incarnation}.log", "wb")  # noqa: SIM115
        self._logs.append(log)
        role.proc = subprocess.Popen(
            args, cwd=ROOT, env=child_env(self.url), stdout=log, stderr=subprocess.STDOUT
        )
        role.paused = False

    def signal(self, role: Role, signum: int) -> None:
        if role.alive and role.proc is not None:
            role.proc.send_signal(signum)

    def kill(self, role: Role) -> None:
        if role.proc is None:
            return
        self.signal(role, signal.SIGKILL)
        role.proc.wait()
        role.paused = False

    def reap(self) -> list[Role]:
        """Roles whose process ended without being asked to (an unhandled error)."""
        ended = []
        for role in self.roles:
            if role.proc is not None and role.proc.poll() is not None:
                role.crashes.append(role.proc.returncode)
                role.proc = None
                ended.append(role)
        return ended

    def stop(self, roles: list[Role], grace_s: float) -> None:
        """SIGTERM (finish the current transaction), then SIGKILL after ``grace_s``."""
        for role in roles:
            if role.paused:
                self.signal(role, signal.SIGCONT)
                role.paused = False
            self.signal(role, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for role in roles:
            if role.proc is None:
                continue
            try:
                role.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(role)
            role.proc = None

    def close(self) -> None:
        self.stop([r for r in self.roles if r.proc is not None], 5)
        for log in self._logs:
            log.close()
