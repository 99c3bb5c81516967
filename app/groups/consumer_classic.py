"""The classic protocol's requests (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) from a
classic member of a consumer group (KIP-848's online upgrade), as Kafka 4.4's
GroupMetadataManager answers them.

A classic member is a member of the consumer group like any other: its JoinGroup is its
subscription (a change bumps the group epoch and computes a new target) and the one step
of reconciliation it can take, what it still owns read from its subscription; the answer
names no leader, so the member syncs, and its SyncGroup brings it the partitions the
coordinator assigned it, encoded as the consumer protocol's assignment. Its Heartbeat is
answered REBALANCE_IN_PROGRESS whenever it has to join again to move on: the group epoch
is past its member epoch, it has partitions to revoke, or partitions it waits for are
free. Kafka's join and sync timers are the member's deadline (``revocation_deadline_ms``):
told to rejoin, or joined, it must rejoin or sync within its rebalance timeout, or the
coordinator's pass removes it. Each function returns None when the group is no longer a consumer group (a member
timed out and the group went back to classic): the classic path then serves the request.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

from sqlalchemy import Connection

from app.errors import KafkaError, fail
from app.groups import sql
from app.groups.consumer import (
    CONSUMER,
    Member,
    _event,
    _Heartbeat,
    _member_detail,
    _save,
    classic_member,
    classic_protocols,
)
from app.groups.consumer_assignment import (
    UNRELEASED_PARTITIONS,
    UNREVOKED_PARTITIONS,
    MemberAssignmentState,
    pairs,
    reconcile,
)
from app.protocol import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    SyncGroupRequest,
    SyncGroupResponse,
    configured_assignors,
)
from app.storage.context import BrokerContext


def _heartbeat(conn: Connection, broker: BrokerContext, group_id: str, now: int) -> Any:
    """The consumer group locked, its members past their timeouts removed; None if it is
    not (or no longer) a consumer group with members."""
    group = conn.execute(sql.LOCK_CONSUMER_GROUP, {"group_id": group_id}).first()
    if group is None or group.group_type != CONSUMER:
        return None
    assignors = configured_assignors(broker.settings.group_consumer_assignors)
    beat = _Heartbeat(conn, broker, group, now, assignors)
    beat.expire()
    if beat.downgraded or not beat.members:
        return None
    return beat


def is_consumer_group(conn: Connection, group_id: str) -> bool:
    group = conn.execute(sql.LOCK_CONSUMER_GROUP, {"group_id": group_id}).first()
    return group is not None and group.group_type == CONSUMER


def _known(beat: _Heartbeat, member_id: str, instance_id: str | None) -> Member:
    """Kafka's validateConsumerGroupMember and throwIfMemberDoesNotUseClassicProtocol."""
    if instance_id is None:
        member = beat.members.get(member_id)
        if member is None:
            raise fail(
                KafkaError.UNKNOWN_MEMBER_ID,
                f"Member {member_id} is not a member of group {beat.group_id}.",
            )
    else:
        member = next((m for m in beat.members.values() if m.instance_id == instance_id), None)
        if member is None:
            raise fail(
                KafkaError.UNKNOWN_MEMBER_ID,
                f"Member with instance id {instance_id} is not a member of group {beat.group_id}.",
            )
        if member.member_id != member_id:
            raise fail(
                KafkaError.FENCED_INSTANCE_ID,
                f"Static member {member_id} with instance id {instance_id} is fenced by "
                f"existing member {member.member_id}.",
            )
    if member.classic is None:
        raise fail(
            KafkaError.UNKNOWN_MEMBER_ID, f"Member {member.member_id} does not use the classic "
            "protocol.",
        )  # fmt: skip
    return member


def _check_generation(member: Member, generation_id: int) -> None:
    if generation_id != member.epochs.member_epoch:
        raise fail(
            KafkaError.ILLEGAL_GENERATION,
            f"The request generation id {generation_id} is not equal to the member epoch "
            f"{member.epochs.member_epoch} of member {member.member_id}.",
        )


