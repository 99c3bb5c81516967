"""Kafka's classic group protocol in the group coordinator, against a real PostgreSQL:
the join phase, the leader's assignment handed back as opaque bytes per generation, the
choice of protocol and leader, the rebalance timeout, and the refusals of members that
cannot share a group."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.broker import Broker
from app.clock import ManualClock
from app.errors import KafkaError
from app.groups.classic import choose_leader, choose_protocol, shares_protocol
from app.protocol import (
    DescribeGroupsRequest,
    GroupProtocol,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    ListGroupsRequest,
    MemberAssignment,
    OffsetAndMetadata,
    OffsetCommitRequest,
    SyncGroupRequest,
)
from app.settings import BrokerSettings

RANGE = GroupProtocol("range", b"range-meta")
ROUNDROBIN = GroupProtocol("roundrobin", b"rr-meta")


pytestmark = pytest.mark.broker(topics={"in": 4}, manual_clock=True)


def join(
    broker: Broker,
    member: str = "",
    protocols: tuple[GroupProtocol, ...] = (RANGE, ROUNDROBIN),
    protocol_type: str | None = "consumer",
    rebalance_timeout_ms: int = 60_000,
    instance: str | None = None,
) -> JoinGroupResponse:
    return broker.handle(
        JoinGroupRequest(
            "g", member, [], 10_000, group_instance_id=instance, protocol_type=protocol_type,
            protocols=protocols, rebalance_timeout_ms=rebalance_timeout_ms,
        )
    )  # fmt: skip


def plan(**parts: bytes) -> dict[str, MemberAssignment]:
    return {m: MemberAssignment(b) for m, b in parts.items()}


def test_the_leader_assigns_and_every_member_gets_its_bytes(broker: Broker) -> None:
    a = join(broker)
    assert (a.error_code, a.rebalancing, a.leader_id) == (0, False, a.member_id)
    assert a.protocol_name == "range"
    assert [(m.member_id, m.metadata) for m in a.members] == [(a.member_id, b"range-meta")]
    leader_sync = broker.handle(
        SyncGroupRequest("g", a.member_id, a.generation_id, plan(**{a.member_id: b"all"}))
    )
    assert (leader_sync.error_code, leader_sync.member_assignment) == (0, b"all")

    b = join(broker)
    # a has not rejoined: b waits, and a learns of the rebalance from its heartbeat.
    assert b.rebalancing and b.generation_id == a.generation_id + 1
    assert (
        broker.handle(HeartbeatRequest("g", a.member_id, a.generation_id)).error_code
        == KafkaError.REBALANCE_IN_PROGRESS
    )
    a2 = join(broker, a.member_id)
    assert not a2.rebalancing and a2.leader_id == a.member_id  # the leader stays
    assert sorted(m.member_id for m in a2.members) == sorted([a.member_id, b.member_id])
    b2 = join(broker, b.member_id)  # b looks again: the join phase is over
    assert not b2.rebalancing and b2.members == [] and b2.generation_id == a2.generation_id
    gen = a2.generation_id
    # Waiting for the leader: the follower's sync is not answered yet, heartbeats pass.
    assert broker.handle(SyncGroupRequest("g", b.member_id, gen)).awaiting_leader
    assert broker.handle(HeartbeatRequest("g", b.member_id, gen)).error_code == 0
    # Commits wait for the assignment, as Kafka refuses them while CompletingRebalance.
    offsets = {("in", 0): OffsetAndMetadata(1)}
    commit = broker.handle(OffsetCommitRequest("g", offsets, gen, b.member_id))
    assert commit.results[("in", 0)] == KafkaError.REBALANCE_IN_PROGRESS
    # A follower's plan is not read; the leader's is.
    follower_plan = plan(**{b.member_id: b"mine"})
    assert broker.handle(SyncGroupRequest("g", b.member_id, gen, follower_plan)).awaiting_leader
    leader_plan = plan(**{a.member_id: b"A", b.member_id: b"B"})
    assert (
        broker.handle(SyncGroupRequest("g", a.member_id, gen, leader_plan)).member_assignment
        == b"A"
    )
    follower = broker.handle(SyncGroupRequest("g", b.member_id, gen))
    assert (follower.error_code, follower.member_assignment) == (0, b"B")
    assert (follower.protocol_type, follower.protocol_name) == ("consumer", "range")
    commit = broker.handle(OffsetCommitRequest("g", offsets, gen, b.member_id))
    assert commit.results[("in", 0)] == 0
    stale = broker.handle(SyncGroupRequest("g", b.member_id, gen - 1))
    assert stale.error_code == KafkaError.ILLEGAL_GENERATION


def test_a_rejoin_without_change_keeps_the_generation_and_a_leader_rejoin_reassigns(
    broker: Broker,
) -> None:
    a = join(broker)
    b = join(broker)
    a = join(broker, a.member_id)
    gen = a.generation_id
    broker.handle(SyncGroupRequest("g", a.member_id, gen, plan()))
    # A follower's response was lost: it joins again, unchanged, and stays in the generation.
    again = join(broker, b.member_id)
    assert (again.generation_id, again.rebalancing) == (gen, False)
    # The leader rejoins (say, partitions were added): a new generation for everyone.
    assert join(broker, a.member_id).generation_id == gen + 1


def test_members_that_share_no_protocol_or_kind_cannot_join(broker: Broker) -> None:
    join(broker, protocols=(RANGE,))
    refused = join(broker, protocols=(GroupProtocol("sticky", b""),))
    assert refused.error_code == KafkaError.INCONSISTENT_GROUP_PROTOCOL
    other_type = join(broker, protocols=(RANGE,), protocol_type="connect")
    assert other_type.error_code == KafkaError.INCONSISTENT_GROUP_PROTOCOL
    native = broker.handle(JoinGroupRequest("g", "", ["in"], 10_000))
    assert native.error_code == KafkaError.INCONSISTENT_GROUP_PROTOCOL
    assert join(broker, protocols=()).error_code == KafkaError.INCONSISTENT_GROUP_PROTOCOL
    described = broker.handle(DescribeGroupsRequest(("g",))).groups[0]
    assert len(described.members) == 1  # no refused join left a member behind


def test_the_protocol_most_members_prefer_is_chosen(broker: Broker) -> None:
    a = join(broker, protocols=(RANGE, ROUNDROBIN))
    b = join(broker, protocols=(ROUNDROBIN, RANGE))
    c = join(broker, protocols=(ROUNDROBIN, RANGE))
    for m in (a, b, c):
        last = join(
            broker, m.member_id, protocols=(RANGE, ROUNDROBIN) if m is a else (ROUNDROBIN, RANGE)
        )
    assert last.protocol_name == "roundrobin"
    leader = join(broker, a.member_id, protocols=(RANGE, ROUNDROBIN))
    assert {m.metadata for m in leader.members} == {b"rr-meta"}


def test_a_member_that_does_not_rejoin_within_the_rebalance_timeout_is_removed(
    broker: Broker, clock: ManualClock
) -> None:
    a = join(broker, rebalance_timeout_ms=5_000)
    broker.handle(SyncGroupRequest("g", a.member_id, a.generation_id, plan()))
    b = join(broker)
    assert b.rebalancing
    clock.advance(3_000)
    # a keeps heartbeating but never rejoins (its application stopped polling).
    assert broker.handle(HeartbeatRequest("g", a.member_id, a.generation_id)).error_code == (
        KafkaError.REBALANCE_IN_PROGRESS
    )
    assert join(broker, b.member_id).rebalancing
    clock.advance(3_000)
    done = join(broker, b.member_id)
    assert not done.rebalancing and done.leader_id == b.member_id
    assert [m.member_id for m in done.members] == [b.member_id]


def _required(broker: Broker, session_timeout_ms: int = 10_000) -> str:
    """KIP-394: a JoinGroup v4+ without a member id is handed one, and is no member yet."""
    r = broker.handle(
        JoinGroupRequest(
            "g", "", [], session_timeout_ms, protocol_type="consumer", protocols=(RANGE,),
            rebalance_timeout_ms=60_000, require_known_member_id=True,
        )
    )  # fmt: skip
    assert (r.error_code, r.generation_id) == (KafkaError.MEMBER_ID_REQUIRED, -1)
    assert r.member_id
    return r.member_id


def test_a_member_id_is_required_and_the_pending_member_joins_with_it(broker: Broker) -> None:
    pending = _required(broker)
    described = broker.handle(DescribeGroupsRequest(("g",))).groups[0]
    assert (described.state, described.members) == ("Empty", [])
    a = join(broker, pending)
    assert (a.error_code, a.member_id, a.leader_id, a.rebalancing) == (0, pending, pending, False)
    # A Stable group is not rebalanced by a member given its id, only by its join.
    broker.handle(SyncGroupRequest("g", a.member_id, a.generation_id, plan()))
    second = _required(broker)
    assert broker.handle(HeartbeatRequest("g", a.member_id, a.generation_id)).error_code == 0
    assert join(broker, second).rebalancing


def test_a_pending_member_holds_the_join_phase_until_its_session_times_out(
    broker: Broker, clock: ManualClock
) -> None:
    a = join(broker)
    broker.handle(SyncGroupRequest("g", a.member_id, a.generation_id, plan()))
    _required(broker, session_timeout_ms=3_000)  # given an id, never seen again
    # The leader rejoins (a rebalance): the join phase waits for the pending member too.
    assert join(broker, a.member_id).rebalancing
    clock.advance(2_000)
    assert join(broker, a.member_id).rebalancing
    clock.advance(2_000)
    done = join(broker, a.member_id)
    assert not done.rebalancing and [m.member_id for m in done.members] == [a.member_id]


def test_a_static_member_restarted_into_a_stable_group_keeps_its_place_and_assignment(
    broker: Broker,
) -> None:
    """KIP-345: a known group.instance.id joining with no member id takes its old
    member's place under a new id, in the same generation, and syncs its old assignment;
    only a restart that would change the group's protocol rebalances."""
    a = join(broker, instance="a")
    b = join(broker, instance="b")
    a = join(broker, a.member_id, instance="a")
    gen = a.generation_id
    leader_plan = plan(**{a.member_id: b"A", b.member_id: b"B"})
    broker.handle(SyncGroupRequest("g", a.member_id, gen, leader_plan))
    assert broker.handle(SyncGroupRequest("g", b.member_id, gen)).member_assignment == b"B"

    b2 = join(broker, instance="b")
    assert (b2.error_code, b2.generation_id, b2.rebalancing) == (0, gen, False)
    assert b2.member_id != b.member_id and (b2.leader_id, b2.members) == (a.member_id, [])
    assert broker.handle(SyncGroupRequest("g", b2.member_id, gen)).member_assignment == b"B"
    assert broker.handle(HeartbeatRequest("g", a.member_id, gen)).error_code == 0
    assert broker.handle(HeartbeatRequest("g", b.member_id, gen)).error_code == (
        KafkaError.UNKNOWN_MEMBER_ID
    )
    # The leader restarts: before JoinGroup v9 it is named a follower (its old id leads),
    # so it only syncs for its own assignment.
    a2 = join(broker, instance="a")
    assert (a2.generation_id, a2.leader_id, a2.members) == (gen, a.member_id, [])
    assert broker.handle(SyncGroupRequest("g", a2.member_id, gen)).member_assignment == b"A"
    # From v9 it leads, and is told to skip the assignment.
    a3 = broker.handle(
        JoinGroupRequest(
            "g", "", [], 10_000, group_instance_id="a", protocol_type="consumer",
            protocols=(RANGE, ROUNDROBIN), rebalance_timeout_ms=60_000,
            skip_assignment_supported=True,
        )
    )  # fmt: skip
    assert (a3.generation_id, a3.leader_id, a3.skip_assignment) == (gen, a3.member_id, True)
    assert sorted(m.member_id for m in a3.members) == sorted([a3.member_id, b2.member_id])
    assert broker.handle(SyncGroupRequest("g", a3.member_id, gen)).member_assignment == b"A"
    # A restart with protocols that change the group's choice rebalances.
    b3 = join(broker, protocols=(ROUNDROBIN,), instance="b")
    assert b3.rebalancing and b3.generation_id == gen + 1


