"""The bulk-built binary COPY payload of a produce batch: every column of every row lands
in ``records`` exactly as the handler means it (NULL and empty keys and values, headers,
timestamps stamped by the broker, sequences wrapping, the transactional flag), in one COPY
or cut into several where that costs the server less."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text

from app.broker import Broker
from app.broker.produce import produce, produce_batches
from app.client.message import encode_headers
from app.clock import ManualClock
from app.log.copy_records import (
    SIGNATURE,
    TRAILER,
    Columns,
    copy_payload_of,
    copy_payloads_of,
    copy_statements,
    encode_rows,
)
from app.log.producer_state import INT32_MAX
from app.protocol import ProduceBatchesRequest, ProduceRequest, RecordIn, record_size_bytes
from tests.helpers.identities import identity_at_epoch

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
    """Later than the records' own timestamps, so a stamp by the broker tells apart."""
    return ManualClock(start_ms=5_000_000)


pytestmark = pytest.mark.broker(topics={"t_copy.x-1": 3}, manual_clock=True)


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


# ---------------------------------------------- rows cut into several COPYs (design §3.10)


def test_a_write_is_cut_into_copies_only_where_it_pays() -> None:
    assert [copy_statements(n) for n in (0, 1, 200, 500, 650)] == [1] * 5
    assert copy_statements(700) == 2
    assert copy_statements(1000) == 3
    assert [copy_statements(n) for n in (1500, 2000, 4000, 100_000)] == [1] * 4


@given(st.integers(min_value=1, max_value=20_000))
def test_copies_never_buffer_more_than_one_copy_would(rows: int) -> None:
    copies = copy_statements(rows)
    assert 1 <= copies <= 8
    if copies > 1:
        assert -(-rows // copies) < min(rows, 1000)


def _batch(n: int, headers: bool, base: int) -> tuple[list[bytes], int]:
    records = [
        RecordIn(b"k%d" % i, None if i % 7 == 0 else b"v" * (i % 50), 1 + i,
                 encode_headers({"i": str(i)}) if headers and i % 2 else None)
        for i in range(n)
    ]  # fmt: skip
    columns = Columns(records)
    req = ProduceRequest("t", 0, records, 5, 0, base)
    return encode_rows(req, base, columns, columns.stamped(9)), n


@given(st.lists(st.tuples(st.integers(1, 700), st.booleans()), min_size=1, max_size=4))
def test_the_pieces_hold_the_rows_in_order_each_a_whole_copy(
    shapes: list[tuple[int, bool]],
) -> None:
    batches, base = [], 0
    for n, headers in shapes:
        batches.append(_batch(n, headers, base))
        base += n
    given = [list(parts) for parts, _ in batches]
    pieces = copy_payloads_of(batches)
    assert [parts for parts, _ in batches] == given  # the batches' parts left as they were
    whole = copy_payload_of(given)
    assert len(pieces) == copy_statements(base)
    assert all(p.startswith(SIGNATURE) and p.endswith(TRAILER) for p in pieces)
    body = slice(len(SIGNATURE), -len(TRAILER))
    assert b"".join(p[body] for p in pieces) == whole[body]


def test_a_request_of_1000_rows_goes_in_three_copies_and_round_trips(
    broker: Broker, clock: ManualClock, copies_written: list[int]
) -> None:
    """Several batches, one DB transaction (the lock's way): every column as one COPY
    would have written it."""
    pid, epoch = identity_at_epoch(broker, "copies", 0)
    many = [RecordIn(r.key, r.value, r.timestamp, r.headers) for r in RECORDS * 100]
    requests = [
        ProduceRequest("t_copy.x-1", p, many[:500] if p == 0 else many[:250], pid, epoch, 0)
        for p in range(3)
    ]
    responses = produce_batches(broker, ProduceBatchesRequest(requests)).batches
    assert [r.error_code for r in responses] == [0, 0, 0]
    assert copies_written == [3]
    with broker.engine.connect() as conn:
        rows = conn.execute(
            text(f'SELECT {COLUMNS} FROM records ORDER BY partition, "offset"')
        ).all()
    assert len(rows) == 1000
    assert [tuple(r)[2:7] for r in rows if r[1] == 0] == [
        (i, r.timestamp or clock.now_ms(), r.key, r.value, r.headers)
        for i, r in enumerate(many[:500])
    ]


def test_a_lone_batch_of_1000_on_a_remembered_row_goes_in_three_copies(
    broker: Broker, copies_written: list[int]
) -> None:
    pid, epoch = identity_at_epoch(broker, "lone", 0)
    values = [b"%d" % i for i in range(1001)]
    first = ProduceRequest("t_copy.x-1", 1, [RecordIn(None, values[0], 1)], pid, epoch, 0)
    assert produce(broker, first).error_code == 0  # the row is remembered from here on
    rest = [RecordIn(None, v, 1) for v in values[1:]]
    assert produce(broker, ProduceRequest("t_copy.x-1", 1, rest, pid, epoch, 1)).base_offset == 1
    assert copies_written[-1] == 3
    with broker.engine.connect() as conn:
        stored_values = (
            conn.execute(text('SELECT value FROM records WHERE partition = 1 ORDER BY "offset"'))
            .scalars()
            .all()
        )
    assert stored_values == values
