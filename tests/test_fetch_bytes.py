"""Fetch's byte limits against a real PostgreSQL: ``max.partition.fetch.bytes`` is applied
in SQL, so records past the limit never leave the database (nor their values the TOAST
table), at least one record comes back, as Kafka returns at least one batch, and the
consumer's ``fetch.max.bytes`` spans the partitions of one fill without starving any."""

from __future__ import annotations

import random
from typing import Any

import pytest

from app.broker import Broker
from app.broker.produce import produce
from app.client.fetcher import Fetcher, FetchSettings
from app.log import fetch as fetch_module
from app.log import sql
from app.log.fetch import fetch
from app.protocol import (
    LOG_BATCH,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    RECORD_OFFSET,
    RECORD_VALUE,
    FetchRequest,
    LogRecord,
    ProduceRequest,
    RecordIn,
    RecordOut,
)
from app.settings import BrokerSettings
from tests.helpers.txn_driver import TxnDriver

VALUE_BYTES = 40_000
# What a fetch counts for one of those records: the overhead, the 2-byte key, the value.
RECORD_BYTES = 24 + 2 + VALUE_BYTES


pytestmark = pytest.mark.broker(topics={"t": 3}, transactional_id_expiration_ms=3_600_000)


def big_records(n: int, tag: int = 0) -> list[RecordIn]:
    """Incompressible values, so PostgreSQL stores each out of line in the TOAST table."""
    rng = random.Random(tag)
    return [RecordIn(f"{tag}{i}".encode()[-2:].rjust(2, b"k"), rng.randbytes(VALUE_BYTES), 0)
            for i in range(n)]  # fmt: skip


def offsets(records: list[RecordOut]) -> list[int]:
    return [r[RECORD_OFFSET] for r in records]


@pytest.mark.parametrize("level", [READ_UNCOMMITTED, READ_COMMITTED])
def test_a_limit_below_one_record_returns_exactly_one(broker: Broker, level: int) -> None:
    produce(broker, ProduceRequest("t", 0, big_records(12)))
    r = fetch(broker, FetchRequest("t", 0, 3, max_bytes=1000, isolation_level=level))
    assert offsets(r.records) == [3] and r.next_offset == 4
    assert r.records[0][RECORD_VALUE] is not None and len(r.records[0][RECORD_VALUE]) == VALUE_BYTES


