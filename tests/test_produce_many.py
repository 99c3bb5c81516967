"""Batches for several partitions in one request (one DB transaction): each is decided and
answered on its own, exactly as separate requests would be, and the producer sends the
batches it has ready together."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event, text

from app.broker import Broker
from app.client import Producer
from app.errors import KafkaError
from app.log.append import produce, produce_many
from app.log.topics import create_topic
from app.protocol import ProduceRequest, RecordIn
from tests.txn_driver import TxnDriver, read_values


@pytest.fixture
def broker(db_url: str) -> Broker:
    b = Broker.connect(db_url)
    create_topic(b, "t", 3)
    return b


def batch(partition: int, seq: int, *values: str, pid: int = 7, topic: str = "t") -> ProduceRequest:
    records = [RecordIn(None, v.encode(), 0) for v in values]
    return ProduceRequest(topic, partition, records, producer_id=pid, producer_epoch=0,
                          base_sequence=seq)  # fmt: skip


def stored(broker: Broker) -> list[tuple[int, int, bytes]]:
    with broker.engine.connect() as conn:
        rows = conn.execute(text('SELECT partition, "offset", value FROM records ORDER BY 1, 2'))
        return [(r[0], r[1], bytes(r[2])) for r in rows]


def test_each_batch_is_answered_on_its_own(broker: Broker) -> None:
    assert produce(broker, batch(1, 0, "first")).error_code == 0
    responses = produce_many(
        broker,
        [
            batch(2, 0, "a", "b"),
            batch(1, 5, "gap"),  # out of order: refused, writes nothing
            batch(0, 0, "c"),
            batch(9, 0, "nowhere"),  # no such partition
            ProduceRequest("t", 0, []),  # malformed: refused before the database
        ],
    )
    assert [r.error_code for r in responses] == [
        0,
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
        0,
        KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
        KafkaError.INVALID_RECORD,
    ]
    assert (responses[0].base_offset, responses[2].base_offset) == (0, 0)
    assert stored(broker) == [(0, 0, b"c"), (1, 0, b"first"), (2, 0, b"a"), (2, 1, b"b")]
    # A retry of the whole request: the written batches are duplicates with their offsets.
    again = produce_many(broker, [batch(2, 0, "a", "b"), batch(0, 0, "c")])
    assert [(r.error_code, r.base_offset, r.duplicate) for r in again] == [
        (0, 0, True),
        (0, 0, True),
    ]
    assert len(stored(broker)) == 4


def test_transactional_batches_are_checked_each(broker: Broker) -> None:
    d = TxnDriver(broker, "many")
    assert d.init() == 0
    assert d.add(("t", 0)) == 0

    def txn_batch(partition: int, value: str) -> ProduceRequest:
        return ProduceRequest(
            "t", partition, [RecordIn(None, value.encode(), 0)], producer_id=d.producer_id,
            producer_epoch=d.producer_epoch, base_sequence=0, transactional_id="many",
            is_transactional=True,
        )  # fmt: skip

    responses = produce_many(broker, [txn_batch(1, "unregistered"), txn_batch(0, "ok")])
    assert [r.error_code for r in responses] == [KafkaError.INVALID_TXN_STATE, 0]
    d.sequences[("t", 0)] = 1
    assert d.end(commit=True) == 0
    assert read_values(broker, "t", 0) == ["ok"]
    assert read_values(broker, "t", 1, committed=False) == []


def test_ready_batches_of_several_partitions_share_one_commit(db_url: str, broker: Broker) -> None:
    reports: list[Any] = []
    producer = Producer({"database.url": db_url, "linger.ms": 60_000})
    try:
        commits = 0

        def count(*_: Any) -> None:
            nonlocal commits
            commits += 1

        event.listen(producer.broker.engine, "commit", count)
        for i in range(9):
            producer.produce(
                "t", str(i), partition=i % 3, on_delivery=lambda e, m: reports.append(e)
            )
        assert producer.flush(30) == 0
        assert commits == 1
    finally:
        producer.close()
    assert reports == [None] * 9
    assert [(p, o) for p, o, _ in stored(broker)] == [(p, o) for p in range(3) for o in range(3)]
