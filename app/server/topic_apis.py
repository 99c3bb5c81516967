"""The Kafka APIs of topic administration: CreateTopics, DeleteTopics, CreatePartitions,
DeleteRecords, DescribeConfigs, AlterConfigs and IncrementalAlterConfigs, each onto the
broker's request of that name.

What the wire allows and the broker's requests do not carry is settled here, as Kafka's
broker settles it before creating anything: a topic named twice, a partition count given
both ways, a config named twice or without a value. A replication factor of 0 or below -1
is refused as Kafka's controller refuses it; any other is accepted and ignored: there are no
replicas, PostgreSQL keeps the data (docs/kafka-differences.md#replication-factor-not-kept).
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from app.broker import Broker
from app.errors import KafkaError, KafkaException, fail
from app.protocol import (
    CONFIG_SOURCE_DEFAULT,
    RESOURCE_TOPIC,
    AlterableConfig,
    AlterConfigsRequest,
    AlterConfigsResource,
    AlterConfigsResourceResponse,
    CreatableTopic,
    CreatableTopicResult,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteRecordsRequest,
    DeleteTopicsRequest,
    DescribeConfigsRequest,
    DescribeConfigsResource,
    DescribeConfigsResourceResult,
    DescribeConfigsResult,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResource,
    MetadataRequest,
    PartitionCount,
)
from app.server.node import Node

# Kafka's default partition count (num.partitions), for a CreateTopics that leaves it to
# the broker (-1 without an assignment).
DEFAULT_PARTITIONS = 1


def create_topics(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """Each topic created on its own. From v5 the answer carries what was created (the
    partition count, the configs), from v7 the topic id."""
    names = Counter(t.name for t in request.topics)
    refused: dict[str, KafkaException] = {}
    asked: list[CreatableTopic] = []
    factors = {t.name: (t.replication_factor, bool(t.assignments)) for t in request.topics}
    for t in request.topics:
        if names[t.name] > 1:
            refused[t.name] = fail(KafkaError.INVALID_REQUEST, f"topic {t.name!r} named twice")
            continue
        try:
            asked.append(_creatable(t))
        except KafkaException as exc:
            refused[t.name] = exc
    # One request per topic (each is its own DB transaction anyway): a failure of one is
    # that topic's answer (``failures.AnsweringBroker``), the others stand.
    answers = [_create(broker, t, request.validate_only, factors[t.name]) for t in asked]
    created = [a.name for a in answers if a.error_code == KafkaError.NO_ERROR]
    ids, configs = {}, {}
    if created and not request.validate_only and request.__version__ >= 5:
        ids = {t.topic: t.topic_id for t in broker.handle(MetadataRequest(created)).topics}
        configs = {r.resource_name: r for r in _described(broker, created)}
    by_name = {a.name: a for a in answers}
    results = []
    for name in dict.fromkeys(t.name for t in request.topics):  # request order, once each
        refusal = refused.get(name)
        if refusal is not None:
            results.append(
                {"name": name, "error_code": refusal.error.code(),
                 "error_message": refusal.error.str(), "num_partitions": -1,
                 "replication_factor": -1}
            )  # fmt: skip
            continue
        a = by_name[name]
        result: dict[str, Any] = {
            "name": name, "error_code": a.error_code, "error_message": a.error_message,
            "num_partitions": a.num_partitions,
            "replication_factor": 1 if a.error_code == KafkaError.NO_ERROR else -1,
        }  # fmt: skip
        if ids.get(name) is not None:
            result["topic_id"] = uuid.UUID(ids[name])
        if name in configs:
            result["configs"] = _config_values(configs[name])
        results.append(result)
    return {"topics": results}


def _create(
    broker: Broker, t: CreatableTopic, validate_only: bool, factor: tuple[int, bool]
) -> Any:
    """The topic's CreateTopics answer. A replication factor of 0 or below -1 (-1 is the
    default; an assignment names its replicas itself) is INVALID_REPLICATION_FACTOR, as
    Kafka's controller answers it once the name, its being free and the configs have
    passed (they are checked first, nothing written) and before the partition count."""
    replication_factor, assigned = factor
    if assigned or not (replication_factor < -1 or replication_factor == 0):
        return broker.handle(CreateTopicsRequest([t], validate_only)).topics[0]
    checked = CreatableTopic(t.name, 1, t.configs)
    answer = broker.handle(CreateTopicsRequest([checked], True)).topics[0]
    if answer.error_code != KafkaError.NO_ERROR:
        return answer
    return CreatableTopicResult(
        t.name,
        KafkaError.INVALID_REPLICATION_FACTOR,
        "Replication factor must be larger than 0, or -1 to use the default value.",
    )


def _creatable(t: Any) -> CreatableTopic:
    partitions = t.num_partitions
    if t.assignments:
        if partitions != -1:
            raise fail(
                KafkaError.INVALID_REQUEST,
                "give the partition count or the replica assignment, not both",
            )
        indexes = sorted(a.partition_index for a in t.assignments)
        if indexes != list(range(len(indexes))):
            raise fail(
                KafkaError.INVALID_REPLICA_ASSIGNMENT,
                f"the assignment's partitions must be 0 to {len(indexes) - 1}, got {indexes}",
            )
        partitions = len(indexes)
    elif partitions == -1:
        partitions = DEFAULT_PARTITIONS
    names = Counter(c.name for c in t.configs)
    for c in t.configs:
        if names[c.name] > 1:
            raise fail(KafkaError.INVALID_CONFIG, f"config {c.name!r} given twice")
        if c.value is None:
            raise fail(KafkaError.INVALID_CONFIG, f"config {c.name!r} has no value")
    configs = {c.name: c.value for c in t.configs}
    return CreatableTopic(t.name, partitions, configs or None)


def _described(broker: Broker, topics: list[str]) -> list[DescribeConfigsResult]:
    resources = [DescribeConfigsResource(RESOURCE_TOPIC, name) for name in topics]
    found = broker.handle(DescribeConfigsRequest(resources)).results
    return [r for r in found if r.error_code == KafkaError.NO_ERROR]


def _config_values(
    result: DescribeConfigsResult, synonyms: bool = False, documentation: bool = False
) -> list[dict[str, Any]]:
    """Each config with its source; with ``synonyms``, where its value could come from, in
    Kafka's order of precedence (the topic's override, then the default)."""
    return [
        {"name": c.name, "value": c.value, "read_only": c.read_only,
         "config_source": c.config_source, "is_sensitive": c.is_sensitive,
         "is_default": c.config_source == CONFIG_SOURCE_DEFAULT,
         "synonyms": _synonyms(c) if synonyms else [], "config_type": c.config_type,
         "documentation": c.documentation if documentation else None}
        for c in result.configs
    ]  # fmt: skip


def _synonyms(c: DescribeConfigsResourceResult) -> list[dict[str, Any]]:
    found = []
    if c.config_source != CONFIG_SOURCE_DEFAULT:
        found.append({"name": c.name, "value": c.value, "source": c.config_source})
    if c.default_value is not None:
        found.append({"name": c.name, "value": c.default_value, "source": CONFIG_SOURCE_DEFAULT})
    return found


def delete_topics(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """By name, or from v6 by topic id (looked up among the topics there are)."""
    if request.__version__ < 6:
        asked: list[tuple[str | None, uuid.UUID | None]] = [(n, None) for n in request.topic_names]
    else:
        asked = [(t.name, t.topic_id) for t in request.topics]
    if any(name is None for name, _ in asked):
        known = topics_by_id(broker)
        asked = [
            (name or (known.get(topic_id) if topic_id else None), topic_id)
            for name, topic_id in asked
        ]
    answers = iter(broker.handle(DeleteTopicsRequest([n])).responses[0] for n, _ in asked if n)
    results = []
    for name, topic_id in asked:
        if name:
            a = next(answers)
            code, message = a.error_code, a.error_message
        else:
            code, message = KafkaError.UNKNOWN_TOPIC_ID, f"no topic has the id {topic_id}"
        results.append(
            {"name": name, "topic_id": topic_id or uuid.UUID(int=0), "error_code": code,
             "error_message": message}
        )  # fmt: skip
    return {"responses": results}


def topics_by_id(broker: Broker) -> dict[uuid.UUID, str]:
    """Every topic's name by its id (KIP-516), for a request that names topics by id."""
    listed = broker.handle(MetadataRequest(None)).topics
    return {uuid.UUID(m.topic_id): m.topic for m in listed if m.topic_id}


