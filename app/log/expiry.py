"""Producer-state expiration (KIP-98 "PID Expiration"): forget idle producers, never one
with a transaction open on the partition."""

from __future__ import annotations

from app.log import sql
from app.storage.context import BrokerContext
from app.storage.engine import retry_conflicts


@retry_conflicts
def expire_producer_states(broker: BrokerContext, now_ms: int | None = None) -> int:
    """Delete state idle for producer.id.expiration.ms; returns how many entries went.

    The append path already treats such entries as absent (see ``append``), so when this
    runs changes nothing a producer can observe; it only reclaims space.
    """
    now = broker.clock.now_ms() if now_ms is None else now_ms
    cutoff = now - broker.settings.producer_id_expiration_ms
    with broker.engine.begin() as conn:
        return conn.execute(sql.EXPIRE_PRODUCERS, {"cutoff": cutoff}).rowcount
