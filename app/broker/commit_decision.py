"""What a combined commit (``broker.commit``) does once its transactional id's row and its
partitions are in hand: register, append, PREPARE, mark, COMPLETE, all queued on the
request's ``Work``. The same decisions whether the rows were read under their locks or
are the ones this process's last commit left (``broker.commit_remembered``, which sends
them only if the rows are still those).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from app.broker.batches import append_batches
from app.broker.work import Work
from app.coordinator import machines as m
from app.coordinator.completion import complete_transaction
from app.coordinator.handlers import prepare_in
from app.coordinator.metadata import TxnMetadata
from app.coordinator.txn_log import Leased
from app.errors import KafkaError, KafkaException
from app.faults import crash_point
from app.log.markers import MarkerLocks
from app.protocol import (
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnResponse,
    ProduceBatchesRequest,
    ProduceBatchesResponse,
)

NOT_ATTEMPTED = "a batch of the transaction was refused; the transaction was not ended"


@dataclass(frozen=True)
class Decided:
    """The request's answer and, if it ended the transaction with every batch in, the
    metadata it leaves (COMPLETE_*; else None)."""

    response: ProduceBatchesResponse
    ended: TxnMetadata | None = None


def decide(
    work: Work, req: ProduceBatchesRequest, leased: Leased, locked: MarkerLocks | None
) -> Decided:
    """The request on ``leased`` (its id's metadata and lease epoch) and ``locked`` (its
    partitions, None if the id is unknown). Its transitions (registration, PREPARE,
    COMPLETE) and its last writes (the partitions' advance, the markers) are queued on
    ``work``: the caller sends them together once the request is decided. A request
    without ``end`` (a transaction's first batches, registering their partitions) stops
    after its batches: the registered metadata is then ``work.loaded``'s."""
    end, add = req.end, req.add
    tid = end.transactional_id if end is not None else add.transactional_id if add else None
    assert tid is not None
    work.loaded[tid] = leased.meta
    work.locked = locked
    registered, responses = append_batches(work, req.batches, add)
    if end is None:
        return Decided(ProduceBatchesResponse(responses, registered))
    failed_batch = registered is not None and registered.error_code != KafkaError.NO_ERROR
    if failed_batch or any(r.error_code != KafkaError.NO_ERROR for r in responses):
        not_attempted = EndTxnResponse(KafkaError.OPERATION_NOT_ATTEMPTED, -1, -1, NOT_ATTEMPTED)
        return Decided(ProduceBatchesResponse(responses, registered, not_attempted))
    meta = None
    try:
        prepared = Leased(work.loaded[end.transactional_id], leased.coordinator_epoch)
        meta = prepare_in(work.conn, work.context, end, prepared, work.record)
        crash_point("end_txn.after_prepare")
        if meta.state in m.PREPARE:
            now = work.context.clock.now_ms()
            stamped = replace(meta, coordinator_epoch=leased.coordinator_epoch)
            meta = complete_transaction(work.conn, stamped, now, locked=locked, record=work.record)
        ended = ok(meta)
    except KafkaException as exc:
        # A refused marker (a fenced coordinator) leaves PREPARE to commit alone, to be
        # rolled forward later (rule 2), and is answered as a bare EndTxn answers it.
        ended = EndTxnResponse(exc.error.code(), error_message=exc.error.str())
        meta = None
    completed = meta is not None and meta.state in m.COMPLETE
    return Decided(
        ProduceBatchesResponse(responses, registered, ended), meta if completed else None
    )


def answer(
    add: AddPartitionsToTxnRequest | None, code: int, message: str | None = None
) -> AddPartitionsToTxnResponse | None:
    """The registration's answer when the request was decided before it: registered by
    the request being retried, or refused with it."""
    if add is None:
        return None
    return AddPartitionsToTxnResponse(code, dict.fromkeys(add.partitions, code), message)


def ok(meta: TxnMetadata) -> EndTxnResponse:
    return EndTxnResponse(KafkaError.NO_ERROR, meta.producer_id, meta.producer_epoch)
