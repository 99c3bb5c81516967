"""Administration on both brokers, as confluent-kafka's AdminClient and raw requests see
it: topics created (with configs, validate_only, refused) and deleted, configs described
and altered, partitions added, records deleted, transactions and producers described,
ACLs on a broker without an authorizer, and the cluster described."""

from __future__ import annotations

from typing import Any

import confluent_kafka as ck
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    ResourcePatternType,
    ResourceType,
)

from tests.conformance.harness import Observation, Target, documented_difference, same
from tests.conformance.normalise import config_entry, error_name, stems
from tests.conformance.raw_calls import (
    CREATE_TOPICS,
    DELETE_RECORDS,
    DESCRIBE_ACLS,
    DESCRIBE_CLUSTER,
    DESCRIBE_CONFIGS,
    DESCRIBE_PRODUCERS,
    DESCRIBE_TRANSACTIONS,
    LIST_TRANSACTIONS,
    batch,
    call,
    error,
    log_end,
    offsets,
    produce,
)

# Topic configs whose values, sources and defaults both brokers report alike.
COMPARED = ("cleanup.policy", "retention.ms", "max.message.bytes", "compression.type", "message.timestamp.type", "retention.bytes",
            "min.compaction.lag.ms", "segment.bytes", "unclean.leader.election.enable")  # fmt: skip


def _outcome(future: Any, timeout: float = 30) -> str:
    """How an admin call's future ends: NONE, or its error's name."""
    try:
        future.result(timeout)
    except ck.KafkaException as exc:
        return error_name(exc)
    return "NONE"


def _configs(target: Target, topic: str) -> dict[str, list[Any]]:
    admin = target.admin()
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(30)
    return {
        name: [*config_entry(e), bool(e.is_sensitive), bool(e.is_read_only)]
        for name, e in sorted(entries.items())
        if name in COMPARED
    }


def _exists(target: Target, topic: str) -> bool:
    """Whether the broker lists ``topic`` (asking for every topic: a Metadata request
    naming it would create it, topics being created on first use)."""
    return topic in target.admin().list_topics(timeout=30).topics


def scenario_create_a_topic_with_configs(target: Target) -> Observation:
    """A topic created with overrides: each override is DYNAMIC_TOPIC_CONFIG, the others
    their defaults, as DescribeConfigs and CreateTopics (v5+) report them."""
    topic = target.create_topic(
        "adm-configs", partitions=3,
        config={"cleanup.policy": "compact", "retention.ms": "3600000",
                "max.message.bytes": "20000"},
    )  # fmt: skip
    metadata = target.admin().list_topics(topic, timeout=30).topics[topic]
    return {"partitions": sorted(metadata.partitions), "configs": _configs(target, topic)}


def test_create_a_topic_with_configs(targets: Any) -> None:
    same(scenario_create_a_topic_with_configs, *targets)


def _create_raw(target: Target, topics: list[dict[str, Any]], validate_only: bool) -> Any:
    """CreateTopics (v7) of ``topics`` (name, partitions, replication factor, configs)."""
    return call(target, CREATE_TOPICS, 7, {
        "topics": [{"name": t["name"], "num_partitions": t.get("partitions", 1),
                    "replication_factor": t.get("rf", 1), "assignments": [],
                    "configs": [{"name": k, "value": v}
                                for k, v in t.get("configs", {}).items()]}
                   for t in topics],
        "timeout": 30_000, "validate_only": validate_only,
    })  # fmt: skip


def scenario_create_topics_refused(target: Target) -> Observation:
    """One CreateTopics request, each topic answered on its own: TOPIC_ALREADY_EXISTS,
    INVALID_PARTITIONS, INVALID_CONFIG, and one created with the broker's defaults;
    the same with validate_only creates nothing."""
    taken = target.create_topic("adm-taken")
    asked = [
        {"name": taken},
        {"name": target.name_for("zero-parts"), "partitions": 0},
        {"name": target.name_for("negative-parts"), "partitions": -2},
        {"name": target.name_for("bad-config"), "configs": {"retention.ms": "soon"}},
        {"name": target.name_for("unknown-config"), "configs": {"no.such.config": "1"}},
        {"name": target.name_for("defaults"), "partitions": -1, "rf": -1},
    ]
    checked = [{**t, "name": target.name_for("checked")} for t in asked[1:]]

    def answered(answer: Any) -> list[list[Any]]:
        return stems([[t.name, error(t.error_code), t.num_partitions, t.replication_factor]
                      for t in answer.topics])  # fmt: skip

    created = answered(_create_raw(target, asked, validate_only=False))
    validated = answered(_create_raw(target, checked, validate_only=True))
    return {
        "created": created, "validated": validated,
        "exist": [_exists(target, t["name"]) for t in asked + checked],
    }  # fmt: skip


