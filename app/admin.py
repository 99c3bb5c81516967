"""AdminClient, shaped like confluent-kafka's: topic management answers with futures,
inspection answers with plain objects. Every operation is a request to the broker
(``Broker.handle``), as Kafka's AdminClient sends RPCs, and each item's error code in the
response becomes that item's KafkaException. A database failure reaches the caller as
KafkaException too, in the future where there is one (docs/design.md rule 25)."""

from __future__ import annotations

import enum
import hashlib
import os
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from app.client.args import int_arg, name_arg, names_arg, partitions_arg
from app.client.closing import Closing
from app.client.connection import client_broker, kafka_errors
from app.client.message import TopicPartition
from app.config import ADMIN, parse_config
from app.errors import KafkaError, KafkaException, fail
from app.protocol import (
    CONFIG_SOURCE_DYNAMIC_TOPIC,
    OP_DELETE,
    OP_SET,
    RESOURCE_TOPIC,
    SCRAM_MECHANISM_CODES,
    AbortTransactionRequest,
    AclBinding,
    AclBindingFilter,
    AlterableConfig,
    AlterConfigsRequest,
    AlterConfigsResource,
    AlterUserScramCredentialsRequest,
    CreatableTopic,
    CreateAclsRequest,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteAclsRequest,
    DeleteGroupsRequest,
    DeleteRecordsRequest,
    DeleteTopicsRequest,
    DescribeAclsRequest,
    DescribeConfigsRequest,
    DescribeConfigsResource,
    DescribeConfigsResult,
    DescribeProducersRequest,
    DescribeTransactionsRequest,
    DescribeUserScramCredentialsRequest,
    FindHangingTransactionsRequest,
    HangingTransaction,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResource,
    ListTopicsRequest,
    ListTransactionsRequest,
    OffsetDeleteRequest,
    OffsetFetchRequest,
    PartitionCount,
    ProducerDescription,
    R,
    Request,
    ScramUpsertion,
    TopicInfo,
    TransactionDescription,
    UserScramCredentials,
    validate_binding,
    validate_filter,
)

__all__ = [
    "AclBinding", "AclBindingFilter", "AdminClient", "ClusterMetadata", "ConfigEntry",
    "ConfigResource", "DeletedRecords", "NewPartitions", "NewTopic", "ScramCredentialInfo",
    "ScramMechanism", "UserScramCredentialDeletion", "UserScramCredentialUpsertion",
    "UserScramCredentialsDescription",
]  # fmt: skip

T = TypeVar("T")


@dataclass
class NewTopic:
    topic: str
    num_partitions: int = 1
    replication_factor: int = -1  # accepted for compatibility; PostgreSQL does the durability
    config: dict[str, Any] | None = None


@dataclass
class NewPartitions:
    """confluent-kafka's NewPartitions: the topic's new partition count. A replica
    assignment is accepted and ignored (PostgreSQL holds the data)."""

    topic: str
    new_total_count: int
    replica_assignment: list[list[int]] | None = None


@dataclass(frozen=True)
class DeletedRecords:
    """What delete_records answers per partition: its log start now."""

    low_watermark: int


class ScramMechanism(enum.IntEnum):
    """confluent-kafka's ScramMechanism, with Kafka's codes."""

    UNKNOWN = 0
    SCRAM_SHA_256 = 1
    SCRAM_SHA_512 = 2

    @property
    def sasl_name(self) -> str:
        return self.name.replace("_", "-")


@dataclass(frozen=True)
class ScramCredentialInfo:
    mechanism: ScramMechanism
    iterations: int


@dataclass(frozen=True)
class UserScramCredentialsDescription:
    user: str
    scram_credential_infos: list[ScramCredentialInfo]


@dataclass(frozen=True)
class UserScramCredentialUpsertion:
    """A SCRAM credential to set for ``user``: the password never leaves the client, only
    the salted password derived from it (RFC 5802's Hi), as Kafka's clients send it."""

    user: str
    scram_credential_info: ScramCredentialInfo
    password: bytes
    salt: bytes | None = None


