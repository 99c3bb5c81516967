"""Every database session is bounded (docs/design.md rule 24).

The tests pause a real producer process with SIGSTOP while it holds a partition lock
inside its append's transaction, and check that the partition's other producers, their
commits and the coordinator's fencing go on once PostgreSQL ends the idle session, that
the paused process's transaction left nothing behind, and that it recovers when resumed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from app.broker import Broker
from app.client import KafkaException, Producer
from app.errors import KafkaError
from app.settings import BrokerSettings
from app.storage.engine import dispose_engines, get_engine
from app.storage.limits import request_deadline
from tests.helpers.backends import ActiveHolder, holding

ROOT = Path(__file__).resolve().parents[1]
IDLE_MS = 1_000  # the paused child's sessions are ended after this long idle in a transaction


pytestmark = pytest.mark.broker(topics={"t": 1})


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


@pytest.fixture
def paused_child(db_url: str, request: pytest.FixtureRequest) -> Iterator[subprocess.Popen[str]]:
    """The child, stopped by itself inside its first append (partition lock held)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "KIP98_STOP_AT": "append.after_copy",
        "KIP98_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS": str(IDLE_MS),
        "KIP98_CLIENT_COORDINATOR_LOOP": "0",
    }
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.children.paused_child", db_url, request.param],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while _state(child.pid) != "T":
            assert child.poll() is None, "the child exited before reaching its stop point"
            assert time.monotonic() < deadline, "the child never stopped"
            time.sleep(0.02)
        yield child
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)
            child.kill()
        child.wait()


def _resume(child: subprocess.Popen[str]) -> str:
    child.send_signal(signal.SIGCONT)
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 0, out
    return out.strip()


def _values(broker: Broker) -> list[str]:
    """Committed data records of t/0, in offset order (what read_committed may see)."""
    with broker.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT value FROM committed_records "
                "WHERE topic = 't' AND partition = 0 ORDER BY \"offset\""
            )
        )
        return [bytes(r.value).decode() for r in rows]


def _produce(producer: Producer, prefix: str) -> None:
    for i in range(5):
        producer.produce("t", value=f"{prefix}-{i}".encode(), partition=0)


@pytest.mark.parametrize("paused_child", ["idempotent"], indirect=True)
def test_a_paused_producer_does_not_stall_its_partition(
    broker: Broker, db_url: str, paused_child: subprocess.Popen[str], clients: list[object]
) -> None:
    other = Producer({"database.url": db_url, "linger.ms": 0})
    clients.append(other)
    _produce(other, "other")
    # Before the bound, this waited on the paused child's lock until the test's end.
    assert other.flush(60) == 0
    assert _values(broker) == [f"other-{i}" for i in range(5)]

    # Resumed, the child finds its session ended (its append rolled back) and sends the
    # batch again: written once, after the other producer's.
    assert _resume(paused_child) == "delivered 5"
    assert _values(broker) == [f"other-{i}" for i in range(5)] + [f"child-{i}" for i in range(5)]


@pytest.mark.parametrize("paused_child", ["idempotent"], indirect=True)
def test_a_paused_producer_does_not_stall_a_commit_on_its_partition(
    broker: Broker, db_url: str, paused_child: subprocess.Popen[str], clients: list[object]
) -> None:
    txn = Producer({"database.url": db_url, "transactional.id": "other", "linger.ms": 0})
    clients.append(txn)
    txn.init_transactions(60)
    txn.begin_transaction()
    _produce(txn, "txn")
    txn.commit_transaction(60)
    assert _values(broker) == [f"txn-{i}" for i in range(5)]
    assert _resume(paused_child) == "delivered 5"
    assert sorted(_values(broker)) == sorted(
        [f"txn-{i}" for i in range(5)] + [f"child-{i}" for i in range(5)]
    )


@pytest.mark.parametrize("paused_child", ["shared-id"], indirect=True)
def test_a_paused_transactional_producer_is_fenced_by_its_successor(
    broker: Broker, db_url: str, paused_child: subprocess.Popen[str], clients: list[object]
) -> None:
    successor = Producer({"database.url": db_url, "transactional.id": "shared-id"})
    clients.append(successor)
    successor.init_transactions(60)
    successor.begin_transaction()
    _produce(successor, "successor")
    successor.commit_transaction(60)

    # The zombie's rolled-back append is sent again and refused: it was fenced.
    assert _resume(paused_child) in ("failed PRODUCER_FENCED", "failed _FENCED")
    assert _values(broker) == [f"successor-{i}" for i in range(5)]
    with broker.engine.connect() as conn:
        states = conn.execute(text("SELECT count(*) FROM records WHERE value LIKE 'child-%'"))
        assert states.scalar_one() == 0


