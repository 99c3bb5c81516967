"""Classic group rules checked as Kafka checks them, against both brokers: the session
timeout a join may ask for, a heartbeat from another generation of a settled group, a
group that only holds offsets, and an admin's commit to a group with members
(docs/design.md rule 26)."""

from __future__ import annotations

from dataclasses import replace

from tests.conformance.group_calls import (
    commit,
    describe,
    fetch_offsets,
    heartbeat,
    join_once,
    joined,
    leave,
    listed,
    sync,
)
from tests.conformance.harness import Observation, Target, same
from tests.conformance.raw_calls import LIST_GROUPS, call, error


def scenario_a_session_timeout_out_of_bounds_is_refused(target: Target) -> Observation:
    """JoinGroup v3 and v9 asking for 1 ms, 5999 ms, 1800001 ms or 3600000 ms is
    INVALID_SESSION_TIMEOUT (Kafka's bounds 6000..1800000), before KIP-394's member-id
    step; 6000 ms is accepted."""
    seen = []
    for version in (3, 9):
        for ms in (1, 5_999, 1_800_001, 3_600_000, 6_000):
            group = target.name_for("grp-session")
            answer = join_once(target, group, session_ms=ms, version=version)
            seen.append([version, ms, error(answer.error_code), answer.member_id == ""])
    return seen


def test_a_session_timeout_out_of_bounds_is_refused(targets: tuple[Target, Target]) -> None:
    same(scenario_a_session_timeout_out_of_bounds_is_refused, *targets)


def scenario_a_heartbeat_from_another_generation_is_illegal(target: Target) -> Observation:
    """One member, synced, Stable: a heartbeat naming the next generation or the one
    before is ILLEGAL_GENERATION; its own is NONE."""
    topic = target.create_topic("grp-hb")
    group = target.name_for("grp-hb")
    member = joined(target, group, topics=(topic,))
    assert error(sync(target, member, {member.member_id: b""}).error_code) == "NONE"
    return [
        heartbeat(target, replace(member, generation=member.generation + 1)),
        heartbeat(target, replace(member, generation=member.generation - 1)),
        heartbeat(target, member),
    ]


def test_a_heartbeat_from_another_generation_is_illegal(targets: tuple[Target, Target]) -> None:
    same(scenario_a_heartbeat_from_another_generation_is_illegal, *targets)


def scenario_a_group_that_only_holds_offsets_is_empty(target: Target) -> Observation:
    """Offsets committed with generation -1 and no member (a consumer that only commits):
    DescribeGroups says Empty with no protocol type, ListGroups lists it Empty, with or
    without a states filter, and under v2 (no state)."""
    topic = target.create_topic("grp-offsets")
    group = target.name_for("grp-offsets")
    assert commit(target, group, {(topic, 0): 3}) == {(topic, 0): "NONE"}
    d = describe(target, group)
    v2 = [
        (g.protocol_type,) for g in call(target, LIST_GROUPS, 2, {}).groups if g.group_id == group
    ]
    v4 = [
        (g.protocol_type, g.group_state)
        for g in call(target, LIST_GROUPS, 4, {"states_filter": []}).groups
        if g.group_id == group
    ]
    return {
        "described": [error(d.error_code), d.group_state, d.protocol_type, d.protocol_data,
                      len(d.members)],
        "listed_v2": v2,
        "listed_v4": v4,
        "empty": listed(target, "Empty").get(group),
        "stable": listed(target, "Stable").get(group),
    }  # fmt: skip


def test_a_group_that_only_holds_offsets_is_empty(targets: tuple[Target, Target]) -> None:
    same(scenario_a_group_that_only_holds_offsets_is_empty, *targets)


def scenario_an_admin_commit_to_a_group_with_members(target: Target) -> Observation:
    """A Stable group of one member: an OffsetCommit of generation -1 without a member
    (Admin.alterConsumerGroupOffsets) is UNKNOWN_MEMBER_ID, with the member's id but
    generation -1 ILLEGAL_GENERATION, with the generation but no member UNKNOWN_MEMBER_ID;
    nothing is committed. Once the member leaves (Empty), the admin's commit is taken."""
    topic = target.create_topic("grp-admin")
    group = target.name_for("grp-admin")
    member = joined(target, group, topics=(topic,))
    assert error(sync(target, member, {member.member_id: b""}).error_code) == "NONE"
    tp = (topic, 0)
    seen = [
        commit(target, group, {tp: 1})[tp],
        commit(target, group, {tp: 1}, member_id=member.member_id)[tp],
        commit(target, group, {tp: 1}, generation=member.generation)[tp],
        list(fetch_offsets(target, group, None)["offsets"].values()),
        commit(target, group, {tp: 2}, member_id=member.member_id,
               generation=member.generation)[tp],
    ]  # fmt: skip
    left = leave(target, group, (member.member_id, None))
    seen.append(error(left.error_code))
    seen.append(commit(target, group, {tp: 5})[tp])
    seen.append(list(fetch_offsets(target, group, [tp])["offsets"].values()))
    return seen


def test_an_admin_commit_to_a_group_with_members(targets: tuple[Target, Target]) -> None:
    same(scenario_an_admin_commit_to_a_group_with_members, *targets)