@dataclass(frozen=True)
class UserScramCredentialDeletion:
    user: str
    mechanism: ScramMechanism


# A salt of this many random bytes when an upsertion gives none (librdkafka's length).
SCRAM_SALT_BYTES = 64


def _salted_password(mechanism: ScramMechanism, password: bytes, salt: bytes, i: int) -> bytes:
    """RFC 5802's SaltedPassword, Hi(password, salt, i): PBKDF2 with the mechanism's HMAC."""
    digest = "sha256" if mechanism == ScramMechanism.SCRAM_SHA_256 else "sha512"
    return hashlib.pbkdf2_hmac(digest, password, salt, i)


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


def _done(value: T) -> Future[T]:
    fut: Future[T] = Future()
    fut.set_result(value)
    return fut


def _failed(exc: KafkaException) -> Future[Any]:
    fut: Future[Any] = Future()
    fut.set_exception(exc)
    return fut


def _outcome(code: int, message: str | None, value: T) -> Future[T]:
    """An item's future from its answer in a response."""
    return _done(value) if code == KafkaError.NO_ERROR else _failed(fail(code, message))


def _check(code: int, message: str | None) -> None:
    if code != KafkaError.NO_ERROR:
        raise fail(code, message)


def _config_entries(result: DescribeConfigsResult) -> dict[str, ConfigEntry]:
    return {
        c.name: ConfigEntry(
            c.name,
            c.value,
            "DYNAMIC_TOPIC_CONFIG"
            if c.config_source == CONFIG_SOURCE_DYNAMIC_TOPIC
            else "DEFAULT_CONFIG",
            c.config_source != CONFIG_SOURCE_DYNAMIC_TOPIC,
        )
        for c in result.configs
    }


def _scram_description(u: UserScramCredentials) -> UserScramCredentialsDescription:
    return UserScramCredentialsDescription(
        u.user,
        [
            ScramCredentialInfo(ScramMechanism(SCRAM_MECHANISM_CODES[m]), i)
            for m, i in u.credentials
        ],
    )


def _incremental(r: ConfigResource) -> IncrementalAlterConfigsResource:
    """set_config's and delete_config's changes as KIP-339's operations, each config once: a
    config both set and deleted is set (the deletes apply first)."""
    deletes = dict.fromkeys(r.delete_config_list)
    ops = [AlterableConfig(k, OP_DELETE) for k in deletes if k not in r.set_config_dict]
    ops += [AlterableConfig(k, OP_SET, v) for k, v in r.set_config_dict.items()]
    return IncrementalAlterConfigsResource(RESOURCE_TOPIC, r.name, ops)


