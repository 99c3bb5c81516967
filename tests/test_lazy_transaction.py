"""A request's DB transaction begun by its first statement (``storage.engine.lazy_transaction``).

The produce path takes its connection this way so that a batch on a remembered row, whose
one query string commits itself (docs/design.md §3.9), never starts SQLAlchemy's
transaction. These tests hold it to what ``engine.begin()`` promises otherwise: whatever
ran is committed at the end, rolled back on an exception, seen by SQLAlchemy's commit
events, and narrowed by a request's deadline from its first statement on (rule 24).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event, text

from app.broker import Broker
from app.broker.produce import produce
from app.coordinator.producer_id import init_producer_id
from app.log.topics import create_topic
from app.protocol import InitProducerIdRequest, ProduceRequest, RecordIn
from app.storage.driver import driver_connection, in_transaction
from app.storage.engine import get_engine, lazy_transaction
from app.storage.limits import request_deadline


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    engine = get_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS lazy_t (v int)"))
        conn.execute(text("TRUNCATE lazy_t"))
    yield engine
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE lazy_t"))


@pytest.fixture
def events(engine: Engine) -> Iterator[list[str]]:
    """The engine's begin and commit events from now on, in order."""
    seen: list[str] = []
    listeners = {name: (lambda *_, name=name: seen.append(name)) for name in ("begin", "commit")}
    for name, fn in listeners.items():
        event.listen(engine, name, fn)
    yield seen
    for name, fn in listeners.items():
        event.remove(engine, name, fn)


def _values(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT v FROM lazy_t ORDER BY v")).scalars())


def test_a_write_on_the_driver_is_committed_through_sqlalchemy(
    engine: Engine, events: list[str]
) -> None:
    with lazy_transaction(engine) as conn:
        driver_connection(conn).execute("INSERT INTO lazy_t VALUES (1)")
        assert events == []  # psycopg began its own; SQLAlchemy's is not started
    assert events == ["begin", "commit"]
    assert _values(engine) == [1]


def test_a_write_through_sqlalchemy_begins_and_commits_as_usual(
    engine: Engine, events: list[str]
) -> None:
    with lazy_transaction(engine) as conn:
        assert events == []
        conn.execute(text("INSERT INTO lazy_t VALUES (2)"))
        assert events == ["begin"]
        driver_connection(conn).execute("INSERT INTO lazy_t VALUES (3)")  # the same one
    assert events == ["begin", "commit"]
    assert _values(engine) == [2, 3]


@pytest.mark.parametrize("through", ["driver", "sqlalchemy"])
def test_an_exception_rolls_everything_back(engine: Engine, through: str) -> None:
    with pytest.raises(RuntimeError), lazy_transaction(engine) as conn:
        if through == "driver":
            driver_connection(conn).execute("INSERT INTO lazy_t VALUES (4)")
        else:
            conn.execute(text("INSERT INTO lazy_t VALUES (4)"))
        raise RuntimeError("the request failed")
    assert _values(engine) == []
    with engine.connect() as conn:  # the pool handed back a connection outside any transaction
        assert not in_transaction(conn)


def test_nothing_run_is_no_transaction(engine: Engine, events: list[str]) -> None:
    with lazy_transaction(engine) as conn:
        assert not in_transaction(conn)
    assert events == []


def test_a_deadline_narrows_the_first_statement_even_on_the_driver(
    engine: Engine, events: list[str]
) -> None:
    with request_deadline(time.monotonic() + 2.0), lazy_transaction(engine) as conn:
        assert events == ["begin"]  # begun at once, the bounds set before anything runs
        row = driver_connection(conn).execute("SHOW lock_timeout").fetchone()
    assert row is not None
    assert 0 < int(str(row[0]).removesuffix("ms")) <= 2000
    assert events == ["begin", "commit"]


def test_a_produce_on_a_remembered_row_starts_no_sqlalchemy_transaction(db_url: str) -> None:
    broker = Broker.connect(db_url)
    create_topic(broker, "lazy", 1)
    pid = init_producer_id(broker, InitProducerIdRequest(None, 60_000)).producer_id
    seen: list[Any] = []

    def begun(conn: Any) -> None:
        seen.append(conn)

    def batch(seq: int) -> ProduceRequest:
        return ProduceRequest("lazy", 0, [RecordIn(None, b"v", 0)], pid, 0, seq)

    assert produce(broker, batch(0)).base_offset == 0  # the lock's way: the row remembered
    event.listen(broker.engine, "begin", begun)
    try:
        assert produce(broker, batch(1)).base_offset == 1  # one query string, committed
    finally:
        event.remove(broker.engine, "begin", begun)
    assert seen == []
    with broker.engine.connect() as conn:
        count = conn.execute(text("SELECT count(*) FROM records WHERE topic = 'lazy'"))
        assert count.scalar_one() == 2
