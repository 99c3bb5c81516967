"""Backends of the test database as a fault injector sees them: connecting to it beside
the application, finding the application's backend waiting for a lock, terminating it,
holding a lock from a session of its own; and the error a transport raises when its
connection was lost."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import psycopg
from sqlalchemy.exc import OperationalError

from app.settings import BrokerSettings
from app.storage.driver import libpq_conninfo


def conninfo(db_url: str) -> str:
    """The test database, under a name no application of the tests uses."""
    return libpq_conninfo(db_url, application_name="fault-injector")


def wait_for_blocked_backend(admin: psycopg.Connection[Any], app: str, query_like: str) -> int:
    """The pid of the client's backend once it waits for a lock in a matching statement."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s "
            "AND wait_event_type = 'Lock' AND query ILIKE %s",
            (app, query_like),
        ).fetchone()
        if row is not None:
            return int(row[0])
        time.sleep(0.01)
    raise AssertionError(f"no backend of {app} blocked on {query_like}")


def terminate(admin: psycopg.Connection[Any], pid: int) -> None:
    """Terminate a backend and wait until it is gone (the signal is handled asynchronously)."""
    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if (
            admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
            is None
        ):
            return
        time.sleep(0.01)
    raise AssertionError(f"backend {pid} survived pg_terminate_backend")


class ActiveHolder:
    """A session that runs ``statement`` and then sleeps inside the same transaction, so it
    holds whatever the statement locked (or wrote, uncommitted) until :meth:`release`.

    It stays *active* (in ``pg_sleep``) all the while, never idle in its transaction: no
    idle bound of PostgreSQL's, and no waiter's watch for sessions stalled by their client
    (``app.storage.stalls``), ever ends it, however long the test takes before letting go.
    Releasing cancels the sleep, which aborts the transaction: its locks are freed and
    anything it wrote is rolled back."""

    def __init__(self, db_url: str, statement: str) -> None:
        self._conn = psycopg.connect(
            libpq_conninfo(db_url, application_name="lock-holder"),
            autocommit=True,  # the query string below is one implicit transaction
            options="-c statement_timeout=0 -c lock_timeout=0"
            " -c idle_in_transaction_session_timeout=0",
        )
        self._admin = psycopg.connect(conninfo(db_url), autocommit=True)
        self.pid = self._conn.info.backend_pid
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._hold, args=(f"{statement}; SELECT pg_sleep(86400)",), daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self._sleeping():
            if not self._thread.is_alive():
                raise AssertionError(f"the holder's statement failed: {self._error!r}")
            assert time.monotonic() < deadline, "the holder never took its lock"
            time.sleep(0.01)

    def _hold(self, query: str) -> None:
        try:
            self._conn.execute(query)  # no parameters: one simple query, both statements
        except psycopg.errors.QueryCanceled:
            pass
        except BaseException as exc:  # reported by __init__ or release
            self._error = exc

    def _sleeping(self) -> bool:
        row = self._admin.execute(
            "SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (self.pid,)
        ).fetchone()
        return row is not None and row[0] == "PgSleep"

    def release(self) -> None:
        """Cancel the sleep: the transaction aborts, its locks go, its writes are undone."""
        if self._thread.is_alive():
            self._admin.execute("SELECT pg_cancel_backend(%s)", (self.pid,))
            self._thread.join(60)
        assert not self._thread.is_alive(), "the holder's sleep outlived its cancel"
        assert self._error is None, self._error

    def close(self) -> None:
        try:
            self.release()
        finally:
            self._conn.close()
            self._admin.close()


@contextmanager
def holding(db_url: str, statement: str) -> Iterator[ActiveHolder]:
    """An :class:`ActiveHolder` of ``statement``'s locks, released at the latest on exit."""
    holder = ActiveHolder(db_url, statement)
    try:
        yield holder
    finally:
        holder.close()


def idle_unbounded(settings: BrokerSettings) -> BrokerSettings:
    """``settings`` whose sessions may idle in a transaction for ever, and whose waiting
    connections end no session stalled by its client (``app.storage.stalls``): for a test
    that holds a lock in a transaction of its own, which must COMMIT what it wrote, while
    a request of the same settings waits for it, however long the test takes meanwhile."""
    return replace(settings, db_idle_in_transaction_timeout_ms=0)


def lost_connection() -> OperationalError:
    """What SQLAlchemy raises when the server ended the connection under a request."""
    return OperationalError(
        "COMMIT", {}, psycopg.OperationalError("server closed the connection unexpectedly")
    )
