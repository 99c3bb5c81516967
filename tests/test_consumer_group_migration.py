"""KIP-848's online conversion through ``kip98 serve``, spoken raw: a classic group with a
member becomes a consumer group when a consumer-protocol member joins, its classic member
answered by JoinGroup, SyncGroup and Heartbeat from the consumer group's assignment; and
it goes back to classic when the last consumer-protocol member leaves
(``KIP98_GROUP_CONSUMER_MIGRATION_POLICY``; docs/design.md rule 66)."""

from __future__ import annotations

import os
import struct
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kio.index import load_request_schema
from sqlalchemy import text

from app.broker import Broker
from app.errors import KafkaError
from app.log.topics import create_topic
from app.server.codec import build, read_versioned
from tests.helpers.cli_runner import KIP98_BIN
from tests.helpers.wire_client import exchange, serving

JOIN, SYNC, HEARTBEAT_CLASSIC, LEAVE, DESCRIBE_GROUPS = 11, 14, 12, 13, 15
HEARTBEAT, DESCRIBE = 68, 69


def call(server: str, api_key: int, version: int, values: dict[str, Any]) -> Any:
    return exchange(server, api_key, version, build(load_request_schema(api_key, version), values))


def subscription(topics: list[str]) -> bytes:
    """A ConsumerProtocolSubscription v0: what an eager classic consumer sends."""
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


def assignment_bytes(partitions: dict[str, list[int]]) -> bytes:
    out = struct.pack(">hi", 0, len(partitions))
    for t, ps in partitions.items():
        out += struct.pack(">h", len(t)) + t.encode() + struct.pack(">i", len(ps))
        out += b"".join(struct.pack(">i", p) for p in ps)
    return out + struct.pack(">i", -1)


def decoded(assignment: bytes) -> set[tuple[str, int]]:
    from kio.schema.consumer_protocol_assignment.v0.data import ConsumerProtocolAssignment

    a = read_versioned(ConsumerProtocolAssignment, assignment)
    return {(tp.topic, int(p)) for tp in a.assigned_partitions for p in tp.partitions}


def classic_join(server: str, group: str, member: str, topics: list[str]) -> Any:
    return call(server, JOIN, 5, {
        "group_id": group, "session_timeout": 30000, "rebalance_timeout": 30000,
        "member_id": member, "group_instance_id": None, "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": subscription(topics)}],
    })  # fmt: skip


def classic_sync(
    server: str, group: str, member: str, generation: int, plan: dict[str, bytes] | None = None
) -> Any:
    return call(server, SYNC, 5, {
        "group_id": group, "generation_id": generation, "member_id": member,
        "group_instance_id": None, "protocol_type": "consumer", "protocol_name": "range",
        "assignments": [{"member_id": m, "assignment": a} for m, a in (plan or {}).items()],
    })  # fmt: skip


def classic_heartbeat(server: str, group: str, member: str, generation: int) -> int:
    answer = call(server, HEARTBEAT_CLASSIC, 4, {
        "group_id": group, "generation_id": generation, "member_id": member,
        "group_instance_id": None,
    })  # fmt: skip
    return int(answer.error_code)


def beat(server: str, group: str, member: str, epoch: int, **fields: Any) -> Any:
    values = {"group_id": group, "member_id": member, "member_epoch": epoch,
              "rebalance_timeout": fields.pop("rebalance_timeout", -1),
              "topic_partitions": None, **fields}  # fmt: skip
    return call(server, HEARTBEAT, 1, values)


def consumer_join(server: str, group: str, member: str, topics: list[str]) -> Any:
    return beat(
        server, group, member, 0, rebalance_timeout=30000, subscribed_topic_names=topics,
        topic_partitions=[],
    )  # fmt: skip


def names(answer: Any, ids: dict[Any, str]) -> set[tuple[str, int]]:
    return {
        (ids[tp.topic_id], int(p)) for tp in answer.assignment.topic_partitions
        for p in tp.partitions
    }  # fmt: skip


def topic_ids(broker: Broker) -> dict[Any, str]:
    with broker.engine.connect() as conn:
        rows = conn.execute(text("SELECT topic, topic_id FROM topics")).all()
    return {uuid.UUID(str(r.topic_id)): r.topic for r in rows}


