"""Retention and transaction-aware compaction against a real PostgreSQL.

What must hold (KIP-98 "Compacting Transactional Data", "PID Expiration"): nothing at or
past the LSO is removed; aborted data never survives compaction or becomes visible because
its marker went first; the latest committed value of every key survives; an idle producer
whose records were cleaned keeps producing; and the projections rebuilt from what is left
of the log equal the live ones.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from app.broker import Broker
from app.broker.loop import CoordinatorLoop
from app.broker.produce import produce
from app.broker.rebuild import rebuild_all
from app.cleaner import plan
from app.cleaner.cleaner import clean_partition, partitions_to_clean
from app.client import Consumer, TopicPartition
from app.clock import Clock, ManualClock
from app.errors import KafkaError, KafkaException
from app.log.expiry import expire_producer_states
from app.log.fetch import fetch
from app.log.topic_config import CleanupConfig
from app.log.topics import alter_topic_config, create_topic
from app.protocol import READ_COMMITTED, READ_UNCOMMITTED, FetchRequest, ProduceRequest, RecordIn
from app.settings import BrokerSettings
from tests.helpers.backends import holding
from tests.helpers.identities import hand_out
from tests.helpers.projections import assert_partition_log_rebuilds
from tests.helpers.txn_driver import TxnDriver, partition_offsets

DAY = 86_400_000
COMPACT = {"cleanup.policy": "compact", "delete.retention.ms": 1000}


pytestmark = pytest.mark.broker(manual_clock=True, log_cleaner_interval_ms=0)


def cfg_of(broker: Broker, topic: str) -> CleanupConfig:
    return next(t.config for t in partitions_to_clean(broker, topic))


def clean(broker: Broker, topic: str, partition: int = 0) -> Any:
    return clean_partition(broker, topic, partition, cfg_of(broker, topic))


def idempotent(
    broker: Broker, topic: str, pid: int, seq: int, records: list[RecordIn], partition: int = 0
) -> Any:
    hand_out(broker, pid)
    r = produce(
        broker,
        ProduceRequest(topic, partition, records, producer_id=pid, producer_epoch=0, base_sequence=seq),
    )  # fmt: skip
    assert r.error_code == 0, r
    return r


def kv(key: str, value: str | None) -> RecordIn:
    return RecordIn(key.encode(), None if value is None else value.encode(), 0)


class Rec(NamedTuple):
    """A fetched record (Fetch answers plain tuples in this column order)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: str | None
    producer_id: int


def read(broker: Broker, topic: str, committed: bool = True, partition: int = 0) -> list[Any]:
    """Every record from the log start, as a consumer reads it."""
    with broker.engine.connect() as conn:
        offset = conn.execute(
            text("SELECT log_start_offset FROM partitions WHERE topic = :t AND partition = :p"),
            {"t": topic, "p": partition},
        ).scalar_one()
    out: list[Any] = []
    level = READ_COMMITTED if committed else READ_UNCOMMITTED
    while True:
        r = fetch(broker, FetchRequest(topic, partition, offset, isolation_level=level))
        assert r.error_code == 0, r
        out.extend(Rec._make(rec) for rec in r.records)
        if r.next_offset == offset:
            return out
        offset = r.next_offset


def latest_by_key(records: list[Any]) -> dict[bytes, bytes]:
    """What a reader of the whole log ends with per key (tombstones delete)."""
    out: dict[bytes, bytes | None] = {}
    for r in records:
        if r.key is not None:
            out[r.key] = r.value
    return {k: v for k, v in out.items() if v is not None}


def assert_rebuild_equals_live(broker: Broker, clock: Clock) -> None:
    expire_producer_states(broker)  # the rebuild leaves out what expiry would delete
    assert_partition_log_rebuilds(broker, clock.now_ms())


def record_count(broker: Broker, topic: str) -> int:
    with broker.engine.connect() as conn:
        return int(
            conn.execute(text("SELECT count(*) FROM records WHERE topic = :t"), {"t": topic}).scalar_one()
        )  # fmt: skip


