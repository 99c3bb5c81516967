"""Group membership: JoinGroup, Heartbeat, SyncGroup, LeaveGroup, with eager rebalances.

A change of membership (a member joins, leaves, changes its subscription, or misses its
session timeout) opens a new generation in PreparingRebalance. Members learn of it from
their heartbeat (REBALANCE_IN_PROGRESS), give up all their partitions, and join the new
generation. Once every live member has joined, the join phase ends:

- a native group (its members name no protocol type) is assigned by the coordinator,
  range over the members' topics, and is Stable at once;
- a classic group (Kafka's wire clients) chooses one protocol every member supports and a
  leader, and waits in CompletingRebalance until the leader's SyncGroup brings everyone's
  assignment, opaque bytes the coordinator stores and hands back per generation.

No partition is ever assigned to two members of the same generation, and commits from an
older generation are refused (ILLEGAL_GENERATION), which is what fences a zombie copier
(KIP-447).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from sqlalchemy import Connection

from app.errors import KafkaError, KafkaException, fail
from app.groups import consumer_classic, sql
from app.groups.assignor import range_assign
from app.groups.classic import choose_leader, choose_protocol, keeps_protocol, shares_protocol
from app.groups.consumer import check_member_epoch, expire_idle
from app.protocol import (
    DescribedGroup,
    DescribedMember,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    GroupMember,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListedGroup,
    ListGroupsRequest,
    ListGroupsResponse,
    MemberAssignment,
    SyncGroupRequest,
    SyncGroupResponse,
    TopicPartitionKey,
)
from app.security import needs
from app.security.authorizer import authorize_all, denied_checks, refusal_for
from app.storage.context import BrokerContext
from app.storage.engine import retry_conflicts

EMPTY = "Empty"
PREPARING_REBALANCE = "PreparingRebalance"
COMPLETING_REBALANCE = "CompletingRebalance"
STABLE = "Stable"
DEAD = "Dead"
# A member's generation is its current one in these states (heartbeats and syncs pass).
_SETTLED = (COMPLETING_REBALANCE, STABLE)
# How native (coordinator-assigned) groups are listed: they are consumer groups.
CONSUMER = "consumer"
# Group types (KIP-848): a classic group, or a consumer group of the consumer protocol
# (``app.groups.consumer``), which the classic APIs do not serve.
CLASSIC = "classic"


def _lock_group(conn: Connection, group_id: str) -> Any:
    conn.execute(sql.ENSURE_GROUP, {"group_id": group_id})
    return conn.execute(sql.LOCK_GROUP, {"group_id": group_id}).one()


def _group(conn: Connection, group_id: str) -> Any:
    """The group row again, after this transaction changed it (the lock is already held)."""
    return conn.execute(sql.SHARE_GROUP, {"group_id": group_id}).one()


def _members(conn: Connection, group_id: str) -> list[Any]:
    return list(conn.execute(sql.MEMBERS, {"group_id": group_id}).all())


def _start_rebalance(
    conn: Connection, group_id: str, generation: int, now: int, join_deadline: int | None = None
) -> int:
    """A new generation, its join phase begun; ``join_deadline``: the join phase of an
    empty group's first rebalance may end no sooner (``initial_join_deadline``)."""
    conn.execute(
        sql.SET_GROUP,
        {
            "group_id": group_id,
            "generation_id": generation + 1,
            "state": PREPARING_REBALANCE,
            "now": now,
            "join_deadline_ms": join_deadline,
        },
    )
    return generation + 1


def _set_state(conn: Connection, group_id: str, generation: int, state: str, now: int) -> None:
    conn.execute(
        sql.SET_GROUP,
        {"group_id": group_id, "generation_id": generation, "state": state, "now": now,
         "join_deadline_ms": None},
    )  # fmt: skip


def initial_join_deadline(now: int, delay_ms: int) -> int | None:
    """When the first rebalance of an empty group may end its join phase, at the earliest
    (Kafka's group.initial.rebalance.delay.ms, KIP-134: members starting together share
    the first generation instead of each forcing the next); None: at once."""
    return now + delay_ms if delay_ms > 0 else None


def extended_join_deadline(
    deadline: int, started: int, now: int, delay_ms: int, rebalance_timeout_ms: int
) -> int:
    """The held join phase after another new member came: ``delay_ms`` more from now, but
    never past the rebalance timeout from its start (nor sooner than it was)."""
    latest = started + max(delay_ms, rebalance_timeout_ms)
    return max(deadline, min(now + delay_ms, latest))


