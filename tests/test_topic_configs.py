"""Every topic config Kafka defines: accepted, checked by type and range, stored, and
described with its source and default; those that mean something here honoured
(max.message.bytes, message.timestamp.type, compression.type, min.insync.replicas).
Against the native clients and a real ``kip98 serve`` with confluent-kafka, kafka-python
and aiokafka."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import confluent_kafka as ck
import pytest
from aiokafka import AIOKafkaConsumer
from confluent_kafka.admin import AdminClient as CkAdmin
from confluent_kafka.admin import ConfigResource as CkResource
from confluent_kafka.admin import ConfigSource
from confluent_kafka.admin import NewTopic as CkNewTopic
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient
from kafka.admin import NewTopic as KpNewTopic
from kafka.errors import MessageSizeTooLargeError
from kio.schema.describe_configs.v4.request import (
    DescribeConfigsRequest,
    DescribeConfigsResource,
)
from sqlalchemy import text

from app.admin import AdminClient, ConfigResource, NewTopic
from app.broker import Broker
from app.client import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from app.log import topic_config
from app.log.topic_config import (
    TOPIC_CONFIGS,
    min_insync_replicas,
    partition_columns,
    validate_topic_config,
)
from app.log.topics import alter_topic_config, create_topic, describe_topic, list_topics
from app.protocol import FetchRequest, ProduceBatchesRequest, ProduceRequest, RecordIn
from tests.helpers.wire_client import consume_all, delivered, exchange, serving

# Kafka's topic configs (TopicConfig, LogConfig, QuotaConfig of Kafka 4): every one of
# them, so a config Kafka adds is noticed here.
KAFKA_TOPIC_CONFIGS = {
    "segment.bytes", "segment.ms", "segment.jitter.ms", "segment.index.bytes", "flush.messages",
    "flush.ms", "retention.bytes", "retention.ms", "max.message.bytes", "index.interval.bytes",
    "delete.retention.ms", "min.compaction.lag.ms", "max.compaction.lag.ms",
    "file.delete.delay.ms", "min.cleanable.dirty.ratio", "cleanup.policy",
    "unclean.leader.election.enable", "min.insync.replicas", "compression.type",
    "compression.gzip.level", "compression.lz4.level", "compression.zstd.level", "preallocate",
    "message.timestamp.type", "message.timestamp.difference.max.ms",
    "message.timestamp.before.max.ms", "message.timestamp.after.max.ms",
    "leader.replication.throttled.replicas", "follower.replication.throttled.replicas",
    "message.downconversion.enable", "remote.storage.enable", "local.retention.ms",
    "local.retention.bytes", "remote.log.copy.disable", "remote.log.delete.on.disable",
}  # fmt: skip


def _invalid(config: dict[str, Any]) -> None:
    with pytest.raises(KafkaException) as refused:
        validate_topic_config(config)
    assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG


def test_every_kafka_topic_config_is_declared_with_its_default() -> None:
    assert set(TOPIC_CONFIGS) == KAFKA_TOPIC_CONFIGS
    for d in TOPIC_CONFIGS.values():
        # Each default is a value its own check accepts, and stays as it is.
        assert validate_topic_config({d.name: topic_config.value_text(d.default)}) == {
            d.name: d.default
        }, d.name
        assert d.effect in (topic_config.HONOURED, topic_config.NO_EFFECT) and d.doc


@pytest.mark.parametrize(
    ("name", "good", "bad"),
    [
        ("segment.bytes", ["14", 2**31 - 1], ["13", 2**31, "1.5", "x", True]),
        ("segment.ms", ["1", str(2**63 - 1)], ["0", str(2**63)]),
        ("retention.ms", ["-1", "0"], ["-2"]),
        ("retention.bytes", ["-5", "0"], ["lots"]),
        ("max.message.bytes", ["0", "1048588"], ["-1"]),
        ("min.insync.replicas", ["1", "3"], ["0"]),
        ("min.cleanable.dirty.ratio", ["0", "0.5", 1], ["1.01", "-0.1", "half"]),
        ("unclean.leader.election.enable", ["true", "FALSE", False], ["yes", "1"]),
        ("compression.type", ["producer", "uncompressed", "gzip", "ZSTD"], ["brotli", ""]),
        ("compression.gzip.level", ["-1", "1", "9"], ["0", "10", "-2"]),
        ("compression.lz4.level", ["1", "17"], ["0", "18"]),
        ("compression.zstd.level", ["-131072", "22"], ["-131073", "23"]),
        ("message.timestamp.type", ["CreateTime", "LogAppendTime"], ["logappendtime", "Now"]),
        ("cleanup.policy", ["delete", "compact,delete"], ["shred", ""]),
        ("leader.replication.throttled.replicas", ["", "*", "0:1,1:2"], ["0-1", "*,0:1"]),
        ("local.retention.ms", ["-2", "5"], ["-3"]),
    ],
)
def test_each_config_is_checked_by_its_type_and_range(
    name: str, good: list[Any], bad: list[Any]
) -> None:
    for value in good:
        validate_topic_config({name: value})
    for value in bad:
        _invalid({name: value})
    _invalid({"no.such.config": "1"})


def test_configs_are_stored_and_described_with_source_and_default(
    db_url: str, broker: Broker
) -> None:
    """The native AdminClient: a topic made with Kafka's configs (segment and flush ones
    included, which have no effect here) keeps them; describe_configs gives every config,
    overrides as DYNAMIC_TOPIC_CONFIG, the rest as DEFAULT_CONFIG."""
    configs = {"segment.bytes": "1048576", "max.message.bytes": "2048", "flush.ms": "10",
               "unclean.leader.election.enable": "true", "min.insync.replicas": "2"}  # fmt: skip
    with AdminClient({"database.url": db_url}) as admin:
        admin.create_topics([NewTopic("c", 2, config=configs)])["c"].result()
        resource = ConfigResource("topic", "c")
        described = admin.describe_configs([resource])[resource].result()
    assert set(described) == KAFKA_TOPIC_CONFIGS
    assert described["segment.bytes"].value == "1048576"
    assert described["segment.bytes"].source == "DYNAMIC_TOPIC_CONFIG"
    assert described["unclean.leader.election.enable"].value == "true"
    assert (described["retention.ms"].value, described["retention.ms"].source) == (
        "604800000", "DEFAULT_CONFIG",
    )  # fmt: skip
    assert described["preallocate"].value == "false"
    info = describe_topic(broker, "c")
    assert info.config == {"segment.bytes": 1048576, "max.message.bytes": 2048, "flush.ms": 10,
                           "unclean.leader.election.enable": True,
                           "min.insync.replicas": 2}  # fmt: skip
    assert min_insync_replicas(info.config) == 2 and min_insync_replicas({}) == 1
    assert partition_columns(info.config).max_message_bytes == 2048


def test_min_insync_replicas_above_the_copies_in_sync_refuses_acks_all_only(
    broker: Broker,
) -> None:
    """Without standbys the primary's is the one copy: a topic asking two refuses acks=all
    with NOT_ENOUGH_REPLICAS (retriable) and writes nothing; acks=1 is not held to it, as
    in Kafka; the topic's default (1) lets acks=all in."""
    create_topic(broker, "two", 1, {"min.insync.replicas": 2})
    create_topic(broker, "one", 1)

    def one(topic: str, acks: int) -> int:
        batch = ProduceRequest(topic, 0, [RecordIn(None, b"v", 0)])
        return broker.handle(ProduceBatchesRequest([batch], acks=acks)).batches[0].error_code

    assert one("two", -1) == KafkaError.NOT_ENOUGH_REPLICAS
    assert one("one", -1) == KafkaError.NO_ERROR
    assert one("two", 1) == KafkaError.NO_ERROR
    fetched = broker.handle(FetchRequest("two", 0, 0)).records
    assert len(fetched) == 1  # only the acks=1 record