# ---------------------------------------------------------------- pure rules


def test_retention_target_never_passes_the_lso() -> None:
    cfg = CleanupConfig(True, False, 1000, -1, DAY, 0)
    assert plan.retention_target(cfg, 0, 50, None, None) == 50  # everything old: up to LSO
    assert plan.retention_target(cfg, 0, 50, 20, None) == 20  # first young record stops it
    assert plan.retention_target(cfg, 30, 50, 20, None) == 30  # never backwards
    size = CleanupConfig(True, False, -1, 100, DAY, 0)
    assert plan.retention_target(size, 0, 50, None, 79) == 50
    assert plan.retention_target(size, 0, 100, None, 79) == 80
    assert plan.retention_target(size, 0, 100, None, None) == 0
    both = CleanupConfig(True, False, 1000, 100, DAY, 0)
    assert plan.retention_target(both, 0, 100, 10, 40) == 41  # whichever goes further
    compact_only = CleanupConfig(False, True, 1000, 100, DAY, 0)
    assert plan.retention_target(compact_only, 0, 100, None, 40) == 0


def test_batch_boundary_and_compaction_limit() -> None:
    assert plan.batch_boundary(15, 10) == 10  # inside the batch starting at 10
    assert plan.batch_boundary(15, 20) == 15  # in a gap before the next batch
    assert plan.batch_boundary(15, None) == 15
    assert plan.compaction_limit(100, None) == 100
    assert plan.compaction_limit(100, 40) == 40
    assert plan.compaction_limit(30, 40) == 30


def test_worth_compacting_follows_the_dirty_ratio() -> None:
    assert plan.worth_compacting(0, 0, 100, 0.5)  # never compacted
    assert not plan.worth_compacting(0, 100, 100, 0.0)  # nothing new
    assert not plan.worth_compacting(0, 60, 100, 0.5)  # 40% dirty
    assert plan.worth_compacting(0, 50, 100, 0.5)
    assert plan.worth_compacting(80, 50, 100, 0.5)  # retention took the clean part
    assert not plan.worth_compacting(100, 0, 100, 0.0)  # nothing cleanable


def test_the_background_pass_waits_for_enough_dirty_records(
    broker: Broker, clock: ManualClock
) -> None:
    create_topic(broker, "dr", 1, {**COMPACT, "min.cleanable.dirty.ratio": "0.5"})
    idempotent(broker, "dr", 1300, 0, [kv(f"k{i}", "1") for i in range(10)])
    cfg = cfg_of(broker, "dr")
    assert clean_partition(broker, "dr", 0, cfg, force=False).cleaned_up_to == 10
    idempotent(broker, "dr", 1300, 10, [kv("k0", "2"), kv("k1", "2")])  # 2 of 12 dirty
    stats = clean_partition(broker, "dr", 0, cfg, force=False)
    assert (stats.cleaned_up_to, stats.records_removed) == (10, 0)
    idempotent(broker, "dr", 1300, 12, [kv(f"k{i}", "3") for i in range(2, 10)])  # 10 of 20
    stats = clean_partition(broker, "dr", 0, cfg, force=False)
    assert (stats.cleaned_up_to, stats.records_removed) == (20, 10)
    assert_rebuild_equals_live(broker, clock)


# ---------------------------------------------------------------- retention


