"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs, for topics and brokers
(``broker_configs``): each resource on its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.broker.admin.broker_configs import RESOURCE_BROKER, alter_broker, describe_broker
from app.errors import KafkaError, KafkaException, fail
from app.log.topic_config import MAX_MESSAGE_BYTES, TOPIC_CONFIGS, TopicConfigDef, value_text
from app.log.topics import alter_topic_config, list_topics
from app.protocol import (
    CONFIG_SOURCE_DEFAULT,
    CONFIG_SOURCE_DYNAMIC_TOPIC,
    OP_APPEND,
    OP_DELETE,
    OP_SET,
    OP_SUBTRACT,
    RESOURCE_TOPIC,
    AlterableConfig,
    AlterConfigsRequest,
    AlterConfigsResourceResponse,
    AlterConfigsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResourceResult,
    DescribeConfigsResponse,
    DescribeConfigsResult,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
    TopicInfo,
)
from app.storage.context import BrokerContext


def _topic_only(resource_type: int) -> None:
    if resource_type != RESOURCE_TOPIC:
        raise fail(
            KafkaError.INVALID_REQUEST,
            f"resource type {resource_type} has no configs here: only topics (2) and "
            "brokers (4) do",
        )


def describe_configs(broker: BrokerContext, req: DescribeConfigsRequest) -> DescribeConfigsResponse:
    """Every config of the topic, its override or its default (Kafka's config sources)."""
    topics: dict[str, TopicInfo] | None = None  # listed once, if a topic is asked for
    results = []
    for r in req.resources:
        if r.resource_type == RESOURCE_BROKER:
            results.append(_described_broker(broker, req, r))
            continue
        try:
            _topic_only(r.resource_type)
            if topics is None:
                topics = {i.topic: i for i in list_topics(broker)}
            info = topics.get(r.resource_name)
            if info is None:
                raise fail(
                    KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic {r.resource_name!r} does not exist",
                )
        except KafkaException as exc:
            results.append(
                DescribeConfigsResult(
                    r.resource_type, r.resource_name, exc.error.code(), exc.error.str()
                )
            )
            continue
        keys = r.configuration_keys
        overrides = info.config
        configs = [
            _described(broker, d, overrides)
            for name, d in TOPIC_CONFIGS.items()
            if keys is None or name in keys
        ]
        results.append(
            DescribeConfigsResult(
                r.resource_type, r.resource_name, KafkaError.NO_ERROR, None, configs
            )
        )
    return DescribeConfigsResponse(results)


def _described_broker(
    broker: BrokerContext, req: DescribeConfigsRequest, r: Any
) -> DescribeConfigsResult:
    try:
        configs = describe_broker(
            broker.settings, r.resource_name, req.node_id, r.configuration_keys
        )
    except KafkaException as exc:
        return DescribeConfigsResult(
            r.resource_type, r.resource_name, exc.error.code(), exc.error.str()
        )
    return DescribeConfigsResult(
        r.resource_type, r.resource_name, KafkaError.NO_ERROR, None, configs
    )


def _described(
    broker: BrokerContext, d: TopicConfigDef, overrides: dict[str, Any]
) -> DescribeConfigsResourceResult:
    """One config: the topic's override, or its default (a topic's max.message.bytes
    defaults to the broker's message.max.bytes, as in Kafka)."""
    default = d.default
    if d.name == MAX_MESSAGE_BYTES:
        default = broker.settings.message_max_bytes
    overridden = d.name in overrides
    return DescribeConfigsResourceResult(
        d.name,
        value_text(overrides[d.name] if overridden else default),
        CONFIG_SOURCE_DYNAMIC_TOPIC if overridden else CONFIG_SOURCE_DEFAULT,
        default_value=value_text(default),
        config_type=d.config_type,
        documentation=f"{d.effect}: {d.doc}",
    )


def _answer(
    resource_type: int,
    name: str,
    alter: Callable[[], Any],
    node_id: int | None = None,
    broker_configs: list[AlterableConfig] | None = None,
) -> AlterConfigsResourceResponse:
    """``broker_configs``: the operations, for a BROKER resource."""
    try:
        if resource_type == RESOURCE_BROKER:
            alter_broker(name, node_id, broker_configs or [])
            return AlterConfigsResourceResponse(resource_type, name, KafkaError.NO_ERROR)
        _topic_only(resource_type)
        alter()
    except KafkaException as exc:
        return AlterConfigsResourceResponse(resource_type, name, exc.error.code(), exc.error.str())
    return AlterConfigsResourceResponse(resource_type, name, KafkaError.NO_ERROR)


def alter_configs(broker: BrokerContext, req: AlterConfigsRequest) -> AlterConfigsResponse:
    return AlterConfigsResponse(
        [
            _answer(
                r.resource_type,
                r.resource_name,
                lambda r=r: alter_topic_config(  # type: ignore[misc]
                    broker,
                    r.resource_name,
                    {k: v for k, v in r.configs.items() if v is not None},
                    [k for k, v in r.configs.items() if v is None],
                    incremental=False,
                    validate_only=req.validate_only,
                ),
                req.node_id,
                [AlterableConfig(k, OP_SET, v) for k, v in r.configs.items()],
            )
            for r in req.resources
        ]
    )


def incremental_alter_configs(
    broker: BrokerContext, req: IncrementalAlterConfigsRequest
) -> IncrementalAlterConfigsResponse:
    def alter(name: str, configs: list[AlterableConfig]) -> None:
        set_, delete, append, subtract = _operations(configs)
        alter_topic_config(
            broker, name, set_, delete, True,
            append=append, subtract=subtract, validate_only=req.validate_only,
        )  # fmt: skip

    return IncrementalAlterConfigsResponse(
        [
            _answer(
                r.resource_type,
                r.resource_name,
                lambda r=r: alter(r.resource_name, r.configs),  # type: ignore[misc]
                req.node_id,
                r.configs,
            )
            for r in req.resources
        ]
    )


def _operations(
    configs: list[AlterableConfig],
) -> tuple[dict[str, Any], list[str], dict[str, Any], dict[str, Any]]:
    """The operations by kind; a config named twice, an unknown operation or a missing
    value is a bad request, as in Kafka."""
    set_: dict[str, Any] = {}
    delete: list[str] = []
    append: dict[str, Any] = {}
    subtract: dict[str, Any] = {}
    seen: set[Any] = set()
    for c in configs:
        if c.name in seen:
            raise fail(KafkaError.INVALID_REQUEST, f"config {c.name!r} is altered twice")
        seen.add(c.name)
        if c.config_operation == OP_DELETE:
            delete.append(c.name)
            continue
        by_op = {OP_SET: set_, OP_APPEND: append, OP_SUBTRACT: subtract}.get(c.config_operation)
        if by_op is None:
            raise fail(
                KafkaError.INVALID_REQUEST, f"unknown config operation {c.config_operation!r}"
            )
        if c.value is None:
            raise fail(KafkaError.INVALID_REQUEST, f"config {c.name!r} has no value")
        by_op[c.name] = c.value
    return set_, delete, append, subtract
