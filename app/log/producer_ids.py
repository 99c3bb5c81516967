"""Producer id allocation: an append-only table, so an id is never handed out twice."""

from __future__ import annotations

from sqlalchemy import Connection

from app.log import sql


def allocate_producer_id(conn: Connection, transactional_id: str | None, now_ms: int) -> int:
    """A fresh producer id; identity values are never reused, even after a rollback."""
    return int(
        conn.execute(
            sql.ALLOCATE_PRODUCER_ID, {"transactional_id": transactional_id, "now": now_ms}
        ).scalar_one()
    )