def test_retention_by_time_moves_log_start_and_resets_readers(
    broker: Broker, clock: ManualClock
) -> None:
    create_topic(broker, "r", 1, {"retention.ms": 60_000})
    idempotent(broker, "r", 500, 0, [kv(f"k{i}", f"old{i}") for i in range(10)])
    clock.advance(120_000)
    idempotent(broker, "r", 501, 0, [kv(f"k{i}", f"new{i}") for i in range(5)])
    stats = clean(broker, "r")
    assert stats.log_start_offset == 10 and stats.records_removed == 10
    assert stats.bytes_removed > 10 * (2 + 4)
    assert [r.value for r in read(broker, "r")] == [f"new{i}".encode() for i in range(5)]
    assert record_count(broker, "r") == 5
    r = fetch(broker, FetchRequest("r", 0, 3))
    assert r.error_code == KafkaError.OFFSET_OUT_OF_RANGE
    # The producer whose records all went is evicted with them; the other stays.
    with broker.engine.connect() as conn:
        pids = conn.execute(text("SELECT producer_id FROM producer_states")).scalars().all()
    assert pids == [501]
    assert_rebuild_equals_live(broker, clock)
    # An evicted producer comes back with its next sequence and is accepted (KIP-360).
    idempotent(broker, "r", 500, 10, [kv("k0", "again")])
    assert_rebuild_equals_live(broker, clock)


def test_retention_by_size_keeps_the_newest_bytes(broker: Broker, clock: ManualClock) -> None:
    create_topic(broker, "s", 1, {"retention.bytes": 2000, "retention.ms": -1})
    for i in range(10):
        idempotent(broker, "s", 600, i * 10, [kv(f"k{j}", "x" * 100) for j in range(10)])
    stats = clean(broker, "s")
    kept = read(broker, "s")
    size = sum(24 + len(r.key) + len(r.value) for r in kept)
    # As Kafka removes whole segments, whole batches go while the rest stays over the
    # limit: removing the oldest kept batch too would take the log under it.
    assert stats.log_start_offset == 80 and size > 2000 >= size - size // 2
    assert kept[0].offset == stats.log_start_offset
    assert_rebuild_equals_live(broker, clock)


def test_an_open_transaction_pins_the_log(broker: Broker, clock: ManualClock) -> None:
    create_topic(broker, "p", 1, {"retention.ms": 1000})
    idempotent(broker, "p", 700, 0, [kv("a", "1"), kv("b", "2")])
    d = TxnDriver(broker, "pin")
    assert d.init() == 0
    assert d.send("p", 0, "open1", "open2").error_code == 0  # offsets 2, 3: open
    idempotent(broker, "p", 700, 2, [kv("c", "3")])  # offset 4, after the open transaction
    clock.advance(60_000)
    stats = clean(broker, "p")
    hw, lso = partition_offsets(broker, "p", 0)
    assert (hw, lso) == (5, 2)
    assert stats.log_start_offset == 2  # up to the LSO, never past it
    assert len(read(broker, "p", committed=False)) == 3
    assert d.end(commit=True) == 0
    clock.advance(60_000)
    stats = clean(broker, "p")
    hw, lso = partition_offsets(broker, "p", 0)
    assert stats.log_start_offset == lso == hw == 6
    assert_rebuild_equals_live(broker, clock)


def test_retention_drops_aborted_index_entries_below_log_start(
    broker: Broker, clock: ManualClock
) -> None:
    create_topic(broker, "a", 1, {"retention.ms": 1000})
    d = TxnDriver(broker, "ab")
    assert d.init() == 0
    assert d.send("a", 0, "x", "y").error_code == 0
    assert d.end(commit=False) == 0
    with broker.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM aborted_txns")).scalar_one() == 1
    clock.advance(5000)
    clean(broker, "a")
    with broker.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM aborted_txns")).scalar_one() == 0
    assert_rebuild_equals_live(broker, clock)


# ---------------------------------------------------------------- compaction


