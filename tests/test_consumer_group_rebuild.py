"""``kip98 db rebuild`` rebuilds KIP-848's projection (consumer_group_members, the consumer
groups' epochs, state and subscription metadata) from consumer_group_events: after joins,
reconciliation, a subscription change, a static member's leave and a member's leave, the
wiped projection rebuilt equals the live one (docs/design.md rule 61)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kio.index import load_request_schema
from sqlalchemy import text

from app.broker import Broker
from app.groups.consumer_rebuild import compute_consumer_groups, live_consumer_groups
from app.server.codec import build
from tests.helpers.cli_runner import run_kip98
from tests.helpers.wire_client import exchange, serving

HEARTBEAT, METADATA = 68, 3
HANG_GUARD_S = 60

pytestmark = pytest.mark.broker(topics={"a": 4, "b": 2})


@pytest.fixture
def server(db_url: str) -> Iterator[str]:
    """Sessions longer than the test, so no member expires while it compares."""
    with serving(db_url, env={"KIP98_GROUP_CONSUMER_SESSION_TIMEOUT_MS": "600000"}) as address:
        yield address


def beat(server: str, group: str, member: str, epoch: int, **fields: Any) -> Any:
    values = {"group_id": group, "member_id": member, "member_epoch": epoch,
              "rebalance_timeout": fields.pop("rebalance_timeout", -1),
              "topic_partitions": None, **fields}  # fmt: skip
    answer = exchange(server, HEARTBEAT, 1, build(load_request_schema(HEARTBEAT, 1), values))
    assert answer.error_code == 0, answer
    return answer


class Member:
    """A member heartbeating as a client does: reporting what it was last given."""

    def __init__(self, server: str, group: str, topics: list[str], **fields: Any) -> None:
        self.server, self.group, self.id = server, group, str(uuid.uuid4())
        joined = beat(server, group, self.id, 0, rebalance_timeout=30000,
                      subscribed_topic_names=topics, topic_partitions=[], **fields)  # fmt: skip
        self.epoch, self.owned = joined.member_epoch, self._owned(joined, [])

    @staticmethod
    def _owned(answer: Any, before: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if answer.assignment is None:
            return before
        return [{"topic_id": tp.topic_id, "partitions": list(tp.partitions)}
                for tp in answer.assignment.topic_partitions]  # fmt: skip

    def heartbeat(self, **fields: Any) -> None:
        answer = beat(self.server, self.group, self.id, self.epoch,
                      topic_partitions=self.owned, **fields)  # fmt: skip
        self.epoch, self.owned = answer.member_epoch, self._owned(answer, self.owned)


def settle(broker: Broker, members: list[Member], group: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        for m in members:
            m.heartbeat()
        with broker.engine.connect() as conn:
            state = conn.execute(
                text("SELECT state FROM consumer_groups WHERE group_id = :g"), {"g": group}
            ).scalar()
        if state == "Stable":
            return
    raise AssertionError(f"{group} not Stable within {HANG_GUARD_S} s")


def test_the_projection_rebuilt_from_the_events_equals_the_live_one(
    server: str, broker: Broker
) -> None:
    one = Member(server, "g", ["a"], rack_id="r1")
    two = Member(server, "g", ["a"], instance_id="static-2")
    three = Member(server, "g", ["a", "b"])
    settle(broker, [one, two, three], "g")
    three.heartbeat(subscribed_topic_names=["a"])  # a new subscription: a new group epoch
    settle(broker, [one, two, three], "g")
    beat(server, "g", two.id, -2, instance_id="static-2")  # a static member away a while
    beat(server, "g", three.id, -1)  # a member leaves: its partitions move
    for _ in range(3):  # one takes what it may (the static two keeps its own, away)
        one.heartbeat()
    mid_way = Member(server, "h", ["b"])  # a second group, left reconciling
    Member(server, "h", ["b"])
    mid_way.heartbeat()
    with broker.engine.connect() as conn:
        live = live_consumer_groups(conn)
        assert compute_consumer_groups(conn) == live
    assert [r[0] for r in live["consumer_groups"]] == ["g", "h"]
    held = [r[:2] for r in live["consumer_group_members"]]
    assert ("g", one.id) in held and ("g", two.id) in held
    assert len(held) == 4  # g: one and the static two, away; h: two members

    with broker.engine.begin() as conn:
        conn.execute(text("DELETE FROM consumer_group_members"))
        conn.execute(text("UPDATE consumer_groups SET generation_id = 0, assignment_epoch = 0, "
                          "state = 'Empty', subscription_metadata = NULL"))  # fmt: skip
    done = run_kip98("db", "rebuild")
    assert done.returncode == 0, done.stderr
    assert f"consumer_group_members: {len(held)}" in done.stdout
    with broker.engine.connect() as conn:
        assert live_consumer_groups(conn) == live
    # The group continues from the rebuilt projection.
    one.heartbeat()
    assert one.epoch == live["consumer_groups"][0][1]


def test_a_group_upgraded_from_classic_is_rebuilt_with_its_classic_member(
    server: str, broker: Broker
) -> None:
    """KIP-848's online upgrade: the conversion's one event carries each classic member's
    record, so the consumer group it became rebuilds with them."""
    from tests.conformance.harness import Target
    from tests.conformance.requests import join_group

    classic, _ = join_group(Target("kip98", server), "up", "a")
    joined = Member(server, "up", ["a"])
    joined.heartbeat()
    with broker.engine.connect() as conn:
        live = live_consumer_groups(conn)
        assert compute_consumer_groups(conn) == live
    members = [r for r in live["consumer_group_members"] if r[0] == "up"]
    assert sorted(r[1] for r in members) == sorted([classic, joined.id])
    assert [r[-1] is not None for r in members if r[1] == classic] == [True]  # classic_member
    with broker.engine.begin() as conn:
        conn.execute(text("DELETE FROM consumer_group_members"))
    done = run_kip98("db", "rebuild")
    assert done.returncode == 0, done.stderr
    with broker.engine.connect() as conn:
        assert live_consumer_groups(conn) == live
