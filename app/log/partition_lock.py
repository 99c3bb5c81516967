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

An append's advance returns the partition rows' new versions, and the process remembers
each row as it wrote it (docs/design.md rule 32): while one producer writes a partition,
its next append decides on that row and lets its advance, sent first, check that the row
is still that version, sparing the lock's statement (about a fifth of what a 1000-record
batch spends beside its COPY and COMMIT). The memory is only ever a hint.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any, NamedTuple

from psycopg import pq
from sqlalchemy import Connection

from app.log import sql
from app.log.producer_state import ProducerEntry
from app.protocol import TopicPartitionKey
from app.storage.driver import WriteBehind, driver_connection
from app.storage.memory import EngineMemory
from app.storage.one_query import (
    Check,
    Refused,
    as_prepared,
    call,
    prepare_once,
    prepared_call,
    write_checked,
)


class PartitionRow(NamedTuple):
    """The locked partition row and the state of one producer on it (None fields: no state).
    ``max_message_bytes`` (None: the broker's) and ``log_append_time`` are the topic's
    configs an append obeys, kept on the row (``topic_config.PartitionColumns``)."""

    next_offset: int
    log_start_offset: int
    last_stable_offset: int
    max_message_bytes: int | None
    log_append_time: bool
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
        return ProducerEntry.from_row(self[_STATE:])

    def with_state(self, entry: ProducerEntry | None) -> PartitionRow:
        """The row with ``entry`` as its producer's state (None: a producer without state
        on the partition)."""
        if entry is None:
            return PartitionRow._make((*self[:_STATE], *NO_STATE))
        return self.advanced(self.next_offset, self.last_stable_offset, entry)

    def advanced(
        self, next_offset: int, last_stable_offset: int, entry: ProducerEntry | None
    ) -> PartitionRow:
        """The row as an append left it (``entry``: the producer's state after it, None if
        the append did not change it), for a later step of the same DB transaction."""
        if entry is None:
            return self._replace(next_offset=next_offset, last_stable_offset=last_stable_offset)
        return PartitionRow(
            next_offset,
            self.log_start_offset,
            last_stable_offset,
            self.max_message_bytes,
            self.log_append_time,
            entry.producer_id,
            entry.producer_epoch,
            entry.last_sequence,
            entry.last_offset,
            entry.last_timestamp,
            [b.to_json() for b in entry.batches],
            entry.coordinator_epoch,
            entry.txn_first_offset,
        )


# Where a PartitionRow's producer state begins, and its columns for a producer without
# state on the partition.
_STATE = 5
NO_STATE = (None,) * 8


class RowVersion(NamedTuple):
    """A partition row's version: the transaction that wrote it (``xmin``, as text) and
    the next offset it holds (an earlier step of that same transaction may have written
    the row before)."""

    xmin: str
    next_offset: int


class Remembered(NamedTuple):
    """A partition row as this process's last append left it: its version and contents,
    with the state of the producer that appended."""

    version: RowVersion
    row: PartitionRow


# The partition rows this process's appends and markers last wrote (rule 32): a hint an
# append may decide on without reading the row, its advance then checking that the row is
# still that version.
_remembered: EngineMemory[TopicPartitionKey, Remembered] = EngineMemory()


def remembered(conn: Connection, tp: TopicPartitionKey) -> Remembered | None:
    """The partition row as this process last wrote it to ``conn``'s database, if it did."""
    return _remembered.get(conn, tp)


def remember(conn: Connection, tp: TopicPartitionKey, xmin: str, row: PartitionRow) -> None:
    """The partition row this DB transaction has just written (``xmin``: its version)."""
    _remembered.put(conn, tp, Remembered(RowVersion(xmin, row.next_offset), row))


def forget(conn: Connection, tp: TopicPartitionKey) -> None:
    """Drop what this process remembers of a partition row (another wrote it since)."""
    _remembered.drop(conn, tp)


def lock_versions_query(conn: Connection, partitions: Sequence[TopicPartitionKey]) -> bytes:
    """LOCK_PARTITION_VERSIONS for ``partitions`` (sorted), as a statement of a query
    string (``storage.one_query``): locks them as ``lock_partitions`` does, in the same
    order, and gives their versions for ``versions_match``."""
    params = {"topics": [t for t, _ in partitions], "partitions": [p for _, p in partitions]}
    return prepared_call(conn, sql.LOCK_PARTITION_VERSIONS, params)