def test_compaction_keeps_latest_committed_value_and_drops_aborted(
    broker: Broker, clock: ManualClock
) -> None:
    create_topic(broker, "c", 1, COMPACT)
    idempotent(broker, "c", 800, 0, [kv("a", "a1"), kv("b", "b1"), kv("c", "c1")])
    d = TxnDriver(broker, "cmp")
    assert d.init() == 0
    assert d.send_records("c", 0, [kv("a", "a-aborted"), kv("d", "d-aborted")]).error_code == 0
    assert d.end(commit=False) == 0
    assert d.send_records("c", 0, [kv("b", "b2"), kv("c", None)]).error_code == 0
    assert d.end(commit=True) == 0
    idempotent(broker, "c", 801, 0, [kv("a", "a3")])
    idempotent(broker, "c", 801, 1, [kv("e", "e1")])
    before = latest_by_key(read(broker, "c"))
    clock.advance(5000)
    clean(broker, "c")
    assert (b"c", None) in [(r.key, r.value) for r in read(broker, "c")]  # first passed now
    clock.advance(5000)
    clean(broker, "c")
    after = read(broker, "c")
    assert latest_by_key(after) == before == {b"a": b"a3", b"b": b"b2", b"e": b"e1"}
    values = [r.value for r in read(broker, "c", committed=False)]
    assert b"a-aborted" not in values and b"d-aborted" not in values
    # Offsets never change; the tombstone is gone after delete.retention.ms.
    assert all(r.value is not None for r in after)
    assert [r.offset for r in after] == sorted(r.offset for r in after)
    assert_rebuild_equals_live(broker, clock)


def test_tombstones_stay_until_delete_retention(broker: Broker, clock: ManualClock) -> None:
    create_topic(broker, "t", 1, {"cleanup.policy": "compact", "delete.retention.ms": DAY})
    idempotent(broker, "t", 900, 0, [kv("a", "1")])
    idempotent(broker, "t", 901, 0, [kv("a", None), kv("b", "2")])
    idempotent(broker, "t", 901, 2, [kv("c", "3")])
    clean(broker, "t")
    keys = [(r.key, r.value) for r in read(broker, "t")]
    assert (b"a", None) in keys and (b"a", b"1") not in keys
    clock.advance(DAY + 1)
    clean(broker, "t")
    assert [(r.key, r.value) for r in read(broker, "t")] == [(b"b", b"2"), (b"c", b"3")]
    assert_rebuild_equals_live(broker, clock)


def test_a_tombstone_is_kept_from_the_first_pass_over_it_not_its_timestamp(
    broker: Broker, clock: ManualClock
) -> None:
    """A tombstone whose CreateTime is long past still lives delete.retention.ms from the
    pass that first saw it, so a consumer behind the head by less than that sees the
    delete (Kafka's delete horizon)."""
    create_topic(broker, "old", 1, {"cleanup.policy": "compact", "delete.retention.ms": DAY})
    idempotent(broker, "old", 910, 0, [kv("a", "1")])
    ancient = RecordIn(b"a", None, clock.now_ms() - 30 * DAY)  # written with an old CreateTime
    idempotent(broker, "old", 911, 0, [ancient, kv("b", "2")])
    idempotent(broker, "old", 911, 2, [kv("c", "3")])
    clock.advance(1000)
    clean(broker, "old")
    assert (b"a", None) in [(r.key, r.value) for r in read(broker, "old")]
    clock.advance(DAY - 2000)  # still within delete.retention.ms of that first pass
    clean(broker, "old")
    assert (b"a", None) in [(r.key, r.value) for r in read(broker, "old")]
    # A tombstone written after the first pass starts its own delete.retention.ms later.
    idempotent(broker, "old", 912, 0, [kv("b", None), kv("d", "4")])
    clock.advance(3000)
    clean(broker, "old")
    left = [(r.key, r.value) for r in read(broker, "old")]
    assert (b"a", None) not in left and (b"b", None) in left
    clock.advance(DAY + 1)
    clean(broker, "old")
    assert [(r.key, r.value) for r in read(broker, "old")] == [(b"c", b"3"), (b"d", b"4")]
    assert_rebuild_equals_live(broker, clock)


