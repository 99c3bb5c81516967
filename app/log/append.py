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

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import Connection

from app.errors import KafkaError, KafkaException, fail
from app.faults import crash_point
from app.log import sql
from app.log.copy_records import Columns, copy_payload_of, encode_rows, record_size_bytes
from app.log.lso import lso_after_append
from app.log.partition_lock import (
    PartitionRow,
    TopicPartition,
    advance_partition,
    advance_partitions,
    lock_partition,
    lock_partitions,
)
from app.log.producer_ids import check_issued, issued_epochs
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
)
from app.security import needs
from app.security.authorizer import authorize_all
from app.storage.context import BrokerContext
from app.storage.driver import WriteBehind, driver_connection
from app.storage.engine import retry_conflicts

__all__ = [
    "append_batches",
    "check_request",
    "produce",
    "produce_many",
    "produce_registering",
    "record_size_bytes",
    "recorded_batch",
]

if TYPE_CHECKING:
    from app.coordinator.metadata import TxnMetadata
    from app.coordinator.txn_log import Persist


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
def produce(broker: BrokerContext, req: ProduceRequest) -> ProduceResponse:
    try:
        columns = check_request(req, broker.settings.message_max_bytes)
        with broker.engine.begin() as conn:
            admit(broker, conn, req, {})
            return _append_one(broker, conn, req, columns)
    except KafkaException as exc:
        return _refusal(exc)


def produce_many(broker: BrokerContext, requests: list[ProduceRequest]) -> list[ProduceResponse]:
    """Batches for several partitions in one DB transaction, one COMMIT for all of them
    (Kafka's ProduceRequest carries every partition bound for a leader).

    Each batch is decided and answered on its own, as with separate requests: a refused
    batch writes nothing (every refusal comes before the COPY) and the others go on. The
    partitions are locked in sorted order (docs/design.md §3.3) in one statement and held to the
    one COMMIT, the accepted batches written with one COPY and the partitions advanced with
    one statement, whatever their number; a transactional id's row is read once, FOR SHARE,
    for all its batches.
    """
    return produce_registering(broker, requests, None)[1]


@retry_conflicts
def produce_registering(
    broker: BrokerContext, requests: list[ProduceRequest], add: AddPartitionsToTxnRequest | None
) -> tuple[AddPartitionsToTxnResponse | None, list[ProduceResponse]]:
    """``produce_many`` that first registers ``add``'s partitions with their transaction,
    in the same DB transaction (KIP-890's implicit AddPartitionsToTxn): the registration and
    the batches commit together or not at all, so no batch is ever in the log of a partition
    its coordinator does not know (rule 6). The coordinator's own rules decide the
    registration (identity, fencing, state, ACLs); if it is refused, the batches of its
    partitions are answered with its error and write nothing.
    """
    with broker.engine.begin() as conn:
        return append_batches(conn, broker, requests, add, {})


def append_batches(
    conn: Connection,
    broker: BrokerContext,
    requests: list[ProduceRequest],
    add: AddPartitionsToTxnRequest | None,
    loaded: dict[str, TxnMetadata | None],
    locked: dict[TopicPartition, PartitionRow] | None = None,
    record: Persist | None = None,
    writes: WriteBehind | None = None,
) -> tuple[AddPartitionsToTxnResponse | None, list[ProduceResponse]]:
    """``produce_registering`` in the caller's DB transaction. ``loaded``: transactional
    metadata already read in it, by id (``add``'s FOR UPDATE, if there). ``locked``: if
    the caller already locked every partition involved (``lock_partitions``), their rows,
    which are then used instead of locking again and kept as the appends leave them.
    ``record``: how the registration is persisted (by default at once, once the batches are
    decided: a partition whose batches were all refused is left out of it, unless already
    in the transaction); ``writes``: where to queue the partitions' advance (by default it
    runs at once)."""
    responses: dict[int, ProduceResponse] = {}
    columns: dict[int, Columns] = {}
    for i, req in enumerate(requests):
        try:
            columns[i] = check_request(req, broker.settings.message_max_bytes)
        except KafkaException as exc:
            responses[i] = _refusal(exc)
    registered = None
    before: TxnMetadata | None = None
    if add is not None:
        # The data plane asking the coordinator, as a partition leader does in KIP-890.
        from app.coordinator.handlers import check_registration
        from app.coordinator.metadata import plan_register

        existing = None if locked is None else set(locked)
        registered, before = check_registration(
            conn, broker, add, loaded.get(add.transactional_id), existing
        )
        if before is not None:
            # The batches are checked against the transaction as registered; the
            # registration is recorded once they are decided.
            now = broker.clock.now_ms()
            wanted = sorted(set(add.partitions))
            loaded[add.transactional_id] = plan_register(before, wanted, now) or before
        elif registered.error_code != KafkaError.NO_ERROR:
            for i in columns:
                tp = (requests[i].topic, requests[i].partition)
                if tp in registered.results:
                    code = registered.results[tp]
                    responses[i] = ProduceResponse(code, error_message=registered.error_message)
    admitted = []
    for i in sorted(columns, key=lambda i: (requests[i].topic, requests[i].partition)):
        if i not in responses:
            try:
                admit(broker, conn, requests[i], loaded)
                admitted.append(i)
            except KafkaException as exc:
                responses[i] = _refusal(exc)
    responses.update(_append_all(broker, conn, requests, columns, admitted, locked, writes))
    if add is not None and before is not None:
        from app.coordinator.handlers import record_registration
        from app.coordinator.txn_log import persist

        refused = _refused_partitions(requests, responses, add.transactional_id)
        registered, loaded[add.transactional_id] = record_registration(
            conn, broker, before, add, refused, record or persist
        )
    return registered, [responses[i] for i in range(len(requests))]


