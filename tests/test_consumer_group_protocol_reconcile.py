"""KIP-848's target assignment and reconciliation as pure functions
(``app.groups.consumer_assignment``): hypothesis drives a group of members through
random target changes and heartbeats, and at every step no partition is owned by two
members; once the targets stop changing, every subscribed partition ends assigned
(docs/design.md rules 60, 61)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.groups.consumer_assignment import (
    RANGE,
    STABLE,
    UNIFORM,
    UNREVOKED_PARTITIONS,
    MemberAssignmentState,
    group_state,
    pairs,
    reconcile,
    target_assignment,
    uniform_assign,
)

TOPICS = {"a": 3, "b": 5, "c": 1}


def _owner_epoch(members: dict[str, MemberAssignmentState], me: str):  # type: ignore[no-untyped-def]
    held = {
        tp: m.member_epoch
        for mid, m in members.items()
        if mid != me
        for tp in pairs(m.assigned) | pairs(m.pending_revocation)
    }
    return lambda t, p: held.get((t, p), -1)


def _no_partition_twice(members: dict[str, MemberAssignmentState]) -> None:
    seen: dict[tuple[str, int], str] = {}
    for mid, m in members.items():
        for tp in pairs(m.assigned) | pairs(m.pending_revocation):
            assert tp not in seen, f"{tp} owned by {seen[tp]} and {mid}"
            seen[tp] = mid


subscriptions = st.dictionaries(
    st.sampled_from(["m1", "m2", "m3", "m4"]),
    st.sets(st.sampled_from(sorted(TOPICS)), min_size=1),
    min_size=1,
)


@settings(max_examples=200, deadline=None)
@given(
    assignor=st.sampled_from([UNIFORM, RANGE]),
    epochs=st.lists(subscriptions, min_size=1, max_size=5),
    order=st.lists(st.sampled_from(["m1", "m2", "m3", "m4"]), min_size=5, max_size=60),
    acknowledge=st.lists(st.booleans(), min_size=60, max_size=60),
)
def test_no_partition_is_ever_owned_by_two_members_and_all_end_assigned(
    assignor: str,
    epochs: list[dict[str, set[str]]],
    order: list[str],
    acknowledge: list[bool],
) -> None:
    members: dict[str, MemberAssignmentState] = {}
    targets: dict[str, dict[str, frozenset[int]]] = {}
    group_epoch = 0
    current: dict[str, set[str]] = {}
    plans = list(epochs)
    for step, who in enumerate(order):
        if plans and step % 7 == 0:
            # A new group epoch: members come and go, subscriptions change.
            subs = current = plans.pop(0)
            group_epoch += 1
            for gone in set(members) - subs.keys():
                del members[gone]  # a member removed (left, expired) holds nothing
            for new in subs.keys() - members.keys():
                members[new] = MemberAssignmentState(0, 0)
            targets = target_assignment(assignor, subs, TOPICS, targets)
        if who not in members:
            continue
        m = members[who]
        # The client reports what it holds; it lets revoked partitions go when it chooses.
        held = pairs(m.assigned) | pairs(m.pending_revocation)
        if m.state == UNREVOKED_PARTITIONS and acknowledge[step]:
            held = pairs(m.assigned)
        owned = {t: frozenset(p for tt, p in held if tt == t) for t, _ in held}
        members[who] = reconcile(
            m, targets.get(who, {}), group_epoch, owned, _owner_epoch(members, who)
        )
        _no_partition_twice(members)
    # Then every member heartbeats, acknowledging, until nothing changes.
    for _ in range(10):
        for who in sorted(members):
            m = members[who]
            owned = {t: frozenset(ps) for t, ps in m.assigned.items()}
            members[who] = reconcile(
                m, targets.get(who, {}), group_epoch, owned, _owner_epoch(members, who)
            )
            _no_partition_twice(members)
    subscribed = {(t, p) for ts in current.values() for t in ts for p in range(TOPICS[t])}
    assigned = set().union(*(pairs(m.assigned) for m in members.values()))
    assert assigned == subscribed
    assert all(m.state == STABLE and m.member_epoch == group_epoch for m in members.values())
    expected = "Stable" if members else "Empty"
    assert group_state(members.values(), group_epoch, group_epoch) == expected


@settings(max_examples=200, deadline=None)
@given(subs=subscriptions)
def test_the_uniform_assignor_assigns_each_partition_once_and_evenly(
    subs: dict[str, set[str]],
) -> None:
    plan = uniform_assign({m: sorted(ts) for m, ts in subs.items()}, TOPICS, {})
    owned = [tp for a in plan.values() for tp in pairs(a)]
    assert len(owned) == len(set(owned))
    assert set(owned) == {(t, p) for ts in subs.values() for t in ts for p in range(TOPICS[t])}
    if len({frozenset(ts) for ts in subs.values()}) == 1:
        counts = [len(pairs(a)) for a in plan.values()]
        assert max(counts) - min(counts) <= 1


def test_the_uniform_assignor_keeps_what_members_had() -> None:
    before = uniform_assign({"m1": ["b"], "m2": ["b"]}, TOPICS, {})
    after = uniform_assign({"m1": ["b"], "m2": ["b"], "m3": ["b"]}, TOPICS, before)
    for m in ("m1", "m2"):
        assert pairs(after[m]) <= pairs(before[m])


def test_a_member_revokes_before_another_is_given_its_partition() -> None:
    """Rule 60: the new owner gets a partition only once the old one acknowledged."""
    a = MemberAssignmentState(1, 0, STABLE, {"c": frozenset({0})})
    b = MemberAssignmentState(0, 0)
    # Epoch 2: the target moves c-0 from a to b.
    b = reconcile(b, {"c": frozenset({0})}, 2, {}, lambda t, p: 1)
    assert pairs(b.assigned) == set() and b.member_epoch == 2 and b.state != STABLE
    a = reconcile(a, {}, 2, {"c": frozenset({0})}, lambda t, p: -1)
    assert a.state == UNREVOKED_PARTITIONS and a.member_epoch == 1
    assert pairs(a.pending_revocation) == {("c", 0)}
    a = reconcile(a, {}, 2, {}, lambda t, p: -1)  # a acknowledged
    assert a.state == STABLE and a.member_epoch == 2 and pairs(a.assigned) == set()
    b = reconcile(b, {"c": frozenset({0})}, 2, {}, lambda t, p: -1)
    assert pairs(b.assigned) == {("c", 0)} and b.state == STABLE
