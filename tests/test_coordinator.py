"""The transaction coordinator against a real PostgreSQL: atomic commit/abort across
partitions, LSO and the aborted index, fencing, KIP-890 epochs, retries, timeouts,
expiration, zombie coordinators, and the projection = fold of the transaction log."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import text

from app.broker import Broker
from app.broker.loop import CoordinatorLoop
from app.broker.produce import produce
from app.clock import ManualClock
from app.coordinator import machines as m
from app.coordinator.handlers import (
    find_coordinator,
    prepare_end_txn,
    roll_forward,
    write_txn_markers,
)
from app.coordinator.metadata import txn_partition_for
from app.coordinator.producer_id import init_producer_id
from app.coordinator.rebuild import (
    CorruptTransactionLog,
    check_event_sequence,
    compute_transactions,
    live_transactions,
)
from app.errors import KafkaError, KafkaException
from app.log.fetch import fetch, list_offsets
from app.log.rebuild import compute_partition_log, live_rows, projection_rows
from app.log.topics import create_topic
from app.protocol import (
    LATEST_TIMESTAMP,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    RECORD_VALUE,
    EndTxnRequest,
    FetchRequest,
    FindCoordinatorRequest,
    InitProducerIdRequest,
    ListOffsetsRequest,
    ProduceRequest,
    RecordIn,
    WriteTxnMarkersRequest,
)
from app.settings import BrokerSettings
from tests.helpers.projections import assert_partition_log_rebuilds
from tests.helpers.txn_driver import TxnDriver, partition_offsets, read_values, state_of

pytestmark = pytest.mark.broker(
    topics={"a": 3, "b": 3, "c": 3},
    manual_clock=True,
    transactional_id_expiration_ms=3_600_000,
    transaction_log_partitions=4,
)


def txn(broker: Broker, tid: str = "tx", timeout_ms: int = 60_000) -> TxnDriver:
    d = TxnDriver(broker, tid, timeout_ms)
    assert d.init() == 0
    return d


def test_commit_and_abort_across_topics(broker: Broker) -> None:
    d = txn(broker)
    for topic in ("a", "b", "c"):
        for p in range(3):
            assert d.send(topic, p, f"c-{topic}{p}").error_code == 0
    assert d.end(commit=True) == 0
    for topic in ("a", "b", "c"):
        for p in range(3):
            assert d.send(topic, p, f"x-{topic}{p}").error_code == 0
    assert d.end(commit=False) == 0
    for topic in ("a", "b", "c"):
        for p in range(3):
            assert read_values(broker, topic, p) == [f"c-{topic}{p}"]
            assert read_values(broker, topic, p, committed=False) == [
                f"c-{topic}{p}",
                f"x-{topic}{p}",
            ]
            hw, lso = partition_offsets(broker, topic, p)
            assert hw == lso == 4, "two records and two markers; nothing open"
    with broker.engine.connect() as conn:
        aborted = conn.execute(
            text(
                "SELECT topic, partition, first_offset, last_offset, last_stable_offset FROM aborted_txns ORDER BY 1, 2"
            )
        ).all()
    assert [tuple(r) for r in aborted] == [
        (t, p, 2, 3, 4) for t in ("a", "b", "c") for p in range(3)
    ]
    r = fetch(broker, FetchRequest("a", 0, 0, isolation_level=READ_COMMITTED))
    assert [(a.producer_id, a.first_offset) for a in r.aborted_transactions] == [(d.producer_id, 2)]


def test_fetch_lists_the_aborted_transactions_overlapping_its_window(broker: Broker) -> None:
    d = txn(broker)
    # Offsets: 0-1 aborted, 2 marker, 3-4 committed, 5 marker, 6-7 aborted, 8 marker.
    for commit in (False, True, False):
        assert d.send("a", 0, "x", "y").error_code == 0
        assert d.end(commit=commit) == 0
    pid = d.producer_id

    def listed(offset: int, max_records: int | None = None, level: int = READ_COMMITTED):  # type: ignore[no-untyped-def]
        r = fetch(
            broker, FetchRequest("a", 0, offset, isolation_level=level, max_records=max_records)
        )
        assert r.error_code == 0, r
        values = [(x[RECORD_VALUE] or b"").decode() for x in r.records]
        return (
            [(a.producer_id, a.first_offset) for a in r.aborted_transactions],
            values,
            r.next_offset,
        )

    assert listed(0) == ([(pid, 0), (pid, 6)], ["x", "y"], 9)
    assert listed(0, max_records=5) == ([(pid, 0)], ["x", "y"], 5)
    assert listed(1, max_records=2) == ([(pid, 0)], [], 3)
    # An aborted transaction's range ends at its marker, as in Kafka's aborted index.
    assert listed(2) == ([(pid, 0), (pid, 6)], ["x", "y"], 9)
    assert listed(3, max_records=3) == ([], ["x", "y"], 6)
    assert listed(7, max_records=1) == ([(pid, 6)], [], 8)
    assert listed(0, level=READ_UNCOMMITTED) == ([], ["x", "y"] * 3, 9)


def test_open_transaction_holds_back_read_committed_until_it_ends(broker: Broker) -> None:
    d = txn(broker)
    produce(broker, ProduceRequest("a", 0, [RecordIn(None, b"before", 0)]))
    d.send("a", 0, "t1")
    produce(broker, ProduceRequest("a", 0, [RecordIn(None, b"after", 0)]))
    assert partition_offsets(broker, "a", 0) == (3, 1)
    assert read_values(broker, "a", 0) == ["before"]
    assert read_values(broker, "a", 0, committed=False) == ["before", "t1", "after"]
    assert (
        list_offsets(broker, ListOffsetsRequest("a", 0, LATEST_TIMESTAMP, READ_COMMITTED)).offset
        == 1
    )
    assert (
        list_offsets(broker, ListOffsetsRequest("a", 0, LATEST_TIMESTAMP, READ_UNCOMMITTED)).offset
        == 3
    )
    assert d.end(commit=True) == 0
    assert partition_offsets(broker, "a", 0) == (4, 4)
    assert read_values(broker, "a", 0) == ["before", "t1", "after"]


def test_two_open_transactions_lso_is_the_earliest(broker: Broker) -> None:
    d1, d2 = txn(broker, "t1"), txn(broker, "t2")
    d1.send("a", 0, "one")
    d2.send("a", 0, "two")
    assert partition_offsets(broker, "a", 0) == (2, 0)
    d2.end(commit=False)
    assert partition_offsets(broker, "a", 0) == (3, 0)
    with broker.engine.connect() as conn:
        lso_in_index = conn.execute(text("SELECT last_stable_offset FROM aborted_txns")).scalar()
    assert lso_in_index == 0, "the aborted entry records the LSO of its moment"
    d1.end(commit=True)
    assert partition_offsets(broker, "a", 0) == (4, 4)
    assert read_values(broker, "a", 0) == ["one"]


def test_produce_must_be_registered_and_ongoing(broker: Broker) -> None:
    d = txn(broker)
    r = d.send("a", 0, "unregistered", register=False)
    assert r.error_code == KafkaError.INVALID_TXN_STATE
    d.send("a", 1, "ok")
    assert d.end(commit=False) == 0
    # A late batch after the abort (the "hanging transaction" of KAFKA-12671) is refused.
    late = d.send("a", 1, "late", register=False)
    assert late.error_code in (KafkaError.INVALID_TXN_STATE, KafkaError.INVALID_PRODUCER_EPOCH)
    assert partition_offsets(broker, "a", 1)[0] == 2
    # A non-transactional write from a producer with an open transaction is refused too.
    d.send("a", 2, "open")
    r = produce(
        broker,
        ProduceRequest(
            "a",
            2,
            [RecordIn(None, b"x", 0)],
            producer_id=d.producer_id,
            producer_epoch=d.producer_epoch,
            base_sequence=1,
        ),
    )
    assert r.error_code == KafkaError.INVALID_TXN_STATE


def test_second_instance_fences_first_at_every_api(broker: Broker) -> None:
    first = txn(broker)
    first.send("a", 0, "zombie-data")
    second = TxnDriver(broker, "tx")
    assert second.init() == 0
    assert second.producer_id == first.producer_id and second.producer_epoch > first.producer_epoch
    # The first's open transaction was aborted by the fencing InitProducerId.
    assert read_values(broker, "a", 0) == []
    assert partition_offsets(broker, "a", 0) == (2, 2)
    assert (
        first.send("a", 0, "more", register=False).error_code == KafkaError.INVALID_PRODUCER_EPOCH
    )
    assert first.add(("a", 1)) == KafkaError.PRODUCER_FENCED
    assert first.add_offsets("g") == KafkaError.PRODUCER_FENCED
    assert first.end(commit=True) == KafkaError.PRODUCER_FENCED
    second.send("a", 0, "real")
    assert second.end() == 0
    assert read_values(broker, "a", 0) == ["real"]


def test_end_txn_bumps_epoch_and_retries_are_idempotent(broker: Broker) -> None:
    d = txn(broker)
    old = (d.producer_id, d.producer_epoch)
    d.send("a", 0, "v")
    assert d.end(commit=True) == 0
    assert (d.producer_id, d.producer_epoch) == (old[0], old[1] + 1), (
        "KIP-890: next transaction, next epoch"
    )
    stale = TxnDriver(broker, "tx", producer_id=old[0], producer_epoch=old[1])
    assert stale.end(commit=True) == 0, "a retried EndTxn with the same outcome is OK"
    assert (stale.producer_id, stale.producer_epoch) == (d.producer_id, d.producer_epoch)
    stale = TxnDriver(broker, "tx", producer_id=old[0], producer_epoch=old[1])
    assert stale.end(commit=False) == KafkaError.INVALID_TXN_STATE
    # A late produce of the finished transaction cannot land in the next one.
    d.send("a", 1, "next")
    late = TxnDriver(broker, "tx", producer_id=old[0], producer_epoch=old[1])
    assert late.send("a", 1, "late", register=False).error_code == KafkaError.INVALID_PRODUCER_EPOCH
    assert d.end(commit=True) == 0
    assert read_values(broker, "a", 1) == ["next"]


def test_end_txn_without_transaction_is_invalid(broker: Broker) -> None:
    d = txn(broker)
    assert d.end(commit=True) == KafkaError.INVALID_TXN_STATE
    unknown = TxnDriver(broker, "nobody", producer_id=5, producer_epoch=0)
    assert unknown.end() == KafkaError.INVALID_PRODUCER_ID_MAPPING
    assert unknown.add(("a", 0)) == KafkaError.INVALID_PRODUCER_ID_MAPPING


def test_init_producer_id_retry_does_not_bump_twice(broker: Broker) -> None:
    d = txn(broker)
    pid, epoch = d.producer_id, d.producer_epoch
    first = init_producer_id(broker, InitProducerIdRequest("tx", 60_000, pid, epoch))
    assert (first.producer_id, first.producer_epoch) == (pid, epoch + 1)
    retry = init_producer_id(broker, InitProducerIdRequest("tx", 60_000, pid, epoch))
    assert (retry.error_code, retry.producer_id, retry.producer_epoch) == (0, pid, epoch + 1)
    stale = init_producer_id(
        broker, InitProducerIdRequest("tx", 60_000, pid, epoch - 1 if epoch else 99)
    )
    assert stale.error_code == KafkaError.PRODUCER_FENCED


def test_epoch_exhaustion_rotates_producer_id(broker: Broker) -> None:
    d = txn(broker)
    with broker.engine.begin() as conn:
        conn.execute(text("UPDATE transactions SET producer_epoch = :e"), {"e": m.MAX_EPOCH})
    d.producer_epoch = m.MAX_EPOCH
    old_pid = d.producer_id
    assert d.init() == 0
    assert d.producer_id != old_pid and d.producer_epoch == 0
    # And at the end of a transaction (KIP-890), markers still carry the data's identity.
    with broker.engine.begin() as conn:
        conn.execute(text("UPDATE transactions SET producer_epoch = :e"), {"e": m.MAX_EPOCH})
    d.producer_epoch = m.MAX_EPOCH
    d.send("a", 0, "last-of-its-id")
    pid_before = d.producer_id
    assert d.end(commit=True) == 0
    assert d.producer_id != pid_before and d.producer_epoch == 0
    assert read_values(broker, "a", 0) == ["last-of-its-id"]
    assert partition_offsets(broker, "a", 0) == (2, 2)


@pytest.mark.parametrize("timeout", [0, -5, 900_001])
def test_invalid_transaction_timeout(broker: Broker, timeout: int) -> None:
    r = init_producer_id(broker, InitProducerIdRequest("tx", timeout))
    assert r.error_code == KafkaError.INVALID_TRANSACTION_TIMEOUT
    assert state_of(broker, "tx") is None


def test_markers_are_idempotent_and_check_epochs(broker: Broker) -> None:
    d = txn(broker)
    d.send("a", 0, "v")
    req = WriteTxnMarkersRequest(d.producer_id, d.producer_epoch, 5, True, [("a", 0)])
    assert write_txn_markers(broker, req).results == {("a", 0): 0}
    assert write_txn_markers(broker, req).results == {("a", 0): 0}
    assert partition_offsets(broker, "a", 0) == (2, 2), "the retry wrote nothing"
    d.send("a", 0, "w", register=False)
    stale_coordinator = WriteTxnMarkersRequest(
        d.producer_id, d.producer_epoch, 4, False, [("a", 0)]
    )
    assert write_txn_markers(broker, stale_coordinator).results == {
        ("a", 0): KafkaError.TRANSACTION_COORDINATOR_FENCED
    }
    stale_producer = WriteTxnMarkersRequest(
        d.producer_id, d.producer_epoch - 1, 9, False, [("a", 0)]
    )
    assert write_txn_markers(broker, stale_producer).results == {
        ("a", 0): KafkaError.INVALID_PRODUCER_EPOCH
    }


def test_clients_cannot_write_control_records(broker: Broker) -> None:
    # The Produce request has no way to ask for a control record: every row it writes is data.
    produce(broker, ProduceRequest("a", 0, [RecordIn(None, b"x", 0)]))
    with broker.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM records WHERE is_control")).scalar() == 0
    assert not hasattr(ProduceRequest, "is_control")


def test_find_coordinator(broker: Broker) -> None:
    r = find_coordinator(broker, FindCoordinatorRequest("tx"))
    assert r.error_code == 0 and r.port > 0
    assert (
        find_coordinator(broker, FindCoordinatorRequest("")).error_code
        == KafkaError.INVALID_REQUEST
    )


def test_timeout_fences_and_aborts_so_no_lso_stays_stuck(
    broker: Broker, clock: ManualClock
) -> None:
    d = txn(broker, timeout_ms=1_000)
    d.send("a", 0, "stalled")
    d.send("b", 1, "stalled")
    loop = CoordinatorLoop(broker)
    clock.advance(900)
    assert loop.run_once().timed_out == 0
    clock.advance(200)
    assert loop.run_once().timed_out == 1
    assert state_of(broker, "tx") == m.COMPLETE_ABORT
    assert partition_offsets(broker, "a", 0) == (2, 2)
    assert partition_offsets(broker, "b", 1) == (2, 2)
    assert read_values(broker, "a", 0) == []
    # The stalled producer wakes up fenced.
    assert d.send("a", 0, "again", register=False).error_code == KafkaError.INVALID_PRODUCER_EPOCH
    assert d.end(commit=True) == KafkaError.PRODUCER_FENCED


def test_idle_transactional_ids_expire_open_ones_do_not(broker: Broker, clock: ManualClock) -> None:
    idle = txn(broker, "idle")
    busy = txn(broker, "busy", timeout_ms=900_000)
    busy.send("a", 0, "v")
    idle.send("a", 1, "v")
    idle.end()
    loop = CoordinatorLoop(broker)
    clock.advance(3_600_001)
    with broker.engine.begin() as conn:  # keep "busy" from timing out: only expiry is under test
        conn.execute(
            text("UPDATE transactions SET txn_start_ms = :now WHERE transactional_id = 'busy'"),
            {"now": clock.now_ms()},
        )
    stats = loop.run_once()
    assert stats.expired_ids == 1
    assert state_of(broker, "idle") is None and state_of(broker, "busy") == m.BEGIN
    with broker.engine.connect() as conn:
        last = conn.execute(
            text(
                "SELECT state FROM transaction_log WHERE transactional_id = 'idle' ORDER BY event_id DESC LIMIT 1"
            )
        ).scalar()
    assert last == m.DEAD
    # A new producer with the expired id starts afresh with a new producer id.
    again = TxnDriver(broker, "idle")
    assert again.init() == 0 and again.producer_id != idle.producer_id


def test_zombie_coordinator_cannot_write_markers(broker: Broker, clock: ManualClock) -> None:
    zombie, fresh = CoordinatorLoop(broker, "zombie"), CoordinatorLoop(broker, "fresh")
    held = zombie.run_once().leases
    assert len(held) == 4 and fresh.run_once().leases == {}
    d = txn(broker)
    d.send("a", 0, "v")
    # The first phase of EndTxn only: PREPARE_COMMIT is durable, no marker yet.
    prepare_end_txn(broker, EndTxnRequest("tx", d.producer_id, d.producer_epoch, True))
    assert state_of(broker, "tx") == m.PREPARE_COMMIT
    clock.advance(broker.settings.coordinator_lease_ms + 1)
    taken = fresh.acquire_leases()
    assert all(taken[p] == held[p] + 1 for p in held), "a takeover bumps the coordinator epoch"
    with pytest.raises(KafkaException) as info:
        roll_forward(broker, "tx", expected_epoch=held[txn_partition_for("tx", 4)])
    assert info.value.error.code() == KafkaError.TRANSACTION_COORDINATOR_FENCED
    assert read_values(broker, "a", 0) == []
    assert fresh.run_once().rolled_forward == 1
    assert read_values(broker, "a", 0) == ["v"]
    assert state_of(broker, "tx") == m.COMPLETE_COMMIT


def test_rebuild_equals_live_after_randomized_workload(broker: Broker, clock: ManualClock) -> None:
    rng = random.Random(4)
    drivers = {f"t{i}": txn(broker, f"t{i}", timeout_ms=5_000) for i in range(4)}
    loop = CoordinatorLoop(broker)
    for _ in range(150):
        tid = rng.choice(list(drivers))
        d = drivers[tid]
        action = rng.random()
        if action < 0.5:
            tp = (rng.choice("abc"), rng.randint(0, 2))
            if d.add(tp) != 0:  # fenced by a timeout: a real client would re-initialise
                assert d.init() == 0
                continue
            assert d.send(*tp, f"v{rng.random()}", register=False).error_code == 0
        elif action < 0.65:
            d.end(commit=rng.random() < 0.7)
        elif action < 0.7:
            d.init()
        elif action < 0.8:
            produce(
                broker,
                ProduceRequest(rng.choice("abc"), rng.randint(0, 2), [RecordIn(None, b"plain", 0)]),
            )
        else:
            clock.advance(rng.choice([500, 2_000, 6_000]))
            loop.run_once()
    with broker.engine.connect() as conn:
        assert compute_transactions(conn, broker.settings) == live_transactions(conn)
    assert_partition_log_rebuilds(broker, clock.now_ms())


def test_rebuild_detects_an_impossible_transition() -> None:
    check_event_sequence(
        "ok", [m.EMPTY, m.BEGIN, m.PREPARE_COMMIT, m.COMPLETE_COMMIT, m.EMPTY, m.DEAD, m.EMPTY]
    )
    with pytest.raises(CorruptTransactionLog):
        check_event_sequence("bad", [m.EMPTY, m.BEGIN, m.COMPLETE_COMMIT])
    with pytest.raises(CorruptTransactionLog):
        check_event_sequence("bad", [m.BEGIN])


def test_read_uncommitted_and_committed_never_show_markers(broker: Broker) -> None:
    d = txn(broker)
    d.send("a", 0, "x")
    d.end(commit=False)
    d.send("a", 0, "y")
    d.end(commit=True)
    r = fetch(broker, FetchRequest("a", 0, 0, isolation_level=READ_UNCOMMITTED))
    assert [x[RECORD_VALUE] for x in r.records] == [b"x", b"y"]
    assert r.next_offset == 4
    r = fetch(broker, FetchRequest("a", 0, 0, isolation_level=READ_COMMITTED))
    assert [x[RECORD_VALUE] for x in r.records] == [b"y"]


def test_rebuild_equals_live_after_concurrent_workload(db_url: str) -> None:
    """Several processes' worth of traffic at once (threads with their own connections),
    with a coordinator loop timing transactions out underneath: the projections still
    equal the fold of the event tables."""
    import threading

    settings = BrokerSettings(transaction_log_partitions=4, coordinator_interval_ms=50)
    shared = Broker.connect(db_url, settings=settings)
    for topic in ("a", "b"):
        create_topic(shared, topic, 2)
    loop = CoordinatorLoop(shared)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        d = TxnDriver(shared, f"w{seed}", timeout_ms=rng.choice([200, 60_000]))
        try:
            assert d.init() == 0
            for _ in range(40):
                tp = (rng.choice("ab"), rng.randint(0, 1))
                action = rng.random()
                if action < 0.6:
                    if d.add(tp) != 0:
                        assert d.init() == 0
                        continue
                    d.send(*tp, f"{seed}-{rng.random()}", register=False)
                elif action < 0.8:
                    d.end(commit=rng.random() < 0.7)
                else:
                    produce(shared, ProduceRequest(tp[0], tp[1], [RecordIn(None, b"plain", 0)]))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    loop.start()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    loop.stop()
    assert not errors, errors[0]
    with shared.engine.connect() as conn:
        assert compute_transactions(conn, settings) == live_transactions(conn)
        computed = projection_rows(
            compute_partition_log(conn, shared.clock.now_ms(), settings).values()
        )
        assert computed == live_rows(conn)
