"""Rebuild projections from the event tables (``kip98 db rebuild``): the orchestration,
above the libraries whose rebuilds it runs in one transaction.

The projections (producer_states, aborted_txns, the partitions' offsets, transactions) are
derived data: this module recomputes them from ``records`` and ``transaction_log`` with the
very same pure fold functions the live handlers use, and can either compare or replace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Connection, Engine, text

from app.coordinator.rebuild import rebuild_transactions
from app.groups.rebuild import rebuild_group_offsets
from app.log import projection
from app.log.projection import PartitionProjection
from app.settings import BrokerSettings
from app.storage.limits import lift_statement_bound


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


LIVE_QUERIES = {
    "partitions": "SELECT topic, partition, next_offset, last_stable_offset FROM partitions",
    "producer_states": (
        "SELECT topic, partition, producer_id, producer_epoch, last_sequence, last_offset, "
        "last_timestamp, batches, coordinator_epoch, txn_first_offset FROM producer_states"
    ),
    "aborted_txns": (
        "SELECT topic, partition, producer_id, first_offset, last_offset, last_stable_offset FROM aborted_txns"
    ),
}


def live_rows(conn: Connection) -> dict[str, list[tuple[Any, ...]]]:
    return {
        name: sorted(tuple(r) for r in conn.execute(text(q))) for name, q in LIVE_QUERIES.items()
    }


def rebuild_partition_log(
    conn: Connection, now_ms: int, settings: BrokerSettings
) -> dict[str, int]:
    """Replace the partition-log projections by the fold of ``records``.

    Every partition row is locked (in order) first, so no append interleaves.
    """
    conn.execute(text("SELECT 1 FROM partitions ORDER BY topic, partition FOR UPDATE"))
    rows = projection_rows(compute_partition_log(conn, now_ms, settings).values())
    conn.execute(text("DELETE FROM producer_states"))
    conn.execute(text("DELETE FROM aborted_txns"))
    projection.insert_entries(conn, "producer_states", rows["producer_states"])
    if rows["aborted_txns"]:
        conn.execute(
            text(
                "INSERT INTO aborted_txns (topic, partition, producer_id, first_offset, last_offset, "
                "last_stable_offset) VALUES (:t, :p, :pid, :f, :l, :lso)"
            ),
            [
                dict(zip(("t", "p", "pid", "f", "l", "lso"), r, strict=True))
                for r in rows["aborted_txns"]
            ],
        )
    if rows["partitions"]:
        conn.execute(
            text(
                "UPDATE partitions SET next_offset = :n, last_stable_offset = :lso WHERE topic = :t AND partition = :p"
            ),
            [{"t": t, "p": p, "n": n, "lso": lso} for t, p, n, lso in rows["partitions"]],
        )
    return {name: len(v) for name, v in rows.items()}


# Other families register their rebuilders here (name -> fn(conn, now_ms, settings)).
REBUILDERS: dict[str, Callable[[Connection, int, BrokerSettings], dict[str, int]]] = {
    "partition log": rebuild_partition_log,
    "transaction log": rebuild_transactions,
    "group offsets": rebuild_group_offsets,
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
