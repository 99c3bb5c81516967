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
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from app.admin import AdminClient, ConfigResource
from app.broker import Broker
from app.broker.loop import CoordinatorLoop
from app.client import Consumer, Producer, TopicPartition
from app.log.topics import create_topic
from app.server.process import ServeProcess

ROOT = Path(__file__).resolve().parents[1]
BOUND_MS = 1_000  # the waiters end a session stalled on its client after this long
# Far past any wait of these tests: a waiter that finishes was freed by the bound above.
PATIENCE_MS = 600_000
HANG_GUARD_S = 120  # only against a hang; nothing is asserted about how long things take
CHILD = ("-m", "tests.children.stopping_child")
KIP98 = ("-c", "from app.cli.main import main; main()")  # the kip98 command


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

    proc: subprocess.Popen[Any]
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


def start_stopping(
    db_url: str, point: str, *argv: str, env: dict[str, str] | None = None
) -> Stopped:
    """``python argv...`` stopping itself at ``point`` (``env`` added to its
    environment), once it has."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "KIP98_STOP_AT": point,
        # Nothing of the stopped process's own ends its sessions: no idle bound, no loop.
        "KIP98_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS": "0",
        "KIP98_CLIENT_COORDINATOR_LOOP": "0",
        "KIP98_DATABASE_URL": db_url,
        **(env or {}),
    }
    proc = subprocess.Popen(
        [sys.executable, *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
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


def held_sessions(broker: Broker, application_name: str | None) -> list[tuple[str, str | None]]:
    """The (state, wait event) of the named application's sessions inside a transaction
    (None: of every other session of the database, for processes that name none)."""
    with broker.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT state, wait_event FROM pg_stat_activity"
                " WHERE (application_name = :name OR CAST(:name AS text) IS NULL)"
                " AND state <> 'idle' AND pid <> pg_backend_pid()"
                " AND datname = current_database() AND backend_type = 'client backend'"
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


def offset_commit_now(db_url: str) -> list[str]:
    """A group's offset commit on t/0 (its partition row held FOR KEY SHARE to COMMIT)."""
    consumer = Consumer({"database.url": db_url, "group.id": "waiting-group"})
    try:
        consumer.commit(offsets=[TopicPartition("t", 0, 0)], asynchronous=False)
        return []
    finally:
        consumer.close()


def _waited(
    topics: Broker,
    stop: Stopped,
    others: list[Callable[[], list[str]]],
    in_statement: bool,
    application_name: str | None = "stopper",
) -> list[str]:
    """Run each of ``others`` while ``stop`` stays stopped holding its locks: their
    values."""
    sessions = held_sessions(topics, application_name)
    assert sessions, "the stopped process holds nothing: the test tests nothing"
    if in_statement:
        assert ("active", "ClientRead") in sessions, sessions
    done = [value for other in others for value in other()]
    assert stop.still_stopped, "the other side was freed by the stopped process itself"
    assert held_sessions(topics, application_name) == [], "the stalled session lives on"
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
    stop = start_stopping(db_url, point, *CHILD, db_url, workload, str(rounds))
    stopped.append(stop)
    waiters = [lambda: produce_now(db_url, [0], "other"), lambda: offset_commit_now(db_url)]
    others = _waited(topics, stop, waiters, in_statement)
    stop.resume()
    assert not [line for line in stop.lines if line.startswith("failed")], stop.lines
    check_log(topics, stop.acked + others)
    assert len(stop.acked) == 5 * rounds


# A transactional producer's commit stopped with its transactional id's row and its
# partitions locked: (fault point, workload, whether inside a statement).
COMMIT_POINTS = [
    ("commit.in_one_query", "transactional", True),  # the second commit, one query string
    ("append.in_copy", "transactional", True),  # the first commit, the lock's way: its COPY
    ("append.in_one_query", "flushed", True),  # a batch on the id's remembered row (§3.12)
    ("register.in_one_query", "early", True),  # a transaction's first batch, one query string
    ("commit_request.before_commit", "transactional", False),  # every write done
    ("end_txn.after_prepare", "transactional", False),  # PREPARE written, not committed
    ("complete.after_marker", "transactional", False),
    ("complete.before_complete", "offsets", False),  # with the group's offsets
    ("complete.after_marker", "bare", False),  # a bare EndTxn's completion
]


