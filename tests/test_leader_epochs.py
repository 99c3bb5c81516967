"""Leader epochs, stored per partition with their history (Kafka's leader-epoch cache):
Metadata, Fetch, ListOffsets and OffsetForLeaderEpoch (23) all read them there, so that
moving leadership is one call (``bump_leader_epoch``). A client's stale or future epoch
is fenced or unknown; fetched batches carry the epoch they were written in; kafka-python
and librdkafka consumers, seeing a new epoch, validate their positions with
OffsetForLeaderEpoch (KIP-320) and read on. Against a real ``kip98 serve``."""

from __future__ import annotations

import datetime
import socket
import struct
import threading
import time
import urllib.request
from typing import Any

import confluent_kafka as ck
import psycopg
import pytest
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTp
from kio.schema.fetch.v12.request import FetchPartition, FetchTopic
from kio.schema.fetch.v12.request import FetchRequest as WireFetch
from kio.schema.offset_for_leader_epoch.v4.request import (
    OffsetForLeaderEpochRequest as WireEpochs,
)
from kio.schema.offset_for_leader_epoch.v4.request import (
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
)
from sqlalchemy import text

from app.broker import Broker
from app.errors import KafkaError
from app.log.leader_epoch import NO_EPOCH, NO_OFFSET, bump_leader_epoch, end_offset_for
from app.log.topics import create_topic
from app.protocol import (
    LATEST_TIMESTAMP,
    EpochQuery,
    FetchRequest,
    ListOffsetsRequest,
    MetadataRequest,
    OffsetForLeaderEpochRequest,
    ProduceRequest,
    RecordIn,
)
from app.server.process import ServeProcess, free_port
from app.storage.driver import libpq_conninfo
from tests.helpers.cluster_nodes import wait_until
from tests.helpers.wire_client import exchange, serving

# Epochs 0, 2 and 5 began at offsets 0, 10 and 25 (epochs 1, 3, 4 led nothing).
HISTORY = [(0, 0), (2, 10), (5, 25)]


@pytest.mark.parametrize(
    ("asked", "answer"),
    [
        (5, (5, 40)),  # the current epoch: the log end
        (2, (2, 25)),  # ended where epoch 5 began
        (3, (2, 25)),  # never led: the last one before it, ended where the next began
        (0, (0, 10)),
        (6, (NO_EPOCH, NO_OFFSET)),  # newer than any: unknown
        (-1, (NO_EPOCH, NO_OFFSET)),
    ],
)
def test_where_an_epoch_ended(asked: int, answer: tuple[int, int]) -> None:
    """Kafka's LeaderEpochFileCache.endOffsetFor, on a log whose end is 40."""
    assert end_offset_for(HISTORY, asked, 40) == answer
    assert end_offset_for([(3, 7)], 1, 40) == (1, 7)  # older than any: its successor's start


def _produce(broker: Broker, n: int) -> None:
    records = [RecordIn(None, f"r{i}".encode(), 0) for i in range(n)]
    assert broker.handle(ProduceRequest("t", 0, records)).error_code == 0


def _bump(broker: Broker) -> int:
    with broker.engine.begin() as conn:
        return bump_leader_epoch(conn, "t", 0)


def test_one_place_answers_every_request(db_url: str) -> None:
    broker = Broker.connect(db_url)
    create_topic(broker, "t", 2)
    _produce(broker, 3)
    assert _bump(broker) == 1
    _produce(broker, 2)
    assert _bump(broker) == 2
    assert broker.handle(MetadataRequest(["t"])).topics[0].leader_epochs == (2, 0)
    latest = broker.handle(ListOffsetsRequest("t", 0, LATEST_TIMESTAMP))
    assert (latest.offset, latest.leader_epoch) == (5, 2)
    stale = broker.handle(ListOffsetsRequest("t", 0, LATEST_TIMESTAMP, current_leader_epoch=1))
    assert stale.error_code == KafkaError.FENCED_LEADER_EPOCH
    future = broker.handle(FetchRequest("t", 0, 0, current_leader_epoch=3))
    assert future.error_code == KafkaError.UNKNOWN_LEADER_EPOCH
    fetched = broker.handle(FetchRequest("t", 0, 0, current_leader_epoch=2, batches=True))
    assert (fetched.leader_epoch, fetched.epochs, fetched.epoch_starts) == (2, (0, 1, 2), (0, 3, 5))
    answers = broker.handle(
        OffsetForLeaderEpochRequest(
            [EpochQuery("t", 0, 0), EpochQuery("t", 0, 1), EpochQuery("t", 0, 2),
             EpochQuery("t", 0, 0, current_leader_epoch=1), EpochQuery("t", 1, 0),
             EpochQuery("t", 7, 0), EpochQuery("x\x00", 0, 0)]
        )
    ).results  # fmt: skip
    assert [(a.error_code, a.leader_epoch, a.end_offset) for a in answers] == [
        (0, 0, 3), (0, 1, 5), (0, 2, 5), (KafkaError.FENCED_LEADER_EPOCH, -1, -1), (0, 0, 0),
        (KafkaError.UNKNOWN_TOPIC_OR_PARTITION, -1, -1),
        (KafkaError.UNKNOWN_TOPIC_OR_PARTITION, -1, -1),
    ]  # fmt: skip


def _batch_epochs(records: bytes) -> list[tuple[int, int]]:
    """(base offset, partition leader epoch) of each record batch."""
    out, at = [], 0
    while at < len(records):
        base, length, epoch = struct.unpack_from(">qii", records, at)
        out.append((base, epoch))
        at += 12 + length
    return out


