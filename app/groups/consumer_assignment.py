"""KIP-848's decisions as pure functions: the target assignment a server-side assignor
computes for a group epoch, and a member's reconciliation towards it.

An assignment is ``{topic: frozenset(partitions)}``. The target says who should own what
at the group epoch; a member moves to it one heartbeat at a time (``reconcile``), and
revokes before it assigns: it is handed a partition only once no other member holds it,
in its assigned set or pending revocation (docs/design.md rules 60, 61). So a partition is
never owned by two members, whatever the member epochs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from app.groups.assignor import range_assign
from app.protocol import CONSUMER_GROUP_ASSIGNORS

Assignment = Mapping[str, frozenset[int]]

# Kafka's member states (MemberState) and group states (ConsumerGroupState), as Kafka's
# DescribeGroups/ConsumerGroupDescribe name them.
STABLE = "stable"
UNREVOKED_PARTITIONS = "unrevoked_partitions"
UNRELEASED_PARTITIONS = "unreleased_partitions"
GROUP_EMPTY, GROUP_ASSIGNING, GROUP_RECONCILING, GROUP_STABLE = (
    "Empty",
    "Assigning",
    "Reconciling",
    "Stable",
)
ASSIGNORS = CONSUMER_GROUP_ASSIGNORS
UNIFORM, RANGE = ASSIGNORS


def pairs(assignment: Assignment) -> set[tuple[str, int]]:
    return {(t, p) for t, ps in assignment.items() for p in ps}


def from_pairs(items: Iterable[tuple[str, int]]) -> dict[str, frozenset[int]]:
    out: dict[str, set[int]] = {}
    for t, p in items:
        out.setdefault(t, set()).add(p)
    return {t: frozenset(ps) for t, ps in sorted(out.items())}


@dataclass(frozen=True)
class MemberAssignmentState:
    """A member's side of reconciliation (Kafka's ConsumerGroupMember, its epochs and
    partitions): ``assigned`` are its to consume now, ``pending_revocation`` still its
    until it says it let them go."""

    member_epoch: int
    previous_member_epoch: int
    state: str = STABLE
    assigned: Assignment = field(default_factory=dict)
    pending_revocation: Assignment = field(default_factory=dict)


def _owns_any(owned: Assignment | None, partitions: Assignment) -> bool:
    """Whether the member, by the partitions it reported, still holds any of
    ``partitions``; a heartbeat that reports none (null) is taken as still holding them."""
    if owned is None:
        return True
    return bool(pairs(owned) & pairs(partitions))


def reconcile(
    member: MemberAssignmentState,
    target: Assignment,
    target_epoch: int,
    owned: Assignment | None,
    owner_epoch: Callable[[str, int], int],
) -> MemberAssignmentState:
    """The member's next state towards ``target`` at ``target_epoch`` (Kafka's
    CurrentAssignmentBuilder). ``owned``: what its heartbeat says it holds (None: not
    said). ``owner_epoch(topic, partition)``: the epoch of another member holding it, -1 if
    none does."""
    if member.state == STABLE:
        if member.member_epoch == target_epoch:
            return member
        return _next(member, member.member_epoch, target, target_epoch, owned, owner_epoch)
    if member.state == UNREVOKED_PARTITIONS:
        if _owns_any(owned, member.pending_revocation):
            return member
        return _next(member, member.member_epoch + 1, target, target_epoch, owned, owner_epoch)
    return _next(member, member.member_epoch, target, target_epoch, owned, owner_epoch)


def _next(
    member: MemberAssignmentState,
    epoch: int,
    target: Assignment,
    target_epoch: int,
    owned: Assignment | None,
    owner_epoch: Callable[[str, int], int],
) -> MemberAssignmentState:
    current, wanted = pairs(member.assigned), pairs(target)
    kept = current & wanted
    revoke = current - kept
    free_to_take = {tp for tp in wanted - kept if owner_epoch(*tp) == -1}
    unreleased = (wanted - kept) - free_to_take
    if revoke and _owns_any(owned, from_pairs(revoke)):
        # Revoke first: the member stays at its epoch until it acknowledges.
        return _moved(member, epoch, UNREVOKED_PARTITIONS, from_pairs(kept), from_pairs(revoke))
    state = UNRELEASED_PARTITIONS if unreleased else STABLE
    return _moved(member, target_epoch, state, from_pairs(kept | free_to_take), {})


def _moved(
    member: MemberAssignmentState,
    epoch: int,
    state: str,
    assigned: Assignment,
    pending: Assignment,
) -> MemberAssignmentState:
    return replace(
        member,
        member_epoch=epoch,
        previous_member_epoch=member.member_epoch,
        state=state,
        assigned=assigned,
        pending_revocation=pending,
    )


def target_assignment(
    assignor: str,
    subscriptions: Mapping[str, Iterable[str]],
    partition_counts: Mapping[str, int],
    previous: Mapping[str, Assignment],
) -> dict[str, dict[str, frozenset[int]]]:
    """Every member's target at a new group epoch: ``subscriptions`` member -> topics
    (resolved: regular expressions already matched), ``previous`` the last target, for
    the uniform assignor to keep what it can."""
    topics = {m: sorted(set(ts) & partition_counts.keys()) for m, ts in subscriptions.items()}
    if assignor == RANGE:
        plan = range_assign({m: list(ts) for m, ts in topics.items()}, partition_counts)
        return {m: from_pairs(tps) for m, tps in plan.items()}
    return uniform_assign(topics, partition_counts, previous)


def uniform_assign(
    subscriptions: Mapping[str, list[str]],
    partition_counts: Mapping[str, int],
    previous: Mapping[str, Assignment],
) -> dict[str, dict[str, frozenset[int]]]:
    """Kafka's uniform assignor's aims: every subscribed partition to one member, counts
    as even as the subscriptions allow, and each member keeping what it had where that
    costs no balance (sticky), so fewer partitions move at each epoch."""
    members = sorted(subscriptions)
    owner: dict[tuple[str, int], str] = {}
    counts = dict.fromkeys(members, 0)
    wanted = {
        (t, p) for ts in subscriptions.values() for t in ts for p in range(partition_counts[t])
    }
    quota = math.ceil(len(wanted) / len(members)) if members else 0
    for m in members:
        subscribed = set(subscriptions[m])
        for tp in sorted(pairs(previous.get(m, {}))):
            if tp in wanted and tp not in owner and tp[0] in subscribed and counts[m] < quota:
                owner[tp] = m
                counts[m] += 1
    for tp in sorted(wanted - owner.keys()):
        eligible = [m for m in members if tp[0] in subscriptions[m]]
        chosen = min(eligible, key=lambda m: (counts[m], m))
        owner[tp] = chosen
        counts[chosen] += 1
    moved = True
    while moved:
        # Balance: a partition moves from a member with two or more than another that
        # could take it.
        moved = False
        for tp in sorted(owner):
            holder = owner[tp]
            eligible = [m for m in members if tp[0] in subscriptions[m]]
            taker = min(eligible, key=lambda m: (counts[m], m))
            if counts[taker] < counts[holder] - 1:
                owner[tp] = taker
                counts[holder] -= 1
                counts[taker] += 1
                moved = True
    out: dict[str, dict[str, frozenset[int]]] = {m: {} for m in members}
    for m in members:
        out[m] = from_pairs(tp for tp, o in owner.items() if o == m)
    return out


def group_state(
    members: Iterable[MemberAssignmentState], group_epoch: int, assignment_epoch: int
) -> str:
    """Kafka's ConsumerGroupState from its members' epochs."""
    listed = list(members)
    if not listed:
        return GROUP_EMPTY
    if group_epoch > assignment_epoch:
        return GROUP_ASSIGNING
    if any(m.member_epoch != assignment_epoch or m.state != STABLE for m in listed):
        return GROUP_RECONCILING
    return GROUP_STABLE
