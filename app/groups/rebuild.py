"""Rebuild ``group_offsets`` and ``pending_txn_offsets`` from ``offset_commit_log``.

The fold: a plain commit sets the offset; a transactional commit is pending for its
producer until that producer's txn_commit (set) or txn_abort (drop) event; a delete (its
topic was deleted) drops the offset and every producer's pending one; an offset_delete
(an admin's OffsetDelete or DeleteGroups) drops the committed offset only.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from app.groups import sql
from app.settings import BrokerSettings

_LIVE = {
    "group_offsets": sql.LIVE_GROUP_OFFSETS,
    "pending_txn_offsets": sql.LIVE_PENDING_TXN_OFFSETS,
}


def compute_group_offsets(conn: Connection) -> dict[str, list[tuple[Any, ...]]]:
    committed: dict[tuple[str, str, int], tuple[Any, ...]] = {}
    pending: dict[tuple[str, str, int, int], tuple[Any, ...]] = {}
    for e in conn.execute(sql.OFFSET_EVENTS):
        key = (e.group_id, e.topic, e.partition)
        if e.kind == "commit":
            committed[key] = (*key, e.committed_offset, e.metadata, e.commit_ms, _epoch(e))
        elif e.kind == "txn_pending":
            pending[(*key, e.producer_id)] = (
                *key,
                e.producer_id,
                e.producer_epoch,
                e.committed_offset,
                e.metadata,
                e.commit_ms,
                _epoch(e),
            )
        elif e.kind == "txn_commit":
            committed[key] = (*key, e.committed_offset, e.metadata, e.commit_ms, _epoch(e))
            pending.pop((*key, e.producer_id), None)
        elif e.kind == "txn_abort":
            pending.pop((*key, e.producer_id), None)
        elif e.kind == "offset_delete":  # an admin's OffsetDelete or DeleteGroups
            committed.pop(key, None)
        elif e.kind == "delete":
            committed.pop(key, None)
            for stale in [k for k in pending if k[:3] == key]:
                del pending[stale]
    return {
        "group_offsets": sorted(committed.values()),
        "pending_txn_offsets": sorted(pending.values()),
    }


def _epoch(event: Any) -> int:
    """The leader epoch an event committed (events logged before it was kept have none)."""
    epoch = event.committed_leader_epoch
    return -1 if epoch is None else int(epoch)


def live_group_offsets(conn: Connection) -> dict[str, list[tuple[Any, ...]]]:
    return {name: sorted(tuple(r) for r in conn.execute(q)) for name, q in _LIVE.items()}


def rebuild_group_offsets(
    conn: Connection, now_ms: int, settings: BrokerSettings
) -> dict[str, int]:
    conn.execute(sql.LOCK_OFFSET_PROJECTIONS)
    rows = compute_group_offsets(conn)
    conn.execute(sql.CLEAR_GROUP_OFFSETS)
    conn.execute(sql.CLEAR_PENDING_TXN_OFFSETS)
    if rows["group_offsets"]:
        conn.execute(
            sql.INSERT_GROUP_OFFSET,
            [
                dict(zip(("g", "t", "p", "o", "m", "ts", "e"), r, strict=True))
                for r in rows["group_offsets"]
            ],
        )
    if rows["pending_txn_offsets"]:
        conn.execute(
            sql.INSERT_PENDING_TXN_OFFSET,
            [
                dict(zip(("g", "t", "p", "pid", "ep", "o", "m", "ts", "e"), r, strict=True))
                for r in rows["pending_txn_offsets"]
            ],
        )
    return {name: len(v) for name, v in rows.items()}
