"""Engines and the one retry policy for transient PostgreSQL conflicts (docs/design.md §3.5)."""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import psycopg
from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import DBAPIError

from app.settings import BrokerSettings
from app.storage.embedded import database_url
from app.storage.limits import bound_requests, connect_args, session_options
from app.storage.liveness import check_on_checkout

log = logging.getLogger(__name__)

_engines: dict[tuple[str, tuple[int, ...], int], Engine] = {}
_lock = threading.Lock()

# serialization_failure, deadlock_detected: the transaction did nothing; run it again.
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})
MAX_ATTEMPTS = 8

P = ParamSpec("P")
T = TypeVar("T")


def resolve_url(url: str | None = None) -> str:
    """``url`` if given, else KIP98_DATABASE_URL, else the embedded server (started on demand)."""
    return url or database_url()


def get_engine(url: str | None = None, settings: BrokerSettings | None = None) -> Engine:
    """One pooled engine per URL and session bounds per process (engines are expensive;
    connections are pooled), its sessions bounded as ``settings`` (default: the
    ``KIP98_*`` environment) say, a pooled connection the server has ended given up at
    checkout (``liveness``)."""
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
            _engines[key] = bound_requests(check_on_checkout(engine), cfg)
        return engine


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
