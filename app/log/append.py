"""The log's append: batches the broker admitted, written to their partitions exactly once.

Two ways, chosen by ``broker.strategy`` (docs/design.md §3.9): under the partitions'
locks in the broker's DB transaction (``append``), or on the partition rows the process
remembers, in one query string checked by their versions (``append_one_query``). Both
decide each batch by the same rules (``plan_append``, ``producer_state``): offsets
gapless, a duplicate writes nothing and is answered with its original offsets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import Connection

from app.errors import KafkaError, KafkaException, fail
from app.faults import crash_point
from app.log import sql
from app.log.copy_records import Columns, copy_payloads_of, encode_rows
from app.log.lso import lso_after_append
from app.log.partition_lock import (
    PartitionRow,
    Remembered,
    RememberedAdvance,
    advance_partitions,
    append_remembered_committed,
    forget,
    lock_partitions,
    remember,
    remembered,
)
from app.log.producer_ids import check_issued, issued_epochs
from app.log.producer_state import (
    AppendedBatch,
    BatchMeta,
    ProducerEntry,
    apply_append,
    is_expired,
    validate_append,
)
from app.protocol import (
    NO_PRODUCER_ID,
    ProduceRequest,
    ProduceResponse,
    TopicPartitionKey,
    increment_sequence,
)
from app.storage.context import BrokerContext
from app.storage.driver import WriteBehind, driver_connection, in_transaction
from app.storage.one_query import Check, QueryCopies, Refused


def check_request(req: ProduceRequest) -> Columns:
    """Shape rules a batch must meet before it touches the database; returns the batch's
    columns for the COPY. (Its size is checked against its topic's max.message.bytes,
    which its partition row holds: ``plan_append``.)"""
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
    return Columns(req.records)


def keyless_refusal(req: ProduceRequest, columns: Columns) -> ProduceResponse:
    """The answer to a batch for a compacted topic holding records without a key: refused
    whole, INVALID_RECORD with each such record's index (KIP-467), as Kafka's log
    validation refuses it, since compaction keeps the last record of each key."""
    keyless = [i for i, key in enumerate(columns.keys) if key is None]
    why = (
        "Compacted topic cannot accept message without key in topic partition "
        f"{req.topic}-{req.partition}"
    )
    shown = ", ".join(f"RecordError(batchIndex={i}, message='{why}')" for i in keyless[:3])
    return ProduceResponse(
        KafkaError.INVALID_RECORD,
        error_message=f"One or more records have been rejected due to {len(keyless)} record "
        f"errors in total, and only showing the first three errors at most: [{shown}]",
        record_errors=tuple((i, why) for i in keyless),
    )


def check_size(req: ProduceRequest, columns: Columns, max_bytes: int) -> None:
    """A batch within its topic's max.message.bytes (MESSAGE_TOO_LARGE otherwise), counted
    as the client sent it where it did (a wire batch, compressed if it was), as Kafka's
    brokers count it."""
    size = columns.size_bytes() if req.size_bytes is None else req.size_bytes
    if size > max_bytes:
        raise fail(
            KafkaError.MSG_SIZE_TOO_LARGE,
            f"batch of {size} bytes exceeds max.message.bytes={max_bytes} of {req.topic!r}",
        )


def copy_rows(conn: Connection, payloads: list[bytes]) -> None:
    """Binary COPY inside the handler's transaction (never one INSERT per record), one
    statement per payload (``copy_records.copy_payloads_of``), all in one query string."""
    with QueryCopies(conn, sql.COPY_RECORDS, len(payloads), committed=False) as copies:
        copies.write(payloads)
        crash_point("append.in_copy")  # every COPY's data given, the last not ended


class Appending(Protocol):
    """The request the log appends for, as much of it as the log needs (the broker's
    ``Work`` is one): its DB transaction and broker context, the partition rows it already
    holds locked (None: the append locks them, and they are kept as the appends leave
    them), where its last writes are queued (None: they run at once), and where its COPY
    payloads are held to be sent later with the rest of the request (``copies``; None:
    sent at once, docs/design.md §3.11)."""

    @property
    def context(self) -> BrokerContext: ...

    @property
    def conn(self) -> Connection: ...

    @property
    def locked(self) -> dict[TopicPartitionKey, PartitionRow] | None: ...

    @property
    def writes(self) -> WriteBehind | None: ...

    @property
    def copies(self) -> list[bytes] | None: ...


@dataclass(frozen=True)
class _AtOnce:
    """A round of ``append`` that locks for itself and writes at once."""

    context: BrokerContext
    conn: Connection
    locked: None = None
    writes: None = None
    copies: None = None


Admitted = dict[int, tuple[ProduceRequest, Columns]]


def append(work: Appending, admitted: Admitted) -> dict[int, ProduceResponse]:
    """Append the batches the broker admitted (by request index, in partition order) in
    ``work``'s DB transaction, under the partitions' locks: one lock statement (none if it
    holds them locked already), one COPY, one advance.

    A partition with several batches in one request takes them in rounds, a round holding
    at most one batch per partition and written at once, so that each round is decided on
    the offsets and producer state the previous one left."""
    rounds = _rounds(admitted)
    if len(rounds) == 1:
        return _append_round(work, admitted)
    responses: dict[int, ProduceResponse] = {}
    for batches in rounds:
        responses.update(_append_round(_AtOnce(work.context, work.conn), batches))
    if work.locked is not None:
        wanted = [(req.topic, req.partition, req.producer_id) for req, _ in admitted.values()]
        work.locked.update(lock_partitions(work.conn, wanted))  # as those rounds left them
    return responses


def _rounds(admitted: Admitted) -> list[Admitted]:
    """``admitted`` split so that no round holds a partition twice, in request order."""
    rounds: list[Admitted] = []
    seen: dict[TopicPartitionKey, int] = {}
    for i, (req, cols) in admitted.items():
        tp = (req.topic, req.partition)
        k = seen[tp] = seen.get(tp, -1) + 1
        if k == len(rounds):
            rounds.append({})
        rounds[k][i] = (req, cols)
    return rounds or [{}]


def _append_round(work: Appending, admitted: Admitted) -> dict[int, ProduceResponse]:
    """``append`` for batches of distinct partitions."""
    conn, broker, locked = work.conn, work.context, work.locked
    if not admitted:
        return {}
    if locked is not None:
        rows = locked
    else:
        rows = lock_partitions(
            conn, [(req.topic, req.partition, req.producer_id) for req, _ in admitted.values()]
        )
    unseen = {
        i
        for i, (req, _) in admitted.items()
        if needs_identity_check(req, rows.get((req.topic, req.partition)))
    }
    issued = issued_epochs(conn, (admitted[i][0].producer_id for i in unseen)) if unseen else {}
    responses: dict[int, ProduceResponse] = {}
    plans: list[tuple[ProduceRequest, Columns, AppendPlan]] = []
    for i, (req, cols) in admitted.items():
        try:
            if i in unseen:
                check_issued(req.producer_id, req.producer_epoch, issued)
            plan = plan_append(broker, req, cols, rows.get((req.topic, req.partition)))
        except KafkaException as exc:
            responses[i] = refusal(exc)
            continue
        responses[i] = plan.response
        if plan.timestamps is not None:
            plans.append((req, cols, plan))
    if plans:
        payloads = copy_payloads_of([plan.encoded(req, cols) for req, cols, plan in plans])
        if work.copies is None:
            copy_rows(conn, payloads)
            crash_point("append.after_copy")
        else:
            work.copies.extend(payloads)
        versions = advance_partitions(
            conn,
            [(req.topic, req.partition, plan.next_offset, plan.lso) for req, _, plan in plans],
            [(req.topic, req.partition, plan.entry) for req, _, plan in plans if plan.entry],
            work.writes,
        )
        for req, _, plan in plans:
            tp = (req.topic, req.partition)
            after = rows[tp].advanced(plan.next_offset, plan.lso, plan.entry)
            if locked is not None:
                locked[tp] = after
            if versions is not None:
                remember(conn, tp, versions[tp], after)
            else:  # its version is not known until the queued advance runs
                forget(conn, tp)
    return responses


def on_remembered_rows(conn: Connection, batches: Sequence[ProduceRequest]) -> bool:
    """Whether every batch goes on a partition row this process remembers as its own
    producer last left it, each partition once: what the one-query append needs before it
    decides anything (``broker.strategy``). Only batches with a producer id: a row last
    written by the same producer is likely still as it left it; plain batches, which may
    come from any of the process's writers, would pay a refused write whenever another
    wrote in between. A producer id not seen on its row needs the issued epochs read."""
    if not batches or len({(b.topic, b.partition) for b in batches}) != len(batches):
        return False
    return all(
        _remembered_as_mine(req, remembered(conn, (req.topic, req.partition))) for req in batches
    )


def _remembered_as_mine(req: ProduceRequest, hint: Remembered | None) -> bool:
    """Whether ``hint`` is the row as ``req``'s producer last left it, in an epoch it
    holds: the only row its batch may be decided on without the lock."""
    return (
        req.producer_id != NO_PRODUCER_ID
        and hint is not None
        and hint.row.s_producer_id == req.producer_id
        and not needs_identity_check(req, hint.row)
    )


def append_one_query(
    work: Appending, admitted: Admitted, guard: Check | None = None
) -> dict[int, ProduceResponse] | Refused | None:
    """The batches (of distinct partitions, all on rows ``on_remembered_rows`` found)
    decided on their remembered rows and written in one query string that commits
    (docs/design.md §3.9): ``guard``'s read first, if any, then each partition's advance,
    which checks its row is still that version, then the COPY. ``Refused`` where a row
    moved (nothing written, no DB transaction open); None, with nothing sent, where a
    batch is one the remembered row would not take as it is (a duplicate or a refusal is
    only ever decided on the row read under the lock). Either way the caller then
    decides the request under the locks."""
    assert not in_transaction(work.conn), "one query string is its own DB transaction"
    planned: list[tuple[int, ProduceRequest, Columns, Remembered, AppendPlan]] = []
    advances: list[RememberedAdvance] = []
    for i, (req, columns) in admitted.items():
        # Read again: another thread's append may have left the row since the choice.
        hint = remembered(work.conn, (req.topic, req.partition))
        if not _remembered_as_mine(req, hint):
            return None
        assert hint is not None
        try:
            plan = plan_append(work.context, req, columns, hint.row)
        except KafkaException:
            return None
        if plan.timestamps is None:
            return None  # a duplicate
        assert plan.entry is not None, "a batch with a producer id leaves the producer's state"
        planned.append((i, req, columns, hint, plan))
        advance = (req.topic, req.partition, plan.next_offset, plan.lso)
        advances.append((advance, plan.entry, hint.version))
    payloads = copy_payloads_of([plan.encoded(req, cols) for _, req, cols, _, plan in planned])
    versions = append_remembered_committed(work.conn, advances, payloads, guard)
    if isinstance(versions, Refused):
        for _, req, _, _, _ in planned:
            forget(work.conn, (req.topic, req.partition))
        return versions
    for (_, req, _, hint, plan), xmin in zip(planned, versions, strict=True):
        after = hint.row.advanced(plan.next_offset, plan.lso, plan.entry)
        remember(work.conn, (req.topic, req.partition), xmin, after)
    return {i: plan.response for i, _, _, _, plan in planned}


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


def refusal(exc: KafkaException) -> ProduceResponse:
    return ProduceResponse(exc.error.code(), error_message=exc.error.str())


@dataclass(frozen=True)
class AppendPlan:
    """What one batch does to its locked partition: the answer and, unless the batch is a
    duplicate (None), its records' timestamps as stored, the partition's next offset and
    LSO after it, and the producer's state after it (None for a producer without id). The
    rows are encoded only once the batch is sure to be written (``encoded``): a decision
    on a remembered row may yet be taken again under the lock (rule 32)."""

    response: ProduceResponse
    timestamps: tuple[int, ...] | None = None
    next_offset: int = -1
    lso: int = -1
    entry: ProducerEntry | None = None

    def encoded(self, req: ProduceRequest, columns: Columns) -> tuple[list[bytes], int]:
        """The batch's COPY rows (``encode_rows``' parts) at the offsets decided, and how
        many they are."""
        assert self.timestamps is not None, "a duplicate writes nothing"
        rows = encode_rows(req, self.response.base_offset, columns, self.timestamps)
        return rows, len(columns)


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
    limit = row.max_message_bytes
    check_size(req, columns, broker.settings.message_max_bytes if limit is None else limit)
    base_offset = row.next_offset
    count = len(columns)
    next_offset = base_offset + count
    now = broker.clock.now_ms()
    if row.log_append_time:  # message.timestamp.type=LogAppendTime: the broker's time
        timestamps = (now,) * count
        accepted = ProduceResponse(KafkaError.NO_ERROR, base_offset, row.log_start_offset,
                                   log_append_time=now)  # fmt: skip
    else:
        timestamps = columns.stamped(now)
        accepted = ProduceResponse(KafkaError.NO_ERROR, base_offset, row.log_start_offset)

    if req.producer_id == NO_PRODUCER_ID:
        lso = lso_after_append(row.last_stable_offset, base_offset, next_offset, opens_txn=False)
        return AppendPlan(accepted, timestamps, next_offset, lso)

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
    appended = AppendedBatch(
        req.producer_id, req.producer_epoch, batch, max_ts, req.is_transactional
    )
    new_entry = apply_append(entry, appended)
    lso = lso_after_append(row.last_stable_offset, base_offset, next_offset, opens_txn)
    return AppendPlan(accepted, timestamps, next_offset, lso, new_entry)
