"""``kip98 serve`` driven by unmodified Kafka clients: confluent-kafka (librdkafka) against
a real server process on 127.0.0.1 (the ``server`` fixture), reading and writing the same
log as the native client."""

from __future__ import annotations

import datetime
import socket
import struct
import time
import urllib.request
from typing import Any

import confluent_kafka as ck
import pytest

from app.broker import Broker
from app.client import Consumer, KafkaError, Producer, TopicPartition
from app.log.topics import create_topic
from app.protocol import ProduceRequest, RecordIn
from app.server.process import free_port
from tests.helpers.batches import record_batch
from tests.helpers.txn_driver import read_values
from tests.helpers.wire_client import (
    consume_all,
    delivered,
    read_response,
    request_frame,
    serving,
)


@pytest.fixture
def topics(broker: Broker) -> None:
    create_topic(broker, "t", 2)
    create_topic(broker, "out", 1)


def test_librdkafka_idempotent_producer_writes_what_the_native_consumer_reads(
    server: str, broker: Broker, topics: None
) -> None:
    producer = ck.Producer({"bootstrap.servers": server, "enable.idempotence": True,
                            "linger.ms": 5})  # fmt: skip
    reports = delivered(producer, 100, topic="t", partition=0, headers=[("h", b"1")])
    assert [err for err, _ in reports] == [None] * 100
    assert [offset for _, offset in reports] == list(range(100))
    assert read_values(broker, "t", 0) == [f"v{i}" for i in range(100)]
    with broker.engine.connect() as conn:
        pids = conn.exec_driver_sql(
            "SELECT DISTINCT producer_id FROM records WHERE topic = 't'"
        ).all()
    assert len(pids) == 1 and pids[0][0] >= 0  # one idempotent producer id, kept
    native = Consumer({"database.url": broker.engine.url.render_as_string(False),
                       "group.id": "n", "auto.offset.reset": "earliest"})  # fmt: skip
    try:
        native.assign([TopicPartition("t", 0, 0)])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 100 and time.monotonic() < deadline:
            got += [m for m in native.consume(100, 0.5) if m.error() is None]
        assert [m.value() for m in got] == [f"v{i}".encode() for i in range(100)]
        assert got[0].headers() == [("h", b"1")]
    finally:
        native.close()


def test_librdkafka_transactions_commit_and_abort_with_read_committed(
    server: str, broker: Broker, topics: None
) -> None:
    producer = ck.Producer({"bootstrap.servers": server, "transactional.id": "wire-txn"})
    producer.init_transactions(30)
    producer.begin_transaction()
    delivered(producer, 5, topic="t", partition=0)
    producer.abort_transaction(30)
    producer.begin_transaction()
    delivered(producer, 3, topic="t", partition=0)
    delivered(producer, 2, topic="t", partition=1)
    producer.commit_transaction(30)

    assert read_values(broker, "t", 0) == ["v0", "v1", "v2"]
    assert read_values(broker, "t", 1) == ["v0", "v1"]
    consumer = ck.Consumer({"bootstrap.servers": server, "group.id": "rc",
                            "isolation.level": "read_committed", "enable.auto.commit": False,
                            "auto.offset.reset": "earliest"})  # fmt: skip
    try:
        consumer.assign([ck.TopicPartition("t", 0, 0), ck.TopicPartition("t", 1, 0)])
        got = consume_all(consumer, 5)
        assert sorted((m.partition(), m.value()) for m in got) == [
            (0, b"v0"), (0, b"v1"), (0, b"v2"), (1, b"v0"), (1, b"v1"),
        ]  # fmt: skip
        # The aborted records were fetched and skipped: offsets 0-4 and the marker at 5.
        assert [m.offset() for m in got if m.partition() == 0] == [6, 7, 8]
        assert consumer.poll(1.0) is None
    finally:
        consumer.close()


def test_native_transactions_are_read_by_librdkafka_in_both_isolation_levels(
    server: str, broker: Broker, topics: None, db_url: str
) -> None:
    native = Producer({"database.url": db_url, "transactional.id": "native"})
    try:
        native.init_transactions()
        native.begin_transaction()
        native.produce("t", "aborted", partition=0)
        native.flush()  # written, then aborted
        native.abort_transaction()
        native.begin_transaction()
        native.produce("t", "kept", partition=0, headers={"k": b"v"})
        native.commit_transaction()
        native.begin_transaction()
        native.produce("t", "open", partition=0)
        native.flush()

        def values(isolation: str, want: int) -> list[bytes]:
            c = ck.Consumer({"bootstrap.servers": server, "group.id": isolation,
                             "isolation.level": isolation, "auto.offset.reset": "earliest"})  # fmt: skip
            try:
                c.assign([ck.TopicPartition("t", 0, 0)])
                got = consume_all(c, want)
                assert c.poll(1.0) is None
                return [m.value() for m in got]
            finally:
                c.close()

        assert values("read_committed", 1) == [b"kept"]
        assert values("read_uncommitted", 3) == [b"aborted", b"kept", b"open"]
        native.commit_transaction()
    finally:
        native.close()