def test_wire_clients_create_alter_and_describe_kafkas_configs(db_url: str) -> None:
    """confluent-kafka and kafka-python create topics with configs Kafka defines (refused
    before: segment.bytes, max.message.bytes); DescribeConfigs shows each one's source,
    and with synonyms the default under an override."""
    with serving(db_url) as server:
        admin = CkAdmin({"bootstrap.servers": server})
        made = admin.create_topics(
            [CkNewTopic("w", 1, config={"segment.bytes": "1000000", "max.message.bytes": "4096"}),
             CkNewTopic("bad", 1, config={"max.message.bytes": "-5"})]
        )  # fmt: skip
        made["w"].result(30)
        with pytest.raises(ck.KafkaException) as refused:
            made["bad"].result(30)
        assert refused.value.args[0].code() == ck.KafkaError.INVALID_CONFIG
        resource = CkResource("topic", "w")
        entries = admin.describe_configs([resource])[resource].result(30)
        assert entries["segment.bytes"].value == "1000000"
        assert entries["segment.bytes"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
        assert entries["segment.ms"].source == ConfigSource.DEFAULT_CONFIG.value
        assert entries["segment.ms"].is_default
        # With synonyms (and documentation), v4 as Kafka's own admin asks: the override,
        # then the default under it; the type and what it does here.
        asked = DescribeConfigsRequest(
            resources=(DescribeConfigsResource(resource_type=2, resource_name="w",
                                               configuration_keys=("max.message.bytes",
                                                                   "segment.ms")),),
            include_synonyms=True, include_documentation=True,
        )  # fmt: skip
        [described] = exchange(server, 32, 4, asked).results
        by_name = {c.name: c for c in described.configs}
        assert [(s.value, int(s.source)) for s in by_name["max.message.bytes"].synonyms] == [
            ("4096", 1), ("1048588", 5),
        ]  # fmt: skip
        assert [(s.value, int(s.source)) for s in by_name["segment.ms"].synonyms] == [
            ("604800000", 5)
        ]
        assert int(by_name["max.message.bytes"].config_type) == 3  # INT
        assert "honoured" in by_name["max.message.bytes"].documentation
        assert "no effect" in by_name["segment.ms"].documentation

        kp = KafkaAdminClient(bootstrap_servers=server)
        try:
            kp.create_topics([KpNewTopic("k", 1, 1, topic_configs={"index.interval.bytes": "8",
                                                                  "preallocate": "true"})])  # fmt: skip
        finally:
            kp.close()
    assert describe_topic(Broker.connect(db_url), "k").config == {
        "index.interval.bytes": 8, "preallocate": True,
    }  # fmt: skip


def test_message_format_version_is_unknown_as_in_kafka_4(db_url: str, broker: Broker) -> None:
    """Kafka 4 removed message.format.version with message formats v0 and v1 (KIP-724):
    CreateTopics and AlterConfigs naming it are refused INVALID_CONFIG, as any unknown
    config is (librdkafka's own test of it skips Kafka 4); DescribeConfigs lists it no
    more; an override stored before is ignored, and dropped by the topic's next change."""
    with serving(db_url) as server:
        admin = CkAdmin({"bootstrap.servers": server})
        for version in ("0.10.0.0", "3.0-IV1"):
            made = admin.create_topics(
                [CkNewTopic("old", 1, config={"message.format.version": version})]
            )
            with pytest.raises(ck.KafkaException) as refused:
                made["old"].result(30)
            assert refused.value.args[0].code() == ck.KafkaError.INVALID_CONFIG
        admin.create_topics([CkNewTopic("t", 1)])["t"].result(30)
        resource = CkResource("topic", "t", set_config={"message.format.version": "0.10.0.0"})
        with pytest.raises(ck.KafkaException) as refused:
            admin.alter_configs([resource])[resource].result(30)
        assert refused.value.args[0].code() == ck.KafkaError.INVALID_CONFIG
        entries = admin.describe_configs([CkResource("topic", "t")])
        assert "message.format.version" not in entries[CkResource("topic", "t")].result(30)
    assert "old" not in {t.topic for t in list_topics(broker)}
    with broker.engine.begin() as conn:  # as a kip98 before this change kept it
        conn.execute(
            text("UPDATE topics SET config = :c WHERE topic = 't'"),
            {"c": '{"message.format.version": "2.8", "retention.ms": 5}'},
        )
    assert alter_topic_config(broker, "t", {"flush.ms": "10"}) == {
        "retention.ms": 5, "flush.ms": 10,
    }  # fmt: skip


# ---------------------------------------------------------------- max.message.bytes


def test_max_message_bytes_limits_a_topics_batches(db_url: str, broker: Broker) -> None:
    """A batch over its topic's max.message.bytes is MESSAGE_TOO_LARGE (the native
    Producer's delivery report), one within it goes; a topic may allow more than the
    broker's message.max.bytes; lowering the config takes effect for a producer whose
    next append would be decided on the partition row it remembers (rule 32)."""
    create_topic(broker, "small", 1, {"max.message.bytes": 600})
    create_topic(broker, "large", 1, {"max.message.bytes": 3_000_000})
    reports: list[Any] = []
    config = {"database.url": db_url, "message.max.bytes": 5_000_000, "batch.size": 5_000_000,
              "linger.ms": 0}  # fmt: skip
    with Producer(config) as producer:
        for topic, size in (("small", 200), ("small", 900), ("large", 2_000_000)):
            producer.produce(topic, b"x" * size, on_delivery=lambda e, m: reports.append(e))
            producer.flush(30)
        assert reports[0] is None and reports[2] is None
        assert reports[1] is not None and reports[1].code() == KafkaError.MSG_SIZE_TOO_LARGE
        alter_topic_config(broker, "small", {"max.message.bytes": 300})
        producer.produce("small", b"x" * 400, on_delivery=lambda e, m: reports.append(e))
        producer.flush(30)
    assert reports[3] is not None and reports[3].code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert describe_topic(broker, "small").partitions[0].high_watermark == 1


def test_max_message_bytes_over_the_wire(db_url: str, broker: Broker) -> None:
    """librdkafka and kafka-python get MESSAGE_TOO_LARGE for a batch over the topic's
    max.message.bytes (counted as sent, compressed or not), and no record is written."""
    create_topic(broker, "small", 1, {"max.message.bytes": 1000})
    with serving(db_url) as server:
        producer = ck.Producer({"bootstrap.servers": server, "message.max.bytes": 100_000})
        reports = delivered(producer, 1, topic="small", key=b"k" * 3000)
        assert [err.code() for err, _ in reports] == [ck.KafkaError.MSG_SIZE_TOO_LARGE]
        assert [err for err, _ in delivered(producer, 1, topic="small")] == [None]
        kp = KafkaProducer(bootstrap_servers=server, max_request_size=100_000)
        try:
            with pytest.raises(MessageSizeTooLargeError):
                kp.send("small", b"y" * 3000).get(timeout=30)
        finally:
            kp.close()
    assert describe_topic(broker, "small").partitions[0].high_watermark == 1


# ---------------------------------------------------------------- message.timestamp.type


def test_log_append_time_stamps_records_on_append(db_url: str, broker: Broker) -> None:
    """A LogAppendTime topic keeps its append time, not the producer's: the native
    consumer, librdkafka, kafka-python and aiokafka all see it, with its type."""
    create_topic(broker, "stamped", 1, {"message.timestamp.type": "LogAppendTime"})
    create_topic(broker, "kept", 1)
    old = 1_000_000_000_000  # 2001
    before = int(time.time() * 1000)
    with Producer({"database.url": db_url}) as producer:
        for topic in ("stamped", "kept"):
            producer.produce(topic, b"n", timestamp=old)
        producer.flush(30)
    with Consumer({"database.url": db_url, "group.id": "g"}) as native:
        native.assign([TopicPartition("stamped", 0, 0), TopicPartition("kept", 0, 0)])
        got = {}
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            for m in native.consume(10, 0.5):
                got[m.topic()] = m.timestamp()
    assert got["kept"] == (TIMESTAMP_CREATE_TIME, old)
    kind, stamped = got["stamped"]
    assert kind == TIMESTAMP_LOG_APPEND_TIME and stamped >= before

    with serving(db_url) as server:
        producer = ck.Producer({"bootstrap.servers": server})
        delivered(producer, 2, topic="stamped", timestamp=old)
        reader = ck.Consumer({"bootstrap.servers": server, "group.id": "r"})
        try:
            reader.assign([ck.TopicPartition("stamped", 0, 0)])
            seen = [m.timestamp() for m in consume_all(reader, 3)]
        finally:
            reader.close()
        assert all(kind == ck.TIMESTAMP_LOG_APPEND_TIME and ts >= before for kind, ts in seen)
        kc = KafkaConsumer(bootstrap_servers=server, auto_offset_reset="earliest",
                           consumer_timeout_ms=20_000)  # fmt: skip
        try:
            from kafka import TopicPartition as KpTp

            kc.assign([KpTp("stamped", 0)])
            records = [m for _, (m) in zip(range(3), kc, strict=False)]
        finally:
            kc.close()
        assert [(m.timestamp_type, m.timestamp >= before) for m in records] == [(1, True)] * 3

        aio = asyncio.run(_aio_records(server, "stamped", 3))
        assert [(m.timestamp_type, m.timestamp >= before) for m in aio] == [(1, True)] * 3


async def _aio_records(server: str, topic: str, n: int) -> list[Any]:
    c = AIOKafkaConsumer(topic, bootstrap_servers=server, auto_offset_reset="earliest")
    await c.start()
    try:
        return [await c.getone() for _ in range(n)]
    finally:
        await c.stop()


async def _aio_values(server: str, topic: str, n: int) -> list[bytes]:
    return [m.value for m in await _aio_records(server, topic, n)]


# ---------------------------------------------------------------- compression.type


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_fetched_batches_are_compressed_with_the_topics_codec(
    db_url: str, broker: Broker, codec: str
) -> None:
    """compression.type names the codec batches are served in (records are rows here, so
    this is where it applies): the bytes fetched say so, and librdkafka and aiokafka read
    them back."""
    create_topic(broker, "z", 1, {"compression.type": codec})
    with serving(db_url) as server:
        producer = ck.Producer({"bootstrap.servers": server, "linger.ms": 50})
        values = [f"value {i} ".encode() * 20 for i in range(50)]
        for v in values:
            producer.produce("z", v)
        assert producer.flush(30) == 0
        reader = ck.Consumer({"bootstrap.servers": server, "group.id": "r"})
        try:
            reader.assign([ck.TopicPartition("z", 0, 0)])
            assert [m.value() for m in consume_all(reader, 50)] == values
        finally:
            reader.close()
        assert asyncio.run(_aio_values(server, "z", 50)) == values
    answer = broker.handle(FetchRequest("z", 0, 0, batches=True))
    assert answer.compression_type == codec
    from app.server.records import Served, encode_batches

    batch = encode_batches(answer.log_records, Served(compression_type=codec))
    attributes = int.from_bytes(batch[21:23], "big")
    assert attributes & 0x07 == {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}[codec]