def _maybe_complete(conn: Connection, group: Any, generation: int, now: int) -> str:
    """Once every live member has joined this generation (or none are left), and the
    first rebalance of a group that was empty has waited its delay, the join phase ends:
    a native group is assigned at once and Stable; a classic group chooses its protocol
    and leader and waits, CompletingRebalance, for the leader's plan."""
    members = _members(conn, group.group_id)
    if not members:
        _set_state(conn, group.group_id, generation, EMPTY, now)
        return EMPTY
    if any(mem.generation_id != generation for mem in members):
        return PREPARING_REBALANCE
    rebalance_ends = group.rebalance_started_ms + max(
        m.rebalance_timeout_ms or m.session_timeout_ms for m in members
    )
    if (
        now < rebalance_ends
        and conn.execute(
            sql.PENDING_MEMBERS_LEFT, {"group_id": group.group_id, "now": now}
        ).scalar()
    ):
        # KIP-394: a member handed its id is waited for (as Kafka does, to its session
        # timeout or the rebalance timeout, whichever comes first).
        return PREPARING_REBALANCE
    if group.join_deadline_ms is not None and now < group.join_deadline_ms:
        return PREPARING_REBALANCE
    if group.protocol_type is None:
        _assign_range(conn, group.group_id, members)
        _set_state(conn, group.group_id, generation, STABLE, now)
        return STABLE
    by_join = [mem.member_id for mem in sorted(members, key=lambda m: (m.joined_ms, m.member_id))]
    leader = choose_leader(group.leader_id, by_join)
    preferences = [mem.protocol_names for mem in members if mem.member_id == leader] + [
        mem.protocol_names for mem in members if mem.member_id != leader
    ]
    conn.execute(
        sql.SET_LEADER,
        {"group_id": group.group_id, "protocol": choose_protocol(preferences), "leader_id": leader},
    )
    conn.execute(sql.CLEAR_MEMBER_ASSIGNMENTS, {"group_id": group.group_id})
    _set_state(conn, group.group_id, generation, COMPLETING_REBALANCE, now)
    return COMPLETING_REBALANCE


def _assign_range(conn: Connection, group_id: str, members: list[Any]) -> None:
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


def _expire(conn: Connection, group: Any, now: int) -> Any:
    """Drop members past their session timeout, or past their rebalance timeout without
    rejoining; a loss outside a rebalance starts one. A held first rebalance whose delay
    is over ends its join phase now. The group row as it is after."""
    gone = conn.execute(sql.EXPIRE_MEMBERS, {"group_id": group.group_id, "now": now}).all()
    conn.execute(sql.EXPIRE_PENDING_MEMBERS, {"group_id": group.group_id, "now": now})
    if not gone:
        # A join phase held by pending members (KIP-394) ends once they are gone or the
        # rebalance timeout passes: looked at while it runs.
        due = group.join_deadline_ms is not None and now >= group.join_deadline_ms
        if not due and group.state != PREPARING_REBALANCE:
            return group
        _maybe_complete(conn, group, group.generation_id, now)
        return _group(conn, group.group_id)
    generation = group.generation_id
    if group.state != PREPARING_REBALANCE:
        generation = _start_rebalance(conn, group.group_id, generation, now)
    _maybe_complete(conn, group, generation, now)
    return _group(conn, group.group_id)


def locked_group(conn: Connection, group_id: str, now: int) -> tuple[Any | None, list[Any]]:
    """A group's row locked (None: it has none) and its live members, those past their
    timeouts dropped first: what deciding whether it is empty needs."""
    group = conn.execute(sql.LOCK_EXISTING_GROUP, {"group_id": group_id}).first()
    if group is None:
        return None, []
    if group.group_type != CLASSIC:
        # A consumer group's (KIP-848) members, with the topics they subscribe to; its
        # heartbeats expire them.
        return group, list(conn.execute(sql.CONSUMER_MEMBER_TOPICS, {"group_id": group_id}))
    group = _expire(conn, group, now)
    return group, _members(conn, group_id)


