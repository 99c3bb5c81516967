"""Group membership: JoinGroup, Heartbeat, SyncGroup, LeaveGroup, with eager rebalances.

A change of membership (a member joins, leaves, changes its subscription, or misses its
session timeout) opens a new generation in PreparingRebalance. Members learn of it from
their heartbeat (REBALANCE_IN_PROGRESS), give up all their partitions, and join the new
generation; once every live member has joined, the coordinator computes the range
assignment itself and the group is Stable. No partition is ever assigned to two members
of the same generation, and commits from an older generation are refused
(ILLEGAL_GENERATION), which is what fences a zombie copier (KIP-447).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from sqlalchemy import Connection

from app.errors import KafkaError, KafkaException, fail
from app.groups import sql
from app.groups.assignor import range_assign
from app.protocol import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from app.security import needs
from app.security.authorizer import authorize_all, refusal_for
from app.storage.context import BrokerContext
from app.storage.engine import retry_conflicts

EMPTY = "Empty"
PREPARING_REBALANCE = "PreparingRebalance"
STABLE = "Stable"
MIN_SESSION_TIMEOUT_MS = 1
MAX_SESSION_TIMEOUT_MS = 3_600_000


def _lock_group(conn: Connection, group_id: str) -> Any:
    conn.execute(sql.ENSURE_GROUP, {"group_id": group_id})
    return conn.execute(sql.LOCK_GROUP, {"group_id": group_id}).one()


def _members(conn: Connection, group_id: str) -> list[Any]:
    return list(conn.execute(sql.MEMBERS, {"group_id": group_id}).all())


def _start_rebalance(conn: Connection, group_id: str, generation: int, now: int) -> int:
    conn.execute(
        sql.SET_GROUP,
        {
            "group_id": group_id,
            "generation_id": generation + 1,
            "state": PREPARING_REBALANCE,
            "now": now,
        },
    )
    return generation + 1


def _maybe_complete(conn: Connection, group_id: str, generation: int, now: int) -> str:
    """Stable once every live member has joined this generation (or none are left)."""
    members = _members(conn, group_id)
    if not members:
        conn.execute(
            sql.SET_GROUP,
            {"group_id": group_id, "generation_id": generation, "state": EMPTY, "now": now},
        )
        return EMPTY
    if any(mem.generation_id != generation for mem in members):
        return PREPARING_REBALANCE
    topics = sorted({t for mem in members for t in mem.topics})
    counts = {
        r.topic: r.num_partitions for r in conn.execute(sql.TOPIC_PARTITIONS, {"topics": topics})
    }
    plan = range_assign({mem.member_id: list(mem.topics) for mem in members}, counts)
    for member_id, tps in plan.items():
        conn.execute(
            sql.SET_ASSIGNMENT,
            {
                "group_id": group_id,
                "member_id": member_id,
                "assignment": json.dumps([list(tp) for tp in tps]),
            },
        )
    conn.execute(
        sql.SET_GROUP,
        {"group_id": group_id, "generation_id": generation, "state": STABLE, "now": now},
    )
    return STABLE


def _expire(conn: Connection, group: Any, now: int) -> tuple[int, str]:
    """Drop members past their session timeout; a loss reopens the rebalance."""
    gone = conn.execute(sql.EXPIRE_MEMBERS, {"group_id": group.group_id, "now": now}).all()
    generation, state = group.generation_id, group.state
    if gone:
        generation = _start_rebalance(conn, group.group_id, generation, now)
        state = _maybe_complete(conn, group.group_id, generation, now)
    return generation, state


@retry_conflicts
def join_group(broker: BrokerContext, req: JoinGroupRequest) -> JoinGroupResponse:
    try:
        if not isinstance(req.group_id, str) or not req.group_id:
            raise fail(KafkaError.INVALID_GROUP_ID, "group id must be a non-empty string")
        if not MIN_SESSION_TIMEOUT_MS <= req.session_timeout_ms <= MAX_SESSION_TIMEOUT_MS:
            raise fail(
                KafkaError.INVALID_SESSION_TIMEOUT,
                f"session timeout {req.session_timeout_ms} out of range",
            )
        now = broker.clock.now_ms()
        with broker.engine.begin() as conn:
            authorize_all(conn, broker, needs.group_membership(req.group_id))
            group = _lock_group(conn, req.group_id)
            generation, state = _expire(conn, group, now)
            member_id = req.member_id or f"{req.client_id or 'consumer'}-{uuid.uuid4()}"
            if req.group_instance_id:
                replaced = conn.execute(
                    sql.REPLACE_STATIC_MEMBER,
                    {
                        "group_id": req.group_id,
                        "group_instance_id": req.group_instance_id,
                        "member_id": member_id,
                    },
                ).all()
                if replaced and state != PREPARING_REBALANCE:
                    generation = _start_rebalance(conn, req.group_id, generation, now)
                    state = PREPARING_REBALANCE
            current = {mem.member_id: mem for mem in _members(conn, req.group_id)}
            known = current.get(member_id)
            changed = known is None or sorted(known.topics) != sorted(set(req.topics))
            if not changed and state == STABLE:
                # A rejoin without change while stable (e.g. after a lost response): same generation.
                return JoinGroupResponse(KafkaError.NO_ERROR, member_id, generation)
            if changed and state != PREPARING_REBALANCE:
                generation = _start_rebalance(conn, req.group_id, generation, now)
            conn.execute(
                sql.UPSERT_MEMBER,
                {
                    "group_id": req.group_id, "member_id": member_id, "client_id": req.client_id,
                    "group_instance_id": req.group_instance_id,
                    "generation_id": generation, "topics": json.dumps(sorted(set(req.topics))),
                    "session_timeout_ms": req.session_timeout_ms, "now": now,
                },
            )  # fmt: skip
            _maybe_complete(conn, req.group_id, generation, now)
        return JoinGroupResponse(KafkaError.NO_ERROR, member_id, generation)
    except KafkaException as exc:
        return JoinGroupResponse(exc.error.code(), error_message=exc.error.str())


@retry_conflicts
def heartbeat(broker: BrokerContext, req: HeartbeatRequest) -> HeartbeatResponse:
    now = broker.clock.now_ms()
    with broker.engine.begin() as conn:
        if refused := refusal_for(conn, broker, needs.group_membership(req.group_id)):
            return HeartbeatResponse(refused.error.code(), refused.error.str())
        group = _lock_group(conn, req.group_id)
        if (
            conn.execute(
                sql.HEARTBEAT, {"group_id": req.group_id, "member_id": req.member_id, "now": now}
            ).rowcount
            == 0
        ):
            return HeartbeatResponse(
                KafkaError.UNKNOWN_MEMBER_ID, "member is not in the group (expired or left)"
            )
        generation, state = _expire(conn, group, now)
    if state != STABLE or generation != req.generation_id:
        return HeartbeatResponse(
            KafkaError.REBALANCE_IN_PROGRESS, f"group is {state} in generation {generation}"
        )
    return HeartbeatResponse(KafkaError.NO_ERROR)


@retry_conflicts
def sync_group(broker: BrokerContext, req: SyncGroupRequest) -> SyncGroupResponse:
    """The member's assignment for its generation, once the group is Stable."""
    now = broker.clock.now_ms()
    with broker.engine.begin() as conn:
        if refused := refusal_for(conn, broker, needs.group_membership(req.group_id)):
            return SyncGroupResponse(refused.error.code(), error_message=refused.error.str())
        group = _lock_group(conn, req.group_id)
        generation, state = _expire(conn, group, now)
        member = next(
            (mem for mem in _members(conn, req.group_id) if mem.member_id == req.member_id), None
        )
    if member is None:
        return SyncGroupResponse(
            KafkaError.UNKNOWN_MEMBER_ID, error_message="member is not in the group"
        )
    if generation != req.generation_id:
        return SyncGroupResponse(
            KafkaError.ILLEGAL_GENERATION, error_message=f"generation is {generation}"
        )
    if state != STABLE:
        return SyncGroupResponse(
            KafkaError.REBALANCE_IN_PROGRESS, error_message="waiting for members to join"
        )
    return SyncGroupResponse(KafkaError.NO_ERROR, [(t, p) for t, p in member.assignment])


