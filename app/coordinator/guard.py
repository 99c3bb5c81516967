"""The checks of a transactional write outside the coordinator: a batch (docs/design.md
§4, rule 6) and a TxnOffsetCommit (rule 9).

Runs inside the Produce handler's DB transaction, before the partition lock: the
transactional id's row is taken FOR SHARE, so an EndTxn (FOR UPDATE) cannot slip between
this check and the append. A late batch after an abort, a batch to an unregistered
partition, or one from a fenced instance is refused here and never reaches the log.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection

from app.coordinator import machines as m
from app.coordinator import sql
from app.coordinator.metadata import TxnMetadata, check_producer
from app.coordinator.txn_log import RememberedTxn, remembered_txn, versioned
from app.errors import KafkaError, KafkaException, fail
from app.protocol import ProduceRequest


def load_for_produce(conn: Connection, transactional_id: str) -> RememberedTxn | None:
    """The transactional id's row, taken FOR SHARE until COMMIT (so it cannot change under
    the produce: batches of one DB transaction may share one load), with its version."""
    row = conn.execute(sql.LOAD_FOR_SHARE, {"tid": transactional_id}).first()
    return None if row is None else versioned(row)


def check_produce(meta: TxnMetadata | None, req: ProduceRequest) -> None:
    """Refuse the batch unless its transaction is ongoing, with this identity, and has its
    partition (``meta``: the id's metadata as ``load_for_produce`` read it)."""
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


def admitted_on_remembered(
    conn: Connection, transactional_id: str, batches: Sequence[ProduceRequest]
) -> RememberedTxn | None:
    """The id's row as this process last wrote or read it, if it remembers one and every
    batch would be admitted on it (``check_produce``); else None: a refusal is decided only
    on the row read under its lock (docs/design.md §3.12)."""
    memory = remembered_txn(conn, transactional_id)
    if memory is None:
        return None
    try:
        for req in batches:
            check_produce(memory.leased.meta, req)
    except KafkaException:
        return None
    return memory


def check_txn_offsets(
    conn: Connection, transactional_id: str, producer_id: int, producer_epoch: int
) -> None:
    """Refuse transactional offsets unless their transaction is ongoing, with this
    identity, and has added offsets (AddOffsetsToTxn). The id's row is taken FOR SHARE, so
    the offsets are ordered against EndTxn as a transactional batch is."""
    loaded = load_for_produce(conn, transactional_id)
    meta = check_producer(
        None if loaded is None else loaded.leased.meta, producer_id, producer_epoch
    )
    if meta.state != m.BEGIN or not meta.has_offsets:
        raise fail(
            KafkaError.INVALID_TXN_STATE,
            "offsets were not added to an ongoing transaction (AddOffsetsToTxn)",
        )