@pytest.mark.parametrize("level", [READ_UNCOMMITTED, READ_COMMITTED])
def test_a_limit_of_two_and_a_half_records_returns_two(broker: Broker, level: int) -> None:
    produce(broker, ProduceRequest("t", 0, big_records(12)))
    r = fetch(
        broker, FetchRequest("t", 0, 0, max_bytes=RECORD_BYTES * 5 // 2, isolation_level=level)
    )
    assert offsets(r.records) == [0, 1] and r.next_offset == 2
    exact = fetch(
        broker, FetchRequest("t", 0, 10, max_bytes=2 * RECORD_BYTES, isolation_level=level)
    )
    assert offsets(exact.records) == [10, 11] and exact.next_offset == 12


def test_without_min_one_record_a_record_over_the_limit_stays_behind(broker: Broker) -> None:
    produce(broker, ProduceRequest("t", 0, big_records(3)))
    r = fetch(broker, FetchRequest("t", 0, 1, max_bytes=1000, min_one_record=False))
    assert r.error_code == 0 and r.records == [] and r.next_offset == 1
    two = fetch(
        broker, FetchRequest("t", 0, 0, max_bytes=2 * RECORD_BYTES + 10, min_one_record=False)
    )
    assert offsets(two.records) == [0, 1] and two.next_offset == 2


def spy_on_database_rows(monkeypatch: pytest.MonkeyPatch) -> list[list[RecordOut]]:
    """Every fetch's rows as the database cursor gave them."""
    seen: list[list[RecordOut]] = []
    original = fetch_module.read_records

    def spy(conn: Any, statement: str, params: dict[str, object]) -> list[RecordOut]:
        rows = original(conn, statement, params)
        seen.append(list(rows))
        return rows

    monkeypatch.setattr(fetch_module, "read_records", spy)
    return seen


def test_values_past_the_limit_never_leave_the_database(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    produce(broker, ProduceRequest("t", 0, big_records(12)))
    seen = spy_on_database_rows(monkeypatch)
    r = fetch(broker, FetchRequest("t", 0, 0, max_bytes=RECORD_BYTES * 5 // 2))
    assert offsets(r.records) == [0, 1]
    (rows,) = seen
    values_read = [row[RECORD_VALUE] for row in rows if row[RECORD_VALUE] is not None]
    assert sum(map(len, values_read)) == 2 * VALUE_BYTES, (
        f"the database sent {len(values_read)} values for a fetch that returns 2"
    )


def toast_blocks_of_each_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Per fetch, the blocks of the records table's TOAST relation its read touched
    (PostgreSQL's per-transaction counters, read in a transaction around the read)."""
    blocks: list[int] = []
    original = fetch_module.read_records
    counter = (
        "SELECT pg_stat_get_xact_blocks_fetched(reltoastrelid) FROM pg_class "
        "WHERE oid = 'records'::regclass"
    )

    def measured(conn: Any, statement: str, params: dict[str, object]) -> list[RecordOut]:
        driver = conn.connection.driver_connection
        driver.execute("BEGIN")
        before = driver.execute(counter).fetchone()[0]
        rows = original(conn, statement, params)
        blocks.append(driver.execute(counter).fetchone()[0] - before)
        driver.execute("COMMIT")
        return rows

    monkeypatch.setattr(fetch_module, "read_records", measured)
    return blocks


@pytest.mark.parametrize("level", [READ_UNCOMMITTED, READ_COMMITTED])
def test_a_fetch_reads_the_values_it_returns_and_no_others(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, level: int
) -> None:
    produce(broker, ProduceRequest("t", 0, big_records(12)))
    blocks = toast_blocks_of_each_read(monkeypatch)
    one_row = fetch(broker, FetchRequest("t", 0, 0, isolation_level=level, max_records=1))
    assert len(one_row.records) == 1
    (per_record,) = blocks
    assert per_record > 0, "the measure sees the TOAST reads"
    limited = fetch(broker, FetchRequest("t", 0, 0, max_bytes=1000, isolation_level=level))
    assert len(limited.records) == 1
    assert blocks[1] <= per_record, (
        f"a fetch returning one record read {blocks[1]} TOAST blocks, one record is {per_record}"
    )


def test_read_committed_within_bytes_skips_aborted_records(broker: Broker) -> None:
    """Committed and aborted transactions interleaved, read a few records at a time: the
    committed records come back in order, each fetch within its limit, and no aborted one."""
    d = TxnDriver(broker, "tx")
    assert d.init() == 0
    expected: list[bytes] = []
    for i in range(6):
        records = big_records(2, tag=i)
        assert d.send_records("t", 0, records).error_code == 0
        commit = i % 2 == 0
        assert d.end(commit=commit) == 0
        if commit:
            expected.extend(r.value for r in records if r.value is not None)
    for max_bytes in (1, RECORD_BYTES * 5 // 2, 3 * RECORD_BYTES):
        got: list[bytes] = []
        offset = 0
        while True:
            r = fetch(
                broker,
                FetchRequest("t", 0, offset, max_bytes=max_bytes, isolation_level=READ_COMMITTED),
            )
            assert r.error_code == 0
            assert len(r.records) <= max(1, max_bytes // RECORD_BYTES)
            got.extend(rec[RECORD_VALUE] or b"" for rec in r.records)
            if r.next_offset == offset:
                break
            offset = r.next_offset
        assert got == expected, f"max_bytes={max_bytes}"
        assert offset == 18, "6 transactions of two records and a marker"
    # Offsets 3-4 are aborted, 5 their marker: a fetch from 2 that has no room for a record
    # still moves past them, to the first committed record it left out.
    r = fetch(broker, FetchRequest("t", 0, 2, max_bytes=1000, min_one_record=False))
    assert r.records == [] and r.next_offset == 6
    r = fetch(broker, FetchRequest("t", 0, 2, max_bytes=RECORD_BYTES, min_one_record=False))
    assert offsets(r.records) == [6] and r.next_offset == 7


def fetcher(broker: Broker, max_bytes: int) -> Fetcher:
    settings = FetchSettings(READ_UNCOMMITTED, 1 << 20, "earliest", False, max_bytes)
    f = Fetcher(broker, settings)
    f.assign([("t", p, 0) for p in range(3)])
    return f


def test_fetch_max_bytes_spans_the_partitions_of_a_fill(broker: Broker) -> None:
    for p in range(3):
        produce(broker, ProduceRequest("t", p, big_records(4, tag=p)))
    f = fetcher(broker, max_bytes=RECORD_BYTES * 5 // 2)
    f.fill()
    buffered = [len(f.cursors[("t", p)].buffer) for p in range(3)]
    assert buffered == [2, 0, 0], "the first partition used the request's bytes up"
    assert [f.cursors[("t", p)].fetch_offset for p in range(3)] == [2, 0, 0]


def test_fetch_max_bytes_starves_no_partition(broker: Broker) -> None:
    """The first partition of a fill gets its records even over the limit, and the next
    fill starts after the last partition that got some, so every partition moves, even
    beside one that always has more than the limit."""
    for p, n in enumerate((20, 4, 4)):
        produce(broker, ProduceRequest("t", p, big_records(n, tag=p)))
    f = fetcher(broker, max_bytes=1)
    handed: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for _ in range(12):
        f.fill()
        for m in f.take(100):
            handed[m.partition() or 0].append(m.offset() or 0)
    assert handed == {p: [0, 1, 2, 3] for p in range(3)}


def stored_size(record: LogRecord) -> int:
    """What a fetch counts for a stored record: the overhead, key, value, headers' text."""
    _, _, key, value, headers = record[:5]
    return 24 + len(key or b"") + len(value or b"") + len(headers or "")


def expected_cut(log: list[LogRecord], start: int, max_bytes: int, min_one: bool) -> int | None:
    """Offset of the first record from ``start`` that max_bytes leaves out (None: none)."""
    running = 0
    for i, record in enumerate(r for r in log if r[0] >= start):
        running += stored_size(record)
        if running > max_bytes and not (i == 0 and min_one):
            return record[0]
    return None


def test_a_log_fetch_stops_where_the_byte_limit_does(broker: Broker) -> None:
    """A fetch of the log's batches (the wire protocol's) cuts at max_bytes with the same
    rule as a records fetch, markers and aborted records counted as they are stored, whether
    the window fits whole or is cut: every start, several limits, with and without
    min_one_record, the window ending at the LSO or at ``fetch_max_records``."""
    rng = random.Random(7)
    d = TxnDriver(broker, "tx")
    assert d.init() == 0
    for i in range(8):
        records = [RecordIn(b"k", rng.randbytes(rng.randrange(1, 300)), 0) for _ in range(5)]
        assert d.send_records("t", 0, records).error_code == 0
        assert d.end(commit=i % 3 != 1) == 0
    open_txn = [RecordIn(b"k", b"open", 0)]
    assert d.send_records("t", 0, open_txn).error_code == 0  # holds the LSO at 48
    whole = fetch(broker, FetchRequest("t", 0, 0, max_bytes=1 << 30, batches=True))
    log = whole.log_records
    assert [r[0] for r in log] == list(range(48)) and whole.next_offset == 48
    small = BrokerSettings(fetch_max_records=7, transactional_id_expiration_ms=3_600_000)
    for b in (broker, Broker.connect(broker.engine.url, settings=small)):
        window = b.settings.fetch_max_records
        for start in range(48):
            for max_bytes in (1, 24, 200, 400, 1000, 5000):
                for min_one in (True, False):
                    r = fetch(
                        b,
                        FetchRequest(
                            "t", 0, start, max_bytes=max_bytes, min_one_record=min_one,
                            batches=True,
                        ),
                    )  # fmt: skip
                    end = min(48, start + window)
                    cut = expected_cut([x for x in log if x[0] < end], start, max_bytes, min_one)
                    stop = end if cut is None else cut
                    assert [x[:6] for x in r.log_records] == [
                        x[:6] for x in log if start <= x[0] < stop
                    ], (start, max_bytes, min_one, window)
                    assert not r.log_records or r.log_records[0][LOG_BATCH] is not None
                    assert r.next_offset == stop, (start, max_bytes, min_one, window)


def records_fetch_expected(
    log: list[tuple[int, int, bool]], start: int, end: int, max_bytes: int, min_one: bool
) -> tuple[list[int], int]:
    """What a records fetch of [start, end) returns, by the rule of ``sql._FETCH_WITHIN_BYTES``
    applied to ``log`` (offset, stored size, whether the fetch shows it): the offsets kept
    and the next offset (the first record left out, or ``end``)."""
    kept: list[int] = []
    running = 0
    for offset, size, shown in log:
        if not (start <= offset < end and shown):
            continue
        running += size
        if running > max_bytes and not (not kept and min_one):
            return kept, offset
        kept.append(offset)
    return kept, end


@pytest.mark.parametrize("level", [READ_UNCOMMITTED, READ_COMMITTED])
def test_a_records_fetch_reads_a_window_that_fits_whole_and_cuts_one_that_does_not(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, level: int
) -> None:
    """Committed, aborted and plain records of random sizes, headers on some, an open
    transaction holding the LSO: from every start, at limits from below one record to
    above the log, each fetch returns what the running sum would keep, and a window whose
    stored records (markers and aborted ones counted) fit max_bytes is read whole, without
    the running sum; a window over it, with."""
    rng = random.Random(11)
    d = TxnDriver(broker, "tx")
    assert d.init() == 0
    aborted: set[int] = set()
    for i in range(6):
        records = [
            RecordIn(b"k", rng.randbytes(rng.randrange(1, 300)), 0,
                     [{"key": "h", "value": "dg=="}] if rng.random() < 0.3 else None)
            for _ in range(4)
        ]  # fmt: skip
        sent = d.send_records("t", 0, records)
        assert sent.error_code == 0
        assert d.end(commit=i % 3 != 1) == 0
        if i % 3 == 1:
            aborted.update(range(sent.base_offset, sent.base_offset + len(records)))
        plain = [RecordIn(None, rng.randbytes(rng.randrange(1, 100)), 0)]
        assert produce(broker, ProduceRequest("t", 0, plain)).error_code == 0
    assert d.send_records("t", 0, [RecordIn(b"k", b"open", 0)]).error_code == 0
    with broker.engine.connect() as conn:
        stored = conn.exec_driver_sql(
            'SELECT "offset", 24 + coalesce(octet_length(key), 0) + coalesce(octet_length(value), 0)'
            " + coalesce(octet_length(CAST(headers AS text)), 0), is_control"
            " FROM records WHERE topic = 't' AND partition = 0 ORDER BY \"offset\""
        ).all()
    hw = len(stored)
    lso = hw - 1  # the open transaction's record
    committed = level == READ_COMMITTED
    log = [
        (offset, size, not control and not (committed and offset in aborted))
        for offset, size, control in stored
    ]
    statements: list[str] = []
    original = fetch_module.read_records

    def spy(conn: Any, statement: str, params: dict[str, object]) -> list[RecordOut]:
        statements.append(statement)
        return original(conn, statement, params)

    monkeypatch.setattr(fetch_module, "read_records", spy)
    small = BrokerSettings(fetch_max_records=7, transactional_id_expiration_ms=3_600_000)
    upper = lso if committed else hw
    for b in (broker, Broker.connect(broker.engine.url, settings=small)):
        window = b.settings.fetch_max_records
        for start in range(upper):
            end = min(upper, start + window)
            window_bytes = sum(size for offset, size, _ in stored if start <= offset < end)
            for max_bytes in (1, 24, 200, 400, 1000, window_bytes, 5000, 1 << 30):
                for min_one in (True, False):
                    statements.clear()
                    r = fetch(
                        b,
                        FetchRequest(
                            "t", 0, start, max_bytes=max_bytes, isolation_level=level,
                            min_one_record=min_one,
                        ),
                    )  # fmt: skip
                    case = (start, max_bytes, min_one, window)
                    assert r.error_code == 0, case
                    kept, next_offset = records_fetch_expected(log, start, end, max_bytes, min_one)
                    assert offsets(r.records) == kept and r.next_offset == next_offset, case
                    (statement,) = statements
                    whole = statement in (sql.FETCH_UNCOMMITTED_WHOLE, sql.FETCH_COMMITTED_WHOLE)
                    assert whole == (window_bytes <= max_bytes), case
