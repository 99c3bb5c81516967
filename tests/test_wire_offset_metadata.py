"""Offset metadata over the wire, as clients' own tests send it: any string, NUL included,
committed and fetched back exactly by librdkafka, kafka-python and aiokafka; one
partition's metadata over offset.metadata.max.bytes answered OFFSET_METADATA_TOO_LARGE,
the others committed, the connection open throughout. Against a real ``kip98 serve``."""

from __future__ import annotations

import asyncio

import confluent_kafka as ck
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as AioTp
from aiokafka.structs import OffsetAndMetadata as AioOffset
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTp
from kafka.structs import OffsetAndMetadata as KpOffset
from sqlalchemy import text

from app.broker import Broker
from app.client import Consumer, TopicPartition
from app.log.topics import create_topic
from tests.helpers.wire_client import serving

NUL = "before\x00after \u2603 \U0001f600"
# librdkafka's metadata is a C string: everything but NUL (which kafka-python and aiokafka
# send, below). It sends the string's terminating NUL too, which Kafka keeps as part of
# the string, and so does kip98 (librdkafka reads it back up to the NUL).
WIDE = "\u2603 \U0001f600 \u00e9"
SENT = WIDE + "\x00"
TOO_LONG = "m" * 4097


def test_metadata_round_trips_through_every_client(db_url: str) -> None:
    broker = Broker.connect(db_url)
    create_topic(broker, "t", 3)
    with serving(db_url) as server:
        c = ck.Consumer({"bootstrap.servers": server, "group.id": "rk",
                         "enable.auto.commit": False})  # fmt: skip
        try:
            # librdkafka raises the first partition's error; the others were committed.
            with pytest.raises(ck.KafkaException) as refused:
                c.commit(
                    offsets=[ck.TopicPartition("t", 0, 5, WIDE),
                             ck.TopicPartition("t", 1, 6, TOO_LONG),
                             ck.TopicPartition("t", 2, 7, "")],
                    asynchronous=False,
                )  # fmt: skip
            assert refused.value.args[0].code() == ck.KafkaError.OFFSET_METADATA_TOO_LARGE
            fetched = c.committed([ck.TopicPartition("t", p) for p in range(3)], timeout=30)
            assert [(tp.offset, tp.metadata) for tp in fetched] == [
                (5, WIDE), (ck.OFFSET_INVALID, None), (7, ""),
            ]  # fmt: skip
        finally:
            c.close()

        kp = KafkaConsumer(bootstrap_servers=server, group_id="kp", enable_auto_commit=False)
        try:
            kp.commit({KpTp("t", 0): KpOffset(3, NUL, -1)})
            assert kp.committed(KpTp("t", 0), metadata=True).metadata == NUL
        finally:
            kp.close()

        async def aio() -> str:
            consumer = AIOKafkaConsumer(bootstrap_servers=server, group_id="aio",
                                        enable_auto_commit=False)  # fmt: skip
            await consumer.start()
            try:
                consumer.assign([AioTp("t", 1)])
                await consumer.commit({AioTp("t", 1): AioOffset(9, NUL)})
                fetched = await consumer._coordinator.fetch_committed_offsets([AioTp("t", 1)])
                return str(fetched[AioTp("t", 1)].metadata)
            finally:
                await consumer.stop()

        assert asyncio.run(aio()) == NUL

    # The native client and the SQL views give the same back.
    with Consumer({"database.url": db_url, "group.id": "rk"}) as native:
        [tp] = native.committed([TopicPartition("t", 0)])
        assert (tp.offset, tp.metadata) == (5, SENT)
    with broker.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT group_id, metadata FROM consumer_group_lag WHERE partition = 0 "
                 "ORDER BY group_id")
        ).all()  # fmt: skip
    assert [(g, bytes(m).decode()) for g, m in rows] == [("kp", NUL), ("rk", SENT)]
