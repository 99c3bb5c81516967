"""Transactional offsets at the end of a transaction: applied on COMMIT, dropped on ABORT
(docs/design.md rule 9). Runs inside the coordinator's completion DB transaction, so the
offsets become visible exactly when the markers do."""

from __future__ import annotations

from sqlalchemy import Connection

from app.groups import sql
from app.storage.driver import WriteBehind, driver_sql, execute_or_queue


def complete_pending_offsets(
    conn: Connection,
    producer_id: int,
    commit: bool,
    now_ms: int,
    writes: WriteBehind | None = None,
) -> None:
    """The producer's pending offsets applied (``commit``) or dropped, each with its
    outcome's event. Nothing here is read back, so a completion whose other last writes
    are queued (the markers: ``writes``) queues these after them, to be sent in the same
    round trip or query string (docs/design.md §3.11); they read the pending offsets when
    they run, under the id's row lock every TxnOffsetCommit of the transaction took."""
    kind = "txn_commit" if commit else "txn_abort"
    params = {"producer_id": producer_id, "now": now_ms, "kind": kind}
    statements = [sql.APPLY_PENDING] if commit else []
    # The projection's rows first, so a plain commit of the same offset running meanwhile
    # is ordered against this one by them, its event with them (``offsets``).
    statements += [sql.LOG_PENDING_OUTCOME, sql.DROP_PENDING]
    for statement in statements:
        execute_or_queue(conn, writes, driver_sql(statement), params)
