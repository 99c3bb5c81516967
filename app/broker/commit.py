"""EndTxn carrying the transaction's last batches: a Producer's commit as one request
(a ``ProduceBatchesRequest`` with ``end``).

``commit_transaction`` nearly always finds batches not yet sent (``linger.ms`` holds a
transaction's last records until the commit flushes them). Sent first and EndTxn after, as
Kafka's client does, that is three DB transactions: the batches, PREPARE, then markers and
COMPLETE. Sent together they are one: the batches are appended (registering their new
partitions, as KIP-890's implicit AddPartitionsToTxn does), and only if every batch was
accepted is the transaction ended in the same DB transaction, PREPARE, markers and
COMPLETE, as InitProducerId's fencing already ends an ongoing one.

All of it commits or none of it. A crash or a lost connection before COMMIT leaves the
transaction ongoing without these batches, so EndTxn never ends a transaction whose last
batches are missing: the client retries this same request, never a bare EndTxn. After
COMMIT, the retry finds the transaction ended by this producer id and epoch (EndTxn's retry
rule, rule 4) and answers the batches as delivered, with the offsets they were given.
A refused batch stops the commit: the other batches are appended, the transaction stays
ongoing, and the client's commit fails as it would after a failed flush.

Lock order (docs/design.md §3.3): the transactional id's row first (FOR UPDATE), then, in one
statement and sorted, every partition the request touches (its batches' and those the
markers will mark); the registration, the appends and the markers work on those rows.
"""

from __future__ import annotations

from dataclasses import replace

from app.broker.batches import append_batches
from app.broker.work import Work
from app.coordinator import machines as m
from app.coordinator.completion import complete_transaction
from app.coordinator.handlers import prepare_in
from app.coordinator.metadata import TxnMetadata, end_retry_outcome
from app.coordinator.txn_log import Leased, TransitionBatch, load_with_lease
from app.errors import KafkaError, KafkaException
from app.faults import crash_point
from app.log.append import recorded_batch
from app.log.markers import MarkerLocks, lock_for_markers
from app.protocol import (
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnResponse,
    ProduceBatchesRequest,
    ProduceBatchesResponse,
    ProduceResponse,
)
from app.security import needs
from app.security.authorizer import authorize_all
from app.storage.context import BrokerContext
from app.storage.driver import WriteBehind
from app.storage.engine import retry_conflicts

NOT_ATTEMPTED = "a batch of the transaction was refused; the transaction was not ended"


@retry_conflicts
def produce_and_end_txn(
    context: BrokerContext, req: ProduceBatchesRequest
) -> ProduceBatchesResponse:
    """Append ``req``'s batches (after registering ``req.add``) and end the transaction
    (``req.end``), in one DB transaction; see the module docstring for what a retry and a
    refusal do."""
    with context.engine.begin() as conn:
        work = Work(context, conn, transitions=TransitionBatch(), writes=WriteBehind())
        response = _commit(work, req)
        work.send()
        crash_point("commit_request.before_commit")  # every write done, none committed
        return response


def _commit(work: Work, req: ProduceBatchesRequest) -> ProduceBatchesResponse:
    """The request inside its DB transaction. Its transitions (registration, PREPARE,
    COMPLETE) and its last writes (the partitions' advance, the markers) are queued on
    ``work``: the caller sends them together once the request is decided."""
    end, add, conn, context = req.end, req.add, work.conn, work.context
    assert end is not None
    try:
        authorize_all(conn, context, needs.end_txn(end.transactional_id))
        meta, epoch = load_with_lease(conn, end.transactional_id)
        if meta is not None and end_retry_outcome(
            meta, end.producer_id, end.producer_epoch, end.committed
        ):
            delivered = [recorded_batch(conn, batch) for batch in req.batches]
            return ProduceBatchesResponse(delivered, _answer(add, KafkaError.NO_ERROR), _ok(meta))
    except KafkaException as exc:
        code, message = exc.error.code(), exc.error.str()
        failed = ProduceResponse(code, error_message=message)
        return ProduceBatchesResponse(
            [failed] * len(req.batches),
            _answer(add, code, message),
            EndTxnResponse(code, error_message=message),
        )
    work.loaded[end.transactional_id] = meta
    locked = None if meta is None else _lock_partitions(work, meta, req)
    work.locked = None if locked is None else locked.rows
    registered, responses = append_batches(work, req.batches, add)
    failed_batch = registered is not None and registered.error_code != KafkaError.NO_ERROR
    if failed_batch or any(r.error_code != KafkaError.NO_ERROR for r in responses):
        not_attempted = EndTxnResponse(KafkaError.OPERATION_NOT_ATTEMPTED, -1, -1, NOT_ATTEMPTED)
        return ProduceBatchesResponse(responses, registered, not_attempted)
    try:
        leased = Leased(work.loaded[end.transactional_id], epoch)
        meta = prepare_in(conn, context, end, leased, work.record)
        crash_point("end_txn.after_prepare")
        if meta.state in m.PREPARE:
            now = context.clock.now_ms()
            stamped = replace(meta, coordinator_epoch=epoch)
            meta = complete_transaction(conn, stamped, now, locked=locked, record=work.record)
        ended = _ok(meta)
    except KafkaException as exc:
        # A refused marker (a fenced coordinator) leaves PREPARE to commit alone, to be
        # rolled forward later (rule 2), and is answered as a bare EndTxn answers it.
        ended = EndTxnResponse(exc.error.code(), error_message=exc.error.str())
    return ProduceBatchesResponse(responses, registered, ended)


def _answer(
    add: AddPartitionsToTxnRequest | None, code: int, message: str | None = None
) -> AddPartitionsToTxnResponse | None:
    """The registration's answer when the request was decided before it: registered by
    the request being retried, or refused with it."""
    if add is None:
        return None
    return AddPartitionsToTxnResponse(code, dict.fromkeys(add.partitions, code), message)


def _ok(meta: TxnMetadata) -> EndTxnResponse:
    return EndTxnResponse(KafkaError.NO_ERROR, meta.producer_id, meta.producer_epoch)


def _lock_partitions(work: Work, meta: TxnMetadata, req: ProduceBatchesRequest) -> MarkerLocks:
    """Every partition the request touches, locked in sorted order in one statement, each
    with this producer's state: those of the batches and those the markers will mark. The
    registration, the appends and the markers then use these rows rather than lock again
    (the markers also what ``lock_for_markers`` reads with them)."""
    touched = set(meta.partitions) | {(b.topic, b.partition) for b in req.batches}
    if req.add is not None:
        touched |= set(req.add.partitions)
    return lock_for_markers(work.conn, touched, meta.producer_id, work.writes)
