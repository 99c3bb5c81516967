"""Load transaction metadata under its row lock, and persist transitions as events.

Persist, then publish (docs/design.md rule 1): a transition exists once its event row and the
projection update commit together; nothing in memory is trusted across requests.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NamedTuple

from psycopg import pq
from psycopg.rows import namedtuple_row
from sqlalchemy import Connection

from app.coordinator import sql
from app.coordinator.machines import DEAD
from app.coordinator.metadata import TxnMetadata
from app.storage.driver import WriteBehind, driver_connection, driver_sql
from app.storage.memory import EngineMemory
from app.storage.one_query import prepared_call


def metadata_from_row(row: Any, txn_partition: int | None = None) -> TxnMetadata:
    return TxnMetadata(
        transactional_id=row.transactional_id,
        producer_id=row.producer_id,
        producer_epoch=row.producer_epoch,
        last_producer_id=row.last_producer_id,
        last_producer_epoch=row.last_producer_epoch,
        state=row.state,
        partitions=tuple((t, p) for t, p in row.partitions),
        has_offsets=row.has_offsets,
        timeout_ms=row.timeout_ms,
        txn_start_ms=row.txn_start_ms,
        updated_ms=row.updated_ms,
        coordinator_epoch=row.coordinator_epoch,
        txn_partition=row.txn_partition if txn_partition is None else txn_partition,
    )


def load_for_update(conn: Connection, transactional_id: str) -> TxnMetadata | None:
    row = conn.execute(sql.LOAD_FOR_UPDATE, {"tid": transactional_id}).first()
    return None if row is None else metadata_from_row(row)


class Leased(NamedTuple):
    """A transaction's metadata (None if unknown) and the lease epoch of its coordinator,
    read together with both rows locked: what an EndTxn is decided on and its markers are
    stamped with."""

    meta: TxnMetadata | None
    coordinator_epoch: int


def load_with_lease(conn: Connection, transactional_id: str) -> Leased:
    """``load_for_update`` and ``handlers.coordinator_epoch`` of its partition, in one round
    trip: the metadata (None if unknown) and the lease epoch, both rows locked. On the
    driver connection: every EndTxn and combined commit starts here."""
    statement = driver_sql(sql.LOAD_FOR_UPDATE_WITH_LEASE)
    with driver_connection(conn).cursor(row_factory=namedtuple_row) as cur:
        row = cur.execute(statement, {"tid": transactional_id}).fetchone()
    if row is None:
        return Leased(None, 0)
    return Leased(metadata_from_row(row), int(row.lease_epoch))  # type: ignore[attr-defined]


class RememberedTxn(NamedTuple):
    """A transactional id's row as this process last wrote or read it: its version
    (``xmin``) and what it holds with its lease's epoch, as ``load_with_lease`` would read
    them."""

    xmin: str
    leased: Leased


# The transactional ids' rows as this process's last commit, registration or
# transactional produce of them left or read them (docs/design.md §3.11, §3.12), a hint
# the next commit or produce may decide on; its first statement checks the row is still
# that. Every transition this process persists forgets its id's entry (the request
# remembers the row again once committed): nothing is decided on a row the process has
# moved without knowing its new version.
_remembered: EngineMemory[str, RememberedTxn] = EngineMemory()


def remembered_txn(conn: Connection, transactional_id: str) -> RememberedTxn | None:
    return _remembered.get(conn, transactional_id)


def remember_txn(conn: Connection, xmin: str, leased: Leased) -> None:
    """The row of ``leased``'s id as this DB transaction, committed, has just left it."""
    assert leased.meta is not None
    _remembered.put(conn, leased.meta.transactional_id, RememberedTxn(xmin, leased))


def forget_txn(conn: Connection, transactional_id: str) -> None:
    _remembered.drop(conn, transactional_id)


def versioned(row: Any) -> RememberedTxn:
    """A row read with its ``version`` and ``lease_epoch`` (``sql.LOAD_FOR_SHARE``), as the
    process would remember it."""
    return RememberedTxn(row.version, Leased(metadata_from_row(row), int(row.lease_epoch)))


def share_version_query(conn: Connection, transactional_id: str) -> bytes:
    """TXN_VERSION_FOR_SHARE as a statement of a query string: takes the id's row as a
    transactional produce does (§3.4), for ``version_matches``."""
    return prepared_call(conn, sql.TXN_VERSION_FOR_SHARE, {"tid": transactional_id})


def version_matches(result: pq.abc.PGresult, memory: RememberedTxn) -> bool:
    """Whether ``share_version_query`` found the row still as ``memory`` has it."""
    return result.ntuples == 1 and result.get_value(0, 0) == memory.xmin.encode()


def txn_version_query(conn: Connection, transactional_id: str) -> bytes:
    """TXN_VERSION_WITH_LEASE, as a statement of a query string (``storage.one_query``):
    locks the id's row and its lease's as ``load_with_lease`` does, for ``txn_matches``."""
    return prepared_call(conn, sql.TXN_VERSION_WITH_LEASE, {"tid": transactional_id})


