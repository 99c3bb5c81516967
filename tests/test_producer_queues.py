"""The producer's in-memory queues without a database: batches formed within their
limits, one outcome per batch expanded into per-record delivery reports on the serving
thread, and a raising callback leaving the rest of a batch queued with the right offsets."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.client.batching import BatchLimits, PendingRecords, ProducerIdentity, RecordAccumulator
from app.client.delivery import DeliveryReports, Outcome
from app.errors import KafkaError
from app.protocol import RecordFields, record_size_bytes, stored_headers

Served = list[tuple[KafkaError | None, Any]]


def record(value: bytes) -> RecordFields:
    return (b"k", value, 1_000, stored_headers([("h", b"x")]))


def pending(value: bytes, on_delivery: Any = None) -> PendingRecords:
    return PendingRecords.one(record(value), on_delivery, time.monotonic(), 10)


def run(*values: bytes, on_delivery: Any = None) -> PendingRecords:
    records = PendingRecords()
    for value in values:
        records.records.append(record(value))
        records.callbacks.append(on_delivery)
        records.enqueued.append(time.monotonic())
        records.size += 10
    return records


def append(acc: RecordAccumulator, value: bytes, size: int = 10) -> bool:
    return acc.append("t", 0, record(value), size, None, time.monotonic())


def test_batches_respect_record_and_byte_limits() -> None:
    acc = RecordAccumulator(BatchLimits(max_records=4, max_bytes=35, linger_s=0))
    identity = ProducerIdentity(7, 0)
    with acc.lock:
        for i in range(10):
            append(acc, str(i).encode())
        (first,), _ = acc.drain(time.monotonic(), identity)
        assert [r[1] for r in first.records.records] == [b"0", b"1", b"2"]  # 30 bytes <= 35
        assert first.base_sequence == 0
        assert acc.queued() == (7, 70)
        acc.complete(first)
        (second,), _ = acc.drain(time.monotonic(), identity)
        assert second.base_sequence == 3 and len(second.records) == 3
        assert second.request().records == second.records.records
        assert second.request() is second.request()  # retries resend the very same request


def test_a_record_bigger_than_the_byte_limit_still_forms_a_batch() -> None:
    acc = RecordAccumulator(BatchLimits(max_records=10, max_bytes=5, linger_s=0))
    with acc.lock:
        append(acc, b"big", size=50)
        append(acc, b"next", size=50)
        (batch,), _ = acc.drain(time.monotonic(), ProducerIdentity())
    assert [r[1] for r in batch.records.records] == [b"big"]
    assert acc.queued() == (1, 50)


def test_an_outcome_is_served_as_one_report_per_record() -> None:
    reports = DeliveryReports()
    served: Served = []
    records = run(b"a")
    own = pending(b"b", on_delivery=lambda e, m: served.append(("own", m)))
    records.records += own.records
    records.callbacks += own.callbacks
    records.enqueued += own.enqueued
    reports.accepted(3)
    reports.push([Outcome("t", 1, records, 40, None, time.monotonic())])
    failed = KafkaError(KafkaError._MSG_TIMED_OUT, "timed out")
    reports.push([Outcome("t", 2, pending(b"c"), -1, failed, time.monotonic())])
    assert len(reports) == 3
    assert reports.serve(0, lambda e, m: served.append((e, m))) == 3
    assert len(reports) == 0
    assert [(e, m.partition(), m.offset(), m.value()) for e, m in served] == [
        (None, 1, 40, b"a"),
        ("own", 1, 41, b"b"),
        (failed, 2, -1, b"c"),
    ]
    assert served[0][1].headers() == [("h", b"x")] and served[0][1].latency() >= 0


def test_records_without_a_callback_are_counted_as_served() -> None:
    reports = DeliveryReports()
    reports.accepted(2)
    reports.push([Outcome("t", 0, run(b"a", b"b"), 0, None, time.monotonic())])
    assert reports.serve(0, None) == 2
    assert len(reports) == 0


def test_a_raising_callback_leaves_the_rest_of_the_batch_queued() -> None:
    reports = DeliveryReports()
    seen: list[int] = []

    def callback(err: KafkaError | None, msg: Any) -> None:
        seen.append(msg.offset())
        if msg.offset() == 11:
            raise RuntimeError("boom")

    reports.accepted(5)
    now = time.monotonic()
    reports.push([Outcome("t", 0, run(b"x", b"x", b"x"), 10, None, now)])
    reports.push([Outcome("t", 0, run(b"y", b"y"), 13, None, now)])
    with pytest.raises(RuntimeError):
        reports.serve(0, callback)
    assert len(reports) == 3  # the raising callback's report counts as served
    assert reports.serve(0, callback) == 3
    assert seen == [10, 11, 12, 13, 14]


def test_serve_waits_for_an_outcome_pushed_by_another_thread() -> None:
    reports = DeliveryReports(threading.RLock())
    reports.accepted()
    pusher = threading.Timer(
        0.05,
        lambda: reports.push([Outcome("t", 0, pending(b"a"), 5, None, time.monotonic())]),
    )
    pusher.start()
    served: Served = []
    assert reports.serve(10, lambda e, m: served.append((e, m))) == 1
    pusher.join()
    assert served[0][1].offset() == 5


def test_append_tells_when_a_batch_worth_is_complete() -> None:
    """The sticky partitioner moves on at these points, however fast records arrive."""
    by_count = RecordAccumulator(BatchLimits(max_records=3, max_bytes=1000, linger_s=10))
    with by_count.lock:
        filled = [append(by_count, b"x") for _ in range(6)]
    assert filled == [False, False, True, False, False, True]
    by_size = RecordAccumulator(BatchLimits(max_records=100, max_bytes=45, linger_s=10))
    with by_size.lock:
        filled = [append(by_size, b"x", size=20) for _ in range(5)]
    assert filled == [False, False, True, False, True]  # 60 bytes pass 45, 100 pass 90


def test_expiry_takes_the_old_front_of_a_run_and_leaves_the_rest_to_send() -> None:
    """message.timeout.ms drops only the records that waited too long, from the front of
    their partition's queue, with their bytes; the rest still go out as one batch."""
    acc = RecordAccumulator(BatchLimits(max_records=10, max_bytes=1000, linger_s=0))
    with acc.lock:
        for i, enqueued in enumerate([1.0, 2.0, 5.0, 6.0]):
            fields = (b"k", str(i).encode(), 1_000, None)
            acc.append("t", 0, fields, record_size_bytes(b"k", fields[1], None), None, enqueued)
        ((topic, partition, expired),) = acc.expire(now=7.0, timeout_s=4.5)
        assert (topic, partition) == ("t", 0)
        assert [r[1] for r in expired.records] == [b"0", b"1"] and expired.enqueued == [1.0, 2.0]
        assert expired.size == 2 * record_size_bytes(b"k", b"0", None)
        assert acc.queued() == (2, expired.size)
        (batch,), _ = acc.drain(7.0, ProducerIdentity(3, 0))
    assert [r[1] for r in batch.records.records] == [b"2", b"3"] and batch.base_sequence == 0
    assert acc.queued() == (0, 0)


