"""Engines and the one retry policy for transient PostgreSQL conflicts (docs/design.md §3.5)."""

from __future__ import annotations

import functools
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

import psycopg
from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.exc import DBAPIError

from app.errors import KafkaError, fail
from app.settings import BrokerSettings
from app.storage.driver import in_transaction
from app.storage.limits import bound_requests, connect_args, has_deadline, session_options
from app.storage.liveness import check_on_checkout
from app.storage.migrate import SchemaError, ensure_schema
from app.storage.replica_set import database_url
from app.storage.replication import watch_commits
from app.storage.stalls import watch_stalls
from app.storage.urls import sqlalchemy_url

log = logging.getLogger(__name__)

_engines: dict[tuple[str, tuple[int, ...], int], Engine] = {}
_lock = threading.Lock()

# serialization_failure, deadlock_detected: the transaction did nothing; run it again.
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})
MAX_ATTEMPTS = 8

P = ParamSpec("P")
T = TypeVar("T")


def resolve_url(url: str | None = None) -> str:
    """``url`` if given, else KIP98_DATABASE_URL, else the embedded server (started on
    demand), as SQLAlchemy reads it (several hosts as its ``host`` parameters:
    ``storage.urls``). The embedded database is migrated to the newest schema on the way
    (once per process), and so is any with ``KIP98_AUTO_MIGRATE=1`` (``storage.migrate``)."""
    embedded = url is None and not os.environ.get("KIP98_DATABASE_URL")
    resolved = sqlalchemy_url(url or database_url())
    if embedded or migrates_on_demand():
        try:
            ensure_schema(resolved, migrate=True)
        except psycopg.OperationalError as exc:  # unreachable: the first statement says so
            log.debug("schema not checked: %s", exc)
        except SchemaError as exc:
            raise fail(KafkaError._NOT_CONFIGURED, str(exc), fatal=True) from exc
    return resolved


def migrates_on_demand() -> bool:
    """``KIP98_AUTO_MIGRATE``: whether a database of one's own is migrated by whatever
    uses it, as the embedded one always is."""
    return BrokerSettings.from_env().auto_migrate


def get_engine(url: str | None = None, settings: BrokerSettings | None = None) -> Engine:
    """One pooled engine per URL and session bounds per process (engines are expensive;
    connections are pooled), its sessions bounded as ``settings`` (default: the
    ``KIP98_*`` environment) say, a pooled connection the server has ended given up at
    checkout (``liveness``), sessions that stall its connections ended (``stalls``), each
    commit bounded and its standbys' word checked (``replication``)."""
    resolved = resolve_url(url)
    cfg = settings or BrokerSettings.from_env()
    key = (resolved, tuple(session_options(cfg).values()), cfg.db_tcp_user_timeout_ms)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = create_engine(
                resolved,
                pool_size=5,
                max_overflow=20,
                pool_recycle=3600,
                connect_args=connect_args(cfg),
            )
            _engines[key] = watch_commits(
                watch_stalls(bound_requests(check_on_checkout(engine), cfg), cfg), cfg
            )
        return engine


@contextmanager
def lazy_transaction(engine: Engine) -> Iterator[Connection]:
    """One DB transaction, as ``engine.begin()`` gives, begun by its first statement
    instead of at once, and committed at the end (rolled back on an exception).

    For requests whose statements may all go to the driver connection, as a produce on
    remembered rows does (one query string that commits itself, docs/design.md §3.9):
    SQLAlchemy's transaction then never starts, and the request skips its begin and
    commit: ~10 µs warm, and on the produce path, where the batch's rows have just pushed
    SQLAlchemy's objects out of the CPU caches, the connection's checkout to check-in
    went from 76 to 63 µs a 1000-record batch. A statement
    through SQLAlchemy begins it as usual; one through the driver begins psycopg's, which
    is taken into SQLAlchemy's at the end and committed with it (its events see every
    commit but that of a query string that committed itself). Under a deadline
    (``limits.request_deadline``) it begins at once, so the narrowed bounds are set before
    any statement runs, as ``engine.begin()`` does."""
    with engine.connect() as conn:
        if has_deadline():
            conn.begin()
        yield conn
        if not conn.in_transaction() and in_transaction(conn):
            conn.begin()  # nothing is sent: psycopg's transaction is already open
        if conn.in_transaction():
            conn.commit()


def dispose_engines() -> None:
    """Drop pooled connections, e.g. after fork or before dropping a test database."""
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()


def sqlstate(exc: BaseException) -> str | None:
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    return getattr(orig, "sqlstate", None)


def retry_conflicts(fn: Callable[P, T]) -> Callable[P, T]:
    """Re-run a whole DB transaction on serialization failure or deadlock, bounded and logged."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                return fn(*args, **kwargs)
            except (DBAPIError, psycopg.Error) as exc:
                if sqlstate(exc) not in RETRYABLE_SQLSTATES or attempt == MAX_ATTEMPTS:
                    raise
                log.warning("%s: %s, retrying (attempt %d)", fn.__name__, sqlstate(exc), attempt)
                time.sleep(random.uniform(0, 0.005 * 2**attempt))
        raise AssertionError("unreachable")

    return wrapper
