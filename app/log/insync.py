"""Each topic's ``min.insync.replicas``, as an acks=all produce reads it before it writes
(docs/design.md rule 41).

Kafka refuses an acks=all write with NOT_ENOUGH_REPLICAS while fewer copies than the
topic's min.insync.replicas are in sync, its leader's own counted. Here the copies are
the primary and its synchronous standbys streaming. The overrides are few and change
rarely, so an engine keeps them for a second instead of reading them per request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from weakref import WeakKeyDictionary

from sqlalchemy import Engine

from app.log import sql
from app.log.topic_config import min_insync_replicas

# How long an engine's look at the overrides stands.
_FRESH_FOR_S = 1.0

_looked: WeakKeyDictionary[Engine, tuple[float, dict[str, int]]] = WeakKeyDictionary()
_lock = threading.Lock()


def overrides(engine: Engine) -> dict[str, int]:
    """topic -> its min.insync.replicas, for the topics that set one."""
    now = time.monotonic()
    with _lock:
        found = _looked.get(engine)
    if found is not None and now - found[0] < _FRESH_FOR_S:
        return found[1]
    with engine.connect() as conn:
        rows = conn.execute(sql.MIN_INSYNC_OVERRIDES).all()
        conn.rollback()
    current = {r.topic: min_insync_replicas(r.config) for r in rows}
    with _lock:
        _looked[engine] = (now, current)
    return current


def forget(engine: Engine) -> None:
    """A topic's configs changed in this process: its next look reads them again (other
    processes see the change within ``_FRESH_FOR_S``)."""
    with _lock:
        _looked.pop(engine, None)


def copies_needed(engine: Engine, topics: Iterable[str]) -> int:
    """The most in-sync copies any of ``topics`` asks for (1: the primary alone)."""
    needed = overrides(engine)
    return max((needed.get(t, 1) for t in topics), default=1)
