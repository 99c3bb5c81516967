"""KIP-848's consumer groups: ConsumerGroupHeartbeat and ConsumerGroupDescribe over the
group tables, as Kafka's GroupMetadataManager serves them.

Each heartbeat is one DB transaction holding the group's row: members past their session
(or, revoking, past their rebalance timeout) are removed first; the member is found or
joins, its subscription updated; a change of any subscription, of the members, or of the
subscribed topics' partitions bumps the group epoch, and a new target assignment is
computed at it by the group's server-side assignor; then the member reconciles one step
towards its target (``consumer_assignment.reconcile``). Every group epoch, target and
member epoch change is an event in ``consumer_group_events``; ``consumer_group_members``
and the group's row are the projection a restarted (or another) ``kip98 serve`` continues
from (docs/design.md rules 60-62).
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Connection

from app.errors import KafkaError, KafkaException, fail
from app.groups import sql
from app.groups.classic import choose_protocol
from app.groups.consumer_assignment import (
    GROUP_EMPTY,
    UNREVOKED_PARTITIONS,
    Assignment,
    MemberAssignmentState,
    group_state,
    pairs,
    reconcile,
    target_assignment,
)
from app.protocol import (
    ConsumerGroupDescribed,
    ConsumerGroupDescribedMember,
    ConsumerGroupDescribeRequest,
    ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
    TopicPartitionKey,
    configured_assignors,
    migration_policy,
)
from app.security import needs
from app.security.authorizer import authorize_all, refusal_for
from app.storage.context import BrokerContext
from app.storage.engine import retry_conflicts

CONSUMER, CLASSIC = "consumer", "classic"
JOIN_EPOCH, LEAVE_EPOCH, STATIC_LEAVE_EPOCH = 0, -1, -2


@dataclass
class Member:
    """A member as the projection holds it."""

    member_id: str
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: list[str]
    subscribed_topic_regex: str | None
    server_assignor: str | None
    rebalance_timeout_ms: int
    epochs: MemberAssignmentState
    target: dict[str, frozenset[int]]
    last_heartbeat_ms: int
    revocation_deadline_ms: int | None
    joined_ms: int
    # Per partition it owns, the member epoch it was assigned at (KIP-1251).
    assignment_epochs: dict[TopicPartitionKey, int] = field(default_factory=dict)
    # A member of the classic protocol (KIP-848's online upgrade): the session timeout and
    # protocols its JoinGroup carried ({"session_timeout_ms", "protocols": [{"name",
    # "metadata" (base64)}]}); None: a member of the consumer protocol.
    classic: dict[str, Any] | None = None


def _assignment(stored: Any) -> dict[str, frozenset[int]]:
    return {t: frozenset(ps) for t, ps in sorted((stored or {}).items())}


def _assignment_epochs(stored: Any) -> dict[TopicPartitionKey, int]:
    return {(t, int(p)): int(e) for t, ps in (stored or {}).items() for p, e in ps.items()}


def owned_since(m: Member) -> dict[TopicPartitionKey, int]:
    """Each partition the member owns (assigned or pending revocation) with the member
    epoch it was assigned at: the epoch it already had, else the member's current one."""
    owned = pairs(m.epochs.assigned) | pairs(m.epochs.pending_revocation)
    return {tp: m.assignment_epochs.get(tp, m.epochs.member_epoch) for tp in sorted(owned)}


def _stored(assignment: Assignment) -> str:
    return json.dumps({t: sorted(ps) for t, ps in sorted(assignment.items()) if ps})


def _member(row: Any) -> Member:
    return Member(
        row.member_id, row.instance_id, row.rack_id, row.client_id, row.client_host,
        list(row.subscribed_topic_names), row.subscribed_topic_regex, row.server_assignor,
        row.rebalance_timeout_ms,
        MemberAssignmentState(
            row.member_epoch, row.previous_member_epoch, row.state,
            _assignment(row.assigned), _assignment(row.pending_revocation),
        ),
        _assignment(row.target), row.last_heartbeat_ms, row.revocation_deadline_ms,
        row.joined_ms, _assignment_epochs(row.assignment_epochs), row.classic_member,
    )  # fmt: skip


def _save(conn: Connection, group_id: str, m: Member) -> None:
    m.assignment_epochs = owned_since(m)
    epochs: dict[str, dict[str, int]] = {}
    for (topic, partition), epoch in m.assignment_epochs.items():
        epochs.setdefault(topic, {})[str(partition)] = epoch
    conn.execute(
        sql.UPSERT_CONSUMER_MEMBER,
        {
            "group_id": group_id, "member_id": m.member_id, "instance_id": m.instance_id,
            "rack_id": m.rack_id, "client_id": m.client_id, "client_host": m.client_host,
            "subscribed_topic_names": json.dumps(m.subscribed_topic_names),
            "subscribed_topic_regex": m.subscribed_topic_regex,
            "server_assignor": m.server_assignor,
            "rebalance_timeout_ms": m.rebalance_timeout_ms,
            "member_epoch": m.epochs.member_epoch,
            "previous_member_epoch": m.epochs.previous_member_epoch,
            "state": m.epochs.state, "assigned": _stored(m.epochs.assigned),
            "pending_revocation": _stored(m.epochs.pending_revocation),
            "target": _stored(m.target), "last_heartbeat_ms": m.last_heartbeat_ms,
            "revocation_deadline_ms": m.revocation_deadline_ms, "joined_ms": m.joined_ms,
            "assignment_epochs": json.dumps(epochs),
            "classic_member": None if m.classic is None else json.dumps(m.classic),
        },
    )  # fmt: skip


