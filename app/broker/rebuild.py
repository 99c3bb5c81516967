"""Rebuild projections from the event tables (``kip98 db rebuild``): only the
orchestration, above the libraries whose rebuilds it runs in one DB transaction.

The projections (producer_states, aborted_txns, the partitions' offsets, transactions,
group offsets, KIP-848's consumer groups) are derived data: each library recomputes its
own from its event table with the very fold its live handlers use (``log.rebuild``, ``coordinator.rebuild``,
``groups.rebuild``, ``groups.consumer_rebuild``).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, Engine

from app.coordinator.rebuild import rebuild_transactions
from app.groups.consumer_rebuild import rebuild_consumer_groups
from app.groups.rebuild import rebuild_group_offsets
from app.log.rebuild import rebuild_partition_log
from app.settings import BrokerSettings
from app.storage.limits import lift_statement_bound

# Each family's rebuild (name -> fn(conn, now_ms, settings)), run in this order.
REBUILDERS: dict[str, Callable[[Connection, int, BrokerSettings], dict[str, int]]] = {
    "partition log": rebuild_partition_log,
    "transaction log": rebuild_transactions,
    "group offsets": rebuild_group_offsets,
    "consumer groups": rebuild_consumer_groups,
}


def rebuild_all(
    engine: Engine, now_ms: int | None = None, settings: BrokerSettings | None = None
) -> dict[str, int]:
    """Rebuild every projection in one DB transaction; returns row counts per table."""
    from app.clock import SYSTEM_CLOCK

    now = SYSTEM_CLOCK.now_ms() if now_ms is None else now_ms
    cfg = settings or BrokerSettings.from_env()
    counts: dict[str, int] = {}
    with engine.begin() as conn:
        lift_statement_bound(conn)
        for rebuild in REBUILDERS.values():
            counts.update(rebuild(conn, now, cfg))
    return counts
