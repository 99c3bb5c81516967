"""Sessions that hold locks while their stopped client keeps them waiting are ended by
the sessions they block (docs/design.md rule 34).

PostgreSQL bounds a session that idles inside a transaction
(``idle_in_transaction_session_timeout``), but not one that waits on its client *inside*
a statement: a ``COPY ... FROM STDIN`` waiting for its data, a pipeline not yet synced.
A process stopped there (SIGSTOP, a debugger, a frozen VM, a throttled container) holds
whatever its statement locked, and no timeout of the server's, no keepalive (the
stopped process's kernel still answers) and no lock timeout of the waiters (they fail and
retry into the same wall) ever frees it. kip98 writes a request's rows with a COPY after
taking the partition's lock (docs/design.md §3.1, §3.9), so such a stop would hold the
partition until the process ran again.

So the waiting side ends it: in every process, each engine kip98 makes is watched, and
when one of its connections has been out of the pool for longer than a tick, a watchdog
thread asks PostgreSQL which sessions block that connection's backend and have waited
on their client longer than the bound (the same one as idle in a transaction,
``KIP98_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS``). A session seen so at two checks in a row,
its wait unchanged between them (the same statement, not a byte more of COPY data), is
ended (``pg_terminate_backend``). Its transaction rolls back; its process, when it runs
again, finds its connection lost, a retriable error, and retries what it had in flight,
which every request tolerates (docs/design.md rule 4). The waiter's own statement then
takes the lock and goes on: it finishes within the bound and two ticks, long before its
lock timeout.

Nothing of this runs on a request's path but two dictionary writes at checkout and
check-in; the watchdog queries only while a connection is out longer than a tick.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from sqlalchemy import Engine, event

from app.settings import BrokerSettings
from app.storage import watchdog
from app.storage.driver import libpq_conninfo
from app.storage.stall_sql import END_STALLED, STALLED_BLOCKERS

log = logging.getLogger(__name__)

# The checks' period: a quarter of the bound, between 50 ms and a second.
MAX_TICK_S = 1.0
MIN_TICK_S = 0.05

# Set on a connection record when its connection is made: its backend's pid.
_PID = "kip98_backend_pid"


@dataclass(frozen=True)
class Stalled:
    """One sighting of a session that blocks one of ours while it waits on its client."""

    pid: int
    since: datetime  # its statement's start while active, the start of its idleness else
    copy_bytes: int | None  # the COPY data it has read, if it is in a COPY
    state: str
    application_name: str
    query: str


def to_end(before: Mapping[int, Stalled], now: Iterable[Stalled]) -> list[Stalled]:
    """The sessions to end: seen at the check before and now, waiting on the same thing
    (the same statement or idleness, no more COPY data read). A slow client that goes on
    sending keeps its session; a session past the bound at one check only is given one
    more tick, in which a merely slow client shows progress."""
    return [
        s
        for s in now
        if (b := before.get(s.pid)) is not None
        and b.since == s.since
        and b.copy_bytes == s.copy_bytes
    ]


def tick_seconds(bound_ms: int) -> float:
    """How often a watched engine's busy connections are looked at."""
    return min(MAX_TICK_S, max(MIN_TICK_S, bound_ms / 4000))


class _Watched:
    """One engine's connections out of the pool, and the sessions seen blocking them;
    looked at every tick by the process's watchdog (``storage.watchdog``) for as long as
    the engine lives."""

    def __init__(self, engine: Engine, bound_ms: int) -> None:
        self.engine = weakref.ref(engine)
        self.bound_ms = bound_ms
        self.tick_s = tick_seconds(bound_ms)
        self.next_at = 0.0  # the first look at once
        self.conninfo = libpq_conninfo(
            engine.url.render_as_string(hide_password=False), application_name="kip98-stalls"
        )
        self.out: dict[int, tuple[int, float]] = {}  # id(record) -> (backend pid, since)
        self.seen: dict[int, Stalled] = {}

    def due(self, now: float) -> float | None:
        return None if self.engine() is None else self.next_at

    def tend(self, now: float) -> None:
        self.next_at = now + self.tick_s
        try:
            self.check(now)
        except Exception as exc:  # the database away, the functions not installed
            self.seen = {}
            log.debug("stalled-session check failed: %s", exc)

    def waiting(self, now: float) -> list[int]:
        """The backends of connections out of the pool for longer than a tick."""
        return [pid for pid, since in list(self.out.values()) if pid and now - since >= self.tick_s]

    def check(self, now: float) -> None:
        waiters = self.waiting(now)
        if not waiters:
            self.seen = {}
            return
        params: dict[str, Any] = {"waiters": waiters, "stalled_ms": self.bound_ms}
        with psycopg.connect(
            self.conninfo,
            autocommit=True,
            connect_timeout=5,
            options="-c statement_timeout=5000 -c lock_timeout=1000",
        ) as conn:
            sightings = [Stalled(*row) for row in conn.execute(STALLED_BLOCKERS, params)]
            for stalled in to_end(self.seen, sightings):
                end = {**params, "pid": stalled.pid, "since": stalled.since}
                end["copy_bytes"] = stalled.copy_bytes
                ended = conn.execute(END_STALLED, end).fetchone()
                if ended is not None and ended[0]:
                    log.warning(
                        "ended session %d (%s, %r, %s since %s): it held locks others wait"
                        " for while it waited on its client past %d ms",
                        stalled.pid,
                        stalled.state,
                        stalled.application_name,
                        stalled.query,
                        stalled.since.isoformat(),
                        self.bound_ms,
                    )
        self.seen = {s.pid: s for s in sightings}


def watch_stalls(engine: Engine, settings: BrokerSettings) -> Engine:
    """Let ``engine``'s waiting connections end the sessions that stall them (the bound:
    ``settings.db_idle_in_transaction_timeout_ms``; 0 watches nothing)."""
    if settings.db_idle_in_transaction_timeout_ms == 0:
        return engine
    watched = _Watched(engine, settings.db_idle_in_transaction_timeout_ms)

    @event.listens_for(engine, "connect")
    def _made(dbapi_connection: Any, record: Any) -> None:
        record.info[_PID] = dbapi_connection.info.backend_pid

    @event.listens_for(engine, "checkout")
    def _out(_dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        watched.out[id(record)] = (record.info.get(_PID, 0), time.monotonic())

    @event.listens_for(engine, "checkin")
    def _in(_dbapi_connection: Any, record: Any) -> None:
        watched.out.pop(id(record), None)

    watchdog.current().add(watched)
    return engine
