"""WriteTxnMarker, the partition side: COMMIT or ABORT control records.

Only the coordinator calls this (there is no client path to a control record). Under the
partition locks it checks the producer and coordinator epochs (rule 7), writes the markers,
closes the producer's open transaction, adds an aborted-index entry on ABORT with the LSO of
that moment, and moves the LSO, all in the caller's DB transaction. A marker for a producer
with no open transaction on the partition writes nothing, which makes retries idempotent.

All partitions of a transaction are marked set-based, in three statements whatever their
number (lock and read, the other open transactions, write) and two round trips (the first
two are pipelined; the write can be queued with the request's last writes); the rules stay
the pure functions of ``producer_state`` and ``lso``, applied per partition in Python.
After a wait for the locks, the producer's states are read once more (see
``partition_lock.partition_rows``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import pq
from sqlalchemy import Connection

from app.errors import KafkaError, fail
from app.log import sql
from app.log.lso import lso_after_marker
from app.log.partition_lock import (
    PartitionRow,
    forget,
    lock_params,
    partition_key,
    partition_rows,
    producer_key,
)
from app.log.producer_state import Marker, ProducerEntry, apply_marker, validate_marker
from app.protocol import CONTROL_ABORT, CONTROL_COMMIT, TopicPartitionKey
from app.storage.driver import WriteBehind, driver_connection, execute_or_queue
from app.storage.one_query import prepared_call

__all__ = [
    "Marker",
    "MarkerLocks",
    "hidden_by_own",
    "lock_for_markers",
    "others_first_open",
    "others_first_open_query",
    "others_match",
    "write_txn_markers",
]


@dataclass(frozen=True)
class MarkerLocks:
    """What the markers of ``producer_id``'s transaction need, read under its partitions'
    locks: each row with the producer's state (``rows``, kept up to date by later steps of
    the same DB transaction, e.g. appends) and, per partition, the first offset of the
    earliest transaction of another producer still open there (``others_first_open``;
    absent if none), which no one else can change while the locks are held; the markers
    too leave ``rows`` as they write them. ``writes``:
    where the DB transaction holding the locks queues its last writes, the markers' too
    (``None``: they run at once)."""

    producer_id: int
    rows: dict[TopicPartitionKey, PartitionRow]
    others_first_open: dict[TopicPartitionKey, int]
    writes: WriteBehind | None = None


def lock_for_markers(
    conn: Connection,
    partitions: Iterable[TopicPartitionKey],
    producer_id: int,
    writes: WriteBehind | None = None,
) -> MarkerLocks:
    """Lock ``partitions`` in sorted order (missing ones are left out) and read what their
    markers need, in one round trip: the second statement waits in the pipeline until the
    first holds the locks, so its snapshot sees every transaction opened before them. The
    producer's states are read again if a lock was waited for (``partition_rows``)."""
    wanted = [(t, p, producer_id) for t, p in sorted(set(partitions))]
    lock = lock_params(wanted)
    others = {
        "topics": lock["topics"],
        "partitions": lock["partitions"],
        "producer_id": producer_id,
    }
    raw = driver_connection(conn)
    with raw.pipeline() as pipeline, raw.cursor() as locking, raw.cursor() as reading:
        locking.execute(sql.LOCK_PARTITIONS, lock)
        reading.execute(sql.FIRST_OPEN_TXN_OFFSETS, others)
        pipeline.sync()  # the Sync before the wait for the locks (``storage.driver``)
        rows = locking.fetchall()
        first_open = reading.fetchall()
    return MarkerLocks(
        producer_id,
        partition_rows(conn, wanted, rows),
        {(t, p): first for t, p, first in first_open},
        writes,
    )


def others_first_open(rows: dict[TopicPartitionKey, PartitionRow]) -> dict[TopicPartitionKey, int]:
    """``MarkerLocks.others_first_open`` as it follows from rows holding the producer's
    state, by the LSO's invariant (``lso``: the first offset of the earliest transaction
    still open, else the next offset): below the producer's own open transaction's first
    offset, or below the next offset where it has none, the LSO is another's, and its
    first offset. Where the producer's own transaction is the earliest open, another's
    opened after it does not show: ``hidden_by_own`` names those partitions, for the
    caller to read them (``others_first_open_query``). (Every write of a producer's state
    on a partition also writes the partition's row: while the row is the version these
    came from, so are the other producers' states.)"""
    return {
        tp: row.last_stable_offset
        for tp, row in rows.items()
        if row.last_stable_offset < _own_limit(row)
    }


def hidden_by_own(rows: dict[TopicPartitionKey, PartitionRow]) -> list[TopicPartitionKey]:
    """The partitions where the producer's own open transaction is the earliest: whether
    another's is open behind it is not in the row (``others_first_open``)."""
    return [
        tp
        for tp, row in rows.items()
        if row.s_txn_first_offset is not None and row.last_stable_offset == row.s_txn_first_offset
    ]


def _own_limit(row: PartitionRow) -> int:
    return row.next_offset if row.s_txn_first_offset is None else row.s_txn_first_offset


