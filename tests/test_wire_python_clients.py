"""kafka-python and aiokafka against ``kip98 serve``, unchanged but for bootstrap_servers:
transactions committed and aborted, read_committed consumers in a group, offsets sent in
the transaction; and every client reading what every other client wrote, the native one
included."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import confluent_kafka as ck
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition
from kafka.structs import OffsetAndMetadata as KpOffsetAndMetadata

from app.broker import Broker
from app.client import Consumer, Producer, TopicPartition
from app.log.topics import create_topic
from tests.helpers.txn_driver import read_values
from tests.helpers.wire_client import consume_all

# One record as every client sees it: (partition, key, value, headers).
Seen = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]]]


pytestmark = pytest.mark.broker(topics={"in": 2, "out": 1})


# ------------------------------------------------------------------ kafka-python


def test_kafka_python_copies_exactly_once_with_a_group_and_offsets_in_the_transaction(
    server: str, broker: Broker
) -> None:
    producer = KafkaProducer(bootstrap_servers=server, transactional_id="kp-copier")
    consumer = KafkaConsumer(
        "in", bootstrap_servers=server, group_id="kp-group", isolation_level="read_committed",
        auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=20_000,
    )  # fmt: skip
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(6):
            producer.send("in", f"aborted{i}".encode(), partition=i % 2)
        producer.flush()  # written, then aborted (unsent records would just be dropped)
        producer.abort_transaction()
        producer.begin_transaction()
        for i in range(6):
            producer.send("in", f"kept{i}".encode(), partition=i % 2)
        producer.commit_transaction()

        got = []
        for msg in consumer:  # subscribed: the group assigns both partitions to it
            got.append(msg)
            if len(got) == 6:
                break
        assert sorted(m.value for m in got) == [f"kept{i}".encode() for i in range(6)]

        producer.begin_transaction()
        for m in got:
            producer.send("out", m.value.upper(), partition=0)
        offsets = {
            KpTopicPartition("in", p): KpOffsetAndMetadata(
                max(m.offset for m in got if m.partition == p) + 1, "", -1
            )
            for p in (0, 1)
        }
        producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
        producer.commit_transaction()
        # Offsets 0-2 aborted, 3 its marker, 4-6 kept: the next one to read is 7.
        assert [consumer.committed(KpTopicPartition("in", p)) for p in (0, 1)] == [7, 7]
    finally:
        consumer.close()
        producer.close()
    assert sorted(read_values(broker, "out", 0)) == [f"KEPT{i}" for i in range(6)]


# ------------------------------------------------------------------ aiokafka


def test_aiokafka_copies_exactly_once_with_a_group_and_offsets_in_the_transaction(
    server: str, broker: Broker
) -> None:
    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=server, transactional_id="aio-copier")
        consumer = AIOKafkaConsumer(
            "in", bootstrap_servers=server, group_id="aio-group",
            isolation_level="read_committed", auto_offset_reset="earliest",
            enable_auto_commit=False,
        )  # fmt: skip
        await producer.start()
        await consumer.start()
        try:
            async with producer.transaction():
                for i in range(6):
                    await producer.send("in", f"kept{i}".encode(), partition=i % 2)
            with pytest.raises(RuntimeError):
                async with producer.transaction():
                    for i in range(6):
                        await producer.send("in", f"aborted{i}".encode(), partition=i % 2)
                    await producer.flush()  # written, then aborted
                    raise RuntimeError("the application gives up: the transaction aborts")

            got: list[Any] = []

            async def read() -> None:
                async for msg in consumer:
                    got.append(msg)
                    if len(got) == 6:
                        return

            await asyncio.wait_for(read(), 30)
            assert sorted(m.value for m in got) == [f"kept{i}".encode() for i in range(6)]
            async with producer.transaction():
                for m in got:
                    await producer.send("out", m.value.upper(), partition=0)
                offsets = {
                    AioTopicPartition("in", p): max(m.offset for m in got if m.partition == p) + 1
                    for p in (0, 1)
                }
                await producer.send_offsets_to_transaction(offsets, "aio-group")
            committed = [await consumer.committed(AioTopicPartition("in", p)) for p in (0, 1)]
            assert committed == [3, 3]
            # Nothing of the aborted transaction reaches a read_committed consumer.
            assert await consumer.getmany(timeout_ms=1000) == {}
        finally:
            await consumer.stop()
            await producer.stop()

    asyncio.run(run())
    assert sorted(read_values(broker, "out", 0)) == [f"KEPT{i}" for i in range(6)]


# ------------------------------------------------------------------ every client reads every client

HEADERS = [("h", b"1")]


def _native_write(server: str, db_url: str, partition: int, values: list[bytes]) -> None:
    producer = Producer({"database.url": db_url, "enable.idempotence": True})
    try:
        for v in values:
            producer.produce("in", v, key=b"k", partition=partition, headers=HEADERS)
        producer.flush()
    finally:
        producer.close()


def _confluent_write(server: str, db_url: str, partition: int, values: list[bytes]) -> None:
    producer = ck.Producer({"bootstrap.servers": server, "enable.idempotence": True})
    for v in values:
        producer.produce("in", v, key=b"k", partition=partition, headers=HEADERS)
    assert producer.flush(30) == 0


def _kafka_python_write(server: str, db_url: str, partition: int, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=server, enable_idempotence=True)
    try:
        for v in values:
            producer.send("in", v, key=b"k", partition=partition, headers=HEADERS).get(30)
    finally:
        producer.close()


def _aiokafka_write(server: str, db_url: str, partition: int, values: list[bytes]) -> None:
    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=server, enable_idempotence=True)
        await producer.start()
        try:
            for v in values:
                await producer.send_and_wait("in", v, key=b"k", partition=partition,
                                             headers=HEADERS)  # fmt: skip
        finally:
            await producer.stop()

    asyncio.run(run())


def _native_read(server: str, db_url: str, want: int) -> list[Seen]:
    consumer = Consumer({"database.url": db_url, "group.id": "native-reader",
                         "isolation.level": "read_committed"})  # fmt: skip
    try:
        consumer.assign([TopicPartition("in", p, 0) for p in range(4)])
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < want and time.monotonic() < deadline:
            got += [m for m in consumer.consume(100, 0.5) if m.error() is None]
        return [(m.partition(), m.key(), m.value(), list(m.headers() or [])) for m in got]
    finally:
        consumer.close()


def _confluent_read(server: str, db_url: str, want: int) -> list[Seen]:
    consumer = ck.Consumer({"bootstrap.servers": server, "group.id": "ck-reader",
                            "isolation.level": "read_committed"})  # fmt: skip
    try:
        consumer.assign([ck.TopicPartition("in", p, 0) for p in range(4)])
        got = consume_all(consumer, want)
        return [(m.partition(), m.key(), m.value(), list(m.headers() or [])) for m in got]
    finally:
        consumer.close()


def _kafka_python_read(server: str, db_url: str, want: int) -> list[Seen]:
    consumer = KafkaConsumer(bootstrap_servers=server, isolation_level="read_committed",
                             consumer_timeout_ms=20_000)  # fmt: skip
    try:
        consumer.assign([KpTopicPartition("in", p) for p in range(4)])
        consumer.seek_to_beginning()
        got = []
        for m in consumer:
            got.append((m.partition, m.key, m.value, list(m.headers)))
            if len(got) == want:
                break
        return got
    finally:
        consumer.close()


def _aiokafka_read(server: str, db_url: str, want: int) -> list[Seen]:
    async def run() -> list[Seen]:
        consumer = AIOKafkaConsumer(bootstrap_servers=server, isolation_level="read_committed")
        await consumer.start()
        try:
            consumer.assign([AioTopicPartition("in", p) for p in range(4)])
            await consumer.seek_to_beginning()
            got: list[Seen] = []
            deadline = time.monotonic() + 30
            while len(got) < want and time.monotonic() < deadline:
                for msgs in (await consumer.getmany(timeout_ms=500)).values():
                    got += [(m.partition, m.key, m.value, list(m.headers)) for m in msgs]
            return got
        finally:
            await consumer.stop()

    return asyncio.run(run())


Writer = Callable[[str, str, int, list[bytes]], None]
Reader = Callable[[str, str, int], list[Seen]]
WRITERS: dict[str, Writer] = {
    "native": _native_write, "confluent": _confluent_write,
    "kafka-python": _kafka_python_write, "aiokafka": _aiokafka_write,
}  # fmt: skip
READERS: dict[str, Reader] = {
    "native": _native_read, "confluent": _confluent_read,
    "kafka-python": _kafka_python_read, "aiokafka": _aiokafka_read,
}  # fmt: skip


def test_every_client_reads_what_every_client_wrote(server: str, db_url: str) -> None:
    """Each writer has a partition of its own; each reader must see all four writers'
    records, keys, values and headers, in each partition's order."""
    create_topic(Broker.connect(db_url), "in", 4)
    expected: list[Seen] = []
    for partition, (name, write) in enumerate(WRITERS.items()):
        values = [f"{name}-{i}".encode() for i in range(3)]
        write(server, db_url, partition, values)
        expected += [(partition, b"k", v, HEADERS) for v in values]
    for name, read in READERS.items():
        seen = read(server, db_url, len(expected))
        assert sorted(seen, key=lambda s: s[0]) == expected, name
