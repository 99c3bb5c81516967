"""CreatePartitions (API 37): a topic grows (never shrinks), its new partitions obeying its
configs and leading in epoch 0; consumer groups pick them up: a native group is
rebalanced by the coordinator, librdkafka's classic groups (eager range and
cooperative-sticky, whose assignment runs on the client) by their leader noticing the
new count in its metadata, as against Kafka. The native AdminClient, ``kip98 topics
alter --partitions``, confluent-kafka and kafka-python against a real ``kip98 serve``."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient as CkAdmin
from confluent_kafka.admin import NewPartitions as CkNewPartitions
from kafka.admin import KafkaAdminClient
from kafka.admin import NewPartitions as KpNewPartitions
from sqlalchemy import text

from app.admin import AdminClient, NewPartitions
from app.broker import Broker
from app.client import Consumer, KafkaError, KafkaException, Producer
from app.log.topics import create_topic, describe_topic
from app.protocol import CreatePartitionsRequest, PartitionCount
from app.security import acls as acl_admin
from app.security.rules import AclBinding as Acl
from app.settings import BrokerSettings
from tests.helpers.cli_runner import run_kip98
from tests.helpers.wire_client import serving

pytestmark = pytest.mark.broker(topics={"t": (2, {"max.message.bytes": 700})})


def _count(broker: Broker, topic: str = "t") -> int:
    return describe_topic(broker, topic).num_partitions


def _grow(broker: Broker, *topics: tuple[str, int], validate_only: bool = False) -> list[int]:
    request = CreatePartitionsRequest([PartitionCount(n, c) for n, c in topics], validate_only)
    return [r.error_code for r in broker.handle(request).results]


def test_a_topic_grows_and_never_shrinks(db_url: str, broker: Broker) -> None:
    assert _grow(broker, ("t", 2), ("t", 1), ("nope", 3), ("t", 10_001)) == [
        KafkaError.INVALID_PARTITIONS, KafkaError.INVALID_PARTITIONS,
        KafkaError.UNKNOWN_TOPIC_OR_PARTITION, KafkaError.INVALID_PARTITIONS,
    ]  # fmt: skip
    assert _grow(broker, ("t", 5), validate_only=True) == [0] and _count(broker) == 2
    assert _grow(broker, ("t", 5)) == [0] and _count(broker) == 5
    with broker.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT p.partition, p.max_message_bytes, e.leader_epoch, e.start_offset "
                "FROM partitions p JOIN partition_leader_epochs e USING (topic, partition) "
                "WHERE topic = 't' ORDER BY partition"
            )
        ).all()
    assert [tuple(r) for r in rows] == [(p, 700, 0, 0) for p in range(5)]
    reports: dict[int, Any] = {}

    def report(err: Any, msg: Any) -> None:
        reports[msg.partition()] = err

    with Producer({"database.url": db_url}) as producer:
        producer.produce("t", b"x" * 100, partition=4, on_delivery=report)
        producer.produce("t", b"x" * 900, partition=3, on_delivery=report)
        producer.flush(30)
    assert reports[4] is None
    assert reports[3] is not None and reports[3].code() == KafkaError.MSG_SIZE_TOO_LARGE

    admin = Broker.connect(db_url, settings=BrokerSettings(authorization=1),
                           principal="User:admin")  # fmt: skip
    alice = replace(admin, principal="User:alice")
    acl_admin.create_acls(admin, [Acl("User:alice", "topic", "t", "describe")])
    assert _grow(alice, ("t", 6)) == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    acl_admin.create_acls(admin, [Acl("User:alice", "topic", "t", "alter")])
    assert _grow(alice, ("t", 6)) == [0] and _count(broker) == 6


def test_native_admin_and_cli(db_url: str, broker: Broker) -> None:
    with AdminClient({"database.url": db_url}) as admin:
        futures = admin.create_partitions([NewPartitions("t", 3), NewPartitions("nope", 2)])
        assert futures["t"].result() is None
        with pytest.raises(KafkaException) as unknown:
            futures["nope"].result()
        assert unknown.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    shown = run_kip98("topics", "alter", "t", "--partitions", "4")
    assert shown.returncode == 0, shown.stderr
    assert "now has 4 partition(s)" in shown.stdout
    refused = run_kip98("topics", "alter", "t", "--partitions", "2")
    assert refused.returncode != 0 and "INVALID_PARTITIONS" in refused.stderr
    assert "Traceback" not in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert _count(broker) == 4


def test_wire_clients_grow_topics(db_url: str, broker: Broker) -> None:
    """confluent-kafka's and kafka-python's create_partitions, each topic on its own."""
    create_topic(broker, "u", 1)
    with serving(db_url) as server:
        admin = CkAdmin({"bootstrap.servers": server})
        futures = admin.create_partitions([CkNewPartitions("t", 4), CkNewPartitions("u", 1)])
        futures["t"].result(30)
        with pytest.raises(ck.KafkaException) as refused:
            futures["u"].result(30)
        assert refused.value.args[0].code() == ck.KafkaError.INVALID_PARTITIONS
        [only] = admin.create_partitions([CkNewPartitions("u", 3)], validate_only=True).values()
        only.result(30)
        kp = KafkaAdminClient(bootstrap_servers=server)
        try:
            kp.create_partitions({"u": KpNewPartitions(total_count=2)})
        finally:
            kp.close()
    assert (_count(broker, "t"), _count(broker, "u")) == (4, 2)


def _assigned(consumers: list[Any]) -> set[int]:
    return {tp.partition for c in consumers for tp in c.assignment()}


def _settled(consumers: list[Any]) -> bool:
    """Every member holds one of the two partitions: the group formed with all of them."""
    return sorted(tp.partition for c in consumers for tp in c.assignment()) == [0, 1] and all(
        len(c.assignment()) == 1 for c in consumers
    )


def _poll_until(consumers: list[Any], done: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, what
        for c in consumers:
            c.poll(0.1)


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_librdkafka_groups_pick_up_new_partitions(
    db_url: str, broker: Broker, strategy: str
) -> None:
    """Two librdkafka consumers share the topic's two partitions; it grows to five; their
    metadata refresh shows the new count, the group rebalances (eagerly, or cooperatively,
    the client assigning), and the new partitions' records are read."""
    with serving(db_url) as server:
        config = {"bootstrap.servers": server, "group.id": f"g-{strategy}",
                  "partition.assignment.strategy": strategy, "auto.offset.reset": "earliest",
                  "topic.metadata.refresh.interval.ms": 500}  # fmt: skip
        consumers = [ck.Consumer(config) for _ in range(2)]
        try:
            for c in consumers:
                c.subscribe(["t"])
            _poll_until(consumers, lambda: _settled(consumers), "first assignment")
            assert _grow(broker, ("t", 5)) == [0]
            _poll_until(
                consumers, lambda: _assigned(consumers) == {0, 1, 2, 3, 4}, "new partitions"
            )
            producer = ck.Producer({"bootstrap.servers": server})
            for p in range(5):
                producer.produce("t", f"p{p}", partition=p)
            assert producer.flush(30) == 0
            seen: set[int] = set()
            deadline = time.monotonic() + 60
            while seen != {0, 1, 2, 3, 4}:
                assert time.monotonic() < deadline, f"read only {seen}"
                for c in consumers:
                    m = c.poll(0.1)
                    if m is not None and m.error() is None:
                        seen.add(m.partition())
            each = [{tp.partition for tp in c.assignment()} for c in consumers]
            assert not each[0] & each[1], "a partition owned by both members"
        finally:
            for c in consumers:
                c.close()


def test_a_native_group_is_rebalanced_onto_new_partitions(db_url: str, broker: Broker) -> None:
    """The coordinator assigns native groups itself: the topic's growth starts their
    rebalance in the same DB transaction, and the range assignment covers the new ones."""
    config = {"database.url": db_url, "group.id": "n", "auto.offset.reset": "earliest",
              "heartbeat.interval.ms": 100, "session.timeout.ms": 6000}  # fmt: skip
    consumers = [Consumer(config), Consumer(config)]
    try:
        for c in consumers:
            c.subscribe(["t"])
        _poll_until(consumers, lambda: _settled(consumers), "first assignment")
        assert _grow(broker, ("t", 4)) == [0]
        _poll_until(consumers, lambda: _assigned(consumers) == {0, 1, 2, 3}, "new partitions")
        each = [{tp.partition for tp in c.assignment()} for c in consumers]
        assert sorted(map(len, each)) == [2, 2] and not each[0] & each[1]
    finally:
        for c in consumers:
            c.close()
