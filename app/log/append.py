"""The Produce handler: append one batch to one partition, exactly once.

One PostgreSQL transaction per request (one batch; with ``produce_many``, one batch per
partition): lock the partition row, read the producer's state, decide (pure rules in
``producer_state``), COPY the rows, advance the partition and the producer state, COMMIT.
The lock is held to COMMIT, so offsets are gapless and become visible in order. A
duplicate batch writes nothing and answers with its original offsets.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from psycopg.types.string import BytesBinaryDumper
from sqlalchemy import Connection, Row

from app.broker import Broker
from app.errors import KafkaError, KafkaException, fail
from app.faults import crash_point
from app.log import sql
from app.log.lso import lso_after_append
from app.log.producer_state import (
    BatchMeta,
    ProducerEntry,
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
    RecordIn,
)
from app.security import needs
from app.security.authorizer import authorize_all
from app.storage.engine import retry_conflicts

if TYPE_CHECKING:
    from app.coordinator.metadata import TxnMetadata

RECORD_OVERHEAD_BYTES = 24


def record_size_bytes(
    key: bytes | None, value: bytes | None, headers: list[dict[str, Any]] | None
) -> int:
    """An estimate of one record's wire size, for ``message.max.bytes`` checks."""
    size = RECORD_OVERHEAD_BYTES + len(key or b"") + len(value or b"")
    return size + len(json.dumps(headers)) if headers else size


def batch_size_bytes(records: list[RecordIn]) -> int:
    return sum(record_size_bytes(r.key, r.value, r.headers) for r in records)


def check_request(req: ProduceRequest, max_bytes: int) -> None:
    """Shape rules a batch must meet before it touches the database."""
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
    size = batch_size_bytes(req.records)
    if size > max_bytes:
        raise fail(
            KafkaError.MSG_SIZE_TOO_LARGE,
            f"batch of {size} bytes exceeds message.max.bytes={max_bytes}",
        )


def entry_from_row(row: Row[Any]) -> ProducerEntry | None:
    if row.s_producer_id is None:
        return None
    return ProducerEntry(
        producer_id=row.s_producer_id,
        producer_epoch=row.s_producer_epoch,
        last_sequence=row.s_last_sequence,
        last_offset=row.s_last_offset,
        last_timestamp=row.s_last_timestamp,
        batches=tuple(BatchMeta.from_json(b) for b in row.s_batches),
        coordinator_epoch=row.s_coordinator_epoch,
        txn_first_offset=row.s_txn_first_offset,
    )


def entry_params(topic: str, partition: int, entry: ProducerEntry) -> dict[str, Any]:
    return {
        "topic": topic,
        "partition": partition,
        "producer_id": entry.producer_id,
        "producer_epoch": entry.producer_epoch,
        "last_sequence": entry.last_sequence,
        "last_offset": entry.last_offset,
        "last_timestamp": entry.last_timestamp,
        "batches": json.dumps([b.to_json() for b in entry.batches]),
        "coordinator_epoch": entry.coordinator_epoch,
        "txn_first_offset": entry.txn_first_offset,
    }


def copy_rows(conn: Connection, rows: list[tuple[Any, ...]]) -> None:
    """Binary COPY inside the handler's transaction (never one INSERT per record)."""
    raw = conn.connection.driver_connection
    assert raw is not None
    # Without this, bytea goes through DB-API's Binary dumper, written in Python.
    raw.adapters.register_dumper(bytes, BytesBinaryDumper)
    with raw.cursor() as cur, cur.copy(sql.COPY_RECORDS) as copy:
        copy.set_types(list(sql.RECORD_TYPES))
        for row in rows:
            copy.write_row(row)


def build_rows(
    req: ProduceRequest, base_offset: int, now_ms: int
) -> tuple[list[tuple[Any, ...]], int]:
    """Rows for COPY, and the batch's max timestamp (0 or negative means 'now')."""
    rows = []
    max_ts = -1
    idempotent = req.producer_id != NO_PRODUCER_ID
    seq = req.base_sequence if idempotent else -1
    for i, r in enumerate(req.records):
        ts = r.timestamp if r.timestamp > 0 else now_ms
        max_ts = max(max_ts, ts)
        rows.append(
            (
                req.topic,
                req.partition,
                base_offset + i,
                ts,
                r.key,
                r.value,
                r.headers,
                req.producer_id,
                req.producer_epoch,
                increment_sequence(seq, i) if idempotent else -1,
                base_offset,
                req.is_transactional,
                False,
                None,
                None,
            )
        )
    return rows, max_ts


@retry_conflicts
def produce(broker: Broker, req: ProduceRequest) -> ProduceResponse:
    try:
        check_request(req, broker.settings.message_max_bytes)
        with broker.engine.begin() as conn:
            return _append(broker, conn, req)
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
    valid: list[int] = []
    for i, req in enumerate(requests):
        try:
            check_request(req, broker.settings.message_max_bytes)
            valid.append(i)
        except KafkaException as exc:
            responses[i] = ProduceResponse(exc.error.code(), error_message=exc.error.str())
    valid.sort(key=lambda i: (requests[i].topic, requests[i].partition))
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
                responses[i] = _append(broker, conn, requests[i], loaded)
            except KafkaException as exc:
                responses[i] = ProduceResponse(exc.error.code(), error_message=exc.error.str())
    return registered, [responses[i] for i in range(len(requests))]


def _append(
    broker: Broker,
    conn: Connection,
    req: ProduceRequest,
    loaded: dict[str, TxnMetadata | None] | None = None,
) -> ProduceResponse:
    """Append one batch in the caller's DB transaction; raises KafkaException for a
    refusal, always before writing anything. ``loaded``: transactional metadata already
    read FOR SHARE in this DB transaction, by id."""
    authorize_all(conn, broker, needs.produce(req.topic, req.transactional_id))
    if req.is_transactional:
        from app.coordinator.guard import check_produce, load_for_produce

        assert req.transactional_id is not None
        cache = {} if loaded is None else loaded
        if req.transactional_id not in cache:
            cache[req.transactional_id] = load_for_produce(conn, req.transactional_id)
        check_produce(cache[req.transactional_id], req)
    row = conn.execute(
        sql.LOCK_PARTITION,
        {"topic": req.topic, "partition": req.partition, "producer_id": req.producer_id},
    ).first()
    if row is None:
        raise fail(
            KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"{req.topic} [{req.partition}] does not exist"
        )
    base_offset = row.next_offset
    rows, max_ts = build_rows(req, base_offset, broker.clock.now_ms())
    next_offset = base_offset + len(rows)
    params = {"topic": req.topic, "partition": req.partition, "next_offset": next_offset}

    if req.producer_id == NO_PRODUCER_ID:
        lso = lso_after_append(row.last_stable_offset, base_offset, next_offset, opens_txn=False)
        copy_rows(conn, rows)
        conn.execute(sql.ADVANCE_PARTITION, {**params, "last_stable_offset": lso})
        return ProduceResponse(KafkaError.NO_ERROR, base_offset, row.log_start_offset)

    entry = entry_from_row(row)
    if entry is not None and is_expired(entry, max_ts, broker.settings.producer_id_expiration_ms):
        entry = None
    last_seq = increment_sequence(req.base_sequence, len(rows) - 1)
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
    copy_rows(conn, rows)
    crash_point("append.after_copy")
    conn.execute(
        sql.ADVANCE_PARTITION_AND_UPSERT_PRODUCER,
        {**entry_params(req.topic, req.partition, new_entry), **params, "last_stable_offset": lso},
    )
    return ProduceResponse(KafkaError.NO_ERROR, base_offset, row.log_start_offset)