def stable_classic_group(server: str, group: str, topic: str, partitions: int) -> tuple[str, int]:
    """One classic member owning every partition: its member id and generation."""
    first = classic_join(server, group, "", [topic])
    assert first.error_code == KafkaError.MEMBER_ID_REQUIRED
    joined = classic_join(server, group, first.member_id, [topic])
    assert joined.error_code == 0 and joined.leader == joined.member_id
    plan = {joined.member_id: assignment_bytes({topic: list(range(partitions))})}
    synced = classic_sync(server, group, joined.member_id, joined.generation_id, plan)
    assert synced.error_code == 0
    return joined.member_id, joined.generation_id


def events(broker: Broker, group: str) -> list[str]:
    with broker.engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT kind FROM consumer_group_events WHERE group_id = :g ORDER BY event_id"
                ),
                {"g": group},
            ).scalars()
        )


def test_a_classic_group_is_upgraded_shared_and_downgraded(server: str, broker: Broker) -> None:
    create_topic(broker, "mig", 4)
    ids = topic_ids(broker)
    c, generation = stable_classic_group(server, "g", "mig", 4)
    # A consumer-protocol member joins: the group becomes a consumer group at the classic
    # generation, bumped by the join; the new member waits for the classic member's
    # partitions (none free yet).
    a = str(uuid.uuid4())
    joined = consumer_join(server, "g", a, ["mig"])
    assert joined.error_code == 0, joined.error_message
    assert joined.member_epoch == generation + 1
    assert names(joined, ids) == set()
    described = call(server, DESCRIBE, 0, {"group_ids": ["g"]}).groups[0]
    assert (described.error_code, described.group_epoch) == (0, generation + 1)
    epochs = {m.member_id: m.member_epoch for m in described.members}
    assert epochs == {c: generation, a: generation + 1}
    # The classic member is told to rejoin; it does, and syncs for its share.
    assert classic_heartbeat(server, "g", c, generation) == KafkaError.REBALANCE_IN_PROGRESS
    rejoined = classic_join(server, "g", c, ["mig"])
    assert rejoined.error_code == 0
    assert (rejoined.generation_id, rejoined.leader, rejoined.protocol_name) == (
        generation + 1, "", "range",
    )  # fmt: skip
    assert list(rejoined.members) == []
    synced = classic_sync(server, "g", c, rejoined.generation_id)
    assert synced.error_code == 0
    classic_owns = decoded(synced.assignment)
    assert classic_heartbeat(server, "g", c, rejoined.generation_id) == 0
    stale = classic_sync(server, "g", c, generation)
    assert stale.error_code == KafkaError.ILLEGAL_GENERATION
    # The consumer-protocol member now gets the partitions let go: no partition twice.
    got = beat(server, "g", a, joined.member_epoch)
    assert got.error_code == 0
    consumer_owns = names(got, ids)
    assert len(classic_owns) == len(consumer_owns) == 2
    assert classic_owns | consumer_owns == {("mig", p) for p in range(4)}
    # The last consumer-protocol member leaves: back to classic, rebalancing.
    assert beat(server, "g", a, -1).error_code == 0
    group = call(server, DESCRIBE_GROUPS, 5, {"groups": ["g"], "include_authorized_operations": False}).groups[0]  # fmt: skip
    assert (group.group_state, group.protocol_type) == ("PreparingRebalance", "consumer")
    assert [m.member_id for m in group.members] == [c]
    gone = call(server, DESCRIBE, 0, {"group_ids": ["g"]}).groups[0]
    assert gone.error_code == KafkaError.GROUP_ID_NOT_FOUND
    assert classic_heartbeat(server, "g", c, rejoined.generation_id) == (
        KafkaError.REBALANCE_IN_PROGRESS
    )
    again = classic_join(server, "g", c, ["mig"])
    assert again.error_code == 0 and again.leader == c
    assert again.generation_id == rejoined.generation_id + 1
    kinds = events(broker, "g")
    assert "converted_from_classic" in kinds and kinds[-1] == "converted_to_classic"


@pytest.fixture
def upgrade_disabled(db_url: str) -> Iterator[str]:
    env = {"KIP98_GROUP_CONSUMER_MIGRATION_POLICY": "downgrade"}
    with serving(db_url, env=env) as address:
        yield address


