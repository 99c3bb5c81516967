"""What kafka-transactions.sh shows about transactional ids: list and describe."""

from __future__ import annotations

from sqlalchemy import text

from app.protocol import TransactionDescription
from app.storage.context import BrokerContext

__all__ = ["TransactionDescription", "list_transactions"]

_LIST = text(
    "SELECT transactional_id, producer_id, producer_epoch, state, partitions, timeout_ms, "
    "txn_start_ms, updated_ms, coordinator_epoch FROM transactions "
    "WHERE (CAST(:states AS text[]) IS NULL OR state = ANY(CAST(:states AS text[]))) "
    "AND (CAST(:ids AS text[]) IS NULL OR transactional_id = ANY(CAST(:ids AS text[]))) "
    "ORDER BY transactional_id"
)


def list_transactions(
    broker: BrokerContext, states: list[str] | None = None, ids: list[str] | None = None
) -> list[TransactionDescription]:
    with broker.engine.connect() as conn:
        rows = conn.execute(_LIST, {"states": states, "ids": ids}).all()
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