class AdminClient(Closing):
    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self._config = parse_config(ADMIN, config or {})
        self._broker = client_broker(
            self._config.get_str("database.url"),
            self._config.get_str("client.id"),
            self._config.get_str("principal"),
        )

    def _send(self, request: Request[R]) -> R:
        with kafka_errors():
            return self._broker.handle(request)

    def _futures(
        self, keys: list[Any], request: Request[R], outcomes: Callable[[R], list[Future[Any]]]
    ) -> dict[Any, Future[Any]]:
        """Each key's future, from the response's items in request order; a request that
        failed as a whole fails every future."""
        try:
            response = self._send(request)
        except KafkaException as exc:
            return {k: _failed(exc) for k in keys}
        return dict(zip(keys, outcomes(response), strict=True))

    # ------------------------------------------------------------ topics
    def create_topics(self, new_topics: Iterable[NewTopic], **_: Any) -> dict[str, Future[None]]:
        topics = list(new_topics)
        for nt in topics:
            if not isinstance(nt, NewTopic):
                raise KafkaException(
                    KafkaError(
                        KafkaError._INVALID_ARG, f"expected NewTopic, got {type(nt).__name__}"
                    )
                )
        request = CreateTopicsRequest(
            [CreatableTopic(nt.topic, nt.num_partitions, nt.config) for nt in topics]
        )
        return self._futures(
            [nt.topic for nt in topics],
            request,
            lambda r: [_outcome(t.error_code, t.error_message, None) for t in r.topics],
        )

    def delete_topics(self, topics: Iterable[str], **_: Any) -> dict[str, Future[None]]:
        names = names_arg(topics, "topics")
        return self._futures(
            names,
            DeleteTopicsRequest(names),
            lambda r: [_outcome(t.error_code, t.error_message, None) for t in r.responses],
        )

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        infos = self._send(ListTopicsRequest()).topics
        return ClusterMetadata({i.topic: i for i in infos if topic is None or i.topic == topic})

    def alter_configs(
        self, resources: Iterable[ConfigResource], **_: Any
    ) -> dict[ConfigResource, Future[None]]:
        """Set topic configs. As Kafka's AlterConfigs, the given set replaces the topic's
        overrides, unless the resource is marked ``incremental`` (then deletes and sets
        apply on top, as IncrementalAlterConfigs / kafka-configs.sh --alter do)."""
        checked = [_topic_resource(r) for r in resources]
        replaced = [r for r in checked if not r.incremental]
        incremental = [r for r in checked if r.incremental]
        out: dict[ConfigResource, Future[None]] = {}
        if replaced:
            request = AlterConfigsRequest(
                [
                    AlterConfigsResource(
                        RESOURCE_TOPIC,
                        r.name,
                        {**dict.fromkeys(r.delete_config_list), **r.set_config_dict},
                    )
                    for r in replaced
                ]
            )
            out.update(self._futures(replaced, request, self._altered))
        if incremental:
            request_inc = IncrementalAlterConfigsRequest([_incremental(r) for r in incremental])
            out.update(self._futures(incremental, request_inc, self._altered))
        return {r: out[r] for r in checked}

    @staticmethod
    def _altered(response: Any) -> list[Future[Any]]:
        return [_outcome(r.error_code, r.error_message, None) for r in response.responses]

    def describe_configs(
        self, resources: Iterable[ConfigResource], **_: Any
    ) -> dict[ConfigResource, Future[dict[str, ConfigEntry]]]:
        checked = [_topic_resource(r) for r in resources]
        request = DescribeConfigsRequest(
            [DescribeConfigsResource(RESOURCE_TOPIC, r.name) for r in checked]
        )
        return self._futures(
            checked,
            request,
            lambda resp: [
                _outcome(r.error_code, r.error_message, _config_entries(r)) for r in resp.results
            ],
        )

    # ------------------------------------------------------------ transactions
    def list_transactions(self, states: list[str] | None = None) -> list[TransactionDescription]:
        """The transactional ids in ``states`` (all if None), described: Kafka's
        ListTransactions, then DescribeTransactions of what it listed."""
        if states is not None:
            states = names_arg(states, "states")
        listed = self._send(ListTransactionsRequest(states)).transaction_states
        if not listed:
            return []
        ids = [t.transactional_id for t in listed]
        described = self._send(DescribeTransactionsRequest(ids)).transaction_states
        found = [
            d.description
            for d in described
            if d.description is not None and (states is None or d.description.state in states)
        ]
        return sorted(found, key=lambda d: d.transactional_id)

    def describe_transactions(
        self, transactional_ids: list[str]
    ) -> dict[str, TransactionDescription]:
        transactional_ids = names_arg(transactional_ids, "transactional_ids")
        answers = self._send(DescribeTransactionsRequest(list(transactional_ids)))
        missing = []
        found = {}
        for a in answers.transaction_states:
            if a.error_code == KafkaError.TRANSACTIONAL_ID_NOT_FOUND:
                missing.append(a.transactional_id)
                continue
            _check(a.error_code, a.error_message)
            assert a.description is not None
            found[a.transactional_id] = a.description
        if missing:
            raise fail(
                KafkaError.TRANSACTIONAL_ID_NOT_FOUND, f"unknown transactional ids: {missing}"
            )
        return dict(sorted(found.items()))

    def describe_producers(
        self, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, list[ProducerDescription]]:
        checked = partitions_arg(partitions, "partitions")
        answers = self._send(DescribeProducersRequest([(tp.topic, tp.partition) for tp in checked]))
        out = {}
        for tp, a in zip(checked, answers.partitions, strict=True):
            _check(a.error_code, a.error_message)
            out[tp] = a.active_producers
        return out

    def find_hanging_transactions(
        self, max_transaction_timeout_ms: int | None = None
    ) -> list[HangingTransaction]:
        if max_transaction_timeout_ms is not None:
            int_arg(max_transaction_timeout_ms, "max_transaction_timeout_ms")
        return self._send(FindHangingTransactionsRequest(max_transaction_timeout_ms)).transactions

    def abort_transaction(self, topic: str, partition: int, start_offset: int) -> bool:
        name_arg(topic, "topic")
        int_arg(partition, "partition")
        int_arg(start_offset, "start_offset")
        a = self._send(AbortTransactionRequest(topic, partition, start_offset))
        _check(a.error_code, a.error_message)
        return a.written

    def create_partitions(
        self, new_partitions: Iterable[NewPartitions], validate_only: bool = False, **_: Any
    ) -> dict[str, Future[None]]:
        """Grow each topic to its new total count (never shrinks: INVALID_PARTITIONS)."""
        asked = list(new_partitions)
        for np in asked:
            if not isinstance(np, NewPartitions):
                raise fail(KafkaError._INVALID_ARG, f"expected NewPartitions, got {np!r}")
            name_arg(np.topic, "topic")
            int_arg(np.new_total_count, "new_total_count")
        request = CreatePartitionsRequest(
            [PartitionCount(np.topic, np.new_total_count) for np in asked], validate_only
        )
        return self._futures(
            [np.topic for np in asked],
            request,
            lambda r: [_outcome(t.error_code, t.error_message, None) for t in r.results],
        )

    def delete_records(
        self, topic_partition_offsets: Iterable[TopicPartition], **_: Any
    ) -> dict[TopicPartition, Future[DeletedRecords]]:
        """Delete each partition's records below its offset (OFFSET_END: all of them): its
        log start moves there."""
        partitions = partitions_arg(list(topic_partition_offsets), "topic_partition_offsets")
        request = DeleteRecordsRequest([(tp.topic, tp.partition, tp.offset) for tp in partitions])
        return self._futures(
            partitions,
            request,
            lambda r: [
                _outcome(d.error_code, d.error_message, DeletedRecords(d.low_watermark))
                for d in r.results
            ],
        )

    # ------------------------------------------------------------ groups
    def list_consumer_group_offsets(self, group_id: str) -> list[TopicPartition]:
        name_arg(group_id, "group_id")
        r = self._send(OffsetFetchRequest(group_id))
        _check(r.error_code, r.error_message)
        return [
            TopicPartition(
                t, p, om.offset, om.metadata, None if om.leader_epoch < 0 else om.leader_epoch
            )
            for (t, p), om in sorted(r.offsets.items())
        ]

    def delete_consumer_groups(self, group_ids: list[str], **_: Any) -> dict[str, Future[None]]:
        """Delete each group, which must have no members, with its committed offsets."""
        names = names_arg(group_ids, "group_ids")
        return self._futures(
            names,
            DeleteGroupsRequest(names),
            lambda r: [_outcome(g.error_code, g.error_message, None) for g in r.results],
        )

    def delete_consumer_group_offsets(
        self, group_id: str, partitions: list[TopicPartition], **_: Any
    ) -> dict[TopicPartition, Future[None]]:
        """Forget the group's committed offsets of these partitions (Kafka's
        deleteConsumerGroupOffsets); a partition of a topic its members are subscribed to
        is refused (GROUP_SUBSCRIBED_TO_TOPIC)."""
        name_arg(group_id, "group_id")
        checked = partitions_arg(partitions, "partitions")
        request = OffsetDeleteRequest(group_id, [(tp.topic, tp.partition) for tp in checked])
        return self._futures(
            checked,
            request,
            lambda r: [
                _outcome(r.error_code or r.results[(tp.topic, tp.partition)], r.error_message, None)
                for tp in checked
            ],
        )

    # ------------------------------------------------------------ SCRAM users
    def describe_user_scram_credentials(
        self, users: list[str] | None = None, **_: Any
    ) -> (
        Future[dict[str, UserScramCredentialsDescription]]
        | dict[str, Future[UserScramCredentialsDescription]]
    ):
        """As confluent-kafka's: for every user (``users`` None or empty), one future of
        all their descriptions; for the users named, a future each."""
        names = None if not users else names_arg(users, "users")
        try:
            r = self._send(DescribeUserScramCredentialsRequest(names))
        except KafkaException as exc:
            return _failed(exc) if names is None else dict.fromkeys(names, _failed(exc))
        if names is None:
            if r.error_code:
                return _failed(fail(r.error_code, r.error_message))
            return _done({u.user: _scram_description(u) for u in r.results})
        if r.error_code:
            return dict.fromkeys(names, _failed(fail(r.error_code, r.error_message)))
        return {
            u.user: _outcome(u.error_code, u.error_message, _scram_description(u))
            for u in r.results
        }

    def alter_user_scram_credentials(
        self,
        alterations: list[UserScramCredentialUpsertion | UserScramCredentialDeletion],
        **_: Any,
    ) -> dict[str, Future[None]]:
        """Each user's alterations together, a future per user."""
        deletions: list[tuple[str, str]] = []
        upsertions: list[ScramUpsertion] = []
        for a in alterations:
            if isinstance(a, UserScramCredentialDeletion):
                deletions.append((name_arg(a.user, "user"), ScramMechanism(a.mechanism).sasl_name))
            elif isinstance(a, UserScramCredentialUpsertion):
                info = a.scram_credential_info
                mechanism = ScramMechanism(info.mechanism)
                salt = a.salt or os.urandom(SCRAM_SALT_BYTES)
                salted = _salted_password(mechanism, bytes(a.password), salt, info.iterations)
                upsertions.append(
                    ScramUpsertion(
                        name_arg(a.user, "user"), mechanism.sasl_name, info.iterations, salt,
                        salted,
                    )
                )  # fmt: skip
            else:
                raise fail(KafkaError._INVALID_ARG, f"expected a SCRAM alteration, got {a!r}")
        users = list(dict.fromkeys([n for n, _ in deletions] + [u.user for u in upsertions]))
        return self._futures(
            users,
            AlterUserScramCredentialsRequest(deletions, upsertions),
            lambda r: [_outcome(u.error_code, u.error_message, None) for u in r.results],
        )

    # ------------------------------------------------------------ ACLs
    def create_acls(self, acls: Iterable[AclBinding], **_: Any) -> dict[AclBinding, Future[None]]:
        """One future per ACL; they are stored together or not at all."""
        bindings = [validate_binding(a) for a in acls]
        try:
            results = self._send(CreateAclsRequest(bindings)).results
        except KafkaException as exc:
            return dict.fromkeys(bindings, _failed(exc))
        refused = next((r for r in results if r.error_code != KafkaError.NO_ERROR), None)
        outcome = (
            _done(None)
            if refused is None
            else _failed(fail(refused.error_code, refused.error_message))
        )
        return dict.fromkeys(bindings, outcome)

    def describe_acls(
        self, acl_filter: AclBindingFilter | None = None, **_: Any
    ) -> Future[list[AclBinding]]:
        request = DescribeAclsRequest(acl_filter or AclBindingFilter())
        try:
            r = self._send(request)
        except KafkaException as exc:
            return _failed(exc)
        return _outcome(r.error_code, r.error_message, r.acls)

    def delete_acls(
        self, acl_filters: Iterable[AclBindingFilter], **_: Any
    ) -> dict[AclBindingFilter, Future[list[AclBinding]]]:
        """Per filter, a future of the ACLs it deleted."""
        filters = [validate_filter(f) for f in acl_filters]
        return self._futures(
            filters,
            DeleteAclsRequest(filters),
            lambda resp: [
                _outcome(r.error_code, r.error_message, r.matching_acls)
                for r in resp.filter_results
            ],
        )

    def close(self) -> None:
        self._broker.engine.dispose()
