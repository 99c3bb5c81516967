"""The Consumer with explicit assignment: order, positions, seeking, offset reset,
partition EOF events, watermarks, and a reader tailing a partition that four producer
processes append to at once (the data-plane concurrency test)."""

from __future__ import annotations

import itertools
import multiprocessing
import threading
import time
from typing import Any

import pytest

from app.broker import Broker
from app.client import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    KafkaError,
    Message,
    TopicPartition,
)
from app.client.closing import ClientClosedError
from app.client.consumer import Consumer
from app.client.producer import Producer

pytestmark = pytest.mark.broker(topics={"t": 2})


def fill(db_url: str, count: int, partition: int, topic: str = "t", start: int = 0) -> None:
    with Producer({"database.url": db_url}) as producer:
        for i in range(start, start + count):
            producer.produce(topic, value=f"p{partition}-{i}", partition=partition)
        assert producer.flush(30) == 0


def consumer(db_url: str, **overrides: Any) -> Consumer:
    config: dict[str, Any] = {"database.url": db_url, "client.id": "test-consumer"}
    config.update({k.replace("_", "."): v for k, v in overrides.items()})
    return Consumer(config)


def data(messages: list[Message]) -> list[tuple[int | None, int | None]]:
    assert all(m.error() is None for m in messages), messages
    return [(m.partition(), m.offset()) for m in messages]


def test_assigned_partitions_are_read_in_order_and_in_turn(db_url: str, broker: Broker) -> None:
    fill(db_url, 30, 0)
    fill(db_url, 30, 1)
    with consumer(db_url) as c:
        c.assign(
            [TopicPartition("t", 0, OFFSET_BEGINNING), TopicPartition("t", 1, OFFSET_BEGINNING)]
        )
        assert c.assignment() == [TopicPartition("t", 0), TopicPartition("t", 1)]
        got = c.consume(60, timeout=30)
        assert c.poll(0) is None
    pairs = data(got)
    assert len(pairs) == 60
    for partition in (0, 1):
        assert [o for p, o in pairs if p == partition] == list(range(30))
    # Both partitions were fetched together, so neither waits for the other to drain.
    assert {p for p, _ in pairs[:2]} == {0, 1}
    assert [m.value() for m in got if m.partition() == 1][:2] == [b"p1-0", b"p1-1"]


def test_poll_returns_one_message_at_a_time(db_url: str, broker: Broker) -> None:
    fill(db_url, 5, 0)
    with consumer(db_url, auto_offset_reset="earliest") as c:
        c.assign([TopicPartition("t", 0)])
        offsets = []
        for _ in range(5):
            msg = c.poll(30)
            assert msg is not None and msg.error() is None
            offsets.append(msg.offset())
        assert offsets == list(range(5))
        assert c.poll(0.05) is None


def test_poll_waits_for_a_record_produced_meanwhile(db_url: str, broker: Broker) -> None:
    with consumer(db_url, auto_offset_reset="earliest") as c:
        c.assign([TopicPartition("t", 0)])
        assert c.poll(0) is None

        def late_write() -> None:
            time.sleep(0.2)
            fill(db_url, 1, 0)

        writer = threading.Thread(target=late_write)
        writer.start()
        msg = c.poll(30)
        writer.join()
    assert msg is not None and msg.value() == b"p0-0"


def test_seek_and_position(db_url: str, broker: Broker) -> None:
    fill(db_url, 10, 0)
    tp = TopicPartition("t", 0)
    with consumer(db_url) as c:
        c.assign([TopicPartition("t", 0, OFFSET_BEGINNING)])
        # Not known until the logical offset is resolved by the first fetch.
        assert c.position([tp])[0].offset == OFFSET_INVALID
        c.assign([TopicPartition("t", 0, 3)])
        assert c.position([tp])[0].offset == 3
        assert data(c.consume(2, timeout=30)) == [(0, 3), (0, 4)]
        assert c.position([tp])[0].offset == 5

        c.seek(TopicPartition("t", 0, OFFSET_BEGINNING))
        assert data(c.consume(1, timeout=30)) == [(0, 0)]
        assert c.position([tp])[0].offset == 1

        c.seek(TopicPartition("t", 0, 8))
        assert c.position([tp])[0].offset == 8
        assert data(c.consume(2, timeout=30)) == [(0, 8), (0, 9)]

        c.seek(TopicPartition("t", 0, OFFSET_END))
        assert c.poll(0.05) is None
        assert c.position([tp])[0].offset == 10
        fill(db_url, 1, 0, start=10)
        msg = c.poll(30)
        assert msg is not None and (msg.offset(), msg.value()) == (10, b"p0-10")
        assert c.position([tp, TopicPartition("t", 1)]) == [tp, TopicPartition("t", 1)]
        assert [p.offset for p in c.position([tp, TopicPartition("t", 1)])] == [11, OFFSET_INVALID]

        with pytest.raises(Exception) as info:
            c.seek(TopicPartition("t", 1, 0))
        assert info.value.args[0].code() == KafkaError._UNKNOWN_PARTITION


