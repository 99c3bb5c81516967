"""The classic group protocol spoken raw, for the group scenarios: a member joining (with
its member id asked for first, as KIP-394 has a v4+ join do), syncing, heartbeating,
committing and fetching offsets, each as one request on a fresh connection.

Every call returns kio's answer; the scenarios pick what a client observes from it."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from tests.conformance.harness import Target
from tests.conformance.raw_calls import (
    DELETE_GROUPS,
    DESCRIBE_GROUPS,
    HEARTBEAT,
    JOIN_GROUP,
    LEAVE_GROUP,
    LIST_GROUPS,
    OFFSET_COMMIT,
    OFFSET_DELETE,
    OFFSET_FETCH,
    SYNC_GROUP,
    call,
    error,
)

JOIN_VERSION = 9  # the highest both brokers serve: KIP-394's MEMBER_ID_REQUIRED applies
SESSION_MS = 10_000
REBALANCE_MS = 30_000
RANGE = "range"


def subscription(*topics: str) -> bytes:
    """A consumer protocol subscription (v0) to ``topics``, as a member's metadata."""
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


def assignment(topic: str, *partitions: int) -> bytes:
    """A consumer protocol assignment (v0) of ``partitions`` of ``topic``."""
    out = struct.pack(">hi", 0, 1) + struct.pack(">h", len(topic)) + topic.encode()
    out += struct.pack(">i", len(partitions)) + b"".join(struct.pack(">i", p) for p in partitions)
    return out + struct.pack(">i", -1)


@dataclass(frozen=True)
class Member:
    group: str
    member_id: str
    generation: int
    leader: str
    instance: str | None = None

    @property
    def ids(self) -> dict[str, Any]:
        return {"group_id": self.group, "member_id": self.member_id,
                "generation_id": self.generation, "group_instance_id": self.instance}  # fmt: skip


def join_once(
    target: Target,
    group: str,
    member_id: str = "",
    *,
    topics: tuple[str, ...] = (),
    instance: str | None = None,
    version: int = JOIN_VERSION,
    protocol_type: str = "consumer",
    session_ms: int = SESSION_MS,
    protocols: list[dict[str, Any]] | None = None,
) -> Any:
    """One JoinGroup and its answer."""
    return call(target, JOIN_GROUP, version, {
        "group_id": group, "session_timeout": session_ms, "rebalance_timeout": REBALANCE_MS,
        "member_id": member_id, "group_instance_id": instance, "protocol_type": protocol_type,
        "protocols": protocols if protocols is not None
        else [{"name": RANGE, "metadata": subscription(*topics)}],
        "reason": None,
    })  # fmt: skip


def join(target: Target, group: str, member_id: str = "", **kwargs: Any) -> Any:
    """A member's join as a client makes it: a first answer of MEMBER_ID_REQUIRED is
    followed by a join with the member id it gave."""
    answer = join_once(target, group, member_id, **kwargs)
    if error(answer.error_code) == "MEMBER_ID_REQUIRED":
        answer = join_once(target, group, answer.member_id, **kwargs)
    return answer


def joined(target: Target, group: str, member_id: str = "", **kwargs: Any) -> Member:
    answer = join(target, group, member_id, **kwargs)
    assert error(answer.error_code) == "NONE", answer
    return Member(group, answer.member_id, answer.generation_id, answer.leader,
                  kwargs.get("instance"))  # fmt: skip


def sync(target: Target, member: Member, plan: dict[str, bytes] | None = None) -> Any:
    """SyncGroup (v5): the leader's carries ``plan`` (member id -> assignment)."""
    return call(target, SYNC_GROUP, 5, {
        **member.ids, "protocol_type": "consumer", "protocol_name": RANGE,
        "assignments": [{"member_id": m, "assignment": a} for m, a in (plan or {}).items()],
    })  # fmt: skip


def heartbeat(target: Target, member: Member) -> str:
    return error(call(target, HEARTBEAT, 4, member.ids).error_code)


def leave(target: Target, group: str, *members: tuple[str, str | None]) -> Any:
    """LeaveGroup (v5) of ``members`` (member id, instance id)."""
    return call(target, LEAVE_GROUP, 5, {
        "group_id": group,
        "members": [{"member_id": m, "group_instance_id": i, "reason": None} for m, i in members],
    })  # fmt: skip


def describe(target: Target, group: str) -> Any:
    return call(target, DESCRIBE_GROUPS, 5, {
        "groups": [group], "include_authorized_operations": False,
    }).groups[0]  # fmt: skip


def listed(target: Target, *states: str) -> dict[str, str]:
    """ListGroups (v4, with a states filter): each group's state by its id."""
    answer = call(target, LIST_GROUPS, 4, {"states_filter": list(states)})
    return {g.group_id: g.group_state for g in answer.groups}


def commit(
    target: Target,
    group: str,
    offsets: dict[tuple[str, int], int],
    *,
    member_id: str = "",
    generation: int = -1,
    instance: str | None = None,
    leader_epoch: int = -1,
    metadata: str | None = "",
) -> dict[tuple[str, int], str]:
    """OffsetCommit (v8): each partition's error by name."""
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), offset in offsets.items():
        by_topic.setdefault(topic, []).append(
            {"partition_index": partition, "committed_offset": offset,
             "committed_leader_epoch": leader_epoch, "committed_metadata": metadata}
        )  # fmt: skip
    answer = call(target, OFFSET_COMMIT, 8, {
        "group_id": group, "generation_id_or_member_epoch": generation, "member_id": member_id,
        "group_instance_id": instance,
        "topics": [{"name": t, "partitions": p} for t, p in by_topic.items()],
    })  # fmt: skip
    return {
        (t.name, p.partition_index): error(p.error_code)
        for t in answer.topics
        for p in t.partitions
    }


def fetch_offsets(
    target: Target, group: str, partitions: list[tuple[str, int]] | None
) -> dict[str, Any]:
    """OffsetFetch (v7) of ``partitions`` (None: all the group has): the group's error and
    each partition's (error, offset, leader epoch, metadata)."""
    topics = None
    if partitions is not None:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in partitions:
            by_topic.setdefault(topic, []).append(partition)
        topics = [{"name": t, "partition_indexes": p} for t, p in by_topic.items()]
    answer = call(target, OFFSET_FETCH, 7, {
        "group_id": group, "topics": topics, "require_stable": False,
    })  # fmt: skip
    found = {
        f"{t.name}:{p.partition_index}": [
            error(p.error_code), p.committed_offset, p.committed_leader_epoch, p.metadata,
        ]
        for t in answer.topics
        for p in t.partitions
    }  # fmt: skip
    return {"error": error(answer.error_code), "offsets": dict(sorted(found.items()))}


def delete_offsets(target: Target, group: str, partitions: list[tuple[str, int]]) -> Any:
    """OffsetDelete (v0): the group's error and each partition's."""
    by_topic: dict[str, list[dict[str, int]]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append({"partition_index": partition})
    answer = call(target, OFFSET_DELETE, 0, {
        "group_id": group, "topics": [{"name": t, "partitions": p} for t, p in by_topic.items()],
    })  # fmt: skip
    return {
        "error": error(answer.error_code),
        "partitions": sorted(
            (t.name, p.partition_index, error(p.error_code))
            for t in answer.topics
            for p in t.partitions
        ),
    }


def delete_groups(target: Target, *groups: str) -> dict[str, str]:
    answer = call(target, DELETE_GROUPS, 2, {"groups_names": list(groups)})
    return {r.group_id: error(r.error_code) for r in answer.results}
