"""KIP-848's consumer groups against both brokers, spoken raw: ConsumerGroupHeartbeat's
epochs, revocation before assignment, its errors, a static member's leave and return,
ConsumerGroupDescribe, and ListGroups' group type (docs/design.md rules 60-62)."""

from __future__ import annotations

import struct
import time
import uuid
from typing import Any

from tests.conformance.group_calls import assignment, describe, joined, sync
from tests.conformance.group_calls import heartbeat as classic_heartbeat
from tests.conformance.group_calls import join as classic_join
from tests.conformance.harness import Observation, Target, run_both, same
from tests.conformance.raw_calls import (
    DELETE_GROUPS,
    DESCRIBE_GROUPS,
    LIST_GROUPS,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    call,
    error,
)
from tests.conformance.requests import (
    add_offsets,
    end_txn,
    find_coordinator,
    init_producer_id,
    txn_offset_commit,
)

HEARTBEAT, DESCRIBE = 68, 69
HANG_GUARD_S = 60


def _beat(target: Target, group: str, member: str, epoch: int, **fields: Any) -> Any:
    values = {"group_id": group, "member_id": member, "member_epoch": epoch,
              "rebalance_timeout": fields.pop("rebalance_timeout", -1),
              "topic_partitions": None, **fields}  # fmt: skip
    return call(target, HEARTBEAT, 1, values)


def _join(target: Target, group: str, member: str, topics: list[str], **fields: Any) -> Any:
    return _beat(
        target, group, member, 0, rebalance_timeout=30000, subscribed_topic_names=topics,
        topic_partitions=[], **fields,
    )  # fmt: skip


def _owned(answer: Any) -> list[dict[str, Any]]:
    return [
        {"topic_id": tp.topic_id, "partitions": list(tp.partitions)}
        for tp in answer.assignment.topic_partitions
    ]


def _seen(answer: Any) -> list[Any]:
    """What a client observes of an answer: its error, epoch and how many partitions it
    was given (None: no assignment sent)."""
    given = None
    if answer.assignment is not None:
        given = sum(len(tp.partitions) for tp in answer.assignment.topic_partitions)
    return [error(answer.error_code), answer.member_epoch, given]


def scenario_members_reconcile_revoking_before_assigning(target: Target) -> Observation:
    """A joins a 4-partition topic and takes all; B joins. Both heartbeat, each reporting
    what it was last given (a revocation acknowledged at the next heartbeat), until the
    group is Stable: at no heartbeat is a partition held by both, and they end with two
    each, at one epoch. ListGroups types the group "consumer"."""
    topic = target.create_topic("cg-rec", 4)
    group = target.name_for("cg-rec")
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    first = _join(target, group, a, [topic])
    seen: list[Any] = [_seen(first)]
    held = {a: _owned(first), b: []}
    epochs = {a: first.member_epoch, b: 0}
    second = _join(target, group, b, [topic])
    seen.append(error(second.error_code))
    epochs[b] = second.member_epoch
    if second.assignment is not None:
        held[b] = _owned(second)
    twice = False
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        for member in (a, b):
            answer = _beat(target, group, member, epochs[member], topic_partitions=held[member])
            assert error(answer.error_code) == "NONE", answer
            epochs[member] = answer.member_epoch
            if answer.assignment is not None:
                held[member] = _owned(answer)
        mine = [{p for tp in held[m] for p in tp["partitions"]} for m in (a, b)]
        twice = twice or bool(mine[0] & mine[1])
        described = call(target, DESCRIBE, 1, {"group_ids": [group]}).groups[0]
        if described.group_state == "Stable" and sorted(map(len, mine)) == [2, 2]:
            break
        time.sleep(0.2)
    seen.append([twice, sorted(map(len, mine)), sorted(mine[0] | mine[1])])
    seen.append([
        error(described.error_code), described.group_state,
        described.group_epoch == described.assignment_epoch, described.assignor_name,
        sorted((m.member_epoch == described.group_epoch, list(m.subscribed_topic_names) == [topic])
               for m in described.members),
    ])  # fmt: skip
    classic = call(target, DESCRIBE_GROUPS, 5, {"groups": [group]}).groups[0]
    seen.append([error(classic.error_code), classic.group_state, len(classic.members)])
    listed = call(target, LIST_GROUPS, 5, {"states_filter": [], "types_filter": []})
    seen.append([(g.group_type, g.protocol_type, g.group_state)
                 for g in listed.groups if g.group_id == group])  # fmt: skip
    return seen


