"""The partition row lock with the producer's state, and the write that advances both.

The Produce handler's statements around its COPY (docs/design.md §3.1: the lock is taken first
and held to COMMIT by the caller's DB transaction), set-based: all partitions of a request in
one statement (markers lock theirs the same way). They run on the psycopg
connection under the caller's SQLAlchemy transaction: once per produced batch,
SQLAlchemy's statement handling would cost more than the statements' own planning (psycopg
prepares them after a few executions).

The producer's state is read with the lock, and read again, by a statement of its own,
when the lock was waited for and its holder wrote (``unmoved`` false: see
sql.LOCK_PARTITIONS): one that waited sees the partition row as the holder left it but every
other row as it was before the wait (READ COMMITTED re-checks only the locked row), and
would take a batch whose first attempt committed meanwhile for a new one. (Reading it
always in a second statement, pipelined, was measured ~15% slower a batch: psycopg's
pipeline mode costs more than the round trip it saves on a local server, as pipelining the
lock with the BEGIN did. It pays from several statements on: ``markers.lock_for_markers``
and ``storage.driver.WriteBehind``.)
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import Connection

from app.log import sql
from app.log.producer_state import ProducerEntry
from app.storage.driver import WriteBehind, driver_connection, execute_or_queue


class PartitionRow(NamedTuple):
    """The locked partition row and the state of one producer on it (None fields: no state)."""

    next_offset: int
    log_start_offset: int
    last_stable_offset: int
    s_producer_id: int | None
    s_producer_epoch: int | None
    s_last_sequence: int | None
    s_last_offset: int | None
    s_last_timestamp: int | None
    s_batches: list[list[int]] | None
    s_coordinator_epoch: int | None
    s_txn_first_offset: int | None

    def producer_entry(self) -> ProducerEntry | None:
        if self.s_producer_id is None:
            return None
        return ProducerEntry.from_row(self[3:])

    def advanced(
        self, next_offset: int, last_stable_offset: int, entry: ProducerEntry | None
    ) -> PartitionRow:
        """The row as an append left it (``entry``: the producer's state after it, None if
        the append did not change it), for a later step of the same DB transaction."""
        row = self._replace(next_offset=next_offset, last_stable_offset=last_stable_offset)
        if entry is None:
            return row
        return row._replace(
            s_producer_id=entry.producer_id,
            s_producer_epoch=entry.producer_epoch,
            s_last_sequence=entry.last_sequence,
            s_last_offset=entry.last_offset,
            s_last_timestamp=entry.last_timestamp,
            s_batches=[b.to_json() for b in entry.batches],
            s_coordinator_epoch=entry.coordinator_epoch,
            s_txn_first_offset=entry.txn_first_offset,
        )


# The state columns of a PartitionRow for a producer without state on the partition.
NO_STATE = (None,) * 8


TopicPartition = tuple[str, int]


def lock_partitions(
    conn: Connection, wanted: Sequence[tuple[str, int, int]]
) -> dict[TopicPartition, PartitionRow]:
    """Lock the rows of ``wanted`` (topic, partition, producer_id), in sorted order, in one
    statement; each with that producer's state on it as it is once the locks are held.
    Missing partitions are left out."""
    with driver_connection(conn).cursor() as cur:
        rows = cur.execute(sql.LOCK_PARTITIONS, lock_params(wanted)).fetchall()
    return partition_rows(conn, wanted, rows)


def lock_params(wanted: Sequence[tuple[str, int, int]]) -> dict[str, Any]:
    """The parameters of LOCK_PARTITIONS and PRODUCER_STATES for ``wanted``."""
    return {
        "topics": [t for t, _, _ in wanted],
        "partitions": [p for _, p, _ in wanted],
        "producer_ids": [pid for _, _, pid in wanted],
    }


def partition_rows(
    conn: Connection, wanted: Sequence[tuple[str, int, int]], rows: Sequence[Sequence[Any]]
) -> dict[TopicPartition, PartitionRow]:
    """The rows LOCK_PARTITIONS returned for ``wanted``, by partition. If a lock was waited
    for and its holder wrote (a row not ``unmoved``), the joined states may be from before
    that write: they are read again, now that the locks are held."""
    if all(row[-1] for row in rows):
        return {(row[0], row[1]): PartitionRow._make(row[2:-1]) for row in rows}
    with driver_connection(conn).cursor() as cur:
        states = cur.execute(sql.PRODUCER_STATES, lock_params(wanted)).fetchall()
    locked = {(row[0], row[1]): row[2:5] for row in rows}
    found = {(s[0], s[1], s[2]): s[2:] for s in states}
    return {
        (t, p): PartitionRow._make((*locked[(t, p)], *found.get((t, p, pid), NO_STATE)))
        for t, p, pid in wanted
        if (t, p) in locked
    }


def advance_partitions(
    conn: Connection,
    advances: Sequence[tuple[str, int, int, int]],
    entries: Sequence[tuple[str, int, ProducerEntry]],
    writes: WriteBehind | None = None,
) -> None:
    """Advance several partitions in one statement: ``advances`` are
    (topic, partition, next_offset, last_stable_offset); ``entries`` the producer states
    to write, by partition. Given ``writes``, the statement is queued there."""
    params: dict[str, Any] = {
        "topics": [a[0] for a in advances],
        "partitions": [a[1] for a in advances],
        "next_offsets": [a[2] for a in advances],
        "lsos": [a[3] for a in advances],
        "s_topics": [t for t, _, _ in entries],
        "s_partitions": [p for _, p, _ in entries],
        "s_producer_ids": [e.producer_id for _, _, e in entries],
        "s_producer_epochs": [e.producer_epoch for _, _, e in entries],
        "s_last_sequences": [e.last_sequence for _, _, e in entries],
        "s_last_offsets": [e.last_offset for _, _, e in entries],
        "s_last_timestamps": [e.last_timestamp for _, _, e in entries],
        "s_batches": [e.batches_json() for _, _, e in entries],
        "s_coordinator_epochs": [e.coordinator_epoch for _, _, e in entries],
        "s_txn_first_offsets": [e.txn_first_offset for _, _, e in entries],
    }
    sets: list[Hashable] = [partition_key(t, p) for t, p, _, _ in advances]
    sets += [producer_key(t, p, e.producer_id) for t, p, e in entries]
    execute_or_queue(conn, writes, sql.ADVANCE_PARTITIONS, params, sets)


def partition_key(topic: str, partition: int) -> tuple[str, str, int]:
    """A partition row, as the writes queued on a ``WriteBehind`` name what they set."""
    return ("partition", topic, partition)


def producer_key(topic: str, partition: int, producer_id: int) -> tuple[str, str, int, int]:
    """A producer's state on a partition, as the queued writes name what they set."""
    return ("producer", topic, partition, producer_id)