@pytest.mark.parametrize(("point", "workload", "in_statement"), COMMIT_POINTS)
def test_a_commit_stopped_holding_its_locks_does_not_stall_others(
    topics: Broker,
    db_url: str,
    stopped: list[Stopped],
    point: str,
    workload: str,
    in_statement: bool,
) -> None:
    """Another producer of the partition, a group's offset commit on it, and a new
    instance of the stopped producer's transactional id (which fences it) all finish
    while it stays stopped; resumed, it is fenced, and its transaction left nothing."""
    stop = start_stopping(db_url, point, *CHILD, db_url, workload, "3")
    stopped.append(stop)
    waiters = [
        lambda: produce_now(db_url, [0], "other"),
        lambda: offset_commit_now(db_url),
        lambda: commit_now(db_url, "stopper", [0, 1], "successor"),
    ]
    others = _waited(topics, stop, waiters, in_statement)
    lines = stop.resume()
    assert any(line.startswith("failed") for line in lines), lines  # fenced
    check_log(topics, stop.acked + others)
    with topics.engine.connect() as conn:
        state = conn.execute(
            text("SELECT state FROM transactions WHERE transactional_id = 'stopper'")
        ).scalar_one()
    assert state in ("COMPLETE_COMMIT", "COMPLETE_ABORT", "EMPTY"), state


def test_a_fence_stopped_holding_the_id_does_not_stall_its_successor(
    topics: Broker, db_url: str, stopped: list[Stopped], clients: list[object]
) -> None:
    """An InitProducerId stopped inside its fencing (PREPARE_ABORT written, not committed,
    the id's row held): another instance's InitProducerId of the same id goes on, fences
    and aborts the open transaction, and commits its own."""
    victim = Producer({"database.url": db_url, "transactional.id": "victim", "linger.ms": 0})
    clients.append(victim)
    victim.init_transactions(HANG_GUARD_S)
    victim.begin_transaction()
    victim.produce("t", b"victim-0", partition=0)
    assert victim.flush(HANG_GUARD_S) == 0  # written, in a transaction left open
    stop = start_stopping(db_url, "fence.after_prepare", *CHILD, db_url, "fencer", "1")
    stopped.append(stop)
    others = _waited(topics, stop, [lambda: commit_now(db_url, "victim", [0], "heir")], False)
    stop.resume()
    check_log(topics, others)
    with topics.engine.connect() as conn:
        values = conn.execute(text("SELECT value FROM committed_records")).scalars().all()
    assert b"victim-0" not in [bytes(v) for v in values]


def test_a_commit_stopped_in_its_completion_does_not_stall_the_coordinator(
    topics: Broker, db_url: str, stopped: list[Stopped]
) -> None:
    """A bare EndTxn's completion stopped with the id's row and its partitions held
    (PREPARE_COMMIT durable): a coordinator pass rolls the transaction forward while the
    process stays stopped (docs/design.md rule 2), and its records become visible."""
    stop = start_stopping(db_url, "complete.after_marker", *CHILD, db_url, "bare", "1")
    stopped.append(stop)
    loop = CoordinatorLoop(Broker.connect(db_url))

    def coordinator_pass() -> list[str]:
        while loop.run_once().rolled_forward == 0:
            assert stop.still_stopped
        return []

    _waited(topics, stop, [coordinator_pass], False)
    loop.release_leases()
    with topics.engine.connect() as conn:
        state = conn.execute(
            text("SELECT state FROM transactions WHERE transactional_id = 'stopper'")
        ).scalar_one()
    assert state == "COMPLETE_COMMIT"
    stop.resume()
    check_log(topics, [f"s0-{i}" for i in range(5)])


