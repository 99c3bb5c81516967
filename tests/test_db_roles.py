"""The database-level protection: a client logged in as a member of ``kip98_client`` can
produce, consume and run transactions, while PostgreSQL itself refuses what the handlers
never do (deleting records, DDL, changing ACLs) — whatever the client's code tries."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import errors
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from app.admin import AdminClient, NewTopic
from app.broker import Broker
from app.broker.loop import CoordinatorLoop
from app.client.consumer import Consumer
from app.client.producer import Producer
from app.security.roles import apply_roles
from app.settings import BrokerSettings
from app.storage.driver import libpq_conninfo
from app.storage.engine import dispose_engines


def _as_role(url: str, role: str) -> str:
    return make_url(url).set(username=role, password=None).render_as_string(hide_password=False)


@pytest.fixture
def login_roles(db_url: str) -> Iterator[dict[str, str]]:
    """Roles applied to the test database, plus one login role in each group (URLs)."""
    engine = create_engine(db_url)
    suffix = uuid.uuid4().hex[:10]
    names = {"client": f"kip98_test_client_{suffix}", "admin": f"kip98_test_admin_{suffix}"}
    with engine.begin() as conn:
        apply_roles(conn)
        apply_roles(conn)  # idempotent
        for group, name in names.items():
            conn.execute(text(f"CREATE ROLE {name} LOGIN IN ROLE kip98_{group}"))
    try:
        yield {group: _as_role(db_url, name) for group, name in names.items()}
    finally:
        dispose_engines()
        with engine.begin() as conn:
            for name in names.values():
                conn.execute(text(f"DROP ROLE IF EXISTS {name}"))
        engine.dispose()


def test_a_client_role_can_do_what_clients_do(login_roles: dict[str, str]) -> None:
    with AdminClient({"database.url": login_roles["admin"]}) as admin:
        admin.create_topics([NewTopic("orders", 2)])["orders"].result()

    client = {"database.url": login_roles["client"]}
    producer = Producer({**client, "transactional.id": "shop"})
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce("orders", b"paid", key=b"k")
    producer.commit_transaction(60)
    producer.begin_transaction()
    producer.produce("orders", b"void", key=b"k")
    producer.abort_transaction(60)
    producer.close()
    with Producer(client) as plain:
        plain.produce("orders", b"idempotent", key=b"k")
        assert plain.flush(60) == 0

    consumer = Consumer({**client, "group.id": "g", "auto.offset.reset": "earliest"})
    consumer.subscribe(["orders"])
    values = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        msg = consumer.poll(0.1)
        if msg is not None and msg.error() is None:
            values.append(msg.value())
            consumer.commit(msg, asynchronous=False)
        if len(values) == 2:
            break
    consumer.close()
    assert values == [b"paid", b"idempotent"]


def test_only_the_admin_role_cleans_the_log(login_roles: dict[str, str]) -> None:
    """Removing records is an admin's right: a client's coordinator loop finds it may not
    clean and leaves it to ``kip98 coordinator run`` under an admin login."""
    with AdminClient({"database.url": login_roles["admin"]}) as admin:
        admin.create_topics([NewTopic("old", 1, config={"retention.ms": 1})])["old"].result()
    with Producer({"database.url": login_roles["client"]}) as p:
        p.produce("old", b"v", key=b"k", timestamp=1_000)
        assert p.flush(60) == 0
    settings = BrokerSettings(log_cleaner_interval_ms=1, transaction_log_partitions=1)
    client_loop = CoordinatorLoop(Broker.connect(login_roles["client"], settings=settings))
    time.sleep(0.01)
    try:
        assert client_loop.run_once().cleaned_records == 0
        assert not client_loop.cleaning_allowed
    finally:
        client_loop.release_leases()
    admin_loop = CoordinatorLoop(Broker.connect(login_roles["admin"], settings=settings))
    time.sleep(0.01)
    try:
        assert admin_loop.run_once().cleaned_records == 1
    finally:
        admin_loop.release_leases()


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM records",
        "TRUNCATE records",
        "UPDATE records SET value = NULL",
        "DELETE FROM transaction_log",
        "DELETE FROM offset_commit_log",
        "DROP TABLE records",
        "ALTER TABLE records ADD COLUMN x int",
        "CREATE TABLE evil (x int)",
        "UPDATE acls SET permission = 'allow'",
        "INSERT INTO acls VALUES ('User:eve', 'cluster', 'kafka-cluster', 'literal', 'all', 'allow')",
        "INSERT INTO topics (topic, num_partitions, created_ms) VALUES ('x', 1, 0)",
        "SELECT stored_key FROM sasl_users",  # not even read: no offline guessing
        "DELETE FROM sasl_users",
    ],
)
def test_postgresql_refuses_what_clients_never_do(
    login_roles: dict[str, str], statement: str
) -> None:
    with (
        psycopg.connect(libpq_conninfo(login_roles["client"])) as conn,
        pytest.raises(errors.InsufficientPrivilege),
    ):
        conn.execute(statement)


def test_the_admin_role_may_change_rows_but_not_the_schema(login_roles: dict[str, str]) -> None:
    with psycopg.connect(libpq_conninfo(login_roles["admin"])) as conn:
        conn.execute("DELETE FROM acls")
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("DROP TABLE records")
