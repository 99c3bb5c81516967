"""DeleteGroups (42) and OffsetDelete (47): an empty group deleted with its offsets; a
group's committed offsets of partitions its members are not subscribed to forgotten.
Each forgotten offset an event the rebuild folds. The native AdminClient, confluent-kafka
and kafka-python against a real ``kip98 serve``."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient as CkAdmin
from kafka import TopicPartition as KpTp
from kafka.admin import KafkaAdminClient
from sqlalchemy import text

from app.admin import AdminClient
from app.broker import Broker
from app.client import KafkaError, KafkaException, TopicPartition
from app.groups.offsets import offset_commit
from app.groups.rebuild import compute_group_offsets, live_group_offsets
from app.protocol import (
    DeleteGroupsRequest,
    JoinGroupRequest,
    OffsetAndMetadata,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetFetchRequest,
)
from app.security import acls as acl_admin
from app.security.rules import AclBinding as Acl
from app.settings import BrokerSettings
from tests.helpers.txn_driver import TxnDriver
from tests.helpers.wire_client import serving

pytestmark = pytest.mark.broker(topics={"t": 2, "u": 1}, manual_clock=True)


def _commit(broker: Broker, group: str, *tps: tuple[str, int]) -> None:
    r = offset_commit(broker, OffsetCommitRequest(group, {tp: OffsetAndMetadata(1) for tp in tps}))
    assert r.error_code == 0 and set(r.results.values()) == {0}


def _offsets(broker: Broker, group: str) -> dict[tuple[str, int], int]:
    got = broker.handle(OffsetFetchRequest(group))
    return {tp: om.offset for tp, om in got.offsets.items()}


def _folds(broker: Broker) -> None:
    with broker.engine.connect() as conn:
        assert compute_group_offsets(conn) == live_group_offsets(conn)


def _deleted(broker: Broker, *groups: str) -> list[int]:
    return [r.error_code for r in broker.handle(DeleteGroupsRequest(list(groups))).results]


def test_only_an_empty_group_is_deleted(broker: Broker, db_url: str) -> None:
    """A group known by its offsets only, or by a row whose members left, is deleted with
    its offsets; one with a live member, or with offsets a transaction holds pending, is
    NON_EMPTY_GROUP; an unknown one GROUP_ID_NOT_FOUND; Delete on the group needed."""
    _commit(broker, "offsets-only", ("t", 0), ("u", 0))
    joined = broker.handle(JoinGroupRequest("busy", "", ["t"], 10_000))
    _commit(broker, "busy", ("t", 1))
    d = TxnDriver(broker, "tx")
    d.init()
    d.send("u", 0, "x")
    d.add_offsets("pending")
    from app.broker.offsets import txn_offset_commit
    from app.protocol import TxnOffsetCommitRequest

    held = TxnOffsetCommitRequest("tx", "pending", d.producer_id, d.producer_epoch,
                                  {("t", 0): OffsetAndMetadata(3)})  # fmt: skip
    assert txn_offset_commit(broker, held).error_code == 0
    assert _deleted(broker, "offsets-only", "busy", "pending", "nobody", "") == [
        0, KafkaError.NON_EMPTY_GROUP, KafkaError.NON_EMPTY_GROUP, KafkaError.GROUP_ID_NOT_FOUND,
        KafkaError.INVALID_GROUP_ID,
    ]  # fmt: skip
    assert _offsets(broker, "offsets-only") == {} and _offsets(broker, "busy") == {("t", 1): 1}
    broker.clock.advance(20_000)  # type: ignore[attr-defined]  # the member's session ends
    assert joined.member_id and _deleted(broker, "busy") == [0]
    with broker.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM consumer_groups")).scalar() == 0
        kinds = conn.execute(text("SELECT kind FROM offset_commit_log ORDER BY event_id"))
        assert [k for (k,) in kinds][-3:] == ["offset_delete"] * 3
    _folds(broker)
    d.end(commit=True)
    assert _deleted(broker, "pending") == [0]
    _folds(broker)

    admin = Broker.connect(db_url, settings=BrokerSettings(authorization=1),
                           principal="User:admin")  # fmt: skip
    alice = replace(admin, principal="User:alice")
    _commit(admin, "g", ("t", 0))
    assert _deleted(alice, "g") == [KafkaError.GROUP_AUTHORIZATION_FAILED]
    acl_admin.create_acls(admin, [Acl("User:alice", "group", "g", "delete")])
    assert _deleted(alice, "g") == [0]


def test_offsets_of_unsubscribed_topics_are_forgotten(broker: Broker) -> None:
    _commit(broker, "g", ("t", 0), ("t", 1), ("u", 0))
    broker.handle(JoinGroupRequest("g", "", ["t"], 10_000))
    answer = broker.handle(
        OffsetDeleteRequest("g", [("u", 0), ("t", 0), ("u", 5), ("nope", 0), ("u", 0)])
    )
    assert answer.error_code == 0
    assert answer.results == {
        ("u", 0): 0, ("t", 0): KafkaError.GROUP_SUBSCRIBED_TO_TOPIC,
        ("u", 5): KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
        ("nope", 0): KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
    }  # fmt: skip
    assert _offsets(broker, "g") == {("t", 0): 1, ("t", 1): 1}
    unknown = broker.handle(OffsetDeleteRequest("nobody", [("t", 0)]))
    assert unknown.error_code == KafkaError.GROUP_ID_NOT_FOUND
    _folds(broker)


def test_native_admin_client(db_url: str, broker: Broker) -> None:
    _commit(broker, "a", ("t", 0), ("u", 0))
    _commit(broker, "b", ("t", 0))
    with AdminClient({"database.url": db_url}) as admin:
        futures = admin.delete_consumer_group_offsets("a", [TopicPartition("u", 0)])
        assert futures[TopicPartition("u", 0)].result() is None
        assert [tp.topic for tp in admin.list_consumer_group_offsets("a")] == ["t"]
        deleted = admin.delete_consumer_groups(["b", "c"])
        assert deleted["b"].result() is None
        with pytest.raises(KafkaException) as unknown:
            deleted["c"].result()
        assert unknown.value.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND


def _consumed(consumer: Any, n: int) -> None:
    got = 0
    deadline = time.monotonic() + 30
    while got < n:
        assert time.monotonic() < deadline
        m = consumer.poll(0.2)
        if m is not None and m.error() is None:
            got += 1


def test_wire_clients_delete_groups_and_offsets(db_url: str, broker: Broker) -> None:
    """A librdkafka consumer commits and stays: its group cannot be deleted, its topic's
    offsets not forgotten; once it closes, confluent-kafka deletes the group. kafka-python
    forgets another group's offsets of a topic it no longer reads, and deletes it."""
    from app.protocol import ProduceRequest, RecordIn

    broker.handle(ProduceRequest("t", 0, [RecordIn(None, b"x", 0)] * 3))
    with serving(db_url) as server:
        admin = CkAdmin({"bootstrap.servers": server})
        consumer = ck.Consumer({"bootstrap.servers": server, "group.id": "live",
                                "auto.offset.reset": "earliest"})  # fmt: skip
        try:
            consumer.subscribe(["t"])
            _consumed(consumer, 3)
            consumer.commit(asynchronous=False)
            [busy] = admin.delete_consumer_groups(["live"]).values()
            with pytest.raises(ck.KafkaException) as refused:
                busy.result(30)
            assert refused.value.args[0].code() == ck.KafkaError.NON_EMPTY_GROUP
            kp = KafkaAdminClient(bootstrap_servers=server)
            try:
                subscribed = kp.delete_group_offsets("live", [KpTp("t", 0)])
                # kafka-python answers each partition with its error's class
                assert [e.__name__ for e in subscribed.values()] == ["GroupSubscribedToTopicError"]
            finally:
                kp.close()
        finally:
            consumer.close()
        [done] = admin.delete_consumer_groups(["live"]).values()
        assert done.result(30) is None

        _commit(broker, "old", ("t", 0), ("u", 0))
        kp = KafkaAdminClient(bootstrap_servers=server)
        try:
            forgotten = kp.delete_group_offsets("old", [KpTp("u", 0)])
            assert [e.__name__ for e in forgotten.values()] == ["NoError"]
            kp.delete_groups(["old"])
        finally:
            kp.close()
    assert _offsets(broker, "live") == {} and _offsets(broker, "old") == {}
    with broker.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM consumer_groups")).scalar() == 0
    _folds(broker)
