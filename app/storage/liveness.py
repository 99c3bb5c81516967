"""A pooled connection's liveness, checked at checkout without a round trip (docs/design.md §3.8).

A connection waits in the pool between requests, and its backend may go meanwhile: the
server restarted, the backend terminated (``pg_terminate_backend``), the server's crash
recovery. Handing such a connection to a request would fail the request, so each checkout
used to ping the server first (SQLAlchemy's ``pool_pre_ping``): one round trip per request,
about a tenth of what a 1000-record produce spends beside its COPY and COMMIT, and more of
a small one.

An idle connection has nothing to read: every result of its last request was read. So
when its socket is readable, the server has written to it since, which on an idle session
means it is ending it: the terminated backend's error before it closes, or the end of the
stream. That is checked with a ``poll`` of zero timeout at checkout, and such a
connection is given up for a new one (SQLAlchemy's ``DisconnectionError`` from a checkout
listener: the pool invalidates the connection, firing the ``invalidate`` event as a failed
ping did, and connects again). A backend that goes during the request itself fails the
request as it did before. Anything else arriving on an idle session (a parameter a
configuration reload changed, a notice) costs one reconnect, never a wrong answer.
"""

from __future__ import annotations

import select
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.exc import DisconnectionError


def closed_by_server(dbapi_connection: Any) -> bool:
    """Whether the server has ended this idle psycopg connection (or written to it, which
    it only does to end it)."""
    if dbapi_connection.closed or dbapi_connection.broken:
        return True
    poller = select.poll()
    poller.register(dbapi_connection.pgconn.socket, select.POLLIN)
    return bool(poller.poll(0))


# Set on a connection record when its connection is made, taken at its first checkout.
_FRESH = "kip98_fresh"


def check_on_checkout(engine: Engine) -> Engine:
    """Give up pooled connections the server has ended, at checkout, instead of pinging.

    A connection just made is handed out unchecked, as SQLAlchemy's pre-ping skips fresh
    ones: the pool checks a replacement again, and gives up after three, so a server
    ending connections as they come (``pg_terminate_backend`` in a loop) would otherwise
    fail the checkout itself, with an error no caller can tell from a bug, instead of the
    request's first statement, with a lost connection its caller retries."""

    @event.listens_for(engine, "connect")
    def _made(_dbapi_connection: Any, record: Any) -> None:
        record.info[_FRESH] = True

    @event.listens_for(engine, "checkout")
    def _alive(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if record.info.pop(_FRESH, False):
            return
        if closed_by_server(dbapi_connection):
            raise DisconnectionError("the server ended the pooled connection")

    return engine