def test_watermarks(db_url: str, broker: Broker) -> None:
    fill(db_url, 7, 1)
    tp = TopicPartition("t", 1)
    with consumer(db_url) as c:
        assert c.get_watermark_offsets(tp) == (0, 7)
        assert c.get_watermark_offsets(TopicPartition("t", 0)) == (0, 0)
        c.assign([TopicPartition("t", 1, OFFSET_BEGINNING)])
        assert c.get_watermark_offsets(tp, cached=True) == (OFFSET_INVALID, OFFSET_INVALID)
        c.consume(7, timeout=30)
        assert c.get_watermark_offsets(tp, cached=True) == (0, 7)
        with pytest.raises(Exception) as info:
            c.get_watermark_offsets(TopicPartition("nope", 0))
        assert info.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PARTITION


@pytest.mark.parametrize(("reset", "expected"), [("earliest", 0), ("latest", 4), ("smallest", 0)])
def test_auto_offset_reset_without_an_offset(
    db_url: str, broker: Broker, reset: str, expected: int
) -> None:
    fill(db_url, 4, 0)
    with consumer(db_url, auto_offset_reset=reset) as c:
        c.assign([TopicPartition("t", 0)])
        if expected == 4:
            assert c.poll(0.05) is None
            fill(db_url, 1, 0, start=4)
        msg = c.poll(30)
        assert msg is not None and msg.error() is None and msg.offset() == expected


def test_auto_offset_reset_error_reports_instead_of_reading(db_url: str, broker: Broker) -> None:
    fill(db_url, 4, 0)
    with consumer(db_url, auto_offset_reset="error") as c:
        c.assign([TopicPartition("t", 0)])
        msg = c.poll(30)
        assert msg is not None
        err = msg.error()
        assert err is not None and err.code() == KafkaError.OFFSET_OUT_OF_RANGE
        assert (msg.topic(), msg.partition()) == ("t", 0)
        assert c.poll(0.05) is None
        # A seek gives the partition a position again.
        c.seek(TopicPartition("t", 0, 2))
        assert data(c.consume(2, timeout=30)) == [(0, 2), (0, 3)]


def test_out_of_range_offset_is_reset(db_url: str, broker: Broker) -> None:
    fill(db_url, 4, 0)
    with consumer(db_url, auto_offset_reset="earliest") as c:
        c.assign([TopicPartition("t", 0, 100)])
        assert data(c.consume(4, timeout=30)) == [(0, 0), (0, 1), (0, 2), (0, 3)]
    with consumer(db_url, auto_offset_reset="error") as c:
        c.assign([TopicPartition("t", 0, 100)])
        msg = c.poll(30)
        assert msg is not None and msg.error() is not None
        assert msg.error().code() == KafkaError.OFFSET_OUT_OF_RANGE  # type: ignore[union-attr]


def test_partition_eof_is_reported_once_per_end(db_url: str, broker: Broker) -> None:
    fill(db_url, 3, 0)
    with consumer(db_url, enable_partition_eof=True) as c:
        c.assign([TopicPartition("t", 0, OFFSET_BEGINNING)])
        got = c.consume(4, timeout=30)
        assert [m.offset() for m in got[:3]] == [0, 1, 2]
        eof = got[3].error()
        assert eof is not None and eof.code() == KafkaError._PARTITION_EOF
        assert (got[3].partition(), got[3].offset()) == (0, 3)
        assert c.poll(0.05) is None
        fill(db_url, 2, 0, start=3)
        got = c.consume(3, timeout=30)
        assert [m.offset() for m in got] == [3, 4, 5]
        assert got[2].error() is not None and got[2].error().code() == KafkaError._PARTITION_EOF  # type: ignore[union-attr]


