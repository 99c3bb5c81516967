"""What kafka-transactions.sh shows about transactional ids: list and describe."""

from __future__ import annotations

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
