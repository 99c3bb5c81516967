"""Bounds on every database session, and on one request's transaction (docs/design.md rule 24).

The broker runs inside its clients' processes, so a client that is paused (SIGSTOP, a
debugger, a long GC, a laptop lid) or whose host vanished may hold a partition lock in an
open transaction. Without bounds, every producer of that partition, its EndTxn and the
coordinator's fence-abort wait for as long as the operating system takes to notice. So
each session PostgreSQL serves us carries:

- ``idle_in_transaction_session_timeout``: the server ends a session left idle inside a
  transaction, rolling it back and releasing its locks (the paused process);
- ``lock_timeout`` and ``statement_timeout``: no wait and no statement outlives a request;
- TCP keepalives and ``tcp_user_timeout``: a peer that is gone is noticed by both ends;
- ``connect_timeout``: a host that does not answer is given up for the next one.

A caller with its own deadline (``commit_transaction(timeout)``) narrows the lock and
statement bounds of the transactions it starts with :func:`request_deadline`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from sqlalchemy import Connection, Engine, event

from app.settings import BrokerSettings

# Seconds of idleness before the first probe, between probes, and probes before giving up.
_KEEPALIVE = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5}
_KEEPALIVE_COUNT = 3
# Seconds a connection attempt waits for a host that does not answer (a machine gone
# without a word) before moving on to the next host of a replicated database's URL;
# libpq's own default is to wait for the operating system, minutes.
CONNECT_TIMEOUT_S = 5

_deadline: ContextVar[float | None] = ContextVar("kip98_request_deadline", default=None)
_answer_by: ContextVar[float | None] = ContextVar("kip98_answer_by", default=None)


def session_options(settings: BrokerSettings) -> dict[str, int]:
    """The server settings every session starts with (0 lifts one, as in PostgreSQL)."""
    return {
        "lock_timeout": settings.db_lock_timeout_ms,
        "statement_timeout": settings.db_statement_timeout_ms,
        "idle_in_transaction_session_timeout": settings.db_idle_in_transaction_timeout_ms,
    }


def connect_args(settings: BrokerSettings) -> dict[str, Any]:
    """libpq connection arguments carrying the bounds; merged into an engine's own."""
    options = " ".join(f"-c {name}={ms}" for name, ms in session_options(settings).items())
    return {
        "options": options,
        **_KEEPALIVE,
        "keepalives_count": _KEEPALIVE_COUNT,
        "connect_timeout": CONNECT_TIMEOUT_S,
        "tcp_user_timeout": settings.db_tcp_user_timeout_ms,
    }


def bound_requests(engine: Engine, settings: BrokerSettings) -> Engine:
    """Make every transaction begun under :func:`request_deadline` wait no longer than it
    (one statement more per such transaction; none for the others)."""
    options = session_options(settings)
    lock_ms, statement_ms = options["lock_timeout"], options["statement_timeout"]

    @event.listens_for(engine, "begin")
    def _narrow(conn: Connection) -> None:
        at = _deadline.get()
        if at is None:
            return
        remaining = max(1, int((at - time.monotonic()) * 1000))
        conn.exec_driver_sql(
            "SELECT set_config('lock_timeout', %(lock)s, true),"
            " set_config('statement_timeout', %(statement)s, true)",
            {
                "lock": str(_narrowed(lock_ms, remaining)),
                "statement": str(_narrowed(statement_ms, remaining)),
            },
        )

    return engine


def _narrowed(default_ms: int, remaining_ms: int) -> int:
    """The tighter of a session bound (0: none) and the time a request has left."""
    return remaining_ms if default_ms == 0 else min(default_ms, remaining_ms)


def has_deadline() -> bool:
    """Whether a transaction begun on this thread now would be narrowed
    (:func:`request_deadline`)."""
    return _deadline.get() is not None


@contextmanager
def request_deadline(at: float | None) -> Iterator[None]:
    """Within the block, transactions begun on this thread end their waits by ``at``
    (``time.monotonic()`` seconds); None leaves the session bounds alone."""
    token = _deadline.set(at)
    try:
        yield
    finally:
        _deadline.reset(token)


@contextmanager
def answer_by(at: float | None) -> Iterator[None]:
    """Within the block, a commit's wait for the synchronous standbys ends by ``at``
    (``time.monotonic()`` seconds; a Kafka request's own timeout), without narrowing the
    session's other bounds: no statement is sent for it (``storage.replication``)."""
    token = _answer_by.set(at)
    try:
        yield
    finally:
        _answer_by.reset(token)


def commit_deadline(bound_ms: int) -> float | None:
    """When a commit begun now must be answered: the session's statement bound from now
    (``bound_ms``, 0 for none), or sooner if the request's deadline (``request_deadline``)
    or its answer's (``answer_by``) comes first. PostgreSQL's statement bound does not
    reach the commit's wait for standbys (docs/design.md rule 41): this one does."""
    deadline = time.monotonic() + bound_ms / 1000 if bound_ms else None
    for at in (_deadline.get(), _answer_by.get()):
        if at is not None and (deadline is None or at < deadline):
            deadline = at
    return deadline


def lift_statement_bound(conn: Connection) -> None:
    """For maintenance whose one statement may rightly run long (a rebuild, a compaction):
    the lock and idle bounds still hold, so a paused one still frees its locks."""
    conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