def test_markers_go_only_when_their_transaction_is_empty_and_old(
    broker: Broker, clock: ManualClock
) -> None:
    create_topic(broker, "m", 1, {"cleanup.policy": "compact", "delete.retention.ms": DAY})
    d = TxnDriver(broker, "mk")
    assert d.init() == 0
    assert d.send_records("m", 0, [kv("a", "gone")]).error_code == 0
    assert d.end(commit=False) == 0  # ABORT marker at 1
    assert d.send_records("m", 0, [kv("b", "kept")]).error_code == 0
    assert d.end(commit=True) == 0  # COMMIT marker at 3
    idempotent(broker, "m", 950, 0, [kv("z", "1")])

    def markers() -> list[int]:
        with broker.engine.connect() as conn:
            return list(
                conn.execute(text('SELECT "offset" FROM records WHERE is_control ORDER BY 1')).scalars()
            )  # fmt: skip

    clean(broker, "m")
    assert markers() == [1, 3]  # aborted data gone; the ABORT marker's horizon starts now
    clock.advance(DAY - 1)
    clean(broker, "m")
    assert markers() == [1, 3]
    with broker.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM aborted_txns")).scalar_one() == 1
    clock.advance(2)
    clean(broker, "m")
    assert markers() == [3]  # the COMMIT's transaction still has a record
    with broker.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM aborted_txns")).scalar_one() == 0
    assert latest_by_key(read(broker, "m")) == {b"b": b"kept", b"z": b"1"}
    assert_rebuild_equals_live(broker, clock)


def test_min_compaction_lag_protects_young_records(broker: Broker, clock: ManualClock) -> None:
    create_topic(broker, "g", 1, {**COMPACT, "min.compaction.lag.ms": 60_000})
    idempotent(broker, "g", 960, 0, [kv("a", "1")])
    clock.advance(120_000)
    idempotent(broker, "g", 961, 0, [kv("a", "2")])
    idempotent(broker, "g", 961, 1, [kv("a", "3")])
    stats = clean(broker, "g")
    assert stats.cleaned_up_to == 1  # only the old record is cleanable: nothing superseded there
    assert [r.value for r in read(broker, "g")] == [b"1", b"2", b"3"]
    clock.advance(120_000)
    clean(broker, "g")
    assert [r.value for r in read(broker, "g")] == [b"3"]
    assert_rebuild_equals_live(broker, clock)


def test_an_idle_producer_is_not_rejected_after_compaction(
    broker: Broker, clock: ManualClock
) -> None:
    """Every record the producer wrote is superseded by another producer's and compacted
    away; its state (last batch: epoch, sequences, offsets) stays, and it goes on with its
    next sequence, also after the projections are rebuilt from the compacted log."""
    create_topic(broker, "i", 1, COMPACT)
    idempotent(broker, "i", 970, 0, [kv("a", "1"), kv("b", "1")])
    idempotent(broker, "i", 970, 2, [kv("a", "2"), kv("b", "2")])
    idempotent(broker, "i", 971, 0, [kv("a", "3"), kv("b", "3")])
    idempotent(broker, "i", 971, 2, [kv("c", "1")])
    clock.advance(5000)
    clean(broker, "i")
    offsets = [r.offset for r in read(broker, "i", committed=False)]
    assert offsets == [4, 5, 6]  # all of 970's records went
    assert latest_by_key(read(broker, "i")) == {b"a": b"3", b"b": b"3", b"c": b"1"}
    rebuild_all(broker.engine, now_ms=clock.now_ms(), settings=broker.settings)
    r = idempotent(broker, "i", 970, 4, [kv("d", "1")])
    assert r.base_offset == 7
    # A retry of its last batch is still recognised as a duplicate.
    dup = produce(
        broker,
        ProduceRequest("i", 0, [kv("d", "1")], producer_id=970, producer_epoch=0, base_sequence=4),
    )
    assert dup.error_code == 0 and dup.duplicate and dup.base_offset == 7
    assert_rebuild_equals_live(broker, clock)


