"""A commit (``broker.commit``) or a registration with its batches (``broker.produce``)
on the rows this process's last request of the transactional id left, in one query
string checked by their versions (docs/design.md §3.11): decided in full on those rows by
``commit_decision.decide``, as under the locks, then sent with the locking reads first;
refused (nothing written) if a row moved. ``broker.strategy`` chooses when to try it.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from sqlalchemy import Connection

from app.broker.commit_decision import Decided, decide
from app.broker.work import Plan, Work
from app.coordinator.metadata import TxnMetadata, end_retry_outcome
from app.coordinator.txn_log import (
    Leased,
    RememberedTxn,
    TransitionBatch,
    forget_txn,
    remembered_txn,
    txn_matches,
    txn_version_query,
    written_version_query,
)
from app.errors import KafkaError
from app.log import sql as log_sql
from app.log.markers import (
    MarkerLocks,
    hidden_by_own,
    others_first_open,
    others_first_open_query,
    others_match,
)
from app.log.partition_lock import (
    PartitionRow,
    Remembered,
    forget,
    lock_versions_query,
    remembered,
    versions_match,
    written_versions,
    written_versions_query,
)
from app.protocol import ProduceBatchesRequest, ProduceBatchesResponse, TopicPartitionKey
from app.storage.context import BrokerContext
from app.storage.driver import WriteBehind, driver_connection, in_transaction
from app.storage.one_query import Check, Refused, prepared_call, unprepared, write_checked
from app.storage.replication import ReplicationUnconfirmed


@dataclass(frozen=True)
class Remembering:
    """What a request decided in full leaves for the id's next one: the metadata it left
    (a commit's COMPLETE_*, a registration's ongoing transaction) and its lease epoch, and
    its partitions' rows before and after it (a row it changed was written by it, at its
    version)."""

    left: TxnMetadata
    coordinator_epoch: int
    before: dict[TopicPartitionKey, PartitionRow]
    after: dict[TopicPartitionKey, PartitionRow]

    def written(self) -> dict[TopicPartitionKey, PartitionRow]:
        """The partition rows the request wrote, as it left them."""
        return {tp: row for tp, row in self.after.items() if self.before.get(tp) != row}


@dataclass(frozen=True)
class _Planned:
    work: Work
    plan: Plan
    left: TxnMetadata
    hints: dict[TopicPartitionKey, Remembered]
    after: dict[TopicPartitionKey, PartitionRow]
    # The other producers' open transactions the markers were decided on, to be read
    # under the locks (None: they follow from the rows, ``others_first_open``).
    others: dict[TopicPartitionKey, int] | None


def on_remembered(
    conn: Connection, context: BrokerContext, req: ProduceBatchesRequest
) -> ProduceBatchesResponse | Refused | None:
    """A commit (``req.end``) or a transaction's batches registering their partitions
    (``req.add``, KIP-890), decided on the remembered rows and sent as one query string
    on ``conn`` (outside any transaction). ``Refused`` where a row moved or the write
    failed with nothing written; None where the decision needs the locks (a batch or the
    registration refused, a read of the database). Either way nothing is written."""
    named = req.end if req.end is not None else req.add
    assert named is not None
    tid = named.transactional_id
    memory = remembered_txn(conn, tid)
    if memory is None:
        return None
    try:
        planned = _plan(conn, context, req, memory)
        if planned is None:
            return None
        return _send(conn, tid, memory, planned)
    except psycopg.Error as exc:
        if driver_connection(conn).broken:
            raise  # the outcome is unknown: the client retries the request
        if isinstance(exc, ReplicationUnconfirmed):
            # Committed on the primary, not confirmed (rule 41): a commit's client
            # retries, and the retry, decided under the locks, waits for the
            # confirmation; a registration's batches are answered as unconfirmed.
            _forget(conn, tid, _touched(memory.leased.meta, req))
            raise
        if isinstance(exc, psycopg.errors.InvalidSqlStatementName):
            unprepared(conn)  # deallocated: prepared again next time
        # Nothing was written: a write decided on a moved row failed (or a statement
        # could not be prepared), and the lock's way decides again.
        _forget(conn, tid, _touched(memory.leased.meta, req))
        return Refused(str(exc).strip() or type(exc).__name__)


def _plan(
    conn: Connection, context: BrokerContext, req: ProduceBatchesRequest, memory: RememberedTxn
) -> _Planned | None:
    """``req`` decided on the remembered rows, nothing sent; None where the lock's way
    must decide it."""
    end = req.end
    meta = memory.leased.meta
    if meta is None or not req.batches:
        return None  # no COPY to carry the query string's end: the lock's way
    if end is not None and end_retry_outcome(
        meta, end.producer_id, end.producer_epoch, end.committed
    ):
        return None
    hints: dict[TopicPartitionKey, Remembered] = {}
    for tp in _touched(meta, req):
        hint = remembered(conn, tp)
        if hint is None or hint.row.s_producer_id != meta.producer_id:
            return None
        hints[tp] = hint
    rows = {tp: hint.row for tp, hint in hints.items()}
    others = others_first_open(rows)
    # Where the producer's own transaction hides whether another's opened behind it, the
    # markers are decided on none being open, and the query reads them to make sure.
    checked = others if req.end is not None and hidden_by_own(rows) else None
    writes = WriteBehind()
    work = Work(context, conn, transitions=TransitionBatch(), writes=writes, copies=[])
    locks = MarkerLocks(meta.producer_id, rows, dict(others), writes)
    decided = decide(work, req, memory.leased, locks)
    if in_transaction(conn) or conn.in_transaction():
        # A decision read the database (through SQLAlchemy or the driver): it is taken
        # under the locks. Nothing it ran is kept.
        conn.rollback()
        driver_connection(conn).rollback()
        return None
    left = decided.ended if end is not None else _registered(work, decided, meta)
    if left is None or not work.copies:
        return None
    return _Planned(work, work.plan(decided.response), left, hints, locks.rows, checked)


def _registered(work: Work, decided: Decided, meta: TxnMetadata) -> TxnMetadata | None:
    """The metadata a registering request leaves, if it took every batch and partition
    (a refusal is decided only on rows read under their locks); else None."""
    response = decided.response
    if response.registered is None or response.registered.error_code != KafkaError.NO_ERROR:
        return None
    if any(batch.error_code != KafkaError.NO_ERROR for batch in response.batches):
        return None
    return work.loaded.get(meta.transactional_id)


def _touched(meta: TxnMetadata | None, req: ProduceBatchesRequest) -> list[TopicPartitionKey]:
    """The partitions the request locks, sorted: a commit's as ``commit._lock_partitions``
    (those its markers will mark too), a registration's those of its batches and its
    registration."""
    touched = {(b.topic, b.partition) for b in req.batches}
    if meta is not None and req.end is not None:
        touched |= set(meta.partitions)
    if req.add is not None:
        touched |= set(req.add.partitions)
    return sorted(touched)


def _send(
    conn: Connection, tid: str, memory: RememberedTxn, planned: _Planned
) -> ProduceBatchesResponse | Refused:
    """The planned request as one checked query string (``one_query.write_checked``): the
    id's row and the partitions locked with their versions, which must be those
    remembered (and, where the markers were decided on none, no other producer's
    transaction open behind this one's), then the writes, the row's new version, the
    COPYs."""
    touched = sorted(planned.hints)
    expected = {tp: hint.version for tp, hint in planned.hints.items()}
    moved = "a row moved since this process wrote it"
    statements: list[bytes | Check] = [
        Check(txn_version_query(conn, tid), lambda read: txn_matches(read, memory), moved),
        Check(
            lock_versions_query(conn, touched),
            lambda read: versions_match(read, expected),
            moved,
        ),
    ]
    if planned.others is not None:  # after the locks: every other producer's write is in
        producer_id = memory.leased.meta.producer_id if memory.leased.meta else -1
        others = planned.others
        statements.append(
            Check(
                others_first_open_query(conn, touched, producer_id),
                lambda read: others_match(read, others),
                "another producer's transaction opened behind this one",
            )
        )
    plan = planned.plan
    statements += [prepared_call(conn, statement, params) for statement, params in plan.writes]
    statements.append(written_version_query(conn, tid))
    ends = plan.response.end is not None
    before = {tp: hint.row for tp, hint in planned.hints.items()}
    epoch = memory.leased.coordinator_epoch
    written = Remembering(planned.left, epoch, before, planned.after).written()
    # A registration that adds no partition leaves the id's row as it was: the rows it
    # wrote are at a version of their own, read after them. (Else every row it wrote is at
    # the id's row's new version.)
    own_versions = bool(written) and planned.left == memory.leased.meta
    if own_versions:
        statements.append(written_versions_query(conn, written))
    results = write_checked(
        conn,
        log_sql.COPY_RECORDS,
        statements,
        plan.copies,
        stop="commit.in_one_query" if ends else "register.in_one_query",
    )
    if isinstance(results, Refused):
        _forget(conn, tid, touched)
        return results
    if own_versions:
        versions = written_versions(results[-1])
        planned.work.left.update((tp, (versions[tp], row)) for tp, row in written.items())
        results, written = results[:-1], {}
    xmin = results[-1].get_value(0, 0)
    assert xmin is not None
    planned.work.leave(xmin.decode(), Leased(planned.left, epoch), written)
    planned.work.remember()
    return plan.response


def _forget(conn: Connection, transactional_id: str, partitions: list[TopicPartitionKey]) -> None:
    forget_txn(conn, transactional_id)
    for tp in partitions:
        forget(conn, tp)
