"""Where leadership and coordination go among the live nodes (app.placement,
docs/design.md rule 47): property tests over node sets."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from app.placement import controller, coordinator, leader_cap, leaders, moved_leaders

node_sets = st.sets(st.integers(0, 2**31 - 1), min_size=1, max_size=12)
small_ids = st.sets(st.integers(0, 40), min_size=2, max_size=12)
topics = st.text(st.sampled_from("abcxyz._-0123"), min_size=1, max_size=12)


@settings(max_examples=400)
@given(topic=topics, partitions=st.integers(1, 200), nodes=node_sets)
def test_no_node_leads_more_than_twice_its_share(
    topic: str, partitions: int, nodes: set[int]
) -> None:
    led = leaders(topic, partitions, nodes)
    assert len(led) == partitions and set(led) <= nodes
    bound = math.ceil(2 * partitions / len(nodes))
    assert max(led.count(n) for n in nodes) <= bound
    assert leader_cap(partitions, len(nodes)) == bound


@given(topic=topics, partitions=st.integers(1, 60), nodes=node_sets, data=st.data())
def test_every_node_computes_the_same_leaders(
    topic: str, partitions: int, nodes: set[int], data: st.DataObject
) -> None:
    """The answer depends on the set only, not on the order a node read it in."""
    shuffled = data.draw(st.permutations(sorted(nodes)))
    assert leaders(topic, partitions, shuffled) == leaders(topic, partitions, sorted(nodes))
    key = data.draw(st.text(max_size=20))
    assert coordinator(0, key, shuffled) == coordinator(0, key, sorted(nodes))
    assert controller(shuffled) == min(nodes)


@settings(max_examples=300)
@given(topic=topics, partitions=st.integers(1, 120), nodes=small_ids, data=st.data())
def test_a_dead_nodes_partitions_move_and_others_stay_unless_the_bound_moved_them(
    topic: str, partitions: int, nodes: set[int], data: st.DataObject
) -> None:
    dead = data.draw(st.sampled_from(sorted(nodes)))
    alive = nodes - {dead}
    before, after = leaders(topic, partitions, nodes), leaders(topic, partitions, alive)
    assert dead not in after
    moved = {p for p in range(partitions) if before[p] != after[p]}
    assert {p for p in range(partitions) if before[p] == dead} <= moved
    assert moved_leaders([(topic, partitions)], nodes, alive) == [(topic, p) for p in sorted(moved)]
    # Where the bound passed over no node in either placement, it is plain rendezvous
    # hashing: only the dead node's partitions moved.
    if not _bound_binds(topic, partitions, nodes) and not _bound_binds(topic, partitions, alive):
        assert moved == {p for p in range(partitions) if before[p] == dead}


def test_the_bound_rarely_moves_a_live_nodes_partition() -> None:
    """Over many topics and node deaths, the partitions of live nodes that move are a small
    fraction (deterministic: the hash is fixed)."""
    others_moved = total = 0
    for t in range(300):
        nodes = set(range(t % 7 + 2))
        partitions = t % 37 + 1
        dead = t % len(nodes)
        before = leaders(f"topic-{t}", partitions, nodes)
        after = leaders(f"topic-{t}", partitions, nodes - {dead})
        others_moved += sum(1 for b, a in zip(before, after, strict=True) if b != dead and b != a)
        total += partitions
    assert others_moved / total < 0.01


@given(
    keys=st.lists(st.text(max_size=10), min_size=1, max_size=30), nodes=small_ids, data=st.data()
)
def test_only_a_dead_nodes_groups_and_transactional_ids_move(
    keys: list[str], nodes: set[int], data: st.DataObject
) -> None:
    dead = data.draw(st.sampled_from(sorted(nodes)))
    for key_type in (0, 1):
        for key in keys:
            was = coordinator(key_type, key, nodes)
            now = coordinator(key_type, key, nodes - {dead})
            assert now != dead
            if was != dead:
                assert now == was


def test_coordinators_spread_over_every_node() -> None:
    nodes = {0, 1, 2}
    assert {coordinator(0, f"group-{i}", nodes) for i in range(60)} == nodes
    assert {coordinator(1, f"txn-{i}", nodes) for i in range(60)} == nodes


def test_no_node_no_answer() -> None:
    assert leaders("t", 3, set()) == []
    assert coordinator(0, "g", []) is None
    assert controller([]) is None


def _bound_binds(topic: str, partitions: int, nodes: set[int]) -> bool:
    """Whether some partition's heaviest node was passed over for the bound."""
    from app.placement import partition_key, ranking

    led = leaders(topic, partitions, nodes)
    return any(ranking(partition_key(topic, p), nodes)[0] != led[p] for p in range(partitions))