def test_create_topics_refused(targets: Any) -> None:
    same(scenario_create_topics_refused, *targets)


def scenario_a_replication_factor_above_the_brokers(target: Target) -> Observation:
    """A topic asked with three replicas of a single broker."""
    name = target.name_for("three-replicas")
    answer = _create_raw(target, [{"name": name, "rf": 3}], validate_only=False).topics[0]
    return {"answer": error(answer.error_code), "created": _exists(target, name)}


def test_a_replication_factor_above_the_brokers(targets: Any) -> None:
    documented_difference(
        "replication-factor-not-kept", scenario_a_replication_factor_above_the_brokers,
        *targets,
        kip98_expected={"answer": "NONE", "created": True},
        kafka_expected={"answer": "INVALID_REPLICATION_FACTOR", "created": False},
    )  # fmt: skip


def scenario_delete_topics(target: Target) -> Observation:
    """A deleted topic is gone from Metadata and its configs; deleting it again, or one
    there never was, is UNKNOWN_TOPIC_OR_PARTITION."""
    admin = target.admin()
    topic = target.create_topic("adm-delete")
    produce(target, topic, 0, batch([b"a"]))
    first = _outcome(admin.delete_topics([topic], operation_timeout=30)[topic])
    gone = not _exists(target, topic)
    again = _outcome(admin.delete_topics([topic])[topic])
    never = target.name_for("adm-never")
    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = _outcome(admin.describe_configs([resource])[resource])
    return {
        "first": first, "gone": gone, "again": again,
        "never": _outcome(admin.delete_topics([never])[never]), "configs": configs,
        "offsets": offsets(target, topic),
    }  # fmt: skip


def test_delete_topics(targets: Any) -> None:
    same(scenario_delete_topics, *targets)


def scenario_incremental_alter_configs(target: Target) -> Observation:
    """IncrementalAlterConfigs: SET and DELETE (an override gone is its default again),
    a value that does not parse and a config that does not exist (INVALID_CONFIG), a
    topic there is not, validate_only (nothing changes)."""
    admin = target.admin()
    topic = target.create_topic("adm-alter", config={"max.message.bytes": "20000"})

    def alter(name: str, *entries: ConfigEntry, only: bool = False) -> str:
        resource = ConfigResource(ResourceType.TOPIC, name, incremental_configs=list(entries))
        return _outcome(admin.incremental_alter_configs([resource], validate_only=only)[resource])

    set_ = AlterConfigOpType.SET
    answers = {
        "set": alter(topic, ConfigEntry("retention.ms", "7200000",
                                        incremental_operation=set_)),
        "delete": alter(topic, ConfigEntry("max.message.bytes", None,
                                           incremental_operation=AlterConfigOpType.DELETE)),
        "bad_value": alter(topic, ConfigEntry("retention.ms", "soon",
                                              incremental_operation=set_)),
        "unknown_config": alter(topic, ConfigEntry("no.such.config", "1",
                                                   incremental_operation=set_)),
        "unknown_topic": alter(target.name_for("adm-never"),
                               ConfigEntry("retention.ms", "1", incremental_operation=set_)),
        "validate_only": alter(topic, ConfigEntry("cleanup.policy", "compact",
                                                  incremental_operation=set_), only=True),
    }  # fmt: skip
    return {"answers": answers, "configs": _configs(target, topic)}


def test_incremental_alter_configs(targets: Any) -> None:
    same(scenario_incremental_alter_configs, *targets)


def scenario_alter_configs_replaces_the_overrides(target: Target) -> Observation:
    """The legacy AlterConfigs: the set given replaces the topic's overrides whole."""
    admin = target.admin()
    topic = target.create_topic(
        "adm-replace", config={"max.message.bytes": "20000", "retention.ms": "3600000"}
    )
    resource = ConfigResource(ResourceType.TOPIC, topic, set_config={"cleanup.policy": "compact"})
    answer = _outcome(admin.alter_configs([resource])[resource])
    return {"answer": answer, "configs": _configs(target, topic)}


