"""The classic group protocol on the wire: JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
ListGroups and DescribeGroups over the broker's group requests; and a group's
administration, DeleteGroups and OffsetDelete; and OffsetFetch, of one group or (v8)
several.

Kafka holds a JoinGroup response until every member has rejoined, and a follower's
SyncGroup response until the leader has sent the assignment. Here both are long polls
(``Pending``): the connection's task looks again after a pause, holding no worker thread,
and each look of a JoinGroup also keeps the waiting member alive. The assignment stays
opaque bytes; for the "consumer" protocol the topics and partitions are also decoded, so
the SQL views and ``kip98 groups`` show wire groups as they show native ones.
"""

from __future__ import annotations

import struct
import time
import uuid
from dataclasses import replace
from typing import Any

from kio.schema.consumer_protocol_assignment.v0.data import ConsumerProtocolAssignment
from kio.schema.consumer_protocol_subscription.v0.data import ConsumerProtocolSubscription
from kio.schema.consumer_protocol_subscription.v1.data import (
    ConsumerProtocolSubscription as ConsumerProtocolSubscriptionV1,
)

from app.broker import Broker
from app.errors import KafkaError
from app.protocol import (
    GROUP,
    AuthorizedOperationsRequest,
    ConsumerGroupDescribeRequest,
    ConsumerGroupHeartbeatRequest,
    DeleteGroupsRequest,
    DescribeGroupsRequest,
    GroupProtocol,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    ListGroupsRequest,
    MemberAssignment,
    MetadataRequest,
    OffsetDeleteRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
    SyncGroupResponse,
    TopicPartitionKey,
)
from app.server import codec, features
from app.server.answer import NO_OPERATIONS, Pending
from app.server.node import Node

CONSUMER = "consumer"
# The group types of KIP-848's ListGroups filter.
CLASSIC = "classic"
UNSUPPORTED_VERSION = 35
FIRST_PAUSE_S, LAST_PAUSE_S = 0.005, 0.25
# A follower waits for its leader's plan at most this long; a leader that died is
# noticed sooner, by its session timeout, and the wait ends in REBALANCE_IN_PROGRESS.
SYNC_WAIT_S = 300.0


def join_group(broker: Broker, node: Node, request: Any) -> dict[str, Any] | Pending:
    protocols = tuple(GroupProtocol(p.name, p.metadata) for p in request.protocols)
    session_ms = _ms(request.session_timeout)
    # v0 has no rebalance timeout: the session timeout stood for both.
    rebalance_ms = _ms(getattr(request, "rebalance_timeout", request.session_timeout))
    join = JoinGroupRequest(
        request.group_id, request.member_id, _subscribed_topics(request.protocol_type, protocols),
        session_ms, client_id=node.client_id, client_host=node.client_host,
        group_instance_id=getattr(request, "group_instance_id", None),
        protocol_type=request.protocol_type, protocols=protocols,
        rebalance_timeout_ms=rebalance_ms, require_known_member_id=request.__version__ >= 4,
        skip_assignment_supported=request.__version__ >= 9,
        owned_partitions=_owned_partitions(request.protocol_type, protocols),
    )  # fmt: skip
    deadline = time.monotonic() + rebalance_ms / 1000 + session_ms / 1000
    return _join_pass(broker, join, deadline, FIRST_PAUSE_S)


def _join_pass(
    broker: Broker, join: JoinGroupRequest, deadline: float, pause: float
) -> dict[str, Any] | Pending:
    answer = broker.handle(join)
    if answer.error_code == KafkaError.NO_ERROR and answer.rebalancing:
        if time.monotonic() + pause > deadline:
            answer = JoinGroupResponse(KafkaError.REBALANCE_IN_PROGRESS, answer.member_id)
        else:
            again = replace(join, member_id=answer.member_id)
            return Pending(
                pause, lambda: _join_pass(broker, again, deadline, min(pause * 2, LAST_PAUSE_S))
            )
    return {
        "error_code": answer.error_code, "generation_id": answer.generation_id,
        "protocol_type": answer.protocol_type, "protocol_name": answer.protocol_name or "",
        "leader": answer.leader_id, "skip_assignment": answer.skip_assignment,
        "member_id": answer.member_id or join.member_id,
        "members": [
            {"member_id": m.member_id, "group_instance_id": m.group_instance_id,
             "metadata": m.metadata}
            for m in answer.members
        ],
    }  # fmt: skip