def topic_grew(conn: Connection, topic: str, now: int) -> list[str]:
    """A topic got more partitions: every native group with a member subscribed to it
    starts a rebalance, whose range assignment then covers the new partitions (a classic
    group's leader notices in its metadata and rejoins, as in Kafka). Returns those
    groups. Runs in the DB transaction that adds the partitions."""
    grown = []
    for group_id in conn.execute(sql.NATIVE_GROUPS_OF_TOPIC, {"topic": topic}).scalars():
        group = _lock_group(conn, group_id)
        if group.protocol_type is None and group.state != PREPARING_REBALANCE:
            _start_rebalance(conn, group_id, group.generation_id, now)
            grown.append(group_id)
    return grown


def group_ids(conn: Connection) -> list[str]:
    return [r.group_id for r in conn.execute(sql.GROUP_IDS)]


def coordinator_moved(conn: Connection, group_ids: list[str], now: int) -> None:
    """``group_ids`` have a new coordinator (a node died or joined): each member's session
    starts afresh, as when Kafka's new coordinator loads a group, so the time its client
    spent finding the new one does not expire it (docs/design.md rule 48)."""
    if group_ids:
        conn.execute(sql.FRESH_SESSIONS, {"group_ids": group_ids, "now": now})


def _check_protocols(group: Any, others: list[Any], req: JoinGroupRequest) -> None:
    """A group serves one kind of member while it has any: native members (assigned by the
    coordinator) or classic ones of one protocol type, with a protocol in common."""
    if req.protocol_type is not None and not req.protocols:
        raise fail(KafkaError.INCONSISTENT_GROUP_PROTOCOL, "a classic member names no protocol")
    if not others:
        return
    if group.protocol_type != req.protocol_type:
        raise fail(
            KafkaError.INCONSISTENT_GROUP_PROTOCOL,
            f"group {req.group_id!r} runs protocol type {group.protocol_type or 'native'!r}",
        )
    names = [p.name for p in req.protocols]
    if req.protocol_type is not None and not shares_protocol(
        [mem.protocol_names for mem in others], names
    ):
        raise fail(
            KafkaError.INCONSISTENT_GROUP_PROTOCOL,
            f"none of {names} is supported by every member of {req.group_id!r}",
        )


def _same_subscription(known: Any, req: JoinGroupRequest) -> bool:
    if sorted(known.topics) != sorted(set(req.topics)):
        return False
    return list(known.protocol_names or []) == [p.name for p in req.protocols] and [
        bytes(m) for m in known.protocol_metadata or []
    ] == [p.metadata for p in req.protocols]


def _joined(conn: Connection, group_id: str, member_id: str) -> JoinGroupResponse:
    """The join as the member sees it now; the leader of a classic group also gets every
    member's metadata for the chosen protocol."""
    group = _group(conn, group_id)
    members: list[GroupMember] = []
    if group.protocol_type is not None and member_id == group.leader_id:
        for mem in _members(conn, group_id):
            metadata = dict(zip(mem.protocol_names, mem.protocol_metadata, strict=True))
            members.append(
                GroupMember(mem.member_id, mem.group_instance_id, bytes(metadata[group.protocol]))
            )
    classic = group.protocol_type is not None
    return JoinGroupResponse(
        KafkaError.NO_ERROR, member_id, group.generation_id,
        rebalancing=group.state == PREPARING_REBALANCE,
        leader_id=(group.leader_id or "") if classic else "",
        protocol_type=group.protocol_type,
        protocol_name=group.protocol if classic else None,
        members=members,
    )  # fmt: skip