def member_record(m: Member) -> dict[str, Any]:
    """All the projection holds of a member but its last heartbeat: each event naming a
    member carries it (``detail.member``), so ``kip98 db rebuild`` rebuilds the member
    from the events (``groups/consumer_rebuild``)."""
    epochs: dict[str, dict[str, int]] = {}
    for (topic, partition), epoch in sorted(m.assignment_epochs.items()):
        epochs.setdefault(topic, {})[str(partition)] = epoch
    return {
        "instance_id": m.instance_id, "rack_id": m.rack_id, "client_id": m.client_id,
        "client_host": m.client_host, "subscribed_topic_names": m.subscribed_topic_names,
        "subscribed_topic_regex": m.subscribed_topic_regex,
        "server_assignor": m.server_assignor, "rebalance_timeout_ms": m.rebalance_timeout_ms,
        "member_epoch": m.epochs.member_epoch,
        "previous_member_epoch": m.epochs.previous_member_epoch, "state": m.epochs.state,
        "assigned": json.loads(_stored(m.epochs.assigned)),
        "pending_revocation": json.loads(_stored(m.epochs.pending_revocation)),
        "target": json.loads(_stored(m.target)),
        "revocation_deadline_ms": m.revocation_deadline_ms, "joined_ms": m.joined_ms,
        "assignment_epochs": epochs, "classic_member": m.classic,
    }  # fmt: skip


