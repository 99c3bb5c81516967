"""What librdkafka sends and expects that a Kafka broker takes in its stride: a full batch
of its default size, a Metadata request for all topics with bytes after its body, and
fetches answered up to ``max.partition.fetch.bytes`` however many reads of the log that
takes."""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any

import confluent_kafka as ck
import pytest
from aiokafka.record.memory_records import MemoryRecords

from app.broker import Broker
from app.client import Producer
from tests.helpers.txn_driver import read_values
from tests.helpers.wire_client import read_response, request_frame

pytestmark = pytest.mark.broker(topics={"t": 2, "out": 1})


def test_a_full_batch_of_librdkafkas_default_size_is_taken(server: str, broker: Broker) -> None:
    """message.max.bytes limits a batch as it came over the wire. Counted as stored rows
    (each record's fixed overhead larger than its varint-framed form), librdkafka's
    default 1,000,000-byte batch of small records came to more than the limit."""
    # Batches go when full (or at the flush), however slowly the records come.
    producer = ck.Producer({"bootstrap.servers": server, "enable.idempotence": True,
                            "linger.ms": 60_000})  # fmt: skip
    errors: list[Any] = []
    for i in range(9000):
        producer.produce("t", os.urandom(50).hex().encode(), f"{i:016d}".encode(), partition=0,
                         on_delivery=lambda err, msg: errors.append(err) if err else None)  # fmt: skip
    assert producer.flush(60) == 0
    assert errors == []
    with broker.engine.connect() as conn:
        sizes = conn.exec_driver_sql(
            "SELECT count(*) FROM records WHERE topic = 't' GROUP BY batch_base_offset"
        ).scalars()
        assert max(sizes) > 7000  # one batch was librdkafka's full one
    assert len(read_values(broker, "t", 0)) == 9000


def test_metadata_for_all_topics_is_answered(server: str, broker: Broker) -> None:
    """librdkafka's Metadata for all topics (v9 on) leaves 3 bytes of a 4-byte slot after
    the compact null; Kafka reads what it needs and ignores them."""
    metadata = ck.Producer({"bootstrap.servers": server}).list_topics(timeout=60)
    assert {name: len(t.partitions) for name, t in metadata.topics.items()} == {"t": 2, "out": 1}
    admin = ck.admin.AdminClient({"bootstrap.servers": server})
    assert set(admin.list_topics(timeout=60).topics) == {"t", "out"}


def test_a_fetch_is_filled_past_one_read_of_the_log(
    server: str, broker: Broker, db_url: str
) -> None:
    """5,013 offsets (two committed transactions of 2,500 records around an aborted one of
    10, and their markers) in one read_committed Fetch of 1 MiB: more than one read of the
    log returns, so the answer joins several, and lists the aborted transaction found by a
    later one."""
    from kio.schema.fetch.v12 import request as fetch_v12

    native = Producer({"database.url": db_url, "transactional.id": "fill", "linger.ms": 50})
    try:
        native.init_transactions()
        for n, commit in ((2500, True), (10, False), (2500, True)):
            native.begin_transaction()
            for i in range(n):
                native.produce("t", f"{commit}-{i}", partition=0)
            native.flush()
            if commit:
                native.commit_transaction()
            else:
                native.abort_transaction()
    finally:
        native.close()
    fetch = fetch_v12.FetchRequest(
        replica_id=-1, max_wait=datetime.timedelta(seconds=1), min_bytes=1, max_bytes=1 << 20,
        isolation_level=1, session_id=0, session_epoch=-1, topics=(fetch_v12.FetchTopic(
            topic="t", partitions=(fetch_v12.FetchPartition(
                partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                log_start_offset=-1, partition_max_bytes=1 << 20),)),),
        forgotten_topics_data=(), rack_id="")  # fmt: skip
    host, port = server.split(":")
    with socket.create_connection((host, int(port)), 10) as s:
        s.sendall(request_frame(1, 12, fetch))
        s.settimeout(30)
        answer = read_response(s, 1, 12)
    [partition] = answer.responses[0].partitions
    assert (partition.high_watermark, partition.last_stable_offset) == (5013, 5013)
    [aborted] = partition.aborted_transactions
    assert aborted.first_offset == 2501
    records = MemoryRecords(partition.records)
    offsets, control = [], []
    while (batch := records.next_batch()) is not None:
        assert batch.validate_crc()
        batch_offsets = [r.offset for r in batch]
        offsets += batch_offsets
        if batch.is_control_batch:
            control += batch_offsets
    assert offsets == list(range(5013))
    assert control == [2500, 2511, 5012]
