"""The partition log's projections (producer_states, aborted_txns, the partitions' next
offsets and LSOs) recomputed from ``records``, with the very fold the live appends and
markers follow (``projection``): compared with the live rows, or put in their place.
``kip98 db rebuild`` runs this with the other families' rebuilds (``app.broker.rebuild``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection

from app.log import projection, sql
from app.log.projection import PartitionProjection
from app.settings import BrokerSettings


def compute_partition_log(
    conn: Connection, now_ms: int, settings: BrokerSettings
) -> dict[tuple[str, int], PartitionProjection]:
    """Fold ``records`` (from each partition's producer snapshot on) as of ``now_ms``."""
    return projection.compute_partition_log(conn, now_ms, settings.producer_id_expiration_ms)


def projection_rows(projections: Iterable[PartitionProjection]) -> dict[str, list[tuple[Any, ...]]]:
    """The projections as sorted row tuples, in the live tables' column order."""
    producers: list[tuple[Any, ...]] = []
    aborted, partitions = [], []
    for p in projections:
        partitions.append((p.topic, p.partition, p.next_offset, p.last_stable_offset))
        producers.extend(
            projection.entry_row(p.topic, p.partition, e) for e in p.producers.values()
        )
        for pid, first, last, lso in p.aborted:
            aborted.append((p.topic, p.partition, pid, first, last, lso))
    return {
        "partitions": sorted(partitions),
        "producer_states": sorted(producers),
        "aborted_txns": sorted(aborted),
    }


_LIVE = {
    "partitions": sql.LIVE_PARTITIONS,
    "producer_states": sql.LIVE_PRODUCER_STATES,
    "aborted_txns": sql.LIVE_ABORTED_TXNS,
}


def live_rows(conn: Connection) -> dict[str, list[tuple[Any, ...]]]:
    """The live projections, in ``projection_rows``' shape."""
    return {name: sorted(tuple(r) for r in conn.execute(q)) for name, q in _LIVE.items()}


def rebuild_partition_log(
    conn: Connection, now_ms: int, settings: BrokerSettings
) -> dict[str, int]:
    """Replace the partition-log projections by the fold of ``records``; every partition
    row is locked (in order) first, so no append interleaves. Returns row counts."""
    conn.execute(sql.LOCK_ALL_PARTITIONS)
    rows = projection_rows(compute_partition_log(conn, now_ms, settings).values())
    conn.execute(sql.CLEAR_PRODUCER_STATES)
    conn.execute(sql.CLEAR_ABORTED_TXNS)
    projection.insert_entries(conn, "producer_states", rows["producer_states"])
    if rows["aborted_txns"]:
        names = ("t", "p", "pid", "f", "l", "lso")
        aborted = [dict(zip(names, r, strict=True)) for r in rows["aborted_txns"]]
        conn.execute(sql.INSERT_ABORTED_TXN, aborted)
    if rows["partitions"]:
        offsets = [{"t": t, "p": p, "n": n, "lso": lso} for t, p, n, lso in rows["partitions"]]
        conn.execute(sql.SET_PARTITION_OFFSETS, offsets)
    return {name: len(v) for name, v in rows.items()}