@pytest.mark.parametrize(
    ("mode", "waiting"),
    [
        ("markers", ("active", "Lock")),
        ("writes", ("active", "Lock")),
        ("read", ("active", "Lock")),
    ],
)
def test_a_process_paused_while_its_pipeline_waits_is_bounded(
    broker: Broker, db_url: str, mode: str, waiting: tuple[str, str]
) -> None:
    """PostgreSQL bounds a session idle in a transaction only once it has answered a Sync,
    and until the next message it reads. A process paused while a pipeline of its waits
    (the markers' lock, sent with the read behind it; a request's last writes, with or
    without a read after them) would
    leave, once the statements are done, a session that no timeout ends, holding its
    locks: each pipeline sends its Sync before waiting (``storage.driver``)."""
    # Held by an active session: the child's watch for stalled sessions leaves it be.
    holder = ActiveHolder(db_url, "SELECT 1 FROM partitions WHERE topic = 't' FOR UPDATE")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "KIP98_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS": str(IDLE_MS),
    }
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.children.pipeline_child", db_url, mode],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        backend = int(child.stdout.readline())
        with broker.engine.connect() as watcher:

            def activity() -> tuple[str, str | None] | None:
                row = watcher.execute(
                    text("SELECT state, wait_event_type FROM pg_stat_activity WHERE pid = :p"),
                    {"p": backend},
                ).one_or_none()
                watcher.rollback()  # a fresh snapshot of the statistics each time
                return None if row is None else (row[0], row[1])

            deadline = time.monotonic() + 30
            while activity() != waiting:
                assert time.monotonic() < deadline, f"the child never waited: {activity()}"
                time.sleep(0.02)
            child.send_signal(signal.SIGSTOP)
            holder.release()  # the paused child's statements run on, then its session idles
            deadline = time.monotonic() + 60
            while (now := activity()) is not None:
                assert time.monotonic() < deadline, f"the paused child's session lives on: {now}"
                time.sleep(0.05)
        # its locks went with it
        with broker.engine.begin() as conn:
            conn.execute(text("SET LOCAL lock_timeout = '15s'"))
            conn.execute(text("SELECT 1 FROM partitions WHERE topic = 't' FOR UPDATE"))
    finally:
        holder.close()
        child.send_signal(signal.SIGCONT)
        child.kill()
        child.wait()


def _bounds(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        shown = {
            name: conn.exec_driver_sql(f"SHOW {name}").scalar_one()
            for name in ("lock_timeout", "statement_timeout", "idle_in_transaction_session_timeout")
        }
        params = conn.connection.driver_connection.info.get_parameters()  # type: ignore[union-attr]
    shown.update({k: params.get(k, "") for k in ("keepalives_idle", "tcp_user_timeout")})
    return shown


def test_sessions_carry_the_configured_bounds(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIP98_DB_LOCK_TIMEOUT_MS", "1234")
    monkeypatch.setenv("KIP98_DB_STATEMENT_TIMEOUT_MS", "0")
    dispose_engines()
    assert _bounds(get_engine(db_url)) == {
        "lock_timeout": "1234ms",
        "statement_timeout": "0",
        "idle_in_transaction_session_timeout": "10s",
        "keepalives_idle": "10",
        "tcp_user_timeout": "30000",
    }
    # Settings given to a broker bound its own sessions, whatever the environment says.
    settings = BrokerSettings(db_lock_timeout_ms=4321, db_tcp_user_timeout_ms=7000)
    assert _bounds(Broker.connect(db_url, settings=settings).engine) == {
        "lock_timeout": "4321ms",
        "statement_timeout": "30s",
        "idle_in_transaction_session_timeout": "10s",
        "keepalives_idle": "10",
        "tcp_user_timeout": "7000",
    }


def test_a_request_deadline_narrows_the_bounds_of_its_transactions(db_url: str) -> None:
    engine = get_engine(db_url)
    with request_deadline(time.monotonic() + 2.0), engine.begin() as conn:
        lock_ms = int(conn.exec_driver_sql("SHOW lock_timeout").scalar_one().removesuffix("ms"))
    assert 0 < lock_ms <= 2000
    with engine.begin() as conn:  # outside the block, the session's own bound again
        assert conn.exec_driver_sql("SHOW lock_timeout").scalar_one() == "20s"


def test_a_lock_wait_past_the_deadline_is_a_retriable_timeout(
    broker: Broker, db_url: str, clients: list[object]
) -> None:
    """commit_transaction(timeout) honours its timeout even while another session holds the
    partition: the caller gets a retriable timeout, and a retry commits once it is free."""
    txn = Producer({"database.url": db_url, "transactional.id": "waiter", "linger.ms": 0})
    clients.append(txn)
    txn.init_transactions(60)
    txn.begin_transaction()
    _produce(txn, "waiter")
    assert txn.flush(60) == 0
    # Held by an active session, so no bound ends it before the commit's deadline does.
    with holding(db_url, "SELECT 1 FROM partitions WHERE topic = 't' FOR UPDATE"):
        with pytest.raises(KafkaException) as caught:
            txn.commit_transaction(1.0)
        assert caught.value.args[0].retriable()
        assert caught.value.args[0].code() == KafkaError._TIMED_OUT
    txn.commit_transaction(60)
    assert _values(broker) == [f"waiter-{i}" for i in range(5)]


@pytest.mark.parametrize("raw", ["ten", "-5", "1.5"], ids=["word", "negative", "fraction"])
def test_a_bad_bound_is_named(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIP98_DB_LOCK_TIMEOUT_MS", raw)
    with pytest.raises(KafkaException) as caught:
        BrokerSettings.from_env()
    assert caught.value.args[0].code() == KafkaError._INVALID_ARG
    assert "KIP98_DB_LOCK_TIMEOUT_MS" in caught.value.args[0].str()
