"""Ending a set of prepared transactions in one DB transaction: how an exactly-once sink
(Spark's ``kip98`` sink, one transaction per task) commits a batch whole or not at all.

Each writer left its transaction open once all its records were in (prepared, as Kafka's
KIP-939 two-phase commit has it: flushed, its outcome left to an external coordinator)
and handed its identity (transactional id, producer id, epoch) to the one that decides.
That one ends them all here, in one DB transaction, with the coordinator's own steps for
each: EndTxn's PREPARE (``handlers.prepare_in``: the identity checked, the epoch bumped),
then its completion (``completion.complete_transaction``: markers, COMPLETE), as the
combined commit already ends a transaction in the DB transaction of its last batches
(docs/design.md rule 11). The caller's ``claim`` runs first in the same DB transaction:
it records the batch as committed, or finds it was already (a replayed batch), in which
case every transaction is aborted instead. So a batch becomes visible to read_committed
readers at one commit, exactly once, or not at all.

Commit requires every transaction still ongoing with the identity its writer handed over:
a writer fenced since (a retried attempt of the same task re-initialised the id, the
coordinator timed it out) makes the whole batch fail, nothing written. Transactions left
ongoing under ``strays`` (a prefix of transactional ids) that are not among those handed
over belong to attempts whose answer never reached the decider (a failed task, a killed
driver's batch): they are fenced and aborted here, as InitProducerId fences them.

Lock order (docs/design.md §3.3): the caller's claim row, the transactional ids' rows in
sorted order, then every partition of every transaction in one sorted statement, before
the first marker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sqlalchemy import Connection

from app.coordinator import machines as m
from app.coordinator.completion import complete_transaction
from app.coordinator.handlers import fence_to_abort, prepare_in
from app.coordinator.inspect import ongoing_under_prefix
from app.coordinator.metadata import TxnMetadata, check_producer
from app.coordinator.txn_log import Leased, load_with_lease
from app.errors import KafkaError, fail
from app.faults import crash_point
from app.log.partition_lock import lock_partitions
from app.protocol import EndTxnRequest
from app.storage.context import BrokerContext
from app.storage.engine import retry_conflicts


@dataclass(frozen=True)
class PreparedTxn:
    """A transaction its writer left open with all its records in."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass
class Ended:
    """What ``end_prepared`` did: whether the batch committed (False: it had been
    committed before, or the caller asked to abort), and the ids by outcome."""

    committed: bool
    commits: list[str] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)


# Records the batch in the caller's DB transaction: True if this is its first commit.
Claim = Callable[[Connection], bool]


@retry_conflicts
def end_prepared(
    broker: BrokerContext,
    prepared: Sequence[PreparedTxn],
    claim: Claim | None,
    strays: str | None = None,
) -> Ended:
    """Commit ``prepared`` together if ``claim`` says the batch is new, abort them if it
    was committed before or ``claim`` is None (an abort); either way abort every other
    transaction ongoing under the prefix ``strays``. One DB transaction."""
    handed = {p.transactional_id: p for p in prepared}
    if len(handed) != len(prepared):
        raise fail(KafkaError.INVALID_REQUEST, "a transactional id was handed over twice")
    now = broker.clock.now_ms()
    with broker.engine.begin() as conn:
        committing = claim is not None and claim(conn)
        ended = Ended(committing)
        stray = [] if strays is None else ongoing_under_prefix(conn, strays)
        ids = sorted(set(handed) | set(stray))
        loaded = {tid: load_with_lease(conn, tid) for tid in ids}
        to_complete: list[TxnMetadata] = []
        for tid in ids:
            leased = loaded[tid]
            p = handed.get(tid)
            if p is None:
                meta = _stray(conn, leased, now)
                if meta is not None:
                    to_complete.append(meta)
                    ended.aborts.append(tid)
            elif committing:
                to_complete.append(_prepare(conn, broker, leased, p, commit=True))
                ended.commits.append(tid)
            else:
                meta = _abort_if_ongoing(conn, broker, leased, p)
                if meta is not None:
                    to_complete.append(meta)
                    ended.aborts.append(tid)
        crash_point("end_prepared.after_prepare")
        touched = sorted({tp for meta in to_complete for tp in meta.partitions})
        if touched:
            lock_partitions(conn, [(t, p, -1) for t, p in touched])
        for meta in to_complete:
            complete_transaction(conn, meta, now)
        crash_point("end_prepared.before_commit")
    return ended


def _prepare(
    conn: Connection, broker: BrokerContext, leased: Leased, p: PreparedTxn, commit: bool
) -> TxnMetadata:
    """EndTxn's PREPARE of a handed-over transaction, which must still be ongoing with the
    identity handed over (else the whole batch fails: nothing is written)."""
    meta = check_producer(leased.meta, p.producer_id, p.producer_epoch)
    if meta.state != m.BEGIN:
        raise fail(
            KafkaError.INVALID_TXN_STATE,
            f"transaction of {p.transactional_id!r} is {meta.state}, not ongoing",
        )
    request = EndTxnRequest(p.transactional_id, p.producer_id, p.producer_epoch, commit)
    return prepare_in(conn, broker, request, leased)


def _abort_if_ongoing(
    conn: Connection, broker: BrokerContext, leased: Leased, p: PreparedTxn
) -> TxnMetadata | None:
    """Abort a handed-over transaction if it is still the ongoing one of that identity;
    one already ended or fenced has nothing left to abort."""
    meta = leased.meta
    if meta is None or meta.state != m.BEGIN:
        return None
    if (meta.producer_id, meta.producer_epoch) != (p.producer_id, p.producer_epoch):
        return None
    return _prepare(conn, broker, leased, p, commit=False)


def _stray(conn: Connection, leased: Leased, now_ms: int) -> TxnMetadata | None:
    """Fence an ongoing transaction nobody handed over and take it to PREPARE_ABORT (as
    InitProducerId of a new instance does); None if it is no longer ongoing."""
    meta = leased.meta
    if meta is None or meta.state != m.BEGIN:
        return None
    epoch = leased.coordinator_epoch
    return fence_to_abort(conn, meta, epoch, now_ms, "a sink's batch ended without it")
