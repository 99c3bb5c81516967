"""Authorization: the ACL rules, and every request's check against a real PostgreSQL.

Each check has an allowed and a denied case; a denied request must write nothing, which
is asserted by counting the event tables (and the projections a request could touch)
before and after.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import text

from app.admin import AclBinding, AclBindingFilter, AdminClient, NewTopic
from app.broker import Broker
from app.broker.offsets import txn_offset_commit
from app.broker.produce import produce
from app.client.consumer import Consumer
from app.client.message import TopicPartition
from app.client.producer import Producer
from app.clock import ManualClock
from app.coordinator import machines as m
from app.coordinator.handlers import add_partitions_to_txn, write_txn_markers
from app.errors import KafkaError, KafkaException
from app.groups.membership import heartbeat, join_group, leave_group, sync_group
from app.groups.offsets import offset_commit, offset_fetch
from app.log.fetch import fetch, list_offsets
from app.log.inspect import abort_hanging
from app.log.topics import create_topic, delete_topic, describe_topic, list_topics, metadata
from app.protocol import (
    LATEST_TIMESTAMP,
    RECORD_VALUE,
    AddPartitionsToTxnRequest,
    FetchRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListOffsetsRequest,
    MetadataRequest,
    OffsetAndMetadata,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
    TxnOffsetCommitRequest,
    WriteTxnMarkersRequest,
)
from app.security import acls as acl_admin
from app.security import rules
from app.security.authorizer import authorize, denied_checks
from app.security.rules import AclBinding as Acl
from app.security.rules import Check
from app.settings import BrokerSettings
from tests.helpers.batches import produce_batch
from tests.helpers.txn_driver import TxnDriver, state_of

ALICE = "User:alice"
AUTH = BrokerSettings(authorization=1, group_initial_rebalance_delay_ms=0)  # groups form at once
EVENT_TABLES = (
    "records", "transaction_log", "offset_commit_log", "transactions", "group_offsets",
    "pending_txn_offsets", "consumer_groups", "group_members", "topics", "producer_ids",
)  # fmt: skip

# ---------------------------------------------------------------- the rules, pure


def _decide(acls: list[Acl], check: Check, principal: str = ALICE) -> bool:
    return not rules.denied(acls, principal, frozenset({"User:admin"}), [check])


def test_no_acl_means_no() -> None:
    assert not _decide([], Check(rules.READ, rules.TOPIC, "t"))


def test_deny_beats_allow() -> None:
    acls = [Acl(ALICE, "topic", "t", "read"), Acl("User:*", "topic", "t", "read", "deny")]
    assert not _decide(acls, Check("read", "topic", "t"))
    assert _decide(acls[:1], Check("read", "topic", "t"))


def test_wildcards_and_prefixes() -> None:
    everyone = [Acl("User:*", "topic", "*", "write")]
    assert _decide(everyone, Check("write", "topic", "anything"))
    assert _decide(everyone, Check("write", "topic", "x"), principal=rules.ANONYMOUS)
    assert not _decide(everyone, Check("write", "group", "anything"))
    prefixed = [Acl(ALICE, "topic", "orders-", "read", pattern_type="prefixed")]
    assert _decide(prefixed, Check("read", "topic", "orders-eu"))
    assert not _decide(prefixed, Check("read", "topic", "order"))
    literal = [Acl(ALICE, "topic", "orders-", "read")]
    assert not _decide(literal, Check("read", "topic", "orders-eu"))
    assert not _decide([Acl("User:bob", "topic", "*", "all")], Check("read", "topic", "t"))


def test_all_and_implied_describe() -> None:
    assert _decide([Acl(ALICE, "group", "g", "all")], Check("read", "group", "g"))
    for op in ("read", "write", "delete", "alter"):
        assert _decide([Acl(ALICE, "topic", "t", op)], Check("describe", "topic", "t"))
    assert not _decide([Acl(ALICE, "topic", "t", "create")], Check("describe", "topic", "t"))
    assert not _decide([Acl(ALICE, "topic", "t", "describe")], Check("read", "topic", "t"))
    # Only a deny of describe itself (or all) denies describe, as in Kafka.
    mixed = [Acl(ALICE, "topic", "t", "write"), Acl(ALICE, "topic", "t", "read", "deny")]
    assert _decide(mixed, Check("describe", "topic", "t"))
    assert not _decide(
        [*mixed, Acl(ALICE, "topic", "*", "all", "deny")], Check("describe", "topic", "t")
    )


def test_super_users_need_no_acl() -> None:
    deny_all = [Acl("User:*", "cluster", "kafka-cluster", "all", "deny")]
    assert _decide(deny_all, rules.cluster_check("alter"), principal="User:admin")
    assert not _decide(deny_all, rules.cluster_check("alter"))


def test_error_codes_name_the_resource() -> None:
    codes = {
        "topic": KafkaError.TOPIC_AUTHORIZATION_FAILED,
        "group": KafkaError.GROUP_AUTHORIZATION_FAILED,
        "transactional_id": KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        "cluster": KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    }
    for kind, code in codes.items():
        assert rules.refusal(ALICE, Check("read", kind, "x")).error.code() == code


@pytest.mark.parametrize(
    "bad",
    [
        Acl(ALICE, "table", "t", "read"),
        Acl(ALICE, "topic", "t", "drop"),
        Acl(ALICE, "topic", "t", "read", "maybe"),
        Acl(ALICE, "topic", "t", "read", pattern_type="regex"),
        Acl("alice", "topic", "t", "read"),
        Acl(ALICE, "topic", "", "read"),
        Acl(ALICE, "cluster", "other", "alter"),
        Acl(ALICE, "topic", "*", "read", pattern_type="prefixed"),
        Acl(ALICE, "topic", "t\x00", "read"),
        Acl("User:al\x00ice", "topic", "t", "read"),
    ],
)
def test_malformed_acls_are_refused(bad: Acl) -> None:
    with pytest.raises(KafkaException) as info:
        rules.validate_binding(bad)
    assert info.value.error.code() == KafkaError.INVALID_REQUEST


@pytest.mark.parametrize(
    "bad",
    [
        AclBindingFilter(resource_name="t\x00"),
        AclBindingFilter(principal="User:\x00"),
        AclBindingFilter(operation="drop"),
        AclBindingFilter(resource_name=b"t"),  # type: ignore[arg-type]
    ],
)
def test_malformed_acl_filters_are_refused(bad: AclBindingFilter) -> None:
    """Refused before the database, which cannot even compare a string holding NUL."""
    with pytest.raises(KafkaException) as info:
        acl_admin.validate_filter(bad)
    assert info.value.error.code() == KafkaError.INVALID_REQUEST


# ---------------------------------------------------------------- the handlers


class World:
    """An admin (a super user) and alice, both with authorization on, over one database."""

    def __init__(self, db_url: str) -> None:
        self.admin = Broker.connect(
            db_url, clock=ManualClock(), settings=AUTH, principal="User:admin"
        )
        self.alice = replace(self.admin, principal=ALICE)
        for name, n in (("t", 2), ("u", 1)):
            create_topic(self.admin, name, n)

    def grant(
        self, resource_type: str, name: str, *operations: str, permission: str = "allow"
    ) -> None:
        acl_admin.create_acls(
            self.admin,
            [Acl(ALICE, resource_type, name, op, permission) for op in operations],
        )

    def revoke(self, resource_type: str, name: str) -> None:
        acl_admin.delete_acls(self.admin, AclBindingFilter(ALICE, resource_type, name))

    def counts(self) -> dict[str, int]:
        with self.admin.engine.connect() as conn:
            return {
                t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one())
                for t in EVENT_TABLES
            }


@pytest.fixture
def world(db_url: str) -> World:
    return World(db_url)


@pytest.fixture
def unchanged(world: World) -> Iterator[None]:
    """Asserts at the end of the test that nothing was written since it began."""
    before = world.counts()
    yield
    assert world.counts() == before


def _produce(broker: Broker, topic: str = "t") -> int:
    return produce(broker, produce_batch("v", topic=topic)).error_code


def test_authorization_off_checks_nothing(db_url: str) -> None:
    broker = Broker.connect(db_url, settings=BrokerSettings(), principal=ALICE)
    create_topic(broker, "t")
    assert _produce(broker) == 0
    # No query at all: a connection that cannot be used is never touched.
    authorize(None, broker, "write", "topic", "t")  # type: ignore[arg-type]
    assert denied_checks(None, broker, [Check("write", "topic", "t")]) == []  # type: ignore[arg-type]


def test_super_users_are_decided_without_a_query(world: World) -> None:
    authorize(None, world.admin, "alter", "cluster", "kafka-cluster")  # type: ignore[arg-type]


def test_produce_needs_write_on_the_topic(world: World) -> None:
    before = world.counts()
    assert _produce(world.alice) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    world.grant("topic", "t", "read", "describe")
    assert _produce(world.alice) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert world.counts() == before
    world.grant("topic", "t", "write")
    assert _produce(world.alice) == 0
    assert _produce(world.alice, "u") == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_anonymous_is_a_principal_too(world: World) -> None:
    anonymous = replace(world.admin, principal=None)
    assert _produce(anonymous) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    acl_admin.create_acls(world.admin, [Acl("User:ANONYMOUS", "topic", "t", "write")])
    assert _produce(anonymous) == 0


def test_a_deny_for_everyone_beats_alices_allow(world: World) -> None:
    world.grant("topic", "t", "write")
    acl_admin.create_acls(world.admin, [Acl("User:*", "topic", "t", "write", "deny")])
    assert _produce(world.alice) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert _produce(world.admin) == 0


def test_fetch_and_list_offsets_need_read_or_describe(world: World) -> None:
    assert _produce(world.admin) == 0
    req = FetchRequest("t", 0, 0)
    offsets = ListOffsetsRequest("t", 0, LATEST_TIMESTAMP)
    r = fetch(world.alice, req)
    assert (r.error_code, r.records) == (KafkaError.TOPIC_AUTHORIZATION_FAILED, [])
    assert list_offsets(world.alice, offsets).error_code == KafkaError.TOPIC_AUTHORIZATION_FAILED
    world.grant("topic", "t", "write")
    assert fetch(world.alice, req).error_code == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert list_offsets(world.alice, offsets).offset == 1  # write implies describe
    world.grant("topic", "t", "read")
    assert [r[RECORD_VALUE] for r in fetch(world.alice, req).records] == [b"v"]


def _driver(world: World, tid: str = "tx") -> TxnDriver:
    return TxnDriver(world.alice, tid)


def test_init_producer_id_needs_write_on_the_transactional_id(
    world: World, unchanged: None
) -> None:
    assert _driver(world).init() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    world.grant("transactional_id", "tx", "describe", "read")
    assert _driver(world).init() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert state_of(world.admin, "tx") is None


def test_a_transaction_with_the_right_acls(world: World) -> None:
    world.grant("transactional_id", "tx", "write")
    world.grant("topic", "t", "write", "read")
    world.grant("group", "g", "read")
    d = _driver(world)
    assert d.init() == 0
    assert d.send("t", 0, "a").error_code == 0
    assert d.add_offsets("g") == 0
    commit = TxnOffsetCommitRequest(
        "tx", "g", d.producer_id, d.producer_epoch, {("t", 0): OffsetAndMetadata(1)}
    )
    assert txn_offset_commit(world.alice, commit).error_code == 0
    assert d.end(commit=True) == 0
    assert [r[RECORD_VALUE] for r in fetch(world.alice, FetchRequest("t", 0, 0)).records] == [b"a"]
    assert offset_fetch(world.alice, OffsetFetchRequest("g")).offsets[("t", 0)].offset == 1


def _began(world: World) -> TxnDriver:
    """alice's transaction 'tx', begun (one record on t-0), with every ACL it needs."""
    world.grant("transactional_id", "tx", "write")
    world.grant("topic", "t", "write")
    world.grant("group", "g", "read")
    d = _driver(world)
    assert d.init() == 0
    assert d.send("t", 0, "a").error_code == 0
    return d