def test_alter_configs_replaces_the_overrides(targets: Any) -> None:
    same(scenario_alter_configs_replaces_the_overrides, *targets)


def scenario_describe_configs_by_name_and_synonyms(target: Target) -> Observation:
    """DescribeConfigs (v4) of named configs only, with synonyms asked for: an override
    lists itself first; a config the topic does not have is left out; a topic there is
    not is UNKNOWN_TOPIC_OR_PARTITION."""
    topic = target.create_topic("adm-describe", config={"retention.ms": "3600000"})

    def described(name: str) -> Any:
        return call(target, DESCRIBE_CONFIGS, 4, {
            "resources": [{"resource_type": 2, "resource_name": name,
                           "configuration_keys": ["retention.ms", "cleanup.policy", "nope"]}],
            "include_synonyms": True, "include_documentation": False,
        }).results[0]  # fmt: skip

    found = described(topic)
    return {
        "error": error(found.error_code),
        "configs": sorted([c.name, c.value, c.config_source, c.is_sensitive, c.read_only,
                           [s.source for s in c.synonyms][:1]] for c in found.configs),
        "unknown": error(described(target.name_for("adm-never")).error_code),
    }  # fmt: skip


def test_describe_configs_by_name_and_synonyms(targets: Any) -> None:
    same(scenario_describe_configs_by_name_and_synonyms, *targets)


def scenario_create_partitions(target: Target) -> Observation:
    """CreatePartitions: more is taken (validate_only first changes nothing); the same
    count or fewer is INVALID_PARTITIONS; a topic there is not UNKNOWN_TOPIC_OR_PARTITION."""
    admin = target.admin()
    topic = target.create_topic("adm-grow", partitions=2)

    def grow(name: str, count: int, only: bool = False) -> str:
        return _outcome(admin.create_partitions([NewPartitions(name, count)],
                                                validate_only=only)[name])  # fmt: skip

    answers = {"validate_only": grow(topic, 4, only=True)}
    answers["after_validate_only"] = str(len(admin.list_topics(topic, timeout=30)
                                             .topics[topic].partitions))  # fmt: skip
    answers.update({
        "more": grow(topic, 4), "same": grow(topic, 4), "fewer": grow(topic, 3),
        "unknown": grow(target.name_for("adm-never"), 2),
    })  # fmt: skip
    partitions = sorted(admin.list_topics(topic, timeout=30).topics[topic].partitions)
    return {"answers": answers, "partitions": partitions}


def test_create_partitions(targets: Any) -> None:
    same(scenario_create_partitions, *targets)


def _delete_records(target: Target, topic: str, partition: int, offset: int) -> list[Any]:
    answer = call(target, DELETE_RECORDS, 2, {
        "topics": [{"name": topic, "partitions": [{"partition_index": partition,
                                                   "offset": offset}]}],
        "timeout": 30_000,
    })  # fmt: skip
    p = answer.topics[0].partitions[0]
    return [error(p.error_code), p.low_watermark]


def scenario_delete_records(target: Target) -> Observation:
    """DeleteRecords moves the log start (the low watermark); -1 means the high
    watermark; beyond it is OFFSET_OUT_OF_RANGE; an earlier offset than the start
    leaves it; a partition there is not is UNKNOWN_TOPIC_OR_PARTITION."""
    topic = target.create_topic("adm-trim", partitions=2)
    produce(target, topic, 0, batch([f"v{i}".encode() for i in range(10)]))
    produce(target, topic, 1, batch([b"a", b"b"]))
    answers = {
        "to_4": _delete_records(target, topic, 0, 4),
        "back_to_2": _delete_records(target, topic, 0, 2),
        "beyond": _delete_records(target, topic, 0, 11),
        "to_end": _delete_records(target, topic, 1, -1),
        "no_partition": _delete_records(target, topic, 5, 0)[0],
    }
    return {"answers": answers, "offsets": [offsets(target, topic, p) for p in (0, 1)],
            "end": log_end(target, topic)}  # fmt: skip


def test_delete_records(targets: Any) -> None:
    same(scenario_delete_records, *targets)