def test_members_reconcile_revoking_before_assigning(targets: tuple[Target, Target]) -> None:
    same(scenario_members_reconcile_revoking_before_assigning, *targets)


def scenario_the_heartbeats_errors(target: Target) -> Observation:
    """Kafka's answers to a heartbeat for no group, an epoch ahead, an unknown member,
    joins without a subscription or with an unknown assignor, a leave and a heartbeat
    after it; ConsumerGroupDescribe of a group there is not."""
    topic = target.create_topic("cg-err", 2)
    group = target.name_for("cg-err")
    a = str(uuid.uuid4())
    seen = [_seen(_beat(target, target.name_for("cg-none"), a, 3))]
    seen.append(_seen(_join(target, group, a, [topic])))
    seen.append(_seen(_beat(target, group, a, 5)))
    seen.append(_seen(_beat(target, group, str(uuid.uuid4()), 1)))
    seen.append(_seen(_join(target, group, str(uuid.uuid4()), [])))
    seen.append(_seen(_join(target, group, str(uuid.uuid4()), [topic], server_assignor="nope")))
    seen.append(_seen(_beat(target, group, a, 1, rebalance_timeout=30000)))
    left = _beat(target, group, a, -1)
    seen.append([error(left.error_code), left.member_epoch, left.member_id == a])
    seen.append(_seen(_beat(target, group, a, 1)))
    missing = call(target, DESCRIBE, 1, {"group_ids": [target.name_for("cg-none")]}).groups[0]
    seen.append([error(missing.error_code), missing.group_state])
    return seen


def test_the_heartbeats_errors(targets: tuple[Target, Target]) -> None:
    same(scenario_the_heartbeats_errors, *targets)


def scenario_a_static_member_leaves_and_its_instance_returns(target: Target) -> Observation:
    """A static member's instance cannot be taken while it is in use
    (UNRELEASED_INSTANCE_ID); after its leave with epoch -2, a new member of the same
    instance takes its place and partitions at the same epoch."""
    topic = target.create_topic("cg-static", 3)
    group = target.name_for("cg-static")
    first, other = str(uuid.uuid4()), str(uuid.uuid4())
    seen = [_seen(_join(target, group, first, [topic], instance_id="i-1"))]
    seen.append(_seen(_join(target, group, other, [topic], instance_id="i-1")))
    gone = _beat(target, group, first, -2, instance_id="i-1")
    seen.append([error(gone.error_code), gone.member_epoch])
    seen.append(_seen(_join(target, group, other, [topic], instance_id="i-1")))
    described = call(target, DESCRIBE, 1, {"group_ids": [group]}).groups[0]
    seen.append([(m.member_id == other, m.instance_id, m.member_epoch) for m in described.members])
    return seen


def test_a_static_member_leaves_and_its_instance_returns(targets: tuple[Target, Target]) -> None:
    same(scenario_a_static_member_leaves_and_its_instance_returns, *targets)


def scenario_a_consumer_group_is_deleted_only_once_empty(target: Target) -> Observation:
    """DeleteGroups of a consumer group with a member is NON_EMPTY_GROUP; once the member
    has left it is deleted, and a heartbeat of it then finds no group."""
    topic = target.create_topic("cg-del", 1)
    group = target.name_for("cg-del")
    a = str(uuid.uuid4())
    seen: list[Any] = [_seen(_join(target, group, a, [topic]))]
    deleted = call(target, DELETE_GROUPS, 2, {"groups_names": [group]})
    seen.append([error(r.error_code) for r in deleted.results])
    seen.append(error(_beat(target, group, a, -1).error_code))
    deleted = call(target, DELETE_GROUPS, 2, {"groups_names": [group]})
    seen.append([error(r.error_code) for r in deleted.results])
    seen.append(_seen(_beat(target, group, a, 2)))
    return seen


