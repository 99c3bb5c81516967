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
from app.log.markers import MarkerLocks
from app.log.partition_lock import (
    PartitionRow,
    Remembered,
    RememberedAdvance,
    RowVersion,
    advance_partitions,
    append_remembered_committed,
    forget,
    lock_partitions,
    producer_states,
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
    crash_point("append.after_copy")


class Appending(Protocol):
    """The request the log appends for, as much of it as the log needs (the broker's
    ``Work`` is one): its DB transaction and broker context, the partition rows it already
    holds locked (None: the append locks them), kept as its appends leave them; where the
    append under the locks queues its writes and its COPY payloads for the request's
    executor to send (``writes``, ``copies``) and the rows it advanced, whose versions are
    known once they are sent (``appended``); and where the one-query append leaves the
    rows it wrote with their versions, for the process to remember once the request
    commits (``left``)."""

    @property
    def context(self) -> BrokerContext: ...

    @property
    def conn(self) -> Connection: ...

    @property
    def locked(self) -> MarkerLocks | None: ...

    @property
    def writes(self) -> WriteBehind | None: ...

    @property
    def copies(self) -> list[bytes] | None: ...

    @property
    def appended(self) -> dict[TopicPartitionKey, PartitionRow]: ...

    @property
    def left(self) -> dict[TopicPartitionKey, tuple[str, PartitionRow]]: ...


Admitted = dict[int, tuple[ProduceRequest, Columns]]
# A producer's state on a partition, by (topic, partition, producer_id); None: none.
States = dict[tuple[str, int, int], ProducerEntry | None]


@dataclass(frozen=True)
class AppendsPlan:
    """What a request's admitted batches do to their partitions (``plan_appends``), for
    either way of writing it (docs/design.md §3.9) to send: each batch's answer; the
    batches written, in order, with their plans; each partition's advance (next offset,
    LSO) and each producer's state after the request; and each advanced row as it leaves
    it, with the state of the producer the row was read for."""

    responses: dict[int, ProduceResponse]
    written: list[tuple[ProduceRequest, Columns, AppendPlan]]
    advances: dict[TopicPartitionKey, tuple[int, int]]
    entries: dict[tuple[str, int, int], ProducerEntry]
    after: dict[TopicPartitionKey, PartitionRow]

    @property
    def takes_all(self) -> bool:
        """Every batch is written as new: no refusal, no duplicate."""
        return len(self.written) == len(self.responses)

    def payloads(self) -> list[bytes]:
        """The COPY payloads of the batches written."""
        return copy_payloads_of([plan.encoded(req, cols) for req, cols, plan in self.written])

    def advance_rows(self) -> list[tuple[str, int, int, int]]:
        return [(t, p, next_offset, lso) for (t, p), (next_offset, lso) in self.advances.items()]

    def entry_rows(self) -> list[tuple[str, int, ProducerEntry]]:
        return [(t, p, entry) for (t, p, _), entry in self.entries.items()]


def plan_appends(
    broker: BrokerContext,
    admitted: Admitted,
    rows: dict[TopicPartitionKey, PartitionRow],
    owners: dict[TopicPartitionKey, int],
    others: States,
    issued: dict[int, int],
) -> AppendsPlan:
    """Decide the admitted batches (in partition order) one after the other, each on its
    partition row as the batches before it left it (``plan_append``): ``rows`` hold the
    state of the producer ``owners`` names; ``others`` the states of the request's other
    producers on those partitions; ``issued`` the epochs the coordinator handed out to the
    producers ``identities_to_check`` named. Pure: the caller reads, then writes."""
    current = dict(rows)
    states = _states(rows, owners, others)
    responses: dict[int, ProduceResponse] = {}
    written: list[tuple[ProduceRequest, Columns, AppendPlan]] = []
    advances: dict[TopicPartitionKey, tuple[int, int]] = {}
    entries: dict[tuple[str, int, int], ProducerEntry] = {}
    for i, (req, cols) in admitted.items():
        tp = (req.topic, req.partition)
        row = _row_for(req, current.get(tp), states)
        try:
            if needs_identity_check(req, row):
                check_issued(req.producer_id, req.producer_epoch, issued)
            plan = plan_append(broker, req, cols, row)
        except KafkaException as exc:
            responses[i] = refusal(exc)
            continue
        responses[i] = plan.response
        if plan.timestamps is None:
            continue  # a duplicate: nothing written
        assert row is not None
        current[tp] = row.advanced(plan.next_offset, plan.lso, plan.entry)
        advances[tp] = (plan.next_offset, plan.lso)
        if plan.entry is not None:
            states[(*tp, req.producer_id)] = entries[(*tp, req.producer_id)] = plan.entry
        written.append((req, cols, plan))
    after = {tp: current[tp].with_state(states[(*tp, owners[tp])]) for tp in advances}
    return AppendsPlan(responses, written, advances, entries, after)


def _row_for(req: ProduceRequest, row: PartitionRow | None, states: States) -> PartitionRow | None:
    """``row`` with ``req``'s producer's state."""
    if row is None or req.producer_id == NO_PRODUCER_ID:
        return row
    return row.with_state(states[(req.topic, req.partition, req.producer_id)])


def identities_to_check(
    admitted: Admitted,
    rows: dict[TopicPartitionKey, PartitionRow],
    owners: dict[TopicPartitionKey, int],
    others: States,
) -> set[int]:
    """The producer ids whose issued epochs ``plan_appends`` needs: those of batches whose
    producer the partition has no state for, or in a higher epoch
    (``needs_identity_check``; checking one whose earlier batch in the request got in
    costs nothing more)."""
    states = _states(rows, owners, others)
    return {
        req.producer_id
        for req, _ in admitted.values()
        if needs_identity_check(req, _row_for(req, rows.get((req.topic, req.partition)), states))
    }


def _states(
    rows: dict[TopicPartitionKey, PartitionRow],
    owners: dict[TopicPartitionKey, int],
    others: States,
) -> States:
    """Every producer state the request's batches are decided on: each row's own and
    ``others``."""
    states: States = {(*tp, owners[tp]): row.producer_entry() for tp, row in rows.items()}
    states.update(others)
    return states


def append(work: Appending, admitted: Admitted) -> dict[int, ProduceResponse]:
    """Decide the batches the broker admitted (by request index, in partition order) in
    ``work``'s DB transaction, under the partitions' locks (the lock's way, docs/design.md
    §3.9): one lock statement (none if ``work`` holds them locked already), the reads the
    decision needs, the decision (``plan_appends``); its COPY payloads and its one advance
    are queued on ``work`` for the executor to send with the rest of the request. Several
    batches for one partition are decided one after the other on the row the one before
    left."""
    if not admitted:
        return {}
    conn, locked = work.conn, work.locked
    if locked is None:
        owners: dict[TopicPartitionKey, int] = {}
        for req, _ in admitted.values():
            owners.setdefault((req.topic, req.partition), req.producer_id)
        rows = lock_partitions(conn, [(t, p, pid) for (t, p), pid in owners.items()])
    else:
        rows, owners = locked.rows, dict.fromkeys(locked.rows, locked.producer_id)
    # The request's other producers on those partitions, read now that the locks are held.
    wanted = {
        (req.topic, req.partition, req.producer_id)
        for req, _ in admitted.values()
        if req.producer_id != NO_PRODUCER_ID
        and (req.topic, req.partition) in rows
        and req.producer_id != owners[(req.topic, req.partition)]
    }
    others = producer_states(conn, sorted(wanted)) if wanted else {}
    unseen = identities_to_check(admitted, rows, owners, others)
    issued = issued_epochs(conn, unseen) if unseen else {}
    plan = plan_appends(work.context, admitted, rows, owners, others, issued)
    if not plan.written:
        return plan.responses
    assert work.writes is not None and work.copies is not None, "the append's writes are queued"
    work.copies.extend(plan.payloads())
    advance_partitions(work.writes, plan.advance_rows(), plan.entry_rows())
    for tp, after in plan.after.items():
        if locked is not None:
            locked.rows[tp] = after
        work.appended[tp] = after  # remembered, with its version, once the request commits
    return plan.responses


def on_remembered_rows(conn: Connection, batches: Sequence[ProduceRequest]) -> bool:
    """Whether every batch goes on a partition row this process remembers as its own
    producer last left it: what the one-query append needs before it decides anything
    (``broker.strategy``). Only batches with a producer id: a row last written by the same
    producer is likely still as it left it; plain batches, which may come from any of the
    process's writers, would pay a refused write whenever another wrote in between. A
    producer id not seen on its row needs the issued epochs read."""
    return bool(batches) and all(
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
    """The batches (all on rows ``on_remembered_rows`` found) decided on their remembered
    rows (``plan_appends``) and written in one query string that commits (docs/design.md
    §3.9), the rows it wrote left on ``work`` to remember: ``guard``'s read first, if any, then each partition's advance, which checks its
    row is still that version, then the COPY. ``Refused`` where a row moved (nothing
    written, no DB transaction open); None, with nothing sent, where a batch is one the
    remembered row would not take as it is (a duplicate or a refusal is only ever decided
    on the row read under the lock). Either way the caller then decides the request under
    the locks."""
    assert not in_transaction(work.conn), "one query string is its own DB transaction"
    rows: dict[TopicPartitionKey, PartitionRow] = {}
    owners: dict[TopicPartitionKey, int] = {}
    versions: dict[TopicPartitionKey, RowVersion] = {}
    for req, _ in admitted.values():
        tp = (req.topic, req.partition)
        # Read again: another thread's append may have left the row since the choice.
        hint = remembered(work.conn, tp)
        if not _remembered_as_mine(req, hint) or owners.get(tp, req.producer_id) != req.producer_id:
            return None
        assert hint is not None
        rows[tp], owners[tp], versions[tp] = hint.row, req.producer_id, hint.version
    plan = plan_appends(work.context, admitted, rows, owners, {}, {})
    if not plan.takes_all:
        return None
    advances: list[RememberedAdvance] = [
        ((t, p, next_offset, lso), plan.entries[(t, p, owners[(t, p)])], versions[(t, p)])
        for (t, p), (next_offset, lso) in plan.advances.items()
    ]
    written = append_remembered_committed(work.conn, advances, plan.payloads(), guard)
    if isinstance(written, Refused):
        for tp in plan.advances:
            forget(work.conn, tp)
        return written
    for tp, xmin in zip(plan.advances, written, strict=True):
        work.left[tp] = (xmin, plan.after[tp])
    return plan.responses


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