def test_busy_producers_stopped_at_random_instants_never_stall_another(
    topics: Broker, db_url: str, stopped: list[Stopped]
) -> None:
    """A busy idempotent producer and a busy transactional one, stopped again and again at
    random instants (``KIP98_RANDOM_STOPS`` of them, 60 by default; a fifth held past the
    bound), while a third producer delivers record after record to the same partitions:
    every delivery of the third finishes while its blocker may still be stopped, and in
    the end every acknowledged record is in the log once, offsets gapless. The third's
    longest delivery is reported, not asserted (it depends on the machine)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KIP98_DATABASE_URL": db_url}
    env.update(
        {"KIP98_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS": "0", "KIP98_CLIENT_COORDINATOR_LOOP": "0"}
    )
    busy = [
        subprocess.Popen(
            [sys.executable, *CHILD, db_url, workload, "0", name, size],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for workload, name, size in (
            ("spread", "busy-idempotent", "250"),
            ("transactional", "busy-txn", "500"),
        )
    ]
    stopped.extend(Stopped(p) for p in busy)
    for proc in busy:  # both at work before the first stop
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("acked"), "a busy producer never got going"

    waited: list[float] = []
    delivered: list[str] = []
    done = threading.Event()

    def deliver() -> None:
        producer = Producer({"database.url": db_url, "client.id": "waiter", "linger.ms": 0})
        try:
            i = 0
            while not done.is_set():
                value = f"waiter-{i}"
                started = time.monotonic()
                producer.produce("t", value.encode(), partition=i % 4)
                assert producer.flush(HANG_GUARD_S) == 0, f"{value} was not delivered"
                waited.append(time.monotonic() - started)
                delivered.append(value)
                i += 1
        finally:
            producer.close()

    deliveries = threading.Thread(target=deliver)
    deliveries.start()
    rng = random.Random(int(os.environ.get("KIP98_RANDOM_STOPS_SEED", "36")))
    stops = int(os.environ.get("KIP98_RANDOM_STOPS", "60"))
    names = {busy[0].pid: "busy-idempotent", busy[1].pid: "busy-txn"}
    held_past_bound = holding = 0
    try:
        for _ in range(stops):
            time.sleep(rng.uniform(0, 0.05))
            proc = rng.choice(busy)
            proc.send_signal(signal.SIGSTOP)
            holding += bool(held_sessions(topics, names[proc.pid]))
            if rng.random() < 0.2:
                held_past_bound += 1
                time.sleep(BOUND_MS / 1000 * rng.uniform(1.5, 3.0))
            else:
                time.sleep(rng.uniform(0, 0.1))
            proc.send_signal(signal.SIGCONT)
            assert deliveries.is_alive(), "the third producer failed"
    finally:
        done.set()
        for proc in busy:
            proc.send_signal(signal.SIGCONT)
        deliveries.join(HANG_GUARD_S)
    lines: list[str] = []
    for proc in busy:
        proc.send_signal(signal.SIGUSR1)
        out, _ = proc.communicate(timeout=HANG_GUARD_S)
        assert proc.returncode == 0, out
        assert out.splitlines()[-1] == "done", out
        lines += out.splitlines()
    acked = [line.split(" ", 1)[1] for line in lines if line.startswith("acked ")]
    check_log(topics, acked + delivered)
    waited.sort()
    print(
        f"{stops} stops ({holding} inside a transaction, {held_past_bound} held past the"
        f" {BOUND_MS} ms bound): {len(delivered)}"
        f" deliveries of the third producer, median {statistics.median(waited) * 1000:.0f} ms,"
        f" longest {waited[-1] * 1000:.0f} ms"
    )


def test_a_server_stopped_inside_its_one_query_write_does_not_stall_the_partition(
    topics: Broker, db_url: str
) -> None:
    """``kip98 serve`` stopped inside a Kafka client's produce (its one-query write, the
    partition's row held, the COPY waiting for data): native producers and offset commits
    go on; resumed, the server answers, and librdkafka's records are in the log once."""
    from confluent_kafka import Producer as KafkaProducer

    env = {"KIP98_STOP_AT": "append.in_one_query", "KIP98_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS": "0"}
    serve = ServeProcess(db_url, env=env)
    serve.start()
    delivered: list[str] = []
    kafka = KafkaProducer(
        {
            "bootstrap.servers": serve.address,
            "enable.idempotence": True,
            "linger.ms": 0,
            "message.timeout.ms": 600_000,
        }
    )
    try:

        def report(err: object, msg: Any) -> None:
            if err is None:
                delivered.append(msg.value().decode())

        kafka.produce("t", b"kafka-0", partition=0, on_delivery=report)
        assert kafka.flush(HANG_GUARD_S) == 0  # the lock's way: the row is remembered now
        for i in range(1, 4):
            kafka.produce("t", f"kafka-{i}".encode(), partition=0, on_delivery=report)
        kafka.poll(0)
        deadline = time.monotonic() + HANG_GUARD_S
        while process_state(serve.proc.pid) != "T":
            kafka.poll(0.05)
            assert time.monotonic() < deadline, "the server never stopped inside its write"
        stop = Stopped(serve.proc)
        waiters = [lambda: produce_now(db_url, [0], "other"), lambda: offset_commit_now(db_url)]
        others = _waited(topics, stop, waiters, True, application_name=None)
        serve.proc.send_signal(signal.SIGCONT)
        assert kafka.flush(HANG_GUARD_S) == 0
        check_log(topics, delivered + others)
        assert sorted(delivered) == [f"kafka-{i}" for i in range(4)]
    finally:
        serve.proc.send_signal(signal.SIGCONT)
        assert serve.stop() == 0
        serve.kill()