def test_a_consumer_group_is_deleted_only_once_empty(targets: tuple[Target, Target]) -> None:
    same(scenario_a_consumer_group_is_deleted_only_once_empty, *targets)


def scenario_offsets_are_fenced_by_the_member_epoch(target: Target) -> Observation:
    """KIP-447 in the consumer protocol: a member's OffsetCommit (v9) and a transaction's
    TxnOffsetCommit naming it pass at its current member epoch only (STALE_MEMBER_EPOCH,
    ILLEGAL_GENERATION for the transactional one), and an unknown member is refused."""
    topic = target.create_topic("cg-fence", 2)
    group = target.name_for("cg-fence")
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    first = _join(target, group, a, [topic])
    epoch = first.member_epoch
    _join(target, group, b, [topic])  # the group epoch moves on; a's stays until it acks
    seen: list[Any] = []
    for member, member_epoch in ((a, epoch), (a, epoch - 1), (a, epoch + 1), (b + "x", epoch)):
        commit = {"group_id": group, "member_id": member,
                  "generation_id_or_member_epoch": member_epoch,
                  "topics": [{"name": topic, "partitions": [
                      {"partition_index": 0, "committed_offset": 0, "committed_metadata": ""}]}]}  # fmt: skip
        answer = call(target, OFFSET_COMMIT, 9, commit)
        seen.append(error(answer.topics[0].partitions[0].error_code))
    txid = target.name_for("cg-fence-tx")
    find_coordinator(target, txid)
    ids = init_producer_id(target, txid)
    pid, pepoch = ids.producer_id, ids.producer_epoch
    seen.append(error(add_offsets(target, txid, pid, pepoch, group)))
    for member, member_epoch in ((a, epoch - 1), (b + "x", epoch), (a, epoch)):
        seen.append(error(txn_offset_commit(
            target, txid, pid, pepoch, group, topic, 1, generation=member_epoch, member_id=member,
        )))  # fmt: skip
    seen.append(error(end_txn(target, txid, pid, pepoch, True)))
    return seen


def test_offsets_are_fenced_by_the_member_epoch(targets: tuple[Target, Target]) -> None:
    same(scenario_offsets_are_fenced_by_the_member_epoch, *targets)


def _fetched(answer: Any) -> list[Any]:
    """Each group of an OffsetFetch (v8+) answer: its error and its partitions' offsets."""
    return [
        [error(g.error_code),
         [[p.partition_index, p.committed_offset, error(p.error_code)]
          for t in g.topics for p in t.partitions]]
        for g in answer.groups
    ]  # fmt: skip


def scenario_offset_fetch_checks_the_member_epoch(target: Target) -> Observation:
    """OffsetFetch v8 asks for several groups at once, each answered on its own (a group
    that does not exist: no offsets); v9 names a consumer group's member, which must be
    one at its current epoch (STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID), unless it names
    none (null, -1)."""
    topic = target.create_topic("cg-fetch", 2)
    group, other = target.name_for("cg-fetch"), target.name_for("cg-fetch-none")
    a = str(uuid.uuid4())
    epoch = _join(target, group, a, [topic]).member_epoch
    commit = {"group_id": group, "member_id": a, "generation_id_or_member_epoch": epoch,
              "topics": [{"name": topic, "partitions": [
                  {"partition_index": 0, "committed_offset": 3, "committed_metadata": ""}]}]}  # fmt: skip
    seen: list[Any] = [
        error(call(target, OFFSET_COMMIT, 9, commit).topics[0].partitions[0].error_code)
    ]
    asked = [{"name": topic, "partition_indexes": [0, 1]}]
    both = {"groups": [{"group_id": group, "topics": asked},
                       {"group_id": other, "topics": asked}]}  # fmt: skip
    seen.append(_fetched(call(target, OFFSET_FETCH, 8, both)))
    for member, member_epoch in ((a, epoch), (a, epoch + 1), (a, epoch - 1),
                                 (a + "x", epoch), (None, -1), ("", -1)):  # fmt: skip
        one = {"groups": [{"group_id": group, "member_id": member, "member_epoch": member_epoch,
                           "topics": asked}]}  # fmt: skip
        seen.append(_fetched(call(target, OFFSET_FETCH, 9, one)))
    return seen