def test_add_partitions_needs_write_on_the_id_and_the_topics(world: World) -> None:
    d = _began(world)
    before = world.counts()
    assert d.add(("t", 1), ("u", 0)) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    req = AddPartitionsToTxnRequest("tx", d.producer_id, d.producer_epoch, [("t", 1), ("u", 0)])
    results = add_partitions_to_txn(world.alice, req).results
    assert results == {
        ("t", 1): KafkaError.OPERATION_NOT_ATTEMPTED,
        ("u", 0): KafkaError.TOPIC_AUTHORIZATION_FAILED,
    }
    world.revoke("transactional_id", "tx")
    assert d.add(("t", 1)) == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert world.counts() == before
    world.grant("transactional_id", "tx", "write")
    assert d.add(("t", 1)) == 0


def test_transactional_produce_needs_write_on_the_id(world: World) -> None:
    d = _began(world)
    assert d.add(("t", 1)) == 0
    world.revoke("transactional_id", "tx")
    before = world.counts()
    r = d.send("t", 1, "b", register=False)
    assert r.error_code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert world.counts() == before
    world.grant("transactional_id", "tx", "write")
    assert d.send("t", 1, "b", register=False).error_code == 0


def test_add_offsets_needs_read_on_the_group(world: World) -> None:
    d = _began(world)
    before = world.counts()
    assert d.add_offsets("other") == KafkaError.GROUP_AUTHORIZATION_FAILED
    world.revoke("transactional_id", "tx")
    assert d.add_offsets("g") == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert world.counts() == before
    world.grant("transactional_id", "tx", "write")
    assert d.add_offsets("g") == 0


