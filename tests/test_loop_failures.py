"""One transaction the coordinator cannot finish must not stop its loop for everyone else.

A marker refused by a partition, for good, makes that transaction's roll-forward or abort
fail every time it is tried. The loop logs it, counts it in a metric, backs off from that
transactional id (by the clock) and goes on with every other item and kind of work.
"""

from __future__ import annotations

import pytest
from psycopg import OperationalError as PsycopgOperationalError
from psycopg.errors import AdminShutdown, SerializationFailure
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from app.broker import Broker
from app.broker.loop import ITEM_BACKOFF_MAX_MS, CoordinatorLoop, ends_the_pass
from app.broker.produce import produce
from app.clock import ManualClock
from app.coordinator import machines as m
from app.coordinator.handlers import prepare_end_txn
from app.coordinator.producer_id import init_producer_id
from app.errors import KafkaError, fail
from app.metrics import gather, prometheus_text
from app.protocol import EndTxnRequest, InitProducerIdRequest, ProduceRequest, RecordIn
from tests.helpers.txn_driver import TxnDriver, state_of

INTERVAL_MS = 1_000


pytestmark = pytest.mark.broker(
    topics={"a": 2, "r": (1, {"retention.ms": 5_000})},
    manual_clock=True,
    transaction_log_partitions=1,  # every id in one partition: one list of work
    transactional_id_expiration_ms=10_000,
    producer_id_expiration_ms=10_000,
    coordinator_interval_ms=INTERVAL_MS,
    log_cleaner_interval_ms=1_000,
)


def txn(broker: Broker, tid: str, timeout_ms: int = 60_000) -> TxnDriver:
    d = TxnDriver(broker, tid, timeout_ms)
    assert d.init() == 0
    return d


def wedge_markers(broker: Broker, producer_id: int) -> None:
    """Give ``producer_id``'s state an epoch above any the coordinator will bump it to, so
    every marker of its transaction is refused (INVALID_PRODUCER_EPOCH), however often it is
    retried: what an idempotent batch with a forged identity did before such batches were
    refused."""
    with broker.engine.begin() as conn:
        conn.execute(
            text("UPDATE producer_states SET producer_epoch = 1000 WHERE producer_id = :pid"),
            {"pid": producer_id},
        )


def failures(broker: Broker) -> dict[str, int]:
    return gather(broker.engine).coordinator_item_failures


def test_a_failing_abort_is_counted_backed_off_and_skipped(
    broker: Broker, clock: ManualClock
) -> None:
    # In the pass's order: a prepared transaction, two timed out ones (the failing one
    # first), an idle id to expire; plus idle producer state and a topic to clean.
    bad = txn(broker, "a-bad", timeout_ms=1_000)
    bad.send("a", 0, "stuck")
    good = txn(broker, "b-good", timeout_ms=1_000)
    good.send("a", 1, "stalled")
    prep = txn(broker, "c-prep")
    prep.send("a", 1, "prepared")
    prepare_end_txn(broker, EndTxnRequest("c-prep", prep.producer_id, prep.producer_epoch, True))
    idle = txn(broker, "d-idle")
    idle.send("a", 1, "idle")
    assert idle.end() == 0
    ident = init_producer_id(broker, InitProducerIdRequest(None, 60_000))
    old = ProduceRequest("r", 0, [RecordIn(None, b"old", 0)], ident.producer_id, 0, 0)
    assert produce(broker, old).error_code == 0
    wedge_markers(broker, bad.producer_id)

    loop = CoordinatorLoop(broker)
    clock.advance(20_000)
    stats = loop.run_once()
    assert (stats.rolled_forward, stats.timed_out, stats.expired_ids) == (1, 1, 1)
    assert stats.expired_producers >= 1 and stats.cleaned_records == 1
    assert state_of(broker, "a-bad") == m.BEGIN, "its abort was refused and rolled back"
    assert state_of(broker, "b-good") == m.COMPLETE_ABORT
    assert state_of(broker, "c-prep") == m.COMPLETE_COMMIT
    assert state_of(broker, "d-idle") is None
    assert failures(broker) == {
        "roll_forward": 0, "time_out": 1, "expire": 0, "expire_producers": 0, "clean": 0
    }  # fmt: skip
    exposed = prometheus_text(gather(broker.engine))
    assert b'kip98_coordinator_item_failures_total{work="time_out"} 1.0' in exposed

    # Backed off: not tried again before the clock says so, and the back-off doubles.
    assert loop.run_once().timed_out == 0
    assert failures(broker)["time_out"] == 1
    clock.advance(INTERVAL_MS)
    loop.run_once()
    assert failures(broker)["time_out"] == 2
    clock.advance(INTERVAL_MS)
    loop.run_once()
    assert failures(broker)["time_out"] == 2
    clock.advance(INTERVAL_MS)
    loop.run_once()
    assert failures(broker)["time_out"] == 3
    # ... up to a bound: past it, the id is tried once every ITEM_BACKOFF_MAX_MS.
    for n in range(4, 14):
        clock.advance(ITEM_BACKOFF_MAX_MS)
        loop.run_once()
        assert failures(broker)["time_out"] == n
    assert state_of(broker, "a-bad") == m.BEGIN

    # Once the partition accepts its markers again, the abort goes through.
    with broker.engine.begin() as conn:
        conn.execute(
            text("UPDATE producer_states SET producer_epoch = 0 WHERE producer_id = :pid"),
            {"pid": bad.producer_id},
        )
    clock.advance(ITEM_BACKOFF_MAX_MS)
    assert loop.run_once().timed_out == 1
    assert state_of(broker, "a-bad") == m.COMPLETE_ABORT
    assert failures(broker)["time_out"] == 13


def test_a_failing_roll_forward_does_not_stop_the_others(
    broker: Broker, clock: ManualClock
) -> None:
    stuck, fine = txn(broker, "a-stuck"), txn(broker, "b-fine")
    for d in (stuck, fine):
        d.send("a", 0 if d is stuck else 1, "v")
        prepare_end_txn(
            broker, EndTxnRequest(d.transactional_id, d.producer_id, d.producer_epoch, True)
        )
    wedge_markers(broker, stuck.producer_id)
    stats = CoordinatorLoop(broker).run_once()
    assert stats.rolled_forward == 1
    assert state_of(broker, "a-stuck") == m.PREPARE_COMMIT
    assert state_of(broker, "b-fine") == m.COMPLETE_COMMIT
    assert failures(broker)["roll_forward"] == 1


def test_a_lost_connection_ends_the_pass_other_errors_are_per_item() -> None:
    lost = OperationalError("SELECT 1", {}, PsycopgOperationalError("connection refused"))
    assert ends_the_pass(lost)
    assert ends_the_pass(OperationalError("SELECT 1", {}, AdminShutdown("terminating")))
    conflict = OperationalError("SELECT 1", {}, SerializationFailure("could not serialize"))
    assert not ends_the_pass(conflict)
    assert not ends_the_pass(fail(KafkaError.INVALID_PRODUCER_EPOCH, "refused"))
    assert not ends_the_pass(RuntimeError("a bug in one item"))
