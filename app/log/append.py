"""The Produce handler: append one batch to one partition, exactly once.

One PostgreSQL transaction per request (one batch; with ``produce_many``, one batch per
partition): lock the partition row, read the producer's state, decide (pure rules in
``producer_state``), COPY the rows, advance the partition and the producer state, COMMIT.
The lock is held to COMMIT, so offsets are gapless and become visible in order. A
duplicate batch writes nothing and answers with its original offsets.

Per batch, the COPY payload is built in bulk (``copy_records``) and the lock and the
advance run on psycopg directly (``partition_lock``): this is the hot path of every
producer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Connection

from app.broker import Broker
from app.errors import KafkaError, KafkaException, fail
from app.faults import crash_point
from app.log import sql
from app.log.copy_records import Columns, encode_batch, record_size_bytes
from app.log.lso import lso_after_append
from app.log.partition_lock import advance_partition, driver_connection, lock_partition
from app.log.producer_state import (
    BatchMeta,
    apply_append,
    increment_sequence,
    is_expired,
    validate_append,
)
from app.protocol import (
    NO_PRODUCER_ID,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    ProduceRequest,
    ProduceResponse,
)
from app.security import needs
from app.security.authorizer import authorize_all
from app.storage.engine import retry_conflicts

__all__ = ["check_request", "produce", "produce_many", "produce_registering", "record_size_bytes"]

if TYPE_CHECKING:
    from app.coordinator.metadata import TxnMetadata


def check_request(req: ProduceRequest, max_bytes: int) -> Columns:
    """Shape rules a batch must meet before it touches the database; returns the batch's
    columns for the COPY."""
    if not req.records:
        raise fail(KafkaError.INVALID_RECORD, "a produce batch needs at least one record")
    if req.partition < 0:
        raise fail(KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"invalid partition {req.partition}")
    idempotent = req.producer_id != NO_PRODUCER_ID
    if idempotent and (req.producer_epoch < 0 or req.base_sequence < 0):
        raise fail(
            KafkaError.INVALID_RECORD, "an idempotent batch needs an epoch and a base sequence"
        )
    if req.is_transactional and not (idempotent and req.transactional_id):
        raise fail(
            KafkaError.INVALID_TXN_STATE,
            "a transactional batch needs a producer id and a transactional id",
        )
    columns = Columns(req.records)
    size = columns.size_bytes()
    if size > max_bytes:
        raise fail(
            KafkaError.MSG_SIZE_TOO_LARGE,
            f"batch of {size} bytes exceeds message.max.bytes={max_bytes}",
        )
    return columns


def copy_payload(conn: Connection, payload: bytes) -> None:
    """Binary COPY inside the handler's transaction (never one INSERT per record)."""
    with driver_connection(conn).cursor() as cur, cur.copy(sql.COPY_RECORDS) as copy:
        copy.write(payload)


@retry_conflicts
def produce(broker: Broker, req: ProduceRequest) -> ProduceResponse:
    try:
        columns = check_request(req, broker.settings.message_max_bytes)
        with broker.engine.begin() as conn:
            return _append(broker, conn, req, columns)
    except KafkaException as exc:
        return ProduceResponse(exc.error.code(), error_message=exc.error.str())


def produce_many(broker: Broker, requests: list[ProduceRequest]) -> list[ProduceResponse]:
    """Batches for several partitions in one DB transaction, one COMMIT for all of them
    (Kafka's ProduceRequest carries every partition bound for a leader).

    Each batch is decided and answered on its own, as with separate requests: a refused
    batch writes nothing (every refusal comes before its COPY) and the others go on.
    Partitions are locked in sorted order (DESIGN §3.3), held to the one COMMIT; a
    transactional id's row is read once, FOR SHARE, for all its batches.
    """
    return produce_registering(broker, requests, None)[1]


