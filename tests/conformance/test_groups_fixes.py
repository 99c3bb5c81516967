"""Group and offset answers kip98 once gave otherwise than Kafka, each against both brokers:
a static member's instance id checked by every request that carries it (KIP-345)."""

from __future__ import annotations

from typing import Any

from tests.conformance.group_calls import (
    Member,
    commit,
    describe,
    heartbeat,
    join,
    join_once,
    joined,
    sync,
)
from tests.conformance.harness import Observation, Target, same
from tests.conformance.normalise import error_name
from tests.conformance.raw_calls import error
from tests.conformance.requests import (
    RawTransaction,
    add_offsets,
    end_txn,
    txn_offset_commit,
)


def scenario_a_static_members_instance_id_is_checked(target: Target) -> Observation:
    """A static member ("instance-1") in a Stable group: TxnOffsetCommit and OffsetCommit
    naming an instance the group does not have, or the instance with another member id,
    are refused; once the instance restarts under a new member id, its old id is fenced
    in heartbeats, syncs and commits."""
    topic = target.create_topic("grp-static")
    group = target.name_for("grp-static")
    member = joined(target, group, topics=(topic,), instance="instance-1")
    assert error(sync(target, member, {member.member_id: b""}).error_code) == "NONE"
    gen, mid = member.generation, member.member_id

    txn = RawTransaction(target)
    assert error_name(add_offsets(target, txn.transactional_id, txn.producer_id, txn.epoch,
                                  group)) == "NONE"  # fmt: skip

    def txn_commit(member_id: str, instance: str | None) -> str:
        return error_name(txn_offset_commit(
            target, txn.transactional_id, txn.producer_id, txn.epoch, group, topic, 3,
            generation=gen, member_id=member_id, group_instance_id=instance,
        ))  # fmt: skip

    def plain_commit(member_id: str, instance: str | None) -> str:
        answer = commit(target, group, {(topic, 0): 4}, member_id=member_id, generation=gen,
                        instance=instance)  # fmt: skip
        return answer[(topic, 0)]

    observed: dict[str, Any] = {}
    for name, check in (("txn_offset_commit", txn_commit), ("offset_commit", plain_commit)):
        observed[name] = {
            "unknown_instance": check(mid, "someone-else"),
            "other_member": check("another-member", "instance-1"),
            "its_member": check(mid, "instance-1"),
            "no_instance": check(mid, None),
        }
    assert error_name(end_txn(target, txn.transactional_id, txn.producer_id, txn.epoch,
                              False)) == "NONE"  # fmt: skip

    # The instance restarts: its join with no member id takes the old member's place.
    restarted = join(target, group, topics=(topic,), instance="instance-1")
    new = Member(group, restarted.member_id, restarted.generation_id, restarted.leader,
                 "instance-1")  # fmt: skip
    old = Member(group, mid, restarted.generation_id, restarted.leader, "instance-1")
    observed["restart"] = {
        "join": error(restarted.error_code),
        "new_member_id": restarted.member_id != mid,
        "old_heartbeat": heartbeat(target, old),
        "old_sync": error(sync(target, old).error_code),
        "old_commit": commit(target, group, {(topic, 0): 5}, member_id=mid,
                             generation=new.generation, instance="instance-1")[(topic, 0)],
        "new_heartbeat_after_sync": [error(sync(target, new).error_code),
                                     heartbeat(target, new)],
    }  # fmt: skip
    return observed


def test_a_static_members_instance_id_is_checked(targets: Any) -> None:
    same(scenario_a_static_members_instance_id_is_checked, *targets)


def _fetch_stable(target: Target, group: str, topic: str | None) -> Observation:
    """OffsetFetch v7 with requireStable of ``topic``'s partitions 0 and 1 (None: all the
    group's): the request's error and each partition's [error, offset]."""
    from kio.schema.offset_fetch.v7 import request as r

    topics = None
    if topic is not None:
        topics = (r.OffsetFetchRequestTopic(name=topic, partition_indexes=(0, 1)),)
    answer = target.raw(9, 7, r.OffsetFetchRequest(group_id=group, require_stable=True,
                                                    topics=topics))  # fmt: skip
    return {
        "error": error_name(answer.error_code),
        "partitions": {
            str(p.partition_index): [error_name(p.error_code), p.committed_offset]
            for t in answer.topics
            for p in t.partitions
        },
    }


def scenario_an_unstable_offset_is_the_partitions_error(target: Target) -> Observation:
    """KIP-447: with a transactional commit pending on partition 0 only, OffsetFetch with
    requireStable answers UNSTABLE_OFFSET_COMMIT (and no offset) for that partition alone;
    the request's error stays NONE and partition 1 has its offset."""
    topic = target.create_topic("grp-unstable", partitions=2)
    group = target.name_for("grp-unstable")
    assert set(commit(target, group, {(topic, 0): 2, (topic, 1): 7}).values()) == {"NONE"}
    txn = RawTransaction(target)
    assert error_name(add_offsets(target, txn.transactional_id, txn.producer_id, txn.epoch,
                                  group)) == "NONE"  # fmt: skip
    assert error_name(txn_offset_commit(target, txn.transactional_id, txn.producer_id,
                                        txn.epoch, group, topic, 5)) == "NONE"  # fmt: skip
    observed = {"asked": _fetch_stable(target, group, topic),
                "all": _fetch_stable(target, group, None)}  # fmt: skip
    assert error_name(end_txn(target, txn.transactional_id, txn.producer_id, txn.epoch,
                              False)) == "NONE"  # fmt: skip
    return observed


def test_an_unstable_offset_is_the_partitions_error(targets: Any) -> None:
    same(scenario_an_unstable_offset_is_the_partitions_error, *targets)


def scenario_a_join_with_a_member_id_the_group_does_not_have(target: Target) -> Observation:
    """A classic JoinGroup naming a member id is an existing member's: one the group does
    not have is UNKNOWN_MEMBER_ID (in a group that does not exist too, which stays
    unmade); with a static instance id, one the group does not have is UNKNOWN_MEMBER_ID,
    the instance under another member id FENCED_INSTANCE_ID. The members stay as they were."""
    topic = target.create_topic("grp-join-unknown")
    group = target.name_for("grp-join-unknown")
    member = joined(target, group, topics=(topic,), instance="instance-1")
    assert error(sync(target, member, {member.member_id: b""}).error_code) == "NONE"
    nowhere = target.name_for("grp-join-nowhere")

    def attempt(group_id: str, member_id: str, instance: str | None = None) -> list[Any]:
        answer = join_once(target, group_id, member_id, topics=(topic,), instance=instance)
        return [error(answer.error_code), answer.member_id == member_id]

    observed = {
        "unknown_member": attempt(group, "no-such-member"),
        "unknown_group": attempt(nowhere, "no-such-member"),
        "unknown_group_state": describe(target, nowhere).group_state,
        "unknown_instance": attempt(group, "no-such-member", "instance-2"),
        "instance_of_another_member": attempt(group, "no-such-member", "instance-1"),
        "members": [m.member_id == member.member_id for m in describe(target, group).members],
        "state": describe(target, group).group_state,
        "heartbeat": heartbeat(target, member),
    }
    return observed


def test_a_join_with_a_member_id_the_group_does_not_have(targets: Any) -> None:
    same(scenario_a_join_with_a_member_id_the_group_does_not_have, *targets)