def _requests(metrics_port: int, api: str) -> float:
    scraped = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read().decode()
    for line in scraped.splitlines():
        if line.startswith("kip98_server_requests_total{") and f'api="{api}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_wire_clients_validate_their_positions_after_a_new_epoch(db_url: str) -> None:
    """Batches come stamped with the epoch they were written in; OffsetForLeaderEpoch over
    the wire answers from the history; a kafka-python consumer, then a librdkafka one,
    reading when the epoch moves asks it (counted by the server) and reads on, nothing
    lost. The server's node registering is a new leadership of the partition already."""
    broker = Broker.connect(db_url)
    create_topic(broker, "t", 1)
    _produce(broker, 3)
    metrics = free_port()
    with serving(db_url, "--metrics-listen", f"127.0.0.1:{metrics}") as server:
        # The node listens, then registers: its registration places the partition's first
        # leader, a new epoch.
        first = wait_until(lambda: _epoch(broker), "the node never registered")
        assert first == 1
        kp = KafkaConsumer(bootstrap_servers=server, auto_offset_reset="earliest",
                           metadata_max_age_ms=300)  # fmt: skip
        try:
            kp.assign([KpTp("t", 0)])
            read = _kp_read(kp, 3)
            assert _bump(broker) == first + 1
            _produce(broker, 2)
            read += _kp_read(kp, 2, lambda: _requests(metrics, "offset_for_leader_epoch") >= 1)
        finally:
            kp.close()
        assert read == [f"r{i}".encode() for i in (0, 1, 2, 0, 1)]

        rk = ck.Consumer({"bootstrap.servers": server, "group.id": "rk",
                          "topic.metadata.refresh.interval.ms": 300})  # fmt: skip
        try:
            rk.assign([ck.TopicPartition("t", 0, 3)])
            seen = _rk_read(rk, 2)  # in epoch first + 1
            asked = _requests(metrics, "offset_for_leader_epoch")
            assert _bump(broker) == first + 2
            _produce(broker, 2)
            seen += _rk_read(rk, 2, lambda: _requests(metrics, "offset_for_leader_epoch") > asked)
        finally:
            rk.close()
        assert seen == [f"r{i}".encode() for i in (0, 1, 0, 1)]

        fetched = exchange(server, 1, 12, WireFetch(
            max_wait=datetime.timedelta(0), min_bytes=0, max_bytes=1 << 20, isolation_level=0,
            topics=(FetchTopic(topic="t", partitions=(
                FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20,
                               current_leader_epoch=first + 2),)),),
            forgotten_topics_data=(), rack_id="",
        ))  # fmt: skip
        records = fetched.responses[0].partitions[0].records
        assert _batch_epochs(bytes(records)) == [(0, 0), (3, first + 1), (5, first + 2)]
        asked_epochs = exchange(server, 23, 4, WireEpochs(topics=(OffsetForLeaderTopic(
            topic="t", partitions=(OffsetForLeaderPartition(partition=0, leader_epoch=first + 1,
                                                            current_leader_epoch=first + 2),)),)))  # fmt: skip
        [answer] = asked_epochs.topics[0].partitions
        assert (answer.error_code.value, answer.leader_epoch, answer.end_offset) == (
            0,
            first + 1,
            5,
        )


def _epoch(broker: Broker) -> int:
    with broker.engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT leader_epoch FROM partitions WHERE topic = 't' AND partition = 0")
            ).scalar_one()
        )


def _kp_read(consumer: Any, n: int, also: Any = lambda: True) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(got) < n or not also():
        assert time.monotonic() < deadline, f"read {got}"
        got += [m.value for ms in consumer.poll(200).values() for m in ms]
    return got


def _rk_read(consumer: Any, n: int, also: Any = lambda: True) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(got) < n or not also():
        assert time.monotonic() < deadline, f"read {got}"
        m = consumer.poll(0.2)
        if m is not None and m.error() is None:
            got.append(m.value())
    return got


def test_a_node_answers_nothing_before_it_has_registered(db_url: str) -> None:
    """A node's registration moves the partitions' leader epochs, so a client answered
    before it would hold epochs the partitions no longer have, and be fenced at its next
    request (FENCED_LEADER_EPOCH, seen from librdkafka's list_offsets). With the
    registration held up on a lock, the node's port takes no connection; once it has
    joined, its first answer gives the new epoch."""
    broker = Broker.connect(db_url)
    create_topic(broker, "t", 1)
    serve = ServeProcess(db_url)
    starting = threading.Thread(target=serve.start, kwargs={"timeout": 600})
    with psycopg.connect(libpq_conninfo(db_url)) as blocker:
        blocker.execute("LOCK TABLE broker_registrations IN ACCESS EXCLUSIVE MODE")
        starting.start()
        try:
            wait_until(lambda: _waiting_on_a_lock(broker), "the registration never waited")
            with pytest.raises(OSError):
                socket.create_connection((serve.host, serve.port), 5).close()
        finally:
            blocker.rollback()
    starting.join()
    try:
        from kio.schema.metadata.v12 import request as metadata_v12

        body = metadata_v12.MetadataRequest(
            topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
        )
        answer = exchange(serve.address, 3, 12, body)
        [topic] = answer.topics
        assert [p.leader_epoch for p in topic.partitions] == [_epoch(broker)] == [1]
    finally:
        assert serve.stop() == 0


def _waiting_on_a_lock(broker: Broker) -> bool:
    with broker.engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )
