"""A process stopped while it holds a lock never holds it past the bound (docs/design.md
rule 34).

Each test stops a real process (``KIP98_STOP_AT``, SIGSTOP) at a point where its session
holds locks and waits on it: inside a COPY's data (where no timeout of PostgreSQL's
applies), or idle inside its transaction. The stopped process's own sessions carry no
idle bound at all, so nothing of its own ever frees them: the other side, waiting for
those locks, must end the session itself. The waiters' lock and statement bounds are set
far beyond the test's patience, so a lock timeout cannot be what frees them: each test
checks that the other side finished while the first process was still stopped. Then the
stopped process runs again, gets a retriable error for what it had in flight, goes on,
and the log is checked: every acknowledged record exactly once, offsets gapless.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlalchemy import text

from app.broker import Broker
from app.client import Producer
from app.log.topics import create_topic

ROOT = Path(__file__).resolve().parents[1]
BOUND_MS = 1_000  # the waiters end a session stalled on its client after this long
# Far past any wait of these tests: a waiter that finishes was freed by the bound above.
PATIENCE_MS = 600_000
HANG_GUARD_S = 120  # only against a hang; nothing is asserted about how long things take


@pytest.fixture
def waiters(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's clients wait as long as it takes for a lock, but end what stalls
    them after ``BOUND_MS``."""
    monkeypatch.setenv("KIP98_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS", str(BOUND_MS))
    monkeypatch.setenv("KIP98_DB_LOCK_TIMEOUT_MS", str(PATIENCE_MS))
    monkeypatch.setenv("KIP98_DB_STATEMENT_TIMEOUT_MS", str(PATIENCE_MS))


def process_state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


@dataclass
class Stopped:
    """A child process stopped at its fault point; what it printed once resumed."""

    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    @property
    def still_stopped(self) -> bool:
        return self.proc.poll() is None and process_state(self.proc.pid) == "T"

    def resume(self) -> list[str]:
        self.proc.send_signal(signal.SIGCONT)
        out, _ = self.proc.communicate(timeout=HANG_GUARD_S)
        assert self.proc.returncode == 0, out
        self.lines = out.splitlines()
        assert self.lines[-1] == "done", out
        return self.lines

    @property
    def acked(self) -> list[str]:
        return [line.split(" ", 1)[1] for line in self.lines if line.startswith("acked ")]


def start_stopping(db_url: str, point: str, *argv: str) -> Stopped:
    """``python -m tests.<module> argv...`` stopping itself at ``point``, once it has."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "KIP98_STOP_AT": point,
        # Nothing of the stopped process's own ends its sessions: no idle bound, no loop.
        "KIP98_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS": "0",
        "KIP98_CLIENT_COORDINATOR_LOOP": "0",
        "KIP98_DATABASE_URL": db_url,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + HANG_GUARD_S
    while process_state(proc.pid) != "T":
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"the child ended before stopping at {point}: {out}")
        assert time.monotonic() < deadline, f"the child never reached {point}"
        time.sleep(0.02)
    return Stopped(proc)


@pytest.fixture
def stopped() -> Iterator[list[Stopped]]:
    made: list[Stopped] = []
    yield made
    for s in made:
        if s.proc.poll() is None:
            s.proc.send_signal(signal.SIGCONT)
            s.proc.kill()
            s.proc.wait()


def held_sessions(broker: Broker, application_name: str) -> list[tuple[str, str | None]]:
    """The (state, wait event) of the named application's sessions inside a transaction."""
    with broker.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT state, wait_event FROM pg_stat_activity"
                " WHERE application_name = :name AND state <> 'idle'"
                " AND backend_type = 'client backend'"
            ),
            {"name": application_name},
        ).all()
    return [(r.state, r.wait_event) for r in rows]


