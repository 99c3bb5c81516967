"""Decisions taken after waiting for a partition lock (docs/design.md §3.1).

At READ COMMITTED, a statement that waits for a row lock re-reads only the locked row once
it gets it; every other row it read comes from its snapshot, taken before the wait. So what
decides an append or a marker (the producer's state on the partition) must be read once the
lock is held. Each test holds a partition lock in a DB transaction that changes that state,
starts the competing request on another thread, waits until it waits for the lock, then
commits: the request must decide on the state as committed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from sqlalchemy import text

from app.broker import Broker
from app.broker.produce import produce
from app.broker.write import under_locks
from app.coordinator.producer_id import init_producer_id
from app.errors import KafkaError, KafkaException
from app.log.inspect import abort_hanging
from app.log.markers import Marker, write_txn_markers
from app.protocol import CONTROL_COMMIT, InitProducerIdRequest, ProduceBatchesRequest
from tests.helpers.backends import idle_unbounded
from tests.helpers.batches import produce_batch
from tests.helpers.txn_driver import TxnDriver, partition_offsets, produce_many, read_values
from tests.test_markers import wait_for_lock_wait

# The holder's transaction idles while the competing request waits for it, for as long as
# the test takes: neither an idle bound nor the waiter's watch may end it.
pytestmark = pytest.mark.broker(topics={"t": 2}, settings=idle_unbounded)


def run_behind_lock(broker: Broker, hold: Callable[..., object], compete: Callable[[], object]):  # type: ignore[no-untyped-def]
    """Run ``hold(conn)`` in a DB transaction left open, start ``compete`` on a thread, wait
    until it waits for a lock, COMMIT, and return what ``compete`` returned or raised."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(compete())
        except Exception as exc:  # the outcome is checked by the test
            outcome.append(exc)

    with broker.engine.connect() as conn:
        held = conn.begin()
        hold(conn)
        competing = threading.Thread(target=run)
        competing.start()
        wait_for_lock_wait(broker)
        held.commit()
    competing.join(60)
    assert len(outcome) == 1
    return outcome[0]


def committed_values(broker: Broker, topic: str, partition: int) -> list[str]:
    """The committed_records view's values, which apply read_committed's rules in SQL."""
    with broker.engine.connect() as conn:
        rows = conn.execute(
            text(
                'SELECT value FROM committed_records WHERE topic = :t AND partition = :p ORDER BY "offset"'
            ),
            {"t": topic, "p": partition},
        )
        return [bytes(r[0]).decode() for r in rows]


@pytest.mark.parametrize("path", ["produce", "produce_many"])
def test_a_retry_waiting_for_its_original_is_a_duplicate(broker: Broker, path: str) -> None:
    """An idempotent batch retried while its first attempt's COMMIT is still finishing:
    once that COMMIT is done the retry must find the batch in the producer's state and
    answer its offsets, writing nothing (rule 5)."""
    pid = init_producer_id(broker, InitProducerIdRequest(None, 60_000)).producer_id

    assert produce(broker, produce_batch("a", producer_id=pid)).base_offset == 0
    retried = produce_batch("b", producer_id=pid, sequence=1)

    def original(conn: object) -> None:
        [first] = under_locks(broker, conn, ProduceBatchesRequest([retried]))[1].batches  # type: ignore[arg-type]
        assert (first.error_code, first.base_offset, first.duplicate) == (0, 1, False)

    def retry() -> object:
        if path == "produce":
            return produce(broker, retried)
        # With a batch for another partition, the lock goes through LOCK_PARTITIONS.
        return produce_many(broker, [retried, produce_batch("c", partition=1, producer_id=pid)])[0]

    answer = run_behind_lock(broker, original, retry)
    assert not isinstance(answer, Exception), answer
    assert (answer.error_code, answer.base_offset, answer.duplicate) == (0, 1, True)  # type: ignore[attr-defined]
    assert read_values(broker, "t", 0, committed=False) == ["a", "b"]
    assert partition_offsets(broker, "t", 0) == (2, 2)


def test_a_retry_that_opened_the_transaction_stays_aborted(broker: Broker) -> None:
    """The first batch of a transaction, retried while its first attempt commits: appended a
    second time, the copy would reopen the transaction at its own offset, and the ABORT's
    aborted-index entry would start there, leaving the first copy visible to read_committed."""
    d = TxnDriver(broker, "retry-opens")
    assert d.init() == 0
    d.send("t", 0, "a")
    assert d.end(commit=True) == 0
    assert d.add(("t", 0)) == 0
    [retried] = d.requests(("t", 0, "x"))

    def original(conn: object) -> None:
        [first] = under_locks(broker, conn, ProduceBatchesRequest([retried]))[1].batches  # type: ignore[arg-type]
        assert (first.error_code, first.base_offset, first.duplicate) == (0, 2, False)

    answer = run_behind_lock(broker, original, lambda: produce(broker, retried))
    assert not isinstance(answer, Exception), answer
    assert (answer.error_code, answer.base_offset, answer.duplicate) == (0, 2, True)  # type: ignore[attr-defined]
    assert d.end(commit=False) == 0
    assert read_values(broker, "t", 0, committed=False) == ["a", "x"]
    assert read_values(broker, "t", 0) == ["a"]
    assert committed_values(broker, "t", 0) == ["a"]


@pytest.mark.parametrize("then", ["committed", "committed and reopened"])
def test_abort_hanging_racing_the_commit_writes_no_abort(broker: Broker, then: str) -> None:
    """kafka-transactions.sh abort found the transaction open, then waited for the partition
    lock held by the transaction's COMMIT marker. Once that commits, the transaction it was
    asked to abort is no more: it must write nothing, neither over the committed records nor
    over a next transaction the producer opened meanwhile."""
    d = TxnDriver(broker, "hanging-race")
    assert d.init() == 0
    d.send("t", 0, "a")  # open from offset 0
    with broker.engine.connect() as conn:
        coordinator_epoch = conn.execute(
            text("SELECT coordinator_epoch FROM producer_states WHERE producer_id = :p"),
            {"p": d.producer_id},
        ).scalar_one()

    def commit(conn: object) -> None:
        marker = Marker(
            d.producer_id, d.producer_epoch, max(coordinator_epoch, 0), CONTROL_COMMIT,
            broker.clock.now_ms(),
        )  # fmt: skip
        assert write_txn_markers(conn, [("t", 0)], marker)  # type: ignore[arg-type]
        if then == "committed and reopened":
            [opened] = under_locks(broker, conn, ProduceBatchesRequest(d.requests(("t", 0, "n"))))[
                1
            ].batches  # type: ignore[arg-type]
            assert (opened.error_code, opened.base_offset) == (0, 2)

    outcome = run_behind_lock(broker, commit, lambda: abort_hanging(broker, "t", 0, 0))
    assert isinstance(outcome, KafkaException), outcome
    assert outcome.error.code() == KafkaError.INVALID_TXN_STATE
    with broker.engine.connect() as conn:
        aborts = conn.execute(
            text("SELECT count(*) FROM records WHERE is_control AND control_type = 0")
        ).scalar_one()
        aborted = conn.execute(text("SELECT count(*) FROM aborted_txns")).scalar_one()
    assert (aborts, aborted) == (0, 0)
    assert read_values(broker, "t", 0) == ["a"]
    if then == "committed":
        assert partition_offsets(broker, "t", 0) == (2, 2)
    else:
        assert partition_offsets(broker, "t", 0) == (3, 2)
