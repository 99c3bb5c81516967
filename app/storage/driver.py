"""The psycopg connection under a SQLAlchemy one, for the statements of the hot paths.

A produce or a commit runs a handful of statements per request. Through SQLAlchemy each
costs about 50 µs of Python on top of its round trip, as much as the statement itself on
a local server, so those statements run on the driver connection, inside the same DB
transaction. ``driver_sql`` gives a SQLAlchemy ``text()`` statement the driver's
placeholders, so each statement is still written once, in its family's SQL module.

``WriteBehind`` holds the last writes of a request, those whose results nothing in the
request reads (the partitions' advance, the markers, the transaction's events), and sends
them together in one pipeline just before COMMIT: one round trip instead of one each.
PostgreSQL still runs them one after the other, in the order they were queued.

Every pipeline (``WriteBehind`` here, ``log.markers``' locks) sends its Sync with its
statements, before waiting for them (``pipeline.sync()``), and never leaves the waiting
to psycopg's exit from pipeline mode (docs/design.md rule 24). PostgreSQL bounds a session idle in a transaction only from the
moment it answers a Sync, and only until the next message it reads. Without a Sync the
session is amid a pipeline, which no timeout bounds; and psycopg's exit, when the
results are not in yet, follows its Sync with a Flush, which PostgreSQL reads as the
session's next message, ending the bound without starting it again. Either way a client
paused while its statements ran (or waited for a lock) would leave a session that holds
its locks for as long as the pause. The exit's own Sync, with nothing left to run, is
answered at once: one more round trip for a pipeline, the price of the bound.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Iterable, Sequence
from contextlib import ExitStack
from typing import Any

from psycopg import Connection as PgConnection
from psycopg import pq
from sqlalchemy import Connection
from sqlalchemy.dialects.postgresql import psycopg as psycopg_dialect
from sqlalchemy.sql.elements import TextClause

from app.storage import urls

_DIALECT = psycopg_dialect.dialect()


def driver_connection(conn: Connection) -> PgConnection[Any]:
    """The psycopg connection under a SQLAlchemy connection (same DB transaction)."""
    raw = conn.connection.driver_connection
    assert raw is not None
    return raw


def libpq_conninfo(
    url: str, *, dbname: str | None = None, application_name: str | None = None
) -> str:
    """A SQLAlchemy URL as a libpq connection string, for what connects with psycopg
    directly beside the engines (admin sessions, fault injection, the bench's floors):
    the URL's hosts and ports (every node of a replicated database), user, password and
    libpq parameters; its database unless ``dbname`` is given (``postgres`` if it names
    none). The conversion is ``storage.urls``'."""
    return urls.libpq_conninfo(url, dbname=dbname, application_name=application_name)


def in_transaction(conn: Connection) -> bool:
    """Whether anything ran yet in ``conn``'s DB transaction (psycopg begins it with the
    first statement)."""
    status = driver_connection(conn).pgconn.transaction_status
    return status != pq.TransactionStatus.IDLE


@functools.cache
def driver_sql(statement: TextClause) -> str:
    """``statement`` with psycopg's ``%(name)s`` placeholders (literal ``%`` escaped), as
    SQLAlchemy would send it; the parameters stay the same dict."""
    return str(statement.compile(dialect=_DIALECT))


class WriteBehind:
    """Writes of one DB transaction queued until just before it commits (``send``).

    Only for statements whose results the request never reads, and only while nothing
    executed in between reads the rows they write: a queued write has not run yet.

    A write may name the rows it sets (``sets``: keys such as a partition); a later write
    that sets all of them in full (``supersede``) makes it pointless, and it is dropped: a
    transaction's markers rewrite the partition rows and producer states its appends had
    just advanced in the same request.
    """

    def __init__(self) -> None:
        self._queued: list[tuple[str, dict[str, Any], frozenset[Hashable]]] = []

    def add(self, statement: str, params: dict[str, Any], sets: Iterable[Hashable] = ()) -> None:
        self._queued.append((statement, params, frozenset(sets)))

    def supersede(self, keys: Iterable[Hashable]) -> None:
        """Drop the queued writes that set only rows among ``keys`` (about to be set in full
        by a write queued next)."""
        covered = frozenset(keys)
        self._queued = [q for q in self._queued if not (q[2] and q[2] <= covered)]

    def take(self) -> list[tuple[str, dict[str, Any]]]:
        """The queued writes, in order, no longer queued: to be sent some other way (a
        query string of their own, ``storage.one_query``)."""
        queued, self._queued = self._queued, []
        return [(statement, params) for statement, params, _ in queued]

    def send(
        self, conn: Connection, read: tuple[str, dict[str, Any]] | None = None
    ) -> tuple[Any, ...] | None:
        """Run the queued writes, in order; errors raise here, before COMMIT. ``read``: a
        statement run after them in the same round trip, whose first row is returned
        (e.g. a row's version as the writes leave it)."""
        found = self.send_reading(conn, [] if read is None else [read])
        return found[0][0] if found and found[0] else None

    def send_reading(
        self, conn: Connection, reads: Sequence[tuple[str, dict[str, Any]]]
    ) -> list[list[tuple[Any, ...]]]:
        """``send``, with several ``reads`` after the writes in the same round trip: each
        one's rows, in order."""
        queued, self._queued = self._queued, []
        if not queued and not reads:
            return []
        raw = driver_connection(conn)
        if len(queued) + len(reads) == 1:
            with raw.cursor() as cur:
                for statement, params, _ in queued:
                    cur.execute(statement, params)
                return [cur.execute(*read).fetchall() for read in reads]
        with raw.pipeline() as pipeline, ExitStack() as cursors:
            cur = cursors.enter_context(raw.cursor())
            for statement, params, _ in queued:
                cur.execute(statement, params)
            readers = [cursors.enter_context(raw.cursor()) for _ in reads]
            for reading, read in zip(readers, reads, strict=True):
                reading.execute(*read)
            pipeline.sync()  # the Sync before the wait (see above)
            return [reading.fetchall() for reading in readers]


def execute_or_queue(
    conn: Connection,
    writes: WriteBehind | None,
    statement: str,
    params: dict[str, Any],
    sets: Iterable[Hashable] = (),
) -> None:
    """Run a write whose result is not read now, or queue it on ``writes`` if given
    (``sets``: see ``WriteBehind``)."""
    if writes is not None:
        writes.add(statement, params, sets)
        return
    with driver_connection(conn).cursor() as cur:
        cur.execute(statement, params)
