"""AdminClient: topics through futures, transaction inspection, and the hanging-transaction
tools (find, then abort so the LSO moves) — with no coordinator loop running."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from app.admin import AdminClient, ConfigResource, NewTopic
from app.broker import Broker
from app.client.message import TopicPartition
from app.errors import KafkaError, KafkaException
from tests.helpers.txn_driver import TxnDriver, partition_offsets, read_values


@pytest.fixture
def admin(db_url: str) -> AdminClient:
    a = AdminClient({"database.url": db_url})
    for fut in a.create_topics([NewTopic("t", 2)]).values():
        fut.result()
    return a


def test_topics_through_futures(admin: AdminClient) -> None:
    futs = admin.create_topics([NewTopic("u", 3), NewTopic("t", 1), NewTopic("bad name")])
    assert futs["u"].result() is None
    with pytest.raises(KafkaException) as info:
        futs["t"].result()
    assert info.value.error.code() == KafkaError.TOPIC_ALREADY_EXISTS
    assert futs["bad name"].exception() is not None
    assert sorted(admin.list_topics().topics) == ["t", "u"]
    admin.delete_topics(["u"])["u"].result()
    assert sorted(admin.list_topics().topics) == ["t"]
    assert admin.delete_topics(["u"])["u"].exception() is not None


def test_find_and_abort_hanging_transaction(db_url: str, admin: AdminClient) -> None:
    broker = Broker.connect(db_url)
    d = TxnDriver(broker, "stuck", timeout_ms=600_000)  # not past it by itself in any run
    assert d.init() == 0
    d.send("t", 0, "stuck")
    assert [h.start_offset for h in admin.find_hanging_transactions()] == []
    # Past its timeout with no coordinator loop running, it hangs.
    with broker.engine.begin() as conn:
        conn.execute(text("UPDATE transactions SET txn_start_ms = txn_start_ms - 700000"))
    hanging = admin.find_hanging_transactions()
    assert [(h.topic, h.partition, h.producer_id, h.start_offset) for h in hanging] == [
        ("t", 0, d.producer_id, 0)
    ]
    assert partition_offsets(broker, "t", 0) == (1, 0)
    producers = admin.describe_producers([TopicPartition("t", 0)])[TopicPartition("t", 0)]
    assert producers[0].current_transaction_start_offset == 0
    assert admin.abort_transaction("t", 0, 0) is True
    assert partition_offsets(broker, "t", 0) == (2, 2)
    assert read_values(broker, "t", 0) == []
    assert admin.find_hanging_transactions() == []
    with pytest.raises(KafkaException):
        admin.abort_transaction("t", 0, 0)


def test_a_partition_the_coordinator_forgot_is_hanging(db_url: str, admin: AdminClient) -> None:
    broker = Broker.connect(db_url)
    d = TxnDriver(broker, "orphan")
    d.init()
    d.send("t", 1, "x")
    with broker.engine.begin() as conn:  # the coordinator no longer lists the partition
        conn.execute(text("UPDATE transactions SET partitions = '[]'::jsonb"))
    assert [(h.topic, h.partition) for h in admin.find_hanging_transactions()] == [("t", 1)]


def test_list_and_describe_transactions(db_url: str, admin: AdminClient) -> None:
    broker = Broker.connect(db_url)
    d = TxnDriver(broker, "x")
    d.init()
    d.send("t", 0, "v")
    assert [t.transactional_id for t in admin.list_transactions(["BEGIN"])] == ["x"]
    assert admin.list_transactions(["EMPTY"]) == []
    desc = admin.describe_transactions(["x"])["x"]
    assert desc.state == "BEGIN" and desc.partitions == (("t", 0),)
    with pytest.raises(KafkaException) as info:
        admin.describe_transactions(["nope"])
    assert info.value.error.code() == KafkaError.TRANSACTIONAL_ID_NOT_FOUND


def test_configs_through_futures(admin: AdminClient) -> None:
    def alter(*resources: ConfigResource) -> list[int]:
        futures = admin.alter_configs(list(resources))
        return [
            0 if f.exception() is None else f.exception().error.code() for f in futures.values()
        ]  # type: ignore[union-attr]

    replace = ConfigResource("topic", "t", {"retention.ms": "5", "cleanup.policy": "compact"})
    assert alter(replace) == [0]
    assert alter(ConfigResource("topic", "t", {"retention.bytes": 9})) == [0]
    assert admin.list_topics().topics["t"].config == {"retention.bytes": 9}  # replaced
    incremental = ConfigResource(
        "topic", "t", {"retention.ms": 7}, ["retention.bytes", "retention.bytes", "retention.ms"],
        incremental=True,
    )  # fmt: skip
    missing = ConfigResource("topic", "nope", {"retention.ms": 1}, incremental=True)
    bad = ConfigResource("topic", "t", {"retention.ms": "soon"}, incremental=True)
    assert alter(incremental, missing) == [0, KafkaError.UNKNOWN_TOPIC_OR_PARTITION]
    assert alter(bad) == [KafkaError.INVALID_CONFIG]
    assert admin.list_topics().topics["t"].config == {"retention.ms": 7}
    described = admin.describe_configs([ConfigResource("topic", "t")])
    [entries] = [f.result() for f in described.values()]
    assert (entries["retention.ms"].value, entries["retention.ms"].source) == (
        "7",
        "DYNAMIC_TOPIC_CONFIG",
    )
    assert entries["cleanup.policy"].is_default and entries["cleanup.policy"].value == "delete"
    [unknown] = admin.describe_configs([ConfigResource("topic", "nope")]).values()
    assert unknown.exception().error.code() == KafkaError.UNKNOWN_TOPIC_OR_PARTITION  # type: ignore[union-attr]
    with pytest.raises(KafkaException) as info:
        admin.describe_configs([ConfigResource("broker", "0")])
    assert info.value.error.code() == KafkaError._INVALID_ARG
