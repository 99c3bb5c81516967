"""Consumer groups on both brokers: the classic protocol spoken raw (join, sync,
heartbeat, a rebalance, static members, leaving), offsets committed, fetched and deleted,
groups described, listed and deleted, and librdkafka consumers sharing a topic.

Member ids and generations are the brokers' own: a scenario observes them as relations
(the leader is this member, the generation moved by one), never as values."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import confluent_kafka as ck

from tests.conformance.group_calls import (
    Member,
    assignment,
    commit,
    delete_groups,
    delete_offsets,
    describe,
    fetch_offsets,
    heartbeat,
    join,
    join_once,
    joined,
    leave,
    listed,
    subscription,
    sync,
)
from tests.conformance.harness import Observation, Target, same, wait_until
from tests.conformance.normalise import stems
from tests.conformance.raw_calls import batch, error, produce


def _stable(target: Target, group: str, *topics: str) -> Member:
    """A group of one member that joined and synced (it assigns itself nothing)."""
    member = joined(target, group, topics=topics)
    answer = sync(target, member, {member.member_id: b""})
    assert error(answer.error_code) == "NONE", answer
    return member


def scenario_one_member_joins_syncs_heartbeats_and_leaves(target: Target) -> Observation:
    topic = target.create_topic("grp-one")
    group = target.name_for("grp-one")
    first = join(target, group, topics=(topic,))
    member = Member(group, first.member_id, first.generation_id, first.leader)
    plan = assignment(topic, 0)
    synced = sync(target, member, {member.member_id: plan})
    beat = heartbeat(target, member)
    described = describe(target, group)
    stable_listed = listed(target, "Stable").get(group)
    left = leave(target, group, (member.member_id, None))
    after = describe(target, group)
    return stems({
        "join": {"error": error(first.error_code), "generation": first.generation_id,
                 "leader_is_member": first.leader == first.member_id,
                 "protocol": [first.protocol_type, first.protocol_name],
                 "members": [[m.member_id == first.member_id, m.metadata == subscription(topic)]
                             for m in first.members]},
        "sync": [error(synced.error_code), synced.protocol_type, synced.protocol_name,
                 synced.assignment == plan],
        "heartbeat": beat,
        "described": [error(described.error_code), described.group_state,
                      described.protocol_type, described.protocol_data,
                      [[m.member_id == member.member_id, m.member_assignment == plan]
                       for m in described.members]],
        "listed_stable": stable_listed,
        "leave": [error(left.error_code), [error(m.error_code) for m in left.members]],
        "after_leave": [after.group_state, len(after.members), listed(target).get(group)],
        "heartbeat_after_leave": heartbeat(target, member),
    })  # fmt: skip


def test_one_member_joins_syncs_heartbeats_and_leaves(targets: Any) -> None:
    same(scenario_one_member_joins_syncs_heartbeats_and_leaves, *targets)


def scenario_a_join_without_a_member_id(target: Target) -> Observation:
    """KIP-394: a JoinGroup v4+ naming no member is answered MEMBER_ID_REQUIRED with the
    id to join with, and is no member until it does; before v4 it joins at once; a static
    member (an instance id) is never asked."""
    group = target.name_for("grp-id")
    first = join_once(target, group)
    pending = describe(target, group)
    second = join_once(target, group, first.member_id)
    old = join_once(target, target.name_for("grp-v3"), version=3)
    static = join_once(target, target.name_for("grp-static"), instance="i-1")
    return {
        "first": [error(first.error_code), bool(first.member_id), first.generation_id,
                  len(first.members)],
        "pending_members": len(pending.members),
        "second": [error(second.error_code), second.member_id == first.member_id,
                   second.leader == first.member_id, second.generation_id],
        "v3": [error(old.error_code), bool(old.member_id), old.leader == old.member_id],
        "static": [error(static.error_code), bool(static.member_id)],
    }  # fmt: skip


def test_a_join_without_a_member_id(targets: Any) -> None:
    same(scenario_a_join_without_a_member_id, *targets)


def scenario_a_second_member_rebalances_the_group(target: Target) -> Observation:
    """A second member's join holds until the first rejoins (its heartbeat answered
    REBALANCE_IN_PROGRESS); both are answered in the next generation, the first still
    leader; a follower's sync waits for the leader's plan."""
    topic = target.create_topic("grp-two", partitions=2)
    group = target.name_for("grp-two")
    one = _stable(target, group, topic)
    with ThreadPoolExecutor(2) as pool:
        second: Future[Any] = pool.submit(join, target, group, topics=(topic,))
        told = wait_until(
            lambda: (b := heartbeat(target, one)) != "NONE" and b, "a rebalance heartbeat"
        )
        rejoined = join(target, group, one.member_id, topics=(topic,))
        other = second.result(60)
        two = Member(group, other.member_id, other.generation_id, other.leader)
        first = Member(group, one.member_id, rejoined.generation_id, rejoined.leader)
        plan = {one.member_id: assignment(topic, 0), two.member_id: assignment(topic, 1)}
        follower: Future[Any] = pool.submit(sync, target, two)
        leader_sync = sync(target, first, plan)
        follower_sync = follower.result(60)
    described = describe(target, group)
    return {
        "heartbeat_during_rebalance": told,
        "leader": [error(rejoined.error_code), rejoined.generation_id - one.generation,
                   rejoined.leader == one.member_id, len(rejoined.members)],
        "follower": [error(other.error_code), other.generation_id - one.generation,
                     other.leader == one.member_id, len(other.members)],
        "syncs": [[error(s.error_code), s.assignment == plan[m.member_id]]
                  for s, m in ((leader_sync, first), (follower_sync, two))],
        "heartbeats": [heartbeat(target, first), heartbeat(target, two)],
        "described": [described.group_state, len(described.members)],
    }  # fmt: skip


def test_a_second_member_rebalances_the_group(targets: Any) -> None:
    same(scenario_a_second_member_rebalances_the_group, *targets)


def scenario_a_member_or_generation_the_group_does_not_have(target: Target) -> Observation:
    group = target.name_for("grp-stale")
    member = _stable(target, group)
    stranger = Member(group, "no-such-member", member.generation, member.leader)
    stale = Member(group, member.member_id, member.generation + 5, member.leader)
    nowhere = Member(target.name_for("grp-none"), "no-such-member", 1, "")
    return {
        "heartbeat": {"unknown_member": heartbeat(target, stranger),
                      "unknown_group": heartbeat(target, nowhere)},
        "sync": {"unknown_member": error(sync(target, stranger).error_code),
                 "wrong_generation": error(sync(target, stale).error_code)},
        "still": heartbeat(target, member),
    }  # fmt: skip


def test_a_member_or_generation_the_group_does_not_have(targets: Any) -> None:
    same(scenario_a_member_or_generation_the_group_does_not_have, *targets)


def scenario_joins_that_are_refused(target: Target) -> Observation:
    """A group id that is empty, a protocol type other than the group's, and no
    protocols at all."""
    group = target.name_for("grp-bad")
    _stable(target, group)
    return {
        "empty_group_id": error(join_once(target, "").error_code),
        "other_protocol_type": error(join(target, group, protocol_type="connect").error_code),
        "no_protocols": error(join_once(target, target.name_for("g"),
                                        protocols=[]).error_code),
    }  # fmt: skip


def test_joins_that_are_refused(targets: Any) -> None:
    same(scenario_joins_that_are_refused, *targets)


def scenario_offsets_committed_and_fetched(target: Target) -> Observation:
    """A group with no members takes commits from anyone (generation -1): offsets,
    metadata and the leader epoch (KIP-320) come back as committed; a partition never
    committed is -1; a group there is not has no offsets and no error."""
    topic = target.create_topic("grp-offsets", partitions=3)
    group = target.name_for("grp-offsets")
    codes = commit(target, group, {(topic, 0): 5, (topic, 1): 0}, leader_epoch=0,
                   metadata="meta")  # fmt: skip
    plain = commit(target, group, {(topic, 2): 7}, metadata=None)
    again = commit(target, group, {(topic, 0): 3}, leader_epoch=-1, metadata="")
    return stems({
        "commits": [sorted(codes.values()), sorted(plain.values()), sorted(again.values())],
        "asked": fetch_offsets(target, group, [(topic, 0), (topic, 1), (topic, 2), (topic, 3)]),
        "all": fetch_offsets(target, group, None),
        "unknown_group": fetch_offsets(target, target.name_for("nobody"), [(topic, 0)]),
    })  # fmt: skip


def test_offsets_committed_and_fetched(targets: Any) -> None:
    same(scenario_offsets_committed_and_fetched, *targets)


def scenario_commits_a_group_refuses(target: Target) -> Observation:
    """A group with a member in generation N: a commit from generation N is taken; from
    an older one ILLEGAL_GENERATION, from a member it does not have UNKNOWN_MEMBER_ID; and
    a commit for a topic there is not."""
    topic = target.create_topic("grp-gen")
    group = target.name_for("grp-gen")
    member = _stable(target, group, topic)
    tp = {(topic, 0): 4}
    return stems({
        "current": list(commit(target, group, tp, member_id=member.member_id,
                               generation=member.generation).values()),
        "stale": list(commit(target, group, tp, member_id=member.member_id,
                             generation=member.generation - 1).values()),
        "unknown_member": list(commit(target, group, tp, member_id="no-such-member",
                                      generation=member.generation).values()),
        "unknown_topic": list(commit(target, target.name_for("g"),
                                     {(target.name_for("never-made"), 0): 1}).values()),
        "fetched": fetch_offsets(target, group, [(topic, 0)]),
    })  # fmt: skip


def test_commits_a_group_refuses(targets: Any) -> None:
    same(scenario_commits_a_group_refuses, *targets)


def scenario_offset_delete(target: Target) -> Observation:
    """OffsetDelete: a topic a member subscribes to is GROUP_SUBSCRIBED_TO_TOPIC, one it
    does not is deleted; once the group is empty its offsets go too; a group there is not
    is GROUP_ID_NOT_FOUND."""
    subscribed = target.create_topic("grp-sub")
    other = target.create_topic("grp-other")
    group = target.name_for("grp-del")
    member = _stable(target, group, subscribed)
    gen = {"member_id": member.member_id, "generation": member.generation}
    assert set(commit(target, group, {(subscribed, 0): 2, (other, 0): 3}, **gen).values()) == {
        "NONE"
    }
    while_subscribed = delete_offsets(target, group, [(subscribed, 0), (other, 0)])
    kept = fetch_offsets(target, group, [(subscribed, 0), (other, 0)])
    leave(target, group, (member.member_id, None))
    once_empty = delete_offsets(target, group, [(subscribed, 0)])
    return stems({
        "while_subscribed": while_subscribed, "kept": kept, "once_empty": once_empty,
        "after": fetch_offsets(target, group, [(subscribed, 0), (other, 0)]),
        "unknown_group": delete_offsets(target, target.name_for("nobody"), [(other, 0)]),
    })  # fmt: skip


def test_offset_delete(targets: Any) -> None:
    same(scenario_offset_delete, *targets)


def scenario_delete_groups(target: Target) -> Observation:
    """DeleteGroups: a group with members is NON_EMPTY_GROUP, one there is not
    GROUP_ID_NOT_FOUND, an empty one with offsets is deleted with its offsets."""
    topic = target.create_topic("grp-gone")
    busy = target.name_for("grp-busy")
    _stable(target, busy)
    empty = target.name_for("grp-empty")
    commit(target, empty, {(topic, 0): 9})
    nobody = target.name_for("grp-nobody")
    answers = delete_groups(target, busy, empty, nobody)
    return stems({
        "answers": answers,
        "empty_after": [describe(target, empty).group_state,
                        fetch_offsets(target, empty, [(topic, 0)])],
        "busy_after": describe(target, busy).group_state,
        "again": delete_groups(target, empty),
    })  # fmt: skip


def test_delete_groups(targets: Any) -> None:
    same(scenario_delete_groups, *targets)


def scenario_groups_described_and_listed(target: Target) -> Observation:
    """DescribeGroups and ListGroups: a group there is not, one whose member left, one
    with a member; the states filter."""
    topic = target.create_topic("grp-list")
    stable = target.name_for("grp-stable")
    _stable(target, stable, topic)
    empty = target.name_for("grp-empty")
    left = _stable(target, empty, topic)
    leave(target, empty, (left.member_id, None))
    unknown = target.name_for("grp-unknown")

    def seen(d: Any) -> list[Any]:
        return [error(d.error_code), d.group_state, d.protocol_type, d.protocol_data,
                len(d.members)]  # fmt: skip

    def states(*asked: str) -> dict[str, str]:
        found = listed(target, *asked)
        return {g: found[g] for g in (stable, empty, unknown) if g in found}

    return stems({
        "described": [seen(describe(target, g)) for g in (stable, empty, unknown)],
        "listed": states(), "stable": states("Stable"), "empty": states("Empty"),
        "both": states("Empty", "Stable"),
    })  # fmt: skip


def test_groups_described_and_listed(targets: Any) -> None:
    same(scenario_groups_described_and_listed, *targets)


def scenario_leave_group_by_member_and_instance(target: Target) -> Observation:
    """LeaveGroup v3+ (KIP-345): several members at once, each answered; a static one by
    its instance id; a member the group does not have is UNKNOWN_MEMBER_ID."""
    group = target.name_for("grp-leave")
    static = joined(target, group, instance="i-1")
    assert error(sync(target, static, {static.member_id: b""}).error_code) == "NONE"
    answer = leave(target, group, ("", "i-1"), ("no-such-member", None))
    unknown_instance = leave(target, group, ("", "i-2"))
    return {
        "answer": [error(answer.error_code),
                   [[m.group_instance_id, error(m.error_code)] for m in answer.members]],
        "unknown_instance": [error(unknown_instance.error_code),
                             [error(m.error_code) for m in unknown_instance.members]],
        "after": [describe(target, group).group_state, heartbeat(target, static)],
    }  # fmt: skip


def test_leave_group_by_member_and_instance(targets: Any) -> None:
    same(scenario_leave_group_by_member_and_instance, *targets)


def _consumer(target: Target, group: str, name: str) -> Any:
    return ck.Consumer(target.config(**{
        "group.id": group, "client.id": name, "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 300, "partition.assignment.strategy": "range",
    }))  # fmt: skip


def scenario_two_librdkafka_consumers_share_a_topic(target: Target) -> Observation:
    """confluent-kafka consumers of one group (classic protocol, range): the first reads
    all four partitions and commits; a second joins and they split the partitions two
    and two; records written after are each read once, from the committed offsets; the
    commits come back through committed()."""
    topic = target.create_topic("grp-share", partitions=4)

    def write(round_: int) -> None:
        for p in range(4):
            produce(target, topic, p, batch([f"{round_}-{p}".encode()]))

    group = target.name_for("grp-share")
    assigned: dict[str, list[int]] = {}
    members: dict[str, Any] = {}

    def noting(name: str) -> Any:
        def on_assign(_: Any, partitions: list[ck.TopicPartition]) -> None:
            assigned[name] = sorted(p.partition for p in partitions)

        return on_assign

    def read(want: int, done: Any = lambda: True) -> list[str]:
        seen: list[str] = []
        deadline = time.monotonic() + 90  # a hang guard
        while (len(seen) < want or not done()) and time.monotonic() < deadline:
            for c in members.values():
                msg = c.poll(0.1)
                if msg is not None and msg.error() is None:
                    seen.append(msg.value().decode())
        return sorted(seen)

    try:
        write(1)
        members["one"] = _consumer(target, group, "one")
        members["one"].subscribe([topic], on_assign=noting("one"))
        first = read(4)
        alone = list(assigned["one"])
        members["one"].commit(asynchronous=False)
        members["two"] = _consumer(target, group, "two")
        members["two"].subscribe([topic], on_assign=noting("two"))
        read(0, lambda: sorted(map(len, assigned.values())) == [2, 2])
        write(2)
        second = read(4)
        for c in members.values():
            c.commit(asynchronous=False)
        committed = sorted(
            (tp.partition, tp.offset)
            for c in members.values()
            for tp in c.committed(c.assignment(), timeout=30)
        )
        admin = target.admin()
        described = admin.describe_consumer_groups([group])[group].result(30)
    finally:
        for c in members.values():
            c.close()
    return {
        "first": first, "alone": alone, "shared": sorted(assigned.values()), "second": second,
        "committed": committed,
        "described": [str(described.state).rsplit(".", 1)[-1], len(described.members),
                      described.partition_assignor],
    }  # fmt: skip


def test_two_librdkafka_consumers_share_a_topic(targets: Any) -> None:
    same(scenario_two_librdkafka_consumers_share_a_topic, *targets)
