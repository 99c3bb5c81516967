"""Node registrations on the real database (docs/design.md rule 46), time moved by a
manual clock: ids claimed race-free, a live node's id refused with nothing written, a
lapsed lease's node gone for every reader and its row removed, a heartbeat renewing only
a lease that has not lapsed."""

from __future__ import annotations

import threading
import uuid

import pytest
from sqlalchemy import text

from app import placement
from app.broker import Broker
from app.clock import ManualClock
from app.errors import KafkaError
from app.log.topics import create_topic
from app.protocol import (
    ANY_NODE_ID,
    COORDINATOR_GROUP,
    BrokerHeartbeatRequest,
    BrokerRegistrationRequest,
    CreatePartitionsRequest,
    DescribeClusterRequest,
    JoinGroupRequest,
    NodeEndpoint,
    PartitionCount,
    UnregisterBrokerRequest,
)
from app.server.node import Member
from app.server.registration import Registration, ServeError
from app.settings import BrokerSettings

TIMEOUT_MS = 6_000


def _broker(db_url: str, clock: ManualClock) -> Broker:
    return Broker.connect(
        db_url, clock=clock, settings=BrokerSettings(node_session_timeout_ms=TIMEOUT_MS)
    )


def _register(broker: Broker, node_id: int = ANY_NODE_ID, port: int = 9092) -> tuple[int, str, int]:
    """(error code, incarnation, node id)."""
    incarnation = str(uuid.uuid4())
    answer = broker.handle(
        BrokerRegistrationRequest(
            node_id, incarnation, (NodeEndpoint("PLAINTEXT", "127.0.0.1", port),), "r1", "h", port
        )
    )
    return answer.error_code, incarnation, answer.node_id


def _live(broker: Broker) -> list[int]:
    return [n.node_id for n in broker.handle(DescribeClusterRequest()).nodes]


def _rows(broker: Broker) -> list[tuple[int, str, int]]:
    with broker.engine.connect() as conn:
        return [
            (r.node_id, str(r.incarnation), r.expires_ms)
            for r in conn.execute(text("SELECT * FROM broker_registrations ORDER BY node_id"))
        ]


def test_the_database_assigns_the_smallest_free_id(db_url: str) -> None:
    broker = _broker(db_url, ManualClock())
    assert [_register(broker)[2] for _ in range(3)] == [0, 1, 2]
    _register(broker, 5)
    assert _live(broker) == [0, 1, 2, 5]
    gone = _rows(broker)[1]
    broker.handle(UnregisterBrokerRequest(gone[0], gone[1]))
    assert _live(broker) == [0, 2, 5]
    assert _register(broker)[2] == 1
    assert _register(broker)[2] == 3


