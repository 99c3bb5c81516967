"""Which topics are compacted, as a produce reads it before it writes: Kafka refuses a
record without a key on a compacted topic (``append.keyless_refusal``).

Only a batch holding a record without a key asks, so keyed producers never do. Configs
change rarely, so an engine keeps every topic's answer for a second instead of reading it
per request, and reads again at once for a topic it has not seen (one just created); a
change made in this process is seen at once (``forget``), one made by another process
within the second, as Kafka's brokers apply a config change once it reaches them.
"""

from __future__ import annotations

import threading
import time
from weakref import WeakKeyDictionary

from sqlalchemy import Connection, Engine

from app.log import sql
from app.log.topic_config import CleanupConfig
from app.storage.driver import in_transaction

# How long an engine's look at the topics stands.
_FRESH_FOR_S = 1.0

_looked: WeakKeyDictionary[Engine, tuple[float, dict[str, bool]]] = WeakKeyDictionary()
_lock = threading.Lock()


def is_compacted(conn: Connection, topic: str) -> bool:
    """Whether ``topic``'s cleanup.policy compacts it (False for a topic that does not
    exist: its batch is refused for that anyway). Read on the request's own connection,
    never a second one from the pool: inside its DB transaction if one is open, else in
    one of its own that ends at once, so the request still starts from no transaction."""
    engine = conn.engine
    now = time.monotonic()
    with _lock:
        found = _looked.get(engine)
    if found is not None and now - found[0] < _FRESH_FOR_S and topic in found[1]:
        return found[1][topic]
    began = not conn.in_transaction() and not in_transaction(conn)
    rows = conn.execute(sql.TOPIC_CONFIGS).all()
    if began:
        conn.rollback()
    current = {r.topic: CleanupConfig.of(r.config).compact for r in rows}
    with _lock:
        _looked[engine] = (now, current)
    return current.get(topic, False)


def forget(engine: Engine) -> None:
    """A topic was made or its configs changed in this process: its next look reads them
    again."""
    with _lock:
        _looked.pop(engine, None)