def test_delete_and_compact_together(broker: Broker, clock: ManualClock) -> None:
    create_topic(broker, "dc", 1, {"cleanup.policy": "delete,compact", "retention.ms": 60_000})
    idempotent(broker, "dc", 980, 0, [kv("a", "1"), kv("b", "1")])
    clock.advance(120_000)
    idempotent(broker, "dc", 981, 0, [kv("a", "2"), kv("a", "3")])
    stats = clean(broker, "dc")
    assert stats.log_start_offset == 2
    assert [(r.key, r.value) for r in read(broker, "dc")] == [(b"a", b"3")]
    assert_rebuild_equals_live(broker, clock)


# ---------------------------------------------------------------- property


OPS = st.lists(
    st.tuples(
        st.sampled_from(["txn", "txn", "plain", "open"]),
        st.lists(
            st.tuples(st.sampled_from("abcdef"), st.one_of(st.none(), st.just("v"))),
            min_size=1,
            max_size=4,
        ),
        st.booleans(),  # commit?
        st.integers(0, 2),  # which producer
        st.booleans(),  # clean after this step?
    ),
    min_size=1,
    max_size=14,
)


EXAMPLES = itertools.count()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPS)
def test_compaction_preserves_what_read_committed_ends_with(
    broker: Broker, clock: ManualClock, ops: list[Any]
) -> None:
    """Random transactional workloads (commits, aborts, tombstones, repeated keys, an
    open transaction, cleaning between steps): the compacted log, read read_committed,
    ends with the same value per key as the uncompacted log, and no aborted record ever
    reappears."""
    topic = f"prop{next(EXAMPLES)}"
    create_topic(broker, topic, 1, COMPACT)
    drivers = [TxnDriver(broker, f"{topic}-{i}") for i in range(3)]
    for d in drivers:
        assert d.init() == 0
    plain_seq = 0
    committed: list[tuple[int, RecordIn]] = []  # (offset, record): the model of the log
    open_records: list[tuple[int, RecordIn]] = []
    aborted: set[bytes] = set()
    counter = 0
    open_driver: TxnDriver | None = None

    def model(entries: list[tuple[int, RecordIn]]) -> dict[bytes, bytes]:
        latest: dict[bytes, bytes | None] = {}
        for _, r in sorted(entries, key=lambda e: e[0]):
            latest[r.key] = r.value  # type: ignore[index]
        return {k: v for k, v in latest.items() if v is not None}

    def check_clean() -> None:
        before = latest_by_key(read(broker, topic))
        clean(broker, topic)
        after = read(broker, topic)
        assert latest_by_key(after) == before
        _, lso = partition_offsets(broker, topic, 0)
        below_lso = {r.value for r in read(broker, topic, committed=False) if r.offset < lso}
        assert not below_lso & aborted  # aborted data below the LSO is gone for good
        assert not {r.value for r in after} & aborted

    for kind, pairs, commit, who, clean_now in ops:
        records = []
        for key, val in pairs:
            counter += 1
            value = None if val is None else f"{key}{counter}".encode()
            records.append(RecordIn(key.encode(), value, 0))
        if kind == "plain":
            base = idempotent(broker, topic, 4242, plain_seq, records).base_offset
            plain_seq += len(records)
            committed.extend((base + i, r) for i, r in enumerate(records))
        elif kind == "open" and open_driver is None:
            open_driver = drivers[who]
            r = open_driver.send_records(topic, 0, records)
            assert r.error_code == 0
            open_records = [(r.base_offset + i, rec) for i, rec in enumerate(records)]
        elif drivers[who] is not open_driver:
            d = drivers[who]
            r = d.send_records(topic, 0, records)
            assert r.error_code == 0
            assert d.end(commit=commit) == 0
            if commit:
                committed.extend((r.base_offset + i, rec) for i, rec in enumerate(records))
            else:
                aborted.update(rec.value for rec in records if rec.value)
        clock.advance(700)
        if clean_now:
            check_clean()
    clock.advance(5000)
    check_clean()
    clock.advance(5000)  # delete.retention.ms after the pass that first saw the tombstones
    check_clean()
    _, lso = partition_offsets(broker, topic, 0)
    got = read(broker, topic)
    # What a read_committed reader of the uncompacted log ends with: committed records
    # below the LSO; tombstones below the LSO are gone after delete.retention.ms.
    assert latest_by_key(got) == model([e for e in committed if e[0] < lso])
    assert all(r.value is not None for r in got)
    assert_rebuild_equals_live(broker, clock)
    if open_driver is not None:
        assert open_driver.end(commit=True) == 0
        clock.advance(5000)
        check_clean()
        clock.advance(5000)
        check_clean()
        assert latest_by_key(read(broker, topic)) == model(committed + open_records)
        assert_rebuild_equals_live(broker, clock)