def describe_configs(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    resources = [
        DescribeConfigsResource(
            r.resource_type, r.resource_name,
            None if r.configuration_keys is None else list(r.configuration_keys),
        )
        for r in request.resources
    ]  # fmt: skip
    results = broker.handle(DescribeConfigsRequest(resources, node.member.node_id)).results
    synonyms = bool(getattr(request, "include_synonyms", False))
    documentation = bool(getattr(request, "include_documentation", False))
    return {
        "results": [
            {"error_code": r.error_code, "error_message": r.error_message,
             "resource_type": r.resource_type, "resource_name": r.resource_name,
             "configs": _config_values(r, synonyms, documentation)}
            for r in results
        ]
    }  # fmt: skip


def alter_configs(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """The given set replaces the topic's overrides; a config named twice is a bad request,
    its resource left as it was."""
    refused: list[AlterConfigsResourceResponse] = []
    asked: list[AlterConfigsResource] = []
    for r in request.resources:
        names = Counter(c.name for c in r.configs)
        twice = sorted(n for n, k in names.items() if k > 1)
        if twice:
            refused.append(
                AlterConfigsResourceResponse(
                    r.resource_type, r.resource_name, KafkaError.INVALID_REQUEST,
                    f"configs named twice: {twice}",
                )
            )  # fmt: skip
            continue
        configs = {c.name: c.value for c in r.configs}
        asked.append(AlterConfigsResource(r.resource_type, r.resource_name, configs))
    answers = [
        broker.handle(
            AlterConfigsRequest([r], request.validate_only, node.member.node_id)
        ).responses[0]
        for r in asked
    ]
    return {"responses": [_altered(a) for a in [*answers, *refused]]}


def incremental_alter_configs(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    resources = [
        IncrementalAlterConfigsResource(
            r.resource_type, r.resource_name,
            [AlterableConfig(c.name, c.config_operation, c.value) for c in r.configs],
        )
        for r in request.resources
    ]  # fmt: skip
    answers = [
        broker.handle(
            IncrementalAlterConfigsRequest([r], request.validate_only, node.member.node_id)
        ).responses[0]
        for r in resources
    ]
    return {"responses": [_altered(a) for a in answers]}


def _altered(a: AlterConfigsResourceResponse) -> dict[str, Any]:
    return {
        "error_code": a.error_code, "error_message": a.error_message,
        "resource_type": a.resource_type, "resource_name": a.resource_name,
    }  # fmt: skip


def create_partitions(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """Each topic on its own. A topic named twice is a bad request (INVALID_REQUEST, as
    Kafka's duplicate check); an assignment must name a replica list for each new
    partition, kept as CreateTopics keeps them: ignored, PostgreSQL holds the data."""
    names = Counter(t.name for t in request.topics)
    refused: dict[str, KafkaException] = {}
    asked: list[PartitionCount] = []
    for t in request.topics:
        if names[t.name] > 1:
            refused[t.name] = fail(KafkaError.INVALID_REQUEST, f"topic {t.name!r} named twice")
        elif t.assignments is not None and any(not a.broker_ids for a in t.assignments):
            refused[t.name] = fail(
                KafkaError.INVALID_REPLICA_ASSIGNMENT, "a new partition has no replicas"
            )
        else:
            asked.append(PartitionCount(t.name, t.count))
    answers = [
        broker.handle(CreatePartitionsRequest([t], request.validate_only)).results[0] for t in asked
    ]
    by_name = {a.name: (a.error_code, a.error_message) for a in answers}
    results = []
    for name in dict.fromkeys(t.name for t in request.topics):
        code, message = (
            (refused[name].error.code(), refused[name].error.str())
            if name in refused
            else by_name[name]
        )
        results.append({"name": name, "error_code": code, "error_message": message})
    return {"results": results}


def delete_records(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """Each partition on its own (a request of its own: a failure of one is its answer);
    its answer is its new log start (the low watermark)."""
    asked = [(t.name, p.partition_index, p.offset) for t in request.topics for p in t.partitions]
    answers = [broker.handle(DeleteRecordsRequest([p])).results[0] for p in asked]
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for a in answers:
        by_topic.setdefault(a.topic, []).append(
            {"partition_index": a.partition, "low_watermark": a.low_watermark,
             "error_code": a.error_code}
        )  # fmt: skip
    return {"topics": [{"name": t, "partitions": p} for t, p in by_topic.items()]}
