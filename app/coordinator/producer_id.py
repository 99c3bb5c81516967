"""InitProducerId: hand out a producer identity.

Without a transactional id, a fresh producer id with epoch 0 (an idempotent producer).
With one, the transaction coordinator's path (``app.coordinator.handlers``).
"""

from __future__ import annotations

from app.coordinator.handlers import init_transactional_producer_id
from app.errors import KafkaError
from app.log.producer_ids import allocate_producer_id
from app.protocol import InitProducerIdRequest, InitProducerIdResponse
from app.storage.context import BrokerContext
from app.storage.engine import retry_conflicts


def init_producer_id(broker: BrokerContext, req: InitProducerIdRequest) -> InitProducerIdResponse:
    """One retry loop per path (conflicts re-run only the DB transaction that met them);
    the client's own retries are the only ones above it."""
    if req.transactional_id is not None:
        return init_transactional_producer_id(broker, req)
    return InitProducerIdResponse(KafkaError.NO_ERROR, _allocate(broker), 0)


@retry_conflicts
def _allocate(broker: BrokerContext) -> int:
    with broker.engine.begin() as conn:
        return allocate_producer_id(conn, None, broker.clock.now_ms())
