"""consumer_group_lag (version 2, migration 0028) shows each partition's member, classic
or consumer protocol (KIP-848) alike, the group's type, and the partitions a member is
assigned but has not committed; ``kip98 groups describe`` reads it (docs/sql.md)."""

from __future__ import annotations

import json
import time
from typing import Any

import confluent_kafka as ck
import pytest
from sqlalchemy import text

from app.broker import Broker
from tests.helpers.cli_runner import run_kip98

HANG_GUARD_S = 120
LAG = (
    "SELECT topic, partition, committed_offset, lag, group_type, member_id, client_id, "
    "member_epoch FROM consumer_group_lag WHERE group_id = :g ORDER BY topic, partition"
)

pytestmark = pytest.mark.broker(topics={"lag-in": 2})


def _rows(broker: Broker, group: str) -> list[Any]:
    with broker.engine.connect() as conn:
        return list(conn.execute(text(LAG), {"g": group}).all())


def _consumer(server: str, group: str, protocol: str) -> ck.Consumer:
    c = ck.Consumer(
        {"bootstrap.servers": server, "group.id": group, "group.protocol": protocol,
         "client.id": f"{protocol}-reader", "enable.auto.commit": False,
         "auto.offset.reset": "earliest"}
    )  # fmt: skip
    c.subscribe(["lag-in"])
    return c


def _assigned(c: ck.Consumer, broker: Broker, group: str, partitions: int) -> None:
    """Poll until the client holds ``partitions`` and the view lists that many members'
    rows (a classic member's assignment is in once its SyncGroup is)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        c.poll(0.2)
        rows = _rows(broker, group)
        if (
            len(c.assignment()) == partitions
            and sum(r.member_id is not None for r in rows) == partitions
        ):
            return
    raise AssertionError(f"{group}: not assigned within {HANG_GUARD_S} s: {_rows(broker, group)}")


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_the_member_holding_each_partition_and_its_lag(
    server: str, broker: Broker, protocol: str
) -> None:
    producer = ck.Producer({"bootstrap.servers": server})
    for i in range(6):
        producer.produce("lag-in", b"v", partition=i % 2)
    assert producer.flush(30) == 0
    group = f"lag-{protocol}"
    c = _consumer(server, group, protocol)
    try:
        _assigned(c, broker, group, 2)
        # Assigned, nothing committed: a row each, its offset and lag NULL.
        rows = _rows(broker, group)
        member = rows[0].member_id
        assert [(r.partition, r.committed_offset, r.lag, r.group_type, r.client_id)
                for r in rows] == [(0, None, None, protocol, f"{protocol}-reader"),
                                   (1, None, None, protocol, f"{protocol}-reader")]  # fmt: skip
        assert {r.member_id for r in rows} == {member} and member
        epochs = {r.member_epoch for r in rows}
        assert epochs == {None} if protocol == "classic" else (epochs.pop() or 0) >= 1
        c.commit(offsets=[ck.TopicPartition("lag-in", 0, 1)], asynchronous=False)
        rows = _rows(broker, group)
        assert [(r.partition, r.committed_offset, r.lag, r.member_id) for r in rows] == [
            (0, 1, 2, member), (1, None, None, member)
        ]  # fmt: skip
        described = json.loads(run_kip98("groups", "describe", group, "--output", "json").stdout)
        assert [(d["partition"], d["current_offset"], d["lag"], d["consumer_id"], d["type"])
                for d in described] == [(0, 1, 2, member, protocol),
                                        (1, None, None, member, protocol)]  # fmt: skip
    finally:
        c.close()
    # The member gone, its committed offset stays, with no member; the unread row goes.
    deadline = time.monotonic() + HANG_GUARD_S
    while [(r.partition, r.member_id) for r in _rows(broker, group)] != [(0, None)]:
        assert time.monotonic() < deadline, _rows(broker, group)
        time.sleep(0.2)


def test_a_committed_partition_appears_once_whoever_holds_it(broker: Broker) -> None:
    """Two classic members whose stale assignments name one partition (a rebalance under
    way): the partition's row is one, so a group's summed lag counts it once."""
    with broker.engine.begin() as conn:
        conn.execute(text("UPDATE partitions SET next_offset = 10 WHERE topic = 'lag-in'"))
        conn.execute(text(
            "INSERT INTO group_offsets (group_id, topic, partition, committed_offset, metadata,"
            " commit_ms) VALUES ('two', 'lag-in', 0, 4, ''::bytea, 0)"
        ))  # fmt: skip
        conn.execute(text("INSERT INTO consumer_groups (group_id) VALUES ('two')"))
        for member in ("m1", "m2"):
            conn.execute(
                text("INSERT INTO group_members (group_id, member_id, generation_id, topics, "
                     "assignment, session_timeout_ms, last_heartbeat_ms, joined_ms) "
                     "VALUES ('two', :m, 1, '[\"lag-in\"]', CAST(:a AS jsonb), 10000, 0, 0)"),
                {"m": member, "a": json.dumps([["lag-in", 0]])},
            )  # fmt: skip
        total = conn.execute(
            text("SELECT sum(lag), count(*) FROM consumer_group_lag WHERE group_id = 'two'")
        ).one()
    assert tuple(total) == (6, 1)
    assert [(r.partition, r.member_id) for r in _rows(broker, "two")] == [(0, "m1")]