def test_end_txn_needs_write_on_the_id(world: World) -> None:
    d = _began(world)
    world.revoke("transactional_id", "tx")
    before = world.counts()
    assert d.end(commit=True) == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert world.counts() == before
    assert state_of(world.admin, "tx") == m.BEGIN
    world.grant("transactional_id", "tx", "write")
    assert d.end(commit=True) == 0


def test_txn_offset_commit_needs_the_id_the_group_and_the_topics(world: World) -> None:
    d = _began(world)
    assert d.add_offsets("g") == 0
    offsets = {("t", 0): OffsetAndMetadata(1)}

    def commit(group: str = "g") -> int:
        req = TxnOffsetCommitRequest("tx", group, d.producer_id, d.producer_epoch, offsets)
        return txn_offset_commit(world.alice, req).error_code

    before = world.counts()
    assert commit() == KafkaError.TOPIC_AUTHORIZATION_FAILED  # write is not read
    assert commit("h") == KafkaError.GROUP_AUTHORIZATION_FAILED
    world.grant("topic", "t", "read")
    world.revoke("transactional_id", "tx")
    assert commit() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert world.counts() == before
    world.grant("transactional_id", "tx", "write")
    assert commit() == 0


def _commit(world: World, group: str = "g", topic: str = "t") -> int:
    req = OffsetCommitRequest(group, {(topic, 0): OffsetAndMetadata(0)})
    r = offset_commit(world.alice, req)
    return r.error_code or r.results[(topic, 0)]  # a topic's refusal is its partitions'