def test_offset_fetch_checks_the_member_epoch(targets: tuple[Target, Target]) -> None:
    same(scenario_offset_fetch_checks_the_member_epoch, *targets)


def scenario_a_member_commits_at_version_9_only(target: Target) -> Observation:
    """A consumer-protocol member's OffsetCommit below v9 (a generation, not a member
    epoch) is UNSUPPORTED_VERSION; one from no member while the group has members is
    UNKNOWN_MEMBER_ID; v9 at the member's epoch is accepted."""
    topic = target.create_topic("cg-v8", 1)
    group = target.name_for("cg-v8")
    a = str(uuid.uuid4())
    epoch = _join(target, group, a, [topic]).member_epoch
    seen: list[Any] = []
    for version, member, member_epoch in ((8, a, epoch), (8, a, epoch + 1), (8, "", -1),
                                          (8, a + "x", epoch), (9, a, epoch)):  # fmt: skip
        commit = {"group_id": group, "member_id": member,
                  "generation_id_or_member_epoch": member_epoch,
                  "topics": [{"name": topic, "partitions": [
                      {"partition_index": 0, "committed_offset": 1, "committed_metadata": ""}]}]}  # fmt: skip
        answer = call(target, OFFSET_COMMIT, version, commit)
        seen.append([version, error(answer.topics[0].partitions[0].error_code)])
    return seen


def test_a_member_commits_at_version_9_only(targets: tuple[Target, Target]) -> None:
    same(scenario_a_member_commits_at_version_9_only, *targets)


def scenario_an_earlier_epoch_commits_what_the_member_owned_then(target: Target) -> Observation:
    """KIP-1251: a member moved on to a new epoch (its subscription grew) may still commit
    at its previous epoch the partitions it owned then, not those assigned at the new one;
    an epoch newer than its own is stale."""
    first_topic, second_topic = (
        target.create_topic("cg-since-a", 1),
        target.create_topic("cg-since-b", 1),
    )
    group = target.name_for("cg-since")
    a = str(uuid.uuid4())
    joined = _join(target, group, a, [first_topic])
    before, held = joined.member_epoch, _owned(joined)
    epoch = before
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:  # until it owns both topics' partitions
        answer = _beat(
            target, group, a, epoch, subscribed_topic_names=[first_topic, second_topic],
            topic_partitions=held,
        )  # fmt: skip
        assert error(answer.error_code) == "NONE", answer
        epoch = answer.member_epoch
        if answer.assignment is not None:
            held = _owned(answer)
        if sum(len(tp["partitions"]) for tp in held) == 2 and epoch > before:
            break
        time.sleep(0.2)
    seen: list[Any] = [epoch > before]
    for topic, member_epoch in ((first_topic, before), (second_topic, before),
                                (second_topic, epoch), (first_topic, epoch + 1)):  # fmt: skip
        commit = {"group_id": group, "member_id": a, "generation_id_or_member_epoch": member_epoch,
                  "topics": [{"name": topic, "partitions": [
                      {"partition_index": 0, "committed_offset": 0, "committed_metadata": ""}]}]}  # fmt: skip
        answer = call(target, OFFSET_COMMIT, 9, commit)
        seen.append(error(answer.topics[0].partitions[0].error_code))
    return seen


def test_an_earlier_epoch_commits_what_the_member_owned_then(
    targets: tuple[Target, Target],
) -> None:
    on_kip98, on_kafka = run_both(
        scenario_an_earlier_epoch_commits_what_the_member_owned_then, *targets
    )
    # What the scenario is for, as Kafka 4.4 answers it: the earlier epoch passes for the
    # partition owned then only.
    assert on_kafka == [True, "NONE", "STALE_MEMBER_EPOCH", "NONE", "STALE_MEMBER_EPOCH"]
    assert on_kip98 == on_kafka


