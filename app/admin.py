"""AdminClient, shaped like confluent-kafka's: topic management answers with futures,
inspection answers with plain objects. Everything is a call into the broker library;
a database failure reaches the caller as KafkaException, in the future where there is one
(docs/design.md rule 25)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from app.client.args import int_arg, name_arg, names_arg, partitions_arg
from app.client.connection import client_broker, kafka_errors
from app.client.message import TopicPartition
from app.config import ADMIN, parse_config
from app.coordinator.inspect import TransactionDescription, list_transactions
from app.errors import KafkaError, KafkaException, fail
from app.log.inspect import (
    HangingTransaction,
    ProducerDescription,
    abort_hanging,
    describe_producers,
    find_hanging,
)
from app.log.topic_config import effective
from app.log.topics import (
    TopicInfo,
    alter_topic_config,
    create_topic,
    delete_topic,
    describe_topic,
    list_topics,
)
from app.protocol import OffsetFetchRequest
from app.security import acls as acl_admin
from app.security.acls import AclBindingFilter, validate_filter
from app.security.rules import AclBinding, validate_binding

T = TypeVar("T")


@dataclass
class NewTopic:
    topic: str
    num_partitions: int = 1
    replication_factor: int = -1  # accepted for compatibility; PostgreSQL does the durability
    config: dict[str, Any] | None = None


@dataclass(eq=False)
class ConfigResource:
    """confluent-kafka's ConfigResource, for topics: ``set_config`` holds the configs an
    alter_configs call sets; describe_configs answers with ConfigEntry objects."""

    restype: str
    name: str
    set_config_dict: dict[str, Any] = field(default_factory=dict)
    delete_config_list: list[str] = field(default_factory=list)
    incremental: bool = False

    def set_config(self, name: str, value: Any) -> None:
        self.set_config_dict[name] = value

    def delete_config(self, name: str) -> None:
        self.delete_config_list.append(name)

    def __hash__(self) -> int:
        return hash((str(self.restype).lower(), self.name))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConfigResource) and hash(self) == hash(other)


@dataclass(frozen=True)
class ConfigEntry:
    name: str
    value: str
    # DYNAMIC_TOPIC_CONFIG when the topic overrides it, DEFAULT_CONFIG otherwise.
    source: str
    is_default: bool


def _topic_resource(resource: Any) -> ConfigResource:
    if not isinstance(resource, ConfigResource) or str(resource.restype).lower() not in (
        "topic",
        "resourcetype.topic",
    ):
        raise KafkaException(
            KafkaError(
                KafkaError._INVALID_ARG, f"expected a topic ConfigResource, got {resource!r}"
            )
        )
    name_arg(resource.name, "name")
    return resource


@dataclass
class ClusterMetadata:
    topics: dict[str, TopicInfo] = field(default_factory=dict)


def _settled(fn: Callable[[], T]) -> Future[T]:
    """Run now and hand back a completed future (the call is synchronous underneath)."""
    fut: Future[T] = Future()
    try:
        with kafka_errors():
            fut.set_result(fn())
    except KafkaException as exc:
        fut.set_exception(exc)
    return fut


class AdminClient:
    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self._config = parse_config(ADMIN, config or {})
        self._broker = client_broker(
            self._config.get_str("database.url"),
            self._config.get_str("client.id"),
            self._config.get_str("principal"),
        )

    # ------------------------------------------------------------ topics
    def create_topics(self, new_topics: Iterable[NewTopic], **_: Any) -> dict[str, Future[None]]:
        out: dict[str, Future[None]] = {}
        for nt in new_topics:
            if not isinstance(nt, NewTopic):
                raise KafkaException(
                    KafkaError(
                        KafkaError._INVALID_ARG, f"expected NewTopic, got {type(nt).__name__}"
                    )
                )
            out[nt.topic] = _settled(lambda nt=nt: self._create(nt))  # type: ignore[misc]
        return out

    def _create(self, nt: NewTopic) -> None:
        create_topic(self._broker, nt.topic, nt.num_partitions, nt.config)

    def delete_topics(self, topics: Iterable[str], **_: Any) -> dict[str, Future[None]]:
        names = names_arg(topics, "topics")
        return {t: _settled(lambda t=t: delete_topic(self._broker, t)) for t in names}  # type: ignore[misc]

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        with kafka_errors():
            infos = list_topics(self._broker)
        return ClusterMetadata({i.topic: i for i in infos if topic is None or i.topic == topic})

    def alter_configs(
        self, resources: Iterable[ConfigResource], **_: Any
    ) -> dict[ConfigResource, Future[None]]:
        """Set topic configs. As Kafka's AlterConfigs, the given set replaces the topic's
        overrides, unless the resource is marked ``incremental`` (then deletes and sets
        apply on top, as IncrementalAlterConfigs / kafka-configs.sh --alter do)."""
        checked = [_topic_resource(r) for r in resources]
        return {r: _settled(lambda r=r: self._alter_config(r)) for r in checked}  # type: ignore[misc]

    def _alter_config(self, r: ConfigResource) -> None:
        alter_topic_config(
            self._broker, r.name, r.set_config_dict, r.delete_config_list, r.incremental
        )

    def describe_configs(
        self, resources: Iterable[ConfigResource], **_: Any
    ) -> dict[ConfigResource, Future[dict[str, ConfigEntry]]]:
        checked = [_topic_resource(r) for r in resources]
        return {r: _settled(lambda r=r: self._describe_config(r.name)) for r in checked}  # type: ignore[misc]

    def _describe_config(self, name: str) -> dict[str, ConfigEntry]:
        overrides = describe_topic(self._broker, name).config
        return {
            k: ConfigEntry(
                k,
                str(v),
                "DYNAMIC_TOPIC_CONFIG" if k in overrides else "DEFAULT_CONFIG",
                k not in overrides,
            )
            for k, v in effective(overrides).items()
        }

    # ------------------------------------------------------------ transactions
    def list_transactions(self, states: list[str] | None = None) -> list[TransactionDescription]:
        if states is not None:
            states = names_arg(states, "states")
        with kafka_errors():
            return list_transactions(self._broker, states=states)

    def describe_transactions(
        self, transactional_ids: list[str]
    ) -> dict[str, TransactionDescription]:
        transactional_ids = names_arg(transactional_ids, "transactional_ids")
        with kafka_errors():
            described = list_transactions(self._broker, ids=list(transactional_ids))
        found = {d.transactional_id: d for d in described}
        missing = [t for t in transactional_ids if t not in found]
        if missing:
            raise fail(
                KafkaError.TRANSACTIONAL_ID_NOT_FOUND, f"unknown transactional ids: {missing}"
            )
        return found

    def describe_producers(
        self, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, list[ProducerDescription]]:
        checked = partitions_arg(partitions, "partitions")
        with kafka_errors():
            return {tp: describe_producers(self._broker, tp.topic, tp.partition) for tp in checked}

    def find_hanging_transactions(
        self, max_transaction_timeout_ms: int | None = None
    ) -> list[HangingTransaction]:
        if max_transaction_timeout_ms is not None:
            int_arg(max_transaction_timeout_ms, "max_transaction_timeout_ms")
        with kafka_errors():
            return find_hanging(self._broker, max_transaction_timeout_ms)

    def abort_transaction(self, topic: str, partition: int, start_offset: int) -> bool:
        name_arg(topic, "topic")
        int_arg(partition, "partition")
        int_arg(start_offset, "start_offset")
        with kafka_errors():
            return abort_hanging(self._broker, topic, partition, start_offset)

    # ------------------------------------------------------------ groups
    def list_consumer_group_offsets(self, group_id: str) -> list[TopicPartition]:
        name_arg(group_id, "group_id")
        with kafka_errors():
            r = self._broker.handle(OffsetFetchRequest(group_id))
        if r.error_code:
            raise fail(r.error_code, r.error_message)
        return [
            TopicPartition(t, p, om.offset, om.metadata) for (t, p), om in sorted(r.offsets.items())
        ]

    # ------------------------------------------------------------ ACLs
    def create_acls(self, acls: Iterable[AclBinding], **_: Any) -> dict[AclBinding, Future[None]]:
        """One future per ACL; they are stored together or not at all."""
        bindings = [validate_binding(a) for a in acls]
        outcome = _settled(lambda: acl_admin.create_acls(self._broker, bindings))
        return dict.fromkeys(bindings, outcome)

    def describe_acls(
        self, acl_filter: AclBindingFilter | None = None, **_: Any
    ) -> Future[list[AclBinding]]:
        return _settled(
            lambda: acl_admin.describe_acls(self._broker, acl_filter or AclBindingFilter())
        )

    def delete_acls(
        self, acl_filters: Iterable[AclBindingFilter], **_: Any
    ) -> dict[AclBindingFilter, Future[list[AclBinding]]]:
        """Per filter, a future of the ACLs it deleted."""
        filters = [validate_filter(f) for f in acl_filters]
        return {
            f: _settled(lambda f=f: acl_admin.delete_acls(self._broker, f))  # type: ignore[misc]
            for f in filters
        }

    def close(self) -> None:
        self._broker.engine.dispose()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