def scenario_transactions_and_producers_described(target: Target) -> Observation:
    """ListTransactions, DescribeTransactions and DescribeProducers after one committed
    transaction and one idempotent producer's writes."""
    topic = target.create_topic("adm-txn")
    transactional_id = target.name_for("adm-txn")
    producer = ck.Producer(target.config(**{"transactional.id": transactional_id}))
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(topic, b"t", partition=0)
    producer.commit_transaction(60)
    idempotent = ck.Producer(target.config(**{"enable.idempotence": True}))
    for i in range(3):
        idempotent.produce(topic, f"i{i}".encode(), partition=0)
    assert idempotent.flush(60) == 0

    listed = call(target, LIST_TRANSACTIONS, 1, {
        "state_filters": [], "producer_id_filters": [], "duration_filter": -1,
    })  # fmt: skip
    ours = [[t.transactional_id, t.transaction_state] for t in listed.transaction_states
            if t.transactional_id == transactional_id]  # fmt: skip
    described = call(target, DESCRIBE_TRANSACTIONS, 0, {
        "transactional_ids": [transactional_id, target.name_for("adm-none")],
    }).transaction_states  # fmt: skip
    producers = call(target, DESCRIBE_PRODUCERS, 0, {
        "topics": [{"name": topic, "partition_indexes": [0, 7]}],
    }).topics[0].partitions  # fmt: skip
    return stems({
        "listed": [error(listed.error_code), ours],
        "described": [[error(d.error_code), d.transaction_state,
                       d.transaction_timeout.total_seconds() * 1000 if d.error_code.value == 0
                       else None, sorted((t.topic, sorted(t.partitions)) for t in d.topics)]
                      for d in described],
        "producers": [[p.partition_index, error(p.error_code),
                       sorted([s.last_sequence, s.current_txn_start_offset]
                              for s in p.active_producers)]
                      for p in producers],
    })  # fmt: skip


def test_transactions_and_producers_described(targets: Any) -> None:
    same(scenario_transactions_and_producers_described, *targets)


def scenario_acls_without_an_authorizer(target: Target) -> Observation:
    """CreateAcls, DescribeAcls (raw: the admin client does not report its error) and
    DeleteAcls on a broker run as the suite runs both, without authorization."""
    admin = target.admin()
    topic = target.name_for("adm-acl")
    binding = AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:alice",
                         "*", AclOperation.READ, AclPermissionType.ALLOW)  # fmt: skip
    matching = AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL,
                                None, None, AclOperation.ANY, AclPermissionType.ANY)  # fmt: skip
    created = _outcome(admin.create_acls([binding])[binding])
    described = call(target, DESCRIBE_ACLS, 3, {
        "resource_type_filter": 2, "resource_name_filter": topic, "pattern_type_filter": 3,
        "principal_filter": None, "host_filter": None, "operation": 1, "permission_type": 1,
    })  # fmt: skip
    return {
        "create": created,
        "describe": [error(described.error_code), len(described.resources)],
        "delete": _outcome(admin.delete_acls([matching])[matching]),
    }


def test_acls_without_an_authorizer(targets: Any) -> None:
    documented_difference(
        "acls-without-authorization", scenario_acls_without_an_authorizer, *targets,
        kip98_expected={"create": "NONE", "describe": ["NONE", 1], "delete": "NONE"},
        kafka_expected={"create": "SECURITY_DISABLED", "describe": ["SECURITY_DISABLED", 0],
                        "delete": "SECURITY_DISABLED"},
    )  # fmt: skip


def scenario_describe_cluster(target: Target) -> Observation:
    """DescribeCluster: one broker, the controller among the brokers, a cluster id; the
    broker is the one the client reached."""
    answer = call(target, DESCRIBE_CLUSTER, 1, {
        "include_cluster_authorized_operations": False, "endpoint_type": 1,
    })  # fmt: skip
    admin = target.admin()
    described = admin.describe_cluster().result(30)
    host, port = target.bootstrap.rsplit(":", 1)
    return {
        "error": error(answer.error_code),
        "brokers": [[b.host == host, b.port == int(port), b.rack] for b in answer.brokers],
        "controller_is_a_broker": answer.controller_id in [b.broker_id for b in answer.brokers],
        "cluster_id": bool(answer.cluster_id),
        "admin": [len(described.nodes), bool(described.cluster_id),
                  described.controller is not None],
    }  # fmt: skip


def test_describe_cluster(targets: Any) -> None:
    same(scenario_describe_cluster, *targets)