def written_versions_query(conn: Connection, partitions: Iterable[TopicPartitionKey]) -> bytes:
    """PARTITION_VERSIONS (``versions_read``) as a statement of a query string that writes
    the rows: its result's rows, read by ``written_versions``, are the versions they are
    left at."""
    return prepared_call(conn, *versions_read(partitions))


def written_versions(result: pq.abc.PGresult) -> dict[TopicPartitionKey, str]:
    """Each partition's version in ``written_versions_query``'s result."""
    found = {}
    for i in range(result.ntuples):
        topic, partition, xmin = (result.get_value(i, c) for c in range(3))
        assert topic is not None and partition is not None and xmin is not None
        found[(topic.decode(), int(partition))] = xmin.decode()
    return found


def versions_match(result: pq.abc.PGresult, expected: dict[TopicPartitionKey, RowVersion]) -> bool:
    """Whether the rows ``lock_versions_query`` locked are every one of ``expected`` and
    each still that version."""
    found = {}
    for i in range(result.ntuples):
        topic, partition, xmin, next_offset = (result.get_value(i, c) for c in range(4))
        assert topic is not None and partition is not None and xmin is not None
        assert next_offset is not None
        found[(topic.decode(), int(partition))] = RowVersion(xmin.decode(), int(next_offset))
    return found == expected


def lock_partitions(
    conn: Connection, wanted: Sequence[tuple[str, int, int]]
) -> dict[TopicPartitionKey, PartitionRow]:
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
) -> dict[TopicPartitionKey, PartitionRow]:
    """The rows LOCK_PARTITIONS returned for ``wanted``, by partition. If a lock was waited
    for and its holder wrote (a row not ``unmoved``), the joined states may be from before
    that write: they are read again, now that the locks are held."""
    if all(row[-1] for row in rows):
        return {(row[0], row[1]): PartitionRow._make(row[2:-1]) for row in rows}
    with driver_connection(conn).cursor() as cur:
        states = cur.execute(sql.PRODUCER_STATES, lock_params(wanted)).fetchall()
    locked = {(row[0], row[1]): row[2 : 2 + _STATE] for row in rows}
    found = {(s[0], s[1], s[2]): s[2:] for s in states}
    return {
        (t, p): PartitionRow._make((*locked[(t, p)], *found.get((t, p, pid), NO_STATE)))
        for t, p, pid in wanted
        if (t, p) in locked
    }


def producer_states(
    conn: Connection, wanted: Sequence[tuple[str, int, int]]
) -> dict[tuple[str, int, int], ProducerEntry | None]:
    """The state of each (topic, partition, producer_id) of ``wanted`` (None: none), read
    with the partitions' locks held: for a request whose batches of several producers go
    to one partition, the producers other than the one its row was locked with."""
    with driver_connection(conn).cursor() as cur:
        found = cur.execute(sql.PRODUCER_STATES, lock_params(wanted)).fetchall()
    states: dict[tuple[str, int, int], ProducerEntry | None] = dict.fromkeys(wanted)
    for row in found:
        entry = ProducerEntry.from_row(row[2:])
        states[(row[0], row[1], entry.producer_id)] = entry
    return states


def advance_partitions(
    writes: WriteBehind,
    advances: Sequence[tuple[str, int, int, int]],
    entries: Sequence[tuple[str, int, ProducerEntry]],
) -> None:
    """Queue on ``writes`` the advance of several partitions in one statement: ``advances``
    are (topic, partition, next_offset, last_stable_offset); ``entries`` the producer
    states to write, by partition (``versions_read`` gives the rows' versions after it)."""
    params = {
        "topics": [a[0] for a in advances],
        "partitions": [a[1] for a in advances],
        "next_offsets": [a[2] for a in advances],
        "lsos": [a[3] for a in advances],
        **_state_params(entries),
    }
    sets: list[Hashable] = [partition_key(t, p) for t, p, _, _ in advances]
    sets += [producer_key(t, p, e.producer_id) for t, p, e in entries]
    writes.add(sql.ADVANCE_PARTITIONS, params, sets)