@retry_conflicts
def leave_group(broker: BrokerContext, req: LeaveGroupRequest) -> LeaveGroupResponse:
    now = broker.clock.now_ms()
    with broker.engine.begin() as conn:
        if refused := refusal_for(conn, broker, needs.group_membership(req.group_id)):
            return LeaveGroupResponse(refused.error.code(), refused.error.str())
        group = _lock_group(conn, req.group_id)
        if (
            conn.execute(
                sql.DELETE_MEMBER, {"group_id": req.group_id, "member_id": req.member_id}
            ).rowcount
            == 0
        ):
            return LeaveGroupResponse(KafkaError.UNKNOWN_MEMBER_ID)
        generation = _start_rebalance(conn, req.group_id, group.generation_id, now)
        _maybe_complete(conn, req.group_id, generation, now)
    return LeaveGroupResponse(KafkaError.NO_ERROR)


def check_generation(
    conn: Connection, group_id: str, member_id: str, generation_id: int, now: int
) -> None:
    """Offset commits from a group member must come from its current, stable generation.

    Generation -1 (a consumer using assign() only) is accepted, as Kafka accepts it for
    groups it manages without membership.
    """
    if generation_id < 0:
        return
    group = conn.execute(sql.SHARE_GROUP, {"group_id": group_id}).first()
    if group is None:
        raise fail(
            KafkaError.ILLEGAL_GENERATION, f"group {group_id!r} has no generation {generation_id}"
        )
    member = next((mem for mem in _members(conn, group_id) if mem.member_id == member_id), None)
    if member is None or member.last_heartbeat_ms + member.session_timeout_ms < now:
        raise fail(
            KafkaError.UNKNOWN_MEMBER_ID, f"member {member_id!r} is not in group {group_id!r}"
        )
    if (
        group.state == PREPARING_REBALANCE
        and member.generation_id == generation_id < group.generation_id
    ):
        # A member that has not rejoined yet still owns its partitions: the eager protocol
        # hands them to nobody until it rejoins (after revoking) or times out. Kafka accepts
        # its commits while PreparingRebalance (its generation only moves on completion);
        # refusing them would make the next owner re-read records already processed.
        return
    if generation_id != group.generation_id:
        raise fail(
            KafkaError.ILLEGAL_GENERATION,
            f"generation {generation_id} is not the group's {group.generation_id}",
        )
    if group.state != STABLE:
        raise fail(KafkaError.REBALANCE_IN_PROGRESS, "the group is rebalancing")