def join(
    conn: Connection, broker: BrokerContext, req: JoinGroupRequest, now: int
) -> JoinGroupResponse | None:
    """A classic member joins (or rejoins) a consumer group, as Kafka's
    classicGroupJoinToConsumerGroup: its subscription taken, the group epoch bumped by a
    change, one step towards its target with what it says it owns; answered at once with
    its member epoch as the generation and no leader."""
    beat = _heartbeat(conn, broker, req.group_id, now)
    if beat is None:
        return None
    if req.protocol_type != CONSUMER or not req.protocols:
        raise fail(
            KafkaError.INCONSISTENT_GROUP_PROTOCOL,
            f"The group {req.group_id} uses the consumer protocol: a classic member must "
            f"join with protocol type {CONSUMER!r} and a protocol.",
        )
    member_id = req.member_id or str(uuid.uuid4())
    if req.require_known_member_id and not req.member_id and req.group_instance_id is None:
        return JoinGroupResponse(
            KafkaError.MEMBER_ID_REQUIRED, member_id,
            error_message="join again with the member id given",
        )  # fmt: skip
    member = beat.members.get(member_id)
    if req.group_instance_id is not None:
        static = next(
            (m for m in beat.members.values() if m.instance_id == req.group_instance_id), None
        )
        if static is not None and static.member_id != member_id:
            # The instance back under a new member id takes the old one's place.
            del beat.members[static.member_id]
            conn.execute(
                sql.DELETE_CONSUMER_MEMBER,
                {"group_id": req.group_id, "member_id": static.member_id},
            )
            _event(
                conn, req.group_id, "static_member_replaced", beat.group_epoch, now, static,
                {"new_member_id": member_id},
            )  # fmt: skip
            static.member_id = member_id
            member = static
    bump = member is None
    if member is None:
        member = Member(
            member_id, req.group_instance_id, None, req.client_id, req.client_host, [],
            None, None, req.rebalance_timeout_ms, MemberAssignmentState(0, 0), {}, now,
            None, now,
        )  # fmt: skip
    before = member.epochs
    topics = sorted(set(req.topics))
    if topics != member.subscribed_topic_names:
        member.subscribed_topic_names = topics
        bump = True
    member.instance_id = req.group_instance_id
    if req.rebalance_timeout_ms >= 0:
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
    member.client_id, member.client_host = req.client_id, req.client_host
    member.classic = classic_member(
        req.session_timeout_ms, [p.name for p in req.protocols],
        [p.metadata for p in req.protocols],
    )  # fmt: skip
    member.last_heartbeat_ms = now
    beat.members[member_id] = member
    metadata = beat._subscription_metadata()
    if bump or metadata != beat.metadata:
        beat.group_epoch += 1
        beat.metadata = metadata
        _event(
            conn, req.group_id, "group_epoch", beat.group_epoch, now, member,
            {"subscription_metadata": metadata},
        )  # fmt: skip
    if beat.group_epoch > beat.assignment_epoch:
        beat._new_target()
    owned: dict[str, frozenset[int]] = {}
    for topic, partition in req.owned_partitions:
        owned[topic] = owned.get(topic, frozenset()) | {partition}
    member.epochs = reconcile(
        member.epochs, member.target, beat.assignment_epoch, owned,
        beat._owner_epoch(member_id),
    )  # fmt: skip
    # Kafka's sync timer: the member must sync (and, revoking, rejoin) within its
    # rebalance timeout, or be removed (``_Heartbeat.expire``).
    member.revocation_deadline_ms = now + member.rebalance_timeout_ms
    _save(conn, req.group_id, member)
    if member.epochs != before:
        _event(
            conn, req.group_id, "member_epoch", beat.group_epoch, now, member,
            _member_detail(member),
        )  # fmt: skip
    beat.finish()
    return JoinGroupResponse(
        KafkaError.NO_ERROR, member_id, member.epochs.member_epoch, leader_id="",
        protocol_type=CONSUMER, protocol_name=req.protocols[0].name,
    )  # fmt: skip


