"""The partition row lock with the producer's state, and the write that advances both.

The Produce handler's two statements around its COPY (DESIGN §3.1: the lock is taken
first and held to COMMIT by the caller's DB transaction); markers lock all partitions of a
transaction in one set-based statement of their own, but read the same row
(``PartitionRow``). These two run on the psycopg connection under the caller's SQLAlchemy
transaction: once per produced batch, SQLAlchemy's statement handling would cost more than
the statements' own planning (psycopg prepares them after a few executions). (Pipelining
the lock with the BEGIN was measured slower: psycopg's pipeline mode costs more than the
round trip it saves on a local server.)
"""

from __future__ import annotations

from typing import Any, NamedTuple

from psycopg import Connection as PgConnection
from sqlalchemy import Connection

from app.log import sql
from app.log.producer_state import ProducerEntry


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
        assert self.s_batches is not None
        return ProducerEntry.from_columns(
            self.s_producer_id,
            self.s_producer_epoch,  # type: ignore[arg-type]
            self.s_last_sequence,  # type: ignore[arg-type]
            self.s_last_offset,  # type: ignore[arg-type]
            self.s_last_timestamp,  # type: ignore[arg-type]
            self.s_batches,
            self.s_coordinator_epoch,  # type: ignore[arg-type]
            self.s_txn_first_offset,
        )


def driver_connection(conn: Connection) -> PgConnection[Any]:
    """The psycopg connection under a SQLAlchemy connection (same DB transaction)."""
    raw = conn.connection.driver_connection
    assert raw is not None
    return raw


def lock_partition(
    conn: Connection, topic: str, partition: int, producer_id: int
) -> PartitionRow | None:
    """Lock the partition row ``FOR UPDATE`` and read ``producer_id``'s state on it;
    None if the partition does not exist."""
    raw = driver_connection(conn)
    params = {"topic": topic, "partition": partition, "producer_id": producer_id}
    with raw.cursor() as cur:
        row = cur.execute(sql.LOCK_PARTITION, params).fetchone()
    return None if row is None else PartitionRow(*row)


def advance_partition(
    conn: Connection,
    topic: str,
    partition: int,
    next_offset: int,
    last_stable_offset: int,
    entry: ProducerEntry | None = None,
) -> None:
    """Move the partition's next offset and LSO and, given an entry, write the producer's
    state, in one statement."""
    params: dict[str, Any] = {
        "topic": topic,
        "partition": partition,
        "next_offset": next_offset,
        "last_stable_offset": last_stable_offset,
    }
    statement = sql.ADVANCE_PARTITION
    if entry is not None:
        statement = sql.ADVANCE_PARTITION_AND_UPSERT_PRODUCER
        params.update(
            producer_id=entry.producer_id,
            producer_epoch=entry.producer_epoch,
            last_sequence=entry.last_sequence,
            last_offset=entry.last_offset,
            last_timestamp=entry.last_timestamp,
            batches=entry.batches_json(),
            coordinator_epoch=entry.coordinator_epoch,
            txn_first_offset=entry.txn_first_offset,
        )
    with driver_connection(conn).cursor() as cur:
        cur.execute(statement, params)