def test_consume_transform_produce_through_the_wire_commits_offsets_in_the_transaction(
    server: str, broker: Broker, topics: None, db_url: str
) -> None:
    source = Producer({"database.url": db_url})
    for i in range(20):
        source.produce("t", f"in{i}", partition=0)
    source.flush()
    source.close()
    consumer = ck.Consumer({"bootstrap.servers": server, "group.id": "copier",
                            "isolation.level": "read_committed", "enable.auto.commit": False,
                            "auto.offset.reset": "earliest"})  # fmt: skip
    producer = ck.Producer({"bootstrap.servers": server, "transactional.id": "copier"})
    try:
        producer.init_transactions(30)
        consumer.assign([ck.TopicPartition("t", 0)])
        msgs = consume_all(consumer, 10)[:10]
        producer.begin_transaction()
        for m in msgs:
            producer.produce("out", m.value().upper(), partition=0)
        offsets = [ck.TopicPartition("t", 0, msgs[-1].offset() + 1)]
        producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
        [committed] = consumer.committed([ck.TopicPartition("t", 0)], 10)
        assert committed.offset == 10
    finally:
        consumer.close()
    assert read_values(broker, "out", 0) == [f"IN{i}" for i in range(10)]


def test_bad_frames_close_only_their_connection_and_are_counted(
    db_url: str, broker: Broker, topics: None
) -> None:
    metrics_port = free_port()
    with serving(db_url, "--metrics-listen", f"127.0.0.1:{metrics_port}") as server:
        _send_bad_frames(server, broker)
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read()
    counted = {
        line.split()[0]: float(line.split()[1])
        for line in scraped.decode().splitlines()
        if line.startswith("kip98_server_")
    }
    assert counted['kip98_server_refused_total{reason="size"}'] == 1
    assert counted['kip98_server_refused_total{reason="malformed"}'] == 3
    assert counted['kip98_server_refused_total{reason="truncated"}'] == 1
    assert counted['kip98_server_requests_total{api="produce"}'] >= 1


def _send_bad_frames(server: str, broker: Broker) -> None:
    host, port = server.split(":")
    frames = [
        struct.pack(">i", 2_000_000_000),  # over socket.request.max.bytes
        struct.pack(">i", 10) + struct.pack(">hhi", 999, 0, 1) + b"\0\0",  # unknown API key
        struct.pack(">i", 10) + struct.pack(">hhi", 0, 99, 1) + b"\0\0",  # unserved version
        struct.pack(">i", 10) + struct.pack(">hhi", 0, 9, 1) + b"\xff\xff",  # garbled Produce
    ]
    for frame in frames:
        with socket.create_connection((host, int(port)), 5) as s:
            s.sendall(frame)
            s.settimeout(5)
            assert s.recv(100) == b""  # closed, no answer
    with socket.create_connection((host, int(port)), 5) as s:  # a truncated frame
        s.sendall(struct.pack(">i", 100) + b"\0" * 10)
        s.shutdown(socket.SHUT_WR)
        s.settimeout(5)
        assert s.recv(100) == b""
    producer = ck.Producer({"bootstrap.servers": server})
    assert [err for err, _ in delivered(producer, 3, topic="t", partition=1)] == [None] * 3
    assert read_values(broker, "t", 1) == ["v0", "v1", "v2"]


def test_a_batch_with_a_wrong_crc_is_refused_and_writes_nothing(
    server: str, broker: Broker, topics: None
) -> None:
    from kio.schema.produce.v9 import request as produce_v9

    batch = bytearray(record_batch(["payload"]))
    batch[-1] ^= 0xFF  # the value's last byte: the CRC no longer matches
    body = produce_v9.ProduceRequest(
        acks=-1, timeout=datetime.timedelta(seconds=5), topic_data=(
            produce_v9.TopicProduceData(name="t", partition_data=(
                produce_v9.PartitionProduceData(index=0, records=bytes(batch)),)),))  # fmt: skip
    host, port = server.split(":")
    with socket.create_connection((host, int(port)), 5) as s:
        s.sendall(request_frame(0, 9, body))
        answer = read_response(s, 0, 9)
    [partition] = answer.responses[0].partition_responses
    assert partition.error_code.value == KafkaError.CORRUPT_MESSAGE
    assert read_values(broker, "t", 0, committed=False) == []


