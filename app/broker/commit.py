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

Where ``broker.strategy`` chooses it, the commit is first tried on the rows this process
remembers, in one query string checked by their versions (``commit_remembered``, §3.11);
the lock's way here (``decide_under_locks``, which ``broker.write`` runs) is the
fallback, and seeds what is remembered.
"""

from __future__ import annotations

from app.broker.commit_decision import answer, decide, ok
from app.broker.commit_remembered import Remembering
from app.broker.work import Work
from app.coordinator.metadata import TxnMetadata, end_retry_outcome
from app.coordinator.txn_log import load_with_lease
from app.errors import KafkaError, KafkaException
from app.log.append import recorded_batch
from app.log.markers import MarkerLocks, lock_for_markers
from app.protocol import (
    EndTxnResponse,
    ProduceBatchesRequest,
    ProduceBatchesResponse,
    ProduceResponse,
)
from app.security import needs
from app.security.authorizer import authorize_all


def decide_under_locks(
    work: Work, req: ProduceBatchesRequest
) -> tuple[ProduceBatchesResponse, Remembering | None]:
    """The commit inside ``work``'s DB transaction, its rows read under their locks, its
    writes queued on ``work``; and, if it ended the transaction, what the process
    remembers of it once committed."""
    end, add, conn, context = req.end, req.add, work.conn, work.context
    assert end is not None
    try:
        authorize_all(conn, context, needs.end_txn(end.transactional_id))
        leased = load_with_lease(conn, end.transactional_id)
        meta = leased.meta
        if meta is not None and end_retry_outcome(
            meta, end.producer_id, end.producer_epoch, end.committed
        ):
            delivered = [recorded_batch(conn, batch) for batch in req.batches]
            return ProduceBatchesResponse(
                delivered, answer(add, KafkaError.NO_ERROR), ok(meta)
            ), None
    except KafkaException as exc:
        code, message = exc.error.code(), exc.error.str()
        failed = ProduceResponse(code, error_message=message)
        return ProduceBatchesResponse(
            [failed] * len(req.batches),
            answer(add, code, message),
            EndTxnResponse(code, error_message=message),
        ), None
    locked = None if meta is None else _lock_partitions(work, meta, req)
    before = {} if locked is None else dict(locked.rows)
    decided = decide(work, req, leased, locked)
    if decided.ended is None or locked is None:
        return decided.response, None
    return decided.response, Remembering(
        decided.ended, leased.coordinator_epoch, before, locked.rows
    )


def _lock_partitions(work: Work, meta: TxnMetadata, req: ProduceBatchesRequest) -> MarkerLocks:
    """Every partition the request touches, locked in sorted order in one statement, each
    with this producer's state: those of the batches and those the markers will mark. The
    registration, the appends and the markers then use these rows rather than lock again
    (the markers also what ``lock_for_markers`` reads with them)."""
    touched = set(meta.partitions) | {(b.topic, b.partition) for b in req.batches}
    if req.add is not None:
        touched |= set(req.add.partitions)
    return lock_for_markers(work.conn, touched, meta.producer_id, work.writes)
