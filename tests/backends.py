"""Backends of the test database as a fault injector sees them: connecting to it beside
the application, finding the application's backend waiting for a lock, terminating it;
and the error a transport raises when its connection was lost."""

from __future__ import annotations

import time
from typing import Any

import psycopg
from sqlalchemy.exc import OperationalError

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


def lost_connection() -> OperationalError:
    """What SQLAlchemy raises when the server ended the connection under a request."""
    return OperationalError(
        "COMMIT", {}, psycopg.OperationalError("server closed the connection unexpectedly")
    )
