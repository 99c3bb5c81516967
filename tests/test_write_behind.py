"""``storage.driver.WriteBehind``: a request's last writes sent together before COMMIT, and
a read after them in the same round trip."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import text

from app.broker import Broker
from app.storage.driver import WriteBehind


@pytest.fixture(autouse=True)
def wb(broker: Broker) -> None:
    """The table the tests' writes go to, empty."""
    with broker.engine.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS wb (n int)"))
        conn.execute(text("TRUNCATE wb"))


@pytest.mark.parametrize("writes", [0, 1, 3])
def test_a_read_after_the_writes_sees_them(broker: Broker, writes: int) -> None:
    """The read runs after every queued write, in the same DB transaction, and its first
    row is returned; the writes commit with the transaction."""
    queued = WriteBehind()
    with broker.engine.begin() as conn:
        for n in range(writes):
            queued.add("INSERT INTO wb VALUES (%(n)s)", {"n": n})
        row = queued.send(conn, ("SELECT count(*), %(tag)s FROM wb", {"tag": "after"}))
        assert row == (writes, "after")
        assert queued.send(conn) is None  # nothing queued any more, nothing read
    with broker.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM wb")).scalar_one() == writes


def test_a_failed_write_raises_before_the_read(broker: Broker) -> None:
    """A queued write that fails raises from ``send`` (the read is not run) and the DB
    transaction rolls back with every write."""
    queued = WriteBehind()
    with pytest.raises(psycopg.errors.DivisionByZero), broker.engine.begin() as conn:
        queued.add("INSERT INTO wb VALUES (1)", {})
        queued.add("INSERT INTO wb VALUES (1 / 0)", {})
        queued.send(conn, ("SELECT count(*) FROM wb", {}))
    with broker.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM wb")).scalar_one() == 0