def test_static_member_leaves_by_instance_id(broker: Broker) -> None:
    a = join(broker, instance="i-1")
    assert broker.handle(LeaveGroupRequest("g", "", "nope")).error_code == (
        KafkaError.UNKNOWN_MEMBER_ID
    )
    assert broker.handle(LeaveGroupRequest("g", "someone-else", "i-1")).error_code == (
        KafkaError.FENCED_INSTANCE_ID
    )
    assert broker.handle(LeaveGroupRequest("g", "", "i-1")).error_code == 0
    assert broker.handle(HeartbeatRequest("g", a.member_id, a.generation_id)).error_code == (
        KafkaError.UNKNOWN_MEMBER_ID
    )


def test_list_and_describe_groups(broker: Broker) -> None:
    a = join(broker)
    broker.handle(
        SyncGroupRequest(
            "g", a.member_id, a.generation_id,
            {a.member_id: MemberAssignment(b"bytes", (("in", 0), ("in", 1)))},
        )
    )  # fmt: skip
    broker.handle(JoinGroupRequest("native", "", ["in"], 10_000))
    listed = broker.handle(ListGroupsRequest()).groups
    assert [(g.group_id, g.protocol_type, g.state) for g in listed] == [
        ("g", "consumer", "Stable"), ("native", "consumer", "Stable"),
    ]  # fmt: skip
    assert [g.group_id for g in broker.handle(ListGroupsRequest(("Empty",))).groups] == []
    g, native, unknown = broker.handle(DescribeGroupsRequest(("g", "native", "nobody"))).groups
    assert (g.state, g.protocol_name) == ("Stable", "range")
    (member,) = g.members
    assert (member.metadata, member.assignment) == (b"range-meta", b"bytes")
    assert member.partitions == (("in", 0), ("in", 1))
    assert native.members[0].partitions == tuple(("in", p) for p in range(4))
    assert (unknown.state, unknown.members, unknown.error_code) == ("Dead", [], 0)