def test_offset_commit_needs_read_on_the_group_and_the_topics(
    world: World, unchanged: None
) -> None:
    assert _commit(world) == KafkaError.GROUP_AUTHORIZATION_FAILED
    world.grant("group", "g", "read")
    assert _commit(world) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    world.grant("topic", "t", "describe", "write")
    assert _commit(world) == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_offset_commit_allowed(world: World) -> None:
    world.grant("group", "g", "read")
    world.grant("topic", "t", "read")
    assert _commit(world) == 0
    assert _commit(world, topic="u") == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_offset_fetch_needs_describe_on_the_group(world: World) -> None:
    r = offset_fetch(world.alice, OffsetFetchRequest("g"))
    assert (r.error_code, r.offsets) == (KafkaError.GROUP_AUTHORIZATION_FAILED, {})
    world.grant("group", "g", "describe")
    assert offset_fetch(world.alice, OffsetFetchRequest("g")).error_code == 0
    assert offset_fetch(world.alice, OffsetFetchRequest("h")).error_code != 0


def test_group_membership_needs_read_on_the_group(world: World) -> None:
    before = world.counts()
    join = JoinGroupRequest("g", "", ["t"], 10_000, client_id="c")
    assert join_group(world.alice, join).error_code == KafkaError.GROUP_AUTHORIZATION_FAILED
    denied = KafkaError.GROUP_AUTHORIZATION_FAILED
    assert heartbeat(world.alice, HeartbeatRequest("g", "m", 0)).error_code == denied
    assert sync_group(world.alice, SyncGroupRequest("g", "m", 0)).error_code == denied
    assert leave_group(world.alice, LeaveGroupRequest("g", "m")).error_code == denied
    assert world.counts() == before
    world.grant("group", "g", "read")
    joined = join_group(world.alice, join)
    assert joined.error_code == 0
    member, generation = joined.member_id, joined.generation_id
    assert sync_group(world.alice, SyncGroupRequest("g", member, generation)).error_code == 0
    assert heartbeat(world.alice, HeartbeatRequest("g", member, generation)).error_code == 0
    assert leave_group(world.alice, LeaveGroupRequest("g", member)).error_code == 0