def versions_read(partitions: Iterable[TopicPartitionKey]) -> tuple[str, dict[str, Any]]:
    """PARTITION_VERSIONS as a read to run after a DB transaction's queued writes
    (``WriteBehind.send_reading``): each row's (topic, partition, version)."""
    tps = sorted(partitions)
    return sql.PARTITION_VERSIONS, {
        "topics": [t for t, _ in tps],
        "partitions": [p for _, p in tps],
    }


# A partition's advance on its remembered row: (topic, partition, next_offset, lso), the
# producer's state after it, and the version the row must still be.
RememberedAdvance = tuple[tuple[str, int, int, int], ProducerEntry, RowVersion]


def append_remembered_committed(
    conn: Connection,
    advances: Sequence[RememberedAdvance],
    payloads: list[bytes],
    guard: Check | None = None,
) -> list[str] | Refused:
    """Each partition advanced with its producer's state, as ``advance_partitions`` does,
    if its row is still the version given (ADVANCE_REMEMBERED), in the order given (the
    lock order, docs/design.md §3.3), then the COPYs of ``payloads``, behind ``guard``'s
    read if any, as one checked query string that commits (``one_query.write_checked``):
    each row's new version, or ``Refused`` with nothing written.

    The payloads are built before the query is sent, not while the server runs the
    advances, though that would hide their encoding (~0.2 ms a 1000-record batch): from
    the first advance on, the session holds partition rows and waits for the COPY's data,
    which no timeout of PostgreSQL's bounds, so a process paused meanwhile would stall
    the partitions' other writers until it resumed (docs/design.md rule 24). Built first,
    that wait is only the hand-over."""
    prepare_once(
        conn,
        sql.ADVANCE_REMEMBERED_NAME,
        as_prepared(sql.ADVANCE_REMEMBERED, sql.ADVANCE_REMEMBERED_PARAMS),
    )
    statements: list[bytes | Check] = [] if guard is None else [guard]
    for advance, entry, version in advances:
        params = _remembered_params(advance, entry, version)
        values = [params[name] for name in sql.ADVANCE_REMEMBERED_PARAMS]
        statement = call(conn, sql.ADVANCE_REMEMBERED_NAME, values)
        statements.append(Check(statement, _advanced, "a partition row moved"))
    results = write_checked(
        conn, sql.COPY_RECORDS, statements, payloads, stop="append.in_one_query"
    )
    if isinstance(results, Refused):
        return results
    versions = []
    for advanced in results[len(statements) - len(advances) :]:
        version_after = advanced.get_value(0, 2)
        assert version_after is not None
        versions.append(version_after.decode())
    return versions


def _advanced(result: pq.abc.PGresult) -> bool:
    """Whether a remembered advance matched its row (it was still that version)."""
    return bool(result.ntuples)


def _remembered_params(
    advance: tuple[str, int, int, int], entry: ProducerEntry, version: RowVersion
) -> dict[str, Any]:
    topic, partition, next_offset, lso = advance
    return {
        "topic": topic,
        "partition": partition,
        "next_offset": next_offset,
        "lso": lso,
        "xmin": version.xmin,
        "expected": version.next_offset,
        "producer_id": entry.producer_id,
        "producer_epoch": entry.producer_epoch,
        "last_sequence": entry.last_sequence,
        "last_offset": entry.last_offset,
        "last_timestamp": entry.last_timestamp,
        "batches": entry.batches_json(),
        "coordinator_epoch": entry.coordinator_epoch,
        "txn_first_offset": entry.txn_first_offset,
    }


def _state_params(entries: Sequence[tuple[str, int, ProducerEntry]]) -> dict[str, Any]:
    """The producer states to write, as the advances' ``s_*`` arrays."""
    return {
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


def partition_key(topic: str, partition: int) -> tuple[str, str, int]:
    """A partition row, as the writes queued on a ``WriteBehind`` name what they set."""
    return ("partition", topic, partition)


def producer_key(topic: str, partition: int, producer_id: int) -> tuple[str, str, int, int]:
    """A producer's state on a partition, as the queued writes name what they set."""
    return ("producer", topic, partition, producer_id)