def test_api_versions_of_an_unserved_version_answers_with_version_0(server: str) -> None:
    """With the flexible header v99 has: a v0 answer listing ApiVersions' versions only
    (KIP-511); with a v1 header, which that header version cannot read: closed."""
    host, port = server.split(":")
    with socket.create_connection((host, int(port)), 5) as s:
        s.sendall(struct.pack(">i", 11) + struct.pack(">hhi", 18, 99, 7) + b"\xff\xff\0")
        answer = read_response(s, 18, 0)
    assert answer.error_code.value == 35  # UNSUPPORTED_VERSION
    assert [(k.api_key, k.min_version) for k in answer.api_keys] == [(18, 0)]
    with socket.create_connection((host, int(port)), 5) as s:
        s.sendall(struct.pack(">i", 10) + struct.pack(">hhi", 18, 99, 7) + b"\xff\xff")
        s.settimeout(5)
        assert s.recv(100) == b""  # closed, no answer


def test_a_null_array_the_schema_does_not_allow_closes_the_connection(server: str) -> None:
    """A Produce v3 whose topics array has length -1 (non-nullable): unreadable, closed."""
    host, port = server.split(":")
    header = struct.pack(">hhih", 0, 3, 7, -1)
    with socket.create_connection((host, int(port)), 5) as s:
        s.sendall(struct.pack(">i", len(header) + 64) + header + b"\xff" * 64)
        s.settimeout(5)
        assert s.recv(100) == b""  # closed, no answer


def test_stored_batches_come_back_as_kafka_batches(
    broker: Broker, db_url: str, topics: None
) -> None:
    """A native transaction read back as batches: the data batch with its producer id, epoch,
    base sequence and transactional flag, then the COMMIT marker as a control batch."""
    from aiokafka.record.memory_records import MemoryRecords

    from app.protocol import FetchRequest
    from app.server.records import encode_batches

    # One batch however slowly the records come: they wait for the commit, not a linger.
    native = Producer({"database.url": db_url, "transactional.id": "batches", "linger.ms": 10_000})
    try:
        native.init_transactions()
        native.begin_transaction()
        for i in range(3):
            native.produce("t", f"r{i}", partition=0, headers={"h": b"x"})
        native.commit_transaction()
    finally:
        native.close()
    answer = broker.handle(FetchRequest("t", 0, 0, batches=True, isolation_level=0))
    records = MemoryRecords(encode_batches(answer.log_records))
    data, marker = records.next_batch(), records.next_batch()
    assert records.next_batch() is None
    assert (data.base_offset, data.is_transactional, data.is_control_batch) == (0, True, False)
    assert data.producer_id >= 0 and data.base_sequence == 0 and data.validate_crc()
    assert [(r.offset, r.value, r.headers) for r in data] == [
        (i, f"r{i}".encode(), [("h", b"x")]) for i in range(3)
    ]
    assert (marker.base_offset, marker.is_control_batch, marker.validate_crc()) == (3, True, True)
    [control] = list(marker)
    assert struct.unpack(">hh", control.key) == (0, 1)  # version 0, COMMIT


def test_a_native_producer_and_a_librdkafka_producer_fence_each_other(
    server: str, broker: Broker, topics: None, db_url: str
) -> None:
    """One transactional.id, two front ends: whichever initialised last wins, both ways."""
    native = Producer({"database.url": db_url, "transactional.id": "shared"})
    wire = ck.Producer({"bootstrap.servers": server, "transactional.id": "shared"})
    try:
        native.init_transactions()
        native.begin_transaction()
        native.produce("t", "native-zombie", partition=0)
        native.flush()
        wire.init_transactions(30)  # fences the native producer, aborting its transaction
        wire.begin_transaction()
        delivered(wire, 1, topic="t", partition=0)
        wire.commit_transaction(30)
        with pytest.raises(Exception) as fenced:
            native.commit_transaction()
        assert fenced.value.args[0].code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED)

        again = Producer({"database.url": db_url, "transactional.id": "shared"})
        try:
            again.init_transactions()  # and now the librdkafka producer is the zombie
            wire.begin_transaction()
            with pytest.raises(ck.KafkaException) as wire_fenced:
                wire.produce("t", b"wire-zombie", partition=0)
                wire.flush(10)
                wire.commit_transaction(10)
            assert wire_fenced.value.args[0].fatal()
        finally:
            again.close()
    finally:
        native.close()
    assert read_values(broker, "t", 0) == ["v0"]