def test_write_txn_markers_needs_cluster_action(world: World) -> None:
    d = _began(world)
    world.grant("topic", "t", "all")
    world.grant("transactional_id", "*", "all")
    req = WriteTxnMarkersRequest(d.producer_id, d.producer_epoch, 0, True, [("t", 0)])
    before = world.counts()
    assert write_txn_markers(world.alice, req).results == {
        ("t", 0): KafkaError.CLUSTER_AUTHORIZATION_FAILED
    }
    assert world.counts() == before
    world.grant("cluster", "kafka-cluster", "cluster_action")
    assert write_txn_markers(world.alice, req).results == {("t", 0): 0}


def test_write_txn_markers_is_also_allowed_by_alter_on_the_cluster(world: World) -> None:
    """Kafka checks Alter on the cluster first, ClusterAction only without it (KIP-664's
    Admin.abortTransaction sends WriteTxnMarkers from a client)."""
    d = _began(world)
    world.grant("topic", "t", "all")
    world.grant("transactional_id", "*", "all")
    req = WriteTxnMarkersRequest(d.producer_id, d.producer_epoch, 0, False, [("t", 0)])
    world.grant("cluster", "kafka-cluster", "describe")
    assert write_txn_markers(world.alice, req).results == {
        ("t", 0): KafkaError.CLUSTER_AUTHORIZATION_FAILED
    }
    world.grant("cluster", "kafka-cluster", "alter")
    assert write_txn_markers(world.alice, req).results == {("t", 0): 0}


def test_aborting_a_hanging_transaction_writes_a_marker_so_needs_cluster_action(
    world: World,
) -> None:
    _began(world)
    before = world.counts()
    with pytest.raises(KafkaException) as info:
        abort_hanging(world.alice, "t", 0, 0)
    assert info.value.error.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert world.counts() == before
    world.grant("cluster", "kafka-cluster", "cluster_action")
    assert abort_hanging(world.alice, "t", 0, 0)


