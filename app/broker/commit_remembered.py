"""The combined commit (``broker.commit``), and a transaction's first request registering
its partitions (``broker.produce``), on the rows this process's last request of the
transactional id left (docs/design.md §3.11).

A producer's requests of one transactional id follow each other, and between two of
them nothing else usually writes the id's row or its partitions. So the process
remembers each row as its last commit or registration left it (the id's metadata with
its lease epoch; each partition with the producer's state, rule 32), and the next one is
decided on those, in full, before anything is sent: registration, appends and, for a
commit, PREPARE, markers and COMPLETE, exactly as ``commit_decision.decide`` decides
under the locks. The markers' LSO needs the other producers' open transactions, which
follow from each row's LSO (``markers.others_first_open``) except where the producer's
own open transaction is the earliest (``markers.hidden_by_own``): there the markers are
decided on none, and the query string reads them once it holds the partitions. Then one
query string: lock the id's row and its lease (as ``load_with_lease``) and the
partitions in sorted order (as ``lock_for_markers``), each read with its version (and,
where needed, the other producers' open transactions); every write the decision queued;
the row's new version; the COPYs, committed as the last COPY ends. The reads come back
with the first COPY's start: only if each is what the decision was made on are the
COPYs' data sent; otherwise the COPY is failed on purpose and the implicit transaction
rolls back with nothing written (a write decided on a stale row may instead fail
outright, which rolls back the same way); the request then takes the lock's way in a
fresh DB transaction, as if nothing had been tried. The locks are taken in the usual
order (§3.3), before any write.

Only a commit that the lock's way would end with every batch in, or a registration it
would take with every batch, goes this way: any refusal, a retry, a decision that would
read the database (ACLs, a new producer id, several batches for one partition), or a row
not remembered, and the request goes the lock's way from the start. The id's row may
also be the one a TxnOffsetCommit that added the group's offsets left
(``broker.offsets``): the pending offsets' completion is then among the queued writes,
read by the server when they run, under the id's row lock.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from sqlalchemy import Connection

from app.broker.commit_decision import Decided, decide
from app.broker.work import Work
from app.coordinator.metadata import TxnMetadata, end_retry_outcome
from app.coordinator.txn_log import (
    Leased,
    RememberedTxn,
    TransitionBatch,
    forget_txn,
    remember_txn,
    remembered_txn,
    txn_matches,
    txn_version_query,
    written_version_query,
)
from app.errors import KafkaError
from app.faults import crash_point
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
    remember,
    remembered,
    versions_match,
)
from app.protocol import ProduceBatchesRequest, ProduceBatchesResponse, TopicPartitionKey
from app.storage.context import BrokerContext
from app.storage.driver import WriteBehind, driver_connection, in_transaction
from app.storage.one_query import QueryCopies, prepared_call, unprepared
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


def remember_commit(conn: Connection, xmin: str, remembering: Remembering) -> None:
    """Remember the rows a committed commit left, ``xmin`` being its version."""
    remember_txn(conn, xmin, Leased(remembering.left, remembering.coordinator_epoch))
    for tp, row in remembering.after.items():
        if remembering.before.get(tp) != row:
            remember(conn, tp, xmin, row)


@dataclass(frozen=True)
class _Planned:
    decided: Decided
    left: TxnMetadata
    hints: dict[TopicPartitionKey, Remembered]
    writes: list[bytes]
    copies: list[bytes]
    after: dict[TopicPartitionKey, PartitionRow]
    # The other producers' open transactions the markers were decided on, to be read
    # under the locks (None: they follow from the rows, ``others_first_open``).
    others: dict[TopicPartitionKey, int] | None


def commit_on_remembered(
    context: BrokerContext, req: ProduceBatchesRequest
) -> ProduceBatchesResponse | None:
    """``req`` decided on the remembered rows and sent as one query string; None, with
    nothing written, where the lock's way must take it (see the module docstring)."""
    assert req.end is not None
    return _on_remembered(context, req, req.end.transactional_id)


def register_on_remembered(
    context: BrokerContext, req: ProduceBatchesRequest
) -> ProduceBatchesResponse | None:
    """A transaction's first batches, registering their partitions (``req.add``, KIP-890),
    decided on the rows the id's last request in this process left (its commit's, most
    often) and sent as one query string, as a commit is; None, with nothing written, where
    the lock's way must take it. Only where every batch is of the registering id and the
    lock's way would take them all with the registration (docs/design.md §3.11)."""
    add = req.add
    assert add is not None and req.end is None
    tid = add.transactional_id
    if not req.batches or any(
        not (b.is_transactional and b.transactional_id == tid) for b in req.batches
    ):
        return None
    return _on_remembered(context, req, tid)


def _on_remembered(
    context: BrokerContext, req: ProduceBatchesRequest, tid: str
) -> ProduceBatchesResponse | None:
    if context.settings.authorization:
        return None  # the ACLs are read in the DB transaction
    with context.engine.connect() as conn:
        memory = remembered_txn(conn, tid)
        if memory is None or in_transaction(conn):
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
            return None


def _plan(
    conn: Connection, context: BrokerContext, req: ProduceBatchesRequest, memory: RememberedTxn
) -> _Planned | None:
    """``req`` decided on the remembered rows, nothing sent; None where the lock's way
    must decide it."""
    end = req.end
    meta = memory.leased.meta
    assert meta is not None
    if not req.batches:
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
    assert work.transitions is not None
    work.transitions.flush(conn, writes)
    calls = [prepared_call(conn, statement, params) for statement, params in writes.take()]
    return _Planned(decided, left, hints, calls, work.copies, locks.rows, checked)


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
) -> ProduceBatchesResponse | None:
    """The planned request as one query string, if the rows are still as remembered."""
    touched = sorted(planned.hints)
    reads = [txn_version_query(conn, tid), lock_versions_query(conn, touched)]
    if planned.others is not None:  # after the locks: every other producer's write is in
        producer_id = memory.leased.meta.producer_id if memory.leased.meta else -1
        reads.append(others_first_open_query(conn, touched, producer_id))
    statements = [*reads, *planned.writes, written_version_query(conn, tid)]
    expected = {tp: hint.version for tp, hint in planned.hints.items()}
    with QueryCopies(
        conn, log_sql.COPY_RECORDS, len(planned.copies), committed=True, statements=statements
    ) as query:
        txn, partitions = query.results[:2]
        if not (txn_matches(txn, memory) and versions_match(partitions, expected)):
            query.refuse("a row moved since this process wrote it")
            _forget(conn, tid, touched)
            return None
        if planned.others is not None and not others_match(query.results[2], planned.others):
            query.refuse("another producer's transaction opened behind this one")
            return None
        query.write(planned.copies)
        ends = planned.decided.response.end is not None
        # every COPY's data given, the last not ended
        crash_point("commit.in_one_query" if ends else "register.in_one_query")
    xmin = query.results[-1].get_value(0, 0)
    assert xmin is not None
    before = {tp: hint.row for tp, hint in planned.hints.items()}
    remember_commit(
        conn,
        xmin.decode(),
        Remembering(planned.left, memory.leased.coordinator_epoch, before, planned.after),
    )
    return planned.decided.response


def _forget(conn: Connection, transactional_id: str, partitions: list[TopicPartitionKey]) -> None:
    forget_txn(conn, transactional_id)
    for tp in partitions:
        forget(conn, tp)