# ---------------------------------------------------------------- concurrency


def test_reader_during_cleaning_never_sees_aborted_data(broker: Broker, clock: ManualClock) -> None:
    """The KIP's ABORT-marker race: markers and index entries are removed while a
    read_committed reader reads; it must never return a record of an aborted transaction."""
    create_topic(broker, "race", 1, {"cleanup.policy": "compact", "delete.retention.ms": 0})
    d = TxnDriver(broker, "racer")
    assert d.init() == 0
    stop = threading.Event()
    seen_aborted: list[bytes] = []
    errors: list[BaseException] = []
    reads = [0]

    def reader() -> None:
        try:
            while not stop.is_set():
                for r in read(broker, "race"):
                    if r.value and r.value.startswith(b"ABORTED"):
                        seen_aborted.append(r.value)
                reads[0] += 1
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    def reads_done_from_now() -> None:
        """Until the reader has begun and finished a whole read after this call."""
        done, deadline = reads[0], time.monotonic() + 60
        while reads[0] < done + 2 and t.is_alive():
            assert time.monotonic() < deadline, "the reader read nothing"
            time.sleep(0.005)

    t = threading.Thread(target=reader)
    t.start()
    try:
        reads_done_from_now()  # the reader is under way before the first clean
        for i in range(40):
            commit = i % 2 == 0
            tag = "ok" if commit else "ABORTED"
            recs = [kv(f"k{j}", f"{tag}{i}-{j}") for j in range(5)]
            assert d.send_records("race", 0, recs).error_code == 0
            assert d.end(commit=commit) == 0
            clock.advance(10)
            clean(broker, "race")
        clock.advance(10)
        clean(broker, "race")  # the markers emptied by the last pass go in the next
        reads_done_from_now()  # and it reads what the last pass left
    finally:
        stop.set()
        t.join(timeout=30)
    assert not errors, errors
    assert seen_aborted == []
    with broker.engine.connect() as conn:  # the markers and index entries did go
        assert conn.execute(text("SELECT count(*) FROM aborted_txns")).scalar_one() == 0
    assert_rebuild_equals_live(broker, clock)


def test_two_cleaners_on_one_partition_do_not_overlap(
    broker: Broker, clock: ManualClock, db_url: str
) -> None:
    create_topic(broker, "two", 1, COMPACT)
    for i in range(5):
        idempotent(broker, "two", 990, i * 3, [kv("a", f"{i}"), kv("b", f"{i}"), kv("c", "x")])
    clock.advance(5000)
    cfg = cfg_of(broker, "two")
    lock = "SELECT pg_advisory_xact_lock(hashtext('kip98.cleaner'), hashtext('two/0'))"
    with holding(db_url, lock):  # another cleaner's pass on the partition, however long
        skipped = clean_partition(broker, "two", 0, cfg)
    assert skipped.skipped and skipped.records_removed == 0
    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda: results.append(clean_partition(broker, "two", 0, cfg)))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.records_removed for r in results) == 12 and record_count(broker, "two") == 3
    assert_rebuild_equals_live(broker, clock)