def test_the_policy_refuses_an_upgrade_as_kafka_does(upgrade_disabled: str, broker: Broker) -> None:
    create_topic(broker, "mig", 2)
    stable_classic_group(upgrade_disabled, "g", "mig", 2)
    refused = consumer_join(upgrade_disabled, "g", str(uuid.uuid4()), ["mig"])
    assert refused.error_code == KafkaError.GROUP_ID_NOT_FOUND
    assert refused.error_message == (
        "Cannot upgrade classic group g to consumer group because online upgrade is disabled."
    )


def test_a_group_of_another_protocol_type_is_not_upgraded(server: str, broker: Broker) -> None:
    first = call(server, JOIN, 5, {
        "group_id": "connect", "session_timeout": 30000, "rebalance_timeout": 30000,
        "member_id": "", "group_instance_id": None, "protocol_type": "connect",
        "protocols": [{"name": "sessioned", "metadata": b"x"}],
    })  # fmt: skip
    joined = call(server, JOIN, 5, {
        "group_id": "connect", "session_timeout": 30000, "rebalance_timeout": 30000,
        "member_id": first.member_id, "group_instance_id": None, "protocol_type": "connect",
        "protocols": [{"name": "sessioned", "metadata": b"x"}],
    })  # fmt: skip
    assert joined.error_code == 0
    refused = consumer_join(server, "connect", str(uuid.uuid4()), ["t"])
    assert refused.error_code == KafkaError.GROUP_ID_NOT_FOUND
    assert "does not use the consumer embedded protocol" in refused.error_message


def test_an_unknown_policy_stops_serve_with_one_line(db_url: str) -> None:
    setting = "KIP98_GROUP_CONSUMER_MIGRATION_POLICY"
    result = subprocess.run(
        [str(KIP98_BIN), "serve", "--listen", "127.0.0.1:0"], capture_output=True, text=True,
        timeout=120, input="", env={**os.environ, setting: "sideways"},
    )  # fmt: skip
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1, result.stderr
    assert setting in lines[0]


# Real clients: librdkafka's classic consumer (eager, range) and its consumer-protocol
# consumer in one group. The consumer protocol's session and interval are the broker's.
MIXED_ENV = {
    "KIP98_GROUP_CONSUMER_SESSION_TIMEOUT_MS": "6000",
    "KIP98_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": "500",
}
HANG_GUARD_S = 180


@pytest.fixture
def mixed_server(db_url: str) -> Iterator[str]:
    with serving(db_url, env=MIXED_ENV) as address:
        yield address


def _client(server: str, protocol: str, strategy: str = "range") -> Any:
    import confluent_kafka as ck

    config = {"bootstrap.servers": server, "group.id": "mixed", "group.protocol": protocol,
              "client.id": protocol, "enable.auto.commit": False,
              "auto.offset.reset": "earliest"}  # fmt: skip
    if protocol == "classic":
        config |= {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                   "partition.assignment.strategy": strategy}  # fmt: skip
    c = ck.Consumer(config)
    c.subscribe(["mixed"])
    return c


def _produce(server: str, keys: list[str]) -> None:
    import confluent_kafka as ck

    producer = ck.Producer({"bootstrap.servers": server})
    for i, key in enumerate(keys):
        producer.produce("mixed", key=key, value=b"v", partition=i % 4)
    assert producer.flush(30) == 0


def _commit(c: Any, m: Any, deadline: float) -> None:
    """A record's offset committed before the next poll. A classic group's commit while it
    completes a rebalance is REBALANCE_IN_PROGRESS, and librdkafka's commit sent just
    after its JoinGroup carries the generation that join ended, ILLEGAL_GENERATION (Kafka
    answers both so too): sent again until the rebalance is done, as a cooperative
    member keeps its partitions meanwhile."""
    import confluent_kafka as ck

    again = (ck.KafkaError.REBALANCE_IN_PROGRESS, ck.KafkaError.ILLEGAL_GENERATION)
    while True:
        try:
            c.commit(message=m, asynchronous=False)
            return
        except ck.KafkaException as exc:
            if exc.args[0].code() not in again:
                raise
            assert time.monotonic() < deadline, "hang guard"
            time.sleep(0.1)


