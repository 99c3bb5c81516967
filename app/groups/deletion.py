"""A group's administration: DeleteGroups and OffsetDelete (KIP-496), as Kafka's group
coordinator answers them.

Only an empty group is deleted: one with live members is NON_EMPTY_GROUP, and so is one
whose offsets a transaction still holds pending (they would otherwise vanish from under
it, and a consume-transform-produce would read its input again after committing its
output). OffsetDelete forgets a group's committed offsets of partitions its members are
not subscribed to (GROUP_SUBSCRIBED_TO_TOPIC for the others); pending transactional ones
are the transaction's, applied or dropped at its end. Each forgotten offset is an
'offset_delete' event in ``offset_commit_log``, which the rebuild's fold honours.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from app.errors import KafkaError, KafkaException, fail
from app.groups import sql
from app.groups.membership import locked_group
from app.groups.offsets import check_group_id, refused_whole, unreadable_partitions
from app.protocol import (
    DeletedGroup,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    TopicPartitionKey,
)
from app.security import needs
from app.security.authorizer import authorize_all
from app.storage.context import BrokerContext
from app.storage.engine import retry_conflicts

# Kafka's protocol type of consumer groups: their members' subscriptions are topics.
CONSUMER = "consumer"


def delete_groups(broker: BrokerContext, req: DeleteGroupsRequest) -> DeleteGroupsResponse:
    """Each group on its own, in its own DB transaction."""
    results = []
    for group_id in req.group_ids:
        try:
            _delete_group(broker, group_id)
        except KafkaException as exc:
            results.append(DeletedGroup(group_id, exc.error.code(), exc.error.str()))
        else:
            results.append(DeletedGroup(group_id, KafkaError.NO_ERROR))
    return DeleteGroupsResponse(results)


def _known(conn: Connection, group: Any, group_id: str) -> Any:
    """What the group holds of offsets; GROUP_ID_NOT_FOUND for a group with neither a row
    nor offsets (Kafka knows a group by either)."""
    held = conn.execute(sql.GROUP_OFFSETS_HELD, {"group_id": group_id}).one()
    if group is None and not held.committed and not held.pending:
        raise fail(KafkaError.GROUP_ID_NOT_FOUND, f"group {group_id!r} does not exist")
    return held


@retry_conflicts
def _delete_group(broker: BrokerContext, group_id: str) -> None:
    check_group_id(group_id)
    now = broker.clock.now_ms()
    with broker.engine.begin() as conn:
        authorize_all(conn, broker, needs.delete_group(group_id))
        group, members = locked_group(conn, group_id, now)
        held = _known(conn, group, group_id)
        if members:
            raise fail(
                KafkaError.NON_EMPTY_GROUP,
                f"group {group_id!r} has {len(members)} member(s)",
            )
        if held.pending:
            raise fail(
                KafkaError.NON_EMPTY_GROUP,
                f"a transaction holds offsets of group {group_id!r} pending; "
                "it can be deleted once the transaction ends",
            )
        params = {"group_id": group_id, "now": now, "topics": None, "partitions": None}
        conn.execute(sql.LOG_OFFSETS_DELETED, params)
        conn.execute(sql.DELETE_OFFSETS, params)
        conn.execute(sql.DELETE_GROUP, params)


@retry_conflicts
def offset_delete(broker: BrokerContext, req: OffsetDeleteRequest) -> OffsetDeleteResponse:
    """Each partition answered on its own: no Read on its topic, no such partition, or
    its topic subscribed to by a member; the others' committed offsets are forgotten (one
    without an offset has nothing to forget, and is answered NO_ERROR, as in Kafka)."""
    try:
        check_group_id(req.group_id)
        now = broker.clock.now_ms()
        asked = list(dict.fromkeys(req.partitions))
        with broker.engine.begin() as conn:
            authorize_all(conn, broker, needs.delete_group(req.group_id))
            group, members = locked_group(conn, req.group_id, now)
            _known(conn, group, req.group_id)
            if group is not None and members and group.protocol_type not in (None, CONSUMER):
                raise fail(
                    KafkaError.NON_EMPTY_GROUP,
                    f"group {req.group_id!r} has members of protocol type {group.protocol_type}",
                )
            refused = _refused(conn, broker, asked, {t for m in members for t in m.topics})
            deleted = [tp for tp in asked if tp not in refused]
            if deleted:
                params = {
                    "group_id": req.group_id, "now": now,
                    "topics": [t for t, _ in deleted], "partitions": [p for _, p in deleted],
                }  # fmt: skip
                conn.execute(sql.LOG_OFFSETS_DELETED, params)
                conn.execute(sql.DELETE_OFFSETS, params)
        return OffsetDeleteResponse(KafkaError.NO_ERROR, {tp: refused.get(tp, 0) for tp in asked})
    except KafkaException as exc:
        return OffsetDeleteResponse(*refused_whole(exc, req.partitions))


def _refused(
    conn: Connection,
    broker: BrokerContext,
    partitions: list[TopicPartitionKey],
    subscribed: set[str],
) -> dict[TopicPartitionKey, int]:
    refused = {
        tp: exc.error.code() for tp, exc in unreadable_partitions(conn, broker, partitions).items()
    }
    for tp in partitions:
        if tp not in refused and tp[0] in subscribed:
            refused[tp] = KafkaError.GROUP_SUBSCRIBED_TO_TOPIC
    return refused
