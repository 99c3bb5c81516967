"""The Producer against a real PostgreSQL: delivery reports, partitioning, batching,
queue limits, argument errors, retries, and a round trip through the Consumer."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text

from app.broker import Broker
from app.broker.produce import produce as produce_handler
from app.client import OFFSET_BEGINNING, TIMESTAMP_CREATE_TIME, KafkaError, KafkaException
from app.client.closing import ClientClosedError
from app.client.consumer import Consumer
from app.client.message import Message, TopicPartition
from app.client.partitioner import murmur2_partition
from app.client.producer import Producer
from app.log.topics import create_topic, describe_topic, list_topics
from app.protocol import ProduceRequest, ProduceResponse
from tests.helpers.txn_driver import batchwise

Report = tuple[KafkaError | None, Message]


pytestmark = pytest.mark.broker(topics={"t": 3})


def make_producer(db_url: str, **overrides: Any) -> Producer:
    config: dict[str, Any] = {"database.url": db_url, "client.id": "test-producer"}
    config.update({k.replace("_", "."): v for k, v in overrides.items()})
    return Producer(config)


def collector() -> tuple[list[Report], Callable[[KafkaError | None, Message], None]]:
    reports: list[Report] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        reports.append((err, msg))

    return reports, on_delivery


def stored(broker: Broker, topic: str = "t") -> list[Any]:
    with broker.engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    'SELECT partition, "offset", key, value, producer_id, sequence, batch_base_offset '
                    'FROM records WHERE topic = :t ORDER BY partition, "offset"'
                ),
                {"t": topic},
            )
        )


def test_delivery_reports_carry_the_stored_offsets(db_url: str, broker: Broker) -> None:
    reports, on_delivery = collector()
    with make_producer(db_url) as producer:
        for i in range(50):
            producer.produce("t", value=f"v{i}", key=b"k", partition=1, on_delivery=on_delivery)
        assert len(producer) == 50
        assert producer.flush(30) == 0
        assert len(producer) == 0
    assert [err for err, _ in reports] == [None] * 50
    assert [m.offset() for _, m in reports] == list(range(50))
    assert {(m.topic(), m.partition()) for _, m in reports} == {("t", 1)}
    assert [m.value() for _, m in reports] == [f"v{i}".encode() for i in range(50)]
    rows = stored(broker)
    assert [(r.partition, r.offset, r.value) for r in rows] == [
        (1, i, f"v{i}".encode()) for i in range(50)
    ]


def test_poll_serves_callbacks_and_counts_them(db_url: str, broker: Broker) -> None:
    reports, on_delivery = collector()
    with make_producer(db_url, linger_ms=0) as producer:
        for i in range(5):
            producer.produce("t", value=str(i), partition=0, on_delivery=on_delivery)
        served = 0
        while served < 5:
            served += producer.poll(5)
        assert served == 5
        assert producer.poll(0) == 0
    assert len(reports) == 5


def test_callback_alias_and_default_on_delivery(db_url: str, broker: Broker) -> None:
    default_reports, default_cb = collector()
    alias_reports, alias_cb = collector()
    with Producer({"database.url": db_url, "on_delivery": default_cb}) as producer:
        producer.produce("t", value="a", partition=0)
        producer.produce("t", value="b", partition=0, callback=alias_cb)
        assert producer.flush(30) == 0
    assert [m.value() for _, m in default_reports] == [b"a"]
    assert [m.value() for _, m in alias_reports] == [b"b"]


def test_keyed_records_go_to_the_murmur2_partition(db_url: str, broker: Broker) -> None:
    reports, on_delivery = collector()
    keys = [f"user-{i % 17}".encode() for i in range(200)]
    with make_producer(db_url) as producer:
        for i, key in enumerate(keys):
            producer.produce("t", value=str(i), key=key, on_delivery=on_delivery)
        assert producer.flush(30) == 0
    for err, msg in reports:
        assert err is None
        msg_key = msg.key()
        assert msg_key is not None
        assert msg.partition() == murmur2_partition(msg_key, 3)
    assert len({r.partition for r in stored(broker)}) > 1


def test_keyless_records_stick_to_a_partition_per_batch(db_url: str, broker: Broker) -> None:
    with make_producer(db_url, batch_num_messages=100, linger_ms=1000) as producer:
        for i in range(2000):
            producer.produce("t", value=str(i))
        assert producer.flush(30) == 0
    rows = stored(broker)
    assert len(rows) == 2000
    batches: dict[tuple[int, int], int] = {}
    for r in rows:
        batches[(r.partition, r.batch_base_offset)] = (
            batches.get((r.partition, r.batch_base_offset), 0) + 1
        )
    # Each batch is whole on one partition, and the partitioner moved on between batches.
    assert len({p for p, _ in batches}) > 1
    assert sum(batches.values()) == 2000


def test_records_are_batched_per_partition(db_url: str, broker: Broker) -> None:
    with make_producer(db_url, batch_num_messages=250, linger_ms=10_000) as producer:
        for i in range(1000):
            producer.produce("t", value=str(i), partition=2)
        assert producer.flush(30) == 0
    rows = stored(broker)
    assert len(rows) == 1000
    assert len({r.batch_base_offset for r in rows}) == 4


def test_linger_sends_without_flush(db_url: str, broker: Broker) -> None:
    reports, on_delivery = collector()
    with make_producer(db_url, linger_ms=200) as producer:
        for i in range(100):
            producer.produce("t", value=str(i), partition=0, on_delivery=on_delivery)
        while len(reports) < 100:
            producer.poll(1)
    assert len({r.batch_base_offset for r in stored(broker)}) < 100


def test_idempotent_batches_carry_sequences(db_url: str, broker: Broker) -> None:
    with make_producer(db_url, batch_num_messages=7) as producer:
        for i in range(30):
            producer.produce("t", value=str(i), partition=0)
        assert producer.flush(30) == 0
    rows = stored(broker)
    assert len({r.producer_id for r in rows}) == 1
    assert rows[0].producer_id >= 0
    assert [r.sequence for r in rows] == list(range(30))


def test_without_idempotence_there_is_no_producer_id(db_url: str, broker: Broker) -> None:
    with make_producer(db_url, enable_idempotence=False) as producer:
        for i in range(10):
            producer.produce("t", value=str(i), partition=0)
        assert producer.flush(30) == 0
    assert {(r.producer_id, r.sequence) for r in stored(broker)} == {(-1, -1)}


def test_len_and_flush_report_what_is_outstanding(db_url: str, broker: Broker) -> None:
    producer = make_producer(db_url, linger_ms=60_000)
    try:
        for i in range(10):
            producer.produce("t", value=str(i), partition=0)
        assert len(producer) == 10
        # Nothing can be served in no time: all ten are still outstanding.
        assert producer.flush(0) == 10
        assert producer.flush(30) == 0
        assert len(producer) == 0
    finally:
        producer.close()


def test_full_queue_raises_buffer_error(db_url: str, broker: Broker) -> None:
    producer = make_producer(db_url, queue_buffering_max_messages=10, linger_ms=60_000)
    try:
        for i in range(10):
            producer.produce("t", value=str(i), partition=0)
        with pytest.raises(BufferError):
            producer.produce("t", value="overflow", partition=0)
        assert producer.flush(30) == 0
        producer.produce("t", value="after", partition=0)
        assert producer.flush(30) == 0
    finally:
        producer.close()
    assert len(stored(broker)) == 11


def test_produce_batch_delivers_a_partitions_rows_in_order(db_url: str, broker: Broker) -> None:
    """librdkafka's produce_batch: many records of one partition in one call, keys and
    headers kept, in the order given, after a record produced one by one."""
    reports, on_delivery = collector()
    with Producer(
        {"database.url": db_url, "on_delivery": on_delivery, "batch.num.messages": 7}
    ) as producer:
        producer.produce("t", value=b"first", partition=2)
        values = [b"v%d" % i for i in range(30)]
        keys = [None if i % 3 else b"k%d" % i for i in range(30)]
        headers = [[("h", b"%d" % i)] if i % 2 else None for i in range(30)]
        producer.produce_batch("t", 2, values, keys, headers)
        assert producer.flush(30) == 0
    rows = stored(broker)
    assert [(p, o, k, v) for p, o, k, v, *_ in rows] == [(2, 0, None, b"first")] + [
        (2, i + 1, k, v) for i, (k, v) in enumerate(zip(keys, values, strict=True))
    ]
    assert len(reports) == 31 and all(err is None for err, _ in reports)
    assert [m.headers() for _, m in reports[1:3]] == [None, [("h", b"1")]]


def test_produce_batch_queues_all_or_nothing(db_url: str, broker: Broker) -> None:
    """No room for every record, one record too big, an unknown partition or topic:
    refused whole, nothing queued."""
    producer = make_producer(
        db_url, queue_buffering_max_messages=10, linger_ms=60_000, allow_auto_create_topics=False
    )
    try:
        producer.produce_batch("t", 0, [b"a"] * 8)
        with pytest.raises(BufferError):
            producer.produce_batch("t", 0, [b"b"] * 3)
        assert len(producer) == 8
        with pytest.raises(KafkaException) as too_big:
            producer.produce_batch("t", 1, [b"c", b"x" * 2_000_000])
        assert too_big.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
        with pytest.raises(KafkaException) as unknown:
            producer.produce_batch("t", 3, [b"d"])
        assert unknown.value.args[0].code() == KafkaError._UNKNOWN_PARTITION
        with pytest.raises(KafkaException) as no_topic:
            producer.produce_batch("no-such-topic", 0, [b"e"])
        assert no_topic.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
        assert len(producer) == 8
        assert producer.flush(30) == 0
    finally:
        producer.close()
    assert [v for _, _, _, v, *_ in stored(broker)] == [b"a"] * 8


def test_unknown_topic_is_a_delivery_error(db_url: str, broker: Broker) -> None:
    """Without auto-creation (the producer's allow.auto.create.topics off)."""
    reports, on_delivery = collector()
    with make_producer(db_url, allow_auto_create_topics=False) as producer:
        producer.produce("no-such-topic", value="x", on_delivery=on_delivery)
        assert producer.flush(30) == 0
        create_topic(broker, "later", 1)
        producer.produce("later", value="y", on_delivery=on_delivery)
        assert producer.flush(30) == 0
    (err, msg), (err2, msg2) = reports
    assert err is not None and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    assert msg.error() == err and msg.topic() == "no-such-topic"
    assert err2 is None and msg2.offset() == 0


def test_unknown_partition_raises(db_url: str, broker: Broker) -> None:
    with make_producer(db_url) as producer:
        with pytest.raises(KafkaException) as info:
            producer.produce("t", value="x", partition=3)
        assert info.value.args[0].code() == KafkaError._UNKNOWN_PARTITION
        assert len(producer) == 0


def test_oversized_record_raises(db_url: str, broker: Broker) -> None:
    with make_producer(db_url, message_max_bytes=1000) as producer:
        with pytest.raises(KafkaException) as info:
            producer.produce("t", value=b"x" * 2000, partition=0)
        assert info.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
        producer.produce("t", value=b"x" * 500, partition=0)
        assert producer.flush(30) == 0


def test_bad_arguments_raise(db_url: str, broker: Broker) -> None:
    with make_producer(db_url) as producer:
        with pytest.raises(KafkaException):
            producer.produce("t", value=12345)
        with pytest.raises(KafkaException):
            producer.produce("t", value="x", headers="nope")  # type: ignore[arg-type]
    with pytest.raises(KafkaException):
        make_producer(db_url, linger_ms="soon")


def test_closed_producer_refuses_to_produce(db_url: str, broker: Broker) -> None:
    producer = make_producer(db_url)
    producer.produce("t", value="x", partition=0)
    assert producer.close() == 0
    with pytest.raises(ClientClosedError) as info:
        producer.produce("t", value="y", partition=0)
    assert isinstance(info.value, KafkaException) and isinstance(info.value, RuntimeError)
    assert len(stored(broker)) == 1


def test_produce_from_many_threads(db_url: str, broker: Broker) -> None:
    reports, on_delivery = collector()
    lock = threading.Lock()

    def safe(err: KafkaError | None, msg: Message) -> None:
        with lock:
            on_delivery(err, msg)

    with make_producer(db_url, batch_num_messages=64) as producer:

        def worker(n: int) -> None:
            for i in range(500):
                producer.produce("t", value=f"{n}:{i}", key=f"w{n}", on_delivery=safe)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert producer.flush(30) == 0
    assert len(reports) == 2000 and all(err is None for err, _ in reports)
    rows = stored(broker)
    assert len(rows) == 2000
    # Per key (one partition each), each thread's records are in production order.
    for n in range(4):
        mine = [r for r in rows if r.key == f"w{n}".encode()]
        assert [int(r.value.split(b":")[1]) for r in mine] == list(range(500))
    # Offsets reported equal offsets stored.
    by_value = {r.value: (r.partition, r.offset) for r in rows}
    assert all(by_value[m.value()] == (m.partition(), m.offset()) for _, m in reports)


def test_headers_and_timestamps_round_trip(db_url: str, broker: Broker) -> None:
    reports, on_delivery = collector()
    headers = [("trace", b"abc"), ("trace", b"def"), ("empty", None), ("text", "ünï")]
    with make_producer(db_url) as producer:
        producer.produce(
            "t",
            value="v",
            key="k",
            partition=0,
            timestamp=1_600_000_000_123,
            headers=headers,
            on_delivery=on_delivery,
        )
        producer.produce("t", value="w", partition=0, headers={"h": b"1"}, on_delivery=on_delivery)
        producer.produce("t", value="plain", partition=0, on_delivery=on_delivery)
        assert producer.flush(30) == 0
    (_, first), (_, second), (_, third) = reports
    assert (first.key(), first.value(), first.offset(), first.partition()) == (b"k", b"v", 0, 0)
    assert first.headers() == [
        ("trace", b"abc"),
        ("trace", b"def"),
        ("empty", None),
        ("text", "ünï".encode()),
    ]
    assert second.headers() == [("h", b"1")] and third.headers() is None
    assert all(m.latency() >= 0 and m.error() is None for m in (first, second, third))
    assert first.timestamp() == (TIMESTAMP_CREATE_TIME, 1_600_000_000_123)
    assert second.timestamp()[0] == TIMESTAMP_CREATE_TIME and second.timestamp()[1] > 0
    with Consumer({"database.url": db_url}) as consumer:
        consumer.assign([TopicPartition("t", 0, OFFSET_BEGINNING)])
        got = consumer.consume(3, timeout=30)
    assert [m.value() for m in got] == [b"v", b"w", b"plain"]
    assert got[0].key() == b"k"
    assert got[0].headers() == [
        ("trace", b"abc"),
        ("trace", b"def"),
        ("empty", None),
        ("text", "ünï".encode()),
    ]
    assert got[1].headers() == [("h", b"1")]
    assert got[2].headers() is None
    assert [m.timestamp() for m in got] == [m.timestamp() for _, m in reports]


def test_queued_records_are_tuples_the_garbage_collector_lets_go(
    db_url: str, broker: Broker
) -> None:
    """A queued record, callback and all, is nothing the collector keeps tracking: with a
    deep queue, its full collections would otherwise walk every record again and again,
    and that was half of produce()'s time."""
    tracked: list[bool] = []
    reports, on_delivery = collector()
    with make_producer(db_url) as producer:
        send = producer.sender.transport

        def transport(request: Any) -> Any:
            gc.collect()
            tracked.extend(gc.is_tracked(r) for b in request.batches for r in b.records)
            return send(request)

        producer.sender.transport = transport
        for i in range(3):
            producer.produce("t", value=b"v%d" % i, key=b"k", partition=0, on_delivery=on_delivery)
        assert producer.flush(30) == 0
    assert tracked == [False, False, False] and len(reports) == 3


def _scripted_handler(
    answers: list[int], calls: list[ProduceRequest]
) -> Callable[[Broker, ProduceRequest], ProduceResponse]:
    """Answer with the given error codes first, then pass through to the real handler."""

    def handler(broker: Broker, request: ProduceRequest) -> ProduceResponse:
        calls.append(request)
        if answers:
            return ProduceResponse(answers.pop(0), error_message="scripted")
        return produce_handler(broker, request)

    return handler


def test_retriable_errors_are_retried_with_the_same_sequence(db_url: str, broker: Broker) -> None:
    reports, on_delivery = collector()
    calls: list[ProduceRequest] = []
    # One batch of three, sent at the flush however slowly the records come.
    with make_producer(db_url, retry_backoff_ms=1, linger_ms=10_000) as producer:
        handler = _scripted_handler(
            [KafkaError.REQUEST_TIMED_OUT, KafkaError.NOT_COORDINATOR], calls
        )
        producer.sender.transport = batchwise(producer.sender.broker, handler)
        for i in range(3):
            producer.produce("t", value=str(i), partition=0, on_delivery=on_delivery)
        assert producer.flush(30) == 0
    assert len(calls) == 3
    assert (
        len({(c.producer_id, c.producer_epoch, c.base_sequence, len(c.records)) for c in calls})
        == 1
    )
    assert [(err, m.offset()) for err, m in reports] == [(None, 0), (None, 1), (None, 2)]


def test_non_retriable_error_fails_every_record_of_the_batch(db_url: str, broker: Broker) -> None:
    reports, on_delivery = collector()
    calls: list[ProduceRequest] = []
    with make_producer(db_url, linger_ms=10_000) as producer:
        producer.sender.transport = batchwise(
            producer.sender.broker, _scripted_handler([KafkaError.INVALID_RECORD], calls)
        )
        for i in range(4):
            producer.produce("t", value=str(i), partition=0, on_delivery=on_delivery)
        assert producer.flush(30) == 0
        failed_identity = (calls[0].producer_id, calls[0].base_sequence)
        # The producer carries on, with a new identity so sequences line up again.
        producer.produce("t", value="next", partition=0, on_delivery=on_delivery)
        assert producer.flush(30) == 0
    assert [err.code() if err else None for err, _ in reports] == [
        KafkaError.INVALID_RECORD
    ] * 4 + [None]
    assert calls[-1].producer_id != failed_identity[0] and calls[-1].base_sequence == 0
    assert [r.value for r in stored(broker)] == [b"next"]


def test_message_timeout_ends_retries(db_url: str, broker: Broker) -> None:
    reports, on_delivery = collector()
    calls: list[ProduceRequest] = []
    with make_producer(
        db_url, retry_backoff_ms=20, message_timeout_ms=300, linger_ms=0
    ) as producer:
        producer.sender.transport = batchwise(
            producer.sender.broker, _scripted_handler([KafkaError.REQUEST_TIMED_OUT] * 1000, calls)
        )
        producer.produce("t", value="x", partition=0, on_delivery=on_delivery)
        assert producer.flush(30) == 0
    ((err, msg),) = reports
    assert err is not None and err.code() == KafkaError._MSG_TIMED_OUT
    assert msg.offset() == -1 and len(calls) >= 1


def test_an_unknown_topic_is_created_as_librdkafka_asks(
    db_url: str, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Producer asks for an unknown topic to be created (allow.auto.create.topics, on
    by default as in librdkafka), with the broker's num.partitions; a broker that does not
    auto-create (KIP98_AUTO_CREATE_TOPICS=false) leaves it unknown."""
    monkeypatch.setenv("KIP98_NUM_PARTITIONS", "3")
    reports, on_delivery = collector()
    with make_producer(db_url) as producer:
        producer.produce("made", value="x", key="k", on_delivery=on_delivery)
        assert producer.flush(10) == 0
    [(err, msg)] = reports
    assert err is None and msg.offset() == 0
    assert describe_topic(broker, "made").num_partitions == 3

    monkeypatch.setenv("KIP98_AUTO_CREATE_TOPICS", "false")
    reports.clear()
    with make_producer(db_url) as producer:
        producer.produce("not-made", value="x", on_delivery=on_delivery)
        assert producer.flush(10) == 0
    [(err, _)] = reports
    assert err is not None and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    assert "not-made" not in {t.topic for t in list_topics(broker)}
