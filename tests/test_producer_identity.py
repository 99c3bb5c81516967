"""A partition accepts an idempotent batch only under an identity the coordinator handed
out: an allocated producer id and, for a transactional id's producer id, an epoch no higher
than the one it was given (an idempotent producer's id may raise its own epoch).

Without this, a client with Write on a topic could stamp its batches with someone else's
producer id and a higher epoch, and every marker of that producer's transaction on the
partition would then be refused as stale: its coordinator could never abort it.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

from app.broker import Broker
from app.broker.loop import CoordinatorLoop
from app.broker.produce import produce
from app.clock import ManualClock
from app.coordinator import machines as m
from app.coordinator.producer_id import init_producer_id
from app.errors import KafkaError
from app.metrics import gather
from app.protocol import InitProducerIdRequest, ProduceRequest
from tests.helpers.batches import produce_batch
from tests.helpers.txn_driver import (
    TxnDriver,
    partition_offsets,
    produce_many,
    read_values,
    state_of,
)

pytestmark = pytest.mark.broker(topics={"p": 3}, manual_clock=True, transaction_log_partitions=1)


def forged(pid: int, epoch: int, partition: int = 0, seq: int = 0) -> ProduceRequest:
    """An idempotent (not transactional) batch: no transactional id for the broker to check."""
    return produce_batch(
        "forged", topic="p", partition=partition, producer_id=pid, epoch=epoch, sequence=seq
    )


def idempotent_producer_id(broker: Broker) -> int:
    return init_producer_id(broker, InitProducerIdRequest(None, 60_000)).producer_id


@pytest.mark.parametrize("ahead", [1, 5])
@pytest.mark.parametrize("open_on_p", [True, False], ids=["open-on-P", "registered-only"])
def test_a_batch_above_the_victims_epoch_is_refused(
    broker: Broker, clock: ManualClock, ahead: int, open_on_p: bool
) -> None:
    victim = TxnDriver(broker, "victim", timeout_ms=1_000)
    assert victim.init() == 0
    victim.send("p", 0, "earlier")  # the victim's state on P, then a new transaction
    assert victim.end() == 0
    if open_on_p:
        victim.send("p", 0, "open")
    else:
        assert victim.add(("p", 0)) == 0  # its first batch to P still in flight
        victim.send("p", 1, "open")
    before = partition_offsets(broker, "p", 0)

    r = produce(broker, forged(victim.producer_id, victim.producer_epoch + ahead))
    assert r.error_code == KafkaError.UNKNOWN_PRODUCER_ID, r
    assert partition_offsets(broker, "p", 0) == before, "nothing written"

    # The victim's transaction can still be timed out and aborted by its coordinator.
    clock.advance(1_001)
    loop = CoordinatorLoop(broker)
    assert loop.run_once().timed_out == 1
    assert state_of(broker, "victim") == m.COMPLETE_ABORT
    assert read_values(broker, "p", 0) == ["earlier"]
    assert sum(gather(broker.engine).coordinator_item_failures.values()) == 0


def test_a_producer_id_never_allocated_is_refused(broker: Broker) -> None:
    r = produce(broker, forged(987_654, 0))
    assert r.error_code == KafkaError.UNKNOWN_PRODUCER_ID
    assert partition_offsets(broker, "p", 0) == (0, 0)


def test_an_idempotent_producer_may_raise_its_own_epoch(broker: Broker) -> None:
    """librdkafka's idempotent producer bumps its epoch itself after a batch whose outcome
    it cannot know, and starts its sequences again at 0; Kafka takes it, and so must we.
    Its id is its alone, so no one else's state is at stake; an older epoch stays fenced."""
    pid = idempotent_producer_id(broker)
    assert produce(broker, forged(pid, 0)).error_code == 0
    assert produce(broker, forged(pid, 0, seq=1)).error_code == 0
    bumped = produce(broker, forged(pid, 1, seq=5))
    assert bumped.error_code == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER  # a new epoch starts at 0
    assert produce(broker, forged(pid, 1)).error_code == 0
    assert produce(broker, forged(pid, 0, seq=2)).error_code == KafkaError.INVALID_PRODUCER_EPOCH
    assert produce(broker, forged(pid, 3, partition=1)).error_code == 0  # first seen bumped
    assert partition_offsets(broker, "p", 0) == (3, 3)


def test_an_identity_the_partition_knows_is_not_looked_up_again(broker: Broker) -> None:
    pid = idempotent_producer_id(broker)
    assert produce(broker, forged(pid, 0)).error_code == 0
    with broker.engine.begin() as conn:  # were it looked up again, it would now be unknown
        conn.execute(text("DELETE FROM producer_ids WHERE producer_id = :pid"), {"pid": pid})
    assert produce(broker, forged(pid, 0, seq=1)).error_code == 0
    assert produce(broker, forged(pid, 0, partition=1)).error_code == KafkaError.UNKNOWN_PRODUCER_ID


def test_a_transactional_producer_id_is_bounded_by_its_current_epoch(broker: Broker) -> None:
    d = TxnDriver(broker, "tx")
    assert d.init() == 0 and d.init() == 0  # the second InitProducerId bumps the epoch
    assert d.producer_epoch == 1
    late = produce(broker, forged(d.producer_id, 2))
    assert late.error_code == KafkaError.UNKNOWN_PRODUCER_ID
    assert produce(broker, forged(d.producer_id, 1)).error_code == 0


def test_one_request_checks_each_batch(broker: Broker) -> None:
    pid = idempotent_producer_id(broker)
    d = TxnDriver(broker, "tx")
    assert d.init() == 0
    responses = produce_many(
        broker,
        [
            forged(pid, 0, partition=0),
            forged(pid + 1000, 0, partition=1),
            forged(d.producer_id, 3, partition=2),
        ],
    )
    assert [r.error_code for r in responses] == [
        0,
        KafkaError.UNKNOWN_PRODUCER_ID,
        KafkaError.UNKNOWN_PRODUCER_ID,
    ]
    offsets = [partition_offsets(broker, "p", partition) for partition in range(3)]
    assert offsets == [(1, 1), (0, 0), (0, 0)]