@retry_conflicts
def join_group(broker: BrokerContext, req: JoinGroupRequest) -> JoinGroupResponse:
    """Join, or look again while the join phase runs (a wire front end's long poll sends
    the same request with the member id it was given; that also keeps it alive)."""
    try:
        if not isinstance(req.group_id, str) or not req.group_id or "\x00" in req.group_id:
            raise fail(
                KafkaError.INVALID_GROUP_ID, "group id must be a non-empty string without NUL"
            )
        low = broker.settings.group_min_session_timeout_ms
        high = broker.settings.group_max_session_timeout_ms
        if not low <= req.session_timeout_ms <= high:
            # Before KIP-394's member-id step, as Kafka checks it (docs/design.md rule 26).
            raise fail(
                KafkaError.INVALID_SESSION_TIMEOUT,
                f"session timeout {req.session_timeout_ms} ms is outside "
                f"[{low}, {high}] (KIP98_GROUP_MIN/MAX_SESSION_TIMEOUT_MS)",
            )
        now = broker.clock.now_ms()
        with broker.engine.begin() as conn:
            authorize_all(conn, broker, needs.group_membership(req.group_id))
            joined = consumer_classic.join(conn, broker, req, now)
            if joined is not None:
                return joined  # a classic member of a consumer group (KIP-848)
            _claim_for_classic(conn, req.group_id)
            group = _expire(conn, _lock_group(conn, req.group_id), now)
            generation, state = group.generation_id, group.state
            member_id = req.member_id or f"{req.client_id or 'consumer'}-{uuid.uuid4()}"
            current = {mem.member_id: mem for mem in _members(conn, req.group_id)}
            _check_protocols(group, [m for i, m in current.items() if i != member_id], req)
            if req.require_known_member_id and not req.member_id and not req.group_instance_id:
                # KIP-394: the id first, the membership with the next JoinGroup, so a join
                # whose answer the client never read leaves no member behind.
                conn.execute(
                    sql.ADD_PENDING_MEMBER,
                    {"group_id": req.group_id, "member_id": member_id,
                     "expires_ms": now + req.session_timeout_ms},
                )  # fmt: skip
                return JoinGroupResponse(
                    KafkaError.MEMBER_ID_REQUIRED, member_id,
                    error_message="join again with the member id given",
                )  # fmt: skip
            pending = conn.execute(
                sql.DROP_PENDING_MEMBER, {"group_id": req.group_id, "member_id": member_id}
            ).rowcount
            if req.protocol_type is not None and req.member_id and not pending:
                _check_known_member(current, req)
            old = _restarted_static_member(group, current, req, member_id)
            if old is not None:
                return _replace_static_member(conn, group, old, req, member_id, now)
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
            if not current.keys() - {member_id} and group.protocol_type != req.protocol_type:
                conn.execute(
                    sql.SET_PROTOCOL_TYPE,
                    {"group_id": req.group_id, "protocol_type": req.protocol_type},
                )
            known = current.get(member_id)
            changed = known is None or not _same_subscription(known, req)
            if state == STABLE and member_id == group.leader_id:
                changed = True  # a classic leader rejoins to reassign (e.g. new partitions)
            if not changed and state in _SETTLED:
                # A rejoin without change (e.g. after a lost response): same generation.
                return _joined(conn, req.group_id, member_id)
            delay = broker.settings.group_initial_rebalance_delay_ms
            if changed and state != PREPARING_REBALANCE:
                held = initial_join_deadline(now, delay) if state == EMPTY else None
                generation = _start_rebalance(conn, req.group_id, generation, now, held)
            elif known is None and group.join_deadline_ms is not None:
                timeouts = [
                    m.rebalance_timeout_ms or m.session_timeout_ms for m in current.values()
                ]
                timeouts.append(
                    req.rebalance_timeout_ms
                    if req.rebalance_timeout_ms >= 0
                    else req.session_timeout_ms
                )
                conn.execute(
                    sql.SET_JOIN_DEADLINE,
                    {"group_id": req.group_id, "join_deadline_ms": extended_join_deadline(
                        group.join_deadline_ms, group.rebalance_started_ms, now, delay,
                        max(timeouts),
                    )},
                )  # fmt: skip
            conn.execute(
                sql.UPSERT_MEMBER,
                {
                    "group_id": req.group_id, "member_id": member_id, "client_id": req.client_id,
                    "client_host": req.client_host, "group_instance_id": req.group_instance_id,
                    "generation_id": generation, **_subscription_params(req), "now": now,
                },
            )  # fmt: skip
            _maybe_complete(conn, _group(conn, req.group_id), generation, now)
            return _joined(conn, req.group_id, member_id)
    except KafkaException as exc:
        # Kafka's refused join echoes the member id it was sent.
        return JoinGroupResponse(exc.error.code(), req.member_id, error_message=exc.error.str())


def _claim_for_classic(conn: Connection, group_id: str) -> None:
    """A classic member joining an empty consumer group (KIP-848): it becomes a classic
    group (Kafka deletes it and creates one). One with members has taken the member in
    already (``consumer_classic.join``)."""
    row = conn.execute(sql.LOCK_CONSUMER_GROUP, {"group_id": group_id}).first()
    if row is None or row.group_type == CLASSIC:
        return
    if conn.execute(sql.CONSUMER_MEMBERS, {"group_id": group_id}).first() is not None:
        raise fail(
            KafkaError.INCONSISTENT_GROUP_PROTOCOL,
            f"group {group_id!r} is a consumer group with members of the consumer protocol",
        )
    conn.execute(sql.SET_GROUP_TYPE, {"group_id": group_id, "group_type": CLASSIC})


