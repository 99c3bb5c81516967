"""What kafka-transactions.sh shows about partitions: producers, hanging transactions,
and the admin's last resort, aborting one (docs/design.md rule 10: ship tools to find and abort
hanging transactions)."""

from __future__ import annotations

from sqlalchemy import Connection

from app.errors import KafkaError, fail
from app.log import sql
from app.log.markers import Marker, MarkerLocks, lock_for_markers, write_txn_markers
from app.protocol import CONTROL_ABORT, HangingTransaction, ProducerDescription, TopicPartitionKey
from app.security import needs
from app.security.authorizer import authorize_all
from app.storage.context import BrokerContext
from app.storage.engine import retry_conflicts

__all__ = [
    "HangingTransaction", "ProducerDescription", "abort_hanging", "describe_producers",
    "find_hanging", "mark_partition",
]  # fmt: skip


def describe_producers(
    broker: BrokerContext, topic: str, partition: int
) -> list[ProducerDescription]:
    with broker.engine.connect() as conn:
        exists = conn.execute(
            sql.PARTITION_OFFSETS, {"topic": topic, "partition": partition}
        ).first()
        if exists is None:
            raise fail(
                KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} [{partition}] does not exist"
            )
        rows = conn.execute(sql.DESCRIBE_PRODUCERS, {"topic": topic, "partition": partition}).all()
    return [
        ProducerDescription(
            r.producer_id,
            r.producer_epoch,
            r.last_sequence,
            r.last_timestamp,
            r.coordinator_epoch,
            -1 if r.txn_first_offset is None else r.txn_first_offset,
        )
        for r in rows
    ]


def find_hanging(
    broker: BrokerContext, max_transaction_timeout_ms: int | None = None
) -> list[HangingTransaction]:
    """Open on a partition with no live coordinator transaction, or older than its timeout
    (or than ``max_transaction_timeout_ms`` when given, as kafka-transactions.sh does)."""
    with broker.engine.connect() as conn:
        rows = [HangingTransaction(*r) for r in conn.execute(sql.HANGING)]
        if max_transaction_timeout_ms is not None:
            now = broker.clock.now_ms()
            all_open = conn.execute(sql.OPEN_ON_PARTITIONS).all()
            seen = {(h.topic, h.partition, h.start_offset) for h in rows}
            for r in all_open:
                if (
                    r.topic,
                    r.partition,
                    r.start_offset,
                ) not in seen and now - r.started_ms > max_transaction_timeout_ms:
                    rows.append(HangingTransaction(*r[:6]))
    return sorted(rows, key=lambda h: (h.topic, h.partition, h.start_offset))


@retry_conflicts
def abort_hanging(broker: BrokerContext, topic: str, partition: int, start_offset: int) -> bool:
    """Write an ABORT marker for the transaction open at ``start_offset`` on the partition,
    with the producer's own epochs (kafka-transactions.sh abort). Unblocks the LSO.

    The transaction is looked up first only to know its producer; whether it is still open
    is decided under the partition lock, from the state read once it is held: its COMMIT
    (or ABORT) may have been waiting on the lock too, and the producer may have opened its
    next transaction since, which is not the one asked for."""
    tp = (topic, partition)
    with broker.engine.begin() as conn:
        authorize_all(conn, broker, needs.abort_hanging(topic))
        row = conn.execute(
            sql.OPEN_TXN_AT, {"topic": topic, "partition": partition, "start_offset": start_offset}
        ).first()
        locked = None if row is None else lock_for_markers(conn, [tp], row.producer_id)
        held = None if locked is None else locked.rows.get(tp)
        entry = None if held is None else held.producer_entry()
        if entry is None or entry.txn_first_offset != start_offset:
            raise fail(
                KafkaError.INVALID_TXN_STATE,
                f"no open transaction starts at offset {start_offset} of {topic} [{partition}]",
            )
        # As kafka-transactions.sh's abort: a coordinator epoch not known on the partition
        # (no marker of this producer written there yet) is taken as 0, which no
        # coordinator's epoch is below.
        marker = Marker(
            entry.producer_id, entry.producer_epoch, max(entry.coordinator_epoch, 0),
            CONTROL_ABORT, broker.clock.now_ms(),
        )  # fmt: skip
        return mark_partition(conn, tp, marker, locked)


def mark_partition(
    conn: Connection, tp: TopicPartitionKey, marker: Marker, locked: MarkerLocks | None = None
) -> bool:
    """The one decision behind an administrator's marker, from ``kip98 transactions abort``
    and from WriteTxnMarkers (Admin.abortTransaction) alike: the producer and coordinator
    epochs checked as for the coordinator's own markers (rule 7), then the marker written
    if the producer has a transaction open on the partition (the LSO moves, an ABORT's
    records become aborted for read_committed readers). Whether one was written."""
    return bool(write_txn_markers(conn, [tp], marker, locked=locked))