def _refused_partitions(
    requests: list[ProduceRequest], responses: dict[int, ProduceResponse], transactional_id: str
) -> dict[TopicPartition, int]:
    """The partitions where every batch of ``transactional_id`` in the request was refused,
    with the error of the first: the request must not register them (rule 6 the other way
    round: no partition in a transaction for a batch that is not in its log)."""
    accepted: set[TopicPartition] = set()
    refused: dict[TopicPartition, int] = {}
    for i, req in enumerate(requests):
        if not (req.is_transactional and req.transactional_id == transactional_id):
            continue
        tp = (req.topic, req.partition)
        if responses[i].error_code == KafkaError.NO_ERROR:
            accepted.add(tp)
        else:
            refused.setdefault(tp, responses[i].error_code)
    return {tp: code for tp, code in refused.items() if tp not in accepted}


def admit(
    broker: BrokerContext,
    conn: Connection,
    req: ProduceRequest,
    loaded: dict[str, TxnMetadata | None],
) -> None:
    """The checks before any partition is locked: the ACLs and, for a transactional batch,
    its transaction (rule 6). ``loaded``: transactional metadata already read in this DB
    transaction, by id; filled as ids are read (FOR SHARE)."""
    authorize_all(conn, broker, needs.produce(req.topic, req.transactional_id))
    if req.is_transactional:
        from app.coordinator.guard import check_produce, load_for_produce

        assert req.transactional_id is not None
        if req.transactional_id not in loaded:
            loaded[req.transactional_id] = load_for_produce(conn, req.transactional_id)
        check_produce(loaded[req.transactional_id], req)


def _append_all(
    broker: BrokerContext,
    conn: Connection,
    requests: list[ProduceRequest],
    columns: dict[int, Columns],
    admitted: list[int],
    locked: dict[TopicPartition, PartitionRow] | None,
    writes: WriteBehind | None,
) -> dict[int, ProduceResponse]:
    """Append the admitted batches (distinct partitions expected): one lock statement
    (none if ``locked``), one COPY, one advance. Batches for the same partition twice in
    one request are appended one after the other instead, each seeing the previous one's
    offsets and producer state."""
    partitions = [(requests[i].topic, requests[i].partition) for i in admitted]
    wanted = [(*tp, requests[i].producer_id) for i, tp in zip(admitted, partitions, strict=True)]
    if len(set(partitions)) < len(partitions):
        answers = {i: _append_one(broker, conn, requests[i], columns[i]) for i in admitted}
        if locked is not None:
            locked.update(lock_partitions(conn, wanted))  # as those appends left them
        return answers
    rows = locked if locked is not None else lock_partitions(conn, wanted)
    unseen = {
        i
        for i, tp in zip(admitted, partitions, strict=True)
        if needs_identity_check(requests[i], rows.get(tp))
    }
    issued = issued_epochs(conn, (requests[i].producer_id for i in unseen)) if unseen else {}
    responses: dict[int, ProduceResponse] = {}
    plans: list[tuple[ProduceRequest, AppendPlan]] = []
    for i in admitted:
        req = requests[i]
        try:
            if i in unseen:
                check_issued(req.producer_id, req.producer_epoch, issued)
            plan = plan_append(broker, req, columns[i], rows.get((req.topic, req.partition)))
        except KafkaException as exc:
            responses[i] = _refusal(exc)
            continue
        responses[i] = plan.response
        if plan.rows:
            plans.append((req, plan))
    if plans:
        copy_payload(conn, copy_payload_of(plan.rows for _, plan in plans))
        crash_point("append.after_copy")
        advance_partitions(
            conn,
            [(req.topic, req.partition, plan.next_offset, plan.lso) for req, plan in plans],
            [(req.topic, req.partition, plan.entry) for req, plan in plans if plan.entry],
            writes,
        )
        if locked is not None:
            for req, plan in plans:
                tp = (req.topic, req.partition)
                locked[tp] = locked[tp].advanced(plan.next_offset, plan.lso, plan.entry)
    return responses