def _check_known_member(current: dict[str, Any], req: JoinGroupRequest) -> None:
    """A classic join naming a member id must name one the group has (or handed out and
    awaits, KIP-394), and its static instance's current member, as Kafka's coordinator
    checks an existing member's join; raised, so the join leaves nothing behind (not even
    the group). A member that lost its id joins again without one."""
    if refused := static_member_refusal(current.values(), req.member_id, req.group_instance_id):
        raise fail(*refused)
    if req.member_id not in current:
        raise fail(
            KafkaError.UNKNOWN_MEMBER_ID,
            f"member {req.member_id!r} is not in group {req.group_id!r}: join without a member id",
        )


def _restarted_static_member(
    group: Any, current: dict[str, Any], req: JoinGroupRequest, member_id: str
) -> Any | None:
    """The member a static one restarted into a Stable classic group replaces without a
    rebalance (KIP-345), or None: Kafka rebalances when the group would choose another
    protocol with its new protocols, and in any other state."""
    if not req.group_instance_id or member_id in current or group.state != STABLE:
        return None
    if group.protocol_type is None or group.protocol_type != req.protocol_type:
        return None
    old = next((m for m in current.values() if m.group_instance_id == req.group_instance_id), None)
    if old is None:
        return None
    protocols = {m.member_id: list(m.protocol_names or []) for m in current.values()}
    protocols[old.member_id] = [p.name for p in req.protocols]
    return old if keeps_protocol(group.protocol, group.leader_id, protocols) else None


def _subscription_params(req: JoinGroupRequest) -> dict[str, Any]:
    """What a join stores of a member's subscription: its topics, protocols and timeouts."""
    return {
        "topics": json.dumps(sorted(set(req.topics))),
        "protocol_names": [p.name for p in req.protocols] or None,
        "protocol_metadata": [p.metadata for p in req.protocols] or None,
        "session_timeout_ms": req.session_timeout_ms,
        "rebalance_timeout_ms": (
            req.rebalance_timeout_ms if req.rebalance_timeout_ms >= 0 else None
        ),
    }


def _replace_static_member(
    conn: Connection, group: Any, old: Any, req: JoinGroupRequest, member_id: str, now: int
) -> JoinGroupResponse:
    """The restarted static member takes ``old``'s place under its new id: same
    generation, same assignment (its SyncGroup hands it back), its new protocols kept for
    the next rebalance. A leader that can skip the assignment (JoinGroup v9) is told to;
    an older one is named a follower (the old id leads), so it only syncs."""
    conn.execute(
        sql.REKEY_STATIC_MEMBER,
        {
            "group_id": req.group_id, "member_id": member_id, "old_member_id": old.member_id,
            **_subscription_params(req), "now": now,
        },
    )  # fmt: skip
    if group.leader_id != old.member_id:
        return _joined(conn, req.group_id, member_id)
    conn.execute(sql.SET_LEADER_ID, {"group_id": req.group_id, "leader_id": member_id})
    joined = _joined(conn, req.group_id, member_id)
    if req.skip_assignment_supported:
        return replace(joined, skip_assignment=True)
    return replace(joined, leader_id=old.member_id, members=[])


Req = TypeVar("Req", HeartbeatRequest, SyncGroupRequest, LeaveGroupRequest)
Resp = TypeVar("Resp", HeartbeatResponse, SyncGroupResponse, LeaveGroupResponse)


def _before_classic(
    conn: Connection,
    broker: BrokerContext,
    req: Req,
    now: int,
    serve: Callable[[Connection, BrokerContext, Req, int], Resp | None],
    refused: Callable[[int, str], Resp],
) -> Resp | None:
    """What a Heartbeat, SyncGroup or LeaveGroup is answered before the classic group's
    own rules: its ACL refusal, or, for a classic member of a consumer group (KIP-848),
    ``serve``'s answer (a refusal of it in ``refused``'s shape); None for a classic group."""
    if denied := refusal_for(conn, broker, needs.group_membership(req.group_id)):
        return refused(denied.error.code(), denied.error.str())
    try:
        return serve(conn, broker, req, now)
    except KafkaException as exc:
        return refused(exc.error.code(), exc.error.str())