def test_a_coordinator_loop_stopped_inside_its_fencing_does_not_stall_the_id(
    topics: Broker,
    db_url: str,
    stopped: list[Stopped],
    clients: list[object],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``kip98 coordinator run`` stopped while it times a transaction out (PREPARE_ABORT
    written, not committed, the id's row held): a new instance of the id goes on."""
    monkeypatch.setenv("KIP98_CLIENT_COORDINATOR_LOOP", "0")  # the loop times it out
    victim = Producer(
        {
            "database.url": db_url,
            "transactional.id": "victim",
            "transaction.timeout.ms": 1000,
            "linger.ms": 0,
        }
    )
    clients.append(victim)
    victim.init_transactions(HANG_GUARD_S)
    victim.begin_transaction()
    victim.produce("t", b"victim-0", partition=0)
    assert victim.flush(HANG_GUARD_S) == 0
    stop = start_stopping(
        db_url,
        "fence.after_prepare",
        *(*KIP98, "coordinator", "run", "--interval-ms", "100"),
    )
    stopped.append(stop)
    others = _waited(topics, stop, [lambda: commit_now(db_url, "victim", [0], "heir")], False, None)
    check_log(topics, others)
    with topics.engine.connect() as conn:
        values = [
            bytes(v) for v in conn.execute(text("SELECT value FROM committed_records")).scalars()
        ]
    assert b"victim-0" not in values


def test_a_cleaner_stopped_moving_the_log_start_does_not_stall_the_partition(
    topics: Broker, db_url: str, stopped: list[Stopped], clients: list[object]
) -> None:
    """``kip98 topics clean`` stopped while retention moves a partition's log start (its
    row held FOR UPDATE): producers and offset commits of the partition go on."""
    admin = AdminClient({"database.url": db_url})
    clients.append(admin)
    resource = ConfigResource("topic", "t", {"retention.ms": "60000"})
    admin.alter_configs([resource])[resource].result()
    old = Producer({"database.url": db_url, "linger.ms": 0})
    clients.append(old)
    for i in range(10):
        old.produce("t", f"old-{i}".encode(), partition=0, timestamp=1_000 + i)
    assert old.flush(HANG_GUARD_S) == 0
    stop = start_stopping(db_url, "cleaner.in_log_start", *KIP98, "topics", "clean", "t")
    stopped.append(stop)
    waiters = [lambda: produce_now(db_url, [0], "other"), lambda: offset_commit_now(db_url)]
    others = _waited(topics, stop, waiters, False, None)
    stop.proc.send_signal(signal.SIGCONT)
    stop.proc.communicate(timeout=HANG_GUARD_S)  # it fails or finishes: either is fine
    check_log(topics, others)
