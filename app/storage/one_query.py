"""Writes sent as one query string: prepared statements and COPYs (docs/design.md §3.9,
§3.10).

``write_checked`` is the one-query way's one executor, for a produce, a registration and
a commit alike: the statements (the checked reads and advances first, then the writes)
and the COPYs as one simple-protocol query string, which PostgreSQL runs as one implicit
transaction committed as the last COPY ends; the statements' answers come back with the
first COPY's start, and a ``Check`` that does not hold fails the COPY on purpose
(CopyFail), nothing written. Statements are prepared once per connection and executed
with their values as literals quoted by libpq (``prepared_call``). Inside an open
transaction, ``QueryCopies`` sends a request's rows cut into several COPYs (§3.10).
psycopg has no public call for a query string that mixes a COPY with other statements,
so this drives the connection with psycopg's libpq wrapper and generators, as psycopg's
``Copy`` does.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, NamedTuple

from psycopg import errors, generators, pq
from sqlalchemy import Connection

from app.faults import crash_point
from app.storage.driver import driver_connection, in_transaction
from app.storage.replication import confirm_commit, release_commit, watch_commit

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


@functools.cache
def as_prepared(statement: str, names: tuple[str, ...]) -> str:
    """``statement`` with psycopg's ``%(name)s`` placeholders as PREPARE's ``$n``, numbered
    in the order of ``names`` (every placeholder must be one of them)."""
    position = {name: i for i, name in enumerate(names, start=1)}
    return _PLACEHOLDER.sub(lambda m: f"${position[m.group(1)]}", statement)


def prepare_once(conn: Connection, name: str, statement: str, types: Sequence[str] = ()) -> None:
    """``PREPARE name[(types)] AS statement`` on ``conn``'s session unless done already
    (marked in the pool's per-connection info, which a reconnect starts afresh). ``conn`` is
    outside any transaction: the PREPARE runs on its own."""
    info = conn.connection.info
    key = ("kip98_prepared", name)
    if info.get(key):
        return
    raw = driver_connection(conn)
    declared = f"({', '.join(types)})" if types else ""
    try:
        _run(raw, f"PREPARE {name}{declared} AS {statement}".encode())
    except errors.DuplicatePreparedStatement:
        # Still there from before ``unprepared`` forgot every name on finding one gone: a
        # name stands for one statement (``prepared_call``'s are its hash), so it is this.
        pass
    info[key] = True


def unprepared(conn: Connection, name: str | None = None) -> None:
    """Forget that ``name`` (None: every statement) is prepared on ``conn`` (the server said
    it is not: a DEALLOCATE ran on the session); the next ``prepare_once`` prepares it
    again."""
    info = conn.connection.info
    for key in [k for k in info if isinstance(k, tuple) and k[0] == "kip98_prepared"]:
        if name is None or key[1] == name:
            del info[key]


def call(conn: Connection, name: str, values: Sequence[Any]) -> bytes:
    """``EXECUTE name(...)`` with ``values`` as SQL literals: NULL, booleans, integers,
    quoted text, and flat lists of those as quoted array text."""
    escaping = pq.Escaping(driver_connection(conn).pgconn)
    return b"EXECUTE %s(%s)" % (name.encode(), b", ".join(_literal(escaping, v) for v in values))


def _literal(escaping: Any, value: Any) -> bytes:
    if value is None:
        return b"NULL"
    if isinstance(value, bool):
        return b"true" if value else b"false"
    if isinstance(value, int):
        return b"%d" % value
    if isinstance(value, list):
        return bytes(escaping.escape_literal(_array_text(value).encode()))
    return bytes(escaping.escape_literal(value.encode()))


def _array_text(values: list[Any]) -> str:
    """A flat list as PostgreSQL's array input reads it: NULL, integers, booleans, and
    text double-quoted with its backslashes and double quotes escaped (so braces, commas,
    blanks and the word NULL inside stay text)."""
    return "{" + ",".join(map(_element, values)) + "}"


def _element(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise TypeError(f"no array element literal for {type(value).__name__}")


def prepared_call(conn: Connection, statement: str, params: Mapping[str, Any]) -> bytes:
    """``statement`` (psycopg's ``%(name)s`` placeholders, literal ``%`` doubled) as an
    ``EXECUTE`` of it prepared once per session, ``params`` as its literals (``call``).
    Its parameters are declared from the values, as psycopg's own binding types them
    (integers as bigint, lists of them as bigint[], booleans), the rest left for the
    server to infer from the statement; each signature is a statement of its own."""
    names = _names(statement)
    values = [params[n] for n in names]
    types = tuple(_type_of(v) for v in values)
    name = _prepared_name(statement, types)
    prepare_once(conn, name, as_prepared(statement, names).replace("%%", "%"), types)
    return call(conn, name, values)


@functools.cache
def _prepared_name(statement: str, types: tuple[str, ...]) -> str:
    return "kip98_" + hashlib.sha1(repr((statement, types)).encode()).hexdigest()[:20]


@functools.cache
def _names(statement: str) -> tuple[str, ...]:
    """The statement's placeholders, each once, in order of appearance."""
    return tuple(dict.fromkeys(_PLACEHOLDER.findall(statement)))


def _type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "bigint"
    if isinstance(value, list) and any(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return "bigint[]"
    return "unknown"


class Refused(NamedTuple):
    """A one-query write refused on its reads (a row moved since the process remembered
    it, a prepared statement gone from the session): nothing written and no transaction
    left open, so the request can be decided again under the locks (docs/design.md §3.9)."""

    why: str


class Check(NamedTuple):
    """A statement of a one-query write whose answer must hold for the write to go (a
    locking read of a row with its version, an advance that matches only the version
    remembered), and why the write is refused when it does not (docs/design.md §3.9)."""

    statement: bytes
    holds: Callable[[pq.abc.PGresult], bool]
    refusal: str


def write_checked(
    conn: Connection,
    copy: str,
    statements: Sequence[bytes | Check],
    payloads: Sequence[bytes],
    *,
    stop: str,
) -> list[pq.abc.PGresult] | Refused:
    """The one-query way's executor (docs/design.md §3.9): ``statements``, then a COPY
    per payload, as one query string committed as the last COPY ends (``conn`` outside
    any transaction). The statements answer with the first COPY's start; the first
    ``Check`` that does not hold refuses the write (the COPY failed on purpose, nothing
    written), else the payloads go and commit. ``Refused`` too where a prepared statement
    was gone from the session (prepared again next time). ``stop``: the crash point once
    every COPY's data is given, the last not ended. The statements' results, in order."""
    plain = [s.statement if isinstance(s, Check) else s for s in statements]
    try:
        with QueryCopies(conn, copy, len(payloads), committed=True, statements=plain) as query:
            for statement, result in zip(statements, query.results, strict=True):
                if isinstance(statement, Check) and not statement.holds(result):
                    query.refuse(statement.refusal)
                    return Refused(statement.refusal)
            query.write(payloads)
            crash_point(stop)
    except errors.InvalidSqlStatementName:
        unprepared(conn)  # every one: psycopg deallocates all after a ROLLBACK
        return Refused("a prepared statement was gone from the session")
    return query.results


class QueryCopies:
    """``[statement; ...; ]COPY ...; COPY ...`` sent as one query string, one COPY per
    payload.

    ``committed``: the connection is outside any transaction and the query string is its
    own implicit transaction, committed as the last COPY ends (see the module's
    docstring); else it runs inside the connection's open transaction, which the caller
    commits. Several COPYs of the same rows cost the server less than one from ~700 rows
    to ~1500 (``copy_records.copy_statements``, docs/design.md §3.10); each after the
    first starts once the one before ended, one round trip more.

    Entering sends the query and waits for the first COPY's start: ``results`` are the
    statements', in order. Then ``refuse`` (nothing written) or ``write`` the payloads;
    leaving ends the last COPY. Leaving on an exception fails the COPY under way, which
    aborts the transaction (the implicit one: nothing is written) and leaves the
    connection usable. Any statement's error is raised as psycopg's (the rest of the
    query string is not run).

    From a COPY's start the server waits for its data unbounded by any of its timeouts,
    holding what the statement locked: have the payloads ready before entering, so that a
    process paused inside the block is paused only in the hand-over (docs/design.md rule
    24). (Entering without waiting, to prepare the payload while the statement runs, was
    measured ~0.2 ms faster a 1000-record batch, and would widen that window as much.)"""

    def __init__(
        self,
        conn: Connection,
        copy: str,
        copies: int,
        *,
        committed: bool,
        statements: Sequence[bytes] = (),
    ) -> None:
        if in_transaction(conn) == committed:
            raise RuntimeError(
                "a committed one-query write needs a connection outside any transaction"
                if committed
                else "these COPYs belong in the connection's open transaction"
            )
        self.committed = committed
        self._raw = driver_connection(conn)
        self._copies = copies
        self._query = b"; ".join([*statements, *[copy.encode()] * copies])
        self._open = False  # a COPY started and is not ended yet
        self._statements = len(statements)
        self.results: list[pq.abc.PGresult] = []

    def __enter__(self) -> QueryCopies:
        results = _run(self._raw, self._query)
        _expect_copy(results)
        self._open = True
        self.results = results[: self._statements]
        return self

    def refuse(self, why: str) -> None:
        """Fail the first COPY on purpose: the query string's other COPYs are not run,
        and the implicit transaction rolls back (an open one is aborted)."""
        self._end(why.encode())

    def write(self, payloads: Sequence[bytes]) -> None:
        """Each payload as the data of its COPY, in order; every COPY but the last is
        ended (its errors raised) before the next one's data goes."""
        assert self._open, "the COPY was refused"
        assert len(payloads) == self._copies, "one payload per COPY"
        for i, payload in enumerate(payloads):
            if i:
                results = self._end(None)
                _raise_failed(self._raw, results)
                _expect_copy(results)
                self._open = True
            self._raw.wait(generators.copy_to(self._raw.pgconn, payload, flush=False))

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._open:
            return
        if kind is None:
            if not self.committed:
                _raise_failed(self._raw, self._end(None))
                return
            # The last COPY's end is the commit of the query string (docs/design.md rule 41).
            token = watch_commit(self._raw)
            try:
                results = self._end(None)
            finally:
                cancelled = release_commit(token)
            confirm_commit(self._raw, cancelled)
            _raise_failed(self._raw, results)
            return
        try:
            self._end(b"the writer failed")
        except Exception:  # the connection is lost too: the original error says more
            pass

    def _end(self, error: bytes | None) -> list[pq.abc.PGresult]:
        """End the COPY under way (failed with ``error``, else done); the results up to the
        next COPY's start or the query's end. Refused on purpose, its own error is
        expected and not raised."""
        self._open = False
        pgconn = self._raw.pgconn
        while pgconn.put_copy_end(error) == 0:  # full buffers: wait until they drain
            self._raw.wait(generators.send(pgconn))
        results: list[pq.abc.PGresult] = self._raw.wait(generators.execute(pgconn))
        return results


def _run(raw: Any, query: bytes) -> list[pq.abc.PGresult]:
    """Send ``query`` by the simple protocol; its results up to the end or a COPY's start.
    A failed statement is raised (the rest of the string was not run)."""
    raw.pgconn.send_query(query)
    results: list[pq.abc.PGresult] = raw.wait(generators.execute(raw.pgconn))
    _raise_failed(raw, results)
    return results


def _expect_copy(results: list[pq.abc.PGresult]) -> None:
    if not results or results[-1].status != pq.ExecStatus.COPY_IN:
        raise RuntimeError("a one-query write's statements must end in a COPY FROM STDIN")


def _raise_failed(raw: Any, results: list[pq.abc.PGresult]) -> None:
    for result in results:
        if result.status == pq.ExecStatus.FATAL_ERROR:
            raise errors.error_from_result(result, encoding=raw.info.encoding)
