"""The admin SQL views agree with the handlers: committed_records is exactly the
read_committed fetch, partition_status and open_transactions mirror live state,
consumer_group_lag follows committed offsets."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import text

from app.broker import Broker
from app.broker.produce import produce
from app.groups.offsets import offset_commit
from app.log.fetch import fetch
from app.protocol import (
    READ_COMMITTED,
    RECORD_OFFSET,
    RECORD_VALUE,
    FetchRequest,
    OffsetAndMetadata,
    OffsetCommitRequest,
    ProduceRequest,
    RecordIn,
)
from tests.helpers.txn_driver import TxnDriver

pytestmark = pytest.mark.broker(topics={"v": 3})


def fetch_all(broker: Broker, topic: str, partition: int) -> list[tuple[int, bytes | None]]:
    out, offset = [], 0
    while True:
        r = fetch(broker, FetchRequest(topic, partition, offset, isolation_level=READ_COMMITTED))
        out.extend((x[RECORD_OFFSET], x[RECORD_VALUE]) for x in r.records)
        if r.next_offset == offset:
            return out
        offset = r.next_offset


def test_committed_records_is_read_committed(broker: Broker) -> None:
    rng = random.Random(7)
    drivers = [TxnDriver(broker, f"p{i}") for i in range(3)]
    for d in drivers:
        d.init()
    for i in range(120):
        d = rng.choice(drivers)
        if rng.random() < 0.2:
            produce(
                broker,
                ProduceRequest("v", rng.randint(0, 2), [RecordIn(None, f"plain{i}".encode(), 0)]),
            )
        elif rng.random() < 0.8:
            d.send("v", rng.randint(0, 2), f"t{i}")
        else:
            d.end(commit=rng.random() < 0.6)
    drivers[0].send("v", 0, "left-open")
    with broker.engine.connect() as conn:
        view = conn.execute(
            text('SELECT topic, partition, "offset", value FROM committed_records ORDER BY 1, 2, 3')
        ).all()
        status = {
            (r.topic, r.partition): r for r in conn.execute(text("SELECT * FROM partition_status"))
        }
        open_txns = conn.execute(
            text("SELECT transactional_id, state FROM open_transactions ORDER BY 1")
        ).all()
    for p in range(3):
        assert [(o, v) for t, pp, o, v in view if pp == p] == fetch_all(broker, "v", p)
    assert status[("v", 0)].open_transactions >= 1
    assert status[("v", 0)].last_stable_offset < status[("v", 0)].high_watermark
    assert ("p0", "BEGIN") in [tuple(r) for r in open_txns]


def test_consumer_group_lag(broker: Broker) -> None:
    produce(broker, ProduceRequest("v", 1, [RecordIn(None, b"x", 0)] * 10))
    offset_commit(broker, OffsetCommitRequest("g", {("v", 1): OffsetAndMetadata(4)}))
    with broker.engine.connect() as conn:
        row = conn.execute(text("SELECT * FROM consumer_group_lag WHERE group_id = 'g'")).one()
    assert (row.committed_offset, row.high_watermark, row.last_stable_offset, row.lag) == (
        4,
        10,
        10,
        6,
    )