# ---------------------------------------------------------------- the loop, configs


def test_coordinator_loop_cleans_on_its_interval(db_url: str, clock: ManualClock) -> None:
    b = Broker.connect(
        db_url,
        clock=clock,
        settings=BrokerSettings(log_cleaner_interval_ms=10_000, transaction_log_partitions=4),
    )
    create_topic(b, "lp", 3, {"retention.ms": 1000})
    for p in range(3):
        idempotent(b, "lp", 1100 + p, 0, [kv("a", "1"), kv("b", "2")], partition=p)
    loop = CoordinatorLoop(b)
    try:
        clock.advance(5000)
        assert loop.run_once().cleaned_records == 0  # not due yet
        clock.advance(5000)
        assert loop.run_once().cleaned_records == 6
    finally:
        loop.release_leases()
    with b.engine.connect() as conn:
        removed = conn.execute(text("SELECT sum(records_removed) FROM log_cleaner_checkpoints"))
        assert removed.scalar() == 6


def test_topic_configs_are_validated_and_altered(broker: Broker) -> None:
    with pytest.raises(KafkaException) as e:
        create_topic(broker, "bad", 1, {"cleanup.policy": "shred"})
    assert e.value.args[0].code() == KafkaError.INVALID_CONFIG
    with pytest.raises(KafkaException) as e:
        create_topic(broker, "bad", 1, {"retention.msec": 1})
    assert "retention.msec" in e.value.args[0].str()
    with pytest.raises(KafkaException):
        create_topic(broker, "bad", 1, {"delete.retention.ms": -5})
    with pytest.raises(KafkaException):
        create_topic(broker, "bad", 1, {"min.cleanable.dirty.ratio": 1.5})
    with broker.engine.connect() as conn:  # nothing half-created
        assert conn.execute(text("SELECT count(*) FROM topics WHERE topic = 'bad'")).scalar() == 0
    info = create_topic(broker, "ok", 1, {"cleanup.policy": "delete, compact", "retention.ms": "5"})
    assert info.config == {"cleanup.policy": "compact,delete", "retention.ms": 5}
    assert alter_topic_config(broker, "ok", {"retention.bytes": 10}, ["retention.ms"]) == {
        "cleanup.policy": "compact,delete",
        "retention.bytes": 10,
    }
    assert alter_topic_config(broker, "ok", {"retention.ms": 7}, incremental=False) == {
        "retention.ms": 7
    }
    with pytest.raises(KafkaException) as e:
        alter_topic_config(broker, "nope", {"retention.ms": 7})
    assert e.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PARTITION


def test_a_consumer_behind_the_log_start_follows_auto_offset_reset(
    db_url: str, broker: Broker, clock: ManualClock
) -> None:
    """A committed position retention has passed is out of range: ``earliest`` resumes at
    the new log start, ``error`` reports OFFSET_OUT_OF_RANGE."""
    create_topic(broker, "behind", 1, {"retention.ms": 60_000})
    idempotent(broker, "behind", 1200, 0, [kv(f"k{i}", f"old{i}") for i in range(6)])
    clock.advance(120_000)
    idempotent(broker, "behind", 1201, 0, [kv("k", "new")])
    assert clean(broker, "behind").log_start_offset == 6
    base = {"database.url": db_url, "group.id": "g", "enable.auto.commit": False}
    with Consumer({**base, "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition("behind", 0, 2)])
        msgs = c.consume(1, timeout=30)
        assert [(m.offset(), m.value()) for m in msgs] == [(6, b"new")]
    with Consumer({**base, "auto.offset.reset": "error"}) as c:
        c.assign([TopicPartition("behind", 0, 2)])
        msg = c.poll(30)
        assert msg is not None and msg.error() is not None
        assert msg.error().code() == KafkaError.OFFSET_OUT_OF_RANGE  # type: ignore[union-attr]
