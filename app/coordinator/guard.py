"""The produce-side check of a transactional batch (DESIGN §4, rule 6).

Runs inside the Produce handler's DB transaction, before the partition lock: the
transactional id's row is taken FOR SHARE, so an EndTxn (FOR UPDATE) cannot slip between
this check and the append. A late batch after an abort, a batch to an unregistered
partition, or one from a fenced instance is refused here and never reaches the log.
"""

from __future__ import annotations

from sqlalchemy import Connection

from app.coordinator import machines as m
from app.coordinator import sql
from app.coordinator.metadata import check_producer
from app.coordinator.txn_log import metadata_from_row
from app.errors import KafkaError, KafkaException, fail
from app.protocol import ProduceRequest


def check_transactional_produce(conn: Connection, req: ProduceRequest) -> None:
    assert req.transactional_id is not None
    row = conn.execute(sql.LOAD_FOR_SHARE, {"tid": req.transactional_id}).first()
    meta = None if row is None else metadata_from_row(row)
    try:
        check_producer(meta, req.producer_id, req.producer_epoch)
    except KafkaException as exc:
        if exc.error.code() == KafkaError.PRODUCER_FENCED:
            # The partition's answer to a stale epoch, as Kafka's leaders give it.
            raise fail(KafkaError.INVALID_PRODUCER_EPOCH, exc.error.str()) from exc
        raise
    assert meta is not None
    if meta.state != m.BEGIN:
        raise fail(KafkaError.INVALID_TXN_STATE, f"transaction is {meta.state}, not ongoing")
    if (req.topic, req.partition) not in meta.partitions:
        raise fail(
            KafkaError.INVALID_TXN_STATE,
            f"{req.topic} [{req.partition}] was not added to the transaction (AddPartitionsToTxn)",
        )