def _append_one(
    broker: BrokerContext, conn: Connection, req: ProduceRequest, columns: Columns
) -> ProduceResponse:
    """One batch: the lock, its COPY and the advance, each a statement of its own."""
    try:
        row = lock_partition(conn, req.topic, req.partition, req.producer_id)
        if needs_identity_check(req, row):
            issued = issued_epochs(conn, (req.producer_id,))
            check_issued(req.producer_id, req.producer_epoch, issued)
        plan = plan_append(broker, req, columns, row)
    except KafkaException as exc:
        return _refusal(exc)
    if plan.rows:
        copy_payload(conn, copy_payload_of((plan.rows,)))
        crash_point("append.after_copy")
        advance_partition(conn, req.topic, req.partition, plan.next_offset, plan.lso, plan.entry)
    return plan.response


def recorded_batch(conn: Connection, req: ProduceRequest) -> ProduceResponse:
    """The answer to a batch known to be in the log already (its request committed and is
    being retried): a duplicate, with the offsets it was given (-1 if the log no longer
    has it)."""
    params = {
        "topic": req.topic,
        "partition": req.partition,
        "producer_id": req.producer_id,
        "producer_epoch": req.producer_epoch,
        "base_sequence": req.base_sequence,
    }
    with driver_connection(conn).cursor() as cur:
        row = cur.execute(sql.RECORDED_BATCH, params).fetchone()
    base_offset, log_start = (-1, -1) if row is None else (row[0], row[1])
    return ProduceResponse(
        KafkaError.NO_ERROR,
        -1 if base_offset is None else base_offset,
        log_start,
        duplicate=True,
    )


def _refusal(exc: KafkaException) -> ProduceResponse:
    return ProduceResponse(exc.error.code(), error_message=exc.error.str())


@dataclass(frozen=True)
class AppendPlan:
    """What one batch does to its locked partition: the answer and, unless the batch is a
    duplicate, its COPY rows, the partition's next offset and LSO after it, and the
    producer's state after it (None for a producer without id)."""

    response: ProduceResponse
    rows: bytes = b""
    next_offset: int = -1
    lso: int = -1
    entry: ProducerEntry | None = None


def needs_identity_check(req: ProduceRequest, row: PartitionRow | None) -> bool:
    """Whether ``req``'s identity must be checked against what the coordinator handed out
    (``producer_ids.check_issued``) before the partition takes it: an idempotent batch from
    a producer the partition has no state for, or in an epoch above the one it has.

    A (producer_id, epoch) the partition already holds passed this check when it got
    there, so a producer's later batches cost no query; an older epoch is refused by the
    producer-state rules anyway. A transactional batch was checked against its
    transactional id's current identity already (``admit``)."""
    if req.producer_id == NO_PRODUCER_ID or req.is_transactional or row is None:
        return False
    entry = row.producer_entry()
    return (
        entry is None
        or entry.producer_id != req.producer_id
        or req.producer_epoch > entry.producer_epoch
    )


def plan_append(
    broker: BrokerContext, req: ProduceRequest, columns: Columns, row: PartitionRow | None
) -> AppendPlan:
    """Decide one batch against its locked partition row (``row``; None if the partition
    does not exist); raises KafkaException for a refusal. Nothing is written here."""
    if row is None:
        raise fail(
            KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"{req.topic} [{req.partition}] does not exist"
        )
    base_offset = row.next_offset
    count = len(columns)
    next_offset = base_offset + count
    timestamps = columns.stamped(broker.clock.now_ms())
    accepted = ProduceResponse(KafkaError.NO_ERROR, base_offset, row.log_start_offset)

    if req.producer_id == NO_PRODUCER_ID:
        lso = lso_after_append(row.last_stable_offset, base_offset, next_offset, opens_txn=False)
        rows = encode_rows(
            req.topic, req.partition, base_offset, columns, timestamps,
            NO_PRODUCER_ID, req.producer_epoch, -1, req.is_transactional,
        )  # fmt: skip
        return AppendPlan(accepted, rows, next_offset, lso)

    max_ts = max(timestamps)
    entry = row.producer_entry()
    if entry is not None and is_expired(entry, max_ts, broker.settings.producer_id_expiration_ms):
        entry = None
    last_seq = increment_sequence(req.base_sequence, count - 1)
    verdict = validate_append(
        entry, req.producer_epoch, req.base_sequence, last_seq, req.is_transactional
    )
    if verdict.duplicate_of is not None:
        return AppendPlan(
            ProduceResponse(
                KafkaError.NO_ERROR,
                verdict.duplicate_of.first_offset,
                row.log_start_offset,
                duplicate=True,
            )
        )
    if not verdict.ok:
        raise fail(verdict.error_code, verdict.message)

    opens_txn = req.is_transactional and (entry is None or entry.txn_first_offset is None)
    batch = BatchMeta(req.base_sequence, last_seq, base_offset, next_offset - 1)
    new_entry = apply_append(
        entry, req.producer_id, req.producer_epoch, batch, max_ts, req.is_transactional
    )
    lso = lso_after_append(row.last_stable_offset, base_offset, next_offset, opens_txn)
    rows = encode_rows(
        req.topic, req.partition, base_offset, columns, timestamps,
        req.producer_id, req.producer_epoch, req.base_sequence, req.is_transactional,
    )  # fmt: skip
    return AppendPlan(accepted, rows, next_offset, lso, new_entry)