def txn_matches(result: pq.abc.PGresult, memory: RememberedTxn) -> bool:
    """Whether ``txn_version_query`` found the row still as ``memory`` has it."""
    if result.ntuples != 1:
        return False
    xmin, lease_epoch = result.get_value(0, 0), result.get_value(0, 1)
    assert xmin is not None and lease_epoch is not None
    return (xmin.decode(), int(lease_epoch)) == (memory.xmin, memory.leased.coordinator_epoch)


def written_version_query(conn: Connection, transactional_id: str) -> bytes:
    """TXN_VERSION as a statement of a query string that writes the row: its result's
    only value is the version the row is left at."""
    return prepared_call(conn, sql.TXN_VERSION, {"tid": transactional_id})


def txn_lease_read(transactional_id: str) -> tuple[str, dict[str, Any]]:
    """TXN_VERSION_AND_LEASE as a read to run after a DB transaction's queued writes
    (``WriteBehind.send_reading``): the version they leave the row at, and its lease's
    epoch."""
    return driver_sql(sql.TXN_VERSION_AND_LEASE), {"tid": transactional_id}


def txn_version_read(transactional_id: str) -> tuple[str, dict[str, Any]]:
    """TXN_VERSION as a read to run after a DB transaction's queued writes
    (``WriteBehind.send``): its row's only value is the version they leave the row at."""
    return sql.TXN_VERSION, {"tid": transactional_id}


def txn_version(conn: Connection, transactional_id: str) -> str:
    """The row's version as this DB transaction, which has written it, leaves it."""
    with driver_connection(conn).cursor() as cur:
        row = cur.execute(sql.TXN_VERSION, {"tid": transactional_id}).fetchone()
    assert row is not None
    return str(row[0])


def _params(meta: TxnMetadata) -> dict[str, Any]:
    return {
        "transactional_id": meta.transactional_id,
        "producer_id": meta.producer_id,
        "producer_epoch": meta.producer_epoch,
        "last_producer_id": meta.last_producer_id,
        "last_producer_epoch": meta.last_producer_epoch,
        "state": meta.state,
        "partitions": json.dumps([list(tp) for tp in meta.partitions]),
        "has_offsets": meta.has_offsets,
        "timeout_ms": meta.timeout_ms,
        "txn_start_ms": meta.txn_start_ms,
        "updated_ms": meta.updated_ms,
        "coordinator_epoch": meta.coordinator_epoch,
        "txn_partition": meta.txn_partition,
    }


def persist(conn: Connection, meta: TxnMetadata, reason: str) -> TxnMetadata:
    """Append one event for this transition and bring the projection to it (one statement)."""
    statement = sql.APPEND_EVENT_AND_FORGET if meta.state == DEAD else sql.APPEND_EVENT_AND_PROJECT
    forget_txn(conn, meta.transactional_id)  # the row moves from what a commit left
    conn.execute(statement, {**_params(meta), "reason": reason})
    return meta


def claim(conn: Connection, meta: TxnMetadata, reason: str) -> bool:
    """Persist the first transition of an id that has no row, as ``persist`` would, if the
    row is still absent; False (nothing written) if another request created it first, whose
    row ``load_for_update`` then waits for and locks. A row read as absent is not locked:
    only this insert-if-absent makes two first InitProducerIds take turns."""
    forget_txn(conn, meta.transactional_id)
    return conn.execute(sql.CLAIM_NEW_ID, {**_params(meta), "reason": reason}).first() is not None


# ``persist`` or ``TransitionBatch.persist``: how a handler writes a transition.
Persist = Callable[[Connection, TxnMetadata, str], TxnMetadata]


class TransitionBatch:
    """Transitions of one id made in one DB transaction, written together before it
    commits (``flush``): each still its own event, in order, and the projection at the
    last; one statement rather than one per transition. Until the flush nothing reads them
    back from the tables: the caller works on the metadata it holds, its row locked FOR
    UPDATE."""

    def __init__(self) -> None:
        self._pending: list[tuple[TxnMetadata, str]] = []

    def persist(self, conn: Connection, meta: TxnMetadata, reason: str) -> TxnMetadata:
        if meta.state == DEAD:
            raise ValueError("a DEAD transition is persisted on its own")
        self._pending.append((meta, reason))
        return meta

    def flush(self, conn: Connection, writes: WriteBehind | None = None) -> None:
        """Write the pending transitions, or queue their statement on ``writes``."""
        if not self._pending:
            return
        events = [{**_params(meta), "reason": reason} for meta, reason in self._pending]
        for meta, _ in self._pending:
            forget_txn(conn, meta.transactional_id)  # the row moves from what a commit left
        self._pending.clear()
        if len(events) == 1:
            statement, params = sql.APPEND_EVENT_AND_PROJECT, events[0]
        else:
            arrays = {f"e_{key}": [e[key] for e in events] for key in events[0]}
            statement, params = sql.APPEND_EVENTS_AND_PROJECT, {**events[-1], **arrays}
        if writes is None:
            conn.execute(statement, params)
        else:
            writes.add(driver_sql(statement), params)