def test_records_are_cut_into_batches_as_they_are_queued() -> None:
    """Each run is one batch's worth (records and bytes), so a drain takes the first whole."""
    acc = RecordAccumulator(BatchLimits(max_records=3, max_bytes=25, linger_s=0))
    identity = ProducerIdentity(1, 0)
    with acc.lock:
        for i in range(7):
            append(acc, str(i).encode())
        batches = []
        while acc.queued()[0]:
            (batch,), _ = acc.drain(time.monotonic(), identity)
            batches.append(batch)
            acc.complete(batch)
    assert [[r[1] for r in b.records.records] for b in batches] == [
        [b"0", b"1"], [b"2", b"3"], [b"4", b"5"], [b"6"]
    ]  # fmt: skip
    assert [b.base_sequence for b in batches] == [0, 2, 4, 6]


def test_a_raising_callback_keeps_later_outcomes_in_order_with_their_errors() -> None:
    """Reports are counted out in bulk when a poll takes them; a callback that raises puts
    the unserved ones back, outstanding, in their order, each with its own outcome."""
    reports = DeliveryReports()
    seen: list[tuple[str, int, int | None]] = []
    failed = KafkaError(KafkaError._MSG_TIMED_OUT, "timed out")

    def callback(err: KafkaError | None, msg: Any) -> None:
        seen.append((msg.value().decode(), msg.offset(), err.code() if err else None))
        if msg.value() == b"b":  # the sender delivers more meanwhile: those come after
            reports.push([Outcome("t", 0, run(b"g"), 24, None, now)])
            raise ValueError("boom")

    now = time.monotonic()
    reports.accepted(7)
    reports.push([Outcome("t", 0, run(b"a", b"b", b"c"), 20, None, now)])
    reports.push([Outcome("t", 1, run(b"d", b"e"), -1, failed, now)])
    reports.push([Outcome("t", 0, run(b"f"), 23, None, now)])
    with pytest.raises(ValueError, match="boom"):
        reports.serve(0, callback)
    assert len(reports) == 5
    assert reports.serve(0, callback) == 5
    assert len(reports) == 0
    assert seen == [
        ("a", 20, None), ("b", 21, None), ("c", 22, None),
        ("d", -1, KafkaError._MSG_TIMED_OUT), ("e", -1, KafkaError._MSG_TIMED_OUT),
        ("f", 23, None), ("g", 24, None),
    ]  # fmt: skip


@given(st.lists(st.integers(1, 60), max_size=40), st.integers(0, 5))
def test_append_many_cuts_runs_as_appending_one_by_one_does(sizes: list[int], before: int) -> None:
    """``Producer.produce_batch``'s bulk append forms the same batches, after records
    already queued one by one, as ``append`` would have formed."""
    limits = BatchLimits(max_records=4, max_bytes=40, linger_s=0)
    one, many = RecordAccumulator(limits), RecordAccumulator(limits)
    with one.lock, many.lock:
        for i in range(before):
            append(one, b"b%d" % i, 7)
            append(many, b"b%d" % i, 7)
        for i, size in enumerate(sizes):
            append(one, b"%d" % i, size)
        many.append_many("t", 0, [record(b"%d" % i) for i in range(len(sizes))], sizes, 0.0)
        assert one.queued() == many.queued()

        def batches(acc: RecordAccumulator) -> list[list[bytes]]:
            out = []
            while acc.queued()[0]:
                (batch,), _ = acc.drain(time.monotonic(), ProducerIdentity(1, 0))
                out.append([r[1] for r in batch.records.records])
                acc.complete(batch)
            return out

        assert batches(one) == batches(many)