def _consume(
    consumers: list[Any], seen: dict[str, list[str]], until: Any, overlaps: list[Any]
) -> None:
    """Each consumer polls in turn, committing every record before the next poll, until
    ``until()``; at every turn the partitions the two hold must not overlap."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not until() and time.monotonic() < deadline:
        for c in consumers:
            m = c.poll(0.1)
            if m is not None and not m.error():
                _commit(c, m, deadline)
                seen[m.key().decode()].append(c.memberid() or "?")
        held = [{(tp.topic, tp.partition) for tp in c.assignment()} for c in consumers]
        if len(held) == 2 and held[0] & held[1]:
            overlaps.append(held)
    assert until(), "hang guard"


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_a_classic_and_a_consumer_protocol_member_share_a_topic(
    mixed_server: str, db_url: str, strategy: str
) -> None:
    """librdkafka's classic consumer (eager range, or cooperative-sticky: its rejoin says
    what it still owns) alone, then a consumer-protocol consumer joins (the group is
    upgraded online), then it leaves (downgraded): every record consumed once, no
    partition held by both at once."""
    broker = Broker.connect(db_url)
    create_topic(broker, "mixed", 4)
    first = [f"a{i}" for i in range(20)]
    _produce(mixed_server, first)
    seen: dict[str, list[str]] = {k: [] for k in first}
    overlaps: list[Any] = []
    classic = _client(mixed_server, "classic", strategy)
    consumer = None
    try:
        _consume([classic], seen, lambda: sum(map(len, seen.values())) >= 4, overlaps)
        consumer = _client(mixed_server, "consumer")
        second = [f"b{i}" for i in range(40)]
        seen |= {k: [] for k in second}
        _produce(mixed_server, second)

        def both_took_part() -> bool:
            """Every record so far consumed, by both, and the group settled (each member
            at the group epoch), so the downgrade below starts from a settled group."""
            done = all(seen.values())
            takers = {m for k in second for m in seen[k]}
            if not (done and len(takers) == 2 and classic.assignment()):
                return False
            group = call(mixed_server, DESCRIBE, 0, {"group_ids": ["mixed"]}).groups[0]
            epochs = {m.member_epoch for m in group.members}
            return group.group_state == "Stable" and epochs == {group.group_epoch}

        _consume([classic, consumer], seen, both_took_part, overlaps)
        consumer.close()
        consumer = None
        third = [f"c{i}" for i in range(20)]
        seen |= {k: [] for k in third}
        _produce(mixed_server, third)
        _consume([classic], seen, lambda: all(seen.values()), overlaps)
        assert {k: len(v) for k, v in seen.items() if len(v) != 1} == {}, "each once"
        assert overlaps == [], "no partition held by two members at once"
        assert len(classic.assignment()) == 4
    finally:
        classic.close()
        if consumer is not None:
            consumer.close()
    kinds = events(broker, "mixed")
    assert "converted_from_classic" in kinds and "converted_to_classic" in kinds


# In process, on the test's clock: the coordinator's timers.


def _in_process_group(b: Broker, group: str, topic: str, clock: Any) -> tuple[str, str, int]:
    """A classic member owning the topic's 2 partitions, then a consumer-protocol member
    joining (the upgrade): their ids and the group epoch."""
    from app.protocol import ConsumerGroupHeartbeatRequest as Beat
    from app.protocol import GroupProtocol, JoinGroupRequest, MemberAssignment, SyncGroupRequest

    join = JoinGroupRequest(
        group, "", [topic], 60_000, client_id="classic", protocol_type="consumer",
        protocols=(GroupProtocol("range", subscription([topic])),), rebalance_timeout_ms=20_000,
    )  # fmt: skip
    joined = b.handle(join)
    assert joined.error_code == 0 and not joined.rebalancing
    plan = {joined.member_id: MemberAssignment(
        assignment_bytes({topic: [0, 1]}), ((topic, 0), (topic, 1)))}  # fmt: skip
    synced = b.handle(SyncGroupRequest(group, joined.member_id, joined.generation_id, plan))
    assert synced.error_code == 0
    a = str(uuid.uuid4())
    first = b.handle(
        Beat(group, a, 0, rebalance_timeout_ms=30_000, subscribed_topic_names=(topic,), owned={})
    )
    assert first.error_code == 0, first.error_message
    return joined.member_id, a, first.member_epoch


def _group_type(b: Broker, group: str) -> tuple[str, str]:
    with b.engine.connect() as conn:
        row = conn.execute(
            text("SELECT group_type, state FROM consumer_groups WHERE group_id = :g"), {"g": group}
        ).one()
    return row.group_type, row.state


def test_the_coordinators_timer_downgrades_a_group_its_last_consumer_member_left(
    make_broker: Any, clock: Any
) -> None:
    """The consumer-protocol member dies (no leave): the coordinator loop's pass removes
    it past its session and, only the classic member left, turns the group back into a
    classic one, rebalancing (Kafka's session timer fences it the same way)."""
    from app.broker.loop import CoordinatorLoop
    from app.protocol import HeartbeatRequest

    b = make_broker({"tm": 2}, clock=clock, transaction_log_partitions=1)
    classic, _, epoch = _in_process_group(b, "gm", "tm", clock)
    loop = CoordinatorLoop(b)
    session = b.settings.group_consumer_session_timeout_ms
    # The classic member beats late enough that its rebalance timeout (20 s) is still
    # running when the consumer-protocol member's session (45 s) ends.
    clock.advance(session - 10_000)
    assert b.handle(HeartbeatRequest("gm", classic, epoch - 1)).error_code == (
        KafkaError.REBALANCE_IN_PROGRESS
    )
    assert _group_type(b, "gm") == ("consumer", "Reconciling")
    clock.advance(10_001)
    assert loop.run_once().expired_members == 1
    assert _group_type(b, "gm") == ("classic", "PreparingRebalance")
    kinds = events(b, "gm")
    assert kinds[-2:] == ["member_expired", "converted_to_classic"]


def test_the_coordinators_timers_fire_in_deadline_order(make_broker: Any, clock: Any) -> None:
    """Both members past a deadline in one pass: the classic member's rebalance timeout
    (22.5 + 20 s) ended before the consumer-protocol member's session (45 s), so it is
    removed first and the group is never handed to it as a classic group; whatever order
    the member ids sort in (they are random), the outcome is the same."""
    from app.broker.loop import CoordinatorLoop
    from app.protocol import HeartbeatRequest

    b = make_broker({"to": 2}, clock=clock, transaction_log_partitions=1)
    for round_ in range(4):
        group = f"go{round_}"
        classic, _, epoch = _in_process_group(b, group, "to", clock)
        session = b.settings.group_consumer_session_timeout_ms
        clock.advance(session // 2)
        told = b.handle(HeartbeatRequest(group, classic, epoch - 1))
        assert told.error_code == KafkaError.REBALANCE_IN_PROGRESS
        clock.advance(session // 2 + 1)
        assert CoordinatorLoop(b).run_once().expired_members == 2
        kinds = events(b, group)
        assert "converted_to_classic" not in kinds
        assert kinds[-2:] == ["classic_member_rebalance_timed_out", "member_expired"]


def test_a_classic_member_that_does_not_rejoin_in_its_rebalance_timeout_is_removed(
    make_broker: Any, clock: Any
) -> None:
    """Kafka's join timer: a classic member told to rejoin that only heartbeats is
    removed once its rebalance timeout has passed, and its partitions go to the
    consumer-protocol member."""
    from app.broker.loop import CoordinatorLoop
    from app.protocol import ConsumerGroupHeartbeatRequest as Beat
    from app.protocol import HeartbeatRequest

    b = make_broker({"tj": 2}, clock=clock, transaction_log_partitions=1)
    classic, a, epoch = _in_process_group(b, "gj", "tj", clock)
    loop = CoordinatorLoop(b)
    for _ in range(3):  # within its session, never past its rebalance timeout (20 s)
        told = b.handle(HeartbeatRequest("gj", classic, epoch - 1))
        assert told.error_code == KafkaError.REBALANCE_IN_PROGRESS
        assert b.handle(Beat("gj", a, epoch, owned={})).error_code == 0
        clock.advance(6_000)
    assert loop.run_once().expired_members == 0
    clock.advance(3_000)
    assert loop.run_once().expired_members == 1
    gone = b.handle(HeartbeatRequest("gj", classic, epoch - 1))
    assert gone.error_code == KafkaError.UNKNOWN_MEMBER_ID
    answer = b.handle(Beat("gj", a, epoch, owned={}))
    assert answer.assignment == {"tj": (0, 1)}
    assert "classic_member_rebalance_timed_out" in events(b, "gj")