def _assigned_partitions(data: bytes) -> set[int]:
    """The partitions of a consumer protocol assignment (any version) of one topic."""
    (topics,) = struct.unpack_from(">i", data, 2)
    at, out = 6, set()
    for _ in range(topics):
        (size,) = struct.unpack_from(">h", data, at)
        at += 2 + size
        (count,) = struct.unpack_from(">i", data, at)
        out |= set(struct.unpack_from(f">{count}i", data, at + 4))
        at += 4 + 4 * count
    return out


def scenario_a_classic_group_is_converted_online_and_back(target: Target) -> Observation:
    """KIP-848's online conversion (group.consumer.migration.policy bidirectional, both
    brokers' default): a classic member owns a 4-partition topic; a consumer-protocol
    member joins, and the classic member's heartbeat is answered REBALANCE_IN_PROGRESS
    (Kafka may first finish its offloaded assignment); its rejoin is answered at once,
    with no leader and a generation that is its new member epoch, and its SyncGroup with
    its share; the two share the partitions; ConsumerGroupDescribe types the members;
    the consumer-protocol member leaves and the group is classic again, rebalancing, the
    classic member its leader at the next generation."""
    topic = target.create_topic("cg-mig", 4)
    group = target.name_for("cg-mig")
    classic = joined(target, group, topics=(topic,))
    seen: list[Any] = [error(sync(target, classic, {
        classic.member_id: assignment(topic, 0, 1, 2, 3)}).error_code)]  # fmt: skip
    a = str(uuid.uuid4())
    first = _join(target, group, a, [topic])
    seen.append([error(first.error_code), first.member_epoch > classic.generation])
    epoch, held = first.member_epoch, _owned(first) if first.assignment is not None else []
    told = "NONE"
    deadline = time.monotonic() + HANG_GUARD_S
    while told == "NONE" and time.monotonic() < deadline:
        answer = _beat(target, group, a, epoch, topic_partitions=held)
        epoch = answer.member_epoch
        told = classic_heartbeat(target, classic)
        time.sleep(0.1)
    seen.append(told)
    again = classic_join(target, group, classic.member_id, topics=(topic,))
    seen.append([error(again.error_code), again.generation_id > classic.generation,
                 again.leader, len(again.members), again.protocol_name])  # fmt: skip
    moved = type(classic)(group, classic.member_id, again.generation_id, again.leader)
    synced = sync(target, moved)
    mine = _assigned_partitions(synced.assignment)
    seen.append([error(synced.error_code), len(mine)])
    deadline = time.monotonic() + HANG_GUARD_S
    theirs: set[int] = set()
    while time.monotonic() < deadline:
        answer = _beat(target, group, a, epoch, topic_partitions=held)
        epoch = answer.member_epoch
        if answer.assignment is not None:
            held = _owned(answer)
        theirs = {p for tp in held for p in tp["partitions"]}
        if len(theirs) + len(mine) == 4:
            break
        time.sleep(0.2)
    seen.append([sorted(theirs | mine), not theirs & mine, classic_heartbeat(target, moved)])
    described = call(target, DESCRIBE, 1, {"group_ids": [group]}).groups[0]
    seen.append([error(described.error_code), described.group_state,
                 sorted(m.member_type for m in described.members)])  # fmt: skip
    left = _beat(target, group, a, -1)
    seen.append(error(left.error_code))
    back = describe(target, group)
    seen.append([back.group_state, back.protocol_type, len(back.members)])
    seen.append(classic_heartbeat(target, moved))
    rejoined = classic_join(target, group, classic.member_id, topics=(topic,))
    seen.append([error(rejoined.error_code), rejoined.leader == classic.member_id,
                 rejoined.generation_id == moved.generation + 1])  # fmt: skip
    return seen


def test_a_classic_group_is_converted_online_and_back(targets: tuple[Target, Target]) -> None:
    same(scenario_a_classic_group_is_converted_online_and_back, *targets)
