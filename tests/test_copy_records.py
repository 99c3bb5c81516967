"""The bulk-built binary COPY payload of a produce batch: every column of every row lands
in ``records`` exactly as the handler means it (NULL and empty keys and values, headers,
timestamps stamped by the broker, sequences wrapping, the transactional flag)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from app.broker import Broker
from app.broker.produce import produce
from app.client.message import encode_headers
from app.clock import ManualClock
from app.log.copy_records import Columns
from app.log.producer_state import INT32_MAX
from app.log.topics import create_topic
from app.protocol import ProduceRequest, RecordIn, record_size_bytes
from tests.identities import identity_at_epoch

COLUMNS = (
    'topic, partition, "offset", "timestamp", key, value, headers, producer_id, producer_epoch, '
    "sequence, batch_base_offset, is_transactional, is_control, control_type, coordinator_epoch"
)

RECORDS = [
    RecordIn(b"k0", b"v0", 1_000),
    RecordIn(None, b"v1", 0),
    RecordIn(b"", None, 2_000),
    RecordIn(None, None, 3_000, encode_headers([("h", b"\x00\xff"), ("n", None)])),
    RecordIn(b"k4" * 40, b"\x00" * 300, 4_000, encode_headers({"uni": "é"})),
]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start_ms=5_000_000)


@pytest.fixture
def broker(db_url: str, clock: ManualClock) -> Broker:
    b = Broker.connect(db_url, clock=clock)
    create_topic(b, "t_copy.x-1", 3)
    return b


def stored(broker: Broker) -> list[tuple[Any, ...]]:
    with broker.engine.connect() as conn:
        return [
            tuple(r) for r in conn.execute(text(f'SELECT {COLUMNS} FROM records ORDER BY "offset"'))
        ]


def expected(
    base: int, sequences: list[int], producer_id: int, epoch: int, txn: bool, now: int
) -> list[tuple[Any, ...]]:
    return [
        ("t_copy.x-1", 2, base + i, r.timestamp or now, r.key, r.value, r.headers,
         producer_id, epoch, sequences[i], base, txn, False, None, None)
        for i, r in enumerate(RECORDS)
    ]  # fmt: skip


def test_every_column_round_trips_idempotent_with_wrapping_sequences(
    broker: Broker, clock: ManualClock
) -> None:
    start = INT32_MAX - 2
    pid, epoch = identity_at_epoch(broker, "copy", 3)
    request = ProduceRequest("t_copy.x-1", 2, RECORDS, pid, epoch, start)
    assert produce(broker, request).error_code == 0
    sequences = [start, start + 1, INT32_MAX, 0, 1]
    assert stored(broker) == expected(0, sequences, pid, 3, False, clock.now_ms())


def test_every_column_round_trips_without_idempotence(broker: Broker, clock: ManualClock) -> None:
    assert produce(broker, ProduceRequest("t_copy.x-1", 2, RECORDS[:1])).base_offset == 0
    assert produce(broker, ProduceRequest("t_copy.x-1", 2, RECORDS)).base_offset == 1
    rows = stored(broker)[1:]
    assert rows == expected(1, [-1] * 5, -1, -1, False, clock.now_ms())


@pytest.mark.parametrize(
    "records",
    [
        RECORDS,  # NULL keys and values, headers
        [r for r in RECORDS if r.key is not None and r.value is not None],  # neither
        [RecordIn(None, b"v", 1), RecordIn(b"k", b"v", 1)],  # NULL keys only
        [RecordIn(b"k", None, 1), RecordIn(b"k", b"v", 1, [])],  # NULL values, empty headers
    ],
    ids=["nulls-and-headers", "no-nulls", "null-keys", "null-values"],
)
def test_batch_size_is_the_sum_of_record_sizes(records: list[RecordIn]) -> None:
    assert Columns(records).size_bytes() == sum(
        record_size_bytes(r.key, r.value, r.headers) for r in records
    )
    assert len(Columns(records)) == len(records)


def test_a_batch_left_wholly_to_the_broker_clock_is_stamped_with_it(
    broker: Broker, clock: ManualClock
) -> None:
    unstamped = [RecordIn(r.key, r.value, 0, r.headers) for r in RECORDS]
    assert produce(broker, ProduceRequest("t_copy.x-1", 2, unstamped)).base_offset == 0
    assert [row[3] for row in stored(broker)] == [clock.now_ms()] * len(RECORDS)