@retry_conflicts
def heartbeat(broker: BrokerContext, req: HeartbeatRequest) -> HeartbeatResponse:
    now = broker.clock.now_ms()
    with broker.engine.begin() as conn:
        answer = _before_classic(
            conn, broker, req, now, consumer_classic.heartbeat, HeartbeatResponse
        )
        if answer is not None:
            return answer
        group = _lock_group(conn, req.group_id)
        members = _members(conn, req.group_id)
        if fenced := static_member_refusal(members, req.member_id, req.group_instance_id):
            return HeartbeatResponse(*fenced)
        if (
            conn.execute(
                sql.HEARTBEAT, {"group_id": req.group_id, "member_id": req.member_id, "now": now}
            ).rowcount
            == 0
        ):
            return HeartbeatResponse(
                KafkaError.UNKNOWN_MEMBER_ID, "member is not in the group (expired or left)"
            )
        group = _expire(conn, group, now)
    if group.state not in _SETTLED:
        return HeartbeatResponse(
            KafkaError.REBALANCE_IN_PROGRESS,
            f"group is {group.state} in generation {group.generation_id}",
        )
    if group.generation_id != req.generation_id:
        # A settled group's other generation is not this member's, as Kafka answers it.
        return HeartbeatResponse(
            KafkaError.ILLEGAL_GENERATION, f"generation is {group.generation_id}"
        )
    return HeartbeatResponse(KafkaError.NO_ERROR)


@retry_conflicts
def sync_group(broker: BrokerContext, req: SyncGroupRequest) -> SyncGroupResponse:
    """The member's assignment for its generation once there is one: at once in a native
    group; in a classic group once the leader has sent its plan (the leader's own sync
    carries it)."""
    now = broker.clock.now_ms()
    with broker.engine.begin() as conn:
        synced = _before_classic(
            conn, broker, req, now, consumer_classic.sync,
            lambda code, message: SyncGroupResponse(code, error_message=message),
        )  # fmt: skip
        if synced is not None:
            return synced
        group = _expire(conn, _lock_group(conn, req.group_id), now)
        members = {mem.member_id: mem for mem in _members(conn, req.group_id)}
        member = members.get(req.member_id)
        if fenced := static_member_refusal(members.values(), req.member_id, req.group_instance_id):
            return SyncGroupResponse(fenced[0], error_message=fenced[1])
        if member is None:
            return SyncGroupResponse(
                KafkaError.UNKNOWN_MEMBER_ID, error_message="member is not in the group"
            )
        if group.generation_id != req.generation_id:
            return SyncGroupResponse(
                KafkaError.ILLEGAL_GENERATION, error_message=f"generation is {group.generation_id}"
            )
        if group.state not in _SETTLED:
            return SyncGroupResponse(
                KafkaError.REBALANCE_IN_PROGRESS, error_message="waiting for members to join"
            )
        if group.protocol_type is None:
            return SyncGroupResponse(KafkaError.NO_ERROR, [(t, p) for t, p in member.assignment])
        conn.execute(
            sql.HEARTBEAT, {"group_id": req.group_id, "member_id": req.member_id, "now": now}
        )
        assignment = member.member_assignment
        if group.state == COMPLETING_REBALANCE:
            if req.member_id != group.leader_id:
                return SyncGroupResponse(KafkaError.NO_ERROR, awaiting_leader=True)
            plan = req.assignments or {}
            _store_plan(conn, req.group_id, list(members), plan)
            _set_state(conn, req.group_id, group.generation_id, STABLE, now)
            assignment = plan.get(req.member_id, MemberAssignment(b"")).assignment
    return SyncGroupResponse(
        KafkaError.NO_ERROR,
        member_assignment=bytes(assignment or b""),
        protocol_type=group.protocol_type,
        protocol_name=group.protocol,
    )


def _store_plan(
    conn: Connection, group_id: str, member_ids: list[str], plan: Mapping[str, MemberAssignment]
) -> None:
    """Every member's part of the leader's plan; a member the plan leaves out gets none."""
    parts = [plan.get(m, MemberAssignment(b"")) for m in member_ids]
    conn.execute(
        sql.SET_MEMBER_ASSIGNMENTS,
        {
            "group_id": group_id,
            "member_ids": member_ids,
            "assignments": [p.assignment for p in parts],
            "partitions": [json.dumps([list(tp) for tp in p.partitions]) for p in parts],
        },
    )


