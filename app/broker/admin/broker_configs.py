"""A broker's configs, as Kafka's DescribeConfigs and (Incremental)AlterConfigs answer for
the resource type BROKER: its name is the node's id, or empty for the cluster-wide
dynamic defaults.

Described: the Kafka broker configs kip98 has a meaning for, from its settings (source
STATIC_BROKER_CONFIG where set, DEFAULT_CONFIG otherwise), each read-only: kip98 applies
no broker config while it runs. The cluster-wide defaults are none. Altered: refused as
Kafka refuses a config it cannot update dynamically (INVALID_REQUEST); deleting one is a
no-op, there being none set dynamically. Pure rules over the settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

from app.errors import KafkaError, fail
from app.protocol import OP_DELETE, AlterableConfig, DescribeConfigsResourceResult
from app.settings import BrokerSettings

RESOURCE_BROKER = 4
CONFIG_SOURCE_STATIC_BROKER = 4
CONFIG_SOURCE_DEFAULT = 5
_TYPES = {"boolean": 1, "string": 2, "int": 3, "long": 5}

# Kafka's name -> (kip98's setting, Kafka's type, what it does here).
BROKER_CONFIGS: dict[str, tuple[str, str, str]] = {
    "message.max.bytes": ("message_max_bytes", "int",
                          "the largest record batch a topic takes by default"),
    "auto.create.topics.enable": ("auto_create_topics", "boolean",
                                  "Metadata creates a topic it is asked for"),
    "num.partitions": ("num_partitions", "int", "partitions of an auto-created topic"),
    "transaction.max.timeout.ms": ("max_transaction_timeout_ms", "int",
                                   "the longest transaction timeout a producer may ask"),
    "transactional.id.expiration.ms": ("transactional_id_expiration_ms", "int",
                                       "an idle transactional id is forgotten after this"),
    "producer.id.expiration.ms": ("producer_id_expiration_ms", "int",
                                  "an idle producer's state is forgotten after this"),
    "transaction.state.log.num.partitions": ("transaction_log_partitions", "int",
                                             "the transaction coordinator's partitions"),
    "group.initial.rebalance.delay.ms": ("group_initial_rebalance_delay_ms", "int",
                                         "how long an empty group's first rebalance waits"),
    "offset.metadata.max.bytes": ("offset_metadata_max_bytes", "int",
                                  "the longest metadata an offset commit may carry"),
}  # fmt: skip


def check_broker_name(name: str, node_id: int | None, describing: bool) -> bool:
    """Whether ``name`` names this node (False: the cluster-wide defaults, ""); else the
    INVALID_REQUEST Kafka answers. ``node_id`` None (in process): any node id is this."""
    if name == "":
        return False
    try:
        asked = int(name)
    except ValueError:
        what = "Broker id" if describing else "Node id"
        raise fail(
            KafkaError.INVALID_REQUEST, f"{what} must be an integer, but it is: {name}"
        ) from None
    if node_id is not None and asked != node_id:
        expected = f"{node_id} or empty string" if describing else f"{node_id}"
        raise fail(
            KafkaError.INVALID_REQUEST,
            f"Unexpected broker id, expected {expected}, but received {name}",
        )
    return True


def describe_broker(
    settings: BrokerSettings, name: str, node_id: int | None, keys: Sequence[str] | None
) -> list[DescribeConfigsResourceResult]:
    if not check_broker_name(name, node_id, describing=True):
        return []  # no cluster-wide dynamic default is ever set
    defaults = {f.name: f.default for f in fields(BrokerSettings)}
    out = []
    for kafka_name, (setting, kind, doc) in BROKER_CONFIGS.items():
        if keys is not None and kafka_name not in keys:
            continue
        value, default = getattr(settings, setting), defaults[setting]
        out.append(
            DescribeConfigsResourceResult(
                kafka_name, _text(value),
                CONFIG_SOURCE_DEFAULT if value == default else CONFIG_SOURCE_STATIC_BROKER,
                read_only=True, default_value=_text(default), config_type=_TYPES[kind],
                documentation=f"honoured: {doc}",
            )
        )  # fmt: skip
    return out


def alter_broker(name: str, node_id: int | None, configs: Sequence[AlterableConfig]) -> None:
    """Refuses what Kafka refuses for configs it cannot update dynamically (kip98 can
    update none); deletions pass, nothing being set."""
    check_broker_name(name, node_id, describing=False)
    named = sorted(c.name for c in configs if c.config_operation != OP_DELETE)
    if named:
        raise fail(
            KafkaError.INVALID_REQUEST,
            f"Cannot update these configs dynamically: Set({', '.join(named)})",
        )


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