# ------------------------------------------------------------------ the rules, pure

names = st.lists(
    st.sampled_from(["range", "roundrobin", "sticky", "coop"]), min_size=1, unique=True
)


@given(st.lists(names, min_size=1, max_size=6))
def test_the_chosen_protocol_is_supported_by_everyone(preferences: list[list[str]]) -> None:
    if not shares_protocol(preferences[1:], preferences[0]):
        return
    chosen = choose_protocol(preferences)
    assert all(chosen in p for p in preferences)
    common = set.intersection(*(set(p) for p in preferences))
    firsts = [next(n for n in p if n in common) for p in preferences]
    assert firsts.count(chosen) == max(firsts.count(n) for n in common)


def test_leader_is_kept_while_a_member_else_the_first_to_join() -> None:
    assert choose_leader("b", ["a", "b"]) == "b"
    assert choose_leader("gone", ["a", "b"]) == "a"
    assert choose_leader(None, ["c"]) == "c"


@pytest.mark.parametrize("session_timeout_ms", [1_999, 5_001])
def test_a_session_timeout_outside_the_settings_bounds_is_refused_before_kip394(
    db_url: str, session_timeout_ms: int
) -> None:
    """``group_min/max_session_timeout_ms`` (Kafka's group.min/max.session.timeout.ms)
    bound a join's session timeout, checked before a member id is handed out."""
    bounded = Broker.connect(
        db_url,
        settings=BrokerSettings(
            group_min_session_timeout_ms=2_000, group_max_session_timeout_ms=5_000
        ),
    )
    r = bounded.handle(
        JoinGroupRequest(
            "g", "", [], session_timeout_ms, protocol_type="consumer", protocols=(RANGE,),
            rebalance_timeout_ms=60_000, require_known_member_id=True,
        )
    )  # fmt: skip
    assert (r.error_code, r.member_id) == (KafkaError.INVALID_SESSION_TIMEOUT, "")
    assert bounded.handle(DescribeGroupsRequest(("g",))).groups[0].state == "Dead"
    for ok in (2_000, 5_000):
        assert _required(bounded, session_timeout_ms=ok)


