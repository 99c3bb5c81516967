"""Producer identities for tests that drive a partition's rules directly.

A partition takes an idempotent batch only under an identity InitProducerId handed out
(``app.log.producer_ids.check_issued``), so such tests first get theirs handed out.
"""

from __future__ import annotations

from sqlalchemy import text

from app.broker import Broker
from app.coordinator.producer_id import init_producer_id
from app.protocol import InitProducerIdRequest


def hand_out(broker: Broker, *producer_ids: int) -> None:
    """Record fixed ``producer_ids`` as allocated to idempotent producers (epoch 0), as
    InitProducerId would have, so a test can keep the numbers it chose."""
    with broker.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO producer_ids (producer_id, allocated_ms) OVERRIDING SYSTEM VALUE "
                "SELECT unnest(CAST(:ids AS bigint[])), 0 ON CONFLICT DO NOTHING"
            ),
            {"ids": list(producer_ids)},
        )


def init_transactional(broker: Broker, transactional_id: str) -> tuple[int, int]:
    """InitProducerId under ``transactional_id``: a new identity the first time, the same
    producer id with its epoch bumped after that."""
    r = init_producer_id(broker, InitProducerIdRequest(transactional_id, 60_000))
    assert r.error_code == 0, r
    return r.producer_id, r.producer_epoch


def identity_at_epoch(broker: Broker, transactional_id: str, epoch: int) -> tuple[int, int]:
    """(producer_id, ``epoch``) as the coordinator hands it out: InitProducerId under a
    new ``transactional_id``, once per epoch."""
    for _ in range(epoch + 1):
        identity = init_transactional(broker, transactional_id)
    assert identity[1] == epoch
    return identity
