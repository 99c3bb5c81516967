"""KIP-320's committed leader epoch over the wire: kept with the offset by OffsetCommit
and by TxnOffsetCommit (pending until the COMMIT marker, gone on ABORT), handed back by
OffsetFetch, so librdkafka's committed() gives what was committed; the native client and
a rebuild of the projections from the commit log keep it too. Against a real
``kip98 serve``."""

from __future__ import annotations

import confluent_kafka as ck

from app.broker import Broker
from app.client import Consumer, TopicPartition
from app.groups.rebuild import compute_group_offsets, live_group_offsets
from app.log.topics import create_topic
from tests.helpers.wire_client import serving


def _committed(c: ck.Consumer, n: int) -> list[tuple[int, int | None]]:
    fetched = c.committed([ck.TopicPartition("t", p) for p in range(n)], timeout=30)
    return [(tp.offset, tp.leader_epoch) for tp in fetched]


def test_committed_leader_epoch_round_trips(db_url: str) -> None:
    broker = Broker.connect(db_url)
    create_topic(broker, "t", 3)
    with serving(db_url) as server:
        c = ck.Consumer({"bootstrap.servers": server, "group.id": "g",
                         "enable.auto.commit": False})  # fmt: skip
        try:
            c.commit(
                offsets=[ck.TopicPartition("t", 0, 5, leader_epoch=3),
                         ck.TopicPartition("t", 1, 6)],
                asynchronous=False,
            )  # fmt: skip
            assert _committed(c, 2) == [(5, 3), (6, None)]

            p = ck.Producer({"bootstrap.servers": server, "transactional.id": "tx"})
            p.init_transactions(30)
            p.begin_transaction()
            p.send_offsets_to_transaction(
                [ck.TopicPartition("t", 1, 8, leader_epoch=7),
                 ck.TopicPartition("t", 2, 9, leader_epoch=2)],
                c.consumer_group_metadata(), 30,
            )  # fmt: skip
            # Pending until the marker: the pending epochs are held, not yet committed.
            with broker.engine.connect() as conn:
                pending = live_group_offsets(conn)["pending_txn_offsets"]
            assert sorted((r[2], r[5], r[8]) for r in pending) == [(1, 8, 7), (2, 9, 2)]
            p.commit_transaction(30)
            assert _committed(c, 3) == [(5, 3), (8, 7), (9, 2)]

            p.begin_transaction()
            p.send_offsets_to_transaction(
                [ck.TopicPartition("t", 2, 11, leader_epoch=4)], c.consumer_group_metadata(), 30
            )
            p.abort_transaction(30)
            assert _committed(c, 3) == [(5, 3), (8, 7), (9, 2)]
        finally:
            c.close()

    # The native client reads what the wire committed, and commits epochs of its own.
    with Consumer({"database.url": db_url, "group.id": "g"}) as native:
        got = native.committed([TopicPartition("t", p) for p in range(3)])
        assert [(tp.offset, tp.leader_epoch) for tp in got] == [(5, 3), (8, 7), (9, 2)]
    with Consumer({"database.url": db_url, "group.id": "n"}) as native:
        native.assign([TopicPartition("t", 0)])
        native.commit(offsets=[TopicPartition("t", 0, 4, leader_epoch=6)], asynchronous=False)
        [tp] = native.committed([TopicPartition("t", 0)])
        assert (tp.offset, tp.leader_epoch) == (4, 6)

    # A rebuild from offset_commit_log gives the epochs back as the projections hold them.
    with broker.engine.connect() as conn:
        live = live_group_offsets(conn)
        assert compute_group_offsets(conn) == live
    assert {(r[0], r[2], r[3], r[6]) for r in live["group_offsets"]} == {
        ("g", 0, 5, 3), ("g", 1, 8, 7), ("g", 2, 9, 2), ("n", 0, 4, 6),
    }  # fmt: skip