def test_a_heartbeat_from_another_generation_of_a_stable_group_is_illegal(broker: Broker) -> None:
    a = join(broker)
    broker.handle(SyncGroupRequest("g", a.member_id, a.generation_id, plan()))
    for generation in (a.generation_id + 1, a.generation_id - 1):
        hb = broker.handle(HeartbeatRequest("g", a.member_id, generation))
        assert hb.error_code == KafkaError.ILLEGAL_GENERATION
    assert broker.handle(HeartbeatRequest("g", a.member_id, a.generation_id)).error_code == 0


def test_a_group_that_only_holds_offsets_is_described_and_listed_empty(broker: Broker) -> None:
    offsets = {("in", 0): OffsetAndMetadata(3)}
    assert broker.handle(OffsetCommitRequest("held", offsets)).error_code == 0
    described = broker.handle(DescribeGroupsRequest(("held", "never"))).groups
    assert [(d.group_id, d.state, d.protocol_type) for d in described] == [
        ("held", "Empty", ""), ("never", "Dead", ""),
    ]  # fmt: skip
    listed = broker.handle(ListGroupsRequest()).groups
    assert [(g.group_id, g.protocol_type, g.state) for g in listed] == [("held", "", "Empty")]


def test_an_admin_commit_to_a_classic_group_with_members_is_refused(broker: Broker) -> None:
    a = join(broker)
    broker.handle(SyncGroupRequest("g", a.member_id, a.generation_id, plan()))
    offsets = {("in", 0): OffsetAndMetadata(3)}
    for gen, member, code in (
        (-1, "", KafkaError.UNKNOWN_MEMBER_ID),
        (-1, a.member_id, KafkaError.ILLEGAL_GENERATION),
        (a.generation_id, a.member_id, 0),
    ):
        assert broker.handle(OffsetCommitRequest("g", offsets, gen, member)).error_code == code
    broker.handle(LeaveGroupRequest("g", a.member_id))
    assert broker.handle(OffsetCommitRequest("g", offsets)).error_code == 0
