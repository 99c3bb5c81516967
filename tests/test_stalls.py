"""Which sessions the waiting side ends (docs/design.md rule 34): only one seen waiting on
its client at two checks in a row with nothing moved between them; a slow client that
goes on sending keeps its session, however long its statement runs."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.broker import Broker
from app.client import Producer
from app.log.topics import create_topic
from app.storage.stalls import MAX_TICK_S, MIN_TICK_S, Stalled, tick_seconds, to_end
from tests.helpers.backends import conninfo

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _seen(pid: int, since: datetime = T0, copy_bytes: int | None = None) -> Stalled:
    return Stalled(pid, since, copy_bytes, "active", "app", "COPY records")


def test_a_session_is_ended_only_when_seen_twice_unchanged() -> None:
    before = {1: _seen(1), 2: _seen(2, copy_bytes=100), 3: _seen(3), 4: _seen(4)}
    now = [
        _seen(1),  # the same wait: ended
        _seen(2, copy_bytes=164),  # its COPY read more since: a slow client, kept
        _seen(3, since=T0 + timedelta(seconds=1)),  # another statement since: kept
        _seen(5),  # first seen now: kept, for one more tick
    ]
    assert [s.pid for s in to_end(before, now)] == [1]
    assert to_end({}, now) == []


@given(
    st.lists(st.tuples(st.integers(1, 5), st.integers(0, 2), st.none() | st.integers(0, 3))),
    st.lists(st.tuples(st.integers(1, 5), st.integers(0, 2), st.none() | st.integers(0, 3))),
)
def test_to_end_is_exactly_the_unchanged_repeat_sightings(
    before_raw: list[tuple[int, int, int | None]], now_raw: list[tuple[int, int, int | None]]
) -> None:
    before = {pid: _seen(pid, T0 + timedelta(seconds=s), b) for pid, s, b in before_raw}
    now = [_seen(pid, T0 + timedelta(seconds=s), b) for pid, s, b in now_raw]
    ended = to_end(before, now)
    assert all(s in now and before[s.pid] == s for s in ended)
    assert [s for s in now if s.pid in before and before[s.pid] == s] == ended


@pytest.mark.parametrize("bound_ms", [1, 200, 1_000, 10_000, 600_000])
def test_the_tick_is_a_quarter_of_the_bound_within_limits(bound_ms: int) -> None:
    assert MIN_TICK_S <= tick_seconds(bound_ms) <= MAX_TICK_S
    assert tick_seconds(bound_ms) <= max(MIN_TICK_S, bound_ms / 4000)


def test_a_slow_copy_that_goes_on_sending_is_not_ended(
    db_url: str, monkeypatch: pytest.MonkeyPatch, clients: list[object]
) -> None:
    """A session holding a partition's row lock inside a COPY whose client sends a line
    every twentieth of a second, for longer than the bound, while a producer of that
    partition waits: the COPY ends as its client ends it, then the producer goes on.
    (Each line is longer than psycopg's copy buffer, so each goes to the server at once.)
    The client sends forty times a tick (two seconds here): only a pause of this thread
    or of the server forty times longer than its own cadence would look like a stop."""
    bound_ms = 8_000
    monkeypatch.setenv("KIP98_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS", str(bound_ms))
    monkeypatch.setenv("KIP98_DB_LOCK_TIMEOUT_MS", "600000")
    create_topic(Broker.connect(db_url), "t", 1)
    waiter = Producer({"database.url": db_url, "linger.ms": 0})
    clients.append(waiter)
    with psycopg.connect(conninfo(db_url)) as holder:
        holder.execute("CREATE TEMP TABLE sink (line text)")
        # Idle in its transaction only from here to the COPY's start, a moment.
        holder.execute("SELECT 1 FROM partitions WHERE topic = 't' FOR UPDATE")
        delivered = threading.Event()
        waiter.produce("t", b"after", on_delivery=lambda err, _m: err or delivered.set())
        flushing = threading.Thread(target=lambda: waiter.flush(120))
        flushing.start()
        sent = 0
        with holder.cursor().copy("COPY sink FROM STDIN") as copy:
            end = time.monotonic() + 1.5 * bound_ms / 1000
            while time.monotonic() < end:  # the length of the slow COPY, not an assertion
                copy.write(f"{sent} {'x' * 40_000}\n")
                sent += 1
                time.sleep(0.05)
                assert not delivered.is_set(), "the producer went before the holder let go"
        assert holder.execute("SELECT count(*) FROM sink").fetchone() == (sent,)
        holder.commit()
        flushing.join(120)
    assert delivered.is_set()
