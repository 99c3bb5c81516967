"""Rebuild ``transactions`` from ``transaction_log``, checking the log as it folds.

The projection is the last event of each transactional id (none once it is DEAD). On the
way, every consecutive pair of events must be a transition the status machine allows,
so a corrupt or hand-edited log is reported instead of silently projected.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection

from app.coordinator import machines as m
from app.coordinator import sql
from app.coordinator.metadata import txn_partition_for
from app.settings import BrokerSettings

_ALLOWED: frozenset[tuple[str, str]] = frozenset(
    (src, dest)
    for _, sources, dest in m.TXN_TRANSITIONS
    for src in ([sources] if isinstance(sources, str) else sources)
)


class CorruptTransactionLog(Exception):
    """The transaction log holds a transition the state machine does not allow."""


def check_event_sequence(transactional_id: str, states: list[str]) -> None:
    previous: str | None = None
    for state in states:
        fresh_start = previous in (None, m.DEAD) and state == m.EMPTY
        if not fresh_start and (previous is None or (previous, state) not in _ALLOWED):
            raise CorruptTransactionLog(
                f"{transactional_id}: {previous} -> {state} is not a valid transition"
            )
        previous = state


def compute_transactions(conn: Connection, settings: BrokerSettings) -> list[tuple[Any, ...]]:
    history: dict[str, list[str]] = {}
    for row in conn.execute(sql.ALL_EVENTS):
        history.setdefault(row.transactional_id, []).append(row.state)
    for tid, states in history.items():
        check_event_sequence(tid, states)
    rows = []
    for r in conn.execute(sql.LAST_EVENTS):
        if r.state == m.DEAD:
            continue
        tp = txn_partition_for(r.transactional_id, settings.transaction_log_partitions)
        rows.append((*tuple(r)[:-1], tp, r.event_id))
    return sorted(rows)


def live_transactions(conn: Connection) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in conn.execute(sql.LIVE_PROJECTION))


def rebuild_transactions(conn: Connection, now_ms: int, settings: BrokerSettings) -> dict[str, int]:
    rows = compute_transactions(conn, settings)
    conn.execute(sql.LOCK_TRANSACTIONS)
    conn.execute(sql.CLEAR_TRANSACTIONS)
    columns = sql.REBUILT_TXN_COLUMNS
    if rows:
        conn.execute(
            sql.INSERT_REBUILT_TRANSACTION,
            [
                {
                    c: (json.dumps(v) if c == "partitions" else v)
                    for c, v in zip(columns, r, strict=True)
                }
                for r in rows
            ],
        )
    return {"transactions": len(rows)}
