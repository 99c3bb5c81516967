"""Kafka's acks for plain producers: acks=1 and acks=0 relax the durability of the
request's commit (PostgreSQL's synchronous_commit local and off), acks=all keeps it; a
batch with a producer id needs acks=all, and a bad value is refused with nothing written."""

from __future__ import annotations

import time
from typing import Any

import confluent_kafka as ck
import pytest
from sqlalchemy import event

from app.broker import Broker
from app.client import Producer
from app.errors import KafkaError
from app.protocol import ProduceBatchesRequest
from tests.helpers.batches import produce_batch
from tests.helpers.txn_driver import read_values
from tests.helpers.wire_client import delivered

pytestmark = pytest.mark.broker(topics={"t": 1})


def _statements(broker: Broker) -> list[str]:
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    event.listen(broker.engine, "before_cursor_execute", record)
    return seen


@pytest.mark.parametrize(("acks", "setting"), [(-1, None), (1, "'local'"), (0, "'off'")])
def test_weaker_acks_relax_only_the_commit_s_durability(
    broker: Broker, acks: int, setting: str | None
) -> None:
    seen = _statements(broker)
    answer = broker.handle(ProduceBatchesRequest([produce_batch("v")], acks=acks))
    assert answer.batches[0].error_code == 0
    relaxed = [s for s in seen if s.startswith("SET LOCAL synchronous_commit")]
    assert relaxed == ([] if setting is None else [f"SET LOCAL synchronous_commit TO {setting}"])
    assert read_values(broker, "t", 0) == ["v"]


def test_a_batch_with_a_producer_id_needs_acks_all_and_a_bad_value_is_refused(
    broker: Broker,
) -> None:
    for request in (
        ProduceBatchesRequest(
            [produce_batch("plain"), produce_batch("idempotent", producer_id=0)], acks=1
        ),
        ProduceBatchesRequest([produce_batch("plain")], acks=2),
    ):
        answers = broker.handle(request).batches
        assert {a.error_code for a in answers} == {KafkaError.INVALID_REQUIRED_ACKS}
    assert read_values(broker, "t", 0) == []  # nothing of either request


def test_the_producer_sends_its_acks(broker: Broker, db_url: str) -> None:
    producer = Producer({"database.url": db_url, "enable.idempotence": False, "acks": "1"})
    sent: list[int] = []
    transport = producer.sender.transport

    def spy(request: ProduceBatchesRequest) -> Any:
        sent.append(request.acks)
        return transport(request)

    producer.sender.transport = spy
    try:
        producer.produce("t", "one", partition=0)
        producer.flush()
    finally:
        producer.close()
    assert sent == [1]
    assert read_values(broker, "t", 0) == ["one"]


def test_librdkafka_acks_1_and_0_through_the_wire(broker: Broker, server: str) -> None:
    for acks in ("1", "0"):
        producer = ck.Producer({"bootstrap.servers": server, "acks": acks,
                                "enable.idempotence": False})  # fmt: skip
        assert [err for err, _ in delivered(producer, 2, topic="t", partition=0)] == [None] * 2
    # acks=0 is answered by nobody: its records are there once the server has run it.
    deadline = time.monotonic() + 30
    while len(read_values(broker, "t", 0)) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert read_values(broker, "t", 0) == ["v0", "v1", "v0", "v1"]
