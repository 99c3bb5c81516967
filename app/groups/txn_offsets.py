"""Transactional offsets at the end of a transaction: applied on COMMIT, dropped on ABORT
(docs/design.md rule 9). Runs inside the coordinator's completion DB transaction, so the
offsets become visible exactly when the markers do."""

from __future__ import annotations

from sqlalchemy import Connection

from app.groups import sql


def complete_pending_offsets(conn: Connection, producer_id: int, commit: bool, now_ms: int) -> None:
    params = {"producer_id": producer_id, "now": now_ms}
    if commit:
        # The projection's rows first, so a plain commit of the same offset running
        # meanwhile is ordered against this one by them, its event with them (``offsets``).
        conn.execute(sql.APPLY_PENDING, params)
    conn.execute(
        sql.LOG_PENDING_OUTCOME, {**params, "kind": "txn_commit" if commit else "txn_abort"}
    )
    conn.execute(sql.DROP_PENDING, params)
