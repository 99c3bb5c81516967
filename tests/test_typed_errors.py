"""Every public call raises only KafkaException (docs/design.md rule 25): a database that
was never migrated, a role missing a privilege, a conflict that outlasted its retries and
an unreachable server all reach applications with a Kafka code and flags, the driver's
error kept as the cause."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from app.admin import AdminClient, NewTopic
from app.broker import Broker
from app.client.consumer import Consumer
from app.client.message import TopicPartition
from app.client.producer import Producer
from app.errors import KafkaError, KafkaException
from app.protocol import InitProducerIdRequest
from app.security.roles import apply_roles
from app.storage.engine import MAX_ATTEMPTS, dispose_engines, retry_conflicts
from app.storage.errors import kafka_error, meaning
from tests.conftest import admin_conninfo, with_database
from tests.helpers.cli_runner import run_kip98


@pytest.fixture
def unmigrated_url(server_url: str) -> Iterator[str]:
    """An empty database on the same server: reachable, but without kip98's schema."""
    name = f"kip98_bare_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_conninfo(server_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield with_database(server_url, name)
    dispose_engines()
    with psycopg.connect(admin_conninfo(server_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _raised(call: Callable[[], Any]) -> KafkaException:
    with pytest.raises(KafkaException) as info:
        call()
    return info.value


def _is_unmigrated(exc: KafkaException) -> None:
    assert exc.error.code() == KafkaError._NOT_CONFIGURED, exc
    assert exc.error.fatal() and not exc.error.retriable()
    assert "kip98 db migrate" in exc.error.str()
    assert isinstance(exc.__cause__, DBAPIError | psycopg.Error)


# ------------------------------------------------------------------ the mapping, pure


@pytest.mark.parametrize(
    ("sqlstate", "lost", "code", "retriable", "fatal"),
    [
        (None, True, KafkaError._TRANSPORT, True, False),
        ("08006", True, KafkaError._TRANSPORT, True, False),
        ("57P01", True, KafkaError._TRANSPORT, True, False),
        ("57P03", True, KafkaError._TRANSPORT, True, False),
        ("53300", True, KafkaError._TRANSPORT, True, False),
        ("40001", True, KafkaError.REQUEST_TIMED_OUT, True, False),
        ("40P01", True, KafkaError.REQUEST_TIMED_OUT, True, False),
        ("55P03", True, KafkaError._TIMED_OUT, True, False),
        ("57014", True, KafkaError._TIMED_OUT, True, False),
        ("25P03", True, KafkaError._TIMED_OUT, True, False),
        ("42501", False, KafkaError.CLUSTER_AUTHORIZATION_FAILED, False, True),
        ("42P01", False, KafkaError._NOT_CONFIGURED, False, True),
        ("42703", False, KafkaError._NOT_CONFIGURED, False, True),
        ("28P01", True, KafkaError._AUTHENTICATION, False, True),
        ("23505", False, KafkaError.UNKNOWN_SERVER_ERROR, False, False),
        (None, False, KafkaError.UNKNOWN_SERVER_ERROR, False, False),
    ],
)
def test_each_sqlstate_has_one_meaning(
    sqlstate: str | None, lost: bool, code: int, retriable: bool, fatal: bool
) -> None:
    m = meaning(sqlstate, lost)
    assert (m.code, m.retriable, m.fatal) == (code, retriable, fatal)


def test_anything_but_a_database_error_is_left_alone() -> None:
    assert kafka_error(ValueError("x")) is None


def test_a_conflict_that_outlasts_its_retries_is_retriable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("app.storage.engine.time.sleep", lambda _s: None)
    attempts = []

    @retry_conflicts
    def always_conflicting() -> None:
        attempts.append(1)
        raise pg_errors.SerializationFailure("could not serialize access")

    with pytest.raises(psycopg.Error) as info:
        always_conflicting()
    assert len(attempts) == MAX_ATTEMPTS
    error = kafka_error(info.value)
    assert error is not None
    assert error.code() == KafkaError.REQUEST_TIMED_OUT and error.retriable()


# ------------------------------------------------------------------ a database never migrated


def test_an_unmigrated_database_is_named_by_the_producer(unmigrated_url: str) -> None:
    # An idempotent producer asks for its producer id as it is made.
    _is_unmigrated(_raised(lambda: Producer({"database.url": unmigrated_url})))
    config = {"database.url": unmigrated_url, "enable.idempotence": False}
    with Producer(config) as producer:
        _is_unmigrated(_raised(lambda: producer.produce("t", b"v")))


def test_an_unmigrated_database_is_named_by_init_transactions(unmigrated_url: str) -> None:
    producer = Producer({"database.url": unmigrated_url, "transactional.id": "tx"})
    try:
        _is_unmigrated(_raised(lambda: producer.init_transactions(5)))
    finally:
        producer.close()


def test_an_unmigrated_database_is_named_by_the_consumer(unmigrated_url: str) -> None:
    consumer = Consumer({"database.url": unmigrated_url, "group.id": "g"})
    try:
        _is_unmigrated(_raised(lambda: consumer.committed([TopicPartition("t", 0)], 5)))
        _is_unmigrated(_raised(lambda: consumer.get_watermark_offsets(TopicPartition("t", 0), 5)))
        consumer.assign([TopicPartition("t", 0, 0)])
        _is_unmigrated(_raised(lambda: consumer.poll(1)))
    finally:
        consumer.close()


def test_an_unmigrated_database_is_named_by_a_subscribed_consumer(unmigrated_url: str) -> None:
    consumer = Consumer({"database.url": unmigrated_url, "group.id": "g"})
    try:
        consumer.subscribe(["t"])
        _is_unmigrated(_raised(lambda: consumer.poll(1)))
    finally:
        consumer.close()


def test_an_unmigrated_database_is_named_by_the_admin_client(unmigrated_url: str) -> None:
    with AdminClient({"database.url": unmigrated_url}) as admin:
        _is_unmigrated(_raised(admin.list_topics))
        _is_unmigrated(_raised(admin.list_transactions))
        _is_unmigrated(_raised(lambda: admin.list_consumer_group_offsets("g")))
        _is_unmigrated(_raised(lambda: admin.find_hanging_transactions()))
        _is_unmigrated(_raised(lambda: admin.describe_producers([TopicPartition("t", 0)])))
        # Calls answering with futures put the exception in the future, as confluent-kafka.
        future = admin.create_topics([NewTopic("t", 1)])["t"]
        _is_unmigrated(_raised(future.result))


def test_the_cli_names_an_unmigrated_database_in_one_line(unmigrated_url: str) -> None:
    result = run_kip98("topics", "list", env={"KIP98_DATABASE_URL": unmigrated_url})
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "kip98 db migrate" in lines[0]


# ------------------------------------------------------------------ a privilege missing


@pytest.fixture
def bare_role_url(db_url: str) -> Iterator[str]:
    """A login role of the migrated database that was granted nothing."""
    engine = create_engine(db_url)
    name = f"kip98_test_bare_{uuid.uuid4().hex[:10]}"
    with engine.begin() as conn:
        apply_roles(conn)
        conn.execute(text(f"CREATE ROLE {name} LOGIN"))
    yield make_url(db_url).set(username=name, password=None).render_as_string(hide_password=False)
    dispose_engines()
    with engine.begin() as conn:
        conn.execute(text(f"DROP OWNED BY {name}"))
        conn.execute(text(f"DROP ROLE IF EXISTS {name}"))
    engine.dispose()


def test_a_missing_privilege_is_fatal_and_says_so(bare_role_url: str) -> None:
    exc = _raised(lambda: Producer({"database.url": bare_role_url}))
    assert exc.error.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert exc.error.fatal() and not exc.error.retriable()
    assert "privilege" in exc.error.str()
    with AdminClient({"database.url": bare_role_url}) as admin:
        future = admin.create_topics([NewTopic("t", 1)])["t"]
        assert _raised(future.result).error.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED


# ------------------------------------------------------------------ the server unreachable


def _closed_port_url(db_url: str) -> str:
    return make_url(db_url).set(host="127.0.0.1", port=1).render_as_string(hide_password=False)


def test_an_unreachable_database_is_a_retriable_transport_error(db_url: str) -> None:
    url = _closed_port_url(db_url)
    config = {"database.url": url, "request.timeout.ms": 300, "enable.idempotence": False}
    with Producer(config) as producer:
        exc = _raised(lambda: producer.produce("t", b"v"))
    assert exc.error.code() == KafkaError._TRANSPORT and exc.error.retriable()
    consumer = Consumer({"database.url": url, "group.id": "g", "request.timeout.ms": 300})
    try:
        exc = _raised(lambda: consumer.get_watermark_offsets(TopicPartition("t", 0), 0.3))
        assert exc.error.retriable()
    finally:
        consumer.close()


def test_the_coordinator_loop_against_an_unreachable_database_fails_in_one_line(
    db_url: str,
) -> None:
    result = run_kip98(
        "coordinator", "run", "--once", env={"KIP98_DATABASE_URL": _closed_port_url(db_url)}
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr


# ------------------------------------------------------------------ mid-transaction


def test_a_commit_that_meets_a_database_error_raises_kafka_exception(db_url: str) -> None:
    with AdminClient({"database.url": db_url}) as admin:
        admin.create_topics([NewTopic("t", 1)])["t"].result()
    producer = Producer({"database.url": db_url, "transactional.id": "tx"})
    engine = create_engine(db_url)
    try:
        producer.init_transactions(60)
        producer.begin_transaction()
        producer.produce("t", b"v")
        assert producer.flush(60) == 0
        # The schema changed under a running producer (a downgrade, a restore gone wrong).
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE transaction_log RENAME TO transaction_log_moved"))
        exc = _raised(lambda: producer.commit_transaction(10))
        assert exc.error.code() == KafkaError._NOT_CONFIGURED
        assert isinstance(exc.__cause__, DBAPIError | psycopg.Error)
    finally:
        with engine.begin() as conn:
            conn.execute(
                text("ALTER TABLE IF EXISTS transaction_log_moved RENAME TO transaction_log")
            )
        producer.close()
        engine.dispose()


def test_init_producer_id_retries_a_conflict_in_one_loop(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conflicting InitProducerId is re-run MAX_ATTEMPTS times in all, not once per
    nested retry loop (which made 8 x 8)."""
    calls: list[int] = []

    def conflicting(_conn: object, _tid: str) -> None:
        calls.append(1)
        raise pg_errors.SerializationFailure("could not serialize access")

    monkeypatch.setattr("app.coordinator.handlers.load_for_update", conflicting)
    monkeypatch.setattr("app.storage.engine.time.sleep", lambda _s: None)
    with pytest.raises(psycopg.Error):
        Broker.connect(db_url).handle(InitProducerIdRequest("tx", 60_000))
    assert len(calls) == MAX_ATTEMPTS
