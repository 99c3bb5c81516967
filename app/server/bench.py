"""What the wire costs a Kafka client, as ratios to the native client in the same run.

The native Producer and Consumer call the broker in process; a Kafka client (librdkafka,
through confluent-kafka) reaches the very same handlers through ``kip98 serve``. Both
sides here are given the same rows and the same settings (an idempotent producer with
``linger.ms`` 5, a read_committed consumer reading from offset 0), so a ratio shows what
the server adds or saves: frames, record batches and a socket on one side, the native
client's Python per record on the other.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import confluent_kafka as ck

from app.client import Consumer, Producer, TopicPartition

Rows = Sequence[tuple[bytes, bytes]]
PRODUCER = {"enable.idempotence": True, "linger.ms": 5}
CONSUMER = {
    "group.id": "bench-wire",
    "isolation.level": "read_committed",
    "auto.offset.reset": "earliest",
    "enable.auto.commit": False,
}


def _produce_all(
    produce: Callable[[bytes, bytes], None], poll: Callable[[], Any], data: Rows
) -> None:
    for key, value in data:
        while True:
            try:
                produce(key, value)
                break
            except BufferError:
                poll()


def native_produce(url: str, topic: str, data: Rows) -> float:
    """Seconds for the native idempotent Producer to produce ``data`` to partition 0 and
    have every record acknowledged."""
    p = Producer({"database.url": url, **PRODUCER})
    try:
        return _timed_produce(p, topic, data)
    finally:
        p.close()


def wire_produce(bootstrap: str, topic: str, data: Rows) -> float:
    """The same through ``kip98 serve``, by librdkafka's idempotent producer."""
    return _timed_produce(ck.Producer({"bootstrap.servers": bootstrap, **PRODUCER}), topic, data)


def _timed_produce(p: Any, topic: str, data: Rows) -> float:
    """Both producers have confluent-kafka's API: produce, poll, flush, delivery reports."""
    errors: list[Any] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)

    start = time.perf_counter()
    _produce_all(
        lambda k, v: p.produce(topic, v, k, partition=0, on_delivery=report),
        lambda: p.poll(0.01),
        data,
    )
    assert p.flush(120) == 0
    elapsed = time.perf_counter() - start
    assert not errors, errors[:3]
    return elapsed


def native_consume(url: str, topic: str, expected: int) -> float:
    """Seconds for a read_committed native Consumer to read partition 0 from offset 0 up
    to ``expected`` records."""
    c = Consumer({"database.url": url, **CONSUMER})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        return _consume_all(lambda: c.consume(1000, timeout=5), expected)
    finally:
        c.close()


def wire_consume(bootstrap: str, topic: str, expected: int) -> float:
    """The same through ``kip98 serve``, by librdkafka's consumer."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, **CONSUMER})
    try:
        c.assign([ck.TopicPartition(topic, 0, 0)])
        return _consume_all(lambda: c.consume(1000, timeout=5), expected)
    finally:
        c.close()


def _consume_all(consume: Callable[[], list[Any]], expected: int) -> float:
    n = 0
    start = time.perf_counter()
    while n < expected:
        msgs = consume()
        if not msgs:
            raise RuntimeError(f"{n} of {expected} records read, then nothing for 5 s")
        n += sum(1 for m in msgs if m.error() is None)
    return time.perf_counter() - start


def wire_latency(bootstrap: str, topic: str, samples: int) -> tuple[float, float]:
    """Produce → returned by an idle read_committed consumer's poll, through ``kip98 serve``
    (ms, p50 and p99): one record at a time from a producer with ``linger.ms`` 0, each
    acknowledged before the next, 50 ms apart as the native latency figure has them."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, **CONSUMER, "fetch.wait.max.ms": 500})
    c.assign([ck.TopicPartition(topic, 0, 0)])
    p = ck.Producer({"bootstrap.servers": bootstrap, **PRODUCER, "linger.ms": 0})
    sent_at: dict[bytes, float] = {}
    latencies: list[float] = []
    arrived = threading.Event()
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                sent = sent_at.get(m.value() or b"")
                if sent is not None:
                    latencies.append((time.perf_counter() - sent) * 1000)
                arrived.set()

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        # The consumer is connected and fetching before the first sample.
        p.produce(topic, b"warm-up", partition=0)
        assert p.flush(30) == 0
        if not arrived.wait(30):
            raise RuntimeError("the consumer never received the warm-up record")
        for i in range(samples):
            value = f"v{i}".encode()
            sent_at[value] = time.perf_counter()
            p.produce(topic, value, partition=0)
            assert p.flush(30) == 0
            time.sleep(0.05)
        deadline = time.monotonic() + 10
        while len(latencies) < samples and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        done.set()
        thread.join()
        c.close()
    qs = statistics.quantiles(latencies, n=100)
    return statistics.median(latencies), qs[98]