def others_first_open_query(
    conn: Connection, partitions: Sequence[TopicPartitionKey], producer_id: int
) -> bytes:
    """FIRST_OPEN_TXN_OFFSETS as a statement of a query string (``storage.one_query``),
    placed after the statement locking ``partitions``: what ``lock_for_markers`` reads,
    for ``others_match``."""
    params = {
        "topics": [t for t, _ in partitions],
        "partitions": [p for _, p in partitions],
        "producer_id": producer_id,
    }
    return prepared_call(conn, sql.FIRST_OPEN_TXN_OFFSETS, params)


def others_match(result: pq.abc.PGresult, expected: dict[TopicPartitionKey, int]) -> bool:
    """Whether ``others_first_open_query`` found exactly ``expected``."""
    found = {}
    for i in range(result.ntuples):
        topic, partition, first = (result.get_value(i, c) for c in range(3))
        assert topic is not None and partition is not None and first is not None
        found[(topic.decode(), int(partition))] = int(first)
    return found == expected


@dataclass(frozen=True)
class _Open:
    """A partition whose marker will be written: its producer state and the marker offset."""

    topic: str
    partition: int
    offset: int
    entry: ProducerEntry


def write_txn_markers(
    conn: Connection,
    partitions: Iterable[TopicPartitionKey],
    marker: Marker,
    *,
    skip_missing: bool = False,
    locked: MarkerLocks | None = None,
) -> list[TopicPartitionKey]:
    """Write ``marker`` on every partition of its producer's transaction; returns those
    where a record was written, in sorted order (a partition where the producer has no open
    transaction gets none, so a retry writes nothing twice).

    Raises the first refusal in sorted (topic, partition) order, as marking them one by one
    would, before anything is written: a fenced marker (stale producer or coordinator epoch)
    or, unless ``skip_missing`` (a deleted topic has nothing left to mark), a partition that
    does not exist. ``locked``: what ``lock_for_markers`` read, if this DB transaction
    already locked them all (its ``writes`` then take the markers'); else they are locked
    here and written at once.
    """
    producer_id, producer_epoch = marker.producer_id, marker.producer_epoch
    control_type = marker.control_type
    if control_type not in (CONTROL_ABORT, CONTROL_COMMIT):
        raise fail(KafkaError.INVALID_REQUEST, f"unknown control type {control_type}")
    wanted = sorted(set(partitions))
    if not wanted:
        return []
    if locked is None:
        locked = lock_for_markers(conn, wanted, producer_id)
    elif locked.producer_id != producer_id:
        raise AssertionError("the partitions were locked for another producer's markers")
    rows = locked.rows
    marked: list[_Open] = []
    for topic, partition in wanted:
        row = rows.get((topic, partition))
        if row is None:
            if skip_missing:
                continue
            raise fail(
                KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} [{partition}] does not exist"
            )
        entry = row.producer_entry()
        verdict = validate_marker(entry, marker)
        if not verdict.ok:
            raise fail(verdict.error_code, verdict.message)
        if entry is not None and entry.txn_first_offset is not None:
            marked.append(_Open(topic, partition, row.next_offset, entry))
    if not marked:
        return []
    first_others = locked.others_first_open
    values = []
    for o in marked:
        tp = (o.topic, o.partition)
        after = apply_marker(o.entry, marker, o.offset)
        lso = lso_after_marker(first_others.get(tp), o.offset + 1)
        rows[tp] = rows[tp].advanced(o.offset + 1, lso, after)  # as the marker leaves it
        forget(conn, tp)  # at a version not known here (a commit remembers it once committed)
        values.append(_marker_values(o, lso, after))
    writes = locked.writes
    if writes is not None:
        # The markers' write sets these partitions' rows and this producer's state on each
        # in full: an advance of them queued earlier in this request has nothing to add.
        writes.supersede(
            key
            for o in marked
            for key in (
                partition_key(o.topic, o.partition),
                producer_key(o.topic, o.partition, producer_id),
            )
        )
    execute_or_queue(
        conn,
        writes,
        sql.WRITE_MARKERS,
        {
            **{column: [v[column] for v in values] for column in values[0]},
            "timestamp": marker.timestamp_ms,
            "producer_id": producer_id,
            "producer_epoch": producer_epoch,
            "control_type": control_type,
            "coordinator_epoch": marker.coordinator_epoch,
            "is_abort": control_type == CONTROL_ABORT,
        },
    )
    return [(o.topic, o.partition) for o in marked]


def _marker_values(opened: _Open, lso: int, after: ProducerEntry) -> dict[str, Any]:
    """One partition's share of WRITE_MARKERS: the marker offset, the LSO after it, the first
    offset of the transaction it closes, and the producer's state after it."""
    return {
        "topics": opened.topic,
        "partitions": opened.partition,
        "offsets": opened.offset,
        "lsos": lso,
        "closed_first_offsets": opened.entry.txn_first_offset,
        "s_producer_epochs": after.producer_epoch,
        "s_last_sequences": after.last_sequence,
        "s_last_offsets": after.last_offset,
        "s_last_timestamps": after.last_timestamp,
        "s_batches": after.batches_json(),
        "s_coordinator_epochs": after.coordinator_epoch,
        "s_txn_first_offsets": after.txn_first_offset,
    }