def _event(
    conn: Connection, group_id: str, kind: str, group_epoch: int, now: int,
    member: Member | None = None, detail: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    if member is not None:
        detail = {**(detail or {}), "member": member_record(member)}
    conn.execute(
        sql.LOG_CONSUMER_GROUP_EVENT,
        {
            "group_id": group_id, "kind": kind,
            "member_id": None if member is None else member.member_id,
            "group_epoch": group_epoch,
            "member_epoch": None if member is None else member.epochs.member_epoch,
            "detail": None if detail is None else json.dumps(detail), "now": now,
        },
    )  # fmt: skip


def _member_detail(m: Member) -> dict[str, Any]:
    return {
        "state": m.epochs.state,
        "previous_member_epoch": m.epochs.previous_member_epoch,
        "assigned": json.loads(_stored(m.epochs.assigned)),
        "pending_revocation": json.loads(_stored(m.epochs.pending_revocation)),
    }


def check_request(req: ConsumerGroupHeartbeatRequest, assignors: tuple[str, ...]) -> None:
    """Kafka's checks of a heartbeat before the group is looked at (INVALID_REQUEST,
    UNSUPPORTED_ASSIGNOR, INVALID_REGULAR_EXPRESSION)."""

    def invalid(why: str) -> KafkaException:
        return fail(KafkaError.INVALID_REQUEST, why)

    if not req.group_id:
        raise invalid("GroupId can't be empty.")
    if "\x00" in req.group_id:  # kip98 cannot store NUL, so no group has one
        raise fail(KafkaError.INVALID_GROUP_ID, "group id must not hold NUL")
    texts = [req.member_id, req.instance_id, req.rack_id, req.subscribed_topic_regex,
             req.server_assignor, *(req.subscribed_topic_names or ())]  # fmt: skip
    if any(t is not None and "\x00" in t for t in texts):
        raise invalid("a member's ids, topics and regular expression must not hold NUL")
    if req.instance_id == "":
        raise invalid("InstanceId can't be empty.")
    if req.rack_id == "":
        raise invalid("RackId can't be empty.")
    if req.member_epoch > 0 or req.member_epoch == LEAVE_EPOCH:
        if not req.member_id:
            raise invalid("MemberId can't be empty.")
    elif req.member_epoch == JOIN_EPOCH:
        if req.rebalance_timeout_ms == -1:
            raise invalid("RebalanceTimeoutMs must be provided in first request.")
        if req.owned is None or req.owned or req.unknown_topic_ids:
            raise invalid("TopicPartitions must be empty when (re-)joining.")
        if req.subscribed_topic_names is None and req.subscribed_topic_regex is None:
            raise invalid(
                "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
            )
    elif req.member_epoch == STATIC_LEAVE_EPOCH:
        if not req.member_id:
            raise invalid("MemberId can't be empty.")
        if req.instance_id is None:
            raise invalid("InstanceId can't be null.")
    else:
        raise invalid("MemberEpoch is invalid.")
    if req.server_assignor is not None and req.server_assignor not in assignors:
        raise fail(
            KafkaError.UNSUPPORTED_ASSIGNOR,
            f"ServerAssignor {req.server_assignor} is not supported. "
            f"Supported assignors: {', '.join(assignors)}.",
        )
    if req.subscribed_topic_regex is not None:
        compiled_regex(req.subscribed_topic_regex)


def compiled_regex(text: str) -> re.Pattern[str]:
    """A subscription's regular expression, matched against whole topic names."""
    try:
        return re.compile(text)
    except re.error as exc:
        raise fail(
            KafkaError.INVALID_REGULAR_EXPRESSION,
            f"SubscribedTopicRegex {text!r} is invalid: {exc}",
        ) from exc


def subscribed_topics(m: Member, topics: Mapping[str, int]) -> set[str]:
    """The topics a member's subscription names that exist: its list, and the topics its
    regular expression matches whole."""
    found = {t for t in m.subscribed_topic_names if t in topics}
    if m.subscribed_topic_regex:
        pattern = compiled_regex(m.subscribed_topic_regex)
        found |= {t for t in topics if pattern.fullmatch(t)}
    return found


def preferred_assignor(members: list[Member], assignors: tuple[str, ...]) -> str:
    """The assignor most members name (Kafka's preferred server assignor), else the first
    configured."""
    named = Counter(m.server_assignor for m in members if m.server_assignor in assignors)
    if not named:
        return assignors[0]
    return sorted(named.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]


@retry_conflicts
def consumer_group_heartbeat(
    broker: BrokerContext, req: ConsumerGroupHeartbeatRequest
) -> ConsumerGroupHeartbeatResponse:
    settings = broker.settings
    interval = settings.group_consumer_heartbeat_interval_ms
    try:
        assignors = configured_assignors(settings.group_consumer_assignors)
        check_request(req, assignors)
        now = broker.clock.now_ms()
        with broker.engine.begin() as conn:
            authorize_all(conn, broker, needs.group_membership(req.group_id))
            group = _group_for(conn, broker, req, now)
            heartbeat = _Heartbeat(conn, broker, group, now, assignors)
            if group.group_epoch == 0 and req.member_epoch == JOIN_EPOCH:
                heartbeat.created()
            # The member heartbeating is of the consumer protocol: no downgrade under it.
            heartbeat.expire(downgrade=False)
            if req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
                return heartbeat.leave(req)
            return heartbeat.beat(req, interval)
    except KafkaException as exc:
        return ConsumerGroupHeartbeatResponse(
            exc.error.code(), exc.error.str(), member_id=None, member_epoch=-1
        )


def _group_for(
    conn: Connection, broker: BrokerContext, req: ConsumerGroupHeartbeatRequest, now: int
) -> Any:
    """The group's row locked: created by a joining member; an empty classic group is
    taken over by one (Kafka deletes it and creates a consumer group); a classic group
    with members is upgraded online by one (``upgrade``); no group at all for a member
    that is not joining, or a classic group with members for one, is GROUP_ID_NOT_FOUND,
    as Kafka answers."""
    group = conn.execute(sql.LOCK_CONSUMER_GROUP, {"group_id": req.group_id}).first()
    joining = req.member_epoch == JOIN_EPOCH
    if group is None:
        if not joining:
            raise fail(KafkaError.GROUP_ID_NOT_FOUND, f"Consumer group {req.group_id} not found.")
        conn.execute(sql.CREATE_CONSUMER_GROUP, {"group_id": req.group_id})
        return conn.execute(sql.LOCK_CONSUMER_GROUP, {"group_id": req.group_id}).one()
    if group.group_type != CONSUMER:
        classic_members = conn.execute(
            sql.CLASSIC_MEMBERS_LEFT, {"group_id": req.group_id}
        ).scalar()
        if not joining:
            raise fail(
                KafkaError.GROUP_ID_NOT_FOUND, f"Group {req.group_id} is not a consumer group"
            )
        if classic_members:
            upgrade(conn, broker, req.group_id, now)
        else:
            conn.execute(sql.SET_GROUP_TYPE, {"group_id": req.group_id, "group_type": CONSUMER})
        group = conn.execute(sql.LOCK_CONSUMER_GROUP, {"group_id": req.group_id}).one()
    return group


def upgrade(conn: Connection, broker: BrokerContext, group_id: str, now: int) -> None:
    """KIP-848's online upgrade, as Kafka 4.4 converts a classic group a consumer-protocol
    member joins: allowed by the migration policy, for a group of the embedded consumer
    protocol (else GROUP_ID_NOT_FOUND, Kafka's words); the group epoch and every member's
    epoch become the classic generation, each member keeping its last assignment as its
    target, Stable, a classic member of the consumer group. One event holds them all, so
    the projection can be rebuilt (docs/design.md rule 66)."""
    allowed, _ = migration_policy(broker.settings.group_consumer_migration_policy)
    why = None
    classic = conn.execute(sql.SHARE_GROUP, {"group_id": group_id}).one()
    if not allowed:
        why = "online upgrade is disabled"
    elif classic.protocol_type != CONSUMER:
        why = "the group does not use the consumer embedded protocol"
    if why is not None:
        raise fail(
            KafkaError.GROUP_ID_NOT_FOUND,
            f"Cannot upgrade classic group {group_id} to consumer group because {why}.",
        )
    # kip98's generation moves on when a rebalance starts, Kafka's when it completes.
    settled = classic.state in ("Stable", "CompletingRebalance", "Empty")
    epoch = classic.generation_id if settled else max(classic.generation_id - 1, 0)
    members = []
    for r in conn.execute(sql.MEMBERS, {"group_id": group_id}):
        assigned = _assignment(_by_topic(r.assignment))
        members.append(
            Member(
                r.member_id, r.group_instance_id, None, r.client_id, r.client_host,
                sorted(set(r.topics or ())), None, None,
                r.rebalance_timeout_ms or r.session_timeout_ms,
                MemberAssignmentState(epoch, epoch, "stable", assigned, {}), dict(assigned),
                r.last_heartbeat_ms, None, r.joined_ms, {},
                classic_member(r.session_timeout_ms, r.protocol_names, r.protocol_metadata),
            )
        )  # fmt: skip
    conn.execute(sql.DELETE_CLASSIC_MEMBERS, {"group_id": group_id})
    conn.execute(sql.DELETE_PENDING_MEMBERS, {"group_id": group_id})
    conn.execute(sql.CLASSIC_TO_CONSUMER, {"group_id": group_id, "group_epoch": epoch})
    for m in members:
        _save(conn, group_id, m)
    _event(
        conn, group_id, "converted_from_classic", epoch, now, None,
        {"generation_id": classic.generation_id,
         "members": {m.member_id: {**_member_detail(m), "classic": m.classic,
                                   "subscribed_topic_names": m.subscribed_topic_names,
                                   "record": member_record(m)}
                     for m in members}},
    )  # fmt: skip


def _by_topic(stored: Any) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for topic, partition in stored or ():
        out.setdefault(topic, []).append(int(partition))
    return out


def classic_member(session_timeout_ms: int, names: Any, metadata: Any) -> dict[str, Any]:
    """What a consumer group keeps of a classic member's JoinGroup."""
    return {
        "session_timeout_ms": session_timeout_ms,
        "protocols": [
            {"name": n, "metadata": base64.b64encode(bytes(b)).decode()}
            for n, b in zip(names or (), metadata or (), strict=True)
        ],
    }


def classic_protocols(m: Member) -> list[tuple[str, bytes]]:
    assert m.classic is not None
    return [(p["name"], base64.b64decode(p["metadata"])) for p in m.classic["protocols"]]


class _Heartbeat:
    """One heartbeat's work on a locked group: its members loaded, changed, written."""

    def __init__(
        self, conn: Connection, broker: BrokerContext, group: Any, now: int,
        assignors: tuple[str, ...],
    ) -> None:  # fmt: skip
        self.conn, self.broker, self.now, self.assignors = conn, broker, now, assignors
        self.group_id = group.group_id
        self.group_epoch = group.group_epoch
        self.assignment_epoch = group.assignment_epoch
        self.metadata = group.subscription_metadata
        rows = conn.execute(sql.CONSUMER_MEMBERS, {"group_id": self.group_id}).all()
        self.members = {r.member_id: _member(r) for r in rows}
        self.topics = {r.topic: r.num_partitions for r in conn.execute(sql.ALL_TOPIC_PARTITIONS)}
        # Set once the group went back to classic (``downgrade``): nothing more to write.
        self.downgraded = False
        self.removed = 0  # members removed (fenced), not those a downgrade moved

    def created(self) -> None:
        """A group made (or taken over) by this join starts at group epoch 1, as
        Kafka's does."""
        self.group_epoch += 1
        _event(self.conn, self.group_id, "group_created", self.group_epoch, self.now)

    # -- removal

    def expire(self, downgrade: bool = True) -> None:
        """Members past their session (a classic member's own), or holding revoked
        partitions past their rebalance timeout, are removed (fenced), each a new group
        epoch; the last consumer-protocol member fenced may turn the group back into a
        classic one (``downgrade``; not while a heartbeat is about to act on it)."""
        session = self.broker.settings.group_consumer_session_timeout_ms

        def session_end(m: Member) -> int:
            own = session if m.classic is None else m.classic["session_timeout_ms"]
            return int(m.last_heartbeat_ms + own)

        def first_deadline(m: Member) -> int:
            ends = [session_end(m), m.revocation_deadline_ms]
            return min(e for e in ends if e is not None)

        # In the order the timers would have fired: which member goes first decides
        # whether the group is left with classic members only (and so downgraded).
        for m in sorted(self.members.values(), key=lambda m: (first_deadline(m), m.member_id)):
            if self.downgraded:
                break
            if session_end(m) < self.now:
                self.remove(m, "member_expired", downgrade)
            elif m.revocation_deadline_ms is not None and m.revocation_deadline_ms < self.now:
                # A classic member's deadline is also Kafka's join and sync timers'.
                kind = (
                    "member_revocation_timed_out"
                    if m.classic is None
                    else ("classic_member_rebalance_timed_out")
                )
                self.remove(m, kind, downgrade)
        self.finish()

    def remove(self, m: Member, kind: str, downgrade: bool = True) -> None:
        del self.members[m.member_id]
        self.removed += 1
        self.conn.execute(
            sql.DELETE_CONSUMER_MEMBER, {"group_id": self.group_id, "member_id": m.member_id}
        )
        if downgrade and self._downgradable():
            _event(self.conn, self.group_id, kind, self.group_epoch, self.now, m)
            self.downgrade()
            return
        self.group_epoch += 1
        _event(self.conn, self.group_id, kind, self.group_epoch, self.now, m)

    def _downgradable(self) -> bool:
        """Kafka's check when a member is fenced: the members left all of the classic
        protocol (and some are left), and the policy allows a downgrade."""
        if not self.members or any(m.classic is None for m in self.members.values()):
            return False
        _, allowed = migration_policy(self.broker.settings.group_consumer_migration_policy)
        return allowed

    def downgrade(self) -> None:
        """KIP-848's online downgrade, as Kafka 4.4 converts a consumer group whose last
        consumer-protocol member was fenced: a classic group of the embedded consumer
        protocol at generation = the group epoch, its members those left, the protocol
        chosen as a classic group chooses it, the first member to have joined its leader;
        then a rebalance starts (Kafka's prepareRebalance), so every member's heartbeat is
        answered REBALANCE_IN_PROGRESS and it rejoins. One event holds the conversion."""
        members = sorted(self.members.values(), key=lambda m: (m.joined_ms, m.member_id))
        protocols = [[n for n, _ in classic_protocols(m)] for m in members]
        protocol = choose_protocol(protocols)
        leader = members[0].member_id
        generation = self.group_epoch
        self.conn.execute(sql.DELETE_CONSUMER_MEMBERS, {"group_id": self.group_id})
        self.conn.execute(
            sql.CONSUMER_TO_CLASSIC,
            {"group_id": self.group_id, "generation_id": generation, "protocol": protocol,
             "leader_id": leader},
        )  # fmt: skip
        for m in members:
            chosen = classic_protocols(m)
            assert m.classic is not None
            self.conn.execute(
                sql.UPSERT_MEMBER,
                {
                    "group_id": self.group_id, "member_id": m.member_id,
                    "client_id": m.client_id, "client_host": m.client_host,
                    "group_instance_id": m.instance_id, "generation_id": generation,
                    "topics": json.dumps(m.subscribed_topic_names),
                    "protocol_names": [n for n, _ in chosen],
                    "protocol_metadata": [b for _, b in chosen],
                    "session_timeout_ms": m.classic["session_timeout_ms"],
                    "rebalance_timeout_ms": m.rebalance_timeout_ms, "now": self.now,
                },
            )  # fmt: skip
            self.conn.execute(
                sql.SET_ASSIGNMENT,
                {"group_id": self.group_id, "member_id": m.member_id,
                 "assignment": json.dumps(sorted(pairs(m.target)))},
            )  # fmt: skip
        self.conn.execute(
            sql.SET_GROUP,
            {"group_id": self.group_id, "generation_id": generation + 1,
             "state": "PreparingRebalance", "now": self.now, "join_deadline_ms": None},
        )  # fmt: skip
        _event(
            self.conn, self.group_id, "converted_to_classic", generation, self.now, None,
            {"protocol": protocol, "leader_id": leader,
             "members": [m.member_id for m in members]},
        )  # fmt: skip
        self.members = {}
        self.downgraded = True

    def leave(self, req: ConsumerGroupHeartbeatRequest) -> ConsumerGroupHeartbeatResponse:
        if req.instance_id is None:
            m = self.members.get(req.member_id)
            if m is None:
                raise fail(
                    KafkaError.UNKNOWN_MEMBER_ID,
                    f"Member {req.member_id} is not a member of group {self.group_id}.",
                )
            self.remove(m, "member_left")
            self.finish()
            return ConsumerGroupHeartbeatResponse(
                KafkaError.NO_ERROR, member_id=req.member_id, member_epoch=req.member_epoch
            )
        m = self._static(req.instance_id)
        if m.member_id != req.member_id:
            raise fail(
                KafkaError.FENCED_INSTANCE_ID,
                f"Static member {req.member_id} with instance id {req.instance_id} was fenced "
                f"by member {m.member_id}.",
            )
        if req.member_epoch == STATIC_LEAVE_EPOCH:
            # A static member leaving for a while keeps its place and its partitions
            # until its session ends, for the same instance to come back to.
            m.epochs = replace(m.epochs, member_epoch=STATIC_LEAVE_EPOCH, pending_revocation={})
            m.revocation_deadline_ms = None
            _save(self.conn, self.group_id, m)
            _event(self.conn, self.group_id, "static_member_left", self.group_epoch, self.now, m)
            self.finish()
            return ConsumerGroupHeartbeatResponse(
                KafkaError.NO_ERROR, member_id=m.member_id, member_epoch=STATIC_LEAVE_EPOCH
            )
        self.remove(m, "member_left")
        self.finish()
        return ConsumerGroupHeartbeatResponse(
            KafkaError.NO_ERROR, member_id=req.member_id, member_epoch=req.member_epoch
        )

    def _static(self, instance_id: str) -> Member:
        found = next((m for m in self.members.values() if m.instance_id == instance_id), None)
        if found is None:
            raise fail(KafkaError.UNKNOWN_MEMBER_ID, f"Instance id {instance_id} is unknown.")
        return found

    # -- the heartbeat

    def beat(
        self, req: ConsumerGroupHeartbeatRequest, interval: int
    ) -> ConsumerGroupHeartbeatResponse:
        member, bump = self._member(req)
        before = member.epochs
        if req.instance_id is not None:
            member.instance_id = req.instance_id
        if req.rack_id is not None:
            member.rack_id = req.rack_id
        if req.rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
        if req.server_assignor is not None and req.server_assignor != member.server_assignor:
            member.server_assignor = req.server_assignor
            bump = True
        names = req.subscribed_topic_names
        if names is not None and sorted(set(names)) != member.subscribed_topic_names:
            member.subscribed_topic_names = sorted(set(names))
            bump = True
        regex = req.subscribed_topic_regex
        if regex is not None and (regex or None) != member.subscribed_topic_regex:
            member.subscribed_topic_regex = regex or None
            bump = True
        member.client_id = req.client_id.replace("\x00", "")
        member.client_host = req.client_host
        member.last_heartbeat_ms = self.now
        self.members[member.member_id] = member
        metadata = self._subscription_metadata()
        if metadata != self.metadata:
            bump = True
        if bump:
            self.group_epoch += 1
            self.metadata = metadata
            _event(
                self.conn, self.group_id, "group_epoch", self.group_epoch, self.now, member,
                {"subscription_metadata": metadata},
            )  # fmt: skip
        if self.group_epoch > self.assignment_epoch:
            self._new_target()
        owned = None if req.owned is None else {t: frozenset(ps) for t, ps in req.owned.items()}
        member.epochs = reconcile(
            member.epochs, member.target, self.assignment_epoch, owned,
            self._owner_epoch(member.member_id),
        )  # fmt: skip
        if member.epochs.state == UNREVOKED_PARTITIONS:
            if before.state != UNREVOKED_PARTITIONS or member.revocation_deadline_ms is None:
                member.revocation_deadline_ms = self.now + member.rebalance_timeout_ms
        else:
            member.revocation_deadline_ms = None
        _save(self.conn, self.group_id, member)
        if member.epochs != before:
            _event(
                self.conn, self.group_id, "member_epoch", self.group_epoch, self.now, member,
                _member_detail(member),
            )  # fmt: skip
        self.finish()
        full = req.member_epoch == JOIN_EPOCH or (
            req.rebalance_timeout_ms != -1 and names is not None and req.owned is not None
        )
        changed = pairs(before.assigned) != pairs(member.epochs.assigned)
        assignment = None
        if full or changed:
            assignment = {t: tuple(sorted(ps)) for t, ps in member.epochs.assigned.items() if ps}
        return ConsumerGroupHeartbeatResponse(
            KafkaError.NO_ERROR, None, member.member_id, member.epochs.member_epoch,
            interval, assignment,
        )  # fmt: skip

    def _member(self, req: ConsumerGroupHeartbeatRequest) -> tuple[Member, bool]:
        """The member the heartbeat is from, and whether that alone bumps the group epoch
        (it does not: a subscription does). Joining (epoch 0) creates it, or starts it
        afresh; otherwise it must exist, at the epoch it was given or (a lost answer) the
        one before."""
        joining = req.member_epoch == JOIN_EPOCH
        member_id = req.member_id or str(uuid.uuid4())
        if req.instance_id is not None:
            static = next(
                (m for m in self.members.values() if m.instance_id == req.instance_id), None
            )
            if joining and static is not None and static.member_id != member_id:
                if static.epochs.member_epoch != STATIC_LEAVE_EPOCH:
                    raise fail(
                        KafkaError.UNRELEASED_INSTANCE_ID,
                        f"Static member {member_id} with instance id {req.instance_id} cannot "
                        f"join the group because the instance id is owned by "
                        f"{static.member_id} member.",
                    )
                # The instance is back under a new member id: it takes the old member's
                # place and partitions (KIP-345 in KIP-848), without a new group epoch.
                del self.members[static.member_id]
                self.conn.execute(
                    sql.DELETE_CONSUMER_MEMBER,
                    {"group_id": self.group_id, "member_id": static.member_id},
                )
                _event(
                    self.conn, self.group_id, "static_member_replaced", self.group_epoch,
                    self.now, static, {"new_member_id": member_id},
                )  # fmt: skip
                static.member_id = member_id
                static.epochs = replace(static.epochs, member_epoch=0, previous_member_epoch=0)
                return static, False
            if not joining:
                if static is None:
                    raise fail(
                        KafkaError.UNKNOWN_MEMBER_ID, f"Instance id {req.instance_id} is unknown."
                    )
                _check_epoch(static, req)
                return static, False
        existing = self.members.get(member_id)
        if joining:
            if existing is not None:
                # A member back at epoch 0 has let all its partitions go.
                existing.epochs = MemberAssignmentState(0, existing.epochs.member_epoch)
                return existing, False
            # A new member moves the group epoch by its subscription, if it has one.
            return Member(
                member_id, req.instance_id, req.rack_id, req.client_id, req.client_host,
                [], None, None, req.rebalance_timeout_ms, MemberAssignmentState(0, 0),
                {}, self.now, None, self.now,
            ), False  # fmt: skip
        if existing is None:
            raise fail(
                KafkaError.UNKNOWN_MEMBER_ID,
                f"Member {member_id} is not a member of group {self.group_id}.",
            )
        _check_epoch(existing, req)
        return existing, False

    def _subscription_metadata(self) -> dict[str, int]:
        subscribed: set[str] = set()
        for m in self.members.values():
            subscribed |= subscribed_topics(m, self.topics)
        return {t: self.topics[t] for t in sorted(subscribed)}

    def _new_target(self) -> None:
        members = list(self.members.values())
        assignor = preferred_assignor(members, self.assignors)
        subscriptions = {m.member_id: subscribed_topics(m, self.topics) for m in members}
        plan = target_assignment(
            assignor, subscriptions, self.metadata or {}, {m.member_id: m.target for m in members}
        )
        self.assignment_epoch = self.group_epoch
        for m in members:
            m.target = plan.get(m.member_id, {})
            _save(self.conn, self.group_id, m)
        _event(
            self.conn, self.group_id, "target_assignment", self.group_epoch, self.now, None,
            {"assignor": assignor,
             "targets": {m.member_id: json.loads(_stored(m.target)) for m in members}},
        )  # fmt: skip

    def _owner_epoch(self, member_id: str) -> Any:
        held: dict[tuple[str, int], int] = {}
        for m in self.members.values():
            if m.member_id == member_id:
                continue
            for tp in pairs(m.epochs.assigned) | pairs(m.epochs.pending_revocation):
                held[tp] = m.epochs.member_epoch

        def owner_epoch(topic: str, partition: int) -> int:
            return held.get((topic, partition), -1)

        return owner_epoch

    def finish(self) -> None:
        """The group's row as its members now leave it."""
        if self.downgraded:
            return
        state = group_state(
            (m.epochs for m in self.members.values()), self.group_epoch, self.assignment_epoch
        )
        self.conn.execute(
            sql.SET_CONSUMER_GROUP,
            {
                "group_id": self.group_id, "group_epoch": self.group_epoch,
                "assignment_epoch": self.assignment_epoch, "state": state,
                "subscription_metadata": None if self.metadata is None
                else json.dumps(self.metadata),
            },
        )  # fmt: skip


def _check_epoch(m: Member, req: ConsumerGroupHeartbeatRequest) -> None:
    """Kafka's fencing of a heartbeat's member epoch: ahead of the coordinator's, or
    behind it other than the one just before (with no partition it no longer has)."""
    known = m.epochs.member_epoch
    if req.member_epoch > known:
        raise fail(
            KafkaError.FENCED_MEMBER_EPOCH,
            f"The consumer group member has a greater member epoch ({req.member_epoch}) than "
            f"the one known by the group coordinator ({known}). The member must abandon all "
            "its partitions and rejoin.",
        )
    if req.member_epoch < known:
        owned = pairs({t: frozenset(ps) for t, ps in (req.owned or {}).items()})
        if req.member_epoch != m.epochs.previous_member_epoch or not owned <= pairs(
            m.epochs.assigned
        ):
            raise fail(
                KafkaError.FENCED_MEMBER_EPOCH,
                f"The consumer group member has a smaller member epoch ({req.member_epoch}) "
                f"than the one known by the group coordinator ({known}). The member must "
                "abandon all its partitions and rejoin.",
            )


# ---------------------------------------------------------------- offsets (KIP-848's fencing)


def check_member_epoch(
    conn: Connection,
    group_id: str,
    member_id: str,
    member_epoch: int,
    *,
    transactional: bool,
    before_member_epochs: bool = False,
    partitions: Collection[TopicPartitionKey] = (),
) -> bool:
    """For a consumer group, an offset commit's member and epoch, as Kafka's
    ConsumerGroup checks them: epoch -1 passes while the group has no members; otherwise
    the member must exist (UNKNOWN_MEMBER_ID), commit at an OffsetCommit version that
    carries a member epoch (``before_member_epochs``, below v9: UNSUPPORTED_VERSION), and
    at that very epoch (STALE_MEMBER_EPOCH; ILLEGAL_GENERATION for a TxnOffsetCommit):
    KIP-447's fencing of a zombie; an earlier epoch only for ``partitions`` it still owns. Returns False when ``group_id`` is not a consumer group
    (the classic checks apply). A member is one until a heartbeat or the coordinator's
    timer (``expire_sessions``) removes it. The group's row is read FOR SHARE: a
    conversion (``upgrade``, ``downgrade``) under way is waited for, so a classic
    member's commit is never checked against the type it had before."""
    group = conn.execute(sql.SHARE_GROUP, {"group_id": group_id}).first()
    if group is None or group.group_type != CONSUMER:
        return False
    rows = conn.execute(sql.CONSUMER_MEMBERS, {"group_id": group_id}).all()
    if member_epoch < 0 and not rows:
        return True
    member = next((r for r in rows if r.member_id == member_id), None)
    if member is None:
        raise fail(
            KafkaError.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group {group_id}."
        )
    classic = member.classic_member is not None
    if classic and member_epoch != member.member_epoch:
        # A classic member of the group commits at its generation, its member epoch.
        raise fail(
            KafkaError.ILLEGAL_GENERATION,
            f"The received generation id {member_epoch} does not match the expected member "
            f"epoch {member.member_epoch}.",
        )
    if before_member_epochs and not transactional and not classic:
        raise fail(
            KafkaError.UNSUPPORTED_VERSION,
            "OffsetCommit version 9 or above must be used by members using the consumer "
            "group protocol.",
        )
    # A TxnOffsetCommit's stale epoch is ILLEGAL_GENERATION, as Kafka answers it.
    stale = KafkaError.ILLEGAL_GENERATION if transactional else KafkaError.STALE_MEMBER_EPOCH
    if member_epoch > member.member_epoch:
        raise fail(
            stale,
            f"Received member epoch {member_epoch} is newer than current member epoch "
            f"{member.member_epoch}.",
        )
    if member_epoch < member.member_epoch:
        # An earlier epoch commits the partitions the member owns (assigned, or pending
        # revocation) since that epoch or before, as Kafka 4.4 lets it (KIP-1251): a
        # commit sent while a heartbeat moved the member on is not refused for the move.
        since = _assignment_epochs(member.assignment_epochs)
        for topic, partition in sorted(partitions):
            assigned_at = since.get((topic, partition))
            if assigned_at is None:
                raise fail(
                    stale,
                    f"Partition {topic}-{partition} is not assigned or pending revocation "
                    "for member.",
                )
            if member_epoch < assigned_at:
                raise fail(
                    stale,
                    f"Received member epoch {member_epoch} is older than assignment epoch "
                    f"{assigned_at} for partition {topic}-{partition}.",
                )
    return True


def check_fetch_member(
    conn: Connection, group_id: str, member_id: str | None, member_epoch: int
) -> None:
    """An OffsetFetch's member (v9, KIP-848), as Kafka's ConsumerGroup checks it: none
    given (null, epoch -1: an admin, a classic consumer) passes; otherwise, in a consumer
    group, the member must exist (UNKNOWN_MEMBER_ID) at that very epoch
    (STALE_MEMBER_EPOCH). Any other group, or none, is not checked."""
    if member_id is None and member_epoch < 0:
        return
    group = conn.execute(sql.CONSUMER_GROUPS, {"group_ids": [group_id]}).first()
    if group is None:
        return
    rows = conn.execute(sql.CONSUMER_MEMBERS, {"group_id": group_id}).all()
    member = next((r for r in rows if r.member_id == member_id), None)
    if member is None:
        raise fail(
            KafkaError.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group {group_id}."
        )
    if member_epoch != member.member_epoch:
        raise fail(
            KafkaError.STALE_MEMBER_EPOCH,
            f"The received member epoch {member_epoch} does not match the expected member "
            f"epoch {member.member_epoch}.",
        )


# ---------------------------------------------------------------- describe


@retry_conflicts
def consumer_group_describe(
    broker: BrokerContext, req: ConsumerGroupDescribeRequest
) -> ConsumerGroupDescribeResponse:
    """Each group as Kafka's ConsumerGroupDescribe gives it, its members past their
    session removed first (``expire_idle``); a group that is not a consumer group (or
    none) is GROUP_ID_NOT_FOUND."""
    out: list[ConsumerGroupDescribed] = []
    now = broker.clock.now_ms()
    with broker.engine.begin() as conn:
        for group_id in req.group_ids:
            refused = refusal_for(conn, broker, needs.describe_group(group_id))
            if refused is not None:
                out.append(
                    ConsumerGroupDescribed(group_id, refused.error.code(), refused.error.str())
                )
                continue
            if "\x00" not in group_id:
                expire_idle(conn, broker, group_id, now)
            out.append(describe_one(conn, group_id, broker.settings.group_consumer_assignors))
    return ConsumerGroupDescribeResponse(out)


def expire_idle(conn: Connection, broker: BrokerContext, group_id: str, now: int) -> None:
    """Members past their session removed, as a heartbeat would: a group whose members
    all died (so none heartbeats) is described as it is, not as they left it."""
    session = broker.settings.group_consumer_session_timeout_ms
    idle = conn.execute(
        sql.CONSUMER_MEMBERS_IDLE, {"group_id": group_id, "now": now, "session_ms": session}
    ).scalar()
    if not idle:
        return
    group = conn.execute(sql.LOCK_CONSUMER_GROUP, {"group_id": group_id}).first()
    if group is None or group.group_type != CONSUMER:
        return
    assignors = configured_assignors(broker.settings.group_consumer_assignors)
    _Heartbeat(conn, broker, group, now, assignors).expire()


def expire_sessions(broker: BrokerContext, now: int) -> int:
    """The coordinator's timers, as Kafka's are: members past their session or their
    rebalance timeout removed from every consumer group, each a new group epoch and a
    new target for those left, with no heartbeat, Describe or ListGroups needed to notice
    (a group whose members all died moves on alone). Each group is its own DB
    transaction; returns how many members were removed."""
    session = broker.settings.group_consumer_session_timeout_ms
    with broker.engine.connect() as conn:
        groups = (
            conn.execute(sql.CONSUMER_GROUPS_TIMED_OUT, {"now": now, "session_ms": session})
            .scalars()
            .all()
        )
    return sum(_expire_group(broker, group_id, now) for group_id in groups)


@retry_conflicts
def _expire_group(broker: BrokerContext, group_id: str, now: int) -> int:
    with broker.engine.begin() as conn:
        group = conn.execute(sql.LOCK_CONSUMER_GROUP, {"group_id": group_id}).first()
        if group is None or group.group_type != CONSUMER:
            return 0
        assignors = configured_assignors(broker.settings.group_consumer_assignors)
        beat = _Heartbeat(conn, broker, group, now, assignors)
        beat.expire()
        return beat.removed


def describe_one(conn: Connection, group_id: str, assignors_text: str) -> ConsumerGroupDescribed:
    group = None
    if "\x00" not in group_id:  # no group can have it: kip98 cannot store NUL
        group = conn.execute(sql.CONSUMER_GROUPS, {"group_ids": [group_id]}).first()
    if group is None:
        return ConsumerGroupDescribed(
            group_id, KafkaError.GROUP_ID_NOT_FOUND, f"Group {group_id} not found."
        )
    members = [_member(r) for r in conn.execute(sql.CONSUMER_MEMBERS, {"group_id": group_id})]
    assignors = tuple(a.strip() for a in assignors_text.split(",") if a.strip()) or ("uniform",)
    return ConsumerGroupDescribed(
        group_id, KafkaError.NO_ERROR, None,
        state=group.state if members else GROUP_EMPTY,
        group_epoch=group.group_epoch, assignment_epoch=group.assignment_epoch,
        assignor_name=preferred_assignor(members, assignors),
        members=tuple(
            ConsumerGroupDescribedMember(
                m.member_id, m.instance_id, m.rack_id, m.epochs.member_epoch, m.client_id,
                m.client_host, tuple(m.subscribed_topic_names), m.subscribed_topic_regex,
                {t: tuple(sorted(ps)) for t, ps in m.epochs.assigned.items()},
                {t: tuple(sorted(ps)) for t, ps in m.target.items()},
                m.epochs.state, 1 if m.classic is None else 0,
            )
            for m in members
        ),
    )  # fmt: skip
