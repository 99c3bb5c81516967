"""The fold of a partition's records into its projections (producer state, aborted index,
offsets), shared by ``kip98 db rebuild`` and the log cleaner's producer snapshots.

Folding starts from the partition's latest producer snapshot (taken by the cleaner before it
removed anything below ``snapshot_offset``) and reads records from that offset on, so the
projections stay exact however much of the log retention and compaction have removed: the
cleaner only ever removes records below the snapshot, and a snapshot is only ever taken at
a batch boundary.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, text

from app.log.lso import lso_after_marker
from app.log.producer_state import (
    AppendedBatch,
    BatchMeta,
    Marker,
    ProducerEntry,
    apply_append,
    apply_marker,
    is_expired,
)
from app.protocol import CONTROL_ABORT, NO_PRODUCER_ID

# One row per batch (records sharing batch_base_offset and producer), in log order.
_BATCH_COLUMNS = """
    r.topic, r.partition, r.batch_base_offset, r.producer_id,
    min(r.producer_epoch) AS producer_epoch, max(r."offset") AS last_offset,
    (array_agg(r.sequence ORDER BY r."offset"))[1] AS first_seq,
    (array_agg(r.sequence ORDER BY r."offset" DESC))[1] AS last_seq,
    max(r."timestamp") AS max_timestamp, bool_or(r.is_transactional) AS is_transactional,
    bool_or(r.is_control) AS is_control, min(r.control_type) AS control_type,
    min(r.coordinator_epoch) AS coordinator_epoch
"""
_GROUP = "GROUP BY r.topic, r.partition, r.batch_base_offset, r.producer_id"

# Every partition, from its snapshot offset to the end.
BATCHES_SINCE_SNAPSHOTS = text(
    f"""
    SELECT {_BATCH_COLUMNS}
    FROM records r
    LEFT JOIN log_cleaner_checkpoints c ON c.topic = r.topic AND c.partition = r.partition
    WHERE r."offset" >= coalesce(c.snapshot_offset, 0)
    {_GROUP}
    ORDER BY r.topic, r.partition, r.batch_base_offset
    """
)

# One partition, between two batch boundaries.
BATCHES_IN_RANGE = text(
    f"""
    SELECT {_BATCH_COLUMNS}
    FROM records r
    WHERE r.topic = :topic AND r.partition = :partition
      AND r."offset" >= :from_offset AND r."offset" < :to_offset
    {_GROUP}
    ORDER BY r.batch_base_offset
    """
)

PARTITION_STARTS = text(
    """
    SELECT p.topic, p.partition, p.log_start_offset, coalesce(c.snapshot_offset, 0) AS snapshot_offset
    FROM partitions p
    LEFT JOIN log_cleaner_checkpoints c ON c.topic = p.topic AND c.partition = p.partition
    """
)

_ENTRY_COLUMNS = (
    "topic, partition, producer_id, producer_epoch, last_sequence, last_offset, "
    "last_timestamp, batches, coordinator_epoch, txn_first_offset"
)
ALL_SNAPSHOTS = text(f"SELECT {_ENTRY_COLUMNS} FROM producer_snapshots")
PARTITION_SNAPSHOT = text(
    f"SELECT {_ENTRY_COLUMNS} FROM producer_snapshots WHERE topic = :topic AND partition = :partition"
)
# aborted_txns rows ending below the snapshot offset are part of the snapshot.
SNAPSHOT_ABORTED = text(
    """
    SELECT a.topic, a.partition, a.producer_id, a.first_offset, a.last_offset, a.last_stable_offset
    FROM aborted_txns a
    JOIN log_cleaner_checkpoints c ON c.topic = a.topic AND c.partition = a.partition
    WHERE a.last_offset < c.snapshot_offset
    """
)


def entry_of(row: Any) -> ProducerEntry:
    """A producer_states / producer_snapshots row (columns in ``_ENTRY_COLUMNS`` order,
    topic and partition first) as the fold's value."""
    return ProducerEntry.from_row(row[2:])


def entry_row(topic: str, partition: int, e: ProducerEntry) -> tuple[Any, ...]:
    """The fold's value in the producer tables' column order."""
    return (
        topic,
        partition,
        e.producer_id,
        e.producer_epoch,
        e.last_sequence,
        e.last_offset,
        e.last_timestamp,
        [b.to_json() for b in e.batches],
        e.coordinator_epoch,
        e.txn_first_offset,
    )