def sync_group(broker: Broker, node: Node, request: Any) -> dict[str, Any] | Pending:
    """The leader's SyncGroup carries every member's assignment; a follower's carries none
    and waits for the leader's."""
    protocol_type = getattr(request, "protocol_type", None) or CONSUMER
    plan = {
        a.member_id: MemberAssignment(a.assignment, _assigned(protocol_type, a.assignment))
        for a in request.assignments
    }
    sync = SyncGroupRequest(
        request.group_id, request.member_id, request.generation_id, plan,
        getattr(request, "group_instance_id", None),
    )  # fmt: skip
    return _sync_pass(broker, sync, time.monotonic() + SYNC_WAIT_S, FIRST_PAUSE_S)


def _sync_pass(
    broker: Broker, sync: SyncGroupRequest, deadline: float, pause: float
) -> dict[str, Any] | Pending:
    answer = broker.handle(sync)
    if answer.awaiting_leader:
        if time.monotonic() + pause > deadline:
            answer = SyncGroupResponse(KafkaError.REBALANCE_IN_PROGRESS)
        else:
            return Pending(
                pause, lambda: _sync_pass(broker, sync, deadline, min(pause * 2, LAST_PAUSE_S))
            )
    assignment = answer.member_assignment
    if answer.assignment_version is not None:
        assignment = _consumer_assignment(answer.assignment_version, answer.assignment)
    return {
        "error_code": answer.error_code, "protocol_type": answer.protocol_type,
        "protocol_name": answer.protocol_name, "assignment": assignment,
    }  # fmt: skip


