"""Topic auto-creation (Kafka's auto.create.topics.enable, num.partitions): a Metadata
request that allows it creates the unknown topics it names, if the broker auto-creates
(KIP98_AUTO_CREATE_TOPICS) and the principal may create them; the native clients ask as
librdkafka's do (allow.auto.create.topics: the producer yes, the consumer not unless told).
Real Kafka clients against a real ``kip98 serve``."""

from __future__ import annotations

import time
from dataclasses import replace

import confluent_kafka as ck
import pytest
from kafka import KafkaConsumer, KafkaProducer

from app.broker import Broker
from app.client import Consumer, TopicPartition
from app.clock import ManualClock
from app.errors import KafkaError
from app.log.topics import create_topic, list_topics, metadata
from app.protocol import MetadataRequest
from app.security import acls as acl_admin
from app.security.rules import AclBinding as Acl
from app.settings import BrokerSettings
from tests.helpers.wire_client import consume_all, delivered, serving


def _topics(broker: Broker) -> dict[str, int]:
    return {t.topic: t.num_partitions for t in list_topics(broker)}


def test_metadata_creates_what_it_may(db_url: str) -> None:
    """Only a request that allows it, only with the broker's switch on, only a legal name,
    only for a principal with Create on the cluster or the topic; a topic it cannot create
    is answered with why, the others as usual."""
    settings = BrokerSettings(authorization=1, num_partitions=2)
    admin = Broker.connect(db_url, clock=ManualClock(), settings=settings, principal="User:admin")
    alice = replace(admin, principal="User:alice")
    create_topic(admin, "there", 1)
    assert metadata(admin, MetadataRequest(["a"])).topics[0].error_code == (
        KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    )
    assert "a" not in _topics(admin), "not asked to create"

    answer = metadata(admin, MetadataRequest(["there", "a", "bad name", "a"], True)).topics
    assert [(t.topic, t.error_code, t.num_partitions) for t in answer] == [
        ("there", 0, 1), ("a", 0, 2), ("bad name", KafkaError.INVALID_TOPIC_EXCEPTION, 0),
        ("a", 0, 2),
    ]  # fmt: skip
    assert answer[1].leader_epochs == (0, 0) and answer[1].topic_id is not None

    acl_admin.create_acls(admin, [Acl("User:alice", "topic", "*", "describe")])
    refused = metadata(alice, MetadataRequest(["b"], True)).topics
    assert [(t.topic, t.error_code) for t in refused] == [
        ("b", KafkaError.TOPIC_AUTHORIZATION_FAILED)
    ]
    acl_admin.create_acls(admin, [Acl("User:alice", "topic", "b", "create")])
    assert metadata(alice, MetadataRequest(["b"], True)).topics[0].error_code == 0
    acl_admin.create_acls(admin, [Acl("User:alice", "cluster", "kafka-cluster", "create")])
    assert metadata(alice, MetadataRequest(["c"], True)).topics[0].error_code == 0

    off = replace(admin, settings=replace(settings, auto_create_topics=False))
    assert metadata(off, MetadataRequest(["d"], True)).topics[0].error_code == (
        KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    )
    assert _topics(admin) == {"there": 1, "a": 2, "b": 2, "c": 2}


def test_the_native_consumer_creates_only_when_told(db_url: str) -> None:
    broker = Broker.connect(db_url)
    base = {"database.url": db_url, "group.id": "g", "auto.offset.reset": "earliest"}
    with Consumer(base) as plain:
        plain.subscribe(["left-alone"])
        plain.assign([TopicPartition("assigned-alone", 0)])
    assert not {"left-alone", "assigned-alone"} & set(_topics(broker))
    with Consumer({**base, "allow.auto.create.topics": True}) as asking:
        asking.subscribe(["made-by-subscribe"])
    with Consumer({**base, "allow.auto.create.topics": "true"}) as asking:
        asking.assign([TopicPartition("made-by-assign", 0)])
    assert {"made-by-subscribe", "made-by-assign"} <= set(_topics(broker))


def test_wire_clients_get_their_topics_made(db_url: str) -> None:
    """librdkafka's producer creates by default, its consumer when told to (for the
    partitions it is assigned, as librdkafka asks); kafka-python's
    Metadata (v4+, allow_auto_topic_creation) creates them too; with the broker's switch
    off nothing is made and librdkafka reports the topic unknown."""
    broker = Broker.connect(db_url)
    with serving(db_url, env={"KIP98_NUM_PARTITIONS": "3"}) as server:
        producer = ck.Producer({"bootstrap.servers": server})
        reports = delivered(producer, 5, topic="by-librdkafka")
        assert [err for err, _ in reports] == [None] * 5
        consumer = ck.Consumer({"bootstrap.servers": server, "group.id": "g",
                                "allow.auto.create.topics": True,
                                "auto.offset.reset": "earliest"})  # fmt: skip
        try:
            # librdkafka asks for auto-creation of the topics it knows locally (assigned
            # ones), not of a subscription's.
            consumer.assign([ck.TopicPartition("by-librdkafka-consumer", 0)])
            deadline = time.monotonic() + 30
            while "by-librdkafka-consumer" not in _topics(broker):
                assert time.monotonic() < deadline, "the consumer's topic was never made"
                consumer.poll(0.2)
        finally:
            consumer.close()
        kp = KafkaProducer(bootstrap_servers=server)
        try:
            kp.send("by-kafka-python", b"x").get(timeout=30)
        finally:
            kp.close()
        kc = KafkaConsumer("by-kafka-python", bootstrap_servers=server,
                           auto_offset_reset="earliest", consumer_timeout_ms=20_000)  # fmt: skip
        try:
            assert [m.value for m in kc] == [b"x"]
        finally:
            kc.close()
    assert {t: n for t, n in _topics(broker).items()} == {
        "by-librdkafka": 3, "by-librdkafka-consumer": 3, "by-kafka-python": 3,
    }  # fmt: skip

    with serving(db_url, env={"KIP98_AUTO_CREATE_TOPICS": "false"}) as server:
        producer = ck.Producer({"bootstrap.servers": server, "message.timeout.ms": 20_000,
                                "topic.metadata.propagation.max.ms": 100})  # fmt: skip
        reports = delivered(producer, 1, topic="never-made")
        assert [err.code() for err, _ in reports] in (
            [ck.KafkaError.UNKNOWN_TOPIC_OR_PART],
            [ck.KafkaError._UNKNOWN_TOPIC],
        )
        reader = ck.Consumer({"bootstrap.servers": server, "group.id": "h",
                              "allow.auto.create.topics": True})  # fmt: skip
        try:
            # The producer's keyless records went to partitions of its own choosing.
            reader.assign([ck.TopicPartition("by-librdkafka", p, 0) for p in range(3)])
            assert len(consume_all(reader, 5, timeout=120)) == 5  # the topics there are still read
        finally:
            reader.close()
    assert "never-made" not in _topics(broker)


@pytest.mark.parametrize("value", ["maybe", "2"])
def test_a_bad_switch_is_refused(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.errors import KafkaException

    monkeypatch.setenv("KIP98_AUTO_CREATE_TOPICS", value)
    with pytest.raises(KafkaException, match="KIP98_AUTO_CREATE_TOPICS must be true or false"):
        BrokerSettings.from_env()