@retry_conflicts
def leave_group(broker: BrokerContext, req: LeaveGroupRequest) -> LeaveGroupResponse:
    now = broker.clock.now_ms()
    with broker.engine.begin() as conn:
        left = _before_classic(conn, broker, req, now, consumer_classic.leave, LeaveGroupResponse)
        if left is not None:
            return left
        group = _lock_group(conn, req.group_id)
        member_id = req.member_id
        if req.group_instance_id is not None:
            static = [
                m
                for m in _members(conn, req.group_id)
                if m.group_instance_id == req.group_instance_id
            ]
            if not static:
                return LeaveGroupResponse(KafkaError.UNKNOWN_MEMBER_ID)
            if member_id and member_id != static[0].member_id:
                return LeaveGroupResponse(KafkaError.FENCED_INSTANCE_ID)
            member_id = static[0].member_id
        if (
            conn.execute(
                sql.DELETE_MEMBER, {"group_id": req.group_id, "member_id": member_id}
            ).rowcount
            == 0
        ):
            return LeaveGroupResponse(KafkaError.UNKNOWN_MEMBER_ID)
        generation = group.generation_id
        if group.state != PREPARING_REBALANCE:
            generation = _start_rebalance(conn, req.group_id, generation, now)
        _maybe_complete(conn, group, generation, now)
    return LeaveGroupResponse(KafkaError.NO_ERROR)


def offsets_only(conn: Connection, group_id: str) -> bool:
    """Whether a group without a membership row holds offsets (committed, or pending in a
    transaction): a consumer that only commits. Kafka describes and lists such a group
    Empty, with no protocol type."""
    held = conn.execute(sql.GROUP_OFFSETS_HELD, {"group_id": group_id}).one()
    return bool(held.committed or held.pending)


def list_groups(broker: BrokerContext, req: ListGroupsRequest) -> ListGroupsResponse:
    """The groups the caller may describe, as Kafka lists them: those with a membership
    row, and those that only hold offsets (``offsets_only``), Empty. A consumer group's
    members past their session are removed first (``consumer.expire_idle``)."""
    now = broker.clock.now_ms()
    with broker.engine.begin() as conn:
        session = broker.settings.group_consumer_session_timeout_ms
        for group_id in conn.execute(
            sql.CONSUMER_GROUPS_IDLE, {"now": now, "session_ms": session}
        ).scalars():
            expire_idle(conn, broker, group_id, now)
        rows = {
            g.group_id: (g.protocol_type or CONSUMER, g.state, g.group_type)
            for g in conn.execute(sql.ALL_GROUPS)
        }
        for held in conn.execute(sql.GROUPS_HOLDING_OFFSETS).scalars():
            rows.setdefault(held, ("", EMPTY, CLASSIC))
        listed = [
            ListedGroup(group_id, protocol_type, state, group_type)
            for group_id, (protocol_type, state, group_type) in sorted(rows.items())
            if (req.states is None or state in req.states)
            and not denied_checks(conn, broker, needs.describe_group(group_id))
        ]
    return ListGroupsResponse(KafkaError.NO_ERROR, listed)


def describe_groups(broker: BrokerContext, req: DescribeGroupsRequest) -> DescribeGroupsResponse:
    """Each group's state, protocol and members; one that only holds offsets is Empty
    (``offsets_only``), one it has never seen Dead."""
    out = []
    with broker.engine.begin() as conn:
        for group_id in req.group_ids:
            if "\x00" in group_id:  # no group can have it: kip98 cannot store NUL
                out.append(DescribedGroup(group_id, KafkaError.NO_ERROR, DEAD, "", ""))
                continue
            if refused := refusal_for(conn, broker, needs.describe_group(group_id)):
                out.append(DescribedGroup(group_id, refused.error.code(), DEAD, "", ""))
                continue
            group = conn.execute(sql.SHARE_GROUP, {"group_id": group_id}).first()
            if group is not None and group.group_type != CLASSIC:
                # Kafka's DescribeGroups (to v5) shows a consumer group (KIP-848) as Dead.
                out.append(DescribedGroup(group_id, KafkaError.NO_ERROR, DEAD, "", ""))
                continue
            if group is None:
                state = EMPTY if offsets_only(conn, group_id) else DEAD
                out.append(DescribedGroup(group_id, KafkaError.NO_ERROR, state, "", ""))
                continue
            out.append(_described(group, _members(conn, group_id)))
    return DescribeGroupsResponse(out)


