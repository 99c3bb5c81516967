"""The transaction coordinator's request handlers: InitProducerId (with a transactional id),
AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, FindCoordinator, WriteTxnMarkers.

Each request is one DB transaction serialised on the transactional id's row (EndTxn is
two: PREPARE, then completion, so PREPARE is durable on its own as the point of no return;
``broker.commit`` ends a transaction in the same DB transaction as its last batches).
Refusals come back as Kafka error codes in the response, never as exceptions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sqlalchemy import Connection

from app.coordinator import machines as m
from app.coordinator import sql
from app.coordinator.completion import complete_transaction
from app.coordinator.metadata import (
    NO_PRODUCER_ID,
    TxnMetadata,
    after_coordinator_abort,
    bumped_identity,
    check_producer,
    end_retry_outcome,
    plan_add,
    plan_end,
    plan_fence_abort,
    plan_register,
    txn_partition_for,
    validate_timeout,
)
from app.coordinator.txn_log import (
    Leased,
    Persist,
    claim,
    load_for_update,
    load_with_lease,
    persist,
)
from app.errors import KafkaError, KafkaException, fail
from app.faults import crash_point
from app.log.inspect import mark_partition
from app.log.markers import Marker
from app.log.producer_ids import allocate_producer_id
from app.protocol import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    COORDINATOR_GROUP,
    COORDINATOR_TRANSACTION,
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    TxnOffsetCommitRequest,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)
from app.security import needs
from app.security.authorizer import authorize_all, authorize_any, denied_checks, refusal_of
from app.security.rules import TOPIC
from app.storage import urls
from app.storage.context import BrokerContext
from app.storage.engine import retry_conflicts


def coordinator_epoch(conn: Connection, txn_partition: int) -> int:
    """The current coordinator epoch of a transaction-log partition (0 before any lease).

    Taken FOR SHARE so a lease takeover cannot interleave with markers written under it.
    """
    row = conn.execute(sql.LEASE_EPOCH_FOR_SHARE, {"txn_partition": txn_partition}).first()
    return 0 if row is None else int(row.coordinator_epoch)


def _new_identity(conn: Connection, meta: TxnMetadata, now_ms: int) -> tuple[int, int]:
    ident = bumped_identity(meta.producer_id, meta.producer_epoch)
    if ident.needs_new_id:
        return allocate_producer_id(conn, meta.transactional_id, now_ms), 0
    return ident.producer_id, ident.producer_epoch


def fence_and_abort(
    conn: Connection, meta: TxnMetadata, epoch: int, now_ms: int, reason: str
) -> TxnMetadata:
    """BEGIN → PREPARE_ABORT with a bumped epoch (fencing the current holder) → completed."""
    prepared = fence_to_abort(conn, meta, epoch, now_ms, reason)
    crash_point("fence.after_prepare")
    return complete_transaction(conn, prepared, now_ms)


def fence_to_abort(
    conn: Connection, meta: TxnMetadata, epoch: int, now_ms: int, reason: str
) -> TxnMetadata:
    """``fence_and_abort``'s first step: BEGIN → PREPARE_ABORT with a bumped epoch, its
    completion left to the caller (which may end several transactions together)."""
    producer_id, producer_epoch = _new_identity(conn, meta, now_ms)
    prepared = plan_fence_abort(meta, producer_id, producer_epoch, now_ms)
    return persist(conn, replace(prepared, coordinator_epoch=epoch), reason)


# ---------------------------------------------------------------- InitProducerId


def init_transactional_producer_id(
    broker: BrokerContext, req: InitProducerIdRequest
) -> InitProducerIdResponse:
    try:
        validate_timeout(req.transaction_timeout_ms, broker.settings.max_transaction_timeout_ms)
        return _init(broker, req)
    except KafkaException as exc:
        return InitProducerIdResponse(exc.error.code(), error_message=exc.error.str())


@retry_conflicts
def _init(broker: BrokerContext, req: InitProducerIdRequest) -> InitProducerIdResponse:
    assert req.transactional_id is not None
    tid = req.transactional_id
    now = broker.clock.now_ms()
    txn_partition = txn_partition_for(tid, broker.settings.transaction_log_partitions)
    with broker.engine.begin() as conn:
        authorize_all(conn, broker, needs.init_producer_id(tid))
        epoch = coordinator_epoch(conn, txn_partition)
        meta = load_for_update(conn, tid)
        producer_id = NO_PRODUCER_ID
        while meta is None:
            # No row, so nothing locked: the id is created by claiming its row. A request
            # that finds it claimed meanwhile is a second instance, and fences the first
            # through the row like any other (its open transaction aborted, not forgotten).
            if producer_id == NO_PRODUCER_ID:
                producer_id = allocate_producer_id(conn, tid, now)
            created = TxnMetadata(
                tid, producer_id, 0, NO_PRODUCER_ID, -1, m.EMPTY, (), False,
                req.transaction_timeout_ms, now, now, epoch, txn_partition,
            )  # fmt: skip
            if claim(conn, created, "InitProducerId: new transactional id"):
                return InitProducerIdResponse(KafkaError.NO_ERROR, producer_id, 0)
            meta = load_for_update(conn, tid)

        if req.producer_id != NO_PRODUCER_ID:
            # KIP-360: the caller names the identity it holds. A retry of an InitProducerId
            # that already bumped it is answered with the current identity, not bumped again.
            retry = (req.producer_id, req.producer_epoch) == (
                meta.last_producer_id,
                meta.last_producer_epoch,
            )
            if retry and meta.state == m.EMPTY:
                return InitProducerIdResponse(
                    KafkaError.NO_ERROR, meta.producer_id, meta.producer_epoch
                )
            if (req.producer_id, req.producer_epoch) != (meta.producer_id, meta.producer_epoch):
                raise fail(
                    KafkaError.PRODUCER_FENCED, "a newer instance holds this transactional id"
                )

        if meta.state in m.PREPARE:
            meta = complete_transaction(conn, replace(meta, coordinator_epoch=epoch), now)
        elif meta.state == m.BEGIN:
            meta = fence_and_abort(
                conn, meta, epoch, now, "InitProducerId: fenced the previous instance"
            )
        producer_id, producer_epoch = _new_identity(conn, meta, now)
        meta = meta.transition(
            "init_producer_id",
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            last_producer_id=meta.producer_id,
            last_producer_epoch=meta.producer_epoch,
            partitions=(),
            has_offsets=False,
            timeout_ms=req.transaction_timeout_ms,
            updated_ms=now,
            coordinator_epoch=epoch,
        )
        persist(conn, meta, "InitProducerId")
        return InitProducerIdResponse(KafkaError.NO_ERROR, producer_id, producer_epoch)


# ---------------------------------------------------------------- AddPartitions / AddOffsets


@retry_conflicts
def add_partitions_to_txn(
    broker: BrokerContext, req: AddPartitionsToTxnRequest
) -> AddPartitionsToTxnResponse:
    with broker.engine.begin() as conn:
        return register_partitions(conn, broker, req)[0]


def register_partitions(
    conn: Connection, broker: BrokerContext, req: AddPartitionsToTxnRequest
) -> tuple[AddPartitionsToTxnResponse, TxnMetadata | None]:
    """AddPartitionsToTxn in the caller's DB transaction (``check_registration``, then
    ``record_registration``). Also returns the transaction as registered (None on a
    refusal), its row locked FOR UPDATE until the caller commits."""
    response, registration = check_registration(conn, broker, req)
    if registration is None:
        return response, None
    return record_registration(conn, registration)


@dataclass(frozen=True)
class Registration:
    """An AddPartitionsToTxn ``check_registration`` allowed, not yet recorded: the
    transaction before it (its row locked FOR UPDATE until the caller commits) and the
    moment it was decided."""

    request: AddPartitionsToTxnRequest
    before: TxnMetadata
    now_ms: int

    @property
    def wanted(self) -> list[tuple[str, int]]:
        return sorted(set(self.request.partitions))

    @property
    def planned(self) -> TxnMetadata:
        """The transaction as it will be registered, for a produce request's batches to be
        checked against before it is recorded."""
        return plan_register(self.before, self.wanted, self.now_ms) or self.before


def check_registration(
    conn: Connection,
    broker: BrokerContext,
    req: AddPartitionsToTxnRequest,
    read_for_update: TxnMetadata | None = None,
    existing: set[tuple[str, int]] | None = None,
) -> tuple[AddPartitionsToTxnResponse, Registration | None]:
    """Every refusal of an AddPartitionsToTxn, answered before anything is written; writes
    nothing. The caller's DB transaction is the handler's own, or a produce request's that
    registers its partitions along with its batches (KIP-890's implicit add, where the
    partition leader adds on the producer's behalf).

    Returns the answer and, unless it is a refusal, the registration to record: a produce
    request checks its batches against the transaction as registered (``planned``) instead
    of reading the row again, then records it. ``read_for_update``: the metadata, if the caller already read
    it FOR UPDATE in this DB transaction; ``existing``: the partitions known to exist among
    those wanted, if the caller already locked them."""
    wanted = sorted(set(req.partitions))
    try:
        if not wanted:
            raise fail(KafkaError.INVALID_REQUEST, "no partitions to add")
        refused = denied_checks(
            conn, broker, needs.add_partitions_to_txn(req.transactional_id, wanted)
        )
        if refused:
            if refused[0].resource_type != TOPIC:
                raise refusal_of(broker, refused[0])
            topics = {c.name for c in refused}
            results = {
                tp: KafkaError.TOPIC_AUTHORIZATION_FAILED
                if tp[0] in topics
                else KafkaError.OPERATION_NOT_ATTEMPTED
                for tp in wanted
            }
            return AddPartitionsToTxnResponse(
                KafkaError.TOPIC_AUTHORIZATION_FAILED,
                results,
                f"not authorized: {sorted(topics)}",
            ), None
        if existing is None:
            existing = {
                (r.topic, r.partition)
                for r in conn.execute(
                    sql.EXISTING_PARTITIONS,
                    {"topics": [t for t, _ in wanted], "partitions": [p for _, p in wanted]},
                )
            }
        missing = [tp for tp in wanted if tp not in existing]
        if missing:
            results = {
                tp: (
                    KafkaError.UNKNOWN_TOPIC_OR_PARTITION
                    if tp in missing
                    else KafkaError.OPERATION_NOT_ATTEMPTED
                )
                for tp in wanted
            }
            return AddPartitionsToTxnResponse(
                KafkaError.UNKNOWN_TOPIC_OR_PARTITION, results, f"unknown partitions: {missing}"
            ), None
        if read_for_update is None:
            read_for_update = load_for_update(conn, req.transactional_id)
        meta = check_producer(read_for_update, req.producer_id, req.producer_epoch)
        now = broker.clock.now_ms()
        plan_register(meta, wanted, now)  # the state's refusals, too
        answer = AddPartitionsToTxnResponse(KafkaError.NO_ERROR, dict.fromkeys(wanted, 0))
        return answer, Registration(req, meta, now)
    except KafkaException as exc:
        code = exc.error.code()
        response = AddPartitionsToTxnResponse(code, dict.fromkeys(wanted, code), exc.error.str())
        return response, None


def record_registration(
    conn: Connection,
    registration: Registration,
    refused: dict[tuple[str, int], int] | None = None,
    record: Persist = persist,
) -> tuple[AddPartitionsToTxnResponse, TxnMetadata]:
    """Persist ``registration``, less the partitions in ``refused`` (with the error of
    their refused batches) that were not in the transaction already: a produce request
    registers a partition only along with a batch for it, never a partition its batches
    did not reach (its abort marker could be refused, and the transaction never end).
    ``record``: how the transition is persisted (``txn_log.TransitionBatch`` to write it
    with later ones). Returns the answer and the transaction as registered."""
    before, wanted = registration.before, registration.wanted
    kept = set(before.partitions) if before.state == m.BEGIN else set()
    dropped = {tp: code for tp, code in (refused or {}).items() if tp in wanted and tp not in kept}
    after = plan_register(before, [tp for tp in wanted if tp not in dropped], registration.now_ms)
    meta = before if after is None else record(conn, after, "AddPartitionsToTxn")
    results = {tp: dropped.get(tp, KafkaError.NO_ERROR) for tp in wanted}
    return AddPartitionsToTxnResponse(KafkaError.NO_ERROR, results), meta


@retry_conflicts
def add_offsets_to_txn(
    broker: BrokerContext, req: AddOffsetsToTxnRequest
) -> AddOffsetsToTxnResponse:
    try:
        if not isinstance(req.group_id, str) or not req.group_id:
            raise fail(KafkaError.INVALID_GROUP_ID, "group id must be a non-empty string")
        with broker.engine.begin() as conn:
            authorize_all(
                conn, broker, needs.add_offsets_to_txn(req.transactional_id, req.group_id)
            )
            add_offsets_in(conn, req, broker.clock.now_ms())
        return AddOffsetsToTxnResponse(KafkaError.NO_ERROR)
    except KafkaException as exc:
        return AddOffsetsToTxnResponse(exc.error.code(), exc.error.str())


def add_offsets_in(
    conn: Connection,
    req: AddOffsetsToTxnRequest | TxnOffsetCommitRequest,
    now_ms: int,
    record: Persist = persist,
) -> Leased | None:
    """AddOffsetsToTxn's work in the caller's DB transaction: the id's row taken FOR
    UPDATE (its lease's FOR SHARE, as a commit takes them), the producer checked, offsets
    joining the transaction (starting it if need be). A TxnOffsetCommit of KIP-890's
    transaction version 2 does it too, before its offsets (``app.broker.offsets``): both
    requests name the id, the producer and the group. Returns the metadata it left, with
    the lease's epoch, if it moved the row (None if the offsets were in already): what
    the transaction's commit may be decided on (docs/design.md §3.11). ``record``: how the
    transition is persisted."""
    leased = load_with_lease(conn, req.transactional_id)
    meta = check_producer(leased.meta, req.producer_id, req.producer_epoch)
    if meta.state == m.BEGIN and meta.has_offsets:
        return None
    added = record(conn, plan_add(meta, [], True, now_ms), f"AddOffsetsToTxn: group {req.group_id}")
    return Leased(added, leased.coordinator_epoch)


# ---------------------------------------------------------------- EndTxn


def end_txn(broker: BrokerContext, req: EndTxnRequest) -> EndTxnResponse:
    try:
        meta = prepare_end_txn(broker, req)
        crash_point("end_txn.after_prepare")
        if meta.state in m.PREPARE:
            meta = roll_forward(broker, req.transactional_id) or meta
        return EndTxnResponse(KafkaError.NO_ERROR, meta.producer_id, meta.producer_epoch)
    except KafkaException as exc:
        return EndTxnResponse(exc.error.code(), error_message=exc.error.str())


@retry_conflicts
def prepare_end_txn(broker: BrokerContext, req: EndTxnRequest) -> TxnMetadata:
    with broker.engine.begin() as conn:
        authorize_all(conn, broker, needs.end_txn(req.transactional_id))
        return prepare_in(conn, broker, req, load_with_lease(conn, req.transactional_id))


def prepare_in(
    conn: Connection,
    broker: BrokerContext,
    req: EndTxnRequest,
    leased: Leased,
    record: Persist = persist,
) -> TxnMetadata:
    """EndTxn's step (1) in the caller's DB transaction, on what ``load_with_lease`` read
    (rows locked): PREPARE_* with the next identity, stamped with the lease's coordinator
    epoch, or the current metadata for a retry of an EndTxn that already ended the
    transaction. Refusals raise before any write."""
    meta, epoch = leased
    if meta is not None and end_retry_outcome(
        meta, req.producer_id, req.producer_epoch, req.committed
    ):
        return meta
    if (
        meta is not None
        and req.after_abort_is_retry
        and after_coordinator_abort(meta, req.producer_id, req.producer_epoch)
    ):
        if req.committed:
            raise fail(
                KafkaError.INVALID_TXN_STATE,
                f"the coordinator aborted the transaction ({meta.state}), cannot commit",
            )
        return meta
    meta = check_producer(meta, req.producer_id, req.producer_epoch)
    if meta.state in m.PREPARE:
        raise fail(KafkaError.CONCURRENT_TRANSACTIONS, f"transaction is completing ({meta.state})")
    if meta.state != m.BEGIN:
        raise fail(
            KafkaError.INVALID_TXN_STATE, f"no ongoing transaction to end (state {meta.state})"
        )
    now = broker.clock.now_ms()
    producer_id, producer_epoch = meta.producer_id, meta.producer_epoch
    if req.bump_epoch:
        producer_id, producer_epoch = _new_identity(conn, meta, now)
    prepared = plan_end(meta, req.committed, producer_id, producer_epoch, now)
    return record(conn, replace(prepared, coordinator_epoch=epoch), "EndTxn")


@retry_conflicts
def roll_forward(
    broker: BrokerContext, transactional_id: str, expected_epoch: int | None = None
) -> TxnMetadata | None:
    """Complete a PREPARE_* transaction if it still is one (EndTxn, the loop, recovery).

    ``expected_epoch``: a coordinator loop's lease epoch; if the lease moved on, the loop is
    a zombie and must not write markers (TRANSACTION_COORDINATOR_FENCED).
    """
    with broker.engine.begin() as conn:
        meta, epoch = load_with_lease(conn, transactional_id)
        if meta is None or meta.state not in m.PREPARE:
            return meta
        if expected_epoch is not None and epoch != expected_epoch:
            raise fail(
                KafkaError.TRANSACTION_COORDINATOR_FENCED,
                f"lease epoch is {epoch}, not {expected_epoch}",
            )
        stamped = replace(meta, coordinator_epoch=epoch)
        return complete_transaction(conn, stamped, broker.clock.now_ms())


# ---------------------------------------------------------------- FindCoordinator, WriteTxnMarkers


def find_coordinator(broker: BrokerContext, req: FindCoordinatorRequest) -> FindCoordinatorResponse:
    """Every key is coordinated by this database: answer with its address."""
    if not req.key:
        return FindCoordinatorResponse(
            KafkaError.INVALID_REQUEST, error_message="empty coordinator key"
        )
    if req.key_type not in (COORDINATOR_GROUP, COORDINATOR_TRANSACTION):
        return FindCoordinatorResponse(
            KafkaError.INVALID_REQUEST, error_message=f"unknown key type {req.key_type}"
        )
    host, port = urls.parse(broker.engine.url).hosts[0]  # a replicated one's first node
    return FindCoordinatorResponse(KafkaError.NO_ERROR, 0, host, port)


def write_txn_markers(
    broker: BrokerContext, req: WriteTxnMarkersRequest
) -> WriteTxnMarkersResponse:
    """The coordinator-to-partition RPC, and Admin.abortTransaction's (KIP-664): one DB
    transaction per partition, as separate partition leaders would each answer on their own,
    each through the decision ``kip98 transactions abort`` takes too (``mark_partition``).
    Alter or ClusterAction on the cluster, as Kafka checks it."""
    results: dict[tuple[str, int], int] = {}
    control = CONTROL_COMMIT if req.committed else CONTROL_ABORT
    for topic, partition in sorted(set(req.partitions)):
        try:
            with broker.engine.begin() as conn:
                authorize_any(conn, broker, needs.write_txn_markers_request())
                marker = Marker(
                    req.producer_id, req.producer_epoch, req.coordinator_epoch, control,
                    broker.clock.now_ms(),
                )  # fmt: skip
                mark_partition(conn, (topic, partition), marker)
            results[(topic, partition)] = KafkaError.NO_ERROR
        except KafkaException as exc:
            results[(topic, partition)] = exc.error.code()
    return WriteTxnMarkersResponse(results)