def test_long_polls_hold_no_worker(broker: Broker, topics: None) -> None:
    """More consumers waiting on an empty partition than the server has workers: a
    producer is still answered at once, and the waiting fetches get its records."""
    import asyncio
    import threading

    from kio.schema.fetch.v12 import request as fetch_v12

    from app.server import Endpoint, Listener, Node, Server

    port = free_port()
    server = Server(
        broker, [Endpoint(Listener("127.0.0.1", port), Node("127.0.0.1", port, "test"))], workers=2
    )
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(60)
    # The fetches wait far longer than the producer may take: a producer that had to wait
    # for them (workers held by long polls) would time out instead of being answered.
    fetch = fetch_v12.FetchRequest(
        replica_id=-1, max_wait=datetime.timedelta(seconds=300), min_bytes=1, max_bytes=1 << 20,
        isolation_level=1, session_id=0, session_epoch=-1, topics=(fetch_v12.FetchTopic(
            topic="t", partitions=(fetch_v12.FetchPartition(
                partition=1, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                log_start_offset=-1, partition_max_bytes=1 << 20),)),),
        forgotten_topics_data=(), rack_id="")  # fmt: skip
    waiting = [socket.create_connection(("127.0.0.1", port), 5) for _ in range(4)]
    try:
        for s in waiting:
            s.sendall(request_frame(1, 12, fetch))
        deadline = time.monotonic() + 60
        while server.requests["fetch"] < len(waiting):  # every fetch is in its long poll
            assert time.monotonic() < deadline, "the fetches were not all answered once"
            time.sleep(0.01)
        producer = ck.Producer({"bootstrap.servers": f"127.0.0.1:{port}",
                                "message.timeout.ms": 120_000})  # fmt: skip
        assert [err for err, _ in delivered(producer, 1, topic="t", partition=1)] == [None]
        for s in waiting:
            s.settimeout(60)
            answer = read_response(s, 1, 12)
            assert answer.responses[0].partitions[0].high_watermark == 1
    finally:
        for s in waiting:
            s.close()
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)


def test_a_batch_cut_by_max_bytes_goes_on_where_it_stopped(
    broker: Broker, db_url: str, topics: None
) -> None:
    """A stored batch larger than max_bytes comes back in parts, each a valid batch whose
    base offset and base sequence are those of its first record; the first part is never
    empty (Kafka's at-least-one-batch)."""
    from aiokafka.record.memory_records import MemoryRecords

    from app.protocol import FetchRequest
    from app.server.records import encode_batches

    native = Producer({"database.url": db_url, "linger.ms": 60_000})  # one batch, at the flush
    for i in range(10):
        native.produce("t", b"x" * 1000, key=str(i).encode(), partition=0)
    native.flush()
    native.close()
    parts, offset = [], 0
    while offset < 10:
        answer = broker.handle(FetchRequest("t", 0, offset, max_bytes=2500, batches=True))
        batch = MemoryRecords(encode_batches(answer.log_records)).next_batch()
        assert batch is not None and batch.validate_crc()
        offsets = [r.offset for r in batch]
        assert offsets[0] == offset == batch.base_offset
        assert batch.base_sequence == offset  # one producer's one batch: sequence = offset
        parts.append(offsets)
        offset = answer.next_offset
    assert [o for p in parts for o in p] == list(range(10)) and len(parts) == 5
    tiny = broker.handle(FetchRequest("t", 0, 0, max_bytes=1, batches=True))
    assert [r[0] for r in tiny.log_records] == [0]  # at least one record


