"""One coordinator loop per process and database, shared by the transactional clients.

Kafka's coordinator runs in the brokers, and so it does in ``kip98 serve``; native
clients need no server, so here any client process may do its work too, and a
transaction left by a dead process is timed out or rolled forward as long as some process
using the database is alive. Clients reference-count the loop; the last one to close
stops it and releases its leases. ``KIP98_CLIENT_COORDINATOR_LOOP=0`` turns this off
(when ``kip98 serve`` or a dedicated ``kip98 coordinator run`` does the work).
"""

from __future__ import annotations

import threading

from app.broker.loop import CoordinatorLoop
from app.storage.context import BrokerContext
from app.storage.engine import get_engine

_lock = threading.Lock()
_loops: dict[str, tuple[CoordinatorLoop, int]] = {}


def acquire(url: str, broker: BrokerContext) -> str | None:
    """Ensure a loop runs for this database; returns the key to release, None if disabled."""
    if not broker.settings.client_coordinator_loop:
        return None
    with _lock:
        loop, refs = _loops.get(url, (None, 0))
        if loop is None:
            engine = get_engine(url, broker.settings)
            loop = CoordinatorLoop(BrokerContext(engine, broker.clock, broker.settings))
            loop.start()
        _loops[url] = (loop, refs + 1)
    return url


def release(key: str | None) -> None:
    if key is None:
        return
    with _lock:
        loop, refs = _loops.get(key, (None, 0))
        if loop is None:
            return
        if refs > 1:
            _loops[key] = (loop, refs - 1)
            return
        del _loops[key]
    loop.stop()
