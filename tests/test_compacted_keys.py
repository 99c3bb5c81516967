"""A record without a key on a compacted topic: Kafka's log validation refuses its whole
batch, INVALID_RECORD with each keyless record's index (KIP-467's record_errors) and an
error message, and writes nothing; keyed records and other topics are not concerned.
Over the wire (raw Produce v9, librdkafka) and from the native producer, against a real
``kip98 serve`` and database."""

from __future__ import annotations

import datetime
import socket
import time
from collections.abc import Callable
from typing import Any

import confluent_kafka as ck
from kio.schema.produce.v9 import request as produce_v9

from app.broker import Broker
from app.client import Producer
from app.errors import KafkaError
from app.log.topics import alter_topic_config, create_topic
from tests.helpers.batches import record_batch
from tests.helpers.txn_driver import read_values
from tests.helpers.wire_client import delivered, read_response, request_frame, serving

WHY = "Compacted topic cannot accept message without key in topic partition kc-0"


def _produce(server: str, topic: str, records: bytes) -> Any:
    body = produce_v9.ProduceRequest(
        acks=-1, timeout=datetime.timedelta(seconds=5), topic_data=(
            produce_v9.TopicProduceData(name=topic, partition_data=(
                produce_v9.PartitionProduceData(index=0, records=records),)),))  # fmt: skip
    host, port = server.split(":")
    with socket.create_connection((host, int(port)), 10) as s:
        s.sendall(request_frame(0, 9, body))
        answer = read_response(s, 0, 9)
    [partition] = answer.responses[0].partition_responses
    return partition


def _until(produce: Callable[[], Any], code: int) -> None:
    deadline = time.monotonic() + 60
    while produce().error_code.value != code:
        assert time.monotonic() < deadline, f"never answered {code}"
        time.sleep(0.1)


def test_a_keyless_record_on_a_compacted_topic_is_refused_with_its_index(db_url: str) -> None:
    broker = Broker.connect(db_url)
    create_topic(broker, "kc", 1, config={"cleanup.policy": "compact"})
    create_topic(broker, "kd", 1)
    with serving(db_url) as server:
        refused = _produce(server, "kc", record_batch(keys=[b"k0", None, b"k2", None]))
        assert refused.error_code.value == KafkaError.INVALID_RECORD
        assert [(e.batch_index, e.batch_index_error_message) for e in refused.record_errors] == [
            (1, WHY), (3, WHY),
        ]  # fmt: skip
        assert refused.error_message == (
            "One or more records have been rejected due to 2 record errors in total, and only "
            f"showing the first three errors at most: [RecordError(batchIndex=1, message='{WHY}'), "
            f"RecordError(batchIndex=3, message='{WHY}')]"
        )
        assert read_values(broker, "kc", 0, committed=False) == []  # nothing of the batch
        assert _produce(server, "kc", record_batch(keys=[b"k0", b"k1"])).error_code.value == 0
        assert _produce(server, "kd", record_batch(keys=[None, None])).error_code.value == 0

        p = ck.Producer({"bootstrap.servers": server})
        [(keyless, _)] = delivered(p, 1, topic="kc", partition=0)
        assert keyless is not None and keyless.code() == ck.KafkaError.INVALID_RECORD
        [(keyed, _)] = delivered(p, 1, topic="kc", partition=0, key=b"k")
        assert keyed is None

        # A topic made compacted later (by another process: the server sees it within a
        # second) refuses them from then on, and the other way round.
        alter_topic_config(broker, "kd", {"cleanup.policy": "compact,delete"})
        _until(
            lambda: _produce(server, "kd", record_batch(keys=[None])),
            KafkaError.INVALID_RECORD,
        )
        alter_topic_config(broker, "kc", {"cleanup.policy": "delete"})
        _until(
            lambda: _produce(server, "kc", record_batch(keys=[None])),
            KafkaError.NO_ERROR,
        )
    assert read_values(broker, "kc", 0, committed=False) == ["v0", "v1", "v0", "v0"]


def test_the_native_producer_is_refused_as_well(db_url: str) -> None:
    broker = Broker.connect(db_url)
    create_topic(broker, "kc", 1, config={"cleanup.policy": "compact"})
    failures: list[ck.KafkaError | None] = []
    with Producer({"database.url": db_url}) as p:
        # Each its own batch: a batch holding a keyless record is refused whole.
        p.produce("kc", b"v", partition=0, on_delivery=lambda err, msg: failures.append(err))
        p.flush(30)
        p.produce("kc", b"v", key=b"k", partition=0, on_delivery=lambda e, m: failures.append(e))
        p.flush(30)
    assert failures[0] is not None and failures[0].code() == KafkaError.INVALID_RECORD
    assert failures[1] is None
    assert read_values(broker, "kc", 0, committed=False) == ["v"]