def _raises(code: int, fn: Callable[[], Any]) -> None:
    with pytest.raises(KafkaException) as info:
        fn()
    assert info.value.error.code() == code


def test_topic_create_and_delete(world: World) -> None:
    before = world.counts()
    _raises(KafkaError.TOPIC_AUTHORIZATION_FAILED, lambda: create_topic(world.alice, "new"))
    _raises(KafkaError.TOPIC_AUTHORIZATION_FAILED, lambda: delete_topic(world.alice, "t"))
    assert world.counts() == before
    acl_admin.create_acls(
        world.admin, [Acl(ALICE, "topic", "new-", "all", pattern_type="prefixed")]
    )
    create_topic(world.alice, "new-1")
    _raises(KafkaError.TOPIC_AUTHORIZATION_FAILED, lambda: create_topic(world.alice, "new"))
    delete_topic(world.alice, "new-1")
    world.grant("cluster", "kafka-cluster", "create", "delete")
    create_topic(world.alice, "new")
    delete_topic(world.alice, "t")
    assert sorted(i.topic for i in list_topics(world.admin)) == ["new", "u"]


def test_managing_acls_needs_alter_on_the_cluster(world: World) -> None:
    acl = Acl(ALICE, "topic", "t", "read")
    before = world.counts()
    _raises(
        KafkaError.CLUSTER_AUTHORIZATION_FAILED, lambda: acl_admin.create_acls(world.alice, [acl])
    )
    _raises(
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        lambda: acl_admin.delete_acls(world.alice, AclBindingFilter()),
    )
    _raises(
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        lambda: acl_admin.describe_acls(world.alice, AclBindingFilter()),
    )
    assert world.counts() == before
    assert acl_admin.describe_acls(world.admin, AclBindingFilter()) == []
    world.grant("cluster", "kafka-cluster", "alter")
    acl_admin.create_acls(world.alice, [acl, acl])  # twice is once
    assert acl in acl_admin.describe_acls(world.alice, AclBindingFilter(resource_type="topic"))
    assert acl_admin.delete_acls(world.alice, AclBindingFilter(resource_name="t")) == [acl]


# ---------------------------------------------------------------- through the clients


