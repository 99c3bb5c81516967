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

from sqlalchemy import Connection

from app.log import sql
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


def entry_of(row: Any) -> ProducerEntry:
    """A producer_states / producer_snapshots row (columns in ``sql.ENTRY_COLUMNS`` order,
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
        conn.execute(sql.INSERT_ENTRIES[table], params)


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
        for r in conn.execute(sql.PARTITION_STARTS)
    }
    for r in conn.execute(sql.ALL_SNAPSHOTS):
        if (r.topic, r.partition) in out:
            out[r.topic, r.partition].producers[r.producer_id] = entry_of(r)
    for r in conn.execute(sql.SNAPSHOT_ABORTED):
        out[r.topic, r.partition].aborted.append(
            (r.producer_id, r.first_offset, r.last_offset, r.last_stable_offset)
        )
    for b in conn.execute(sql.BATCHES_SINCE_SNAPSHOTS.execution_options(yield_per=10_000)):
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
    for r in conn.execute(sql.PARTITION_SNAPSHOT, key):
        proj.producers[r.producer_id] = entry_of(r)
    params = {**key, "from_offset": from_offset, "to_offset": to_offset}
    for b in conn.execute(sql.BATCHES_IN_RANGE.execution_options(yield_per=10_000), params):
        proj.fold(b, expiration_ms)
    return proj.producers