def test_empty_partition_reports_eof_without_records(db_url: str, broker: Broker) -> None:
    with consumer(db_url, enable_partition_eof=True, auto_offset_reset="earliest") as c:
        c.assign([TopicPartition("t", 1)])
        msg = c.poll(30)
        assert msg is not None and msg.error() is not None
        assert msg.error().code() == KafkaError._PARTITION_EOF  # type: ignore[union-attr]


def test_read_uncommitted_reads_plain_records(db_url: str, broker: Broker) -> None:
    fill(db_url, 3, 0)
    with consumer(db_url, isolation_level="read_uncommitted") as c:
        c.assign([TopicPartition("t", 0, OFFSET_BEGINNING)])
        assert data(c.consume(3, timeout=30)) == [(0, 0), (0, 1), (0, 2)]


def test_unknown_topic_is_an_error_event(db_url: str, broker: Broker) -> None:
    with consumer(db_url) as c:
        c.assign([TopicPartition("missing", 0, OFFSET_BEGINNING)])
        msg = c.poll(30)
        assert msg is not None and msg.error() is not None
        assert msg.error().code() == KafkaError.UNKNOWN_TOPIC_OR_PARTITION  # type: ignore[union-attr]
        assert c.poll(0.05) is None


def test_unassign_close_and_arguments(db_url: str, broker: Broker) -> None:
    fill(db_url, 2, 0)
    c = consumer(db_url)
    c.assign([TopicPartition("t", 0, OFFSET_BEGINNING)])
    c.unassign()
    assert c.assignment() == []
    assert c.poll(0.05) is None
    with pytest.raises(ValueError):
        c.consume(0)
    c.close()
    c.close()
    with pytest.raises(ClientClosedError):
        c.poll(0)
    with pytest.raises(RuntimeError):
        c.assignment()


# --- data-plane concurrency -----------------------------------------------------------

WRITERS = 4
PER_WRITER = 1500


def append_worker(db_url: str, writer: int, start: Any) -> None:
    """Runs in a child process: append this writer's records to partition 0 in many batches,
    starting together with the other writers."""
    config = {
        "database.url": db_url,
        "client.id": f"writer-{writer}",
        "linger.ms": 1,
        "batch.num.messages": 40,
    }
    with Producer(config) as producer:
        start.wait(300)  # all four processes started, however slowly
        for i in range(PER_WRITER):
            producer.produce("t", value=f"{writer}:{i}", partition=0)
            if i % 100 == 99:
                producer.poll(0)
                time.sleep(0.005)
        if producer.flush(60) != 0:
            raise SystemExit(1)


def test_data_plane_concurrency_tailing_reader_sees_gapless_offsets(
    db_url: str, broker: Broker
) -> None:
    """While four producer processes append to one partition, a tailing reader never sees
    offset N+1 before N: every offset it gets is exactly one past the previous."""
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(WRITERS)
    writers = [ctx.Process(target=append_worker, args=(db_url, n, start)) for n in range(WRITERS)]
    total = WRITERS * PER_WRITER
    seen: list[Message] = []
    with consumer(db_url, auto_offset_reset="earliest") as reader:
        reader.assign([TopicPartition("t", 0)])
        for process in writers:
            process.start()
        deadline = time.monotonic() + 120
        while len(seen) < total and time.monotonic() < deadline:
            batch = reader.consume(500, timeout=0.05)
            for msg in batch:
                assert msg.error() is None, msg
                expected = seen[-1].offset() + 1 if seen else 0  # type: ignore[operator]
                assert msg.offset() == expected, f"got offset {msg.offset()} after {expected - 1}"
                seen.append(msg)
        for process in writers:
            process.join(60)
            assert process.exitcode == 0
        assert reader.poll(0.1) is None
    assert len(seen) == total
    values = [m.value() for m in seen]
    assert len(set(values)) == total
    switches = sum(1 for a, b in itertools.pairwise(values) if a and b and a[:2] != b[:2])
    print(
        f"{total} records from {WRITERS} processes, writer changed {switches} times along the log"
    )
    for writer in range(WRITERS):
        mine = [
            int(v.split(b":")[1])
            for v in values
            if v is not None and v.startswith(f"{writer}:".encode())
        ]
        assert mine == list(range(PER_WRITER))