@retry_conflicts
def produce_registering(
    broker: Broker, requests: list[ProduceRequest], add: AddPartitionsToTxnRequest | None
) -> tuple[AddPartitionsToTxnResponse | None, list[ProduceResponse]]:
    """``produce_many`` that first registers ``add``'s partitions with their transaction,
    in the same DB transaction (KIP-890's implicit AddPartitionsToTxn): the registration and
    the batches commit together or not at all, so no batch is ever in the log of a partition
    its coordinator does not know (rule 6). The coordinator's own rules decide the
    registration (identity, fencing, state, ACLs); if it is refused, the batches of its
    partitions are answered with its error and write nothing.
    """
    responses: dict[int, ProduceResponse] = {}
    columns: dict[int, Columns] = {}
    for i, req in enumerate(requests):
        try:
            columns[i] = check_request(req, broker.settings.message_max_bytes)
        except KafkaException as exc:
            responses[i] = ProduceResponse(exc.error.code(), error_message=exc.error.str())
    valid = sorted(columns, key=lambda i: (requests[i].topic, requests[i].partition))
    loaded: dict[str, TxnMetadata | None] = {}
    registered = None
    with broker.engine.begin() as conn:
        if add is not None:
            # The data plane asking the coordinator, as a partition leader does in KIP-890.
            from app.coordinator.handlers import register_partitions

            registered = register_partitions(conn, broker, add)
            if registered.error_code != KafkaError.NO_ERROR:
                for i in valid:
                    tp = (requests[i].topic, requests[i].partition)
                    if tp in registered.results:
                        code = registered.results[tp]
                        responses[i] = ProduceResponse(code, error_message=registered.error_message)
                valid = [i for i in valid if i not in responses]
        for i in valid:
            try:
                responses[i] = _append(broker, conn, requests[i], columns[i], loaded)
            except KafkaException as exc:
                responses[i] = ProduceResponse(exc.error.code(), error_message=exc.error.str())
    return registered, [responses[i] for i in range(len(requests))]


def _append(
    broker: Broker,
    conn: Connection,
    req: ProduceRequest,
    columns: Columns,
    loaded: dict[str, TxnMetadata | None] | None = None,
) -> ProduceResponse:
    """Append one batch in the caller's DB transaction; raises KafkaException for a
    refusal, always before writing anything. ``columns``: the batch as ``check_request``
    transposed it; ``loaded``: transactional metadata already read FOR SHARE in this DB
    transaction, by id."""
    authorize_all(conn, broker, needs.produce(req.topic, req.transactional_id))
    if req.is_transactional:
        from app.coordinator.guard import check_produce, load_for_produce

        assert req.transactional_id is not None
        cache = {} if loaded is None else loaded
        if req.transactional_id not in cache:
            cache[req.transactional_id] = load_for_produce(conn, req.transactional_id)
        check_produce(cache[req.transactional_id], req)
    row = lock_partition(conn, req.topic, req.partition, req.producer_id)
    if row is None:
        raise fail(
            KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"{req.topic} [{req.partition}] does not exist"
        )
    base_offset = row.next_offset
    count = len(columns)
    next_offset = base_offset + count
    timestamps = columns.stamped(broker.clock.now_ms())
    max_ts = max(timestamps)

    if req.producer_id == NO_PRODUCER_ID:
        lso = lso_after_append(row.last_stable_offset, base_offset, next_offset, opens_txn=False)
        payload = encode_batch(
            req.topic, req.partition, base_offset, columns, timestamps,
            NO_PRODUCER_ID, req.producer_epoch, -1, req.is_transactional,
        )  # fmt: skip
        copy_payload(conn, payload)
        advance_partition(conn, req.topic, req.partition, next_offset, lso)
        return ProduceResponse(KafkaError.NO_ERROR, base_offset, row.log_start_offset)

    entry = row.producer_entry()
    if entry is not None and is_expired(entry, max_ts, broker.settings.producer_id_expiration_ms):
        entry = None
    last_seq = increment_sequence(req.base_sequence, count - 1)
    verdict = validate_append(
        entry, req.producer_epoch, req.base_sequence, last_seq, req.is_transactional
    )
    if verdict.duplicate_of is not None:
        return ProduceResponse(
            KafkaError.NO_ERROR,
            verdict.duplicate_of.first_offset,
            row.log_start_offset,
            duplicate=True,
        )
    if not verdict.ok:
        raise fail(verdict.error_code, verdict.message)

    opens_txn = req.is_transactional and (entry is None or entry.txn_first_offset is None)
    batch = BatchMeta(req.base_sequence, last_seq, base_offset, next_offset - 1)
    new_entry = apply_append(
        entry, req.producer_id, req.producer_epoch, batch, max_ts, req.is_transactional
    )
    lso = lso_after_append(row.last_stable_offset, base_offset, next_offset, opens_txn)
    payload = encode_batch(
        req.topic, req.partition, base_offset, columns, timestamps,
        req.producer_id, req.producer_epoch, req.base_sequence, req.is_transactional,
    )  # fmt: skip
    copy_payload(conn, payload)
    crash_point("append.after_copy")
    advance_partition(conn, req.topic, req.partition, next_offset, lso, new_entry)
    return ProduceResponse(KafkaError.NO_ERROR, base_offset, row.log_start_offset)