def test_two_nodes_starting_at_once_get_different_ids(db_url: str) -> None:
    broker = _broker(db_url, ManualClock())
    for _ in range(5):
        start = threading.Barrier(4)
        got: list[tuple[int, int]] = []

        def join(start: threading.Barrier, got: list[tuple[int, int]]) -> None:
            start.wait()
            code, _, node_id = _register(broker)
            got.append((code, node_id))

        threads = [threading.Thread(target=join, args=(start, got)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [code for code, _ in got] == [0] * 4
        assert len({node_id for _, node_id in got}) == 4
    assert _live(broker) == list(range(20))


def test_a_live_nodes_id_is_refused_and_nothing_is_written(db_url: str) -> None:
    clock = ManualClock()
    broker = _broker(db_url, clock)
    code, incarnation, node_id = _register(broker, 7)
    assert (code, node_id) == (0, 7)
    before = _rows(broker)
    answer = broker.handle(
        BrokerRegistrationRequest(7, str(uuid.uuid4()), (NodeEndpoint("PLAINTEXT", "h2", 1),))
    )
    assert answer.error_code == KafkaError.DUPLICATE_BROKER_REGISTRATION
    assert "node id 7 is held by a live node (PLAINTEXT://127.0.0.1:9092; process 9092 on h)" in (
        answer.error_message or ""
    )
    assert _rows(broker) == before
    # The holder registering again (a retry) is no conflict.
    again = broker.handle(
        BrokerRegistrationRequest(7, incarnation, (NodeEndpoint("PLAINTEXT", "127.0.0.1", 9092),))
    )
    assert (again.error_code, again.node_id) == (0, 7)
    # Once its lease has lapsed, the id is free.
    clock.advance(TIMEOUT_MS)
    code, newer, node_id = _register(broker, 7)
    assert (code, node_id) == (0, 7)
    assert [(n, i) for n, i, _ in _rows(broker)] == [(7, newer)]


def test_a_lapsed_node_is_removed_by_the_next_heartbeat_or_the_first_reader(
    db_url: str,
) -> None:
    clock = ManualClock()
    broker = _broker(db_url, clock)
    _, first, _ = _register(broker)
    _, second, _ = _register(broker)
    clock.advance(TIMEOUT_MS - 1)
    assert broker.handle(BrokerHeartbeatRequest(0, first, requests=12)).error_code == 0
    assert _live(broker) == [0, 1]
    clock.advance(1)  # node 1's lease lapses now; node 0's was renewed
    assert [n for n, _, _ in _rows(broker)] == [0, 1]  # nobody has looked yet
    assert broker.handle(BrokerHeartbeatRequest(0, first)).error_code == 0
    assert [n for n, _, _ in _rows(broker)] == [0]
    _register(broker)
    clock.advance(TIMEOUT_MS - 1)
    assert broker.handle(BrokerHeartbeatRequest(0, first)).error_code == 0
    clock.advance(1)  # node 1 (again) lapses; a reader sees it before any heartbeat
    assert _live(broker) == [0]
    assert [n for n, _, _ in _rows(broker)] == [0]  # the reader removed it first
    # The lapsed node's heartbeat is refused: it must register again.
    late = broker.handle(BrokerHeartbeatRequest(1, second))
    assert late.error_code == KafkaError.STALE_BROKER_EPOCH
    assert broker.handle(BrokerRegistrationRequest(1, second, ())).node_id == 1
    assert _live(broker) == [0, 1]


def test_a_heartbeat_does_not_revive_a_lapsed_lease(db_url: str) -> None:
    clock = ManualClock()
    broker = _broker(db_url, clock)
    _, incarnation, _ = _register(broker)
    clock.advance(TIMEOUT_MS)
    assert broker.handle(BrokerHeartbeatRequest(0, incarnation)).error_code == (
        KafkaError.STALE_BROKER_EPOCH
    )
    assert _live(broker) == [] and _rows(broker) == []


def test_unregister_leaves_another_holder_of_the_id_alone(db_url: str) -> None:
    clock = ManualClock()
    broker = _broker(db_url, clock)
    _, old, _ = _register(broker, 3)
    clock.advance(TIMEOUT_MS)
    _, new, _ = _register(broker, 3)
    stale = broker.handle(UnregisterBrokerRequest(3, old))
    assert stale.error_code == KafkaError.STALE_BROKER_EPOCH
    assert _live(broker) == [3]
    assert broker.handle(UnregisterBrokerRequest(3, new)).error_code == 0
    assert _live(broker) == []


def test_describe_cluster_gives_each_nodes_registration(db_url: str) -> None:
    clock = ManualClock()
    broker = _broker(db_url, clock)
    create_topic(broker, "t", 2)
    _register(broker, port=1111)
    clock.advance(500)
    [node] = broker.handle(DescribeClusterRequest()).nodes
    assert node.endpoint("PLAINTEXT") == NodeEndpoint("PLAINTEXT", "127.0.0.1", 1111)
    assert node.endpoint("SSL") is None
    assert (node.rack, node.host, node.pid) == ("r1", "h", 1111)
    assert node.expires_ms == node.registered_ms + TIMEOUT_MS


def _epochs(broker: Broker, topic: str) -> list[int]:
    with broker.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT leader_epoch FROM partitions WHERE topic = :t ORDER BY partition"),
            {"t": topic},
        )
        return [r.leader_epoch for r in rows]


def _leaders(topic: str, partitions: int, nodes: list[int]) -> list[int]:
    return placement.leaders(topic, partitions, nodes)


def test_a_partitions_leader_epoch_moves_exactly_when_its_leader_does(db_url: str) -> None:
    """Every change of the live nodes bumps the epoch of each partition whose leader it
    moves, and of no other, in the change's own DB transaction: a Metadata answer never
    shows a new leader under an old epoch. Fails if the bump is left out or given to every
    partition."""
    clock = ManualClock()
    broker = _broker(db_url, clock)
    create_topic(broker, "t", 24)
    assert _epochs(broker, "t") == [0] * 24

    def check(before: list[int], after: list[int], was: list[int]) -> list[int]:
        old, new = _leaders("t", 24, before), _leaders("t", 24, after)
        now = _epochs(broker, "t")
        assert now == [e + (not old or not new or o != n) for e, o, n in
                       zip(was, old or [None] * 24, new or [None] * 24, strict=True)]  # fmt: skip
        return now

    _, first, _ = _register(broker)  # no leader before: every partition gets one
    epochs = check([], [0], [0] * 24)
    _, second, _ = _register(broker)
    epochs = check([0], [0, 1], epochs)
    assert 0 < sum(epochs) - 24 < 24  # some moved to node 1, not all
    _register(broker)
    epochs = check([0, 1], [0, 1, 2], epochs)
    broker.handle(UnregisterBrokerRequest(1, second))
    epochs = check([0, 1, 2], [0, 2], epochs)
    clock.advance(TIMEOUT_MS - 1)
    assert broker.handle(BrokerHeartbeatRequest(0, first)).error_code == 0
    clock.advance(1)  # node 2 lapses: the first reader removes it and bumps
    assert _live(broker) == [0]
    epochs = check([0, 2], [0], epochs)
    with broker.engine.connect() as conn:
        history = conn.execute(
            text("SELECT count(*) FROM partition_leader_epochs WHERE topic = 't'")
        ).scalar_one()
    assert history == sum(e + 1 for e in epochs)  # each epoch noted with where it began


def test_a_topic_growing_bumps_the_epoch_of_a_partition_whose_leader_it_moves(
    db_url: str,
) -> None:
    """The leaders' bound grows with a topic: with five nodes, "t" growing from seven to
    eight partitions moves one of the seven's leaders, which gets a new epoch; the others
    keep theirs."""
    broker = _broker(db_url, ManualClock())
    create_topic(broker, "t", 7)
    for _ in range(5):
        _register(broker)
    was, now = _leaders("t", 7, list(range(5))), _leaders("t", 8, list(range(5)))[:7]
    assert sum(a != b for a, b in zip(was, now, strict=True)) == 1
    before = _epochs(broker, "t")
    grown = broker.handle(CreatePartitionsRequest([PartitionCount("t", 8)]))
    assert grown.results[0].error_code == 0
    after = _epochs(broker, "t")
    assert after == [e + (a != b) for e, a, b in zip(before, was, now, strict=True)] + [0]


def _heartbeats(broker: Broker) -> dict[str, int]:
    with broker.engine.connect() as conn:
        rows = conn.execute(text("SELECT group_id, last_heartbeat_ms FROM group_members"))
        return {r.group_id: r.last_heartbeat_ms for r in rows}


def test_a_group_whose_coordinator_moves_gives_its_members_a_fresh_session(
    db_url: str,
) -> None:
    """As Kafka's new coordinator does when it loads a group: a member could not heartbeat
    while its coordinator was gone, so the move starts its session afresh; a group whose
    coordinator stayed keeps its members' last heartbeats. Fails without the refresh."""
    clock = ManualClock()
    broker = _broker(db_url, clock)
    create_topic(broker, "t", 1)
    _register(broker)
    _, second, _ = _register(broker)
    groups = [f"g{i}" for i in range(12)]
    for g in groups:
        assert broker.handle(JoinGroupRequest(g, "", ["t"], 30_000)).error_code == 0
    joined = _heartbeats(broker)
    moving = {
        g for g in groups
        if placement.coordinator(COORDINATOR_GROUP, g, [0, 1])
        != placement.coordinator(COORDINATOR_GROUP, g, [0])
    }  # fmt: skip
    assert moving and moving != set(groups)
    clock.advance(5_000)
    broker.handle(UnregisterBrokerRequest(1, second))
    now = clock.now_ms()
    assert _heartbeats(broker) == {g: now if g in moving else joined[g] for g in groups}


def _node(broker: Broker, node_id: int = ANY_NODE_ID) -> Registration:
    registration = Registration(broker, Member(), node_id)
    registration.endpoints = (NodeEndpoint("PLAINTEXT", "127.0.0.1", 9092),)
    registration.join()
    return registration


def test_a_node_cut_off_past_its_lease_registers_again_under_its_id_if_it_is_free(
    db_url: str,
) -> None:
    clock = ManualClock()
    broker = _broker(db_url, clock)
    node = _node(broker)
    clock.advance(TIMEOUT_MS)
    assert _live(broker) == []
    node.heartbeat()
    assert node.member.node_id == 0 and _live(broker) == [0]


def test_a_node_whose_id_was_taken_meanwhile_takes_another_if_the_database_chose_it(
    db_url: str,
) -> None:
    clock = ManualClock()
    broker = _broker(db_url, clock)
    cut_off = _node(broker)
    clock.advance(TIMEOUT_MS)
    newcomer = _node(broker)
    assert newcomer.member.node_id == 0
    cut_off.heartbeat()
    assert cut_off.member.node_id == 1 and _live(broker) == [0, 1]


def test_a_node_whose_given_id_was_taken_meanwhile_stops(db_url: str) -> None:
    clock = ManualClock()
    broker = _broker(db_url, clock)
    cut_off = _node(broker, 5)
    clock.advance(TIMEOUT_MS)
    _node(broker, 5)
    with pytest.raises(ServeError, match="node id 5 is held by a live node"):
        cut_off.heartbeat()
    [(node_id, incarnation, _)] = _rows(broker)
    assert node_id == 5 and incarnation != cut_off.incarnation
