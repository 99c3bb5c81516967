"""InitProducerId: hand out a producer identity.

Without a transactional id, a fresh producer id with epoch 0 (an idempotent producer).
With one, the transaction coordinator's path (``app.coordinator.handlers``).
"""

from __future__ import annotations

from app.errors import KafkaError
from app.log.producer_ids import allocate_producer_id
from app.protocol import InitProducerIdRequest, InitProducerIdResponse
from app.storage.context import BrokerContext
from app.storage.engine import retry_conflicts


@retry_conflicts
def init_producer_id(broker: BrokerContext, req: InitProducerIdRequest) -> InitProducerIdResponse:
    if req.transactional_id is not None:
        from app.coordinator.handlers import init_transactional_producer_id

        return init_transactional_producer_id(broker, req)
    with broker.engine.begin() as conn:
        producer_id = allocate_producer_id(conn, None, broker.clock.now_ms())
    return InitProducerIdResponse(KafkaError.NO_ERROR, producer_id, 0)
