"""OffsetCommit v10 and OffsetFetch v10 through ``kip98 serve``: topics by id (KIP-848's
follow-up), an id no topic has answered UNKNOWN_TOPIC_ID on its partitions and never
committed, the others as by name (docs/design.md rule 63)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kio.index import load_request_schema

from app.broker import Broker
from app.errors import KafkaError
from app.server.apis import APIS
from app.server.codec import build
from tests.helpers.wire_client import exchange

OFFSET_COMMIT, OFFSET_FETCH, METADATA, HEARTBEAT = 8, 9, 3, 68

pytestmark = pytest.mark.broker(topics={"t": 2, "u": 1})


def call(server: str, api_key: int, version: int, values: dict[str, Any]) -> Any:
    return exchange(server, api_key, version, build(load_request_schema(api_key, version), values))


def topic_id(server: str, name: str) -> uuid.UUID:
    answer = call(server, METADATA, 12, {"topics": [{"name": name}]})
    found: uuid.UUID = answer.topics[0].topic_id
    return found


def commit(
    server: str, group: str, topics: list[tuple[uuid.UUID, list[int]]], offset: int = 5,
    member: str = "", epoch: int = -1,
) -> list[tuple[uuid.UUID, list[tuple[int, int]]]]:  # fmt: skip
    values = {"group_id": group, "member_id": member, "generation_id_or_member_epoch": epoch,
              "topics": [{"topic_id": i, "partitions": [
                  {"partition_index": p, "committed_offset": offset, "committed_metadata": "m"}
                  for p in ps]} for i, ps in topics]}  # fmt: skip
    answer = call(server, OFFSET_COMMIT, 10, values)
    return [
        (t.topic_id, [(p.partition_index, p.error_code) for p in t.partitions])
        for t in answer.topics
    ]


def fetch(
    server: str, groups: list[tuple[str, list[tuple[uuid.UUID, list[int]]] | None]]
) -> list[tuple[int, list[tuple[uuid.UUID, list[tuple[int, int, str, int]]]]]]:
    values = {"groups": [
        {"group_id": g, "topics": None if ts is None else
         [{"topic_id": i, "partition_indexes": ps} for i, ps in ts]}
        for g, ts in groups
    ]}  # fmt: skip
    answer = call(server, OFFSET_FETCH, 10, values)
    return [
        (g.error_code, [
            (t.topic_id, [(p.partition_index, p.committed_offset, p.metadata, p.error_code)
                          for p in t.partitions])
            for t in g.topics])
        for g in answer.groups
    ]  # fmt: skip


def test_version_10_is_advertised() -> None:
    assert APIS[OFFSET_COMMIT][1] == 10 and APIS[OFFSET_FETCH][1] == 10


def test_offsets_committed_and_fetched_by_topic_id(server: str, broker: Broker) -> None:
    t, u = topic_id(server, "t"), topic_id(server, "u")
    unknown = uuid.uuid4()
    assert commit(server, "g", [(unknown, [0]), (t, [0, 1]), (u, [0])]) == [
        (unknown, [(0, KafkaError.UNKNOWN_TOPIC_ID)]),
        (t, [(0, 0), (1, 0)]),
        (u, [(0, 0)]),
    ]
    # Nothing of an unknown id is committed: the group's offsets are the known topics'.
    assert fetch(server, [("g", None)]) == [
        (0, [(t, [(0, 5, "m", 0), (1, 5, "m", 0)]), (u, [(0, 5, "m", 0)])])
    ]
    assert fetch(server, [("g", [(unknown, [0, 1]), (t, [1])]), ("none", [(u, [0])])]) == [
        (0, [(t, [(1, 5, "m", 0)]),
             (unknown, [(0, -1, "", KafkaError.UNKNOWN_TOPIC_ID),
                        (1, -1, "", KafkaError.UNKNOWN_TOPIC_ID)])]),
        (0, [(u, [(0, -1, "", 0)])]),
    ]  # fmt: skip
    # By name (v9) the same offsets.
    v9 = call(server, OFFSET_FETCH, 9, {"groups": [{"group_id": "g", "topics": None}]})
    assert sorted((x.name, p.committed_offset) for x in v9.groups[0].topics
                  for p in x.partitions) == [("t", 5), ("t", 5), ("u", 5)]  # fmt: skip


def test_a_commit_of_unknown_ids_only_never_reaches_the_group(server: str, broker: Broker) -> None:
    """As Kafka: nothing left to commit, the group is not asked, so a member it does not
    know is not refused."""
    unknown = uuid.uuid4()
    answer = commit(server, "g0", [(unknown, [0, 3])], member="stranger", epoch=9)
    assert answer == [
        (unknown, [(0, KafkaError.UNKNOWN_TOPIC_ID), (3, KafkaError.UNKNOWN_TOPIC_ID)])
    ]
    assert fetch(server, [("g0", None)]) == [(0, [])]


def test_a_consumer_group_member_commits_and_fetches_by_id_at_its_epoch(server: str) -> None:
    t = topic_id(server, "t")
    member = str(uuid.uuid4())
    joined = call(server, HEARTBEAT, 1, {
        "group_id": "cg", "member_id": member, "member_epoch": 0, "rebalance_timeout": 30000,
        "subscribed_topic_names": ["t"], "topic_partitions": [],
    })  # fmt: skip
    epoch = joined.member_epoch
    stale = commit(server, "cg", [(t, [0])], member=member, epoch=epoch + 1)
    assert stale == [(t, [(0, KafkaError.STALE_MEMBER_EPOCH)])]
    assert commit(server, "cg", [(t, [0])], offset=7, member=member, epoch=epoch) == [(t, [(0, 0)])]
    values = {"groups": [{"group_id": "cg", "member_id": member, "member_epoch": epoch + 1,
                          "topics": [{"topic_id": uuid.uuid4(), "partition_indexes": [0]}]}]}  # fmt: skip
    refused = call(server, OFFSET_FETCH, 10, values).groups[0]
    assert (refused.error_code, refused.topics) == (KafkaError.STALE_MEMBER_EPOCH, ())
    assert fetch(server, [("cg", [(t, [0])])]) == [(0, [(t, [(0, 7, "m", 0)])])]
