"""What kafka-transactions.sh shows about transactional ids: list and describe."""

from __future__ import annotations

from sqlalchemy import Connection

from app.coordinator import sql
from app.protocol import TransactionDescription
from app.storage.context import BrokerContext

__all__ = ["TransactionDescription", "list_transactions"]


def list_transactions(
    broker: BrokerContext, states: list[str] | None = None, ids: list[str] | None = None
) -> list[TransactionDescription]:
    with broker.engine.connect() as conn:
        rows = conn.execute(sql.LIST_TRANSACTIONS, {"states": states, "ids": ids}).all()
    return [
        TransactionDescription(
            r.transactional_id,
            r.producer_id,
            r.producer_epoch,
            r.state,
            tuple((t, p) for t, p in r.partitions),
            r.timeout_ms,
            r.txn_start_ms,
            r.updated_ms,
            r.coordinator_epoch,
        )
        for r in rows
    ]


def ongoing_under_prefix(conn: Connection, prefix: str) -> list[str]:
    """The transactional ids starting with ``prefix`` whose transaction is ongoing (BEGIN),
    in the order their rows are locked in (a Python sort's)."""
    return [r.transactional_id for r in conn.execute(sql.OPEN_UNDER_PREFIX, {"prefix": prefix})]
