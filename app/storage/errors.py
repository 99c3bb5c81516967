"""What a database failure means to a Kafka client (docs/design.md rule 25).

Applications handle ``KafkaException`` and decide by its code and flags: retry, abort the
transaction, or give up. A driver error reaching them would skip all of that, so every
failure of the database is translated here, once, by its SQLSTATE class:

- the connection lost, the server restarting or out of connections, a lock or statement
  bound reached, a conflict retried until it gave up: a retry can help (retriable);
- a privilege missing, or the kip98 schema absent: no retry can help (fatal), and the
  message says what the operator must do;
- anything else is a server error, not retriable, its text kept.

Two failures are kip98's own, raised beside the driver's (``storage.replication``): an
acks=all write refused before it is written for want of synchronous standbys
(NOT_ENOUGH_REPLICAS), and a commit whose standbys did not confirm it within its bound
(NOT_ENOUGH_REPLICAS_AFTER_APPEND); both retriable, as Kafka's.

The original exception stays the KafkaException's ``__cause__``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple, NoReturn

import psycopg
from sqlalchemy.exc import DBAPIError

from app.errors import KafkaError, KafkaException
from app.storage.replication import NotEnoughReplicas, ReplicationUnconfirmed


class Meaning(NamedTuple):
    code: int
    retriable: bool
    fatal: bool
    what: str


_LOST = Meaning(KafkaError._TRANSPORT, True, False, "database unreachable")
_BOUND = Meaning(KafkaError._TIMED_OUT, True, False, "database bound reached")
_CONFLICT = Meaning(KafkaError.REQUEST_TIMED_OUT, True, False, "conflicting requests")
_PRIVILEGE = Meaning(
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    False,
    True,
    "the database role lacks a privilege kip98 needs (kip98 acls roles grants them)",
)
_UNMIGRATED = Meaning(
    KafkaError._NOT_CONFIGURED,
    False,
    True,
    "the database lacks kip98's schema, or has an older one: run kip98 db migrate",
)
_NO_DATABASE = Meaning(KafkaError._NOT_CONFIGURED, False, True, "no such database")
_CREDENTIALS = Meaning(KafkaError._AUTHENTICATION, False, True, "credentials refused")
_UNKNOWN = Meaning(KafkaError.UNKNOWN_SERVER_ERROR, False, False, "database error")
# A value the driver would not send: text holding NUL, which PostgreSQL's text cannot
# store (Kafka's strings may hold it); the request, not the server, is at fault.
_NUL = Meaning(
    KafkaError.INVALID_REQUEST, False, False, "a name holds NUL, which kip98 cannot store"
)
_READ_ONLY = Meaning(KafkaError._TRANSPORT, True, False, "database read-only (a standby)")
_SHORT = Meaning(KafkaError.NOT_ENOUGH_REPLICAS, True, False, "nothing written")
_UNCONFIRMED = Meaning(
    KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND, True, False, "replication not confirmed"
)

# SQLSTATE, or the class it starts with -> meaning; the first match wins.
_MEANINGS: tuple[tuple[str, Meaning], ...] = (
    ("40001", _CONFLICT),  # serialization_failure, retried until retry_conflicts gave up
    ("40P01", _CONFLICT),  # deadlock_detected, likewise
    ("55P03", _BOUND),  # lock_not_available: lock_timeout
    ("57014", _BOUND),  # query_canceled: statement_timeout
    ("25P03", _BOUND),  # idle_in_transaction_session_timeout
    ("42501", _PRIVILEGE),  # insufficient_privilege
    ("42P01", _UNMIGRATED),  # undefined_table
    ("42703", _UNMIGRATED),  # undefined_column
    ("3D000", _NO_DATABASE),  # invalid_catalog_name
    ("25006", _READ_ONLY),  # read_only_sql_transaction: a standby, a failover under way
    ("28", _CREDENTIALS),  # invalid authorization specification
    ("08", _LOST),  # connection exception
    ("57P", _LOST),  # admin or crash shutdown, cannot connect now
    ("53", _LOST),  # insufficient resources: too many connections, disk full
)


def meaning(sqlstate: str | None, connection_lost: bool) -> Meaning:
    """The meaning of a failure with ``sqlstate``; ``connection_lost`` when the driver saw
    the connection fail (no SQLSTATE then: the server never answered)."""
    if sqlstate is None:
        return _LOST if connection_lost else _UNKNOWN
    for prefix, found in _MEANINGS:
        if sqlstate.startswith(prefix):
            return found
    return _LOST if connection_lost else _UNKNOWN


def _driver_error(exc: BaseException) -> tuple[str | None, bool, BaseException] | None:
    """(sqlstate, connection lost, the driver's exception), or None if ``exc`` is not a
    database error."""
    if isinstance(exc, DBAPIError):
        orig = exc.orig if exc.orig is not None else exc
        lost = bool(exc.connection_invalidated) or isinstance(
            orig, psycopg.OperationalError | psycopg.InterfaceError
        )
        return getattr(orig, "sqlstate", None), lost, orig
    if isinstance(exc, psycopg.Error):
        lost = isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
        return exc.sqlstate, lost, exc
    return None


def kafka_error(exc: BaseException) -> KafkaError | None:
    """The KafkaError for a database failure; None for anything else."""
    found = _driver_error(exc)
    if found is None:
        return None
    state, lost, orig = found
    if isinstance(orig, NotEnoughReplicas):
        m = _SHORT
    elif isinstance(orig, ReplicationUnconfirmed):
        m = _UNCONFIRMED
    elif state is None and isinstance(orig, psycopg.DataError) and "NUL" in str(orig):
        m = _NUL
    else:
        m = meaning(state, lost)
    # The driver's first line says what failed; the rest quotes the statement.
    detail = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
    return KafkaError(m.code, f"{m.what}: {detail}", fatal=m.fatal, retriable=m.retriable)


def is_retriable(exc: BaseException) -> bool:
    """Whether ``exc`` is a database failure that sending the request again may cure."""
    error = kafka_error(exc)
    return error is not None and error.retriable()


def raise_as_kafka(exc: BaseException) -> NoReturn:
    """Raise ``exc`` as its KafkaException if it is a database failure, else as it is."""
    error = kafka_error(exc)
    if error is None:
        raise exc
    raise KafkaException(error) from exc


@contextmanager
def kafka_errors() -> Iterator[None]:
    """Raise database failures inside as KafkaException, the driver's error as cause."""
    try:
        yield
    except (DBAPIError, psycopg.Error) as exc:
        raise_as_kafka(exc)