def _described(group: Any, members: list[Any]) -> DescribedGroup:
    classic = group.protocol_type is not None
    described = []
    for mem in members:
        metadata = b""
        if classic and mem.protocol_names:
            chosen = dict(zip(mem.protocol_names, mem.protocol_metadata, strict=True))
            metadata = bytes(chosen.get(group.protocol, b""))
        described.append(
            DescribedMember(
                mem.member_id, mem.group_instance_id, mem.client_id, metadata,
                bytes(mem.member_assignment or b""),
                tuple((t, p) for t, p in mem.assignment), mem.client_host,
            )
        )  # fmt: skip
    protocol = group.protocol if group.state in _SETTLED else ""
    return DescribedGroup(
        group.group_id, KafkaError.NO_ERROR, group.state, group.protocol_type or CONSUMER,
        protocol, described,
    )  # fmt: skip


def static_member_refusal(
    members: Iterable[Any], member_id: str, group_instance_id: str | None
) -> tuple[int, str] | None:
    """KIP-345: a request naming a static member's instance id must come from the member
    that instance is now (a restarted instance fences its old member id), as Kafka checks
    every classic group request that carries one: an instance the group does not know is
    UNKNOWN_MEMBER_ID, another member's FENCED_INSTANCE_ID. None: nothing to refuse."""
    if group_instance_id is None:
        return None
    static = next((m for m in members if m.group_instance_id == group_instance_id), None)
    if static is None:
        return KafkaError.UNKNOWN_MEMBER_ID, f"no member has instance id {group_instance_id!r}"
    if static.member_id != member_id:
        return (
            KafkaError.FENCED_INSTANCE_ID,
            f"instance {group_instance_id!r} is member {static.member_id!r} now",
        )
    return None


def check_generation(
    conn: Connection,
    group_id: str,
    member_id: str,
    generation_id: int,
    now: int,
    group_instance_id: str | None = None,
    *,
    transactional: bool = False,
    before_member_epochs: bool = False,
    partitions: Collection[TopicPartitionKey] = (),
) -> None:
    """Offset commits from a group member must come from its current, stable generation
    (in a consumer group, its member epoch: ``check_member_epoch``, with the ``partitions``
    committed).

    Generation -1 (a consumer using assign() only, an admin) is accepted while the group
    has no members, as Kafka accepts it; in a classic group with members an OffsetCommit
    is then checked as a member's (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION), as Kafka's
    ClassicGroup checks it, while a TxnOffsetCommit of generation -1 (a producer sending
    offsets by group id alone) and a native group's commit are accepted. A static member's instance id, if given, must
    name ``member_id`` in a group that has members (``static_member_refusal``).
    """
    if check_member_epoch(
        conn, group_id, member_id, generation_id, transactional=transactional,
        before_member_epochs=before_member_epochs, partitions=partitions,
    ):  # fmt: skip
        return  # a consumer group's commit: KIP-848's member epoch checked
    if generation_id < 0 and group_instance_id is None and (transactional or not member_id):
        group = conn.execute(sql.SHARE_GROUP, {"group_id": group_id}).first()
        if transactional or group is None or group.state == EMPTY or not group.protocol_type:
            return
        if _members(conn, group_id):
            # An admin's commit (generation -1, no member) to a classic group with members:
            # Kafka accepts it only while the group is Empty.
            raise fail(
                KafkaError.UNKNOWN_MEMBER_ID,
                f"group {group_id!r} has members: commit as one, or once it is Empty",
            )
        return
    group = conn.execute(sql.SHARE_GROUP, {"group_id": group_id}).first()
    if group is None or (generation_id < 0 and group.state == EMPTY):
        if generation_id < 0:
            return
        raise fail(
            KafkaError.ILLEGAL_GENERATION, f"group {group_id!r} has no generation {generation_id}"
        )
    members = _members(conn, group_id)
    if refused := static_member_refusal(members, member_id, group_instance_id):
        raise fail(*refused)
    if generation_id < 0 and (transactional or not members or not group.protocol_type):
        return
    member = next((mem for mem in members if mem.member_id == member_id), None)
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
