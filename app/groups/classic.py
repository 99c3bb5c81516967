"""The rules of Kafka's classic group protocol that need no database: which protocol a
group runs, whether a joiner can take part, and who leads.

In the classic protocol the coordinator never reads an assignment: members name the
protocols they support (in their order of preference) with opaque metadata, the group
runs one every member supports, and one member, the leader, sends everybody's assignment.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence


def shares_protocol(others: Sequence[Sequence[str]], joiner: Sequence[str]) -> bool:
    """A member may join only if some protocol it names is supported by every member
    already there (Kafka refuses it with INCONSISTENT_GROUP_PROTOCOL otherwise)."""
    common = set(joiner)
    for names in others:
        common &= set(names)
    return bool(common)


def choose_protocol(preferences: Sequence[Sequence[str]]) -> str:
    """Among the protocols every member supports, each member votes for the one it lists
    first; the most votes win, a tie going to the first member's preference.

    ``preferences`` is non-empty and, by ``shares_protocol``, has a protocol in common.
    """
    common = set(preferences[0])
    for names in preferences[1:]:
        common &= set(names)
    votes = Counter(next(n for n in names if n in common) for names in preferences)
    first = [n for n in preferences[0] if n in common]
    return max(first, key=lambda name: (votes[name], -first.index(name)))


def keeps_protocol(
    current: str | None, leader: str | None, protocols: Mapping[str, Sequence[str]]
) -> bool:
    """Whether a Stable group, with a static member's protocols replaced by those it
    restarted with, would still choose ``current``: then the restart takes its old
    member's place without a rebalance (KIP-345; Kafka rebalances only when the selected
    protocol would change). ``protocols``: each member's, in its order of preference."""
    order = [m for m in protocols if m == leader] + [m for m in protocols if m != leader]
    preferences = [protocols[m] for m in order]
    if current is None or not preferences or not shares_protocol(preferences[1:], preferences[0]):
        return False
    return choose_protocol(preferences) == current


def choose_leader(previous: str | None, members_by_join: Sequence[str]) -> str:
    """The leader stays while it is a member (its assignor may keep state); otherwise the
    member that joined first leads."""
    if previous is not None and previous in members_by_join:
        return previous
    return members_by_join[0]