def check_log(broker: Broker, acked: list[str]) -> None:
    """Every acknowledged value once among the committed records of ``t``, no value
    twice, and each partition's offsets gapless from its log start."""
    with broker.engine.connect() as conn:
        values = [
            bytes(r.value).decode()
            for r in conn.execute(text("SELECT value FROM committed_records WHERE topic = 't'"))
        ]
        assert len(values) == len(set(values)), "a record was written twice"
        assert set(acked) <= set(values), "an acknowledged record is missing"
        rows = conn.execute(
            text(
                'SELECT r.partition, array_agg(r."offset" ORDER BY r."offset") AS offsets,'
                " min(p.log_start_offset) AS start, min(p.next_offset) AS next"
                " FROM records r JOIN partitions p USING (topic, partition)"
                " WHERE r.topic = 't' GROUP BY r.partition"
            )
        ).all()
    for r in rows:
        assert r.offsets == list(range(r.start, r.next)), f"t/{r.partition}: offsets with gaps"


def produce_now(db_url: str, partitions: list[int], tag: str) -> list[str]:
    """An idempotent producer's records to ``partitions`` of ``t``, flushed: their values."""
    producer = Producer({"database.url": db_url, "client.id": "waiter", "linger.ms": 0})
    try:
        values = [f"{tag}-{p}" for p in partitions]
        for value, p in zip(values, partitions, strict=True):
            producer.produce("t", value.encode(), partition=p)
        assert producer.flush(HANG_GUARD_S) == 0, "the waiter's records were not delivered"
        return values
    finally:
        producer.close()


def commit_now(db_url: str, transactional_id: str, partitions: list[int], tag: str) -> list[str]:
    """A transaction of one record per partition of ``t``, committed: its values."""
    producer = Producer({"database.url": db_url, "transactional.id": transactional_id})
    try:
        producer.init_transactions(HANG_GUARD_S)
        producer.begin_transaction()
        values = [f"{tag}-{p}" for p in partitions]
        for value, p in zip(values, partitions, strict=True):
            producer.produce("t", value.encode(), partition=p)
        producer.commit_transaction(HANG_GUARD_S)
        return values
    finally:
        producer.close()


@pytest.fixture
def topics(db_url: str, waiters: None) -> Broker:
    broker = Broker.connect(db_url)
    create_topic(broker, "t", 4)
    create_topic(broker, "in", 1)
    return broker


def _waited(
    topics: Broker, stop: Stopped, other: Callable[[], list[str]], in_statement: bool
) -> list[str]:
    """Run ``other`` while ``stop`` stays stopped holding its locks: its values."""
    sessions = held_sessions(topics, "stopper")
    assert sessions, "the stopped process holds nothing: the test tests nothing"
    if in_statement:
        assert ("active", "ClientRead") in sessions, sessions
    done = other()
    assert stop.still_stopped, "the other side was freed by the stopped process itself"
    assert held_sessions(topics, "stopper") == [], "the stalled session lives on"
    return done


# (fault point, the stopped producer's workload and rounds, whether it stops inside a
# statement (waiting for its COPY's data) or idle in its transaction)
PRODUCE_POINTS = [
    ("append.in_one_query", "idempotent", 3, True),  # a batch on its remembered row
    ("append.in_copy", "idempotent", 3, True),  # the lock's way, inside the COPY
    ("append.after_copy", "idempotent", 3, False),  # the lock's way, after the COPY
]


@pytest.mark.parametrize(("point", "workload", "rounds", "in_statement"), PRODUCE_POINTS)
def test_a_producer_stopped_holding_its_partition_does_not_stall_another(
    topics: Broker,
    db_url: str,
    stopped: list[Stopped],
    point: str,
    workload: str,
    rounds: int,
    in_statement: bool,
) -> None:
    stop = start_stopping(db_url, point, "tests.stopping_child", db_url, workload, str(rounds))
    stopped.append(stop)
    others = _waited(topics, stop, lambda: produce_now(db_url, [0], "other"), in_statement)
    stop.resume()
    assert not [line for line in stop.lines if line.startswith("failed")], stop.lines
    check_log(topics, stop.acked + others)
    assert len(stop.acked) == 5 * rounds