def _consumer_assignment(version: int, partitions: list[TopicPartitionKey]) -> bytes:
    """A classic member of a consumer group (KIP-848): the coordinator's assignment as the
    consumer protocol's ConsumerProtocolAssignment, at the version of the member's
    subscription (v0 to v3 share this layout), with no user data."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    out = bytearray(struct.pack(">hi", version, len(by_topic)))
    for topic, ps in sorted(by_topic.items()):
        name = topic.encode()
        out += struct.pack(">h", len(name)) + name + struct.pack(">i", len(ps))
        out += b"".join(struct.pack(">i", p) for p in sorted(ps))
    return bytes(out + struct.pack(">i", -1))


def heartbeat(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    answer = broker.handle(
        HeartbeatRequest(
            request.group_id,
            request.member_id,
            request.generation_id,
            getattr(request, "group_instance_id", None),
        )
    )
    return {"error_code": answer.error_code}


def leave_group(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """Up to v2 one member leaves; from v3 several, each answered (KIP-345's batch leave
    of static members by their instance id)."""
    if request.__version__ < 3:
        answer = broker.handle(LeaveGroupRequest(request.group_id, request.member_id))
        return {"error_code": answer.error_code}
    members = []
    for m in request.members:
        answer = broker.handle(
            LeaveGroupRequest(request.group_id, m.member_id, m.group_instance_id)
        )
        members.append(
            {"member_id": m.member_id, "group_instance_id": m.group_instance_id,
             "error_code": answer.error_code}
        )  # fmt: skip
    return {"error_code": KafkaError.NO_ERROR, "members": members}


def list_groups(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    states = tuple(getattr(request, "states_filter", ()) or ()) or None
    types = {t.lower() for t in getattr(request, "types_filter", ()) or ()}
    answer = broker.handle(ListGroupsRequest(states))
    groups = [
        {"group_id": g.group_id, "protocol_type": g.protocol_type, "group_state": g.state,
         "group_type": g.group_type}
        for g in answer.groups
        if not types or g.group_type in types
    ]  # fmt: skip
    return {"error_code": answer.error_code, "groups": groups}


def describe_groups(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """With v3's include_authorized_operations, each group's (KIP-430)."""
    answer = broker.handle(DescribeGroupsRequest(tuple(request.groups)))
    operations: dict[str, int] = {}
    if getattr(request, "include_authorized_operations", False):
        described = [g.group_id for g in answer.groups if g.error_code == KafkaError.NO_ERROR]
        asked = AuthorizedOperationsRequest(GROUP, tuple(described))
        operations = broker.handle(asked).operations
    groups = []
    for g in answer.groups:
        members = [
            {"member_id": m.member_id, "group_instance_id": m.group_instance_id,
             "client_id": m.client_id, "client_host": m.client_host, "member_metadata": m.metadata,
             "member_assignment": m.assignment}
            for m in g.members
        ]  # fmt: skip
        groups.append(
            {"error_code": g.error_code, "group_id": g.group_id, "group_state": g.state,
             "protocol_type": g.protocol_type, "protocol_data": g.protocol_name,
             "members": members,
             "authorized_operations": operations.get(g.group_id, NO_OPERATIONS)}
        )  # fmt: skip
    return {"groups": groups}


def _subscribed_topics(protocol_type: str, protocols: tuple[GroupProtocol, ...]) -> list[str]:
    """The topics a consumer subscribes to (every protocol's subscription names the same
    ones); none for another protocol type or metadata that does not decode."""
    if protocol_type != CONSUMER or not protocols:
        return []
    try:
        return list(
            codec.read_versioned(ConsumerProtocolSubscription, protocols[0].metadata).topics
        )
    except ValueError:
        return []


def _owned_partitions(
    protocol_type: str, protocols: tuple[GroupProtocol, ...]
) -> tuple[TopicPartitionKey, ...]:
    """The partitions a consumer's subscription (v1 and later) says it owns: a classic
    member of a consumer group is reconciled with them (KIP-848)."""
    if protocol_type != CONSUMER or not protocols:
        return ()
    metadata = protocols[0].metadata
    try:
        if len(metadata) < 2 or struct.unpack_from(">h", metadata)[0] < 1:
            return ()
        decoded = codec.read_versioned(ConsumerProtocolSubscriptionV1, metadata)
    except ValueError:
        return ()
    return tuple(
        sorted((tp.topic, int(p)) for tp in decoded.owned_partitions for p in tp.partitions)
    )


def _assigned(protocol_type: str, assignment: bytes) -> tuple[TopicPartitionKey, ...]:
    if protocol_type != CONSUMER or not assignment:
        return ()
    try:
        decoded = codec.read_versioned(ConsumerProtocolAssignment, assignment)
    except ValueError:
        return ()
    return tuple(
        sorted((tp.topic, int(p)) for tp in decoded.assigned_partitions for p in tp.partitions)
    )


def _ms(duration: Any) -> int:
    return int(duration.total_seconds() * 1000)


def delete_groups(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    answers = [broker.handle(DeleteGroupsRequest([g])).results[0] for g in request.groups_names]
    return {"results": [{"group_id": r.group_id, "error_code": r.error_code} for r in answers]}


def offset_delete(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """A refusal of the whole request is the response's error code, with no partitions
    (as Kafka answers it); else each partition's."""
    asked = [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
    answer = broker.handle(OffsetDeleteRequest(request.group_id, asked))
    if answer.error_code != KafkaError.NO_ERROR:
        return {"error_code": answer.error_code, "topics": []}
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), code in answer.results.items():
        by_topic.setdefault(topic, []).append({"partition_index": partition, "error_code": code})
    return {
        "error_code": KafkaError.NO_ERROR,
        "topics": [{"name": t, "partitions": p} for t, p in by_topic.items()],
    }


