"""Which request needs what: the KIP-98 authorization table as pure functions.

Each returns the checks of one request in the order Kafka makes them, so a request that
fails several reports the same error Kafka would (the transactional id before topics,
the group before its partitions). The handlers pass the result to
``authorizer.authorize_all`` inside their DB transaction, before any write.
"""

from __future__ import annotations

from collections.abc import Iterable

from app.security.authorizer import topic_checks
from app.security.rules import (
    ALTER,
    CLUSTER_ACTION,
    CREATE,
    DELETE,
    DESCRIBE,
    GROUP,
    READ,
    TRANSACTIONAL_ID,
    WRITE,
    Check,
    cluster_check,
)


def _txn(transactional_id: object) -> Check:
    return Check(WRITE, TRANSACTIONAL_ID, str(transactional_id))


def _group(operation: str, group_id: object) -> Check:
    return Check(operation, GROUP, str(group_id))


def produce(topic: object, transactional_id: object | None) -> list[Check]:
    """Write on the topic; a transactional batch also Write on its transactional id (the
    KIP's guard against an "endless transaction" from an unauthorized producer)."""
    checks = [_txn(transactional_id)] if transactional_id else []
    return checks + topic_checks(WRITE, [topic])


def fetch(topic: object) -> list[Check]:
    return topic_checks(READ, [topic])


def list_offsets(topic: object) -> list[Check]:
    return topic_checks(DESCRIBE, [topic])


def init_producer_id(transactional_id: object) -> list[Check]:
    return [_txn(transactional_id)]


def add_partitions_to_txn(
    transactional_id: object, partitions: Iterable[tuple[object, object]]
) -> list[Check]:
    return [_txn(transactional_id), *topic_checks(WRITE, [t for t, _ in partitions])]


def add_offsets_to_txn(transactional_id: object, group_id: object) -> list[Check]:
    return [_txn(transactional_id), _group(READ, group_id)]


def end_txn(transactional_id: object) -> list[Check]:
    return [_txn(transactional_id)]


def write_txn_markers() -> list[Check]:
    """The only way to a control record: inter-broker, so ClusterAction on the cluster."""
    return [cluster_check(CLUSTER_ACTION)]


def write_txn_markers_request() -> list[Check]:
    """WriteTxnMarkers from a client (Admin.abortTransaction): Alter or ClusterAction on the
    cluster, either one, as Kafka checks it (``authorize_any``)."""
    return [cluster_check(ALTER), cluster_check(CLUSTER_ACTION)]


def offset_commit(group_id: object) -> list[Check]:
    """Read on the group; each partition's topic is checked on its own
    (``offset_topics``), a refused one answered for its partitions only, as Kafka does."""
    return [_group(READ, group_id)]


def offset_topics(partitions: Iterable[tuple[object, object]]) -> list[Check]:
    """Read on the topics of an offset commit's (or an offset deletion's) partitions."""
    return topic_checks(READ, [t for t, _ in partitions])


def txn_offset_commit(transactional_id: object, group_id: object) -> list[Check]:
    return [_txn(transactional_id), *offset_commit(group_id)]


def offset_fetch(group_id: object) -> list[Check]:
    """Describe, as in Kafka (Read on the group grants it)."""
    return [_group(DESCRIBE, group_id)]


def describe_group(group_id: object) -> list[Check]:
    """DescribeGroups, and which groups ListGroups shows."""
    return [_group(DESCRIBE, group_id)]


def delete_group(group_id: object) -> list[Check]:
    """DeleteGroups and OffsetDelete: Delete on the group (OffsetDelete also Read on each
    partition's topic: ``offset_topics``)."""
    return [_group(DELETE, group_id)]


def group_membership(group_id: object) -> list[Check]:
    """JoinGroup, SyncGroup, Heartbeat, LeaveGroup."""
    return [_group(READ, group_id)]


def create_topic(topic: object) -> list[Check]:
    """Alternatives: Create on the cluster, or on the topic (Kafka's CreateTopics)."""
    return [cluster_check(CREATE), *topic_checks(CREATE, [topic])]


def delete_topic(topic: object) -> list[Check]:
    """Alternatives: Delete on the cluster, or on the topic."""
    return [cluster_check(DELETE), *topic_checks(DELETE, [topic])]


def delete_records(topic: object) -> list[Check]:
    """Delete on the topic, as Kafka's DeleteRecords asks."""
    return topic_checks(DELETE, [topic])


def alter_topic(topic: object) -> list[Check]:
    """Alternatives: Alter on the cluster, or on the topic (Kafka's AlterConfigs asks for
    AlterConfigs, which this ACL model folds into Alter)."""
    return [cluster_check(ALTER), *topic_checks(ALTER, [topic])]


def alter_acls() -> list[Check]:
    return [cluster_check(ALTER)]


def describe_acls() -> list[Check]:
    return [cluster_check(DESCRIBE)]


def abort_hanging(topic: object) -> list[Check]:
    """Aborting a hanging transaction writes an ABORT marker: as WriteTxnMarkers."""
    return [*write_txn_markers(), *topic_checks(WRITE, [topic])]
