"""Topic administration: create, list, describe, delete (the data plane's metadata)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError

from app.errors import KafkaError, KafkaException, fail
from app.log import compacted, insync, sql
from app.log.naming import (
    could_exist,
    unify_collision_chars,
    validate_num_partitions,
    validate_topic_name,
)
from app.log.topic_config import altered, partition_columns, validate_topic_config
from app.protocol import (
    MetadataRequest,
    MetadataResponse,
    PartitionInfo,
    TopicInfo,
    TopicMetadata,
)
from app.security import needs
from app.security.authorizer import authorize_any, denied_checks, topic_checks
from app.security.rules import DESCRIBE
from app.storage.context import BrokerContext
from app.storage.engine import retry_conflicts

__all__ = [
    "PartitionInfo", "TopicInfo", "alter_topic_config", "authorize_alter",
    "create_partitions_in", "create_topic",
    "delete_topic", "describe_topic", "list_topics", "metadata",
]  # fmt: skip


@retry_conflicts
def create_topic(
    broker: BrokerContext,
    name: str,
    num_partitions: int = 1,
    config: dict[str, Any] | None = None,
    validate_only: bool = False,
) -> TopicInfo:
    """``validate_only``: every check (the name taken included), nothing written."""
    validate_topic_name(name)
    validate_num_partitions(num_partitions)
    cfg = validate_topic_config(config)
    try:
        with broker.engine.begin() as conn:
            authorize_any(conn, broker, needs.create_topic(name))
            _refuse_collision(conn, name)
            if validate_only:
                if conn.execute(sql.TOPIC_EXISTS, {"topic": name}).first() is not None:
                    raise fail(KafkaError.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
                return TopicInfo(name, num_partitions, cfg)
            conn.execute(
                sql.INSERT_TOPIC,
                {
                    "topic": name,
                    "n": num_partitions,
                    "config": json.dumps(cfg),
                    "now": broker.clock.now_ms(),
                },
            )
            conn.execute(
                sql.INSERT_PARTITIONS,
                {"topic": name, "first": 0, "n": num_partitions,
                 **partition_columns(cfg).as_params()},
            )  # fmt: skip
    except IntegrityError as exc:
        raise fail(KafkaError.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists") from exc
    insync.forget(broker.engine)  # this process's next acks=all write sees it at once
    compacted.forget(broker.engine)
    return TopicInfo(name, num_partitions, cfg)


def _refuse_collision(conn: Connection, name: str) -> None:
    """INVALID_TOPIC_EXCEPTION if another topic's name differs from ``name`` only in '.'
    against '_', as Kafka's controller refuses it. The lock on the unified name, held to
    the end of the creating DB transaction, makes a concurrent colliding creation wait and
    then see this one."""
    if "." not in name and "_" not in name:
        return  # neither character: nothing can collide with it
    unified = unify_collision_chars(name)
    conn.execute(sql.LOCK_TOPIC_NAME, {"unified": unified})
    if conn.execute(sql.TOPIC_EXISTS, {"topic": name}).first() is not None:
        return  # TOPIC_ALREADY_EXISTS is the answer, as Kafka's comes before the collision
    other = conn.execute(sql.COLLIDING_TOPIC, {"unified": unified, "topic": name}).scalar()
    if other is not None:
        raise fail(
            KafkaError.INVALID_TOPIC_EXCEPTION,
            f"Topic '{name}' collides with existing topic: {other}",
        )


def create_partitions_in(
    conn: Connection, broker: BrokerContext, name: str, count: int, validate_only: bool = False
) -> int:
    """Kafka's CreatePartitions of one topic on ``conn``: it grows to ``count`` partitions
    (never shrinks, nor stays: INVALID_PARTITIONS), the new ones with the topic's configs,
    each leading in epoch 0. Needs Alter on the topic or the cluster. Returns the count it
    had. Who reads the topic learns of the new partitions from Metadata; a native group
    subscribed to it is the groups' business (``broker.admin.topics``)."""
    validate_topic_name(name)
    authorize_any(conn, broker, needs.alter_topic(name))
    row = conn.execute(sql.TOPIC_FOR_GROWTH, {"t": name}).first()
    if row is None:
        raise fail(KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
    validate_num_partitions(count)
    if count < row.num_partitions:
        raise fail(
            KafkaError.INVALID_PARTITIONS,
            f"topic {name!r} has {row.num_partitions} partitions, more than the {count} "
            "asked: a topic never shrinks",
        )
    if count == row.num_partitions:
        raise fail(KafkaError.INVALID_PARTITIONS, f"topic {name!r} already has {count} partitions")
    if not validate_only:
        conn.execute(sql.SET_NUM_PARTITIONS, {"t": name, "n": count})
        conn.execute(
            sql.INSERT_PARTITIONS,
            {"topic": name, "first": row.num_partitions, "n": count,
             **partition_columns(row.config).as_params()},
        )  # fmt: skip
    current: int = row.num_partitions
    return current


@retry_conflicts
def delete_topic(broker: BrokerContext, name: str) -> None:
    """Delete a topic and its data, in a DB transaction of its own."""
    with broker.engine.begin() as conn:
        delete_topic_in(conn, broker, name)


def delete_topic_in(conn: Connection, broker: BrokerContext, name: str) -> None:
    """Delete a topic and its data on ``conn``; its partition locks are taken first (in
    order). The groups' offsets of it are the groups' business (``broker.admin.topics``
    deletes both in one DB transaction)."""
    authorize_any(conn, broker, needs.delete_topic(name))
    if not could_exist(name):
        raise fail(KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
    locked = conn.execute(sql.LOCK_TOPIC_PARTITIONS, {"t": name}).all()
    if not locked:
        raise fail(KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
    for statement in sql.DELETE_TOPIC:
        conn.execute(statement, {"t": name})


@retry_conflicts
def alter_topic_config(
    broker: BrokerContext,
    name: str,
    set_config: dict[str, Any] | None = None,
    delete_config: list[str] | None = None,
    incremental: bool = True,
    *,
    append: Mapping[str, Any] | None = None,
    subtract: Mapping[str, Any] | None = None,
    validate_only: bool = False,
) -> dict[str, Any]:
    """Change a topic's config overrides; returns the overrides now stored (or, with
    ``validate_only``, that would be).

    Incremental (kafka-configs.sh --add-config/--delete-config) keeps the other overrides;
    otherwise the given set replaces them all (Kafka's AlterConfigs). ``append`` and
    ``subtract``: items added to or taken from a list config (KIP-339). Takes effect at
    the cleaner's next pass.
    """
    with broker.engine.begin() as conn:
        authorize_any(conn, broker, needs.alter_topic(name))
        # The partition rows first, in order, as a deletion takes them; they keep the
        # configs an append obeys.
        conn.execute(sql.LOCK_TOPIC_PARTITIONS, {"t": name})
        current = conn.execute(sql.TOPIC_CONFIG_FOR_UPDATE, {"t": name}).scalar()
        if current is None:
            raise fail(KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
        new = altered(
            current if incremental else {},
            set_config or {},
            delete_config or (),
            append,
            subtract,
        )
        if validate_only:
            return new
        conn.execute(sql.SET_TOPIC_CONFIG, {"t": name, "config": json.dumps(new)})
        conn.execute(sql.SET_PARTITION_CONFIGS, {"t": name, **partition_columns(new).as_params()})
    insync.forget(broker.engine)
    compacted.forget(broker.engine)
    return new


def authorize_alter(broker: BrokerContext, name: str) -> None:
    """Alter on the topic (or cluster): what changing its configs or cleaning it needs."""
    with broker.engine.connect() as conn:
        authorize_any(conn, broker, needs.alter_topic(name))


def list_topics(broker: BrokerContext) -> list[TopicInfo]:
    """The topics the principal may describe (Describe, or an operation that implies it),
    as Kafka's Metadata for all topics lists them: the others are left out."""
    with broker.engine.connect() as conn:
        rows = conn.execute(sql.LIST_TOPICS).all()
        hidden = _undescribable(conn, broker, {r.topic for r in rows})
    topics: dict[str, TopicInfo] = {}
    parts: dict[str, list[PartitionInfo]] = {}
    for r in rows:
        if r.topic in hidden:
            continue
        topics.setdefault(r.topic, TopicInfo(r.topic, r.num_partitions, r.config))
        parts.setdefault(r.topic, []).append(
            PartitionInfo(r.partition, r.log_start_offset, r.next_offset, r.last_stable_offset)
        )
    return [
        TopicInfo(t.topic, t.num_partitions, t.config, tuple(parts[t.topic]))
        for t in topics.values()
    ]


def describe_topic(broker: BrokerContext, name: str) -> TopicInfo:
    for info in list_topics(broker):
        if info.topic == name:
            return info
    with broker.engine.connect() as conn:
        if _undescribable(conn, broker, {name}):
            raise fail(
                KafkaError.TOPIC_AUTHORIZATION_FAILED, f"not authorized to describe {name!r}"
            )
    raise fail(KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")


def metadata(broker: BrokerContext, req: MetadataRequest) -> MetadataResponse:
    """Kafka's Metadata for the topics asked (all of them if None): each one's partition
    count, topic id and partitions' leader epochs, or UNKNOWN_TOPIC_OR_PARTITION. As in
    Kafka, a topic the principal may not describe is left out of a listing of all topics,
    and answered TOPIC_AUTHORIZATION_FAILED when asked for by name, whether it exists or
    not, so its existence is not told. A topic asked for by name that does not exist is
    created if the request allows it and the broker auto-creates topics
    (``auto_create_topics``, Kafka's auto.create.topics.enable), with ``num_partitions``
    partitions, as a CreateTopics would: the principal needs Create on the cluster or the
    topic (TOPIC_AUTHORIZATION_FAILED otherwise), the name must be legal."""
    illegal = set() if req.topics is None else {n for n in req.topics if not could_exist(n)}
    asked = None if req.topics is None else [n for n in req.topics if n not in illegal]
    found, hidden = _described_topics(broker, asked)
    if req.topics is None:
        return MetadataResponse([found[name] for name in sorted(found)])
    invalid = KafkaError.INVALID_TOPIC_EXCEPTION  # as Kafka answers a name it cannot have
    refused: dict[str, TopicMetadata] = {n: TopicMetadata(invalid, n) for n in illegal}
    missing = [n for n in dict.fromkeys(req.topics) if n not in found and n not in hidden | illegal]
    if missing and req.allow_auto_topic_creation and broker.settings.auto_create_topics:
        for name in missing:
            try:
                create_topic(broker, name, broker.settings.num_partitions)
            except KafkaException as exc:
                code = exc.error.code()
                if code == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue  # made meanwhile by another request: it is there
                if code == KafkaError.CLUSTER_AUTHORIZATION_FAILED:
                    code = KafkaError.TOPIC_AUTHORIZATION_FAILED
                if code == KafkaError.INVALID_TOPIC_EXCEPTION:
                    # A legal name colliding with a topic's ('.' against '_'): Kafka's
                    # Metadata answers the creation it hands its controller (which then
                    # refuses it) as a topic not there yet.
                    code = KafkaError.UNKNOWN_TOPIC_OR_PARTITION
                refused[name] = TopicMetadata(code, name, error_message=exc.error.str())
        found.update(_described_topics(broker, missing)[0])
    unknown = KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    denied = KafkaError.TOPIC_AUTHORIZATION_FAILED
    return MetadataResponse(
        [
            TopicMetadata(denied, name) if name in hidden else found.get(name) or
            refused.get(name) or TopicMetadata(unknown, name)
            for name in req.topics
        ]
    )  # fmt: skip


def _described_topics(
    broker: BrokerContext, names: list[str] | None
) -> tuple[dict[str, TopicMetadata], set[str]]:
    """The topics of ``names`` (all if None) the principal may describe, and those of
    ``names`` it may not."""
    with broker.engine.connect() as conn:
        if names is None:
            rows = conn.execute(sql.ALL_TOPIC_IDS).all()
            hidden = _undescribable(conn, broker, {r.topic for r in rows})
        else:
            rows = conn.execute(sql.TOPIC_IDS, {"topics": list(names)}).all()
            hidden = _undescribable(conn, broker, set(names))
    found = {
        r.topic: TopicMetadata(
            KafkaError.NO_ERROR, r.topic, r.num_partitions, str(r.topic_id),
            tuple(r.leader_epochs),
        )
        for r in rows
        if r.topic not in hidden
    }  # fmt: skip
    return found, hidden


def _undescribable(conn: Connection, broker: BrokerContext, topics: set[str]) -> set[str]:
    """Those of ``topics`` the principal may not describe (none with authorization off)."""
    return {c.name for c in denied_checks(conn, broker, topic_checks(DESCRIBE, topics))}