def test_a_fill_reads_whole_batches_up_to_its_bytes_in_few_reads(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One partition's part of a fetch (``apis._read``) spans many windows of
    ``fetch_max_records`` offsets: fills of any size, from any offset, hold the log from
    there in order (batches of every kind, markers and aborted ones included), within their
    bytes but for a first record larger than them, and, fill after fill, every record once.
    After its first read, a fill sizes its windows by the bytes it has read, so a fill of
    many windows takes a few reads, not one per window."""
    from aiokafka.record.memory_records import MemoryRecords

    from app.protocol import READ_COMMITTED, FetchRequest
    from app.server import apis
    from app.server.records import BATCH_HEADER_BYTES
    from app.settings import BrokerSettings
    from tests.helpers.txn_driver import TxnDriver

    broker = Broker.connect(db_url, settings=BrokerSettings(fetch_max_records=10))
    create_topic(broker, "t", 1)
    d = TxnDriver(broker, "tx")
    assert d.init() == 0
    for i in range(12):
        records = [RecordIn(b"k", bytes([i]) * (50 + 10 * j), 0) for j in range(7)]
        assert d.send_records("t", 0, records).error_code == 0
        assert d.end(commit=i % 4 != 2) == 0
    end = 12 * 8
    reads: list[FetchRequest] = []
    handle = broker.handle

    def counted(request: Any) -> Any:
        if isinstance(request, FetchRequest):
            reads.append(request)
        return handle(request)

    monkeypatch.setattr(broker, "handle", counted)

    def fill(offset: int, max_bytes: int) -> tuple[list[int], int, int]:
        first = FetchRequest("t", 0, offset, max_bytes=max_bytes, batches=True,
                             isolation_level=READ_COMMITTED)  # fmt: skip
        answer, data, _ = apis._read(broker, first)
        batches, offsets, headers = MemoryRecords(data), [], 0
        while (batch := batches.next_batch()) is not None:
            assert batch.validate_crc()
            offsets.extend(r.offset for r in batch)
            headers += BATCH_HEADER_BYTES
        # Bytes are counted as the log counts its records (RECORD_OVERHEAD_BYTES each),
        # which leaves out the batch headers.
        return offsets, len(data) - headers, answer.next_offset

    for max_bytes in (1, 300, 2_000, 7_000, 1 << 20):
        for start in (0, 3, 7, 8, 41, 90):
            offsets, size, next_offset = fill(start, max_bytes)
            assert offsets == list(range(start, next_offset)) and offsets
            assert size <= max_bytes or len(offsets) == 1, (start, max_bytes)
        offset, seen = 0, []
        while offset < end:
            offsets, _, offset = fill(offset, max_bytes)
            seen.extend(offsets)
        assert seen == list(range(end)), max_bytes
    reads.clear()
    offsets, _, _ = fill(0, 1 << 20)
    assert offsets == list(range(end))
    assert len(reads) <= 3, [r.max_records for r in reads]


def test_a_batch_whose_first_records_were_compacted_away_keeps_its_fields(
    broker: Broker,
) -> None:
    """A fetch gives a batch's fields on the record its run starts with: its base, or the
    fetch's first offset. Once the cleaner removed a batch's first records, the run starts
    elsewhere, and the batch still comes back with its producer id, epoch and the base
    sequence of the record it now starts with."""
    from aiokafka.record.memory_records import MemoryRecords

    from app.broker.produce import produce
    from app.cleaner.cleaner import clean_partition, partitions_to_clean
    from app.protocol import FetchRequest
    from app.server.records import encode_batches
    from tests.helpers.identities import hand_out

    create_topic(broker, "c", 1, {"cleanup.policy": "compact"})
    for pid, seq, keys in ((800, 0, "abcd"), (801, 0, "ab")):
        hand_out(broker, pid)
        records = [RecordIn(k.encode(), f"{k}{pid}".encode(), 0) for k in keys]
        request = ProduceRequest("c", 0, records, producer_id=pid, producer_epoch=0,
                                 base_sequence=seq)  # fmt: skip
        assert produce(broker, request).error_code == 0
    (target,) = partitions_to_clean(broker, "c")
    clean_partition(broker, "c", 0, target.config)

    def batches(offset: int) -> list[tuple[int, int, int, list[int]]]:
        answer = broker.handle(FetchRequest("c", 0, offset, batches=True, isolation_level=0))
        records, out = MemoryRecords(encode_batches(answer.log_records)), []
        while (batch := records.next_batch()) is not None:
            assert batch.validate_crc() and batch.producer_epoch == 0
            out.append((batch.base_offset, batch.producer_id, batch.base_sequence,
                        [r.offset for r in batch]))  # fmt: skip
        return out

    # a and b of the first batch (offsets 0 and 1) gave way to the second's (4 and 5).
    assert batches(0) == [(2, 800, 2, [2, 3]), (4, 801, 0, [4, 5])]
    assert batches(3) == [(3, 800, 3, [3]), (4, 801, 0, [4, 5])]
    assert batches(5) == [(5, 801, 1, [5])]
