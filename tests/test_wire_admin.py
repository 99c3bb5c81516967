"""Kafka's admin APIs over ``kip98 serve``: confluent-kafka's AdminClient (librdkafka picks
its versions: CreateTopics v4, DeleteTopics v4, DescribeConfigs v1, AlterConfigs v2,
IncrementalAlterConfigs v1, the ACL APIs v2), and raw kio requests at every version the
server advertises, including the transaction tooling confluent-kafka does not expose."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kio.index import load_request_schema

from app.broker import Broker
from app.errors import KafkaError
from app.protocol import (
    AclBindingFilter as NativeFilter,
)
from app.protocol import (
    CreatableTopic,
    CreateTopicsRequest,
    DescribeAclsRequest,
    ListTopicsRequest,
    MetadataRequest,
)
from app.server.apis import APIS
from app.server.codec import build
from tests.helpers.txn_driver import TxnDriver
from tests.helpers.wire_client import exchange, serving

pytestmark = pytest.mark.broker(topics={"t": 2})


@pytest.fixture
def admin(server: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": server})


def _topics(broker: Broker) -> dict[str, Any]:
    return {i.topic: i for i in broker.handle(ListTopicsRequest()).topics}


def _code(future: Any) -> int:
    exc = future.exception(30)
    return 0 if exc is None else int(exc.args[0].code())


def _codes(futures: dict[Any, Any]) -> dict[Any, int]:
    return {key: _code(f) for key, f in futures.items()}


# ---------------------------------------------------------------- confluent-kafka


def test_create_and_delete_topics(admin: AdminClient, broker: Broker) -> None:
    created = admin.create_topics(
        [NewTopic("a", 3, config={"cleanup.policy": "compact"}), NewTopic("b", 1)]
    )
    assert _codes(created) == {"a": 0, "b": 0}
    topics = _topics(broker)
    assert (topics["a"].num_partitions, topics["a"].config) == (3, {"cleanup.policy": "compact"})
    assert topics["b"].num_partitions == 1

    refused = admin.create_topics(
        [
            NewTopic("a", 1),
            NewTopic("c", 0),
            NewTopic("bad name", 1),
            NewTopic("d", 1, config={"retention.ms": "soon"}),
            NewTopic("e", 1, config={"no.such.config": "1"}),
        ]
    )
    assert _codes(refused) == {
        "a": KafkaError.TOPIC_ALREADY_EXISTS,
        "c": KafkaError.INVALID_PARTITIONS,
        "bad name": KafkaError.INVALID_TOPIC_EXCEPTION,
        "d": KafkaError.INVALID_CONFIG,
        "e": KafkaError.INVALID_CONFIG,
    }
    assert _code(admin.create_topics([NewTopic("f", 2)], validate_only=True)["f"]) == 0
    assert sorted(_topics(broker)) == ["a", "b", "t"]  # nothing refused or validated was made
    assert _topics(broker)["a"].num_partitions == 3

    deleted = admin.delete_topics(["b", "zz"])
    assert _codes(deleted) == {"b": 0, "zz": KafkaError.UNKNOWN_TOPIC_OR_PARTITION}
    assert sorted(_topics(broker)) == ["a", "t"]


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning")
def test_describe_and_alter_configs(admin: AdminClient, broker: Broker) -> None:
    def described() -> dict[str, ConfigEntry]:
        resource = ConfigResource("topic", "t")
        entries: dict[str, ConfigEntry] = admin.describe_configs([resource])[resource].result(30)
        return entries

    entries = described()
    assert entries["retention.ms"].value == "604800000"
    assert ConfigSource(entries["retention.ms"].source) == ConfigSource.DEFAULT_CONFIG
    assert entries["retention.ms"].is_default

    def alter(**configs: str) -> int:
        resource = ConfigResource("topic", "t", set_config=configs)
        return _code(admin.alter_configs([resource])[resource])

    assert alter(**{"retention.ms": "1000", "cleanup.policy": "compact"}) == 0
    assert alter(**{"retention.bytes": "5000"}) == 0
    assert _topics(broker)["t"].config == {"retention.bytes": 5000}  # AlterConfigs replaces
    assert alter(**{"retention.bytes": "lots"}) == KafkaError.INVALID_CONFIG
    entries = described()
    assert entries["retention.bytes"].value == "5000"
    assert ConfigSource(entries["retention.bytes"].source) == ConfigSource.DYNAMIC_TOPIC_CONFIG
    assert not entries["retention.bytes"].is_default

    def incremental(topic: str, *ops: tuple[str, str | None, AlterConfigOpType]) -> int:
        entries = [ConfigEntry(n, v, incremental_operation=op) for n, v, op in ops]
        resource = ConfigResource("topic", topic, incremental_configs=entries)
        return _code(admin.incremental_alter_configs([resource])[resource])

    set_, delete, append = AlterConfigOpType.SET, AlterConfigOpType.DELETE, AlterConfigOpType.APPEND
    assert incremental("t", ("retention.ms", "5", set_), ("retention.bytes", None, delete)) == 0
    assert incremental("t", ("cleanup.policy", "compact", append)) == 0
    assert _topics(broker)["t"].config == {"retention.ms": 5, "cleanup.policy": "compact,delete"}
    assert incremental("t", ("retention.ms", "7", set_), ("cleanup.policy", "x", set_)) == (
        KafkaError.INVALID_CONFIG
    )
    assert incremental("t", ("retention.ms", "7", append)) == KafkaError.INVALID_CONFIG
    assert incremental("nope", ("retention.ms", "7", set_)) == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    assert _topics(broker)["t"].config == {"retention.ms": 5, "cleanup.policy": "compact,delete"}
    missing = ConfigResource("topic", "nope")
    assert _code(admin.describe_configs([missing])[missing]) == (
        KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    )


def _acl(
    operation: AclOperation = AclOperation.READ,
    host: str = "*",
    name: str = "t",
    pattern: ResourcePatternType = ResourcePatternType.LITERAL,
    permission: AclPermissionType = AclPermissionType.ALLOW,
) -> AclBinding:
    return AclBinding(ResourceType.TOPIC, name, pattern, "User:alice", host, operation, permission)


def _any_acl(**overrides: Any) -> AclBindingFilter:
    fields: dict[str, Any] = {
        "restype": ResourceType.ANY, "name": None, "resource_pattern_type": ResourcePatternType.ANY,
        "principal": None, "host": None, "operation": AclOperation.ANY,
        "permission_type": AclPermissionType.ANY, **overrides,
    }  # fmt: skip
    return AclBindingFilter(**fields)


def test_create_describe_and_delete_acls(admin: AdminClient, broker: Broker) -> None:
    read = _acl()
    deny = _acl(AclOperation.WRITE, name="p-", pattern=ResourcePatternType.PREFIXED,
                permission=AclPermissionType.DENY)  # fmt: skip
    assert _codes(admin.create_acls([read, deny])) == {read: 0, deny: 0}
    native = broker.handle(DescribeAclsRequest(NativeFilter())).acls
    assert {(a.operation, a.permission, a.pattern_type, a.resource_name) for a in native} == {
        ("read", "allow", "literal", "t"),
        ("write", "deny", "prefixed", "p-"),
    }
    # An ACL for one host, or of an operation kip98 has not, is refused; nothing is stored.
    for refused in (_acl(host="10.0.0.1"), _acl(AclOperation.IDEMPOTENT_WRITE)):
        assert _codes(admin.create_acls([refused])) == {refused: KafkaError.INVALID_REQUEST}
    assert len(broker.handle(DescribeAclsRequest(NativeFilter())).acls) == 2

    assert sorted(map(str, admin.describe_acls(_any_acl()).result(30))) == sorted(
        map(str, [read, deny])
    )
    only_deny = _any_acl(permission_type=AclPermissionType.DENY)
    assert admin.describe_acls(only_deny).result(30) == [deny]
    assert admin.describe_acls(_any_acl(host="10.0.0.1")).result(30) == []

    removed = admin.delete_acls([_any_acl(operation=AclOperation.READ)])
    assert [list(f.result(30)) for f in removed.values()] == [[read]]
    assert admin.describe_acls(_any_acl()).result(30) == [deny]


def test_admin_apis_are_authorized_as_the_native_ones(db_url: str, broker: Broker) -> None:
    env = {"KIP98_AUTHORIZATION": "1", "KIP98_PRINCIPAL": "User:alice"}
    with serving(db_url, env=env) as address:
        alice = AdminClient({"bootstrap.servers": address})
        created = alice.create_topics([NewTopic("u", 1)])
        assert _codes(created) == {"u": KafkaError.TOPIC_AUTHORIZATION_FAILED}
        acl = _acl()
        assert _codes(alice.create_acls([acl])) == {acl: KafkaError.CLUSTER_AUTHORIZATION_FAILED}
        # (confluent-kafka's describe_acls leaves DescribeAcls' error code out of its future)
        described = _send(address, 29, 2, _filter_values())
        assert described.error_code.value == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert sorted(_topics(broker)) == ["t"]
    assert broker.handle(DescribeAclsRequest(NativeFilter())).acls == []


# ---------------------------------------------------------------- every advertised version


def _versions(api_key: int) -> Iterator[int]:
    low, high, _ = APIS[api_key]
    return iter(range(low, high + 1))


def _send(server: str, api_key: int, version: int, values: dict[str, Any]) -> Any:
    """A request built from plain values as the server builds its responses (fields the
    version lacks are left out)."""
    return exchange(server, api_key, version, build(load_request_schema(api_key, version), values))


def _topic(name: str, partitions: int = 2, **configs: str) -> dict[str, Any]:
    return {"name": name, "num_partitions": partitions, "replication_factor": 1,
            "assignments": [], "configs": [{"name": k, "value": v} for k, v in configs.items()]}  # fmt: skip


def test_create_topics_at_every_version(server: str, broker: Broker) -> None:
    for v in _versions(19):
        answer = _send(server, 19, v, {"topics": [
            _topic(f"c{v}", 2, **{"cleanup.policy": "compact"}), _topic("t", 1),
            _topic(f"d{v}", 0), _topic(f"e{v}", 1, **{"retention.ms": "x"}),
            {**_topic(f"f{v}", -1), "assignments": [
                {"partition_index": 0, "broker_ids": [0]},
                {"partition_index": 1, "broker_ids": [0]}]},
            {**_topic(f"g{v}", -1), "assignments": [{"partition_index": 5, "broker_ids": [0]}]},
            _topic(f"h{v}", -1),
        ], "timeout": 5000, "validate_only": False})  # fmt: skip
        codes = {t.name: t.error_code.value for t in answer.topics}
        assert codes == {
            f"c{v}": 0, "t": KafkaError.TOPIC_ALREADY_EXISTS, f"d{v}": KafkaError.INVALID_PARTITIONS,
            f"e{v}": KafkaError.INVALID_CONFIG, f"f{v}": 0,
            f"g{v}": KafkaError.INVALID_REPLICA_ASSIGNMENT, f"h{v}": 0,
        }, v  # fmt: skip
        created = answer.topics[0]
        if v >= 5:
            assert created.num_partitions == 2
            assert {c.name: c.value for c in created.configs}["cleanup.policy"] == "compact"
        if v >= 7:
            [meta] = broker.handle(MetadataRequest([f"c{v}"])).topics
            assert str(created.topic_id) == meta.topic_id
        topics = _topics(broker)
        assert (topics[f"f{v}"].num_partitions, topics[f"h{v}"].num_partitions) == (2, 1)
        assert not {f"d{v}", f"e{v}", f"g{v}"} & set(topics)
    twice = _send(server, 19, 4, {"topics": [_topic("x"), _topic("x")], "timeout": 5000})
    assert [(t.name, t.error_code.value) for t in twice.topics] == [
        ("x", KafkaError.INVALID_REQUEST)
    ]
    checked = _send(server, 19, 4, {"topics": [_topic("y")], "validate_only": True})
    assert checked.topics[0].error_code.value == 0 and "x" not in _topics(broker)
    assert "y" not in _topics(broker)


def test_delete_topics_at_every_version(server: str, broker: Broker) -> None:
    for v in _versions(20):
        broker.handle(CreateTopicsRequest([CreatableTopic(f"d{v}", 1)]))
        answer = _send(server, 20, v, {"topic_names": [f"d{v}", "zz"],
                                       "topics": [{"name": f"d{v}"}, {"name": "zz"}],
                                       "timeout": 5000})  # fmt: skip
        assert [(r.name, r.error_code.value) for r in answer.responses] == [
            (f"d{v}", 0), ("zz", KafkaError.UNKNOWN_TOPIC_OR_PARTITION)
        ], v  # fmt: skip
        assert f"d{v}" not in _topics(broker)
    # v6 deletes by topic id too.
    [meta] = broker.handle(MetadataRequest(["t"])).topics
    assert meta.topic_id is not None
    topic_id = uuid.UUID(meta.topic_id)
    answer = _send(server, 20, 6, {"topics": [{"name": None, "topic_id": topic_id},
                                              {"name": None, "topic_id": uuid.uuid4()}],
                                   "timeout": 5000})  # fmt: skip
    assert [(r.name, r.error_code.value) for r in answer.responses] == [
        ("t", 0), (None, KafkaError.UNKNOWN_TOPIC_ID)
    ]  # fmt: skip
    assert _topics(broker) == {}


def test_describe_and_alter_configs_at_every_version(server: str, broker: Broker) -> None:
    for v in _versions(33):
        answer = _send(server, 33, v, {"resources": [
            {"resource_type": 2, "resource_name": "t", "configs": [
                {"name": "retention.ms", "value": str(1000 + v)}]},
            {"resource_type": 2, "resource_name": "t2", "configs": []},
            {"resource_type": 2, "resource_name": "t", "configs": [
                {"name": "retention.ms", "value": "1"}, {"name": "retention.ms", "value": "2"}]},
        ], "validate_only": False})  # fmt: skip
        assert [r.error_code.value for r in answer.responses] == [
            0, KafkaError.UNKNOWN_TOPIC_OR_PARTITION, KafkaError.INVALID_REQUEST
        ], v  # fmt: skip
        assert _topics(broker)["t"].config == {"retention.ms": 1000 + v}
    for v in _versions(44):
        answer = _send(server, 44, v, {"resources": [
            {"resource_type": 2, "resource_name": "t", "configs": [
                {"name": "cleanup.policy", "config_operation": 2, "value": "compact"},
                {"name": "retention.ms", "config_operation": 1, "value": None}]},
            # A broker config: read-only here, refused as Kafka refuses those.
            {"resource_type": 4, "resource_name": "0", "configs": [
                {"name": "num.partitions", "config_operation": 0, "value": "2"}]},
        ], "validate_only": v == 0})  # fmt: skip
        assert [r.error_code.value for r in answer.responses] == [0, KafkaError.INVALID_REQUEST], v
        expected = {"retention.ms": 1002} if v == 0 else {"cleanup.policy": "compact,delete"}
        assert _topics(broker)["t"].config == expected, v
    for v in _versions(32):
        answer = _send(server, 32, v, {"resources": [
            {"resource_type": 2, "resource_name": "t", "configuration_keys": None},
            {"resource_type": 2, "resource_name": "t", "configuration_keys": ["retention.ms"]},
            {"resource_type": 2, "resource_name": "zz", "configuration_keys": None},
        ], "include_synonyms": True})  # fmt: skip
        everything, one, missing = answer.results
        assert (everything.error_code.value, one.error_code.value) == (0, 0)
        assert missing.error_code.value == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
        configs = {c.name: (c.value, c.config_source) for c in everything.configs}
        assert configs["cleanup.policy"] == (
            "compact,delete",
            ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
        )
        assert configs["retention.ms"] == ("604800000", ConfigSource.DEFAULT_CONFIG.value)
        assert [c.name for c in one.configs] == ["retention.ms"]


def _acl_values(**overrides: Any) -> dict[str, Any]:
    return {"resource_type": 2, "resource_name": "t", "resource_pattern_type": 3,
            "principal": "User:alice", "host": "*", "operation": 3, "permission_type": 3,
            **overrides}  # fmt: skip


def _filter_values(**overrides: Any) -> dict[str, Any]:
    return {"resource_type_filter": 1, "resource_name_filter": None, "pattern_type_filter": 1,
            "principal_filter": None, "host_filter": None, "operation": 1,
            "permission_type": 1, **overrides}  # fmt: skip


def test_acl_apis_at_every_version(server: str, broker: Broker) -> None:
    for v in _versions(30):
        name = f"t{v}"
        answer = _send(server, 30, v, {"creations": [_acl_values(resource_name=name),
                                                     _acl_values(resource_name=name, operation=4)]})  # fmt: skip
        assert [r.error_code.value for r in answer.results] == [0, 0], v
        refused = _send(server, 30, v, {"creations": [_acl_values(resource_name="x"),
                                                      _acl_values(operation=12)]})  # fmt: skip
        assert [r.error_code.value for r in refused.results] == [KafkaError.INVALID_REQUEST] * 2
    for v in _versions(29):
        answer = _send(
            server, 29, v, _filter_values(resource_name_filter="t1", pattern_type_filter=3)
        )
        assert answer.error_code.value == 0
        [resource] = answer.resources
        assert (resource.resource_type, resource.resource_name, resource.pattern_type) == (
            2,
            "t1",
            3,
        )
        assert sorted(a.operation for a in resource.acls) == [3, 4]
        # MATCH: the literal and prefixed ACLs that decide about the name (test_acl_match.py)
        matching = _send(server, 29, v, _filter_values(resource_name_filter="t1", pattern_type_filter=2))  # fmt: skip
        assert [r.resource_name for r in matching.resources] == ["t1"]
    for v in _versions(31):
        answer = _send(server, 31, v, {"filters": [
            _filter_values(resource_name_filter=f"t{v}", operation=3),
            _filter_values(host_filter="10.0.0.1"),
            _filter_values(operation=0),
        ]})  # fmt: skip
        deleted, other_host, unknown = answer.filter_results
        assert [(m.resource_name, m.operation) for m in deleted.matching_acls] == [(f"t{v}", 3)]
        assert (other_host.error_code.value, other_host.matching_acls) == (0, ())
        assert unknown.error_code.value == KafkaError.INVALID_REQUEST
    left = broker.handle(DescribeAclsRequest(NativeFilter())).acls
    assert sorted((a.resource_name, a.operation) for a in left) == [
        (f"t{v}", "write") for v in _versions(30)
    ]


def test_transaction_tooling_at_every_version(server: str, broker: Broker) -> None:
    d = TxnDriver(broker, "tx")
    d.init()
    d.send("t", 1, "v")
    idle = TxnDriver(broker, "idle")
    idle.init()
    for v in _versions(66):
        values = {"state_filters": [], "producer_id_filters": [], "duration_filter": -1}
        everything = _send(server, 66, v, values)
        assert [(t.transactional_id, t.transaction_state) for t in everything.transaction_states] == [
            ("idle", "Empty"), ("tx", "Ongoing")
        ]  # fmt: skip
        ongoing = _send(server, 66, v, {**values, "state_filters": ["Ongoing", "Sleeping"]})
        assert [t.transactional_id for t in ongoing.transaction_states] == ["tx"]
        assert list(ongoing.unknown_state_filters) == ["Sleeping"]
        by_producer = _send(server, 66, v, {**values, "producer_id_filters": [idle.producer_id]})
        assert [t.transactional_id for t in by_producer.transaction_states] == ["idle"]
    longer = _send(server, 66, 1, {"duration_filter": 3_600_000})
    assert longer.transaction_states == ()  # nothing open for an hour

    [v] = _versions(65)
    described = _send(server, 65, v, {"transactional_ids": ["tx", "nope"]}).transaction_states
    assert [(s.transactional_id, s.error_code.value) for s in described] == [
        ("tx", 0), ("nope", KafkaError.TRANSACTIONAL_ID_NOT_FOUND)
    ]  # fmt: skip
    tx = described[0]
    assert (tx.transaction_state, tx.producer_id, tx.producer_epoch) == (
        "Ongoing", d.producer_id, d.producer_epoch
    )  # fmt: skip
    assert [(t.topic, list(t.partitions)) for t in tx.topics] == [("t", [1])]
    assert tx.transaction_timeout.total_seconds() == 60

    [v] = _versions(61)
    answer = _send(server, 61, v, {"topics": [{"name": "t", "partition_indexes": [1, 0, 7]}]})
    [topic] = answer.topics
    assert [(p.partition_index, p.error_code.value) for p in topic.partitions] == [
        (1, 0), (0, 0), (7, KafkaError.UNKNOWN_TOPIC_OR_PARTITION)
    ]  # fmt: skip
    [producer] = topic.partitions[0].active_producers
    assert (producer.producer_id, producer.current_txn_start_offset) == (d.producer_id, 0)
    assert topic.partitions[1].active_producers == ()


def test_api_versions_advertises_the_admin_apis(server: str) -> None:
    answer = _send(server, 18, 3, {"client_software_name": "t", "client_software_version": "1"})
    advertised = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
    for key in (19, 20, 29, 30, 31, 32, 33, 44, 61, 65, 66):
        assert advertised[key] == APIS[key][:2]
