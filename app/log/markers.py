"""WriteTxnMarker, the partition side: a COMMIT or ABORT control record.

Only the coordinator calls this (there is no client path to a control record). Under the
partition lock it checks the producer and coordinator epochs (rule 7), writes the marker,
closes the producer's open transaction, adds an aborted-index entry on ABORT with the LSO of
that moment, and moves the LSO, all in the caller's DB transaction. A marker for a producer
with no open transaction on the partition writes nothing, which makes retries idempotent.
"""

from __future__ import annotations

from sqlalchemy import Connection, text

from app.errors import KafkaError, fail
from app.log import sql
from app.log.lso import lso_after_marker
from app.log.partition_lock import advance_partition, lock_partition
from app.log.producer_state import apply_marker, validate_marker
from app.protocol import CONTROL_ABORT, CONTROL_COMMIT

INSERT_MARKER = text(
    """
    INSERT INTO records (topic, partition, "offset", "timestamp", key, value, headers, producer_id,
        producer_epoch, sequence, batch_base_offset, is_transactional, is_control, control_type,
        coordinator_epoch)
    VALUES (:topic, :partition, :offset, :timestamp, NULL, NULL, NULL, :producer_id,
        :producer_epoch, -1, :offset, true, true, :control_type, :coordinator_epoch)
    """
)


def write_txn_marker(
    conn: Connection,
    topic: str,
    partition: int,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    control_type: int,
    now_ms: int,
) -> bool:
    """Write one marker; returns whether a record was written. Raises KafkaException when
    the marker is fenced (stale producer or coordinator epoch) or the partition is gone."""
    if control_type not in (CONTROL_ABORT, CONTROL_COMMIT):
        raise fail(KafkaError.INVALID_REQUEST, f"unknown control type {control_type}")
    row = lock_partition(conn, topic, partition, producer_id)
    if row is None:
        raise fail(KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} [{partition}] does not exist")
    entry = row.producer_entry()
    verdict = validate_marker(entry, producer_epoch, coordinator_epoch)
    if not verdict.ok:
        raise fail(verdict.error_code, verdict.message)
    if entry is None or entry.txn_first_offset is None:
        return False
    offset = row.next_offset
    first_other = conn.execute(
        sql.FIRST_OPEN_TXN_OFFSET,
        {"topic": topic, "partition": partition, "producer_id": producer_id},
    ).scalar()
    lso = lso_after_marker(first_other, offset + 1)
    conn.execute(
        INSERT_MARKER,
        {
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "timestamp": now_ms,
            "producer_id": producer_id,
            "producer_epoch": producer_epoch,
            "control_type": control_type,
            "coordinator_epoch": coordinator_epoch,
        },
    )
    if control_type == CONTROL_ABORT:
        conn.execute(
            sql.INSERT_ABORTED_TXN,
            {
                "topic": topic,
                "partition": partition,
                "producer_id": producer_id,
                "first_offset": entry.txn_first_offset,
                "last_offset": offset,
                "last_stable_offset": lso,
            },
        )
    new_entry = apply_marker(entry, producer_id, producer_epoch, coordinator_epoch, offset, now_ms)
    advance_partition(conn, topic, partition, offset + 1, lso, new_entry)
    return True
