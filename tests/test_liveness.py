"""Pooled connections the server ended while they waited are given up at checkout, without
a round trip per request (``app.storage.liveness``); live ones are kept, and a connection
just made is handed out unchecked."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, event

from app.broker import Broker
from app.broker.produce import produce
from app.storage import liveness
from app.storage.liveness import closed_by_server
from tests.conftest import admin_conninfo
from tests.helpers.batches import produce_batch
from tests.helpers.identities import hand_out
from tests.test_idempotence_faults import terminate

PID = 7


# Its own broker fixture, not the shared one's marker: these tests need a pool that already
# holds one connection a request has used, whose backend they then end under it.
@pytest.fixture
def broker(make_broker: Callable[..., Broker]) -> Broker:
    """A broker whose pool holds one connection, used by a first produce."""
    b = make_broker(topics={"t": 1})
    hand_out(b, PID)
    assert produce(b, produce_batch("a", producer_id=PID, sequence=0)).error_code == 0
    return b


def pooled_backends(engine: Engine) -> list[int]:
    """The backend pids of the connections waiting in ``engine``'s pool."""
    with engine.connect() as conn:
        driver = conn.connection.driver_connection
        assert driver is not None
        return [driver.info.backend_pid]


def counting(engine: Engine, name: str) -> list[Any]:
    seen: list[Any] = []
    event.listen(engine, name, lambda *args: seen.append(args))
    return seen


def test_an_idle_connection_is_alive_until_its_backend_is_terminated(db_url: str) -> None:
    conninfo = admin_conninfo(db_url)
    with psycopg.connect(conninfo) as admin, psycopg.connect(conninfo) as idle:
        admin.autocommit = True
        idle.execute("SELECT 1").fetchall()
        idle.commit()
        assert not closed_by_server(idle)
        terminate(admin, idle.info.backend_pid)
        deadline = time.monotonic() + 10
        while not closed_by_server(idle):  # the backend's goodbye is on its way
            assert time.monotonic() < deadline, "a terminated backend's socket stayed quiet"
            time.sleep(0.01)


def test_a_terminated_pooled_backend_costs_a_reconnect_not_the_request(
    broker: Broker, db_url: str
) -> None:
    connects, invalidated = (
        counting(broker.engine, "connect"),
        counting(broker.engine, "invalidate"),
    )
    [backend] = pooled_backends(broker.engine)
    with psycopg.connect(admin_conninfo(db_url), autocommit=True) as admin:
        terminate(admin, backend)
    response = produce(broker, produce_batch("b", producer_id=PID, sequence=1))
    assert (response.error_code, response.base_offset) == (0, 1)
    # given up as a lost connection is (the ``invalidate`` event: what the process remembers
    # of partition rows is forgotten, rule 32), and one new connection made
    assert len(invalidated) == 1 and len(connects) == 1
    assert pooled_backends(broker.engine) != [backend]


def test_live_pooled_connections_are_kept(broker: Broker) -> None:
    connects, invalidated = (
        counting(broker.engine, "connect"),
        counting(broker.engine, "invalidate"),
    )
    for seq in range(1, 30):
        assert (
            produce(broker, produce_batch(str(seq), producer_id=PID, sequence=seq)).error_code == 0
        )
    assert connects == [] and invalidated == []


def test_a_connection_just_made_is_handed_out_unchecked(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As if the server ended every connection as it came (a loop of
    ``pg_terminate_backend``): the pooled one is given up, its replacement handed out
    unchecked. Checked too, the pool would try three and fail the checkout with an error
    that is not a lost connection, which no caller retries."""
    monkeypatch.setattr(liveness, "closed_by_server", lambda _connection: True)
    connects, invalidated = (
        counting(broker.engine, "connect"),
        counting(broker.engine, "invalidate"),
    )
    assert produce(broker, produce_batch("b", producer_id=PID, sequence=1)).error_code == 0
    assert len(connects) == 1 and len(invalidated) == 1
