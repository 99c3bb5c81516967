"""OffsetCommit v10 and OffsetFetch v10 against both brokers: topics by id (KIP-848's
follow-up), an unknown id's partitions UNKNOWN_TOPIC_ID, a partition the topic lacks, a
group with no offsets, a consumer group's member at a stale epoch (docs/design.md rule 63)."""

from __future__ import annotations

import uuid
from typing import Any

from tests.conformance.harness import Observation, Target, same
from tests.conformance.raw_calls import METADATA, OFFSET_COMMIT, OFFSET_FETCH, call, error

HEARTBEAT = 68


def _topic_id(target: Target, name: str) -> uuid.UUID:
    answer = call(target, METADATA, 12, {"topics": [{"name": name}]})
    found: uuid.UUID = answer.topics[0].topic_id
    return found


def _committed(answer: Any, label: dict[Any, str]) -> list[Any]:
    """Each topic of a commit's answer (by label, in the answer's order) and its
    partitions' errors (by partition: Kafka lists a partition's refusal before the
    accepted ones)."""
    return [
        [label.get(t.topic_id, "?"),
         sorted([p.partition_index, error(p.error_code)] for p in t.partitions)]
        for t in answer.topics
    ]  # fmt: skip


def _fetched(answer: Any, label: dict[Any, str], every: bool = False) -> list[Any]:
    """Each group's error and topics (by label) with their partitions' offsets; ``every``:
    a fetch of all the group's offsets, whose topics Kafka lists in no set order."""
    groups = [
        [error(g.error_code),
         [[label.get(t.topic_id, "?"),
           [[p.partition_index, p.committed_offset, p.metadata, error(p.error_code)]
            for p in t.partitions]]
          for t in g.topics]]
        for g in answer.groups
    ]  # fmt: skip
    return [[code, sorted(topics)] for code, topics in groups] if every else groups


def scenario_offsets_by_topic_id(target: Target) -> Observation:
    """A commit names a known topic (one of its partitions out of range), an unknown id and
    the zero id; a fetch asks by id, for all, and for a group with no offsets; a commit of
    unknown ids only from a member the group does not know; a consumer group's member
    commits at its epoch and fetches at a stale one."""
    topic, other = target.create_topic("oid", 2), target.create_topic("oid-b", 1)
    known, second, unknown = _topic_id(target, topic), _topic_id(target, other), uuid.uuid4()
    label = {known: "known", second: "second", unknown: "unknown", None: "zero"}
    group, empty = target.name_for("oid"), target.name_for("oid-none")

    def parts(*indexes: int, offset: int = 5) -> list[dict[str, Any]]:
        return [{"partition_index": p, "committed_offset": offset, "committed_metadata": "m"}
                for p in indexes]  # fmt: skip

    seen: list[Any] = []
    commit = {"group_id": group, "member_id": "", "generation_id_or_member_epoch": -1,
              "topics": [{"topic_id": unknown, "partitions": parts(0)},
                         {"topic_id": known, "partitions": parts(0, 7, 1)},
                         {"topic_id": uuid.UUID(int=0), "partitions": parts(0)},
                         {"topic_id": second, "partitions": parts(0)}]}  # fmt: skip
    seen.append(_committed(call(target, OFFSET_COMMIT, 10, commit), label))
    asked = [{"topic_id": unknown, "partition_indexes": [0, 1]},
             {"topic_id": known, "partition_indexes": [1, 0, 9]}]  # fmt: skip
    fetch = {"groups": [{"group_id": group, "topics": asked},
                        {"group_id": empty, "topics": asked}]}  # fmt: skip
    seen.append(_fetched(call(target, OFFSET_FETCH, 10, fetch), label))
    every = {"groups": [{"group_id": group, "topics": None},
                        {"group_id": empty, "topics": None}]}  # fmt: skip
    seen.append(_fetched(call(target, OFFSET_FETCH, 10, every), label, every=True))
    stranger = {"group_id": group, "member_id": "stranger", "generation_id_or_member_epoch": 4,
                "topics": [{"topic_id": unknown, "partitions": parts(0, 3)}]}  # fmt: skip
    seen.append(_committed(call(target, OFFSET_COMMIT, 10, stranger), label))
    consumers, member = target.name_for("oid-cg"), str(uuid.uuid4())
    joined = call(target, HEARTBEAT, 1, {
        "group_id": consumers, "member_id": member, "member_epoch": 0,
        "rebalance_timeout": 30000, "subscribed_topic_names": [topic], "topic_partitions": [],
    })  # fmt: skip
    epoch = joined.member_epoch
    for member_epoch in (epoch + 1, epoch):
        by_member = {"group_id": consumers, "member_id": member,
                     "generation_id_or_member_epoch": member_epoch,
                     "topics": [{"topic_id": unknown, "partitions": parts(0)},
                                {"topic_id": known, "partitions": parts(1, offset=8)}]}  # fmt: skip
        seen.append(_committed(call(target, OFFSET_COMMIT, 10, by_member), label))
    for member_epoch in (epoch + 1, epoch):
        one = {"groups": [{"group_id": consumers, "member_id": member,
                           "member_epoch": member_epoch, "topics": asked}]}  # fmt: skip
        seen.append(_fetched(call(target, OFFSET_FETCH, 10, one), label))
    return seen


def test_offsets_by_topic_id(targets: tuple[Target, Target]) -> None:
    same(scenario_offsets_by_topic_id, *targets)