def sync(
    conn: Connection, broker: BrokerContext, req: SyncGroupRequest, now: int
) -> SyncGroupResponse | None:
    """A classic member's SyncGroup: its assigned partitions (not those pending
    revocation), at its member epoch; REBALANCE_IN_PROGRESS while the target moved past
    it and it has nothing to revoke (it must join to catch up), as Kafka answers."""
    beat = _heartbeat(conn, broker, req.group_id, now)
    if beat is None:
        return None
    member = _known(beat, req.member_id, req.group_instance_id)
    _check_generation(member, req.generation_id)
    if (
        beat.assignment_epoch > member.epochs.member_epoch
        and member.epochs.state != UNREVOKED_PARTITIONS
    ):
        raise fail(
            KafkaError.REBALANCE_IN_PROGRESS,
            f"A new rebalance is triggered in group {req.group_id} and member "
            f"{member.member_id} should rejoin to catch up.",
        )
    member.last_heartbeat_ms = now
    if member.epochs.state != UNREVOKED_PARTITIONS:
        member.revocation_deadline_ms = None  # synced: the sync timer cancelled
    _save(conn, req.group_id, member)
    name, metadata = classic_protocols(member)[0]
    return SyncGroupResponse(
        KafkaError.NO_ERROR, sorted(pairs(member.epochs.assigned)),
        protocol_type=CONSUMER, protocol_name=name,
        assignment_version=_version(metadata),
    )  # fmt: skip


def _version(metadata: bytes) -> int:
    """The consumer protocol version of a subscription, for the assignment answering it."""
    return max(0, struct.unpack_from(">h", metadata)[0]) if len(metadata) >= 2 else 0


def heartbeat(
    conn: Connection, broker: BrokerContext, req: HeartbeatRequest, now: int
) -> HeartbeatResponse | None:
    """A classic member's Heartbeat keeps its session; REBALANCE_IN_PROGRESS tells it to
    join again: the target moved past its epoch, it has partitions to revoke, or the
    partitions it waits for have been released."""
    beat = _heartbeat(conn, broker, req.group_id, now)
    if beat is None:
        return None
    member = _known(beat, req.member_id, req.group_instance_id)
    _check_generation(member, req.generation_id)
    member.last_heartbeat_ms = now
    epochs = member.epochs
    released = epochs.state == UNRELEASED_PARTITIONS and not any(
        beat._owner_epoch(member.member_id)(*tp) != -1
        for tp in pairs(member.target) - pairs(epochs.assigned)
    )
    rejoin = (
        epochs.member_epoch < beat.assignment_epoch
        or epochs.state == UNREVOKED_PARTITIONS
        or released
    )
    if rejoin and member.revocation_deadline_ms is None:
        # Kafka's join timer: told to rejoin, the member must within its rebalance
        # timeout, or be removed (``_Heartbeat.expire``).
        member.revocation_deadline_ms = now + member.rebalance_timeout_ms
    _save(conn, req.group_id, member)
    if rejoin:
        return HeartbeatResponse(
            KafkaError.REBALANCE_IN_PROGRESS,
            f"the consumer group {req.group_id} moved on: join again",
        )
    return HeartbeatResponse(KafkaError.NO_ERROR)


def leave(
    conn: Connection, broker: BrokerContext, req: LeaveGroupRequest, now: int
) -> LeaveGroupResponse | None:
    """A classic member leaves: removed, a new group epoch (Kafka converts nothing on a
    classic LeaveGroup)."""
    beat = _heartbeat(conn, broker, req.group_id, now)
    if beat is None:
        return None
    member = _known_leaving(beat, req)
    beat.remove(member, "member_left", downgrade=False)
    beat.finish()
    return LeaveGroupResponse(KafkaError.NO_ERROR)


def _known_leaving(beat: _Heartbeat, req: LeaveGroupRequest) -> Member:
    if req.group_instance_id is not None and not req.member_id:
        static = next(
            (m for m in beat.members.values() if m.instance_id == req.group_instance_id), None
        )
        if static is None:
            raise fail(
                KafkaError.UNKNOWN_MEMBER_ID,
                f"Instance id {req.group_instance_id} is unknown.",
            )
        return _known(beat, static.member_id, req.group_instance_id)
    return _known(beat, req.member_id, req.group_instance_id)