def test_clients_end_to_end(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIP98_AUTHORIZATION", "1")
    monkeypatch.setenv("KIP98_CLIENT_COORDINATOR_LOOP", "0")
    base = {"database.url": db_url}
    with AdminClient({**base, "principal": "User:admin"}) as admin:
        admin.create_topics([NewTopic("orders", 1)])["orders"].result()
        bindings = [
            AclBinding(ALICE, "topic", "orders", "write"),
            AclBinding(ALICE, "topic", "orders", "read"),
            AclBinding(ALICE, "transactional_id", "alice-", "write", pattern_type="prefixed"),
            AclBinding(ALICE, "group", "alice-group", "read"),
        ]
        for fut in admin.create_acls(bindings).values():
            fut.result()
        listed = admin.describe_acls(AclBindingFilter(principal=ALICE)).result()
        assert sorted(listed, key=str) == sorted(bindings, key=str)

    alice = {**base, "principal": ALICE}
    producer = Producer({**alice, "transactional.id": "alice-1"})
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce("orders", b"paid")
    producer.commit_transaction(60)
    producer.close()

    consumer = Consumer({**alice, "group.id": "alice-group", "auto.offset.reset": "earliest"})
    consumer.subscribe(["orders"])
    msg = None
    deadline = time.monotonic() + 60
    while msg is None and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
    assert msg is not None and msg.error() is None and msg.value() == b"paid"
    consumer.commit(msg, asynchronous=False)
    consumer.close()

    mallory = {**base, "principal": "User:mallory"}
    with pytest.raises(KafkaException) as info:
        Producer({**mallory, "transactional.id": "alice-1"}).init_transactions(10)
    assert info.value.error.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    reports: list[KafkaError | None] = []
    plain = Producer(mallory)
    plain.produce("orders", b"forged", on_delivery=lambda err, _msg: reports.append(err))
    plain.flush(60)
    plain.close()
    assert [e.code() if e else 0 for e in reports] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]

    snoop = Consumer({**mallory, "group.id": "mallory", "enable.partition.eof": True})
    snoop.assign([TopicPartition("orders", 0, 0)])
    err = None
    for _ in range(20):
        m = snoop.poll(0.2)
        if m is not None and m.error() is not None:
            err = m.error()
            break
    snoop.close()
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    with AdminClient(base) as anonymous:
        with pytest.raises(KafkaException) as info:
            anonymous.describe_acls().result()
        assert info.value.error.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_cli_acls(db_url: str) -> None:
    from tests.helpers.cli_runner import run_kip98

    env = {"KIP98_AUTHORIZATION": "1", "KIP98_PRINCIPAL": "User:admin"}
    added = run_kip98(
        "acls", "add", "--principal", ALICE, "--operation", "read", "--operation", "write",
        "--topic", "orders-", "--prefixed", env=env,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    listed = run_kip98("acls", "list", "--output", "json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert {(a["operation"], a["pattern_type"]) for a in json.loads(listed.stdout)} == {
        ("read", "prefixed"),
        ("write", "prefixed"),
    }
    refused = run_kip98("acls", "list", env={**env, "KIP98_PRINCIPAL": ALICE})
    assert refused.returncode != 0
    assert "CLUSTER_AUTHORIZATION_FAILED" in refused.stderr
    both = run_kip98("acls", "add", "--principal", ALICE, "--operation", "read", "--topic",
                     "t", "--group", "g", env=env)  # fmt: skip
    assert both.returncode != 0 and "only one of" in both.stderr
    everything = run_kip98("acls", "remove", "--principal", ALICE, env=env)
    assert everything.returncode != 0 and "give one of --topic" in everything.stderr
    removed = run_kip98(
        "acls", "remove", "--principal", ALICE, "--operation", "write", "--topic", "orders-",
        "--prefixed", env=env,
    )  # fmt: skip
    assert removed.returncode == 0 and "Removed" in removed.stdout
    table = run_kip98("acls", "list", env=env)
    assert "read" in table.stdout and "write" not in table.stdout


def test_metadata_and_listings_show_only_describable_topics(world: World) -> None:
    """As Kafka's Metadata: a listing leaves out what the principal may not describe; a
    topic asked for by name is TOPIC_AUTHORIZATION_FAILED, existing or not."""
    everything = metadata(world.admin, MetadataRequest(None))
    assert [t.topic for t in everything.topics] == ["t", "u"]
    assert metadata(world.alice, MetadataRequest(None)).topics == []
    assert list_topics(world.alice) == []
    asked = metadata(world.alice, MetadataRequest(["t", "nowhere"]))
    assert [(t.topic, t.error_code) for t in asked.topics] == [
        ("t", KafkaError.TOPIC_AUTHORIZATION_FAILED),
        ("nowhere", KafkaError.TOPIC_AUTHORIZATION_FAILED),
    ]
    _raises(KafkaError.TOPIC_AUTHORIZATION_FAILED, lambda: describe_topic(world.alice, "t"))

    world.grant("topic", "t", "read")  # Read implies Describe
    assert [t.topic for t in metadata(world.alice, MetadataRequest(None)).topics] == ["t"]
    assert [i.topic for i in list_topics(world.alice)] == ["t"]
    assert describe_topic(world.alice, "t").num_partitions == 2
    acl_admin.create_acls(world.admin, [Acl(ALICE, "topic", "*", "describe")])
    asked = metadata(world.alice, MetadataRequest(["u", "nowhere"]))
    assert [(t.topic, t.error_code, t.num_partitions) for t in asked.topics] == [
        ("u", KafkaError.NO_ERROR, 1),
        ("nowhere", KafkaError.UNKNOWN_TOPIC_OR_PARTITION, 0),
    ]
