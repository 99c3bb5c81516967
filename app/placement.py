"""Which live node leads a partition, coordinates a group or transactional id, and is the
controller: pure functions of the live node ids, so every ``kip98 serve`` node answers
alike from what it reads, with nothing to agree on (docs/design.md rule 47).

Every node serves every partition from the same storage, so leadership only tells
clients where to send what: it spreads their connections and requests over the nodes.
It is rendezvous (highest-random-weight) hashing: each (key, node) pair has a weight from
a hash, and a key goes to its heaviest live node, so a node's death moves only what it
held. A topic's partitions are placed in order with one bound: a node already leading
``ceil(2P/n)`` of the topic's P partitions (n live nodes) is passed over for the next in
the partition's ranking. The bound rarely binds once a topic has a few partitions per
node; when it does, partitions beyond the dead node's may move too, which costs clients
one Metadata refresh and no error (any node answers any request).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence


def weight(key: str, node_id: int) -> int:
    """The pair's weight: the first 8 bytes of its BLAKE2b hash, the same in every process
    (Python's own ``hash`` of a string is salted per process)."""
    digest = hashlib.blake2b(f"{key}\0{node_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def ranking(key: str, node_ids: Collection[int]) -> list[int]:
    """``node_ids`` heaviest first for ``key`` (ties, which a 64-bit hash all but never
    has, by node id)."""
    return sorted(node_ids, key=lambda n: (-weight(key, n), n))


def partition_key(topic: str, partition: int) -> str:
    # Topic names cannot hold NUL (Kafka's legal characters), so the key is unambiguous.
    return f"{topic}\0{partition}"


def leader_cap(partitions: int, nodes: int) -> int:
    """The most partitions of a topic of ``partitions`` one of ``nodes`` nodes may lead:
    twice the even share, rounded up."""
    return -(-2 * partitions // nodes)


def leaders(topic: str, partitions: int, node_ids: Collection[int]) -> list[int]:
    """The leader of each partition of ``topic`` (index = partition) among ``node_ids``,
    none leading more than ``leader_cap``; empty if there is no node."""
    if not node_ids or partitions <= 0:
        return []
    cap = leader_cap(partitions, len(node_ids))
    led = dict.fromkeys(node_ids, 0)
    chosen = []
    for p in range(partitions):
        node = next(n for n in ranking(partition_key(topic, p), node_ids) if led[n] < cap)
        led[node] += 1
        chosen.append(node)
    return chosen


def coordinator(key_type: int, key: str, node_ids: Collection[int]) -> int | None:
    """The node coordinating a group or a transactional id (``key_type``, FindCoordinator's):
    the key's heaviest, with no bound (the keys are unbounded); None if there is no node."""
    if not node_ids:
        return None
    return ranking(f"{key_type}\0{key}", node_ids)[0]


def controller(node_ids: Collection[int]) -> int | None:
    """The controller Metadata names: the lowest live node id (Kafka clients only show
    it; nothing here needs one)."""
    return min(node_ids, default=None)


def moved_leaders(
    topics: Sequence[tuple[str, int]], before: Collection[int], after: Collection[int]
) -> list[tuple[str, int]]:
    """The (topic, partition)s of ``topics`` ((name, partition count)) whose leader differs
    between the live sets ``before`` and ``after``, sorted."""
    if set(before) == set(after):
        return []
    moved: list[tuple[str, int]] = []
    for topic, count in sorted(topics):
        was, now = leaders(topic, count, before), leaders(topic, count, after)
        moved.extend((topic, p) for p in range(count) if not was or not now or was[p] != now[p])
    return moved