def offset_fetch(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """Before v8 one group, its error also the response's; from v8 several, each answered
    on its own as Kafka's coordinator answers it (a group refused as a whole: its error,
    no topics), v9's member and epoch checked against a consumer group's; from v10 topics
    by id."""
    stable = getattr(request, "require_stable", False)
    if request.__version__ < 8:
        group = _offset_fetch_group(broker, request.group_id, _asked(request.topics), stable)
        return {"topics": group["topics"], "error_code": group["error_code"]}
    by_id = request.__version__ >= 10
    ids = _topic_ids(broker) if by_id else {}
    names = {i: n for n, i in ids.items()}
    groups = []
    for g in request.groups:
        asked = _asked(g.topics, names if by_id else None)
        answer = _offset_fetch_group(
            broker, g.group_id, asked, stable, getattr(g, "member_id", None),
            getattr(g, "member_epoch", -1),
        )  # fmt: skip
        if answer.pop("refused"):
            answer["topics"] = []
        elif by_id:
            answer["topics"] = _by_topic_id(answer["topics"], g.topics, ids, names)
        groups.append(answer)
    return {"groups": groups}


def _asked(topics: Any, names: dict[uuid.UUID, str] | None = None) -> list[tuple[str, int]] | None:
    """The partitions a fetch asks for by name (None: all the group has); from v10 its
    topics come by id (``names``), and an id no topic has is left out here."""
    if topics is None:
        return None
    if names is None:
        return [(t.name, p) for t in topics for p in t.partition_indexes]
    return [(names[t.topic_id], p) for t in topics if t.topic_id in names
            for p in t.partition_indexes]  # fmt: skip


def _by_topic_id(
    answered: list[dict[str, Any]],
    asked: Any,
    ids: dict[str, uuid.UUID],
    names: dict[uuid.UUID, str],
) -> list[dict[str, Any]]:
    """An OffsetFetch v10 group's topics by id, then each asked id no topic has with
    UNKNOWN_TOPIC_ID on its partitions, as Kafka 4.4 appends them (a topic gone since its
    offset was committed: the zero id, as Kafka's metadata gives it)."""
    topics = [{"topic_id": ids.get(t.pop("name"), uuid.UUID(int=0)), **t} for t in answered]
    for t in asked or ():
        if t.topic_id not in names:
            topics.append({"topic_id": t.topic_id, "partitions": [
                {"partition_index": p, "error_code": KafkaError.UNKNOWN_TOPIC_ID,
                 "committed_offset": -1, "committed_leader_epoch": -1,
                 "metadata": _NO_METADATA}
                for p in t.partition_indexes]})  # fmt: skip
    return topics


def _offset_fetch_group(
    broker: Broker,
    group_id: str,
    asked: list[tuple[str, int]] | None,
    require_stable: bool,
    member_id: str | None = None,
    member_epoch: int = -1,
) -> dict[str, Any]:
    a = broker.handle(OffsetFetchRequest(group_id, asked, require_stable, member_id, member_epoch))
    wanted = asked if asked is not None else sorted(a.offsets)
    # Partitions' own errors (UNSTABLE_OFFSET_COMMIT) are theirs alone, as Kafka answers.
    group_code = KafkaError.NO_ERROR if a.partition_errors else a.error_code
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for topic, partition in wanted:
        found = a.offsets.get((topic, partition))
        code = a.partition_errors.get((topic, partition), group_code)
        by_topic.setdefault(topic, []).append(
            {"partition_index": partition, "error_code": code,
             "committed_offset": -1 if found is None else found.offset,
             "committed_leader_epoch": -1 if found is None else found.leader_epoch,
             "metadata": _NO_METADATA if found is None or found.metadata is None
             else found.metadata}
        )  # fmt: skip
    return {
        "group_id": group_id,
        "topics": [{"name": t, "partitions": p} for t, p in by_topic.items()],
        "error_code": group_code,
        "refused": group_code != KafkaError.NO_ERROR,
    }


# Kafka's metadata of an offset committed with none, and of a partition with no offset
# (OffsetFetchResponse.NO_METADATA): the empty string, never null.
_NO_METADATA = ""


def consumer_group_heartbeat(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """KIP-848's heartbeat (``app.groups.consumer``): topics travel by id on the wire and
    by name inside. With ``group.version`` below 1 it is UNSUPPORTED_VERSION, as Kafka
    answers when the feature is off."""
    if not features.features_of(broker.settings.features).consumer_protocol:
        return _unsupported("The consumer group protocol is off (group.version 0).")
    ids = _topic_ids(broker)
    names = {i: n for n, i in ids.items()}
    owned: dict[str, tuple[int, ...]] | None = None
    unknown = 0
    if request.topic_partitions is not None:
        owned = {}
        for tp in request.topic_partitions:
            name = names.get(tp.topic_id)
            if name is None:
                unknown += 1
                continue
            owned[name] = tuple(owned.get(name, ())) + tuple(tp.partitions)
    topics = request.subscribed_topic_names
    beat = ConsumerGroupHeartbeatRequest(
        request.group_id, request.member_id, request.member_epoch,
        instance_id=request.instance_id, rack_id=request.rack_id,
        rebalance_timeout_ms=_ms(request.rebalance_timeout),
        subscribed_topic_names=None if topics is None else tuple(topics),
        subscribed_topic_regex=getattr(request, "subscribed_topic_regex", None),
        server_assignor=request.server_assignor, owned=owned,
        client_id=node.client_id or "", client_host=node.client_host or "",
        unknown_topic_ids=unknown,
    )  # fmt: skip
    answer = broker.handle(beat)
    if answer.error_code != KafkaError.NO_ERROR:
        return {"error_code": answer.error_code, "error_message": answer.error_message,
                "member_epoch": 0, "heartbeat_interval": 0}  # fmt: skip
    assignment = None
    if answer.assignment is not None:
        assignment = {
            "topic_partitions": [
                {"topic_id": ids[t], "partitions": list(ps)}
                for t, ps in sorted(answer.assignment.items()) if t in ids
            ]
        }  # fmt: skip
    return {
        "error_code": 0, "member_id": answer.member_id, "member_epoch": answer.member_epoch,
        "heartbeat_interval": answer.heartbeat_interval_ms, "assignment": assignment,
    }  # fmt: skip


def consumer_group_describe(broker: Broker, node: Node, request: Any) -> dict[str, Any]:
    """KIP-848's ConsumerGroupDescribe; UNSUPPORTED_VERSION with ``group.version`` 0."""
    if not features.features_of(broker.settings.features).consumer_protocol:
        message = "The consumer group protocol is off (group.version 0)."
        return {"groups": [
            {"error_code": UNSUPPORTED_VERSION, "error_message": message, "group_id": g,
             "group_state": "", "members": []}
            for g in request.group_ids
        ]}  # fmt: skip
    answer = broker.handle(ConsumerGroupDescribeRequest(tuple(request.group_ids)))
    operations: dict[str, int] = {}
    if getattr(request, "include_authorized_operations", False):
        described = [g.group_id for g in answer.groups if g.error_code == KafkaError.NO_ERROR]
        operations = broker.handle(AuthorizedOperationsRequest(GROUP, tuple(described))).operations
    ids = _topic_ids(broker)

    def assignment(parts: dict[str, tuple[int, ...]]) -> dict[str, Any]:
        return {"topic_partitions": [
            {"topic_id": ids[t], "topic_name": t, "partitions": list(ps)}
            for t, ps in sorted(parts.items()) if t in ids
        ]}  # fmt: skip

    groups = []
    for g in answer.groups:
        members = [
            {"member_id": m.member_id, "instance_id": m.instance_id, "rack_id": m.rack_id,
             "member_epoch": m.member_epoch, "client_id": m.client_id,
             "client_host": m.client_host,
             "subscribed_topic_names": list(m.subscribed_topic_names),
             "subscribed_topic_regex": m.subscribed_topic_regex,
             "assignment": assignment(m.assignment),
             "target_assignment": assignment(m.target_assignment),
             "member_type": m.member_type}
            for m in g.members
        ]  # fmt: skip
        groups.append(
            {"error_code": g.error_code, "error_message": g.error_message,
             "group_id": g.group_id, "group_state": g.state if g.error_code == 0 else "",
             "group_epoch": g.group_epoch, "assignment_epoch": g.assignment_epoch,
             "assignor_name": g.assignor_name, "members": members,
             "authorized_operations": operations.get(g.group_id, NO_OPERATIONS)}
        )  # fmt: skip
    return {"groups": groups}


def _unsupported(message: str) -> dict[str, Any]:
    return {"error_code": UNSUPPORTED_VERSION, "error_message": message, "member_epoch": 0,
            "heartbeat_interval": 0}  # fmt: skip


def _topic_ids(broker: Broker) -> dict[str, uuid.UUID]:
    """Every topic's id by its name (KIP-516): the consumer protocol names topics by id."""
    listed = broker.handle(MetadataRequest(None)).topics
    return {m.topic: uuid.UUID(m.topic_id) for m in listed if m.topic_id}