def insert_entries(conn: Connection, table: str, rows: Iterable[tuple[Any, ...]]) -> None:
    """Write entry_row tuples into producer_states or producer_snapshots."""
    params = [
        dict(
            zip(
                ("t", "p", "pid", "ep", "seq", "lo", "ts", "b", "ce", "tfo"),
                (*r[:7], json.dumps(r[7]), *r[8:]),
                strict=True,
            )
        )
        for r in rows
    ]
    if params:
        conn.execute(
            text(
                f"INSERT INTO {table} ({_ENTRY_COLUMNS}) VALUES "
                "(:t, :p, :pid, :ep, :seq, :lo, :ts, CAST(:b AS jsonb), :ce, :tfo)"
            ),
            params,
        )


@dataclass
class PartitionProjection:
    topic: str
    partition: int
    next_offset: int = 0
    last_stable_offset: int = 0
    producers: dict[int, ProducerEntry] = field(default_factory=dict)
    aborted: list[tuple[int, int, int, int]] = field(default_factory=list)

    def fold(self, b: Any, expiration_ms: int) -> None:
        self.next_offset = max(self.next_offset, b.last_offset + 1)
        pid = b.producer_id
        if pid == NO_PRODUCER_ID:
            return
        entry = self.producers.get(pid)
        if b.is_control:
            if (
                b.control_type == CONTROL_ABORT
                and entry is not None
                and entry.txn_first_offset is not None
            ):
                others = [
                    e.txn_first_offset
                    for p, e in self.producers.items()
                    if p != pid and e.txn_first_offset is not None
                ]
                lso = lso_after_marker(min(others) if others else None, b.last_offset + 1)
                self.aborted.append((pid, entry.txn_first_offset, b.last_offset, lso))
            marker = Marker(
                pid, b.producer_epoch, b.coordinator_epoch, b.control_type, b.max_timestamp
            )
            self.producers[pid] = apply_marker(entry, marker, b.last_offset)
            return
        if entry is not None and is_expired(entry, b.max_timestamp, expiration_ms):
            entry = None
        meta = BatchMeta(b.first_seq, b.last_seq, b.batch_base_offset, b.last_offset)
        appended = AppendedBatch(pid, b.producer_epoch, meta, b.max_timestamp, b.is_transactional)
        self.producers[pid] = apply_append(entry, appended)

    def finish(self, now_ms: int, expiration_ms: int) -> None:
        self.producers = {
            p: e for p, e in self.producers.items() if not is_expired(e, now_ms, expiration_ms)
        }
        open_firsts = [
            e.txn_first_offset for e in self.producers.values() if e.txn_first_offset is not None
        ]
        self.last_stable_offset = min(open_firsts) if open_firsts else self.next_offset


def compute_partition_log(
    conn: Connection, now_ms: int, expiration_ms: int
) -> dict[tuple[str, int], PartitionProjection]:
    """Fold every partition's snapshot and the records after it, as of ``now_ms``."""
    out: dict[tuple[str, int], PartitionProjection] = {
        (r.topic, r.partition): PartitionProjection(
            r.topic, r.partition, next_offset=max(r.log_start_offset, r.snapshot_offset)
        )
        for r in conn.execute(PARTITION_STARTS)
    }
    for r in conn.execute(ALL_SNAPSHOTS):
        if (r.topic, r.partition) in out:
            out[r.topic, r.partition].producers[r.producer_id] = entry_of(r)
    for r in conn.execute(SNAPSHOT_ABORTED):
        out[r.topic, r.partition].aborted.append(
            (r.producer_id, r.first_offset, r.last_offset, r.last_stable_offset)
        )
    for b in conn.execute(BATCHES_SINCE_SNAPSHOTS.execution_options(yield_per=10_000)):
        key = (b.topic, b.partition)
        proj = out.setdefault(key, PartitionProjection(*key))
        proj.fold(b, expiration_ms)
    for proj in out.values():
        proj.finish(now_ms, expiration_ms)
    return out


def fold_range(
    conn: Connection,
    topic: str,
    partition: int,
    from_offset: int,
    to_offset: int,
    expiration_ms: int,
) -> dict[int, ProducerEntry]:
    """Producer state at ``to_offset``: the snapshot (taken at ``from_offset``) plus the
    batches in between. Both bounds must be batch boundaries."""
    proj = PartitionProjection(topic, partition)
    key = {"topic": topic, "partition": partition}
    for r in conn.execute(PARTITION_SNAPSHOT, key):
        proj.producers[r.producer_id] = entry_of(r)
    params = {**key, "from_offset": from_offset, "to_offset": to_offset}
    for b in conn.execute(BATCHES_IN_RANGE.execution_options(yield_per=10_000), params):
        proj.fold(b, expiration_ms)
    return proj.producers
