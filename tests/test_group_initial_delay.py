"""group.initial.rebalance.delay.ms (KIP-134): the first rebalance of an empty group waits
for more members, each new one extending the wait up to the rebalance timeout, so members
starting together share the first generation. The rules with a manual clock (the
coordinator's requests, native and classic); then librdkafka consumers against a real
``kip98 serve`` with Kafka's default delay."""

from __future__ import annotations

import time

import confluent_kafka as ck
import pytest

from app.broker import Broker
from app.clock import ManualClock
from app.groups.membership import (
    extended_join_deadline,
    heartbeat,
    initial_join_deadline,
    join_group,
    sync_group,
)
from app.log.topics import create_topic
from app.protocol import (
    DescribeGroupsRequest,
    GroupProtocol,
    HeartbeatRequest,
    JoinGroupRequest,
    SyncGroupRequest,
)
from tests.helpers.wire_client import serving

DELAY = 3_000


pytestmark = pytest.mark.broker(
    topics={"t": 4}, manual_clock=True, group_initial_rebalance_delay_ms=DELAY
)


def _join(broker: Broker, member: str = "", rebalance_ms: int = 10_000, classic: bool = False):
    protocols = (GroupProtocol("range", b"m"),) if classic else ()
    return join_group(
        broker,
        JoinGroupRequest("g", member, ["t"], 30_000, protocol_type="consumer" if classic else None,
                         protocols=protocols, rebalance_timeout_ms=rebalance_ms),
    )  # fmt: skip


def _state(broker: Broker) -> tuple[str, int]:
    [g] = broker.handle(DescribeGroupsRequest(("g",))).groups
    return g.state, len(g.members)


def test_the_wait_rules() -> None:
    assert initial_join_deadline(1_000, 3_000) == 4_000
    assert initial_join_deadline(1_000, 0) is None
    # A member at 3500 of a wait begun at 1000, due at 4000: 3000 more, from now.
    assert extended_join_deadline(4_000, 1_000, 3_500, 3_000, 10_000) == 6_500
    # Never past the rebalance timeout from the start, nor sooner than it was.
    assert extended_join_deadline(4_000, 1_000, 9_000, 3_000, 10_000) == 11_000
    assert extended_join_deadline(6_500, 1_000, 2_000, 3_000, 10_000) == 6_500
    assert extended_join_deadline(4_000, 1_000, 2_000, 3_000, 1_000) == 4_000


def test_members_starting_together_share_the_first_generation(
    broker: Broker, clock: ManualClock
) -> None:
    """Native members: the first join of an empty group is held (PreparingRebalance, no
    assignment) until the delay is over; a second member within it joins the same
    generation; whoever asks after the delay (a sync, a heartbeat) ends the join phase."""
    a = _join(broker)
    assert a.rebalancing and a.generation_id == 1
    clock.advance(2_000)
    b = _join(broker)
    assert b.rebalancing and b.generation_id == 1
    sync = sync_group(broker, SyncGroupRequest("g", a.member_id, 1))
    assert sync.error_code != 0 and _state(broker) == ("PreparingRebalance", 2)
    clock.advance(2_999)  # b extended the wait to 2000 + 3000
    assert sync_group(broker, SyncGroupRequest("g", a.member_id, 1)).error_code != 0
    clock.advance(1)
    assigned = [sync_group(broker, SyncGroupRequest("g", m, 1)) for m in (a.member_id, b.member_id)]
    assert [s.error_code for s in assigned] == [0, 0]
    assert sorted(tp for s in assigned for tp in s.assignment) == [("t", p) for p in range(4)]
    assert _state(broker) == ("Stable", 2)

    # Not empty any more: a third member rebalances at once, without a delay.
    c = _join(broker)
    for m in (a.member_id, b.member_id):
        assert heartbeat(broker, HeartbeatRequest("g", m, 1)).error_code != 0
        assert _join(broker, m).generation_id == 2
    assert not _join(broker, c.member_id).rebalancing


def test_the_wait_ends_by_the_rebalance_timeout(broker: Broker, clock: ManualClock) -> None:
    """A stream of new members extends the wait, but never past the rebalance timeout from
    its start (5000 here): four members 1500 apart form the first generation at 5000, a
    classic group then going on to its leader's plan; one coming later starts the next
    generation at once (the group is not empty: no delay)."""
    members = [_join(broker, rebalance_ms=5_000, classic=True).member_id]
    for _ in range(3):
        clock.advance(1_500)
        members.append(_join(broker, rebalance_ms=5_000, classic=True).member_id)
    clock.advance(499)  # 4999: the last member asked for 7500, the bound is 5000
    assert _join(broker, members[0], rebalance_ms=5_000, classic=True).rebalancing
    clock.advance(1)
    formed = _join(broker, members[0], rebalance_ms=5_000, classic=True)
    assert not formed.rebalancing and formed.generation_id == 1
    assert formed.leader_id == members[0] and len(formed.members) == 4
    clock.advance(1_000)
    late = _join(broker, rebalance_ms=5_000, classic=True)
    assert late.rebalancing and late.generation_id == 2
    for m in members:
        _join(broker, m, rebalance_ms=5_000, classic=True)
    assert not _join(broker, late.member_id, rebalance_ms=5_000, classic=True).rebalancing


def test_librdkafka_consumers_starting_together_share_the_first_generation(
    db_url: str,
) -> None:
    """Kafka's default delay (3 s, here 20 s so a slow machine still starts the second
    consumer within it): a consumer subscribes and is held; a second one subscribes; both
    get their partitions in the first generation, with no revocation."""
    create_topic(Broker.connect(db_url), "t", 4)
    env = {"KIP98_GROUP_INITIAL_REBALANCE_DELAY_MS": "20000"}
    with serving(db_url, env=env) as server:
        broker = Broker.connect(db_url)
        events: list[tuple[int, str, int]] = []

        def listener(i: int):
            return {
                "on_assign": lambda c, ps: events.append((i, "assign", len(ps))),
                "on_revoke": lambda c, ps: events.append((i, "revoke", len(ps))),
            }

        config = {"bootstrap.servers": server, "group.id": "g", "session.timeout.ms": 30_000}
        consumers = [ck.Consumer(config), ck.Consumer(config)]
        try:
            consumers[0].subscribe(["t"], **listener(0))
            deadline = time.monotonic() + 60
            while _state(broker) != ("PreparingRebalance", 1):  # held, waiting for more
                assert time.monotonic() < deadline, "the first member's join never came"
                consumers[0].poll(0.1)
            consumers[1].subscribe(["t"], **listener(1))
            while sum(1 for e in events if e[1] == "assign") < 2:
                assert time.monotonic() < deadline + 60, "no assignment"
                for c in consumers:
                    c.poll(0.1)
            before_closing = list(events)
        finally:
            for c in consumers:
                c.close()
    assert sorted((i, n) for i, kind, n in before_closing if kind == "assign") == [(0, 2), (1, 2)]
    assert [e for e in before_closing if e[1] == "revoke"] == [], "a rebalance revoked"
